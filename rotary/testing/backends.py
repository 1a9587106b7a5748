"""The backends ``rotary`` is tested on, as one registry shared by the test suite, the
conformance suite and the benchmarks.

Each :class:`Backend` is described by *capabilities* (lazy, writeable, float64, float16,
bfloat16, int64, device) rather than by its name, moves a NumPy array onto itself
(``asarray``) and back (``to_numpy``).  :func:`available` lists those whose library is
installed (CuPy and torch CUDA only with a working GPU).  Select a subset with the
environment variable ``ROTARY_BACKENDS`` (comma separated names).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.util
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from .._lib._compat import to_numpy as _to_numpy

__all__ = ["ALL_BACKENDS", "Backend", "available", "backend_params", "get", "library_path", "to_numpy"]


def to_numpy(x: Any) -> np.ndarray:
    """A host NumPy copy of an array of any library rotary runs on (bfloat16 widened to
    float32): the caller's own, writeable, sharing memory with nothing.

    Examples
    --------
    >>> import numpy as np
    >>> from rotary.testing import to_numpy
    >>> a = np.arange(3)
    >>> b = to_numpy(a)
    >>> b[0] = 7
    >>> int(a[0])
    0
    """
    return np.array(_to_numpy(x), copy=True)


@dataclasses.dataclass(frozen=True)
class Backend:
    """One array library (optionally on one device) to run ``rotary`` on, and what it can do."""

    name: str
    module: str
    _make_xp: Callable[[], Any] = dataclasses.field(repr=False)
    _device: Callable[[], Any] = dataclasses.field(repr=False, default=lambda: None)
    #: Arrays can be written in place (NumPy read-only arrays, JAX and Dask: no).
    writeable: bool = True
    #: Arrays are lazy graphs: values must never be computed while a graph is built.
    lazy: bool = False
    #: Has float64.
    float64: bool = True
    #: Has int64.
    int64: bool = True
    float16: bool = True
    bfloat16: bool = False
    #: Values of its arrays can be read eagerly on the host (rotary checks positions there).
    host_values: bool = True
    #: Supports ``jax.jit`` / ``torch.compile`` style tracing (which tests apply).
    tracer: str | None = None
    #: Arrays live on a GPU (``pytest -m gpu`` selects these).
    gpu: bool = False
    #: Every computation is planned and run by an executor, a twentieth of a second or more each
    #: (cubed): the default test run checks it through the tests marked ``slow_backends_too``
    #: (the conformance columns among them: every public function), and tests that repeat one
    #: check over many calls or dtypes run fewer of them there; name it in ``$ROTARY_BACKENDS``
    #: to run every test on it.
    slow: bool = False

    @property
    def xp(self) -> Any:
        """The array-API namespace (array_api_compat-wrapped where needed)."""
        return self._make_xp()

    @property
    def device(self) -> Any:
        return self._device()

    @property
    def readonly(self) -> bool:
        return not self.writeable

    def dtype(self, name: str) -> Any:
        """Dtype object by name: float16, bfloat16, float32, float64, int32, int64..."""
        if name == "bfloat16":
            if not self.bfloat16:
                raise ValueError(f"{self.name} has no bfloat16")
            return importlib.import_module("torch" if self.module == "torch" else "jax.numpy").bfloat16
        return getattr(self.xp, name)

    def float_dtypes(self) -> list[str]:
        """Floating dtype names this backend supports."""
        return [
            n for n in ("float32", "float64", "float16", "bfloat16") if n == "float32" or getattr(self, n)
        ]

    def int_dtype(self) -> str:
        """The widest integer dtype (int64 where it exists, else int32)."""
        return "int64" if self.int64 else "int32"

    def asarray(self, a: Any, dtype: str | None = None) -> Any:
        """A copy of NumPy data ``a`` as an array of this backend (on its device)."""
        a = np.asarray(a)
        if dtype is None:
            dtype = a.dtype.name
        if dtype == "int64" and not self.int64:
            dtype = "int32"  # no int64 here (JAX without x64 would truncate with a warning)
        if self.module == "numpy":
            out = np.array(a, dtype=dtype)
            if not self.writeable:
                out.setflags(write=False)
            return out
        if self.module == "dask":
            import dask.array as da

            arr = np.asarray(a, dtype=dtype)
            if not arr.ndim:
                return da.from_array(arr)
            chunks = (*(max(1, s // 2) for s in arr.shape[:-1]), arr.shape[-1])
            return da.from_array(arr, chunks=chunks)  # pyright: ignore[reportArgumentType]
        if self.module == "cubed":  # (its asarray refuses host data above 1 MB)
            import cubed

            return cubed.from_array(np.asarray(a, dtype=dtype))
        if dtype == "bfloat16":
            return self.xp.astype(
                self.xp.asarray(a.astype(np.float32), device=self.device), self.dtype("bfloat16")
            )
        return self.xp.asarray(a, dtype=self.dtype(dtype), device=self.device)  # pyright: ignore[reportArgumentType]

    def to_numpy(self, x: Any) -> np.ndarray:
        """Host NumPy copy of an array of this backend (bfloat16 widened to float32)."""
        return to_numpy(x)

    def unsupported(self) -> str | None:
        """Why rotary cannot run on this backend here (its namespace implements a standard
        version older than rotary's oldest), or ``None``."""
        from .._lib._compat import check_standard

        try:
            check_standard(self.xp)
        except TypeError as e:
            return f"unsupported standard version: {e}"
        return None


def _module(name: str) -> Callable[[], Any]:
    return functools.partial(importlib.import_module, name)


def _compat(name: str) -> Callable[[], Any]:
    return _module(f"array_api_compat.{name}")


def _mended(name: str) -> Any:
    """The namespace rotary uses for a library (cubed's with its departures mended)."""
    from .._lib._compat import as_namespace

    return as_namespace(importlib.import_module(name))


@functools.lru_cache(maxsize=1)
def _marray_numpy() -> Any:
    """marray's masked namespace over NumPy, made once (each call makes a new array class)."""
    return importlib.import_module("marray").masked_namespace(np)


def _strict(name: str, device: str | None = None, *, float64: bool = True, int64: bool = True) -> Backend:
    """An array-api-strict backend (on one of its fake devices)."""

    def dev() -> Any:
        return importlib.import_module("array_api_strict").Device(device) if device else None

    mod = _module("array_api_strict")
    return Backend(name, "array_api_strict", mod, dev, float16=False, float64=float64, int64=int64)


ALL_BACKENDS: tuple[Backend, ...] = (
    Backend("numpy", "numpy", _compat("numpy")),
    Backend("numpy_readonly", "numpy", _compat("numpy"), writeable=False),
    _strict("array_api_strict"),
    _strict("array_api_strict_device1", "device1"),
    _strict("array_api_strict_no_float64", "no_float64", float64=False),
    _strict("array_api_strict_no_x64", "no_x64", float64=False, int64=False),  # like JAX without x64
    Backend("torch", "torch", _compat("torch"), bfloat16=True, tracer="torch.compile"),
    Backend(
        "torch_cuda",
        "torch",
        _compat("torch"),
        lambda: importlib.import_module("torch").device("cuda"),
        bfloat16=True,
        host_values=False,
        tracer="torch.compile",
        gpu=True,
    ),
    Backend("jax", "jax", _module("jax.numpy"), writeable=False, bfloat16=True, tracer="jax.jit"),
    Backend(
        "dask", "dask", _compat("dask.array"), writeable=False, lazy=True, float16=False, host_values=False
    ),
    Backend("cupy", "cupy", _compat("cupy"), host_values=False, gpu=True),
    # array-API libraries rotary has no module for (the generic backend; cubed's namespace mended)
    Backend(
        "cubed",
        "cubed",
        lambda: _mended("cubed"),
        writeable=False,
        lazy=True,
        float16=False,
        host_values=False,
        slow=True,
    ),
    Backend("marray", "marray", lambda: _marray_numpy(), float16=False),
)


def _installed(b: Backend) -> bool:
    try:
        if importlib.util.find_spec(b.module) is None:
            return False
    except (ImportError, ValueError):
        return False
    if b.name == "torch_cuda":
        import torch

        return bool(torch.cuda.is_available())
    if b.module == "cupy":
        try:
            import cupy

            return bool(cupy.cuda.runtime.getDeviceCount() > 0)
        except Exception:
            return False
    if b.name in ("array_api_strict_no_float64", "array_api_strict_no_x64"):
        import array_api_strict

        try:
            devices = array_api_strict.__array_namespace_info__().devices()
        except RuntimeError:  # (set to a standard version before 2023.12: no namespace info)
            return False
        return any(b.name.rsplit("_no_", 1)[1] in str(d) for d in devices)
    return True


def _selected(names: str | None) -> list[Backend]:
    """The backends named in ``names`` (comma separated; default ``$ROTARY_BACKENDS``, then all)."""
    names = names if names is not None else os.environ.get("ROTARY_BACKENDS")
    wanted = None if not names else {n.strip() for n in names.split(",") if n.strip()}
    if wanted is not None:
        unknown = wanted - {b.name for b in ALL_BACKENDS}
        if unknown:
            raise ValueError(f"unknown backends {sorted(unknown)}; known: {[b.name for b in ALL_BACKENDS]}")
    return [b for b in ALL_BACKENDS if wanted is None or b.name in wanted]


def available(names: str | None = None) -> list[Backend]:
    """Installed backends, optionally filtered by ``names`` or ``$ROTARY_BACKENDS``."""
    out = []
    for b in _selected(names):
        if not _installed(b):
            continue
        if b.module == "jax":
            jax = importlib.import_module("jax")
            x64 = bool(jax.config.jax_enable_x64)
            on_gpu = jax.default_backend() in ("gpu", "cuda", "rocm")
            b = dataclasses.replace(b, float64=x64, int64=x64, gpu=on_gpu, host_values=not on_gpu)
        out.append(b)
    return out


def get(name: str) -> Backend:
    """A backend by name (whether or not installed)."""
    for b in ALL_BACKENDS:
        if b.name == name:
            return b
    raise KeyError(f"unknown backend {name!r}; known: {[b.name for b in ALL_BACKENDS]}")


def backend_params() -> list[Any]:
    """``pytest.param`` per backend of ``$ROTARY_BACKENDS`` (default all), id'd by name;
    those not installed or usable here are marked skip (so the matrix shows them), those on a
    GPU are marked ``gpu`` (``pytest -m gpu`` runs the suite on the GPU backends only), slow
    ones not named in ``$ROTARY_BACKENDS`` are marked ``slow_backend`` (the suite's conftest
    runs them only in the tests marked ``slow_backends_too``)."""
    import pytest  # test-only helper

    avail = {b.name: b for b in available()}
    named = bool(os.environ.get("ROTARY_BACKENDS"))
    out = []
    for b in _selected(None):
        if b.name in avail:
            marks = [pytest.mark.gpu] if avail[b.name].gpu else []
            if avail[b.name].slow and not named:
                marks.append(pytest.mark.slow_backend)
            out.append(pytest.param(avail[b.name], id=b.name, marks=marks))
        else:
            out.append(
                pytest.param(b, id=b.name, marks=pytest.mark.skip(reason=f"{b.name} not installed/usable"))
            )
    return out


def library_path(xp: Any) -> str:
    """Which of rotary's code paths runs arrays of namespace (or library module) ``xp``:
    ``"numpy"``, ``"torch"``, ``"jax"``, ``"dask"`` (a module of fast paths and tracing rules),
    ``"generic"`` (the array-API code alone, as on any library rotary has no module for), or
    ``"generic (device)"`` (the same, with device transfers: CuPy).

    Examples
    --------
    >>> import numpy as np
    >>> from rotary.testing.backends import library_path
    >>> library_path(np)
    'numpy'
    """
    from .._backends import backend_for
    from .._backends._generic import Backend as _Generic
    from .._backends._generic import DeviceBackend
    from .._lib._compat import as_namespace, library_name

    be = backend_for(as_namespace(xp))
    if type(be) is _Generic:
        return "generic"
    if type(be) is DeviceBackend:
        return "generic (device)"
    return library_name(be.xp)
