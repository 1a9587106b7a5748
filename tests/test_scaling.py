"""Context-extension scalings: formulas (float64 references written from the papers /
peers.md), attention factor applied once, dynamic selection in-backend, errors, compile."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

import rotary
from rotary import scaling as sc
from rotary.testing import assert_close, to_numpy
from rotary.testing.reference import rotate as rotate_ref

D, BASE = 32, 10000.0


def _w(d=D, base=BASE):
    return 1.0 / base ** (np.arange(0, d, 2, dtype=np.float64) / d)


def _ref_cos_sin(pos, inv, af=1.0):
    ang = np.asarray(pos, dtype=np.longdouble)[..., None] * np.asarray(inv, dtype=np.longdouble)
    return (np.cos(ang) * af).astype(np.float64), (np.sin(ang) * af).astype(np.float64)


# -- float64 references -------------------------------------------------------------------
def ref_yarn(s, L0, d=D, base=BASE, bf=32.0, bs=1.0, truncate=True):
    def cd(r):
        return d * math.log(L0 / (2 * math.pi * r)) / (2 * math.log(base))

    lo, hi = cd(bf), cd(bs)
    if truncate:
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, d - 1)
    if lo == hi:
        hi += 0.001
    ramp = np.clip((np.arange(d // 2) - lo) / (hi - lo), 0, 1)
    w = _w(d, base)
    return (w / s) * ramp + w * (1 - ramp)


def ref_llama3(s, L0, lf, hf, d=D, base=BASE):
    out = []
    for w in _w(d, base):
        lam = 2 * math.pi / w
        if lam < L0 / hf:
            out.append(w)
        elif lam > L0 / lf:
            out.append(w / s)
        else:
            sm = (L0 / lam - lf) / (hf - lf)
            out.append((1 - sm) * w / s + sm * w)
    return np.array(out)


def ref_dynamic(n, s, L, d=D, base=BASE):
    n = max(n, L)
    b = base * (s * n / L - (s - 1)) ** (d / (d - 2))
    return _w(d, b)


def test_yarn_sanity_values():
    y = sc.YaRN(4.0, 4096)
    assert y.correction_range(128, 1e4) == (20, 46)
    assert round(y.attention_factor(128, 1e4), 5) == 1.13863
    ds = sc.YaRN(40.0, 4096, mscale=0.707, mscale_all_dim=0.707)
    assert ds.attention_factor(128, 1e4) == 1.0
    ds2 = sc.YaRN(40.0, 4096, mscale=1.0, mscale_all_dim=0.5)
    g = lambda m: 0.1 * m * math.log(40.0) + 1  # noqa: E731
    assert ds2.attention_factor(128, 1e4) == pytest.approx(g(1.0) / g(0.5), rel=1e-15)
    assert sc.YaRN(4.0, 4096, attention_factor_=0.5).attention_factor(128, 1e4) == 0.5


@pytest.mark.parametrize(
    "scaling, inv, af",
    [
        (sc.Linear(4.0), _w() / 4.0, 1.0),
        (sc.NTK(8.0), _w(D, BASE * 8.0 ** (D / (D - 2))), 1.0),
        (sc.YaRN(4.0, 64), ref_yarn(4.0, 64), 0.1 * math.log(4.0) + 1),
        (
            sc.YaRN(16.0, 64, beta_fast=8, beta_slow=2, truncate=False),
            ref_yarn(16.0, 64, bf=8, bs=2, truncate=False),
            0.1 * math.log(16.0) + 1,
        ),
        (sc.Llama3(8.0, 64, 1.0, 4.0), ref_llama3(8.0, 64, 1.0, 4.0), 1.0),
        (sc.Llama3(32.0, 128, 2.0, 8.0), ref_llama3(32.0, 128, 2.0, 8.0), 1.0),
        (sc.Factors(tuple(np.linspace(1, 3, D // 2))), _w() / np.linspace(1, 3, D // 2), 1.0),
    ],
    ids=["linear", "ntk", "yarn", "yarn-untruncated", "llama3", "llama3-32", "factors"],
)
def test_static_scalings_match_reference(backend, rng, scaling, inv, af):
    np.testing.assert_allclose(scaling.inv_freq(D, BASE), inv, rtol=1e-13, atol=0)
    rope = rotary.RoPE(D, scaling=scaling)
    assert rope.attention_factor == pytest.approx(af, rel=1e-15)
    pos = np.array([0, 1, 5, 63, 64, 1000, 70000])
    idt = "int64" if backend.module != "jax" or backend.float64 else "int32"
    c, s = rope.cos_sin(backend.asarray(pos, idt))
    rc, rs = _ref_cos_sin(pos, inv, af)
    assert_close(c, rc, dtype="float32")
    assert_close(s, rs, dtype="float32")
    # Rotation: the attention factor is applied exactly once (norms scale by af).
    x = rng.normal(size=(3, 7, D))
    out = rope.rotate(backend.asarray(x, "float32"), backend.asarray(pos, idt))
    ref = rotate_ref(x.astype(np.float32), pos, th=inv, scale=af)
    assert_close(out, ref, dtype="float32", ulps=16)


def _idt(backend):
    return "int64" if backend.module != "jax" or backend.float64 else "int32"


def test_dynamic_ntk(backend):
    L, s = 16, 3.0
    rope = rotary.RoPE(D, scaling=sc.DynamicNTK(s, L))
    for n in (16, 40):  # at the original length (default frequencies) and beyond it
        pos = np.arange(n)
        c, sn = rope.cos_sin(backend.asarray(pos, _idt(backend)))
        inv = ref_dynamic(n, s, L)
        rc, rs = _ref_cos_sin(pos, inv)
        # Documented: the grown branch (n > L) is computed in the widest float of the backend;
        # without float64 that is one float32 rounding of the angle (error ~ eps * angle).
        scale = None if backend.float64 or n <= L else np.maximum(1.0, pos[:, None] * inv)
        assert_close(c, rc, dtype="float32", scale=scale)
        assert_close(sn, rs, dtype="float32", scale=scale)


def test_dynamic_ntk_batch_max_and_per_sequence(backend):
    L, s = 16, 2.0
    pos = np.stack([np.arange(40), np.arange(40) % 10])  # row 0 beyond L, row 1 within
    pb = backend.asarray(pos, _idt(backend))
    grown = ref_dynamic(40, s, L)
    scale = None if backend.float64 else np.maximum(1.0, pos[..., None] * grown)  # see test_dynamic_ntk
    c, _ = rotary.RoPE(D, scaling=sc.DynamicNTK(s, L)).cos_sin(pb)
    assert_close(c, _ref_cos_sin(pos, grown)[0], dtype="float32", scale=scale)  # HF: the batch maximum
    c, _ = rotary.RoPE(D, scaling=sc.DynamicNTK(s, L, per_sequence=True)).cos_sin(pb)
    assert_close(
        c[0, ...], _ref_cos_sin(pos[0], grown)[0], dtype="float32", scale=None if scale is None else scale[0]
    )
    assert_close(c[1, ...], _ref_cos_sin(pos[1], _w())[0], dtype="float32")


def _longrope(per_sequence=False):
    short = tuple(np.linspace(1.0, 1.5, D // 2))
    long = tuple(np.linspace(1.0, 20.0, D // 2))
    return sc.LongRoPE(short, long, 32, factor=8.0, per_sequence=per_sequence), short, long


def test_longrope_switches_on_sequence_length(backend, rng):
    scaling, short, long = _longrope()
    af = math.sqrt(1 + math.log(8.0) / math.log(32))
    rope = rotary.RoPE(D, scaling=scaling)
    assert rope.attention_factor == pytest.approx(af, rel=1e-15)
    for n, ext in ((32, short), (33, long)):
        pos = np.arange(n)
        c, s = rope.cos_sin(backend.asarray(pos, _idt(backend)))
        rc, rs = _ref_cos_sin(pos, _w() / np.array(ext), af)
        assert_close(c, rc, dtype="float32")
        assert_close(s, rs, dtype="float32")
    # per sequence: each row picks its own factors
    pos = np.stack([np.arange(50), np.arange(50) % 20])
    c, _ = rotary.RoPE(D, scaling=_longrope(True)[0]).cos_sin(backend.asarray(pos, _idt(backend)))
    assert_close(c[0, ...], _ref_cos_sin(pos[0], _w() / np.array(long), af)[0], dtype="float32")
    assert_close(c[1, ...], _ref_cos_sin(pos[1], _w() / np.array(short), af)[0], dtype="float32")
    # apply: the attention factor is applied once to q and to k
    q = rng.normal(size=(2, 3, 50, D))
    qb = backend.asarray(q, "float32")
    qr, _ = rotary.RoPE(D, scaling=scaling).apply(qb, qb, backend.asarray(pos[:, None, :], _idt(backend)))
    norms = np.linalg.norm(to_numpy(qr).astype(np.float64), axis=-1)
    np.testing.assert_allclose(norms, af * np.linalg.norm(q.astype(np.float32), axis=-1), rtol=1e-5)


_COMPILE_CASES = [
    pytest.param(lambda: sc.YaRN(4.0, 16), "exact", id="yarn-exact"),
    pytest.param(lambda: _longrope()[0], "exact", id="longrope-exact"),
    pytest.param(lambda: sc.DynamicNTK(2.0, 16, per_sequence=True), "float32", id="dynamic-per-seq-float32"),
]


@pytest.mark.parametrize("make_scaling, angles", _COMPILE_CASES)
def test_scalings_under_jax_jit(make_scaling, angles):
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    rope = rotary.RoPE(D, scaling=make_scaling(), angles=angles)
    f = jax.jit(lambda p: rope.cos_sin(p))
    # One compiled function; the positions' values pick the dynamic branch in-graph.
    for p in (np.stack([np.arange(40), np.arange(40) % 8]), np.stack([np.arange(40) % 8] * 2)):
        c, s = f(jnp.asarray(p, dtype=jnp.int32))
        ce, se = rope.cos_sin(p.astype(np.int32))
        np.testing.assert_allclose(np.asarray(c), ce, rtol=0, atol=2e-6)
        np.testing.assert_allclose(np.asarray(s), se, rtol=0, atol=2e-6)


@pytest.mark.parametrize("make_scaling, angles", _COMPILE_CASES)
def test_scalings_under_torch_compile_fullgraph(make_scaling, angles):
    torch = pytest.importorskip("torch")
    # One compile per configuration (a second RoPE config through the same compiled code
    # recompiles with its floats made dynamic, which the constant tables do not support yet).
    torch._dynamo.reset()
    rope = rotary.RoPE(D, scaling=make_scaling(), angles=angles)

    def f(q, k, p):
        return rope.apply(q, k, p)

    cf = torch.compile(f, fullgraph=True, backend="eager")
    q = torch.randn(2, 2, 40, D)
    for p in (torch.stack([torch.arange(40), torch.arange(40) % 8]), (torch.arange(40) % 8).expand(2, 40)):
        p = p[:, None, :]
        for a, b in zip(cf(q, q, p), f(q, q, p), strict=True):
            np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=0, atol=1e-6)


# -- keys, immutability, errors -----------------------------------------------------------
@pytest.mark.parametrize(
    "scaling",
    [
        sc.Default(),
        sc.Linear(2.0),
        sc.NTK(2.0),
        sc.YaRN(4.0, 64, mscale=1.0),
        sc.Llama3(8.0, 64),
        sc.DynamicNTK(2.0, 64, per_sequence=True),
        _longrope()[0],
        sc.Factors([1.0, 2.0]),
    ],
)
def test_frozen_hashable_plain_values(scaling):
    same = type(scaling)(**{f.name: getattr(scaling, f.name) for f in dataclasses.fields(scaling)})
    assert same == scaling and hash(same) == hash(scaling)
    n = len(getattr(scaling, "factors", getattr(scaling, "short_factor", ())))
    dim = 2 * n if n else 16
    assert rotary.RoPE(dim, scaling=scaling) == rotary.RoPE(dim, scaling=same)
    with pytest.raises(dataclasses.FrozenInstanceError):
        scaling.factor = 3.0  # type: ignore[misc]
    for f in dataclasses.fields(scaling):
        assert not isinstance(getattr(scaling, f.name), list)


def test_from_dict():
    assert sc.from_dict({"type": "linear", "factor": 2.0}) == sc.Linear(2.0)
    y = sc.from_dict(
        {
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 64,
            "attention_factor": 0.9,
            "beta_fast": None,
            "rope_theta": 1e4,
        }
    )
    assert y == sc.YaRN(4.0, 64, attention_factor_=0.9)
    d = sc.from_dict({"rope_type": "dynamic", "factor": 2.0}, max_position_embeddings=128)
    assert d == sc.DynamicNTK(2.0, 128)
    lr = sc.from_dict(
        {
            "rope_type": "longrope",
            "short_factor": [1.0] * 4,
            "long_factor": [2.0] * 4,
            "original_max_position_embeddings": 64,
            "factor": 4.0,
        }
    )
    assert lr.short_factor == (1.0,) * 4
    assert rotary.RoPE(8, scaling={"rope_type": "linear", "factor": 2.0}).scaling == sc.Linear(2.0)


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: sc.Linear(0.5), "Linear factor must be finite and >= 1"),
        (lambda: sc.NTK(0.5), "NTK factor"),
        (lambda: sc.YaRN(0.9, 64), "YaRN factor"),
        (lambda: sc.YaRN(4.0, 64, beta_fast=1, beta_slow=4), "beta_fast must be > beta_slow"),
        (lambda: sc.YaRN(4.0, 64, attention_factor_=-1.0), "attention_factor"),
        (lambda: sc.Llama3(8.0, 64, low_freq_factor=4.0, high_freq_factor=1.0), "low_freq_factor"),
        (lambda: sc.Llama3(0.5, 64), "Llama3 factor"),
        (lambda: sc.DynamicNTK(2.0, 0), "max_position_embeddings"),
        (lambda: sc.DynamicNTK(float("nan"), 64), "DynamicNTK factor"),
        (lambda: sc.LongRoPE([1.0] * 4, [1.0] * 3, 64, factor=2.0), "same length"),
        (lambda: sc.LongRoPE([1.0] * 4, [1.0] * 4, 64), "needs factor"),
        (lambda: sc.LongRoPE([1.0, -1.0], [1.0, 1.0], 64, factor=2.0), "short_factor"),
        (lambda: rotary.RoPE(16, scaling=sc.LongRoPE([1.0] * 4, [1.0] * 4, 64, factor=2.0)), "8 entries"),
        (lambda: rotary.RoPE(16, scaling=sc.Factors([1.0] * 3)), "8 entries"),
        (lambda: sc.from_dict({"rope_type": "nope"}), r"unknown rope_type .nope."),
        (lambda: sc.from_dict({"rope_type": "yarn", "factor": 2.0}), "original_max_position_embeddings"),
        (lambda: sc.from_dict({"rope_type": "dynamic", "factor": 2.0}), "max_position_embeddings"),
    ],
)
def test_invalid_parameters(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_missing_length_is_a_type_error():
    with pytest.raises(TypeError, match="YaRN original_max_position_embeddings must be an integer"):
        sc.YaRN(4.0, None)


def test_resolve_rejects_other_types():
    with pytest.raises(TypeError, match="scaling must be"):
        sc.resolve(3.0)
