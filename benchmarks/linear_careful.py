"""Careful hand-written causal RoPE linear attention: the best code a user writes, per library.

The baselines of ``benchmarks.linear_attention`` beside the hurried ones of
:mod:`benchmarks.linear_hand` (which build features and rotations for the whole sequence up
front and run the non-causal form as einsums).  The same attention (RoFormer's equation 19,
``elu + 1`` features, RoPE in the half layout with Hugging Face's float32 recipe at positions
``0 .. N-1``), written as a careful user writes it:

* ``causal``: cos/sin tables of the positions computed once, then a loop over chunks of 64
  tokens that computes ``elu + 1`` and RoPE of the chunk's queries and keys only, into buffers
  reused from chunk to chunk (in place); the numerator is the masked quadratic form of the
  chunk plus the carried state ``S``, the denominator ``phi(q_i) . (z + sum_{j <= i} phi(k_j))``
  from a running sum of the keys' features (``torch.cumsum``; in NumPy a product by the chunk's
  lower triangle of ones, 4x faster than its ``cumsum`` along a middle axis), never the masked
  product of query and key features; each output chunk written once; under ``jax.jit``, a
  ``lax.scan`` over the chunks with the same body;
* ``noncausal``: two passes over blocks of 2048 tokens (the keys' state ``S = b^T v``, ``z =
  sum phi(k)``, then the queries against it), never the features of the whole sequence;
* ``step``: one decoding step (one token at position ``p``) from a carried ``(S, z)``, the
  rotation's rows read from precomputed tables (:func:`torch_tables` ...); torch and NumPy
  update ``S`` and ``z`` in place (the caller's carried state), ``jax.jit`` returns them.

Tensors are ``(..., N, d)``; the leading axes are flattened into one batch axis (views).
"""

from __future__ import annotations

from typing import Any

import numpy as np

CHUNK = 64
BLOCK = 2048


# -- torch --------------------------------------------------------------------------------------
def torch_tables(n: int, d: int) -> tuple[Any, Any]:
    """cos and sin ``(n, d/2)`` of positions ``0 .. n-1`` (Hugging Face's float32 recipe)."""
    import torch

    inv = 1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    ang = torch.arange(n, dtype=torch.float32)[:, None] * inv
    return ang.cos(), ang.sin()


def _torch_flat(*xs: Any) -> list[Any]:
    return [x.reshape(-1, *x.shape[-2:]) for x in xs]


def _torch_rope(f: Any, c: Any, s: Any, out: Any) -> Any:
    """``f`` rotated (half layout) into ``out``: ``[f1 c - f2 s, f2 c + f1 s]``."""
    import torch

    h = f.shape[-1] // 2
    f1, f2, o1, o2 = f[..., :h], f[..., h:], out[..., :h], out[..., h:]
    torch.mul(f1, c, out=o1)
    o1.addcmul_(f2, s, value=-1.0)
    torch.mul(f2, c, out=o2)
    o2.addcmul_(f1, s)
    return out


def torch_causal(q: Any, k: Any, v: Any, chunk: int = CHUNK) -> Any:
    import torch
    import torch.nn.functional as F

    shape = v.shape
    n, d = q.shape[-2], q.shape[-1]
    q, k, v = _torch_flat(q, k, v)
    cos, sin = torch_tables(n, d)
    bh, dv = q.shape[0], v.shape[-1]
    S = q.new_zeros(bh, d, dv)
    z = q.new_zeros(bh, 1, d)
    out = torch.empty(bh, n, dv, dtype=v.dtype)
    a, b = q.new_empty(bh, chunk, d), q.new_empty(bh, chunk, d)
    zc = q.new_empty(bh, chunk, d)
    A = q.new_empty(bh, chunk, chunk)
    num = q.new_empty(bh, chunk, dv)
    den = q.new_empty(bh, chunk, 1)
    for i in range(0, n, chunk):
        j = min(i + chunk, n)
        t = j - i
        c, s = cos[i:j], sin[i:j]
        fq = F.elu(q[:, i:j]).add_(1)
        fk = F.elu(k[:, i:j]).add_(1)
        at, bt, vc = _torch_rope(fq, c, s, a[:, :t]), _torch_rope(fk, c, s, b[:, :t]), v[:, i:j]
        At = torch.bmm(at, bt.mT, out=A[:, :t, :t]).tril_()
        nt = torch.bmm(at, S, out=num[:, :t])
        nt.baddbmm_(At, vc)
        zt = torch.cumsum(fk, 1, out=zc[:, :t]).add_(z)
        dt = torch.sum(fq.mul_(zt), -1, keepdim=True, out=den[:, :t])
        torch.div(nt, dt, out=out[:, i:j])
        S.baddbmm_(bt.mT, vc)
        z.copy_(zt[:, -1:])
    return out.reshape(shape)


