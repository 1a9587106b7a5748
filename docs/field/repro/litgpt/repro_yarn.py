"""litgpt 0.5.13 YaRN (model.py: GPT.rope_cache -> build_rope_cache, CausalSelfAttention) vs
Hugging Face's YaRN (modeling_rope_utils._compute_yarn_parameters), four discrepancies:
 (a) the ramp is inverted: litgpt blends theta_interp*(1-ramp) + theta_extrap*ramp, so the
     high-frequency dims (i < low, ramp 0) are divided by the factor and the low-frequency dims
     (i > high) keep their frequency; HF/YaRN do the opposite (inv/s*ramp + inv*(1-ramp) with
     HF's ramp = 1 - extrapolation factor).  tests/test_yarn.py only prints the cos/sin difference
     and feeds litgpt's own tables to both models, so it does not catch this.
 (b) without mscale keys (Qwen2.5 128K, gpt-oss) litgpt's attention factor is 1.0; HF's is
     0.1 ln(factor) + 1.
 (c) rope_adjustments["truncate"] (gpt-oss: false) is dropped by GPT.rope_cache (it forwards only
     factor/beta_fast/beta_slow/original_max_seq_len/mscale/mscale_all_dim) although
     build_rope_cache reads extra_config.get("truncate", True).
 (d) CausalSelfAttention (not only DeepSeek's MLA) multiplies the softmax scale by
     yarn_get_mscale(factor, mscale_all_dim)**2 whenever mscale_all_dim is set; HF does that only in
     DeepSeek-V2/V3 attention (a Ministral-3-style rope_parameters, mscale = mscale_all_dim = 1,
     factor 16, gets logits x1.63 in litgpt, x1 in HF).
Run: python repro_yarn.py  (litgpt==0.5.13, torch, numpy)."""

import math
from types import SimpleNamespace

import numpy as np
import torch
from litgpt.config import Config
from litgpt.model import GPT, CausalSelfAttention


def hf_yarn(
    d,
    base,
    factor,
    orig,
    beta_fast=32.0,
    beta_slow=1.0,
    truncate=True,
    mscale=None,
    mscale_all_dim=None,
    flip=False,
):
    inv = 1.0 / base ** (np.arange(0, d, 2) / d)
    cd = lambda r: d * math.log(orig / (r * 2 * math.pi)) / (2 * math.log(base))
    lo, hi = cd(beta_fast), cd(beta_slow)
    if truncate:
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, d - 1)
    hi = hi + 0.001 if lo == hi else hi
    ramp = np.clip((np.arange(d // 2) - lo) / (hi - lo), 0, 1)
    g = lambda s, m=1.0: 1.0 if s <= 1 else 0.1 * m * math.log(s) + 1
    af = g(factor, mscale) / g(factor, mscale_all_dim) if (mscale and mscale_all_dim) else g(factor)
    if flip:  # the same formula with the ramp reversed (litgpt's blend)
        ramp = 1 - ramp
    return inv / factor * ramp + inv * (1 - ramp), af


def litgpt_tables(cfg):
    cos, sin = GPT.rope_cache(SimpleNamespace(config=cfg, max_seq_length=cfg.block_size))
    inv = torch.atan2(sin[1].double(), cos[1].double())[: cfg.rope_n_elem // 2].numpy()  # pos 1
    return inv, float(torch.hypot(cos[0].double(), sin[0].double())[0]), cos, sin


cases = {
    "Qwen2.5-7B-Instruct + model-card YaRN (factor 4, orig 32768)": (
        Config.from_name(
            "Qwen2.5-7B-Instruct",
            rope_adjustments=dict(factor=4.0, beta_fast=32.0, beta_slow=1.0, original_max_seq_len=32768),
        ),
        dict(d=128, base=1e6, factor=4.0, orig=32768),
    ),
    "gpt-oss-20b rope_scaling (factor 32, orig 4096, truncate false)": (
        Config(
            name="gpt-oss-like",
            block_size=131072,
            n_embd=2880,
            n_head=64,
            n_query_groups=8,
            head_size=64,
            rotary_percentage=1.0,
            rope_base=150000,
            rope_adjustments=dict(
                factor=32.0, beta_fast=32.0, beta_slow=1.0, original_max_seq_len=4096, truncate=False
            ),
        ),
        dict(d=64, base=150000, factor=32.0, orig=4096, truncate=False),
    ),
}
for name, (cfg, hf) in cases.items():
    inv, amp, cos, sin = litgpt_tables(cfg)
    inv_hf, af = hf_yarn(**hf)
    p = 1000
    ang = torch.atan2(sin[p].double(), cos[p].double())[: cfg.rope_n_elem // 2].numpy()
    err = np.abs(np.angle(np.exp(1j * (ang - p * inv_hf)))).max()
    print(
        f"{name}\n  inv_freq[0], [-1]: litgpt {inv[0]:.6g}, {inv[-1]:.6g}   HF {inv_hf[0]:.6g}, {inv_hf[-1]:.6g}"
        f"\n  max angle error at position {p}: {err:.3g} rad\n  attention factor (cos/sin amplitude): litgpt {amp:.6f}, HF {af:.6f}"
    )
    flipped, _ = hf_yarn(**{**hf, "truncate": True}, flip=True)
    print(
        f"  litgpt == HF formula with the ramp reversed (and truncate=True): max rel diff {np.abs(inv / flipped - 1).max():.2e}"
    )
    if not hf.get("truncate", True):
        # what litgpt gives when truncate=False does reach build_rope_cache
        from litgpt.model import build_rope_cache

        c2, s2 = build_rope_cache(2, 64, base=150000, extra_config=dict(cfg.rope_adjustments))
        inv2 = torch.atan2(s2[1].double(), c2[1].double())[:32].numpy()
        print(
            f"  truncate=False dropped by GPT.rope_cache: max |inv(rope_cache) - inv(build_rope_cache with truncate)| "
            f"= {np.abs(inv - inv2).max():.3g}"
        )

# (d) softmax multiplier for a non-MLA model with mscale == mscale_all_dim (Ministral-3-like)
cfg = Config(
    name="ministral3-like",
    block_size=262144,
    n_embd=4096,
    n_head=32,
    n_query_groups=8,
    head_size=128,
    rotary_percentage=1.0,
    rope_base=1e6,
    rope_adjustments=dict(
        factor=16.0, beta_fast=32.0, beta_slow=1.0, original_max_seq_len=16384, mscale=1.0, mscale_all_dim=1.0
    ),
)
with torch.device("meta"):
    attn = CausalSelfAttention(cfg, 0)
_, amp, _, _ = litgpt_tables(cfg)
print(
    f"Ministral-3-like YaRN (factor 16, mscale = mscale_all_dim = 1): cos/sin amplitude {amp:.4f} (HF 1.0); "
    f"CausalSelfAttention softmax multiplier mscale**2 = {attn.mscale**2:.4f} (HF: 1.0; HF applies it only in DeepSeek-style MLA attentions)"
)
