"""The field report's case matrix: published model configs (the RoPE part of each ``config.json``),
one per RoPE family an engine has to get right.

Its one home, seen by the kit (:func:`rotary.testing.check_model_rope` takes a case by name) and
by the conformance engines (``conformance.engines.cases`` re-exports it): nothing under
``rotary/`` imports from ``conformance``.

Each case is a Hugging Face config dict as the checkpoint publishes it (legacy ``rope_scaling``
and all), so an adapter reads it as its engine reads that checkpoint.  The values are the
published ones except where ``note`` says otherwise.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

__all__ = ["ARCHITECTURES", "CASES", "Case", "as_published"]

#: The ``architectures`` a published checkpoint of each case's ``model_type`` carries in its
#: config.json (the cases keep only the RoPE keys; adapters whose engine dispatches on the
#: architecture, as converters and model registries do, read it here).
ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "ministral3": "Ministral3ForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen2_vl": "Qwen2VLForConditionalGeneration",
    "gpt_oss": "GptOssForCausalLM",
    "deepseek_v3": "DeepseekV3ForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "phi": "PhiForCausalLM",
    "gpt_neox": "GPTNeoXForCausalLM",
    "gptj": "GPTJForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
}


def as_published(config: Any) -> dict[str, Any]:
    """A copy of a case's ``config`` with the ``architectures`` its checkpoint publishes (what a
    converter or a model registry dispatches on); ``Unsupported`` for a ``model_type`` without
    them."""
    from .engine import Unsupported

    cfg = dict(config)
    if not cfg.get("architectures"):
        mt = str(cfg.get("model_type"))
        if mt not in ARCHITECTURES:
            raise Unsupported(f"no published architectures known for model_type {mt!r}")
        cfg["architectures"] = [ARCHITECTURES[mt]]
    return cfg


def _ramp(n: int, lo: float, hi: float) -> list[float]:
    return [float(x) for x in np.round(np.geomspace(lo, hi, n), 6)]


@dataclasses.dataclass(frozen=True)
class Case:
    """One config of the matrix: its name, the model it comes from, what it exercises, and the
    checks it runs (``None``: the config checks, ``rotary.testing.model.CONFIG_CHECKS``)."""

    name: str
    model: str
    config: dict[str, Any]
    exercises: str
    note: str = ""
    checks: tuple[str, ...] | None = None


_LLAMA2 = {
    "model_type": "llama",
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "num_hidden_layers": 32,
    "max_position_embeddings": 4096,
    "rope_theta": 10000.0,
    "rope_scaling": None,
}

CASES: dict[str, Case] = {
    c.name: c
    for c in [
        Case("default", "Llama 2 7B", dict(_LLAMA2), "plain RoPE, base 10000, half layout"),
        Case(
            "linear",
            "Vicuna 7B v1.5 16k",
            {**_LLAMA2, "rope_scaling": {"type": "linear", "factor": 4.0}},
            "linear scaling (position interpolation), factor 4",
        ),
        Case(
            "dynamic",
            "Llama 2 7B with dynamic NTK",
            {**_LLAMA2, "rope_scaling": {"type": "dynamic", "factor": 2.0}},
            "dynamic NTK: frequencies depend on the longest position of the call",
            note="Llama 2 7B with the rope_scaling transformers documents for dynamic NTK",
        ),
        Case(
            "llama3",
            "Llama 3.1 8B",
            {
                "model_type": "llama",
                "hidden_size": 4096,
                "num_attention_heads": 32,
                "num_key_value_heads": 8,
                "num_hidden_layers": 32,
                "max_position_embeddings": 131072,
                "rope_theta": 500000.0,
                "rope_scaling": {
                    "factor": 8.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 8192,
                    "rope_type": "llama3",
                },
            },
            "Llama 3 frequency bands (factor 8, low 1, high 4, L0 8192)",
        ),
        Case(
            "yarn",
            "Qwen2.5 7B Instruct, 128K",
            {
                "model_type": "qwen2",
                "hidden_size": 3584,
                "num_attention_heads": 28,
                "num_key_value_heads": 4,
                "num_hidden_layers": 28,
                "max_position_embeddings": 32768,
                "rope_theta": 1000000.0,
                "rope_scaling": {"factor": 4.0, "original_max_position_embeddings": 32768, "type": "yarn"},
            },
            "YaRN without mscale keys: attention factor 0.1 ln 4 + 1 = 1.1386 on cos and sin",
            note="with the rope_scaling its model card adds for 128K context",
        ),
        Case(
            "yarn_original",
            "Qwen3 8B, 128K",
            {
                "model_type": "qwen3",
                "hidden_size": 4096,
                "num_attention_heads": 32,
                "num_key_value_heads": 8,
                "head_dim": 128,
                "num_hidden_layers": 36,
                "max_position_embeddings": 40960,
                "rope_theta": 1000000.0,
                "rope_scaling": {
                    "rope_type": "yarn",
                    "factor": 4.0,
                    "original_max_position_embeddings": 32768,
                },
            },
            "YaRN whose original context (32768) is not max_position_embeddings (40960): the ramp's "
            "bounds come from the original",
            note="with the rope_scaling its model card adds for 131072 tokens",
        ),
        Case(
            "yarn_no_truncate",
            "gpt-oss-20b",
            {
                "model_type": "gpt_oss",
                "hidden_size": 2880,
                "num_attention_heads": 64,
                "num_key_value_heads": 8,
                "head_dim": 64,
                "num_hidden_layers": 24,
                "max_position_embeddings": 131072,
                "rope_theta": 150000,
                "rope_scaling": {
                    "beta_fast": 32.0,
                    "beta_slow": 1.0,
                    "factor": 32.0,
                    "original_max_position_embeddings": 4096,
                    "rope_type": "yarn",
                    "truncate": False,
                },
            },
            "YaRN with truncate=false (fractional ramp bounds), factor 32",
        ),
        Case(
            "yarn_mscale",
            "Ministral 3 8B",
            {
                "model_type": "ministral3",
                "hidden_size": 4096,
                "num_attention_heads": 32,
                "num_key_value_heads": 8,
                "head_dim": 128,
                "num_hidden_layers": 34,
                "max_position_embeddings": 262144,
                "rope_parameters": {
                    "rope_type": "yarn",
                    "rope_theta": 1000000.0,
                    "factor": 16.0,
                    "original_max_position_embeddings": 16384,
                    "beta_fast": 32.0,
                    "beta_slow": 1.0,
                    "mscale": 1.0,
                    "mscale_all_dim": 1.0,
                    "llama_4_scaling_beta": 0.1,
                },
            },
            "YaRN with mscale = mscale_all_dim (attention factor 1.0, not 1.2773), and the query "
            "scale 1 + 0.1 log(1 + floor(pos / 16384))",
            note="shaped like Ministral-3-8B-Instruct-2512's config (sizes and rope_parameters keys)",
        ),
        Case(
            "yarn_mla",
            "DeepSeek-V3",
            {
                "model_type": "deepseek_v3",
                "hidden_size": 7168,
                "num_attention_heads": 128,
                "num_key_value_heads": 128,
                "num_hidden_layers": 61,
                "q_lora_rank": 1536,
                "kv_lora_rank": 512,
                "qk_nope_head_dim": 128,
                "qk_rope_head_dim": 64,
                "v_head_dim": 128,
                "max_position_embeddings": 163840,
                "rope_theta": 10000,
                "rope_scaling": {
                    "beta_fast": 32,
                    "beta_slow": 1,
                    "factor": 40,
                    "mscale": 1.0,
                    "mscale_all_dim": 1.0,
                    "original_max_position_embeddings": 4096,
                    "type": "yarn",
                },
            },
            "multi-head latent attention: 64 rotated features, interleaved, YaRN factor 40 with the "
            "softmax scale multiplied by mscale(40, 1.0)**2 = 1.8739",
        ),
        Case(
            "longrope",
            "Phi-3 mini 128k",
            {
                "model_type": "phi3",
                "hidden_size": 3072,
                "num_attention_heads": 32,
                "num_key_value_heads": 32,
                "num_hidden_layers": 32,
                "max_position_embeddings": 131072,
                "original_max_position_embeddings": 4096,
                "rope_theta": 10000.0,
                "rope_scaling": {
                    "long_factor": _ramp(48, 1.08, 64.8),
                    "short_factor": _ramp(48, 1.0, 2.7),
                    "type": "longrope",
                },
            },
            "LongRoPE: short factors up to 4096 tokens, long ones past, attention factor 1.1902",
            note="factor lists shaped like the published ones (48 entries rising 1-2.7 and 1.08-64.8)",
        ),
        Case(
            "partial",
            "Phi-2",
            {
                "model_type": "phi",
                "hidden_size": 2560,
                "num_attention_heads": 32,
                "num_hidden_layers": 32,
                "max_position_embeddings": 2048,
                "partial_rotary_factor": 0.4,
                "rope_theta": 10000.0,
            },
            "partial rotary: 32 of 80 features rotate (exponent over the 32)",
        ),
        Case(
            "partial_neox",
            "Pythia 160m",
            {
                "model_type": "gpt_neox",
                "hidden_size": 768,
                "num_attention_heads": 12,
                "num_hidden_layers": 12,
                "max_position_embeddings": 2048,
                "rotary_pct": 0.25,
                "rotary_emb_base": 10000,
            },
            "GPT-NeoX rotary_pct: 16 of 64 features rotate",
        ),
        Case(
            "interleaved",
            "GPT-J 6B",
            {
                "model_type": "gptj",
                "n_embd": 4096,
                "n_head": 16,
                "n_layer": 28,
                "n_positions": 2048,
                "rotary_dim": 64,
            },
            "interleaved pairs (2i, 2i+1), 64 of 256 features rotate",
        ),
        Case(
            "mrope",
            "Qwen2-VL 7B Instruct",
            {
                "model_type": "qwen2_vl",
                "hidden_size": 3584,
                "num_attention_heads": 28,
                "num_key_value_heads": 4,
                "num_hidden_layers": 28,
                "max_position_embeddings": 32768,
                "rope_theta": 1000000.0,
                "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
            },
            "M-RoPE: 3 position rows (temporal, height, width), sections [16, 24, 24]",
        ),
        Case(
            "layer_types",
            "Gemma 3 4B",
            {
                "model_type": "gemma3_text",
                "hidden_size": 2560,
                "num_attention_heads": 8,
                "num_key_value_heads": 4,
                "head_dim": 256,
                "num_hidden_layers": 34,
                "max_position_embeddings": 131072,
                "rope_theta": 1000000.0,
                "rope_local_base_freq": 10000.0,
                "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                "sliding_window": 1024,
                "sliding_window_pattern": 6,
                "query_pre_attn_scalar": 256,
            },
            "per-layer-type RoPE: sliding layers base 10000, full layers base 1e6 with linear factor 8",
            note="gemma-3-4b-it's text_config",
        ),
        Case(
            "thd",
            "Llama 2 7B, packed",
            dict(_LLAMA2),
            "packed input (thd): 5 documents of 1 to 12 tokens in one row of 32 (cu_seqlens), each "
            "from position 0; then each continuing from its own offset (9, 2047, 0, 31, 4000), as a "
            "ragged decoding batch",
            note="packed checks only, through the engine's rotate_packed; the config is the default case's",
            checks=("packed", "packed_offsets"),
        ),
    ]
}
