"""Quickstart: the same ``rotary`` call on NumPy, PyTorch and JAX arrays.

Rotates grouped-query q/k (8 query heads, 2 key/value heads) with ``rotary.apply``,
then one new key appended to a KV cache with ``rotary.rotate``, on every array
library that is installed, and prints the largest difference from the NumPy
result (a few float32 ulps: the same float32 arithmetic on each library).

    python examples/quickstart.py [--seq 128] [--head-dim 64]
"""

from __future__ import annotations

import argparse
import importlib.util

import numpy as np

import rotary


def _converters() -> dict:
    """name -> (to library array, to NumPy) for every installed library."""
    conv = {"numpy": (lambda a: a, np.asarray)}
    if importlib.util.find_spec("torch") is not None:
        import torch

        conv["torch"] = (torch.from_numpy, lambda t: t.detach().cpu().numpy())
    if importlib.util.find_spec("jax") is not None:
        import jax.numpy as jnp

        conv["jax"] = (jnp.asarray, np.asarray)
    return conv


def main(argv: list[str] | None = None) -> dict[str, float]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None, help="output folder (accepted for uniformity; nothing is drawn)")
    p.add_argument("--seq", type=int, default=128, help="sequence length")
    p.add_argument("--head-dim", type=int, default=64, help="features per head (even)")
    args = p.parse_args(argv)

    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 8, args.seq, args.head_dim)).astype(np.float32)
    k = rng.standard_normal((1, 2, args.seq, args.head_dim)).astype(np.float32)  # 2 kv heads
    pos = np.arange(args.seq)

    results = {}
    for name, (to_lib, to_np) in _converters().items():
        q_rot, k_rot = rotary.apply(to_lib(q), to_lib(k), to_lib(pos))  # the same call everywhere
        k_new = rotary.rotate(to_lib(k[:, :, -1:]), [args.seq])  # one new key at position seq
        results[name] = (to_np(q_rot), to_np(k_rot), to_np(k_new))
        print(f"{name:>6}: q_rot {type(q_rot).__module__}.{type(q_rot).__name__} {tuple(q_rot.shape)}")

    ref = results["numpy"]
    diffs = {}
    print(f"\nmax |difference| from NumPy (float32 eps = {np.finfo(np.float32).eps:.1e}):")
    for name, res in results.items():
        diffs[name] = max(float(np.max(np.abs(a - b))) for a, b in zip(res, ref))
        print(f"{name:>6}: {diffs[name]:.2e}")
    # The relative-position identity on the NumPy result: scores depend only on m - n.
    qr, kr = rotary.apply(q[:, :1], k[:, :1], pos + 1000)
    s0 = np.einsum("...id,...jd->...ij", ref[0][:, :1], ref[1][:, :1])
    s1 = np.einsum("...id,...jd->...ij", qr, kr)
    print(f"\nshifting every position by 1000 changes attention scores by {np.max(np.abs(s0 - s1)):.2e}")
    return diffs


if __name__ == "__main__":
    main()
