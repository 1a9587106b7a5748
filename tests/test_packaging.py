"""What an installed user gets: the wheel's contents, and the conformance kit run from it.

Builds the wheel from this checkout (``pip wheel --no-build-isolation``: the environment's
setuptools, no download), installs it with ``--no-deps`` into a fresh virtual environment that
sees the running interpreter's packages (NumPy and the array libraries, through a ``.pth``),
and runs ``python -m conformance`` there from an empty folder: it must test the installed
``rotary`` (not this checkout) and check the golden vectors shipped in the wheel.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import site
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

import rotary

ROOT = Path(__file__).resolve().parents[1]


def test_metadata_in_one_place():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    project = pyproject["project"]
    assert project["license"] == "MIT" and "LICENSE" in project["license-files"]
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")
    assert project["dynamic"] == ["version"] and "version" not in project
    assert pyproject["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "rotary.__version__"}
    assert any(c.startswith("Typing :: Typed") for c in project["classifiers"])
    assert not any(c.startswith("License ::") for c in project["classifiers"])  # SPDX expression instead


def _setuptools_ok() -> bool:
    try:
        major = int(importlib.metadata.version("setuptools").split(".")[0])
    except importlib.metadata.PackageNotFoundError:
        return False
    return major >= 77


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    if not _setuptools_ok():
        pytest.skip("building the wheel offline needs setuptools >= 77 installed")
    out = tmp_path_factory.mktemp("wheel")
    # from a copy: setuptools writes build/ and *.egg-info into the source tree, and two test
    # processes building at once would trip over each other's files
    src = tmp_path_factory.mktemp("src") / "rotary"
    junk = shutil.ignore_patterns(
        ".git", ".venv*", "build", "dist", "*.egg-info", "_build", "__pycache__", ".*cache"
    )
    shutil.copytree(ROOT, src, ignore=junk)
    cmd = [sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation", "-q", "-w"]
    res = subprocess.run([*cmd, str(out)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    (whl,) = out.glob("rotary-*.whl")
    return whl


def test_wheel_ships_the_kit_and_the_types(wheel):
    assert wheel.name.startswith(f"rotary-{rotary.__version__}-")
    names = set(zipfile.ZipFile(wheel).namelist())
    index = json.loads((ROOT / "conformance" / "vectors" / "index.json").read_text())
    expected = {"rotary/py.typed", "conformance/__main__.py", "conformance/against.py"}
    expected |= {"conformance/vectors/index.json", "conformance/vectors/README.md"}
    expected |= {f"conformance/vectors/{c['file']}" for c in index["cases"]}
    assert expected <= names, sorted(expected - names)
    meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
    text = zipfile.ZipFile(wheel).read(meta).decode()
    assert "License-Expression: MIT" in text and f"Version: {rotary.__version__}" in text
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)


def _site_dirs() -> list[str]:
    """The site-packages of the interpreter running the tests (a virtual environment's when the
    suite runs in one: its base interpreter may lack the dependencies)."""
    dirs = [*site.getsitepackages(), site.getusersitepackages()]
    return [d for d in dict.fromkeys(dirs) if Path(d).is_dir()]


@pytest.mark.slow
def test_conformance_runs_from_the_installed_wheel(wheel, tmp_path):
    # Regression: the environment was made with system_site_packages=True, which sees the
    # *base* interpreter's packages; in a virtual environment those lack array_api_compat.
    env_dir = tmp_path / "venv"
    venv.create(env_dir, system_site_packages=False, with_pip=False)
    py = env_dir / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    inner = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # the dependencies: this interpreter's site directories, after the environment's own (a
    # plain path entry: their .pth files, such as this checkout's editable install, are not run)
    (Path(inner) / "outer-site.pth").write_text("\n".join(_site_dirs()) + "\n")
    install = [sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "--no-index", "-q"]
    res = subprocess.run([*install, str(wheel)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]

    empty = tmp_path / "empty"
    empty.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "ROTARY_BACKENDS")}
    # (one library outside the table, cheap: the wheel ships conformance's library checks too)
    run = [str(py), "-m", "conformance", "--backends", "numpy", "--libraries", "marray", "--out", "report"]
    res = subprocess.run(run, cwd=empty, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-3000:]
    assert "PASSED" in res.stdout
    assert "ok   golden vectors == fresh float64 computation: 9 cases" in res.stdout
    rep = json.loads((empty / "report" / "report.json").read_text())
    tested = Path(rep["environment"]["rotary_path"])
    assert env_dir.resolve() in tested.resolve().parents, tested  # the installed rotary, not this checkout
    golden = [c for c in rep["cells"] if c["column"] == "golden"]
    assert golden and all(c["status"] == "pass" for c in golden)
