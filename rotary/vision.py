"""Vision towers' 2-D RoPEs, as configurations of :class:`rotary.AxialRoPE`.

Each tower is an axial RoPE (which pairs take the row, which the column, and their
frequencies) plus the patch coordinates the model feeds it.  A :class:`VisionRoPE` holds both;
``positions(h, w)`` gives the coordinates of an ``h x w`` patch grid (one row per token, in
the model's token order), and ``apply``/``rotate`` rotate tokens with them.  Exact angles by
default; ``angles="float32"`` follows the towers' own float32 recipe.

- :func:`eva02` (EVA-02, timm ``RotaryEmbeddingCat``): interleaved; integer ``(row, col)``
  plus ``grid_offset``, rescaled to a reference grid as EVA does; ``base**(-4j/d)`` per axis.
- :func:`pixel` (lucidrains ``freqs_for="pixel"``, timm ``in_pixels=True``): interleaved;
  ``linspace(-1, 1)`` per axis; ``pi * linspace(1, max_freq / 2)`` (or log-spaced) per axis.
- :func:`dinov3`: half; ``2 pi`` times the patch centres in ``[-1, 1]`` (:func:`augment` for
  training's shift, jitter and rescale); ``base**(-4j/d)``; prefix tokens not rotated.
- :func:`llama4` (Llama 4 vision): interleaved; ``(col + 1, row + 1)``, the CLS token last at
  ``(0, 0)``; ``base**(-4j/d)``.
- :func:`pixtral`: half; ``(row, col)``; the even frequencies of ``base**(-2j/d)`` for the rows,
  the odd ones for the columns.
- :func:`qwen2_vl` (Qwen2-VL's vision encoder): half; ``(row, col)`` in ``2 x 2`` merge-window
  order; ``base**(-4j/d)``.

RoPE-Mixed (per-head trained frequencies mixing both coordinates) is :mod:`rotary.learned` with
:func:`mixed_frequencies` as the initial value.

Examples
--------
>>> import numpy as np, rotary
>>> tower = rotary.vision.eva02(64)
>>> tower.positions(2, 3).tolist()
[[0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [1, 2]]
>>> q = np.ones((1, 12, 6, 64), dtype=np.float32)     # (batch, heads, patches, head_dim)
>>> tower.rotate(q, 2, 3).shape
(1, 12, 6, 64)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any, Literal

import numpy as np

from ._backends import backend_for
from ._lib import _validation as v
from ._lib._compat import array_namespace, as_namespace, entry
from ._lib._typing import AngleMethod, Array, Namespace
from .multiaxis import AxialRoPE
from .scaling import Frequencies

__all__ = [
    "Grid",
    "VisionRoPE",
    "augment",
    "dinov3",
    "eva02",
    "llama4",
    "mixed_frequencies",
    "mlcd",
    "pixel",
    "pixtral",
    "qwen2_vl",
]


GridKind = Literal["raster", "eva02", "pixel", "dinov3", "llama4", "merge", "sam3"]


@dataclasses.dataclass(frozen=True)
class Grid:
    """The patch coordinates of a tower, as plain values (hashable, picklable, and a constant of a
    ``torch.compile`` trace); called as ``grid(h, w)``, it returns them ``(tokens, 2)``.

    ``kind``: ``"raster"`` (integer ``(row, col)``), ``"eva02"`` (raster plus ``offset``, rescaled
    to ``ref_shape``), ``"pixel"`` (``linspace(-1, 1)`` per axis), ``"dinov3"`` (``2 pi`` times
    the patch centres in ``[-1, 1]``, after ``prefix_tokens`` at 0), ``"llama4"`` (``(col + 1,
    row + 1)``, then the CLS token at ``(0, 0)``), ``"merge"`` (integer ``(row, col)`` in
    ``merge x merge`` blocks, the order of ``transformers``' ``get_vision_position_ids``; with
    ``window``: the blocks grouped into windows of ``window x window`` blocks, windows in raster
    order and blocks in raster order inside each (``get_vision_window_index``'s order, edge
    windows partial); ``xy``: ``(col, row)``; plus ``offset`` (a whole number); ``frames``: a
    frame coordinate first, 0 for an image), ``"sam3"`` (``(col, row)`` times ``ref_shape[1] /
    w``, formed in float32 as SAM 3's ViT forms them).

    Examples
    --------
    >>> from rotary.vision import Grid
    >>> Grid("merge", merge=2)(2, 4).tolist()
    [[0, 0], [0, 1], [1, 0], [1, 1], [0, 2], [0, 3], [1, 2], [1, 3]]
    >>> Grid("merge", window=2, xy=True, offset=1)(3, 3).tolist()  # (col + 1, row + 1), 2 x 2 windows
    [[1, 1], [2, 1], [1, 2], [2, 2], [3, 1], [3, 2], [1, 3], [2, 3], [3, 3]]
    """

    kind: GridKind
    offset: float = 0.0
    ref_shape: tuple[float, float] | None = None
    prefix_tokens: int = 0
    merge: int = 1
    window: int = 0
    xy: bool = False
    frames: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "merge", v.check_int(self.merge, "merge", minimum=1))
        object.__setattr__(self, "window", v.check_int(self.window, "window", minimum=0))

    def __call__(self, h: int, w: int) -> np.ndarray:
        if self.kind == "eva02":
            r, c = _grid(h, w)
            if self.offset == 0.0 and self.ref_shape is None:
                return np.stack([r, c], axis=-1)
            rr, cc = r + self.offset, c + self.offset
            if self.ref_shape is not None:
                rr, cc = rr / h * self.ref_shape[0], cc / w * self.ref_shape[1]
            return np.stack([rr, cc], axis=-1).astype(np.float64)
        if self.kind == "pixel":
            rows, cols = np.meshgrid(np.linspace(-1.0, 1.0, h), np.linspace(-1.0, 1.0, w), indexing="ij")
            return np.stack([rows.reshape(-1), cols.reshape(-1)], axis=-1)
        if self.kind == "dinov3":
            ch, cw = (np.arange(0.5, h) / h) * 2.0 - 1.0, (np.arange(0.5, w) / w) * 2.0 - 1.0
            rows, cols = np.meshgrid(ch, cw, indexing="ij")
            patches = 2.0 * math.pi * np.stack([rows.reshape(-1), cols.reshape(-1)], axis=-1)
            return np.concatenate([np.zeros((self.prefix_tokens, 2)), patches])
        if self.kind == "llama4":
            r, c = _grid(h, w)
            return np.concatenate([np.stack([c + 1, r + 1], axis=-1), np.zeros((1, 2), dtype=np.int64)])
        if self.kind == "merge":
            return _merge_grid(self, h, w)
        if self.kind == "sam3":
            if self.ref_shape is None:
                raise ValueError("a 'sam3' grid needs ref_shape (its window size)")
            r, c = _grid(h, w)
            scale = np.float32(self.ref_shape[1] / w)  # (torch: a float32 tensor times a Python float)
            return np.stack([c.astype(np.float32) * scale, r.astype(np.float32) * scale], axis=-1)
        r, c = _grid(h, w)
        return np.stack([r, c], axis=-1)


def _merge_grid(g: Grid, h: int, w: int) -> np.ndarray:
    """A ``"merge"`` :class:`Grid`'s coordinates (integers)."""
    m, n = g.merge, g.window
    if h % m or w % m:
        raise ValueError(f"h and w must be multiples of merge={m}, got {h} x {w}")
    if g.offset != int(g.offset):
        raise ValueError(f"a 'merge' grid takes a whole-number offset, got {g.offset}")
    r, c = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")

    def order(a: np.ndarray) -> np.ndarray:
        return a.reshape(h // m, m, w // m, m).transpose(0, 2, 1, 3).reshape(-1)

    pos = np.stack([order(c), order(r)] if g.xy else [order(r), order(c)], axis=-1) + int(g.offset)
    if n:  # blocks grouped into n x n windows (raster over windows, then over blocks)
        bh, bw = h // m, w // m
        blocks = np.arange(bh * bw).reshape(bh, bw)
        units = np.concatenate(
            [blocks[i : i + n, j : j + n].reshape(-1) for i in range(0, bh, n) for j in range(0, bw, n)]
        )
        pos = pos[(units[:, None] * (m * m) + np.arange(m * m)).reshape(-1)]
    if g.frames:
        pos = np.concatenate([np.zeros((pos.shape[0], 1), dtype=pos.dtype), pos], axis=-1)
    return pos


def _grid_positions(grid: Callable[[int, int], np.ndarray], h: int, w: int, float64: bool) -> np.ndarray:
    """``grid(h, w)``; fractional coordinates in float32 where the data's device has no float64
    (the towers compute their coordinates in float32 themselves)."""
    pos = grid(h, w)
    return pos.astype(np.float32) if pos.dtype.kind == "f" and not float64 else pos


@dataclasses.dataclass(frozen=True)
class VisionRoPE:
    """A vision tower's RoPE: the axial rotation and the coordinates of its tokens.

    ``grid`` is a :class:`Grid` for the towers here; any callable ``(h, w) -> (tokens, 2)``
    NumPy array works eagerly and under ``jax.jit`` (under ``torch.compile`` a :class:`Grid`,
    whose plain values the trace can hold, is needed).
    """

    name: str
    rope: AxialRoPE
    grid: Callable[[int, int], np.ndarray] = dataclasses.field(repr=False)

    @property
    def head_dim(self) -> int:
        return self.rope.head_dim

    def positions(self, h: int, w: int) -> np.ndarray:
        """Coordinates ``(tokens, 2)`` of an ``h x w`` patch grid, in the model's token order."""
        return self.grid(v.check_int(h, "h", minimum=1), v.check_int(w, "w", minimum=1))

    def _positions_for(self, x: Array, h: int, w: int) -> Any:
        """The grid's coordinates for data ``x``, host values computed for real even inside a
        trace (:meth:`~rotary._backends.Backend.eager`)."""
        h, w = v.check_int(h, "h", minimum=1), v.check_int(w, "w", minimum=1)
        be = backend_for(array_namespace(x, names=("x",)))
        return be.eager(_grid_positions, self.grid, h, w, be.has_float64(be.creation_device(x)))

    @entry
    def rotate(self, x: Array, h: int, w: int) -> Array:
        """Rotate tokens ``(..., tokens, head_dim)`` of an ``h x w`` grid."""
        return self.rope.rotate(x, self._positions_for(x, h, w))

    @entry
    def apply(self, q: Array, k: Array, h: int, w: int) -> tuple[Array, Array]:
        """Rotate queries and keys of an ``h x w`` grid."""
        return self.rope.apply(q, k, self._positions_for(q, h, w))


def _linspace(start: float, stop: float, n: int) -> list[float]:
    """``numpy.linspace(start, stop, n)`` in Python floats, the same operations (``i * step +
    start``, the last value ``stop``): construction inside a ``torch.compile`` trace runs no NumPy."""
    if n <= 1:
        return [start] * n
    step = (stop - start) / (n - 1)
    return [i * step + start for i in range(n - 1)] + [stop]


def _grid(h: int, w: int) -> tuple[np.ndarray, np.ndarray]:
    rows, cols = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    return rows.reshape(-1), cols.reshape(-1)


def _axial(head_dim: int, layout: Any, base: float, angles: AngleMethod, **kw: Any) -> AxialRoPE:
    d = v.check_head_dim(head_dim)
    if d % 4:
        raise ValueError(f"a 2-D RoPE splits the head into two halves of pairs: head_dim % 4 == 0, got {d}")
    return AxialRoPE(d, 2, layout=layout, base=base, angles=angles, **kw)


def eva02(
    head_dim: int,
    *,
    base: float = 10000.0,
    grid_offset: float = 0.0,
    ref_shape: tuple[int, int] | None = None,
    angles: AngleMethod = "exact",
) -> VisionRoPE:
    """EVA-02 / timm ``RotaryEmbeddingCat(in_pixels=False)``: integer ``(row, col)`` coordinates
    plus ``grid_offset``, rescaled to ``ref_shape`` (EVA's fine-tuning at another resolution:
    ``t * ref / size``); each axis a 1-D RoPE of ``head_dim / 2`` features, interleaved pairs."""
    ref = None if ref_shape is None else (ref_shape[0], ref_shape[1])
    grid = Grid("eva02", offset=float(grid_offset), ref_shape=ref)
    return VisionRoPE("eva02", _axial(head_dim, "interleaved", base, angles), grid)


def pixel(
    head_dim: int,
    *,
    max_freq: float = 224.0,
    linear_bands: bool = True,
    rotary_dim: int | None = None,
    angles: AngleMethod = "exact",
) -> VisionRoPE:
    """Pixel frequencies (lucidrains ``freqs_for="pixel"`` axial, timm ``in_pixels=True``):
    coordinates ``linspace(-1, 1, size)`` per axis; frequencies ``pi * linspace(1, max_freq / 2,
    n)`` (``linear_bands``) or ``pi * 2**linspace(0, log2(max_freq) - 1, n)``, ``n`` pairs per
    axis; interleaved pairs; ``rotary_dim`` features rotate (default the whole head)."""
    d = v.check_head_dim(head_dim)
    r = v.check_rotary_dim(rotary_dim, d)
    n = r // 4
    mf = v.check_float(max_freq, "max_freq", above=0.0)
    if linear_bands:
        bands = _linspace(1.0, mf / 2, n)
    else:
        bands = [2.0**b for b in _linspace(0.0, math.log2(mf) - 1, n)]
    sc = Frequencies(tuple(b * math.pi for b in bands))
    rope = AxialRoPE(d, 2, layout="interleaved", rotary_dim=r, angles=angles, scaling=sc)
    return VisionRoPE("pixel", rope, Grid("pixel"))


def augment(
    coords: np.ndarray,
    *,
    shift: float | None = None,
    jitter: float | None = None,
    rescale: float | None = None,
    rng: Any = None,
    values: dict[str, Any] | None = None,
) -> np.ndarray:
    """DINOv3's training-time augmentations of patch coordinates ``(tokens, 2)`` in ``[-1, 1]``:
    add a uniform ``(dh, dw)`` in ``[-shift, shift]``, multiply by a log-uniform ``(jh, jw)`` in
    ``[1/jitter, jitter]``, then by one log-uniform factor in ``[1/rescale, rescale]``.

    The random values come from ``rng`` (a ``numpy.random.Generator`` or a seed: reproducible),
    or are given in ``values`` (``{"shift": (dh, dw), "jitter": (jh, jw), "rescale": s}``).
    """
    out = np.asarray(coords, dtype=np.float64)
    gen = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
    given = dict(values or {})
    for key, amount in (("shift", shift), ("jitter", jitter), ("rescale", rescale)):
        if amount is None and key not in given:
            continue
        if key in given:
            val = np.asarray(given[key], dtype=np.float64)
        elif key == "shift":
            a = v.check_float(amount, key, above=0.0)
            val = gen.uniform(-a, a, size=2)
        else:
            span = math.log(v.check_float(amount, key, above=0.0))
            val = np.exp(gen.uniform(-span, span, size=2 if key == "jitter" else 1))
        out = out + val if key == "shift" else out * val
    return out


def dinov3(
    head_dim: int,
    *,
    base: float = 100.0,
    prefix_tokens: int = 1,
    angles: AngleMethod = "exact",
) -> VisionRoPE:
    """DINOv3 (``DINOv3ViTRopePositionEmbedding``): patch centres ``((i + 0.5) / size) * 2 - 1``
    per axis, times ``2 pi`` (the angle is ``2 pi * coord * base**(-4j/d)``); half layout;
    the ``prefix_tokens`` (CLS and registers) come first and are not rotated (coordinate 0).
    For training, pass :func:`augment`-ed coordinates to ``rope.rotate`` (times ``2 pi``)."""
    grid = Grid("dinov3", prefix_tokens=v.check_int(prefix_tokens, "prefix_tokens", minimum=0))
    return VisionRoPE("dinov3", _axial(head_dim, "half", base, angles), grid)


def llama4(head_dim: int, *, base: float = 10000.0, angles: AngleMethod = "exact") -> VisionRoPE:
    """Llama 4 vision (``Llama4VisionRotaryEmbedding``): coordinates ``(col + 1, row + 1)`` of the
    patches, then the CLS token (last) at ``(0, 0)`` (not rotated); interleaved pairs, each axis
    a 1-D RoPE of ``head_dim / 2`` features (the x pairs first)."""
    return VisionRoPE("llama4", _axial(head_dim, "interleaved", base, angles), Grid("llama4"))


def pixtral(head_dim: int, *, base: float = 10000.0, angles: AngleMethod = "exact") -> VisionRoPE:
    """Pixtral (``PixtralVisionRotaryEmbedding``): ``(row, col)``; the frequencies of a 1-D RoPE
    of ``head_dim`` features, the even ones to the rows and the odd ones to the columns; half
    layout."""
    d = v.check_head_dim(head_dim)
    b = v.check_base(base)
    f = [b ** (-float(j) / d) for j in range(0, d, 2)]  # (Python floats: a trace folds them)
    even, odd = (Frequencies(tuple(f[i::2])) for i in (0, 1))
    rope = _axial(d, "half", base, angles, scaling=(even, odd))
    return VisionRoPE("pixtral", rope, Grid("raster"))


def qwen2_vl(
    head_dim: int, *, base: float = 10000.0, merge: int = 2, angles: AngleMethod = "exact"
) -> VisionRoPE:
    """Qwen2-VL's vision encoder (``VisionRotaryEmbedding``): ``(row, col)`` with tokens in
    ``merge x merge`` windows (the order of its patch merger); half layout."""
    m = v.check_int(merge, "merge", minimum=1)
    return VisionRoPE("qwen2_vl", _axial(head_dim, "half", base, angles), Grid("merge", merge=m))


def mlcd(head_dim: int, *, base: float = 10000.0, angles: AngleMethod = "exact") -> VisionRoPE:
    """MLCD (``MLCDRotaryEmbedding``, HF ``rope_type="axial"``): ``(row, col)`` in raster order,
    each axis with the frequencies of a ``head_dim / 2`` RoPE, rows first; half layout over the
    whole head.  Its class token (first) is not at a grid position: the model rotates it by the
    learned angles ``class_pos_emb`` (a parameter), i.e. ``rotary.learned.rotate(x_cls, 1,
    class_pos_emb[0])``; :meth:`VisionRoPE.rotate` covers the patch tokens.

    Examples
    --------
    >>> import rotary
    >>> rotary.vision.mlcd(8).positions(2, 2).tolist()
    [[0, 0], [0, 1], [1, 0], [1, 1]]
    """
    return dataclasses.replace(qwen2_vl(head_dim, base=base, merge=1, angles=angles), name="mlcd")


def mixed_frequencies(
    head_dim: int,
    heads: int,
    *,
    temperature: float = 10.0,
    rotate: bool = True,
    seed: Any = None,
    xp: Namespace | None = None,
    dtype: Any = None,
) -> Array:
    """RoPE-Mixed's initial frequencies (Heo et al. 2024), ``(heads, 1, 2, head_dim / 2)`` for
    :mod:`rotary.learned`: magnitudes ``temperature**(-4j/d)``; per head a random direction
    ``phi`` (``rotate``, from ``seed``), the x frequencies ``[m cos phi, m cos(phi + pi/2)]`` and
    the y ones ``[m sin phi, m sin(phi + pi/2)]``.  NumPy float64 by default."""
    d = v.check_head_dim(head_dim)
    h = v.check_int(heads, "heads", minimum=1)
    mag = temperature ** (-np.arange(0, d, 4, dtype=np.float64) / d)
    phi = np.random.default_rng(seed).uniform(0, 2 * math.pi, size=(h, 1)) if rotate else np.zeros((h, 1))
    fx = np.concatenate([mag * np.cos(phi), mag * np.cos(phi + math.pi / 2)], axis=-1)
    fy = np.concatenate([mag * np.sin(phi), mag * np.sin(phi + math.pi / 2)], axis=-1)
    f = np.stack([fx, fy], axis=1)[:, None]  # (heads, 1, 2, d / 2)
    if xp is None:
        return f if dtype is None else f.astype(dtype)
    xp = as_namespace(xp)
    return xp.asarray(f, dtype=xp.float32 if dtype is None else dtype)
