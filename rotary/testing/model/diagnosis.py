"""The rotation check's failure in words: each a verified statement naming what to fix, in the order
the checks of the other files decide."""

from __future__ import annotations

import math

from .angles import _angle_kind_words, _looser_match
from .frequencies import _base_words, _frequency_words, _measure_frequencies
from .layer import _Call, _Layer
from .pairing import _pairing_words, _pass_through_words
from .per_call import _kept_growth_words
from .positions import _nonfinite_words, _positional_suspects, _where_words
from .suspects import _suspects
from .tables import _table_words


def _diagnose(layer: _Layer, calls: list[_Call], bad: list[int]) -> str:
    """The rotation check's failure in words: each a verified statement naming what to fix."""
    tail, first = _where_words(layer, calls, bad)
    tail = [*_nonfinite_words(layer, calls), *tail]
    pairing = _pairing_words(layer, calls)
    if pairing:  # (the pairs are not the config's: no frequency of a pair means anything)
        return "; ".join([pairing, *tail])
    kind = _angle_kind_words(layer, calls)
    if kind:  # (right within a coarser angle kind: the declaration is what to fix)
        return "; ".join([kind, *tail])
    words: list[str] = []
    moved = [
        label
        for label, fn, at in _positional_suspects(layer, calls)
        if all(float(layer.errors(c, fn=fn, at=at).max()) <= 1.0 for c in calls)
    ]
    if moved:  # (the frequencies are the config's: the positions are what is wrong)
        return "; ".join([f"the engine's numbers match {moved[0]}", *tail])
    matched = [
        label
        for label, fn in _suspects(layer)
        if all(float(layer.errors(c, fn=fn).max()) <= 1.0 for c in calls)
    ]
    kept = _kept_growth_words(layer, calls)
    if kept:
        matched.insert(0, kept)
    if not matched:
        matched = _looser_match(layer, calls)
    cap = None
    if matched:
        also = f" (and, within {layer.dtype}'s precision, {'; '.join(matched[1:])})" if matched[1:] else ""
        words.append(f"the engine's numbers match {matched[0]}{also}")
    else:
        table_words, cap = _table_words(layer, calls, bad, first)
        words += table_words
    passed = _pass_through_words(layer, calls)
    if passed:
        words.append(passed)
    freqs = _measure_frequencies(layer, calls, below=cap or math.inf)
    base = "" if matched or cap else _base_words(layer, calls, freqs)
    words += [base] if base else _frequency_words(layer, freqs)
    words += tail
    return "; ".join(words) if words else "wrong values (no known mistake matches)"
