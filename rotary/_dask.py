"""Dask: RoPE as one task per block of the leading axes.

Called by the public entry points when the namespace is Dask, after they validated
their arguments.  Each output block is computed by running ``rotary`` itself on the
matching input block (a NumPy or CuPy chunk), so the graph has one task per block,
the chunking of the leading axes is kept, and nothing is computed while it is built.

The feature (last) axis of a RoPE input must be whole in each block, because a
rotation mixes features ``i`` and ``i + r/2`` (or ``2i`` and ``2i + 1``).  An input
chunked along it is merged into one chunk there (``head_dim`` is small), which is
correct and says so in the docstrings; nothing is ever computed on a partial head.
"""

from __future__ import annotations

import math
from typing import Any

from ._compat import Array, array_namespace, device

__all__ = ["merge_axis", "rotate", "split_positions"]


def _known(n: Any) -> bool:
    return n is not None and not (isinstance(n, float) and math.isnan(n))


def merge_axis(x: Array, axis: int = -1) -> Array:
    """``x`` with one chunk along ``axis`` (a no-op when it already has one)."""
    axis = axis % x.ndim
    if len(x.chunks[axis]) == 1:
        return x
    return x.rechunk({axis: -1})


def split_positions(pos: Array, x: Array, name: str = "pos", x_name: str = "x") -> Array:
    """``pos`` (broadcastable to ``x.shape[:-1]``) as an array of ``x.ndim`` axes whose
    chunks match those of ``x`` on every axis where ``pos`` is not broadcast (size 1),
    with a trailing axis of size 1 standing for the feature axis.

    Positions are small, so it is them that are re-chunked, never ``x``.
    """
    import dask.array as da  # the caller holds Dask arrays

    lead = x.ndim - 1
    if not isinstance(pos, da.Array):
        pos = da.asarray(pos)
    p = da.reshape(pos, (1,) * (lead - pos.ndim) + tuple(pos.shape) + (1,)) if pos.ndim != lead + 1 else pos
    chunks = []
    for i in range(lead):
        if p.shape[i] == 1:
            chunks.append((1,))
        elif not all(_known(c) for c in x.chunks[i]):
            raise ValueError(
                f"{x_name} has unknown chunk sizes along axis {i}; call {x_name}.compute_chunk_sizes() "
                f"before broadcasting {name} against it"
            )
        else:
            chunks.append(x.chunks[i])
    chunks.append((1,))
    return p.rechunk(tuple(chunks))


def _rotate_block(xb: Any, pb: Any, rope: Any) -> Any:
    xp = array_namespace(xb)
    pb = xp.asarray(pb, device=device(xb))
    return rope.rotate(xb, pb[..., 0])


def rotate(rope: Any, x: Array, pos: Array, name: str = "x", pos_name: str = "pos") -> Array:
    """``rope.rotate(x, pos)`` for a Dask ``x``: one task per block of the leading axes.

    ``pos`` is already validated (broadcastable to ``x.shape[:-1]``).  The result keeps
    ``x``'s chunks on the leading axes and has one chunk along the feature axis.
    """
    import dask.array as da

    x = merge_axis(x, -1)
    p = split_positions(pos, x, pos_name, name)
    return da.map_blocks(_rotate_block, x, p, rope=rope, dtype=x.dtype, meta=x._meta)
