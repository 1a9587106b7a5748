"""Linear attention with decay, gates and ``normalize=False`` against a quadratic float64 form.

The oracle is written here, independent of rotary's chunked algorithm: the masked ``N x N``
weights ``w_ij = exp(L_i - L_j)`` (``L`` the cumulative log-gates, ``|.|`` both ways for
non-causal), RoPE in the numerator only.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rotary
from rotary.testing import assert_close, to_numpy
from rotary.testing.reference import rotate as rotate_ref

DECAY = np.array([0.9, 0.5, 0.99])  # one per head (RetNet's gammas are of this kind)


def _phi(x):
    return np.where(x > 0, x + 1.0, np.exp(np.minimum(x, 0.0)))


def oracle(q, k, v, pos, *, causal, log_gates=None, normalize=True, state=None):
    """``(out, scale)``: the quadratic masked form in float64.  ``log_gates`` ``(..., N)``;
    ``state`` ``(S, z)`` of earlier keys, decayed up to the first token."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    n = q.shape[-2]
    fq, fk = (_phi(q), _phi(k)) if normalize else (q, k)
    a, b = (fq, fk) if pos is None else (rotate_ref(fq, pos), rotate_ref(fk, pos))
    num = a @ np.swapaxes(b, -1, -2)
    den = fq @ np.swapaxes(fk, -1, -2)
    L = np.zeros(n) if log_gates is None else np.cumsum(log_gates, axis=-1)
    w = np.exp(-np.abs(L[..., :, None] - L[..., None, :]))
    if causal:
        w = w * np.tril(np.ones((n, n)))
    num, den = num * w, den * w
    out_num = num @ v
    out_den = den.sum(-1)
    absnum = np.abs(num) @ np.abs(v)
    if state is not None:
        S0, z0 = state
        into = np.exp(L)[..., None]  # the state decays from before token 0 up to token i
        out_num = out_num + into * (a @ S0)
        absnum = absnum + into * (np.abs(a) @ np.abs(S0))
        if normalize:
            out_den = out_den + into[..., 0] * (fq @ z0[..., None])[..., 0]
    if not normalize:
        return out_num, np.maximum(1.0, absnum)
    d = out_den[..., None]
    return out_num / d, np.maximum(1.0, absnum / d)


def _inputs(backend, rng, shape=(2, 3, 23, 8), dv=5, dtype="float32"):
    *lead, n, _d = shape
    xs = [rng.normal(size=shape), rng.normal(size=shape), rng.normal(size=(*lead, n, dv))]
    xb = [backend.asarray(x, dtype) for x in xs]
    return xb, [to_numpy(x).astype(np.float64) for x in xb]


def _int(backend):
    return "int64" if backend.float64 else "int32"


def _gates(kind, rng, shape, backend, dtype):
    """``(decay, log_gate)`` for rotary and the oracle's per-token log-gates."""
    lead, n = shape[:-2], shape[-2]
    decay = backend.asarray(DECAY, dtype) if kind in ("decay", "both") else None
    lg = None
    g = np.zeros((*lead, n))
    if decay is not None:
        g = g + np.log(to_numpy(decay).astype(np.float64))[:, None]
    if kind in ("gate", "both"):
        lg = backend.asarray(np.log(rng.uniform(0.3, 1.0, size=(*lead, n))), dtype)
        g = g + to_numpy(lg).astype(np.float64)
    return decay, lg, g


@pytest.mark.parametrize("kind", ["decay", "gate", "both"])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("normalize", [True, False])
def test_decay_and_gates_match_the_quadratic_form(backend, rng, kind, causal, normalize):
    (q, k, v), (qn, kn, vn) = _inputs(backend, rng)
    decay, lg, g = _gates(kind, rng, (2, 3, 23, 8), backend, "float32")
    pos = np.arange(23) + 5
    out = rotary.linear_attention(
        q,
        k,
        v,
        backend.asarray(pos, _int(backend)),
        causal=causal,
        chunk_size=4,
        decay=decay,
        log_gate=lg,
        normalize=normalize,
    )
    ref, scale = oracle(qn, kn, vn, pos, causal=causal, log_gates=g, normalize=normalize)
    assert_close(out, ref, like=q, scale=scale, ulps=64)


