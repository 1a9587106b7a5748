"""The recurrent families of linear attention (per-feature gates, the delta rule, RWKV's bonus and
transition) against their float64 recurrence (``tests/linear_families.py``), on every backend:
chunked and token by token, with states, grouped-query heads, key masks, packed documents, RoPE
and gradients; transformers' own functions as a second oracle."""

from __future__ import annotations

import itertools

import array_api_compat
import numpy as np
import pytest
from linear_families import BY_NAME, FAMILIES, inputs, keywords, oracle_keywords, recurrence, rst

import rotary
from rotary.testing import assert_close, to_numpy

NAMES = [f.name for f in FAMILIES]
LEAD, N, F, DV = (2,), 37, 8, 5


def _scale(ref: np.ndarray) -> float:
    return float(max(1.0, np.abs(ref).max(initial=0.0)))


def _conv(backend, dtype="float32"):
    return lambda x: backend.asarray(np.asarray(x), dtype)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("chunk", [4, 16])
def test_family_matches_its_recurrence(backend, rng, name, chunk):
    if chunk != 4 and (backend.lazy or backend.tracer == "jax"):
        pytest.skip("one chunk size on compiled and lazy backends (the same code; a compile or a graph each)")
    fam = BY_NAME[name]
    x = inputs(fam, rng, LEAD, N, F, DV)
    cv = _conv(backend)
    q, k, v = cv(x["q"]), cv(x["k"]), cv(x["v"])
    out, st = rotary.linear_attention(q, k, v, chunk_size=chunk, return_state=True, **keywords(fam, x, cv))
    xs = {n: to_numpy(cv(a)).astype(np.float64) for n, a in x.items()}  # (the rounded inputs)
    ref, S = recurrence(xs["q"], xs["k"], xs["v"], **oracle_keywords(fam, xs))
    assert_close(out, ref, like=q, scale=_scale(ref), ulps=256)
    assert_close(st.S, S, dtype=st.S.dtype, scale=_scale(S), ulps=256)
    assert st.offset == N


@pytest.mark.parametrize("name", NAMES)
def test_decoding_token_by_token_equals_one_call(backend, rng, name):
    """A prefill, then one token at a time with the carried state: the one call's outputs."""
    fam = BY_NAME[name]
    x = inputs(fam, rng, LEAD, 12, F, DV)
    cv = _conv(backend)
    whole = rotary.linear_attention(cv(x["q"]), cv(x["k"]), cv(x["v"]), chunk_size=4, **keywords(fam, x, cv))
    outs, st = [], None
    for lo, hi in [(0, 5), *((t, t + 1) for t in range(5, 12))]:
        piece = {
            n: (a[..., lo:hi, :] if a.ndim == len(LEAD) + 2 else a[..., lo:hi])
            for n, a in x.items()
            if n != "u"
        }
        if "u" in x:
            piece["u"] = x["u"]
        o, st = rotary.linear_attention(
            cv(piece["q"]),
            cv(piece["k"]),
            cv(piece["v"]),
            state=st,
            return_state=True,
            chunk_size=4,
            **keywords(fam, piece, cv),
        )
        outs.append(to_numpy(o))
    ref = to_numpy(whole)
    assert_close(
        backend.asarray(np.concatenate(outs, axis=-2), "float32"), ref, like=whole, scale=_scale(ref), ulps=64
    )
    assert st.offset == 12


@pytest.mark.parametrize("name", NAMES)
def test_grouped_heads_masks_documents_and_rope(backend, rng, name):
    """Everything at once: 4 query heads on 2 key heads, padding keys, three packed documents
    (segment ids), RoPE at the documents' own positions; against the recurrence."""
    fam = BY_NAME[name]
    n = 21
    x = inputs(fam, rng, (2,), n, F, DV)
    x["q"] = rng.normal(size=(4, n, F))
    cv = _conv(backend)
    seg = np.repeat([3, 1, 4], [5, 9, 7])
    runs = np.repeat([0, 1, 2], [5, 9, 7])
    mask = rng.random((2, n)) > 0.2
    pos = np.concatenate([np.arange(5), np.arange(9), np.arange(7)])
    rope = rotary.RoPE(F)
    out = rotary.linear_attention(
        cv(x["q"]),
        cv(x["k"]),
        cv(x["v"]),
        rope=rope,
        segment_ids=backend.asarray(seg, "int32"),
        key_mask=backend.asarray(mask, "bool"),
        chunk_size=8,
        **keywords(fam, x, cv),
    )
    xs = {nm: to_numpy(cv(a)).astype(np.float64) for nm, a in x.items()}
    ref, _ = recurrence(
        xs["q"], xs["k"], xs["v"], runs=runs, key_mask=mask, pos=pos, **oracle_keywords(fam, xs)
    )
    assert_close(out, ref, like=cv(x["q"]), scale=_scale(ref), ulps=256)


