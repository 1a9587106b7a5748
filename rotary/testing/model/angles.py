"""The declared angle kind: an engine right only within a looser kind than it declares, and a known
mistake matched only there."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from ..engine import ANGLE_KINDS, angle_error
from .layer import _Call, _Layer
from .positions import _positional_suspects
from .suspects import _suspects

#: Angle kinds from the tightest allowance to the loosest.
_KINDS = ("exact", "float64", "float32", "float32_recurrence")


def _looser_kinds(layer: _Layer) -> tuple[str, ...]:
    """The angle kind the engine declares, then each looser one (none past an unknown kind)."""
    declared = str(getattr(layer.eng, "angles", "float32"))
    return (declared, *_KINDS[_KINDS.index(declared) + 1 :]) if declared in _KINDS else (declared,)


@contextlib.contextmanager
def _allowance(layer: _Layer, kind: str) -> Iterator[None]:
    """The layer's angle allowance set to ``kind``'s, restored after."""
    saved = layer.angle_rel, layer.angle_coef
    layer.angle_rel, layer.angle_coef = angle_error(kind, layer.cfg.host_inv_freq(), layer.dtype)
    try:
        yield
    finally:
        layer.angle_rel, layer.angle_coef = saved


def _angle_kind_words(layer: _Layer, calls: list[_Call]) -> str:
    """Where the engine is right within a looser angle kind than it declares: what to declare."""
    declared, *looser = _looser_kinds(layer)
    for kind in looser:
        with _allowance(layer, kind):
            if all(float(layer.errors(c).max()) <= 1.0 for c in calls):
                return (
                    f"the engine declares angles={declared!r} but its numbers are right within the "
                    f"allowance of angles={kind!r} ({ANGLE_KINDS[kind].split(':')[0]}): declare "
                    f"angles = {kind!r} if that is how it forms its angles"
                )
    return ""


def _looser_match(layer: _Layer, calls: list[_Call]) -> list[str]:
    """A known mistake the engine's numbers match only within a looser angle kind than it
    declares (its own rounding beyond the declared kind's, on top of the mistake): said so."""
    declared, *looser = _looser_kinds(layer)
    for kind in looser:
        with _allowance(layer, kind):
            found = [
                label
                for label, fn, at in _positional_suspects(layer, calls)
                if all(float(layer.errors(c, fn=fn, at=at).max()) <= 1.0 for c in calls)
            ] + [
                label
                for label, fn in _suspects(layer)
                if all(float(layer.errors(c, fn=fn).max()) <= 1.0 for c in calls)
            ]
        if found:
            return [
                f"{found[0]}, within the allowance of angles={kind!r} (its angles carry more "
                f"rounding than the declared {declared!r} allows)"
            ]
    return []
