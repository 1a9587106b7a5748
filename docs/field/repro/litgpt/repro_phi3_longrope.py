"""litgpt 0.5.13: the registry entry "Phi-3-mini-128k-instruct" (litgpt/config.py) has
block_size 131072 but no RoPE scaling, and litgpt has no LongRoPE code, so the 128k checkpoint runs
with plain RoPE (base 10000, attention factor 1).  Its config.json has rope_scaling
{"type": "longrope", long_factor: 48 values, short_factor: 48 values}, original_max_position_embeddings
4096: HF divides frequency i by long_factor[i] (short_factor[i] up to 4096 tokens) and multiplies
cos/sin by sqrt(1 + ln(32) / ln(4096)) = 1.1902.  The factor lists below are shaped like the
published ones (rising 1.08 -> 64.8 and 1.0 -> 2.7); the point is that litgpt's tables carry none.
Run: python repro_phi3_longrope.py  (litgpt==0.5.13, torch, numpy)."""

import math
from types import SimpleNamespace

import numpy as np
import torch
from litgpt.config import Config
from litgpt.model import GPT

cfg = Config.from_name("Phi-3-mini-128k-instruct")
print(
    "litgpt Config:",
    {
        k: getattr(cfg, k)
        for k in (
            "block_size",
            "head_size",
            "rope_base",
            "rotary_percentage",
            "rope_condense_ratio",
            "rope_adjustments",
        )
    },
)
cos, sin = GPT.rope_cache(SimpleNamespace(config=cfg, max_seq_length=cfg.block_size))
d, base, orig = cfg.rope_n_elem, 10000.0, 4096
inv = 1.0 / base ** (np.arange(0, d, 2) / d)
long_factor = np.geomspace(1.08, 64.8, d // 2)
af = math.sqrt(1 + math.log(131072 / orig) / math.log(orig))
for p in (2000, 100000):
    a = torch.atan2(sin[p].double(), cos[p].double())[: d // 2].numpy()
    amp = float(torch.hypot(cos[p].double(), sin[p].double())[0])
    plain = np.abs(np.angle(np.exp(1j * (a - p * inv)))).max()
    lr = np.abs(np.angle(np.exp(1j * (a - p * inv / long_factor)))).max()
    print(
        f"pos {p}: max |angle - plain RoPE| = {plain:.2e} rad; max |angle - LongRoPE (long factors)| = {lr:.3g} rad; "
        f"cos/sin amplitude {amp:.4f} (HF LongRoPE {af:.4f})"
    )
