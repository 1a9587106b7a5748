"""Sphinx configuration: ``sphinx-build -W -b html docs docs/_build/html`` (``pip install ".[docs]"``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from docutils import nodes
from docutils.parsers.rst import Directive, directives
from docutils.statemachine import StringList

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # document this checkout's rotary

import rotary  # noqa: E402

project = "rotary"
author = "The rotary developers"
copyright = "2026, The rotary developers"
release = version = rotary.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.mathjax",
    "sphinx.ext.viewcode",
    "numpydoc",
]
exclude_patterns = ["_build"]
nitpicky = False
autosummary_generate = False  # the API pages list their objects explicitly: nothing is generated
autodoc_default_options = {"members": True, "undoc-members": False, "show-inheritance": False}
autodoc_typehints = "none"  # the numpydoc sections describe the parameters
autodoc_member_order = "bysource"
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False
default_role = "literal"  # `x` reads as code, as in the README

html_theme = "pydata_sphinx_theme"
html_title = f"rotary {release}"
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "secondary_sidebar_items": ["page-toc"],
}
html_static_path: list[str] = []


class BenchmarkTable(Directive):
    """``.. benchmark-table:: path/to/results.json``: the rows of ``python3 -m benchmarks --json``
    as a table, so the figures in the docs are those of the file, not a copy."""

    required_arguments = 1
    option_spec = {"section": directives.unchanged}  # noqa: RUF012 (docutils' own attribute)

    def run(self) -> list[nodes.Node]:
        path = (Path(self.state.document.current_source).parent / self.arguments[0]).resolve()
        self.state.document.settings.record_dependencies.add(str(path))
        data = json.loads(path.read_text())
        lines = [
            ".. list-table::",
            "   :header-rows: 1",
            "",
            "   * - section",
            "     - backend",
            "     - case",
            "     - ms",
            "     - ratio",
            "     - vs",
            "     - target",
            "     - x floor",
            "     - floor target",
        ]
        section = self.options.get("section")
        for r in data["rows"]:
            if "ms" not in r:  # a section that did not run
                continue
            if section is not None and r["section"] != section:
                continue
            verdict = {True: " met", False: " **missed**", None: ""}[r.get("ok")]
            target = "" if r.get("target") is None else f"{r.get('cmp', '<=')} {r['target']:g}"
            floor_target = "" if r.get("floor_target") is None else f"<= {r['floor_target']:g}"
            if floor_target:
                floor_target += verdict
            elif target:
                target += verdict
            cells = [
                r["section"],
                r["backend"],
                r["case"],
                "" if r["ms"] is None else f"{r['ms']:.3f}",
                "" if r["ratio"] is None else f"{r['ratio']:.2f}",
                r.get("baseline") or "",
                target,
                "" if r.get("floor_ratio") is None else f"{r['floor_ratio']:.2f}",
                floor_target,
            ]
            lines.append(f"   * - {cells[0]}")
            lines += [f"     - {c}" if c else "     -" for c in cells[1:]]
        container = nodes.container()
        self.state.nested_parse(StringList(lines, source=str(path)), self.content_offset, container)
        return container.children


def setup(app):
    app.add_directive("benchmark-table", BenchmarkTable)
    return {"parallel_read_safe": True}
