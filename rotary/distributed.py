"""Beyond one machine: RoPE and RoPE linear attention on Dask, sharded JAX and torch.distributed.

Nothing here imports Dask or JAX at module import time (this module, like
:mod:`rotary.testing`, may name those libraries: it is the layer above everything else).

Dask
    :func:`rotary.apply`, :func:`rotary.rotate`, :func:`rotary.convert_layout` and
    :func:`rotary.linear_attention` accept chunked Dask arrays directly and build lazy
    graphs with one task per block, keeping the chunks of the leading axes (see
    :mod:`rotary._backends`).  A feature (last) axis split into several chunks is merged
    into one chunk first (a rotation mixes features across the head), so results are
    always right.  Causal linear attention over a sequence split into chunks runs as
    a scan over the chunk summaries; :func:`causal_linear_attention_dask` is that
    path with the scan method exposed and NumPy inputs accepted.

JAX
    Under ``jax.jit``, :func:`rotary.apply` and :func:`rotary.linear_attention` on
    inputs sharded over batch, heads or (for ``apply`` and non-causal attention)
    sequence with a ``NamedSharding`` keep that sharding and gather no ``q``/``k``
    (non-causal attention over a sharded sequence all-reduces the small key/value
    summary, nothing else).  :func:`sequence_parallel_linear_attention` runs causal
    linear attention with the sequence split over a mesh axis: per-shard summaries,
    an exclusive scan of the summaries across shards (:func:`exclusive_state_scan`,
    ``log2(shards)`` rounds of ``collective-permute``), then local chunked attention
    from the incoming state.

torch.distributed (context parallelism)
    Each rank holds part of the sequence, contiguous or zig-zag (:data:`SHARDINGS`);
    :func:`shard_positions` gives its tokens' global positions and :func:`shard_sequence` its
    part of a whole sequence.  :func:`context_parallel_linear_attention` runs causal (or
    non-causal) RoPE linear attention across the ranks of a process group with one
    differentiable all-gather of the chunk summaries; :func:`exclusive_state_scan` takes a
    process group too.

One design for the three: every part of the sequence is summarised by its
:class:`~rotary.LinearAttentionState`, the summaries of the earlier parts are summed (a Dask
scan, a JAX collective scan, a torch all-gather), and each part runs the causal algorithm on its
own tokens from that state.  Queries, keys and values never move.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._backends import backend_for
from ._lib import _validation as chk  # (where v names the values)
from ._lib import _validation as v
from ._lib._compat import array_namespace, entry, is_array, library_name, not_an_array
from ._lib._typing import Array
from ._linear import LinearAttentionState, linear_attention, linear_attention_state

__all__ = [
    "SHARDINGS",
    "causal_linear_attention_dask",
    "context_parallel_linear_attention",
    "exclusive_state_scan",
    "sequence_parallel_linear_attention",
    "shard_positions",
    "shard_sequence",
]

_SCANS = ("sequential", "blelloch")

#: How a sequence is split over ``world`` ranks: ``"contiguous"`` (rank ``r`` holds tokens
#: ``[r n / w, (r + 1) n / w)``) or ``"zigzag"`` (the sequence cut into ``2 w`` chunks, rank ``r``
#: holding chunks ``r`` and ``2 w - 1 - r``: every rank gets the same causal work, as in
#: Transformer Engine and Megatron context parallelism).
SHARDINGS: tuple[str, ...] = ("contiguous", "zigzag")


def _chunks_of(rank: int, world: int, sharding: str) -> tuple[int, list[int]]:
    """``(number of chunks, the chunks rank holds, in order)``."""
    if sharding == "contiguous":
        return world, [rank]
    return 2 * world, [rank, 2 * world - 1 - rank]


def _check_shard(n: int, rank: Any, world: Any, sharding: str) -> tuple[int, int, str]:
    world = v.check_int(world, "world", minimum=1)
    rank = v.check_int(rank, "rank", minimum=0)
    if rank >= world:
        raise ValueError(f"rank must be below world={world}, got {rank}")
    sharding = v.check_choice(sharding, "sharding", SHARDINGS)
    parts = _chunks_of(rank, world, sharding)[0]
    if n % parts:
        raise ValueError(
            f"a sequence of {n} tokens does not split into {parts} equal chunks ({sharding}, world={world})"
        )
    return rank, world, sharding


@entry
def shard_positions(
    seq_len: int, *, rank: int, world: int, sharding: str = "contiguous", xp: Any = None, device: Any = None
) -> Array:
    """The global positions of the tokens ``rank`` holds of a sequence of ``seq_len`` split over
    ``world`` ranks (:data:`SHARDINGS`), in the order it holds them: pass them as ``pos=`` with
    the rank's q/k (NumPy by default; ``xp=``/``device=`` for another library).

    Examples
    --------
    >>> from rotary.distributed import shard_positions
    >>> shard_positions(8, rank=1, world=2).tolist()
    [4, 5, 6, 7]
    >>> shard_positions(8, rank=0, world=2, sharding="zigzag").tolist()   # chunks 0 and 3 of 4
    [0, 1, 6, 7]
    """
    import numpy as np

    n = v.check_int(seq_len, "seq_len", minimum=0)
    rank, world, sharding = _check_shard(n, rank, world, sharding)
    parts, mine = _chunks_of(rank, world, sharding)
    c = n // parts
    host = np.concatenate([np.arange(i * c, (i + 1) * c) for i in mine])
    if xp is None:
        return host
    from ._lib._compat import as_namespace

    xp = as_namespace(xp)
    return xp.asarray(host, device=device)


@entry
def shard_sequence(x: Array, *, rank: int, world: int, sharding: str = "contiguous", axis: int = -2) -> Array:
    """The part of a whole sequence (``axis``, default -2) that ``rank`` holds (:data:`SHARDINGS`):
    what each rank's data loader gives it.  Any array library.

    Examples
    --------
    >>> import numpy as np
    >>> from rotary.distributed import shard_sequence
    >>> shard_sequence(np.arange(8)[:, None], rank=1, world=2, sharding="zigzag", axis=0).ravel().tolist()
    [2, 3, 4, 5]
    """
    if not is_array(x):
        raise not_an_array("x", x)
    xp = array_namespace(x, names=("x",))
    ax = axis % x.ndim
    n = x.shape[ax]
    rank, world, sharding = _check_shard(n, rank, world, sharding)
    parts, mine = _chunks_of(rank, world, sharding)
    c = n // parts

    def part(i: int) -> Array:
        idx = tuple(slice(i * c, (i + 1) * c) if a == ax else slice(None) for a in range(x.ndim))
        return x[idx]

    pieces = [part(i) for i in mine]
    return pieces[0] if len(pieces) == 1 else xp.concat(pieces, axis=ax)


@entry
def causal_linear_attention_dask(
    q: Any,
    k: Any,
    v_: Any,
    pos: Any,
    *,
    chunks: int | None = None,
    scan: str = "sequential",
    return_state: bool = False,
    **kwargs: Any,
) -> Any:
    """Causal RoPE linear attention over a Dask sequence: a scan over chunk summaries.

    Each block of keys/values along the sequence axis (-2) is summarised by its
    :class:`~rotary.LinearAttentionState`; an exclusive prefix sum of these
    summaries gives every block the state of all earlier keys, and each block
    then runs the causal algorithm on its own tokens from that state.  No block is
    ever re-chunked into the whole sequence.  Same result as
    ``rotary.linear_attention(q, k, v, pos, causal=True)``.

    Parameters
    ----------
    q, k, v_ : array
        ``(..., N, d)``, ``(..., N, d)``, ``(..., N, d_v)``: Dask arrays, or NumPy
        arrays to be split into blocks of ``chunks`` tokens.
    pos : array or sequence or None
        Positions broadcast to ``q.shape[:-1]`` (a Dask array, or NumPy/sequence).
    chunks : int, optional
        Tokens per block for NumPy inputs (and for Dask inputs, re-chunk the
        sequence axis to it); default: keep Dask chunks, 4 blocks for NumPy.
    scan : {"sequential", "blelloch"}
        How the block summaries are prefix-summed (``dask.array.cumsum``):
        a chain of ``n - 1`` additions, or a work-efficient parallel scan of
        logarithmic depth (better with many blocks on many workers).
    return_state : bool
        Also return the state after all keys (lazy Dask arrays).
    **kwargs
        Any other option of :func:`rotary.linear_attention` (``rope``, ``feature_map``,
        ``similarity``, ``eps``, ``chunk_size``, ``state``, ``key_mask``).

    Returns
    -------
    out : dask.array.Array
        ``(..., N, d_v)``, lazy; with ``return_state``, ``(out, state)``.

    Examples
    --------
    >>> import numpy as np, rotary
    >>> from rotary.distributed import causal_linear_attention_dask
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = (rng.normal(size=(2, 32, 8)) for _ in range(3))
    >>> out = causal_linear_attention_dask(q, k, v, np.arange(32), chunks=8)
    >>> out.chunks
    ((2,), (8, 8, 8, 8), (8,))
    >>> ref = rotary.linear_attention(q, k, v, np.arange(32), causal=True)
    >>> bool(np.allclose(out.compute(), ref, rtol=1e-12, atol=1e-12))
    True
    """
    import dask.array as da

    scan = v.check_choice(scan, "scan", _SCANS)
    if kwargs.pop("causal", True) is not True:
        raise ValueError("causal_linear_attention_dask is causal; for causal=False use linear_attention")
    if chunks is not None:
        chunks = v.check_int(chunks, "chunks", minimum=1)
    arrays = []
    for name, a in (("q", q), ("k", k), ("v", v_)):
        if not is_array(a) or a.ndim < 2:
            raise ValueError(f"{name} must be an array of shape (..., seq, features), got {type(a).__name__}")
        if library_name(array_namespace(a, names=(name,))) != "dask":
            n = a.shape[-2]
            seq_chunks = (*a.shape[:-2], chunks or max(1, -(-n // 4)), a.shape[-1])
            a = da.from_array(a, chunks=seq_chunks)  # pyright: ignore[reportArgumentType]
        elif chunks is not None:
            a = a.rechunk({a.ndim - 2: chunks})
        arrays.append(a)
    mask = kwargs.get("key_mask")
    if mask is not None and library_name(array_namespace(mask)) != "dask":
        kwargs["key_mask"] = da.asarray(mask)
    be = backend_for(array_namespace(arrays[0]))
    from ._backends._dask import DaskBackend  # (loaded by backend_for: no import left to do)

    assert isinstance(be, DaskBackend)
    qd, kd, vd = arrays
    with be.scan_method(scan):
        return linear_attention(qd, kd, vd, pos, causal=True, return_state=return_state, **kwargs)


@entry
def exclusive_state_scan(state: LinearAttentionState, axis_name: Any) -> LinearAttentionState:
    """The sum of the states of all *earlier* shards: inside JAX's ``shard_map`` along the mesh
    axis ``axis_name`` (a string), or across the ranks of a ``torch.distributed`` process group
    (``axis_name`` the group, ``None`` for the default one; differentiable, see
    :func:`context_parallel_linear_attention`).

    Shard ``i`` gets ``state_0 + ... + state_{i-1}`` (shard 0 the zero state): one
    ``collective-permute`` to shift the states by one shard, then a Hillis-Steele
    scan of ``ceil(log2(n))`` ``collective-permute`` rounds.  Only the small
    ``(F, d_v)`` summaries travel, never queries or keys.  ``offset`` is summed the
    same way.

    Examples
    --------
    >>> import jax, numpy as np, rotary
    >>> from jax.sharding import AxisType, PartitionSpec as P
    >>> from rotary.distributed import exclusive_state_scan
    >>> mesh = jax.make_mesh((1,), ("seq",), axis_types=(AxisType.Auto,))
    >>> def f(k, v):
    ...     st = rotary.linear_attention_state(k, v, None)
    ...     return exclusive_state_scan(st, "seq").S
    >>> k = v = np.ones((4, 2), dtype=np.float32)
    >>> g = jax.shard_map(f, mesh=mesh, in_specs=(P("seq"), P("seq")), out_specs=P("seq"))
    >>> np.asarray(jax.jit(g)(k, v)).tolist()    # one shard: nothing comes before it
    [[0.0, 0.0], [0.0, 0.0]]
    """
    if not isinstance(state, tuple) or len(state) not in (3, 4, 5):
        raise TypeError("state must be a LinearAttentionState(S, z, offset)")
    if len(state) == 5 and state[4] is not None:
        raise ValueError(
            "exclusive_state_scan combines states by their decay; a state with a transition (the delta "
            "rule's or a/b's) is not served here yet: scan such states with rotary.combine"
        )
    if not isinstance(axis_name, str):  # a torch.distributed process group (None: the world)
        return _torch_prefixes([LinearAttentionState(*state)], axis_name, "contiguous")[0]
    import jax

    n = int(jax.lax.axis_size(axis_name))
    S, z, off = state[:3]
    ld = state[3] if len(state) >= 4 else None
    off = jax.numpy.asarray(off, dtype=jax.numpy.int32)
    if n == 1:
        return LinearAttentionState(
            S * 0, None if z is None else z * 0, off * 0, None if ld is None else ld * 0
        )
    # shard 0 gets zeros: the empty state (log-decay 0 keeps what comes after it whole)
    parts = LinearAttentionState(
        *jax.lax.ppermute((S, z, off, ld), axis_name, [(i, i + 1) for i in range(n - 1)])
    )
    d = 1
    while d < n:  # Hillis-Steele, in order: earlier + later (decay and documents combine in order)
        recv = jax.lax.ppermute(tuple(parts), axis_name, [(i, i + d) for i in range(n - d)])
        parts = LinearAttentionState(*recv) + parts
        d *= 2
    return parts


@entry
def sequence_parallel_linear_attention(
    q: Array,
    k: Array,
    v: Array,
    pos: Any,
    *,
    mesh: Any,
    axis_name: str,
    causal: bool = True,
    lead_axes: tuple[str | None, ...] | None = None,
    **kwargs: Any,
) -> Array:
    """RoPE linear attention with the sequence split over the mesh axis ``axis_name`` (JAX).

    Each shard summarises its keys/values (:func:`rotary.linear_attention_state`).
    Causal: an exclusive scan of the summaries across shards
    (:func:`exclusive_state_scan`) hands each shard the state of all earlier
    tokens, and the shard runs chunked causal attention on its own tokens from it.
    Non-causal: the summaries are summed across shards (``psum``) and every shard
    attends to the total.  Queries, keys and values never leave their shard.
    Matches ``rotary.linear_attention(q, k, v, pos, causal=causal)`` on one device.

    Parameters
    ----------
    q, k, v : jax.Array
        ``(..., N, d)``, ``(..., N, d)``, ``(..., N, d_v)`` with the same leading
        axes; ``N`` divisible by the size of ``axis_name``.
    pos : array or sequence or None
        Global positions broadcast to ``q.shape[:-1]`` (``None``: no rotation).
    mesh : jax.sharding.Mesh
        The device mesh.
    axis_name : str
        Mesh axis the sequence axis (-2) is split over.
    causal : bool
        Causal (default) or not.
    lead_axes : tuple of (str or None), optional
        Mesh axes for the leading (batch, head) axes, e.g. ``("data", None)``;
        default: not split.
    **kwargs
        Options of :func:`rotary.linear_attention` (``rope``, ``feature_map``,
        ``similarity``, ``eps``, ``chunk_size``).

    Returns
    -------
    jax.Array
        ``(..., N, d_v)``, split like ``q`` (sequence over ``axis_name``).  Call it
        under ``jax.jit``.

    Examples
    --------
    >>> import jax, numpy as np, rotary
    >>> from rotary.distributed import sequence_parallel_linear_attention
    >>> mesh = jax.make_mesh((len(jax.devices()),), ("seq",))
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = (np.asarray(rng.normal(size=(2, 16, 8)), dtype=np.float32) for _ in range(3))
    >>> f = jax.jit(lambda q, k, v: sequence_parallel_linear_attention(
    ...     q, k, v, np.arange(16), mesh=mesh, axis_name="seq"))
    >>> out = f(q, k, v)
    >>> ref = rotary.linear_attention(q, k, v, np.arange(16), causal=True)
    >>> bool(np.allclose(out, ref, atol=1e-5))
    True
    """
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    for bad in ("state", "return_state", "key_mask", "k_pos"):
        if bad in kwargs:
            raise TypeError(f"sequence_parallel_linear_attention does not take {bad}=")
    causal = chk.check_bool(causal, "causal")
    if not causal:
        _no_documents(kwargs, "sequence_parallel_linear_attention with causal=False")
    cu_seqlens, segment_ids = kwargs.pop("cu_seqlens", None), kwargs.pop("segment_ids", None)
    log_gate = kwargs.pop("log_gate", None)
    q, k, v = (jnp.asarray(a) for a in (q, k, v))
    if not (q.ndim == k.ndim == v.ndim >= 2):
        raise ValueError(
            f"q, k, v must have the same number of axes (..., seq, features), got shapes "
            f"{q.shape}, {k.shape}, {v.shape}"
        )
    if not (q.shape[-2] == k.shape[-2] == v.shape[-2]):
        raise ValueError(
            f"q, k and v must have the same sequence length, got {q.shape}, {k.shape}, {v.shape}"
        )
    if axis_name not in mesh.shape:
        raise ValueError(f"axis_name={axis_name!r} is not an axis of the mesh {dict(mesh.shape)}")
    n_shards = mesh.shape[axis_name]
    if q.shape[-2] % n_shards:
        raise ValueError(
            f"the sequence length {q.shape[-2]} is not divisible by the {n_shards} shards of mesh axis "
            f"{axis_name!r}"
        )
    nl = q.ndim - 2
    lead = tuple(lead_axes) if lead_axes is not None else (None,) * nl
    if len(lead) != nl:
        raise ValueError(
            f"lead_axes must give one mesh axis (or None) per leading axis ({nl}), got {lead_axes!r}"
        )
    spec = P(*lead, axis_name, None)
    sopts: dict[str, Any] = {n: kwargs[n] for n in ("rope", "feature_map", "similarity") if n in kwargs}

    if pos is not None:
        # Host positions are range-checked before JAX sees them (without x64, int64 would wrap).
        pos, _ = backend_for(jnp).positions(pos, name="pos", device=None)
        pos = jnp.broadcast_to(pos, (*(1,) * (nl + 1 - pos.ndim), *pos.shape)) if pos.ndim <= nl else pos
        if pos.ndim != nl + 1 or pos.shape[-1] not in (1, q.shape[-2]):
            raise ValueError(f"pos of shape {pos.shape} does not broadcast to q.shape[:-1] = {q.shape[:-1]}")
        pos = jnp.broadcast_to(pos, (*pos.shape[:-1], q.shape[-2]))
        pspec = P(*(a if pos.shape[i] != 1 else None for i, a in enumerate(lead)), axis_name)
    else:
        pos = jnp.zeros((0,), dtype=jnp.int32)  # placeholder, unused
        pspec = P(None)
    has_pos = pos.shape != (0,)
    # documents: the run of every token (global), split like the positions; gates likewise
    runs, rspec = _per_token(_global_runs(q, cu_seqlens, segment_ids), q, lead, axis_name, "segment_ids")
    gate, gspec = _per_token(log_gate, q, lead, axis_name, "log_gate")
    has_runs, has_gate = runs.shape != (0,), gate.shape != (0,)
    if kwargs.get("decay") is not None:  # (per head: every shard's, host values moved once)
        if is_array(kwargs["decay"]) and library_name(array_namespace(kwargs["decay"])) == "numpy":
            kwargs["decay"] = jnp.asarray(kwargs["decay"])
        sopts["decay"] = kwargs["decay"]

    def local(qb: Array, kb: Array, vb: Array, pb: Array, rb: Array, gb: Array) -> Array:
        p = pb if has_pos else None
        docs = {"segment_ids": rb} if has_runs else {}
        g = {"log_gate": gb} if has_gate else {}
        st = linear_attention_state(kb, vb, p, **sopts, **docs, **g)
        if causal:
            if has_runs:  # a document starting at this shard's first token forgets every earlier shard
                fresh = _starts_a_document(rb, axis_name)
                st = _forget_before(st, fresh)
            prefix = exclusive_state_scan(st, axis_name)
            if has_runs:
                prefix = _forget(prefix, fresh)
            return linear_attention(qb, kb, vb, p, causal=True, state=prefix, **kwargs, **docs, **g)
        total = LinearAttentionState(jax.lax.psum(st.S, axis_name), jax.lax.psum(st.z, axis_name), 0)
        kp0 = None if p is None else jnp.zeros((0,), dtype=jnp.int32)
        # no keys of its own: every shard attends to the total through state=
        return linear_attention(qb, kb[..., :0, :], vb[..., :0, :], p, k_pos=kp0, state=total, **kwargs)

    fn: Callable = jax.shard_map(
        local, mesh=mesh, in_specs=(spec, spec, spec, pspec, rspec, gspec), out_specs=spec
    )
    args = ((q, spec), (k, spec), (v, spec), (pos, pspec), (runs, rspec), (gate, gspec))
    return fn(*(_place(a, mesh, s) for a, s in args))


def _global_runs(q: Array, cu_seqlens: Any, segment_ids: Any) -> Any:
    """The run (document) of every token of the whole sequence, ``(..., N)``; ``None`` without
    documents (checked as :func:`rotary.linear_attention` checks them)."""
    import jax.numpy as jnp

    from ._packing import documents

    docs = documents(backend_for(jnp), q.shape[-2], cu_seqlens, segment_ids, q)
    return None if docs is None else docs.runs


def _per_token(x: Any, q: Array, lead: tuple[Any, ...], axis_name: str, name: str) -> tuple[Array, Any]:
    """A per-token array ``(..., N)`` (runs, gates) at the rank of ``q.shape[:-1]`` with its
    ``PartitionSpec`` (the sequence over ``axis_name``, leading axes of size 1 unsplit); a
    placeholder when ``x`` is ``None``."""
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    if x is None:
        return jnp.zeros((0,), dtype=jnp.int32), P(None)
    x = jnp.asarray(x)
    nl = q.ndim - 2
    if x.ndim < 1 or x.shape[-1] != q.shape[-2] or x.ndim > nl + 1:
        raise ValueError(f"{name} of shape {x.shape} does not match q's tokens (..., {q.shape[-2]})")
    x = jnp.reshape(x, (*(1,) * (nl + 1 - x.ndim), *x.shape))
    return x, P(*(a if x.shape[i] != 1 else None for i, a in enumerate(lead)), axis_name)


def _starts_a_document(runs: Array, axis_name: str) -> Array:
    """``(...)``: this shard's first token starts a document (its run differs from the previous
    shard's last token's; the first shard: nothing comes before it, so nothing is forgotten)."""
    import jax

    prev = jax.lax.ppermute(
        runs[..., -1], axis_name, [(i, i + 1) for i in range(int(jax.lax.axis_size(axis_name)) - 1)]
    )
    first = jax.lax.axis_index(axis_name) == 0
    return (runs[..., 0] != prev) & ~first


def _forget_before(st: LinearAttentionState, fresh: Array) -> LinearAttentionState:
    """``st`` combining with nothing before it where ``fresh`` (log-decay ``-inf``)."""
    import jax.numpy as jnp

    ld = jnp.zeros(st.S.shape[:-2], dtype=st.S.dtype) if st.log_decay is None else st.log_decay
    return st._replace(log_decay=jnp.where(fresh, -jnp.inf, ld))


def _forget(st: LinearAttentionState, fresh: Array) -> LinearAttentionState:
    """The empty state where ``fresh``: the tokens before a document's first one are not its."""
    import jax.numpy as jnp

    S = jnp.where(fresh[..., None, None], 0, st.S)
    z = None if st.z is None else jnp.where(fresh[..., None], 0, st.z)
    return st._replace(S=S, z=z)


