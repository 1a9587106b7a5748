"""The public functions: :func:`linear_attention`, :func:`linear_attention_state` (and the JAX eager path:
one compiled program per call).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, overload

from .._backends import Backend, backend_for
from .._lib import _validation as chk
from .._lib._cache import MISSING, fast_paths_enabled, memo_add, memo_get
from .._lib._compat import entry, is_array, namespace_of
from .._lib._typing import Array, FeatureMapName, RotaryEmbedding, Similarity
from .._math import _documents, _linear
from .._packing import documents, implied_positions, unnest
from .._rope import Rotary, default_rope, eager_positions
from ._args import (
    NO_EXTRAS,
    _as_array,
    _Call,
    _check_even,
    _check_offset,
    _check_rope_positions,
    _check_static,
    _eager_extras,
    _eager_gates,
    _Extras,
    _family,
    _gates,
    _jittable,
    _key_mask,
    _namespace,
    _plan,
    _sizes,
    _state_positions,
    _total,
    _width,
    _zero_carry,
)
from ._causal import _attend
from ._checks import _check_call, _check_keys, _Checked, _sig_args
from ._documents import _doc_offsets, _doc_states, _DocCtx, _row_log_decay, _row_offset
from ._families import _run_recurrent, _state_recurrent
from ._parts import _Parts, _tokens
from ._state import NOT_COMPUTED, LinearAttentionState, _add_log_decay, _state


@entry
def linear_attention_state(
    k: Array,
    v: Array,
    pos: Any = None,
    *,
    rope: RotaryEmbedding | None = None,
    feature_map: FeatureMapName | Callable[[Array], Array] | None = None,
    similarity: Similarity = "dot",
    key_mask: Array | None = None,
    decay: Any = None,
    log_gate: Any = None,
    normalize: bool = True,
    cu_seqlens: Any = None,
    segment_ids: Any = None,
    beta: Any = None,
    u: Any = None,
    a: Any = None,
    b: Any = None,
    qk_l2norm: bool = False,
    scale: float | None = None,
) -> LinearAttentionState:
    """The :class:`LinearAttentionState` of a block of keys and values.

    Same conventions as :func:`linear_attention` (``pos`` broadcasts to ``k.shape[:-1]``;
    ``decay`` and ``log_gate`` weight each key by its decay to the end of the block); costs
    ``O(M d d_v)`` and computes no outputs.  States of consecutive blocks combine (``+``).
    With ``cu_seqlens``, one state per document (``(..., n_docs, F, d_v)``); with
    ``segment_ids``, the state of each row's last document (its offset: that document's tokens;
    without ``pos``, a given ``rope`` rotates each document from 0, so a block whose first
    document goes on from an earlier block needs its ``pos`` to combine with that block's state).
    The recurrent families (``beta``, ``u``, ``a``/``b``, a ``log_gate`` per key feature; see
    :func:`linear_attention`) give their per-feature ``log_decay`` ``(..., F)``, or for the
    rank-one ones the block's ``transition`` ``(..., F, F)``: what ``+`` needs to put a block
    after another.

    Examples
    --------
    >>> import numpy as np, rotary
    >>> k = np.ones((2, 5, 8), dtype=np.float32)
    >>> v = np.ones((2, 5, 3), dtype=np.float32)
    >>> st = rotary.linear_attention_state(k, v, np.arange(5))
    >>> st.S.shape, st.z.shape, st.offset
    ((2, 8, 3), (2, 8), 5)
    """
    xp = _namespace(k=k, v_=v)
    be = backend_for(xp)
    extras = _Extras(beta, u, a, b)
    fam = _family(extras, log_gate, k, True, chk.check_bool(normalize, "normalize"), similarity)
    statics: tuple[Any, ...] = (rope, feature_map, similarity, normalize, qk_l2norm, scale)
    if (
        fam is not None
        and be.jit_eagerly()
        and _jittable(statics)
        and cu_seqlens is None
        and segment_ids is None
    ):
        statics = (*statics, fast_paths_enabled())
        p = eager_positions(be, pos, "pos", k, "k")
        dec, lg = _eager_gates(be, decay, log_gate, k, v)
        exs = _Extras(
            *(
                None if x is None else _as_array(x, n, xp, be, k)[0]
                for n, x in zip(_Extras._fields, extras, strict=True)
            )
        )
        S, z, ld, tr, _ = be.jit(_state_jit, (0,))(statics, k, v, p, key_mask, dec, lg, exs)
        return LinearAttentionState(S, z, k.shape[-2], ld, tr)
    if fam is not None:
        return _state_recurrent(
            be,
            k,
            v,
            pos,
            rope,
            feature_map,
            similarity,
            key_mask,
            decay,
            log_gate,
            normalize,
            cu_seqlens,
            segment_ids,
            extras,
            qk_l2norm,
            scale,
        )
    if be.jit_eagerly() and _jittable(statics):
        statics = (*statics, fast_paths_enabled())  # (read while tracing: part of the key)
        p = eager_positions(be, pos, "pos", k, "k")
        dec, lg = _eager_gates(be, decay, log_gate, k, v)
        cu = seg = None
        if cu_seqlens is not None or segment_ids is not None:  # (values checked here, traced inside)
            d = documents(be, k.shape[-2], cu_seqlens, segment_ids, k, "k")
            assert d is not None
            cu, seg = (d.cu, None) if d.cu is not None else (None, d.runs)
        S, z, ld, _, off = be.jit(_state_jit, (0,))(statics, k, v, p, key_mask, dec, lg, None, cu, seg)
        return LinearAttentionState(S, z, k.shape[-2] if off is None else off, ld)
    if cu_seqlens is not None or segment_ids is not None:
        # (the documents' own path: a state per document, or each row's last one)
        out_docs = _state_of_documents(
            be,
            k,
            v,
            pos,
            rope,
            feature_map,
            similarity,
            key_mask,
            decay,
            log_gate,
            normalize,
            cu_seqlens,
            segment_ids,
            qk_l2norm,
        )
        return out_docs
    plan, nonneg = _plan(feature_map, similarity, 0.0, normalize, k, None, be, qk_l2norm)
    kv_lead = chk.broadcast_shapes(tuple(k.shape[:-2]), tuple(v.shape[:-2]), names="k and v")
    F = _width(plan, k, xp)
    _check_even(pos, rope, F)
    r = default_rope(be, rope, pos, F)
    _check_static(r)
    _check_rope_positions(be, r, pos, None, None, k)
    dev = be.creation_device(k)
    p, rng = (None, None) if pos is None else be.positions(pos, name="pos", device=dev)
    mask = _key_mask(key_mask, k, xp)
    g = _gates(decay, log_gate, k, kv_lead, plan.cdt, be)
    n = k.shape[-2]
    size, part = _sizes(None, n, be)
    call = _Call(plan, r, True, size, part, 1, nonneg, not be.sizes_symbolic())
    parts = _Parts(call, be, dev, rng, rng, mask)
    axis = r.seq_axis if isinstance(r, Rotary) else -1
    src = _linear.Source((k, v, p, mask, g), (-2, -2, axis, -1, -1))
    if p is not None and not isinstance(r, Rotary) and r is not None:
        part = max(part, n)  # (a user's rotary embedding sees the whole sequence)

    def body(carry: Any, s: _linear.Source) -> tuple[Any, None]:
        kb, vb, pb, mb, gb = s.arrays
        b, e, vc = parts.keys(kb, vb, pb, mb)
        marks = _linear.Marks(_tokens(gb, b.shape[-2], xp), None)
        return _linear.absorb(carry, _linear.Chunk(None, None, b, e, vc), marks, xp, be.cumsum), None

    carry, _ = be.scan(body, None, src, n=n, block=part, additive=g is None)
    if carry is None:  # no keys
        carry = _zero_carry(plan, F, v, kv_lead, be, dev)
    ld = None if g is None else _total(g, n, xp)
    return _state(carry.S, carry.z, n, kv_lead, xp, ld)


def _state_of_documents(
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
    qk_l2norm: Any = False,
) -> LinearAttentionState:
    """:func:`linear_attention_state` of packed documents: the keys as queries of a causal call
    that computes no output worth keeping would cost a pass of queries; instead the documents'
    states directly (``cu_seqlens``), or the last document's through the causal carry."""
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
        None,
        qk_l2norm,
    )
    call, kv_lead, F, _ = checked
    plan = call.plan
    m = k.shape[-2]
    dev = be.creation_device(k)
    docs = documents(be, m, cu_seqlens, segment_ids, k, "k")
    assert docs is not None
    g = None if decay is None and log_gate is None else _gates(decay, log_gate, k, kv_lead, plan.cdt, be)
    if pos is None and call.rope is not None:
        pos = implied_positions(be, docs)
    kp, krng = (None, None) if pos is None else be.positions(pos, name="pos", device=dev)
    if docs.cu is not None:
        ctx = _DocCtx(docs.runs)
        return _doc_states(call, be, dev, k, v, kp, krng, key_mask, g, docs, ctx, kv_lead, F, 0, None)
    parts = _Parts(call, be, dev, krng, krng, key_mask)
    r = call.rope
    axis = r.seq_axis if isinstance(r, Rotary) else -1
    src = _linear.Source((k, v, kp, key_mask, g, docs.runs), (-2, -2, axis, -1, -1, -1))

    def body(carry: Any, s: _linear.Source) -> tuple[Any, None]:
        kb, vb, pb, mb, gb, rb = s.arrays
        b, e, vc = parts.keys(kb, vb, pb, mb)
        marks = _linear.Marks(_tokens(gb, b.shape[-2], xp), rb)
        return _linear.absorb(carry, _linear.Chunk(None, None, b, e, vc), marks, xp, be.cumsum), None

    carry = None if m == 0 else be.scan(body, None, src, n=m, block=call.part)[0]
    if carry is None:  # no key
        carry = _zero_carry(plan, F, v, kv_lead, be, dev)
    ld = _row_log_decay(docs.runs, g, m, xp, plan.cdt)
    return _state(carry.S, carry.z, _row_offset(docs.runs, 0, m, xp), kv_lead, xp, ld)


