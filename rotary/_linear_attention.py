"""RoFormer linear attention with RoPE (paper eq. 19), its state, and their algebra.

With ``similarity="dot"``::

    out_i = sum_j [R_i phi(q_i)]^T [R_j phi(k_j)] v_j / max(sum_j phi(q_i)^T phi(k_j), eps)

RoPE rotates the features in the numerator only; the denominator stays unrotated (and
positive).  With ``similarity="cosine"`` the similarity is ``1 + (R_i q^)^T (R_j k^)`` (unit
vectors, zero vectors map to 0) in numerator and denominator.

The state ``(S, z, offset)``: ``S = sum_j b_j v_j^T`` over the numerator key features ``b_j``
(rotated ``phi(k_j)``), ``z = sum_j e_j`` over the denominator ones (unrotated); their width
``F`` is ``d``, or ``d + 1`` for ``"cosine"`` (a constant feature carries the ``1 +``); float32,
or float64 for float64 inputs.  States of disjoint key sets add (the zero state is the
identity), so per-chunk states, their exclusive prefix sums and ``causal=True, state=prefix``
per chunk give the rows of one call on the whole sequence.  A given state always means "keys
before these ones, all visible".

Non-causal: the key-value summary, ``O(N d d_v)``.  Causal: chunks of ``C = chunk_size``
tokens, a masked quadratic form inside a chunk plus the prefix state before it, ``O(N C d + N d
d_v)``.  The prefix sum is the backend's ``causal_scan``: a loop writing into one output
(NumPy, torch, CuPy, array-api-strict: one chunk of working memory), ``lax.scan`` (JAX), one
cumulative sum over all chunks (``torch.compile``: one graph for every length), a scan over
blocks (Dask).  Running sums in float32 or better; the output in the input dtype.
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Callable
from typing import Any, Literal, NamedTuple, overload

from ._backends import Backend, backend_for
from ._lib import _validation as chk
from ._lib._cache import fast_paths_enabled
from ._lib._compat import array_namespace, is_array, library_name, not_an_array
from ._lib._typing import Array, Device, DType, FeatureMapName, Namespace, RotaryEmbedding, Similarity
from ._math import _linear
from ._math._groups import merge_heads, split_heads
from ._rope import default_rope, eager_positions

__all__ = ["FEATURE_MAPS", "LinearAttentionState", "combine", "linear_attention", "linear_attention_state"]

FEATURE_MAPS = _linear.FEATURE_MAPS
_SIMILARITIES: tuple[Similarity, ...] = ("dot", "cosine")


class LinearAttentionState(NamedTuple):
    """Summary of the keys/values seen so far (see :mod:`rotary` linear attention).

    ``S``: ``(..., F, d_v)``, ``z``: ``(..., F)``, ``offset``: keys absorbed.  States of
    disjoint key sets add: ``state_a + state_b`` (same library, shapes and dtypes).

    Examples
    --------
    >>> import numpy as np, rotary
    >>> rng = np.random.default_rng(0)
    >>> k, v = rng.normal(size=(2, 6, 8)), rng.normal(size=(2, 6, 4))
    >>> pos = np.arange(6)
    >>> a = rotary.linear_attention_state(k[:, :4], v[:, :4], pos[:4])
    >>> b = rotary.linear_attention_state(k[:, 4:], v[:, 4:], pos[4:])
    >>> whole = rotary.linear_attention_state(k, v, pos)
    >>> bool(np.allclose((a + b).S, whole.S)), (a + b).offset
    (True, 6)
    """

    S: Array
    z: Array
    offset: Any = 0

    def __add__(self, other: Any) -> LinearAttentionState:
        if not isinstance(other, LinearAttentionState):
            return NotImplemented
        _check_compatible(self, other)
        return LinearAttentionState(self.S + other.S, self.z + other.z, self.offset + other.offset)

    def __radd__(self, other: Any) -> LinearAttentionState:
        if isinstance(other, int) and not isinstance(other, bool) and other == 0:
            return self  # lets ``sum(states)`` work
        return NotImplemented

    def zeros_like(self) -> LinearAttentionState:
        """The identity of ``+``: zero sums, offset 0."""
        return LinearAttentionState(self.S * 0, self.z * 0, 0)


def _check_compatible(a: LinearAttentionState, b: LinearAttentionState) -> None:
    for name in ("S", "z"):
        x, y = getattr(a, name), getattr(b, name)
        if not (is_array(x) and is_array(y)):
            raise TypeError(f"state.{name} must be arrays to combine states")
        lx, ly = library_name(array_namespace(x)), library_name(array_namespace(y))
        if lx != ly:
            raise TypeError(f"cannot combine a {lx} state with a {ly} state; convert one of them first")
        if tuple(x.shape) != tuple(y.shape):
            raise ValueError(
                f"cannot combine states of different shapes: state.{name} {tuple(x.shape)} and "
                f"{tuple(y.shape)} (different heads, feature map, similarity or value width)"
            )


def combine(*states: LinearAttentionState) -> LinearAttentionState:
    """Sum the states of disjoint key sets (the state of their union).

    Examples
    --------
    >>> import numpy as np, rotary
    >>> s = rotary.linear_attention_state(np.ones((3, 4)), np.ones((3, 2)), np.arange(3))
    >>> rotary.combine(s, s, s).offset
    9
    """
    if not states:
        raise ValueError("combine needs at least one state")
    for i, s in enumerate(states):
        if not isinstance(s, LinearAttentionState):
            raise TypeError(f"states[{i}] must be a LinearAttentionState, got {type(s).__name__}")
    return sum(states[1:], states[0])


# -- arguments ---------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class _UserMap:
    """A user callable ``phi(x)`` as ``phi(x, xp)``; equal when the callable is (jit cache key)."""

    fn: Callable[[Array], Array]

    def __call__(self, x: Array, xp: Namespace) -> Array:
        out = self.fn(x)
        if not is_array(out):
            raise not_an_array("feature_map", out, verb="return")
        return out


def _phi(feature_map: Any, similarity: Similarity) -> tuple[Callable[[Array, Namespace], Array], bool]:
    """``(phi, nonnegative)``: the feature map and whether its features are never negative."""
    if feature_map is None:
        feature_map = "identity" if similarity == "cosine" else "elu+1"
    if isinstance(feature_map, str):
        if feature_map not in FEATURE_MAPS:
            raise ValueError(
                f"feature_map must be one of {sorted(FEATURE_MAPS)} or a callable, got {feature_map!r}"
            )
        if feature_map == "identity" and similarity == "dot":
            raise ValueError(
                "feature_map='identity' with similarity='dot' gives negative denominators (features "
                "of either sign), so outputs blow up where the denominator is clamped to eps; use a "
                "non-negative map ('elu+1', 'relu', 'softplus') or similarity='cosine'"
            )
        return FEATURE_MAPS[feature_map], feature_map in _linear.NONNEGATIVE_MAPS
    if callable(feature_map):
        return _UserMap(feature_map), False  # (equal maps give equal jit cache keys)
    raise TypeError(f"feature_map must be a name or a callable, got {type(feature_map).__name__}")


def _key_mask(key_mask: Any, k: Array, xp: Namespace) -> Array | None:
    if key_mask is None:
        return None
    if not is_array(key_mask) or library_name(array_namespace(key_mask)) != library_name(xp):
        raise TypeError(f"key_mask must be a boolean array of k's library, got {type(key_mask).__name__}")
    if not xp.isdtype(key_mask.dtype, "bool"):
        raise TypeError(
            "key_mask must be boolean (True = a real key, False = padding), "
            f"got {chk.dtype_name(key_mask.dtype)}"
        )
    if not chk.broadcasts_to(tuple(key_mask.shape), tuple(k.shape[:-1])):
        raise ValueError(
            f"key_mask of shape {tuple(key_mask.shape)} does not broadcast to k.shape[:-1] = "
            f"{tuple(k.shape[:-1])} (one flag per key)"
        )
    return key_mask


def _state_arrays(
    state: Any, xp: Namespace, want_S: tuple[Any, ...], want_z: tuple[Any, ...]
) -> tuple[Array, Array, Any]:
    if not isinstance(state, tuple) or len(state) != 3:
        raise TypeError(f"state must be a LinearAttentionState(S, z, offset), got {type(state).__name__}")
    S, z, offset = state
    for name, a, want in (("state.S", S, want_S), ("state.z", z, want_z)):
        if not is_array(a):
            raise not_an_array(name, a)
        if library_name(array_namespace(a)) != library_name(xp):
            raise TypeError(
                f"{name} is a {type(a).__module__}.{type(a).__name__} but q, k, v are "
                f"{library_name(xp)} arrays"
            )
        if not chk.is_floating(a.dtype):
            raise TypeError(f"{name} must be floating, got {chk.dtype_name(a.dtype)}")
        if a.dtype != S.dtype:
            raise TypeError(
                f"state.S and state.z must share a dtype, got {chk.dtype_name(S.dtype)} and "
                f"{chk.dtype_name(a.dtype)}"
            )
        if tuple(a.shape) != want:
            raise ValueError(
                f"{name} has shape {tuple(a.shape)} but these keys/values need {want} (leading axes, "
                "feature dim F, d_v); the state comes from inputs of a different shape, feature map or "
                "similarity"
            )
    _check_offset(offset)
    return S, z, offset


def _check_offset(offset: Any) -> None:
    if isinstance(offset, bool) or not (
        isinstance(offset, numbers.Integral)
        or (is_array(offset) and offset.ndim == 0 and chk.is_integral(offset.dtype))
    ):
        raise TypeError(
            "state.offset must be an integer (or a 0-d integer array), "
            f"got {type(offset).__name__} {offset!r}"
        )


def _prepare(
    q: Array | None,
    k: Array,
    v_: Array,
    pos: Any,
    k_pos: Any,
    rope: Any,
    feature_map: Any,
    similarity: Any,
    eps: float,
    key_mask: Any,
    sdt: DType,
    xp: Namespace,
) -> tuple[_linear.Chunk, _linear.Plan]:
    """Features (rotated where asked), masked keys/values, in the compute dtype."""
    be = backend_for(xp)
    similarity = chk.check_choice(similarity, "similarity", _SIMILARITIES)
    phi, nonneg = _phi(feature_map, similarity)
    cdt = be.compute_dtype(k.dtype)
    if sdt is not None and chk.dtype_name(sdt) == "float64" and hasattr(xp, "float64"):
        cdt = xp.float64
    plan = _linear.Plan(phi, similarity == "cosine", float(eps), cdt)
    fk = _linear.features(k, plan, xp)
    fq = None if q is None else _linear.features(q, plan, xp)
    width = fk.shape[-1]
    if fq is not None and fq.shape[-1] != width:
        raise ValueError(f"feature_map gives {fq.shape[-1]} features for q but {width} for k")
    if not nonneg and not plan.cosine:
        _check_nonnegative(be, [("phi(k)", fk), ("phi(q)", fq)])
    if pos is not None and rope is None and width % 2:
        raise ValueError(f"feature_map gives {width} features; RoPE rotates them in pairs (an even number)")
    r = default_rope(be, rope, pos, width, k_pos)
    if r is not None and not getattr(r, "static", True):
        raise ValueError(
            "rope has a scaling that depends on the sequence length; linear attention needs "
            "position-only rotations (use a static scaling)"
        )
    if r is None:
        a, b = fq, fk
    elif fq is None:
        a, b = None, r.rotate(fk, pos)
    else:
        a, b = r.apply(fq, fk, pos, k_pos=k_pos)
    if plan.cosine:  # rotations keep norms: the denominator takes the rotated features too
        a = None if a is None else _linear.with_one(a, xp)
        b = _linear.with_one(b, xp)
        c, e = a, b
    else:
        c, e = fq, fk
    vc = v_ if v_.dtype == cdt else xp.astype(v_, cdt)
    mask = _key_mask(key_mask, k, xp)
    if mask is not None:
        m = mask[..., None]
        b = xp.where(m, b, xp.zeros_like(b))
        e = b if plan.cosine else xp.where(m, e, xp.zeros_like(e))
        vc = xp.where(m, vc, xp.zeros_like(vc))
    return _linear.Chunk(a, c, b, e, vc), plan


def _check_nonnegative(be: Backend, arrays: list[tuple[str, Array | None]]) -> None:
    """A callable feature map must give non-negative features for ``similarity="dot"``
    (checked where values are concrete; documented as unchecked under tracing)."""
    for name, f in arrays:
        host = None if f is None else be.readable_values(f)
        if host is None:
            continue
        lo = host.min() if host.size else 0
        if lo < 0:
            raise ValueError(
                f"feature_map gave negative features ({name} has {float(lo):.3g}); with similarity='dot' "
                "the denominator must stay positive: use a non-negative map or similarity='cosine'"
            )


def _namespace(*q: Any, k: Any, v_: Any) -> Namespace:
    """The namespace of ``q`` (none for a state), ``k`` and ``v_``, checked as arrays."""
    arrays = [
        *(("q", x, "(..., seq, d)") for x in q),
        ("k", k, "(..., seq, d)"),
        ("v", v_, "(..., seq, d_v)"),
    ]
    for name, x, what in arrays:
        chk.check_array(x, name, what)
    xp = array_namespace(*(x for _, x, _ in arrays), names=tuple(n for n, _, _ in arrays))
    chk.check_qkv(arrays)
    be = backend_for(xp)
    be.check_dense([(n, x) for n, x, _ in arrays])
    be.check_plain([(n, x) for n, x, _ in arrays], "linear attention")
    be.check_devices([(n, x) for n, x, _ in arrays])
    return xp


# -- entry points ------------------------------------------------------------------------------
def linear_attention_state(
    k: Array,
    v: Array,
    pos: Any = None,
    *,
    rope: RotaryEmbedding | None = None,
    feature_map: FeatureMapName | Callable[[Array], Array] | None = None,
    similarity: Similarity = "dot",
    key_mask: Array | None = None,
) -> LinearAttentionState:
    """The :class:`LinearAttentionState` of a block of keys and values.

    Same conventions as :func:`linear_attention` (``pos`` broadcasts to ``k.shape[:-1]``);
    costs ``O(M d d_v)`` and computes no outputs.  States of disjoint blocks add.

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
    statics: tuple[Any, ...] = (rope, feature_map, similarity)
    if be.jit_eagerly() and _jittable(statics):
        statics = (*statics, fast_paths_enabled())  # (read while tracing: part of the key)
        p = eager_positions(be, pos, "pos", k, "k")
        S, z = be.jit(_state_jit, (0,))(statics, k, v, p, key_mask)
        return LinearAttentionState(S, z, k.shape[-2])
    chunk, _ = _prepare(None, k, v, pos, None, rope, feature_map, similarity, 1.0, key_mask, None, xp)
    kv_lead = chk.broadcast_shapes(tuple(k.shape[:-2]), tuple(v.shape[:-2]), names="k and v")
    st = _linear.chunk_state(chunk, xp)
    return _state(st.S, st.z, k.shape[-2], kv_lead, xp)


