"""The two pair layouts, the element-wise rotation for each, and layout conversion.

``"half"`` (GPT-NeoX, Hugging Face LLaMA/Mistral/Qwen, Gemma, flash-attn default)
    pair ``i`` is features ``(i, i + r/2)``.
``"interleaved"`` (RoFormer, the paper, Meta LLaMA, GPT-J, torchtune, lucidrains)
    pair ``i`` is features ``(2i, 2i + 1)``.

For ``r = 8``::

    feature:      0   1   2   3   4   5   6   7
    half:        p0  p1  p2  p3  p0  p1  p2  p3
    interleaved: p0  p0  p1  p1  p2  p2  p3  p3
"""

from __future__ import annotations

from ._checks import LAYOUTS
from ._compat import Array, Namespace

__all__ = ["LAYOUTS", "expand_pairs", "rotate_pairs"]


def expand_pairs(c: Array, layout: str, xp: Namespace) -> Array:
    """Per-pair values ``(..., r/2)`` to per-feature values ``(..., r)`` for ``layout``."""
    if layout == "half":
        return xp.concat([c, c], axis=-1)
    st = xp.stack([c, c], axis=-1)
    return xp.reshape(st, (*st.shape[:-2], st.shape[-2] * 2))


def rotate_pairs(x: Array, cos: Array, sin: Array, *, layout: str, rotary_dim: int, xp: Namespace) -> Array:
    """The element-wise rotation of the first ``rotary_dim`` features of ``x``.

    ``cos``/``sin`` hold one value per pair, shape broadcastable to
    ``x.shape[:-1] + (rotary_dim // 2,)``, in the compute dtype; ``x`` is cast
    to it and the result cast back to ``x.dtype``.
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
        rot = xp.stack([xe * cos - xo * sin, xo * cos + xe * sin], axis=-1)
        rot = xp.reshape(rot, (*lead, rotary_dim))
        out = xp.concat([rot, x[..., rotary_dim:]], axis=-1) if rotary_dim < d else rot
    if out.dtype != out_dtype:
        out = xp.astype(out, out_dtype)
    return out
