"""``RoPE.from_hf`` against the model's own rotary embedding in ``transformers``.

``angles="float32"`` must match bit-for-bit (cos/sin and rotated q/k, float32 and
bfloat16); ``angles="exact"`` must agree within HF's own float32 angle error
(``eps32 * angle``) while staying within ``eps32`` of the float64 truth.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import rotary  # noqa: E402
from rotary import scaling as sc  # noqa: E402

transformers.logging.set_verbosity_error()

HD, MAXPOS = 32, 128
EPS32 = float(np.finfo(np.float32).eps)

ROPE_PARAMETERS = {
    "default": {"rope_type": "default"},
    "linear": {"rope_type": "linear", "factor": 4.0},
    "dynamic": {"rope_type": "dynamic", "factor": 3.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
    "yarn-deepseek": {
        "rope_type": "yarn",
        "factor": 40.0,
        "original_max_position_embeddings": 64,
        "mscale": 0.707,
        "mscale_all_dim": 1.0,
        "beta_fast": 16,
        "beta_slow": 2,
        "truncate": False,
    },
    "longrope": {
        "rope_type": "longrope",
        "short_factor": np.linspace(1.0, 2.0, HD // 2).tolist(),
        "long_factor": np.linspace(1.0, 30.0, HD // 2).tolist(),
        "original_max_position_embeddings": 64,
    },
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    },
}
# Sequence lengths: within the original context, and beyond it (dynamic/longrope switch).
LENGTHS = (50, 300)


def _llama(rope_parameters, theta=10000.0):
    from transformers import LlamaConfig

    return LlamaConfig(
        hidden_size=HD * 4,
        num_attention_heads=4,
        head_dim=HD,
        max_position_embeddings=MAXPOS,
        rope_parameters=dict(rope_parameters, rope_theta=theta),
    )


def _hf_llama(config, pos, q, k):
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    emb = LlamaRotaryEmbedding(config)  # fresh: HF's dynamic module is stateful
    cos, sin = emb(q, pos)
    return cos, sin, *apply_rotary_pos_emb(q, k, cos, sin)


def _inputs(S, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 4, S, HD, generator=g).to(dtype)
    k = torch.randn(2, 4, S, HD, generator=g).to(dtype)
    pos = torch.stack([torch.arange(S), torch.arange(S) // 2])  # (B, S), two different rows
    return q, k, pos


def _ours(rope, pos, q, k):
    c, s = rope.cos_sin(pos, full=True, dtype=q.dtype)
    qr, kr = rope.apply(q, k, pos[:, None, :])
    return c, s, qr, kr


def _exact_tol(rope, pos, af):
    """HF's float32 error bound: a few eps32 of the angle (float32 angle and inv_freq rounding)."""
    w = rope.inv_freq()
    ang = np.abs(pos.numpy().astype(np.float64))[..., None] * w
    ang = np.concatenate([ang, ang], axis=-1)
    return 4 * EPS32 * (1.0 + ang) * max(1.0, af)


