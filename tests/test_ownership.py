"""What rotary returns belongs to the caller: overwriting it in place changes no later answer.

The inventory (``tests/ownership.py``) calls every public callable and property of rotary's public
modules, overwrites every array they return, and calls them all again.  It runs in a fresh process
per backend (a failure corrupts that process's state).  The reproductions of issue 34 are tests
of their own, also in fresh processes.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def _fresh(code: str, *args: str, timeout: float = 240) -> str:
    res = subprocess.run(
        [sys.executable, *args] if not code else [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=HERE,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return res.stdout


def test_the_inventory_covers_every_public_callable() -> None:
    """Every public callable is called, or listed with the reason it returns no arrays of rotary's
    (and every name listed is a public callable: no stale entries)."""
    sys.path.insert(0, str(HERE))
    try:
        import ownership
    finally:
        sys.path.remove(str(HERE))
    from rotary.testing import backends

    names = {q for q, _, _ in ownership.public()}
    assert {
        "rotary.RoPE.cos_sin",
        "rotary.MRoPE.cos_sin",
        "rotary.RoPE.inv_freq",
    } <= names  # (inherited: on each)
    assert {
        "rotary.hf.ModelRope.query_scale",
        "rotary.linear_attention_state",
        "conformance.vectors.load",
    } <= names
    short = {f"{q.split('.')[-2]}.{q.split('.')[-1]}" for q in names} | {"Scaling.dynamic_cos_sin"}
    assert set(ownership.NOT_CALLED) <= names | short, set(ownership.NOT_CALLED) - names - short
    b = backends.get("numpy")
    calls = ownership.build(ownership.Env(b.xp, b.asarray, b.float64))  # (raises naming a parameter)
    called = {c.name.split(" of ")[0] for c in calls}
    missing = [q for q, _, cls in ownership.public() if q not in called and ownership._skip(q, cls) is None]
    assert not missing, missing


def test_returned_arrays_are_the_callers(backend) -> None:  # type: ignore[no-untyped-def]
    if not backend.writeable or backend.lazy:
        pytest.skip("arrays of this library cannot be written in place")
    out = json.loads(_fresh("", str(HERE / "ownership.py"), backend.name).splitlines()[-1])
    assert out["calls"] > 1000 and out["arrays"] > 500, out
    assert not out["refused"], out["refused"]
    assert not out["failures"], "\n".join(out["failures"][:20])


# -- the reproductions (issue 34): each failed on 67cca2f --------------------------------------
def test_torch_cos_sin_of_one_position_is_not_the_table() -> None:
    pytest.importorskip("torch")
    out = _fresh(
        """
        import torch, rotary
        x = torch.randn(1, 2, 1, 16, generator=torch.Generator().manual_seed(0))
        rope = rotary.RoPE(16)
        want = rope.rotate(x, torch.tensor([5]))
        c, s = rope.cos_sin(torch.tensor([5]))
        c.mul_(0.0); s.mul_(0.0)
        print(float((rotary.rotate(x, torch.tensor([5])) - want).abs().max()))
        print(float((rotary.RoPE(16).rotate(x, torch.tensor([5])) - want).abs().max()))
        """
    )
    assert [float(v) for v in out.split()] == [0.0, 0.0]  # (was 3.26: every RoPE's position 5)


def test_numpy_cos_sin_of_one_position_is_not_the_table() -> None:
    out = _fresh(
        """
        import numpy as np, rotary
        x = np.random.default_rng(0).standard_normal((3, 16)).astype(np.float32)
        want = rotary.rotate(x, np.arange(3))
        c, s = rotary.RoPE(16).cos_sin(np.array([2]))
        print(c.flags.writeable, np.shares_memory(c, s) or c.base is None or c.base.flags.writeable)
        c *= 0
        print(float(np.abs(rotary.rotate(x, np.arange(3)) - want).max()))
        """
    )
    lines = out.split("\n")
    assert lines[0] == "True True"  # the caller's: writeable (not a read-only view of the table)
    assert float(lines[1]) == 0.0  # (was 0.93)


def test_mrope_text_positions_are_the_callers() -> None:
    import numpy as np

    from rotary import positions

    out = positions.mrope_text_positions(np.array([[7, 8]]), np.array([[-2]]))
    out[0, 0, 0] = 100  # (was a read-only broadcast view: one write would change every row)
    assert out[1:, 0, 0].tolist() == [5, 5]


def test_torch_decoding_outputs_own_their_memory() -> None:
    # Issue 44, reproduction 10: a decoding step returned q_rot and k_rot as views of one buffer:
    # a KV cache that kept k_rot kept the queries alive (19.5 MiB held for 3.9 MiB of keys), and
    # torch.save(k_rot) wrote 22 kB against 5.7 kB for a clone.
    torch = pytest.importorskip("torch")
    import io

    import rotary

    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 32, 1, 64, generator=g), torch.randn(1, 8, 1, 64, generator=g)
    rope = rotary.RoPE(64)
    for step in range(3):  # (the second and third: through the decoding plan)
        for q_rot, k_rot in (rope.apply(q, k, torch.tensor([40 + step])), rotary.apply(q, k, 40 + step)):
            assert q_rot.untyped_storage().data_ptr() != k_rot.untyped_storage().data_ptr()
            assert k_rot.untyped_storage().nbytes() == k_rot.numel() * k_rot.element_size()
            saved, clone = io.BytesIO(), io.BytesIO()
            torch.save(k_rot, saved)
            torch.save(k_rot.clone(), clone)
            assert len(saved.getvalue()) == len(clone.getvalue())
