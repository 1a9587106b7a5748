"""Rotary's linear attention inside a loaded ``transformers`` model: the machinery of
:func:`rotary.hf.patch_linear_attention`.

Torch-free (the model is duck-typed, the tensors go through their array-API namespace).  A
linear-attention layer is found by what its code calls: a method of its class that calls one of
transformers' recurrence functions by name (``torch_chunk_gated_delta_rule``,
``chunk_kimi_delta_attention``, ``mamba2_chunk_scan``, ``mamba_selective_scan``... looked up in
the globals of its modeling module), or MiniMax's lightning attention, whose block loop is
written inside its ``forward``.  A served layer gets, on the instance, a copy of its class's
method whose calls to those names go to rotary's functions of the same signature and meaning
(everything else stays transformers' own code: projections, convolutions, gates, norms, the
cache); MiniMax's layer gets rotary's ``forward``.  Nothing global changes: the modeling module's
functions, other models of the same class and other layers are untouched.

Before anything is replaced, rotary's function is called beside transformers' own torch
function (the reference its kernel decorators wrap) on probe inputs, and the layer is refused
with the reason where they differ; a family rotary cannot express is refused by name.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import re
import types
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from ._hf_patch import _model_type, _tensor, _text_config
from ._lib._compat import array_namespace, device, to_numpy
from ._linear import LinearAttentionState, linear_attention

#: The probes' tolerance, relative to the largest value (float32 rounding through a few
#: hundred operations; a wrong formula is off by far more).
_PROBE_TOL = 2.0**-13


# -- rotary's versions of transformers' recurrence functions -------------------------------------
def _f32(xp: Any, x: Any) -> Any:
    return x if x.dtype == xp.float32 else xp.astype(x, xp.float32)


def _dense(xp: Any, x: Any) -> Any:
    """``x`` with its values in row-major order (transformers' callers ``view`` what these
    functions return): a reshape to one axis copies only what is not already laid out so."""
    return xp.reshape(xp.reshape(x, (-1,)), tuple(x.shape))


def _softplus(xp: Any, x: Any) -> Any:
    """torch's ``F.softplus`` (beta 1, threshold 20)."""
    return xp.where(x > 20.0, x, xp.log1p(xp.exp(xp.clip(x, max=20.0))))


def _silu(xp: Any, x: Any) -> Any:
    return x / (1.0 + xp.exp(-x))


def _sigmoid(xp: Any, x: Any) -> Any:
    return 1.0 / (1.0 + xp.exp(-x))


def delta_rule(
    query: Any,
    key: Any,
    value: Any,
    g: Any,
    beta: Any,
    chunk_size: int | None = None,
    initial_state: Any = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    cu_seqlens: Any = None,
    **kwargs: Any,
) -> tuple[Any, Any]:
    """transformers' ``torch_chunk_gated_delta_rule`` / ``torch_recurrent_gated_delta_rule``
    (Gated DeltaNet: ``g`` per token ``(B, N, Hv)``) and ``chunk_kimi_delta_attention`` /
    ``recurrent_kimi_delta_attention`` (KDA: ``g`` per key feature ``(B, N, H, d_k)``) on
    :func:`rotary.linear_attention`: q, k ``(B, N, Hk, d_k)``, v ``(B, N, Hv, d_v)`` with ``Hv``
    a multiple of ``Hk`` (each key head serves ``Hv / Hk`` consecutive value heads: broadcast,
    not repeated), queries scaled by ``d_k ** -0.5``, states ``(B, Hv, d_k, d_v)`` in float32;
    ``cu_seqlens`` (flash-linear-attention's packed documents, which transformers' torch code
    refuses) served.  Returns ``(out, final state or None)``, ``out`` in the query's dtype."""
    xp = array_namespace(query, key, value)
    b, n, hk, dk = key.shape
    hv, dv = value.shape[-2:]
    grp = hv // hk
    q = xp.permute_dims(_f32(xp, query), (0, 2, 1, 3))[:, :, None, ...]
    k = xp.permute_dims(_f32(xp, key), (0, 2, 1, 3))[:, :, None, ...]
    k = xp.broadcast_to(k, (b, hk, grp, n, dk))  # (a gate and beta per value head: per key)
    v = xp.permute_dims(xp.reshape(_f32(xp, value), (b, n, hk, grp, dv)), (0, 2, 3, 1, 4))
    if g.ndim == 4:  # a gate per key feature (KDA)
        lg = xp.permute_dims(xp.reshape(_f32(xp, g), (b, n, hk, grp, dk)), (0, 2, 3, 1, 4))
    else:
        lg = xp.permute_dims(xp.reshape(_f32(xp, g), (b, n, hk, grp)), (0, 2, 3, 1))
    bt = xp.permute_dims(xp.reshape(_f32(xp, beta), (b, n, hk, grp)), (0, 2, 3, 1))
    state = None
    if initial_state is not None:
        state = LinearAttentionState(xp.reshape(_f32(xp, initial_state), (b, hk, grp, dk, dv)), None, 0)
    out, st = linear_attention(
        q,
        k,
        v,
        causal=True,
        normalize=False,
        log_gate=lg,
        beta=bt,
        qk_l2norm=bool(use_qk_l2norm_in_kernel),
        scale=dk**-0.5,
        chunk_size=chunk_size,
        state=state,
        return_state=True,
        cu_seqlens=cu_seqlens,
    )
    out = _dense(xp, xp.reshape(xp.permute_dims(out, (0, 3, 1, 2, 4)), (b, n, hv, dv)))
    if out.dtype != query.dtype:
        out = xp.astype(out, query.dtype)
    if not output_final_state:
        return out, None
    S = st.S
    if cu_seqlens is not None:  # (b, hk, grp, docs, dk, dv) -> (docs, hv, dk, dv), as flash-linear-attention
        docs = S.shape[3]
        return out, _dense(xp, xp.reshape(xp.permute_dims(S[0, ...], (2, 0, 1, 3, 4)), (docs, hv, dk, dv)))
    return out, _dense(xp, xp.reshape(S, (b, hv, dk, dv)))


