"""RoPE and linear attention as an ONNX model, no torch needed.

The same ``rotary`` code that rotates NumPy arrays builds an ONNX graph when it is given
symbolic ndonnx arrays: queries, keys and values of shape ``(batch, heads, seq, head_dim)`` with
``batch`` and ``seq`` dynamic, and positions ``(seq,)``.  The graph (Llama 3 scaled RoPE, then
RoFormer's causal linear attention with RoPE) is saved as ``rope_linear_attention.onnx`` and run
in onnxruntime at three sequence lengths against NumPy on the same inputs.

    python examples/onnx_model.py [--out DIR] [--head-dim 64] [--seqs 5,17,64]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import numpy as np

import rotary


def model_fn(rope: rotary.RoPE, q, k, v, pos):
    """Rotate queries and keys with ``rope``, then causal RoPE linear attention (its own RoPE)."""
    q, k = rope.apply(q, k, pos)
    return rotary.linear_attention(q, k, v, pos, causal=True)


def main(argv: list[str] | None = None) -> dict[int, float]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None, help="folder for the .onnx file (default: a new temporary folder)")
    p.add_argument("--head-dim", type=int, default=64, help="head dimension (even)")
    p.add_argument("--heads", type=int, default=4, help="attention heads")
    p.add_argument("--seqs", default="5,17,64", help="comma-separated sequence lengths to run the model at")
    args = p.parse_args(argv)
    try:
        import ndonnx as ndx
        import onnxruntime as ort
    except ImportError as e:  # the ndonnx extra installs both
        sys.exit(f"onnx_model.py needs {e.name}, not installed here: pip install '.[ndonnx]'")

    out = args.out or tempfile.mkdtemp(prefix="rotary-onnx-")
    os.makedirs(out, exist_ok=True)
    d, h = args.head_dim, args.heads
    rope = rotary.RoPE(d, base=500000.0, scaling=rotary.Llama3(8.0, 8192))

    # Symbolic inputs: "batch" and "seq" are dimensions of the ONNX model, sized at run time.
    inputs = {
        "q": ndx.argument(shape=("batch", h, "seq", d), dtype=ndx.float32),
        "k": ndx.argument(shape=("batch", h, "seq", d), dtype=ndx.float32),
        "v": ndx.argument(shape=("batch", h, "seq", d), dtype=ndx.float32),
        "pos": ndx.argument(shape=("seq",), dtype=ndx.int64),
    }
    y = model_fn(rope, **inputs)
    model = ndx.build(inputs, {"y": y})
    path = os.path.join(out, "rope_linear_attention.onnx")
    with open(path, "wb") as f:
        f.write(model.SerializeToString())
    print(f"saved {path}: {len(model.graph.node)} nodes, {os.path.getsize(path) / 1024:.1f} KiB")

    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    errors = {}
    for batch, seq in enumerate(int(s) for s in args.seqs.split(",")):
        q, k, v = (rng.standard_normal((batch + 1, h, seq, d)).astype(np.float32) for _ in range(3))
        pos = np.arange(seq, dtype=np.int64) + 100  # e.g. a chunk after 100 cached tokens
        (got,) = session.run(None, {"q": q, "k": k, "v": v, "pos": pos})
        want = model_fn(rope, q, k, v, pos)  # the same function on NumPy arrays
        errors[seq] = float(np.max(np.abs(got - want)))
        print(f"batch {batch + 1}, seq {seq:3d}: onnxruntime vs NumPy, max |difference| {errors[seq]:.2e}")
    print("torch imported:", "torch" in sys.modules)
    return errors


if __name__ == "__main__":
    main()
