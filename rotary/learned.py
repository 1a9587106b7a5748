"""RoPE with frequencies you train: the frequencies are an array of your library.

Gradients flow through the frequencies (and the data) by your library's own autodiff: torch
autograd and ``torch.func``, ``jax.grad``.  The frequencies have shape

- ``(r/2,)``: one 1-D RoPE, angle ``theta_i = p * f_i`` (lucidrains ``learned_freq=True``);
- ``(..., A, r/2)``: ``A`` position coordinates per token (``pos`` of shape ``(..., A)``), angle
  ``theta_i = sum_a p_a * f[a, i]``; leading axes broadcast against the data's, so
  ``(heads, 1, 2, r/2)`` gives every head its own mixed 2-D frequencies (RoPE-Mixed, Heo et al.
  2024), and a block-diagonal ``f`` is axial RoPE.

The angles are formed in the compute dtype (float32, float64 for float64 data): with trained
frequencies there are no exact tables, so the angle error grows with the position as in the
float32 recipe (see :doc:`/guides/numerics`); keep positions moderate (vision grids, training
lengths) or train in float64.  :func:`frequencies` gives the initial values of any
:class:`rotary.RoPE` (its scaling included) as an array of your library.

Examples
--------
>>> import numpy as np, rotary
>>> f = rotary.learned.frequencies(rotary.RoPE(8), xp=np)        # the default RoPE's, float64
>>> x = np.ones((3, 8))
>>> bool(np.allclose(rotary.learned.rotate(x, np.arange(3), f), rotary.rotate(x, np.arange(3))))
True
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ._backends import backend_for
from ._lib import _validation as v
from ._lib._compat import array_namespace, as_namespace, entry, is_array, library_name, namespace_of
from ._lib._typing import Array, Device, DType, Layout, Namespace
from ._math._rotation import expand_pairs
from ._rope import RoPE, eager_positions

__all__ = ["Settings", "apply", "cos_sin", "frequencies", "rotate", "xpos_scale"]


@entry
def frequencies(
    rope: RoPE,
    *,
    xp: Namespace,
    dtype: DType = None,
    device: Device = None,
    n_axes: int = 1,
    heads: int | None = None,
) -> Array:
    """The frequencies of ``rope`` (scaling included) as the initial value of trained ones.

    ``n_axes=1, heads=None``: shape ``(r/2,)``.  Otherwise ``(A, r/2)``, or ``(heads, 1, A, r/2)``
    with ``heads`` (one set per head, broadcasting against ``(batch, heads, seq, dim)`` data):
    every axis starts from the same frequencies (RoPE-Mixed's initialisation spreads them over
    directions; pass your own array for that).  ``dtype`` defaults to float32.

    Examples
    --------
    >>> import numpy as np, rotary
    >>> rotary.learned.frequencies(rotary.RoPE(8), xp=np, n_axes=2, heads=3).shape
    (3, 1, 2, 4)
    """
    if not isinstance(rope, RoPE):
        raise v.wrong_type("rope", rope, "a rotary.RoPE", RoPE)
    xp = as_namespace(xp)
    n_axes = v.check_int(n_axes, "n_axes", minimum=1)
    f = rope.inv_freq(xp=xp, dtype=xp.float32 if dtype is None else dtype, device=device)
    if n_axes == 1 and heads is None:
        return f
    f = xp.broadcast_to(f, (n_axes, f.shape[0]))
    if heads is not None:
        heads = v.check_int(heads, "heads", minimum=1)
        f = xp.broadcast_to(f[None, None], (heads, 1, n_axes, f.shape[-1]))
    return xp.asarray(f, copy=True)


def _check_freqs(freqs: Any, xp: Namespace) -> None:
    if not is_array(freqs) or library_name(array_namespace(freqs)) != library_name(xp):
        raise TypeError(
            f"freqs must be an array of the data's library (trained frequencies), got {type(freqs).__name__}"
        )
    if not v.is_floating(freqs.dtype):
        raise TypeError(f"freqs must be floating, got {v.dtype_name(freqs.dtype)}")
    if freqs.ndim < 1:
        raise ValueError(
            "freqs must have shape (rotary_dim/2,) or (..., n_axes, rotary_dim/2), got a 0-d array"
        )


@entry
def cos_sin(pos: Any, freqs: Array, *, dtype: DType = None) -> tuple[Array, Array]:
    """cos and sin of the angles ``pos * freqs`` (or ``sum_a pos[..., a] * freqs[..., a, :]``),
    in ``dtype`` (default: the frequencies' dtype, at least float32), differentiable in ``freqs``.

    Examples
    --------
    >>> import numpy as np, rotary
    >>> c, s = rotary.learned.cos_sin(np.arange(3), np.array([1.0, 0.5]))
    >>> c.shape, float(s[1, 0])
    ((3, 2), 0.8414709848078965)
    """
    xp = array_namespace(freqs)
    _check_freqs(freqs, xp)
    be = backend_for(xp)
    p = eager_positions(be, pos, "pos", freqs, "freqs")
    dt = be.compute_dtype(freqs.dtype) if dtype is None else dtype
    return _cos_sin(xp, p, freqs, dt)


def _cos_sin(xp: Namespace, p: Array, freqs: Array, dt: DType) -> tuple[Array, Array]:
    f = freqs if freqs.dtype == dt else xp.astype(freqs, dt)
    pf = xp.astype(p, dt)
    if f.ndim == 1:
        ang = pf[..., None] * f
    else:
        a = f.shape[-2]
        if pf.ndim < 1 or pf.shape[-1] != a:
            raise ValueError(
                f"freqs of shape {tuple(f.shape)} take {a} coordinates per position: pos must have "
                f"shape (..., {a}), got {tuple(pf.shape)}"
            )
        ang = pf[..., 0, None] * f[..., 0, :]
        for i in range(1, a):
            ang = ang + pf[..., i, None] * f[..., i, :]
    return xp.cos(ang), xp.sin(ang)


def _rotate(
    x: Array, p: Array, freqs: Array, layout: Layout, rotary_dim: Any, xp: Namespace, scale: Any
) -> Array:
    rot = 2 * freqs.shape[-1]
    d = x.shape[-1]
    r = d if rotary_dim is None else v.check_rotary_dim(rotary_dim, d)
    if rot != r:
        raise ValueError(f"freqs has {freqs.shape[-1]} frequencies but {r} features rotate ({r // 2} pairs)")
    be = backend_for(xp)
    cdt = be.compute_dtype(x.dtype)
    c, s = _cos_sin(xp, p, freqs, cdt)
    lead = tuple(x.shape[:-1])
    v.check_broadcast(tuple(c.shape[:-1]), lead, "the angles (pos with freqs)", "x")
    out = be.rotate(x, c, s, layout=layout, rotary_dim=r)  # (composite arrays served part by part)
    if scale is not None:
        out = out * (scale if scale.dtype == out.dtype else xp.astype(scale, out.dtype))
    return out


@entry
def rotate(
    x: Array, pos: Any, freqs: Array, *, layout: Layout = "half", rotary_dim: int | None = None
) -> Array:
    """Rotate ``x`` ``(..., head_dim)`` at positions ``pos`` by trained frequencies ``freqs``.

    ``freqs``: ``(r/2,)`` with positions broadcasting against ``x.shape[:-1]``, or
    ``(..., A, r/2)`` with positions ``(..., A)``.  Differentiable in ``x`` and ``freqs``.

    Examples
    --------
    >>> import numpy as np, rotary
    >>> f = np.array([1.0, 0.1])
    >>> rotary.learned.rotate(np.ones((2, 4)), [0, 1], f).round(3)
    array([[ 1.   ,  1.   ,  1.   ,  1.   ],
           [-0.301,  0.895,  1.382,  1.095]])
    """
    xp = namespace_of(x, names=("x",))
    v.check_array(x, "x")
    _check_freqs(freqs, xp)
    layout = v.check_layout_name(layout)
    p = eager_positions(backend_for(xp), pos, "pos", x, "x")
    return _rotate(x, p, freqs, layout, rotary_dim, xp, None)


@entry
def xpos_scale(
    pos: Any,
    *,
    head_dim: int,
    scale_base: float = 512.0,
    xp: Namespace,
    dtype: DType = None,
    device: Device = None,
) -> Array:
    """xPos's per-pair scale ``zeta_i ** (p / scale_base)`` with ``zeta_i = (2i + 0.4 d) / (1.4 d)``
    (Sun et al. 2022), shape ``pos.shape + (head_dim/2,)``: queries are multiplied by it and keys
    divided, so ``q_m . k_n`` depends on ``m - n`` only.

    Examples
    --------
    >>> import numpy as np, rotary
    >>> rotary.learned.xpos_scale([0, 512], head_dim=4, xp=np, dtype=np.float64).round(4)
    array([[1.    , 1.    ],
           [0.2857, 0.6429]])
    """
    xp = as_namespace(xp)
    d = v.check_head_dim(head_dim)
    sb = v.check_float(scale_base, "scale_base", above=0.0)
    dt = xp.float32 if dtype is None else dtype
    own = is_array(pos) and library_name(array_namespace(pos)) == library_name(xp)
    if device is None and own:
        device = backend_for(xp).creation_device(pos)
    p = pos if own else xp.asarray(pos, device=device)
    zeta = (xp.arange(0, d, 2, dtype=dt, device=device) + 0.4 * d) / (1.4 * d)
    return zeta ** (xp.astype(p, dt)[..., None] / sb)


@entry
def apply(
    q: Array,
    k: Array,
    pos: Any,
    freqs: Array,
    *,
    layout: Layout = "half",
    rotary_dim: int | None = None,
    k_pos: Any = None,
    xpos_scale_base: float | None = None,
) -> tuple[Array, Array]:
    """Rotate queries and keys by trained frequencies (see :func:`rotate`); ``k_pos`` defaults to
    ``pos``.  ``xpos_scale_base``: xPos as well, queries scaled by :func:`xpos_scale` and keys by
    its inverse (1-D positions; the scale of a pair covers both of its features).

    Examples
    --------
    >>> import numpy as np, rotary
    >>> rng = np.random.default_rng(0)
    >>> q, k = rng.normal(size=(2, 5, 8)), rng.normal(size=(2, 5, 8))
    >>> f = rotary.learned.frequencies(rotary.RoPE(8), xp=np)
    >>> qr, kr = rotary.learned.apply(q, k, np.arange(5), f, xpos_scale_base=512.0)
    >>> qs, ks = rotary.learned.apply(q, k, np.arange(5) + 7, f, xpos_scale_base=512.0)
    >>> bool(np.allclose(qr @ kr.swapaxes(-1, -2), qs @ ks.swapaxes(-1, -2)))   # relative only
    True
    """
    xp = namespace_of(q, k, names=("q", "k"))
    v.check_qk(q, k, seq_axis=None if k_pos is None else q.ndim - 2)
    _check_freqs(freqs, xp)
    layout = v.check_layout_name(layout)
    be = backend_for(xp)
    p = eager_positions(be, pos, "pos", q, "q")
    kp = p if k_pos is None else eager_positions(be, k_pos, "k_pos", k, "k")
    qs = ks = None
    if xpos_scale_base is not None:
        if freqs.ndim != 1:
            raise ValueError("xpos_scale_base= needs 1-D positions (freqs of shape (rotary_dim/2,))")
        dt = be.compute_dtype(q.dtype)

        def per_feature(p: Array, sign: float) -> Array:
            z = xpos_scale(p, head_dim=2 * freqs.shape[-1], scale_base=xpos_scale_base, xp=xp, dtype=dt)
            z = expand_pairs(z if sign > 0 else 1.0 / z, layout, xp)
            rest = q.shape[-1] - z.shape[-1]  # the features past the pairs are not scaled
            one = xp.ones((*z.shape[:-1], rest), dtype=dt, device=be.creation_device(q))
            return z if not rest else xp.concat([z, one], axis=-1)

        qs, ks = per_feature(p, 1.0), per_feature(kp, -1.0)
    return (
        _rotate(q, p, freqs, layout, rotary_dim, xp, qs),
        _rotate(k, kp, freqs, layout, rotary_dim, xp, ks),
    )


@dataclasses.dataclass(frozen=True)
class Settings:
    """What a module of trained frequencies (:mod:`rotary.modules`) holds besides them: the pair
    layout, the head and rotated widths (``partial="proportional"`` pairs span the head) and
    xPos, taken from the :class:`rotary.RoPE` (or head dim) it starts from."""

    rope: RoPE
    xpos_scale_base: float | None = None

    @classmethod
    def of(cls, rope: RoPE | int, xpos_scale_base: float | None = None) -> Settings:
        if not isinstance(rope, RoPE):
            if type(rope).__name__ == "RoPE":
                raise v.wrong_type("rope", rope, "a rotary.RoPE or a head dimension", RoPE)
            rope = RoPE(v.check_head_dim(rope))
        return cls(rope, xpos_scale_base)

    @property
    def layout(self) -> Layout:
        return self.rope.layout

    @property
    def rotary_dim(self) -> int:
        return self.rope.config.width

    def apply(self, q: Array, k: Array, pos: Any, freqs: Array, k_pos: Any = None) -> tuple[Array, Array]:
        return apply(
            q,
            k,
            pos,
            freqs,
            layout=self.layout,
            rotary_dim=self.rotary_dim,
            k_pos=k_pos,
            xpos_scale_base=self.xpos_scale_base,
        )

    def rotate(self, x: Array, pos: Any, freqs: Array) -> Array:
        return rotate(x, pos, freqs, layout=self.layout, rotary_dim=self.rotary_dim)