def torch_noncausal(q: Any, k: Any, v: Any, block: int = BLOCK) -> Any:
    import torch
    import torch.nn.functional as F

    shape = v.shape
    n, d = q.shape[-2], q.shape[-1]
    q, k, v = _torch_flat(q, k, v)
    cos, sin = torch_tables(n, d)
    bh, dv = q.shape[0], v.shape[-1]
    S = q.new_zeros(bh, d, dv)
    z = q.new_zeros(bh, d, 1)
    buf = q.new_empty(bh, block, d)
    for i in range(0, n, block):  # the keys' state
        j = min(i + block, n)
        fk = F.elu(k[:, i:j]).add_(1)
        b = _torch_rope(fk, cos[i:j], sin[i:j], buf[:, : j - i])
        S.baddbmm_(b.mT, v[:, i:j])
        z += fk.sum(1)[..., None]
    out = torch.empty(bh, n, dv, dtype=v.dtype)
    for i in range(0, n, block):  # the queries against it
        j = min(i + block, n)
        fq = F.elu(q[:, i:j]).add_(1)
        a = _torch_rope(fq, cos[i:j], sin[i:j], buf[:, : j - i])
        o = torch.bmm(a, S, out=out[:, i:j])
        o.div_(torch.bmm(fq, z))
    return out.reshape(shape)


def torch_step_tables(n: int, d: int) -> tuple[Any, Any]:
    """The decoding step's tables ``(n, d)``: ``[cos, cos]`` and ``[-sin, sin]`` per position
    (the half layout's rotation as ``x * C + roll(x, d/2) * S``)."""
    import torch

    c, s = torch_tables(n, d)
    return torch.cat([c, c], -1), torch.cat([-s, s], -1)


def _torch_step_features(q: Any, k: Any, C: Any, Sn: Any, p: int) -> tuple[Any, Any, Any, Any]:
    """``(rotated phi(q), rotated phi(k), phi(q), phi(k))`` of one token at position ``p``."""
    import torch
    import torch.nn.functional as F

    c, s = C[p], Sn[p]
    h = q.shape[-1] // 2
    fq = F.elu(q).add_(1)
    fk = F.elu(k).add_(1)
    a = torch.mul(fq, c).add_(fq.roll(h, -1).mul_(s))
    b = torch.mul(fk, c).add_(fk.roll(h, -1).mul_(s))
    return a, b, fq, fk


def torch_step(q: Any, k: Any, v: Any, S: Any, z: Any, C: Any, Sn: Any, p: int) -> Any:
    """One token ``(..., 1, d)`` at position ``p`` from ``(S, z)`` (updated in place), with the
    rows of :func:`torch_step_tables`; returns the output."""
    import torch

    a, b, fq, fk = _torch_step_features(q, k, C, Sn, p)
    S.addcmul_(b.mT, v)
    z.add_(fk[..., 0, :])
    return torch.matmul(a, S).div_(torch.matmul(fq, z[..., None]))


def torch_step_new(q: Any, k: Any, v: Any, S: Any, z: Any, C: Any, Sn: Any, p: int) -> tuple[Any, Any, Any]:
    """:func:`torch_step` as a pure function: ``(out, S, z)``, the carried state left as it was
    (what a library step that never mutates its inputs must do)."""
    import torch

    a, b, fq, fk = _torch_step_features(q, k, C, Sn, p)
    S = torch.addcmul(S, b.mT, v)
    z = torch.add(z, fk[..., 0, :])
    return torch.matmul(a, S).div_(torch.matmul(fq, z[..., None])), S, z


