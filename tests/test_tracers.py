"""Every torch tracer is seen (issue 34): ``torch.jit.trace`` of a decoding step and of a prefill
is right at positions and lengths other than the traced ones, as the first thing a process does.

(The tracers' lines of the transform matrix are in ``tests/transforms.py``; every entry point
under ``jit.trace`` at other values in ``tests/test_transforms.py``.)
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch")


def _fresh(code: str) -> list[str]:
    res = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return res.stdout.split()


def test_a_traced_decoding_step_is_right_at_every_position() -> None:
    """Traced at position 5 in a fresh process (the first trace: torch's check traces twice);
    called at 9, 100, 5000, 40000 and -3, for ``RoPE.apply`` and the functional ``apply``.
    (67cca2f: the first trace failed its check; traced later, position 5's rotation everywhere.)"""
    out = _fresh(
        """
        import torch, rotary
        g = torch.Generator().manual_seed(0)
        q, k = torch.randn(1, 4, 1, 16, generator=g), torch.randn(1, 2, 1, 16, generator=g)
        rope = rotary.RoPE(16, scaling=rotary.YaRN(4.0, 64))
        for f in (rope.apply, rotary.apply):
            traced = torch.jit.trace(f, (q, k, torch.tensor([5])))
            for p in (9, 100, 5000, 40000, -3):
                got, want = traced(q, k, torch.tensor([p])), f(q, k, torch.tensor([p]))
                print(float(max((a - b).abs().max() for a, b in zip(got, want))))
        """
    )
    assert [float(v) for v in out] == [0.0] * 10


def test_a_traced_prefill_is_right_at_every_position_and_length() -> None:
    """Traced at positions 0..15 of 16 tokens; called past the per-position table, at negative
    positions and at other lengths (67cca2f: ``index out of range`` past the example's table)."""
    out = _fresh(
        """
        import torch, rotary
        g = torch.Generator().manual_seed(0)
        rope = rotary.RoPE(16)
        traced = torch.jit.trace(rope.rotate, (torch.randn(1, 2, 16, 16, generator=g), torch.arange(16)))
        for n, start in ((16, 5000), (16, -8), (16, 40000), (40, 0), (7, 123)):
            x, pos = torch.randn(1, 2, n, 16, generator=g), torch.arange(n) + start
            print(float((traced(x, pos) - rope.rotate(x, pos)).abs().max()))
        """
    )
    assert [float(v) for v in out] == [0.0] * 5
