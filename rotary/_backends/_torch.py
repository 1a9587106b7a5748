"""torch: eager CPU fast paths, ``torch.compile``/``torch.export`` constants, loop-free causal scan.

Constants and context
    Constants are built from host NumPy outside every dispatch mode and inference mode (plain
    tensors), and stored only in a plain eager scope (:func:`_clean`; the rule lives in
    :mod:`rotary._lib._cache`).  Read under a fake mode that refuses real tensors (shape
    inference), a stored constant is handed out as its fake counterpart; under ``torch.export``
    it stays real and is lifted.  Under ``torch.compile``, :meth:`TorchBackend.constant` and
    :meth:`TorchBackend.eager` go through functions marked
    :func:`torch.compiler.assume_constant_result`: Dynamo calls them for real at trace time with
    the configuration's plain field values and embeds the result, so no host-side NumPy work is
    ever traced.  No tensor is created at import time.

Eager fast paths
    On CPU without autograd the rotation and the exact angles' gathers write into one
    preallocated output block by block (:mod:`rotary._backends._eager`), bit-identical to
    the generic code.  Under ``torch.compile`` the generic code is traced and fused instead.

Causal linear attention
    Under ``torch.compile`` the exclusive prefix sum over chunks is a cumulative sum over all
    chunks at once (no Python loop to unroll), so one graph serves every sequence length.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import operator
import os
import sys
import threading
from collections.abc import Callable, Hashable, Iterator
from typing import Any

import array_api_compat.torch as torch_xp
import numpy as np
import torch
import torch.autograd.forward_ad as _forward_ad

from .._lib import _validation as v
from .._lib._cache import fast_paths_enabled, get_or_build, register_library
from .._lib._process import after_fork_in_child, load
from .._lib._typing import Array, Device, DType, Layout, Namespace
from .._math._linear import FEATURE_MAPS
from .._math._rotation import pair_partners
from . import _eager
from ._generic import POSITION_TABLE_MAX, Backend, ConstantBuilder, Jagged, _carry_fits, sized

__all__ = ["TorchBackend"]

_functorch = getattr(torch._C, "_functorch", None)
_is_wrapped = getattr(_functorch, "is_functorch_wrapped_tensor", None)
#: Legacy vmap (``autograd.grad(is_grads_batched=True)``, ``autograd.functional.jacobian(
#: vectorize=True)``) batches tensors without a functorch level: told by the tensor alone.
_is_legacy_batched = getattr(_functorch, "is_legacy_batchedtensor", None)

#: Tensor types the fast paths take: ``torch.Tensor`` itself, and ``nn.Parameter``, which overrides
#: no operation (its ``__torch_function__`` is disabled).  Any other subclass (fake, functional,
#: a user's ``__torch_function__``/``__torch_dispatch__`` subclass, DTensor...) takes the generic code.
_PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)


def _real(x: Any) -> bool:
    """A plain tensor: one of :data:`_PLAIN_TYPES`, not wrapped by a ``torch.func`` transform or
    batched by legacy vmap."""
    return (
        type(x) in _PLAIN_TYPES
        and not (_is_wrapped is not None and _is_wrapped(x))
        and not (_is_legacy_batched is not None and _is_legacy_batched(x))
    )


# -- the context rules (see rotary._lib._cache) ---------------------------------------------------
_current_level = getattr(_functorch, "maybe_current_level", None)
_dispatch_depth = torch._C._len_torch_dispatch_stack
_function_depth = torch._C._len_torch_function_stack
#: ``torch.jit.trace`` is recording (its tracer sees plain tensors, in no mode: told by this alone).
_jit_tracing = torch._C._get_tracing_state


def _plain_function_modes() -> bool:
    """No torch function mode is active but default-device ones (our constants name their
    device, so those cannot change them)."""
    if not torch._C._len_torch_function_stack():
        return True
    from torch.overrides import _get_current_function_mode_stack

    device_context = load("torch.utils._device").DeviceContext  # (imported by no mode but that one)
    return all(isinstance(m, device_context) for m in _get_current_function_mode_stack())


def _untraced() -> bool:
    """No trace records this call: no ``torch.compile``/``torch.export`` (Dynamo), no dispatch
    mode (fake, proxy: ``make_fx`` and non-strict ``torch.export``, functionalization, a user's
    mode), no ``torch.jit.trace``.  Values of plain tensors read here are this call's, not a
    trace's example."""
    return not (torch.compiler.is_compiling() or _dispatch_depth() or _jit_tracing() is not None)


def _eager_context() -> bool:
    """A plain eager context: :func:`_untraced`, no ``torch.func`` transform (grad, vjp, jvp, vmap,
    jacrev, jacfwd, hessian, functionalize: each runs at a functorch level), no forward-AD level
    (``_current_level`` -1: dual tensors exist only inside one), no function mode but
    default-device ones."""
    # (the four checks inlined, cheapest first: this runs once per call, decoding steps included)
    return (
        not (torch.compiler.is_compiling() or _dispatch_depth() or _jit_tracing() is not None)
        and (_current_level is None or _current_level() is None)
        and getattr(_forward_ad, "_current_level", -1) < 0
        and (not _function_depth() or _plain_function_modes())
    )


def _clean() -> bool:
    """A plain eager scope, where a value made may be stored (:mod:`rotary._lib._cache`):
    :func:`_eager_context`, outside inference mode."""
    return _eager_context() and not torch.is_inference_mode_enabled()


@contextlib.contextmanager
def _scope() -> Iterator[None]:
    """Outside every dispatch mode (fake, functional, proxy) and inference mode: constants built
    here are plain tensors.  Only what is on is switched off, and grad mode is left alone: the
    builders read no tensor that requires grad, and a grad-mode region entered under
    ``torch.export`` would be recorded (an empty ``wrap_with_set_grad_enabled`` node, which
    ``torch.export.save`` refuses)."""
    with contextlib.ExitStack() as stack:
        if torch._C._len_torch_dispatch_stack():
            from torch.utils._python_dispatch import _disable_current_modes

            stack.enter_context(_disable_current_modes())
        if torch.is_inference_mode_enabled():
            stack.enter_context(torch.inference_mode(False))
        yield


