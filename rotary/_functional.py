"""``apply`` and ``rotate``: the functional entry points (a :class:`RoPE` per configuration, held once)."""

from __future__ import annotations

import operator
from typing import Any

from ._backends import backend_for
from ._lib import _validation as v
from ._lib._compat import array_namespace, entry, is_array
from ._lib._typing import AngleMethod, Array, Layout, PartialMode
from ._packing import positions_along
from ._rope import RoPE, rope_of
from .scaling import Scaling

__all__ = ["apply", "rotate"]


def _rope_for(
    x: Any, name: str, base: Any, layout: Any, rotary_dim: Any, scaling: Any, angles: Any, partial: Any
) -> RoPE:
    v.check_array(x, name)
    head_dim = v.check_known_dim(x.shape[-1], f"{name}.shape[-1]")
    head_dim = operator.index(head_dim)  # specialises a symbolic size under torch.compile
    if head_dim % 2 and rotary_dim is None:
        raise ValueError(f"{name}.shape[-1] (the head dim) must be even, got {head_dim}")
    if isinstance(base, (int, float)) and not isinstance(base, bool):
        base = v.check_base(base)
    be = backend_for(array_namespace(x, names=(name,)))
    return rope_of(
        be,
        head_dim,
        base=base,
        layout=layout,
        rotary_dim=rotary_dim,
        scaling=scaling,
        angles=angles,
        partial=partial,
    )


@entry
def rotate(
    x: Array,
    pos: Any = None,
    *,
    layout: Layout = "half",
    base: float = 10000.0,
    rotary_dim: int | None = None,
    scaling: Scaling | dict[str, Any] | None = None,
    angles: AngleMethod = "exact",
    partial: PartialMode = "neox",
    cu_seqlens: Any = None,
    segment_ids: Any = None,
) -> Array:
    """Rotate one array ``x`` of shape ``(..., head_dim)`` at positions ``pos``.

    Same options as :func:`apply`; use it for keys appended to a KV cache or any single
    tensor.

    Examples
    --------
    >>> import numpy as np, rotary
    >>> k = np.ones((1, 2, 1, 4), dtype=np.float32)          # one new key per head
    >>> rotary.rotate(k, [7]).shape                           # at position 7
    (1, 2, 1, 4)
    """
    pos = _implied(x, "x", pos, cu_seqlens, segment_ids)
    return _rope_for(x, "x", base, layout, rotary_dim, scaling, angles, partial).rotate(x, pos)


def _implied(x: Any, name: str, pos: Any, cu_seqlens: Any, segment_ids: Any) -> Any:
    """``pos``, or the positions that packed documents imply (0 at each document's start)."""
    if is_array(x):  # (a nested array of a layout rotary does not serve: refused here, naming the remedy)
        backend_for(array_namespace(x, names=(name,))).jagged(x)
    if cu_seqlens is None and segment_ids is None:
        return pos  # (None: the positions' own check names it, unless x is nested)
    if pos is not None:
        raise ValueError(
            "pass pos= or the documents (cu_seqlens= / segment_ids=), not both: the documents imply "
            "the positions (0 at each document's start)"
        )
    v.check_array(x, name)
    be = backend_for(array_namespace(x, names=(name,)))
    if be.jagged(x) is not None:
        raise ValueError(
            f"{name} is nested: its documents are its own (offsets); pass no cu_seqlens= / segment_ids="
        )
    return positions_along(be, x, cu_seqlens, segment_ids, name)


@entry
def apply(
    q: Array,
    k: Array,
    pos: Any = None,
    *,
    layout: Layout = "half",
    base: float = 10000.0,
    rotary_dim: int | None = None,
    scaling: Scaling | dict[str, Any] | None = None,
    k_pos: Any = None,
    angles: AngleMethod = "exact",
    partial: PartialMode = "neox",
    cu_seqlens: Any = None,
    segment_ids: Any = None,
) -> tuple[Array, Array]:
    """Apply rotary position embedding to queries and keys.

    Parameters
    ----------
    q, k : array
        Queries and keys, shape ``(..., head_dim)``, real floating (float16, bfloat16,
        float32, float64), from any array-API library.  They may have different head counts
        (grouped-query attention).
    pos : array or int or sequence
        Positions (integer or fractional), broadcast against ``q.shape[:-1]``: ``(seq,)`` for
        ``(batch, heads, seq, dim)``, ``(seq, 1)`` for ``(batch, seq, heads, dim)``,
        ``(batch, 1, seq)`` for per-batch positions.  An array of ``q``'s library, a NumPy
        array or Python values.
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
        Angle method (see :class:`rotary.RoPE`).
    partial : {"neox", "proportional"}
        How ``rotary_dim`` is read (see :class:`rotary.RoPE`).
    cu_seqlens, segment_ids : optional
        Packed documents instead of ``pos`` (as in :func:`rotary.linear_attention`): positions
        restart at 0 in each document, tokens along axis -2 (or -3 for the packed layout
        ``(total, heads, head_dim)``).

    Returns
    -------
    (q_rot, k_rot)
        Same namespace, device, shape and dtype as ``q`` and ``k``.  Inputs are never
        modified.

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
    pos = _implied(q, "q", pos, cu_seqlens, segment_ids)
    rope = _rope_for(q, "q", base, layout, rotary_dim, scaling, angles, partial)
    return rope.apply(q, k, pos, k_pos=k_pos)
