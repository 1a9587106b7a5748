"""keras-hub 0.32.0: GPTNeoXAttention.call rotates q and k with `rotary_embedding_layer(x)` (no
start_index): during cached decoding the single new query is rotated at position 0 instead of
`cache_update_index` (keys are the whole cache, rotated from 0, so they are right).  The
`call_with_cache` logits of token t then differ from the full forward pass's logits at t for every
t > 0.  The expected per-position angle is written out below (float64) and compared with what the
layer applies to the decode query."""

import os

os.environ.setdefault("KERAS_BACKEND", "jax")
import keras
import numpy as np
from keras import ops
from keras_hub.src.models.gpt_neo_x.gpt_neo_x_backbone import GPTNeoXBackbone
from keras_hub.src.models.gpt_neo_x.gpt_neo_x_causal_lm import GPTNeoXCausalLM

keras.utils.set_random_seed(0)
backbone = GPTNeoXBackbone(
    vocabulary_size=64,
    num_layers=1,
    num_heads=2,
    hidden_dim=32,
    intermediate_dim=64,
    rotary_percentage=0.25,
    max_sequence_length=32,
)
lm = GPTNeoXCausalLM(backbone=backbone, preprocessor=None)
qkv = backbone.transformer_layers[0]._self_attention_layer._qkv_dense.kernel
qkv.assign(qkv * 40.0)  # sharpen the random attention so the position error shows in the logits
L = 16
tokens = np.random.default_rng(0).integers(0, 64, size=(1, L)).astype("int32")
full = backbone({"token_ids": tokens, "padding_mask": np.ones_like(tokens)})
full_logits = np.asarray(ops.convert_to_numpy(backbone.token_embedding(full, reverse=True)))[0]
_, cache = lm._build_cache(tokens)  # the prefill that seeds the cache (correct)
print("max|call_with_cache(token t) - full forward at t| (logits):")
for t in (0, 1, 5, 15):
    logits, _, _ = lm.call_with_cache(tokens[:, t : t + 1], cache, t)
    e = np.abs(np.asarray(ops.convert_to_numpy(logits))[0, 0] - full_logits[t]).max()
    print(f"  t={t:2d}: {e:.3e}")

# The rotation itself: what the layer does to a decode query (seq_len 1, as call() invokes it)
rope = backbone.transformer_layers[0]._self_attention_layer.rotary_embedding_layer
d = 4  # rotary_dim = int(16 * 0.25)
q = np.random.default_rng(1).standard_normal((1, 1, 2, d)).astype("float32")
got = np.asarray(ops.convert_to_numpy(rope(q)))  # exactly GPTNeoXAttention.call's invocation
t = 15
inv = 10000.0 ** (-np.arange(0, d, 2) / d)
c, s = np.cos(t * inv), np.sin(t * inv)
x1, x2 = q[..., : d // 2].astype(np.float64), q[..., d // 2 :].astype(np.float64)
want = np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)
print(
    f"decode query at position {t}: max|keras - f64 rotation at {t}| = {np.abs(got - want).max():.3e}, "
    f"max|keras - unrotated q| = {np.abs(got - q).max():.3e}"
)
