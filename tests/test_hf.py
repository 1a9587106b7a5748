"""``rotary.hf`` reads published ``config.json`` files, without ``transformers``.

Every family of :mod:`hf_families` parses to the RoPE its model applies (layout, rotated width,
base, scaling, attention factor), per layer where layers differ; files and folders read like
dicts; unknown keys and contradictions are errors naming them.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hf_families import BY_NAME, FAMILIES

import rotary
from rotary import scaling as sc


@pytest.mark.parametrize("f", FAMILIES, ids=[f.name for f in FAMILIES])
def test_published_config_reads_as_the_model_applies(f):
    layer_type = f.layer_types[0] if f.layer_types else None
    rope = rotary.hf.from_hf(f.config, layer_type=layer_type)
    e = f.expect
    assert rope.head_dim == e["head_dim"]
    assert rope.rotary_dim == e["rotary_dim"]
    assert rope.base == e["base"]
    assert rope.layout == e["layout"]
    assert type(rope.scaling).__name__ == e["scaling"]
    m = rotary.hf.model_rope(f.config)
    if "sections" in e:
        mr = rotary.hf.mrope_from_hf(f.config)
        assert (mr.sections, mr.interleaved) == (e["sections"], e["interleaved"])
        assert isinstance(m.layers[0], rotary.MRoPE) and m.layers[0].sections == e["sections"]
        assert mr.rope == rope
    else:
        with pytest.raises(ValueError, match="no M-RoPE"):
            rotary.hf.mrope_from_hf(f.config)


def test_files_and_folders(tmp_path):
    cfg = BY_NAME["Llama 3.1"].config
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    want = rotary.hf.from_hf(cfg)
    assert rotary.hf.from_hf(tmp_path / "config.json") == want
    assert rotary.hf.from_hf(str(tmp_path)) == want
    assert rotary.hf.rope_for_layer(tmp_path, 31) == want
    with pytest.raises(FileNotFoundError, match="no such file"):
        rotary.hf.from_hf(tmp_path / "missing")
    (tmp_path / "bad.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="not a JSON object"):
        rotary.hf.from_hf(tmp_path / "bad.json")


def test_scalings_and_attention_factors():
    q25 = rotary.hf.from_hf(BY_NAME["Qwen2.5 (+YaRN)"].config)
    assert q25.scaling == sc.YaRN(4.0, 32768)
    assert q25.attention_factor == pytest.approx(0.1 * math.log(4.0) + 1)
    oss = rotary.hf.from_hf(BY_NAME["GPT-OSS"].config)
    assert oss.scaling.truncate is False and oss.scaling.factor == 32.0
    ds3 = rotary.hf.from_hf(BY_NAME["DeepSeek-V3"].config)
    assert ds3.attention_factor == 1.0  # mscale == mscale_all_dim
    phi3 = rotary.hf.from_hf(BY_NAME["Phi-3 (LongRoPE)"].config)
    assert phi3.scaling.original_max_position_embeddings == 4096  # the top-level key
    assert phi3.attention_factor == pytest.approx(math.sqrt(1 + math.log(32) / math.log(4096)))
    l4 = rotary.hf.from_hf(BY_NAME["Llama 4"].config)
    assert l4.scaling == sc.Llama3(16.0, 8192, 1.0, 1.0)  # no band between low and high
    w, w0 = l4.inv_freq(), rotary.RoPE(128, base=5e5).inv_freq()
    long = 2 * np.pi / w0 > 8192
    np.testing.assert_allclose(w[long], w0[long] / 16, rtol=1e-15)
    np.testing.assert_allclose(w[~long], w0[~long], rtol=1e-15)
    il2 = rotary.hf.from_hf(BY_NAME["InternLM2 (dynamic)"].config)
    assert il2.scaling == sc.DynamicNTK(2.0, 32768)
    # Gemma 4 global layers: proportional (exponent over the 512-wide head, a quarter rotates)
    g4 = rotary.hf.from_hf(BY_NAME["Gemma 4"].config, layer_type="full_attention")
    assert (g4.head_dim, g4.rotary_dim, g4.partial) == (512, 128, "proportional")
    assert np.count_nonzero(g4.inv_freq()) == 64
    np.testing.assert_allclose(g4.inv_freq()[:64], rotary.inv_freq(512, 1e6)[:64], rtol=1e-15)


def test_gemma4_proportional_factor_divides_every_frequency():
    cfg = dict(BY_NAME["Gemma 4"].config)
    cfg["rope_parameters"] = {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {
            "rope_type": "proportional",
            "partial_rotary_factor": 0.25,
            "rope_theta": 1e6,
            "factor": 8.0,
        },
    }
    g4 = rotary.hf.from_hf(cfg, layer_type="full_attention")
    np.testing.assert_allclose(g4.inv_freq()[:64], rotary.inv_freq(512, 1e6)[:64] / 8, rtol=1e-15)
    cfg["rope_parameters"]["full_attention"]["beta_fast"] = 3
    with pytest.raises(ValueError, match="'proportional' does not take 'beta_fast'"):
        rotary.hf.from_hf(cfg, layer_type="full_attention")


def test_layers():
    # Gemma 3: 5 sliding (local base 10000, no scaling) then 1 global (1e6, linear 8)
    g3 = rotary.hf.model_rope(BY_NAME["Gemma 3"].config)
    assert len(g3.layers) == 34 and g3.model_type == "gemma3_text"
    for i, rope in enumerate(g3.layers):
        full = (i + 1) % 6 == 0
        assert g3.layer_types[i] == ("full_attention" if full else "sliding_attention")
        assert rope.base == (1e6 if full else 1e4)
        assert rope.scaling == (sc.Linear(8.0) if full else sc.Default())
    assert dict(g3.attention) == {"sliding_window": 1024, "query_pre_attn_scalar": 256}
    # Gemma 2: alternating layer types, one RoPE
    g2 = rotary.hf.model_rope(BY_NAME["Gemma 2"].config)
    assert g2.layer_types[:2] == ("sliding_attention", "full_attention") and len(set(g2.layers)) == 1
    # Gemma 4: the global layers' wider heads
    g4 = rotary.hf.model_rope(BY_NAME["Gemma 4"].config)
    assert [r.head_dim for r in g4.layers[:6]] == [256] * 5 + [512]
    assert g4.layer_types[-1] == "full_attention"
    # ModernBERT: every third layer global (from layer 0)
    mb = rotary.hf.model_rope(BY_NAME["ModernBERT"].config)
    assert [r.base for r in mb.layers[:4]] == [160000.0, 1e4, 1e4, 160000.0]
    # Llama 4: every fourth layer without RoPE (no_rope_layers [] rebuilt), chunked attention elsewhere
    l4 = rotary.hf.model_rope(BY_NAME["Llama 4"].config)
    assert [r is None for r in l4.layers[:8]] == [False, False, False, True] * 2
    assert l4.layer_types[:4] == ("chunked_attention",) * 3 + ("full_attention",)
    assert dict(l4.attention) == {
        "attention_chunk_size": 8192,
        "attn_temperature_tuning": True,
        "floor_scale": 8192,
        "attn_scale": 0.1,
        "use_qk_norm": True,
    }
    assert rotary.hf.rope_for_layer(BY_NAME["Llama 4"].config, 3) is None
    # SmolLM3: the published flags
    sm = rotary.hf.model_rope(BY_NAME["SmolLM3"].config)
    assert [r is None for r in sm.layers] == [False, False, False, True] * 9
    # DeepSeek: which features RoPE rotates, and the softmax scale YaRN changes
    ds = rotary.hf.model_rope(BY_NAME["DeepSeek-V3"].config)
    assert ds.rope_slice == (128, 192)
    assert ds.attention["softmax_scale_multiplier"] == pytest.approx((0.1 * math.log(40) + 1) ** 2)
    # Cohere 2 (Command R7B): global layers have no positional encoding
    c2 = {
        "model_type": "cohere2",
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_hidden_layers": 8,
        "rope_theta": 50000.0,
        "sliding_window": 4096,
    }
    m = rotary.hf.model_rope(c2)
    assert [r is None for r in m.layers] == [False, False, False, True] * 2
    assert m.layers[0].layout == "interleaved"
    assert rotary.hf.from_hf(c2) == m.layers[0]
    with pytest.raises(ValueError, match="no layer of type 'full_attention' applies RoPE"):
        rotary.hf.from_hf(c2, layer_type="full_attention")
    with pytest.raises(ValueError, match="layer_index must be < num_hidden_layers=8"):
        rotary.hf.rope_for_layer(c2, 8)


def test_per_layer_config_overrides_head_dim():
    # transformers 5 writes Gemma 4's global head size as a per-layer override
    cfg = {
        "model_type": "gemma4_text",
        "hidden_size": 64,
        "num_attention_heads": 4,
        "head_dim": 16,
        "num_hidden_layers": 6,
        "per_layer_config": {"5": {"head_dim": 32}},
    }
    m = rotary.hf.model_rope(cfg)
    assert [r.head_dim for r in m.layers] == [16] * 5 + [32]
    assert m.layers[5].rotary_dim == 8 and m.layers[5].partial == "proportional"


def test_legacy_and_5x_styles_agree():
    old = BY_NAME["Qwen2-VL"].config
    new = {k: v for k, v in old.items() if k not in ("rope_scaling", "rope_theta")}
    new["rope_parameters"] = {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [16, 24, 24]}
    assert repr(rotary.hf.mrope_from_hf(old)) == repr(rotary.hf.mrope_from_hf(new))
    # both given and equal: fine; different: an error naming both
    both = dict(new, rope_scaling={"type": "mrope", "mrope_section": [16, 24, 24]}, rope_theta=1e6)
    assert rotary.hf.from_hf(both) == rotary.hf.from_hf(old)
    bad = dict(both, rope_scaling={"type": "linear", "factor": 2.0})
    with pytest.raises(ValueError, match=r"both rope_parameters=.* and rope_scaling=.* describe different"):
        rotary.hf.from_hf(bad)


@pytest.mark.parametrize(
    "cfg, match",
    [
        ({"model_type": "llama", "head_dim": 64, "rotary_pct": 0.5}, "'rotary_pct' changes RoPE"),
        ({"head_dim": 64, "qk_rope_head_dim": 32, "partial_rotary_factor": 0.25}, "factor of an MLA config"),
        ({"head_dim": 64, "rope_interleave": False}, "'rope_interleave' changes RoPE.*model_type=None"),
        (
            {"model_type": "llama", "head_dim": 64, "rope_parameters": {"llama_4_scaling_beta": 0.1}},
            "'default' does not take 'llama_4_scaling_beta'",
        ),
        (
            {
                "model_type": "ministral3",
                "head_dim": 64,
                "num_hidden_layers": 2,
                "rope_parameters": {"llama_4_scaling_beta": 0.1},
            },
            "no original_max_position_embeddings",
        ),
        ({"model_type": "qwen", "head_dim": 64, "use_dynamic_ntk": True}, "'use_dynamic_ntk'.*not supported"),
        ({"model_type": "falcon", "hidden_size": 64, "num_attention_heads": 4, "alibi": True}, "ALiBi"),
        ({"head_dim": 64, "position_embedding_type": "absolute"}, "position_embedding_type='absolute'"),
        ({"head_dim": 64, "rope_scaling": {"rope_type": "warp", "factor": 2.0}}, r"unknown rope_type .warp."),
        (
            {"head_dim": 64, "rope_scaling": {"rope_type": "linear", "factor": 2.0, "finetuned": True}},
            "'linear' does not take 'finetuned'",
        ),
        (
            {"head_dim": 64, "rope_scaling": {"rope_type": "linear", "type": "yarn", "factor": 2.0}},
            "must agree",
        ),
        ({"model_type": "llama", "head_dim": 64, "partial_rotary_factor": 0.5}, "rotates the whole"),
        ({"model_type": "phi", "head_dim": 10, "partial_rotary_factor": 0.5}, "even, positive"),
        ({"model_type": "gptj", "n_embd": 64, "n_head": 4, "rotary_dim": None}, "rotary_dim=null"),
        ({"model_type": "gptj", "n_embd": 64, "n_head": 4, "rope_theta": 5e5}, "fixed"),
        (
            {"model_type": "gpt_neox", "head_dim": 64, "rotary_pct": 0.25, "partial_rotary_factor": 0.5},
            "must agree",
        ),
        ({"model_type": "qwen2_vl", "head_dim": 128, "mrope_interleaved": True}, "never interleaves"),
        ({"hidden_size": 65, "num_attention_heads": 5}, "hidden_size // num_attention_heads must be"),
        ({"hidden_size": 64, "num_attention_heads": 3}, "not a multiple"),
    ],
)
def test_errors_name_the_key(cfg, match):
    with pytest.raises((TypeError, ValueError), match=match):
        rotary.hf.model_rope(cfg) if "num_hidden_layers" in cfg else rotary.hf.from_hf(cfg)


def test_layer_type_errors():
    g3 = BY_NAME["Gemma 3"].config
    with pytest.raises(ValueError, match="pass layer_type="):
        rotary.hf.from_hf(g3)
    with pytest.raises(ValueError, match="layer_type must be one of"):
        rotary.hf.from_hf(g3, layer_type="global")
    with pytest.raises(ValueError, match="one set of RoPE parameters"):
        rotary.hf.from_hf(
            BY_NAME["Llama 3"].config | {"num_hidden_layers": None}, layer_type="full_attention"
        )
    with pytest.raises(ValueError, match="no num_hidden_layers"):
        rotary.hf.rope_for_layer({"head_dim": 8}, 0)


def test_hf_rope_parameters_folds_model_keys():
    p = rotary.hf.hf_rope_parameters(BY_NAME["GPT-NeoX / Pythia"].config)
    assert (p["rope_theta"], p["partial_rotary_factor"], p["head_dim"]) == (10000.0, 0.25, 64)
    p = rotary.hf.hf_rope_parameters(BY_NAME["Gemma 3"].config, "sliding_attention")
    assert (p["rope_type"], p["rope_theta"]) == ("default", 10000.0)
    p = rotary.hf.hf_rope_parameters(BY_NAME["DeepSeek-V2"].config)
    assert (p["rope_type"], p["head_dim"], p["factor"]) == ("yarn", 64, 40)


def test_angles_option_carries_to_every_layer():
    m = rotary.hf.model_rope(BY_NAME["Qwen3-VL"].config, angles="float32")
    assert m.layers[0].rope.angles == "float32"
    assert rotary.hf.rope_for_layer(BY_NAME["Gemma 3"].config, 5, angles="float32").angles == "float32"


def test_nested_parameters_take_each_layer_types_own_default_base():
    # transformers fills a nested entry's missing rope_theta from the layer type's own key
    cfg = {
        "model_type": "gemma3_text",
        "head_dim": 16,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "rope_theta": 2e6,
        "rope_local_base_freq": 3e4,
        "rope_parameters": {
            "full_attention": {"rope_type": "default"},
            "sliding_attention": {"rope_type": "default"},
        },
    }
    assert rotary.hf.from_hf(cfg, layer_type="full_attention").base == 2e6
    assert rotary.hf.from_hf(cfg, layer_type="sliding_attention").base == 3e4
    del cfg["rope_local_base_freq"], cfg["rope_theta"]
    assert rotary.hf.from_hf(cfg, layer_type="sliding_attention").base == 1e4
    assert rotary.hf.from_hf(cfg, layer_type="full_attention").base == 1e6


def test_unknown_model_type_warns():
    cfg = {"model_type": "my_new_model", "hidden_size": 64, "num_attention_heads": 4}
    with pytest.warns(UserWarning, match="model_type 'my_new_model' is not one rotary.hf knows"):
        rope = rotary.hf.from_hf(cfg)
    assert rope.layout == "half"


def test_families_read_as_their_attention_rotates():
    # Regression (issue 24, the census): these were read Llama-style (half layout, forwards) with
    # only a warning, and their numbers were wrong: Helium, ERNIE 4.5, Cohere 2 MoE, the OpenAI
    # privacy filter and Moonshine-streaming pair (2i, 2i + 1); NanoChat rotates by -theta.
    for mt in (
        "helium",
        "ernie4_5",
        "ernie4_5_moe",
        "cohere2_moe",
        "openai_privacy_filter",
        "moonshine_streaming",
    ):
        assert rotary.hf.from_hf({"model_type": mt, "head_dim": 16}).layout == "interleaved", mt
    # BLT's byte-level sub-models pair (2i, 2i + 1) too (found by the census over sub-configs)
    for mt in ("blt_local_encoder", "blt_local_decoder", "blt_global_transformer", "blt_patcher"):
        assert rotary.hf.from_hf({"model_type": mt, "head_dim": 16}).layout == "interleaved", mt
    nano = rotary.hf.from_hf({"model_type": "nanochat", "head_dim": 8, "rope_theta": 100.0})
    np.testing.assert_array_equal(nano.inv_freq(), -rotary.inv_freq(8, 100.0))
    # HunYuan-VL: its text RoPE, but its XD-RoPE at image positions is not a rotation: refused
    hy = {"model_type": "hunyuan_vl", "head_dim": 16, "num_hidden_layers": 2, "mrope_section": [2, 2, 2, 2]}
    assert rotary.hf.from_hf(hy) == rotary.RoPE(16)
    for fn in (rotary.hf.model_rope, rotary.hf.mrope_from_hf):
        with pytest.raises(ValueError, match="not a rotation"):
            fn(hy)
    # partial rotary read for the families whose attention rotates cos.shape[-1] features
    assert rotary.hf.from_hf({"model_type": "qwen3_next", "head_dim": 256}).rotary_dim == 64


def test_per_layer_config_zero_padded_keys_and_layer_types():
    # Regression (issue 24): transformers' per_layer_config (heterogeneous layers, written with
    # zero-padded string keys) was ignored: EmbeddingGemma2's full-attention layers (head_dim 512
    # there) came out 256 wide.
    cfg = {
        "model_type": "gemma3_text",
        "head_dim": 256,
        "num_hidden_layers": 6,
        "layer_types": ["sliding_attention"] * 5 + ["full_attention"],
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "default", "rope_theta": 1e6},
        },
        "per_layer_config": {"05": {"head_dim": 512}},
    }
    assert rotary.hf.from_hf(cfg, layer_type="full_attention").head_dim == 512
    assert rotary.hf.from_hf(cfg, layer_type="sliding_attention").head_dim == 256
    assert rotary.hf.rope_for_layer(cfg, 5).head_dim == 512
    two = dict(cfg, num_hidden_layers=12, layer_types=cfg["layer_types"] * 2)
    with pytest.raises(ValueError, match="rope_for_layer"):  # layers of one type that differ
        rotary.hf.from_hf(two, layer_type="full_attention")


def test_embedding_gemma2_full_attention_against_transformers():
    torch = pytest.importorskip("torch")
    mapping = pytest.importorskip("transformers.models.auto.configuration_auto").CONFIG_MAPPING
    if "embedding_gemma2" not in mapping:
        pytest.skip("this transformers has no embedding_gemma2")
    import importlib
    import warnings

    cfg = mapping["embedding_gemma2"]().get_text_config(decoder=True)
    mod = importlib.import_module("transformers.models.embedding_gemma2.modeling_embedding_gemma2")
    emb = next(getattr(mod, n) for n in dir(mod) if n.endswith("RotaryEmbedding"))(cfg)
    pos = torch.arange(32)[None] * 37
    for lt in ("full_attention", "sliding_attention"):
        c, s = emb(torch.zeros(1, 32, 8), pos, layer_type=lt)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            rope = rotary.hf.from_hf(cfg, angles="float32", layer_type=lt)
        rc, rs = rope.cos_sin(pos[0], full=True, dtype=torch.float32)
        assert torch.equal(rc, c[0]) and torch.equal(rs, s[0]), lt


def test_hunyuan_ntk_alpha():
    # Regression (issue 24): HunYuan's {"type": "dynamic", "alpha": a} (transformers' ntk_alpha:
    # the base times alpha**(d / (d - 2)), static) was refused: "'dynamic' does not take 'alpha'".
    scaling = {"type": "dynamic", "alpha": 1000.0, "factor": 1.0, "beta_fast": 32, "mscale": 1.0}
    cfg = {"model_type": "hunyuan_v1_dense", "head_dim": 64, "rope_theta": 10000.0, "rope_scaling": scaling}
    rope = rotary.hf.from_hf(cfg)
    assert rope.scaling == sc.NTK(factor=1000.0) and rope.static
    np.testing.assert_allclose(
        rope.inv_freq(), rotary.inv_freq(64, 10000.0 * 1000.0 ** (64 / 62)), rtol=1e-15
    )
    with pytest.raises(ValueError, match="ntk_alpha"):
        sc.from_dict({"type": "dynamic", "alpha": 2.0, "low_freq_factor": 1.0})


def test_hunyuan_ntk_alpha_against_transformers():
    torch = pytest.importorskip("torch")
    m = pytest.importorskip("transformers.models.hunyuan_v1_dense.modeling_hunyuan_v1_dense")
    from transformers import HunYuanDenseV1Config

    scaling = {"type": "dynamic", "alpha": 1000.0, "factor": 1.0, "beta_fast": 32, "beta_slow": 1}
    cfg = HunYuanDenseV1Config(hidden_size=256, num_attention_heads=4, head_dim=64, rope_scaling=scaling)
    pos = torch.arange(32)[None] * 37
    c, s = m.HunYuanDenseV1RotaryEmbedding(cfg)(torch.zeros(1, 32, 8), pos)
    rc, rs = rotary.hf.from_hf(cfg, angles="float32").cos_sin(pos[0], full=True, dtype=torch.float32)
    assert torch.equal(rc, c[0]) and torch.equal(rs, s[0])


def _mla(model_type: str, **extra):
    return {
        "model_type": model_type,
        "hidden_size": 256,
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "qk_nope_head_dim": 48,
        "qk_rope_head_dim": 16,
        **extra,
    }


def test_mla_families_read_as_their_attention_rotates():
    # Regression (issue 24, the census): every multi-head latent attention family but DeepSeek's
    # was refused ("qk_rope_head_dim ... read only for model_type ['deepseek_v2', 'deepseek_v3']").
    # Their attention rotates the qk_rope_head_dim features after q_nope, paired as the modeling
    # file pairs them: apply_rotary_pos_emb_interleave always, by rope_interleave, or never.
    layouts = {
        "minicpm3": "half",
        "hy_v4": "half",
        "glm_moe_dsa": "interleaved",
        "longcat_flash": "interleaved",
        "deepseek_v32": "interleaved",
        "bailing_hybrid": "interleaved",
        "mistral_large4": "interleaved",
        "axk2": "interleaved",
        "glm4_moe_lite": "interleaved",
        "youtu": "interleaved",
        "axk1": "interleaved",
        "mistral4": "interleaved",
        "sarvam_mla": "interleaved",
    }
    for mt, layout in layouts.items():
        m = rotary.hf.model_rope(_mla(mt))
        assert (m.layers[0].head_dim, m.layers[0].rotary_dim, m.layers[0].layout) == (16, 16, layout), mt
        assert m.rope_slice == (48, 64), mt
    # the families that read rope_interleave, and only they, take it
    assert rotary.hf.from_hf(_mla("glm4_moe_lite", rope_interleave=False)).layout == "half"
    with pytest.raises(ValueError, match="'rope_interleave' changes RoPE"):
        rotary.hf.from_hf(_mla("minicpm3", rope_interleave=False))
    # Mistral 4 writes head_dim as the whole q/k head and the factor as the rotated fraction
    m4 = _mla(
        "mistral4", head_dim=64, rope_parameters={"rope_type": "default", "partial_rotary_factor": 0.25}
    )
    assert rotary.hf.from_hf(m4).head_dim == 16
    # scaled MLA: the softmax scale multiplier of transformers' yarn_apply_mscale
    yarn = {
        "rope_type": "yarn",
        "factor": 40.0,
        "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 4096,
    }
    a = rotary.hf.model_rope(_mla("glm_moe_dsa", rope_parameters=yarn)).attention
    assert a["softmax_scale_multiplier"] == pytest.approx((0.1 * np.log(40.0) + 1.0) ** 2, rel=1e-15)


def test_mla_per_layer_splits():
    # Dots 3: per_layer_config gives its sliding layers another q_nope width (and their own
    # partial factor, qk_rope_head_dim / head_dim, written per layer type)
    cfg = _mla(
        "dots3_note",
        head_dim=64,
        num_hidden_layers=3,
        layer_types=["indexed_attention", "sliding_attention"] * 1 + ["sliding_attention"],
        per_layer_config={
            "1": {"qk_nope_head_dim": 32, "head_dim": 48},
            "2": {"qk_nope_head_dim": 32, "head_dim": 48},
        },
        rope_parameters={
            "indexed_attention": {"rope_type": "default", "rope_theta": 8e7, "partial_rotary_factor": 0.25},
            "sliding_attention": {"rope_type": "default", "rope_theta": 5e4, "partial_rotary_factor": 1 / 3},
        },
    )
    m = rotary.hf.model_rope(cfg)
    assert [r.head_dim for r in m.layers] == [16, 16, 16] and [r.base for r in m.layers] == [8e7, 5e4, 5e4]
    assert m.rope_slice is None and any("features 32:48" in n for n in m.notes), m.notes
    assert any("features 48:64" in n for n in m.notes), m.notes


def test_no_rope_layers_of_mistral_large4():
    # Regression (issue 24): refused ("'no_rope_layers' ... read only for ['llama4', 'smollm3']")
    m = rotary.hf.model_rope(_mla("mistral_large4", num_hidden_layers=4, no_rope_layers=[1, 0, 1, 1]))
    assert [r is None for r in m.layers] == [False, True, False, False]


def test_query_scales_against_transformers():
    # Ministral 3 / Mistral 4 (llama_4_scaling_beta) and Llama 4 (attn_temperature_tuning) scale
    # queries by position: not RoPE, reported in ModelRope.attention and computed by
    # ModelRope.query_scale, bit for bit as transformers computes them.
    torch = pytest.importorskip("torch")
    m3 = pytest.importorskip("transformers.models.ministral3.modeling_ministral3")
    m4 = pytest.importorskip("transformers.models.mistral4.modeling_mistral4")
    from transformers import Llama4TextConfig, Ministral3Config, Mistral4Config

    pos = torch.tensor([[0, 1, 16383, 16384, 40000, 10**6, 3 * 10**7]])
    for mod, cfg in ((m3, Ministral3Config()), (m4, Mistral4Config())):
        rp = cfg.rope_parameters
        want = mod.get_llama_4_attn_scale(
            pos, rp["llama_4_scaling_beta"], rp["original_max_position_embeddings"]
        )
        m = rotary.hf.model_rope(cfg)
        for i in (0, len(m.layers) - 1):
            got = m.query_scale(i, pos)
            assert got.dtype == torch.float32 and torch.equal(got, want.reshape(pos.shape)), type(cfg)
    cfg = Llama4TextConfig(num_hidden_layers=4, attn_temperature_tuning=True, floor_scale=8, attn_scale=0.25)
    m = rotary.hf.model_rope(cfg)
    positions = pos[0]
    want = torch.log1p(torch.floor((positions.float() + 1.0) / cfg.floor_scale)) * cfg.attn_scale + 1.0
    assert m.layers[3] is None and torch.equal(m.query_scale(3, positions), want)
    assert m.query_scale(0, positions) is None  # the layers with RoPE keep their queries
    assert rotary.hf.model_rope(BY_NAME["Llama 3"].config).query_scale(0, positions) is None
    with pytest.raises(TypeError, match="positions must be"):
        m.query_scale(3, positions > 0)
    with pytest.raises(ValueError, match="layer_index must be < num_hidden_layers=4"):
        m.query_scale(4, positions)


def test_mrope_families_read_as_their_rotary_embedding_recomposes():
    # Regression (issue 24, the census with 3-D position ids): Cosmos-3-Edge was read with
    # Qwen2-VL's consecutive sections, but its text rotary embedding uses Qwen3-VL's round robin
    # (wrong numbers at image positions); GLM-4V (+MoE), GLM-OCR and Qwen3-Omni were refused;
    # PaddleOCR-VL, Qwen2.5-Omni, Qwen3.5 (+MoE) and Qwen4-Exp were read as plain RoPEs.
    def mrope(mt, **extra):
        return rotary.hf.mrope_from_hf({"model_type": mt, "head_dim": 128, "rope_theta": 1e4, **extra})

    assert mrope("cosmos3_edge", rope_parameters={"mrope_section": [24, 20, 20]}).interleaved
    for mt, sections, interleaved in (
        ("glm4v_moe", (8, 12, 12), False),
        ("qwen3_omni_moe", (24, 20, 20), True),
        ("paddleocr_vl", (16, 24, 24), False),
        ("qwen2_5_omni", (16, 24, 24), False),
    ):
        m = mrope(mt, partial_rotary_factor=0.5) if mt == "glm4v_moe" else mrope(mt)
        assert (m.sections, m.interleaved) == (sections, interleaved), mt
    glm = mrope("glm4v", partial_rotary_factor=0.5)
    assert (glm.rotary_dim, glm.layout, glm.sections) == (64, "interleaved", (8, 12, 12))
    # Qwen3.5's round robin covers the first 32 pairs; the others keep the temporal row
    assert mrope("qwen3_5", partial_rotary_factor=1.0).sections == (64 - 21, 11, 10)
    assert mrope("qwen3_omni_moe", rope_parameters={"interleaved": True}).interleaved  # Qwen3-Omni's key
    with pytest.raises(ValueError, match="give mrope_interleaved"):
        mrope("my_vl_model", rope_parameters={"mrope_section": [16, 24, 24]})


def test_neomme_rotates_two_position_rows_alternately():
    # Regression (issue 24, the census with 2-D position ids): NeoMME was read as a plain RoPE, but
    # its rotary embedding takes (height, width) position rows and alternates them over the pairs
    # (NeoMMERotaryEmbedding.recomposition_frequencies): wrong numbers at image positions.
    params = {
        "full_attention": {"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.5},
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
    }
    cfg = {"model_type": "neomme", "head_dim": 32, "num_attention_heads": 4, "rope_parameters": params}
    m = rotary.hf.mrope_from_hf(cfg, layer_type="full_attention", angles="float32")
    assert (m.rotary_dim, m.sections, tuple(m.rows())) == (16, (4, 4), (0, 1) * 4)
    layers = rotary.hf.model_rope(
        {**cfg, "num_hidden_layers": 2, "layer_types": ["sliding_attention", "full_attention"]}
    ).layers
    assert [type(r) for r in layers] == [rotary.MRoPE, rotary.MRoPE]
    rows = np.stack([np.arange(6), np.arange(6) % 3 + 10])  # (height, width) of six patches
    c, s = m.cos_sin(rows, dtype=np.float64)
    theta = 1e6 ** (-np.arange(0, 16, 2) / 16)
    want = np.where(np.arange(8) % 2 == 0, rows[0][:, None], rows[1][:, None]) * theta
    np.testing.assert_allclose(c, np.cos(want), rtol=0, atol=4 * np.finfo(np.float32).eps)
    np.testing.assert_allclose(s, np.sin(want), rtol=0, atol=4 * np.finfo(np.float32).eps)
    bad = {**params, "full_attention": {**params["full_attention"], "partial_rotary_factor": 0.3125}}
    with pytest.raises(ValueError, match="divisible by 4"):
        rotary.hf.mrope_from_hf({**cfg, "rope_parameters": bad}, layer_type="full_attention")


def test_deepseek_v4_rope_labels_as_layer_type():
    # Regression (issue 24): from_hf(layer_type="main" / "compress") named DeepSeek-V4's two RoPEs
    # as valid but refused them ("no layer of type 'compress' applies RoPE").
    cfg = {
        "model_type": "deepseek_v4",
        "head_dim": 512,
        "qk_rope_head_dim": 64,
        "num_hidden_layers": 2,
        "layer_types": ["sliding_attention", "heavily_compressed_attention"],
        "rope_parameters": {
            "main": {"rope_type": "default", "rope_theta": 10000.0},
            "compress": {"rope_type": "default", "rope_theta": 160000.0},
        },
    }
    main = rotary.hf.from_hf(cfg, layer_type="main")
    compress = rotary.hf.from_hf(cfg, layer_type="compress")
    assert (main.base, compress.base) == (10000.0, 160000.0)
    assert repr(main) == repr(rotary.hf.from_hf(cfg, layer_type="sliding_attention"))
    assert repr(compress) == repr(rotary.hf.from_hf(cfg, layer_type="heavily_compressed_attention"))


def test_zamba2_without_mem_rope_has_no_rope():
    # Regression (issue 24, the tiny-model swap): Zamba2 rotates only with use_mem_rope=true (its
    # default is false: Zamba2Attention applies no position embedding), but rotary read a RoPE.
    cfg = {"model_type": "zamba2", "hidden_size": 64, "num_attention_heads": 4, "attention_head_dim": 32}
    with pytest.raises(ValueError, match="use_mem_rope=false"):
        rotary.hf.from_hf(cfg)
    with pytest.raises(ValueError, match="use_mem_rope=false"):
        rotary.hf.from_hf({**cfg, "use_mem_rope": False})
    assert rotary.hf.from_hf({**cfg, "use_mem_rope": True}).head_dim == 32
