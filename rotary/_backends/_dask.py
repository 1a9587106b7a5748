"""Dask: lazy graphs with one task per block, the kernel passed in by the caller.

Nothing here computes: values are never read while a graph is built.

* :meth:`DaskBackend.map_positions` runs a kernel (``RoPE.rotate`` of the caller) on every
  block of ``x`` with the matching block of positions.  The feature (last) axis must be
  whole in a block (a rotation mixes features across the head): an input chunked along it
  is merged into one chunk there.  Positions are re-chunked to ``x``'s blocks, never ``x``.
* :meth:`DaskBackend.map_heads` does the same for layout conversion (blocks of whole heads).
* :meth:`DaskBackend.causal_scan` is causal linear attention as a scan over blocks: every
  block of keys is summarised by its state (one task each), an exclusive cumulative sum of
  the block states hands each block the state of all earlier keys, and each block runs the
  chunked algorithm on its own tokens from it.  No block holds more than its own tokens.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Iterator
from typing import Any

import dask.array as da
import numpy as np

from .._lib._compat import array_namespace
from .._lib._typing import Array, Device, DType
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
    #: How :meth:`causal_scan` prefix-sums the block states (``dask.array.cumsum``'s method).
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
    def causal_scan(
        self,
        chunks: _linear.Chunk,
        init: _linear.State | None,
        *,
        size: int,
        eps: float,
        device: Device,
        out_dtype: DType,
    ) -> tuple[Array, _linear.State]:
        a, c, b, e, v = chunks
        nl = max(t.ndim for t in chunks) - 2
        nd = nl + 2
        a, c, b, e, v = (_merge_last(t[(None,) * (nd - t.ndim)]) for t in (a, c, b, e, v))
        # Leading axes: arrays not broadcast there share the chunks of the first that is not.
        for i in range(nl):
            ref = next((t for t in (a, c, b, e, v) if t.shape[i] != 1), a)
            a, c, b, e, v = (_align(t, ref, i) for t in (a, c, b, e, v))
        b, e, v = (_align(t, a, nl) for t in (b, e, v))  # keys' blocks = queries' blocks
        f, dv = b.shape[-1], v.shape[-1]
        sdt = a.dtype
        kv = _index(nl)
        packed = da.blockwise(
            _block_state,
            (*kv, "t", "f", "g"),
            b,
            (*_index(nl), "t", "x"),
            e,
            (*_index(nl), "t", "x"),
            v,
            (*_index(nl), "t", "y"),
            adjust_chunks={"t": 1},
            new_axes={"f": f, "g": dv + 1},
            align_arrays=False,
            concatenate=True,
            dtype=sdt,
            meta=np.empty((0,) * (nd + 1), dtype=sdt),
        )
        nb = packed.shape[nl]
        sel = (slice(None),) * nl
        incl = da.cumsum(packed, axis=nl, method=self._scan)
        head, body = (*sel, slice(0, 1)), (*sel, slice(0, nb - 1))
        first = da.zeros_like(packed[head])
        excl = da.concatenate([first, incl[body]], axis=nl) if nb > 1 else first
        if init is None:
            init = _linear.State(da.zeros((f, dv), dtype=sdt), da.zeros((f,), dtype=sdt))
        S0, z0 = (_single_chunks(t, nd - 2 + r) for t, r in ((init.S, 2), (init.z, 1)))
        for i in range(nl):
            S0, z0 = _align(S0, a, i), _align(z0, a, i)
        out = da.blockwise(
            functools.partial(_block_causal, size=size, eps=eps, dv=dv, out_dtype=out_dtype),
            (*_index(nl), "s", "y"),
            a,
            (*_index(nl), "s", "x"),
            c,
            (*_index(nl), "s", "x"),
            b,
            (*_index(nl), "s", "x"),
            e,
            (*_index(nl), "s", "x"),
            v,
            (*_index(nl), "s", "y"),
            excl,
            (*kv, "s", "f", "g"),
            S0,
            (*kv, "f", "y"),
            z0,
            (*kv, "f"),
            align_arrays=False,
            concatenate=True,
            dtype=out_dtype,
            meta=np.empty((0,) * nd, dtype=out_dtype),
        )
        end = (*sel, nb - 1)
        last = incl[end]
        return out, _linear.State(S0 + last[..., :dv], z0 + last[..., dv])


def _single_chunks(t: Any, nd: int) -> Array:
    """A state array as Dask with ``nd`` axes and one chunk along its feature axes."""
    t = da.asarray(t)
    return t[(None,) * (nd - t.ndim)]


def _rotate_block(xb: Array, pb: Array, kernel: Callable[[Array, Array], Array]) -> Array:
    return kernel(xb, pb[..., 0])


def _align(t: Array, ref: Array, axis: int) -> Array:
    if t.shape[axis] == 1 or t.chunks[axis] == ref.chunks[axis]:
        return t
    if not all(_known(n) for n in ref.chunks[axis]):
        raise _unknown_chunks("q", axis, "k and v can be split like it")
    return t.rechunk({axis: ref.chunks[axis]})


def _block_state(b: Array, e: Array, v: Array) -> Array:
    xp = array_namespace(b)
    st = _linear.chunk_state(_linear.Chunk(b, b, b, e, v), xp)
    z = xp.broadcast_to(st.z, (*st.S.shape[:-2], st.z.shape[-1]))
    return xp.concat([st.S, z[..., None]], axis=-1)[..., None, :, :]


def _block_causal(
    a: Array,
    c: Array,
    b: Array,
    e: Array,
    v: Array,
    prefix: Array,
    S0: Array,
    z0: Array,
    *,
    size: int,
    eps: float,
    dv: int,
    out_dtype: DType,
) -> Array:
    from . import backend_for

    xp = array_namespace(a)
    p = prefix[..., 0, :, :]
    init = _linear.State(S0 + p[..., :dv], z0 + p[..., dv])
    be = backend_for(xp)
    out, _ = be.causal_scan(
        _linear.Chunk(a, c, b, e, v),
        init,
        size=size,
        eps=eps,
        device=be.creation_device(a),
        out_dtype=out_dtype,
    )
    return out
