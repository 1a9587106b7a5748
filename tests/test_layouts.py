"""rotary.convert_layout: exact, reversible layout conversion of activations and q/k weights."""

from __future__ import annotations

import importlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rotary
from rotary.layouts import layout_permutation
from rotary.testing import assert_close, to_numpy

OTHER = {"half": "interleaved", "interleaved": "half"}


def _hf_permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """peers.md "weight permutation" (HF LLaMA conversion, interleaved -> half) on (out, in) rows."""
    out, inp = w.shape
    return w.reshape(n_heads, out // n_heads // 2, 2, inp).transpose(0, 2, 1, 3).reshape(out, inp)


def _hf_unpermute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """The inverse (half -> interleaved): view rows as (n_heads, 2, hd/2) and swap back."""
    out, inp = w.shape
    return w.reshape(n_heads, 2, out // n_heads // 2, inp).transpose(0, 2, 1, 3).reshape(out, inp)


@pytest.mark.slow_backends_too
@pytest.mark.parametrize("src", ["half", "interleaved"])
@pytest.mark.parametrize("rotary_dim", [None, 4])
def test_round_trip_is_bitwise(backend, rng, src, rotary_dim):
    dst = OTHER[src]
    for dtype in backend.float_dtypes():
        xb = backend.asarray(rng.normal(size=(2, 3, 24)), dtype)
        y = rotary.convert_layout(xb, src, dst, head_dim=8, rotary_dim=rotary_dim)
        assert type(y) is type(xb) and y.dtype == xb.dtype and tuple(y.shape) == (2, 3, 24)
        if backend.device is not None:
            from rotary._lib._compat import device

            assert device(y) == backend.device
        back = rotary.convert_layout(y, dst, src, head_dim=8, rotary_dim=rotary_dim)
        np.testing.assert_array_equal(to_numpy(back), to_numpy(xb))
        # a real permutation: something moved (inside each head only), nothing lost
        yn, xn = to_numpy(y), to_numpy(xb)
        assert not np.array_equal(yn, xn)
        np.testing.assert_array_equal(
            np.sort(yn.reshape(2, 3, 3, 8), axis=-1), np.sort(xn.reshape(2, 3, 3, 8), axis=-1)
        )
        if rotary_dim is not None:  # pass-through features stay put
            np.testing.assert_array_equal(yn.reshape(6, 3, 8)[..., 4:], xn.reshape(6, 3, 8)[..., 4:])


def test_same_layout_is_identity_and_explicit_permutations():
    x = np.arange(12.0)
    assert rotary.convert_layout(x, "half", "half") is x
    np.testing.assert_array_equal(layout_permutation("interleaved", "half", 8), [0, 2, 4, 6, 1, 3, 5, 7])
    np.testing.assert_array_equal(layout_permutation("half", "interleaved", 8), [0, 4, 1, 5, 2, 6, 3, 7])
    np.testing.assert_array_equal(
        rotary.convert_layout(x, "interleaved", "half", head_dim=6, rotary_dim=4),
        [0, 2, 1, 3, 4, 5, 6, 8, 7, 9, 10, 11],
    )


@pytest.mark.parametrize("src", ["half", "interleaved"])
@pytest.mark.parametrize("rotary_dim", [None, 6])
def test_rotation_commutes_with_conversion(backend, rng, src, rotary_dim):
    dst = OTHER[src]
    x = backend.asarray(rng.normal(size=(2, 5, 10)), "float32")
    pos = backend.asarray(np.array([0, 3, 17, 900, 4097]), "int32")
    a = rotary.rotate(
        rotary.convert_layout(x, src, dst, rotary_dim=rotary_dim), pos, layout=dst, rotary_dim=rotary_dim
    )
    b = rotary.convert_layout(
        rotary.rotate(x, pos, layout=src, rotary_dim=rotary_dim), src, dst, rotary_dim=rotary_dim
    )
    # The same pairs see the same cos/sin and the same arithmetic: bitwise equal.
    np.testing.assert_array_equal(to_numpy(a), to_numpy(b))


def test_proportional_partial_converts_with_the_whole_head(rng):
    """Gemma-style proportional RoPE pairs over the whole head: convert with rotary_dim=None."""
    x = rng.normal(size=(4, 16)).astype(np.float32)
    pos = np.array([0, 9, 300, 5000])
    for src in ("half", "interleaved"):
        dst = OTHER[src]
        a = rotary.rotate(
            rotary.convert_layout(x, src, dst), pos, layout=dst, rotary_dim=4, partial="proportional"
        )
        b = rotary.convert_layout(
            rotary.rotate(x, pos, layout=src, rotary_dim=4, partial="proportional"), src, dst
        )
        np.testing.assert_array_equal(a, b)


def _attention_scores(x, wq, bq, wk, bk, n_heads, n_kv, hd, pos, layout, xp):
    """Scores q k^T (per query head) of a tiny GQA attention with torch-style (out, in) weights."""
    s = x.shape[0]
    q = x @ xp.permute_dims(wq, (1, 0)) + bq
    k = x @ xp.permute_dims(wk, (1, 0)) + bk
    q = xp.permute_dims(xp.reshape(q, (s, n_heads, hd)), (1, 0, 2))  # (H, S, hd)
    k = xp.permute_dims(xp.reshape(k, (s, n_kv, hd)), (1, 0, 2))  # (Hkv, S, hd)
    q, k = rotary.apply(q, k, pos, layout=layout)
    k = xp.repeat(k, n_heads // n_kv, axis=0)
    return q @ xp.permute_dims(k, (0, 2, 1))


@pytest.mark.parametrize("src", ["half", "interleaved"])
def test_port_tiny_gqa_attention(backend, rng, src):
    """A model trained in ``src`` gives the same scores after converting W_q, W_k, b_q, b_k."""
    dst = OTHER[src]
    xp = backend.xp
    n_heads, n_kv, hd, d_model, s = 4, 2, 8, 12, 6
    dt = "float64" if backend.float64 else "float32"
    x = backend.asarray(rng.normal(size=(s, d_model)), dt)
    wq = backend.asarray(rng.normal(size=(n_heads * hd, d_model)), dt)
    wk = backend.asarray(rng.normal(size=(n_kv * hd, d_model)), dt)
    bq = backend.asarray(rng.normal(size=(n_heads * hd,)), dt)
    bk = backend.asarray(rng.normal(size=(n_kv * hd,)), dt)
    pos = backend.asarray(np.array([0, 1, 2, 40, 41, 3000]), "int32")
    ref = _attention_scores(x, wq, bq, wk, bk, n_heads, n_kv, hd, pos, src, xp)

    conv = {"src": src, "dst": dst, "head_dim": hd}
    wq2 = rotary.convert_layout(wq, axis=0, **conv)
    wk2 = rotary.convert_layout(wk, axis=0, **conv)  # n_kv heads: same head_dim, fewer rows
    bq2, bk2 = rotary.convert_layout(bq, **conv), rotary.convert_layout(bk, **conv)
    got = _attention_scores(x, wq2, bq2, wk2, bk2, n_heads, n_kv, hd, pos, dst, xp)
    scale = np.abs(to_numpy(ref)).max()
    assert_close(got, to_numpy(ref).astype(np.float64), dtype=dt, ulps=8 * hd, scale=scale)
    # The wrong layout (forgetting to convert) gives different scores: the test has teeth.
    wrong = _attention_scores(x, wq, bq, wk, bk, n_heads, n_kv, hd, pos, dst, xp)
    assert np.abs(to_numpy(wrong) - to_numpy(ref)).max() > 1e-2 * scale

    # (in, out) weights (JAX/Keras Dense): axis=-1 converts the same rows.
    wq_t = rotary.convert_layout(xp.permute_dims(wq, (1, 0)), axis=-1, **conv)
    np.testing.assert_array_equal(to_numpy(wq_t).T, to_numpy(wq2))


@pytest.mark.parametrize("n_heads", [1, 3])
def test_matches_hf_llama_conversion_permutation(rng, n_heads):
    hd, d_model = 8, 5
    w = rng.normal(size=(n_heads * hd, d_model)).astype(np.float32)
    half = rotary.convert_layout(w, "interleaved", "half", axis=0, head_dim=hd)
    np.testing.assert_array_equal(half, _hf_permute(w, n_heads))
    np.testing.assert_array_equal(rotary.convert_layout(half, "half", "interleaved", axis=0, head_dim=hd), w)
    np.testing.assert_array_equal(_hf_unpermute(half, n_heads), w)


def test_matches_transformers_conversion_script_if_importable(rng):
    try:
        mod = importlib.import_module("transformers.models.llama.convert_llama_weights_to_hf")
    except Exception:
        pytest.skip("transformers' LLaMA conversion script is not importable (not shipped in the wheel)")
    torch = pytest.importorskip("torch")
    n_heads, hd, d_model = 2, 8, 16
    w = rng.normal(size=(n_heads * hd, d_model)).astype(np.float32)
    hf = mod.permute(torch.from_numpy(w), n_heads=n_heads, dim1=n_heads * hd, dim2=d_model)
    np.testing.assert_array_equal(
        rotary.convert_layout(w, "interleaved", "half", axis=0, head_dim=hd), hf.numpy()
    )


@settings(max_examples=25, deadline=None)
@given(
    n_heads=st.integers(1, 3),
    half_hd=st.integers(1, 6),
    rot_frac=st.floats(0.0, 1.0),
    axis=st.sampled_from([0, 1, -1]),
    src=st.sampled_from(["half", "interleaved"]),
    seed=st.integers(0, 2**16),
)
def test_hypothesis_shapes(n_heads, half_hd, rot_frac, axis, src, seed):
    hd = 2 * half_hd
    r = 2 * max(1, round(rot_frac * half_hd))
    shape = [3, 4, 2]
    shape[axis] = n_heads * hd
    x = np.random.default_rng(seed).normal(size=shape)
    y = rotary.convert_layout(x, src, OTHER[src], axis=axis, head_dim=hd, rotary_dim=r)
    np.testing.assert_array_equal(
        rotary.convert_layout(y, OTHER[src], src, axis=axis, head_dim=hd, rotary_dim=r), x
    )
    # Compare with an explicit per-head loop over the reference pairings.
    xm = np.moveaxis(x, axis, -1).reshape(*np.moveaxis(x, axis, -1).shape[:-1], n_heads, hd)
    ym = np.moveaxis(y, axis, -1).reshape(xm.shape)
    h = r // 2
    for i in range(h):  # pair i of src must become pair i of dst
        a_src, b_src = (i, i + h) if src == "half" else (2 * i, 2 * i + 1)
        a_dst, b_dst = (2 * i, 2 * i + 1) if src == "half" else (i, i + h)
        np.testing.assert_array_equal(ym[..., a_dst], xm[..., a_src])
        np.testing.assert_array_equal(ym[..., b_dst], xm[..., b_src])
    np.testing.assert_array_equal(ym[..., r:], xm[..., r:])


def test_dask_keeps_chunks_of_other_axes(rng):
    da = pytest.importorskip("dask.array")
    x = da.from_array(rng.normal(size=(6, 4, 16)), chunks=(2, 2, 16))
    y = rotary.convert_layout(x, "interleaved", "half", head_dim=8)
    assert y.chunks[:2] == x.chunks[:2]
    w = da.from_array(rng.normal(size=(16, 6)), chunks=(16, 3))
    wy = rotary.convert_layout(w, "half", "interleaved", axis=0, head_dim=8)
    assert wy.chunks[1] == w.chunks[1]
    np.testing.assert_array_equal(
        wy.compute(), rotary.convert_layout(w.compute(), "half", "interleaved", axis=0, head_dim=8)
    )


def test_jax_jit_and_torch_compile():
    x = np.random.default_rng(0).normal(size=(2, 16)).astype(np.float32)
    expected = rotary.convert_layout(x, "interleaved", "half", head_dim=8, rotary_dim=6)
    try:
        import jax
    except ImportError:
        jax = None
    if jax is not None:
        f = jax.jit(lambda a: rotary.convert_layout(a, "interleaved", "half", head_dim=8, rotary_dim=6))
        np.testing.assert_array_equal(np.asarray(f(jax.numpy.asarray(x))), expected)
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        g = torch.compile(
            lambda a: rotary.convert_layout(a, "interleaved", "half", head_dim=8, rotary_dim=6),
            fullgraph=True,
        )
        np.testing.assert_array_equal(g(torch.from_numpy(x)).numpy(), expected)
    if jax is None and torch is None:
        pytest.skip("neither jax nor torch installed")


def test_errors_name_the_argument(backend, rng):
    x = backend.asarray(rng.normal(size=(3, 12)), "float32")
    with pytest.raises(ValueError, match="src must be one of"):
        rotary.convert_layout(x, "neox", "half")
    with pytest.raises(ValueError, match="dst must be one of"):
        rotary.convert_layout(x, "half", "rope")
    with pytest.raises(ValueError, match=r"x.shape\[-1\]=12 is not a multiple of head_dim=8"):
        rotary.convert_layout(x, "half", "interleaved", head_dim=8)
    with pytest.raises(ValueError, match=r"x.shape\[0\]=3 is not a multiple of head_dim=2"):
        rotary.convert_layout(x, "half", "interleaved", axis=0, head_dim=2)
    with pytest.raises(ValueError, match="head_dim must be a positive even integer"):
        rotary.convert_layout(x, "half", "interleaved", head_dim=3)
    with pytest.raises(ValueError, match="rotary_dim must be a positive even integer"):
        rotary.convert_layout(x, "half", "interleaved", head_dim=6, rotary_dim=3)
    with pytest.raises(ValueError, match="rotary_dim=8 is larger than the head dimension head_dim=6"):
        rotary.convert_layout(x, "half", "interleaved", head_dim=6, rotary_dim=8)
    with pytest.raises(ValueError, match="axis=2 is out of range"):
        rotary.convert_layout(x, "half", "interleaved", axis=2)
    with pytest.raises(ValueError, match="must be a positive even integer, got 3"):
        rotary.convert_layout(x[:, :3], "half", "interleaved")
