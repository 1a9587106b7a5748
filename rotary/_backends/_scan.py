"""The loop-free exclusive prefix sum of causal linear attention (array API).

All chunks at once: the sequence is zero-padded to a multiple of the chunk size (padded
keys have zero features and zero values, so they add nothing; padded queries are cut off),
reshaped to ``(..., chunks, C, F)``, the chunk states summed cumulatively over the chunk
axis, and every chunk's outputs computed from its prefix in one batched call.  No Python
loop over the sequence: a traced graph (``torch.compile``, ``jax.jit``) is the same for
every length.  Extra working memory: the chunk states, ``N / C`` of ``F x d_v`` per head.
"""

from __future__ import annotations

from collections.abc import Callable

from .._lib._typing import Array, Device, DType, Namespace
from .._math import _linear

__all__ = ["batched_causal_scan"]


def _pad_seq(x: Array, pad: int, xp: Namespace) -> Array:
    # no shortcut for pad == 0: under a trace with dynamic shapes it would add a guard
    zeros = xp.zeros((*x.shape[:-2], pad, x.shape[-1]), dtype=x.dtype, device=_dev(x))
    return xp.concat([x, zeros], axis=-2)


def _zero_chunk(x: Array, axis: int, xp: Namespace) -> Array:
    shape = list(x.shape)
    shape[axis] = 1
    if any(d is None for d in shape):  # symbolic sizes: zeros shaped like one chunk of x
        index = tuple(slice(0, 1) if i == axis % x.ndim else slice(None) for i in range(x.ndim))
        return xp.zeros_like(x[index])
    return xp.zeros(tuple(shape), dtype=x.dtype, device=_dev(x))


def _dev(x: Array) -> Device:
    return getattr(x, "device", None)


def batched_causal_scan(
    chunks: _linear.Chunk,
    init: _linear.State | None,
    size: int,
    eps: float,
    device: Device,
    out_dtype: DType,
    xp: Namespace,
    cumsum: Callable[[Array, int], Array] | None = None,
) -> tuple[Array, _linear.State]:
    """``cumsum(x, axis)``: the library's own, where ``xp.cumulative_sum`` is a wrapper a
    tracer should not see (array-api-compat's torch one looks up the namespace, lru-cached)."""
    n = chunks.a.shape[-2]
    if n is None:  # a symbolic length (ndonnx): chunks of one token, by a new axis (no padding)
        size = 1
        ch = _linear.Chunk(*(xp.expand_dims(t, axis=-2) for t in chunks))
    else:
        m = (n + size - 1) // size  # (this form lets jax.export see m >= 1)
        pad = m * size - n
        parts = []
        for t in chunks:
            t = _pad_seq(t, pad, xp)
            parts.append(xp.reshape(t, (*t.shape[:-2], m, size, t.shape[-1])))
        ch = _linear.Chunk(*parts)
    st = _linear.chunk_state(ch, xp)  # (..., m, F, dv), (..., m, F)
    S_incl = xp.cumulative_sum(st.S, axis=-3) if cumsum is None else cumsum(st.S, -3)
    z_incl = xp.cumulative_sum(st.z, axis=-2) if cumsum is None else cumsum(st.z, -2)
    # exclusive: one zero chunk in front, the last dropped (shapes 1 + m - 1, symbolic-safe)
    prefix = _linear.State(
        xp.concat([_zero_chunk(S_incl, -3, xp), S_incl], axis=-3)[..., :-1, :, :],
        xp.concat([_zero_chunk(z_incl, -2, xp), z_incl], axis=-2)[..., :-1, :],
    )
    if init is not None:
        prefix = _linear.State(
            prefix.S + xp.expand_dims(init.S, axis=-3), prefix.z + xp.expand_dims(init.z, axis=-2)
        )
    out = _linear.chunk_output(ch, prefix, eps, xp, device, cumsum)  # (..., m, C, dv)
    if n is None:
        out = xp.squeeze(out, axis=-2)
    else:
        out = xp.reshape(out, (*out.shape[:-3], m * size, out.shape[-1]))[..., :n, :]
    if out.dtype != out_dtype:
        out = xp.astype(out, out_dtype)
    final = _linear.add(init, _linear.State(S_incl[..., -1, :, :], z_incl[..., -1, :]))
    return out, final
