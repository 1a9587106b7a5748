"""The conformance suite: one table of checks, run for every installed backend and dtype.

Each column of the report is a :class:`Column` of :class:`Sub` checks.  A sub-check
names the public ``rotary`` attributes it needs (``requires``); when one is missing
from the installed ``rotary`` it is reported as *not available*, never as failed or
silently skipped.  A sub-check is either

* an *equivalence* check: a function of a :class:`Target` returning arrays, run once on
  the backend in the dtype and once on NumPy float64 with the same (rounded) inputs;
  the error is ``max |out - ref| / (eps(dtype) * max(1, |ref|))``, in ulps of the dtype
  (``eps`` = spacing at 1.0); or
* a *custom* check returning ``(max_ulps, tol_ulps, message)`` (check_rope, golden vectors).
"""

from __future__ import annotations

import dataclasses
import math
import time
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np

import rotary
from rotary.testing import Backend, available, check_rope, eps, to_numpy

__all__ = ["COLUMNS", "Cell", "Column", "Sub", "Target", "run_backend", "run_invariants"]


# -- targets: where a check's inputs live ---------------------------------------------------
class Target:
    """Builds a check's inputs on one backend in one dtype, or (``oracle=True``) the same
    rounded values as NumPy float64 arrays."""

    def __init__(self, backend: Backend, dtype: str, oracle: bool = False) -> None:
        self.backend, self.dname, self.oracle = backend, dtype, oracle
        if oracle:
            import array_api_compat.numpy as npx

            self.xp, self.device, self.dtype = npx, None, np.float64
        else:
            self.xp, self.device, self.dtype = backend.xp, backend.device, backend.dtype(dtype)
        self._int = _default_int(backend)

    def x(self, host: Any) -> Any:
        """Float data in the checked dtype (the oracle gets the same rounded values in float64)."""
        a = self.backend.asarray(np.asarray(host, dtype=np.float64), self.dname)
        return np.asarray(to_numpy(a), dtype=np.float64) if self.oracle else a

    def pos(self, host: Any) -> Any:
        """Integer positions (the backend's default integer dtype)."""
        h = np.asarray(host, dtype=np.int64)
        return h if self.oracle else self.backend.asarray(h, self._int)

    def fpos(self, host: Any) -> Any:
        """Floating positions: float64 where the backend has it, else float32 (values chosen exact)."""
        h = np.asarray(host, dtype=np.float64)
        if self.oracle:
            return h
        return self.backend.asarray(h, "float64" if self.backend.float64 else "float32")


def _default_int(b: Backend) -> str:
    try:
        dt = b.xp.__array_namespace_info__().default_dtypes(device=b.device)["integral"]
        return "int64" if "64" in str(dt) else "int32"
    except Exception:
        return "int64" if b.float64 else "int32"


# -- the table ------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Sub:
    """One sub-check of a column."""

    name: str
    requires: tuple[str, ...]
    fn: Callable[..., Any]
    tol_ulps: float = 8.0
    custom: bool = False
    #: Extra tolerance (ulps of float32 angles at this position) on backends without float64.
    f32_angle_pos: float = 0.0
    #: Measure errors in ulps of this dtype when it is coarser than the checked one (a float32 recipe).
    coarsest: str | None = None


@dataclasses.dataclass(frozen=True)
class Column:
    key: str
    label: str
    description: str
    subs: tuple[Sub, ...]


def _has(path: str) -> bool:
    obj: Any = rotary
    for part in path.split("."):
        if not hasattr(obj, part):
            return False
        obj = getattr(obj, part)
    return True


def _rng(name: str) -> np.random.Generator:
    return np.random.default_rng(sum(map(ord, name)) * 7919)


_POS8 = [0, 1, 2, 3, 100, 4095, 4096, 2**20 + 3]


