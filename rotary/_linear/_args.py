"""Linear attention's arguments: feature maps, gates, the recurrent families' keywords, states and
positions, each checked (values where they can be read), and the call's static configuration.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Callable
from typing import Any, NamedTuple

from .._backends import Backend, backend_for
from .._lib import _validation as chk
from .._lib._compat import array_namespace, is_array, library_name, not_an_array
from .._lib._typing import Array, Device, DType, Namespace, Similarity
from .._math import _linear, _recurrence
from .._rope import Rotary

FEATURE_MAPS = _linear.FEATURE_MAPS


_SIMILARITIES: tuple[Similarity, ...] = ("dot", "cosine")


#: Chunk length ``C`` of the causal algorithm, and chunks per streamed part.
_CHUNK, _PART_CHUNKS = 64, 8


#: Chunks per streamed part of the recurrent families (gates per feature: their pairwise terms
#: are ``F`` times larger).
_REC_PART_CHUNKS, _REC_PART_CHUNKS_FEATURE = 2, 1


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
    its values where they can be read (``None`` elsewhere): a tuple of Python floats for Python
    values, read before they become an array (``torch.compile`` traces NumPy's operations as
    tensors, whose values a check cannot branch on), host NumPy values of an array."""
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
    values = chk.python_numbers(x, name)
    import numpy as np

    host = np.asarray(x, dtype=np.float64)
    return be.to_device(host, be.compute_dtype(like.dtype), be.creation_device(like)), values


def _per_feature(log_gate: Any, k: Array) -> bool:
    """A log-gate per token and key feature: as many axes as ``k`` (one per token has one fewer)."""
    if log_gate is None:
        return False
    nd = log_gate.ndim if is_array(log_gate) else _host_ndim(log_gate)
    return bool(nd == k.ndim)


def _host_ndim(x: Any) -> int:
    """The axes of a Python number or (nested) sequence, counted in Python (``torch.compile``
    traces NumPy's functions, and refuses ``np.ndim``'s int: issue 50)."""
    n = 0
    while isinstance(x, (list, tuple)):
        n += 1
        if not x:
            break
        x = x[0]
    return n


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
        bad = chk.first_bad(host, lambda h: (h > 0) & (h <= 1))
        if bad is not None:
            raise ValueError(f"decay must lie in (0, 1] (a factor per step), got {bad!r}")
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
        # (host arrays by reductions first, not a mask of every value: no copy of the gates' size)
        bad = chk.first_bad(host, lambda h: h <= 0, fine=lambda h: h.max() <= 0)
        if bad is not None:
            raise ValueError(
                f"log_gate must be <= 0 and finite (the log of a factor in (0, 1]), got {bad!r}; "
                "pass log(sigmoid(x)) for a sigmoid gate"
            )
        if chk.first_bad(host, lambda h: h > -math.inf, fine=lambda h: h.min() > -math.inf) is not None:
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
        _finite(name, host)
        out[name] = arr if arr.dtype == cdt else xp.astype(arr, cdt)
    return _Extras(**out)


def _finite(name: str, host: Any) -> None:
    """Refuse a NaN or an infinite value among ``name``'s readable values (``host``: Python values
    as Python values, issue 50; ``None``: unreadable, unchecked)."""
    bad = chk.first_bad(host, chk.finite)
    if bad is not None:
        raise ValueError(f"{name} must be finite, got a {'NaN' if bad != bad else 'infinite'} value")


def _eager_extras(ex: _Extras, be: Backend, k: Array) -> _Extras:
    """``beta``, ``u``, ``a``, ``b`` as arrays (traced by the compiled call), values checked here."""
    out: list[Any] = []
    for name, x in zip(_Extras._fields, ex, strict=True):
        if x is None:
            out.append(None)
            continue
        arr, host = _as_array(x, name, be.xp, be, k)
        _finite(name, host)
        out.append(arr)
    return _Extras(*out)
