"""sglang 0.5.23: DynamicNTKScalingRotaryEmbedding computes one base, for a sequence of
max_position_embeddings * factor tokens, and uses it at every length; transformers' dynamic NTK
keeps rope_theta up to max_position_embeddings tokens and scales the base with the sequence's
length past it.  The two agree only for a sequence of exactly factor * max_position_embeddings
tokens."""

import os

os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")  # sglang's CPU engine (no CUDA here)

import numpy as np
import torch
from sglang.srt.layers.rotary_embedding import get_rope
from transformers import LlamaConfig

cfg = LlamaConfig(  # Llama 2 7B with the rope_scaling transformers documents for dynamic NTK
    hidden_size=4096, num_attention_heads=32, max_position_embeddings=4096, rope_theta=10000.0,
    rope_scaling={"type": "dynamic", "factor": 2.0},
)  # fmt: skip
D, L, F = 128, cfg.max_position_embeddings, 2.0
rp = cfg.rope_parameters
# sglang/srt/models/llama.py LlamaAttention
rope = get_rope(D, rotary_dim=D, max_position=L, base=rp["rope_theta"], rope_scaling=rp, is_neox_style=True)
print(type(rope).__name__, "table rows:", rope.cos_sin_cache.shape[0])


def rope_f64(pos, base, x):  # half layout, float64
    ang = pos.astype(np.float64)[:, None] * base ** (-np.arange(0, D, 2) / D)
    x1, x2 = x[:, : D // 2].astype(np.float64), x[:, D // 2 :].astype(np.float64)
    return np.concatenate([x1 * np.cos(ang) - x2 * np.sin(ang), x2 * np.cos(ang) + x1 * np.sin(ang)], -1)


for n in (100, 4096, 6000, 8192):  # one sequence of n tokens
    pos = torch.arange(n)
    x = np.random.default_rng(0).standard_normal((n, D)).astype(np.float32)
    with torch.no_grad():
        q, _ = rope.forward(pos, torch.from_numpy(x), torch.from_numpy(x))
    base = 10000.0 if n <= L else 10000.0 * (F * n / L - (F - 1)) ** (D / (D - 2))  # transformers
    e = np.abs(q.numpy() - rope_f64(pos.numpy(), base, x)).max(axis=-1)
    print(f"{n} tokens: transformers' base {base:.1f}; max|sglang - f64| at [1, {n - 1}]: {e[1]:.3g} {e[n - 1]:.3g}")
