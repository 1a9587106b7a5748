"""The backend layer: the only place (with :mod:`rotary._lib._compat`) that names an array library.

:func:`backend_for` maps a namespace to its :class:`~rotary._backends._generic.Backend`:
the generic array-API one (array-api-strict, CuPy and any other library), or a subclass
with a library's fast paths and tracing rules (NumPy, torch, JAX, Dask).  A library's
module is imported only when arrays of that library are seen.
"""

from __future__ import annotations

from typing import Any

from .._lib._compat import library_name, register_mender
from .._lib._typing import Namespace
from ._generic import POSITION_TABLE_MAX, Backend, ConstantBuilder


def _mend_cubed(xp: Any) -> Any:
    from ._cubed import mend

    return mend(xp)


def _cubed_place(x: Any) -> Any:
    from ._cubed import place

    return place(x)


# (imports rotary's cubed module only when cubed arrays are seen)
register_mender("cubed", _mend_cubed, device_of=_cubed_place)

__all__ = ["POSITION_TABLE_MAX", "Backend", "ConstantBuilder", "backend_for"]

_BACKENDS: dict[str, Backend] = {}


def _make(xp: Namespace) -> Backend:
    # Plain import statements (not importlib): ``torch.compile`` runs them while tracing.
    lib = library_name(xp)
    if lib == "numpy":
        from ._numpy import NumpyBackend

        return NumpyBackend(xp)
    if lib == "torch":
        from ._torch import TORCH

        return TORCH
    if lib == "jax":
        from ._jax import JaxBackend

        return JaxBackend(xp)
    if lib == "dask":
        from ._dask import DaskBackend

        return DaskBackend(xp)
    if lib == "cupy":
        from ._generic import DeviceBackend

        return DeviceBackend(xp)
    return Backend(xp)


def backend_for(xp: Namespace) -> Backend:
    """The backend of namespace ``xp`` (one instance per library)."""
    name = xp.__name__
    if name == "array_api_compat.torch":
        # Served without the registry: ``torch.compile`` guards on every dict it reads, so a
        # registry filled by the first (compiled) call would force one recompile.
        from ._torch import TORCH

        return TORCH
    be = _BACKENDS.get(name)
    if be is None or be.xp is not xp:
        # (one namespace per library, except where a library makes several: each of marray's
        # ``masked_namespace`` calls makes its own, with its own array class)
        be = _BACKENDS[name] = _make(xp)
    return be
