"""Causal RoPE linear attention: against hand-written code, its memory, its scaling, softmax.

``python3 -m benchmarks.linear_attention [--quick] [--threads N] [--plot PATH] [--json PATH]``

Shapes ``(1, heads, N, d=64)``, float32, CPU, one thread (BLAS, torch and XLA).  Side by side in
one run (interleaved rounds, :func:`benchmarks._timing.compare`):

* against what a user writes without rotary, at ``N = 64k`` with 4 heads, in torch, NumPy and
  under ``jax.jit``: the careful code (:mod:`benchmarks.linear_careful`, the targets' baseline)
  and the hurried one (:mod:`benchmarks.linear_hand`), causal (target: rotary at most 1.0x the
  careful code) and non-causal (at most 1.0x), a decoding loop (one token from a carried state,
  positions 1000 to 1199) once per form of the position (an int, ``[t]``, a 0-d or ``(1,)``
  array, none with ``rope=``; at most 1.2x), and flash-linear-attention's naive chunk where
  ``fla`` is installed;
* packed documents (10,000 of 1-16 tokens, 4 of 16k) against one unpacked call of the same
  tokens: at most 1.2x;
* peak memory beyond the output at 64k (NumPy: tracemalloc; torch: the resident set, sampled
  in a fresh process): at most 0.25x the output;
* time against length, 4k to 256k tokens (torch): the slope of log time on log N, 1.0 +- 0.1;
* softmax attention (``rotary.attention``, the quadratic baseline) against linear attention, 8
  heads, up to 8k tokens.
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
#: Heads and lengths of the comparison with hand-written code.
VS_HEADS = 4
VS_N, VS_N_QUICK = 65536, 8192


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


def plot(rows: list[dict], path: str) -> None:
    """Time against length from the suite's rows (``python3 -m benchmarks --json``): causal
    linear attention (torch, 4 heads, to 256k) and the softmax comparison (8 heads)."""
    import re

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series: dict[str, list[tuple[int, float]]] = {}
    for r in rows:
        if r.get("section") != SECTION or not r.get("ms"):
            continue
        m = re.fullmatch(r"causal (linear|softmax)? ?N=(\d+)( \(4 heads\))?", r["case"])
        if not m:
            continue
        label = f"{r['backend']} linear, 4 heads" if m.group(3) else f"{r['backend']} {m.group(1)}, 8 heads"
        series.setdefault(label, []).append((int(m.group(2)), r["ms"] / 1e3))
    fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
    for label, pts in series.items():
        ax.loglog(*zip(*sorted(pts), strict=True), "--s" if "softmax" in label else "-o", label=label, base=2)
    ax.set_xlabel("sequence length N")
    ax.set_ylabel("seconds (causal, d=64, fp32, one thread)")
    ax.set_title("RoPE linear attention vs softmax attention (CPU)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def plot_packing(path: str) -> None:
    """Which keys each query sees in a packed sequence (3 documents of 5, 3 and 4 tokens, causal):
    drawn from rotary itself, ``rotary.attention`` of equal scores and one-hot values with
    ``cu_seqlens`` (each query spreads its weight evenly over the keys it sees)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    import rotary

    cu = np.array([0, 5, 8, 12])
    n = int(cu[-1])
    z = np.zeros((1, n, 2))
    seen = np.asarray(rotary.attention(z, z, np.eye(n)[None], causal=True, cu_seqlens=cu))[0] > 0
    fig, ax = plt.subplots(figsize=(4.2, 4.2), dpi=100)
    ax.imshow(seen, cmap="Blues", vmin=0, vmax=1.4)
    for b in cu[1:-1]:
        ax.axhline(b - 0.5, color="k", lw=0.8)
        ax.axvline(b - 0.5, color="k", lw=0.8)
    ax.set_xlabel("key (token of the packed sequence)")
    ax.set_ylabel("query")
    ax.set_title("cu_seqlens = [0, 5, 8, 12], causal")
    ax.set_xticks(range(n))
    ax.set_yticks(range(n))
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