@pytest.mark.parametrize("name", NAMES)
def test_cu_seqlens_states_are_each_documents_own(backend, rng, name):
    """``cu_seqlens``: each document's output and final state are those of its own call."""
    fam = BY_NAME[name]
    if fam.rank == "dplr":
        pytest.skip("per-document states of a= and b= are refused (tested in test_refusals)")
    lens = [6, 1, 11]
    n = sum(lens)
    x = inputs(fam, rng, LEAD, n, F, DV)
    cv = _conv(backend)
    cu = np.concatenate([[0], np.cumsum(lens)])
    out, st = rotary.linear_attention(
        cv(x["q"]),
        cv(x["k"]),
        cv(x["v"]),
        cu_seqlens=cu.tolist(),
        return_state=True,
        chunk_size=4,
        **keywords(fam, x, cv),
    )
    xs = {nm: to_numpy(cv(a)).astype(np.float64) for nm, a in x.items()}
    for d, (lo, hi) in enumerate(itertools.pairwise(cu)):
        one = {
            nm: (a[..., lo:hi, :] if a.ndim == len(LEAD) + 2 else a[..., lo:hi])
            for nm, a in xs.items()
            if nm != "u"
        }
        if "u" in xs:
            one["u"] = xs["u"]
        ref, S = recurrence(one["q"], one["k"], one["v"], **oracle_keywords(fam, one))
        assert_close(to_numpy(out)[..., lo:hi, :], ref, dtype=np.float32, scale=_scale(ref), ulps=256)
        assert_close(to_numpy(st.S)[..., d, :, :], S, dtype=np.float32, scale=_scale(S), ulps=256)
    assert to_numpy(st.offset).tolist() == lens


@pytest.mark.parametrize("name", NAMES)
def test_bfloat16(backend, rng, name):
    if "bfloat16" not in backend.float_dtypes():
        pytest.skip(f"{backend.name} has no bfloat16")
    fam = BY_NAME[name]
    x = inputs(fam, rng, LEAD, 23, F, DV)
    cv = _conv(backend, "bfloat16")
    q = cv(x["q"])
    out = rotary.linear_attention(q, cv(x["k"]), cv(x["v"]), chunk_size=8, **keywords(fam, x, cv))
    assert out.dtype == q.dtype
    xs = {nm: to_numpy(cv(a)).astype(np.float64) for nm, a in x.items()}
    ref, _ = recurrence(xs["q"], xs["k"], xs["v"], **oracle_keywords(fam, xs))
    assert_close(out, ref, like=q, scale=_scale(ref), ulps=8)


@pytest.mark.parametrize("name", NAMES)
def test_gradients(rng, name):
    """Gradients of every differentiable input (q, k, v, gates, beta, u, a, b), checked against
    finite differences in float64."""
    torch = pytest.importorskip("torch")
    fam = BY_NAME[name]
    x = inputs(fam, rng, (1,), 9, 4, 3)
    names = list(x)
    tensors = [torch.tensor(x[n], dtype=torch.float64, requires_grad=True) for n in names]

    def fn(*ts):
        d = dict(zip(names, ts, strict=True))
        return rotary.linear_attention(d["q"], d["k"], d["v"], chunk_size=4, **keywords(fam, d, lambda t: t))

    assert torch.autograd.gradcheck(fn, tensors, eps=1e-6, atol=1e-5, fast_mode=True)