def _rank_ids(q: Any, cu_seqlens: Any, segment_ids: Any, group: Any, sharding: str) -> Any:
    """This rank's per-token document ids ``(..., N_local)``: its own part of ``segment_ids``, or
    the runs of the global ``cu_seqlens`` at the tokens it holds; ``None`` without documents."""
    if cu_seqlens is None:
        if segment_ids is None:
            return None
        import torch

        return segment_ids if is_array(segment_ids) else torch.as_tensor(segment_ids, device=q.device)
    if segment_ids is not None:
        raise ValueError("pass cu_seqlens= or segment_ids=, not both (they say the same thing)")
    import torch
    import torch.distributed as dist

    from ._packing import documents

    rank, world = dist.get_rank(group), dist.get_world_size(group)
    parts, mine = _chunks_of(rank, world, sharding)
    n = q.shape[-2]
    total = n * world
    docs = documents(backend_for(array_namespace(q)), total, cu_seqlens, None, q)
    assert docs is not None
    runs = docs.runs
    c = total // parts
    return torch.cat([runs[i * c : (i + 1) * c] for i in mine])


def _no_documents(kwargs: dict[str, Any], name: str) -> None:
    """Non-causal attention over packed documents or with decay across shards is not served:
    each query would need its own document's keys from every shard, or the keys after it
    decayed towards it (a second, reversed scan), so it is refused rather than answered wrong."""
    for bad in ("cu_seqlens", "segment_ids", "decay", "log_gate"):
        if kwargs.get(bad) is not None:
            raise TypeError(
                f"{name} does not take {bad}= (a non-causal query needs its document's keys from "
                "every shard, and decay towards it from both sides): run rotary.linear_attention on "
                "the whole sequence; causal attention over shards takes documents and decay"
            )


