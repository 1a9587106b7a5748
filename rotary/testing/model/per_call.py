"""Scalings chosen per call (LongRoPE, dynamic NTK): the calls on either side of where they switch,
LongRoPE's known mistakes, transformers' stateful dynamic NTK."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ...scaling import DynamicNTK, Factors, LongRoPE
from .layer import _Call, _Layer
from .truth import _at, _with


def _switch_lengths(layer: _Layer) -> tuple[int, ...]:
    """Call lengths on either side of where a scaling chosen per call switches: LongRoPE's short
    and long factors at ``original_max_position_embeddings``, dynamic NTK's growth past the
    context (a call of ``n`` tokens at positions ``0 .. n-1``)."""
    sc = layer.cfg.scaling
    n0 = 0
    if isinstance(sc, LongRoPE):
        n0 = int(sc.original_max_position_embeddings)
    elif isinstance(sc, DynamicNTK):
        n0 = int(sc.max_position_embeddings)
    return (n0, n0 + 1) if 0 < n0 <= 65536 else ()


def _longrope_suspects(
    layer: _Layer, sc: LongRoPE
) -> list[tuple[str, Callable[[np.ndarray, np.ndarray], np.ndarray]]]:
    """LongRoPE's known mistakes: one set of factors at every length, the long ones one token late
    (in one table of short then long rows, too), the factors chosen per token."""
    rope, cfg, af = layer.rope, layer.cfg, layer.af
    out: list[tuple[str, Callable[[np.ndarray, np.ndarray], np.ndarray]]] = []
    by: dict[str, Any] = {}
    for label, fac in (("long", sc.long_factor), ("short", sc.short_factor)):
        by[label] = _at(_with(cfg, rope, scaling=Factors(fac)), af)
        out.append((f"LongRoPE's {label} factors at every length", by[label]))
    n0 = sc.original_max_position_embeddings

    def per_token(x: np.ndarray, p: np.ndarray, n0: int = n0) -> np.ndarray:
        long = (p if p.ndim == 1 else p.max(axis=0)) >= n0
        return np.where(long[:, None, None], by["long"](x, p), by["short"](x, p))

    def late(x: np.ndarray, p: np.ndarray, n0: int = n0) -> np.ndarray:
        return by["long"](x, p) if int(np.max(p)) > n0 else by["short"](x, p)

    def late_rows(x: np.ndarray, p: np.ndarray, n0: int = n0) -> np.ndarray:
        # (one table: n0 short rows, then the long ones, read at p + n0 in a long call)
        if int(np.max(p)) > n0:
            return by["long"](x, p)
        past = (p if p.ndim == 1 else p.max(axis=0)) >= n0
        return np.where(past[:, None, None], by["long"](x, p - n0), by["short"](x, p))

    one_late = (
        f"LongRoPE's long factors only in a call whose largest position exceeds {n0} (max(pos) > "
        f"{n0}) where transformers takes them for a call longer than {n0} (max(pos) + 1 > {n0}): "
        f"one token late"
    )
    out.append((one_late, late))
    out.append(
        (
            f"{one_late}; in a call of {n0 + 1} tokens position {n0} reads the long factors' row 0 "
            f"(one table of {n0} short rows, then the long ones)",
            late_rows,
        )
    )
    out.append(
        (
            f"LongRoPE's short factors below position {n0} and its long ones from {n0} on, chosen per "
            f"token (transformers chooses one set per call: the long factors for every token of a "
            f"call longer than original_max_position_embeddings {n0})",
            per_token,
        )
    )
    return out


def _kept_growth_words(layer: _Layer, calls: list[_Call]) -> str:
    """Where the engine's numbers are those of transformers' stateful dynamic NTK over the calls
    in the order they ran: a call keeps the frequencies grown for the longest call before it while
    it has at least ``L`` tokens, and resets only below ``L``."""
    cfg, sc = layer.cfg, layer.cfg.scaling
    if not isinstance(sc, DynamicNTK) or not any(c.switch for c in calls):
        return ""
    big_l, cached, d = int(sc.max_position_embeddings), int(sc.max_position_embeddings), cfg.freq_dim
    longest = 0
    for c in calls:
        if c.out is None:
            continue
        n = int(np.max(c.pos)) + 1
        if n > cached:
            cached = n
        if n < big_l and cached > big_l:
            cached = big_l
        if cached > n:
            longest = max(longest, cached)
        grown = cfg.base * (sc.factor * cached / big_l - (sc.factor - 1.0)) ** (d / (d - 2))
        fn = _at(_with(cfg, layer.rope, base=grown if cached > big_l else cfg.base, scaling=None), layer.af)
        if float(layer.errors(c, fn=fn).max()) > 1.0:
            return ""
    if not longest:
        return ""
    return (
        f"transformers' stateful dynamic NTK: a call keeps the frequencies grown for the longest call "
        f"before it (here {longest} tokens) while it has at least max_position_embeddings {big_l} "
        f"tokens, and resets only below {big_l} (a fresh module, and the config's rotation, use each "
        f"call's own length)"
    )
