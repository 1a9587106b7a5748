"""The eager fast paths (blocked NumPy/torch kernels, per-position tables, digit-level and sign
hints) compute exactly what the generic array-API code computes, and keep every check.

Compared through the public switch :func:`rotary.fast_paths`; no timing here (speed is
measured by ``python3 -m benchmarks``).
"""

from __future__ import annotations

import numpy as np
import pytest

import rotary
from rotary.testing import assert_close, reference


def _both(fn):
    fast = fn()
    with rotary.fast_paths(False):
        slow = fn()
    return fast, slow


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize(
    ("shape", "rotary_dim", "pshape"),
    [
        ((2, 4, 300, 64), None, (300,)),  # several blocks (> 2 x 256 KiB)
        ((2, 4, 300, 64), 48, (300,)),  # partial rotary, blocked
        ((3, 200, 4, 64), None, (200, 1)),  # (batch, seq, heads, dim) positions (seq, 1)
        ((1, 8, 1, 64), None, (1,)),  # decode step, one block
        ((64,), None, ()),
    ],
)
def test_rotation_fast_path_is_bitwise_generic(backend, rng, layout, shape, rotary_dim, pshape):
    x = backend.asarray(rng.standard_normal(shape), "float32")
    before = backend.to_numpy(x).copy()
    pos = backend.asarray(rng.integers(0, 100_000, size=pshape), backend.int_dtype())
    fast, slow = _both(lambda: rotary.rotate(x, pos, layout=layout, rotary_dim=rotary_dim))
    np.testing.assert_array_equal(backend.to_numpy(fast), backend.to_numpy(slow))
    np.testing.assert_array_equal(backend.to_numpy(x), before)  # input untouched


@pytest.mark.parametrize(
    ("qshape", "kshape", "pshape"),
    [
        ((1, 32, 1, 128), (1, 8, 1, 128), (1,)),  # decode step, grouped-query heads
        ((4, 32, 1, 128), (4, 8, 1, 128), (4, 1, 1)),  # batched decode, one position per row
        ((4, 1, 8, 64), (4, 1, 2, 64), (4, 1, 1)),  # (batch, seq, heads, dim) decode
        ((3, 4, 1, 64), (3, 4, 1, 64), ()),  # one scalar position for every row
        ((2, 4, 50, 64), (2, 2, 50, 64), (50,)),  # prefill, grouped-query heads
        ((64,), (64,), ()),  # one head vector each (regression: joined along the features)
        ((3, 64), (3, 64), ()),
    ],
)
def test_joint_rotation_fast_path_is_bitwise_generic(backend, rng, qshape, kshape, pshape):
    """``apply`` of q and k together (decoding joins them in one pass): the generic bits, for
    every position dtype the backend takes."""
    q = backend.asarray(rng.standard_normal(qshape), "float32")
    k = backend.asarray(rng.standard_normal(kshape), "float32")
    pn = rng.integers(0, 5000, size=pshape)
    for dt in ("int32", backend.int_dtype()):
        pos = backend.asarray(pn, dt)
        fast, slow = _both(lambda p=pos: rotary.apply(q, k, p))
        for f, s_, x in zip(fast, slow, (q, k)):
            assert tuple(f.shape) == tuple(x.shape)
            np.testing.assert_array_equal(backend.to_numpy(f), backend.to_numpy(s_))


def test_decode_steps_stay_bitwise_generic(backend, rng):
    """Step after step with the same argument shapes (what later calls shortcut): every position
    kind (table rows, past the table, negative), after the cache is cleared, and with the fast
    paths switched off in between: the generic bits each time."""
    q = backend.asarray(rng.standard_normal((1, 32, 1, 128)), "float32")
    k = backend.asarray(rng.standard_normal((1, 8, 1, 128)), "float32")
    rope = rotary.RoPE(128)
    steps = [5, 6, 4095, 4096, 40_000, 2**15 - 1, 2**15, -3, 0, 5]
    if backend.slow:  # one step of each kind
        steps = [5, 4096, 40_000, -3, 0, 5]
    for i, p in enumerate(steps):
        if i == len(steps) - 2:
            rotary.clear_cache()
        pos = backend.asarray(np.array([p]), backend.int_dtype())
        fast, slow = _both(lambda pos=pos: rope.apply(q, k, pos))
        for f, s_ in zip(fast, slow):
            np.testing.assert_array_equal(backend.to_numpy(f), backend.to_numpy(s_))
        assert_close(fast[0], reference.rotate(backend.to_numpy(q), [p]), like=q, ulps=16)


