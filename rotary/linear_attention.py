"""RoFormer linear attention with RoPE (paper eq. 19), on every array-API backend.

Public API
----------
``linear_attention(q, k, v, pos, *, causal=False, ...) -> out`` (or ``(out, state)``)
    ``q, k``: ``(..., seq, d)``, ``v``: ``(..., seq, d_v)``; ``pos`` broadcasts to
    ``q.shape[:-1]`` (``None``: plain, unrotated linear attention).  With
    ``similarity="dot"`` (default)::

        out_i = sum_j [R_i phi(q_i)]^T [R_j phi(k_j)] v_j / max(sum_j phi(q_i)^T phi(k_j), eps)

    RoPE rotates the *features* in the numerator only; the denominator stays
    unrotated (and positive).  With ``similarity="cosine"`` the similarity is
    ``1 + (R_i q^)^T (R_j k^)`` (unit vectors, zero vectors map to 0) in numerator
    and denominator.  ``causal=True`` restricts to ``j <= i``.

``linear_attention_state(k, v, pos, ...) -> LinearAttentionState``
    The summary of a block of keys/values, without computing outputs.

``LinearAttentionState(S, z, offset)``
    ``S``: ``(..., F, d_v)`` = ``sum_j b_j v_j^T`` (``b_j`` the numerator key
    features: rotated ``phi(k_j)``); ``z``: ``(..., F)`` = ``sum_j e_j`` (``e_j`` the
    denominator key features: unrotated ``phi(k_j)``); ``F = d`` for feature maps
    that keep the width, ``d + 1`` for ``similarity="cosine"`` (a constant feature
    carries the ``1 +``).  Both in float32, or float64 for float64 inputs.
    ``offset``: the number of key positions absorbed (an int or 0-d integer array),
    i.e. the next position when positions run 0, 1, 2, ...

    **Algebra.** The state of a union of *disjoint* key sets is the sum of their
    states: ``state(A | B) == state(A) + state(B)`` (``S``, ``z`` and ``offset`` add;
    ``LinearAttentionState.__add__`` and :func:`combine` do this).  The zero state
    (``zeros_like``) is the identity.  So a sequence split into chunks ``c_0, c_1, ...``
    can be processed as: per-chunk states ``s_i = linear_attention_state(k_i, v_i,
    pos_i)``, an exclusive prefix sum ``p_i = s_0 + ... + s_{i-1}``, then
    ``linear_attention(q_i, k_i, v_i, pos_i, causal=True, state=p_i)`` per chunk,
    which equals the corresponding rows of one call on the whole sequence.
    A given ``state`` always means "keys before these ones, all visible": with
    ``causal=False`` query ``i`` sees the state's keys and all new keys; with
    ``causal=True`` the state's keys and the new keys ``j <= i``.

Algorithms
----------
Non-causal: the key-value summary, ``O(N d d_v)``.  Causal: chunks of ``C``
tokens (``chunk_size``, default 128), masked quadratic form inside a chunk and the
running state between chunks: ``O(N C d + N d d_v)`` time, working memory
``O(C^2 + C d + d d_v)`` per head besides the output (no ``N x d x d_v`` tensor).
NumPy, torch, CuPy and array-api-strict run a Python loop over chunks writing into
one output array (``torch.compile`` unrolls it for the static length); Dask
concatenates the chunk outputs; JAX runs one jitted computation with ``lax.scan``
over the chunks (so eager JAX compiles once per shape, not once per operation).
Running sums are kept in float32 or better even for float16/bfloat16 inputs; the
output has the input dtype.  Denominator guard: ``max(den, eps)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

from . import _checks, _dask
from ._compat import (
    Array,
    Namespace,
    array_namespace,
    backend_name,
    compute_dtype,
    creation_device,
    is_array_api_obj,
    is_dask_namespace,
    is_jax_namespace,
)
from .apply import _rope
from .layouts import rotate_pairs
from .rope import RoPE, as_positions
from .scaling import resolve

__all__ = [
    "FEATURE_MAPS",
    "LinearAttentionState",
    "combine",
    "linear_attention",
    "linear_attention_state",
]


class LinearAttentionState(NamedTuple):
    """Summary of the keys/values seen so far (see the module docstring).

    ``S``: ``(..., F, d_v)``, ``z``: ``(..., F)``, ``offset``: keys absorbed.
    States of disjoint key sets add: ``state_a + state_b``.

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

    def __add__(self, other: Any) -> LinearAttentionState:  # type: ignore[override]
        if not isinstance(other, LinearAttentionState):
            return NotImplemented
        return LinearAttentionState(self.S + other.S, self.z + other.z, self.offset + other.offset)

    def __radd__(self, other: Any) -> LinearAttentionState:
        if isinstance(other, int) and not isinstance(other, bool) and other == 0:
            return self  # lets ``sum(states)`` work
        return NotImplemented

    def zeros_like(self) -> LinearAttentionState:
        """The identity of ``+``: zero sums, offset 0."""
        return LinearAttentionState(self.S * 0, self.z * 0, 0)


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
    out = states[0]
    for s in states[1:]:
        out = out + s
    return out


