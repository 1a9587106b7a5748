"""Vision towers' 2-D RoPEs (``rotary.vision``) against their peers: transformers' modules
(Llama 4 vision, DINOv3, Pixtral, Qwen2-VL vision), lucidrains (pixel frequencies, axial), and,
for timm's variants (EVA-02 ``RotaryEmbeddingCat``, RoPE-Mixed), which cannot be imported here,
the float64 formulas of the papers; every backend against the float64 oracle."""

from __future__ import annotations

import math

import numpy as np
import pytest

import rotary
from rotary.testing import assert_close, reference, to_numpy


def _pairs_oracle(x, angles, layout):  # type: ignore[no-untyped-def]
    """Pair ``i`` rotated by ``angles[..., i]`` (float64, correctly rounded cos/sin)."""
    return reference.rotate_pairs(
        np.asarray(x, dtype=np.float64), angles, np.ones(angles.shape[-1]), layout=layout
    )


# -- the float64 formulas ----------------------------------------------------------------------------
def _eva02_angles(h, w, d, base, offset=0.0, ref=None):  # type: ignore[no-untyped-def]
    """timm build_rotary_pos_embed(in_pixels=False): bands temperature**(-j / (d/4)), j < d/4,
    grid (row, col) + offset (rescaled t / size * ref), angle = coord * band; row pairs first."""
    nb = d // 4
    bands = base ** (-np.arange(nb) / nb)
    t = [np.arange(h) + offset, np.arange(w) + offset]
    if ref is not None:
        t = [t[0] / h * ref[0], t[1] / w * ref[1]]
    rows, cols = np.meshgrid(*t, indexing="ij")
    return np.concatenate([rows.reshape(-1, 1) * bands, cols.reshape(-1, 1) * bands], axis=-1)


@pytest.mark.parametrize("offset, ref", [(0.0, None), (0.5, (7, 5))])
def test_eva02_against_the_float64_formula(backend, rng, offset, ref):
    tower = rotary.vision.eva02(16, base=100.0, grid_offset=offset, ref_shape=ref)
    x = backend.asarray(rng.normal(size=(2, 3, 12, 16)), "float32")
    got = tower.rotate(x, 3, 4)
    angles = _eva02_angles(3, 4, 16, 100.0, offset, ref)
    if ref is not None and not backend.float64:  # the coordinates rounded to float32, as timm's
        pos = tower.positions(3, 4).astype(np.float32).astype(np.float64)
        nb = 4
        bands = 100.0 ** (-np.arange(nb) / nb)
        angles = np.concatenate([pos[:, :1] * bands, pos[:, 1:] * bands], axis=-1)
    assert_close(got, _pairs_oracle(to_numpy(x), angles, "interleaved"), like=x)


def test_pixel_frequencies_against_lucidrains(rng):
    torch = pytest.importorskip("torch")
    ret = pytest.importorskip("rotary_embedding_torch")
    theirs = ret.RotaryEmbedding(dim=8, freqs_for="pixel", max_freq=64)
    freqs = theirs.get_axial_freqs(3, 5)  # (3, 5, 16): row then column features, interleaved
    x = torch.from_numpy(rng.normal(size=(2, 3, 5, 32)).astype(np.float32))
    want = ret.apply_rotary_emb(freqs, x)  # rotates the first 16 features
    tower = rotary.vision.pixel(32, max_freq=64, rotary_dim=16)
    got = tower.rotate(x.reshape(2, 15, 32), 3, 5).reshape(2, 3, 5, 32)
    # lucidrains forms frequencies (pi * linspace) and angles in float32: its angles are off by a
    # few float32 ulps of the largest angle (32 pi), the tolerance of this comparison
    atol = 8 * 32 * math.pi * 2.0**-24 * float(x.abs().max())
    assert_close(got, want.double().numpy(), like=x, atol=atol)


