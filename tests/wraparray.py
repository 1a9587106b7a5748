"""``wraparray``: a tiny array library written for the tests, implementing the array API standard
over NumPy arrays without being NumPy (its arrays are not ``numpy.ndarray``, its namespace is its
own).  rotary has no module for it: it must run on the generic backend, as any compliant library.

Every function of the standard is NumPy's (through ``array_api_compat.numpy``) with the library's
arrays unwrapped on the way in and wrapped on the way out; the array class forwards the standard's
operators and attributes the same way.

``wraparray.opaque`` is the same library with values that cannot be read: its arrays refuse
``bool``/``int``/``float``/``__index__``, ``__array__`` and DLPack, as a graph-building or remote
library's would, and its capabilities say so (no data-dependent shapes).  rotary must run on it
without reading a value; :func:`peek` is the tests' own way in.
"""

from __future__ import annotations

import sys
import types
from typing import Any

import array_api_compat.numpy as _np_xp
import numpy as np

__all__ = ["UnhashableDevice", "WArray", "make_library", "peek"]

__array_api_version__ = "2024.12"

_OPERATORS = (
    "__add__ __radd__ __sub__ __rsub__ __mul__ __rmul__ __truediv__ __rtruediv__ __floordiv__ "
    "__rfloordiv__ __mod__ __rmod__ __pow__ __rpow__ __matmul__ __rmatmul__ __and__ __rand__ __or__ "
    "__ror__ __xor__ __rxor__ __lshift__ __rlshift__ __rshift__ __rrshift__ __lt__ __le__ __gt__ "
    "__ge__ __eq__ __ne__"
).split()


def _unwrap(x: Any) -> Any:
    if isinstance(x, WArray):
        return x._a
    if isinstance(x, (list, tuple)):
        return type(x)(_unwrap(y) for y in x)
    return x


class WArray:
    """An array of a ``wraparray`` library (a NumPy array inside, never handed out)."""

    __slots__ = ("_a",)
    _lib: types.ModuleType

    def __init__(self, a: np.ndarray) -> None:
        self._a = a

    def __array_namespace__(self, *, api_version: str | None = None) -> Any:
        return self._lib

    dtype = property(lambda self: self._a.dtype)
    shape = property(lambda self: self._a.shape)
    ndim = property(lambda self: self._a.ndim)
    size = property(lambda self: self._a.size)
    device = property(lambda self: "cpu")
    T = property(lambda self: self._new(self._a.T))
    mT = property(lambda self: self._new(np.swapaxes(self._a, -1, -2)))

    def _new(self, a: Any) -> WArray:
        return type(self)(np.asarray(a))

    def to_device(self, device: Any, /, *, stream: Any = None) -> WArray:
        return self

    def __dlpack__(self, **kw: Any) -> Any:
        return self._a.__dlpack__(**kw)

    def __dlpack_device__(self) -> Any:
        return self._a.__dlpack_device__()

    def __getitem__(self, key: Any) -> WArray:
        return self._new(self._a[_unwrap(key)])

    def __setitem__(self, key: Any, value: Any) -> None:
        self._a[_unwrap(key)] = _unwrap(value)

    def __bool__(self) -> bool:
        return bool(self._a)

    def __int__(self) -> int:
        return int(self._a)

    def __float__(self) -> float:
        return float(self._a)

    def __index__(self) -> int:
        return int(self._a.__index__())

    def __len__(self) -> int:
        return len(self._a)

    def __repr__(self) -> str:
        return f"{self._lib.__name__}({self._a!r})"


def _binary(name: str) -> Any:
    def op(self: WArray, other: Any) -> Any:
        out = getattr(self._a, name)(_unwrap(other))
        return out if out is NotImplemented else self._new(out)

    return op


for _name in _OPERATORS:
    setattr(WArray, _name, _binary(_name))
for _name in ("__neg__", "__pos__", "__abs__", "__invert__"):
    setattr(WArray, _name, (lambda n: lambda self: self._new(getattr(self._a, n)()))(_name))


def _no_device(self: Any) -> Any:
    raise AttributeError(f"'{type(self).__name__}' object has no attribute 'device'")


def _no_dlpack(self: Any, **kw: Any) -> Any:
    raise BufferError("this library's DLPack export is broken")


def _refuse(self: Any, *args: Any, **kwargs: Any) -> Any:
    raise TypeError(f"{self._lib.__name__} arrays have no readable values")


