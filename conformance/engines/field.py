"""The field report: every engine adapter over the case matrix, each in its own interpreter.

``python -m conformance.engines [--venvs DIR] [--engines a,b] [--cases c,d] [--update-report]``
runs rotary itself and each engine of :data:`ENGINES` whose adapter imports (in
``DIR/<engine>/venv/bin/python`` where that exists, else in this interpreter) over every case of
:mod:`conformance.engines.cases` in float32 and bfloat16 (or the adapter's own ``DTYPES``) with
:func:`rotary.testing.check_model_rope`, and writes

* the JSON of every result, and
* the docs page generated from it: engine x case with versions, every failure's diagnosis, and
  every finding (:mod:`conformance.engines.findings`) with its minimal upstream reproduction
  (``docs/field/repro/``) and the output it printed,

to a scratch folder (``--out``, default ``$TMPDIR/rotary-field-report``), or with
``--update-report`` over the committed ``conformance/engines/field-report.json`` and
``docs/guides/field_report.rst``.  Either way the engines and cases run replace their rows in the
committed report and every other row is kept, so one engine can be rerun alone.  Each row is what
the committed code writes, nothing of the run's machine or timing (CI regenerates rows and
compares them field for field: ``tests/test_field_report.py``).

``--render`` regenerates the page from the committed JSON alone.  An engine that is not installed
is listed with its install recipe.  The driving Python needs ``rotary`` and ``array-api-compat``
(``pip install -e . array-api-compat`` in a checkout); each engine runs in its own venv's Python.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .cases import CASES

__all__ = ["DTYPES", "ENGINES", "ROWS", "main", "merge", "render", "run_engine", "verdict"]

#: The adapters (modules of this package), in report order.
ENGINES = (
    "vllm",
    "megatron",
    "transformer_engine",
    "flash_attn",
    "liger",
    "torchtune",
    "torchtitan",
    "litgpt",
    "mistral_inference",
    "maxtext",
    "gemma",
    "keras_hub",
    "mlx_lm",
    "executorch",
    "ggml",
    "sglang",
    "rotary_embedding_torch",
    "x_transformers",
    "olmo_core",
)
#: The report's rows: rotary itself (the reference, checked like any engine), then the engines.
ROWS = ("rotary_self", *ENGINES)
DTYPES = ("float32", "bfloat16")
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
JSON_PATH = HERE / "field-report.json"
RST_PATH = ROOT / "docs" / "guides" / "field_report.rst"
SCRATCH = Path(tempfile.gettempdir()) / "rotary-field-report"


def run_engine(name: str, cases: list[str], dtypes: tuple[str, ...] | None = None) -> dict[str, Any]:
    """One engine over ``cases`` in this interpreter (the worker's job): its row of the report.

    The row holds only what the committed code and the engine's version determine (no timing,
    the interpreter as ``major.minor``).  An exception out of the check is blamed by its frames
    (:func:`rotary.testing.engine.raised_by_adapter`): ``"adapter error"`` when the adapter's own
    code raised, ``"engine error"`` otherwise.
    """
    from rotary.testing import check_model_rope
    from rotary.testing.engine import adapter_files, raised_by_adapter

    mod = importlib.import_module(f"conformance.engines.{name}")
    out: dict[str, Any] = {
        "module": name,
        "engine": mod.NAME,
        "install": mod.INSTALL,
        "python": ".".join(platform.python_version_tuple()[:2]),
    }
    try:
        out["version"] = mod.version()
    except ImportError as e:
        return {**out, "installed": False, "reason": str(e).splitlines()[0][:300]}
    out["installed"] = True
    out["dtypes"] = list(dtypes or getattr(mod, "DTYPES", DTYPES))
    out["cases"] = {}
    for c in cases:
        t = time.perf_counter()
        try:
            rep = check_model_rope(
                mod, CASES[c].config, dtypes=out["dtypes"], checks=CASES[c].checks
            ).to_dict()
        except Exception as e:  # a crash is a result too (reported, never hidden)
            who = "adapter error" if raised_by_adapter(e, adapter_files(mod)) else "engine error"
            rep = {
                "passed": False,
                "supported": True,
                "error": f"{who}: {type(e).__name__}: {e}"[:500],
                "results": [],
            }
        print(f"  {name} / {c}: {time.perf_counter() - t:.1f} s", file=sys.stderr, flush=True)
        out["cases"][c] = rep
    return out


def merge(report: dict[str, Any], rows: list[dict[str, Any]], cases: list[str]) -> dict[str, Any]:
    """``report`` with ``rows`` (of ``cases``) in place of its own: an engine's cases rerun replace
    those cases of its row (the rest of the row kept while its version is the same), every other
    engine's row is kept; rows and cases in :data:`ROWS` and matrix order."""
    import rotary

    old = {e["module"]: e for e in report.get("engines", [])}
    for row in rows:
        prev = old.get(row["module"])
        keep = (
            prev is not None
            and prev.get("installed")
            and row.get("installed")
            and prev.get("version") == row.get("version")
        )
        if keep:
            assert prev is not None
            row = {**row, "cases": {**prev.get("cases", {}), **row["cases"]}}
        if row.get("installed"):
            row["cases"] = {c: row["cases"][c] for c in CASES if c in row["cases"]}
        old[row["module"]] = row
    known = {**report.get("cases", {}), **{c: _case_entry(c) for c in cases}}
    return {
        "rotary": rotary.__version__,
        "date": datetime.date.today().isoformat(),
        "dtypes": list(DTYPES),
        "machine": report.get("machine", f"{platform.system()} {platform.machine()}, no GPU"),
        "cases": {c: known[c] for c in CASES if c in known},
        "engines": [old[m] for m in ROWS if m in old],
    }


