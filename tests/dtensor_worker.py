"""``python tests/dtensor_worker.py``: rotary on DTensors of a 2-rank gloo mesh (CPU), against the
same computation on plain tensors; prints one JSON line of results from rank 0
(``tests/test_dtensor.py`` runs it in a fresh process)."""

from __future__ import annotations

import json
import os
import socket
import sys
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = 2


def _err(a: Any, b: Any) -> float:
    return float((a - b).detach().abs().max())


def _cases() -> list[tuple[str, Any]]:
    """``(name, f(q, k, pos) -> (q_rot, k_rot))``: the rotations served shard by shard."""
    import rotary

    yarn = rotary.RoPE(16, scaling=rotary.YaRN(4.0, 8))
    partial = rotary.RoPE(16, layout="interleaved", rotary_dim=8)
    dynamic = rotary.RoPE(16, scaling=rotary.DynamicNTK(2.0, 4))
    return [
        ("RoPE.apply yarn", yarn.apply),
        ("apply", lambda q, k, p: rotary.apply(q, k, p, base=500.0)),
        ("rotate partial interleaved", lambda q, k, p: (partial.rotate(q, p), partial.rotate(k, p))),
        ("dynamic NTK", dynamic.apply),
        ("convert_layout", lambda q, k, p: (rotary.convert_layout(q, "half", "interleaved"), k)),
    ]


def work(rank: int, port: int, out: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    from torch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor, init_device_mesh

    import rotary

    mesh = init_device_mesh("cpu", (WORLD,))
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 6, 16, generator=g, dtype=torch.float64)
    k = torch.randn(2, 2, 6, 16, generator=g, dtype=torch.float64)
    wq, wk = torch.randn_like(q), torch.randn_like(k)
    pos = torch.arange(6) + 4090  # (across the end of the per-position table)
    results: list[dict[str, Any]] = []
    for name, f in _cases():
        lq, lk = q.clone().requires_grad_(), k.clone().requires_grad_()
        want = f(lq, lk, pos)
        ((want[0] * wq).sum() + (want[1] * wk).sum()).backward()
        for placement in (Shard(0), Shard(1), Shard(2), Replicate()):
            for pkind in ("plain", "DTensor replicated", "DTensor sharded"):
                dq = distribute_tensor(q, mesh, [placement]).requires_grad_()
                dk = distribute_tensor(k, mesh, [placement]).requires_grad_()
                p = pos
                if pkind != "plain":
                    p = distribute_tensor(pos, mesh, [Replicate() if "replicated" in pkind else Shard(0)])
                row = {"case": name, "placement": str(placement), "positions": pkind}
                try:
                    got = f(dq, dk, p)
                    dwq, dwk = (distribute_tensor(w, mesh, [placement]) for w in (wq, wk))
                    # (a DTensor loss: each rank's shard differentiates its own rows)
                    ((got[0] * dwq).sum() + (got[1] * dwk).sum()).full_tensor().backward()
                    row.update(
                        types=sorted({type(o).__name__ for o in got}),
                        placements=[list(map(str, o.placements)) for o in got],
                        value=max(_err(got[0].full_tensor(), want[0]), _err(got[1].full_tensor(), want[1])),
                        grad=max(_err(dq.grad.full_tensor(), lq.grad), _err(dk.grad.full_tensor(), lk.grad)),
                    )
                except Exception as e:
                    row["error"] = f"{type(e).__name__}: {e}"
                results.append(row)
    # refusals: the feature axis sharded, attention, a pending max
    refusals = {}
    dq = distribute_tensor(q, mesh, [Shard(3)])
    for what, call in (
        ("features sharded", lambda: rotary.rotate(dq, pos)),
        (
            "attention",
            lambda: rotary.attention(*(distribute_tensor(t, mesh, [Shard(0)]) for t in (q, q, q)), pos),
        ),
        (
            "partial max",
            lambda: rotary.rotate(rotary_partial(q, mesh, Partial("max")), pos),
        ),
    ):
        try:
            call()
            refusals[what] = "served"
        except (TypeError, ValueError) as e:
            refusals[what] = str(e)
    # a Partial sum is linear: rotated shard by shard, then reduced
    ps = rotary_partial(q, mesh, Partial("sum"))
    got = rotary.rotate(ps, pos)
    partial_sum = _err(got.full_tensor(), rotary.rotate(q, pos))
    if rank == 0:
        out.put(json.dumps({"results": results, "refusals": refusals, "partial sum": partial_sum}))
    dist.destroy_process_group()


def rotary_partial(x: Any, mesh: Any, placement: Any) -> Any:
    """``x`` as a DTensor pending a reduction: rank 0 holds ``x``, the others zeros (sum and max:
    the reduction is ``x`` again for ``x >= 0``... and for a sum always)."""
    from torch.distributed.tensor import DTensor

    local = x if dist.get_rank() == 0 else torch.zeros_like(x)
    return DTensor.from_local(local, mesh, [placement], run_check=False)


def main() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    mp.start_processes(work, args=(port, out), nprocs=WORLD, start_method="spawn")
    print(out.get())


if __name__ == "__main__":
    sys.exit(main())
