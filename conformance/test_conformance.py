"""The conformance suite as tests: every column on every installed backend (all its float
dtypes), the backend-independent checks, and the runner itself."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import rotary
from conformance import report, suite
from rotary.testing import ALL_BACKENDS, available

_AVAILABLE = {b.name: b for b in available()}
_SELECTED = os.environ.get("ROTARY_BACKENDS")


def _backend_params():
    out = []
    for b in ALL_BACKENDS:
        if _SELECTED and b.name not in {n.strip() for n in _SELECTED.split(",")}:
            continue
        if b.name in _AVAILABLE:
            out.append(pytest.param(_AVAILABLE[b.name], id=b.name))
        else:
            out.append(pytest.param(b, id=b.name, marks=pytest.mark.skip(reason=f"{b.name} not installed")))
    return out


@pytest.mark.parametrize("column", suite.COLUMNS, ids=[c.key for c in suite.COLUMNS])
@pytest.mark.parametrize("backend", _backend_params())
def test_column(backend, column):
    cells = [suite.run_column(column, backend, dtype) for dtype in backend.float_dtypes()]
    if all(c.status == "n/a" for c in cells):
        pytest.skip(f"not available in this rotary: {', '.join(cells[0].missing)}")
    bad = [f"{c.dtype}: {c.message}" for c in cells if c.status == "fail"]
    assert not bad, "\n".join(bad)
    for c in cells:
        assert c.ulps <= c.tol_ulps, c


def test_invariants():
    for inv in suite.run_invariants():
        assert inv["passed"] is not False, inv


def test_missing_function_is_reported_not_available(monkeypatch):
    b = available("numpy")[0]
    monkeypatch.delattr(rotary, "decay_bound")
    col = next(c for c in suite.COLUMNS if c.key == "decay_bound")
    cell = suite.run_column(col, b, "float32")
    assert cell.status == "n/a" and cell.missing == ("decay_bound",)


def test_broken_function_fails_its_columns(monkeypatch):
    b = available("numpy")[0]
    real = rotary.rotate

    def off_by_one(x, pos, **kw):  # rotates every position one step too far
        return real(x, np.asarray(pos) + 1, **kw)

    monkeypatch.setattr(rotary, "rotate", off_by_one)
    for key in ("golden", "check_half"):
        col = next(c for c in suite.COLUMNS if c.key == key)
        cell = suite.run_column(col, b, "float32")
        assert cell.status == "fail" and cell.message, cell


def test_runner_writes_report_with_numpy_only(tmp_path, capsys):
    rc = report.main(["--backends", "numpy", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "numpy/float32" in out and "PASSED" in out and "backend-independent checks" in out
    rep = json.loads((tmp_path / "report.json").read_text())
    assert rep["passed"] and rep["backends"] == ["numpy"]
    assert {c["column"] for c in rep["cells"]} == {c.key for c in suite.COLUMNS}
    assert "numpy" in rep["environment"]["versions"]
    assert (tmp_path / "report.txt").read_text().startswith("rotary conformance report")
    pytest.importorskip("matplotlib")
    assert (tmp_path / "heatmap.png").read_bytes()[:4] == b"\x89PNG"


def test_runner_fails_on_a_failure(tmp_path, monkeypatch, capsys):
    real = rotary.apply

    def float32_only_wrong(q, k, pos, **kw):  # the float64 oracle stays right, float32 is off
        return real(q, k, pos, **{**kw, "base": 9999.0} if q.dtype == np.float32 else kw)

    monkeypatch.setattr(rotary, "apply", float32_only_wrong)
    rc = report.main(["--backends", "numpy", "--out", str(tmp_path), "--quiet"])
    assert rc == 1
    assert "FAILED" in capsys.readouterr().out
    rep = json.loads((tmp_path / "report.json").read_text())
    bad = {(c["column"], c["dtype"]) for c in rep["cells"] if c["status"] == "fail"}
    assert bad == {("apply", "float32"), ("scaling", "float32")}, bad  # scalings go through apply
