"""The last array kinds (issue 44): one position check for every entry point, lengths in every
integer dtype and beyond int64's sum, objects of an earlier import of rotary."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

import rotary


@pytest.mark.parametrize("kind", ["bool", "complex"])
def test_cos_sin_checks_positions_as_rotate_does(backend, kind):
    # Issue 44, reproduction 12: RoPE.cos_sin skipped the positions' dtype check that rotate
    # makes: bool positions were read as 0 and 1, complex torch positions lost their imaginary
    # part, NumPy complex ones got NumPy's casting error.
    host = np.array([True, False]) if kind == "bool" else np.array([1 + 2j, 3j])
    try:
        pos = backend.asarray(host)
    except Exception:  # (a library without this dtype: the host array itself)
        pos = host
    want = "pos must (hold|be) integer or real floating positions"
    with pytest.raises(TypeError, match=want):
        rotary.rotate(backend.asarray(np.ones((2, 8)), "float32"), pos)
    with pytest.raises(TypeError, match=want):
        rotary.RoPE(8).cos_sin(pos)
    with pytest.raises(TypeError, match=want):
        rotary.AxialRoPE(8, 2).cos_sin(host[:, None].repeat(2, axis=1))


def test_lengths_in_every_integer_dtype():
    # Issue 44, reproduction 15: positions.from_lengths (and from_cu_seqlens) on torch unsigned
    # integers crashed in cumsum (searchsorted).
    torch = pytest.importorskip("torch")
    want = np.array([0, 1, 0, 1, 2])
    for name in ("uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64"):
        dt = getattr(torch, name)
        got = rotary.positions.from_lengths(torch.tensor([2, 3], dtype=dt))
        np.testing.assert_array_equal(got.numpy(), want, err_msg=name)
        assert got.dtype == dt, name
        got = rotary.positions.from_cu_seqlens(torch.tensor([0, 2, 5], dtype=dt))
        np.testing.assert_array_equal(got.numpy(), want, err_msg=name)
    for dt in (np.uint8, np.uint16, np.uint32, np.uint64, np.int8):
        np.testing.assert_array_equal(rotary.positions.from_lengths(np.array([2, 3], dtype=dt)), want)


def test_lengths_whose_sum_wraps_are_refused(backend):
    # Issue 44, reproduction 15: lengths whose int64 sum wraps gave an empty array, silently.
    if not backend.int64:
        pytest.skip(f"{backend.name} has no int64")
    lengths = backend.asarray(np.array([2**62] * 4), "int64")
    # (lazy values cannot be read: the remedy is total=, and the docstring says what then)
    lazy = "cannot be read here.*pass total="
    with pytest.raises(ValueError, match="more than an int64 can count|" + lazy):
        rotary.positions.from_lengths(lengths)
    with pytest.raises(ValueError, match="more than an int64 can count"):
        rotary.positions.from_lengths(np.array([2**64 - 1], dtype=np.uint64))


def test_objects_of_an_earlier_import_of_rotary():
    # Issue 44, reproduction 16: after rotary was imported again, an object made before was
    # refused with "rope must be a rotary.RoPE ..., got RoPE" (a RoPE, by every reading but
    # the class object's identity).  States are plain data: served.  A RoPE: refused in words
    # that say what happened and how to mend it, and the mend works.
    code = """
        import sys, numpy as np, rotary
        old = rotary.RoPE(8)
        x = np.random.default_rng(0).normal(size=(2, 8)).astype(np.float32)
        state = rotary.linear_attention_state(x, x)
        for m in [k for k in list(sys.modules) if k == "rotary" or k.startswith("rotary.")]:
            del sys.modules[m]
        import rotary as again
        both = again.combine(state, state)
        assert type(both) is again.LinearAttentionState
        np.testing.assert_allclose(np.asarray(both.S), 2 * np.asarray(state.S), rtol=1e-6)
        assert type(again.linear_attention_state(x, x) + state) is again.LinearAttentionState
        k = np.ones((1, 1, 2, 8), np.float32)
        for call in (
            lambda r: again.positions.shift_keys(k, 1, r),
            lambda r: again.positions.rerotate_keys(k, np.arange(2), r, again.RoPE(8, base=500.0)),
            lambda r: again.learned.frequencies(r, xp=np),
        ):
            try:
                call(old)
                raise SystemExit("an earlier import's RoPE was taken silently")
            except TypeError as e:
                assert "earlier import" in str(e) and "make it again" in str(e), e
            call(again.RoPE(8))  # (the mend)
        print("ok")
    """
    res = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]


def test_dask_unknown_chunk_sizes_get_one_remedy_that_works():
    # Issue 44, reproduction 14: Dask arrays of unknown chunk sizes (after boolean indexing) got
    # "cannot convert float NaN to integer" with Dask positions, and a wrong reason from
    # linear_attention ("must have the same sequence length ... got (nan, 16) and (nan, 16)").
    da = pytest.importorskip("dask.array")
    rng = np.random.default_rng(0)
    host = rng.normal(size=(20, 16)).astype(np.float32)
    keep = host[:, 0] > -0.5
    x = da.from_array(host, chunks=(5, 16))
    hx, hp = host[keep], np.arange(20)[keep]
    calls = {
        "rotate": (lambda a, p: rotary.rotate(a, p), lambda: rotary.rotate(hx, hp)),
        "apply": (lambda a, p: rotary.apply(a, a, p)[0], lambda: rotary.apply(hx, hx, hp)[0]),
        "RoPE.cos_sin": (lambda a, p: rotary.RoPE(16).cos_sin(p)[0], lambda: rotary.RoPE(16).cos_sin(hp)[0]),
        "linear_attention": (
            lambda a, p: rotary.linear_attention(a, a, a, p, causal=True),
            lambda: rotary.linear_attention(hx, hx, hx, hp, causal=True),
        ),
        "attention": (
            lambda a, p: rotary.attention(a, a, a, p, causal=True),
            lambda: rotary.attention(hx, hx, hx, hp, causal=True),
        ),
        "linear_attention_state": (
            lambda a, p: rotary.linear_attention_state(a, a, p).S,
            lambda: rotary.linear_attention_state(hx, hx, hp).S,
        ),
        "convert_layout": (
            lambda a, p: rotary.convert_layout(a, "half", "interleaved"),
            lambda: rotary.convert_layout(hx, "half", "interleaved"),
        ),
    }
    for what, (call, want) in calls.items():
        xu, pu = x[x[:, 0] > -0.5], da.arange(20)[x[:, 0] > -0.5]  # (compute_chunk_sizes mutates)
        for a, p, bad in ((xu, pu, None), (xu, hp, None), (x[keep.nonzero()[0]], pu, "pos")):
            if (what == "convert_layout" and bad) or (what == "RoPE.cos_sin" and p is hp):
                continue  # (convert_layout takes no positions; cos_sin no data)
            with pytest.raises(ValueError, match=r"unknown chunk sizes.*compute_chunk_sizes\(\) first") as e:
                call(a, p)
            if bad:
                assert str(e.value).startswith(bad), (what, str(e.value))
        # the remedy, followed, works
        got = call(xu.compute_chunk_sizes(), pu.compute_chunk_sizes())
        np.testing.assert_allclose(np.asarray(got), np.asarray(want()), rtol=1e-5, atol=1e-6, err_msg=what)


def test_torch_masked_tensors_follow_the_mask_rule_of_numpy_masked_arrays():
    # Issue 44, reproduction 13: torch MaskedTensor got torch's internal errors ("Input masks
    # must match...", "Multiple dispatch failed for aten.index_select"), where np.ma got rotary's
    # own rule: a rotated feature is there where it and its pair partner are.
    torch = pytest.importorskip("torch")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # (torch.masked is a prototype: it says so)
        from torch.masked import masked_tensor

        g = torch.Generator().manual_seed(0)
        data = torch.randn(2, 5, 8, generator=g, dtype=torch.float64)
        there = torch.rand(2, 5, 8, generator=g) > 0.3  # (MaskedTensor: True where a value is)
        x = masked_tensor(data, there)
        ref = np.ma.MaskedArray(data.numpy(), mask=~there.numpy())  # (np.ma: True where masked)
        for layout in ("half", "interleaved"):
            for rd in (6, 8):
                got = rotary.rotate(x, torch.arange(5), layout=layout, rotary_dim=rd)
                want = rotary.rotate(ref, np.arange(5), layout=layout, rotary_dim=rd)
                assert type(got) is type(x)
                np.testing.assert_array_equal(got.get_mask().numpy(), ~np.ma.getmaskarray(want))
                keep = ~np.ma.getmaskarray(want)
                np.testing.assert_array_equal(got.get_data().numpy()[keep], want.data[keep])
        q, k = rotary.apply(x, x, torch.arange(5))
        assert torch.equal(q.get_mask(), rotary.rotate(x, torch.arange(5)).get_mask())
        assert torch.equal(k.get_mask(), q.get_mask())
        conv = rotary.convert_layout(x, "half", "interleaved")
        np.testing.assert_array_equal(
            conv.get_mask().numpy(), ~np.ma.getmaskarray(rotary.convert_layout(ref, "half", "interleaved"))
        )
        with pytest.raises(TypeError, match="pos is a masked tensor: a masked position has no angle"):
            rotary.RoPE(8).cos_sin(masked_tensor(torch.arange(5), torch.arange(5) > 0))
        for call in (
            lambda a: rotary.attention(a, a, a, torch.arange(5), causal=True),
            lambda a: rotary.linear_attention(a, a, a, torch.arange(5), causal=True),
        ):
            with pytest.raises(TypeError, match=r"q is a masked tensor.*x\.to_tensor\(0\)"):
                call(x)
        # the remedy, followed: the data with the mask of the keys
        keys = there.all(-1)
        plain = x.to_tensor(0)
        out = rotary.attention(plain, plain, plain, torch.arange(5), causal=True, mask=keys[..., None, :])
        assert torch.isfinite(out).all()
        out = rotary.linear_attention(plain, plain, plain, torch.arange(5), causal=True, key_mask=keys)
        assert torch.isfinite(out).all()


def test_sparse_lengths_get_a_remedy_that_works():
    # Issue 44, reproduction 15: for pydata sparse lengths the advice was total=, which then
    # failed for another reason (sparse has no cumulative_sum or arange).
    sparse = pytest.importorskip("sparse")
    for fn, host in ((rotary.positions.from_lengths, [2, 3]), (rotary.positions.from_cu_seqlens, [0, 2, 5])):
        lengths = sparse.COO.from_numpy(np.array(host))
        for kw in ({}, {"total": 5}):
            with pytest.raises(TypeError, match=r"todense\(\)") as e:
                fn(lengths, **kw)
            assert "total=" not in str(e.value)
        np.testing.assert_array_equal(fn(lengths.todense()), [0, 1, 0, 1, 2])  # (the remedy, followed)
