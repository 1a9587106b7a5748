"""cos and sin of the rotation angles ``pos * theta_i``: the exact method and the float32 recipe.

``"exact"`` (default)
    Range reduction that is exact for integer positions.  ``|p|`` is split into base-4096
    digits ``d0 + 4096 d1 + 4096**2 d2`` (formed without overflow, also ``|-2**31|`` in
    int32) and the sign applied to the sine at the end.  For each digit level a host table
    of ``cos/sin(d * 4096**level * theta)`` is built once: the step ``4096**level * theta``
    is reduced modulo ``2 pi`` exactly (decimal arithmetic), so every table angle is below
    ``4096 * 2 pi`` and each entry is correct to ~1e-17 before rounding to the compute
    dtype.  The digits' rotations are then composed with the angle-addition formulas.  A
    floating position adds ``cos/sin(f * theta)`` of its fractional part ``f``, computed
    directly; float64 positions are split before any rounding to float32.

    Within a few float32 ulps (< 2e-7 absolute) of the float64 truth for every integer
    ``|p| < 2**36`` on every backend, float64-less ones included; float64 results are
    within ~2e-15.

``"float32"``
    Hugging Face's recipe: ``angle = float32(pos) * float32(theta)``, then ``cos``/``sin``
    in float32.  Bit-for-bit Hugging Face on torch; its error grows with the position.

Max |cos error| against the float64 truth (d=128, base 1e4, all 64 frequencies,
``benchmarks/angle_errors.py``)::

    position   float32 recipe   exact, float32   exact, float64
    2**10      5.6e-05          3.0e-08          < 1e-16
    2**17      7.7e-03          1.3e-07          1.1e-16
    2**20      6.2e-02          1.3e-07          1.1e-16
    2**24      9.5e-01          1.3e-07          1.5e-15
    2**28      2 (wrong sign)   1.9e-07          1.4e-15
    2**32      2                1.8e-07          1.6e-15
    2**36 - 1  2                1.8e-07          2.2e-15
"""

from __future__ import annotations

import decimal
import functools
import math
from collections.abc import Callable

import numpy as np

from .._lib._typing import Array, DType, Namespace
from .._lib._validation import dtype_name, is_floating, known_shape

__all__ = [
    "DIGIT_BITS",
    "LEVELS",
    "RADIX",
    "TABLE_ROWS",
    "digit_tables",
    "exact_cos_sin",
    "float32_recipe",
    "int_digits",
    "levels_for_range",
    "magnitude",
]

#: Bits per position digit, number of digit levels, radix, rows per level table.
DIGIT_BITS = 12
LEVELS = 3
RADIX = 1 << DIGIT_BITS
#: Rows of each level's table: digits ``0 .. 4096`` (a float position's top digit, by floor
#: division, reaches ``-4096`` just above ``-2**36``).
TABLE_ROWS = RADIX + 1
#: Positions are exact for ``|p| < MAX_POSITION``.
MAX_POSITION = RADIX**LEVELS

#: 2 pi to 110 significant digits, for the exact range reduction of the table steps.
_TWO_PI = 2 * decimal.Decimal(
    "3.14159265358979323846264338327950288419716939937510582097494459230781640628620899862803482534211706798"
)


def _reduced(w: np.ndarray, scale: int) -> np.ndarray:
    """``(scale * w) mod 2 pi`` in ``longdouble``, from exact decimal arithmetic (``w`` is
    float64 and ``scale`` an integer, so the product is exact before the reduction)."""
    out = np.empty(w.shape, dtype=np.longdouble)
    with decimal.localcontext() as ctx:
        ctx.prec = 110
        k = decimal.Decimal(scale)
        for i, wi in enumerate(w.tolist()):
            x = decimal.Decimal(wi) * k
            r = x - (x / _TWO_PI).to_integral_value(rounding=decimal.ROUND_FLOOR) * _TWO_PI
            hi = float(r)
            out[i] = np.longdouble(hi) + np.longdouble(float(r - decimal.Decimal(hi)))
    return out


#: A table row ``d = 64 a + b`` is put together from ``a`` (0..64) and ``b`` (0..63).
_SPLIT = 64