def test_linear_decoding_steps_are_bitwise_generic_for_every_position_form(backend, rng):
    """Linear attention's decoding step, step after step, with the position as an int, a list of
    one, a 0-d and a ``(1,)`` array, or none (``rope=`` and the state's offset): each form's
    shortcut gives the generic bits (positions in the table, past it, and after the cache is
    cleared)."""
    if backend.slow:
        pytest.skip("a slow backend takes no decoding shortcut")
    q, k, v = (backend.asarray(rng.standard_normal((1, 4, 1, 64)) * 0.5, "float32") for _ in range(3))
    kk, vv = (backend.asarray(rng.standard_normal((1, 4, 8, 64)) * 0.5, "float32") for _ in range(2))
    st = rotary.linear_attention_state(kk, vv, backend.asarray(np.arange(8), backend.int_dtype()))
    rope = rotary.RoPE(64)
    forms = {
        "int": lambda t: t,
        "list": lambda t: [t],
        "0-d": lambda t: backend.asarray(np.array(t), backend.int_dtype()),
        "(1,)": lambda t: backend.asarray(np.array([t]), backend.int_dtype()),
        "none": lambda t: None,
    }
    for name, form in forms.items():
        for i, t in enumerate([8, 9, 4095, 40_000, 9]):
            if i == 4:
                rotary.clear_cache()
            state = rotary.LinearAttentionState(st.S, st.z, t)
            pos = form(t)
            kw = {"rope": rope} if pos is None else {}

            def call(pos=pos, state=state, kw=kw):
                return rotary.linear_attention(
                    q, k, v, pos, causal=True, state=state, return_state=True, **kw
                )

            (out, new), (ref, ref_state) = _both(call)
            for a, b in ((out, ref), (new.S, ref_state.S), (new.z, ref_state.z)):
                np.testing.assert_array_equal(backend.to_numpy(a), backend.to_numpy(b), err_msg=f"{name} {t}")
            assert int(new.offset) == t + 1


KINDS = [
    "causal",
    "causal, no state",
    "causal, eps",
    "causal, unnormalised",
    "causal, bfloat16",
    "causal, packed",
    "causal, segment ids",
    "non-causal",
]


