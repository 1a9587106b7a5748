"""liger-kernel 0.8.5 + transformers 5.24: the Qwen2-VL M-RoPE kernel cannot be reached.

1. apply_liger_kernel_to_qwen2_vl(...) raises ImportError before patching anything: it imports
   liger_kernel/transformers/model/qwen2_vl.py, which needs LigerQwen2VLCausalLMOutputWithPast,
   defined only if transformers still has Qwen2VLCausalLMOutputWithPast (it does not).
2. Its rope patch sets modeling_qwen2_vl.apply_multimodal_rotary_pos_emb, a name transformers
   5.24 no longer defines or calls (huggingface/transformers#48105 moved the section recomposition
   into Qwen2VLRotaryEmbedding; the attention calls the plain apply_rotary_pos_emb).  Doing that
   assignment by hand and running a tiny Qwen2-VL text model calls the kernel 0 times.
3. The kernel itself is right when fed the 3-row cos/sin it was written for (float64 check).
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # CPU: before liger's kernels are defined

import numpy as np
import torch
import transformers
from liger_kernel.transformers import monkey_patch
from liger_kernel.transformers.qwen2vl_mrope import liger_multimodal_rotary_pos_emb
from transformers.models.qwen2_vl import modeling_qwen2_vl as m

print("transformers", transformers.__version__)
try:
    monkey_patch.apply_liger_kernel_to_qwen2_vl(
        rope=True, fused_linear_cross_entropy=False, rms_norm=False, layer_norm=False, swiglu=False
    )
    print("1. apply_liger_kernel_to_qwen2_vl: ok")
except ImportError as e:
    print("1. apply_liger_kernel_to_qwen2_vl raised ImportError:", e)

print(
    "2. modeling_qwen2_vl defines apply_multimodal_rotary_pos_emb:",
    hasattr(m, "apply_multimodal_rotary_pos_emb"),
)
calls = []


def counted(*a, **k):
    calls.append(1)
    return liger_multimodal_rotary_pos_emb(*a, **k)


m.apply_multimodal_rotary_pos_emb = counted  # what the patch would do
cfg = m.Qwen2VLTextConfig(
    hidden_size=64,
    intermediate_size=64,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
    vocab_size=32,
    max_position_embeddings=4096,
    rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [4, 6, 6]},
)
model = m.Qwen2VLTextModel(cfg).eval()
pos = torch.tensor([[0, 1, 2, 3], [0, 0, 1, 1], [0, 1, 0, 1]])[:, None, :]  # (3, batch, seq)
with torch.no_grad():
    model(input_ids=torch.tensor([[1, 2, 3, 4]]), position_ids=pos)
print(f"   forward of a 1-layer Qwen2-VL text model: liger M-RoPE kernel called {len(calls)} times")

# 3. the kernel on the 3-row cos/sin (as transformers < #48105 passed them), vs float64 M-RoPE
d, sections, base = 32, [4, 6, 6], 1e6
p = np.array([[5, 4096, 70000, 2**20 + 3], [5, 100, 65000, 2**20], [5, 7, 69999, 3]])  # (3, tokens)
inv = base ** (-np.arange(0, d, 2) / d)
row = np.repeat(np.arange(3), sections)  # which position row each frequency takes
ang = p[row, :].T * inv  # (tokens, d/2), float64
f32 = torch.from_numpy(p)[:, None, :, None].float() * torch.from_numpy(inv).float()  # HF: float32 angles
emb = torch.cat((f32, f32), -1)
torch.manual_seed(0)
q = torch.randn(1, 2, 4, d)
k = torch.randn(1, 1, 4, d)
qo, _ = liger_multimodal_rotary_pos_emb(q.clone(), k.clone(), emb.cos(), emb.sin(), sections)
x1, x2 = q[..., : d // 2].double().numpy(), q[..., d // 2 :].double().numpy()
c, s = np.cos(ang)[None, None], np.sin(ang)[None, None]
truth = np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], -1)
err = np.abs(qo.double().numpy() - truth).max(axis=(0, 1, 3))
print(
    "3. kernel vs float64 M-RoPE, max |err| per token (float32 angles allow ~2**-22 * pos):",
    [f"{e:.2e}" for e in err],
    "allowance",
    ["%.2e" % (2 * 2**-23 * x) for x in p.max(0)],
)