def _apply(T: Target) -> list:
    r = _rng("apply")
    q, k = T.x(r.normal(size=(2, 4, 8, 16))), T.x(r.normal(size=(2, 2, 8, 16)))
    out = []
    for layout in ("half", "interleaved"):
        out += rotary.apply(q, k, T.pos(_POS8), layout=layout)
    out += rotary.apply(q[:, :, :1, ...], k, T.pos([5000]), k_pos=T.pos(_POS8))
    return out


def _rotate(T: Target) -> list:
    r = _rng("rotate")
    x = T.x(r.normal(size=(3, 8, 16)))
    fpos = [0.5, 1.25, 2.75, 1000.125, 4096.5, -3.5, 65536.25, 7.0]
    return [
        rotary.rotate(x, T.pos(_POS8), rotary_dim=8, layout="interleaved"),
        rotary.rotate(x, T.fpos(fpos), base=500000.0),
        rotary.rotate(x[0, 0, ...], 123_457),
    ]


def _rope(T: Target) -> list:
    r = _rng("RoPE")
    rope = rotary.RoPE(16, base=1e6, layout="interleaved", rotary_dim=12)
    q, k = T.x(r.normal(size=(2, 8, 3, 16))), T.x(r.normal(size=(2, 8, 1, 16)))
    pos = T.pos(_POS8)[:, None]  # (batch, seq, heads, dim) layout
    qr, kr = rope.apply(q, k, pos, k_pos=T.pos(np.arange(8) + 10)[:, None])
    c, s = rope.cos_sin(T.pos(_POS8), xp=T.xp, device=T.device, dtype=T.dtype, full=True)
    return [qr, kr, rope.rotate(q, pos), c, s]


def _rope_f32(T: Target) -> list:
    r = _rng("RoPE_f32")
    rope = rotary.RoPE(16, angles="float32")
    x = T.x(r.normal(size=(2, 8, 16)))
    return [rope.rotate(x, T.pos(np.arange(8) * 37))]


_SCALINGS: dict[str, dict[str, Any]] = {
    "linear": {"rope_type": "linear", "factor": 4.0},
    "ntk": {"rope_type": "ntk", "factor": 4.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 32},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32},
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "original_max_position_embeddings": 64,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
    },
    "longrope": {
        "rope_type": "longrope",
        "short_factor": [1.0, 1.1, 1.2, 1.5, 2.0, 3.0, 4.0, 5.0],
        "long_factor": [1.0, 1.5, 2.0, 3.0, 5.0, 8.0, 12.0, 16.0],
        "original_max_position_embeddings": 32,
        "factor": 4.0,
    },
    "factors": {"rope_type": "factors", "factors": [1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 8.0, 8.0]},
}


def _scaling_available(rope_type: str) -> bool:
    try:
        rotary.scaling.from_dict(_SCALINGS[rope_type])
    except ValueError as e:
        if "unknown" in str(e):
            return False
    except Exception:
        pass  # a known type that fails to build: the check will report the error
    return True


def _scaling_fn(rope_type: str) -> Callable[[Target], list]:
    def fn(T: Target) -> list:
        r = _rng("scaling" + rope_type)
        q, k = T.x(r.normal(size=(2, 2, 6, 16))), T.x(r.normal(size=(2, 2, 6, 16)))
        sc = _SCALINGS[rope_type]
        out = list(rotary.apply(q, k, T.pos([0, 1, 7, 31, 32, 80]), scaling=sc))
        out += rotary.apply(q, k, T.pos([0, 1, 2, 3, 4, 5]), scaling=sc, layout="interleaved")
        return out

    return fn


def _from_hf(T: Target) -> list:
    cfg = {
        "hidden_size": 128,
        "num_attention_heads": 4,
        "head_dim": 32,
        "partial_rotary_factor": 0.5,
        "max_position_embeddings": 256,
        "rope_theta": 500000.0,
        "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
    }
    rope = rotary.RoPE.from_hf(cfg)
    r = _rng("from_hf")
    x = T.x(r.normal(size=(1, 2, 8, 32)))
    return [rope.rotate(x, T.pos([*_POS8[:7], 200]))]


