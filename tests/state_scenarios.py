"""Fresh-process scenarios: a first context, then eager calls, each checked against the oracle.

Run as a script in a new interpreter (``tests/test_state.py`` and ``tests/test_state_fuzz.py``
do): ``python tests/state_scenarios.py '<json list of steps>'``.  A step is ``[kind, params]``:

- a **context** step (``kind`` in :data:`CONTEXTS`) runs rotary inside that context first (an
  export, a compile, a fake mode, a JAX transformation, ...), checking what it can there;
- an **eager** step (``kind == "eager"``) runs one plain call (:data:`EAGER`) and compares it
  with the float64 oracle (:mod:`rotary.testing.reference`, within ``finfo`` tolerance) and,
  bit for bit, with the same call under ``rotary.fast_paths(False)``.

It prints one JSON line per step: ``{"step": ..., "ok": bool, "error": str}``.  Whatever ran
before in the process, every eager result must be the oracle's.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import rotary
from rotary.testing import assert_close, reference

Config = dict[str, Any]

#: Configurations the steps draw from: plain, interleaved, partial, another base, a scaling.
CONFIGS: list[Config] = [
    {"head_dim": 64},
    {"head_dim": 32, "layout": "interleaved", "base": 500.0},
    {"head_dim": 64, "rotary_dim": 32},
    {"head_dim": 16, "base": 1e6, "layout": "interleaved", "rotary_dim": 8},
    {"head_dim": 32, "scaling": {"rope_type": "linear", "factor": 4.0}},
]


def _theta(cfg: Config) -> tuple[np.ndarray, float]:
    """The oracle's frequencies of ``cfg`` (from the definition, not from rotary) and its scale."""
    rot = cfg.get("rotary_dim") or cfg["head_dim"]
    th = reference.theta(rot, cfg.get("base", 10000.0))
    sc = cfg.get("scaling")
    if sc is not None:
        assert sc["rope_type"] == "linear"
        th = th / sc["factor"]
    return th, 1.0


def oracle(x: Any, pos: Any, cfg: Config, sign: float = 1.0) -> np.ndarray:
    """RoPE of ``x`` at ``sign * pos`` in float64 (``sign=-1``: the transposed rotation)."""
    th, scale = _theta(cfg)
    x64 = np.asarray(rotary.testing.to_numpy(x), dtype=np.float64)
    p = sign * np.asarray(rotary.testing.to_numpy(pos), dtype=np.float64)
    return reference.rotate(
        x64,
        p,
        layout=cfg.get("layout", "half"),
        rotary_dim=cfg.get("rotary_dim"),
        th=th,
        scale=scale,
    )


def _check(got: Any, x: Any, pos: Any, cfg: Config, **kw: Any) -> None:
    assert_close(got, oracle(x, pos, cfg), like=x, **kw)


def _opts(cfg: Config) -> Config:
    """The functional API's keywords for ``cfg``."""
    return {k: v for k, v in cfg.items() if k != "head_dim"}


def _rope(cfg: Config) -> rotary.RoPE:
    return rotary.RoPE(**cfg)


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def _t(a: np.ndarray, dtype: Any = None) -> Any:
    import torch

    t = torch.from_numpy(np.ascontiguousarray(a))
    return t if dtype is None else t.to(dtype)


# -- first contexts ------------------------------------------------------------------------------
def _qkp(cfg: Config, n: int = 16, seed: int = 0) -> tuple[Any, Any, Any]:
    r = _rng(seed)
    d = cfg["head_dim"]
    q = _t(r.normal(size=(1, 4, n, d)).astype(np.float32))
    k = _t(r.normal(size=(1, 2, n, d)).astype(np.float32))
    return q, k, _t(np.arange(n) * 7 + 3)