@pytest.mark.parametrize("causal", [True, False])
def test_bfloat16_with_gates(backend, rng, causal):
    if "bfloat16" not in backend.float_dtypes():
        pytest.skip(f"{backend.name} has no bfloat16")
    (q, k, v), (qn, kn, vn) = _inputs(backend, rng, dtype="bfloat16")
    decay, lg, g = _gates("both", rng, (2, 3, 23, 8), backend, "bfloat16")
    pos = np.arange(23)
    out = rotary.linear_attention(
        q, k, v, backend.asarray(pos, _int(backend)), causal=causal, decay=decay, log_gate=lg
    )
    assert out.dtype == q.dtype
    ref, scale = oracle(qn, kn, vn, pos, causal=causal, log_gates=g)
    assert_close(out, ref, like=q, scale=scale, ulps=4)


@pytest.mark.parametrize("normalize", [True, False])
def test_decoding_states_and_combine_with_gates(backend, rng, normalize):
    """Token by token and piece by piece with states equals one call; states of consecutive
    pieces combine in order (``earlier + later``); the oracle sees the state as earlier keys."""
    shape = (2, 3, 19, 8)
    (q, k, v), (qn, kn, vn) = _inputs(backend, rng, shape=shape)
    decay, lg, g = _gates("both", rng, shape, backend, "float32")
    pos = backend.asarray(np.arange(19), _int(backend))
    kw = {"decay": decay, "normalize": normalize}
    whole, st_whole = rotary.linear_attention(q, k, v, pos, causal=True, log_gate=lg, return_state=True, **kw)
    ref, scale = oracle(qn, kn, vn, np.arange(19), causal=True, log_gates=g, normalize=normalize)
    assert_close(whole, ref, like=q, scale=scale, ulps=64)
    # pieces of 7, 1 and 11 tokens carrying the state
    outs, state = [], None
    for lo, hi in ((0, 7), (7, 8), (8, 19)):
        o, state = rotary.linear_attention(
            q[..., lo:hi, :],
            k[..., lo:hi, :],
            v[..., lo:hi, :],
            pos[lo:hi],
            causal=True,
            log_gate=lg[..., lo:hi],
            state=state,
            return_state=True,
            **kw,
        )
        outs.append(to_numpy(o))
    assert_close(np.concatenate(outs, axis=-2), to_numpy(whole), dtype="float32", scale=scale, ulps=64)
    assert state.offset == 19
    assert_close(
        state.S, to_numpy(st_whole.S), dtype="float32", ulps=64, scale=np.abs(to_numpy(st_whole.S)) + 1
    )
    # the states of the pieces, combined in order, are the state of the whole
    parts = [
        rotary.linear_attention_state(
            k[..., lo:hi, :], v[..., lo:hi, :], pos[lo:hi], log_gate=lg[..., lo:hi], **kw
        )
        for lo, hi in ((0, 7), (7, 8), (8, 19))
    ]
    total = rotary.combine(*parts)
    assert_close(
        total.S, to_numpy(st_whole.S), dtype="float32", ulps=64, scale=np.abs(to_numpy(st_whole.S)) + 1
    )
    assert_close(total.log_decay, to_numpy(st_whole.log_decay), dtype="float32", ulps=64, scale=19.0)
    if normalize:
        assert_close(
            total.z, to_numpy(st_whole.z), dtype="float32", ulps=64, scale=np.abs(to_numpy(st_whole.z)) + 1
        )
    else:
        assert total.z is None and st_whole.z is None
    # the oracle: the first piece's state as earlier keys of the rest
    S0, z0 = (
        (to_numpy(t).astype(np.float64) for t in (parts[0].S, parts[0].z))
        if normalize
        else (to_numpy(parts[0].S).astype(np.float64), None)
    )
    rest, rscale = oracle(
        qn[..., 7:, :],
        kn[..., 7:, :],
        vn[..., 7:, :],
        np.arange(7, 19),
        causal=True,
        log_gates=g[..., 7:],
        normalize=normalize,
        state=(S0, z0),
    )
    o = rotary.linear_attention(
        q[..., 7:, :],
        k[..., 7:, :],
        v[..., 7:, :],
        pos[7:],
        causal=True,
        log_gate=lg[..., 7:],
        state=parts[0],
        **kw,
    )
    assert_close(o, rest, like=q, scale=rscale, ulps=64)


