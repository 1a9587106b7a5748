"""The catalogue of transformers' linear-attention layers :func:`rotary.hf.patch_linear_attention`
serves (and refuses), with a tiny random-weight config of every model type that ships one.

``tests/test_hf_linear.py`` runs each tiny model with and without the patch (prefill, a chunk
continued from the cache, decoding token by token, ``generate``); ``python tests/hf_linear.py
--rst docs/guides/hf_linear.rst`` writes the guide's table from this catalogue.
"""

from __future__ import annotations

import dataclasses
import sys

COMMON = {
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "intermediate_size": 64,
    "vocab_size": 128,
    "pad_token_id": 0,
}
#: Gated DeltaNet heads: more value heads than key heads (Qwen3-Next's grouped values).
GDN = {
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 8,
    "linear_conv_kernel_dim": 4,
    "layer_types": ["linear_attention", "full_attention"],
}
MOE = {
    "moe_intermediate_size": 32,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "shared_expert_intermediate_size": 32,
}
MLA = {
    **COMMON,
    **dict(moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1),
    **dict(first_k_dense_replace=1, n_group=1, topk_group=1, num_key_value_heads=4),
    **dict(q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=16),
}
#: The Mamba hybrids' weights large enough that the scan, not the ``D`` skip, sets the logits
#: (Mamba-2's: 4 heads in 2 groups, chunks of 8: the 21-token prompt spans three).
SSD = {"initializer_range": 0.2}


@dataclasses.dataclass(frozen=True)
class Family:
    name: str
    functions: tuple[str, ...]  # transformers' functions whose calls go to rotary ("forward": the layer's)
    keywords: str  # rotary.linear_attention's keywords that serve it
    models: dict[str, dict]  # model type -> its tiny config (over the config class's defaults)
    reason: str = ""  # a refused family: what the error says


FAMILIES: tuple[Family, ...] = (
    Family(
        "Gated DeltaNet",
        ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule"),
        "``log_gate`` per token, ``beta``, ``qk_l2norm=True``, ``scale=d_k ** -0.5``; value heads "
        "grouped on key heads by broadcasting",
        {
            "qwen3_next": {**COMMON, **GDN, **MOE, "head_dim": 16},
            "qwen3_5_text": {**COMMON, **GDN, "head_dim": 16},
            "qwen3_5_moe_text": {**COMMON, **GDN, **MOE, "head_dim": 16},
            "qwen4_exp_text": {
                **COMMON,
                **GDN,
                **MOE,
                "head_dim": 16,
                **dict(indexer_n_heads=2, indexer_kv_heads=1, indexer_head_dim=16),
                **dict(indexer_budget=4, indexer_compress_ratio=2),
            },
            "olmo_hybrid": {**COMMON, **GDN},
            "lara_mini": {**COMMON, **GDN, **MOE, "head_dim": 16},
        },
    ),
    Family(
        "Kimi Delta Attention",
        ("chunk_kimi_delta_attention", "recurrent_kimi_delta_attention"),
        "``log_gate`` per key feature, ``beta``, ``qk_l2norm=True``, ``scale=d_k ** -0.5``",
        {
            "kimi_linear": {
                **COMMON,
                "num_key_value_heads": 4,
                "head_dim": 16,
                "linear_attn_config": {
                    "num_heads": 2,
                    "head_dim": 16,
                    "kda_layers": [1],
                    "full_attn_layers": [2],
                },
                **dict(num_experts=4, num_experts_per_token=2, moe_intermediate_size=32, mla_use_nope=True),
                **dict(kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=16),
            },
            "bailing_hybrid": {**MLA, "layer_group_size": 2, "num_local_experts": 4},
            "glm5_next_text": {
                **MLA,
                **dict(
                    index_n_heads=2, index_head_dim=32, index_topk=16, qk_rope_head_dim=0, qk_nope_head_dim=32
                ),
                **dict(
                    linear_num_heads=2, linear_head_dim=16, layer_types=["linear_attention", "full_attention"]
                ),
            },
        },
    ),
    Family(
        "Mamba-2 SSD",
        ("mamba2_chunk_scan", "mamba2_selective_state_update", "mamba2_split_conv1d_scan_combined"),
        "``log_gate = dt * A`` per token and head, keys ``B``, queries ``C``, values ``dt * x``, "
        "``normalize=False``; the ``D`` skip added",
        {
            "mamba2": dict(
                hidden_size=32, num_heads=4, head_dim=16, state_size=8, n_groups=2, num_hidden_layers=2
            )
            | dict(vocab_size=128, chunk_size=8, pad_token_id=0),
            "bamba": {
                **COMMON,
                **SSD,
                **dict(attn_layer_indices=[1], mamba_n_heads=4, mamba_d_head=32, mamba_n_groups=2),
                **dict(mamba_d_state=8, mamba_chunk_size=8),
            },
            "zamba2": {
                **COMMON,
                **SSD,
                **dict(layers_block_type=["mamba", "hybrid"], mamba_headdim=16, n_mamba_heads=8),
                **dict(mamba_d_state=8, mamba_ngroups=2, chunk_size=8),
            },
            "falcon_h1": {
                **COMMON,
                **SSD,
                **dict(mamba_n_heads=4, mamba_d_head=16, mamba_d_ssm=64, mamba_n_groups=2),
                **dict(mamba_d_state=8, mamba_chunk_size=8),
            },
            "granitemoehybrid": {
                **COMMON,
                **SSD,
                **dict(
                    layer_types=["mamba", "attention"], mamba_n_heads=4, mamba_d_head=32, mamba_n_groups=2
                ),
                **dict(mamba_d_state=8, mamba_chunk_size=8, num_local_experts=4, num_experts_per_tok=2),
            },
            "nemotron_h": {
                **COMMON,
                **SSD,
                **dict(layers_block_type=["mamba", "attention"], mamba_num_heads=4, mamba_head_dim=16),
                **dict(n_groups=2, ssm_state_size=8, chunk_size=8),
            },
        },
    ),
    Family(
        "Mamba selective scan",
        ("mamba_selective_scan", "mamba_selective_state_update", "mamba_inner_fn"),
        "each channel a head: ``log_gate = dt * A`` per token and state feature, keys ``B`` and queries "
        "``C`` shared by the channels, one value ``dt * x``, ``normalize=False``; the ``D`` skip added",
        {
            "mamba": dict(hidden_size=32, state_size=8, num_hidden_layers=2, vocab_size=128, pad_token_id=0),
            "falcon_mamba": dict(
                hidden_size=32, state_size=8, num_hidden_layers=2, vocab_size=128, pad_token_id=0
            ),
            "jamba": {
                **COMMON,
                "initializer_range": 0.1,
                **dict(
                    attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2, expert_layer_offset=1
                ),
                **dict(num_experts=4, mamba_d_state=8, mamba_expand=2),
            },
            "zamba": {
                **COMMON,
                "initializer_range": 0.1,
                **dict(num_hidden_layers=3, layers_block_type=["linear_attention", "hybrid", "hybrid"]),
                **dict(mamba_d_state=8, n_mamba_heads=2, attention_head_dim=16),
            },
        },
    ),
    Family(
        "Lightning Attention",
        ("forward",),
        "``decay = exp(-slope)`` per head, ``normalize=False``",
        {
            "minimax": {
                **COMMON,
                **dict(head_dim=16, block_size=8, num_local_experts=4, num_experts_per_tok=2),
                "layer_types": ["linear_attention", "full_attention"],
            }
        },
    ),
    Family(
        "RWKV (v4)",
        ("rwkv_linear_attention",),
        "",
        {
            "rwkv": dict(hidden_size=32, num_hidden_layers=2, vocab_size=128, attention_hidden_size=32)
            | dict(intermediate_size=64, context_length=64)
        },
        reason="log space",
    ),
    Family(
        "xLSTM (mLSTM)",
        ("chunkwise_kernel_fn",),
        "",
        {"xlstm": dict(hidden_size=64, embedding_dim=64, num_heads=2, num_blocks=2, vocab_size=128)},
        reason="running maximum",
    ),
    Family(
        "RG-LRU (Griffin)",
        ("_rnn_scan",),
        "",
        {"recurrent_gemma": {**COMMON, "head_dim": 16, "lru_width": 64, "num_hidden_layers": 3}},
        reason="elementwise linear RNN",
    ),
)