def _place(x: Array, mesh: Any, spec: Any) -> Array:
    """``x`` laid out as ``spec`` says, where the mesh axes are Explicit (JAX's sharding in types).

    Auto axes need nothing: ``shard_map`` moves its inputs itself.
    """
    import jax
    from jax.sharding import AxisType, NamedSharding

    types = dict(zip(mesh.axis_names, getattr(mesh, "axis_types", ())))
    used = [n for a in spec if a is not None for n in (a if isinstance(a, tuple) else (a,))]
    if used and all(types.get(a) == AxisType.Explicit for a in used):
        return jax.reshard(x, NamedSharding(mesh, spec))
    return x


# -- torch.distributed: context parallelism ------------------------------------------------------
def _all_gather(x: Array, group: Any) -> Array:
    """``(world, *x.shape)``: ``x`` of every rank, differentiable (the backward sums the
    gradients of all ranks and keeps this rank's slice)."""
    import torch
    import torch.distributed as dist

    class _Gather(torch.autograd.Function):  # type: ignore[misc]
        @staticmethod
        def forward(ctx: Any, t: Array) -> Array:
            world = dist.get_world_size(group)
            out = [torch.empty_like(t) for _ in range(world)]
            dist.all_gather(out, t.contiguous(), group=group)
            return torch.stack(out)

        @staticmethod
        def backward(ctx: Any, g: Array) -> Array:
            g = g.contiguous()
            dist.all_reduce(g, group=group)
            return g[dist.get_rank(group)]

    return _Gather.apply(x)


