"""The chunked engine of the recurrences linear attention's families share, written once.

Per head, in the layout of rotary's states (``S`` is ``F x d_v``, keys on rows: the transpose of
the DeltaNet paper's ``S``)::

    S_t = (D_t + b_t a_t^T) S_{t-1} + k_t v_t^T,      o_t = S_t^T q_t

``D_t = diag(exp(g_t))`` (a log-gate per token, or per token and key feature), ``a_t b_t^T`` an
optional rank-one term, ``k_t`` the written key.  The families (``family`` below):

- additive (``a = b = 0``): RetNet, GLA, HGRN2, Mamba-2, RWKV-6 (with the bonus ``u``:
  ``o_t = S_{t-1}^T q_t + (q_t . (u * k_t)) v_t``, the query reading the state before its own
  token's gate);
- the delta rule (``"delta"``): ``a_t = -beta_t exp(g_t) * k_t``, ``b_t = k_t``, written key
  ``beta_t k_t``: DeltaNet, Gated DeltaNet, Kimi Delta Attention (per-feature gates);
- diagonal plus rank one (``"dplr"``): ``a_t``, ``b_t`` given (RWKV-7, fla's ``dplr``).

Chunked form (chunks of ``C`` tokens; ``L`` the cumulative log-gate from the chunk's start,
inclusive, ``Lx = L - g`` exclusive).  Let ``S`` be the state before the chunk.  Every pairwise
term is a product ``sum_f x_tf y_jf exp(lx_tf - ly_jf)`` over the pairs ``j <= t`` (or ``j < t``)
of one chunk (:func:`pairs`): built without overflow, per-feature gates by sub-blocks that take
a reference log-gate between the two tokens (both factors at most 1), the diagonal sub-blocks
directly.  The rank-one part in the WY/UT form: the pseudo-values ``U`` (``u_t = a_t^T S_{t-1}``)
solve ``U = A U + Ag S + Ak V`` with ``A`` strictly lower triangular, so ``U = T (Ag S + Ak V)``
with ``T = (I - A)^{-1}`` (:func:`unit_lower_inverse`, all chunks at once); then, chunk by chunk::

    O  = Qg S + Qb U + Qk V          S' = exp(L_C) * S + Bend^T U + Kend^T V

(the delta rule merges ``U`` and ``beta V`` into one ``nu = T (Ag S + beta V)``: ``O = Qg S + Qk
nu``, ``S' = exp(L_C) * S + Kend^T nu``).  Documents (run ids) mask every pairwise term and the
state's reach; a state per document enters each document's first chunk.
"""

from __future__ import annotations

from typing import Any, Literal, NamedTuple

from .._lib._typing import Array, Device, Namespace
from ._linear import CumSum, _cumsum

__all__ = ["Family", "Rec", "chunked", "pairs", "step", "unit_lower_inverse"]

Rank = Literal["delta", "dplr"] | None


class Family(NamedTuple):
    """The static shape of a recurrence: per-feature gates, the rank-one kind, RWKV-6's bonus."""

    per_feature: bool = False
    rank: Rank = None
    bonus: bool = False


class Rec(NamedTuple):
    """The inputs of a block of tokens (sequence axis -2 for vectors, -1 for per-token scalars),
    in the compute dtype.  Query-side arrays may carry a group axis the key side has as 1."""

    q: Array | None  # (..., T, F) query features; None: no outputs
    k: Array  # (..., T, F) written keys (the delta rule: before beta)
    v: Array  # (..., T, dv)
    g: Array | None  # (..., T) or (..., T, F) log-gates
    beta: Array | None = None  # (..., T): the delta rule
    a: Array | None = None  # (..., T, F): dplr
    b: Array | None = None  # (..., T, F): dplr
    u: Array | None = None  # (..., 1, F): RWKV-6's bonus (one per feature, a token axis of 1)
    doc: Array | None = None  # (..., T) run ids


class Carry(NamedTuple):
    """The state after a block and the document of its last token (``None`` without
    documents)."""

    S: Array
    doc: Array | None


def _t(x: Array, xp: Namespace) -> Array:
    return xp.matrix_transpose(x)


def _tri(n: int, xp: Namespace, device: Device, dtype: Any, strict: bool) -> Array:
    i = xp.arange(n, device=device)
    return xp.astype(i[:, None] > i[None, :] if strict else i[:, None] >= i[None, :], dtype)


