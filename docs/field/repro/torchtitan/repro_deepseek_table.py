"""torchtitan 0.3.0: the DeepSeek-V3 671B flavor's RoPE table covers 16384 positions (4096 * 4, the
default of DeepSeek's reference inference code), while the model's config.json claims 163840
(max_position_embeddings; YaRN factor 40 over an original 4096).  Positions from 16384 on raise,
so a 163840-token context cannot run without editing the flavor.  (It refuses: no wrong numbers.)
Run: python repro_deepseek_table.py  (torchtitan==0.3.0, torch, numpy)."""

import torch
from torchtitan.models import deepseek_v3

att = deepseek_v3.model_registry("671B").model.layers[0].attention
rope_cfg = att.rope
print("DeepSeek-V3 671B flavor RoPE:", type(rope_cfg).__qualname__)
print("  max_seq_len =", rope_cfg.max_seq_len, "| rope_factor =", rope_cfg.rope_factor,
      "| original_seq_len =", rope_cfg.original_seq_len)
print("  config.json max_position_embeddings = 163840 (= 40 x 4096)")
rope = rope_cfg.build()
for p in (16383, 16384, 163839):
    pos = torch.tensor([[p]])
    x = torch.ones(1, 1, 1, rope_cfg.dim)
    try:
        rope(x, x, positions=pos)  # (query, key, positions)
        print(f"  position {p}: ok")
    except RuntimeError as e:
        print(f"  position {p}: {type(e).__name__}: {e}")
