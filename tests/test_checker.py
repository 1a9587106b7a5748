"""rotary.testing.check_rope: real peers pass, rotary passes, broken implementations fail
with the right property named and a message saying why."""

from __future__ import annotations

import json

import numpy as np
import pytest

import rotary
from rotary.testing import PROPERTIES, check_rope


def half_rope(x, pos, base=10000.0, angle_dtype=np.float64, sign=1.0):
    """A plain NumPy half-layout RoPE, with knobs to break it."""
    h = x.shape[-1] // 2
    inv = (base ** (-np.arange(h, dtype=np.float64) / h)).astype(angle_dtype)
    ang = np.asarray(pos).astype(angle_dtype)[:, None] * inv
    c, s = np.cos(ang).astype(x.dtype), (sign * np.sin(ang)).astype(x.dtype)
    x1, x2 = x[..., :h], x[..., h:]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)


def test_reference_like_implementation_passes_every_property():
    rep = check_rope(half_rope)
    assert rep, str(rep)
    assert [r.name for r in rep] == list(PROPERTIES)
    for r in rep:
        assert r.passed and r.error <= r.tol, r


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_rotary_passes_with_exact_angles(backend, layout):
    for dtype in backend.float_dtypes()[:1] if backend.slow else backend.float_dtypes():
        rep = check_rope(
            lambda x, p: rotary.rotate(x, p, layout=layout),
            layout=layout,
            xp=backend.xp,
            device=backend.device,
            dtype=backend.dtype(dtype),
            head_dim=16,
            angle_eps=0.0,  # rotary's angles are exact: no allowance growing with the position
        )
        assert rep, str(rep)


def test_report_api():
    rep = check_rope(half_rope, properties=["matrix_form", "layout"], head_dim=8)
    assert bool(rep) and rep.failed == []
    assert rep["matrix_form"].passed and rep["matrix_form"].description == PROPERTIES["matrix_form"]
    text = str(rep)
    assert "matrix_form" in text and "layout" in text and "2/2 hold" in text
    assert repr(rep).startswith("<RopeReport layout='half'") and "2/2 properties hold" in repr(rep)
    d = json.loads(json.dumps(rep.to_dict()))
    assert d["passed"] is True and [r["name"] for r in d["results"]] == ["matrix_form", "layout"]
    with pytest.raises(KeyError, match="no property 'norm'"):
        rep["norm"]


def test_bad_arguments():
    with pytest.raises(ValueError, match="layout must be"):
        check_rope(half_rope, layout="neox")
    with pytest.raises(ValueError, match="head_dim must be an even integer"):
        check_rope(half_rope, head_dim=7)
    with pytest.raises(ValueError, match="unknown properties"):
        check_rope(half_rope, properties=["speed"])
    with pytest.raises(TypeError, match="rotate_fn must be callable"):
        check_rope("rope")


# -- broken implementations ----------------------------------------------------------------
def _fails(rep, *names):
    assert not rep, str(rep)
    for n in names:
        assert n in rep.failed, f"{n} should fail:\n{rep}"
        assert rep[n].message, f"{n} failed without saying why"
    assert "FAILED" in str(rep)
    return rep


def test_wrong_base_fails_and_estimates_the_base():
    rep = _fails(check_rope(lambda x, p: half_rope(x, p, base=500000.0)), "matrix_form", "long_positions")
    assert "base ~ 5e+05" in rep["matrix_form"].message
    # Score properties hold for any base: the failure is pinned on the right properties.
    assert rep["relative_position"].passed and rep["norm"].passed and rep["layout"].passed


def test_wrong_layout_says_it_looks_like_the_other_layout():
    rep = _fails(check_rope(half_rope, layout="interleaved"), "layout", "matrix_form")
    msg = rep["layout"].message
    assert "like the 'half' layout" in msg and "layout='interleaved'" in msg
    assert "matches the 'half' layout instead" in rep["matrix_form"].message
    # and the other way round, with rotary's interleaved kernel
    rep = _fails(check_rope(lambda x, p: rotary.rotate(x, p, layout="interleaved")), "layout")
    assert "like the 'interleaved' layout" in rep["layout"].message


def test_wrong_sign_fails():
    rep = _fails(check_rope(lambda x, p: half_rope(x, p, sign=-1.0)), "matrix_form")
    assert "rotates by -pos" in rep["matrix_form"].message


