"""Core rotary.apply / rotate / RoPE on every backend against the float64 matrix form."""

from __future__ import annotations

import importlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rotary
from rotary.testing import assert_close, to_numpy
from rotary.testing.reference import rotate as rotate_ref


def _dtypes(backend):
    return backend.float_dtypes()


@pytest.mark.slow_backends_too
@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("rotary_dim", [None, 4])
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
def test_apply_matches_matrix_form(backend, rng, layout, rotary_dim, dtype):
    if dtype not in backend.float_dtypes():
        pytest.skip(f"{backend.name} has no {dtype}")
    q = rng.normal(size=(2, 3, 5, 8))
    k = rng.normal(size=(2, 3, 5, 8))
    pos = np.array([0, 1, 7, 100, 4095])
    qb, kb = backend.asarray(q, dtype), backend.asarray(k, dtype)
    # The reference rotates the inputs as the backend holds them (rounded to dtype).
    q_in, k_in = to_numpy(qb).astype(np.float64), to_numpy(kb).astype(np.float64)
    qr, kr = rotary.apply(qb, kb, backend.asarray(pos, "int32"), layout=layout, rotary_dim=rotary_dim)
    assert type(qr) is type(qb)
    assert qr.dtype == qb.dtype and kr.dtype == kb.dtype
    assert tuple(qr.shape) == q.shape
    if backend.device is not None:
        from rotary._lib._compat import device

        assert device(qr) == backend.device
    ref_q = rotate_ref(q_in, pos, layout=layout, rotary_dim=rotary_dim)
    ref_k = rotate_ref(k_in, pos, layout=layout, rotary_dim=rotary_dim)
    assert_close(qr, ref_q, dtype=dtype)
    assert_close(kr, ref_k, dtype=dtype)
    # inputs untouched
    np.testing.assert_array_equal(to_numpy(qb).astype(np.float64), q_in)


def test_rotate_equals_apply_and_rope(backend, rng):
    x = backend.asarray(rng.normal(size=(2, 4, 6, 16)), "float32")
    pos = backend.asarray(np.arange(6), "int64" if backend.float64 else "int32")
    a, _ = rotary.apply(x, x, pos)
    b = rotary.rotate(x, pos)
    rope = rotary.RoPE(16)
    c = rope.rotate(x, pos)
    d, _ = rope.apply(x, x, pos)
    for y in (b, c, d):
        np.testing.assert_array_equal(to_numpy(a), to_numpy(y))


@pytest.mark.slow_backends_too
@pytest.mark.parametrize(
    ("xshape", "pshape"),
    [
        ((2, 3, 5, 8), (5,)),  # (batch, heads, seq, dim), shared positions
        ((2, 3, 5, 8), (2, 1, 5)),  # per-batch positions
        ((2, 5, 3, 8), (5, 1)),  # (batch, seq, heads, dim)
        ((2, 5, 3, 8), (2, 5, 1)),
        ((5, 8), (5,)),
        ((8,), ()),  # one vector, scalar position
    ],
)
def test_position_broadcasting(backend, rng, xshape, pshape):
    x = rng.normal(size=xshape)
    pos = rng.integers(-50, 10_000, size=pshape)
    out = rotary.rotate(backend.asarray(x, "float32"), backend.asarray(pos, "int32"))
    assert_close(out, rotate_ref(x.astype(np.float32), pos), dtype="float32")


def test_python_positions_and_offsets(backend, rng):
    x = rng.normal(size=(1, 2, 4, 8))
    xb = backend.asarray(x, "float32")
    # KV-cache offset: positions 10..13 as a Python list / range
    out = rotary.rotate(xb, list(range(10, 14)))
    assert_close(out, rotate_ref(x.astype(np.float32), np.arange(10, 14)), dtype="float32")
    out = rotary.rotate(xb[:, :, :1, :], 10)
    assert_close(out, rotate_ref(x[:, :, :1].astype(np.float32), np.array([10])), dtype="float32")


def test_fractional_positions(backend, rng):
    x = rng.normal(size=(3, 8))
    pos = np.array([0.5, 1.25, 1000.75])
    dt = "float64" if backend.float64 else "float32"
    out = rotary.rotate(backend.asarray(x, "float32"), backend.asarray(pos, dt))
    assert_close(out, rotate_ref(x.astype(np.float32), pos), dtype="float32")