def ssd_chunk_scan(
    hidden_states: Any,
    dt: Any,
    A: Any,
    B: Any,
    C: Any,
    chunk_size: int | None = None,
    D: Any = None,
    dt_bias: Any = None,
    initial_states: Any = None,
    dt_softplus: bool = False,
    dt_limit: tuple[float, float] = (0.0, math.inf),
    return_final_states: bool = False,
    z: Any = None,
    seq_idx: Any = None,
    **kwargs: Any,
) -> Any:
    """transformers' ``mamba2_chunk_scan`` (Mamba-2's SSD, the layer of its hybrids) on
    :func:`rotary.linear_attention`: per head ``h``, the state ``(d_state, head_dim)`` of keys
    ``B``, values ``dt * x`` and queries ``C`` (the heads of a group share them: broadcast),
    decayed by ``exp(dt * A_h)`` per token, plus the ``D`` skip (and ``* silu(z)`` when given).
    x ``(B, N, H, P)``, dt ``(B, N, H)``, B and C ``(B, N, G, d_state)``, states ``(B, H, P,
    d_state)``; ``seq_idx`` (documents, as mamba_ssm's) served as ``segment_ids``.  Returns the
    output in float32 (as transformers'), with the final state when asked."""
    xp = array_namespace(hidden_states, dt, B, C)
    b, n, h, p = hidden_states.shape
    groups, ns = B.shape[2], B.shape[3]
    hg = h // groups
    dt = _f32(xp, dt)
    if dt_bias is not None:
        dt = dt + _f32(xp, dt_bias)
    if dt_softplus:
        dt = _softplus(xp, dt)
    dt = xp.clip(dt, min=float(dt_limit[0]), max=float(dt_limit[1]))
    x = _f32(xp, hidden_states)
    v = xp.permute_dims(xp.reshape(x * dt[..., None], (b, n, groups, hg, p)), (0, 2, 3, 1, 4))
    q = xp.permute_dims(_f32(xp, C), (0, 2, 1, 3))[:, :, None, ...]
    k = xp.permute_dims(_f32(xp, B), (0, 2, 1, 3))[:, :, None, ...]
    k = xp.broadcast_to(k, (b, groups, hg, n, ns))
    lg = xp.permute_dims(xp.reshape(dt * _f32(xp, A), (b, n, groups, hg)), (0, 2, 3, 1))
    state = None
    if initial_states is not None:
        S0 = xp.permute_dims(_f32(xp, initial_states), (0, 1, 3, 2))
        state = LinearAttentionState(xp.reshape(S0, (b, groups, hg, ns, p)), None, 0)
    out, st = linear_attention(
        q,
        k,
        v,
        causal=True,
        normalize=False,
        log_gate=lg,
        chunk_size=chunk_size,
        state=state,
        return_state=True,
        segment_ids=seq_idx,
    )
    out = xp.reshape(xp.permute_dims(out, (0, 3, 1, 2, 4)), (b, n, h, p))
    if D is not None:
        out = out + _f32(xp, D)[:, None] * x
    if z is not None:
        out = out * _silu(xp, _f32(xp, z))
    out = _dense(xp, out)
    if not return_final_states:
        return out
    return out, _dense(xp, xp.permute_dims(xp.reshape(st.S, (b, h, ns, p)), (0, 1, 3, 2)))


def _step(xp: Any, state: Any, q: Any, k: Any, v: Any, lg: Any, shape: tuple[int, ...]) -> tuple[Any, Any]:
    """One token of a per-feature-gated state ``S (..., F, 1)`` (``state`` reshaped to
    ``shape``): the output ``(..., 1, 1)``; ``state`` updated in place, as transformers' kernels."""
    S0 = xp.reshape(_f32(xp, state), shape)
    out, st = linear_attention(
        q,
        k,
        v,
        causal=True,
        normalize=False,
        log_gate=lg,
        state=LinearAttentionState(S0, None, 0),
        return_state=True,
    )
    new = xp.reshape(st.S, tuple(state.shape))
    state[...] = new if new.dtype == state.dtype else xp.astype(new, state.dtype)
    return out, new


