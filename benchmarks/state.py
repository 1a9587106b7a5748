"""What each piece of rotary's state earns: every realistic call timed with all state and with
one kind of state switched off (``rotary._lib._cache.without``), side by side in one run.

A kind of state is kept only if it gains at least 1.15x (time without / time with) on one of
the realistic shapes: a decoding step (1 token, 32 query and 8 key/value heads of 128) at
position 4095 and at 100,000 (a long context), and a 4k prefill (1, 32, 4096, 128), on NumPy
and torch (and a JAX decoding step for the jitted programs).  ``docs/guides/state.rst`` lists
each kind with its key and bound.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

import rotary
from rotary._lib._cache import STATE_KINDS, without

from ._timing import compare
from .rope import DECODE_K, DECODE_POS, DECODE_Q, PREFILL, PREFILL_QUICK

#: The gain a kind of state must show on one realistic shape to be kept.
KEEP = 1.15

#: A decoding position of a long context (past the per-position table of 32k positions).
LONG_POS = 100_000

#: The kinds each scenario can exercise (the others cannot change its time).
_DECODE = ("constants", "position_table", "signatures", "plans", "namespaces")


def _scenarios(quick: bool) -> list[tuple[str, tuple[str, ...], Callable[[], Any]]]:
    rng = np.random.default_rng(3)
    out: list[tuple[str, tuple[str, ...], Callable[[], Any]]] = []
    dq = rng.standard_normal(DECODE_Q, dtype=np.float32)
    dk = rng.standard_normal(DECODE_K, dtype=np.float32)
    dp = np.array([DECODE_POS])
    shape = PREFILL_QUICK if quick else PREFILL
    pq = rng.standard_normal(shape, dtype=np.float32)
    pk = rng.standard_normal((shape[0], shape[1] // 4, *shape[2:]), dtype=np.float32)
    pp = np.arange(shape[-2])
    rope = rotary.RoPE(DECODE_Q[-1])
    # a linear-attention decoding step: 4 heads of 64, from the state of 4096 tokens
    lin_q, lin_k, lin_v = (rng.standard_normal((1, 4, 1, 64), dtype=np.float32) for _ in range(3))
    lin_S = rng.standard_normal((1, 4, 64, 64), dtype=np.float32)
    lin_z = rng.random((1, 4, 64), dtype=np.float32) * 4096
    libs: list[tuple[str, Callable[[np.ndarray], Any]]] = [("numpy", lambda a: a)]
    try:
        import torch

        libs.append(("torch", torch.from_numpy))
    except ImportError:  # pragma: no cover
        pass
    for lib, conv in libs:
        q, k, p = conv(dq), conv(dk), conv(dp)
        decode = (*_DECODE, "decode_rows")
        out.append((f"{lib} decode RoPE.apply", decode, lambda q=q, k=k, p=p: rope.apply(q, k, p)))
        out.append(
            (f"{lib} decode rotary.apply", (*decode, "ropes"), lambda q=q, k=k, p=p: rotary.apply(q, k, p))
        )
        far = conv(np.array([LONG_POS]))  # long context: past the per-position table
        out.append(
            (
                f"{lib} decode at {LONG_POS} RoPE.apply",
                ("constants", "signatures", "namespaces"),
                lambda q=q, k=k, p=far: rope.apply(q, k, p),
            )
        )
        lq, lk, lv = (conv(x) for x in (lin_q, lin_k, lin_v))
        lst = rotary.LinearAttentionState(conv(lin_S), conv(lin_z), 4096)
        out.append(
            (
                f"{lib} decode linear_attention",
                ("constants", "position_table", "decode_rows", "signatures", "plans", "namespaces"),
                lambda q=lq, k=lk, v=lv, st=lst: rotary.linear_attention(
                    q, k, v, 4096, causal=True, state=st, return_state=True
                ),
            )
        )
        q, k, p = conv(pq), conv(pk), conv(pp)
        out.append(
            (
                f"{lib} {shape[-2]} prefill RoPE.apply",
                ("constants", "position_table", "signatures", "namespaces"),
                lambda q=q, k=k, p=p: rope.apply(q, k, p),
            )
        )
    out += _hf_scenarios()
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:  # pragma: no cover
        return out
    q, k, p = jnp.asarray(dq), jnp.asarray(dk), jnp.asarray(dp)
    out.append(
        (
            "jax decode RoPE.apply",
            ("jit", "constants", "position_table", "namespaces"),
            lambda q=q, k=k, p=p: jax.block_until_ready(rope.apply(q, k, p)),
        )
    )
    return out


def _hf_scenarios() -> list[tuple[str, tuple[str, ...], Callable[[], Any]]]:
    """A patched Llama 3.1 rotary embedding module's decoding step at position 100,000 of its
    131,072-position context (the rows of its block of 4096 positions are ``position_table``)."""
    try:
        import copy
        import sys
        from pathlib import Path

        import torch
        import transformers
    except ImportError:  # pragma: no cover
        return []
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from hf_families import BY_NAME  # (tests/: the published Llama 3.1 config.json)

    transformers.logging.set_verbosity_error()
    small = dict(hidden_size=256, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=1)
    small |= dict(intermediate_size=512, vocab_size=1024)
    cfg = transformers.AutoConfig.for_model(**{**copy.deepcopy(BY_NAME["Llama 3.1"].config), **small})
    model = rotary.hf.patch(transformers.AutoModelForCausalLM.from_config(cfg).eval(), angles="exact")
    module = model.model.rotary_emb
    x, p = torch.zeros(1, 1, cfg.hidden_size), torch.tensor([[LONG_POS]])
    return [
        (
            f"torch hf.patch decode at {LONG_POS} rotary_emb",
            ("constants", "position_table", "namespaces"),
            lambda: module(x, p),
        )
    ]


#: A call in a context must cost at most this much more than in the plain one.
CONTEXT_TARGET = 1.2


def _contexts() -> list[tuple[str, str, Callable[[], Any], Callable[[], Any]]]:
    """``(backend, case, in the context, plain)``: a decoding step inside a context a server runs
    in (torch's inference mode, ``jax.default_device``) beside the same step in the plain one.
    Each side has its own RoPE (bases 10000 and 10000.5: the same work), so that what one side
    keeps (checked signatures, plans, constants) cannot serve the other: a context that kept
    nothing would show its full cost."""
    rng = np.random.default_rng(5)
    dq = rng.standard_normal(DECODE_Q, dtype=np.float32)
    dk = rng.standard_normal(DECODE_K, dtype=np.float32)
    inside, plain = rotary.RoPE(DECODE_Q[-1]), rotary.RoPE(DECODE_Q[-1], base=10000.5)
    out: list[tuple[str, str, Callable[[], Any], Callable[[], Any]]] = []
    try:
        import torch

        q, k, p = torch.from_numpy(dq), torch.from_numpy(dk), torch.tensor([DECODE_POS])

        def inference() -> Any:
            with torch.inference_mode():
                return inside.apply(q, k, p)

        def no_grad() -> Any:
            with torch.no_grad():
                return plain.apply(q, k, p)

        out.append(("torch", "decode RoPE.apply under inference_mode (vs no_grad)", inference, no_grad))
    except ImportError:  # pragma: no cover
        pass
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:  # pragma: no cover
        return out
    jq, jk, jp = jnp.asarray(dq), jnp.asarray(dk), jnp.asarray(np.array([DECODE_POS]))
    dev = jax.devices()[0]

    def on_default() -> Any:
        with jax.default_device(dev):
            return jax.block_until_ready(inside.apply(jq, jk, jp * 0.5))

    def default() -> Any:
        return jax.block_until_ready(plain.apply(jq, jk, jp * 0.5))

    out.append(("jax", "decode RoPE.apply inside jax.default_device (vs none)", on_default, default))
    return out


def bench_contexts(reps: int) -> list:
    """Rows ``<context> / plain`` for :func:`_contexts`, against :data:`CONTEXT_TARGET`."""
    rows: list = []
    for backend, case, ctx, plain in _contexts():
        times = compare({"context": ctx, "plain": plain}, reps=reps, warmup=50, inner=100)
        ratio = times.ratio("context", "plain")
        rows.append(
            {
                "section": "state",
                "backend": backend,
                "case": case,
                "ms": times["context"] * 1e3,
                "baseline": f"plain ({times['plain'] * 1e3:.4g} ms)",
                "ratio": ratio,
                "target": CONTEXT_TARGET,
                "floor_ratio": None,
                "floor_target": None,
                "ok": ratio <= CONTEXT_TARGET,
            }
        )
    return rows


def _off(fn: Callable[[], Any], *kinds: Any) -> Callable[[], Any]:
    def run() -> Any:
        with without(*kinds):
            return fn()

    return run


def bench_state(quick: bool, reps: int) -> list:
    """Rows ``<scenario>: without <kind>`` (ratio: time without / time with all state), then one
    verdict row per kind: its best gain, against :data:`KEEP`."""
    rows: list = []
    best: dict[str, tuple[float, str]] = {}
    for name, kinds, fn in _scenarios(quick):
        cases = {"all state": _off(fn)}
        cases.update({f"without {k}": _off(fn, k) for k in kinds})
        prefill = "prefill" in name
        times = compare(cases, reps=reps, warmup=3 if prefill else 50, inner=1 if prefill else 100)
        for k in kinds:
            gain = times.ratio(f"without {k}", "all state")
            rows.append(
                {
                    "section": "state",
                    "backend": name.split(" ")[0],
                    "case": f"{name}: without {k}",
                    "ms": times[f"without {k}"] * 1e3,
                    "baseline": f"all state ({times['all state'] * 1e3:.4g} ms)",
                    "ratio": gain,
                    "target": None,
                    "floor_ratio": None,
                    "floor_target": None,
                    "ok": None,
                }
            )
            if gain > best.get(k, (0.0, ""))[0]:
                best[k] = (gain, name)
    for k in STATE_KINDS:
        gain, where = best.get(k, (None, "not exercised"))
        rows.append(
            {
                "section": "state",
                "backend": "kept if",
                "case": f"{k}: best gain ({where})",
                "ms": None,
                "baseline": None,
                "ratio": gain,
                "target": KEEP,
                "cmp": ">=",
                "floor_ratio": None,
                "floor_target": None,
                "ok": None if gain is None else gain >= KEEP,
            }
        )
    return rows + bench_contexts(reps)
