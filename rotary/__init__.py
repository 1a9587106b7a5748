"""rotary: the reference Rotary Position Embedding for every array library.

One implementation written against the Python array API standard, run unchanged
on NumPy, CuPy, PyTorch, JAX, Dask and array-api-strict arrays.

>>> import numpy as np, rotary
>>> q = k = np.ones((1, 4, 8, 32), dtype=np.float32)
>>> q_rot, k_rot = rotary.apply(q, k, np.arange(8))
"""

from __future__ import annotations

from . import angles, layouts, scaling
from .angles import inv_freq
from .apply import apply, rotate
from .attention import attention
from .layouts import LAYOUTS
from .linear_attention import LinearAttentionState, combine, linear_attention, linear_attention_state
from .rope import RoPE

__version__ = "0.1.0"

__all__ = [
    "LAYOUTS",
    "LinearAttentionState",
    "RoPE",
    "__version__",
    "angles",
    "apply",
    "attention",
    "combine",
    "inv_freq",
    "layouts",
    "linear_attention",
    "linear_attention_state",
    "rotate",
    "scaling",
]