def ssd_state_update(
    state: Any,
    hidden_states: Any,
    dt: Any,
    A: Any,
    B: Any,
    C: Any,
    D: Any = None,
    dt_bias: Any = None,
    dt_softplus: bool = False,
    z: Any = None,
    **kwargs: Any,
) -> Any:
    """transformers' ``mamba2_selective_state_update`` (one decoding step of the SSD, the state
    ``(B, H, P, d_state)`` updated in place) on :func:`rotary.linear_attention`: x, dt
    ``(B, H, P)``, A ``(H, P, d_state)``, B and C ``(B, G, d_state)``, D and dt_bias ``(H, P)``
    (transformers expands them per head; every entry is served: each ``(head, p)`` is one head
    of rotary's with a gate per key feature)."""
    xp = array_namespace(hidden_states, dt, B, C)
    b, h, p = hidden_states.shape
    groups, ns = B.shape[1], B.shape[2]
    hg = h // groups
    dt = _f32(xp, dt)
    if dt_bias is not None:
        dt = dt + _f32(xp, dt_bias)
    if dt_softplus:
        dt = _softplus(xp, dt)
    x = _f32(xp, hidden_states)
    lead = (b, groups, hg, p)
    lg = xp.reshape(dt[..., None] * _f32(xp, A), (*lead, 1, ns))
    v = xp.reshape(x * dt, (*lead, 1, 1))
    k = xp.broadcast_to(xp.reshape(_f32(xp, B), (b, groups, 1, 1, 1, ns)), (*lead, 1, ns))
    q = xp.broadcast_to(xp.reshape(_f32(xp, C), (b, groups, 1, 1, 1, ns)), (*lead, 1, ns))
    out, _ = _step(xp, state, q, k, v, lg, (*lead, ns, 1))
    out = xp.reshape(out, (b, h, p))
    if D is not None:
        out = out + x * _f32(xp, D)
    if z is not None:
        out = out * _silu(xp, _f32(xp, z))
    return _dense(xp, xp.astype(out, hidden_states.dtype))


def selective_scan(
    hidden_states: Any,
    dt: Any,
    A: Any,
    B: Any,
    C: Any,
    D: Any = None,
    z: Any = None,
    delta_bias: Any = None,
    delta_softplus: bool = False,
    return_last_state: bool = False,
    **kwargs: Any,
) -> Any:
    """transformers' ``mamba_selective_scan`` (Mamba's selective SSM: a state ``(d_state,)``
    per channel, gated per channel and state feature by ``exp(dt A)``) on
    :func:`rotary.linear_attention`: each channel is a head of rotary's, with keys ``B`` and
    queries ``C`` shared by every channel (broadcast), one value ``dt * x``, a gate per key
    feature; plus the ``D`` skip and ``* silu(z)``.  x, dt, z ``(B, d, N)``, A ``(d, d_state)``,
    B and C ``(B, d_state, N)``, the state ``(B, d, d_state)``."""
    xp = array_namespace(hidden_states, dt, B, C)
    b, d, n = hidden_states.shape
    ns = A.shape[-1]
    dt = _f32(xp, dt)
    if delta_bias is not None:
        dt = dt + _f32(xp, delta_bias)[:, None]
    if delta_softplus:
        dt = _softplus(xp, dt)
    x = _f32(xp, hidden_states)
    lg = dt[..., None] * _f32(xp, A)[:, None, :]
    v = (x * dt)[..., None]
    k = xp.broadcast_to(xp.permute_dims(_f32(xp, B), (0, 2, 1))[:, None, ...], (b, d, n, ns))
    q = xp.broadcast_to(xp.permute_dims(_f32(xp, C), (0, 2, 1))[:, None, ...], (b, d, n, ns))
    out, st = linear_attention(q, k, v, causal=True, normalize=False, log_gate=lg, return_state=True)
    out = out[..., 0]
    if D is not None:
        out = out + x * _f32(xp, D)[:, None]
    if z is not None:
        out = out * _silu(xp, _f32(xp, z))
    out = _dense(xp, xp.astype(out, hidden_states.dtype))
    if return_last_state:
        return out, _dense(xp, st.S[..., 0])
    return out


def selective_state_update(
    state: Any,
    hidden_states: Any,
    dt: Any,
    A: Any,
    B: Any,
    C: Any,
    D: Any = None,
    dt_bias: Any = None,
    dt_softplus: bool = False,
    z: Any = None,
    **kwargs: Any,
) -> Any:
    """transformers' ``mamba_selective_state_update`` (one decoding step of Mamba's selective
    SSM, the state ``(B, d, d_state)`` updated in place) on :func:`rotary.linear_attention`."""
    xp = array_namespace(hidden_states, dt, B, C)
    b, d = hidden_states.shape
    ns = A.shape[-1]
    dt = _f32(xp, dt)
    if dt_bias is not None:
        dt = dt + _f32(xp, dt_bias)
    if dt_softplus:
        dt = _softplus(xp, dt)
    x = _f32(xp, hidden_states)
    lg = xp.reshape(dt[..., None] * _f32(xp, A), (b, d, 1, ns))
    v = xp.reshape(x * dt, (b, d, 1, 1))
    k = xp.broadcast_to(xp.reshape(_f32(xp, B), (b, 1, 1, ns)), (b, d, 1, ns))
    q = xp.broadcast_to(xp.reshape(_f32(xp, C), (b, 1, 1, ns)), (b, d, 1, ns))
    out, _ = _step(xp, state, q, k, v, lg, (b, d, ns, 1))
    out = xp.reshape(out, (b, d))
    if D is not None:
        out = out + x * _f32(xp, D)
    if z is not None:
        out = out * _silu(xp, _f32(xp, z))
    return _dense(xp, xp.astype(out, hidden_states.dtype))


def no_fused_kernel(*args: Any, **kwargs: Any) -> None:
    """transformers' fused training kernels (``mamba2_split_conv1d_scan_combined``,
    ``mamba_inner_fn``) as their torch fallback: ``None``, so the layer takes its unfused path,
    whose scan is rotary's."""
    return None


