"""``rotary.positions``: packed and padded positions, M-RoPE position ids, re-rotation of cached keys.

Array results are checked on every backend; M-RoPE ids against ``transformers``' own
``get_rope_index``; re-rotations against the float64 matrix-form reference, and shown to stay
exact where unrotating and rotating again in float32 does not.
"""

from __future__ import annotations

import numpy as np
import pytest

import rotary
from rotary import positions
from rotary import scaling as sc
from rotary.testing import assert_close, reference


def _ints(backend, a):
    return backend.asarray(np.asarray(a), backend.int_dtype())


def _host(backend, x):
    out = backend.to_numpy(x)
    assert np.issubdtype(out.dtype, np.integer)
    return out


# -- packed batches -----------------------------------------------------------------------------
def _packed_ref(lengths, total=None):
    pos = np.concatenate([np.arange(n) for n in lengths] or [np.zeros(0, dtype=np.int64)])
    total = len(pos) if total is None else total
    return np.concatenate([pos, np.zeros(total - len(pos), dtype=pos.dtype)])


def test_packed_positions(backend):
    for lengths in ([3, 1, 2], [0, 4, 0, 1]):
        total = sum(lengths) + 3
        cu = np.concatenate([[0], np.cumsum(lengths)])
        got = positions.from_lengths(_ints(backend, lengths), total=sum(lengths) if backend.lazy else None)
        np.testing.assert_array_equal(_host(backend, got), _packed_ref(lengths))
        got = positions.from_cu_seqlens(_ints(backend, cu), total=total)
        np.testing.assert_array_equal(_host(backend, got), _packed_ref(lengths, total))
        assert type(got) is type(_ints(backend, cu))


@pytest.mark.slow_backends_too
@pytest.mark.parametrize("dtype", ["int8", "uint8", "int16"])
def test_packed_positions_of_narrow_integer_dtypes(backend, dtype):
    # Regression: the running sums and positions were kept in the lengths' dtype and wrapped
    # (int8 [100, 100] gave position -126 for 30) or, on torch, failed in index_select.
    lengths = [100, 27, 100] if dtype == "int8" else [200, 27, 100]
    cu = np.concatenate([[0], np.cumsum(lengths)])
    total = sum(lengths)
    try:
        arr = backend.asarray(np.asarray(lengths), dtype)
    except (TypeError, ValueError, AttributeError):
        pytest.skip(f"{backend.name} has no {dtype}")
    got = positions.from_lengths(arr, total=total if backend.lazy else None)
    np.testing.assert_array_equal(_host(backend, got), _packed_ref(lengths))
    if int(cu[-1]) <= np.iinfo(dtype).max:
        got = positions.from_cu_seqlens(backend.asarray(cu, dtype), total=total + 50)
        np.testing.assert_array_equal(_host(backend, got), _packed_ref(lengths, total + 50))
    short = positions.from_lengths(backend.asarray(np.asarray([3, 1]), dtype), total=4)
    assert backend.to_numpy(short).dtype == np.dtype(dtype)  # positions that fit keep the dtype


def test_packed_positions_from_host_values_and_errors():
    np.testing.assert_array_equal(positions.from_lengths([2, 3]), [0, 1, 0, 1, 2])
    np.testing.assert_array_equal(positions.from_cu_seqlens((0, 2, 5), total=6), [0, 1, 0, 1, 2, 0])
    with pytest.raises(ValueError, match="lengths must be non-negative"):
        positions.from_lengths([2, -1])
    with pytest.raises(ValueError, match="cu_seqlens must start at 0"):
        positions.from_cu_seqlens([1, 3])
    with pytest.raises(ValueError, match="cu_seqlens must be non-decreasing"):
        positions.from_cu_seqlens([0, 3, 2])
    with pytest.raises(ValueError, match="total=4 is shorter"):
        positions.from_lengths([2, 3], total=4)
    with pytest.raises(TypeError, match="lengths must hold integers"):
        positions.from_lengths([2.5, 3])
    with pytest.raises(ValueError, match="lengths must be a 1-d array"):
        positions.from_lengths([[2, 3]])


def test_attention_mask_positions(backend):
    mask = np.array([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 1, 1, 0, 1]])
    want = np.where(mask == 1, np.cumsum(mask, axis=-1) - 1, 0)
    m = _ints(backend, mask)
    np.testing.assert_array_equal(_host(backend, positions.from_attention_mask(m)), want)
    want1 = np.where(mask == 1, want, 1)
    np.testing.assert_array_equal(_host(backend, positions.from_attention_mask(m, fill=1)), want1)
    b = m != 0
    np.testing.assert_array_equal(_host(backend, positions.from_attention_mask(b)), want)


