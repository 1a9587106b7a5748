"""The state of linear attention: :class:`LinearAttentionState` (sums, offset, log-decay, transition) and
how states of consecutive blocks combine.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from .._lib._compat import array_namespace, entry, is_array, library_name
from .._lib._typing import Array, Namespace


class LinearAttentionState(NamedTuple):
    """Summary of the keys/values seen so far (see :mod:`rotary` linear attention).

    ``S``: ``(..., F, d_v)``, ``z``: ``(..., F)`` (``None`` for ``normalize=False``), ``offset``:
    keys absorbed, which is where the keys' document goes on (with packed documents: per
    document for ``cu_seqlens``; for ``segment_ids``, per row, the tokens of the row's last
    document, plus the state's where the row held no boundary), ``log_decay``: the keys' total
    log-decay (``None`` without decay; ``-inf`` where a document boundary forgot everything
    before; ``(..., F)`` for gates per feature), ``transition``: for the delta rule and
    ``a``/``b``, the block's map of the state before it ``(..., F, F)`` (``None`` otherwise).
    States of consecutive key blocks combine: ``earlier + later`` is ``exp(later.log_decay) *
    earlier + later`` (a plain sum without decay), or ``later.transition @ earlier + later``
    (same library, shapes and dtypes), its offset the sum, or ``later``'s own where ``later``
    holds a boundary.

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
    z: Array | None
    offset: Any = 0
    log_decay: Any = None
    transition: Any = None

    def __add__(self, other: Any) -> LinearAttentionState:
        if not isinstance(other, LinearAttentionState):
            if not _earlier_state(other):
                return NotImplemented
            other = LinearAttentionState(*other)
        _check_compatible(self, other)
        S, z = self.S, self.z
        xp = array_namespace(S)
        if other.transition is not None:  # (a rank-one family: the later block's whole map)
            M = _transition_of(other, "the later state")
            S = xp.matmul(M, S)
            off = _added_offset(self.offset, other.offset, _row_decay(other))
            ld = _add_log_decay(self.log_decay if self.transition is not None else None, other.log_decay)
            return LinearAttentionState(S + other.S, None, off, ld, _then(self, M, xp))
        if other.log_decay is not None:
            keep = xp.exp(other.log_decay)
            per_feature = keep.ndim == S.ndim - 1
            S = S * (keep[..., :, None] if per_feature else keep[..., None, None])
            z = None if z is None else z * (keep if per_feature else keep[..., None])
        ld = _add_log_decay(self.log_decay, other.log_decay)
        tr = None
        if self.transition is not None:  # (a rank-one block, then a decay-only one)
            tr = _then(self, _decay_matrix(other.log_decay, S, xp), xp)
            ld = None
        off = _added_offset(self.offset, other.offset, _row_decay(other))
        return LinearAttentionState(S + other.S, None if z is None else z + other.z, off, ld, tr)

    def __radd__(self, other: Any) -> LinearAttentionState:
        if isinstance(other, int) and not isinstance(other, bool) and other == 0:
            return self  # lets ``sum(states)`` work
        return NotImplemented

    def zeros_like(self) -> LinearAttentionState:
        """The identity of ``+``: zero sums, offset 0, no decay."""
        return LinearAttentionState(self.S * 0, None if self.z is None else self.z * 0, 0)


class _NotComputed:
    """The transition of a rank-one family's state returned by :func:`linear_attention`: not
    computed (it costs a second state pass); such a state continues a call (``state=``) and
    combines as the earlier block, not as the later one."""

    def __repr__(self) -> str:
        return "<transition not computed: continue with state=; combine states of linear_attention_state>"


#: The transition of a state that does not know its own (see :class:`_NotComputed`).
NOT_COMPUTED = _NotComputed()


def _transition_of(st: LinearAttentionState, what: str) -> Array:
    if st.transition is NOT_COMPUTED or isinstance(st.transition, _NotComputed):
        raise ValueError(
            f"{what} comes from linear_attention(..., return_state=True) with beta= or a=/b=, which does "
            "not compute its block's transition (the map of the delta rule's state): it combines only "
            "as the earlier state. Build block states with rotary.linear_attention_state(..., beta=...) to "
            "combine them"
        )
    if not is_array(st.transition):
        raise TypeError(f"state.transition must be an array (..., F, F), got {type(st.transition).__name__}")
    return st.transition


def _decay_matrix(ld: Any, S: Array, xp: Namespace) -> Array:
    """``(..., F, F)``: the map of a decay-only block (``ld`` per head or per feature, or ``None``)."""
    F = S.shape[-2]
    eye = xp.eye(F, dtype=S.dtype, device=getattr(S, "device", None))
    if ld is None:
        return eye
    keep = xp.exp(ld)
    return eye * (keep[..., :, None] if keep.ndim == S.ndim - 1 else keep[..., None, None])


