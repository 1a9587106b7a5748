"""Beyond one machine: RoPE and RoPE linear attention on Dask and on sharded JAX.

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
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._backends import backend_for
from ._lib import _validation as v
from ._lib._compat import array_namespace, is_array, library_name
from ._lib._typing import Array
from ._linear_attention import LinearAttentionState, linear_attention, linear_attention_state

__all__ = [
    "causal_linear_attention_dask",
    "exclusive_state_scan",
    "sequence_parallel_linear_attention",
]

_SCANS = ("sequential", "blelloch")


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
        if library_name(array_namespace(a)) != "dask":
            n = a.shape[-2]
            seq_chunks = (*a.shape[:-2], chunks or max(1, -(-n // 4)), a.shape[-1])
            a = da.from_array(a, chunks=seq_chunks)  # pyright: ignore[reportArgumentType]
        elif chunks is not None:
            a = a.rechunk({a.ndim - 2: chunks})
        arrays.append(a)
    mask = kwargs.get("key_mask")
    if mask is not None and library_name(array_namespace(mask)) != "dask":
        kwargs["key_mask"] = da.asarray(mask)
    from ._backends._dask import DaskBackend

    be = backend_for(array_namespace(arrays[0]))
    assert isinstance(be, DaskBackend)
    qd, kd, vd = arrays
    with be.scan_method(scan):
        return linear_attention(qd, kd, vd, pos, causal=True, return_state=return_state, **kwargs)


def exclusive_state_scan(state: LinearAttentionState, axis_name: str) -> LinearAttentionState:
    """Inside ``shard_map``: the sum of the states of all *earlier* shards along ``axis_name``.

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
    import jax

    if not isinstance(state, tuple) or len(state) != 3:
        raise TypeError("state must be a LinearAttentionState(S, z, offset)")
    n = int(jax.lax.axis_size(axis_name))
    S, z, off = state
    off = jax.numpy.asarray(off, dtype=jax.numpy.int32)
    if n == 1:
        return LinearAttentionState(S * 0, z * 0, off * 0)
    parts = jax.lax.ppermute((S, z, off), axis_name, [(i, i + 1) for i in range(n - 1)])  # shard 0 gets 0
    d = 1
    while d < n:
        recv = jax.lax.ppermute(parts, axis_name, [(i, i + d) for i in range(n - d)])
        parts = tuple(a + b for a, b in zip(parts, recv))
        d *= 2
    return LinearAttentionState(*parts)


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
    sopts = {n: kwargs[n] for n in ("rope", "feature_map", "similarity") if n in kwargs}

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

    def local(qb: Array, kb: Array, vb: Array, pb: Array) -> Array:
        p = pb if has_pos else None
        st = linear_attention_state(kb, vb, p, **sopts)
        if causal:
            prefix = exclusive_state_scan(st, axis_name)
            return linear_attention(qb, kb, vb, p, causal=True, state=prefix, **kwargs)
        total = LinearAttentionState(jax.lax.psum(st.S, axis_name), jax.lax.psum(st.z, axis_name), 0)
        kp0 = None if p is None else jnp.zeros((0,), dtype=jnp.int32)
        # no keys of its own: every shard attends to the total through state=
        return linear_attention(qb, kb[..., :0, :], vb[..., :0, :], p, k_pos=kp0, state=total, **kwargs)

    fn: Callable = jax.shard_map(local, mesh=mesh, in_specs=(spec, spec, spec, pspec), out_specs=spec)
    return fn(*(_place(a, mesh, s) for a, s in ((q, spec), (k, spec), (v, spec), (pos, pspec))))


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
