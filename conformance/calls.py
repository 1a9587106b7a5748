"""Every public function of ``rotary`` as one call ``fn(q, k, v, pos)``, the inputs it takes and
the measure of error: what :mod:`conformance.libraries` runs on an array library the table does
not cover, and :mod:`conformance.onnx` on ndonnx's concrete and symbolic arrays."""

from __future__ import annotations

import traceback
from collections.abc import Callable
from typing import Any

import numpy as np

import rotary
from rotary import positions as P

__all__ = ["CALLS", "TOL", "D", "error", "inputs", "leaves", "run_calls", "why"]

D = 16
_ROPES: dict[str, rotary.RoPE] = {}


def _ropes() -> dict[str, Any]:
    if not _ROPES:
        _ROPES.update(
            {
                "yarn": rotary.RoPE(D, scaling=rotary.YaRN(factor=4.0, original_max_position_embeddings=8)),
                "llama3": rotary.RoPE(D, base=5e5, scaling=rotary.Llama3(8.0, 8)),
                "linear": rotary.RoPE(D, scaling=rotary.Linear(2.0)),
                "ntk": rotary.RoPE(D, scaling=rotary.NTK(2.0)),
                "dynamic": rotary.RoPE(D, scaling=rotary.DynamicNTK(2.0, 4)),
                "longrope": rotary.RoPE(D, scaling=rotary.LongRoPE((1.0,) * 8, (2.0,) * 8, 4, factor=4.0)),
                "float32 partial interleaved": rotary.RoPE(
                    D, angles="float32", layout="interleaved", rotary_dim=8
                ),
            }
        )
    return _ROPES


def _rope_call(name: str) -> Callable[..., Any]:
    return lambda q, k, v, p: _ropes()[name].apply(q, k, p)


