"""The benchmark command lines: readable help, rows that say what they measure (no timing here)."""

from __future__ import annotations

import numpy as np
import pytest

import rotary
from benchmarks import __main__ as suite
from benchmarks import linear_attention as la


@pytest.mark.parametrize("main", [suite.main, la.main])
def test_help_is_plain_text(main, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "``" not in out and ":data:" not in out and "usage:" in out


def test_unknown_backend_is_rejected_with_the_choices(capsys):
    with pytest.raises(SystemExit) as exc:
        la.main(["--backends", "numpy,bogus"])
    assert exc.value.code == 2
    assert "unknown backend 'bogus'; choose from: numpy, torch, jax" in capsys.readouterr().err


def _rows(n_softmax: int) -> list[dict]:
    rows = []
    for n in (1024, 2048, 4096, 8192):
        rows.append({"backend": "numpy", "method": "linear", "N": n, "s": n * 1e-6, "MiB": None})
        s = 50 * n * 1e-6 if n <= n_softmax else None
        rows.append({"backend": "numpy", "method": "softmax", "N": n, "s": s, "MiB": None})
    return rows


@pytest.mark.parametrize("n_softmax", [4096, 8192])
def test_softmax_over_linear_row_reads_as_labelled(n_softmax):
    rows = la._rows_for_suite(_rows(n_softmax), la.summary(_rows(n_softmax)))
    (row,) = [r for r in rows if r["case"].startswith("softmax / linear")]
    assert row["ratio"] == pytest.approx(50.0)  # softmax / linear, as the label says
    assert row["cmp"] == ">=" and row["target"] == 10.0
    assert row["ok"] is None  # the speed-up target applies at 16k only: neither met nor missed
    table = suite.markdown_table(rows)
    line = next(t for t in table.splitlines() if "softmax / linear" in t)
    assert "| 50.00 |" in line and ">= 10" in line and "missed" not in line and "met" not in line
    scaling = next(t for t in table.splitlines() if "time(8k) / time(1k)" in t)
    assert "| <= 10 |" in scaling and scaling.endswith("| met |")


def test_gpu_matrix_without_a_gpu_says_so_and_succeeds(capsys, tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the matrix would run")
    assert suite.main(["--gpu", "--json", str(tmp_path / "gpu.json")]) == 0
    assert "no CUDA GPU" in capsys.readouterr().out
    assert not (tmp_path / "gpu.json").exists()


def test_gpu_matrix_code_runs_here_at_tiny_shapes():
    """The GPU matrix's own code, on the CPU at tiny shapes (timing meaningless): every row well
    formed, the copy floor at 100 %."""
    pytest.importorskip("torch")
    from benchmarks import gpu

    rows = gpu.rows("cpu", quick=True, reps=1)
    assert {r["case"] for r in rows} >= {"copy (floor)", "torch generic"}
    for r in rows:
        assert r["us"] > 0 and r["GB/s"] > 0 and r["% of copy"] > 0
        if r["case"] == "copy (floor)":
            assert r["% of copy"] == pytest.approx(100.0)


@pytest.mark.parametrize("lib", ["numpy", "torch", "jax"])
def test_hand_written_baselines_compute_linear_attention(lib):
    """The hand-written code the benchmark times rotary against computes the same thing
    (equation 19, elu+1, RoPE; float32 angles against rotary's exact ones): a fair comparison."""
    import numpy as np

    import rotary
    from benchmarks import linear_hand as hand

    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 2, 256, 16), dtype=np.float32) * 0.5 for _ in range(3))
    pos = np.arange(256)
    want_c = rotary.linear_attention(q, k, v, pos, causal=True)
    want_n = rotary.linear_attention(q, k, v, pos)
    st = rotary.linear_attention_state(k[..., :255, :], v[..., :255, :], pos[:255])
    step_args = (q[..., 255:, :], k[..., 255:, :], v[..., 255:, :])
    if lib == "numpy":
        got = hand.numpy_causal(q, k, v), hand.numpy_noncausal(q, k, v)
        step = hand.numpy_step(*step_args, st.S, st.z, 255)[0]
    elif lib == "torch":
        torch = pytest.importorskip("torch")
        t = [torch.from_numpy(x) for x in (q, k, v)]
        got = hand.torch_causal(*t).numpy(), hand.torch_noncausal(*t).numpy()
        ts = [torch.from_numpy(np.ascontiguousarray(x)) for x in step_args]
        step = hand.torch_step(*ts, torch.from_numpy(st.S), torch.from_numpy(st.z), 255)[0].numpy()
    else:
        jax = pytest.importorskip("jax")
        got = tuple(np.asarray(jax.jit(f)(q, k, v)) for f in (hand.jax_causal, hand.jax_noncausal))
        step = np.asarray(jax.jit(hand.jax_step)(*step_args, st.S, st.z, jax.numpy.asarray(255))[0])
    np.testing.assert_allclose(got[0], want_c, rtol=2e-4, atol=2e-4)
    np.testing.assert_allclose(got[1], want_n, rtol=2e-4, atol=2e-4)
    np.testing.assert_allclose(step, want_c[..., 255:, :], rtol=2e-4, atol=2e-4)


#: The libraries of the linear-attention baselines (JAX compiles each case: 8 s or more).
LIBS = ["numpy", "torch", pytest.param("jax", marks=pytest.mark.slow)]