def test_delta_rule_states_combine_through_their_transition(backend, rng):
    """Block states of the delta rule carry the block's transition: ``a + b`` is the state of
    both blocks; a state returned by linear_attention (no transition) combines only as the earlier
    one, and is refused as the later one."""
    fam = BY_NAME["Kimi Delta Attention"]
    x = inputs(fam, rng, LEAD, 20, F, DV)
    cv = _conv(backend)
    kw = keywords(fam, x, cv)
    kw.pop("causal"), kw.pop("scale")

    def block(lo, hi):
        part = {nm: (a[..., lo:hi, :] if a.ndim == len(LEAD) + 2 else a[..., lo:hi]) for nm, a in x.items()}
        pkw = keywords(fam, part, cv)
        pkw.pop("causal"), pkw.pop("scale")
        return rotary.linear_attention_state(cv(part["k"]), cv(part["v"]), **pkw)

    whole = rotary.linear_attention_state(cv(x["k"]), cv(x["v"]), **kw)
    both = rotary.combine(block(0, 7), block(7, 20))
    assert_close(both.S, to_numpy(whole.S), dtype=whole.S.dtype, scale=_scale(to_numpy(whole.S)), ulps=256)
    _, st = rotary.linear_attention(
        cv(x["q"][..., :7, :]),
        cv(x["k"][..., :7, :]),
        cv(x["v"][..., :7, :]),
        return_state=True,
        **keywords(fam, {nm: (a[..., :7, :] if a.ndim == 3 else a[..., :7]) for nm, a in x.items()}, cv),
    )
    assert_close(
        (st + block(7, 20)).S,
        to_numpy(whole.S),
        dtype=whole.S.dtype,
        scale=_scale(to_numpy(whole.S)),
        ulps=256,
    )
    with pytest.raises(ValueError, match="combines only as the earlier state"):
        block(0, 7) + st


def test_per_feature_gates_combine(backend, rng):
    fam = BY_NAME["GLA (vector gates)"]
    x = inputs(fam, rng, LEAD, 20, F, DV)
    cv = _conv(backend)

    def st(lo, hi):
        return rotary.linear_attention_state(
            cv(x["k"][..., lo:hi, :]),
            cv(x["v"][..., lo:hi, :]),
            normalize=False,
            log_gate=cv(x["log_gate"][..., lo:hi, :]),
        )

    whole = st(0, 20)
    assert tuple(whole.log_decay.shape) == (*LEAD, F)
    assert_close(
        (st(0, 11) + st(11, 20)).S,
        to_numpy(whole.S),
        dtype=whole.S.dtype,
        scale=_scale(to_numpy(whole.S)),
        ulps=64,
    )


def test_refusals():
    rng = np.random.default_rng(0)
    q = k = rng.normal(size=(2, 6, 4)).astype(np.float32)
    v = rng.normal(size=(2, 6, 3)).astype(np.float32)
    beta = np.full((2, 6), 0.5, dtype=np.float32)
    with pytest.raises(ValueError, match="pass normalize=False"):
        rotary.linear_attention(q, k, v, causal=True, beta=beta)
    with pytest.raises(ValueError, match="pass causal=True"):
        rotary.linear_attention(q, k, v, normalize=False, beta=beta)
    with pytest.raises(ValueError, match="a= and b= come together"):
        rotary.linear_attention(q, k, v, causal=True, normalize=False, a=q)
    with pytest.raises(ValueError, match="not both"):
        rotary.linear_attention(q, k, v, causal=True, normalize=False, a=q, b=q, beta=beta)
    with pytest.raises(ValueError, match=r"bonus.*without beta"):
        rotary.linear_attention(
            q, k, v, causal=True, normalize=False, beta=beta, u=np.ones((2, 4), np.float32)
        )
    with pytest.raises(ValueError, match=r"beta of shape \(2, 5\) does not broadcast"):
        rotary.linear_attention(q, k, v, causal=True, normalize=False, beta=beta[:, :5])
    with pytest.raises(ValueError, match=r"log_gate of shape .* per token and key feature"):
        rotary.linear_attention(
            q, k, v, causal=True, normalize=False, log_gate=np.zeros((2, 6, 3), np.float32)
        )
    with pytest.raises(ValueError, match="beta must be finite"):
        rotary.linear_attention(q, k, v, causal=True, normalize=False, beta=beta * np.nan)
    fam = BY_NAME["RWKV-7"]
    x = inputs(fam, rng, (2,), 6, 4, 3)
    with pytest.raises(ValueError, match="not served for a= and b= yet"):
        rotary.linear_attention(
            x["q"], x["k"], x["v"], cu_seqlens=[0, 3, 6], return_state=True, **keywords(fam, x, np.asarray)
        )