def lightning_forward(
    module: Any,
    hidden_states: Any,
    position_embeddings: Any = None,
    attention_mask: Any = None,
    cache: Any = None,
    past_key_values: Any = None,
    **kwargs: Any,
) -> tuple[Any, Any]:
    """MiniMax's ``MiniMaxLightningAttention.forward`` on :func:`rotary.linear_attention`: the
    block loop (and the token loop of decoding) is linear attention with a decay
    ``exp(-slope_rate)`` per head, no denominator (``decay=``, ``normalize=False``); the
    projections, activation, norm, output gate and the cache's ``(B, H, d, d)`` state (``k^T v``,
    rotary's layout) are the layer's own."""
    if cache is None:
        cache = past_key_values
    xp = array_namespace(hidden_states)
    b, n, _ = hidden_states.shape
    h, d = module.num_attention_heads, module.head_dim
    qkv = module.act_fn(module.qkv_proj(hidden_states))
    if attention_mask is not None:
        qkv = qkv * xp.astype(attention_mask, qkv.dtype)[:, :, None]
    qkv = xp.permute_dims(xp.reshape(qkv, (b, n, h, 3 * d)), (0, 2, 1, 3))
    q, k, v = qkv[..., :d], qkv[..., d : 2 * d], qkv[..., 2 * d :]
    previous = None if cache is None else cache.get_linear_cache(module.layer_idx)
    state = None if previous is None else LinearAttentionState(previous, None, 0)
    decay = xp.exp(-_f32(xp, module.slope_rate)[:, 0, 0])
    out, st = linear_attention(
        q, k, v, causal=True, normalize=False, decay=decay, state=state, return_state=True
    )
    out = xp.reshape(xp.permute_dims(out, (0, 2, 1, 3)), (b, n, h * d))
    out = module.norm(out)
    out = _sigmoid(xp, module.output_gate(hidden_states)) * out
    out = module.out_proj(out)
    if cache is not None:
        cache.set_linear_cache(module.layer_idx, st.S)
    return out, st.S


# -- the families ---------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Family:
    """A family of transformers' linear-attention layers.

    ``functions``: transformers' names of its recurrence functions (module globals its layers
    call) and rotary's version of each (``None`` for every one: refused, ``reason`` says why);
    ``probes``: per name, the probe calls rotary's version must agree on.
    """

    name: str
    functions: Mapping[str, Callable[..., Any] | None]
    reason: str = ""
    probes: Mapping[str, Callable[[Any, Any], list[tuple[tuple[Any, ...], dict[str, Any]]]]] = (
        dataclasses.field(default_factory=dict)
    )

    def __post_init__(self) -> None:
        for name in ("functions", "probes"):
            object.__setattr__(self, name, types.MappingProxyType(dict(getattr(self, name))))

    @property
    def served(self) -> bool:
        return not self.reason


def _rand(
    xp: Any, dev: Any, rng: np.random.Generator, *shape: int, low: float = -1.0, high: float = 1.0
) -> Any:
    return xp.asarray(rng.uniform(low, high, size=shape).astype(np.float32), device=dev)


def _delta_probes(per_feature: bool) -> Callable[[Any, Any], list[tuple[tuple[Any, ...], dict[str, Any]]]]:
    def make(xp: Any, dev: Any) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
        rng = np.random.default_rng(0)
        b, n, hk, hv, dk, dv = 2, 11, 2, 2 if per_feature else 4, 8, 6
        q, k = _rand(xp, dev, rng, b, n, hk, dk), _rand(xp, dev, rng, b, n, hk, dk)
        v = _rand(xp, dev, rng, b, n, hv, dv)
        g = _rand(xp, dev, rng, *((b, n, hv, dk) if per_feature else (b, n, hv)), low=-1.0, high=0.0)
        beta = _rand(xp, dev, rng, b, n, hv, low=0.0, high=2.0)  # (OLMo-hybrid's negative eigenvalues)
        S0 = _rand(xp, dev, rng, b, hv, dk, dv)
        calls = [
            ((q, k, v), {"g": g, "beta": beta, "initial_state": S0, "output_final_state": True}),
            (
                (q, k * 0.3, v),
                {"g": g, "beta": beta * 0.5, "initial_state": None, "output_final_state": False},
            ),
            ((q[:, :1], k[:, :1], v[:, :1]), {"g": g[:, :1], "beta": beta[:, :1], "initial_state": S0}),
        ]
        for i, (_, kw) in enumerate(calls):
            kw["use_qk_l2norm_in_kernel"] = i != 1
            kw.setdefault("output_final_state", True)
        return calls

    return make


def _ssd_probes(xp: Any, dev: Any) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    rng = np.random.default_rng(1)
    b, n, h, p, groups, ns = 2, 11, 4, 3, 2, 5
    x, dt = _rand(xp, dev, rng, b, n, h, p), _rand(xp, dev, rng, b, n, h, low=-3.0, high=1.0)
    A = _rand(xp, dev, rng, h, low=-2.0, high=-0.1)
    B, C = _rand(xp, dev, rng, b, n, groups, ns), _rand(xp, dev, rng, b, n, groups, ns)
    D, bias = _rand(xp, dev, rng, h), _rand(xp, dev, rng, h)
    S0 = _rand(xp, dev, rng, b, h, p, ns)
    kw = {"D": D, "dt_bias": bias, "dt_softplus": True, "dt_limit": (0.0, math.inf)}
    return [
        ((x, dt, A, B, C, 4), {**kw, "initial_states": S0, "return_final_states": True}),
        ((x, dt, A, B, C, 64), {**kw, "dt_limit": (0.05, 1.5), "return_final_states": False}),
    ]


