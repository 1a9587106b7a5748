"""The kinds of array a user holds (issue 35): each served right or refused clearly.

A **kind** makes arrays of one sort from NumPy data (a dtype's byte order, a NumPy subclass, a
torch subclass, a standard version, a half-compliant library, an object that is no array) and says
what rotary must do with them: serve them (values equal to plain NumPy's float64 computation within
the dtype's rounding, and the result of the input's type, namespace and dtype) or refuse them with
one clear error (a regular expression of its message).  A new kind is one entry of :data:`KINDS`;
``tests/test_kinds.py`` runs every kind through :data:`CALLS`.  Libraries not installed in CI have
stand-ins here: ``wraparray`` libraries without ``isdtype`` or with an unhashable device, an
object with only ``__array__``, array-api-strict set to older standard versions.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

import rotary


@dataclasses.dataclass(frozen=True)
class Kind:
    """``make(a)``: an array of this kind holding NumPy array ``a`` (data or integer positions)."""

    make: Callable[[np.ndarray], Any]
    #: A module the kind needs (skipped without it).
    needs: str | None = None
    #: ``None``: served; else the regular expression of the one clear error the calls raise.
    refused: str | None = None
    #: The calls that raise it (default: all; a half-compliant library serves what it can).
    refused_calls: tuple[str, ...] | None = None
    #: The data's dtype (its rounding sets the tolerance).
    dtype: str = "float32"
    #: The context the calls run in (array-api-strict's flags).
    context: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext


def _strict(version: str) -> Kind:
    def make(a: np.ndarray) -> Any:
        import array_api_strict as xp

        return xp.asarray(a)

    def context() -> contextlib.AbstractContextManager[Any]:
        import array_api_strict as xp

        return xp.ArrayAPIStrictFlags(
            api_version=version, boolean_indexing=False, data_dependent_shapes=False, enabled_extensions=()
        )

    refused = None if version >= "2023.12" else rf"standard {version}; rotary needs 2023\.12"
    return Kind(make, needs="array_api_strict", refused=refused, context=context)


def _wraparray(name: str, **options: Any) -> Callable[[np.ndarray], Any]:
    def make(a: np.ndarray) -> Any:
        import sys

        lib = sys.modules.get(name)
        if lib is None:
            import wraparray

            lib = wraparray.make_library(name, **options)
        return lib.asarray(a)

    return make


_LOGGED: list[Any] = []


def _logged(a: np.ndarray) -> Any:
    """``a`` as a user's ``torch.Tensor`` subclass with ``__torch_function__`` (one class, in the
    user's module: not named ``torch.*``)."""
    import torch

    if not _LOGGED:

        class Logged(torch.Tensor):
            @classmethod
            def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
                return super().__torch_function__(func, types, args, kwargs or {})

        Logged.__module__ = "user_code"
        _LOGGED.append(Logged)
    return torch.from_numpy(a).as_subclass(_LOGGED[0])


class Foreign:
    """An array of a library rotary does not recognise (paddle, a heat DNDarray): shape, dtype
    and ``__array__``, no ``__array_namespace__``."""

    def __init__(self, a: np.ndarray) -> None:
        self._a = a
        self.shape, self.dtype, self.ndim = a.shape, a.dtype, a.ndim

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return np.asarray(self._a, dtype=dtype)


def _masked(a: np.ndarray) -> Any:
    if a.dtype.kind in "iu":
        return a  # (positions stay plain: masked positions are refused, tests/test_kinds.py)
    mask = np.zeros(a.shape, dtype=bool)
    mask[..., 1, 2] = True
    mask[..., -1, -1] = True
    out = np.ma.MaskedArray(a.copy(), mask=mask)
    out.data[mask] = 1e30  # (a masked value is never read: it must not reach an unmasked output)
    return out


