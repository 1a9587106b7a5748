"""Dask: RoPE as one task per block of the leading axes.

Called by the public entry points when the namespace is Dask, after they validated
their arguments.  Each output block is computed by running ``rotary`` itself on the
matching input block (a NumPy or CuPy chunk), so the graph has one task per block,
the chunking of the leading axes is kept, and nothing is computed while it is built.

The feature (last) axis of a RoPE input must be whole in each block, because a
rotation mixes features ``i`` and ``i + r/2`` (or ``2i`` and ``2i + 1``).  An input
chunked along it is merged into one chunk there (``head_dim`` is small): the result
is right and has one chunk along that axis (documented in :mod:`rotary.distributed`);
nothing is ever computed on a partial head.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ._checks import check_broadcast
from ._compat import Array, array_namespace, device

__all__ = ["convert_layout", "linear_attention", "merge_axis", "rotate", "split_positions"]


def _known(n: Any) -> bool:
    return n is not None and not (isinstance(n, float) and math.isnan(n))


def merge_axis(x: Array, axis: int = -1) -> Array:
    """``x`` with one chunk along ``axis`` (a no-op when it already has one)."""
    axis = axis % x.ndim
    if len(x.chunks[axis]) == 1:
        return x
    return x.rechunk({axis: -1})


def split_positions(pos: Array, x: Array, name: str = "pos", x_name: str = "x") -> Array:
    """``pos`` (broadcastable to ``x.shape[:-1]``) as an array of ``x.ndim`` axes whose
    chunks match those of ``x`` on every axis where ``pos`` is not broadcast (size 1),
    with a trailing axis of size 1 standing for the feature axis.

    Positions are small, so it is them that are re-chunked, never ``x``.
    """
    import dask.array as da  # the caller holds Dask arrays

    lead = x.ndim - 1
    if not isinstance(pos, da.Array):
        pos = da.asarray(pos)
    p = da.reshape(pos, (1,) * (lead - pos.ndim) + tuple(pos.shape) + (1,)) if pos.ndim != lead + 1 else pos
    chunks = []
    for i in range(lead):
        if p.shape[i] == 1:
            chunks.append((1,))
        elif not all(_known(c) for c in x.chunks[i]):
            raise ValueError(
                f"{x_name} has unknown chunk sizes along axis {i}; call {x_name}.compute_chunk_sizes() "
                f"before broadcasting {name} against it"
            )
        else:
            chunks.append(x.chunks[i])
    chunks.append((1,))
    return p.rechunk(tuple(chunks))


def _rotate_block(xb: Any, pb: Any, rope: Any) -> Any:
    xp = array_namespace(xb)
    pb = xp.asarray(pb, device=device(xb))
    return rope.rotate(xb, pb[..., 0])


def rotate(rope: Any, x: Array, pos: Array, name: str = "x", pos_name: str = "pos") -> Array:
    """``rope.rotate(x, pos)`` for a Dask ``x``: one task per block of the leading axes.

    ``pos`` is already validated (broadcastable to ``x.shape[:-1]``).  The result keeps
    ``x``'s chunks on the leading axes and has one chunk along the feature axis.
    """
    import dask.array as da

    x = merge_axis(x, -1)
    p = split_positions(pos, x, pos_name, name)
    return da.map_blocks(_rotate_block, x, p, rope=rope, dtype=x.dtype, meta=x._meta)


# -- layout conversion -----------------------------------------------------------------
def convert_layout(x: Array, src: str, dst: str, axis: int, head_dim: int, rotary_dim: int | None) -> Array:
    """:func:`rotary.convert_layout` on a Dask ``x``: one task per block.

    The permutation stays inside each head, so blocks holding whole heads along
    ``axis`` are converted independently and every chunk is kept.  Where a chunk
    boundary cuts a head, that axis is re-chunked to whole heads first (chunks of
    about the same size), so a head is never permuted in pieces.
    """
    import dask.array as da

    from .layouts import convert_layout as convert

    chunks = x.chunks[axis]
    if any(not _known(c) or c % head_dim for c in chunks):
        per = max(1, round(max(c for c in chunks if _known(c)) / head_dim)) * head_dim
        x = x.rechunk({axis: per})
    return da.map_blocks(
        convert,
        x,
        src=src,
        dst=dst,
        axis=axis,
        head_dim=head_dim,
        rotary_dim=rotary_dim,
        dtype=x.dtype,
        meta=x._meta,
    )


# -- linear attention ------------------------------------------------------------------
_LEAD = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
_STATE_OPTS = ("feature_map", "similarity", "layout", "base", "scaling")


def _like(a: Any, ref: Any) -> Any:
    """Block ``a`` (positions or mask, a NumPy chunk) in the namespace and device of ``ref``."""
    if a is None:
        return None
    xp = array_namespace(ref)
    return xp.asarray(a, device=device(ref))


def _pad(x: Array, n: int) -> Array:
    """``x`` with leading axes of length 1 added up to ``n`` axes."""
    return x[(None,) * (n - x.ndim)] if x.ndim < n else x


def _align(x: Array, ref: Array, axes: range, name: str, ref_name: str) -> Array:
    """Re-chunk ``x`` to ``ref``'s chunks on ``axes`` where ``x`` is not broadcast (length 1)."""
    chunks = {}
    for i in axes:
        if x.shape[i] == 1 or x.chunks[i] == ref.chunks[i]:
            continue
        if not all(_known(c) for c in ref.chunks[i]):
            raise ValueError(
                f"{ref_name} has unknown chunk sizes along axis {i}; call {ref_name}.compute_chunk_sizes() "
                f"first so that {name} can be split like it"
            )
        chunks[i] = ref.chunks[i]
    return x.rechunk(chunks) if chunks else x


