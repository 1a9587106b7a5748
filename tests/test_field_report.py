"""The field report (conformance/engines): the committed results, their docs page, the findings that
explain every failure, and the engines re-certified where they install.

* Always: the page is generated from the committed JSON; every failed cell is explained by a
  finding naming its engine and case, with its reproduction and output committed; every adapter
  imports without its engine.
* In CI: rotary itself (``rotary_self``), the engines that install in seconds (``pip install
  --no-deps --target``, beside the test environment, never into it: mistral-inference, torchtitan),
  liger-kernel (in the test extras) and rotary-embedding-torch (a peer) are run again from the
  committed code: each row must equal the committed one field for field, messages included.
* ``pytest -m engines`` with ``ROTARY_ENGINE_VENVS`` (a folder of ``<engine>/venv``, made with each
  adapter's ``INSTALL`` recipe): every engine's row again, and every reproduction.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conformance.engines import field
from conformance.engines.cases import CASES
from conformance.engines.field import verdict
from conformance.engines.findings import FINDINGS

ROOT = Path(__file__).resolve().parent.parent
REPORT = json.loads(field.JSON_PATH.read_text())
REPRO = ROOT / "docs" / "field" / "repro"


def test_page_is_generated_from_the_committed_report() -> None:
    assert field.RST_PATH.read_text() == field.render(REPORT), (
        "docs/guides/field_report.rst is stale: python -m conformance.engines --render --update-report"
    )


def test_at_least_ten_engines_certified_with_versions() -> None:
    got = [e for e in REPORT["engines"] if e.get("installed")]
    assert len(got) >= 10, [e["module"] for e in got]
    assert all(e["version"] and e["cases"] and set(e["cases"]) <= set(CASES) for e in got)
    assert [e["module"] for e in REPORT["engines"]] == list(field.ROWS)


def test_no_adapter_errors_in_the_committed_report() -> None:
    # (an adapter error is a bug to fix in the adapter, no verdict on the engine)
    bad = [
        f"{e['module']} / {c}"
        for e in REPORT["engines"]
        if e.get("installed")
        for c, cell in e["cases"].items()
        if verdict(cell) == "adapter error"
    ]
    assert not bad, bad


def test_every_failure_is_explained_by_a_finding() -> None:
    explained = {(f.engine, c) for f in FINDINGS for c in f.cases}
    bad = [
        f"{e['module']} / {c}"
        for e in REPORT["engines"]
        if e.get("installed")
        for c, cell in e["cases"].items()
        if verdict(cell) == "fail" and (e["module"], c) not in explained
    ]
    assert not bad, f"failures no finding explains: {bad}"
    # and every finding that names a case is a failure there (or a design choice that passes)
    for f in FINDINGS:
        e = next(x for x in REPORT["engines"] if x["module"] == f.engine)
        for c in f.cases:
            assert verdict(e["cases"][c]) == "fail" or f.kind == "design choice", (f.title, c)


def test_every_finding_has_its_reproduction_and_output() -> None:
    for f in FINDINGS:
        assert f.engine in field.ENGINES, f.engine
        script = REPRO / f.repro
        assert script.exists() and script.with_suffix(".out").exists(), f.repro
        imports = [
            line.split() for line in script.read_text().splitlines() if line.startswith(("import ", "from "))
        ]
        assert not any(w[1] == "rotary" or w[1].startswith("rotary.") for w in imports), (
            f"{f.repro} needs rotary"
        )
        assert f.kind in ("engine bug", "design choice", "test environment", "rotary bug")


@pytest.mark.parametrize("name", field.ROWS)
def test_adapters_import_without_their_engine(name: str) -> None:
    mod = importlib.import_module(f"conformance.engines.{name}")
    assert mod.NAME and mod.INSTALL and mod.PYTHON and callable(mod.build)
    assert "$ROTARY" in mod.INSTALL  # (recipes name no machine's folders)


# -- engines re-run ---------------------------------------------------------------------------------
#: Engines that install in seconds beside the test environment: their pip arguments.
CHEAP = {
    "mistral_inference": ["mistral-inference==1.6.0"],
    "torchtitan": ["torchtitan==0.3.0", "spmd-types==0.2.3", "tyro", "docstring_parser"],
}


def _worker(name: str, cases: list[str], python: str = sys.executable, path: str = "") -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (path, str(ROOT)) if p)}
    cmd = [python, "-m", "conformance.engines.field", "--worker", name, "--cases", ",".join(cases)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, cwd=ROOT, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads([x for x in res.stdout.splitlines() if x.startswith("{")][-1])


def _differences(got: object, want: object, path: str = "") -> list[str]:
    """Where two JSON values differ (``path: got != want``)."""
    if isinstance(got, dict) and isinstance(want, dict):
        return [
            d
            for k in dict.fromkeys([*want, *got])
            for d in _differences(got.get(k, "<missing>"), want.get(k, "<missing>"), f"{path}/{k}")
        ]
    if isinstance(got, list) and isinstance(want, list) and len(got) == len(want):
        return [
            d
            for i, (a, b) in enumerate(zip(got, want, strict=True))
            for d in _differences(a, b, f"{path}[{i}]")
        ]
    return [] if got == want else [f"{path}: {got!r} != {want!r}"]


def _same_row(name: str, got: dict) -> None:
    """The row the committed code writes is the committed row, field for field."""
    want = next(e for e in REPORT["engines"] if e["module"] == name)
    assert got["installed"], got.get("reason")
    diff = _differences(got, want)
    assert not diff, (
        f"the committed row of {name} is not what the committed code writes "
        f"(python -m conformance.engines --engines {name} --update-report):\n" + "\n".join(diff[:20])
    )


@pytest.fixture(scope="session")
def cheap_engines(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Each cheap engine pip-installed into its own folder (no dependencies: they use the test
    environment's torch); skipped where the package index cannot be reached."""
    root = Path(os.environ.get("ROTARY_ENGINE_CACHE", tmp_path_factory.mktemp("engines")))
    out = {}
    for name, pkgs in CHEAP.items():
        target = root / name
        if not (target / ".done").exists():
            cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), *pkgs]
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
            if res.returncode != 0:
                pytest.skip(f"cannot install {name} here (no package index?): {res.stderr[-300:]}")
            (target / ".done").write_text("")
        out[name] = str(target)
    return out


