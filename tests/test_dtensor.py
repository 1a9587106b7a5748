"""DTensor (issue 35): rotations of a 2-rank gloo mesh's DTensors equal the local computation, with
gradients, sharded on batch, heads and sequence (or replicated), positions plain or DTensors;
placements that cannot be served are refused naming the placement and what to do.
(67cca2f: ``aten.mul.Tensor got mixed torch.Tensor and DTensor``.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not torch.distributed.is_available():
    pytest.skip("torch.distributed is not available", allow_module_level=True)


@pytest.fixture(scope="module")
def report() -> dict:
    res = subprocess.run(
        [sys.executable, "-W", "ignore", str(Path(__file__).with_name("dtensor_worker.py"))],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_dtensors_equal_the_local_computation_with_gradients(report: dict) -> None:
    rows = report["results"]
    assert len(rows) == 5 * 4 * 3  # cases x placements x kinds of positions
    tol = 16 * np.finfo(np.float64).eps * 8  # (float64 data of scale ~4)
    for r in rows:
        assert "error" not in r, r
        assert r["types"] == ["DTensor"], r
        assert all(p == [r["placement"]] for p in r["placements"]), r  # the input's placements
        assert r["value"] <= tol and r["grad"] <= tol, r


def test_placements_that_cannot_be_served_are_refused_clearly(report: dict) -> None:
    ref = report["refusals"]
    assert "sharded on the feature axis 3 (S(3))" in ref["features sharded"]
    assert "redistribute" in ref["features sharded"]
    assert "attention sums over the sequence" in ref["attention"] and "to_local()" in ref["attention"]
    assert "pending reduction P(max)" in ref["partial max"]


def test_a_pending_sum_is_rotated_shard_by_shard(report: dict) -> None:
    assert report["partial sum"] <= 16 * np.finfo(np.float64).eps * 8
