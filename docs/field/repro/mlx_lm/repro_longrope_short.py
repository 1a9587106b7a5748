"""mlx-lm 0.32.2: SuScaledRoPE (Phi-3 longrope) builds its frequencies from long_factor only;
short_factor is accepted and never read.  Hugging Face uses short_factor while the sequence is
<= original_max_position_embeddings (4096), so every prompt under 4K tokens is rotated with the
long factors.  (The PR 'Fix SuScaledRoPE', ml-explore/mlx-lm#660, is not in this release's code.)"""

import math

import mlx.core as mx
import numpy as np
from mlx_lm.models.rope_utils import SuScaledRoPE

D, BASE, L0, LMAX = 96, 10000.0, 4096, 131072
short = np.round(np.geomspace(1.0, 2.7, D // 2), 6)
long = np.round(np.geomspace(1.08, 64.8, D // 2), 6)
rope = SuScaledRoPE(
    D,
    base=BASE,
    max_position_embeddings=LMAX,
    original_max_position_embeddings=L0,
    short_factor=short.tolist(),
    long_factor=long.tolist(),
)  # as models/phi3.py


def rotate_f64(x, pos, ext):
    inv = 1.0 / (ext * BASE ** (np.arange(0, D, 2) / D))
    af = math.sqrt(1 + math.log(LMAX / L0) / math.log(L0))
    a = pos[:, None].astype(np.float64) * inv
    c, s = np.cos(a) * af, np.sin(a) * af
    x1, x2 = x[:, : D // 2].astype(np.float64), x[:, D // 2 :].astype(np.float64)
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)


pos = np.arange(0, 100, 7)  # one prompt of 100 tokens: HF uses short_factor here
x = np.random.default_rng(0).standard_normal((len(pos), D)).astype(np.float32)
full = np.zeros((1, 1, 100, D), np.float32)
full[0, 0, pos] = x
out = np.asarray(rope(mx.array(full), offset=0))[0, 0, pos]
for name, ext in (("short_factor", short), ("long_factor", long)):
    e = np.abs(out - rotate_f64(x, pos, ext)).max()
    print(f"100-token prompt: max|mlx - f64 longrope with {name}| = {e:.3e}")
