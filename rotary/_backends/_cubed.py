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

And one addition: cubed refuses to mix arrays of two ``Spec`` (executor, memory, storage) in one
computation, so the device rotary creates arrays on beside ``x`` is a :class:`Place`, ``x``'s
device *and* ``Spec``; the mended creation functions take it as ``device=``.  Arrays made with an
explicit ``spec=``, or under ``cubed.config.set(...)``, get rotary's constants made with that
``Spec``, and the cache keeps those of each ``Spec`` apart.

Everything else is cubed's, untouched.  Values are never read eagerly (cubed cannot give
data-dependent shapes: :meth:`rotary._backends.Backend.is_concrete`).
"""

from __future__ import annotations

import types
from typing import Any

import numpy as np

__all__ = ["Place", "mend", "place"]


class Place:
    """Where a cubed array lives and is computed: its ``device`` and its ``spec`` (equal when
    both are; hashable though ``cubed.Spec`` is not)."""

    __slots__ = ("device", "spec")

    def __init__(self, device: Any, spec: Any) -> None:
        self.device = device
        self.spec = spec

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Place) and self.device == other.device and self.spec == other.spec

    def __hash__(self) -> int:
        sp = self.spec
        return hash((self.device, sp.work_dir, sp.allowed_mem, sp.reserved_mem, type(sp.executor)))

    def __repr__(self) -> str:
        return f"{self.device!r} ({self.spec!r})"


def place(x: Any) -> Place:
    """The :class:`Place` of cubed array ``x``."""
    return Place(x.device, x.spec)


def _where(device: Any) -> dict[str, Any]:
    """cubed's keywords for ``device=`` (a :class:`Place` or a plain device)."""
    if isinstance(device, Place):
        return {"device": device.device, "spec": device.spec}
    return {"device": device}


class _Info:
    """cubed's ``__array_namespace_info__()``, taking a :class:`Place` as ``device=``."""

    def __init__(self, info: Any) -> None:
        self._info = info

    def __getattr__(self, name: str) -> Any:
        return getattr(self._info, name)

    def default_dtypes(self, *, device: Any = None) -> Any:
        return self._info.default_dtypes(device=_where(device)["device"])

    def dtypes(self, *, device: Any = None, kind: Any = None) -> Any:
        return self._info.dtypes(device=_where(device)["device"], kind=kind)


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
            x = self._xp.maximum(x, self.asarray(min, dtype=x.dtype, device=place(x)))
        if max is not None:
            x = self._xp.minimum(x, self.asarray(max, dtype=x.dtype, device=place(x)))
        return x

    def asarray(self, obj: Any, /, *, dtype: Any = None, device: Any = None, copy: Any = None) -> Any:
        where = _where(device)
        if isinstance(obj, np.ndarray) and obj.nbytes > 1 << 19:
            import cubed

            out = cubed.from_array(obj, spec=where.get("spec"))
        else:
            out = self._xp.asarray(obj, dtype=dtype, copy=copy, **where)
        return out if dtype is None or out.dtype == dtype else self._xp.astype(out, dtype)

    # -- device= as a Place ---------------------------------------------------------------------
    def __array_namespace_info__(self) -> _Info:
        return _Info(self._xp.__array_namespace_info__())

    def arange(
        self, start: Any, /, stop: Any = None, step: Any = 1, *, dtype: Any = None, device: Any = None
    ) -> Any:
        return self._xp.arange(start, stop, step, dtype=dtype, **_where(device))

    def linspace(
        self,
        start: Any,
        stop: Any,
        /,
        num: int,
        *,
        dtype: Any = None,
        device: Any = None,
        endpoint: bool = True,
    ) -> Any:
        return self._xp.linspace(start, stop, num, dtype=dtype, endpoint=endpoint, **_where(device))

    def eye(
        self, n_rows: int, n_cols: Any = None, /, *, k: int = 0, dtype: Any = None, device: Any = None
    ) -> Any:
        return self._xp.eye(n_rows, n_cols, k=k, dtype=dtype, **_where(device))

    def empty(self, shape: Any, *, dtype: Any = None, device: Any = None) -> Any:
        return self._xp.empty(shape, dtype=dtype, **_where(device))

    def zeros(self, shape: Any, *, dtype: Any = None, device: Any = None) -> Any:
        return self._xp.zeros(shape, dtype=dtype, **_where(device))

    def ones(self, shape: Any, *, dtype: Any = None, device: Any = None) -> Any:
        return self._xp.ones(shape, dtype=dtype, **_where(device))

    def full(self, shape: Any, fill_value: Any, *, dtype: Any = None, device: Any = None) -> Any:
        return self._xp.full(shape, fill_value, dtype=dtype, **_where(device))

    def empty_like(self, x: Any, /, *, dtype: Any = None, device: Any = None) -> Any:
        return self._xp.empty_like(x, dtype=dtype, **_where(device))

    def zeros_like(self, x: Any, /, *, dtype: Any = None, device: Any = None) -> Any:
        return self._xp.zeros_like(x, dtype=dtype, **_where(device))

    def ones_like(self, x: Any, /, *, dtype: Any = None, device: Any = None) -> Any:
        return self._xp.ones_like(x, dtype=dtype, **_where(device))

    def full_like(self, x: Any, /, fill_value: Any, *, dtype: Any = None, device: Any = None) -> Any:
        return self._xp.full_like(x, fill_value, dtype=dtype, **_where(device))

    def astype(self, x: Any, dtype: Any, /, *, copy: bool = True, device: Any = None) -> Any:
        return self._xp.astype(x, dtype, copy=copy, device=_where(device)["device"])


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