# -- feature maps ----------------------------------------------------------------------
def _elu1(x: Array, xp: Namespace) -> Array:
    zero = xp.zeros_like(x)
    return xp.where(x > zero, x + 1.0, xp.exp(xp.minimum(x, zero)))


def _relu(x: Array, xp: Namespace) -> Array:
    return xp.maximum(x, xp.zeros_like(x))


def _softplus(x: Array, xp: Namespace) -> Array:
    zero = xp.zeros_like(x)
    return xp.maximum(x, zero) + xp.log1p(xp.exp(-xp.abs(x)))


def _identity(x: Array, xp: Namespace) -> Array:
    return x


#: Named feature maps ``phi``; a callable ``phi(x) -> features`` is accepted too.
FEATURE_MAPS: dict[str, Callable[[Array, Namespace], Array]] = {
    "elu+1": _elu1,
    "relu": _relu,
    "softplus": _softplus,
    "identity": _identity,
}


class _Plan(NamedTuple):
    phi: Callable[[Array, Namespace], Array]
    rope: RoPE | None
    cosine: bool
    cdt: Any
    dev: Any
    eps: float


class _UserMap(NamedTuple):
    """A user callable ``phi(x)`` as ``phi(x, xp)``; equal when the callable is (jit cache key)."""

    fn: Callable[[Array], Array]

    def __call__(self, x: Array, xp: Namespace) -> Array:
        return self.fn(x)


def _resolve_phi(feature_map: Any, similarity: str) -> Callable[[Array, Namespace], Array]:
    if feature_map is None:
        feature_map = "identity" if similarity == "cosine" else "elu+1"
    if isinstance(feature_map, str):
        try:
            return FEATURE_MAPS[feature_map]
        except KeyError:
            raise ValueError(
                f"feature_map must be one of {sorted(FEATURE_MAPS)} or a callable, got {feature_map!r}"
            ) from None
    if callable(feature_map):
        return _UserMap(feature_map)
    raise TypeError(f"feature_map must be a name or a callable, got {type(feature_map).__name__}")


def _features(
    plan: _Plan, x: Array, cs: tuple[Array, Array] | None, mask: Array | None, xp: Namespace
) -> tuple[Array, Array]:
    """(numerator features, denominator features) of ``x`` in the compute dtype."""
    if x.dtype != plan.cdt:
        x = xp.astype(x, plan.cdt)
    f = plan.phi(x, xp)
    if plan.cosine:
        n2 = xp.sum(f * f, axis=-1, keepdims=True)
        tiny = float(xp.finfo(plan.cdt).smallest_normal)
        f = f / xp.sqrt(xp.maximum(n2, xp.full_like(n2, tiny)))  # zero vectors stay zero
    rot = f
    if plan.rope is not None:
        rot = rotate_pairs(f, cs[0], cs[1], layout=plan.rope.layout, rotary_dim=plan.rope.rotary_dim, xp=xp)
    if plan.cosine:
        one = xp.ones((*rot.shape[:-1], 1), dtype=plan.cdt, device=plan.dev)
        rot = xp.concat([rot, one], axis=-1)
        f = rot
    if mask is not None:
        m = xp.astype(mask, plan.cdt)[..., None]
        rot, f = rot * m, (f * m if f is not rot else rot * m)
    return rot, f


