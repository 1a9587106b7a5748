"""Tiny random models of every family the census newly supports (issue 24) give the same outputs
with ``rotary.hf.patch(model, angles="float32")``: bit for bit, prefill and ``generate``.  The
census compares each RoPE module and ``apply_rotary_pos_emb``; this runs the models themselves
with rotary's cos/sin in every rotary embedding module, so the layer types, NoPE layers, MLA
slices, M-RoPE position rows (2 or 3, different at image positions) and partial widths reach
every attention as ``rotary`` reads them.

DeepSeek-V2 and Llama 4 take ``torch.polar(1, angles)``, whose cos/sin round differently from
``torch.cos``/``torch.sin``: the patch forms them with ``polar`` too, bit for bit.  HunYuan-VL is refused
(its XD-RoPE is not a rotation at image positions: the census's "text only").  The families
``rotary`` supported before the census are patched in ``test_hf_families.py``.
"""

from __future__ import annotations

import inspect
import warnings

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import hf_census as C  # noqa: E402
from test_hf_families import generate  # noqa: E402

import rotary  # noqa: E402

transformers.logging.set_verbosity_error()

COMMON = {
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "intermediate_size": 64,
    "vocab_size": 128,
    "pad_token_id": 0,
}
MOE = {
    "moe_intermediate_size": 32,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "n_shared_experts": 1,
    "first_k_dense_replace": 1,
    "n_group": 1,
    "topk_group": 1,
}
MLA = {
    **COMMON,
    **MOE,
    "num_key_value_heads": 4,
    "q_lora_rank": 32,
    "kv_lora_rank": 32,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 16,
    "v_head_dim": 16,
}
INDEXER = {"index_n_heads": 2, "index_head_dim": 32, "index_topk": 4}
HYBRID = {**COMMON, "num_hidden_layers": 4}  # linear-attention models: at least one attention layer