def test_k_pos_and_grouped_query(backend, rng):
    q = rng.normal(size=(2, 8, 1, 16))  # one new query token
    k = rng.normal(size=(2, 2, 6, 16))  # 2 kv heads, 6 cached keys
    qb, kb = backend.asarray(q, "float32"), backend.asarray(k, "float32")
    qr, kr = rotary.apply(qb, kb, [5], k_pos=np.arange(6).tolist(), layout="interleaved")
    assert_close(qr, rotate_ref(q.astype(np.float32), np.array([5]), layout="interleaved"), dtype="float32")
    assert_close(kr, rotate_ref(k.astype(np.float32), np.arange(6), layout="interleaved"), dtype="float32")


def test_scores_depend_on_relative_position_only(backend, rng):
    q = rng.normal(size=(1, 32))
    k = rng.normal(size=(1, 32))
    qb, kb = backend.asarray(q, "float32"), backend.asarray(k, "float32")
    scores = []
    for m in (0, 17, 1000, 123_456):
        qr, kr = rotary.apply(qb, kb, [m + 3], k_pos=[m])
        scores.append(float((to_numpy(qr) * to_numpy(kr)).sum()))
    np.testing.assert_allclose(scores, scores[0], rtol=1e-5, atol=1e-5)


@settings(max_examples=40, deadline=None)
@given(
    m=st.integers(-(2**20), 2**20),
    n=st.integers(-(2**20), 2**20),
    layout=st.sampled_from(["half", "interleaved"]),
    seed=st.integers(0, 2**31),
)
def test_relative_position_identity_property(m, n, layout, seed):
    r = np.random.default_rng(seed)
    q, k = r.normal(size=16), r.normal(size=16)
    qm, _ = rotary.apply(q, q, m, layout=layout)
    kn, _ = rotary.apply(k, k, n, layout=layout)
    k_rel, _ = rotary.apply(k, k, n - m, layout=layout)
    np.testing.assert_allclose(qm @ kn, q @ k_rel, rtol=1e-9, atol=1e-9)


def test_rope_builds_its_tables_once():
    """Repeated calls (and the functional API with the same options) reuse the cached tables."""
    x = np.ones((4, 32), dtype=np.float32)
    rope = rotary.RoPE(32, base=1234.0)
    rope.rotate(x, np.arange(4) + 5000)  # builds the tables
    rotary.rotate(x, np.arange(4) + 5000, base=1234.0)  # and keeps the functional API's RoPE
    before = rotary.cache_info()
    for p in range(5):
        rope.rotate(x, np.arange(4) + 5000 + p)
        rotary.rotate(x, np.arange(4) + 5000 - p, base=1234.0)
    after = rotary.cache_info()
    assert after.misses == before.misses, "tables were rebuilt"
    assert after.hits > before.hits


def test_inv_freq_in_every_namespace(backend):
    # Regression: the torch module itself as xp= (and torch's default device=None) failed.
    want = rotary.RoPE(8).inv_freq()
    raw = importlib.import_module(
        {"jax": "jax.numpy", "dask": "dask.array"}.get(backend.module, backend.module)
    )
    for xp in (backend.xp, raw) if hasattr(raw, "asarray") else (backend.xp,):  # (marray's is a factory)
        w = rotary.RoPE(8).inv_freq(xp=xp, device=backend.device)
        np.testing.assert_allclose(np.asarray(backend.to_numpy(w), dtype=np.float64), want, rtol=1.2e-7)


def test_cos_sin_and_inv_freq():
    rope = rotary.RoPE(8, base=100.0, layout="interleaved")
    np.testing.assert_allclose(rope.inv_freq(), 100.0 ** -(np.arange(0, 8, 2) / 8))
    c, s = rope.cos_sin(np.arange(3), full=True)
    assert c.shape == (3, 8)
    np.testing.assert_allclose(c[:, 0], c[:, 1])
    ang = np.arange(3)[:, None] * rope.inv_freq()
    np.testing.assert_allclose(c[:, ::2], np.cos(ang), atol=2e-7)
    np.testing.assert_allclose(s[:, ::2], np.sin(ang), atol=2e-7)
    c2, _ = rotary.RoPE(8, base=100.0).cos_sin(np.arange(3), full=True)
    np.testing.assert_allclose(c2[:, :4], c2[:, 4:])


