"""The same answer whatever ran before: every scenario in a fresh Python process.

The warm process that runs the rest of the suite cannot see process state (a constant cached
inside an export, a table leaking into a fake mode), so each scenario here starts a new
interpreter (``tests/state_scenarios.py``): one first context (an export, a compile, a fake
mode, a JAX transformation, threads...), then a mix of plain eager calls on NumPy and the
context's own library (torch or JAX; all three after threads or a cache setting), every
result compared with the float64 oracle within ``finfo`` tolerance and, bit for bit, with the
generic code (``rotary.fast_paths(False)``).

A new first context is one entry of ``state_scenarios.CONTEXTS``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import state_scenarios as S  # noqa: E402

pytest.importorskip("torch")
pytestmark = pytest.mark.slow  # (each test a fresh interpreter: scheduled first)


def run_fresh(steps: list[list]) -> list[dict]:
    """Run ``steps`` in a new interpreter; the JSON line of each step."""
    res = subprocess.run(
        [sys.executable, str(HERE / "state_scenarios.py"), json.dumps(steps)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=HERE.parent,
    )
    lines = [json.loads(x) for x in res.stdout.splitlines() if x.startswith("{")]
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return lines


def assert_all_ok(lines: list[dict], expected: int) -> None:
    bad = [x for x in lines if not x["ok"]]
    assert not bad, "\n\n".join(f"{b['step']}:\n{b['error']}" for b in bad[:4])
    assert len(lines) == expected, f"{len(lines)} of {expected} steps ran"


def _expected(steps: list[list]) -> int:
    jax = S.has_jax()
    return sum(
        1
        for kind, p in steps
        if jax or not (kind in S.JAX_CONTEXTS or (kind == "eager" and p["lib"] == "jax"))
    )


@pytest.mark.parametrize("first", list(S.CONTEXTS))
def test_first_context_then_eager_calls(first):
    """The state matrix: a first context three times (a plain configuration, a partial
    interleaved one, an HF scaling dict), then the eager follow-ups of its library and NumPy's
    (every library's after a process-wide setting: ``state_scenarios.follow_ups``)."""
    steps = [[first, 0], [first, 3], [first, 4], *(["eager", e] for e in S.follow_ups(first))]
    assert_all_ok(run_fresh(steps), _expected(steps))


def _python_c(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300
    )


def test_regression_export_first_does_not_poison_eager_calls():
    # Issue 21, reproduction 1: in a cold process, torch.export of RoPE(64).apply created the
    # torch backend's sign constant as a FakeTensor (the backend module was imported inside
    # export's fake mode) and every later eager fast-path call multiplied by it: max error 2.7.
    res = _python_c(
        """
        import numpy as np, torch, rotary
        from rotary.testing import assert_close, reference
        class M(torch.nn.Module):
            def forward(self, q, k, pos):
                return rotary.RoPE(64).apply(q, k, pos)
        q, k, pos = torch.randn(1, 4, 16, 64), torch.randn(1, 4, 16, 64), torch.arange(16)
        torch.export.export(M(), (q, k, pos))
        q2 = torch.randn(2, 3, 8, 64)
        p8 = torch.arange(8)
        for out in (rotary.apply(q2, q2, p8)[0], rotary.RoPE(64).apply(q2, q2, p8)[1],
                    rotary.rotate(q2, p8), rotary.rotate(q2[:, :, :1], torch.tensor([3]))):
            n = out.shape[-2]
            assert_close(out, reference.rotate(q2[:, :, :n].numpy(), np.arange(n) if n > 1 else [3]), like=q2)
        print("ok")
        """
    )
    assert res.returncode == 0 and res.stdout.strip().endswith("ok"), res.stderr[-3000:]


def test_regression_fake_tensor_mode_after_a_warm_call():
    # Issue 21, reproduction 2: the cached real digit table leaked into a FakeTensorMode
    # ("Please convert all Tensors to FakeTensors first").
    res = _python_c(
        """
        import torch, rotary
        from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
        q = torch.randn(1, 4, 16, 64)
        rotary.apply(q, q, torch.arange(16))
        m = FakeTensorMode()
        with m:
            out = rotary.apply(m.from_tensor(q), m.from_tensor(q), m.from_tensor(torch.arange(16)))
        assert isinstance(out[0], FakeTensor) and out[0].shape == q.shape
        print("ok")
        """
    )
    assert res.returncode == 0 and res.stdout.strip().endswith("ok"), res.stderr[-3000:]


def test_regression_jax_eager_is_transfer_free():
    # Issue 21, reproduction 3: every eager JAX call moved Python scalars to the device.
    pytest.importorskip("jax")
    res = _python_c(
        """
        import os; os.environ["JAX_PLATFORMS"] = "cpu"
        import jax, jax.numpy as jnp, rotary
        jx, jp = jnp.ones((2, 8, 64)), jnp.arange(8)
        rotary.rotate(jx, jp)
        with jax.transfer_guard("disallow"):
            rotary.rotate(jx, jp)
        print("ok")
        """
    )
    assert res.returncode == 0 and res.stdout.strip().endswith("ok"), res.stderr[-3000:]
