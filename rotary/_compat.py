"""Array-namespace plumbing: one place that knows about the array libraries.

Nothing here imports a framework at module import time; frameworks are only
touched through ``array_api_compat`` and through lazy imports guarded by the
namespace of arrays the caller already holds.
"""

from __future__ import annotations

from typing import Any

import array_api_compat
import numpy as np

__all__ = [
    "array_namespace",
    "backend_name",
    "compute_dtype",
    "creation_device",
    "device",
    "is_concrete",
    "is_real_floating",
    "namespace_key",
    "widest_float",
]

Array = Any
Namespace = Any


_ARRAY_MODULES = ("torch", "cupy", "dask", "jax", "jaxlib", "sparse")


def is_array_api_obj(x: Any) -> bool:
    """True for arrays of any supported library (a plain-Python check: ``array_api_compat``'s
    own uses ``functools.lru_cache``, which ``torch.compile`` warns about on every trace)."""
    mod = type(x).__module__.split(".", 1)[0]
    if mod == "numpy":
        return isinstance(x, (np.ndarray, np.generic))
    if mod in _ARRAY_MODULES:
        return hasattr(x, "shape")
    return hasattr(x, "__array_namespace__")


def array_namespace(*arrays: Any, names: tuple[str, ...] | None = None) -> Namespace:
    """Return the array-API namespace shared by ``arrays`` (``None`` and Python scalars ignored).

    Raises ``TypeError`` naming the offending arguments when the arrays come from
    different libraries.
    """
    real = [(i, a) for i, a in enumerate(arrays) if is_array_api_obj(a)]
    if not real:
        return array_api_compat.array_namespace(np.empty(0))
    if all(type(a).__module__.split(".", 1)[0] == "torch" for _, a in real):
        # All torch tensors: skip array_api_compat's lru_cached dispatch (torch.compile-friendly).
        import array_api_compat.torch as torch_xp

        return torch_xp
    try:
        return array_api_compat.array_namespace(*(a for _, a in real))
    except TypeError:
        label = names or tuple(f"arg{i}" for i in range(len(arrays)))
        kinds = ", ".join(f"{label[i]}: {type(a).__module__}.{type(a).__name__}" for i, a in real)
        raise TypeError(
            f"arrays must all come from the same array library; got {kinds}. "
            "Convert them to one library first."
        ) from None


def device(x: Array) -> Any:
    """The device ``x`` lives on (``None`` for traced JAX values)."""
    if type(x).__module__.split(".", 1)[0] == "torch":
        return x.device  # direct: array_api_compat's dispatch is lru_cached (torch.compile warns)
    return array_api_compat.device(x)


def creation_device(x: Array, xp: Namespace) -> Any:
    """Device to pass as ``device=`` when creating arrays that must sit beside ``x``."""
    if is_jax_namespace(xp):
        # Traced values have no device; sharded arrays report a sharding, which
        # jnp.asarray accepts too.  ``None`` lets jit place constants.
        dev = getattr(x, "sharding", None)
        try:
            return dev if dev is not None and len(dev.device_set) == 1 else None
        except Exception:  # tracers
            return None
    return device(x)


_NAMES = {
    "numpy": "numpy",
    "array_api_compat.numpy": "numpy",
    "torch": "torch",
    "array_api_compat.torch": "torch",
    "jax.numpy": "jax",
    "jax.experimental.array_api": "jax",
    "cupy": "cupy",
    "array_api_compat.cupy": "cupy",
    "array_api_compat.dask.array": "dask",
    "dask.array": "dask",
    "array_api_strict": "array_api_strict",
}


def backend_name(xp: Namespace) -> str:
    """Short name of a namespace: numpy, torch, jax, cupy, dask, array_api_strict.

    A plain dictionary lookup (no ``lru_cache``), so it traces cleanly under ``torch.compile``.
    """
    name = getattr(xp, "__name__", "")
    return _NAMES.get(name, name)


def is_numpy_namespace(xp: Namespace) -> bool:
    return backend_name(xp) == "numpy"


