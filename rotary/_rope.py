"""``RoPE``: one RoPE configuration held once, and the rotation code every RoPE class shares.

:class:`Rotary` implements ``apply``, ``rotate`` and ``cos_sin`` once, for
:class:`RoPE` and for the multi-axis classes of :mod:`rotary.multiaxis`; a subclass only
says how positions become per-pair cos/sin (``_pair_cos_sin``) and what shape one
position has (``_coord_shape``).
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Hashable
from typing import Any

import numpy as np

from . import _hfconfig
from ._backends import Backend, backend_for
from ._config import RopeConfig, build_constant
from ._lib import _validation as v
from ._lib._cache import MISSING, fast_paths_enabled, get_or_build, memo_add, memo_get
from ._lib._compat import array_namespace, as_namespace, entry, is_array, library_name, namespace_of
from ._lib._typing import AngleMethod, Array, Device, DType, Layout, Namespace, PartialMode, RotaryEmbedding
from ._math._angles import float32_angles, float32_recipe
from ._math._rotation import expand_pairs
from .scaling import Scaling, as_fields, from_fields, resolve

__all__ = ["RoPE", "Rotary", "default_rope", "eager_positions", "rope_of"]

Range = tuple[int, int] | None


class Rotary:
    """What every RoPE class shares: validation, positions, and the rotation itself."""

    head_dim: int
    layout: Layout
    #: The axis of positions that runs along the sequence (the last of the coordinate shape).
    seq_axis: int = -1

    # -- subclass hooks ------------------------------------------------------------------------
    def _identity(self) -> Hashable:
        """What makes two instances of one class the same rotation (equality and hash)."""
        raise NotImplementedError

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other._identity() == self._identity()

    def __hash__(self) -> int:
        return hash((type(self).__name__, self._identity()))

    def _pair_cos_sin(
        self, pos: Array, be: Backend, dev: Device, dtype: DType, rng: Range
    ) -> tuple[Array, Array]:
        """cos/sin (attention factor applied) of shape ``coord_shape + (width // 2,)``."""
        raise NotImplementedError

    def _coord_shape(self, shape: tuple[Any, ...], name: str) -> tuple[Any, ...]:
        """The shape of one coordinate of positions of shape ``shape`` (what broadcasts
        against ``x.shape[:-1]``)."""
        return shape

    @property
    def _width(self) -> int:
        """Features handed to the rotation (the rest pass through)."""
        raise NotImplementedError

    def _rotation_dtype(self, x_dtype: DType, cdt: DType) -> DType:
        """The dtype the rotation runs in (``cdt``: float32 or better)."""
        return cdt

    @property
    def static(self) -> bool:
        """True when the angles depend on each position alone (no sequence-length-dependent
        scaling): what linear attention needs."""
        return True

    # -- public API ----------------------------------------------------------------------------
    @entry
    def cos_sin(
        self,
        pos: Any,
        *,
        xp: Namespace | None = None,
        device: Device = None,
        dtype: DType = None,
        full: bool = False,
    ) -> tuple[Array, Array]:
        """cos and sin of the rotation angles at ``pos`` (attention factor applied).

        Parameters
        ----------
        pos : array or int or sequence
            Positions.  With ``xp=None`` the namespace is that of ``pos`` (NumPy for Python
            values).
        xp, device, dtype
            Namespace, device and floating dtype of the result (defaults: those of ``pos``;
            float32).  Integer dtypes are refused.
        full : bool
            ``False``: shape ``coord_shape + (rotary_dim // 2,)``, one value per pair.
            ``True``: shape ``coord_shape + (rotary_dim,)``, laid out for ``self.layout``
            (``"half"``: ``concat(c, c)`` as Hugging Face returns it; ``"interleaved"``: each
            value repeated twice).

        Examples
        --------
        >>> import rotary
        >>> c, s = rotary.RoPE(4).cos_sin([0, 1])
        >>> c.shape
        (2, 2)
        >>> float(c[1, 0]), float(s[0, 1])
        (0.5403022766113281, 0.0)
        """
        # (NumPy for Python values)
        xp = as_namespace(xp) if xp is not None else array_namespace(pos, names=("pos",))
        be = backend_for(xp)
        jp = be.jagged(pos)
        if jp is not None:  # nested positions: nested cos and sin of the same documents
            c, s = self.cos_sin(jp.values, xp=xp, device=device, dtype=dtype, full=full)
            return jp.wrap(c), jp.wrap(s)
        dtype = xp.float32 if dtype is None else dtype
        if not v.is_floating(dtype):
            raise TypeError(f"dtype must be a real floating dtype, got {v.dtype_name(dtype)}")
        full = v.check_bool(full, "full")
        if device is None and is_array(pos) and library_name(array_namespace(pos, names=("pos",))) == be.name:
            device = be.creation_device(pos)
        self._coord_shape(be.position_shape(pos, name="pos"), "pos")  # (the check every entry makes)
        p, rng = be.positions(pos, name="pos", device=device)
        if device is None:
            device = be.creation_device(p)
        if be.jit_eagerly():
            if not any(dtype == getattr(xp, n) for n in v.FLOAT_NAMES if hasattr(xp, n)):
                raise _foreign_dtype(dtype, be)
            jit = be.jit(_cos_sin_jit, (0, 1, 2, 3, 4, 5))
            return jit(self, be, device, dtype, full, fast_paths_enabled(), p)
        return self._cos_sin(be, device, dtype, full, p, rng)

    def _cos_sin(
        self, be: Backend, dev: Device, dtype: DType, full: bool, p: Array, rng: Range
    ) -> tuple[Array, Array]:
        c, s = self._pair_cos_sin(p, be, dev, be.compute_dtype(dtype), rng)
        if full:
            c, s = expand_pairs(c, self.layout, be.xp), expand_pairs(s, self.layout, be.xp)
        if c.dtype != dtype:
            try:
                c, s = be.xp.astype(c, dtype), be.xp.astype(s, dtype)
            except (TypeError, ValueError):
                raise _foreign_dtype(dtype, be) from None
        return be.owned(c), be.owned(s)  # (the caller's: never halves of one buffer)

    @entry
    def rotate(self, x: Array, pos: Any = None) -> Array:
        """Rotate one array ``x`` of shape ``(..., head_dim)`` at positions ``pos``.

        ``pos`` broadcasts against ``x.shape[:-1]``; it is an array of ``x``'s library, a
        NumPy array or Python values.  Returns an array of ``x``'s namespace, device, shape
        and dtype.  A nested (jagged) ``x`` is rotated in its own layout: ``pos`` nested alike,
        or ``None`` (each document from position 0); the result is nested alike.

        Examples
        --------
        >>> import numpy as np, rotary
        >>> x = np.ones((3, 4), dtype=np.float32)
        >>> rotary.RoPE(4).rotate(x, np.arange(3)).round(3)
        array([[ 1.   ,  1.   ,  1.   ,  1.   ],
               [-0.301,  0.99 ,  1.382,  1.01 ],
               [-1.325,  0.98 ,  0.493,  1.02 ]], dtype=float32)
        """
        xp = namespace_of(x, names=("x",))
        be = backend_for(xp)
        j = be.jagged(x)
        if j is not None:
            return j.wrap(self.rotate(j.values, be.jagged_positions(j, pos, "pos", "x")))
        sig = be.signature(x, pos)
        if sig is None or memo_get((self, "rotate", sig)) is MISSING:
            v.check_head_array(x, "x", self.head_dim)
            be.check_dense([("x", x)])
            self._check_positions(be, pos, x, "pos", "x")
            if sig is not None:
                memo_add((self, "rotate", sig))
        dev = be.creation_device(x)
        p, rng = be.positions(pos, name="pos", device=dev)
        if be.lazy and not self._needs_all_positions():
            return be.map_positions(self.rotate, x, p, name="x", pos_name="pos")
        return self._rotate(be, x, p, rng, dev)

    @entry
    def apply(self, q: Array, k: Array, pos: Any = None, *, k_pos: Any = None) -> tuple[Array, Array]:
        """Rotate queries and keys; ``k_pos`` (default ``pos``) gives the keys' positions.

        ``q`` and ``k`` may have different head counts (grouped-query attention) and, with
        ``k_pos``, different sequence lengths (a KV cache).  Nested (jagged) ``q`` and ``k`` of
        the same documents are rotated in their own layout (``pos`` nested alike, or ``None``:
        each document from position 0).

        Examples
        --------
        >>> import numpy as np, rotary
        >>> rope = rotary.RoPE(8)
        >>> q = np.random.default_rng(0).normal(size=(1, 4, 5, 8)).astype(np.float32)
        >>> qr, kr = rope.apply(q, q, np.arange(5))
        >>> bool(np.allclose((qr * qr).sum(-1), (q * q).sum(-1), rtol=1e-5))
        True
        """
        xp = namespace_of(q, k, names=("q", "k"))
        be = backend_for(xp)
        jq, jk = be.jagged(q), be.jagged(k)
        if jq is not None or jk is not None:
            return _apply_jagged(self, be, jq, jk, pos, k_pos)
        sig = be.signature(q, k, pos, k_pos)
        key = (self, "apply", sig)
        plan: Any = MISSING if sig is None else memo_get(key)
        if plan is MISSING:
            self._check_apply(be, q, k, pos, k_pos)
            if sig is not None:
                memo_add(key, None if k_pos is not None else self._decode_plan(be, q, k, pos))
        elif plan is not None and (out := plan(q, k, pos)) is not None:
            return out
        dev = be.creation_device(q)
        p, rng = be.positions(pos, name="pos", device=dev)
        kp, krng = (p, rng) if k_pos is None else be.positions(k_pos, name="k_pos", device=dev)
        if be.lazy and not self._needs_all_positions():
            rot = self.rotate
            return (
                be.map_positions(rot, q, p, name="q", pos_name="pos"),
                be.map_positions(rot, k, kp, name="k", pos_name="k_pos"),
            )
        if kp is p:
            if be.jit_eagerly():
                return be.jit(_apply_jit, (0, 1, 2, 3))(self, be, dev, fast_paths_enabled(), q, k, p)
            return self._rotate_both(be, q, k, p, rng, dev)
        return self._rotate(be, q, p, rng, dev), self._rotate(be, k, kp, krng, dev)

    # -- shared steps --------------------------------------------------------------------------
    def _decode_plan(self, be: Backend, q: Array, k: Array, pos: Any) -> Any:
        """The backend's shortcut for later :meth:`apply` calls with arguments like these
        (decoding), or ``None``; the shortcut returns ``None`` where it does not apply."""
        return None

    def _decode_rows(self, be: Backend, q: Array, k: Array) -> Any:
        """The backend's rows of this rotation for decoding steps' own kernels on arguments
        like ``q`` and ``k`` (:meth:`Backend.decode_rows`), or ``None``."""
        return None

    def _needs_all_positions(self) -> bool:
        """Dynamic scalings read the sequence length from every position (no block-wise Dask)."""
        return not self.static

    def _check_apply(self, be: Backend, q: Array, k: Array, pos: Any, k_pos: Any) -> None:
        """Every check of ``apply`` that depends on the arguments' types, shapes, dtypes and
        devices only (the position values are checked on every call)."""
        v.check_head_array(q, "q", self.head_dim)
        v.check_array(k, "k")
        v.check_qk(q, k, seq_axis=None if k_pos is None else q.ndim - 2)
        v.check_head_array(k, "k", self.head_dim)
        be.check_dense([("q", q), ("k", k)])
        v.check_same_dtype([("q", q), ("k", k)])
        be.check_devices([("q", q), ("k", k)])
        if k_pos is not None and not self.static:
            raise ValueError(
                "k_pos= with a scaling that depends on the sequence length (DynamicNTK, LongRoPE) would "
                "rotate q and k with different frequencies (scores not a function of m - n); rotate "
                "them with shared positions, or use a static scaling"
            )
        coord = self._check_positions(be, pos, q, "pos", "q")
        if k_pos is None:
            v.check_broadcast(coord, tuple(k.shape[:-1]), "pos", "k")
        else:
            self._check_positions(be, k_pos, k, "k_pos", "k")

    def _check_positions(self, be: Backend, pos: Any, x: Array, name: str, x_name: str) -> tuple[Any, ...]:
        """The type, shape and device of positions ``pos`` for ``x``; returns one coordinate's shape."""
        shape = be.position_shape(pos, name=name)
        if is_array(pos) and library_name(array_namespace(pos, names=(name,))) == be.name:
            be.check_devices([(x_name, x), (name, pos)])
        coord = self._coord_shape(shape, name)
        lead = tuple(x.shape[:-1])
        v.check_broadcast(coord, lead, name, x_name)
        _check_unambiguous(coord, lead, name, x_name)
        return coord

    def _cos_sin_for(self, be: Backend, x: Array, p: Array, rng: Range, dev: Device) -> tuple[Array, Array]:
        cdt = be.compute_dtype(x.dtype)
        c, s = self._pair_cos_sin(p, be, dev, cdt, rng)
        rd = self._rotation_dtype(x.dtype, cdt)
        if c.dtype != rd:
            c, s = be.xp.astype(c, rd), be.xp.astype(s, rd)
        return be.materialize(c, s)

    def _rotate(self, be: Backend, x: Array, p: Array, rng: Range, dev: Device) -> Array:
        if be.jit_eagerly():  # JAX outside a trace: one compiled program, no host transfers
            return be.jit(_rotate_jit, (0, 1, 2, 3))(self, be, dev, fast_paths_enabled(), x, p)
        c, s = self._cos_sin_for(be, x, p, rng, dev)
        return be.rotate(x, c, s, layout=self.layout, rotary_dim=self._width)

    def _rotate_both(
        self, be: Backend, q: Array, k: Array, p: Array, rng: Range, dev: Device
    ) -> tuple[Array, Array]:
        c, s = self._cos_sin_for(be, q, p, rng, dev)
        return be.rotate_both(q, k, c, s, layout=self.layout, rotary_dim=self._width)


def _apply_jagged(rope: Rotary, be: Backend, jq: Any, jk: Any, pos: Any, k_pos: Any) -> tuple[Array, Array]:
    """:meth:`Rotary.apply` of nested queries and keys: their values, one position per token."""
    if jq is None or jk is None:
        raise TypeError(
            "q and k must both be nested (the same documents) or both dense; got one of each: pass "
            "the flat values of the nested one with cu_seqlens=x.offsets() to rotary.apply"
        )
    be.check_same_documents(jq, jk, "q", "k")
    if k_pos is not None:
        raise ValueError("nested q and k share their documents and positions: pass pos= alone (nested)")
    pq = be.jagged_positions(jq, pos, "pos", "q")
    pk = (
        pq
        if jq.axis == jk.axis and jq.values.ndim == jk.values.ndim
        else be.jagged_positions(jk, pos, "pos", "k")
    )
    qr, kr = (
        rope.apply(jq.values, jk.values, pq)
        if pk is pq
        else (rope.rotate(jq.values, pq), rope.rotate(jk.values, pk))
    )
    return jq.wrap(qr), jk.wrap(kr)


# The jitted cores of JAX eager calls (static: the rotation, its backend, the device and the
# fast-path switch, read while tracing; the positions are traced, so their values are read
# outside, by the checks, and never here).
def _rotate_jit(rope: Rotary, be: Backend, dev: Device, fast: bool, x: Array, p: Array) -> Array:
    c, s = rope._cos_sin_for(be, x, p, None, dev)
    return be.rotate(x, c, s, layout=rope.layout, rotary_dim=rope._width)


def _apply_jit(
    rope: Rotary, be: Backend, dev: Device, fast: bool, q: Array, k: Array, p: Array
) -> tuple[Array, Array]:
    return rope._rotate_both(be, q, k, p, None, dev)


def _cos_sin_jit(
    rope: Rotary, be: Backend, dev: Device, dtype: DType, full: bool, fast: bool, p: Array
) -> tuple[Array, Array]:
    return rope._cos_sin(be, dev, dtype, full, p, None)


def _foreign_dtype(dtype: Any, be: Backend) -> TypeError:
    return TypeError(f"dtype {dtype!r} is not a dtype of {be.name} (pos's library, or xp=)")


def _check_unambiguous(coord: tuple[Any, ...], lead: tuple[Any, ...], name: str, x_name: str) -> None:
    """Refuse positions whose first axis equals the batch size but would be broadcast against a
    later axis: HF ``position_ids`` of shape ``(batch, seq)`` on ``(batch, heads, seq, dim)``
    would otherwise be read as ``(heads, seq)`` whenever ``batch == heads``."""
    if 2 <= len(coord) < len(lead) and coord[0] != 1 and coord[0] == lead[0]:
        raise ValueError(
            f"{name} of shape {coord} is ambiguous against {x_name}.shape[:-1] = {lead}: it broadcasts "
            f"against the last {len(coord)} axes, so its first axis would be read as axis "
            f"{len(lead) - len(coord)} (size {lead[len(lead) - len(coord)]}), not as the batch axis. "
            f"For HF position_ids of shape (batch, seq) on (batch, heads, seq, dim) pass "
            f"{name}[:, None, :]; to mean axis {len(lead) - len(coord)}, add the leading axes "
            f"explicitly ({name}[None])"
        )


class RoPE(Rotary):
    """A RoPE configuration: frequencies, layout, partial rotary, scaling.

    Parameters
    ----------
    head_dim : int
        Features per head (even).
    base : float
        RoPE base ``theta`` (``rope_theta``), default 10000.
    layout : {"half", "interleaved"}
        Pairing of features: ``"half"`` pairs ``i`` with ``i + r/2`` (GPT-NeoX, Hugging Face
        LLaMA); ``"interleaved"`` pairs ``2i`` with ``2i + 1`` (RoFormer, Meta LLaMA, GPT-J).
    rotary_dim : int, optional
        Rotate only ``rotary_dim`` features of each head (even); the rest pass through.
        Which features and which frequencies depend on ``partial``.
    scaling : Scaling or dict, optional
        A context-extension scaling from :mod:`rotary.scaling`, or a Hugging Face
        ``rope_scaling`` dict.
    angles : {"exact", "float32"}
        ``"exact"`` (default): angles within 2e-7 of the float64 truth for integer
        positions up to 2**36 on every backend.  ``"float32"``: the common float32 recipe,
        bit-for-bit Hugging Face on torch: angles in float32, cos/sin cast to the input
        dtype and the rotation done in it (as HF's ``apply_rotary_pos_emb`` does).
    partial : {"neox", "proportional"}
        How ``rotary_dim < head_dim`` is read.  ``"neox"`` (default; GPT-NeoX ``rotary_pct``,
        GPT-J ``rotary_dim``, HF ``partial_rotary_factor``): the first ``rotary_dim``
        features form the pairs and the frequency exponent uses ``rotary_dim``.
        ``"proportional"`` (Gemma, HF ``rope_type="proportional"``): the exponent uses
        ``head_dim``, the pairs span the whole head and only the first ``rotary_dim // 2``
        pairs rotate (the others have frequency 0).  ``inv_freq`` and ``cos_sin`` then have
        ``head_dim // 2`` entries, as in Hugging Face.

    Notes
    -----
    The configuration is held in :attr:`config`, a frozen :class:`RopeConfig`; two RoPEs
    with equal configurations are equal and share their cached constants.  Under
    ``jax.jit`` and ``torch.compile`` the frequency tables are compile-time constants and
    the positions stay traced; for ``torch.compile``, construct the ``RoPE`` outside the
    compiled function (as you would a module).

    Examples
    --------
    >>> import numpy as np, rotary
    >>> rope = rotary.RoPE(64)
    >>> q = np.ones((2, 8, 16, 64), dtype=np.float32)
    >>> q_rot, k_rot = rope.apply(q, q, np.arange(16))
    >>> q_rot.shape, q_rot.dtype
    ((2, 8, 16, 64), dtype('float32'))
    """

    def __init__(
        self,
        head_dim: int,
        *,
        base: float = 10000.0,
        layout: Layout = "half",
        rotary_dim: int | None = None,
        scaling: Scaling | dict[str, Any] | None = None,
        angles: AngleMethod = "exact",
        partial: PartialMode = "neox",
    ) -> None:
        self._init(RopeConfig(head_dim, rotary_dim, base, layout, scaling, angles, partial))

    def _init(self, config: RopeConfig) -> None:
        self.config = config
        self._variants = tuple(config.with_scaling(s) for s in config.scaling.variants())
        self._af = config.attention_factor

    @classmethod
    def from_config(cls, config: RopeConfig) -> RoPE:
        """The RoPE of a :class:`RopeConfig`."""
        if not isinstance(config, RopeConfig):
            raise TypeError(f"config must be a RopeConfig, got {type(config).__name__}")
        rope = cls.__new__(cls)
        rope._init(config)
        return rope

    @classmethod
    def from_hf(cls, config: Any, *, angles: AngleMethod = "exact", layer_type: str | None = None) -> RoPE:
        """The RoPE of a Hugging Face ``transformers`` config (object, dict or path to a
        ``config.json``); see :func:`rotary.hf.from_hf`.

        Examples
        --------
        >>> import rotary
        >>> cfg = {"hidden_size": 64, "num_attention_heads": 4, "rope_theta": 500000.0,
        ...        "max_position_embeddings": 8192, "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
        ...        "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}
        >>> rope = rotary.RoPE.from_hf(cfg)
        >>> rope.head_dim, rope.base, rope.scaling.factor
        (16, 500000.0, 8.0)
        """
        return cls.from_config(_hfconfig.rope_config(config, angles=angles, layer_type=layer_type))

    # -- configuration -------------------------------------------------------------------------
    head_dim = property(lambda self: self.config.head_dim, doc="Features per head.")  # pyright: ignore[reportAssignmentType]
    rotary_dim = property(lambda self: self.config.rotary_dim, doc="Rotated features per head.")
    base = property(lambda self: self.config.base, doc="The RoPE base.")
    layout = property(lambda self: self.config.layout, doc="The pair layout.")  # pyright: ignore[reportAssignmentType]
    scaling = property(lambda self: self.config.scaling, doc="The context-extension scaling.")
    angles = property(lambda self: self.config.angles, doc="The angle method.")
    partial = property(lambda self: self.config.partial, doc="How rotary_dim < head_dim is read.")

    @property
    def attention_factor(self) -> float:
        """Factor multiplied into cos and sin by the scaling (1.0 for most)."""
        return self._af

    @property
    def _width(self) -> int:
        return self.config.width

    def _identity(self) -> Hashable:
        return self.config

    def __repr__(self) -> str:
        c = self.config
        extra = "" if c.rotary_dim == c.head_dim else f", rotary_dim={c.rotary_dim}"
        sc = "" if type(c.scaling).rope_type == "default" else f", scaling={c.scaling!r}"
        an = "" if c.angles == "exact" else f", angles={c.angles!r}"
        an += "" if c.partial == "neox" else f", partial={c.partial!r}"
        return f"RoPE({c.head_dim}, base={c.base:g}, layout={c.layout!r}{extra}{sc}{an})"

    # -- frequencies ---------------------------------------------------------------------------
    @entry
    def inv_freq(self, *, xp: Namespace | None = None, device: Device = None, dtype: DType = None) -> Array:
        """Inverse frequencies, shape ``(rotary_dim // 2,)`` (``(head_dim // 2,)`` for
        ``partial="proportional"``).

        A float64 NumPy array by default (a copy); with ``xp`` (and optionally ``device``
        and a floating ``dtype``) an array of that namespace, in its widest float by default.

        Examples
        --------
        >>> import rotary
        >>> rotary.RoPE(8).inv_freq()
        array([1.   , 0.1  , 0.01 , 0.001])
        """
        if xp is None:
            if device is not None or dtype is not None:
                raise ValueError("device= and dtype= need xp=")
            return self.config.host_inv_freq()
        xp = as_namespace(xp)
        be = backend_for(xp)
        dtype = be.widest_float(device) if dtype is None else dtype
        if not v.is_floating(dtype):
            raise TypeError(f"dtype must be a real floating dtype, got {v.dtype_name(dtype)}")
        # (computed for real even inside a trace: the correctly rounded values are host work)
        return xp.asarray(be.eager(_host_inv_freq, self.config), dtype=dtype, device=device)

    # -- angles --------------------------------------------------------------------------------
    @property
    def static(self) -> bool:
        return not self.config.scaling.dynamic

    def _decode_plan(self, be: Backend, q: Array, k: Array, pos: Any) -> Any:
        cfg = self.config
        if cfg.scaling.dynamic or cfg.angles != "exact" or self._af != 1.0:
            return None
        return be.decode_plan(build_constant, cfg, q, k, pos, layout=self.layout, rotary_dim=self._width)

    def _decode_rows(self, be: Backend, q: Array, k: Array) -> Any:
        cfg = self.config
        if cfg.scaling.dynamic or cfg.angles != "exact" or self._af != 1.0:
            return None
        return be.decode_rows(build_constant, cfg, q, k, layout=self.layout, rotary_dim=self._width)

    def _rotation_dtype(self, x_dtype: DType, cdt: DType) -> DType:
        return x_dtype if self.config.angles == "float32" else cdt

    def _fused(self, be: Backend, q: Array, k: Array | None, p: Array) -> tuple[Array, Array] | None:
        """The backend's fused kernel for static angles, or ``None``."""
        cfg = self.config
        if cfg.scaling.dynamic:
            return None
        return be.fused_rope(
            build_constant,
            cfg,
            q,
            k,
            p,
            layout=cfg.layout,
            rotary_dim=self._width,
            exact=cfg.angles == "exact",
            af=self._af,
        )

    def _rotate(self, be: Backend, x: Array, p: Array, rng: Range, dev: Device) -> Array:
        out = self._fused(be, x, None, p)
        if out is not None:
            return out[0]
        if self._custom_grad_ok(p) and be.wants_custom_grad((x,), (p,)):
            return self._custom_grad(be, (x,), p, rng, dev)[0]
        return super()._rotate(be, x, p, rng, dev)

    def _rotate_both(
        self, be: Backend, q: Array, k: Array, p: Array, rng: Range, dev: Device
    ) -> tuple[Array, Array]:
        out = self._fused(be, q, k, p)
        if out is not None:
            return out
        if self._custom_grad_ok(p) and be.wants_custom_grad((q, k), (p,)):
            qr, kr = self._custom_grad(be, (q, k), p, rng, dev)
            return qr, kr
        return super()._rotate_both(be, q, k, p, rng, dev)

    def _custom_grad_ok(self, p: Array) -> bool:
        """The custom backward's rotation at ``-p`` has exactly the forward's cos and ``-sin``:
        static angles at integer positions (a fractional position's exact angle at ``-p`` splits
        into other digits, an ulp away).  Elsewhere the generic code's autograd."""
        return not self.config.scaling.dynamic and v.is_integral(p.dtype)

    def _custom_grad(
        self, be: Backend, xs: tuple[Array, ...], p: Array, rng: Range, dev: Device
    ) -> tuple[Array, ...]:
        """``xs`` rotated with the custom backward (the gradient is the rotation at ``-p``:
        autograd keeps the positions, not cos/sin).  Only the rotated features go through it; the
        rest are joined after, where autograd records the join (so the backward is a whole-width
        rotation, which batches under every vmap, legacy included)."""
        r, neg = self._width, be.negated(p)
        heads = tuple(x if x.shape[-1] == r else x[..., :r] for x in xs)

        def rot(args: tuple[Array, ...], at: Array, at_rng: Range) -> tuple[Array, ...]:
            if len(args) == 2:
                return Rotary._rotate_both(self, be, args[0], args[1], at, at_rng, dev)
            return (Rotary._rotate(self, be, args[0], at, at_rng, dev),)

        out = be.custom_grad(lambda *a: rot(a, p, rng), lambda *g: rot(g, neg, None), *heads)
        return tuple(
            o if x.shape[-1] == r else be.xp.concat([o, x[..., r:]], axis=-1)
            for o, x in zip(out, xs, strict=True)
        )

    def _pair_cos_sin(
        self, pos: Array, be: Backend, dev: Device, dtype: DType, rng: Range
    ) -> tuple[Array, Array]:
        cfg = self.config
        if cfg.scaling.dynamic:

            def static(i: int) -> tuple[Array, Array]:
                return _static_cos_sin(self._variants[i], pos, be, dev, dtype, rng)

            c, s = cfg.scaling.dynamic_cos_sin(
                pos,
                static,
                dim=cfg.freq_dim,
                base=cfg.base,
                angles=cfg.angles,
                xp=be.xp,
                device=dev,
                dtype=dtype,
                wide=be.widest_float(dev),
            )
        else:
            c, s = _static_cos_sin(cfg, pos, be, dev, dtype, rng)
        if self._af != 1.0:
            c, s = c * self._af, s * self._af
        return c, s


def hf_polar(rope: RoPE, pos: Array, be: Backend, dev: Device) -> Array:
    """Hugging Face's complex form of its float32 recipe, bit for bit: ``polar(1, angle)`` times
    the attention factor (DeepSeek-V2's and Llama 4's rotary embeddings); a static configuration
    with ``angles="float32"`` only."""
    cfg = rope.config
    if cfg.angles != "float32" or cfg.scaling.dynamic:
        raise ValueError("hf_polar: a static configuration with angles='float32' only")
    inv32 = be.constant(build_constant, cfg, "float32_inv", dev, be.xp.float32)
    z = be.polar(float32_angles(pos, inv32, xp=be.xp))
    return z * rope._af if rope._af != 1.0 else z


def _static_cos_sin(
    cfg: RopeConfig, pos: Array, be: Backend, dev: Device, dtype: DType, rng: Range
) -> tuple[Array, Array]:
    """cos/sin of a static configuration's angles (attention factor not applied)."""
    xp = be.xp
    if cfg.angles == "float32":
        inv32 = be.constant(build_constant, cfg, "float32_inv", dev, xp.float32)
        c, s = float32_recipe(pos, inv32, xp=xp)
        if c.dtype != dtype:
            c, s = xp.astype(c, dtype), xp.astype(s, dtype)
        return c, s
    return be.exact_cos_sin(pos, build_constant, cfg, device=dev, dtype=dtype, rng=rng)


def _host_inv_freq(config: RopeConfig) -> np.ndarray:
    return config.host_inv_freq()


def _fields_of_items(items: tuple[tuple[str, Any], ...]) -> tuple[str, tuple[Any, ...]]:
    return as_fields(dict(items))


def rope_of(
    be: Backend,
    head_dim: int,
    *,
    base: Any = 10000.0,
    layout: Any = "half",
    rotary_dim: Any = None,
    scaling: Any = None,
    angles: Any = "exact",
    partial: Any = "neox",
) -> RoPE:
    """The :class:`RoPE` of these options: kept in the byte cache in a plain eager scope (the
    functional API builds one per call), built afresh anywhere else (inside ``torch.compile``
    the trace builds it, and its configuration reaches the constants as plain values)."""
    head_dim = operator.index(head_dim)  # specialises a symbolic size under torch.compile
    build = functools.partial(
        RoPE,
        head_dim,
        base=base,
        layout=layout,
        rotary_dim=rotary_dim,
        scaling=scaling,
        angles=angles,
        partial=partial,
    )
    if be.tracing():
        if isinstance(scaling, dict):  # parsed for real (a trace cannot run the parser)
            items = tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in scaling.items())
            scaling = from_fields(*be.eager(_fields_of_items, items))
            build = functools.partial(build, scaling=scaling)
        return build()
    key = ("rope_of", head_dim, base, layout, rotary_dim, resolve(scaling), angles, partial)
    try:
        hash(key)
    except TypeError:  # e.g. a list given for base: let RoPE's checks name it
        return build()
    return get_or_build(key, lambda: (build(), 1024), "ropes")


