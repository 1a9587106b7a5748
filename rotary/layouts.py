"""The two pair layouts, and conversion between them for activations, weights and biases.

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

import functools
import operator
from typing import Any

import numpy as np

from ._backends import backend_for
from ._lib import _validation as v
from ._lib._compat import array_namespace, entry, index_dtype, is_array, not_an_array
from ._lib._typing import Array, Layout
from ._math._rotation import LAYOUTS, permutation

__all__ = ["LAYOUTS", "convert_layout", "layout_permutation"]


def _dims(head_dim: Any, rotary_dim: Any, head_name: str = "head_dim") -> tuple[int, int]:
    hd = v.check_head_dim(head_dim, head_name)
    return hd, v.check_rotary_dim(rotary_dim, hd)


def layout_permutation(src: Layout, dst: Layout, head_dim: int, rotary_dim: int | None = None) -> np.ndarray:
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
    src = v.check_layout_name(src, "src")
    dst = v.check_layout_name(dst, "dst")
    hd, r = _dims(head_dim, rotary_dim)
    return np.asarray(permutation(src, dst, hd, r), dtype=np.int64)


@entry
def convert_layout(
    x: Array,
    src: Layout,
    dst: Layout,
    *,
    axis: int = -1,
    head_dim: int | None = None,
    rotary_dim: int | None = None,
) -> Array:
    """Permute features of ``x`` from pair layout ``src`` to ``dst`` along ``axis``.

    The axis is read as consecutive heads of ``head_dim`` features; inside each head the
    first ``rotary_dim`` features are re-paired and the rest stay in place.  The same call
    converts activations (``axis=-1``) and the q/k projection weights and biases of a
    checkpoint (the output-feature axis, with ``head_dim``), so that a model trained in one
    layout gives identical attention scores in the other.  Round trips are exact (a pure
    permutation).

    Parameters
    ----------
    x : array
        Any array of any array-API library (any dtype).
    src, dst : {"half", "interleaved"}
        Layout of ``x`` and layout wanted.  ``src == dst`` returns ``x`` itself.
    axis : int
        Axis holding the features: ``-1`` for activations and for ``(in, out)`` weights
        (JAX/Keras ``Dense``), ``0`` for ``(out, in)`` weights (``torch.nn.Linear.weight``),
        ``-1`` or ``0`` for biases.
    head_dim : int, optional
        Features per head (default: the whole axis is one head).  For q use the query head
        count, for k the kv head count: ``head_dim`` is the same, so grouped-query attention
        needs nothing special.
    rotary_dim : int, optional
        Rotated features per head for NeoX-style partial rotary, default ``head_dim``.
        Gemma-style ``partial="proportional"`` pairs span the whole head: leave
        ``rotary_dim`` unset for those models.

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
    if not is_array(x):
        raise not_an_array("x", x)
    xp = array_namespace(x, names=("x",))
    be = backend_for(xp)
    j = be.jagged(x)
    if j is not None:  # a nested array: its values converted, in its own layout
        if isinstance(axis, bool) or not isinstance(axis, int) or axis >= 0 or axis == j.axis:
            raise ValueError(
                f"x is nested: axis must count from the end and not be its token axis ({j.axis}), "
                f"got {axis!r}"
            )
        out = convert_layout(j.values, src, dst, axis=axis, head_dim=head_dim, rotary_dim=rotary_dim)
        return j.wrap(out)
    src = v.check_layout_name(src, "src")
    dst = v.check_layout_name(dst, "dst")
    be.check_dense([("x", x)])
    shape = tuple(x.shape)
    if not shape:
        raise ValueError("x must have at least one axis, got a 0-d array")
    if isinstance(axis, bool):
        raise TypeError(f"axis must be an integer, got {axis!r}")
    try:
        ax = operator.index(axis)
    except TypeError:
        raise TypeError(f"axis must be an integer, got {axis!r}") from None
    if not -len(shape) <= ax < len(shape):
        raise ValueError(f"axis={axis} is out of range for x with {len(shape)} axes (shape {shape})")
    ax %= len(shape)
    n = v.check_known_dim(shape[ax], f"x.shape[{axis}]")
    hd, r = _dims(
        n if head_dim is None else head_dim,
        rotary_dim,
        "head_dim" if head_dim is not None else "x.shape[axis]",
    )
    if n % hd:
        raise ValueError(
            f"x.shape[{axis}]={n} is not a multiple of head_dim={hd}; pass the per-head size "
            "(for q: n_heads * head_dim rows, for k: n_kv_heads * head_dim rows)"
        )
    if src == dst:
        return x
    if be.lazy or be.composite(x):  # one task per block of whole heads (per part)
        kernel = functools.partial(convert_layout, src=src, dst=dst, axis=ax, head_dim=hd, rotary_dim=r)
        return be.map_heads(kernel, x, axis=ax, head_dim=hd)
    perm = permutation(src, dst, hd, r)
    full = [start + j for start in range(0, n, hd) for j in perm]
    idx = xp.asarray(full, dtype=index_dtype(xp, be.creation_device(x)), device=be.creation_device(x))
    return xp.take(x, idx, axis=ax)
