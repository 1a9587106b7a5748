"""Configs and adapters: a config by path, JSON, case or model type; an adapter by module, file,
object or build function."""

from __future__ import annotations

import importlib
import json
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

from ..._hfconfig import _as_dict


def load_config(config: Any) -> tuple[dict[str, Any], str]:
    """``config`` as a dict and a name: a dict, a ``config.json`` path (or its folder), JSON text,
    a case of the field report's matrix (:mod:`rotary.testing.cases`), or a ``model_type`` of the
    census (its ``transformers`` config class's defaults; needs ``transformers``)."""
    if isinstance(config, Mapping):
        d = dict(config)
        return d, str(d.get("model_type", "config"))
    if not isinstance(config, str):
        d = _as_dict(config)
        return d, str(d.get("model_type", type(config).__name__))
    text = config.strip()
    if text.startswith("{"):
        d = json.loads(text)
        return d, str(d.get("model_type", "config"))
    import os

    if os.path.exists(text):
        d = _as_dict(text)
        return d, os.path.basename(os.path.normpath(text))
    from ..cases import CASES

    if text in CASES:
        return dict(CASES[text].config), text
    # (optional, imported by name: rotary type-checks with its core dependencies alone)
    try:
        CONFIG_MAPPING = importlib.import_module("transformers").CONFIG_MAPPING
    except ImportError:
        raise ValueError(
            f"config {config!r} is not a path, JSON or a case of the field report; a model type needs "
            "transformers (pip install transformers)"
        ) from None
    if text not in CONFIG_MAPPING:
        raise ValueError(f"config {config!r}: no such file, case or transformers model type") from None
    cfg = CONFIG_MAPPING[text]()
    return cfg.to_dict(), text


def _case_checks(config: Any) -> tuple[str, ...] | None:
    """The checks of a case of the field report named by ``config`` (``None``: the default)."""
    if not isinstance(config, str):
        return None
    from ..cases import CASES

    case = CASES.get(config.strip())
    return None if case is None else case.checks


class _FunctionAdapter:
    """A bare ``build(config, *, layer_type, dtype)`` function as an adapter."""

    INSTALL = ""

    def __init__(self, build: Callable[..., Any], name: str) -> None:
        self._build, self.NAME = build, name

    def version(self) -> str:
        # (the function's own package where it is one; a function defined in a script, a
        # notebook or exec'd code has none to import: its version is unknown, not "not installed")
        top = str(getattr(self._build, "__module__", None) or "").partition(".")[0]
        mod = sys.modules.get(top)
        if mod is None:
            try:
                mod = importlib.import_module(top)
            except ImportError:
                return "unknown"
        return str(getattr(mod, "__version__", "unknown"))

    def build(self, config: Mapping[str, Any], *, layer_type: str | None, dtype: str) -> Any:
        return self._build(config, layer_type=layer_type, dtype=dtype)


def import_target(spec: str) -> tuple[Any, str]:
    """``(module, attribute)`` named by ``"module[:attribute]"`` or ``"path/to/file.py[:attribute]"``:
    a file is imported as a module named after it, its folder put first on ``sys.path`` (so it
    imports as a script run from there would, its neighbours too: no ``PYTHONPATH`` needed)."""
    head, sep, attr = spec.rpartition(":") if ".py:" in spec else spec.partition(":")
    if not sep:
        head, attr = spec, ""
    if head.endswith(".py") or "/" in head or os.sep in head:
        path = os.path.abspath(os.path.expanduser(head))
        if not os.path.isfile(path):
            raise ImportError(f"no such file: {head}")
        folder = os.path.dirname(path)
        if folder not in sys.path:
            sys.path.insert(0, folder)
        head = os.path.splitext(os.path.basename(path))[0]
    return importlib.import_module(head), attr


def make_adapter(target: Any) -> Any:
    """An adapter from a module or object with ``build`` (and ``NAME``, ``version``), a
    ``"module"`` / ``"module:attribute"`` string naming one (or a ``"path/to/adapter.py"`` file,
    :func:`import_target`), or a bare ``build`` function."""
    if isinstance(target, str):
        obj, attr = import_target(target)
        for part in filter(None, attr.split(".")):
            obj = getattr(obj, part)
        target = obj
    if hasattr(target, "build"):
        return target
    if callable(target):
        return _FunctionAdapter(target, getattr(target, "__qualname__", "engine"))
    raise TypeError(f"an adapter has a build(config, *, layer_type, dtype) method; got {target!r}")