def _neg(x: Array, xp: Namespace) -> Array:
    """``min(x, 0)``: a log-weight of a pair outside the triangle, clamped before ``exp``."""
    return xp.minimum(x, xp.zeros_like(x))


def pairs(
    x: Array, y: Array, lx: Array | None, ly: Array | None, strict: bool, xp: Namespace, device: Device
) -> Array:
    """``(..., m, C, C)``: ``P[t, j] = sum_f x[t, f] y[j, f] exp(lx[t, f] - ly[j, f])`` for ``j <= t``
    (``j < t`` where ``strict``), 0 above.  ``x``, ``y``: ``(..., m, C, F)``; ``lx``, ``ly``: log-gates
    ``(..., m, C)`` (one per token) or ``(..., m, C, F)`` (per feature), ``lx[t] <= ly[j]`` on every
    pair kept, or ``None`` (no gates).  Never overflows, and per feature costs one ``C x C x F``
    product: the chunk's lower triangle is cut into the blocks of a binary tree (at each level,
    the later half of a block against its earlier half, as one batched product), each taking the
    log-gate of its keys' last token as reference (both factors at most 1); the diagonal is
    elementwise."""
    C = x.shape[-2]
    if lx is None or ly is None:
        return xp.matmul(x, _t(y, xp)) * _tri(C, xp, device, x.dtype, strict)
    if lx.ndim == x.ndim - 1:  # one log-gate per token
        d = lx[..., :, None] - ly[..., None, :]
        return xp.matmul(x, _t(y, xp)) * (xp.exp(_neg(d, xp)) * _tri(C, xp, device, x.dtype, strict))
    P = 1
    while P < C:
        P *= 2
    if P != C:  # (padded with zero features: nothing pairs with them)
        x, y, lx, ly = (_pad(z, P - C, -2, xp) for z in (x, y, lx, ly))
    assert x is not None and y is not None and lx is not None and ly is not None
    out = None
    s = P // 2
    while s >= 1:
        k = P // (2 * s)

        def halves(z: Array, s: int = s, k: int = k) -> Array:
            return xp.reshape(z, (*z.shape[:-2], k, 2, s, z.shape[-1]))

        xb, lxb, yb, lyb = halves(x), halves(lx), halves(y), halves(ly)
        ref = lyb[..., 0, -1:, :]  # (..., m, k, 1, F): the earlier half's last key
        xq = xb[..., 1, :, :] * xp.exp(_neg(lxb[..., 1, :, :] - ref, xp))
        yk = yb[..., 0, :, :] * xp.exp(ref - lyb[..., 0, :, :])
        blk = xp.matmul(xq, _t(yk, xp))  # (..., m, k, s, s): the later half against the earlier
        z = xp.zeros_like(blk)
        full = xp.concat(
            [xp.concat([z, z], axis=-1), xp.concat([blk, z], axis=-1)], axis=-2
        )  # (.., k, 2s, 2s)
        if k > 1:  # (the k blocks on the diagonal of the P x P triangle)
            eye = xp.astype(
                xp.arange(k, device=device)[:, None] == xp.arange(k, device=device)[None, :], x.dtype
            )
            full = xp.reshape(full[..., :, :, None, :] * eye[:, None, :, None], (*full.shape[:-3], P, P))
        else:
            full = full[..., 0, :, :]
        out = full if out is None else out + full
        s //= 2
    if out is None:  # (one token)
        out = xp.zeros((*x.shape[:-2], P, P), dtype=x.dtype, device=device)
    if not strict:
        own = xp.sum(x * y * xp.exp(_neg(lx - ly, xp)), axis=-1)  # (..., m, P)
        out = out + own[..., :, None] * _eye(P, xp, device, x.dtype)
    return out if P == C else out[..., :C, :C]


