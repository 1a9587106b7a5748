"""Regenerate the README ``numerics`` table: max |cos error| by position.

Compares, against the float64 truth ``cos(pos * inv_freq64)`` (evaluated in
200-bit mpmath for the worst entries, 80-bit longdouble for the scan):

* the common float32 recipe (``RoPE(..., angles="float32")``, Hugging Face's),
* rotary's exact method with float32 results, on NumPy (and any backend given),
* rotary's exact method with float64 results.

Usage: ``python3 benchmarks/angle_errors.py [--dim 128] [--base 10000] [--window 4096]
[--backends numpy,torch,jax,array_api_strict_no_float64]``
"""

from __future__ import annotations

import argparse
import os

import numpy as np

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import rotary
from rotary.testing import available, to_numpy

MARKS = [("2^10", 2**10), ("2^17", 2**17), ("2^20", 2**20), ("2^24", 2**24), ("2^28", 2**28),
         ("2^32", 2**32), ("2^36 - 1", 2**36 - 1)]  # fmt: skip


def truth(pos: np.ndarray, w: np.ndarray) -> np.ndarray:
    """cos(pos * w); longdouble scan, worst entries re-checked by the caller with mpmath."""
    ang = pos.astype(np.longdouble)[:, None] * w.astype(np.longdouble)[None, :]
    return np.cos(ang).astype(np.float64)


def mp_cos(p: int, wi: float) -> float:
    import mpmath

    with mpmath.workprec(200):
        return float(mpmath.cos(mpmath.mpf(int(p)) * mpmath.mpf(wi)))


def max_err(c: np.ndarray, pos: np.ndarray, w: np.ndarray, t: np.ndarray) -> float:
    err = np.abs(c.astype(np.float64) - t)
    i, j = np.unravel_index(np.argmax(err), err.shape)
    try:  # confirm the worst entry with an independent 200-bit evaluation
        return abs(float(c[i, j]) - mp_cos(int(pos[i]), float(w[j])))
    except ImportError:
        return float(err[i, j])


def sampled_err(c: np.ndarray, pos: np.ndarray, w: np.ndarray, n: int = 256) -> float:
    """Max error over ``n`` random entries, each against mpmath (float64 results are
    more accurate than the longdouble scan beyond 2**24)."""
    rng = np.random.default_rng(0)
    ii, jj = rng.integers(0, c.shape[0], n), rng.integers(0, c.shape[1], n)
    return max(abs(float(c[i, j]) - mp_cos(int(pos[i]), float(w[j]))) for i, j in zip(ii, jj, strict=True))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--base", type=float, default=10000.0)
    ap.add_argument("--window", type=int, default=4096, help="positions per mark (ending at the mark)")
    ap.add_argument("--backends", default="numpy", help="exact float32 also measured on these backends")
    a = ap.parse_args()
    exact, recipe = rotary.RoPE(a.dim, base=a.base), rotary.RoPE(a.dim, base=a.base, angles="float32")
    w = exact.inv_freq()
    backends = available(a.backends)
    cols = (
        ["float32 recipe (HF)"]
        + [f"rotary exact f32 ({b.name})" for b in backends]
        + ["rotary exact f64 (mpmath sample)"]
    )
    print(f"d={a.dim}, base={a.base:g}, {a.window} positions up to each mark, all {a.dim // 2} frequencies\n")
    print("| position | " + " | ".join(cols) + " |")
    print("|---|" + "---|" * len(cols))
    for label, top in MARKS:
        pos = np.arange(max(0, top - a.window + 1), top + 1, dtype=np.int64)
        t = truth(pos, w)
        row = [max_err(recipe.cos_sin(pos)[0], pos, w, t)]
        for b in backends:
            idt = "int64" if (b.module != "jax" or b.float64) else "int32"
            if idt == "int32" and top >= 2**31:
                row.append(float("nan"))
                continue
            c, _ = exact.cos_sin(b.asarray(pos, idt), dtype=b.xp.float32)
            row.append(max_err(to_numpy(c), pos, w, t))
        row.append(sampled_err(exact.cos_sin(pos, dtype=np.float64)[0], pos, w))
        print(f"| {label} | " + " | ".join("n/a (int32)" if np.isnan(v) else f"{v:.2g}" for v in row) + " |")


if __name__ == "__main__":
    main()
