"""The one 2-D rotation, the two pair layouts (described in :mod:`rotary.layouts`), and the
permutation between them."""

from __future__ import annotations

from .._lib._typing import Array, Layout, Namespace

__all__ = ["LAYOUTS", "expand_pairs", "permutation", "rotate_pairs"]

LAYOUTS: tuple[Layout, ...] = ("half", "interleaved")


def rotate_pairs(
    x: Array, cos: Array, sin: Array, *, layout: Layout, rotary_dim: int, xp: Namespace
) -> Array:
    """Rotate the first ``rotary_dim`` features of ``x`` pair by pair, in the dtype of ``cos``.

    ``cos``/``sin`` hold one value per pair, shape broadcastable to
    ``x.shape[:-1] + (rotary_dim // 2,)``.  ``x`` is cast to their dtype and the result back
    to ``x``'s: ``(x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin)``.
    """
    out_dtype = x.dtype
    if x.dtype != cos.dtype:
        x = xp.astype(x, cos.dtype)
    d = x.shape[-1]
    h = rotary_dim // 2
    if layout == "half":
        x1 = x[..., :h]
        x2 = x[..., h:rotary_dim]
        parts = [x1 * cos - x2 * sin, x2 * cos + x1 * sin]
        if rotary_dim < d:
            parts.append(x[..., rotary_dim:])
        out = xp.concat(parts, axis=-1)
    else:
        lead = tuple(x.shape[:-1])
        pairs = xp.reshape(x[..., :rotary_dim], (*lead, h, 2))
        xe, xo = pairs[..., 0], pairs[..., 1]
        rot = xp.reshape(xp.stack([xe * cos - xo * sin, xo * cos + xe * sin], axis=-1), (*lead, rotary_dim))
        out = xp.concat([rot, x[..., rotary_dim:]], axis=-1) if rotary_dim < d else rot
    return out if out.dtype == out_dtype else xp.astype(out, out_dtype)


def expand_pairs(c: Array, layout: Layout, xp: Namespace) -> Array:
    """Per-pair values ``(..., r/2)`` as per-feature values ``(..., r)`` laid out for ``layout``."""
    if layout == "half":
        return xp.concat([c, c], axis=-1)
    st = xp.stack([c, c], axis=-1)
    return xp.reshape(st, (*st.shape[:-2], st.shape[-2] * 2))


def permutation(src: Layout, dst: Layout, head_dim: int, rotary_dim: int) -> list[int]:
    """``perm`` with ``converted = x[..., perm]`` for one head: ``perm[j]`` is the ``src`` feature
    that lands at ``dst`` feature ``j``; features from ``rotary_dim`` on stay in place.

    Plain Python (no arrays), so ``torch.compile`` and ``jax.jit`` see constants.
    """
    h = rotary_dim // 2
    if src == "interleaved" and dst == "half":
        rot = [2 * i for i in range(h)] + [2 * i + 1 for i in range(h)]
    elif src == "half" and dst == "interleaved":
        rot = [j for i in range(h) for j in (i, i + h)]
    else:
        rot = list(range(rotary_dim))
    return rot + list(range(rotary_dim, head_dim))
