"""Megatron-Bridge 0.6.2's Ministral 3 provider builds Megatron-core's YarnRotaryEmbedding with
correction_range_round_to_int=False, but the Hugging Face config it converts has no "truncate" key,
so Hugging Face (transformers' _compute_yarn_parameters, truncate defaults to True) floors/ceils the
ramp bounds: the frequencies of feature pairs 20..37 differ by up to 25%.

megatron/bridge/models/ministral3/ministral3_provider.py, Ministral3ModelProvider (dataclass defaults,
never read from the config): yarn_rotary_scaling_factor=16.0, yarn_original_max_position_embeddings=16384,
yarn_beta_fast=32.0, yarn_beta_slow=1.0, yarn_correction_range_round_to_int=False, yarn_mscale=1.0,
yarn_mscale_all_dim=1.0; GPTModel.__init__ passes them to YarnRotaryEmbedding.
Ministral-3-8B text_config.rope_parameters: rope_type yarn, rope_theta 1e6, factor 16,
original_max_position_embeddings 16384, beta_fast 32, beta_slow 1, mscale 1, mscale_all_dim 1 (no truncate).
Run: $ENGINES/megatron/venv/bin/python repro_ministral3_truncate.py   (torch, numpy, megatron-core only)
"""

import math
import warnings

import numpy as np
import torch

warnings.simplefilter("ignore")
torch.cuda.current_device = lambda: "cpu"
from megatron.core.models.common.embeddings.rope_utils import apply_rotary_pos_emb  # noqa: E402
from megatron.core.models.common.embeddings.yarn_rotary_pos_embedding import YarnRotaryEmbedding  # noqa: E402
from megatron.core.transformer.transformer_config import TransformerConfig  # noqa: E402

D, BASE, FACTOR, L0 = 128, 1e6, 16.0, 16384


def hf_inv_freq(truncate=True):
    inv = BASE ** -(np.arange(0, D, 2) / D)
    cd = lambda r: D * math.log(L0 / (2 * math.pi * r)) / (2 * math.log(BASE))  # noqa: E731
    lo, hi = cd(32.0), cd(1.0)
    if truncate:
        lo, hi = math.floor(lo), math.ceil(hi)
    ramp = np.clip((np.arange(D // 2) - max(lo, 0)) / (min(hi, D - 1) - max(lo, 0)), 0, 1)
    return inv / FACTOR * ramp + inv * (1 - ramp)


rope = YarnRotaryEmbedding(
    D,
    rotary_base=BASE,
    scaling_factor=FACTOR,
    original_max_position_embeddings=L0,
    beta_fast=32.0,
    beta_slow=1.0,
    mscale=1.0,
    mscale_all_dim=1.0,
    correction_range_round_to_int=False,
)  # as Ministral3ModelProvider builds it
truth = hf_inv_freq(truncate=True)
pos = np.array([1, 1000, 16383, 65536, 262143])
emb = torch.cat([rope(1, offset=int(p))[0] for p in pos])  # [n, 1, 1, D]
ang = emb[:, 0, 0, : D // 2].double().numpy()
rel = np.abs(ang[0] - truth) / truth
print(f"inv_freq max relative difference vs HF: {rel.max():.4f} at feature pair {int(rel.argmax())}")
cfg = TransformerConfig(num_layers=1, hidden_size=4096, num_attention_heads=32, kv_channels=D)
x = torch.randn(len(pos), 1, 1, D, generator=torch.Generator().manual_seed(0))
y = apply_rotary_pos_emb(x, emb, cfg, mscale=1.0, cp_group=type("G", (), {"size": lambda s: 1})())
th = pos[:, None] * truth
cos, sin = np.cos(th), np.sin(th)
x64 = x[:, 0, 0].double().numpy()
ref = np.concatenate([x64[:, :64] * cos - x64[:, 64:] * sin, x64[:, 64:] * cos + x64[:, :64] * sin], axis=1)
for p, e, a in zip(pos, np.abs(y[:, 0, 0].double().numpy() - ref).max(axis=1), np.abs(ang - th).max(axis=1)):
    print(f"position {p:>6}: angle error {a:.3e} rad, rotated-vector error {e:.3e} (|x| ~ 1)")
