"""keras-hub 0.32.0: convert_qwen.convert_backbone_config (the hf:// loader for model_type qwen2)
never reads rope_scaling, so Qwen2.5 with the YaRN block its model card adds for 128K context
loads with plain RoPE (QwenBackbone's rope_scaling_factor stays 1.0): no YaRN frequencies, no
attention factor 0.1 ln 4 + 1 = 1.1386, at every position."""

import math
import os

os.environ.setdefault("KERAS_BACKEND", "jax")
import numpy as np
from keras import ops
from keras_hub.layers import RotaryEmbedding
from keras_hub.src.utils.transformers import convert_qwen

hf = {
    "model_type": "qwen2",
    "hidden_size": 3584,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "num_hidden_layers": 28,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "rope_scaling": {"factor": 4.0, "original_max_position_embeddings": 32768, "type": "yarn"},
    "vocab_size": 152064,
    "intermediate_size": 18944,
    "rms_norm_eps": 1e-6,
    "use_sliding_window": False,
    "sliding_window": 131072,
    "tie_word_embeddings": False,
}
kw = convert_qwen.convert_backbone_config(hf)
print("backbone config RoPE keys:", {k: v for k, v in kw.items() if "rope" in k})
# QwenAttention.build: RotaryEmbedding(max_wavelength=rope_max_wavelength, scaling_factor=rope_scaling_factor)
layer = RotaryEmbedding(
    max_wavelength=kw["rope_max_wavelength"], scaling_factor=kw.get("rope_scaling_factor", 1.0)
)
D, BASE, S, L0 = 128, 1e6, 4.0, 32768


def rotate_f64(x, pos, yarn):
    i = np.arange(D // 2)
    inv = BASE ** (-2.0 * i / D)
    af = 1.0
    if yarn:  # Hugging Face YaRN (truncate)
        cd = lambda r: D * math.log(L0 / (2 * math.pi * r)) / (2 * math.log(BASE))  # noqa: E731
        lo, hi = max(math.floor(cd(32)), 0), min(math.ceil(cd(1)), D - 1)
        ramp = np.clip((i - lo) / (hi - lo), 0, 1)
        inv = inv / S * ramp + inv * (1 - ramp)
        af = 0.1 * math.log(S) + 1
    a = pos[:, None].astype(np.float64) * inv
    c, s = np.cos(a) * af, np.sin(a) * af
    x1, x2 = x[..., : D // 2].astype(np.float64), x[..., D // 2 :].astype(np.float64)
    return np.concatenate([x1 * c[:, None] - x2 * s[:, None], x2 * c[:, None] + x1 * s[:, None]], axis=-1)


pos = np.array([0, 10, 1000, 32768, 100000])
x = np.random.default_rng(0).standard_normal((len(pos), 1, D)).astype(np.float32)
y = np.asarray(ops.convert_to_numpy(layer(x[None], positions=pos)))[0]
for yarn in (True, False):
    e = np.abs(y - rotate_f64(x, pos, yarn)).max(axis=(1, 2))
    name = "YaRN(4)" if yarn else "plain RoPE"
    print(f"max|keras - f64 {name}| at {pos.tolist()}: {np.array2string(e, precision=3)}")
