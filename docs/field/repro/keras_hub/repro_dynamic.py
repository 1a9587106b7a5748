"""keras-hub 0.32.0: keras_hub.layers.RotaryEmbedding(rope_type="dynamic") divides every inverse
frequency by factor ** (d / (d - 2)) at every sequence length.  Hugging Face's dynamic NTK
(rope_type "dynamic") keeps the original frequencies while the sequence fits
max_position_embeddings and grows base' = base * (factor * L / L_max - (factor - 1)) ** (d / (d - 2))
with the sequence length L past it.  (No keras-hub converter reaches this layer mode:
convert_llama3 refuses a 'dynamic' Llama config.)"""

import os

os.environ.setdefault("KERAS_BACKEND", "jax")
import numpy as np
from keras import ops
from keras_hub.layers import RotaryEmbedding

D, BASE, F, LMAX = 128, 10000.0, 2.0, 4096
layer = RotaryEmbedding(max_wavelength=BASE, scaling_factor=F, rope_type="dynamic")


def hf_dynamic(x, pos, seq_len):
    L = max(seq_len, LMAX)
    base = BASE * (F * L / LMAX - (F - 1)) ** (D / (D - 2))
    inv = base ** (-np.arange(0, D, 2) / D)
    a = pos[:, None].astype(np.float64) * inv
    c, s = np.cos(a)[:, None], np.sin(a)[:, None]
    x1, x2 = x[..., : D // 2].astype(np.float64), x[..., D // 2 :].astype(np.float64)
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)


for seq_len in (100, 4096, 16384):
    pos = np.unique(np.linspace(0, seq_len - 1, 8).astype(np.int64))
    x = np.random.default_rng(0).standard_normal((len(pos), 1, D)).astype(np.float32)
    y = np.asarray(ops.convert_to_numpy(layer(x[None], positions=pos)))[0]
    e = np.abs(y - hf_dynamic(x, pos, seq_len)).max()
    print(f"sequence of {seq_len:5d} tokens: max|keras 'dynamic' - f64 HF dynamic NTK| = {e:.3e}")
