"""Shared fixtures: one backend fixture over every installed array library.

Select backends with ``ROTARY_BACKENDS=numpy,torch pytest``.  CuPy and torch CUDA
appear only when a GPU is present.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from rotary.testing.backends import backend_params


@pytest.fixture(params=backend_params())
def backend(request):
    """A :class:`rotary.testing.Backend`: ``.xp``, ``.asarray(np_array, dtype)``, ``.to_numpy``."""
    return request.param


@pytest.fixture
def rng():
    return np.random.default_rng(12345)


def eps(dtype: str) -> float:
    """Machine epsilon of a dtype name (bfloat16 included)."""
    if dtype == "bfloat16":
        return 2.0**-8
    return float(np.finfo(dtype).eps)


def assert_close(actual, expected, dtype: str, *, backend=None, factor: float = 8.0, scale=None):
    """|actual - expected| <= factor * eps(dtype) * max(1, |expected|) elementwise.

    ``actual`` is a backend array (or NumPy); ``expected`` a float64 NumPy reference.
    """
    from rotary._compat import to_numpy

    a = to_numpy(actual).astype(np.float64)
    e = np.asarray(expected, dtype=np.float64)
    assert a.shape == e.shape, f"shape {a.shape} != {e.shape}"
    s = np.maximum(1.0, np.abs(e)) if scale is None else scale
    tol = factor * eps(dtype) * s
    err = np.abs(a - e)
    bad = err > tol
    assert not bad.any(), (
        f"max error {err.max():.3g} exceeds {factor} eps({dtype}) = {factor * eps(dtype):.3g} "
        f"at {np.argwhere(bad)[:3].tolist()}"
    )