def _state(S: Array, z: Array, offset: Any, kv_lead: tuple[Any, ...], xp: Namespace) -> LinearAttentionState:
    """The state of sums ``S``, ``z`` broadcast to the leading axes ``kv_lead`` of k and v
    (``offset``: ``None`` where the key count is symbolic)."""
    if not _same(tuple(S.shape[:-2]), kv_lead):
        S = xp.broadcast_to(S, (*kv_lead, *S.shape[-2:]))
    if not _same(tuple(z.shape[:-1]), kv_lead):
        z = xp.broadcast_to(z, (*kv_lead, z.shape[-1]))
    return LinearAttentionState(S, z, offset)


def _same(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    """The same shape as far as it is known (a symbolic size, ``None``, is taken to match)."""
    return len(a) == len(b) and all(x is None or y is None or x == y for x, y in zip(a, b, strict=True))


def _core(
    plan: _linear.Plan,
    causal: bool,
    size: int,
    be: Backend,
    dev: Device,
    out_dtype: DType,
    chunk: _linear.Chunk,
    S0: Array | None,
    z0: Array | None,
) -> tuple[Array, Array, Array]:
    """The attention proper, from prepared features (jitted once per configuration on JAX)."""
    xp = be.xp
    init = None if S0 is None else _linear.State(S0, z0)
    if not causal:
        st = _linear.add(init, _linear.chunk_state(chunk, xp))
        out = _linear.attend(chunk.a, chunk.c, st, plan.eps, xp)
        return (out if out.dtype == out_dtype else xp.astype(out, out_dtype)), st.S, st.z
    out, st = be.causal_scan(chunk, init, size=size, eps=plan.eps, device=dev, out_dtype=out_dtype)
    return out, st.S, st.z


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
    eps: float = 1e-6,
    chunk_size: int | None = None,
    state: LinearAttentionState | None = None,
    return_state: Literal[False] = False,
    key_mask: Array | None = None,
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
    eps: float = 1e-6,
    chunk_size: int | None = None,
    state: LinearAttentionState | None = None,
    return_state: Literal[True],
    key_mask: Array | None = None,
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
    eps: float = 1e-6,
    chunk_size: int | None = None,
    state: LinearAttentionState | None = None,
    return_state: bool,
    key_mask: Array | None = None,
) -> Array | tuple[Array, LinearAttentionState]: ...


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
    eps: float = 1e-6,
    chunk_size: int | None = None,
    state: LinearAttentionState | None = None,
    return_state: bool = False,
    key_mask: Array | None = None,
) -> Array | tuple[Array, LinearAttentionState]:
    """RoFormer linear attention with RoPE on the features (equation 19 of the paper).

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
        given).  ``None`` (default): plain linear attention, no rotation.
    rope : RoPE or AxialRoPE or MRoPE, optional
        The rotary embedding of the features (default ``RoPE(F)`` when ``pos`` is given;
        static scalings only).  Its ``head_dim`` must be the feature width ``F``.
    k_pos : optional
        Key positions (non-causal cross-attention), default ``pos``.
    causal : bool
        Query ``i`` sees keys ``j <= i`` (needs ``N == M``) plus the keys in ``state``.
    feature_map : {"elu+1", "relu", "softplus", "identity"} or callable, optional
        ``phi``, applied to ``q`` and ``k`` in float32 or better.  Default ``"elu+1"``;
        ``"identity"`` for ``similarity="cosine"`` (refused with ``"dot"``: its
        denominators can be negative).  A callable maps ``(..., d)`` to ``(..., F)``
        features (``F`` even for RoPE); with ``similarity="dot"`` they must be
        non-negative (checked where the values are concrete).
    similarity : {"dot", "cosine"}
        ``"dot"``: ``phi(q)^T phi(k)``, RoPE in the numerator only.  ``"cosine"``:
        ``1 + cos(phi(q), phi(k))`` with RoPE in numerator and denominator (rotation keeps
        norms); zero vectors have cosine 0.
    eps : float
        Denominator guard: the denominator is ``max(den, eps)``, so queries whose features
        all underflow (elu+1 of very negative inputs) or that see only padded keys give a
        finite (zero-numerator) output.
    chunk_size : int, optional
        Chunk length ``C`` of the causal algorithm (default ``min(N, 128)``).  Does not
        change results beyond rounding.
    state : LinearAttentionState, optional
        Keys/values that precede these (decoding, or chunked processing): arrays of the
        same library, shaped exactly for these keys and values.
    return_state : bool
        Also return the state after these keys: ``state + state(k, v)``.
    key_mask : bool array, optional
        Broadcasts to ``k.shape[:-1]``; ``False`` marks padding, whose features and values
        are replaced by zeros (nothing of it leaks, even NaN or inf).

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
    """
    xp = _namespace(q, k=k, v_=v)
    be = backend_for(xp)
    statics: tuple[Any, ...] = (rope, causal, feature_map, similarity, eps, chunk_size)
    if be.jit_eagerly() and _jittable(statics):
        statics = (*statics, fast_paths_enabled())  # (read while tracing: part of the key)
        # JAX outside a trace: positions checked here, then the whole call as one compiled
        # program (no Python scalar moves to the device)
        p = eager_positions(be, pos, "pos", q, "q")
        kp = eager_positions(be, k_pos, "k_pos", k, "k")
        S0 = z0 = None
        off0: Any = 0
        if state is not None:
            if not isinstance(state, tuple) or len(state) != 3:
                raise TypeError(
                    f"state must be a LinearAttentionState(S, z, offset), got {type(state).__name__}"
                )
            S0, z0, off0 = state
            _check_offset(off0)
        out, S, z = be.jit(_linear_jit, (0,))(statics, q, k, v, p, kp, key_mask, S0, z0)
        if not chk.check_bool(return_state, "return_state"):
            return out
        return out, LinearAttentionState(S, z, off0 + k.shape[-2])
    causal = chk.check_bool(causal, "causal")
    if causal and q.shape[-2] != k.shape[-2]:
        raise ValueError(
            f"causal=True needs as many queries as keys (axis -2), got q.shape={tuple(q.shape)} "
            f"and k.shape={tuple(k.shape)}; pass earlier keys through state="
        )
    eps = chk.check_float(eps, "eps", above=0.0)
    if chunk_size is not None:
        chunk_size = chk.check_int(chunk_size, "chunk_size", minimum=1)
    return_state = chk.check_bool(return_state, "return_state")
    kv_lead = chk.broadcast_shapes(tuple(k.shape[:-2]), tuple(v.shape[:-2]), names="k and v")
    _, groups = chk.query_groups(tuple(q.shape[:-2]), kv_lead, names="q, k and v")
    sdt = state[0].dtype if isinstance(state, tuple) and len(state) == 3 and is_array(state[0]) else None
    chunk, plan = _prepare(q, k, v, pos, k_pos, rope, feature_map, similarity, eps, key_mask, sdt, xp)
    F = chunk.b.shape[-1]
    if state is not None:
        S0, z0, off0 = _state_arrays(state, xp, (*kv_lead, F, v.shape[-1]), (*kv_lead, F))
        if S0.dtype != plan.cdt:
            S0, z0 = be.xp.astype(S0, plan.cdt), be.xp.astype(z0, plan.cdt)
    else:
        S0 = z0 = None
        off0 = 0
    if groups > 1:  # grouped-query heads: q's heads as (key head, group), no repeat of k and v
        chunk, S0, z0 = _grouped(xp, groups, chunk, S0, z0)
    size = 128 if chunk_size is None else chunk_size
    if not be.tracing() and q.shape[-2] is not None:  # (symbolic under a trace or in ndonnx)
        size = max(1, min(q.shape[-2], size))
    core = be.jit(_core, (0, 1, 2, 3, 4, 5))
    out, S, z = core(plan, causal, size, be, be.creation_device(k), q.dtype, chunk, S0, z0)
    if groups > 1:
        out = merge_heads(out, q.shape[-3], groups, xp)
        S, z = S[..., 0, :, :], z[..., 0, :]
    if not return_state:
        return out
    return out, _state(S, z, off0 + k.shape[-2], kv_lead, be.xp)