def unit_lower_inverse(A: Array, xp: Namespace) -> Array:
    """``(I - A)^{-1}`` of strictly lower triangular ``A`` ``(..., C, C)``: halves of the
    diagonal blocks split down to single entries, then merged back two by two
    (``[[P, 0], [-B, Q]]^{-1} = [[P^-1, 0], [Q^-1 B P^-1, Q^-1]]``), every level of every chunk
    one batched product; the same as forward substitution, with ``log2 C`` levels."""
    C = A.shape[-1]
    P = 1
    while P < C:
        P *= 2
    if P != C:  # padded with zeros: the padding's inverse is the identity, apart from the rest
        zr = xp.zeros((*A.shape[:-2], P - C, C), dtype=A.dtype, device=getattr(A, "device", None))
        A = xp.concat([A, zr], axis=-2)
        zc = xp.zeros((*A.shape[:-2], P, P - C), dtype=A.dtype, device=getattr(A, "device", None))
        A = xp.concat([A, zc], axis=-1)
    offs = []
    X = A[..., None, :, :]
    h = P
    while h > 1:
        h //= 2
        offs.append(X[..., h:, :h])  # (..., k, h, h)
        X = xp.stack([X[..., :h, :h], X[..., h:, h:]], axis=-3)
        X = xp.reshape(X, (*X.shape[:-4], X.shape[-4] * 2, h, h))
    inv = xp.ones_like(X)  # (..., P, 1, 1): unit diagonal
    for off in reversed(offs):
        k, h = off.shape[-3], off.shape[-1]
        pair = xp.reshape(inv, (*inv.shape[:-3], k, 2, h, h))
        Ti, Di = pair[..., 0, :, :], pair[..., 1, :, :]
        low = xp.matmul(xp.matmul(Di, off), Ti)
        top = xp.concat([Ti, xp.zeros_like(Ti)], axis=-1)
        bot = xp.concat([low, Di], axis=-1)
        inv = xp.concat([top, bot], axis=-2)
    out = inv[..., 0, :, :]
    return out if P == C else out[..., :C, :C]


# -- one block of chunks -------------------------------------------------------------------------
def _pad(x: Array | None, pad: int, axis: int, xp: Namespace, edge: bool = False) -> Array | None:
    if x is None or pad == 0:
        return x
    if edge:  # (document ids: the last one repeated, no boundary)
        piece = xp.broadcast_to(x[..., -1:], (*x.shape[:-1], pad))
    else:
        shape = list(x.shape)
        shape[axis] = pad
        piece = xp.zeros(tuple(shape), dtype=x.dtype, device=getattr(x, "device", None))
    return xp.concat([x, piece], axis=axis)


def _chunks(x: Array | None, m: int, C: int, vec: bool, xp: Namespace) -> Array | None:
    """The sequence axis (-2 of a vector, -1 of a per-token scalar) as ``(m, C)``."""
    if x is None:
        return None
    if vec:
        return xp.reshape(x, (*x.shape[:-2], m, C, x.shape[-1]))
    return xp.reshape(x, (*x.shape[:-1], m, C))


def _col(w: Array, per_feature: bool) -> Array:
    """A log-gate's weights as a factor of ``(..., C, F)`` rows."""
    return w if per_feature else w[..., None]


class _Prep(NamedTuple):
    """Everything of a block that does not depend on the carried state, per chunk."""

    Qg: Array | None  # (..., m, C, F) queries reading the chunk-start state
    Qk: Array | None  # (..., m, C, C) queries against the chunk's written keys
    Qb: Array | None  # (..., m, C, C) against the rank-one keys b (dplr)
    W: Array | None  # (..., m, C, F) the chunk-start state's share of the pseudo-values
    U0: Array | None  # (..., m, C, dv) the pseudo-values' own part
    Kend: Array  # (..., m, C, F) written keys decayed to the chunk's end
    Bend: Array | None  # (..., m, C, F) rank-one keys decayed to the end (dplr)
    V: Array  # (..., m, C, dv) values (the delta rule: unused)
    gam: Array  # (..., m, F, 1) or (..., m, 1, 1): the chunk's total decay of the state
    docs: _DocStarts | None = None  # a state per document: its share in each chunk


class _DocStarts(NamedTuple):
    """With a state per document, what reads the state of each document that starts inside a
    chunk (every token outside the chunk-start document), decayed from the document's start."""

    Qd: Array | None  # (..., m, C, F) queries reading their document's state
    Ad: Array | None  # (..., m, C, F) the pseudo-values' read of it (rank-one families)
    T: Array | None  # (..., m, C, C) the chunk's triangular inverse (rank-one families)
    gl: Array  # (..., m, F, 1) or (..., m, 1, 1): the last document's state decay to the chunk's end
    fresh: Array  # (..., m, 1, 1): the chunk ends in a document that started inside it


