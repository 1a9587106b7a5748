"""Hurried hand-written causal RoPE linear attention: what a user writes without rotary, per library.

The hurried baselines of ``benchmarks.linear_attention`` (beside the careful ones of
:mod:`benchmarks.linear_careful`, which the targets are set against), and the second opinion of
its tests: RoFormer's
equation 19 with ``elu + 1`` features, RoPE in the half layout at positions ``0 .. N-1`` with
Hugging Face's float32 recipe (``cos``/``sin`` of ``pos * inv_freq`` over the whole sequence,
precomputed), features and rotations of the whole sequence computed up front, then

* ``causal``: a loop over chunks of 64 tokens carrying ``(S, z)`` (the masked quadratic form
  inside a chunk, ``tril`` as the mask), written into one output (torch, NumPy), or a
  ``lax.scan`` over the chunks under ``jax.jit``;
* ``noncausal``: two einsums (``S = b^T v``, ``z = sum e``) and a division;
* ``step``: one decoding step from ``(S, z)`` at a position ``p``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

CHUNK = 64


# -- torch --------------------------------------------------------------------------------------
def _torch_tables(n: int, d: int, start: int = 0) -> tuple[Any, Any]:
    import torch

    inv = 1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    ang = torch.arange(start, start + n, dtype=torch.float32)[:, None] * inv
    return ang.cos(), ang.sin()


def _torch_rot(x: Any, c: Any, s: Any) -> Any:
    import torch

    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


def torch_features(q: Any, k: Any) -> tuple[Any, Any, Any, Any]:
    import torch.nn.functional as F

    c, s = _torch_tables(q.shape[-2], q.shape[-1])
    fq, fk = F.elu(q) + 1, F.elu(k) + 1
    return _torch_rot(fq, c, s), _torch_rot(fk, c, s), fq, fk


def torch_causal(q: Any, k: Any, v: Any, chunk: int = CHUNK) -> Any:
    import torch

    a, b, fq, fk = torch_features(q, k)
    S = q.new_zeros(*q.shape[:-2], q.shape[-1], v.shape[-1])
    z = q.new_zeros(*q.shape[:-2], q.shape[-1], 1)
    out = torch.empty_like(v)
    for i in range(0, q.shape[-2], chunk):
        j = i + chunk
        ac, bc, qc, kc, vc = a[..., i:j, :], b[..., i:j, :], fq[..., i:j, :], fk[..., i:j, :], v[..., i:j, :]
        num = (ac @ bc.mT).tril_() @ vc + ac @ S
        den = (qc @ kc.mT).tril_().sum(-1, keepdim=True) + qc @ z
        out[..., i:j, :] = num / den
        S += bc.mT @ vc
        z += kc.sum(-2)[..., None]
    return out


def torch_noncausal(q: Any, k: Any, v: Any) -> Any:
    import torch

    a, b, fq, fk = torch_features(q, k)
    S = torch.einsum("...nf,...nd->...fd", b, v)
    z = fk.sum(-2)
    return torch.einsum("...nf,...fd->...nd", a, S) / torch.einsum("...nf,...f->...n", fq, z)[..., None]


def torch_step(q: Any, k: Any, v: Any, S: Any, z: Any, p: int) -> tuple[Any, Any, Any]:
    """One token ``(..., 1, d)`` at position ``p`` from ``(S, z)``: ``(out, S, z)``."""
    import torch
    import torch.nn.functional as F

    d = q.shape[-1]
    inv = 1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    ang = p * inv
    c, s = ang.cos(), ang.sin()
    fq, fk = F.elu(q) + 1, F.elu(k) + 1
    a, b = _torch_rot(fq, c, s), _torch_rot(fk, c, s)
    S = S + b.mT @ v
    z = z + fk[..., 0, :]
    return (a @ S) / (fq @ z[..., None]), S, z


# -- NumPy --------------------------------------------------------------------------------------
def _np_tables(n: int, d: int) -> tuple[np.ndarray, np.ndarray]:
    inv = 1.0 / (10000.0 ** (np.arange(0, d, 2, dtype=np.float32) / np.float32(d)))
    ang = np.arange(n, dtype=np.float32)[:, None] * inv.astype(np.float32)
    return np.cos(ang), np.sin(ang)


def _np_rot(x: np.ndarray, c: np.ndarray, s: np.ndarray) -> np.ndarray:
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)


def _np_elu1(x: np.ndarray) -> np.ndarray:
    return np.where(x > 0, x + 1, np.exp(np.minimum(x, 0)))


def numpy_features(q: np.ndarray, k: np.ndarray) -> tuple[np.ndarray, ...]:
    c, s = _np_tables(q.shape[-2], q.shape[-1])
    fq, fk = _np_elu1(q), _np_elu1(k)
    return _np_rot(fq, c, s), _np_rot(fk, c, s), fq, fk


def numpy_causal(q: np.ndarray, k: np.ndarray, v: np.ndarray, chunk: int = CHUNK) -> np.ndarray:
    a, b, fq, fk = numpy_features(q, k)
    S = np.zeros((*q.shape[:-2], q.shape[-1], v.shape[-1]), dtype=q.dtype)
    z = np.zeros((*q.shape[:-2], q.shape[-1], 1), dtype=q.dtype)
    out = np.empty_like(v)
    tri = np.tril(np.ones((chunk, chunk), dtype=q.dtype))
    for i in range(0, q.shape[-2], chunk):
        j = i + chunk
        ac, bc, qc, kc, vc = a[..., i:j, :], b[..., i:j, :], fq[..., i:j, :], fk[..., i:j, :], v[..., i:j, :]
        t = tri[: ac.shape[-2], : ac.shape[-2]]
        num = ((ac @ np.swapaxes(bc, -1, -2)) * t) @ vc + ac @ S
        den = ((qc @ np.swapaxes(kc, -1, -2)) * t).sum(-1, keepdims=True) + qc @ z
        out[..., i:j, :] = num / den
        S += np.swapaxes(bc, -1, -2) @ vc
        z += kc.sum(-2)[..., None]
    return out


def numpy_noncausal(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    a, b, fq, fk = numpy_features(q, k)
    S = np.einsum("...nf,...nd->...fd", b, v)
    z = fk.sum(-2)
    return np.einsum("...nf,...fd->...nd", a, S) / np.einsum("...nf,...f->...n", fq, z)[..., None]


def numpy_step(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, S: np.ndarray, z: np.ndarray, p: int
) -> tuple[np.ndarray, ...]:
    d = q.shape[-1]
    inv = (1.0 / (10000.0 ** (np.arange(0, d, 2, dtype=np.float32) / np.float32(d)))).astype(np.float32)
    ang = np.float32(p) * inv
    c, s = np.cos(ang), np.sin(ang)
    fq, fk = _np_elu1(q), _np_elu1(k)
    a, b = _np_rot(fq, c, s), _np_rot(fk, c, s)
    S = S + np.swapaxes(b, -1, -2) @ v
    z = z + fk[..., 0, :]
    return (a @ S) / (fq @ z[..., None]), S, z


# -- JAX (to be called under jax.jit) ---------------------------------------------------------
def jax_features(q: Any, k: Any) -> tuple[Any, ...]:
    import jax
    import jax.numpy as jnp

    n, d = q.shape[-2], q.shape[-1]
    inv = 1.0 / (10000.0 ** (jnp.arange(0, d, 2, dtype=jnp.float32) / d))
    ang = jnp.arange(n, dtype=jnp.float32)[:, None] * inv
    c, s = jnp.cos(ang), jnp.sin(ang)

    def rot(x: Any) -> Any:
        h = x.shape[-1] // 2
        x1, x2 = x[..., :h], x[..., h:]
        return jnp.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)

    fq, fk = jax.nn.elu(q) + 1, jax.nn.elu(k) + 1
    return rot(fq), rot(fk), fq, fk


def jax_causal(q: Any, k: Any, v: Any, chunk: int = CHUNK) -> Any:
    """``lax.scan`` over chunks (the length a multiple of ``chunk``)."""
    import jax
    import jax.numpy as jnp

    a, b, fq, fk = jax_features(q, k)
    n = q.shape[-2]
    m = n // chunk

    def split(x: Any) -> Any:
        return jnp.moveaxis(jnp.reshape(x, (*x.shape[:-2], m, chunk, x.shape[-1])), -3, 0)

    tri = jnp.tril(jnp.ones((chunk, chunk), dtype=q.dtype))
    S0 = jnp.zeros((*q.shape[:-2], q.shape[-1], v.shape[-1]), dtype=q.dtype)
    z0 = jnp.zeros((*q.shape[:-2], q.shape[-1]), dtype=q.dtype)

    def body(carry: Any, xs: Any) -> Any:
        S, z = carry
        ac, bc, qc, kc, vc = xs
        num = ((ac @ jnp.swapaxes(bc, -1, -2)) * tri) @ vc + ac @ S
        den = ((qc @ jnp.swapaxes(kc, -1, -2)) * tri).sum(-1) + (qc * z[..., None, :]).sum(-1)
        return (S + jnp.swapaxes(bc, -1, -2) @ vc, z + kc.sum(-2)), num / den[..., None]

    _, outs = jax.lax.scan(body, (S0, z0), tuple(split(x) for x in (a, b, fq, fk, v)))
    outs = jnp.moveaxis(outs, 0, -3)
    return jnp.reshape(outs, (*outs.shape[:-3], n, outs.shape[-1]))


def jax_noncausal(q: Any, k: Any, v: Any) -> Any:
    import jax.numpy as jnp

    a, b, fq, fk = jax_features(q, k)
    S = jnp.einsum("...nf,...nd->...fd", b, v)
    z = fk.sum(-2)
    return jnp.einsum("...nf,...fd->...nd", a, S) / jnp.einsum("...nf,...f->...n", fq, z)[..., None]


def jax_step(q: Any, k: Any, v: Any, S: Any, z: Any, p: Any) -> tuple[Any, ...]:
    import jax
    import jax.numpy as jnp

    d = q.shape[-1]
    inv = 1.0 / (10000.0 ** (jnp.arange(0, d, 2, dtype=jnp.float32) / d))
    ang = p.astype(jnp.float32) * inv
    c, s = jnp.cos(ang), jnp.sin(ang)

    def rot(x: Any) -> Any:
        h = x.shape[-1] // 2
        x1, x2 = x[..., :h], x[..., h:]
        return jnp.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)

    fq, fk = jax.nn.elu(q) + 1, jax.nn.elu(k) + 1
    a, b = rot(fq), rot(fk)
    S = S + jnp.swapaxes(b, -1, -2) @ v
    z = z + fk[..., 0, :]
    return (a @ S) / (fq @ z[..., None]), S, z
