"""Hugging Face ``transformers`` configs: the RoPE a model applies, without importing ``transformers``.

A config object, its ``to_dict()``, or a path to a ``config.json`` (or a checkpoint folder)
all work.
"""

from __future__ import annotations

from typing import Any

from ._hfconfig import hf_rope_parameters
from ._lib._typing import AngleMethod
from ._rope import RoPE

__all__ = ["from_hf", "hf_rope_parameters"]


def from_hf(config: Any, *, angles: AngleMethod = "exact", layer_type: str | None = None) -> RoPE:
    """The :class:`rotary.RoPE` of a ``transformers`` config (object, dict or path).

    Honours ``rope_parameters`` (transformers 5) or ``rope_scaling`` + ``rope_theta`` (4.x),
    ``head_dim`` (else ``hidden_size // num_attention_heads``), ``partial_rotary_factor``
    (``rotary_dim = int(head_dim * factor)``) and ``max_position_embeddings``; every HF
    ``rope_type`` (default, linear, dynamic, yarn, longrope, llama3, proportional) maps to
    its :mod:`rotary.scaling` class.

    Parameters
    ----------
    config : transformers.PretrainedConfig or dict or path
        The model config.
    angles : {"exact", "float32"}
        ``"float32"`` reproduces the model's own rotary embedding bit-for-bit on torch.
    layer_type : str, optional
        For configs with per-layer RoPE parameters (e.g. ``"sliding_attention"``).

    Examples
    --------
    >>> import rotary
    >>> rotary.hf.from_hf({"head_dim": 64, "partial_rotary_factor": 0.5, "rope_theta": 1e4,
    ...                    "max_position_embeddings": 2048})
    RoPE(64, base=10000, layout='half', rotary_dim=32)
    """
    return RoPE.from_hf(config, angles=angles, layer_type=layer_type)
