"""The frequencies: per pair, the interval of frequencies consistent with the engine's angles,
another base, and the per-pair factors in words."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ...multiaxis import MRoPE
from ...scaling import Default, DynamicNTK, LongRoPE
from ..asserts import eps
from .layer import _Call, _Layer, _scalar_pos
from .pairing import _ranges
from .truth import _at, _pairs, _truth, _with


def _ladder(top: int) -> np.ndarray:
    """Positions ``1 .. 16``, then up by factors of 1.25 to ``top``: each angle predicted from the
    ones before within far less than a turn, so every turn is counted."""
    ps = list(range(1, min(top, 16) + 1))
    p = 16.0
    while p * 1.25 < top:
        p *= 1.25
        ps.append(int(p))
    if top > 16:
        ps.append(top)
    return np.unique(np.asarray(ps, dtype=np.int64))


def _pair_angles(
    layer: _Layer, xs: Sequence[np.ndarray], outs: Sequence[np.ndarray], noise: float
) -> tuple[np.ndarray, np.ndarray]:
    """Per position and pair, the angle the outputs are turned by from the inputs (over q's and
    k's heads: the angle of ``sum out * conj(in)``), and how far rounding may move it: an output
    error of ``noise`` times the data's scale per element (the rotation check's tolerance)."""
    cfg = layer.cfg
    z: Any = 0.0
    wsum: Any = 0.0
    asum: Any = 0.0
    for x, o in zip(xs, outs, strict=True):
        zx, zo = _pairs(x, cfg), _pairs(o, cfg)
        z = z + (zo * np.conj(zx)).sum(axis=1)
        wsum = wsum + (np.abs(zx) ** 2).sum(axis=1)
        scale = np.maximum(1.0, np.abs(x).max(axis=(1, 2)))[:, None]
        asum = asum + np.abs(zx).sum(axis=1) * scale
    slack = np.where(np.abs(z) > 0.5 * noise * wsum, noise, math.pi)
    return np.angle(z), slack


def _turn_rate(
    pos: np.ndarray, theta: np.ndarray, slack: np.ndarray, rel: float, bound: float = math.pi
) -> tuple[float, float] | None:
    """Every frequency ``w`` (``|w| <= bound``) whose angles ``w * p`` agree with the measured
    ones ``theta`` (mod 2 pi) within ``slack + rel * |w p|`` at each position, as an interval
    ``(lo, hi)``; ``None`` when none does.  Positions are taken in order while the turn count
    stays unambiguous."""
    lo, hi = -bound, bound
    for p, a, t in zip(pos.tolist(), theta.tolist(), slack.tolist(), strict=True):
        if not math.isfinite(a):
            return None
        t = t + rel * max(abs(lo), abs(hi)) * p
        n0 = math.ceil((lo * p - t - a) / (2 * math.pi))
        n1 = math.floor((hi * p + t - a) / (2 * math.pi))
        if n1 < n0:
            return None
        if n1 > n0:
            break
        u = a + 2 * math.pi * n0
        lo, hi = max(lo, (u - t) / p), min(hi, (u + t) / p)
        if lo > hi:
            return None
    return lo, hi


@dataclasses.dataclass
class _Frequencies:
    """The engine's frequency per pair, measured on one call at positions ``1 .. top``: ``(pair,
    the config's frequency, the interval of the engine's or None where none fits)``."""

    top: int
    pairs: list[tuple[int, float, tuple[float, float] | None]]
    #: per pair, the interval within the rotation check's own allowance (wider)
    wide: dict[int, tuple[float, float] | None] = dataclasses.field(default_factory=dict)


def _measure_frequencies(layer: _Layer, calls: list[_Call], below: float = math.inf) -> _Frequencies | None:
    """Which frequencies the engine turns at, each as the interval of every frequency consistent
    with the engine's angles at every position of one call at positions ``1 .. top``
    (:func:`_ladder`; below ``below``, a table's end), on data exact in the dtype, within the
    output's rounding and the angle kind's allowance.  The config's frequency comes from its own
    float64 rotation of the same call (per call for dynamic scalings)."""
    cfg = layer.cfg
    if isinstance(layer.rope, MRoPE):
        return None
    top = max(int(_scalar_pos(c).max()) for c in calls)
    top = int(min(top, below - 1))
    if top < 2:
        return None
    c = layer.call(_ladder(top))
    if c.out is None:
        return None
    xs = (c.q, c.k)
    want = tuple(_truth(layer.rope, x, c.pos) for x in xs)
    theta, slack = _pair_angles(layer, xs, c.out, layer.ulps * eps(layer.dtype) * max(1.0, layer.af))
    theta_t, _ = _pair_angles(layer, xs, want, 0.0)
    pos = c.pos.astype(np.float64)
    pairs: list[tuple[int, float, tuple[float, float] | None]] = []
    wides: dict[int, tuple[float, float] | None] = {}
    for i in range(cfg.width // 2):
        t = _turn_rate(pos, theta_t[:, i], np.full(pos.shape, 1e-9), 0.0)
        if t is None or t[0] <= 0.0 <= t[1]:
            continue  # (a frequency 0: proportional RoPE's idle pairs)
        iv = _turn_rate(pos, theta[:, i], slack[:, i], float(layer.angle_rel[i]))
        wide = _turn_rate(pos, theta[:, i], slack[:, i] + layer.angle_coef * pos, 0.0)
        pairs.append((i, 0.5 * (t[0] + t[1]), iv if iv is not None else wide))
        wides[i] = wide
    return _Frequencies(top, pairs, wides)


def _base_words(layer: _Layer, calls: list[_Call], freqs: _Frequencies | None) -> str:
    """Where the engine's frequencies are another base's (the config's scaling kept, or none): that
    base, in as few digits as still match the engine's numbers."""
    cfg = layer.cfg
    if freqs is None or cfg.base <= 1.0:
        return ""
    fd = float(cfg.freq_dim)
    best: list[tuple[float, float]] = []  # (relative error of the base, the base)
    for i, wt, iv in freqs.pairs:
        if iv is None or i == 0 or iv[0] <= 0.0:
            continue
        mid, width = 0.5 * (iv[0] + iv[1]), iv[1] - iv[0]
        e = 2 * i / fd
        # (plain RoPE's w_i = b**-e; or the config's frequency at base b' over base b: (b/b')**e)
        best.append((width / mid / e, math.exp(-math.log(mid) / e)))
        best.append((width / mid / e, cfg.base * math.exp(-math.log(mid / wt) / e)))
    if not best:
        return ""
    best.sort()
    tried: set[float] = set()
    for _, b in best[:4]:
        for digits in range(3, 10):
            bb = float(f"{b:.{digits}g}")
            if bb in tried or abs(bb / cfg.base - 1.0) < 1e-12:
                continue
            tried.add(bb)
            for keep in (True, False):
                scaling = cfg.scaling if keep else None
                try:
                    fn = _at(_with(cfg, layer.rope, base=bb, scaling=scaling), layer.af)
                except ValueError:
                    continue
                if all(float(layer.errors(c, fn=fn).max()) <= 1.0 for c in calls):
                    sc = type(cfg.scaling).__name__
                    what = (
                        f"the config's {sc} scaling at base {bb:g}"
                        if keep and not isinstance(cfg.scaling, Default)
                        else f"plain RoPE at base {bb:g}"
                    )
                    has = "" if isinstance(cfg.scaling, Default) else f" with {sc} scaling"
                    return (
                        f"the engine's numbers match {what} (the config's rope_theta is "
                        f"{cfg.base:g}{has}): its base is wrong"
                    )
    return ""


def _frequency_words(layer: _Layer, freqs: _Frequencies | None) -> list[str]:
    """The pairs whose frequency is not the config's, each verified (see
    :func:`_measure_frequencies`): over the config's frequency the engine's is an interval of
    factors.  A pair is listed with a factor when its interval excludes 1 (and so does its interval
    within the rotation check's own allowance: no factor the check itself cannot see) and is
    narrower than 4%;
    consecutive pairs share one factor only where their intervals overlap (the factor printed lies
    in every one of them), never by a fixed percentage; a pair whose interval excludes 1 but is
    wider is said unresolved; one whose interval is empty even with the rotation check's
    allowance turns at no single frequency."""
    if freqs is None:
        return []
    cfg, top = layer.cfg, freqs.top
    found: list[tuple[int, float, float]] = []
    unresolved: list[int] = []
    lost: list[int] = []
    for i, wt, iv in freqs.pairs:
        if iv is None:
            lost.append(i)
            continue
        lo, hi = sorted((iv[0] / wt, iv[1] / wt))
        if lo <= 1.0 <= hi:
            continue
        wide = freqs.wide.get(i)
        if wide is not None and min(wide) <= wt <= max(wide):
            continue  # (the config's frequency, within the rotation check's own allowance)
        mid = 0.5 * (lo + hi)
        if hi - lo <= 0.04 * abs(mid):
            found.append((i, lo, hi))
        else:
            unresolved.append(i)
    words = []
    if found:
        groups: list[tuple[int, int, float, float]] = []  # (first, last, the intersection)
        for i, lo, hi in found:
            if groups and groups[-1][1] == i - 1 and max(lo, groups[-1][2]) <= min(hi, groups[-1][3]):
                a, _, glo, ghi = groups[-1]
                groups[-1] = (a, i, max(lo, glo), min(hi, ghi))
            else:
                groups.append((i, i, lo, hi))
        parts = [
            f"{a}..{b} x{_ratio(lo, hi)}" if a != b else f"{a} x{_ratio(lo, hi)}"
            for a, b, lo, hi in groups[:6]
        ]
        more = f" (+{len(groups) - 6} more groups)" if len(groups) > 6 else ""
        per_call = (
            f" in a call up to position {top}" if isinstance(cfg.scaling, (DynamicNTK, LongRoPE)) else ""
        )
        words.append(f"frequencies (pair index, x the config's{per_call}) {', '.join(parts)}{more}")
    if unresolved:
        words.append(
            f"pairs {_ranges(unresolved)} turn at another frequency, by a factor {layer.dtype} cannot "
            f"resolve up to position {top}"
        )
    if lost:
        words.append(f"pairs {_ranges(lost)} turn at no single frequency up to position {top}")
    return words


def _ratio(lo: float, hi: float) -> str:
    """A factor known to lie in ``[lo, hi]`` (which excludes 1): ``1/8`` or ``4`` when that is in
    it, else a number in it, in as few digits (at least three) as keep it there."""
    mid = 0.5 * (lo + hi)
    if 0 < abs(mid) < 0.75:
        n = round(1 / mid)
        if abs(n) >= 2 and lo <= 1 / n <= hi:
            return f"1/{n}"
    n = round(mid)
    if n not in (0, 1) and lo <= n <= hi:
        return f"{n}"
    for k in range(3, 17):
        if lo <= float(f"{mid:.{k}g}") <= hi:
            return f"{mid:.{k}g}"
    return f"{mid!r}"
