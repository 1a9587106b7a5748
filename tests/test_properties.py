"""Differential properties: every backend, eager and traced, against the float64 oracle.

Hypothesis draws shapes, layouts, partial modes, data dtypes, position dtypes and extreme
position values (int32 and int64 limits, 2**31 .. 2**36, negative, fractional, positions held
in float16/bfloat16) and compares ``rotary.rotate`` on each backend (and under ``jax.jit``
and ``torch.compile``) with :mod:`rotary.testing.reference`.  This is the suite that catches
overflow and wrap-around in the angle code.

Few examples in the quick suite, more in the slow matrix (``pytest -m matrix``);
``ROTARY_HYPOTHESIS=long`` runs many more examples there.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rotary
from rotary.testing import assert_close, reference

LONG = os.environ.get("ROTARY_HYPOTHESIS", "") == "long"
EAGER = settings(
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    derandomize=not LONG,
)
#: Examples per backend: the quick suite's, and the slow matrix's.
EXAMPLES = [
    pytest.param(10, id="quick"),
    pytest.param(400 if LONG else 20, id="matrix", marks=pytest.mark.matrix),
]
TRACED = settings(max_examples=60 if LONG else 6, deadline=None, derandomize=not LONG)

#: Positions where angle code breaks: digit boundaries, int32/int64 limits, 2**36.
SPECIAL = [0, 1, -1, 2, 4095, 4096, 4097, 2**15, 2**24 - 1, 2**24 + 1, 2**31 - 1, -(2**31), 2**31, 2**32 + 5]
SPECIAL += [2**35 + 12345, 2**36 - 1, -(2**36 - 1), -(2**33) - 7]

#: Exclusive bound of |position| per position dtype (floats: so that rounding stays below 2**36).
_LIMITS = {"int8": 2**7, "int16": 2**15, "int32": 2**31, "int64": 2**36, "uint8": 2**8, "uint16": 2**16}
_LIMITS.update({"uint32": 2**32, "float16": 2**15, "bfloat16": 2**35, "float32": 2**35, "float64": 2**36})


@st.composite
def cases(draw: Any, backend: Any) -> dict[str, Any]:
    head_dim = draw(st.sampled_from([2, 4, 8, 16, 64]))
    layout = draw(st.sampled_from(["half", "interleaved"]))
    partial = draw(st.sampled_from(["whole", "neox", "proportional"]))
    rotary_dim = None
    if partial != "whole" and head_dim > 2:
        rotary_dim = 2 * draw(st.integers(1, head_dim // 2 - 1))
    dtype = draw(st.sampled_from(backend.float_dtypes()))
    pos_dtypes = ["int32", "float32", "list"]
    if backend.int64:
        pos_dtypes += ["int64", "uint32"]
    if backend.float64:
        pos_dtypes.append("float64")
    pos_dtypes += [
        d
        for d in ("float16", "bfloat16", "int8", "int16", "uint8")
        if d in backend.float_dtypes() or "int" in d
    ]
    pos_dtype = draw(st.sampled_from(pos_dtypes))
    lead = tuple(draw(st.lists(st.integers(1, 3), max_size=2)))
    n = draw(st.integers(1, 5))
    limit = _LIMITS.get(pos_dtype, 2**36 if backend.int64 else 2**31)
    lo = 0 if pos_dtype.startswith("uint") else -(limit - 1)
    ints = st.one_of(st.sampled_from([p for p in SPECIAL if lo <= p < limit]), st.integers(lo, limit - 1))
    if pos_dtype.startswith("float"):
        top = float(min(limit, 2**20))
        frac = st.floats(-top, top, allow_nan=False, allow_infinity=False, exclude_max=True, exclude_min=True)
        values = draw(st.lists(st.one_of(ints.map(float), frac), min_size=n, max_size=n))
    else:
        values = draw(st.lists(ints, min_size=n, max_size=n))
    return {
        "head_dim": head_dim,
        "layout": layout,
        "partial": "proportional" if partial == "proportional" else "neox",
        "rotary_dim": rotary_dim,
        "dtype": dtype,
        "pos_dtype": pos_dtype,
        "shape": (*lead, n, head_dim),
        "values": values,
        "seed": draw(st.integers(0, 2**16)),
    }


def _positions(backend: Any, case: dict[str, Any]) -> tuple[Any, np.ndarray]:
    """The positions as the backend holds them, and those held values in float64 (the oracle's)."""
    v = case["values"]
    if case["pos_dtype"] == "list":
        return [int(p) for p in v], np.asarray([int(p) for p in v], dtype=np.float64)
    if case["pos_dtype"] in ("int64", "uint32", "float64") or case["pos_dtype"].startswith(("int", "uint")):
        host = np.asarray(v).astype(case["pos_dtype"])
    else:
        host = np.asarray(v, dtype=np.float64)
        if case["pos_dtype"] == "float32":
            host = host.astype(np.float32)
    p = backend.asarray(host, case["pos_dtype"])
    return p, np.asarray(backend.to_numpy(p), dtype=np.float64)


def _oracle(x: np.ndarray, held: np.ndarray, case: dict[str, Any]) -> np.ndarray:
    d, r = case["head_dim"], case["rotary_dim"]
    if case["partial"] == "proportional" and r is not None:
        th = np.concatenate([reference.theta(d)[: r // 2], np.zeros(d // 2 - r // 2)])
        return reference.rotate(x, held, layout=case["layout"], th=th)
    return reference.rotate(x, held, layout=case["layout"], rotary_dim=r)


def _run(backend: Any, case: dict[str, Any], fn: Any = None) -> None:
    rng = np.random.default_rng(case["seed"])
    x = backend.asarray(rng.uniform(-2, 2, size=case["shape"]), case["dtype"])
    p, held = _positions(backend, case)
    kw = {"layout": case["layout"], "rotary_dim": case["rotary_dim"], "partial": case["partial"]}
    out = (fn or rotary.rotate)(x, p, **kw) if fn is None else fn(x, p)
    xin = backend.to_numpy(x).astype(np.float64)
    ref = _oracle(xin, np.broadcast_to(held, case["shape"][:-1]), case)
    # a few ulps of the data dtype for the rotation, plus the exact angles' < 2e-7 (float32)
    angle = 0.0 if case["dtype"] == "float64" and backend.float64 else 4e-7
    assert_close(out, ref, like=x, ulps=16, atol=angle * np.abs(xin).max(initial=1.0))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("examples", EXAMPLES)
def test_every_backend_matches_the_oracle(backend, examples):
    @settings(EAGER, max_examples=examples)
    @given(data=st.data())
    def check(data):
        _run(backend, data.draw(cases(backend)))

    check()


_COMPILED: dict[Any, Any] = {}


def _traced(kind: str, kw: dict[str, Any]) -> Any:
    """One traced function per configuration (shapes and positions vary inside it)."""
    key = (kind, tuple(sorted(kw.items())))
    if key not in _COMPILED:
        if kind == "jax":
            import jax

            _COMPILED[key] = jax.jit(lambda x, p: rotary.rotate(x, p, **kw))
        else:
            import torch

            _COMPILED[key] = torch.compile(
                lambda x, p: rotary.rotate(x, p, **kw), fullgraph=True, dynamic=True
            )
    return _COMPILED[key]


@given(data=st.data())
@TRACED
def test_jax_jit_matches_the_oracle(data):
    pytest.importorskip("jax")
    b = next((b for b in rotary.testing.available() if b.name == "jax"), None)
    if b is None:
        pytest.skip("jax not installed")
    case = data.draw(cases(b))
    if case["pos_dtype"] == "list":
        case["pos_dtype"] = "int32"
    kw = {"layout": case["layout"], "rotary_dim": case["rotary_dim"], "partial": case["partial"]}
    _run(b, case, _traced("jax", kw))


@pytest.mark.slow
@given(data=st.data())
@TRACED
def test_torch_compile_matches_the_oracle(data):
    pytest.importorskip("torch")
    b = next(b for b in rotary.testing.available() if b.name == "torch")
    case = data.draw(cases(b))
    # a few configurations and dtypes only (each compiles once); shapes and positions vary freely
    layout = data.draw(st.sampled_from(["half", "interleaved"]))
    case.update(layout=layout, partial="neox", rotary_dim=None, dtype="float32")
    case["pos_dtype"], case["values"] = "int64", [int(v) for v in case["values"]]
    n = len(case["values"])
    case["head_dim"] = 8
    case["shape"] = (2, n, 8)  # one rank and head size: the shapes are dynamic, no recompile
    kw = {"layout": case["layout"], "rotary_dim": case["rotary_dim"], "partial": case["partial"]}
    _run(b, case, _traced("torch", kw))
