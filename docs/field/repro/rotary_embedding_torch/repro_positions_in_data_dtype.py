"""rotary-embedding-torch 0.9.1: RotaryEmbedding builds the positions in the data's dtype
(get_seq_pos: torch.arange(seq_len, dtype=t.dtype) + offset) before its float32 angles, so a
bfloat16 query at position 257 is rotated at 256, a float16 one at 2049 at 2048, and float16
positions from 65520 on are infinite: the rotated features are NaN.  float32 is exact.
Each line: the largest error against the float64 rotation (interleaved pairs, base 10000, 128
features, x exact in the dtype), one token at offset p as a decoding step rotates it.
Run: python repro_positions_in_data_dtype.py  (rotary-embedding-torch==0.9.1, torch, numpy)."""

import numpy as np
import torch
from rotary_embedding_torch import RotaryEmbedding

d = 128
emb = RotaryEmbedding(dim=d)
inv = 1.0 / 10000.0 ** (np.arange(0, d, 2) / d)  # float64
x0 = torch.from_numpy(np.random.default_rng(0).standard_normal((1, 1, d)).astype(np.float32))


def rotated(x, p):  # float64: pairs (2i, 2i+1) turned by p * inv[i]
    a, b = x[..., 0::2], x[..., 1::2]
    c, s = np.cos(p * inv), np.sin(p * inv)
    return np.stack([a * c - b * s, a * s + b * c], axis=-1).reshape(x.shape)


for dtype in (torch.float32, torch.bfloat16, torch.float16):
    x = x0.to(dtype)
    errs = []
    for p in (256, 257, 1000, 1001, 2048, 2049, 65519, 65520):
        with torch.no_grad():
            y = emb.rotate_queries_or_keys(x, offset=p).double().numpy()
        errs.append(f"{p}: {np.abs(y - rotated(x.double().numpy(), p)).max():.3g}")
    print(f"{str(dtype):15} " + ", ".join(errs))
