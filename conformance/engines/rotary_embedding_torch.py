"""lucidrains' rotary-embedding-torch 0.9.1: ``RotaryEmbedding.rotate_queries_or_keys``, called
with an offset as its README calls it.

Install (CPU, Python 3.11; tested in a fresh venv: torch 2.13.0 + numpy, then 8 s with rotary's
own editable install: rotary-embedding-torch and einops, 969 MB in all)::

    python3.11 -m venv venv && venv/bin/pip install torch==2.13.0 numpy
    venv/bin/pip install -c "$ROTARY/.ci/constraints.txt" rotary-embedding-torch==0.9.1

Imported as ``conformance.engines.rotary_embedding_torch`` (no clash with the engine's package,
imported only inside the functions).

A library with no config reader and no model table
--------------------------------------------------
rotary-embedding-torch is a building block: ``RotaryEmbedding(dim, theta=10000,
interpolate_factor=1.0, ...)`` and nothing that reads a ``config.json`` or names a model.  A user
porting a checkpoint writes the arguments by hand from the config's meaning, so the adapter takes
that meaning from :func:`rotary.testing.engine.config_rope` (the base, the rotated features, the
layout, the scaling, per layer type, as :func:`rotary.hf.model_rope` reads them) and maps it onto
the arguments: ``dim`` = the rotated features (``rotary_dim``; the module rotates the first
``dim`` features and passes the rest through), ``theta`` = the base, ``interpolate_factor`` =
linear scaling's factor.  What the arguments cannot express (YaRN, Llama 3, LongRoPE, dynamic
NTK: ``theta_rescale_factor`` is a fixed NTK-aware base, not dynamic NTK; M-RoPE; an attention
factor; a query scale) is ``Unsupported``.  The verdicts say whether the library, given those
arguments, computes the checkpoint's RoPE.

Layout.  The module rotates adjacent pairs ``(2i, 2i+1)`` (its ``rotate_half`` splits ``(d r)``,
``r = 2``).  It ships no converter: a user loading a half-layout checkpoint (Llama) must permute
the rows of ``q_proj``/``k_proj`` per head as llama.cpp's and Meta's converters do
(:func:`rotary.testing.engine.converter_order`).  The adapter applies that permutation to ``q``/``k``
and its inverse to the outputs (exact: no arithmetic); interleaved checkpoints (GPT-J) need none.

Offsets.  ``rotate_queries_or_keys(t, offset=o)`` rotates ``t``'s token ``j`` at position
``o + j``: it takes no positions.  The adapter calls it once per token at ``offset=position``, as
a decoding step does (q's and k's heads in one call): one call per token the kit asks for.  Its
positions are formed in the data's dtype as ``arange(n) + offset``, so a call of several tokens
from an offset rounds twice (``arange`` alone, then the sum): one token per call gives each
position the engine's rounding of that position alone, the same at every call.

Precision.  ``inv_freq`` is float32 (``1 / theta ** (arange(0, dim, 2) / dim)``), and the product
with the positions is float32 (``einsum`` after ``t.type(freqs.dtype)``), but the positions
themselves are built in the data's dtype (``get_seq_pos``: ``torch.arange(seq_len,
dtype=t.dtype) + offset``): in bfloat16 position 257 is 256, in float16 position 2049 is 2048 and
positions from 65520 on are infinite (NaN outputs).  The module caches the angles of its first
call from offset 0 (up to ``cache_max_seq_len`` = 8192 positions) and serves later calls inside
them from the cache.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from rotary.scaling import Default, Linear
from rotary.testing.engine import Unsupported, config_rope, converter_order

NAME = "rotary-embedding-torch"
PYTHON = "3.11"
INSTALL = (
    "python3.11 -m venv $ENGINES/rotary_embedding_torch/venv && "
    ". $ENGINES/rotary_embedding_torch/venv/bin/activate\n"
    "pip install torch==2.13.0 numpy\n"
    'pip install -c "$ROTARY/.ci/constraints.txt" rotary-embedding-torch==0.9.1\n'
    'pip install --no-deps -e "$ROTARY" array-api-compat'
)
#: float16 too: the module builds positions in the data's dtype, and float16 is where it breaks
#: first (2049) and overflows (65520).
DTYPES = ("float32", "bfloat16", "float16")

__all__ = ["DTYPES", "INSTALL", "NAME", "PYTHON", "build", "version"]


def version() -> str:
    """rotary-embedding-torch's version; ``ImportError`` with the recipe when it is missing."""
    try:
        from importlib.metadata import version as _v

        import rotary_embedding_torch  # noqa: F401
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(f"rotary-embedding-torch is not installed; install it with:\n{INSTALL}") from e
    return _v("rotary-embedding-torch")


class RotaryEmbeddingTorchRope:
    """``RotaryEmbedding.rotate_queries_or_keys`` on Hugging Face-layout ``q``/``k``."""

    angles = "float32"
    softmax_scale = 1.0

    def __init__(self, module: Any, order: np.ndarray, dtype: str) -> None:
        import torch

        self.module, self.order, self.back = module, order, np.argsort(order)
        self.dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]

    def rotate(self, q: np.ndarray, k: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(q, k)`` rotated token by token: ``rotate_queries_or_keys(x, offset=position)`` on each
        token (q's and k's heads in one call), as a decoding step calls it."""
        import torch

        positions = np.asarray(positions, dtype=np.int64)
        if positions.ndim != 1:
            raise Unsupported("rotary-embedding-torch has no M-RoPE: positions must be (tokens,)")
        x = np.concatenate([q, k], axis=1)[..., self.order]  # (tokens, heads, d), the engine's order
        # (heads, tokens, d): the module's seq_dim -2
        t = torch.from_numpy(np.ascontiguousarray(x.swapaxes(0, 1))).to(self.dtype)
        with torch.no_grad():
            parts = [
                self.module.rotate_queries_or_keys(t[:, i : i + 1], offset=int(p))
                for i, p in enumerate(positions.tolist())
            ]
        y = torch.cat(parts, dim=1).float().numpy().swapaxes(0, 1)[..., self.back]
        return np.ascontiguousarray(y[:, : q.shape[1]]), np.ascontiguousarray(y[:, q.shape[1] :])


def build(config: Mapping[str, Any], *, layer_type: str | None, dtype: str) -> RotaryEmbeddingTorchRope:
    """``RotaryEmbedding`` with the arguments a user writes for ``config`` (see the docstring)."""
    version()
    from rotary_embedding_torch import RotaryEmbedding

    rope = config_rope(config, layer_type, "rotary-embedding-torch")
    cfg = rope.config
    sc = cfg.scaling
    if not isinstance(sc, (Default, Linear)):
        raise Unsupported(
            f"rotary-embedding-torch has no {type(sc).__name__} scaling (interpolate_factor is linear "
            "scaling; theta_rescale_factor a fixed NTK-aware base)"
        )
    if abs(float(cfg.attention_factor) - 1.0) > 0.0:
        raise Unsupported("rotary-embedding-torch has no attention factor on cos and sin")
    if cfg.partial != "neox":
        raise Unsupported("rotary-embedding-torch has no proportional partial rotary")
    factor = float(sc.factor) if isinstance(sc, Linear) else 1.0
    module = RotaryEmbedding(dim=cfg.width, theta=cfg.base, interpolate_factor=factor)
    return RotaryEmbeddingTorchRope(module, converter_order(cfg.layout, cfg.width, cfg.head_dim), dtype)
