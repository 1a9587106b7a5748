"""Argument validation: every error message of ``rotary`` is written here, once.

Each check names the argument, says what was expected and what was given.  Checks of
Python values run everywhere; checks of array *values* are the backend layer's (they
can only run on concrete host values, see :mod:`rotary._backends`).

Scalars are normalised while they are checked: ``operator.index`` for integers (NumPy
integers accepted; under ``torch.compile`` it also specialises a symbolic size) and
``float.fromhex(x.hex())`` for floats (specialises a float ``torch.compile`` made symbolic).
"""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from ._compat import MissingFunction, is_array, not_an_array
from ._typing import Array, Layout, Namespace

T = TypeVar("T")

#: Integer positions with ``|pos| < MAX_POSITION`` get exact angles (``4096**3 = 2**36``).
MAX_POSITION = 2**36

#: Floating dtype names rotary computes with.
FLOAT_NAMES = ("float16", "bfloat16", "float32", "float64")


# -- scalars -------------------------------------------------------------------------------
def check_int(value: Any, name: str, *, minimum: int | None = None, even: bool = False) -> int:
    """``value`` as a Python int (NumPy integers accepted, bools refused)."""
    what = "a positive even integer" if even else "an integer"
    if minimum is not None and not even:
        what = f"an integer >= {minimum}"
    if isinstance(value, (bool, float)):
        raise TypeError(f"{name} must be {what}, got {value!r}")
    try:
        v = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be {what}, got {type(value).__name__} {value!r}") from None
    if (minimum is not None and v < minimum) or (even and (v <= 0 or v % 2)):
        raise ValueError(f"{name} must be {what}, got {v}")
    return int(v)


def check_float(value: Any, name: str, *, minimum: float | None = None, above: float | None = None) -> float:
    """``value`` as a finite Python float (not a bool), ``>= minimum`` and ``> above`` where given."""
    if isinstance(value, (bool, str, bytes)) or value is None:
        raise TypeError(f"{name} must be a real number, got {value!r}")
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} {value!r}") from None
    v = float.fromhex(v.hex())
    within = (minimum is None or v >= minimum) and (above is None or v > above)
    if math.isnan(v) or math.isinf(v) or not within:
        bounds = [f"{op} {b:g}" for op, b in ((">=", minimum), (">", above)) if b is not None]
        raise ValueError(f"{name} must be {' and '.join(['finite', *bounds])}, got {value!r}")
    return v


def check_bool(value: Any, name: str) -> bool:
    """``value`` must be a bool (``causal="no"`` is an error, not ``True``)."""
    if isinstance(value, bool):
        return value
    if type(value).__name__ == "bool_":  # NumPy bool
        return bool(value)
    raise TypeError(f"{name} must be True or False, got {value!r}")


def check_choice(value: Any, name: str, choices: Sequence[T]) -> T:
    """``value`` must be one of ``choices`` (compared with ``==``, so only plain values)."""
    if value is None or isinstance(value, (str, int, float)):
        for c in choices:
            if value == c and type(value) is type(c):
                return c
    raise ValueError(f"{name} must be one of {tuple(choices)!r}, got {value!r}")


def check_head_dim(value: Any, name: str = "head_dim") -> int:
    return check_int(value, name, even=True)


def check_rotary_dim(rotary_dim: Any, head_dim: int, name: str = "rotary_dim") -> int:
    """``rotary_dim`` (``None``: the whole head) as an even int ``<= head_dim``."""
    if rotary_dim is None:
        return head_dim
    r = check_int(rotary_dim, name, even=True)
    if r > head_dim:
        raise ValueError(f"{name}={r} is larger than the head dimension head_dim={head_dim}")
    return r


def check_base(value: Any, name: str = "base") -> float:
    return check_float(value, name, above=1.0)


def check_sequence(value: Any, name: str, what: str) -> tuple[Any, ...]:
    """A non-string iterable as a tuple."""
    if isinstance(value, (str, bytes)) or value is None:
        raise TypeError(f"{name} must be a sequence of {what}, got {value!r}")
    try:
        return tuple(value)
    except TypeError:
        raise TypeError(f"{name} must be a sequence of {what}, got {type(value).__name__}") from None


def check_positive_ints(value: Any, name: str, n: int | None = None) -> tuple[int, ...]:
    """A non-empty sequence of positive ints (of length ``n`` where given)."""
    items = check_sequence(value, name, "positive integers")
    if not items:
        raise ValueError(f"{name} must be a non-empty sequence of positive integers, got {value!r}")
    out = tuple(check_int(v, f"{name}[{i}]", minimum=1) for i, v in enumerate(items))
    if n is not None and len(out) != n:
        raise ValueError(f"{name} must have {n} entries, got {len(out)}: {value!r}")
    return out


