"""Multi-axis RoPE (axial, M-RoPE) and Gemma-style proportional partial rotary.

References are float64 with extended-precision angles, built here from the formulas
(not from rotary's own frequency code); Hugging Face parity where transformers is installed.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rotary
from rotary.multiaxis import mrope_rows
from rotary.testing import assert_close, reference, to_numpy
from rotary.testing.reference import rotate as rotate_ref


def pair_rotate_ref(x: np.ndarray, angles: tuple[np.ndarray, np.ndarray], layout: str) -> np.ndarray:
    """Rotate pair i of ``x`` by ``pos_i * theta_i`` (``angles = (per-pair positions, thetas)``),
    with the float64 oracle; the rest passes through."""
    return reference.rotate_pairs(x, angles[0], angles[1], layout=layout)


def freqs64(dim: int, base: float = 10000.0) -> np.ndarray:
    """theta_j = base**(-2j/dim) in float64 (the definition)."""
    return reference.theta(dim, base)


def axial_theta(pos: np.ndarray, split, base=10000.0) -> tuple[np.ndarray, np.ndarray]:
    """(per-pair positions, thetas): axis a's block uses pos[..., a] and a 1-D RoPE of dim split[a]."""
    pos = np.asarray(pos)
    pp = np.concatenate([np.repeat(pos[..., a, None], v // 2, axis=-1) for a, v in enumerate(split)], axis=-1)
    return pp, np.concatenate([freqs64(v, base) for v in split])


def hf_rows(sections, interleaved: bool) -> np.ndarray:
    """Row of each frequency, written from HF's Qwen2-VL / Qwen3-VL recomposition code."""
    n = sum(sections)
    if not interleaved:
        return np.concatenate([np.full(v, j) for j, v in enumerate(sections)])
    rows = np.zeros(n, dtype=int)  # freqs_thw = freq[0]
    for dim, offset in enumerate((1, 2), start=1):
        rows[slice(offset, sections[dim] * 3, 3)] = dim
    return rows


def mrope_theta(pos: np.ndarray, sections, interleaved: bool, dim: int, base=10000.0):
    """pos (3, ...) -> (per-pair positions (..., dim/2), thetas)."""
    pos = np.asarray(pos)
    rows = hf_rows(sections, interleaved)
    return np.stack([pos[rows[i]] for i in range(dim // 2)], axis=-1), freqs64(dim, base)


def _int_dtype(backend):
    return backend.int_dtype()


# -- axial ----------------------------------------------------------------------------
@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize(
    ("head_dim", "n_axes", "split", "rotary_dim"),
    [(16, 2, None, None), (20, 3, None, None), (16, 2, (2, 6), 8)],
)
def test_axial_matches_reference(backend, rng, layout, head_dim, n_axes, split, rotary_dim):
    rope = rotary.AxialRoPE(head_dim, n_axes, split=split, layout=layout, rotary_dim=rotary_dim)
    r = rotary_dim or head_dim
    expected_split = split or tuple(2 * (r // 2 // n_axes + (a < (r // 2) % n_axes)) for a in range(n_axes))
    assert rope.split == expected_split and sum(rope.split) == r
    pos = rng.integers(0, 3000, size=(6, n_axes))
    for dtype in backend.float_dtypes():
        xb = backend.asarray(rng.normal(size=(3, 6, head_dim)), dtype)  # (heads, tokens, dim)
        out = rope.rotate(xb, backend.asarray(pos[None], _int_dtype(backend)))
        assert out.dtype == xb.dtype and type(out) is type(xb)
        x_in = to_numpy(xb).astype(np.float64)
        ref = x_in.copy()
        ref[..., :r] = pair_rotate_ref(x_in[..., :r], axial_theta(pos[None], rope.split), layout)
        assert_close(out, ref, dtype=dtype)


def test_axial_scores_depend_on_coordinate_differences_only(backend, rng):
    rope = rotary.AxialRoPE(16, 2, split=(6, 10), layout="interleaved")
    q = backend.asarray(rng.normal(size=(2, 5, 16)), "float32")
    k = backend.asarray(rng.normal(size=(2, 5, 16)), "float32")
    pq = rng.integers(0, 500, size=(5, 2))
    pk = rng.integers(0, 500, size=(5, 2))
    xp = backend.xp

    def scores(shift):
        shift = np.asarray(shift)
        qr, kr = rope.apply(
            q, k, backend.asarray(pq + shift, "int32"), k_pos=backend.asarray(pk + shift, "int32")
        )
        return to_numpy(qr @ xp.permute_dims(kr, (0, 2, 1)))

    base = scores([0, 0])
    for shift in ([7, 0], [0, 1000], [3000, -400]):
        assert_close(scores(shift), base, dtype="float32", ulps=64, scale=np.abs(base).max())
    # changing one axis' difference changes the scores: the test has teeth
    moved = rope.apply(
        q, k, backend.asarray(pq + np.array([5, 0]), "int32"), k_pos=backend.asarray(pk, "int32")
    )
    s2 = to_numpy(moved[0] @ xp.permute_dims(moved[1], (0, 2, 1)))
    assert np.abs(s2 - base).max() > 1e-3 * np.abs(base).max()


def test_axial_matches_hf_qwen2_vl_vision_rope(rng):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers.models.qwen2_vl import modeling_qwen2_vl as m2
    from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLVisionConfig

    emb = m2.Qwen2VLVisionRotaryEmbedding(Qwen2VLVisionConfig(embed_dim=64, num_heads=4))  # head_dim 16
    pp = torch.from_numpy(rng.integers(0, 40, size=(10, 2)))  # (patches, (h, w))
    x = torch.from_numpy(rng.normal(size=(10, 4, 16)).astype(np.float32))
    cos, sin = emb(x, pp)
    hq, hk = m2.apply_rotary_pos_emb_vision(x, x * 2, cos, sin)
    fast = rotary.AxialRoPE(16, 2, angles="float32")
    q, k = fast.apply(x, x * 2, pp[:, None, :])
    torch.testing.assert_close(q, hq, rtol=0, atol=0)  # bit-for-bit
    torch.testing.assert_close(k, hk, rtol=0, atol=0)
    xb = x.to(torch.bfloat16)  # HF rotates in float32 and casts back: so do we
    hq16, _ = m2.apply_rotary_pos_emb_vision(xb, xb, cos, sin)
    q16, _ = fast.apply(xb, xb, pp[:, None, :])
    assert q16.dtype == torch.bfloat16
    torch.testing.assert_close(q16, hq16, rtol=0, atol=0)
    exact, _ = rotary.AxialRoPE(16, 2).apply(x, x, pp[:, None, :])
    ref = pair_rotate_ref(x.numpy().astype(np.float64), axial_theta(pp.numpy()[:, None, :], (8, 8)), "half")
    assert_close(exact, ref, dtype="float32")


def test_axial_matches_lucidrains_axial_freqs(rng):
    torch = pytest.importorskip("torch")
    ret = pytest.importorskip("rotary_embedding_torch")
    pe = ret.RotaryEmbedding(dim=8, freqs_for="lang", theta=10000)  # 8 features per axis
    x = torch.from_numpy(rng.normal(size=(2, 3, 4, 16)).astype(np.float32))  # (batch, rows, cols, dim)
    theirs = ret.apply_rotary_emb(pe.get_axial_freqs(3, 4), x)
    rows, cols = np.meshgrid(np.arange(3), np.arange(4), indexing="ij")
    pos = np.stack([rows, cols], axis=-1)
    ours = rotary.AxialRoPE(16, 2, layout="interleaved").rotate(x, torch.from_numpy(pos))
    ref = pair_rotate_ref(x.numpy().astype(np.float64), axial_theta(pos, (8, 8)), "interleaved")
    assert_close(ours, ref, dtype="float32")
    assert_close(theirs, ref, dtype="float32", ulps=64)  # their float32 angles: same layout, looser


# -- M-RoPE ---------------------------------------------------------------------------
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_mrope_matches_reference(backend, rng, interleaved, layout):
    sections = (4, 2, 2) if interleaved else (2, 3, 3)
    rope = rotary.MRoPE(16, sections, interleaved=interleaved, layout=layout)
    np.testing.assert_array_equal(rope.rows(), hf_rows(sections, interleaved))
    pos = rng.integers(0, 5000, size=(3, 2, 1, 5))  # (rows, batch, 1, seq) for (batch, heads, seq, dim)
    for dtype in backend.float_dtypes():
        qb = backend.asarray(rng.normal(size=(2, 4, 5, 16)), dtype)
        kb = backend.asarray(rng.normal(size=(2, 2, 5, 16)), dtype)  # grouped-query
        q, k = rope.apply(qb, kb, backend.asarray(pos, _int_dtype(backend)))
        assert q.dtype == qb.dtype and k.dtype == kb.dtype
        theta = mrope_theta(pos, sections, interleaved, 16)
        assert_close(q, pair_rotate_ref(to_numpy(qb).astype(np.float64), theta, layout), dtype=dtype)
        assert_close(k, pair_rotate_ref(to_numpy(kb).astype(np.float64), theta, layout), dtype=dtype)


def test_mrope_explicit_rows(backend, rng):
    # rows= lays out any per-frequency row pattern (ERNIE-4.5-VL: height/width alternating, then
    # temporal); sections count the rows
    rows = (1, 2, 1, 2, 0, 0, 0, 0)
    rope = rotary.MRoPE(16, (4, 2, 2), rows=rows, layout="interleaved")
    np.testing.assert_array_equal(rope.rows(), rows)
    pos = rng.integers(0, 5000, size=(3, 2, 1, 5))
    qb = backend.asarray(rng.normal(size=(2, 4, 5, 16)), "float32")
    theta = np.stack([pos[r] for r in rows], axis=-1), freqs64(16, 10000.0)
    assert_close(
        rope.rotate(qb, backend.asarray(pos, _int_dtype(backend))),
        pair_rotate_ref(to_numpy(qb).astype(np.float64), theta, "interleaved"),
        dtype="float32",
    )
    # the consecutive and round-robin layouts, given as rows, are the same RoPE's numbers
    same = rotary.MRoPE(16, (4, 2, 2), rows=tuple(hf_rows((4, 2, 2), True)))
    p = backend.asarray(pos, _int_dtype(backend))
    np.testing.assert_array_equal(
        to_numpy(same.rotate(qb, p)), to_numpy(rotary.MRoPE(16, (4, 2, 2), interleaved=True).rotate(qb, p))
    )
    with pytest.raises(ValueError, match="rows must give each of the 8 frequencies"):
        rotary.MRoPE(16, (4, 2, 2), rows=(0, 0, 0, 1, 1, 1, 2, 2))
    with pytest.raises(ValueError, match="not both"):
        rotary.MRoPE(16, (4, 2, 2), rows=rows, interleaved=True)


@pytest.mark.parametrize("interleaved", [False, True])
def test_mrope_with_equal_rows_is_1d_rope(backend, rng, interleaved):
    sections = (4, 2, 2) if interleaved else (2, 3, 3)
    rope = rotary.MRoPE(16, sections, interleaved=interleaved, rotary_dim=None)
    x = backend.asarray(rng.normal(size=(2, 3, 7, 16)), "float32")
    p = rng.integers(0, 10_000, size=(7,))
    one_d = to_numpy(rotary.rotate(x, backend.asarray(p, "int32")))
    three = np.broadcast_to(p, (3, 7)).copy()
    np.testing.assert_array_equal(to_numpy(rope.rotate(x, backend.asarray(three, "int32"))), one_d)
    np.testing.assert_array_equal(to_numpy(rope.rotate(x, backend.asarray(p[None], "int32"))), one_d)


@pytest.mark.parametrize("model", ["qwen2_vl", "qwen3_vl"])
def test_mrope_matches_hf(rng, model):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    if model == "qwen2_vl":
        from transformers.models.qwen2_vl import modeling_qwen2_vl as m
        from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLTextConfig as Config

        sections, interleaved, extra = [2, 3, 3], False, {}
        emb_cls = m.Qwen2VLRotaryEmbedding
    else:
        from transformers.models.qwen3_vl import modeling_qwen3_vl as m
        from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLTextConfig as Config

        sections, interleaved, extra = [4, 2, 2], True, {"mrope_interleaved": True}
        emb_cls = m.Qwen3VLTextRotaryEmbedding
    rp = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": sections, **extra}
    cfg = Config(
        hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16, rope_parameters=rp
    )
    emb = emb_cls(cfg)
    pid = torch.from_numpy(rng.integers(0, 3000, size=(3, 2, 7)))
    q = torch.from_numpy(rng.normal(size=(2, 4, 7, 16)).astype(np.float32))
    k = torch.from_numpy(rng.normal(size=(2, 2, 7, 16)).astype(np.float32))
    cos, sin = emb(q, pid)
    hq, hk = m.apply_rotary_pos_emb(q, k, cos, sin)
    pos = pid[:, :, None, :]
    fq, fk = rotary.MRoPE(16, sections, interleaved=interleaved, angles="float32").apply(q, k, pos)
    torch.testing.assert_close(fq, hq, rtol=0, atol=0)  # bit-for-bit
    torch.testing.assert_close(fk, hk, rtol=0, atol=0)
    qb, kb = q.to(torch.bfloat16), k.to(torch.bfloat16)  # HF rotates in the input dtype
    cos16, sin16 = emb(qb, pid)
    hq16, hk16 = m.apply_rotary_pos_emb(qb, kb, cos16, sin16)
    fq16, fk16 = rotary.MRoPE(16, sections, interleaved=interleaved, angles="float32").apply(qb, kb, pos)
    assert fq16.dtype == torch.bfloat16
    torch.testing.assert_close(fq16, hq16, rtol=0, atol=0)
    torch.testing.assert_close(fk16, hk16, rtol=0, atol=0)
    eq, _ = rotary.MRoPE(16, sections, interleaved=interleaved).apply(q, k, pos)
    ref = pair_rotate_ref(
        q.numpy().astype(np.float64), mrope_theta(pos.numpy(), sections, interleaved, 16), "half"
    )
    assert_close(eq, ref, dtype="float32")  # exact angles: closer to float64 than HF's float32 recipe


@settings(max_examples=30, deadline=None)
@given(sections=st.lists(st.integers(1, 6), min_size=1, max_size=4), seed=st.integers(0, 2**16))
def test_mrope_rows_property(sections, seed):
    rows = mrope_rows(sections)
    assert np.bincount(rows, minlength=len(sections)).tolist() == sections
    assert (np.diff(rows) >= 0).all()
    head_dim = 2 * sum(sections)
    x = np.random.default_rng(seed).normal(size=(3, head_dim)).astype(np.float32)
    p = np.array([0, 5, 1234])
    rope = rotary.MRoPE(head_dim, sections)
    same = np.broadcast_to(p, (len(sections), 3))
    np.testing.assert_array_equal(rope.rotate(x, same), rotary.rotate(x, p))


# -- proportional partial rotary ------------------------------------------------------
@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("rotary_dim", [4, 8, 16])
def test_proportional_matches_reference(backend, rng, layout, rotary_dim):
    head_dim = 16
    # Gemma: exponent over the full head dim, only the first rotary_dim/2 pairs rotate.
    w = np.concatenate([freqs64(head_dim)[: rotary_dim // 2], np.zeros(head_dim // 2 - rotary_dim // 2)])
    pos = np.array([0, 1, 5, 300, 4097])
    for dtype in backend.float_dtypes():
        xb = backend.asarray(rng.normal(size=(2, 5, head_dim)), dtype)
        out = rotary.rotate(
            xb, backend.asarray(pos, "int32"), layout=layout, rotary_dim=rotary_dim, partial="proportional"
        )
        assert out.dtype == xb.dtype
        x_in = to_numpy(xb).astype(np.float64)
        assert_close(out, rotate_ref(x_in, pos, layout=layout, th=w.astype(np.float64)), dtype=dtype)
        # the non-rotated features are passed through exactly
        keep = [
            j
            for j in range(head_dim)
            if all(j not in ab for ab in reference.pair_indices(rotary_dim, layout))
        ]
        if layout == "half":
            keep = [j for j in range(head_dim) if j % (head_dim // 2) >= rotary_dim // 2]
        np.testing.assert_array_equal(to_numpy(out)[..., keep], to_numpy(xb)[..., keep])
    # and it differs from NeoX-style partial rotary of the same size (unless it is the whole head)
    x = rng.normal(size=(5, head_dim)).astype(np.float32)
    neox = rotary.rotate(x, pos, layout=layout, rotary_dim=rotary_dim)
    prop = rotary.RoPE(head_dim, layout=layout, rotary_dim=rotary_dim, partial="proportional").rotate(x, pos)
    assert np.array_equal(neox, prop) == (rotary_dim == head_dim)


def test_proportional_matches_hf(rng):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    rp = {"rope_type": "proportional", "rope_theta": 10000.0, "partial_rotary_factor": 0.25}
    cfg = LlamaConfig(hidden_size=64, num_attention_heads=2, head_dim=32, rope_parameters=rp)
    inv, af = ROPE_INIT_FUNCTIONS["proportional"](cfg)
    rope = rotary.RoPE(32, rotary_dim=8, partial="proportional", angles="float32")
    np.testing.assert_allclose(rope.inv_freq(), inv.numpy(), rtol=1e-6)
    pos = torch.arange(0, 3000, 37)
    fr = pos[None, :, None].float() * inv
    cos, sin = torch.cat([fr, fr], -1).cos() * af, torch.cat([fr, fr], -1).sin() * af
    x = torch.from_numpy(rng.normal(size=(1, 2, len(pos), 32)).astype(np.float32))
    hq, _ = apply_rotary_pos_emb(x, x, cos, sin)
    torch.testing.assert_close(rope.rotate(x, pos), hq, rtol=0, atol=0)
    c, _ = rope.cos_sin(pos, full=True)
    torch.testing.assert_close(c, cos[0], rtol=0, atol=0)
    # with HF's linear ``factor`` (frequencies divided after the zero padding)
    cfg4 = LlamaConfig(
        hidden_size=64, num_attention_heads=2, head_dim=32, rope_parameters={**rp, "factor": 4.0}
    )
    inv4, _ = ROPE_INIT_FUNCTIONS["proportional"](cfg4)
    lin = rotary.RoPE(
        32, rotary_dim=8, partial="proportional", scaling={"rope_type": "linear", "factor": 4.0}
    )
    np.testing.assert_allclose(lin.inv_freq(), inv4.numpy(), rtol=1e-6)
    with pytest.raises(ValueError, match="partial must be one of"):
        rotary.RoPE(32, rotary_dim=8, partial="gemma")


# -- tracing --------------------------------------------------------------------------
def _traced_cases():
    axial = rotary.AxialRoPE(16, 2, split=(6, 10))
    mrope = rotary.MRoPE(16, (4, 2, 2), interleaved=True)
    prop = rotary.RoPE(16, rotary_dim=8, partial="proportional", layout="interleaved")
    return axial, mrope, prop


def _run_cases(x, apos, mpos, ppos):
    axial, mrope, prop = _traced_cases()
    return axial.apply(x, x, apos)[0], mrope.rotate(x, mpos), prop.rotate(x, ppos)


def test_jax_jit(rng):
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    x = rng.normal(size=(2, 5, 16)).astype(np.float32)
    apos, mpos, ppos = rng.integers(0, 999, (5, 2)), rng.integers(0, 999, (3, 5)), np.arange(5)
    expected = _run_cases(x, apos, mpos, ppos)
    traces = []

    @jax.jit
    def f(x, apos, mpos, ppos):
        traces.append(1)
        return _run_cases(x, apos, mpos, ppos)

    for off in (0, 77):
        got = f(jnp.asarray(x), jnp.asarray(apos), jnp.asarray(mpos), jnp.asarray(ppos))
        if off == 0:
            for g, e in zip(got, expected):
                assert_close(g, e.astype(np.float64), dtype="float32")
    assert len(traces) == 1


def test_torch_compile_fullgraph(rng):
    torch = pytest.importorskip("torch")
    x = torch.from_numpy(rng.normal(size=(2, 5, 16)).astype(np.float32))
    apos = torch.from_numpy(rng.integers(0, 999, (5, 2)))
    mpos = torch.from_numpy(rng.integers(0, 999, (3, 5)))
    ppos = torch.arange(5)
    expected = _run_cases(x, apos, mpos, ppos)
    f = torch.compile(_run_cases, fullgraph=True)
    for g, e in zip(f(x, apos, mpos, ppos), expected):
        torch.testing.assert_close(g, e)


def test_bfloat16_preserved(backend, rng):
    if "bfloat16" not in backend.float_dtypes():
        pytest.skip(f"{backend.name} has no bfloat16")
    x = backend.asarray(rng.normal(size=(2, 4, 16)), "bfloat16")
    axial, mrope, prop = _traced_cases()
    a = axial.rotate(x, backend.asarray(rng.integers(0, 99, (4, 2)), "int32"))
    m = mrope.rotate(x, backend.asarray(rng.integers(0, 99, (3, 4)), "int32"))
    p = prop.rotate(x, backend.asarray(np.arange(4), "int32"))
    assert a.dtype == m.dtype == p.dtype == x.dtype


# -- bad input ------------------------------------------------------------------------
def test_errors_name_the_argument(rng):
    # Regression: per_sequence=True gave each position row of one sequence its own length.
    for scaling in (
        rotary.DynamicNTK(2.0, 16, per_sequence=True),
        rotary.LongRoPE([1.0] * 8, [2.0] * 8, 16, factor=4.0, per_sequence=True),
    ):
        with pytest.raises(ValueError, match="per_sequence=True cannot serve an MRoPE"):
            rotary.MRoPE(16, sections=(2, 3, 3), scaling=scaling)
    rotary.MRoPE(16, sections=(2, 3, 3), scaling=rotary.DynamicNTK(2.0, 16))  # one length: fine
    x = rng.normal(size=(4, 16)).astype(np.float32)
    with pytest.raises(ValueError, match="split must hold 2 even feature counts summing to rotary_dim=16"):
        rotary.AxialRoPE(16, 2, split=(6, 8))
    with pytest.raises(ValueError, match="split must have 2 entries"):
        rotary.AxialRoPE(16, 2, split=(16,))
    with pytest.raises(ValueError, match="n_axes must be an integer >= 1"):
        rotary.AxialRoPE(16, 0)
    with pytest.raises(ValueError, match=r"pos must have shape \(\.\.\., 2\)"):
        rotary.AxialRoPE(16).rotate(x, np.zeros((4, 3), dtype=int))
    with pytest.raises(ValueError, match=r"pos of shape \(5,\) does not broadcast"):
        rotary.AxialRoPE(16).rotate(x, np.zeros((5, 2), dtype=int))
    with pytest.raises(ValueError, match="sections must sum to rotary_dim // 2 = 8"):
        rotary.MRoPE(16, (2, 2, 2))
    with pytest.raises(ValueError, match="cannot be laid out round robin"):
        rotary.MRoPE(16, (1, 4, 3), interleaved=True)
    with pytest.raises(ValueError, match=r"pos must have shape \(3, \.\.\.\) or \(1, \.\.\.\)"):
        rotary.MRoPE(16, (2, 3, 3)).rotate(x, np.zeros((2, 4), dtype=int))
    with pytest.raises(ValueError, match="k_pos contains NaN"):
        rotary.MRoPE(16, (2, 3, 3)).apply(x, x, np.zeros((3, 4)), k_pos=np.full((3, 4), np.nan))
    with pytest.raises(ValueError, match=r"x.shape\[-1\] must equal head_dim=16"):
        rotary.MRoPE(16, (2, 3, 3)).rotate(x[:, :8], np.zeros((3, 4), dtype=int))
    with pytest.raises(ValueError, match="partial must be one of"):
        rotary.rotate(x, np.arange(4), partial="gemma")


def test_multiaxis_classes_compare_by_value():
    """Equal options, equal objects (as RoPE): usable as keys, in sets, and by ``hf`` round trips."""
    assert rotary.MRoPE(16, (2, 3, 3)) == rotary.MRoPE(16, [2, 3, 3])
    assert rotary.MRoPE(16, (2, 3, 3)) != rotary.MRoPE(16, (3, 3, 2))
    assert rotary.MRoPE(16, (2, 3, 3)) != rotary.MRoPE(16, (2, 3, 3), base=500.0)
    assert rotary.AxialRoPE(16, 2) == rotary.AxialRoPE(16, 2, split=(8, 8))
    assert rotary.AxialRoPE(16, 2) != rotary.AxialRoPE(16, 2, split=(4, 12))
    assert rotary.AxialRoPE(16, 1) != rotary.RoPE(16)
    assert len({rotary.MRoPE(16, (2, 3, 3)), rotary.MRoPE(16, (2, 3, 3)), rotary.AxialRoPE(16)}) == 2
