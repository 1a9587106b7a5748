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
