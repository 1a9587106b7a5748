"""Packed documents: each document's final state, where each goes on, the row's last document's decay and
offset.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from .._backends import Backend
from .._lib._compat import is_array
from .._lib._typing import Array, Device, DType, Namespace
from .._math import _documents, _linear
from .._packing import Docs
from .._rope import Rotary
from ._args import _Call
from ._parts import _Parts, _tokens
from ._state import LinearAttentionState, _state


def _row_log_decay(runs: Array, g: Any, m: Any, xp: Namespace, cdt: DType, pf: bool = False) -> Array:
    """The log-decay of a row's last document (its gates' total; per feature where ``pf``),
    ``-inf`` where the row holds a boundary (the state of its last document combines with nothing
    before it)."""
    if m == 0:  # no key: nothing decays, nothing is forgotten
        return xp.sum(xp.astype(runs, cdt), axis=-1)  # (zeros, one per row)
    crossed = runs[..., -1] != runs[..., 0]
    total = xp.zeros_like(xp.astype(crossed, cdt))
    last = xp.astype(runs == runs[..., -1:], cdt)
    if g is not None and pf:
        total = xp.sum(g * last[..., None], axis=-2) + total[..., None]
        crossed = crossed[..., None]
    elif g is not None:
        gt = _tokens(g, m, xp)
        total = xp.sum(gt * last, axis=-1) + total
    return xp.where(crossed, xp.full_like(total, -math.inf), total)


def _row_offset(runs: Array, off0: Any, m: Any, xp: Namespace) -> Any:
    """Where each row's last document continues (the offset of a state of segment ids): its
    tokens here, plus ``off0`` where the row holds no boundary (its last document is the one
    the state continued)."""
    if m == 0:  # (the caller's own offset, not the same array: what rotary returns is the caller's)
        return xp.asarray(off0, copy=True) if is_array(off0) else off0
    dt = runs.dtype
    last = runs[..., -1:]
    count = xp.sum(xp.astype(runs == last, dt), axis=-1, dtype=dt)
    if is_array(off0) and off0.dtype != dt:
        off0 = xp.astype(off0, dt)
    # (a 0-d array, not a NumPy scalar, for one row: what rotary returns is an array)
    return xp.asarray(count + xp.astype(last[..., 0] == 0, dt) * off0)


def _doc_offsets(be: Backend, off0: Any, docs: Docs, dev: Device) -> Array:
    """Where each document continues (``state.offset``: one per document, or one for all)."""
    xp = be.xp
    n_docs = docs.n_docs
    assert n_docs is not None
    dt = docs.runs.dtype
    if is_array(off0) and off0.ndim == 1:
        return off0 if off0.dtype == dt else xp.astype(off0, dt)
    if is_array(off0):
        return xp.broadcast_to(xp.astype(xp.reshape(off0, (1,)), dt), (n_docs,))
    return xp.full((n_docs,), int(off0), dtype=dt, device=dev)


def _doc_states(
    call: _Call,
    be: Backend,
    dev: Device,
    k: Array,
    v: Array,
    kp: Any,
    krng: Any,
    mask: Any,
    g: Any,
    docs: Docs,
    ctx: _DocCtx,
    kv_lead: tuple[Any, ...],
    F: int,
    off0: Any,
    ld0: Any,
) -> LinearAttentionState:
    """Every document's final state: its keys, each decayed to the document's end, summed by
    document (the backend's scatter, ``chunk_size`` keys at a time), plus its initial state
    decayed over the document."""
    xp = be.xp
    plan = call.plan
    n_docs = docs.n_docs
    assert n_docs is not None and docs.cu is not None
    m = k.shape[-2]
    r = call.rope
    axis = r.seq_axis if isinstance(r, Rotary) else -1
    parts = _Parts(call._replace(groups=1), be, dev, krng, krng, mask)
    dv = v.shape[-1]
    Fs = F + 1 if plan.cosine else F
    lengths = docs.cu[1:] - docs.cu[:-1]
    pf = call.fam is not None and call.fam.per_feature  # (gates per feature: (..., N, F))
    # the decay of each key to its document's end: the gates after it (a reverse running sum)
    after = None
    total = None
    if g is not None:
        gt = xp.moveaxis(g, -1, -2) if pf else _tokens(g, m, xp)
        assert gt is not None
        shifted = xp.concat([gt[..., 1:], xp.zeros_like(gt[..., :1])], axis=-1)
        same_next = xp.concat([docs.runs[1:] == docs.runs[:-1], xp.zeros_like(docs.runs[:1], dtype=xp.bool)])
        shifted = shifted * xp.astype(same_next, shifted.dtype)
        after = xp.flip(
            _documents.segmented_cumsum(xp.flip(shifted, axis=-1), xp.flip(docs.runs, axis=-1), xp), axis=-1
        )
        if pf:
            after = xp.moveaxis(after, -1, -2)
            total = be.segment_add(
                xp.zeros((*g.shape[:-2], n_docs, g.shape[-1]), dtype=g.dtype, device=dev), g, docs.runs
            )
        else:
            total = _doc_totals(be, gt, docs, n_docs)
    accS = xp.zeros((*kv_lead, n_docs, Fs * dv), dtype=plan.cdt, device=dev)
    accz = xp.zeros((*kv_lead, n_docs, Fs), dtype=plan.cdt, device=dev) if plan.normalize else None
    src = _linear.Source((k, v, kp, mask, docs.runs, after), (-2, -2, axis, -1, -1, -2 if pf else -1))
    size = max(1, call.size)

    def body(acc: Any, s: _linear.Source) -> tuple[Any, None]:
        kb, vb, pb, mb, rb, ab = s.arrays
        b, e, vc = parts.keys(kb, vb, pb, mb)
        if ab is not None:
            w = xp.exp(ab) if pf else xp.exp(ab)[..., None]
            b = b * w
            e = None if e is None else e * w
        S, z = acc
        t = b.shape[-2]
        assert rb is not None
        for lo in range(0, t, size):
            hi = min(lo + size, t)
            outer = b[..., lo:hi, :, None] * vc[..., lo:hi, None, :]
            outer = xp.reshape(outer, (*outer.shape[:-2], Fs * dv))
            S = be.segment_add(S, outer, rb[lo:hi])
        if z is not None and e is not None:
            z = be.segment_add(z, e, rb)
        return (S, z), None

    (S, z), _ = be.scan(body, (accS, accz), src, n=m, block=call.part)
    S = xp.reshape(S, (*S.shape[:-1], Fs, dv))
    if ctx.S0 is not None:  # the documents' own states, decayed over their keys
        S0, z0 = ctx.S0, ctx.z0
        if total is not None:
            S0 = S0 * (xp.exp(total)[..., :, None] if pf else xp.exp(total)[..., None, None])
            z0 = None if z0 is None else z0 * xp.exp(total)[..., None]
        S = S + S0
        z = None if z is None or z0 is None else z + z0
    offsets = _doc_offsets(be, off0, docs, dev) + xp.astype(lengths, docs.runs.dtype)
    ld = None
    if total is not None:
        ld = total if ld0 is None else ld0 + total
    return _state(S, z, offsets, (*kv_lead, n_docs), xp, ld)


def _doc_totals(be: Backend, gt: Array, docs: Docs, n_docs: int) -> Array:
    """``(..., n_docs)``: each document's total log-gate (0 for an empty one)."""
    xp = be.xp
    acc = xp.zeros((*gt.shape[:-1], n_docs, 1), dtype=gt.dtype, device=be.creation_device(gt))
    return be.segment_add(acc, gt[..., None], docs.runs)[..., 0]


class _DocCtx(NamedTuple):
    """Documents of a call: ``runs`` ``(..., N)``; with ``cu_seqlens`` and a state per document,
    ``S0``/``z0`` ``(..., n_docs, F, d_v)``/``(..., n_docs, F)``; ``G`` the cumulative log-gates
    from each document's start (inclusive), where there are gates."""

    runs: Array
    S0: Array | None = None
    z0: Array | None = None
    G: Array | None = None