# -- NumPy --------------------------------------------------------------------------------------
def numpy_tables(n: int, d: int) -> tuple[np.ndarray, np.ndarray]:
    inv = (1.0 / (10000.0 ** (np.arange(0, d, 2, dtype=np.float32) / np.float32(d)))).astype(np.float32)
    ang = np.arange(n, dtype=np.float32)[:, None] * inv
    return np.cos(ang), np.sin(ang)


def _np_elu1(x: np.ndarray, out: np.ndarray, tmp: np.ndarray) -> np.ndarray:
    """``elu(x) + 1 = max(x, 0) + exp(min(x, 0))`` into ``out``."""
    np.minimum(x, 0, out=tmp)
    np.exp(tmp, out=tmp)
    np.maximum(x, 0, out=out)
    out += tmp
    return out


def _np_rope(f: np.ndarray, c: np.ndarray, s: np.ndarray, out: np.ndarray, tmp: np.ndarray) -> np.ndarray:
    h = f.shape[-1] // 2
    f1, f2, o1, o2, t = f[..., :h], f[..., h:], out[..., :h], out[..., h:], tmp[..., :h]
    np.multiply(f1, c, out=o1)
    np.multiply(f2, s, out=t)
    o1 -= t
    np.multiply(f2, c, out=o2)
    np.multiply(f1, s, out=t)
    o2 += t
    return out


def _np_flat(*xs: np.ndarray) -> list[np.ndarray]:
    return [x.reshape(-1, *x.shape[-2:]) for x in xs]


def numpy_causal(q: np.ndarray, k: np.ndarray, v: np.ndarray, chunk: int = CHUNK) -> np.ndarray:
    shape = v.shape
    n, d = q.shape[-2], q.shape[-1]
    q, k, v = _np_flat(q, k, v)
    cos, sin = numpy_tables(n, d)
    bh, dv, dt = q.shape[0], v.shape[-1], q.dtype
    S = np.zeros((bh, d, dv), dtype=dt)
    z = np.zeros((bh, 1, d), dtype=dt)
    out = np.empty((bh, n, dv), dtype=v.dtype)
    fq, fk, a, b, zc, tmp = (np.empty((bh, chunk, d), dtype=dt) for _ in range(6))
    A = np.empty((bh, chunk, chunk), dtype=dt)
    num, nv = np.empty((bh, chunk, dv), dtype=dt), np.empty((bh, chunk, dv), dtype=dt)
    Sd = np.empty((bh, d, dv), dtype=dt)
    den = np.empty((bh, chunk, 1), dtype=dt)
    tri = np.tril(np.ones((chunk, chunk), dtype=dt))
    for i in range(0, n, chunk):
        j = min(i + chunk, n)
        t = j - i
        c, s = cos[i:j], sin[i:j]
        tt = tmp[:, :t]
        qt, kt = _np_elu1(q[:, i:j], fq[:, :t], tt), _np_elu1(k[:, i:j], fk[:, :t], tt)
        at, bt, vc = _np_rope(qt, c, s, a[:, :t], tt), _np_rope(kt, c, s, b[:, :t], tt), v[:, i:j]
        At = np.matmul(at, bt.swapaxes(-1, -2), out=A[:, :t, :t])
        At *= tri[:t, :t]
        nt = np.matmul(at, S, out=num[:, :t])
        nt += np.matmul(At, vc, out=nv[:, :t])
        zt = np.matmul(tri[:t, :t], kt, out=zc[:, :t])  # the running sum (NumPy's cumsum along
        zt += z  # axis 1 is 4x slower than this product)
        qt *= zt
        dn = np.sum(qt, axis=-1, keepdims=True, out=den[:, :t])
        np.divide(nt, dn, out=out[:, i:j])
        S += np.matmul(bt.swapaxes(-1, -2), vc, out=Sd)
        z[...] = zt[:, -1:]
    return out.reshape(shape)