def compiled_memory_rows() -> list[dict]:
    """The working memory of compiled causal linear attention (torch, ``dynamic=True``: one graph
    for every length, the whole sequence at once)."""
    m = compiled_memory(16384)
    if m is None:
        return []
    # O(N) memory: a fixed multiple of the output (softmax's N x N scores alone would be
    # N / d = 256 times the output at 16k)
    return [
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
    ]


def _row(
    backend: str,
    case: str,
    ms: float | None,
    ratio: float | None = None,
    baseline: str | None = None,
    target: float | None = None,
    cmp: str = "<=",
) -> dict:
    ok = None
    if target is not None and ratio is not None:
        ok = ratio <= target if cmp == "<=" else ratio >= target
    return {
        "section": SECTION,
        "backend": backend,
        "case": case,
        "ms": ms,
        "ratio": ratio,
        "baseline": baseline,
        "target": target,
        "cmp": cmp,
        "ok": ok,
    }


def _vs_inputs(n: int, heads: int = VS_HEADS) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, heads, n, D), dtype=np.float32) * 0.5 for _ in range(3))
    return q, k, v, np.arange(n)


def _fla_chunk() -> Callable[..., Any] | None:
    """flash-linear-attention's naive chunked form (``normalize=True``: it rotates nothing and
    divides by ``q . cumsum(k)``), where ``fla`` is installed."""
    try:
        from fla.ops.linear_attn.naive import naive_chunk_linear_attn
    except Exception:  # (not installed, or its import fails on this machine)
        return None
    return naive_chunk_linear_attn


def _lib_cases(lib: str, n: int) -> dict[str, dict[str, Callable[[], Any]]] | None:
    """``{"causal": {name: fn}, "noncausal": ...}`` for one library (``rotary``, the careful and
    the hurried hand-written code), or ``None`` where the library is missing."""
    import rotary

    from . import linear_careful as careful
    from . import linear_hand as hand

    qn, kn, vn, pn = _vs_inputs(n)
    if lib == "numpy":
        return {
            "causal": {
                "rotary": lambda: rotary.linear_attention(qn, kn, vn, pn, causal=True),
                CAREFUL: lambda: careful.numpy_causal(qn, kn, vn),
                HURRIED: lambda: hand.numpy_causal(qn, kn, vn),
            },
            "noncausal": {
                "rotary": lambda: rotary.linear_attention(qn, kn, vn, pn),
                CAREFUL: lambda: careful.numpy_noncausal(qn, kn, vn),
                HURRIED: lambda: hand.numpy_noncausal(qn, kn, vn),
            },
        }
    if lib == "torch":
        try:
            import torch
        except ImportError:
            return None
        q, k, v, p = (torch.from_numpy(x) for x in (qn, kn, vn, pn))
        cases = {
            "causal": {
                "rotary": lambda: rotary.linear_attention(q, k, v, p, causal=True),
                CAREFUL: lambda: careful.torch_causal(q, k, v),
                HURRIED: lambda: hand.torch_causal(q, k, v),
            },
            "noncausal": {
                "rotary": lambda: rotary.linear_attention(q, k, v, p),
                CAREFUL: lambda: careful.torch_noncausal(q, k, v),
                HURRIED: lambda: hand.torch_noncausal(q, k, v),
            },
        }
        fla = _fla_chunk()
        if fla is not None:  # its layout is (batch, seq, heads, d); normalised, no RoPE
            fq, fk, fv = (torch.nn.functional.elu(x).add(1).transpose(1, 2).contiguous() for x in (q, k, v))
            cases["causal"]["fla naive chunk"] = lambda: fla(fq, fk, fv, scale=1.0, normalize=True)
        return cases
    if lib == "jax":
        try:
            import jax
            import jax.numpy as jnp
        except ImportError:
            return None
        q, k, v = (jnp.asarray(x) for x in (qn, kn, vn))
        p = jnp.asarray(pn, dtype=jnp.int32)
        r_causal = jax.jit(lambda q, k, v, p: rotary.linear_attention(q, k, v, p, causal=True))
        r_non = jax.jit(lambda q, k, v, p: rotary.linear_attention(q, k, v, p))

        def ready(f: Callable[..., Any], *a: Any) -> Callable[[], Any]:
            return lambda: jax.block_until_ready(f(*a))

        return {
            "causal": {
                "rotary": ready(r_causal, q, k, v, p),
                CAREFUL: ready(jax.jit(careful.jax_causal), q, k, v),
                HURRIED: ready(jax.jit(hand.jax_causal), q, k, v),
            },
            "noncausal": {
                "rotary": ready(r_non, q, k, v, p),
                CAREFUL: ready(jax.jit(careful.jax_noncausal), q, k, v),
                HURRIED: ready(jax.jit(hand.jax_noncausal), q, k, v),
            },
        }
    raise ValueError(lib)


