"""MaxText 0.2.5: LLaMARotaryEmbedding (chosen for any model_name 'llama3.1*' or rope_type
'llama3.1') hard-codes the Llama 3.1 scaling (factor 8, low 1, high 4, L0 8192) in
_apply_scaling_factor; no config key reaches it.  A Llama 3.2 1B/3B config (factor 32) gets 8."""

import math

import jax.numpy as jnp
import numpy as np
from maxtext.layers.embeddings import LLaMARotaryEmbedding

D, THETA = 128, 500000.0
rope = LLaMARotaryEmbedding(
    min_timescale=1, max_timescale=THETA, mesh=None, embedding_dims=D, fprop_dtype=jnp.float32, use_scale=True
)


def llama3_inv(factor, low=1.0, high=4.0, L0=8192):  # HF's llama3 rope, float64
    inv = THETA ** (-2.0 * np.arange(D // 2) / D)
    wl = 2 * math.pi / inv
    sm = (L0 / wl - low) / (high - low)
    out = np.where(wl > L0 / low, inv / factor, (1 - sm) * inv / factor + sm * inv)
    return np.where(wl < L0 / high, inv, out)


def rotate_interleaved(x, pos, inv):
    a = pos[:, None].astype(np.float64) * inv
    c, s = np.cos(a), np.sin(a)
    xe, xo = x[:, 0::2].astype(np.float64), x[:, 1::2].astype(np.float64)
    return np.stack([xe * c - xo * s, xo * c + xe * s], axis=-1).reshape(x.shape)


pos = np.array([10, 1000, 8192, 65536, 131071])
x = np.random.default_rng(0).standard_normal((len(pos), D)).astype(np.float32)
out = np.asarray(rope(jnp.asarray(x)[None, :, None, :], jnp.asarray(pos, jnp.int32)[None]))[0, :, 0]
for f in (8.0, 32.0):
    e = np.abs(out - rotate_interleaved(x, pos, llama3_inv(f))).max(axis=-1)
    print(f"max|maxtext - f64 llama3(factor={f:g})| at {pos.tolist()}: {np.array2string(e, precision=3)}")
