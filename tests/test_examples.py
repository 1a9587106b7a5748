"""Smoke tests: every example runs on tiny sizes and writes its figures to ``--out``."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import rotary

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"rotary_example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def needs(*features: str) -> None:
    missing = [f for f in features if not hasattr(rotary, f)]
    if missing:
        pytest.skip(f"rotary has no {', '.join(missing)} yet")


def _pngs(folder) -> list[str]:
    return sorted(p for p in os.listdir(folder) if p.endswith(".png"))


def test_examples_write_figures_only_to_out():
    # Every example that draws takes --out, defaulting to a fresh temporary folder.
    drawing = [p for p in EXAMPLES.glob("*.py") if "savefig" in p.read_text()]
    assert len(drawing) >= 4
    for path in drawing:
        src = path.read_text()
        assert '"--out"' in src and "tempfile.mkdtemp" in src, path.name
        assert "rotary.__file__" not in src, path.name


def test_quickstart(tmp_path, capsys):
    diffs = load("quickstart").main(["--out", str(tmp_path), "--seq", "8", "--head-dim", "16"])
    assert diffs["numpy"] == 0.0
    for name, d in diffs.items():  # the same float32 arithmetic on every library
        assert d <= 8 * np.finfo(np.float32).eps, (name, d)
    assert "max |difference| from NumPy" in capsys.readouterr().out


def test_port_attention(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("jax")
    needs("convert_layout")
    ex = load("port_attention")
    layers = ["tiny"] + (["llama"] if importlib.util.find_spec("transformers") else [])
    for layer in layers:
        diffs = ex.main(
            ["--out", str(tmp_path), "--seq", "5", "--decode", "2", "--layer", layer, "--start", "7"]
        )
        assert set(diffs) == {"prefill", "decode 1", "decode 2"}
        # outputs are O(1); float32 softmax attention over a few tokens agrees to a few ulps
        assert max(diffs.values()) < 64 * np.finfo(np.float32).eps, (layer, diffs)


def test_long_context_angle_errors():
    ex = load("long_context")
    _, errs = ex.angle_errors(max_log2=21, per_octave=16)
    assert errs["exact"].max() < 1e-6  # rotary's default, float32 results
    assert errs["float32"][-1] > 1e-2  # the common recipe near 2**20
    assert errs["float32"][-1] > 100 * errs["float32"][5]


def test_long_context(tmp_path):
    pytest.importorskip("matplotlib")
    if not all(hasattr(rotary.scaling, n) for n in ("NTK", "YaRN", "Llama3", "LongRoPE")):
        pytest.skip("rotary.scaling lacks NTK/YaRN/Llama3/LongRoPE")
    res = load("long_context").main(["--out", str(tmp_path), "--max-log2", "12", "--per-octave", "8"])
    assert _pngs(tmp_path) == ["angle_error.png", "wavelengths.png"]
    w = res["wavelengths"]
    np.testing.assert_allclose(w["linear"], 8 * w["default"], rtol=1e-6)
    np.testing.assert_allclose(w["default"], 2 * np.pi / rotary.inv_freq(128), rtol=1e-6)
    for name in ("YaRN", "Llama 3"):  # the fastest pair is left alone, the slowest interpolated
        np.testing.assert_allclose(w[name][0], w["default"][0], rtol=1e-6)
        np.testing.assert_allclose(w[name][-1], 8 * w["default"][-1], rtol=1e-6)
    # NTK-aware: a change of base, base * 8**(d / (d - 2))
    ntk = 2 * np.pi / rotary.inv_freq(128, 10000.0 * 8 ** (128 / 126))
    np.testing.assert_allclose(w["NTK-aware"], ntk, rtol=1e-6)


def test_decay(tmp_path):
    pytest.importorskip("matplotlib")
    needs("decay_bound")
    load("decay").main(["--out", str(tmp_path), "--dim", "32", "--max-distance", "64"])
    assert _pngs(tmp_path) == ["decay.png"]


def test_linear_attention(tmp_path):
    pytest.importorskip("matplotlib")
    needs("linear_attention", "attention")
    res = load("linear_attention").main(
        [
            "--out",
            str(tmp_path),
            "--seq",
            "12",
            "--min-seq",
            "8",
            "--max-seq",
            "16",
            "--heads",
            "2",
            "--dim",
            "8",
            "--repeats",
            "1",
        ]
    )
    assert _pngs(tmp_path) == ["linear_attention.png"]
    assert max(res["diffs"].values()) < 64 * np.finfo(np.float32).eps, res["diffs"]
    assert res["lengths"] == [8, 16]


def test_train_tiny(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("matplotlib")
    needs("linear_attention")
    curves = load("train_tiny").main(
        ["--out", str(tmp_path), "--steps", "3", "--seq", "8", "--batch", "4", "--dim", "16", "--heads", "2"]
    )
    assert _pngs(tmp_path) == ["train_tiny.png"]
    assert set(curves) == {"sinusoidal", "rope", "rope-linear", "sinusoidal-linear"}
    assert all(len(c) == 3 and np.isfinite(c).all() for c in curves.values())


def test_train_vit_mixed():
    pytest.importorskip("torch")
    losses = load("train_vit_mixed").main(["--steps", "60", "--grid", "4"])
    assert len(losses) == 60 and np.mean(losses[-5:]) < 0.5 * np.mean(losses[:5])


def test_train_learned_lm():
    pytest.importorskip("torch")
    losses = load("train_learned_lm").main(["--steps", "40", "--seq", "12"])
    assert len(losses) == 40 and np.mean(losses[-5:]) < 0.5 * np.mean(losses[:5])


def test_context_parallel_example():
    pytest.importorskip("torch")
    # (a script: the spawned ranks import it by path)
    res = subprocess.run(
        [sys.executable, str(EXAMPLES / "context_parallel.py"), "--world", "2"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    err = float(res.stdout.strip().rsplit("=", 1)[1])
    assert err <= 16 * 2.0**-52, res.stdout


# -- a missing extra: a message naming it, not a traceback ----------------------------------------
_BLOCK = """
import runpy, sys
for m in {blocked!r}:
    sys.modules[m] = None  # as if not installed: importing it raises, find_spec returns None
