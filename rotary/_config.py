"""``RopeConfig``: one RoPE configuration with an identity, and the constants it determines.

A frozen, hashable dataclass with named, typed fields, normalised and checked on
construction.  It is the key of every cached constant and what ``torch.compile`` sees as
a constant (passed by identity to :meth:`rotary._backends.Backend.constant`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from ._lib import _validation as v
from ._lib._typing import AngleMethod, Array, Device, DType, Layout, Namespace, PartialMode
from ._math import _angles
from .scaling import Scaling, resolve

__all__ = ["ANGLE_METHODS", "PARTIAL_MODES", "RopeConfig", "build_constant"]

ANGLE_METHODS: tuple[AngleMethod, ...] = ("exact", "float32")
PARTIAL_MODES: tuple[PartialMode, ...] = ("neox", "proportional")


@dataclasses.dataclass(frozen=True)
class RopeConfig:
    """A checked RoPE configuration (see :class:`rotary.RoPE` for the meaning of the fields).

    Examples
    --------
    >>> from rotary._config import RopeConfig
    >>> RopeConfig(64, rotary_dim=None).rotary_dim
    64
    """

    head_dim: int
    rotary_dim: int | None = None
    base: float = 10000.0
    layout: Layout = "half"
    scaling: Scaling | Any = None
    angles: AngleMethod = "exact"
    partial: PartialMode = "neox"

    def __post_init__(self) -> None:
        head_dim = v.check_head_dim(self.head_dim)
        rotary_dim = v.check_rotary_dim(self.rotary_dim, head_dim)
        scaling = resolve(self.scaling)
        angles = v.check_choice(self.angles, "angles", ANGLE_METHODS)
        partial = v.check_choice(self.partial, "partial", PARTIAL_MODES)
        if partial == "proportional" and scaling.dynamic:
            raise ValueError(
                f"partial='proportional' does not support dynamic scalings, got {type(scaling).__name__}"
            )
        scaling.check_dim(head_dim if partial == "proportional" else rotary_dim)
        for name, value in (
            ("head_dim", head_dim),
            ("rotary_dim", rotary_dim),
            ("base", v.check_base(self.base)),
            ("layout", v.check_layout_name(self.layout)),
            ("scaling", scaling),
            ("angles", angles),
            ("partial", partial),
        ):
            object.__setattr__(self, name, value)

    def __hash__(self) -> int:
        # computed once: the configuration keys every cache lookup
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash((self.head_dim, self.rotary_dim, self.base, self.layout, self.scaling, self.angles))
            h ^= hash(self.partial)
            object.__setattr__(self, "_hash", h)
        return int(h)

    def __getstate__(self) -> dict[str, Any]:
        # the memoised hash stays behind: string hashes differ between processes, so a pickled
        # one would be stale (equal configurations hashing differently)
        return {k: val for k, val in self.__dict__.items() if k != "_hash"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for k, val in state.items():
            object.__setattr__(self, k, val)

    @property
    def rotated(self) -> int:
        """``rotary_dim`` (normalised to an int on construction)."""
        return self.head_dim if self.rotary_dim is None else self.rotary_dim

    @property
    def width(self) -> int:
        """Features handed to the rotation: proportional pairs span the whole head."""
        return self.head_dim if self.partial == "proportional" else self.rotated

    @property
    def freq_dim(self) -> int:
        """The ``d`` of the frequency exponent ``base**(-2i/d)``."""
        return self.width

    @property
    def attention_factor(self) -> float:
        return float(self.scaling.attention_factor(self.freq_dim, self.base))

    def with_scaling(self, scaling: Scaling) -> RopeConfig:
        return dataclasses.replace(self, scaling=scaling)

    def host_inv_freq(self) -> np.ndarray:
        """The frequencies in float64 on the host, shape ``(width // 2,)`` (computed when a
        constant is built: not kept, see ``docs/guides/state.rst``)."""
        w = np.asarray(self.scaling.inv_freq(self.freq_dim, self.base), dtype=np.float64)
        if self.partial == "proportional":
            rot = self.rotated // 2
            w = np.concatenate([w[:rot], np.zeros(self.head_dim // 2 - rot)])
        return w


def build_constant(config: RopeConfig, kind: str, xp: Namespace, device: Device, dtype: DType) -> Array:
    """The device constant ``kind`` of ``config`` as an array of ``xp``:

    ``"inv_freq"`` (``(width/2,)``), ``"tables"`` (the exact method's digit tables,
    ``(3, 4097, 2, width/2)``), ``"float32_inv"`` (Hugging Face's float32 frequencies,
    computed with ``xp``).
    """
    if kind == "float32_inv":
        if config.partial == "proportional":
            rot = config.rotated // 2
            w32 = config.scaling.float32_inv_freq(config.head_dim, config.base, xp=xp, device=device)[:rot]
            pad = xp.zeros((config.head_dim // 2 - rot,), dtype=w32.dtype, device=device)
            return xp.concat([w32, pad])
        return config.scaling.float32_inv_freq(config.rotated, config.base, xp=xp, device=device)
    np_dtype = np.float64 if v.dtype_name(dtype) == "float64" else np.float32
    w = config.host_inv_freq()
    if kind == "inv_freq":
        return xp.asarray(w.astype(np_dtype), dtype=dtype, device=device)
    if kind == "tables":
        return xp.asarray(_angles.digit_tables(w).astype(np_dtype), dtype=dtype, device=device)
    raise ValueError(f"unknown constant kind {kind!r}")