def test_attention_mask_positions_rotate_like_hf():
    # left-padded rows rotated at their mask positions equal the unpadded rows at 0..n-1
    rope = rotary.RoPE(8)
    x = np.random.default_rng(0).normal(size=(2, 5, 8)).astype(np.float32)
    mask = np.array([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    out = rope.rotate(x, positions.from_attention_mask(mask))
    np.testing.assert_array_equal(out[0, 2:], rope.rotate(x[0, 2:], np.arange(3)))
    with pytest.raises(TypeError, match="mask must be a boolean or integer array"):
        positions.from_attention_mask(np.ones((2, 3), dtype=np.float32))


def test_traceable_under_jax_jit():
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    f = jax.jit(lambda lens: positions.from_lengths(lens, total=6))
    np.testing.assert_array_equal(np.asarray(f(jnp.asarray([3, 1, 2]))), [0, 1, 2, 0, 0, 1])
    g = jax.jit(positions.from_attention_mask)
    np.testing.assert_array_equal(np.asarray(g(jnp.asarray([[0, 1, 1]]))), [[0, 0, 1]])
    rope = rotary.RoPE(8)
    k = jnp.asarray(np.random.default_rng(0).normal(size=(3, 8)).astype(np.float32))
    h = jax.jit(lambda k, d: positions.shift_keys(k, d, rope))
    assert_close(h(k, jnp.asarray(5)), reference.rotate(np.asarray(k), 5), like=k)
    lr = rotary.RoPE(8, scaling=sc.LongRoPE((1.0, 1.0, 2.0, 2.0), (1.0, 2.0, 8.0, 16.0), 4, factor=4.0))
    other = rotary.RoPE(8, base=5e5)
    r = jax.jit(
        lambda k, p: positions.rerotate_keys(positions.longrope_switch(k, p, lr), p, rotary.RoPE(8), other)
    )
    p = jnp.arange(3) + 1000
    want = positions.rerotate_keys(positions.longrope_switch(k, p, lr), p, rotary.RoPE(8), other)
    assert_close(r(k, p), np.asarray(want), like=k)
    with pytest.raises(ValueError, match="pass total="):
        jax.jit(positions.from_lengths)(jnp.asarray([3, 1]))


def test_traceable_under_torch_compile():
    torch = pytest.importorskip("torch")
    rope = rotary.RoPE(16, layout="interleaved")

    other = rotary.RoPE(16, layout="interleaved", base=5e5)

    @torch.compile(fullgraph=True, backend="eager")  # (the trace is what is tested, not inductor)
    def f(k, mask, cu):
        k = positions.shift_keys(k, positions.from_attention_mask(mask), rope)
        return positions.rerotate_keys(k, positions.from_cu_seqlens(cu, total=4), rope, other)

    def g(k, mask, cu):
        k = positions.shift_keys(k, positions.from_attention_mask(mask), rope)
        return positions.rerotate_keys(k, positions.from_cu_seqlens(cu, total=4), rope, other)

    k = torch.randn(2, 4, 16, generator=torch.Generator().manual_seed(0))
    mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
    cu = torch.tensor([0, 1, 4])
    torch.testing.assert_close(f(k, mask, cu), g(k, mask, cu))


# -- KV-cache re-rotation -----------------------------------------------------------------------
#: One key shape for every backend test (JAX compiles each operation once per shape).
SHAPE = (2, 3, 6, 16)


def test_shift_keys(backend, rng):
    layout = "interleaved"
    rope = rotary.RoPE(16, layout=layout, rotary_dim=12, scaling=sc.YaRN(4.0, 64))
    k0 = rng.normal(size=SHAPE)
    p = np.arange(1000, 1006)
    cached = rope.rotate(backend.asarray(k0, "float32"), p)
    delta = np.array([-1000, 37])[:, None, None]  # per batch row
    got = positions.shift_keys(cached, delta, rope)
    # the truth: the unrotated keys at p + delta, attention factor once
    th, af = rope.inv_freq(), rope.attention_factor
    want = reference.rotate(k0, p + delta, layout=layout, rotary_dim=12, th=th, scale=af)
    assert_close(got, want, like=cached, ulps=16)


def test_shift_keys_mrope_and_proportional(backend, rng):
    mrope = rotary.MRoPE(16, sections=(4, 2, 2), interleaved=True)
    k0 = rng.normal(size=SHAPE)
    k = backend.asarray(k0, "float32")
    s = np.arange(6)
    p = np.stack([s + 10, s // 2 + 10, s % 2 + 10])  # (3, seq): rows first
    cached = mrope.rotate(k, p)
    got = positions.shift_keys(cached, -10, mrope)
    assert_close(got, backend.to_numpy(mrope.rotate(k, p - 10)), like=cached, ulps=16)
    prop = rotary.RoPE(16, rotary_dim=4, partial="proportional")
    cached = prop.rotate(k, s + 500)
    got = positions.shift_keys(cached, -500, prop)
    want = reference.rotate_pairs(k0, s[:, None], prop.inv_freq())
    assert_close(got, want, like=cached, ulps=16)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_rerotate_keys_to_another_rope(backend, rng, dtype):
    if dtype not in backend.float_dtypes():
        pytest.skip(f"{backend.name} has no {dtype}")
    src = rotary.RoPE(16, base=10000.0)
    dst = rotary.RoPE(16, base=500000.0, scaling=sc.YaRN(8.0, 128))  # another attention factor too
    k0 = rng.normal(size=SHAPE)
    p = np.array([0, 1, 7, 4095, 123456, 2**30 + 3])
    cached = src.rotate(backend.asarray(k0, dtype), p)
    got = positions.rerotate_keys(cached, p, src, dst)
    want = reference.rotate(k0, p, th=dst.inv_freq(), scale=dst.attention_factor)
    assert_close(got, want, like=cached, ulps=32)


def test_rerotation_is_exact_where_float32_unrotate_rotate_is_not(rng):
    # LongRoPE's switch at long positions: one exact rotation by p * (theta_long - theta_short)
    # against unrotating with float32 angles and rotating again.
    short, long = (1.0,) * 4 + (2.0,) * 4, (1.0,) * 4 + (16.0,) * 4
    rope = rotary.RoPE(16, scaling=sc.LongRoPE(short, long, 4096, factor=32.0))
    k0 = rng.normal(size=(5, 16))
    p = 2**20 + np.arange(5)
    s_rope = rotary.RoPE(16, scaling=sc.Factors(short))
    cached = s_rope.rotate(k0.astype(np.float32), p) * np.float32(rope.attention_factor)
    want = reference.rotate(
        k0, p, th=rotary.RoPE(16, scaling=sc.Factors(long)).inv_freq(), scale=rope.attention_factor
    )
    ours = positions.longrope_switch(cached, p, rope)
    naive = rotary.RoPE(16, scaling=sc.Factors(long), angles="float32").rotate(
        rotary.RoPE(16, scaling=sc.Factors(short), angles="float32").rotate(cached, -p), p
    )
    err_ours, err_naive = np.abs(ours - want).max(), np.abs(naive - want).max()
    assert err_ours < 32 * np.finfo(np.float32).eps * np.abs(want).max()
    assert err_naive > 100 * err_ours


def test_longrope_switch(backend, rng):
    short, long = tuple(np.linspace(1, 2, 8)), tuple(np.linspace(1, 40, 8))
    rope = rotary.RoPE(16, scaling=sc.LongRoPE(short, long, 6, factor=8.0))
    k0 = rng.normal(size=SHAPE)
    p = np.arange(6)
    cached = rope.rotate(backend.asarray(k0, "float32"), p)  # seq_len 6 <= 6: the short factors
    got = positions.longrope_switch(cached, p, rope)
    th_long = rotary.RoPE(16, scaling=sc.Factors(long)).inv_freq()
    assert_close(got, reference.rotate(k0, p, th=th_long, scale=rope.attention_factor), like=cached, ulps=16)


def test_longrope_switch_gives_what_the_model_computes_past_the_switch(rng):
    short, long = tuple(np.linspace(1, 2, 8)), tuple(np.linspace(1, 40, 8))
    rope = rotary.RoPE(16, scaling=sc.LongRoPE(short, long, 6, factor=8.0))
    k = rng.normal(size=(7, 16)).astype(np.float32)
    cached = rope.rotate(k[:6], np.arange(6))
    after = rope.rotate(k, np.arange(7))  # seq_len 7 > 6: the long factors for every key
    np.testing.assert_allclose(positions.longrope_switch(cached, np.arange(6), rope), after[:6], atol=2e-6)


def test_rerotation_errors(rng):
    k = rng.normal(size=(3, 16)).astype(np.float32)
    dyn = rotary.RoPE(16, scaling=sc.DynamicNTK(2.0, 64))
    with pytest.raises(ValueError, match="sequence-length-dependent scaling"):
        positions.shift_keys(k, 1, dyn)
    with pytest.raises(ValueError, match="same features: layout"):
        positions.rerotate_keys(k, [0, 1, 2], rotary.RoPE(16), rotary.RoPE(16, layout="interleaved"))
    with pytest.raises(ValueError, match="same features"):
        positions.rerotate_keys(k, [0, 1, 2], rotary.RoPE(16), rotary.RoPE(16, rotary_dim=8))
    with pytest.raises(TypeError, match="LongRoPE"):
        positions.longrope_switch(k, [0, 1, 2], rotary.RoPE(16))
    # Regression: an MRoPE was taken with 1-D positions (wrong for image tokens by ~1).
    mrope = rotary.MRoPE(16, sections=(2, 3, 3))
    for src, dst in ((mrope, rotary.RoPE(16)), (rotary.RoPE(16), mrope)):
        with pytest.raises(TypeError, match="got an MRoPE"):
            positions.rerotate_keys(k, [0, 1, 2], src, dst)
    with pytest.raises(TypeError, match="k must be an array"):
        positions.shift_keys([[1.0] * 16], 1, rotary.RoPE(16))
    with pytest.raises(TypeError, match=r"rope must be a rotary\.RoPE or rotary\.MRoPE"):
        positions.shift_keys(k, 1, "rope")


# -- M-RoPE position ids ------------------------------------------------------------------------
IMG, VID = 9, 8


def _prompt():
    """Two rows, the second left-padded: text, an image, text, a video, text."""
    row0 = [1, 2] + [IMG] * 4 + [3] + [VID] * 8 + [4, 5]
    row1 = [0, 0, 0, 0, 0, 0, 6] + [IMG] * 6 + [7, 7, 7, 7]
    ids = np.array([row0, row1])
    mask = np.array([[1] * 17, [0] * 6 + [1] * 11])
    image_grid = np.array([[1, 4, 4], [1, 4, 6]])
    video_grid = np.array([[2, 4, 4]])
    return ids, mask, image_grid, video_grid


def test_mrope_position_ids_host_and_backends(backend):
    ids, mask, ig, vg = _prompt()
    types = (ids == IMG) + 2 * (ids == VID)
    tt = _ints(backend, types) if backend.host_values else types
    pid, delta = positions.mrope_position_ids(tt, ig, vg, attention_mask=mask)
    p, d = _host(backend, pid), _host(backend, delta)
    assert p.shape == (3, 2, 17) and d.shape == (2, 1)
    # row 0: text 0,1; image (t=1, 2x2 after merging) at 2; text 4; video (t=2, 2x2) at 5; text 7,8
    np.testing.assert_array_equal(p[:, 0, :2], [[0, 1]] * 3)
    np.testing.assert_array_equal(p[1, 0, 2:6], [2, 2, 3, 3])
    np.testing.assert_array_equal(p[2, 0, 2:6], [2, 3, 2, 3])
    np.testing.assert_array_equal(p[0, 0, 7:15], [5, 5, 5, 5, 6, 6, 6, 6])
    np.testing.assert_array_equal(p[:, 0, 15:], [[7, 8]] * 3)
    assert d[0, 0] == 9 - 17
    np.testing.assert_array_equal(p[:, 1, :6], 0)  # padding
    assert d[1, 0] == 8 - 11  # text 0, image rows 1-2 and columns 1-3, text 4..7


def test_mrope_position_ids_errors():
    types = np.array([[0, 1, 1, 1, 1, 0]])
    with pytest.raises(ValueError, match="more images than image_grid_thw rows"):
        positions.mrope_position_ids(types)
    with pytest.raises(ValueError, match="has 9 tokens, but its run"):
        positions.mrope_position_ids(types, [[1, 6, 6]])
    with pytest.raises(ValueError, match="token_types must hold 0"):
        positions.mrope_position_ids(np.array([[0, 3]]))
    with pytest.raises(ValueError, match="second_per_grid_ts needs tokens_per_second"):
        positions.mrope_position_ids(types, [[1, 4, 4]], second_per_grid_ts=[1.0])


def test_mrope_position_ids_default_video_seconds_for_many_videos():
    # Regression: the default second_per_grid_ts ran out after as many videos as token
    # columns (transformers' iter([1] * seq_len)) and a bare StopIteration escaped.
    tt = np.array([[2, 2, 0, 2, 2, 0]] * 4)  # 8 videos of 2 frames, 6 token columns
    grid = [[2, 1, 1]] * 8
    pid, _ = positions.mrope_position_ids(tt, None, grid, spatial_merge_size=1, tokens_per_second=2.0)
    np.testing.assert_array_equal(np.asarray(pid)[0], [[0, 2, 1, 2, 4, 3]] * 4)  # frames 2 apart
    secs = positions.mrope_position_ids(
        tt, None, grid, spatial_merge_size=1, tokens_per_second=2.0, second_per_grid_ts=[1.0] * 8
    )[0]
    np.testing.assert_array_equal(np.asarray(pid), np.asarray(secs))


@pytest.mark.parametrize("name", ["Qwen2-VL", "Qwen2.5-VL", "Qwen3-VL"])
def test_mrope_index_equals_transformers_get_rope_index(name):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from hf_families import BY_NAME
    from test_hf_families import _tiny_dict, _tiny_model

    f = BY_NAME[name]
    model = _tiny_model(f)
    cfg = dict(_tiny_dict(f), image_token_id=IMG, video_token_id=VID)
    ids, mask, ig, vg = _prompt()
    if name == "Qwen3-VL":  # frames of a video are separated by timestamp text tokens
        row0 = [1, 2] + [IMG] * 4 + [3] + [VID] * 4 + [3] + [VID] * 4 + [4]
        ids = np.array([row0, list(ids[1])])
    t = torch.as_tensor
    types = t((ids == IMG) + 2 * (ids == VID))
    kwargs = {}
    if name == "Qwen2.5-VL":
        kwargs["second_per_grid_ts"] = torch.tensor([0.7])
    for m in (None, mask):
        want = model.model.get_rope_index(
            t(ids),
            mm_token_type_ids=types,
            image_grid_thw=t(ig),
            video_grid_thw=t(vg),
            attention_mask=None if m is None else t(m),
            **kwargs,
        )
        got = rotary.hf.mrope_index(cfg, t(ids), ig, vg, attention_mask=None if m is None else t(m), **kwargs)
        assert got[0].dtype == want[0].dtype
        torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)
        torch.testing.assert_close(got[1], want[1], rtol=0, atol=0)
    # decode: later text tokens continue from the deltas
    pos = positions.from_attention_mask(t(mask))[:, -1:] + 1
    nxt = positions.mrope_text_positions(pos, got[1])
    assert nxt.shape == (3, 2, 1)
    torch.testing.assert_close(nxt[0], pos + got[1])


def test_mrope_positions_drive_the_mrope():
    cfg = {
        "model_type": "qwen2_vl",
        "hidden_size": 64,
        "num_attention_heads": 4,
        "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]},
        "image_token_id": IMG,
        "video_token_id": VID,
        "vision_config": {"spatial_merge_size": 2},
    }
    ids, mask, ig, vg = _prompt()
    pid, _ = rotary.hf.mrope_index(cfg, ids, ig, vg, attention_mask=mask)
    mrope = rotary.hf.mrope_from_hf(cfg)
    q = np.random.default_rng(0).normal(size=(2, 4, 17, 16)).astype(np.float32)
    qr, _ = mrope.apply(q, q, pid[:, :, None, :])
    assert qr.shape == q.shape
    # text tokens (all rows equal) rotate as 1-D RoPE
    np.testing.assert_allclose(qr[0, :, :2], mrope.rope.rotate(q[0, :, :2], np.arange(2)), atol=1e-6)


def test_frequencies_scaling(backend, rng):
    # explicit per-pair frequencies (zero and negative allowed), exact angles, attention factor 1
    w = (0.5, -0.25, 0.0, 1e-3, 2.0, -3.0, 1e-6, 0.0)
    rope = rotary.RoPE(16, scaling=sc.Frequencies(w), layout="interleaved")
    np.testing.assert_array_equal(rope.inv_freq(), w)
    assert (
        rope.attention_factor == 1.0
        and sc.from_dict({"rope_type": "frequencies", "freqs": w}) == rope.scaling
    )
    k0 = rng.normal(size=SHAPE)
    p = np.arange(6) + 2**20
    assert_close(
        rope.rotate(backend.asarray(k0, "float32"), p),
        reference.rotate(k0, p, layout="interleaved", th=np.asarray(w)),
        like=backend.asarray(k0, "float32"),
        ulps=16,
    )
    with pytest.raises(ValueError, match="must have rotary_dim // 2 = 8 entries, got 3"):
        rotary.RoPE(16, scaling=sc.Frequencies((1.0, 2.0, 3.0)))
    with pytest.raises(ValueError, match=r"Frequencies freqs\[1\] must be finite"):
        sc.Frequencies((1.0, float("inf")))
    with pytest.raises(TypeError, match="Frequencies freqs must be a sequence"):
        sc.Frequencies(1.0)
