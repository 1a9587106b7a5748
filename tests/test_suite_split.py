"""The split of the suite (``tests/conftest.py``): every entry of the slow matrix names a test that
exists, and ``.ci/run`` runs the README's command, then the matrix."""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import MATRIX, MATRIX_REASONS

ROOT = Path(__file__).resolve().parents[1]


def _tests_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")}


def test_every_matrix_entry_is_a_test_and_has_a_reason():
    missing = []
    for entry in MATRIX:
        path, _, name = entry.partition("::")
        file = ROOT / path
        if not file.is_file() or not path.startswith(("tests/test_", "conformance/test_")):
            missing.append(f"{entry}: no such test file")
        elif name and name not in _tests_of(file):
            missing.append(f"{entry}: no such test in {path}")
    assert not missing, "\n".join(missing)
    assert all(why for why in MATRIX_REASONS)
    assert sum(len(tests) for tests in MATRIX_REASONS.values()) == len(MATRIX)  # each entry once


def test_ci_runs_the_readme_command_then_the_matrix():
    readme = (
        'python3 -m pip install -c .ci/constraints.txt -e ".[all,test,peers]" && python3 -m pytest -n auto'
    )
    lines = (ROOT / ".ci" / "run").read_text().splitlines()
    first = next(i for i, ln in enumerate(lines) if ln.startswith(f"{readme} ") or ln == readme)
    assert any(ln.startswith("python3 -m pytest -n auto -m matrix") for ln in lines[first + 1 :])
