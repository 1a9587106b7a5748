"""MaxText 0.2.5: YarnRotaryEmbedding silently clamps positions >= max_position_embeddings.

The module precomputes freqs_cis[max_position_embeddings, d/2] and looks rows up with
`.at[position].get()`; JAX clamps out-of-bounds gathers, so every position past the table rotates
as position max_position_embeddings - 1.  Settings of maxtext/configs/models/gpt-oss-20b.yml.
"""

import math

import jax.numpy as jnp
import numpy as np
from maxtext.layers.embeddings import YarnRotaryEmbedding

D, THETA, FACTOR, L0, MAXPOS = 64, 150000.0, 32.0, 4096, 131072
rope = YarnRotaryEmbedding(
    embedding_dims=D,
    mesh=None,
    max_position_embeddings=MAXPOS,
    original_max_position_embeddings=L0,
    beta_fast=32,
    beta_slow=1,
    rope_theta=THETA,
    rope_factor=FACTOR,
    fprop_dtype=jnp.float32,
    interleave=False,
    truncate=False,
    attention_scaling=True,
)


def yarn_f64(pos):  # Hugging Face's YaRN (truncate=False), float64, half layout
    i = np.arange(D // 2)
    inv = THETA ** (-2.0 * i / D)
    cd = lambda r: D * math.log(L0 / (2 * math.pi * r)) / (2 * math.log(THETA))  # noqa: E731
    lo, hi = max(cd(32), 0), min(cd(1), D - 1)
    ramp = np.clip((i - lo) / (hi - lo), 0, 1)
    inv = inv / FACTOR * ramp + inv * (1 - ramp)
    af = 0.1 * math.log(FACTOR) + 1
    a = np.asarray(pos, dtype=np.float64)[:, None] * inv
    return np.cos(a) * af, np.sin(a) * af


pos = np.array([1000, MAXPOS - 1, MAXPOS, MAXPOS + 5, 2**20])
x = np.random.default_rng(0).standard_normal((len(pos), D)).astype(np.float32)
out = np.asarray(rope(jnp.asarray(x)[None, :, None, :], jnp.asarray(pos, jnp.int32)[None]))[0, :, 0]
c, s = yarn_f64(pos)
x1, x2 = x[:, : D // 2].astype(np.float64), x[:, D // 2 :].astype(np.float64)
truth = np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)
c2, s2 = yarn_f64(np.full_like(pos, MAXPOS - 1))
clamped = np.concatenate([x1 * c2 - x2 * s2, x2 * c2 + x1 * s2], axis=-1)
print(f"YarnRotaryEmbedding, table of max_position_embeddings={MAXPOS} rows (gpt-oss-20b.yml)")
for p, o, t, cl in zip(pos, out, truth, clamped):
    print(
        f"pos {p:8d}: max|maxtext - f64 YaRN| = {np.abs(o - t).max():.3e}   "
        f"max|maxtext - f64 at pos {MAXPOS - 1}| = {np.abs(o - cl).max():.3e}"
    )