def _export(cfg: Config, dynamic: bool) -> None:
    import torch

    class M(torch.nn.Module):
        def forward(self, q: Any, k: Any, pos: Any) -> Any:
            return rotary.RoPE(**cfg).apply(q, k, pos)

    q, k, pos = _qkp(cfg)
    shapes = None
    if dynamic:
        s = torch.export.Dim("s", min=2, max=1024)
        shapes = {"q": {2: s}, "k": {2: s}, "pos": {0: s}}
    ep = torch.export.export(M(), (q, k, pos), dynamic_shapes=shapes)
    if dynamic:
        q, k, pos = _qkp(cfg, n=23, seed=1)
    qr, kr = ep.module()(q, k, pos)
    _check(qr, q, pos, cfg)
    _check(kr, k, pos, cfg)


def _compile(cfg: Config, dynamic: bool | None) -> None:
    import torch

    def f(q: Any, k: Any, pos: Any) -> Any:
        return rotary.apply(q, k, pos, **_opts(cfg))

    g = torch.compile(f, fullgraph=True, dynamic=dynamic, backend="aot_eager")
    for n, seed in ((9, 0), (17, 1)):
        q, k, pos = _qkp(cfg, n=n, seed=seed)
        qr, kr = g(q, k, pos)
        _check(qr, q, pos, cfg)
        _check(kr, k, pos, cfg)


def _fake(cfg: Config, warm: bool) -> None:
    import torch
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    q, k, pos = _qkp(cfg)
    if warm:
        _check(_rope(cfg).apply(q, k, pos)[0], q, pos, cfg)
        rotary.apply(q, k, pos)
    mode = FakeTensorMode()
    with mode:
        fq, fk, fp = (mode.from_tensor(t) for t in (q, k, pos))
        outs = [
            *_rope(cfg).apply(fq, fk, fp),
            *rotary.apply(fq, fk, fp),
            _rope(cfg).rotate(fq, list(range(16))),  # host positions, converted in fake mode
            *_rope(cfg).cos_sin(fp),
            rotary.rotate(fq[:, :, :1], fp[:1]),  # a decoding step
        ]
    for o in outs:
        assert isinstance(o, FakeTensor), type(o)
    assert tuple(outs[0].shape) == tuple(q.shape) and outs[0].dtype == torch.float32


def _meta(cfg: Config) -> None:
    import torch

    q = torch.empty((2, 4, 8, cfg["head_dim"]), device="meta")
    pos = torch.arange(8, device="meta")
    for o in (*_rope(cfg).apply(q, q, pos), rotary.rotate(q, pos), _rope(cfg).rotate(q[:, :, :1], pos[:1])):
        assert o.device.type == "meta" and tuple(o.shape[-1:]) == (cfg["head_dim"],)


def _inference(cfg: Config) -> None:
    import torch

    q, k, pos = _qkp(cfg)
    with torch.inference_mode():
        qr, kr = _rope(cfg).apply(q, k, pos)
        one = rotary.rotate(q[:, :, :1], pos[:1], **_opts(cfg))
    _check(qr, q, pos, cfg)
    _check(kr, k, pos, cfg)
    _check(one, q[:, :, :1], pos[:1], cfg)


def _torch_vmap(cfg: Config) -> None:
    import torch

    q, _, pos = _qkp(cfg)
    out = torch.func.vmap(lambda x: _rope(cfg).rotate(x, pos))(q[0])
    _check(out, q[0], pos, cfg)


def _torch_grad(cfg: Config) -> None:
    import torch

    q, k, pos = _qkp(cfg)
    w = k[:, :1].expand_as(q).contiguous()
    g = torch.func.grad(lambda x: (_rope(cfg).rotate(x, pos) * w).sum())(q)
    # d/dx sum(w * R x) = R^T w: w rotated by -pos
    assert_close(g, oracle(w, pos, cfg, sign=-1.0), like=q)


def _functionalize(cfg: Config) -> None:
    import torch

    q, k, pos = _qkp(cfg)
    qr, _kr = torch.func.functionalize(lambda a, b: _rope(cfg).apply(a, b, pos))(q, k)
    _check(qr, q, pos, cfg)


