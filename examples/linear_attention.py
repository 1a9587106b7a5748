"""RoPE linear attention (RoFormer eq. 19) vs softmax attention.

1. Causal ``rotary.linear_attention`` three ways: one parallel (chunked) call, the
   decoding state fed in pieces, and token by token; all three agree with each
   other and with the naive O(N^2) masked formula computed here in float64.
2. Time and peak memory (NumPy, measured with ``tracemalloc``) of causal linear
   attention vs causal softmax attention (``rotary.attention``) as the sequence
   grows, saved as ``linear_attention.png``: linear attention grows linearly in
   time and keeps its working memory flat; softmax attention grows quadratically.

    python examples/linear_attention.py [--out DIR] [--max-seq 2048] [--heads 4] [--dim 32]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile
import time
import tracemalloc

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


def naive_causal(q, k, v, pos, base=10000.0):
    """Eq. 19 with a causal mask, O(N^2), float64: RoPE on elu+1 features, numerator only."""
    phi = lambda x: np.where(x > 0, x + 1.0, np.exp(np.minimum(x, 0.0)))  # noqa: E731
    fq, fk = phi(q.astype(np.float64)), phi(k.astype(np.float64))
    rq, rk = rotary.apply(fq, fk, pos, base=base)
    mask = np.tril(np.ones((q.shape[-2], k.shape[-2])))
    num = (rq @ np.swapaxes(rk, -1, -2) * mask) @ v.astype(np.float64)
    den = (fq @ np.swapaxes(fk, -1, -2) * mask).sum(-1, keepdims=True)
    return num / den


def check_decoding(n: int, heads: int, dim: int, piece: int) -> dict[str, float]:
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, heads, n, dim)).astype(np.float32) for _ in range(3))
    pos = np.arange(n)
    par = rotary.linear_attention(q, k, v, pos, causal=True)
    # in pieces, carrying the state
    outs, st = [], None
    for s in range(0, n, piece):
        sl = slice(s, s + piece)
        o, st = rotary.linear_attention(
            q[..., sl, :], k[..., sl, :], v[..., sl, :], pos[sl], causal=True, state=st, return_state=True
        )
        outs.append(o)
    pieces = np.concatenate(outs, axis=-2)
    # token by token (decoding)
    outs, st = [], None
    for t in range(n):
        sl = slice(t, t + 1)
        o, st = rotary.linear_attention(
            q[..., sl, :], k[..., sl, :], v[..., sl, :], pos[sl], causal=True, state=st, return_state=True
        )
        outs.append(o)
    tokens = np.concatenate(outs, axis=-2)
    ref = naive_causal(q, k, v, pos)
    return {
        f"in pieces of {piece} vs parallel": float(np.abs(pieces - par).max()),
        "token by token vs parallel": float(np.abs(tokens - par).max()),
        "parallel vs naive float64": float(np.abs(par - ref).max()),
    }


def _measure(fn, repeats: int) -> tuple[float, float]:
    """(best time in s, peak traced memory in bytes) of ``fn()``."""
    fn()  # warm up (tables, caches)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    tracemalloc.start()
    fn()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return best, peak


def scaling(lengths: list[int], heads: int, dim: int, repeats: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    res = {"linear": [], "softmax": []}
    for n in lengths:
        q, k, v = (rng.standard_normal((1, heads, n, dim)).astype(np.float32) for _ in range(3))
        pos = np.arange(n)
        for name, fn in (("linear", rotary.linear_attention), ("softmax", rotary.attention)):
            res[name].append(_measure(lambda fn=fn, a=(q, k, v, pos): fn(*a, causal=True), repeats))
    return {name: np.array(r) for name, r in res.items()}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None, help="folder for the PNG (default: a new temporary folder)")
    p.add_argument("--seq", type=int, default=128, help="sequence length of the decoding check")
    p.add_argument("--min-seq", type=int, default=256, help="shortest sequence timed")
    p.add_argument("--max-seq", type=int, default=2048, help="longest sequence timed (doubling)")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--dim", type=int, default=32, help="head dimension (even)")
    p.add_argument("--repeats", type=int, default=3, help="timing repeats (best of)")
    args = p.parse_args(argv)
    require("matplotlib")
    out = args.out or tempfile.mkdtemp(prefix="rotary-linear-attention-")
    os.makedirs(out, exist_ok=True)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    diffs = check_decoding(args.seq, args.heads, args.dim, piece=max(1, args.seq // 4 + 3))
    print(f"causal RoPE linear attention, {args.heads} heads, N = {args.seq}, d = {args.dim}, float32:")
    for name, d in diffs.items():
        print(f"  max |difference| {name}: {d:.2e}")

    lengths = [n for n in (args.min_seq * 2**i for i in range(32)) if n <= args.max_seq]
    res = scaling(lengths, args.heads, args.dim, args.repeats)
    print(f"\n{'N':>7} {'linear ms':>10} {'softmax ms':>11} {'linear MB':>10} {'softmax MB':>11}")
    for i, n in enumerate(lengths):
        (tl, ml), (ts, ms) = res["linear"][i], res["softmax"][i]
        print(f"{n:7d} {tl * 1e3:10.1f} {ts * 1e3:11.1f} {ml / 2**20:10.1f} {ms / 2**20:11.1f}")

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(8, 3.4), dpi=100)
    for name, r in res.items():
        a1.loglog(lengths, r[:, 0] * 1e3, "o-", ms=3, label=f"{name} attention")
        a2.loglog(lengths, r[:, 1] / 2**20, "o-", ms=3, label=f"{name} attention")
    a1.set_ylabel(f"time (ms, best of {args.repeats})")
    a2.set_ylabel("peak memory (MiB, tracemalloc)")
    for a in (a1, a2):
        a.set_xlabel("sequence length N")
        # labels at the lengths measured and at 1, 2, 5 x 10^k, none on the minor ticks: the default
        # minor labels of a log axis spanning less than a decade collide
        a.set_xticks(lengths, [str(n) for n in lengths])
        a.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        a.yaxis.set_major_locator(matplotlib.ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        a.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        a.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        a.grid(alpha=0.3, which="both")
        a.legend(fontsize=8)
    fig.suptitle(f"causal attention with RoPE, NumPy CPU, {args.heads} heads, d = {args.dim}", fontsize=10)
    fig.tight_layout()
    path = os.path.join(out, "linear_attention.png")
    fig.savefig(path)
    plt.close(fig)
    print(f"\nsaved {path}")
    return {"diffs": diffs, "lengths": lengths, **res}


if __name__ == "__main__":
    main()
