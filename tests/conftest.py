"""Shared fixtures: one backend fixture over every installed array library.

Select backends with ``ROTARY_BACKENDS=numpy,torch pytest``.  CuPy and torch CUDA appear
only when a GPU is present.  Backends are described by capabilities
(:class:`rotary.testing.Backend`): tests ask ``backend.lazy``, ``backend.host_values``,
``backend.float64``..., never for a backend by name.
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