#: The decoding rows' positions: ``DECODE_FROM``, then one more per step, back to
#: ``DECODE_FROM`` (and the state it started from) after ``DECODE_STEPS`` steps.
DECODE_FROM, DECODE_STEPS = 1000, 200

#: How a decoding step's position is passed (``"state offset"``: no ``pos``, ``rope=`` and
#: the state's own offset), one row each.
DECODE_FORMS = ("int", "[t] (list)", "0-d array", "(1,) array", "state offset")


def _loop(step: Callable[[int, Any], tuple[Any, Any]], state0: Any) -> Callable[[], Any]:
    """A decoding loop's next step: ``step(t, state) -> (out, state)`` at positions
    ``DECODE_FROM ..``, carrying the state (back to ``state0`` after ``DECODE_STEPS``)."""
    box = [DECODE_FROM, state0]

    def call() -> Any:
        t, st = box
        out, st = step(t, st)
        box[0], box[1] = (t + 1, st) if t + 1 < DECODE_FROM + DECODE_STEPS else (DECODE_FROM, state0)
        return out

    return call


def _decode_cases(lib: str, heads: int = VS_HEADS) -> dict[str, Callable[[], Any]] | None:
    """One decoding step (one token, a carried state of ``DECODE_FROM`` tokens, positions
    changing every step): rotary with each position form of :data:`DECODE_FORMS`, the careful
    step (rows of precomputed tables, the state updated in place) and the hurried one (its
    angles computed per step); under ``jax.jit``, rotary with a ``(1,)`` position array."""
    import rotary

    from . import linear_careful as careful
    from . import linear_hand as hand

    rng = np.random.default_rng(1)
    qn, kn, vn = (rng.standard_normal((1, heads, 1, D), dtype=np.float32) * 0.5 for _ in range(3))
    kh, vh = (rng.standard_normal((1, heads, DECODE_FROM, D), dtype=np.float32) * 0.5 for _ in range(2))
    st = rotary.linear_attention_state(kh, vh, np.arange(DECODE_FROM))
    Sn, zn = np.asarray(st.S), np.asarray(st.z)
    steps = range(DECODE_FROM, DECODE_FROM + DECODE_STEPS)
    rope = rotary.RoPE(D)  # (the default rope of linear_attention's positions)
    if lib in ("numpy", "torch"):
        if lib == "numpy":
            conv: Callable[[Any], Any] = np.array
            tables = careful.numpy_step_tables(2 * DECODE_FROM + DECODE_STEPS, D)
            c_step, h_step = careful.numpy_step, hand.numpy_step
        else:
            try:
                import torch
            except ImportError:
                return None
            conv = torch.tensor
            tables = careful.torch_step_tables(2 * DECODE_FROM + DECODE_STEPS, D)
            c_step, h_step = careful.torch_step, hand.torch_step
        q, k, v, S, z = (conv(x) for x in (qn, kn, vn, Sn, zn))
        state0 = rotary.LinearAttentionState(S, z, DECODE_FROM)
        given = {
            "int": list(steps),
            "[t] (list)": [[t] for t in steps],
            "0-d array": [conv(t) for t in steps],
            "(1,) array": [conv([t]) for t in steps],
        }

        def rot(form: str) -> Callable[[int, Any], tuple[Any, Any]]:
            if form == "state offset":
                return lambda t, st: rotary.linear_attention(
                    q, k, v, causal=True, rope=rope, state=st, return_state=True
                )
            ps = given[form]
            return lambda t, st: rotary.linear_attention(
                q, k, v, ps[t - DECODE_FROM], causal=True, state=st, return_state=True
            )

        cases = {f"rotary, pos={f}": _loop(rot(f), state0) for f in DECODE_FORMS}
        Sc, zc = conv(Sn), conv(zn)  # (the careful step's own, updated in place)
        cases[CAREFUL] = _loop(lambda t, st: (c_step(q, k, v, Sc, zc, *tables, t), st), None)
        cases[HURRIED] = _loop(_hurried(h_step, q, k, v), (S, z))
        # where the time goes: the careful step returning a new state (as a library's step must),
        # and rotary's shortcut alone (its bits, without the entry point's lookups and checks)
        c_new = careful.numpy_step_new if lib == "numpy" else careful.torch_step_new
        cases[CAREFUL_NEW] = _loop(_hurried(lambda *a: c_new(*a[:5], *tables, a[5]), q, k, v), (S, z))
        alone = _step_alone(rope, q, k, v, S, z)
        cases[ALONE] = _loop(_hurried(lambda q, k, v, S, z, t: alone(q, k, v, t, S, z), q, k, v), (S, z))
        return cases
    if lib == "jax":
        try:
            import jax
            import jax.numpy as jnp
        except ImportError:
            return None
        q, k, v, S, z = (jnp.asarray(x) for x in (qn, kn, vn, Sn, zn))
        ps = [jnp.asarray([t], dtype=jnp.int32) for t in steps]
        C, Sc = careful.jax_tables(2 * DECODE_FROM + DECODE_STEPS, D)

        def r_step(q: Any, k: Any, v: Any, S: Any, z: Any, p: Any) -> Any:
            o, st = rotary.linear_attention(
                q, k, v, p, causal=True, state=rotary.LinearAttentionState(S, z, 0), return_state=True
            )
            return o, st.S, st.z

        def jitted(f: Callable[..., Any], *consts: Any) -> Callable[[int, Any], tuple[Any, Any]]:
            g = jax.jit(f)

            def step(t: int, st: Any) -> tuple[Any, Any]:
                o, S, z = jax.block_until_ready(g(q, k, v, *st, *consts, ps[t - DECODE_FROM]))
                return o, (S, z)

            return step

        return {
            "rotary, pos=(1,) array": _loop(jitted(r_step), (S, z)),
            CAREFUL: _loop(jitted(careful.jax_step, C, Sc), (S, z)),
            HURRIED: _loop(jitted(lambda q, k, v, S, z, p: hand.jax_step(q, k, v, S, z, p[0])), (S, z)),
        }
    raise ValueError(lib)


