"""The transform matrix: every public function x every transform x every differentiable input, on
torch and JAX, with the fast paths on and off (``tests/transforms.py`` holds the parts).

Each entry asserts that

1. with the fast paths on, the transform gives exactly what it gives with them off (a fast path
   gives the generic code's answer, or steps aside);
2. that result equals its float64 reference, the generic code's plain reverse-mode derivative
   (within a few hundred float64 ulps of the result's scale: different modes round differently);
3. and the references themselves match central finite differences of the function
   (:func:`test_references_match_finite_differences`).

Transforms that do not depend on which input is differentiated (values, every gradient at once)
run once per function.  The cold variants (a transform as the first thing a process does) run in
fresh processes: ``tests/test_state.py`` with the contexts of ``tests/state_scenarios.py``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from transforms import CASES, ENTRY_POINTS, JAX_TRANSFORMS, TORCH_TRANSFORMS, Case, entry_arrays, reference

import rotary

torch = pytest.importorskip("torch")

#: References that do not depend on the input differentiated: one entry per function.
_WHOLE = frozenset({"value", "grads"})

#: Transforms that compile, trace or export a graph: in the slow matrix (``pytest -m matrix``);
#: autograd, forward AD and ``torch.func`` run in the quick suite.
_GRAPHS = frozenset(
    {"compile fullgraph", "compile backward", "export save load", "jit.trace"}
    | {"make_fx symbolic", "make_fx real", "make_fx fake"}
)
assert _GRAPHS <= TORCH_TRANSFORMS.keys(), _GRAPHS - TORCH_TRANSFORMS.keys()


def _entries(transforms: dict[str, tuple[Callable[..., Any], str]]) -> list[Any]:
    out = []
    for cname, case in CASES.items():
        for tname, (_, kind) in transforms.items():
            wrts = ["all"] if kind in _WHOLE else list(case.diff)
            marks = [pytest.mark.matrix] if tname in _GRAPHS else []
            out.extend(pytest.param(cname, tname, w, id=f"{cname}-{tname}-{w}", marks=marks) for w in wrts)
    return out


def _bind(
    case: Case, conv: Callable[[np.ndarray], Any]
) -> tuple[Callable[..., tuple[Any, ...]], tuple[Any, ...]]:
    arrays = case.make(np.random.default_rng(0))
    const = {k: conv(v) for k, v in arrays.items() if k not in case.diff}

    def F(*xs: Any) -> tuple[Any, ...]:
        return tuple(case.fn(**const, **dict(zip(case.diff, xs, strict=True))))

    return F, tuple(conv(arrays[n]) for n in case.diff)


def _probes(outs: tuple[Any, ...], x: Any, conv: Callable[[np.ndarray], Any]) -> tuple[Any, Any, Any]:
    r = np.random.default_rng(1)
    ws = tuple(conv(r.standard_normal(tuple(o.shape))) for o in outs)
    return ws, conv(r.standard_normal(tuple(x.shape))), conv(r.standard_normal(tuple(x.shape)))


def _np(a: Any) -> np.ndarray:
    return np.asarray(rotary.testing.to_numpy(a), dtype=np.float64)


def _close(got: tuple[Any, ...], want: tuple[Any, ...], what: str, eps: float) -> None:
    assert len(got) == len(want), what
    for j, (g, w) in enumerate(zip(got, want, strict=True)):
        g, w = _np(g), _np(w)
        assert g.shape == w.shape, f"{what} [{j}]: shape {g.shape} != {w.shape}"
        scale = max(1.0, float(np.abs(w).max(initial=0.0)))
        err = float(np.abs(g - w).max(initial=0.0))
        assert err <= 512 * eps * scale, f"{what} [{j}]: error {err:.3g} (scale {scale:.3g})"


def _same(fast: tuple[Any, ...], slow: tuple[Any, ...], what: str, ulps: float = 0.0) -> None:
    """Bit for bit (``ulps=0``), or within ``ulps`` float64 ulps of the result's scale."""
    for j, (a, b) in enumerate(zip(fast, slow, strict=True)):
        a, b = _np(a), _np(b)
        assert a.shape == b.shape, what
        tol = ulps * np.finfo(np.float64).eps * max(1.0, float(np.abs(b).max(initial=0.0)))
        err = float(np.abs(a - b).max(initial=0.0))
        assert (err <= tol) if ulps else np.array_equal(a, b, equal_nan=True), (
            f"{what} [{j}]: the fast paths differ from the generic code by {err:.3g}"
        )


