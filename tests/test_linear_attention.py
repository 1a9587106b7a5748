"""rotary.linear_attention / linear_attention_state / attention against float64 references."""

from __future__ import annotations

import dataclasses
import itertools
from typing import ClassVar

import array_api_compat
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rotary
from rotary.scaling import Scaling
from rotary.testing import assert_close, to_numpy
from rotary.testing.reference import pair_indices
from rotary.testing.reference import rotate as rotate_ref
from rotary.testing.reference import theta as inv_freq64


# -- float64 references ----------------------------------------------------------------
def _phi64(name):
    return {
        "elu+1": lambda x: np.where(x > 0, x + 1.0, np.exp(np.minimum(x, 0.0))),
        "relu": lambda x: np.maximum(x, 0.0),
        "softplus": lambda x: np.log1p(np.exp(x)),
        "identity": lambda x: x,
    }[name]


def _unit(x):
    n = np.linalg.norm(x, axis=-1, keepdims=True)
    return np.where(n > 0, x / np.where(n > 0, n, 1.0), 0.0)


def _rot64(x, pos, layout="half", base=10000.0):
    """Vectorised float64 RoPE (for long sequences, where the matrix form is too slow)."""
    d = x.shape[-1]
    ang = np.asarray(pos, dtype=np.float64)[..., None] * inv_freq64(d, base)
    c, s = np.cos(ang), np.sin(ang)
    ia, ib = (np.array(t) for t in zip(*pair_indices(d, layout)))
    out = np.array(x, dtype=np.float64)
    out[..., ia] = x[..., ia] * c - x[..., ib] * s
    out[..., ib] = x[..., ib] * c + x[..., ia] * s
    return out


def naive(
    q,
    k,
    v,
    pos,
    *,
    causal=False,
    feature_map="elu+1",
    similarity="dot",
    key_mask=None,
    eps=0.0,
    k_pos=None,
    layout="half",
    rot=rotate_ref,
):
    """The O(N^2) formula of eq. 19 in float64; returns (out, error scale)."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    phi = _phi64(feature_map) if isinstance(feature_map, str) else feature_map
    fq, fk = phi(q), phi(k)
    kp = pos if k_pos is None else k_pos
    if similarity == "cosine":
        fq, fk = _unit(fq), _unit(fk)
    if pos is None:
        a, b = fq, fk
    else:
        a, b = rot(fq, pos, layout=layout), rot(fk, kp, layout=layout)
    num = a @ np.swapaxes(b, -1, -2)
    den = fq @ np.swapaxes(fk, -1, -2)
    if similarity == "cosine":
        num = den = 1.0 + num
    n, m = q.shape[-2], k.shape[-2]
    keep = np.ones((n, m))
    if causal:
        keep = np.tril(keep)
    if key_mask is not None:
        keep = keep * np.asarray(key_mask, dtype=np.float64)[..., None, :]
    num, den = num * keep, den * keep
    d = den.sum(-1)[..., None]
    if eps:
        d = np.maximum(d, eps)
    d = np.where(d != 0, d, np.inf)  # no visible key: output 0
    out = (num @ v) / d
    # Rounding-error scale of each output: sum_j |num_ij| |v_j| / den_i.
    scale = np.maximum(1.0, (np.abs(num) @ np.abs(v)) / d)
    return out, scale


def _inputs(backend, rng, shape=(2, 3, 11, 8), dv=5, dtype="float32", m=None):
    *lead, n, d = shape
    m = n if m is None else m
    x = [rng.normal(size=shape), rng.normal(size=(*lead, m, d)), rng.normal(size=(*lead, m, dv))]
    xb = [backend.asarray(a, dtype) for a in x]
    return xb, [to_numpy(a).astype(np.float64) for a in xb]  # reference sees the rounded inputs


def _int(backend):
    return "int64" if backend.float64 else "int32"


# -- algorithm == formula --------------------------------------------------------------
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("chunk_size", [1, 4, 5, 11, None])
def test_matches_naive_formula(backend, rng, causal, chunk_size):
    (q, k, v), (qn, kn, vn) = _inputs(backend, rng)
    pos = np.arange(11) + 3
    out = rotary.linear_attention(
        q, k, v, backend.asarray(pos, _int(backend)), causal=causal, chunk_size=chunk_size
    )
    assert out.dtype == q.dtype and tuple(out.shape) == (2, 3, 11, 5)
    ref, scale = naive(qn, kn, vn, pos, causal=causal)
    assert_close(out, ref, dtype="float32", scale=scale, ulps=16)


def test_non_causal_streams_long_sequences_in_parts(backend, rng):
    """Non-causal attention over more tokens than one part (an eager loop takes whole parts of 512
    up to 2 MiB of feature rows: 32 heads of 32 features make 512; here two parts, the second
    short, the output written part by part) is the formula's."""
    (q, k, v), (qn, kn, vn) = _inputs(backend, rng, shape=(4, 8, 600, 32), dv=8)
    pos = np.arange(600) * 3
    out = rotary.linear_attention(q, k, v, backend.asarray(pos, _int(backend)))
    ref, scale = naive(qn, kn, vn, pos, rot=_rot64)
    assert_close(out, ref, dtype="float32", scale=scale, ulps=16)


