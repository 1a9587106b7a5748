"""Context parallelism on ``world`` gloo ranks (``torch.multiprocessing`` spawn), run by
``tests/test_context_parallel.py``: ``python tests/cp_worker.py WORLD OUT.json``.

Every rank builds the same whole sequence, takes its part (contiguous and zig-zag), runs RoPE
and causal/non-causal linear attention with context parallelism, and backpropagates a loss
that depends on every rank's outputs.  Rank 0 compares the gathered outputs and gradients with
one process running the whole sequence and writes the largest errors.
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import rotary
from rotary.distributed import context_parallel_linear_attention, shard_positions, shard_sequence

N, D = 32, 8


def _inputs():  # type: ignore[no-untyped-def]
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, N, D, generator=g, dtype=torch.float64)
    k = torch.randn(2, 2, N, D, generator=g, dtype=torch.float64)  # grouped-query heads
    v = torch.randn(2, 2, N, 5, generator=g, dtype=torch.float64)
    w = torch.randn(2, 4, N, 5, generator=g, dtype=torch.float64)
    return q, k, v, w


#: Packed documents and decay (causal): boundaries inside shards and on their edges (N = 32 over
#: 2 or 4 ranks, zig-zag chunks of 8 or 4 tokens), one id row per batch row; given globally as
#: cu_seqlens, or as each rank's part of segment_ids and log_gate.
CU = torch.tensor([0, 3, 8, 12, 13, 20, 32])
SEG = torch.stack([torch.repeat_interleave(torch.arange(6), CU.diff()), (torch.arange(N) >= 16).long()])
SEG = SEG[:, None, :]
GATE = -torch.rand(2, 2, N, generator=torch.Generator().manual_seed(1), dtype=torch.float64) * 0.3
VARIANTS = {
    "plain": {},
    "cu_seqlens": {"cu_seqlens": CU},
    "segment_ids": {"segment_ids": SEG},
    "decay": {"decay": torch.tensor([0.9, 0.7], dtype=torch.float64)},  # (per key head)
    "gates and documents": {"log_gate": GATE, "segment_ids": SEG, "decay": 0.9},
}


def _whole(causal: bool, variant: str = "plain"):  # type: ignore[no-untyped-def]
    q, k, v, w = (t.clone().requires_grad_(i < 3) for i, t in enumerate(_inputs()))
    out = rotary.linear_attention(q, k, v, torch.arange(N), causal=causal, chunk_size=4, **VARIANTS[variant])
    (out * w).sum().backward()
    return out.detach(), q.grad, k.grad, v.grad


def _gather(x, world):  # type: ignore[no-untyped-def]
    parts = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(parts, x.contiguous())
    return parts


def _unshard(parts, sharding):  # type: ignore[no-untyped-def]
    """The whole sequence from every rank's part (axis -2)."""
    world = len(parts)
    full = torch.empty(
        (*parts[0].shape[:-2], parts[0].shape[-2] * world, parts[0].shape[-1]), dtype=parts[0].dtype
    )
    idx = torch.arange(full.shape[-2])
    for r, p in enumerate(parts):
        mine = shard_sequence(idx[:, None], rank=r, world=world, sharding=sharding, axis=0)[:, 0]
        full[..., mine, :] = p
    return full


def run(rank: int, world: int, init: str, out_path: str) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    results = {}
    q0, k0, v0, w0 = _inputs()
    for sharding in ("contiguous", "zigzag"):
        pos = torch.as_tensor(shard_positions(N, rank=rank, world=world, sharding=sharding))
        # RoPE on sharded q/k at the sharded positions: the whole sequence's rotation, sliced
        qr, kr = rotary.apply(
            *(shard_sequence(t, rank=rank, world=world, sharding=sharding) for t in (q0, k0)), pos
        )
        wq, wk = rotary.apply(q0, k0, torch.arange(N))
        rope_err = max(
            float((qr - shard_sequence(wq, rank=rank, world=world, sharding=sharding)).abs().max()),
            float((kr - shard_sequence(wk, rank=rank, world=world, sharding=sharding)).abs().max()),
        )
        for causal in (True, False):
            q, k, v, w = (
                shard_sequence(t, rank=rank, world=world, sharding=sharding) for t in (q0, k0, v0, w0)
            )
            q, k, v = (t.clone().requires_grad_(True) for t in (q, k, v))
            out = context_parallel_linear_attention(
                q, k, v, pos, sharding=sharding, causal=causal, chunk_size=4
            )
            (out * w).sum().backward()
            got = [_unshard(_gather(t, world), sharding) for t in (out.detach(), q.grad, k.grad, v.grad)]
            if rank == 0:
                want = _whole(causal)
                errs = [
                    float((a - b).abs().max() / max(1.0, float(b.abs().max()))) for a, b in zip(got, want)
                ]
                results[f"{sharding}/causal={causal}"] = {
                    "out": errs[0],
                    "grads": max(errs[1:]),
                    "rope": rope_err,
                    "world": dist.get_world_size(),
                }
        for variant, opts in VARIANTS.items():  # (causal: documents and decay across shards)
            if variant == "plain":
                continue

            local = {
                key: shard_sequence(val[..., None], rank=rank, world=world, sharding=sharding)[..., 0]
                if key in ("segment_ids", "log_gate")
                else val
                for key, val in opts.items()
            }
            q, k, v, w = (
                shard_sequence(t, rank=rank, world=world, sharding=sharding) for t in (q0, k0, v0, w0)
            )
            q, k, v = (t.clone().requires_grad_(True) for t in (q, k, v))
            out = context_parallel_linear_attention(
                q, k, v, pos, sharding=sharding, causal=True, chunk_size=4, **local
            )
            (out * w).sum().backward()
            got = [_unshard(_gather(t, world), sharding) for t in (out.detach(), q.grad, k.grad, v.grad)]
            if rank == 0:
                want = _whole(True, variant)
                errs = [
                    float((a - b).abs().max() / max(1.0, float(b.abs().max()))) for a, b in zip(got, want)
                ]
                results[f"{sharding}/causal=True/{variant}"] = {
                    "out": errs[0],
                    "grads": max(errs[1:]),
                    "rope": rope_err,
                    "world": dist.get_world_size(),
                }
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(results, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    world, out_path = int(sys.argv[1]), sys.argv[2]
    init = "file://" + os.path.abspath(out_path) + ".rendezvous"
    mp.spawn(run, args=(world, init, out_path), nprocs=world, join=True)