SERVED = {mt: f for f in FAMILIES if not f.reason for mt in f.models}
REFUSED = {mt: f for f in FAMILIES if f.reason for mt in f.models}


def rst() -> str:
    """The guide's table of families (generated: ``--rst``)."""
    lines = [
        ".. Generated by tests/hf_linear.py --rst: do not edit.",
        "",
        "Linear attention in transformers' models",
        "========================================",
        "",
        ":func:`rotary.hf.patch_linear_attention` runs every linear-attention layer of a loaded",
        "``transformers`` model on :func:`rotary.linear_attention` (see :doc:`porting` for the entry,",
        "and :doc:`linear_families` for the engine's families).  The model types below are those",
        "``tests/test_hf_linear.py`` runs as tiny random-weight models, with and without the patch:",
        "logits within float32 rounding of transformers' own torch code, prefill, a chunk continued",
        "from the cache, decoding token by token, and ``generate`` giving the same tokens.",
        "",
        ".. list-table::",
        "   :header-rows: 1",
        "",
        "   * - family",
        "     - model types",
        "     - transformers' code replaced",
        "     - rotary's keywords (``causal=True``)",
    ]
    for f in FAMILIES:
        if f.reason:
            continue
        replaced = (
            "the layer's ``forward`` (its block loop)"
            if f.functions == ("forward",)
            else ", ".join(f"``{n}``" for n in f.functions)
        )
        lines += [
            f"   * - {f.name}",
            f"     - {', '.join(f'``{m}``' for m in f.models)}",
            f"     - {replaced}",
            f"     - {f.keywords}",
        ]
    lines += [
        "",
        "Refused by name (``patch_linear_attention`` raises a ``ValueError`` naming each layer and the",
        "reason; ``strict=False`` leaves them on transformers' code, listed in the report):",
        "",
    ]
    from rotary._hf_linear import FAMILIES as ROTARY_FAMILIES

    why = {f.name: f.reason for f in ROTARY_FAMILIES}
    for f in FAMILIES:
        if f.reason:
            lines.append(f"* {', '.join(f'``{m}``' for m in f.models)}: {why[f.name]}.")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--rst":
        with open(sys.argv[2], "w", encoding="utf-8") as fh:
            fh.write(rst())
    else:
        print(rst())