#: The kinds: name -> :class:`Kind`.
KINDS: dict[str, Kind] = {
    "numpy": Kind(lambda a: a),
    "numpy big-endian float64": Kind(
        lambda a: a.astype(">f8") if a.dtype.kind == "f" else a, dtype="float64"
    ),
    "numpy big-endian float32": Kind(lambda a: a.astype(">f4") if a.dtype.kind == "f" else a),
    "numpy masked": Kind(_masked),
    "numpy matrix": Kind(lambda a: np.asmatrix(a.reshape(a.shape[0], -1)), refused=r"numpy\.matrix"),
    "torch": Kind(lambda a: __import__("torch").from_numpy(a), needs="torch"),
    "torch __torch_function__ subclass": Kind(_logged, needs="torch"),
    **{f"array-api-strict {v} restrictive": _strict(v) for v in ("2021.12", "2022.12", "2023.12", "2025.12")},
    "wraparray": Kind(_wraparray("wraparray._lib")),
    "wraparray without isdtype": Kind(
        _wraparray("wraparray.no_isdtype", lacking=("isdtype",)),
        refused=r"wraparray\.no_isdtype has no isdtype, which rotary needs",
        # (they check positions' dtype)
        refused_calls=("rotate", "RoPE.apply yarn", "learned.rotate", "RoPE.cos_sin"),
    ),
    "wraparray with an unhashable device": Kind(
        _wraparray("wraparray.unhashable", device=__import__("wraparray").UnhashableDevice())
    ),
    # (stand-ins of the half-compliant libraries the issue-35 probe found: quantity-array, mparray,
    # heat.array_api's any, mlx's arrays without device)
    "wraparray refusing device= (quantity-array)": Kind(_wraparray("wraparray.deviceless", deviceless=True)),
    "wraparray of object values, no DLPack": Kind(_wraparray("wraparray.objects", object_values=True)),
    # (served without reading a value: positions unchecked, as under a trace)
    "wraparray with no way to the host (mparray)": Kind(_wraparray("wraparray.no_host", no_host=True)),
    "wraparray whose any() departs (heat.array_api)": Kind(
        _wraparray("wraparray.broken_any", broken=("any",))
    ),
    "wraparray without searchsorted": Kind(
        _wraparray("wraparray.no_searchsorted", lacking=("searchsorted",))
    ),
    "wraparray arrays without device (mlx)": Kind(
        _wraparray("wraparray.no_device", device=None), refused=r"has no device attribute"
    ),
    "no array (__array__ only)": Kind(Foreign, refused=r"Foreign, which is not an array rotary recognises"),
}

_YARN = rotary.RoPE(16, scaling=rotary.YaRN(4.0, 8))


#: The calls every kind goes through: ``fn(x, k, pos, lengths) -> tuple of arrays``, all four of
#: the kind (the positions past the per-position table).
CALLS: dict[str, Callable[..., tuple[Any, ...]]] = {
    "rotate": lambda x, k, p, n: (rotary.rotate(x, p),),
    "RoPE.apply yarn": lambda x, k, p, n: _YARN.apply(x, k, p),
    "RoPE.cos_sin": lambda x, k, p, n: _YARN.cos_sin(p, full=True),
    "convert_layout": lambda x, k, p, n: (rotary.convert_layout(x, "half", "interleaved"),),
    "positions.from_lengths": lambda x, k, p, n: (rotary.positions.from_lengths(n, total=6),),
    "learned.rotate": lambda x, k, p, n: (rotary.learned.rotate(x, p, _freqs(x)),),
}


def _freqs(x: Any) -> Any:
    """Trained frequencies of ``x``'s library (small: angles of order 1 at positions near 4096,
    where float32 angles are as good as float64 ones)."""
    from rotary._lib._compat import array_namespace

    xp = array_namespace(x)
    return xp.asarray((rotary.inv_freq(16) / 4096).astype(np.float32))


def inputs() -> dict[str, np.ndarray]:
    r = np.random.default_rng(3)
    return {
        "x": r.standard_normal((1, 2, 6, 16)).astype(np.float32),
        "k": r.standard_normal((1, 1, 6, 16)).astype(np.float32),
        "p": np.arange(6) + 4093,
        "n": np.array([2, 4]),
    }
