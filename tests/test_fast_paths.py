"""The eager fast paths (blocked ``out=`` kernels, per-position tables, cached argument
signatures) compute exactly what the generic array-API code computes, and keep every check.

No timing here; speed is measured by ``python3 -m benchmarks``.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import assert_close
from reference import rotate_ref

import rotary
from rotary import angles, layouts
from rotary import rope as rope_mod
from rotary._compat import creation_device


def _generic_rotate(monkeypatch, x, c, s, layout, rotary_dim, xp):
    with monkeypatch.context() as m:
        m.setattr(layouts, "_eager_out_ops", lambda *a: None)
        return layouts.rotate_pairs(x, c, s, layout=layout, rotary_dim=rotary_dim, xp=xp)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize(
    ("shape", "rotary_dim", "cs_shape"),
    [
        ((2, 4, 300, 64), 64, (300, 32)),  # several blocks (> 2 x 256 KiB)
        ((2, 4, 300, 64), 48, (300, 24)),  # partial rotary, blocked
        ((3, 200, 4, 64), 64, (200, 1, 32)),  # (batch, seq, heads, dim) positions (seq, 1)
        ((1, 8, 1, 64), 64, (1, 32)),  # decode step, one block
        ((64,), 64, (32,)),
    ],
)
def test_rotate_pairs_fast_path_is_bitwise_generic(
    backend, monkeypatch, rng, layout, shape, rotary_dim, cs_shape
):
    xp = backend.xp
    x = backend.asarray(rng.standard_normal(shape), "float32")
    c = backend.asarray(rng.standard_normal(cs_shape), "float32")
    s = backend.asarray(rng.standard_normal(cs_shape), "float32")
    x_before = backend.to_numpy(x).copy()
    fast = layouts.rotate_pairs(x, c, s, layout=layout, rotary_dim=rotary_dim, xp=xp)
    slow = _generic_rotate(monkeypatch, x, c, s, layout, rotary_dim, xp)
    np.testing.assert_array_equal(backend.to_numpy(fast), backend.to_numpy(slow))
    np.testing.assert_array_equal(backend.to_numpy(x), x_before)  # input untouched


@pytest.mark.parametrize("levels", [None, 1, 2, 3])
def test_exact_cos_sin_fast_path_and_hints_are_bitwise_generic(backend, monkeypatch, rng, levels):
    xp = backend.xp
    w = angles.inv_freq(32)
    tables = angles.backend_tables(w, xp=xp, device=backend.device, dtype=xp.float32)
    wb = xp.asarray(w, dtype=xp.float32, device=backend.device)
    top = {None: 2**31 - 1, 1: 4095, 2: 4096**2 - 1, 3: 2**31 - 1}[levels]  # int32 backends
    p = np.concatenate([np.arange(0, 1500), rng.integers(0, top, size=1500, endpoint=True)])
    for signed in (False, True):
        pn = np.concatenate([p, -p]) if signed else p
        pos = backend.asarray(pn.reshape(2, -1).astype(np.int64))
        got = angles.exact_cos_sin(pos, tables, wb, xp=xp, dtype=xp.float32, levels=levels, nonneg=not signed)
        with monkeypatch.context() as m:
            m.setattr(angles, "_eager_take_ops", lambda *a: None)
            ref = angles.exact_cos_sin(pos, tables, wb, xp=xp, dtype=xp.float32)
        for a, b in zip(got, ref):
            np.testing.assert_array_equal(backend.to_numpy(a), backend.to_numpy(b))


def test_position_table_matches_digit_method(backend, rng):
    xp = backend.xp
    rope = rotary.RoPE(64)
    pn = np.concatenate([rng.integers(0, rope_mod._POS_TABLE_MAX, size=300), [0, 4095, 4096]])
    pos = backend.asarray(pn)
    c, s = rope.cos_sin(pos)
    tables, w = rope._constants(xp, creation_device(pos, xp), xp.float32)
    c2, s2 = angles.exact_cos_sin(pos, tables, w, xp=xp, dtype=xp.float32)
    # identical up to the sign of zeros
    np.testing.assert_array_equal(backend.to_numpy(c) + 0.0, backend.to_numpy(c2) + 0.0)
    np.testing.assert_array_equal(backend.to_numpy(s) + 0.0, backend.to_numpy(s2) + 0.0)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_repeated_calls_stay_exact_and_checked(backend, rng, layout):
    """Second and later calls (cached signature) give the reference and still check values."""
    xp = backend.xp
    rope = rotary.RoPE(16, layout=layout)
    q = backend.asarray(rng.standard_normal((1, 2, 1, 16)), "float32")
    k = backend.asarray(rng.standard_normal((1, 1, 1, 16)), "float32")
    for p in (7, 40000, 2**30):  # table, digit levels 2 and 3
        pos = backend.asarray(np.array([p]))
        for _ in range(2):
            qr, kr = rope.apply(q, k, pos)
        exp_q = rotate_ref(backend.to_numpy(q), np.array([p]), layout=layout)
        assert_close(qr, exp_q, "float32", factor=16)
        assert kr.shape == k.shape
    big = backend.asarray(np.array([2**40]))
    if backend.name in {"numpy", "torch", "array_api_strict"}:
        with pytest.raises(ValueError, match="2\\*\\*36"):
            rope.apply(q, k, big)
    fpos = backend.asarray(np.array([1.5]), "float32")
    rope.apply(q, k, fpos)
    if backend.name in {"numpy", "torch"}:
        with pytest.raises(ValueError, match="NaN"):
            rope.apply(q, k, backend.asarray(np.array([np.nan]), "float32"))
    del xp


def test_torch_autograd_takes_the_functional_path(rng):
    torch = pytest.importorskip("torch")
    rope = rotary.RoPE(16)
    q = torch.tensor(rng.standard_normal((2, 3, 300, 16)), dtype=torch.float32, requires_grad=True)
    k = torch.tensor(rng.standard_normal((2, 3, 300, 16)), dtype=torch.float32)
    for _ in range(2):
        qr, kr = rope.apply(q, k, torch.arange(300))
    (qr.square().sum() + kr.sum()).backward()
    # rotation preserves norms: d/dq sum(|R q|^2) = 2 q
    torch.testing.assert_close(q.grad, 2 * q.detach(), rtol=1e-5, atol=1e-5)
