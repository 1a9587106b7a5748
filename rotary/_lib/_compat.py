"""Array-namespace plumbing, and the one module besides :mod:`rotary._backends` that names
array libraries (to recognise their arrays without importing them).

Nothing here imports a framework at module import time.  ``array_api_compat`` does the
dispatch, except for torch tensors, which are served directly: ``array_api_compat``'s
dispatch is ``functools.lru_cache``-d, which ``torch.compile`` warns about on every trace.
"""

from __future__ import annotations

import importlib
from typing import Any

import array_api_compat
import numpy as np

from ._typing import Array, Device, Namespace

__all__ = [
    "array_namespace",
    "as_namespace",
    "capability",
    "device",
    "index_dtype",
    "is_array",
    "is_host_positions",
    "library_name",
    "register_mender",
    "to_numpy",
]

#: Top-level modules of the array libraries whose arrays ``is_array`` recognises by type.
_ARRAY_MODULES = ("numpy", "torch", "cupy", "dask", "jax", "jaxlib", "sparse", "array_api_strict", "ndonnx")

#: Namespace ``__name__`` -> library name.
_LIBRARIES = {
    "numpy": "numpy",
    "array_api_compat.numpy": "numpy",
    "torch": "torch",
    "array_api_compat.torch": "torch",
    "jax.numpy": "jax",
    "cupy": "cupy",
    "array_api_compat.cupy": "cupy",
    "dask.array": "dask",
    "array_api_compat.dask.array": "dask",
    "array_api_strict": "array_api_strict",
}


def _module(x: object) -> str:
    """The array library of ``x``'s type (one of :data:`_ARRAY_MODULES`), else its module.

    Slices and comparisons only: ``torch.compile`` traces neither ``str.find`` nor ``str.split``
    (``nn.Parameter``'s module is ``torch.nn.parameter``)."""
    mod = type(x).__module__
    for name in _ARRAY_MODULES:
        if mod == name or mod[: len(name) + 1] == name + ".":
            return name
    return mod


def is_array(x: object) -> bool:
    """True for an array of any supported library (NumPy scalars included)."""
    if x is None or isinstance(x, (int, float, list, tuple)):
        return False
    mod = _module(x)
    if mod == "numpy":
        return isinstance(x, (np.ndarray, np.generic))
    if mod in _ARRAY_MODULES:
        return hasattr(x, "shape") and hasattr(x, "dtype")
    return hasattr(x, "__array_namespace__")


def is_host_positions(x: object) -> bool:
    """True for values that live on the host and may be converted to any library:
    Python numbers and sequences, and NumPy arrays and scalars."""
    return not is_array(x) or _module(x) == "numpy"


def library_name(xp: Namespace) -> str:
    """Short name of a namespace: numpy, torch, jax, cupy, dask or array_api_strict."""
    name = getattr(xp, "__name__", "")
    return _LIBRARIES.get(name, name)


#: Namespace of each array type seen (a handful of types): the common case, all arguments of
#: one type, costs one dictionary lookup instead of array_api_compat's dispatch.  A type and a
#: module: nothing a trace or a mode makes can enter it (see :mod:`rotary._lib._cache`).
_BY_TYPE: dict[type, Namespace] = {}
_MEMO_TYPES = [True]


def memo_types(*, enabled: bool) -> None:
    """Empty the namespace memo, and keep filling it or not (``rotary._lib._cache`` owns the
    switch: :func:`~rotary._lib._cache.clear_cache` and the benchmarks' ``without``)."""
    _BY_TYPE.clear()
    _MEMO_TYPES[0] = enabled


def namespace_of(*arrays: Any, names: tuple[str, ...]) -> Namespace:
    """The namespace of ``arrays``, which must all be arrays (``TypeError`` naming the first that
    is not) of one library."""
    t = type(arrays[0])
    if t.__module__ == "torch" and all(type(a) is t for a in arrays[1:]):
        import array_api_compat.torch as torch_xp  # served directly (see the module docstring)

        return torch_xp
    hit = _BY_TYPE.get(t)
    if hit is not None and all(type(a) is t for a in arrays[1:]):
        return hit
    for name, a in zip(names, arrays, strict=True):
        if not is_array(a):
            raise TypeError(f"{name} must be an array of shape (..., head_dim), got {type(a).__name__}")
    return array_namespace(*arrays, names=names)


def array_namespace(*arrays: Any, names: tuple[str, ...] = ()) -> Namespace:
    """The array-API namespace shared by the arrays among ``arrays`` (others ignored).

    ``names`` label the arguments in the ``TypeError`` raised for arrays of different libraries.
    """
    one = None
    for a in arrays:
        if a is None:
            continue
        if one is None:
            one = type(a)
        elif type(a) is not one:
            one = None
            break
    if one is not None:
        hit = _BY_TYPE.get(one)
        if hit is not None:
            return hit
    real = [(i, a) for i, a in enumerate(arrays) if is_array(a)]
    if not real:
        return array_api_compat.array_namespace(np.empty(0))
    if all(_module(a) == "torch" for _, a in real):
        import array_api_compat.torch as torch_xp

        return torch_xp
    try:
        xp = array_api_compat.array_namespace(*(a for _, a in real))
    except TypeError:
        label = names or tuple(f"arg{i}" for i in range(len(arrays)))
        kinds = ", ".join(f"{label[i]}: {type(a).__module__}.{type(a).__name__}" for i, a in real)
        raise TypeError(
            f"arrays must all come from the same array library; got {kinds}. "
            "Convert them to one library first (positions may also be NumPy arrays or Python values)."
        ) from None
    xp = _mended(xp)
    if (
        one is not None
        and len(real) == len([a for a in arrays if a is not None])
        and len(_BY_TYPE) < 64
        and _MEMO_TYPES[0]
    ):
        _BY_TYPE[one] = xp
    return xp


