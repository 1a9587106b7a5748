"""Hugging Face ``transformers`` configs: the RoPE a model applies, without importing ``transformers``.

A config object, its ``to_dict()``, a ``config.json`` as published (or its path, or the
checkpoint folder) all work, for every family ``transformers`` ships with RoPE: the pair layout
(interleaved for GPT-J, Cohere, GLM/ChatGLM, Llama 4, DeepSeek), the rotated width (partial
factors, GPT-J ``rotary_dim``, GPT-NeoX ``rotary_pct``, DeepSeek ``qk_rope_head_dim``), base,
scaling and attention factor, per layer where layers differ (Gemma 2/3/4, ModernBERT, Llama 4
and SmolLM3 NoPE layers, Cohere 2), and M-RoPE for Qwen2-VL / Qwen2.5-VL / Qwen3-VL.

==========================  ==========================================================
:func:`from_hf`             the :class:`~rotary.RoPE` (of one layer type where they differ)
:func:`rope_for_layer`      one layer's ``RoPE``, ``MRoPE`` or ``None`` (no RoPE there)
:func:`mrope_from_hf`       the :class:`~rotary.MRoPE` of a multimodal config
:func:`model_rope`          every layer's RoPE, and the attention settings that are not RoPE
:func:`mrope_index`         M-RoPE position ids of a Qwen-VL prompt, options from the config
:func:`hf_rope_parameters`  the standardised RoPE parameters (a flat dict)
:func:`vision_rope`         a vision tower's 2-D RoPE (:mod:`rotary.vision`): Llama 4 vision,
                            DINOv3, Pixtral, Qwen2-VL's vision encoder
==========================  ==========================================================

Families and the keys read besides ``rope_parameters`` / ``rope_scaling`` / ``rope_theta`` /
``partial_rotary_factor`` (checked against ``transformers`` 5.23, tests/test_hf_families.py):

=====================================  =========================================================
Llama 2/3/3.1/3.2, Mistral, Mixtral,   the common keys (``head_dim``, else ``hidden_size`` /
Qwen2/2.5/3, Phi-3/3.5/4, OLMo 2,      ``num_attention_heads``; Phi-3's top-level
Granite, Falcon, InternLM2             ``original_max_position_embeddings``, ``"su"`` read as longrope)
Phi-2, StableLM, GLM-4                 ``partial_rotary_factor`` (defaults 0.5, 0.25, 0.5)
GPT-NeoX / Pythia                      ``rotary_pct``, ``rotary_emb_base``
GPT-J                                  ``rotary_dim``; interleaved; base fixed at 10000
Cohere, Cohere 2                       interleaved; Cohere 2's global layers have no RoPE
GLM-4, ChatGLM (remote code)           interleaved; ChatGLM ``kv_channels``, ``rope_ratio``
DeepSeek-V2 / V3                       ``qk_rope_head_dim`` (:attr:`ModelRope.rope_slice`),
                                       ``rope_interleave`` (V3, default true; V2 always)
Llama 4                                interleaved; ``no_rope_layers``; attention settings reported
SmolLM3                                ``no_rope_layers``
Gemma 2 / 3 / 4, ModernBERT            layer types; Gemma 3 ``rope_local_base_freq``, Gemma 4
                                       ``global_head_dim`` and ``proportional``, ModernBERT
                                       ``global_rope_theta`` / ``local_rope_theta``
Qwen2-VL / 2.5-VL / 3-VL               ``mrope_section`` (legacy ``{"type": "mrope"}``), Qwen3-VL
                                       interleaved sections
=====================================  =========================================================

Keys are read as ``transformers`` reads them; a missing key takes the default of the model
type's config class (``rope_theta`` from :data:`rotary._hfconfig.DEFAULT_THETA`, the partial
factors above, GPT-OSS's YaRN, Gemma 4's layer parameters...).  Errors, each naming the key:

* a key of ``rope_parameters`` / ``rope_scaling`` that the ``rope_type`` does not take
  (``transformers`` only warns): the published configs carry none, and a key such as YaRN's
  ``finetuned`` or Phi-3-small's ``long_mscale`` either means nothing or changes the attention
  factor, so it is refused rather than guessed;
* a top-level key that changes RoPE in some family but is not read for this ``model_type``
  (``rotary_pct`` in a Llama config, ``qk_rope_head_dim`` without a DeepSeek ``model_type``,
  Qwen-1's ``use_dynamic_ntk``...), ``alibi: true``, a non-rotary ``position_embedding_type``;
  other top-level keys (vocabulary, MLP, norms...) are not RoPE's and are ignored;
* ``partial_rotary_factor`` below 1 for a family whose attention rotates the whole head;
* ``rope_parameters`` and ``rope_scaling`` both given and describing different RoPEs
  (``transformers`` would silently keep ``rope_scaling``).

An unknown ``model_type`` is read as a Llama-style config (:attr:`ModelRope.notes` says so).
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Mapping
from typing import Any

import numpy as np

from . import positions
from ._hfconfig import LayerSpec, _as_dict, hf_rope_parameters, model_spec, mrope_index_options, mrope_spec
from ._lib import _validation as v
from ._lib._compat import array_namespace, is_array
from ._lib._typing import AngleMethod, Array
from ._rope import RoPE
from .multiaxis import MRoPE
from .vision import VisionRoPE, dinov3, llama4, pixtral, qwen2_vl

__all__ = [
    "ModelRope",
    "from_hf",
    "hf_rope_parameters",
    "model_rope",
    "mrope_from_hf",
    "mrope_index",
    "rope_for_layer",
    "vision_rope",
]


def from_hf(config: Any, *, angles: AngleMethod = "exact", layer_type: str | None = None) -> RoPE:
    """The :class:`rotary.RoPE` of a ``transformers`` config (object, dict or path).

    Honours ``rope_parameters`` (transformers 5) or ``rope_scaling`` + ``rope_theta`` (4.x),
    ``head_dim`` (else ``hidden_size // num_attention_heads``), ``partial_rotary_factor``
    (``rotary_dim = int(head_dim * factor)``), ``max_position_embeddings`` and the family's
    own keys; every HF ``rope_type`` (default, linear, dynamic, yarn, longrope, llama3,
    proportional) maps to its :mod:`rotary.scaling` class.

    For M-RoPE configs this is the RoPE of text positions (all rows equal), see
    :func:`mrope_from_hf`; for configs with layers without RoPE, that of the layers with it.
    DeepSeek's RoPE rotates the ``qk_rope_head_dim`` features of each head that
    :attr:`ModelRope.rope_slice` names.

    Parameters
    ----------
    config : transformers.PretrainedConfig or dict or path
        The model config.
    angles : {"exact", "float32"}
        ``"float32"`` reproduces the model's own rotary embedding bit-for-bit on torch.
    layer_type : str, optional
        For configs whose layer types have different RoPEs (e.g. ``"sliding_attention"``).

    Examples
    --------
    >>> import rotary
    >>> rotary.hf.from_hf({"head_dim": 64, "partial_rotary_factor": 0.5, "rope_theta": 1e4,
    ...                    "max_position_embeddings": 2048})
    RoPE(64, base=10000, layout='half', rotary_dim=32)
    >>> rotary.hf.from_hf({"model_type": "gpt_neox", "hidden_size": 768, "num_attention_heads": 12,
    ...                    "rotary_pct": 0.25, "rotary_emb_base": 10000})       # Pythia-160m
    RoPE(64, base=10000, layout='half', rotary_dim=16)
    """
    return RoPE.from_hf(config, angles=angles, layer_type=layer_type)


def _build(spec: LayerSpec | None) -> RoPE | MRoPE | None:
    if spec is None:
        return None
    c = spec.config
    if spec.sections is None:
        return RoPE.from_config(c)
    return MRoPE(
        c.head_dim,
        spec.sections,
        interleaved=spec.interleaved,
        base=c.base,
        layout=c.layout,
        rotary_dim=c.rotary_dim,
        scaling=c.scaling,
        angles=c.angles,
    )


@dataclasses.dataclass(frozen=True, eq=False)
class ModelRope:
    """Every layer's RoPE of a config, and what the config says about attention besides.

    Attributes
    ----------
    model_type : str or None
        The config's ``model_type`` (that of its ``text_config`` for multimodal configs).
    layer_types : tuple of str or None
        ``layer_types`` (given, or derived as ``transformers`` derives them).
    layers : tuple
        Per layer: a :class:`~rotary.RoPE`, an :class:`~rotary.MRoPE` (multimodal), or
        ``None`` for a layer without positional encoding (Llama 4 / SmolLM3 ``no_rope_layers``,
        Cohere 2 global layers).  Empty when the config has no ``num_hidden_layers``.
    attention : mapping
        Settings that change attention but not RoPE, reported so that a port does not drop
        them: ``sliding_window``, ``attention_chunk_size`` (Llama 4 chunked attention),
        ``attn_temperature_tuning``/``floor_scale``/``attn_scale`` (Llama 4 NoPE layers scale
        queries by ``1 + attn_scale * log1p(floor((pos + 1) / floor_scale))``),
        ``use_qk_norm``, ``query_pre_attn_scalar``, ``attn_logit_softcapping``,
        ``attention_multiplier`` (Granite), ``local_attention`` (ModernBERT),
        ``attention_sinks`` (GPT-OSS), ``softmax_scale_multiplier`` (DeepSeek YaRN: the
        softmax scale is multiplied by ``mscale(factor, mscale_all_dim)**2``).
    rope_slice : (int, int) or None
        The features of each query/key head that RoPE rotates when they are not the first
        ones (DeepSeek MLA: the last ``qk_rope_head_dim``); ``None``: as the RoPE says.
    notes : tuple of str
        Anything else a port should know.

    Examples
    --------
    >>> import rotary
    >>> m = rotary.hf.model_rope({"model_type": "smollm3", "hidden_size": 64, "num_attention_heads": 4,
    ...                           "num_hidden_layers": 4, "rope_theta": 5e6,
    ...                           "no_rope_layers": [1, 1, 1, 0]})
    >>> m.layers[0], m.layers[3]
    (RoPE(16, base=5e+06, layout='half'), None)
    """

    model_type: str | None
    layer_types: tuple[str, ...] | None
    layers: tuple[RoPE | MRoPE | None, ...]
    attention: Mapping[str, Any]
    rope_slice: tuple[int, int] | None
    notes: tuple[str, ...]


def model_rope(config: Any, *, angles: AngleMethod = "exact") -> ModelRope:
    """Every layer's RoPE of a ``transformers`` config, and its attention settings besides RoPE.

    See :class:`ModelRope`.

    Examples
    --------
    >>> import rotary
    >>> cfg = {"model_type": "gemma3_text", "hidden_size": 64, "num_attention_heads": 4, "head_dim": 16,
    ...        "num_hidden_layers": 6, "rope_theta": 1e6, "rope_local_base_freq": 1e4,
    ...        "rope_scaling": {"rope_type": "linear", "factor": 8.0}, "sliding_window": 512}
    >>> m = rotary.hf.model_rope(cfg)
    >>> m.layer_types[4:], m.layers[4].base, m.layers[5].base, m.layers[5].scaling.factor
    (('sliding_attention', 'full_attention'), 10000.0, 1000000.0, 8.0)
    >>> dict(m.attention)
    {'sliding_window': 512}
    """
    spec = model_spec(config, angles=angles)
    built: dict[int, RoPE | MRoPE | None] = {}
    layers = []
    for s in spec.layers:
        if id(s) not in built:
            built[id(s)] = _build(s)
        layers.append(built[id(s)])
    return ModelRope(
        spec.model_type,
        spec.layer_types,
        tuple(layers),
        types.MappingProxyType(dict(spec.attention)),
        spec.rope_slice,
        spec.notes,
    )


def rope_for_layer(config: Any, layer_index: int, *, angles: AngleMethod = "exact") -> RoPE | MRoPE | None:
    """The RoPE that layer ``layer_index`` applies: a :class:`~rotary.RoPE`, an
    :class:`~rotary.MRoPE` (multimodal configs), or ``None`` (no positional encoding).

    Examples
    --------
    >>> import rotary
    >>> cfg = {"model_type": "modernbert", "hidden_size": 64, "num_attention_heads": 4,
    ...        "num_hidden_layers": 3, "global_rope_theta": 160000.0, "local_rope_theta": 10000.0}
    >>> [rotary.hf.rope_for_layer(cfg, i).base for i in range(3)]
    [160000.0, 10000.0, 10000.0]
    """
    m = model_rope(config, angles=angles)
    if not m.layers:
        raise ValueError(
            "config has no num_hidden_layers: use from_hf (with layer_type= where layers differ)"
        )
    i = v.check_int(layer_index, "layer_index", minimum=0)
    if i >= len(m.layers):
        raise ValueError(f"layer_index must be < num_hidden_layers={len(m.layers)}, got {i}")
    return m.layers[i]


def mrope_from_hf(config: Any, *, angles: AngleMethod = "exact") -> MRoPE:
    """The :class:`~rotary.MRoPE` of a multimodal config (Qwen2-VL, Qwen2.5-VL, Qwen3-VL).

    Sections from ``mrope_section`` (also in the legacy ``rope_scaling: {"type": "mrope"}``),
    interleaved as the model interleaves them (Qwen3-VL).

    Examples
    --------
    >>> import rotary
    >>> cfg = {"model_type": "qwen2_vl", "hidden_size": 3584, "num_attention_heads": 28,
    ...        "rope_theta": 1000000.0, "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}}
    >>> rotary.hf.mrope_from_hf(cfg)
    MRoPE(128, sections=(16, 24, 24), rope=RoPE(128, base=1e+06, layout='half'))
    """
    rope = _build(mrope_spec(config, angles=angles))
    assert isinstance(rope, MRoPE)
    return rope


def mrope_index(
    config: Any,
    input_ids: Array,
    image_grid_thw: Any = None,
    video_grid_thw: Any = None,
    *,
    attention_mask: Any = None,
    second_per_grid_ts: Any = None,
) -> tuple[Array, Array]:
    """M-RoPE position ids ``(3, batch, seq)`` and deltas ``(batch, 1)`` of a Qwen-VL prompt.

    :func:`rotary.positions.mrope_position_ids` with the options read from the config:
    image/video tokens are ``input_ids`` equal to ``image_token_id`` / ``video_token_id``,
    ``vision_config.spatial_merge_size``, Qwen2.5-VL's ``vision_config.tokens_per_second``,
    Qwen3-VL's per-frame video grids.  Equal to the model's ``get_rope_index``.

    Examples
    --------
    >>> import numpy as np, rotary
    >>> cfg = {"model_type": "qwen2_vl", "image_token_id": 9, "video_token_id": 8,
    ...        "vision_config": {"spatial_merge_size": 2}}
    >>> ids, delta = rotary.hf.mrope_index(cfg, np.array([[1, 9, 9, 9, 9, 2]]), [[1, 4, 4]])
    >>> ids[1, 0], delta
    (array([0, 1, 1, 2, 2, 3]), array([[-2]]))
    """
    opts = mrope_index_options(config)
    if not is_array(input_ids):
        input_ids = np.asarray(input_ids)
    xp = array_namespace(input_ids)
    if input_ids.ndim != 2 or not v.is_integral(input_ids.dtype):
        raise ValueError(
            f"input_ids must be an integer array of shape (batch, seq), got {tuple(input_ids.shape)}"
        )
    image = xp.astype(input_ids == opts.pop("image_token_id"), input_ids.dtype)
    video = xp.astype(input_ids == opts.pop("video_token_id"), input_ids.dtype)
    return positions.mrope_position_ids(
        image + 2 * video,
        image_grid_thw,
        video_grid_thw,
        attention_mask=attention_mask,
        second_per_grid_ts=second_per_grid_ts,
        **opts,
    )


def vision_rope(config: Any, *, angles: AngleMethod = "exact") -> VisionRoPE:
    """The 2-D RoPE of a ``transformers`` vision tower config (object, dict or path): Llama 4
    vision (``llama4_vision_model``), DINOv3 (``dinov3_vit``: registers are prefix tokens),
    Pixtral (``pixtral``) and Qwen2-VL's vision encoder (``qwen2_vl`` vision config).  A
    composite config is read through its ``vision_config``.

    Examples
    --------
    >>> import rotary
    >>> cfg = {"model_type": "pixtral", "hidden_size": 64, "num_attention_heads": 2, "head_dim": 32,
    ...        "rope_parameters": {"rope_type": "axial", "rope_theta": 10000.0}}
    >>> tower = rotary.hf.vision_rope(cfg)
    >>> tower.name, tower.head_dim, tower.positions(2, 2).tolist()
    ('pixtral', 32, [[0, 0], [0, 1], [1, 0], [1, 1]])
    """
    d = _as_dict(config)
    if isinstance(d.get("vision_config"), Mapping):
        d = dict(d["vision_config"])
    kind = d.get("model_type")
    params = d.get("rope_parameters") or {}

    def theta(default: float) -> float:
        return float(params.get("rope_theta", d.get("rope_theta", default)))

    def head_dim(hidden: str = "hidden_size", heads: str = "num_attention_heads") -> int:
        if d.get("head_dim"):
            return int(d["head_dim"])
        return int(d[hidden]) // int(d[heads])

    if kind == "llama4_vision_model":
        return llama4(head_dim(), base=theta(10000.0), angles=angles)
    if kind == "dinov3_vit":
        prefix = 1 + int(d.get("num_register_tokens", 0) or 0)
        return dinov3(head_dim(), base=theta(100.0), prefix_tokens=prefix, angles=angles)
    if kind == "pixtral":
        if params.get("rope_type", "axial") != "axial":
            raise ValueError(
                f"a pixtral vision config takes rope_type 'axial', got {params.get('rope_type')!r}"
            )
        return pixtral(head_dim(), base=theta(10000.0), angles=angles)
    if kind in ("qwen2_vl", "qwen2_vl_vision"):
        return qwen2_vl(
            head_dim("embed_dim", "num_heads"),
            base=10000.0,  # (Qwen2VLVisionRotaryEmbedding's fixed theta)
            merge=int(d.get("spatial_merge_size", 2)),
            angles=angles,
        )
    raise ValueError(
        f"vision_rope reads llama4_vision_model, dinov3_vit, pixtral and qwen2_vl vision configs, "
        f"got model_type {kind!r}"
    )