@pytest.mark.parametrize(
    ("feature_map", "similarity", "layout"),
    [
        ("relu", "dot", "interleaved"),
        ("softplus", "dot", "half"),
        ("identity", "cosine", "half"),
        ("elu+1", "cosine", "interleaved"),
    ],
)
def test_feature_maps_and_cosine(backend, rng, feature_map, similarity, layout):
    dtype = "float64" if backend.float64 else "float32"
    (q, k, v), (qn, kn, vn) = _inputs(backend, rng, dtype=dtype)
    pos = rng.integers(0, 1000, size=11)
    kw = {"feature_map": feature_map, "similarity": similarity}
    rope = rotary.RoPE(8, layout=layout)
    for causal in (False, True):
        out = rotary.linear_attention(
            q, k, v, backend.asarray(pos, _int(backend)), rope=rope, causal=causal, chunk_size=4, **kw
        )
        ref, scale = naive(qn, kn, vn, pos, causal=causal, layout=layout, **kw)
        assert_close(out, ref, dtype=dtype, scale=scale, ulps=16)


def test_callable_feature_map_may_change_width(backend, rng):
    (q, k, v), (qn, kn, vn) = _inputs(backend, rng, shape=(1, 2, 7, 3))  # odd d, even features

    def phi(x):
        xp = array_api_compat.array_namespace(x)
        return xp.concat([xp.exp(x), xp.exp(-x)], axis=-1)

    pos = np.arange(7)
    out, st_ = rotary.linear_attention(
        q, k, v, backend.asarray(pos, _int(backend)), causal=True, feature_map=phi, return_state=True
    )
    ref, scale = naive(
        qn, kn, vn, pos, causal=True, feature_map=lambda x: np.concatenate([np.exp(x), np.exp(-x)], -1)
    )
    assert_close(out, ref, dtype="float32", scale=scale, ulps=16)
    assert tuple(st_.S.shape) == (1, 2, 6, 5)


def test_non_causal_cross_attention_and_key_mask(backend, rng):
    (q, k, v), (qn, kn, vn) = _inputs(backend, rng, shape=(2, 1, 5, 8), m=9)
    qpos, kpos = np.arange(5) + 20, np.arange(9)
    km = rng.random(size=(2, 1, 9)) < 0.7
    km[..., 0] = True
    out = rotary.linear_attention(
        q,
        k,
        v,
        backend.asarray(qpos, _int(backend)),
        k_pos=backend.asarray(kpos, _int(backend)),
        key_mask=backend.asarray(km, "bool"),
    )
    ref, scale = naive(qn, kn, vn, qpos, k_pos=kpos, key_mask=km)
    assert_close(out, ref, dtype="float32", scale=scale, ulps=16)


def test_padded_keys_do_not_leak(backend, rng):
    """Garbage in padded keys and values changes nothing (features zeroed, not just v)."""
    (q, k, v), _ = _inputs(backend, rng, shape=(1, 2, 10, 8))
    kn, vn = to_numpy(k).copy(), to_numpy(v).copy()
    kn[..., 6:, :] = 50.0  # huge features if they leaked into the denominator
    vn[..., 6:, :] = 1e3
    km = np.arange(10) < 6
    pos = backend.asarray(np.arange(10), _int(backend))
    kw = {"causal": True, "chunk_size": 4, "key_mask": backend.asarray(km, "bool")}
    a = rotary.linear_attention(q, k, v, pos, **kw)
    b = rotary.linear_attention(q, backend.asarray(kn, "float32"), backend.asarray(vn, "float32"), pos, **kw)
    np.testing.assert_array_equal(to_numpy(a), to_numpy(b))
    assert np.all(np.isfinite(to_numpy(a)))


