"""Testing utilities: the backend registry and (see ``rotary.testing.checks``) the
property checks any RoPE implementation can be certified with."""

from __future__ import annotations

from .backends import ALL_BACKENDS, Backend, available

__all__ = ["ALL_BACKENDS", "Backend", "available"]
