# ruff: noqa: I001  (the engine setup must run before its imports)
"""flash-attn 2.8.3.post2: a decoding offset at or past the cos/sin table silently returns q unrotated.

apply_rotary_emb(x, cos, sin, seqlen_offsets=<int64 tensor>) (the KV-cache decoding path, and
RotaryEmbedding.forward(..., seqlen_offset=tensor) without a large enough max_seqlen) loads
cos/sin with mask rm_cs < seqlen_ro, other=1.0 / 0.0 (ops/triton/rotary.py: rotary_kernel): a
position past the table is rotated by angle 0, with no error.  The int-offset path asserts
`seqlen_offsets + seqlen <= seqlen_ro` instead.
"""

import numpy as np
import torch

import _load  # noqa: F401
from flash_attn.layers.rotary import RotaryEmbedding, apply_rotary_emb

d, base = 64, 10000.0
rope = RotaryEmbedding(d, base=base)
rope._update_cos_sin_cache(4096, device=torch.device("cpu"), dtype=torch.float32)  # a 4096-row table
cos, sin = rope._cos_cached, rope._sin_cached
print("table rows:", cos.shape[0])

pos = torch.tensor([100, 4095, 4096, 5000, 100000])
torch.manual_seed(0)
x = torch.randn(len(pos), 1, 2, d)  # one token per batch row
out = apply_rotary_emb(x, cos, sin, seqlen_offsets=pos)

inv = base ** (-np.arange(0, d, 2) / d)  # float64 truth, half layout
a = pos.numpy()[:, None, None, None] * inv
x1, x2 = x[..., : d // 2].double().numpy(), x[..., d // 2 :].double().numpy()
truth = np.concatenate([x1 * np.cos(a) - x2 * np.sin(a), x2 * np.cos(a) + x1 * np.sin(a)], -1)
for i, p in enumerate(pos.tolist()):
    e = np.abs(out[i].double().numpy() - truth[i]).max()
    same = torch.equal(out[i], x[i])
    print(f"position {p:6d}: max |error| vs float64 RoPE = {e:.3g}   output == input (unrotated): {same}")

try:
    apply_rotary_emb(x[:1], cos, sin, seqlen_offsets=5000)
except AssertionError as err:
    print("int offset 5000 instead: AssertionError", err)