# -- decoding and the state algebra ----------------------------------------------------
@pytest.mark.parametrize("similarity", ["dot", "cosine"])
def test_token_by_token_and_pieces_equal_one_call(backend, rng, similarity):
    (q, k, v), _ = _inputs(backend, rng, shape=(2, 2, 8, 8))
    n = 8
    pos = backend.asarray(np.arange(n), _int(backend))
    kw = {"causal": True, "similarity": similarity}
    whole, st_whole = rotary.linear_attention(q, k, v, pos, chunk_size=5, return_state=True, **kw)
    ref = to_numpy(whole)
    for cuts in ([3, 5],) if backend.slow else ([1] * n, [3, 5]):  # (token by token: n computations)
        state, outs, s = None, [], 0
        for c in cuts:
            sl = slice(s, s + c)
            o, state = rotary.linear_attention(
                q[..., sl, :], k[..., sl, :], v[..., sl, :], pos[sl], state=state, return_state=True, **kw
            )
            outs.append(to_numpy(o))
            s += c
        assert_close(np.concatenate(outs, axis=-2), ref, dtype="float32", ulps=16)
        assert state.offset == n
        assert_close(
            state.S, to_numpy(st_whole.S), dtype="float32", ulps=16, scale=np.abs(to_numpy(st_whole.S)).max()
        )
        assert_close(
            state.z, to_numpy(st_whole.z), dtype="float32", ulps=16, scale=np.abs(to_numpy(st_whole.z)).max()
        )


def test_rope_without_positions_follows_the_state(backend, rng):
    """``pos=None`` with ``rope=`` and a state: the tokens sit at ``state.offset, offset + 1,
    ...`` (issue 49: refused, "rope= needs positions"), token by token and in pieces, with an
    int offset or a 0-d array one: the same bits as the positions passed."""
    (q, k, v), _ = _inputs(backend, rng, shape=(2, 2, 8, 8))
    rope = rotary.RoPE(8)
    st0 = rotary.linear_attention_state(
        k[..., :3, :], v[..., :3, :], backend.asarray(np.arange(3), _int(backend))
    )
    offsets = [3] if backend.slow else [3, backend.asarray(np.array(3), _int(backend))]
    for off in offsets:
        for cuts in ([2, 3],) if backend.slow else ([1] * 5, [2, 3]):
            state = rotary.LinearAttentionState(st0.S, st0.z, off)
            given, s = state, 3
            for c in cuts:
                sl = slice(s, s + c)
                args = (q[..., sl, :], k[..., sl, :], v[..., sl, :])
                o, state = rotary.linear_attention(
                    *args, rope=rope, causal=True, state=state, return_state=True
                )
                pos = backend.asarray(np.arange(s, s + c), _int(backend))
                want, given = rotary.linear_attention(*args, pos, causal=True, state=given, return_state=True)
                np.testing.assert_array_equal(to_numpy(o), to_numpy(want))
                np.testing.assert_array_equal(to_numpy(state.S), to_numpy(given.S))
                assert int(state.offset) == int(given.offset) == s + c
                s += c
    with pytest.raises(ValueError, match="rope= needs positions"):  # (no state: nothing to follow)
        rotary.linear_attention(q, k, v, rope=rope, causal=True)


def test_states_of_disjoint_blocks_add(backend, rng):
    """The distributed recipe: per-chunk states, exclusive prefix sums, causal per chunk."""
    (q, k, v), _ = _inputs(backend, rng, shape=(2, 10, 8), dv=3)
    pos = backend.asarray(np.arange(10) + 100, _int(backend))
    whole = to_numpy(rotary.linear_attention(q, k, v, pos, causal=True))
    bounds = [(0, 4), (4, 7), (7, 10)]
    states = [rotary.linear_attention_state(k[..., a:b, :], v[..., a:b, :], pos[a:b]) for a, b in bounds]
    full = rotary.linear_attention_state(k, v, pos)
    total = rotary.combine(*states)
    assert total.offset == 10 and sum(states).offset == 10
    assert_close(total.S, to_numpy(full.S), dtype="float32", ulps=16, scale=np.abs(to_numpy(full.S)).max())
    prefix = states[0].zeros_like()
    outs = []
    for (a, b), s in zip(bounds, states):
        sl = slice(a, b)
        outs.append(
            to_numpy(
                rotary.linear_attention(
                    q[..., sl, :], k[..., sl, :], v[..., sl, :], pos[sl], causal=True, state=prefix
                )
            )
        )
        prefix = prefix + s
    assert_close(np.concatenate(outs, axis=-2), whole, dtype="float32", ulps=16)
    # non-causal with a prefix state == non-causal over the concatenation
    nc = rotary.linear_attention(
        q[..., 7:, :], k[..., 7:, :], v[..., 7:, :], pos[7:], state=states[0] + states[1]
    )
    ref = rotary.linear_attention(q[..., 7:, :], k, v, pos[7:], k_pos=pos)
    assert_close(nc, to_numpy(ref), dtype="float32", ulps=16)


