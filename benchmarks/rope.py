"""RoPE benchmarks: prefill, decode step, table build, Hugging Face peer.

Each ``bench_*`` function returns a list of row dicts::

    {"section", "backend", "case", "ms", "baseline", "ratio", "target",
     "floor_ratio", "floor_target", "ok"}

``ratio`` is ``ms / baseline's ms`` and ``floor_ratio`` is ``ms / the section's copy floor``
(one elementwise pass reading the inputs and writing the outputs), both medians of per-round
ratios measured in the same interleaved run (prefill: in rounds of the two cases alone, after
the rounds of all cases that give ``ms``); ``target`` and ``floor_target`` are the goals
for them (``None``: informational); ``ok`` is whether every goal of the row is met.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

import rotary

from ._timing import compare

PREFILL = (1, 32, 4096, 128)
PREFILL_QUICK = (1, 8, 1024, 128)
DECODE_Q = (1, 32, 1, 128)  # one token: 32 query heads ...
DECODE_K = (1, 8, 1, 128)  # ... and 8 key/value heads (grouped-query attention)
DECODE_POS = 4095
TABLE_POSITIONS = 131072


FLOOR = "copy q,k (floor)"


def _rows(
    section: str,
    backend: str,
    times: Any,
    peers: dict[str, tuple[str, float | None]],
    floor_targets: dict[str, float] | None = None,
    floor: str | None = FLOOR,
    pairs: dict[tuple[str, str], Any] | None = None,
) -> list:
    """One row per case: its ratio to its peer (``peers[case] = (peer, target)``) and to the
    section's copy floor (``floor_targets[case]``: the target of that ratio, if any), from
    ``pairs[(case, other)]`` where given (rounds of those two cases alone), else ``times``."""
    floor_targets = floor_targets or {}
    pairs = pairs or {}
    rows = []
    for case, t in times.items():
        base, target = peers.get(case, (None, None))
        ratio = pairs.get((case, base), times).ratio(case, base) if base is not None else None
        fl = floor if floor in times and case != floor else None
        floor_ratio = pairs.get((case, fl), times).ratio(case, fl) if fl is not None else None
        floor_target = floor_targets.get(case)
        checks = [(ratio, target), (floor_ratio, floor_target)]
        verdicts = [r <= tg for r, tg in checks if tg is not None and r is not None]
        rows.append(
            {
                "section": section,
                "backend": backend,
                "case": case,
                "ms": t * 1e3,
                "baseline": base,
                "ratio": ratio,
                "target": target,
                "floor_ratio": floor_ratio,
                "floor_target": floor_target,
                "ok": all(verdicts) if verdicts else None,
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
    # targets: (vs hand-written, vs the copy floor)
    target, floor_target = {
        "numpy": (0.75, None),
        "torch eager": (None, None),
        "torch.compile": (None, 1.1),
        "jax.jit": (1.0, 1.1),
    }[backend]
    floor_targets: dict[str, float] = {}
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
            cases[FLOOR] = copy
        cases[f"rotary {layout}"] = ours
        cases[f"hand-written {layout}"] = theirs
        base[f"rotary {layout}"] = (f"hand-written {layout}", target)
        if floor_target is not None:
            floor_targets[f"rotary {layout}"] = floor_target
    times = compare(cases, reps=reps, warmup=2)
    # Each ratio in rounds of its two cases alone: beside cases that allocate full-size
    # temporaries (the hand-written ones), a call pays for memory that is not its own (jax.jit
    # interleaved: 1.28-1.42x the floor among all five cases, 1.02-1.09x beside the floor alone).
    pairs = {
        (n, FLOOR): compare({FLOOR: cases[FLOOR], n: f}, reps=reps, warmup=1)
        for n, f in cases.items()
        if n != FLOOR
    }
    for n, (peer, _) in base.items():
        pairs[(n, peer)] = compare({n: cases[n], peer: cases[peer]}, reps=reps, warmup=1)
    return _rows("prefill", backend, times, base, floor_targets, pairs=pairs)


# -- 2. decode step ------------------------------------------------------------------------------
def _hf_step(q: Any, k: Any, pos: Any) -> Callable[[], tuple]:
    """Hugging Face's whole per-step RoPE: ``LlamaRotaryEmbedding`` forward (cos/sin of the
    step's position) + ``apply_rotary_pos_emb``."""
    import torch
    from transformers.models.llama.configuration_llama import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    config = LlamaConfig(
        hidden_size=q.shape[1] * q.shape[-1],
        num_attention_heads=q.shape[1],
        num_key_value_heads=k.shape[1],
        head_dim=q.shape[-1],
        max_position_embeddings=8192,
    )
    emb = LlamaRotaryEmbedding(config)
    position_ids = pos[None]  # (batch, seq)

    def step() -> tuple:
        with torch.no_grad():
            cos, sin = emb(k, position_ids)
            return apply_rotary_pos_emb(q, k, cos, sin)

    return step


