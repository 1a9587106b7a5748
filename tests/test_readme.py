"""The README: its Python snippets run as written (each skipped when a library it imports is
absent), are ``ruff format`` clean, and it stays the short page a newcomer reads."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
from snippets import README, ROOT, markdown_blocks, optional_imports

BLOCKS = markdown_blocks()
TEXT = README.read_text()


@pytest.mark.parametrize("code", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_readme_snippet_runs(code, tmp_path, monkeypatch):
    for lib in optional_imports(code):
        pytest.importorskip(lib)
    monkeypatch.chdir(tmp_path)  # a snippet writes nothing into the checkout
    exec(compile(code, str(README), "exec"), {"__name__": "__readme__"})


def test_readme_snippets_are_ruff_clean(tmp_path):
    ruff = shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff not installed")
    for i, code in enumerate(BLOCKS):
        (tmp_path / f"block{i}.py").write_text(code)
    config = ["--config", str(ROOT / "pyproject.toml")]
    for cmd in (["format", "--check", "--diff"], ["check"]):
        res = subprocess.run([ruff, *cmd, *config, str(tmp_path)], capture_output=True, text=True)
        assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]


def test_setup_commands_are_the_ci_ones():
    conformance = 'python3 -m pip install -c .ci/constraints.txt -e ".[all,peers]" && python3 -m conformance'
    tests = (
        'python3 -m pip install -c .ci/constraints.txt -e ".[all,test,peers]" && python3 -m pytest -n auto'
    )
    assert f"```bash\n{conformance}\n```" in TEXT
    assert f"```bash\n{tests}\n```" in TEXT
    assert tests in (ROOT / ".ci" / "run").read_text()


def test_readme_is_short_and_says_nothing_untrue():
    assert len(TEXT) < 12_000, len(TEXT)  # five minutes of reading; the rest is in docs/
    assert not re.search(r"pip install rotary\b", TEXT)  # no release on a package index yet
    for jargon in ("main job", "item 6", "benchmark plan", "rope-math", "was lent", "peers.md"):
        assert jargon not in TEXT.lower(), jargon
    assert 'feature_map="elu+1"' not in TEXT


def test_readme_links_resolve():
    for target in re.findall(r"\]\(([^)#]+)\)", TEXT):
        if "://" not in target:
            assert (ROOT / target).exists(), target