# -- properties of eq. 19 --------------------------------------------------------------
@pytest.mark.parametrize("causal", [False, True])
def test_equal_positions_give_plain_linear_attention(backend, rng, causal):
    dtype = "float64" if backend.float64 else "float32"
    (q, k, v), _ = _inputs(backend, rng, dtype=dtype)
    plain = to_numpy(rotary.linear_attention(q, k, v, None, causal=causal, chunk_size=4))
    for p in (backend.asarray(np.full(11, 12345), _int(backend)), 7):
        out = rotary.linear_attention(q, k, v, p, causal=causal, chunk_size=4)
        assert_close(out, plain, dtype=dtype, ulps=16)


def test_global_shift_invariance(backend, rng):
    (q, k, v), _ = _inputs(backend, rng)
    pos = np.arange(11)
    a = rotary.linear_attention(q, k, v, backend.asarray(pos, _int(backend)), causal=True, chunk_size=4)
    b = rotary.linear_attention(
        q, k, v, backend.asarray(pos + 4000, _int(backend)), causal=True, chunk_size=3
    )
    assert_close(a, to_numpy(b).astype(np.float64), dtype="float32", ulps=16)


def test_denominator_is_not_rotated(backend, rng):
    """With v = 1 plain linear attention returns 1; the RoPE form does not (numerator only)."""
    (q, k, _), _ = _inputs(backend, rng)
    ones = backend.asarray(np.ones((2, 3, 11, 2)), "float32")
    plain = to_numpy(rotary.linear_attention(q, k, ones, None, causal=True))
    np.testing.assert_allclose(plain, 1.0, rtol=1e-5)
    roped = to_numpy(
        rotary.linear_attention(q, k, ones, backend.asarray(np.arange(11) * 10, _int(backend)), causal=True)
    )
    assert np.abs(roped - 1.0).max() > 0.05
    # cosine similarity rotates both, so v = 1 gives 1 again
    cos = to_numpy(
        rotary.linear_attention(
            q, k, ones, backend.asarray(np.arange(11) * 10, _int(backend)), similarity="cosine", causal=True
        )
    )
    np.testing.assert_allclose(cos, 1.0, rtol=1e-5)


def test_cosine_is_safe_for_zero_vectors(backend, rng):
    qn = rng.normal(size=(1, 6, 4))
    kn = rng.normal(size=(1, 6, 4))
    qn[0, 2] = 0.0
    kn[0, 0] = 0.0
    vn = rng.normal(size=(1, 6, 3))
    q, k, v = (backend.asarray(x, "float32") for x in (qn, kn, vn))
    pos = np.arange(6)
    out = rotary.linear_attention(
        q, k, v, backend.asarray(pos, _int(backend)), similarity="cosine", causal=True
    )
    ref, scale = naive(qn, kn, vn, pos, similarity="cosine", feature_map="identity", causal=True)
    assert np.all(np.isfinite(to_numpy(out)))
    assert_close(out, ref, dtype="float32", scale=scale, ulps=16)


@pytest.mark.parametrize("q_value", [-30.0, -200.0])
def test_denominator_exact_for_tiny_features(backend, rng, q_value):
    """elu+1 of very negative queries: features of 1e-13 (q = -30) or below float32's range
    (q = -200). The output does not depend on the query features' scale, and is exact: an
    absolute floor of the denominator returned 4e-7 where the answer is 0.88 (237a6c9)."""
    q = backend.asarray(np.full((1, 6, 4), q_value), "float32")
    k = backend.asarray(rng.normal(size=(1, 6, 4)), "float32")
    v = backend.asarray(rng.normal(size=(1, 6, 2)) + 1.0, "float32")
    pos = backend.asarray(np.arange(6), _int(backend))
    for causal in (True, False):
        out = rotary.linear_attention(q, k, v, pos, causal=causal)
        # the float64 oracle: the features of q = 0, all equal as those of q_value are
        ref, scale = naive(np.zeros((1, 6, 4)), to_numpy(k), to_numpy(v), np.arange(6), causal=causal)
        assert_close(out, ref, dtype="float32", scale=scale, ulps=16)