def test_dask_is_lazy(rng):
    da = pytest.importorskip("dask.array")
    import dask

    x = da.from_array(rng.normal(size=(4, 3, 8, 16)).astype(np.float32), chunks=(1, 3, 8, 16))
    pos = da.from_array(np.arange(8), chunks=8)
    computed = []

    class Count(dask.callbacks.Callback):
        def _start(self, dsk):
            computed.append(1)

    with Count():
        out, _ = rotary.apply(x, x, pos)
        assert isinstance(out, da.Array)
    assert not computed, "building the result triggered a compute"
    assert_close(out, rotate_ref(np.asarray(x.compute()), np.arange(8)), dtype="float32")


# -- autodiff and compilation -------------------------------------------------------
def test_torch_autograd_is_inverse_rotation(rng):
    torch = pytest.importorskip("torch")
    x = torch.tensor(rng.normal(size=(3, 5, 8)), dtype=torch.float64, requires_grad=True)
    g = torch.tensor(rng.normal(size=(3, 5, 8)), dtype=torch.float64)
    pos = torch.arange(5)
    out = rotary.rotate(x, pos, layout="interleaved")
    (out * g).sum().backward()
    # d/dx <R x, g> = R^T g = R_{-pos} g
    expected = rotary.rotate(g, -pos, layout="interleaved")
    torch.testing.assert_close(x.grad, expected, rtol=1e-12, atol=1e-12)


def test_jax_grad_is_inverse_rotation(rng):
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    x = jnp.asarray(rng.normal(size=(5, 8)), dtype=jnp.float32)
    g = jnp.asarray(rng.normal(size=(5, 8)), dtype=jnp.float32)
    pos = jnp.arange(5)
    grad = jax.grad(lambda x: jnp.sum(rotary.rotate(x, pos) * g))(x)
    np.testing.assert_allclose(np.asarray(grad), np.asarray(rotary.rotate(g, -pos)), atol=1e-6)


def test_jax_jit_traces_positions_and_vmap(rng):
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    x = rng.normal(size=(2, 4, 6, 16)).astype(np.float32)
    traces = []

    @jax.jit
    def f(x, pos):
        traces.append(1)
        return rotary.apply(x, x, pos)[0]

    for offset in (0, 100, 5000):
        pos = jnp.arange(6) + offset
        assert_close(f(jnp.asarray(x), pos), rotate_ref(x, np.arange(6) + offset), dtype="float32")
    assert len(traces) == 1, "positions must be traced, not static"
    pos = np.stack([np.arange(6), np.arange(6) + 7])[:, None, :]
    out = jax.vmap(lambda xx, pp: rotary.rotate(xx, pp))(jnp.asarray(x), jnp.asarray(pos))
    assert_close(out, rotate_ref(x, pos), dtype="float32")


def test_torch_compile_fullgraph(rng):
    torch = pytest.importorskip("torch")
    x = torch.tensor(rng.normal(size=(1, 2, 6, 16)), dtype=torch.float32)
    rope = rotary.RoPE(16, base=777.0, layout="interleaved")

    @torch.compile(fullgraph=True)
    def f(q, pos):
        return rope.apply(q, q, pos)[0], rotary.rotate(q, pos, rotary_dim=8)

    for offset in (0, 3000):
        pos = torch.arange(6) + offset
        a, b = f(x, pos)
        torch.testing.assert_close(a, rope.rotate(x, pos))
        torch.testing.assert_close(b, rotary.rotate(x, pos, rotary_dim=8))


