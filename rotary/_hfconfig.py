"""Hugging Face config parsing: a ``transformers`` config (object, dict or ``config.json``) to
:class:`~rotary._config.RopeConfig` per layer, without importing ``transformers``.

Reads what checkpoints publish and what ``transformers`` 5.x writes: ``rope_parameters`` (flat or
nested per layer type), the 4.x ``rope_scaling`` + ``rope_theta``, and the model-level keys some
families keep outside them (GPT-NeoX ``rotary_pct``, GPT-J ``rotary_dim``, DeepSeek
``qk_rope_head_dim``/``rope_interleave``, Gemma 3 ``rope_local_base_freq``, Llama 4 / SmolLM3
``no_rope_layers``, ModernBERT global/local theta, Qwen-VL ``mrope_section``...).  A config object
is read through its ``to_dict()`` (what ``save_pretrained`` writes), so objects and files share
one code path; the defaults ``transformers``' config classes fill in for missing keys are filled
in here per ``model_type`` (:data:`DEFAULT_THETA` and the family rules below).

A key that changes RoPE in some family but is not read for this config's ``model_type`` is an
error naming it, as is an unknown ``rope_type`` or scaling key: nothing is silently dropped.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import warnings
from collections.abc import Mapping
from typing import Any

from ._config import RopeConfig
from ._lib import _validation as v
from ._lib._typing import AngleMethod, Layout, PartialMode
from .scaling import Backwards, Linear, Scaling, from_dict

__all__ = [
    "DEFAULT_THETA",
    "LayerSpec",
    "ModelSpec",
    "hf_rope_parameters",
    "model_spec",
    "mrope_index_options",
    "mrope_spec",
    "rope_config",
]

_NEEDS_L0 = ("llama3", "yarn", "longrope")
_PROPORTIONAL_KEYS = ("factor", "partial_rotary_factor", "rope_theta")

#: ``rope_theta`` that ``transformers`` assumes when a config has none (its config classes'
#: ``default_theta``); 10000 for every other model type.  Per layer type where it differs.
DEFAULT_THETA: dict[str, float | dict[str, float]] = {
    "llama4": 500000.0,
    "mixtral": 1000000.0,
    "qwen2_vl": 1000000.0,
    "qwen2_5_vl": 1000000.0,
    "qwen3_vl": 500000.0,
    "qwen3_vl_moe": 500000.0,
    "cohere": 500000.0,
    "smollm3": 2000000.0,
    "gpt_oss": 150000.0,
    "phimoe": 1000000.0,
    "olmo3": 500000.0,
    "ernie4_5": 500000.0,
    "ernie4_5_moe": 500000.0,
    "helium": 100000.0,
    "lfm3": 1000000.0,
    "openai_privacy_filter": 150000.0,
    # the census families' config classes (transformers 5.24 default_theta)
    "apertus": 12000000.0,
    "apertus1p5": 12000000.0,
    "bitnet": 500000.0,
    "cosmos3_edge": 100000000.0,
    "csm": 500000.0,
    "cwm": 1000000.0,
    "dots3_note": 80000000.0,
    "emu3_text_model": 1000000.0,
    "flex_olmo": 500000.0,
    "gte": 160000.0,
    "hy_v3": 11158840.0,
    "jina_embeddings_v3": 20000.0,
    "lfm2": 1000000.0,
    "lfm2_moe": 1000000.0,
    "longcat_flash": 10000000.0,
    "minimax": 1000000.0,
    "minimax_m2": 5000000.0,
    "minimax_m3_vl": 5000000.0,
    "mllama_text_model": 500000.0,
    "muse_glimmer_assistant": 500000.0,
    "nomic_bert": 1000.0,
    "paddleocr_vl": 500000.0,
    "qwen2_5_omni": 1000000.0,
    "qwen3_omni_moe": 1000000.0,
    "ernie4_5_vl_moe": 500000.0,
    "blt_global_transformer": 500000.0,
    "blt_local_decoder": 500000.0,
    "blt_local_encoder": 500000.0,
    "solar_open": 1000000.0,
    "gemma3n": {"full_attention": 1000000.0, "sliding_attention": 10000.0},
    "modernbert-decoder": {"full_attention": 160000.0, "sliding_attention": 10000.0},
    "neomme": {"full_attention": 1000000.0, "sliding_attention": 10000.0},
    "t5gemma2": {"full_attention": 1000000.0, "sliding_attention": 10000.0},
    "gemma3": {"full_attention": 1000000.0, "sliding_attention": 10000.0},
    "gemma4": {"full_attention": 1000000.0, "sliding_attention": 10000.0},
    "modernbert": {"full_attention": 160000.0, "sliding_attention": 10000.0},
}

#: Families whose ``transformers`` attention rotates only part of each head
#: (``partial_rotary_factor``); the others rotate the whole head.
_PARTIAL = frozenset(
    {"phi", "phi3", "stablelm", "gpt_neox", "glm", "glm4", "gemma4"}
    # their apply_rotary_pos_emb rotates ``cos.shape[-1]`` features and passes the rest through, and
    # their rotary embeddings read partial_rotary_factor (transformers 5.24, the census)
    | {"qwen3_5", "qwen3_5_moe", "qwen3_next", "nemotron", "persimmon", "laguna", "lfm3", "mimo_v2_flash"}
    | {"minimax_m2", "minimax_m3_vl", "moonshine", "glm4_moe", "glm4v", "glm4v_moe", "glm_ocr"}
    # found by the census's partial probe (tests/hf_census.py: partial_probe)
    | {
        "apertus",
        "apertus1p5",
        "cwm",
        "gpt_neox_japanese",
        "mellum",
        "ministral3",
        "phi4_multimodal",
        "qwen4_exp",
        "solar_open",
        "step3p5",
    }
    | {
        "moonshine_streaming",
        "neomme",
        "gemma4_unified",
        "diffusion_gemma",
        "zaya",
        "recurrent_gemma",
        "bamba",
    }
)
#: Of those, the families whose own ``compute_default_rope_parameters`` ignores
#: ``partial_rotary_factor`` (only their ``proportional`` layers and the scaled rope types of
#: transformers' ``ROPE_INIT_FUNCTIONS`` read it).
_DEFAULT_IGNORES_PRF = frozenset({"gemma4", "gemma4_unified", "diffusion_gemma", "lfm3"})
#: ``partial_rotary_factor`` when a config has none.
_DEFAULT_PRF = {
    "phi": 0.5,
    "stablelm": 0.25,
    "gpt_neox": 0.25,
    "glm": 0.5,
    "glm4": 0.5,
    "bamba": 0.5,
    "glm4_moe": 0.5,
    "glm4v_moe": 0.5,
    "moonshine": 0.9,
    "moonshine_streaming": 0.8,
    "nemotron": 0.5,
    "persimmon": 0.5,
    "qwen3_5": 0.25,
    "qwen3_5_moe": 0.25,
    "qwen3_next": 0.25,
    "recurrent_gemma": 0.5,
}
#: Families that pair features ``(2i, 2i + 1)`` (rotate-every-two, complex view or
#: ``repeat_interleave``); DeepSeek-V3 only with ``rope_interleave`` (its default).
_INTERLEAVED = frozenset(
    {"gptj", "codegen", "cohere", "cohere2", "glm", "glm4", "chatglm", "llama4", "deepseek_v2"}
    # helium, ernie4_5(_moe), moonshine_streaming: apply_rotary_pos_emb interleaves cos
    # (repeat_interleave) and rotates (2i, 2i + 1); cohere2_moe:
    # Cohere's rotate_half of (2i, 2i + 1); openai_privacy_filter: _apply_rotary_emb over x[..., ::2]
    # and x[..., 1::2] (transformers 5.24)
    | {"helium", "ernie4_5", "ernie4_5_moe", "cohere2_moe", "openai_privacy_filter", "moonshine_streaming"}
    | {"moonshine", "ernie4_5_vl_moe"}
    # BLT's sub-models: repeat_interleave'd cos, rotate_half of (2i, 2i + 1)
    | {"blt_local_encoder", "blt_local_decoder", "blt_global_transformer", "blt_patcher"}
    # GLM-4V / GLM-OCR: rotate_half_llm of (2i, 2i + 1) over repeat_interleave'd cos
    | {"glm4v", "glm_ocr"}
    # DeepSeek-V4's apply_rotary_pos_emb: repeat_interleave'd cos, rotate_half of (2i, 2i + 1)
    | {"deepseek_v4"}
    # MLA attentions that call apply_rotary_pos_emb_interleave whatever the config says
    # (hy_v4_vl: its apply_rotary_pos_emb repeat-interleaves cos and rotates (2i, 2i + 1))
    | {
        "axk2",
        "bailing_hybrid",
        "deepseek_v32",
        "dots3_note",
        "glm_moe_dsa",
        "hy_v4_vl",
        "longcat_flash",
        "mistral_large4",
    }
)
#: MLA attentions that choose apply_rotary_pos_emb_interleave by ``config.rope_interleave``
#: (default true; ``sarvam_mla`` runs DeepSeek-V3's modeling code).  The other MLA families
#: (MiniCPM3, HunYuan v4) pair ``(i, i + d/2)``.
_INTERLEAVE_FLAG = frozenset({"deepseek_v3", "sarvam_mla", "axk1", "glm4_moe_lite", "mistral4", "youtu"})
#: Attentions that scale queries by ``1 + beta * log(1 + floor(pos / original_max_position_embeddings))``
#: after RoPE, ``beta`` being ``rope_parameters["llama_4_scaling_beta"]`` (transformers'
#: ``get_llama_4_attn_scale``): Ministral 3, Mistral 4.
_QUERY_SCALE_BETA = frozenset({"ministral3", "mistral4"})
#: Families with ``no_rope_layers`` (1: the layer uses RoPE); Llama 4 rebuilds an empty list
#: from ``no_rope_layer_interval``, the others only a missing one.
_NOPE_LAYERS = frozenset({"llama4", "smollm3", "mistral_large4"})
#: MLA attentions that do not scale their softmax by YaRN's ``mscale_all_dim`` (the others call
#: ``yarn_apply_mscale``).
_NO_MLA_MSCALE = frozenset({"dots3_note"})
#: GPT-J's rotary embedding (``create_sinusoidal_positions``: base 10000, ``rotary_dim`` features,
#: rotate-every-two), shared by CodeGen.
_GPTJ = frozenset({"gptj", "codegen"})
#: Families that rotate by ``-theta`` (NanoChat's rotate_half flips the signs: ``cat(x2, -x1)``).
_BACKWARDS = frozenset({"nanochat"})
#: Multimodal text RoPEs rotary does not read yet (3-D position ids recomposed into sections
#: other than Qwen-VL's): refused, never read as a plain RoPE.
_UNSUPPORTED_MROPE = frozenset({"glm_image"})
#: Multimodal RoPEs that are not rotations at image positions: read for text positions
#: (:func:`rotary.hf.from_hf`), refused for the model's layers and M-RoPE.
_NOT_A_ROTATION = {
    "hunyuan_vl": (
        "HunYuan-VL's XD-RoPE splits the duplicated frequencies cat(f, f) into mrope_section * 2 chunks "
        "(HunYuanVLRotaryEmbedding.recomposition_frequencies), so the two features of a pair take "
        "different position rows at image positions: not a rotation, which rotary does not represent. "
        "rotary.hf.from_hf gives its RoPE of text positions (all rows equal)"
    )
}
#: ERNIE-4.5-VL's text rotary embedding: ``mrope_section`` is (height, width, temporal); the
#: height and width frequencies alternate (h, w, h, w...), the temporal ones come last
#: (Ernie4_5_VLMoeTextRotaryEmbedding's permuted inv_freq and recomposition_frequencies).
_HW_ALTERNATING = {"ernie4_5_vl_moe": (22, 22, 20)}
#: NeoMME's rotary embedding: two position rows (height, width) whose pairs alternate, row 0 on
#: even pairs and row 1 on odd ones (NeoMMERotaryEmbedding.recomposition_frequencies).
_TWO_ROWS_ALTERNATING = frozenset({"neomme"})
#: M-RoPE families: default sections and whether the model interleaves them (it ignores the
#: ``mrope_interleaved`` key: Qwen3-VL always interleaves, Qwen2/2.5-VL never).
_MROPE = {
    "qwen2_vl": ((16, 24, 24), False),
    "qwen2_5_vl": ((16, 24, 24), False),
    "qwen3_vl": ((24, 20, 20), True),
    "qwen3_vl_moe": ((24, 20, 20), True),
    # the same recompositions in other families' text rotary embeddings (recomposition_frequencies):
    # Qwen3-VL's round robin (HunYuan v4 VL, Qwen3-Omni, Cohere Compass), Qwen2-VL's consecutive
    # sections (GLM-4V, GLM-4V-MoE, GLM-OCR)
    "hy_v4_vl": ((12, 10, 10), True),
    "qwen3_omni_moe": ((24, 20, 20), True),
    "cohere_compass": ((24, 20, 20), True),
    "glm4v": ((8, 12, 12), False),
    "glm4v_moe": ((8, 12, 12), False),
    "glm_ocr": ((8, 12, 12), False),
    "paddleocr_vl": ((16, 24, 24), False),
    "qwen2_5_omni": ((16, 24, 24), False),
    "qwen3_5": ((11, 11, 10), True),
    "qwen3_5_moe": ((11, 11, 10), True),
    "qwen4_exp": ((11, 11, 10), True),
    "cosmos3_edge": ((24, 20, 20), True),
}
#: M-RoPE families whose position ids :func:`rotary.positions.mrope_position_ids` computes.
_QWEN_VL = frozenset({"qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe"})
#: Families whose nested ``rope_parameters`` are keyed by RoPE labels, not layer types: the label
#: each layer type reads (DeepSeek-V4: ``DeepseekV4Attention.rope_layer_type``).
_ROPE_KEYS = {
    "deepseek_v4": {
        "sliding_attention": "main",
        "compressed_sparse_attention": "compress",
        "heavily_compressed_attention": "compress",
    }
}
#: Families that derive ``layer_types`` with every that many-th layer global (full attention).
_SLIDING_EVERY = {"gemma2": 2, "gpt_oss": 2, "gemma3": 6, "cohere2": 4, "gemma4": 6}
#: Families whose RoPE parameters differ per layer type (full vs sliding attention).
_PER_TYPE = frozenset({"gemma3", "gemma4", "modernbert"})

#: Model-level keys that change RoPE, and the families that read them.  Present (not null)
#: in a config of another family, they are an error rather than silently ignored.
_MODEL_KEYS: dict[str, frozenset[str]] = {
    "rotary_pct": frozenset({"gpt_neox"}),
    "rotary_emb_base": frozenset({"gpt_neox"}),
    "rope_pct": frozenset({"stablelm"}),
    "rotary_dim": frozenset({"gptj", "codegen", "minimax_m2", "minimax_m3_vl"}),
    "rope_interleave": _INTERLEAVE_FLAG,
    "rope_local_base_freq": frozenset({"gemma3"}),
    "no_rope_layers": _NOPE_LAYERS,
    "no_rope_layer_interval": _NOPE_LAYERS,
    "global_rope_theta": frozenset({"modernbert"}),
    "local_rope_theta": frozenset({"modernbert"}),
    "global_head_dim": frozenset({"gemma4"}),
    "rope_ratio": frozenset({"chatglm"}),
    "kv_channels": frozenset({"chatglm", "jetmoe", "zamba2"}),
    "mrope_section": frozenset({*_MROPE, *_HW_ALTERNATING, *_NOT_A_ROTATION}),
    "mrope_interleaved": frozenset(_MROPE),
    "use_dynamic_ntk": frozenset(),
    "use_logn_attn": frozenset(),
}
#: Model types (their ``model_type`` as configs write it, less ``_text``) that the census
#: (``tests/hf_census.py``, transformers 5.24) reads bit for bit: no warning for them.
_CENSUS_MATCHED = frozenset(
    "afmoe apertus apertus1p5 arcee aria axk1 axk2 bailing_hybrid bamba beam bitnet "
    "blt_global_transformer blt_local_decoder blt_local_encoder blt_patcher chameleon codegen "
    "cohere cohere2 cohere2_moe cohere_compass cosmos3_edge csm cwm dbrx deepseek_ocr2 "
    "deepseek_v2 deepseek_v3 deepseek_v32 deepseek_v4 dia_decoder diffllama diffusion_gemma "
    "doge dory dots1 dots3_note embedding_gemma2 emu3_text_model ernie4_5 ernie4_5_moe "
    "ernie4_5_vl_moe esm esmc eurobert exaone4 exaone_moe falcon falcon_h1 flex_olmo flint "
    "gemma gemma2 gemma3 gemma3n gemma4 gemma4_unified glm glm4 glm4_moe glm4_moe_lite glm4v "
    "glm4v_moe glm_moe_dsa glm_ocr gpt_neox gpt_neox_japanese gpt_oss gptj gradium_phonon_tts "
    "granite granite_docling granite_swa granitemoe granitemoe_swa granitemoehybrid "
    "granitemoeshared gte helium hrm hunyuan_v1_dense hunyuan_v1_moe hunyuan_vl hy_v3 hy_v4 "
    "hy_v4_vl hyperclovax idefics jais2 jetmoe jina_embeddings_v3 kolibri1 laguna lara_mini "
    "lfm2 lfm2_moe lfm3 llama llama4 longcat_flash mellum mimi mimo_v2_flash minicpm3 minimax "
    "minimax_m2 minimax_m3_vl ministral ministral3 mistral mistral4 mistral_large4 mixtral "
    "mllama_text_model modernbert modernbert-decoder molmo2 moonshine moonshine_streaming moshi "
    "muse_glimmer muse_glimmer_assistant muse_spark nanochat nemotron neomme neucodec "
    "nomic_bert olmo olmo2 olmo3 olmo_hybrid olmoe openai_privacy_filter paddleocr_vl persimmon "
    "phi phi3 phi4_multimodal phimoe pocket_tts qwen2 qwen2_5_omni qwen2_5_vl qwen2_moe "
    "qwen2_vl qwen3 qwen3_5 qwen3_5_moe qwen3_moe qwen3_next qwen3_omni_moe qwen3_vl "
    "qwen3_vl_moe qwen4_exp recurrent_gemma seed_oss smollm3 solar_open stablelm starcoder2 "
    "step3p5 t5_gemma_module t5gemma2 timesfm2_5 ultrabert unlimited_ocr vaultgemma "
    "voxtral_realtime xcodec2 youtu zamba2 zaya ".split()
)
#: Every family rotary.hf knows: those with a rule above, and the plain Llama-style ones.
_KNOWN = frozenset(
    {
        "llama",
        "mistral",
        "qwen2",
        "qwen2_moe",
        "qwen3",
        "qwen3_moe",
        "gemma",
        "gemma2",
        "falcon",
        "olmo",
        "olmo2",
        "granite",
        "granitemoe",
        "internlm2",
    }
).union(
    _PARTIAL,
    _INTERLEAVED,
    _INTERLEAVE_FLAG,
    _BACKWARDS,
    _PER_TYPE,
    _MROPE,
    DEFAULT_THETA,
    *_MODEL_KEYS.values(),
    _QUERY_SCALE_BETA,
    _CENSUS_MATCHED,
)

#: transformers' ``attribute_map`` of the config classes (the names a config stores its sizes
#: under: ``getattr(config, "head_dim")`` reads ``kv_channels`` for JetMoE), for the keys RoPE
#: needs; ``tests/test_hf_census.py`` checks it against the installed config classes.
_ATTRIBUTE_MAP: dict[str, dict[str, str]] = {
    "bailing_hybrid": {"max_position_embeddings": "model_max_length"},
    "codegen": {
        "max_position_embeddings": "n_positions",
        "hidden_size": "n_embd",
        "num_attention_heads": "n_head",
        "num_hidden_layers": "n_layer",
    },
    "dbrx": {
        "num_attention_heads": "n_heads",
        "hidden_size": "d_model",
        "num_hidden_layers": "n_layers",
        "max_position_embeddings": "max_seq_len",
    },
    "glm4_moe_lite": {"head_dim": "qk_rope_head_dim"},
    "gptj": {
        "max_position_embeddings": "n_positions",
        "hidden_size": "n_embd",
        "num_attention_heads": "n_head",
        "num_hidden_layers": "n_layer",
    },
    "jetmoe": {"head_dim": "kv_channels"},
    "moonshine": {
        "num_attention_heads": "decoder_num_attention_heads",
        "num_hidden_layers": "decoder_num_hidden_layers",
    },
    "zamba2": {"head_dim": "attention_head_dim"},
}
#: Names of the same size in configs of no known family (published configs of remote-code models).
_ALIASES = {
    "hidden_size": ("hidden_size", "n_embd", "n_embed", "d_model"),
    "num_attention_heads": ("num_attention_heads", "n_head", "num_heads"),
    "max_position_embeddings": ("max_position_embeddings", "n_positions", "seq_length"),
    "num_hidden_layers": ("num_hidden_layers", "n_layer", "num_layers"),
}

#: Settings read for :attr:`ModelSpec.attention` (they change attention, not RoPE).
_ATTENTION_KEYS = (
    "sliding_window",
    "attention_chunk_size",
    "attn_temperature_tuning",
    "floor_scale",
    "attn_scale",
    "use_qk_norm",
    "query_pre_attn_scalar",
    "attn_logit_softcapping",
    "attention_multiplier",
    "local_attention",
)


def _as_dict(config: Any, name: str = "config") -> dict[str, Any]:
    """A config object, a dict, or a path to a ``config.json`` or a checkpoint folder, as a dict."""
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
    if isinstance(config, Mapping):
        return dict(config)
    to_dict = getattr(config, "to_dict", None)
    if callable(to_dict):  # a transformers config: what save_pretrained writes
        d = to_dict()
        if isinstance(d, Mapping):
            return dict(d)
    if config is None or not hasattr(config, "__dict__"):
        raise TypeError(
            f"{name} must be a transformers config object, a dict or a path to a config.json, "
            f"got {type(config).__name__}"
        )
    return {k: val for k, val in vars(config).items() if not k.startswith("_")}


def _family(model_type: Any) -> str | None:
    if not isinstance(model_type, str):
        return None
    mt = model_type.removesuffix("_text")
    return "stablelm" if mt == "stablelm_epoch" else mt


class _Cfg:
    """A config as one flat dict (a multimodal config's ``text_config`` merged over it)."""

    def __init__(self, config: Any) -> None:
        d = _as_dict(config)
        text = d.get("text_config")
        if text is not None:
            d = {**{k: val for k, val in d.items() if k != "text_config"}, **_as_dict(text, "text_config")}
        self.d = d
        mt = d.get("model_type")
        self.model_type: str | None = mt if isinstance(mt, str) and mt else None
        self.family = _family(self.model_type)
        self._check_model_keys()
        if self.family is not None and self.family not in _KNOWN:
            warnings.warn(
                f"model_type {self.model_type!r} is not one rotary.hf knows: read as a Llama-style config "
                "(half layout; the whole head unless partial_rotary_factor). Check the model's attention "
                "code for its pairing and rotated features",
                UserWarning,
                stacklevel=4,
            )

    def get(self, name: str, default: Any = None) -> Any:
        mapped = _ATTRIBUTE_MAP.get(self.family or "", {}).get(name)
        for key in ((mapped,) if mapped else ()) + _ALIASES.get(name, (name,)):
            val = self.d.get(key)
            if val is not None:
                return val
        return default

    def has(self, name: str) -> bool:
        return self.get(name) is not None

    def _check_model_keys(self) -> None:
        if self.family in _UNSUPPORTED_MROPE:
            raise ValueError(
                f"model_type {self.model_type!r} applies a multimodal RoPE (3-D position ids recomposed into "
                "sections) that rotary does not read yet; only Qwen2-VL / Qwen2.5-VL / Qwen3-VL M-RoPE is "
                "supported (rotary.hf.mrope_from_hf)"
            )
        for key, families in _MODEL_KEYS.items():
            if self.d.get(key) is None or self.family in families:
                continue
            where = (
                f"read only for model_type {sorted(families)}"
                if families
                else "not supported by rotary (remote-code models with their own attention)"
            )
            raise ValueError(
                f"config key {key!r} changes RoPE but is {where}; this config has model_type="
                f"{self.model_type!r}. Set model_type, or remove the key if the model does not use it"
            )
        if self.d.get("alibi"):
            raise ValueError("config has alibi=true: the model uses ALiBi position biases, not RoPE")
        pet = self.d.get("position_embedding_type")
        if pet is not None and pet not in ("rope", "rotary"):
            raise ValueError(f"config has position_embedding_type={pet!r}, not a rotary position embedding")
        if self.family == "zamba2" and not self.d.get("use_mem_rope", False):
            # Zamba2Attention rotates only with use_mem_rope (its default is false)
            raise ValueError(
                "Zamba2 config has use_mem_rope=false (its default): the shared attention blocks apply no "
                "position embedding, so there is no RoPE to read"
            )
        if self.family == "chatglm" and self.d.get("original_rope") is False:
            raise ValueError(
                "ChatGLM config has original_rope=false, a RoPE variant rotary does not implement"
            )

    # -- sizes ---------------------------------------------------------------------------------
    def count(self, name: str) -> int | None:
        """``num_hidden_layers`` or ``max_position_embeddings`` (or an alias), checked."""
        n = self.get(name)
        return None if n is None else v.check_int(n, name, minimum=1)

    def mla(self, index: int | None) -> tuple[int, int] | None:
        """``(qk_nope_head_dim, qk_rope_head_dim)`` of layer ``index`` in a multi-head latent
        attention config (one with ``qk_rope_head_dim``; ``per_layer_config`` may override both),
        else ``None``.  Its attention splits each query head into ``q_nope`` then ``q_rot`` and
        rotates ``q_rot`` and the shared ``k_rot``: RoPE's head is ``qk_rope_head_dim`` wide."""
        o = self._layer_override(index)
        rope = o.get("qk_rope_head_dim", self.get("qk_rope_head_dim"))
        if rope is None:
            return None
        nope = o.get("qk_nope_head_dim", self.get("qk_nope_head_dim"))
        if nope is None:  # DeepSeek-V4: heads of head_dim features, [nope | rope]
            full = o.get("head_dim", self.get("head_dim"))
            nope = (
                0
                if full is None
                else v.check_int(full, "head_dim", minimum=1) - v.check_int(rope, "qk_rope_head_dim")
            )
        return (
            v.check_int(nope, "qk_nope_head_dim", minimum=0),
            v.check_head_dim(rope, "qk_rope_head_dim"),
        )

    def head_dim(self, layer_type: str | None, index: int | None) -> int:
        """The width RoPE's head has: ``qk_rope_head_dim`` in MLA, else :meth:`full_head_dim`."""
        mla = self.mla(index)
        return self.full_head_dim(layer_type, index) if mla is None else mla[1]

    def full_head_dim(self, layer_type: str | None, index: int | None) -> int:
        fam = self.family
        if fam == "chatglm" and self.has("kv_channels"):
            return v.check_head_dim(self.get("kv_channels"), "kv_channels")
        override = self._layer_override(index).get("head_dim")
        if override is not None:
            return v.check_head_dim(override, f"per_layer_config[{index}] head_dim")
        if fam == "gemma4" and layer_type == "full_attention":
            # Gemma 4's global layers have their own head size (transformers default 512).
            return v.check_head_dim(self.get("global_head_dim", 512), "global_head_dim")
        head_dim = self.get("head_dim")
        if head_dim:
            return v.check_head_dim(head_dim, "head_dim")
        hidden, heads = self.get("hidden_size"), self.get("num_attention_heads")
        if not hidden or not heads:
            raise ValueError("config needs head_dim, or hidden_size and num_attention_heads")
        hidden = v.check_int(hidden, "hidden_size", minimum=1)
        heads = v.check_int(heads, "num_attention_heads", minimum=1)
        if hidden % heads:
            raise ValueError(
                f"hidden_size={hidden} is not a multiple of num_attention_heads={heads}; give head_dim"
            )
        return v.check_head_dim(hidden // heads, "hidden_size // num_attention_heads")

    @functools.cached_property
    def per_layer(self) -> dict[int, dict[str, Any]]:
        """``per_layer_config`` (transformers' heterogeneous layers: overrides of the global config
        per layer index) with integer keys (``to_dict()`` writes them as zero-padded strings,
        ``"05"``)."""
        plc = self.d.get("per_layer_config")
        if not isinstance(plc, Mapping):
            return {}
        out: dict[int, dict[str, Any]] = {}
        for k, o in plc.items():
            try:
                i = int(k)
            except (TypeError, ValueError):
                raise ValueError(f"per_layer_config keys must be layer indices, got {k!r}") from None
            if isinstance(o, Mapping):
                out[i] = dict(o)
        return out

    def _layer_override(self, index: int | None) -> dict[str, Any]:
        return {} if index is None else self.per_layer.get(index, {})

    # -- layers --------------------------------------------------------------------------------
    @functools.cached_property
    def uses_rope(self) -> tuple[bool, ...] | None:
        """Llama 4 / SmolLM3 ``no_rope_layers`` (1: the layer uses RoPE, 0: NoPE)."""
        n = self.count("num_hidden_layers")
        if n is None or self.family not in _NOPE_LAYERS:
            return None
        flags = self.d.get("no_rope_layers")
        # transformers: Llama 4 rebuilds an empty list, SmolLM3 only a missing one.
        if flags is None or (self.family == "llama4" and not flags):
            interval = v.check_int(self.get("no_rope_layer_interval", 4), "no_rope_layer_interval", minimum=1)
            return tuple((i + 1) % interval != 0 for i in range(n))
        flags = v.check_sequence(flags, "no_rope_layers", "0/1 flags")
        if len(flags) != n:
            raise ValueError(f"no_rope_layers must have num_hidden_layers={n} entries, got {len(flags)}")
        return tuple(bool(v.check_int(f, f"no_rope_layers[{i}]", minimum=0)) for i, f in enumerate(flags))

    @functools.cached_property
    def layer_types(self) -> tuple[str, ...] | None:
        """``layer_types`` (given, or derived as ``transformers`` derives them)."""
        n = self.count("num_hidden_layers")
        lt = self.d.get("layer_types")
        fam = self.family
        if lt is not None:
            types = tuple(str(t) for t in v.check_sequence(lt, "layer_types", "layer type names"))
            if n is not None and len(types) != n:
                raise ValueError(f"layer_types must have num_hidden_layers={n} entries, got {len(types)}")
        elif n is None:
            return None
        elif fam in _SLIDING_EVERY:  # every that many-th layer is global
            every = _SLIDING_EVERY[fam]
            if fam in ("gemma3", "cohere2"):
                every = v.check_int(
                    self.get("sliding_window_pattern", every), "sliding_window_pattern", minimum=1
                )
            types = tuple("sliding_attention" if (i + 1) % every else "full_attention" for i in range(n))
        elif fam == "modernbert":  # the first of every that many layers is global
            every = v.check_int(
                self.get("global_attn_every_n_layers", 3), "global_attn_every_n_layers", minimum=1
            )
            return tuple("sliding_attention" if i % every else "full_attention" for i in range(n))
        elif (rope := self.uses_rope) is None or fam not in ("llama4", "smollm3"):
            return None
        elif fam == "llama4":
            return tuple("chunked_attention" if r else "full_attention" for r in rope)
        else:  # smollm3
            sliding = bool(self.get("use_sliding_window")) and self.has("sliding_window")
            return tuple("sliding_attention" if sliding and not r else "full_attention" for r in rope)
        if fam == "gemma4" and types and types[-1] != "full_attention":
            types = (*types[:-1], "full_attention")  # transformers forces it (with a warning)
        return types

    def has_rope(self, index: int) -> bool:
        """Whether layer ``index`` applies RoPE (not a NoPE layer, nor a Cohere 2 global layer)."""
        uses, types = self.uses_rope, self.layer_types
        if uses is not None and not uses[index]:
            return False
        return not (self.family == "cohere2" and types is not None and types[index] == "full_attention")

    # -- RoPE parameters -----------------------------------------------------------------------
    def _dict(self, key: str) -> dict[str, Any] | None:
        val = self.d.get(key)
        if val is None:
            return None
        if not isinstance(val, Mapping):
            raise TypeError(f"config {key} must be a dict, got {type(val).__name__}")
        return dict(val)

    def nested_types(self) -> tuple[str, ...]:
        """Layer types with their own RoPE parameters (nested ``rope_parameters`` or a family rule)."""
        rp = self._dict("rope_parameters") or {}
        if any(isinstance(val, Mapping) for val in rp.values()):
            return tuple(k for k, val in rp.items() if isinstance(val, Mapping) or val is None)
        if self.family in _PER_TYPE:
            return ("full_attention", "sliding_attention")
        return ()

    def raw_params(self, layer_type: str | None, source: str | None = None) -> dict[str, Any] | None:
        """The RoPE parameter dict of ``layer_type`` before defaults (``None``: no RoPE there).

        ``source`` picks ``"rope_parameters"`` or ``"rope_scaling"`` alone (to compare them)."""
        rp = self._dict("rope_parameters") if source in (None, "rope_parameters") else None
        rs = self._dict("rope_scaling") if source in (None, "rope_scaling") else None
        fam = self.family
        if rp is not None and any(isinstance(val, Mapping) for val in rp.values()):
            if layer_type is None:
                raise _pass_layer_type([k for k, val in rp.items() if isinstance(val, Mapping)])
            layer_type = _ROPE_KEYS.get(fam or "", {}).get(layer_type, layer_type)
            if layer_type not in rp:
                if layer_type in (self.layer_types or ()):
                    return None  # a layer type the config gives no RoPE parameters: no RoPE there
                raise ValueError(
                    f"layer_type must be one of {list(rp)} (the config's rope_parameters), got {layer_type!r}"
                )
            entry = rp[layer_type]
            if entry is None:
                return None
            out = dict(entry)
            if rs is not None and (
                fam == "modernbert" or (fam == "gemma3" and layer_type == "full_attention")
            ):
                out.update(rs)
            return out
        flat = rs if rs is not None else rp
        if fam in _PER_TYPE:
            if layer_type not in ("full_attention", "sliding_attention"):
                raise ValueError(
                    f"layer_type must be 'full_attention' or 'sliding_attention' for model_type "
                    f"{self.model_type!r}, got {layer_type!r}"
                )
            if fam == "gemma3":  # rope_scaling is the global layers'
                return dict(flat or {}) if layer_type == "full_attention" else {"rope_type": "default"}
            if fam == "modernbert":  # rope_scaling applies to both
                return dict(flat or {})
            # gemma4 without rope_parameters: transformers' defaults
            if flat is not None:
                raise ValueError(
                    "Gemma 4 configs need rope_parameters nested per layer type "
                    "({'full_attention': {...}, 'sliding_attention': {...}}), got a flat dict"
                )
            if layer_type == "full_attention":
                return {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0}
            return {"rope_type": "default", "rope_theta": 10000.0}
        if flat is None and fam in ("gpt_oss", "openai_privacy_filter"):
            return {
                "rope_type": "yarn",
                "factor": 32.0,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "truncate": False,
                "original_max_position_embeddings": 4096,
            }
        return dict(flat or {})

    def theta(self, layer_type: str | None) -> Any:
        """The base a layer type takes when its RoPE parameters have no ``rope_theta``: the
        model-level key, else the ``transformers`` default."""
        fam = self.family
        if fam == "gemma3" and layer_type == "sliding_attention":
            theta = self.get("rope_local_base_freq")
        elif fam == "modernbert":
            theta = self.get("global_rope_theta" if layer_type == "full_attention" else "local_rope_theta")
        else:
            theta = self.get("rope_theta")
            if theta is None and fam == "gpt_neox":
                theta = self.get("rotary_emb_base")
            if theta is None and fam == "chatglm":
                theta = 10000.0 * v.check_float(self.get("rope_ratio", 1.0), "rope_ratio", above=0.0)
        if theta is not None:
            return theta
        d = DEFAULT_THETA.get(fam or "", 10000.0)
        return d.get(layer_type or "full_attention", 10000.0) if isinstance(d, dict) else d


@dataclasses.dataclass(frozen=True)
class LayerSpec:
    """One layer's RoPE: its configuration, and M-RoPE sections where the model has them."""

    config: RopeConfig
    sections: tuple[int, ...] | None = None
    interleaved: bool = False
    rows: tuple[int, ...] | None = None


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """Every layer's RoPE (``None``: no RoPE in that layer) and what else the config says."""

    model_type: str | None
    layer_types: tuple[str, ...] | None
    layers: tuple[LayerSpec | None, ...]
    attention: tuple[tuple[str, Any], ...]
    rope_slice: tuple[int, int] | None
    notes: tuple[str, ...]


def _kind(p: dict[str, Any], family: str | None) -> str:
    # legacy Qwen2-VL ``"mrope"``: default RoPE plus mrope_section (transformers 5 writes
    # rope_type "default" beside the old type "mrope")
    rt, t = (
        None if x is None else "default" if x == "mrope" else x for x in (p.get("rope_type"), p.get("type"))
    )
    if rt is not None and t is not None and rt != t:
        raise ValueError(f"RoPE parameters give rope_type={rt!r} and type={t!r}; they must agree")
    kind = rt if rt is not None else (t if t is not None else "default")
    if not isinstance(kind, str):
        raise TypeError(f"rope_type must be a string, got {kind!r}")
    if family == "phi3" and kind in ("su", "yarn"):  # transformers maps both to longrope for Phi-3
        kind = "longrope"
    if kind == "dynamic" and p.get("alpha"):
        # HunYuan's fixed-alpha "dynamic" scaling: transformers reads it as ntk_alpha (static)
        kind = "ntk_alpha"
    return kind


def _param(cfg: _Cfg, p: dict[str, Any], key: str) -> Any:
    """``p[key]``, else the config's model-level ``key`` (``None``: neither)."""
    val = p.get(key)
    return cfg.get(key) if val is None else val


def _pass_layer_type(kinds: list[str]) -> ValueError:
    return ValueError(f"config has per-layer RoPE parameters for {kinds}; pass layer_type= one of them")


def _flat(
    cfg: _Cfg, layer_type: str | None, index: int | None, source: str | None = None
) -> dict[str, Any] | None:
    """Standardised RoPE parameters of one layer type (as transformers standardises them)."""
    raw = cfg.raw_params(layer_type, source)
    if raw is None:
        return None
    fam = cfg.family
    p = {k: val for k, val in raw.items() if k != "type"}
    p["rope_type"] = _kind(raw, fam)
    if fam == "qwen3_omni_moe" and "interleaved" in p:  # Qwen3-Omni's name of mrope_interleaved
        alias = p.pop("interleaved")
        if p.get("mrope_interleaved", alias) != alias:
            raise ValueError(
                f"rope parameters give interleaved={alias!r} and mrope_interleaved={p['mrope_interleaved']!r}"
            )
        p["mrope_interleaved"] = alias
    theta = p.get("rope_theta")
    p["rope_theta"] = v.check_base(cfg.theta(layer_type) if theta is None else theta, "rope_theta")
    prf = _param(cfg, p, "partial_rotary_factor")
    for key in ("rotary_pct", "rope_pct"):
        alt = cfg.get(key)
        if alt is not None:
            if prf is not None and float(prf) != float(alt):
                raise ValueError(
                    f"config gives partial_rotary_factor={prf!r} and {key}={alt!r}; they must agree"
                )
            prf = alt
    rd = cfg.get("rotary_dim") if fam in ("minimax_m2", "minimax_m3_vl") else None
    if rd is not None:
        rd = v.check_int(rd, "rotary_dim", minimum=1)
        full = cfg.full_head_dim(layer_type, index)
        if fam == "minimax_m2" and prf is None:
            # MiniMaxM2Config.convert_rope_params_to_dict: the released checkpoints' rotary_dim
            # is the default partial_rotary_factor (rotary_dim / head_dim)
            prf = rd / full
        elif fam == "minimax_m3_vl" and rd != (rotated := int(full * (1.0 if prf is None else float(prf)))):
            warnings.warn(
                f"MiniMax-M3-VL config has rotary_dim={rd}, which transformers' attention ignores: it "
                f"rotates head_dim * partial_rotary_factor = {rotated} "
                "features, and rotary.hf follows transformers. Set partial_rotary_factor = rotary_dim / "
                "head_dim if the checkpoint rotates rotary_dim features",
                UserWarning,
                stacklevel=5,
            )
    if prf is None:
        prf = _DEFAULT_PRF.get(fam or "", 1.0)
    prf = v.check_float(prf, "partial_rotary_factor", above=0.0)
    if prf > 1.0:
        raise ValueError(f"partial_rotary_factor must be in (0, 1], got {prf}")
    mla = cfg.mla(index)
    if mla is not None and prf != 1.0:
        # transformers sizes the rotary embedding head_dim * partial_rotary_factor; an MLA config
        # with a factor gives head_dim as the whole q/k head (Mistral 4, Dots 3), and the product
        # must be qk_rope_head_dim, the features the attention rotates.
        given = cfg.has("head_dim") or "head_dim" in cfg._layer_override(index)
        full = cfg.full_head_dim(layer_type, index) if given else sum(mla)
        if int(full * prf) != mla[1]:
            raise ValueError(
                f"partial_rotary_factor={prf} with qk_rope_head_dim={mla[1]}: the factor of an MLA config "
                f"must be qk_rope_head_dim / head_dim (head_dim={full}), the fraction of the q/k head that "
                "the attention rotates"
            )
        prf = 1.0
    p["partial_rotary_factor"] = prf
    p["head_dim"] = cfg.head_dim(layer_type, index)
    max_pos = cfg.count("max_position_embeddings")
    p["max_position_embeddings"] = max_pos
    if p["rope_type"] in _NEEDS_L0:
        # transformers gives a top-level original_max_position_embeddings priority (Phi-3's
        # config class always has one, default 4096).
        top = cfg.get("original_max_position_embeddings")
        if top is None and fam == "phi3":
            top = 4096
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


def _layout(cfg: _Cfg) -> Layout:
    fam = cfg.family
    if fam in _INTERLEAVED:
        return "interleaved"
    if fam in _INTERLEAVE_FLAG:
        flag = cfg.get("rope_interleave", True)
        return "interleaved" if v.check_bool(flag, "rope_interleave") else "half"
    return "half"


def _spec(cfg: _Cfg, p: dict[str, Any], angles: AngleMethod) -> LayerSpec:
    fam = cfg.family
    head_dim = p["head_dim"]
    kind = p["rope_type"]
    prf = p["partial_rotary_factor"]
    base = p["rope_theta"]
    partial: PartialMode = "neox"
    if fam is not None and prf != 1.0 and fam not in _PARTIAL:
        raise ValueError(
            f"partial_rotary_factor={prf} but transformers' {cfg.model_type!r} attention rotates the whole "
            "head (it does not read partial_rotary_factor)"
        )
    if fam in _DEFAULT_IGNORES_PRF and prf != 1.0 and kind == "default":
        raise ValueError(
            f"partial_rotary_factor={prf} on a 'default' RoPE, which transformers' {cfg.model_type!r} "
            "rotary embedding builds over the whole head (only its 'proportional' layers read the factor)"
        )
    scaling: Scaling | None
    if fam in _GPTJ:
        rd = cfg.d.get("rotary_dim", 64)
        if rd is None:
            raise ValueError(
                f"{cfg.model_type!r} config has rotary_dim=null (a rotation of the whole hidden size), "
                "unsupported"
            )
        rotary_dim = v.check_int(rd, "rotary_dim", even=True)
        if kind != "default" or base != 10000.0:
            raise ValueError(
                f"{cfg.model_type!r}'s rotary embedding is fixed (base 10000, no scaling); transformers "
                f"ignores rope_theta/rope_scaling, got rope_type={kind!r}, rope_theta={base!r}"
            )
    elif fam == "chatglm":
        rotary_dim = head_dim // 2
        rotary_dim -= rotary_dim % 2
    elif kind == "proportional":
        # Gemma 4: exponent over head_dim, the first rotary_dim // 2 pairs rotate, and every
        # frequency is divided by factor (transformers: ``inv_freq /= factor``).
        partial = "proportional"
        rotary_dim = 2 * int(prf * head_dim // 2)
    else:
        rotary_dim = int(head_dim * prf)
        if rotary_dim % 2 or rotary_dim == 0:
            raise ValueError(
                f"head_dim={head_dim} * partial_rotary_factor={prf} gives rotary_dim={rotary_dim}; "
                "RoPE needs an even, positive number of rotated features"
            )
    if kind == "proportional":
        extra = set(p) - {"rope_type", "head_dim", "max_position_embeddings", *_PROPORTIONAL_KEYS}
        if extra:
            raise ValueError(
                f"rope_type 'proportional' does not take {', '.join(repr(k) for k in sorted(extra))}; its "
                f"parameters are {list(_PROPORTIONAL_KEYS)}"
            )
        factor = p.get("factor")
        factor = v.check_float(1.0 if factor is None else factor, "proportional factor", above=0.0)
        scaling = None if factor == 1.0 else Linear(factor)
    else:
        if fam in _QUERY_SCALE_BETA:  # a query scale of the attention, not RoPE's (see _attention)
            p = {k: val for k, val in p.items() if k != "llama_4_scaling_beta"}
        scaling = from_dict(
            p,
            max_position_embeddings=p["max_position_embeddings"],
            original_max_position_embeddings=p.get("original_max_position_embeddings"),
        )
    if fam in _BACKWARDS:
        if scaling is not None and type(scaling).rope_type != "default":
            raise ValueError(
                f"{cfg.model_type!r} rotates backwards; rotary reads it with the default RoPE only"
            )
        scaling = Backwards()
    config = RopeConfig(
        head_dim,
        rotary_dim=None if rotary_dim == head_dim else rotary_dim,
        base=base,
        layout=_layout(cfg),
        scaling=scaling,
        angles=angles,
        partial=partial,
    )
    if fam in _HW_ALTERNATING:
        h, w, t = v.check_positive_ints(
            _param(cfg, p, "mrope_section") or _HW_ALTERNATING[fam], "mrope_section"
        )
        if h != w or h + w + t != rotary_dim // 2:
            raise ValueError(
                f"ERNIE-4.5-VL's mrope_section (height, width, temporal) must have height == width and sum "
                f"to rotary_dim // 2 = {rotary_dim // 2}, got {(h, w, t)}"
            )
        return LayerSpec(config, (t, h, w), False, (1, 2) * h + (0,) * t)
    if fam in _TWO_ROWS_ALTERNATING:
        if rotary_dim % 4:
            raise ValueError(
                f"{cfg.model_type!r} alternates its two position rows over the rotated pairs, which needs "
                f"rotary_dim divisible by 4, got {rotary_dim}"
            )
        n = rotary_dim // 4
        return LayerSpec(config, (n, n), False, (0, 1) * n)
    if fam in _NOT_A_ROTATION:
        return LayerSpec(config)  # text positions (model_spec and mrope_spec refuse the rest)
    sections, interleaved = _mrope(cfg, p)
    if sections is not None and interleaved and sum(sections) != rotary_dim // 2:
        # transformers' round robin starts from the temporal row and overwrites, among the
        # rotary_dim // 2 pairs, those it reaches: pair i takes row j = i % len(sections) if
        # j > 0 and i < len(sections) * sections[j].  The rows' counts give that same layout.
        rows = [
            i % len(sections)
            if 0 < i % len(sections) and i < len(sections) * sections[i % len(sections)]
            else 0
            for i in range(rotary_dim // 2)
        ]
        sections = tuple(rows.count(j) for j in range(len(sections)))
    return LayerSpec(config, sections, interleaved)


def _mrope(cfg: _Cfg, p: dict[str, Any]) -> tuple[tuple[int, ...] | None, bool]:
    fam = cfg.family
    sec, flag = _param(cfg, p, "mrope_section"), _param(cfg, p, "mrope_interleaved")
    if fam in _MROPE:
        default, interleaved = _MROPE[fam]
        if flag is not None and v.check_bool(flag, "mrope_interleaved") != interleaved:
            raise ValueError(
                f"config has mrope_interleaved={flag!r}, but transformers' {cfg.model_type!r} model "
                f"{'always' if interleaved else 'never'} interleaves its M-RoPE sections"
            )
        sections = v.check_positive_ints(default if sec is None else sec, "mrope_section")
        return sections, interleaved
    if sec is None:
        if flag is not None:
            raise ValueError("config has mrope_interleaved but no mrope_section")
        return None, False
    if flag is None and fam is not None:
        # a model type rotary does not know: its sections may be consecutive or round robin
        raise ValueError(
            f"config has mrope_section but model_type {cfg.model_type!r} is not one whose M-RoPE layout "
            f"rotary knows ({sorted(_MROPE)}); give mrope_interleaved (true: Qwen3-VL's round robin, "
            "false: Qwen2-VL's consecutive sections)"
        )
    return v.check_positive_ints(sec, "mrope_section"), bool(flag and v.check_bool(flag, "mrope_interleaved"))


def _check_sources(cfg: _Cfg, layer_type: str | None, index: int | None, angles: AngleMethod) -> None:
    """``rope_parameters`` and ``rope_scaling`` both given: they must describe the same RoPE."""
    rp, rs = cfg.d.get("rope_parameters"), cfg.d.get("rope_scaling")
    if not rp or not rs:
        return
    specs: list[LayerSpec | str | None] = []
    for source in ("rope_parameters", "rope_scaling"):
        try:
            p = _flat(cfg, layer_type, index, source)
            specs.append(None if p is None else _spec(cfg, p, angles))
        except (TypeError, ValueError) as e:
            specs.append(f"{type(e).__name__}: {e}")
    if specs[0] != specs[1]:
        raise ValueError(
            f"config has both rope_parameters={rp!r} and rope_scaling={rs!r} and they describe different "
            "RoPEs (transformers would read rope_scaling and drop rope_parameters); remove one"
        )


def _layer_spec(
    cfg: _Cfg, layer_type: str | None, index: int | None, angles: AngleMethod
) -> LayerSpec | None:
    _check_sources(cfg, layer_type, index, angles)
    p = _flat(cfg, layer_type, index)
    return None if p is None else _spec(cfg, p, angles)


def _attention(cfg: _Cfg) -> dict[str, Any]:
    out: dict[str, Any] = {}
    types = cfg.layer_types
    for key in _ATTENTION_KEYS:
        val = cfg.d.get(key)
        if val is None or val is False:
            continue
        if key == "sliding_window" and "use_sliding_window" in cfg.d and not cfg.d["use_sliding_window"]:
            continue
        if key == "attention_chunk_size" and types is not None and "chunked_attention" not in types:
            continue
        if key in ("floor_scale", "attn_scale") and not cfg.d.get("attn_temperature_tuning"):
            continue
        out[key] = val
    if cfg.family == "gpt_oss":
        out["attention_sinks"] = True
    if out.get("attn_temperature_tuning"):  # Llama 4's config defaults
        out.setdefault("floor_scale", 8192)
        out.setdefault("attn_scale", 0.1)
    if cfg.family in _QUERY_SCALE_BETA and not cfg.nested_types():
        p = cfg.raw_params(None) or {}
        beta = p.get("llama_4_scaling_beta")
        if beta is not None:
            length = p.get("original_max_position_embeddings")
            if length is None:
                raise ValueError(
                    "rope_parameters has llama_4_scaling_beta but no original_max_position_embeddings, "
                    "the length its query scale steps by"
                )
            out["llama_4_scaling_beta"] = v.check_float(beta, "llama_4_scaling_beta")
            out["llama_4_scaling_length"] = v.check_int(length, "original_max_position_embeddings", minimum=1)
    if cfg.mla(None) is not None and cfg.family not in _NO_MLA_MSCALE and not cfg.nested_types():
        # transformers' yarn_apply_mscale: a scaled MLA RoPE with mscale_all_dim scales the softmax
        p = cfg.raw_params(None) or {}
        mad = p.get("mscale_all_dim")
        if mad and p.get("factor") and _kind(p, cfg.family) != "default":
            f = float(p["factor"])
            m = 1.0 if f <= 1 else 0.1 * float(mad) * math.log(f) + 1.0
            out["softmax_scale_multiplier"] = m * m
    return out


def _refuse_not_a_rotation(cfg: _Cfg) -> None:
    if cfg.family in _NOT_A_ROTATION:
        raise ValueError(_NOT_A_ROTATION[cfg.family])


def model_spec(config: Any, *, angles: AngleMethod = "exact") -> ModelSpec:
    """Every layer's RoPE of a config (see :func:`rotary.hf.model_rope`)."""
    cfg = _Cfg(config)
    _refuse_not_a_rotation(cfg)
    n = cfg.count("num_hidden_layers")
    types = cfg.layer_types
    per_type = bool(cfg.nested_types())
    uses = cfg.uses_rope
    notes: list[str] = []
    layers: list[LayerSpec | None] = []
    cache: dict[Any, LayerSpec | None] = {}
    if n is not None:
        if per_type and types is None:
            raise ValueError(
                "config has per-layer-type RoPE parameters but no layer_types (or num_hidden_layers)"
            )
        for i in range(n):
            if not cfg.has_rope(i):
                layers.append(None)
                continue
            lt = types[i] if per_type and types else None
            key = (lt, tuple(sorted(cfg._layer_override(i).items())))
            if key not in cache:
                cache[key] = _layer_spec(cfg, lt, i, angles)
            layers.append(cache[key])
    rope_slice = None
    slices = {m for m in (cfg.mla(i) for i in range(n or 1)) if m is not None}
    if len(slices) == 1:
        nope, rope = slices.pop()
        rope_slice = (nope, nope + rope)
        notes.append(
            f"RoPE rotates features {nope}:{nope + rope} of each query head (q_pe after q_nope) and the "
            "shared qk_rope_head_dim key features (MLA)"
        )
    elif slices:  # per_layer_config gives layers different MLA splits
        first = {m: i for i in reversed(range(n or 1)) if (m := cfg.mla(i)) is not None}
        for (nope, rope), i in sorted(first.items(), key=lambda x: x[1]):
            notes.append(
                f"layers like {i} (MLA): RoPE rotates features {nope}:{nope + rope} of each query head "
                "and the shared qk_rope_head_dim key features"
            )
    if cfg.family == "deepseek_v4":
        notes.append(
            "DeepSeek-V4 also rotates the RoPE features of each attention output by -position "
            "(DeepseekV4Attention), and its compressors rotate compressed entries at their window positions"
        )
    if uses is not None and not all(uses):
        notes.append(f"layers {[i for i, u in enumerate(uses) if not u]} have no RoPE (no_rope_layers)")
    if cfg.family is not None and cfg.family not in _KNOWN:
        notes.append(f"model_type {cfg.model_type!r} is not one rotary knows: read as a Llama-style config")
    return ModelSpec(
        cfg.model_type,
        types,
        tuple(layers),
        tuple(_attention(cfg).items()),
        rope_slice,
        tuple(notes),
    )


def _type_spec(cfg: _Cfg, layer_type: str | None, angles: AngleMethod) -> LayerSpec:
    """The RoPE of the layers of ``layer_type`` (``None``: the config's one RoPE)."""
    types = cfg.layer_types
    nested = cfg.nested_types()
    uses = cfg.uses_rope
    if layer_type is None:
        if nested:
            kinds = list(nested)
            if cfg.family == "cohere2" or len(kinds) > 1:
                raise _pass_layer_type(kinds)
            layer_type = kinds[0]
    else:
        known = set(types or ()) | set(nested)
        if not known:
            raise ValueError(f"layer_type={layer_type!r} given but the config has one set of RoPE parameters")
        if layer_type not in known:
            raise ValueError(f"layer_type must be one of {sorted(known)}, got {layer_type!r}")
    index = None
    if types is not None and (layer_type is None or layer_type in types):
        candidates = [i for i, t in enumerate(types) if layer_type in (None, t) and cfg.has_rope(i)]
        if not candidates:
            raise ValueError(f"no layer of type {layer_type!r} applies RoPE in this config")
        index = candidates[0]
        if cfg.per_layer:  # heterogeneous layers: every layer of the type must rotate alike
            overrides = {tuple(sorted(cfg._layer_override(i).items(), key=str)): i for i in candidates}
            if len(overrides) > 1:
                specs = {
                    _layer_spec(cfg, layer_type if nested else None, i, angles) for i in overrides.values()
                }
                if len(specs) > 1:
                    raise ValueError(
                        f"the layers of type {layer_type!r} rotate differently (per_layer_config overrides "
                        f"them); use rotary.hf.rope_for_layer(config, i) or model_rope(config)"
                    )
    elif uses is not None:
        index = next((i for i, u in enumerate(uses) if u), None)
        if index is None:
            raise ValueError("no layer of this config applies RoPE (no_rope_layers is all 0)")
    spec = _layer_spec(cfg, layer_type if nested else None, index, angles)
    if spec is None:
        raise ValueError(f"layers of type {layer_type!r} have no RoPE in this config")
    return spec


def mrope_index_options(config: Any) -> dict[str, Any]:
    """The options of :func:`rotary.positions.mrope_position_ids` a Qwen-VL config sets."""
    d = _as_dict(config)
    text = d.get("text_config")
    mt = d.get("model_type")
    fam = _family(mt)
    if fam not in _QWEN_VL and text is not None:
        fam = _family(_as_dict(text, "text_config").get("model_type"))
    if fam not in _QWEN_VL:
        raise ValueError(
            f"M-RoPE position ids follow Qwen-VL models {sorted(_QWEN_VL)}; config has model_type {mt!r}"
        )
    vision = d.get("vision_config")
    vision = {} if vision is None else _as_dict(vision, "vision_config")
    ids = {}
    for key in ("image_token_id", "video_token_id"):
        val = d.get(key)
        if val is None:
            raise ValueError(f"config needs {key} to find image and video tokens")
        ids[key] = v.check_int(val, key)
    # Qwen2.5-VL spaces a video's frames by tokens_per_second (transformers' default 4)
    tps = vision.get("tokens_per_second", 4) if fam == "qwen2_5_vl" else None
    return {
        **ids,
        "spatial_merge_size": v.check_int(
            vision.get("spatial_merge_size", 2), "spatial_merge_size", minimum=1
        ),
        "tokens_per_second": tps,
        "split_video_frames": fam in ("qwen3_vl", "qwen3_vl_moe"),
    }


def mrope_spec(config: Any, *, angles: AngleMethod = "exact", layer_type: str | None = None) -> LayerSpec:
    """The M-RoPE :class:`LayerSpec` of a multimodal config (``ValueError`` when it has none)."""
    cfg = _Cfg(config)
    _refuse_not_a_rotation(cfg)
    rope_dicts = [cfg._dict("rope_parameters") or {}, cfg._dict("rope_scaling") or {}]
    if (
        cfg.family not in _MROPE
        and cfg.family not in _HW_ALTERNATING
        and cfg.family not in _TWO_ROWS_ALTERNATING
        and not cfg.has("mrope_section")
        and not any("mrope_section" in d for d in rope_dicts)
    ):
        raise ValueError(
            f"config has no M-RoPE (no mrope_section, and model_type {cfg.model_type!r} is not one of "
            f"{sorted({*_MROPE, *_HW_ALTERNATING, *_TWO_ROWS_ALTERNATING})})"
        )
    spec = _type_spec(cfg, layer_type, angles)
    if spec.sections is None:  # pragma: no cover - every M-RoPE config above has sections
        raise ValueError("config has no M-RoPE sections")
    return spec


def rope_config(config: Any, *, angles: AngleMethod = "exact", layer_type: str | None = None) -> RopeConfig:
    """The :class:`RopeConfig` of a ``transformers`` config (see :func:`rotary.hf.from_hf`)."""
    return _type_spec(_Cfg(config), layer_type, angles).config


def hf_rope_parameters(config: Any, layer_type: str | None = None) -> dict[str, Any]:
    """The config's RoPE parameters as one flat dict, standardised as ``transformers`` does.

    Keys: ``rope_type``, ``rope_theta``, ``partial_rotary_factor``, ``head_dim``,
    ``max_position_embeddings`` and, for llama3/yarn/longrope, ``original_max_position_embeddings``,
    plus the scaling's own keys.  Model-level keys are folded in (GPT-NeoX ``rotary_pct`` and
    ``rotary_emb_base``, DeepSeek ``qk_rope_head_dim`` as ``head_dim``, Gemma 3
    ``rope_local_base_freq`` for ``layer_type="sliding_attention"``...).

    Examples
    --------
    >>> from rotary.hf import hf_rope_parameters
    >>> p = hf_rope_parameters({"head_dim": 64, "rope_theta": 1e6, "max_position_embeddings": 4096,
    ...                         "rope_scaling": {"type": "linear", "factor": 2.0}})
    >>> p["rope_type"], p["rope_theta"], p["factor"], p["head_dim"]
    ('linear', 1000000.0, 2.0, 64)
    """
    cfg = _Cfg(config)
    nested = cfg.nested_types()
    if layer_type is None and len(nested) > 1:
        raise _pass_layer_type(list(nested))
    if layer_type is not None and not nested and not cfg.layer_types:
        raise ValueError(f"layer_type={layer_type!r} given but the config has one set of RoPE parameters")
    lt = layer_type if nested else None
    if lt is None and nested:
        lt = nested[0]
    p = _flat(cfg, lt, None)
    if p is None:
        raise ValueError(f"layers of type {layer_type!r} have no RoPE in this config")
    return p
