"""M-RoPE: its known mistakes (the sections in the other layout, the temporal row for every
frequency)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ...multiaxis import MRoPE, _round_robin
from .layer import _Layer
from .truth import _at, _truth


def _mrope_suspects(
    layer: _Layer, rope: MRoPE
) -> list[tuple[str, Callable[[np.ndarray, np.ndarray], np.ndarray]]]:
    """M-RoPE's known mistakes: the sections in the other layout (consecutive, or Qwen3-VL's round
    robin), the temporal row for every frequency."""
    cfg, af = layer.cfg, layer.af
    out: list[tuple[str, Callable[[np.ndarray, np.ndarray], np.ndarray]]] = []
    alt = None
    if not rope._custom_rows:
        # (the other layout: consecutive sections, or Qwen3-VL's round robin as transformers
        # lays it out for any sections, whose rows' counts need not be the sections)
        rows = list(_round_robin(rope.sections)) if not rope.interleaved else None
        sections = tuple(rows.count(j) for j in range(len(rope.sections))) if rows else rope.sections
        alt = MRoPE(
            cfg.head_dim,
            sections,
            rows=rows,
            base=cfg.base,
            layout=cfg.layout,
            rotary_dim=cfg.rotary_dim,
            scaling=cfg.scaling,
        )
    if alt is not None:
        kind = "consecutive" if rope.interleaved else "interleaved (Qwen3-VL)"
        out.append((f"M-RoPE sections laid out {kind}", _at(alt, af)))
    out.append(
        (
            "M-RoPE with the temporal row for every frequency (text positions only)",
            lambda x, p: _truth(rope, x, np.broadcast_to(p[:1], p.shape).copy()),
        )
    )
    return out
