"""Megatron-Bridge 0.6.2 converts a Llama checkpoint with rope_scaling {"type": "dynamic", "factor": 2.0}
into Megatron-core's plain RotaryEmbedding, without a word: dynamic NTK scaling is dropped.

megatron/bridge/models/llama/llama_bridge.py, LlamaBridge.provider_bridge: only rope_type "llama3"
(rope_scaling=True, rope_scaling_factor) and "linear" (seq_len_interpolation_factor) are mapped; the
generic mapping (conversion/model_bridge.py) handles only "yarn".  Megatron-core 0.19.2's RotaryEmbedding
(models/common/embeddings/rotary_pos_embedding.py) has no dynamic NTK option.  Hugging Face
(_compute_dynamic_ntk_parameters) raises the base once the sequence exceeds max_position_embeddings:
base' = base * (factor * L / L0 - (factor - 1)) ** (d / (d - 2)).
Run: $ENGINES/megatron/venv/bin/python repro_llama_dynamic_dropped.py   (torch, numpy, megatron-core only)
"""

import warnings

import numpy as np
import torch

warnings.simplefilter("ignore")
torch.cuda.current_device = lambda: "cpu"
from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding  # noqa: E402

D, BASE, FACTOR, L0 = 128, 10000.0, 2.0, 4096  # Llama 2 7B with dynamic NTK factor 2
rope = RotaryEmbedding(kv_channels=D, rotary_percent=1.0, rotary_base=BASE)  # what the Bridge builds
for L in (4096, 8192, 32768):  # sequence length
    emb = rope(L)[:, 0, 0, : D // 2].double().numpy()  # angles of positions 0..L-1
    base = BASE * (FACTOR * max(L, L0) / L0 - (FACTOR - 1)) ** (D / (D - 2)) if L > L0 else BASE
    truth = np.arange(L)[:, None] * base ** -(np.arange(0, D, 2) / D)[None, :]
    err = np.abs(emb - truth)
    print(
        f"sequence of {L:>5} tokens: HF base {base:10.1f}; max angle error {err.max():.3e} rad "
        f"(at position {int(err.max(axis=1).argmax())})"
    )
