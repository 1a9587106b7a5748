"""Trained frequencies (``rotary.learned``): values against the float64 oracle on every backend,
gradients against lucidrains ``rotary-embedding-torch`` (``learned_freq=True``), torch gradcheck,
JAX finite differences, ``torch.func``; RoPE-Mixed per-head 2-D frequencies; xPos."""

from __future__ import annotations

import numpy as np
import pytest

import rotary
from rotary.testing import assert_close, reference, to_numpy


def _oracle_angles(x, angles, layout):
    """Pair ``i`` of ``x`` rotated by ``angles[..., i]`` in float64 (correctly rounded cos/sin)."""
    th = np.ones(angles.shape[-1])
    return reference.rotate_pairs(np.asarray(x, dtype=np.float64), angles, th, layout=layout)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_default_frequencies_rotate_as_rope(backend, rng, layout):
    rope = rotary.RoPE(16, layout=layout, rotary_dim=12, base=500.0)
    f = rotary.learned.frequencies(rope, xp=backend.xp, device=backend.device)
    x = backend.asarray(rng.normal(size=(2, 3, 7, 16)), "float32")
    pos = np.arange(7) * 3
    got = rotary.learned.rotate(x, pos, f, layout=layout, rotary_dim=12)
    want = reference.rotate(to_numpy(x), pos, layout=layout, base=500.0, rotary_dim=12)
    # float32 angles of positions below 32: a few float32 ulps
    assert_close(got, want, like=x, ulps=32)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_mixed_per_head_frequencies(backend, rng, layout):
    """RoPE-Mixed: every head its own (fx, fy), angle fx * x + fy * y, against float64."""
    heads, n = 3, 4
    f = rng.uniform(-1.0, 1.0, size=(heads, 1, 2, n))
    grid = np.stack(np.meshgrid(np.arange(3), np.arange(5), indexing="ij"), -1).reshape(15, 2)
    x = rng.normal(size=(2, heads, 15, 2 * n))
    xb = backend.asarray(x, "float32")
    fb = backend.asarray(f, "float32")
    got = rotary.learned.rotate(xb, backend.asarray(grid, backend.int_dtype()), fb, layout=layout)
    f32 = f.astype(np.float32).astype(np.float64)
    angles = grid[None, :, 0, None] * f32[:, :, 0, :] + grid[None, :, 1, None] * f32[:, :, 1, :]
    want = _oracle_angles(to_numpy(xb), angles[None], layout)
    assert_close(got, want, like=xb, ulps=64)


def test_matches_lucidrains_learned_freq_values_and_gradients(rng):
    torch = pytest.importorskip("torch")
    ret = pytest.importorskip("rotary_embedding_torch")
    torch.manual_seed(0)
    theirs = ret.RotaryEmbedding(dim=16, learned_freq=True)
    q = torch.from_numpy(rng.normal(size=(2, 4, 9, 16)).astype(np.float32))
    w = torch.from_numpy(rng.normal(size=(2, 4, 9, 16)).astype(np.float32))
    want = theirs.rotate_queries_or_keys(q)
    (want * w).sum().backward()
    ours = rotary.learned.frequencies(rotary.RoPE(16), xp=torch)  # the same initial values,
    assert_close(ours, theirs.freqs.detach().double().numpy(), like=ours, ulps=1)  # to an ulp
    f = torch.nn.Parameter(theirs.freqs.detach().clone())  # (compare the operations exactly)
    got = rotary.learned.rotate(q, torch.arange(9), f, layout="interleaved")  # lucidrains pairs (2i, 2i+1)
    (got * w).sum().backward()
    assert_close(got.detach(), want.detach().double().numpy(), like=q, ulps=8)
    scale = np.abs(theirs.freqs.grad.numpy()).max()
    assert_close(f.grad, theirs.freqs.grad.double().numpy(), like=f.detach(), ulps=64, scale=scale)


def test_torch_gradcheck_in_float64(rng):
    torch = pytest.importorskip("torch")
    x = torch.from_numpy(rng.normal(size=(2, 5, 8))).requires_grad_(True)
    f = torch.from_numpy(rng.uniform(0.01, 1.0, size=4)).requires_grad_(True)
    pos = torch.arange(5)
    for layout in ("half", "interleaved"):
        assert torch.autograd.gradcheck(
            lambda x, f, lay=layout: rotary.learned.rotate(x, pos, f, layout=lay), (x, f)
        )
    k = torch.from_numpy(rng.normal(size=(2, 5, 8))).requires_grad_(True)
    assert torch.autograd.gradcheck(
        lambda q, k, f: rotary.learned.apply(q, k, pos, f, xpos_scale_base=64.0), (x, k, f)
    )