def _seq_slice(p: Array | None, s: int, e: int) -> Array | None:
    if p is None or p.ndim == 0 or p.shape[-1] == 1:
        return p
    return p[..., s:e]


def _cos_sin(plan: _Plan, p: Array | None, xp: Namespace) -> tuple[Array, Array] | None:
    if plan.rope is None:
        return None
    return plan.rope._half_cos_sin(p, xp, plan.dev, plan.cdt)


# -- argument handling -----------------------------------------------------------------
def _lead_shape(*shapes: tuple, names: str) -> tuple:
    try:
        return tuple(_broadcast_shapes(*shapes))
    except ValueError:
        raise ValueError(
            f"the leading (batch/head) axes of {names} do not broadcast: "
            f"{', '.join(str(tuple(s)) for s in shapes)} (for grouped-query heads, repeat k and v)"
        ) from None


def _broadcast_shapes(*shapes: tuple) -> list:
    n = max(len(s) for s in shapes)
    out = []
    for i in range(n):
        dims = {s[len(s) - n + i] for s in shapes if len(s) - n + i >= 0}
        dims.discard(1)
        if len(dims) > 1:
            raise ValueError
        out.append(dims.pop() if dims else 1)
    return out


def _check_array(x: Any, xp: Namespace, name: str, what: str) -> None:
    if not is_array_api_obj(x):
        raise TypeError(f"{name} must be an array of shape {what}, got {type(x).__name__}")
    _checks.check_floating(x, xp, name)
    if x.ndim < 2:
        raise ValueError(f"{name} must have shape {what}, got shape {tuple(x.shape)}")


def _check_common(
    q: Array,
    k: Array,
    v: Array | None,
    xp: Namespace,
    *,
    causal: bool,
    chunk_size: Any,
    eps: Any,
    similarity: Any,
) -> None:
    _check_array(q, xp, "q", "(..., seq, d)")
    _check_array(k, xp, "k", "(..., seq, d)")
    if v is not None:
        _check_array(v, xp, "v", "(..., seq, d_v)")
        if k.shape[-2] != v.shape[-2]:
            raise ValueError(
                f"k and v must have the same sequence length (axis -2), got k.shape={tuple(k.shape)} "
                f"and v.shape={tuple(v.shape)}"
            )
        if v.dtype != k.dtype:
            raise TypeError(f"k and v must have the same dtype, got {k.dtype} and {v.dtype}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"q and k must have the same feature dim (last axis), got q.shape={tuple(q.shape)} "
            f"and k.shape={tuple(k.shape)}"
        )
    if q.dtype != k.dtype:
        raise TypeError(f"q and k must have the same dtype, got {q.dtype} and {k.dtype}")
    if causal and q.shape[-2] != k.shape[-2]:
        raise ValueError(
            f"causal=True needs as many queries as keys (axis -2), got q.shape={tuple(q.shape)} "
            f"and k.shape={tuple(k.shape)}; pass earlier keys through state="
        )
    if chunk_size is not None and (
        isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size <= 0
    ):
        raise ValueError(f"chunk_size must be a positive integer or None, got {chunk_size!r}")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not (math.isfinite(eps) and eps > 0):
        raise ValueError(f"eps must be a positive finite number, got {eps!r}")
    if similarity not in ("dot", "cosine"):
        raise ValueError(f"similarity must be 'dot' or 'cosine', got {similarity!r}")