def _pack(S: Any, z: Any) -> Any:
    xp = array_namespace(S)
    return xp.concat([S, z[..., None]], axis=-1)


def _state_block(kb: Any, vb: Any, pb: Any, mb: Any, opts: dict) -> Any:
    from .linear_attention import linear_attention_state

    st = linear_attention_state(kb, vb, _like(pb, kb), key_mask=_like(mb, kb), **opts)
    return _pack(st.S, st.z)[..., None, :, :]


def _attend_block(qb: Any, pb: Any, tb: Any, opts: dict, d: int, dv: int) -> Any:
    """Queries ``qb`` against a whole summary ``tb`` (packed ``[S | z]``), no new keys."""
    from .linear_attention import linear_attention

    xp = array_namespace(qb)
    dev = device(qb)
    lead = tuple(tb.shape[:-2])
    k0 = xp.zeros((*lead, 0, d), dtype=qb.dtype, device=dev)
    v0 = xp.zeros((*lead, 0, dv), dtype=qb.dtype, device=dev)
    kp0 = None if pb is None else xp.zeros((0,), dtype=xp.int64, device=dev)
    st = (tb[..., :dv], tb[..., dv], 0)
    return linear_attention(qb, k0, v0, _like(pb, qb), k_pos=kp0, state=st, **opts)


def _causal_block(qb: Any, kb: Any, vb: Any, pb: Any, kpb: Any, mb: Any, eb: Any, opts: dict, dv: int) -> Any:
    """Causal attention inside one sequence block, after the keys summarised in ``eb``."""
    from .linear_attention import linear_attention

    st = (eb[..., 0, :, :dv], eb[..., 0, :, dv], 0)
    return linear_attention(
        qb, kb, vb, _like(pb, qb), k_pos=_like(kpb, qb), key_mask=_like(mb, qb), causal=True, state=st, **opts
    )