sys.argv = [{path!r}, *{args!r}]
runpy.run_path({path!r}, run_name="__main__")
"""


@pytest.mark.parametrize(
    "name, blocked, extra",
    [
        ("decay", ["matplotlib"], ".[plot]"),
        ("train_tiny", ["torch", "matplotlib"], ".[torch,plot]"),
        ("port_attention", ["jax"], ".[jax]"),
        ("distributed", ["dask"], ".[dask]"),
    ],
)
def test_missing_extra_is_named(tmp_path, name, blocked, extra):
    import subprocess

    path = str(EXAMPLES / f"{name}.py")
    code = _BLOCK.format(
        blocked=blocked, path=path, args=["--out", str(tmp_path)] if name != "distributed" else []
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(EXAMPLES.parent), os.environ.get("PYTHONPATH", "")]),
    }
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "Traceback" not in res.stderr, res.stderr
    assert f"{name}.py needs {', '.join(blocked)}, not installed here" in res.stderr
    assert f'pip install "{extra}"' in res.stderr
    assert list(tmp_path.iterdir()) == []


def test_port_checkpoint(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("safetensors")
    pytest.importorskip("jax")
    ex = load("port_checkpoint")
    diffs = ex.main(["--out", str(tmp_path), "--seq", "6", "--start", "3000"])
    assert sorted(os.listdir(tmp_path))[:2] == ["config.json", "generation_config.json"]
    scale = 64 * np.finfo(np.float32).eps * 20  # outputs are O(10)
    assert diffs["numpy"] < scale and diffs["jax"] < scale, diffs
    assert diffs["numpy, no convert_layout"] > 1.0, diffs  # without the weight permutation: wrong
    # the port half runs with transformers and torch unimportable, and imports neither
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('torch', 'transformers'):\n"
        "            raise ImportError(f'{name} is blocked')\n"
        "sys.meta_path.insert(0, Block())\n"
        "import importlib.util, numpy as np\n"
        f"spec = importlib.util.spec_from_file_location('ex', {str(EXAMPLES / 'port_checkpoint.py')!r})\n"
        "ex = importlib.util.module_from_spec(spec); spec.loader.exec_module(ex)\n"
        "x = np.random.default_rng(0).standard_normal((2, 6, 64)).astype(np.float32)\n"
        f"out = ex.port({str(tmp_path)!r}, x, np.arange(3000, 3006))\n"
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules\n"
        "print(sorted(out), max(float(np.abs(out['numpy'] - out['jax']).max()), 0.0))\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env())
    assert res.returncode == 0, res.stderr[-3000:]
    assert "'jax'" in res.stdout and "'numpy'" in res.stdout


def _env():
    env = dict(os.environ)
    root = str(EXAMPLES.parent)
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("JAX_PLATFORMS", "cpu")
    return env