def _convert_layout(T: Target) -> list:
    r = _rng("convert_layout")
    x = T.x(r.normal(size=(3, 16)))
    w = T.x(r.normal(size=(2 * 16, 5)))  # (out, in): two heads of 16 output rows
    a = rotary.convert_layout(x, "interleaved", "half")
    b = rotary.convert_layout(w, "half", "interleaved", axis=0, head_dim=16, rotary_dim=8)
    return [a, b, rotary.convert_layout(a, "half", "interleaved")]


def _axial(T: Target) -> list:
    r = _rng("axial")
    rope = rotary.AxialRoPE(16, n_axes=2, layout="interleaved")
    rows, cols = np.meshgrid(np.arange(3), np.arange(4) * 100, indexing="ij")
    pos = T.pos(np.stack([rows, cols], axis=-1).reshape(12, 2))
    return [rope.rotate(T.x(r.normal(size=(2, 12, 16))), pos)]


def _mrope(T: Target) -> list:
    r = _rng("mrope")
    out = []
    p = np.arange(6)
    pos = T.pos(np.stack([p, p // 2 + 1000, p % 3])[:, None, None, :])
    q = T.x(r.normal(size=(1, 2, 6, 16)))
    # Qwen2-VL-style consecutive sections, and Qwen3-VL-style round robin (T H W T H W T H).
    for sections, interleaved in (((2, 3, 3), False), ((3, 3, 2), True)):
        rope = rotary.MRoPE(16, sections=sections, interleaved=interleaved)
        out += rope.apply(q, q, pos)
    return out


def _attention(T: Target) -> list:
    r = _rng("attention")
    q, k = T.x(r.normal(size=(2, 2, 8, 16))), T.x(r.normal(size=(2, 2, 8, 16)))
    v = T.x(r.normal(size=(2, 2, 8, 12)))
    pos = T.pos(np.arange(8) + 1000)
    rope = rotary.RoPE(16, layout="interleaved")
    return [rotary.attention(q, k, v, pos, causal=True), rotary.attention(q, k, v, pos, rope=rope)]


def _linear_attention(T: Target) -> list:
    r = _rng("linear_attention")
    q, k = T.x(r.normal(size=(2, 2, 10, 16))), T.x(r.normal(size=(2, 2, 10, 16)))
    v = T.x(r.normal(size=(2, 2, 10, 12)))
    pos = T.pos(np.arange(10) * 7)
    return [
        rotary.linear_attention(q, k, v, pos),
        rotary.linear_attention(q, k, v, pos, causal=True, chunk_size=3),
    ]


def _linear_attention_state(T: Target) -> list:
    """Decoding in two pieces with a carried state, and states of disjoint key sets combined."""
    r = _rng("linear_attention_state")
    q, k = T.x(r.normal(size=(2, 10, 16))), T.x(r.normal(size=(2, 10, 16)))
    v = T.x(r.normal(size=(2, 10, 12)))
    p = np.arange(10) + 100
    first, state = rotary.linear_attention(
        q[:, :6, ...], k[:, :6, ...], v[:, :6, ...], T.pos(p[:6]), causal=True, return_state=True
    )
    second = rotary.linear_attention(
        q[:, 6:, ...], k[:, 6:, ...], v[:, 6:, ...], T.pos(p[6:]), causal=True, state=state
    )
    a = rotary.linear_attention_state(k[:, :4, ...], v[:, :4, ...], T.pos(p[:4]))
    b = rotary.linear_attention_state(k[:, 4:, ...], v[:, 4:, ...], T.pos(p[4:]))
    both = rotary.combine(a, b)
    return [first, second, *(Exempt(t) for t in (state.S, state.z, both.S, both.z))]


@dataclasses.dataclass(frozen=True)
class Exempt:
    """An output whose dtype may be wider than the input's (running sums kept in float32 or more)."""

    a: Any


def _decay(T: Target) -> list:
    return [rotary.decay_bound(T.x(np.arange(0, 257, 8)), 64)]


def _learned(T: Target) -> list:
    r = _rng("learned")
    q, k = T.x(r.normal(size=(2, 3, 8, 16))), T.x(r.normal(size=(2, 3, 8, 16)))
    f1 = T.x(r.uniform(0.001, 1.0, size=8))  # trained frequencies, 1-D
    f2 = T.x(r.uniform(-1.0, 1.0, size=(3, 1, 2, 8)))  # per head, mixed 2-D (RoPE-Mixed)
    grid = T.pos(np.stack(np.meshgrid(np.arange(2), np.arange(4), indexing="ij"), -1).reshape(8, 2))
    out = list(rotary.learned.apply(q, k, T.pos(np.arange(8) * 3), f1, layout="interleaved"))
    out += list(rotary.learned.apply(q, k, T.pos(np.arange(8)), f1, xpos_scale_base=64.0))
    out.append(rotary.learned.rotate(q, grid, f2))
    return out


def _xpos_relative(b: Backend, dtype: str) -> tuple[float, float, str]:
    """xPos keeps the relative-position identity: shifting every position of q and k leaves
    ``q_m . k_n`` unchanged (the rotation and the scale ``zeta**((m - n) / scale_base)`` both
    depend on ``m - n`` only)."""
    T = Target(b, dtype)
    r = _rng("xpos")
    q, k = T.x(r.normal(size=(2, 6, 16))), T.x(r.normal(size=(2, 6, 16)))
    f = T.x(rotary.inv_freq(16, 10000.0))
    xp = b.xp
    scores = []
    for shift in (0, 17, 100):
        qr, kr = rotary.learned.apply(q, k, T.pos(np.arange(6) + shift), f, xpos_scale_base=64.0)
        scores.append(np.asarray(to_numpy(xp.matmul(qr, xp.matrix_transpose(kr))), dtype=np.float64))
    scale = max(1.0, float(np.max(np.abs(scores[0]))))
    worst = max(float(np.max(np.abs(s - scores[0]))) for s in scores[1:]) / (eps(dtype) * scale)
    # angles of positions up to 105 in the compute dtype (float32 at least) and sums over 16 features
    tol = 64.0 + 105 * 2.0**-23 / eps(dtype) * 16
    return worst, tol, "" if worst <= tol else f"scores moved by {worst:.3g} ulps under a shift"


def _check_layout(layout: str) -> Callable[[Backend, str], tuple[float, float, str]]:
    def fn(b: Backend, dtype: str) -> tuple[float, float, str]:
        def rot(x: Any, pos: Any) -> Any:
            if b.readonly and hasattr(x, "setflags"):
                x.setflags(write=False)  # NumPy read-only inputs
            return rotary.rotate(x, pos, layout=layout)

        rep = check_rope(rot, layout=layout, xp=b.xp, device=b.device, dtype=b.dtype(dtype), angle_eps=0.0)
        numeric = [r for r in rep if r.tol > 0]
        worst = max((r.ulps for r in numeric), default=0.0)
        tol = max((r.tol / eps(dtype) for r in numeric), default=0.0)
        msg = "; ".join(f"{r.name}: {r.message}" for r in rep if not r.passed)
        return worst, tol, msg

    return fn


def _golden(b: Backend, dtype: str) -> tuple[float, float, str]:
    from . import vectors

    T = Target(b, dtype)
    worst, worst_tol, msgs = 0.0, _GOLDEN_TOL, []
    for case in vectors.load():
        pos = T.fpos(case["pos"]) if case["pos"].dtype.kind == "f" else T.pos(case["pos"])
        out = rotary.rotate(
            T.x(case["x"]),
            pos,
            layout=case["layout"],
            base=case["base"],
            rotary_dim=case["rotary_dim"],
            scaling=case.get("scaling"),
        )
        ref = case["out"]
        err = np.abs(to_numpy(out).astype(np.float64) - ref) / (eps(dtype) * np.maximum(1.0, np.abs(ref)))
        err = np.where(np.isfinite(err), err, np.inf)
        tol = np.full(err.shape, _GOLDEN_TOL)
        k = int(np.argmax(err / tol))
        e, t = float(err.reshape(-1)[k]), float(np.broadcast_to(tol, err.shape).reshape(-1)[k])
        if not np.all(err <= tol):
            msgs.append(f"{case['name']}: {e:.3g} ulps > {t:.3g}")
        if e / t > worst / worst_tol:
            worst, worst_tol = e, t
    return worst, worst_tol, "; ".join(msgs)


#: rotary's error bound against the float64 definition, in ulps of the dtype (relative to
#: max(1, |ref|)): cos/sin are put together from up to 3 correctly rounded digit tables and a
#: fractional part (a few ulps each), then the rotation adds two products and a sum, so a
#: rotated feature is within ~2 x 5 ulps; 16 leaves no room for a wrong angle (one ulp of
#: angle at position 2**20 is already ~2**20 ulps of output).  Exact angles: no allowance
#: grows with the position.
_GOLDEN_TOL = 16.0

COLUMNS: tuple[Column, ...] = (
    Column(
        "check_half",
        "chk:half",
        "check_rope(rotary.rotate, layout='half', angle_eps=0): every property",
        (Sub("check_rope_half", ("rotate", "testing.check_rope"), _check_layout("half"), custom=True),),
    ),
    Column(
        "check_interleaved",
        "chk:intl",
        "check_rope(..., layout='interleaved', angle_eps=0)",
        (
            Sub(
                "check_rope_interleaved",
                ("rotate", "testing.check_rope"),
                _check_layout("interleaved"),
                custom=True,
            ),
        ),
    ),
    Column(
        "apply",
        "apply",
        "rotary.apply: both layouts, GQA, k_pos, positions up to 2**20",
        (Sub("apply", ("apply",), _apply),),
    ),
    Column(
        "rotate",
        "rotate",
        "rotary.rotate: partial rotary, fractional positions, one vector",
        (Sub("rotate", ("rotate",), _rotate),),
    ),
    Column(
        "RoPE",
        "RoPE",
        "rotary.RoPE: apply/rotate/cos_sin, rotary_dim, base 1e6",
        (Sub("RoPE", ("RoPE",), _rope),),
    ),
    Column(
        "RoPE_f32",
        "RoPE:f32",
        "RoPE(angles='float32'): the float32 (HF) recipe vs NumPy's (in float32 ulps at least)",
        (Sub("RoPE_float32", ("RoPE",), _rope_f32, coarsest="float32"),),
    ),
    Column(
        "scaling",
        "scaling",
        "every scaling (HF rope_scaling dicts) through rotary.apply",
        tuple(
            Sub(
                f"scaling:{t}",
                (f"scaling:{t}",),
                _scaling_fn(t),
                f32_angle_pos=80.0 if t == "dynamic" else 0.0,
            )
            for t in _SCALINGS
        ),
    ),
    Column(
        "from_hf",
        "from_hf",
        "RoPE.from_hf(config dict): yarn, partial rotary",
        (Sub("RoPE.from_hf", ("RoPE.from_hf",), _from_hf),),
    ),
    Column(
        "convert_layout",
        "layout",
        "rotary.convert_layout: activations and q/k weights (exact)",
        (Sub("convert_layout", ("convert_layout",), _convert_layout, tol_ulps=0.0),),
    ),
    Column(
        "multi_axis",
        "multiax",
        "rotary.AxialRoPE (2-D) and rotary.MRoPE (sections, interleaved)",
        (Sub("AxialRoPE", ("AxialRoPE",), _axial), Sub("MRoPE", ("MRoPE",), _mrope)),
    ),
    Column(
        "learned",
        "learned",
        "rotary.learned: trained 1-D and per-head mixed 2-D frequencies, xPos; xPos's "
        "relative-position identity (scores unchanged by a shift of every position)",
        (
            Sub("learned", ("learned",), _learned, tol_ulps=64.0, f32_angle_pos=24.0),
            Sub("xpos_relative", ("learned",), _xpos_relative, custom=True),
        ),
    ),
    Column(
        "attention",
        "attn",
        "rotary.attention: causal and full softmax attention with RoPE",
        (Sub("attention", ("attention",), _attention, tol_ulps=16.0),),
    ),
    Column(
        "linear_attention",
        "linattn",
        "rotary.linear_attention: non-causal, chunked causal, decoding state, combine",
        (
            Sub("linear_attention", ("linear_attention",), _linear_attention, tol_ulps=32.0),
            Sub(
                "linear_attention_state",
                ("linear_attention", "linear_attention_state", "combine"),
                _linear_attention_state,
                tol_ulps=32.0,
            ),
        ),
    ),
    Column(
        "decay_bound",
        "decay",
        "rotary.decay_bound(distances 0..256, d=64)",
        (Sub("decay_bound", ("decay_bound",), _decay, tol_ulps=16.0),),
    ),
    Column(
        "golden",
        "golden",
        "rotary.rotate on the golden vectors (float64 matrix form)",
        (Sub("golden", ("rotate",), _golden, custom=True),),
    ),
)


def sub_available(sub: Sub) -> bool:
    for req in sub.requires:
        if req.startswith("scaling:"):
            if not _scaling_available(req.split(":", 1)[1]):
                return False
        elif not _has(req):
            return False
    return True


# -- running --------------------------------------------------------------------------------
@dataclasses.dataclass
class Cell:
    """The result of one column for one backend and dtype."""

    backend: str
    dtype: str
    column: str
    status: str  # "pass", "fail" or "n/a"
    ulps: float = 0.0
    tol_ulps: float = 0.0
    message: str = ""
    missing: tuple[str, ...] = ()
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        for k in ("ulps", "tol_ulps"):
            if not math.isfinite(d[k]):
                d[k] = str(d[k])
        d["missing"] = list(self.missing)
        return d


def _ulps(out: np.ndarray, ref: np.ndarray, dtype: str) -> float:
    a = np.asarray(out, dtype=np.float64)
    r = np.asarray(ref, dtype=np.float64)
    if a.shape != r.shape:
        raise ValueError(f"shape {a.shape} differs from the reference's {r.shape}")
    if a.size == 0:
        return 0.0
    err = np.abs(a - r) / (eps(dtype) * np.maximum(1.0, np.abs(r)))
    err = np.where(np.isnan(err) & ~(np.isnan(a) & np.isnan(r)), np.inf, err)
    return float(np.nanmax(err))


def _dtype_name(x: Any) -> str:
    return str(x.dtype).rsplit(".", 1)[-1].replace("dtype('", "").replace("')", "")


def _run_sub(sub: Sub, b: Backend, dtype: str) -> tuple[float, float, str]:
    if sub.custom:
        return sub.fn(b, dtype)
    outs = sub.fn(Target(b, dtype))
    refs = sub.fn(Target(b, dtype, oracle=True))
    tol = sub.tol_ulps
    unit = dtype
    if sub.coarsest is not None and eps(sub.coarsest) > eps(dtype):
        unit = sub.coarsest
    if sub.f32_angle_pos and not b.float64:
        tol += 2.0 * sub.f32_angle_pos * eps("float32") / eps(dtype)
    worst, msgs = 0.0, []
    kind = type(Target(b, dtype).x([0.0]))
    for i, (o, r) in enumerate(zip(outs, refs)):
        exempt = isinstance(o, Exempt)
        if exempt:
            o, r = o.a, r.a
        if type(o) is not kind:
            msgs.append(f"output {i} is a {type(o).__module__}.{type(o).__name__}, not a {kind.__name__}")
        elif _dtype_name(o) != dtype and not (exempt and eps(_dtype_name(o)) <= eps(dtype)):
            msgs.append(f"output {i} has dtype {_dtype_name(o)}, expected {dtype}")
        worst = max(worst, _ulps(to_numpy(o), to_numpy(r), unit))
    if worst > tol:
        msgs.insert(0, f"{sub.name}: {worst:.3g} ulps > {tol:.3g}")
    return worst, tol, "; ".join(msgs)


def run_column(col: Column, b: Backend, dtype: str) -> Cell:
    t0 = time.perf_counter()
    avail = [s for s in col.subs if sub_available(s)]
    missing = tuple(s.name for s in col.subs if s not in avail)
    if not avail:
        return Cell(b.name, dtype, col.key, "n/a", missing=missing, message="not available in this rotary")
    worst, tol, msgs = 0.0, 0.0, []
    for s in avail:
        try:
            u, t, m = _run_sub(s, b, dtype)
        except Exception as e:
            tb = traceback.extract_tb(e.__traceback__)[-1]
            u, t, m = (
                math.inf,
                s.tol_ulps,
                f"{s.name} raised {type(e).__name__}: {e} ({tb.filename.rsplit('/', 1)[-1]}:{tb.lineno})",
            )
        if (u / t if t else (0.0 if u == 0 else math.inf)) >= (
            worst / tol if tol else 0.0
        ) or not math.isfinite(u):
            worst, tol = u, t
        if m:
            msgs.append(m)
    status = "fail" if msgs else "pass"
    return Cell(
        b.name, dtype, col.key, status, worst, tol, "; ".join(msgs), missing, time.perf_counter() - t0
    )


def run_backend(b: Backend, dtypes: list[str] | None = None) -> list[Cell]:
    """Every column for every float dtype of backend ``b`` (each ``n/a``, saying why, where rotary
    does not run on it: an array API standard version older than rotary's oldest)."""
    cells = []
    why = b.unsupported()
    if why is not None:
        return [
            Cell(b.name, d, col.key, "n/a", message=why) for d in dtypes or ["float32"] for col in COLUMNS
        ]
    for dtype in dtypes or b.float_dtypes():
        for col in COLUMNS:
            cells.append(run_column(col, b, dtype))
    return cells


# -- backend-independent invariants -----------------------------------------------------------
def run_invariants() -> list[dict[str, Any]]:
    """Checks that do not depend on a backend: the golden vectors against a fresh float64
    computation, NumPy float64 against the matrix form, ``inv_freq``, onnxruntime's
    ``RotaryEmbedding`` operator (both layouts, partial rotary), and the decay bound."""
    from rotary.testing import reference

    from . import vectors

    out = []
    res = vectors.verify()
    bad = [r for r in res if not r["passed"]]
    out.append(
        {
            "name": "golden vectors == fresh float64 computation",
            "passed": not bad,
            "detail": f"{len(res)} cases, max {max(r['max_ulps'] for r in res):.3g} float64 ulps, checksums "
            + ("ok" if not bad else "; ".join(f"{r['name']}: {r['message']}" for r in bad)),
        }
    )
    out.append(_apply_matrix_form())
    th_err = max(
        float(np.max(np.abs(rotary.inv_freq(d, b) - reference.theta(d, b)) / reference.theta(d, b)))
        for d in (2, 8, 64, 128, 256)
        for b in (10.0, 10000.0, 500000.0, 1e6)
    )
    out.append(
        {
            "name": "inv_freq == the float64 definition base**(-2i/d)",
            "passed": th_err <= 2.0**-52,
            "detail": f"max relative difference {th_err:.2g}",
        }
    )
    from .onnx import run_rotary_embedding

    out += run_rotary_embedding()  # the ONNX standard's operator, an independent oracle
    if not _has("decay_bound"):
        out.append({"name": "decay_bound", "passed": None, "detail": "not available in this rotary"})
        return out
    d = np.arange(0, 257)
    v = np.asarray(rotary.decay_bound(d, 128), dtype=np.float64)
    direct = direct_decay(d, 128)
    err = float(np.max(np.abs(v - direct) / np.maximum(1.0, direct)))
    out.append(
        {
            "name": "decay_bound == direct float64 summation (d=128, 0..256)",
            "passed": err < 1e-12,
            "detail": f"max relative error {err:.2e}",
        }
    )
    trend = decay_trend(v)
    out.append(
        {
            "name": "decay_bound decreases in trend (d=128, 0..256)",
            "passed": trend["passed"],
            "detail": trend["detail"],
        }
    )
    return out


def _apply_matrix_form() -> dict[str, Any]:
    """rotary.apply and RoPE on NumPy float64 against the float64 matrix form: the equivalence
    columns compare backends with NumPy, this pins NumPy itself to the definition."""
    from rotary.testing import reference

    r = _rng("matrix")
    q, k = r.normal(size=(2, 3, 8, 16)), r.normal(size=(2, 3, 8, 16))
    worst, tol_at = 0.0, 0.0
    for layout in ("half", "interleaved"):
        for base, rd in ((10000.0, None), (1e6, 12)):
            qr, kr = rotary.apply(q, k, np.asarray(_POS8), layout=layout, base=base, rotary_dim=rd)
            rope = rotary.RoPE(16, base=base, layout=layout, rotary_dim=rd)
            for got, x in ((qr, q), (kr, k), (rope.rotate(q, np.asarray(_POS8)), q)):
                ref = reference.rotate(x, _POS8, layout=layout, base=base, rotary_dim=rd)
                err = np.abs(got - ref) / (eps("float64") * np.maximum(1.0, np.abs(ref)))
                tol = np.full(err.shape, _GOLDEN_TOL)
                k_ = int(np.argmax(err / tol))
                e, t = float(err.reshape(-1)[k_]), float(np.broadcast_to(tol, err.shape).reshape(-1)[k_])
                if e / t > (worst / tol_at if tol_at else -1):
                    worst, tol_at = e, t
    return {
        "name": "apply, RoPE (NumPy float64) == float64 matrix form",
        "passed": worst <= tol_at,
        "detail": f"max {worst:.3g} float64 ulps (tolerance there {tol_at:.3g})",
    }


def direct_decay(distances: np.ndarray, dim: int, base: float = 10000.0) -> np.ndarray:
    """``(1/(d/2)) sum_j |sum_{i<j} exp(1j r theta_i)|`` by explicit complex128 loops."""
    th = 1.0 / base ** (np.arange(0, dim, 2) / dim)
    out = []
    for r in np.asarray(distances).tolist():
        total, partial = 0.0, 0j
        for t in th:
            partial += complex(math.cos(r * t), math.sin(r * t))
            total += abs(partial)
        out.append(total / (dim // 2))
    return np.asarray(out)


def decay_trend(v: np.ndarray, windows: int = 8) -> dict[str, Any]:
    """ "Decreasing in trend": the means of ``windows`` consecutive equal windows of distances
    1..N are strictly decreasing, the value at 0 is the maximum, and Spearman's rank
    correlation with the distance is below -0.8."""
    v = np.asarray(v, dtype=np.float64)
    body = v[1 : 1 + windows * ((v.size - 1) // windows)].reshape(windows, -1).mean(axis=1)
    ranks = np.argsort(np.argsort(v))
    rho = float(np.corrcoef(np.arange(v.size), ranks)[0, 1])
    ok = bool(np.all(np.diff(body) < 0) and v[0] == v.max() and rho < -0.8)
    return {
        "passed": ok,
        "window_means": body.tolist(),
        "spearman": rho,
        "detail": f"window means {' > '.join(f'{m:.2f}' for m in body)}; Spearman rho {rho:.3f}",
    }


def backends(names: str | None = None) -> list[Backend]:
    return available(names)