def _prepare(
    r: Rec,
    fam: Family,
    m: int,
    C: int,
    xp: Namespace,
    dev: Device,
    cdoc: Array | None,
    cs: CumSum,
    per_doc: bool = False,
) -> _Prep:
    """The chunk-local quantities of ``r`` (already padded to ``m * C`` tokens); ``per_doc``: a
    state per document enters each document's first chunk."""
    pf = fam.per_feature
    q, k, v, a, b = (_chunks(t, m, C, True, xp) for t in (r.q, r.k, r.v, r.a, r.b))
    assert k is not None and v is not None
    g = _chunks(r.g, m, C, pf, xp)
    beta = _chunks(r.beta, m, C, False, xp)
    doc = _chunks(r.doc, m, C, False, xp)
    L = Lx = None
    if g is not None:
        L = cs(g, -2 if pf else -1)
        Lx = L - g
    Lq = Lx if fam.bonus else L
    last = None if L is None else (L[..., -1:, :] if pf else L[..., -1:])
    same = cm = em = keep = None
    if doc is not None:
        assert cdoc is not None
        same = xp.astype(doc[..., :, None] == doc[..., None, :], k.dtype)
        cm = xp.astype(doc == cdoc[..., None], k.dtype)  # (..., m, C): in the chunk-start document
        em = xp.astype(doc == doc[..., -1:], k.dtype)  # in the chunk's last document
        keep = xp.astype(cdoc == doc[..., -1], k.dtype)  # (..., m)

    def masked(P: Array) -> Array:
        return P if same is None else P * same

    def rows(x: Array, w: Array | None, mask: Array | None) -> Array:
        if w is not None:
            x = x * xp.exp(_col(w, pf))
        return x if mask is None else x * mask[..., None]

    Qg = Qk = Qb = None
    if q is not None:
        Qg = rows(q, Lq, cm)
        Qk = masked(pairs(q, k, Lq, L, fam.bonus, xp, dev))
        if fam.bonus:
            assert r.u is not None
            own = xp.sum(q * r.u[..., None, :, :] * k, axis=-1)  # (..., m, C)
            Qk = Qk + own[..., :, None] * _eye(C, xp, dev, k.dtype)
    end = None if L is None else last - L  # (<= 0)
    Kend = rows(k, end, em)
    W = U0 = Bend = T = a_read = None
    if fam.rank == "delta":
        assert beta is not None
        bk = -beta[..., None] * k
        A = masked(pairs(bk, k, L, L, True, xp, dev))
        T = unit_lower_inverse(A, xp)
        W = xp.matmul(T, rows(bk, L, cm))
        a_read = bk  # (the state is read along a = -beta k, from the inclusive gates)
        U0 = xp.matmul(T, beta[..., None] * v)
    elif fam.rank == "dplr":
        assert a is not None and b is not None
        A = masked(pairs(a, b, Lx, L, True, xp, dev))
        T = unit_lower_inverse(A, xp)
        W = xp.matmul(T, rows(a, Lx, cm))
        a_read = a
        U0 = xp.matmul(T, xp.matmul(masked(pairs(a, k, Lx, L, True, xp, dev)), v))
        Bend = rows(b, end, em)
        if q is not None:
            Qb = masked(pairs(q, b, Lq, L, fam.bonus, xp, dev))
    if last is None:
        gam = xp.ones((*k.shape[:-2], 1, 1), dtype=k.dtype, device=dev)
    else:
        gam = xp.exp(last)  # (..., m, 1, F) or (..., m, 1)
        gam = _t(gam, xp) if pf else gam[..., None]
    if keep is not None:
        gam = gam * keep[..., None, None]
    starts = None
    if per_doc:
        assert doc is not None and keep is not None and cm is not None and same is not None
        starts = _doc_starts(q, a_read, T, g, L, Lq, doc, same, cm, keep, fam, C, xp, dev, k.dtype)
    return _Prep(Qg, Qk, Qb, W, U0, Kend, Bend, v, gam, starts)


