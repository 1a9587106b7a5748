"""pyright is clean on the package and on every README and docs snippet read as user code.

Uses the ``[tool.pyright]`` settings of ``pyproject.toml`` (basic mode; an absent optional array
library is a warning, not an error). pyright is a Node.js program installed with pip
(``pyright[nodejs]`` in the ``test`` extra brings Node.js itself); the test is skipped where it is
not installed. mypy (strict, package only) runs in ``test_structure.py``.
"""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
from snippets import ROOT, all_snippets


@pytest.mark.slow
def test_pyright_clean_on_package_and_snippets(tmp_path):
    pyright = shutil.which("pyright")
    if pyright is None:
        pytest.skip("pyright not installed (pip install '.[test]')")
    files = []
    for sid, code in all_snippets():
        path = tmp_path / (sid.replace("/", "_").replace(".", "_").replace(":", "_") + ".py")
        path.write_text(code)
        files.append(str(path))
    # run from the checkout: its pyproject.toml configures pyright and its rotary is the one imported
    res = subprocess.run(
        [pyright, "--outputjson", "rotary", *files], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    try:
        report = json.loads(res.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"pyright did not run: {res.stdout[-2000:]} {res.stderr[-2000:]}")
    errors = [d for d in report["generalDiagnostics"] if d["severity"] == "error"]
    lines = [f"{d['file']}:{d['range']['start']['line'] + 1}: {d['message']}" for d in errors]
    assert not errors, "\n".join(lines[:40])
    assert report["summary"]["filesAnalyzed"] >= len(files) + 30
