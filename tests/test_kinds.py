"""Every kind of array a user holds (``tests/kinds.py``) through rotary's calls: served right (the
values of the plain NumPy float64 computation, the input's type, namespace and dtype) or refused
with one clear error.  Each reproduction of issue 35 is a kind here, or a test below."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # (wraparray: a module of the tests)

from kinds import CALLS, KINDS, inputs

import rotary
from rotary.testing import to_numpy

#: Which input each call's outputs are of (their type and namespace): data, positions, lengths.
_OUTPUT_OF = {"RoPE.cos_sin": "p", "positions.from_lengths": "n"}


def _want(call: str) -> list[np.ndarray]:
    a = inputs()
    args = (a["x"].astype(np.float64), a["k"].astype(np.float64), a["p"], a["n"])
    return [np.asarray(o, dtype=np.float64) for o in CALLS[call](*args)]


@pytest.mark.parametrize("call", list(CALLS))
@pytest.mark.parametrize("kind", list(KINDS))
def test_kind(kind: str, call: str) -> None:
    k = KINDS[kind]
    if k.needs and importlib.util.find_spec(k.needs) is None:
        pytest.skip(f"{k.needs} not installed")
    a = inputs()
    with k.context():
        made = {n: k.make(v) for n, v in a.items()}
        args = (made["x"], made["k"], made["p"], made["n"])
        if k.refused is not None and (k.refused_calls is None or call in k.refused_calls):
            with pytest.raises((TypeError, ValueError), match=k.refused):
                CALLS[call](*args)
            return
        got = CALLS[call](*args)
        like = made[_OUTPUT_OF.get(call, "x")]
        for o, w in zip(got, _want(call), strict=True):
            assert type(o) is type(like), f"{type(o)} for {type(like)}"
            if call not in _OUTPUT_OF:
                assert o.dtype == like.dtype, (o.dtype, like.dtype)
            values = np.ma.getdata(o) if isinstance(o, np.ma.MaskedArray) else o
            g = np.asarray(_host(values), dtype=np.float64)
            ok = ~np.ma.getmaskarray(o) if isinstance(o, np.ma.MaskedArray) else np.ones(g.shape, bool)
            tol = 16 * float(np.finfo(k.dtype if call not in _OUTPUT_OF else "float32").eps)
            err = np.abs(g - w)[ok].max(initial=0.0)
            assert err <= tol * max(1.0, float(np.abs(w).max())), err


def _host(x: Any) -> np.ndarray:
    """The values of a result (a wraparray library's through its own way in: some have no other)."""
    import wraparray

    return wraparray.peek(x) if isinstance(x, wraparray.WArray) else to_numpy(x)


# -- NumPy's masked arrays: the mask rule -----------------------------------------------------------
@pytest.mark.parametrize(("layout", "rotary_dim"), [("half", 16), ("interleaved", 16), ("half", 8)])
def test_masked_features_mask_their_pair_partner(layout: str, rotary_dim: int) -> None:
    """A rotated feature is masked where it or its pair partner is (marray's rule); features past
    ``rotary_dim`` keep their own mask. (67cca2f: the mask was dropped, a masked 1e30 counted.)"""
    x = KINDS["numpy masked"].make(inputs()["x"])
    out = rotary.rotate(x, np.arange(6), layout=layout, rotary_dim=rotary_dim)
    m = np.ma.getmaskarray(x)
    h = rotary_dim // 2
    partner = np.arange(16)
    partner[:rotary_dim] = (
        [j + h if j < h else j - h for j in range(rotary_dim)]
        if layout == "half"
        else [j ^ 1 for j in range(rotary_dim)]
    )
    assert isinstance(out, np.ma.MaskedArray)
    np.testing.assert_array_equal(np.ma.getmaskarray(out), m | m[..., partner])
    assert np.abs(np.ma.getdata(out)[~out.mask]).max() < 10  # (no masked 1e30 leaked)


def test_masked_arrays_are_refused_where_their_mask_has_no_rule() -> None:
    x = KINDS["numpy masked"].make(inputs()["x"])
    with pytest.raises(TypeError, match=r"q is a masked array: attention.*mask="):
        rotary.attention(x, x, x, np.arange(6))
    with pytest.raises(TypeError, match=r"masked array.*key_mask="):
        rotary.linear_attention(x, x, x, np.arange(6))
    with pytest.raises(TypeError, match=r"pos is a masked array"):
        rotary.rotate(np.ones((6, 16)), np.ma.MaskedArray(np.arange(6)))


# -- reproductions --------------------------------------------------------------------------------
def test_big_endian_float64_is_computed_in_float64() -> None:
    """(67cca2f: 3.5e-7, float32 arithmetic, where native float64 gives 1e-16.)"""
    x = np.random.default_rng(0).standard_normal((5, 16))
    want = rotary.rotate(x, np.arange(5) * 1000)
    got = rotary.rotate(x.astype(">f8"), np.arange(5) * 1000)
    assert got.dtype == np.dtype(">f8")
    assert np.abs(got.astype(np.float64) - want).max() <= 4 * np.finfo(np.float64).eps * 4


def test_unrecognised_arrays_are_never_read_as_host_values() -> None:
    """``from_lengths`` of a paddle tensor returned a NumPy array (67cca2f); every helper refuses
    an unrecognised array the same way, naming its type."""
    from kinds import Foreign

    f = Foreign(np.array([3, 1, 2]))
    for call in (
        lambda: rotary.positions.from_lengths(f),
        lambda: rotary.positions.from_cu_seqlens(f),
        lambda: rotary.positions.from_attention_mask(f),
        lambda: rotary.positions.mrope_text_positions(f, np.array([[0]])),
        lambda: rotary.rotate(np.ones((3, 8)), f),
        lambda: rotary.decay_bound(f, 16),
    ):
        with pytest.raises(TypeError, match=r"kinds\.Foreign, which is not an array rotary recognises"):
            call()


def test_a_library_without_isdtype_is_told_so() -> None:
    """(67cca2f: ``pos must hold integer or real floating positions, got dtype int64``.)"""
    make = KINDS["wraparray without isdtype"].make
    with pytest.raises(TypeError, match=r"has no isdtype, which rotary needs") as e:
        rotary.rotate(make(np.ones((3, 8), dtype=np.float32)), make(np.arange(3)))
    assert "positions" not in str(e.value)


def test_an_unhashable_device_is_served_without_caching() -> None:
    """(67cca2f: ``TypeError: unhashable type`` from the cache.)"""
    make = KINDS["wraparray with an unhashable device"].make
    x, pos = make(np.ones((3, 16), dtype=np.float32)), np.arange(3) + 5000
    # (each call from an empty cache: one that earlier tests filled would evict for any new entry,
    # and the sizes below would say nothing; results do not depend on the cache)
    rotary.clear_cache()
    want = rotary.rotate(np.ones((3, 16), dtype=np.float32), pos)
    plain = rotary.cache_info()  # (NumPy's own device: its constants are stored)
    rotary.clear_cache()
    out = rotary.rotate(x, make(pos))
    first = rotary.cache_info()
    again = rotary.rotate(x, make(pos))
    for got in (out, again):
        np.testing.assert_allclose(to_numpy(got), want, rtol=0, atol=0)
    # nothing keyed by the device object: its constants are built for each call, never stored
    assert first.nbytes < plain.nbytes
    assert rotary.cache_info()[:2] == first[:2]


def test_the_oldest_standard_version_is_declared() -> None:
    from rotary._lib._compat import OLDEST_STANDARD

    assert OLDEST_STANDARD == "2023.12"
    assert (
        "2023.12"
        in (Path(__file__).resolve().parents[1] / "docs" / "guides" / "array_libraries.rst").read_text()
    )


def test_a_library_half_imported_by_another_thread_is_not_read() -> None:
    """Recognition reads ``sys.modules``: while another thread imports torch, ``torch`` is there
    without ``Tensor`` yet (the state matrix's threads scenario failed with ``partially initialized
    module 'torch' has no attribute 'Tensor'``).  Reproduced deterministically in a fresh process."""
    import subprocess
    import textwrap

    code = """
        import sys, types
        import numpy as np
        import rotary
        for name in ("torch", "torch.fx", "torch.distributed.tensor", "array_api_strict._array_object"):
            sys.modules[name] = types.ModuleType(name)  # (half imported: no attributes yet)
        x = np.ones((3, 8), dtype=np.float32)
        print(float(np.abs(rotary.rotate(x, np.arange(3))).max()))
    """
    res = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stderr[-2000:]
