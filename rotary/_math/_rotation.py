"""The one 2-D rotation, the two pair layouts (described in :mod:`rotary.layouts`), and the
permutation between them."""

from __future__ import annotations

from .._lib._compat import device, index_dtype
from .._lib._typing import Array, Layout, Namespace

__all__ = ["LAYOUTS", "expand_pairs", "pair_partners", "permutation", "rotate_pairs"]

LAYOUTS: tuple[Layout, ...] = ("half", "interleaved")


def rotate_pairs(
    x: Array,
    cos: Array,
    sin: Array,
    *,
    layout: Layout,
    rotary_dim: int,
    xp: Namespace,
    pairs_first: bool = False,
) -> Array:
    """Rotate the first ``rotary_dim`` features of ``x`` pair by pair, in the dtype of ``cos``.

    ``cos``/``sin`` hold one value per pair, shape broadcastable to
    ``x.shape[:-1] + (rotary_dim // 2,)``.  ``x`` is cast to their dtype and the result back
    to ``x``'s: ``(x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin)``.  ``pairs_first``
    (interleaved layout): view the pairs as ``(..., 2, h)`` through a transpose, as the half
    layout does, which a compiler turns into unit-stride loops (XLA on the CPU: 1.19x the
    copy floor instead of 1.31x); the same operations, so the same bits.
    """
    out_dtype = x.dtype
    if x.dtype != cos.dtype:
        x = xp.astype(x, cos.dtype)
    d = x.shape[-1]
    h = rotary_dim // 2
    lead = tuple(x.shape[:-1])
    if any(n is None for n in lead):  # symbolic sizes (ndonnx): no reshape of the leading axes
        return _rotate_unknown_lead(x, cos, sin, layout, rotary_dim, xp, out_dtype)
    # the pairs on an axis of their own, (..., 2, h) or (..., h, 2): one elementwise pass and a
    # stack (slices and a concatenate cost XLA about 1.5x that).  No slice when every feature
    # rotates (torch's legacy vmap, which batches gradients, has no rule for the alias it makes)
    xr = x if rotary_dim == d else x[..., :rotary_dim]
    if layout == "half":
        pairs = xp.reshape(xr, (*lead, 2, h))
        x1, x2, axis = pairs[..., 0, :], pairs[..., 1, :], -2
    elif pairs_first:
        pairs = xp.matrix_transpose(xp.reshape(xr, (*lead, h, 2)))
        x1, x2 = pairs[..., 0, :], pairs[..., 1, :]
        y = xp.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-2)
        rot = xp.reshape(xp.matrix_transpose(y), (*lead, rotary_dim))
    else:
        pairs = xp.reshape(xr, (*lead, h, 2))
        x1, x2, axis = pairs[..., 0], pairs[..., 1], -1
    if layout == "half" or not pairs_first:
        rot = xp.reshape(xp.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=axis), (*lead, rotary_dim))
    out = xp.concat([rot, x[..., rotary_dim:]], axis=-1) if rotary_dim < d else rot
    return out if out.dtype == out_dtype else xp.astype(out, out_dtype)


def _rotate_unknown_lead(
    x: Array, cos: Array, sin: Array, layout: Layout, rotary_dim: int, xp: Namespace, out_dtype: object
) -> Array:
    """:func:`rotate_pairs` where leading sizes are unknown (``None``): the pairs by slicing, the
    halves joined by ``concat`` (and, interleaved, put back in place by one ``take`` along the
    features).  The same operations on the same values: the same results."""
    h, d = rotary_dim // 2, x.shape[-1]
    if layout == "half":
        x1, x2 = x[..., :h], x[..., h:rotary_dim]
    else:
        x1, x2 = x[..., 0:rotary_dim:2], x[..., 1:rotary_dim:2]
    rot = xp.concat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    if layout == "interleaved":
        rot = xp.take(rot, _index([j for i in range(h) for j in (i, i + h)], x, xp), axis=-1)
    out = xp.concat([rot, x[..., rotary_dim:]], axis=-1) if rotary_dim < d else rot
    return out if out.dtype == out_dtype else xp.astype(out, out_dtype)


def _index(values: list[int], like: Array, xp: Namespace) -> Array:
    return xp.asarray(values, dtype=index_dtype(xp, device(like)), device=device(like))


def expand_pairs(c: Array, layout: Layout, xp: Namespace) -> Array:
    """Per-pair values ``(..., r/2)`` as per-feature values ``(..., r)`` laid out for ``layout``."""
    if layout == "half":
        return xp.concat([c, c], axis=-1)
    if any(n is None for n in c.shape[:-1]):  # symbolic sizes: each value repeated by a gather
        return xp.take(c, _index([i for i in range(c.shape[-1]) for _ in (0, 1)], c, xp), axis=-1)
    st = xp.stack([c, c], axis=-1)
    return xp.reshape(st, (*st.shape[:-2], st.shape[-2] * 2))


def pair_partners(layout: Layout, rotary_dim: int) -> list[int]:
    """``partner[j]``: the feature rotated with feature ``j < rotary_dim`` (``j + r/2`` and back in
    the half layout, ``j ^ 1`` interleaved); each output feature reads itself and its partner."""
    h = rotary_dim // 2
    if layout == "half":
        return [j + h if j < h else j - h for j in range(rotary_dim)]
    return [j ^ 1 for j in range(rotary_dim)]


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