def eager_positions(be: Backend, pos: Any, name: str, x: Array, x_name: str) -> Any:
    """``pos`` (``None`` kept) as an array of ``x``'s library beside it, its values checked
    where they can be read, on ``x``'s device (``ValueError`` naming both otherwise): what an
    entry point does before compiling the rest of the call."""
    if pos is None:
        return None
    be.position_shape(pos, name=name)
    if is_array(pos) and library_name(array_namespace(pos, names=(name,))) == be.name:
        be.check_devices([(x_name, x), (name, pos)])
    return be.positions(pos, name=name, device=be.creation_device(x))[0]


def default_rope(
    be: Backend, rope: Any, pos: Any, width: int, k_pos: Any = None, name: str = "rope"
) -> RotaryEmbedding | None:
    """``rope`` checked against the feature ``width`` it rotates; ``RoPE(width)`` when only
    ``pos`` is given; ``None`` when neither is (``k_pos`` alone is an error)."""
    if pos is None and k_pos is not None:
        raise ValueError("k_pos= given without pos=: pass the queries' positions too (or neither)")
    if rope is None:
        if pos is None:
            return None
        # (every option spelled out: torch.compile passes literals, not defaults, as constants)
        return rope_of(
            be,
            width,
            base=10000.0,
            layout="half",
            rotary_dim=None,
            scaling=None,
            angles="exact",
            partial="neox",
        )
    if not (hasattr(rope, "apply") and hasattr(rope, "rotate") and hasattr(rope, "head_dim")):
        raise TypeError(f"{name} must be a rotary.RoPE, AxialRoPE or MRoPE, got {type(rope).__name__}")
    if pos is None:
        raise ValueError(f"{name}= needs positions: pass pos= (and k_pos= for keys elsewhere)")
    if rope.head_dim != width:
        raise ValueError(
            f"{name}.head_dim={rope.head_dim} does not match the {width} features it would rotate"
        )
    return rope
