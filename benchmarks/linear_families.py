"""The recurrent families of linear attention against transformers' own torch code, side by side.

``python3 -m benchmarks --only families``: Gated DeltaNet (transformers'
``torch_chunk_gated_delta_rule``, the layer of Qwen3-Next and Qwen3.5) and Kimi Delta Attention
(``chunk_kimi_delta_attention``) at 16k and 64k tokens, one thread, 4 heads of 128 (their models'
head size), float32, q and k L2-normalised in the kernel; a decoding step against their
recurrent step (``torch_recurrent_gated_delta_rule``, ``recurrent_kimi_delta_attention``);
flash-linear-attention's naive chunk references where ``fla`` is installed; and the peak memory
of rotary's call beyond its output, in a fresh process.  transformers' functions are the code
those models run without ``fla`` (its torch fallback): each does the same math as rotary in
float32 (the rows check the outputs agree before timing them).  Where transformers' reference
would need more than half the machine's memory (KDA at 64k tokens: a ``(B, H, N/64, 64, 64, d_k)``
decay tensor, three at once, 24 GiB in 4 heads), both sides run with as many heads as fit, and
the row says so (rotary alone where not even one head fits).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from typing import Any

from ._timing import compare

SECTION = "linear-attention families"
HEADS, D = 4, 128
SIZES, SIZES_QUICK = (16384, 65536), (2048,)
TARGET, STEP_TARGET, MEMORY_TARGET = 1.0, 1.2, 0.25


def _row(
    case: str, ms: float | None, baseline: str | None, ratio: float | None, target: float | None
) -> dict:
    return {
        "section": SECTION,
        "backend": "torch",
        "case": case,
        "ms": ms,
        "baseline": baseline,
        "ratio": ratio,
        "target": target,
        "floor_ratio": None,
        "floor_target": None,
        "ok": None if ratio is None or target is None else ratio <= target,
    }


def _inputs(n: int, per_feature: bool, seed: int = 0, heads: int = HEADS) -> tuple[Any, ...]:
    import torch

    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, n, heads, D, generator=g) for _ in range(3))
    beta = torch.rand(1, n, heads, generator=g)
    shape = (1, n, heads, D) if per_feature else (1, n, heads)
    lg = -torch.rand(*shape, generator=g) * 0.2
    return q, k, v, lg, beta


def _rotary(q: Any, k: Any, v: Any, lg: Any, beta: Any, state: Any = None) -> Any:
    import rotary

    t = lambda x: x.transpose(1, 2)  # noqa: E731  (the layers' (B, N, H, d) as rotary's (B, H, N, d))
    return rotary.linear_attention(
        t(q),
        t(k),
        t(v),
        causal=True,
        normalize=False,
        log_gate=t(lg),
        beta=t(beta),
        qk_l2norm=True,
        scale=q.shape[-1] ** -0.5,
        state=state,
        return_state=state is not None,
    )


def _references() -> dict[str, tuple[Callable[..., Any], Callable[..., Any]]] | None:
    try:
        from transformers.models.kimi_linear import modeling_kimi_linear as kl
        from transformers.models.qwen3_next import modeling_qwen3_next as qn
    except ImportError:
        return None
    return {
        "gated delta rule": (qn.torch_chunk_gated_delta_rule, qn.torch_recurrent_gated_delta_rule),
        "KDA": (kl.chunk_kimi_delta_attention, kl.recurrent_kimi_delta_attention),
    }


def _fla_naive() -> dict[str, Callable[..., Any]]:
    out: dict[str, Callable[..., Any]] = {}
    try:
        from fla.ops.gated_delta_rule.naive import naive_chunk_gated_delta_rule  # type: ignore[import-not-found]

        out["gated delta rule"] = naive_chunk_gated_delta_rule
    except ImportError:
        pass
    return out


def _agree(a: Any, b: Any) -> None:
    a = a.transpose(1, 2)  # (rotary's (B, H, N, d) as the layers' (B, N, H, d))
    err = float((a - b).abs().max())
    scale = float(b.abs().max())
    if not err <= 1e-4 * max(1.0, scale):
        raise AssertionError(f"rotary and the reference differ by {err} (scale {scale})")


def _reference_bytes(name: str, n: int, heads: int = HEADS, chunk: int = 64) -> int:
    """Peak memory of transformers' chunked reference at ``n`` tokens (float32): KDA's intra-chunk
    decay is a ``(B, H, N / C, C, C, d_k)`` tensor, and its first product holds three of them."""
    if name != "KDA":
        return 0
    return 3 * heads * n * chunk * D * 4


def _heads_that_fit(name: str, n: int) -> int:
    """The most heads (at most :data:`HEADS`) for which transformers' reference needs at most half
    of this machine's memory (its other buffers and rotary's beside it); 0: not even one."""
    return next((h for h in range(HEADS, 0, -1) if _reference_bytes(name, n, h) <= _memory_bytes() // 2), 0)


def _memory_bytes() -> int:
    import os

    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def chunk_rows(quick: bool, reps: int, verbose: bool = True) -> list[dict]:
    refs = _references()
    if refs is None:
        return []
    import torch

    rows = []
    fla = _fla_naive()
    for n in SIZES_QUICK if quick else SIZES:
        for name, (chunk, _) in refs.items():
            pf = name == "KDA"
            heads = _heads_that_fit(name, n)
            q, k, v, lg, beta = _inputs(n, pf, heads=max(heads, 1))
            ref_name = f"transformers {chunk.__name__}"

            def ours(q: Any = q, k: Any = k, v: Any = v, lg: Any = lg, beta: Any = beta) -> Any:
                return _rotary(q, k, v, lg, beta)

            def theirs(
                q: Any = q, k: Any = k, v: Any = v, lg: Any = lg, beta: Any = beta, chunk: Any = chunk
            ) -> Any:
                return chunk(q, k, v, g=lg, beta=beta, use_qk_l2norm_in_kernel=True)[0]

            case = f"{name} N={n}, {max(heads, 1)} head{'s' * (heads != 1)} of {D}"
            if heads < HEADS:  # (the reference in HEADS heads would be killed for memory, and this process)
                need = _reference_bytes(name, n)
                case += (
                    f" ({ref_name} in {HEADS} heads needs {need / 2**30:.1f} GiB of this machine's "
                    f"{_memory_bytes() / 2**30:.1f} GiB)"
                )
            if not heads:
                t = compare({"rotary": ours}, reps=2, warmup=0)
                rows.append(_row(f"{case}: rotary alone", t["rotary"] * 1e3, None, None, None))
                continue
            with torch.no_grad():
                _agree(ours(), theirs())
                cases = {"rotary": ours, ref_name: theirs}
                if name in fla:
                    f = fla[name]
                    cases["fla naive"] = lambda f=f, q=q, k=k, v=v, lg=lg, beta=beta: f(q, k, v, lg, beta)
                big = n > 20000  # (64k tokens: two interleaved rounds)
                t = compare(cases, reps=2 if big else max(3, reps // 3), warmup=0 if big else 1)
            rows.append(
                _row(f"{case}: rotary", t["rotary"] * 1e3, ref_name, t.ratio("rotary", ref_name), TARGET)
            )
            rows.append(_row(f"{case}: {ref_name}", t[ref_name] * 1e3, None, None, None))
            if "fla naive" in cases:
                rows.append(
                    _row(
                        f"{case}: rotary vs fla naive",
                        t["rotary"] * 1e3,
                        "fla naive",
                        t.ratio("rotary", "fla naive"),
                        None,
                    )
                )
            if verbose:
                print(
                    f"{case}: rotary {t['rotary'] * 1e3:.0f} ms, {ref_name} {t[ref_name] * 1e3:.0f} ms",
                    file=sys.stderr,
                )
    return rows


def step_rows(quick: bool, reps: int) -> list[dict]:
    refs = _references()
    if refs is None:
        return []
    import torch

    import rotary

    rows = []
    for name, (_, recurrent) in refs.items():
        pf = name == "KDA"
        q, k, v, lg, beta = _inputs(1, pf, seed=1)
        S = torch.randn(1, HEADS, D, D, generator=torch.Generator().manual_seed(2)) * 0.1
        state = rotary.LinearAttentionState(S, None, 0)

        def ours(
            q: Any = q, k: Any = k, v: Any = v, lg: Any = lg, beta: Any = beta, state: Any = state
        ) -> Any:
            return _rotary(q, k, v, lg, beta, state)

        def theirs(
            q: Any = q, k: Any = k, v: Any = v, lg: Any = lg, beta: Any = beta, rec: Any = recurrent
        ) -> Any:
            return rec(
                q,
                k,
                v,
                g=lg,
                beta=beta,
                initial_state=S,  # noqa: B023  (read within the iteration)
                output_final_state=True,
                use_qk_l2norm_in_kernel=True,
            )

        with torch.no_grad():
            _agree(ours()[0], theirs()[0])
            t = compare({"rotary": ours, "theirs": theirs}, reps=reps, warmup=20, inner=50)
        ref_name = f"transformers {recurrent.__name__}"
        case = f"{name} decoding step, {HEADS} heads of {D}"
        rows.append(
            _row(f"{case}: rotary", t["rotary"] * 1e3, ref_name, t.ratio("rotary", "theirs"), STEP_TARGET)
        )
        rows.append(_row(f"{case}: {ref_name}", t["theirs"] * 1e3, None, None, None))
    return rows


_MEMORY = """
import ctypes, os, threading, time, torch, rotary
torch.set_num_threads(1)
from benchmarks.linear_families import _inputs, _rotary
q, k, v, lg, beta = _inputs({n}, {pf})
def rss():
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
with torch.no_grad():
    _rotary(*_inputs(1024, {pf}))
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    peak, done = [rss()], threading.Event()
    def sample():
        while not done.is_set():
            peak.append(rss())
            time.sleep(0.0005)
    th = threading.Thread(target=sample)
    th.start()
    out = _rotary(q, k, v, lg, beta)
    done.set()
    th.join()
out_bytes = out.numel() * out.element_size()
print((max(peak) - peak[0] - out_bytes) / 2**20, out_bytes / 2**20)
"""


def memory_rows(quick: bool) -> list[dict]:
    if _references() is None:
        return []
    n = SIZES_QUICK[0] if quick else SIZES[0]
    rows = []
    for name, pf in (("gated delta rule", False), ("KDA", True)):
        res = subprocess.run(
            [sys.executable, "-c", _MEMORY.format(n=n, pf=pf)], capture_output=True, text=True, timeout=900
        )
        if res.returncode != 0:
            continue
        extra, out = (float(x) for x in res.stdout.split()[-2:])
        rows.append(
            _row(
                f"{name} N={n}: peak memory beyond the output {extra:.1f} MiB (resident set)",
                None,
                f"output ({out:.0f} MiB)",
                max(extra, 0.0) / out,
                MEMORY_TARGET,
            )
        )
    return rows


def bench_families(quick: bool, reps: int) -> list[dict]:
    """The section's rows (``python3 -m benchmarks --only families``)."""
    return chunk_rows(quick, reps) + step_rows(quick, reps) + memory_rows(quick)