#: Library name -> a function giving its namespace with a library's departures from the standard
#: mended (registered by the backend layer, which names the library: cubed).
_MENDERS: dict[str, Any] = {}


#: Library name -> a function giving the device rotary creates arrays on beside ``x`` (cubed:
#: its device and its ``Spec``), where ``x.device`` alone does not say.
_DEVICE_OF: dict[str, Any] = {}


def register_mender(library: str, mend: Any, *, device_of: Any = None) -> None:
    """Use ``mend(xp)`` for ``library``'s namespace wherever rotary looks one up (and
    ``device_of(x)`` for the device of its arrays, a value its mended namespace accepts as
    ``device=``)."""
    _MENDERS[library] = mend
    if device_of is not None:
        _DEVICE_OF[library] = device_of


def _mended(xp: Namespace) -> Namespace:
    mend = _MENDERS.get(getattr(xp, "__name__", ""))
    return xp if mend is None else mend(xp)


def as_namespace(xp: Any) -> Namespace:
    """An array-API namespace for ``xp``: the ``array_api_compat`` wrapper of a library module
    that is not one itself (``numpy``, ``torch``, ``cupy``, ``dask.array``)."""
    name = getattr(xp, "__name__", None)
    if not isinstance(name, str):
        raise TypeError(f"xp must be an array namespace (a module such as numpy or jax.numpy), got {xp!r}")
    # (import statements, not importlib: torch.compile traces these, and skips importlib)
    if name == "torch":
        import array_api_compat.torch as torch_xp

        return torch_xp
    if name == "numpy":
        import array_api_compat.numpy as numpy_xp

        return numpy_xp
    if name in ("cupy", "dask.array"):
        return importlib.import_module(f"array_api_compat.{name}")
    if not hasattr(xp, "asarray") or not hasattr(xp, "__array_namespace_info__"):
        raise TypeError(f"xp must be an array-API namespace, got module {name!r}")
    return _mended(xp)


def capability(xp: Namespace, name: str, default: Any) -> Any:
    """The namespace's ``__array_namespace_info__().capabilities()[name]`` (``default`` where it
    does not say)."""
    try:
        return xp.__array_namespace_info__().capabilities().get(name, default)
    except Exception:
        return default


def index_dtype(xp: Namespace, device: Device = None) -> Any:
    """The namespace's default dtype for indices on ``device`` (``default_dtypes()["indexing"]``:
    int64 on most libraries, int32 on JAX without x64; ndonnx's ``take`` accepts nothing else)."""
    try:
        return xp.__array_namespace_info__().default_dtypes(device=device)["indexing"]
    except Exception:
        return xp.int64 if hasattr(xp, "int64") else xp.int32


def is_writeable(x: Any) -> bool:
    """``array_api_compat.is_writeable_array``: ``x[...] = y`` works on ``x``."""
    return bool(array_api_compat.is_writeable_array(x))


def is_lazy(x: Any) -> bool:
    """``array_api_compat.is_lazy_array``: ``x``'s values cannot be read cheaply and eagerly."""
    return bool(array_api_compat.is_lazy_array(x))


def device(x: Array) -> Device:
    """The device of ``x`` (torch served directly, see the module docstring)."""
    mod = _module(x)
    if mod == "torch":
        return x.device
    for lib, device_of in _DEVICE_OF.items():
        if mod == lib or mod[: len(lib) + 1] == lib + ".":
            return device_of(x)
    return array_api_compat.device(x)


def to_numpy(x: Any) -> np.ndarray:
    """A host NumPy copy of an array of any supported library (bfloat16 widened to float32)."""
    mod = _module(x)
    if mod == "numpy" or not is_array(x):
        return np.asarray(x)
    if mod == "torch":
        t = x.detach().cpu()
        if t.dtype.is_floating_point and t.dtype.itemsize == 2 and str(t.dtype) == "torch.bfloat16":
            t = t.float()
        return t.resolve_conj().resolve_neg().numpy()
    if mod == "cupy":
        return x.get()
    if mod == "dask":
        return np.asarray(x.compute())
    if mod == "array_api_strict":
        import array_api_strict

        return np.asarray(x.to_device(array_api_strict.Device("CPU_DEVICE")))
    if mod == "ndonnx":  # (the values it propagated; a symbolic array has none: ValueError)
        return np.asarray(x.unwrap_numpy())
    return _foreign_to_numpy(x)


def _foreign_to_numpy(x: Any) -> np.ndarray:
    """Another library's array on the host: by DLPack (the standard's interchange), else its
    ``__array__``; a ``TypeError`` naming the type when neither gives numbers (never ``int()`` or
    ``float()`` on the array itself)."""
    out: Any = None
    if hasattr(x, "__dlpack__"):
        try:
            out = np.from_dlpack(x)
        except (BufferError, TypeError, ValueError, RuntimeError, NotImplementedError):
            out = None
    if out is None:
        try:
            out = np.asarray(x)
        except Exception as e:
            raise TypeError(
                f"cannot read the values of a {type(x).__module__}.{type(x).__name__} on the host: {e}"
            ) from None
    if out.dtype.name == "bfloat16":
        out = out.astype(np.float32)
    if out.dtype.kind not in "biuf":
        raise TypeError(
            f"cannot read the values of a {type(x).__module__}.{type(x).__name__} on the host "
            f"(no DLPack, and NumPy reads it as {out.dtype})"
        )
    return out
