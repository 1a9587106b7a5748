"""Shared fixtures: one backend fixture over every installed array library; the quick suite and
the slow matrix.

Select backends with ``ROTARY_BACKENDS=numpy,torch pytest``.  CuPy and torch CUDA appear
only when a GPU is present.  Backends are described by capabilities
(:class:`rotary.testing.Backend`): tests ask ``backend.lazy``, ``backend.host_values``,
``backend.float64``..., never for a backend by name.

The README's command (``pytest -n auto``) runs the *quick suite*: every public function on every
backend but the slow one, the properties, the oracles, the refusals, the kit's words.
``pytest -m matrix`` runs the *slow matrix* (``.ci/run`` runs both):

* the tests of :data:`MATRIX_REASONS`, with their reasons (fresh interpreters, compiles and
  exports, engine reproductions and census sweeps, whole-package builds and checks);
* on the backends of :data:`GRID_IN_MATRIX` (JAX, Dask), every parametrization of a test but its
  first (the first value of each of its other parameters: the same one in every run; every
  conformance column, :data:`GRID_KEEPS`);
* a slow backend (``backend.slow``: cubed, where each computation is planned and run by an
  executor) runs the tests marked ``slow_backends_too`` (the conformance columns: every public
  function; one test of each code path), in the matrix; the rest would cost minutes there and
  check the same generic code the other backends run;
* parametrizations marked ``matrix`` in their own file: the transform matrix's compiles and
  exports, the conformance columns and the kit's words in the dtypes other than float32, the
  properties' larger profile.

Naming backends in ``$ROTARY_BACKENDS`` runs every test on them in the quick run (their whole
grid, a slow backend's every test).  A test of the matrix runs by name only with ``-m matrix``.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from rotary.testing.backends import backend_params

#: The slow matrix: why, and the test files or test functions (``path::name``) it holds for it.
MATRIX_REASONS = {
    "fresh interpreters (process state, forks, threads, interrupts, cold first calls, processes)": [
        "tests/test_state.py",
        "tests/test_state_fuzz.py::test_random_sequences_in_fresh_processes",
        "tests/test_process_life.py",
        "tests/test_tracers.py",
        "tests/test_transforms.py::test_regression_pickled_and_copied_configurations_hash_equal",
        "tests/test_dtensor.py",
        "tests/test_context_parallel.py",
        "tests/test_examples_distributed.py",
        "tests/test_distributed.py::test_local_cluster_computes_rope_and_linear_attention",
        "tests/test_distributed.py::test_jax_sharded_outputs_keep_sharding_and_match",
        "tests/test_distributed.py::test_jax_sharded_batch_heads_need_no_collectives",
        "tests/test_distributed.py::test_jax_sequence_sharded_attention_moves_only_states",
        "tests/test_distributed.py::test_sequence_parallel_documents_decay_and_gates_across_shards",
        "tests/test_triton.py",
        "tests/test_examples.py::test_context_parallel_example",
        "tests/test_array_libraries.py::test_report_lists_every_library_and_checks_an_extra_one",
        "tests/test_array_libraries.py::test_report_refuses_a_library_it_cannot_import",
        "conformance/test_conformance.py::test_an_unsupported_standard_version_is_reported_not_crashed",
    ],
    # (the quick suite keeps a few single graphs: test_layouts.py's, JAX's jitted properties...;
    # and JAX's eager calls each run one compiled program)
    "compiles, traces and exports (torch.compile, jit.trace, torch.export, jax.jit and grad, ONNX)": [
        "tests/test_export.py",
        "tests/test_transforms.py::test_jax",
        "tests/test_transforms.py::test_every_entry_point_under_torch_compile_fullgraph",
        "tests/test_transforms.py::test_every_entry_point_under_jax_jit",
        "tests/test_transforms.py::test_every_entry_point_under_jit_trace",
        "tests/test_transforms.py::test_regression_vision_towers_under_compile_fullgraph",
        "tests/test_transforms.py::test_regression_learned_rope_under_compile_fullgraph",
        "tests/test_transforms.py::test_a_compiled_decoding_loop_compiles_once",
        "tests/test_properties.py::test_torch_compile_matches_the_oracle",
        "tests/test_core.py::test_torch_compile_fullgraph",
        "tests/test_core.py::test_torch_compile_several_configs_one_function",
        "tests/test_linear_attention.py::test_torch_compile_fullgraph",
        "tests/test_linear_attention.py::test_jax_jit_traces_positions_and_state",
        "tests/test_linear_attention.py::test_jax_user_feature_map_compiles_once",
        "tests/test_linear_attention.py::test_jax_gradients_match_naive_autograd",
        "tests/test_linear_gates.py::test_jax_gradients_and_jit_of_gates",
        "tests/test_scaling.py::test_scalings_under_jax_jit",
        "tests/test_scaling.py::test_scalings_under_torch_compile_fullgraph",
        "tests/test_multiaxis.py::test_torch_compile_fullgraph",
        "tests/test_positions.py::test_traceable_under_torch_compile",
        "tests/test_positions.py::test_traceable_under_jax_jit",
        "tests/test_packed.py::test_no_python_loop_over_documents_under_compile_and_jit",
        "tests/test_packed.py::test_one_and_no_token_under_torch_compile",
        "tests/test_errors.py::test_14_non_finite_positions_under_compile_give_nan",
        "tests/test_errors.py::test_15_16_compile_with_python_positions_and_dynamic_shapes",
        "tests/test_hf_patch.py::test_torch_compile_gives_the_eager_numbers",
        "tests/test_errors.py::test_01_int32_minimum_under_jit_and_compile",
        "tests/test_array_libraries.py::test_ndonnx_every_public_function",
    ],
    # (with the tests marked slow_backends_too on it: see pytest_collection_modifyitems)
    "the slow backend, cubed: each computation planned and run by an executor": [
        "tests/test_array_libraries.py::test_cubed_default_executor_and_its_mended_departures",
        "tests/test_array_libraries.py::test_cubed_one_namespace_whatever_is_looked_up_first",
        "tests/test_array_libraries.py::test_cubed_arrays_of_any_spec_whatever_ran_before",
    ],
    "engine reproductions and sweeps over transformers' families": [
        "tests/test_field_report.py",
        "tests/test_hf_census.py",
        "tests/test_hf_census_models.py",
        "tests/test_hf_families.py::test_tiny_model_logits_unchanged",
        "tests/test_model_check.py::test_rotary_passes_every_census_family_and_layer_type",
        "tests/test_benchmarks.py::test_gpu_matrix_code_runs_here_at_tiny_shapes",
    ],
    "whole-package builds and checks (docs site and its pages' snippets, wheel, pyright, mypy)": [
        "tests/test_docs_site.py::test_sphinx_builds_without_warnings",
        "tests/test_docs_site.py::test_docs_snippet_runs",
        "tests/test_packaging.py",
        "tests/test_typing.py",
        "tests/test_structure.py::test_mypy_clean_with_few_ignores",
    ],
}
MATRIX = {test: why for why, tests in MATRIX_REASONS.items() for test in tests}

#: Backends where each new shape or dtype compiles an XLA program (JAX's eager calls) or builds and
#: runs a task graph (Dask): the quick suite runs one parametrization of each test there.
GRID_IN_MATRIX = ("jax", "dask")
#: Parameters kept whole there: a conformance column is a public function.
GRID_KEEPS = ("column",)

#: Markers of the runs of their own: the matrix does not take them in.
_OWN_RUNS = ("fuzz", "engines", "fla")


def _in_matrix(item: pytest.Item) -> bool:
    path = item.path.relative_to(item.config.rootpath).as_posix()
    return path in MATRIX or f"{path}::{getattr(item, 'originalname', item.name)}" in MATRIX


def _grid_place(item: pytest.Item) -> tuple | None:
    """(test, backend, the parameters it keeps whole) and the indices of its other parameters, for
    a test on a backend of :data:`GRID_IN_MATRIX`."""
    spec = getattr(item, "callspec", None)
    backend = spec.params.get("backend") if spec is not None else None
    if getattr(backend, "name", None) not in GRID_IN_MATRIX:
        return None
    whole = tuple(i for name, i in sorted(spec.indices.items()) if name in GRID_KEEPS)
    others = tuple(i for name, i in sorted(spec.indices.items()) if name not in (*GRID_KEEPS, "backend"))
    return (item.path, item.originalname, backend.name, whole), others


def pytest_collection_modifyitems(config, items):
    named = bool(os.environ.get("ROTARY_BACKENDS"))
    first: dict[tuple, tuple] = {}
    places = {}
    for item in items:
        place = None if named else _grid_place(item)
        if place is not None:
            places[item] = place
            first[place[0]] = min(first.get(place[0], place[1]), place[1])
    for item in items:
        if item.get_closest_marker("slow_backend"):
            if not item.get_closest_marker("slow_backends_too"):
                item.add_marker(
                    pytest.mark.skip(
                        reason="a slow backend runs the tests marked slow_backends_too, in the matrix "
                        "(ROTARY_BACKENDS=<name> runs every test on it)"
                    )
                )
                continue
        elif not _in_matrix(item) and (item not in places or places[item][1] == first[places[item][0]]):
            continue
        if not any(item.get_closest_marker(m) for m in _OWN_RUNS):
            item.add_marker(pytest.mark.matrix)
    # The tests marked slow (fresh interpreters, compiles, whole-package checks: 8 to 35 s each)
    # first, then those on JAX and Dask (a compile or a graph each): pytest-xdist hands tests out
    # in this order, and a long test left for the end keeps one worker busy while the others idle
    # (a stable sort: the rest keep their order).
    items.sort(key=lambda item: (item.get_closest_marker("slow") is None, item not in places))


@pytest.fixture(params=backend_params())
def backend(request):
    """A :class:`rotary.testing.Backend`: ``.xp``, ``.asarray(np_array, dtype)``, ``.to_numpy``."""
    return request.param


@pytest.fixture
def rng():
    return np.random.default_rng(12345)
