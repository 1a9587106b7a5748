"""RoFormer linear attention with RoPE (paper eq. 19), the field's decay and gates, its state, and
their algebra.

With ``similarity="dot"`` (normalised, the default)::

    out_i = sum_j w_ij [R_i phi(q_i)]^T [R_j phi(k_j)] v_j / sum_j w_ij phi(q_i)^T phi(k_j)

RoPE rotates the features in the numerator only; the denominator stays unrotated (and
positive).  ``w_ij = 1`` (RoFormer), or the decay between the two tokens: ``w_ij = prod_{s=j+1..i}
a_s`` with ``a_s = decay * exp(log_gate_s)`` (RetNet's per-head ``decay``, GLA's and Mamba-2's
per-token gates).  ``normalize=False`` drops the denominator (fla's ``normalize=False``, RetNet,
GLA, Mamba-2).  With ``similarity="cosine"`` the similarity is ``1 + (R_i q^)^T (R_j k^)`` (unit
vectors, zero vectors map to 0) in numerator and denominator.

The denominator has no floor: the query features are scaled per token (the output does not
depend on their scale: elu+1 in the log domain, other maps by their largest feature), and a
denominator of exactly 0 (a query whose features are all 0, or that sees no key) gives 0.

The state ``(S, z, offset, log_decay)``: ``S = sum_j w_j b_j v_j^T`` over the numerator key
features ``b_j`` (rotated ``phi(k_j)``), ``z = sum_j w_j e_j`` over the denominator ones
(unrotated; ``None`` unnormalised), each key weighted by its decay to the end of the block;
``log_decay`` the block's total (``None``: no decay).  States of consecutive key blocks combine:
``a + b`` (``a`` first) is ``exp(b.log_decay) a + b`` (a plain sum without decay), so per-block
states, their exclusive prefix sums and ``causal=True, state=prefix`` per block give the rows of
one call on the whole sequence.  A given state always means "keys before these ones, all
visible", decayed up to the first of these tokens.

Non-causal: the key-value summary, ``O(N d d_v)``; with decay, each query sees the keys on both
sides, weighted by the gates between them (two causal passes).  Causal: the sequence streams
through the backend's :meth:`~rotary._backends.Backend.scan` in parts (chunks of ``C =
chunk_size`` tokens, a masked quadratic form inside a chunk, the chunk states combined in one
matrix product), so feature maps and rotations are applied part by part and the working memory
is one part's, whatever the length: a loop writing into one output (NumPy, torch, CuPy,
array-api-strict), ``lax.scan`` (JAX), the whole sequence at once under ``torch.compile`` (one
graph for every length), a chain of blocks (Dask).  Running sums in float32 or better; the output
in the input dtype.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Callable
from typing import Any, Literal, NamedTuple, overload

from ._backends import Backend, backend_for
from ._lib import _validation as chk
from ._lib._cache import MISSING, fast_paths_enabled, memo_add, memo_get
from ._lib._compat import array_namespace, entry, is_array, library_name, namespace_of, not_an_array
from ._lib._typing import Array, Device, DType, FeatureMapName, Namespace, RotaryEmbedding, Similarity
from ._math import _documents, _linear, _recurrence
from ._math._groups import merge_heads, split_heads
from ._packing import Docs, documents, implied_positions, unnest
from ._rope import Rotary, default_rope, eager_positions

__all__ = ["FEATURE_MAPS", "LinearAttentionState", "combine", "linear_attention", "linear_attention_state"]

FEATURE_MAPS = _linear.FEATURE_MAPS
_SIMILARITIES: tuple[Similarity, ...] = ("dot", "cosine")
#: Chunk length ``C`` of the causal algorithm, and chunks per streamed part.
_CHUNK, _PART_CHUNKS = 64, 8
#: Chunks per streamed part of the recurrent families (gates per feature: their pairwise terms
#: are ``F`` times larger).
_REC_PART_CHUNKS, _REC_PART_CHUNKS_FEATURE = 2, 1


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


# -- arguments ---------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class _UserMap:
    """A user callable ``phi(x)`` as ``phi(x, xp)``; equal when the callable is (jit cache key)."""

    fn: Callable[[Array], Array]

    def __call__(self, x: Array, xp: Namespace) -> Array:
        out = self.fn(x)
        if not is_array(out):
            raise not_an_array("feature_map", out, verb="return")
        if out.ndim != x.ndim or tuple(out.shape[:-1]) != tuple(x.shape[:-1]):
            raise ValueError(
                f"feature_map must map (..., d) to (..., F), one feature vector per token (every axis "
                f"but the last kept): given q or k (or a part of their tokens) of shape "
                f"{tuple(x.shape)}, it returned shape {tuple(out.shape)}"
            )
        return out


def _phi(
    feature_map: Any, similarity: Similarity, normalize: bool
) -> tuple[Callable[[Array, Namespace], Array], bool]:
    """``(phi, nonnegative)``: the feature map and whether its features are never negative."""
    if feature_map is None:
        feature_map = "identity" if similarity == "cosine" or not normalize else "elu+1"
    if isinstance(feature_map, str):
        if feature_map not in FEATURE_MAPS:
            raise ValueError(
                f"feature_map must be one of {sorted(FEATURE_MAPS)} or a callable, got {feature_map!r}"
            )
        if feature_map == "identity" and similarity == "dot" and normalize:
            raise ValueError(
                "feature_map='identity' with similarity='dot' gives negative denominators (features "
                "of either sign), so outputs are unbounded where the denominator crosses 0; use a "
                "non-negative map ('elu+1', 'relu', 'softplus'), similarity='cosine', or "
                "normalize=False (no denominator)"
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


def _as_array(x: Any, name: str, xp: Namespace, be: Backend, like: Array) -> tuple[Array, Any]:
    """A number, sequence or array as a floating array of ``like``'s library and device, and
    its values on the host where they can be read (``None`` elsewhere)."""
    if is_array(x):
        if library_name(array_namespace(x)) != library_name(xp):
            raise TypeError(
                f"{name} is a {type(x).__module__}.{type(x).__name__} but q, k, v are "
                f"{library_name(xp)} arrays"
            )
        if not chk.is_floating(x.dtype):
            raise TypeError(f"{name} must be real floating, got {chk.dtype_name(x.dtype)}")
        be.check_devices([("k", like), (name, x)])
        return x, be.readable_values(x)
    if isinstance(x, bool) or not isinstance(x, (numbers.Real, list, tuple)):
        raise TypeError(f"{name} must be a number, a sequence or an array, got {type(x).__name__}")
    import numpy as np

    host = np.asarray(x, dtype=np.float64)
    return be.to_device(host, be.compute_dtype(like.dtype), be.creation_device(like)), host


def _per_feature(log_gate: Any, k: Array) -> bool:
    """A log-gate per token and key feature: as many axes as ``k`` (one per token has one fewer)."""
    if log_gate is None:
        return False
    nd = log_gate.ndim if is_array(log_gate) else _host_ndim(log_gate)
    return bool(nd == k.ndim)


def _host_ndim(x: Any) -> int:
    import numpy as np

    try:
        return int(np.ndim(x))
    except (TypeError, ValueError):
        return -1


def _gates(
    decay: Any,
    log_gate: Any,
    k: Array,
    kv_lead: tuple[Any, ...],
    cdt: DType,
    be: Backend,
    F: Any = None,
) -> Array | None:
    """The log-gate of every key ``(..., N)`` (or ``(..., 1)`` for a decay per head alone), or of
    every key and feature ``(..., N, F)`` (a ``log_gate`` with as many axes as ``k``), in the
    compute dtype: ``log(decay) + log_gate``; values checked where they can be read."""
    xp = be.xp
    pf = _per_feature(log_gate, k)
    g = None
    if decay is not None:
        d, host = _as_array(decay, "decay", xp, be, k)
        if not chk.broadcasts_to(tuple(d.shape), kv_lead):
            raise ValueError(
                f"decay of shape {tuple(d.shape)} does not broadcast to the leading axes of k and v "
                f"{kv_lead} (one decay per head, e.g. shape (heads,) or (heads, 1) ... as for k.shape[:-2])"
            )
        if host is not None and host.size and not ((host > 0) & (host <= 1)).all():
            bad = host[~((host > 0) & (host <= 1))].ravel()[0]
            raise ValueError(f"decay must lie in (0, 1] (a factor per step), got {float(bad)!r}")
        d = d if d.dtype == cdt else xp.astype(d, cdt)
        g = xp.log(d)[..., None, None] if pf else xp.log(d)[..., None]
    if log_gate is not None:
        lg, host = _as_array(log_gate, "log_gate", xp, be, k)
        # (one gate per key of each state: the leading axes of k and v, as the state's)
        keys = (*kv_lead, k.shape[-2])
        if pf:
            want = (*keys, k.shape[-1] if F is None else F)
            if not chk.broadcasts_to(tuple(lg.shape), want):
                raise ValueError(
                    f"log_gate of shape {tuple(lg.shape)} (a gate per token and key feature: as many axes "
                    f"as k) does not broadcast to {want} (the keys' axes and the feature width F)"
                )
        elif not chk.broadcasts_to(tuple(lg.shape), keys):
            raise ValueError(
                f"log_gate of shape {tuple(lg.shape)} does not broadcast to {keys}, the leading axes of k "
                f"and v and the keys (k.shape[:-1] = {tuple(k.shape[:-1])}; one gate per key of each state: "
                "per query head under grouped-query attention is not possible, the state is the keys')"
            )
        # (reductions, not a mask of every value: no copy of the gates' size)
        if host is not None and host.size and not host.max() <= 0:
            bad = host[~(host <= 0)].ravel()[0]
            raise ValueError(
                f"log_gate must be <= 0 and finite (the log of a factor in (0, 1]), got {float(bad)!r}; "
                "pass log(sigmoid(x)) for a sigmoid gate"
            )
        if host is not None and host.size and not math.isfinite(float(host.min())):
            raise ValueError(
                "log_gate must be finite: a gate that forgets everything (-inf) is a document "
                "boundary; pass segment_ids= or cu_seqlens= for it"
            )
        lg = lg if lg.dtype == cdt else xp.astype(lg, cdt)
        g = lg if g is None else g + lg
    return g


class _Call(NamedTuple):
    """The static configuration of one call (hashable where its parts are: a jit key on JAX)."""

    plan: _linear.Plan
    rope: Any
    causal: bool
    size: int
    part: int
    groups: int
    nonneg: bool
    sized: bool = True  # sizes are plain ints (not symbolic ones that look like ints)
    fam: _recurrence.Family | None = None  # the recurrent families' engine (None: the additive one)


def _n_docs(cu: Any) -> int:
    return int(cu.shape[0] if is_array(cu) else len(cu)) - 1


def _state_arrays(
    state: Any,
    xp: Namespace,
    want_S: tuple[Any, ...],
    want_z: tuple[Any, ...] | None,
    per_doc: bool = False,
    per_row: bool = False,
) -> tuple[Array, Array | None, Any, Any]:
    if not isinstance(state, tuple) or len(state) not in (3, 4, 5):
        raise TypeError(f"state must be a LinearAttentionState(S, z, offset), got {type(state).__name__}")
    S, z, offset = state[:3]
    log_decay = state[3] if len(state) >= 4 else None
    if want_z is None and z is not None:
        raise ValueError(
            "state has a denominator sum z, but normalize=False keeps none: use a state of "
            "normalize=False calls"
        )
    if want_z is not None and z is None:
        raise ValueError(
            "state has no denominator sum (z is None: a normalize=False state), but this call is normalised"
        )
    for name, a, want in (("state.S", S, want_S), ("state.z", z, want_z)):
        if want is None:
            continue
        assert a is not None
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
                + ("; with cu_seqlens, one state per document: (..., n_docs, F, d_v)" if per_doc else "")
            )
    _check_offset(offset, per_doc, per_row)
    if is_array(offset) and offset.ndim:
        rows = want_S[-3:-2] if per_doc else want_S[:-2]
        fits = tuple(offset.shape) == rows if per_doc else chk.broadcasts_to(tuple(offset.shape), rows)
        if not fits:
            raise ValueError(
                f"state.offset has shape {tuple(offset.shape)} but these documents need "
                + (f"one per document, shape {rows}, or one for all" if per_doc else "")
                + (f"one per row, broadcasting to the leading axes of k and v {rows}" if per_row else "")
            )
    return S, z, offset, log_decay


def _check_offset(offset: Any, per_doc: bool = False, per_row: bool = False) -> None:
    if isinstance(offset, bool) or not (
        isinstance(offset, numbers.Integral)
        or (
            is_array(offset)
            and (per_row or offset.ndim in ((0, 1) if per_doc else (0,)))
            and chk.is_integral(offset.dtype)
        )
    ):
        raise TypeError(
            "state.offset must be an integer (or a 0-d integer array"
            + (", or one per document" if per_doc else "")
            + (", or one per row" if per_row else "")
            + f"), got {type(offset).__name__} {offset!r}"
        )


@dataclasses.dataclass(frozen=True)
class _Denominators:
    """A feature map not known to be non-negative is judged by its kernel: its denominators must
    not be negative (checked where their values can be read; unchecked under tracing)."""

    be: Backend

    def __call__(self, den: Array) -> None:
        host = self.be.readable_values(den)
        if host is None or not host.size:
            return
        lo = float(host.min())
        if lo < 0 or lo != lo:
            raise ValueError(
                f"feature_map's kernel gave a {'NaN' if lo != lo else 'negative'} denominator "
                f"({lo:.3g}); with similarity='dot' the denominators sum_j phi(q_i) . phi(k_j) must stay "
                "positive (features of either sign are fine where their kernel is positive, as Based's "
                "Taylor map): use a map with a positive kernel, similarity='cosine' or normalize=False"
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


def _plan(
    feature_map: Any,
    similarity: Any,
    eps: Any,
    normalize: Any,
    k: Array,
    sdt: DType,
    be: Backend,
    qk_l2norm: Any = False,
    scale: Any = None,
) -> tuple[_linear.Plan, bool]:
    similarity = chk.check_choice(similarity, "similarity", _SIMILARITIES)
    normalize = chk.check_bool(normalize, "normalize")
    eps = chk.check_float(eps, "eps", minimum=0.0)
    l2 = chk.check_bool(qk_l2norm, "qk_l2norm")
    sc = 1.0 if scale is None else chk.check_float(scale, "scale", above=0.0)
    phi, nonneg = _phi(feature_map, similarity, normalize)
    cdt = be.compute_dtype(k.dtype)
    if sdt is not None and chk.dtype_name(sdt) == "float64" and hasattr(be.xp, "float64"):
        cdt = be.xp.float64
    check = None if nonneg or similarity == "cosine" or not normalize else _Denominators(be)
    return _linear.Plan(phi, similarity == "cosine", eps, cdt, normalize, l2, sc, check), nonneg


def _width(plan: _linear.Plan, k: Array, xp: Namespace) -> int:
    """The feature width ``F`` (a user map may change it; it sees one token)."""
    if not isinstance(plan.phi, _UserMap):
        return int(k.shape[-1])
    return int(_linear.features(k[..., :1, :], plan, xp).shape[-1])


def _check_rope_positions(be: Backend, r: Any, pos: Any, k_pos: Any, q: Array | None, k: Array) -> None:
    """Shapes and devices of the positions against ``q`` and ``k`` (their leading axes only)."""
    if not isinstance(r, Rotary):
        return  # (a user's rotary embedding checks its own positions, on the whole sequence)
    if q is None:
        r._check_positions(be, pos, k, "pos", "k")
        return
    coord = r._check_positions(be, pos, q, "pos", "q")
    if k_pos is None:
        chk.check_broadcast(coord, tuple(k.shape[:-1]), "pos", "k")
    else:
        r._check_positions(be, k_pos, k, "k_pos", "k")


# -- one part of the sequence: features, rotations, gates ------------------------------------------
class _Parts:
    """What turns a part of the inputs into features (the streamed body's first step)."""

    def __init__(self, call: _Call, be: Backend, dev: Device, rng: Any, krng: Any, mask: Any) -> None:
        self.call, self.be, self.dev, self.rng, self.krng, self.has_mask = call, be, dev, rng, krng, mask

    def keys(self, k: Array, v: Array, kp: Any, mask: Any) -> tuple[Array, Array | None, Array]:
        """``(b, e, v)`` of a part of the keys (``kp``: their positions, ``None`` unrotated)."""
        plan, r, xp = self.call.plan, self.call.rope, self.be.xp
        e = _linear.features(k, plan, xp)
        b = e if r is None else self._rotate(e, kp, self.krng)
        return self._keys_done(b, e, v, mask)

    def _keys_done(self, b: Array, e: Array, v: Array, mask: Any) -> tuple[Array, Array | None, Array]:
        plan, xp = self.call.plan, self.be.xp
        if plan.cosine:
            b = _linear.with_one(b, xp)
            e = b
        vc = v if v.dtype == plan.cdt else xp.astype(v, plan.cdt)
        if mask is not None:
            m = mask[..., None]
            b = xp.where(m, b, xp.zeros_like(b))
            e = b if plan.cosine else xp.where(m, e, xp.zeros_like(e))
            vc = xp.where(m, vc, xp.zeros_like(vc))
        return b, (e if plan.normalize else None), vc

    def queries(self, q: Array, p: Any) -> tuple[Array, Array | None]:
        """``(a, c)`` of a part of the queries."""
        plan, r, xp = self.call.plan, self.call.rope, self.be.xp
        c = _linear.query_features(q, plan, xp)
        a = c if r is None else self._rotate(c, p, self.rng)
        return self._queries_done(a, c)

    def _queries_done(self, a: Array, c: Array) -> tuple[Array, Array | None]:
        plan, xp = self.call.plan, self.be.xp
        if plan.cosine:
            a = _linear.with_one(a, xp)
            c = a
        return a, (c if plan.normalize else None)

    def both(
        self, q: Array, k: Array, v: Array, p: Any, mask: Any
    ) -> tuple[Array, Array | None, Array, Array | None, Array]:
        """Queries and keys at the same positions (one rotation of both where it can share work)."""
        plan, r, xp = self.call.plan, self.call.rope, self.be.xp
        if r is None:
            a, c = self.queries(q, None)
            b, e, vc = self.keys(k, v, None, mask)
            return a, c, b, e, vc
        c = _linear.query_features(q, plan, xp)
        e = _linear.features(k, plan, xp)
        if isinstance(r, Rotary) and not self.be.lazy:
            a, b = r._rotate_both(self.be, c, e, p, self.rng, self.dev)
        else:  # (a lazy library rotates block by block: RoPE's own public path)
            a, b = r.apply(c, e, p)
        a, c2 = self._queries_done(a, c)
        b, e2, vc = self._keys_done(b, e, v, mask)
        return a, c2, b, e2, vc

    def _rotate(self, x: Array, p: Any, rng: Any) -> Array:
        r = self.call.rope
        if isinstance(r, Rotary) and not self.be.lazy:
            return r._rotate(self.be, x, p, rng, self.dev)
        return r.rotate(x, p)

    def group(self, ch: _linear.Chunk, marks: _linear.Marks) -> tuple[_linear.Chunk, _linear.Marks]:
        """Grouped-query heads: q's heads as ``(key head, group)``; key features, values and
        marks get a size-1 group axis (broadcast, never materialised)."""
        g, xp = self.call.groups, self.be.xp
        if g == 1:
            return ch, marks

        def split(x: Array | None) -> Array | None:
            return None if x is None else split_heads(x, g, xp)

        def one(x: Array | None, axis: int = -3) -> Array | None:
            return None if x is None else xp.expand_dims(x, axis=axis)

        def mark(x: Array | None) -> Array | None:
            if x is None:
                return None
            if x.ndim < 2:
                return x
            return xp.expand_dims(x, axis=-2)

        b, v = one(ch.b), one(ch.v)
        assert b is not None and v is not None
        return (
            _linear.Chunk(split(ch.a), split(ch.c), b, one(ch.e), v),
            _linear.Marks(mark(marks.g), mark(marks.doc)),
        )


def _tokens(x: Array | None, n: Any, xp: Namespace) -> Array | None:
    """Per-token marks ``(..., 1)`` broadcast along ``n`` tokens."""
    if x is None or x.shape[-1] == n:
        return x
    return xp.broadcast_to(x, (*x.shape[:-1], n))


# -- entry points ------------------------------------------------------------------------------
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
        S, z, ld, tr = be.jit(_state_jit, (0,))(statics, k, v, p, key_mask, dec, lg, exs)
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
    if be.jit_eagerly() and _jittable(statics):
        statics = (*statics, fast_paths_enabled())  # (read while tracing: part of the key)
        p = eager_positions(be, pos, "pos", k, "k")
        dec, lg = _eager_gates(be, decay, log_gate, k, v)
        S, z, ld, _ = be.jit(_state_jit, (0,))(statics, k, v, p, key_mask, dec, lg, None)
        return LinearAttentionState(S, z, k.shape[-2], ld)
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
    q = k[..., :, :]
    checked = _check_call(
        be,
        q,
        k,
        v,
        pos,
        None,
        True,
        feature_map,
        similarity,
        0.0,
        None,
        None,
        True,
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


def _sizes(chunk_size: Any, n: Any, be: Backend) -> tuple[int, int]:
    """The chunk length and the tokens per streamed part."""
    size = _CHUNK if chunk_size is None else chunk_size
    if not be.tracing() and isinstance(n, int):  # (symbolic under a trace or in ndonnx)
        size = max(1, min(n, size))
    return size, size * max(1, _PART_CHUNKS * _CHUNK // size)


def _total(g: Array, n: Any, xp: Namespace) -> Array:
    """The total log-decay of ``n`` keys with log-gates ``g``."""
    if g.shape[-1] == 1 and n != 1:
        return g[..., 0] * float(n)
    return xp.sum(g, axis=-1)


def _check_even(pos: Any, rope: Any, width: int) -> None:
    if pos is not None and rope is None and width % 2:
        raise ValueError(f"feature_map gives {width} features; RoPE rotates them in pairs (an even number)")


def _check_static(r: Any) -> None:
    if r is not None and not getattr(r, "static", True):
        raise ValueError(
            "rope has a scaling that depends on the sequence length; linear attention needs "
            "position-only rotations (use a static scaling)"
        )


def _zero_carry(
    plan: _linear.Plan, F: int, v: Array, lead: tuple[Any, ...], be: Backend, dev: Device
) -> _linear.Carry:
    xp = be.xp
    F = F + 1 if plan.cosine else F
    S = xp.zeros((*lead, F, v.shape[-1]), dtype=plan.cdt, device=dev)
    z = xp.zeros((*lead, F), dtype=plan.cdt, device=dev) if plan.normalize else None
    return _linear.Carry(S, z, None)


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
        exs = _Extras(
            *(
                None if x is None else _as_array(x, n, be.xp, be, k)[0]
                for n, x in zip(_Extras._fields, extras, strict=True)
            )
        )
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


def _state_positions(be: Backend, state: Any, q: Array, k: Array, docs: bool) -> Any:
    """``pos=None`` with ``rope=`` and a state: the tokens follow the state's keys, at positions
    ``offset, offset + 1, ...`` (one token: the offset itself, an int or a 0-d array); ``None``
    where no such rule holds (documents have their own; queries and keys of different lengths;
    an offset that is not an integer)."""
    n = q.shape[-2]
    if docs or not isinstance(state, tuple) or len(state) < 3 or n is None or n != k.shape[-2]:
        return None
    off = state[2]
    if type(off) is int:  # (host positions: every library takes them, JAX without an implicit transfer)
        import numpy as np

        return off if n == 1 else np.arange(off, off + n)
    if not (is_array(off) and off.ndim == 0 and chk.is_integral(off.dtype)):
        return None
    return off if n == 1 else off + be.xp.arange(n, dtype=off.dtype, device=be.creation_device(q))


def _sig_args(
    pos: Any,
    k_pos: Any,
    state: Any,
    key_mask: Any,
    decay: Any,
    log_gate: Any,
    cu: Any = None,
    seg: Any = None,
    extras: _Extras | None = None,
) -> tuple[list[Any], tuple[Any, ...]]:
    """The arrays whose types, shapes, dtypes and devices decide the checks, and the types of
    the other arguments (Python values: their values are checked on every call)."""
    args: list[Any] = []
    kinds: list[Any] = []
    parts = [pos, k_pos, key_mask, decay, log_gate, seg, *(NO_EXTRAS if extras is None else extras)]
    if log_gate is not None and not is_array(log_gate):  # (its nesting decides the family)
        kinds.append(("log_gate", _host_ndim(log_gate)))
    # (cu_seqlens: its length decides the state's shape; values are checked on every call)
    kinds.append(None if cu is None else ("cu", len(cu) if not is_array(cu) else tuple(cu.shape)))
    if isinstance(state, tuple) and len(state) in (3, 4, 5):
        parts += [state[0], state[1]]
        kinds.append(len(state))
    else:
        parts += [state, None]
    for x in parts:
        if x is None or is_array(x):
            args.append(x)
            kinds.append(None)
        else:
            args.append(None)
            kinds.append(type(x))
    return args, tuple(kinds)


class _Checked(NamedTuple):
    """What the checks of a call found (the same for every call with arguments of the same
    types, shapes, dtypes and devices): the call's configuration, the keys' leading axes and
    the feature width."""

    call: _Call
    kv_lead: tuple[Any, ...]
    F: int
    decode: Callable[..., tuple[Array, ...] | None] | None = None


def _check_call(
    be: Backend,
    q: Array,
    k: Array,
    v: Array,
    pos: Any,
    k_pos: Any,
    causal: Any,
    feature_map: Any,
    similarity: Any,
    eps: Any,
    chunk_size: Any,
    state: Any,
    return_state: Any,
    key_mask: Any,
    rope: Any,
    normalize: Any,
    decay: Any,
    log_gate: Any,
    cu_seqlens: Any = None,
    segment_ids: Any = None,
    extras: _Extras | None = None,
    qk_l2norm: Any = False,
    scale: Any = None,
) -> _Checked:
    """Every check of :func:`linear_attention` that depends on the arguments' types, shapes,
    dtypes and devices only (values are checked on every call)."""
    extras = NO_EXTRAS if extras is None else extras
    xp = be.xp
    causal = chk.check_bool(causal, "causal")
    n, m = q.shape[-2], k.shape[-2]
    if causal and n != m:
        raise ValueError(
            f"causal=True needs as many queries as keys (axis -2), got q.shape={tuple(q.shape)} "
            f"and k.shape={tuple(k.shape)}; pass earlier keys through state="
        )
    if chunk_size is not None:
        chunk_size = chk.check_int(chunk_size, "chunk_size", minimum=1)
    chk.check_bool(return_state, "return_state")
    kv_lead = chk.broadcast_shapes(tuple(k.shape[:-2]), tuple(v.shape[:-2]), names="k and v")
    _, groups = chk.query_groups(tuple(q.shape[:-2]), kv_lead, names="q, k and v")
    sdt = (
        state[0].dtype
        if isinstance(state, tuple) and len(state) in (3, 4, 5) and is_array(state[0])
        else None
    )
    plan, nonneg = _plan(feature_map, similarity, eps, normalize, k, sdt, be, qk_l2norm, scale)
    F = _width(plan, k, xp)
    fam = _family(extras, log_gate, k, causal, plan.normalize, similarity)
    if fam is not None:
        _extra_arrays(extras, be, k, kv_lead, F, plan.cdt)  # (shapes checked once here)
    has_docs = cu_seqlens is not None or segment_ids is not None
    if has_docs and (k_pos is not None or n != m):
        raise ValueError(
            "cu_seqlens and segment_ids describe one packed sequence of queries and keys: pass q, k "
            "and v of the same tokens (no k_pos)"
        )
    _check_even(pos, rope, F)
    # (with documents, a rope without positions rotates each document from 0)
    implied = has_docs and pos is None and rope is not None
    r = default_rope(be, rope, 0 if implied else pos, F, k_pos)
    _check_static(r)
    if not implied:
        _check_rope_positions(be, r, pos, k_pos, q, k)
    _key_mask(key_mask, k, xp)
    if (decay is not None or log_gate is not None) and not causal and (k_pos is not None or n != m):
        raise ValueError(
            "decay and log_gate need queries and keys on one sequence (causal, or non-causal with "
            "q and k of the same tokens): the decay between a query and a key of another sequence "
            "is not defined"
        )
    if state is not None:
        Fs = F + 1 if plan.cosine else F  # (the state's width: the cosine's constant feature too)
        lead = kv_lead
        if cu_seqlens is not None:  # one state per document
            lead = (*kv_lead, _n_docs(cu_seqlens))
        want_z = (*lead, Fs) if plan.normalize else None
        _state_arrays(
            state,
            xp,
            (*lead, Fs, v.shape[-1]),
            want_z,
            per_doc=cu_seqlens is not None,
            per_row=segment_ids is not None,
        )
    if fam is not None and n is None:
        raise ValueError(
            "the recurrent families (beta=, u=, a=/b=, per-feature log_gate) need a known sequence "
            "length (this library's axis has none)"
        )
    size, part = _sizes(chunk_size, n, be)
    call = _Call(plan, r, causal, size, part, groups, nonneg, not be.sizes_symbolic(), fam)
    decode = None
    if (
        fam is None
        and causal
        and n == 1
        and state is not None
        and key_mask is None
        and decay is None
        and log_gate is None
        and not has_docs
        and groups == 1
        and not plan.cosine
        and plan.normalize
        and plan.phi is _linear.FEATURE_MAPS["elu+1"]
    ):
        decode = _decoder(be, call, q, k, v, state)
    if (
        fam is not None
        and n == 1
        and state is not None
        and key_mask is None
        and not has_docs
        and groups == 1
        and (r is None or (isinstance(r, Rotary) and (is_array(pos) or type(pos) is int)))
    ):
        decode = _family_decoder(be, call, q, k, pos, kv_lead, F)
    return _Checked(call, kv_lead, F, decode)


def _decoder(be: Backend, call: _Call, q: Array, k: Array, v: Array, state: Any) -> Callable[..., Any] | None:
    """The backend's decoding step for calls like this one (one token, a state, ``elu+1``, the
    dot similarity, RoPE or none; arguments of these types, shapes, dtypes and devices), its
    rotation read from RoPE's rows at each call's position (an int, a list of one, an array of
    one); ``None``: the generic steps.  The step returns ``None`` for values it does not cover."""
    rows = None
    r = call.rope
    if r is not None:
        if not isinstance(r, Rotary):
            return None
        rows = r._decode_rows(be, q, k)
        if rows is None:
            return None
    return be.linear_step("elu+1", call.plan.eps, rows, (q, k, v, state[0], state[1]))


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

    def emit(c: Any, s: _linear.Source) -> tuple[Any, Array]:
        qb, pb = s.arrays
        a, cq = parts.queries(qb, pb)
        if groups > 1:
            a, cq = split_heads(a, groups, xp), None if cq is None else split_heads(cq, groups, xp)
        o = _linear.attend(a, cq, st, plan, xp)
        return c, (o if o.dtype == out_dtype else xp.astype(o, out_dtype))

    _, out = be.scan(emit, None, qsrc, n=n, block=part)
    assert out is not None
    if groups > 1:
        out = merge_heads(out, q.shape[-3], groups, xp)
    return out, carry


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
            return _causal_part(call, ch, marks, carry, xp, dev, q.dtype, be.cumsum, strict=strict)
        carry, (num, den) = _causal_part(
            call, ch, marks, carry, xp, dev, None, be.cumsum, strict=strict, divided=False
        )
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
    xp: Namespace,
    dev: Device,
    out_dtype: DType,
    cumsum: _linear.CumSum | None = None,
    **kw: Any,
) -> tuple[_linear.Carry, Any]:
    """One part of causal attention: padded to whole chunks, then all its chunks at once."""
    t = ch.b.shape[-2]
    known = call.sized and isinstance(t, int)  # (else symbolic: torch.compile, jax.export, ndonnx)
    size = min(call.size, t) if known and t else call.size
    if t is None:  # an unknown length (ndonnx): chunks of one token, by a new axis (no padding)
        out, after = _linear.block_causal(
            ch, marks, carry, 1, call.plan, xp, dev, out_dtype, cumsum=cumsum, **kw
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
    out, after = _linear.block_causal(
        padded, pmarks, carry, size, call.plan, xp, dev, out_dtype, chunks=m, sized=known, cumsum=cumsum, **kw
    )
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


def _eager_gates(be: Backend, decay: Any, log_gate: Any, k: Array, v: Array) -> tuple[Any, Any]:
    """``decay`` and ``log_gate`` as arrays (traced by the compiled call), values checked here."""
    out: list[Any] = []
    for name, x in (("decay", decay), ("log_gate", log_gate)):
        if x is None:
            out.append(None)
            continue
        out.append(_as_array(x, name, be.xp, be, k)[0])
    if out[0] is not None or out[1] is not None:
        kv_lead = chk.broadcast_shapes(tuple(k.shape[:-2]), tuple(v.shape[:-2]), names="k and v")
        _gates(out[0], out[1], k, kv_lead, be.compute_dtype(k.dtype), be)
    return out[0], out[1]


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
) -> tuple[Array, Array, Any, Any]:
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
    )
    return st.S, st.z, st.log_decay, st.transition


# -- the recurrent families: per-feature gates, the delta rule, RWKV's bonus and transition ---------
class _Extras(NamedTuple):
    """The recurrent families' arguments as the caller passed them (``None``: absent)."""

    beta: Any = None
    u: Any = None
    a: Any = None
    b: Any = None


NO_EXTRAS = _Extras()


def _family(
    ex: _Extras, log_gate: Any, k: Array, causal: bool, normalize: bool, similarity: Any
) -> _recurrence.Family | None:
    """The recurrence a call's arguments ask for (``None``: the additive engine's families), its
    static refusals made (shapes are checked with the values, by :func:`_extra_arrays`)."""
    pf = _per_feature(log_gate, k)
    if (ex.a is None) != (ex.b is None):
        raise ValueError("a= and b= come together: the transition's rank-one term a_t b_t^T (RWKV-7)")
    if ex.beta is not None and ex.a is not None:
        raise ValueError(
            "pass beta= (the delta rule: a = -beta k, b = k) or a= and b= (a general rank-one term), not both"
        )
    rank: _recurrence.Rank = "delta" if ex.beta is not None else "dplr" if ex.a is not None else None
    bonus = ex.u is not None
    if not (pf or rank or bonus):
        return None
    what = (
        "beta= (the delta rule)"
        if rank == "delta"
        else "a= and b= (RWKV-7's transition)"
        if rank == "dplr"
        else "u= (RWKV-6's bonus)"
        if bonus
        else "a log_gate per key feature"
    )
    if bonus and rank:
        raise ValueError("u= (RWKV-6's bonus) is for additive updates: pass it without beta=, a= and b=")
    if normalize or similarity != "dot":
        raise ValueError(
            f"{what} is one of the field's unnormalised recurrences (no denominator): pass "
            "normalize=False (and similarity='dot')"
        )
    if not causal:
        raise ValueError(
            f"{what} defines a recurrence over the sequence: pass causal=True (non-causal attention "
            "takes a gate per token only)"
        )
    return _recurrence.Family(pf, rank, bonus)


def _extra_arrays(
    ex: _Extras, be: Backend, k: Array, kv_lead: tuple[Any, ...], F: int, cdt: DType
) -> _Extras:
    """``beta``, ``u``, ``a``, ``b`` as arrays of ``k``'s library and device in the compute dtype,
    their shapes checked (and ``beta``'s values where they can be read)."""
    xp = be.xp
    tokens = (*kv_lead, k.shape[-2])  # (one per key of each state: k's and v's leading axes)
    want = {
        "beta": (tokens, "one per key of each state: the leading axes of k and v, and the keys"),
        "u": ((*kv_lead, F), "one per key head and feature: (*k.shape[:-2], F)"),
        "a": ((*tokens, F), "one vector per key of each state, of the feature width F"),
        "b": ((*tokens, F), "one vector per key of each state, of the feature width F"),
    }
    out: dict[str, Any] = {}
    for name in _Extras._fields:
        x = getattr(ex, name)
        if x is None:
            out[name] = None
            continue
        arr, host = _as_array(x, name, xp, be, k)
        shape, what = want[name]
        if not chk.broadcasts_to(tuple(arr.shape), shape):
            raise ValueError(f"{name} of shape {tuple(arr.shape)} does not broadcast to {shape} ({what})")
        if host is not None and host.size and not bool(((host == host) & (abs(host) != float("inf"))).all()):
            raise ValueError(
                f"{name} must be finite, got a {'NaN' if (host != host).any() else 'infinite'} value"
            )
        out[name] = arr if arr.dtype == cdt else xp.astype(arr, cdt)
    return _Extras(**out)


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
    checked = _check_call(
        be,
        k,
        k,
        v,
        pos,
        None,
        True,
        feature_map,
        similarity,
        0.0,
        None,
        None,
        True,
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


def _step_values(be: Backend, x: Any, name: str, cdt: DType, k: Array) -> tuple[Array, Any]:
    """An argument of a decoding step in the compute dtype, and its host values where they can be
    read: an array's library, dtype, shape and device were checked with the call's signature."""
    if not is_array(x):
        return _as_array(x, name, be.xp, be, k)
    return (x if x.dtype == cdt else be.xp.astype(x, cdt)), be.readable_values(x)


def _gate_values(be: Backend, x: Any, name: str, cdt: DType, k: Array, kv_lead: tuple[Any, ...]) -> Array:
    """A decoding step's ``log_gate`` (or ``decay``, as its log) in the compute dtype, its values
    checked where they can be read (the shapes were checked with the call's signature)."""
    arr, host = _step_values(be, x, name, cdt, k)
    if host is not None and host.size:
        ok = ((host > 0) & (host <= 1)) if name == "decay" else ((host <= 0) & (host > -math.inf))
        if not ok.all():
            return _gates(
                x if name == "decay" else None, x if name == "log_gate" else None, k, kv_lead, cdt, be
            )
    return be.xp.log(arr) if name == "decay" else arr


def np_isfinite_all(host: Any) -> bool:
    """Every value of a host array is finite."""
    import numpy as np

    return bool(np.isfinite(host).all())


def _extra_values(ex: _Extras, be: Backend, k: Array, cdt: DType) -> _Extras:
    """A decoding step's ``beta``, ``u``, ``a``, ``b`` in the compute dtype, values checked (finite)
    where they can be read (their shapes were checked with the call's signature)."""
    out: list[Any] = []
    for name, x in zip(_Extras._fields, ex, strict=True):
        if x is None:
            out.append(None)
            continue
        arr, host = _step_values(be, x, name, cdt, k)
        if host is not None and host.size and not np_isfinite_all(host):
            raise ValueError(
                f"{name} must be finite, got a {'NaN' if (host != host).any() else 'infinite'} value"
            )
        out.append(arr)
    return _Extras(*out)


def _family_decoder(
    be: Backend, call: _Call, q: Array, k: Array, pos: Any, kv_lead: tuple[Any, ...], F: int
) -> Callable[..., Any] | None:
    """One token of a recurrent family from a state: features, RoPE's decoding plan, the engine's
    :func:`~rotary._math._recurrence.step`; values checked on every call, nothing else.  Returns
    ``None`` (the generic steps) for positions its plan does not cover."""
    fam, plan, r = call.fam, call.plan, call.rope
    assert fam is not None
    xp = be.xp
    dev = be.creation_device(k)
    rot = None
    if r is not None:
        like = pos if is_array(pos) else be.positions(pos, name="pos", device=dev)[0]
        rot = r._decode_plan(be, q, k, like)
        if rot is None:
            return None
    fast_step = be.recurrent_step(fam, plan)

    def decode(
        q: Array, k: Array, v: Array, pos: Any, state: Any, decay: Any, log_gate: Any, extras: _Extras
    ) -> tuple[Array, LinearAttentionState] | None:
        S, _, off = state[:3]
        ld0 = state[3] if len(state) >= 4 else None
        _check_offset(off)
        g = None
        for name, x in (("decay", decay), ("log_gate", log_gate)):
            if x is not None:
                gx = _gate_values(be, x, name, plan.cdt, k, kv_lead)
                if name == "decay":
                    gx = gx[..., None, None] if fam.per_feature else gx[..., None]
                g = gx if g is None else g + gx
        ex = _extra_values(extras, be, k, plan.cdt)
        u = None if ex.u is None else ex.u[..., None, :]
        if fast_step is not None:
            turn = rot
            res_fast = fast_step(
                q, k, v, S, g, ex.beta, ex.a, ex.b, u, None if turn is None else lambda c, e: turn(c, e, pos)
            )
            if res_fast is not None:
                return _decoded(q, res_fast[0], res_fast[1], g, off, ld0)
        qf = _linear.query_features(q, plan, xp)
        kf = _linear.features(k, plan, xp)
        if rot is not None:
            res = rot(qf, kf, pos)
            if res is None:
                return None
            qf, kf = res
        vc = v if v.dtype == plan.cdt else xp.astype(v, plan.cdt)
        S0 = S if S.dtype == plan.cdt else xp.astype(S, plan.cdt)
        rec = _recurrence.Rec(qf, kf, vc, g, ex.beta, ex.a, ex.b, u, None)
        o, carry = _recurrence.step(rec, _recurrence.Carry(S0, None), fam, xp, dev)
        assert o is not None
        return _decoded(q, o, carry.S, g, off, ld0)

    def _decoded(
        q: Array, o: Array, St: Array, g: Any, off: Any, ld0: Any
    ) -> tuple[Array, LinearAttentionState]:
        o = o if o.dtype == q.dtype else xp.astype(o, q.dtype)
        ld = None
        if fam.rank is None and g is not None:
            ld = g[..., 0, :] if fam.per_feature else g[..., 0]
            if ld0 is not None:
                ld = ld0[..., None] + ld if fam.per_feature and ld0.ndim == ld.ndim - 1 else ld0 + ld
        if tuple(St.shape[:-2]) != tuple(kv_lead) or (
            ld is not None and tuple(ld.shape[: len(kv_lead)]) != tuple(kv_lead)
        ):
            return o, _state(St, None, off + 1, kv_lead, xp, ld)._replace(
                transition=NOT_COMPUTED if fam.rank is not None else None
            )
        return o, LinearAttentionState(St, None, off + 1, ld, NOT_COMPUTED if fam.rank is not None else None)

    return decode
