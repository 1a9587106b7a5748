"""Float64 references built from the explicit block-diagonal rotation matrix."""

from __future__ import annotations

import numpy as np


def inv_freq64(dim: int, base: float = 10000.0) -> np.ndarray:
    return 1.0 / base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)


def pair_indices(rotary_dim: int, layout: str) -> list[tuple[int, int]]:
    h = rotary_dim // 2
    if layout == "half":
        return [(i, i + h) for i in range(h)]
    return [(2 * i, 2 * i + 1) for i in range(h)]


def rotation_matrix(
    pos: float, head_dim: int, *, layout="half", base=10000.0, rotary_dim=None, inv=None
) -> np.ndarray:
    """The (head_dim x head_dim) block-diagonal rotation R_pos (identity on pass-through)."""
    r = head_dim if rotary_dim is None else rotary_dim
    w = inv_freq64(r, base) if inv is None else np.asarray(inv, dtype=np.float64)
    R = np.eye(head_dim)
    for i, (a, b) in enumerate(pair_indices(r, layout)):
        # Angle and cos/sin in extended precision, so the reference is better than float64.
        t = np.longdouble(pos) * np.longdouble(w[i])
        c, s = float(np.cos(t)), float(np.sin(t))
        R[a, a], R[a, b], R[b, a], R[b, b] = c, -s, s, c
    return R


def rotate_ref(
    x: np.ndarray,
    pos: np.ndarray,
    *,
    layout="half",
    base=10000.0,
    rotary_dim=None,
    inv=None,
    scale: float = 1.0,
) -> np.ndarray:
    """Matrix-form RoPE in float64: pos broadcasts against x.shape[:-1]."""
    x = np.asarray(x, dtype=np.float64)
    d = x.shape[-1]
    pos = np.broadcast_to(np.asarray(pos, dtype=np.float64), x.shape[:-1])
    out = np.empty_like(x)
    for idx in np.ndindex(*x.shape[:-1]):
        out[idx] = scale * (
            rotation_matrix(pos[idx], d, layout=layout, base=base, rotary_dim=rotary_dim, inv=inv) @ x[idx]
        )
    if rotary_dim is not None and scale != 1.0:
        out[..., rotary_dim:] = x[..., rotary_dim:]
    return out
