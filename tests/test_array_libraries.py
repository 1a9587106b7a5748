"""Any array-API library: ndonnx (concrete arrays and ONNX graphs run in onnxruntime), the ONNX
``RotaryEmbedding`` operator as an oracle, cubed, marray, and libraries rotary has never heard of
(``wraparray``, written in the tests: readable, and opaque with no value to read)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import rotary
from conformance.calls import CALLS, D, inputs, leaves

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))  # (wraparray: a module of the tests)

import wraparray  # noqa: E402

TOL32 = 64 * np.finfo(np.float32).eps


def _np_rope(q, pos, **kw):
    return rotary.rotate(q, pos, **kw)


# -- unknown libraries: the generic path, a note, no value read where none can be -------------------
def test_unknown_library_runs_every_public_function_on_the_generic_path():
    from conformance.libraries import check_library, format_libraries
    from rotary.testing.backends import library_path

    e = check_library("wraparray")
    assert e["recognised"] and e["path"] == "generic" == library_path(wraparray)
    assert e["passed"], e["detail"]
    assert len(e["results"]) == len(CALLS) and all(r["passed"] for r in e["results"])
    assert "no module for this library: the generic array-API path" in e["note"]
    text = "\n".join(format_libraries([{**e, "installed": True}]))
    assert "ok   wraparray" in text and "[path: generic*]" in text and "* rotary has no module" in text


def test_report_lists_every_library_and_checks_an_extra_one(tmp_path):
    import json

    from conformance.libraries import LIBRARIES

    env = {"PYTHONPATH": f"{HERE}:{ROOT}", "PATH": "/usr/bin:/bin"}
    argv = [
        "--backends",
        "numpy",
        "--libraries",
        "none",
        "--library",
        "wraparray",
        "--quiet",
        "--out",
        str(tmp_path),
    ]
    run = subprocess.run(
        [sys.executable, "-m", "conformance", *argv], capture_output=True, text=True, cwd=tmp_path, env=env
    )
    assert run.returncode == 0, run.stdout + run.stderr
    rep = json.loads((tmp_path / "report.json").read_text())
    libs = {e["library"]: e for e in rep["libraries"]}
    assert [n for n, _ in LIBRARIES] + ["wraparray"] == list(libs)
    assert libs["numpy"]["detail"] == "checked in the table: numpy" and libs["numpy"]["path"] == "numpy"
    w = libs["wraparray"]
    assert (
        w["passed"]
        and w["path"] == "generic"
        and w["detail"] == f"{len(CALLS)}/{len(CALLS)} public functions equal NumPy's"
    )
    for e in libs.values():  # every other one: not installed, or listed without a check
        assert e["library"] in ("numpy", "wraparray") or e["passed"] is None
    text = (tmp_path / "report.txt").read_text()
    assert "ok   wraparray" in text and "[path: generic*]" in text


def test_report_refuses_a_library_it_cannot_import(tmp_path):
    env = {"PYTHONPATH": f"{HERE}:{ROOT}", "PATH": "/usr/bin:/bin"}
    bad = subprocess.run(
        [sys.executable, "-m", "conformance", "--library", "no_such_array_lib", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
    )
    assert bad.returncode == 2 and "--library no_such_array_lib: cannot import it here" in bad.stderr


@pytest.mark.parametrize("name", list(CALLS))
def test_opaque_library_values_are_never_read(name):
    # Arrays that refuse bool/int/float/__index__/__array__/DLPack and say they have no
    # data-dependent shapes: every public function runs as under tracing, with NumPy's numbers.
    fn, pk = CALLS[name]
    a = inputs(2, 6)
    op = wraparray.opaque
    got = leaves(fn(*(op.asarray(a[n]) for n in ("q", "k", "v", pk))))
    want = leaves(fn(a["q"], a["k"], a["v"], a[pk]))
    for g, w in zip(got, want, strict=True):
        assert type(g) is op.WArray
        np.testing.assert_allclose(
            wraparray.peek(g), w, rtol=0, atol=TOL32 * max(1.0, float(np.max(np.abs(w))))
        )


def test_positions_out_of_range_error_where_readable_nan_where_not():
    x = np.ones((1, 1, 2, 8), dtype=np.float32)
    pos = np.asarray([0, 2**40])
    with pytest.raises(ValueError, match="pos"):
        rotary.rotate(wraparray.asarray(x), wraparray.asarray(pos))
    out = wraparray.peek(rotary.rotate(wraparray.opaque.asarray(x), wraparray.opaque.asarray(pos)))
    assert np.all(out[..., 0, :] == 1.0) and np.all(np.isnan(out[..., 1, :]))  # unchecked: NaN


def test_to_numpy_refuses_what_it_cannot_read():
    from rotary.testing import to_numpy

    with pytest.raises(TypeError, match=r"cannot read the values of a .*WArray_wraparray_opaque on the host"):
        to_numpy(wraparray.opaque.asarray(np.ones(3)))
    np.testing.assert_array_equal(to_numpy(wraparray.asarray(np.arange(3.0))), np.arange(3.0))  # by DLPack


# -- ndonnx --------------------------------------------------------------------------------------------
def test_ndonnx_rotate_concrete_and_symbolic():
    # The reproduction: int(host.min()) on an ndonnx array (TypeError), "no propagated value
    # available" on a symbolic one.
    ndx = pytest.importorskip("ndonnx")
    ort = pytest.importorskip("onnxruntime")
    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, 2, 6, 16)).astype(np.float32)
    pos = np.arange(6) * 7
    got = rotary.rotate(ndx.asarray(q), ndx.asarray(pos)).unwrap_numpy()
    np.testing.assert_allclose(got, rotary.rotate(q, pos), rtol=0, atol=TOL32)
    x = ndx.argument(shape=("B", 2, "S", 16), dtype=ndx.float32)
    p = ndx.argument(shape=("S",), dtype=ndx.int64)
    model = ndx.build({"x": x, "p": p}, {"y": rotary.rotate(x, p)})
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for b, s in ((1, 3), (2, 6), (3, 40)):
        qq = rng.standard_normal((b, 2, s, 16)).astype(np.float32)
        pp = np.arange(s, dtype=np.int64) + 1000
        (y,) = sess.run(None, {"x": qq, "p": pp})
        np.testing.assert_allclose(y, rotary.rotate(qq, pp), rtol=0, atol=TOL32)


@pytest.mark.parametrize("name", list(CALLS))
def test_ndonnx_every_public_function(name):
    # Concrete arrays (values propagated), and a symbolic call built into an ONNX model that
    # onnxruntime runs at three (batch, seq) sizes, each equal to NumPy within float32 rounding.
    pytest.importorskip("ndonnx")
    pytest.importorskip("onnxruntime")
    from conformance.onnx import SHAPES, run_ndonnx

    res = run_ndonnx((name,))
    assert [r["mode"] for r in res] == ["concrete", "symbolic"]
    for r in res:
        assert r["passed"], r
    assert f"run at (batch, seq) {SHAPES}" in res[1]["detail"] and len({s for _, s in SHAPES}) == 3


def test_ndonnx_two_dynamic_position_dims_say_what_to_do():
    ndx = pytest.importorskip("ndonnx")
    q = ndx.argument(shape=("B", 2, "S", D), dtype=ndx.float32)
    p = ndx.argument(shape=("B", "S"), dtype=ndx.int64)
    with pytest.raises(
        ValueError, match=r"pos of shape \(None, 1, None\) has 2 dimensions of unknown size.*angles='float32'"
    ):
        rotary.rotate(q, p[:, None, :])
    assert rotary.RoPE(D, angles="float32").rotate(q, p[:, None, :]).shape == (None, 2, None, D)
    assert rotary.rotate(q, ndx.argument(shape=(2, "S"), dtype=ndx.int64)[:, None, :]).shape == (
        2,
        2,
        None,
        D,
    )


def test_onnx_rotary_embedding_operator_agrees_with_rotary():
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    from conformance.onnx import run_rotary_embedding

    res = run_rotary_embedding()
    cases = {(r["name"].split("(")[-1]) for r in res}
    assert len(res) == 8 and len(cases) == 4  # interleaved 0/1 x rotary_embedding_dim 64/32
    for r in res:
        assert r["passed"], r


def test_onnx_model_example(tmp_path):
    pytest.importorskip("ndonnx")
    pytest.importorskip("onnxruntime")
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "rotary_example_onnx_model", ROOT / "examples" / "onnx_model.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    errors = mod.main(["--out", str(tmp_path), "--head-dim", "16", "--seqs", "3,9,20"])
    assert sorted(errors) == [3, 9, 20] and max(errors.values()) <= TOL32
    assert (tmp_path / "rope_linear_attention.onnx").stat().st_size > 0


# -- cubed ---------------------------------------------------------------------------------------------
def test_cubed_default_executor_and_its_mended_departures():
    cubed = pytest.importorskip("cubed")
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, 8, 16))
    xc = cubed.from_array(x, chunks=(1, 2, 4, 8))  # several chunks along every axis
    pos = np.arange(8) * 5
    for layout in ("half", "interleaved"):
        out = rotary.rotate(xc, pos, layout=layout, rotary_dim=12)
        assert isinstance(out, cubed.Array)  # lazy until computed, on cubed's default executor
        np.testing.assert_allclose(
            out.compute(), rotary.rotate(x, pos, layout=layout, rotary_dim=12), rtol=0, atol=1e-15
        )
    # convert_layout: a full-length permutation through take (cubed read it as x itself, unpermuted)
    np.testing.assert_array_equal(
        rotary.convert_layout(xc, "half", "interleaved").compute(),
        rotary.convert_layout(x, "half", "interleaved"),
    )
    # causal linear attention: cumulative sums, concatenations and reshapes of chunked arrays
    got = rotary.linear_attention(xc, xc, xc, pos, causal=True, chunk_size=3).compute()
    np.testing.assert_allclose(
        got, rotary.linear_attention(x, x, x, pos, causal=True, chunk_size=3), rtol=1e-12, atol=1e-12
    )


# -- marray: masks propagate by marray's rules ---------------------------------------------------------
@pytest.fixture
def mxp():
    marray = pytest.importorskip("marray")
    return marray.masked_namespace(np)


@pytest.mark.parametrize(
    ("layout", "rotary_dim"), [("half", None), ("interleaved", None), ("half", 6), ("interleaved", 6)]
)
def test_marray_rotation_masks_an_output_where_an_input_it_depends_on_is(mxp, layout, rotary_dim):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((1, 2, 4, 8))
    m = rng.random(x.shape) < 0.2
    out = rotary.rotate(mxp.asarray(x, mask=m), np.arange(4), layout=layout, rotary_dim=rotary_dim)
    r = 8 if rotary_dim is None else rotary_dim
    partner = np.arange(8)
    if layout == "half":
        partner[:r] = (np.arange(r) + r // 2) % r
    else:
        partner[:r] = np.arange(r) ^ 1
    np.testing.assert_array_equal(out.mask, m | m[..., partner])
    np.testing.assert_array_equal(
        out.data[~out.mask], rotary.rotate(x, np.arange(4), layout=layout, rotary_dim=rotary_dim)[~out.mask]
    )
    pm = mxp.asarray(np.arange(4), mask=np.asarray([False, True, False, False]))  # a masked position
    out = rotary.rotate(mxp.asarray(x), pm)
    np.testing.assert_array_equal(out.mask.any(axis=(0, 1, 3)), [False, True, False, False])
    assert out.mask[..., 1, :].all()


def test_marray_masked_keys_are_skipped_as_marray_skips_them(mxp):
    # marray's reductions (sum, matmul, max) skip masked elements: a masked key token is left
    # out of attention and of linear attention, causal or not (rotary's key_mask/mask results;
    # causal linear attention combines the states of a part's chunks by a matrix product).
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((1, 2, 5, 8)) for _ in range(3))
    km = np.zeros(k.shape, dtype=bool)
    km[:, :, 3, :] = True
    keep = np.arange(5) != 3
    mk, mv = mxp.asarray(k, mask=km), mxp.asarray(v, mask=km)
    pos = np.arange(5)
    o = rotary.linear_attention(mxp.asarray(q), mk, mv, pos)
    assert not o.mask.any()
    np.testing.assert_allclose(
        o.data, rotary.linear_attention(q, k, v, pos, key_mask=keep), rtol=1e-12, atol=1e-12
    )
    for causal in (False, True):
        o = rotary.attention(mxp.asarray(q), mk, mv, pos, causal=causal)
        assert not o.mask.any()
        want = rotary.attention(q, k, v, pos, causal=causal, mask=keep[None, :])
        np.testing.assert_allclose(o.data, want, rtol=1e-12, atol=1e-12)
    o = rotary.linear_attention(mxp.asarray(q), mk, mv, pos, causal=True)
    assert not o.mask.any()
    want = rotary.linear_attention(q, k, v, pos, causal=True, key_mask=keep)
    np.testing.assert_allclose(o.data, want, rtol=1e-12, atol=1e-12)


def _in_a_fresh_process(code: str) -> None:
    """Run ``code`` in a new interpreter (state of the process: caches, backends) and pass."""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 0, res.stdout + res.stderr


def test_cubed_one_namespace_whatever_is_looked_up_first():
    # Regression: each lookup of cubed's namespace made a new mended wrapper; when the backend was
    # made from another (here: the namespace of the module, first), ``array_namespace(x) is xp``
    # failed and from_lengths read the lazy lengths on the host, giving int64 positions.
    pytest.importorskip("cubed")
    code = (
        "import cubed, numpy as np\n"
        "from rotary.testing.backends import library_path\n"
        "from rotary import positions\n"
        "assert library_path(cubed) == 'generic'\n"
        "a = cubed.from_array(np.asarray([3, 1], dtype=np.int8))\n"
        "out = positions.from_lengths(a, total=4)\n"
        "assert out.dtype == np.int8, out.dtype\n"
        "np.testing.assert_array_equal(out.compute(), [0, 1, 2, 0])\n"
    )
    _in_a_fresh_process(code)


@pytest.mark.slow
def test_cubed_arrays_of_any_spec_whatever_ran_before():
    # Regression: rotary made its arrays (constants, positions, tables) with cubed's default Spec
    # and cached them by device alone, so arrays made with an explicit ``spec=`` failed ("Arrays
    # must have same spec in single computation"), and so did arrays made under
    # ``cubed.config.set(...)`` once a call under the default Spec had filled the cache.
    pytest.importorskip("cubed")
    code = (
        "import tempfile, cubed\n"
        "from conformance.calls import run_calls\n"
        "names = ('apply', 'MRoPE', 'linear_attention causal')\n"
        "runs = [run_calls(lambda a: cubed.from_array(a), 'default', names)]\n"
        "spec = cubed.Spec(tempfile.mkdtemp(), allowed_mem='500MB', executor_name='single-threaded')\n"
        "runs.append(run_calls(lambda a: cubed.from_array(a, spec=spec), 'explicit spec', names))\n"
        "with cubed.config.set({'spec.executor_name': 'single-threaded'}):\n"
        "    runs.append(run_calls(lambda a: cubed.from_array(a), 'config.set', names))\n"
        "for run in runs:\n"
        "    assert len(run) == len(names), run\n"
        "    for r in run:\n"
        "        assert r['passed'], r\n"
    )
    _in_a_fresh_process(code)


def test_marray_two_namespaces_each_gets_its_own_arrays():
    # Regression: rotary kept one backend (and one set of constants) per library name, so after
    # a call on arrays of one ``marray.masked_namespace(np)``, arrays of another (its own array
    # class) got results of the first one's class, and from_lengths read them on the host and
    # returned int64 positions for int8 lengths.
    pytest.importorskip("marray")
    code = (
        "import marray, numpy as np, rotary\n"
        "from rotary import positions\n"
        "x = np.random.default_rng(0).standard_normal((1, 2, 4, 8))\n"
        "for m in (marray.masked_namespace(np), marray.masked_namespace(np)):\n"
        "    cls = type(m.asarray(0))\n"
        "    out = positions.from_lengths(m.asarray(np.asarray([3, 1], dtype=np.int8)), total=4)\n"
        "    assert type(out) is cls and out.dtype == m.int8, (type(out), out.dtype)\n"
        "    y = rotary.rotate(m.asarray(x), m.asarray(np.arange(4)))\n"
        "    assert type(y) is cls, type(y)\n"
        "    np.testing.assert_array_equal(y.data, rotary.rotate(x, np.arange(4)))\n"
    )
    _in_a_fresh_process(code)