#: Small configs of the model types the census newly supports (transformers 5.24), merged over
#: the config class's defaults.
TINY: dict[str, dict] = {
    # multi-head latent attention
    "minicpm3": {k: v for k, v in MLA.items() if k not in MOE},
    "glm4_moe_lite": MLA,
    "youtu": MLA,
    "axk1": MLA,
    "mistral4": MLA,
    "deepseek_v32": {**MLA, **INDEXER},
    "glm_moe_dsa": {**MLA, **INDEXER},
    "axk2": {**MLA, **INDEXER},
    "hy_v4": {**MLA, **INDEXER},
    "mistral_large4": {**MLA, "num_hidden_layers": 4},  # a NoPE layer (no_rope_layers)
    "deepseek_v4": {**COMMON, **MOE, "head_dim": 32, "q_lora_rank": 32},
    # partial rotary, pairing, names
    "glm4_moe": {**COMMON, **MOE, "head_dim": 16},
    "nemotron": COMMON,
    "persimmon": COMMON,
    "helium": {**COMMON, "head_dim": 16},
    "ernie4_5": COMMON,
    "ernie4_5_moe": COMMON,
    "cohere2_moe": COMMON,
    "openai_privacy_filter": {**COMMON, "head_dim": 16},
    "nanochat": COMMON,
    "jetmoe": {**COMMON, "kv_channels": 16, "num_local_experts": 4, "num_experts_per_tok": 2},
    "codegen": {"n_embd": 64, "n_head": 4, "n_layer": 2, "vocab_size": 128, "rotary_dim": 8, "n_inner": 64},
    "ministral3": COMMON,
    "minimax_m3_vl": COMMON,
    "laguna": {**COMMON, "head_dim": 32},
    "mimo_v2_flash": {**COMMON, "head_dim": 48},
    "lfm3": {**COMMON, "head_dim": 32, "layer_types": ["sliding_attention", "full_attention"]},
    "neomme": {**COMMON, "head_dim": 32, "num_key_value_heads": 4},  # value embeddings per head
    "embedding_gemma2": {**COMMON, "head_dim": 32},
    "gemma4_unified": {**COMMON, "head_dim": 32, "global_head_dim": 64},
    "diffusion_gemma": {
        **COMMON,
        "head_dim": 32,
        "global_head_dim": 64,
        "num_experts": 4,
        "top_k_experts": 2,
        "moe_intermediate_size": 32,
    },
    "zaya": COMMON,
    "qwen3_next": {**HYBRID, "head_dim": 32},
    "recurrent_gemma": {**HYBRID, "head_dim": 16},
    "dots3_note": MLA,
    "deepseek_v2": MLA,
    "llama4": {**COMMON, "head_dim": 16, "num_local_experts": 4, "intermediate_size_mlp": 64},
    "longcat_flash": {
        **MLA,
        **dict(num_layers=2, head_dim=16, ffn_hidden_size=64, expert_ffn_hidden_size=32),
        **dict(n_routed_experts=4, zero_expert_num=2, moe_topk=2),
    },
    "bailing_hybrid": {**MLA, "layer_group_size": 2, "num_local_experts": 4},
    "bamba": {
        **HYBRID,
        **dict(attn_layer_indices=[1], mamba_n_heads=4, mamba_d_head=32, mamba_n_groups=1, mamba_d_state=16),
    },
    "zamba2": {
        **HYBRID,
        **dict(num_hidden_layers=2, layers_block_type=["mamba", "hybrid"], use_mem_rope=True),
        **dict(mamba_headdim=16, n_mamba_heads=8, mamba_d_state=16, mamba_ngroups=1),
    },
    "dbrx": {
        **dict(d_model=64, n_heads=4, n_layers=2, vocab_size=128),
        "attn_config": {"kv_n_heads": 2, "rope_theta": 10000.0, "clip_qkv": 8.0},
        "ffn_config": {"ffn_hidden_size": 64, "moe_num_experts": 4, "moe_top_k": 2},
    },
    # speech-to-text models (their decoders, and Moonshine's encoder, rotate)
    "moonshine": {
        **dict(hidden_size=64, intermediate_size=64, vocab_size=128),
        **dict(encoder_num_hidden_layers=1, encoder_num_attention_heads=4, encoder_num_key_value_heads=4),
        **dict(decoder_num_hidden_layers=1, decoder_num_attention_heads=4, decoder_num_key_value_heads=4),
    },
    "moonshine_streaming": {
        **dict(hidden_size=64, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4),
        **dict(num_key_value_heads=4, vocab_size=128),
        "encoder_config": dict(
            hidden_size=64,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=4,
            num_key_value_heads=4,
        ),
    },
    # M-RoPE text models
    "qwen3_5": {**HYBRID, "head_dim": 256},
    "qwen4_exp": {
        **HYBRID,
        "head_dim": 256,
        **dict(
            indexer_n_heads=2,
            indexer_kv_heads=1,
            indexer_head_dim=256,
            indexer_budget=4,
            indexer_compress_ratio=2,
        ),
    },
    # GLM-4V's attention splits hidden_size into heads (its rotary embedding reads head_dim)
    "glm4v": {
        **COMMON,
        "hidden_size": 256,
        "num_attention_heads": 2,
        "head_dim": 128,
        "partial_rotary_factor": 0.5,
    },
    "glm4v_moe": {**COMMON, "num_attention_heads": 2, "head_dim": 128},
    "glm_ocr": {**COMMON, "num_attention_heads": 1, "num_key_value_heads": 1, "head_dim": 64},
    "ernie4_5_vl_moe": {**COMMON, "num_attention_heads": 2, "head_dim": 128},
    "qwen3_omni_moe": {**COMMON, "num_attention_heads": 2, "head_dim": 128},
    "paddleocr_vl": {**COMMON, "num_attention_heads": 2, "head_dim": 128},
    "cosmos3_edge": {**COMMON, "num_attention_heads": 2, "head_dim": 128},
    "qwen3_5_moe": {
        **HYBRID,
        "head_dim": 256,
        **dict(
            moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2, shared_expert_intermediate_size=32
        ),
    },
    "qwen2_5_omni": {**COMMON, "num_attention_heads": 2, "head_dim": 128},
    "cohere_compass": {**COMMON, "num_hidden_layers": 4},  # the census's layers: 3 sliding M-RoPE, 1 NoPE
    # text positions only (XD-RoPE is not a rotation at image positions)
    "hunyuan_vl": {**COMMON, "hidden_size": 256, "num_attention_heads": 2, "head_dim": 128},
    "hy_v4_vl": {**MLA, **INDEXER, "qk_rope_head_dim": 64, "index_head_dim": 64},
}


def _model(mod, cfg):
    """The model of a tiny config: its causal LM, else its base model (text models of
    multimodal families: the modeling file's class for that config)."""
    for auto in (
        transformers.AutoModelForCausalLM,
        transformers.AutoModelForSpeechSeq2Seq,
        transformers.AutoModel,
    ):
        try:
            return auto.from_config(cfg)
        except ValueError:
            continue
    classes = [
        c
        for c in vars(mod).values()
        if inspect.isclass(c)
        and getattr(c, "config_class", None) is type(cfg)
        and c.__name__.endswith("Model")
        and not c.__name__.endswith("PreTrainedModel")
    ]
    if not classes:
        pytest.fail(f"no model class for {type(cfg).__name__}")
    return classes[0](cfg)