def _ssd_step_probes(xp: Any, dev: Any) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    rng = np.random.default_rng(2)
    b, h, p, groups, ns = 2, 4, 3, 2, 5
    x, dt = _rand(xp, dev, rng, b, h, p), _rand(xp, dev, rng, b, h, p, low=-3.0, high=1.0)
    A = _rand(xp, dev, rng, h, p, ns, low=-2.0, high=-0.1)
    B, C = _rand(xp, dev, rng, b, groups, ns), _rand(xp, dev, rng, b, groups, ns)
    D, bias, z = _rand(xp, dev, rng, h, p), _rand(xp, dev, rng, h, p), _rand(xp, dev, rng, b, h, p)
    S0 = _rand(xp, dev, rng, b, h, p, ns)
    return [((S0, x, dt, A, B, C, D), {"dt_bias": bias, "dt_softplus": True, "z": z})]


def _mamba_probes(xp: Any, dev: Any) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    rng = np.random.default_rng(3)
    b, d, n, ns = 2, 6, 11, 5
    x, dt, z = (
        _rand(xp, dev, rng, b, d, n),
        _rand(xp, dev, rng, b, d, n, low=-3.0, high=1.0),
        _rand(xp, dev, rng, b, d, n),
    )
    A = _rand(xp, dev, rng, d, ns, low=-2.0, high=-0.1)
    B, C = _rand(xp, dev, rng, b, ns, n), _rand(xp, dev, rng, b, ns, n)
    D, bias = _rand(xp, dev, rng, d), _rand(xp, dev, rng, d)
    kw = {"D": D, "z": z, "delta_bias": bias, "delta_softplus": True, "return_last_state": True}
    return [((x, dt, A, B, C), kw)]


def _mamba_step_probes(xp: Any, dev: Any) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    rng = np.random.default_rng(4)
    b, d, ns = 2, 6, 5
    x, dt, z = (
        _rand(xp, dev, rng, b, d),
        _rand(xp, dev, rng, b, d, low=-3.0, high=1.0),
        _rand(xp, dev, rng, b, d),
    )
    A = _rand(xp, dev, rng, d, ns, low=-2.0, high=-0.1)
    B, C = _rand(xp, dev, rng, b, ns), _rand(xp, dev, rng, b, ns)
    D, bias = _rand(xp, dev, rng, d), _rand(xp, dev, rng, d)
    S0 = _rand(xp, dev, rng, b, d, ns)
    return [((S0, x, dt, A, B, C, D), {"dt_bias": bias, "dt_softplus": True, "z": z})]


GATED_DELTANET = Family(
    "Gated DeltaNet",
    {"torch_chunk_gated_delta_rule": delta_rule, "torch_recurrent_gated_delta_rule": delta_rule},
    probes={
        "torch_chunk_gated_delta_rule": _delta_probes(False),
        "torch_recurrent_gated_delta_rule": _delta_probes(False),
    },
)
KDA = Family(
    "Kimi Delta Attention",
    {"chunk_kimi_delta_attention": delta_rule, "recurrent_kimi_delta_attention": delta_rule},
    probes={
        "chunk_kimi_delta_attention": _delta_probes(True),
        "recurrent_kimi_delta_attention": _delta_probes(True),
    },
)
SSD = Family(
    "Mamba-2 SSD",
    {
        "mamba2_chunk_scan": ssd_chunk_scan,
        "mamba2_selective_state_update": ssd_state_update,
        "mamba2_split_conv1d_scan_combined": no_fused_kernel,
    },
    probes={"mamba2_chunk_scan": _ssd_probes, "mamba2_selective_state_update": _ssd_step_probes},
)
MAMBA = Family(
    "Mamba selective scan",
    {
        "mamba_selective_scan": selective_scan,
        "mamba_selective_state_update": selective_state_update,
        "mamba_inner_fn": no_fused_kernel,
    },
    probes={"mamba_selective_scan": _mamba_probes, "mamba_selective_state_update": _mamba_step_probes},
)
LIGHTNING = Family("Lightning Attention", {"forward": None})
RWKV = Family(
    "RWKV (v4)",
    {"rwkv_linear_attention": None},
    reason=(
        "RWKV (v4)'s WKV is refused: its form is rotary's normalised linear attention (per channel one "
        "feature exp(k), a decay exp(-exp(w)) and RWKV-6's bonus exp(u)), but transformers keeps it in "
        "log space (numerator, denominator and a running maximum exponent: the cache's three states) "
        "because exp(k) leaves float32's range; rotary's engine sums exp(k) v in linear space and would "
        "overflow where transformers does not"
    ),
)
MLSTM = Family(
    "xLSTM (mLSTM)",
    {"chunkwise_kernel_fn": None},
    reason=(
        "xLSTM's mLSTM is refused: exponential input gates stabilised by a running maximum and the "
        "normaliser max(abs(n^T q), exp(-m)) are not a sum rotary's engine forms"
    ),
)
RGLRU = Family(
    "RG-LRU (Griffin)",
    {"_rnn_scan": None},
    reason=(
        "RecurrentGemma's RG-LRU is refused: an elementwise linear RNN (h_t = a_t h_{t-1} + x_t per "
        "channel: no keys, queries or outer-product state), not a linear attention rotary's engine is "
        "built for"
    ),
)
#: Every family, served first.
FAMILIES: tuple[Family, ...] = (GATED_DELTANET, KDA, SSD, MAMBA, LIGHTNING, RWKV, MLSTM, RGLRU)
_BY_FUNCTION = {name: fam for fam in FAMILIES for name in fam.functions if name != "forward"}
_LIGHTNING = re.compile(r"LightningAttention$")


# -- finding the layers ---------------------------------------------------------------------------
def _names(code: types.CodeType) -> set[str]:
    """Global names a code object (and the functions defined in it) reads."""
    out = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            out |= _names(c)
    return out


