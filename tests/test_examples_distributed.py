"""Smoke test: ``examples/distributed.py`` runs (Dask LocalCluster and 4 JAX CPU devices)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_distributed_example_runs(tmp_path):
    for mod in ("dask.array", "distributed", "jax"):
        pytest.importorskip(mod)
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)  # the example asks for its 4 CPU devices itself
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "distributed.py")],
        cwd=tmp_path,  # it writes nothing; run it away from the package
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "apply keeps them: True" in out
    assert "'cumsum'" in out and "'matmul'" in out  # block states prefix-summed, then each block's outputs
    assert "[jax] 4 devices" in out
    assert "collectives ['none']" in out
    assert "collectives ['collective-permute']" in out
    errors = [float(x) for x in re.findall(r"max \|.*\| = ([0-9.e+-]+)", out)]
    assert len(errors) == 3 and max(errors) < 1e-5, out
    assert list(tmp_path.iterdir()) == []