def _case_entry(c: str) -> dict[str, Any]:
    return {"model": CASES[c].model, "exercises": CASES[c].exercises, "note": CASES[c].note}


def _interpreter(name: str, venvs: str | None) -> str:
    if venvs:
        py = Path(venvs) / name / "venv" / "bin" / "python"
        if py.exists():
            return str(py)
    return sys.executable


def _run_worker(name: str, cases: list[str], venvs: str | None, timeout: float) -> dict[str, Any]:
    py = _interpreter(name, venvs)
    cmd = [py, "-m", "conformance.engines.field", "--worker", name, "--cases", ",".join(cases)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)
    except subprocess.TimeoutExpired:
        return {"module": name, "installed": False, "reason": f"timed out after {timeout:.0f} s"}
    lines = [x for x in res.stdout.splitlines() if x.startswith("{")]
    if res.returncode != 0 or not lines:
        return {"module": name, "installed": False, "reason": (res.stderr or res.stdout)[-600:]}
    got: dict[str, Any] = json.loads(lines[-1])
    return got


def render(report: dict[str, Any]) -> str:
    """The docs page (reStructuredText) of a field report."""
    from .findings import FINDINGS

    cases = list(report["cases"])
    lines = [
        ".. This page is generated by `python -m conformance.engines --render --update-report` from",
        "   conformance/engines/field-report.json: edit the data or the generator, not this file.",
        "",
        "The field report: engines certified against model configs",
        "=========================================================",
        "",
        f"Every engine adapter of ``conformance/engines/`` run over the case matrix with "
        f"``rotary.testing.check_model_rope`` (rotary {report['rotary']}, {report['date']}, CPU only: "
        "Triton kernels in Triton's interpreter).  Each cell is one engine on one published config, "
        f"in {' and '.join(report['dtypes'])} (or the dtypes the engines table gives): **pass** (every "
        "check holds), **FAIL** (the diagnosis follows the table), **n/s** (the engine cannot express "
        "that config), **n/a** (the case's checks do not apply: the engine's RoPE takes no packed input), "
        "or **adapter error** (the adapter's own code raised: no verdict on the engine).  "
        "A position past an engine's table may be refused, never clamped or wrapped.",
        "",
    ]
    engines = [e for e in report["engines"] if e.get("installed")]
    tally = [verdict(c) for e in engines for c in e["cases"].values()]
    n_pass, n_fail, n_ns = tally.count("pass"), tally.count("fail"), tally.count("n/s")
    errors = f", {tally.count('adapter error')} adapter errors" if "adapter error" in tally else ""
    n_na = f", {tally.count('n/a')} not applicable" if "n/a" in tally else ""
    n_engines = sum(1 for e in engines if e["module"] != "rotary_self")
    lines += [
        f"{n_engines} engines certified (and rotary itself, the first row), {len(cases)} cases: "
        f"{n_pass} pass, {n_fail} fail, "
        f"{n_ns} not supported{n_na}{errors}; {len(FINDINGS)} findings.",
        "",
        "The cases",
        "---------",
        "",
        ".. list-table::",
        "   :header-rows: 1",
        "",
        "   * - case",
        "     - model",
        "     - what it exercises",
    ]
    for name, c in report["cases"].items():
        note = f" ({c['note']})" if c.get("note") else ""
        lines += [f"   * - ``{name}``", f"     - {c['model']}{note}", f"     - {c['exercises']}"]
    lines += ["", "Engine x case", "-------------", "", ".. list-table::", "   :header-rows: 1", ""]
    lines.append("   * - engine")
    lines += [f"     - ``{c}``" for c in cases]
    for e in engines:
        lines.append(f"   * - {e['engine']} {e['version']}")
        for c in cases:
            cell = e["cases"].get(c)
            lines.append(f"     - {_cell(cell)}")
    lines += ["", "Engines", "-------", "", ".. list-table::", "   :header-rows: 1", ""]
    lines += ["   * - engine", "     - version", "     - Python", "     - dtypes", "     - adapter"]
    for e in report["engines"]:
        ver = e.get("version", "not installed")
        lines += [
            f"   * - {e.get('engine', e['module'])}",
            f"     - {ver}",
            f"     - {e.get('python', '')}",
            f"     - {', '.join(e.get('dtypes', report['dtypes'])) if e.get('installed') else ''}",
            f"     - ``conformance/engines/{e['module']}.py``",
        ]
    lines += ["", "Failures, as diagnosed", "----------------------", ""]
    for e in engines:
        for c in cases:
            cell = e["cases"].get(c)
            if not cell or cell.get("passed"):
                continue
            lines.append(f"* **{e['engine']}** on ``{c}``:")
            for msg in _failures(cell):
                lines.append(f"  {msg}")
            lines.append("")
    na = [
        f"* **{e['engine']}** on ``{c}``, ``{r['check']}``: {_escape(r['message'])}"
        for e in engines
        for c in cases
        for r in (e["cases"].get(c) or {}).get("results", [])
        if r["status"] == "not applicable"
    ]
    if na:
        lines += ["Not applicable, with the reason", "-------------------------------", ""]
        lines += [*dict.fromkeys(na), ""]
    lines += ["Findings", "--------", ""]
    lines.append(
        "Each disagreement is a bug in the engine, a documented design choice of the engine, or a bug "
        "in rotary (none found).  Each comes with a minimal upstream reproduction: the engine, torch "
        "or JAX and NumPy only (no rotary), against a float64 formula written out in the script; run "
        "it in the engine's environment (the recipe is in the adapter's docstring)."
    )
    lines.append("")
    for f in FINDINGS:
        title = f"{f.engine}: {f.title}"
        lines += [title, "~" * len(title), ""]
        lines.append(f"*{f.kind}*; cases: {', '.join(f'``{c}``' for c in f.cases) or 'outside the matrix'}.")
        if f.upstream:
            lines.append(f"Upstream: {f.upstream}.")
        lines += ["", f.detail, ""]
        lines += [f".. literalinclude:: ../field/repro/{f.repro}", "   :language: python", ""]
        lines += [
            "It prints:",
            "",
            f".. literalinclude:: ../field/repro/{f.repro[:-3]}.out",
            "   :language: text",
            "",
        ]
    return "\n".join(lines) + "\n"


