"""Megatron-Bridge 0.6.2's Ministral 3 attention scales queries by the Llama 4 factor
1 + beta * log(1 + floor(p / 16384)) of the token's *index in the local query tensor*, not of its
position: torch.arange(query.shape[0]).  In decoding (one query token), under context parallelism
(each rank's shard), and for the second and later sequences of a packed (thd) batch, the index is not
the position, and tokens past 16384 get the factor of a small position (1.0 in decoding).

Quoted verbatim from megatron/bridge/models/ministral3/ministral3_provider.py
(MinistralTEDotProductAttention._get_llama_4_attn_scale and forward, lines 214-237): that module
imports Transformer Engine's attention at import time, so it cannot be imported on a CPU machine.
Hugging Face (transformers' Ministral3 attention) uses the position ids:
1 + llama_4_scaling_beta * log(1 + floor(position_ids / original_max_position_embeddings)).
Run: $ENGINES/megatron/venv/bin/python repro_ministral3_query_scale.py   (torch, numpy only)
"""

import math

import torch

BETA, L = 0.1, 16384  # Ministral-3-8B rope_parameters: llama_4_scaling_beta, original_max_position_embeddings


def _get_llama_4_attn_scale(positions_ids, beta, max_position_embeddings, query_shape):  # Bridge, verbatim
    scaling = 1 + beta * torch.log(1 + torch.floor(positions_ids / max_position_embeddings))
    num_dims_to_add = len(query_shape) - 1
    for _ in range(num_dims_to_add):
        scaling = scaling.unsqueeze(-1)
    return scaling


def bridge_query_scale(query):  # MinistralTEDotProductAttention.forward, the lines before super().forward
    positions_ids = torch.arange(query.shape[0], device=query.device)
    return _get_llama_4_attn_scale(positions_ids, BETA, L, query.shape).to(query.dtype)


def hf(p):
    return 1 + BETA * math.log(1 + math.floor(p / L))


print("decoding one token at position p (query [1, batch, heads, dim]):")
for p in (100, 16384, 65536, 262143):
    q = torch.ones(1, 1, 32, 128)
    print(f"  p={p:>6}: Bridge scale {float(bridge_query_scale(q).flatten()[0]):.6f}   HF {hf(p):.6f}")
print("context parallelism, 2 ranks, sequence of 65536: rank 1 holds positions 16384..32767 and 32768..49151")
q = torch.ones(32768, 1, 1, 8)
s = bridge_query_scale(q).flatten()
print(
    f"  rank 1, token at position 40000 (local index 23616): Bridge {float(s[23616]):.6f}   HF {hf(40000):.6f}"
)
