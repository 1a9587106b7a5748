"""Testing utilities: the backend registry, an independent float64 reference
(:mod:`rotary.testing.reference`) and :func:`check_rope`, the property checks any RoPE
implementation can be certified with."""

from __future__ import annotations

from . import reference
from .backends import ALL_BACKENDS, Backend, available
from .checks import PROPERTIES, PropertyResult, RopeReport, check_rope, eps

__all__ = [
    "ALL_BACKENDS",
    "PROPERTIES",
    "Backend",
    "PropertyResult",
    "RopeReport",
    "available",
    "check_rope",
    "eps",
    "reference",
]