def _step_alone(rope: Any, q: Any, k: Any, v: Any, S: Any, z: Any) -> Callable[..., Any]:
    """rotary's decoding shortcut for these arguments (``Backend.linear_step`` with RoPE's rows):
    ``step(q, k, v, pos, S, z) -> (out, S, z)``, the kernel a call reaches after its checks."""
    from rotary._backends import backend_for
    from rotary._lib._compat import namespace_of

    be = backend_for(namespace_of(q, k, v, names=("q", "k", "v")))
    step = be.linear_step("elu+1", 0.0, rope._decode_rows(be, q, k), (q, k, v, S, z))
    assert step is not None
    return step


def _hurried(step: Callable[..., Any], q: Any, k: Any, v: Any) -> Callable[[int, Any], tuple[Any, Any]]:
    def f(t: int, st: Any) -> tuple[Any, Any]:
        o, S, z = step(q, k, v, *st, t)
        return o, (S, z)

    return f


#: The names of the baselines' cases and rows.
CAREFUL, HURRIED = "careful hand-written", "hurried hand-written"
#: The decoding rows' breakdown (informational): the careful step as a pure function, and
#: rotary's shortcut without its entry point.
CAREFUL_NEW, ALONE = "careful, new state (pure)", "shortcut alone (rotary's bits, no entry point)"