def check_positive_floats(value: Any, name: str) -> tuple[float, ...]:
    """A sequence of finite positive floats."""
    items = check_sequence(value, name, "positive numbers")
    return tuple(check_float(v, f"{name}[{i}]", above=0.0) for i, v in enumerate(items))


def python_numbers(value: Any, name: str) -> tuple[float, ...]:
    """The numbers of a Python number or (nested) sequence as Python floats, to be checked as
    Python values before they become an array: ``torch.compile`` traces NumPy's operations as
    tensors, whose values a check cannot branch on."""
    if isinstance(value, (list, tuple)):
        return tuple(v for item in value for v in python_numbers(item, name))
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must hold numbers, got a {type(value).__name__} in it")
    return (float(value),)


def first_bad(
    values: Any, ok: Callable[[Any], Any], fine: Callable[[Any], Any] | None = None
) -> float | None:
    """The first of ``values`` that is not ``ok`` (``None`` when all are, or ``values`` is
    ``None``: unreadable): Python values (a tuple, :func:`python_numbers`) one by one as Python
    values, host NumPy values at once; ``fine(values)``, a reduction (``h.max() <= 0``), tells
    a host array all ``ok`` without a mask of its size."""
    if values is None:
        return None
    if isinstance(values, tuple):
        return next((v for v in values if not ok(v)), None)
    if not values.size or (fine is not None and fine(values)):
        return None
    good = ok(values)
    return None if good.all() else float(values[~good].ravel()[0])


def finite(h: Any) -> Any:
    """Elementwise: ``h`` (a Python float, or host NumPy values) is finite (a :func:`first_bad` test)."""
    return (h == h) & (abs(h) != math.inf)


def unknown_option(name: str, value: Any, known: Iterable[str]) -> ValueError:
    return ValueError(f"unknown {name} {value!r}; known: {sorted(known)}")


# -- arrays --------------------------------------------------------------------------------
def dtype_name(dtype: Any) -> str:
    """``float32`` for ``torch.float32``, ``dtype('float32')``, ``jnp.float32``,
    ``array_api_strict.float32``..."""
    name = getattr(dtype, "name", None)
    if hasattr(dtype, "byteorder") and isinstance(name, str):  # a NumPy dtype: '>f4' -> 'float32'
        return name
    s = str(dtype)
    if s.startswith("dtype("):
        s = s[6:]
    return s.strip("'\"<>()").rsplit(".", 1)[-1].strip("'\"<>()")


def is_floating(dtype: Any) -> bool:
    """The floating dtypes rotary computes with: float16, bfloat16 (NumPy's ``ml_dtypes``
    one too), float32, float64 (not ``longdouble``: rotary would compute it in float64 at best)."""
    return dtype_name(dtype) in FLOAT_NAMES


def is_integral(dtype: Any) -> bool:
    """Integer dtypes of any library (by name, so an array of another library works too)."""
    return dtype_name(dtype).startswith(("int", "uint"))


def wrong_type(name: str, obj: Any, expected: str, *classes: type) -> TypeError:
    """``name`` is not ``expected``; when ``obj``'s class is one of ``classes`` from an earlier
    import of its module (``importlib.reload``, a cleared ``sys.modules``), say so and how to mend."""
    t = type(obj)
    for c in classes:
        if t is not c and t.__qualname__ == c.__qualname__ and t.__module__ == c.__module__:
            return TypeError(
                f"{name} is a {c.__name__} made by an earlier import of {c.__module__} (the module "
                f"was imported again: importlib.reload, or entries of sys.modules removed), so it is "
                f"not an instance of this import's {c.__name__}; make it again after the re-import"
            )
    return TypeError(f"{name} must be {expected}, got {t.__name__}")


def is_unsigned(dtype: Any) -> bool:
    """Unsigned integer dtypes of any library (by name)."""
    return dtype_name(dtype).startswith("uint")


def check_array(x: Any, name: str, what: str = "(..., head_dim)") -> None:
    if not is_array(x):
        raise not_an_array(name, x, f"an array of shape {what}")
    if x.ndim < 1:
        raise ValueError(f"{name} must be an array of shape {what}, got a 0-d array")


def check_floating(x: Array, name: str) -> None:
    if not is_floating(x.dtype):
        raise TypeError(
            f"{name} must be a real floating array (float16, bfloat16, float32 or float64), "
            f"got {dtype_name(x.dtype)}"
        )


def not_dense(name: str, layout: Any, fix: str = ".to_dense()") -> TypeError:
    return TypeError(f"{name} must be a dense (strided) array, got layout {layout}; call {fix} first")


def check_known_dim(n: Any, name: str) -> int:
    if not _known(n):
        raise ValueError(
            f"{name} has an unknown length; rotary needs it known "
            "(for Dask, call .compute_chunk_sizes() first)"
        )
    return n  # pyright: ignore[reportReturnType]  (an int here: a known length)


