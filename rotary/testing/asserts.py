"""``assert_close``: the one comparison of an array of any library with a float64 reference.

It checks what a caller of ``rotary`` relies on besides the values: the library, dtype,
device and shape of the result (those of ``like``, usually the input).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._lib._compat import array_namespace, device, is_array, library_name, to_numpy
from .._lib._validation import dtype_name

__all__ = ["assert_close", "eps"]

_EPS = {"float64": 2.0**-52, "float32": 2.0**-23, "float16": 2.0**-10, "bfloat16": 2.0**-7}


def eps(dtype: Any) -> float:
    """Spacing at 1.0 of a floating dtype (name or dtype object of any library, bfloat16 included).

    Examples
    --------
    >>> import numpy as np
    >>> from rotary.testing import eps
    >>> eps(np.float32) == 2.0**-23, eps("bfloat16") == 2.0**-7
    (True, True)
    """
    name = dtype if isinstance(dtype, str) else dtype_name(dtype)
    if name not in _EPS:
        try:
            name = np.dtype(dtype).name
        except TypeError:
            pass
    if name not in _EPS:
        raise TypeError(f"dtype must be a real floating dtype, got {dtype!r}")
    return _EPS[name]


def assert_close(
    actual: Any,
    desired: Any,
    *,
    like: Any = None,
    dtype: Any = None,
    ulps: float = 8.0,
    scale: Any = None,
    atol: float = 0.0,
) -> None:
    """Assert ``actual`` (an array of any library) equals the reference ``desired``.

    Checks, in this order: ``actual`` is an array of the library of ``like`` and on its
    device; its dtype is ``dtype`` (default ``like``'s dtype); its shape is ``desired``'s;
    and ``|actual - desired| <= ulps * eps(dtype) * scale + atol`` elementwise, with
    ``scale = max(1, |desired|)`` by default.  NaNs must match.

    Parameters
    ----------
    actual : array
        The result under test.
    desired : array_like
        The reference values (taken as float64 NumPy).
    like : array, optional
        The array whose library, device and dtype ``actual`` must have (usually the input).
    dtype : dtype, optional
        The dtype ``actual`` must have, and the one the tolerance is measured in.
    ulps, scale, atol
        The tolerance, in units of ``eps(dtype)`` relative to ``scale``, plus ``atol``.

    Examples
    --------
    >>> import numpy as np, rotary
    >>> from rotary.testing import assert_close, reference
    >>> x = np.ones((3, 8), dtype=np.float32)
    >>> assert_close(rotary.rotate(x, [0, 1, 2]), reference.rotate(x, [0, 1, 2]), like=x)
    """
    if like is not None:
        if not is_array(actual):
            raise AssertionError(f"expected an array, got {type(actual).__name__}")
        la, ll = library_name(array_namespace(actual)), library_name(array_namespace(like))
        if la != ll:
            raise AssertionError(f"result is a {la} array, expected {ll} (the library of the input)")
        try:
            da, dl = device(actual), device(like)
        except Exception:  # traced values have no device
            da = dl = None
        if str(da) != str(dl):
            raise AssertionError(f"result is on device {da}, expected {dl}")
        if dtype is None:
            dtype = like.dtype
    if dtype is not None and (not is_array(actual) or dtype_name(actual.dtype) != dtype_name(dtype)):
        got = dtype_name(actual.dtype) if is_array(actual) else type(actual).__name__
        raise AssertionError(f"result has dtype {got}, expected {dtype_name(dtype)}")
    a = np.asarray(to_numpy(actual), dtype=np.float64)
    e = np.asarray(to_numpy(desired), dtype=np.float64)
    if a.shape != e.shape:
        raise AssertionError(f"result has shape {a.shape}, expected {e.shape}")
    nan_a, nan_e = np.isnan(a), np.isnan(e)
    if not np.array_equal(nan_a, nan_e):
        raise AssertionError(
            f"NaN at {np.argwhere(nan_a != nan_e)[:3].tolist()} in one array but not the other"
        )
    unit = eps(dtype if dtype is not None else actual.dtype)
    s = np.maximum(1.0, np.abs(e)) if scale is None else np.asarray(scale, dtype=np.float64)
    tol = ulps * unit * s + atol
    err = np.where(nan_a, 0.0, np.abs(a - e))
    bad = err > tol
    if bad.any():
        worst = np.unravel_index(int(np.argmax(err / np.maximum(tol, 1e-300))), err.shape)
        raise AssertionError(
            f"max error {err.max():.3g} "
            f"({float((err / unit / np.broadcast_to(s, err.shape)).max()):.3g} ulps) "
            f"exceeds {ulps} ulps of {dtype_name(dtype) if dtype is not None else '?'} at "
            f"{np.argwhere(bad)[:3].tolist()} (worst at {tuple(int(i) for i in worst)}: got {a[worst]!r}, "
            f"expected {e[worst]!r})"
        )