def numpy_noncausal(q: np.ndarray, k: np.ndarray, v: np.ndarray, block: int = BLOCK) -> np.ndarray:
    shape = v.shape
    n, d = q.shape[-2], q.shape[-1]
    q, k, v = _np_flat(q, k, v)
    cos, sin = numpy_tables(n, d)
    bh, dv, dt = q.shape[0], v.shape[-1], q.dtype
    S = np.zeros((bh, d, dv), dtype=dt)
    z = np.zeros((bh, d, 1), dtype=dt)
    f, r, tmp = (np.empty((bh, block, d), dtype=dt) for _ in range(3))
    for i in range(0, n, block):  # the keys' state
        j = min(i + block, n)
        t = j - i
        fk = _np_elu1(k[:, i:j], f[:, :t], tmp[:, :t])
        b = _np_rope(fk, cos[i:j], sin[i:j], r[:, :t], tmp[:, :t])
        S += np.matmul(b.swapaxes(-1, -2), v[:, i:j])
        z += fk.sum(1)[..., None]
    out = np.empty((bh, n, dv), dtype=v.dtype)
    for i in range(0, n, block):  # the queries against it
        j = min(i + block, n)
        t = j - i
        fq = _np_elu1(q[:, i:j], f[:, :t], tmp[:, :t])
        a = _np_rope(fq, cos[i:j], sin[i:j], r[:, :t], tmp[:, :t])
        o = np.matmul(a, S, out=out[:, i:j])
        o /= np.matmul(fq, z)
    return out.reshape(shape)


