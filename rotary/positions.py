"""Positions as models need them, and the re-rotation of cached keys.

Packed (varlen) batches
    :func:`from_lengths`, :func:`from_cu_seqlens`: positions restarting at 0 for every
    document of a packed sequence (flash-attn ``cu_seqlens``, TransformerEngine ``thd``).
Padding
    :func:`from_attention_mask`: Hugging Face's ``cumsum(mask) - 1`` positions (left padding,
    batched decode), padding tokens at ``fill``.
M-RoPE
    :func:`mrope_position_ids`: the ``(3, batch, seq)`` position ids and per-row deltas of
    Qwen2-VL / Qwen2.5-VL / Qwen3-VL (``get_rope_index`` in ``transformers``);
    :func:`mrope_text_positions` for the text tokens generated after them.
KV cache
    :func:`shift_keys` moves keys rotated at ``p`` to ``p + delta`` (context shift);
    :func:`rerotate_keys` moves keys from one RoPE's frequencies to another's, and
    :func:`longrope_switch` does it for LongRoPE's short-to-long switch.  Both rotate once by
    the exact angles of the difference (``delta * theta`` or ``p * (theta_dst - theta_src)``),
    not by unrotating and rotating again in float32.

All take arrays of any supported library (or Python / NumPy values) and return arrays of the
same library and device; the packed, padding and re-rotation functions are array-API code that
traces under ``jax.jit`` and ``torch.compile`` (pass ``total=`` where the output size would
otherwise be read from the values).  :func:`mrope_position_ids` follows the token layout of
each row, so it runs on host values, as ``transformers`` does.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from ._backends import Backend, backend_for
from ._config import RopeConfig
from ._lib import _validation as v
from ._lib._cache import get_or_build
from ._lib._compat import array_namespace, as_namespace, entry, host_values, is_array, not_an_array
from ._lib._typing import Array, Device, DType, Namespace
from ._rope import RoPE
from .multiaxis import MRoPE
from .scaling import Factors, Frequencies, LongRoPE

__all__ = [
    "from_attention_mask",
    "from_cu_seqlens",
    "from_lengths",
    "longrope_switch",
    "mrope_position_ids",
    "mrope_text_positions",
    "rerotate_keys",
    "shift_keys",
]


# -- helpers ------------------------------------------------------------------------------------
def _namespace(x: Any, xp: Any, name: str) -> Namespace:
    if xp is not None:
        return as_namespace(xp)
    return array_namespace(x, names=(name,))  # (NumPy for Python values; others refused)


_INT64_MAX = 2**63 - 1


def _int_dtype(be: Backend, device: Device) -> DType:
    return be.xp.int64 if be.has_int64(device) else be.xp.int32


def _as_int_array(x: Any, name: str, be: Backend, device: Device) -> Array:
    """``x`` as a 1-d integer array of ``be`` (host values converted; arrays checked for dtype)."""
    xp = be.xp
    if is_array(x) and array_namespace(x) is xp:
        arr = x
    else:
        host = host_values(x, name)
        if host.size == 0:
            host = host.astype(np.int64)
        if not np.issubdtype(host.dtype, np.integer):
            raise TypeError(f"{name} must hold integers, got dtype {host.dtype}")
        arr = xp.asarray(host.astype(np.int64), dtype=_int_dtype(be, device), device=device)
    if not v.is_integral(arr.dtype):
        raise TypeError(f"{name} must be an integer array, got dtype {v.dtype_name(arr.dtype)}")
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-d array, got shape {tuple(arr.shape)}")
    return arr


def _total(be: Backend, x: Array, name: str, total: Any, *, cu: bool) -> int:
    """The packed length: ``total``, or the documents' when ``None``; the values of ``x``
    (cumulative when ``cu``) are checked where they can be read."""
    known = None
    values = be.readable_values(x)
    if values is not None:
        if values.dtype.kind == "u" and values.size and int(values.max()) > _INT64_MAX:
            raise ValueError(f"{name} holds {int(values.max())} tokens: more than an int64 can count")
        h = values.astype(np.int64)
        if cu:
            if h[0] != 0:
                raise ValueError(
                    f"{name} must start at 0 (cumulative lengths, n_docs + 1 entries), got {h.tolist()}"
                )
            if np.any(np.diff(h) < 0):
                raise ValueError(f"{name} must be non-decreasing, got {h.tolist()}")
            known = int(h[-1])
        else:
            if np.any(h < 0):
                raise ValueError(f"{name} must be non-negative, got {h.tolist()}")
            if h.size and int(h.max()) > _INT64_MAX // h.size:  # (the sum may wrap: summed exactly)
                known = sum(h.tolist())
                if known > _INT64_MAX:
                    raise ValueError(
                        f"the documents of {name} hold {known} tokens in all: more than an int64 can count"
                    )
            else:
                known = int(h.sum())
    if total is None:
        if known is None:
            raise ValueError(
                f"the values of {name} cannot be read here (traced, lazy, or a library without "
                "data-dependent shapes): pass total= (the packed length)"
            )
        return known
    total = v.check_int(total, "total", minimum=0)
    if known is not None and total < known:
        raise ValueError(f"total={total} is shorter than the documents of {name} ({known} tokens)")
    return total


def _packed(x: Any, name: str, total: Any, xp: Any, device: Device, *, cu: bool) -> Array:
    """Positions restarting at 0 per document; ``x`` holds lengths, or ``cu_seqlens`` when ``cu``."""
    be = backend_for(_namespace(x, xp, name))
    xp = be.xp
    arr = _as_int_array(x, name, be, device)
    be.check_dense([(name, arr)])  # (pydata sparse: .todense(), not a total= that fails next)
    for fn in ("arange", "where", "take") if cu else ("arange", "cumulative_sum", "where", "take"):
        getattr(xp, fn)  # (what it needs, before any advice: a total= that fails next is none)
    if cu and arr.shape[0] == 0:
        raise ValueError("cu_seqlens must have n_docs + 1 >= 1 entries, got none")
    device = be.creation_device(arr) if device is None else device
    n = _total(be, arr, name, total, cu=cu)
    if n > xp.iinfo(arr.dtype).max:  # sums and positions up to n: a dtype that holds them
        arr = xp.astype(arr, _int_dtype(be, device))
    out = arr.dtype
    if v.is_unsigned(out):  # (computed signed, given back unsigned: torch has no unsigned cumsum)
        arr = xp.astype(arr, _int_dtype(be, device))
    if cu:
        starts, ends = arr[:-1], arr[1:]
    else:
        ends = xp.cumulative_sum(arr, dtype=arr.dtype)
        starts = ends - arr
    dt = arr.dtype
    n_docs = starts.shape[0]
    if n_docs == 0:
        return xp.zeros((n,), dtype=out, device=device)
    t = xp.arange(n, dtype=dt, device=device)
    if hasattr(xp, "searchsorted") and be.has_int64(device):  # (it returns the default index dtype)
        doc = xp.searchsorted(ends, t, side="right")
    else:  # one comparison per document
        doc = xp.sum(xp.astype(ends[None, :] <= t[:, None], dt), axis=1, dtype=dt)
    inside = doc < n_docs
    doc = xp.clip(doc, max=n_docs - 1)
    start = xp.take(starts, xp.astype(doc, _int_dtype(be, device)), axis=0)  # (torch: int32/64 indices)
    got = xp.where(inside, t - start, xp.zeros_like(t))
    return got if got.dtype == out else xp.astype(got, out)


# -- packed batches -----------------------------------------------------------------------------
@entry
def from_lengths(lengths: Any, *, total: int | None = None, xp: Any = None, device: Device = None) -> Array:
    """Positions of a packed sequence of documents of ``lengths`` tokens, restarting at 0 for each.

    Parameters
    ----------
    lengths : array or sequence of int
        Tokens per document, shape ``(n_docs,)``, non-negative.
    total : int, optional
        Length of the packed sequence (default ``sum(lengths)``; needed under ``jax.jit``).
        Tokens past the last document (padding of a fixed-size buffer) get position 0.
    xp, device
        Namespace and device of the result (default: those of ``lengths``; NumPy for host values).

    Returns
    -------
    array
        Shape ``(total,)``, the integer dtype of ``lengths`` where it holds ``total`` (else, and
        for host values, int64 where the library has it, else int32).  Lengths whose sum an
        int64 cannot hold are refused where their values can be read (under a trace they
        cannot: ``total=`` is then the length, and values wrap as the library's integers do).

    Examples
    --------
    >>> from rotary import positions
    >>> positions.from_lengths([3, 1, 2])
    array([0, 1, 2, 0, 0, 1])
    >>> positions.from_lengths([2, 2], total=6)
    array([0, 1, 0, 1, 0, 0])
    """
    return _packed(lengths, "lengths", total, xp, device, cu=False)


@entry
def from_cu_seqlens(
    cu_seqlens: Any, *, total: int | None = None, xp: Any = None, device: Device = None
) -> Array:
    """Positions of a packed sequence from cumulative document lengths (flash-attn ``cu_seqlens``).

    Parameters
    ----------
    cu_seqlens : array or sequence of int
        Shape ``(n_docs + 1,)``: ``0``, then the running total of the document lengths.
    total, xp, device
        As in :func:`from_lengths` (default ``total = cu_seqlens[-1]``).

    Examples
    --------
    >>> from rotary import positions
    >>> positions.from_cu_seqlens([0, 3, 4, 6])
    array([0, 1, 2, 0, 0, 1])
    """
    return _packed(cu_seqlens, "cu_seqlens", total, xp, device, cu=True)


@entry
def from_attention_mask(mask: Array, *, fill: int = 0) -> Array:
    """Positions from an attention mask, Hugging Face's convention: ``cumsum(mask) - 1``.

    With left padding every row's first real token is at position 0; padding tokens get
    ``fill`` (0, as ``transformers``' ``generate`` sets them).  For a decode step with a KV
    cache, pass the mask of the cache plus the new tokens and keep the last columns.

    Parameters
    ----------
    mask : array
        Shape ``(..., seq)``, 1/``True`` for real tokens, 0/``False`` for padding.
    fill : int
        Position given to padding tokens.

    Returns
    -------
    array
        Integer positions (int64 where the library has it), the shape of ``mask``.

    Examples
    --------
    >>> import numpy as np
    >>> from rotary import positions
    >>> mask = np.array([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    >>> positions.from_attention_mask(mask)
    array([[0, 0, 0, 1, 2],
           [0, 1, 2, 3, 4]])
    """
    if not is_array(mask):
        mask = host_values(mask, "mask")
    xp = array_namespace(mask, names=("mask",))
    be = backend_for(xp)
    if mask.ndim < 1:
        raise ValueError("mask must have at least one axis (..., seq), got a 0-d array")
    fill = v.check_int(fill, "fill")
    dev = be.creation_device(mask)
    dt = _int_dtype(be, dev)
    if v.is_integral(mask.dtype) or xp.isdtype(mask.dtype, "bool"):
        on = mask != 0 if v.is_integral(mask.dtype) else mask
    else:
        raise TypeError(f"mask must be a boolean or integer array, got dtype {v.dtype_name(mask.dtype)}")
    pos = xp.cumulative_sum(xp.astype(on, dt), axis=-1, dtype=dt) - 1
    return xp.where(on, pos, xp.full_like(pos, fill))  # (full_like: pos.shape may be symbolic)


# -- M-RoPE -------------------------------------------------------------------------------------
def _grids(x: Any, name: str) -> np.ndarray:
    if x is None:
        return np.zeros((0, 3), dtype=np.int64)
    g = host_values(x, name)
    if g.ndim != 2 or g.shape[1] != 3 or not np.issubdtype(g.dtype, np.integer):
        raise ValueError(
            f"{name} must be an integer array of shape (n, 3) (t, h, w), got {g.dtype} {g.shape}"
        )
    if np.any(g <= 0):
        raise ValueError(f"{name} must hold positive grid sizes, got {g.tolist()}")
    return g.astype(np.int64)


@entry
def mrope_position_ids(
    token_types: Any,
    image_grid_thw: Any = None,
    video_grid_thw: Any = None,
    *,
    attention_mask: Any = None,
    spatial_merge_size: int = 2,
    tokens_per_second: float | None = None,
    second_per_grid_ts: Any = None,
    split_video_frames: bool = False,
) -> tuple[Array, Array]:
    """M-RoPE position ids ``(3, batch, seq)`` and per-row deltas, as Qwen-VL models build them.

    Text tokens take the same position on the three rows (temporal, height, width), counting
    on from the previous token; each image or video (a run of its tokens) takes a grid:
    temporal index (times the video's time interval), row and column, offset by the position
    reached so far, which then advances by ``max(h, w) // spatial_merge_size``.  The deltas
    (``max position + 1 - tokens``, shape ``(batch, 1)``) give the positions of later text
    tokens (:func:`mrope_text_positions`).  Equal to ``get_rope_index`` of ``transformers``'
    Qwen2-VL, Qwen2.5-VL (``tokens_per_second``, ``second_per_grid_ts``) and Qwen3-VL
    (``split_video_frames=True``); :func:`rotary.hf.mrope_index` reads these options from a
    config.

    Parameters
    ----------
    token_types : array
        ``(batch, seq)``: 0 text, 1 image, 2 video (``transformers``' ``mm_token_type_ids``).
    image_grid_thw, video_grid_thw : array, optional
        ``(n, 3)`` patch grids ``(t, h, w)`` of the images / videos, in order of appearance
        over the whole batch.
    attention_mask : array, optional
        ``(batch, seq)``; padding tokens are skipped and get position 0.
    spatial_merge_size : int
        Patches merged per side into one token by the vision encoder.
    tokens_per_second, second_per_grid_ts
        Qwen2.5-VL: a video's temporal index is scaled by ``tokens_per_second *
        second_per_grid_ts[i]`` (``second_per_grid_ts`` default 1 per video) and truncated.
    split_video_frames : bool
        Qwen3-VL: each video frame is its own grid (``t = 1``), its frames separated by
        timestamp text tokens.

    Returns
    -------
    position_ids, deltas : arrays
        Integer arrays of the namespace and device of ``token_types``, shapes
        ``(3, batch, seq)`` and ``(batch, 1)``.

    Notes
    -----
    Host work on the prompt's layout (its values decide the shapes of the grids): not traceable,
    so a ``TypeError`` inside ``torch.compile`` or ``jax.jit``.  Call it where the prompt is
    prepared, as ``transformers`` calls ``get_rope_index``; the rotation that uses the ids compiles.

    Examples
    --------
    >>> import numpy as np
    >>> from rotary import positions
    >>> types = np.array([[0, 0, 1, 1, 1, 1, 0]])           # 2 text, a 2x2-token image, 1 text
    >>> ids, delta = positions.mrope_position_ids(types, [[1, 4, 4]])
    >>> ids[:, 0]
    array([[0, 1, 2, 2, 2, 2, 4],
           [0, 1, 2, 2, 3, 3, 4],
           [0, 1, 2, 3, 2, 3, 4]])
    >>> delta
    array([[-2]])
    """
    xp = _namespace(token_types, None, "token_types")
    be = backend_for(xp)
    if be.tracing():
        raise TypeError(
            "mrope_position_ids reads the prompt's token layout on the host (as transformers' "
            "get_rope_index does): call it outside torch.compile / jax.jit and pass the position ids in"
        )
    tt = host_values(token_types, "token_types")
    if tt.ndim != 2 or not np.issubdtype(tt.dtype, np.integer):
        raise ValueError(
            f"token_types must be an integer array of shape (batch, seq), got {tt.dtype} {tt.shape}"
        )
    if not set(np.unique(tt).tolist()) <= {0, 1, 2}:
        raise ValueError(
            f"token_types must hold 0 (text), 1 (image) or 2 (video), got {sorted(set(tt.ravel()))}"
        )
    m = v.check_int(spatial_merge_size, "spatial_merge_size", minimum=1)
    mask = np.ones(tt.shape, dtype=bool)
    if attention_mask is not None:
        mask = host_values(attention_mask, "attention_mask").astype(bool)
        if mask.shape != tt.shape:
            raise ValueError(
                f"attention_mask must have the shape of token_types {tt.shape}, got {mask.shape}"
            )
    grids = {1: _grids(image_grid_thw, "image_grid_thw"), 2: _grids(video_grid_thw, "video_grid_thw")}
    n_videos = grids[2].shape[0]
    if v.check_bool(split_video_frames, "split_video_frames"):
        vid = np.repeat(grids[2], grids[2][:, 0], axis=0)
        vid[:, 0] = 1
        grids[2] = vid
    tps = (
        None
        if tokens_per_second is None
        else v.check_float(tokens_per_second, "tokens_per_second", above=0.0)
    )
    if second_per_grid_ts is not None:
        if tps is None:
            raise ValueError("second_per_grid_ts needs tokens_per_second")
        secs = np.asarray(host_values(second_per_grid_ts, "second_per_grid_ts"), dtype=np.float32).reshape(-1)
        if secs.shape[0] != n_videos:
            raise ValueError(
                f"second_per_grid_ts must have one entry per video ({n_videos}), got {secs.shape[0]}"
            )
        sec_iter = iter(secs.tolist())
    else:
        # 1 per video (transformers' iter([1] * seq_len) runs out, StopIteration, after as many
        # videos in the batch as token columns; where it does not, the same numbers)
        sec_iter = itertools.repeat(1)
    iters = {1: iter(grids[1].tolist()), 2: iter(grids[2].tolist())}
    out = np.zeros((3, *tt.shape), dtype=np.int64)
    deltas = np.zeros((tt.shape[0], 1), dtype=np.int64)
    for b in range(tt.shape[0]):
        row = tt[b][mask[b]]
        parts: list[np.ndarray] = []
        cur = 0
        for kind, grp in itertools.groupby(row.tolist()):
            count = sum(1 for _ in grp)
            if kind == 0:
                parts.append(np.broadcast_to(np.arange(cur, cur + count, dtype=np.int64), (3, count)))
                cur += count
                continue
            what = "image" if kind == 1 else "video"
            try:
                t, h, w = next(iters[kind])
            except StopIteration:
                raise ValueError(f"token_types has more {what}s than {what}_grid_thw rows") from None
            lt, lh, lw = t, h // m, w // m
            if lt * lh * lw != count:
                raise ValueError(
                    f"an {what} of grid {(t, h, w)} (spatial_merge_size={m}) has {lt * lh * lw} tokens, "
                    f"but its run in token_types row {b} has {count}"
                )
            if kind == 2 and tps is not None:
                interval = np.float32(tps) * np.float32(next(sec_iter))
                tpos = (np.arange(lt, dtype=np.float32) * interval).astype(np.int64)
            else:
                tpos = np.arange(lt, dtype=np.int64)
            tg, hg, wg = np.meshgrid(tpos, np.arange(lh) + cur, np.arange(lw) + cur, indexing="ij")
            parts.append(np.stack([tg.ravel() + cur, hg.ravel(), wg.ravel()]))
            cur += max(h, w) // m
        llm = np.concatenate(parts, axis=1) if parts else np.zeros((3, 0), dtype=np.int64)
        out[:, b, mask[b]] = llm
        deltas[b, 0] = (llm.max() + 1 if llm.size else 0) - row.shape[0]
    dev = be.creation_device(token_types) if is_array(token_types) else None
    dt = _int_dtype(be, dev)
    return xp.asarray(out, dtype=dt, device=dev), xp.asarray(deltas, dtype=dt, device=dev)


@entry
def mrope_text_positions(positions: Any, deltas: Any) -> Array:
    """M-RoPE position ids ``(3, batch, n)`` of text tokens after an image or video prompt.

    ``positions`` are the tokens' 1-D positions ``(batch, n)`` (e.g. the cache length plus
    ``arange(n)``, or :func:`from_attention_mask` under left padding), ``deltas`` the
    ``(batch, 1)`` deltas of :func:`mrope_position_ids`: every row gets ``positions + deltas``.

    Examples
    --------
    >>> import numpy as np
    >>> from rotary import positions
    >>> positions.mrope_text_positions(np.array([[7, 8]]), np.array([[-2]]))[:, 0]
    array([[5, 6],
           [5, 6],
           [5, 6]])
    """
    xp = _namespace(positions, None, "positions")
    if not is_array(positions):
        positions = xp.asarray(host_values(positions, "positions"))
    if not is_array(deltas) or array_namespace(deltas) is not xp:
        dev = backend_for(xp).creation_device(positions)
        deltas = xp.asarray(host_values(deltas, "deltas"), dtype=positions.dtype, device=dev)
    p = positions + deltas
    return xp.stack([p, p, p])  # (an array of the caller's, not a read-only broadcast view)


# -- KV-cache re-rotation -----------------------------------------------------------------------
def _key_namespace(k: Any) -> Backend:
    if not is_array(k):
        raise not_an_array("k", k, "an array of shape (..., head_dim)")
    return backend_for(array_namespace(k, names=("k",)))


def _rotation_freqs(a: RopeConfig, b: RopeConfig | None) -> tuple[tuple[float, ...], ...]:
    """The frequencies, computed on the host, of the rotation by ``pos * freqs`` that shifts
    keys of ``a`` (``b`` None), moves them to ``b``, or switches LongRoPE ``a`` from its short
    factors to its long ones (the only dynamic scaling let through).  One set, or two when
    ``freqs`` is a difference of float64 frequencies (``hi + lo`` equals it exactly).  Plain
    values, so ``Backend.eager`` can hand them to a trace as constants."""
    if isinstance(a.scaling, LongRoPE):
        a, b = (a.with_scaling(Factors(f)) for f in (a.scaling.short_factor, a.scaling.long_factor))
    if b is None:
        parts = [a.host_inv_freq()]
    else:
        w, d = b.host_inv_freq(), -a.host_inv_freq()
        hi = w + d  # Knuth's TwoSum: hi + lo == w + d exactly
        bb = hi - w
        lo = (w - (hi - bb)) + (d - bb)
        parts = [hi] if not np.any(lo) else [hi, lo]
    return tuple(tuple(float(f) for f in freqs) for freqs in parts)


def _pure_ropes(cfg: RopeConfig, parts: tuple[tuple[float, ...], ...]) -> tuple[RoPE, ...]:
    """One RoPE per set of frequencies (exact angles, no attention factor), rotating the
    features ``cfg`` rotates."""
    return tuple(
        RoPE(cfg.head_dim, layout=cfg.layout, rotary_dim=cfg.width, scaling=Frequencies(f), angles="exact")
        for f in parts
    )


def _rotate(be: Backend, src: RoPE, dst: RoPE | None, k: Array, pos: Any) -> Array:
    a, b = src.config, None if dst is None else dst.config
    if be.tracing():
        # Inside torch.compile the frequencies come back as constants and the rotations are
        # built in the trace (a RoPE of plain values, as the backends allow).
        ropes = _pure_ropes(a, be.eager(_rotation_freqs, a, b))
    else:
        ropes = get_or_build(
            ("rerotation", a, b), lambda: (_pure_ropes(a, _rotation_freqs(a, b)), 1024), "ropes"
        )
    for rope in ropes:
        k = rope.rotate(k, pos)
    return k


def _one_set(rope: Any, name: str) -> RoPE:
    """The RoPE of a RoPE or MRoPE (an MRoPE rotates its features with its RoPE's
    frequencies and attention factor), refused when its frequencies are not one set."""
    if not isinstance(rope, (RoPE, MRoPE)):
        raise v.wrong_type(name, rope, "a rotary.RoPE or rotary.MRoPE", RoPE, MRoPE)
    rope = rope.rope if isinstance(rope, MRoPE) else rope
    scaling = rope.config.scaling
    if scaling.dynamic:
        raise ValueError(
            f"{name} has a sequence-length-dependent scaling ({type(scaling).__name__}): its "
            "frequencies are not one set. For LongRoPE's switch use longrope_switch; otherwise build the "
            "RoPE of the frequencies the keys were rotated with (e.g. scaling=Factors(short_factor))"
        )
    return rope


@entry
def shift_keys(k: Array, delta: Any, rope: RoPE | MRoPE) -> Array:
    """Move keys rotated by ``rope`` at positions ``p`` to positions ``p + delta``.

    A context shift (llama.cpp's KV shift): after dropping cached tokens, the kept keys are
    rotated by ``delta * theta`` (exact angles, no attention factor: the keys already carry
    it), which equals rotating the unrotated keys at ``p + delta``.  For an :class:`MRoPE`
    every position row moves by ``delta``.

    Parameters
    ----------
    k : array
        Rotated keys ``(..., head_dim)``.
    delta : int or array
        The shift, broadcast against ``k.shape[:-1]`` (e.g. per batch row ``(batch, 1, 1)``
        for ``(batch, heads, seq, head_dim)``).
    rope : RoPE or MRoPE
        The RoPE the keys were rotated with (a static scaling).

    Examples
    --------
    >>> import numpy as np, rotary
    >>> from rotary import positions
    >>> rope = rotary.RoPE(8)
    >>> k = np.random.default_rng(0).normal(size=(5, 8)).astype(np.float32)
    >>> cached = rope.rotate(k, np.arange(100, 105))
    >>> moved = positions.shift_keys(cached, -100, rope)
    >>> bool(np.allclose(moved, rope.rotate(k, np.arange(5)), atol=1e-6))
    True
    """
    be = _key_namespace(k)
    return _rotate(be, _one_set(rope, "rope"), None, k, delta)


@entry
def rerotate_keys(k: Array, pos: Any, src: RoPE, dst: RoPE) -> Array:
    """Re-rotate keys rotated by ``src`` at ``pos`` into the keys ``dst`` gives at ``pos``.

    A rotation by the exact angles ``pos * (theta_dst - theta_src)`` (the difference of the two
    float64 frequencies, held exactly as ``hi + lo``: a second, tiny rotation by ``pos * lo``
    where ``hi`` alone is not exact), times ``dst.attention_factor / src.attention_factor``
    where they differ.  ``src`` and ``dst`` must rotate the same features (head size, layout, rotated
    width, partial mode).

    Examples
    --------
    >>> import numpy as np, rotary
    >>> from rotary import positions
    >>> old, new = rotary.RoPE(8, base=10000.0), rotary.RoPE(8, base=500000.0)
    >>> k = np.random.default_rng(0).normal(size=(6, 8)).astype(np.float32)
    >>> p = np.arange(1000, 1006)
    >>> moved = positions.rerotate_keys(old.rotate(k, p), p, old, new)
    >>> bool(np.allclose(moved, new.rotate(k, p), atol=1e-5))
    True
    """
    be = _key_namespace(k)
    for name, rope in (("src", src), ("dst", dst)):
        if isinstance(rope, MRoPE):  # its pairs turn by three position rows, not by one pos
            raise TypeError(
                f"{name} must be a rotary.RoPE, got an MRoPE: re-rotating M-RoPE keys needs each "
                "token's (t, h, w) positions, which rerotate_keys does not take (shift_keys does "
                "move M-RoPE keys)"
            )
    src, dst = _one_set(src, "src"), _one_set(dst, "dst")
    for name in ("head_dim", "layout"):
        a, b = getattr(src, name), getattr(dst, name)
        if a != b:
            raise ValueError(f"src and dst must rotate the same features: {name} {a!r} != {b!r}")
    a, b = (src.config.width, src.partial), (dst.config.width, dst.partial)
    if a != b:
        raise ValueError(f"src and dst must rotate the same features: {a} and {b} rotated features")
    out = _rotate(be, src, dst, k, pos)
    ratio = float(dst.attention_factor) / float(src.attention_factor)
    return out if ratio == 1.0 else out * ratio


@entry
def longrope_switch(k: Array, pos: Any, rope: RoPE) -> Array:
    """Re-rotate keys cached with LongRoPE's short factors to its long factors.

    LongRoPE (Phi-3, Phi-4-mini) uses ``short_factor`` while the sequence fits the original
    context and ``long_factor`` beyond it; keys cached before the switch were rotated with the
    short set.  This rotates them by ``pos * (theta_long - theta_short)`` in exact angles, so
    they equal the keys the long set gives (the attention factor is the same for both sets).

    Examples
    --------
    >>> import numpy as np, rotary
    >>> from rotary import positions, scaling
    >>> sc = scaling.LongRoPE((1.0, 1.0), (1.0, 4.0), 16, factor=4.0)
    >>> rope = rotary.RoPE(4, scaling=sc)
    >>> k = np.ones((16, 4), dtype=np.float32)
    >>> p = np.arange(16)
    >>> short = rope.rotate(k, p)                      # seq_len 16 <= 16: the short factors
    >>> long = rope.rotate(np.ones((17, 4), dtype=np.float32), np.arange(17))[:16]
    >>> bool(np.allclose(positions.longrope_switch(short, p, rope), long, atol=1e-6))
    True
    """
    be = _key_namespace(k)
    if not isinstance(rope, RoPE):
        raise v.wrong_type("rope", rope, "a rotary.RoPE with a LongRoPE scaling", RoPE)
    if not isinstance(rope.config.scaling, LongRoPE):
        raise TypeError(f"rope must be a rotary.RoPE with a LongRoPE scaling, got {rope!r}")
    return _rotate(be, rope, None, k, pos)