def _gathered_chunks(states: list[LinearAttentionState], group: Any) -> Array:
    """Every rank's chunk states as one tensor ``(world, chunks per rank, ..., F*d_v + F)``: S
    and z packed, so that one collective moves them (and its backward runs once on every rank)."""
    import torch

    if any(s.z is None for s in states):
        raise ValueError("context parallelism needs normalised states (normalize=True)")
    packed = torch.stack([torch.cat([s.S.flatten(-2), s.z], dim=-1) for s in states])  # pyright: ignore[reportArgumentType]
    return _all_gather(packed, group)


def _unpacked(x: Array, like: LinearAttentionState, offset: Any) -> LinearAttentionState:
    f, dv = like.S.shape[-2], like.S.shape[-1]
    return LinearAttentionState(x[..., : f * dv].unflatten(-1, (f, dv)), x[..., f * dv :], offset)


def _torch_prefixes(
    states: list[LinearAttentionState], group: Any, sharding: str, ids: list[Any] | None = None
) -> list[LinearAttentionState]:
    """For each of this rank's chunk states (one, or two for ``"zigzag"``), the sum of the states
    of every chunk before it in the whole sequence (chunks of equal length); only the small
    ``(F, d_v)`` sums travel, in one all-gather.  Each prefix is a 0/1-weighted sum over all the
    gathered states, so every rank's backward takes part in the (collective) gradient exchange.

    With decay or documents (a ``log_decay``, or ``ids``: each chunk's per-token document ids),
    the earlier chunks combine in order (:class:`~rotary.LinearAttentionState` ``+``), a chunk
    whose first token starts a document forgets every chunk before it, and so does its prefix."""
    import torch
    import torch.distributed as dist

    if ids is not None or any(s.log_decay is not None for s in states):
        return _torch_ordered_prefixes(states, group, sharding, ids)
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    gathered = _gathered_chunks(states, group)
    chunk_id = torch.tensor(
        [_chunks_of(r, world, sharding)[1] for r in range(world)], device=gathered.device
    )  # (world, chunks per rank)
    out = []
    for c in _chunks_of(rank, world, sharding)[1]:
        w = (chunk_id < c).to(gathered.dtype)
        tot = (gathered * w.reshape(*w.shape, *(1,) * (gathered.ndim - 2))).sum(dim=(0, 1))
        out.append(_unpacked(tot, states[0], states[0].offset * c))
    return out


