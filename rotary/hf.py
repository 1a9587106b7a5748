"""``RoPE.from_hf``: the RoPE of a Hugging Face ``transformers`` model config.

Reads the config the way ``transformers`` does (both the 5.x ``rope_parameters``
and the 4.x ``rope_scaling`` + ``rope_theta`` styles), without importing
``transformers``: a config object or its ``to_dict()`` both work.
"""

from __future__ import annotations

from typing import Any

from .scaling import from_dict

__all__ = ["from_hf", "hf_rope_parameters"]

_NEEDS_L0 = ("llama3", "yarn", "longrope")


def _getter(config: Any) -> Any:
    if isinstance(config, dict):
        return config.get
    if config is None or not hasattr(config, "__dict__"):
        raise TypeError(f"config must be a transformers config object or a dict, got {type(config).__name__}")

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
    get = _getter(config)
    params = get("rope_parameters") or get("rope_scaling") or {}
    if not isinstance(params, dict):
        raise TypeError(f"config rope_parameters/rope_scaling must be a dict, got {type(params).__name__}")
    nested = [k for k, v in params.items() if isinstance(v, dict)]
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
    p["rope_theta"] = float(theta)
    prf = p.get("partial_rotary_factor")
    if prf is None:
        prf = get("partial_rotary_factor")
    p["partial_rotary_factor"] = 1.0 if prf is None else float(prf)
    head_dim = get("head_dim")
    if not head_dim:
        hidden, heads = get("hidden_size"), get("num_attention_heads")
        if not hidden or not heads:
            raise ValueError("config needs head_dim, or hidden_size and num_attention_heads")
        head_dim = int(hidden) // int(heads)
    p["head_dim"] = int(head_dim)
    max_pos = get("max_position_embeddings")
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
        p["original_max_position_embeddings"] = int(l0)
        if p["rope_type"] in ("yarn", "longrope") and p.get("factor") is None and max_pos is not None:
            p["factor"] = max_pos / p["original_max_position_embeddings"]
    return p


def from_hf(config: Any, *, angles: str = "exact", layer_type: str | None = None, cls: Any = None) -> Any:
    """Build the :class:`rotary.RoPE` of a ``transformers`` config (object or dict).

    Honours ``rope_parameters`` (transformers 5) or ``rope_scaling`` + ``rope_theta``
    (4.x), ``head_dim`` (else ``hidden_size // num_attention_heads``),
    ``partial_rotary_factor`` (``rotary_dim = int(head_dim * factor)``) and
    ``max_position_embeddings``; layout ``"half"``.  Every HF ``rope_type``
    (default, linear, dynamic, yarn, longrope, llama3) maps to its
    :mod:`rotary.scaling` class.

    Parameters
    ----------
    config : transformers.PretrainedConfig or dict
        The model config.
    angles : {"exact", "float32"}
        ``"float32"`` reproduces the model's own rotary embedding bit-for-bit on torch.
    layer_type : str, optional
        For configs with per-layer RoPE parameters (e.g. ``"sliding_attention"``).

    Examples
    --------
    >>> import rotary
    >>> rotary.RoPE.from_hf({"head_dim": 64, "partial_rotary_factor": 0.5, "rope_theta": 1e4,
    ...                      "max_position_embeddings": 2048})
    RoPE(64, base=10000, layout='half', rotary_dim=32)
    """
    if cls is None:
        from .rope import RoPE as cls
    p = hf_rope_parameters(config, layer_type)
    head_dim = p["head_dim"]
    rotary_dim = int(head_dim * p["partial_rotary_factor"])
    scaling = from_dict(
        p,
        max_position_embeddings=p["max_position_embeddings"],
        original_max_position_embeddings=p.get("original_max_position_embeddings"),
    )
    return cls(
        head_dim,
        base=p["rope_theta"],
        layout="half",
        rotary_dim=None if rotary_dim == head_dim else rotary_dim,
        scaling=scaling,
        angles=angles,
    )
