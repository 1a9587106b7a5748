"""torchtitan 0.3.0: a YaRN RoPE in a model built on the shared GQA Attention (Llama 3, Qwen3)
loses YaRN's attention factor.  rope.py keeps the RoPE a pure rotation ("the model folds mscale
into its softmax scale"), but only gpt_oss/model.py and deepseek_v3/model.py fold it; the shared
common/attention.py Attention uses head_dim ** -0.5 (or SDPA's default).  Hugging Face (and the
YaRN paper) multiply cos and sin by 0.1 ln(factor) + 1 (no mscale keys), i.e. the logits by its
square.  Example: Qwen3-8B with the YaRN its model card gives for 131072 tokens (factor 4,
original_max_position_embeddings 32768).
Run: python repro_yarn_attention_factor.py  (torchtitan==0.3.0, torch, numpy)."""

import dataclasses
import math

import numpy as np
import torch
from torchtitan.models import gpt_oss, qwen3
from torchtitan.models.common.rope import CosSinRoPE

factor, orig, base, d = 4.0, 32768, 1e6, 128
att = qwen3.model_registry("8B").model.layers[0].attention
rope_cfg = dataclasses.replace(
    att.rope,
    max_seq_len=131072,
    scaling="yarn",
    rope_factor=factor,
    beta_fast=32.0,
    beta_slow=1.0,
    original_seq_len=orig,
)
att = dataclasses.replace(att, rope=rope_cfg)
with torch.device("meta"):
    attn = att.build()
rope = rope_cfg.build()
print(
    "qwen3 Attention:",
    type(attn).__module__,
    "scaling =",
    attn.scaling,
    "= head_dim**-0.5:",
    attn.scaling == d**-0.5,
)

# float64 Hugging Face YaRN (modeling_rope_utils._compute_yarn_parameters)
inv = 1.0 / base ** (np.arange(0, d, 2) / d)
cd = lambda r: d * math.log(orig / (r * 2 * math.pi)) / (2 * math.log(base))
lo, hi = max(math.floor(cd(32.0)), 0), min(math.ceil(cd(1.0)), d - 1)
ramp = np.clip((np.arange(d // 2) - lo) / (hi - lo), 0, 1)
inv_hf = inv / factor * ramp + inv * (1 - ramp)
af = 0.1 * math.log(factor) + 1

torch.manual_seed(0)
q = torch.randn(1, 3, 2, d)
k = torch.randn(1, 3, 1, d)
pos = torch.tensor([[0, 1000, 100000]])
qo, ko = rope(q, k, pos)
qn, kn = q.double().numpy()[0], k.double().numpy()[0]


def hf(x, p):
    a = np.concatenate([p * inv_hf] * 2)
    rot = np.concatenate([-x[..., d // 2 :], x[..., : d // 2]], -1)
    return (x * np.cos(a) + rot * np.sin(a)) * af


P = pos[0].numpy()
logit_t = np.array([hf(qn[i, 0], P[i]) @ hf(kn[i, 0], P[i]) for i in range(3)]) * d**-0.5
logit_e = np.einsum("td,td->t", qo[0, :, 0].double().numpy(), ko[0, :, 0].double().numpy()) * attn.scaling
rot_only = np.array([(hf(qn[i, 0], P[i]) / af) @ (hf(kn[i, 0], P[i]) / af) for i in range(3)]) * d**-0.5
print("frequencies match HF's (rotation only): max |logit diff| =", float(np.abs(logit_e - rot_only).max()))
print("HF logits        :", logit_t)
print("torchtitan logits:", logit_e)
print("ratio HF / torchtitan:", logit_t / logit_e, " expected af**2 =", af**2)
goss = gpt_oss.model_registry("20b").model.layers[0].attention
with torch.device("meta"):
    g = goss.build()
print(
    "for contrast gpt_oss/model.py folds it: softmax_scale * sqrt(head_dim) =",
    g.softmax_scale * math.sqrt(goss.head_dim),
    "= (0.1 ln 32 + 1)**2 =",
    (0.1 * math.log(32) + 1) ** 2,
)