def _torch_conv(a: np.ndarray) -> Any:
    return torch.from_numpy(np.ascontiguousarray(a))


@pytest.mark.parametrize(("cname", "tname", "wrt"), _entries(TORCH_TRANSFORMS))
def test_torch(cname: str, tname: str, wrt: str) -> None:
    case = CASES[cname]
    fn, kind = TORCH_TRANSFORMS[tname]
    F, xs = _bind(case, _torch_conv)
    i = 0 if wrt == "all" else case.diff.index(wrt)
    ws, t, u = _probes(F(*xs), xs[i], _torch_conv)
    if kind == "value" and tname in ("compile fullgraph", "export save load", "make_fx symbolic"):
        torch._dynamo.reset()
    fast = fn(F, xs, i, ws, t, u)
    with rotary.fast_paths(False):
        slow = fn(F, xs, i, ws, t, u)
    what = f"{cname} / {tname} / {wrt}"
    _same(fast, slow, what)
    _close(fast, reference(kind, F, xs, i, ws, t, u), what, case.eps)


def _jax_run(F: Any, xs: tuple[Any, ...], i: int, ws: Any, t: Any, u: Any) -> dict[str, tuple[Any, ...]]:
    """Every JAX transform of ``F`` in ``xs[i]``: "eager" as plain calls, the others in one jit."""
    import jax

    inner = {n: fn for n, (fn, _) in JAX_TRANSFORMS.items() if n != "eager"}
    out = dict(jax.jit(lambda *a: {n: tuple(fn(F, a, i, ws, t, u)) for n, fn in inner.items()})(*xs))
    out["eager"] = tuple(JAX_TRANSFORMS["eager"][0](F, xs, i, ws, t, u))
    return out


@pytest.mark.parametrize(
    ("cname", "wrt"),
    [
        pytest.param(c, w, id=f"{c}-{w}")
        for c, case in CASES.items()
        if not case.torch_only
        for w in case.diff
    ],
)
def test_jax(cname: str, wrt: str) -> None:
    """Every JAX transform (:data:`JAX_TRANSFORMS`) of one function in one input."""
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    case = CASES[cname]
    i = case.diff.index(wrt)
    with jax.enable_x64(True):
        F, xs = _bind(case, jnp.asarray)
        ws, t, u = _probes(F(*xs), xs[i], jnp.asarray)
        fast = _jax_run(F, xs, i, ws, t, u)
        with rotary.fast_paths(False):
            slow = _jax_run(F, xs, i, ws, t, u)
        Ft, xt = _bind(case, _torch_conv)  # the references: torch, float64, the same inputs
        wt = tuple(_torch_conv(_np(w)) for w in ws)
        for tname, (_, kind) in JAX_TRANSFORMS.items():
            what = f"{cname} / {tname} / {wrt}"
            # (XLA compiles the two programs apart and may contract multiply-adds differently)
            _same(fast[tname], slow[tname], what, ulps=8.0)
            _close(
                fast[tname],
                reference(kind, Ft, xt, i, wt, _torch_conv(_np(t)), _torch_conv(_np(u))),
                what,
                case.eps,
            )


# -- the references against finite differences -------------------------------------------------------
def _fd(f: Callable[[np.ndarray], np.ndarray], x: np.ndarray, d: np.ndarray, h: float) -> np.ndarray:
    return (f(x + h * d) - f(x - h * d)) / (2 * h)