@pytest.mark.parametrize("name", NAMES)
def test_a_state_per_document_enters_its_own_document(backend, rng, name):
    """``cu_seqlens`` with ``state=``: each document continues from its own state (documents of
    every length, an empty one among them, several inside one chunk); outputs and final states
    are each document's own call's."""
    fam = BY_NAME[name]
    lens = [5, 1, 13, 0, 9]
    cu = np.concatenate([[0], np.cumsum(lens)])
    x = inputs(fam, rng, LEAD, int(cu[-1]), F, DV)
    S0 = rng.normal(size=(*LEAD, len(lens), F, DV))
    cv = _conv(backend)
    kw = keywords(fam, x, cv)
    per_doc_states = fam.rank != "dplr"
    res = rotary.linear_attention(
        cv(x["q"]),
        cv(x["k"]),
        cv(x["v"]),
        cu_seqlens=cu.tolist(),
        chunk_size=8,
        return_state=per_doc_states,
        state=rotary.LinearAttentionState(cv(S0), None, 0),
        **kw,
    )
    out, st = res if per_doc_states else (res, None)
    xs = {nm: to_numpy(cv(a)).astype(np.float64) for nm, a in x.items()}
    S0n = to_numpy(cv(S0)).astype(np.float64)
    for d, (lo, hi) in enumerate(itertools.pairwise(cu)):
        one = {
            nm: (a[..., lo:hi, :] if a.ndim == len(LEAD) + 2 else a[..., lo:hi])
            for nm, a in xs.items()
            if nm != "u"
        }
        one.update({"u": xs["u"]} if "u" in xs else {})
        ref, S = recurrence(one["q"], one["k"], one["v"], S0=S0n[..., d, :, :], **oracle_keywords(fam, one))
        assert_close(to_numpy(out)[..., lo:hi, :], ref, dtype=np.float32, scale=_scale(ref), ulps=256)
        if st is not None:
            assert_close(to_numpy(st.S)[..., d, :, :], S, dtype=np.float32, scale=_scale(S), ulps=256)


def test_based_taylor_map_is_judged_by_its_kernel(backend, rng):
    """Based's Taylor map ``[1, x, x (x) x / sqrt 2]`` has negative features but a positive kernel
    ``1 + s + s^2 / 2``: accepted with ``similarity="dot"`` and equal to the quadratic form."""

    def taylor(x):
        xp = array_api_compat.array_namespace(x)
        outer = x[..., :, None] * x[..., None, :]
        flat = xp.reshape(outer, (*outer.shape[:-2], outer.shape[-1] * outer.shape[-2]))
        return xp.concat([xp.ones_like(x[..., :1]), x, flat / 2**0.5], axis=-1)

    if backend.lazy or not backend.host_values:
        pytest.skip("the user map is called on concrete arrays here")
    d = 4
    q, k, v = (rng.normal(size=(2, 13, d)) * 0.5 for _ in range(3))
    cv = _conv(backend)
    out = rotary.linear_attention(cv(q), cv(k), cv(v), causal=True, feature_map=taylor, chunk_size=4)
    qs, ks, vs = (to_numpy(cv(a)).astype(np.float64) for a in (q, k, v))
    s = qs @ np.swapaxes(ks, -1, -2)
    w = (1 + s + s * s / 2) * np.tril(np.ones((13, 13)))
    ref = (w @ vs) / w.sum(-1, keepdims=True)
    assert_close(out, ref, like=cv(q), scale=_scale(ref), ulps=256)


