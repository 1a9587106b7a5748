"""Hugging Face config parsing: a ``transformers`` config (object, dict or ``config.json``) to a
:class:`~rotary._config.RopeConfig`, without importing ``transformers``.

Reads both the 5.x ``rope_parameters`` and the 4.x ``rope_scaling`` + ``rope_theta`` styles.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

from ._config import RopeConfig
from ._lib import _validation as v
from ._lib._typing import AngleMethod, PartialMode
from .scaling import Scaling, from_dict

__all__ = ["hf_rope_parameters", "load_config", "rope_config"]

_NEEDS_L0 = ("llama3", "yarn", "longrope")


def load_config(config: Any) -> Any:
    """A config object or dict as it is; a path to a ``config.json`` or a checkpoint folder read."""
    if isinstance(config, (str, os.PathLike)):
        path = os.fspath(config)
        if os.path.isdir(path):
            path = os.path.join(path, "config.json")
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        except FileNotFoundError:
            raise FileNotFoundError(f"config: no such file {path!r}") from None
        except json.JSONDecodeError as e:
            raise ValueError(f"config: {path!r} is not valid JSON ({e})") from None
        if not isinstance(data, dict):
            raise ValueError(f"config: {path!r} holds a {type(data).__name__}, not a JSON object")
        return data
    return config


def _getter(config: Any) -> Callable[..., Any]:
    if isinstance(config, dict):
        return config.get
    if config is None or not hasattr(config, "__dict__"):
        raise TypeError(
            "config must be a transformers config object, a dict or a path to a config.json, "
            f"got {type(config).__name__}"
        )

    def get(name: str, default: Any = None) -> Any:
        try:
            return getattr(config, name, default)
        except Exception:  # some config properties raise when unset
            return default

    return get


def hf_rope_parameters(config: Any, layer_type: str | None = None) -> dict[str, Any]:
    """The config's RoPE parameters as one flat dict, standardised as ``transformers`` does.

    Keys: ``rope_type``, ``rope_theta``, ``partial_rotary_factor``, ``head_dim``,
    ``max_position_embeddings`` and, for llama3/yarn/longrope, ``original_max_position_embeddings``,
    plus the scaling's own keys.

    Examples
    --------
    >>> from rotary.hf import hf_rope_parameters
    >>> p = hf_rope_parameters({"head_dim": 64, "rope_theta": 1e6, "max_position_embeddings": 4096,
    ...                         "rope_scaling": {"type": "linear", "factor": 2.0}})
    >>> p["rope_type"], p["rope_theta"], p["factor"], p["head_dim"]
    ('linear', 1000000.0, 2.0, 64)
    """
    config = load_config(config)
    get = _getter(config)
    params = get("rope_parameters") or get("rope_scaling") or {}
    if not isinstance(params, dict):
        raise TypeError(f"config rope_parameters/rope_scaling must be a dict, got {type(params).__name__}")
    nested = [k for k, val in params.items() if isinstance(val, dict)]
    if nested:
        if layer_type is None:
            raise ValueError(
                f"config has per-layer RoPE parameters for {nested}; pass layer_type= one of them"
            )
        if layer_type not in nested:
            raise ValueError(f"layer_type must be one of {nested}, got {layer_type!r}")
        params = params[layer_type]
    elif layer_type is not None:
        raise ValueError(f"layer_type={layer_type!r} given but the config has one set of RoPE parameters")
    p = dict(params)
    p["rope_type"] = p.get("rope_type", p.get("type", "default"))
    theta = p.get("rope_theta")
    if theta is None:
        theta = get("rope_theta")
    if theta is None:
        theta = get("default_theta", 10000.0)
    p["rope_theta"] = v.check_base(theta, "rope_theta")
    prf = p.get("partial_rotary_factor")
    if prf is None:
        prf = get("partial_rotary_factor")
    prf = 1.0 if prf is None else v.check_float(prf, "partial_rotary_factor", above=0.0)
    if prf > 1.0:
        raise ValueError(f"partial_rotary_factor must be in (0, 1], got {prf}")
    p["partial_rotary_factor"] = prf
    head_dim = get("head_dim")
    if not head_dim:
        hidden, heads = get("hidden_size"), get("num_attention_heads")
        if not hidden or not heads:
            raise ValueError("config needs head_dim, or hidden_size and num_attention_heads")
        hidden = v.check_int(hidden, "hidden_size", minimum=1)
        heads = v.check_int(heads, "num_attention_heads", minimum=1)
        if hidden % heads:
            raise ValueError(
                f"hidden_size={hidden} is not a multiple of num_attention_heads={heads}; give head_dim"
            )
        head_dim = hidden // heads
    p["head_dim"] = v.check_head_dim(head_dim, "head_dim")
    max_pos = get("max_position_embeddings")
    if max_pos is not None:
        max_pos = v.check_int(max_pos, "max_position_embeddings", minimum=1)
    p["max_position_embeddings"] = max_pos
    if p["rope_type"] in _NEEDS_L0:
        # transformers gives a top-level original_max_position_embeddings priority (Phi-3).
        top = get("original_max_position_embeddings")
        l0 = top if top is not None else p.get("original_max_position_embeddings", max_pos)
        if l0 is None:
            raise ValueError(
                f"rope_type {p['rope_type']!r} needs original_max_position_embeddings "
                "(or max_position_embeddings) in the config"
            )
        p["original_max_position_embeddings"] = v.check_int(l0, "original_max_position_embeddings", minimum=1)
        if p["rope_type"] in ("yarn", "longrope") and p.get("factor") is None and max_pos is not None:
            p["factor"] = max_pos / p["original_max_position_embeddings"]
    return p


def rope_config(config: Any, *, angles: AngleMethod = "exact", layer_type: str | None = None) -> RopeConfig:
    """The :class:`RopeConfig` of a ``transformers`` config (see :func:`rotary.hf.from_hf`)."""
    p = hf_rope_parameters(config, layer_type)
    head_dim = p["head_dim"]
    rotary_dim = int(head_dim * p["partial_rotary_factor"])
    rotary_dim -= rotary_dim % 2
    kind = p["rope_type"]
    partial: PartialMode = "neox"
    scaling: Scaling | dict[str, Any] | None
    if kind == "proportional":
        # Gemma 4: exponent over head_dim, the first rotary_dim // 2 pairs rotate, and
        # every frequency is divided by factor (transformers: ``inv_freq /= factor``).
        partial = "proportional"
        rotary_dim = 2 * int(p["partial_rotary_factor"] * head_dim // 2)
        factor = p.get("factor", 1.0)
        scaling = None if factor in (None, 1.0) else {"rope_type": "linear", "factor": factor}
    else:
        scaling = from_dict(
            p,
            max_position_embeddings=p["max_position_embeddings"],
            original_max_position_embeddings=p.get("original_max_position_embeddings"),
        )
    return RopeConfig(
        head_dim,
        rotary_dim=None if rotary_dim == head_dim else rotary_dim,
        base=p["rope_theta"],
        layout="half",
        scaling=scaling,
        angles=angles,
        partial=partial,
    )