@pytest.mark.parametrize("linear", [True, False])
def test_pixel_against_the_float64_formula(backend, rng, linear):
    tower = rotary.vision.pixel(16, max_freq=32.0, linear_bands=linear)
    n = 4
    bands = np.linspace(1.0, 16.0, n) if linear else 2.0 ** np.linspace(0.0, math.log2(32.0) - 1, n)
    rows, cols = np.meshgrid(np.linspace(-1, 1, 3), np.linspace(-1, 1, 2), indexing="ij")
    angles = np.concatenate(
        [rows.reshape(-1, 1) * bands * math.pi, cols.reshape(-1, 1) * bands * math.pi], -1
    )
    x = backend.asarray(rng.normal(size=(2, 6, 16)), "float32")
    assert_close(tower.rotate(x, 3, 2), _pairs_oracle(to_numpy(x), angles, "interleaved"), like=x, ulps=16)


def test_llama4_vision_against_transformers(rng):
    torch = pytest.importorskip("torch")
    m = pytest.importorskip("transformers.models.llama4.modeling_llama4")
    from transformers import Llama4VisionConfig

    cfg = Llama4VisionConfig(hidden_size=64, num_attention_heads=2, image_size=56, patch_size=14)  # 4x4
    freqs_ci = m.Llama4VisionRotaryEmbedding(cfg).freqs_ci
    q = torch.from_numpy(rng.normal(size=(2, 17, 2, 32)).astype(np.float32))  # (batch, tokens, heads, dim)
    k = torch.from_numpy(rng.normal(size=(2, 17, 2, 32)).astype(np.float32))
    wq, wk = m.vision_apply_rotary_emb(q, k, freqs_ci)
    tower = rotary.vision.llama4(32, angles="float32")
    pos = tower.positions(4, 4)[:, None, :]  # tokens on axis 1
    gq, gk = tower.rope.apply(q, k, pos)
    assert_close(gq, wq.double().numpy(), like=q, ulps=4)
    assert_close(gk, wk.double().numpy(), like=k, ulps=4)
    exact = rotary.vision.llama4(32).rope.rotate(q, pos)  # exact angles: within float32 rounding
    assert_close(exact, wq.double().numpy(), like=q, ulps=64)


def test_dinov3_against_transformers(rng):
    torch = pytest.importorskip("torch")
    m = pytest.importorskip("transformers.models.dinov3_vit.modeling_dinov3_vit")
    from transformers import DINOv3ViTConfig

    cfg = DINOv3ViTConfig(
        hidden_size=64, num_attention_heads=2, image_size=48, patch_size=16, num_register_tokens=2
    )
    emb = m.DINOv3ViTRopePositionEmbedding(cfg).eval()
    cos, sin = emb(torch.zeros(1, 3, 48, 80))  # a 3 x 5 grid
    q = torch.from_numpy(rng.normal(size=(2, 2, 18, 32)).astype(np.float32))  # CLS + 2 registers + 15
    k = torch.from_numpy(rng.normal(size=(2, 2, 18, 32)).astype(np.float32))
    wq, wk = m.apply_rotary_pos_emb(q, k, cos, sin)
    tower = rotary.vision.dinov3(32, base=cfg.rope_theta, prefix_tokens=3)
    gq, gk = tower.apply(q, k, 3, 5)
    assert_close(gq, wq.double().numpy(), like=q, ulps=16)
    assert_close(gk, wk.double().numpy(), like=k, ulps=16)
    # the prefix tokens are untouched, exactly
    assert torch.equal(gq[..., :3, :], q[..., :3, :])


def test_dinov3_augmentations_reproduce_transformers_and_a_seed():
    torch = pytest.importorskip("torch")
    m = pytest.importorskip("transformers.models.dinov3_vit.modeling_dinov3_vit")
    coords = m.get_patches_center_coordinates(3, 4, dtype=torch.float64, device="cpu")
    torch.manual_seed(7)
    want = m.augment_patches_center_coordinates(coords, shift=0.1, jitter=1.5, rescale=2.0)
    torch.manual_seed(7)  # the same draws, read off in the same order
    dh = torch.empty((1, 2), dtype=torch.float64).uniform_(-0.1, 0.1)
    jh = torch.empty((1, 2), dtype=torch.float64).uniform_(-math.log(1.5), math.log(1.5)).exp()
    rs = torch.empty(1, dtype=torch.float64).uniform_(-math.log(2.0), math.log(2.0)).exp()
    values = {"shift": dh.numpy(), "jitter": jh.numpy(), "rescale": rs.numpy()}
    got = rotary.vision.augment(coords.numpy(), values=values)
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-15, atol=1e-15)
    a = rotary.vision.augment(coords.numpy(), shift=0.1, jitter=1.5, rescale=2.0, rng=3)
    b = rotary.vision.augment(coords.numpy(), shift=0.1, jitter=1.5, rescale=2.0, rng=3)
    assert np.array_equal(a, b) and not np.allclose(a, coords.numpy())


