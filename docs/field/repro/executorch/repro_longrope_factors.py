"""ExecuTorch 1.5.1, Phi-3 mini 128k / Phi-4-mini (LongRoPE): the factor set is chosen once, by
the length of the cos/sin table, not per sequence as in transformers.

examples/models/llama/rope.py, hf_precompute_freqs_cis: "Selection mirrors HF: long_factor when
seq_len > original_max_position_embeddings", with seq_len the table's length ``end``.  Rope passes
``end = max_context_len * 2`` whenever ``ffn_dim_multiplier`` is set (the "sharded checkpoint"
branch), and examples/models/phi_4_mini/config/config.json sets it (to 1).  So:

* --max_context_length 131072: long factors for every position, also in prompts shorter than
  4096, where transformers uses the short factors;
* --max_context_length 4096 (the original context: no sequence can pass it): the table has 8192
  rows, 8192 > 4096, long factors again, at every position;
* --max_context_length 2048: short factors (a 4096-row table).
Run with only executorch + torch + numpy:  python repro_longrope_factors.py
"""

import math
from importlib.metadata import version

import numpy as np
import torch

from executorch.examples.models.llama.model_args import ModelArgs
from executorch.examples.models.llama.rope import Rope

DIM, BASE, L0, LMAX, HEADS = 96, 1e4, 4096, 131072, 32
SHORT = np.round(np.geomspace(1.0, 2.7, 48), 6).tolist()
LONG = np.round(np.geomspace(1.08, 64.8, 48), 6).tolist()
AF = math.sqrt(1 + math.log(LMAX / L0) / math.log(L0))
print("executorch", version("executorch"), "torch", torch.__version__.split("+")[0])


def ref(x, pos, factors):  # float64 transformers LongRoPE, half layout, attention factor on cos/sin
    inv = 1.0 / (np.asarray(factors) * BASE ** (np.arange(0, DIM, 2) / DIM))
    a = pos[:, None, None] * inv
    c, s = np.cos(a) * AF, np.sin(a) * AF
    x1, x2 = x[..., : DIM // 2], x[..., DIM // 2 :]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], -1)


rng = np.random.default_rng(0)
for ctx in (2048, 4096, 131072):
    # phi_4_mini/config/config.json's RoPE fields, shaped like Phi-3 mini 128k; the export's context
    args = ModelArgs(
        dim=DIM * HEADS, n_heads=HEADS, head_dim=DIM, n_layers=1, ffn_dim_multiplier=1,
        rope_theta=BASE, use_hf_rope=True, rope_scaling_short_factor=SHORT,
        rope_scaling_long_factor=LONG, original_max_position_embeddings=L0,
        max_position_embeddings=LMAX, max_seq_len=ctx, max_context_len=ctx,
        use_kv_cache=True, enable_dynamic_shape=False,
    )
    rope = Rope(args)
    print(f"max_context_len={ctx}: table rows {rope.freqs_cos.shape[0]}")
    prompt = np.array([5, 1000, 2047])
    x = rng.standard_normal((1, prompt.size, HEADS, DIM)).astype(np.float32)
    pos = torch.from_numpy(prompt)
    cos, sin = rope.get_freqs(pos, prompt.size)  # Transformer.forward, static-shape path
    q, _ = rope.forward(torch.from_numpy(x), torch.from_numpy(x), cos, sin)  # the attention's call
    q = q[0].double().numpy()
    for j, p in enumerate(prompt.tolist()):
        xj = x[0, j : j + 1].astype(np.float64)
        e_s = np.abs(q[j] - ref(xj, np.array([p]), SHORT)[0]).max()
        e_l = np.abs(q[j] - ref(xj, np.array([p]), LONG)[0]).max()
        print(
            f"  prompt {prompt.tolist()}, pos {p}: |ExecuTorch - transformers (short factors)| = "
            f"{e_s:.3g}; |ExecuTorch - long factors| = {e_l:.3g}"
        )