@pytest.mark.parametrize("factor", [1e-30, 1e30])
def test_output_independent_of_query_feature_scale(backend, rng, factor):
    """A feature map scaled by 1e-30 or 1e30 gives the same output (the scale cancels in the
    ratio; no floor of the denominator sees it)."""
    (q, k, v), (qn, kn, vn) = _inputs(backend, rng)
    pos = backend.asarray(np.arange(11), _int(backend))

    def scaled(x):  # elu+1, scaled: 1e-60 and 1e60 products of q and k features are out of range
        xp = array_api_compat.array_namespace(x)
        return (xp.maximum(x, xp.zeros_like(x)) + xp.exp(xp.minimum(x, xp.zeros_like(x)))) * factor

    for causal in (False, True):
        out = rotary.linear_attention(q, k, v, pos, causal=causal, feature_map=scaled)
        ref, scale = naive(qn, kn, vn, np.arange(11), causal=causal)
        assert_close(out, ref, dtype="float32", scale=scale, ulps=16)


def test_zero_denominator_gives_zero(backend, rng):
    """Queries that see no key (every key padding) get 0, not NaN; ``eps`` floors instead."""
    (q, k, v), _ = _inputs(backend, rng, shape=(1, 5, 4), dv=3)
    mask = backend.asarray(np.zeros((1, 5), dtype=bool), "bool")
    pos = backend.asarray(np.arange(5), _int(backend))
    for causal in (False, True):
        out = to_numpy(rotary.linear_attention(q, k, v, pos, causal=causal, key_mask=mask))
        np.testing.assert_array_equal(out, 0.0)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_low_precision_long_sequence(backend, dtype):
    """N = 65536 float16/bfloat16 inputs: float32 running sums keep outputs at input precision."""
    if dtype not in backend.float_dtypes():
        pytest.skip(f"{backend.name} has no {dtype}")
    rng = np.random.default_rng(7)
    n, d, dv = 65536, 4, 2
    qb, kb, vb = (backend.asarray(rng.normal(size=(n, w)), dtype) for w in (d, d, dv))
    pos = np.arange(n)
    out = rotary.linear_attention(qb, kb, vb, backend.asarray(pos, "int32"), causal=True, chunk_size=256)
    assert out.dtype == qb.dtype
    q, k, v = (to_numpy(x).astype(np.float64) for x in (qb, kb, vb))
    phi = _phi64("elu+1")
    fq, fk = phi(q), phi(k)
    a, b = _rot64(fq, pos), _rot64(fk, pos)
    S = np.cumsum(b[:, :, None] * v[:, None, :], axis=0)  # (n, d, dv) prefix sums, float64
    num = np.einsum("nd,nde->ne", a, S)
    den = np.sum(fq * np.cumsum(fk, axis=0), axis=-1)
    absnum = np.einsum(
        "nd,nde->ne", np.abs(a), np.cumsum(np.abs(b)[:, :, None] * np.abs(v)[:, None, :], axis=0)
    )
    ref = num / den[:, None]
    # Error scale sum_j |a_i . b_j| |v_j| / den_i, bounded above by |a_i| . sum_j |b_j||v_j| / den_i.
    assert_close(out, ref, dtype=dtype, scale=np.maximum(1.0, absnum / den[:, None]), ulps=4)


# -- autodiff and compilation ----------------------------------------------------------
def _torch_naive(q, k, v, pos, causal):
    import torch

    fq = torch.where(q > 0, q + 1, torch.exp(torch.clamp(q, max=0)))
    fk = torch.where(k > 0, k + 1, torch.exp(torch.clamp(k, max=0)))
    a, b = rotary.rotate(fq, pos), rotary.rotate(fk, pos)
    num, den = a @ b.transpose(-1, -2), fq @ fk.transpose(-1, -2)
    if causal:
        m = torch.tril(torch.ones(q.shape[-2], q.shape[-2], dtype=q.dtype))
        num, den = num * m, den * m
    return (num @ v) / den.sum(-1, keepdim=True)


@pytest.mark.parametrize("causal", [False, True])
def test_torch_gradients_match_naive_autograd(rng, causal):
    torch = pytest.importorskip("torch")
    xs = [torch.tensor(rng.normal(size=(2, 9, 6)), dtype=torch.float64, requires_grad=True) for _ in range(3)]
    g = torch.tensor(rng.normal(size=(2, 9, 6)), dtype=torch.float64)
    pos = torch.arange(9) * 3
    out = rotary.linear_attention(*xs, pos, causal=causal, chunk_size=4)
    grads = torch.autograd.grad((out * g).sum(), xs)
    ref = torch.autograd.grad((_torch_naive(*xs, pos, causal) * g).sum(), xs)
    for a, b in zip(grads, ref):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("causal", [False, True])