#: Targets of rotary against the careful hand-written code (time ratio, at most).
VS_TARGETS = {"causal": 1.0, "noncausal": 1.0, "decode": 1.2}


def _versus_rows(lib: str, what: str, kind: str, t: Any) -> list[dict]:
    """The rows of one comparison: each baseline's time, then each of rotary's cases against the
    careful code (its target) and against the hurried one (informational)."""
    rows = [_row(lib, f"{what}: {b}", t[b] * 1e3) for b in (CAREFUL, HURRIED)]
    for name in t:
        if name in (CAREFUL, HURRIED):
            continue
        tgt = VS_TARGETS[kind] if name.startswith("rotary") else None
        rows.append(_row(lib, f"{what}: {name}", t[name] * 1e3, t.ratio(name, CAREFUL), CAREFUL, tgt))
        rows.append(_row(lib, f"{what}: {name} (vs hurried)", None, t.ratio(name, HURRIED), HURRIED))
    return rows


def versus(libs: tuple[str, ...], *, quick: bool, verbose: bool = True, n: int | None = None) -> list[dict]:
    """rotary against the careful and the hurried hand-written code of each library, side by
    side (interleaved rounds): causal and non-causal at ``n`` tokens (default 64k, quick 8k),
    and a decoding step with each position form."""
    from ._timing import compare

    n = n or (VS_N_QUICK if quick else VS_N)
    rows = []
    label = {"numpy": "numpy", "torch": "torch", "jax": "jax.jit"}
    for lib in libs:
        cases = _lib_cases(lib, n)
        if cases is None:
            continue
        dec = _decode_cases(lib)
        for kind, fns in (*cases.items(), *(() if dec is None else (("decode", dec),))):
            decode = kind == "decode"
            reps = (15 if quick else 25) if decode else (2 if quick else 3)
            t = compare(fns, reps=reps, warmup=1 if not decode else 3, inner=200 if decode else 1)
            what = "decoding step (1 token)" if decode else f"{kind} N={n}"
            rows += _versus_rows(label[lib], what, kind, t)
            if verbose:
                print(
                    f"{label[lib]:8} {what:28} " + "  ".join(f"{k} {t[k] * 1e3:9.3f} ms" for k in fns),
                    flush=True,
                )
    return rows


# -- packed documents --------------------------------------------------------------------------------
PACKED_TARGET = 1.1


def _packings(quick: bool) -> list[tuple[str, np.ndarray]]:
    """``(label, document lengths)``: 10,000 documents of 1 to 16 tokens, and 4 of 16k (quick:
    1,000 and 4 of 2k)."""
    rng = np.random.default_rng(0)
    many = rng.integers(1, 17, size=1000 if quick else 10000)
    n = 2048 if quick else 16384
    return [(f"{many.size} documents of 1-16 tokens", many), (f"4 documents of {n // 1024}k", np.full(4, n))]


