"""The array libraries installed here, the path ``rotary`` takes on each, and where each is checked.

``rotary`` is written against the array API standard: a library it has no module for runs the
generic array-API code, reading values only where the library's capabilities allow.  The report
lists every library ``array_api_compat`` recognises (and the array-API libraries rotary's suite
knows: cubed, marray), installed or not, with

* the path: ``numpy``/``torch``/``jax``/``dask`` (a module of fast paths and tracing rules) or
  ``generic`` (the array-API code alone);
* where it is checked: the table's backends, the ONNX section (ndonnx: concrete arrays and ONNX
  models in onnxruntime), or, for any other, every public function (:data:`~conformance.calls.CALLS`)
  on its arrays against NumPy.

:func:`check_library` runs that last check on any library, e.g. ``python -m conformance
--library mypackage.array_api``.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import warnings
from typing import Any

import numpy as np

from .calls import CALLS, run_calls, why

__all__ = [
    "LIBRARIES",
    "check_library",
    "format_libraries",
    "format_versions",
    "run_libraries",
    "run_versions",
]

#: (name, module): every library ``array_api_compat`` recognises by name, then the array-API
#: libraries rotary's suite runs that it recognises by their arrays' ``__array_namespace__``.
LIBRARIES: tuple[tuple[str, str], ...] = (
    ("numpy", "numpy"),
    ("torch", "torch"),
    ("jax", "jax.numpy"),
    ("cupy", "cupy"),
    ("dask", "dask.array"),
    ("array_api_strict", "array_api_strict"),
    ("sparse", "sparse"),
    ("ndonnx", "ndonnx"),
    ("cubed", "cubed"),
    ("marray", "marray"),
)

_NOTE = (
    "rotary has no module for this library: the generic array-API path (values are read only where "
    "the library's capabilities say they can be; otherwise what needs them is unchecked, as under "
    "tracing)"
)


def _version(top: str) -> str | None:
    try:
        return importlib.metadata.version(top.replace("_", "-"))
    except importlib.metadata.PackageNotFoundError:
        try:
            return str(getattr(importlib.import_module(top), "__version__", None) or "") or None
        except Exception:
            return None


def _namespace(module: Any) -> Any:
    """The namespace of ``module``'s arrays (marray: its masked namespace over NumPy)."""
    if module.__name__ == "marray":
        return module.masked_namespace(np)
    return module


def check_library(module: str | Any, name: str | None = None) -> dict[str, Any]:
    """Every public function of rotary on arrays of one library against NumPy.

    Parameters
    ----------
    module : str or module
        The library's array-API namespace, or a module whose ``asarray`` makes its arrays (a name
        is imported).
    name : str, optional
        The name shown (default: the module's).

    Returns
    -------
    dict
        ``library``, ``version``, ``recognised`` (``array_api_compat.array_namespace`` accepts its
        arrays), ``path`` (:func:`rotary.testing.backends.library_path`), ``note``, ``passed``
        (``None`` when it could not run here), ``detail`` and ``results`` (one per call).

    Examples
    --------
    >>> from conformance.libraries import check_library
    >>> check_library("numpy")["passed"]
    True
    """
    import array_api_compat

    from rotary.testing.backends import library_path

    mod_name = module if isinstance(module, str) else module.__name__
    entry: dict[str, Any] = {
        "library": name or mod_name,
        "version": _version(mod_name.split(".")[0]),
        "recognised": False,
        "path": None,
        "note": "",
        "passed": None,
        "detail": "",
        "results": [],
    }
    try:
        mod = importlib.import_module(module) if isinstance(module, str) else module
        ns = _namespace(mod)
        sample = ns.asarray(np.asarray([1.0, 2.0], dtype=np.float32))
    except Exception as e:
        entry["detail"] = f"not usable here: {why(e)}"
        return entry
    try:
        xp = array_api_compat.array_namespace(sample)
        entry["recognised"] = True
    except TypeError as e:
        entry["detail"] = f"array_api_compat does not recognise its arrays: {e}"
        entry["passed"] = False
        return entry
    entry["path"] = library_path(xp)
    if entry["path"].startswith("generic"):
        entry["note"] = _NOTE
    res = run_calls(ns.asarray)
    bad = [r for r in res if not r["passed"]]
    entry["results"] = res
    entry["passed"] = not bad
    entry["detail"] = f"{len(res) - len(bad)}/{len(res)} public functions equal NumPy's" + (
        "; failed: " + "; ".join(f"{r['name']}: {r['detail']}" for r in bad) if bad else ""
    )
    return entry


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def run_libraries(
    table: dict[str, list[str]], extra: tuple[str, ...] = (), check: tuple[str, ...] | None = None
) -> list[dict[str, Any]]:
    """One entry per library of :data:`LIBRARIES` (and each module of ``extra``).

    ``table`` maps a library to the report's backends of it (checked there); of the others,
    those of ``check`` (default: all) are checked, ndonnx by :func:`conformance.onnx.run_ndonnx`,
    any other by :func:`check_library`; the rest are listed as not checked.
    """
    from rotary.testing.backends import library_path

    out = []
    for name, module in LIBRARIES:
        if not _installed(module.split(".")[0]):
            out.append(
                {
                    "library": name,
                    "version": None,
                    "installed": False,
                    "passed": None,
                    "detail": "not installed",
                }
            )
            continue
        if name not in table and check is not None and name not in check:
            out.append(
                {
                    "library": name,
                    "version": _version(module.split(".")[0]),
                    "installed": True,
                    "passed": None,
                    "detail": "installed, not checked in this run (--libraries)",
                }
            )
            continue
        if name in table:
            passed: bool | None = True
            detail = "checked in the table: " + ", ".join(table[name])
            try:
                path = library_path(_namespace(importlib.import_module(module)))
            except Exception as e:  # (e.g. CuPy with no GPU, an unsupported standard version)
                path = "? (unsupported standard version)" if "standard" in str(e) else f"? ({why(e)})"
                passed = False if "standard" in str(e) else None
                detail = "in the table, not checked: " + str(e).splitlines()[0][:300]
            out.append(
                {
                    "library": name,
                    "version": _version(module.split(".")[0]),
                    "installed": True,
                    "recognised": True,
                    "path": path,
                    "note": _NOTE if path.startswith("generic") else "",
                    "passed": passed,
                    "detail": detail,
                    "in_table": True,
                }
            )
            continue
        if name == "ndonnx":
            from .onnx import run_ndonnx

            entry = check_library(module, name)
            res = run_ndonnx()
            bad = [r for r in res if r["passed"] is False]
            modes = sorted({r["mode"] for r in res})
            entry.update(
                results=res,
                passed=None if all(r["passed"] is None for r in res) else not bad,
                detail=f"{len(res) - len(bad)}/{len(res)} (public function, mode) pairs equal NumPy's, modes "
                + ", ".join(modes)
                + " (symbolic: an ONNX model run in onnxruntime at several batch sizes and sequence lengths)"
                + (
                    "; failed: " + "; ".join(f"{r['name']} ({r['mode']}): {r['detail']}" for r in bad)
                    if bad
                    else ""
                ),
            )
        else:
            entry = check_library(module, name)
        out.append({**entry, "installed": True, "in_table": False})
    for module in extra:
        out.append({**check_library(module), "installed": True, "in_table": False, "extra": True})
    return out


