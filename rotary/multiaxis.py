"""Multi-axis RoPE: axial RoPE for images and video, and M-RoPE (Qwen2-VL, Qwen3-VL).

Both rotate the same ``r/2`` feature pairs as 1-D RoPE (``r = rotary_dim``), in
either pair layout; what changes is which *position coordinate* and which
*frequency* each pair uses.  Everything else (exact angles, scalings, the
rotation kernel, cached tables) is :class:`rotary.RoPE`'s.

Pair ``i`` always means the pair of :mod:`rotary.layouts`: features
``(i, i + r/2)`` in ``"half"``, ``(2i, 2i + 1)`` in ``"interleaved"``.

:class:`AxialRoPE`
    Positions ``(..., n_axes)``, one coordinate per axis (e.g. ``(row, col)``).
    Axis ``a`` owns ``split[a]`` rotary *features*, i.e. the consecutive block
    of ``split[a] / 2`` pairs after those of axes ``0 .. a-1``, and inside its
    block behaves as a 1-D RoPE of dimension ``split[a]``
    (``theta_j = base**(-2j/split[a])``) at its own coordinate.  For
    ``head_dim = 8`` and two axes (row ``R``, column ``C``)::

        feature:      0   1   2   3   4   5   6   7
        half:         R0  R1  C0  C1  R0  R1  C0  C1     (Qwen2-VL vision, EVA-02)
        interleaved:  R0  R0  R1  R1  C0  C0  C1  C1     (lucidrains, torchtune 2-D)

    The score of rotated ``q`` at ``p`` and ``k`` at ``p'`` depends on the
    coordinates only through ``p - p'`` (per axis).

:class:`MRoPE`
    Positions ``(rows, ...)``, rows first as in Hugging Face's ``position_ids``
    of shape ``(3, batch, seq)`` (temporal, height, width).  The ``r/2``
    frequencies are those of 1-D RoPE of dimension ``r``; ``sections`` assigns
    them to rows: consecutive blocks (Qwen2-VL ``mrope_section``) or, with
    ``interleaved=True``, round robin ``T H W T H W ...`` until a row's share is
    used up, the rest to row 0 (Qwen3-VL ``mrope_interleaved``).  With all rows
    equal it is exactly 1-D RoPE.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from . import _checks
from ._compat import Array, Namespace, array_namespace, compute_dtype, creation_device
from .layouts import expand_pairs, rotate_pairs
from .rope import RoPE, as_positions
from .scaling import Scaling

__all__ = ["AxialRoPE", "MRoPE", "mrope_rows"]


class _MultiAxisRoPE:
    """Shared rotation/``apply``/``cos_sin`` code; subclasses give per-pair cos/sin."""

    head_dim: int
    rotary_dim: int
    layout: str

    # -- subclass hooks --------------------------------------------------------------
    def _pair_cos_sin(self, pos: Array, xp: Namespace, dev: Any, dtype: Any) -> tuple[Array, Array]:
        raise NotImplementedError

    def _coord_shape(self, pos: Array, name: str) -> tuple:
        """Shape of one coordinate of ``pos`` (what broadcasts against ``x.shape[:-1]``)."""
        raise NotImplementedError

    def _rot_dtype(self, x: Array) -> Any:
        """Dtype the rotation runs in: ``None`` for float32 or better (the default)."""
        return None

    def _cs_for(self, x: Array, c: Array, s: Array, xp: Namespace) -> tuple[Array, Array]:
        rd = self._rot_dtype(x)
        if rd is not None and c.dtype != rd:
            c, s = xp.astype(c, rd), xp.astype(s, rd)
        return c, s

    # -- public API ------------------------------------------------------------------
    def cos_sin(
        self,
        pos: Any,
        *,
        xp: Namespace | None = None,
        device: Any = None,
        dtype: Any = None,
        full: bool = False,
    ) -> tuple[Array, Array]:
        """cos and sin of every pair's angle at ``pos``.

        Shape ``coord_shape + (rotary_dim // 2,)`` (one value per pair), or with
        ``full=True`` ``coord_shape + (rotary_dim,)`` laid out for ``self.layout``.
        ``xp``/``device``/``dtype`` as in :meth:`rotary.RoPE.cos_sin`.

        Examples
        --------
        >>> import rotary
        >>> c, s = rotary.AxialRoPE(8, 2).cos_sin([[0, 0], [1, 2]])    # two (row, col) positions
        >>> c.shape                                                    # 2 pairs per axis
        (2, 4)
        >>> [round(float(v), 4) for v in c[1]]      # theta (1, 0.01) per axis: row 1, col 2
        [0.5403, 0.9999, -0.4161, 0.9998]
        """
        if xp is None:
            xp = array_namespace(pos)
        pos = as_positions(pos, xp, device, "pos")
        self._coord_shape(pos, "pos")
        dev = device if device is not None else creation_device(pos, xp)
        dtype = xp.float32 if dtype is None else dtype
        _checks.check_positions_values(pos, xp, "pos")
        c, s = self._pair_cos_sin(pos, xp, dev, compute_dtype(xp, dtype))
        if full:
            c, s = expand_pairs(c, self.layout, xp), expand_pairs(s, self.layout, xp)
        if c.dtype != dtype:
            c, s = xp.astype(c, dtype), xp.astype(s, dtype)
        return c, s

    def rotate(self, x: Array, pos: Any) -> Array:
        """Rotate ``x`` of shape ``(..., head_dim)`` at ``pos`` (coordinates broadcast to x.shape[:-1]).

        Examples
        --------
        >>> import numpy as np, rotary
        >>> x = np.ones((4, 8), dtype=np.float32)
        >>> rotary.AxialRoPE(8, 2).rotate(x, [[0, 0]] * 4).tolist() == x.tolist()   # origin: identity
        True
        """
        xp = array_namespace(x, pos, names=("x", "pos"))
        self._check_x(x, xp, "x")
        pos = self._prepare(pos, x, xp, "pos", [("x", x)])
        c, s = self._pair_cos_sin(pos, xp, creation_device(x, xp), compute_dtype(xp, x.dtype))
        c, s = self._cs_for(x, c, s, xp)
        return rotate_pairs(x, c, s, layout=self.layout, rotary_dim=self.rotary_dim, xp=xp)

    def apply(self, q: Array, k: Array, pos: Any, *, k_pos: Any = None) -> tuple[Array, Array]:
        """Rotate queries and keys (``k_pos`` defaults to ``pos``); grouped-query heads allowed.

        Examples
        --------
        >>> import numpy as np, rotary
        >>> q = np.ones((1, 4, 6, 16), dtype=np.float32)              # (batch, heads, seq, dim)
        >>> k = np.ones((1, 2, 6, 16), dtype=np.float32)              # 2 kv heads
        >>> pos = np.stack([np.arange(6)] * 3)[:, None, None, :]      # (3, 1, 1, seq): text tokens
        >>> qr, kr = rotary.MRoPE(16, (2, 3, 3)).apply(q, k, pos)
        >>> bool(np.allclose(qr, rotary.rotate(q, np.arange(6)), atol=1e-6))
        True
        """
        xp = array_namespace(q, k, pos, k_pos, names=("q", "k", "pos", "k_pos"))
        self._check_x(q, xp, "q")
        self._check_x(k, xp, "k")
        _checks.check_qk(q, k)
        if q.dtype != k.dtype:
            raise TypeError(f"q and k must have the same dtype, got {q.dtype} and {k.dtype}")
        arrays = [("q", q), ("k", k)]
        dev, cdt = creation_device(q, xp), compute_dtype(xp, q.dtype)
        pos = self._prepare(pos, q, xp, "pos", arrays)
        c, s = self._pair_cos_sin(pos, xp, dev, cdt)
        if k_pos is None:
            _checks.check_broadcast(self._coord_shape(pos, "pos"), tuple(k.shape[:-1]), "pos", "k")
            ck, sk = c, s
        else:
            k_pos = self._prepare(k_pos, k, xp, "k_pos", arrays)
            ck, sk = self._pair_cos_sin(k_pos, xp, dev, cdt)
        c, s = self._cs_for(q, c, s, xp)
        ck, sk = self._cs_for(k, ck, sk, xp)
        kw = {"layout": self.layout, "rotary_dim": self.rotary_dim, "xp": xp}
        return rotate_pairs(q, c, s, **kw), rotate_pairs(k, ck, sk, **kw)

    # -- helpers ---------------------------------------------------------------------
    def _check_x(self, x: Array, xp: Namespace, name: str) -> None:
        _checks.check_head_array(x, xp, name, self.head_dim)

    def _prepare(self, pos: Any, x: Array, xp: Namespace, name: str, arrays: list) -> Array:
        pos = as_positions(pos, xp, creation_device(x, xp), name)
        _checks.check_same_device(xp, [*arrays, (name, pos)])
        xname = next((n for n, a in arrays if a is x), "x")
        _checks.check_broadcast(self._coord_shape(pos, name), tuple(x.shape[:-1]), name, xname)
        _checks.check_positions_values(pos, xp, name)
        return pos


def _check_int_list(values: Any, name: str, n: int | None = None) -> tuple[int, ...]:
    try:
        out = tuple(values)
    except TypeError:
        raise TypeError(f"{name} must be a sequence of positive integers, got {values!r}") from None
    if not out or any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v <= 0 for v in out):
        raise ValueError(f"{name} must be a non-empty sequence of positive integers, got {values!r}")
    if n is not None and len(out) != n:
        raise ValueError(f"{name} must have {n} entries, got {len(out)}: {values!r}")
    return tuple(int(v) for v in out)


class AxialRoPE(_MultiAxisRoPE):
    """Axial RoPE for images and video: one position coordinate per axis.

    Parameters
    ----------
    head_dim : int
        Features per head (even).
    n_axes : int
        Number of coordinates per position (2 for images, 3 for video).
    split : sequence of int, optional
        Rotary features given to each axis (each even, summing to ``rotary_dim``).
        Default: as equal as possible, in whole pairs, earlier axes getting the
        extra pair (``head_dim=64, n_axes=2`` gives ``(32, 32)``).
    base : float
        RoPE base of every axis.
    layout : {"half", "interleaved"}
        Pair layout; the axis blocks are blocks of pairs (see :mod:`rotary.multiaxis`).
    rotary_dim : int, optional
        Rotate only the first ``rotary_dim`` features (NeoX-style); the rest pass through.
    angles : {"exact", "float32"}
        Angle method, as in :class:`rotary.RoPE`.  The rotation itself always runs
        in float32 or better (as HF's ``apply_rotary_pos_emb_vision`` does), so
        ``"float32"`` matches Qwen2-VL's vision RoPE bit-for-bit in every dtype.

    Examples
    --------
    >>> import numpy as np, rotary
    >>> rope = rotary.AxialRoPE(16, n_axes=2)                    # (row, col), 8 features each
    >>> rows, cols = np.meshgrid(np.arange(3), np.arange(4), indexing="ij")
    >>> pos = np.stack([rows, cols], axis=-1).reshape(12, 2)     # 12 patches, (row, col)
    >>> x = np.ones((2, 12, 16), dtype=np.float32)                # (heads, patches, head_dim)
    >>> rope.rotate(x, pos).shape
    (2, 12, 16)
    >>> rope.split, rope.inv_freq().shape
    ((8, 8), (8,))
    """

    def __init__(
        self,
        head_dim: int,
        n_axes: int = 2,
        *,
        split: Any = None,
        base: float = 10000.0,
        layout: str = "half",
        rotary_dim: int | None = None,
        angles: str = "exact",
    ) -> None:
        self.head_dim = _checks.check_head_dim(head_dim)
        self.rotary_dim = _checks.check_rotary_dim(rotary_dim, self.head_dim)  # type: ignore[assignment]
        self.layout = _checks.check_layout(layout)
        if isinstance(n_axes, bool) or not isinstance(n_axes, (int, np.integer)) or n_axes < 1:
            raise ValueError(f"n_axes must be a positive integer, got {n_axes!r}")
        self.n_axes = int(n_axes)
        npairs = self.rotary_dim // 2
        if split is None:
            if npairs < self.n_axes:
                raise ValueError(
                    f"rotary_dim={self.rotary_dim} has {npairs} pairs, fewer than n_axes={self.n_axes}"
                )
            q, rem = divmod(npairs, self.n_axes)
            split = tuple(2 * (q + (a < rem)) for a in range(self.n_axes))
        split = _check_int_list(split, "split", self.n_axes)
        if any(v % 2 for v in split) or sum(split) != self.rotary_dim:
            raise ValueError(
                f"split must hold {self.n_axes} even feature counts summing to rotary_dim="
                f"{self.rotary_dim}, got {split}"
            )
        self.split = split
        # One 1-D RoPE per distinct axis width: its exact tables, cache and angle methods.
        self._ropes = tuple(RoPE(v, base=base, layout=self.layout, angles=angles) for v in split)
        self.base = self._ropes[0].base
        self.angles = angles
        self._equal = len(set(split)) == 1

    def __repr__(self) -> str:
        return (
            f"AxialRoPE({self.head_dim}, n_axes={self.n_axes}, split={self.split}, base={self.base:g}, "
            f"layout={self.layout!r}, rotary_dim={self.rotary_dim})"
        )

    def inv_freq(self) -> np.ndarray:
        """Frequency of every pair, shape ``(rotary_dim // 2,)``, float64 (axis blocks in order)."""
        return np.concatenate([r.inv_freq() for r in self._ropes])

    def axis_of_pair(self) -> np.ndarray:
        """Which coordinate each pair uses, shape ``(rotary_dim // 2,)``."""
        return np.repeat(np.arange(self.n_axes), [v // 2 for v in self.split])

    def _coord_shape(self, pos: Array, name: str) -> tuple:
        shape = tuple(pos.shape)
        if not shape or shape[-1] != self.n_axes:
            raise ValueError(
                f"{name} must have shape (..., {self.n_axes}) (one coordinate per axis, last), "
                f"got shape {shape}"
            )
        return shape[:-1]

    def _pair_cos_sin(self, pos: Array, xp: Namespace, dev: Any, dtype: Any) -> tuple[Array, Array]:
        if self._equal:
            # All axes share one frequency vector: one call over (..., n_axes), then
            # the axis blocks are consecutive along the flattened last two axes.
            c, s = self._ropes[0]._half_cos_sin(pos, xp, dev, dtype)
            lead = tuple(c.shape[:-2])
            n = self.rotary_dim // 2
            return xp.reshape(c, (*lead, n)), xp.reshape(s, (*lead, n))
        cs = [r._half_cos_sin(pos[..., a], xp, dev, dtype) for a, r in enumerate(self._ropes)]
        return xp.concat([c for c, _ in cs], axis=-1), xp.concat([s for _, s in cs], axis=-1)


def mrope_rows(sections: Any, *, interleaved: bool = False) -> np.ndarray:
    """Position row used by each frequency of M-RoPE, shape ``(sum(sections),)``.

    ``interleaved=False`` (Qwen2-VL): ``sections[j]`` consecutive frequencies take
    row ``j``.  ``interleaved=True`` (Qwen3-VL): frequency ``i`` takes row
    ``j = i % len(sections)`` when ``j > 0`` and ``i < len(sections) * sections[j]``,
    else row 0.

    Examples
    --------
    >>> from rotary.multiaxis import mrope_rows
    >>> mrope_rows([2, 1, 1])
    array([0, 0, 1, 2])
    >>> mrope_rows([4, 2, 2], interleaved=True)
    array([0, 1, 2, 0, 1, 2, 0, 0])
    """
    return np.asarray(_rows(_check_int_list(sections, "sections"), interleaved), dtype=np.int64)


def _rows(sections: tuple[int, ...], interleaved: bool) -> list[int]:
    # Plain Python (no NumPy), so constructing an MRoPE inside torch.compile traces cleanly.
    nr, n = len(sections), sum(sections)
    if not interleaved:
        return [j for j, v in enumerate(sections) for _ in range(v)]
    rows = [next((j for j in range(1, nr) if i % nr == j and i < nr * sections[j]), 0) for i in range(n)]
    counts = tuple(rows.count(j) for j in range(nr))
    if counts != sections:
        raise ValueError(
            f"interleaved sections {sections} cannot be laid out round robin: rows would get "
            f"{counts} frequencies"
        )
    return rows


class MRoPE(_MultiAxisRoPE):
    """Multimodal RoPE (M-RoPE) of Qwen2-VL, and the interleaved variant of Qwen3-VL.

    Parameters
    ----------
    head_dim : int
        Features per head (even).
    sections : sequence of int
        Frequencies per position row (HF ``mrope_section``, e.g. ``(16, 24, 24)``
        for ``head_dim=128``), summing to ``rotary_dim // 2``.
    interleaved : bool
        ``False``: consecutive sections (Qwen2-VL, Qwen2.5-VL).  ``True``: round-robin
        rows (Qwen3-VL ``mrope_interleaved``), see :func:`mrope_rows`.
    base, layout, rotary_dim, scaling, angles
        As in :class:`rotary.RoPE` (HF Qwen-VL models use ``layout="half"``).
        ``angles="float32"`` reproduces them bit-for-bit on torch, bfloat16 and
        float16 included: float32 angles, cos/sin cast to the input dtype and the
        rotation done in it, as HF does.  ``"exact"`` rotates in float32 or better.

    Notes
    -----
    ``pos`` has the rows first: shape ``(len(sections), ...)`` or ``(1, ...)``
    (the same position on every row, i.e. 1-D RoPE), where ``...`` broadcasts
    against ``x.shape[:-1]``; HF's ``position_ids`` of shape ``(3, batch, seq)``
    becomes ``position_ids[:, :, None, :]`` for ``(batch, heads, seq, head_dim)``.
    The angles of every row are computed with the 1-D RoPE's exact tables and the
    frequencies then picked per row.

    Examples
    --------
    >>> import numpy as np, rotary
    >>> rope = rotary.MRoPE(16, sections=(2, 3, 3))
    >>> pos = np.stack([np.arange(5), np.arange(5) // 2, np.arange(5) % 2])   # (3, seq)
    >>> q = np.ones((1, 2, 5, 16), dtype=np.float32)                         # (batch, heads, seq, dim)
    >>> q_rot, k_rot = rope.apply(q, q, pos[:, None, None, :])
    >>> q_rot.shape
    (1, 2, 5, 16)
    """

    def __init__(
        self,
        head_dim: int,
        sections: Any,
        *,
        interleaved: bool = False,
        base: float = 10000.0,
        layout: str = "half",
        rotary_dim: int | None = None,
        scaling: Scaling | dict | None = None,
        angles: str = "exact",
    ) -> None:
        self._rope = RoPE(
            head_dim, base=base, layout=layout, rotary_dim=rotary_dim, scaling=scaling, angles=angles
        )
        self.head_dim, self.rotary_dim = self._rope.head_dim, self._rope.rotary_dim
        self.layout, self.base = self._rope.layout, self._rope.base
        self.sections = _check_int_list(sections, "sections")
        if sum(self.sections) != self.rotary_dim // 2:
            raise ValueError(
                f"sections must sum to rotary_dim // 2 = {self.rotary_dim // 2} (one entry per "
                f"frequency), got {self.sections} (sum {sum(self.sections)})"
            )
        self.interleaved = bool(interleaved)
        self._rows = tuple(_rows(self.sections, self.interleaved))
        self._masks = tuple(tuple(r == j for r in self._rows) for j in range(len(self.sections)))
        self._bounds = tuple(itertools.pairwise(itertools.accumulate(self.sections, initial=0)))

    def __repr__(self) -> str:
        il = ", interleaved=True" if self.interleaved else ""
        return f"MRoPE({self.head_dim}, sections={self.sections}{il}, rope={self._rope!r})"

    @property
    def attention_factor(self) -> float:
        return self._rope.attention_factor

    def inv_freq(self) -> np.ndarray:
        """Frequencies, shape ``(rotary_dim // 2,)``, float64 (those of the 1-D RoPE)."""
        return self._rope.inv_freq()

    def rows(self) -> np.ndarray:
        """Position row of each pair, shape ``(rotary_dim // 2,)``."""
        return np.asarray(self._rows)

    def _coord_shape(self, pos: Array, name: str) -> tuple:
        shape = tuple(pos.shape)
        n = len(self.sections)
        if not shape or shape[0] not in (1, n):
            raise ValueError(
                f"{name} must have shape ({n}, ...) or (1, ...) (position rows first, as HF's "
                f"position_ids (3, batch, seq)), got shape {shape}"
            )
        return shape[1:]

    def _rot_dtype(self, x: Array) -> Any:
        # HF's Qwen-VL text models cast cos/sin to the input dtype and rotate in it.
        return x.dtype if self._rope.angles == "float32" else None

    def _pair_cos_sin(self, pos: Array, xp: Namespace, dev: Any, dtype: Any) -> tuple[Array, Array]:
        c, s = self._rope._half_cos_sin(pos, xp, dev, dtype)  # (rows, ..., n)
        if pos.shape[0] == 1:
            return c[0, ...], s[0, ...]
        if not self.interleaved:
            cs = [(c[j, ..., a:b], s[j, ..., a:b]) for j, (a, b) in enumerate(self._bounds)]
            return xp.concat([u for u, _ in cs], axis=-1), xp.concat([v for _, v in cs], axis=-1)
        oc, os_ = c[0, ...], s[0, ...]
        for j in range(1, len(self.sections)):
            m = xp.asarray(self._masks[j], dtype=xp.bool, device=dev)
            oc, os_ = xp.where(m, c[j, ...], oc), xp.where(m, s[j, ...], os_)
        return oc, os_