def _plan(
    xp: Namespace,
    q: Array,
    d: int,
    *,
    pos: Any,
    feature_map: Any,
    similarity: str,
    layout: str,
    base: float,
    scaling: Any,
    eps: float,
    state_dtype: Any = None,
) -> _Plan:
    phi = _resolve_phi(feature_map, similarity)
    cdt = compute_dtype(xp, q.dtype)
    if state_dtype is not None and hasattr(xp, "float64") and state_dtype == xp.float64:
        cdt = xp.float64
    dev = creation_device(q, xp)
    rope = None
    if pos is not None:
        if isinstance(feature_map, str) or feature_map is None:
            f = d
        else:  # a callable may change the width: look at its output on a tiny probe
            probe = xp.zeros((1, d), dtype=cdt, device=dev)
            f = feature_map(probe).shape[-1]
        if f % 2:
            raise ValueError(
                f"RoPE needs an even feature dim, got {f} (the last axis of phi(q)); "
                "use an even head dim or pos=None"
            )
        rope = _rope(f, base, layout, None, resolve(scaling), "exact")
        if rope.scaling.dynamic:
            raise ValueError(
                f"scaling {type(rope.scaling).__name__} depends on the sequence length; linear "
                "attention needs position-only rotations (use a static scaling)"
            )
    return _Plan(phi, rope, similarity == "cosine", cdt, dev, float(eps))


def _positions(pos: Any, x: Array, xp: Namespace, name: str, x_name: str) -> Array | None:
    if pos is None:
        return None
    p = as_positions(pos, xp, creation_device(x, xp), name)
    _checks.check_same_device(xp, [(x_name, x), (name, p)])
    _checks.check_broadcast(tuple(p.shape), tuple(x.shape[:-1]), name, x_name)
    _checks.check_positions_values(p, xp, name)
    return p


def _key_mask(key_mask: Any, k: Array, xp: Namespace) -> Array | None:
    if key_mask is None:
        return None
    if not is_array_api_obj(key_mask) or not xp.isdtype(key_mask.dtype, "bool"):
        raise TypeError("key_mask must be a boolean array (True = a real key, False = padding)")
    _checks.check_broadcast(tuple(key_mask.shape), tuple(k.shape[:-1]), "key_mask", "k")
    return key_mask


def _check_state(state: Any, lead: tuple, f: int, d_v: int, xp: Namespace) -> LinearAttentionState:
    if not isinstance(state, tuple) or len(state) != 3:
        raise TypeError("state must be a LinearAttentionState(S, z, offset)")
    state = LinearAttentionState(*state)
    for name, a, want in (("state.S", state.S, (*lead, f, d_v)), ("state.z", state.z, (*lead, f))):
        if not is_array_api_obj(a):
            raise TypeError(f"{name} must be an array, got {type(a).__name__}")
        if tuple(a.shape) != want:
            raise ValueError(
                f"{name} has shape {tuple(a.shape)} but these keys/values need {want} "
                f"(leading axes {lead}, feature dim {f}, d_v {d_v}); the state comes from "
                "inputs of a different shape, feature map or similarity"
            )
    return state


def _validated_state(
    plan: _Plan, state: Any, lead: tuple, q: Array, v: Array, xp: Namespace
) -> LinearAttentionState:
    probe = xp.zeros((1, q.shape[-1]), dtype=plan.cdt, device=plan.dev)
    f = plan.phi(probe, xp).shape[-1] + (1 if plan.cosine else 0)
    return _check_state(state, lead, f, v.shape[-1], xp)


def _sums(plan: _Plan, b: Array, e: Array, v: Array, xp: Namespace) -> tuple[Array, Array]:
    if v.dtype != plan.cdt:
        v = xp.astype(v, plan.cdt)
    return xp.matmul(xp.matrix_transpose(b), v), xp.sum(e, axis=-2)


def _divide(plan: _Plan, num: Array, den: Array, xp: Namespace) -> Array:
    den = xp.maximum(den, xp.full_like(den, plan.eps))
    return num / den[..., None]


