"""The exact-angle bound (1e-6 absolute for integer positions up to 2**24, and
beyond) on every backend, against truths computed independently of rotary's tables."""

from __future__ import annotations

import numpy as np
import pytest

import rotary
from rotary.testing import assert_close, to_numpy

mpmath = pytest.importorskip("mpmath")

D = 128
BOUND = 1e-6
W = rotary.inv_freq(D)  # float64: the "float64 truth" is cos(pos * W) with this W


def _truth_ld(pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin(pos * W) in 80-bit longdouble (angle error < 4e-12 for |pos| < 2**25)."""
    ang = np.asarray(pos).astype(np.longdouble)[:, None] * W.astype(np.longdouble)[None, :]
    return np.cos(ang).astype(np.float64), np.sin(ang).astype(np.float64)


def _truth_mp(pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin(pos * W) with 200-bit mpmath (exact to float64 for any position)."""
    with mpmath.workprec(200):
        ws = [mpmath.mpf(float(w)) for w in W]
        angs = [[mpmath.mpf(float(p)) * w for w in ws] for p in np.asarray(pos).tolist()]
        c = np.array([[float(mpmath.cos(a)) for a in row] for row in angs])
        s = np.array([[float(mpmath.sin(a)) for a in row] for row in angs])
    return c, s


def _has_int64(backend) -> bool:
    return backend.int64


def _int_dtype(backend) -> str:
    return backend.int_dtype()


def _dense_positions(rng) -> np.ndarray:
    windows = [np.arange(c, c + 400) for c in (0, 2**10 - 200, 2**17 - 200, 2**20 - 200)]
    windows.append(np.arange(2**24 - 400, 2**24))
    sample = rng.integers(0, 2**24, size=600)
    return np.concatenate([*windows, sample])


@pytest.mark.skipif(np.finfo(np.longdouble).nmant < 63, reason="needs 80-bit longdouble for the dense truth")
def test_ld_truth_agrees_with_mpmath(rng):
    pos = np.concatenate([[0, 1, 2**24 - 1], rng.integers(0, 2**24, size=13)])
    for a, b in zip(_truth_ld(pos), _truth_mp(pos), strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-11)


@pytest.mark.skipif(np.finfo(np.longdouble).nmant < 63, reason="needs 80-bit longdouble for the dense truth")
def test_exact_bound_dense_up_to_2_24(backend, rng):
    """All 64 frequencies of d=128, windows near 0, 2**10, 2**17, 2**20, 2**24 - 1 and a random sample."""
    pos = _dense_positions(rng)
    c, s = rotary.RoPE(D).cos_sin(backend.asarray(pos, _int_dtype(backend)), dtype=backend.xp.float32)
    assert c.dtype == backend.xp.float32
    tc, ts = _truth_ld(pos)
    err = max(np.abs(to_numpy(c) - tc).max(), np.abs(to_numpy(s) - ts).max())
    assert err < BOUND, f"max |error| {err:.3g} >= {BOUND} on {backend.name}"


def test_exact_bound_mpmath_sample(backend, rng):
    """The same bound against mpmath on a sample (no reliance on the longdouble truth)."""
    pos = np.concatenate([[0, 1, 2**17 + 3, 2**20 - 1, 2**24 - 1], rng.integers(0, 2**24, size=11)])
    c, s = rotary.RoPE(D).cos_sin(backend.asarray(pos, _int_dtype(backend)), dtype=backend.xp.float32)
    tc, ts = _truth_mp(pos)
    assert np.abs(to_numpy(c) - tc).max() < BOUND
    assert np.abs(to_numpy(s) - ts).max() < BOUND


@pytest.mark.slow_backends_too
@pytest.mark.parametrize("top", [2**28, 2**32, 2**36 - 1])
def test_exact_bound_beyond_2_24(backend, rng, top):
    """Up to 2**36 by design (int64 positions); mpmath truth."""
    if not _has_int64(backend):
        pytest.skip(f"{backend.name} has no int64 positions")
    pos = np.concatenate([[top, top - 1, top - 4095, -top], rng.integers(top // 2, top, size=6)])
    c, s = rotary.RoPE(D).cos_sin(backend.asarray(pos, "int64"), dtype=backend.xp.float32)
    tc, ts = _truth_mp(pos)
    assert np.abs(to_numpy(c) - tc).max() < BOUND
    assert np.abs(to_numpy(s) - ts).max() < BOUND


def test_exact_float64_mode(backend, rng):
    """With float64 results the exact method is within a few float64 ulps, even at 2**36."""
    if not backend.float64:
        pytest.skip(f"{backend.name} has no float64")
    pos = np.concatenate([[2**24 - 1, 2**36 - 1], rng.integers(0, 2**36, size=6)])
    c, s = rotary.RoPE(D).cos_sin(backend.asarray(pos, "int64"), dtype=backend.xp.float64)
    tc, ts = _truth_mp(pos)
    assert_close(c, tc, dtype="float64", ulps=32)
    assert_close(s, ts, dtype="float64", ulps=32)


@pytest.mark.parametrize("center", [0, 2**10, 2**20, 2**23])
def test_fractional_positions_float32(backend, rng, center):
    """Float32 positions (the value as held, fraction included) stay within the bound."""
    pos = (center + rng.uniform(-3, 3, size=12)).astype(np.float32)
    c, s = rotary.RoPE(D).cos_sin(backend.asarray(pos, "float32"), dtype=backend.xp.float32)
    tc, ts = _truth_mp(pos.astype(np.float64))
    assert np.abs(to_numpy(c) - tc).max() < BOUND
    assert np.abs(to_numpy(s) - ts).max() < BOUND


def test_fractional_float64_positions_keep_their_fraction(backend, rng):
    """Float64 positions with float32 results: split before rounding, so 2**23 + 0.25 is not rounded."""
    if not backend.float64:
        pytest.skip(f"{backend.name} has no float64")
    pos = np.concatenate([[2**23 + 0.25, 2**30 + 0.5, -(2**20) - 0.75], rng.uniform(0, 2**24, size=5)])
    c, s = rotary.RoPE(D).cos_sin(backend.asarray(pos, "float64"), dtype=backend.xp.float32)
    tc, ts = _truth_mp(pos)
    assert np.abs(to_numpy(c) - tc).max() < BOUND
    assert np.abs(to_numpy(s) - ts).max() < BOUND


def test_exact_bound_under_jax_jit_x64_off(rng):
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    if jax.config.jax_enable_x64:
        pytest.skip("x64 is on")
    rope = rotary.RoPE(D)
    pos = _dense_positions(rng)[-700:].astype(np.int32)
    c, s = jax.jit(lambda p: rope.cos_sin(p))(jnp.asarray(pos))
    assert c.dtype == jnp.float32
    tc, ts = _truth_mp(pos[::35])
    assert np.abs(np.asarray(c)[::35] - tc).max() < BOUND
    assert np.abs(np.asarray(s)[::35] - ts).max() < BOUND


def test_float32_mode_is_the_recipe(backend, rng):
    """angles="float32": float32(pos) * float32 inv_freq, cos/sin in float32; error grows with position."""
    pos = np.array([1, 2**10 + 7, 2**17 + 11, 2**20 - 3])
    xp = backend.xp
    c, _ = rotary.RoPE(D, angles="float32").cos_sin(backend.asarray(pos, _int_dtype(backend)))
    w32 = (1.0 / (np.float32(1e4) ** (np.arange(0, D, 2).astype(np.float32) / np.float32(D)))).astype(
        np.float32
    )
    ang = pos.astype(np.float32)[:, None] * w32
    # The same float32 angle up to the backend's pow (one ulp of inv_freq) and cos.
    tol = 4e-7 + 2 * ang * 2.0**-23
    assert (np.abs(to_numpy(c) - np.cos(ang)) <= tol).all()
    err = np.abs(to_numpy(c) - _truth_mp(pos)[0]).max(axis=1)
    assert err[-1] > 1e-3 > err[0], "the float32 recipe's error should grow with the position"
    assert c.dtype == xp.float32
