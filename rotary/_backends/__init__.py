"""The backend layer: the only place (with :mod:`rotary._lib._compat`) that names an array library.

:func:`backend_for` maps a namespace to its :class:`~rotary._backends._generic.Backend`:
the generic array-API one (array-api-strict, CuPy and any other library), or a subclass
with a library's fast paths and tracing rules (NumPy, torch, JAX, Dask).  A library's
module is imported only when arrays of that library are seen (by :func:`rotary._lib._process.load`:
never half done in a forked child).
"""

from __future__ import annotations

from typing import Any

from .._lib._compat import library_name, register_mender
from .._lib._process import load
from .._lib._typing import Namespace
from ._generic import POSITION_TABLE_MAX, Backend, ConstantBuilder, DeviceBackend


def _mend_cubed(xp: Any) -> Any:
    return load(f"{__name__}._cubed").mend(xp)


def _cubed_place(x: Any) -> Any:
    return load(f"{__name__}._cubed").place(x)


# (imports rotary's cubed module only when cubed arrays are seen)
register_mender("cubed", _mend_cubed, device_of=_cubed_place)

__all__ = ["POSITION_TABLE_MAX", "Backend", "ConstantBuilder", "backend_for"]

_BACKENDS: dict[str, Backend] = {}


def _make(xp: Namespace) -> Backend:
    # (modules imported by ``_process.load``: under the lock a fork waits for)
    lib = library_name(xp)
    if lib == "torch":
        return _torch_backend()
    make: type[Backend] = Backend
    if lib == "numpy":
        make = load(f"{__name__}._numpy").NumpyBackend
    elif lib == "jax":
        make = load(f"{__name__}._jax").JaxBackend
    elif lib == "dask":
        make = load(f"{__name__}._dask").DaskBackend
    elif lib == "cupy":
        make = DeviceBackend
    return make(xp)


def _torch_backend() -> Backend:
    load(f"{__name__}._torch")  # (the first time: under the lock a fork waits for)
    from ._torch import TORCH  # (now a lookup, which torch.compile traces)

    return TORCH


def backend_for(xp: Namespace) -> Backend:
    """The backend of namespace ``xp`` (one instance per library)."""
    name = xp.__name__
    if name == "array_api_compat.torch":
        # Served without the registry: ``torch.compile`` guards on every dict it reads, so a
        # registry filled by the first (compiled) call would force one recompile.
        return _torch_backend()
    be = _BACKENDS.get(name)
    if be is None or be.xp is not xp:
        # (one namespace per library, except where a library makes several: each of marray's
        # ``masked_namespace`` calls makes its own, with its own array class)
        be = _BACKENDS[name] = _make(xp)
    return be
