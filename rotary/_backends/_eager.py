"""Blocked eager kernels shared by the NumPy and torch (CPU, eager) backends.

Both libraries write into preallocated arrays (``out=``), so the rotation and the exact
angles' gathers run block by block into one output: no full-size temporaries, and each
block's operands stay in cache between passes.  Every kernel computes exactly what the
generic array-API code computes, in the same order: bit-identical results.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

from .._lib._typing import Array, Layout, Namespace
from .._math import _linear
from .._math._angles import DIGIT_BITS, LEVELS, RADIX, magnitude

__all__ = ["Ops", "attend", "causal_block", "exact", "rotate"]

#: Bytes of one block: operands of a block stay in the L2 cache between passes.
BLOCK_BYTES = 1 << 18


class Ops(NamedTuple):
    """The ``out=`` operations of one library."""

    empty: Callable[..., Array]  # empty(shape) in the kernel's dtype/device
    empty_like: Callable[[Array], Array]
    mul: Callable[..., Array]
    sub: Callable[..., Array]
    add: Callable[..., Array]
    take_into: Callable[[Array, Array, Array], None]  # out[:] = table[idx] (rows)
    broadcast_to: Callable[[Array, tuple[int, ...]], Array]
    matmul: Callable[..., Array]  # matmul(x, y, out=o)


# -- the rotation ------------------------------------------------------------------------------
def _prod(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def blocks(lead: tuple[int, ...], row_bytes: int) -> list[tuple[Any, ...]]:
    """Index tuples cutting the leading axes ``lead`` into blocks of about ``BLOCK_BYTES``."""
    inner = row_bytes
    sizes = []
    for n in reversed(lead):
        sizes.append(inner)
        inner *= n
    sizes.reverse()  # sizes[a]: bytes of one index of axis a
    a = next((i for i, per in enumerate(sizes) if per <= BLOCK_BYTES), len(sizes) - 1)
    step = max(1, BLOCK_BYTES // sizes[a])
    heads: list[tuple[int, ...]] = [()]
    for n in lead[:a]:
        heads = [(*t, i) for t in heads for i in range(n)]
    return [(*head, slice(i, min(i + step, lead[a]))) for head in heads for i in range(0, lead[a], step)]


def _rotate_block(x1: Array, x2: Array, c: Array, s: Array, o1: Array, o2: Array, t: Array, ops: Ops) -> None:
    ops.mul(x1, c, out=o1)
    ops.mul(x2, s, out=t)
    ops.sub(o1, t, out=o1)  # x1 * c - x2 * s
    ops.mul(x2, c, out=o2)
    ops.mul(x1, s, out=t)
    ops.add(o2, t, out=o2)  # x2 * c + x1 * s


def rotate(x: Array, c: Array, s: Array, layout: Layout, rotary_dim: int, ops: Ops) -> Array:
    """:func:`rotary._math._rotation.rotate_pairs` for ``x`` already in the dtype of ``c``."""
    d = x.shape[-1]
    h = rotary_dim // 2
    out = ops.empty_like(x)
    if rotary_dim < d:
        out[..., rotary_dim:] = x[..., rotary_dim:]
    if layout == "half":
        x1, x2, o1, o2 = x[..., :h], x[..., h:rotary_dim], out[..., :h], out[..., h:rotary_dim]
    else:
        x1, x2 = x[..., 0:rotary_dim:2], x[..., 1:rotary_dim:2]
        o1, o2 = out[..., 0:rotary_dim:2], out[..., 1:rotary_dim:2]
    lead = tuple(x.shape[:-1])
    row_bytes = d * x.itemsize
    if row_bytes * _prod(lead) <= 2 * BLOCK_BYTES or not lead:
        _rotate_block(x1, x2, c, s, o1, o2, ops.empty_like(o1), ops)
        return out
    c = ops.broadcast_to(c, (*lead, h))
    s = ops.broadcast_to(s, (*lead, h))
    bl = blocks(lead, row_bytes)
    tmp = ops.empty_like(o1[bl[0]])
    for b in bl:
        t = tmp if tmp.shape == o1[b].shape else ops.empty_like(o1[b])
        _rotate_block(x1[b], x2[b], c[b], s[b], o1[b], o2[b], t, ops)
    return out


# -- the exact angles' gathers -------------------------------------------------------------------
def exact(
    pos: Array, tables: Array, levels: int, nonneg: bool, ops: Ops, xp: Namespace
) -> tuple[Array, Array]:
    """:func:`rotary._math._angles.exact_cos_sin` of integer positions ``pos`` (any shape):
    :func:`exact_int` of their magnitudes, the sign of sin applied as the generic code does."""
    mag, negative = magnitude(xp.reshape(pos, (-1,)), xp=xp, wide_int=True)
    c, s = exact_int(mag, tables, levels if nonneg else LEVELS, ops)
    if not nonneg and negative is not None:
        s = s * (1.0 - 2.0 * xp.astype(negative, s.dtype))[:, None]
    n = tables.shape[-1]
    return xp.reshape(c, (*pos.shape, n)), xp.reshape(s, (*pos.shape, n))


def exact_int(mag: Array, tables: Array, levels: int, ops: Ops) -> tuple[Array, Array]:
    """cos and sin, each ``(P, n)``, of the non-negative integers ``mag`` (1-D): the digit
    gathers and angle-addition products of :func:`rotary._math._angles.exact_cos_sin`,
    block by block into two outputs."""
    n = tables.shape[-1]
    count = mag.shape[0]
    c_out, s_out = ops.empty((count, n)), ops.empty((count, n))
    if count == 0:
        return c_out, s_out
    split = [(tables[lv, 0], tables[lv, 1]) for lv in range(tables.shape[0])]
    step = max(1, min(count, BLOCK_BYTES // (2 * n * tables.itemsize)))
    bufs = [ops.empty((step, n)) for _ in range(7)]
    mask = RADIX - 1
    for i in range(0, count, step):
        j = min(i + step, count)
        m = j - i
        rest = mag[i:j]
        ac, as_, bc, bs, nc, ns, t = (b[:m] for b in bufs)
        if levels == 1:
            ops.take_into(split[0][0], rest, c_out[i:j])
            ops.take_into(split[0][1], rest, s_out[i:j])
            continue
        idx = rest & mask
        ops.take_into(split[0][0], idx, ac)
        ops.take_into(split[0][1], idx, as_)
        for level in range(1, levels):
            rest = rest >> DIGIT_BITS
            last = level == levels - 1
            idx = rest if last else rest & mask
            ops.take_into(split[level][0], idx, bc)
            ops.take_into(split[level][1], idx, bs)
            dc, ds = (c_out[i:j], s_out[i:j]) if last else (nc, ns)
            _rotate_block(ac, as_, bc, bs, dc, ds, t, ops)  # c * tc - s * ts, s * tc + c * ts
            if not last:
                ac, as_, nc, ns = dc, ds, ac, as_
    return c_out, s_out


# -- the causal block, in place --------------------------------------------------------------------
def causal_block(
    ch: _linear.Chunk,
    carry: _linear.Carry | None,
    size: int,
    m: int,
    plan: _linear.Plan,
    out_dtype: Any,
    xp: Namespace,
    device: Any,
    *,
    doc: Any = None,
    uniform: bool = False,
    strict: bool = False,
    divided: bool = True,
) -> tuple[Any, _linear.Carry]:
    """:func:`rotary._math._linear.block_causal` without decay (one product's bound; ``doc``: one
    document id per token ``(T,)``, or ids known to be one document, the carry's, where
    ``uniform``) with every product's result reused in place: the generic block's operations and
    bits, fewer buffers.  NumPy arrays or torch tensors (the in-place operators are both
    libraries'), of one dtype with equal leading axes, ``v`` contiguous, checked by the caller."""
    a, c, b, e, v = ch
    assert a is not None
    lead, T, dv, dt = tuple(a.shape[:-2]), a.shape[-2], v.shape[-1], a.dtype

    def split(x: Array) -> Array:
        return x.reshape(*lead, m, size, x.shape[-1])

    D = _linear._tri(size, xp, device, dt, strict)
    wend = wq = mask = None
    if doc is not None and not uniform:  # (0/1 weights: every product by them exact, in any order)
        d0 = None if carry is None else carry.doc
        ids = doc.reshape(m, size)
        D = xp.astype(ids[:, :, None] == ids[:, None, :], dt) * D
        wend = xp.astype(ids == ids[:, -1:], dt)[..., None]
        ends = xp.concat([ids[0, :1] if d0 is None else d0.reshape(1), ids[:, -1]])
        mask = xp.astype(ends[:, None] == ends[None, :], dt)
        wq = xp.astype(ids == ends[:-1, None], dt)
    A, B, V = split(a), split(b), split(v)
    AB = A @ B.swapaxes(-1, -2)
    AB *= D
    num = AB @ V
    den = Cq = None
    if c is not None and e is not None:
        Cq, E = split(c), split(e)
        CE = Cq @ E.swapaxes(-1, -2)
        CE *= D
        den = CE.sum(-1)
    Sc = (B if wend is None else B * wend).swapaxes(-1, -2) @ V
    zc = None if e is None else (split(e) if wend is None else split(e) * wend).sum(-2)
    if carry is None:
        S0 = xp.zeros_like(Sc[..., 0, :, :])
        z0 = None if zc is None else xp.zeros_like(zc[..., 0, :])
    else:
        S0, z0 = carry.S, carry.z
    W = _linear._tri(m + 1, xp, device, dt)
    if mask is not None:
        W *= mask
    F = Sc.shape[-2]
    src = xp.concat([S0[..., None, :, :], Sc], axis=-3).reshape(*lead, m + 1, F * dv)
    # (the generic block's two products: its rows of W are these rows' values)
    P = (W[:-1] @ src).reshape(*lead, m, F, dv)
    P_end = (W[-1:] @ src).reshape(*lead, F, dv)
    inter = A @ P
    if wq is not None:
        inter *= wq[..., None]
    num += inter  # (a + b == b + a: the generic num + inter)
    Pz = None
    if den is not None and zc is not None and z0 is not None and Cq is not None:
        Pz = W @ xp.concat([z0[..., None, :], zc], axis=-2)
        dinter = (Cq * Pz[..., :-1, None, :]).sum(-1)
        if wq is not None:
            dinter *= wq
        den += dinter
    after = _linear.Carry(
        P_end, None if Pz is None else Pz[..., -1, :], None if doc is None else doc[..., -1]
    )
    if not divided:
        return (num.reshape(*lead, T, dv), None if den is None else den.reshape(*lead, T)), after
    if den is not None:
        num /= _safe(den, plan)[..., None]
    out = num.reshape(*lead, T, dv)
    return (out if out_dtype is None or out.dtype == out_dtype else xp.astype(out, out_dtype)), after


def _safe(den: Array, plan: _linear.Plan) -> Array:
    """:func:`rotary._math._linear.divide`'s denominator, in place (``den``: the caller's own)."""
    if plan.eps > 0:
        den[den < plan.eps] = plan.eps  # (maximum's values: NaN stays NaN)
    else:
        den[den == 0] = math.inf
    return den


def attend(a: Array, c: Array | None, st: _linear.State, plan: _linear.Plan, dest: Array, ops: Ops) -> Array:
    """:func:`rotary._math._linear.attend` written into ``dest`` (the product there, divided in
    place): its operations and bits.  Tensors of one dtype, checked by the caller."""
    ops.matmul(a, st.S, out=dest)
    if c is None or st.z is None:
        return dest
    dest /= _safe((c * st.z[..., None, :]).sum(-1), plan)[..., None]
    return dest
