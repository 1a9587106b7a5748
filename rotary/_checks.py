"""Argument validation: every error names the argument and what was expected."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ._compat import Array, Namespace, backend_name, device, is_array_api_obj, is_concrete, is_real_floating

LAYOUTS = ("half", "interleaved")

#: Integer positions with ``|pos| < MAX_EXACT_POSITION`` get angles within 1e-6 of the truth.
MAX_EXACT_POSITION = 2**36


def check_layout(layout: Any, name: str = "layout") -> str:
    if layout not in LAYOUTS:
        raise ValueError(f"{name} must be one of {LAYOUTS!r}, got {layout!r}")
    return layout


def check_base(base: Any) -> float:
    try:
        b = float(base)
    except (TypeError, ValueError):
        raise TypeError(f"base must be a positive real number, got {base!r}") from None
    if not math.isfinite(b) or b <= 1.0:
        raise ValueError(f"base must be a finite number > 1, got {base!r}")
    return b


def check_head_dim(head_dim: Any, name: str = "head_dim") -> int:
    if isinstance(head_dim, bool) or not isinstance(head_dim, (int, np.integer)):
        raise TypeError(f"{name} must be a positive even integer, got {head_dim!r}")
    if head_dim <= 0 or head_dim % 2:
        raise ValueError(f"{name} must be a positive even integer, got {head_dim}")
    return int(head_dim)


def check_rotary_dim(rotary_dim: Any, head_dim: int | None) -> int | None:
    """Validate ``rotary_dim`` against ``head_dim`` (``None`` means the whole head)."""
    if rotary_dim is None:
        return head_dim
    if isinstance(rotary_dim, bool) or not isinstance(rotary_dim, (int, np.integer)):
        raise TypeError(f"rotary_dim must be a positive even integer or None, got {rotary_dim!r}")
    if rotary_dim <= 0 or rotary_dim % 2:
        raise ValueError(f"rotary_dim must be a positive even integer, got {rotary_dim}")
    if head_dim is not None and rotary_dim > head_dim:
        raise ValueError(f"rotary_dim={rotary_dim} is larger than the head dimension {head_dim}")
    return int(rotary_dim)


def check_floating(x: Array, xp: Namespace, name: str) -> None:
    if not is_real_floating(xp, x.dtype):
        raise TypeError(
            f"{name} must be a real floating array (float16, bfloat16, float32 or float64), "
            f"got dtype {x.dtype}"
        )


def check_head_array(x: Any, xp: Namespace, name: str, head_dim: int) -> None:
    """``x`` is a real floating array whose last axis is ``head_dim``."""
    if not is_array_api_obj(x):
        raise TypeError(f"{name} must be an array, got {type(x).__name__}")
    check_floating(x, xp, name)
    if x.ndim < 1 or x.shape[-1] != head_dim:
        raise ValueError(f"{name}.shape[-1] must equal head_dim={head_dim}, got shape {tuple(x.shape)}")


def check_feature_dim(x: Array, name: str, rotary_dim: int | None) -> int:
    """Validate the last axis of ``x``; returns the effective rotary dimension."""
    if x.ndim < 1:
        raise ValueError(f"{name} must have at least one axis (..., head_dim), got a 0-d array")
    d = x.shape[-1]
    if d is None or (isinstance(d, float) and math.isnan(d)):
        raise ValueError(
            f"{name} has an unknown feature (last) axis length; rotary needs it known "
            "(for Dask, call .compute_chunk_sizes() or rechunk)"
        )
    if rotary_dim is None:
        if d % 2:
            raise ValueError(f"{name}.shape[-1] (the head dim) must be even, got {d}")
        return d
    if rotary_dim > d:
        raise ValueError(f"rotary_dim={rotary_dim} is larger than the head dimension {name}.shape[-1]={d}")
    return rotary_dim


def _known(n: Any) -> bool:
    return n is not None and not (isinstance(n, float) and math.isnan(n))


def check_broadcast(pos_shape: tuple, lead: tuple, pos_name: str, x_name: str) -> None:
    """``pos`` must broadcast *to* ``x.shape[:-1]`` (it may not add or grow axes)."""
    ok = len(pos_shape) <= len(lead)
    if ok:
        for p, t in zip(reversed(pos_shape), reversed(lead)):
            if _known(p) and _known(t) and p not in (1, t):
                ok = False
                break
    if not ok:
        raise ValueError(
            f"{pos_name} of shape {tuple(pos_shape)} does not broadcast to "
            f"{x_name}.shape[:-1] = {tuple(lead)}; positions are broadcast against every axis "
            f"but the last (e.g. (seq,) for (batch, heads, seq, dim), (seq, 1) for "
            f"(batch, seq, heads, dim))"
        )


def check_qk(q: Array, k: Array) -> None:
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"q and k must have the same head dim (last axis), got q.shape={tuple(q.shape)} "
            f"and k.shape={tuple(k.shape)}"
        )
    if q.ndim != k.ndim:
        raise ValueError(
            f"q and k must have the same number of axes, got q.shape={tuple(q.shape)} "
            f"and k.shape={tuple(k.shape)}"
        )
    for ax, (a, b) in enumerate(zip(q.shape[:-1], k.shape[:-1])):
        if not (_known(a) and _known(b)) or a == b:
            continue
        if a % b and b % a:
            raise ValueError(
                f"q and k have incompatible leading shapes: axis {ax} is {a} for q and {b} "
                f"for k (must be equal, or one a multiple of the other for grouped-query "
                f"heads); q.shape={tuple(q.shape)}, k.shape={tuple(k.shape)}"
            )


def check_same_device(xp: Namespace, arrays: Sequence[tuple[str, Array]]) -> None:
    if backend_name(xp) in {"jax", "dask"}:
        return  # JAX places constants itself; Dask is host-only.
    devs = [(n, device(a)) for n, a in arrays if is_array_api_obj(a)]
    first_name, first = devs[0]
    for n, d in devs[1:]:
        if d != first:
            raise ValueError(
                f"{n} is on device {d} but {first_name} is on device {first}; move them to one device first"
            )


def check_positions_values(pos: Array, xp: Namespace, name: str) -> None:
    """Eager checks on position values: finite and within the exact-angle range.

    Runs only where values are concrete and on the host (NumPy, array-api-strict,
    torch CPU eager, JAX CPU outside ``jit``); skipped for traced, lazy (Dask) and
    accelerator arrays, where it would break tracing or force a device sync.
    """
    if not is_concrete(pos, xp):
        return
    if is_real_floating(xp, pos.dtype):
        if not bool(xp.all(xp.isfinite(pos))):
            raise ValueError(f"{name} contains NaN or infinite positions")
        if pos.ndim and math.prod(pos.shape) == 0:
            return
        big = float(xp.max(xp.abs(pos)) if pos.ndim else xp.abs(pos))
        _check_bound(big, name)
        return
    positions_range(pos, xp, name)


def positions_range(pos: Array, xp: Namespace, name: str) -> tuple[int, int] | None:
    """``(min, max)`` of concrete integer positions, checked against the exact-angle range.

    ``None`` for an empty ``pos``.  The caller guarantees ``pos`` is concrete and integral.
    """
    n = math.prod(pos.shape)
    if n == 0:
        return None
    if n == 1:
        lo = hi = int(pos[(0,) * pos.ndim])
    else:
        lo, hi = int(xp.min(pos)), int(xp.max(pos))
    _check_bound(max(-lo, hi), name)
    return lo, hi


def _check_bound(big: float, name: str) -> None:
    if big >= MAX_EXACT_POSITION:
        raise ValueError(
            f"{name} contains |position| >= 2**36 ({float(big):.6g}); rotary's exact angle "
            "tables cover |position| < 2**36"
        )
