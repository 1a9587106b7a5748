"""Where packed documents start, read once for every entry point that knows a sequence axis.

``cu_seqlens=`` and ``segment_ids=`` (see :mod:`rotary._math._documents`) are checked here and
become run ids; the positions they imply restart at 0 in each document.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from ._backends import Backend
from ._lib import _validation as chk
from ._lib._compat import (
    array_namespace,
    host_values,
    is_array,
    is_host_positions,
    is_numpy,
    library_name,
    what,
)
from ._lib._typing import Array, Device
from ._math import _documents

__all__ = ["Docs", "Unnested", "documents", "implied_positions", "positions_along", "unnest"]


class Docs(NamedTuple):
    """The documents of a packed sequence: ``runs`` ``(..., N)`` (or ``(N,)``), and for
    ``cu_seqlens`` the boundaries themselves and their count (static)."""

    runs: Array
    cu: Array | None
    n_docs: int | None


def _index_dtype(be: Backend, device: Device) -> Any:
    return be.xp.int64 if be.has_int64(device) else be.xp.int32


def documents(
    be: Backend, n: Any, cu_seqlens: Any, segment_ids: Any, x: Array, x_name: str = "q"
) -> Docs | None:
    """``cu_seqlens`` or ``segment_ids`` for the ``n`` tokens of ``x`` (sequence axis -2) as
    :class:`Docs`, checked (values where they can be read); ``None`` when neither is given."""
    if cu_seqlens is None and segment_ids is None:
        return None
    if cu_seqlens is not None and segment_ids is not None:
        raise ValueError("pass cu_seqlens= or segment_ids=, not both (they say the same thing)")
    xp = be.xp
    dev = be.creation_device(x)
    idt = _index_dtype(be, dev)
    if cu_seqlens is not None:
        cu, host = _int_array(be, cu_seqlens, "cu_seqlens", dev, x, x_name)
        if cu.ndim != 1 or (cu.shape[0] is not None and cu.shape[0] < 1):
            raise ValueError(
                f"cu_seqlens must be 1-d with n_docs + 1 >= 1 entries (0, then the running total of the "
                f"document lengths), got shape {tuple(cu.shape)}"
            )
        if host is not None:
            h = host.astype(np.int64)
            bad = []
            if h[0] != 0:
                bad.append("does not start at 0")
            if np.any(np.diff(h) < 0):
                bad.append("decreases")
            if isinstance(n, int) and h[-1] != n:
                bad.append(f"ends at {int(h[-1])}, not at the total length {n} ({x_name}.shape[-2])")
            if bad:
                raise ValueError(
                    f"cu_seqlens {h.tolist() if h.size <= 12 else '(' + str(h.size) + ' entries)'} "
                    f"{', '.join(bad)}: it must be 0, then the running total of the document lengths, "
                    f"ending at the number of tokens"
                )
        runs = _compiled(be, _runs_of_cu, (n, xp, dev, idt, be.searchsorted_ok(dev)), cu)
        return Docs(runs, cu, int(cu.shape[0]) - 1)
    seg: Any = segment_ids
    if _own(be, seg, "segment_ids", x, x_name):
        if not chk.is_integral(seg.dtype) and not xp.isdtype(seg.dtype, "bool"):
            raise TypeError(
                f"segment_ids must be integers (one id per token), got {chk.dtype_name(seg.dtype)}"
            )
    else:
        seg, _ = _int_array(be, seg, "segment_ids", dev, x, x_name)
    lead = tuple(x.shape[:-1])
    if seg.ndim < 1 or seg.shape[-1] != n or not chk.broadcasts_to(tuple(seg.shape), lead):
        raise ValueError(
            f"segment_ids of shape {tuple(seg.shape)} do not match {x_name}'s tokens: one id per token, "
            f"shape (..., {n}) broadcasting to {x_name}.shape[:-1] = {lead}"
        )
    return Docs(_compiled(be, _runs_of_segments, (xp, idt, be.cumsum), seg), None, None)


def _compiled(be: Backend, fn: Callable[..., Array], statics: tuple[Any, ...], *arrays: Any) -> Array:
    """``fn(statics, *arrays)``, as one compiled program where the library runs eager calls so
    (JAX outside a trace: op by op, each index and Python scalar would move to the device, which
    ``jax.transfer_guard("disallow")`` refuses)."""
    if be.jit_eagerly():
        out: Array = be.jit(fn, (0,))(statics, *arrays)
        return out
    return fn(statics, *arrays)


def _runs_of_cu(statics: tuple[Any, ...], cu: Array) -> Array:
    n, xp, dev, idt, search = statics
    return _documents.runs_from_cu_seqlens(cu, n, xp, dev, idt, search)


def _runs_of_segments(statics: tuple[Any, ...], seg: Array) -> Array:
    xp, idt, cumsum = statics
    return _documents.runs_from_segments(seg, xp, idt, cumsum)


def _positions_of_runs(statics: tuple[Any, ...], runs: Array, offsets: Any) -> Array:
    xp, per_document = statics
    pos = _documents.positions_in_runs(runs, xp)
    if offsets is None:
        return pos
    if is_array(offsets) and offsets.dtype != pos.dtype:
        offsets = xp.astype(offsets, pos.dtype)
    if per_document:
        return pos + xp.take(offsets, runs, axis=0)
    first = xp.astype(runs == 0, pos.dtype)  # (the row's first document: run 0)
    return pos + first * (offsets[..., None] if is_array(offsets) else offsets)


def _own(be: Backend, b: Any, name: str, x: Array, x_name: str) -> bool:
    """Boundaries ``b`` are an array of ``x``'s library, on ``x``'s device (``ValueError``
    otherwise); ``False`` for host values (Python values, NumPy arrays), which rotary moves.  An
    array of another library is refused, as positions are: its values are never read through a
    way of its own (a ``meta`` tensor has none; another device's would be read back)."""
    if not is_array(b):
        return False
    lib = library_name(array_namespace(b, names=(name,)))
    if lib != be.name:
        if is_numpy(b):
            return False
        raise TypeError(
            f"{name} is a {what(b)} but {x_name} is a {be.name} array; pass {name} of the same "
            f"library (on {x_name}'s device), a NumPy array or a Python sequence"
        )
    be.check_devices([(x_name, x), (name, b)])
    return True


def _int_array(be: Backend, b: Any, name: str, device: Device, x: Array, x_name: str) -> tuple[Any, Any]:
    """Boundaries ``b`` as an integer array of ``be`` on ``x``'s device (:func:`_own`), and their
    values where they can be read (host values always: they are checked before they move)."""
    if _own(be, b, name, x, x_name):
        if not chk.is_integral(b.dtype):
            raise TypeError(f"{name} must be an integer array, got {chk.dtype_name(b.dtype)}")
        return b, be.readable_values(b)
    host = host_values(b, name)
    if host.size and not (np.issubdtype(host.dtype, np.integer) or host.dtype == bool):
        raise TypeError(f"{name} must hold integers, got dtype {host.dtype}")
    return be.to_device(host.astype(np.int64), _index_dtype(be, device), device), host


def implied_positions(be: Backend, docs: Docs, offsets: Any = None) -> Array:
    """The positions the documents imply: 0 at every document's first token, plus ``offsets``
    where documents continue a state: one per document of ``cu_seqlens``; with segment ids,
    where each row's first document continues (an integer, or an array broadcasting against
    the rows ``runs.shape[:-1]``), every later document of the row from 0."""
    if offsets is not None and is_host_positions(offsets) and be.jit_eagerly():
        # (host offsets moved explicitly: a Python scalar given to the compiled program moves too)
        offsets = be.to_device(np.asarray(offsets), docs.runs.dtype, be.creation_device(docs.runs))
    return _compiled(be, _positions_of_runs, (be.xp, docs.cu is not None), docs.runs, offsets)


def positions_along(be: Backend, x: Array, cu_seqlens: Any, segment_ids: Any, x_name: str) -> Array:
    """The positions the documents of ``x`` imply, shaped to broadcast against ``x.shape[:-1]``:
    tokens along axis -2 (``(..., tokens, head_dim)``), or along axis -3 for the packed layout
    ``(total, heads, head_dim)`` where only that axis has the documents' length (told by the
    total of ``cu_seqlens``, so where its values can be read: host values, an eager library)."""
    if x.ndim < 2:
        raise ValueError(
            f"{x_name} must have a token axis: shape (..., tokens, head_dim), got {tuple(x.shape)}"
        )
    n = x.shape[-2]
    thd = False
    if cu_seqlens is not None and x.ndim >= 3:
        _own(be, cu_seqlens, "cu_seqlens", x, x_name)  # (checked before its total is read)
        total = _known_total(be, cu_seqlens)
        thd = total is not None and total != n and x.shape[-3] == total
    if thd:
        docs = documents(be, x.shape[-3], cu_seqlens, None, x[..., 0, :], x_name)
        assert docs is not None
        return implied_positions(be, docs)[:, None]
    docs = documents(be, n, cu_seqlens, segment_ids, x, x_name)
    assert docs is not None
    return implied_positions(be, docs)


def _known_total(be: Backend, cu: Any) -> int | None:
    if is_array(cu):
        host = (
            be.readable_values(cu) if library_name(array_namespace(cu)) == be.name else host_values(cu, "cu")
        )
    else:
        host = np.asarray(cu)
    if host is None or host.size == 0:
        return None
    return int(host.reshape(-1)[-1])


class Unnested(NamedTuple):
    """Nested q, k, v (and positions) as flat arrays with the tokens along axis -2, their
    documents' offsets (``cu_seqlens``), and how to nest an output like ``q``."""

    q: Array
    k: Array
    v: Array
    pos: Any
    offsets: Array
    wrap: Any


def unnest(be: Backend, q: Array, k: Array, v: Array, pos: Any) -> Unnested | None:
    """Nested (jagged) ``q``, ``k``, ``v`` as their values, tokens along axis -2 (``None`` when
    none of them is nested): the attentions serve nested arrays in their own layout."""
    js = [be.jagged(x) for x in (q, k, v)]
    if all(j is None for j in js):
        return None
    if any(j is None for j in js):
        raise TypeError(
            "q, k and v must all be nested (the same documents) or all dense; to mix, pass the nested "
            "ones' flat values with cu_seqlens=x.offsets()"
        )
    jq, jk, jv = js
    assert jq is not None and jk is not None and jv is not None
    be.check_same_documents(jq, jk, "q", "k")
    be.check_same_documents(jq, jv, "q", "v")
    xp = be.xp

    def flat(j: Any) -> Array:
        return j.values if j.axis == -2 else xp.moveaxis(j.values, j.axis, -2)

    p = pos
    if pos is not None:
        jp = be.jagged(pos)
        if jp is None:
            raise TypeError("q, k and v are nested: pos must be nested too (one position per token), or None")
        be.check_same_documents(jq, jp, "q", "pos")
        chk.check_nested_positions(tuple(jp.values.shape), "pos")
        p = jp.values

    def wrap(out: Array) -> Array:
        return jq.wrap(out if jq.axis == -2 else xp.moveaxis(out, -2, jq.axis))

    return Unnested(flat(jq), flat(jk), flat(jv), p, jq.offsets, wrap)