def check_head_array(x: Any, name: str, head_dim: int) -> None:
    """``x`` is a dense real floating array whose last axis is ``head_dim``."""
    check_array(x, name)
    check_floating(x, name)
    d = check_known_dim(x.shape[-1], f"{name}.shape[-1]")
    if d != head_dim:
        raise ValueError(f"{name}.shape[-1] must equal head_dim={head_dim}, got shape {tuple(x.shape)}")


def check_same_dtype(arrays: Sequence[tuple[str, Array]]) -> None:
    if any(a.dtype != arrays[0][1].dtype for _, a in arrays[1:]):
        names = ", ".join(n for n, _ in arrays)
        dts = ", ".join(dtype_name(a.dtype) for _, a in arrays)
        raise TypeError(f"{names} must have the same dtype, got {dts}")


def check_qkv(arrays: Sequence[tuple[str, Array, str]]) -> None:
    """``(name, array, shape)`` of (``q``,) ``k``, ``v`` for attention: real floating, at least
    two axes, one dtype; ``k`` and ``v`` share the sequence length, ``q`` and ``k`` the feature dim."""
    for name, x, what in arrays:
        check_floating(x, name)
        if x.ndim < 2:
            raise ValueError(f"{name} must have shape {what}, got shape {tuple(x.shape)}")
    *qs, (_, k, _), (_, v, _) = arrays
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(
            f"k and v must have the same sequence length (axis -2), got k.shape={tuple(k.shape)} "
            f"and v.shape={tuple(v.shape)}"
        )
    for _, q, _ in qs:
        if q.shape[-1] != k.shape[-1]:
            raise ValueError(
                f"q and k must have the same feature dim (last axis), got q.shape={tuple(q.shape)} "
                f"and k.shape={tuple(k.shape)}"
            )
    check_same_dtype([(n, x) for n, x, _ in arrays])


def _known(n: Any) -> bool:
    return n is not None and not (isinstance(n, float) and math.isnan(n))


def check_qk(q: Array, k: Array, *, seq_axis: int | None = None) -> None:
    """q and k: same last axis and number of axes; leading axes equal or (grouped-query
    heads) one a multiple of the other.  ``seq_axis`` is exempt (KV caches)."""
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"q and k must have the same head dim (last axis), got q.shape={tuple(q.shape)} "
            f"and k.shape={tuple(k.shape)}"
        )
    if q.ndim != k.ndim:
        raise ValueError(
            f"q and k must have the same number of axes, got q.shape={tuple(q.shape)} "
            f"and k.shape={tuple(k.shape)}"
        )
    for ax, (a, b) in enumerate(zip(q.shape[:-1], k.shape[:-1], strict=True)):
        if ax == seq_axis or not (_known(a) and _known(b)) or a == b:
            continue
        if a % b and b % a:
            raise ValueError(
                f"q and k have incompatible leading shapes: axis {ax} is {a} for q and {b} "
                f"for k (must be equal, or one a multiple of the other for grouped-query "
                f"heads); q.shape={tuple(q.shape)}, k.shape={tuple(k.shape)}"
                + ("" if seq_axis is not None else "; keys at other positions (a KV cache) take k_pos=")
            )


def broadcasts_to(shape: tuple[Any, ...], target: tuple[Any, ...]) -> bool:
    """``shape`` broadcasts *to* ``target`` (adds no axes, grows none; unknown sizes pass)."""
    pairs = zip(reversed(shape), reversed(target), strict=False)
    # (p != 1 and p != t, not p not in (1, t): torch.compile's `in` does not compare a size
    # with a symbolic one)
    return len(shape) <= len(target) and not any(
        _known(p) and _known(t) and p != 1 and p != t for p, t in pairs
    )


def check_broadcast(pos_shape: tuple[Any, ...], lead: tuple[Any, ...], pos_name: str, x_name: str) -> None:
    """``pos`` must broadcast *to* ``x.shape[:-1]`` (it may not add or grow axes)."""
    if not broadcasts_to(pos_shape, lead):
        raise ValueError(
            f"{pos_name} of shape {tuple(pos_shape)} does not broadcast to "
            f"{x_name}.shape[:-1] = {tuple(lead)}; positions are broadcast against every axis "
            f"but the last (e.g. (seq,) for (batch, heads, seq, dim), (seq, 1) for "
            f"(batch, seq, heads, dim), (batch, 1, seq) for HF position_ids of shape (batch, seq))"
        )


