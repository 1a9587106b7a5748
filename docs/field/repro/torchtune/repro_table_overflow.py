"""torchtune 0.6.1: the RoPE modules' docstrings say "max_seq_len: ... if exceeded the cached freqs
will be recomputed", but forward() indexes a fixed cache (self.cache[input_pos]) and never
recomputes: a position >= max_seq_len raises IndexError on CPU (on CUDA an index out of bounds
is a device-side assert).  Positions below it agree with float64 RoPE (checked here at 4095).
Run: python repro_table_overflow.py  (needs torchtune==0.6.1, torch, numpy)."""

import numpy as np
import torch
from torchtune.models.llama3_1._position_embeddings import Llama3ScaledRoPE
from torchtune.models.qwen2._positional_embeddings import Qwen2RotaryPositionalEmbeddings
from torchtune.modules import RotaryPositionalEmbeddings

d, base, max_seq_len = 128, 10000.0, 4096  # llama2_7b(): head_dim 128, max_seq_len 4096, base 10000
torch.manual_seed(0)
x = torch.randn(1, 1, 1, d, dtype=torch.float64).float()
print(
    "docstring:", [ln.strip() for ln in RotaryPositionalEmbeddings.__doc__.splitlines() if "recomputed" in ln]
)

rope = RotaryPositionalEmbeddings(dim=d, max_seq_len=max_seq_len, base=base)
p = max_seq_len - 1
out = rope(x, input_pos=torch.tensor([[p]]))[0, 0, 0].double().numpy()
inv = 1.0 / base ** (np.arange(0, d, 2) / d)  # float64 truth, interleaved pairs (2i, 2i+1)
a = p * inv
x0, x1 = x[0, 0, 0, 0::2].double().numpy(), x[0, 0, 0, 1::2].double().numpy()
ref = np.stack([x0 * np.cos(a) - x1 * np.sin(a), x1 * np.cos(a) + x0 * np.sin(a)], -1).reshape(-1)
print(f"pos {p}: max |torchtune - float64| = {np.abs(out - ref).max():.2e}")

for name, mod in [
    ("RotaryPositionalEmbeddings", rope),
    ("Llama3ScaledRoPE", Llama3ScaledRoPE(dim=d, max_seq_len=max_seq_len, base=500000)),
    ("Qwen2RotaryPositionalEmbeddings", Qwen2RotaryPositionalEmbeddings(dim=d, max_seq_len=max_seq_len)),
]:
    for p in (max_seq_len, 2**20):
        try:
            mod(x, input_pos=torch.tensor([[p]]))
            print(f"{name} pos {p}: no error")
        except Exception as e:
            print(f"{name} pos {p}: {type(e).__name__}: {e}  (cache rows: {mod.cache.shape[0]})")
