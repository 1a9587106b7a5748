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


@pytest.mark.slow
@pytest.mark.slow_backends_too
@pytest.mark.parametrize(
    "which", [pytest.param("float32"), pytest.param("other_dtypes", marks=pytest.mark.matrix)]
)
@pytest.mark.parametrize("column", suite.COLUMNS, ids=[c.key for c in suite.COLUMNS])
@pytest.mark.parametrize("backend", backend_params())
def test_column(backend, column, which):
    """Every column on every backend in float32, and in its other float dtypes in the slow matrix
    (``pytest -m matrix``; a slow backend in float32 only, the report runs all)."""
    floats = backend.float_dtypes()
    dtypes = floats[:1] if which == "float32" else [] if backend.slow else floats[1:]
    if not dtypes:
        pytest.skip(f"{backend.name}: float32 only here (the report runs every dtype)")
    cells = [suite.run_column(column, backend, dtype) for dtype in dtypes]
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
    rc = report.main(["--backends", "numpy", "--libraries", "none", "--out", str(tmp_path)])
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
    rc = report.main(["--backends", "numpy", "--libraries", "none", "--out", str(tmp_path), "--quiet"])
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


# -- the command line ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "argv, env, says",
    [
        (["--backends", "bogus"], None, "unknown backend 'bogus' in --backends; choose from: numpy"),
        (["--backends", "numpy,bogus"], None, "unknown backend 'bogus'"),
        ([], "bogus", "unknown backend 'bogus' in $ROTARY_BACKENDS"),
        (["--backends", ","], None, "choose from: numpy"),
        (["--bogus"], None, "unrecognized arguments: --bogus"),
        (["--against", "rotary:rotate", "--dtypes", "float8"], None, "unknown dtype 'float8'"),
        (["--against", "rotary:rotate", "--cases", "nope"], None, "choose from: half_d8_base10"),
        (["--against", "no_such_module_xyz:f"], None, "cannot import 'no_such_module_xyz'"),
        (["--against", "rotary:no_such_function"], None, "rotary has no attribute 'no_such_function'"),
        (["--against", "rotary"], None, "MODULE:FUNCTION"),
    ],
)
def test_usage_errors_name_the_choices(tmp_path, monkeypatch, capsys, argv, env, says):
    if env is None:
        monkeypatch.delenv("ROTARY_BACKENDS", raising=False)
    else:
        monkeypatch.setenv("ROTARY_BACKENDS", env)
    with pytest.raises(SystemExit) as exc:
        report.main([*argv, "--out", str(tmp_path)])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err, err
    assert "FAILED" not in err and not list(tmp_path.iterdir())


def test_backend_not_installed_is_a_usage_error(tmp_path, capsys):
    missing = [b.name for b in rotary.testing.ALL_BACKENDS if b.name not in {a.name for a in available("")}]
    if not missing:
        pytest.skip("every backend is installed here")
    with pytest.raises(SystemExit) as exc:
        report.main(["--backends", missing[0], "--out", str(tmp_path)])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"'{missing[0]}' (--backends) is not installed or usable here; installed: numpy" in err


_PEER = """
import numpy as np
import rotary


def interleaved(x, pos):
    return rotary.rotate(x, pos, layout="interleaved")


def float32_recipe(x, pos):  # the common recipe: float32 angles, half layout
    h = x.shape[-1] // 2
    inv = (1.0 / 10000.0 ** (np.arange(0, 2 * h, 2, dtype=np.float32) / (2 * h))).astype(np.float32)
    ang = np.asarray(pos, dtype=np.float32)[:, None] * inv
    c, s = np.cos(ang).astype(x.dtype), np.sin(ang).astype(x.dtype)
    x1, x2 = x[..., :h], x[..., h:]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)


def wrong_sign(x, pos):
    return rotary.rotate(x, -np.asarray(pos))
"""


@pytest.fixture
def peer(tmp_path, monkeypatch):
    (tmp_path / "peer_rope_mod.py").write_text(_PEER)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "peer_rope_mod"


def _against(tmp_path, *argv):
    rc = report.main(["--against", *argv, "--out", str(tmp_path / "out"), "--quiet"])
    return rc, json.loads((tmp_path / "out" / "report.json").read_text())


