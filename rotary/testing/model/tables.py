"""Tables: positions clamped or wrapped at a table's end, and an engine right (or making a known
mistake) below its own table and wrong past it."""

from __future__ import annotations

from typing import Any

import numpy as np

from .layer import _Call, _Layer, _scalar_pos
from .suspects import _suspects
from .truth import _at


def _clamped(layer: _Layer, calls: list[_Call], first: int | None) -> tuple[str, int | None]:
    """Positions past a table read its last row (clamped) or wrap around it: words and the table's size."""
    if first is None or first <= 0:
        return "", None
    marks = {first - 1, first}
    table = getattr(layer.eng, "max_position", None)
    if table:
        marks |= {int(table) - 1, int(table)}
    truth = _at(layer.rope, layer.af)
    for cap in sorted(m for m in marks if m > 0):

        def clamp(x: np.ndarray, p: np.ndarray, cap: int = cap) -> np.ndarray:
            return truth(x, np.minimum(p, cap - 1))

        def wrap(x: np.ndarray, p: np.ndarray, cap: int = cap) -> np.ndarray:
            return truth(x, p % cap)

        at = f"from position {cap} on the engine rotates by the angle of position"
        if all(float(layer.errors(c, fn=clamp).max()) <= 1.0 for c in calls):
            return f"{at} {cap - 1}: positions clamped to a table of {cap} rows", cap
        if all(float(layer.errors(c, fn=wrap).max()) <= 1.0 for c in calls):
            return f"{at} p mod {cap}: positions wrap around a table of {cap} rows", cap
    return "", None


def _worst_below(layer: _Layer, c: _Call, fn: Any, limit: int) -> float:
    """The worst error of call ``c`` against ``fn`` over its tokens at positions below ``limit``."""
    if c.out is None:
        return 0.0
    e = layer.errors(c, fn=fn)[np.asarray(_scalar_pos(c)) < limit]
    return float(e.max()) if e.size else 0.0


def _table_words(
    layer: _Layer, calls: list[_Call], bad: list[int], first: int | None
) -> tuple[list[str], int | None]:
    """Where no known mistake matches: positions clamped or wrapped at a table's end, or an engine
    right (or making a known mistake) below its own table and wrong past it; the words and the
    table's size (the frequencies are then measured below it)."""
    words: list[str] = []
    clamp, cap = _clamped(layer, calls, first)
    if clamp:
        words.append(clamp)
    table = int(getattr(layer.eng, "max_position", None) or 0)
    outside = (
        "wrong past it, where it reads outside its table (neither clamped nor wrapped: refuse "
        "positions past it, or size the table by the context)"
    )
    if not clamp and table and bad and min(bad) >= table:
        # (right at every position checked below the engine's own table, wrong past it)
        cap = table
        words.append(
            f"right at every position checked below the engine's table of {table} rows (its "
            f"max_position), {outside}"
        )
    elif not clamp and table and bad and max(bad) >= table:
        # (a known mistake below the table, and reads past it)
        below = [
            label
            for label, fn in _suspects(layer)
            if all(_worst_below(layer, c, fn, table) <= 1.0 for c in calls)
        ]
        if below:
            cap = table
            words.append(
                f"below the engine's table of {table} rows (its max_position) its numbers match "
                f"{below[0]}; {outside}"
            )
    return words, cap
