"""Long-term decay: the RoFormer bound on attention scores as the distance grows.

Plots ``rotary.decay_bound`` (RoFormer, section 3.4.3: the Abel-summation bound
``(1/(d/2)) * sum_j |S_j|`` with ``S_j = sum_{i<j} exp(i (m-n) theta_i)``) against
the relative distance ``m - n`` for d = 128, base 10000, distances 0..256, and saves
it as ``decay.png`` in the output folder.

    python examples/decay.py [--out DIR] [--dim 128] [--max-distance 256]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile

import numpy as np

import rotary

#: The optional libraries the examples use, and the extra of ``pyproject.toml`` that installs each.
EXTRAS = {"matplotlib": "plot", "torch": "torch", "jax": "jax", "dask": "dask", "distributed": "dask"}


def require(*modules: str) -> None:
    """Exit with a message naming the extra to install if a library this example needs is missing."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        extras = ",".join(dict.fromkeys(EXTRAS[m] for m in missing))
        sys.exit(
            f"{os.path.basename(__file__)} needs {', '.join(missing)}, not installed here: "
            f'pip install ".[{extras}]" in the rotary checkout'
        )


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None, help="folder for decay.png (default: a new temporary folder)")
    p.add_argument("--dim", type=int, default=128, help="head dimension d (even)")
    p.add_argument("--base", type=float, default=10000.0, help="RoPE base")
    p.add_argument("--max-distance", type=int, default=256, help="largest relative distance")
    args = p.parse_args(argv)
    require("matplotlib")
    out = args.out or tempfile.mkdtemp(prefix="rotary-decay-")
    os.makedirs(out, exist_ok=True)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dist = np.arange(args.max_distance + 1)
    bound = np.asarray(rotary.decay_bound(dist, args.dim, base=args.base), dtype=np.float64)
    for m in sorted({0, 1, 8, 32, 64, 128, args.max_distance} & set(dist.tolist())):
        print(f"distance {m:4d}: bound {bound[m]:7.3f}")
    # Trend: mean of the first and last eighths of the range.
    n8 = max(1, len(dist) // 8)
    print(f"mean over the first eighth {bound[:n8].mean():.2f} -> last eighth {bound[-n8:].mean():.2f}")

    fig, ax = plt.subplots(figsize=(6, 3.4), dpi=100)
    ax.plot(dist, bound, lw=1.2)
    ax.set_xlabel("relative distance m - n")
    ax.set_ylabel(r"$\frac{1}{d/2}\sum_j |S_j|$")
    ax.set_title(f"RoPE long-term decay (d = {args.dim}, base = {args.base:g})")
    ax.set_xlim(0, args.max_distance)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path = os.path.join(out, "decay.png")
    fig.savefig(path)
    plt.close(fig)
    print(f"saved {path}")
    return path


if __name__ == "__main__":
    main()
