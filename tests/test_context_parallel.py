"""torch.distributed context parallelism on 2 and 4 gloo ranks (CPU, ``torch.multiprocessing``
spawn): RoPE at the positions of contiguous and zig-zag shards, and causal / non-causal RoPE
linear attention passing prefix states between ranks, forward and backward, against one
process running the whole sequence (``tests/cp_worker.py``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import rotary
from rotary.distributed import shard_positions, shard_sequence

pytest.importorskip("torch")
HERE = Path(__file__).resolve().parent


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
def test_context_parallel_matches_one_process(world, tmp_path):
    out = tmp_path / "cp.json"
    res = subprocess.run(
        [sys.executable, str(HERE / "cp_worker.py"), str(world), str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=HERE.parent,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    results = json.loads(out.read_text())
    variants = ("cu_seqlens", "segment_ids", "decay", "gates and documents")  # (issue 42: documents)
    assert set(results) == {
        *(f"{s}/causal={c}" for s in ("contiguous", "zigzag") for c in (True, False)),
        *(f"{s}/causal=True/{v}" for s in ("contiguous", "zigzag") for v in variants),
    }
    for name, r in results.items():
        assert r["world"] == world
        assert r["rope"] == 0.0, f"{name}: RoPE of a shard differs from the whole sequence's"
        # float64: only the order of the sums of states differs
        assert r["out"] <= 16 * 2.0**-52 and r["grads"] <= 16 * 2.0**-52, f"{name}: {r}"


def test_shards_cover_the_sequence_once():
    for world in (1, 2, 3, 4):
        for sharding in rotary.distributed.SHARDINGS:
            parts = [shard_positions(24, rank=r, world=world, sharding=sharding) for r in range(world)]
            assert sorted(np.concatenate(parts).tolist()) == list(range(24))
            x = np.arange(24)[:, None] * np.ones((1, 3))
            for r in range(world):
                got = shard_sequence(x, rank=r, world=world, sharding=sharding, axis=0)[:, 0]
                assert got.tolist() == parts[r].tolist()
    zig = [shard_positions(8, rank=r, world=2, sharding="zigzag").tolist() for r in range(2)]
    assert zig == [[0, 1, 6, 7], [2, 3, 4, 5]]  # rank r: chunks r and 2w - 1 - r (TE, Megatron)


def test_shard_errors_name_the_argument():
    with pytest.raises(ValueError, match="equal chunks"):
        shard_positions(10, rank=0, world=4)
    with pytest.raises(ValueError, match="rank"):
        shard_positions(8, rank=2, world=2)
    with pytest.raises(ValueError, match="sharding"):
        shard_positions(8, rank=0, world=2, sharding="ring")
