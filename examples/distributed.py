"""RoPE and RoPE linear attention beyond one machine: Dask and sharded JAX.

Run:  python examples/distributed.py            (a few seconds; writes nothing)
      python examples/distributed.py --threads  (Dask's threaded scheduler instead of a LocalCluster)

1. Dask: queries/keys/values chunked over batch and sequence.  ``rotary.apply`` and
   ``rotary.linear_attention`` build lazy graphs with one task per block; causal linear
   attention runs as a scan over the per-block key/value summaries, on a
   ``dask.distributed.LocalCluster`` of two worker processes.
2. JAX: the sequence split over 4 (simulated CPU) devices.  ``rotary.apply`` under
   ``jax.jit`` keeps the sharding with no communication at all;
   ``rotary.distributed.sequence_parallel_linear_attention`` passes only the small
   summaries between devices (collective-permute) and matches the one-device result.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import sys
import time
from pathlib import Path

# This file is named like the ``distributed`` package: keep its folder off the import path.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

# JAX reads these once, at import: 4 CPU devices unless the caller chose otherwise.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np  # noqa: E402

import rotary  # noqa: E402

#: The optional libraries the examples use, and the extra of ``pyproject.toml`` that installs each.
EXTRAS = {"matplotlib": "plot", "torch": "torch", "jax": "jax", "dask": "dask", "distributed": "dask"}


def require(*modules: str) -> None:
    """Exit with a message naming the extra to install if a library this example needs is missing."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        extras = ",".join(dict.fromkeys(EXTRAS[m] for m in missing))
        sys.exit(
            f"{os.path.basename(__file__)} needs {', '.join(missing)}, not installed here: "
            f'pip install ".[{extras}]" in the rotary checkout'
        )


COLLECTIVES = ("all-gather", "all-reduce", "collective-permute", "all-to-all", "reduce-scatter")


def dask_demo(use_cluster: bool) -> None:
    import dask
    import dask.array as da

    rng = np.random.default_rng(0)
    B, H, N, D = 2, 4, 256, 32
    q, k, v = (rng.normal(size=(B, H, N, D)).astype(np.float32) for _ in range(3))
    chunks = (1, H, 64, D)  # split over batch and sequence; each block holds whole heads
    dq, dk, dv = (da.from_array(a, chunks=chunks) for a in (q, k, v))
    pos = da.arange(N, chunks=64)

    q_rot, _ = rotary.apply(dq, dk, pos)  # lazy: nothing computed yet
    out = rotary.linear_attention(dq, dk, dv, pos, causal=True)  # a scan over block summaries
    layers = sorted({re.sub(r"-[0-9a-f]{32}$", "", name) for name in out.__dask_graph__().layers})
    print(f"[dask] q chunks {dq.chunks}")
    print(f"[dask] apply keeps them: {q_rot.chunks == dq.chunks}; {len(q_rot.__dask_graph__())} tasks")
    print(f"[dask] causal linear attention: {len(out.__dask_graph__())} tasks, layers {layers}")

    client = cluster = None
    if use_cluster:
        from distributed import Client, LocalCluster

        t = time.perf_counter()
        cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None)
        client = Client(cluster)
        print(f"[dask] LocalCluster with 2 worker processes up in {time.perf_counter() - t:.1f} s")
    try:
        with dask.config.set(scheduler="threads") if client is None else _nothing():
            t = time.perf_counter()
            got_rot, got = dask.compute(q_rot, out)
            print(f"[dask] computed in {time.perf_counter() - t:.2f} s")
    finally:
        if client is not None:
            client.close()
            cluster.close()
    ref_rot, _ = rotary.apply(q, k, np.arange(N))
    ref = rotary.linear_attention(q, k, v, np.arange(N), causal=True)  # one NumPy call, whole sequence
    print(f"[dask] max |apply - NumPy| = {np.max(np.abs(got_rot - ref_rot)):.2e}")
    print(f"[dask] max |causal linear attention - NumPy| = {np.max(np.abs(got - ref)):.2e}")


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def jax_demo() -> None:
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from rotary.distributed import sequence_parallel_linear_attention

    n = len(jax.devices())
    mesh = jax.make_mesh((n,), ("seq",))
    rng = np.random.default_rng(1)
    B, H, N, D = 2, 4, 64 * n, 32
    q, k, v = (rng.normal(size=(B, H, N, D)).astype(np.float32) for _ in range(3))
    seq = NamedSharding(mesh, P(None, None, "seq"))
    jq, jk, jv = (jax.device_put(a, seq) for a in (q, k, v))
    pos = jnp.arange(N)
    print(f"[jax] {n} devices; q {q.shape} split over the sequence: {jq.sharding.spec}")

    def collectives(f, *args):
        hlo = f.lower(*args).compile().as_text()
        return [c for c in COLLECTIVES if c in hlo] or ["none"]

    apply = jax.jit(lambda q, k, pos: rotary.apply(q, k, pos))
    q_rot, _ = apply(jq, jk, pos)
    print(f"[jax] apply: output spec {q_rot.sharding.spec}, collectives {collectives(apply, jq, jk, pos)}")

    sp = jax.jit(
        lambda q, k, v, pos: sequence_parallel_linear_attention(
            q, k, v, pos, mesh=mesh, axis_name="seq", causal=True, chunk_size=32
        )
    )
    out = sp(jq, jk, jv, pos)
    ref = rotary.linear_attention(q, k, v, np.arange(N), causal=True, chunk_size=32)
    print(
        f"[jax] sequence-parallel causal linear attention: output spec {out.sharding.spec}, "
        f"collectives {collectives(sp, jq, jk, jv, pos)}"
    )
    print(f"[jax] max |sharded - one device| = {np.max(np.abs(np.asarray(out) - ref)):.2e}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", action="store_true", help="Dask threads instead of a LocalCluster")
    args = parser.parse_args()
    require("dask", "distributed", "jax")
    dask_demo(use_cluster=not args.threads)
    jax_demo()


if __name__ == "__main__":
    main()
