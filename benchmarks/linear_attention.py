"""Causal RoPE linear attention vs softmax attention: time, peak memory, scaling.

``python3 -m benchmarks.linear_attention [--quick] [--threads N] [--plot PATH] [--json PATH]``

Shapes ``(1, heads=8, N, d=64)``, float32, CPU, NumPy and torch.  For each N:
``rotary.linear_attention(q, k, v, pos, causal=True)`` and
``rotary.attention(q, k, v, pos, causal=True)`` (the quadratic baseline, skipped
above ``--softmax-max`` tokens, where it would take minutes).  Peak memory: tracemalloc
for NumPy (NumPy reports its buffers to it; torch runs the same code path, and its CPU
allocator reports nothing comparable).  BLAS and torch run single-threaded by default
(stable timings on a shared machine).  Checks: ``time(64k) / time(8k)`` within 1.25x
of 8 (linear scaling) and softmax / linear at 16k >= 10.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

if __name__ == "__main__":  # single-threaded BLAS: stable timings on a shared machine
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np

SECTION = "linear attention"
HEADS, D = 8, 64


def _inputs(n: int, backend: str) -> tuple:
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, HEADS, n, D), dtype=np.float32) * 0.5 for _ in range(3))
    pos = np.arange(n)
    if backend == "torch":
        import torch

        return tuple(torch.from_numpy(x) for x in (q, k, v, pos))
    return q, k, v, pos


def _linear(q: Any, k: Any, v: Any, pos: Any, chunk: int | None) -> Any:
    import rotary

    return rotary.linear_attention(q, k, v, pos, causal=True, chunk_size=chunk)


def _softmax(q: Any, k: Any, v: Any, pos: Any, chunk: int | None) -> Any:
    import rotary

    return rotary.attention(q, k, v, pos, causal=True)


def _measure(fn: Callable[[], Any], backend: str, reps: int) -> tuple[float, float | None]:
    """(best seconds over ``reps`` calls, NumPy: tracemalloc peak in MiB during the last call)."""
    best, mib = float("inf"), None
    for i in range(reps):
        trace = backend == "numpy" and i == reps - 1
        if trace:
            tracemalloc.start()
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
        if trace:
            mib = tracemalloc.get_traced_memory()[1] / 2**20
            tracemalloc.stop()
    return best, mib


def run(
    *,
    quick: bool = False,
    backends: tuple[str, ...] = ("numpy", "torch"),
    sizes: tuple[int, ...] | None = None,
    softmax_max: int | None = None,
    chunk: int | None = None,
    verbose: bool = True,
) -> list[dict]:
    """Measure and return one row per (backend, method, N)."""
    if sizes is None:
        sizes = (1024, 2048, 4096, 8192) if quick else (1024, 2048, 4096, 8192, 16384, 32768, 65536)
    if softmax_max is None:
        softmax_max = 4096 if quick else 16384
    rows = []
    for backend in backends:
        if backend == "torch":
            try:
                import torch  # noqa: F401
            except ImportError:
                continue
        for n in sizes:
            args = _inputs(n, backend)
            for method, fn in (("linear", _linear), ("softmax", _softmax)):
                if method == "softmax" and n > softmax_max:
                    rows.append({"backend": backend, "method": method, "N": n, "s": None, "MiB": None})
                    continue
                reps = (3 if n <= 8192 else 2) if method == "linear" else (3 if n <= 2048 else 1)
                _linear(*_inputs(64, backend), chunk)  # warm caches
                s, mib = _measure(lambda fn=fn, args=args: fn(*args, chunk), backend, reps)
                rows.append({"backend": backend, "method": method, "N": n, "s": s, "MiB": mib})
                if verbose:
                    mem = "" if mib is None else f"{mib:9.1f} MiB"
                    print(f"{backend:6} {method:8} N={n:6d} {s * 1e3:10.1f} ms {mem}", flush=True)
    return rows


_MEMORY_SCRIPT = """
import ctypes, os, threading, time, numpy as np, torch, rotary
torch.set_num_threads(1)
f = torch.compile(lambda q, k, v, p: rotary.linear_attention(q, k, v, p, causal=True), dynamic=True)
def inputs(n):
    g = np.random.default_rng(0)
    q, k, v = (torch.from_numpy(g.standard_normal((1, {h}, n, {d}), dtype=np.float32)) for _ in range(3))
    return q, k, v, torch.arange(n)
def rss():
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
for n in (256, 512):
    f(*inputs(n))  # compiled once for every length
a = inputs({n})
ctypes.CDLL("libc.so.6").malloc_trim(0)
peak, done = [rss()], threading.Event()
def sample():
    while not done.is_set():
        peak.append(rss())
        time.sleep(0.0005)
