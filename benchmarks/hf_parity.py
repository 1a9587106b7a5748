"""HF parity figures: max |difference| between ``RoPE.from_hf(config)`` and the model's own
rotary embedding in ``transformers`` (LlamaRotaryEmbedding + apply_rotary_pos_emb), per
``rope_type``, for ``angles="exact"`` and ``angles="float32"`` (float32 and bfloat16 inputs).

Usage: ``python3 benchmarks/hf_parity.py [--seq 50,300,4000]``
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import test_hf_parity as t  # the parity test's configs and helpers

import rotary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq", default="50,300,4000", help="sequence lengths (original context: 64)")
    lengths = [int(s) for s in ap.parse_args().seq.split(",")]
    head = ["exact: cos/sin", "exact: q/k", "float32: cos/sin", "float32: q/k", "float32 bf16: q/k"]
    print("| rope_type | seq | " + " | ".join(head) + " |")
    print("|---|---|---|---|---|---|---|")
    for name, rp in t.ROPE_PARAMETERS.items():
        config = t._llama(rp)
        for S in lengths:
            row = []
            for angles, dt in (
                ("exact", torch.float32),
                ("float32", torch.float32),
                ("float32", torch.bfloat16),
            ):
                q, k, pos = t._inputs(S, dt)
                want = t._hf_llama(config, pos, q, k)
                got = t._ours(rotary.RoPE.from_hf(config, angles=angles), pos, q, k)
                d = [float((a.double() - b.double()).abs().max()) for a, b in zip(got, want, strict=True)]
                if dt == torch.float32:
                    row += [max(d[:2]), max(d[2:])]
                else:
                    row += [max(d[2:])]
            print(f"| {name} | {S} | " + " | ".join(f"{v:.2g}" for v in row) + " |")


if __name__ == "__main__":
    main()
