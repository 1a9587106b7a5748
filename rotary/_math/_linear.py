"""The algebra of RoFormer's RoPE linear attention (paper eq. 19), written once.

Notation, per head: ``a_i`` / ``c_i`` the numerator / denominator features of query ``i``,
``b_j`` / ``e_j`` those of key ``j`` (numerator features rotated by RoPE, denominator ones
not, for ``similarity="dot"``; both rotated and with a constant feature for ``"cosine"``)::

    out_i = sum_j (a_i . b_j) v_j / max(sum_j c_i . e_j, eps)

The keys enter only through the *state* ``S = sum_j b_j v_j^T`` (``F x d_v``) and
``z = sum_j e_j`` (``F``); states of disjoint key sets add.  Causal attention splits the
sequence into chunks of ``C`` tokens: inside a chunk the masked quadratic form, before it
the state of all earlier chunks, i.e. an *exclusive prefix sum* of the chunk states.  That
prefix sum is the one backend-specific step (:meth:`rotary._backends.Backend.causal_scan`:
a Python loop, ``lax.scan``, a cumulative sum over chunks, a Dask block scan); the two
functions here, :func:`chunk_state` and :func:`chunk_output`, are everything else.  Both
work on any leading axes, so the same code runs one chunk at a time or all chunks at once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from .._lib._typing import Array, Device, DType, FeatureMapName, Namespace

__all__ = [
    "FEATURE_MAPS",
    "Chunk",
    "Plan",
    "State",
    "attend",
    "chunk_output",
    "chunk_state",
    "features",
]


def _elu1(x: Array, xp: Namespace) -> Array:
    zero = xp.zeros_like(x)
    return xp.where(x > zero, x + 1.0, xp.exp(xp.minimum(x, zero)))


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
    eps: float
    cdt: DType


class State(NamedTuple):
    """Running sums ``S`` (``(..., F, d_v)``) and ``z`` (``(..., F)``)."""

    S: Array
    z: Array


class Chunk(NamedTuple):
    """Features of a block of tokens (sequence axis -2)."""

    a: Array  # query numerator features
    c: Array  # query denominator features
    b: Array  # key numerator features
    e: Array  # key denominator features
    v: Array  # values, in the compute dtype


def features(x: Array, plan: Plan, xp: Namespace) -> Array:
    """``phi(x)`` in the compute dtype; unit vectors for ``"cosine"`` (zero vectors stay zero)."""
    if x.dtype != plan.cdt:
        x = xp.astype(x, plan.cdt)
    f = plan.phi(x, xp)
    if plan.cosine:
        n2 = xp.sum(f * f, axis=-1, keepdims=True)
        tiny = float(xp.finfo(plan.cdt).smallest_normal)
        f = f / xp.sqrt(xp.maximum(n2, xp.full_like(n2, tiny)))
    return f


def with_one(f: Array, xp: Namespace) -> Array:
    """``f`` with a constant feature 1 appended (it carries the ``1 +`` of the cosine similarity)."""
    one = xp.ones_like(f[..., :1])
    return xp.concat([f, one], axis=-1)


def chunk_state(ch: Chunk, xp: Namespace) -> State:
    """The state of the keys in ``ch``: ``(b^T v, sum e)`` over the sequence axis."""
    return State(xp.matmul(xp.matrix_transpose(ch.b), ch.v), xp.sum(ch.e, axis=-2))


def add(s: State | None, t: State) -> State:
    """``s + t`` (``None``: no keys, the identity)."""
    return t if s is None else State(s.S + t.S, s.z + t.z)


def _divide(num: Array, den: Array, eps: float, xp: Namespace) -> Array:
    return num / xp.maximum(den, xp.full_like(den, eps))[..., None]


def attend(a: Array, c: Array, st: State, eps: float, xp: Namespace) -> Array:
    """Queries against a whole state (non-causal, or decoding)."""
    return _divide(xp.matmul(a, st.S), xp.sum(c * st.z[..., None, :], axis=-1), eps, xp)


def chunk_output(
    ch: Chunk,
    prefix: State | None,
    eps: float,
    xp: Namespace,
    device: Device,
    cumsum: Callable[[Array, int], Array] | None = None,
) -> Array:
    """Causal outputs of the queries of ``ch``: the keys of ``ch`` up to each query (masked
    quadratic form) plus every key summarised in ``prefix`` (``None``: no earlier keys).
    ``cumsum(x, axis)`` replaces ``xp.cumulative_sum`` (see ``batched_causal_scan``)."""
    n = ch.a.shape[-2]
    idx = xp.arange(n, device=device)
    tri = idx[:, None] >= idx[None, :]
    scores = xp.matmul(ch.a, xp.matrix_transpose(ch.b))
    scores = xp.where(tri, scores, xp.zeros_like(scores))
    num = xp.matmul(scores, ch.v)
    zc = xp.cumulative_sum(ch.e, axis=-2) if cumsum is None else cumsum(ch.e, -2)
    if prefix is not None:
        num = num + xp.matmul(ch.a, prefix.S)
        zc = zc + prefix.z[..., None, :]
    return _divide(num, xp.sum(ch.c * zc, axis=-1), eps, xp)
