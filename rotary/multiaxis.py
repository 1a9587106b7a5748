"""Multi-axis RoPE: axial RoPE for images and video, and M-RoPE (Qwen2-VL, Qwen3-VL).

Both rotate the same ``r/2`` feature pairs as 1-D RoPE (``r = rotary_dim``), in either pair
layout; what changes is which *position coordinate* and which *frequency* each pair uses.
Everything else (exact angles, scalings, the rotation, cached tables, ``apply``/``rotate``/
``cos_sin``) is :class:`rotary.RoPE`'s.

Pair ``i`` always means the pair of :mod:`rotary.layouts`: features ``(i, i + r/2)`` in
``"half"``, ``(2i, 2i + 1)`` in ``"interleaved"``.

:class:`AxialRoPE`
    Positions ``(..., n_axes)``, one coordinate per axis (e.g. ``(row, col)``).  Axis ``a``
    owns ``split[a]`` rotary *features*, i.e. the consecutive block of ``split[a] / 2`` pairs
    after those of axes ``0 .. a-1``, and inside its block behaves as a 1-D RoPE of dimension
    ``split[a]`` (``theta_j = base**(-2j/split[a])``) at its own coordinate.  For
    ``head_dim = 8`` and two axes (row ``R``, column ``C``)::

        feature:      0   1   2   3   4   5   6   7
        half:         R0  R1  C0  C1  R0  R1  C0  C1     (Qwen2-VL vision, EVA-02)
        interleaved:  R0  R0  R1  R1  C0  C0  C1  C1     (lucidrains, torchtune 2-D)

    The score of rotated ``q`` at ``p`` and ``k`` at ``p'`` depends on the coordinates only
    through ``p - p'`` (per axis).

:class:`MRoPE`
    Positions ``(rows, ...)``, rows first as in Hugging Face's ``position_ids`` of shape
    ``(3, batch, seq)`` (temporal, height, width).  The ``r/2`` frequencies are those of 1-D
    RoPE of dimension ``r``; ``sections`` assigns them to rows: consecutive blocks (Qwen2-VL
    ``mrope_section``) or, with ``interleaved=True``, round robin ``T H W T H W ...`` until a
    row's share is used up, the rest to row 0 (Qwen3-VL ``mrope_interleaved``).  With all
    rows equal it is exactly 1-D RoPE.
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable
from typing import Any

import numpy as np

from ._backends import Backend
from ._lib import _validation as v
from ._lib._typing import AngleMethod, Array, Device, DType, Layout
from ._rope import Range, RoPE, Rotary
from .scaling import Scaling

__all__ = ["AxialRoPE", "MRoPE", "mrope_rows"]


class AxialRoPE(Rotary):
    """Axial RoPE for images and video: one position coordinate per axis.

    Parameters
    ----------
    head_dim : int
        Features per head (even).
    n_axes : int
        Number of coordinates per position (2 for images, 3 for video).
    split : sequence of int, optional
        Rotary features given to each axis (each even, summing to ``rotary_dim``).  Default:
        as equal as possible, in whole pairs, earlier axes getting the extra pair
        (``head_dim=64, n_axes=2`` gives ``(32, 32)``).
    base : float
        RoPE base of every axis.
    layout : {"half", "interleaved"}
        Pair layout; the axis blocks are blocks of pairs (see :mod:`rotary.multiaxis`).
    rotary_dim : int, optional
        Rotate only the first ``rotary_dim`` features (NeoX-style); the rest pass through.
    angles : {"exact", "float32"}
        Angle method, as in :class:`rotary.RoPE`.  The rotation itself always runs in
        float32 or better (as HF's ``apply_rotary_pos_emb_vision`` does), so ``"float32"``
        matches Qwen2-VL's vision RoPE bit-for-bit in every dtype.
    scaling : Scaling or sequence of Scaling, optional
        The frequencies of every axis (one scaling), or of each axis (one per axis): e.g.
        :class:`rotary.scaling.Frequencies` for towers whose axes use other frequencies than
        ``base**(-2j/split[a])`` (Pixtral's odd/even split, pixel frequencies).  Static
        scalings only.

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

    seq_axis = -2  # positions (..., seq, n_axes)

    def __init__(
        self,
        head_dim: int,
        n_axes: int = 2,
        *,
        split: Any = None,
        base: float = 10000.0,
        layout: Layout = "half",
        rotary_dim: int | None = None,
        angles: AngleMethod = "exact",
        scaling: Scaling | tuple[Scaling, ...] | None = None,
    ) -> None:
        self.head_dim = v.check_head_dim(head_dim)
        self.rotary_dim = v.check_rotary_dim(rotary_dim, self.head_dim)
        self.layout = v.check_layout_name(layout)
        self.n_axes = v.check_int(n_axes, "n_axes", minimum=1)
        npairs = self.rotary_dim // 2
        if split is None:
            if npairs < self.n_axes:
                raise ValueError(
                    f"rotary_dim={self.rotary_dim} has {npairs} pairs, fewer than n_axes={self.n_axes}"
                )
            q, rem = divmod(npairs, self.n_axes)
            split = tuple(2 * (q + (a < rem)) for a in range(self.n_axes))
        split = v.check_positive_ints(split, "split", self.n_axes)
        if any(s % 2 for s in split) or sum(split) != self.rotary_dim:
            raise ValueError(
                f"split must hold {self.n_axes} even feature counts summing to "
                f"rotary_dim={self.rotary_dim}, got {split}"
            )
        self.split = split
        scalings = tuple(scaling) if isinstance(scaling, (tuple, list)) else (scaling,) * self.n_axes
        if len(scalings) != self.n_axes:
            raise ValueError(
                f"scaling must be one scaling or {self.n_axes} (one per axis), got {len(scalings)}"
            )
        # One 1-D RoPE per axis width: its exact tables, cache and angle methods.
        self._ropes = tuple(
            RoPE(s, base=base, layout=self.layout, angles=angles, scaling=sc)
            for s, sc in zip(split, scalings, strict=True)
        )
        if any(not r.static for r in self._ropes):
            raise ValueError("AxialRoPE takes static scalings only (no sequence-length-dependent ones)")
        self.base = self._ropes[0].base
        self.angles = self._ropes[0].angles
        self._equal = len(set(self._ropes)) == 1

    def _identity(self) -> Hashable:
        return (self.head_dim, self.rotary_dim, self.layout, self.n_axes, self._ropes)

    def __repr__(self) -> str:
        return (
            f"AxialRoPE({self.head_dim}, n_axes={self.n_axes}, split={self.split}, base={self.base:g}, "
            f"layout={self.layout!r}, rotary_dim={self.rotary_dim})"
        )

    @property
    def _width(self) -> int:
        return self.rotary_dim

    def _needs_all_positions(self) -> bool:
        return True  # coordinates last: not the block-wise Dask path of 1-D positions

    def inv_freq(self) -> np.ndarray:
        """Frequency of every pair, shape ``(rotary_dim // 2,)``, float64 (axis blocks in order)."""
        return np.concatenate([r.inv_freq() for r in self._ropes])

    def axis_of_pair(self) -> np.ndarray:
        """Which coordinate each pair uses, shape ``(rotary_dim // 2,)``."""
        return np.repeat(np.arange(self.n_axes), [s // 2 for s in self.split])

    def _coord_shape(self, shape: tuple[Any, ...], name: str) -> tuple[Any, ...]:
        if not shape or shape[-1] != self.n_axes:
            raise ValueError(
                f"{name} must have shape (..., {self.n_axes}) (one coordinate per axis, last), "
                f"got shape {shape}"
            )
        return shape[:-1]

    def _pair_cos_sin(
        self, pos: Array, be: Backend, dev: Device, dtype: DType, rng: Range
    ) -> tuple[Array, Array]:
        xp = be.xp
        if self._equal:
            # All axes share one frequency vector: one call over (..., n_axes), then the axis
            # blocks are consecutive along the flattened last two axes.
            c, s = self._ropes[0]._pair_cos_sin(pos, be, dev, dtype, rng)
            lead = tuple(c.shape[:-2])
            n = self.rotary_dim // 2
            shape = v.known_shape(
                (*lead, n), f"pos of shape {tuple(pos.shape)}", "give it at most one dynamic dimension"
            )
            return xp.reshape(c, shape), xp.reshape(s, shape)
        cs = [r._pair_cos_sin(pos[..., a], be, dev, dtype, rng) for a, r in enumerate(self._ropes)]
        return xp.concat([c for c, _ in cs], axis=-1), xp.concat([s for _, s in cs], axis=-1)


def mrope_rows(sections: Any, *, interleaved: bool = False) -> np.ndarray:
    """Position row used by each frequency of M-RoPE, shape ``(sum(sections),)``.

    ``interleaved=False`` (Qwen2-VL): ``sections[j]`` consecutive frequencies take row ``j``.
    ``interleaved=True`` (Qwen3-VL): frequency ``i`` takes row ``j = i % len(sections)`` when
    ``j > 0`` and ``i < len(sections) * sections[j]``, else row 0.

    Examples
    --------
    >>> from rotary.multiaxis import mrope_rows
    >>> mrope_rows([2, 1, 1])
    array([0, 0, 1, 2])
    >>> mrope_rows([4, 2, 2], interleaved=True)
    array([0, 1, 2, 0, 1, 2, 0, 0])
    """
    return np.asarray(
        _rows(v.check_positive_ints(sections, "sections"), v.check_bool(interleaved, "interleaved")),
        dtype=np.int64,
    )


def _round_robin(sections: tuple[int, ...]) -> list[int]:
    """Qwen3-VL's rows as transformers lays them out for any sections: frequency ``i`` to row
    ``j = i % len(sections)`` when ``j > 0`` and ``i < len(sections) * sections[j]``, else row 0
    (the rows' counts need not be ``sections``)."""
    nr, n = len(sections), sum(sections)
    return [next((j for j in range(1, nr) if i % nr == j and i < nr * sections[j]), 0) for i in range(n)]


def _rows(sections: tuple[int, ...], interleaved: bool) -> list[int]:
    # Plain Python (no NumPy), so constructing an MRoPE inside a trace stays traceable.
    nr = len(sections)
    if not interleaved:
        return [j for j, s in enumerate(sections) for _ in range(s)]
    rows = _round_robin(sections)
    counts = tuple(rows.count(j) for j in range(nr))
    if counts != sections:
        raise ValueError(
            f"interleaved sections {sections} cannot be laid out round robin: rows would get "
            f"{counts} frequencies"
        )
    return rows


class MRoPE(Rotary):
    """Multimodal RoPE (M-RoPE) of Qwen2-VL, and the interleaved variant of Qwen3-VL.

    Parameters
    ----------
    head_dim : int
        Features per head (even).
    sections : sequence of int
        Frequencies per position row (HF ``mrope_section``, e.g. ``(16, 24, 24)`` for
        ``head_dim=128``), summing to ``rotary_dim // 2``.
    interleaved : bool
        ``False``: consecutive sections (Qwen2-VL, Qwen2.5-VL).  ``True``: round-robin rows
        (Qwen3-VL ``mrope_interleaved``), see :func:`mrope_rows`.
    rows : sequence of int, optional
        The position row of each frequency, for any other layout (ERNIE-4.5-VL alternates
        height and width rows, then the temporal one); ``sections`` must count them.
    base, layout, rotary_dim, scaling, angles
        As in :class:`rotary.RoPE` (HF Qwen-VL models use ``layout="half"``).
        ``angles="float32"`` reproduces them bit-for-bit on torch, bfloat16 and float16
        included: float32 angles, cos/sin cast to the input dtype and the rotation done in
        it, as HF does.  ``"exact"`` rotates in float32 or better.

    Notes
    -----
    ``pos`` has the rows first: shape ``(len(sections), ...)`` or ``(1, ...)`` (the same
    position on every row, i.e. 1-D RoPE), where ``...`` broadcasts against ``x.shape[:-1]``
    and has at least one axis (a 1-D ``pos`` of length 3 would be ambiguous: three rows of
    one token, or three tokens?); HF's ``position_ids`` of shape ``(3, batch, seq)``
    becomes ``position_ids[:, :, None, :]`` for ``(batch, heads, seq, head_dim)``.

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
        rows: Any = None,
        base: float = 10000.0,
        layout: Layout = "half",
        rotary_dim: int | None = None,
        scaling: Scaling | dict[str, Any] | None = None,
        angles: AngleMethod = "exact",
    ) -> None:
        self.rope = RoPE(
            head_dim, base=base, layout=layout, rotary_dim=rotary_dim, scaling=scaling, angles=angles
        )
        if getattr(self.rope.config.scaling, "per_sequence", False):
            raise ValueError(
                "scaling with per_sequence=True cannot serve an MRoPE: it would give each position "
                "row (t, h, w) of a sequence its own length; use per_sequence=False (HF's one length)"
            )
        self.head_dim, self.rotary_dim = self.rope.head_dim, self.rope.rotary_dim
        self.layout, self.base = self.rope.layout, self.rope.base
        self.sections = v.check_positive_ints(sections, "sections")
        if sum(self.sections) != self.rotary_dim // 2:
            raise ValueError(
                f"sections must sum to rotary_dim // 2 = {self.rotary_dim // 2} (one entry per "
                f"frequency), got {self.sections} (sum {sum(self.sections)})"
            )
        self.interleaved = v.check_bool(interleaved, "interleaved")
        if rows is None:
            self._rows = tuple(_rows(self.sections, self.interleaved))
        else:
            if self.interleaved:
                raise ValueError("give rows or interleaved=True, not both")
            got = tuple(
                v.check_int(r, "rows[i]", minimum=0) for r in v.check_sequence(rows, "rows", "row indices")
            )
            counts = tuple(got.count(j) for j in range(len(self.sections)))
            if len(got) != sum(self.sections) or counts != self.sections:
                raise ValueError(
                    f"rows must give each of the {sum(self.sections)} frequencies a row in "
                    f"range({len(self.sections)}), sections[j] of them row j; got {len(got)} rows "
                    f"counting {counts} for sections {self.sections}"
                )
            self._rows = got
        self._custom_rows = rows is not None
        self._masks = tuple(tuple(r == j for r in self._rows) for j in range(len(self.sections)))
        self._bounds = tuple(itertools.pairwise(itertools.accumulate(self.sections, initial=0)))

    def _identity(self) -> Hashable:
        return (self.rope, self.sections, self.interleaved, self._rows)

    def __repr__(self) -> str:
        il = ", interleaved=True" if self.interleaved else f", rows={self._rows}" if self._custom_rows else ""
        return f"MRoPE({self.head_dim}, sections={self.sections}{il}, rope={self.rope!r})"

    @property
    def attention_factor(self) -> float:
        return self.rope.attention_factor

    @property
    def _width(self) -> int:
        return self.rotary_dim

    def inv_freq(self) -> np.ndarray:
        """Frequencies, shape ``(rotary_dim // 2,)``, float64 (those of the 1-D RoPE)."""
        return self.rope.inv_freq()

    def rows(self) -> np.ndarray:
        """Position row of each pair, shape ``(rotary_dim // 2,)``."""
        return np.asarray(self._rows)

    @property
    def static(self) -> bool:
        return self.rope.static

    def _needs_all_positions(self) -> bool:
        return True  # rows first: the block-wise Dask path would split the rows

    def _rotation_dtype(self, x_dtype: DType, cdt: DType) -> DType:
        # HF's Qwen-VL text models cast cos/sin to the input dtype and rotate in it.
        return x_dtype if self.rope.angles == "float32" else cdt

    def _coord_shape(self, shape: tuple[Any, ...], name: str) -> tuple[Any, ...]:
        n = len(self.sections)
        if len(shape) < 2 or shape[0] not in (1, n):
            raise ValueError(
                f"{name} must have shape ({n}, ...) or (1, ...) with at least one axis after the rows "
                f"(position rows first, as HF's position_ids (3, batch, seq)); got shape {shape}"
                + (f"; for one token use {name}[:, None]" if len(shape) == 1 and shape[0] == n else "")
            )
        return shape[1:]

    def _pair_cos_sin(
        self, pos: Array, be: Backend, dev: Device, dtype: DType, rng: Range
    ) -> tuple[Array, Array]:
        xp = be.xp
        c, s = self.rope._pair_cos_sin(pos, be, dev, dtype, rng)  # (rows, ..., n)
        if pos.shape[0] == 1:
            return c[0, ...], s[0, ...]
        if not (self.interleaved or self._custom_rows):
            cs = [(c[j, ..., a:b], s[j, ..., a:b]) for j, (a, b) in enumerate(self._bounds)]
            return xp.concat([u for u, _ in cs], axis=-1), xp.concat([w for _, w in cs], axis=-1)
        oc, os_ = c[0, ...], s[0, ...]
        for j in range(1, len(self.sections)):
            m = xp.asarray(self._masks[j], dtype=xp.bool, device=dev)
            oc, os_ = xp.where(m, c[j, ...], oc), xp.where(m, s[j, ...], os_)
        return oc, os_
