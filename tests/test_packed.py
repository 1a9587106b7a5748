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


def _every_entry_point(q, k, v, docs):
    return {
        "linear_attention": lambda: rotary.linear_attention(q, k, v, None, causal=True, **docs),
        "attention": lambda: rotary.attention(q, k, v, None, causal=True, **docs),
        "rotate": lambda: rotary.rotate(q, **docs),
        "apply": lambda: rotary.apply(q, k, **docs),
        "linear_attention_state": lambda: rotary.linear_attention_state(k, v, None, **docs),
    }


def test_boundaries_of_another_library_are_refused(backend, rng):
    """Issue 50, finding 3: boundaries are checked for their library like every other array:
    an array of ``q``'s library, a NumPy array or a Python sequence (served everywhere in this
    file); any other library's array is refused by name (its values were read through a way of
    its own)."""
    strict = pytest.importorskip("array_api_strict")
    torch = pytest.importorskip("torch")
    q, k, v = _qkv(backend, rng)
    own = type(backend.asarray(CU, _int(backend)))
    lib = next(m for m in (strict, torch) if type(m.asarray(CU)) is not own)
    ids = np.repeat(np.arange(len(LENGTHS)), LENGTHS)
    other, other_ids = lib.asarray(CU), lib.asarray(ids)
    for name, b in (("cu_seqlens", other), ("segment_ids", other_ids)):
        for call in _every_entry_point(q, k, v, {name: b}).values():
            with pytest.raises(TypeError, match=f"{name} is a .* but (q|k|x) is a"):
                call()