def _torch_ordered_prefixes(
    states: list[LinearAttentionState], group: Any, sharding: str, ids: list[Any] | None
) -> list[LinearAttentionState]:
    import torch
    import torch.distributed as dist

    rank, world = dist.get_rank(group), dist.get_world_size(group)
    like = states[0]
    lead = tuple(like.S.shape[:-2])
    with_ld = [
        s._replace(log_decay=torch.zeros(lead, dtype=s.S.dtype, device=s.S.device))
        if s.log_decay is None
        else s._replace(log_decay=torch.broadcast_to(s.log_decay, lead).to(s.S.dtype))
        for s in states
    ]
    packed = torch.stack(
        [torch.cat([s.S.flatten(-2), s.z, s.log_decay[..., None]], dim=-1) for s in with_ld]  # pyright: ignore
    )
    if any(s.z is None for s in states):
        raise ValueError("context parallelism needs normalised states (normalize=True)")
    gathered = _all_gather(packed, group)  # (world, chunks per rank, ..., F*d_v + F + 1)
    f, dv = like.S.shape[-2], like.S.shape[-1]
    by_chunk: dict[int, tuple[int, int]] = {}
    for r in range(world):
        for j, cid in enumerate(_chunks_of(r, world, sharding)[1]):
            by_chunk[cid] = (r, j)

    def state_of(cid: int) -> LinearAttentionState:
        r, j = by_chunk[cid]
        x = gathered[r, j]
        S = x[..., : f * dv].unflatten(-1, (f, dv))
        return LinearAttentionState(S, x[..., f * dv : -1], 0, x[..., -1])

    fresh: dict[int, Any] = {}
    if ids is not None:  # each chunk's first and last document id, from every rank (no gradient)
        ends = torch.stack([torch.stack([i[..., 0], i[..., -1]]) for i in ids])
        all_ends = [torch.empty_like(ends) for _ in range(world)]
        dist.all_gather(all_ends, ends.contiguous(), group=group)
        for cid in by_chunk:
            if cid:
                r, j = by_chunk[cid]
                pr, pj = by_chunk[cid - 1]
                fresh[cid] = all_ends[r][j][0] != all_ends[pr][pj][1]

    def forgetting(st: LinearAttentionState, cid: int) -> LinearAttentionState:
        if cid not in fresh:
            return st
        f_ = fresh[cid]
        return st._replace(log_decay=torch.where(f_, torch.full_like(st.log_decay, -torch.inf), st.log_decay))

    out = []
    for c in _chunks_of(rank, world, sharding)[1]:
        first = state_of(0)  # (in every prefix, times 0 where c == 0: every rank's backward is collective)
        acc = LinearAttentionState(first.S * 0, first.z * 0, 0, first.log_decay * 0)  # type: ignore[operator]  # pyright: ignore
        for j in range(c):
            acc = acc + forgetting(state_of(j), j)
        if c in fresh:
            keep = (~fresh[c]).to(acc.S.dtype)
            acc = acc._replace(S=acc.S * keep[..., None, None], z=acc.z * keep[..., None])  # pyright: ignore
        out.append(LinearAttentionState(acc.S, acc.z, like.offset * c, acc.log_decay))
    return out


