"""The pairing and layout: how the engine pairs the features (each rotated alone), q and k judged
apart, and the features that should pass through."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..asserts import eps
from .factors import _digits
from .layer import _Call, _Layer, _scalar_pos
from .truth import _at, _partners, _truth, _with


def _pairing_words(layer: _Layer, calls: list[_Call]) -> str:
    """How the engine pairs the features, where that is not the config's pairing ('' where it is),
    q and k judged apart (a message names which of them is wrong).

    Each feature alone (a unit vector, exact in every dtype) is rotated at a few positions: the
    features of the engine's output that are not exactly 0 are those it mixes that one with.
    """
    cfg = layer.cfg
    d = cfg.head_dim
    top = max(int(_scalar_pos(c).max()) for c in calls)
    probe = sorted({p for p in (1, 3, 100, 1000, 30011, top) if p <= top})
    n = len(probe)
    pos = np.repeat(np.asarray(probe, dtype=np.int64), d)
    eye = np.tile(np.eye(d, dtype=np.float32), (n, 1))
    q = np.ascontiguousarray(np.broadcast_to(eye[:, None, :], (n * d, layer.heads[0], d)))
    k = np.ascontiguousarray(np.broadcast_to(eye[:, None, :], (n * d, layer.heads[1], d)))
    c = layer.run(pos, q, k)
    if c.out is None:
        return ""
    # (the config's links are those it turns by more than rounding at some probed position)
    tau = 16 * eps(layer.dtype) * max(1.0, layer.af)
    seen = np.abs(_truth(layer.rope, q[:, :1], c.pos)[:, 0]) > tau
    truth = np.asarray(seen.reshape(n, d, d).any(axis=0), dtype=bool)
    np.fill_diagonal(truth, False)
    words = []
    for t, o in enumerate(c.out):
        # (a feature the engine does not mix in stays exactly 0: any other value is a link)
        # ([j, i]: feature j reaches output feature i)
        mixed = np.asarray((np.abs(o) > 0).any(axis=1).reshape(n, d, d).any(axis=0), dtype=bool)
        np.fill_diagonal(mixed, False)
        words.append(_pairing_of(layer, calls, mixed, truth, t))
    if words[0] == words[1]:
        return words[0].replace("{the engine}", "the engine")
    named = [w.replace("{the engine}", who) for w, who in zip(words, ("q", "k"), strict=True)]
    if not words[0] or not words[1]:
        ok = "k" if not words[1] else "q"
        return f"{named[0] or named[1]} ({ok}'s pairing is the config's)"
    return "; ".join(named)


def _pairing_of(layer: _Layer, calls: list[_Call], mixed: np.ndarray, truth: np.ndarray, t: int) -> str:
    """The words of :func:`_pairing_words` for one tensor (``t``: 0 q, 1 k), ``{the engine}``
    standing for its name."""
    cfg = layer.cfg
    d, w = cfg.head_dim, cfg.width
    partner = _partners(cfg.layout, w, d)
    j = np.arange(d)
    own = np.zeros((d, d), dtype=bool)
    own[j[partner >= 0], partner[partner >= 0]] = True
    strange = mixed & ~own  # links the config does not make
    still = truth & own & ~mixed  # pairs that visibly turn in the config, not in the engine
    if not strange.any() and not still.any():
        return ""
    many = np.nonzero(mixed.sum(axis=1) > 1)[0]
    if many.size:
        f = int(many[0])
        return (
            f"{{the engine}} mixes feature {f} with features {', '.join(map(str, np.nonzero(mixed[f])[0]))}: "
            "not a rotation of feature pairs"
        )
    rotated = np.nonzero(mixed.any(axis=1))[0]
    if rotated.size == 0:
        return f"{{the engine}} rotates no feature (the config rotates {w} of {d})"
    theirs = np.where(mixed.any(axis=1), mixed.argmax(axis=1), -1)
    lay, width = "", 0
    gap = np.abs(theirs[rotated] - rotated)
    if np.all(theirs[rotated] == (rotated ^ 1)):
        lay, width = "interleaved", int(rotated.max()) + 1 + int(rotated.max() % 2 == 0)
    elif np.all(gap == gap[0]) and np.all(np.minimum(rotated, theirs[rotated]) < gap[0]):
        lay, width = "half", 2 * int(gap[0])
    if lay and width == w and lay != cfg.layout:
        words = f"{{the engine}} pairs features in the {lay!r} layout (the config's is {cfg.layout!r})"
        fn = _at(_with(cfg, layer.rope, layout=lay), layer.af)
        if all(float(layer.errors(x, fn=fn, tensors=(t,)).max()) <= 1.0 for x in calls):
            words += ", and its numbers match the config's RoPE in that layout"
        return words
    if lay and (width > w or (width < w and lay == "half")):
        lays = f"the {lay!r} layout" + ("" if lay == cfg.layout else f" (the config's is {cfg.layout!r})")
        turns = f"rotates {width} of the {d} features" if lay == "half" else f"turns features 0..{width - 1}"
        words = f"{{the engine}} {turns} in {lays} where the config rotates {w}"
        if width > w:
            words += f": features {w}..{min(width, d) - 1} should pass through unchanged"
        return words
    s0 = int(rotated.min())
    block = rotated - s0
    if (
        0 < s0
        and rotated.size == w
        and int(rotated.max()) == s0 + w - 1
        and np.array_equal(theirs[rotated] - s0, _partners(cfg.layout, w, w)[block])
    ):
        # (the config's pairing, on another slice of the head)
        words = (
            f"{{the engine}} rotates features {s0}..{s0 + w - 1} where the config rotates 0..{w - 1} "
            f"(the wrong slice of the head: rotate the first {w} features, pass the other {d - w} through)"
        )
        perm = np.concatenate([np.arange(s0, s0 + w), np.arange(s0), np.arange(s0 + w, d)])
        back = np.argsort(perm)
        truth_at = _at(layer.rope, layer.af)

        def sliced(x: np.ndarray, p: np.ndarray) -> np.ndarray:
            return truth_at(np.ascontiguousarray(x[..., perm]), p)[..., back]

        if all(float(layer.errors(x, fn=sliced, tensors=(t,)).max()) <= 1.0 for x in calls):
            words += ", and its numbers match the config's rotation of that slice"
        return words
    if still.any() and not strange.any():
        idle = np.nonzero(still.any(axis=1))[0]
        return (
            f"features {_ranges(idle)} do not turn in {{the engine}} (the config pairs them: "
            f"{cfg.layout!r} layout over {w})"
        )
    f = int(np.nonzero(strange.any(axis=1))[0][0])
    mine = int(partner[f])
    says = f"pairs it with {mine}" if mine >= 0 else "passes it through"
    return f"{{the engine}} pairs feature {f} with {int(theirs[f])} where the config {says}"


def _ranges(idx: Sequence[int] | np.ndarray) -> str:
    """``0..3, 7, 9..10``."""
    out: list[list[int]] = []
    for i in (int(x) for x in idx):
        if out and out[-1][1] == i - 1:
            out[-1][1] = i
        else:
            out.append([i, i])
    return ", ".join(f"{a}..{b}" if a != b else f"{a}" for a, b in out)


def _pass_through_words(layer: _Layer, calls: list[_Call]) -> str:
    """Features past the rotated width that the engine changes (without pairing them)."""
    d, w = layer.cfg.head_dim, layer.cfg.width
    if w >= d:
        return ""
    diffs = [np.abs(c.out[0][..., w:] - c.q[..., w:]) for c in calls if c.out is not None]
    moved = max(float(x.max()) for x in diffs)
    if moved <= layer.ulps * eps(layer.dtype) * 4:
        return ""
    words = f"features {w}..{d - 1} should pass through unchanged ({w} of {d} rotate)"
    words += f" but change by up to {moved:.3g}"
    x = np.concatenate([c.q[..., w:].ravel() for c in calls if c.out is not None])
    o = np.concatenate([c.out[0][..., w:].ravel() for c in calls if c.out is not None])
    r = float(np.median(o / np.where(x == 0, 1.0, x)))
    if np.all(np.abs(o - r * x) <= layer.ulps * eps(layer.dtype) * np.maximum(np.abs(x), 1.0)):
        words += f": they are scaled by {r:.{_digits(layer.dtype)}f}"
    return words
