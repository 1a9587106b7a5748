"""The fused Triton kernel, proven on this CPU: ``tests/triton_cases.py`` run in a fresh
interpreter with ``TRITON_INTERPRET=1`` (Triton's interpreter runs the kernel on CPU tensors).

On a machine with a CUDA device, ``pytest -m gpu`` runs the same cases on it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")

HERE = Path(__file__).resolve().parent


@pytest.mark.slow
def test_kernel_cases_in_the_triton_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", "-x"]
    res = subprocess.run(
        [*cmd, str(HERE / "triton_cases.py")],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=HERE.parent,
        env=env,
    )
    tail = res.stdout[-6000:] + res.stderr[-2000:]
    assert res.returncode == 0, tail
    assert " passed" in res.stdout and " failed" not in res.stdout, tail