def test_boundaries_on_another_device_are_refused():
    """Issue 50, finding 3: ``cu_seqlens`` on torch's ``meta`` device (no values) beside data on
    the CPU was read without a check: outputs off by 2.3, silently, in every entry point.  Like
    segment ids and positions, boundaries on another device than the data are refused by name,
    both ways."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    q, k, v = (torch.from_numpy(rng.normal(size=(H, N, w)).astype(np.float32)) for w in (D, D, DV))
    ids = np.repeat(np.arange(len(LENGTHS)), LENGTHS)
    for name, host in (("cu_seqlens", CU), ("segment_ids", ids)):
        meta = torch.asarray(host).to("meta")
        for call in _every_entry_point(q, k, v, {name: meta}).values():
            with pytest.raises(ValueError, match=f"{name} is on device meta but (q|k|x) is on device cpu"):
                call()
        qm, km, vm = (x.to("meta") for x in (q, k, v))
        for call in _every_entry_point(qm, km, vm, {name: torch.asarray(host)}).values():
            with pytest.raises(ValueError, match=f"{name} is on device cpu but (q|k|x) is on device meta"):
                call()
        for call in _every_entry_point(qm, km, vm, {name: meta}).values():  # (one device: served)
            call()


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


# -- a packed stream in windows, decoding steps, calls of one and of no token (issue 50) ----------
#: Two rows of one packed stream: documents of 3, 4 and 8 tokens, and of 10 and 5.
ROW_LENGTHS = ((3, 4, 8), (10, 5))
ROW_SEG = np.stack([np.repeat(np.arange(len(ls)), ls) for ls in ROW_LENGTHS])[:, None, :]  # (2, 1, 15)
ROW_POS = np.stack([np.concatenate([np.arange(n) for n in ls]) for ls in ROW_LENGTHS])[:, None, :]


def _rows(backend, rng):
    n = ROW_SEG.shape[-1]
    q, k, v = (backend.asarray(rng.normal(size=(2, H, n, w)), "float32") for w in (D, D, DV))
    lg = backend.asarray(np.log(rng.uniform(0.5, 1.0, size=(2, H, n))), "float32")
    return q, k, v, lg


@pytest.mark.parametrize("gates", [False, True])
def test_a_packed_stream_in_windows_continues_its_documents(backend, rng, gates):
    """Issue 50: a packed row cut after token 12, positions implied (``rope=``, no ``pos``):
    window 2 continued the state's document at the row's token count (12) where it is at 5 (0.31
    off the one call in the issue's probe, 0.21 in ours).  The state's offset is the position in
    each row's last document, and the continued document's positions go on from it, window by
    window or token by token."""
    q, k, v, lg = _rows(backend, rng)
    seg = backend.asarray(ROW_SEG, _int(backend))
    kw = {"rope": rotary.RoPE(D), "causal": True, "chunk_size": 4}
    if gates:
        kw.update(decay=0.9)

    def gated(a, b):
        return {"log_gate": lg[..., a:b]} if gates else {}

    whole = to_numpy(rotary.linear_attention(q, k, v, segment_ids=seg, **kw, **gated(0, 15)))
    for cut, want_offset in ((12, [5, 2]), (5, [2, 5])):
        part = [(x[..., :cut, :], x[..., cut:, :]) for x in (q, k, v)]
        o1, st = rotary.linear_attention(
            *(p[0] for p in part), segment_ids=seg[..., :cut], return_state=True, **kw, **gated(0, cut)
        )
        assert to_numpy(st.offset).reshape(-1).tolist() == want_offset
        o2 = rotary.linear_attention(
            *(p[1] for p in part), segment_ids=seg[..., cut:], state=st, **kw, **gated(cut, 15)
        )
        assert_close(o1, whole[..., :cut, :], like=q, ulps=64)
        assert_close(o2, whole[..., cut:, :], like=q, ulps=64)
    # decoding: window 1, then one token at a time (one segment id per row)
    _, st = rotary.linear_attention(
        q[..., :12, :],
        k[..., :12, :],
        v[..., :12, :],
        segment_ids=seg[..., :12],
        return_state=True,
        **kw,
        **gated(0, 12),
    )
    for t in range(12, 15):
        o, st = rotary.linear_attention(
            *(x[..., t : t + 1, :] for x in (q, k, v)),
            segment_ids=seg[..., t : t + 1],
            state=st,
            return_state=True,
            **kw,
            **gated(t, t + 1),
        )
        assert_close(o, whole[..., t : t + 1, :], like=q, ulps=64)
    assert to_numpy(st.offset).reshape(-1).tolist() == [8, 5]


def test_states_of_windows_combine_with_their_offsets(backend, rng):
    """``earlier + later``: the later block's offset where it holds a boundary (it restarts),
    else the sum; the sums equal the whole row's state (positions given: a block's state alone
    cannot know where its first document began)."""
    _, k, v, _ = _rows(backend, rng)
    seg = backend.asarray(ROW_SEG, _int(backend))
    pos = backend.asarray(ROW_POS, _int(backend))
    whole = rotary.linear_attention_state(k, v, pos, segment_ids=seg)
    assert to_numpy(whole.offset).reshape(-1).tolist() == [8, 5]
    for cut in (12, 5):
        a, b = (
            rotary.linear_attention_state(k[..., s, :], v[..., s, :], pos[..., s], segment_ids=seg[..., s])
            for s in (slice(0, cut), slice(cut, 15))
        )
        for st in (a + b, rotary.combine(a, b)):
            assert to_numpy(st.offset).reshape(-1).tolist() == [8, 5]
            assert_close(
                st.S, to_numpy(whole.S), dtype="float32", ulps=32, scale=np.abs(to_numpy(whole.S)) + 1
            )


def _one_doc(kind, backend, n):
    if kind == "cu_seqlens":
        return {"cu_seqlens": backend.asarray(np.array([0, n]), _int(backend))}
    return {"segment_ids": backend.asarray(np.zeros(n), _int(backend))}


@pytest.mark.parametrize("kind", ["cu_seqlens", "segment_ids"])
@pytest.mark.parametrize("n", [1, 0])
def test_one_and_no_token_of_a_packed_row(backend, rng, kind, n):
    """Issue 50: one token of a packed row (the decoding step) was refused everywhere (an
    IndexError, "segment_ids of shape (0,)", "pos of shape (0,)", a reshape); no token with a
    state per document failed in a concatenation.  Every packed function serves both: as the
    same call without documents (one document from position 0), a state continued or kept."""
    rope = rotary.RoPE(D)
    q, k, v = (backend.asarray(rng.normal(size=(H, 3 + n, w)), "float32") for w in (D, D, DV))
    new = [x[..., 3:, :] for x in (q, k, v)]
    pos = backend.asarray(np.arange(n), _int(backend))
    for causal in (True, False):
        got = rotary.linear_attention(*new, rope=rope, causal=causal, **_one_doc(kind, backend, n))
        assert_close(got, to_numpy(rotary.linear_attention(*new, pos, causal=causal)), like=q, ulps=16)
        got = rotary.attention(*new, rope=rope, causal=causal, **_one_doc(kind, backend, n))
        assert_close(got, to_numpy(rotary.attention(*new, pos, causal=causal)), like=q, ulps=16)
    st = rotary.linear_attention_state(new[1], new[2], rope=rope, **_one_doc(kind, backend, n))
    want = rotary.linear_attention_state(new[1], new[2], pos)
    assert_close(
        st.S[..., 0, :, :] if kind == "cu_seqlens" else st.S, to_numpy(want.S), dtype="float32", ulps=16
    )
    assert to_numpy(st.offset).reshape(-1).tolist() == [n]
    assert_close(
        rotary.rotate(new[0], **_one_doc(kind, backend, n)),
        to_numpy(rotary.rotate(new[0], pos)),
        like=q,
        ulps=0,
    )
    # continuing a state of 3 tokens: one token goes on at position 3, no token keeps the state
    _, st = rotary.linear_attention(
        *(x[..., :3, :] for x in (q, k, v)),
        rope=rope,
        causal=True,
        return_state=True,
        **_one_doc(kind, backend, 3),
    )
    out, st2 = rotary.linear_attention(
        *new, rope=rope, causal=True, state=st, return_state=True, **_one_doc(kind, backend, n)
    )
    full = rotary.linear_attention(q, k, v, np.arange(3 + n), causal=True)
    assert_close(out, to_numpy(full)[..., 3:, :], like=q, ulps=32)
    assert to_numpy(st2.offset).reshape(-1).tolist() == [3 + n]
    if n == 0:
        assert_close(st2.S, to_numpy(st.S), dtype="float32", ulps=0)


def test_decoding_some_documents_of_a_ragged_batch(backend, rng):
    """A state per document (``cu_seqlens``) goes on with one token for one document and none
    for the others, or no token at all (the states unchanged)."""
    rope = rotary.RoPE(D)
    q, k, v = (backend.asarray(rng.normal(size=(H, 6, w)), "float32") for w in (D, D, DV))
    cu = backend.asarray(np.array([0, 2, 5]), _int(backend))
    _, st = rotary.linear_attention(
        *(x[..., :5, :] for x in (q, k, v)), rope=rope, causal=True, cu_seqlens=cu, return_state=True
    )
    one = [x[..., 5:, :] for x in (q, k, v)]
    o, st1 = rotary.linear_attention(
        *one, rope=rope, causal=True, cu_seqlens=[0, 0, 1], state=st, return_state=True
    )
    alone = rotary.linear_attention(*(x[..., 2:6, :] for x in (q, k, v)), np.arange(4), causal=True)
    assert_close(o, to_numpy(alone)[..., -1:, :], like=q, ulps=32)
    assert to_numpy(st1.offset).tolist() == [2, 4]
    assert_close(st1.S[..., 0, :, :], to_numpy(st.S[..., 0, :, :]), dtype="float32", ulps=0)
    none = [x[..., :0, :] for x in (q, k, v)]
    o, st0 = rotary.linear_attention(
        *none, rope=rope, causal=True, cu_seqlens=[0, 0, 0], state=st, return_state=True
    )
    assert tuple(o.shape) == (H, 0, DV)
    assert to_numpy(st0.offset).tolist() == [2, 3]
    assert_close(st0.S, to_numpy(st.S), dtype="float32", ulps=0)


def test_one_and_no_token_under_jax_jit(rng):
    """The decoding step and an empty call of a packed row, traced by ``jax.jit``."""
    jax = pytest.importorskip("jax")
    rope = rotary.RoPE(D)
    q, k, v = (rng.normal(size=(H, 13, w)).astype(np.float32) for w in (D, D, DV))
    seg = np.repeat([0, 1], [4, 9])
    whole = rotary.linear_attention(q, k, v, rope=rope, causal=True, segment_ids=seg)

    @jax.jit
    def step(q, k, v, seg, st):
        return rotary.linear_attention(
            q, k, v, rope=rope, causal=True, segment_ids=seg, state=st, return_state=True
        )

    _, st = rotary.linear_attention(
        q[:, :12], k[:, :12], v[:, :12], rope=rope, causal=True, segment_ids=seg[:12], return_state=True
    )
    o, st1 = step(q[:, 12:], k[:, 12:], v[:, 12:], seg[12:], st)
    assert_close(o, whole[:, 12:], dtype="float32", ulps=64)
    assert int(st1.offset) == 9
    o, st0 = step(q[:, :0], k[:, :0], v[:, :0], seg[:0], st)
    assert o.shape == (H, 0, DV) and int(st0.offset) == 8
    for causal in (True, False):
        f = jax.jit(
            lambda q, k, v, cu, c=causal: rotary.attention(q, k, v, rope=rope, causal=c, cu_seqlens=cu)
        )
        assert_close(f(q[:, :1], k[:, :1], v[:, :1], np.array([0, 1])), v[:, :1], dtype="float32", ulps=0)


@pytest.mark.slow
def test_one_and_no_token_under_torch_compile(rng):
    """The decoding step and an empty call of a packed row under ``torch.compile(fullgraph=True)``
    (an empty causal call failed there, packed or not: its chunks were indexed)."""
    torch = pytest.importorskip("torch")
    rope = rotary.RoPE(D)
    q, k, v = (torch.from_numpy(rng.normal(size=(H, 13, w)).astype(np.float32)) for w in (D, D, DV))
    seg = torch.from_numpy(np.repeat([0, 1], [4, 9]))
    whole = rotary.linear_attention(q, k, v, rope=rope, causal=True, segment_ids=seg)

    @torch.compile(fullgraph=True)
    def step(q, k, v, seg, st):
        return rotary.linear_attention(
            q, k, v, rope=rope, causal=True, segment_ids=seg, state=st, return_state=True
        )

    _, st = rotary.linear_attention(
        q[:, :12], k[:, :12], v[:, :12], rope=rope, causal=True, segment_ids=seg[:12], return_state=True
    )
    o, st1 = step(q[:, 12:], k[:, 12:], v[:, 12:], seg[12:], st)
    assert_close(o, whole[:, 12:], like=q, ulps=64)
    assert int(st1.offset) == 9
    o, st0 = step(q[:, :0], k[:, :0], v[:, :0], seg[:0], st)
    assert tuple(o.shape) == (H, 0, DV) and int(st0.offset) == 8


def test_one_offset_for_all_documents(backend, rng):
    """A state per document whose offset is one for all (an integer, or a 0-d array) goes on
    from it, as the same offset given per document (JAX dropped it: 0.21 off on b44aa6a)."""
    rope = rotary.RoPE(D)
    q, k, v = (backend.asarray(rng.normal(size=(H, 6, w)), "float32") for w in (D, D, DV))
    cu = backend.asarray(np.array([0, 2, 6]), _int(backend))
    _, st = rotary.linear_attention(q, k, v, rope=rope, causal=True, cu_seqlens=cu, return_state=True)
    want = rotary.linear_attention(
        q,
        k,
        v,
        rope=rope,
        causal=True,
        cu_seqlens=cu,
        state=st._replace(offset=backend.asarray([7, 7], _int(backend))),
    )
    for off in (7, backend.asarray(np.array(7), _int(backend))):
        got = rotary.linear_attention(
            q, k, v, rope=rope, causal=True, cu_seqlens=cu, state=st._replace(offset=off)
        )
        assert_close(got, to_numpy(want), like=q, ulps=0)
