"""The additive families' passes: causal attention streamed part by part (the chunked form of
:mod:`rotary._math._linear`), non-causal against the keys' summary, and both ways with decay or
documents.
"""

from __future__ import annotations

import math
from typing import Any

from .._backends import Backend
from .._lib import _validation as chk
from .._lib._typing import Array, Device, DType, Namespace
from .._math import _linear
from .._math._groups import merge_heads, split_heads
from .._rope import Rotary
from ._args import _Call, _zero_carry
from ._documents import _DocCtx
from ._parts import _Parts, _tokens


def _attend(
    call: _Call,
    be: Backend,
    dev: Device,
    q: Array,
    k: Array,
    v: Array,
    p: Any,
    kp: Any,
    rng: Any,
    krng: Any,
    mask: Any,
    g: Any,
    init: _linear.Carry | None,
    kv_lead: tuple[Any, ...],
    F: int,
    docs: _DocCtx | None = None,
) -> tuple[Array, _linear.Carry | None]:
    """The attention proper: the sequence streamed through the backend's scan."""
    xp = be.xp
    plan, r, groups = call.plan, call.rope, call.groups
    parts = _Parts(call, be, dev, rng, krng, mask)
    n, m = q.shape[-2], k.shape[-2]
    axis = r.seq_axis if isinstance(r, Rotary) else -1
    part = call.part
    if p is not None and not isinstance(r, Rotary):
        part = max(part, n, m)  # (a user's rotary embedding sees the whole sequence)
    if init is not None and groups > 1:
        init = _linear.Carry(
            xp.expand_dims(init.S, axis=-3), None if init.z is None else xp.expand_dims(init.z, axis=-2), None
        )
    out_dtype = q.dtype
    if call.causal:
        out, carry, _ = _forward(call, be, dev, parts, q, k, v, p, mask, g, init, axis, part, docs, True)
        if groups > 1:
            out = merge_heads(out, q.shape[-3], groups, xp)
        return (out if out.dtype == out_dtype else xp.astype(out, out_dtype)), carry
    if g is not None or docs is not None:
        return _bidirectional(call, be, dev, parts, q, k, v, p, mask, g, init, axis, out_dtype, docs)
    # non-causal: the keys' summary, then every query against it
    part = _noncausal_part(be, part, q, k, v, F)
    ksrc = _linear.Source((k, v, kp, mask), (-2, -2, axis, -1))

    def absorb(carry: Any, s: _linear.Source) -> tuple[Any, None]:
        kb, vb, kpb, mb = s.arrays
        b, e, vc = parts.keys(kb, vb, kpb, mb)
        ch, _ = parts.group(_linear.Chunk(None, None, b, e, vc), _linear.NO_MARKS)
        return _linear.absorb(carry, ch, _linear.NO_MARKS, xp, be.cumsum), None

    carry, _ = be.scan(absorb, init, ksrc, n=m, block=part, additive=True)
    if carry is None:
        zero = _zero_carry(plan, F, v, kv_lead, be, dev)
        if groups > 1:
            zero = _linear.Carry(
                xp.expand_dims(zero.S, axis=-3),
                None if zero.z is None else xp.expand_dims(zero.z, axis=-2),
                None,
            )
        carry = zero
    st = _linear.State(carry.S, carry.z)
    if n == 0:  # no query (Dask refuses even a reduction over the features of no token)
        lead, _ = chk.query_groups(tuple(q.shape[:-2]), kv_lead, names="q, k and v")
        return xp.zeros((*lead, 0, v.shape[-1]), dtype=out_dtype, device=dev), carry
    qsrc = _linear.Source((q, p), (-2, axis))

    def emit(c: Any, s: _linear.Source, place: Any = None) -> tuple[Any, Array]:
        qb, pb = s.arrays
        a, cq = parts.queries(qb, pb)
        if groups > 1:
            a, cq = split_heads(a, groups, xp), None if cq is None else split_heads(cq, groups, xp)
        elif place is not None:  # (written where the output goes, where a library can)
            o = be.plain_attend(a, cq, st, plan, out_dtype, place)
            if o is not None:
                return c, o
        o = _linear.attend(a, cq, st, plan, xp)
        return c, (o if o.dtype == out_dtype else xp.astype(o, out_dtype))

    _, out = be.scan(emit, None, qsrc, n=n, block=part, into=True)
    assert out is not None
    if groups > 1:
        out = merge_heads(out, q.shape[-3], groups, xp)
    return out, carry