def packed_rows(libs: tuple[str, ...], *, quick: bool, verbose: bool = True) -> list[dict]:
    """Causal linear attention of packed documents (``cu_seqlens``; segment ids under ``jax.jit``)
    against one unpacked call of the same tokens, side by side: no Python loop over documents."""
    import rotary

    from ._timing import compare

    rows = []
    label = {"numpy": "numpy", "torch": "torch", "jax": "jax.jit"}
    reps = 2 if quick else 3
    for what, lengths in _packings(quick):
        cu = np.concatenate([[0], np.cumsum(lengths)])
        n = int(cu[-1])
        qn, kn, vn, _ = _vs_inputs(n)
        pos = rotary.positions.from_cu_seqlens(cu)
        seg = np.repeat(np.arange(lengths.size), lengths)
        for lib in libs:
            if lib == "numpy":
                q, k, v, p, c = qn, kn, vn, pos, cu
                cases = {
                    "unpacked": lambda q=q, k=k, v=v, p=p: rotary.linear_attention(q, k, v, p, causal=True),
                    "packed": lambda q=q, k=k, v=v, p=p, c=c: rotary.linear_attention(
                        q, k, v, p, causal=True, cu_seqlens=c
                    ),
                }
            elif lib == "torch":
                try:
                    import torch
                except ImportError:
                    continue
                q, k, v, p, c = (torch.from_numpy(x) for x in (qn, kn, vn, pos, cu))
                cases = {
                    "unpacked": lambda q=q, k=k, v=v, p=p: rotary.linear_attention(q, k, v, p, causal=True),
                    "packed": lambda q=q, k=k, v=v, p=p, c=c: rotary.linear_attention(
                        q, k, v, p, causal=True, cu_seqlens=c
                    ),
                }
            else:
                try:
                    import jax
                    import jax.numpy as jnp
                except ImportError:
                    continue
                q, k, v = (jnp.asarray(x) for x in (qn, kn, vn))
                p, sg = jnp.asarray(pos, dtype=jnp.int32), jnp.asarray(seg, dtype=jnp.int32)
                c = jnp.asarray(cu, dtype=jnp.int32)
                un = jax.jit(lambda q, k, v, p: rotary.linear_attention(q, k, v, p, causal=True))
                pk = jax.jit(
                    lambda q, k, v, p, s: rotary.linear_attention(q, k, v, p, causal=True, segment_ids=s)
                )
                pc = jax.jit(
                    lambda q, k, v, p, c: rotary.linear_attention(q, k, v, p, causal=True, cu_seqlens=c)
                )
                cases = {
                    "unpacked": lambda q=q, k=k, v=v, p=p, f=un: jax.block_until_ready(f(q, k, v, p)),
                    "packed": lambda q=q, k=k, v=v, p=p, s=sg, f=pk: jax.block_until_ready(f(q, k, v, p, s)),
                    "packed (cu_seqlens)": lambda q=q, k=k, v=v, p=p, c=c, f=pc: jax.block_until_ready(
                        f(q, k, v, p, c)
                    ),
                }
                # eager (each call one compiled program of rotary's): cu_seqlens, as a user passes them
                eager = {
                    "unpacked": lambda q=q, k=k, v=v, p=p: jax.block_until_ready(
                        rotary.linear_attention(q, k, v, p, causal=True)
                    ),
                    "packed": lambda q=q, k=k, v=v, p=p, c=c: jax.block_until_ready(
                        rotary.linear_attention(q, k, v, p, causal=True, cu_seqlens=c)
                    ),
                }
                rows += _packed_pair("jax eager", what, n, compare(eager, reps=reps, warmup=1), verbose)
            rows += _packed_pair(label[lib], what, n, compare(cases, reps=reps, warmup=1), verbose)
    return rows


