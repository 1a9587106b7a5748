"""transformers (which liger-kernel's RoPE takes its cos/sin from): dynamic NTK keeps the
frequencies grown for a longer call in every later call of max_position_embeddings tokens or more.

LlamaRotaryEmbedding with rope_type "dynamic" (factor 2, max_position_embeddings 4096) grows its
inv_freq for a call longer than 4096 and resets it only for a call *shorter* than 4096
(``seq_len < original_max_seq_len``).  A call of exactly 4096 tokens, or of 4097, after a call of
16384 tokens is rotated with the 16384-token frequencies; the same call on a fresh module (and in
transformers' own formula for that call's length) with its own.  Checked in float64 against the
formula base * (factor * n / L - (factor - 1)) ** (d / (d - 2)).
"""

import numpy as np
import torch
import transformers
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

print("transformers", transformers.__version__)
cfg = LlamaConfig(
    hidden_size=4096,
    num_attention_heads=32,
    max_position_embeddings=4096,
    rope_theta=10000.0,
    rope_scaling={"rope_type": "dynamic", "factor": 2.0},
)
d, big_l, base = 128, 4096, 10000.0


def expected_cos(n: int, at_len: int) -> np.ndarray:
    """cos of positions 0..n-1 with the frequencies of a call of ``at_len`` tokens (float64)."""
    b = base * (2.0 * at_len / big_l - 1.0) ** (d / (d - 2)) if at_len > big_l else base
    inv = b ** (-np.arange(0, d, 2, dtype=np.float64) / d)
    return np.cos(np.arange(n, dtype=np.float64)[:, None] * inv[None, :])


def cos_of(module: LlamaRotaryEmbedding, n: int) -> np.ndarray:
    x = torch.zeros(1, n, 8, dtype=torch.float32)
    cos, _ = module(x, torch.arange(n)[None])
    return cos[0, :, : d // 2].double().numpy()


def report(label: str, got: np.ndarray, n: int) -> None:
    own = float(np.abs(got - expected_cos(n, n)).max())
    kept = float(np.abs(got - expected_cos(n, 16384)).max())
    print(f"{label:44s} vs its own length: {own:.1e}   vs 16384's frequencies: {kept:.1e}")


fresh = LlamaRotaryEmbedding(cfg)
report("fresh module, 4096 tokens", cos_of(fresh, 4096), 4096)
used = LlamaRotaryEmbedding(cfg)
cos_of(used, 16384)
report("after 16384 tokens, 4096 tokens", cos_of(used, 4096), 4096)
report("after 16384 tokens, 4097 tokens", cos_of(used, 4097), 4097)
cos_of(used, 100)
report("after a call of 100 tokens, 4096 tokens", cos_of(used, 4096), 4096)
