"""``python -m conformance --against module:function``: the kit run on another project's RoPE.

The function is called as ``fn(x, pos)``, the convention of :func:`rotary.testing.check_rope`:
``x`` of shape ``(batch, heads, seq, head_dim)`` and ``pos`` of shape ``(seq,)``, arrays of
the chosen backend, and must return ``x`` rotated at ``pos`` in the layout and base it claims
(``--layout``, ``--base``).  Two sets of checks run, for each backend and dtype asked for:

* :func:`rotary.testing.check_rope`: every property RoPE must have, each against the
  independent float64 oracle, with a diagnosis when one fails (wrong layout, sign or base);
* the golden vectors of :mod:`conformance.vectors` whose layout, base and head dimension
  are the function's (full rotary, no scaling): each stored input rotated at its stored
  positions (``x`` reshaped to ``(1, 1, n, head_dim)``) and compared with the stored float64
  output.

Tolerances are those of ``check_rope``: ``ulps * eps(dtype)`` (16 for the golden vectors)
plus ``2 * angle_eps * |pos|`` for angles formed in a type of relative precision
``angle_eps`` (default ``2**-23``: float32 angles, as Hugging Face forms them; ``0``
demands exact angles, as ``rotary`` guarantees).
"""

from __future__ import annotations

import math
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np

from rotary.testing import Backend, check_rope, eps, to_numpy
from rotary.testing.model import import_target

from . import vectors

__all__ = ["GOLDEN_ULPS", "golden_cases", "load_target", "run_against", "run_golden"]

#: Tolerance of the golden vectors in ulps of the dtype (before the angle allowance).
GOLDEN_ULPS = 16.0