def _autograd(cfg: Config) -> None:
    q, k, pos = _qkp(cfg)
    q.requires_grad_(True)
    qr, _kr = _rope(cfg).apply(q, k, pos)
    w = k[:, :1].expand_as(q).detach()
    (qr * w).sum().backward()
    _check(qr.detach(), q.detach(), pos, cfg)
    assert_close(q.grad, oracle(w, pos, cfg, sign=-1.0), like=q.detach())


def _default_device_meta(cfg: Config) -> None:
    import torch

    q, k, pos = _qkp(cfg)
    with torch.device("meta"):
        qr, _kr = _rope(cfg).apply(q, k, pos)
        one = rotary.rotate(q[:, :, :1], [5], **_opts(cfg))
    _check(qr, q, pos, cfg)
    _check(one, q[:, :, :1], np.array([5]), cfg)


def _make_fx(cfg: Config) -> None:
    """``make_fx(tracing_mode="symbolic")`` (issue 28, reproduction 5: a real index tensor made
    from the positions inside the trace; the graph then held a fake table)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    # (13 tokens: make_fx gives sizes equal to another one the same symbol, e.g. 16 == head_dim)
    q, k, pos = _qkp(cfg, n=13)
    g = make_fx(lambda a, b, p: _rope(cfg).apply(a, b, p), tracing_mode="symbolic")(q, k, pos)
    one = make_fx(lambda a, p: rotary.rotate(a, p, **_opts(cfg)), tracing_mode="symbolic")(
        q[:, :, :1], pos[:1]
    )
    for n, seed in ((16, 0), (23, 1)):
        q, k, pos = _qkp(cfg, n=n, seed=seed)
        qr, kr = g(q, k, pos)
        _check(qr, q, pos, cfg)
        _check(kr, k, pos, cfg)
    _check(one(q[:, :, :1], pos[:1] + 4096), q[:, :, :1], pos[:1] + 4096, cfg)


def _export_save_load(cfg: Config, strict: bool) -> None:
    """``torch.export`` -> ``save`` -> ``load`` -> run (issue 28, reproduction 6: a cold
    non-strict export recorded an empty grad-mode region that ``save`` refused)."""
    import io

    import torch

    class M(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rope = rotary.RoPE(**cfg)

        def forward(self, q: Any, k: Any, pos: Any) -> Any:
            return self.rope.apply(q, k, pos)

    q, k, pos = _qkp(cfg)
    buf = io.BytesIO()
    torch.export.save(torch.export.export(M(), (q, k, pos), strict=strict), buf)
    buf.seek(0)
    qr, kr = torch.export.load(buf).module()(q, k, pos)
    _check(qr, q, pos, cfg)
    _check(kr, k, pos, cfg)


def _forward_ad(cfg: Config) -> None:
    """Forward-mode AD (issue 28, reproduction 3: the ``out=`` kernels have no forward formula)."""
    import torch.autograd.forward_ad as fwad

    q, k, pos = _qkp(cfg)
    with fwad.dual_level():
        qr, _kr = _rope(cfg).apply(fwad.make_dual(q, k[:, :1].expand_as(q)), k, pos)
        one = rotary.rotate(fwad.make_dual(q[:, :, :1], q[:, :, 1:2]), pos[:1], **_opts(cfg))
        tq, t1 = fwad.unpack_dual(qr).tangent, fwad.unpack_dual(one).tangent
    _check(qr.detach(), q, pos, cfg)
    _check(tq, k[:, :1].expand_as(q), pos, cfg)  # linear in the data: the tangent rotates too
    _check(t1, q[:, :, 1:2], pos[:1], cfg)


def _grads_batched(cfg: Config) -> None:
    """Batched gradients (issue 28, reproduction 4: legacy vmap has no rule for ``add.out``)."""
    import torch

    q, k, pos = _qkp(cfg, n=4)
    x = q.clone().requires_grad_(True)
    y = _rope(cfg).rotate(x, pos)
    cot = torch.stack([k[:, :1].expand_as(q), q.flip(-1)])
    g = torch.autograd.grad(y, x, cot, is_grads_batched=True)[0]
    for b in range(2):
        assert_close(g[b], oracle(cot[b], pos, cfg, sign=-1.0), like=q)
    jac = torch.autograd.functional.jacobian(
        lambda a: rotary.rotate(a, pos[:2], **_opts(cfg)), q[0, 0, :2], vectorize=True
    )
    w = k[0, 0, :2]
    assert_close((jac * w).sum((-2, -1)), oracle(w, pos[:2], cfg), like=q)  # J w = R w


def _position_grad(cfg: Config) -> None:
    """Gradients in fractional positions, with and without the data's (issue 28, reproductions
    1 and 2: the custom backward dropped them, and the mixed second derivative)."""
    import torch

    q, k, _pos = _qkp(cfg, n=5)
    x64 = q.double()
    w = k[:, :1].expand_as(q).double()
    p = torch.linspace(0.5, 700.5, 5, dtype=torch.float64)
    for x_grad in (True, False):
        x = x64.clone().requires_grad_(x_grad)
        pp = p.clone().requires_grad_(True)
        (_rope(cfg).rotate(x, pp) * w).sum().backward()
        h = 1e-6
        fd = [
            float(((oracle(x64, p + h * e, cfg) - oracle(x64, p - h * e, cfg)) * w.numpy()).sum() / (2 * h))
            for e in np.eye(5)
        ]
        assert np.allclose(pp.grad.numpy(), fd, rtol=1e-6, atol=1e-6), (pp.grad, fd)
    x = x64.clone().requires_grad_(True)
    pp = p.clone().requires_grad_(True)
    gx = torch.autograd.grad((_rope(cfg).rotate(x, pp) * w).sum(), x, create_graph=True)[0]
    mixed = torch.autograd.grad((gx * w).sum(), pp)[0]
    with rotary.fast_paths(False):
        x2, p2 = x64.clone().requires_grad_(True), p.clone().requires_grad_(True)
        g2 = torch.autograd.grad((_rope(cfg).rotate(x2, p2) * w).sum(), x2, create_graph=True)[0]
        want = torch.autograd.grad((g2 * w).sum(), p2)[0]
    assert torch.equal(mixed, want), (mixed, want)


def _compile_modules(cfg: Config) -> None:
    """``torch.compile(fullgraph=True)`` of ``LearnedRoPE`` and the vision towers (issue 28,
    reproductions 7 and 8)."""
    import torch

    from rotary.modules.torch import LearnedRoPE

    q, k, pos = _qkp(cfg)
    m = LearnedRoPE(_rope(cfg))
    qr, _kr = torch.compile(m, fullgraph=True, backend="aot_eager")(q, k, pos)
    _check(qr, q, pos, cfg, ulps=1024)  # (trained frequencies: angles formed in float32)
    d = cfg["head_dim"]
    # (two towers cold: fractional and integer grids; all seven in tests/test_transforms.py)
    for name in ("pixel", "llama4"):
        torch._dynamo.reset()  # (one code object compiled for seven towers: no recompile limit)
        tower = getattr(rotary.vision, name)(d)
        n = tower.positions(4, 4).shape[0]
        x = _t(_rng(3).normal(size=(1, 2, n, d)).astype(np.float32))
        got = torch.compile(
            lambda a, nm=name: getattr(rotary.vision, nm)(d).rotate(a, 4, 4),
            fullgraph=True,
            backend="aot_eager",
        )(x)
        assert torch.equal(got, tower.rotate(x, 4, 4)), name


def _jnp(a: np.ndarray) -> Any:
    import jax.numpy as jnp

    return jnp.asarray(a)


def _jqp(cfg: Config, n: int = 12) -> tuple[Any, Any]:
    r = _rng(2)
    return _jnp(r.normal(size=(2, 3, n, cfg["head_dim"])).astype(np.float32)), _jnp(np.arange(n) * 5 + 1)


def _jax_jit(cfg: Config) -> None:
    import jax

    x, p = _jqp(cfg)
    qr, _kr = jax.jit(lambda a, b: _rope(cfg).apply(a, a, b))(x, p)
    _check(qr, x, p, cfg)
    one = jax.jit(lambda a, b: rotary.rotate(a, b, **_opts(cfg)))(x[:, :, :1], p[:1])
    _check(one, x[:, :, :1], p[:1], cfg)


def _jax_vmap(cfg: Config) -> None:
    import jax

    x, p = _jqp(cfg)
    out = jax.vmap(lambda a: _rope(cfg).rotate(a, p))(x)
    _check(out, x, p, cfg)


def _jax_grad(cfg: Config) -> None:
    import jax

    x, p = _jqp(cfg)
    w = x[::-1]
    g = jax.grad(lambda a: (_rope(cfg).rotate(a, p) * w).sum())(x)
    assert_close(g, oracle(w, p, cfg, sign=-1.0), like=x)


def _jax_export(cfg: Config) -> None:
    import jax
    from jax import export

    x, p = _jqp(cfg)
    (n,) = export.symbolic_shape("n")
    exp = export.export(jax.jit(lambda a, b: _rope(cfg).rotate(a, b)))(
        jax.ShapeDtypeStruct((2, 3, n, cfg["head_dim"]), x.dtype), jax.ShapeDtypeStruct((n,), p.dtype)
    )
    _check(exp.call(x, p), x, p, cfg)


def _transfer_guard(cfg: Config) -> None:
    import jax

    x, p = _jqp(cfg)
    rope = _rope(cfg)
    x1, p1 = x[:, :, :1], p[:1]
    rope.apply(x, x, p)  # warm: compiled programs and constants in place
    rope.rotate(x1, p1)
    rope.cos_sin(p)
    with jax.transfer_guard("disallow"):
        qr, _kr = rope.apply(x, x, p)
        one = rope.rotate(x1, p1)
        c, s = rope.cos_sin(p)
    _check(qr, x, p, cfg)
    _check(one, x1, p1, cfg)
    th, _ = _theta(cfg)
    want = reference.cos_sin(np.asarray(p), th)
    assert_close(c, want[0], like=c)
    assert_close(s, want[1], like=s)


def _transfer_guard_cold_apply(cfg: Config) -> None:
    """Issue 28, reproduction 10: after a warm ``rotate``, the first ``apply`` under
    ``jax.transfer_guard("disallow")`` built a constant with an implicit transfer."""
    import jax

    x, p = _jqp(cfg)
    rope = _rope(cfg)
    rope.rotate(x, p)
    with jax.transfer_guard("disallow"):
        qr, _kr = rope.apply(x, x, p)
        _c, _s = rope.cos_sin(p)
        lin = rotary.linear_attention(x, x, x, p, rope=rope, causal=True)
    _check(qr, x, p, cfg)
    assert lin.shape == x.shape


def _threads(cfg: Config) -> None:
    errors: list[str] = []

    def worker(i: int) -> None:
        c = CONFIGS[i % len(CONFIGS)]
        fast = i % 2 == 0
        r = _rng(10 + i)
        try:
            with rotary.fast_paths(fast):
                for it in range(15):
                    x = r.normal(size=(2, 3, 5, c["head_dim"])).astype(np.float32)
                    pos = np.arange(5) + 1000 * it
                    _check(_rope(c).rotate(x, pos), x, pos, c)
                    xt = _t(x)
                    _check(rotary.apply(xt, xt, _t(pos), **_opts(c))[0], xt, pos, c)
        except Exception:
            errors.append(traceback.format_exc())

    ts = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors[0]


def _cache_limit_0(cfg: Config) -> None:
    old = rotary.set_cache_limit(0)
    try:
        q, k, pos = _qkp(cfg)
        _check(_rope(cfg).apply(q, k, pos)[0], q, pos, cfg)
        x = np.asarray(q)
        _check(_rope(cfg).rotate(x[:, :, :1], [70000]), x[:, :, :1], np.array([70000]), cfg)
        assert rotary.cache_info().entries == 0
    finally:
        rotary.set_cache_limit(old)


def _clear(cfg: Config) -> None:
    q, k, pos = _qkp(cfg)
    _rope(cfg).apply(q, k, pos)
    rotary.clear_cache()
    assert rotary.cache_info().entries == 0


CONTEXTS: dict[str, Callable[[Config], None]] = {
    "export_static": lambda c: _export(c, dynamic=False),
    "export_dynamic": lambda c: _export(c, dynamic=True),
    "compile_fullgraph": lambda c: _compile(c, dynamic=None),
    "compile_dynamic": lambda c: _compile(c, dynamic=True),
    "fake_cold": lambda c: _fake(c, warm=False),
    "fake_warm": lambda c: _fake(c, warm=True),
    "meta": _meta,
    "inference_mode": _inference,
    "torch_vmap": _torch_vmap,
    "torch_grad": _torch_grad,
    "functionalize": _functionalize,
    "autograd": _autograd,
    "default_device_meta": _default_device_meta,
    "jax_jit": _jax_jit,
    "jax_vmap": _jax_vmap,
    "jax_grad": _jax_grad,
    "jax_export": _jax_export,
    "transfer_guard": _transfer_guard,
    "threads": _threads,
    "cache_limit_0": _cache_limit_0,
    "clear_cache": _clear,
    "make_fx_symbolic": _make_fx,
    "export_save_load": lambda c: _export_save_load(c, strict=False),
    "export_save_load_strict": lambda c: _export_save_load(c, strict=True),
    "forward_ad": _forward_ad,
    "grads_batched": _grads_batched,
    "position_grad": _position_grad,
    "compile_modules": _compile_modules,
    "transfer_guard_cold_apply": _transfer_guard_cold_apply,
}

#: Contexts that need JAX (skipped where it is not installed).
JAX_CONTEXTS = frozenset(
    {"jax_jit", "jax_vmap", "jax_grad", "jax_export", "transfer_guard", "transfer_guard_cold_apply"}
)

#: Contexts that change process-wide settings (threads, the cache's limit, clearing it): their
#: follow-ups are every library's; any other context is followed by NumPy's eager calls (what the
#: shared cache would hand another library) and by its own library's (:func:`follow_ups`).
SHARED_CONTEXTS = frozenset({"threads", "cache_limit_0", "clear_cache"})


# -- eager follow-ups ----------------------------------------------------------------------------
def _eager(params: dict[str, Any]) -> None:
    """One plain call: ``params`` = lib, op, config index, dtype, shape kind, position kind."""
    lib, op, ci = params["lib"], params["op"], params["config"]
    cfg = CONFIGS[ci % len(CONFIGS)]
    r = _rng(params.get("seed", 0))
    d = cfg["head_dim"]
    n = {"prefill": 13, "decode": 1, "long": 300}[params["shape"]]
    base = {"small": 0, "table": 5000, "past_table": 70000, "huge": 2**30 + 7}[params["pos"]]
    pos_np = np.arange(n) * (3 if params["shape"] != "decode" else 1) + base
    q_np = r.normal(size=(1, 4, n, d)).astype(np.float32)
    k_np = r.normal(size=(1, 2, n, d)).astype(np.float32)
    dtype = params["dtype"]
    opts = _opts(cfg)
    if lib == "numpy":
        conv: Callable[[np.ndarray], Any] = lambda a: a.astype(dtype)  # noqa: E731
        pconv: Callable[[np.ndarray], Any] = lambda a: a  # noqa: E731
    elif lib == "torch":
        import torch

        conv = lambda a: _t(a, getattr(torch, dtype))  # noqa: E731
        pconv = _t
    else:
        import jax.numpy as jnp

        conv = lambda a: jnp.asarray(a, dtype=dtype)  # noqa: E731
        pconv = jnp.asarray
        if base > 2**31 - 1:
            base = 2**20
            pos_np = pos_np - pos_np[0] + base
    q, k, pos = conv(q_np), conv(k_np), pconv(pos_np)

    def run() -> list[Any]:
        if op == "apply":
            return list(rotary.apply(q, k, pos, **opts))
        if op == "rope_apply":
            return list(_rope(cfg).apply(q, k, pos))
        if op == "rotate":
            return [rotary.rotate(q, pos, **opts)]
        if op == "k_pos":
            return list(_rope(cfg).apply(q, k, pos, k_pos=pos + 1))
        if op == "cos_sin":
            return list(_rope(cfg).cos_sin(pos))
        raise ValueError(op)

    got = run()
    with rotary.fast_paths(False):
        slow = run()
    for g, s_ in zip(got, slow, strict=True):
        a, b = rotary.testing.to_numpy(g), rotary.testing.to_numpy(s_)
        assert np.array_equal(a, b, equal_nan=True), (
            f"fast paths differ from the generic code by {np.abs(a - b).max()}"
        )
    p2 = pos_np
    if op == "cos_sin":
        th, _ = _theta(cfg)
        c, s = reference.cos_sin(pos_np, th)
        assert_close(got[0], c, like=got[0])
        assert_close(got[1], s, like=got[1])
        return
    _check(got[0], q, p2, cfg)
    if op in ("apply", "rope_apply"):
        _check(got[1], k, p2, cfg)
    if op == "k_pos":
        _check(got[1], k, p2 + 1, cfg)


def _step(lib: str, op: str, config: int, dtype: str, shape: str, pos: str) -> dict[str, Any]:
    return {"lib": lib, "op": op, "config": config, "dtype": dtype, "shape": shape, "pos": pos}


#: The follow-up mix of the state matrix: other shapes, dtypes, layouts, positions and decoding
#: steps on both eager backends (and JAX where installed).
EAGER: list[dict[str, Any]] = [
    _step("numpy", "apply", 0, "float32", "prefill", "small"),
    _step("numpy", "rotate", 1, "float64", "long", "past_table"),
    _step("numpy", "rope_apply", 2, "float32", "decode", "table"),
    _step("numpy", "k_pos", 4, "float16", "prefill", "huge"),
    _step("torch", "apply", 0, "float32", "prefill", "small"),
    _step("torch", "rope_apply", 1, "float32", "decode", "table"),
    _step("torch", "rotate", 3, "bfloat16", "long", "huge"),
    _step("torch", "apply", 2, "float64", "long", "table"),
    _step("torch", "k_pos", 1, "float16", "prefill", "small"),
    _step("jax", "apply", 1, "float32", "prefill", "table"),
    _step("jax", "rope_apply", 0, "float32", "decode", "small"),
    _step("jax", "cos_sin", 2, "float32", "long", "past_table"),
]


def follow_ups(context: str) -> list[dict[str, Any]]:
    """The eager steps that follow ``context`` in the state matrix: NumPy's and those of the
    library the context ran in (every library's after a process-wide setting).  A context can
    only leave state made in its own library; NumPy's calls see what the shared cache would hand
    any other library, and ``tests/test_state_fuzz.py`` mixes contexts of both libraries in one
    process.  (Not importing the other framework saves a third of each process's time.)"""
    if context in SHARED_CONTEXTS:
        libs = {"numpy", "torch", "jax"}
    else:
        libs = {"numpy", "jax" if context in JAX_CONTEXTS else "torch"}
    return [e for e in EAGER if e["lib"] in libs]


def has_jax() -> bool:
    try:
        import jax  # noqa: F401
    except ImportError:
        return False
    return True


def run_steps(steps: list[list[Any]]) -> list[dict[str, Any]]:
    out = []
    for kind, params in steps:
        try:
            if kind == "eager":
                if params["lib"] == "jax" and not has_jax():
                    continue
                _eager(params)
            else:
                if kind in JAX_CONTEXTS and not has_jax():
                    continue
                CONTEXTS[kind](CONFIGS[params % len(CONFIGS)])
            out.append({"step": [kind, params], "ok": True, "error": ""})
        except Exception:
            out.append({"step": [kind, params], "ok": False, "error": traceback.format_exc()[-3000:]})
    return out


if __name__ == "__main__":
    for line in run_steps(json.loads(sys.argv[1])):
        print(json.dumps(line), flush=True)
