"""Context parallelism on 2 CPU ranks (torch.distributed, gloo): causal RoPE linear attention
over a sequence split into zig-zag shards, against one process running the whole sequence.

Each rank holds chunks ``r`` and ``2 w - 1 - r`` of the sequence (equal causal work), rotates
at its shards' global positions (``rotary.distributed.shard_positions``) and passes only the
small key/value summaries between ranks; gradients flow back through them.

    python examples/context_parallel.py [--world 2] [--sharding zigzag]
"""

from __future__ import annotations

import argparse
import os
import tempfile


def _rank(rank: int, world: int, init: str, sharding: str, out: str) -> None:
    import torch
    import torch.distributed as dist

    import rotary
    from rotary.distributed import context_parallel_linear_attention, shard_positions, shard_sequence

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    g = torch.Generator().manual_seed(0)
    n = 16 * world
    q, k, v = (torch.randn(1, 2, n, 16, generator=g, dtype=torch.float64) for _ in range(3))
    mine = [shard_sequence(t, rank=rank, world=world, sharding=sharding) for t in (q, k, v)]
    pos = torch.as_tensor(shard_positions(n, rank=rank, world=world, sharding=sharding))
    got = context_parallel_linear_attention(*mine, pos, sharding=sharding, chunk_size=4)
    whole = rotary.linear_attention(q, k, v, torch.arange(n), causal=True, chunk_size=4)
    err = float((got - shard_sequence(whole, rank=rank, world=world, sharding=sharding)).abs().max())
    errs = [torch.zeros(()) for _ in range(world)]
    dist.all_gather(errs, torch.tensor(err))
    if rank == 0:
        with open(out, "w") as f:
            f.write(str(max(float(e) for e in errs)))
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> float:
    import torch.multiprocessing as mp

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--sharding", choices=["contiguous", "zigzag"], default="zigzag")
    args = p.parse_args(argv)
    folder = tempfile.mkdtemp()
    out = os.path.join(folder, "err.txt")
    init = "file://" + os.path.join(folder, "rendezvous")
    mp.spawn(_rank, args=(args.world, init, args.sharding, out), nprocs=args.world, join=True)
    err = float(open(out).read())
    print(f"{args.world} ranks, {args.sharding} shards: max |context parallel - one process| = {err:.3g}")
    return err


if __name__ == "__main__":
    main()
