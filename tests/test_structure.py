"""The package's structure holds: layers (import-linter), types (mypy), one home for library names.

* import-linter's contracts in ``pyproject.toml``: nothing imports upward, including imports
  inside functions, and only the backend layer imports an array library;
* no module outside :mod:`rotary._backends`, :mod:`rotary._lib._compat`, :mod:`rotary.testing`,
  :mod:`rotary.distributed` and :mod:`rotary.modules` (the framework modules) names an array
  library in its code (imports, module-name comparisons, sets of library names) — docstrings
  and comments may;
* mypy is clean over the package, with fewer than 10 ``type: ignore``.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "rotary"
LIBRARIES = ("torch", "jax", "jaxlib", "dask", "cupy", "array_api_strict", "numpy")
ALLOWED = ("_backends", "_lib/_compat.py", "testing", "distributed.py", "modules")


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} not installed (pip install -e '.[test]')")
    return path


def test_import_layers_hold():
    res = subprocess.run([_tool("lint-imports")], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    assert "BROKEN" not in res.stdout and "2 kept, 0 broken" in res.stdout


def _library_names(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, what) for every place the code names an array library (not in docstrings)."""
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                docstrings.add(id(body[0].value))
    hits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            hits += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] in LIBRARIES[:-1]]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] in LIBRARIES[:-1]:
                hits.append((node.lineno, node.module))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            word = node.value.split(".")[0]
            if word in LIBRARIES:
                hits.append((node.lineno, repr(node.value)))
    return hits


def test_only_the_backend_layer_names_array_libraries():
    offenders = []
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG).as_posix()
        if rel.startswith(ALLOWED):
            continue
        for line, what in _library_names(ast.parse(path.read_text())):
            offenders.append(f"rotary/{rel}:{line}: {what}")
    assert not offenders, "array libraries named outside the backend layer:\n" + "\n".join(offenders)


def test_nothing_under_rotary_imports_from_conformance():
    # Issue 43: rotary/testing/model.py imported conformance.engines.cases (by importlib, which
    # import-linter does not see): the one import from a lower floor to a higher one.  The case
    # matrix's home is now rotary.testing.cases.  Imports and importlib strings alike.
    offenders = []
    for path in sorted(PKG.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "import_module":
                names = [
                    a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)
                ]
            where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}"
            offenders += [f"{where}: {n}" for n in names if n.split(".")[0] == "conformance"]
    assert not offenders, offenders


def test_mypy_clean_with_few_ignores():
    ignores = sum(p.read_text().count("type: ignore") for p in PKG.rglob("*.py"))
    assert ignores < 10, f"{ignores} 'type: ignore' in the package"
    _tool("mypy")
    res = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
