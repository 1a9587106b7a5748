"""The recurrent families (gates per feature, the delta rule, RWKV's bonus and transition) through the
chunk engine of :mod:`rotary._math._recurrence`: the causal pass, the state after it, block states and
their transition.
"""

from __future__ import annotations

from typing import Any

from .._backends import Backend
from .._lib._typing import Array, Device, Namespace
from .._math import _linear, _recurrence
from .._math._groups import merge_heads, split_heads
from .._packing import documents, implied_positions
from .._rope import Rotary
from ._args import (
    _REC_PART_CHUNKS,
    _REC_PART_CHUNKS_FEATURE,
    NO_EXTRAS,
    _Call,
    _check_offset,
    _extra_arrays,
    _Extras,
    _gates,
    _total,
)
from ._checks import _check_keys, _Checked
from ._documents import _doc_offsets, _doc_states, _DocCtx, _row_log_decay, _row_offset
from ._parts import _Parts, _tokens
from ._state import NOT_COMPUTED, LinearAttentionState, _add_log_decay, _state


def _recurrent(
    call: _Call,
    be: Backend,
    dev: Device,
    q: Array,
    k: Array,
    v: Array,
    p: Any,
    rng: Any,
    mask: Any,
    g: Any,
    ex: _Extras,
    init: Array | None,
    docs: _DocCtx | None,
    writes: bool = False,
    track: bool = False,
    doc_states: Array | None = None,
) -> tuple[Any, Any, Array | None]:
    """Causal attention of a recurrent family, streamed part by part through the backend's scan
    (each part a block of chunks of :func:`rotary._math._recurrence.chunked`): ``(out, carry,
    written)``, ``written`` the values each token writes along its key (``writes``).  ``q``
    ``None``: no outputs (a state); ``track``: the carry is ``(carry, M)``, ``M`` the block's
    transition (the map of the state before it)."""
    xp = be.xp
    fam = call.fam
    assert fam is not None
    parts = _Parts(call, be, dev, rng, rng, mask)
    r = call.rope
    axis = r.seq_axis if isinstance(r, Rotary) else -1
    n = k.shape[-2]
    # parts of a few chunks: the chunk-local products (C x C, and C x C x F per sub-block for gates
    # per feature) of a part are its working memory
    part = call.size * (_REC_PART_CHUNKS_FEATURE if fam.per_feature else _REC_PART_CHUNKS)
    if not isinstance(r, Rotary) and p is not None:
        part = max(part, n)
    groups = call.groups
    runs = None if docs is None else docs.runs
    gax = -2 if fam.per_feature else -1
    src = _linear.Source(
        (q, k, v, p, mask, g, runs, ex.beta, ex.a, ex.b), (-2, -2, -2, axis, -1, gax, -1, -1, -2, -2)
    )
    u = None if ex.u is None else ex.u[..., None, :]
    if u is not None and groups > 1:
        u = xp.expand_dims(u, axis=-3)
    carry0: Any = None
    if init is not None:
        carry0 = _recurrence.Carry(init if groups == 1 else xp.expand_dims(init, axis=-3), None)
    if doc_states is not None and groups > 1:
        doc_states = xp.expand_dims(doc_states, axis=-4)
    out_dtype = k.dtype if q is None else q.dtype

    def key_side(x: Array | None, vec: bool) -> Array | None:
        """A key-side array with the size-1 group axis (grouped-query heads)."""
        if x is None or groups == 1 or x.ndim < (3 if vec else 2):
            return x
        return xp.expand_dims(x, axis=-3 if vec else -2)

    def body(carry: Any, s: _linear.Source) -> tuple[Any, Any]:
        qb, kb, vb, pb, mb, gb, rb, betab, ab, bb = s.arrays
        if qb is None:  # (a state: keys only)
            qf = None
            kf, _, vc = parts.keys(kb, vb, pb, mb)
        else:
            qf, _, kf, _, vc = parts.both(qb, kb, vb, pb, mb)
        t = kf.shape[-2]
        if mb is not None and ab is not None and bb is not None:  # (padding writes and reads nothing)
            keepm = xp.astype(mb, kf.dtype)[..., None]
            ab, bb = ab * keepm, bb * keepm
        if gb is not None and not fam.per_feature:
            gb = _tokens(gb, t, xp)
        if betab is not None:
            betab = _tokens(betab, t, xp)
        if groups > 1 and qf is not None:
            qf = split_heads(qf, groups, xp)
        rec = _recurrence.Rec(
            qf,
            key_side(kf, True),
            key_side(vc, True),
            key_side(gb, fam.per_feature),
            key_side(betab, False),
            key_side(ab, True),
            key_side(bb, True),
            u,
            key_side(rb, False),
        )
        carry, M = carry if track else (carry, None)
        if carry is not None and rec.doc is not None and carry.doc is None:
            carry = _recurrence.Carry(carry.S, rec.doc[..., 0])
        if t == 1 and not writes and doc_states is None:  # a decoding step
            o, carry = _recurrence.step(rec, carry, fam, xp, dev)
            w = None
        else:
            o, carry, w = _recurrence.chunked(
                rec, carry, call.size, fam, xp, dev, writes=writes, cumsum=be.cumsum, doc_states=doc_states
            )
        if track:  # the block's transition: the same recurrence from the identity, writing nothing
            M = _transition_part(rec, M, call.size, fam, xp, dev, be)
            carry = (carry, M)
        if o is None:
            return carry, None
        if w is not None:  # (beside the outputs, in the compute dtype; per query head where grouped)
            if groups > 1:
                w = xp.broadcast_to(w, o.shape)
            o = xp.concat([o, w], axis=-1)
        if groups > 1:
            assert q is not None
            o = merge_heads(o, q.shape[-3], groups, xp)
        if not writes and o.dtype != out_dtype:
            o = xp.astype(o, out_dtype)
        return carry, o

    if track:
        carry0 = (carry0, None)
    carry, out = be.scan(body, carry0, src, n=n, block=part, sequential=True)
    if out is None or not writes:
        return out, carry, None
    dv = v.shape[-1]
    w = out[..., dv:]
    if groups > 1:
        w = split_heads(w, groups, xp)[..., 0, :, :]
    o = out[..., :dv]
    return (o if o.dtype == out_dtype else xp.astype(o, out_dtype)), carry, w


