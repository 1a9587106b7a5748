"""Transformer Engine 2.20.2: RotaryPositionEmbedding(seq_len_interpolation_factor=f) without
pretrained_max_position_embeddings interpolates nothing, although its docstring says "If not None,
discrete positions will be interpolated by this factor".  With both set, the factor applies only while
max_seq_len <= pretrained * f; beyond, positions are divided by max_seq_len / pretrained ("dynamic
linear scaling"), so a position's angle depends on the table length.

transformer_engine/pytorch/attention/rope.py, RotaryPositionEmbedding.forward:
    if self.pretrained_max_position_embeddings is not None and self.seq_len_interpolation_factor is not None:
        if max_seq_len > self.pretrained_max_position_embeddings * self.seq_len_interpolation_factor:
            seq *= 1 / (max_seq_len / self.pretrained_max_position_embeddings)   # dynamic
        else:
            seq *= 1 / self.seq_len_interpolation_factor                          # fixed
Hugging Face "linear" (position interpolation): angle = (p / factor) * inv_freq at every p.
rope.py is loaded by path with its compiled extension stubbed (the extension is only used by fused=True).
Run: $ENGINES/transformer_engine/venv/bin/python repro_interpolation_factor_ignored.py
"""

import importlib.util
import sys
import types
from pathlib import Path

import numpy as np
import torch

torch.cuda.current_device = lambda: "cpu"  # inv_freq's device
sys.modules["transformer_engine_torch"] = types.ModuleType("transformer_engine_torch")
fa = types.ModuleType("transformer_engine.pytorch.cpp_extensions.fused_attn")
fa.QKVFormat = {}
sys.modules[fa.__name__] = fa
te_dir = Path(next(iter(importlib.util.find_spec("transformer_engine").submodule_search_locations)))
spec = importlib.util.spec_from_file_location("te_rope", te_dir / "pytorch/attention/rope.py")
rope = importlib.util.module_from_spec(spec)
spec.loader.exec_module(rope)

D, F, L0 = 128, 4.0, 4096  # Vicuna-7B-v1.5-16k: head_dim 128, linear factor 4, max_position_embeddings 4096
inv = 10000.0 ** -(np.arange(0, D, 2) / D)


def worst(emb, pos):
    ang = emb[:, 0, 0, : D // 2].double().numpy()
    return np.abs(ang - (pos[:, None] / F) * inv[None, :]).max()


p = np.array([100, 4095, 16383])
a = rope.RotaryPositionEmbedding(D, seq_len_interpolation_factor=F)
print(
    "factor only:            max angle error vs HF linear at",
    p.tolist(),
    "=",
    f"{worst(torch.cat([a(1, offset=int(x)) for x in p]), p):.3e} rad",
)
print(
    "                        angles equal to no scaling at all:",
    torch.equal(a(16384), rope.RotaryPositionEmbedding(D)(16384)),
)
b = rope.RotaryPositionEmbedding(D, seq_len_interpolation_factor=F, pretrained_max_position_embeddings=L0)
for n in (16384, 65536):
    pp = np.arange(n)
    print(f"factor + pretrained {L0}, table of {n:>5} rows: max angle error {worst(b(n), pp):.3e} rad")
