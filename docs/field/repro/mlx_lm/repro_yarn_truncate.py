"""mlx-lm 0.32.2: YarnRoPE has no `truncate` argument; it always floors/ceils the YaRN correction
range, so gpt-oss (rope_scaling.truncate = false) gets the truncated ramp.  The frequencies in the
ramp band differ from Hugging Face's (and OpenAI's) at every position > 0."""

import math

import mlx.core as mx
import numpy as np
from mlx_lm.models.rope_utils import initialize_rope

D, THETA = 64, 150000.0
RS = {
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "factor": 32.0,
    "original_max_position_embeddings": 4096,
    "rope_type": "yarn",
    "truncate": False,
}  # gpt-oss-20b config.json
rope = initialize_rope(D, THETA, False, RS)  # as mlx_lm/models/gpt_oss.py AttentionBlock does


def yarn_f64(pos, truncate):  # Hugging Face's YaRN, float64, half layout
    i = np.arange(D // 2)
    inv = THETA ** (-2.0 * i / D)
    cd = lambda r: D * math.log(4096 / (2 * math.pi * r)) / (2 * math.log(THETA))  # noqa: E731
    lo, hi = cd(32.0), cd(1.0)
    if truncate:
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, D - 1)
    ramp = np.clip((i - lo) / (hi - lo), 0, 1)
    inv = inv / 32.0 * ramp + inv * (1 - ramp)
    a = np.asarray(pos, np.float64)[:, None] * inv
    return np.cos(a), np.sin(a), 0.1 * math.log(32.0) + 1


pos = np.array([1, 100, 1000, 4096, 32768, 131071])
x = np.random.default_rng(0).standard_normal((len(pos), 1, 1, D)).astype(np.float32)
out = np.asarray(rope(mx.array(x), offset=mx.array(pos.astype(np.int32))))[:, 0, 0]
x1, x2 = x[:, 0, 0, : D // 2].astype(np.float64), x[:, 0, 0, D // 2 :].astype(np.float64)
for trunc in (False, True):
    c, s, af = yarn_f64(pos, trunc)
    ref = af * np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)
    e = np.abs(out - ref).max(axis=-1)
    print(f"max|mlx - f64 YaRN(truncate={trunc})| at {pos.tolist()}: {np.array2string(e, precision=3)}")
