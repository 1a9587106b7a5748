"""The docstring examples of every ``rotary`` module run (doctest, on NumPy)."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import rotary

FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def _module_names() -> list[str]:
    names = ["rotary"]
    for info in pkgutil.walk_packages(rotary.__path__, prefix="rotary."):
        names.append(info.name)
    return sorted(names)


MODULES = _module_names()


def test_modules_found():
    # The walk sees the core modules (guards against a silently empty parametrization).
    assert {"rotary", "rotary._rope", "rotary._math._angles", "rotary.scaling", "rotary.testing"} <= set(
        MODULES
    )


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    try:
        module = importlib.import_module(name)
    except ImportError as exc:  # a module needing an optional framework that is absent
        pytest.skip(f"{name} not importable: {exc}")
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    tests = finder.find(module, name)
    for t in sorted(tests, key=lambda t: t.name):
        runner.run(t)
    res = runner.summarize(verbose=False)
    assert res.failed == 0, f"{res.failed} of {res.attempted} docstring examples failed in {name}"
