"""Shared fixtures: one backend fixture over every installed array library.

Select backends with ``ROTARY_BACKENDS=numpy,torch pytest``.  CuPy and torch CUDA appear
only when a GPU is present.  Backends are described by capabilities
(:class:`rotary.testing.Backend`): tests ask ``backend.lazy``, ``backend.host_values``,
``backend.float64``..., never for a backend by name.

A *slow* backend (``backend.slow``: cubed, where each computation is planned and run by an
executor) runs, in the default run, only the tests marked ``slow_backends_too``: the conformance
columns (every public function) and one test of each code path; the rest of the matrix would
cost minutes there and check the same generic code the other backends run.  Name it to run
everything on it: ``ROTARY_BACKENDS=cubed pytest``.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from rotary.testing.backends import backend_params


def pytest_collection_modifyitems(config, items):
    # The tests marked slow (fresh interpreters, compiles, whole-package checks: 8 to 35 s each)
    # first: pytest-xdist hands tests out in this order, and a long test left for the end keeps
    # one worker busy while the others idle (a stable sort: the rest keep their order).
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
    for item in items:
        if item.get_closest_marker("slow_backend") and not item.get_closest_marker("slow_backends_too"):
            item.add_marker(
                pytest.mark.skip(
                    reason="a slow backend runs the tests marked slow_backends_too here "
                    "(ROTARY_BACKENDS=<name> runs every test on it)"
                )
            )


@pytest.fixture(params=backend_params())
def backend(request):
    """A :class:`rotary.testing.Backend`: ``.xp``, ``.asarray(np_array, dtype)``, ``.to_numpy``."""
    return request.param


@pytest.fixture
def rng():
    return np.random.default_rng(12345)
