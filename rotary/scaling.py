"""Context-extension scalings of the RoPE frequencies.

A scaling maps the default inverse frequencies ``base**(-2i/d)`` to new ones
and may carry an *attention factor* ``af`` that multiplies cos and sin (so the
attention logits scale by ``af**2``), exactly as Hugging Face ``transformers``
applies it: once.

Every scaling is a frozen (hashable) dataclass; ``resolve`` turns ``None``, a
scaling object or a Hugging Face ``rope_scaling`` dict into one.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import numpy as np

from .angles import inv_freq as default_inv_freq

__all__ = ["Default", "Linear", "Scaling", "from_dict", "from_key", "register", "resolve"]


@dataclasses.dataclass(frozen=True)
class Scaling:
    """Base class: the unscaled frequencies, attention factor 1."""

    #: Name used in Hugging Face configs (``rope_type``).
    rope_type: ClassVar[str] = "default"
    #: True when the frequencies depend on the sequence length (dynamic NTK, LongRoPE).
    dynamic: ClassVar[bool] = False

    def inv_freq(self, dim: int, base: float) -> np.ndarray:
        """Inverse frequencies (float64, shape ``(dim // 2,)``) for ``dim`` rotated features."""
        return default_inv_freq(dim, base)

    def attention_factor(self, dim: int, base: float) -> float:
        """Factor multiplying cos and sin (1.0 unless the scaling says otherwise)."""
        return 1.0


@dataclasses.dataclass(frozen=True)
class Default(Scaling):
    """No scaling (HF ``rope_type="default"``)."""


@dataclasses.dataclass(frozen=True)
class Linear(Scaling):
    """Position interpolation: every frequency divided by ``factor`` (HF ``"linear"``).

    Examples
    --------
    >>> from rotary.scaling import Linear
    >>> Linear(4.0).inv_freq(4, 10000.0)
    array([0.25  , 0.0025])
    """

    factor: float = 1.0
    rope_type: ClassVar[str] = "linear"

    def __post_init__(self) -> None:
        if not float(self.factor) >= 1.0:
            raise ValueError(f"Linear scaling factor must be >= 1, got {self.factor!r}")

    def inv_freq(self, dim: int, base: float) -> np.ndarray:
        return default_inv_freq(dim, base) / float(self.factor)


_REGISTRY: dict[str, type[Scaling]] = {"default": Default, "linear": Linear}


def register(cls: type[Scaling]) -> type[Scaling]:
    """Class decorator registering a scaling under its ``rope_type`` (needed for
    ``from_dict`` and for use under ``torch.compile``, which rebuilds scalings from
    their plain-value key)."""
    _REGISTRY[cls.rope_type] = cls
    return cls


def key(scaling: Scaling) -> tuple:
    """Plain-value (hashable, compile-friendly) key of a scaling: ``(rope_type, fields)``."""
    return (type(scaling).rope_type, dataclasses.astuple(scaling))


def from_key(k: tuple) -> Scaling:
    """Inverse of ``key``."""
    kind, fields = k
    return _REGISTRY[kind](*fields)


def resolve(scaling: Any) -> Scaling:
    """Normalise the ``scaling=`` argument to a ``Scaling`` instance."""
    if scaling is None:
        return Default()
    if isinstance(scaling, Scaling):
        return scaling
    if isinstance(scaling, dict):
        return from_dict(scaling)
    raise TypeError(
        "scaling must be None, a rotary.scaling.Scaling instance or a Hugging Face "
        f"rope_scaling dict, got {type(scaling).__name__}"
    )


def from_dict(d: dict[str, Any]) -> Scaling:
    """Build a scaling from a Hugging Face ``rope_scaling`` / ``rope_parameters`` dict."""
    kind = d.get("rope_type", d.get("type", "default"))
    if kind not in _REGISTRY:
        raise ValueError(f"unknown scaling rope_type {kind!r}; known: {sorted(_REGISTRY)}")
    cls = _REGISTRY[kind]
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in d.items() if k in names})
