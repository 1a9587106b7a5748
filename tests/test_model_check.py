"""``rotary.testing.check_model_rope``: an engine's RoPE certified against a model's config.

The kit passes rotary itself on every family and layer type of the census, and catches (and
names) deliberately broken adapters: the mistakes the field makes (tests/engine_mistakes.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import rotary
from conformance.engines import rotary_self
from conformance.engines.cases import CASES
from rotary.testing import MODEL_CHECKS, check_model_rope
from rotary.testing.model import CONFIG_CHECKS, PACKED_CHECKS

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import engine_mistakes as M  # noqa: E402


@pytest.mark.parametrize("angles", ["float32", "exact"])
@pytest.mark.parametrize("case", list(CASES))
def test_rotary_passes_every_case_of_the_matrix(case: str, angles: str) -> None:
    rep = check_model_rope(M.Rotary(angles), CASES[case].config, checks=CASES[case].checks)
    assert rep and rep.supported, str(rep)
    assert {r.check for r in rep} == set(CASES[case].checks or CONFIG_CHECKS)
    assert set(CONFIG_CHECKS) | set(PACKED_CHECKS) == set(MODEL_CHECKS)
    assert {r.dtype for r in rep} == {"float32", "bfloat16"}


def _census_configs() -> list[tuple[str, dict, str | None]]:
    """Every (model type, layer type) of the census whose config rotary reads (the others are
    refused with a reason: the census lists them)."""
    import hf_census

    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for item in hf_census._modules():
            if len(item) == 2:
                continue
            name, _mod, cls, cfg = item
            d = cfg.to_dict()
            try:
                rotary.hf.model_rope(d)
            except ValueError:
                continue
            out.extend((name, d, lt) for lt in hf_census._layer_types(cls, cfg))
    return out


@pytest.mark.slow
def test_rotary_passes_every_census_family_and_layer_type() -> None:
    """Every (model type, layer type) pair the census matches bit for bit (transformers' own
    modules), read by rotary.hf into the float32 recipe, passes against the exact truth."""
    pytest.importorskip("transformers")
    pytest.importorskip("torch")
    configs = _census_configs()
    assert len(configs) >= 150, len(configs)
    bad, checked = [], 0
    for name, cfg, lt in configs:
        rep = check_model_rope(
            rotary_self, cfg, layer_types=None if lt is None else [lt], dtypes=("float32",)
        )
        if not rep.results:  # a layer type without RoPE (Cohere 2, BEAM global layers)
            m = rotary.hf.model_rope(cfg)
            assert all(r is None for r, t in zip(m.layers, m.layer_types or ()) if t == lt), (name, lt)
            continue
        checked += 1
        if not rep or not rep.supported:
            bad.append(f"{name}/{lt}: {rep.failed} {rep['rotation'].message[:300]}")
    assert not bad, "\n".join(bad)
    assert checked >= 150, checked


# -- the mistakes of the field, caught and named --------------------------------------------------
def _diag(rep: rotary.testing.ModelRopeReport, check: str) -> str:
    assert not rep, str(rep)
    assert check in rep.failed, str(rep)
    return rep[check].message


def test_a_missing_yarn_attention_factor_is_named() -> None:
    # YaRN factor 16 without mscale keys: cos and sin scaled by 0.1 ln 16 + 1 = 1.2773
    rep = check_model_rope(M.NoAttentionFactor(), M.YARN16, dtypes=("float32",))
    msg = _diag(rep, "attention_factor")
    assert "scaled by 1.0000 where the config implies 1.2773" in msg and "missing" in msg, msg
    assert rep.failed == ["attention_factor"]  # (the rotation holds: one mistake fails one check)


def test_ignored_mscale_keys_are_named() -> None:
    # vLLM's Ministral 3 bug: mscale = mscale_all_dim implies 1.0, the plain formula gives 1.2773
    rep = check_model_rope(M.PlainYarnFactor(), CASES["yarn_mscale"].config, dtypes=("float32",))
    msg = _diag(rep, "attention_factor")
    assert "1.2773 where the config implies 1.0000" in msg and "mscale_all_dim=1 ignored" in msg, msg


def test_positions_clamped_at_the_table_end_are_named() -> None:
    rep = check_model_rope(M.Clamped(4096), CASES["llama3"].config, dtypes=("float32",))
    msg = _diag(rep, "rotation")
    assert "positions clamped to a table of 4096 rows" in msg and "wrong from position 4096 on" in msg, msg


def test_positions_wrapped_around_the_table_are_named() -> None:
    rep = check_model_rope(M.Wrapped(8192), CASES["llama3"].config, dtypes=("float32",))
    assert "wrap around a table of 8192 rows" in _diag(rep, "rotation")


def test_the_llama3_band_inverted_is_named() -> None:
    rep = check_model_rope(M.InvertedBands(), CASES["llama3"].config, dtypes=("float32",))
    msg = _diag(rep, "rotation")
    assert "the Llama 3 bands inverted" in msg and "x1/8" in msg, msg


def test_the_yarn_ramp_inverted_is_named() -> None:
    rep = check_model_rope(M.InvertedBands(), CASES["yarn"].config, dtypes=("float32",))
    assert "the YaRN ramp inverted" in _diag(rep, "rotation")


def test_the_other_layout_is_named() -> None:
    rep = check_model_rope(M.OtherLayout(), CASES["interleaved"].config, dtypes=("float32",))
    assert "pairs features in the 'half' layout (the config's is 'interleaved')" in _diag(rep, "rotation")


def test_a_dropped_scaling_is_named() -> None:
    rep = check_model_rope(M.NoScaling(), CASES["linear"].config, dtypes=("float32",))
    msg = _diag(rep, "rotation")
    assert "no scaling: plain RoPE at base 10000 (Linear not applied)" in msg, msg
    assert "x4" in msg  # every frequency 4x the config's


def test_a_hard_coded_llama3_factor_is_named() -> None:
    cfg = {
        **CASES["llama3"].config,
        "rope_scaling": {**CASES["llama3"].config["rope_scaling"], "factor": 32.0},
    }
    rep = check_model_rope(M.Llama3Factor8(), cfg, dtypes=("float32",))
    assert "Llama 3 with factor 8 (hard-coded; the config's is 32)" in _diag(rep, "rotation")


def test_longrope_long_factors_at_every_length_are_named() -> None:
    rep = check_model_rope(M.LongFactorsAlways(), CASES["longrope"].config, dtypes=("float32",))
    assert "LongRoPE's long factors at every length" in _diag(rep, "rotation")


def test_partial_rotary_over_the_whole_head_is_named() -> None:
    rep = check_model_rope(M.WholeHead(), CASES["partial"].config, dtypes=("float32",))
    msg = _diag(rep, "rotation")
    assert (
        "rotates 80 of the 80 features" in msg and "features 32..79 should pass through unchanged" in msg
    ), msg


def test_mrope_read_at_one_row_is_named() -> None:
    rep = check_model_rope(M.TemporalRowOnly(), CASES["mrope"].config, dtypes=("float32",))
    assert "M-RoPE with the temporal row for every frequency" in _diag(rep, "rotation")


def test_a_missing_query_scale_is_named() -> None:
    rep = check_model_rope(M.NoQueryScale(), CASES["yarn_mscale"].config, dtypes=("float32",))
    msg = _diag(rep, "query_scale")
    assert "scales no query" in msg and "1.0693 at position 16384" in msg, msg


def test_a_query_scale_from_the_token_index_is_named() -> None:
    rep = check_model_rope(M.QueryScaleFromIndex(), CASES["yarn_mscale"].config, dtypes=("float32",))
    assert "wrong from position" in _diag(rep, "query_scale")


def test_a_missing_mla_softmax_scale_is_named() -> None:
    rep = check_model_rope(M.NoSoftmaxScale(), CASES["yarn_mla"].config, dtypes=("float32",))
    msg = _diag(rep, "softmax_scale")
    assert "1 where the config implies 1.87385" in msg and "applies none" in msg, msg


def test_refusing_positions_inside_the_context_fails_and_past_it_passes() -> None:
    rep = check_model_rope(M.Refuses(1000), CASES["default"].config, dtypes=("float32",))
    assert (
        "refuses position 1000" in _diag(rep, "positions") and "context is 4096" in rep["positions"].message
    )
    ok = check_model_rope(M.Refuses(4096), CASES["default"].config, dtypes=("float32",))
    assert ok, str(ok)
    assert "refuses positions from 4096 on" in ok["positions"].message


def test_an_unsupported_config_is_not_a_failure() -> None:
    rep = check_model_rope(M.NoMRoPE(), CASES["mrope"].config)
    assert rep and not rep.supported
    assert all(r.status == "not supported" for r in rep)
    assert "no M-RoPE" in rep["rotation"].message


def test_an_adapter_that_mutates_its_inputs_fails() -> None:
    rep = check_model_rope(M.InPlace(), CASES["default"].config, dtypes=("float32",))
    assert not rep and "changed its inputs in place" in rep["rotation"].message


def test_report_is_json_and_readable() -> None:
    rep = check_model_rope(M.Clamped(4096), CASES["llama3"].config)
    d = json.loads(json.dumps(rep.to_dict()))
    assert d["passed"] is False and d["engine"] == "mistake" and d["config"] == "llama"
    text = str(rep)
    assert "FAILED: rotation" in text and "clamped" in text


_CLI = [sys.executable, "-m", "conformance"]


@pytest.mark.parametrize(
    ("target", "config", "code", "expect"),
    [
        ("conformance.engines.rotary_self", "yarn", 0, "all checks hold"),
        ("conformance.engines.rotary_self:build", "llama3", 0, "all checks hold"),
        ("engine_mistakes:CLAMPED", "llama3", 1, "clamped to a table of 4096 rows"),
        ("engine_mistakes:NO_MROPE", "mrope", 0, "not supported"),
    ],
)
def test_command_line(tmp_path: Path, target: str, config: str, code: int, expect: str) -> None:
    res = subprocess.run(
        [*_CLI, "--against", target, "--config", config, "--dtypes", "float32", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=HERE.parent,
        env={**__import__("os").environ, "PYTHONPATH": str(HERE)},
    )
    assert res.returncode == code, res.stdout[-2000:] + res.stderr[-2000:]
    assert expect in res.stdout, res.stdout
    assert json.loads((tmp_path / "report.json").read_text())["kind"] == "model"


def test_command_line_reads_a_config_json_path(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(CASES["yarn_no_truncate"].config))
    args = [
        "--against",
        "conformance.engines.rotary_self",
        "--config",
        str(path),
        "--out",
        str(tmp_path / "o"),
    ]
    res = subprocess.run(
        [*_CLI, *args, "--quiet"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=HERE.parent,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip() == "all checks hold"


def test_data_is_exact_in_bfloat16() -> None:
    ml = pytest.importorskip("ml_dtypes")
    from rotary.testing.model import _data

    x = _data(np.random.default_rng(0), (4096,), "bfloat16")
    assert np.array_equal(x, x.astype(ml.bfloat16).astype(np.float32))


def test_an_attention_factor_folded_into_the_softmax_scale_passes() -> None:
    rep = check_model_rope(M.FoldedFactor(), CASES["yarn_no_truncate"].config, dtypes=("float32",))
    assert rep, str(rep)
    assert "folds the attention factor into its softmax scale" in rep["softmax_scale"].message


def test_an_attention_factor_applied_twice_is_named() -> None:
    rep = check_model_rope(M.FactorTwice(), CASES["yarn"].config, dtypes=("float32",))
    assert "the attention factor is applied twice" in _diag(rep, "softmax_scale")
    assert rep.failed == ["softmax_scale"]  # (cos and sin carry the config's factor)


@pytest.mark.parametrize("target", ["adapters/my_adapter.py", "adapters/my_adapter.py:build"])
def test_command_line_takes_a_standalone_adapter_file(tmp_path: Path, target: str) -> None:
    # (issue 50, 10: --against with a file outside any package needed PYTHONPATH; the file's
    # folder is importable now, so its neighbouring modules are too)
    folder = tmp_path / "adapters"
    folder.mkdir()
    (folder / "helper_of_mine.py").write_text(
        "import rotary\n\n\ndef rope(config, layer_type):\n"
        "    return rotary.hf.from_hf(config, angles='float32', layer_type=layer_type)\n"
    )
    (folder / "my_adapter.py").write_text(
        "from helper_of_mine import rope\n\nNAME, INSTALL = 'mine', ''\n\n\n"
        "def version():\n    return '1.0'\n\n\n"
        "def build(config, *, layer_type, dtype):\n    r = rope(config, layer_type)\n\n"
        "    class Rope:\n        def rotate(self, q, k, positions):\n"
        "            return r.apply(q, k, positions[:, None])\n\n    return Rope()\n"
    )
    env = {k: v for k, v in __import__("os").environ.items() if k != "PYTHONPATH"}
    res = subprocess.run(
        [*_CLI, "--against", target, "--config", "default", "--dtypes", "float32", "--out", "o", "--quiet"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={**env, "PYTHONPATH": str(HERE.parent)},  # (rotary's checkout alone, as an install gives)
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert res.stdout.strip() == "all checks hold"