before = peak[0]
t = threading.Thread(target=sample)
t.start()
out = f(*a)
done.set()
t.join()
print((max(peak) - before) / 2**20, out.numel() * 4 / 2**20)
"""


def compiled_memory(n: int = 16384) -> dict | None:
    """Peak memory of compiled causal linear attention at ``n`` tokens (``dynamic=True``, compiled
    at two small lengths first), in a fresh process: the growth of the resident set during the
    call (sampled every 0.5 ms; Linux), the output included."""
    import subprocess
    import sys

    code = _MEMORY_SCRIPT.format(h=HEADS, d=D, n=n)
    try:
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        return None
    if res.returncode != 0:
        return None
    extra, out_mib = (float(x) for x in res.stdout.split()[-2:])
    return {"N": n, "MiB": extra, "output MiB": out_mib}


def copy_floor(n: int, backend: str, reps: int = 3) -> float:
    """Seconds of one pass copying q, k and v (the least any attention reads and writes)."""
    q, k, v, _ = _inputs(n, backend)
    if backend == "torch":
        return _measure(lambda: (q.clone(), k.clone(), v.clone()), "torch", reps)[0]
    return _measure(lambda: (q.copy(), k.copy(), v.copy()), "numpy-untraced", reps)[0]


def paired_scaling(backend: str, lo: int, hi: int, rounds: int = 3, chunk: int | None = None) -> float:
    """Median over ``rounds`` of time(hi) / time(lo), the two timed back to back in each round.

    Pairing cancels load changes on a shared machine that are slower than one round.
    """
    a, b = _inputs(lo, backend), _inputs(hi, backend)
    _linear(*a, chunk)
    ratios = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        _linear(*a, chunk)
        t1 = time.perf_counter()
        _linear(*b, chunk)
        t2 = time.perf_counter()
        ratios.append((t2 - t1) / (t1 - t0))
    return float(np.median(ratios))


def summary(rows: list[dict], paired: dict | None = None) -> list[dict]:
    """Scaling ratios and speed-ups (``ok`` against the targets) per backend.

    ``paired``: ``{backend: ratio}`` from :func:`paired_scaling`, used instead of the
    ratio of the table's best times when given.
    """
    t = {(r["backend"], r["method"], r["N"]): r["s"] for r in rows}
    out = []
    for backend in dict.fromkeys(r["backend"] for r in rows):
        ns = sorted(n for (b, m, n), s in t.items() if b == backend and m == "linear" and s)
        hi = ns[-1]
        lo = hi // 8
        if lo in ns:
            ratio = t[backend, "linear", hi] / t[backend, "linear", lo]
            how = "best times"
            if paired and backend in paired:
                ratio, how = paired[backend], "paired median"
            out.append(
                {
                    "backend": backend,
                    "check": f"time({hi // 1024}k) / time({lo // 1024}k), linear ({how})",
                    "value": ratio,
                    "target": "<= 10 (1.25 x 8)",
                    "ok": ratio <= 10.0,
                }
            )
        sm = [n for n in ns if t.get((backend, "softmax", n))]
        if sm:
            n = max(sm)
            sp = t[backend, "softmax", n] / t[backend, "linear", n]
            out.append(
                {
                    "backend": backend,
                    "check": f"softmax / linear at {n // 1024}k",
                    "value": sp,
                    "target": ">= 10" if n >= 16384 else "(>= 10 at 16k)",
                    "ok": sp >= 10.0 if n >= 16384 else None,
                }
            )
    return out


def markdown(rows: list[dict], checks: list[dict]) -> str:
    """The README table."""
    by = {(r["backend"], r["method"], r["N"]): r for r in rows}
    backends = list(dict.fromkeys(r["backend"] for r in rows))
    ns = sorted({r["N"] for r in rows})
    lines = ["| N | " + " | ".join(f"{b} linear | {b} softmax" for b in backends) + " |"]
    lines.append("|---:|" + "---:|---:|" * len(backends))
    for n in ns:
        cells = []
        for b in backends:
            for m in ("linear", "softmax"):
                r = by.get((b, m, n))
                if r is None or r["s"] is None:
                    cells.append("skipped")
                else:
                    mem = "" if r["MiB"] is None else f" / {r['MiB']:.0f} MiB"
                    cells.append(f"{r['s'] * 1e3:.0f} ms{mem}")
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    lines.append("")
    for c in checks:
        ok = {True: "yes", False: "NO", None: "-"}[c["ok"]]
        lines.append(f"- {c['backend']}: {c['check']} = {c['value']:.2f} (target {c['target']}: {ok})")
    return "\n".join(lines)


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
    styles = {"linear": "-o", "softmax": "--s"}
    for b in dict.fromkeys(r["backend"] for r in rows):
        for m in ("linear", "softmax"):
            pts = sorted((r["N"], r["s"]) for r in rows if r["backend"] == b and r["method"] == m and r["s"])
            if pts:
                ax.loglog(*zip(*pts), styles[m], label=f"{b} {m}", base=2)
    ax.set_xlabel("sequence length N")
    ax.set_ylabel("seconds (causal, 8 heads, d=64, fp32)")
    ax.set_title("RoPE linear attention vs softmax attention (CPU)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def _rows_for_suite(rows: list[dict], checks: list[dict]) -> list[dict]:
    """Rows in the format of ``python3 -m benchmarks`` (section, backend, case, ms, ratio, ...)."""
    out = []
    for r in rows:
        if r["s"] is None:
            case = f"{r['method']} N={r['N']} skipped"
            out.append({"section": SECTION, "backend": r["backend"], "case": case})
            continue
        out.append(
            {
                "section": SECTION,
                "backend": r["backend"],
                "case": f"causal {r['method']} N={r['N']}",
                "ms": r["s"] * 1e3,
                "ratio": None,
                "baseline": None,
                "target": None,
                "ok": None,
            }
        )
    for c in checks:
        lin = c["check"].startswith("time")
        out.append(
            {
                "section": SECTION,
                "backend": c["backend"],
                "case": c["check"],
                "ms": None,
                # the ratio is what the label says: time(N) / time(N/8), or softmax / linear
                "ratio": c["value"],
                "baseline": "linear, N/8" if lin else "linear attention",
                "target": 10.0,
                "cmp": "<=" if lin else ">=",
                # None where no target applies (the speed-up is only required at 16k)
                "ok": c["ok"],
            }
        )
    return out


def floor_and_memory_rows(rows: list[dict], *, memory_n: int = 16384) -> list[dict]:
    """The copy floor at the largest N of each backend (linear attention's ratio to it), and
    the working memory of compiled causal linear attention (torch, ``dynamic=True``)."""
    out = []
    for b in dict.fromkeys(r["backend"] for r in rows):
        lin = [r for r in rows if r["backend"] == b and r["method"] == "linear" and r["s"]]
        if not lin:
            continue
        top = max(lin, key=lambda r: r["N"])
        floor = copy_floor(top["N"], b)
        case = f"copy q,k,v (floor) N={top['N']}"
        out.append(
            {
                "section": SECTION,
                "backend": b,
                "case": case,
                "ms": floor * 1e3,
                "ratio": None,
                "baseline": None,
                "target": None,
                "ok": None,
            }
        )
        out.append(
            {
                "section": SECTION,
                "backend": b,
                "case": f"causal linear N={top['N']} vs floor",
                "ms": None,
                "ratio": top["s"] / floor,
                "baseline": "copy q,k,v (floor)",
                "target": None,
                "ok": None,
            }
        )
    if any(r["backend"] == "torch" for r in rows):
        m = compiled_memory(memory_n)
        if m is not None:
            # O(N) memory: a fixed multiple of the output (softmax's N x N scores alone would be
            # N / d = 256 times the output at 16k)
            out.append(
                {
                    "section": SECTION,
                    "backend": "torch.compile",
                    "case": f"causal linear N={m['N']}: working memory {m['MiB']:.0f} MiB",
                    "ms": None,
                    "ratio": m["MiB"] / m["output MiB"],
                    "baseline": f"output ({m['output MiB']:.0f} MiB)",
                    "target": 8.0,
                    "cmp": "<=",
                    "ok": m["MiB"] <= 8.0 * m["output MiB"],
                }
            )
    return out


def quick_run() -> list[dict]:
    """Entry point for ``python3 -m benchmarks``: the ``--quick`` sizes."""
    rows = run(quick=True, verbose=False)
    return _rows_for_suite(rows, summary(rows)) + floor_and_memory_rows(rows)


def _set_threads(n: int) -> None:
    if n <= 0:
        return
    try:
        import torch

        torch.set_num_threads(n)
    except ImportError:
        pass


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python3 -m benchmarks.linear_attention",
        description=__doc__.replace("``", ""),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    p.add_argument("--quick", action="store_true", help="N up to 8k, softmax up to 4k")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (0: leave as is)")
    p.add_argument("--chunk", type=int, default=None, help="chunk_size (default: rotary's)")
    p.add_argument("--softmax-max", type=int, default=None, help="largest N for softmax attention")
    p.add_argument("--backends", default="numpy,torch", help="comma-separated: numpy, torch (default: both)")
    p.add_argument("--plot", default=None, help="save the scaling plot here (PNG)")
    p.add_argument("--json", default=None, help="save the rows here")
    a = p.parse_args(argv)
    backends = tuple(b.strip() for b in a.backends.split(",") if b.strip())
    unknown = [b for b in backends if b not in ("numpy", "torch")]
    if unknown or not backends:
        bad = ", ".join(map(repr, unknown)) or repr(a.backends)
        p.error(f"unknown backend {bad}; choose from: numpy, torch")
    _set_threads(a.threads)
    t0 = time.perf_counter()
    rows = run(
        quick=a.quick,
        backends=backends,
        softmax_max=a.softmax_max,
        chunk=a.chunk,
    )
    paired = {}
    for b in dict.fromkeys(r["backend"] for r in rows):
        ns = sorted(r["N"] for r in rows if r["backend"] == b and r["method"] == "linear")
        if ns and ns[-1] // 8 in ns:
            paired[b] = paired_scaling(b, ns[-1] // 8, ns[-1], chunk=a.chunk)
            print(f"{b:6} paired time({ns[-1]}) / time({ns[-1] // 8}) = {paired[b]:.2f}", flush=True)
    checks = summary(rows, paired)
    print()
    print(markdown(rows, checks))
    print(f"\n(total {time.perf_counter() - t0:.0f} s; load average {os.getloadavg()[0]:.1f} at the end)")
    if a.plot:
        plot(rows, a.plot)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rows": rows, "checks": checks}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
