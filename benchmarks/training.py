"""Training: what autograd keeps for RoPE's backward, and the time of forward + backward.

The rotation's gradient is the rotation by ``-theta``, so rotary's custom backward keeps only
the positions; plain autograd over the generic code keeps the cos/sin it multiplied by (the
``fast_paths(False)`` row), and Hugging Face's ``apply_rotary_pos_emb`` keeps full-width
``cos``/``sin`` ``(batch, 1, seq, head_dim)``.  Bytes are counted with
``torch.autograd.graph.saved_tensors_hooks`` (distinct storages), for one call on q and k of a
training step: (4, 32, 2048, 128) bfloat16, per-batch positions (4, 1, 2048).
"""

from __future__ import annotations

from typing import Any

import rotary

from ._timing import compare

SHAPE = (4, 32, 2048, 128)
SHAPE_QUICK = (2, 8, 512, 128)


def _saved_bytes(fn: Any) -> int:
    import torch

    seen: dict[int, int] = {}

    def pack(t: Any) -> Any:
        st = t.untyped_storage()
        seen[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(seen.values())


def bench_training(quick: bool, reps: int) -> list:
    try:
        import torch
    except ImportError as e:  # pragma: no cover
        return [{"section": "training", "backend": "torch", "case": f"skipped: {e}"}]
    shape = SHAPE_QUICK if quick else SHAPE
    b, _, n, d = shape
    g = torch.Generator().manual_seed(0)
    q = torch.randn(shape, generator=g).to(torch.bfloat16).requires_grad_(True)
    k = torch.randn(shape, generator=g).to(torch.bfloat16).requires_grad_(True)
    pos = torch.arange(n).expand(b, 1, n).contiguous()  # per-batch positions
    rope = rotary.RoPE(d)

    def ours() -> Any:
        return rope.apply(q, k, pos)

    def autograd() -> Any:
        with rotary.fast_paths(False):
            return rope.apply(q, k, pos)

    cases = {"rotary (custom backward)": ours, "rotary, plain autograd (fast_paths off)": autograd}
    try:
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        c, s = rope.cos_sin(pos[:, 0], full=True, dtype=torch.bfloat16)  # (batch, seq, dim), as HF's

        def hf() -> Any:
            return apply_rotary_pos_emb(q, k, c, s)

        cases["HF apply_rotary_pos_emb"] = hf
    except ImportError:  # pragma: no cover
        pass

    def step(f: Any) -> Any:
        def run() -> None:
            qr, kr = f()
            (qr.float().sum() + kr.float().sum()).backward()

        return run

    saved = {name: _saved_bytes(f) for name, f in cases.items()}
    # the custom backward's closure holds the positions (not a saved tensor): count them
    saved["rotary (custom backward)"] += pos.untyped_storage().nbytes()
    times = compare({name: step(f) for name, f in cases.items()}, reps=max(3, reps // 3), warmup=1)
    rows = []
    base = "rotary, plain autograd (fast_paths off)"
    for name in cases:
        rows.append(
            {
                "section": "training",
                "backend": "torch eager",
                "case": f"{name}: {saved[name] / 2**20:.3f} MiB kept for backward",
                "ms": times[name] * 1e3,
                "baseline": base if name != base else None,
                "ratio": times.ratio(name, base) if name != base else None,
                "target": None,
                "floor_ratio": None,
                "floor_target": None,
                "ok": None,
                "saved_bytes": saved[name],
            }
        )
    kept = saved["rotary (custom backward)"] / max(1, saved[base])
    rows.append(
        {
            "section": "training",
            "backend": "torch eager",
            "case": "bytes kept for backward: custom / plain autograd",
            "ms": None,
            "baseline": None,
            "ratio": kept,
            "target": 0.1,
            "floor_ratio": None,
            "floor_target": None,
            "ok": kept <= 0.1,
        }
    )
    return rows
