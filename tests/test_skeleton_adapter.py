"""The skeleton adapter of the newcomer's page (``conformance/engines/skeleton.py``, "Certify your
engine" in docs/guides/conformance.rst) passes on rotary itself, as committed, from Python and
from the command line; and forgetting its converter's q/k permutation is caught as what it is."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conformance.engines import skeleton
from conformance.engines.cases import CASES
from rotary.testing import check_model_rope

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("case", list(CASES))
def test_the_skeleton_passes_on_every_case_it_expresses(case: str) -> None:
    rep = check_model_rope(skeleton, case, dtypes=skeleton.DTYPES)
    assert rep, str(rep)
    if case == "mrope":
        assert not rep.supported and "no M-RoPE" in rep["rotation"].message
    else:
        assert rep.supported, str(rep)


def test_without_the_converters_permutation_the_kit_names_the_layout() -> None:
    def forgetful(config, *, layer_type, dtype):  # type: ignore[no-untyped-def]
        eng = skeleton.build(config, layer_type=layer_type, dtype=dtype)
        eng.order = eng.back = np.arange(eng.order.shape[0])  # (q and k given to the engine as is)
        return eng

    rep = check_model_rope(forgetful, "llama3", dtypes=("bfloat16",))
    assert rep.failed == ["rotation"], str(rep)
    msg = rep["rotation"].message
    assert msg.startswith("the engine pairs features in the 'interleaved' layout (the config's is 'half')"), (
        msg
    )


def test_the_skeleton_from_the_command_line(tmp_path: Path) -> None:
    cmd = [
        sys.executable,
        "-m",
        "conformance",
        "--against",
        "conformance.engines.skeleton",
        "--config",
        "yarn",
    ]
    res = subprocess.run(
        [*cmd, "--out", str(tmp_path), "--quiet"], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert res.stdout.strip() == "all checks hold"


def test_cli_honours_the_adapters_dtypes_and_prints_every_message(tmp_path, monkeypatch):
    # Issue 43 (the newcomer's gaps): the CLI ignored an adapter's own DTYPES (float16 needed
    # --dtypes), and report.txt hid the messages of passing checks (only report.json had them).
    import json

    from conformance.report import main

    monkeypatch.chdir(tmp_path)
    assert main(["--against", "conformance.engines.skeleton", "--config", "default", "--quiet"]) == 0
    rep = json.loads((tmp_path / "conformance-report" / "report.json").read_text())
    assert {r["dtype"] for r in rep["results"]} == {"float32", "bfloat16", "float16"}
    text = (tmp_path / "conformance-report" / "report.txt").read_text()
    for r in rep["results"]:
        if r["message"]:
            assert r["message"] in text, r["message"]


# -- packed input (the thd case): mistakes planted in the skeleton's rotate_packed -----------------
def _packed(positions_of):  # type: ignore[no-untyped-def]
    """The skeleton, its packed call rotating at ``positions_of(cu_seqlens, offsets)``."""

    def build(config, *, layer_type, dtype):  # type: ignore[no-untyped-def]
        eng = skeleton.build(config, layer_type=layer_type, dtype=dtype)

        def rotate_packed(q, k, cu_seqlens, offsets):  # type: ignore[no-untyped-def]
            return eng.rotate(q, k, np.asarray(positions_of(cu_seqlens, offsets), dtype=np.int64))

        eng.rotate_packed = rotate_packed  # type: ignore[method-assign]
        return eng

    return build


def _restarting(cu, offsets):  # type: ignore[no-untyped-def]
    return np.concatenate([np.arange(n) for n in np.diff(cu)])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_correct_packed_engines_pass(dtype: str) -> None:
    right = _packed(lambda cu, off: _restarting(cu, off) + np.repeat(off, np.diff(cu)))
    rep = check_model_rope(right, "thd", dtypes=(dtype,))
    assert rep and rep.supported, str(rep)
    assert [(r.check, r.status) for r in rep] == [("packed", "pass"), ("packed_offsets", "pass")]
    assert (
        rep["packed_offsets"].message
        == "5 documents of 1 to 12 tokens in one row of 32, at offsets 9, 2047, 0, 31, 4000"
    )


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_positions_leaking_across_documents_are_named(dtype: str) -> None:
    leaky = _packed(lambda cu, off: np.arange(cu[-1]))  # (the row's token index: no restart)
    rep = check_model_rope(leaky, "thd", dtypes=(dtype,))
    assert rep.failed == ["packed", "packed_offsets"], str(rep)
    assert rep["packed"].message == (
        "document 1 of 5 (0-based; tokens 7..7 of the row) is wrong from its token 0 on (token 7 of the "
        "row): rotated at position 7 where it is at 0, the row's token index: positions do not restart at "
        "the document's start; so are documents 2 (from its token 0), 3 (from its token 0), 4 (from its "
        "token 0), in the same way"
    ), rep["packed"].message
    # (document 0 starts the row at offset 9: rotated from 0, its offset ignored)
    assert rep["packed_offsets"].message.startswith(
        "document 0 of 5 (0-based; tokens 0..6 of the row) is wrong from its token 0 on (token 0 of the "
        "row): rotated at positions 0..6 where they are at 9..15: its offset 9 is ignored"
    ), rep["packed_offsets"].message


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_ignored_offsets_are_named(dtype: str) -> None:
    rep = check_model_rope(_packed(_restarting), "thd", dtypes=(dtype,))
    assert rep.failed == ["packed_offsets"] and rep["packed"].status == "pass", str(rep)
    assert rep["packed_offsets"].message == (
        "document 0 of 5 (0-based; tokens 0..6 of the row) is wrong from its token 0 on (token 0 of the "
        "row): rotated at positions 0..6 where they are at 9..15: its offset 9 is ignored (positions from "
        "0); so are documents 1 (from its token 0), 3 (from its token 0), 4 (from its token 0), in the "
        "same way"
    ), rep["packed_offsets"].message


def test_a_document_wrong_from_a_middle_token_is_named_from_there() -> None:
    clamped = _packed(lambda cu, off: np.minimum(_restarting(cu, off), 7))  # (a table of 8 rows)
    rep = check_model_rope(clamped, "thd", dtypes=("float32",), checks=("packed",))
    assert rep.failed == ["packed"], str(rep)
    assert rep["packed"].message == (
        "document 2 of 5 (0-based; tokens 8..19 of the row) is wrong from its token 8 on (token 16 of the "
        "row): rotated at positions 7, 7, 7, 7 where they are at 8..11"
    ), rep["packed"].message


def test_an_engine_without_packed_input_is_not_applicable_never_a_pass() -> None:
    from conformance.engines.field import _cell, verdict

    def plain(config, *, layer_type, dtype):  # type: ignore[no-untyped-def]
        eng = skeleton.build(config, layer_type=layer_type, dtype=dtype)
        eng.rotate_packed = None  # type: ignore[assignment]  # (the RoPE takes no packed input)
        return eng

    rep = check_model_rope(plain, "thd", dtypes=("float32", "bfloat16"))
    assert {r.status for r in rep} == {"not applicable"} and not rep.supported, str(rep)
    assert rep["packed"].message == "the engine's RoPE, as adapted, takes no packed input (no rotate_packed)"
    assert verdict(rep.to_dict()) == "n/a" and _cell(rep.to_dict()) == "n/a"
    assert "not applicable: the engine takes no such input" in str(rep)

    class NoOffsets(skeleton.SkeletonRope):
        takes_offsets = False

    def restarting_only(config, *, layer_type, dtype):  # type: ignore[no-untyped-def]
        eng = skeleton.build(config, layer_type=layer_type, dtype=dtype)
        eng.__class__ = NoOffsets
        return eng

    rep = check_model_rope(restarting_only, "thd", dtypes=("bfloat16",))
    assert [(r.check, r.status) for r in rep] == [("packed", "pass"), ("packed_offsets", "not applicable")]
    assert rep["packed_offsets"].message == "the skeleton's engine restarts every document at 0 (no offsets)"
    assert verdict(rep.to_dict()) == "pass" and _cell(rep.to_dict()) == "pass; n/a: packed_offsets"


def test_an_adapter_crash_in_its_packed_call_is_an_adapter_error() -> None:
    def crashing(config, *, layer_type, dtype):  # type: ignore[no-untyped-def]
        eng = skeleton.build(config, layer_type=layer_type, dtype=dtype)

        def rotate_packed(q, k, cu_seqlens, offsets):  # type: ignore[no-untyped-def]
            raise TypeError("cu_seqlens must be int32")

        eng.rotate_packed = rotate_packed  # type: ignore[method-assign]
        return eng

    rep = check_model_rope(crashing, "thd", dtypes=("float32",), checks=("packed",))
    assert rep.adapter_errors == ["packed"] and not rep, str(rep)
    assert "TypeError: cu_seqlens must be int32" in rep["packed"].message
