"""Packed documents: where they start, as every function that knows a sequence axis reads it.

Two ways to say it, one meaning: ``cu_seqlens`` (``(n_docs + 1,)``: 0, then the running total of
the document lengths; flash-attn varlen, vLLM, TransformerEngine ``thd``) or per-token segment ids
(``(..., N)``; JAX codebases, MaxText).  A document is a *run* of tokens: a change of segment id
starts a new document (ids need not be increasing, and an id met again later starts another
document).  Both become *run ids*: per token, the number of boundaries before it, so they never
decrease along the sequence and two tokens share a document exactly when their run ids are equal.
Positions implied by the boundaries restart at 0 in each document.
"""

from __future__ import annotations

from typing import Any

from .._lib._typing import Array, Device, DType, Namespace

__all__ = ["positions_in_runs", "runs_from_cu_seqlens", "runs_from_segments", "segmented_cumsum"]


def runs_from_cu_seqlens(
    cu: Array, n: Any, xp: Namespace, device: Device, dtype: DType, search: bool = True
) -> Array:
    """``(n,)``: the document of every token of a packed sequence (``cu``: ``(n_docs + 1,)``,
    checked elsewhere: 0 first, non-decreasing, ``n`` last).  ``search``: ``searchsorted`` may
    be used (it returns the default index dtype, which a device may lack)."""
    t = xp.arange(n, dtype=dtype, device=device)
    ends = cu[1:] if cu.dtype == dtype else xp.astype(cu[1:], dtype)
    if search and hasattr(xp, "searchsorted"):
        doc = xp.searchsorted(ends, t, side="right")
        return doc if doc.dtype == dtype else xp.astype(doc, dtype)
    return xp.sum(xp.astype(ends[None, :] <= t[:, None], dtype), axis=1, dtype=dtype)  # one per document


def runs_from_segments(seg: Array, xp: Namespace, dtype: DType, cumsum: Any = None) -> Array:
    """``(..., N)``: run ids of segment ids ``seg`` (a new run wherever the id changes);
    ``cumsum(x, axis)``: the library's own cumulative sum, where the namespace's is a wrapper."""
    n = seg.shape[-1]
    if n is not None and n <= 1:  # (a static size) no boundary within 0 or 1 token
        return xp.zeros_like(seg, dtype=dtype)
    change = xp.astype(seg[..., 1:] != seg[..., :-1], dtype)
    zero = xp.zeros_like(change[..., :1])
    marks = xp.concat([zero, change], axis=-1)
    if cumsum is not None:
        out = cumsum(marks, -1)
        return out if out.dtype == dtype else xp.astype(out, dtype)
    return xp.cumulative_sum(marks, axis=-1, dtype=dtype)


def positions_in_runs(runs: Array, xp: Namespace) -> Array:
    """``(..., N)``: each token's index within its run (0 at every run's first token): the
    positions a packed sequence implies.  ``t - start``, the start the largest index at or before
    ``t`` where a run begins: a running maximum, by doubling (log2 N steps of shift and maximum)."""
    n = runs.shape[-1]
    if n == 0:  # (a static size: no token)
        return xp.zeros_like(runs)
    dt = runs.dtype
    t = xp.arange(n, dtype=dt, device=getattr(runs, "device", None))
    first = xp.concat([xp.ones_like(runs[..., :1], dtype=xp.bool), runs[..., 1:] != runs[..., :-1]], axis=-1)
    start = xp.where(first, xp.broadcast_to(t, runs.shape), xp.zeros_like(runs))
    d = 1
    while d < n:  # (n is static: a shape)
        shifted = xp.concat([xp.zeros_like(start[..., :d]), start[..., :-d]], axis=-1)
        start = xp.maximum(start, shifted)
        d *= 2
    return t - start


def segmented_cumsum(x: Array, runs: Array, xp: Namespace) -> Array:
    """``(..., N)``: the running sum of ``x`` restarting at every run (inclusive): each entry a sum
    of exactly its run's terms so far (doubling, log2 N steps: an entry adds the one ``d`` tokens
    back where that one is of its run; runs are contiguous, so nothing of another run enters)."""
    n = x.shape[-1]
    val = x
    d = 1
    while d < n:
        prev = xp.concat([xp.zeros_like(val[..., :d]), val[..., :-d]], axis=-1)
        before = xp.concat([xp.zeros_like(runs[..., :d]) + runs[..., :1] - 1, runs[..., :-d]], axis=-1)
        val = val + xp.where(before == runs, prev, xp.zeros_like(prev))
        d *= 2
    return val