def linear_attention(
    q: Array,
    k: Array,
    v: Array,
    pos: Any,
    *,
    causal: bool,
    k_pos: Any,
    key_mask: Any,
    state: Any,
    return_state: bool,
    scan: str = "sequential",
    **opts: Any,
) -> Any:
    """:func:`rotary.linear_attention` on Dask arrays (arguments already validated).

    Every block of keys/values along the sequence axis is summarised by its state
    ``[S | z]`` (one task per block).  Non-causal: the states are summed (a tree
    reduction) and each query block attends to the total.  Causal: an exclusive
    prefix sum of the block states (a scan over the chunk summaries, ``da.cumsum``)
    gives each block the state of all earlier keys, and the block runs the causal
    algorithm locally from it.  No block ever holds more than its own tokens.
    """
    import dask.array as da

    from .linear_attention import LinearAttentionState, linear_attention_state
    from .rope import as_positions

    sopts = {n: opts[n] for n in _STATE_OPTS}
    nl = max(q.ndim, k.ndim, v.ndim) - 2
    nd = nl + 2
    q, k, v = (merge_axis(_pad(a, nd), -1) for a in (q, k, v))
    lead_axes = range(nl)
    # leading axes: arrays that are not broadcast there share the chunks of the first one that is not
    for i in lead_axes:
        ref = next((a for a in (q, k, v) if a.shape[i] != 1), q)
        q, k, v = (_align(a, ref, range(i, i + 1), "q, k, v", "q") for a in (q, k, v))
    v = _align(v, k, range(nl, nl + 1), "v", "k")  # sequence axis of v like that of k
    if causal:
        k, v = (_align(a, q, range(nl, nl + 1), "k, v", "q") for a in (k, v))
    d, dv = q.shape[-1], v.shape[-1]

    def positions(p: Any, x: Array, name: str, x_name: str) -> Any:
        if p is None:
            return None
        if name == "key_mask":
            if not isinstance(p, da.Array) or p.dtype != bool:
                raise TypeError("key_mask must be a boolean array (True = a real key, False = padding)")
        else:
            p = as_positions(p, xp, None, name)
        check_broadcast(tuple(p.shape), tuple(x.shape[:-1]), name, x_name)
        return _align(_pad(p, nd - 1), x, range(nd - 1), name, x_name)

    xp = array_namespace(q)
    qp = positions(pos, q, "pos", "q")
    kp = positions(pos if k_pos is None else k_pos, k, "pos" if k_pos is None else "k_pos", "k")
    km = positions(key_mask, k, "key_mask", "k")

    # dtype and width of the summaries, from a probe of one token
    meta = q._meta
    mxp = array_namespace(meta)
    probe = linear_attention_state(
        mxp.zeros((1, d), dtype=q.dtype, device=device(meta)),
        mxp.zeros((1, dv), dtype=q.dtype, device=device(meta)),
        None if pos is None else [0],
        **sopts,
    )
    F, sdt = probe.S.shape[-2], probe.S.dtype
    packed0 = None
    if state is not None:
        if not isinstance(state, tuple) or len(state) != 3:
            raise TypeError("state must be a LinearAttentionState(S, z, offset)")
        S0, z0 = state[0], state[1]
        if tuple(S0.shape[-2:]) != (F, dv) or tuple(z0.shape[-1:]) != (F,):
            raise ValueError(
                f"state.S has shape {tuple(S0.shape)} and state.z {tuple(z0.shape)}, but these keys/values "
                f"need (..., {F}, {dv}) and (..., {F})"
            )
        sdt = np.result_type(sdt, S0.dtype)  # a float64 state keeps the sums in float64
        packed0 = da.concatenate([S0, z0[..., None]], axis=-1).astype(sdt)

    L = _LEAD[:nl]
    P = da.blockwise(
        _state_block,
        L + "tfg",
        k,
        L + "tx",
        v,
        L + "ty",
        kp,
        None if kp is None else L + "t",
        km,
        None if km is None else L + "t",
        opts=sopts,
        adjust_chunks={"t": 1},
        new_axes={"f": F, "g": dv + 1},
        align_arrays=False,
        concatenate=True,
        dtype=sdt,
        meta=mxp.empty((0,) * (nd + 1), dtype=sdt, device=device(meta)),
    )
    nb = P.shape[nl]
    attn_opts = {**opts}
    if causal:
        if nb > 1:
            incl = da.cumsum(P, axis=nl, method=scan)  # the scan over chunk summaries
            first = da.zeros_like(P[(slice(None),) * nl + (slice(0, 1),)])
            excl = da.concatenate([first, incl[(slice(None),) * nl + (slice(0, nb - 1),)]], axis=nl)
        else:
            excl = da.zeros_like(P)
        if packed0 is not None:
            excl = excl + da.expand_dims(packed0, nl)
        out = da.blockwise(
            _causal_block,
            L + "sy",
            q,
            L + "sx",
            k,
            L + "sx",
            v,
            L + "sy",
            qp,
            None if qp is None else L + "s",
            None if k_pos is None else kp,
            None if k_pos is None else L + "s",
            km,
            None if km is None else L + "s",
            excl,
            L + "sfg",
            opts=attn_opts,
            dv=dv,
            align_arrays=False,
            concatenate=True,
            dtype=q.dtype,
            meta=meta,
        )
        total = (
            excl[(slice(None),) * nl + (slice(nb - 1, nb),)] + P[(slice(None),) * nl + (slice(nb - 1, nb),)]
        )[(slice(None),) * nl + (0,)]
    else:
        total = da.sum(P, axis=nl)
        if packed0 is not None:
            total = total + packed0
        out = da.blockwise(
            _attend_block,
            L + "sy",
            q,
            L + "sx",
            qp,
            None if qp is None else L + "s",
            total,
            L + "fg",
            opts=attn_opts,
            d=d,
            dv=dv,
            new_axes={"y": dv},
            align_arrays=False,
            concatenate=True,
            dtype=q.dtype,
            meta=meta,
        )
    if not return_state:
        return out
    offset = k.shape[-2] + (0 if state is None else state[2])
    return out, LinearAttentionState(total[..., :dv], total[..., dv], offset)
