"""The framework modules holding trained frequencies: ``rotary.modules.torch`` and ``.flax``."""

from __future__ import annotations

import numpy as np
import pytest

import rotary
from rotary.testing import assert_close


def test_torch_module_is_the_functional_call_and_trains(rng):
    torch = pytest.importorskip("torch")
    from rotary.modules.torch import LearnedRoPE

    init = rotary.RoPE(16, layout="interleaved", scaling=rotary.scaling.Linear(factor=2.0))
    m = LearnedRoPE(init, xpos_scale_base=256.0)
    assert m.freqs.requires_grad and tuple(m.freqs.shape) == (8,)
    assert_close(m.freqs.detach(), init.inv_freq(), like=m.freqs.detach(), ulps=1)  # scaling included
    q = torch.from_numpy(rng.normal(size=(2, 4, 10, 16)).astype(np.float32))
    k = torch.from_numpy(rng.normal(size=(2, 4, 10, 16)).astype(np.float32))
    pos = torch.arange(10)
    want = rotary.learned.apply(q, k, pos, m.freqs.detach(), layout="interleaved", xpos_scale_base=256.0)
    got = m(q, k, pos)
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a.detach(), b)
    target = torch.from_numpy(rng.normal(size=(2, 4, 10, 10)).astype(np.float32))
    opt = torch.optim.Adam(m.parameters(), lr=0.05)
    losses = []
    for _ in range(20):
        qr, kr = m(q, k, pos)
        loss = ((qr @ kr.transpose(-1, -2) - target) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss))
    assert losses[-1] < losses[0]


def test_torch_module_per_head_mixed_frequencies(rng):
    torch = pytest.importorskip("torch")
    from rotary.modules.torch import LearnedRoPE

    m = LearnedRoPE(8, n_axes=2, heads=3)
    assert tuple(m.freqs.shape) == (3, 1, 2, 4)
    x = torch.from_numpy(rng.normal(size=(2, 3, 6, 8)).astype(np.float32))
    grid = torch.stack(torch.meshgrid(torch.arange(2), torch.arange(3), indexing="ij"), -1).reshape(6, 2)
    out = m.rotate(x, grid)
    out.square().sum().backward()
    assert m.freqs.grad is not None and tuple(m.freqs.grad.shape) == (3, 1, 2, 4)


def test_flax_nnx_module_gradients_equal_the_functional_ones(rng):
    pytest.importorskip("flax")
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from rotary.modules.flax import LearnedRoPE

    m = LearnedRoPE(rotary.RoPE(16))
    q = jnp.asarray(rng.normal(size=(2, 3, 7, 16)), dtype=jnp.float32)
    k = jnp.asarray(rng.normal(size=(2, 3, 7, 16)), dtype=jnp.float32)
    pos = jnp.arange(7)

    def loss(mod):  # type: ignore[no-untyped-def]
        qr, kr = mod(q, k, pos)
        return jnp.sum((qr @ jnp.swapaxes(kr, -1, -2)) ** 2)

    g = nnx.grad(loss)(m)

    def floss(f):  # type: ignore[no-untyped-def]
        qr, kr = rotary.learned.apply(q, k, pos, f)
        return jnp.sum((qr @ jnp.swapaxes(kr, -1, -2)) ** 2)

    want = jax.grad(floss)(m.freqs.value)
    assert_close(g.freqs.value, np.asarray(want, dtype=np.float64), like=want, ulps=4)
