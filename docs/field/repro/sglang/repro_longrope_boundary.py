"""sglang 0.5.23: Phi3LongRoPEScaledRotaryEmbedding.forward switches to the long factors when
`torch.any(positions > original_max_position_embeddings)`, transformers when the sequence is longer
than it (`max(position_ids) + 1 > original_max_position_embeddings`): a prompt of exactly
original + 1 = 4097 tokens (positions 0..4096) is rotated with the short factors by sglang and the
long ones by transformers, at every position."""

import os

os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")  # sglang's CPU engine (no CUDA here)

import numpy as np
import torch
from sglang.srt.layers.rotary_embedding import get_rope
from transformers import Phi3Config

LONG = [float(v) for v in np.round(np.geomspace(1.08, 64.8, 48), 6)]
SHORT = [float(v) for v in np.round(np.geomspace(1.0, 2.7, 48), 6)]
cfg = Phi3Config(  # shaped like Phi-3 mini 128k (48 factors per list)
    hidden_size=3072, num_attention_heads=32, max_position_embeddings=131072,
    original_max_position_embeddings=4096, rope_theta=10000.0,
    rope_scaling={"long_factor": LONG, "short_factor": SHORT, "type": "longrope"},
)  # fmt: skip
D = cfg.hidden_size // cfg.num_attention_heads
rp = dict(cfg.rope_parameters)
rp["original_max_position_embeddings"] = cfg.original_max_position_embeddings  # llama.py does this
# sglang/srt/models/llama.py LlamaAttention (Phi3ForCausalLM is LlamaForCausalLM there)
rope = get_rope(D, rotary_dim=D, max_position=cfg.max_position_embeddings, base=rp["rope_theta"], rope_scaling=rp)
print(type(rope).__name__)


def longrope_f64(pos, ext, x):  # transformers' LongRoPE, float64, half layout
    inv = 1.0 / (np.asarray(ext, np.float64) * 10000.0 ** (np.arange(0, D, 2) / D))
    ang = pos.astype(np.float64)[:, None] * inv
    af = np.sqrt(1 + np.log(131072 / 4096) / np.log(4096))
    x1, x2 = x[..., : D // 2].astype(np.float64), x[..., D // 2 :].astype(np.float64)
    c, s = np.cos(ang)[:, None], np.sin(ang)[:, None]
    return af * np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], -1)


at = [1, 100, 4095]
for n in (4096, 4097, 4098):  # prompts of n tokens: positions 0..n-1
    pos = torch.arange(n)
    x = torch.from_numpy(np.random.default_rng(0).standard_normal((n, 1, D)).astype(np.float32))
    with torch.no_grad():
        q, _ = rope.forward(pos, x.reshape(n, D), x.reshape(n, D))
    q = q.reshape(n, 1, D).numpy()
    hf = "long" if n > 4096 else "short"  # transformers: seq_len = max(position_ids) + 1 > 4096
    for label, ext in (("short", SHORT), ("long", LONG)):
        e = np.abs(q - longrope_f64(pos.numpy(), ext, x.numpy())).max(axis=(1, 2))[at]
        print(f"{n} tokens (transformers: {hf}): max|sglang - f64 {label}| at {at}: {np.array2string(e, precision=3)}")