def is_torch_namespace(xp: Namespace) -> bool:
    return backend_name(xp) == "torch"


def is_jax_namespace(xp: Namespace) -> bool:
    return backend_name(xp) == "jax"


def is_cupy_namespace(xp: Namespace) -> bool:
    return backend_name(xp) == "cupy"


def is_dask_namespace(xp: Namespace) -> bool:
    return backend_name(xp) == "dask"


def is_array_api_strict_namespace(xp: Namespace) -> bool:
    return backend_name(xp) == "array_api_strict"


def namespace_key(xp: Namespace, dev: Any, dtype: Any) -> tuple[str, str, str]:
    """Hashable cache key for (namespace, device, dtype)."""
    return (backend_name(xp), str(dev), str(dtype))


def is_real_floating(xp: Namespace, dtype: Any) -> bool:
    """True for real floating dtypes, bfloat16 included."""
    try:
        return bool(xp.isdtype(dtype, "real floating"))
    except Exception:
        return False


def widest_float(xp: Namespace, dev: Any = None) -> Any:
    """float64 where the namespace/device supports it, else float32."""
    if not _supports_float64(xp, dev):
        return xp.float32
    return xp.float64


def _supports_float64(xp: Namespace, dev: Any) -> bool:
    if not hasattr(xp, "float64"):
        return False
    try:
        info = xp.__array_namespace_info__()
        dtypes = info.dtypes(device=dev, kind="real floating")
        return "float64" in dtypes
    except Exception:
        return True


def compute_dtype(xp: Namespace, dtype: Any) -> Any:
    """Dtype used for internal math: float64 for float64 inputs, float32 otherwise."""
    if hasattr(xp, "float64") and dtype == xp.float64:
        return xp.float64
    return xp.float32


def is_concrete(x: Any, xp: Namespace) -> bool:
    """True when ``x`` holds real values that can be inspected eagerly and cheaply.

    False for JAX tracers, tensors seen by ``torch.compile``, lazy Dask arrays and
    arrays on an accelerator (inspecting them would force a device sync).
    """
    if not is_array_api_obj(x):
        return True
    if is_dask_namespace(xp):
        return False
    if is_jax_namespace(xp):
        import jax  # the caller already holds JAX arrays

        if isinstance(x, jax.core.Tracer) or _jax_tracing(jax):
            return False  # a concrete array closed over inside jit: ops on it are traced
        try:
            return all(d.platform == "cpu" for d in x.devices())
        except Exception:
            return False
    if is_torch_namespace(xp):
        import torch

        if torch.compiler.is_compiling():
            return False
        return x.device.type == "cpu" and not _is_fake_tensor(x)
    if is_cupy_namespace(xp):
        return False
    return True


def _jax_tracing(jax: Any) -> bool:
    """True inside ``jax.jit`` (or another JAX trace), where even ops on concrete arrays are traced."""
    try:
        from jax._src import core

        return not core.trace_state_clean()
    except Exception:  # private API moved: probe with a tiny array instead
        return isinstance(jax.numpy.zeros(()), jax.core.Tracer)


def _is_fake_tensor(x: Any) -> bool:
    return type(x).__name__ in {"FakeTensor", "FunctionalTensor"}


def to_numpy(x: Array) -> np.ndarray:
    """Copy any supported array to a NumPy array on the host (tests and reports)."""
    xp = array_api_compat.array_namespace(x)
    if is_torch_namespace(xp):
        t = x.detach().cpu()
        if str(t.dtype) in {"torch.bfloat16"}:
            t = t.float()
        return t.numpy()
    if is_cupy_namespace(xp):
        return x.get()
    if is_dask_namespace(xp):
        return np.asarray(x.compute())
    if is_array_api_strict_namespace(xp):
        return np.asarray(x._array)  # the strict wrapper's host buffer, on any fake device
    if is_jax_namespace(xp):
        a = np.asarray(x)
        if a.dtype.name == "bfloat16":
            a = a.astype(np.float32)
        return a
    return np.asarray(x)
