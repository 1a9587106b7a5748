# ruff: noqa: I001  (the engine setup must run before its imports)
"""flash-attn 2.8.3.post2: its GPT-NeoX HF converter raises under transformers 5.

flash_attn/models/gpt_neox.py: gpt_neox_config_to_gpt2_config reads
gpt_neox_config.rotary_emb_base and .rotary_pct; transformers 5 moved both into
config.rope_parameters (rope_theta, partial_rotary_factor), so Pythia cannot be loaded.
flash-attn's setup.py does not bound transformers.  The script then runs itself again under
transformers 4.57.1 (the recipe's ``tf4`` folder beside the venv, first on PYTHONPATH), where the
same converter works.
"""

import os
import subprocess
import sys

import transformers

if "REPRO_TF4" in os.environ:  # the rerun below
    assert transformers.__version__ == "4.57.1", f"{transformers.__version__}: is the recipe's tf4 installed?"

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

if "REPRO_TF4" not in os.environ:  # the same script under transformers 4
    tf4 = os.path.join(os.path.dirname(sys.prefix), "tf4")  # the recipe's folder, beside the venv
    print("--- same script with transformers 4.57.1 (PYTHONPATH=$ENGINES/flash_attn/tf4):", flush=True)
    env = {**os.environ, "PYTHONPATH": tf4, "REPRO_TF4": "1"}
    subprocess.run([sys.executable, __file__], env=env, check=True)
