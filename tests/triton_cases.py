"""The fused Triton kernel against the generic code, run by ``tests/test_triton.py`` in its own
interpreter with ``TRITON_INTERPRET=1`` (the kernel on CPU tensors), or on CUDA devices where
there are some (``pytest -m gpu``).

Tolerances: the exact method does the generic code's operations in the same order without
fused multiply-adds, so its results are **bit-identical** (every dtype, forward and backward).
The float32 recipe is bit-identical wherever the kernel's ``cos``/``sin`` are the generic code's:
on a GPU both are CUDA's ``cosf``/``sinf``; in the interpreter the kernel's are NumPy's and the
generic code's torch's, which differ by at most one float32 ulp, so there the outputs are
compared within ``4 * eps(float32) * max(1, |x|)`` (float32) and bit for bit otherwise (float16
and bfloat16 round the difference away in these cases; a rounding boundary would show as one
ulp of the dtype, which the test then allows).
"""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

import rotary  # noqa: E402
from rotary.testing import assert_close  # noqa: E402

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
DEVICES = (["cpu"] if INTERPRET else []) + (["cuda"] if torch.cuda.is_available() else [])
if not DEVICES:
    pytest.skip("neither TRITON_INTERPRET=1 nor a CUDA device", allow_module_level=True)

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _ran_kernel(fn):  # type: ignore[no-untyped-def]
    """``fn()``, asserting the kernel's custom op ran: the profiler records it and, unlike a
    dispatch mode, leaves the call a plain eager one (where the fast paths may run)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        out = fn()
    names = [e.name for e in prof.events()]
    assert any(n.startswith("rotary::rope") for n in names), names[:10]
    return out


def _kernel(fn):  # type: ignore[no-untyped-def]
    """``fn()`` with the fused kernel (asserting it ran) and with the generic code."""
    fast = _ran_kernel(fn)
    with rotary.fast_paths(False):
        slow = fn()
    return fast, slow


def _same(fast, slow, *, exact: bool, device: str) -> None:  # type: ignore[no-untyped-def]
    for a, b in zip(fast, slow, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape and a.device == b.device
        if exact or device == "cuda" or a.dtype != torch.float32:
            if not torch.equal(a, b):
                assert not exact and device == "cpu", (a.float() - b.float()).abs().max()
                assert_close(a, b.double(), ulps=1, like=a)  # a rounding boundary of the dtype
        else:
            assert_close(a, b.double(), ulps=4, like=a)


def _data(shape, dtype, device, seed=0):  # type: ignore[no-untyped-def]
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(dtype).to(device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("angles", ["exact", "float32"])
@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize(
    "width", [(64, None, "neox"), (64, 32, "neox"), (64, 24, "proportional")], ids=["full", "neox", "prop"]
)
def test_forward_matches_the_generic_code(device, dtype, angles, layout, width):
    head, rot, partial = width
    rope = rotary.RoPE(head, layout=layout, angles=angles, rotary_dim=rot, partial=partial)
    q = _data((2, 4, 9, head), dtype, device)
    k = _data((2, 2, 9, head), dtype, device, 1)  # GQA: fewer key heads
    pos = torch.arange(9, device=device) * 1000003 + 5  # past 2**24
    fast, slow = _kernel(lambda: rope.apply(q, k, pos))
    _same(fast, slow, exact=angles == "exact", device=device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("angles", ["exact", "float32"])
@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_backward_matches_the_generic_code(device, dtype, angles, layout):
    rope = rotary.RoPE(32, layout=layout, angles=angles, rotary_dim=24)

    def grads():  # type: ignore[no-untyped-def]
        q = _data((1, 3, 5, 32), dtype, device).requires_grad_(True)
        k = _data((1, 1, 5, 32), dtype, device, 1).requires_grad_(True)
        pos = torch.tensor([0, 7, 4095, 4096, 2**30 + 3], device=device)
        qr, kr = rope.apply(q, k, pos)
        (qr * _data(qr.shape, dtype, device, 2)).sum().backward(retain_graph=True)
        (kr * _data(kr.shape, dtype, device, 3)).sum().backward()
        return qr.detach(), kr.detach(), q.grad, k.grad

    fast, slow = _kernel(grads)
    _same(fast, slow, exact=angles == "exact", device=device)


@pytest.mark.parametrize("device", DEVICES)
def test_positions_of_every_shape_and_sign(device):
    rope = rotary.RoPE(16, layout="interleaved")
    q = _data((3, 5, 2, 16), torch.float32, device)  # (batch, seq, heads, dim)
    cases = [
        torch.randint(-(2**35), 2**35, (3, 5, 1), device=device),  # per batch and token, negative too
        torch.tensor([[2**36 - 1], [-(2**36) + 1], [0], [1], [-1]], device=device),  # the extremes
        torch.arange(5, dtype=torch.int32, device=device)[:, None],  # int32
        torch.arange(5, dtype=torch.int16, device=device)[:, None] * 1000,  # narrow integers
    ]
    for pos in cases:
        fast, slow = _kernel(lambda pos=pos: (rope.rotate(q, pos),))
        _same(fast, slow, exact=True, device=device)


@pytest.mark.parametrize("device", DEVICES)
def test_non_contiguous_and_decoding_inputs(device):
    rope = rotary.RoPE(32)
    base = _data((2, 7, 4, 32), torch.bfloat16, device)
    q = base.transpose(1, 2)  # (2, 4, 7, 32) read through strides
    k = _data((2, 7, 2, 64), torch.bfloat16, device, 1)[..., ::2].transpose(1, 2)  # feature stride 2
    pos = torch.arange(7, device=device) + 4090
    assert not q.is_contiguous() and k.stride(-1) == 2
    fast, slow = _kernel(lambda: rope.apply(q, k, pos))
    _same(fast, slow, exact=True, device=device)
    one_q, one_k = q[:, :, -1:], k[:, :, -1:]  # a decoding step
    fast, slow = _kernel(lambda: rope.apply(one_q, one_k, torch.tensor([70000], device=device)))
    _same(fast, slow, exact=True, device=device)


@pytest.mark.parametrize("device", DEVICES)
def test_attention_factor_and_five_dimensional_inputs(device):
    rope = rotary.RoPE(16, scaling=rotary.scaling.YaRN(factor=4.0, original_max_position_embeddings=64))
    assert rope.attention_factor != 1.0
    q = _data((2, 1, 3, 4, 16), torch.float16, device)
    fast, slow = _kernel(lambda: (rope.rotate(q, torch.arange(4, device=device) + 100),))
    _same(fast, slow, exact=True, device=device)


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_keeps_the_kernel_as_one_op(device):
    rope = rotary.RoPE(32, layout="interleaved")
    graphs: list = []

    def backend(gm, example_inputs):  # type: ignore[no-untyped-def]
        graphs.append(gm)
        return gm.forward

    f = torch.compile(lambda q, k, p: rope.apply(q, k, p), fullgraph=True, backend=backend)
    q, k = _data((1, 2, 6, 32), torch.float32, device), _data((1, 1, 6, 32), torch.float32, device, 1)
    pos = torch.arange(6, device=device) * 977
    got = f(q, k, pos)
    with rotary.fast_paths(False):
        want = rope.apply(q, k, pos)
    _same(got, want, exact=True, device=device)
    assert "rotary.rope" in str(graphs[0].graph), graphs[0].graph


@pytest.mark.parametrize("device", DEVICES)
def test_fake_implementation_gives_shapes(device):
    from torch._subclasses.fake_tensor import FakeTensorMode

    q = _data((1, 2, 6, 32), torch.bfloat16, device)
    pos = torch.arange(6, device=device)
    mode = FakeTensorMode()
    with mode:
        fq, fp = mode.from_tensor(q), mode.from_tensor(pos)
        from rotary._backends._triton import rope_op  # the registered op's fake implementation

        table = torch.empty((3, 2, 4097, 16), device=device)
        a, b = rope_op(fq, fq, fp, fp, table, 32, True, True, 1.0, 1.0)
    assert a.shape == q.shape and a.dtype == q.dtype and b.shape == q.shape


def _liger_inputs(device):  # type: ignore[no-untyped-def]
    q = _data((1, 4, 16, 64), torch.float32, device)
    k = _data((1, 4, 16, 64), torch.float32, device, 1)
    pos = torch.arange(16, device=device)
    inv = 1.0 / (10000.0 ** (torch.arange(0, 64, 2, dtype=torch.int64, device=device).float() / 64))
    f = pos[:, None].float() @ inv[None, :]
    emb = torch.cat([f, f], dim=-1)
    return q, k, pos, emb.cos()[None], emb.sin()[None]


@pytest.mark.parametrize("device", DEVICES)
def test_liger_kernel_is_hugging_face_bitwise(device):
    """The second oracle: liger's Triton RoPE under the same interpreter equals Hugging Face's
    ``apply_rotary_pos_emb`` bit for bit on a 1x4x16x64 case."""
    liger = pytest.importorskip("liger_kernel.ops.rope")
    hf = pytest.importorskip("transformers.models.llama.modeling_llama")
    q, k, _, cos, sin = _liger_inputs(device)
    lq, lk = liger.LigerRopeFunction.apply(q.clone(), k.clone(), cos, sin)
    hq, hk = hf.apply_rotary_pos_emb(q, k, cos, sin)
    assert torch.equal(lq, hq) and torch.equal(lk, hk)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_our_kernel_against_liger(device, dtype):
    """Our kernel in Hugging Face's recipe (``angles="float32"``) against liger's on the cases it
    supports (half layout, whole heads, a cos/sin table): within two ulps of the dtype (its
    cos/sin come from torch, ours from the kernel's own ``cos``/``sin``).  Not bfloat16 in the
    interpreter, where liger's bfloat16 arithmetic gives NaN in some lanes (seen with 0.8.5)."""
    if dtype == torch.bfloat16 and device == "cpu":
        pytest.skip("liger's bfloat16 arithmetic under Triton's interpreter is not a usable oracle")
    liger = pytest.importorskip("liger_kernel.ops.rope")
    q, k, pos, cos, sin = _liger_inputs(device)
    q, k = q.to(dtype), k.to(dtype)
    lq, lk = liger.LigerRopeFunction.apply(q.clone(), k.clone(), cos.to(dtype), sin.to(dtype))
    rope = rotary.RoPE(64, angles="float32")
    oq, ok = _ran_kernel(lambda: rope.apply(q, k, pos))
    for ours, theirs in ((oq, lq), (ok, lk)):
        assert_close(ours, theirs.double(), ulps=2, like=ours)
