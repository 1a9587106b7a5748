"""Running the suite and reporting it: text table, JSON and a PNG heat map."""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import math
import os
import platform
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from rotary.testing import ALL_BACKENDS, Backend, available

from .libraries import LIBRARIES, format_libraries, format_versions, run_libraries, run_versions
from .suite import COLUMNS, Cell, backends, run_backend, run_invariants, sub_available

LAYOUTS = ("half", "interleaved")

__all__ = ["environment", "format_report", "main", "run", "write_heatmap"]

_DISTS = (
    "rotary",
    "numpy",
    "array-api-compat",
    "torch",
    "jax",
    "jaxlib",
    "dask",
    "array-api-strict",
    "cupy-cuda12x",
    "transformers",
    "rotary-embedding-torch",
    "matplotlib",
)


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _shadow_note() -> str | None:
    """A note when the imported ``rotary`` is not the installed distribution's (a checkout in the
    current directory shadows a regular install), so the report says which one it tested."""
    import rotary

    here = Path(rotary.__file__).resolve().parent
    try:
        dist = importlib.metadata.distribution("rotary")
    except importlib.metadata.PackageNotFoundError:
        return "rotary is imported from a folder, not from an installed distribution"
    installed = Path(str(dist.locate_file("rotary/__init__.py")))
    if installed.exists() and installed.resolve().parent != here:
        return (
            f"this rotary shadows the installed one at {installed.parent} "
            "(run from another folder to test the installed rotary)"
        )
    return None


def environment(bks: list) -> dict[str, Any]:
    """Library versions, platform and the device of every backend run."""
    import rotary

    env: dict[str, Any] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "rotary_version": rotary.__version__,
        "rotary_path": str(Path(rotary.__file__).parent),
        "rotary_note": _shadow_note(),
        "versions": {d: v for d in _DISTS if (v := _version(d)) is not None},
        "longdouble_eps": float(np.finfo(np.longdouble).eps),
        "devices": {},
    }
    for b in bks:
        dev = b.device
        if b.module == "jax":
            import jax

            dev = f"{jax.devices()[0]} (x64 {'on' if b.float64 else 'off'})"
        elif b.module == "torch" and dev is None:
            dev = "cpu"
        elif dev is None:
            dev = "cpu"
        env["devices"][b.name] = str(dev)
    return env


def run(
    names: str | None = None,
    progress: Any = None,
    libraries: tuple[str, ...] = (),
    check: tuple[str, ...] | None = None,
) -> dict[str, Any]:
    """Run every column for every installed (or named) backend and dtype, list the array libraries
    (checking those not in the table that ``check`` names, default all, and each module of
    ``libraries``); return the report dict."""
    t0 = time.perf_counter()
    bks = backends(names)
    cells: list[Cell] = []
    seen: dict[tuple[str, str], dict[str, Any]] = {}
    for b in bks:
        t = time.perf_counter()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if b.module == "dask":
                import dask

                with dask.config.set(scheduler="synchronous"):  # tiny arrays: threads only add overhead
                    got = run_backend(b)
            else:
                got = run_backend(b)
        for w in caught:  # reported once each, not printed as they happen
            where = f"{Path(w.filename).name}:{w.lineno}"
            msg = str(w.message).splitlines()[0][:200]
            entry = seen.setdefault(
                (where, msg),
                {"category": w.category.__name__, "where": where, "message": msg, "backends": []},
            )
            if b.name not in entry["backends"]:
                entry["backends"].append(b.name)
        cells += got
        if progress:
            bad = sum(c.status == "fail" for c in got)
            progress(f"  {b.name:<28} {len(got):3d} cells, {bad} failed  ({time.perf_counter() - t:.1f} s)")
    invariants = run_invariants()
    table: dict[str, list[str]] = {}
    for b in bks:
        table.setdefault(b.module, []).append(b.name)
    t = time.perf_counter()
    libs = run_libraries(table, libraries, check)
    if progress:
        bad = sum(e["passed"] is False for e in libs)
        took = time.perf_counter() - t
        progress(f"  {'array libraries':<28} {len(libs):3d} listed, {bad} failed  ({took:.1f} s)")
    missing = (
        sorted({m for c in cells for m in c.missing})
        if cells
        else sorted(s.name for col in COLUMNS for s in col.subs if not sub_available(s))
    )
    t = time.perf_counter()
    # (with array-api-strict among the backends: every standard version it offers)
    versions = run_versions() if any(b.module == "array_api_strict" for b in bks) else []
    if progress and versions:
        bad = sum(not e["passed"] for e in versions)
        took = time.perf_counter() - t
        progress(f"  {'standard versions':<28} {len(versions):3d} checked, {bad} failed  ({took:.1f} s)")
    named = set(libraries) | set(check or ())
    for e in libs:  # (a library the user named must be checked: unchecked is a failure, with why)
        if (e.get("extra") or e["library"] in named) and e["passed"] is None:
            e["passed"] = False
            e["detail"] = f"named but not checked: {e['detail']}"
    failed = (
        [c for c in cells if c.status == "fail"]
        + [c for c in cells if c.message.startswith("unsupported standard version")]  # (not checked)
        + [i for i in invariants if i["passed"] is False]
        + [e for e in libs if e["passed"] is False]
        + [e for e in versions if not e["passed"]]
    )
    return {
        "passed": not failed and bool(bks),
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "seconds": round(time.perf_counter() - t0, 2),
        "environment": environment(bks),
        "backends": [b.name for b in bks],
        "columns": [
            {"key": c.key, "label": c.label, "description": c.description, "checks": [s.name for s in c.subs]}
            for c in COLUMNS
        ],
        "not_available": missing,
        "cells": [c.to_dict() for c in cells],
        "invariants": invariants,
        "libraries": libs,
        "standard_versions": versions,
        "warnings": list(seen.values()),
        "n_failed": len(failed),
    }


