"""Testing utilities, for ``rotary`` and for projects checking their own RoPE against it.

* :func:`check_rope`: the property checks any RoPE implementation can be certified with;
* :mod:`rotary.testing.reference`: the independent float64 oracle (rotation matrix, correctly
  rounded angles);
* :func:`assert_close` and :func:`eps`: one comparison of an array of any library with a
  float64 reference, library, dtype, device and shape included;
* :mod:`rotary.testing.backends`: the registry of array libraries the suites run on.
"""

from __future__ import annotations

from .._lib._compat import to_numpy
from . import reference
from .asserts import assert_close, eps
from .backends import ALL_BACKENDS, Backend, available
from .checks import PROPERTIES, PropertyResult, RopeReport, check_rope

__all__ = [
    "ALL_BACKENDS",
    "PROPERTIES",
    "Backend",
    "PropertyResult",
    "RopeReport",
    "assert_close",
    "available",
    "check_rope",
    "eps",
    "reference",
    "to_numpy",
]