def _chain(fn: Any) -> list[Any]:
    """``fn`` and the functions its decorators wrap (``__wrapped__``), outermost first."""
    out = [fn]
    while isinstance(getattr(out[-1], "__wrapped__", None), types.FunctionType) and len(out) < 16:
        out.append(out[-1].__wrapped__)
    return out


def _calls(fn: Any, names: Iterable[str]) -> set[str]:
    """Which of ``names`` a function (through its decorators) reads as globals."""
    wanted = set(names)
    found: set[str] = set()
    for f in _chain(fn):
        code = getattr(f, "__code__", None)
        if code is not None:
            found |= _names(code) & wanted
    return found


def _methods(cls: type) -> dict[str, Any]:
    """The plain functions of a class and its bases (the first in the MRO wins)."""
    out: dict[str, Any] = {}
    for klass in cls.__mro__:
        for name, attr in vars(klass).items():
            if name not in out and isinstance(attr, types.FunctionType):
                out[name] = attr
    return out


@dataclasses.dataclass(frozen=True)
class PatchedLayer:
    """One linear-attention layer that :func:`rotary.hf.patch_linear_attention` serves.

    Attributes
    ----------
    path : str
        Its name in ``model.named_modules()``.
    module_class : str
        Its class name (``"Qwen3NextGatedDeltaNet"``).
    model_type : str or None
        The ``model_type`` of its model's (text) config.
    family : str
        ``"Gated DeltaNet"``, ``"Kimi Delta Attention"``, ``"Mamba-2 SSD"``, ``"Mamba selective
        scan"`` or ``"Lightning Attention"``.
    methods : tuple of str
        The methods replaced on the instance (``("forward",)``).
    functions : tuple of str
        transformers' functions whose calls go to rotary's (``()`` where the whole ``forward``
        is rotary's: MiniMax's).
    """

    path: str
    module_class: str
    model_type: str | None
    family: str
    methods: tuple[str, ...]
    functions: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class LinearPatchReport:
    """What :func:`rotary.hf.patch_linear_attention` did to a model
    (``model.rotary_linear_patch``).

    Attributes
    ----------
    layers : tuple of PatchedLayer
        The layers served, in ``named_modules()`` order.
    kept : tuple of (str, str)
        ``(path, reason)`` of linear-attention layers left as they are (``strict=False`` only).
    """

    layers: tuple[PatchedLayer, ...]
    kept: tuple[tuple[str, str], ...] = ()

    def __str__(self) -> str:
        lines = [f"rotary linear-attention patch: {len(self.layers)} layer(s) served"]
        for m in self.layers:
            what = ", ".join(m.functions) if m.functions else "its forward"
            lines.append(f"  {m.path} ({m.module_class}, {m.model_type}): {m.family}: {what}")
        lines += [f"  kept {path}: {why}" for path, why in self.kept]
        return "\n".join(lines)


@dataclasses.dataclass
class _Plan:
    path: str
    module: Any
    model_type: str | None
    family: Family
    methods: dict[str, tuple[str, ...]]  # method -> the family's names it calls
    reason: str = ""

    def entry(self) -> PatchedLayer:
        names = sorted({n for ns in self.methods.values() for n in ns if n != "forward"})
        return PatchedLayer(
            self.path,
            type(self.module).__name__,
            self.model_type,
            self.family.name,
            tuple(self.methods),
            tuple(names),
        )


def _called(cls: type, seen: dict[type, dict[str, tuple[str, ...]]]) -> dict[str, tuple[str, ...]]:
    """The methods of ``cls`` that call a family's functions, with the names they call (memoised
    in ``seen``: one scan per class)."""
    if cls not in seen:
        found: dict[str, tuple[str, ...]] = {}
        for name, fn in _methods(cls).items():
            called = _calls(fn, _BY_FUNCTION)
            if called:
                found[name] = tuple(sorted(called))
        seen[cls] = found
    return seen[cls]


def _family_of(
    module: Any, seen: dict[type, dict[str, tuple[str, ...]]]
) -> tuple[Family, dict[str, tuple[str, ...]]] | None:
    """The family of a linear-attention layer, with the methods that call its functions."""
    cls = type(module)
    if _LIGHTNING.search(cls.__name__) and "slope_rate" in getattr(module, "_buffers", {}):
        return LIGHTNING, {"forward": ("forward",)}
    if callable(getattr(cls, "_rnn_scan", None)):
        return RGLRU, {"_rnn_scan": ("_rnn_scan",)}
    if callable(getattr(module, "chunkwise_kernel_fn", None)) and callable(
        getattr(module, "step_kernel_fn", None)
    ):
        return MLSTM, {"forward": ("chunkwise_kernel_fn",)}
    found = _called(cls, seen)
    if not found:
        return None
    fams = {_BY_FUNCTION[c].name for names in found.values() for c in names}
    if len(fams) != 1:
        raise ValueError(f"{cls.__name__} calls the recurrences of several families ({sorted(fams)})")
    fam = next(f for f in FAMILIES if f.name in fams)
    return fam, found


def plan(model: Any) -> list[_Plan]:
    """Every linear-attention layer of ``model``: its family and what rotary replaces, or why not."""
    if not callable(getattr(model, "named_modules", None)):
        raise TypeError(f"model must be a transformers (torch) model, got {type(model).__name__}")
    model_type = _model_type(_text_config(getattr(model, "config", None)))
    probed: dict[tuple[int, str], str] = {}
    seen: dict[type, dict[str, tuple[str, ...]]] = {}
    out = []
    for path, module in model.named_modules():
        found = _family_of(module, seen)
        if found is None:
            continue
        fam, methods = found
        if installed(module):
            raise ValueError(
                f"{path or type(model).__name__} is already patched: call "
                "rotary.hf.unpatch_linear_attention(model) first"
            )
        p = _Plan(path, module, model_type, fam, methods, fam.reason)
        if fam.served:
            p.reason = _check(p, model, probed)
        out.append(p)
    return out


