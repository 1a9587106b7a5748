"""torchtitan 0.3.0: the llama3 flavors "1B" and "3B" have Llama 3.2 1B / 3B's exact shapes
(dim 2048/3072, 16/28 layers, 32/24 heads, 8 kv heads, vocab 128256, tied embeddings) and
Llama3StateDictAdapter loads HF Llama weights into them, but their ComplexRoPE.Config does not set
scaling_factor, so the default 8.0 (Llama 3.1's) applies.  Llama-3.2-1B/3B config.json has
rope_scaling factor 32.0 (low 1, high 4, original 8192, theta 500000); the factor 8 was the bug
fixed in Meta's llama-models #241 / executorch #7265 ("bad output after 80k tokens").
Run: python repro_llama32_factor.py  (torchtitan==0.3.0, torch, numpy)."""

import math

import numpy as np
from torchtitan.models import llama3


def hf_llama3_inv(d, base, factor, low=1.0, high=4.0, orig=8192):
    inv = 1.0 / base ** (np.arange(0, d, 2) / d)
    wl = 2 * math.pi / inv
    sm = np.clip((orig / wl - low) / (high - low), 0, 1)
    out = (1 - sm) * inv / factor + sm * inv
    return np.where(wl < orig / high, inv, np.where(wl > orig / low, inv / factor, out))


for flavor in ("1B", "3B", "8B"):
    m = llama3.model_registry(flavor).model
    cfg = m.layers[0].attention.rope
    rope = cfg.build()
    ang = np.angle(rope.cache[1].numpy().astype(np.complex128))  # angle at position 1 = inv_freq
    want = 8.0 if flavor == "8B" else 32.0  # HF config.json: Llama-3.1-8B 8, Llama-3.2-1B/3B 32
    ref = hf_llama3_inv(cfg.dim, cfg.theta, want)
    p = 65536
    err = np.abs(np.angle(rope.cache[p].numpy().astype(np.complex128) * np.exp(-1j * p * ref))).max()
    print(
        f"flavor {flavor}: dim {m.dim}, layers {len(m.layers)}, tied {m.enable_weight_tying}, "
        f"scaling_factor {cfg.scaling_factor} (HF {want}); max |inv_freq/HF - 1| = "
        f"{np.abs(ang / ref - 1).max():.3g}; max angle error at pos {p}: {err:.3g} rad"
    )
