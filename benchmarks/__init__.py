"""Benchmark suite for ``rotary``: ``python3 -m benchmarks [--quick] [--json FILE]``.

Every section times ``rotary`` side by side with the hand-written code it replaces on the same
backend (warm-ups, interleaved repetitions, medians) and reports ratios; see ``__main__``.
"""