def _grouped(
    xp: Namespace, g: int, ch: _linear.Chunk, S0: Array | None, z0: Array | None
) -> tuple[_linear.Chunk, Array | None, Array | None]:
    """Query features ``(..., H, N, F)`` as ``(..., H/g, g, N, F)``; key features, values and
    the state get a size-1 group axis (broadcast, never materialised)."""

    def split(x: Array) -> Array:
        return split_heads(x, g, xp)

    def one(x: Array) -> Array:
        return xp.expand_dims(x, axis=-3)

    a = None if ch.a is None else split(ch.a)
    c = None if ch.c is None else split(ch.c)
    S0 = None if S0 is None else one(S0)
    z0 = None if z0 is None else xp.expand_dims(z0, axis=-2)
    return _linear.Chunk(a, c, one(ch.b), one(ch.e), one(ch.v)), S0, z0


# -- JAX eager: one compiled program per call (the entry point itself, traced) -------------------
def _jittable(statics: tuple[Any, ...]) -> bool:
    """The static arguments can key a compiled program (a user's feature map is called eagerly,
    where its features can be checked)."""
    if any(callable(s) and not hasattr(s, "apply") for s in statics):
        return False
    try:
        hash(statics)
    except TypeError:
        return False
    return True


def _linear_jit(
    statics: tuple[Any, ...], q: Array, k: Array, v: Array, p: Any, kp: Any, mask: Any, S0: Any, z0: Any
) -> tuple[Array, Array, Array]:
    rope, causal, feature_map, similarity, eps, chunk_size, _ = statics
    state = None if S0 is None else LinearAttentionState(S0, z0, 0)
    out, st = linear_attention(
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
        return_state=True,
        key_mask=mask,
    )
    return out, st.S, st.z


def _state_jit(statics: tuple[Any, ...], k: Array, v: Array, p: Any, mask: Any) -> tuple[Array, Array]:
    rope, feature_map, similarity, _ = statics
    st = linear_attention_state(
        k, v, p, rope=rope, feature_map=feature_map, similarity=similarity, key_mask=mask
    )
    return st.S, st.z