def verdict(cell: dict[str, Any]) -> str:
    """One case of one engine: ``"pass"``, ``"fail"`` (the engine failed a check, or raised),
    ``"n/s"`` (it cannot express the config), ``"n/a"`` (the case's checks do not apply to it: no
    packed input) or ``"adapter error"`` (the adapter's own code raised: no verdict on the
    engine)."""
    if "error" in cell and not cell.get("results"):
        return "adapter error" if str(cell["error"]).startswith("adapter error") else "fail"
    status = {r["status"] for r in cell["results"]}
    if "fail" in status:
        return "fail"
    if "adapter error" in status:
        return "adapter error"
    if cell.get("supported"):
        return "pass"
    return "n/a" if status == {"not applicable"} else "n/s"


def _cell(cell: dict[str, Any] | None) -> str:
    """pass / **FAIL** (checks) / n/s / adapter error, with the layer types or dtypes that differ."""
    if cell is None:
        return ""
    v = verdict(cell)
    if "error" in cell and not cell.get("results"):
        return "**adapter error**" if v == "adapter error" else "**FAIL** (engine error)"
    if v in ("n/s", "n/a"):
        return v
    rows = cell["results"]
    ns = sorted({(r["layer_type"] or r["dtype"]) for r in rows if r["status"] == "not supported"})
    na = sorted({r["check"] for r in rows if r["status"] == "not applicable"})
    tail = (f"; n/s: {', '.join(ns)}" if ns else "") + (f"; n/a: {', '.join(na)}" if na else "")
    if v == "pass":
        return f"pass{tail}"
    if v == "adapter error":
        errs = sorted({r["check"] for r in rows if r["status"] == "adapter error"})
        return f"**adapter error** ({', '.join(errs)}){tail}"
    failed = sorted({r["check"] for r in rows if r["status"] == "fail"})
    return f"**FAIL** ({', '.join(failed)}){tail}"


