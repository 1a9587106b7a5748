"""One part of the sequence: features, rotations and the grouped-query split, the first step of every
streamed body.
"""

from __future__ import annotations

from typing import Any

from .._backends import Backend
from .._lib._typing import Array, Device, Namespace
from .._math import _linear
from .._math._groups import split_heads
from .._rope import Rotary
from ._args import _Call


class _Parts:
    """What turns a part of the inputs into features (the streamed body's first step)."""

    def __init__(self, call: _Call, be: Backend, dev: Device, rng: Any, krng: Any, mask: Any) -> None:
        self.call, self.be, self.dev, self.rng, self.krng, self.has_mask = call, be, dev, rng, krng, mask

    def keys(self, k: Array, v: Array, kp: Any, mask: Any) -> tuple[Array, Array | None, Array]:
        """``(b, e, v)`` of a part of the keys (``kp``: their positions, ``None`` unrotated)."""
        plan, r = self.call.plan, self.call.rope
        e = self.be.features(k, plan)
        b = e if r is None else self._rotate(e, kp, self.krng)
        return self._keys_done(b, e, v, mask)

    def _keys_done(self, b: Array, e: Array, v: Array, mask: Any) -> tuple[Array, Array | None, Array]:
        plan, xp = self.call.plan, self.be.xp
        if plan.cosine:
            b = _linear.with_one(b, xp)
            e = b
        vc = v if v.dtype == plan.cdt else xp.astype(v, plan.cdt)
        if mask is not None:
            m = mask[..., None]
            b = xp.where(m, b, xp.zeros_like(b))
            e = b if plan.cosine else xp.where(m, e, xp.zeros_like(e))
            vc = xp.where(m, vc, xp.zeros_like(vc))
        return b, (e if plan.normalize else None), vc

    def queries(self, q: Array, p: Any) -> tuple[Array, Array | None]:
        """``(a, c)`` of a part of the queries."""
        plan, r = self.call.plan, self.call.rope
        c = self.be.query_features(q, plan)
        a = c if r is None else self._rotate(c, p, self.rng)
        return self._queries_done(a, c)

    def _queries_done(self, a: Array, c: Array) -> tuple[Array, Array | None]:
        plan, xp = self.call.plan, self.be.xp
        if plan.cosine:
            a = _linear.with_one(a, xp)
            c = a
        return a, (c if plan.normalize else None)

    def both(
        self, q: Array, k: Array, v: Array, p: Any, mask: Any
    ) -> tuple[Array, Array | None, Array, Array | None, Array]:
        """Queries and keys at the same positions (one rotation of both where it can share work)."""
        plan, r = self.call.plan, self.call.rope
        if r is None:
            a, c = self.queries(q, None)
            b, e, vc = self.keys(k, v, None, mask)
            return a, c, b, e, vc
        c = self.be.query_features(q, plan)
        e = self.be.features(k, plan)
        if isinstance(r, Rotary) and not self.be.lazy:
            a, b = r._rotate_both(self.be, c, e, p, self.rng, self.dev)
        else:  # (a lazy library rotates block by block: RoPE's own public path)
            a, b = r.apply(c, e, p)
        a, c2 = self._queries_done(a, c)
        b, e2, vc = self._keys_done(b, e, v, mask)
        return a, c2, b, e2, vc

    def _rotate(self, x: Array, p: Any, rng: Any) -> Array:
        r = self.call.rope
        if isinstance(r, Rotary) and not self.be.lazy:
            return r._rotate(self.be, x, p, rng, self.dev)
        return r.rotate(x, p)

    def group(self, ch: _linear.Chunk, marks: _linear.Marks) -> tuple[_linear.Chunk, _linear.Marks]:
        """Grouped-query heads: q's heads as ``(key head, group)``; key features, values and
        marks get a size-1 group axis (broadcast, never materialised)."""
        g, xp = self.call.groups, self.be.xp
        if g == 1:
            return ch, marks

        def split(x: Array | None) -> Array | None:
            return None if x is None else split_heads(x, g, xp)

        def one(x: Array | None, axis: int = -3) -> Array | None:
            return None if x is None else xp.expand_dims(x, axis=axis)

        def mark(x: Array | None) -> Array | None:
            if x is None:
                return None
            if x.ndim < 2:
                return x
            return xp.expand_dims(x, axis=-2)

        b, v = one(ch.b), one(ch.v)
        assert b is not None and v is not None
        return (
            _linear.Chunk(split(ch.a), split(ch.c), b, one(ch.e), v),
            _linear.Marks(mark(marks.g), mark(marks.doc)),
        )


def _tokens(x: Array | None, n: Any, xp: Namespace) -> Array | None:
    """Per-token marks ``(..., 1)`` broadcast along ``n`` tokens."""
    if x is None or x.shape[-1] == n:
        return x
    return xp.broadcast_to(x, (*x.shape[:-1], n))