def load_target(spec: str) -> Callable[[Any, Any], Any]:
    """The callable named by ``"package.module:function"`` (or ``module:Class.attribute``, or
    ``path/to/file.py:function``: :func:`rotary.testing.model.import_target`)."""
    mod_name, sep, attr = spec.rpartition(":") if ".py:" in spec else spec.partition(":")
    if not sep or not mod_name or not attr:
        raise ValueError(f"--against takes MODULE:FUNCTION (e.g. mypackage.rope:rotate), got {spec!r}")
    try:
        obj, _ = import_target(spec)
    except ImportError as e:
        raise ValueError(f"cannot import {mod_name!r} for --against: {e}") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            owner = getattr(obj, "__name__", type(obj).__name__)
            raise ValueError(f"{spec}: {owner} has no attribute {part!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"{spec} is a {type(obj).__name__}, not a function fn(x, pos)")
    return obj


def golden_cases(layout: str, base: float, head_dim: int) -> list[str]:
    """Names of the stored cases a function of this layout, base and head dimension can run."""
    return [
        e["name"]
        for e in vectors.index()["cases"]
        if e["layout"] == layout
        and float(e["base"]) == float(base)
        and e["head_dim"] == head_dim
        and e["rotary_dim"] == e["head_dim"]
        and e["scaling"] is None
    ]


def run_golden(
    fn: Callable[[Any, Any], Any], b: Backend, dtype: str, names: list[str], angle_eps: float
) -> list[dict[str, Any]]:
    """One result per golden case: worst error against its tolerance, both in ulps of ``dtype``."""
    e = eps(dtype)
    out = []
    for case in vectors.load():
        if case["name"] not in names:
            continue
        n, d = case["x"].shape
        frac = case["pos"].dtype.kind == "f"
        pos = b.asarray(case["pos"], ("float64" if b.float64 else "float32") if frac else b.int_dtype())
        res: dict[str, Any] = {"name": case["name"], "n": n, "head_dim": d, "fractional": frac}
        try:
            got = fn(b.asarray(case["x"].reshape(1, 1, n, d), dtype), pos)
            got = np.asarray(to_numpy(got), dtype=np.float64)
            if got.shape != (1, 1, n, d):
                raise ValueError(f"returned shape {got.shape} for input shape {(1, 1, n, d)}")
            ref = case["out"]
            err = np.abs(got.reshape(n, d) - ref) / (e * np.maximum(1.0, np.abs(ref)))
            err = np.where(np.isfinite(err), err, np.inf)
            tol = GOLDEN_ULPS + 2.0 * angle_eps * np.abs(case["pos"].astype(np.float64))[:, None] / e
            tol = np.broadcast_to(tol, err.shape)
            k = int(np.argmax(err / tol))
            res.update(ulps=float(err.reshape(-1)[k]), tol_ulps=float(tol.reshape(-1)[k]))
            res["passed"] = bool(np.all(err <= tol))
            bad = np.nonzero(np.any(err > tol, axis=1))[0]
            res["message"] = (
                ""
                if res["passed"]
                else f"{bad.size} of {n} positions off, first at pos {case['pos'][bad[0]]}"
                + (" (fractional positions; leave this case out with --cases)" if frac else "")
            )
        except Exception as exc:  # the function under test raised: a failure, reported
            tb = traceback.extract_tb(exc.__traceback__)[-1]
            res.update(ulps=math.inf, tol_ulps=GOLDEN_ULPS, passed=False)
            where = f"{tb.filename.rsplit('/', 1)[-1]}:{tb.lineno}"
            res["message"] = f"raised {type(exc).__name__}: {exc} ({where})"
        out.append(res)
    return out


def run_against(
    spec: str,
    bks: list[Backend],
    *,
    dtypes: list[str] | None = None,
    layout: str = "half",
    base: float = 10000.0,
    head_dim: int = 64,
    angle_eps: float | None = None,
    ulps: float = 8.0,
    cases: list[str] | None = None,
) -> dict[str, Any]:
    """Run ``check_rope`` and the golden vectors on the function ``spec`` names; the report dict."""
    fn = load_target(spec)
    a_eps = 2.0**-23 if angle_eps is None else float(angle_eps)
    names = golden_cases(layout, base, head_dim) if cases is None else list(cases)
    runs = []
    for b in bks:
        for dtype in dtypes or ["float32"]:
            if dtype not in b.float_dtypes():
                raise ValueError(f"backend {b.name} has no {dtype}; it has {', '.join(b.float_dtypes())}")
            rep = check_rope(
                fn,
                layout=layout,
                base=base,
                xp=b.xp,
                head_dim=head_dim,
                dtype=b.dtype(dtype),
                device=b.device,
                ulps=ulps,
                angle_eps=a_eps,
            )
            golden = run_golden(fn, b, dtype, names, a_eps)
            runs.append(
                {
                    "backend": b.name,
                    "dtype": dtype,
                    "check_rope": rep.to_dict(),
                    "check_rope_text": str(rep),
                    "golden": golden,
                    "passed": bool(rep) and all(g["passed"] for g in golden),
                }
            )
    return {
        "against": spec,
        "layout": layout,
        "base": float(base),
        "head_dim": head_dim,
        "angle_eps": a_eps,
        "cases": names,
        "runs": runs,
        "passed": bool(runs) and all(r["passed"] for r in runs),
    }


def format_against(rep: dict[str, Any]) -> str:
    """The readable report of :func:`run_against`."""
    lines = [
        f"rotary conformance kit against {rep['against']}",
        f"  claims layout={rep['layout']!r}, base={rep['base']:g}, head_dim={rep['head_dim']}; "
        f"angle_eps={rep['angle_eps']:g}" + ("  (exact angles demanded)" if rep["angle_eps"] == 0 else ""),
    ]
    if not rep["cases"]:
        lines.append(
            "  no golden case has this layout, base and head_dim (full rotary, no scaling); "
            "check_rope only. Cases: " + ", ".join(vectors.index_names())
        )
    for run in rep["runs"]:
        lines += ["", f"== {run['backend']} / {run['dtype']}", run["check_rope_text"]]
        if run["golden"]:
            lines.append(f"  golden vectors (tolerance {GOLDEN_ULPS:g} ulps + angle allowance):")
            for g in run["golden"]:
                st = "ok  " if g["passed"] else "FAIL"
                lines.append(
                    f"  {st} {g['name']:<28} {g['n']:3d} positions  max {g['ulps']:.3g} ulps "
                    f"(tolerance there {g['tol_ulps']:.3g})"
                )
                if g["message"]:
                    lines.append(f"      -> {g['message']}")
    n_fail = sum(not r["passed"] for r in rep["runs"])
    verdict = "PASSED" if rep["passed"] else f"FAILED ({n_fail} of {len(rep['runs'])} runs)"
    lines += ["", f"{len(rep['runs'])} runs (backend x dtype), golden cases {rep['cases']}.  {verdict}"]
    return "\n".join(lines)
