"""Decoding steps: the shortcuts of one token from a state, their values checked on every call."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from .._backends import Backend
from .._lib import _validation as chk
from .._lib._compat import is_array
from .._lib._typing import Array, DType
from .._math import _linear, _recurrence
from .._rope import Rotary
from ._args import _as_array, _Call, _check_offset, _Extras, _finite, _gates
from ._state import NOT_COMPUTED, LinearAttentionState, _state


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


def _step_values(
    be: Backend, x: Any, name: str, cdt: DType, k: Array, fine: Callable[[float, float], bool]
) -> tuple[Array, Any]:
    """An argument of a decoding step in the compute dtype, and the host values to check one by
    one: a Python value's, or an array's where its range (``fine(lo, hi)``, one reduction) does
    not pass (``None``: it passes, or cannot be read).  An array's library, dtype, shape and
    device were checked with the call's signature."""
    if not is_array(x):
        return _as_array(x, name, be.xp, be, k)
    arr = x if x.dtype == cdt else be.xp.astype(x, cdt)
    rng = be.value_range(x)
    return arr, (None if rng is None or fine(*rng) else be.readable_values(x))


def _gate_values(be: Backend, x: Any, name: str, cdt: DType, k: Array, kv_lead: tuple[Any, ...]) -> Array:
    """A decoding step's ``log_gate`` (or ``decay``, as its log) in the compute dtype, its values
    checked where they can be read (the shapes were checked with the call's signature)."""
    if name == "decay":
        ok, fine = (lambda h: (h > 0) & (h <= 1)), (lambda lo, hi: lo > 0 and hi <= 1)
    else:
        ok, fine = (lambda h: (h <= 0) & (h > -math.inf)), (lambda lo, hi: hi <= 0 and lo > -math.inf)
    # (Python values as Python values: issue 50; a host array by its range first, NaN failing it)
    arr, host = _step_values(be, x, name, cdt, k, fine)
    if chk.first_bad(host, ok) is not None:
        return _gates(x if name == "decay" else None, x if name == "log_gate" else None, k, kv_lead, cdt, be)
    return be.xp.log(arr) if name == "decay" else arr


def _finite_range(lo: float, hi: float) -> bool:
    return -math.inf < lo and hi < math.inf


def _extra_values(ex: _Extras, be: Backend, k: Array, cdt: DType) -> _Extras:
    """A decoding step's ``beta``, ``u``, ``a``, ``b`` in the compute dtype, values checked (finite)
    where they can be read (their shapes were checked with the call's signature)."""
    out: list[Any] = []
    for name, x in zip(_Extras._fields, ex, strict=True):
        if x is None:
            out.append(None)
            continue
        arr, host = _step_values(be, x, name, cdt, k, _finite_range)
        _finite(name, host)
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