def _fake_mode() -> Any:
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    modes = [m for m in _get_current_dispatch_mode_stack() if isinstance(m, FakeTensorMode)]
    return modes[-1] if modes else None


def _adapt(value: Any) -> Any:
    """A stored value as valid here: under a fake mode that refuses real tensors (shape
    inference), its fake counterpart; elsewhere itself (``torch.export`` lifts real constants)."""
    if not torch._C._len_torch_dispatch_stack():
        return value
    mode = _fake_mode()
    if mode is None or mode.allow_non_fake_inputs:
        return value
    return _to_fake(mode, value)


def _to_fake(mode: Any, value: Any) -> Any:
    """``value``'s tensors entered into the modes as literals (``aten.lift_fresh``, what
    ``torch.tensor(...)`` does): fake under the fake mode, and under ``make_fx`` a constant of the
    graph that holds the real tensor (not the fake one, which the graph could not run)."""
    if isinstance(value, tuple):
        return tuple(_to_fake(mode, a) for a in value)
    return torch.ops.aten.lift_fresh.default(value) if type(value) is torch.Tensor else value


register_library(
    "torch",
    clean=_clean,
    scope=_scope,
    adapt=_adapt,
    clear=lambda: _clear_graph_constants(),
    checks_hold=_eager_context,  # (inference mode: the checks and plans do not depend on it)
)


def _constant(build: ConstantBuilder, config: Hashable, kind: str, device: Any, dtype: Any) -> Any:
    """The cached constant (built outside fake and inference modes: a real tensor)."""
    return get_or_build(
        (config, kind, "torch", device, dtype),
        lambda: sized(build(config, kind, torch_xp, device, dtype)),
        "constants",
    )


_DATACLASS = "rotary-dataclass"


def _plain(value: Any) -> Any:
    """A configuration value as constants of the trace: a dataclass as its type and field
    values (recursively), ints and floats that ``torch.compile`` made symbolic specialised
    (a configuration is static)."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return operator.index(value)
    if isinstance(value, float):
        return float.fromhex(value.hex())
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    if dataclasses.is_dataclass(value):
        fields = tuple(_plain(getattr(value, f.name)) for f in dataclasses.fields(value) if f.init)
        return (_DATACLASS, type(value), fields)
    return value


def _rebuild(value: Any) -> Any:
    if isinstance(value, tuple) and len(value) == 3 and value[0] == _DATACLASS:
        return value[1](*(_rebuild(v) for v in value[2]))
    if isinstance(value, tuple):
        return tuple(_rebuild(v) for v in value)
    return value


class _GraphConstants:
    """The constants ``torch.compile`` graphs read: attributes of one module-level object, each
    under its own name, so Dynamo lifts each from its own source (``AttrSource``) and guards it.

    (A tensor returned by an ``assume_constant_result`` function is registered under a source
    named after the function: two different constants in one graph then share a source, which
    AOTAutograd refuses: "source ConstantSource(...) already in seen_sources", PyTorch 2.13.)"""


_GRAPH_CONSTANTS = _GraphConstants()
_GRAPH_NAMES: dict[Hashable, str] = {}
_GRAPH_MAX = 256  # then it starts over (compiled graphs whose constant went recompile once)
_GRAPH_LOCK = threading.Lock()


@after_fork_in_child
def _graph_after_fork() -> None:
    """In a forked child: a new lock, and no names if a thread held the old one at the fork."""
    global _GRAPH_LOCK
    if not _GRAPH_LOCK.acquire(blocking=False):
        _GRAPH_NAMES.clear()
    _GRAPH_LOCK = threading.Lock()


def _graph_constant_name(build: ConstantBuilder, plain: Any, kind: str, device: Any, dtype: Any) -> str:
    """The attribute of :data:`_GRAPH_CONSTANTS` holding this constant (built here, for real,
    outside every mode: a plain tensor)."""
    key = (build, plain, kind, device, dtype)
    with _GRAPH_LOCK:
        name = _GRAPH_NAMES.get(key)
        if name is None:
            if len(_GRAPH_NAMES) >= _GRAPH_MAX:
                _clear_graph_constants()
            name = f"c{len(_GRAPH_NAMES)}_{kind}"
            with _scope():
                setattr(_GRAPH_CONSTANTS, name, _constant(build, _rebuild(plain), kind, device, dtype))
            _GRAPH_NAMES[key] = name
    return name


def _clear_graph_constants() -> None:
    for name in _GRAPH_NAMES.values():
        delattr(_GRAPH_CONSTANTS, name)
    _GRAPH_NAMES.clear()


def _run(fn: Callable[..., Any], *args: Any) -> Any:
    with _scope():
        out = fn(*_rebuild(args))
    if isinstance(out, np.ndarray) and torch.compiler.is_compiling():
        return out.tolist()  # (a constant of the trace: Dynamo embeds Python values, not NumPy's)
    return out


def _assume_constant_result(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``torch.compiler.assume_constant_result(fn)`` without importing Dynamo, which that function
    does (1.4 s, at the first torch call of a process that may never compile): the decorator sets
    this one attribute, which Dynamo reads when it traces a call of ``fn``
    (``tests/test_export.py`` checks that the decorator still does exactly this)."""
    fn._dynamo_marked_constant = True  # type: ignore[attr-defined]
    return fn


# Dynamo calls these for real at trace time and embeds their results (plain values) as constants.
_graph_constant = _assume_constant_result(_graph_constant_name)
_call = _assume_constant_result(_run)


def _ops(dtype: Any, device: Any) -> _eager.Ops:
    def take_into(table: Array, idx: Array, out: Array) -> None:
        torch.index_select(table, 0, idx, out=out)

    return _eager.Ops(
        empty=lambda shape: torch.empty(shape, dtype=dtype, device=device),
        empty_like=torch.empty_like,
        mul=torch.mul,
        sub=torch.sub,
        add=torch.add,
        take_into=take_into,
        broadcast_to=torch.broadcast_to,
        matmul=torch.matmul,
    )


_INTEGER = frozenset({torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8})
_KERNEL_DTYPES = frozenset({torch.float16, torch.bfloat16, torch.float32})
#: Triton's interpreter is on (read once, from the environment): the kernel also takes CPU tensors.
_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _triton_device(x: Array) -> bool:
    return bool(x.is_cuda or (_INTERPRET and x.device.type == "cpu"))


