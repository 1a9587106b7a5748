"""The Python snippets of the README and of the documentation pages, for the tests that run
and type-check them (``test_readme.py``, ``test_docs_site.py``, ``test_typing.py``)."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"

#: Optional libraries a snippet may import: the snippet is skipped where one is missing.
OPTIONAL = (
    "torch",
    "jax",
    "dask",
    "distributed",
    "transformers",
    "array_api_strict",
    "cupy",
    "matplotlib",
    "ndonnx",
    "onnx",
    "onnxruntime",
    "cubed",
    "marray",
)


def markdown_blocks(path: Path = README) -> list[str]:
    """The ```python fenced blocks of a Markdown file."""
    return re.findall(r"```python\n(.*?)```", path.read_text(), re.S)


def rst_blocks(path: Path) -> list[str]:
    """The ``.. code-block:: python`` blocks of a reStructuredText file, dedented."""
    lines = path.read_text().splitlines()
    blocks, i = [], 0
    while i < len(lines):
        if lines[i].strip() == ".. code-block:: python":
            i += 1
            body = []
            while i < len(lines) and (not lines[i].strip() or lines[i].startswith((" ", "\t"))):
                body.append(lines[i])
                i += 1
            blocks.append(textwrap.dedent("\n".join(body)).strip("\n") + "\n")
        else:
            i += 1
    return blocks


def doc_pages() -> list[Path]:
    return sorted(p for p in DOCS.rglob("*.rst") if "_build" not in p.parts)


def all_snippets() -> list[tuple[str, str]]:
    """``(id, code)`` for every snippet of the README and the docs, ids like ``README.md:3``."""
    out = [(f"README.md:{i}", code) for i, code in enumerate(markdown_blocks())]
    for page in doc_pages():
        rel = page.relative_to(DOCS).as_posix()
        out += [(f"docs/{rel}:{i}", code) for i, code in enumerate(rst_blocks(page))]
    return out


def optional_imports(code: str) -> list[str]:
    """The optional libraries a snippet imports."""
    names = re.findall(r"^\s*(?:import|from)\s+([A-Za-z_][\w]*)", code, re.M)
    names += re.findall(r"^\s*import .*?,\s*([A-Za-z_]\w*)", code, re.M)
    return sorted({n for n in names if n in OPTIONAL})