def test_jax_gradients_match_naive_autograd(rng, causal):
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    dt = jnp.float64 if jax.config.jax_enable_x64 else jnp.float32
    tol = 1e-10 if dt == jnp.float64 else 2e-5
    xs = [jnp.asarray(rng.normal(size=(2, 9, 6)), dtype=dt) for _ in range(3)]
    g = jnp.asarray(rng.normal(size=(2, 9, 6)), dtype=dt)
    pos = jnp.arange(9) * 3

    @jax.jit
    def naive_j(q, k, v, pos):
        fq, fk = jax.nn.elu(q) + 1, jax.nn.elu(k) + 1
        a, b = rotary.rotate(fq, pos), rotary.rotate(fk, pos)
        num, den = a @ jnp.swapaxes(b, -1, -2), fq @ jnp.swapaxes(fk, -1, -2)
        if causal:
            m = jnp.tril(jnp.ones((9, 9), dtype=dt))
            num, den = num * m, den * m
        return (num @ v) / den.sum(-1, keepdims=True)

    def ours(q, k, v):
        return rotary.linear_attention(q, k, v, pos, causal=causal, chunk_size=4)

    ga = jax.grad(lambda *a: jnp.sum(ours(*a) * g), argnums=(0, 1, 2))(*xs)
    gb = jax.grad(lambda *a: jnp.sum(naive_j(*a, pos) * g), argnums=(0, 1, 2))(*xs)
    for a, b in zip(ga, gb):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=tol, atol=tol)


def test_jax_jit_traces_positions_and_state(rng):
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    q, k, v = (jnp.asarray(rng.normal(size=(2, 10, 8)), dtype=jnp.float32) for _ in range(3))
    traces = []

    @jax.jit
    def f(q, k, v, pos, state):
        traces.append(1)
        return rotary.linear_attention(
            q, k, v, pos, causal=True, chunk_size=3, state=state, return_state=True
        )

    st0 = rotary.linear_attention_state(k[:, :2], v[:, :2], jnp.arange(2))
    st0 = rotary.LinearAttentionState(st0.S, st0.z, jnp.asarray(2))
    for off in (0, 1000):
        pos = jnp.arange(10) + off
        out, st1 = f(q, k, v, pos, st0)
        eager = rotary.linear_attention(q, k, v, pos, causal=True, chunk_size=3, state=st0)
        assert_close(out, np.asarray(eager, dtype=np.float64), dtype="float32", ulps=16)
        assert int(st1.offset) == 12
    assert len(traces) == 1


def test_jax_user_feature_map_compiles_once(rng):
    # Regression: the user's map went into the jit cache key as a fresh bound method each call
    # (never equal), so every call traced and compiled again and the cache grew.
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    compiles: list[str] = []
    listening = [True]

    def listen(event, duration, **kw):
        if listening[0] and event.endswith("backend_compile_duration"):
            compiles.append(event)

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        q, k, v = (jnp.asarray(rng.normal(size=(2, 8, 4)), dtype=jnp.float32) for _ in range(3))

        def phi(x):
            return jnp.exp(x)

        first = rotary.linear_attention(q, k, v, np.arange(8), feature_map=phi)
        n = len(compiles)
        again = rotary.linear_attention(q, k, v, np.arange(8), feature_map=phi)
    finally:
        listening[0] = False
    assert n > 0 and len(compiles) == n
    assert_close(again, np.asarray(first, dtype=np.float64), dtype="float32", ulps=0)


def test_torch_compile_fullgraph(rng):
    torch = pytest.importorskip("torch")
    q, k, v = (torch.tensor(rng.normal(size=(1, 2, 8, 8)), dtype=torch.float32) for _ in range(3))

    @torch.compile(fullgraph=True)
    def f(q, k, v, pos):
        out, st_ = rotary.linear_attention(q, k, v, pos, causal=True, chunk_size=4, return_state=True)
        return out, st_.S

    for off in (0, 300):
        pos = torch.arange(8) + off
        out, S = f(q, k, v, pos)
        ref, st_ = rotary.linear_attention(q, k, v, pos, causal=True, chunk_size=4, return_state=True)
        torch.testing.assert_close(out, ref)
        torch.testing.assert_close(S, st_.S)