def _packed_pair(lib: str, what: str, n: int, t: Any, verbose: bool) -> list[dict]:
    """The unpacked call's row and each packed call's ("packed": ``cu_seqlens``, or segment ids
    under ``jax.jit``, which also times ``cu_seqlens``), with its ratio to the unpacked one."""
    rows = [_row(lib, f"causal, {what} (N={n}): unpacked", t["unpacked"] * 1e3)]
    for key in ("packed", "packed (cu_seqlens)"):
        if key not in t:
            continue
        name = "packed (segment ids)" if key == "packed" and "packed (cu_seqlens)" in t else key
        ratio = t.ratio(key, "unpacked")
        if verbose:
            print(f"{lib:9} {name:20} {what:30} {ratio:6.3f} x unpacked", flush=True)
        rows.append(
            _row(lib, f"causal, {what} (N={n}): {name}", t[key] * 1e3, ratio, "unpacked", PACKED_TARGET)
        )
    return rows


# -- memory beyond the output ----------------------------------------------------------------------
_PEAK_SCRIPT = """
import ctypes, os, threading, time, tracemalloc, numpy as np
lib, n, h, d = {lib!r}, {n}, {h}, {d}
if lib == "torch":
    import torch
    torch.set_num_threads(1)
import rotary
g = np.random.default_rng(0)
q, k, v = (g.standard_normal((1, h, n, d), dtype=np.float32) for _ in range(3))
p = np.arange(n)
if lib == "torch":
    q, k, v, p = (torch.from_numpy(x) for x in (q, k, v, p))
rotary.linear_attention(q[..., :1024, :], k[..., :1024, :], v[..., :1024, :], p[:1024], causal=True)
rotary.linear_attention(q, k, v, p, causal=True)  # (warm: the position table is state, kept)
out_bytes = n * h * d * 4
if lib == "numpy":
    tracemalloc.start()
    out = rotary.linear_attention(q, k, v, p, causal=True)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
else:
    def rss():
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    samples, done = [rss()], threading.Event()
    def sample():
        while not done.is_set():
            samples.append(rss())
            time.sleep(0.0005)
    t = threading.Thread(target=sample)
    base = samples[0]
    t.start()
    out = rotary.linear_attention(q, k, v, p, causal=True)
    done.set()
    t.join()
    peak = max(samples) - base
print((peak - out_bytes) / 2**20, out_bytes / 2**20)
"""


def peak_memory(lib: str, n: int, heads: int = VS_HEADS) -> tuple[float, float] | None:
    """``(MiB beyond the output, output MiB)`` of causal linear attention at ``n`` tokens, in a
    fresh process (NumPy: tracemalloc's peak; torch: the growth of the resident set)."""
    import subprocess
    import sys

    code = _PEAK_SCRIPT.format(lib=lib, n=n, h=heads, d=D)
    try:
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        return None
    if res.returncode != 0:
        return None
    extra, out = (float(x) for x in res.stdout.split()[-2:])
    return extra, out


def memory_rows(libs: tuple[str, ...], *, quick: bool) -> list[dict]:
    n = VS_N_QUICK if quick else VS_N
    rows = []
    for lib in libs:
        if lib == "jax":
            continue
        m = peak_memory(lib, n)
        if m is None:
            continue
        extra, out = m
        how = "tracemalloc" if lib == "numpy" else "resident set"
        rows.append(
            _row(
                lib,
                f"causal N={n}: peak memory beyond the output {extra:.1f} MiB ({how})",
                None,
                extra / out,
                f"output ({out:.0f} MiB)",
                0.25,
            )
        )
    return rows


# -- time against length ------------------------------------------------------------------------------
SLOPE_SIZES, SLOPE_SIZES_QUICK = (4096, 16384, 65536, 262144), (1024, 4096, 16384)