def test_torch_gradients_of_data_and_gates(rng):
    """Gradients of q, k, v, the decay and the log-gates equal those of the quadratic form."""
    torch = pytest.importorskip("torch")
    n = 13
    xs = [torch.tensor(rng.normal(size=(2, n, 6)), dtype=torch.float64, requires_grad=True) for _ in range(3)]
    decay = torch.tensor([0.8, 0.95], dtype=torch.float64, requires_grad=True)
    lg = torch.tensor(np.log(rng.uniform(0.3, 1, size=(2, n))), dtype=torch.float64, requires_grad=True)
    pos = torch.arange(n)
    w = torch.tensor(rng.normal(size=(2, n, 6)), dtype=torch.float64)

    def naive(q, k, v, decay, lg, causal):
        fq = torch.where(q > 0, q + 1, torch.exp(torch.clamp(q, max=0)))
        fk = torch.where(k > 0, k + 1, torch.exp(torch.clamp(k, max=0)))
        a, b = rotary.rotate(fq, pos), rotary.rotate(fk, pos)
        L = torch.cumsum(torch.log(decay)[:, None] + lg, -1)
        W = torch.exp(-(L[..., :, None] - L[..., None, :]).abs())
        if causal:
            W = W * torch.tril(torch.ones(n, n, dtype=W.dtype))
        num, den = (a @ b.mT) * W, (fq @ fk.mT) * W
        return (num @ v) / den.sum(-1, keepdim=True)

    for causal in (True, False):
        args = (*xs, decay, lg)
        out = rotary.linear_attention(*xs, pos, causal=causal, chunk_size=4, decay=decay, log_gate=lg)
        ga = torch.autograd.grad((out * w).sum(), args)
        gb = torch.autograd.grad((naive(*args, causal) * w).sum(), args)
        for a, b in zip(ga, gb, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)


def test_jax_gradients_and_jit_of_gates(rng):
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    n = 13
    dt = jnp.float64 if jax.config.jax_enable_x64 else jnp.float32
    tol = 1e-9 if dt == jnp.float64 else 3e-4
    q, k, v = (jnp.asarray(rng.normal(size=(2, n, 6)), dtype=dt) for _ in range(3))
    lg = jnp.asarray(np.log(rng.uniform(0.3, 1, size=(2, n))), dtype=dt)
    pos = jnp.arange(n)

    def ours(q, k, v, lg):
        return rotary.linear_attention(q, k, v, pos, causal=True, chunk_size=4, log_gate=lg, decay=0.9)

    def naive(q, k, v, lg):
        fq, fk = jax.nn.elu(q) + 1, jax.nn.elu(k) + 1
        a, b = rotary.rotate(fq, pos), rotary.rotate(fk, pos)
        L = jnp.cumsum(jnp.log(0.9) + lg, -1)
        W = jnp.exp(-jnp.abs(L[..., :, None] - L[..., None, :])) * jnp.tril(jnp.ones((n, n), dt))
        num, den = (a @ jnp.swapaxes(b, -1, -2)) * W, (fq @ jnp.swapaxes(fk, -1, -2)) * W
        return (num @ v) / den.sum(-1, keepdims=True)

    np.testing.assert_allclose(jax.jit(ours)(q, k, v, lg), naive(q, k, v, lg), rtol=tol, atol=tol)
    ga = jax.grad(lambda *a: jnp.sum(ours(*a) ** 2), argnums=(0, 1, 2, 3))(q, k, v, lg)
    gb = jax.grad(lambda *a: jnp.sum(naive(*a) ** 2), argnums=(0, 1, 2, 3))(q, k, v, lg)
    for a, b in zip(ga, gb, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=10 * tol, atol=10 * tol)