def _cell_text(c: dict[str, Any]) -> str:
    if c["status"] == "n/a":
        return "n/a"
    u = float(c["ulps"])
    num = "inf" if not math.isfinite(u) else (f"{u:.2g}" if u < 100 else f"{u:.0e}".replace("e+0", "e"))
    return num if c["status"] == "pass" else f"{num} X"


def _rows(rep: dict[str, Any]) -> list[tuple[str, dict[str, dict[str, Any]]]]:
    rows: dict[str, dict[str, dict[str, Any]]] = {}
    for c in rep["cells"]:
        rows.setdefault(f"{c['backend']}/{c['dtype']}", {})[c["column"]] = c
    return list(rows.items())


def format_report(rep: dict[str, Any]) -> str:
    """The human-readable report: environment, the backends x checks table, failures, invariants."""
    env = rep["environment"]
    v = env["versions"]
    lines = [
        f"rotary conformance report  ({rep['created']}, {rep['seconds']:.1f} s)",
        f"  rotary {env.get('rotary_version', v.get('rotary', '?'))} from {env['rotary_path']}",
        *([f"  note: {env['rotary_note']}"] if env.get("rotary_note") else []),
        f"  python {env['python']} on {env['platform']} ({env['cpu_count']} CPUs)",
        "  " + ", ".join(f"{k} {val}" for k, val in v.items() if k != "rotary"),
        "  devices: " + ", ".join(f"{k}: {d}" for k, d in env["devices"].items()),
        "",
        "max error in ulps of the dtype (|out - ref| / (eps(dtype) * max(1, |ref|)), eps = spacing at 1.0;",
        "ref = NumPy float64 on the same rounded inputs, or the float64 matrix form);",
        "X = failed, n/a = not in this rotary (or, listed under NOT CHECKED, a backend rotary cannot run)",
        "",
    ]
    cols = COLUMNS
    w0 = max([len(r) for r, _ in _rows(rep)] + [14])
    head = f"{'backend/dtype':<{w0}} " + " ".join(f"{c.label:>9}" for c in cols)
    lines += [head, "-" * len(head)]
    for name, row in _rows(rep):
        cells = " ".join(f"{_cell_text(row[c.key]) if c.key in row else '':>9}" for c in cols)
        lines.append(f"{name:<{w0}} {cells}")
    lines.append("")
    lines.append("columns:")
    for c in cols:
        lines.append(f"  {c.label:<9} {c.description}")
    if rep["not_available"]:
        lines += [
            "",
            "not available in this rotary (reported, not failed): " + ", ".join(rep["not_available"]),
        ]
    unchecked = sorted(
        {c["backend"]: c["message"] for c in rep["cells"] if c["message"].startswith("unsupported")}.items()
    )
    if unchecked:
        lines += ["", "NOT CHECKED (a failure: the run cannot vouch for them):"]
        lines += [f"  {b}: {m}" for b, m in unchecked]
    fails = [c for c in rep["cells"] if c["status"] == "fail"]
    if fails:
        lines += ["", f"FAILURES ({len(fails)}):"]
        for c in fails:
            lines.append(f"  {c['backend']}/{c['dtype']} {c['column']}: {c['message']}")
    if rep.get("warnings"):
        lines += ["", "warnings raised during the run (once each):"]
        for w in rep["warnings"]:
            lines.append(f"  {w['category']} at {w['where']} ({', '.join(w['backends'])}): {w['message']}")
    lines += ["", "backend-independent checks:"]
    for inv in rep["invariants"]:
        st = {True: "ok  ", False: "FAIL", None: "n/a "}[inv["passed"]]
        lines.append(f"  {st} {inv['name']}: {inv['detail']}")
    if rep.get("libraries"):
        lines += ["", *format_libraries(rep["libraries"])]
    if rep.get("standard_versions"):
        lines += ["", *format_versions(rep["standard_versions"])]
    n = len(rep["cells"])
    npass = sum(c["status"] == "pass" for c in rep["cells"])
    nun = sum(c["message"].startswith("unsupported") for c in rep["cells"])
    nna = sum(c["status"] == "n/a" for c in rep["cells"]) - nun
    verdict = "PASSED" if rep["passed"] else f"FAILED ({rep['n_failed']} failures)"
    if not rep["backends"]:
        verdict = "FAILED: no backend ran"
    lines += [
        "",
        f"{len(rep['backends'])} backends, {n} cells: {npass} passed, {n - npass - nna - nun} failed, "
        f"{nna} not available" + (f", {nun} not checked" if nun else "") + f".  {verdict}",
    ]
    return "\n".join(lines)