def slope_rows(*, quick: bool, verbose: bool = True) -> list[dict]:
    """torch causal linear attention at 4k .. 256k tokens: times and the log-log slope."""
    try:
        import torch
    except ImportError:
        return []
    import rotary

    sizes = SLOPE_SIZES_QUICK if quick else SLOPE_SIZES
    rows, times = [], []
    for n in sizes:
        q, k, v, p = (torch.from_numpy(x) for x in _vs_inputs(n))
        rotary.linear_attention(q, k, v, p, causal=True)
        best = min(
            _timed(lambda q=q, k=k, v=v, p=p: rotary.linear_attention(q, k, v, p, causal=True))
            for _ in range(3)
        )
        times.append(best)
        rows.append(_row("torch", f"causal N={n} (4 heads)", best * 1e3))
        if verbose:
            print(f"torch    causal N={n:7d} {best * 1e3:10.1f} ms", flush=True)
    slope = float(np.polyfit(np.log(sizes), np.log(times), 1)[0])
    lo, hi = sizes[0] // 1024, sizes[-1] // 1024
    rows.append(
        _row(
            "torch",
            f"abs(slope - 1) of log time on log N, {lo}k..{hi}k (slope {slope:.3f})",
            None,
            abs(slope - 1.0),
            "linear in N",
            0.1,
        )
    )
    return rows


def _timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def suite_rows(quick: bool, *, verbose: bool = False) -> list[dict]:
    """Every row of this benchmark, as ``python3 -m benchmarks`` records them."""
    libs = ("torch", "numpy", "jax")
    rows = versus(libs, quick=quick, verbose=verbose)
    rows += packed_rows(libs, quick=quick, verbose=verbose)
    rows += memory_rows(libs, quick=quick)
    rows += slope_rows(quick=quick, verbose=verbose)
    soft = run(
        quick=True,
        backends=("torch",),
        sizes=(1024, 2048, 4096) if quick else (1024, 2048, 4096, 8192),
        softmax_max=4096 if quick else 8192,
        verbose=verbose,
    )
    rows += _rows_for_suite(soft, summary(soft))
    return rows + compiled_memory_rows()


def quick_run(quick: bool = True) -> list[dict]:
    """Entry point for ``python3 -m benchmarks`` (``quick``: 8k instead of 64k tokens)."""
    return suite_rows(quick)


def _set_threads(n: int) -> None:
    if n <= 0:
        return
    if n == 1:  # (before JAX is imported)
        flags = os.environ.get("XLA_FLAGS", "")
        os.environ["XLA_FLAGS"] = (flags + " --xla_cpu_multi_thread_eigen=false").strip()
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
    p.add_argument("--quick", action="store_true", help="8k tokens instead of 64k, scaling to 16k")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (0: leave as is)")
    p.add_argument(
        "--backends", default="torch,numpy,jax", help="comma-separated: numpy, torch, jax (default: all)"
    )
    p.add_argument("--json", default=None, help="save the rows here")
    p.add_argument(
        "--plot", default=None, help="save the scaling plot here (PNG), from this run's rows or --from's"
    )
    p.add_argument("--from", dest="source", default=None, help="plot the rows of this JSON file (no run)")
    p.add_argument(
        "--packing-plot", default=None, help="draw which keys each query sees when packed (PNG; no run)"
    )
    a = p.parse_args(argv)
    if a.packing_plot:
        plot_packing(a.packing_plot)
        return 0
    if a.source:
        if not a.plot:
            p.error("--from needs --plot")
        with open(a.source) as f:
            plot(json.load(f)["rows"], a.plot)
        return 0
    backends = tuple(b.strip() for b in a.backends.split(",") if b.strip())
    unknown = [b for b in backends if b not in ("numpy", "torch", "jax")]
    if unknown or not backends:
        bad = ", ".join(map(repr, unknown)) or repr(a.backends)
        p.error(f"unknown backend {bad}; choose from: numpy, torch, jax")
    _set_threads(a.threads)
    t0 = time.perf_counter()
    rows = versus(backends, quick=a.quick) + packed_rows(backends, quick=a.quick)
    rows += memory_rows(backends, quick=a.quick)
    if "torch" in backends:
        rows += slope_rows(quick=a.quick)
    from .__main__ import print_table

    print()
    print_table(rows)
    print(f"\n(total {time.perf_counter() - t0:.0f} s; load average {os.getloadavg()[0]:.1f} at the end)")
    if a.plot:
        plot(rows, a.plot)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
