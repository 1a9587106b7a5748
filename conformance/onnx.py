"""rotary on ndonnx (array-API arrays that build ONNX graphs) and the ONNX ``RotaryEmbedding``
operator as an oracle.

* :func:`run_ndonnx`: every public function on concrete ndonnx arrays (values propagated through
  the graph) and on symbolic ones (``ndx.argument`` with dynamic batch and sequence axes): the
  graph built is saved as an ONNX model and run in onnxruntime at several sequence lengths and
  batch sizes, each result against NumPy on the same inputs.
* :func:`run_rotary_embedding`: onnxruntime's standard ``RotaryEmbedding`` (opset 23), both
  ``interleaved`` values and partial rotary (``rotary_embedding_dim``), with its cos/sin caches
  computed in the graph from the positions (Hugging Face's float32 recipe, ``Pow``/``Cos``/``Sin``
  of onnxruntime), against ``rotary``'s ``angles="float32"`` (within the recipe's allowance) and the
  exact angles; and with ``rotary``'s own float32 cos/sin fed in (the rotation alone: a few ulps).

Both need ``ndonnx``/``onnx`` and ``onnxruntime``; without them each result says so.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import rotary

from .calls import CALLS, TOL, D, error, inputs, leaves, run_calls, why

__all__ = ["SHAPES", "run_ndonnx", "run_rotary_embedding"]

#: Sequence lengths and batch sizes the symbolic models run at.
SHAPES = ((1, 3), (2, 6), (3, 11))


def run_ndonnx(
    names: tuple[str, ...] | None = None, modes: tuple[str, ...] = ("concrete", "symbolic")
) -> list[dict[str, Any]]:
    """One result per public function of :data:`~conformance.calls.CALLS` (or of ``names``) and
    mode (``concrete``, ``symbolic``): ``passed``, the worst error against NumPy and where it ran."""
    try:
        import ndonnx as ndx
        import onnxruntime as ort
    except ImportError as e:
        return [{"name": "ndonnx", "mode": "-", "passed": None, "detail": f"not installed ({e.name})"}]
    calls = {n: c for n, c in CALLS.items() if names is None or n in names}
    out = run_calls(ndx.asarray, names=tuple(calls)) if "concrete" in modes else []
    for name, (fn, pk) in calls.items():
        if "symbolic" not in modes:
            break
        try:
            pshape = {"seq": ("S",), "seq2": ("S", 2), "rows": (3, "S")}[pk]
            args = {
                "q": ndx.argument(shape=("B", 4, "S", D), dtype=ndx.float32),
                "k": ndx.argument(shape=("B", 2, "S", D), dtype=ndx.float32),
                "v": ndx.argument(shape=("B", 2, "S", D), dtype=ndx.float32),
                "p": ndx.argument(shape=pshape, dtype=ndx.int64),
            }
            outs = leaves(fn(args["q"], args["k"], args["v"], args["p"]))
            model = ndx.build(args, {f"out{i}": o for i, o in enumerate(outs)})
            sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
            used = {i.name for i in sess.get_inputs()}
            worst = 0.0
            for b, s in SHAPES:
                a = inputs(b, s, seed=s)
                feed = {"q": a["q"], "k": a["k"], "v": a["v"], "p": a[pk]}
                got = sess.run(None, {n: x for n, x in feed.items() if n in used})
                worst = max(worst, error(got, leaves(fn(a["q"], a["k"], a["v"], a[pk]))))
            nodes = len(model.graph.node)
            out.append(
                {
                    "name": name,
                    "mode": "symbolic",
                    "passed": worst <= TOL,
                    "detail": f"ONNX model of {nodes} nodes, run at (batch, seq) {SHAPES}: "
                    f"max error {worst:.2g}",
                }
            )
        except Exception as ex:
            out.append({"name": name, "mode": "symbolic", "passed": False, "detail": why(ex)})
    return out


def _rotary_embedding_model(
    head_dim: int, rotary_dim: int, interleaved: bool, base: float, heads: int, *, caches: bool
) -> Any:
    """X ``(B, H, S, D)`` and position ids ``(B, S)`` through ``RotaryEmbedding`` (opset 23); its
    cos/sin caches computed in the graph (``caches=False``: Hugging Face's float32 recipe up to
    the largest position), or given as inputs ``cos_cache``/``sin_cache`` (``caches=True``)."""
    from onnx import TensorProto as T
    from onnx import helper

    r = rotary_dim
    nodes = []
    inputs = [
        helper.make_tensor_value_info("X", T.FLOAT, ["B", heads, "S", head_dim]),
        helper.make_tensor_value_info("position_ids", T.INT64, ["B", "S"]),
    ]
    if caches:
        inputs += [
            helper.make_tensor_value_info("cos_cache", T.FLOAT, ["P", r // 2]),
            helper.make_tensor_value_info("sin_cache", T.FLOAT, ["P", r // 2]),
        ]
    else:
        exps = np.arange(0, r, 2, dtype=np.float32) / np.float32(r)

        def const(name: str, dtype: int, dims: list[int], vals: Any) -> Any:
            return helper.make_node(
                "Constant", [], [name], value=helper.make_tensor(name + "_v", dtype, dims, vals)
            )

        nodes += [
            const("exps", T.FLOAT, [r // 2], exps),
            const("base", T.FLOAT, [], [base]),
            helper.make_node("Pow", ["base", "exps"], ["pw"]),
            helper.make_node("Reciprocal", ["pw"], ["inv"]),  # 1 / base**(2i/r), float32
            const("one", T.INT64, [], [1]),
            const("zero", T.INT64, [], [0]),
            helper.make_node("ReduceMax", ["position_ids"], ["pmax"], keepdims=0),
            helper.make_node("Add", ["pmax", "one"], ["npos"]),
            helper.make_node("Range", ["zero", "npos", "one"], ["t"]),
            helper.make_node("Cast", ["t"], ["tf"], to=T.FLOAT),
            const("axis1", T.INT64, [1], [1]),
            helper.make_node("Unsqueeze", ["tf", "axis1"], ["tcol"]),
            helper.make_node("Mul", ["tcol", "inv"], ["freqs"]),  # float32 angles
            helper.make_node("Cos", ["freqs"], ["cos_cache"]),
            helper.make_node("Sin", ["freqs"], ["sin_cache"]),
        ]
    nodes.append(
        helper.make_node(
            "RotaryEmbedding",
            ["X", "cos_cache", "sin_cache", "position_ids"],
            ["Y"],
            interleaved=int(interleaved),
            rotary_embedding_dim=r,
        )
    )
    graph = helper.make_graph(
        nodes, "rope", inputs, [helper.make_tensor_value_info("Y", T.FLOAT, ["B", heads, "S", head_dim])]
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])


def run_rotary_embedding() -> list[dict[str, Any]]:
    """The ONNX ``RotaryEmbedding`` operator against rotary, both layouts, whole and partial
    rotary: per case, the worst error relative to the data and its tolerance."""
    try:
        import onnx
        import onnxruntime as ort
    except ImportError as e:
        return [{"name": "ONNX RotaryEmbedding", "passed": None, "detail": f"not installed ({e.name})"}]
    out = []
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 4, 7, 64)).astype(np.float32)
    pos = np.stack([np.arange(7) + 5, np.arange(7) * 300 + 1000]).astype(np.int64)
    eps32 = 2.0**-23
    allowance = 8 * eps32 + 2 * eps32 * float(pos.max())  # the float32 recipe's, as check_rope
    for interleaved in (False, True):
        for rd in (64, 32):
            layout = "interleaved" if interleaved else "half"
            f32 = rotary.RoPE(64, rotary_dim=rd, layout=layout, angles="float32")
            exact = rotary.RoPE(64, rotary_dim=rd, layout=layout)
            want32 = f32.rotate(x, pos[:, None, :])
            truth = exact.rotate(x.astype(np.float64), pos[:, None, :])
            case = f"interleaved={int(interleaved)}, rotary_embedding_dim={rd}"
            try:
                m = _rotary_embedding_model(64, rd, interleaved, 10000.0, 4, caches=False)
                onnx.checker.check_model(m)
                s = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
                y = s.run(None, {"X": x, "position_ids": pos})[0]
                e1, e2 = error([y], [want32]), error([y], [truth])
                out.append(
                    {
                        "name": f"ONNX RotaryEmbedding, its own float32 cos/sin ({case})",
                        "passed": e1 <= allowance and e2 <= allowance,
                        "detail": f"against rotary's float32 recipe {e1:.2g}, against exact angles {e2:.2g} "
                        f"(the recipe's allowance at position {pos.max()}: {allowance:.2g})",
                    }
                )
                m2 = _rotary_embedding_model(64, rd, interleaved, 10000.0, 4, caches=True)
                s2 = ort.InferenceSession(m2.SerializeToString(), providers=["CPUExecutionProvider"])
                c, sn = f32.cos_sin(np.arange(pos.max() + 1))
                c, sn = c[:, : rd // 2], sn[:, : rd // 2]
                y2 = s2.run(None, {"X": x, "position_ids": pos, "cos_cache": c, "sin_cache": sn})[0]
                e3 = error([y2], [want32])
                out.append(
                    {
                        "name": f"ONNX RotaryEmbedding, rotary's cos/sin ({case})",
                        "passed": e3 <= 4 * eps32,
                        "detail": f"against rotary's rotation {e3:.2g} (tolerance 4 float32 ulps)",
                    }
                )
            except Exception as ex:
                out.append({"name": f"ONNX RotaryEmbedding ({case})", "passed": False, "detail": why(ex)})
    return out