def test_unequal_gates_within_a_rotation_pair_break_relative_positions(rng):
    """RoPE's relative identity holds with per-feature gates equal within each rotation pair, and
    breaks where they differ: shifting every position changes the output."""
    n, d = 10, 8
    q, k, v = (rng.normal(size=(1, n, d)) for _ in range(3))
    per_pair = np.repeat(np.log(rng.uniform(0.5, 1, size=(1, n, d // 2))), 2, axis=-1)
    rope = rotary.RoPE(d, layout="interleaved")  # (pairs of neighbouring features)

    def run(g, shift):
        return rotary.linear_attention(
            q, k, v, np.arange(n) + shift, rope=rope, causal=True, normalize=False, log_gate=g
        )

    assert_close(run(per_pair, 100), run(per_pair, 0), dtype=np.float64, ulps=1e6)
    unequal = np.log(rng.uniform(0.5, 1, size=(1, n, d)))
    assert np.abs(run(unequal, 100) - run(unequal, 0)).max() > 1e-3


def test_transformers_gated_delta_rule_and_kda(rng):
    """transformers' own functions (their torch reference code) as a second oracle."""
    torch = pytest.importorskip("torch")
    qn = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")
    kl = pytest.importorskip("transformers.models.kimi_linear.modeling_kimi_linear")
    g = torch.Generator().manual_seed(0)
    B, n, H, d = 1, 100, 2, 16
    q, k, v = (torch.randn(B, n, H, d, generator=g) for _ in range(3))
    beta = torch.rand(B, n, H, generator=g)
    gate = -torch.rand(B, n, H, generator=g)
    gk = -torch.rand(B, n, H, d, generator=g)
    S0 = torch.randn(B, H, d, d, generator=g) * 0.1
    t = lambda x: x.transpose(1, 2)  # noqa: E731
    for ref_fn, lg in ((qn.torch_chunk_gated_delta_rule, gate), (kl.chunk_kimi_delta_attention, gk)):
        ref, Sref = ref_fn(
            q, k, v, g=lg, beta=beta, initial_state=S0, output_final_state=True, use_qk_l2norm_in_kernel=True
        )
        out, st = rotary.linear_attention(
            t(q),
            t(k),
            t(v),
            causal=True,
            normalize=False,
            log_gate=t(lg),
            beta=t(beta),
            qk_l2norm=True,
            scale=d**-0.5,
            state=rotary.LinearAttentionState(S0, None, 0),
            return_state=True,
        )
        assert_close(t(out), ref.numpy(), like=q, scale=float(ref.abs().max()), ulps=64)
        assert_close(st.S, Sref.numpy(), like=q, scale=float(Sref.abs().max()), ulps=64)


def test_family_table_is_generated():
    """docs/guides/linear_families.rst is the catalogue's own table."""
    import pathlib

    page = pathlib.Path(__file__).parent.parent / "docs" / "guides" / "linear_families.rst"
    assert page.read_text(encoding="utf-8") == rst(), (
        "regenerate: python tests/linear_families.py --rst " + str(page)
    )


@pytest.mark.parametrize("name", ["Gated DeltaNet", "Kimi Delta Attention"])
def test_grouped_value_heads(backend, rng, name):
    """Qwen3-Next's layout: more value heads than query and key heads.  q and k ``(B, Hk, 1, N,
    d)``, values, gates and beta one per value head ``(B, Hk, Hv / Hk, N, .)``: the leading axes
    broadcast, no copy of q and k; the same as q and k repeated per value head."""
    fam = BY_NAME[name]
    x = inputs(fam, rng, (2, 3), 11, F, DV)  # (key heads, value heads per key head)
    x["q"], x["k"] = x["q"][:, :1], x["k"][:, :1]
    cv = _conv(backend)
    out = rotary.linear_attention(cv(x["q"]), cv(x["k"]), cv(x["v"]), chunk_size=4, **keywords(fam, x, cv))
    xs = {nm: to_numpy(cv(a)).astype(np.float64) for nm, a in x.items()}
    rep = {**xs, "q": np.repeat(xs["q"], 3, axis=1), "k": np.repeat(xs["k"], 3, axis=1)}
    ref, _ = recurrence(rep["q"], rep["k"], rep["v"], **oracle_keywords(fam, rep))
    assert_close(out, ref, like=cv(x["q"]), scale=_scale(ref), ulps=256)
