"""The benchmark command lines: readable help, rows that say what they measure (no timing here)."""

from __future__ import annotations

import pytest

from benchmarks import __main__ as suite
from benchmarks import linear_attention as la


@pytest.mark.parametrize("main", [suite.main, la.main])
def test_help_is_plain_text(main, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "``" not in out and ":data:" not in out and "usage:" in out


def test_unknown_backend_is_rejected_with_the_choices(capsys):
    with pytest.raises(SystemExit) as exc:
        la.main(["--backends", "numpy,bogus"])
    assert exc.value.code == 2
    assert "unknown backend 'bogus'; choose from: numpy, torch, jax" in capsys.readouterr().err


def _rows(n_softmax: int) -> list[dict]:
    rows = []
    for n in (1024, 2048, 4096, 8192):
        rows.append({"backend": "numpy", "method": "linear", "N": n, "s": n * 1e-6, "MiB": None})
        s = 50 * n * 1e-6 if n <= n_softmax else None
        rows.append({"backend": "numpy", "method": "softmax", "N": n, "s": s, "MiB": None})
    return rows


@pytest.mark.parametrize("n_softmax", [4096, 8192])
def test_softmax_over_linear_row_reads_as_labelled(n_softmax):
    rows = la._rows_for_suite(_rows(n_softmax), la.summary(_rows(n_softmax)))
    (row,) = [r for r in rows if r["case"].startswith("softmax / linear")]
    assert row["ratio"] == pytest.approx(50.0)  # softmax / linear, as the label says
    assert row["cmp"] == ">=" and row["target"] == 10.0
    assert row["ok"] is None  # the speed-up target applies at 16k only: neither met nor missed
    table = suite.markdown_table(rows)
    line = next(t for t in table.splitlines() if "softmax / linear" in t)
    assert "| 50.00 |" in line and ">= 10" in line and "missed" not in line and "met" not in line
    scaling = next(t for t in table.splitlines() if "time(8k) / time(1k)" in t)
    assert "| <= 10 |" in scaling and scaling.endswith("| met |")


def test_gpu_matrix_without_a_gpu_says_so_and_succeeds(capsys, tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the matrix would run")
    assert suite.main(["--gpu", "--json", str(tmp_path / "gpu.json")]) == 0
    assert "no CUDA GPU" in capsys.readouterr().out
    assert not (tmp_path / "gpu.json").exists()


def test_gpu_matrix_code_runs_here_at_tiny_shapes():
    """The GPU matrix's own code, on the CPU at tiny shapes (timing meaningless): every row well
    formed, the copy floor at 100 %."""
    pytest.importorskip("torch")
    from benchmarks import gpu

    rows = gpu.rows("cpu", quick=True, reps=1)
    assert {r["case"] for r in rows} >= {"copy (floor)", "torch generic"}
    for r in rows:
        assert r["us"] > 0 and r["GB/s"] > 0 and r["% of copy"] > 0
        if r["case"] == "copy (floor)":
            assert r["% of copy"] == pytest.approx(100.0)
