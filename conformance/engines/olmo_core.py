"""AI2's OLMo-core 3.0.0 (``ai2-olmo-core``): ``olmo_core.nn.rope.RotaryEmbedding`` (the
``RoPEConfig`` default), called with ``start_pos`` as its attention layers call it.

Install (CPU, Python 3.11; tested in a fresh venv: torch 2.13.0 + numpy, then 60 s with rotary's
own editable install, 1.2 GB in all; the constraints keep pip from pulling a CUDA torch)::

    python3.11 -m venv venv && venv/bin/pip install torch==2.13.0 numpy
    venv/bin/pip install -c "$ROTARY/.ci/constraints.txt" ai2-olmo-core==3.0.0

Imported as ``conformance.engines.olmo_core`` (no clash with the engine's package, imported only
inside the functions).

Config
------
OLMo-core builds its models from its own ``TransformerConfig`` (builders such as
``TransformerConfig.llama2_7B``): it reads no Hugging Face config.  It maps its RoPE to one the
other way, on export: each scaling's ``to_hf_config`` (``PIRoPEScalingConfig`` -> ``linear``,
``StepwiseRoPEScalingConfig`` -> ``llama3`` with ``low_freq_factor = 1 / (1 -
low_freq_proportion)`` and ``high_freq_factor = 1 / high_freq_proportion``,
``YaRNRoPEScalingConfig`` -> ``yarn`` with ``attention_factor = 0.1 ln(factor) + 1``).  The
adapter reads the config's meaning (:func:`rotary.testing.engine.config_rope`) and inverts that
mapping: ``RoPEConfig(theta=rope_theta, partial_rotary_factor=..., scaling=...)`` built for the
head size.  What it cannot express is ``Unsupported``: dynamic NTK, LongRoPE, M-RoPE, a query
scale, and YaRN whose attention factor is not ``0.1 ln(factor) + 1`` (mscale keys, an explicit
``attention_factor``) or whose ramp is not truncated (``truncate: false``: OLMo-core floors and
ceils the ramp's bounds).

Layout and offsets.  ``RotaryEmbedding._rotate_half`` splits the head in halves: Hugging Face's
layout, which OLMo-core's checkpoint converter (``olmo_core.nn.hf.convert``) keeps.  An
interleaved checkpoint (GPT-J), for which it ships no converter, is permuted as a port must
(:func:`rotary.testing.engine.converter_order`).  ``forward(q, k, head_first=True,
start_pos=...)`` takes an offset, not positions: the adapter calls it once per run of consecutive
positions (:func:`rotary.testing.engine.offset_runs`), the run's first position as ``start_pos``.
Its sin/cos table is float32 (``arange`` in float32: exact positions), built up to ``start_pos +
seq_len`` and cached, and ``full_precision=True`` (the default) rotates in float32.

Packed input.  ``forward(..., cu_doc_lens=...)`` restarts positions at each document's start
(``rotate_packed``); it refuses ``start_pos`` with it ("mutually exclusive"), so per-document
offsets are not applicable.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from rotary.scaling import Default, Linear, Llama3, YaRN
from rotary.testing.engine import Unsupported, config_rope, converter_order, offset_runs

NAME = "olmo-core"
PYTHON = "3.11"
INSTALL = (
    "python3.11 -m venv $ENGINES/olmo_core/venv && . $ENGINES/olmo_core/venv/bin/activate\n"
    "pip install torch==2.13.0 numpy\n"
    'pip install -c "$ROTARY/.ci/constraints.txt" ai2-olmo-core==3.0.0\n'
    'pip install --no-deps -e "$ROTARY" array-api-compat'
)

__all__ = ["INSTALL", "NAME", "PYTHON", "build", "version"]


def version() -> str:
    """OLMo-core's version; ``ImportError`` with the recipe when it is missing."""
    try:
        from importlib.metadata import version as _v

        import olmo_core.nn.rope  # noqa: F401
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(f"ai2-olmo-core is not installed; install it with:\n{INSTALL}") from e
    return _v("ai2-olmo-core")