def query_groups(
    q_lead: tuple[Any, ...], kv_lead: tuple[Any, ...], names: str
) -> tuple[tuple[Any, ...], int]:
    """The leading (batch/head) shape of the outputs, and the number of query heads per key head:
    ``q``'s leading axes broadcast with the keys' (``1``), or differ only in the head axis (the
    last leading one), ``q``'s a multiple of the keys' (grouped-query attention: that many query
    heads share each key/value head)."""
    try:
        return broadcast_shapes(q_lead, kv_lead, names=names), 1
    except ValueError:
        if not (q_lead and kv_lead and _known(q_lead[-1]) and _known(kv_lead[-1])):
            raise
        hq, hk = q_lead[-1], kv_lead[-1]
        if hk == 0 or hq % hk:
            raise ValueError(
                f"the leading (batch/head) axes of {names} do not broadcast: {tuple(q_lead)}, "
                f"{tuple(kv_lead)}; grouped-query attention needs q's head count (axis -3, {hq}) to "
                f"be a multiple of the keys' ({hk})"
            ) from None
        rest = broadcast_shapes(q_lead[:-1], kv_lead[:-1], names=names)
        return (*rest, hq), hq // hk


def known_shape(shape: tuple[Any, ...], what: str, hint: str = "") -> tuple[Any, ...]:
    """``shape`` for ``reshape``: its one unknown size (``None``: symbolic arrays such as ndonnx's)
    as ``-1``; more than one cannot be written as a shape (``ValueError`` naming ``what``, with
    ``hint``)."""
    unknown = [i for i, d in enumerate(shape) if d is None]
    if len(unknown) > 1:
        raise ValueError(
            f"{what} has {len(unknown)} dimensions of unknown size; rotary needs all but one known here"
            + (f" ({hint})" if hint else "")
        )
    return tuple(-1 if d is None else d for d in shape)


def broadcast_shapes(*shapes: tuple[Any, ...], names: str) -> tuple[Any, ...]:
    """The broadcast of ``shapes`` (``ValueError`` naming ``names`` when they do not broadcast)."""
    n = max([0, *(len(s) for s in shapes)])
    out = []
    for i in range(n):
        size: Any = 1
        # (comparisons, no set: symbolic sizes under a trace are not hashable)
        for s in shapes:
            d = s[len(s) - n + i] if len(s) - n + i >= 0 else 1
            if d == 1:
                continue
            if size == 1:
                size = d
            elif d != size:
                raise ValueError(
                    f"the leading (batch/head) axes of {names} do not broadcast: "
                    f"{', '.join(str(tuple(s)) for s in shapes)}"
                )
        out.append(size)
    return tuple(out)


def check_same_device(devices: Sequence[tuple[str, Any]]) -> None:
    n0, d0 = devices[0]
    for n, d in devices[1:]:
        if d != d0:
            raise ValueError(
                f"{n} is on device {d} but {n0} is on device {d0}; move them to one device first"
            )


def check_position_dtype(dtype: Any, xp: Namespace, name: str) -> None:
    """Positions are integers or real floating (not bool, not complex)."""
    try:
        ok = not xp.isdtype(dtype, "bool") and (
            xp.isdtype(dtype, "integral") or (xp.isdtype(dtype, "real floating") and is_floating(dtype))
        )
    except MissingFunction:  # (the library lacks isdtype: say so, not that the dtype is wrong)
        raise
    except Exception:
        ok = False
    if not ok and dtype_name(dtype) != "bfloat16":
        raise TypeError(f"{name} must hold integer or real floating positions, got dtype {dtype_name(dtype)}")


def bad_positions(name: str, what: str) -> TypeError:
    return TypeError(
        f"{name} must be integer or real floating positions (an array, a number or a sequence), {what}"
    )


def check_position_bound(largest: float, name: str) -> None:
    if not largest < MAX_POSITION:
        raise ValueError(
            f"{name} contains |position| >= 2**36 ({largest:.6g}); rotary's exact angles cover "
            "|position| < 2**36"
        )


def nonfinite_positions(name: str) -> ValueError:
    return ValueError(f"{name} contains NaN or infinite positions")


def check_nested_positions(values_shape: tuple[Any, ...], name: str) -> None:
    """Nested positions hold one position per token: flat values of one axis."""
    if len(values_shape) != 1:
        raise ValueError(
            f"{name} must be a nested array of one position per token (shape (docs, tokens)), "
            f"got values of shape {values_shape}"
        )


def positions_too_wide(name: str, largest: int, library: str) -> ValueError:
    return ValueError(
        f"{name} contains position {largest}, which does not fit the 32-bit integers of {library} "
        "without 64-bit types (for JAX: jax.config.update('jax_enable_x64', True)); positions up "
        "to 2**31 - 1 work without them"
    )


_LAYOUTS: tuple[Layout, ...] = ("half", "interleaved")


def check_layout_name(value: Any, name: str = "layout") -> Layout:
    return check_choice(value, name, _LAYOUTS)