def test_torch_func_transforms(rng):
    torch = pytest.importorskip("torch")
    x = torch.from_numpy(rng.normal(size=(3, 5, 8)))
    f = torch.from_numpy(rng.uniform(0.01, 1.0, size=4))
    pos = torch.arange(5)

    def loss(f):  # type: ignore[no-untyped-def]
        return (rotary.learned.rotate(x, pos, f) ** 3).sum()

    g = torch.func.grad(loss)(f)
    fr = f.clone().requires_grad_(True)
    loss(fr).backward()
    assert torch.allclose(g, fr.grad, rtol=1e-12, atol=1e-12)
    per_row = torch.func.vmap(lambda xi: rotary.learned.rotate(xi, pos, f))(x)
    assert torch.equal(per_row, rotary.learned.rotate(x, pos, f))


def test_jax_gradients_against_finite_differences(rng):
    jax = pytest.importorskip("jax")
    from jax.test_util import check_grads

    jnp = jax.numpy
    x = jnp.asarray(rng.normal(size=(2, 5, 8)), dtype=jnp.float32)
    f = jnp.asarray(rng.uniform(0.01, 1.0, size=4), dtype=jnp.float32)
    pos = np.arange(5)

    def loss(x, f):  # type: ignore[no-untyped-def]
        return jnp.sum(rotary.learned.rotate(x, pos, f, layout="interleaved") ** 2 * jnp.arange(8.0))

    check_grads(loss, (x, f), order=1, modes=["rev"], atol=2e-2, rtol=2e-2, eps=1e-2)
    gx, gf = jax.grad(loss, argnums=(0, 1))(x, f)
    assert gx.shape == x.shape and gf.shape == f.shape
    jitted = jax.jit(jax.grad(loss, argnums=1))(x, f)
    assert_close(jitted, np.asarray(gf, dtype=np.float64), like=gf, ulps=64)


# -- xPos ------------------------------------------------------------------------------------------
def test_xpos_relative_position_identity(backend, rng):
    """q_m . k_n depends on m - n only: shifting every position leaves the scores unchanged."""
    f = rotary.learned.frequencies(rotary.RoPE(16), xp=backend.xp, device=backend.device)
    q = backend.asarray(rng.normal(size=(2, 6, 16)), "float32")
    k = backend.asarray(rng.normal(size=(2, 6, 16)), "float32")
    xp = backend.xp
    scores = []
    for shift in (0, 11, 40):
        qr, kr = rotary.learned.apply(q, k, np.arange(6) + shift, f, xpos_scale_base=64.0)
        scores.append(to_numpy(xp.matmul(qr, xp.matrix_transpose(kr))))
    for s in scores[1:]:
        np.testing.assert_allclose(s, scores[0], rtol=2e-4, atol=2e-4)


def test_xpos_matches_lucidrains(rng):
    torch = pytest.importorskip("torch")
    ret = pytest.importorskip("rotary_embedding_torch")
    theirs = ret.RotaryEmbedding(dim=16, use_xpos=True, xpos_scale_base=64)
    q = torch.from_numpy(rng.normal(size=(2, 4, 9, 16)).astype(np.float32))
    k = torch.from_numpy(rng.normal(size=(2, 4, 9, 16)).astype(np.float32))
    tq, tk = theirs.rotate_queries_and_keys(q, k)
    f = rotary.learned.frequencies(rotary.RoPE(16), xp=torch)
    oq, ok = rotary.learned.apply(q, k, torch.arange(9), f, layout="interleaved", xpos_scale_base=64.0)
    # lucidrains centres the scale's exponent on the middle position (9 // 2): a constant factor
    c = rotary.learned.xpos_scale([9 // 2], head_dim=16, scale_base=64.0, xp=np, dtype=np.float64)[0]
    c = np.repeat(c, 2)
    assert_close(oq, tq.double().numpy() * c, like=q, ulps=16)
    assert_close(ok, tk.double().numpy() / c, like=k, ulps=16)
    assert_close(
        oq @ ok.transpose(-1, -2), (tq @ tk.transpose(-1, -2)).double().numpy(), like=q, ulps=64, scale=10.0
    )
