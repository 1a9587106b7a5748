"""lucidrains' x-transformers 2.31.10: ``RotaryEmbedding`` and ``apply_rotary_pos_emb`` as its
``Attention`` layers call them.

Install (CPU, Python 3.11; tested in a fresh venv: torch 2.13.0 + numpy, then 10 s with rotary's
own editable install: x-transformers, einx, einops, loguru, 975 MB in all)::

    python3.11 -m venv venv && venv/bin/pip install torch==2.13.0 numpy
    venv/bin/pip install -c "$ROTARY/.ci/constraints.txt" x-transformers==2.31.10

Imported as ``conformance.engines.x_transformers`` (no clash with the engine's package, imported
only inside the functions).

A library with no config reader and no model table
--------------------------------------------------
``Decoder(dim, depth, heads, rotary_pos_emb=True, rotary_emb_dim=..., rotary_interpolation_factor=...,
rotary_base_rescale_factor=...)`` builds one ``RotaryEmbedding(dim, interpolation_factor=1.0,
base=10000, base_rescale_factor=1.0)`` shared by every layer; nothing reads a ``config.json`` or
names a model.  As for rotary-embedding-torch, the adapter takes the config's meaning from
:func:`rotary.testing.engine.config_rope` and maps it onto the arguments a user porting the
checkpoint writes: ``dim`` = the rotated features (``rotary_emb_dim``: x-transformers' default is
half the head, ``dim_head // 2``, so a port of a whole-head RoPE must set it), ``base`` =
the base, ``interpolation_factor`` = linear scaling's factor.  Anything else (YaRN, Llama 3,
LongRoPE, dynamic NTK: ``base_rescale_factor`` is a fixed NTK-aware base; M-RoPE; an attention
factor; a query scale) is ``Unsupported``.

Layout.  ``rotate_half`` splits ``(d r)``, ``r = 2``: adjacent pairs ``(2i, 2i+1)``.  No converter
ships: the adapter applies the q/k permutation of llama.cpp's and Meta's converters to half-layout
checkpoints (:func:`rotary.testing.engine.converter_order`) and its inverse to the outputs.

Positions.  ``RotaryEmbedding.forward(t)`` takes the positions themselves (``AttentionLayers``
passes ``pos``, or ``arange`` plus the cache's length), cast to float32 (``t.type_as(inv_freq)``);
``inv_freq`` and the product are float32 and the angle is divided by ``interpolation_factor``
after the product.  ``apply_rotary_pos_emb`` rotates in float32 and casts to the data's dtype.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from rotary.scaling import Default, Linear
from rotary.testing.engine import Unsupported, config_rope, converter_order

NAME = "x-transformers"
PYTHON = "3.11"
INSTALL = (
    "python3.11 -m venv $ENGINES/x_transformers/venv && . $ENGINES/x_transformers/venv/bin/activate\n"
    "pip install torch==2.13.0 numpy\n"
    'pip install -c "$ROTARY/.ci/constraints.txt" x-transformers==2.31.10\n'
    'pip install --no-deps -e "$ROTARY" array-api-compat'
)

__all__ = ["INSTALL", "NAME", "PYTHON", "build", "version"]


def version() -> str:
    """x-transformers' version; ``ImportError`` with the recipe when it is missing."""
    try:
        from importlib.metadata import version as _v

        import x_transformers  # noqa: F401
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(f"x-transformers is not installed; install it with:\n{INSTALL}") from e
    return _v("x-transformers")


class XTransformersRope:
    """``apply_rotary_pos_emb(t, *RotaryEmbedding(positions))`` on Hugging Face-layout ``q``/``k``."""

    angles = "float32"
    softmax_scale = 1.0

    def __init__(self, module: Any, order: np.ndarray, dtype: str) -> None:
        import torch

        self.module, self.order, self.back = module, order, np.argsort(order)
        self.dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]

    def rotate(self, q: np.ndarray, k: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(q, k)`` as ``Attention.forward`` rotates them: ``freqs, scale =
        rotary_pos_emb(pos)``, then ``apply_rotary_pos_emb(t, freqs, scale)`` on ``(batch, heads,
        tokens, d)``."""
        import torch
        from x_transformers.x_transformers import apply_rotary_pos_emb

        positions = np.asarray(positions, dtype=np.int64)
        if positions.ndim != 1:
            raise Unsupported("x-transformers has no M-RoPE: positions must be (tokens,)")
        out = []
        with torch.no_grad():
            freqs, scale = self.module(torch.from_numpy(positions))
            for x in (q, k):
                t = np.ascontiguousarray(x[..., self.order].swapaxes(0, 1))[None]  # (1, heads, n, d)
                y = apply_rotary_pos_emb(torch.from_numpy(t).to(self.dtype), freqs, scale)
                out.append(np.ascontiguousarray(y[0].float().numpy().swapaxes(0, 1)[..., self.back]))
        return out[0], out[1]


def build(config: Mapping[str, Any], *, layer_type: str | None, dtype: str) -> XTransformersRope:
    """``RotaryEmbedding`` with the arguments a user writes for ``config`` (see the docstring)."""
    version()
    from x_transformers.x_transformers import RotaryEmbedding

    rope = config_rope(config, layer_type, "x-transformers")
    cfg = rope.config
    sc = cfg.scaling
    if not isinstance(sc, (Default, Linear)):
        raise Unsupported(
            f"x-transformers has no {type(sc).__name__} scaling (rotary_interpolation_factor is linear "
            "scaling; rotary_base_rescale_factor a fixed NTK-aware base)"
        )
    if abs(float(cfg.attention_factor) - 1.0) > 0.0:
        raise Unsupported("x-transformers has no attention factor on cos and sin")
    if cfg.partial != "neox":
        raise Unsupported("x-transformers has no proportional partial rotary")
    factor = float(sc.factor) if isinstance(sc, Linear) else 1.0
    module = RotaryEmbedding(cfg.width, interpolation_factor=factor, base=cfg.base)
    return XTransformersRope(module, converter_order(cfg.layout, cfg.width, cfg.head_dim), dtype)