def _run_recurrent(
    checked: _Checked,
    be: Backend,
    q: Array,
    k: Array,
    v: Array,
    pos: Any,
    state: Any,
    key_mask: Any,
    decay: Any,
    log_gate: Any,
    return_state: bool,
    cu_seqlens: Any,
    segment_ids: Any,
    extras: _Extras | None,
) -> Array | tuple[Array, LinearAttentionState]:
    """:func:`_run` for the recurrent families: values read and checked, then the causal pass
    and the state after it."""
    xp = be.xp
    call, kv_lead, F, _ = checked
    plan, fam = call.plan, call.fam
    assert fam is not None
    m = k.shape[-2]
    dev = be.creation_device(k)
    docs = documents(be, m, cu_seqlens, segment_ids, k, "k")
    g = None if decay is None and log_gate is None else _gates(decay, log_gate, k, kv_lead, plan.cdt, be, F)
    ex = _extra_arrays(NO_EXTRAS if extras is None else extras, be, k, kv_lead, F, plan.cdt)
    init = None
    off0: Any = 0
    ld0 = None
    per_doc = docs is not None and docs.cu is not None
    doc_S0 = None
    if state is not None:
        init, _, off0 = state[:3]
        _check_offset(off0, per_doc, docs is not None and not per_doc)
        ld0 = state[3] if len(state) >= 4 else None
        init = init if init.dtype == plan.cdt else xp.astype(init, plan.cdt)
        if per_doc:  # one state per document: each enters its own document
            assert docs is not None
            doc_S0 = init
            init = xp.take(init, docs.runs[:1], axis=-3)[..., 0, :, :] if m else None
    if docs is not None and pos is None and call.rope is not None:  # each document from 0
        offs = None  # (or, continuing a state, the continued documents from its offset)
        if state is not None and not (type(off0) is int and off0 == 0):
            offs = _doc_offsets(be, off0, docs, dev) if per_doc else off0
        pos = implied_positions(be, docs, offs)
    p, rng = (None, None) if pos is None else be.positions(pos, name="pos", device=dev)
    if per_doc and return_state and fam.rank == "dplr":
        raise ValueError(
            "return_state with cu_seqlens= (a state per document) is not served for a= and b= yet: pass "
            "segment_ids= (the state of each row's last document), or one document per call"
        )
    ctx = None if docs is None else _DocCtx(docs.runs, doc_S0)
    writes = bool(return_state) and per_doc and fam.rank == "delta"
    out, carry, w = _recurrent(
        call, be, dev, q, k, v, p, rng, key_mask, g, ex, init, ctx, writes, doc_states=doc_S0
    )
    if not return_state:
        return out
    transition = NOT_COMPUTED if fam.rank is not None else None
    if per_doc:
        assert docs is not None and ctx is not None
        st = _doc_states(
            call._replace(groups=1),
            be,
            dev,
            k,
            v if w is None else w,
            p,
            rng,
            key_mask,
            g,
            docs,
            ctx,
            kv_lead,
            F,
            off0,
            ld0,
        )
        if transition is not None:  # (its log-decay is in the transition, which it does not know)
            st = st._replace(log_decay=None, transition=transition)
        return out, st
    assert carry is not None
    S = carry.S
    if call.groups > 1:  # (the caller's: not a view of the groups' buffer)
        S = be.owned(S[..., 0, :, :])
    ld = None
    off = off0 + m
    if docs is not None:  # a row whose documents changed forgets what came before
        # (the rank-one families' log-decay says only that: 0, or -inf where a boundary was)
        gd = g if fam.rank is None else None
        ld = _row_log_decay(docs.runs, gd, m, xp, plan.cdt, fam.per_feature and gd is not None)
        off = _row_offset(docs.runs, off0, m, xp)
    elif fam.rank is None and g is not None:
        ld = xp.sum(g, axis=-2) if fam.per_feature else _total(g, m, xp)
        if ld0 is not None and fam.per_feature and ld0.ndim == ld.ndim - 1:
            ld0 = ld0[..., None]
        ld = _add_log_decay(ld0, ld)
    st = _state(S, None, off, kv_lead, xp, ld)
    return out, st._replace(transition=transition)


