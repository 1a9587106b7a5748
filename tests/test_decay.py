"""rotary.decay_bound: the long-term decay curve of RoFormer section 3.4.3."""

from __future__ import annotations

import math

import numpy as np
import pytest

import rotary
from rotary._lib._compat import device
from rotary.testing import assert_close


def direct(distances, dim, base=10000.0):
    """(1/(d/2)) sum_j |S_j|, S_j = sum_{i<j} exp(1j r theta_i), by explicit complex128 loops."""
    theta = [base ** (-2 * i / dim) for i in range(dim // 2)]
    out = []
    for r in np.asarray(distances, dtype=np.float64).tolist():
        total, s = 0.0, 0j
        for t in theta:
            s += complex(math.cos(r * t), math.sin(r * t))
            total += abs(s)
        out.append(total / (dim // 2))
    return np.asarray(out)


@pytest.mark.parametrize("dim", [2, 16, 128])
def test_matches_direct_float64_summation(dim):
    r = np.concatenate([np.arange(0, 257), [0.5, 1000.25, 65_536, 123_457]])
    got = rotary.decay_bound(r, dim)
    assert got.dtype == np.float64 and got.shape == r.shape
    # The direct sum rounds each angle r * theta_i (error <= |r| 2**-53, theta_i <= 1); a partial
    # sum S_j carries at most d/2 of them, so |error| <= (d/2) |r| 2**-53, plus summation rounding.
    ref = direct(r, dim)
    bound = (dim // 2) * np.abs(r) * 2.0**-53 + 64 * 2.0**-52 * ref
    assert np.all(np.abs(got - ref) <= bound), np.max(np.abs(got - ref) / bound)


def test_value_at_zero_and_symmetry():
    # At distance 0 every term is 1, so |S_j| = j and the mean is (d/2 + 1) / 2.
    assert float(rotary.decay_bound(0, 128)) == 32.5
    r = np.arange(1, 50)
    np.testing.assert_array_equal(rotary.decay_bound(r, 64), rotary.decay_bound(-r, 64))


def test_decreases_in_trend_d128():
    """ "In trend" made concrete: over distances 0..256 for d = 128, the value at 0 is the maximum,
    the means of the 8 consecutive windows of 32 distances (1..32, 33..64, ...) strictly
    decrease, and Spearman's rank correlation with the distance is below -0.8."""
    r = np.arange(0, 257)
    v = rotary.decay_bound(r, 128)
    assert v[0] == v.max()
    windows = v[1:].reshape(8, 32).mean(axis=1)
    assert np.all(np.diff(windows) < 0), windows
    ranks = np.argsort(np.argsort(v))
    rho = np.corrcoef(r, ranks)[0, 1]
    assert rho < -0.8, rho
    # It is not monotone point by point (the curve oscillates): the trend test is needed.
    assert not np.all(np.diff(v) <= 0)


@pytest.mark.slow_backends_too
def test_every_backend_keeps_namespace_dtype_device(backend):
    r = np.arange(0, 257, 16)
    ref = direct(r, 64)
    for dtype in backend.float_dtypes():
        d = backend.asarray(r, dtype)
        got = rotary.decay_bound(d, 64)
        assert type(got) is type(d) and got.dtype == d.dtype and tuple(got.shape) == r.shape
        if backend.device is not None:
            assert device(got) == backend.device
        # Values up to 32.5: the error of a float32 computation is a few eps times the value.
        assert_close(got, ref, dtype=dtype, scale=np.maximum(1.0, ref), ulps=16)
    # Integer distances give the namespace's default floating dtype (float64 on NumPy).
    ints = rotary.decay_bound(backend.asarray(r, "int32"), 64)
    default = backend.xp.__array_namespace_info__().default_dtypes(device=backend.device)["real floating"]
    assert ints.dtype == default
    assert_close(
        ints, ref, like=backend.asarray(r, "float32"), dtype=default, scale=np.maximum(1.0, ref), ulps=64
    )


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="dim must be a positive even integer"):
        rotary.decay_bound([0, 1], 7)
    with pytest.raises(TypeError, match="dim must be a positive even integer"):
        rotary.decay_bound([0, 1], 8.0)
    with pytest.raises(ValueError, match="base must be finite and > 1"):
        rotary.decay_bound([0, 1], 8, base=1.0)
    with pytest.raises(TypeError, match="distance must hold integer or real floating"):
        rotary.decay_bound(np.array([True, False]), 8)
