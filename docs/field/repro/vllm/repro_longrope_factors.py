"""vLLM 0.33.0, Phi-3 mini 128k (LongRoPE): the factor set is chosen once per load from
max_model_len, not per sequence as in transformers.

* default load: max_model_len = original_max_position_embeddings = 4096 (config/model.py), so
  short factors always; Phi3LongRoPEScaledRotaryEmbedding does no bounds check, and a position
  p >= 4096 silently reads the long-factor row of p - 4096 (unreachable while the scheduler caps
  positions at max_model_len);
* --max-model-len 131072: long factors for every position, also in prompts shorter than 4096,
  where transformers uses the short factors.
Documented in vllm/model_executor/layers/rotary_embedding/phi3_long_rope_scaled_rope.py ("Force
long factors if max_model_len ... exceeds original_max_position_embeddings to prevent KV cache
invalidation") and config/model.py ("For LongRoPE, default to original_max_position_embeddings").
Run with only vLLM + torch + numpy:  VLLM_TARGET_DEVICE=cpu python repro_longrope_factors.py
"""

import math
import os
from types import SimpleNamespace

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

import numpy as np  # noqa: E402
import torch  # noqa: E402

import vllm  # noqa: E402
from vllm.config import VllmConfig, set_current_vllm_config  # noqa: E402
from vllm.model_executor.layers import rotary_embedding as re_mod  # noqa: E402

DIM, BASE, L0, LMAX = 96, 1e4, 4096, 131072
SHORT = np.round(np.geomspace(1.0, 2.7, 48), 6).tolist()
LONG = np.round(np.geomspace(1.08, 64.8, 48), 6).tolist()
RP = {
    "rope_type": "longrope",
    "rope_theta": BASE,
    "short_factor": SHORT,
    "long_factor": LONG,
    "original_max_position_embeddings": L0,
}
AF = math.sqrt(1 + math.log(LMAX / L0) / math.log(L0))
print("vllm", vllm.__version__)


def ref(x, pos, factors):  # float64 transformers LongRoPE, half layout
    inv = 1.0 / (np.asarray(factors) * BASE ** (np.arange(0, DIM, 2) / DIM))
    a = pos[:, None, None] * inv
    c, s = np.cos(a) * AF, np.sin(a) * AF
    x1, x2 = x[..., : DIM // 2], x[..., DIM // 2 :]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], -1)


rng = np.random.default_rng(0)
for mml in (4096, 131072):
    vc = VllmConfig()
    vc.model_config = SimpleNamespace(max_model_len=mml)
    re_mod._ROPE_DICT.clear()
    with set_current_vllm_config(vc):  # llama.py LlamaAttention._init_rotary_emb (Phi3ForCausalLM)
        rope = re_mod.get_rope(
            DIM, max_position=LMAX, rope_parameters=RP, is_neox_style=True, dtype=torch.float32
        )
    print(f"max_model_len={mml}: use_long_rope={rope.use_long_rope}")
    for prompt in (np.array([0, 5, 1000, 4095]), np.array([5, 4101])):
        x = rng.standard_normal((prompt.size, 32, DIM)).astype(np.float32)
        try:
            qv, _ = rope(
                torch.from_numpy(prompt),
                torch.from_numpy(x.reshape(prompt.size, -1)),
                torch.from_numpy(x.reshape(prompt.size, -1)),
            )
        except Exception as e:
            print(f"  positions {prompt.tolist()}: {type(e).__name__}: {e}")
            continue
        qv = qv.double().numpy().reshape(x.shape)
        hf_factors = LONG if prompt.max() + 1 > L0 else SHORT  # transformers: by the sequence length
        for j, p in enumerate(prompt.tolist()):
            e_hf = np.abs(qv[j] - ref(x[j : j + 1].astype(np.float64), np.array([p]), hf_factors)[0]).max()
            e_p4 = np.abs(qv[j] - ref(x[j : j + 1].astype(np.float64), np.array([p - L0]), LONG)[0]).max()
            print(
                f"  prompt {prompt.tolist()}, pos {p}: |vLLM - transformers({'long' if hf_factors is LONG else 'short'})|"
                f" = {e_hf:.3g}"
                + (f"; |vLLM - long factors at pos {p - L0}| = {e_p4:.3g}" if p >= L0 else "")
            )
