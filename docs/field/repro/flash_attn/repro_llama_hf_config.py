# ruff: noqa: I001  (the engine setup must run before its imports)
"""flash-attn 2.8.3.post2: its HF Llama loader drops rope_theta and rope_scaling.

flash_attn/models/llama.py: llama_config_to_gpt2_config(LlamaConfig) passes
rotary_emb_base=getattr(llama_config, "rotary_emb_base", 10000.0): an HF LlamaConfig has no such
attribute (only config_from_meta_checkpoint sets it, from params.json), so every HF-format Llama
(config_from_hf_checkpoint) gets base 10000; rope_scaling is never read.  Llama 3.1 8B's config:
rope_theta 500000 with llama3 scaling (factor 8, low 1, high 4, L0 8192).
"""

import math

import numpy as np
import torch

import _load  # noqa: F401  (flash-attn without its CUDA __init__; TRITON_INTERPRET on CPU)
from flash_attn.layers.rotary import RotaryEmbedding
from flash_attn.models.llama import llama_config_to_gpt2_config
from transformers import LlamaConfig

hf = LlamaConfig(
    hidden_size=4096,
    num_attention_heads=32,
    num_key_value_heads=8,
    num_hidden_layers=32,
    max_position_embeddings=131072,
    rope_theta=500000.0,
    rope_scaling={
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
)
g = llama_config_to_gpt2_config(hf)
print(
    "llama_config_to_gpt2_config -> rotary_emb_base =",
    g.rotary_emb_base,
    "| rotary_emb_fraction =",
    g.rotary_emb_fraction,
    "| rotary_emb_interleaved =",
    g.rotary_emb_interleaved,
    "| any scaling field:",
    [k for k in vars(g) if "scal" in k and "rotary" in k] or "none",
)

# what models/gpt.py create_mixer_cls -> MHA builds from it
head_dim = g.n_embd // g.n_head
rope = RotaryEmbedding(
    int(g.rotary_emb_fraction * head_dim),
    base=getattr(g, "rotary_emb_base", 10000.0),
    interleaved=g.rotary_emb_interleaved,
)

# Llama 3.1's frequencies in float64 (transformers' _compute_llama3_parameters)
d, base, s, lo, hi, L0 = 128, 500000.0, 8.0, 1.0, 4.0, 8192
inv = base ** (-np.arange(0, d, 2) / d)
wl = 2 * math.pi / inv
smooth = (L0 / wl - lo) / (hi - lo)
inv3 = np.where(wl < L0 / hi, inv, np.where(wl > L0 / lo, inv / s, (1 - smooth) * inv / s + smooth * inv))

# rotate the unit vector e_0 of each pair (interleaved: features 2i, 2i+1) at a few positions
pos = torch.tensor([1, 100, 4096, 131071])
x = torch.zeros(len(pos), 1, 1, head_dim)
x[..., 0::2] = 1.0
kv = torch.zeros(len(pos), 1, 2, 1, head_dim)
q, _ = rope(x.clone(), kv, seqlen_offset=pos, max_seqlen=int(pos.max()) + 1)
ang_engine = torch.atan2(q[:, 0, 0, 1::2], q[:, 0, 0, 0::2]).double().numpy()
ang_truth = np.angle(np.exp(1j * pos.numpy()[:, None] * inv3[None, :]))
err = np.abs(np.angle(np.exp(1j * (ang_engine - ang_truth))))
for p, e in zip(pos.tolist(), err):
    print(
        f"position {p:6d}: max angle error vs Llama 3.1's RoPE = {e.max():.3f} rad (pair {int(e.argmax())})"
    )
print("feature-pair 1 frequency: engine", float(rope.inv_freq[1]), " Llama 3.1", float(inv3[1]))
