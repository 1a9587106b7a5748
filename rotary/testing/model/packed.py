"""Packed input (``rotate_packed``): the packed checks and the words naming a wrong document."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..engine import Unsupported
from .factors import _measure_factor
from .layer import _Call, _data, _Layer
from .report import ModelCheck
from .truth import _truth

#: The packed row: documents of these lengths, 32 tokens (one of a single token).
PACKED_LENGTHS = (7, 1, 12, 4, 8)


#: Where each document continues in ``packed_offsets`` (each capped so that the document ends
#: within the config's context).
PACKED_OFFSETS = (9, 2047, 0, 31, 4000)


def _packed_row(check: str, context: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(cu_seqlens, offsets, positions)`` of the packed row of ``check``: the positions rotary's
    packing implies (:func:`rotary.positions.from_cu_seqlens`, plus each document's offset)."""
    from ...positions import from_cu_seqlens

    lengths = np.asarray(PACKED_LENGTHS, dtype=np.int64)
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    offsets = np.zeros_like(lengths)
    if check == "packed_offsets":
        offsets = np.asarray(PACKED_OFFSETS, dtype=np.int64)
        if context:
            offsets = np.minimum(offsets, np.maximum(context - lengths, 0))
    pos = np.asarray(from_cu_seqlens(cu), dtype=np.int64) + np.repeat(offsets, lengths)
    return cu, offsets, pos


def _packed(layer: _Layer, check: str, context: int, row: Any) -> ModelCheck:
    """One packed row through the engine's ``rotate_packed``, against rotary's packed rotation."""
    if getattr(layer.eng, "rotate_packed", None) is None:
        return row(
            check,
            "not applicable",
            message="the engine's RoPE, as adapted, takes no packed input (no rotate_packed)",
        )
    if layer.n_rows > 1:
        return row(
            check,
            "not applicable",
            message="M-RoPE: a packed row's documents imply one position per token, not M-RoPE's rows",
        )
    cu, offsets, pos = _packed_row(check, context)
    n = int(cu[-1])
    q = _data(layer.rng, (n, layer.heads[0], layer.cfg.head_dim), layer.dtype)
    k = _data(layer.rng, (n, layer.heads[1], layer.cfg.head_dim), layer.dtype)
    try:
        c = layer.run_packed(pos, q, k, cu, offsets)
    except Unsupported as e:
        return row(check, "not applicable", message=str(e))
    if c.out is None:
        if c.adapter:
            return row(check, "adapter error", message=f"adapter error: {c.error}")
        return row(check, "fail", math.inf, f"the engine raised on the packed row: {c.error}")
    # (blind to the engine's factor, as the rotation check: the attention factor check measures it)
    saved = layer.norm
    _measure_factor(layer, c)
    try:
        err = layer.errors(c)
        worst = float(err.max())
        if worst <= 1.0:
            return row(check, "pass", worst, _packed_words(cu, offsets))
        return row(check, "fail", worst, _packed_diagnosis(layer, c, err, cu, offsets))
    finally:
        layer.norm = saved


def _packed_words(cu: np.ndarray, offsets: np.ndarray) -> str:
    lengths = np.diff(cu)
    words = f"{lengths.size} documents of {lengths.min()} to {lengths.max()} tokens in one row of {cu[-1]}"
    if offsets.any():
        return f"{words}, at offsets {', '.join(map(str, offsets.tolist()))}"
    return f"{words}, each from position 0"


def _rotated_at(layer: _Layer, c: _Call, t: int, top: int) -> int | None:
    """The position ``0 .. top`` at which the config's rotation of token ``t``'s q and k gives the
    engine's output within tolerance (the closest match), ``None`` where none does."""
    cand = np.arange(top + 1, dtype=np.int64)
    worst = np.zeros(cand.shape[0])
    for x, o in zip((c.q, c.k), layer.normalized(c), strict=True):
        xs = np.ascontiguousarray(np.broadcast_to(x[t], (cand.shape[0], *x.shape[1:])))
        want = _truth(layer.rope, xs, cand)
        tol = layer.tol(_Call(cand, xs, xs, None), xs)
        err = np.abs(o[t][None] - want) / max(1.0, float(np.abs(x).max())) / tol
        worst = np.maximum(worst, np.where(np.isfinite(err), err, np.inf).max(axis=(1, 2)))
    i = int(np.argmin(worst))
    return int(cand[i]) if worst[i] <= 1.0 else None


