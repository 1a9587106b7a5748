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
from rotary.testing.backends import available, backend_params


@pytest.mark.parametrize("column", suite.COLUMNS, ids=[c.key for c in suite.COLUMNS])
@pytest.mark.parametrize("backend", backend_params())
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


def test_corrupted_golden_vectors_are_caught(tmp_path, monkeypatch):
    import shutil
    import zipfile

    from conformance import vectors

    for f in vectors.HERE.iterdir():
        if f.suffix in (".npz", ".json"):
            shutil.copy(f, tmp_path / f.name)
    name = "half_d64"
    with np.load(tmp_path / f"{name}.npz") as f:
        arrays = {k: f[k] for k in f.files}
    arrays["out"][3, 5] += 1e-12  # a silent edit of one output
    with zipfile.ZipFile(tmp_path / f"{name}.npz", "w") as zf:
        for k, a in arrays.items():
            with zf.open(f"{k}.npy", "w") as fh:
                np.lib.format.write_array(fh, a)
    monkeypatch.setattr(vectors, "HERE", tmp_path)
    monkeypatch.setattr(vectors, "INDEX", tmp_path / "index.json")
    res = {r["name"]: r for r in vectors.verify()}
    assert not res[name]["passed"]
    assert "sha256 mismatch" in res[name]["message"] and "fresh float64" in res[name]["message"]
    assert all(r["passed"] for n, r in res.items() if n != name)
