"""The documentation site (``docs/``): Sphinx builds it with no warning, and every Python
snippet on its pages runs (each skipped when a library it imports is absent)."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
from snippets import DOCS, ROOT, all_snippets, doc_pages, optional_imports

SNIPPETS = [(sid, code) for sid, code in all_snippets() if sid.startswith("docs/")]


def test_every_guide_is_in_the_site():
    pages = {p.relative_to(DOCS).with_suffix("").as_posix() for p in doc_pages()}
    expected = {
        "index",
        "install",
        "examples",
        "api/index",
        *(
            f"guides/{g}"
            for g in (
                "quickstart",
                "porting",
                "numerics",
                "scaling",
                "multiaxis",
                "linear_attention",
                "distributed",
                "conformance",
                "performance",
            )
        ),
    }
    assert expected <= pages, sorted(expected - pages)
    assert len(SNIPPETS) >= 20


@pytest.mark.parametrize("code", [c for _, c in SNIPPETS], ids=[s for s, _ in SNIPPETS])
def test_docs_snippet_runs(code, tmp_path, monkeypatch):
    for lib in optional_imports(code):
        pytest.importorskip(lib)
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "<docs snippet>", "exec"), {"__name__": "__docs__"})


@pytest.mark.slow
def test_sphinx_builds_without_warnings(tmp_path):
    for mod in ("sphinx", "numpydoc", "pydata_sphinx_theme"):
        pytest.importorskip(mod, reason=f"{mod} not installed (pip install '.[docs]')")
    cmd = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", str(DOCS)]
    res = subprocess.run([*cmd, str(tmp_path / "html")], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    assert (tmp_path / "html" / "guides" / "performance.html").exists()


def test_docs_snippets_are_ruff_clean(tmp_path):
    ruff = shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff not installed")
    for i, (_, code) in enumerate(SNIPPETS):
        (tmp_path / f"snippet{i}.py").write_text(code)
    config = ["--config", str(ROOT / "pyproject.toml")]
    for cmd in (["format", "--check", "--diff"], ["check"]):
        res = subprocess.run([ruff, *cmd, *config, str(tmp_path)], capture_output=True, text=True)
        assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