def _check(p: _Plan, model: Any, probed: dict[tuple[int, str], str]) -> str:
    """Why the layer of plan ``p`` cannot be served (``""``: it can), probing each function it
    calls against transformers' own (once per function object)."""
    module = p.module
    for attr in p.methods:
        target = "_old_forward" if attr == "forward" and "_old_forward" in module.__dict__ else attr
        held = module.__dict__.get(target)
        own = getattr(held, "__func__", None) is getattr(type(module), attr, None)
        if held is not None and not (own and getattr(held, "__self__", None) is module):
            what = type(held).__name__
            return f"its {attr} is replaced on the instance ({what}): rotary does not know what that computes"
    t = _tensor(module, model)
    if t is None:
        return "it holds no tensor to probe with"
    if p.family is LIGHTNING:
        return _probe_lightning(module, t)
    for attr, names in p.methods.items():
        glb = _chain(_methods(type(module))[attr])[-1].__globals__
        for name in names:
            ref = glb.get(name)
            if ref is None:
                return f"its {attr} calls {name}, which its module does not define"
            key = (id(ref), name)
            if key not in probed:
                probed[key] = _probe_function(p.family, name, ref, t)
            if probed[key]:
                return probed[key]
    return ""


def _reference(fn: Any) -> Any:
    """transformers' torch function under its kernel decorators (``__wrapped__``)."""
    return _chain(fn)[-1]


def _leaves(x: Any) -> list[Any]:
    if isinstance(x, (tuple, list)):
        return [y for item in x for y in _leaves(item)]
    return [x]


def _differ(got: Any, want: Any, tol: float = _PROBE_TOL) -> str:
    """Where two results (arrays, ``None``, tuples of them) differ beyond ``tol`` (relative)."""
    g, w = _leaves(got), _leaves(want)
    if len(g) != len(w):
        return f"returns {len(g)} values, transformers' {len(w)}"
    for i, (a, b) in enumerate(zip(g, w, strict=True)):
        if (a is None) != (b is None):
            return f"value {i} is {'None' if a is None else 'an array'} where transformers' is not"
        if a is None:
            continue
        a, b = _host(a), _host(b)
        if a.shape != b.shape:
            return f"value {i} has shape {a.shape}, transformers' {b.shape}"
        scale = max(1.0, float(np.abs(b).max(initial=0.0)))
        err = float(np.abs(a - b).max(initial=0.0))
        if not err <= tol * scale:  # (NaN fails)
            return f"value {i} differs from transformers' by {err:.3g} (scale {scale:.3g})"
    return ""


def _host(x: Any) -> np.ndarray:
    detach = getattr(x, "detach", None)
    return np.asarray(to_numpy(detach() if callable(detach) else x), dtype=np.float64)


def _copy(x: Any) -> Any:
    """A fresh copy of an array argument (in-place kernels update their state)."""
    return x if not hasattr(x, "shape") else array_namespace(x).asarray(x, copy=True)


def _probe_function(fam: Family, name: str, ref: Any, t: Any) -> str:
    ours = fam.functions[name]
    make = fam.probes.get(name)
    if ours is None or make is None:
        return ""
    torch_fn = _reference(ref)
    xp = array_namespace(t)
    for args, kwargs in make(xp, device(t)):
        a1 = tuple(_copy(a) for a in args)
        a2 = tuple(_copy(a) for a in args)
        try:
            want = torch_fn(*a1, **kwargs)
            got = ours(*a2, **kwargs)
        except Exception as e:  # (whatever either raises: the reason it is refused)
            return f"probing {name} failed ({type(e).__name__}: {e})"
        why = _differ((got, a2[0]), (want, a1[0]))
        if why:
            return f"rotary's {name} does not match transformers' on probe inputs: {why}"
    return ""


def _probe_lightning(module: Any, t: Any) -> str:
    w = getattr(getattr(module, "qkv_proj", None), "weight", None)
    if w is None or not all(
        hasattr(module, a) for a in ("num_attention_heads", "head_dim", "act_fn", "norm")
    ):
        return (
            "it lacks the attributes of MiniMax's lightning attention (qkv_proj, num_attention_heads, "
            "head_dim...)"
        )
    xp = array_namespace(t)
    rng = np.random.default_rng(5)
    x = xp.asarray(rng.uniform(-1, 1, size=(2, 9, int(w.shape[1]))).astype(np.float32), device=device(t))
    try:
        # (a float32 copy: transformers' loop runs in the model's dtype, rotary's sums in float32)
        probe = copy.deepcopy(module).float()
        want = type(module).forward(probe, x, None, None)
        got = lightning_forward(probe, x, None, None)
    except Exception as e:  # (whatever either raises: the reason it is refused)
        return f"probing its forward failed ({type(e).__name__}: {e})"
    # (weights cast to a narrower dtype than float32 differ from rotary's decays by their rounding)
    eps = [float(xp.finfo(w.dtype).eps) for w in (*module.parameters(), *module.buffers()) if _real(xp, w)]
    why = _differ(got, want, max([_PROBE_TOL, *(4.0 * e for e in eps)]))
    return f"rotary's forward does not match the layer's on probe inputs: {why}" if why else ""


