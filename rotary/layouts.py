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
    ops = _eager_out_ops(x, cos, sin)
    if ops is not None:
        out = _rotate_into(x, cos, sin, layout, rotary_dim, ops)
    else:
        out = _rotate_functional(x, cos, sin, layout, rotary_dim, xp)
    if out.dtype != out_dtype:
        out = xp.astype(out, out_dtype)
    return out


def _rotate_functional(
    x: Array, cos: Array, sin: Array, layout: str, rotary_dim: int, xp: Namespace
) -> Array:
    """The array-API formula (every backend; what jit/compile trace and fuse)."""
    d = x.shape[-1]
    h = rotary_dim // 2
    if layout == "half":
        x1 = x[..., :h]
        x2 = x[..., h:rotary_dim]
        parts = [x1 * cos - x2 * sin, x2 * cos + x1 * sin]
        if rotary_dim < d:
            parts.append(x[..., rotary_dim:])
        return xp.concat(parts, axis=-1)
    lead = tuple(x.shape[:-1])
    pairs = xp.reshape(x[..., :rotary_dim], (*lead, h, 2))
    xe, xo = pairs[..., 0], pairs[..., 1]
    rot = xp.stack([xe * cos - xo * sin, xo * cos + xe * sin], axis=-1)
    rot = xp.reshape(rot, (*lead, rotary_dim))
    return xp.concat([rot, x[..., rotary_dim:]], axis=-1) if rotary_dim < d else rot


# -- eager fast path -------------------------------------------------------------------------------
# NumPy (and torch in eager mode without autograd) can write into a freshly allocated output with
# ``out=`` ufuncs: no temporaries of the full size, and the work is cut into blocks of about
# ``_BLOCK_BYTES`` so that each block's operands stay in the L2 cache between the six passes.
# It computes exactly the functional formula (same operations, same order, same rounding).
# Measured on the 2-core CPU machine at (1, 32, 4096, 128) float32: NumPy about 4x faster than
# the functional path; see ``benchmarks/``.  Inputs are never written.
_BLOCK_BYTES = 1 << 18


def _eager_out_ops(x: Array, cos: Array, sin: Array) -> tuple | None:
    """(empty_like, multiply, subtract, add, broadcast_to) when the ``out=`` path applies."""
    mod = type(x).__module__
    if mod == "numpy" and type(x).__name__ == "ndarray":
        if type(cos) is np.ndarray and type(sin) is np.ndarray:
            return (np.empty_like, np.multiply, np.subtract, np.add, np.broadcast_to)
        return None
    if mod == "torch" and type(x).__name__ == "Tensor":
        import torch

        if (
            torch.compiler.is_compiling()
            or x.device.type != "cpu"  # accelerators: one fused kernel beats many small blocks
            or (torch.is_grad_enabled() and (x.requires_grad or cos.requires_grad or sin.requires_grad))
            or x.layout != torch.strided
            or _functorch_wrapped(torch, x)
            or not (type(cos) is torch.Tensor and type(sin) is torch.Tensor)
        ):
            return None
        return (torch.empty_like, torch.mul, torch.sub, torch.add, torch.broadcast_to)
    return None


def _functorch_wrapped(torch: object, x: Array) -> bool:
    f = getattr(getattr(getattr(torch, "_C", None), "_functorch", None), "is_functorch_wrapped_tensor", None)
    return bool(f(x)) if f is not None else False