@pytest.mark.parametrize(
    ("cname", "wrt"), [pytest.param(c, w, id=f"{c}-{w}") for c, case in CASES.items() for w in case.diff]
)
def test_references_match_finite_differences(cname: str, wrt: str) -> None:
    """The references (generic code, plain autograd) are derivatives: gradient, Jacobian-vector and
    Hessian-vector products agree with central differences of the function itself."""
    case = CASES[cname]
    F, xs = _bind(case, _torch_conv)
    i = case.diff.index(wrt)
    ws, t, u = _probes(F(*xs), xs[i], _torch_conv)

    def loss(a: np.ndarray) -> np.ndarray:
        with rotary.fast_paths(False):
            outs = F(*((*xs[:i], _torch_conv(a), *xs[i + 1 :])))
        return np.asarray(sum(float((o * w).sum()) for o, w in zip(outs, ws, strict=True)))

    def grad(a: np.ndarray) -> np.ndarray:
        b = (*xs[:i], _torch_conv(a), *xs[i + 1 :])
        return _np(reference("grad", F, b, i, ws, t, u)[0])

    x0, tn, un = _np(xs[i]), _np(t), _np(u)
    g = grad(x0)
    jvp = sum(
        _np(j).reshape(-1) @ _np(w).reshape(-1)
        for j, w in zip(reference("jvp", F, xs, i, ws, t, u), ws, strict=True)
    )
    gt = float(g.reshape(-1) @ tn.reshape(-1))
    assert abs(float(jvp) - gt) <= 64 * case.eps * max(1.0, abs(gt)), (cname, wrt, "w.J t != g.t")
    # central differences: step eps**(1/3) of the function's precision, error ~ eps**(2/3)
    h, tol = case.eps ** (1 / 3), 1e3 * case.eps ** (2 / 3)
    fd = float(_fd(loss, x0, tn, h))
    scale = max(1.0, float(np.abs(g).sum() * np.abs(tn).max()))
    assert abs(float(g.reshape(-1) @ tn.reshape(-1)) - fd) <= tol * scale, (cname, wrt, "gradient")
    hvp = _np(reference("hvp", F, xs, i, ws, t, u)[0])
    fd2 = _fd(grad, x0, un, h)
    assert np.abs(hvp - fd2).max() <= tol * max(1.0, float(np.abs(fd2).max())), (cname, wrt, "Hessian")


def matrix_size() -> dict[str, int]:
    """The matrix's size: functions, transforms, (function, transform, input) entries per library
    (``python tests/test_transforms.py`` prints it)."""
    n_inputs = sum(len(c.diff) for c in CASES.values())
    return {
        "functions": len(CASES),
        "differentiable inputs": n_inputs,
        "torch transforms": len(TORCH_TRANSFORMS),
        "torch entries": sum(len(c.diff) for c in CASES.values()) * len(TORCH_TRANSFORMS),
        "jax transforms": len(JAX_TRANSFORMS),
        "jax entries": sum(len(c.diff) for c in CASES.values() if not c.torch_only) * len(JAX_TRANSFORMS),
    }


if __name__ == "__main__":
    print(matrix_size())


# -- every public entry point under the tracers --------------------------------------------------
def _leaves(out: Any) -> list[Any]:
    if isinstance(out, (tuple, list)):
        return [y for o in out for y in _leaves(o)]
    return [out]


def _entry_failures(
    run: Callable[[Callable[..., Any]], Any], conv: Callable[[np.ndarray], Any], xp: Any
) -> list[str]:
    a = {k: conv(v) for k, v in entry_arrays(np.random.default_rng(0)).items()}
    bad = []
    for name, f in ENTRY_POINTS.items():
        try:
            want, got = f(a, xp), run(lambda a, f=f: f(a, xp))(a)
            for g, w in zip(_leaves(got), _leaves(want), strict=True):
                np.testing.assert_allclose(_np(g), _np(w), rtol=2e-6, atol=2e-6, err_msg=name)
        except Exception as e:  # collected: one report for every entry point
            bad.append(f"{name}: {type(e).__name__}: {str(e).splitlines()[0][:300]}")
    return bad


@pytest.mark.slow
def test_every_entry_point_under_torch_compile_fullgraph() -> None:
    from rotary.modules.torch import LearnedRoPE

    def run(f: Callable[..., Any]) -> Any:
        torch._dynamo.reset()  # (each entry its own graph: no recompile limit across them)
        return torch.compile(f, fullgraph=True, backend="aot_eager")

    bad = _entry_failures(run, _torch_conv, torch)
    m = LearnedRoPE(rotary.RoPE(16), n_axes=2, heads=4, xpos_scale_base=None)
    q, k = torch.randn(2, 4, 8, 16), torch.randn(2, 4, 8, 16)
    pos = torch.stack([torch.arange(8), torch.arange(8) % 3], -1).float()
    for w, g in zip(m(q, k, pos), run(m)(q, k, pos), strict=True):
        torch.testing.assert_close(g, w, rtol=2e-6, atol=2e-6)
    assert not bad, "\n".join(bad)


