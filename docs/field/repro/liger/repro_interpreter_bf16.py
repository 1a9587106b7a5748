"""Triton 3.9's CPU interpreter (TRITON_INTERPRET=1) computes bfloat16 arithmetic on the raw bits.

Not a liger bug: liger's rope kernel computes in the cos/sin dtype (q.to(sin_row.dtype)), so in
bfloat16 it does bfloat16 multiplies, which the interpreter runs on the uint16 bit patterns it
stores bfloat16 in (Triton's debugging guide: the interpreter "does not support operations on
bfloat16 numeric types"; triton-lang/triton#4972, #10945).  float16 is exact.  This is why the
liger adapter refuses bfloat16 without CUDA.
"""

import os

os.environ["TRITON_INTERPRET"] = "1"

import numpy as np
import torch
import triton
import triton.language as tl
from liger_kernel.transformers.rope import liger_rotary_pos_emb


@triton.jit
def mul_sub(a_ptr, b_ptr, o_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    a = tl.load(a_ptr + i)
    b = tl.load(b_ptr + i)
    tl.store(o_ptr + i, a * b - b)


for dt in (torch.bfloat16, torch.float16):
    a = torch.tensor([1.5, 2.0, -3.0, 0.25], dtype=dt)
    b = torch.tensor([2.0, 0.5, 1.0, 4.0], dtype=dt)
    o = torch.empty_like(a)
    mul_sub[(1,)](a, b, o, 4)
    print(f"{dt!s:15s} a*b-b in a kernel: {o.tolist()}   expected {(a * b - b).tolist()}")

d, base = 8, 10000.0
pos = np.array([0, 5, 1000])
inv = base ** (-np.arange(0, d, 2) / d)
emb = np.concatenate([pos[:, None] * inv] * 2, -1)
for dt in (torch.float32, torch.float16, torch.bfloat16):
    torch.manual_seed(0)
    q = torch.randn(1, 3, 2, d).to(dt).transpose(1, 2)  # (batch, heads, seq, d) as HF passes it
    k = torch.randn(1, 3, 1, d).to(dt).transpose(1, 2)
    cos = torch.from_numpy(np.cos(emb)).to(dt)[None]
    sin = torch.from_numpy(np.sin(emb)).to(dt)[None]
    qo, _ = liger_rotary_pos_emb(q.clone(), k.clone(), cos, sin)
    x = q.double().numpy()
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    a = pos[:, None] * inv
    truth = np.concatenate([x1 * np.cos(a) - x2 * np.sin(a), x2 * np.cos(a) + x1 * np.sin(a)], -1)
    err = np.abs(qo.double().numpy() - truth).max()
    print(f"{dt!s:15s} liger_rotary_pos_emb vs float64 RoPE: max |err| = {err:.3g}")