def _doc_starts(
    q: Array | None,
    a_read: Array | None,
    T: Array | None,
    g: Array | None,
    L: Array | None,
    Lq: Array | None,
    doc: Array,
    same: Array,
    cm: Array,
    keep: Array,
    fam: Family,
    C: int,
    xp: Namespace,
    dev: Device,
    dt: Any,
) -> _DocStarts:
    """:class:`_DocStarts`: each token's log-gate at its document's start inside the chunk (a
    one-hot read of the exclusive running sum), the reads decayed from there."""
    pf = fam.per_feature
    first = xp.concat([xp.ones_like(doc[..., :1], dtype=xp.bool), doc[..., 1:] != doc[..., :-1]], axis=-1)
    start = same * xp.astype(first, dt)[..., None, :] * _tri(C, xp, dev, dt, False)  # (..., m, C, C)
    nm = 1 - cm  # (tokens of a document that starts inside the chunk)
    B = Lx = None
    if g is not None and L is not None:
        Lx = L - g
        B = xp.matmul(start, Lx if pf else Lx[..., None])
        B = B if pf else B[..., 0]

    def read(x: Array | None, lg: Array | None) -> Array | None:
        if x is None:
            return None
        if lg is not None and B is not None:
            x = x * xp.exp(_col(lg - B, pf))
        return x * nm[..., None]

    Qd = read(q, Lq)
    Ad = read(a_read, L if fam.rank == "delta" else Lx)
    if L is None or B is None:
        gl = xp.ones((*doc.shape[:-1], 1, 1), dtype=dt, device=dev)
    else:
        gl = xp.exp(L[..., -1:, :] - B[..., -1:, :]) if pf else xp.exp(L[..., -1:] - B[..., -1:])
        gl = _t(gl, xp) if pf else gl[..., None]
    return _DocStarts(Qd, Ad, T, gl, (1 - keep)[..., None, None])


def _eye(n: int, xp: Namespace, device: Device, dtype: Any) -> Array:
    i = xp.arange(n, device=device)
    return xp.astype(i[:, None] == i[None, :], dtype)


def _at(x: Any, c: int) -> Any:
    """Chunk ``c`` of a per-chunk array (chunk axis -3)."""
    return None if x is None else x[..., c, :, :]