@entry
def context_parallel_linear_attention(
    q: Array,
    k: Array,
    v: Array,
    pos: Any = None,
    *,
    group: Any = None,
    sharding: str = "contiguous",
    causal: bool = True,
    **kwargs: Any,
) -> Array:
    """RoPE linear attention with the sequence split over the ranks of a ``torch.distributed``
    process group (context parallelism): each rank passes its own part of q, k and v (see
    :func:`shard_sequence`) and of the positions (:func:`shard_positions`).

    Causal: every chunk is summarised (:func:`rotary.linear_attention_state`), one all-gather of
    the summaries (small ``(F, d_v)`` sums, never the sequence) gives each chunk the state of
    all earlier ones, and the rank runs chunked causal attention on its own tokens from it.
    ``sharding="zigzag"``: the rank holds chunks ``r`` and ``2 w - 1 - r`` (equal causal work per
    rank); its output is in the order it holds them.  Non-causal: the summaries are summed over
    the ranks.  Differentiable: gradients flow back across ranks through the summaries.  Same
    result as ``rotary.linear_attention`` on the whole sequence, up to the order of float sums.

    Parameters
    ----------
    q, k, v : torch.Tensor
        This rank's ``(..., N_local, d)``, ``(..., N_local, d)``, ``(..., N_local, d_v)``.
    pos : optional
        This rank's positions, broadcast to ``q.shape[:-1]`` (``None``: no rotation).
    group : optional
        The process group (default: the world).
    sharding : {"contiguous", "zigzag"}
        How the sequence is split (:data:`SHARDINGS`).
    causal : bool
        Causal (default) or not.
    **kwargs
        Options of :func:`rotary.linear_attention` (``rope``, ``feature_map``, ``similarity``,
        ``eps``, ``chunk_size``).
    """
    import torch.distributed as dist

    for bad in ("state", "return_state", "key_mask", "k_pos"):
        if bad in kwargs:
            raise TypeError(f"context_parallel_linear_attention does not take {bad}=")
    if not dist.is_initialized():
        raise RuntimeError(
            "context_parallel_linear_attention needs torch.distributed.init_process_group first"
        )
    sharding = chk.check_choice(sharding, "sharding", SHARDINGS)
    causal = chk.check_bool(causal, "causal")
    if not causal:
        _no_documents(kwargs, "context_parallel_linear_attention with causal=False")
    cu_seqlens, segment_ids = kwargs.pop("cu_seqlens", None), kwargs.pop("segment_ids", None)
    log_gate = kwargs.pop("log_gate", None)
    n = q.shape[-2]
    pieces = 2 if sharding == "zigzag" else 1
    if n % pieces or k.shape[-2] != n or v.shape[-2] != n:
        raise ValueError(
            f"q, k and v must hold the same {'even ' if pieces == 2 else ''}number of tokens (axis -2), "
            f"got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    c = n // pieces
    sopts = {key: kwargs[key] for key in ("rope", "feature_map", "similarity", "decay") if key in kwargs}
    ids = _rank_ids(q, cu_seqlens, segment_ids, group, sharding)

    def cut(x: Any, i: int, seq_axis: int = -2) -> Any:
        if x is None or pieces == 1:
            return x
        if not is_array(x):
            import numpy as np

            x = np.asarray(x)
        if seq_axis == -2:
            return x[..., i * c : (i + 1) * c, :]
        return x[..., i * c : (i + 1) * c] if x.shape[-1] != 1 else x

    chunks = [(cut(q, i), cut(k, i), cut(v, i), cut(pos, i, -1)) for i in range(pieces)]
    extra = [  # (each piece's documents and gates)
        {
            **({} if ids is None else {"segment_ids": cut(ids, i, -1)}),
            **({} if log_gate is None else {"log_gate": cut(log_gate, i, -1)}),
        }
        for i in range(pieces)
    ]
    states = [
        linear_attention_state(kc, vc, pc, **sopts, **x)
        for (_, kc, vc, pc), x in zip(chunks, extra, strict=True)
    ]
    if causal:
        prefixes = _torch_prefixes(
            states, group, sharding, None if ids is None else [x["segment_ids"] for x in extra]
        )
        outs = [
            linear_attention(qc, kc, vc, pc, causal=True, state=pre, **kwargs, **x)
            for (qc, kc, vc, pc), pre, x in zip(chunks, prefixes, extra, strict=True)
        ]
    else:
        total = _unpacked(_gathered_chunks(states, group).sum(dim=(0, 1)), states[0], 0)
        outs = []
        for qc, kc, vc, pc in chunks:
            kp0 = None if pc is None else pc[..., :0] if is_array(pc) else []
            outs.append(
                linear_attention(qc, kc[..., :0, :], vc[..., :0, :], pc, k_pos=kp0, state=total, **kwargs)
            )
    if len(outs) == 1:
        return outs[0]
    import torch

    return torch.cat(outs, dim=-2)
