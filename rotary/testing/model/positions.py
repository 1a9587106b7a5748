"""The positions: the positions check (refused, NaN), the positions an engine rotates at (an offset,
a token index, rounded positions, the rotation by -pos), and from which position it is wrong."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from ...scaling import DynamicNTK, LongRoPE
from ..asserts import eps
from ..engine import round_to
from .frequencies import _pair_angles, _turn_rate
from .layer import _Call, _Layer, _scalar_pos
from .report import ModelCheck
from .truth import _at, _truth, _truth_any


def _positions(layer: _Layer, calls: list[_Call], context: int, row: Any) -> ModelCheck:
    calls = [c for c in calls if not c.switch]  # (each position is probed alone by the spread)
    nonfinite = _nonfinite_words(layer, [c for c in calls if c.out is not None])
    if nonfinite:  # (an output that is NaN is no position computed, and no refusal either)
        return row(
            "positions",
            "fail",
            math.inf,
            f"{nonfinite[0]}: neither right nor refused (raise for the positions the engine cannot compute)",
        )
    refused = sorted(
        ((int(p), c) for c in calls if c.out is None for p in np.atleast_1d(_scalar_pos(c))),
        key=lambda t: t[0],
    )
    if not refused:
        top = max(int(_scalar_pos(c).max()) for c in calls)
        return row("positions", "pass", 0.0, f"every position computed, up to {top}")
    first, c = refused[0]
    if c.adapter:
        return row("positions", "adapter error", message=f"adapter error at position {first}: {c.error}")
    if first < context:
        words = f"the engine refuses position {first} ({c.error}) although the config's context is {context}"
        n = int(np.atleast_1d(_scalar_pos(c)).shape[0])
        if first >= n and layer.call(np.arange(first + 1, dtype=np.int64)).out is not None:
            # (refused in a call of n tokens, computed in a call of first + 1)
            words += (
                f": in a call of {first + 1} tokens it computes it, so its table has as many rows as "
                f"the call has tokens (size it by the largest position, or the context, not the token count)"
            )
        return row("positions", "fail", math.inf, words)
    return row(
        "positions",
        "pass",
        0.0,
        f"refuses positions from {first} on (past the config's context {context}): {c.error}",
    )


def _positional_suspects(layer: _Layer, calls: list[_Call]) -> list[tuple[str, Any, Any]]:
    """Known mistakes in the positions the engine rotates by (its frequencies the config's), each
    as the rotation it would give and the positions it rotates at (for the angle allowance):
    ``(words, fn(x, pos), at(pos))``; each names what to fix."""
    rope = layer.rope
    truth = _at(rope, layer.af)
    out: list[tuple[str, Any, Any]] = []
    delta = _offset(layer, calls)
    if delta:
        out.append(
            (
                f"the config's rotation at position p {'+' if delta > 0 else '-'} {abs(delta)}: every "
                f"position off by {delta:+d} (rotate by the token's own position)",
                lambda x, p: truth(x, p + delta),
                lambda p: p + delta,
            )
        )
    out.append(
        (
            "the config's rotation at each token's index in the call (0, 1, 2 ...), not at its "
            "position: the table is indexed by token index (index it by the positions)",
            lambda x, p: truth(x, np.broadcast_to(np.arange(p.shape[-1]), p.shape).copy()),
            lambda p: np.broadcast_to(np.arange(p.shape[-1]), p.shape),
        )
    )
    for name, dt in (("float16", np.float16), ("bfloat16", None)):

        def rounded(x: np.ndarray, p: np.ndarray, dt: Any = dt, name: str = name) -> np.ndarray:
            with np.errstate(over="ignore", invalid="ignore"):
                f = p.astype(np.float64)
                q = f.astype(dt).astype(np.float64) if dt is not None else round_to(f, name)
                return _truth_any(rope, x, q) * (layer.af / float(layer.cfg.attention_factor))

        out.append(
            (
                f"the config's rotation at the positions rounded to {name} (cast to {name} before "
                "the angles: keep positions integer or float32)",
                rounded,
                None,
            )
        )
    w, layout = layer.cfg.width, layer.cfg.layout

    def swapped(x: np.ndarray, p: np.ndarray) -> np.ndarray:
        # x sin + rotate_half(x) cos = rotate_half(the rotation by -pos of x)
        t = truth(x, -p)
        r = t[..., :w]
        if layout == "half":
            turned = np.concatenate([-r[..., w // 2 :], r[..., : w // 2]], axis=-1)
        else:
            turned = np.stack([-r[..., 1::2], r[..., 0::2]], axis=-1).reshape(r.shape)
        return np.concatenate([turned, t[..., w:]], axis=-1)

    out.append(
        (
            "cos and sin swapped (x sin + rotate_half(x) cos where RoPE is x cos + rotate_half(x) sin)",
            swapped,
            None,
        )
    )
    out.append(
        (
            "the rotation by -pos: sin has the wrong sign (x cos - rotate_half(x) sin where RoPE is "
            "x cos + rotate_half(x) sin, rotate_half(x) = (-x2, x1))",
            lambda x, p: truth(x, -p),
            None,
        )
    )
    return out


def _offset(layer: _Layer, calls: list[_Call]) -> int:
    """The whole number ``delta`` of positions the engine's angles at position 0 amount to (every
    pair turned by ``w_i delta``), solved pair by pair from the slowest; 0 where none fits."""
    c = calls[0]
    if c.out is None or c.pos.ndim != 1 or c.pos[0] != 0 or c.pos.shape[0] < 2 or c.pos[1] != 1:
        return 0
    xs = (c.q[:2], c.k[:2])
    want = tuple(_truth(layer.rope, x, c.pos[:2]) for x in xs)
    noise = layer.ulps * eps(layer.dtype) * max(1.0, layer.af)
    theta, slack = _pair_angles(layer, xs, tuple(o[:2] for o in c.out), noise)
    w, _ = _pair_angles(layer, xs, want, 0.0)  # (row 1: each pair's angle at position 1, its frequency)
    freq = w[1]
    keep = freq > 0
    if not keep.any():
        return 0
    order = np.argsort(freq[keep])
    f, a, t = freq[keep][order], theta[0][keep][order], slack[0][keep][order]
    # (the angle kind's allowance is relative to the angle w_i delta)
    iv = _turn_rate(f, a, t, float(np.max(layer.angle_rel, initial=0.0)), bound=math.pi / float(f[0]))
    if iv is None:
        return 0
    cands = [d for d in range(math.ceil(iv[0]), math.floor(iv[1]) + 1) if d != 0]
    return cands[0] if len(cands) == 1 else 0


#: Past the last right sampled position, the kit checks up to :data:`SCAN_AFTER` positions in
#: calls of :data:`SCAN_CALL` (then bisects); below it, every position up to :data:`SCAN_LIMIT`.
SCAN_CALL = 4096


SCAN_AFTER = 65536


SCAN_LIMIT = 2**18


def _first_wrong(
    layer: _Layer, calls: list[_Call], bad: list[int], test: Callable[[_Call], np.ndarray] | None = None
) -> tuple[int, bool, int]:
    """The first wrong position, from the first wrong sampled one (``bad[0]``), as ``(position,
    exact, below)``: every position below ``below`` was checked right, and ``exact`` when that is
    every position below ``position``.

    Every position after the last right sampled one is checked, in calls of :data:`SCAN_CALL`, up
    to :data:`SCAN_AFTER` of them (a mistake need not stay wrong once it starts: float16
    positions are right again at every even one past 2048); past that, a bisection (which assumes
    it stays wrong).  Then every position below the last right sampled one that no call checked,
    up to :data:`SCAN_LIMIT`, on data of their own (the draws of every other call unchanged): a
    right sampled position says nothing of its neighbours (positions rounded to bfloat16 are right
    at 1000 and wrong at 257), and a wrong one found there is the first."""
    first = bad[0]
    if first < 0:
        return first, False, first

    def wrong(ps: np.ndarray, rng: np.random.Generator | None = None) -> np.ndarray:
        c = layer.call(ps, rng)
        if c.out is None:
            return np.ones(ps.shape, dtype=bool)
        return test(c) if test is not None else layer.errors(c) > 1.0

    checked = {int(p) for c in calls for p in _scalar_pos(c) if int(p) not in bad}
    right = [p for p in checked if p < first]
    lo0 = lo = max(right, default=-1)  # lo right (-1: from position 0), hi wrong
    hi, found, exact, start = first, None, True, lo + 1
    while start < hi and start - lo0 <= SCAN_AFTER:
        ps = np.arange(start, min(hi, start + SCAN_CALL), dtype=np.int64)
        w = wrong(ps)
        if w.any():
            found = int(ps[int(np.argmax(w))])
            break
        start, lo = int(ps[-1]) + 1, int(ps[-1])
    if found is None and start < hi:
        while hi - lo > 1:  # (a long gap: bisection, which assumes it stays wrong)
            mid = (lo + hi) // 2
            if wrong(np.array([mid], dtype=np.int64))[0]:
                hi = mid
            else:
                lo = mid
        exact = False
    if found is None:
        found = hi
    top = 0  # (every position below top was checked right by the calls)
    while top in checked:
        top += 1
    stop = min(lo0, found, SCAN_LIMIT)
    for s0 in range(top, stop, SCAN_CALL):
        ps = np.arange(s0, min(stop, s0 + SCAN_CALL), dtype=np.int64)
        w = wrong(ps, layer.scan_rng)
        if w.any():
            return int(ps[int(np.argmax(w))]), True, int(ps[int(np.argmax(w))])
    if stop < min(lo0, found):  # (below the last right sampled one, not every position checked)
        return found, False, stop
    return found, exact, found if exact else start


def _first_seen(first: int, below: int, wrong: str = "wrong", right: str = "right") -> str:
    """How a first wrong position that :func:`_first_wrong` could not prove first was found."""
    return (
        f"first seen {wrong} at position {first} of the positions checked (every position below "
        f"{below} checked {right}, and some past it)"
    )


def _where_words(layer: _Layer, calls: list[_Call], bad: list[int]) -> tuple[list[str], int | None]:
    """Where the engine is wrong, in words, and its first wrong position: only in the calls where a
    scaling chosen per call switches, or from the first wrong position on."""
    tail: list[str] = []
    first: int | None = None
    wrong = [c for c in calls if c.out is not None and bool((layer.errors(c) > 1.0).any())]
    if wrong and all(c.switch for c in wrong):
        # (wrong only in calls whose length decides the scaling: no position is wrong alone)
        parts = []
        for c in wrong:
            e = layer.errors(c) > 1.0
            n = int(c.pos.shape[-1])
            at = int(_scalar_pos(c)[e][0])
            first = at if first is None else min(first, at)
            parts.append(
                f"a call of {n} tokens (positions 0..{n - 1}) at {int(e.sum())} of its positions from {at}"
            )
        tail = [f"wrong in {' and in '.join(parts)}, and right in every other call checked"]
    elif bad:
        first, exact, checked = _first_wrong(layer, calls, bad)
        tail = [f"wrong from position {first} on" if exact else _first_seen(first, checked)]
        if isinstance(layer.cfg.scaling, (LongRoPE, DynamicNTK)):
            # (a scaling chosen per call: which positions are wrong depends on the call)
            tail = [f"{tail[0]} in the calls checked (the scaling depends on each call's length)"]
    return tail, first


def _nonfinite_words(layer: _Layer, calls: list[_Call]) -> list[str]:
    """Where the engine's outputs are NaN or infinite: from which position on."""
    bad = sorted({int(p) for c in calls if c.out is not None for p in _scalar_pos(c)[_nonfinite(c)]})
    if not bad:
        return []
    if tuple(bad) not in layer.nonfinite:  # (the rotation and the positions check both say it)
        first, exact, below = _first_wrong(layer, calls, bad, lambda c: _nonfinite(c))
        words = f"the engine's outputs are {_first_seen(first, below, 'NaN or infinite', 'finite')}"
        if exact:
            words = f"the engine's outputs are NaN or infinite from position {first} on"
        layer.nonfinite[tuple(bad)] = [words]
    return layer.nonfinite[tuple(bad)]


def _nonfinite(c: _Call) -> np.ndarray:
    """Per token: whether any of the engine's outputs is NaN or infinite."""
    assert c.out is not None
    return np.asarray(~np.isfinite(c.out[0]).all(axis=(1, 2)) | ~np.isfinite(c.out[1]).all(axis=(1, 2)))
