"""Interleaved timing: every case runs once per round, in rotating order; medians over rounds."""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable


def compare(cases: dict[str, Callable[[], object]], *, reps: int, warmup: int = 2, inner: int = 1) -> dict:
    """Median seconds per call of each case.

    Each round calls every case ``inner`` times (rotating the order between rounds so that no
    case always follows the same neighbour), which spreads the machine's noise evenly over
    the cases; the medians over ``reps`` rounds are returned.
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
    return {n: statistics.median(v) for n, v in samples.items()}
