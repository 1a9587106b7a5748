"""cubed: the generic backend, on cubed's namespace with its departures from the standard mended
(cubed 0.27).

cubed (a lazy, chunked array-API engine) runs rotary's generic code unchanged, except where its
namespace departs from the standard; each departure is mended here, in the one place, by calling
cubed's own functions in a form it handles:

- ``take(x, idx, axis=-1)`` indexes axis 0 instead (it builds ``(slice(None),) * axis``: a
  silent wrong answer for any negative axis), and an index as long as the axis and without
  repeats (a permutation: ``convert_layout``'s) reads as ``x`` itself, unpermuted, silently;
- ``cumulative_sum`` of a 1-D array needs ``axis`` (the standard makes it optional there);
- ``concat`` along a negative axis refuses arrays of different sizes on that axis, and misreads
  inputs cut in several chunks along the axis;
- ``clip`` needs both bounds (the standard makes both optional);
- ``reshape`` refuses irregular chunks, and makes them when it merges axes cut in several;
- ``asarray`` ignores ``dtype=`` for NumPy input, and refuses host data above its in-memory limit
  (1 MB): rotary's constants (the exact method's digit tables) go through ``cubed.from_array``.

Everything else is cubed's, untouched.  Values are never read eagerly (cubed cannot give
data-dependent shapes: :meth:`rotary._backends.Backend.is_concrete`).
"""

from __future__ import annotations

import types
from typing import Any

import numpy as np

__all__ = ["mend"]


class _Mended(types.ModuleType):
    """cubed's namespace, with the functions above mended (any other name is cubed's own)."""

    def __init__(self, xp: Any) -> None:
        super().__init__(xp.__name__)
        self._xp = xp

    def __getattr__(self, name: str) -> Any:
        return getattr(self._xp, name)

    def take(self, x: Any, indices: Any, /, *, axis: int | None = None) -> Any:
        if axis is None:
            return self._xp.take(x, indices)
        axis = axis % x.ndim
        n = indices.shape[0]
        if n is not None and n > 1 and n == x.shape[axis]:  # (a full-length index reads as x itself)
            parts = [self._xp.take(x, indices[:-1], axis=axis), self._xp.take(x, indices[-1:], axis=axis)]
            return self.concat(parts, axis=axis)
        return self._xp.take(x, indices, axis=axis)

    def reshape(self, x: Any, /, shape: Any, *, copy: Any = None) -> Any:
        return self._xp.reshape(_whole_from(x, _common_prefix(tuple(x.shape), tuple(shape))), shape)

    def cumulative_sum(self, x: Any, /, *, axis: int | None = None, **kw: Any) -> Any:
        return self._xp.cumulative_sum(x, axis=0 if axis is None and x.ndim == 1 else axis, **kw)

    def concat(self, arrays: Any, /, *, axis: int | None = 0) -> Any:
        arrays = list(arrays)
        if axis is None:
            return self._xp.concat(arrays, axis=None)
        ax = axis % arrays[0].ndim
        return self._xp.concat([_one_chunk(a, ax) for a in arrays], axis=ax)

    def clip(self, x: Any, /, min: Any = None, max: Any = None) -> Any:
        if min is not None:
            x = self._xp.maximum(x, self._xp.asarray(min, dtype=x.dtype, device=x.device))
        if max is not None:
            x = self._xp.minimum(x, self._xp.asarray(max, dtype=x.dtype, device=x.device))
        return x

    def asarray(self, obj: Any, /, *, dtype: Any = None, device: Any = None, copy: Any = None) -> Any:
        if isinstance(obj, np.ndarray) and obj.nbytes > 1 << 19:
            import cubed

            out = cubed.from_array(obj)
        else:
            out = self._xp.asarray(obj, dtype=dtype, device=device, copy=copy)
        return out if dtype is None or out.dtype == dtype else self._xp.astype(out, dtype)


def _one_chunk(a: Any, axis: int) -> Any:
    """``a`` in one chunk along ``axis``: cubed's ``concat`` misreads inputs cut in several there
    ("could not broadcast input array from shape (..., 4) into shape (..., 8)")."""
    if len(a.chunks[axis]) == 1:
        return a
    chunks = tuple(c if i != axis else (a.shape[axis],) for i, c in enumerate(a.chunks))
    return a.rechunk(chunks)


def _common_prefix(a: tuple[Any, ...], b: tuple[Any, ...]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _whole_from(a: Any, axis: int) -> Any:
    """``a`` in one chunk along every axis from ``axis`` on (the axes a reshape merges or
    splits): cubed's ``reshape`` refuses irregular chunks, and makes them when merging axes cut
    in several (its own ``concat`` leaves such)."""
    if all(len(c) == 1 for c in a.chunks[axis:]):
        return a
    return a.rechunk(tuple(c if i < axis else (a.shape[i],) for i, c in enumerate(a.chunks)))


#: The one mended namespace per cubed module (``array_namespace(x) is xp`` must hold, as for any
#: library; a wrapper, never an array).
_MENDED: dict[int, _Mended] = {}


def mend(xp: Any) -> Any:
    """cubed's namespace with the bugs above mended (the same object for the same module)."""
    if isinstance(xp, _Mended):
        return xp
    out = _MENDED.get(id(xp))
    if out is None or out._xp is not xp:
        out = _MENDED[id(xp)] = _Mended(xp)
    return out
