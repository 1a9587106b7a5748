"""The algebra of RoPE linear attention (RoFormer eq. 19, with the field's decay and gates), written once.

Notation, per head: ``a_i`` / ``c_i`` the numerator / denominator features of query ``i``,
``b_j`` / ``e_j`` those of key ``j`` (numerator features rotated by RoPE, denominator ones
not, for ``similarity="dot"``; both rotated and with a constant feature for ``"cosine"``), and
``w_ij`` the weight of key ``j`` at query ``i``::

    out_i = sum_{j <= i} w_ij (a_i . b_j) v_j / sum_{j <= i} w_ij (c_i . e_j)

(the denominator only when normalised).  ``w_ij = prod_{s=j+1..i} alpha_s`` where
``alpha_s = exp(g_s)``, ``g_s <= 0`` the log-gate of token ``s`` (``0``: no decay, RoFormer), and
``w_ij = 0`` between tokens of different documents (a document boundary is a gate that forgets
everything; documents are *runs*: ``doc`` ids that never decrease along the sequence).

The keys enter only through the *state*: ``S = sum_j w_j b_j v_j^T`` (``F x d_v``) and ``z =
sum_j w_j e_j`` (``F``), every key weighted by its decay up to the state's end.  The causal
form splits the sequence into chunks of ``C`` tokens: inside a chunk the masked quadratic form
(mask and decay as *multiplied* constants, never ``where``), before it the state of every earlier
chunk.  :func:`block_causal` runs the ``m`` chunks of a block at once: the states at the chunk
starts are one ``(m + 1) x (m + 1)`` weighted sum of the chunk states (a matrix product, in
which the decays between chunks are sums of the chunk totals that lie between, never differences
of long cumulative sums).  Backends stream blocks (:meth:`rotary._backends.Backend.scan`): the
working memory is one block's, whatever the sequence length.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from .._lib._typing import Array, Device, DType, FeatureMapName, Namespace

__all__ = [
    "FEATURE_MAPS",
    "Carry",
    "Chunk",
    "Marks",
    "Plan",
    "Source",
    "State",
    "absorb",
    "attend",
    "block_causal",
    "block_state",
    "features",
    "pad_part",
    "query_features",
    "step",
]


def _elu1(x: Array, xp: Namespace) -> Array:
    # relu(x) + exp(min(x, 0)): elu(x) + 1 bit for bit (x + 1 above 0, exp(x) below), no where
    return xp.maximum(x, xp.zeros_like(x)) + xp.exp(xp.minimum(x, xp.zeros_like(x)))


def _relu(x: Array, xp: Namespace) -> Array:
    return xp.maximum(x, xp.zeros_like(x))


def _softplus(x: Array, xp: Namespace) -> Array:
    return _relu(x, xp) + xp.log1p(xp.exp(-xp.abs(x)))


def _identity(x: Array, xp: Namespace) -> Array:
    return x


#: Named feature maps ``phi``; a callable ``phi(x) -> features`` is accepted too.
FEATURE_MAPS: dict[FeatureMapName, Callable[[Array, Namespace], Array]] = {
    "elu+1": _elu1,
    "relu": _relu,
    "softplus": _softplus,
    "identity": _identity,
}

#: Named maps whose features are never negative (a positive denominator for ``"dot"``).
NONNEGATIVE_MAPS: tuple[FeatureMapName, ...] = ("elu+1", "relu", "softplus")


class Plan(NamedTuple):
    """The static part of a linear-attention call (hashable: the jit cache key on JAX)."""

    phi: Callable[[Array, Namespace], Array]
    cosine: bool
    eps: float  # floor of the denominator of scale-free query features (0: only 0/0 -> 0)
    cdt: DType
    normalize: bool = True
    l2norm: bool = False  # features divided by sqrt(|f|^2 + 1e-6) (fla's use_qk_l2norm_in_kernel)
    scale: float = 1.0  # query features multiplied by it (unnormalised: normalised outputs are ratios)
    # called with every denominator before the division (a map not known to be non-negative: its
    # kernel's denominators are checked where their values can be read); None: no check
    check: Callable[[Array], None] | None = None


#: The ``eps`` of the L2 normalisation of features: ``f / sqrt(|f|^2 + eps)``, as flash-linear-attention
#: and transformers' linear-attention layers write it.
L2_EPS = 1e-6


class State(NamedTuple):
    """Running sums ``S`` (``(..., F, d_v)``) and ``z`` (``(..., F)``; ``None`` unnormalised)."""

    S: Array
    z: Array | None


class Carry(NamedTuple):
    """What passes from one block to the next: the state after the block, and the document of
    its last token (``None`` without documents)."""

    S: Array
    z: Array | None
    doc: Array | None


class Chunk(NamedTuple):
    """Features of a block of tokens (sequence axis -2); ``c``, ``e`` are ``None`` unnormalised,
    ``a``, ``c`` where the block has no queries."""

    a: Array | None  # query numerator features
    c: Array | None  # query denominator features
    b: Array  # key numerator features
    e: Array | None  # key denominator features
    v: Array  # values, in the compute dtype


class Marks(NamedTuple):
    """Per-token gates and documents of a block (sequence axis -1), each optional."""

    g: Array | None  # log-gates g_t <= 0 (compute dtype)
    doc: Array | None  # document (run) ids, never decreasing along the sequence


NO_MARKS = Marks(None, None)

#: ``cumsum(x, axis)``: a library's own cumulative sum where the namespace's is a wrapper a
#: tracer should not see (array-api-compat's torch one looks up the namespace, lru-cached).
CumSum = Callable[[Array, int], Array]


def _cumsum(xp: Namespace, cumsum: CumSum | None) -> CumSum:
    if cumsum is not None:
        return cumsum
    return lambda x, axis: xp.cumulative_sum(x, axis=axis)


def features(x: Array, plan: Plan, xp: Namespace) -> Array:
    """``phi(x)`` in the compute dtype; unit vectors for ``"cosine"`` (zero vectors stay zero)."""
    if x.dtype != plan.cdt:
        x = xp.astype(x, plan.cdt)
    f = plan.phi(x, xp)
    if plan.cosine:
        n2 = xp.sum(f * f, axis=-1, keepdims=True)
        tiny = float(xp.finfo(plan.cdt).smallest_normal)
        f = f / xp.sqrt(xp.maximum(n2, xp.full_like(n2, tiny)))
    if plan.l2norm:
        f = f / xp.sqrt(xp.sum(f * f, axis=-1, keepdims=True) + L2_EPS)
    return f


def query_features(x: Array, plan: Plan, xp: Namespace) -> Array:
    """Query features for the numerator and the denominator: ``phi(q)``, divided by a positive
    factor per token where the output is a ratio (``similarity="dot"``, normalised), so that
    its scale never reaches a floor.  ``elu+1`` is scaled in the log domain (``exp(x - m)`` for
    the largest ``m <= 0``), so features that would underflow (``q = -200`` in float32) keep
    their ratios; other maps are divided by their largest feature."""
    if plan.cosine or not plan.normalize:
        f = features(x, plan, xp)
        return f if plan.scale == 1.0 or plan.cosine else f * plan.scale
    if plan.l2norm:  # (then scaled like any map: by the largest feature)
        f = features(x, plan, xp)
        top = xp.max(xp.abs(f), axis=-1, keepdims=True)
        tiny = float(xp.finfo(plan.cdt).smallest_normal)
        return f / xp.maximum(top, xp.full_like(top, tiny))
    if x.dtype != plan.cdt:
        x = xp.astype(x, plan.cdt)
    zero = xp.zeros_like(x)
    if plan.phi is _elu1:
        shift = xp.minimum(xp.max(x, axis=-1, keepdims=True), xp.zeros_like(x[..., :1]))
        return xp.maximum(x, zero) + xp.exp(xp.minimum(x, zero) - shift)
    f = plan.phi(x, xp)
    top = xp.max(xp.abs(f), axis=-1, keepdims=True)  # (features of either sign: their largest size)
    tiny = float(xp.finfo(plan.cdt).smallest_normal)
    return f / xp.maximum(top, xp.full_like(top, tiny))


def with_one(f: Array, xp: Namespace) -> Array:
    """``f`` with a constant feature 1 appended (it carries the ``1 +`` of the cosine similarity)."""
    one = xp.ones_like(f[..., :1])
    return xp.concat([f, one], axis=-1)


def _t(x: Array, xp: Namespace) -> Array:
    return xp.matrix_transpose(x)


def divide(num: Array, den: Array | None, plan: Plan, xp: Namespace) -> Array:
    """``num / den`` (``den`` of shape ``num.shape[:-1]``): a denominator of exactly 0 (a query
    that sees no key, or features of disjoint supports) gives 0, never NaN or a blow-up, and no
    NaN gradient (the division is by ``inf`` there); ``plan.eps > 0`` floors it instead."""
    if den is None:
        return num
    if plan.check is not None:
        plan.check(den)
    if plan.eps > 0:
        return num / xp.maximum(den, xp.full_like(den, plan.eps))[..., None]
    safe = xp.where(den != 0, den, xp.full_like(den, float("inf")))
    return num / safe[..., None]


def block_state(
    ch: Chunk, marks: Marks, xp: Namespace, cumsum: CumSum | None = None
) -> tuple[State, Array | None]:
    """The state of the keys of ``ch`` at its end (keys of its last document only), and the
    block's total log-decay (``None`` without gates; ``-inf``-free: a block that holds a
    document boundary is marked by its documents, not by the decay)."""
    b, e, v = ch.b, ch.e, ch.v
    g, doc = marks
    if g is None and doc is None:
        return State(xp.matmul(_t(b, xp), v), None if e is None else xp.sum(e, axis=-2)), None
    w = None
    total = None
    if g is not None and g.shape[-1] == 0:  # (no keys: no decay, nothing to weigh)
        total = xp.sum(g, axis=-1)
    elif g is not None:
        ell = _cumsum(xp, cumsum)(g, -1)
        total = ell[..., -1]
        w = xp.exp(ell[..., -1:] - ell)
    if doc is not None and doc.shape[-1]:
        same = xp.astype(doc == doc[..., -1:], b.dtype)
        w = same if w is None else w * same
    if w is None:
        return State(xp.matmul(_t(b, xp), v), None if e is None else xp.sum(e, axis=-2)), total
    wb = b * w[..., None]
    S = xp.matmul(_t(wb, xp), v)
    z = None if e is None else xp.sum(e * w[..., None], axis=-2)
    return State(S, z), total


def attend(a: Array, c: Array | None, st: State, plan: Plan, xp: Namespace) -> Array:
    """Queries against a whole state (non-causal, or decoding)."""
    num = xp.matmul(a, st.S)
    if c is None or st.z is None:
        return num
    return divide(num, xp.sum(c * st.z[..., None, :], axis=-1), plan, xp)


def step(ch: Chunk, marks: Marks, carry: Carry, plan: Plan, xp: Namespace) -> tuple[Array, Carry]:
    """One token (sequence length 1) from the state ``carry``: ``S' = alpha S + b v^T`` and the
    output ``a S' / c . z'`` (the decoding step: a few small kernels)."""
    b, e, v = ch.b, ch.e, ch.v
    alpha = None
    if marks.g is not None:
        alpha = xp.exp(marks.g)[..., None]  # (..., 1, 1)
    doc = carry.doc
    if marks.doc is not None and doc is not None:
        keep = xp.astype(marks.doc == doc[..., None], b.dtype)[..., None]
        alpha = keep if alpha is None else alpha * keep
    S, z = carry.S, carry.z
    if alpha is not None:
        S = S * alpha
        z = None if z is None else z * alpha[..., 0]
    S = S + _t(b, xp) * v  # (one key: the outer product, a single product per element)
    z = None if z is None or e is None else z + e[..., 0, :]
    out = attend(ch.a, ch.c, State(S, z), plan, xp) if ch.a is not None else None
    new_doc = marks.doc[..., -1] if marks.doc is not None else doc
    return out, Carry(S, z, new_doc)


def _split(x: Array | None, m: int, size: int, xp: Namespace) -> Array | None:
    """``(..., m * size, F)`` as ``(..., m, size, F)``."""
    if x is None:
        return None
    return xp.reshape(x, (*x.shape[:-2], m, size, x.shape[-1]))


def _split_marks(x: Array | None, m: Any, size: int, xp: Namespace) -> Array | None:
    if x is None:
        return None
    return xp.reshape(x, (*x.shape[:-1], m, size))


def _tri(n: int, xp: Namespace, device: Device, dtype: DType, strict: bool = False) -> Array:
    """``(n, n)``: 1 on and below the diagonal (below only where ``strict``)."""
    i = xp.arange(n, device=device)
    return xp.astype(i[:, None] > i[None, :] if strict else i[:, None] >= i[None, :], dtype)


def _same(a: Array, b: Array, dtype: DType, xp: Namespace) -> Array:
    """``(..., len(a), len(b))``: 1 where the ids ``a[..., t]`` and ``b[..., s]`` are equal, else 0."""
    return xp.astype(a[..., :, None] == b[..., None, :], dtype)


def _stack_states(first: Array, chunks: Array, axis: int, xp: Namespace) -> Array:
    """``first`` (the carry) in front of the ``m`` chunk states along ``axis`` (negative; the
    leading axes of both broadcast)."""
    k = -axis  # the stacked axis and the ones after it
    first = xp.expand_dims(first, axis=axis)
    n = max(first.ndim, chunks.ndim)
    fs = (1,) * (n - first.ndim) + tuple(first.shape)
    cs = (1,) * (n - chunks.ndim) + tuple(chunks.shape)
    lead = tuple(y if x == 1 else x for x, y in zip(fs[: n - k], cs[: n - k], strict=True))
    if fs[: n - k] != lead or first.ndim != n:
        first = xp.broadcast_to(first, (*lead, *fs[n - k :]))
    if cs[: n - k] != lead or chunks.ndim != n:
        chunks = xp.broadcast_to(chunks, (*lead, *cs[n - k :]))
    return xp.concat([first, chunks], axis=axis)


def _range_sums(lam: Array, xp: Namespace, device: Device, cumsum: CumSum) -> Array:
    """``(..., m + 1, m + 1)``: ``[t, s] = lam[s] + ... + lam[t - 1]`` (0 where ``s >= t``), each a
    sum of exactly those terms (a reverse cumulative sum of the masked totals: no difference
    of long sums, so no cancellation)."""
    m = lam.shape[-1]
    t = xp.arange(m + 1, device=device)
    c = xp.arange(m, device=device)
    masked = lam[..., None, :] * xp.astype(c[None, :] < t[:, None], lam.dtype)  # (..., m + 1, m)
    rev = xp.flip(cumsum(xp.flip(masked, axis=-1), -1), axis=-1)
    return xp.concat([rev, xp.zeros_like(rev[..., :1])], axis=-1)


def block_causal(
    ch: Chunk,
    marks: Marks,
    carry: Carry | None,
    size: int,
    plan: Plan,
    xp: Namespace,
    device: Device,
    out_dtype: DType | None = None,
    *,
    strict: bool = False,
    divided: bool = True,
    chunks: Any = None,
    sized: bool = True,
    cumsum: CumSum | None = None,
) -> tuple[Any, Carry]:
    """Causal outputs of a block of ``T = m * size`` tokens (``ch``: sequence axis -2, a
    multiple of ``size``; ``marks``: axis -1) from ``carry`` (``None``: no earlier keys), and the
    carry after it.  All ``m`` chunks at once.  ``strict``: a query does not see its own key.
    ``divided=False``: the numerator and denominator (``None`` unnormalised) instead of their
    ratio.  ``chunks``: ``m`` where the caller knows it in a form a tracer can reason about;
    ``sized``: sizes are plain ints (else symbolic: no size is compared); ``cumsum``: the
    library's cumulative sum (default the namespace's)."""
    cs = _cumsum(xp, cumsum)
    assert ch.a is not None
    T = ch.a.shape[-2]
    cdt = ch.b.dtype
    plain = marks.g is None and marks.doc is None
    if T is None:  # an unknown length (ndonnx): chunks of one token, by a new axis
        if not plain:
            raise NotImplementedError(
                "decay, gates and documents need a known sequence length (this library's axis has none)"
            )
        m: Any = None
        a, c, b, e, v = (None if t is None else xp.expand_dims(t, axis=-2) for t in ch)
        size = 1
    else:
        m = T // size if chunks is None else chunks
        a, c, b, e, v = (_split(t, m, size, xp) for t in ch)
    assert a is not None and b is not None and v is not None
    g = _split_marks(marks.g, m, size, xp)
    doc = _split_marks(marks.doc, m, size, xp)
    tri = _tri(size, xp, device, cdt, strict)
    # -- weights inside a chunk: D_ij, of each chunk's keys at its end: wend_j ---------------
    D: Array = tri
    wend = None
    ell = None
    if g is not None:
        ell = cs(g, -1)  # (..., m, C), from the chunk's start, inclusive
        diff = ell[..., :, None] - ell[..., None, :]
        # (the upper triangle has ell_i - ell_j >= 0: clamped before exp, then multiplied by 0)
        D = xp.exp(xp.minimum(diff, xp.zeros_like(diff))) * tri
        wend = xp.exp(ell[..., -1:] - ell)
    if doc is not None:
        D = D * _same(doc, doc, cdt, xp)
        last = xp.astype(doc == doc[..., -1:], cdt)
        wend = last if wend is None else wend * last
    # -- intra-chunk outputs -------------------------------------------------------------------
    num = xp.matmul(xp.matmul(a, _t(b, xp)) * D, v)
    den = None
    if c is not None and e is not None:
        den = xp.sum(xp.matmul(c, _t(e, xp)) * D, axis=-1)
    # -- chunk states and the states at the chunk starts -----------------------------------------
    wb = b if wend is None else b * wend[..., None]
    Sc = xp.matmul(_t(wb, xp), v)  # (..., m, F, dv)
    zc = None
    if e is not None:
        zc = xp.sum(e if wend is None else e * wend[..., None], axis=-2)  # (..., m, F)
    F, dv = Sc.shape[-2], Sc.shape[-1]
    if carry is None:  # (zeros shaped like one chunk's state: sizes may be unknown, ndonnx)
        S0 = xp.zeros_like(Sc[..., 0, :, :])
        z0 = None if zc is None else xp.zeros_like(zc[..., 0, :])
        d0 = None if doc is None else doc[..., 0, 0]
    else:
        S0, z0, d0 = carry
        if doc is not None and d0 is None:
            d0 = doc[..., 0, 0]
    if plain and not (sized and isinstance(m, int) and m <= SMALL):
        # many chunks, or an unknown number: the states at the chunk starts are a cumulative sum
        return _plain_scan(a, c, b, e, v, Sc, zc, S0, z0, num, den, plan, xp, T, out_dtype, divided, cs)
    # W[t, s]: weight of source s (0: the carry, s >= 1: chunk s - 1) in the state at the start of
    # chunk t (t = m: after the block)
    assert m is not None
    W = _tri(m + 1, xp, device, cdt)
    wq = None  # weight of the chunk-start state at each query
    if not plain:
        if g is not None:
            assert ell is not None
            lsum = _range_sums(ell[..., -1], xp, device, cs)  # decay between the chunks
            W = W * xp.exp(xp.minimum(lsum, xp.zeros_like(lsum)))
            wq = xp.exp(ell)
        if doc is not None:
            assert d0 is not None
            ends = _stack_states(d0, doc[..., -1], -1, xp)  # (..., m + 1): doc before chunk t
            W = W * _same(ends, ends, cdt, xp)
            at = xp.astype(doc == ends[..., :-1, None], cdt)  # query in the doc before its chunk
            wq = at if wq is None else wq * at
    src = _stack_states(S0, Sc, -3, xp)  # (..., m + 1, F, dv)
    lead = src.shape[:-3]
    flat = xp.reshape(src, (*lead, m + 1, F * dv))
    lw = _lead_of(W, lead)
    if g is None:  # (the chunk starts' states and the state after the block as two products: the
        # first a whole array, which the queries' product reads without a copy of a slice)
        W_top, W_last = W[..., :-1, :], W[..., -1:, :]
        if doc is not None:  # (rows made apart, not slices of the masked W: XLA runs a product of a
            # slice of masks computed in the graph slowly; the last row of the triangle is all ones)
            W_top = _tri(m + 1, xp, device, cdt)[:-1, :] * _same(ends[..., :-1], ends, cdt, xp)
            W_last = _same(ends[..., -1:], ends, cdt, xp)
        P = xp.reshape(xp.matmul(W_top, flat), (*lw, m, F, dv))
        # (the size-1 axis dropped after the split: a reshape that drops it is refused on a sharded
        # JAX array)
        P_end = xp.reshape(xp.matmul(W_last, flat), (*lw, 1, F, dv))[..., 0, :, :]
    else:  # (one product: the decay between the chunks is computed in the graph, as above)
        P_all = xp.reshape(xp.matmul(W, flat), (*lw, m + 1, F, dv))
        P, P_end = P_all[..., :-1, :, :], P_all[..., -1, :, :]
    Pz = None
    if zc is not None and z0 is not None:
        zsrc = _stack_states(z0, zc, -2, xp)
        Pz = xp.matmul(W, zsrc)
    # -- inter-chunk outputs ---------------------------------------------------------------------
    inter = xp.matmul(a, P)
    num = num + (inter if wq is None else inter * wq[..., None])
    if den is not None:
        assert c is not None and Pz is not None
        dinter = xp.sum(c * Pz[..., :-1, None, :], axis=-1)
        den = den + (dinter if wq is None else dinter * wq)
    new_doc = None if doc is None else doc[..., -1, -1]
    after = Carry(P_end, None if Pz is None else Pz[..., -1, :], new_doc)
    return _finish(num, den, plan, xp, T, out_dtype, divided), after


#: Chunks of a part up to which the states at the chunk starts are one matrix product (a small
#: ``(m + 1) x (m + 1)`` constant); above, a cumulative sum (linear in ``m``, and shapes may be
#: symbolic).
SMALL = 64


def _plain_scan(
    a: Array,
    c: Array | None,
    b: Array,
    e: Array | None,
    v: Array,
    Sc: Array,
    zc: Array | None,
    S0: Array,
    z0: Array | None,
    num: Array,
    den: Array | None,
    plan: Plan,
    xp: Namespace,
    T: Any,
    out_dtype: DType | None,
    divided: bool,
    cumsum: CumSum,
) -> tuple[Any, Carry]:
    """:func:`block_causal` without decay or documents over many chunks: the exclusive
    cumulative sum of the chunk states (zero in front, the last dropped: shapes ``1 + m - 1``,
    symbolic-safe) from the carry."""
    S_incl = cumsum(Sc, -3)
    P = xp.concat([xp.zeros_like(S_incl[..., :1, :, :]), S_incl], axis=-3)
    P = P + xp.expand_dims(S0, axis=-3)
    num = num + xp.matmul(a, P[..., :-1, :, :])
    Pz = None
    if zc is not None and z0 is not None:
        z_incl = cumsum(zc, -2)
        Pz = xp.concat([xp.zeros_like(z_incl[..., :1, :]), z_incl], axis=-2) + xp.expand_dims(z0, axis=-2)
        assert den is not None and c is not None
        den = den + xp.sum(c * Pz[..., :-1, None, :], axis=-1)
    after = Carry(P[..., -1, :, :], None if Pz is None else Pz[..., -1, :], None)
    return _finish(num, den, plan, xp, T, out_dtype, divided), after


def _finish(
    num: Array, den: Array | None, plan: Plan, xp: Namespace, T: Any, out_dtype: DType | None, divided: bool
) -> Any:
    """Chunked ``(..., m, C, .)`` outputs as ``(..., T, .)``: divided, or ``(num, den)``."""
    if T is None:  # (chunks of one token along a new axis)
        if not divided:
            return xp.squeeze(num, axis=-2), None if den is None else xp.squeeze(den, axis=-1)
        out = xp.squeeze(divide(num, den, plan, xp), axis=-2)
    else:
        if not divided:
            num = xp.reshape(num, (*num.shape[:-3], T, num.shape[-1]))
            return num, None if den is None else xp.reshape(den, (*den.shape[:-2], T))
        out = divide(num, den, plan, xp)
        out = xp.reshape(out, (*out.shape[:-3], T, out.shape[-1]))
    if out_dtype is not None and out.dtype != out_dtype:
        out = xp.astype(out, out_dtype)
    return out


def _lead_of(W: Array, lead: tuple[Any, ...]) -> tuple[Any, ...]:
    """The leading axes of ``W @ flat`` (``W`` a constant ``(m + 1, m + 1)`` or per row)."""
    if W.ndim == 2:
        return tuple(lead)
    wl = tuple(W.shape[:-2])
    n = max(len(wl), len(lead))
    wl = (1,) * (n - len(wl)) + wl
    ll = (1,) * (n - len(lead)) + tuple(lead)
    return tuple(x if y == 1 else y for x, y in zip(wl, ll, strict=True))


class Source(NamedTuple):
    """Arrays with a sequence axis, cut into parts by :meth:`take`: ``arrays[i]`` has its
    sequence at axis ``axes[i]`` (negative), or is ``None``, or has size 1 there (broadcast
    along the sequence: passed whole)."""

    arrays: tuple[Array | None, ...]
    axes: tuple[int, ...]

    def sliced(self, i: int, n: Any) -> bool:
        """``arrays[i]`` runs along the sequence (``n`` tokens), so a part takes a slice of it."""
        x, ax = self.arrays[i], self.axes[i]
        return x is not None and x.ndim >= -ax and x.shape[ax] != 1

    def take(self, start: int, stop: int, n: Any) -> Source:
        """The part ``[start, stop)`` of the sequence."""
        out = []
        for i, (x, ax) in enumerate(zip(self.arrays, self.axes, strict=True)):
            if not self.sliced(i, n):
                out.append(x)
                continue
            assert x is not None
            index = (Ellipsis, slice(start, stop)) + (slice(None),) * (-ax - 1)
            out.append(x[index])
        return Source(tuple(out), self.axes)


def pad_part(
    ch: Chunk, marks: Marks, size: int, xp: Namespace, sized: bool = True
) -> tuple[Chunk, Marks, int, Any]:
    """Tokens appended to a whole number ``m`` of chunks of ``size``: zero features and values
    (they add nothing), no decay, the last document's id (no boundary); returns the padded
    chunk, marks, the real length and ``m``.  Padded tokens come last, so no real query sees
    them.  ``sized``: the length is a plain int (else symbolic: nothing compared)."""
    n = ch.b.shape[-2]
    m = (n + size - 1) // size  # (this form lets jax.export see m >= 1)
    pad = m * size - n
    if sized and isinstance(pad, int) and pad == 0:  # (a symbolic length pads always: no guard)
        return ch, marks, n, m

    def zeros(x: Array | None) -> Array | None:
        if x is None:
            return None
        z = xp.zeros((*x.shape[:-2], pad, x.shape[-1]), dtype=x.dtype, device=_dev(x))
        return xp.concat([x, z], axis=-2)

    g, doc = marks
    if g is not None:
        g = xp.concat([g, xp.zeros((*g.shape[:-1], pad), dtype=g.dtype, device=_dev(g))], axis=-1)
    if doc is not None:
        doc = xp.concat([doc, xp.broadcast_to(doc[..., -1:], (*doc.shape[:-1], pad))], axis=-1)
    return Chunk(*(zeros(t) for t in ch)), Marks(g, doc), n, m


def _dev(x: Array) -> Device:
    return getattr(x, "device", None)


def absorb(
    carry: Carry | None, ch: Chunk, marks: Marks, xp: Namespace, cumsum: CumSum | None = None
) -> Carry:
    """``carry`` followed by the keys of ``ch`` (no outputs): the state decayed over the block and
    the block's keys weighted by their decay to its end; a block that starts a new document
    forgets the carry."""
    st, total = block_state(ch, marks, xp, cumsum)
    doc = None if marks.doc is None else marks.doc[..., -1]
    if carry is None:
        return Carry(st.S, st.z, doc)
    keep = None
    if total is not None:
        keep = xp.exp(total)
    if marks.doc is not None:
        d0 = carry.doc if carry.doc is not None else marks.doc[..., 0]
        same = xp.astype(d0 == doc, st.S.dtype)
        keep = same if keep is None else keep * same
    S0, z0 = carry.S, carry.z
    if keep is not None:
        S0 = S0 * keep[..., None, None]
        z0 = None if z0 is None else z0 * keep[..., None]
    S = S0 + st.S
    z = None if z0 is None or st.z is None else z0 + st.z
    return Carry(S, z, doc)