def test_float16_angles_fail_at_long_positions():
    rep = _fails(check_rope(lambda x, p: half_rope(x, p, angle_dtype=np.float16)), "long_positions")
    assert "non-finite" in rep["long_positions"].message  # 2**20 overflows float16
    assert "matrix_form" in rep.failed  # and float16 angles are already wrong at position 15


def test_float32_angle_recipe_passes_by_default_but_not_when_exact_angles_are_required():
    f32 = lambda x, p: half_rope(x, p, angle_dtype=np.float32)  # noqa: E731
    assert check_rope(f32)
    rep = _fails(check_rope(f32, angle_eps=0.0), "long_positions")
    assert rep["long_positions"].error > 1e-3  # the float32 recipe's error near 2**20


def test_mutating_input_fails():
    def mutating(x, pos):
        x[...] = half_rope(x, pos)
        return x

    rep = _fails(check_rope(mutating), "no_mutation")
    assert "modified its input x in place" in rep["no_mutation"].message


def test_wrong_output_dtype_fails():
    rep = _fails(check_rope(lambda x, p: half_rope(x, p).astype(np.float32), dtype="float16"), "dtype")
    assert "returned dtype float32 for float16 input" in rep["dtype"].message


def test_dropping_the_device_fails():
    xs = pytest.importorskip("array_api_strict")
    dev = xs.Device("device1")

    def host_roundtrip(x, pos):  # computes on the host and returns on the default device
        out = half_rope(np.asarray(x._array), np.asarray(pos._array))
        return xs.asarray(out)

    rep = _fails(check_rope(host_roundtrip, xp=xs, device=dev), "device")
    assert "device1" in rep["device"].message and "CPU_DEVICE" in rep["device"].message
    assert rep["matrix_form"].passed


def test_returning_another_array_type_fails():
    torch = pytest.importorskip("torch")
    rep = _fails(check_rope(lambda x, p: torch.from_numpy(half_rope(x, p))), "device")
    assert "torch.Tensor" in rep["device"].message


def test_raising_implementation_fails_every_property_with_the_error():
    def raises(x, pos):
        raise RuntimeError("no negative positions")

    rep = _fails(check_rope(raises), *PROPERTIES)
    assert "RuntimeError: no negative positions" in rep["inverse"].message


def test_non_array_output_is_reported_as_such_by_every_property_that_reads_it():
    # Regression: the dtype property read out.dtype itself and blamed rotate_fn for the
    # checker's own AttributeError (with a line number inside the checker).
    rep = _fails(check_rope(lambda x, p: 3), *(n for n in PROPERTIES if n != "no_mutation"))
    for name in ("dtype", "matrix_form"):
        assert rep[name].message.startswith("rotate_fn returned a int, not an array"), rep[name].message


# -- real peers ----------------------------------------------------------------------------
def test_hugging_face_llama_passes():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    emb = LlamaRotaryEmbedding(LlamaConfig(hidden_size=128, num_attention_heads=2, head_dim=64))

    def hf(x, pos):
        cos, sin = emb(x, pos[None, :])
        return apply_rotary_pos_emb(x, x, cos, sin)[0]

    rep = check_rope(hf, xp=torch, layout="half")
    assert rep, str(rep)
    # Its float32 angles are visible at long positions, within the float32-angle allowance.
    assert 1e-4 < rep["long_positions"].error < rep["long_positions"].tol
    _fails(check_rope(hf, xp=torch, layout="interleaved"), "layout")


def test_rotary_embedding_torch_passes():
    torch = pytest.importorskip("torch")
    pytest.importorskip("rotary_embedding_torch")
    from rotary_embedding_torch import RotaryEmbedding, apply_rotary_emb

    rope = RotaryEmbedding(64)

    def lucidrains(x, pos):
        # Build the angles from our positions: rotate_queries_or_keys would make positions in
        # x's dtype (bfloat16 rounds positions above 256) and only supports offsets.
        return apply_rotary_emb(rope(pos), x)

    rep = check_rope(lucidrains, xp=torch, layout="interleaved")
    assert rep, str(rep)
    _fails(check_rope(lucidrains, xp=torch, layout="half"), "layout")
