"""The truth: the config's RoPE per layer type, its float64 rotation, the context it claims, and the
rotations of its variants the diagnosis compares with."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ... import hf
from ..._config import RopeConfig
from ..._hfconfig import _as_dict
from ..._rope import RoPE
from ...multiaxis import MRoPE
from ...scaling import DynamicNTK, YaRN

Rope = RoPE | MRoPE


def _layers(config: Mapping[str, Any]) -> list[tuple[str | None, int, Rope]]:
    """``(layer type, first layer index, RoPE)`` of each distinct RoPE of the config."""
    m = hf.model_rope(config)
    out: list[tuple[str | None, int, Rope]] = []
    if m.layers:
        types = m.layer_types if m.layer_types and len(set(m.layer_types)) > 1 else None
        seen: set[Any] = set()
        for i, r in enumerate(m.layers):
            if r is None:
                continue
            lt = types[i] if types else None
            if (lt, r) in seen:
                continue
            seen.add((lt, r))
            out.append((lt, i, r))
        return out
    try:
        return [(None, 0, hf.mrope_from_hf(config))]
    except ValueError:
        return [(None, 0, hf.from_hf(config))]


def _rope_config(rope: Rope) -> RopeConfig:
    return rope.rope.config if isinstance(rope, MRoPE) else rope.config


def _truth(rope: Rope, x: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """``x`` ``(tokens, heads, d)`` rotated by ``rope`` at ``pos`` (``(tokens,)`` or ``(rows, tokens)``)."""
    p = pos[..., None] if pos.ndim == 2 else pos[:, None]
    return np.asarray(rope.rotate(np.asarray(x, dtype=np.float64), p))


def _truth_any(rope: Rope, x: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """:func:`_truth` at any real positions (non-finite ones give NaN, as an engine's would)."""
    bad = ~np.isfinite(pos)
    y = _truth(rope, x, np.where(bad, 0.0, pos))
    mask = bad if bad.ndim == 1 else bad.any(axis=0)
    y[mask, :, : _rope_config(rope).width] = np.nan  # (the features past the width pass through)
    return y


def _context(config: Mapping[str, Any], rope: Rope) -> int:
    """The positions the config claims: ``max_position_embeddings``; with YaRN, at least ``factor``
    times its original context (Qwen2.5's 128K: 4 x 32768 over a config saying 32768); with
    dynamic NTK, ``factor`` times ``max_position_embeddings`` (positions past it are what the
    scaling is for).  Linear scaling says nothing of the kind: Vicuna-16k keeps 4096 there, Gemma 3
    the extended 131072."""
    n = _max_positions(config)
    sc = _rope_config(rope).scaling
    if isinstance(sc, YaRN):
        return max(n, int(sc.factor * sc.original_max_position_embeddings))
    if isinstance(sc, DynamicNTK):
        return max(n, int(sc.factor * sc.max_position_embeddings))
    return max(n, int(getattr(sc, "original_max_position_embeddings", 0) or 0))


def _max_positions(config: Mapping[str, Any]) -> int:
    """The config's ``max_position_embeddings`` (or its older names; 0 if none)."""
    d = _as_dict(config)
    sub = d.get("text_config")
    text: Mapping[str, Any] = sub if isinstance(sub, Mapping) else d
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        if isinstance(text.get(key), int):
            return int(text[key])
    return 0


def _with(cfg: RopeConfig, rope: Rope, **changes: Any) -> Rope:
    c = dataclasses.replace(cfg, **changes)
    if isinstance(rope, MRoPE):
        return MRoPE(
            c.head_dim,
            rope.sections,
            interleaved=rope.interleaved,
            rows=rope._rows if rope._custom_rows else None,
            base=c.base,
            layout=c.layout,
            rotary_dim=c.rotary_dim,
            scaling=c.scaling,
            angles="exact",
        )
    return RoPE.from_config(c)


def _at(rope: Rope, factor: float) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """``rope``'s rotation with cos and sin scaled by ``factor`` (its own attention factor replaced)."""
    cfg = _rope_config(rope)
    own, w = float(cfg.attention_factor), cfg.width

    def fn(x: np.ndarray, p: np.ndarray) -> np.ndarray:
        y = _truth(rope, x, p)
        if own != factor:
            y[..., :w] *= factor / own
        return y

    return fn


def _pairs(x: np.ndarray, cfg: RopeConfig) -> np.ndarray:
    """The rotated pairs of ``x`` ``(..., d)`` as complex numbers ``(..., width/2)``."""
    w, h = cfg.width, cfg.width // 2
    if cfg.layout == "half":
        return x[..., :h] + 1j * x[..., h:w]
    return x[..., 0:w:2] + 1j * x[..., 1:w:2]


def _partners(layout: str, width: int, d: int) -> np.ndarray:
    """Per feature, the feature ``layout`` pairs it with over ``width`` features (-1: none)."""
    j = np.arange(d)
    h = width // 2
    if layout == "half":
        p = np.where(j < h, j + h, j - h)
    else:
        p = j ^ 1
    return np.where(j < width, p, -1)