# -- bad input -------------------------------------------------------------------------
def test_errors_name_the_argument(backend, rng):
    (q, k, v), _ = _inputs(backend, rng, shape=(2, 6, 8), dv=3)
    pos = backend.asarray(np.arange(6), _int(backend))
    la = rotary.linear_attention
    with pytest.raises(ValueError, match="k and v must have the same sequence length"):
        la(q, k, v[:, :5, :], pos)
    with pytest.raises(ValueError, match="same feature dim"):
        la(q[..., :6], k, v, pos)
    with pytest.raises(ValueError, match="even"):
        la(q[..., :7], k[..., :7], v, pos)
    la(q[..., :7], k[..., :7], v, None)  # odd dims are fine without RoPE
    for bad in (0, -3):
        with pytest.raises(ValueError, match="chunk_size"):
            la(q, k, v, pos, causal=True, chunk_size=bad)
    for bad in (2.5, True):
        with pytest.raises(TypeError, match="chunk_size"):
            la(q, k, v, pos, causal=True, chunk_size=bad)
    with pytest.raises(ValueError, match="eps"):
        la(q, k, v, pos, eps=-1.0)
    with pytest.raises(ValueError, match="causal=True needs as many queries as keys"):
        la(q[:, :4, :], k, v, pos[:4], causal=True)
    with pytest.raises(ValueError, match="feature_map"):
        la(q, k, v, pos, feature_map="tanh")
    with pytest.raises(ValueError, match="similarity"):
        la(q, k, v, pos, similarity="euclid")
    with pytest.raises(TypeError, match="key_mask"):
        la(q, k, v, pos, key_mask=k[..., 0])
    with pytest.raises(ValueError, match="pos of shape"):
        la(q, k, v, backend.asarray(np.arange(5), _int(backend)))
    st_ = rotary.linear_attention_state(k, v, pos)
    with pytest.raises(ValueError, match=r"state\.S has shape"):  # d_v mismatch
        la(q, k, v[..., :2], pos, state=st_)
    with pytest.raises(ValueError, match=r"state\.S has shape"):  # other batch shape
        la(q[:1, ...], k[:1, ...], v[:1, ...], pos, state=st_)
    with pytest.raises(ValueError, match=r"state\.S has shape"):  # cosine adds a feature
        la(q, k, v, pos, state=st_, similarity="cosine")
    with pytest.raises(TypeError, match="state must be"):
        la(q, k, v, pos, state=(st_.S, st_.z))
    with pytest.raises(ValueError, match="do not broadcast"):
        la(q, k, backend.asarray(rng.normal(size=(3, 6, 3)), "float32"), pos)
    with pytest.raises(ValueError, match="depends on the sequence length"):
        la(q, k, v, pos, rope=rotary.RoPE(8, scaling=_LengthDependent()))


@dataclasses.dataclass(frozen=True)
class _LengthDependent(Scaling):
    rope_type: ClassVar[str] = "test_length_dependent"
    dynamic: ClassVar[bool] = True


# -- softmax attention -----------------------------------------------------------------
def softmax_ref(q, k, v, pos, k_pos, *, causal=False, mask=None, scale=None):
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    n, m = q.shape[-2], k.shape[-2]
    if pos is not None:
        q, k = rotate_ref(q, pos), rotate_ref(k, pos if k_pos is None else k_pos)
    logits = (q @ np.swapaxes(k, -1, -2)) * (1 / np.sqrt(q.shape[-1]) if scale is None else scale)
    keep = np.ones((n, m), dtype=bool)
    if causal:
        keep &= np.arange(m)[None, :] <= np.arange(n)[:, None] + (m - n)
    if mask is not None and mask.dtype == bool:
        keep = keep & mask
    elif mask is not None:
        logits = logits + mask
    logits = np.where(keep, logits, -np.inf)
    mx = np.max(logits, axis=-1, keepdims=True)
    p = np.exp(logits - np.where(np.isfinite(mx), mx, 0.0))
    den = p.sum(-1, keepdims=True)
    return (p @ v) / np.where(den > 0, den, 1.0)


