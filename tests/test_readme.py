"""The README's Python snippets run as written (each skipped when its library is absent)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


@pytest.mark.parametrize("code", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_readme_snippet_runs(code):
    for lib in ("torch", "jax"):
        if re.search(rf"^import .*\b{lib}\b", code, re.M):
            pytest.importorskip(lib)
    exec(compile(code, str(README), "exec"), {})