@pytest.mark.slow
def test_every_entry_point_under_jax_jit() -> None:
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    bad = _entry_failures(jax.jit, jnp.asarray, jnp)
    flax_modules = pytest.importorskip("rotary.modules.flax")
    from flax import nnx

    m = flax_modules.LearnedRoPE(rotary.RoPE(16), xpos_scale_base=64.0)
    q, k = jnp.ones((2, 4, 8, 16)), jnp.ones((2, 4, 8, 16)) * 0.5
    pos = jnp.arange(8)
    want = m(q, k, pos)
    got = nnx.jit(lambda mod, a, b, p: mod(a, b, p))(m, q, k, pos)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=2e-6, atol=2e-6)
    assert not bad, "\n".join(bad)


def _other_values(a: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Other values of :func:`entry_arrays`, of the same shapes and dtypes (positions moved by 5
    and past the per-position table, other document lengths, another padding)."""
    b = {k: v.copy() for k, v in a.items()}
    b["p"] = a["p"] + 40000
    b["pf"] = a["pf"] + 0.5
    b["lengths"] = a["lengths"][::-1].copy()
    b["cu"] = np.array([0, 5, 8])
    b["mask"] = np.array([[0, 1, 1, 1, 1, 1, 1, 1], [0, 0, 0, 1, 1, 1, 1, 1]])
    b["deltas"] = a["deltas"] + 3
    for k in ("q", "k", "v", "freqs"):
        b[k] = a[k] * 1.5 + 0.25
    return b


def test_every_entry_point_under_jit_trace() -> None:
    """``torch.jit.trace`` of every entry point at other values is right at these: the values are
    data of the trace (a value read while tracing would give the other values' answer), and the
    first trace in a process passes torch's ``check_trace``."""
    import warnings

    a = entry_arrays(np.random.default_rng(0))
    keys = sorted(a)
    example = tuple(_torch_conv(_other_values(a)[k]) for k in keys)
    args = tuple(_torch_conv(a[k]) for k in keys)
    bad = []
    for name, f in ENTRY_POINTS.items():

        def fn(*vals: Any, f: Any = f) -> tuple[Any, ...]:
            return tuple(_leaves(f(dict(zip(keys, vals, strict=True)), torch)))

        try:
            with warnings.catch_warnings():  # (shape checks warn: a trace is specialised to shapes)
                warnings.simplefilter("ignore", torch.jit.TracerWarning)
                traced = torch.jit.trace(fn, example, check_trace=True)
            for g, w in zip(traced(*args), fn(*args), strict=True):
                np.testing.assert_allclose(_np(g), _np(w), rtol=2e-6, atol=2e-6, err_msg=name)
        except Exception as e:  # collected: one report for every entry point
            bad.append(f"{name}: {type(e).__name__}: {str(e).splitlines()[0][:300]}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("lib", ["torch", "jax"])
def test_prompt_layout_helpers_refuse_a_trace_clearly(lib: str) -> None:
    """``mrope_position_ids`` reads the prompt's layout on the host: a clear TypeError inside a
    trace, not a tracer's error from deep inside."""
    types = np.array([[0, 1, 1, 1, 1, 0]])
    if lib == "torch":
        run = torch.compile(lambda t: rotary.positions.mrope_position_ids(t, [[1, 4, 4]]), fullgraph=True)
        arg = torch.from_numpy(types)
    else:
        jax = pytest.importorskip("jax")
        run, arg = (
            jax.jit(lambda t: rotary.positions.mrope_position_ids(t, [[1, 4, 4]])),
            jax.numpy.asarray(types),
        )
    with pytest.raises(Exception, match="reads the prompt's token layout on the host"):
        run(arg)


# -- issue 28's reproductions, through the public API ---------------------------------------------
# (5, 6 and 10 are first contexts of a fresh process: state_scenarios' "make_fx_symbolic",
# "export_save_load" and "transfer_guard_cold_apply", run by tests/test_state.py)
def _fd_position_grad(fn: Callable[[Any], Any], x: Any, p: Any) -> np.ndarray:
    h = 1e-6
    with torch.no_grad():
        return np.array(
            [
                float((fn(x, p + h * e) - fn(x, p - h * e)).sum()) / (2 * h)
                for e in torch.eye(p.numel(), dtype=p.dtype)
            ]
        )


@pytest.mark.parametrize("x_grad", [True, False])
@pytest.mark.parametrize("entry", ["rotate", "apply", "RoPE.rotate"])
def test_regression_position_gradients_are_kept(entry: str, x_grad: bool) -> None:
    # Reproduction 1: with x requiring grad, the custom backward dropped the positions' gradient
    # (p.grad None); the generic code's was right.
    fns = {
        "rotate": lambda x, p: rotary.rotate(x, p),
        "apply": lambda x, p: rotary.apply(x, x.flip(0), p)[0],
        "RoPE.rotate": lambda x, p: rotary.RoPE(8).rotate(x, p),
    }
    fn = fns[entry]
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 8, dtype=torch.float64, generator=g).requires_grad_(x_grad)
    p = torch.linspace(0.5, 4.5, 5, dtype=torch.float64, requires_grad=True)
    fn(x, p).sum().backward()
    assert p.grad is not None
    np.testing.assert_allclose(
        p.grad.numpy(), _fd_position_grad(fn, x.detach(), p.detach()), rtol=1e-7, atol=1e-7
    )


def test_regression_mixed_second_derivative() -> None:
    # Reproduction 2: d/dpos of the data's gradient (create_graph=True) was off by 4.45.
    g = torch.Generator().manual_seed(0)
    x0 = torch.randn(5, 8, dtype=torch.float64, generator=g)
    w = torch.randn(5, 8, dtype=torch.float64, generator=g)

    def mixed() -> Any:
        x = x0.clone().requires_grad_(True)
        p = torch.linspace(0.5, 4.5, 5, dtype=torch.float64, requires_grad=True)
        y = rotary.rotate(x, p)
        gx = torch.autograd.grad((y * y).sum(), x, create_graph=True)[0]
        return torch.autograd.grad((gx * w).sum(), p)[0]

    got = mixed()
    with rotary.fast_paths(False):
        want = mixed()
    assert torch.equal(got, want)
    # and against finite differences of the analytic data gradient: d/dx sum(y*y) = 2 R^T R x = 2x
    # (rotation is orthogonal), so the mixed derivative is 0
    np.testing.assert_allclose(got.numpy(), 0.0, atol=1e-12)


def test_regression_forward_ad() -> None:
    # Reproduction 3: NotImplementedError "Trying to use forward AD with add_out ... out= function".
    import torch.autograd.forward_ad as fwad

    x, t = torch.randn(5, 8), torch.randn(5, 8)
    with fwad.dual_level():
        y = rotary.rotate(fwad.make_dual(x, t), torch.arange(5))
        tangent = fwad.unpack_dual(y).tangent
    assert torch.equal(tangent, rotary.rotate(t, torch.arange(5)))  # linear in the data


def test_regression_batched_gradients() -> None:
    # Reproduction 4: "Batching rule not implemented for aten::add.out".
    x = torch.randn(2, 8, dtype=torch.float64)
    pos = torch.tensor([3, 5])
    jac = torch.autograd.functional.jacobian(lambda a: rotary.rotate(a, pos), x, vectorize=True)
    with rotary.fast_paths(False):
        want = torch.autograd.functional.jacobian(lambda a: rotary.rotate(a, pos), x, vectorize=True)
    assert torch.equal(jac, want)

    def batched() -> Any:
        xr = x.clone().requires_grad_(True)
        y = rotary.rotate(xr, pos, rotary_dim=4)  # partial rotary too
        eye = torch.eye(16, dtype=torch.float64).reshape(16, 2, 8)
        return torch.autograd.grad(y, xr, eye, is_grads_batched=True)[0].reshape(16, 16)

    got = batched()
    with rotary.fast_paths(False):
        assert torch.equal(got, batched())
    jac4 = torch.autograd.functional.jacobian(lambda a: rotary.rotate(a, pos, rotary_dim=4), x)
    torch.testing.assert_close(got, jac4.reshape(16, 16), rtol=0, atol=1e-15)


def test_regression_learned_rope_under_compile_fullgraph() -> None:
    # Reproduction 7: "Dynamo does not know how to trace method find of class str" (the
    # nn.Parameter's type module, read in rotary's namespace lookup).
    from rotary.modules.torch import LearnedRoPE

    m = LearnedRoPE(64)
    x, pos = torch.randn(1, 2, 8, 64), torch.arange(8)
    torch._dynamo.reset()
    got = torch.compile(m, fullgraph=True, backend="aot_eager")(x, x, pos)
    for g, w in zip(got, m(x, x, pos), strict=True):
        torch.testing.assert_close(g, w)
    f = torch.compile(lambda a: rotary.learned.rotate(a, pos, m.freqs), fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(f(x), rotary.learned.rotate(x, pos, m.freqs))


@pytest.mark.parametrize("tower", ["eva02", "pixel", "dinov3", "llama4", "pixtral", "qwen2_vl", "mlcd"])
def test_regression_vision_towers_under_compile_fullgraph(tower: str) -> None:
    # Reproduction 8: "tracing ndarray.dtype" in the towers' coordinate grids.
    n = getattr(rotary.vision, tower)(64).positions(4, 4).shape[0]
    x = torch.randn(1, 3, n, 64)
    torch._dynamo.reset()
    got = torch.compile(
        lambda a: getattr(rotary.vision, tower)(64).rotate(a, 4, 4), fullgraph=True, backend="aot_eager"
    )(x)
    assert torch.equal(got, getattr(rotary.vision, tower)(64).rotate(x, 4, 4))


def _public_configs() -> dict[str, Any]:
    cfg = {"model_type": "gemma3_text", "hidden_size": 64, "num_attention_heads": 4, "head_dim": 16,
           "num_hidden_layers": 6, "rope_theta": 1e6, "rope_local_base_freq": 1e4,
           "rope_scaling": {"rope_type": "linear", "factor": 8.0}, "sliding_window": 512}  # fmt: skip
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}
    return {
        "RoPE": rotary.RoPE(64, scaling=yarn, layout="interleaved", rotary_dim=48),
        "RoPE longrope": _LONG,
        "RopeConfig": rotary.RoPE(32, base=5e5).config,
        "AxialRoPE": rotary.AxialRoPE(64, 2, base=100.0),
        "MRoPE": rotary.MRoPE(128, (24, 20, 20), interleaved=True),
        "VisionRoPE eva02": rotary.vision.eva02(64, grid_offset=0.5, ref_shape=(16, 16)),
        "VisionRoPE qwen2_vl": rotary.vision.qwen2_vl(64),
        "ModelRope": rotary.hf.model_rope(cfg),
        "learned.Settings": rotary.learned.Settings.of(rotary.RoPE(16), 512.0),
        **{f"scaling.{type(s).__name__}": s for s in _SCALINGS},
    }


_LONG = rotary.RoPE(8, scaling=rotary.LongRoPE((1.0, 1.1, 1.2, 1.3), (2.0, 3.0, 4.0, 5.0), 16, factor=4.0))
_SCALINGS = (
    rotary.Linear(4.0),
    rotary.NTK(2.0),
    rotary.DynamicNTK(2.0, 64),
    rotary.YaRN(factor=4.0, original_max_position_embeddings=64, mscale=1.0, mscale_all_dim=0.5),
    rotary.Llama3(8.0, 8192),
    rotary.scaling.Factors((1.0, 2.0, 3.0, 4.0)),
    rotary.scaling.Frequencies((1.0, 0.1)),
)


def test_regression_pickled_and_copied_configurations_hash_equal() -> None:
    # Reproduction 9: an unpickled or deep-copied RoPE kept the memoised hash of the process that
    # pickled it (string hashes differ between processes): == but not the same hash, duplicates
    # in sets and in the cache.  Pickled here in a process with another hash seed.
    import base64
    import copy
    import pickle
    import subprocess
    import sys

    code = (
        "import base64, pickle, sys; sys.path.insert(0, 'tests'); import test_transforms as t; "
        "print(base64.b64encode(pickle.dumps(t._public_configs())).decode())"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    theirs = pickle.loads(base64.b64decode(out.stdout.strip().splitlines()[-1]))
    ours = _public_configs()
    assert set(theirs) == set(ours)
    for name, obj in ours.items():
        for other in (theirs[name], copy.deepcopy(obj), pickle.loads(pickle.dumps(obj))):
            assert other == obj and hash(other) == hash(obj), name
            assert len({obj, other}) == 1, name
    rotary.clear_cache()
    x = np.ones((4, 64), np.float32)
    ours["RoPE"].rotate(x, np.arange(4))
    n = rotary.cache_info().entries
    theirs["RoPE"].rotate(x, np.arange(4))
    assert rotary.cache_info().entries == n  # one entry per configuration, not two


def test_regression_jax_positions_on_another_device_are_named() -> None:
    # Reproduction 11: linear_attention gave JAX's raw "incompatible devices for jitted
    # computation" where rotate and apply name pos.
    pytest.importorskip("jax")
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent(
        """
        import os
        os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
        os.environ["JAX_PLATFORMS"] = "cpu"
        import jax, jax.numpy as jnp, rotary
        d0, d1 = jax.devices()[:2]
        q = jax.device_put(jnp.ones((1, 2, 8, 16)), d0)
        p = jax.device_put(jnp.arange(8), d1)
        f = jax.device_put(jnp.ones(8), d0)
        calls = {
            "linear_attention": lambda: rotary.linear_attention(q, q, q, p),
            "linear_attention causal": lambda: rotary.linear_attention(q, q, q, p, causal=True),
            "linear_attention_state": lambda: rotary.linear_attention_state(q, q, p),
            "attention": lambda: rotary.attention(q, q, q, p),
            "rotate": lambda: rotary.rotate(q, p),
            "learned.rotate": lambda: rotary.learned.rotate(q, p, f),
        }
        for name, call in calls.items():
            try:
                call()
            except ValueError as e:
                assert "pos is on device" in str(e), (name, str(e))
            else:
                raise AssertionError(name + " did not refuse positions on another device")
        print("ok")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stdout[-2000:] + out.stderr[-3000:]


# -- issue 34: a decoding loop compiles once; TorchScript refuses clearly ----------------------------
@pytest.mark.parametrize(
    ("kind", "graphs"), [("0-d tensor", 1), ("1-element tensor", 1), ("Python int", 2), ("Python list", 2)]
)
def test_a_compiled_decoding_loop_compiles_once(kind: str, graphs: int) -> None:
    """64 steps, one position each: one graph for tensor positions; two for Python ints (Dynamo
    specialises the first value, then makes it symbolic: what ``p * inv_freq`` gets), where 8 and
    a fall back to eager were compiled on 67cca2f."""
    from torch._dynamo.testing import CompileCounter

    rope = rotary.RoPE(16)
    q, k = torch.randn(1, 4, 1, 16), torch.randn(1, 2, 1, 16)
    make = {
        "0-d tensor": torch.tensor,
        "1-element tensor": lambda p: torch.tensor([p]),
        "Python int": lambda p: p,
        "Python list": lambda p: [p],
    }[kind]
    torch._dynamo.reset()
    counter = CompileCounter()
    step = torch.compile(lambda q, k, p: rope.apply(q, k, p), backend=counter, fullgraph=True)
    for p in range(4095, 4095 + 64):
        got = step(q, k, make(p))
        want = rope.apply(q, k, make(p))
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), p
    assert counter.frame_count == graphs


def test_torchscript_refuses_rotary_modules_clearly() -> None:
    from rotary.modules.torch import LearnedRoPE

    class User(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rope = LearnedRoPE(rotary.RoPE(16))

        def forward(self, q: Any, k: Any, pos: Any) -> Any:
            return self.rope(q, k, pos)

    with pytest.raises(TypeError, match=r"torch\.jit\.script cannot compile rotary.*torch\.compile"):
        torch.jit.script(User())