def format_libraries(libs: list[dict[str, Any]]) -> list[str]:
    """The report's lines for the libraries (each note once, marked ``*``)."""
    lines = [f"array libraries ({len(CALLS)} public functions each where not in the table):"]
    notes: list[str] = []
    for e in libs:
        st = {True: "ok  ", False: "FAIL", None: "n/a "}[e["passed"]]
        ver = f" {e['version']}" if e.get("version") else ""
        mark = ""
        if e.get("note"):
            if e["note"] not in notes:
                notes.append(e["note"])
            mark = "*" * (notes.index(e["note"]) + 1)
        path = f" [path: {e['path']}{mark}]" if e.get("path") else ""
        lines.append(f"  {st} {e['library']}{ver}{path}: {e['detail']}")
    lines += [f"  {'*' * (i + 1)} {n}" for i, n in enumerate(notes)]
    return lines


def run_versions() -> list[dict[str, Any]]:
    """Every public function of :data:`~conformance.calls.CALLS` on array-api-strict at every
    version of the standard it offers, with its restrictive flags (no boolean indexing, no
    data-dependent shapes, no extensions): from rotary's oldest version on, each equals NumPy;
    before it, each is refused with the one error naming the version ("unsupported standard
    version"), never a crash.  Empty without array-api-strict."""
    if not _installed("array_api_strict"):
        return []
    import array_api_strict as strict

    from rotary._lib._compat import OLDEST_STANDARD, check_standard

    out = []
    for version in strict._flags.supported_versions:
        flags = dict(boolean_indexing=False, data_dependent_shapes=False, enabled_extensions=())
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (2021.12 is served as 2022.12: array-api-strict warns)
            with strict.ArrayAPIStrictFlags(api_version=version, **flags):
                if version < OLDEST_STANDARD:
                    res = run_calls(strict.asarray, mode=version)
                    clear = all("needs 2023.12 or later" in r["detail"] for r in res)
                    try:
                        check_standard(strict)
                        said = ""
                    except TypeError as e:
                        said = str(e)
                    out.append(
                        {
                            "version": version,
                            "passed": clear and bool(said),
                            "detail": f"unsupported standard version: every call refused ({said})"
                            if clear
                            else "crashed instead of refusing: "
                            + "; ".join(r["detail"] for r in res if "needs 2023.12" not in r["detail"]),
                        }
                    )
                    continue
                res = run_calls(strict.asarray, mode=version)
        bad = [r for r in res if not r["passed"]]
        out.append(
            {
                "version": version,
                "passed": not bad,
                "detail": f"{len(res) - len(bad)}/{len(res)} public functions equal NumPy's"
                + ("; failed: " + "; ".join(f"{r['name']}: {r['detail']}" for r in bad) if bad else ""),
            }
        )
    return out


def format_versions(entries: list[dict[str, Any]]) -> list[str]:
    """The report's lines for the standard versions."""
    if not entries:
        return []
    lines = ["array API standard versions (array-api-strict, restrictive flags):"]
    for e in entries:
        st = {True: "ok  ", False: "FAIL"}[e["passed"]]
        lines.append(f"  {st} {e['version']}: {e['detail']}")
    return lines
