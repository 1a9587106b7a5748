"""The adapter protocol through which :func:`rotary.testing.check_model_rope` certifies an engine's
RoPE against a model's config.

An *engine* (vLLM, Megatron-core, flash-attn, torchtune, MaxText, mlx-lm, your own code...) is
given to the checker as an :class:`Adapter`: from a Hugging Face config it builds the engine's
RoPE **the way the engine itself builds it for that model** (its own config reading, its own
defaults, its own tables), and returns an :class:`EngineRope` that rotates NumPy queries and keys
through the engine's code.  ``rotary`` reads the same config (:func:`rotary.hf.model_rope`) and
compares, in float64.

Arrays crossing the protocol are NumPy arrays (the adapter converts to and from its library):

* ``q``: ``(tokens, heads, head_dim)``, ``k``: ``(tokens, kv_heads, head_dim)``, float32 arrays
  whose values are exactly representable in the ``dtype`` the RoPE was built for (the adapter casts
  them to that dtype: bfloat16, float16, float32);
* ``positions``: int64, ``(tokens,)``, or ``(rows, tokens)`` for multimodal RoPE (M-RoPE: the
  temporal, height and width rows);
* ``head_dim`` is the RoPE's width as :func:`rotary.hf.model_rope` reports it (for multi-head
  latent attention, the ``qk_rope_head_dim`` features that rotate).

An adapter that cannot express a config raises :class:`Unsupported` with the reason: the report
says "not supported", not "failed".
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np

__all__ = ["Adapter", "AngleKind", "EngineRope", "Unsupported"]

#: How an engine forms its angles, which sets the allowance the checker grants:
#: ``"exact"``/``"float64"`` none beyond rounding; ``"float32"``: angles ``pos * inv_freq`` formed in
#: float32 (Hugging Face's recipe, most engines); ``"dtype"``: formed in the data's dtype.
AngleKind = Literal["exact", "float64", "float32", "dtype"]


class Unsupported(Exception):
    """The engine cannot express this config (a scaling it lacks, an M-RoPE, a layout...).

    Raised by :meth:`Adapter.build` (or :meth:`EngineRope.rotate`); reported as "not supported"
    with the message as its reason, never as a failure.
    """


@runtime_checkable
class EngineRope(Protocol):
    """One engine RoPE built for one config, layer type and dtype.

    Attributes
    ----------
    angles : {"exact", "float64", "float32", "dtype"}
        How the engine forms its angles (sets the angle allowance).  Optional: default
        ``"float32"``.
    max_position : int or None
        The positions the engine's precomputed table covers (``0 .. max_position - 1``), if it
        keeps one; ``None`` if it computes angles on the fly.  Optional.  Positions past it are
        still checked: the engine must be right there or raise.
    softmax_scale : float
        The multiplier this engine applies to the attention logits for this config *outside* the
        rotation, relative to ``1 / sqrt(qk_head_dim)`` (e.g. DeepSeek YaRN's
        ``mscale(factor, mscale_all_dim) ** 2``).  Optional: default 1.0.
    """

    def rotate(self, q: np.ndarray, k: np.ndarray, positions: np.ndarray) -> tuple[Any, Any]:
        """``(q, k)`` rotated by the engine at ``positions`` (shapes as given; any float dtype,
        NumPy or convertible with ``numpy.asarray``): whatever factor the engine multiplies into
        cos/sin is included."""
        ...

    # Optional:
    # def query_scale(self, positions: np.ndarray) -> np.ndarray | None:
    #     """The per-position factor the engine multiplies queries by after RoPE for this config
    #     (Llama 4 / Ministral 3 attention temperature), ``None`` where it applies none."""


class Adapter(Protocol):
    """An engine as the checker sees it (a module or an object with these names).

    Attributes
    ----------
    NAME : str
        The engine's name (``"vllm"``).
    INSTALL : str
        The exact install recipe on a CPU machine (shown when the engine is absent).
    """

    NAME: str
    INSTALL: str

    def version(self) -> str:
        """The engine's version; raises ``ImportError`` when it is not installed."""
        ...

    def build(self, config: Mapping[str, Any], *, layer_type: str | None, dtype: str) -> EngineRope:
        """The engine's RoPE for ``config`` (a Hugging Face config dict, as published) and layer
        type (``None``: the model's only RoPE), in ``dtype`` (``"float32"``, ``"bfloat16"``,
        ``"float16"``).  Raises :class:`Unsupported` where the engine cannot express it."""
        ...