def digit_tables(w: np.ndarray) -> np.ndarray:
    """Host tables ``cos/sin(d * 4096**level * w)`` for digits ``d = 0 .. 4096``.

    Float64, shape ``(LEVELS, 2, TABLE_ROWS, len(w))`` (axis 1: cos, sin; rows contiguous),
    read-only.  Each row ``d = 64 a + b`` is the angle sum of ``a * s64`` and ``b * s1``,
    where ``s1`` and ``s64`` are the steps ``4096**level * w`` and ``64 * 4096**level * w``
    reduced modulo ``2 pi`` exactly (decimal): every ``longdouble`` angle is below
    ``64 * 2 pi`` and the sum is formed in ``longdouble``, so the entries are within ~1e-18
    of the truth before rounding to float64.
    """
    w = np.ascontiguousarray(w, dtype=np.float64)
    ld = np.longdouble  # 64-bit mantissa on x86; float64 where the platform has no wider type
    n_a = -(-TABLE_ROWS // _SPLIT)
    ka = np.arange(n_a + 1, dtype=ld)[:, None, None]
    kb = np.arange(_SPLIT, dtype=ld)[None, :, None]
    out = np.empty((LEVELS, 2, TABLE_ROWS, w.shape[0]), dtype=np.float64)
    for level in range(LEVELS):
        s1 = _reduced(w, RADIX**level)
        s64 = _reduced(w, _SPLIT * RADIX**level)
        a, b = ka * s64, kb * s1
        ca, sa, cb, sb = np.cos(a), np.sin(a), np.cos(b), np.sin(b)
        c = (ca * cb - sa * sb).reshape(-1, w.shape[0])[:TABLE_ROWS]
        s = (sa * cb + ca * sb).reshape(-1, w.shape[0])[:TABLE_ROWS]
        out[level, 0] = c.astype(np.float64)
        out[level, 1] = s.astype(np.float64)
    out.setflags(write=False)
    return out


def levels_for_range(hi: int) -> int:
    """Digit levels needed for non-negative positions ``<= hi``."""
    levels = 1
    while hi >= RADIX**levels and levels < LEVELS:
        levels += 1
    return levels


def magnitude(p: Array, *, xp: Namespace, wide_int: bool) -> tuple[Array, Array | None]:
    """``(|p|, p < 0)`` for 1-D integer positions, without overflow (``None``: unsigned).

    Small types are widened to int32, unsigned ones to int64 where the device has it
    (``wide_int``).  int32 values become int64 there too; otherwise ``|p|`` is formed as
    uint32, which holds ``|-2**31|`` (``abs`` in int32 does not).
    """
    info = xp.iinfo(p.dtype)
    if info.bits < 32:
        p = xp.astype(p, xp.int32)
    elif info.min == 0:
        return (xp.astype(p, xp.int64) if wide_int else p), None
    negative = p < 0
    if xp.iinfo(p.dtype).bits == 32:
        if wide_int:
            p = xp.astype(p, xp.int64)
        else:
            # -(p + 1) never overflows; every value cast to uint32 is non-negative.
            low = xp.where(negative, -(p + 1), p)
            return xp.astype(low, xp.uint32) + xp.astype(negative, xp.uint32), negative
    return xp.abs(p), negative


def int_digits(mag: Array, *, levels: int) -> list[Array]:
    """Base-4096 digits of non-negative integers ``mag`` (``& 4095`` and ``>> 12``), as
    table row indices; the top one is not masked (``mag < 4096**levels``)."""
    digits = []
    rest = mag
    for _ in range(levels - 1):
        digits.append(rest & (RADIX - 1))
        rest = rest >> DIGIT_BITS
    digits.append(rest)
    return digits


def exact_cos_sin(
    pos: Array,
    tables: Array,
    w: Array,
    *,
    xp: Namespace,
    dtype: DType,
    levels: int = LEVELS,
    nonneg: bool = False,
    checked: bool = False,
    wide_int: bool = True,
    take: Callable[[Array, Array], Array] | None = None,
) -> tuple[Array, Array]:
    """Exact-method cos and sin of ``pos[..., None] * w``, shape ``pos.shape + (len(w),)``.

    ``pos``: integer or floating positions (any shape) of ``xp``.  ``tables``:
    :func:`digit_tables` as an array of ``xp`` in ``dtype`` beside ``pos``; ``w``: the
    frequencies in ``dtype``.  Integers: ``|pos|`` is split into digits and the sign applied
    to the sine at the end, so ``p`` and ``-p`` give exactly opposite sines.  Floats:
    ``floor(pos)`` is split into digits by floor division (the top one carries the sign)
    and ``pos - floor(pos)`` added directly, so the derivative in ``pos`` is right
    everywhere, at 0 too.  ``levels``/``nonneg``/``checked`` are hints from a caller that
    read the values (below ``4096**levels``, non-negative; finite and ``|pos| < 2**36``);
    unchecked positions that are not finite or not below ``2**36`` (under ``jax.jit``,
    ``torch.compile``, Dask, accelerators) give NaN rather than an out-of-range gather.
    ``wide_int``: the device has int64.  ``take(table, idx)``: the row gather (default
    ``xp.take(table, idx, axis=0)``).
    """
    if take is None:
        take = functools.partial(xp.take, axis=0)
    shape = tuple(pos.shape)
    flat = xp.reshape(pos, (-1,))
    frac = negative = top_negative = valid = None
    if is_floating(flat.dtype):
        if dtype_name(flat.dtype) in ("float16", "bfloat16"):
            flat = xp.astype(flat, xp.float32)  # exact
        if not checked:
            valid = xp.abs(flat) < float(MAX_POSITION)  # False for NaN and inf too
            flat = xp.where(valid, flat, xp.zeros_like(flat))
        whole = xp.floor(flat)
        frac = flat - whole
        if frac.dtype != dtype:
            frac = xp.astype(frac, dtype)
        digits = []
        rest = whole
        for _ in range(LEVELS - 1):
            # (an operator: a Python scalar operand is standard in operators at every version, in
            # functions such as remainder only from 2024.12)
            digits.append(xp.astype(rest % float(RADIX), xp.int32))
            rest = xp.floor(rest / RADIX)
        top_negative = rest < 0
        digits.append(xp.astype(xp.abs(rest), xp.int32))  # at most 4096: the tables' last row
    else:
        mag, negative = magnitude(flat, xp=xp, wide_int=wide_int)
        if nonneg:
            negative = None
        else:
            levels = LEVELS
        if not checked and xp.iinfo(mag.dtype).bits > 32:  # 32-bit values are below 2**36
            valid = mag < MAX_POSITION
            mag = xp.where(valid, mag, xp.zeros_like(mag))
        digits = int_digits(mag, levels=levels)
    c = s = None
    for level, d in enumerate(digits):
        tc = take(tables[level, 0, ...], d)  # one contiguous table row per position
        ts = take(tables[level, 1, ...], d)
        if top_negative is not None and level == len(digits) - 1:
            ts = xp.where(top_negative[:, None], -ts, ts)
        if c is None:
            c, s = tc, ts
        else:
            c, s = c * tc - s * ts, s * tc + c * ts
    if frac is not None:
        ang = frac[:, None] * w
        fc, fs = xp.cos(ang), xp.sin(ang)
        c, s = c * fc - s * fs, s * fc + c * fs
    if negative is not None:
        s = s * (1.0 - 2.0 * xp.astype(negative, dtype))[:, None]
    assert c is not None and s is not None  # at least one digit level
    if valid is not None:
        nan = xp.full_like(c, math.nan)
        c, s = xp.where(valid[:, None], c, nan), xp.where(valid[:, None], s, nan)
    # (the width from c, not from w or the tables: under torch.compile(dynamic=True) a
    # constant's shape cannot be read)
    n = c.shape[-1]
    out = known_shape((*shape, n), f"pos of shape {shape}", _UNKNOWN_HINT)
    return xp.reshape(c, out), xp.reshape(s, out)


#: What to do when positions have more than one dimension of unknown size.
_UNKNOWN_HINT = (
    "exact angles gather table rows by a flat index and reshape back: give the positions at most one "
    "dynamic dimension, e.g. (seq,) or (batch_size, seq) with batch_size fixed, or use angles='float32', "
    "which needs no tables"
)


def float32_angles(pos: Array, inv32: Array, *, xp: Namespace) -> Array:
    """Hugging Face's angles: ``float32(pos)[..., None] * inv32``."""
    return xp.astype(pos, xp.float32)[..., None] * inv32


def float32_recipe(pos: Array, inv32: Array, *, xp: Namespace) -> tuple[Array, Array]:
    """Hugging Face's recipe: :func:`float32_angles`, cos/sin in float32."""
    ang = float32_angles(pos, inv32, xp=xp)
    return xp.cos(ang), xp.sin(ang)