class _Info:
    def __init__(self, readable: bool) -> None:
        self._readable = readable

    def capabilities(self) -> dict[str, Any]:
        return {
            "boolean indexing": self._readable,
            "data-dependent shapes": self._readable,
            "max dimensions": 64,
        }

    def default_device(self) -> str:
        return "cpu"

    def devices(self) -> list[str]:
        return ["cpu"]

    def default_dtypes(self, *, device: Any = None) -> dict[str, Any]:
        return _np_xp.__array_namespace_info__().default_dtypes()

    def dtypes(self, *, device: Any = None, kind: Any = None) -> dict[str, Any]:
        return _np_xp.__array_namespace_info__().dtypes(kind=kind)


class UnhashableDevice:
    """A device object that cannot be hashed (``__eq__`` without ``__hash__``), as some libraries'."""

    __hash__ = None  # type: ignore[assignment]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, UnhashableDevice)

    def __repr__(self) -> str:
        return "UnhashableDevice()"


def make_library(
    name: str,
    *,
    readable: bool = True,
    lacking: tuple[str, ...] = (),
    device: Any = "cpu",
    version: str = __array_api_version__,
    deviceless: bool = False,
    object_values: bool = False,
    no_host: bool = False,
    broken: tuple[str, ...] = (),
) -> types.ModuleType:
    """A new array library ``name`` (a module object, registered in ``sys.modules``) with its own
    array class; ``readable=False``: values that cannot be read.  Departures from the standard, as
    half-compliant libraries have them: ``lacking`` functions it does not have; ``device`` its one
    device object (``None``: its arrays have no ``device`` attribute, mlx's); ``deviceless``: its
    functions refuse ``device=`` (quantity-array's); ``object_values``: no DLPack, and its
    ``__array__`` gives an object array of Python numbers; ``no_host``: no DLPack and no
    ``__array__`` (mparray's: NumPy reads it as a 0-d object array); ``broken`` functions raise
    ``TypeError`` (heat.array_api's ``any``)."""
    lib = types.ModuleType(name, f"wraparray library {name!r}")
    attrs: dict[str, Any] = {"__slots__": (), "_lib": lib}
    if device is not None:
        attrs["device"] = property(lambda self: device)
    cls: type[WArray] = type(f"WArray_{name.replace('.', '_')}", (WArray,), attrs)
    if device is None:
        cls.device = property(_no_device)  # type: ignore[assignment]
    if not readable:
        for dunder in ("__bool__", "__int__", "__float__", "__index__", "__dlpack__", "__array__", "__len__"):
            setattr(cls, dunder, _refuse)
    if no_host:
        cls.__dlpack__ = _no_dlpack  # type: ignore[method-assign]
        cls.__array__ = None  # type: ignore[attr-defined,assignment]
        cls.__len__ = _refuse  # type: ignore[method-assign]
    if object_values:
        cls.__dlpack__ = _no_dlpack  # type: ignore[method-assign]
        cls.__array__ = lambda self, dtype=None, copy=None: np.array(self._a.tolist(), dtype=object)  # type: ignore[attr-defined]

    def wrap(x: Any) -> Any:
        if isinstance(x, (np.ndarray, np.generic)):
            return cls(np.asarray(x))
        if isinstance(x, tuple):
            return tuple(wrap(y) for y in x)
        if isinstance(x, list):
            return [wrap(y) for y in x]
        return x

    def function(fname: str) -> Any:
        f = getattr(_np_xp, fname)

        def call(*args: Any, **kwargs: Any) -> Any:
            if fname in broken:
                raise TypeError(f"{fname}() got an unexpected keyword argument 'keepdim'")
            if kwargs.pop("device", None) is not None and deviceless:
                raise NotImplementedError("device argument is not implemented")
            return wrap(f(*_unwrap(args), **{k: _unwrap(v) for k, v in kwargs.items()}))

        call.__name__ = fname
        return call

    def getattr_(attr: str) -> Any:
        if attr.startswith("__") or attr in lacking:
            raise AttributeError(attr)
        value = getattr(_np_xp, attr)
        if isinstance(value, types.FunctionType) or (callable(value) and not isinstance(value, type)):
            return function(attr)
        return value  # dtypes, constants

    info = _Info(readable)
    lib.__dict__.update(
        __getattr__=getattr_,
        __array_namespace_info__=lambda: info,
        __array_api_version__=version,
        WArray=cls,
    )
    sys.modules[name] = lib
    return lib


def peek(x: WArray) -> np.ndarray:
    """The NumPy array inside ``x`` (the tests' own way in, also for opaque arrays)."""
    return np.asarray(x._a)


_default = make_library("wraparray._lib")
opaque = make_library("wraparray.opaque", readable=False)


def __getattr__(name: str) -> Any:  # the module itself is the readable library's namespace
    if name.startswith("__"):
        raise AttributeError(name)
    return getattr(_default, name)


def __array_namespace_info__() -> Any:
    return _default.__array_namespace_info__()
