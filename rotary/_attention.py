"""``attention``: softmax attention with RoPE, the quadratic reference and baseline.

Numerically stable (row maximum subtracted, float32 or better inside) and blocked over
queries so that the score matrix never holds more than about ``block_size x M`` entries per
batch/head (16k tokens fit in memory).
"""

from __future__ import annotations

import math
from typing import Any

from ._backends import backend_for
from ._lib import _validation as chk
from ._lib._cache import fast_paths_enabled
from ._lib._compat import array_namespace, entry, index_dtype, is_array, not_an_array
from ._lib._compat import device as be_device
from ._lib._typing import Array, RotaryEmbedding
from ._math._groups import merge_heads, split_heads
from ._packing import Docs, documents, implied_positions, unnest
from ._rope import default_rope, eager_positions

__all__ = ["attention"]

#: Target number of score entries per query block (per call, all heads together).
_BLOCK_ELEMENTS = 2**24


@entry
def attention(
    q: Array,
    k: Array,
    v: Array,
    pos: Any = None,
    *,
    rope: RotaryEmbedding | None = None,
    k_pos: Any = None,
    causal: bool = False,
    mask: Array | None = None,
    scale: float | None = None,
    block_size: int | None = None,
    cu_seqlens: Any = None,
    segment_ids: Any = None,
) -> Array:
    """Softmax attention ``softmax(R q (R k)^T * scale + mask) v`` with RoPE.

    Parameters
    ----------
    q, k : array
        Queries ``(..., N, d)`` and keys ``(..., M, d)``, same floating dtype.
    v : array
        Values ``(..., M, d_v)``.  Leading axes broadcast; or grouped-query heads: ``k`` and
        ``v`` with ``H / g`` heads (axis -3) for ``q``'s ``H``, each key/value head serving
        ``g`` consecutive query heads (as ``repeat_interleave``, never materialised).
    pos : array or int or sequence, optional
        Query positions, broadcast to ``q.shape[:-1]``; ``None`` (default): no rotation.
    rope : RoPE or AxialRoPE or MRoPE, optional
        The rotary embedding (default ``RoPE(d)`` when ``pos`` is given).
    k_pos : optional
        Key positions, default ``pos`` (then ``pos`` must broadcast to ``k.shape[:-1]`` too).
    causal : bool
        Query ``i`` sees keys ``j <= i + M - N`` (aligned at the end, so a single new query
        sees the whole KV cache).
    mask : array, optional
        Broadcasts to ``(..., N, M)``: boolean (``True`` = attend) or additive floating
        (``-inf`` hides a key as ``False`` does).  Rows
        with no visible key give 0; keys no query sees (padding) never reach the output, even
        if their values are not finite.
    scale : float, optional
        Logit scale, default ``1 / sqrt(d)``.
    block_size : int, optional
        Queries per block (default: about 16M score entries per block).
    cu_seqlens, segment_ids : optional
        Packed documents (as in :func:`rotary.linear_attention`): no query sees a key of another
        document (the scores' mask is block-diagonal, causal within each block).  Without
        ``pos``, a given ``rope`` rotates each document from position 0.

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
    arrays = (("q", q, "(..., N, d)"), ("k", k, "(..., M, d)"), ("v", v, "(..., M, d_v)"))
    for name, x, what in arrays:
        chk.check_array(x, name, what)
    xp = array_namespace(q, k, v, mask, names=("q", "k", "v", "mask"))
    be = backend_for(xp)
    nested = unnest(be, q, k, v, pos)
    if nested is not None:  # nested q, k, v: their values, the documents their offsets
        if cu_seqlens is not None or segment_ids is not None or k_pos is not None or mask is not None:
            raise ValueError(
                "nested q, k and v carry their documents: pass no cu_seqlens=, segment_ids=, k_pos= or mask="
            )
        out = attention(
            nested.q,
            nested.k,
            nested.v,
            nested.pos,
            rope=rope,
            causal=causal,
            scale=scale,
            block_size=block_size,
            cu_seqlens=nested.offsets,
        )
        return nested.wrap(out)
    statics: tuple[Any, ...] = (rope, causal, scale, block_size)
    docs = None
    if cu_seqlens is not None or segment_ids is not None:
        chk.check_qkv(arrays)
        if k_pos is not None or q.shape[-2] != k.shape[-2]:
            raise ValueError(
                "cu_seqlens and segment_ids describe one packed sequence of queries and keys: pass q, k "
                "and v of the same tokens (no k_pos)"
            )
        docs = documents(be, q.shape[-2], cu_seqlens, segment_ids, q)
        if pos is None and rope is not None:  # each document from position 0
            assert docs is not None
            pos = implied_positions(be, docs)
    if be.jit_eagerly() and _hashable(statics):
        statics = (*statics, fast_paths_enabled())  # (read while tracing: part of the key)
        # JAX outside a trace: positions checked here, then the whole call as one compiled
        # program (no Python scalar moves to the device)
        p = eager_positions(be, pos, "pos", q, "q")
        kp = eager_positions(be, k_pos, "k_pos", k, "k")
        runs = None if docs is None else docs.runs
        return be.jit(_attention_jit, (0,))(statics, q, k, v, p, kp, mask, runs)
    return _attention(be, q, k, v, pos, rope, k_pos, causal, mask, scale, block_size, docs, arrays)


def _attention(
    be: Any,
    q: Array,
    k: Array,
    v: Array,
    pos: Any,
    rope: Any,
    k_pos: Any,
    causal: Any,
    mask: Any,
    scale: Any,
    block_size: Any,
    docs: Docs | None,
    arrays: tuple[tuple[str, Array, str], ...],
) -> Array:
    xp = be.xp
    chk.check_qkv(arrays)
    be.check_dense([("q", q), ("k", k), ("v", v)])
    be.check_plain([("q", q), ("k", k), ("v", v)], "attention")
    be.check_devices([("q", q), ("k", k), ("v", v)])
    causal = chk.check_bool(causal, "causal")
    if block_size is not None:
        block_size = chk.check_int(block_size, "block_size", minimum=1)
    n, m, d = q.shape[-2], k.shape[-2], q.shape[-1]
    kv_lead = chk.broadcast_shapes(tuple(k.shape[:-2]), tuple(v.shape[:-2]), names="k and v")
    lead, groups = chk.query_groups(tuple(q.shape[:-2]), kv_lead, names="q, k and v")
    scale = 1.0 / math.sqrt(d) if scale is None else chk.check_float(scale, "scale")
    if mask is not None:
        if not is_array(mask):
            raise not_an_array("mask", mask, "a boolean or floating array")
        if not (xp.isdtype(mask.dtype, "bool") or chk.is_floating(mask.dtype)):
            raise TypeError(
                f"mask must be boolean (True = attend) or floating (added to the logits), got "
                f"{chk.dtype_name(mask.dtype)}; for a 0/1 integer mask pass mask.astype(bool)"
            )
        if mask.ndim < 2:
            raise ValueError(
                f"mask must broadcast to (..., N, M) = (..., {n}, {m}), got shape {tuple(mask.shape)}"
            )
        if not chk.broadcasts_to(tuple(mask.shape), (*lead, n, m)):
            raise ValueError(
                f"mask of shape {tuple(mask.shape)} does not broadcast to the scores (..., N, M) = "
                f"{(*lead, n, m)}"
            )
    rope = default_rope(be, rope, pos, d, k_pos)
    cdt = be.compute_dtype(q.dtype)
    dev = be.creation_device(q)
    qc, kc, vc = (x if x.dtype == cdt else xp.astype(x, cdt) for x in (q, k, v))
    if rope is not None:
        qc, kc = rope.apply(qc, kc, pos, k_pos=k_pos)
    out_shape = (*lead, n, v.shape[-1])
    if m == 0 or n == 0:
        return xp.zeros(out_shape, dtype=q.dtype, device=dev)
    runs = None if docs is None else docs.runs
    if groups > 1:  # grouped-query heads: q's heads as (key head, group), no repeat of k and v
        qc, kc, vc, mask = _grouped(xp, groups, qc, kc, vc, mask)
        if runs is not None and runs.ndim >= 2:
            runs = xp.expand_dims(runs, axis=-2)
    is_bool = mask is not None and xp.isdtype(mask.dtype, "bool")
    if mask is not None:
        # Keys that no query sees (padding: False, or -inf added) must not reach the output even
        # if v holds NaN/inf there (0 * inf = NaN in the weighted sum).
        seen = mask if is_bool else mask != -math.inf
        visible = xp.any(xp.broadcast_to(seen, (*mask.shape[:-2], n, m)), axis=-2)
        vc = xp.where(visible[..., None], vc, xp.zeros_like(vc))
    kt = xp.matrix_transpose(kc)
    # symbolic sizes (ndonnx's dynamic axes): one block, the causal mask from index arrays
    symbolic = n is None or m is None or any(x is None for x in lead)
    spans: list[tuple[Any, Any]] = [(0, n)]
    jdx = None
    if n is not None and m is not None and not symbolic:
        if block_size is None:
            rows = 1
            for s in lead:  # (a loop: torch.compile(fullgraph=True) cannot trace math.prod of a generator)
                rows *= int(s)
            block_size = max(1, min(n, _BLOCK_ELEMENTS // max(1, rows * m)))
        spans = [(s, min(s + block_size, n)) for s in range(0, n, block_size)]
        jdx = xp.arange(m, device=dev)
    outs = []
    for s, e in spans:
        logits = xp.matmul(qc[..., s:e, :], kt) * scale
        keep = None
        if causal and jdx is None:
            keep = _causal_symbolic(qc, kc, xp)
        elif causal and jdx is not None and m is not None and n is not None:
            idx = xp.arange(s, e, device=dev) + (m - n)
            keep = jdx[None, :] <= idx[:, None]
        if mask is not None:
            mb = mask[..., s:e, :] if mask.shape[-2] == n and n != 1 else mask
            if not is_bool:  # additive: -inf entries hide their keys as False does
                logits = logits + xp.astype(mb, cdt)
                mb = mb != -math.inf
            keep = mb if keep is None else xp.logical_and(keep, mb)
        if runs is not None:  # the same document only
            same = runs[..., s:e, None] == runs[..., None, :]
            keep = same if keep is None else xp.logical_and(keep, same)
        if keep is not None:
            logits = xp.where(keep, logits, xp.full_like(logits, -math.inf))
        mx = xp.max(logits, axis=-1, keepdims=True)
        mx = xp.where(xp.isfinite(mx), mx, xp.zeros_like(mx))  # fully masked rows
        p = xp.exp(logits - mx)
        if keep is not None:
            p = xp.where(keep, p, xp.zeros_like(p))
        den = xp.sum(p, axis=-1, keepdims=True)
        den = xp.where(den > 0, den, xp.ones_like(den))
        outs.append(xp.matmul(p, vc) / den)
    out = outs[0] if len(outs) == 1 else xp.concat(outs, axis=-2)
    if groups > 1:
        out = merge_heads(out, q.shape[-3], groups, xp)
    return out if out.dtype == q.dtype else xp.astype(out, q.dtype)


def _causal_symbolic(q: Array, k: Array, xp: Any) -> Array:
    """The causal mask ``key j <= query i + (M - N)`` where N and M are symbolic: indices and
    counts from cumulative sums of ones along the sequence axes (no ``arange`` of an unknown
    length)."""
    dt = index_dtype(xp, be_device(q))
    oq, ok = xp.ones_like(q[..., 0], dtype=dt), xp.ones_like(k[..., 0], dtype=dt)
    qi = xp.cumulative_sum(oq, axis=-1) - 1
    kj = xp.cumulative_sum(ok, axis=-1) - 1
    shift = xp.sum(ok, axis=-1, keepdims=True) - xp.sum(oq, axis=-1, keepdims=True)
    return kj[..., None, :] <= (qi + shift)[..., :, None]


def _grouped(xp: Any, g: int, q: Array, k: Array, v: Array, mask: Any) -> tuple[Array, Array, Array, Any]:
    """``q`` ``(..., H, N, d)`` as ``(..., H/g, g, N, d)``; ``k``, ``v`` and a mask with one row per
    key head or none get a size-1 group axis (broadcast, never materialised)."""
    hq = q.shape[-3]
    q = split_heads(q, g, xp)
    k, v = xp.expand_dims(k, axis=-3), xp.expand_dims(v, axis=-3)
    if mask is not None and mask.ndim >= 3:
        if mask.shape[-3] == hq:
            mask = split_heads(mask, g, xp)
        else:  # one row for all heads
            mask = xp.expand_dims(mask, axis=-3)
    return q, k, v, mask


def _hashable(statics: tuple[Any, ...]) -> bool:
    try:
        hash(statics)
    except TypeError:
        return False
    return True


def _attention_jit(
    statics: tuple[Any, ...], q: Array, k: Array, v: Array, p: Any, kp: Any, mask: Any, runs: Any
) -> Array:
    rope, causal, scale, block_size, _ = statics
    return attention(
        q,
        k,
        v,
        p,
        rope=rope,
        k_pos=kp,
        causal=causal,
        mask=mask,
        scale=scale,
        block_size=block_size,
        segment_ids=runs,
    )
