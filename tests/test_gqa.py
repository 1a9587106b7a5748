"""Grouped-query heads in ``attention`` and ``linear_attention``: k and v with ``Hq / g`` heads.

The query heads are grouped by reshaping (``(..., Hkv, g, N, d)``), never by repeating k and v;
the result must equal the repeated-k/v call, and match PyTorch's
``scaled_dot_product_attention(..., enable_gqa=True)`` and ``jax.nn.dot_product_attention``.
"""

from __future__ import annotations

import numpy as np
import pytest

import rotary
from rotary.testing import assert_close, to_numpy

G = 4  # query heads per key/value head


def _qkv(backend, rng, n=9, m=9, hq=8, d=16, dv=6):
    q = rng.normal(size=(2, hq, n, d))
    k = rng.normal(size=(2, hq // G, m, d))
    v = rng.normal(size=(2, hq // G, m, dv))
    return q, k, v


def _rep(x):
    return np.repeat(x, G, axis=1)


@pytest.mark.slow_backends_too
@pytest.mark.parametrize("causal", [False, True])
def test_attention_gqa_equals_repeated_kv(backend, rng, causal):
    q, k, v = _qkv(backend, rng, n=5, m=9)
    mask = rng.random((2, 8, 5, 9)) > 0.2  # one row of the mask per query head
    pos, kpos = np.arange(5) + 4, np.arange(9)
    args = [backend.asarray(a, "float32") for a in (q, k, v, _rep(k), _rep(v))]
    bm = backend.asarray(mask)
    for m in (None, bm):
        got = rotary.attention(*args[:3], pos, k_pos=kpos, causal=causal, mask=m)
        want = rotary.attention(args[0], args[3], args[4], pos, k_pos=kpos, causal=causal, mask=m)
        assert tuple(got.shape) == (2, 8, 5, 6)
        assert_close(got, to_numpy(want), like=args[0], ulps=16)


@pytest.mark.slow_backends_too
@pytest.mark.parametrize("causal", [False, True])
def test_linear_attention_gqa_equals_repeated_kv(backend, rng, causal):
    q, k, v = _qkv(backend, rng)
    pos = np.arange(9)
    a = [backend.asarray(x, "float32") for x in (q, k, v, _rep(k), _rep(v))]
    out, st = rotary.linear_attention(a[0], a[1], a[2], pos, causal=causal, chunk_size=4, return_state=True)
    want, wst = rotary.linear_attention(a[0], a[3], a[4], pos, causal=causal, chunk_size=4, return_state=True)
    assert tuple(out.shape) == (2, 8, 9, 6) and tuple(st.S.shape) == (2, 2, 16, 6)
    assert_close(out, to_numpy(want), like=a[0], ulps=16)
    assert_close(st.S, to_numpy(wst.S)[:, ::G], like=st.S, ulps=16)  # the state is per key head


def test_linear_attention_gqa_decode_state(backend, rng):
    q, k, v = _qkv(backend, rng)
    a = [backend.asarray(x, "float32") for x in (q, k, v)]
    pos = np.arange(9)
    full = rotary.linear_attention(*a, pos, causal=True)
    st = rotary.linear_attention_state(a[1][:, :, :8, :], a[2][:, :, :8, :], pos[:8])
    step, st2 = rotary.linear_attention(
        a[0][:, :, 8:, :], a[1][:, :, 8:, :], a[2][:, :, 8:, :], [8], causal=True, state=st, return_state=True
    )
    assert_close(step, to_numpy(full)[:, :, 8:], like=a[0], ulps=64)
    assert st2.offset == 9 and tuple(st2.S.shape) == (2, 2, 16, 6)


def test_gqa_head_counts_must_divide(rng):
    q, k, v = _qkv(None, rng)
    with pytest.raises(ValueError, match="multiple of the keys'"):
        rotary.attention(q[:, :7], k, v)  # 7 query heads, 2 key heads
    k4, v4 = np.concatenate([k, k], axis=1), np.concatenate([v, v], axis=1)
    with pytest.raises(ValueError, match="multiple of the keys'"):
        rotary.linear_attention(q[:, :6], k4, v4, np.arange(9))  # 6 query heads, 4 key heads


def test_attention_gqa_matches_torch_sdpa(rng):
    torch = pytest.importorskip("torch")
    q, k, v = (torch.from_numpy(x.astype(np.float32)) for x in _qkv(None, rng, n=5, m=9))
    pos, kpos = torch.arange(5) + 4, torch.arange(9)
    got = rotary.attention(q, k, v, pos, k_pos=kpos, causal=True)
    qr = rotary.rotate(q, pos)
    kr = rotary.rotate(k, kpos)
    causal = torch.ones(5, 9, dtype=torch.bool).tril(9 - 5)  # aligned at the end, as rotary's
    want = torch.nn.functional.scaled_dot_product_attention(qr, kr, v, attn_mask=causal, enable_gqa=True)
    assert_close(got, want.double().numpy(), like=q, ulps=32)


def test_attention_gqa_matches_jax_dot_product_attention(rng):
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    q, k, v = (jnp.asarray(x, dtype=jnp.float32) for x in _qkv(None, rng, n=9, m=9, dv=16))
    pos = jnp.arange(9)
    got = rotary.attention(q, k, v, pos, causal=True)
    qr, kr = rotary.rotate(q, pos), rotary.rotate(k, pos)
    # jax.nn.dot_product_attention takes (batch, seq, heads, dim) and groups heads itself
    t = lambda x: jnp.swapaxes(x, 1, 2)  # noqa: E731
    want = t(jax.nn.dot_product_attention(t(qr), t(kr), t(v), is_causal=True))
    assert_close(got, np.asarray(want, dtype=np.float64), like=q, ulps=32)


def test_dask_causal_linear_attention_gqa(rng):
    pytest.importorskip("dask.array")
    from rotary.distributed import causal_linear_attention_dask

    q, k, v = _qkv(None, rng, n=16, m=16)
    out = causal_linear_attention_dask(q, k, v, np.arange(16), chunks=4).compute()
    want = rotary.linear_attention(q, _rep(k), _rep(v), np.arange(16), causal=True)
    assert_close(out, want, like=q, ulps=64)