def test_against_rotary_itself_with_exact_angles(tmp_path):
    rc, rep = _against(tmp_path, "rotary:rotate", "--angle-eps", "0", "--dtypes", "float32,float64")
    assert rc == 0 and rep["passed"], rep
    assert rep["cases"] == ["half_d64"] and len(rep["runs"]) == 2
    for run in rep["runs"]:
        assert run["check_rope"]["passed"] and [g["name"] for g in run["golden"]] == ["half_d64"]
        assert run["golden"][0]["ulps"] <= 2.0


def test_against_picks_the_golden_cases_of_its_layout(tmp_path, peer):
    rc, rep = _against(tmp_path, f"{peer}:interleaved", "--layout", "interleaved", "--angle-eps", "0")
    assert rc == 0, rep
    assert rep["cases"] == ["interleaved_d64", "interleaved_d64_fractional"]
    rc, rep = _against(tmp_path, f"{peer}:interleaved", "--layout", "half")  # claims the wrong layout
    results = rep["runs"][0]["check_rope"]["results"]
    assert rc == 1 and "layout" in [r["name"] for r in results if not r["passed"]]
    assert not rep["runs"][0]["golden"][0]["passed"]


def test_against_float32_angles_pass_only_when_allowed(tmp_path, peer):
    rc, rep = _against(tmp_path, f"{peer}:float32_recipe")  # default angle_eps: float32 angles allowed
    assert rc == 0, rep
    rc, rep = _against(tmp_path, f"{peer}:float32_recipe", "--angle-eps", "0")
    run = rep["runs"][0]
    assert rc == 1
    failed = [r["name"] for r in run["check_rope"]["results"] if not r["passed"]]
    assert "long_positions" in failed and not run["golden"][0]["passed"]
    assert "positions off" in run["golden"][0]["message"]


def test_against_wrong_sign_fails_with_a_diagnosis(tmp_path, peer):
    rc, rep = _against(tmp_path, f"{peer}:wrong_sign")
    run = rep["runs"][0]
    assert rc == 1
    assert "rotates by -pos" in run["check_rope"]["results"][0]["message"]
    assert not run["golden"][0]["passed"]


def test_vectors_option_prints_their_folder(capsys):
    from conformance import vectors

    assert report.main(["--vectors"]) == 0
    assert str(vectors.HERE) in capsys.readouterr().out


# -- issue 35: the kit never vouches for what it did not check ---------------------------------------
def test_a_named_library_that_cannot_be_checked_fails_the_run(tmp_path, capsys):
    """``--library M`` where M has no arrays to make (67cca2f: "n/a ... not usable here", PASSED)."""
    rc = report.main(
        ["--backends", "numpy", "--libraries", "none", "--library", "json", "--out", str(tmp_path)]
    )
    out = capsys.readouterr().out
    assert rc == 1, out
    assert "FAIL json" in out and "named but not checked: not usable here" in out and "PASSED" not in out


def test_an_unsupported_standard_version_is_reported_not_crashed(tmp_path):
    """array-api-strict set to 2022.12 (67cca2f: a crash on ``__array_namespace_info__``)."""
    pytest.importorskip("array_api_strict")
    import subprocess
    import sys

    env = {**os.environ, "ARRAY_API_STRICT_API_VERSION": "2022.12"}
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "conformance",
            "--backends",
            "array_api_strict",
            "--libraries",
            "none",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert res.returncode == 1, res.stderr[-2000:]
    assert "Traceback" not in res.stderr
    assert "NOT CHECKED" in res.stdout and "unsupported standard version" in res.stdout
    assert "standard 2022.12; rotary needs 2023.12 or later" in res.stdout


def test_every_standard_version_is_checked_or_refused_clearly():
    pytest.importorskip("array_api_strict")
    from conformance.libraries import run_versions

    got = {e["version"]: e for e in run_versions()}
    assert {"2022.12", "2023.12", "2024.12"} <= set(got)
    for version, e in got.items():
        assert e["passed"], e
        if version < "2023.12":
            assert e["detail"].startswith("unsupported standard version"), e
        else:
            assert "public functions equal NumPy's" in e["detail"], e


def test_the_library_check_compares_types_and_namespaces():
    from conformance.calls import run_calls

    class Sub(np.ndarray):  # a NumPy subclass: rotary's results are plain ndarrays
        pass

    res = run_calls(lambda a: np.asarray(a).view(Sub), names=("rotate",))
    assert not res[0]["passed"] and "returned a numpy.ndarray for" in res[0]["detail"], res
