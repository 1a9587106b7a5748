"""The transform matrix's parts: public functions (cases), transforms, and the float64 references.

A **case** is a public function of ``rotary`` with small float64 inputs and the names of the
inputs it is differentiable in (data, fractional positions, trained frequencies).  It is written
once against the array API: the same case runs on torch tensors and JAX arrays.

A **transform** takes ``F(*xs) -> outputs`` (the case with its differentiable inputs ``xs``), the
index ``i`` of the input it differentiates and the probe vectors (``ws`` cotangents of the outputs,
``t`` a tangent and ``u`` a direction for ``xs[i]``), and returns a tuple of arrays.  Its
**reference** is what it must equal, computed in float64 by the generic code's plain reverse-mode
autodiff (``rotary.fast_paths(False)``); the references are themselves checked against finite
differences (``tests/test_transforms.py``).  A new transform is one entry of
:data:`TORCH_TRANSFORMS` or :data:`JAX_TRANSFORMS`, naming the reference it must equal.
"""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Callable
from typing import Any

import numpy as np

import rotary
from rotary import positions as rpos

Arrays = dict[str, np.ndarray]


@dataclasses.dataclass(frozen=True)
class Case:
    """A public function: ``fn(**inputs) -> tuple of arrays``; ``make(rng)`` its float64 (and
    integer) inputs; ``diff`` the inputs it is differentiable in."""

    fn: Callable[..., tuple[Any, ...]]
    make: Callable[[np.random.Generator], Arrays]
    diff: tuple[str, ...]
    #: The precision the function computes in (float64 inputs): its results' rounding unit.
    eps: float = 2.0**-52
    #: Position values that select a torch fast path (decoding plans, the per-position table):
    #: the same traced code as another case under JAX, so not repeated there.
    torch_only: bool = False


