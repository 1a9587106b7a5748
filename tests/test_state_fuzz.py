"""Differential fuzz of process state: random sequences of contexts and eager calls, each
sequence in one fresh process (``tests/state_scenarios.py``).

Hypothesis draws a sequence of steps (exports, compiles, fake modes, JAX transformations,
threads, cache limits, and eager calls with random configurations, dtypes, shapes and
positions); every eager result must equal the float64 oracle within ``finfo`` tolerance and,
bit for bit, the generic code's.  The suite runs a few sequences; ``pytest -m fuzz`` runs
``ROTARY_FUZZ_EXAMPLES`` of them (default 100) and prints how many ran.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis")
pytest.importorskip("torch")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

import state_scenarios as S  # noqa: E402
from test_state import _expected, assert_all_ok, run_fresh  # noqa: E402

_DTYPES = {
    "numpy": ["float16", "float32", "float64"],
    "torch": ["float16", "bfloat16", "float32", "float64"],
    "jax": ["bfloat16", "float32"],
}


@st.composite
def eager_step(draw: st.DrawFn) -> list:
    lib = draw(st.sampled_from(["numpy", "torch", "jax"]))
    return [
        "eager",
        {
            "lib": lib,
            "op": draw(st.sampled_from(["apply", "rope_apply", "rotate", "k_pos", "cos_sin"])),
            "config": draw(st.integers(0, len(S.CONFIGS) - 1)),
            "dtype": draw(st.sampled_from(_DTYPES[lib])),
            "shape": draw(st.sampled_from(["prefill", "decode", "long"])),
            "pos": draw(st.sampled_from(["small", "table", "past_table", "huge"])),
            "seed": draw(st.integers(0, 2**16)),
        },
    ]


context_step = st.tuples(st.sampled_from(sorted(S.CONTEXTS)), st.integers(0, len(S.CONFIGS) - 1)).map(list)
sequences = st.lists(st.one_of(context_step, eager_step()), min_size=2, max_size=7).map(
    lambda steps: [*steps, *(["eager", e] for e in S.EAGER[::5])]  # always some eager calls last
)

_RAN: list[int] = []


def _check(steps: list) -> None:
    assert_all_ok(run_fresh(steps), _expected(steps))
    _RAN.append(1)


@pytest.mark.slow
@settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck))
@given(sequences)
def test_random_sequences_in_fresh_processes(steps):
    _check(steps)


@pytest.mark.fuzz
def test_long_fuzz():
    n = int(os.environ.get("ROTARY_FUZZ_EXAMPLES", "100"))

    @settings(max_examples=n, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(sequences)
    def run(steps):
        _check(steps)

    before = len(_RAN)
    run()
    print(f"\nstate fuzz: {len(_RAN) - before} sequences, each in a fresh process, all equal to the oracle")
