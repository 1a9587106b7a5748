"""Interleaved timing: every case runs once per round, in rotating order; medians over rounds."""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable


class Times(dict):
    """Median seconds per case; ``ratio(a, b)``: median over rounds of the per-round ratio."""

    samples: dict[str, list[float]]

    def ratio(self, a: str, b: str) -> float:
        return statistics.median(x / y for x, y in zip(self.samples[a], self.samples[b]))


def compare(cases: dict[str, Callable[[], object]], *, reps: int, warmup: int = 2, inner: int = 1) -> Times:
    """Median seconds per call of each case.

    Each round calls every case ``inner`` times (rotating the order between rounds so that no
    case always follows the same neighbour), which spreads the machine's noise evenly over
    the cases.  Returns the medians over ``reps`` rounds; ``.ratio(a, b)`` is the median of
    the per-round ratios, which cancels load changes slower than one round.
    """
    names = list(cases)
    for name in names:
        for _ in range(warmup):
            cases[name]()
    samples: dict[str, list[float]] = {n: [] for n in names}
    gc_was = gc.isenabled()
    gc.disable()
    try:
        for r in range(reps):
            order = names[r % len(names) :] + names[: r % len(names)]
            for name in order:
                f = cases[name]
                t0 = time.perf_counter()
                for _ in range(inner):
                    f()
                samples[name].append((time.perf_counter() - t0) / inner)
    finally:
        if gc_was:
            gc.enable()
    out = Times({n: statistics.median(v) for n, v in samples.items()})
    out.samples = samples
    return out
