"""The GPU matrix: ``python3 -m benchmarks --gpu`` (writes ``benchmarks/results-gpu.json``).

Backends: torch CUDA (the generic array-API code, the fused Triton kernel, ``torch.compile``),
CuPy and JAX on the GPU, where installed.  Shapes: a decoding step (1 token, 32 heads, 128),
a 4k and a 32k prefill (1, 32, S, 128); both layouts; float32 and bfloat16 (CuPy: float32).
q and k have the same shape.  Each row gives the median time, the bandwidth achieved (bytes of
q and k read and written, over the time), that bandwidth as a percentage of a device-to-device
copy of the same bytes measured in the same run, and the ratio to Hugging Face's
``apply_rotary_pos_emb`` (cos/sin precomputed) and to liger-kernel's and flash-attn's rotary
kernels where installed (torch rows, half layout).  On a machine without a CUDA device the
command says so and exits 0.

The timing is device-side where the library allows (CUDA events for torch and CuPy;
``block_until_ready`` for JAX), after warm-up, median of interleaved rounds.
"""

from __future__ import annotations

import json
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import rotary

SHAPES = {"decode": (1, 32, 1, 128), "prefill 4k": (1, 32, 4096, 128), "prefill 32k": (1, 32, 32768, 128)}
QUICK_SHAPES = {"decode": (1, 4, 1, 64), "prefill": (1, 4, 64, 64)}


