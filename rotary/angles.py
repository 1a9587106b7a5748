"""The angle math: inverse frequencies and cos/sin of ``position * inv_freq``.

Two methods:

``"exact"`` (default)
    Range reduction that is exact for integer positions.  A position is split
    into base-4096 digits ``p = d0 + 4096 d1 + 4096**2 d2`` (plus a fractional
    part for floating positions).  For each digit level a table of
    ``cos/sin(d * 4096**level * inv_freq)`` is built once, on the host: the step
    ``4096**level * inv_freq`` is reduced modulo 2 pi exactly (decimal
    arithmetic), so every table angle is below ``4096 * 2 pi`` and every entry is
    accurate to ~1e-15 before rounding to the compute dtype; the angle of ``p`` is
    then put together with the angle-addition formulas.  The result is within a
    few float32 ulps (< 1e-6 absolute, measured <= 1.9e-7) of the float64 truth
    for every integer ``|p| < 2**36``, on every backend, including those without
    float64; float64 results are within ~2e-15.  Floating positions: the
    fractional part ``f`` adds ``cos/sin(f * inv_freq)`` computed directly
    (< 2e-7 absolute in float32 for the position value as held; float64
    positions are split before any rounding to float32).

``"float32"``
    The common recipe (Hugging Face LLaMA): ``inv_freq = 1 / base**(arange(0, d, 2) / d)``
    and ``angle = pos * inv_freq``, both in float32, then ``cos``/``sin`` in
    float32.  Reproduces that recipe bit-for-bit on torch; its error grows with
    the position.

Max |cos error| against the float64 truth (d=128, base 1e4, 4096 positions up
to each mark, all 64 frequencies; ``benchmarks/angle_errors.py``; the exact
column is the same on NumPy, torch, JAX with x64 off and array-api-strict's
``no_float64`` device)::

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
from typing import Any

import numpy as np

from ._compat import Array, Namespace, is_real_floating

__all__ = [
    "ANGLE_METHODS",
    "DIGIT_BITS",
    "LEVELS",
    "cos_sin",
    "exact_cos_sin_positions",
    "inv_freq",
    "level_tables",
]

ANGLE_METHODS = ("exact", "float32")

#: Bits per position digit and number of digit levels of the exact method.
DIGIT_BITS = 12
LEVELS = 3
_RADIX = 1 << DIGIT_BITS


def inv_freq(dim: int, base: float = 10000.0) -> np.ndarray:
    """Inverse frequencies ``theta_i = base**(-2i/dim)``, ``i = 0 .. dim/2 - 1``, in float64.

    Parameters
    ----------
    dim : int
        Number of rotated features (even).
    base : float
        The RoPE base (``rope_theta``).

    Returns
    -------
    numpy.ndarray
        Shape ``(dim // 2,)``, float64.

    Examples
    --------
    >>> import rotary
    >>> rotary.inv_freq(8, base=10000.0)
    array([1.   , 0.1  , 0.01 , 0.001])
    """
    exps = np.arange(0, dim, 2, dtype=np.float64) / dim
    return 1.0 / (float(base) ** exps)


#: 2 pi to 110 significant digits, for the exact range reduction of the table steps.
_TWO_PI = 2 * decimal.Decimal(
    "3.14159265358979323846264338327950288419716939937510582097494459230781640628620899862803482534211706798"
)


def _reduced_steps(w: np.ndarray, level: int) -> tuple[np.ndarray, np.ndarray]:
    """``(radix**level * w) mod 2 pi`` as an unevaluated sum ``hi + lo`` of float64 arrays.

    Exact decimal arithmetic (64 values), so the tables need no wide float: the
    table angles ``digit * (hi + lo)`` stay below ``4096 * 2 pi`` and lose at most
    ~1e-15 (80-bit longdouble) or ~3e-12 (platforms whose longdouble is float64).
    """
    hi = np.empty(w.shape, dtype=np.float64)
    lo = np.empty(w.shape, dtype=np.float64)
    with decimal.localcontext() as ctx:
        ctx.prec = 110
        scale = decimal.Decimal(_RADIX**level)
        for i, wi in enumerate(w.tolist()):
            x = decimal.Decimal(wi) * scale  # exact: w is a float64, radix**level an integer
            r = x - (x / _TWO_PI).to_integral_value(rounding=decimal.ROUND_FLOOR) * _TWO_PI
            hi[i] = float(r)
            lo[i] = float(r - decimal.Decimal(hi[i]))
    return hi, lo


@functools.lru_cache(maxsize=64)
def _level_tables_cached(inv_bytes: bytes, levels: int) -> np.ndarray:
    w = np.frombuffer(inv_bytes, dtype=np.float64)
    ld = np.longdouble  # 64-bit mantissa on x86; float64 where the platform has no wider type
    digits = np.arange(_RADIX, dtype=ld)[:, None]
    out = np.empty((levels, _RADIX, 2, w.shape[0]), dtype=np.float64)
    for level in range(levels):
        # Angle digit * radix**level * w, from its exactly reduced step: below 4096 * 2 pi.
        hi, lo = _reduced_steps(w, level)
        ang = digits * hi.astype(ld)[None, :] + digits * lo.astype(ld)[None, :]
        out[level, :, 0, :] = np.cos(ang).astype(np.float64)
        out[level, :, 1, :] = np.sin(ang).astype(np.float64)
    out.setflags(write=False)
    return out


def level_tables(w: np.ndarray, levels: int = LEVELS) -> np.ndarray:
    """Host tables ``cos/sin(d * 4096**level * w)`` for ``d < 4096``.

    Returns a read-only float64 array of shape ``(levels, 4096, 2, len(w))``
    (axis 2: cos, sin).  Cached per frequency vector.
    """
    w = np.ascontiguousarray(w, dtype=np.float64)
    return _level_tables_cached(w.tobytes(), int(levels))


def levels_for(pos_dtype: Any, xp: Namespace) -> int:
    """Digit levels needed for a position dtype (statically, from its range)."""
    if is_real_floating(xp, pos_dtype):
        return LEVELS
    try:
        bits = xp.iinfo(pos_dtype).bits
    except Exception:
        return LEVELS
    if bits <= 16:
        return 2
    return LEVELS


def cos_sin(
    pos: Array,
    w: np.ndarray,
    *,
    xp: Namespace,
    dtype: Any,
    tables: Array | None = None,
    method: str = "exact",
) -> tuple[Array, Array]:
    """cos and sin of ``pos[..., None] * w`` in ``dtype`` (float32 or float64).

    ``pos`` is an array of ``xp``; ``tables`` is ``level_tables(w)`` already on
    the right namespace/device/dtype (built here when ``None``).  Returns two
    arrays of shape ``pos.shape + (len(w),)``.
    """
    if method == "float32":
        return float32_recipe(pos, xp.asarray(w, dtype=xp.float32, device=_device_of(pos, xp)), xp=xp)
    if tables is None:
        tables = backend_tables(w, xp=xp, device=_device_of(pos, xp), dtype=dtype)
    wb = xp.asarray(w, dtype=dtype, device=_device_of(pos, xp))
    return exact_cos_sin_positions(pos, tables, wb, xp=xp, dtype=dtype)


def _device_of(pos: Array, xp: Namespace) -> Any:
    from ._compat import creation_device

    return creation_device(pos, xp)


def backend_tables(w: np.ndarray, *, xp: Namespace, device: Any, dtype: Any) -> Array:
    """``level_tables(w)`` as an array of ``xp`` on ``device`` in ``dtype``."""
    np_dtype = np.float64 if (hasattr(xp, "float64") and dtype == xp.float64) else np.float32
    return xp.asarray(level_tables(w).astype(np_dtype), dtype=dtype, device=device)


def exact_cos_sin(
    pos: Array,
    tables: Array,
    w: np.ndarray,
    *,
    xp: Namespace,
    dtype: Any,
    levels: int | None = None,
    nonneg: bool = False,
) -> tuple[Array, Array]:
    """Exact-method cos/sin; ``w`` is the inverse-frequency array of ``xp`` in ``dtype``.

    ``levels`` (default: from the position dtype, :func:`levels_for`) and ``nonneg`` are
    static hints from a caller that has checked concrete positions: every ``|pos|`` is below
    ``4096**levels``, and every position is ``>= 0``.  Skipped levels have digit 0 (table
    entry exactly ``(1, 0)``) and a skipped sign is ``+1``, so the hints change no bit of the
    result, only the work.
    """
    n = w.shape[0]
    shape = tuple(pos.shape)
    flat = xp.reshape(pos, (-1,))
    is_float = is_real_floating(xp, flat.dtype)
    if levels is None:
        levels = levels_for(flat.dtype, xp)
    levels = max(1, min(int(levels), LEVELS))
    if not is_float:
        flat = _int32_at_least(flat, xp)
        ops = _eager_take_ops(flat, tables)
        if ops is not None:
            c, s = _exact_int_blocked(xp.abs(flat) if not nonneg else flat, tables, levels, n, ops)
            if not nonneg:
                s = s * (1.0 - 2.0 * xp.astype(flat < 0, dtype))[:, None]
            return xp.reshape(c, (*shape, n)), xp.reshape(s, (*shape, n))
    if is_float:
        flat = xp.astype(flat, dtype) if flat.dtype != dtype else flat
        mag = xp.abs(flat) if not nonneg else flat
        whole = xp.floor(mag)
        frac = mag - whole
        rest = whole
        digits = []
        for _ in range(levels):
            digits.append(xp.astype(rest % _RADIX, xp.int32))
            rest = xp.floor(rest / _RADIX)
    else:
        rest = xp.abs(flat) if not nonneg else flat
        digits = []
        for _ in range(levels):
            # non-negative integers: & and >> are % and // without the division
            digits.append(rest & (_RADIX - 1))
            rest = rest >> DIGIT_BITS
        frac = None

    c = s = None
    for level, d in enumerate(digits):
        # gather rows of the (4096, 2 n) view: one contiguous row per position (a 3-d take is
        # up to 1000x slower on torch CPU)
        t = xp.reshape(xp.take(xp.reshape(tables[level, ...], (_RADIX, 2 * n)), d, axis=0), (-1, 2, n))
        tc, ts = t[:, 0, :], t[:, 1, :]
        if c is None:
            c, s = tc, ts
        else:
            c, s = c * tc - s * ts, s * tc + c * ts
    if frac is not None:
        ang = frac[:, None] * w
        fc, fs = xp.cos(ang), xp.sin(ang)
        c, s = c * fc - s * fs, s * fc + c * fs
    if not nonneg:
        sign = 1.0 - 2.0 * xp.astype(xp.reshape(pos, (-1,)) < 0, dtype)
        s = s * sign[:, None]
    return xp.reshape(c, (*shape, n)), xp.reshape(s, (*shape, n))


def _int32_at_least(flat: Array, xp: Namespace) -> Array:
    """Small integer dtypes cannot hold the radix: widen them (exact)."""
    try:
        bits = xp.iinfo(flat.dtype).bits
    except Exception:
        return flat
    return xp.astype(flat, xp.int32) if bits < 32 else flat


# -- eager fast path -------------------------------------------------------------------------------
# For concrete integer positions on NumPy (and torch outside torch.compile) the digit gathers and
# the angle-addition products run block by block into preallocated buffers (``out=``), so the
# intermediates stay in cache and the output is written once.  Same operations in the same order
# as the generic loop above: bit-identical results.  Measured: about 3x faster than the generic
# loop for 128k positions on NumPy (see ``benchmarks/``, section "table 128k").
_BLOCK_BYTES = 1 << 18


def _eager_take_ops(flat: Array, tables: Array) -> tuple | None:
    mod = type(flat).__module__
    if mod == "numpy" and type(flat).__name__ == "ndarray" and type(tables).__name__ == "ndarray":

        def take_into(table: Array, idx: Array, out: Array) -> None:
            np.take(table, idx, axis=0, out=out)

        kw = {"dtype": tables.dtype}
        return (np.empty, take_into, np.multiply, np.subtract, np.add, kw, np.ascontiguousarray)
    if mod == "torch" and type(flat).__name__ == "Tensor" and type(tables).__name__ == "Tensor":
        import torch

        if torch.compiler.is_compiling() or flat.device.type != "cpu":
            return None
        f = getattr(torch._C._functorch, "is_functorch_wrapped_tensor", None)
        if f is not None and f(flat):
            return None

        def take_into(table: Array, idx: Array, out: Array) -> None:
            # 2-d contiguous rows: torch's index_select is orders of magnitude slower on 3-d tables
            torch.index_select(table, 0, idx, out=out)

        kw = {"dtype": tables.dtype, "device": tables.device}
        return (torch.empty, take_into, torch.mul, torch.sub, torch.add, kw, torch.Tensor.contiguous)
    return None


_SPLIT: dict[int, tuple] = {}


def _split_tables(tables: Array, levels: int, ops: tuple) -> list:
    """Contiguous ``(4096, n)`` cos and sin tables per level (cached per ``tables`` object):
    gathers and products on contiguous rows run 5x faster than on the interleaved view."""
    hit = _SPLIT.get(id(tables))
    if hit is None or hit[0] is not tables:
        copy = ops[6]
        hit = (tables, [(copy(tables[lv, :, 0, :]), copy(tables[lv, :, 1, :])) for lv in range(LEVELS)])
        if len(_SPLIT) >= 64:
            _SPLIT.clear()
        _SPLIT[id(tables)] = hit
    return hit[1][:levels]


def _exact_int_blocked(a: Array, tables: Array, levels: int, n: int, ops: tuple) -> tuple[Array, Array]:
    """cos and sin, each ``(P, n)``, of non-negative integer positions ``a`` (1-D)."""
    empty, take_into, mul, sub, add, kw, _ = ops
    p = a.shape[0]
    c_out, s_out = empty((p, n), **kw), empty((p, n), **kw)
    if p == 0:
        return c_out, s_out
    split = _split_tables(tables, levels, ops)
    step = max(1, min(p, _BLOCK_BYTES // (2 * n * tables.itemsize)))
    bufs = [empty((step, n), **kw) for _ in range(7)]
    mask = _RADIX - 1
    for i in range(0, p, step):
        j = min(i + step, p)
        m = j - i
        rest = a[i:j]
        ac, as_, bc, bs, nc, ns, t = (bb[:m] for bb in bufs)
        if levels == 1:
            idx = rest & mask
            take_into(split[0][0], idx, c_out[i:j])
            take_into(split[0][1], idx, s_out[i:j])
            continue
        idx = rest & mask
        take_into(split[0][0], idx, ac)
        take_into(split[0][1], idx, as_)
        for level in range(1, levels):
            rest = rest >> DIGIT_BITS
            idx = rest & mask
            take_into(split[level][0], idx, bc)
            take_into(split[level][1], idx, bs)
            last = level == levels - 1
            dc, ds = (c_out[i:j], s_out[i:j]) if last else (nc, ns)
            mul(ac, bc, out=dc)
            mul(as_, bs, out=t)
            sub(dc, t, out=dc)  # c * tc - s * ts
            mul(as_, bc, out=ds)
            mul(ac, bs, out=t)
            add(ds, t, out=ds)  # s * tc + c * ts
            if not last:
                ac, as_, nc, ns = dc, ds, ac, as_
    return c_out, s_out


def exact_cos_sin_positions(
    pos: Array, tables: Array, w: Array, *, xp: Namespace, dtype: Any
) -> tuple[Array, Array]:
    """:func:`exact_cos_sin` for any positions: floating positions wider than ``dtype``
    (float64 positions, float32 compute) are split into integer and fractional parts
    *before* rounding, so e.g. ``2**23 + 0.5`` keeps its fraction."""
    if (
        is_real_floating(xp, pos.dtype)
        and hasattr(xp, "float64")
        and pos.dtype == xp.float64
        and dtype != xp.float64
    ):
        whole = xp.floor(pos)
        frac = xp.astype(pos - whole, dtype)
        c, s = exact_cos_sin(xp.astype(whole, xp.int64), tables, w, xp=xp, dtype=dtype)
        ang = frac[..., None] * w
        fc, fs = xp.cos(ang), xp.sin(ang)
        return c * fc - s * fs, s * fc + c * fs
    return exact_cos_sin(pos, tables, w, xp=xp, dtype=dtype)


def float32_recipe(pos: Array, inv32: Array, *, xp: Namespace) -> tuple[Array, Array]:
    """The common float32 recipe: ``angle = float32(pos) * inv32`` and cos/sin in float32.

    With ``inv32 = float32_inv_freq(...)`` this is Hugging Face's computation
    operation for operation, so on torch it matches HF bit-for-bit.
    """
    ang = xp.astype(pos, xp.float32)[..., None] * inv32
    return xp.cos(ang), xp.sin(ang)


def float32_inv_freq(dim: int, base: float, *, xp: Namespace, device: Any = None) -> Array:
    """HF's float32 inverse frequencies, computed with ``xp`` exactly as HF does on torch."""
    # HF: torch.arange(0, dim, 2, dtype=torch.int64).float(); small integers, so the default
    # integer dtype gives the same float32 values (and JAX without x64 has no int64).
    exps = xp.astype(xp.arange(0, dim, 2, device=device), xp.float32) / dim
    return 1.0 / (float(base) ** exps)


def max_abs_error_float32_recipe(positions: np.ndarray, dim: int = 128, base: float = 1e4) -> float:
    """Max |cos error| of the float32 recipe at ``positions`` (for docs and tests)."""
    w32 = 1.0 / (np.float32(base) ** (np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim)))
    ang32 = positions.astype(np.float32)[:, None] * w32.astype(np.float32)
    truth = np.cos(positions.astype(np.float64)[:, None] * inv_freq(dim, base)[None, :])
    return float(np.max(np.abs(np.cos(ang32).astype(np.float64) - truth)))