def _frac(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.uniform(-3.0, 40.0, size=shape) + 0.25


def _n(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape)


_YARN = rotary.RoPE(
    8,
    layout="interleaved",
    rotary_dim=6,
    scaling=rotary.YaRN(factor=4.0, original_max_position_embeddings=16),
)
_F32 = rotary.RoPE(8, angles="float32")
_AXIAL = rotary.AxialRoPE(8, 2)
_MROPE = rotary.MRoPE(8, (2, 1, 1))
_TOWER = rotary.vision.eva02(8, grid_offset=0.5)
_SRC, _DST = rotary.RoPE(8), rotary.RoPE(8, base=500.0)


def _qk(rng: np.random.Generator, **extra: np.ndarray) -> Arrays:
    return {"q": _n(rng, 1, 2, 3, 8), "k": _n(rng, 1, 1, 3, 8), **extra}


def _qkv(rng: np.random.Generator) -> Arrays:
    return {**_qk(rng), "v": _n(rng, 1, 1, 3, 4), "pos": _frac(rng, 3)}


#: The public functions, each with its differentiable inputs (grouped-query heads where q and k
#: appear: 2 query heads share 1 key head).
CASES: dict[str, Case] = {
    "rotate": Case(
        lambda x, pos: (rotary.rotate(x, pos),),
        lambda r: {"x": _n(r, 2, 3, 8), "pos": _frac(r, 3)},
        ("x", "pos"),
    ),
    "apply": Case(
        lambda q, k, pos: rotary.apply(q, k, pos), lambda r: _qk(r, pos=_frac(r, 3)), ("q", "k", "pos")
    ),
    "RoPE.apply yarn partial interleaved": Case(
        lambda q, k, pos: _YARN.apply(q, k, pos), lambda r: _qk(r, pos=_frac(r, 3)), ("q", "k", "pos")
    ),
    "RoPE.rotate float32 angles": Case(
        lambda x, pos: (_F32.rotate(x, pos),),
        lambda r: {"x": _n(r, 2, 3, 8), "pos": _frac(r, 3)},
        ("x", "pos"),
        eps=2.0**-23,  # (the angles are formed in float32: so are their derivatives)
    ),
    "RoPE.apply k_pos": Case(
        lambda q, k, pos, k_pos: _SRC.apply(q, k, pos, k_pos=k_pos),
        lambda r: _qk(r, pos=_frac(r, 3), k_pos=_frac(r, 3)),
        ("q", "k", "pos", "k_pos"),
    ),
    "RoPE.apply decode": Case(
        lambda q, k, pos: _SRC.apply(q, k, pos),
        lambda r: {"q": _n(r, 1, 2, 1, 8), "k": _n(r, 1, 1, 1, 8), "pos": np.array([37])},
        ("q", "k"),
        torch_only=True,
    ),
    "RoPE.rotate table": Case(
        lambda x, pos: (_SRC.rotate(x, pos),),
        lambda r: {"x": _n(r, 2, 3, 8), "pos": np.array([5, 4000, 30000])},
        ("x",),
        torch_only=True,
    ),
    "RoPE.rotate huge": Case(
        lambda x, pos: (_SRC.rotate(x, pos),),
        lambda r: {"x": _n(r, 2, 3, 8), "pos": np.array([2**30 + 5, 2**31 - 1, -(2**30)])},
        ("x",),
        torch_only=True,
    ),
    "RoPE.cos_sin": Case(
        lambda pos: _YARN.cos_sin(pos, dtype=pos.dtype), lambda r: {"pos": _frac(r, 3)}, ("pos",)
    ),
    "AxialRoPE.apply": Case(
        lambda q, k, pos: _AXIAL.apply(q, k, pos), lambda r: _qk(r, pos=_frac(r, 3, 2)), ("q", "k", "pos")
    ),
    "MRoPE.apply": Case(
        lambda q, k, pos: _MROPE.apply(q, k, pos), lambda r: _qk(r, pos=_frac(r, 3, 3)), ("q", "k", "pos")
    ),
    "learned.rotate": Case(
        lambda x, pos, freqs: (rotary.learned.rotate(x, pos, freqs),),
        lambda r: {"x": _n(r, 2, 3, 8), "pos": _frac(r, 3), "freqs": r.uniform(0.01, 1.0, 4)},
        ("x", "pos", "freqs"),
    ),
    "learned.apply xpos": Case(
        lambda q, k, pos, freqs: rotary.learned.apply(q, k, pos, freqs, xpos_scale_base=16.0),
        lambda r: _qk(r, pos=_frac(r, 3), freqs=r.uniform(0.01, 1.0, 4)),
        ("q", "k", "pos", "freqs"),
    ),
    "learned.rotate mixed": Case(
        lambda x, pos, freqs: (rotary.learned.rotate(x, pos, freqs),),
        lambda r: {
            "x": _n(r, 1, 2, 3, 8),
            "pos": _frac(r, 3, 2),
            "freqs": r.uniform(-1.0, 1.0, (2, 1, 2, 4)),
        },
        ("x", "pos", "freqs"),
    ),
    "vision.eva02": Case(lambda x: (_TOWER.rotate(x, 2, 3),), lambda r: {"x": _n(r, 1, 2, 6, 8)}, ("x",)),
    "attention": Case(
        lambda q, k, v, pos: (rotary.attention(q, k, v, pos, causal=True),), _qkv, ("q", "k", "v", "pos")
    ),
    "linear_attention causal": Case(
        lambda q, k, v, pos: (rotary.linear_attention(q, k, v, pos, causal=True, chunk_size=2),),
        _qkv,
        ("q", "k", "v", "pos"),
    ),
    "linear_attention": Case(
        lambda q, k, v, pos: (rotary.linear_attention(q, k, v, pos),), _qkv, ("q", "k", "v", "pos")
    ),
    "linear_attention delta rule": Case(
        lambda q, k, v, pos, g, beta: (
            rotary.linear_attention(
                q,
                k,
                v,
                pos,
                causal=True,
                chunk_size=2,
                normalize=False,
                log_gate=-(g * g),
                beta=beta,
                qk_l2norm=True,
            ),
        ),
        lambda r: {
            **_qkv(r),
            "g": _n(r, 1, 1, 3, 8),
            "beta": r.uniform(0.1, 1.0, (1, 1, 3)),
        },  # (KDA: per feature)
        ("q", "k", "v", "pos", "g", "beta"),
    ),
    "convert_layout": Case(
        lambda x: (rotary.convert_layout(x, "half", "interleaved"),), lambda r: {"x": _n(r, 2, 3, 8)}, ("x",)
    ),
    "positions.rerotate_keys": Case(
        lambda k, pos: (rpos.rerotate_keys(k, pos, _SRC, _DST),),
        lambda r: {"k": _n(r, 1, 1, 3, 8), "pos": np.array([3, 700, 9000])},
        ("k",),
    ),
}


# -- torch ---------------------------------------------------------------------------------------
def _loss(outs: tuple[Any, ...], ws: tuple[Any, ...]) -> Any:
    total = 0.0
    for o, w in zip(outs, ws, strict=True):
        total = total + (o * w).sum()
    return total


def _at(xs: tuple[Any, ...], i: int, a: Any) -> tuple[Any, ...]:
    return (*xs[:i], a, *xs[i + 1 :])


def _req(xs: tuple[Any, ...], which: Any = None) -> tuple[Any, ...]:
    """Fresh leaves of ``xs`` (every one, or those whose index is in ``which``) requiring grad."""
    return tuple(
        x.detach().clone().requires_grad_(which is None or j in which) if x.is_floating_point() else x
        for j, x in enumerate(xs)
    )


def _torch_grads(outs: Any, xs: tuple[Any, ...], ws: tuple[Any, ...], *, create_graph: bool = False) -> tuple:
    import torch

    need = [x for x in xs if x.requires_grad]
    got = torch.autograd.grad(_loss(outs, ws), need, create_graph=create_graph, allow_unused=True)
    it = iter(got)
    return tuple(
        (g if (g := next(it)) is not None else torch.zeros_like(x)) if x.requires_grad else None for x in xs
    )


def t_eager(F, xs, i, ws, t, u):  # type: ignore[no-untyped-def]
    return tuple(F(*xs))


def t_no_grad(F, xs, i, ws, t, u):  # type: ignore[no-untyped-def]
    import torch

    with torch.no_grad():
        return tuple(F(*_req(xs)))


def t_inference_mode(F, xs, i, ws, t, u):  # type: ignore[no-untyped-def]
    import torch

    with torch.inference_mode():
        return tuple(o.clone() for o in F(*(x.clone() for x in xs)))


def t_backward(F, xs, i, ws, t, u):  # type: ignore[no-untyped-def]
    """``.backward()`` with only ``xs[i]`` requiring grad."""
    leaves = _req(xs, {i})
    _loss(F(*leaves), ws).backward()
    return (leaves[i].grad,)


def t_backward_all(F, xs, i, ws, t, u):  # type: ignore[no-untyped-def]
    """``.backward()`` with every differentiable input requiring grad: every gradient."""
    leaves = _req(xs)
    _loss(F(*leaves), ws).backward()
    return tuple(x.grad for x in leaves if x.is_floating_point())


def t_double_backward(F, xs, i, ws, t, u):  # type: ignore[no-untyped-def]
    """``d/d xs_j <dL/d xs_i, u>`` for every j (``create_graph=True``): the mixed second derivatives."""
    import torch

    leaves = _req(xs)
    g = torch.autograd.grad(_loss(F(*leaves), ws), leaves[i], create_graph=True)[0]
    floats = [x for x in leaves if x.is_floating_point()]
    if not g.requires_grad:  # F is linear in every input: no second derivative
        return tuple(torch.zeros_like(x) for x in floats)
    out = torch.autograd.grad((g * u).sum(), floats, allow_unused=True)
    return tuple(torch.zeros_like(x) if o is None else o for o, x in zip(out, floats, strict=True))


def t_forward_ad(F, xs, i, ws, t, u):  # type: ignore[no-untyped-def]
    import torch.autograd.forward_ad as fwad

    with fwad.dual_level():
        outs = F(*_at(xs, i, fwad.make_dual(xs[i], t)))
        tangents = [fwad.unpack_dual(o).tangent for o in outs]
    return tuple(o.new_zeros(o.shape) if d is None else d for o, d in zip(outs, tangents, strict=True))


def _one(F, xs, i):  # type: ignore[no-untyped-def]
    return lambda a: tuple(F(*_at(xs, i, a)))


def t_func_grad(F, xs, i, ws, t, u):  # type: ignore[no-untyped-def]
    import torch

    return (torch.func.grad(lambda a: _loss(_one(F, xs, i)(a), ws))(xs[i]),)


def t_func_vjp(F, xs, i, ws, t, u):  # type: ignore[no-untyped-def]
    import torch

    _, vjp = torch.func.vjp(_one(F, xs, i), xs[i])
    return tuple(vjp(tuple(ws)))


def t_func_jvp(F, xs, i, ws, t, u):  # type: ignore[no-untyped-def]
    import torch

    return tuple(torch.func.jvp(_one(F, xs, i), (xs[i],), (t,))[1])


def t_jacrev(F, xs, i, ws, t, u):  # type: ignore[no-untyped-def]
    import torch

    return (torch.func.jacrev(lambda a: _one(F, xs, i)(a)[0])(xs[i]),)


def t_jacfwd(F, xs, i, ws, t, u):  # type: ignore[no-untyped-def]
    import torch

    return (torch.func.jacfwd(lambda a: _one(F, xs, i)(a)[0])(xs[i]),)


def t_hessian(F, xs, i, ws, t, u):  # type: ignore[no-untyped-def]
    """``torch.func.hessian`` of the scalar loss in ``xs[i]``, applied to ``u``."""
    import torch

    h = torch.func.hessian(lambda a: _loss(_one(F, xs, i)(a), ws))(xs[i])
    n = xs[i].numel()
    return ((h.reshape(n, n) @ u.reshape(n)).reshape(xs[i].shape),)


def t_vmap(F, xs, i, ws, t, u):  # type: ignore[no-untyped-def]
    """``torch.func.vmap`` over a batch of two values of ``xs[i]`` (``xs[i]`` and ``xs[i] + t``)."""
    import torch

    return tuple(torch.func.vmap(_one(F, xs, i))(torch.stack([xs[i], xs[i] + t])))


def t_jacobian_vectorize(F, xs, i, ws, t, u):  # type: ignore[no-untyped-def]
    import torch

    return (torch.autograd.functional.jacobian(lambda a: _one(F, xs, i)(a)[0], xs[i], vectorize=True),)


def t_grads_batched(F, xs, i, ws, t, u):  # type: ignore[no-untyped-def]
    """``autograd.grad(..., is_grads_batched=True)`` with the identity as cotangents: the Jacobian."""
    import torch

    leaves = _req(xs, {i})
    y = F(*leaves)[0]
    if not y.requires_grad:  # (the output does not depend on this input)
        return (y.new_zeros((*y.shape, *xs[i].shape)),)
    eye = torch.eye(y.numel(), dtype=y.dtype).reshape(y.numel(), *y.shape)
    g = torch.autograd.grad(y, leaves[i], eye, is_grads_batched=True)[0]
    return (g.reshape(*y.shape, *xs[i].shape),)


def t_compile(F, xs, i, ws, t, u):  # type: ignore[no-untyped-def]
    import torch

    return tuple(torch.compile(F, fullgraph=True, backend="aot_eager")(*xs))


def t_compile_backward(F, xs, i, ws, t, u):  # type: ignore[no-untyped-def]
    import torch

    leaves = _req(xs)
    _loss(torch.compile(F, fullgraph=True, backend="aot_eager")(*leaves), ws).backward()
    return tuple(x.grad for x in leaves if x.is_floating_point())


def t_make_fx(F, xs, i, ws, t, u):  # type: ignore[no-untyped-def]
    from torch.fx.experimental.proxy_tensor import make_fx

    # (F closes over the case's other inputs, real tensors: lifted as constants, as export does)
    return tuple(make_fx(F, tracing_mode="symbolic", _allow_non_fake_inputs=True)(*xs)(*xs))


def t_make_fx_real(F, xs, i, ws, t, u):  # type: ignore[no-untyped-def]
    """``make_fx`` in its real mode, traced at other values (``1.5 x + 0.25``), run at ``xs``."""
    from torch.fx.experimental.proxy_tensor import make_fx

    return tuple(make_fx(F, tracing_mode="real")(*(x * 1.5 + 0.25 for x in xs))(*xs))


def t_make_fx_fake(F, xs, i, ws, t, u):  # type: ignore[no-untyped-def]
    from torch.fx.experimental.proxy_tensor import make_fx

    return tuple(make_fx(F, tracing_mode="fake", _allow_non_fake_inputs=True)(*xs)(*xs))


def t_export(F, xs, i, ws, t, u):  # type: ignore[no-untyped-def]
    """``torch.export`` (non-strict), ``save``, ``load``, run."""
    import torch

    class M(torch.nn.Module):
        def forward(self, *a: Any) -> Any:
            return tuple(F(*a))

    buf = io.BytesIO()
    torch.export.save(torch.export.export(M(), tuple(xs), strict=False), buf)
    buf.seek(0)
    return tuple(torch.export.load(buf).module()(*xs))


def t_jit_trace(F, xs, i, ws, t, u):  # type: ignore[no-untyped-def]
    """``torch.jit.trace`` at other values (every input ``1.5 x + 0.25``), run at ``xs``: the
    inputs are data of the trace (a value read while tracing would give the example's answer), and
    the first trace in a process passes torch's check (``check_trace``: traced twice, the same
    graph)."""
    import warnings

    import torch

    example = tuple(x * 1.5 + 0.25 for x in xs)
    with warnings.catch_warnings():  # (shape checks warn: a trace is specialised to its shapes)
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        traced = torch.jit.trace(lambda *a: tuple(F(*a)), example, check_trace=True)
    return tuple(traced(*xs))


def t_fx_symbolic_trace(F, xs, i, ws, t, u):  # type: ignore[no-untyped-def]
    """``torch.fx.symbolic_trace`` refuses clearly (its Proxies have no shapes), naming what to
    use instead; the function itself is unchanged afterwards."""
    import pytest
    import torch

    names = ", ".join(f"a{j}" for j in range(len(xs)))  # (fx traces named parameters, not *args)
    scope: dict[str, Any] = {"F": F}
    exec(f"def forward(self, {names}):\n    return tuple(F({names}))", scope)
    M = type("M", (torch.nn.Module,), {"forward": scope["forward"]})
    with pytest.raises(TypeError, match=r"torch\.fx Proxy.*torch\.export"):
        torch.fx.symbolic_trace(M())
    return tuple(F(*xs))


#: torch transforms: name -> (transform, the reference it must equal (see :func:`reference`)).
TORCH_TRANSFORMS: dict[str, tuple[Callable[..., tuple[Any, ...]], str]] = {
    "eager": (t_eager, "value"),
    "no_grad": (t_no_grad, "value"),
    "inference_mode": (t_inference_mode, "value"),
    "backward": (t_backward, "grad"),
    "backward all inputs": (t_backward_all, "grads"),
    "double backward": (t_double_backward, "mixed"),
    "forward AD": (t_forward_ad, "jvp"),
    "func.grad": (t_func_grad, "grad"),
    "func.vjp": (t_func_vjp, "grad"),
    "func.jvp": (t_func_jvp, "jvp"),
    "func.jacrev": (t_jacrev, "jacobian"),
    "func.jacfwd": (t_jacfwd, "jacobian"),
    "func.hessian": (t_hessian, "hvp"),
    "func.vmap": (t_vmap, "vmap"),
    "jacobian vectorize": (t_jacobian_vectorize, "jacobian"),
    "grads batched": (t_grads_batched, "jacobian"),
    "compile fullgraph": (t_compile, "value"),
    "compile backward": (t_compile_backward, "grads"),
    "make_fx symbolic": (t_make_fx, "value"),
    "export save load": (t_export, "value"),
    "make_fx real": (t_make_fx_real, "value"),
    "make_fx fake": (t_make_fx_fake, "value"),
    "jit.trace": (t_jit_trace, "value"),
    "fx.symbolic_trace refused": (t_fx_symbolic_trace, "value"),
}


# -- JAX -----------------------------------------------------------------------------------------
# The JAX transforms of one function and input run together in one outer ``jax.jit`` (see
# ``tests/test_transforms.py``): inside a transformation rotary sees tracers whether or not an
# outer jit is there (the same traced code path), and one XLA program compiles many times faster
# than op-by-op evaluation of each transformed function.  "eager" runs outside it.
def _jloss(outs: tuple[Any, ...], ws: tuple[Any, ...]) -> Any:
    return sum((o * w).sum() for o, w in zip(outs, ws, strict=True))


def j_eager(F, xs, i, ws, t, u):  # type: ignore[no-untyped-def]
    """Eager calls (rotary runs each as one compiled program of its own)."""
    return tuple(F(*xs))


def j_value(F, xs, i, ws, t, u):  # type: ignore[no-untyped-def]
    return tuple(F(*xs))


def j_grad(F, xs, i, ws, t, u):  # type: ignore[no-untyped-def]
    import jax

    return (jax.grad(lambda a: _jloss(_one(F, xs, i)(a), ws))(xs[i]),)


def j_vjp(F, xs, i, ws, t, u):  # type: ignore[no-untyped-def]
    import jax

    _, vjp = jax.vjp(_one(F, xs, i), xs[i])
    return tuple(vjp(tuple(ws)))


def j_jvp(F, xs, i, ws, t, u):  # type: ignore[no-untyped-def]
    import jax

    return tuple(jax.jvp(_one(F, xs, i), (xs[i],), (t,))[1])


def j_hessian(F, xs, i, ws, t, u):  # type: ignore[no-untyped-def]
    import jax

    h = jax.hessian(lambda a: _jloss(_one(F, xs, i)(a), ws))(xs[i])
    n = xs[i].size
    return ((h.reshape(n, n) @ u.reshape(n)).reshape(xs[i].shape),)


def j_vmap(F, xs, i, ws, t, u):  # type: ignore[no-untyped-def]
    import jax
    import jax.numpy as jnp

    return tuple(jax.vmap(_one(F, xs, i))(jnp.stack([xs[i], xs[i] + t])))


def j_vmap_grad(F, xs, i, ws, t, u):  # type: ignore[no-untyped-def]
    """Per-example gradients: ``vmap(grad)`` over the batch of :func:`j_vmap`; its reference is
    the two gradients stacked."""
    import jax
    import jax.numpy as jnp

    g = jax.grad(lambda a: _jloss(_one(F, xs, i)(a), ws))
    return (jax.vmap(g)(jnp.stack([xs[i], xs[i] + t])),)


JAX_TRANSFORMS: dict[str, tuple[Callable[..., tuple[Any, ...]], str]] = {
    "eager": (j_eager, "value"),
    "jit": (j_value, "value"),
    "grad": (j_grad, "grad"),
    "vjp": (j_vjp, "grad"),
    "jvp": (j_jvp, "jvp"),
    "hessian": (j_hessian, "hvp"),
    "vmap": (j_vmap, "vmap"),
    "vmap(grad)": (j_vmap_grad, "vmap_grad"),
}


# -- the float64 references (torch, generic code, plain reverse mode) -------------------------------
def reference(kind: str, F: Callable[..., Any], xs: tuple[Any, ...], i: int, ws, t, u) -> tuple[Any, ...]:  # type: ignore[no-untyped-def]
    """What a transform of reference ``kind`` must equal: ``F`` (torch, float64) differentiated by
    plain reverse-mode autograd with the fast paths off (checked against finite differences by
    ``tests/test_transforms.py``)."""
    import torch

    with rotary.fast_paths(False):
        if kind == "value":
            return tuple(o.detach() for o in F(*xs))
        if kind == "vmap":
            a, b = (tuple(F(*_at(xs, i, v))) for v in (xs[i], xs[i] + t))
            return tuple(torch.stack([p.detach(), q.detach()]) for p, q in zip(a, b, strict=True))
        if kind == "vmap_grad":
            g = [reference("grad", F, _at(xs, i, v), i, ws, t, u)[0] for v in (xs[i], xs[i] + t)]
            return (torch.stack(g),)
        if kind == "grad":
            return (_torch_grads(F(*(leaves := _req(xs, {i}))), leaves, ws)[i],)
        if kind == "grads":
            leaves = _req(xs)
            return tuple(
                g for g, x in zip(_torch_grads(F(*leaves), leaves, ws), leaves) if x.is_floating_point()
            )
        if kind == "mixed":
            return t_double_backward(F, xs, i, ws, t, u)
        if kind in ("jacobian", "jvp"):
            leaves = _req(xs, {i})
            outs = F(*leaves)
            jac = []
            for o in outs:
                flat = o.reshape(-1)
                rows = [
                    torch.autograd.grad(flat[r], leaves[i], retain_graph=True, allow_unused=True)[0]
                    if o.requires_grad
                    else None
                    for r in range(flat.numel())
                ]
                z = torch.zeros_like(xs[i])
                jac.append(torch.stack([z if g is None else g for g in rows]).reshape(*o.shape, *xs[i].shape))
            if kind == "jacobian":
                return (jac[0],)
            n = xs[i].numel()
            return tuple(
                (j.reshape(-1, n) @ t.reshape(n)).reshape(o.shape) for j, o in zip(jac, outs, strict=True)
            )
        if kind == "hvp":
            leaves = _req(xs, {i})
            g = torch.autograd.grad(_loss(F(*leaves), ws), leaves[i], create_graph=True)[0]
            h = (
                torch.autograd.grad((g * u).sum(), leaves[i], allow_unused=True)[0]
                if g.requires_grad
                else None
            )
            return (torch.zeros_like(xs[i]) if h is None else h,)
    raise ValueError(kind)


# -- every public entry point, for the tracers (torch.compile fullgraph, jax.jit) -------------------
_LONGROPE = rotary.RoPE(
    16,
    scaling={
        "rope_type": "longrope",
        "factor": 4.0,
        "original_max_position_embeddings": 4,
        "short_factor": [1.0] * 8,
        "long_factor": [2.0] * 8,
    },
)
_R16, _MR16, _AX16 = rotary.RoPE(16), rotary.MRoPE(16, (2, 3, 3)), rotary.AxialRoPE(16, 2)
#: A model with position-dependent query scales (Ministral 3's ``llama_4_scaling_beta``).
MINISTRAL3 = {
    "model_type": "ministral3",
    "head_dim": 16,
    "num_hidden_layers": 2,
    "rope_parameters": {
        "rope_type": "default",
        "rope_theta": 1e6,
        "llama_4_scaling_beta": 0.1,
        "original_max_position_embeddings": 4,
    },
}
_MODEL = rotary.hf.model_rope(MINISTRAL3)


def entry_arrays(rng: np.random.Generator) -> Arrays:
    """The inputs of :data:`ENTRY_POINTS` (float32 data, integer positions)."""
    f32 = np.float32
    return {
        "q": rng.standard_normal((2, 4, 8, 16)).astype(f32),
        "k": rng.standard_normal((2, 2, 8, 16)).astype(f32),
        "v": rng.standard_normal((2, 2, 8, 16)).astype(f32),
        "p": np.arange(8) * 3 + 1,
        "pf": np.arange(8) / 3.0,
        "freqs": rng.uniform(0.01, 1.0, 8).astype(f32),
        "lengths": np.array([3, 5]),
        "cu": np.array([0, 3, 8]),
        "mask": np.array([[0, 0, 1, 1, 1, 1, 1, 1], [1] * 8]),
        "deltas": np.array([[2], [0]]),
    }


def _vision(name: str) -> Callable[[dict[str, Any], Any], Any]:
    def call(a: dict[str, Any], xp: Any) -> Any:
        tower = getattr(rotary.vision, name)(16)
        n = tower.positions(2, 2).shape[0]
        return tower.apply(a["q"][:, :, :n], a["k"][:, :, :n], 2, 2)

    return call


#: Every public entry point as a function of :func:`entry_arrays` (converted to one library) and
#: that library's namespace ``xp``:
#: run eagerly, under ``torch.compile(fullgraph=True)`` and under ``jax.jit``, equal results.
#: ``positions.mrope_position_ids`` / ``hf.mrope_index`` are host work on the prompt's layout and
#: refuse a trace (``tests/test_transforms.py``).
ENTRY_POINTS: dict[str, Callable[[dict[str, Any], Any], Any]] = {
    "apply": lambda a, xp: rotary.apply(a["q"], a["k"], a["p"], layout="interleaved", rotary_dim=8),
    "rotate": lambda a, xp: rotary.rotate(a["q"], a["p"], scaling={"rope_type": "linear", "factor": 2.0}),
    "rotate fractional": lambda a, xp: rotary.rotate(a["q"], a["pf"]),
    "RoPE.apply k_pos": lambda a, xp: _R16.apply(a["q"], a["k"], a["p"], k_pos=a["p"] + 1),
    "RoPE.cos_sin": lambda a, xp: _R16.cos_sin(a["p"], full=True),
    "RoPE.inv_freq": lambda a, xp: _R16.inv_freq(xp=xp, dtype=xp.float32),
    "AxialRoPE.apply": lambda a, xp: _AX16.apply(a["q"], a["k"], a["pf"][:, None] * a["pf"][None, :2]),
    "MRoPE.apply": lambda a, xp: _MR16.apply(
        a["q"], a["k"], a["p"][None, :] * a["lengths"][:1, None] + a["cu"][:, None]
    ),
    "attention": lambda a, xp: rotary.attention(a["q"], a["k"], a["v"], a["p"], causal=True),
    "linear_attention": lambda a, xp: rotary.linear_attention(a["q"], a["k"], a["v"], a["p"]),
    "linear_attention causal": lambda a, xp: rotary.linear_attention(
        a["q"], a["k"], a["v"], a["p"], causal=True, chunk_size=4
    ),
    "linear_attention_state + combine": lambda a, xp: (
        rotary.combine(
            rotary.linear_attention_state(a["k"], a["v"], a["p"]),
            rotary.linear_attention_state(a["k"], a["v"], a["p"] + 8),
        ).S
    ),
    "convert_layout": lambda a, xp: rotary.convert_layout(a["q"], "half", "interleaved", rotary_dim=8),
    "decay_bound": lambda a, xp: rotary.decay_bound(a["p"], 16),
    "learned.rotate": lambda a, xp: rotary.learned.rotate(a["q"], a["p"], a["freqs"]),
    "learned.apply xpos": lambda a, xp: rotary.learned.apply(
        a["q"], a["k"], a["p"], a["freqs"], xpos_scale_base=64.0
    ),
    "learned.cos_sin": lambda a, xp: rotary.learned.cos_sin(a["pf"], a["freqs"]),
    "learned.xpos_scale": lambda a, xp: rotary.learned.xpos_scale(a["p"], head_dim=16, xp=xp),
    "positions.from_lengths": lambda a, xp: rpos.from_lengths(a["lengths"], total=8),
    "positions.from_cu_seqlens": lambda a, xp: rpos.from_cu_seqlens(a["cu"], total=8),
    "positions.from_attention_mask": lambda a, xp: rpos.from_attention_mask(a["mask"]),
    "positions.mrope_text_positions": lambda a, xp: rpos.mrope_text_positions(a["mask"], a["deltas"]),
    "positions.shift_keys": lambda a, xp: rpos.shift_keys(a["k"], a["p"][0], _R16),
    "positions.rerotate_keys": lambda a, xp: rpos.rerotate_keys(a["k"], a["p"], _R16, _DST16),
    "positions.longrope_switch": lambda a, xp: rpos.longrope_switch(a["k"], a["p"], _LONGROPE),
    "hf.ModelRope.query_scale": lambda a, xp: _MODEL.query_scale(0, a["p"]),
    **{
        f"vision.{n}": _vision(n)
        for n in ("eva02", "pixel", "dinov3", "llama4", "pixtral", "qwen2_vl", "mlcd")
    },
}
_DST16 = rotary.RoPE(16, base=500.0)
