"""Grouped-query heads: ``(..., H, N, d)`` as ``(..., H/g, g, N, d)`` and back.

Query head ``h`` belongs to key head ``h // g`` (group member ``h % g``), as grouped-query
attention shares keys.  Where every leading size is known the split is a reshape; where one is
symbolic (``None``: ndonnx's dynamic batch and sequence axes), strided slices stacked on a new
axis, and the merge a concatenation put in head order by one gather: the same values either way.
"""

from __future__ import annotations

from .._lib._compat import device, index_dtype
from .._lib._typing import Array, Namespace

__all__ = ["merge_heads", "split_heads"]


def _symbolic(shape: tuple[object, ...]) -> bool:
    return any(n is None for n in shape)


def split_heads(x: Array, g: int, xp: Namespace) -> Array:
    """``x`` ``(..., H, N, d)`` as ``(..., H/g, g, N, d)``."""
    if not _symbolic(tuple(x.shape)):
        return xp.reshape(x, (*x.shape[:-3], x.shape[-3] // g, g, *x.shape[-2:]))
    return xp.stack([x[..., j::g, :, :] for j in range(g)], axis=-3)


def merge_heads(x: Array, heads: int, g: int, xp: Namespace) -> Array:
    """``x`` ``(..., H/g, g, N, d)`` as ``(..., H, N, d)`` with ``H = heads`` (the inverse of
    :func:`split_heads`; the sizes given, as a symbolic array may not know them)."""
    hk = heads // g
    if not _symbolic(tuple(x.shape)):
        return xp.reshape(x, (*x.shape[:-4], hk * g, *x.shape[-2:]))
    joined = xp.concat([x[..., j, :, :] for j in range(g)], axis=-3)  # head order (member, key head)
    dev = device(x)
    order = xp.asarray([(h % g) * hk + h // g for h in range(hk * g)], dtype=index_dtype(xp, dev), device=dev)
    return xp.take(joined, order, axis=-3)