def _timer(device: str, lib: str) -> Callable[[Callable[[], Any], int], float]:
    """Median seconds per call of ``fn`` over ``reps`` rounds (device-side timing on CUDA)."""

    def cpu(fn: Callable[[], Any], reps: int) -> float:
        fn()
        out = []
        for _ in range(reps):
            t0 = time.perf_counter()
            r = fn()
            if lib == "jax":
                import jax

                jax.block_until_ready(r)
            out.append(time.perf_counter() - t0)
        return statistics.median(out)

    def cuda_torch(fn: Callable[[], Any], reps: int) -> float:
        import torch

        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        inner = 20
        out = []
        for _ in range(reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(inner):
                fn()
            b.record()
            b.synchronize()
            out.append(a.elapsed_time(b) / 1e3 / inner)
        return statistics.median(out)

    def cuda_cupy(fn: Callable[[], Any], reps: int) -> float:
        import cupy

        for _ in range(3):
            fn()
        cupy.cuda.Device().synchronize()
        inner = 20
        out = []
        for _ in range(reps):
            a, b = cupy.cuda.Event(), cupy.cuda.Event()
            a.record()
            for _ in range(inner):
                fn()
            b.record()
            b.synchronize()
            out.append(cupy.cuda.get_elapsed_time(a, b) / 1e3 / inner)
        return statistics.median(out)

    if device == "cpu" or lib == "jax":
        return cpu
    return cuda_cupy if lib == "cupy" else cuda_torch


def _torch_cases(
    shape: tuple[int, ...], layout: str, dtype: str, device: str
) -> dict[str, Callable[[], Any]]:
    import torch

    g = torch.Generator().manual_seed(0)
    dt = getattr(torch, dtype)
    q = torch.randn(shape, generator=g).to(device=device, dtype=dt)
    k = torch.randn(shape, generator=g).to(device=device, dtype=dt)
    n = shape[-2]
    pos = torch.arange(n, device=device) + (4095 if n == 1 else 0)
    rope = rotary.RoPE(shape[-1], layout=layout)
    cases: dict[str, Callable[[], Any]] = {"copy (floor)": lambda: (q.clone(), k.clone())}

    def generic() -> Any:
        with rotary.fast_paths(False):
            return rope.apply(q, k, pos)

    cases["torch generic"] = generic
    if device == "cuda":
        cases["torch triton"] = lambda: rope.apply(q, k, pos)
        compiled = torch.compile(lambda a, b, p: rope.apply(a, b, p), fullgraph=True)
        cases["torch.compile"] = lambda: compiled(q, k, pos)
    c, s = rope.cos_sin(pos, full=True, dtype=dt)
    c, s = c[None], s[None]
    if layout == "half":
        try:
            from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

            cases["HF apply_rotary_pos_emb"] = lambda: apply_rotary_pos_emb(q, k, c, s)
        except ImportError:
            pass
        if device == "cuda":
            try:
                from liger_kernel.ops.rope import LigerRopeFunction

                cases["liger"] = lambda: LigerRopeFunction.apply(q.clone(), k.clone(), c, s)
            except ImportError:
                pass
            try:
                from flash_attn.layers.rotary import apply_rotary_emb

                qt, kt = q.transpose(1, 2), k.transpose(1, 2)  # (batch, seq, heads, dim)
                ch, sh = c[0, :, : shape[-1] // 2], s[0, :, : shape[-1] // 2]
                cases["flash_attn"] = lambda: (apply_rotary_emb(qt, ch, sh), apply_rotary_emb(kt, ch, sh))
            except ImportError:
                pass
    return cases


def _cupy_cases(shape: tuple[int, ...], layout: str, dtype: str) -> dict[str, Callable[[], Any]]:
    import cupy

    rng = np.random.default_rng(0)
    q = cupy.asarray(rng.standard_normal(shape, dtype=np.float32)).astype(dtype)
    k = cupy.asarray(rng.standard_normal(shape, dtype=np.float32)).astype(dtype)
    pos = cupy.arange(shape[-2]) + (4095 if shape[-2] == 1 else 0)
    rope = rotary.RoPE(shape[-1], layout=layout)
    return {"copy (floor)": lambda: (q.copy(), k.copy()), "cupy": lambda: rope.apply(q, k, pos)}


def _jax_cases(shape: tuple[int, ...], layout: str, dtype: str) -> dict[str, Callable[[], Any]]:
    import jax
    import jax.numpy as jnp

    rng = np.random.default_rng(0)
    q = jnp.asarray(rng.standard_normal(shape, dtype=np.float32), dtype=dtype)
    k = jnp.asarray(rng.standard_normal(shape, dtype=np.float32), dtype=dtype)
    pos = jnp.arange(shape[-2]) + (4095 if shape[-2] == 1 else 0)
    rope = rotary.RoPE(shape[-1], layout=layout)
    copy = jax.jit(lambda a, b: (a + 0, b + 0))
    jitted = jax.jit(rope.apply)
    return {
        "copy (floor)": lambda: copy(q, k),
        "jax eager": lambda: rope.apply(q, k, pos),
        "jax.jit": lambda: jitted(q, k, pos),
    }


def rows(device: str = "cuda", *, quick: bool = False, reps: int = 15) -> list[dict[str, Any]]:
    """The matrix's rows (``device="cpu"``: the same code at tiny shapes, to test it here)."""
    shapes = QUICK_SHAPES if quick else SHAPES
    out: list[dict[str, Any]] = []
    libs = ["torch", "cupy", "jax"]
    for lib in libs:
        timer = _timer(device, lib)
        for shape_name, shape in shapes.items():
            for layout in ("half", "interleaved"):
                for dtype in ("float32", "bfloat16"):
                    try:
                        if lib == "torch":
                            cases = _torch_cases(shape, layout, dtype, device)
                        elif lib == "cupy":
                            if device != "cuda" or dtype == "bfloat16":
                                continue
                            cases = _cupy_cases(shape, layout, dtype)
                        else:
                            import jax

                            if (device == "cuda") != (jax.default_backend() != "cpu"):
                                continue
                            cases = _jax_cases(shape, layout, dtype)
                    except ImportError:
                        continue
                    times = {name: timer(fn, reps) for name, fn in cases.items()}
                    nbytes = 4 * int(np.prod(shape)) * (4 if dtype == "float32" else 2)  # q, k in and out
                    floor = times["copy (floor)"]
                    for name, t in times.items():
                        row = {
                            "backend": lib,
                            "case": name,
                            "shape": shape_name,
                            "dims": list(shape),
                            "layout": layout,
                            "dtype": dtype,
                            "us": t * 1e6,
                            "GB/s": nbytes / t / 1e9,
                            "% of copy": 100.0 * floor / t,
                        }
                        for peer in ("HF apply_rotary_pos_emb", "liger", "flash_attn"):
                            if peer in times and name != peer:
                                row[f"x {peer}"] = t / times[peer]
                        out.append(row)
    return out


def print_rows(rs: list[dict[str, Any]]) -> None:
    head = (
        f"{'backend':<7} {'case':<24} {'shape':<12} {'layout':<11} {'dtype':<9} {'us':>10} {'GB/s':>8}"
        f" {'%copy':>6}  vs peers"
    )
    print(head)
    print("-" * len(head))
    for r in rs:
        peers = " ".join(f"{k[2:]}={v:.2f}" for k, v in r.items() if k.startswith("x "))
        print(
            f"{r['backend']:<7} {r['case']:<24} {r['shape']:<12} {r['layout']:<11} {r['dtype']:<9} "
            f"{r['us']:>10.1f} {r['GB/s']:>8.1f} {r['% of copy']:>6.1f}  {peers}"
        )


def main(out: str | None, quick: bool, device: str | None = None) -> int:
    """The ``--gpu`` command: the matrix on the CUDA device, or a clear message without one."""
    if device is None:
        try:
            import torch

            has_cuda = bool(torch.cuda.is_available())
        except ImportError:
            has_cuda = False
        if not has_cuda:
            print("no CUDA GPU on this machine: the GPU matrix was not measured (nothing to report)")
            return 0
        device = "cuda"
    rs = rows(device, quick=quick)
    print_rows(rs)
    if out:
        import torch

        meta = {
            "command": "python3 -m benchmarks --gpu",
            "device": torch.cuda.get_device_name() if device == "cuda" else platform.processor(),
            "torch": torch.__version__,
            "quick": quick,
        }
        with open(out, "w") as f:
            json.dump({"meta": meta, "rows": rs}, f, indent=1)
    return 0
