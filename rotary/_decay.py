"""The long-term decay bound of RoPE (RoFormer section 3.4.3)."""

from __future__ import annotations

from typing import Any

from ._backends import backend_for
from ._lib import _validation as v
from ._lib._compat import array_namespace, entry, is_array
from ._lib._typing import Array
from ._rope import RoPE

__all__ = ["decay_bound"]


@entry
def decay_bound(distance: Any, dim: int, base: float = 10000.0) -> Array:
    """The long-term decay curve ``(1/(d/2)) * sum_{j=1}^{d/2} |S_j|`` at relative distances.

    With ``S_j = sum_{i<j} exp(1j * distance * theta_i)`` and ``theta_i = base**(-2i/d)``, Abel
    summation bounds the RoPE attention score by ``max_i |h_{i+1} - h_i| * sum_j |S_j|``, so
    this curve (the per-pair average of ``|S_j|``) shows how scores can decay as the distance
    grows.  It starts at ``(d/2 + 1) / 2`` for distance 0.

    Parameters
    ----------
    distance : array or number or sequence
        Relative distances ``m - n``, any shape, integer or real floating, from any array-API
        library (``|distance| < 2**36``).
    dim : int
        The (even) number of rotated features ``d``.
    base : float
        RoPE base.

    Returns
    -------
    array
        Same shape, namespace and device as ``distance``; the dtype of a floating
        ``distance``, else the namespace's default floating dtype.  Computed in float32
        (float64 for float64 input) with rotary's exact angles.

    Examples
    --------
    >>> import numpy as np, rotary
    >>> rotary.decay_bound(np.arange(0, 257, 64), 128).round(3)
    array([32.5  , 10.09 ,  9.273,  7.329,  6.543])
    """
    xp = array_namespace(distance) if is_array(distance) else array_namespace()
    be = backend_for(xp)
    rope = RoPE(v.check_head_dim(dim, "dim"), base=v.check_base(base))
    dev = be.creation_device(distance) if is_array(distance) else None
    be.position_shape(distance, name="distance")
    r, _ = be.positions(distance, name="distance", device=dev)
    if v.is_floating(r.dtype):
        out_dtype = r.dtype
    else:
        out_dtype = xp.__array_namespace_info__().default_dtypes(device=dev)["real floating"]
    c, s = rope.cos_sin(r, xp=xp, device=dev, dtype=be.compute_dtype(out_dtype))
    re = xp.cumulative_sum(c, axis=-1)  # S_j for j = 1 .. d/2
    im = xp.cumulative_sum(s, axis=-1)
    out = xp.mean(xp.sqrt(re * re + im * im), axis=-1)
    return out if out.dtype == out_dtype else xp.astype(out, out_dtype)