@pytest.mark.parametrize("kind", KINDS)
def test_linear_attention_chunked_fast_paths_are_bitwise_generic(backend, rng, kind):
    """The chunked engine's fast paths (``elu+1`` features in place; torch's and NumPy's causal
    blocks with every product reused in place) give the generic bits: queries far below 0 (the
    log-space shift), above it and mixed, with RoPE or without, from a state or none, a floor, no
    denominator, bfloat16 in and out, packed documents (a part inside one document takes the
    plain block), several streamed parts and a padded one, outputs and states alike."""
    if backend.slow:
        pytest.skip("a slow backend takes no fast path")
    if kind.endswith("bfloat16") and "bfloat16" not in backend.float_dtypes():
        pytest.skip(f"{backend.name} has no bfloat16")
    # (non-causal parts hold up to 2 MiB of feature rows: features of 64 make 1,100 tokens two parts)
    x = rng.standard_normal((3, 2, 1100, 64 if kind == "non-causal" else 8)) * 2
    x[0, 0, :40] -= 200.0  # (every query feature below exp's range without the shift)
    x[1, 1, 40:80] += 50.0
    dt = "bfloat16" if kind.endswith("bfloat16") else "float32"
    q, k, v = (backend.asarray(a, dt) for a in (x, x[:, :, ::-1] * 0.5, rng.standard_normal(x.shape)))
    kw: dict = {"causal": kind.startswith("causal"), "return_state": True}
    if kind in ("causal", "causal, eps", "causal, bfloat16"):
        kw["state"] = rotary.linear_attention_state(k[..., :5, :], v[..., :5, :], None)
    if kind == "causal, eps":
        kw["eps"] = 1e-3
    if kind == "causal, unnormalised":
        kw |= {"normalize": False, "feature_map": "identity"}
    if kind == "causal, packed":  # (a boundary inside a part, one at a part's start)
        kw["cu_seqlens"] = backend.asarray(np.array([0, 300, 1024, 1100]), backend.int_dtype())
    if kind == "causal, segment ids":  # (rows of their own documents)
        ids = np.repeat(np.array([[0, 1, 1], [2, 2, 3], [4, 5, 6]]), [512, 512, 76], axis=1)
        kw["segment_ids"] = backend.asarray(ids[:, None, :], backend.int_dtype())
    for pos in (None, backend.asarray(np.arange(1100), backend.int_dtype())):

        def call(pos=pos):
            return rotary.linear_attention(q, k, v, pos, **kw)

        (out, new), (ref, ref_state) = _both(call)
        assert out.dtype == q.dtype
        for a, b in ((out, ref), (new.S, ref_state.S), (new.z, ref_state.z)):
            if b is None:
                assert a is None
                continue
            np.testing.assert_array_equal(backend.to_numpy(a), backend.to_numpy(b))
        assert np.isfinite(backend.to_numpy(out)).all()


def test_torch_decode_shortcut_leaves_autograd_to_the_generic_path(rng):
    torch = pytest.importorskip("torch")
    rope = rotary.RoPE(64)
    q = torch.tensor(rng.standard_normal((1, 4, 1, 64)), dtype=torch.float32)
    k = torch.tensor(rng.standard_normal((1, 2, 1, 64)), dtype=torch.float32)
    for p in (3, 4):
        rope.apply(q, k, torch.tensor([p]))
    qg = q.clone().requires_grad_(True)
    qr, _ = rope.apply(qg, k, torch.tensor([5]))
    qr.square().sum().backward()
    torch.testing.assert_close(qg.grad, 2 * q, rtol=1e-5, atol=1e-5)  # rotation keeps norms