# -- public entry points ---------------------------------------------------------------
def linear_attention_state(
    k: Array,
    v: Array,
    pos: Any,
    *,
    feature_map: str | Callable | None = None,
    similarity: str = "dot",
    layout: str = "half",
    base: float = 10000.0,
    scaling: Any = None,
    key_mask: Array | None = None,
) -> LinearAttentionState:
    """The :class:`LinearAttentionState` of a block of keys and values.

    Same conventions as :func:`linear_attention` (``pos`` broadcasts to
    ``k.shape[:-1]``); costs ``O(M d d_v)`` and computes no outputs.  States of
    disjoint blocks add.

    Examples
    --------
    >>> import numpy as np, rotary
    >>> k = np.ones((2, 5, 8), dtype=np.float32)
    >>> v = np.ones((2, 5, 3), dtype=np.float32)
    >>> st = rotary.linear_attention_state(k, v, np.arange(5))
    >>> st.S.shape, st.z.shape, st.offset
    ((2, 8, 3), (2, 8), 5)
    """
    xp = array_namespace(k, v, pos, key_mask, names=("k", "v", "pos", "key_mask"))
    _check_common(k, k, v, xp, causal=False, chunk_size=None, eps=1.0, similarity=similarity)
    _lead_shape(tuple(k.shape[:-2]), tuple(v.shape[:-2]), names="k and v")
    plan = _plan(
        xp,
        k,
        k.shape[-1],
        pos=pos,
        feature_map=feature_map,
        similarity=similarity,
        layout=layout,
        base=base,
        scaling=scaling,
        eps=1.0,
    )
    p = _positions(pos, k, xp, "pos", "k")
    mask = _key_mask(key_mask, k, xp)
    core = _jitted("state", _state_core, 2) if is_jax_namespace(xp) else _state_core
    S, z = core(plan, xp, k, v, p, mask)
    return LinearAttentionState(S, z, k.shape[-2])


