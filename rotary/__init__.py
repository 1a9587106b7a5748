"""rotary: the reference Rotary Position Embedding for every array library.

One implementation written against the Python array API standard, run unchanged
on NumPy, CuPy, PyTorch, JAX, Dask and array-api-strict arrays.

>>> import numpy as np, rotary
>>> q = k = np.ones((1, 4, 8, 32), dtype=np.float32)
>>> q_rot, k_rot = rotary.apply(q, k, np.arange(8))
"""

from __future__ import annotations

from . import angles, distributed, hf, layouts, multiaxis, scaling
from .angles import inv_freq
from .apply import apply, rotate
from .attention import attention
from .layouts import LAYOUTS, convert_layout
from .linear_attention import LinearAttentionState, combine, linear_attention, linear_attention_state
from .multiaxis import AxialRoPE, MRoPE
from .rope import RoPE
from .scaling import NTK, DynamicNTK, Linear, Llama3, LongRoPE, Scaling, YaRN

__version__ = "0.1.0"

__all__ = [
    "LAYOUTS",
    "NTK",
    "AxialRoPE",
    "DynamicNTK",
    "Linear",
    "LinearAttentionState",
    "Llama3",
    "LongRoPE",
    "MRoPE",
    "RoPE",
    "Scaling",
    "YaRN",
    "__version__",
    "angles",
    "apply",
    "attention",
    "combine",
    "convert_layout",
    "distributed",
    "hf",
    "inv_freq",
    "layouts",
    "linear_attention",
    "linear_attention_state",
    "multiaxis",
    "rotate",
    "scaling",
]