def test_rotary_itself_gives_the_committed_row() -> None:
    _same_row("rotary_self", _worker("rotary_self", list(CASES)))


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CHEAP))
def test_cheap_engines_give_the_committed_rows(name: str, cheap_engines: dict[str, str]) -> None:
    pytest.importorskip("torch")
    _same_row(name, _worker(name, list(CASES), path=cheap_engines[name]))


@pytest.mark.slow
def test_liger_gives_the_committed_row() -> None:
    pytest.importorskip("liger_kernel")
    pytest.importorskip("transformers")
    _same_row("liger", _worker("liger", list(CASES)))


@pytest.mark.slow
def test_rotary_embedding_torch_gives_the_committed_row() -> None:
    # (a peer of the test environment: its positions built in the data's dtype, issue 50)
    pytest.importorskip("rotary_embedding_torch")
    from importlib.metadata import version

    want = next(e for e in REPORT["engines"] if e["module"] == "rotary_embedding_torch")["version"]
    if version("rotary-embedding-torch") != want:
        pytest.skip(f"rotary-embedding-torch {version('rotary-embedding-torch')} here; the row is {want}'s")
    _same_row("rotary_embedding_torch", _worker("rotary_embedding_torch", list(CASES)))


def test_the_generator_writes_a_scratch_report_unless_asked_to_update(tmp_path: Path) -> None:
    before = (field.JSON_PATH.read_bytes(), field.RST_PATH.read_bytes())
    args = ["--engines", "rotary_self", "--cases", "default,yarn", "--out", str(tmp_path)]
    res = subprocess.run(
        [sys.executable, "-m", "conformance.engines", *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert (field.JSON_PATH.read_bytes(), field.RST_PATH.read_bytes()) == before
    got = json.loads((tmp_path / field.JSON_PATH.name).read_text())
    # one engine and two cases rerun: every other row of the committed report kept, as committed
    assert [e["module"] for e in got["engines"]] == [e["module"] for e in REPORT["engines"]]
    assert got["engines"][1:] == REPORT["engines"][1:] and list(got["cases"]) == list(REPORT["cases"])
    assert got["engines"][0] == REPORT["engines"][0]
    assert (tmp_path / field.RST_PATH.name).read_text() == field.render(got)


# -- every engine and reproduction: pytest -m engines ----------------------------------------------
def _venv(name: str) -> str:
    root = os.environ.get("ROTARY_ENGINE_VENVS")
    py = Path(root or "/nonexistent") / name / "venv" / "bin" / "python"
    if not py.exists():
        mod = importlib.import_module(f"conformance.engines.{name}")
        pytest.skip(f"no venv for {name} under $ROTARY_ENGINE_VENVS; install it with:\n{mod.INSTALL}")
    return str(py)


@pytest.mark.engines
@pytest.mark.parametrize("name", field.ENGINES)
def test_every_engine_gives_the_committed_row(name: str) -> None:
    _same_row(name, _worker(name, list(CASES), python=_venv(name)))


@pytest.mark.engines
@pytest.mark.parametrize("finding", FINDINGS, ids=[f.repro for f in FINDINGS])
def test_every_reproduction_runs(finding: object) -> None:
    """The script, run in its engine's venv, prints exactly its committed ``.out`` on stdout (the
    venvs' folder written ``$ENGINES``).  stderr is not compared: engines log there what depends on
    the machine (CPU features, times, process ids)."""
    py = _venv(finding.engine)  # type: ignore[attr-defined]
    script = REPRO / finding.repro  # type: ignore[attr-defined]
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "TRITON_INTERPRET": "1", "KERAS_BACKEND": "jax"}
    res = subprocess.run(
        [py, str(script)], capture_output=True, text=True, timeout=1800, cwd=script.parent, env=env
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    root = Path(os.environ["ROTARY_ENGINE_VENVS"])
    out = res.stdout.replace(str(root.resolve()), "$ENGINES").replace(str(root), "$ENGINES")
    assert out == script.with_suffix(".out").read_text(), res.stderr[-3000:]
