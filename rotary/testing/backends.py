"""The backends ``rotary`` is tested on, as one registry shared by the test suite,
the conformance suite and the benchmarks.

Each :class:`Backend` knows how to move a NumPy array onto itself (``asarray``),
back (``to_numpy``), and which float dtypes it has.  ``available()`` lists those
whose library is installed (CuPy only with a working GPU).  Select a subset with
the environment variable ``ROTARY_BACKENDS`` (comma separated names).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from .._compat import to_numpy as _to_numpy

__all__ = ["ALL_BACKENDS", "Backend", "available", "backend_params", "get"]


@dataclasses.dataclass(frozen=True)
class Backend:
    """One array library (optionally on one device) to run ``rotary`` on."""

    name: str
    module: str
    _make_xp: Callable[[], Any] = dataclasses.field(repr=False)
    _device: Callable[[], Any] = dataclasses.field(repr=False, default=lambda: None)
    readonly: bool = False
    lazy: bool = False
    float64: bool = True

    @property
    def xp(self) -> Any:
        """The array-API namespace (array_api_compat-wrapped where needed)."""
        return self._make_xp()

    @property
    def device(self) -> Any:
        return self._device()

    def dtype(self, name: str) -> Any:
        """Dtype object by name: float16, bfloat16, float32, float64, int32, int64."""
        if name == "bfloat16":
            if self.module == "torch":
                import torch

                return torch.bfloat16
            if self.module == "jax":
                import jax.numpy as jnp

                return jnp.bfloat16
            raise ValueError(f"{self.name} has no bfloat16")
        return getattr(self.xp, name)

    def float_dtypes(self) -> list[str]:
        """Floating dtype names this backend supports."""
        out = ["float32"]
        if self.float64:
            out.append("float64")
        if self.module in ("torch", "jax", "numpy", "cupy"):
            out.append("float16")
        if self.module in ("torch", "jax"):
            out.append("bfloat16")
        return out

    def asarray(self, a: Any, dtype: str | None = None) -> Any:
        """A copy of NumPy data ``a`` as an array of this backend (on its device)."""
        a = np.asarray(a)
        if dtype is None:
            dtype = a.dtype.name
        if self.module == "numpy":
            out = np.array(a, dtype=dtype)
            if self.readonly:
                out.setflags(write=False)
            return out
        if self.module == "dask":
            import dask.array as da

            arr = np.asarray(a, dtype=dtype)
            chunks = tuple(max(1, s // 2) for s in arr.shape[:-1]) + arr.shape[-1:] if arr.ndim else ()
            return da.from_array(arr, chunks=chunks) if arr.ndim else da.from_array(arr)
        if self.module == "torch" and dtype == "bfloat16":
            import torch

            return torch.asarray(a.astype(np.float32), device=self.device).to(torch.bfloat16)
        if self.module == "jax" and dtype == "bfloat16":
            import jax.numpy as jnp

            return jnp.asarray(a.astype(np.float32)).astype(jnp.bfloat16)
        if self.module == "jax" and dtype == "int64" and not self.float64:
            dtype = "int32"  # JAX without x64 has no int64 (it would truncate with a warning)
        xp = self.xp
        src = a.astype(np.float32) if dtype == "bfloat16" else a
        return xp.asarray(src, dtype=self.dtype(dtype), device=self.device)

    def to_numpy(self, x: Any) -> np.ndarray:
        """Host NumPy copy of an array of this backend (bfloat16 widened to float32)."""
        return _to_numpy(x)


def _compat(name: str) -> Callable[[], Any]:
    def make() -> Any:
        return importlib.import_module(f"array_api_compat.{name}")

    return make


def _strict() -> Any:
    return importlib.import_module("array_api_strict")


def _strict_device(name: str) -> Callable[[], Any]:
    def dev() -> Any:
        import array_api_strict

        return array_api_strict.Device(name)

    return dev


def _jax() -> Any:
    import jax.numpy as jnp

    return jnp


def _jax_x64() -> bool:
    try:
        import jax

        return bool(jax.config.jax_enable_x64)
    except Exception:
        return False


def _torch_cuda() -> Any:
    import torch

    return torch.device("cuda")


ALL_BACKENDS: tuple[Backend, ...] = (
    Backend("numpy", "numpy", _compat("numpy")),
    Backend("numpy_readonly", "numpy", _compat("numpy"), readonly=True),
    Backend("array_api_strict", "array_api_strict", _strict),
    Backend("array_api_strict_device1", "array_api_strict", _strict, _strict_device("device1")),
    Backend(
        "array_api_strict_no_float64",
        "array_api_strict",
        _strict,
        _strict_device("no_float64"),
        float64=False,
    ),
    Backend("torch", "torch", _compat("torch")),
    Backend("torch_cuda", "torch", _compat("torch"), _torch_cuda),
    Backend("jax", "jax", _jax),
    Backend("dask", "dask", _compat("dask.array"), lazy=True),
    Backend("cupy", "cupy", _compat("cupy")),
)


def _installed(b: Backend) -> bool:
    mod = {"dask": "dask.array"}.get(b.module, b.module)
    try:
        if importlib.util.find_spec(mod.split(".")[0]) is None:
            return False
    except (ImportError, ValueError):
        return False
    if b.name == "torch_cuda":
        import torch

        return bool(torch.cuda.is_available())
    if b.module == "cupy":
        try:
            import cupy

            return cupy.cuda.runtime.getDeviceCount() > 0
        except Exception:
            return False
    if b.name == "array_api_strict_no_float64":
        import array_api_strict

        devices = array_api_strict.__array_namespace_info__().devices()
        return any("no_float64" in str(d) for d in devices)
    return True


def available(names: str | None = None) -> list[Backend]:
    """Installed backends, optionally filtered by ``names`` or ``$ROTARY_BACKENDS``."""
    names = names if names is not None else os.environ.get("ROTARY_BACKENDS")
    wanted = None if not names else {n.strip() for n in names.split(",") if n.strip()}
    out = []
    for b in ALL_BACKENDS:
        if wanted is not None and b.name not in wanted:
            continue
        if not _installed(b):
            continue
        if b.module == "jax":
            b = dataclasses.replace(b, float64=_jax_x64())
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
    those not installed or usable here are marked skip (so the matrix shows them)."""
    import pytest  # test-only helper

    avail = {b.name: b for b in available()}
    selected = os.environ.get("ROTARY_BACKENDS")
    wanted = None if not selected else {n.strip() for n in selected.split(",")}
    out = []
    for b in ALL_BACKENDS:
        if wanted is not None and b.name not in wanted:
            continue
        if b.name in avail:
            out.append(pytest.param(avail[b.name], id=b.name))
        else:
            skip = pytest.mark.skip(reason=f"{b.name} not installed/usable")
            out.append(pytest.param(b, id=b.name, marks=skip))
    return out