# The return type follows ``return_state`` (an array, or the array and the state), so that
# callers' type checkers see an array where they index or compute the result.
@overload
def linear_attention(
    q: Array,
    k: Array,
    v: Array,
    pos: Any = None,
    *,
    rope: RotaryEmbedding | None = None,
    k_pos: Any = None,
    causal: bool = False,
    feature_map: FeatureMapName | Callable[[Array], Array] | None = None,
    similarity: Similarity = "dot",
    eps: float = 0.0,
    chunk_size: int | None = None,
    state: LinearAttentionState | None = None,
    return_state: Literal[False] = False,
    key_mask: Array | None = None,
    decay: Any = None,
    log_gate: Any = None,
    normalize: bool = True,
    cu_seqlens: Any = None,
    segment_ids: Any = None,
    beta: Any = None,
    u: Any = None,
    a: Any = None,
    b: Any = None,
    qk_l2norm: bool = False,
    scale: float | None = None,
) -> Array: ...


@overload
def linear_attention(
    q: Array,
    k: Array,
    v: Array,
    pos: Any = None,
    *,
    rope: RotaryEmbedding | None = None,
    k_pos: Any = None,
    causal: bool = False,
    feature_map: FeatureMapName | Callable[[Array], Array] | None = None,
    similarity: Similarity = "dot",
    eps: float = 0.0,
    chunk_size: int | None = None,
    state: LinearAttentionState | None = None,
    return_state: Literal[True],
    key_mask: Array | None = None,
    decay: Any = None,
    log_gate: Any = None,
    normalize: bool = True,
    cu_seqlens: Any = None,
    segment_ids: Any = None,
    beta: Any = None,
    u: Any = None,
    a: Any = None,
    b: Any = None,
    qk_l2norm: bool = False,
    scale: float | None = None,
) -> tuple[Array, LinearAttentionState]: ...