def bench_decode(quick: bool, reps: int) -> list:
    """One token, 32 query and 8 key/value heads, head size 128, position 4095."""
    rng = np.random.default_rng(1)
    qn = rng.standard_normal(DECODE_Q, dtype=np.float32)
    kn = rng.standard_normal(DECODE_K, dtype=np.float32)
    rope = rotary.RoPE(DECODE_Q[-1])
    table_c, table_s = rope.cos_sin(np.arange(DECODE_POS + 1 + 4096), full=True)
    posn = np.array([DECODE_POS], dtype=np.int64)
    rows = []
    for backend in ("numpy", "torch eager"):
        lib = backend.split(" ")[0]
        hand = _hand(lib, "half")
        if backend == "numpy":
            q, k, pos, tc, ts = qn, kn, posn, table_c, table_s

            def copy(q=q, k=k):
                return q.copy(), k.copy()

        else:
            import torch

            q, k, pos, tc, ts = (torch.from_numpy(a) for a in (qn, kn, posn, table_c, table_s))

            def copy(q=q, k=k):
                return q.clone(), k.clone()

        def ours(q=q, k=k, pos=pos):
            return rope.apply(q, k, pos)

        def theirs(q=q, k=k, pos=pos, tc=tc, ts=ts, hand=hand):
            return hand(q, k, tc[pos], ts[pos])

        cases = {FLOOR: copy, "rotary": ours, "hand-written (tables)": theirs}
        peers: dict[str, tuple[str, float | None]] = {"rotary": ("hand-written (tables)", 1.3)}
        if lib == "torch":
            try:
                cases["HF per step"] = _hf_step(q, k, pos)
                rows_hf = True
            except ImportError:
                rows_hf = False
        times = compare(cases, reps=reps, warmup=20, inner=50)
        rows += _rows("decode", backend, times, peers)
        if lib == "torch" and rows_hf:
            r = _rows("decode", backend, times, {"rotary": ("HF per step", 0.6)})
            rows += [dict(x, case="rotary (vs HF)", ms=None) for x in r if x["case"] == "rotary"]
    return rows + _decode_loop_compiled(qn, kn, rope, reps)


#: Steps of the compiled decoding loop (positions 4095, 4096, ...).
LOOP_STEPS = 64


def _decode_loop_compiled(qn: Any, kn: Any, rope: Any, reps: int) -> list:
    """A decoding loop of :data:`LOOP_STEPS` steps under ``torch.compile`` (inductor), positions
    given as one-element tensors and as Python ints, beside the same loop run eagerly; each row
    names the number of graphs the loop compiled (one for tensors; two for Python ints, as
    ``p * inv_freq`` gets: Dynamo specialises the first value, then makes it symbolic)."""
    try:
        import torch
        from torch._dynamo.testing import CompileCounterWithBackend
    except ImportError:
        return []
    q, k = torch.from_numpy(qn), torch.from_numpy(kn)
    steps = range(DECODE_POS, DECODE_POS + LOOP_STEPS)
    rows = []
    for kind, make in (("tensor", lambda p: torch.tensor([p])), ("int", lambda p: p)):
        positions = [make(p) for p in steps]
        torch._dynamo.reset()
        counter = CompileCounterWithBackend("inductor")
        step = torch.compile(lambda q, k, p: rope.apply(q, k, p), backend=counter)

        def loop(f: Any, positions: list = positions) -> None:
            with torch.no_grad():
                for p in positions:
                    f(q, k, p)

        def eager(positions: list = positions) -> None:
            loop(rope.apply, positions)

        loop(step)  # (compiles: the graphs counted below, outside the timing)
        graphs = counter.frame_count
        name = f"compiled {LOOP_STEPS}-step loop ({kind} positions)"
        times = compare({name: lambda step=step: loop(step), "eager loop": eager}, reps=reps, warmup=1)
        r = _rows("decode", "torch compile", times, {name: ("eager loop", None)}, floor=None)
        rows += [
            dict(x, graphs=graphs, case=f"{name}: {graphs} graph{'s' if graphs > 1 else ''}")
            for x in r
            if x["case"] == name
        ]
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

        c0, s0 = exact()

        def copy(c0=c0, s0=s0):  # the floor: writing the two tables once
            return c0 * 1, s0 * 1

        cases = {"copy tables (floor)": copy, "exact (rotary)": exact, "float32 recipe": plain}
        times = compare(cases, reps=reps, warmup=1)
        peers = {"exact (rotary)": ("float32 recipe", 2.0)}
        rows += _rows("table 128k", backend, times, peers, floor="copy tables (floor)")
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

    times = compare({"rotary": ours, "HF apply_rotary_pos_emb": hf, FLOOR: copy}, reps=reps)
    return _rows("HF peer", "torch eager", times, {"rotary": ("HF apply_rotary_pos_emb", 0.8)})
