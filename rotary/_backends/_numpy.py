"""NumPy: the generic backend plus eager ``out=`` kernels (see :mod:`rotary._backends._eager`).

Measured on the 2-core CPU machine at (1, 32, 4096, 128) float32: about 2x faster than the
generic code for the rotation and 3x for the exact angles of 128k positions
(``python3 -m benchmarks``).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

import numpy as np

from .._lib._cache import fast_paths_enabled, get_or_build
from .._lib._typing import Array, DType, Layout
from .._math._linear import FEATURE_MAPS
from .._math._rotation import pair_partners
from . import _eager
from ._generic import POSITION_TABLE_MAX, Backend, ConstantBuilder, _carry_fits, _check_host, sized

__all__ = ["NumpyBackend"]


def _ops(dtype: DType) -> _eager.Ops:
    def take_into(table: Array, idx: Array, out: Array) -> None:
        np.take(table, idx, axis=0, out=out)

    return _eager.Ops(
        empty=lambda shape: np.empty(shape, dtype=dtype),
        empty_like=np.empty_like,
        mul=np.multiply,
        sub=np.subtract,
        add=np.add,
        take_into=take_into,
        broadcast_to=np.broadcast_to,
        matmul=np.matmul,
    )


def _plain(*arrays: Any) -> bool:
    return all(type(a) is np.ndarray for a in arrays)


class NumpyBackend(Backend):
    @property
    def values_readable(self) -> bool:
        return True  # (eager, always)

    def owned(self, x: Array) -> Array:
        root = x
        while isinstance(root.base, np.ndarray):
            root = root.base
        return x.copy() if root is not x and root.nbytes > x.nbytes else x

    def fast(self, *inputs: Any, grads: tuple[Any, ...] = ()) -> bool:
        """:func:`rotary.fast_paths` on and every input a plain ``numpy.ndarray``: subclasses
        (masked arrays, matrices, a user's ``__array_ufunc__``) take the generic code."""
        return fast_paths_enabled() and _plain(*inputs, *grads)

    def plain_block(
        self,
        ch: Any,
        carry: Any,
        size: int,
        m: int,
        plan: Any,
        out_dtype: DType | None,
        *,
        doc: Any = None,
        uniform: bool = False,
        strict: bool = False,
        divided: bool = True,
    ) -> tuple[Any, Any] | None:
        """:func:`rotary._backends._eager.causal_block` (the generic block's operations in place)
        on plain arrays of one dtype with equal leading axes, documents as one id per token, a
        denominator unchecked."""
        a, c, b, e, v = ch
        xs = [x for x in (a, c, b, e, v) if x is not None]
        if carry is not None:
            xs += [x for x in (carry.S, carry.z) if x is not None]
        lead = a.shape[:-2]
        d0 = None if carry is None or uniform else carry.doc
        if not (
            plan.check is None
            and (c is None) == (e is None)
            and all(x.dtype == a.dtype for x in xs)
            and all(x.shape[:-2] == lead for x in (b, v, c, e) if x is not None)
            and (carry is None or _carry_fits(carry._replace(doc=None), lead, e is not None))
            and (
                d0 is None
                or (doc is not None and isinstance(d0, (np.ndarray, np.integer)) and np.ndim(d0) == 0)
            )
            and (doc is None or (type(doc) is np.ndarray and (uniform or doc.ndim == 1)))
            and self.fast(*xs)
        ):
            return None
        # (v contiguous: one copy, not one per product)
        return _eager.causal_block(
            ch._replace(v=np.ascontiguousarray(v)),
            carry,
            size,
            m,
            plan,
            out_dtype,
            self.xp,
            self.creation_device(a),
            doc=doc,
            uniform=uniform,
            strict=strict,
            divided=divided,
        )

    def one_document(self, doc: Array, carried: Array | None) -> bool:
        if not (self.fast(doc) and (carried is None or isinstance(carried, (np.ndarray, np.integer)))):
            return False
        first = doc[..., :1]
        return bool((doc == first).all()) and (carried is None or bool((carried == first[..., 0]).all()))

    def features(self, x: Array, plan: Any) -> Array:
        if not self._elu1_fast(x, plan):
            return super().features(x, plan)
        # max(x, 0) + exp(min(x, 0)) (a + b == b + a): the exp in place, no zero arrays
        zero = x.dtype.type(0)
        f = np.minimum(x, zero)
        np.exp(f, out=f)
        f += np.maximum(x, zero)
        return f

    def query_features(self, x: Array, plan: Any) -> Array:
        if not (plan.normalize and self._elu1_fast(x, plan)):
            return super().query_features(x, plan)
        # max(x, 0) + exp(min(x, 0) - shift), shift = min(max(x), 0): the generic bits, in place
        zero = x.dtype.type(0)
        f = np.minimum(x, zero)
        f -= np.minimum(x.max(axis=-1, keepdims=True), zero)
        np.exp(f, out=f)
        f += np.maximum(x, zero)
        return f

    def _elu1_fast(self, x: Array, plan: Any) -> bool:
        """``elu+1`` features (no cosine, no L2 normalisation) of a plain array of the compute dtype."""
        return (
            plan.phi is FEATURE_MAPS["elu+1"]
            and not (plan.cosine or plan.l2norm)
            and x.dtype == plan.cdt
            and self.fast(x)
        )

    def signature(self, *args: Any) -> Hashable | None:
        out: list[Any] = []
        for a in args:
            if a is None:
                out.append(None)
            elif type(a) is np.ndarray:
                out.append((a.shape, a.dtype))
            else:
                return None
        return tuple(out)

    def creation_device(self, x: Array) -> Any:
        return "cpu"

    def positions(self, pos: Any, *, name: str, device: Any) -> tuple[Array, tuple[int, int] | None]:
        if isinstance(pos, np.ma.MaskedArray):
            raise TypeError(
                f"{name} is a masked array: a masked position has no angle; pass the positions of "
                f"the tokens (e.g. {name}.filled(0)) and mask the data instead"
            )
        if type(pos) is np.ndarray and pos.dtype.kind in "iuf":
            return pos, _check_host(pos, name)
        return super().positions(pos, name=name, device=device)

    def check_devices(self, arrays: list[tuple[str, Array]]) -> None:
        return None  # one device

    def composite(self, x: Array) -> str | None:
        return "masked array" if isinstance(x, np.ma.MaskedArray) else None

    def map_heads(self, kernel: Callable[[Array], Array], x: Array, *, axis: int, head_dim: int) -> Array:
        if not isinstance(x, np.ma.MaskedArray):
            return kernel(x)
        # (a permutation of features: the mask moves with its feature)
        return np.ma.MaskedArray(kernel(np.ma.getdata(x)), mask=kernel(np.ma.getmaskarray(x)))

    def rotate(self, x: Array, c: Array, s: Array, *, layout: Layout, rotary_dim: int) -> Array:
        if isinstance(x, np.ma.MaskedArray):
            # A rotated feature is masked where it or its pair partner is (marray's rule: each
            # output reads both); the data, masked values included, rotate as a plain array.
            mask = np.ma.getmaskarray(x)
            out = self.rotate(np.ma.getdata(x), c, s, layout=layout, rotary_dim=rotary_dim)
            partner = np.arange(x.shape[-1])
            partner[:rotary_dim] = np.asarray(pair_partners(layout, rotary_dim))
            return np.ma.MaskedArray(out, mask=mask | mask[..., partner])
        if not self.fast(x, c, s):
            return super().rotate(x, c, s, layout=layout, rotary_dim=rotary_dim)
        out_dtype = x.dtype
        if x.dtype != c.dtype:
            x = x.astype(c.dtype)
        if rotary_dim == x.shape[-1]:
            if x.nbytes <= _eager.BLOCK_BYTES and layout == "half":
                S = np.multiply(s[..., None, :], _sign(s.dtype, 0))
                out = _rotate_small_half(x, c[..., None, :], S, rotary_dim // 2)
            else:
                out = _rotate_full(x, c, s, layout, rotary_dim // 2)
        else:
            out = _eager.rotate(x, c, s, layout, rotary_dim, _ops(x.dtype))
        return out if out.dtype == out_dtype else out.astype(out_dtype)

    def rotate_both(
        self, q: Array, k: Array, c: Array, s: Array, *, layout: Layout, rotary_dim: int
    ) -> tuple[Array, Array]:
        small = rotary_dim == q.shape[-1] and layout == "half" and q.nbytes <= _eager.BLOCK_BYTES
        if not (small and q.dtype == k.dtype == c.dtype and self.fast(q, k, c, s)):
            return super().rotate_both(q, k, c, s, layout=layout, rotary_dim=rotary_dim)
        if k.nbytes > _eager.BLOCK_BYTES:
            return super().rotate_both(q, k, c, s, layout=layout, rotary_dim=rotary_dim)
        h = rotary_dim // 2
        C, S = c[..., None, :], np.multiply(s[..., None, :], _sign(s.dtype, 0))
        return _rotate_small_half(q, C, S, h), _rotate_small_half(k, C, S, h)

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
        """Decoding (one integer position, small q and k, the half layout, whole heads, the
        compute dtype): :meth:`rotate_both`'s kernel on the position's rows
        (:meth:`decode_rows`), without the per-call lookups.  Positions outside the table or
        ``fast_paths(False)``: generic steps."""
        if not (type(pos) is np.ndarray and pos.size == 1 and pos.dtype.kind in "iu"):
            return None
        rows = self.decode_rows(build, config, q, k, layout=layout, rotary_dim=rotary_dim)
        if rows is None:
            return None
        h = rotary_dim // 2

        def plan(q: Array, k: Array, pos: Any) -> tuple[Array, Array] | None:
            if not self.fast(q, k, pos):
                return None
            p = pos.item()
            if not 0 <= p < POSITION_TABLE_MAX:
                return None
            C, S = rows(p)
            return _rotate_row_half(q, C, S, h), _rotate_row_half(k, C, S, h)

        return plan

    def decode_rows(
        self, build: ConstantBuilder, config: Hashable, q: Array, k: Array, *, layout: Layout, rotary_dim: int
    ) -> Callable[[int], Any] | None:
        """Plain arrays of the compute dtype, small, the half layout, whole heads: ``rows(p) ->
        (C, S)``, ``cos`` and ``[-sin, sin]`` (pair axis first) of :func:`_rotate_small_half`,
        from the position table with as many rows (state ``decode_rows``: the sign folded in)."""
        dtype = self.compute_dtype(q.dtype)
        if not (
            rotary_dim == q.shape[-1]
            and layout == "half"
            and q.nbytes <= _eager.BLOCK_BYTES
            and k.nbytes <= _eager.BLOCK_BYTES
            and _plain(q, k)
            and q.dtype == k.dtype == dtype
        ):
            return None
        h, dev = rotary_dim // 2, self.creation_device(q)

        def rows(p: int) -> tuple[Array, Array]:
            n = 4096
            while n <= p:
                n *= 2

            def make() -> tuple[Array, int]:
                t = self.position_table(build, config, dev, dtype, p)
                c, s = t[:, None, :h], t[:, None, h:]
                return sized(np.concatenate([c, -s, s], axis=1))  # (rows, 3, r/2): cos, -sin, sin

            row = get_or_build((config, "decode_rows", n, self.key, dev, dtype), make, "decode_rows")[p]
            return row[0], row[1:]

        return rows

    def linear_step(
        self, feature_map: str, eps: float, rows: Callable[[int], Any] | None, like: tuple[Array, ...]
    ) -> Callable[..., tuple[Array, ...] | None] | None:
        """A decoding step of normalised linear attention with ``elu+1`` features and the dot
        similarity on plain float32 arrays (those of ``like``): the generic step's bits (``query_features``,
        ``features``, ``step`` of :mod:`rotary._math._linear`; the rotation of
        :meth:`decode_rows`) in NumPy's own calls.  Anything else returns ``None`` (the generic
        step)."""
        f32 = np.dtype(np.float32)
        if not (feature_map == "elu+1" and _plain(*like) and all(x.dtype == f32 for x in like)):
            return None
        zero, floor, inf = np.float32(0), np.float32(eps), np.float32(np.inf)

        def step(q: Array, k: Array, v: Array, pos: Any, S: Array, z: Array) -> tuple[Array, ...] | None:
            # (types and dtypes are those of ``like``: the checked signature's, plain arrays)
            if not fast_paths_enabled():
                return None
            R: Any = None
            if rows is not None:
                p = self.decode_position(pos)
                if p is None or not 0 <= p < POSITION_TABLE_MAX:
                    return None
                R = rows(p)
            # c = max(q, 0) + exp(min(q, 0) - shift), e = max(k, 0) + exp(min(k, 0)) (a + b == b + a)
            shift = np.minimum(q.max(axis=-1, keepdims=True), zero)
            c = np.minimum(q, zero)
            c -= shift
            np.exp(c, out=c)
            c += np.maximum(q, zero)
            e = np.exp(np.minimum(k, zero))
            e += np.maximum(k, zero)
            a, b = c, e
            if R is not None:
                h, (C, Sn) = q.shape[-1] // 2, R
                a, b = _rotate_row_half(c, C, Sn, h), _rotate_row_half(e, C, Sn, h)
            c, e = c[..., 0, :], e[..., 0, :]
            S2 = np.swapaxes(b, -1, -2) * v
            S2 += S
            z2 = np.add(z, e)
            # (c's product in place where the rotation made a apart from it)
            den = (c * z2 if R is None else np.multiply(c, z2, out=c)).sum(axis=-1)
            den = np.maximum(den, floor) if eps > 0 else np.where(den != 0, den, inf)
            out = np.matmul(a, S2)
            out /= den[..., None, None]
            return out, S2, z2

        return step

    def _exact(
        self, pos: Array, tables: Array, w: Array, dtype: DType, levels: int, nonneg: bool, *, checked: bool
    ) -> tuple[Array, Array]:
        if not (checked and pos.dtype.kind in "iu" and self.fast(pos, tables)):
            return super()._exact(pos, tables, w, dtype, levels, nonneg, checked=checked)
        return _eager.exact(pos, tables, levels, nonneg, _ops(tables.dtype), self.xp)

    def segment_add(self, acc: Array, x: Array, ids: Array) -> Array:
        if not (_plain(acc, x, ids) and acc.flags.writeable):
            return super().segment_add(acc, x, ids)
        lead = np.broadcast_shapes(acc.shape[:-2], x.shape[:-2])
        if acc.shape[:-2] != lead:
            acc = np.broadcast_to(acc, (*lead, *acc.shape[-2:])).copy()
        np.add.at(acc, (..., ids, slice(None)), x)  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]
        return acc

    def _take_rows(self, table: Array, idx: Array) -> Array:
        if _plain(table, idx):
            return table.take(idx, axis=0)  # indices checked: no compat wrapper needed
        return super()._take_rows(table, idx)


#: ``[-1, 1]`` along the pair axis, shape ``(2, 1)`` (half) or ``(1, 2)`` (interleaved), per dtype.
_SIGNS = {
    np.dtype(dt): (np.array([[-1.0], [1.0]], dtype=dt), np.array([[-1.0, 1.0]], dtype=dt))
    for dt in (np.float16, np.float32, np.float64)
}


def _sign(dtype: Any, interleaved: int) -> np.ndarray:
    return _SIGNS[np.dtype(dtype)][interleaved]


def _rotate_small_half(x: np.ndarray, C: np.ndarray, S: np.ndarray, h: int) -> np.ndarray:
    """:func:`_rotate_full` for one small block in the half layout (decoding), with the fewest
    NumPy calls: ``out = x * C + swap(x) * S`` (``C = cos``, ``S = [-sin, sin]`` on a new pair
    axis), the same operations in the same order."""
    xv = x.reshape((*x.shape[:-1], 2, h))
    out = np.multiply(xv, C)
    np.add(out, np.multiply(xv[..., ::-1, :], S), out=out)
    return out.reshape(x.shape)


def _rotate_row_half(x: np.ndarray, C: np.ndarray, S: np.ndarray, h: int) -> np.ndarray:
    """:func:`_rotate_small_half` at one position (``C`` ``(h,)``, ``S`` ``(2, h)``: one row for
    every vector of ``x``), its leading axes flattened into one (NumPy iterates three axes faster
    than five); the same operations."""
    xv = x.reshape((-1, 2, h))
    out = np.multiply(xv, C)
    np.add(out, np.multiply(xv[:, ::-1, :], S), out=out)
    return out.reshape(x.shape)


def _rotate_full(x: np.ndarray, c: np.ndarray, s: np.ndarray, layout: Layout, h: int) -> np.ndarray:
    """Whole head rotated: ``out = x * C + swap(x) * S`` block by block.

    ``C`` repeats ``cos`` for both features of a pair and ``S`` holds ``[-sin, sin]``, laid
    out for ``layout``; ``swap`` exchanges the features of every pair.  ``a + (-b) == a - b``
    exactly, so this is the generic formula to the bit.  Half layout: ``swap`` is a view (the
    pair axis reversed); interleaved: that view would leave an inner loop of length 2, so
    the swap is copied into the block's scratch buffer (measured 3x faster).
    """
    lead = tuple(x.shape[:-1])
    d = x.shape[-1]
    out = np.empty(x.shape, dtype=x.dtype)
    if layout == "half":
        shp = (*lead, 2, h)
        xv, ov = x.reshape(shp), out.reshape(shp)
        xs = xv[..., ::-1, :]
        c2 = c[..., None, :]
        s2 = np.multiply(s[..., None, :], _sign(s.dtype, 0))
    else:
        xv, ov, xs = x, out, None
        c2 = np.repeat(c, 2, axis=-1)
        s2 = np.multiply(s[..., :, None], _sign(s.dtype, 1)).reshape((*s.shape[:-1], d))
    row_bytes = d * x.itemsize
    if row_bytes * _eager._prod(lead) <= 2 * _eager.BLOCK_BYTES or not lead:
        bl: list[Any] = [(...,)]
    else:
        c2 = np.broadcast_to(c2, (*lead, *c2.shape[len(c2.shape) - len(ov.shape) + len(lead) :]))
        s2 = np.broadcast_to(s2, (*lead, *s2.shape[len(s2.shape) - len(ov.shape) + len(lead) :]))
        bl = _eager.blocks(lead, row_bytes)
    tmp = np.empty(ov[bl[0]].shape, dtype=x.dtype)
    for b in bl:
        ob = ov[b]
        t = tmp if tmp.shape == ob.shape else np.empty(ob.shape, dtype=x.dtype)
        np.multiply(xv[b], c2[b], out=ob)
        if xs is not None:
            np.multiply(xs[b], s2[b], out=t)
        else:
            xpair, tpair = xv[b].reshape((*t.shape[:-1], h, 2)), t.reshape((*t.shape[:-1], h, 2))
            np.copyto(tpair[..., 0], xpair[..., 1])
            np.copyto(tpair[..., 1], xpair[..., 0])
            np.multiply(t, s2[b], out=t)
        np.add(ob, t, out=ob)
    return out