@pytest.mark.parametrize("lib", LIBS)
def test_careful_baselines_compute_linear_attention(lib):
    """The careful hand-written code (``benchmarks/linear_careful.py``) against the float64
    oracle of equation 19 (RoPE at exact angles): causal at a length that is not a multiple of
    its chunk (torch, NumPy), non-causal in several blocks and in one, and the decoding step
    (which updates the state in place where the library allows)."""
    from test_linear_attention import naive

    from benchmarks import linear_careful as careful

    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 2, 256, 16), dtype=np.float32) * 0.5 for _ in range(3))
    pos = np.arange(256)
    want_c, _ = naive(q, k, v, pos, causal=True)
    want_n, _ = naive(q, k, v, pos)
    odd = tuple(np.ascontiguousarray(x[..., :200, :]) for x in (q, k, v))
    want_odd, _ = naive(*odd, pos[:200], causal=True)
    st = rotary.linear_attention_state(k[..., :255, :], v[..., :255, :], pos[:255])
    one = tuple(np.ascontiguousarray(x[..., 255:, :]) for x in (q, k, v))
    S, z = np.array(st.S), np.array(st.z)
    new = None  # (the pure step's output and state, where the library has one)
    if lib == "numpy":
        got = [careful.numpy_causal(q, k, v), careful.numpy_noncausal(q, k, v, block=64)]
        got += [careful.numpy_noncausal(q, k, v), careful.numpy_causal(*odd)]
        tables = careful.numpy_step_tables(512, 16)
        new = careful.numpy_step_new(*one, S, z, *tables, 255)
        np.testing.assert_array_equal(S, st.S)  # (left as it was)
        step = careful.numpy_step(*one, S, z, *tables, 255)
        S1 = S
    elif lib == "torch":
        torch = pytest.importorskip("torch")
        t = [torch.from_numpy(x) for x in (q, k, v)]
        got = [careful.torch_causal(*t), careful.torch_noncausal(*t, block=64), careful.torch_noncausal(*t)]
        got.append(careful.torch_causal(*(torch.from_numpy(x) for x in odd)))
        St, zt = torch.from_numpy(S), torch.from_numpy(z)
        t1, tables = [torch.from_numpy(x) for x in one], careful.torch_step_tables(512, 16)
        new = [x.numpy() for x in careful.torch_step_new(*t1, St, zt, *tables, 255)]
        np.testing.assert_array_equal(S, st.S)  # (left as it was)
        step = careful.torch_step(*t1, St, zt, *tables, 255)
        got, step, S1 = [g.numpy() for g in got], step.numpy(), St.numpy()
    else:
        jax = pytest.importorskip("jax")
        got = [np.asarray(jax.jit(careful.jax_causal)(q, k, v))]
        got.append(np.asarray(jax.jit(lambda *a: careful.jax_noncausal(*a, block=64))(q, k, v)))
        got.append(np.asarray(jax.jit(careful.jax_noncausal)(q, k, v)))
        got.append(np.asarray(jax.jit(careful.jax_causal)(q[..., :192, :], k[..., :192, :], v[..., :192, :])))
        want_odd = want_c[..., :192, :]
        C, Sn = careful.jax_tables(512, 16)
        step, S1, _ = (
            np.asarray(x) for x in jax.jit(careful.jax_step)(*one, S, z, C, Sn, jax.numpy.asarray(255))
        )
    for g, w in zip(got, (want_c, want_n, want_n, want_odd), strict=True):
        np.testing.assert_allclose(g, w, rtol=2e-4, atol=2e-4)
    np.testing.assert_allclose(step, want_c[..., 255:, :], rtol=2e-4, atol=2e-4)
    whole = rotary.linear_attention_state(k, v, pos)
    np.testing.assert_allclose(S1, whole.S, rtol=2e-4, atol=2e-3)
    if new is not None:  # the pure step: the in-place one's output and state
        np.testing.assert_allclose(new[0], want_c[..., 255:, :], rtol=2e-4, atol=2e-4)
        np.testing.assert_allclose(new[1], whole.S, rtol=2e-4, atol=2e-3)
        np.testing.assert_allclose(new[2], whole.z, rtol=2e-4, atol=2e-3)


@pytest.mark.parametrize("lib", LIBS)
def test_linear_benchmark_cases_compute_the_same_attention(lib):
    """Every case the linear-attention benchmark times against another computes the same thing
    (tiny shapes; timing meaningless): rotary, the careful and the hurried code, and each
    decoding row's first step (every position form from the same state)."""
    if lib != "numpy":
        pytest.importorskip(lib)
    cases = la._lib_cases(lib, 256)
    for kind, fns in cases.items():
        outs = {name: np.asarray(f()) for name, f in fns.items() if name != "fla naive chunk"}
        ref = outs[la.CAREFUL]
        for name, out in outs.items():
            np.testing.assert_allclose(out, ref, rtol=2e-4, atol=2e-4, err_msg=f"{kind}: {name}")
    steps = la._decode_cases(lib, heads=2)
    outs = {name: np.asarray(f()) for name, f in steps.items()}
    for name, out in outs.items():
        np.testing.assert_allclose(out, outs[la.CAREFUL], rtol=2e-4, atol=2e-4, err_msg=name)
    if lib != "jax":
        assert {f"rotary, pos={f}" for f in la.DECODE_FORMS} <= set(outs)