# -- bad input ------------------------------------------------------------------------
def test_errors_name_the_argument(backend, rng):
    x = backend.asarray(rng.normal(size=(2, 4, 8)), "float32")
    with pytest.raises(ValueError, match=r"head dim.*even"):
        rotary.rotate(backend.asarray(rng.normal(size=(2, 4, 7)), "float32"), [0, 1, 2, 3])
    with pytest.raises(ValueError, match="rotary_dim"):
        rotary.rotate(x, list(range(4)), rotary_dim=3)
    with pytest.raises(ValueError, match="rotary_dim=16 is larger"):
        rotary.rotate(x, list(range(4)), rotary_dim=16)
    with pytest.raises(ValueError, match="layout must be one of"):
        rotary.rotate(x, list(range(4)), layout="neox")
    with pytest.raises(ValueError, match=r"pos of shape \(3,\) does not broadcast"):
        rotary.rotate(x, [0, 1, 2])
    with pytest.raises(ValueError, match=r"pos of shape \(3, 4\) does not broadcast"):
        rotary.rotate(x, np.zeros((3, 4), dtype=int).tolist())
    with pytest.raises(TypeError, match="q must be a real floating array"):
        rotary.apply(backend.asarray(np.ones((2, 8)), "int32"), x[0, :2, ...], [0, 1])
    with pytest.raises(ValueError, match="same head dim"):
        rotary.apply(x, backend.asarray(rng.normal(size=(2, 4, 6)), "float32"), [0, 1, 2, 3])
    with pytest.raises(ValueError, match="incompatible leading shapes"):
        rotary.apply(x, backend.asarray(rng.normal(size=(3, 4, 8)), "float32"), [0, 1, 2, 3])
    with pytest.raises(TypeError, match="integer or real floating positions"):
        rotary.rotate(x, [True, False, True, False])


def test_nan_positions_rejected_eagerly(rng):
    x = rng.normal(size=(3, 8))
    with pytest.raises(ValueError, match="pos contains NaN"):
        rotary.rotate(x, np.array([0.0, np.nan, 1.0]))
    with pytest.raises(ValueError, match=r"k_pos contains NaN"):
        rotary.apply(x, x, [0, 1, 2], k_pos=np.array([0.0, np.inf, 1.0]))
    with pytest.raises(ValueError, match=r"2\*\*36"):
        rotary.rotate(x, np.array([0, 1, 2**40]))


def test_mixed_namespaces_and_devices_rejected(rng):
    torch = pytest.importorskip("torch")
    x = rng.normal(size=(3, 8)).astype(np.float32)
    with pytest.raises(TypeError, match="same array library"):
        rotary.apply(torch.from_numpy(x), x, [0, 1, 2])
    # host NumPy positions go with any library (moved to the data's device) ...
    out = rotary.rotate(torch.from_numpy(x), np.arange(3))
    assert isinstance(out, torch.Tensor)
    np.testing.assert_array_equal(out.numpy(), rotary.rotate(torch.from_numpy(x), torch.arange(3)).numpy())
    # ... but positions of another library are refused, naming pos
    jnp = pytest.importorskip("jax.numpy")
    with pytest.raises(TypeError, match=r"pos is a .*jax.*torch"):
        rotary.rotate(torch.from_numpy(x), jnp.arange(3))
    xs = pytest.importorskip("array_api_strict")
    a = xs.asarray(x)
    b = xs.asarray(x, device=xs.Device("device1"))
    with pytest.raises(ValueError, match="device"):
        rotary.apply(a, b, xs.arange(3))


def test_read_only_numpy_input_not_mutated(rng):
    x = rng.normal(size=(2, 3, 8)).astype(np.float32)
    x.setflags(write=False)
    before = x.copy()
    out = rotary.rotate(x, [0, 1, 2], layout="interleaved", rotary_dim=4)
    np.testing.assert_array_equal(x, before)
    assert out is not x and out.flags.writeable


def test_torch_compile_several_configs_one_function(rng):
    """Recompiling for another RoPE (another base) must not break the constant tables."""
    torch = pytest.importorskip("torch")
    x = torch.tensor(rng.normal(size=(1, 2, 6, 32)), dtype=torch.float32)

    @torch.compile(fullgraph=True)
    def f(rope, q, pos):
        return rope.rotate(q, pos)

    for base in (1e4, 5e5, 7e3):
        rope = rotary.RoPE(32, base=base)
        torch.testing.assert_close(f(rope, x, torch.arange(6)), rope.rotate(x, torch.arange(6)))