def _transition_part(
    rec: _recurrence.Rec,
    M: _recurrence.Carry | None,
    size: int,
    fam: _recurrence.Family,
    xp: Namespace,
    dev: Device,
    be: Backend,
) -> _recurrence.Carry:
    """The map of the state across the keys of ``rec`` after ``M`` (``None``: the identity): the
    recurrence run from the identity with nothing written."""
    F = rec.k.shape[-1]
    if M is None:
        eye = xp.eye(F, dtype=rec.k.dtype, device=dev)
        M = _recurrence.Carry(xp.broadcast_to(eye, (*rec.k.shape[:-2], F, F)), None)
    zero = xp.zeros((*rec.k.shape[:-1], F), dtype=rec.k.dtype, device=dev)
    _, after, _ = _recurrence.chunked(
        rec._replace(q=None, v=zero, u=None), M, size, fam, xp, dev, cumsum=be.cumsum
    )
    return after


def _state_recurrent(
    be: Backend,
    k: Array,
    v: Array,
    pos: Any,
    rope: Any,
    feature_map: Any,
    similarity: Any,
    key_mask: Any,
    decay: Any,
    log_gate: Any,
    normalize: Any,
    cu_seqlens: Any,
    segment_ids: Any,
    extras: _Extras,
    qk_l2norm: Any,
    scale: Any,
) -> LinearAttentionState:
    """:func:`linear_attention_state` of a recurrent family: the keys' state, and for a rank-one
    family the block's transition (so that states of consecutive blocks combine)."""
    xp = be.xp
    checked = _check_keys(
        be,
        k,
        v,
        pos,
        feature_map,
        similarity,
        key_mask,
        rope,
        normalize,
        decay,
        log_gate,
        cu_seqlens,
        segment_ids,
        extras,
        qk_l2norm,
        scale,
    )
    call, kv_lead, F, _ = checked
    fam = call.fam
    assert fam is not None
    m = k.shape[-2]
    dev = be.creation_device(k)
    docs = documents(be, m, cu_seqlens, segment_ids, k, "k")
    g = (
        None
        if decay is None and log_gate is None
        else _gates(decay, log_gate, k, kv_lead, call.plan.cdt, be, F)
    )
    if docs is not None and pos is None and call.rope is not None:
        pos = implied_positions(be, docs)
    p, rng = (None, None) if pos is None else be.positions(pos, name="pos", device=dev)
    if docs is not None and docs.cu is not None:
        if fam.rank is not None:
            raise ValueError(
                "linear_attention_state with cu_seqlens= (a state per document) is not served with "
                "beta= or a=/b= yet: pass segment_ids= (each row's last document) or one document per call"
            )
        return _doc_states(
            call, be, dev, k, v, p, rng, key_mask, g, docs, _DocCtx(docs.runs), kv_lead, F, 0, None
        )
    ex = _extra_arrays(extras, be, k, kv_lead, F, call.plan.cdt)
    ctx = None if docs is None else _DocCtx(docs.runs)
    track = fam.rank is not None
    _, carry, _ = _recurrent(call, be, dev, None, k, v, p, rng, key_mask, g, ex, None, ctx, track=track)
    M = None
    if track:
        carry, Mc = carry
        M = xp.broadcast_to(Mc.S, (*kv_lead, F, F))
    S = carry.S
    ld = None
    off: Any = m
    if docs is not None:
        gd = g if fam.rank is None else None
        ld = _row_log_decay(docs.runs, gd, m, xp, call.plan.cdt, fam.per_feature and gd is not None)
        off = _row_offset(docs.runs, 0, m, xp)
    elif fam.rank is None and g is not None:
        ld = xp.sum(g, axis=-2) if fam.per_feature else _total(g, m, xp)
    return _state(S, None, off, kv_lead, xp, ld)._replace(transition=M)
