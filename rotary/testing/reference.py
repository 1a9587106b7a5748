"""An independent float64 reference: RoPE as the explicit block-diagonal rotation matrix.

Nothing here uses ``rotary``'s own angle or rotation code: the frequencies are
restated from the definition, the angles ``pos * theta_i`` are formed exactly
(Python ``decimal``, 50 significant digits, reduced with a 60-digit pi), so
cos/sin are correctly rounded to float64 on every platform, at any position,
and the rotation is a dense ``(d, d)`` matrix product in float64.

This is the oracle of :func:`rotary.testing.check_rope`, of the conformance suite
and of the golden vectors in ``conformance/vectors/``.
"""

from __future__ import annotations

import decimal
import functools
from collections.abc import Sequence

import numpy as np

__all__ = ["cos_sin", "pair_indices", "rotate", "rotate_pairs", "rotation_matrix", "theta"]

_PI = decimal.Decimal("3.141592653589793238462643383279502884197169399375105820974944592")
_CTX = decimal.Context(prec=50)
_LN_CTX = decimal.Context(prec=40)


def theta(dim: int, base: float = 10000.0) -> np.ndarray:
    """``theta_i = base**(-2i / dim)``, ``i = 0 .. dim/2 - 1``, each correctly rounded to float64.

    This is the float64 definition of the frequencies every implementation is compared
    with (the golden vectors store these exact values).  Computed with 40-digit decimal
    arithmetic, so it is the same on every platform (``1 / base**e`` in float64 is not:
    ``pow`` rounds differently between NumPy builds).

    Examples
    --------
    >>> from rotary.testing import reference
    >>> reference.theta(8, 10000.0)
    array([1.   , 0.1  , 0.01 , 0.001])
    """
    ln_base = _LN_CTX.ln(decimal.Decimal(float(base)))
    out = [
        float(_LN_CTX.exp(-_LN_CTX.divide(decimal.Decimal(2 * i), decimal.Decimal(dim)) * ln_base))
        for i in range(dim // 2)
    ]
    return np.asarray(out, dtype=np.float64)


@functools.lru_cache(maxsize=1 << 16)
def _cos_sin_exact(p: float, t: float) -> tuple[float, float]:
    """cos and sin of the exact real product ``p * t`` (both float64), correctly rounded."""
    with decimal.localcontext(_CTX):
        a = decimal.Decimal(p) * decimal.Decimal(t)
        two_pi = 2 * _PI
        a = a - two_pi * (a / two_pi).to_integral_value(rounding=decimal.ROUND_FLOOR)
        if a > _PI:
            a -= two_pi
        # Taylor series on |a| <= pi; 50 digits need < 45 terms.
        a2, k = a * a, 0
        c = term = decimal.Decimal(1)
        s = sterm = a
        while True:
            k += 2
            term = -term * a2 / (k * (k - 1))
            sterm = -sterm * a2 / (k * (k + 1))
            if abs(term) < decimal.Decimal("1e-45") and abs(sterm) < decimal.Decimal("1e-45"):
                break
            c += term
            s += sterm
        return float(c), float(s)


#: Platforms whose ``longdouble`` has a 64-bit mantissa (x86): reduced angles are evaluated there.
_WIDE = np.finfo(np.longdouble).nmant >= 63


@functools.lru_cache(maxsize=1 << 18)
def _reduced(p: float, t: float) -> tuple[float, float, int]:
    """``p * t`` (exact real product) as ``q * pi/2 + r`` with ``|r| <= pi/4``: ``(hi, lo, q % 4)``
    with ``r = hi + lo`` (floats)."""
    with decimal.localcontext(_CTX):
        a = decimal.Decimal(p) * decimal.Decimal(t)
        half_pi = _PI / 2
        q = (a / half_pi + decimal.Decimal("0.5")).to_integral_value(rounding=decimal.ROUND_FLOOR)
        r = a - q * half_pi
        hi = float(r)
        return hi, float(r - decimal.Decimal(hi)), int(q) % 4


def cos_sin(pos: Sequence[float] | np.ndarray, th: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of ``pos[..., None] * th``, each correctly rounded to float64.

    ``pos`` (any shape, integer or float64 values) and ``th`` are taken as exact float64
    numbers; the product and its reduction to a quadrant (``|r| <= pi/4``) are exact to 50
    digits, and ``cos r``, ``sin r`` are evaluated in 80-bit ``longdouble`` (with a 50-digit
    Taylor series where the platform has no wider float).
    """
    p = np.asarray(pos, dtype=np.float64)
    th = np.asarray(th, dtype=np.float64)
    uniq, inv = np.unique(p.reshape(-1), return_inverse=True)
    grid = [(pv, t) for pv in uniq.tolist() for t in th.tolist()]
    if _WIDE:
        hi, lo, quad = np.array([_reduced(pv, t) for pv, t in grid]).reshape(-1, 3).T
        r = hi.astype(np.longdouble) + lo.astype(np.longdouble)
        cr, sr = np.cos(r), np.sin(r)
        quad = quad.astype(np.int64)
        c = np.choose(quad, [cr, -sr, -cr, sr]).astype(np.float64)
        s = np.choose(quad, [sr, cr, -sr, -cr]).astype(np.float64)
    else:
        c, s = np.array([_cos_sin_exact(pv, t) for pv, t in grid], dtype=np.float64).reshape(-1, 2).T
    shape = (*p.shape, th.shape[0])
    idx = inv.reshape(-1)
    table = (uniq.size, th.shape[0])
    return c.reshape(table)[idx].reshape(shape), s.reshape(table)[idx].reshape(shape)


def pair_indices(rotary_dim: int, layout: str) -> list[tuple[int, int]]:
    """Feature pairs ``(a, b)`` rotated together: ``(i, i + r/2)`` (half) or ``(2i, 2i + 1)``."""
    h = rotary_dim // 2
    if layout == "half":
        return [(i, i + h) for i in range(h)]
    if layout == "interleaved":
        return [(2 * i, 2 * i + 1) for i in range(h)]
    raise ValueError(f"layout must be 'half' or 'interleaved', got {layout!r}")


def rotation_matrix(
    pos: float,
    head_dim: int,
    *,
    layout: str = "half",
    base: float = 10000.0,
    rotary_dim: int | None = None,
    th: np.ndarray | None = None,
    scale: float = 1.0,
) -> np.ndarray:
    """The ``(head_dim, head_dim)`` block-diagonal rotation ``R_pos`` in float64.

    Pair ``i`` (see :func:`pair_indices`) is rotated by ``pos * th[i]``; features past
    ``rotary_dim`` pass through.  ``th`` defaults to :func:`theta` ``(rotary_dim, base)``;
    ``scale`` (an attention factor) multiplies the rotated block.

    Examples
    --------
    >>> from rotary.testing import reference
    >>> reference.rotation_matrix(1.0, 2).round(4)
    array([[ 0.5403, -0.8415],
           [ 0.8415,  0.5403]])
    """
    r = head_dim if rotary_dim is None else rotary_dim
    th = theta(r, base) if th is None else np.asarray(th, dtype=np.float64)
    c, s = cos_sin(np.asarray([pos], dtype=np.float64), th)
    R = np.eye(head_dim)
    for i, (a, b) in enumerate(pair_indices(r, layout)):
        ci, si = scale * c[0, i], scale * s[0, i]
        R[a, a], R[a, b], R[b, a], R[b, b] = ci, -si, si, ci
    return R


def rotate(
    x: np.ndarray,
    pos: np.ndarray | Sequence[float] | float,
    *,
    layout: str = "half",
    base: float = 10000.0,
    rotary_dim: int | None = None,
    th: np.ndarray | None = None,
    scale: float = 1.0,
) -> np.ndarray:
    """Matrix-form RoPE in float64: ``out[..., :] = R_{pos[...]} @ x[..., :]``.

    ``x`` has shape ``(..., d)`` (any real values, taken as float64); ``pos`` broadcasts
    against ``x.shape[:-1]``.

    Examples
    --------
    >>> import numpy as np
    >>> from rotary.testing import reference
    >>> reference.rotate(np.array([[1.0, 0.0]]), [np.pi / 2 / 1.0]).round(6)
    array([[0., 1.]])
    """
    x = np.asarray(x, dtype=np.float64)
    d = x.shape[-1]
    p = np.broadcast_to(np.asarray(pos, dtype=np.float64), x.shape[:-1])
    uniq, inv = np.unique(p.reshape(-1), return_inverse=True)
    mats = np.empty((uniq.size, d, d))
    for i, u in enumerate(uniq.tolist()):
        mats[i] = rotation_matrix(u, d, layout=layout, base=base, rotary_dim=rotary_dim, th=th, scale=scale)
    flat = x.reshape(-1, d)
    out = np.einsum("nij,nj->ni", mats[inv.reshape(-1)], flat)
    return out.reshape(x.shape)


def rotate_pairs(
    x: np.ndarray, pos: np.ndarray | Sequence[float], th: np.ndarray, *, layout: str = "half"
) -> np.ndarray:
    """Rotate pair ``i`` of ``x`` by ``pos[..., i] * th[i]``, in float64 with correctly rounded
    cos/sin: every pair may have its own position (multi-axis RoPE).

    ``pos`` broadcasts against ``x.shape[:-1] + (len(th),)``; the pairs are those of a
    ``rotary_dim = 2 * len(th)`` rotation in ``layout``, later features pass through.

    Examples
    --------
    >>> import numpy as np
    >>> from rotary.testing import reference
    >>> x = np.array([[1.0, 0.0, 1.0, 0.0]])
    >>> reference.rotate_pairs(x, [[np.pi / 2, 0.0]], np.array([1.0, 1.0]), layout="interleaved").round(6)
    array([[0., 1., 1., 0.]])
    """
    x = np.asarray(x, dtype=np.float64)
    th = np.asarray(th, dtype=np.float64)
    n = th.shape[0]
    p = np.broadcast_to(np.asarray(pos, dtype=np.float64), (*x.shape[:-1], n))
    out = x.copy()
    for i, (a, b) in enumerate(pair_indices(2 * n, layout)):
        c, s = cos_sin(p[..., i], th[i : i + 1])
        c, s = c[..., 0], s[..., 0]
        out[..., a] = x[..., a] * c - x[..., b] * s
        out[..., b] = x[..., b] * c + x[..., a] * s
    return out