def _real(xp: Any, t: Any) -> bool:
    return bool(xp.isdtype(t.dtype, "real floating"))


def refusal(model: Any, refused: Iterable[_Plan]) -> str:
    """The error of layers rotary cannot serve: each named, with its family and the reason."""
    lines = [
        f"  {p.path} ({type(p.module).__name__}, model type {p.model_type!r}, {p.family.name}): {p.reason}"
        for p in refused
    ]
    return (
        f"rotary cannot serve {len(lines)} linear-attention layer(s) of {type(model).__name__}:\n"
        + "\n".join(lines)
        + "\npass strict=False to serve the others and leave these as they are (listed in "
        "model.rotary_linear_patch.kept)"
    )


# -- installing -----------------------------------------------------------------------------------
def rebind(fn: Any, over: Mapping[str, Any]) -> Any:
    """A copy of ``fn`` whose global lookups of ``over``'s names give ``over``'s values; its
    decorators (closures over the function they wrap, ``functools.wraps``) are copied around it.

    The copy's globals are a plain dict: the modeling module's globals as they are when the copy
    is made (at the layer's first call after patching), then ``over`` (``torch.compile`` reads a
    function's globals as a dict)."""
    inner = getattr(fn, "__wrapped__", None)
    if isinstance(inner, types.FunctionType) and fn.__closure__:
        cells = list(fn.__closure__)
        for i, cell in enumerate(cells):
            try:
                held = cell.cell_contents
            except ValueError:  # (an empty cell)
                continue
            if held is inner:
                new_inner = rebind(inner, over)
                cells[i] = types.CellType(new_inner)
                new = _function(fn, fn.__globals__, tuple(cells))
                new.__wrapped__ = new_inner
                return new
    glb = {k: v for k, v in fn.__globals__.items() if k != "__name__"}  # (not the module's dict:
    # torch.compile reads an unnamed scope as a dict, a named one as the module's attributes)
    return _function(fn, {**glb, **over}, fn.__closure__)


def _function(fn: Any, glb: dict[str, Any], closure: Any) -> Any:
    new = types.FunctionType(fn.__code__, glb, fn.__name__, fn.__defaults__, closure)
    new.__kwdefaults__ = fn.__kwdefaults__
    new.__dict__.update(fn.__dict__)
    new.__qualname__, new.__doc__, new.__module__ = fn.__qualname__, fn.__doc__, fn.__module__
    return new


class LinearForward:
    """What a served layer's method becomes on the instance: its class's own code with the
    family's recurrence calls going to rotary's (or MiniMax's forward, rotary's own).

    Picklable (a plain object of plain values: the copy of the method is rebuilt when needed),
    so a patched model pickles and deep-copies.
    """

    def __init__(self, entry: PatchedLayer, attr: str, target: str, module: Any, previous: Any) -> None:
        self.entry = entry
        self.attr = attr  # the method of the class it stands for
        self.target = target  # the instance attribute it sits in (accelerate's ``_old_forward``)
        self.module = module
        self.previous = previous  # what the instance held there before (restored by unpatch)
        self.owner: Any = None  # (the model whose rotary_linear_patch reports it)
        self._fn: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_fn": None}

    def function(self) -> Any:
        """The function this calls with the module first."""
        if self._fn is None:
            if self.entry.family == LIGHTNING.name:
                self._fn = lightning_forward
            else:
                fam = next(f for f in FAMILIES if f.name == self.entry.family)
                self._fn = rebind(_methods(type(self.module))[self.attr], fam.functions)
        return self._fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.function()(self.module, *args, **kwargs)


def install(plans: Iterable[_Plan], owner: Any) -> list[PatchedLayer]:
    """Replace each planned layer's methods on the instance (after every check passed)."""
    out = []
    for p in plans:
        entry = p.entry()
        for attr in p.methods:
            target = "_old_forward" if attr == "forward" and "_old_forward" in p.module.__dict__ else attr
            fwd = LinearForward(entry, attr, target, p.module, p.module.__dict__.get(target))
            fwd.owner = owner
            setattr(p.module, target, fwd)
        out.append(entry)
    return out


def installed(module: Any) -> list[LinearForward]:
    """Rotary's methods on ``module``'s instance."""
    return [f for f in vars(module).values() if isinstance(f, LinearForward)]


def uninstall(model: Any) -> int:
    """Restore every served layer's own methods; the number of layers restored.  Each owner's
    report then lists only the layers still served, and goes when none is."""
    n = 0
    owners: dict[int, Any] = {}
    for _, module in model.named_modules():
        found = installed(module)
        for fwd in found:
            if fwd.previous is None:
                delattr(module, fwd.target)
            else:
                setattr(module, fwd.target, fwd.previous)
            if fwd.owner is not None:
                owners[id(fwd.owner)] = fwd.owner
        n += bool(found)
    for owner in (*owners.values(), *(m for _, m in model.named_modules())):
        _refresh_report(owner)
    return n


def _refresh_report(owner: Any) -> None:
    rep = getattr(owner, "__dict__", {}).get("rotary_linear_patch")
    if not isinstance(rep, LinearPatchReport):
        return
    live = {path for path, m in owner.named_modules() if any(f.owner is owner for f in installed(m))}
    keep = tuple(m for m in rep.layers if m.path in live)
    if not keep:
        del owner.__dict__["rotary_linear_patch"]
    elif len(keep) != len(rep.layers):
        owner.__dict__["rotary_linear_patch"] = dataclasses.replace(rep, layers=keep)