def _span(xs: Sequence[int]) -> str:
    """``5..11`` for a run, else the first few values."""
    xs = list(xs)
    if len(xs) > 1 and all(b - a == 1 for a, b in itertools.pairwise(xs)):
        return f"{xs[0]}..{xs[-1]}"
    head = ", ".join(map(str, xs[:6]))
    return head + (", ..." if len(xs) > 6 else "")


def _packed_diagnosis(layer: _Layer, c: _Call, e: np.ndarray, cu: np.ndarray, offsets: np.ndarray) -> str:
    """Which documents are wrong, from which of their tokens, and at which positions the engine
    rotated them (each read off the engine's own numbers)."""
    top = int(cu[-1] + offsets.max() + np.diff(cu).max())
    n = offsets.size
    found: list[tuple[int, int, str, str]] = []  # (document, first wrong token, kind, words)
    for d in range(n):
        a, b, off = int(cu[d]), int(cu[d + 1]), int(offsets[d])
        if not (e[a:b] > 1.0).any():
            continue
        j0 = int(np.argmax(e[a:b] > 1.0))
        got = [_rotated_at(layer, c, t, top) for t in range(a + j0, b)]
        kind, words = _packed_how(d, a, j0, got, [off + j for j in range(j0, b - a)], offsets)
        found.append((d, j0, kind, words))
    parts: list[str] = []
    shown: list[str] = []
    for i, (d, j0, kind, words) in enumerate(found):
        if kind in shown:
            continue
        a, b = int(cu[d]), int(cu[d + 1])
        head = (
            f"document {d} of {n} (0-based; tokens {a}..{b - 1} of the row) is wrong from its token {j0} "
            f"on (token {a + j0} of the row): {words}"
        )
        same = [f for f in found[i + 1 :] if f[2] == kind and kind != "other"]
        if same:
            froms = ", ".join(f"{f[0]} (from its token {f[1]})" for f in same)
            head += (
                f"; so are documents {froms}, in the same way"
                if len(same) > 1
                else (f"; so is document {froms}, in the same way")
            )
        parts.append(head)
        shown.append(kind)
        if len(parts) == 3:
            break
    rest = [str(f[0]) for f in found if f[2] not in shown]
    if rest:
        parts.append(f"documents {', '.join(rest)} are wrong too")
    return "; ".join(parts)


def _packed_how(
    d: int, a: int, j0: int, got: list[int | None], want: list[int], offsets: np.ndarray
) -> tuple[str, str]:
    """One document's mistake as ``(kind, words)``: ``got`` (the position the engine's numbers
    match, per token from ``j0``) against ``want``."""
    if any(g is None for g in got):
        return "values", "its tokens match the config's rotation at no position (wrong values, not positions)"
    g = [int(x) for x in got if x is not None]
    js = list(range(j0, j0 + len(g)))
    off = int(offsets[d])
    one = len(g) == 1
    at = f"rotated at position{'' if one else 's'} {_span(g)} where "
    at += f"{'it is' if one else 'they are'} at {_span(want)}"
    if off and g == js:
        return "offset ignored", f"{at}: its offset {off} is ignored (positions from 0)"
    if g == [a + j for j in js]:
        return "row index", f"{at}, the row's token index: positions do not restart at the document's start"
    if off and g == [a + j + off for j in js]:
        return (
            "row index + offset",
            f"{at}, its offset plus the row's token index: positions do not restart at the document's start",
        )
    for e2 in range(offsets.size):
        if e2 != d and int(offsets[e2]) != off and g == [int(offsets[e2]) + j for j in js]:
            return (
                f"offset of {e2}",
                f"{at}: document {e2}'s offset {int(offsets[e2])} instead of its own {off}",
            )
    shift = {x - w for x, w in zip(g, want, strict=True)}
    if len(shift) == 1:
        return "shift", f"{at}: shifted by {shift.pop():+d}"
    return "other", at