def _elu1_fast(x: Any, plan: Any) -> bool:
    """``elu+1`` features of ``x`` (no cosine, no L2 normalisation) in its own dtype, the compute
    dtype, on a plain tensor (:func:`fast`): the generic bits in torch's in-place calls."""
    return (
        plan.phi is FEATURE_MAPS["elu+1"]
        and not (plan.cosine or plan.l2norm)
        and x.dtype == plan.cdt
        and fast(x)
    )


def fast(*inputs: Any, grads: tuple[Any, ...] = ()) -> bool:
    """May a fast path run on ``inputs`` here?  The one eligibility test of torch's fast paths
    (the ``out=`` kernels, the decoding plans, the per-position table, the custom backward, the
    Triton op), by allowlist: where their equivalence with the generic code is proven.

    - :func:`rotary.fast_paths` on, and a plain eager context (:func:`_eager_context`): no
      compile or export trace, no dispatch or function mode, no ``torch.func`` transform, no
      forward-AD level.  ``out=`` operations have no forward-AD formula and no batching rule, a
      trace must see the generic operations (and never an eagerly read value), and a mode sees
      the operations it expects;
    - every input a plain tensor (:data:`_PLAIN_TYPES`, not wrapped);
    - no input that autograd records, except those in ``grads``: the inputs whose gradient the
      fast path itself provides (the custom backward's data).  Positions, frequencies or scales
      that require grad are never in ``grads``: a fast path that took them would drop their
      gradient.

    Anything else takes the generic code, whose every operation autograd, ``torch.func``,
    Dynamo and the tracers know.  ``None`` inputs are skipped.
    """
    if not (_eager_context() and fast_paths_enabled()):  # (compiling first: Dynamo reads no contextvar)
        return False
    # (the checks of _real, inlined: this runs once per call, decoding steps included)
    recording = torch.is_grad_enabled()
    wrapped, batched = _is_wrapped, _is_legacy_batched
    for x in (*inputs, *grads) if grads else inputs:
        if x is None:
            continue
        if (
            type(x) not in _PLAIN_TYPES
            or (wrapped is not None and wrapped(x))
            or (batched is not None and batched(x))
        ):
            return False
        if recording and x.requires_grad and not (grads and any(x is g for g in grads)):
            return False
    return True


def _small_half_tables(c: Array, s: Array) -> tuple[Array, Array]:
    """``C = cos`` and ``S = [-sin, sin]`` along a new pair axis (see :func:`_rotate_small_half`)."""
    return c.unsqueeze(-2), torch.stack((torch.neg(s), s), dim=-2)


def _rotate_small_half(x: Array, C: Array, S: Array, h: int) -> Array:
    """One small block in the half layout (decoding), in the fewest torch calls:
    ``out = x * C + swap(x) * S``; ``a + b * (-c) == a - b * c`` exactly, so these are the
    generic formula's bits (no fused multiply-add)."""
    xv = x.view(*x.shape[:-1], 2, h)
    out = torch.mul(xv, C)
    return torch.add(out, torch.mul(xv.flip(-2), S), out=out).view(x.shape)


def _rotate_small_half_joint(q: Array, k: Array, C2: Array, S2: Array, h: int) -> tuple[Array, Array]:
    """``q`` and ``k`` at one position in the half layout, in the fewest torch calls (decoding):
    ``x * C2 + roll(x, h) * S2`` with the per-feature rows ``C2 = [cos, cos]``,
    ``S2 = [-sin, sin]``; ``a + b * (-c) == a - b * c`` exactly, so these are the generic
    formula's bits.  Each output owns its memory (a KV cache that keeps the keys must not keep
    the queries alive, nor ``torch.save`` write them): as fast as one pass over the two
    concatenated, which returned views of one buffer (``benchmarks/state.py``'s decode rows)."""
    oq = torch.mul(q, C2)
    oq.add_(q.roll(h, -1).mul_(S2))
    ok = torch.mul(k, C2)
    ok.add_(k.roll(h, -1).mul_(S2))
    return oq, ok


def _compiling_not_exporting() -> bool:
    return bool(torch.compiler.is_compiling() and not torch.compiler.is_exporting())


class _CustomGrad(torch.autograd.Function):  # type: ignore[misc]
    """``forward(*xs)`` recorded as one node whose backward is ``backward(*grads)`` (a linear
    map's transpose, run as ordinary differentiable code: double backward differentiates it).
    Used only where :func:`fast` allows (no forward AD, no ``torch.func``, no trace)."""

    @staticmethod
    def forward(ctx: Any, forward: Any, backward: Any, *xs: Any) -> Any:
        ctx.backward_fn = backward
        return forward(*xs)  # (autograd runs forward without recording)

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> Any:
        return (None, None, *ctx.backward_fn(*grads))


# -- DTensor: rotated shard by shard ---------------------------------------------------------------
def _is_dtensor(x: Any) -> bool:
    """``x`` is a ``torch.distributed.tensor.DTensor`` (never imports the module)."""
    dtensor = getattr(sys.modules.get("torch.distributed.tensor"), "DTensor", None)
    return dtensor is not None and isinstance(x, dtensor)


def _is_masked(x: Any) -> bool:
    """``x`` is a ``torch.masked.MaskedTensor`` (never imports the prototype module)."""
    masked = getattr(sys.modules.get("torch.masked.maskedtensor.core"), "MaskedTensor", None)
    return masked is not None and isinstance(x, masked)


def _masked(data: Array, mask: Array) -> Array:
    from torch.masked import MaskedTensor

    return MaskedTensor(data, mask)


def _global_positions(pos: Any) -> Any:
    """Positions given as a DTensor: their global values, as a plain tensor (differentiable)."""
    return pos.full_tensor() if _is_dtensor(pos) else pos


def _check_placements(x: Any, name: str, axis: int = -1) -> None:
    """The placements a rotation (or a layout conversion) along ``axis`` serves shard by shard:
    ``Shard`` of any other axis, ``Replicate``, and ``Partial`` sums or means (both are linear)."""
    axis %= x.ndim
    for p in x.placements:
        if p.is_shard() and p.dim % x.ndim == axis:
            raise ValueError(
                f"{name} is a DTensor sharded on the feature axis {axis} ({p}): a rotation mixes "
                f"features of different shards; redistribute it (e.g. {name}.redistribute(placements="
                "[Replicate()])) or shard batch, heads or sequence instead"
            )
        if p.is_partial() and getattr(p, "reduce_op", "sum") not in ("sum", "avg"):
            raise ValueError(
                f"{name} is a DTensor with pending reduction {p}, which a rotation does not commute "
                f"with; reduce it first ({name}.redistribute(placements=[Replicate()]))"
            )


