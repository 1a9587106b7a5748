"""``apply`` and ``rotate``: the functional entry points."""

from __future__ import annotations

from typing import Any

from ._compat import Array
from .rope import RoPE
from .scaling import Scaling, resolve

__all__ = ["apply", "rotate"]


_ROPES: dict[tuple, RoPE] = {}
_ROPES_PLAIN: dict[tuple, RoPE] = {}  # scaling=None, keyed by the raw arguments


def _rope(
    head_dim: int,
    base: float,
    layout: str,
    rotary_dim: int | None,
    scaling: Scaling,
    angles: str,
    partial: str = "neox",
) -> RoPE:
    # A plain dict rather than functools.lru_cache: it traces cleanly under torch.compile.
    key = (head_dim, base, layout, rotary_dim, scaling, angles, partial)
    rope = _ROPES.get(key)
    if rope is None:
        rope = RoPE(
            head_dim,
            base=base,
            layout=layout,
            rotary_dim=rotary_dim,
            scaling=scaling,
            angles=angles,
            partial=partial,
        )
        if len(_ROPES) < 256:
            _ROPES[key] = rope
    return rope


def _rope_for(
    x: Any,
    name: str,
    base: Any,
    layout: Any,
    rotary_dim: Any,
    scaling: Any,
    angles: Any,
    partial: Any = "neox",
) -> RoPE:
    shape = getattr(x, "shape", None)
    if shape is None or len(shape) < 1:
        raise TypeError(f"{name} must be an array of shape (..., head_dim), got {type(x).__name__}")
    head_dim = shape[-1]
    if isinstance(head_dim, int) and head_dim % 2 and rotary_dim is None:
        raise ValueError(f"{name}.shape[-1] (the head dim) must be even, got {head_dim}")
    if isinstance(head_dim, int) and isinstance(rotary_dim, int) and rotary_dim > head_dim:
        raise ValueError(
            f"rotary_dim={rotary_dim} is larger than the head dimension {name}.shape[-1]={head_dim}"
        )
    try:
        if scaling is None:  # the common case: skip building and hashing Default() per call
            fast = (head_dim, base, layout, rotary_dim, angles, partial)
            rope = _ROPES_PLAIN.get(fast)
            if rope is None:
                rope = _rope(head_dim, base, layout, rotary_dim, resolve(None), angles, partial)
                if len(_ROPES_PLAIN) < 256:
                    _ROPES_PLAIN[fast] = rope
            return rope
        hash(base)
        return _rope(head_dim, base, layout, rotary_dim, resolve(scaling), angles, partial)
    except TypeError as e:
        if "unhashable" not in str(e):
            raise
        return RoPE(
            head_dim,
            base=base,
            layout=layout,
            rotary_dim=rotary_dim,
            scaling=scaling,
            angles=angles,
            partial=partial,
        )


def rotate(
    x: Array,
    pos: Any,
    *,
    layout: str = "half",
    base: float = 10000.0,
    rotary_dim: int | None = None,
    scaling: Scaling | dict | None = None,
    angles: str = "exact",
    partial: str = "neox",
) -> Array:
    """Rotate one array ``x`` of shape ``(..., head_dim)`` at positions ``pos``.

    Same options as :func:`apply`; use it for keys appended to a KV cache or any
    single tensor.

    Examples
    --------
    >>> import numpy as np, rotary
    >>> k = np.ones((1, 2, 1, 4), dtype=np.float32)          # one new key per head
    >>> rotary.rotate(k, [7]).shape                           # at position 7
    (1, 2, 1, 4)
    """
    rope = _rope_for(x, "x", base, layout, rotary_dim, scaling, angles, partial)
    return rope.rotate(x, pos)


def apply(
    q: Array,
    k: Array,
    pos: Any,
    *,
    layout: str = "half",
    base: float = 10000.0,
    rotary_dim: int | None = None,
    scaling: Scaling | dict | None = None,
    k_pos: Any = None,
    angles: str = "exact",
    partial: str = "neox",
) -> tuple[Array, Array]:
    """Apply rotary position embedding to queries and keys.

    Parameters
    ----------
    q, k : array
        Queries and keys, shape ``(..., head_dim)``, real floating (float16,
        bfloat16, float32, float64), from any array-API library.  They may have
        different head counts (grouped-query attention).
    pos : array or int or sequence
        Positions (integer or fractional), broadcast against ``q.shape[:-1]``:
        ``(seq,)`` for ``(batch, heads, seq, dim)``, ``(seq, 1)`` for
        ``(batch, seq, heads, dim)``, ``(batch, 1, seq)`` for per-batch positions.
    layout : {"half", "interleaved"}
        Pairing of features (see :mod:`rotary.layouts`).
    base : float
        RoPE base ``theta``.
    rotary_dim : int, optional
        Rotate only ``rotary_dim`` features of each head; the rest pass through.
    scaling : Scaling or dict, optional
        Context-extension scaling (:mod:`rotary.scaling`).
    k_pos : array or int or sequence, optional
        Key positions, default ``pos``.
    angles : {"exact", "float32"}
        Angle method (see :mod:`rotary.angles`).
    partial : {"neox", "proportional"}
        How ``rotary_dim`` is read: NeoX-style (first ``rotary_dim`` features,
        exponent over ``rotary_dim``) or Gemma's proportional RoPE (exponent over
        the head dim, first ``rotary_dim // 2`` pairs rotate); see :class:`RoPE`.

    Returns
    -------
    (q_rot, k_rot)
        Same namespace, device, shape and dtype as ``q`` and ``k``.  Inputs are
        never modified.

    Examples
    --------
    >>> import numpy as np, rotary
    >>> rng = np.random.default_rng(0)
    >>> q = rng.normal(size=(1, 8, 16, 64)).astype(np.float32)
    >>> k = rng.normal(size=(1, 2, 16, 64)).astype(np.float32)   # 2 kv heads
    >>> q_rot, k_rot = rotary.apply(q, k, np.arange(16))
    >>> q_rot.shape, k_rot.shape
    ((1, 8, 16, 64), (1, 2, 16, 64))
    """
    rope = _rope_for(q, "q", base, layout, rotary_dim, scaling, angles, partial)
    return rope.apply(q, k, pos, k_pos=k_pos)