def test_python_decay_and_gates_under_torch_compile_fullgraph(rng):
    """Issue 50, finding 4: ``decay=0.9`` (a Python float, as documented) failed under
    ``torch.compile(fullgraph=True)``: its range check branched on NumPy values, which Dynamo
    traces as tensors.  Python values are checked as Python values: the decay an argument of
    the compiled function, the gates a nested Python list."""
    torch = pytest.importorskip("torch")
    q, k, v = (torch.from_numpy(rng.normal(size=(2, 3, 8, 6)).astype(np.float32)) for _ in range(3))
    lg = [[[-0.1 * (i + 1)] * 8 for i in range(3)]] * 2

    def f(q, k, v, d):
        return rotary.linear_attention(q, k, v, None, causal=True, decay=d, log_gate=lg)

    got = torch.compile(f, fullgraph=True, backend="eager")(q, k, v, 0.9)
    assert_close(got, f(q, k, v, 0.9), like=q, ulps=16)


def test_long_strong_decay_is_stable(backend):
    """4096 tokens of strong decay (log-gate -5 per token): no overflow, no NaN, the output is
    the last few tokens' (the decays are formed from sums of the gates in between)."""
    rng = np.random.default_rng(3)
    n = 4096
    (q, k, v), (qn, kn, vn) = _inputs(backend, rng, shape=(1, n, 4), dv=2)
    lg = backend.asarray(np.full((1, n), -5.0), "float32")
    out = to_numpy(rotary.linear_attention(q, k, v, None, causal=True, log_gate=lg))
    assert np.isfinite(out).all()
    # with exp(-5) per step, a query sees its own key and (1e-2 of) the previous ones
    tail, scale = oracle(
        qn[:, -40:], kn[:, -40:], vn[:, -40:], None, causal=True, log_gates=np.full((1, 40), -5.0)
    )
    assert_close(out[:, -20:], tail[:, -20:], dtype="float32", scale=scale[:, -20:], ulps=64)


def test_gate_errors(backend, rng):
    (q, k, v), _ = _inputs(backend, rng, shape=(2, 3, 6, 8), dv=3)
    la = rotary.linear_attention
    with pytest.raises(ValueError, match=r"decay must lie in \(0, 1\]"):
        la(q, k, v, None, causal=True, decay=1.5)
    with pytest.raises(ValueError, match=r"decay must lie in \(0, 1\]"):
        la(q, k, v, None, causal=True, decay=0.0)
    with pytest.raises(ValueError, match="decay of shape"):
        la(q, k, v, None, causal=True, decay=backend.asarray(np.full(4, 0.9), "float32"))
    if backend.host_values:
        with pytest.raises(ValueError, match="log_gate must be <= 0"):
            la(q, k, v, None, causal=True, log_gate=backend.asarray(np.full((2, 3, 6), 0.1), "float32"))
        with pytest.raises(ValueError, match="document boundary"):
            la(q, k, v, None, causal=True, log_gate=backend.asarray(np.full((2, 3, 6), -np.inf), "float32"))
    with pytest.raises(ValueError, match="log_gate of shape"):
        la(q, k, v, None, causal=True, log_gate=backend.asarray(np.zeros((2, 3, 5)), "float32"))
    # Python values, checked as Python values (issue 50): per head, nested, any bad one named
    with pytest.raises(ValueError, match=r"decay must lie in \(0, 1\].*got 0.0"):
        la(q, k, v, None, causal=True, decay=[0.9, 0.0, 0.5])
    with pytest.raises(ValueError, match=r"decay must lie in \(0, 1\].*got nan"):
        la(q, k, v, None, causal=True, decay=float("nan"))
    with pytest.raises(ValueError, match=r"log_gate must be <= 0 and finite.*got 0\.1"):
        la(q, k, v, None, causal=True, log_gate=[[[-0.1] * 5 + [0.1]] * 3] * 2)
    with pytest.raises(ValueError, match="document boundary"):
        la(q, k, v, None, causal=True, log_gate=[[[-0.1] * 5 + [-np.inf]] * 3] * 2)
    with pytest.raises(TypeError, match="decay must hold numbers, got a str"):
        la(q, k, v, None, causal=True, decay=[0.9, "0.5", 0.9])
    with pytest.raises(ValueError, match="one sequence"):
        la(
            q,
            k,
            v,
            backend.asarray(np.arange(6), _int(backend)),
            k_pos=backend.asarray(np.arange(6), _int(backend)),
            decay=0.9,
        )
    with pytest.raises(ValueError, match="feature_map='identity'"):
        la(q, k, v, None, feature_map="identity")
    la(q, k, v, None, feature_map="identity", normalize=False)  # no denominator: any sign is fine
    st_ = rotary.linear_attention_state(k, v, None, normalize=False)
    assert st_.z is None
    with pytest.raises(ValueError, match="normalize=False state"):
        la(q, k, v, None, causal=True, state=st_)
    with pytest.raises(ValueError, match="cannot combine a normalised state"):
        _ = st_ + rotary.linear_attention_state(k, v, None)