def _shard_rotate(x: Any, c: Any, s: Any, rotate: Callable[[Any, Any, Any], Any], name: str) -> Any:
    """``rotate`` of each rank's shard of the DTensor ``x`` by the cos/sin (plain tensors broadcast
    against ``x.shape[:-1]``) of its own rows, as a DTensor of ``x``'s mesh and placements."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    _check_placements(x, name)
    if _is_dtensor(c):
        c, s = c.full_tensor(), s.full_tensor()
    shape, offset = compute_local_shape_and_global_offset(x.shape, x.device_mesh, x.placements)

    def local(t: Any) -> Any:
        t = t.reshape((1,) * (x.ndim - t.ndim) + tuple(t.shape))
        rows = tuple(
            slice(None) if t.shape[d] == 1 else slice(offset[d], offset[d] + shape[d])
            for d in range(x.ndim - 1)
        )
        return t[rows]

    out = rotate(x.to_local(), local(c), local(s))
    return DTensor.from_local(out, x.device_mesh, x.placements, shape=x.shape, stride=x.stride())


def _scalar(p: Any) -> bool:
    return isinstance(p, (int, float)) and not isinstance(p, bool)


def _full(pos: Any, device: Any) -> Array:
    """Python positions (a number, or a flat sequence of them) as a tensor whose values stay
    inputs of a compiled graph (not constants of it)."""
    if isinstance(pos, (int, float)):
        dt = torch.float64 if isinstance(pos, float) else torch.int64
        return torch.full((), pos, dtype=dt, device=device)
    dt = torch.float64 if any(isinstance(p, float) for p in pos) else torch.int64
    return torch.stack([torch.full((), p, dtype=dt, device=device) for p in pos])


class TorchBackend(Backend):
    def __init__(self, xp: Namespace) -> None:
        super().__init__(xp)
        self.name = "torch"
        self.key = "torch"  # (one namespace; a plain string where compiled graphs guard on keys)

    def is_concrete(self, x: Array) -> bool:
        # (never inside a trace: a value read there would specialise the graph to its example)
        return _untraced() and _real(x) and x.device.type == "cpu"

    def composite(self, x: Array) -> str | None:
        if _is_masked(x):
            return "masked tensor"
        return "distributed tensor (DTensor)" if _is_dtensor(x) else None

    def map_heads(self, kernel: Callable[[Array], Array], x: Array, *, axis: int, head_dim: int) -> Array:
        if _is_masked(x):  # (a permutation of features: the mask moves with its feature)
            return _masked(kernel(x.get_data()), kernel(x.get_mask()))
        if not _is_dtensor(x):
            return kernel(x)
        from torch.distributed.tensor import DTensor

        _check_placements(x, "x", axis)
        out = kernel(x.to_local())
        return DTensor.from_local(out, x.device_mesh, x.placements, shape=x.shape, stride=x.stride())

    def check_dense(self, arrays: list[tuple[str, Array]]) -> None:
        from .._lib._validation import not_dense

        for name, a in arrays:
            if a.layout == torch.jagged:
                raise TypeError(
                    f"{name} is a nested tensor (layout torch.jagged), which this function does not take "
                    "beside dense arrays: pass every sequence argument nested (q, k, v, and positions as a "
                    "nested tensor or none), or the flat values with cu_seqlens=x.offsets()"
                )
            if a.is_nested:
                raise TypeError(
                    f"{name} is a nested tensor of layout torch.strided (rotary serves torch.jagged): "
                    f"rebuild it with torch.nested.nested_tensor(list({name}.unbind()), layout=torch.jagged)"
                )
            if a.layout != torch.strided:
                raise not_dense(name, a.layout)

    def jagged(self, x: Any) -> Jagged | None:
        if not (isinstance(x, torch.Tensor) and x.is_nested):
            return None
        if x.layout != torch.jagged:
            raise TypeError(
                "nested tensors of layout torch.strided are not served (rotary serves torch.jagged): "
                "rebuild it with torch.nested.nested_tensor(list(x.unbind()), layout=torch.jagged)"
            )
        nt: Any = x  # (a NestedTensor: its jagged accessors)
        ragged = nt._ragged_idx
        values, offsets = nt.values(), nt.offsets()
        if nt.lengths() is not None:
            raise TypeError(
                "a nested tensor with holes (lengths= beside offsets) is not served: rebuild it with "
                "torch.nested.nested_tensor(list(x.unbind()), layout=torch.jagged)"
            )

        def wrap(out: Array) -> Array:
            return torch.nested.nested_tensor_from_jagged(out, offsets, jagged_dim=ragged)

        return Jagged(values, offsets, ragged - 1 - values.ndim, wrap)

    def tracing(self) -> bool:
        return bool(torch.compiler.is_compiling() or _jit_tracing() is not None)

    def sizes_symbolic(self) -> bool:
        return bool(torch.compiler.is_compiling())

    def host_values(self, x: Array) -> Any:
        # (outside torch.func transforms: there detach() would wrap the tensor, and a wrapped
        # tensor has no storage to read)
        with torch._C._DisableFuncTorch():
            x = x.detach()
            return x.resolve_conj().resolve_neg().numpy() if x.dtype != torch.bfloat16 else x.float().numpy()

    def value_range(self, x: Array) -> tuple[float, float] | None:
        # (one reduction where the values are a plain CPU tensor's: no copy to NumPy)
        if not (type(x) is torch.Tensor and x.dtype.is_floating_point and x.numel() and self.is_concrete(x)):
            return super().value_range(x)
        lo, hi = torch.aminmax(x.detach() if x.requires_grad else x)
        return lo.item(), hi.item()

    def has_int64(self, device: Device) -> bool:
        return True

    def signature(self, *args: Any) -> Hashable | None:
        if torch.compiler.is_compiling():
            return None
        out: list[Any] = []
        for a in args:
            t = type(a)
            if a is None:
                out.append(None)
            elif t is torch.Tensor:
                out.append((a.shape, a.dtype, a.device, a.layout))
            elif t is np.ndarray:
                out.append((t, a.shape, a.dtype))
            else:
                return None
        return tuple(out)

    def position_shape(self, pos: Any, *, name: str) -> tuple[Any, ...]:
        if torch.compiler.is_compiling() and not isinstance(pos, torch.Tensor):
            return tuple(self.positions(pos, name=name, device=None)[0].shape)
        return super().position_shape(pos, name=name)

    def positions(self, pos: Any, *, name: str, device: Device) -> tuple[Array, tuple[int, int] | None]:
        if _is_masked(pos):
            raise TypeError(
                f"{name} is a masked tensor: a masked position has no angle; pass the positions of "
                f"the tokens (e.g. {name}.get_data()) and mask the data instead"
            )
        if _is_dtensor(pos):  # (positions are few: their global values on every rank)
            pos = _global_positions(pos)
        compiling = torch.compiler.is_compiling()
        if (  # decoding: one integer position in a plain CPU tensor (the generic steps, fewer calls)
            not compiling
            and type(pos) is torch.Tensor
            and pos.is_cpu
            and pos.numel() == 1
            and pos.dtype in _INTEGER
            and self.is_concrete(pos)
        ):
            p = int(pos)
            v.check_position_bound(float(abs(p)), name)
            return pos, (p, p)
        if compiling and not isinstance(pos, torch.Tensor):
            # Python or NumPy positions inside a compiled function: converted in the graph
            # (their values are not checked there, as for traced tensors).
            if isinstance(pos, bool):
                raise TypeError(f"{name} must be integer or real floating positions, got a bool")
            if isinstance(pos, (int, float)) or (
                isinstance(pos, (list, tuple)) and pos and all(_scalar(p) for p in pos)
            ):
                # ``torch.full`` of a Python number: Dynamo specialises its first value, then
                # makes it a symbolic input (two graphs for a decoding loop, as ``p * inv_freq``
                # gets), where ``as_tensor`` would specialise every value (a graph per position)
                return _full(pos, device), None
            t = torch.as_tensor(pos, device=device)
            if t.is_floating_point():
                t = torch.as_tensor(pos, dtype=torch.float64, device=device)
            elif t.dtype == torch.bool or t.is_complex():
                raise TypeError(f"{name} must hold integer or real floating positions, got dtype {t.dtype}")
            return t, None
        return super().positions(pos, name=name, device=device)

    def float_dtypes(self, device: Device) -> set[str]:
        if device is not None and torch.device(device).type == "mps":
            return {"float16", "bfloat16", "float32"}
        return {"float16", "bfloat16", "float32", "float64"}

    def constant(
        self, build: ConstantBuilder, config: Hashable, kind: str, device: Device, dtype: DType
    ) -> Array:
        if torch.compiler.is_compiling():
            # The configuration may have been created inside the trace (a RoPE built in the
            # compiled function): pass its field values, which the trace knows, not the object.
            return getattr(_GRAPH_CONSTANTS, _graph_constant(build, _plain(config), kind, device, dtype))
        return _constant(build, config, kind, device, dtype)

    def eager(self, fn: Callable[..., Any], *args: Any) -> Any:
        # (dataclass arguments as their field values: the trace knows those, not the object)
        return _call(fn, *_plain(args))

    def fast(self, *inputs: Any, grads: tuple[Any, ...] = ()) -> bool:
        return fast(*inputs, grads=grads)

    def few_rows(
        self, key: Hashable, make: Callable[[Device, int], tuple[Any, int]], x: Array, pos: Array, rows: int
    ) -> tuple[Array, Array] | None:
        if not (
            type(pos) is torch.Tensor
            and pos.dtype in _INTEGER
            and pos.ndim == 2
            and pos.is_cpu
            and pos.numel() <= 64
            and fast(x, pos)
        ):
            return None
        one = pos.numel() == 1
        if one:
            lo = hi = int(pos)
        else:
            host = pos.numpy()
            if host.size == 0:
                return None
            lo, hi = int(host.min()), int(host.max())
        start = lo - lo % rows
        if lo < 0 or hi >= start + rows or hi >= v.MAX_POSITION:
            return None  # (negative, or across two blocks: the generic code)
        dev = x.device

        def build() -> tuple[Any, int]:  # (each row shaped as one position's (1, 1, width))
            tables, nbytes = make(dev, start)
            return tuple(t.view(t.shape[0], 1, 1, t.shape[-1]) for t in tables), nbytes

        ta, tb = get_or_build((key, "torch", dev, start), build, "position_table")
        if one:  # (a copy of one row each: no index tensor)
            i = lo - start
            return ta[i].clone(), tb[i].clone()
        flat = pos.reshape(-1) if start == 0 else pos.reshape(-1) - start
        shape = (*pos.shape, ta.shape[-1])
        return torch.index_select(ta, 0, flat).view(shape), torch.index_select(tb, 0, flat).view(shape)

    def owned(self, x: Array) -> Array:
        # (plain eager tensors: a trace's outputs are the graph's, a subclass's storage its own)
        if type(x) not in _PLAIN_TYPES or not _eager_context():
            return x
        return x.clone() if x.untyped_storage().nbytes() > x.numel() * x.element_size() else x

    def polar(self, angles: Array) -> Array:
        return torch.polar(torch.ones_like(angles), angles)

    def rotate(self, x: Array, c: Array, s: Array, *, layout: Layout, rotary_dim: int) -> Array:
        if _is_masked(x):
            # A rotated feature is masked where it or its pair partner is (the rule of NumPy's
            # masked arrays and marray: each output reads both); the data rotate as a plain tensor.
            mask = x.get_mask()
            out = self.rotate(x.get_data(), c, s, layout=layout, rotary_dim=rotary_dim)
            partner = list(range(x.shape[-1]))
            partner[:rotary_dim] = pair_partners(layout, rotary_dim)
            idx = torch.tensor(partner, device=mask.device)
            return _masked(out, mask & mask.index_select(-1, idx))  # (True: a value is there)
        if _is_dtensor(x):  # (each rank rotates its shard: DTensor in, DTensor out)
            return _shard_rotate(
                x, c, s, lambda a, b, d: self.rotate(a, b, d, layout=layout, rotary_dim=rotary_dim), "x"
            )
        if not (fast(x, c, s) and x.is_cpu and c.is_cpu):
            return super().rotate(x, c, s, layout=layout, rotary_dim=rotary_dim)
        out_dtype = x.dtype
        if x.dtype != c.dtype:
            x = x.to(c.dtype)
        if self._small_half(x, layout, rotary_dim):
            out = _rotate_small_half(x, *_small_half_tables(c, s), rotary_dim // 2)
        else:
            out = _eager.rotate(x, c, s, layout, rotary_dim, _ops(x.dtype, x.device))
        return out if out.dtype == out_dtype else out.to(out_dtype)

    @staticmethod
    def _small_half(x: Array, layout: Layout, rotary_dim: int) -> bool:
        return (
            layout == "half"
            and rotary_dim == x.shape[-1]
            and x.numel() * x.element_size() <= _eager.BLOCK_BYTES
        )

    def rotate_both(
        self, q: Array, k: Array, c: Array, s: Array, *, layout: Layout, rotary_dim: int
    ) -> tuple[Array, Array]:
        if _is_dtensor(q) or _is_dtensor(k):
            return (
                self.rotate(q, c, s, layout=layout, rotary_dim=rotary_dim),
                self.rotate(k, c, s, layout=layout, rotary_dim=rotary_dim),
            )
        if not (  # (fast first: under a trace, sizes are symbolic and a comparison would guard them)
            fast(q, k, c, s)
            and layout == "half"
            and q.dtype == c.dtype == k.dtype
            and q.is_cpu
            and k.is_cpu
            and c.is_cpu
            and self._small_half(q, layout, rotary_dim)
            and self._small_half(k, layout, rotary_dim)
        ):
            return super().rotate_both(q, k, c, s, layout=layout, rotary_dim=rotary_dim)
        h = rotary_dim // 2
        if all(d == 1 for d in c.shape[:-1]):  # one position for every row: one joint pass
            c, s = c.reshape(h), s.reshape(h)
            return _rotate_small_half_joint(q, k, torch.cat([c, c]), torch.cat([-s, s]), h)
        C, S = _small_half_tables(c, s)
        return _rotate_small_half(q, C, S, h), _rotate_small_half(k, C, S, h)

    def fused_rope(
        self,
        build: ConstantBuilder,
        config: Hashable,
        q: Array,
        k: Array | None,
        pos: Array,
        *,
        layout: Layout,
        rotary_dim: int,
        exact: bool,
        af: float,
    ) -> tuple[Array, Array] | None:
        """The Triton kernel (:mod:`rotary._backends._triton`) for CUDA tensors (CPU ones under
        Triton's interpreter) of float16, bfloat16 or float32 at integer positions, with at most
        four leading axes.  Eligibility is :func:`fast` (its autograd formula gives the data's
        gradient; integer positions have none), or ``torch.compile`` (not ``torch.export``:
        there it is one custom op with a fake implementation and the same autograd formula).
        ``None`` elsewhere: the generic code."""
        if not (
            _triton_device(q)
            and q.dtype in _KERNEL_DTYPES
            and (k is None or (k.dtype == q.dtype and 2 <= k.ndim <= 5 and q.shape[-1] == k.shape[-1]))
            and not pos.dtype.is_floating_point
            and pos.dtype != torch.bool
            and 2 <= q.ndim <= 5
            and (_compiling_not_exporting() or fast(q, k, pos, grads=(q, k)))
        ):
            return None
        try:
            load(f"{__package__}._triton")  # (the first time: under the lock a fork waits for)
            from ._triton import rope_op  # (now a lookup, which torch.compile traces)
        except ImportError:  # no triton
            return None
        dev = self.creation_device(q)
        table = self.constant(build, config, "tables" if exact else "float32_inv", dev, torch.float32)
        pk = None if k is None else pos
        return rope_op(q, k, pos, pk, table, rotary_dim, layout == "half", exact, float(af), 1.0)

    def wants_custom_grad(self, xs: tuple[Array, ...], others: tuple[Any, ...]) -> bool:
        return torch.is_grad_enabled() and any(x.requires_grad for x in xs) and fast(*others, grads=xs)

    def custom_grad(
        self,
        forward: Callable[..., tuple[Array, ...]],
        backward: Callable[..., tuple[Array, ...]],
        *xs: Array,
    ) -> tuple[Array, ...]:
        return _CustomGrad.apply(forward, backward, *xs)

    def decode_plan(
        self,
        build: ConstantBuilder,
        config: Hashable,
        q: Array,
        k: Array,
        pos: Any,
        *,
        layout: Layout,
        rotary_dim: int,
    ) -> Callable[[Array, Array, Any], tuple[Array, Array] | None] | None:
        """Decoding on the CPU (one integer position in a CPU tensor, small q and k, the half
        layout, whole heads, the compute dtype): the generic steps' bits from the position's
        rows (:meth:`decode_rows`) and the joint pass, without the per-call lookups.  Positions
        outside the table, autograd, tracing or ``fast_paths(False)`` take the generic steps."""
        if not (type(pos) is torch.Tensor and pos.is_cpu and pos.numel() == 1 and pos.dtype in _INTEGER):
            return None
        rows = self.decode_rows(build, config, q, k, layout=layout, rotary_dim=rotary_dim)
        if rows is None:
            return None
        h = rotary_dim // 2

        def plan(q: Array, k: Array, pos: Any) -> tuple[Array, Array] | None:
            if not fast(q, k, pos):
                return None
            p = int(pos)
            if not 0 <= p < POSITION_TABLE_MAX:
                return None
            C2, S2 = rows(p)
            return _rotate_small_half_joint(q, k, C2, S2, h)

        return plan

    def decode_position(self, pos: Any) -> int | None:
        if type(pos) is torch.Tensor:
            return int(pos) if pos.is_cpu and pos.numel() == 1 and pos.dtype in _INTEGER else None
        return super().decode_position(pos)

    def decode_rows(
        self, build: ConstantBuilder, config: Hashable, q: Array, k: Array, *, layout: Layout, rotary_dim: int
    ) -> Callable[[int], Any] | None:
        """CPU tensors of the compute dtype, small, the half layout, whole heads: ``rows(p) ->
        (C2, S2)``, the rows ``[cos, cos]`` and ``[-sin, sin]`` of the joint pass (``x * C2 +
        roll(x, r/2) * S2``), from the position table with as many rows (state ``decode_rows``)."""
        dtype = self.compute_dtype(q.dtype)
        if not (
            q.dtype == k.dtype == dtype
            and self._small_half(q, layout, rotary_dim)
            and self._small_half(k, layout, rotary_dim)
            and q.is_cpu
            and k.is_cpu
        ):
            return None
        dev, h = self.creation_device(q), rotary_dim // 2

        def rows(p: int) -> tuple[Array, Array]:
            n = 4096
            while n <= p:
                n *= 2

            def make() -> tuple[Array, int]:
                c, s = self.position_table(build, config, dev, dtype, p).split_with_sizes([h, h], 1)
                return sized(torch.stack([torch.cat([c, c], 1), torch.cat([-s, s], 1)], 1))

            C2, S2 = get_or_build((config, "decode_rows", n, dev, dtype), make, "decode_rows")[p].unbind(0)
            return C2, S2

        return rows

    def plain_block(
        self,
        ch: Any,
        carry: Any,
        size: int,
        m: int,
        plan: Any,
        out_dtype: DType | None,
        *,
        doc: Any = None,
        uniform: bool = False,
        strict: bool = False,
        divided: bool = True,
    ) -> tuple[Any, Any] | None:
        """:func:`rotary._backends._eager.causal_block` (the generic block's operations in place)
        on plain CPU tensors of one dtype whose leading axes are equal (no grouped-query
        broadcast), documents as one id per token, a denominator unchecked."""
        a, c, b, e, v = ch
        xs = [x for x in (a, c, b, e, v) if x is not None]
        if carry is not None:
            xs += [x for x in (carry.S, carry.z) if x is not None]
        lead = tuple(a.shape[:-2])
        d0 = None if carry is None or uniform else carry.doc
        if not (
            plan.check is None
            and (c is None) == (e is None)
            and all(x.dtype == a.dtype and x.is_cpu for x in xs)
            and all(tuple(x.shape[:-2]) == lead for x in (b, v, c, e) if x is not None)
            and (carry is None or _carry_fits(carry._replace(doc=None), lead, e is not None))
            and (d0 is None or (doc is not None and type(d0) is torch.Tensor and d0.ndim == 0 and d0.is_cpu))
            and (doc is None or (type(doc) is torch.Tensor and (uniform or doc.ndim == 1) and doc.is_cpu))
            and fast(*xs, doc, d0)
        ):
            return None
        # (v contiguous: one copy, not one per product)
        return _eager.causal_block(
            ch._replace(v=v.contiguous()),
            carry,
            size,
            m,
            plan,
            out_dtype,
            self.xp,
            a.device,
            doc=doc,
            uniform=uniform,
            strict=strict,
            divided=divided,
        )

    def plain_attend(
        self, a: Array, c: Array | None, st: Any, plan: Any, out_dtype: DType, place: Any
    ) -> Array | None:
        """:func:`rotary._backends._eager.attend` on plain CPU tensors of one dtype, the state's
        leading axes the queries' (no grouped-query broadcast), a denominator unchecked.  (NumPy
        has none: its product into a slice of a large output measured 1.13x slower at 64k.)"""
        S, z = st
        xs = [x for x in (a, c, S, z) if x is not None]
        if not (
            plan.check is None
            and (c is None) == (z is None)
            and a.dtype == out_dtype
            and all(x.dtype == a.dtype and x.is_cpu for x in xs)
            and tuple(S.shape[:-2]) == tuple(a.shape[:-2])
            and fast(*xs)
        ):
            return None
        dest = place((*a.shape[:-1], S.shape[-1]), a.dtype, a.device)
        return None if dest is None else _eager.attend(a, c, st, plan, dest, _ops(a.dtype, a.device))

    def one_document(self, doc: Array, carried: Array | None) -> bool:
        if not (
            type(doc) is torch.Tensor
            and doc.is_cpu
            and (carried is None or (type(carried) is torch.Tensor and carried.is_cpu))
            and fast(doc, carried)
        ):
            return False
        first = doc[..., :1]
        return bool(torch.equal(doc, first.expand_as(doc))) and (
            carried is None or bool(torch.all(carried == first[..., 0]))
        )

    def features(self, x: Array, plan: Any) -> Array:
        if not _elu1_fast(x, plan):
            return super().features(x, plan)
        # max(x, 0) + exp(min(x, 0)) (a + b == b + a): four passes, the exp in place, no zeros
        return torch.clamp_max(x, 0.0).exp_().add_(torch.clamp_min(x, 0.0))

    def query_features(self, x: Array, plan: Any) -> Array:
        if not (plan.normalize and _elu1_fast(x, plan)):
            return super().query_features(x, plan)
        # max(x, 0) + exp(min(x, 0) - shift), shift = min(max(x), 0): the generic bits, in place
        shift = torch.amax(x, -1, keepdim=True).clamp_max_(0.0)
        return torch.clamp_max(x, 0.0).sub_(shift).exp_().add_(torch.clamp_min(x, 0.0))

    def linear_step(
        self, feature_map: str, eps: float, rows: Callable[[int], Any] | None, like: tuple[Array, ...]
    ) -> Callable[..., tuple[Array, ...] | None] | None:
        """A decoding step of normalised linear attention with ``elu+1`` features and the dot
        similarity on CPU tensors of float32 (plain ones, at each call: :func:`fast`): the
        generic step's bits
        (:func:`rotary._math._linear.query_features`, ``features``, ``step``; the rotation of
        :meth:`decode_rows`) in torch's own calls, queries and keys of one shape as one stacked
        tensor.  Anything else returns ``None`` (the generic step)."""
        if not (
            feature_map == "elu+1"
            and all(type(x) is torch.Tensor and x.dtype == torch.float32 and x.is_cpu for x in like)
        ):
            return None

        def step(q: Array, k: Array, v: Array, pos: Any, S: Array, z: Array) -> tuple[Array, ...] | None:
            # (types, dtypes and devices are those of ``like``: the checked signature's)
            if not fast(q, k, v, S, z, pos if type(pos) is torch.Tensor else None):
                return None
            R: Any = None
            if rows is not None:
                p = self.decode_position(pos)
                if p is None or not 0 <= p < POSITION_TABLE_MAX:
                    return None
                R = rows(p)
            h = q.shape[-1] // 2
            # c = max(q, 0) + exp(min(q, 0) - shift), e = max(k, 0) + exp(min(k, 0)) (a + b == b + a)
            shift = torch.amax(q, -1, keepdim=True).clamp_max_(0.0)
            if q.shape == k.shape:  # (one pass over both)
                x = torch.stack((q, k))
                m = torch.clamp_max(x, 0.0)
                m[0].sub_(shift)
                f = m.exp_().add_(torch.clamp_min(x, 0.0))
                r = f if R is None else torch.mul(f, R[0]).add_(f.roll(h, -1).mul_(R[1]))
                a, b = r.unbind(0)
                c, e = f.select(-2, 0).unbind(0)  # (..., d): the token axis dropped
            else:
                c = torch.clamp_max(q, 0.0).sub_(shift).exp_().add_(torch.clamp_min(q, 0.0))
                e = torch.clamp_max(k, 0.0).exp_().add_(torch.clamp_min(k, 0.0))
                a, b = c, e
                if R is not None:
                    a = torch.mul(c, R[0]).add_(c.roll(h, -1).mul_(R[1]))
                    b = torch.mul(e, R[0]).add_(e.roll(h, -1).mul_(R[1]))
                c, e = c.select(-2, 0), e.select(-2, 0)
            S = torch.mul(b.mT, v).add_(S)
            z = torch.add(z, e)
            # (c's product in place where the rotation made a apart from it)
            den = torch.sum(c * z if R is None else c.mul_(z), -1)
            den = den.clamp_min_(eps) if eps > 0 else den.masked_fill_(den == 0, math.inf)  # (den: its own)
            return torch.matmul(a, S).div_(den[..., None, None]), S, z

        return step

    def recurrent_step(self, fam: Any, plan: Any) -> Callable[..., Any] | None:
        """A decoding step of the recurrent families (:mod:`rotary._math._recurrence`) with the
        identity feature map on plain CPU tensors of the compute dtype: the generic step's bits
        (:func:`rotary._math._linear.query_features`, ``features``, ``_recurrence.step``) in
        torch's own calls, without the namespace's wrappers.  Returns ``None`` for anything else
        (the generic step)."""
        from .._math._linear import FEATURE_MAPS, L2_EPS

        if plan.phi is not FEATURE_MAPS["identity"] or plan.cosine or plan.normalize:
            return None
        l2, scale, cdt = plan.l2norm, plan.scale, plan.cdt
        pf, rank, bonus = fam.per_feature, fam.rank, fam.bonus

        def step(
            q: Array, k: Array, v: Array, S: Array, g: Any, beta: Any, a: Any, b: Any, u: Any, rotate: Any
        ) -> tuple[Array, Array] | None:
            xs = [x for x in (q, k, v, S, g, beta, a, b, u) if x is not None]
            if not (fast(*xs) and all(x.dtype == cdt and x.is_cpu for x in xs)):
                return None
            if l2:
                q = q / torch.sqrt(torch.sum(q * q, dim=-1, keepdim=True) + L2_EPS)
                k = k / torch.sqrt(torch.sum(k * k, dim=-1, keepdim=True) + L2_EPS)
            if scale != 1.0:
                q = q * scale
            if rotate is not None:
                rot = rotate(q, k)
                if rot is None:
                    return None
                q, k = rot
            kt = k.mT
            out = None
            if bonus:
                own = torch.sum(q * u * k, dim=-1, keepdim=True)
                out = torch.matmul(q, S) + own * v
            Sg = S
            if g is not None:
                Sg = S * (torch.exp(g.mT) if pf else torch.exp(g)[..., None])
            # (a gated state is this step's own: the sums are written into it, the same bits as
            # the generic step's out-of-place sums, one state-sized buffer fewer)
            own = Sg is not S
            if rank == "delta":
                upd = kt * (beta[..., None] * (v - torch.matmul(k, Sg)))
                S = Sg.add_(upd) if own else Sg + upd
            elif rank == "dplr":
                low = b.mT * torch.matmul(a, S)
                S = (Sg.add_(low) if own else Sg + low).add_(kt * v)
            else:
                S = Sg.add_(kt * v) if own else Sg + kt * v
            return (torch.matmul(q, S) if out is None else out), S

        return step

    def _exact(
        self, pos: Array, tables: Array, w: Array, dtype: DType, levels: int, nonneg: bool, *, checked: bool
    ) -> tuple[Array, Array]:
        if not (
            checked and not pos.dtype.is_floating_point and pos.is_cpu and tables.is_cpu and fast(pos, tables)
        ):
            return super()._exact(pos, tables, w, dtype, levels, nonneg, checked=checked)
        return _eager.exact(pos, tables, levels, nonneg, _ops(tables.dtype, tables.device), self.xp)

    def _take_rows(self, table: Array, idx: Array) -> Array:
        # (indices are checked or digits: non-negative; index_select takes int32/int64 only)
        if idx.dtype not in (torch.int32, torch.int64):
            idx = idx.to(torch.int64)
        return torch.index_select(table, 0, idx)

    def _loop_free(self, n: Any) -> bool:
        return bool(torch.compiler.is_compiling())

    def cumsum(self, x: Array, axis: int) -> Array:
        return torch.cumsum(x, dim=axis)

    def segment_add(self, acc: Array, x: Array, ids: Array) -> Array:
        if not (isinstance(x, torch.Tensor) and isinstance(acc, torch.Tensor)) or _is_dtensor(x):
            return super().segment_add(acc, x, ids)
        if tuple(acc.shape[:-2]) != tuple(x.shape[:-2]):
            acc = acc.expand(*torch.broadcast_shapes(acc.shape[:-2], x.shape[:-2]), *acc.shape[-2:])
            x = x.expand(*acc.shape[:-2], *x.shape[-2:])
        return acc.index_add(acc.ndim - 2, ids.to(torch.int64), x)


TORCH = TorchBackend(torch_xp)  # the one instance (see ``backend_for``)