def chunked(
    r: Rec,
    carry: Carry | None,
    size: int,
    fam: Family,
    xp: Namespace,
    device: Device,
    *,
    writes: bool = False,
    cumsum: CumSum | None = None,
    doc_states: Array | None = None,
) -> tuple[Array | None, Carry, Array | None]:
    """Causal outputs of a block of ``T`` tokens from ``carry`` (``None``: a zero state), the carry
    after it, and with ``writes`` the values each token writes along its key (the delta rule's
    pseudo-values ``nu``, else ``v``: the state is the keys' decayed sum of them).  Chunks of
    ``size``; the block is padded to whole chunks."""
    T = r.k.shape[-2]
    C = max(1, min(size, T))
    m = -(-T // C)
    pad = m * C - T
    pf = fam.per_feature
    if pad:
        r = Rec(
            _pad(r.q, pad, -2, xp),
            _pad(r.k, pad, -2, xp),
            _pad(r.v, pad, -2, xp),
            _pad(r.g, pad, -2 if pf else -1, xp),
            _pad(r.beta, pad, -1, xp),
            _pad(r.a, pad, -2, xp),
            _pad(r.b, pad, -2, xp),
            r.u,
            _pad(r.doc, pad, -1, xp, edge=True),
        )
    k, v = r.k, r.v
    dv = v.shape[-1]
    if carry is None:
        S = xp.zeros((*k.shape[:-2], k.shape[-1], dv), dtype=k.dtype, device=device)
        carry = Carry(S, None)
    cdoc = None
    if r.doc is not None:
        first = carry.doc if carry.doc is not None else r.doc[..., 0]
        # the document before each chunk: the carry's, then each chunk's last token's
        prev = r.doc[..., C - 1 : m * C - 1 : C] if m > 1 else r.doc[..., :0]
        cdoc = xp.concat([first[..., None] if first.ndim == r.doc.ndim - 1 else first, prev], axis=-1)
    p = _prepare(r, fam, m, C, xp, device, cdoc, _cumsum(xp, cumsum), doc_states is not None)
    S = carry.S
    outs: list[Array] = []
    ys: list[Array] = []
    for c in range(m):
        S0d = None
        if p.docs is not None:  # (each document starting in the chunk: its own state)
            assert doc_states is not None and r.doc is not None
            S0d = xp.take(doc_states, r.doc[..., c * C : (c + 1) * C], axis=-3)  # (..., C, F, dv)
        if fam.rank is None:
            Y = _at(p.V, c)
        else:
            Y = xp.matmul(_at(p.W, c), S) + _at(p.U0, c)
            if S0d is not None and p.docs is not None:
                d = xp.matmul(_at(p.docs.Ad, c)[..., None, :], S0d)[..., 0, :]
                Y = Y + xp.matmul(_at(p.docs.T, c), d)
        assert Y is not None
        if p.Qg is not None:
            o = xp.matmul(_at(p.Qg, c), S)
            if S0d is not None and p.docs is not None:
                o = o + xp.matmul(_at(p.docs.Qd, c)[..., None, :], S0d)[..., 0, :]
            if fam.rank == "dplr":
                o = o + xp.matmul(_at(p.Qk, c), _at(p.V, c)) + xp.matmul(_at(p.Qb, c), Y)
            else:
                o = o + xp.matmul(_at(p.Qk, c), Y)
            outs.append(o)
        new = xp.matmul(_t(_at(p.Kend, c), xp), Y if fam.rank != "dplr" else _at(p.V, c))
        if fam.rank == "dplr":
            new = new + xp.matmul(_t(_at(p.Bend, c), xp), Y)
        S = S * _at(p.gam, c) + new
        if p.docs is not None and r.doc is not None and doc_states is not None:
            last = xp.take(doc_states, r.doc[..., (c + 1) * C - 1 : (c + 1) * C], axis=-3)[..., 0, :, :]
            S = S + _at(p.docs.fresh, c) * _at(p.docs.gl, c) * last
        if writes:
            ys.append(Y)
    out = None
    if outs:
        out = xp.concat(outs, axis=-2) if m > 1 else outs[0]
        if pad:
            out = out[..., :T, :]
    w = None
    if writes:
        w = xp.concat(ys, axis=-2) if m > 1 else ys[0]
        if pad:
            w = w[..., :T, :]
    doc = None if r.doc is None else r.doc[..., -1]
    return out, Carry(S, doc), w


def step(
    r: Rec, carry: Carry | None, fam: Family, xp: Namespace, device: Device
) -> tuple[Array | None, Carry]:
    """One token (sequence length 1) from ``carry``: a few small products."""
    k, v = r.k, r.v
    if carry is None:
        S = xp.zeros((*k.shape[:-2], k.shape[-1], v.shape[-1]), dtype=k.dtype, device=device)
        carry = Carry(S, None)
    S = carry.S
    kt = _t(k, xp)  # (..., F, 1)
    keep = None
    if r.doc is not None and carry.doc is not None:
        keep = xp.astype(r.doc == carry.doc[..., None], k.dtype)[..., None]  # (..., 1, 1)
        S = S * keep
    dec = None
    if r.g is not None:
        dec = xp.exp(_t(r.g, xp)) if fam.per_feature else xp.exp(r.g)[..., None]  # (..., F|1, 1)
    out = None
    if fam.bonus:
        assert r.u is not None and r.q is not None
        own = xp.sum(r.q * r.u * k, axis=-1, keepdims=True)  # (..., 1, 1)
        out = xp.matmul(r.q, S) + own * v
    Sg = S if dec is None else S * dec
    if fam.rank == "delta":
        assert r.beta is not None
        beta = r.beta[..., None]  # (..., 1, 1)
        # u = a^T S with a = -beta exp(g) k: the gated state read along k
        pred = xp.matmul(k, Sg)  # (..., 1, dv)
        S = Sg + kt * (beta * (v - pred))
    elif fam.rank == "dplr":
        assert r.a is not None and r.b is not None
        u = xp.matmul(r.a, S)  # (..., 1, dv): the state before the gate
        S = Sg + _t(r.b, xp) * u + kt * v
    else:
        S = Sg + kt * v
    if out is None and r.q is not None:
        out = xp.matmul(r.q, S)
    doc = None if r.doc is None else r.doc[..., -1]
    return out, Carry(S, doc)
