"""Every entry point builds a lazy graph on Dask without computing, and traces under ``jax.jit``.

Uses ``array_api_extra.testing.lazy_xp_function``: on Dask the tagged functions run with
``compute()``/``persist()`` disabled (any eager read of values fails the test); on JAX they
run under ``jax.jit``.
"""

from __future__ import annotations

import numpy as np
import pytest

import rotary
from rotary import (
    apply,
    attention,
    convert_layout,
    decay_bound,
    linear_attention,
    linear_attention_state,
    rotate,
)
from rotary.testing import assert_close, to_numpy

xpx_testing = pytest.importorskip("array_api_extra.testing")

for _f in (apply, rotate, convert_layout, linear_attention, linear_attention_state, attention, decay_bound):
    xpx_testing.lazy_xp_function(_f)
for _m in ("apply", "rotate", "cos_sin"):
    xpx_testing.lazy_xp_function((rotary.RoPE, _m))
    xpx_testing.lazy_xp_function((rotary.MRoPE, _m))
    xpx_testing.lazy_xp_function((rotary.AxialRoPE, _m))

ROPE = rotary.RoPE(8, base=500.0, layout="interleaved")
MROPE = rotary.MRoPE(8, (2, 1, 1))
AXIAL = rotary.AxialRoPE(8, 2)


@pytest.fixture(params=["dask", "jax"])
def lazy(request):
    b = next((b for b in rotary.testing.available() if b.name == request.param), None)
    if b is None:
        pytest.skip(f"{request.param} not installed")
    with xpx_testing.patch_lazy_xp_functions(request, xp=b.xp):
        yield b


def _data(b, rng, shape=(2, 3, 6, 8)):
    return b.asarray(rng.normal(size=shape), "float32")


def test_rope_entry_points(lazy, rng):
    b = lazy
    q, k = _data(b, rng), _data(b, rng)
    pos = b.asarray(np.arange(6), b.int_dtype())
    for out, ref in (
        (apply(q, k, pos)[0], rotary.apply(to_numpy(q), to_numpy(k), np.arange(6))[0]),
        (rotate(q, pos, rotary_dim=4), rotary.rotate(to_numpy(q), np.arange(6), rotary_dim=4)),
        (ROPE.apply(q, k, pos)[1], ROPE.apply(to_numpy(q), to_numpy(k), np.arange(6))[1]),
        (ROPE.rotate(q, pos), ROPE.rotate(to_numpy(q), np.arange(6))),
        (convert_layout(q, "half", "interleaved"), rotary.convert_layout(to_numpy(q), "half", "interleaved")),
    ):
        assert_close(out, ref, like=q, ulps=8)
    c, s = ROPE.cos_sin(pos)
    assert_close(c, ROPE.cos_sin(np.arange(6))[0], dtype="float32")
    assert_close(s, ROPE.cos_sin(np.arange(6))[1], dtype="float32")


def test_multiaxis_entry_points(lazy, rng):
    b = lazy
    x = _data(b, rng)
    mpos = b.asarray(rng.integers(0, 99, size=(3, 6)), "int32")
    apos = b.asarray(rng.integers(0, 99, size=(6, 2)), "int32")
    assert_close(MROPE.rotate(x, mpos), MROPE.rotate(to_numpy(x), to_numpy(mpos)), like=x)
    assert_close(AXIAL.rotate(x, apos), AXIAL.rotate(to_numpy(x), to_numpy(apos)), like=x)
    assert_close(MROPE.apply(x, x, mpos)[0], MROPE.apply(to_numpy(x), to_numpy(x), to_numpy(mpos))[0], like=x)


@pytest.mark.parametrize("causal", [False, True])
def test_attention_entry_points(lazy, rng, causal):
    b = lazy
    q, k, v = _data(b, rng), _data(b, rng), _data(b, rng, (2, 3, 6, 4))
    pos = b.asarray(np.arange(6), b.int_dtype())
    qn, kn, vn = (to_numpy(a) for a in (q, k, v))
    assert_close(
        linear_attention(q, k, v, pos, causal=causal, chunk_size=4),
        rotary.linear_attention(qn, kn, vn, np.arange(6), causal=causal, chunk_size=4),
        like=q,
        ulps=64,
    )
    st = linear_attention_state(k, v, pos)
    assert_close(st.S, rotary.linear_attention_state(kn, vn, np.arange(6)).S, dtype="float32", ulps=64)
    assert_close(
        attention(q, k, v, pos, causal=causal),
        rotary.attention(qn, kn, vn, np.arange(6), causal=causal),
        like=q,
        ulps=64,
    )
    d = b.asarray(np.arange(0, 96, 16), "float32")
    assert_close(
        decay_bound(d, 64), rotary.decay_bound(np.arange(0, 96, 16, dtype=np.float32), 64), like=d, ulps=16
    )
