"""Packed sequences: every function's packed call equals separate calls, document by document.

The oracle is separate calls on each document (themselves checked against float64 oracles
elsewhere): causal and not, with and without RoPE, decay and gates, states carried across calls,
gradients; ``cu_seqlens`` and segment ids; bad boundaries refused with one clear error.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import rotary
from rotary.testing import assert_close, to_numpy

LENGTHS = (5, 1, 9, 0, 7, 3)  # an empty document too
CU = np.concatenate([[0], np.cumsum(LENGTHS)])
N = int(CU[-1])
H, D, DV = 2, 8, 5


def _int(backend):
    return "int64" if backend.float64 else "int32"


def _docs(kind, backend):
    if kind == "cu_seqlens":
        return {"cu_seqlens": backend.asarray(CU, _int(backend))}
    ids = np.repeat(np.arange(len(LENGTHS)) * 7 % 5, LENGTHS)  # runs: ids need not increase
    return {"segment_ids": backend.asarray(ids, _int(backend))}


def _spans():
    return [(int(a), int(b)) for a, b in itertools.pairwise(CU)]


def _qkv(backend, rng, dtype="float32", lead=(H,)):
    xs = [rng.normal(size=(*lead, N, D)), rng.normal(size=(*lead, N, D)), rng.normal(size=(*lead, N, DV))]
    return [backend.asarray(x, dtype) for x in xs]


@pytest.mark.parametrize("kind", ["cu_seqlens", "segment_ids"])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("gates", [False, True])
def test_linear_attention_packed_is_separate_calls(backend, rng, kind, causal, gates):
    """The reproduction of issue 42: positions from ``from_cu_seqlens`` and a causal call leaked
    the state of one document into the next (errors up to 2.4 on 237a6c9)."""
    q, k, v = _qkv(backend, rng)
    lg = backend.asarray(np.log(rng.uniform(0.4, 1.0, size=(H, N))), "float32") if gates else None
    kw = {"log_gate": lg, "decay": 0.9} if gates else {}
    pos = backend.asarray(rotary.positions.from_cu_seqlens(CU), _int(backend))
    out = rotary.linear_attention(q, k, v, pos, causal=causal, chunk_size=4, **_docs(kind, backend), **kw)
    implied = rotary.linear_attention(
        q, k, v, None, rope=rotary.RoPE(D), causal=causal, chunk_size=4, **_docs(kind, backend), **kw
    )
    assert_close(implied, to_numpy(out), like=q, ulps=0)  # positions from the boundaries: the same
    got = to_numpy(out)
    for a, b in _spans():
        if a == b:
            continue
        kd = dict(kw)
        if gates:
            kd["log_gate"] = lg[..., a:b]
        ref = rotary.linear_attention(
            q[..., a:b, :], k[..., a:b, :], v[..., a:b, :], pos[a:b], causal=causal, chunk_size=4, **kd
        )
        assert_close(got[..., a:b, :], to_numpy(ref), dtype="float32", ulps=32)


def test_linear_attention_packed_bfloat16(backend, rng):
    if "bfloat16" not in backend.float_dtypes():
        pytest.skip(f"{backend.name} has no bfloat16")
    q, k, v = _qkv(backend, rng, "bfloat16")
    out = rotary.linear_attention(
        q, k, v, None, rope=rotary.RoPE(D), causal=True, **_docs("cu_seqlens", backend)
    )
    assert out.dtype == q.dtype
    for a, b in _spans():
        if a == b:
            continue
        ref = rotary.linear_attention(
            q[..., a:b, :], k[..., a:b, :], v[..., a:b, :], np.arange(b - a), causal=True
        )
        assert_close(out[..., a:b, :], to_numpy(ref), like=q, ulps=2)


@pytest.mark.parametrize("gates", [False, True])
def test_per_document_states_continue_a_ragged_batch(backend, rng, gates):
    """``return_state`` gives each document's final state; ``state=`` continues every document
    at its own offset (positions from each state's offset) in one call."""
    q, k, v = _qkv(backend, rng)
    lg = backend.asarray(np.log(rng.uniform(0.4, 1.0, size=(H, N))), "float32") if gates else None
    rope = rotary.RoPE(D)
    cu = backend.asarray(CU, _int(backend))
    _, st = rotary.linear_attention(
        q, k, v, None, rope=rope, causal=True, cu_seqlens=cu, log_gate=lg, return_state=True
    )
    assert tuple(st.S.shape) == (H, len(LENGTHS), D, DV)
    assert to_numpy(st.offset).tolist() == list(LENGTHS)
    # 2 new tokens per document, one call
    n2 = 2 * len(LENGTHS)
    q2, k2, v2 = (backend.asarray(rng.normal(size=(H, n2, w)), "float32") for w in (D, D, DV))
    lg2 = backend.asarray(np.log(rng.uniform(0.4, 1.0, size=(H, n2))), "float32") if gates else None
    cu2 = backend.asarray(np.arange(0, n2 + 1, 2), _int(backend))
    o2, st2 = rotary.linear_attention(
        q2, k2, v2, None, rope=rope, causal=True, cu_seqlens=cu2, log_gate=lg2, state=st, return_state=True
    )
    o2 = to_numpy(o2)
    for d, (a, b) in enumerate(_spans()):
        cat = [
            backend.xp.concat([x[..., a:b, :], y[..., 2 * d : 2 * d + 2, :]], axis=-2)
            for x, y in ((q, q2), (k, k2), (v, v2))
        ]
        lgd = None if not gates else backend.xp.concat([lg[..., a:b], lg2[..., 2 * d : 2 * d + 2]], axis=-1)
        ref, rst = rotary.linear_attention(
            *cat, np.arange(b - a + 2), causal=True, log_gate=lgd, return_state=True
        )
        assert_close(o2[..., 2 * d : 2 * d + 2, :], to_numpy(ref)[..., -2:, :], dtype="float32", ulps=32)
        assert_close(
            to_numpy(st2.S)[..., d, :, :],
            to_numpy(rst.S),
            dtype="float32",
            ulps=32,
            scale=np.abs(to_numpy(rst.S)) + 1,
        )
    assert to_numpy(st2.offset).tolist() == [n + 2 for n in LENGTHS]
    # linear_attention_state: the same states, without outputs
    alone = rotary.linear_attention_state(k, v, None, rope=rope, cu_seqlens=cu, log_gate=lg)
    assert_close(alone.S, to_numpy(st.S), dtype="float32", ulps=32, scale=np.abs(to_numpy(st.S)) + 1)


def test_segment_ids_state_is_the_last_documents(backend, rng):
    q, k, v = _qkv(backend, rng)
    seg = _docs("segment_ids", backend)
    _, st = rotary.linear_attention(q, k, v, None, rope=rotary.RoPE(D), causal=True, return_state=True, **seg)
    a, b = _spans()[-1]
    ref = rotary.linear_attention_state(k[..., a:b, :], v[..., a:b, :], np.arange(b - a))
    assert_close(st.S, to_numpy(ref.S), dtype="float32", ulps=32, scale=np.abs(to_numpy(ref.S)) + 1)
    assert np.all(to_numpy(st.log_decay) == -np.inf)  # a boundary: it combines with nothing before


@pytest.mark.parametrize("kind", ["cu_seqlens", "segment_ids"])
@pytest.mark.parametrize("causal", [True, False])
def test_softmax_attention_packed_is_separate_calls(backend, rng, kind, causal):
    q, k, v = _qkv(backend, rng, lead=(1, H))
    out = to_numpy(
        rotary.attention(q, k, v, None, rope=rotary.RoPE(D), causal=causal, **_docs(kind, backend))
    )
    for a, b in _spans():
        if a == b:
            continue
        ref = rotary.attention(
            q[..., a:b, :], k[..., a:b, :], v[..., a:b, :], np.arange(b - a), causal=causal
        )
        assert_close(out[..., a:b, :], to_numpy(ref), dtype="float32", ulps=16)


def test_apply_and_rotate_positions_from_the_documents(backend, rng):
    q, k, _ = _qkv(backend, rng)
    want = rotary.positions.from_cu_seqlens(CU)
    p = backend.asarray(want, _int(backend))
    for kind in ("cu_seqlens", "segment_ids"):
        qr, kr = rotary.apply(q, k, **_docs(kind, backend))
        ref_q, ref_k = rotary.apply(q, k, p)
        assert_close(qr, to_numpy(ref_q), like=q, ulps=0)
        assert_close(kr, to_numpy(ref_k), like=k, ulps=0)
    thd = backend.xp.permute_dims(q, (1, 0, 2))  # (total, heads, head_dim)
    got = rotary.rotate(thd, cu_seqlens=CU)  # (host boundaries: the packed layout is told by their total)
    assert_close(
        got, to_numpy(rotary.rotate(thd, backend.asarray(want[:, None], _int(backend)))), like=thd, ulps=0
    )


def test_gradients_through_packed_calls(rng):
    torch = pytest.importorskip("torch")
    xs = [
        torch.tensor(rng.normal(size=(H, N, w)), dtype=torch.float64, requires_grad=True) for w in (D, D, DV)
    ]
    lg = torch.tensor(np.log(rng.uniform(0.4, 1.0, size=(H, N))), requires_grad=True)
    w = torch.tensor(rng.normal(size=(H, N, DV)))
    cu = torch.tensor(CU)
    for causal in (True, False):
        out = rotary.linear_attention(
            *xs, None, rope=rotary.RoPE(D), causal=causal, cu_seqlens=cu, log_gate=lg
        )
        ga = torch.autograd.grad((out * w).sum(), (*xs, lg))
        parts = []
        for a, b in _spans():
            o = rotary.linear_attention(
                xs[0][:, a:b],
                xs[1][:, a:b],
                xs[2][:, a:b],
                torch.arange(b - a),
                causal=causal,
                log_gate=lg[:, a:b],
            )
            parts.append(o)
        gb = torch.autograd.grad((torch.cat(parts, 1) * w).sum(), (*xs, lg))
        for a, b in zip(ga, gb, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_bad_boundaries_one_clear_error(backend, rng):
    q, k, v = _qkv(backend, rng)
    la = rotary.linear_attention
    for cu, words in (
        ([1, 5, N], "does not start at 0"),
        ([0, 9, 5, N], "decreases"),
        ([0, 5, N - 1], "not at the total length"),
    ):
        if not backend.host_values and is_backend_array(cu):
            continue
        with pytest.raises(ValueError, match=words):
            la(q, k, v, None, causal=True, cu_seqlens=cu)
        with pytest.raises(ValueError, match=words):
            rotary.attention(q, k, v, None, causal=True, cu_seqlens=cu)
    with pytest.raises(ValueError, match="segment_ids of shape"):
        la(q, k, v, None, causal=True, segment_ids=backend.asarray(np.zeros(N - 1), _int(backend)))
    with pytest.raises(ValueError, match="not both"):
        la(q, k, v, None, causal=True, cu_seqlens=CU, segment_ids=backend.asarray(np.zeros(N), _int(backend)))
    with pytest.raises(ValueError, match="same tokens"):
        la(q, k[..., :4, :], v[..., :4, :], None, cu_seqlens=CU)
    st = rotary.linear_attention_state(k, v, None)
    with pytest.raises(ValueError, match="one state per document"):
        la(q, k, v, None, causal=True, cu_seqlens=CU, state=st)
    with pytest.raises(ValueError, match="not both"):
        rotary.rotate(q, backend.asarray(np.arange(N), _int(backend)), cu_seqlens=CU)


def is_backend_array(x):
    return not isinstance(x, list)


@pytest.mark.slow
def test_no_python_loop_over_documents_under_compile_and_jit(rng):
    """Given as segment ids, any packing of the same total length runs in one graph: torch.compile
    (fullgraph) and jax.jit see the boundaries as data."""
    torch = pytest.importorskip("torch")
    jax = pytest.importorskip("jax")
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def f(q, k, v, seg):
        return rotary.linear_attention(q, k, v, None, rope=rotary.RoPE(D), causal=True, segment_ids=seg)

    cf = torch.compile(f, fullgraph=True, backend=backend)
    jf = jax.jit(f)
    q, k, v = (rng.normal(size=(H, 64, w)).astype(np.float32) for w in (D, D, DV))
    packings = [np.repeat(np.arange(len(ls)), ls) for ls in ((64,), (10, 54), (1,) * 64, (30, 2, 2, 30))]
    wants = [
        rotary.linear_attention(q, k, v, None, rope=rotary.RoPE(D), causal=True, segment_ids=s)
        for s in packings
    ]
    for seg, want in zip(
        packings, wants, strict=True
    ):  # (torch first: no other library's type met meanwhile)
        got = cf(*(torch.from_numpy(x) for x in (q, k, v)), torch.from_numpy(seg))
        np.testing.assert_allclose(got.numpy(), want, rtol=2e-5, atol=2e-5)
    for seg, want in zip(packings, wants, strict=True):
        np.testing.assert_allclose(np.asarray(jf(q, k, v, seg)), want, rtol=2e-5, atol=2e-5)
    assert len(graphs) == 1, f"{len(graphs)} graphs for 4 packings"
    assert jf._cache_size() == 1
