"""Dask graphs (lazy, chunk-preserving, on a real LocalCluster) and sharded JAX (8 CPU devices)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rotary
from rotary.testing import assert_close, eps
from rotary.testing.reference import rotate as rotate_ref

ROOT = Path(__file__).resolve().parents[1]


# -- float64 references -----------------------------------------------------------------
def _elu1(x):
    return np.where(x > 0, x + 1.0, np.exp(np.minimum(x, 0.0)))


def linear_attention_ref(q, k, v, pos, *, causal, layout="half", key_mask=None, eps=1e-6):
    """Quadratic float64 form of paper eq. 19: RoPE on the features, numerator only."""
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    a, b = _elu1(q), _elu1(k)
    if key_mask is not None:
        b = b * np.broadcast_to(key_mask, b.shape[:-1])[..., None]
    ar, br = rotate_ref(a, pos, layout=layout), rotate_ref(b, pos, layout=layout)
    num_w = ar @ np.swapaxes(br, -1, -2)
    den_w = a @ np.swapaxes(b, -1, -2)
    if causal:
        tri = np.tril(np.ones((q.shape[-2], k.shape[-2]), dtype=bool))
        num_w, den_w = num_w * tri, den_w * tri
    return (num_w @ v) / np.maximum(den_w.sum(-1), eps)[..., None]


class _CountComputes:
    """A Dask callback counting graph executions (none may happen while building)."""

    def __init__(self):
        import dask

        self.count = 0
        outer = self

        class _CB(dask.callbacks.Callback):
            def _start(self, dsk):
                outer.count += 1

        self.cb = _CB()

    def __enter__(self):
        self.cb.__enter__()
        return self

    def __exit__(self, *exc):
        self.cb.__exit__(*exc)


def _qkv(rng, shape=(2, 3, 24, 8), dv=6, dtype=np.float64):
    q, k = (rng.normal(size=shape).astype(dtype) for _ in range(2))
    v = rng.normal(size=(*shape[:-1], dv)).astype(dtype)
    return q, k, v


# -- Dask: RoPE entry points -----------------------------------------------------------------
@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_dask_apply_rotate_lazy_keep_chunks(rng, layout, dtype):
    da = pytest.importorskip("dask.array")
    x = rng.normal(size=(4, 3, 12, 16)).astype(dtype)
    k = rng.normal(size=(4, 1, 12, 16)).astype(dtype)  # one kv head (grouped-query)
    dx = da.from_array(x, chunks=(1, 3, 5, 16))
    dk = da.from_array(k, chunks=(2, 1, 12, 16))
    pos = da.arange(12, chunks=7)  # chunked differently from x: the positions are split, never x
    with _CountComputes() as c:
        qr, kr = rotary.apply(dx, dk, pos, layout=layout)
        xr = rotary.rotate(dx, pos, layout=layout)
        back = rotary.convert_layout(dx, layout, "half" if layout == "interleaved" else "interleaved")
    assert c.count == 0, "building the graph ran a compute"
    assert qr.chunks == xr.chunks == back.chunks == dx.chunks
    assert kr.chunks == dk.chunks
    assert_close(qr, rotate_ref(x, np.arange(12), layout=layout), dtype=dtype)
    assert_close(kr, rotate_ref(k, np.arange(12), layout=layout), dtype=dtype)
    assert_close(xr, rotate_ref(x, np.arange(12), layout=layout), dtype=dtype)
    other = "half" if layout == "interleaved" else "interleaved"
    np.testing.assert_array_equal(back.compute(), rotary.convert_layout(x, layout, other))


def test_dask_rotate_one_task_per_block(rng):
    da = pytest.importorskip("dask.array")
    dx = da.from_array(rng.normal(size=(4, 2, 8, 8)), chunks=(1, 2, 4, 8))
    out = rotary.rotate(dx, list(range(8)))
    graph = dict(out.__dask_graph__())
    n_out = sum(1 for key in graph if isinstance(key, tuple) and key[0] == out.name)
    assert n_out == dx.npartitions == 8
    # the input's tasks, the positions' and the output's: no per-feature slicing/concatenation
    assert len(graph) <= 2 * dx.npartitions + 8


def test_dask_feature_axis_chunked_gives_right_answers(rng):
    da = pytest.importorskip("dask.array")
    q, k, v = _qkv(rng, shape=(2, 2, 12, 8))
    pos = np.arange(12)
    split = dict(chunks=(1, 2, 6, 3))  # head dim 8 in chunks of 3, 3, 2: cuts pairs apart
    dq, dk = (da.from_array(a, **split) for a in (q, k))
    dv = da.from_array(v, chunks=(1, 2, 6, 4))
    for layout in ("half", "interleaved"):
        qr, kr = rotary.apply(dq, dk, da.from_array(pos), layout=layout)
        assert qr.chunks[:-1] == dq.chunks[:-1]
        assert_close(qr, rotate_ref(q, pos, layout=layout), dtype="float64")
        assert_close(kr, rotate_ref(k, pos, layout=layout), dtype="float64")
    for causal in (False, True):
        out = rotary.linear_attention(dq, dk, dv, da.from_array(pos), causal=causal)
        assert out.chunks[:-1] == dq.chunks[:-1]
        assert_close(out, linear_attention_ref(q, k, v, pos, causal=causal), dtype="float64", ulps=64)


def test_dask_convert_layout_weights_keep_head_blocks(rng):
    da = pytest.importorskip("dask.array")
    w = rng.normal(size=(64, 5))  # (out, in): 4 heads of 16
    expected = rotary.convert_layout(w, "interleaved", "half", axis=0, head_dim=16, rotary_dim=8)
    dw = da.from_array(w, chunks=(32, 5))
    out = rotary.convert_layout(dw, "interleaved", "half", axis=0, head_dim=16, rotary_dim=8)
    assert out.chunks == dw.chunks
    np.testing.assert_array_equal(out.compute(), expected)
    cut = da.from_array(w, chunks=(24, 5))  # boundaries inside heads: re-chunked to whole heads
    out = rotary.convert_layout(cut, "interleaved", "half", axis=0, head_dim=16, rotary_dim=8)
    assert all(c % 16 == 0 for c in out.chunks[0])
    np.testing.assert_array_equal(out.compute(), expected)


# -- Dask: linear attention ----------------------------------------------------------------
@pytest.mark.parametrize("causal", [False, True])
def test_dask_linear_attention_lazy_chunks_and_state(rng, causal):
    da = pytest.importorskip("dask.array")
    q, k, v = _qkv(rng)
    pos = np.arange(24)
    dq, dk, dv = (da.from_array(a, chunks=(1, 3, 7, a.shape[-1])) for a in (q, k, v))
    with _CountComputes() as c:
        out, st = rotary.linear_attention(
            dq, dk, dv, da.arange(24, chunks=5), causal=causal, return_state=True
        )
    assert c.count == 0, "building the graph ran a compute"
    assert out.chunks == (*dq.chunks[:-1], (6,))
    assert_close(out, linear_attention_ref(q, k, v, pos, causal=causal), dtype="float64", ulps=64)
    ref_state = rotary.linear_attention_state(k, v, pos)
    assert st.offset == 24
    assert_close(st.S, ref_state.S, dtype="float64", ulps=64)
    assert_close(st.z, ref_state.z, dtype="float64", ulps=64)


def test_dask_causal_is_a_scan_over_block_states(rng):
    """No task ever holds the whole sequence: per-block states, a scan, local attention."""
    da = pytest.importorskip("dask.array")
    import dask

    q, k, v = _qkv(rng, shape=(1, 2, 64, 8), dv=8)
    dq, dk, dv = (da.from_array(a, chunks=(1, 2, 16, 8)) for a in (q, k, v))
    out = rotary.linear_attention(dq, dk, dv, da.arange(64, chunks=16), causal=True, chunk_size=8)
    layers = "".join(out.__dask_graph__().layers)
    assert "cumsum" in layers, "the block states are not prefix-summed"
    sizes = []

    class Sizes(dask.callbacks.Callback):
        def _posttask(self, key, result, dsk, state, worker_id):
            name = key[0] if isinstance(key, tuple) else key
            # skip the NumPy source (from_array) and the final gather of the result
            if isinstance(result, np.ndarray) and not name.startswith(("array-original", "finalize")):
                sizes.append(result.size)

    with Sizes():
        got = out.compute(scheduler="sync")
    # one block of 16 tokens, or the states of its chunks (the carry and 2 chunks of 8: 3 x 8 x 8 per head)
    assert max(sizes) <= max(q.size // 4, 2 * 3 * 8 * 8), "some task materialised more than one block"
    assert_close(got, linear_attention_ref(q, k, v, np.arange(64), causal=True), dtype="float64", ulps=64)


@settings(max_examples=12, deadline=None)
@given(
    cuts=st.lists(st.integers(1, 7), min_size=1, max_size=5),
    batch_chunk=st.sampled_from([1, 2]),
    causal=st.booleans(),
    layout=st.sampled_from(["half", "interleaved"]),
    seed=st.integers(0, 2**16),
)
def test_dask_linear_attention_any_chunking(cuts, batch_chunk, causal, layout, seed):
    """Whatever the blocks along batch and sequence, Dask gives the one-block answer."""
    da = pytest.importorskip("dask.array")
    n = sum(cuts)
    rng = np.random.default_rng(seed)
    q, k, v = _qkv(rng, shape=(2, n, 4), dv=3)
    pos = rng.integers(0, 1000, size=n)
    dq, dk, dv = (da.from_array(a, chunks=(batch_chunk, tuple(cuts), a.shape[-1])) for a in (q, k, v))
    rope = rotary.RoPE(4, layout=layout)
    out = rotary.linear_attention(dq, dk, dv, da.from_array(pos, chunks=3), rope=rope, causal=causal)
    assert out.chunks[:-1] == dq.chunks[:-1]
    ref = linear_attention_ref(q, k, v, pos, causal=causal, layout=layout)
    assert_close(out, ref, dtype="float64", ulps=64)


@pytest.mark.parametrize("scan", ["sequential", "blelloch"])
def test_causal_linear_attention_dask_helper(rng, scan):
    pytest.importorskip("dask.array")
    from rotary.distributed import causal_linear_attention_dask

    q, k, v = _qkv(rng, shape=(2, 40, 8), dv=4)
    mask = rng.random((2, 40)) > 0.25
    out = causal_linear_attention_dask(q, k, v, np.arange(40) + 3, chunks=8, scan=scan, key_mask=mask)
    assert out.chunks == ((2,), (8,) * 5, (4,))
    ref = linear_attention_ref(q, k, v, np.arange(40) + 3, causal=True, key_mask=mask)
    assert_close(out, ref, dtype="float64", ulps=64)


def test_dask_incoming_state_and_float32(rng):
    da = pytest.importorskip("dask.array")
    q, k, v = _qkv(rng, shape=(2, 20, 8), dv=4, dtype=np.float32)
    first = rotary.linear_attention_state(k[:, :8], v[:, :8], np.arange(8))
    expected = rotary.linear_attention(
        q[:, 8:], k[:, 8:], v[:, 8:], np.arange(8, 20), causal=True, state=first
    )
    st = rotary.LinearAttentionState(da.from_array(first.S), da.from_array(first.z), first.offset)
    dq, dk, dv = (da.from_array(a[:, 8:], chunks=(1, 5, a.shape[-1])) for a in (q, k, v))
    out = rotary.linear_attention(dq, dk, dv, da.arange(8, 20, chunks=5), causal=True, state=st)
    assert out.dtype == np.float32
    assert_close(out, expected, dtype="float32", ulps=64)


def test_dask_errors_name_the_argument(rng):
    da = pytest.importorskip("dask.array")
    from rotary.distributed import causal_linear_attention_dask

    q, k, v = _qkv(rng, shape=(2, 8, 4), dv=4)
    with pytest.raises(ValueError, match="scan"):
        causal_linear_attention_dask(q, k, v, np.arange(8), scan="parallel")
    with pytest.raises(ValueError, match="chunks"):
        causal_linear_attention_dask(q, k, v, np.arange(8), chunks=0)
    dq = da.from_array(q, chunks=(1, 4, 4))
    with pytest.raises(ValueError, match="pos"):
        rotary.linear_attention(dq, dq, dq, da.arange(5), causal=True)
    with pytest.raises(TypeError, match="key_mask"):
        rotary.linear_attention(dq, dq, dq, da.arange(8), key_mask=da.ones((2, 8)))


# -- Dask: a real distributed cluster ------------------------------------------------------
@pytest.fixture(scope="module")
def client():
    pytest.importorskip("dask.array")
    distributed = pytest.importorskip("distributed")
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    cluster = distributed.LocalCluster(
        n_workers=2,
        threads_per_worker=1,
        processes=True,
        dashboard_address=None,
        worker_dashboard_address=None,
        env=env,
    )
    c = distributed.Client(cluster)
    yield c
    c.close()
    cluster.close()


def test_local_cluster_computes_rope_and_linear_attention(client, rng):
    da = pytest.importorskip("dask.array")
    q, k, v = _qkv(rng, shape=(2, 2, 24, 8), dv=4)
    pos = np.arange(24)
    dq, dk, dv = (da.from_array(a, chunks=(1, 2, 8, a.shape[-1])) for a in (q, k, v))
    dpos = da.arange(24, chunks=8)
    qr, kr = rotary.apply(dq, dk, dpos, layout="interleaved")
    conv = rotary.convert_layout(dq, "half", "interleaved")
    nc = rotary.linear_attention(dq, dk, dv, dpos)
    ca = rotary.linear_attention(dq, dk, dv, dpos, causal=True)
    futures = client.compute([qr, kr, conv, nc, ca])
    got = client.gather(futures)
    workers = {w for w in client.who_has(futures).values() for w in w}
    assert workers <= set(client.scheduler_info()["workers"]) and workers
    assert_close(got[0], rotate_ref(q, pos, layout="interleaved"), dtype="float64")
    assert_close(got[1], rotate_ref(k, pos, layout="interleaved"), dtype="float64")
    np.testing.assert_array_equal(got[2], rotary.convert_layout(q, "half", "interleaved"))
    assert_close(got[3], linear_attention_ref(q, k, v, pos, causal=False), dtype="float64", ulps=64)
    assert_close(got[4], linear_attention_ref(q, k, v, pos, causal=True), dtype="float64", ulps=64)


# -- JAX: one device, in this process --------------------------------------------------------
@pytest.mark.parametrize("causal", [True, False])
def test_sequence_parallel_one_device(rng, causal):
    jax = pytest.importorskip("jax")
    from rotary.distributed import sequence_parallel_linear_attention

    mesh = jax.make_mesh((1,), ("seq",))
    q, k, v = _qkv(rng, shape=(2, 16, 8), dv=4, dtype=np.float32)
    f = jax.jit(
        lambda q, k, v: sequence_parallel_linear_attention(
            q, k, v, np.arange(16), mesh=mesh, axis_name="seq", causal=causal, chunk_size=4
        )
    )
    ref = linear_attention_ref(q, k, v, np.arange(16), causal=causal)
    assert_close(f(q, k, v), ref, dtype="float32", ulps=64)


def test_sequence_parallel_errors(rng):
    jax = pytest.importorskip("jax")
    from rotary.distributed import sequence_parallel_linear_attention

    mesh = jax.make_mesh((1,), ("seq",))
    q = np.zeros((2, 8, 4), dtype=np.float32)
    with pytest.raises(ValueError, match="axis_name"):
        sequence_parallel_linear_attention(q, q, q, None, mesh=mesh, axis_name="heads")
    with pytest.raises(ValueError, match="lead_axes"):
        sequence_parallel_linear_attention(q, q, q, None, mesh=mesh, axis_name="seq", lead_axes=("a", "b"))
    with pytest.raises(TypeError, match="state"):
        sequence_parallel_linear_attention(q, q, q, None, mesh=mesh, axis_name="seq", state=None)


# -- JAX: 8 CPU devices, in a subprocess -------------------------------------------------------
_JAX_SCRIPT = textwrap.dedent(
    """
    import json
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
    import rotary
    from rotary.distributed import sequence_parallel_linear_attention

    assert jax.device_count() == 8, jax.devices()
    COLL = ("all-gather", "all-reduce", "collective-permute", "all-to-all", "reduce-scatter")
    rng = np.random.default_rng(0)
    shape = (8, 8, 16, 8)  # (batch, heads, seq, head_dim): every axis splits over 8 devices
    q, k, v = (np.asarray(rng.normal(size=shape), dtype=np.float32) for _ in range(3))
    pos, npos = jnp.arange(16), np.arange(16)  # traced positions; NumPy ones for the references
    results = []

    def check(name, f, args, spec, mesh, ref):
        sh = NamedSharding(mesh, spec)
        args = [jax.device_put(a, sh) for a in args]
        jf = jax.jit(f)
        out = jf(*args)
        outs = out if isinstance(out, tuple) else (out,)
        hlo = jf.lower(*args).compile().as_text()
        refs = ref if isinstance(ref, tuple) else (ref,)
        results.append(dict(
            name=name,
            same_sharding=all(o.sharding.is_equivalent_to(sh, o.ndim) for o in outs),
            collectives=sorted(c for c in COLL if c in hlo),
            err=max(float(np.max(np.abs(np.asarray(o, dtype=np.float64) - r))) for o, r in zip(outs, refs)),
            scale=max(1.0, *(float(np.max(np.abs(r))) for r in refs)),
        ))

    apply_ref = rotary.apply(q, k, npos)
    refs = {c: rotary.linear_attention(q, k, v, npos, causal=c) for c in (False, True)}
    for types in (AxisType.Auto, AxisType.Explicit):
        mesh = jax.make_mesh((8,), ("d",), axis_types=(types,))
        for axis, spec in (("batch", P("d")), ("heads", P(None, "d")), ("seq", P(None, None, "d"))):
            tag = f"{types.name}/{axis}"
            check(f"apply/{tag}", lambda q, k: rotary.apply(q, k, pos), (q, k), spec, mesh, apply_ref)
            for causal in (False, True):
                # a sequence split over devices: causal needs the shard_map helper below; an
                # Explicit mesh refuses to guess the sharding of the key/value summary (use it too)
                if axis == "seq" and (causal or types == AxisType.Explicit):
                    continue
                if types == AxisType.Explicit and (axis != "heads" or not causal):
                    continue  # keep the subprocess short: one case on an Explicit mesh
                ref = refs[causal]
                f = lambda q, k, v, c=causal: rotary.linear_attention(q, k, v, pos, causal=c, chunk_size=4)
                check(f"linear_attention/causal={causal}/{tag}", f, (q, k, v), spec, mesh, ref)
        for causal in (True, False) if types == AxisType.Auto else (True,):
            ref = refs[causal]
            f = lambda q, k, v, c=causal: sequence_parallel_linear_attention(
                q, k, v, pos, mesh=mesh, axis_name="d", causal=c, chunk_size=4)
            name = f"sequence_parallel/causal={causal}/{types.name}"
            check(name, f, (q, k, v), P(None, None, "d"), mesh, ref)
    mesh = jax.make_mesh((8,), ("d",))
    kg, vg = k[:, :2], v[:, :2]  # grouped-query: 2 key/value heads for 8 query heads
    refg = rotary.linear_attention(q, np.repeat(kg, 4, 1), np.repeat(vg, 4, 1), npos, causal=True)
    f = lambda q, k, v: sequence_parallel_linear_attention(
        q, k, v, pos, mesh=mesh, axis_name="d", causal=True, chunk_size=4)
    check("sequence_parallel/causal=True/gqa", f, (q, kg, vg), P(None, None, "d"), mesh, refg)
    mesh = jax.make_mesh((2, 4), ("data", "seq"))
    f = lambda q, k, v: sequence_parallel_linear_attention(
        q, k, v, pos, mesh=mesh, axis_name="seq", lead_axes=("data", None), chunk_size=4)
    check("sequence_parallel/causal=True/2d-mesh", f, (q, k, v), P("data", None, "seq"), mesh, refs[True])
    print("RESULTS" + json.dumps(results))
    """
)


@pytest.fixture(scope="module")
def jax8():
    pytest.importorskip("jax")
    env = dict(os.environ)
    env.update(
        XLA_FLAGS="--xla_force_host_platform_device_count=8",
        JAX_PLATFORMS="cpu",
        PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]),
    )
    proc = subprocess.run(
        [sys.executable, "-c", _JAX_SCRIPT], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULTS"))
    return {r["name"]: r for r in json.loads(line[len("RESULTS") :])}


def test_jax_sharded_outputs_keep_sharding_and_match(jax8):
    assert len(jax8) == (3 + 5 + 2) + (3 + 1 + 1) + 1 + 1
    for name, r in jax8.items():
        assert r["same_sharding"], f"{name}: output sharding differs from the input's"
        # against the one-device float32 result: only the order of float32 sums differs
        assert r["err"] <= 16 * eps("float32") * r["scale"], f"{name}: error {r['err']:.3g}"


def test_jax_sharded_batch_heads_need_no_collectives(jax8):
    for name, r in jax8.items():
        if "/batch" in name or "/heads" in name or name.startswith("apply/"):
            assert r["collectives"] == [], f"{name}: {r['collectives']} in the compiled HLO"


def test_jax_sequence_sharded_attention_moves_only_states(jax8):
    for name, r in jax8.items():
        if name.startswith("linear_attention/") and name.endswith("/seq"):  # non-causal
            assert r["collectives"] == ["all-reduce"], f"{name}: {r['collectives']}"
        if name.startswith("sequence_parallel/causal=True"):
            assert r["collectives"] == ["collective-permute"], f"{name}: {r['collectives']}"
        if name.startswith("sequence_parallel/causal=False"):
            assert r["collectives"] == ["all-reduce"], f"{name}: {r['collectives']}"


_JAX_DOCS_SCRIPT = textwrap.dedent(
    """
    import json
    import jax, jax.numpy as jnp, numpy as np
    import rotary
    from rotary.distributed import sequence_parallel_linear_attention as sp

    jax.config.update("jax_enable_x64", True)
    assert jax.device_count() == 4, jax.devices()
    rng = np.random.default_rng(0)
    N = 24  # 4 shards of 6 tokens
    q, k, v = (jnp.asarray(rng.normal(size=(2, 3, N, 8))) for _ in range(3))
    w = rng.normal(size=(2, 3, N, 8))
    mesh = jax.make_mesh((4,), ("seq",))
    CU = np.array([0, 5, 12, 18, 24])
    ROWS = np.array([[0] * 5 + [1] * 7 + [2] * 12, [0] * 12 + [1] * 12])[:, None]
    SEG = np.array([0] * 7 + [1] * 11 + [2] * 6)
    cases = {
        "cu_seqlens inside and on shard edges": dict(cu_seqlens=np.array([0, 5, 12, 18, 24])),
        "one document": dict(cu_seqlens=np.array([0, 24])),
        "documents of one token": dict(cu_seqlens=np.array([0, 1, 2, 6, 7, 13, 20, 24])),
        "segment_ids per row": dict(segment_ids=ROWS),
        "decay": dict(decay=0.9),
        "decay per head and documents": dict(decay=np.array([0.9, 0.8, 0.95]), cu_seqlens=CU),
        "gates and documents": dict(log_gate=-rng.uniform(0, 0.3, size=(2, 3, N)), segment_ids=SEG),
    }
    results = {}
    for name, kw in cases.items():
        for p in (np.arange(N), None) if name.startswith("cu_seqlens") else (np.arange(N),):
            loss = lambda f: lambda q, k, v: jnp.sum(f(q, k, v) * w)
            jkw = {n: jnp.asarray(a) if n in ("decay", "log_gate") else a for n, a in kw.items()}
            whole = lambda q, k, v: rotary.linear_attention(q, k, v, p, causal=True, chunk_size=4, **jkw)
            split = lambda q, k, v: sp(q, k, v, p, mesh=mesh, axis_name="seq", chunk_size=4, **kw)
            want, got = whole(q, k, v), jax.jit(split)(q, k, v)
            gw = jax.grad(loss(whole), argnums=(0, 1, 2))(q, k, v)
            gg = jax.jit(jax.grad(loss(split), argnums=(0, 1, 2)))(q, k, v)
            scale = max(1.0, float(np.abs(np.asarray(want)).max()))
            results[f"{name}/pos={p is not None}"] = dict(
                out=float(np.abs(np.asarray(got) - np.asarray(want)).max()) / scale,
                grads=max(float(np.abs(np.asarray(a) - np.asarray(b)).max()) for a, b in zip(gg, gw)) / scale,
            )
    try:
        sp(q, k, v, None, mesh=mesh, axis_name="seq", causal=False, cu_seqlens=np.array([0, 5, 24]))
        refused = None
    except TypeError as e:
        refused = str(e)
    print("RESULTS" + json.dumps({"results": results, "refused": refused}))
    """
)


@pytest.mark.slow
def test_sequence_parallel_documents_decay_and_gates_across_shards():
    # Issue 42: the sequence-parallel variant took no documents (a shard boundary may cut one);
    # now a document starting at a shard's first token forgets every earlier shard, the shards'
    # states combine in order (decay, gates), and every case equals one device's call, gradients
    # too (float64).  Non-causal attention over documents across shards is refused in words.
    pytest.importorskip("jax")
    env = dict(os.environ)
    env.update(
        XLA_FLAGS="--xla_force_host_platform_device_count=4",
        JAX_PLATFORMS="cpu",
        PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]),
    )
    proc = subprocess.run(
        [sys.executable, "-c", _JAX_DOCS_SCRIPT],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULTS"))
    got = json.loads(line[len("RESULTS") :])
    assert len(got["results"]) == 8
    for name, r in got["results"].items():
        assert r["out"] <= 16 * eps("float64") and r["grads"] <= 16 * eps("float64"), f"{name}: {r}"
    assert got["refused"] and "non-causal query needs its document's keys" in got["refused"]
