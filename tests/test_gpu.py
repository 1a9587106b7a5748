"""GPU-only checks (skipped without CUDA; ``pytest -m gpu`` selects them with the GPU backends).

- One decoding step (RoPE on q and k, then the linear-attention state update) captured in a
  CUDA graph and replayed at new positions: no host synchronisation, no host value in the step.
- The fused Triton kernel's cases (``tests/triton_cases.py``) on the CUDA device.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import rotary
from rotary.testing import assert_close, reference

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

HERE = Path(__file__).resolve().parent


def test_decode_step_in_a_cuda_graph():
    dev = torch.device("cuda")
    g = torch.Generator(device="cpu").manual_seed(0)
    rope = rotary.RoPE(128)
    q = torch.randn(1, 32, 1, 128, generator=g).to(dev)
    k = torch.randn(1, 8, 1, 128, generator=g).to(dev)
    v = torch.randn(1, 8, 1, 128, generator=g).to(dev)
    kk, vv = torch.randn(1, 8, 16, 128, generator=g).to(dev), torch.randn(1, 8, 16, 128, generator=g).to(dev)
    pos = torch.tensor([16], device=dev)
    state = rotary.linear_attention_state(kk, vv, torch.arange(16, device=dev))

    def step():  # type: ignore[no-untyped-def]
        qr, kr = rope.apply(q, k, pos)
        out, st = rotary.linear_attention(
            qr[:, :8], kr, v, causal=True, state=state, return_state=True
        )  # (RoPE already applied: no pos)
        return qr, kr, out, st.S, st.z

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):  # warm: constants on the device, kernels compiled
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    for p in (16, 17, 4095, 70000, 2**30 + 1):
        pos.fill_(p)
        graph.replay()
        torch.cuda.synchronize()
        want = step()
        for a, b in zip(captured, want, strict=True):
            assert torch.equal(a, b), p
        assert_close(captured[0], reference.rotate(q.cpu().numpy(), [p]), like=q)


def test_triton_kernel_cases_on_the_gpu():
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly"]
    res = subprocess.run(
        [*cmd, str(HERE / "triton_cases.py")], capture_output=True, text=True, timeout=900, cwd=HERE.parent
    )
    assert res.returncode == 0, res.stdout[-6000:] + res.stderr[-2000:]