@pytest.mark.parametrize("block_size", [None, 2])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_matches_reference(backend, rng, causal, block_size):
    dtype = "float64" if backend.float64 else "float32"
    (q, k, v), (qn, kn, vn) = _inputs(backend, rng, shape=(2, 2, 5, 8), dv=3, dtype=dtype, m=7)
    qpos, kpos = np.arange(5) + 2, np.arange(7)
    bm = rng.random(size=(2, 1, 5, 7)) < 0.6
    bm[0, 0, 1, :] = False  # a fully masked row gives 0
    am = rng.normal(size=(5, 7))
    for mask in (None, bm, am):
        mb = None if mask is None else backend.asarray(mask, "bool" if mask.dtype == bool else dtype)
        out = rotary.attention(
            q,
            k,
            v,
            backend.asarray(qpos, _int(backend)),
            k_pos=backend.asarray(kpos, _int(backend)),
            causal=causal,
            mask=mb,
            block_size=block_size,
        )
        assert out.dtype == q.dtype and tuple(out.shape) == (2, 2, 5, 3)
        ref = softmax_ref(qn, kn, vn, qpos, kpos, causal=causal, mask=mask)
        assert_close(out, ref, dtype=dtype, ulps=32)
    if mask is not None:
        np.testing.assert_array_equal(
            to_numpy(rotary.attention(q, k, v, None, mask=backend.asarray(bm, "bool")))[0, :, 1], 0.0
        )


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_attention_low_precision_and_large_logits(backend, rng, dtype):
    if dtype not in backend.float_dtypes():
        pytest.skip(f"{backend.name} has no {dtype}")
    (q, k, v), (qn, kn, vn) = _inputs(backend, rng, shape=(1, 6, 8), dv=4, dtype=dtype)
    pos = np.arange(6)
    out = rotary.attention(q, k, v, backend.asarray(pos, "int32"), causal=True, scale=30.0)  # logits ~ 1e2
    assert out.dtype == q.dtype
    assert_close(out, softmax_ref(qn, kn, vn, pos, None, causal=True, scale=30.0), dtype=dtype, ulps=4)


def test_attention_errors(backend, rng):
    (q, k, v), _ = _inputs(backend, rng, shape=(1, 4, 8), dv=3)
    pos = backend.asarray(np.arange(4), _int(backend))
    with pytest.raises(ValueError, match="same sequence length"):
        rotary.attention(q, k, v[:, :3, :], pos)
    with pytest.raises(ValueError, match="same feature dim"):
        rotary.attention(q, k[..., :6], v, pos)
    with pytest.raises(ValueError, match="block_size"):
        rotary.attention(q, k, v, pos, block_size=0)
    with pytest.raises(ValueError, match="even"):
        rotary.attention(q[..., :7], k[..., :7], v, pos)
    # Regression: a mask that broadcast with the scores but not to them grew the output.
    for shape in ((6, 4), (3, 1, 4, 4)):
        with pytest.raises(ValueError, match="does not broadcast to the scores"):
            rotary.attention(q, k, v, pos, mask=backend.asarray(np.zeros(shape), "float32"))
    with pytest.raises(ValueError, match="does not broadcast to the scores"):
        rotary.attention(q[:, :1, :], k, v, pos[:1], k_pos=pos, mask=backend.asarray(np.ones((6, 4)), "bool"))
    # Regression: k_pos without pos was ignored (no rotation at all, no error).
    for fn in (rotary.attention, rotary.linear_attention):
        with pytest.raises(ValueError, match="k_pos= given without pos="):
            fn(q, k, v, k_pos=pos)


@settings(max_examples=15, deadline=None)
@given(
    cuts=st.lists(st.integers(1, 5), min_size=1, max_size=4),
    chunk=st.integers(1, 6),
    start=st.integers(-50, 10_000),
)
def test_state_additivity_property(cuts, chunk, start):
    """Any split into blocks: summed states == whole state; chunked causal == naive."""
    rng = np.random.default_rng(sum(cuts) * 31 + chunk)
    n = sum(cuts)
    q, k, v = rng.normal(size=(2, n, 4)), rng.normal(size=(2, n, 4)), rng.normal(size=(2, n, 3))
    pos = np.arange(n) + start
    whole = rotary.linear_attention_state(k, v, pos)
    bounds = np.cumsum([0, *cuts])
    parts = [
        rotary.linear_attention_state(k[:, a:b], v[:, a:b], pos[a:b]) for a, b in itertools.pairwise(bounds)
    ]
    total = sum(parts)
    assert total.offset == n
    np.testing.assert_allclose(total.S, whole.S, rtol=1e-12, atol=1e-12 * np.abs(whole.S).max())
    np.testing.assert_allclose(total.z, whole.z, rtol=1e-12)
    out = rotary.linear_attention(q, k, v, pos, causal=True, chunk_size=chunk)
    ref, scale = naive(q, k, v, pos, causal=True, rot=_rot64)
    assert_close(out, ref, dtype="float64", scale=scale, ulps=64)