def linear_attention(
    q: Array,
    k: Array,
    v: Array,
    pos: Any,
    *,
    causal: bool = False,
    feature_map: str | Callable | None = None,
    layout: str = "half",
    base: float = 10000.0,
    scaling: Any = None,
    eps: float = 1e-6,
    chunk_size: int | None = None,
    state: LinearAttentionState | None = None,
    return_state: bool = False,
    key_mask: Array | None = None,
    similarity: str = "dot",
    k_pos: Any = None,
) -> Array | tuple[Array, LinearAttentionState]:
    """RoFormer linear attention with RoPE on the features (paper eq. 19).

    Parameters
    ----------
    q, k : array
        Queries ``(..., N, d)`` and keys ``(..., M, d)``, real floating, same dtype.
    v : array
        Values ``(..., M, d_v)``.  Leading axes of ``q``, ``k``, ``v`` broadcast.
    pos : array or int or sequence or None
        Positions, broadcast to ``q.shape[:-1]`` (and ``k.shape[:-1]`` unless
        ``k_pos`` is given).  ``None``: plain linear attention, no rotation.
    causal : bool
        Query ``i`` sees keys ``j <= i`` (needs ``N == M``) plus the keys in ``state``.
    feature_map : {"elu+1", "relu", "softplus", "identity"} or callable, optional
        ``phi``, applied to ``q`` and ``k`` (in float32 or better).  Default
        ``"elu+1"``; ``"identity"`` for ``similarity="cosine"``.  A callable maps
        ``(..., d)`` to ``(..., F)`` features (``F`` even for RoPE).  With
        ``similarity="dot"`` the features must be non-negative so the
        denominator is positive.
    layout, base, scaling
        RoPE options as in :func:`rotary.apply` (static scalings only).
    eps : float
        Denominator guard: the denominator is ``max(den, eps)``, so queries whose
        features all underflow (elu+1 of very negative inputs) or that see only
        padded keys give a finite (zero-numerator) output.
    chunk_size : int, optional
        Chunk length ``C`` of the causal algorithm (default ``min(N, 128)``).
        Does not change results beyond rounding.
    state : LinearAttentionState, optional
        Keys/values that precede these (decoding, or chunked processing).
    return_state : bool
        Also return the state after these keys: ``state + state(k, v)``.
    key_mask : bool array, optional
        Broadcasts to ``k.shape[:-1]``; ``False`` marks padding, whose features
        are zeroed (it leaks into neither numerator nor denominator).
    similarity : {"dot", "cosine"}
        ``"dot"``: ``phi(q)^T phi(k)``, RoPE in the numerator only.  ``"cosine"``:
        ``1 + cos(phi(q), phi(k))`` with RoPE in numerator and denominator
        (rotation keeps norms); zero vectors have cosine 0.
    k_pos : optional
        Key positions (non-causal cross-attention), default ``pos``.

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
    xp = array_namespace(q, k, v, pos, k_pos, key_mask, names=("q", "k", "v", "pos", "k_pos", "key_mask"))
    _check_common(q, k, v, xp, causal=causal, chunk_size=chunk_size, eps=eps, similarity=similarity)
    kv_lead = _lead_shape(tuple(k.shape[:-2]), tuple(v.shape[:-2]), names="k and v")
    _lead_shape(tuple(q.shape[:-2]), kv_lead, names="q, k and v")
    sdt = None
    if state is not None and isinstance(state, tuple) and len(state) == 3 and is_array_api_obj(state[0]):
        sdt = state[0].dtype
    plan = _plan(
        xp,
        q,
        q.shape[-1],
        pos=pos,
        feature_map=feature_map,
        similarity=similarity,
        layout=layout,
        base=base,
        scaling=scaling,
        eps=eps,
        state_dtype=sdt,
    )
    if is_dask_namespace(xp):  # one task per block; causal: a scan over the block states
        if state is not None:  # validated here, eagerly, as on the other backends
            _validated_state(plan, state, kv_lead, q, v, xp)
        kw = {"feature_map": feature_map, "similarity": similarity, "layout": layout, "base": base}
        kw.update(scaling=scaling, eps=eps, chunk_size=chunk_size, k_pos=k_pos, key_mask=key_mask)
        return _dask.linear_attention(
            q, k, v, pos, causal=causal, state=state, return_state=return_state, **kw
        )
    qp = _positions(pos, q, xp, "pos", "q")
    if pos is None:
        kp = None
    elif k_pos is None:
        _checks.check_broadcast(tuple(qp.shape), tuple(k.shape[:-1]), "pos", "k")
        kp = qp
    else:
        kp = _positions(k_pos, k, xp, "k_pos", "k")
    mask = _key_mask(key_mask, k, xp)
    if state is not None:
        state = _validated_state(plan, state, kv_lead, q, v, xp)
        S0, z0 = state.S, state.z
        if S0.dtype != plan.cdt:
            S0, z0 = xp.astype(S0, plan.cdt), xp.astype(z0, plan.cdt)
    else:
        S0 = z0 = None
    C = max(1, min(q.shape[-2], 128 if chunk_size is None else chunk_size))
    core = _jitted("core", _core, 5) if is_jax_namespace(xp) else _core
    shared = kp is qp
    out, S, z = core(plan, bool(causal), C, shared, xp, q, k, v, qp, None if shared else kp, mask, S0, z0)
    if out.dtype != q.dtype:
        out = xp.astype(out, q.dtype)
    if tuple(z.shape[:-1]) != kv_lead:  # k may have fewer leading axes than v
        z = xp.broadcast_to(z, (*kv_lead, z.shape[-1]))
    if not return_state:
        return out
    offset = k.shape[-2] if state is None else state.offset + k.shape[-2]
    return out, LinearAttentionState(S, z, offset)


def _noncausal(plan, q, k, v, qp, kp, mask, S0, z0, xp):
    a, c = _features(plan, q, _cos_sin(plan, qp, xp), None, xp)
    b, e = _features(plan, k, _cos_sin(plan, kp, xp), mask, xp)
    S, z = _sums(plan, b, e, v, xp)
    if S0 is not None:
        S, z = S0 + S, z0 + z
    num = xp.matmul(a, S)
    den = xp.sum(c * z[..., None, :], axis=-1)
    return _divide(plan, num, den, xp), S, z


def _chunk(plan, q, k, v, qp, kp, mask, S, z, tri, xp):
    """One causal chunk: masked quadratic form inside, running sums ``S``, ``z`` (or None) before."""
    cq = _cos_sin(plan, qp, xp)
    ck = cq if kp is qp else _cos_sin(plan, kp, xp)
    a, c = _features(plan, q, cq, None, xp)
    b, e = _features(plan, k, ck, mask, xp)
    if v.dtype != plan.cdt:
        v = xp.astype(v, plan.cdt)
    scores = xp.matmul(a, xp.matrix_transpose(b))
    scores = xp.where(tri, scores, xp.zeros_like(scores))
    num = xp.matmul(scores, v)
    zc = xp.cumulative_sum(e, axis=-2)  # inclusive prefix sums of the denominator features
    if S is not None:
        num = num + xp.matmul(a, S)
        zc = zc + z[..., None, :]
    den = xp.sum(c * zc, axis=-1)
    dS = xp.matmul(xp.matrix_transpose(b), v)
    return _divide(plan, num, den, xp), (dS if S is None else S + dS), zc[..., -1, :]


def _tri(C: int, plan: _Plan, xp: Namespace) -> Array:
    idx = xp.arange(C, device=plan.dev)
    return idx[:, None] >= idx[None, :]  # (C, C) causal mask inside a chunk


def _causal(plan, q, k, v, qp, kp, mask, S, z, C, xp):
    """Chunked causal linear attention: a Python loop over chunks of ``C`` tokens."""
    n = q.shape[-2]
    if n == 0:  # no tokens: the non-causal path returns the empty output and unchanged sums
        return _noncausal(plan, q, k, v, qp, kp, mask, S, z, xp)
    tri = _tri(C, plan, xp)
    # Eager backends with item assignment write each chunk into one output array (peak memory:
    # the output once); the others concatenate the chunk outputs.
    inplace = backend_name(xp) in _INPLACE
    outs, out = [], None
    for s in range(0, n, C):
        e = min(s + C, n)
        t = tri if e - s == C else tri[: e - s, : e - s]
        qs = _seq_slice(qp, s, e)
        ks = qs if kp is qp else _seq_slice(kp, s, e)
        o, S, z = _chunk(
            plan, q[..., s:e, :], k[..., s:e, :], v[..., s:e, :], qs, ks, _seq_slice(mask, s, e), S, z, t, xp
        )
        if not inplace or e - s == n:
            outs.append(o)
            continue
        if out is None:
            out = xp.empty((*o.shape[:-2], n, o.shape[-1]), dtype=q.dtype, device=plan.dev)
        out[..., s:e, :] = o if o.dtype == q.dtype else xp.astype(o, q.dtype)
    if out is None:
        out = outs[0] if len(outs) == 1 else xp.concat(outs, axis=-2)
    return out, S, z


#: Namespaces whose arrays take slice assignment eagerly (not JAX, not Dask).
_INPLACE = frozenset({"numpy", "torch", "cupy", "array_api_strict"})


# -- JAX: one jitted computation, lax.scan over chunks ---------------------------------
def _split_chunks(x, n_chunks, C, seq_axis_from_end):
    """``(..., n_chunks*C, *tail)`` -> ``(n_chunks, ..., C, *tail)`` (None and broadcast axes kept)."""
    import jax.numpy as jnp

    if x is None:
        return None
    ax = x.ndim - seq_axis_from_end
    if x.ndim < seq_axis_from_end or x.shape[ax] == 1:
        return None  # broadcast along the sequence: not scanned
    y = jnp.reshape(x, (*x.shape[:ax], n_chunks, C, *x.shape[ax + 1 :]))
    return jnp.moveaxis(y, ax, 0)


def _causal_jax(plan, q, k, v, qp, kp, mask, S, z, C, xp):
    import jax
    import jax.numpy as jnp

    n = q.shape[-2]
    n_full = n // C
    if n_full < 3:
        return _causal(plan, q, k, v, qp, kp, mask, S, z, C, xp)
    tri = _tri(C, plan, xp)
    same = kp is qp
    # The first chunk outside the scan (it starts the running sums), then a scan over the
    # remaining full chunks, then the ragged tail.
    o0, S, z = _chunk(
        plan,
        q[..., :C, :],
        k[..., :C, :],
        v[..., :C, :],
        _seq_slice(qp, 0, C),
        _seq_slice(qp if same else kp, 0, C),
        _seq_slice(mask, 0, C),
        S,
        z,
        tri,
        xp,
    )
    end = n_full * C
    sl = slice(C, end)
    m = n_full - 1
    xs = (
        _split_chunks(q[..., sl, :], m, C, 2),
        _split_chunks(k[..., sl, :], m, C, 2),
        _split_chunks(v[..., sl, :], m, C, 2),
        _split_chunks(_seq_slice(qp, C, end), m, C, 1),
        None if same else _split_chunks(_seq_slice(kp, C, end), m, C, 1),
        _split_chunks(_seq_slice(mask, C, end), m, C, 1),
    )

    def body(carry, x):
        Sc, zc = carry
        qc, kc, vc, pc, kpc, mc = x
        pc = qp if pc is None else pc
        kpc = pc if same else (kp if kpc is None else kpc)
        mc = mask if mc is None else mc
        o, Sc, zc = _chunk(plan, qc, kc, vc, pc, kpc, mc, Sc, zc, tri, xp)
        return (Sc, zc), o

    (S, z), outs = jax.lax.scan(body, (S, z), xs)
    outs = jnp.moveaxis(outs, 0, -3)
    outs = jnp.reshape(outs, (*outs.shape[:-3], m * C, outs.shape[-1]))
    parts = [jnp.broadcast_to(o0, (*outs.shape[:-2], *o0.shape[-2:])), outs]
    if end < n:
        ot, S, z = _causal(
            plan,
            q[..., end:, :],
            k[..., end:, :],
            v[..., end:, :],
            _seq_slice(qp, end, n),
            _seq_slice(qp if same else kp, end, n),
            _seq_slice(mask, end, n),
            S,
            z,
            C,
            xp,
        )
        parts.append(ot)
    return jnp.concatenate(parts, axis=-2), S, z


def _core(plan, causal, C, shared, xp, q, k, v, qp, kp, mask, S, z):
    if shared:  # keys at the query positions: one cos/sin per chunk
        kp = qp
    if not causal:
        return _noncausal(plan, q, k, v, qp, kp, mask, S, z, xp)
    if is_jax_namespace(xp):
        return _causal_jax(plan, q, k, v, qp, kp, mask, S, z, C, xp)
    return _causal(plan, q, k, v, qp, kp, mask, S, z, C, xp)


def _state_core(plan, xp, k, v, kp, mask):
    b, e = _features(plan, k, _cos_sin(plan, kp, xp), mask, xp)
    S, z = _sums(plan, b, e, v, xp)
    if tuple(z.shape[:-1]) != tuple(S.shape[:-2]):
        z = xp.broadcast_to(z, (*S.shape[:-2], z.shape[-1]))
    return S, z


_JITTED: dict[str, Callable] = {}


def _jitted(name: str, fn: Callable, n_static: int) -> Callable:
    """``fn`` under ``jax.jit`` with its first ``n_static`` arguments static, built on first use.

    One compiled computation per configuration and shape instead of one per array operation
    (eager JAX compiles every operation separately).
    """
    f = _JITTED.get(name)
    if f is None:
        import jax  # the caller holds JAX arrays

        f = jax.jit(fn, static_argnums=tuple(range(n_static)))
        _JITTED[name] = f
    return f