@pytest.mark.parametrize("split", [(8, 4), (22, 22, 20)])
def test_axial_single_token_takes_each_axis_own_row(backend, rng, split):
    """Regression: with one token, every axis used the row of the largest coordinate (the
    per-position table's single-row view trusted the range of all axes together)."""
    rope = rotary.AxialRoPE(sum(split), len(split), split=split)
    x = backend.asarray(rng.standard_normal((4, 1, sum(split))), "float32")
    coords = np.array([[2, 5, 9][: len(split)]])
    pos = backend.asarray(coords, backend.int_dtype())
    fast, slow = _both(lambda: rope.rotate(x, pos))
    np.testing.assert_array_equal(backend.to_numpy(fast), backend.to_numpy(slow))
    per_pair = np.concatenate([np.full(v // 2, c) for v, c in zip(split, coords[0])])
    theta = np.concatenate([reference.theta(v) for v in split])
    want = reference.rotate_pairs(backend.to_numpy(x), per_pair, theta)
    assert_close(fast, want, like=x, ulps=16)


@pytest.mark.parametrize("top", [4095, 2**15 - 1, 4096**2 - 1, 2**31 - 1])
def test_exact_angle_fast_paths_are_bitwise_generic(backend, rng, top):
    """Position tables (< 2**15), skipped digit levels and the non-negative hint: same bits."""
    if backend.slow and top != 2**31 - 1:
        pytest.skip("a slow backend runs the widest range only (every digit level)")
    rope = rotary.RoPE(64)
    p = np.concatenate([np.arange(0, 1500), rng.integers(0, top, size=1500, endpoint=True)])
    for signed in (False, True):
        pn = np.concatenate([p, -p]) if signed else p
        pos = backend.asarray(pn.reshape(2, -1), backend.int_dtype())
        for dtype in ("float32", "float64") if backend.float64 else ("float32",):
            (c, s), (c2, s2) = _both(lambda p=pos, d=dtype: rope.cos_sin(p, dtype=backend.dtype(d)))
            np.testing.assert_array_equal(backend.to_numpy(c), backend.to_numpy(c2))
            np.testing.assert_array_equal(backend.to_numpy(s), backend.to_numpy(s2))


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_repeated_calls_stay_exact_and_checked(backend, rng, layout):
    """Later calls (warm caches) give the reference and still check the position values."""
    rope = rotary.RoPE(16, layout=layout)
    q = backend.asarray(rng.standard_normal((1, 2, 1, 16)), "float32")
    k = backend.asarray(rng.standard_normal((1, 1, 1, 16)), "float32")
    for p in (7, 40000, 2**30):  # table, digit levels 2 and 3
        pos = backend.asarray(np.array([p]), backend.int_dtype())
        for _ in range(2):
            qr, kr = rope.apply(q, k, pos)
        assert_close(qr, reference.rotate(backend.to_numpy(q), [p], layout=layout), like=q, ulps=16)
        assert tuple(kr.shape) == tuple(k.shape)
    if backend.host_values and backend.int64:
        with pytest.raises(ValueError, match=r"2\*\*36"):
            rope.apply(q, k, backend.asarray(np.array([2**40]), "int64"))
    rope.apply(q, k, backend.asarray(np.array([1.5]), "float32"))
    if backend.host_values:
        with pytest.raises(ValueError, match="NaN"):
            rope.apply(q, k, backend.asarray(np.array([np.nan]), "float32"))


def test_torch_autograd_takes_the_generic_path(rng):
    torch = pytest.importorskip("torch")
    rope = rotary.RoPE(16)
    q = torch.tensor(rng.standard_normal((2, 3, 300, 16)), dtype=torch.float32, requires_grad=True)
    k = torch.tensor(rng.standard_normal((2, 3, 300, 16)), dtype=torch.float32)
    for _ in range(2):
        qr, kr = rope.apply(q, k, torch.arange(300))
    (qr.square().sum() + kr.sum()).backward()
    # rotation preserves norms: d/dq sum(|R q|^2) = 2 q
    torch.testing.assert_close(q.grad, 2 * q.detach(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", ["Gated DeltaNet", "Kimi Delta Attention", "RWKV-6", "RWKV-7"])
@pytest.mark.parametrize("rope", [False, True])
def test_recurrent_decoding_steps_are_bitwise_generic(backend, rng, family, rope):
    """A decoding step of the recurrent families (the torch shortcut): the generic step's bits,
    step after step, with RoPE and without."""
    from linear_families import BY_NAME, inputs, keywords

    fam = BY_NAME[family]
    x = inputs(fam, rng, (2,), 4, 16, 8)
    cv = lambda a: backend.asarray(np.asarray(a), "float32")  # noqa: E731
    st = rotary.LinearAttentionState(cv(rng.standard_normal((2, 16, 8)) * 0.1), None, 0)
    for t in range(4):
        step = {
            n: (a[..., t : t + 1, :] if a.ndim == 3 else a[..., t : t + 1]) for n, a in x.items() if n != "u"
        }
        step.update({"u": x["u"]} if "u" in x else {})
        pos = [100 + t] if rope else None
        fast, slow = _both(
            lambda step=step, pos=pos, st=st: rotary.linear_attention(
                cv(step["q"]),
                cv(step["k"]),
                cv(step["v"]),
                pos,
                state=st,
                return_state=True,
                **keywords(fam, step, cv),
            )
        )
        np.testing.assert_array_equal(backend.to_numpy(fast[0]), backend.to_numpy(slow[0]))
        np.testing.assert_array_equal(backend.to_numpy(fast[1].S), backend.to_numpy(slow[1].S))
        st = fast[1]
