"""``python3 -m benchmarks [--quick] [--json FILE] [--only SECTION ...]``: see :data:`DESCRIPTION`."""

from __future__ import annotations

import argparse
import importlib
import json
import platform
import sys
import time

SECTIONS = ("prefill", "decode", "tables", "hf", "hfpatch", "linattn", "families", "state", "training")

DESCRIPTION = """\
Time rotary against hand-written RoPE, the copy floor and Hugging Face, and linear
attention against softmax attention. Sections: prefill, decode, tables (cos/sin
tables of 128k positions), hf (transformers' apply_rotary_pos_emb), hfpatch (a
transformers model's forward with rotary.hf.patch against without), linattn (linear
attention scaling), families (Gated DeltaNet and KDA against transformers' torch
code), state (each kind of rotary's state on and off: kept if it gains
1.15x), training (bytes autograd keeps for backward, forward + backward time). Prints
one table of medians and ratios measured in this run; --json and --markdown also write
the rows.
"""


def _linattn(quick: bool, reps: int) -> list:
    """The linear-attention benchmark's quick run (its own module, ``benchmarks.linear_attention``)."""
    mod = importlib.import_module("benchmarks.linear_attention")
    return list(mod.quick_run(quick))


def _set_threads(n: int) -> None:
    """Pin intra-op threads of torch and XLA (must run before JAX is imported)."""
    if n <= 0:
        return
    import os

    os.environ.setdefault("OMP_NUM_THREADS", str(n))
    if n == 1:
        flags = os.environ.get("XLA_FLAGS", "")
        os.environ["XLA_FLAGS"] = (flags + " --xla_cpu_multi_thread_eigen=false").strip()
    try:
        import torch

        torch.set_num_threads(n)
    except ImportError:
        pass


def target_text(r: dict) -> str:
    """``<= 1.1``, or ``>= 10`` for a row whose target is a lower bound (``"cmp": ">="``)."""
    if r.get("target") is None:
        return ""
    return f"{r.get('cmp', '<=')} {r['target']:g}"


def floor_target_text(r: dict) -> str:
    return "" if r.get("floor_target") is None else f"<= {r['floor_target']:g}"


def markdown_table(rows: list) -> str:
    """The rows as a Markdown table (for the docs)."""
    out = [
        "| section | backend | case | ms | ratio | vs | target | x floor | floor target | met |",
        "|---|---|---|---:|---:|---|---|---:|---|---|",
    ]
    for r in rows:
        if "ms" not in r:
            out.append(
                f"| {r.get('section', '')} | {r.get('backend', '')} | {r.get('case', '')} |" + " |" * 7
            )
            continue
        verdict = {True: "met", False: "**missed**", None: ""}[r.get("ok")]
        out.append(
            f"| {r['section']} | {r['backend']} | {r['case']} | {_fmt(r['ms'], '.3f')} | "
            f"{_fmt(r['ratio'], '.2f')} | {r['baseline'] or ''} | {target_text(r)} | "
            f"{_fmt(r.get('floor_ratio'), '.2f')} | {floor_target_text(r)} | {verdict} |"
        )
    return "\n".join(out) + "\n"


def _fmt(v: object, spec: str) -> str:
    return "" if v is None else format(v, spec)


def print_table(rows: list) -> None:
    w = max([30] + [len(str(r.get("case", ""))) for r in rows if "ms" in r])
    head = (
        f"{'section':<16} {'backend':<14} {'case':<{w}} {'ms':>9} {'ratio':>7}  {'vs':<26} {'target':>7}"
        f" {'x floor':>7} {'target':>7} ok"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        if "ms" not in r:
            print(f"{r.get('section', ''):<16} {r.get('backend', ''):<14} {r.get('case', '')}")
            continue
        ok = {True: "yes", False: "NO", None: ""}[r.get("ok")]
        print(
            f"{r['section']:<16} {r['backend']:<14} {r['case']:<{w}} {_fmt(r['ms'], '9.3f'):>9} "
            f"{_fmt(r['ratio'], '7.3f'):>7}  {r['baseline'] or '':<26} {target_text(r).replace(' ', ''):>7}"
            f" {_fmt(r.get('floor_ratio'), '7.2f'):>7} {floor_target_text(r).replace(' ', ''):>7} {ok}"
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python3 -m benchmarks",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    p.add_argument("--quick", action="store_true", help="smaller prefill shapes, fewer repetitions")
    p.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    p.add_argument("--markdown", metavar="FILE", help="also write the table as Markdown")
    p.add_argument("--only", nargs="+", choices=SECTIONS, help="run only these sections")
    p.add_argument("--reps", type=int, help="interleaved repetitions (default 5 quick, 15 full)")
    p.add_argument(
        "--gpu",
        action="store_true",
        help="the GPU matrix instead (torch CUDA generic/Triton/compile, CuPy, JAX GPU; decode, 4k and "
        "32k prefill; both layouts; float32 and bfloat16), written to benchmarks/results-gpu.json "
        "unless --json says otherwise; without a CUDA device it says so and exits 0",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="intra-op threads for torch and XLA (default 1: the shared 2-core machine is "
        "oversubscribed and multi-threaded kernels stall unpredictably; 0 keeps library defaults)",
    )
    args = p.parse_args(argv)
    if args.gpu:
        from . import gpu

        return gpu.main(args.json or "benchmarks/results-gpu.json", args.quick)
    _set_threads(args.threads)
    import warnings

    # dynamo warns about array_api_compat's lru_cache helpers once per helper: noise here
    warnings.filterwarnings("ignore", message="Dynamo detected a call to a `functools.lru_cache`")
    from . import hf_patch, linear_families, state, training
    from . import rope as rb

    reps = args.reps or (5 if args.quick else 15)
    funcs = {
        "prefill": rb.bench_prefill,
        "decode": rb.bench_decode,
        "tables": rb.bench_tables,
        "hf": rb.bench_hf,
        "hfpatch": hf_patch.bench_patch,
        "linattn": _linattn,
        "families": linear_families.bench_families,
        "state": state.bench_state,
        "training": training.bench_training,
    }
    rows: list = []
    t0 = time.time()
    for name in args.only or SECTIONS:
        print(f"# running {name} ...", file=sys.stderr, flush=True)
        rows += funcs[name](args.quick, reps)
    print_table(rows)
    missed = [r for r in rows if r.get("ok") is False]
    print(f"\n{len(rows)} rows in {time.time() - t0:.0f} s; targets missed: {len(missed)}")
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(markdown_table(rows))
    if args.json:
        meta = {
            "command": "python3 -m benchmarks " + " ".join(argv if argv is not None else sys.argv[1:]),
            "machine": platform.machine(),
            "python": platform.python_version(),
            "quick": args.quick,
            "reps": reps,
            "threads": args.threads,
        }
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
