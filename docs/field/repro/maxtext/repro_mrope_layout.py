"""MaxText 0.2.5: its only M-RoPE (Qwen3OmniMoeThinkerTextRotaryEmbedding, which the qwen2 decoder
uses when use_mrope=true) lays the sections out interleaved (Qwen3-VL: T H W T H W ...), so a
Qwen2-VL config (mrope_section [16, 24, 24], contiguous T..T H..H W..W) rotates the wrong
frequencies by the wrong position row wherever the three rows differ (image tokens)."""

import jax.numpy as jnp
import numpy as np
from maxtext.layers.embeddings import Qwen3OmniMoeThinkerTextRotaryEmbedding

D, THETA, SECTION = 128, 1_000_000.0, (16, 24, 24)
rope = Qwen3OmniMoeThinkerTextRotaryEmbedding(
    min_timescale=1, max_timescale=THETA, embedding_dims=D, fprop_dtype=jnp.float32, mrope_section=SECTION
)
inv = THETA ** (-2.0 * np.arange(D // 2) / D)
rows_chunked = np.repeat([0, 1, 2], SECTION)  # Qwen2-VL: frequency i takes row rows[i]
rows_inter = np.zeros(D // 2, int)  # Qwen3-VL interleaved
for r, off in ((1, 1), (2, 2)):
    rows_inter[off : SECTION[r] * 3 : 3] = r


def rotate_f64(x, pos3, rows):  # pos3: (3, tokens); half layout
    a = pos3[rows].T.astype(np.float64) * inv  # (tokens, D/2)
    c, s = np.cos(a), np.sin(a)
    x1, x2 = x[:, : D // 2].astype(np.float64), x[:, D // 2 :].astype(np.float64)
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)


pos3 = np.array([[5, 5, 5, 5], [5, 7, 9, 11], [5, 12, 8, 20]])  # token 0 text, 1..3 image-like
x = np.random.default_rng(0).standard_normal((4, D)).astype(np.float32)
out = np.asarray(rope(jnp.asarray(x)[None, :, None, :], jnp.asarray(pos3.T)[None]))[0, :, 0]
e2 = np.abs(out - rotate_f64(x, pos3, rows_chunked)).max(axis=-1)
e3 = np.abs(out - rotate_f64(x, pos3, rows_inter)).max(axis=-1)
print("rows (t,h,w) per token:", pos3.T.tolist())
print("max|maxtext - f64 Qwen2-VL chunked [16,24,24]| per token:", np.array2string(e2, precision=3))
print("max|maxtext - f64 Qwen3-VL interleaved|        per token:", np.array2string(e3, precision=3))
