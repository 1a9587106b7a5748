"""The generic backend: the array-API code every library runs, and the hooks a library may override.

A :class:`Backend` answers the questions that depend on the array library (can these
values be read now? may this array be cached? where do constants live?) and supplies the
few kernels a library can do better than the generic code: the rotation, the exact
angles' gathers, and the exclusive prefix sum of causal linear attention.  A fast path
computes exactly what the generic code here computes (same operations in the same order,
so the same bits); ``tests/test_fast_paths.py`` proves it through
:func:`rotary.fast_paths`.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, NamedTuple

import numpy as np

from .._lib import _validation as v
from .._lib._cache import fast_paths_enabled, get_or_build
from .._lib._compat import (
    Unreadable,
    capability,
    is_array,
    is_host_positions,
    is_lazy,
    is_sparse,
    is_writeable,
    library_name,
    not_an_array,
    to_numpy,
)
from .._lib._compat import device as _device
from .._lib._typing import Array, Device, DType, Layout, Namespace
from .._math import _angles, _linear
from .._math._rotation import rotate_pairs

__all__ = ["POSITION_TABLE_MAX", "Backend", "ConstantBuilder"]

Range = tuple[int, int]

#: Builds a device constant: ``build(config, kind, xp, device, dtype) -> array``.
ConstantBuilder = Callable[[Any, str, Namespace, Device, DType], Array]
#: :meth:`Backend.scan`'s ``place(shape, dtype, device)`` (``into``): a part's slice of the
#: output, or ``None``.
Into = Callable[[tuple[Any, ...], DType, Device], Array | None]

#: Concrete non-negative integer positions below this are looked up in a per-position table
#: (built once with the exact method, so the same bits); it grows by powers of two from 4096.
POSITION_TABLE_MAX = 1 << 15


#: What to do with a composite array where only plain ones are served (:meth:`Backend.check_plain`).
_PLAIN_HINTS = {
    "distributed tensor (DTensor)": (
        "Pass x.to_local() where each rank holds whole sequences (sharded on batch or heads), or "
        "x.full_tensor(); sequence parallelism: rotary.distributed.context_parallel_linear_attention"
    ),
    "masked array": (
        "Pass the data (x.filled(0)) with the mask as mask= (attention) or key_mask= (linear attention)"
    ),
    "masked tensor": (
        "Pass the data (x.to_tensor(0)) with the mask as mask= (attention) or key_mask= (linear attention)"
    ),
}


class Backend:
    """The array-API backend of one namespace ``xp`` (NumPy-like eager semantics)."""

    #: Arrays take slice assignment (an output can be filled chunk by chunk).
    writable = True
    #: Arrays are lazy graphs (Dask): nothing may be computed while validating.
    lazy = False

    def __init__(self, xp: Namespace) -> None:
        self.xp = xp
        self.name = library_name(xp)
        #: The namespace in cache keys: the namespace itself (a library may make several, each
        #: with its own array class: marray's ``masked_namespace``).
        self.key: Hashable = (self.name, xp)

    def __repr__(self) -> str:
        return f"<rotary backend {self.name}>"

    @property
    def values_readable(self) -> bool:
        """A library that cannot give data-dependent shapes builds graphs (cubed, JAX): its values
        are never read eagerly, whatever a probe of one array says.  Read at each call (a library
        may change it at run time: array-api-strict's flags)."""
        return bool(capability(self.xp, "data-dependent shapes", True))

    # -- devices and dtypes ------------------------------------------------------------------
    def creation_device(self, x: Array) -> Device:
        """The ``device=`` for arrays created to sit beside ``x``."""
        return _device(x)

    def float_dtypes(self, device: Device) -> set[str]:
        try:
            return set(self.xp.__array_namespace_info__().dtypes(device=device, kind="real floating"))
        except Exception:
            return {"float32", "float64"} if hasattr(self.xp, "float64") else {"float32"}

    def has_float64(self, device: Device) -> bool:
        return "float64" in self.float_dtypes(device)

    def has_int64(self, device: Device) -> bool:
        try:
            return "int64" in self.xp.__array_namespace_info__().dtypes(device=device, kind="signed integer")
        except Exception:
            return hasattr(self.xp, "int64")

    def searchsorted_ok(self, device: Device) -> bool:
        """``searchsorted`` can run here: the default index dtype it returns exists on the
        device (else the documents of ``cu_seqlens`` are found by a comparison per document)."""
        return self.has_int64(device)

    def widest_float(self, device: Device) -> DType:
        return self.xp.float64 if self.has_float64(device) else self.xp.float32

    def compute_dtype(self, dtype: DType) -> DType:
        """Internal math in float64 for float64 data, else float32."""
        xp = self.xp
        # (by name: a NumPy float64 of either byte order is float64)
        return xp.float64 if hasattr(xp, "float64") and v.dtype_name(dtype) == "float64" else xp.float32

    def check_dense(self, arrays: list[tuple[str, Array]]) -> None:
        """The named arrays are dense (strided), not sparse (pydata ``sparse``: a ``TypeError``)."""
        for name, a in arrays:
            if is_sparse(a):
                raise v.not_dense(name, f"{type(a).__name__} (pydata sparse)", ".todense()")

    def composite(self, x: Array) -> str | None:
        """What ``x`` is, where it is an array made of parts that rotary serves part by part (the
        rotations, :meth:`rotate` and :meth:`map_heads`): torch's DTensor (a shard per rank),
        NumPy's masked arrays (data and mask); ``None`` for a plain array."""
        return None

    def check_plain(self, arrays: list[tuple[str, Array]], what: str) -> None:
        """``what`` (a computation summing over the sequence) takes no composite array
        (:meth:`composite`): a ``TypeError`` naming it and what to do."""
        for name, a in arrays:
            kind = self.composite(a)
            if kind is not None:
                raise TypeError(
                    f"{name} is a {kind}: {what} sums over the sequence, which rotary serves for plain "
                    f"arrays only (rotate, apply and convert_layout serve a {kind} part by part). "
                    + _PLAIN_HINTS.get(kind, "")
                )

    def check_devices(self, arrays: list[tuple[str, Array]]) -> None:
        """The named arrays share one device (``ValueError`` naming them otherwise)."""
        v.check_same_device([(n, _device(a)) for n, a in arrays])

    # -- fast paths ----------------------------------------------------------------------------
    def fast(self, *inputs: Any, grads: tuple[Any, ...] = ()) -> bool:
        """May a fast path run on ``inputs`` here?  Each library's one eligibility test, an
        allowlist of the arrays and contexts where its fast paths are proven to compute the
        generic code's result (``tests/test_fast_paths.py``, ``tests/test_transforms.py``);
        ``grads``: inputs autograd may record because the fast path provides their gradient.
        Here: :func:`rotary.fast_paths` on, outside a trace (the generic fast paths read
        position values)."""
        return fast_paths_enabled() and not self.tracing()

    # -- values --------------------------------------------------------------------------------
    def is_concrete(self, x: Array) -> bool:
        """``x``'s values can be read now, cheaply and without breaking a trace: never for a lazy
        array (``array_api_compat.is_lazy_array``: Dask, ndonnx, JAX) or a library that cannot
        give data-dependent shapes (cubed); there rotary behaves as under a trace (values
        unchecked, no value-dependent fast path)."""
        return self.values_readable and not is_lazy(x)

    def readable_values(self, x: Array) -> np.ndarray | None:
        """Host values of ``x`` where they can be read now (:meth:`is_concrete`, and a way to
        the host exists: DLPack or a numeric ``__array__``), for checks that are skipped
        otherwise, as under a trace; ``None`` where they cannot."""
        if not self.is_concrete(x):
            return None
        try:
            return np.asarray(self.host_values(x))
        except Unreadable:
            return None

    def value_range(self, x: Array) -> tuple[float, float] | None:
        """The smallest and the largest value of a non-empty real ``x`` as Python floats (NaN in
        both where ``x`` holds a NaN), where :meth:`readable_values` can read them; ``None``
        where it cannot (or ``x`` is empty).  A range that passes a check passes it for every
        value; one that fails sends the caller to the values themselves."""
        h = self.readable_values(x)
        if h is None or not h.size:
            return None
        return float(np.minimum.reduce(h, axis=None)), float(np.maximum.reduce(h, axis=None))

    def tracing(self) -> bool:
        """A trace (``jax.jit``, ``torch.compile``) is being recorded: nothing may be built
        for the cache from traced operations."""
        return False

    def jagged(self, x: Any) -> Jagged | None:
        """``x`` as the flat values of a nested (jagged) array and where its documents start, or
        ``None``: not nested (a library with nested arrays overrides it)."""
        return None

    def jagged_positions(self, j: Jagged, pos: Any, name: str, x_name: str) -> Array:
        """Positions for the values of the nested ``x_name`` (``j``): ``pos`` a nested array of the
        same documents (its values), or ``None`` (0 at every document's first token); shaped to
        broadcast against ``j.values.shape[:-1]``."""
        xp = self.xp
        nv = j.values.ndim
        a = nv + j.axis  # the token axis
        if pos is None:
            from .._math import _documents

            dev = self.creation_device(j.values)
            dt = xp.int64 if self.has_int64(dev) else xp.int32
            offsets = j.offsets if j.offsets.dtype == dt else xp.astype(j.offsets, dt)
            runs = _documents.runs_from_cu_seqlens(
                offsets, j.values.shape[a], xp, dev, dt, self.has_int64(dev)
            )
            flat = _documents.positions_in_runs(runs, xp)
        else:
            jp = self.jagged(pos)
            if jp is None:
                raise TypeError(
                    f"{x_name} is nested: {name} must be nested too (one position per token, the same "
                    f"documents), or None (each document from position 0)"
                )
            self.check_same_documents(j, jp, x_name, name)
            flat = jp.values
            v.check_nested_positions(tuple(flat.shape), name)
        return xp.reshape(flat, (flat.shape[0], *(1,) * (nv - 2 - a)))

    def check_same_documents(self, a: Jagged, b: Jagged, a_name: str, b_name: str) -> None:
        """Two nested arrays hold the same documents (their offsets agree where they can be read)."""
        ha, hb = self.readable_values(a.offsets), self.readable_values(b.offsets)
        if ha is None or hb is None:
            return
        if ha.shape != hb.shape or (ha != hb).any():
            raise ValueError(
                f"{a_name} and {b_name} hold different documents (offsets {ha.tolist()} and {hb.tolist()}): "
                "nested arrays of one packed sequence must share their offsets"
            )

    def sizes_symbolic(self) -> bool:
        """Sizes may be symbolic while they look like Python ints (``torch.compile``): a size
        may then be compared only where a guard on it is wanted."""
        return False

    def few_rows(
        self, key: Hashable, make: Callable[[Device, int], tuple[Any, int]], x: Array, pos: Array, rows: int
    ) -> tuple[Array, Array] | None:
        """A decoding step's fast path: for a few non-negative integer positions ``(batch, seq)``
        in one block ``[start, start + rows)`` (``start`` a multiple of ``rows``), the rows of the
        two tables ``make(device, start)`` builds for the block's positions (``(rows, width)``
        each, kept in the byte cache under ``key``, the device and ``start``: a long context
        decodes block after block); ``None`` where the backend has no such path or the arguments
        are not on its allowlist (the caller's generic code runs)."""
        return None

    def owned(self, x: Array) -> Array:
        """``x``, or a copy where it may be a view of a larger buffer rotary made (what a caller
        keeps, a KV cache, ``torch.save``, must not keep or write the rest).  A library whose
        buffers rotary cannot see gets a copy (lazy graphs and immutable JAX arrays: ``x``);
        NumPy and torch copy only views of larger buffers."""
        return x if self.lazy else self.xp.asarray(x, copy=True)

    def host_values(self, x: Array) -> np.ndarray:
        """A host NumPy view or copy of concrete ``x``."""
        return to_numpy(x)

    # -- positions -----------------------------------------------------------------------------
    def signature(self, *args: Any) -> Hashable | None:
        """A hashable summary of the arguments' types, shapes, dtypes and devices, where the
        backend can form one cheaply (eager arrays); ``None`` otherwise.  Checks that depend on
        nothing else are done once per signature."""
        return None

    def position_shape(self, pos: Any, *, name: str) -> tuple[Any, ...]:
        """Check the type and dtype of positions ``pos`` (without converting them); their shape."""
        if is_array(pos) and library_name_of(pos, name) == self.name:
            v.check_position_dtype(pos.dtype, self.xp, name)
            return tuple(pos.shape)
        if is_host_positions(pos):
            return tuple(_host_positions(pos, name).shape)
        if not is_array(pos):
            raise not_an_array(name, pos, "positions: an array, a number or a sequence of numbers")
        raise TypeError(
            f"{name} is a {type(pos).__module__}.{type(pos).__name__} but the data are {self.name} "
            f"arrays; pass positions of the same library, a NumPy array or a Python sequence"
        )

    def positions(self, pos: Any, *, name: str, device: Device) -> tuple[Array, tuple[int, int] | None]:
        """``pos`` (checked by :meth:`position_shape`) as an array of this namespace on
        ``device``, and ``(min, max)`` of its values when they are concrete integers.

        Host positions (Python values, NumPy arrays) are checked on the host and converted;
        arrays of this namespace are checked where their values are concrete (see
        :meth:`is_concrete`).  Values: finite, ``|p| < 2**36``.
        """
        if is_host_positions(pos) and not (self.name == "numpy" and is_array(pos)):
            host = _host_positions(pos, name)
            rng = _check_host(host, name)
            return self._from_host(host, rng, name=name, device=device), rng
        values = self.readable_values(pos)
        return pos, (None if values is None else _check_host(values, name))

    def _from_host(
        self, host: np.ndarray, rng: tuple[int, int] | None, *, name: str, device: Device
    ) -> Array:
        xp = self.xp
        if host.dtype.kind in "iu":
            if self.has_int64(device):
                dt = xp.int64
            elif rng is None or (-(2**31) <= rng[0] and rng[1] < 2**31):
                dt = xp.int32
            else:
                raise v.positions_too_wide(name, rng[1] if rng[1] >= 2**31 else rng[0], self.name)
            return self.to_device(host.astype(np.int64), dt, device)
        wide = self.widest_float(device)
        if wide != xp.float64:
            h32 = host.astype(np.float32)
            if not np.array_equal(h32.astype(np.float64), host.astype(np.float64)):
                raise ValueError(
                    f"{name} holds floating positions that float32 cannot represent exactly and this "
                    f"device has no float64; pass integer positions, or values exact in float32"
                )
            return self.to_device(h32, xp.float32, device)
        return self.to_device(host.astype(np.float64), xp.float64, device)

    def to_device(self, host: np.ndarray, dtype: DType, device: Device) -> Array:
        """Host values as an array of this namespace (an explicit transfer where the library
        tells explicit from implicit ones)."""
        return self.xp.asarray(host, dtype=dtype, device=device)

    # -- constants -----------------------------------------------------------------------------
    def constant(
        self, build: ConstantBuilder, config: Hashable, kind: str, device: Device, dtype: DType
    ) -> Array:
        """``build(config, kind, xp, device, dtype)``, cached in the one cache."""
        key = (config, kind, self.key, device, dtype)
        return get_or_build(key, lambda: sized(build(config, kind, self.xp, device, dtype)), "constants")

    def eager(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` run for real, even inside a trace (``torch.compile`` sees the result
        as a constant); ``fn`` must return plain values (strings, numbers, tuples of them), an
        array, or a NumPy array (host values: a nested list under ``torch.compile``), and its
        arguments be plain values or frozen dataclasses of them."""
        return fn(*args)

    # -- kernels -------------------------------------------------------------------------------
    def map_positions(
        self, kernel: Callable[[Array, Array], Array], x: Array, pos: Array, *, name: str, pos_name: str
    ) -> Array:
        """``kernel(x, pos)``; lazy backends run it block by block."""
        return kernel(x, pos)

    def map_heads(self, kernel: Callable[[Array], Array], x: Array, *, axis: int, head_dim: int) -> Array:
        """``kernel(x)``; lazy backends run it on blocks of whole heads along ``axis``."""
        return kernel(x)

    def polar(self, angles: Array) -> Array:
        """``cos(angles) + i sin(angles)`` as the library forms it (torch: ``torch.polar``, whose
        rounding Hugging Face's complex RoPEs return; here the standard's functions)."""
        xp = self.xp
        z = xp.complex128 if angles.dtype == xp.float64 else xp.complex64
        return xp.astype(xp.cos(angles), z) + xp.astype(xp.sin(angles), z) * 1j

    def materialize(self, c: Array, s: Array) -> tuple[Array, Array]:
        """cos/sin computed once, before the rotation reads them (a compiler may otherwise fuse
        their computation into every element of q and k, once per head)."""
        return c, s

    def rotate(self, x: Array, c: Array, s: Array, *, layout: Layout, rotary_dim: int) -> Array:
        """The rotation of the first ``rotary_dim`` features of ``x`` by the pairs' cos/sin."""
        return rotate_pairs(x, c, s, layout=layout, rotary_dim=rotary_dim, xp=self.xp)

    def rotate_both(
        self, q: Array, k: Array, c: Array, s: Array, *, layout: Layout, rotary_dim: int
    ) -> tuple[Array, Array]:
        """:meth:`rotate` of ``q`` and ``k`` by the same cos/sin (a library may share work)."""
        return (
            self.rotate(q, c, s, layout=layout, rotary_dim=rotary_dim),
            self.rotate(k, c, s, layout=layout, rotary_dim=rotary_dim),
        )

    def exact_cos_sin(
        self,
        pos: Array,
        build: ConstantBuilder,
        config: Hashable,
        *,
        device: Device,
        dtype: DType,
        rng: tuple[int, int] | None,
    ) -> tuple[Array, Array]:
        """Exact cos/sin of ``config``'s angles at ``pos`` (its ``"tables"`` and ``"inv_freq"``
        constants from ``build``).  Concrete non-negative integer positions take the
        per-position table, or skip the digit levels and the sign they do not need (same bits)."""
        levels, nonneg = _angles.LEVELS, False
        if rng is not None and rng[0] >= 0 and self.fast(pos):
            hi = rng[1]
            if hi < POSITION_TABLE_MAX:
                return self._table_lookup(pos, build, config, device, dtype, rng)
            levels, nonneg = _angles.levels_for_range(hi), True
        tables = self.constant(build, config, "tables", device, dtype)
        w = self.constant(build, config, "inv_freq", device, dtype)
        return self._exact(pos, tables, w, dtype, levels, nonneg, checked=rng is not None)

    def _exact(
        self, pos: Array, tables: Array, w: Array, dtype: DType, levels: int, nonneg: bool, *, checked: bool
    ) -> tuple[Array, Array]:
        """The generic exact method (a library's fast path overrides it)."""
        return _angles.exact_cos_sin(
            pos,
            tables,
            w,
            xp=self.xp,
            dtype=dtype,
            levels=levels,
            nonneg=nonneg,
            checked=checked,
            wide_int=self.has_int64(self.creation_device(pos)),
            take=self._take_rows,
        )

    def _table_lookup(
        self,
        pos: Array,
        build: ConstantBuilder,
        config: Hashable,
        dev: Device,
        dtype: DType,
        rng: tuple[int, int],
    ) -> tuple[Array, Array]:
        """cos/sin of positions ``0 <= lo <= pos <= hi`` (``rng``) from the per-position table."""
        xp = self.xp
        hi = rng[1]
        table = self.position_table(build, config, dev, dtype, hi)
        n = table.shape[1] // 2
        # (a gather, never a view of the table: what is returned here may reach the caller, and
        # the table is shared by every later call)
        t = self._take_rows(table, pos if pos.ndim == 1 else xp.reshape(pos, (-1,)))
        c, s = t[:, :n], t[:, n:]
        if pos.ndim != 1:
            c, s = xp.reshape(c, (*pos.shape, n)), xp.reshape(s, (*pos.shape, n))
        return c, s

    def position_table(
        self, build: ConstantBuilder, config: Hashable, dev: Device, dtype: DType, hi: int
    ) -> Array:
        """``(rows, 2 n)``: cos then sin of positions ``0 .. rows - 1 >= hi`` (``rows`` a power of
        two from 4096), one contiguous row per position, built once with the exact method."""
        xp = self.xp
        rows = 4096
        while rows <= hi:
            rows *= 2

        def make() -> tuple[Array, int]:
            tables = self.constant(build, config, "tables", dev, dtype)
            w = self.constant(build, config, "inv_freq", dev, dtype)
            idx = xp.arange(rows, device=dev)
            c, s = self._exact(idx, tables, w, dtype, _angles.levels_for_range(rows - 1), True, checked=True)
            table = xp.concat([c, s], axis=1)  # (rows, 2 n): one contiguous row per position
            return sized(table)

        return get_or_build((config, "position_table", rows, self.key, dev, dtype), make, "position_table")

    def fused_rope(
        self,
        build: ConstantBuilder,
        config: Hashable,
        q: Array,
        k: Array | None,
        pos: Array,
        *,
        layout: Layout,
        rotary_dim: int,
        exact: bool,
        af: float,
    ) -> tuple[Array, Array] | None:
        """``q`` and ``k`` (``None``: ``q`` alone) rotated at positions ``pos`` by ``config``'s
        static angles in one fused kernel (its ``"tables"`` or ``"float32_inv"`` constant from
        ``build``), computing the generic code's bits; ``None`` where the library has no such
        kernel for these arguments."""
        return None

    def wants_custom_grad(self, xs: tuple[Array, ...], others: tuple[Any, ...]) -> bool:
        """Eager autodiff records the data ``xs`` and :meth:`custom_grad` may replace it: a fast
        path (:meth:`fast`) for the data, and none of ``others`` (positions, ...) needs a gradient."""
        return False

    def custom_grad(
        self,
        forward: Callable[..., tuple[Array, ...]],
        backward: Callable[..., tuple[Array, ...]],
        *xs: Array,
    ) -> tuple[Array, ...]:
        """``forward(*xs)``, whose gradient with respect to ``xs`` is ``backward(*grads)`` (a
        linear map's transpose): autodiff keeps ``backward``'s closure (positions), not the
        intermediates of ``forward`` (cos/sin)."""
        return forward(*xs)

    def negated(self, p: Array) -> Array:
        """``-p`` for positions (unsigned integers widened first)."""
        xp = self.xp
        if v.is_integral(p.dtype) and xp.iinfo(p.dtype).min == 0:
            p = xp.astype(p, xp.int64 if self.has_int64(self.creation_device(p)) else xp.int32)
        return -p

    def decode_plan(
        self,
        build: ConstantBuilder,
        config: Hashable,
        q: Array,
        k: Array,
        pos: Any,
        *,
        layout: Layout,
        rotary_dim: int,
    ) -> Callable[[Array, Array, Any], tuple[Array, Array] | None] | None:
        """A shortcut for rotating arguments like ``q, k, pos`` (their types, shapes, dtypes and
        devices checked) by ``config``'s exact angles, computing the same bits; it returns
        ``None`` for values it does not cover.  ``None``: no shortcut (the generic steps are it)."""
        return None

    def decode_position(self, pos: Any) -> int | None:
        """The one position of a decoding step as a Python int: an ``int``, a list or tuple of
        one ``int``, a NumPy integer or integer array of one element (a library's own array where
        the backend reads one); ``None`` for anything else.  Read eagerly: only where
        :meth:`fast` allows."""
        t = type(pos)
        if t is int:
            return pos
        if t is list or t is tuple:
            return pos[0] if len(pos) == 1 and type(pos[0]) is int else None
        if t is np.ndarray:
            return int(pos.item()) if pos.size == 1 and pos.dtype.kind in "iu" else None
        if isinstance(pos, np.integer):
            return int(pos)
        return None

    def decode_rows(
        self, build: ConstantBuilder, config: Hashable, q: Array, k: Array, *, layout: Layout, rotary_dim: int
    ) -> Callable[[int], Any] | None:
        """For decoding steps' own kernels on arguments like ``q`` and ``k``: ``rows(p)``, the
        rows of ``config``'s exact rotation at a Python position ``0 <= p <``
        :data:`POSITION_TABLE_MAX` in this backend's form (from the per-position table: the
        generic code's bits), read from the byte cache at each call.  ``None``: no such kernel."""
        return None

    def segment_add(self, acc: Array, x: Array, ids: Array) -> Array:
        """``acc`` ``(..., n, K)`` plus the rows of ``x`` ``(..., T, K)`` added at rows ``ids``
        ``(T,)`` (sorted, in ``[0, n)``); ``acc`` is the caller's own (it may be updated in
        place).  Here a one-hot matrix product (the array API has no scatter): ``n x T x K``;
        the libraries with a scatter override it (``T x K``)."""
        xp = self.xp
        n = acc.shape[-2]
        onehot = xp.astype(ids[None, :] == xp.arange(n, device=self.creation_device(ids))[:, None], x.dtype)
        return acc + xp.matmul(onehot, x)

    def cumsum(self, x: Array, axis: int) -> Array:
        """The cumulative sum along ``axis``, in ``x``'s dtype (a library's own where the
        namespace's wraps it)."""
        return self.xp.cumulative_sum(x, axis=axis, dtype=x.dtype)

    def plain_block(
        self,
        ch: _linear.Chunk,
        carry: _linear.Carry | None,
        size: int,
        m: int,
        plan: _linear.Plan,
        out_dtype: DType | None,
        *,
        doc: Any = None,
        uniform: bool = False,
        strict: bool = False,
        divided: bool = True,
    ) -> tuple[Any, _linear.Carry] | None:
        """:func:`rotary._math._linear.block_causal` of ``m`` whole chunks of ``size`` without decay
        (``m`` a plain int up to its one-product bound; ``doc``: the documents' ids per token, or
        ``None``; ``uniform``: they are one document, the carry's, :meth:`one_document`), where a
        library has a fast path with the same bits; ``None``: the generic code."""
        return None

    def plain_attend(
        self, a: Array, c: Array | None, st: _linear.State, plan: _linear.Plan, out_dtype: DType, place: Into
    ) -> Array | None:
        """:func:`rotary._math._linear.attend` (non-causal queries against a whole state) written
        into ``place``'s slice of the output (:meth:`scan`'s ``into``) where a library has a fast
        path with the same bits; ``None``: the generic code."""
        return None

    def one_document(self, doc: Array, carried: Array | None) -> bool:
        """Every token of a part in one document per row (``doc``: ``(..., T)`` ids), the one its
        carry belongs to (``carried``: ``None``, or the carry's ids): read where a library's fast
        path may run (:meth:`plain_block`); ``False`` elsewhere."""
        return False

    def features(self, x: Array, plan: _linear.Plan) -> Array:
        """:func:`rotary._math._linear.features` (a library's fast path overrides it)."""
        return _linear.features(x, plan, self.xp)

    def query_features(self, x: Array, plan: _linear.Plan) -> Array:
        """:func:`rotary._math._linear.query_features` (a library's fast path overrides it)."""
        return _linear.query_features(x, plan, self.xp)

    def linear_step(
        self, feature_map: str, eps: float, rows: Callable[[int], Any] | None, like: tuple[Array, ...]
    ) -> Callable[..., tuple[Array, ...] | None] | None:
        """A shortcut for decoding steps of linear attention on arrays of the types, shapes,
        dtypes and devices of ``like`` (``q, k, v, S, z``): ``step(q, k, v, pos, S, z) -> (out,
        S, z)`` for one token, its features rotated by :meth:`decode_rows`'s ``rows`` at the
        position ``pos`` (``rows=None``: no rotation, ``pos`` unread), or ``None`` where it
        does not cover the values or the context (the generic step).  ``None``: no shortcut."""
        return None

    def recurrent_step(self, fam: Any, plan: Any) -> Callable[..., Any] | None:
        """A shortcut for decoding steps of linear attention's recurrent families (see the torch
        backend's), or ``None``: the generic step."""
        return None

    def _take_rows(self, table: Array, idx: Array) -> Array:
        return self.xp.take(table, idx, axis=0)

    def scan(
        self,
        body: Callable[..., tuple[Any, Array | None]],
        carry: Any,
        src: _linear.Source,
        *,
        n: Any,
        block: int,
        additive: bool = False,
        sequential: bool = False,
        into: bool = False,
    ) -> tuple[Any, Array | None]:
        """Stream the sequence of ``src`` (``n`` tokens) through ``body(carry, part) -> (carry,
        out)`` in parts of ``block`` tokens, in order: the working memory is one part's, whatever
        the length.  ``out`` is the part's output (sequence axis -2, or ``None``); returns the
        last carry and the outputs joined.  Here a Python loop writing into one output; the whole
        sequence at once where :meth:`_loop_free` (a trace sees no loop over the sequence).
        ``additive``: the carry after a part is the carry before it plus the part's own (no
        decay), which a backend may use to run the parts in parallel (Dask); ``sequential``: the
        body loops over its part's chunks, so it gets parts even where the library could take the
        whole sequence at once (a trace then specialises on the length).  ``into``: the body
        takes a third argument, ``place(shape, dtype, device)``, which gives the part's slice of
        the one output to write its result into (it then returns that slice), or ``None``."""
        if n is None or (self._loop_free(n) and not sequential) or n <= block:
            return body(carry, src)
        xp = self.xp
        writes = self.writable and self.values_readable
        outs: list[Array] = []  # (outputs joined at the end, where none is written in place)
        out: Array | None = None  # (the one output, written part by part)

        def fits(buf: Array, shape: tuple[Any, ...], dtype: DType) -> bool:
            return (
                buf.dtype == dtype
                and tuple(buf.shape[:-2]) == tuple(shape[:-2])
                and buf.shape[-1] == shape[-1]
            )

        for start in range(0, n, block):
            stop = min(start + block, n)
            given: list[Array] = []
            if into:

                def place(
                    shape: tuple[Any, ...],
                    dtype: DType,
                    device: Device,
                    start: int = start,
                    stop: int = stop,
                    given: list[Array] = given,
                ) -> Array | None:  # (an Into)
                    nonlocal out
                    if not writes or outs or shape[-2] != stop - start:
                        return None
                    buf = (
                        xp.empty((*shape[:-2], n, shape[-1]), dtype=dtype, device=device)
                        if out is None
                        else out
                    )
                    out = buf
                    if not fits(buf, shape, dtype):
                        return None
                    given.append(buf[..., start:stop, :])
                    return given[-1]

                carry, o = body(carry, src.take(start, stop, n), place)
            else:
                carry, o = body(carry, src.take(start, stop, n))
            if o is None or (given and o is given[-1]):
                continue
            # (written into one output only where a fast path may run, a batched or dual array
            # cannot be written into a plain array, and for an eager writeable library: a graph
            # library such as cubed takes no item assignment, whatever a probe says)
            if (
                not outs
                and writes
                and is_writeable(o)
                and self.fast(o)
                and (out is None or fits(out, o.shape, o.dtype))
            ):
                buf = (
                    xp.empty((*o.shape[:-2], n, o.shape[-1]), dtype=o.dtype, device=self.creation_device(o))
                    if out is None
                    else out
                )
                buf[..., start:stop, :] = o
                out = buf
                continue
            if out is not None:  # (the parts written so far, then the rest joined)
                outs.append(out[..., :start, :])
                out = None
            outs.append(o)
        if outs:
            return carry, outs[0] if len(outs) == 1 else xp.concat(outs, axis=-2)
        return carry, out

    def _loop_free(self, n: Any) -> bool:
        """:meth:`causal_scan` of ``n`` tokens runs loop-free (:mod:`._scan`): a trace
        sees no Python loop over the sequence."""
        return False

    def jit_eagerly(self) -> bool:
        """Eager calls run as one compiled program (:meth:`jit`): JAX outside a trace, where
        op-by-op execution would move every Python scalar to the device."""
        return False

    def jit(self, fn: Callable[..., Any], static_argnums: tuple[int, ...]) -> Callable[..., Any]:
        """``fn`` compiled once per static configuration where the library has a compiler
        that pays off eagerly (JAX); else ``fn``."""
        return fn


def _carry_fits(carry: Any, lead: tuple[Any, ...], normalized: bool) -> bool:
    """A carry of exactly these leading axes, with ``z`` where the block is normalised."""
    return (
        tuple(carry.S.shape[:-2]) == lead
        and (carry.z is not None) == normalized
        and (carry.z is None or tuple(carry.z.shape[:-1]) == lead)
        and getattr(carry, "doc", None) is None
    )


class Jagged(NamedTuple):
    """A nested array with one ragged (token) axis: ``values`` (every document's tokens, one
    after another, along axis ``axis``), ``offsets`` (``cu_seqlens``: ``(n_docs + 1,)``), and
    ``wrap(values)``: values of the same token layout as a nested array of the same structure."""

    values: Array
    offsets: Array
    axis: int
    wrap: Callable[[Array], Array]


def library_name_of(x: Array, name: str = "") -> str:
    from .._lib._compat import array_namespace

    return library_name(array_namespace(x, names=(name,) if name else ()))


def sized(value: Any) -> tuple[Any, int]:
    """``(value, its bytes)``: what :func:`~rotary._lib._cache.get_or_build`'s builders return."""
    return value, _nbytes(value)


def _nbytes(value: Any) -> int:
    if isinstance(value, (tuple, list)):
        return sum(_nbytes(a) for a in value)
    n = 1
    for s in value.shape:
        n *= int(s)
    try:
        item = value.dtype.itemsize
    except AttributeError:
        item = 8
    return n * int(item)


def _host_positions(pos: Any, name: str) -> np.ndarray:
    """Host positions as a NumPy array of integers or floats (never bool, complex, strings)."""
    if isinstance(pos, (bool, np.bool_)) or pos is None:
        raise v.bad_positions(name, "got None" if pos is None else "got a bool")
    try:
        host = np.asarray(pos)
    except (TypeError, ValueError):
        raise v.bad_positions(name, f"got {type(pos).__name__} that NumPy cannot read as numbers") from None
    if host.dtype.name == "bfloat16":  # ml_dtypes: exact in float32
        host = host.astype(np.float32)
    if host.dtype.kind not in "iuf" or (host.dtype.kind == "f" and host.dtype.itemsize > 8):
        what = "booleans" if host.dtype.kind == "b" else f"{host.dtype} values"
        raise v.bad_positions(name, f"got {what}")
    return host


def _check_host(host: np.ndarray, name: str) -> tuple[int, int] | None:
    """Finite and ``|p| < 2**36``; ``(min, max)`` for integers (``None`` for floats or none)."""
    if host.size == 1 and host.dtype.kind in "iu":  # decoding: one position
        p = int(host.reshape(-1)[0])
        v.check_position_bound(float(abs(p)), name)
        return p, p
    if host.dtype.name == "bfloat16":
        host = host.astype(np.float32)
    if host.size == 0:
        return None
    if host.dtype.kind == "f":
        if not np.all(np.isfinite(host)):
            raise v.nonfinite_positions(name)
        v.check_position_bound(float(np.max(np.abs(host.astype(np.float64)))), name)
        return None
    lo, hi = int(host.min()), int(host.max())
    v.check_position_bound(float(max(-lo, hi)), name)
    return lo, hi


class DeviceBackend(Backend):
    """A library whose arrays live on an accelerator (CuPy): values are never read eagerly
    (that would force a device synchronisation)."""

    def is_concrete(self, x: Array) -> bool:
        return False