class OlmoCoreRope:
    """``RotaryEmbedding.forward(q, k, start_pos=...)`` on ``(1, heads, tokens, head_dim)``."""

    angles = "float32"
    softmax_scale = 1.0

    def __init__(self, module: Any, order: np.ndarray, dtype: str) -> None:
        import torch

        self.module, self.order, self.back = module, order, np.argsort(order)
        self.dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]

    def _in(self, x: np.ndarray) -> Any:
        import torch

        t = np.ascontiguousarray(x[..., self.order].swapaxes(0, 1))[None]  # (1, heads, tokens, d)
        return torch.from_numpy(t).to(self.dtype)

    def _out(self, y: Any) -> np.ndarray:
        return np.ascontiguousarray(y[0].float().numpy().swapaxes(0, 1)[..., self.back])

    def rotate(self, q: np.ndarray, k: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(q, k)`` run by run: ``forward(q_run, k_run, head_first=True, start_pos=run start)``."""
        import torch

        positions = np.asarray(positions, dtype=np.int64)
        if positions.ndim != 1:
            raise Unsupported("olmo-core has no M-RoPE: positions must be (tokens,)")
        tq, tk = self._in(q), self._in(k)
        qs, ks = [], []
        with torch.no_grad():
            for a, b, offset in offset_runs(positions):
                qo, ko = self.module(tq[:, :, a:b], tk[:, :, a:b], head_first=True, start_pos=offset)
                qs.append(qo)
                ks.append(ko)
        return self._out(torch.cat(qs, dim=2)), self._out(torch.cat(ks, dim=2))

    def rotate_packed(
        self, q: np.ndarray, k: np.ndarray, cu_seqlens: np.ndarray, offsets: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """The packed row through ``forward(q, k, cu_doc_lens=cu_seqlens)`` (documents from 0)."""
        import torch

        if np.any(offsets):
            raise Unsupported(
                "olmo-core's cu_doc_lens restarts every document at 0: start_pos and cu_doc_lens are "
                "mutually exclusive (no per-document offsets)"
            )
        with torch.no_grad():
            qo, ko = self.module(
                self._in(q), self._in(k), head_first=True, cu_doc_lens=torch.from_numpy(cu_seqlens)
            )
        return self._out(qo), self._out(ko)


def _scaling(rope: Any) -> Any:
    """OLMo-core's scaling config for ``rope``'s scaling (its ``to_hf_config`` read backwards)."""
    from olmo_core.nn.rope import PIRoPEScalingConfig, StepwiseRoPEScalingConfig, YaRNRoPEScalingConfig

    sc = rope.config.scaling
    if isinstance(sc, Default):
        return None
    if isinstance(sc, Linear):
        return PIRoPEScalingConfig(factor=float(sc.factor))
    if isinstance(sc, Llama3):
        return StepwiseRoPEScalingConfig(
            factor=float(sc.factor),
            low_freq_proportion=1.0 - 1.0 / float(sc.low_freq_factor),
            high_freq_proportion=1.0 / float(sc.high_freq_factor),
            old_context_len=int(sc.original_max_position_embeddings),
        )
    if isinstance(sc, YaRN):
        why = []
        own = 0.1 * math.log(float(sc.factor)) + 1.0
        if abs(float(rope.config.attention_factor) / own - 1.0) > 1e-12:
            why.append(
                f"its attention factor is 0.1 ln(factor) + 1 = {own:.4f}, not the config's "
                f"{float(rope.config.attention_factor):.4f} (mscale keys or attention_factor)"
            )
        if not sc.truncate:
            why.append("its ramp's bounds are floored and ceiled (truncate=false not expressible)")
        if float(sc.beta_fast) != int(sc.beta_fast) or float(sc.beta_slow) != int(sc.beta_slow):
            why.append("beta_fast and beta_slow are integers")
        if why:
            raise Unsupported("olmo-core's YaRNRoPEScalingConfig: " + "; ".join(why))
        return YaRNRoPEScalingConfig(
            factor=float(sc.factor),
            beta_fast=int(sc.beta_fast),
            beta_slow=int(sc.beta_slow),
            old_context_len=int(sc.original_max_position_embeddings),
        )
    raise Unsupported(
        f"olmo-core has no {type(sc).__name__} scaling (its scalings: ABF, PI (linear), stepwise "
        "(Llama 3), YaRN)"
    )


def build(config: Mapping[str, Any], *, layer_type: str | None, dtype: str) -> OlmoCoreRope:
    """``RoPEConfig(...).build(head_size)`` for ``config`` (see the docstring)."""
    version()
    from olmo_core.nn.rope import RoPEConfig

    rope = config_rope(config, layer_type, "olmo-core")
    cfg = rope.config
    if cfg.partial != "neox":
        raise Unsupported("olmo-core has no proportional partial rotary")
    if float(cfg.base) != int(cfg.base):
        raise Unsupported(f"olmo-core's theta is an int (the config's base is {cfg.base:g})")
    module = RoPEConfig(
        theta=int(cfg.base), partial_rotary_factor=cfg.width / cfg.head_dim, scaling=_scaling(rope)
    ).build(cfg.head_dim)
    order = converter_order(cfg.layout, cfg.width, cfg.head_dim, engine="half")
    return OlmoCoreRope(module, order, dtype)
