"""The two pair layouts, the element-wise rotation for each, and layout conversion.

``"half"`` (GPT-NeoX, Hugging Face LLaMA/Mistral/Qwen, Gemma, flash-attn default)
    pair ``i`` is features ``(i, i + r/2)``.
``"interleaved"`` (RoFormer, the paper, Meta LLaMA, GPT-J, torchtune, lucidrains)
    pair ``i`` is features ``(2i, 2i + 1)``.

For ``r = 8``::

    feature:      0   1   2   3   4   5   6   7
    half:        p0  p1  p2  p3  p0  p1  p2  p3
    interleaved: p0  p0  p1  p1  p2  p2  p3  p3

The two are the same rotation up to a fixed permutation of features;
:func:`convert_layout` applies it to activations, weights and biases.
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np

from . import _dask
from ._checks import LAYOUTS, check_layout
from ._compat import Array, Namespace, array_namespace, creation_device, is_dask_namespace

__all__ = ["LAYOUTS", "convert_layout", "expand_pairs", "layout_permutation", "rotate_pairs"]


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


# -- layout conversion -----------------------------------------------------------------
def layout_permutation(src: str, dst: str, head_dim: int, rotary_dim: int | None = None) -> np.ndarray:
    """Feature permutation ``perm`` (host NumPy) with ``converted = x[..., perm]`` for one head.

    ``perm[j]`` is the ``src`` feature that lands at ``dst`` feature ``j``.  Features
    ``rotary_dim .. head_dim - 1`` stay in place.

    Examples
    --------
    >>> import rotary
    >>> rotary.layouts.layout_permutation("interleaved", "half", 8)
    array([0, 2, 4, 6, 1, 3, 5, 7])
    >>> rotary.layouts.layout_permutation("half", "interleaved", 8, rotary_dim=4)
    array([0, 2, 1, 3, 4, 5, 6, 7])
    """
    return np.asarray(_permutation(src, dst, head_dim, rotary_dim), dtype=np.int64)


def _permutation(src: str, dst: str, head_dim: int, rotary_dim: int | None) -> list[int]:
    # Plain Python (no NumPy), so torch.compile and jax.jit see constants, not traced ops.
    check_layout(src, "src")
    check_layout(dst, "dst")
    head_dim = _check_even_dim(head_dim, "head_dim")
    r = head_dim if rotary_dim is None else _check_even_dim(rotary_dim, "rotary_dim")
    if r > head_dim:
        raise ValueError(f"rotary_dim={r} is larger than head_dim={head_dim}")
    h = r // 2
    if src == "interleaved" and dst == "half":
        rot = [2 * i for i in range(h)] + [2 * i + 1 for i in range(h)]
    elif src == "half" and dst == "interleaved":
        rot = [j for i in range(h) for j in (i, i + h)]
    else:
        rot = list(range(r))
    return rot + list(range(r, head_dim))


def _check_even_dim(n: Any, name: str) -> int:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise TypeError(f"{name} must be a positive even integer, got {n!r}")
    if n <= 0 or n % 2:
        raise ValueError(f"{name} must be a positive even integer, got {n}")
    return int(n)


def convert_layout(
    x: Array,
    src: str,
    dst: str,
    *,
    axis: int = -1,
    head_dim: int | None = None,
    rotary_dim: int | None = None,
) -> Array:
    """Permute features of ``x`` from pair layout ``src`` to ``dst`` along ``axis``.

    The axis is read as consecutive heads of ``head_dim`` features; inside each
    head the first ``rotary_dim`` features are re-paired and the rest stay in
    place.  The same call converts activations (``axis=-1``) and the q/k
    projection weights and biases of a checkpoint (the output-feature axis,
    with ``head_dim``), so that a model trained in one layout gives identical
    attention scores in the other.  Round trips are exact (a pure permutation).

    Parameters
    ----------
    x : array
        Any array of any array-API library (any dtype).
    src, dst : {"half", "interleaved"}
        Layout of ``x`` and layout wanted.  ``src == dst`` returns ``x`` itself.
    axis : int
        Axis holding the features: ``-1`` for activations and for
        ``(in, out)`` weights (JAX/Keras ``Dense``), ``0`` for ``(out, in)``
        weights (``torch.nn.Linear.weight``), ``-1`` or ``0`` for biases.
    head_dim : int, optional
        Features per head (default: the whole axis is one head).  For q use the
        query head count, for k the kv head count: ``head_dim`` is the same, so
        grouped-query attention needs nothing special.
    rotary_dim : int, optional
        Rotated features per head for NeoX-style partial rotary, default
        ``head_dim``.  Gemma-style ``partial="proportional"`` pairs span the
        whole head: leave ``rotary_dim`` unset for those models.

    Returns
    -------
    array
        Same namespace, device, dtype and shape as ``x``.

    Examples
    --------
    >>> import numpy as np, rotary
    >>> x = np.arange(8)
    >>> rotary.convert_layout(x, "interleaved", "half")
    array([0, 2, 4, 6, 1, 3, 5, 7])
    >>> w = np.arange(16 * 3).reshape(16, 3)       # torch Linear weight (out, in), 2 heads of 8
    >>> w_half = rotary.convert_layout(w, "interleaved", "half", axis=0, head_dim=8)
    >>> bool((rotary.convert_layout(w_half, "half", "interleaved", axis=0, head_dim=8) == w).all())
    True
    """
    xp = array_namespace(x, names=("x",))
    check_layout(src, "src")
    check_layout(dst, "dst")
    shape = tuple(x.shape)
    if not shape:
        raise ValueError("x must have at least one axis, got a 0-d array")
    try:
        ax = operator.index(axis)
    except TypeError:
        raise TypeError(f"axis must be an integer, got {axis!r}") from None
    if not -len(shape) <= ax < len(shape):
        raise ValueError(f"axis={axis} is out of range for x with {len(shape)} axes (shape {shape})")
    ax %= len(shape)
    n = shape[ax]
    if not isinstance(n, int):
        raise ValueError(f"x.shape[{axis}] is unknown ({n}); rechunk or compute chunk sizes first")
    hd = _check_even_dim(
        n if head_dim is None else head_dim, "head_dim" if head_dim is not None else "x.shape[axis]"
    )
    if n % hd:
        raise ValueError(
            f"x.shape[{axis}]={n} is not a multiple of head_dim={hd}; pass the per-head size "
            "(for q: n_heads * head_dim rows, for k: n_kv_heads * head_dim rows)"
        )
    perm = _permutation(src, dst, hd, rotary_dim)
    if src == dst:
        return x
    if is_dask_namespace(xp):  # one task per block of whole heads
        return _dask.convert_layout(x, src, dst, ax, hd, rotary_dim)
    full = [start + j for start in range(0, n, hd) for j in perm]
    idx = xp.asarray(full, dtype=xp.int32 if n < 2**31 else xp.int64, device=creation_device(x, xp))
    return xp.take(x, idx, axis=ax)
