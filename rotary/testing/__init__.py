"""Testing utilities, for ``rotary`` and for projects checking their own RoPE against it.

* :func:`check_rope`: the property checks any RoPE implementation can be certified with;
* :func:`check_model_rope`: an engine's RoPE certified against a model's config (every layer type,
  scaling, attention factor, table), through the adapter protocol of :mod:`rotary.testing.engine`;
* :mod:`rotary.testing.reference`: the independent float64 oracle (rotation matrix, correctly
  rounded angles);
* :func:`assert_close` and :func:`eps`: one comparison of an array of any library with a
  float64 reference, library, dtype, device and shape included;
* :mod:`rotary.testing.backends`: the registry of array libraries the suites run on.
"""

from __future__ import annotations

from . import reference
from .asserts import assert_close, eps
from .backends import ALL_BACKENDS, Backend, available, to_numpy
from .checks import PROPERTIES, PropertyResult, RopeReport, check_rope
from .engine import Unsupported
from .model import MODEL_CHECKS, ModelCheck, ModelRopeReport, check_model_rope

__all__ = [
    "ALL_BACKENDS",
    "MODEL_CHECKS",
    "PROPERTIES",
    "Backend",
    "ModelCheck",
    "ModelRopeReport",
    "PropertyResult",
    "RopeReport",
    "Unsupported",
    "assert_close",
    "available",
    "check_model_rope",
    "check_rope",
    "eps",
    "reference",
    "to_numpy",
]
