"""Dask: lazy graphs with one task per block, the kernel passed in by the caller.

Nothing here computes: values are never read while a graph is built.

* :meth:`DaskBackend.map_positions` runs a kernel (``RoPE.rotate`` of the caller) on every
  block of ``x`` with the matching block of positions.  The feature (last) axis must be
  whole in a block (a rotation mixes features across the head): an input chunked along it
  is merged into one chunk there.  Positions are re-chunked to ``x``'s blocks, never ``x``.
* :meth:`DaskBackend.map_heads` does the same for layout conversion (blocks of whole heads).
* :meth:`DaskBackend.scan` is linear attention's scan over the sequence, block by block:
  without decay every block of keys is summarised by its state (one task each), an
  exclusive cumulative sum of the block states hands each block the state of all earlier
  keys, and each block runs the chunked algorithm on its own tokens from it; with decay or
  documents the block states form a chain.  No block holds more than its own tokens.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from typing import Any

import dask.array as da
import numpy as np

from .._lib._typing import Array, Device
from .._math import _linear
from ._generic import Backend

__all__ = ["DaskBackend"]


def _known(n: Any) -> bool:
    return n is not None and not (isinstance(n, float) and math.isnan(n))


def _unknown_chunks(name: str, axis: int, what: str) -> ValueError:
    return ValueError(
        f"{name} has unknown chunk sizes along axis {axis}; call {name}.compute_chunk_sizes() first "
        f"so that {what}"
    )


def _merge_last(x: Array) -> Array:
    return x if len(x.chunks[-1]) == 1 else x.rechunk({x.ndim - 1: -1})


def _index(n: int, *tail: str) -> tuple[str, ...]:
    """Blockwise index names: ``l0 .. l{n-1}`` for leading axes (any number of them), then ``tail``."""
    return (*(f"l{i}" for i in range(n)), *tail)


class DaskBackend(Backend):
    writable = False
    lazy = True
    #: How :meth:`scan` prefix-sums the block states (``dask.array.cumsum``'s method).
    _scan = "sequential"

    @contextlib.contextmanager
    def scan_method(self, method: str) -> Iterator[None]:
        """Inside the block, graphs use ``method`` (``"sequential"`` or ``"blelloch"``)."""
        old, self._scan = self._scan, method
        try:
            yield
        finally:
            self._scan = old

    def is_concrete(self, x: Array) -> bool:
        return False

    def check_devices(self, arrays: list[tuple[str, Array]]) -> None:
        return None  # Dask arrays live on the host (their chunks' devices are not known)

    def creation_device(self, x: Array) -> Device:
        return None

    # -- RoPE --------------------------------------------------------------------------------
    def map_positions(
        self, kernel: Callable[[Array, Array], Array], x: Array, pos: Array, *, name: str, pos_name: str
    ) -> Array:
        """``kernel(x_block, pos_block)`` per block of ``x`` (``pos`` broadcasts to ``x.shape[:-1]``)."""
        x = _merge_last(x)
        lead = x.ndim - 1
        p = pos if isinstance(pos, da.Array) else da.asarray(pos)
        p = da.reshape(p, (1,) * (lead - p.ndim) + tuple(p.shape) + (1,)) if p.ndim != lead + 1 else p
        chunks = []
        for i in range(lead):
            if p.shape[i] == 1:
                chunks.append((1,))
            elif not all(_known(c) for c in x.chunks[i]):
                raise _unknown_chunks(name, i, f"{pos_name} can be split like it")
            else:
                chunks.append(x.chunks[i])
        p = p.rechunk((*chunks, (1,)))
        return da.map_blocks(_rotate_block, x, p, kernel=kernel, dtype=x.dtype, meta=x._meta)

    def map_heads(self, kernel: Callable[[Array], Array], x: Array, *, axis: int, head_dim: int) -> Array:
        """``kernel(block)`` per block of whole heads along ``axis`` (re-chunked where a chunk
        cuts a head)."""
        chunks = x.chunks[axis]
        if not all(_known(c) for c in chunks):
            raise _unknown_chunks("x", axis, "it can be cut into whole heads")
        if any(c % head_dim for c in chunks):
            per = max(1, round(max(chunks) / head_dim)) * head_dim
            x = x.rechunk({axis: per})
        return da.map_blocks(kernel, x, dtype=x.dtype, meta=x._meta)

    # -- linear attention --------------------------------------------------------------------
    def scan(
        self,
        body: Callable[..., tuple[Any, Array | None]],
        carry: Any,
        src: _linear.Source,
        *,
        n: Any,
        block: int,
        additive: bool = False,
        sequential: bool = False,
        into: bool = False,
    ) -> tuple[Any, Array | None]:
        """A scan over the blocks of the sequence (those of the first array of ``src`` that runs
        along it; the others are cut like it): every block a part, so no task holds more than
        one block.  ``additive`` (the carry after a part is the carry before it plus the part's
        own, as without decay): every block's own carry at once, then their exclusive prefix sum
        (``dask.array.cumsum``, :meth:`scan_method`), then every block's outputs from its prefix;
        else a chain of blocks (each carry needs the one before: small tasks, the outputs still
        run in parallel).  ``into``: unused (nothing is written in place)."""
        ref = next((i for i in range(len(src.arrays)) if src.sliced(i, n)), None)
        if ref is None:  # one token: one part
            return body(carry, src)
        x0, ax0 = src.arrays[ref], src.axes[ref]
        assert x0 is not None
        chunks = x0.chunks[ax0]
        if not all(_known(c) for c in chunks):
            raise _unknown_chunks("q" if ref == 0 else "k", x0.ndim + ax0, "its blocks can be scanned")
        arrays = []
        for i, (x, ax) in enumerate(zip(src.arrays, src.axes, strict=True)):
            if x is not None and not isinstance(x, da.Array):
                x = da.asarray(x)
            if x is not None and src.sliced(i, n):
                x = x.rechunk({x.ndim + ax: chunks})  # pyright: ignore[reportArgumentType]
                if ax == -2:
                    x = _merge_last(x)
            arrays.append(x)
        src = _linear.Source(tuple(arrays), src.axes)
        bounds = [0, *np.cumsum(chunks).tolist()]
        parts = [src.take(bounds[i], bounds[i + 1], n) for i in range(len(chunks))]
        outs: list[Array] = []
        if additive and len(parts) > 1:
            owns = [body(None, part)[0] for part in parts]
            prefixes = self._prefixes(owns, carry)
            for part, pre in zip(parts, prefixes, strict=True):
                _, o = body(pre, part)
                if o is not None:
                    outs.append(o)
            total = prefixes[-1]
            last = owns[-1]
            carry = _linear.Carry(total.S + last.S, None if last.z is None else total.z + last.z, last.doc)
        else:
            for part in parts:
                carry, o = body(carry, part)
                if o is not None:
                    outs.append(o)
        if not outs:
            return carry, None
        if len(outs) == 1:
            return carry, outs[0]
        lead = np.broadcast_shapes(*(tuple(o.shape[:-2]) for o in outs))
        outs = [
            o if tuple(o.shape[:-2]) == lead else da.broadcast_to(o, (*lead, *o.shape[-2:])) for o in outs
        ]
        return carry, da.concatenate(outs, axis=-2)

    def _prefixes(self, owns: list[_linear.Carry], init: Any) -> list[_linear.Carry]:
        """The exclusive prefix sums of the blocks' own carries, from ``init`` (:meth:`scan_method`)."""
        lead = np.broadcast_shapes(*(tuple(c.S.shape[:-2]) for c in owns))
        S = da.stack([da.broadcast_to(c.S, (*lead, *c.S.shape[-2:])) for c in owns], axis=0)
        incl = da.cumsum(S, axis=0, method=self._scan)
        zs = None
        if owns[0].z is not None:
            z = da.stack(
                [da.broadcast_to(c.z, (*lead, c.z.shape[-1])) for c in owns if c.z is not None], axis=0
            )
            zs = da.cumsum(z, axis=0, method=self._scan)
        out = []
        for i in range(len(owns)):
            if i == 0:
                S0 = da.zeros_like(incl[0])
                z0 = None if zs is None else da.zeros_like(zs[0])
            else:
                S0 = incl[i - 1]
                z0 = None if zs is None else zs[i - 1]
            if init is not None:
                S0 = S0 + init.S
                z0 = None if z0 is None else z0 + init.z
            out.append(_linear.Carry(S0, z0, None))
        return out


def _rotate_block(xb: Array, pb: Array, kernel: Callable[[Array, Array], Array]) -> Array:
    return kernel(xb, pb[..., 0])