def write_heatmap(rep: dict[str, Any], path: Path) -> str | None:
    """PNG heat map of the error matrix (colour: error / tolerance). Returns a note if skipped."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: heat map skipped (pip install matplotlib)"
    rows = _rows(rep)
    cols = COLUMNS
    ratio = np.full((len(rows), len(cols)), np.nan)
    text = [["" for _ in cols] for _ in rows]
    for i, (_, row) in enumerate(rows):
        for j, c in enumerate(cols):
            cell = row.get(c.key)
            if cell is None or cell["status"] == "n/a":
                text[i][j] = "n/a"
                continue
            u, t = float(cell["ulps"]), float(cell["tol_ulps"])
            ratio[i, j] = min(u / t, 2.0) if t > 0 else (0.0 if u == 0 else 2.0)
            text[i][j] = _cell_text(cell)
    fig, ax = plt.subplots(figsize=(1.0 + 0.8 * len(cols), 0.8 + 0.32 * len(rows)), dpi=80)
    cmap = matplotlib.colormaps["RdYlGn_r"].with_extremes(bad="#dddddd")
    im = ax.imshow(np.ma.masked_invalid(ratio), cmap=cmap, vmin=0.0, vmax=2.0, aspect="auto")
    for i in range(len(rows)):
        for j in range(len(cols)):
            ax.text(j, i, text[i][j], ha="center", va="center", fontsize=7)
    ax.set_xticks(range(len(cols)), [c.label for c in cols], rotation=45, ha="right", fontsize=8)
    ax.set_yticks(range(len(rows)), [r for r, _ in rows], fontsize=8)
    ax.set_title(
        "rotary conformance: max error in ulps of the dtype\n(colour: error / tolerance; >1 fails)",
        fontsize=9,
    )
    fig.colorbar(im, ax=ax, fraction=0.03, pad=0.02, label="error / tolerance")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return None


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m conformance",
        description="rotary's conformance kit. Without --against: every public function of the installed "
        "rotary on every installed backend and dtype against NumPy float64, check_rope's properties, and "
        "the golden vectors. With --against MODULE:FUNCTION: check_rope and the golden vectors on another "
        "project's RoPE function fn(x, pos).",
        epilog="Backends: " + ", ".join(b.name for b in ALL_BACKENDS) + ". Exit status 0 when everything "
        "passes, 1 on a failure, 2 on a usage error.",
        allow_abbrev=False,
    )
    ap.add_argument("--out", default="conformance-report", help="output folder (default: %(default)s)")
    ap.add_argument(
        "--backends",
        default=None,
        help="comma-separated backend names (default: $ROTARY_BACKENDS, else every installed one; "
        "with --against: numpy)",
    )
    ap.add_argument(
        "--library",
        action="append",
        default=[],
        metavar="MODULE",
        help="also check every public function on this array library (its array-API namespace, or a "
        "module with asarray); repeatable",
    )
    ap.add_argument(
        "--libraries",
        default="all",
        help="the installed array libraries outside the table to check: all (default), none (list them "
        "only), or comma-separated names (" + ", ".join(n for n, _ in LIBRARIES) + ")",
    )
    ap.add_argument("--quiet", action="store_true", help="print only the verdict")
    ap.add_argument(
        "--vectors", action="store_true", help="print where the golden vectors and their format are, and exit"
    )
    g = ap.add_argument_group("checking another implementation (--against)")
    g.add_argument(
        "--against",
        metavar="MODULE:FUNCTION",
        help="check this function instead of rotary: fn(x, pos) with x (batch, heads, seq, head_dim) "
        "and pos (seq,), arrays of the backend; e.g. mypackage.rope:rotate",
    )
    g.add_argument("--layout", choices=LAYOUTS, default="half", help="the pairing it claims (default: half)")
    g.add_argument("--base", type=float, default=10000.0, help="the RoPE base it claims (default: 10000)")
    g.add_argument("--head-dim", type=int, default=64, help="head dimension to check (default: 64)")
    g.add_argument(
        "--dtypes",
        default=None,
        help="comma-separated float dtypes: float32, float64, float16, bfloat16 (default: float32; "
        "with --config, the adapter's own DTYPES, else float32,bfloat16)",
    )
    g.add_argument(
        "--angle-eps",
        type=float,
        default=None,
        help="relative precision allowed for the angles: 2**-23 (default) accepts float32 angles; "
        "0 demands exact angles, as rotary guarantees",
    )
    g.add_argument(
        "--cases",
        default=None,
        help="comma-separated golden cases to run (default: those of its layout, base and head_dim)",
    )
    m = ap.add_argument_group(
        "checking an engine against a model's config (--against ADAPTER --config CONFIG)",
        "ADAPTER is a module (or object) with build(config, *, layer_type, dtype), or MODULE:FUNCTION "
        "naming that build function (rotary.testing.engine describes the protocol; conformance.engines "
        "holds adapters of vLLM, Megatron, flash-attn, liger, torchtune, MaxText, mlx-lm, ...)",
    )
    m.add_argument(
        "--config",
        metavar="CONFIG",
        help="a config.json (or checkpoint folder), inline JSON, a case of the field report (default, "
        "linear, dynamic, llama3, yarn, yarn_mscale, longrope, mrope, ...), or a transformers model type",
    )
    m.add_argument(
        "--layer-types",
        default=None,
        help="comma-separated layer types to check (default: every distinct RoPE of the config)",
    )
    return ap


def _main_config(ap: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    """``--against ADAPTER --config CONFIG``: :func:`rotary.testing.check_model_rope`."""
    from rotary.testing import check_model_rope

    if args.against is None:
        ap.error("--config needs --against ADAPTER (the engine to check)")
    dtypes = (
        None
        if args.dtypes is None
        else _names(ap, args.dtypes, ["float32", "float16", "bfloat16"], "dtype", "--dtypes")
    )
    lts = None if args.layer_types is None else [t.strip() for t in args.layer_types.split(",") if t.strip()]
    try:
        rep = check_model_rope(args.against, args.config, dtypes=dtypes, layer_types=lts)
    except ImportError as e:
        ap.error(f"the engine of {args.against} is not installed here: {e}")
    except (ValueError, TypeError, AttributeError) as e:
        ap.error(str(e))
    return {"kind": "model", **rep.to_dict()}, str(rep)


def _names(ap: argparse.ArgumentParser, value: str, known: list[str], what: str, source: str) -> list[str]:
    """The comma-separated ``value`` as a list, every name one of ``known`` (else a usage error)."""
    names = [n.strip() for n in value.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        bad = ", ".join(map(repr, unknown)) or repr(value)
        ap.error(f"unknown {what} {bad} in {source}; choose from: {', '.join(known)}")
    return names


def _select_backends(ap: argparse.ArgumentParser, value: str | None, source: str) -> list[Backend]:
    """The backends named (validated), or every installed one; an empty selection is an error."""
    known = [b.name for b in ALL_BACKENDS]
    installed = [b.name for b in available("")]
    if value is None:
        bks = available("")
    else:
        names = _names(ap, value, known, "backend", source)
        missing = [n for n in names if n not in installed]
        if missing:
            ap.error(
                f"backend {', '.join(map(repr, missing))} ({source}) is not installed or usable here; "
                f"installed: {', '.join(installed)}"
            )
        bks = available(",".join(names))
    if not bks:
        ap.error("no backend to run")
    return bks


def main(argv: list[str] | None = None) -> int:
    ap = _parser()
    args = ap.parse_args(argv)

    def progress(msg: str) -> None:
        if not args.quiet:
            print(msg, file=sys.stderr, flush=True)

    if args.vectors:
        from . import vectors

        print(vectors.HERE)
        print(f"  {len(vectors.index_names())} cases; format: {vectors.HERE / 'README.md'}")
        return 0
    if args.config is not None:
        rep, text = _main_config(ap, args)
    elif args.against is None:
        env_value = os.environ.get("ROTARY_BACKENDS") or None
        source = "--backends" if args.backends is not None else "$ROTARY_BACKENDS"
        bks = _select_backends(ap, args.backends if args.backends is not None else env_value, source)
        for lib in args.library:
            try:
                importlib.import_module(lib)
            except Exception as e:
                ap.error(f"--library {lib}: cannot import it here ({type(e).__name__}: {e})")
        progress("running rotary conformance ...")
        check = None
        if args.libraries != "all":
            known = [n for n, _ in LIBRARIES]
            check = (
                ()
                if args.libraries == "none"
                else tuple(_names(ap, args.libraries, known, "library", "--libraries"))
            )
        rep = run(",".join(b.name for b in bks), progress, tuple(args.library), check)
        text = format_report(rep)
    else:
        from .against import format_against, run_against
        from .vectors import index_names

        bks = _select_backends(ap, args.backends or "numpy", "--backends")
        dtypes = _names(
            ap, args.dtypes or "float32", ["float32", "float64", "float16", "bfloat16"], "dtype", "--dtypes"
        )
        cases = None
        if args.cases is not None:
            cases = _names(ap, args.cases, index_names(), "golden case", "--cases")
        for b in bks:
            has = b.float_dtypes()
            lacking = [d for d in dtypes if d not in has]
            if lacking:
                ap.error(f"backend {b.name} has no {', '.join(lacking)}; it has {', '.join(has)}")
        if args.head_dim < 4 or args.head_dim % 2:
            ap.error(f"--head-dim must be an even integer >= 4, got {args.head_dim}")
        try:
            rep = run_against(
                args.against,
                bks,
                dtypes=dtypes,
                layout=args.layout,
                base=args.base,
                head_dim=args.head_dim,
                angle_eps=args.angle_eps,
                cases=cases,
            )
        except ValueError as e:
            ap.error(str(e))
        text = format_against(rep)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(rep, indent=1, default=str) + "\n")
    (out / "report.txt").write_text(text + "\n")
    note = write_heatmap(rep, out / "heatmap.png") if args.against is None else "no heat map with --against"
    files = ["report.txt", "report.json"] + ([] if note else ["heatmap.png"])
    if args.quiet:
        print(text.splitlines()[-1])
    else:
        print(text)
        print(f"\nwrote {', '.join(str(out / f) for f in files)}" + (f"\nnote: {note}" if note else ""))
    return 0 if rep["passed"] else 1