def _blocks(lead: tuple, row_bytes: int) -> list:
    """Index tuples over ``lead`` cutting it into blocks of about ``_BLOCK_BYTES``."""
    inner = row_bytes
    sizes = []
    for n in reversed(lead):
        sizes.append(inner)
        inner *= n
    sizes.reverse()  # sizes[a]: bytes of one index of axis a
    a = next((i for i, per in enumerate(sizes) if per <= _BLOCK_BYTES), len(sizes) - 1)
    step = max(1, _BLOCK_BYTES // sizes[a])
    out = []
    for head in _ndindex(lead[:a]):
        for i in range(0, lead[a], step):
            out.append((*head, slice(i, min(i + step, lead[a]))))
    return out


def _ndindex(shape: tuple) -> list:
    idx: list[tuple] = [()]
    for n in shape:
        idx = [(*t, i) for t in idx for i in range(n)]
    return idx


def _rotate_into(x: Array, cos: Array, sin: Array, layout: str, rotary_dim: int, ops: tuple) -> Array:
    empty_like, mul, sub, add, broadcast_to = ops
    d = x.shape[-1]
    h = rotary_dim // 2
    if rotary_dim == d and type(x).__module__ == "numpy":
        return _rotate_into_np_full(x, cos, sin, layout, h)
    out = empty_like(x)
    if rotary_dim < d:
        out[..., rotary_dim:] = x[..., rotary_dim:]
    if layout == "half":
        x1, x2, o1, o2 = x[..., :h], x[..., h:rotary_dim], out[..., :h], out[..., h:rotary_dim]
    else:
        x1, x2 = x[..., 0:rotary_dim:2], x[..., 1:rotary_dim:2]
        o1, o2 = out[..., 0:rotary_dim:2], out[..., 1:rotary_dim:2]
    lead = tuple(x.shape[:-1])
    row_bytes = d * x.itemsize
    if row_bytes * _prod(lead) <= 2 * _BLOCK_BYTES or not lead:
        _rotate_block(x1, x2, cos, sin, o1, o2, empty_like(o1), mul, sub, add)
        return out
    cos = broadcast_to(cos, (*lead, h))
    sin = broadcast_to(sin, (*lead, h))
    blocks = _blocks(lead, row_bytes)
    tmp = empty_like(o1[blocks[0]])
    for b in blocks:
        t = tmp if tmp.shape == o1[b].shape else empty_like(o1[b])
        _rotate_block(x1[b], x2[b], cos[b], sin[b], o1[b], o2[b], t, mul, sub, add)
    return out


def _rotate_into_np_full(x: Array, cos: Array, sin: Array, layout: str, h: int) -> Array:
    """NumPy, whole head rotated: ``out = x * C + swap(x) * S`` block by block.

    ``C`` repeats ``cos`` for both features of a pair and ``S`` holds ``[-sin, sin]`` (the sign
    folded into a small per-call table), both laid out for ``layout``; ``swap`` exchanges the
    two features of every pair.  ``a + (-b) == a - b`` exactly, so this is the functional
    formula to the bit.  Half layout: ``swap`` is a view (pair axis reversed by a negative
    stride); interleaved: that view would leave an inner loop of length 2, so the swap is
    copied into the block's scratch buffer instead (measured 3x faster).
    """
    lead = tuple(x.shape[:-1])
    d = x.shape[-1]
    out = np.empty(x.shape, dtype=x.dtype)
    if layout == "half":
        shp = (*lead, 2, h)
        xv, ov = x.reshape(shp), out.reshape(shp)
        xs = xv[..., ::-1, :]  # swap as a view
        c2 = cos[..., None, :]
        s2 = np.multiply(sin[..., None, :], _sign(sin.dtype, 0))
    else:
        xv, ov, xs = x, out, None
        c2 = np.repeat(cos, 2, axis=-1)
        s2 = np.multiply(sin[..., :, None], _sign(sin.dtype, 1))
        s2 = s2.reshape((*s2.shape[:-2], d))
    row_bytes = d * x.itemsize
    if row_bytes * _prod(lead) <= 2 * _BLOCK_BYTES or not lead:
        blocks: list = [(...,)]
    else:
        c2 = np.broadcast_to(c2, (*lead, *c2.shape[len(c2.shape) - len(ov.shape) + len(lead) :]))
        s2 = np.broadcast_to(s2, (*lead, *s2.shape[len(s2.shape) - len(ov.shape) + len(lead) :]))
        blocks = _blocks(lead, row_bytes)
    tmp = np.empty(ov[blocks[0]].shape, dtype=x.dtype)
    for b in blocks:
        ob = ov[b]
        t = tmp if tmp.shape == ob.shape else np.empty(ob.shape, dtype=x.dtype)
        np.multiply(xv[b], c2[b], out=ob)
        if xs is not None:
            np.multiply(xs[b], s2[b], out=t)
        else:
            xp_, tp = xv[b].reshape((*t.shape[:-1], h, 2)), t.reshape((*t.shape[:-1], h, 2))
            np.copyto(tp[..., 0], xp_[..., 1])
            np.copyto(tp[..., 1], xp_[..., 0])
            np.multiply(t, s2[b], out=t)
        np.add(ob, t, out=ob)
    return out


_SIGNS: dict = {}


def _sign(dtype: object, interleaved: int) -> Array:
    """``[-1, 1]`` along the pair axis, shape ``(2, 1)`` (half) or ``(1, 2)`` (interleaved)."""
    out = _SIGNS.get((dtype, interleaved))
    if out is None:
        out = np.array([-1.0, 1.0], dtype=dtype).reshape((1, 2) if interleaved else (2, 1))
        _SIGNS[(dtype, interleaved)] = out
    return out


def _rotate_block(x1, x2, c, s, o1, o2, t, mul, sub, add) -> None:
    mul(x1, c, out=o1)
    mul(x2, s, out=t)
    sub(o1, t, out=o1)  # x1 * c - x2 * s
    mul(x2, c, out=o2)
    mul(x1, s, out=t)
    add(o2, t, out=o2)  # x2 * c + x1 * s


def _prod(shape: tuple) -> int:
    n = 1
    for v in shape:
        n *= v
    return n


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
