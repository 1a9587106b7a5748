"""vLLM 0.33.0, Ministral 3 from its Hugging Face config.json: the Llama 4 query scale
(rope_parameters["llama_4_scaling_beta"]) is never applied; YaRN's mscale/mscale_all_dim is.

Re-check of vllm-project/vllm#48621 (reported on 0.25.0):
  part 1 (YaRN ignores mscale/mscale_all_dim -> cache multiplier 1.2773 instead of 1.0): FIXED;
  part 2 (MistralAttention reads only a top-level `llama_4_scaling` mapping): STILL PRESENT.

Builds vLLM's own MistralDecoderLayer (registry: Ministral3ForCausalLM -> mistral.py) from a
config.json read by vLLM's get_config, on CPU.  Run with only vLLM + torch + numpy:
    VLLM_TARGET_DEVICE=cpu python repro_ministral3_llama4.py
"""

import json
import math
import os
import tempfile
from types import SimpleNamespace

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

import vllm  # noqa: E402
from vllm.config import VllmConfig, set_current_vllm_config  # noqa: E402
from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment  # noqa: E402
from vllm.transformers_utils.config import get_config  # noqa: E402

# The RoPE part of mistralai/Ministral-3-8B-Instruct-2512's text config (HF format).
ROPE = {
    "rope_type": "yarn",
    "rope_theta": 1e6,
    "factor": 16.0,
    "original_max_position_embeddings": 16384,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
    "llama_4_scaling_beta": 0.1,
}
CFG = {
    "architectures": ["Ministral3ForCausalLM"],
    "model_type": "ministral3",
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "num_hidden_layers": 1,
    "intermediate_size": 64,
    "max_position_embeddings": 262144,
    "rope_parameters": ROPE,
}

print("vllm", vllm.__version__)
d = tempfile.mkdtemp()
json.dump(CFG, open(os.path.join(d, "config.json"), "w"))
hf = get_config(d, trust_remote_code=False)
vc = VllmConfig()
vc.model_config = SimpleNamespace(
    dtype=torch.float32,
    max_model_len=262144,
    hf_config=hf,
    hf_text_config=hf,
    is_moe=False,
    is_mm_prefix_lm=None,
    rswa_window=None,
)
with set_current_vllm_config(vc):
    init_distributed_environment(
        world_size=1, rank=0, local_rank=0, backend="gloo", distributed_init_method="tcp://127.0.0.1:29541"
    )
    ensure_model_parallel_initialized(1, 1)
    from vllm.model_executor.models.mistral import MistralDecoderLayer

    attn = MistralDecoderLayer(vc, prefix="model.layers.0", config=hf).self_attn


# --- float64 formulas (transformers' Ministral3 / YaRN), written out ---
def g(s, m=1.0):
    return 1.0 if s <= 1 else 0.1 * m * math.log(s) + 1.0


af_hf = g(16.0, ROPE["mscale"]) / g(16.0, ROPE["mscale_all_dim"])
print(
    f"YaRN attention factor: vLLM rotary_emb.mscale = {attn.rotary_emb.mscale!r}, formula = {af_hf!r}"
    f"  (0.25.0 gave {g(16.0)!r})"
)

# Rotation at a few positions against float64 YaRN.
dim, base, L0, s = 128, 1e6, 16384, 16.0
i = np.arange(dim // 2)
inv = base ** (-2 * i / dim)
cd = lambda r: dim * math.log(L0 / (2 * math.pi * r)) / (2 * math.log(base))  # noqa: E731
lo, hi = max(math.floor(cd(32.0)), 0), min(math.ceil(cd(1.0)), dim - 1)
ramp = np.clip((i - lo) / (hi - lo), 0, 1)
inv_y = inv / s * ramp + inv * (1 - ramp)
pos = np.array([0, 16383, 16384, 65536, 262143])
rng = np.random.default_rng(0)
q = rng.standard_normal((pos.size, 32 * dim)).astype(np.float32)
k = rng.standard_normal((pos.size, 8 * dim)).astype(np.float32)
qv, _ = attn.rotary_emb.forward_native(torch.from_numpy(pos), torch.from_numpy(q), torch.from_numpy(k))
ang = pos[:, None] * inv_y[None, :]
c, sn = np.cos(ang)[:, None, :] * af_hf, np.sin(ang)[:, None, :] * af_hf
x = q.astype(np.float64).reshape(pos.size, 32, dim)
x1, x2 = x[..., : dim // 2], x[..., dim // 2 :]
q_ref = np.concatenate([x1 * c - x2 * sn, x2 * c + x1 * sn], -1)
err = np.abs(qv.double().numpy().reshape(pos.size, 32, dim) - q_ref).max(axis=(1, 2))
print("RoPE max |vLLM - float64| per position:", dict(zip(pos.tolist(), np.round(err, 6).tolist())))

# Llama 4 query scale: transformers multiplies q by 1 + beta * log(1 + floor(pos / L0)).
print(
    "config.rope_parameters['llama_4_scaling_beta'] =",
    hf.rope_parameters.get("llama_4_scaling_beta"),
    "| getattr(config, 'llama_4_scaling', None) =",
    getattr(hf, "llama_4_scaling", None),
)
print("MistralAttention.do_llama_4_scaling =", attn.do_llama_4_scaling, "-> vLLM's query factor is 1.0")
scale = 1 + ROPE["llama_4_scaling_beta"] * np.log1p(np.floor(pos / L0))
for p, sc in zip(pos.tolist(), scale.tolist()):
    print(
        f"  pos {p:7d}: transformers scales q by {sc:.6f}, vLLM by 1.0 -> q (and logits) off by "
        f"{100 * (sc - 1):.2f}%"
    )
