"""RoPE benchmarks: prefill, decode step, table build, Hugging Face peer.

Each ``bench_*`` function returns a list of row dicts::

    {"section", "backend", "case", "ms", "baseline", "ratio", "target", "ok"}

``ratio`` is ``ms / baseline's ms`` measured in the same interleaved run; ``target`` is the
issue's goal for that ratio (``None`` for informational rows).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

import rotary

from ._timing import compare

PREFILL = (1, 32, 4096, 128)
PREFILL_QUICK = (1, 8, 1024, 128)
DECODE = (1, 32, 1, 128)
DECODE_POS = 4095
TABLE_POSITIONS = 131072


def _rows(section: str, backend: str, times: dict, baselines: dict[str, tuple[str, float | None]]) -> list:
    rows = []
    for case, t in times.items():
        base, target = baselines.get(case, (None, None))
        ratio = times.ratio(case, base) if base is not None else None
        rows.append(
            {
                "section": section,
                "backend": backend,
                "case": case,
                "ms": t * 1e3,
                "baseline": base,
                "ratio": ratio,
                "target": target,
                "ok": None if target is None or ratio is None else bool(ratio <= target),
            }
        )
    return rows


# -- hand-written formulas (what users write without rotary) -------------------------------------
def _rotate_half_np(x: Any) -> Any:
    h = x.shape[-1] // 2
    return np.concatenate([-x[..., h:], x[..., :h]], axis=-1)


def _rotate_every_two_np(x: Any) -> Any:
    return np.stack([-x[..., 1::2], x[..., 0::2]], axis=-1).reshape(x.shape)


def _rotate_half_torch(x: Any) -> Any:
    import torch

    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def _rotate_every_two_torch(x: Any) -> Any:
    import torch

    return torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)


def _rotate_half_jax(x: Any) -> Any:
    import jax.numpy as jnp

    h = x.shape[-1] // 2
    return jnp.concatenate([-x[..., h:], x[..., :h]], axis=-1)


def _rotate_every_two_jax(x: Any) -> Any:
    import jax.numpy as jnp

    return jnp.stack([-x[..., 1::2], x[..., 0::2]], axis=-1).reshape(x.shape)


_ROT = {
    ("numpy", "half"): _rotate_half_np,
    ("numpy", "interleaved"): _rotate_every_two_np,
    ("torch", "half"): _rotate_half_torch,
    ("torch", "interleaved"): _rotate_every_two_torch,
    ("jax", "half"): _rotate_half_jax,
    ("jax", "interleaved"): _rotate_every_two_jax,
}


def _hand(lib: str, layout: str) -> Callable:
    rot = _ROT[(lib, layout)]

    def f(q: Any, k: Any, cos: Any, sin: Any) -> tuple:
        return q * cos + rot(q) * sin, k * cos + rot(k) * sin

    return f


# -- 1. prefill ----------------------------------------------------------------------------------
def bench_prefill(quick: bool, reps: int) -> list:
    shape = PREFILL_QUICK if quick else PREFILL
    rng = np.random.default_rng(0)
    qn = rng.standard_normal(shape, dtype=np.float32)
    kn = rng.standard_normal(shape, dtype=np.float32)
    posn = np.arange(shape[-2], dtype=np.int64)
    rows = []
    for backend in ("numpy", "torch eager", "torch.compile", "jax.jit"):
        try:
            rows += _prefill_backend(backend, qn, kn, posn, reps)
        except ImportError as e:  # pragma: no cover - optional backends
            rows.append({"section": "prefill", "backend": backend, "case": f"skipped: {e}"})
    return rows


def _prefill_backend(backend: str, qn: Any, kn: Any, posn: Any, reps: int) -> list:
    cases: dict[str, Callable] = {}
    base: dict[str, tuple[str, float | None]] = {}
    target = {"numpy": 0.75, "torch eager": None, "torch.compile": 1.1, "jax.jit": 1.1}[backend]
    lib = backend.split(" ")[0].split(".")[0]
    for layout in ("half", "interleaved"):
        rope = rotary.RoPE(qn.shape[-1], layout=layout)
        cn, sn = rope.cos_sin(posn, full=True)
        hand = _hand(lib, layout)
        if backend == "numpy":
            q, k, pos, c, s = qn, kn, posn, cn, sn

            def copy(q=q, k=k):
                return q.copy(), k.copy()

            def ours(q=q, k=k, pos=pos, rope=rope):
                return rope.apply(q, k, pos)

            def theirs(q=q, k=k, c=c, s=s, hand=hand):
                return hand(q, k, c, s)

        elif lib == "torch":
            import torch

            q, k, pos, c, s = (torch.from_numpy(a) for a in (qn, kn, posn, cn, sn))
            if backend == "torch eager":
                copy_f: Callable = lambda q, k: (q.clone(), k.clone())  # noqa: E731
                ours_f: Callable = rope.apply
                hand_f = hand
            else:
                copy_f = torch.compile(lambda q, k: (q.clone(), k.clone()), fullgraph=True)
                ours_f = torch.compile(rope.apply, fullgraph=True)
                hand_f = torch.compile(hand, fullgraph=True)

            def copy(q=q, k=k, f=copy_f):
                return f(q, k)

            def ours(q=q, k=k, pos=pos, f=ours_f):
                return f(q, k, pos)

            def theirs(q=q, k=k, c=c, s=s, f=hand_f):
                return f(q, k, c, s)

        else:
            import jax
            import jax.numpy as jnp

            q, k, pos, c, s = (jnp.asarray(a) for a in (qn, kn, posn, cn, sn))
            copy_j = jax.jit(lambda q, k: (-q, -k))
            ours_j = jax.jit(rope.apply)
            hand_j = jax.jit(hand)

            def copy(q=q, k=k, f=copy_j):
                return jax.block_until_ready(f(q, k))

            def ours(q=q, k=k, pos=pos, f=ours_j):
                return jax.block_until_ready(f(q, k, pos))

            def theirs(q=q, k=k, c=c, s=s, f=hand_j):
                return jax.block_until_ready(f(q, k, c, s))

        if layout == "half":
            cases["copy q,k (floor)"] = copy
        cases[f"rotary {layout}"] = ours
        cases[f"hand-written {layout}"] = theirs
        base[f"rotary {layout}"] = (f"hand-written {layout}", target)
        base[f"hand-written {layout}"] = ("copy q,k (floor)", None)
    times = compare(cases, reps=reps, warmup=2)
    rows = _rows("prefill", backend, times, base)
    for layout in ("half", "interleaved"):
        rows.append(
            _extra_row(
                "prefill", backend, f"rotary {layout} vs copy", times, f"rotary {layout}", "copy q,k (floor)"
            )
        )
    return rows


def _extra_row(section: str, backend: str, case: str, times: dict, a: str, b: str) -> dict:
    return {
        "section": section,
        "backend": backend,
        "case": case,
        "ms": None,
        "baseline": b,
        "ratio": times.ratio(a, b),
        "target": None,
        "ok": None,
    }


# -- 2. decode step ------------------------------------------------------------------------------
def bench_decode(quick: bool, reps: int) -> list:
    rng = np.random.default_rng(1)
    qn = rng.standard_normal(DECODE, dtype=np.float32)
    kn = rng.standard_normal(DECODE, dtype=np.float32)
    rope = rotary.RoPE(DECODE[-1])
    table_c, table_s = rope.cos_sin(np.arange(DECODE_POS + 1 + 4096), full=True)
    posn = np.array([DECODE_POS], dtype=np.int64)
    rows = []
    for backend in ("numpy", "torch eager"):
        hand = _hand(backend.split(" ")[0], "half")
        if backend == "numpy":
            q, k, pos, tc, ts = qn, kn, posn, table_c, table_s
        else:
            import torch

            q, k, pos, tc, ts = (torch.from_numpy(a) for a in (qn, kn, posn, table_c, table_s))

        def ours(q=q, k=k, pos=pos):
            return rope.apply(q, k, pos)

        def theirs(q=q, k=k, pos=pos, tc=tc, ts=ts, hand=hand):
            return hand(q, k, tc[pos], ts[pos])

        times = compare({"rotary": ours, "hand-written": theirs}, reps=reps, warmup=20, inner=50)
        rows += _rows("decode", backend, times, {"rotary": ("hand-written", 1.5)})
    return rows


# -- 3. table build ------------------------------------------------------------------------------
def bench_tables(quick: bool, reps: int) -> list:
    n = TABLE_POSITIONS
    rows = []
    for backend in ("numpy", "torch"):
        rope = rotary.RoPE(128)
        if backend == "numpy":
            pos = np.arange(n, dtype=np.int64)
            inv = rotary.RoPE(128, angles="float32").inv_freq(xp=np, dtype=np.float32)

            def plain(pos=pos, inv=inv):
                a = pos.astype(np.float32)[:, None] * inv
                return np.cos(a), np.sin(a)

        else:
            import torch

            pos = torch.arange(n, dtype=torch.int64)
            inv = 1.0 / (10000.0 ** (torch.arange(0, 128, 2, dtype=torch.int64).float() / 128))

            def plain(pos=pos, inv=inv):
                a = pos.float()[:, None] * inv
                return a.cos(), a.sin()

        def exact(pos=pos, rope=rope):
            return rope.cos_sin(pos)

        times = compare({"exact (rotary)": exact, "float32 recipe": plain}, reps=reps, warmup=1)
        rows += _rows("table 128k", backend, times, {"exact (rotary)": ("float32 recipe", 2.0)})
    return rows


# -- 4. Hugging Face apply_rotary_pos_emb --------------------------------------------------------
def bench_hf(quick: bool, reps: int) -> list:
    try:
        import torch
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
    except ImportError as e:
        return [{"section": "HF peer", "backend": "torch eager", "case": f"skipped: {e}"}]
    shape = PREFILL_QUICK if quick else PREFILL
    rng = np.random.default_rng(2)
    q = torch.from_numpy(rng.standard_normal(shape, dtype=np.float32))
    k = torch.from_numpy(rng.standard_normal(shape, dtype=np.float32))
    pos = torch.arange(shape[-2])
    rope = rotary.RoPE(shape[-1])
    c, s = rope.cos_sin(pos, full=True)
    c, s = c[None], s[None]  # (batch, seq, dim) as HF's rotary embedding returns them

    def ours():
        return rope.apply(q, k, pos)

    def hf():
        return apply_rotary_pos_emb(q, k, c, s)

    def copy():
        return q.clone(), k.clone()

    times = compare({"rotary": ours, "HF apply_rotary_pos_emb": hf, "copy q,k (floor)": copy}, reps=reps)
    return _rows(
        "HF peer",
        "torch eager",
        times,
        {"rotary": ("HF apply_rotary_pos_emb", 0.8), "HF apply_rotary_pos_emb": ("copy q,k (floor)", None)},
    )
