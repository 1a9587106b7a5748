"""Megatron-core 0.19.2 + Megatron-Bridge 0.6.2: a YaRN rope_scaling without beta_fast / beta_slow /
truncate (Qwen2.5-7B-Instruct's model-card config: {"factor": 4.0, "original_max_position_embeddings":
32768, "type": "yarn"}) cannot be built, and an absent "truncate" turns truncation off.

Hugging Face defaults: beta_fast=32, beta_slow=1, truncate=True.  Megatron-Bridge's generic mapping
(megatron/bridge/models/conversion/model_bridge.py, MegatronModelBridge.hf_config_to_provider_kwargs)
copies only the keys present (`if value is not None`), so GPTModelProvider keeps its field defaults
yarn_beta_fast = yarn_beta_slow = yarn_correction_range_round_to_int = None (gpt_provider.py), and
GPTModel.__init__ (megatron/core/models/gpt/gpt_model.py) passes them to YarnRotaryEmbedding:
  1. beta_fast=None -> TypeError inside YarnRotaryEmbedding.__init__ (_yarn_find_correction_dim);
  2. with the betas given, correction_range_round_to_int=None is falsy -> fractional ramp bounds,
     while HF floors/ceils them (truncate defaults to True).
Run: $ENGINES/megatron/venv/bin/python repro_yarn_absent_keys.py   (torch, numpy, megatron-core only)
"""

import math
import warnings

import numpy as np
import torch

warnings.simplefilter("ignore")
torch.cuda.current_device = lambda: "cpu"  # CPU machine: Megatron asks for the CUDA device
from megatron.core.models.common.embeddings.yarn_rotary_pos_embedding import YarnRotaryEmbedding  # noqa: E402

D, BASE, FACTOR, L0 = 128, 1e6, 4.0, 32768  # Qwen2.5-7B: head_dim 128, rope_theta 1e6


def hf_yarn_inv_freq(beta_fast=32.0, beta_slow=1.0, truncate=True):
    """transformers' _compute_yarn_parameters, in float64."""
    inv = BASE ** -(np.arange(0, D, 2) / D)
    cd = lambda r: D * math.log(L0 / (2 * math.pi * r)) / (2 * math.log(BASE))  # noqa: E731
    lo, hi = cd(beta_fast), cd(beta_slow)
    if truncate:
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, D - 1)
    hi = hi + 0.001 if lo == hi else hi
    ramp = np.clip((np.arange(D // 2) - lo) / (hi - lo), 0, 1)
    return inv / FACTOR * ramp + inv * (1 - ramp), (lo, hi)


kw = dict(
    rotary_percent=1.0,
    rotary_base=BASE,
    scaling_factor=FACTOR,
    original_max_position_embeddings=L0,
    mscale=None,
    mscale_all_dim=None,
)
print("1) as the Bridge maps Qwen2.5's rope_scaling (beta_fast=beta_slow=round_to_int=None):")
try:
    YarnRotaryEmbedding(D, beta_fast=None, beta_slow=None, correction_range_round_to_int=None, **kw)
    print("   built")
except Exception as e:
    print(f"   {type(e).__name__}: {e}")

print("2) betas given, 'truncate' absent -> correction_range_round_to_int=None:")
truth, (lo, hi) = hf_yarn_inv_freq()
m = YarnRotaryEmbedding(D, beta_fast=32.0, beta_slow=1.0, correction_range_round_to_int=None, **kw)
pos = 131071  # inside the 128K context the config is for
emb, _ = m(1, offset=pos)
got = emb[0, 0, 0, : D // 2].double().numpy() / pos
frac = hf_yarn_inv_freq(truncate=False)[1]
print(f"   HF ramp bounds (truncate=True) {lo, hi}; Megatron's {tuple(round(x, 3) for x in frac)}")
rel = np.abs(got - truth) / truth
print(f"   inv_freq max relative difference: {rel.max():.4f} (feature pair {int(rel.argmax())})")
err = np.abs(emb[0, 0, 0, : D // 2].double().numpy() - pos * truth).max()
print(f"   angle error at position {pos}: {err:.4f} rad (float32 recipe allowance ~{2 * 2**-23 * pos:.4f})")
m2 = YarnRotaryEmbedding(D, beta_fast=32.0, beta_slow=1.0, correction_range_round_to_int=True, **kw)
e2, _ = m2(1, offset=pos)
print(
    f"   with round_to_int=True: {np.abs(e2[0, 0, 0, : D // 2].double().numpy() - pos * truth).max():.2e} rad"
)