#: Every public function as ``fn(q, k, v, pos)`` with the positions it takes: ``"seq"`` ``(S,)``,
#: ``"seq2"`` ``(S, 2)`` (axial), ``"rows"`` ``(3, S)`` (M-RoPE).
CALLS: dict[str, tuple[Callable[..., Any], str]] = {
    "apply": (lambda q, k, v, p: rotary.apply(q, k, p), "seq"),
    "rotate": (lambda q, k, v, p: rotary.rotate(q, p, layout="interleaved"), "seq"),
    **{
        f"RoPE {n}": (_rope_call(n), "seq")
        for n in ("yarn", "llama3", "linear", "ntk", "dynamic", "longrope")
    },
    "RoPE float32 partial interleaved": (_rope_call("float32 partial interleaved"), "seq"),
    "RoPE.cos_sin": (lambda q, k, v, p: _ropes()["yarn"].cos_sin(p, full=True), "seq"),
    "AxialRoPE": (lambda q, k, v, p: rotary.AxialRoPE(D, 2).apply(q, k, p), "seq2"),
    "MRoPE": (lambda q, k, v, p: rotary.MRoPE(D, (2, 3, 3)).apply(q, k, p), "rows"),
    "attention": (lambda q, k, v, p: rotary.attention(q, k, v, p, causal=True), "seq"),
    "linear_attention": (lambda q, k, v, p: rotary.linear_attention(q, k, v, p), "seq"),
    "linear_attention causal": (
        lambda q, k, v, p: rotary.linear_attention(q, k, v, p, causal=True, chunk_size=2),
        "seq",
    ),
    "linear_attention_state": (lambda q, k, v, p: rotary.linear_attention_state(k, v, p).S, "seq"),
    "convert_layout": (lambda q, k, v, p: rotary.convert_layout(q, "half", "interleaved"), "seq"),
    "positions.shift_keys": (lambda q, k, v, p: P.shift_keys(k, 3, _ropes()["yarn"]), "seq"),
    "positions.rerotate_keys": (
        lambda q, k, v, p: P.rerotate_keys(k, p, rotary.RoPE(D), rotary.RoPE(D, base=500.0)),
        "seq",
    ),
    "positions.from_attention_mask": (lambda q, k, v, p: P.from_attention_mask(p[None, :] >= 2), "seq"),
    "decay_bound": (lambda q, k, v, p: rotary.decay_bound(p, D), "seq"),
    "learned.rotate": (lambda q, k, v, p: rotary.learned.rotate(q, p, q[0, 0, 0, : D // 2] * 0 + 0.5), "seq"),
}


def inputs(batch: int, seq: int, seed: int = 0) -> dict[str, np.ndarray]:
    r = np.random.default_rng(seed)
    f32 = np.float32
    return {
        "q": r.standard_normal((batch, 4, seq, D)).astype(f32),
        "k": r.standard_normal((batch, 2, seq, D)).astype(f32),
        "v": r.standard_normal((batch, 2, seq, D)).astype(f32),
        "seq": np.arange(seq, dtype=np.int64) * 3 + 1,
        "seq2": np.stack([np.arange(seq), np.arange(seq) % 3], -1).astype(np.int64),
        "rows": np.stack([np.arange(seq), np.arange(seq) // 2, np.arange(seq) % 3]).astype(np.int64),
    }


def leaves(out: Any) -> list[Any]:
    if isinstance(out, (tuple, list)):
        return [y for o in out for y in leaves(o)]
    return [out]


def error(got: list[Any], want: list[Any]) -> float:
    """The worst error relative to the data's scale (as the kit measures), over every output."""
    e = 0.0
    for g, w in zip(got, want, strict=True):
        g64, w64 = np.asarray(g, dtype=np.float64), np.asarray(w, dtype=np.float64)
        if g64.shape != w64.shape:
            return float("inf")
        e = max(
            e,
            float(np.max(np.abs(g64 - w64), initial=0.0)) / max(1.0, float(np.max(np.abs(w64), initial=0.0))),
        )
    return e


#: The tolerance: float32 rounding of a few dozen operations (the NumPy result is float32 too).
TOL = 64 * 2.0**-23


def why(e: BaseException) -> str:
    tb = traceback.extract_tb(e.__traceback__)
    where = [f"{f.filename.rsplit('/', 1)[-1]}:{f.lineno}" for f in tb if "rotary" in f.filename][-2:]
    return f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''} {where}"


def run_calls(
    asarray: Callable[[np.ndarray], Any], mode: str = "concrete", names: tuple[str, ...] | None = None
) -> list[dict[str, Any]]:
    """Every call of :data:`CALLS` (or of ``names``) on arrays made by ``asarray`` from NumPy ones,
    against the same call on the NumPy arrays: ``{"name", "mode", "passed", "detail"}`` each."""
    from rotary.testing import to_numpy

    out = []
    a = inputs(2, 6)
    for name, (fn, pk) in CALLS.items():
        if names is not None and name not in names:
            continue
        want = leaves(fn(a["q"], a["k"], a["v"], a[pk]))
        try:
            args = [asarray(a[n]) for n in ("q", "k", "v", pk)]
            raw = leaves(fn(*args))
            kind = _kind_mismatch(raw, args[0])
            got = [to_numpy(x) for x in raw]
            e = error(got, want)
            passed = e <= TOL and kind is None
            detail = f"max error {e:.2g}" + ("" if kind is None else f"; {kind}")
            out.append({"name": name, "mode": mode, "passed": passed, "detail": detail})
        except Exception as ex:
            out.append({"name": name, "mode": mode, "passed": False, "detail": why(ex)})
    return out


def _kind_mismatch(outs: list[Any], like: Any) -> str | None:
    """Where an output is not an array of the input's type and namespace: what it is instead."""
    import array_api_compat

    want_ns = array_api_compat.array_namespace(like)
    for o in outs:
        if type(o) is not type(like):
            got, want = (f"{type(a).__module__}.{type(a).__name__}" for a in (o, like))
            return f"returned a {got} for {want} input"
        if array_api_compat.array_namespace(o) is not want_ns:
            return f"returned an array of namespace {array_api_compat.array_namespace(o).__name__}"
    return None
