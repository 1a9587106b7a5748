"""rotary: the reference Rotary Position Embedding for every array library.

One implementation written against the Python array API standard, run unchanged on NumPy,
CuPy, PyTorch, JAX, Dask, array-api-strict, cubed, marray and ndonnx arrays, and on any other
array-API library (the generic code, reading values only where the library can give them).

>>> import numpy as np, rotary
>>> q = k = np.ones((1, 4, 8, 32), dtype=np.float32)
>>> q_rot, k_rot = rotary.apply(q, k, np.arange(8))
"""

from __future__ import annotations

from . import distributed, hf, layouts, learned, multiaxis, positions, scaling, testing, vision
from ._attention import attention
from ._config import RopeConfig
from ._decay import decay_bound
from ._functional import apply, rotate
from ._lib._cache import CacheInfo, cache_info, clear_cache, fast_paths, set_cache_limit
from ._linear import (
    FEATURE_MAPS,
    LinearAttentionState,
    combine,
    linear_attention,
    linear_attention_state,
)
from ._math._freqs import inv_freq
from ._math._rotation import LAYOUTS
from ._rope import RoPE
from .layouts import convert_layout
from .multiaxis import AxialRoPE, MRoPE
from .scaling import NTK, DynamicNTK, Linear, Llama3, LongRoPE, Scaling, YaRN

__version__ = "0.2.0"

__all__ = [
    "FEATURE_MAPS",
    "LAYOUTS",
    "NTK",
    "AxialRoPE",
    "CacheInfo",
    "DynamicNTK",
    "Linear",
    "LinearAttentionState",
    "Llama3",
    "LongRoPE",
    "MRoPE",
    "RoPE",
    "RopeConfig",
    "Scaling",
    "YaRN",
    "__version__",
    "apply",
    "attention",
    "cache_info",
    "clear_cache",
    "combine",
    "convert_layout",
    "decay_bound",
    "distributed",
    "fast_paths",
    "hf",
    "inv_freq",
    "layouts",
    "learned",
    "linear_attention",
    "linear_attention_state",
    "multiaxis",
    "positions",
    "rotate",
    "scaling",
    "set_cache_limit",
    "testing",
    "vision",
]