#: Bytes of a non-causal part's feature rows (every head's) in an eager loop.
_NONCAUSAL_PART_BYTES = 1 << 21


def _noncausal_part(be: Backend, part: int, q: Array, k: Array, v: Array, F: int) -> int:
    """Tokens per non-causal part where the backend loops over parts in Python (eager and
    writeable: NumPy, torch, CuPy): as many whole parts of ``part`` as keep a part's feature rows
    within :data:`_NONCAUSAL_PART_BYTES`, so each part's fixed cost (its Python, its small
    kernels) is paid less often; else ``part`` (a compiled scan has no such cost).  Parts of
    2,048 tokens (4 heads of 64; no ``C x C`` products) measured 1.16-1.18x faster at 64k in
    torch, 1.03-1.06x in NumPy.  (Causal parts of 1,024 tokens were about 1.06x and 1.03x
    faster, but their working memory beyond the output, 0.31x the output in torch at 64k,
    breaks the 0.25x bound: they keep 512.)"""
    dims = (*q.shape[:-2], *k.shape[:-2], v.shape[-1], F)
    if not (be.writable and be.values_readable and all(isinstance(d, int) for d in dims)):
        return part
    rows = max(math.prod(q.shape[:-2]), math.prod(k.shape[:-2])) * max(F, v.shape[-1]) * 4
    return part * max(1, _NONCAUSAL_PART_BYTES // (rows * part))


def _forward(
    call: _Call,
    be: Backend,
    dev: Device,
    parts: _Parts,
    q: Array,
    k: Array,
    v: Array,
    p: Any,
    mask: Any,
    g: Any,
    init: _linear.Carry | None,
    axis: int,
    part: int,
    docs: _DocCtx | None,
    divided: bool,
    strict: bool = False,
) -> tuple[Any, Any, Any]:
    """Causal attention streamed part by part: ``(out, carry, den)`` (``den`` ``None`` where
    ``divided``; else ``out`` is the numerator).  A state per document (``docs.S0``) reaches each
    query of its document, decayed from the document's start."""
    xp = be.xp
    n = q.shape[-2]
    per_doc = docs is not None and docs.S0 is not None
    runs = None if docs is None else docs.runs
    G = None if docs is None else docs.G
    src = _linear.Source((q, k, v, p, mask, g, runs, G), (-2, -2, -2, axis, -1, -1, -1, -1))
    split = divided and not per_doc  # (the extra term is added before the division)

    def body(carry: Any, s: _linear.Source) -> tuple[Any, Array]:
        qb, kb, vb, pb, mb, gb, rb, Gb = s.arrays
        a, c, b, e, vc = parts.both(qb, kb, vb, pb, mb)
        t = b.shape[-2]
        ch, marks = parts.group(
            _linear.Chunk(a, c, b, e, vc), _linear.Marks(_tokens(gb, t, xp), None if rb is None else rb)
        )
        if split:
            return _causal_part(call, ch, marks, carry, be, dev, q.dtype, strict=strict)
        carry, (num, den) = _causal_part(call, ch, marks, carry, be, dev, None, strict=strict, divided=False)
        if per_doc:
            assert docs is not None and rb is not None
            add_num, add_den = _doc_init(ch.a, ch.c, rb, Gb, docs.S0, docs.z0, call, xp)
            num = num + add_num
            den = None if den is None else den + add_den
        if divided:
            return carry, _linear.divide(num, den, call.plan, xp)
        return carry, num if den is None else xp.concat([num, den[..., None]], axis=-1)

    carry, out = be.scan(body, init, src, n=n, block=part, additive=g is None and docs is None)
    assert out is not None
    if divided or not call.plan.normalize:
        return out, carry, None
    return out[..., :-1], carry, out[..., -1]


def _doc_init(
    a: Array,
    c: Array | None,
    runs: Array,
    G: Array | None,
    S0: Array,
    z0: Array | None,
    call: _Call,
    xp: Namespace,
) -> tuple[Array, Array | None]:
    """The numerator and denominator terms of each query's own document's state: ``exp(G_i) a_i
    S0[doc_i]``, gathered ``chunk_size`` queries at a time (working memory of one chunk of
    states)."""
    T = a.shape[-2]
    if T == 0:  # (no query)
        return xp.zeros_like(a[..., :1]), None if c is None else xp.zeros_like(c[..., 0])
    size = max(1, call.size)
    groups = call.groups
    S0g, z0g = S0, z0
    if groups > 1:
        S0g = xp.expand_dims(S0, axis=-4)
        z0g = None if z0 is None else xp.expand_dims(z0, axis=-3)
    nums, dens = [], []
    for lo in range(0, T, size):
        hi = min(lo + size, T)
        r = runs[..., lo:hi]
        Sg = xp.take(S0g, r, axis=-3)  # (..., t, F, dv)
        num = xp.matmul(a[..., lo:hi, None, :], Sg)[..., 0, :]
        den = None
        if c is not None and z0g is not None:
            den = xp.sum(c[..., lo:hi, :] * xp.take(z0g, r, axis=-2), axis=-1)
        if G is not None:
            w = xp.exp(G[..., lo:hi])
            if groups > 1 and w.ndim >= 2:
                w = xp.expand_dims(w, axis=-2)
            num = num * w[..., None]
            den = None if den is None else den * w
        nums.append(num)
        dens.append(den)
    num = nums[0] if len(nums) == 1 else xp.concat(nums, axis=-2)
    if dens[0] is None:
        return num, None
    return num, dens[0] if len(dens) == 1 else xp.concat(dens, axis=-1)


def _causal_part(
    call: _Call,
    ch: _linear.Chunk,
    marks: _linear.Marks,
    carry: _linear.Carry | None,
    be: Backend,
    dev: Device,
    out_dtype: DType,
    **kw: Any,
) -> tuple[_linear.Carry, Any]:
    """One part of causal attention: padded to whole chunks, then all its chunks at once (a
    backend's :meth:`~rotary._backends.Backend.plain_block` where it has one)."""
    xp = be.xp
    t = ch.b.shape[-2]
    known = call.sized and isinstance(t, int)  # (else symbolic: torch.compile, jax.export, ndonnx)
    size = min(call.size, t) if known and t else call.size
    if t is None:  # an unknown length (ndonnx): chunks of one token, by a new axis (no padding)
        out, after = _linear.block_causal(
            ch, marks, carry, 1, call.plan, xp, dev, out_dtype, cumsum=be.cumsum, **kw
        )
        return after, out
    if t == 0:  # (no token: a static size everywhere; torch.compile specialises 0, symbolic sizes are >= 1)
        dt = out_dtype if out_dtype is not None else ch.v.dtype
        o = xp.zeros((*_out_lead(ch), 0, ch.v.shape[-1]), dtype=dt, device=dev)
        after = carry if carry is not None else _linear.Carry(*_empty_state(ch, xp), None)
        if kw.get("divided", True):
            return after, o
        den = None if ch.c is None else xp.zeros((*_out_lead(ch), 0), dtype=dt, device=dev)
        return after, (o, den)
    if known and t == 1 and not kw.get("strict") and kw.get("divided", True):  # a decoding step
        if carry is None:
            carry = _linear.Carry(*_empty_state(ch, xp), None)
            carry = _linear.Carry(carry.S * 0, None if carry.z is None else carry.z * 0, None)
        if marks.doc is not None and carry.doc is None:
            carry = _linear.Carry(carry.S, carry.z, marks.doc[..., 0])
        o, after = _linear.step(ch, marks, carry, call.plan, xp)
        return after, (o if o.dtype == out_dtype else xp.astype(o, out_dtype))
    padded, pmarks, real, m = _linear.pad_part(ch, marks, size, xp, known)
    res = None
    if known and pmarks.g is None and isinstance(m, int) and m <= _linear.SMALL:
        doc = pmarks.doc
        if doc is None:
            res = be.plain_block(padded, carry, size, m, call.plan, out_dtype, **kw)
        elif be.one_document(doc, None if carry is None else carry.doc):
            # (a part inside one document that its carry belongs to: the documents' masks all ones)
            res = be.plain_block(padded, carry, size, m, call.plan, out_dtype, doc=doc, uniform=True, **kw)
        else:
            res = be.plain_block(padded, carry, size, m, call.plan, out_dtype, doc=doc, **kw)
    if res is None:
        res = _linear.block_causal(
            padded,
            pmarks,
            carry,
            size,
            call.plan,
            xp,
            dev,
            out_dtype,
            chunks=m,
            sized=known,
            cumsum=be.cumsum,
            **kw,
        )
    out, after = res
    if not (known and real == padded.b.shape[-2]):
        if isinstance(out, tuple):
            out = (out[0][..., :real, :], None if out[1] is None else out[1][..., :real])
        else:
            out = out[..., :real, :]
    return after, out


def _out_lead(ch: _linear.Chunk) -> tuple[Any, ...]:
    shapes = [tuple(t.shape[:-2]) for t in (ch.a, ch.v) if t is not None]
    n = max(len(s) for s in shapes)
    full = [(1,) * (n - len(s)) + s for s in shapes]
    return tuple(max(x) for x in zip(*full, strict=True))


def _empty_state(ch: _linear.Chunk, xp: Namespace) -> tuple[Array, Array | None]:
    st, _ = _linear.block_state(ch, _linear.NO_MARKS, xp)
    return st.S, st.z


def _bidirectional(
    call: _Call,
    be: Backend,
    dev: Device,
    parts: _Parts,
    q: Array,
    k: Array,
    v: Array,
    p: Any,
    mask: Any,
    g: Array | None,
    init: _linear.Carry | None,
    axis: int,
    out_dtype: DType,
    docs: _DocCtx | None = None,
) -> tuple[Array, _linear.Carry | None]:
    """Non-causal attention with decay or documents: the keys up to each query (a causal pass,
    ``state`` included) and those after it (a causal pass over the reversed sequence, the query's
    own key excluded; key ``j > i`` counts ``exp(g_{i+1} + ... + g_j)``, so in reverse token ``t``
    carries the gate of ``t + 1``), each within its document.  The reversed pass holds reversed
    copies of q, k and v."""
    xp = be.xp
    n = q.shape[-2]
    shifted = None
    if g is not None:
        gt = _tokens(g, n, xp)
        assert gt is not None
        g = gt
        shifted = xp.concat([gt[..., 1:], xp.zeros_like(gt[..., :1])], axis=-1)
    groups = call.groups
    num, carry, den = _forward(call, be, dev, parts, q, k, v, p, mask, g, init, axis, call.part, docs, False)
    # the reversed pass: no state, the documents reversed with the tokens
    axes = (-2, -2, -2, axis, -1, -1, -1)
    runs = None if docs is None else docs.runs
    arrays = (q, k, v, p, mask, shifted, runs)
    probe = _linear.Source(arrays, axes)
    flipped = [
        x if x is None or not probe.sliced(i, n) else xp.flip(x, axis=ax)
        for i, (x, ax) in enumerate(zip(arrays, axes, strict=True))
    ]
    rq, rk, rv, rp, rm, rg, rr = flipped
    rdocs = None if rr is None else _DocCtx(rr)
    num2, _, den2 = _forward(
        call, be, dev, parts, rq, rk, rv, rp, rm, rg, None, axis, call.part, rdocs, False, strict=True
    )
    num = num + xp.flip(num2, axis=-2)
    den = None if den is None or den2 is None else den + xp.flip(den2, axis=-1)
    out = _linear.divide(num, den, call.plan, xp)
    if groups > 1:
        out = merge_heads(out, q.shape[-3], groups, xp)
    return (out if out.dtype == out_dtype else xp.astype(out, out_dtype)), carry
