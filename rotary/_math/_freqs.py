"""The RoPE frequencies ``theta_i = base**(-2i/d)``.

Two recipes, each written once:

* :func:`inv_freq`: host float64, *correctly rounded* (Python ``decimal``, 40 digits), so
  every platform gets the same bits whatever its ``pow`` does (``1 / base**e`` in float64
  differs by an ulp between NumPy builds, i.e. by ``6e-8`` in the angle at position ``2**31``);
* :func:`float32_inv_freq`: Hugging Face's float32 recipe
  ``1 / base**(arange(0, d, 2) / d)``, operation for operation, on any namespace (bit-for-bit
  Hugging Face on torch).
"""

from __future__ import annotations

import decimal

import numpy as np

from .._lib._typing import Array, Device, Namespace
from .._lib._validation import check_base, check_head_dim

__all__ = ["float32_exponents", "float32_inv_freq", "inv_freq"]

_CTX = decimal.Context(prec=40)


def inv_freq(dim: int, base: float = 10000.0) -> np.ndarray:
    """Inverse frequencies ``theta_i = base**(-2i/dim)`` for ``i`` in ``0, ..., dim/2 - 1``, float64.

    Each value is ``base**(-2i/dim)`` correctly rounded to float64 (computed with 40-digit
    decimal arithmetic), identical on every platform.

    Parameters
    ----------
    dim : int
        Number of rotated features (positive, even).
    base : float
        The RoPE base (``rope_theta``), > 1.

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
    dim = check_head_dim(dim, "dim")
    base = check_base(base)
    log_base = _CTX.ln(decimal.Decimal(base))
    d = decimal.Decimal(dim)
    out = [
        float(_CTX.exp(_CTX.multiply(_CTX.divide(decimal.Decimal(-2 * i), d), log_base)))
        for i in range(dim // 2)
    ]
    return np.asarray(out, dtype=np.float64)


def float32_exponents(dim: int, *, xp: Namespace, device: Device = None) -> Array:
    """Hugging Face's float32 exponents ``torch.arange(0, dim, 2, dtype=torch.int64).float() / dim``.

    The ``arange`` values are small, so the default integer dtype gives the same float32 values
    (and JAX without x64 has no int64).
    """
    return xp.astype(xp.arange(0, dim, 2, device=device), xp.float32) / dim


def float32_inv_freq(dim: int, base: float, *, xp: Namespace, device: Device = None) -> Array:
    """Hugging Face's float32 inverse frequencies ``1.0 / base**exponents``, computed with ``xp``."""
    return 1.0 / (float(base) ** float32_exponents(dim, xp=xp, device=device))
