"""torchtitan 0.3.0: the registered Qwen3 8B flavor has no YaRN, and its RoPE table stops at
40960 positions.  Qwen3-8B's model card serves 131072 tokens with YaRN (factor 4,
original_max_position_embeddings 32768); torchtitan reads no config.json, so the flavor is what a
run gets: plain RoPE (pairs 24..63 turn up to 4x faster than HF's YaRN from position 1 on, and
cos and sin lack YaRN's attention factor) and positions from 40960 on are refused.  Serving the
model card's context needs the flavor edited (as repro_yarn_attention_factor.py does).
Run: python repro_qwen3_flavor_no_yarn.py  (torchtitan==0.3.0, torch, numpy)."""

import math

import numpy as np
import torch
from torchtitan.models import qwen3

factor, orig, base, d = 4.0, 32768, 1e6, 128
cfg = qwen3.model_registry("8B").model.layers[0].attention.rope
print("8B flavor:", type(cfg).__qualname__, "scaling =", cfg.scaling, "max_seq_len =", cfg.max_seq_len)
rope = cfg.build()

# float64 Hugging Face YaRN (modeling_rope_utils._compute_yarn_parameters)
inv = 1.0 / base ** (np.arange(0, d, 2) / d)
cd = lambda r: d * math.log(orig / (r * 2 * math.pi)) / (2 * math.log(base))
lo, hi = max(math.floor(cd(32.0)), 0), min(math.ceil(cd(1.0)), d - 1)
ramp = np.clip((np.arange(d // 2) - lo) / (hi - lo), 0, 1)
inv_hf = inv / factor * ramp + inv * (1 - ramp)

# the flavor's angle per pair at position 1, from its rotation of a unit pair
x = torch.zeros(1, d // 2, 1, d)
x[0, torch.arange(d // 2), 0, torch.arange(d // 2)] = 1.0
with torch.no_grad():
    out, _ = rope(x, x, torch.ones(1, d // 2, dtype=torch.long))
o = out[0, :, 0].double().numpy()
theta = np.arctan2(o[np.arange(d // 2), np.arange(d // 2) + d // 2], o[np.arange(d // 2), np.arange(d // 2)])
ratio = theta / inv_hf
print("pairs whose frequency differs from HF's YaRN:", np.nonzero(np.abs(ratio - 1) > 1e-3)[0].tolist())
print("flavor / HF YaRN, pairs 24, 32, 40:", np.round(ratio[[24, 32, 40]], 4).tolist())
print("flavor / plain RoPE, every pair: max |ratio - 1| =", float(np.abs(theta / inv - 1).max()))
try:
    rope(x[:, :1], x[:, :1], torch.tensor([[40960]]))
    print("position 40960: computed")
except Exception as e:
    print("position 40960:", type(e).__name__, str(e).splitlines()[0])