def numpy_step_tables(n: int, d: int) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin ``(n, d/2)`` per position (the decoding step's rows)."""
    return numpy_tables(n, d)


def _np_step_features(
    q: np.ndarray, k: np.ndarray, C: np.ndarray, Sn: np.ndarray, p: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(rotated phi(q), rotated phi(k), phi(q), phi(k))`` of one token at position ``p``."""
    c, s = C[p], Sn[p]
    h = q.shape[-1] // 2
    fq = np.maximum(q, 0) + np.exp(np.minimum(q, 0))
    fk = np.maximum(k, 0) + np.exp(np.minimum(k, 0))
    q1, q2, k1, k2 = fq[..., :h], fq[..., h:], fk[..., :h], fk[..., h:]
    a = np.concatenate([q1 * c - q2 * s, q2 * c + q1 * s], axis=-1)
    b = np.concatenate([k1 * c - k2 * s, k2 * c + k1 * s], axis=-1)
    return a, b, fq, fk


def numpy_step(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    S: np.ndarray,
    z: np.ndarray,
    C: np.ndarray,
    Sn: np.ndarray,
    p: int,
) -> np.ndarray:
    """One token ``(..., 1, d)`` at position ``p`` from ``(S, z)`` (updated in place), with the
    rows of :func:`numpy_step_tables`; returns the output."""
    a, b, fq, fk = _np_step_features(q, k, C, Sn, p)
    S += b.swapaxes(-1, -2) * v
    z += fk[..., 0, :]
    return (a @ S) / (fq @ z[..., None])


def numpy_step_new(q: Any, k: Any, v: Any, S: Any, z: Any, C: Any, Sn: Any, p: int) -> tuple[Any, Any, Any]:
    """:func:`numpy_step` as a pure function: ``(out, S, z)``, the carried state left as it was."""
    a, b, fq, fk = _np_step_features(q, k, C, Sn, p)
    S = S + b.swapaxes(-1, -2) * v
    z = z + fk[..., 0, :]
    return (a @ S) / (fq @ z[..., None]), S, z


# -- JAX (to be called under jax.jit) ---------------------------------------------------------
def jax_tables(n: int, d: int) -> tuple[Any, Any]:
    import jax.numpy as jnp

    inv = 1.0 / (10000.0 ** (jnp.arange(0, d, 2, dtype=jnp.float32) / d))
    ang = jnp.arange(n, dtype=jnp.float32)[:, None] * inv
    return jnp.cos(ang), jnp.sin(ang)


def _jax_features(x: Any, c: Any, s: Any) -> tuple[Any, Any]:
    """``(rotated phi(x), phi(x))``."""
    import jax
    import jax.numpy as jnp

    f = jax.nn.elu(x) + 1
    h = f.shape[-1] // 2
    f1, f2 = f[..., :h], f[..., h:]
    return jnp.concatenate([f1 * c - f2 * s, f2 * c + f1 * s], axis=-1), f


def _jax_split(x: Any, m: int, size: int) -> Any:
    """``(bh, m * size, d)`` as ``(m, bh, size, d)``."""
    import jax.numpy as jnp

    return jnp.moveaxis(jnp.reshape(x, (x.shape[0], m, size, x.shape[-1])), 1, 0)


def jax_causal(q: Any, k: Any, v: Any, chunk: int = CHUNK) -> Any:
    """``lax.scan`` over chunks (the length a multiple of ``chunk``)."""
    import jax
    import jax.numpy as jnp

    shape = v.shape
    n, d = q.shape[-2], q.shape[-1]
    q, k, v = (jnp.reshape(x, (-1, *x.shape[-2:])) for x in (q, k, v))
    m = n // chunk
    cos, sin = jax_tables(n, d)
    tri = jnp.tril(jnp.ones((chunk, chunk), dtype=q.dtype))
    S0 = jnp.zeros((q.shape[0], d, v.shape[-1]), dtype=q.dtype)
    z0 = jnp.zeros((q.shape[0], 1, d), dtype=q.dtype)

    def body(carry: Any, xs: Any) -> Any:
        S, z = carry
        qc, kc, vc, c, s = xs
        a, fq = _jax_features(qc, c, s)
        b, fk = _jax_features(kc, c, s)
        num = ((a @ jnp.swapaxes(b, -1, -2)) * tri) @ vc + a @ S
        zc = z + jnp.cumsum(fk, axis=1)
        den = jnp.sum(fq * zc, axis=-1, keepdims=True)
        return (S + jnp.swapaxes(b, -1, -2) @ vc, zc[:, -1:]), num / den

    xs = (*(_jax_split(x, m, chunk) for x in (q, k, v)), cos.reshape(m, chunk, -1), sin.reshape(m, chunk, -1))
    _, outs = jax.lax.scan(body, (S0, z0), xs)
    return jnp.reshape(jnp.moveaxis(outs, 0, 1), shape)


def jax_noncausal(q: Any, k: Any, v: Any, block: int = BLOCK) -> Any:
    """Two ``lax.scan`` passes over blocks (the length a multiple of ``block``, or one block)."""
    import jax
    import jax.numpy as jnp

    shape = v.shape
    n, d = q.shape[-2], q.shape[-1]
    q, k, v = (jnp.reshape(x, (-1, *x.shape[-2:])) for x in (q, k, v))
    block = min(block, n)
    m = n // block
    cos, sin = jax_tables(n, d)
    cs = (cos.reshape(m, block, -1), sin.reshape(m, block, -1))

    def keys(carry: Any, xs: Any) -> Any:
        S, z = carry
        kc, vc, c, s = xs
        b, fk = _jax_features(kc, c, s)
        return (S + jnp.swapaxes(b, -1, -2) @ vc, z + jnp.sum(fk, axis=1)[..., None]), None

    S0 = jnp.zeros((q.shape[0], d, v.shape[-1]), dtype=q.dtype)
    z0 = jnp.zeros((q.shape[0], d, 1), dtype=q.dtype)
    (S, z), _ = jax.lax.scan(keys, (S0, z0), (_jax_split(k, m, block), _jax_split(v, m, block), *cs))

    def queries(carry: Any, xs: Any) -> Any:
        qc, c, s = xs
        a, fq = _jax_features(qc, c, s)
        return carry, (a @ S) / (fq @ z)

    _, outs = jax.lax.scan(queries, None, (_jax_split(q, m, block), *cs))
    return jnp.reshape(jnp.moveaxis(outs, 0, 1), shape)


def jax_step(q: Any, k: Any, v: Any, S: Any, z: Any, C: Any, Sn: Any, p: Any) -> tuple[Any, ...]:
    """One token at position ``p`` (a traced integer) from ``(S, z)``, with the rows of
    :func:`jax_tables` (``C``, ``Sn``): ``(out, S, z)``."""
    import jax.numpy as jnp

    c, s = C[p], Sn[p]
    a, fq = _jax_features(q, c, s)
    b, fk = _jax_features(k, c, s)
    S = S + jnp.swapaxes(b, -1, -2) * v
    z = z + fk[..., 0, :]
    return (a @ S) / (fq @ z[..., None]), S, z