def test_pixtral_against_transformers(rng):
    torch = pytest.importorskip("torch")
    m = pytest.importorskip("transformers.models.pixtral.modeling_pixtral")
    from transformers import PixtralVisionConfig

    cfg = PixtralVisionConfig(hidden_size=64, num_attention_heads=2, head_dim=32)
    emb = m.PixtralVisionRotaryEmbedding(cfg)
    tower = rotary.vision.pixtral(32, angles="float32")
    pos = tower.positions(3, 4)
    x = torch.from_numpy(rng.normal(size=(1, 2, 12, 32)).astype(np.float32))
    cos, sin = emb(x, torch.from_numpy(pos))
    wq, _ = m.apply_rotary_pos_emb(x, x, cos[None], sin[None])
    gq, _ = tower.rope.apply(x, x, pos)
    assert_close(gq, wq.double().numpy(), like=x, ulps=4)


def test_qwen2_vl_vision_against_transformers(rng):
    torch = pytest.importorskip("torch")
    m = pytest.importorskip("transformers.models.qwen2_vl.modeling_qwen2_vl")
    from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLVisionConfig

    emb = m.Qwen2VLVisionRotaryEmbedding(Qwen2VLVisionConfig(embed_dim=64, num_heads=2))  # head_dim 32
    tower = rotary.vision.qwen2_vl(32, angles="float32")
    pos = torch.from_numpy(tower.positions(4, 6))  # (rows, cols) in 2 x 2 merge windows
    x = torch.from_numpy(rng.normal(size=(24, 2, 32)).astype(np.float32))  # (tokens, heads, dim)
    cos, sin = emb(x, pos)
    want, _ = m.apply_rotary_pos_emb_vision(x, x, cos, sin)
    got = tower.rope.rotate(x, pos[:, None, :])
    assert torch.equal(got, want)  # bit for bit (the float32 recipe)
    assert tower.positions(4, 6)[:4].tolist() == [[0, 0], [0, 1], [1, 0], [1, 1]]  # the first window


def test_mlcd_against_transformers(rng):
    # MLCD's "axial" rope_type (issue 24: refused by from_hf as an unknown rope_type): its vision
    # tower's 2-D RoPE, patch tokens by grid position and the class token by its learned angles
    torch = pytest.importorskip("torch")
    m = pytest.importorskip("transformers.models.mlcd.modeling_mlcd")
    from transformers import MLCDVisionConfig

    cfg = MLCDVisionConfig(
        hidden_size=64, num_attention_heads=2, rope_parameters={"rope_type": "axial", "rope_theta": 500.0}
    )
    tower = rotary.hf.vision_rope(cfg, angles="float32")
    assert (tower.name, tower.head_dim, tower.rope.base) == ("mlcd", 32, 500.0)
    pos = torch.from_numpy(tower.positions(3, 4))  # raster order, as MLCDVisionModel builds pos_ids
    cos, sin = m.MLCDRotaryEmbedding(cfg)(torch.zeros(1), pos)
    cls_angles = torch.from_numpy(rng.normal(size=(1, 16)).astype(np.float32))  # class_pos_emb
    cls = torch.cat([cls_angles, cls_angles], dim=-1)
    cos, sin = torch.cat([cls.cos(), cos]), torch.cat([cls.sin(), sin])
    x = torch.from_numpy(rng.normal(size=(1, 13, 2, 32)).astype(np.float32))  # (batch, tokens, heads, dim)
    want, _ = m.apply_rotary_pos_emb_vision(x, x, cos, sin)
    patches = tower.rope.rotate(x[:, 1:], pos[:, None, :])
    first = rotary.learned.rotate(x[:, :1], 1, cls_angles[0])
    assert torch.equal(patches, want[:, 1:])  # bit for bit (the float32 recipe)
    assert_close(first, want[:, :1].double().numpy(), like=x, ulps=4)


