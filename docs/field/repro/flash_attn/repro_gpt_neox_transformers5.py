# ruff: noqa: I001  (the engine setup must run before its imports)
"""flash-attn 2.8.3.post2: its GPT-NeoX HF converter raises under transformers 5.

flash_attn/models/gpt_neox.py: gpt_neox_config_to_gpt2_config reads
gpt_neox_config.rotary_emb_base and .rotary_pct; transformers 5 moved both into
config.rope_parameters (rope_theta, partial_rotary_factor), so Pythia cannot be loaded.
flash-attn's setup.py does not bound transformers.
"""

import transformers

import _load  # noqa: F401
from flash_attn.models.gpt_neox import gpt_neox_config_to_gpt2_config
from transformers import GPTNeoXConfig

cfg = GPTNeoXConfig(
    hidden_size=768,
    num_attention_heads=12,
    num_hidden_layers=12,
    max_position_embeddings=2048,
    rotary_pct=0.25,
    rotary_emb_base=10000,
)
print(
    "transformers",
    transformers.__version__,
    "| config.rope_parameters =",
    getattr(cfg, "rope_parameters", "(none: transformers 4)"),
)
try:
    g = gpt_neox_config_to_gpt2_config(cfg)
    print("rotary_emb_fraction =", g.rotary_emb_fraction)
except AttributeError as e:
    print("gpt_neox_config_to_gpt2_config raised AttributeError:", e)
