"""``mypy -p rotary`` passes with rotary's core dependencies alone (numpy, array-api-compat): no
``import-not-found`` for an optional library.

Structurally: every module outside the standard library that rotary imports by an ``import``
statement (anywhere, function bodies included: mypy reads them all) is a core dependency of
``pyproject.toml`` or one of ``[tool.mypy]``'s ``ignore_missing_imports`` overrides; anything else
optional is imported by name (``importlib.import_module``), out of mypy's sight.  (Proven once by
running ``mypy -p rotary`` in a venv of ``mypy numpy array-api-compat`` only: that run is minutes
of installs, this test milliseconds.)
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _static_imports() -> dict[str, set[str]]:
    """Top-level module -> the files of rotary that import it with a statement."""
    out: dict[str, set[str]] = {}
    for f in sorted((ROOT / "rotary").rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                out.setdefault(name.split(".")[0], set()).add(str(f.relative_to(ROOT)))
    return out


def test_rotary_imports_only_core_dependencies_or_what_mypy_may_miss() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())
    core = {re.split(r"[<>=!~ \[;]", d)[0].replace("-", "_") for d in cfg["project"]["dependencies"]}
    may_miss = {
        m.removesuffix(".*")
        for o in cfg["tool"]["mypy"].get("overrides", [])
        if o.get("ignore_missing_imports")
        for m in o["module"]
    }
    known = set(sys.stdlib_module_names) | {"rotary", "__future__"} | core | may_miss
    bad = {m: sorted(files) for m, files in _static_imports().items() if m not in known}
    assert not bad, (
        f"rotary imports {sorted(bad)} by statement, neither a core dependency ({sorted(core)}) nor "
        f"in [tool.mypy]'s ignore_missing_imports overrides: mypy reports import-not-found where it is "
        f"not installed; import it by name (importlib.import_module) or add it to the overrides: {bad}"
    )
    assert {"numpy", "array_api_compat"} <= core