@overload
def linear_attention(
    q: Array,
    k: Array,
    v: Array,
    pos: Any = None,
    *,
    rope: RotaryEmbedding | None = None,
    k_pos: Any = None,
    causal: bool = False,
    feature_map: FeatureMapName | Callable[[Array], Array] | None = None,
    similarity: Similarity = "dot",
    eps: float = 0.0,
    chunk_size: int | None = None,
    state: LinearAttentionState | None = None,
    return_state: bool,
    key_mask: Array | None = None,
    decay: Any = None,
    log_gate: Any = None,
    normalize: bool = True,
    cu_seqlens: Any = None,
    segment_ids: Any = None,
    beta: Any = None,
    u: Any = None,
    a: Any = None,
    b: Any = None,
    qk_l2norm: bool = False,
    scale: float | None = None,
) -> Array | tuple[Array, LinearAttentionState]: ...


@entry
def linear_attention(
    q: Array,
    k: Array,
    v: Array,
    pos: Any = None,
    *,
    rope: RotaryEmbedding | None = None,
    k_pos: Any = None,
    causal: bool = False,
    feature_map: FeatureMapName | Callable[[Array], Array] | None = None,
    similarity: Similarity = "dot",
    eps: float = 0.0,
    chunk_size: int | None = None,
    state: LinearAttentionState | None = None,
    return_state: bool = False,
    key_mask: Array | None = None,
    decay: Any = None,
    log_gate: Any = None,
    normalize: bool = True,
    cu_seqlens: Any = None,
    segment_ids: Any = None,
    beta: Any = None,
    u: Any = None,
    a: Any = None,
    b: Any = None,
    qk_l2norm: bool = False,
    scale: float | None = None,
) -> Array | tuple[Array, LinearAttentionState]:
    """RoFormer linear attention with RoPE on the features (equation 19 of the paper), with the
    field's decay and gates.

    Parameters
    ----------
    q, k : array
        Queries ``(..., N, d)`` and keys ``(..., M, d)``, real floating, same dtype.
    v : array
        Values ``(..., M, d_v)``.  Leading axes of ``q``, ``k``, ``v`` broadcast; or
        grouped-query heads: ``k`` and ``v`` with ``H / g`` heads (axis -3) for ``q``'s ``H``,
        each key/value head serving ``g`` consecutive query heads (never repeated in memory;
        the state has the keys' heads).
    pos : array or int or sequence, optional
        Positions, broadcast to ``q.shape[:-1]`` (and ``k.shape[:-1]`` unless ``k_pos`` is
        given).  ``None`` (default): plain linear attention, no rotation; with ``rope`` and
        ``state``, the tokens follow the state's keys: positions ``state.offset,
        state.offset + 1, ...`` (decoding without counting positions).
    rope : RoPE or AxialRoPE or MRoPE, optional
        The rotary embedding of the features (default ``RoPE(F)`` when ``pos`` is given;
        static scalings only).  Its ``head_dim`` must be the feature width ``F``.
    k_pos : optional
        Key positions (non-causal cross-attention), default ``pos``.
    causal : bool
        Query ``i`` sees keys ``j <= i`` (needs ``N == M``) plus the keys in ``state``.
    feature_map : {"elu+1", "relu", "softplus", "identity"} or callable, optional
        ``phi``, applied to ``q`` and ``k`` in float32 or better.  Default ``"elu+1"``;
        ``"identity"`` for ``similarity="cosine"`` or ``normalize=False`` (refused with a
        normalised ``"dot"``: its denominators can be negative).  A callable maps ``(..., d)``
        to ``(..., F)`` features (``F`` even for RoPE); normalised with ``similarity="dot"``
        they must be non-negative (checked where the values are concrete).
    similarity : {"dot", "cosine"}
        ``"dot"``: ``phi(q)^T phi(k)``, RoPE in the numerator only.  ``"cosine"``:
        ``1 + cos(phi(q), phi(k))`` with RoPE in numerator and denominator (rotation keeps
        norms); zero vectors have cosine 0.
    eps : float
        A floor of the denominator, relative to the query features' scale (the denominator
        is that of query features scaled to a largest feature of 1).  Default 0: no floor; a
        denominator of exactly 0 (features that are all 0, padding only) gives output 0.
    chunk_size : int, optional
        Chunk length ``C`` of the causal algorithm (default ``min(N, 64)``).  Does not
        change results beyond rounding.
    state : LinearAttentionState, optional
        Keys/values that precede these (decoding, or chunked processing): arrays of the
        same library, shaped exactly for these keys and values.
    return_state : bool
        Also return the state after these keys: ``state + state(k, v)``.
    key_mask : bool array, optional
        Broadcasts to ``k.shape[:-1]``; ``False`` marks padding, whose features and values
        are replaced by zeros (nothing of it leaks, even NaN or inf).
    decay : float or array, optional
        A decay per step in ``(0, 1]`` for each key head (RetNet's ``gamma``): broadcasts to
        ``k.shape[:-2]``.  Key ``j`` counts ``decay ** (i - j)`` at query ``i``.
    log_gate : array, optional
        Per-token log-gates ``log a_t <= 0`` (GLA's scalar form ``log sigmoid``, Mamba-2's
        ``dt * A``), broadcast to ``k.shape[:-1]``: key ``j`` counts ``exp(g_{j+1} + ... +
        g_i)`` at query ``i``.  Multiplies with ``decay``.  Non-causal: each query sees keys on
        both sides, weighted by the gates between them (``decay ** |i - j|``).
    normalize : bool
        ``True`` (default): divide by the denominator (RoFormer).  ``False``: no denominator
        (fla's ``normalize=False``; RetNet, GLA, Mamba-2); RoPE still rotates q and k.
    cu_seqlens : array or sequence of int, optional
        Packed documents along the sequence axis (``(n_docs + 1,)``: 0, then the running total
        of the document lengths, ending at ``N``): no query sees a key of another document.
        States are per document: ``state=`` holds one per document (``(..., n_docs, F, d_v)``,
        its ``offset`` one per document or one for all), ``return_state`` gives each
        document's final state.  Without ``pos``, a given ``rope`` rotates each document from
        position 0 (from its state's offset).
    segment_ids : array, optional
        The same by per-token ids ``(..., N)`` (a change of id starts a document; fixed shapes:
        any packing of the same length is one compiled graph).  ``state=`` continues each row's
        first document (without ``pos``, from the state's offset); ``return_state`` gives each
        row's last document's state (its ``offset`` the position in that document, one per row:
        a packed stream goes on window by window or token by token; its ``log_decay`` ``-inf``
        where the row held a boundary: it combines with nothing before).
    beta : array, optional
        The delta rule (``causal=True, normalize=False``), one per key ``(..., N)``:
        ``S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T`` (DeltaNet; Gated
        DeltaNet with a ``log_gate`` per token, Kimi Delta Attention with one per key feature).
    u : array, optional
        RWKV-6's bonus ``(..., F)`` per key head: ``o_t = S_{t-1}^T q_t + (q_t . (u * k_t)) v_t``.
    a, b : array, optional
        A rank-one term of the transition, ``(..., N, F)`` each: ``S_t = (D_t + b_t a_t^T)
        S_{t-1} + k_t v_t^T`` (RWKV-7, fla's ``dplr``).  A ``log_gate`` with as many axes as
        ``k`` is a gate per token and key feature ``(..., N, F)``: ``D_t = diag(exp(g_t))``.
    qk_l2norm : bool
        Divide q and k features by ``sqrt(|f|^2 + 1e-6)`` (transformers'
        ``use_qk_l2norm_in_kernel``).
    scale : float, optional
        Multiply the query features by it (after ``qk_l2norm``; Gated DeltaNet and KDA use
        ``head_dim ** -0.5``).  Default 1.

    Returns
    -------
    out : array
        ``(..., N, d_v)`` in the input dtype; with ``return_state``, ``(out, state)``.

    Examples
    --------
    >>> import numpy as np, rotary
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = (rng.normal(size=(2, 4, 16, 8)).astype(np.float32) for _ in range(3))
    >>> out = rotary.linear_attention(q, k, v, np.arange(16), causal=True, chunk_size=4)
    >>> out.shape, out.dtype
    ((2, 4, 16, 8), dtype('float32'))

    Decoding token by token gives the same outputs:

    >>> outs, st = [], None
    >>> for t in range(16):
    ...     o, st = rotary.linear_attention(q[..., t:t+1, :], k[..., t:t+1, :], v[..., t:t+1, :],
    ...                                      [t], causal=True, state=st, return_state=True)
    ...     outs.append(o)
    >>> bool(np.allclose(np.concatenate(outs, axis=-2), out, atol=1e-5)), st.offset
    (True, 16)

    RetNet's decay, no denominator:

    >>> out = rotary.linear_attention(q, k, v, np.arange(16), causal=True, decay=0.9, normalize=False)

    Gated DeltaNet (Qwen3-Next's layer): a log-decay and a ``beta`` per token, unit q and k:

    >>> g, beta = -rng.uniform(0, 0.1, (2, 4, 16)), rng.uniform(0, 1, (2, 4, 16))
    >>> out = rotary.linear_attention(q, k, v, causal=True, normalize=False, log_gate=g, beta=beta,
    ...                               qk_l2norm=True, scale=8 ** -0.5)
    >>> out.shape
    (2, 4, 16, 8)
    """
    xp = namespace_of(q, k, v, names=("q", "k", "v"))
    be = backend_for(xp)
    nested = unnest(be, q, k, v, pos)
    if nested is not None:  # nested q, k, v: their values, the documents their offsets
        if cu_seqlens is not None or segment_ids is not None or k_pos is not None:
            raise ValueError(
                "nested q, k and v carry their documents: pass no cu_seqlens=, segment_ids= or k_pos="
            )
        res = linear_attention(
            nested.q,
            nested.k,
            nested.v,
            nested.pos,
            rope=rope,
            causal=causal,
            feature_map=feature_map,
            similarity=similarity,
            eps=eps,
            chunk_size=chunk_size,
            state=state,
            return_state=return_state,
            key_mask=key_mask,
            decay=decay,
            log_gate=log_gate,
            normalize=normalize,
            cu_seqlens=nested.offsets,
            beta=beta,
            u=u,
            a=a,
            b=b,
            qk_l2norm=qk_l2norm,
            scale=scale,
        )
        return (nested.wrap(res[0]), res[1]) if isinstance(res, tuple) else nested.wrap(res)
    extras = _Extras(beta, u, a, b)
    if pos is None and rope is not None and state is not None and k_pos is None:
        pos = _state_positions(be, state, q, k, cu_seqlens is not None or segment_ids is not None)
    statics: tuple[Any, ...] = (
        rope,
        causal,
        feature_map,
        similarity,
        eps,
        chunk_size,
        normalize,
        qk_l2norm,
        scale,
    )
    if be.jit_eagerly() and _jittable(statics):
        statics = (
            *statics,
            bool(return_state),
            fast_paths_enabled(),
        )  # (read while tracing: part of the key)
        # JAX outside a trace: positions checked here, then the whole call as one compiled
        # program (no Python scalar moves to the device)
        p = eager_positions(be, pos, "pos", q, "q")
        kp = eager_positions(be, k_pos, "k_pos", k, "k")
        dec, lg = _eager_gates(be, decay, log_gate, k, v)
        exs = _eager_extras(extras, be, k)
        if cu_seqlens is not None or segment_ids is not None:  # (values checked here, traced inside)
            d = documents(be, q.shape[-2], cu_seqlens, segment_ids, q)
            assert d is not None
            cu_seqlens = d.cu if d.cu is not None else None
            segment_ids = d.runs if d.cu is None else None
        S0 = z0 = ld0 = None
        off0: Any = 0
        if state is not None:
            if not isinstance(state, tuple) or len(state) not in (3, 4, 5):
                raise TypeError(
                    f"state must be a LinearAttentionState(S, z, offset), got {type(state).__name__}"
                )
            S0, z0, off0 = state[:3]
            ld0 = state[3] if len(state) >= 4 else None
            _check_offset(off0, cu_seqlens is not None, segment_ids is not None)
        _namespace(q, k=k, v_=v)
        # where documents continue: an array traced, a Python int a constant of the program
        has_docs = cu_seqlens is not None or segment_ids is not None
        doc_off = off0 if has_docs and is_array(off0) else None
        statics = (*statics, off0 if has_docs and not is_array(off0) else 0)
        out, S, z, ld, off = be.jit(_linear_jit, (0,))(
            statics, q, k, v, p, kp, key_mask, S0, z0, ld0, dec, lg, cu_seqlens, segment_ids, doc_off, exs
        )
        if not chk.check_bool(return_state, "return_state"):
            return out
        tr = NOT_COMPUTED if beta is not None or a is not None else None
        return out, LinearAttentionState(S, z, off if off is not None else off0 + k.shape[-2], ld, tr)
    args, kinds = _sig_args(pos, k_pos, state, key_mask, decay, log_gate, cu_seqlens, segment_ids, extras)
    sig = be.signature(q, k, v, *args)
    key = None if sig is None else ("linear_attention", statics, return_state, kinds, sig)
    checked = MISSING if key is None else memo_get(key)
    if checked is None:  # (checked before, but plans are off: the checks' findings are not kept)
        checked = MISSING
        key = None
    if checked is not MISSING and checked.decode is not None and checked.call.fam is not None:
        # a decoding step of a recurrent family: values checked, then a few kernels
        res_f = checked.decode(q, k, v, pos, state, decay, log_gate, extras)
        if res_f is not None:
            return res_f if return_state else res_f[0]
    elif (
        checked is not MISSING
        and checked.decode is not None
        and state is not None
        and (len(state) == 3 or state[3] is None)
    ):
        res = checked.decode(q, k, v, pos, state[0], state[1])
        if res is not None:  # (positions outside the shortcut's table: the generic steps)
            _check_offset(state[2])
            out, S, z = res
            return (out, LinearAttentionState(S, z, state[2] + 1)) if return_state else out
    if checked is MISSING:
        _namespace(q, k=k, v_=v)
        checked = _check_call(
            be,
            q,
            k,
            v,
            pos,
            k_pos,
            causal,
            feature_map,
            similarity,
            eps,
            chunk_size,
            state,
            return_state,
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
        if key is not None:
            memo_add(key, checked)
    return _run(
        checked,
        be,
        q,
        k,
        v,
        pos,
        k_pos,
        state,
        key_mask,
        decay,
        log_gate,
        return_state,
        cu_seqlens,
        segment_ids,
        extras,
    )


def _run(
    checked: _Checked,
    be: Backend,
    q: Array,
    k: Array,
    v: Array,
    pos: Any,
    k_pos: Any,
    state: Any,
    key_mask: Any,
    decay: Any,
    log_gate: Any,
    return_state: bool,
    cu_seqlens: Any = None,
    segment_ids: Any = None,
    extras: _Extras | None = None,
) -> Array | tuple[Array, LinearAttentionState]:
    """A checked call: positions, gates and documents read (their values checked), then the
    attention."""
    xp = be.xp
    call, kv_lead, F, _ = checked
    if call.fam is not None:
        return _run_recurrent(
            checked,
            be,
            q,
            k,
            v,
            pos,
            state,
            key_mask,
            decay,
            log_gate,
            return_state,
            cu_seqlens,
            segment_ids,
            extras,
        )
    plan = call.plan
    m = k.shape[-2]
    dev = be.creation_device(k)
    docs = documents(be, m, cu_seqlens, segment_ids, k, "k")
    per_doc = docs is not None and docs.cu is not None
    g = None if decay is None and log_gate is None else _gates(decay, log_gate, k, kv_lead, plan.cdt, be)
    init: _linear.Carry | None = None
    off0: Any = 0
    ld0 = None
    S0 = z0 = None
    if state is not None:
        S0, z0, off0 = state[:3]
        _check_offset(off0, per_doc, docs is not None and not per_doc)
        ld0 = state[3] if len(state) >= 4 else None
        if S0.dtype != plan.cdt:
            S0 = xp.astype(S0, plan.cdt)
            z0 = None if z0 is None else xp.astype(z0, plan.cdt)
        if not per_doc:
            init = _linear.Carry(S0, z0, None)
    if docs is not None and pos is None and call.rope is not None:  # each document from 0
        offs = None  # (or, continuing a state, the continued documents from its offset)
        if state is not None and not (type(off0) is int and off0 == 0):
            offs = _doc_offsets(be, off0, docs, dev) if per_doc else off0
        pos = implied_positions(be, docs, offs)
    p, rng = (None, None) if pos is None else be.positions(pos, name="pos", device=dev)
    kp, krng = (p, rng) if k_pos is None else be.positions(k_pos, name="k_pos", device=dev)
    ctx = None
    if docs is not None:
        G = None
        if g is not None and per_doc:
            G = _documents.segmented_cumsum(_tokens(g, m, xp), docs.runs, xp)
        ctx = _DocCtx(docs.runs, S0 if per_doc else None, z0 if per_doc else None, G)
    out, carry = _attend(call, be, dev, q, k, v, p, kp, rng, krng, key_mask, g, init, kv_lead, F, ctx)
    if not return_state:
        return out
    if per_doc:
        assert docs is not None and ctx is not None
        return out, _doc_states(call, be, dev, k, v, kp, krng, key_mask, g, docs, ctx, kv_lead, F, off0, ld0)
    if carry is None:
        carry = _zero_carry(plan, F, v, kv_lead, be, dev)
    S, z = carry.S, carry.z
    if call.groups > 1:  # (the caller's: not a view of the groups' buffer)
        S = be.owned(S[..., 0, :, :])
        z = None if z is None else be.owned(z[..., 0, :])
    ld = None if g is None else _total(g, m, xp)
    if docs is not None:  # a row whose documents changed forgets what came before
        ld = _row_log_decay(docs.runs, g, m, xp, plan.cdt)
        return out, _state(S, z, _row_offset(docs.runs, off0, m, xp), kv_lead, xp, ld)
    return out, _state(S, z, off0 + m, kv_lead, xp, _add_log_decay(ld0, ld))


def _linear_jit(
    statics: tuple[Any, ...],
    q: Array,
    k: Array,
    v: Array,
    p: Any,
    kp: Any,
    mask: Any,
    S0: Any,
    z0: Any,
    ld0: Any,
    decay: Any,
    log_gate: Any,
    cu_seqlens: Any,
    segment_ids: Any,
    offsets: Any,
    extras: Any = None,
) -> tuple[Array, Array, Array, Any, Any]:
    (
        rope,
        causal,
        feature_map,
        similarity,
        eps,
        chunk_size,
        normalize,
        qk_l2norm,
        scale,
        want_state,
        _,
        off0,
    ) = statics
    ex = NO_EXTRAS if extras is None else extras
    state = None if S0 is None else LinearAttentionState(S0, z0, off0 if offsets is None else offsets, ld0)
    res = linear_attention(
        q,
        k,
        v,
        p,
        rope=rope,
        k_pos=kp,
        causal=causal,
        feature_map=feature_map,
        similarity=similarity,
        eps=eps,
        chunk_size=chunk_size,
        state=state,
        return_state=want_state,
        key_mask=mask,
        decay=decay,
        log_gate=log_gate,
        normalize=normalize,
        cu_seqlens=cu_seqlens,
        segment_ids=segment_ids,
        beta=ex.beta,
        u=ex.u,
        a=ex.a,
        b=ex.b,
        qk_l2norm=qk_l2norm,
        scale=scale,
    )
    if not want_state:
        return res, None, None, None, None
    out, st = res
    has_docs = cu_seqlens is not None or segment_ids is not None
    return out, st.S, st.z, st.log_decay, st.offset if has_docs else None


def _state_jit(
    statics: tuple[Any, ...],
    k: Array,
    v: Array,
    p: Any,
    mask: Any,
    decay: Any,
    log_gate: Any,
    extras: Any,
    cu_seqlens: Any = None,
    segment_ids: Any = None,
) -> tuple[Array, Array, Any, Any, Any]:
    rope, feature_map, similarity, normalize, qk_l2norm, scale, _ = statics
    ex = NO_EXTRAS if extras is None else extras
    st = linear_attention_state(
        k,
        v,
        p,
        rope=rope,
        feature_map=feature_map,
        similarity=similarity,
        key_mask=mask,
        decay=decay,
        log_gate=log_gate,
        normalize=normalize,
        qk_l2norm=qk_l2norm,
        scale=scale,
        beta=ex.beta,
        u=ex.u,
        a=ex.a,
        b=ex.b,
        cu_seqlens=cu_seqlens,
        segment_ids=segment_ids,
    )
    has_docs = cu_seqlens is not None or segment_ids is not None
    return st.S, st.z, st.log_decay, st.transition, st.offset if has_docs else None