def _failures(cell: dict[str, Any]) -> list[str]:
    if "error" in cell and not cell.get("results"):
        return [f"the check raised: {_escape(cell['error'])}"]
    seen: list[str] = []
    for r in cell["results"]:
        if r["status"] not in ("fail", "adapter error"):
            continue
        lt = f" [{r['layer_type']}]" if r.get("layer_type") else ""
        msg = f"- ``{r['check']}``{lt}, {r['dtype']}: {_escape(r['message'])}"
        if msg not in seen:
            seen.append(msg)
    return seen


def _escape(text: str) -> str:
    """Plain text as reStructuredText (no emphasis, literals or references from ``*``, `` ` ``,
    ``|`` or a word's trailing ``_``)."""
    import re

    text = text.replace("\\", "\\\\")
    for ch in "*`|":
        text = text.replace(ch, "\\" + ch)
    return re.sub(r"_(?=\s|$|[,;:.)])", r"\\_", text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m conformance.engines", description=__doc__.split("\n\n")[0])
    ap.add_argument("--venvs", default=os.environ.get("ROTARY_ENGINE_VENVS"), help="folder of <engine>/venv")
    ap.add_argument("--engines", default=",".join(ROWS))
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--out", default=str(SCRATCH), help="the scratch folder written without --update-report")
    ap.add_argument(
        "--update-report",
        action="store_true",
        help=f"write the committed report and page ({JSON_PATH.name}, {RST_PATH.name}) instead of --out",
    )
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds per engine")
    ap.add_argument("--render", action="store_true", help="only regenerate the page from the committed JSON")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    cases = [c for c in args.cases.split(",") if c]
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        ap.error(f"unknown cases {unknown}; cases: {', '.join(CASES)}")
    if args.worker:
        print(json.dumps(run_engine(args.worker, cases)), flush=True)
        return 0
    engines = [e for e in args.engines.split(",") if e]
    bad = [e for e in engines if e not in ROWS]
    if bad:
        ap.error(f"unknown engines {bad}; engines: {', '.join(ROWS)}")
    report = json.loads(JSON_PATH.read_text()) if JSON_PATH.exists() else {}
    if not args.render:
        rows = []
        for e in engines:
            t = time.perf_counter()
            print(f"{e} ...", file=sys.stderr, flush=True)
            got = _run_worker(e, cases, args.venvs, args.timeout)
            rows.append(got)
            status = "not installed" if not got.get("installed") else f"{got.get('version')}"
            print(f"  {status} ({time.perf_counter() - t:.1f} s)", file=sys.stderr, flush=True)
        report = merge(report, rows, cases)
    if args.update_report:
        json_path, rst_path = JSON_PATH, RST_PATH
    else:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        json_path, rst_path = Path(args.out) / JSON_PATH.name, Path(args.out) / RST_PATH.name
    wrote = [rst_path]
    if not args.render or not args.update_report:
        json_path.write_text(json.dumps(report, indent=1) + "\n")
        wrote.insert(0, json_path)
    rst_path.write_text(render(report))
    where = "" if args.update_report else " (scratch: --update-report writes the committed report)"
    print(f"wrote {' and '.join(map(str, wrote))}{where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
