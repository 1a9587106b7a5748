"""Benchmarks for ``rotary`` (not timed tests)."""