@pytest.mark.parametrize("S", LENGTHS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("name", list(ROPE_PARAMETERS))
def test_float32_mode_bit_for_bit(name, dtype, S):
    dt = getattr(torch, dtype)
    config = _llama(ROPE_PARAMETERS[name])
    q, k, pos = _inputs(S, dt)
    want = _hf_llama(config, pos, q, k)
    got = _ours(rotary.RoPE.from_hf(config, angles="float32"), pos, q, k)
    for label, a, b in zip(("cos", "sin", "q", "k"), got, want, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape, label
        assert torch.equal(a, b), (
            f"{name} {dtype} S={S} {label}: max diff {(a.float() - b.float()).abs().max()}"
        )


@pytest.mark.parametrize("S", LENGTHS)
@pytest.mark.parametrize("name", list(ROPE_PARAMETERS))
def test_exact_mode_within_hf_float32_error(name, S):
    config = _llama(ROPE_PARAMETERS[name])
    q, k, pos = _inputs(S, torch.float32)
    hc, hs, hq, hk = _hf_llama(config, pos, q, k)
    rope = rotary.RoPE.from_hf(config)
    c, s, qr, kr = _ours(rope, pos, q, k)
    # Frequencies: ours are float64, HF's float32 rounding of the same formula.
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    emb = LlamaRotaryEmbedding(config)
    emb(q, pos)  # let dynamic/longrope update to this sequence length
    assert rope.attention_factor == pytest.approx(emb.attention_scaling, rel=1e-15)
    tol = _exact_tol(rope, pos, rope.attention_factor)
    if sc.resolve(rope.scaling).dynamic and S > 64:
        # Ours switched too: compare to the frequencies HF uses at this length.
        w = emb.inv_freq.double().numpy()
        ang = np.abs(pos.numpy().astype(np.float64))[..., None] * w
        tol = 4 * EPS32 * (1.0 + np.concatenate([ang, ang], axis=-1)) * max(1.0, rope.attention_factor)
    assert (np.abs(c.numpy() - hc.numpy()) <= tol).all()
    assert (np.abs(s.numpy() - hs.numpy()) <= tol).all()
    qtol = 2 * tol.max() * np.abs(q.numpy()).max() * 2
    assert np.abs(qr.numpy() - hq.numpy()).max() <= qtol
    assert np.abs(kr.numpy() - hk.numpy()).max() <= qtol


def test_partial_rotary_gpt_neox():
    from transformers import GPTNeoXConfig
    from transformers.models.gpt_neox.modeling_gpt_neox import GPTNeoXRotaryEmbedding, apply_rotary_pos_emb

    config = GPTNeoXConfig(
        hidden_size=HD * 4, num_attention_heads=4, max_position_embeddings=MAXPOS, partial_rotary_factor=0.25
    )
    rope = rotary.RoPE.from_hf(config, angles="float32")
    assert (rope.head_dim, rope.rotary_dim) == (HD, HD // 4)
    q, k, pos = _inputs(40, torch.float32)
    cos, sin = GPTNeoXRotaryEmbedding(config)(q, pos)
    hq, hk = apply_rotary_pos_emb(q, k, cos, sin)
    c, s, qr, kr = _ours(rope, pos, q, k)
    for a, b in ((c, cos), (s, sin), (qr, hq), (kr, hk)):
        assert torch.equal(a, b)


def test_phi3_longrope_top_level_original_length():
    from transformers import Phi3Config
    from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding, apply_rotary_pos_emb

    rp = dict(ROPE_PARAMETERS["longrope"])
    rp.pop("original_max_position_embeddings")
    config = Phi3Config(
        hidden_size=HD * 4,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=256,
        original_max_position_embeddings=64,
        rope_parameters=dict(rp, rope_theta=10000.0),
    )
    rope = rotary.RoPE.from_hf(config, angles="float32")
    assert rope.scaling.original_max_position_embeddings == 64
    assert rope.attention_factor == pytest.approx(math.sqrt(1 + math.log(4.0) / math.log(64)), rel=1e-15)
    for S in (60, 100):
        q, k, pos = _inputs(S, torch.float32)
        cos, sin = Phi3RotaryEmbedding(config)(q, pos)
        hq, hk = apply_rotary_pos_emb(q, k, cos, sin)
        for a, b in zip(_ours(rope, pos, q, k), (cos, sin, hq, hk), strict=True):
            assert torch.equal(a, b)


def test_dict_configs_4x_and_5x_styles():
    config = _llama(ROPE_PARAMETERS["yarn"], theta=5e5)
    from_obj = rotary.RoPE.from_hf(config)
    from_dict5 = rotary.RoPE.from_hf(config.to_dict())
    old = {
        "hidden_size": HD * 4,
        "num_attention_heads": 4,
        "head_dim": HD,
        "max_position_embeddings": MAXPOS,
        "rope_theta": 5e5,
        "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
    }
    from_dict4 = rotary.RoPE.from_hf(old)
    assert from_obj == from_dict5 == from_dict4
    assert from_obj.base == 5e5 and isinstance(from_obj.scaling, sc.YaRN)


def test_from_hf_errors():
    with pytest.raises(TypeError, match="config must be"):
        rotary.RoPE.from_hf(42)
    with pytest.raises(ValueError, match="head_dim"):
        rotary.RoPE.from_hf({"rope_theta": 1e4})
    with pytest.raises(ValueError, match=r"unknown rope_type .warp."):
        rotary.RoPE.from_hf({"head_dim": 8, "rope_scaling": {"rope_type": "warp", "factor": 2.0}})
    nested = {
        "head_dim": 8,
        "rope_parameters": {"full_attention": {"rope_theta": 1e6}, "sliding_attention": {}},
    }
    with pytest.raises(ValueError, match="layer_type"):
        rotary.RoPE.from_hf(nested)
    assert rotary.RoPE.from_hf(nested, layer_type="full_attention").base == 1e6
    with pytest.raises(ValueError, match="needs 'max_position_embeddings'"):
        rotary.RoPE.from_hf({"head_dim": 8, "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}})
