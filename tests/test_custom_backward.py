"""RoPE's custom backward (torch): the gradient is the rotation by ``-theta``, so autograd keeps
the positions, not cos/sin; its gradients are the generic code's autograd, bit for bit."""

from __future__ import annotations

import pytest

import rotary

torch = pytest.importorskip("torch")


def _saved(fn):  # type: ignore[no-untyped-def]
    seen = {}

    def pack(t):  # type: ignore[no-untyped-def]
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(seen.values())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64], ids=str)
@pytest.mark.parametrize("angles", ["exact", "float32"])
def test_gradients_are_the_generic_ones_bitwise(dtype, angles):
    scaling = rotary.YaRN(factor=4.0, original_max_position_embeddings=16)  # an attention factor too
    rope = rotary.RoPE(32, angles=angles, layout="interleaved", rotary_dim=24, scaling=scaling)
    pos = torch.tensor([0, 5, 100, 4095, 70000, 2**30, -3])

    def run():  # type: ignore[no-untyped-def]
        g = torch.Generator().manual_seed(0)
        q = torch.randn(2, 4, 7, 32, generator=g).to(dtype).requires_grad_(True)
        k = torch.randn(2, 2, 7, 32, generator=g).to(dtype).requires_grad_(True)
        w1, w2 = (
            torch.randn(2, 4, 7, 32, generator=g).to(dtype),
            torch.randn(2, 2, 7, 32, generator=g).to(dtype),
        )
        qr, kr = rope.apply(q, k, pos)
        ((qr * w1).sum() + (kr * w2).sum()).backward()
        (rope.rotate(q, pos) * w1).sum().backward()  # one tensor too
        return qr.detach(), kr.detach(), q.grad, k.grad

    fast = run()
    with rotary.fast_paths(False):  # plain autograd over the generic code
        slow = run()
    for a, b in zip(fast, slow, strict=True):
        assert torch.equal(a, b)


def test_autograd_keeps_positions_not_cos_sin():
    rope = rotary.RoPE(64)
    q = torch.randn(2, 8, 256, 64, requires_grad=True)
    k = torch.randn(2, 2, 256, 64, requires_grad=True)
    pos = torch.arange(256).expand(2, 1, 256)
    custom = _saved(lambda: rope.apply(q, k, pos))
    with rotary.fast_paths(False):
        plain = _saved(lambda: rope.apply(q, k, pos))
    assert custom == 0  # (the positions live in the backward's closure)
    assert plain >= 2 * 2 * 256 * 32 * 4  # cos and sin of every (batch, position, pair), float32


def test_double_backward_and_gradcheck():
    rope = rotary.RoPE(8, layout="interleaved", rotary_dim=6)
    x = torch.randn(2, 5, 8, dtype=torch.float64, requires_grad=True)
    pos = torch.tensor([0, 3, 9, 2**20, -7])
    assert torch.autograd.gradcheck(lambda x: rope.rotate(x, pos), (x,))
    assert torch.autograd.gradgradcheck(lambda x: rope.rotate(x, pos) ** 2, (x,))