@pytest.mark.parametrize("kind", ["log_gate", "decay"])
def test_decoding_steps_refuse_bad_gates_on_every_step(backend, rng, kind):
    """A decoding step of a recurrent family (the delta rule) checks its gate's and beta's values
    on every call, the memoised shortcut included: a good step, then NaN, values out of range on
    either side and a good one again, each on the same signature (where values can be read;
    JAX's eager calls included, whose beta was unchecked)."""
    if not backend.host_values:
        pytest.skip(f"{backend.name}: values are not read (as under a trace)")
    (q, k, v), _ = _inputs(backend, rng, shape=(1, 2, 1, 4), dv=4)
    S = backend.asarray(rng.normal(size=(1, 2, 4, 4)) * 0.1, "float32")
    state = rotary.LinearAttentionState(S, None, 0)
    good, above, below = (0.9, 1.5, 0.0) if kind == "decay" else (-0.1, 0.1, -np.inf)
    shape = (1, 2) if kind == "decay" else (1, 2, 1)

    def step(value, b=0.5):
        g = backend.asarray(np.full(shape, value), "float32")
        beta = backend.asarray(np.full((1, 2, 1), b), "float32")
        return rotary.linear_attention(
            q, k, v, causal=True, normalize=False, beta=beta, state=state, return_state=True, **{kind: g}
        )

    first = step(good)
    step(good)  # (the shortcut is taken from the second call of a signature on)
    msg = (
        r"decay must lie in \(0, 1\]" if kind == "decay" else "log_gate must be <= 0|log_gate must be finite"
    )
    for bad in (np.nan, above, below, np.nan):
        with pytest.raises(ValueError, match=msg):
            step(bad)
    for bad in (np.nan, np.inf, -np.inf):  # (and beta's, on the same signature)
        with pytest.raises(ValueError, match="beta must be finite"):
            step(good, bad)
    again = step(good)
    assert_close(again[0], first[0], dtype="float32")


@settings(max_examples=15, deadline=None)
@given(
    cuts=st.lists(st.integers(1, 9), min_size=1, max_size=4),
    chunk=st.integers(1, 6),
    gamma=st.floats(0.2, 1.0),
)
def test_gated_pieces_property(cuts, chunk, gamma):
    """Any cut of the sequence into pieces, any chunk size: the same outputs as one call."""
    rng = np.random.default_rng(len(cuts) * 31 + chunk)
    n = sum(cuts)
    q, k, v = (rng.normal(size=(2, n, 4)) for _ in range(3))
    lg = np.log(rng.uniform(0.2, 1.0, size=(2, n)))
    whole = rotary.linear_attention(
        q, k, v, np.arange(n), causal=True, decay=gamma, log_gate=lg, chunk_size=chunk
    )
    outs, state, lo = [], None, 0
    for c in cuts:
        hi = lo + c
        o, state = rotary.linear_attention(
            q[:, lo:hi],
            k[:, lo:hi],
            v[:, lo:hi],
            np.arange(lo, hi),
            causal=True,
            decay=gamma,
            log_gate=lg[:, lo:hi],
            chunk_size=chunk,
            state=state,
            return_state=True,
        )
        outs.append(o)
        lo = hi
    np.testing.assert_allclose(np.concatenate(outs, axis=-2), whole, rtol=1e-10, atol=1e-10)