#: Families ``rotary.hf.patch`` refuses, with the reason it gives.
REFUSED = {"hunyuan_vl": "HunYuanVLRotaryEmbedding, model type 'hunyuan_vl_text'.*not a rotation"}
#: Families whose tiny model transformers' ``generate`` does not run (patched or not): BLT's cache
#: reads ``config.num_hidden_layers``, which ``BltConfig`` does not have.
NO_GENERATE = {"blt"}
#: Speech-to-text families: audio in, the decoder's tokens.
SPEECH = {"moonshine", "moonshine_streaming"}
#: Composite configs built whole (BLT's four sub-models, each with its own RoPE): model type ->
#: the config class and its tiny sub-configs.
_BLT_SUB = dict(
    hidden_size=64, num_attention_heads=4, num_key_value_heads=4, num_hidden_layers=1, intermediate_size=64
)
COMPOSITE: dict[str, tuple[str, dict]] = {
    "blt": (
        "BltConfig",
        dict(
            vocab_size=260,
            patch_in_forward=True,
            patch_size=4,
            patching_mode="entropy",
            cross_attn_k=1,
            encoder_hash_byte_group_vocab=64,
            encoder_config={**_BLT_SUB, "hidden_size_global": 64, "vocab_size": 260, "cross_attn_k": 1},
            decoder_config={**_BLT_SUB, "hidden_size_global": 64, "vocab_size": 260, "cross_attn_k": 1},
            global_config=_BLT_SUB,
            patcher_config={**_BLT_SUB, "vocab_size": 260},
        ),
    )
}


def _outputs(out):
    a = getattr(out, "logits", None)
    return out.last_hidden_state if a is None else a


def _generate(model, ids):
    out = generate(model, ids, new=2)  # (a prefill and a cached step: the suite's time is short)
    return None if out is None else out[1]


@pytest.mark.parametrize("name", sorted([*TINY, *COMPOSITE]))
def test_tiny_model_outputs_unchanged(name):
    item = next((i for i in C._modules() if i[0].split("[")[0] == name), None)
    if item is None or len(item) != 4:
        pytest.skip(f"{name} is not in this transformers")
    _, mod, cls, default = item
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if name in COMPOSITE:
            cfg = getattr(mod, COMPOSITE[name][0])(**COMPOSITE[name][1])  # the modeling file imports it
        else:
            cfg = type(default)(**{**C.OVERRIDES.get(name, {}), **TINY[name]})
        cfg._attn_implementation = "eager"
        torch.manual_seed(0)
        model = _model(mod, cfg).eval()
        ids = torch.randint(1, 128, (2, 12), generator=torch.Generator().manual_seed(1))
        pos = torch.stack([torch.arange(12), torch.arange(12) + 40])
        inputs = {"input_ids": ids, "position_ids": pos, "use_cache": False}
        if name in SPEECH:  # 0.25 s of audio, the decoder's tokens from position 0
            audio = torch.randn(2, 4000, generator=torch.Generator().manual_seed(2))
            inputs = {"input_values": audio, "decoder_input_ids": ids, "use_cache": False}
        mods = [m for m in model.modules() if isinstance(m, cls)]
        assert mods, f"no {cls.__name__} in {type(model).__name__}"
        if name in REFUSED:
            with pytest.raises(ValueError, match=REFUSED[name]):
                rotary.hf.patch(model, angles="float32")
            return
        with rotary.hf.patched(model, angles="float32") as report:
            assert {id(m) for m in mods} <= {id(model.get_submodule(e.path)) for e in report.modules}
            first = next(iter(report.modules[0].ropes.values()))
            if isinstance(first, rotary.MRoPE):  # different rows, as an image's grid gives
                inputs["position_ids"] = torch.stack(
                    [pos, pos // 2 + 7, pos % 5 + pos // 3][: len(first.sections)]
                )
            calls: list = []
            hooks = [m.register_forward_hook(lambda *a: calls.append(1)) for m in mods]
            with torch.no_grad():
                got = _outputs(model(**inputs))
            for h in hooks:
                h.remove()
            got_gen = None if name in SPEECH | NO_GENERATE else _generate(model, ids)
        with torch.no_grad():
            want = _outputs(model(**inputs))
        want_gen = None if name in SPEECH | NO_GENERATE else _generate(model, ids)
    assert calls, "the model never called its rotary embedding"
    pairs = [(want, got)] + ([(want_gen, got_gen)] if want_gen is not None else [])
    for a, b in pairs:  # (DeepSeek-V2 and Llama 4 too: their torch.polar form, bit for bit)
        assert torch.equal(a, b), float((a - b).abs().max())