def test_rope_mixed_initialisation_and_rotation_against_the_paper(backend, rng):
    heads, d = 3, 16
    f = rotary.vision.mixed_frequencies(d, heads, seed=0)
    assert f.shape == (heads, 1, 2, d // 2)
    mag = 10.0 ** (-np.arange(0, d, 4) / d)
    np.testing.assert_allclose(
        np.hypot(f[:, 0, 0, : d // 4], f[:, 0, 1, : d // 4]), np.broadcast_to(mag, (heads, d // 4))
    )
    grid = np.stack(np.meshgrid(np.arange(2), np.arange(3), indexing="ij"), -1).reshape(6, 2)
    x = backend.asarray(rng.normal(size=(2, heads, 6, d)), "float32")
    fb = backend.asarray(f, "float32")
    got = rotary.learned.rotate(x, backend.asarray(grid, backend.int_dtype()), fb, layout="interleaved")
    f32 = np.asarray(f, dtype=np.float32).astype(np.float64)
    angles = grid[None, :, 0, None] * f32[:, :, 0, :] + grid[None, :, 1, None] * f32[:, :, 1, :]
    assert_close(got, _pairs_oracle(to_numpy(x), angles[None], "interleaved"), like=x, ulps=64)


def test_axial_lucidrains_lang_frequencies(rng):
    """lucidrains axial (``freqs_for="lang"``) is rotary.AxialRoPE in the interleaved layout."""
    torch = pytest.importorskip("torch")
    ret = pytest.importorskip("rotary_embedding_torch")
    theirs = ret.RotaryEmbedding(dim=8)
    freqs = theirs.get_axial_freqs(3, 4)  # (3, 4, 16)
    x = torch.from_numpy(rng.normal(size=(2, 3, 4, 16)).astype(np.float32))
    want = ret.apply_rotary_emb(freqs, x)
    rope = rotary.AxialRoPE(16, 2, layout="interleaved")
    grid = np.stack(np.meshgrid(np.arange(3), np.arange(4), indexing="ij"), -1)
    assert_close(rope.rotate(x, grid), want.double().numpy(), like=x, ulps=16)


@pytest.mark.parametrize("kind", ["llama4", "dinov3", "pixtral", "qwen2_vl", "mlcd"])
def test_vision_rope_from_hf_configs(kind):
    pytest.importorskip("transformers")
    import transformers as tf
    from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLVisionConfig

    cfg = {
        "llama4": lambda: tf.Llama4VisionConfig(
            hidden_size=64,
            num_attention_heads=2,
            rope_parameters={"rope_theta": 500.0, "rope_type": "default"},
        ),
        "dinov3": lambda: tf.DINOv3ViTConfig(hidden_size=64, num_attention_heads=2, num_register_tokens=4),
        "pixtral": lambda: tf.PixtralVisionConfig(hidden_size=64, num_attention_heads=2, head_dim=32),
        "qwen2_vl": lambda: Qwen2VLVisionConfig(embed_dim=64, num_heads=2),
        "mlcd": lambda: tf.MLCDVisionConfig(hidden_size=64, num_attention_heads=2),
    }[kind]()
    tower = rotary.hf.vision_rope(cfg)
    assert tower.name == kind and tower.head_dim == 32
    for obj in (cfg, cfg.to_dict()):
        assert rotary.hf.vision_rope(obj).rope == tower.rope
    if kind == "llama4":
        assert tower.rope.base == 500.0
    if kind == "dinov3":
        assert tower.positions(2, 2).shape == (5 + 4, 2) and (tower.positions(2, 2)[:5] == 0).all()
    with pytest.raises(ValueError, match="model_type"):
        rotary.hf.vision_rope({"model_type": "llama"})
