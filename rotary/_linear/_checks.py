"""Every check of a call that depends on the arguments' types, shapes, dtypes and devices only, kept per
signature.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from .._backends import Backend
from .._lib import _validation as chk
from .._lib._compat import is_array
from .._lib._typing import Array
from .._math import _linear
from .._rope import Rotary, default_rope
from ._args import (
    NO_EXTRAS,
    _Call,
    _check_even,
    _check_rope_positions,
    _check_static,
    _extra_arrays,
    _Extras,
    _family,
    _host_ndim,
    _key_mask,
    _n_docs,
    _plan,
    _sizes,
    _state_arrays,
    _width,
)
from ._decode import _decoder, _family_decoder


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


def _check_keys(
    be: Backend,
    k: Array,
    v: Array,
    pos: Any,
    feature_map: Any,
    similarity: Any,
    key_mask: Any,
    rope: Any,
    normalize: Any,
    decay: Any,
    log_gate: Any,
    cu_seqlens: Any,
    segment_ids: Any,
    extras: _Extras | None,
    qk_l2norm: Any,
    scale: Any = None,
) -> _Checked:
    """The checks of :func:`linear_attention_state`: those of a causal call returning its state
    whose queries are the keys."""
    return _check_call(
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
