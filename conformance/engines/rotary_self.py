"""rotary itself as an engine: the RoPE ``rotary.hf`` reads from a config, in Hugging Face's float32
recipe (``angles="float32"``) or exact angles (``ROTARY_ANGLES=exact``).

The kit's check of itself on every census family (``tests/test_model_check.py``), and the template
of an adapter: build the engine's RoPE from the config as the engine does, rotate NumPy ``q``/``k``
``(tokens, heads, head_dim)`` at ``positions`` ``(tokens,)`` (``(rows, tokens)`` for M-RoPE), report
the angle recipe, the softmax scale and the query scale the engine applies.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np

import rotary
from rotary.testing.engine import Unsupported, round_to

NAME = "rotary"
PYTHON = "3.11"
INSTALL = 'pip install -e "$ROTARY" array-api-compat  # (released: pip install rotary)'

__all__ = ["INSTALL", "NAME", "PYTHON", "build", "version"]


def version() -> str:
    return rotary.__version__


class _Rope:
    def __init__(self, config: Mapping[str, Any], layer_type: str | None, dtype: str, angles: str) -> None:
        self.model = rotary.hf.model_rope(config, angles=angles)  # type: ignore[arg-type]
        layers = [
            (i, r)
            for i, r in enumerate(self.model.layers)
            if r is not None and (layer_type is None or self.model.layer_types[i] == layer_type)
        ]
        if layers:
            self.index, self.rope = layers[0]
        else:
            self.index = 0
            try:
                self.rope = rotary.hf.mrope_from_hf(config, angles=angles)  # type: ignore[arg-type]
            except ValueError:
                self.rope = rotary.hf.from_hf(config, angles=angles, layer_type=layer_type)  # type: ignore[arg-type]
        self.angles = "float32" if angles == "float32" else "exact"
        self.dtype = dtype
        self.softmax_scale = float(self.model.attention.get("softmax_scale_multiplier", 1.0))

    def rotate(self, q: np.ndarray, k: np.ndarray, positions: np.ndarray) -> tuple[Any, Any]:
        """NumPy has no bfloat16: there rotary computes in float32 and the result is rounded to
        bfloat16, as a kernel loading and storing bfloat16 does."""
        p = positions[..., None]
        if self.dtype != "bfloat16":
            dt = np.float16 if self.dtype == "float16" else np.float32
            return self.rope.apply(q.astype(dt), k.astype(dt), p)
        return tuple(round_to(x, "bfloat16") for x in self.rope.apply(q, k, p))

    def rotate_packed(
        self, q: np.ndarray, k: np.ndarray, cu_seqlens: np.ndarray, offsets: np.ndarray
    ) -> tuple[Any, Any]:
        """Documents packed in one row: rotary's positions of the packing (restarting at 0 in each
        document, :func:`rotary.positions.from_cu_seqlens`) plus each document's offset."""
        if isinstance(self.rope, rotary.MRoPE):
            raise Unsupported("M-RoPE: a packed row's documents imply one position per token")
        pos = rotary.positions.from_cu_seqlens(cu_seqlens) + np.repeat(offsets, np.diff(cu_seqlens))
        return self.rotate(q, k, pos)

    def query_scale(self, positions: np.ndarray) -> Any:
        return self.model.query_scale(self.index, positions) if self.model.layers else None


def build(config: Mapping[str, Any], *, layer_type: str | None, dtype: str) -> _Rope:
    return _Rope(config, layer_type, dtype, os.environ.get("ROTARY_ANGLES", "float32"))
