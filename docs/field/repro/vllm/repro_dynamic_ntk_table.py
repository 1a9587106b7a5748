"""vLLM 0.33.0, Llama 2 with rope_scaling {"type": "dynamic", "factor": 2.0}: vLLM serves up to
max_model_len = 8192 but its DynamicNTKScalingRotaryEmbedding table has 4096 rows, so positions
4096..8191 raise IndexError in forward_native (an out-of-bounds table read in the GPU kernel);
inside the table the frequencies are the unscaled ones (no NTK at any length).

Known upstream: vllm-project/vllm PR #55910 (open, "Scale cos/sin cache length in NTK and Dynamic
NTK RoPE").  Run with only vLLM + torch + numpy:
    VLLM_TARGET_DEVICE=cpu python repro_dynamic_ntk_table.py
"""

import json
import os
import tempfile
from types import SimpleNamespace

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

import vllm  # noqa: E402
from vllm.config import VllmConfig, set_current_vllm_config  # noqa: E402
from vllm.config.model import _get_and_verify_max_len  # noqa: E402
from vllm.model_executor.layers.rotary_embedding import get_rope  # noqa: E402
from vllm.transformers_utils.config import get_config  # noqa: E402

CFG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "num_hidden_layers": 32,
    "max_position_embeddings": 4096,
    "rope_theta": 10000.0,
    "rope_scaling": {"type": "dynamic", "factor": 2.0},
}
print("vllm", vllm.__version__)
d = tempfile.mkdtemp()
json.dump(CFG, open(os.path.join(d, "config.json"), "w"))
hf = get_config(d, trust_remote_code=False)
arch = SimpleNamespace(derived_max_model_len_and_key=(hf.max_position_embeddings, "max_position_embeddings"))
max_model_len = _get_and_verify_max_len(hf, arch, None, None, False, None)

with set_current_vllm_config(VllmConfig()):  # llama.py LlamaAttention._init_rotary_emb
    rope = get_rope(
        128,
        max_position=hf.max_position_embeddings,
        rope_parameters=hf.rope_parameters,
        is_neox_style=True,
        dtype=torch.float32,
    )
print(
    f"{type(rope).__name__}: table rows = {rope.cos_sin_cache.shape[0]}, vLLM max_model_len = {max_model_len}"
)


# float64 transformers dynamic NTK for a sequence whose longest position is P.
def hf_inv(P, dim=128, base=1e4, L=4096, s=2.0):
    n = max(P + 1, L)
    b = base * ((s * n / L) - (s - 1)) ** (dim / (dim - 2)) if P + 1 > L else base
    return b ** (-np.arange(0, dim, 2) / dim)


half = rope.cos_sin_cache.shape[1] // 2
cos_v = rope.cos_sin_cache[:, :half].double().numpy()
p = np.arange(4096)
print(
    "in-table rows vs float64 unscaled cos: max |diff| =",
    float(np.abs(cos_v - np.cos(p[:, None] * hf_inv(4095))).max()),
)

q = torch.randn(1, 32 * 128)
k = torch.randn(1, 32 * 128)
for P in (4095, 4096, 5000, 8191):
    try:
        rope.forward_native(torch.tensor([P]), q.clone(), k.clone())
        print(f"position {P}: ok")
    except Exception as e:
        ang = P * hf_inv(P)
        print(
            f"position {P} (< max_model_len {max_model_len}): {type(e).__name__}: {e}; "
            f"transformers rotates pair 32 by {ang[32]:.6f} rad (base {1e4 * ((2 * (P + 1) / 4096) - 1) ** (128 / 126):.1f})"
        )
