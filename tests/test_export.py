"""Deployment doors: torch.compile (static and dynamic), torch.export, ONNX and jax.export.

Each exported or compiled program is run at shapes other than the ones it was traced with and
compared with the float64 oracle; eager calls after tracing must stay real.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import rotary
from rotary.testing import assert_close, reference

SEQS = (5, 9, 16, 23, 40)

# a traced lru_cache (array-api-compat's namespace lookup) is a potential silent-staleness risk
pytestmark = pytest.mark.filterwarnings("error:Dynamo detected a call to a `functools.lru_cache`")


def _x(rng, shape):
    return rng.normal(size=shape).astype(np.float32)


def _counting_backend(graphs):
    """A torch.compile backend that records every graph dynamo hands it (one per (re)compile)."""

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    return backend


# -- the functions under test: each takes (q, k, v, pos) torch tensors of shape (b, h, n, d) ----
def _apply(q, k, v, pos):
    return rotary.apply(q, k, pos, layout="interleaved", base=5000.0)


def _rotate(q, k, v, pos):
    return rotary.rotate(q, pos, rotary_dim=8)


_ROPE = rotary.RoPE(16, base=777.0, scaling=rotary.YaRN(factor=4.0, original_max_position_embeddings=32))
_MROPE = rotary.MRoPE(16, sections=(2, 3, 3))


def _rope(q, k, v, pos):
    return _ROPE.apply(q, k, pos)


def _mrope(q, k, v, pos):
    import torch

    rows = torch.stack([pos, pos // 2, pos % 3])  # (3, n): a position per row
    return _MROPE.apply(q, k, rows)


def _linear_causal(q, k, v, pos):
    return rotary.linear_attention(q, k, v, pos, causal=True, chunk_size=4)


def _linear(q, k, v, pos):
    return rotary.linear_attention(q, k, v, pos, causal=False)


def _expected(name, q, k, v, pos):
    q, k, v, pos = (np.asarray(t.numpy(), dtype=np.float64) for t in (q, k, v, pos))
    if name == "apply":
        return reference.rotate(q, pos, layout="interleaved", base=5000.0), reference.rotate(
            k, pos, layout="interleaved", base=5000.0
        )
    if name == "rotate":
        return (reference.rotate(q, pos, rotary_dim=8),)
    return None  # the others: against the same call made eagerly (itself oracle-tested)


FUNCS = {
    "apply": _apply,
    "rotate": _rotate,
    "rope": _rope,
    "mrope": _mrope,
    "linear_causal": _linear_causal,
    "linear": _linear,
}


def test_attention_under_torch_compile_fullgraph(rng):
    # Regression: the default block size was computed with math.prod over a generator, which
    # fullgraph tracing refuses (the softmax loop itself specialises on the sequence length).
    torch = pytest.importorskip("torch")
    torch._dynamo.reset()
    q, k, v = (torch.from_numpy(_x(rng, (2, 3, 9, 16))) for _ in range(3))
    pos = torch.arange(9) + 4
    fn = torch.compile(rotary.attention, fullgraph=True, backend="eager")
    assert_close(fn(q, k, v, pos, causal=True), rotary.attention(q, k, v, pos, causal=True), ulps=0)


@pytest.mark.parametrize("dynamic", [True, None], ids=["dynamic", "automatic"])
@pytest.mark.parametrize("name", list(FUNCS))
def test_torch_compile_fullgraph_recompiles_at_most_once(name, dynamic, rng):
    """No graph break (fullgraph), and at most one recompile over five sequence lengths."""
    torch = pytest.importorskip("torch")
    torch._dynamo.reset()
    graphs: list = []
    fn = FUNCS[name]
    compiled = torch.compile(fn, fullgraph=True, dynamic=dynamic, backend=_counting_backend(graphs))
    for n in SEQS:
        q, k, v = (torch.from_numpy(_x(rng, (2, 3, n, 16))) for _ in range(3))
        pos = torch.arange(n) + 3 * n
        got = compiled(q, k, v, pos)
        got = got if isinstance(got, tuple) else (got,)
        want = _expected(name, q, k, v, pos)
        if want is None:
            want = fn(q, k, v, pos)
            want = want if isinstance(want, tuple) else (want,)
        for g, w in zip(got, want, strict=True):
            assert_close(g, w, dtype="float32", scale=4 if name.startswith("linear") else 1)
    assert len(graphs) <= (1 if dynamic else 2), f"{len(graphs)} graphs for {len(SEQS)} sequence lengths"


def test_new_configurations_inside_one_compiled_graph(rng):
    """Regression: two options never seen before, first met inside one traced function (the
    second used to be missing from the trace's view of the interned table: KeyError), and
    later configurations interned eagerly do not recompile it."""
    torch = pytest.importorskip("torch")
    torch._dynamo.reset()
    graphs: list = []
    bases = [float(b) for b in rng.uniform(1000.0, 2000.0, size=3)]  # fresh in this process

    def fn(q, pos):
        return rotary.rotate(q, pos, base=bases[0]) - rotary.apply(q, q, pos, base=bases[1])[1]

    compiled = torch.compile(fn, fullgraph=True, backend=_counting_backend(graphs))
    q = torch.from_numpy(_x(rng, (1, 2, 6, 16)))
    pos = torch.arange(6) + 40
    want = reference.rotate(q.numpy(), pos.numpy(), base=bases[0])
    want = want - reference.rotate(q.numpy(), pos.numpy(), base=bases[1])
    assert_close(compiled(q, pos), want, like=q, scale=2)
    rotary.rotate(q, pos, base=bases[2])  # another configuration, interned eagerly
    assert_close(compiled(q, pos), want, like=q, scale=2)
    assert len(graphs) == 1


def test_torch_compile_inductor_dynamic(rng):
    """The real compiler (inductor) with dynamic shapes."""
    torch = pytest.importorskip("torch")
    f = torch.compile(_ROPE.apply, fullgraph=True, dynamic=True)
    for n in (7, 19):
        q, k = (torch.from_numpy(_x(rng, (1, 2, n, 16))) for _ in range(2))
        pos = torch.arange(n)
        for g, w in zip(f(q, k, pos), _ROPE.apply(q, k, pos), strict=True):
            assert_close(g, w, dtype="float32")


# -- torch.export --------------------------------------------------------------------------------
def _module(torch):
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.rope = rotary.RoPE(16, base=1234.5, layout="interleaved", rotary_dim=12)

        def forward(self, q, k, pos):
            qr, kr = self.rope.apply(q, k, pos)
            return qr + 0.5 * kr

    return Block()


def _block_ref(q, k, pos):
    kw = dict(base=1234.5, layout="interleaved", rotary_dim=12)
    return reference.rotate(q, pos, **kw) + 0.5 * reference.rotate(k, pos, **kw)


def _inputs(torch, rng, b, n):
    q, k = (torch.from_numpy(_x(rng, (b, 2, n, 16))) for _ in range(2))
    return q, k, torch.arange(n) + 100


@pytest.mark.parametrize("strict", [False, True], ids=["non-strict", "strict"])
@pytest.mark.parametrize("dims", ["static", "seq", "batch+seq"])
def test_torch_export(dims, strict, rng):
    torch = pytest.importorskip("torch")
    m = _module(torch)
    args = _inputs(torch, rng, 2, 6)
    dynamic_shapes = None
    if dims != "static":
        seq = torch.export.Dim("seq", min=2, max=512)
        batch = torch.export.Dim("batch", min=1, max=64) if dims == "batch+seq" else None
        qs = {0: batch, 2: seq} if batch is not None else {2: seq}
        dynamic_shapes = (qs, qs, {0: seq})
    ep = torch.export.export(m, args, dynamic_shapes=dynamic_shapes, strict=strict)
    shapes = [(2, 6)] if dims == "static" else [(2, 6), (2, 13), (1 if batch else 2, 40)]
    for b, n in shapes:
        q, k, pos = _inputs(torch, rng, b, n)
        assert_close(ep.module()(q, k, pos), _block_ref(q.numpy(), k.numpy(), pos.numpy()), dtype="float32")
    out = m(*args)  # eager after export: real tensors, right numbers
    assert type(out) is torch.Tensor
    assert_close(out, _block_ref(*(a.numpy() for a in args)), dtype="float32")


def test_onnx_export_runs_in_onnxruntime(rng, tmp_path):
    torch = pytest.importorskip("torch")
    pytest.importorskip("onnxscript")
    ort = pytest.importorskip("onnxruntime")
    m = _module(torch).eval()
    seq = torch.export.Dim("seq", min=2, max=512)
    batch = torch.export.Dim("batch", min=1, max=64)
    qs = {0: batch, 2: seq}
    path = tmp_path / "rope.onnx"
    torch.onnx.export(
        m,
        _inputs(torch, rng, 2, 6),
        str(path),
        dynamo=True,
        input_names=["q", "k", "pos"],
        dynamic_shapes=(qs, qs, {0: seq}),
        verbose=False,
    )
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for b, n in ((2, 6), (1, 17), (3, 64)):
        q, k, pos = _inputs(torch, rng, b, n)
        (got,) = session.run(None, {"q": q.numpy(), "k": k.numpy(), "pos": pos.numpy()})
        assert_close(got, _block_ref(q.numpy(), k.numpy(), pos.numpy()), dtype="float32")


@pytest.mark.parametrize("angles", ["exact", "float32"])
def test_onnx_export_graph_is_the_documented_one(angles):
    # docs/guides/array_libraries.rst: the graph torch.onnx.export emits for RoPE(64).apply (its
    # nodes and size), and onnxscript's opset-23 fusion finding no RotaryEmbedding in it.
    import re
    from pathlib import Path

    torch = pytest.importorskip("torch")
    pytest.importorskip("onnx")
    pytest.importorskip("onnxscript")
    from onnxscript.rewriter import onnx_fusions

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.rope = rotary.RoPE(64, angles=angles)

        def forward(self, q, k, pos):
            return self.rope.apply(q, k, pos)

    q, pos = torch.randn(2, 4, 8, 64), torch.arange(8)
    seq, batch = torch.export.Dim("seq", min=2, max=4096), torch.export.Dim("batch", min=1, max=64)
    kw = dict(
        dynamo=True, input_names=["q", "k", "pos"], dynamic_shapes=({0: batch, 2: seq},) * 2 + ({0: seq},)
    )
    model = torch.onnx.export(M().eval(), (q, q, pos), verbose=False, **kw).model_proto  # initializers inside
    # (the exporter's metadata: stack traces and source paths, which depend on the checkout's path,
    # and symbol names, which depend on what the process traced before)
    for node in model.graph.node:
        del node.metadata_props[:]
        node.doc_string = ""
    del model.graph.metadata_props[:]
    nodes, size = len(model.graph.node), len(model.SerializeToString())
    page = " ".join(
        (Path(__file__).resolve().parents[1] / "docs/guides/array_libraries.rst").read_text().split()
    )
    m = re.search(
        r"(\d+) nodes and ([\d.]+) MB with exact angles .*?, (\d+) nodes and ([\d.]+) KB with "
        r"``angles=\"float32\"``",
        page,
    )
    assert m, "array_libraries.rst: the torch.onnx.export sentence changed"
    if angles == "exact":
        assert (int(m.group(1)), float(m.group(2))) == (nodes, round(size / 1e6, 1))
    else:
        assert (int(m.group(3)), float(m.group(4))) == (nodes, round(size / 1e3, 1))
    prog = torch.onnx.export(M().eval(), (q, q, pos), opset_version=23, verbose=False, **kw)
    assert onnx_fusions.fuse(prog.model)["RotaryEmbedding"] == 0


# -- jax.export ----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["rope", "linear_causal"])
def test_jax_export_symbolic_batch_and_seq(name, rng):
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    from jax import export

    if name == "rope":

        def f(q, k, pos):
            qr, kr = rotary.apply(q, k, pos, layout="interleaved", base=1234.5, rotary_dim=12)
            return qr + 0.5 * kr

        def want(q, k, pos):
            return _block_ref(q, k, pos)
    else:

        def f(q, k, pos):
            return rotary.linear_attention(q, k, k, pos, causal=True, chunk_size=4)

        def want(q, k, pos):
            return rotary.linear_attention(q, k, k, pos, causal=True, chunk_size=4)  # eager NumPy

    b, n = export.symbolic_shape("b, n")
    spec = jax.ShapeDtypeStruct((b, 2, n, 16), jnp.float32)
    exported = export.export(jax.jit(f))(spec, spec, jax.ShapeDtypeStruct((n,), jnp.int32))
    restored = export.deserialize(exported.serialize())
    for bb, nn in ((1, 5), (3, 12), (2, 33)):
        q, k = _x(rng, (bb, 2, nn, 16)), _x(rng, (bb, 2, nn, 16))
        pos = np.arange(nn, dtype=np.int32) + 100
        assert_close(restored.call(q, k, pos), want(q, k, pos), dtype="float32", scale=4)


def test_dynamo_marks_a_constant_function_by_one_attribute():
    # rotary marks its trace-time constant builders as torch.compiler.assume_constant_result does,
    # without importing Dynamo (1.4 s at the first eager call); this holds while the decorator
    # sets exactly the one attribute Dynamo reads.
    torch = pytest.importorskip("torch")

    def f() -> int:
        return 0

    assert torch.compiler.assume_constant_result(f) is f
    assert vars(f) == {"_dynamo_marked_constant": True}


def test_eager_calls_do_not_import_dynamo():
    # Regression: the torch backend imported torch._dynamo when first used (1.4 s of the first
    # call, in every process, compiled or not).
    pytest.importorskip("torch")
    code = (
        "import sys, torch, rotary\n"
        "q = torch.randn(1, 4, 13, 64, requires_grad=True)\n"
        "r = rotary.RoPE(64, scaling=rotary.scaling.YaRN(4.0, 64))\n"
        "rotary.apply(q, q, torch.arange(13))[0].sum().backward()\n"
        "r.apply(q, q, torch.arange(13)); rotary.linear_attention(q, q, q, torch.arange(13), causal=True)\n"
        "assert 'torch._dynamo' not in sys.modules\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
