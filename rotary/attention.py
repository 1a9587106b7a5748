"""``attention``: softmax attention with RoPE, the quadratic reference and baseline.

Numerically stable (row maximum subtracted, float32 or better inside) and blocked
over queries so that the score matrix never holds more than about
``block_size x M`` entries per batch/head (16k tokens fit in memory).
"""

from __future__ import annotations

import math
from typing import Any

from . import _checks
from ._compat import Array, array_namespace, compute_dtype, creation_device, is_array_api_obj
from .apply import _rope_for

__all__ = ["attention"]

#: Target number of score entries per query block (per call, all heads together).
_BLOCK_ELEMENTS = 2**24


def attention(
    q: Array,
    k: Array,
    v: Array,
    pos: Any,
    *,
    causal: bool = False,
    mask: Array | None = None,
    scale: float | None = None,
    layout: str = "half",
    base: float = 10000.0,
    scaling: Any = None,
    k_pos: Any = None,
    block_size: int | None = None,
) -> Array:
    """Softmax attention ``softmax(R q (R k)^T * scale + mask) v`` with RoPE.

    Parameters
    ----------
    q, k : array
        Queries ``(..., N, d)`` and keys ``(..., M, d)``, same floating dtype.
    v : array
        Values ``(..., M, d_v)``.  Leading axes broadcast.
    pos : array or int or sequence or None
        Query positions, broadcast to ``q.shape[:-1]``; ``None``: no rotation.
    causal : bool
        Query ``i`` sees keys ``j <= i + M - N`` (aligned at the end, so a single
        new query sees the whole KV cache).
    mask : array, optional
        Broadcasts to ``(..., N, M)``: boolean (``True`` = attend) or additive float.
        Rows with no visible key give 0.
    scale : float, optional
        Logit scale, default ``1 / sqrt(d)``.
    layout, base, scaling
        RoPE options as in :func:`rotary.apply`.
    k_pos : optional
        Key positions, default ``pos`` (then ``pos`` must broadcast to ``k.shape[:-1]`` too).
    block_size : int, optional
        Queries per block (default: about 16M score entries per block).

    Returns
    -------
    array
        ``(..., N, d_v)``, the dtype and device of ``q``.

    Examples
    --------
    >>> import numpy as np, rotary
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = (rng.normal(size=(1, 2, 6, 8)).astype(np.float32) for _ in range(3))
    >>> out = rotary.attention(q, k, v, np.arange(6), causal=True)
    >>> out.shape
    (1, 2, 6, 8)
    >>> bool(np.allclose(out[..., 0, :], v[..., 0, :]))   # the first query sees only key 0
    True
    """
    xp = array_namespace(q, k, v, pos, k_pos, mask, names=("q", "k", "v", "pos", "k_pos", "mask"))
    for name, x, what in (("q", q, "(..., N, d)"), ("k", k, "(..., M, d)"), ("v", v, "(..., M, d_v)")):
        if not is_array_api_obj(x):
            raise TypeError(f"{name} must be an array of shape {what}, got {type(x).__name__}")
        _checks.check_floating(x, xp, name)
        if x.ndim < 2:
            raise ValueError(f"{name} must have shape {what}, got shape {tuple(x.shape)}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(
            f"k and v must have the same sequence length (axis -2), got k.shape={tuple(k.shape)} "
            f"and v.shape={tuple(v.shape)}"
        )
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"q and k must have the same feature dim (last axis), got q.shape={tuple(q.shape)} "
            f"and k.shape={tuple(k.shape)}"
        )
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k and v must have the same dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if block_size is not None and (
        isinstance(block_size, bool) or not isinstance(block_size, int) or block_size <= 0
    ):
        raise ValueError(f"block_size must be a positive integer or None, got {block_size!r}")
    if mask is not None and not is_array_api_obj(mask):
        raise TypeError(f"mask must be a boolean or floating array, got {type(mask).__name__}")
    n, m, d = q.shape[-2], k.shape[-2], q.shape[-1]
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    cdt = compute_dtype(xp, q.dtype)
    dev = creation_device(q, xp)
    qc, kc, vc = (x if x.dtype == cdt else xp.astype(x, cdt) for x in (q, k, v))
    if pos is not None:
        rope = _rope_for(q, "q", base, layout, None, scaling, "exact")
        # q and k rotated separately: their sequence lengths may differ (KV cache, cross-attention).
        qc, kc = rope.rotate(qc, pos), rope.rotate(kc, pos if k_pos is None else k_pos)
    kt = xp.matrix_transpose(kc)
    if block_size is None:
        lead = 1
        for s in q.shape[:-2]:
            lead *= int(s)
        block_size = max(1, min(n, _BLOCK_ELEMENTS // max(1, lead * m)))
    jdx = xp.arange(m, device=dev)
    outs = []
    for s in range(0, max(n, 1), block_size):
        e = min(s + block_size, n)
        logits = xp.matmul(qc[..., s:e, :], kt) * scale
        keep = None
        if causal:
            idx = xp.arange(s, e, device=dev) + (m - n)
            keep = jdx[None, :] <= idx[:, None]
        if mask is not None:
            mb = mask[..., s:e, :] if mask.ndim >= 2 and mask.shape[-2] == n and n != 1 else mask
            if xp.isdtype(mask.dtype, "bool"):
                keep = mb if keep is None else xp.logical_and(keep, mb)
            else:
                logits = logits + xp.astype(mb, cdt)
        neg = xp.full_like(logits, -math.inf)
        if keep is not None:
            logits = xp.where(keep, logits, neg)
        mx = xp.max(logits, axis=-1, keepdims=True)
        mx = xp.where(xp.isfinite(mx), mx, xp.zeros_like(mx))  # fully masked rows
        p = xp.exp(logits - mx)
        den = xp.sum(p, axis=-1, keepdims=True)
        den = xp.where(den > 0, den, xp.ones_like(den))
        outs.append(xp.matmul(p, vc) / den)
    out = outs[0] if len(outs) == 1 else xp.concat(outs, axis=-2)
    return out if out.dtype == q.dtype else xp.astype(out, q.dtype)