def _then(earlier: LinearAttentionState, M: Array, xp: Namespace) -> Any:
    """The transition of ``earlier`` followed by a block of map ``M``."""
    if earlier.transition is None:
        return xp.matmul(M, _decay_matrix(earlier.log_decay, earlier.S, xp))
    if isinstance(earlier.transition, _NotComputed):
        return NOT_COMPUTED
    return xp.matmul(M, earlier.transition)


def _add_log_decay(a: Any, b: Any) -> Any:
    if a is None:
        return b
    if b is None:
        return a
    return a + b


def _added_offset(a: Any, b: Any, b_log_decay: Any) -> Any:
    """The offset of ``earlier + later`` (``a``, ``b`` theirs): the sum, or ``b``'s own where
    ``b`` holds a document boundary (``log_decay`` ``-inf``: a state of packed documents, whose
    offset is the position in its last document, begun inside it)."""
    if b_log_decay is None or not is_array(b) or not is_array(b_log_decay):
        return a + b
    xp = array_namespace(b_log_decay)
    fresh = b_log_decay == -math.inf
    if fresh.ndim >= b.ndim:  # (a boundary is a row's: the same along the axes b broadcasts over)
        if fresh.ndim > b.ndim:
            fresh = xp.any(fresh, axis=tuple(range(fresh.ndim - b.ndim)))
        axes = tuple(i for i in range(b.ndim) if b.shape[i] == 1 and fresh.shape[i] != 1)
        if axes:
            fresh = xp.any(fresh, axis=axes, keepdims=True)
    return xp.where(fresh, b, a + b)


def _row_decay(st: LinearAttentionState) -> Any:
    """``st``'s log-decay as one per row (a boundary forgets every feature alike)."""
    ld = st.log_decay
    if ld is not None and is_array(ld) and is_array(st.S) and ld.ndim == st.S.ndim - 1:
        return ld[..., 0]
    return ld


def _check_compatible(a: LinearAttentionState, b: LinearAttentionState) -> None:
    if (a.z is None) != (b.z is None):
        raise ValueError(
            "cannot combine a normalised state with an unnormalised one (z is None for normalize=False)"
        )
    for name in ("S", "z"):
        x, y = getattr(a, name), getattr(b, name)
        if x is None:
            continue
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


@entry
def combine(*states: LinearAttentionState) -> LinearAttentionState:
    """The state of consecutive key blocks, in order (each decayed over the blocks after it).

    Examples
    --------
    >>> import numpy as np, rotary
    >>> s = rotary.linear_attention_state(np.ones((3, 4)), np.ones((3, 2)), np.arange(3))
    >>> rotary.combine(s, s, s).offset
    9
    """
    if not states:
        raise ValueError("combine needs at least one state")
    states = tuple(LinearAttentionState(*s) if _earlier_state(s) else s for s in states)
    for i, s in enumerate(states):
        if not isinstance(s, LinearAttentionState):
            raise TypeError(f"states[{i}] must be a LinearAttentionState, got {type(s).__name__}")
    return sum(states[1:], states[0])


def _earlier_state(s: Any) -> bool:
    """``s`` is a state of an earlier import of this module (``importlib.reload``, a cleared
    ``sys.modules``): plain data, served as this import's."""
    t = type(s)
    return (
        t is not LinearAttentionState
        and t.__qualname__ == LinearAttentionState.__qualname__
        and t.__module__ == LinearAttentionState.__module__
        and isinstance(s, tuple)
        and len(s) == len(LinearAttentionState._fields)
    )


def _state(
    S: Array, z: Array | None, offset: Any, kv_lead: tuple[Any, ...], xp: Namespace, ld: Any = None
) -> LinearAttentionState:
    """The state of sums ``S``, ``z`` broadcast to the leading axes ``kv_lead`` of k and v
    (``offset``: ``None`` where the key count is symbolic)."""
    if not _same(tuple(S.shape[:-2]), kv_lead):
        S = xp.broadcast_to(S, (*kv_lead, *S.shape[-2:]))
    if z is not None and not _same(tuple(z.shape[:-1]), kv_lead):
        z = xp.broadcast_to(z, (*kv_lead, z.shape[-1]))
    ld_lead = kv_lead if ld is None or ld.ndim < S.ndim - 1 else (*kv_lead, S.shape[-2])  # (per feature)
    if ld is not None and not _same(tuple(ld.shape), ld_lead):
        ld = xp.asarray(xp.broadcast_to(ld, ld_lead), copy=True)  # (the caller's own, writeable)
    return LinearAttentionState(S, z, offset, ld)


def _same(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    """The same shape as far as it is known (a symbolic size, ``None``, is taken to match)."""
    return len(a) == len(b) and all(x is None or y is None or x == y for x, y in zip(a, b, strict=True))
