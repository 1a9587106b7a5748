"""Array-namespace plumbing, and the one module besides :mod:`rotary._backends` that names
array libraries (to recognise their arrays without importing them).

Nothing here imports a framework at module import time.  ``array_api_compat`` does the
dispatch, except for torch tensors, which are served directly: ``array_api_compat``'s
dispatch is ``functools.lru_cache``-d, which ``torch.compile`` warns about on every trace.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import array_api_compat
import numpy as np

from ._process import importing, load
from ._typing import Array, Device, Namespace

__all__ = [
    "OLDEST_STANDARD",
    "REQUIRED",
    "MissingFunction",
    "Unreadable",
    "array_namespace",
    "as_namespace",
    "capability",
    "check_standard",
    "device",
    "entry",
    "freeze",
    "host_values",
    "index_dtype",
    "is_array",
    "is_host_positions",
    "is_numpy",
    "is_sparse",
    "library_name",
    "not_an_array",
    "refusal",
    "register_mender",
    "to_numpy",
    "what",
]

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

F = TypeVar("F", bound=Callable[..., Any])


def _library_scope() -> Any:
    """A context that a library's global settings need around rotary's own arithmetic, or None.

    JAX's ``jax_numpy_rank_promotion`` (``"warn"``/``"raise"``) polices implicit rank promotion
    in the *caller's* code; rotary's arithmetic broadcasts by the array API's rules (positions
    of shape ``(seq,)`` against data of shape ``(batch, heads, seq, dim)``), so rotary's own
    operations run under ``"allow"``: no warning and no error from inside rotary, whatever
    the caller's setting.  (A dictionary read when JAX is not imported; skipped while
    ``torch.compile`` traces, where no JAX array can be.)"""
    jax = sys.modules.get("jax")
    if jax is None or _torch_compiling():
        return None
    config = getattr(jax, "config", None)
    if config is None or getattr(config, "jax_numpy_rank_promotion", "allow") == "allow":
        return None
    return jax.numpy_rank_promotion("allow")


def _torch_compiling() -> bool:
    """A ``torch.compile`` trace is being recorded (a dictionary read when torch is not imported;
    a torch that another thread is still importing, without ``compiler`` yet, records none)."""
    compiler = getattr(sys.modules.get("torch"), "compiler", None)
    is_compiling = getattr(compiler, "is_compiling", None)
    return is_compiling is not None and bool(is_compiling())


def _importing() -> contextlib.AbstractContextManager[None]:
    """:func:`._process.importing`, except under a ``torch.compile`` trace, which cannot trace a
    lock (and where the first import of a module is Dynamo's, at trace time)."""
    return contextlib.nullcontext() if _torch_compiling() else importing()


def entry(fn: F) -> F:
    """Mark a public entry point: its body runs in the scope the libraries' global settings
    need (:func:`_library_scope`)."""

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        scope = _library_scope()
        if scope is None:
            return fn(*args, **kwargs)
        with scope:
            return fn(*args, **kwargs)

    return call  # type: ignore[return-value]


#: Python values that are never arrays (positions may be given as these).
_PLAIN = (bool, int, float, complex, str, bytes, list, tuple, dict, type(None))


def _torch_tensor(x: object) -> bool:
    """``x`` is a ``torch.Tensor`` (any subclass: ``Parameter``, DTensor, a user's
    ``__torch_function__`` class), without importing torch (none exists if torch is not imported).
    (``torch.compile`` traces this: a dictionary read and an ``isinstance``.)"""
    tensor = getattr(sys.modules.get("torch"), "Tensor", None)  # (None while torch is imported)
    return tensor is not None and isinstance(x, tensor)


def _jax_array(x: object) -> bool:
    """``x`` is a ``jax.Array`` (tracers included), without importing JAX."""
    array = getattr(sys.modules.get("jax"), "Array", None)
    return array is not None and isinstance(x, array)


def refusal(x: object) -> str | None:
    """Why ``x``, which looks like an array, is not served (``None``: it is, or it is no array).

    Recognition is by capability, in one place: an array is an instance of an array library's
    array type (``numpy.ndarray``, ``torch.Tensor`` and their subclasses...), an object whose
    type has ``__array_namespace__``, or what ``array_api_compat`` recognises.  Type names and
    module names are never consulted."""
    proxy = getattr(sys.modules.get("torch.fx"), "Proxy", None)
    if proxy is not None and isinstance(x, proxy):
        return (
            "a torch.fx Proxy (torch.fx.symbolic_trace): rotary reads shapes and dtypes, which a "
            "Proxy does not have. Trace with torch.export.export, torch.compile, make_fx or "
            "torch.jit.trace instead, or keep the call out of the graph: "
            "torch.fx.Tracer(autowrap_functions=(rotary.rotate, ...)) with the function imported "
            "into your module"
        )
    if isinstance(x, np.matrix):
        return "a numpy.matrix (always 2-D, with * as matrix product): pass np.asarray(m) instead"
    return None


def is_array(x: object) -> bool:
    """True for an array rotary serves (NumPy scalars included); see :func:`refusal`."""
    if isinstance(x, _PLAIN):
        return False
    if _torch_tensor(x):
        return True
    if isinstance(x, (np.ndarray, np.generic)):
        return not isinstance(x, np.matrix)
    if refusal(x) is not None:
        return False
    return hasattr(type(x), "__array_namespace__") or bool(array_api_compat.is_array_api_obj(x))


def is_numpy(x: object) -> bool:
    """A NumPy array or scalar (any subclass rotary serves)."""
    return isinstance(x, (np.ndarray, np.generic)) and not isinstance(x, np.matrix)


def is_host_positions(x: object) -> bool:
    """True for values that live on the host and may be converted to any library: Python
    numbers and sequences, and NumPy arrays and scalars."""
    return (isinstance(x, _PLAIN) and not isinstance(x, (str, bytes, dict))) or is_numpy(x)


def what(x: object) -> str:
    """``x``'s type, qualified (for error messages)."""
    t = type(x)
    return f"{t.__module__}.{t.__qualname__}"


def not_an_array(name: str, x: object, expected: str = "an array", *, verb: str = "be") -> TypeError:
    """The one refusal of an object that is not an array rotary serves: its type, and why."""
    why = refusal(x)
    if why is None:
        if isinstance(x, _PLAIN):
            why = f"a Python {type(x).__name__}"
        else:
            why = (
                f"a {what(x)}, which is not an array rotary recognises: its type has no "
                "__array_namespace__ (the array API standard's entry point) and array-api-compat "
                "does not know it; convert it to an array of a library that has one (NumPy, torch, "
                "JAX, CuPy...), e.g. with np.asarray(...) or DLPack"
            )
    return TypeError(f"{name} must {verb} {expected}; got {why}")


def host_values(x: object, name: str) -> np.ndarray:
    """Host NumPy values of ``x``: an array rotary serves (:func:`to_numpy`), or Python numbers
    and sequences; anything else is refused (:func:`not_an_array`), never read through an
    ``__array__`` of its own."""
    if is_array(x):
        return np.asarray(to_numpy(x))
    if not is_host_positions(x):
        raise not_an_array(name, x, "an array, a number or a sequence of numbers")
    return np.asarray(x)


#: The oldest version of the array API standard rotary runs on (``cumulative_sum``, ``clip`` and
#: ``__array_namespace_info__`` are from 2023.12; Python scalars as function arguments, from
#: 2024.12, are not used: only operators take them).
OLDEST_STANDARD = "2023.12"


def check_standard(xp: Namespace) -> Namespace:
    """``xp``, where it implements :data:`OLDEST_STANDARD` or later (or does not say which); else a
    ``TypeError`` naming the version (array-api-strict can be set to older ones)."""
    version = getattr(xp, "__array_api_version__", None)
    if isinstance(version, str) and version < OLDEST_STANDARD:
        raise TypeError(
            f"{getattr(xp, '__name__', xp)} implements the array API standard {version}; rotary needs "
            f"{OLDEST_STANDARD} or later (array-api-strict: "
            f"set_array_api_strict_flags(api_version='{OLDEST_STANDARD}') or newer)"
        )
    return xp


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


def _torch_namespace() -> Namespace:
    """``array_api_compat.torch``: imported the first time by :func:`._process.load` (under the
    lock a fork waits for), then an import statement (a lookup), which ``torch.compile`` traces
    (the module :func:`load` returns would reach the trace as a constant without a source)."""
    load("array_api_compat.torch")
    import array_api_compat.torch as torch_xp

    return torch_xp


def namespace_of(*arrays: Any, names: tuple[str, ...]) -> Namespace:
    """The namespace of ``arrays``, which must all be arrays (``TypeError`` naming the first that
    is not) of one library."""
    t = type(arrays[0])
    if _torch_tensor(arrays[0]) and all(type(a) is t for a in arrays[1:]):
        return _torch_namespace()  # served directly (see the module docstring)
    hit = _BY_TYPE.get(t)
    if hit is not None and all(type(a) is t for a in arrays[1:]):
        return check_standard(hit)
    for name, a in zip(names, arrays, strict=True):
        if not is_array(a):
            raise not_an_array(name, a, "an array of shape (..., head_dim)")
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
            return check_standard(hit)
    real = []
    for i, a in enumerate(arrays):
        if is_array(a):
            real.append((i, a))
        elif not is_host_positions(a):
            arg = names[i] if i < len(names) else f"argument {i}"
            raise not_an_array(arg, a, "an array, a number or a sequence of numbers")
    if not real:
        with _importing():
            return array_api_compat.array_namespace(np.empty(0))
    if all(_torch_tensor(a) for _, a in real):
        return _torch_namespace()
    if all(_jax_array(a) for _, a in real):
        # (the arrays' own namespace: array_api_compat's first lookup of a JAX array type makes
        # an array, a host-to-device transfer that jax.transfer_guard("disallow") refuses)
        xp = real[0][1].__array_namespace__()
    else:
        try:
            with _importing():  # (its dispatch imports its wrapper of a library the first time)
                xp = array_api_compat.array_namespace(*(a for _, a in real))
        except TypeError:
            label = names or tuple(f"arg{i}" for i in range(len(arrays)))
            kinds = ", ".join(f"{label[i]}: {what(a)}" for i, a in real)
            raise TypeError(
                f"arrays must all come from the same array library; got {kinds}. "
                "Convert them to one library first (positions may also be NumPy arrays or Python values)."
            ) from None
    xp = check_standard(_mended(xp))
    if library_name(xp) == "dask":  # (never memoised by type: each call's shapes are checked)
        _check_known_sizes(real, names)
        return xp
    if (
        one is not None
        and len(real) == len([a for a in arrays if a is not None])
        and len(_BY_TYPE) < 64
        and _MEMO_TYPES[0]
    ):
        _BY_TYPE[one] = xp
    return xp


def _check_known_sizes(real: list[tuple[int, Any]], names: tuple[str, ...]) -> None:
    """Dask arrays of unknown chunk sizes (after boolean indexing): one remedy, whichever the
    argument and the entry point (rotary needs every length to build its graph)."""
    for i, a in real:
        shape = tuple(getattr(a, "shape", ()))
        unknown = [ax for ax, n in enumerate(shape) if isinstance(n, float) and n != n]
        if unknown:
            arg, call = (names[i], f"{names[i]}.") if i < len(names) else ("an array argument", "its ")
            raise ValueError(
                f"{arg} has unknown chunk sizes along axis {unknown[0]} (shape {shape}); call "
                f"{call}compute_chunk_sizes() first (rotary needs every length to build its graph)"
            )


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


#: Namespaces :func:`_mended` made (by id): looked up again, they are returned as they are.
_MENDED: dict[int, Namespace] = {}


def _mended(xp: Namespace) -> Namespace:
    if _MENDED.get(id(xp)) is xp:
        return xp
    mend = _MENDERS.get(getattr(xp, "__name__", ""))
    out = _complete(xp if mend is None else mend(xp))
    _MENDED[id(out)] = out
    return out


#: What rotary reads from a namespace (functions and dtypes of the standard's 2023.12 version).
REQUIRED = (
    "abs", "any", "arange", "asarray", "astype", "broadcast_to", "clip", "concat", "cos",
    "cumulative_sum", "empty", "exp", "expand_dims", "finfo", "floor", "full_like", "iinfo",
    "isdtype", "isfinite", "log", "log1p", "logical_and", "logical_not", "matmul",
    "matrix_transpose", "max", "maximum", "mean", "minimum", "ones", "ones_like", "reshape",
    "searchsorted", "sin", "sqrt", "squeeze", "stack", "sum", "take", "where", "zeros",
    "zeros_like", "bool", "float32", "int32",
)  # fmt: skip


class Unreadable(TypeError):
    """An array whose values cannot reach the host (no working DLPack, no numeric ``__array__``):
    where reading them is optional (position checks), rotary goes on as under a trace."""


class MissingFunction(TypeError, AttributeError):
    """A namespace lacks a function rotary needs (raised where rotary reads it; an
    ``AttributeError`` too, so ``hasattr`` and ``getattr`` with a default see it as absent)."""


#: Creation functions, which take ``device=``.
_CREATION = frozenset(
    {"asarray", "arange", "zeros", "ones", "empty", "full", "eye", "linspace"}
    | {"zeros_like", "ones_like", "empty_like", "full_like"}
)


class _Checked:
    """A namespace departing from the standard where rotary needs it: reading a missing name of
    :data:`REQUIRED` raises :class:`MissingFunction` naming it and the library (rather than an
    ``AttributeError``, or a misleading error from a fallback, deep inside rotary); a library whose
    creation functions refuse ``device=`` (one device) is called without it for its default
    device, and the error names the function for any other."""

    def __init__(self, xp: Namespace, missing: tuple[str, ...], deviceless: bool, default: Any) -> None:
        self.__dict__.update(_xp=xp, _missing=missing, _deviceless=deviceless, _default=default)

    def __getattr__(self, name: str) -> Any:
        try:
            value = getattr(self._xp, name)
        except AttributeError:
            if name not in self._missing:
                raise
            others = ", ".join(m for m in self._missing if m != name) or "nothing else"
            raise MissingFunction(
                f"{self._lib()} has no {name}, which rotary needs (the array API standard's {name}; "
                f"this namespace also lacks {others})"
            ) from None
        if self._deviceless and name in _CREATION:
            return self._without_device(name, value)
        return value

    def _lib(self) -> str:
        return str(getattr(self._xp, "__name__", repr(self._xp)))

    def _without_device(self, name: str, fn: Any) -> Any:
        def call(*args: Any, device: Any = None, **kwargs: Any) -> Any:
            if device is not None and device != self._default:
                raise MissingFunction(
                    f"{self._lib()}.{name} does not take device= (the standard's), which rotary needs "
                    f"for device {device!r}"
                )
            return fn(*args, **kwargs)

        return call

    def __repr__(self) -> str:
        what = [*(f"lacking {m}" for m in self._missing), *(["without device="] if self._deviceless else [])]
        return f"<{self._xp!r}, {', '.join(what)}>"


_COMPLETED: dict[int, tuple[Namespace, Namespace]] = {}


def _complete(xp: Namespace) -> Namespace:
    """``xp``, or the :class:`_Checked` view of it where it departs from the standard in what
    rotary needs (one per namespace, so that lookups compare equal; a checked one as it is)."""
    if isinstance(xp, _Checked):
        return xp
    hit = _COMPLETED.get(id(xp))
    if hit is not None and hit[0] is xp:
        return hit[1]
    missing = tuple(n for n in REQUIRED if not hasattr(xp, n))
    default: Any = None
    deviceless = False
    try:
        default = xp.__array_namespace_info__().default_device()
        xp.asarray(0.0, device=default)
    except (NotImplementedError, TypeError, ValueError):
        deviceless = "asarray" not in missing
    except Exception:  # (no namespace info, or a library that cannot make an array here: as it is)
        pass
    out: Any = _Checked(xp, missing, deviceless, default) if missing or deviceless else xp
    _COMPLETED[id(xp)] = (xp, out)
    return out


def as_namespace(xp: Any) -> Namespace:
    """An array-API namespace for ``xp``: the ``array_api_compat`` wrapper of a library module
    that is not one itself (``numpy``, ``torch``, ``cupy``, ``dask.array``)."""
    name = getattr(xp, "__name__", None)
    if not isinstance(name, str):
        raise TypeError(f"xp must be an array namespace (a module such as numpy or jax.numpy), got {xp!r}")
    if name == "torch":
        return _torch_namespace()
    if name == "numpy":
        load("array_api_compat.numpy")  # (then a lookup, which torch.compile traces)
        import array_api_compat.numpy as numpy_xp

        return numpy_xp
    if name in ("cupy", "dask.array"):
        return load(f"array_api_compat.{name}")
    if not hasattr(xp, "asarray") or not (
        hasattr(xp, "__array_namespace_info__") or hasattr(xp, "__array_api_version__")
    ):
        raise TypeError(
            f"xp must be an array-API namespace (a module with __array_namespace_info__ or "
            f"__array_api_version__, e.g. numpy, torch, jax.numpy), got module {name!r}"
        )
    return check_standard(_mended(xp))


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


def freeze(value: Any) -> Any:
    """``value`` (an array, or a tuple or list of them) made read-only where its library allows
    (NumPy: ``writeable=False``); what rotary stores is never handed out, this makes a slip loud."""
    if isinstance(value, np.ndarray):
        value.flags.writeable = False
    elif isinstance(value, (tuple, list)):
        for v in value:
            freeze(v)
    return value


def is_sparse(x: Any) -> bool:
    """``array_api_compat.is_pydata_sparse_array``: a sparse array (rotary rotates dense ones)."""
    return bool(array_api_compat.is_pydata_sparse_array(x))


def is_lazy(x: Any) -> bool:
    """``array_api_compat.is_lazy_array``: ``x``'s values cannot be read cheaply and eagerly (also
    where a library cannot answer: its ``any`` departs from the standard, heat's; then nothing is
    read, as for a lazy array)."""
    try:
        return bool(array_api_compat.is_lazy_array(x))
    except Exception:
        return True


def device(x: Array) -> Device:
    """The device of ``x`` (torch served directly, see the module docstring)."""
    if _torch_tensor(x):
        return x.device
    if _DEVICE_OF and not is_numpy(x):
        device_of = _DEVICE_OF.get(getattr(array_namespace(x), "__name__", ""))
        if device_of is not None:
            return device_of(x)
    try:
        return array_api_compat.device(x)
    except AttributeError:
        raise MissingFunction(
            f"a {what(x)} has no device attribute (the standard's array.device), which rotary needs"
        ) from None


def to_numpy(x: Any) -> np.ndarray:
    """Host NumPy values of an array of any supported library (bfloat16 widened to float32): a
    view where the library allows one (for reading; :func:`rotary.testing.to_numpy` copies)."""
    if is_numpy(x) or not is_array(x):
        return np.asarray(x)
    if _torch_tensor(x):
        t = x.detach()
        if hasattr(t, "full_tensor"):  # (a distributed tensor: its global values)
            t = t.full_tensor()
        t = t.cpu()
        if t.dtype.is_floating_point and t.dtype.itemsize == 2 and str(t.dtype) == "torch.bfloat16":
            t = t.float()
        return t.resolve_conj().resolve_neg().numpy()
    if array_api_compat.is_cupy_array(x):
        return x.get()
    if array_api_compat.is_dask_array(x):
        return np.asarray(x.compute())
    if array_api_compat.is_ndonnx_array(x):  # (the values it propagated; a symbolic array has none)
        return np.asarray(x.unwrap_numpy())
    if _is_strict(x):
        return np.asarray(x.to_device(sys.modules["array_api_strict"].Device("CPU_DEVICE")))
    return _foreign_to_numpy(x)


def _is_strict(x: Any) -> bool:
    array = getattr(sys.modules.get("array_api_strict._array_object"), "Array", None)  # (its home)
    return array is not None and isinstance(x, array)


def _numbers(out: np.ndarray) -> np.ndarray:
    """An object array of Python (or NumPy) integers or reals as int64 or float64; else as it is.
    (``float()`` of an element converts a library's own real type, mpmath's ``mpf``, exactly where
    it is a float64 value.)"""
    flat = out.reshape(-1)
    if all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in flat):
        return out.astype(np.int64)
    try:
        return np.array([float(v) for v in flat], dtype=np.float64).reshape(out.shape)
    except (TypeError, ValueError):
        return out


def _foreign_to_numpy(x: Any) -> np.ndarray:
    """Another library's array on the host: by DLPack (the standard's interchange), else its
    ``__array__``; a ``TypeError`` naming the type when neither gives numbers (never ``int()`` or
    ``float()`` on the array itself)."""
    out: Any = None
    if hasattr(x, "__dlpack__"):
        try:
            out = np.from_dlpack(x)
        except (BufferError, TypeError, ValueError, RuntimeError, NotImplementedError, AttributeError):
            out = None
    if out is None:
        try:
            out = np.asarray(x)
        except Exception as e:
            raise Unreadable(f"cannot read the values of a {what(x)} on the host: {e}") from None
    if out.dtype.name == "bfloat16":
        out = out.astype(np.float32)
    if out.dtype.kind == "O" and out.shape == tuple(x.shape):
        out = _numbers(out)  # (Python numbers in an object array: mparray's, for one)
    if out.dtype.kind not in "biuf":
        raise Unreadable(
            f"cannot read the values of a {what(x)} on the host "
            f"(no DLPack, and NumPy reads it as {out.dtype})"
        )
    return out
