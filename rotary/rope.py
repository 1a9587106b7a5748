"""``RoPE``: one RoPE configuration, held once, with cached cos/sin tables."""

from __future__ import annotations

import ast
from typing import Any

import numpy as np

from . import _checks, _dask
from ._compat import (
    Array,
    Namespace,
    array_namespace,
    compute_dtype,
    creation_device,
    is_array_api_obj,
    is_concrete,
    is_dask_namespace,
    is_jax_namespace,
    is_real_floating,
    is_torch_namespace,
    namespace_key,
    widest_float,
)
from .angles import (
    _RADIX,
    ANGLE_METHODS,
    LEVELS,
    backend_tables,
    exact_cos_sin,
    exact_cos_sin_positions,
    float32_inv_freq,
    float32_recipe,
)
from .layouts import expand_pairs, rotate_pairs
from .scaling import Scaling, from_key, resolve
from .scaling import key as scaling_key

__all__ = ["PARTIAL_MODES", "RoPE", "as_positions"]

#: How a ``rotary_dim`` smaller than ``head_dim`` is read (see :class:`RoPE`).
PARTIAL_MODES = ("neox", "proportional")


class RoPE:
    """A RoPE configuration: frequencies, layout, partial rotary, scaling.

    Parameters
    ----------
    head_dim : int
        Features per head (even).
    base : float
        RoPE base ``theta`` (``rope_theta``), default 10000.
    layout : {"half", "interleaved"}
        Pairing of features: ``"half"`` pairs ``i`` with ``i + r/2`` (GPT-NeoX,
        Hugging Face LLaMA); ``"interleaved"`` pairs ``2i`` with ``2i + 1``
        (RoFormer, Meta LLaMA, GPT-J).
    rotary_dim : int, optional
        Rotate only ``rotary_dim`` features of each head (even); the rest pass
        through.  Which features and which frequencies depend on ``partial``.
    scaling : Scaling or dict, optional
        A context-extension scaling from :mod:`rotary.scaling`, or a Hugging
        Face ``rope_scaling`` dict.
    angles : {"exact", "float32"}
        ``"exact"`` (default): angles within 1e-6 of the float64 truth for
        integer positions up to 2**36 on every backend.  ``"float32"``: the
        common float32 recipe, bit-for-bit Hugging Face on torch: angles in float32,
        cos/sin cast to the input dtype and the rotation done in it (as HF's
        ``apply_rotary_pos_emb`` does for bfloat16/float16 inputs).
    partial : {"neox", "proportional"}
        How ``rotary_dim < head_dim`` is read.  ``"neox"`` (default; GPT-NeoX
        ``rotary_pct``, GPT-J ``rotary_dim``, HF ``partial_rotary_factor``): the
        first ``rotary_dim`` features form the pairs and the frequency exponent
        uses ``rotary_dim``.  ``"proportional"`` (Gemma, HF ``rope_type="proportional"``):
        the exponent uses ``head_dim`` (``theta_i = base**(-2i/head_dim)``), the
        pairs span the whole head and only the first ``rotary_dim // 2`` pairs
        rotate (the others have frequency 0): in the ``"half"`` layout the first
        ``rotary_dim // 2`` features of each half, in ``"interleaved"`` the first
        ``rotary_dim`` features.  ``inv_freq`` and ``cos_sin`` then have
        ``head_dim // 2`` entries, as in Hugging Face.

    Notes
    -----
    cos/sin digit tables are cached per (namespace, device, dtype), so repeated
    calls do not rebuild them.  Under ``jax.jit`` and ``torch.compile`` the
    tables are compile-time constants and positions stay traced.

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
        layout: str = "half",
        rotary_dim: int | None = None,
        scaling: Scaling | dict | None = None,
        angles: str = "exact",
        partial: str = "neox",
    ) -> None:
        self.head_dim = _checks.check_head_dim(head_dim)
        self.rotary_dim: int = _checks.check_rotary_dim(rotary_dim, self.head_dim)  # type: ignore[assignment]
        self.base = _checks.check_base(base)
        self.layout = _checks.check_layout(layout)
        self.scaling = resolve(scaling)
        if angles not in ANGLE_METHODS:
            raise ValueError(f"angles must be one of {ANGLE_METHODS!r}, got {angles!r}")
        self.angles = angles
        if partial not in PARTIAL_MODES:
            raise ValueError(f"partial must be one of {PARTIAL_MODES!r}, got {partial!r}")
        if partial == "proportional" and self.scaling.dynamic:
            raise ValueError("partial='proportional' does not support dynamic scalings")
        self.partial = partial
        # Features handed to the rotation kernel: proportional pairs span the whole head.
        self._rot_width = self.head_dim if partial == "proportional" else self.rotary_dim
        self._af = float(self.scaling.attention_factor(self._rot_width, self.base))
        # Plain-value key: identifies the cached constants and lets torch.compile
        # treat them as compile-time constants (see ``_torch_constants``).
        self._key = (
            self.head_dim,
            self.rotary_dim,
            self.base,
            self.layout,
            scaling_key(self.scaling),
            self.angles,
            *(() if partial == "neox" else (partial,)),
        )
        # The same key as one string: torch.compile turns floats met again on a recompile
        # into symbols, which a constant-result function cannot take; a string stays constant.
        self._token = repr(self._key)

    @classmethod
    def from_hf(cls, config: Any, *, angles: str = "exact", layer_type: str | None = None) -> RoPE:
        """The RoPE of a Hugging Face ``transformers`` config (object or dict); see :func:`rotary.hf.from_hf`.

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
        from .hf import from_hf

        return from_hf(config, angles=angles, layer_type=layer_type, cls=cls)

    # -- configuration ---------------------------------------------------------------
    def __eq__(self, other: object) -> bool:
        return isinstance(other, RoPE) and self._key == other._key

    def __hash__(self) -> int:
        return hash(self._key)

    def __repr__(self) -> str:
        extra = "" if self.rotary_dim == self.head_dim else f", rotary_dim={self.rotary_dim}"
        sc = "" if type(self.scaling).rope_type == "default" else f", scaling={self.scaling!r}"
        an = "" if self.angles == "exact" else f", angles={self.angles!r}"
        an += "" if self.partial == "neox" else f", partial={self.partial!r}"
        return f"RoPE({self.head_dim}, base={self.base:g}, layout={self.layout!r}{extra}{sc}{an})"

    @property
    def attention_factor(self) -> float:
        """Factor multiplied into cos and sin by the scaling (1.0 for most)."""
        return self._af

    # -- frequencies and tables ----------------------------------------------------
    def inv_freq(self, *, xp: Namespace | None = None, device: Any = None, dtype: Any = None) -> Array:
        """Inverse frequencies, shape ``(rotary_dim // 2,)``.

        Float64 NumPy by default; with ``xp`` (and optionally ``device`` and
        ``dtype``) an array of that namespace (widest float available by default).

        Examples
        --------
        >>> import rotary
        >>> rotary.RoPE(8).inv_freq()
        array([1.   , 0.1  , 0.01 , 0.001])
        """
        w = _host_inv_freq(self._key)
        if xp is None:
            return w.copy()
        dtype = widest_float(xp, device) if dtype is None else dtype
        return xp.asarray(w, dtype=dtype, device=device)

    def _constants(self, xp: Namespace, dev: Any, dtype: Any) -> tuple[Array, Array]:
        """(digit tables, inverse frequencies) on ``xp``/``dev`` in ``dtype``, cached."""
        if is_torch_namespace(xp):
            return _torch_constants(self._token, str(dev), str(dtype).rsplit(".", 1)[-1])
        return _constants(self._key, xp, dev, dtype)

    def _half_cos_sin(
        self,
        pos: Array,
        xp: Namespace,
        dev: Any,
        dtype: Any,
        out_dtype: Any = None,
        rng: tuple[int, int] | None = None,
    ) -> tuple[Array, Array]:
        """cos, sin of shape ``pos.shape + (rotary_dim // 2,)`` in ``dtype``, af applied.

        ``out_dtype``: cast to it after the attention factor (HF order in float32 mode).
        ``rng``: ``(min, max)`` of concrete integer positions when the caller already has it.
        """
        if self.scaling.dynamic:
            c, s = self.scaling.dynamic_cos_sin(self, pos, xp=xp, device=dev, dtype=dtype)
        elif self.angles == "float32":
            _, inv32 = self._constants(xp, dev, "float32recipe")
            c, s = float32_recipe(pos, inv32, xp=xp)
            if c.dtype != dtype:
                c, s = xp.astype(c, dtype), xp.astype(s, dtype)
        else:
            c, s = self._exact_half(pos, xp, dev, dtype, rng)
        if self._af != 1.0:
            c, s = c * self._af, s * self._af
        if out_dtype is not None and c.dtype != out_dtype:
            c, s = xp.astype(c, out_dtype), xp.astype(s, out_dtype)
        return c, s

    def _exact_half(
        self, pos: Array, xp: Namespace, dev: Any, dtype: Any, rng: tuple[int, int] | None
    ) -> tuple[Array, Array]:
        """Exact-method cos/sin.  Concrete integer positions (eager only: their range is read)
        within ``[0, _POS_TABLE_MAX)`` are looked up in a per-position table built once with the
        same exact method (so the values are the same bits); other concrete ones skip the digit
        levels and the sign their range does not need.  Traced positions take the generic path."""
        if rng is None:
            rng = _concrete_int_range(pos, xp)
        levels, nonneg = None, False
        if rng is not None:
            lo, hi = rng
            if 0 <= lo and hi < _POS_TABLE_MAX:
                table = _POS_TABLES.get((self._token, xp, dev, dtype))
                if table is None or table.shape[0] <= hi:
                    table = _position_table(self._token, self._constants(xp, dev, dtype), xp, dev, dtype, hi)
                n = table.shape[-1] // 2
                t = _take_rows(table, pos if pos.ndim == 1 else xp.reshape(pos, (-1,)), xp)
                c, s = t[:, :n], t[:, n:]
                if pos.ndim == 1:
                    return c, s
                shape = (*pos.shape, n)
                return xp.reshape(c, shape), xp.reshape(s, shape)
            levels, nonneg = _levels_for_range(lo, hi), lo >= 0
        tables, w = self._constants(xp, dev, dtype)
        if levels is None:
            return exact_cos_sin_positions(pos, tables, w, xp=xp, dtype=dtype)
        return exact_cos_sin(pos, tables, w, xp=xp, dtype=dtype, levels=levels, nonneg=nonneg)

    def _rot_dtype(self, x: Array) -> Any:
        """Float32 mode rotates in the input dtype, as Hugging Face does (cos/sin cast to it)."""
        return x.dtype if self.angles == "float32" else None

    def cos_sin(
        self,
        pos: Any,
        *,
        xp: Namespace | None = None,
        device: Any = None,
        dtype: Any = None,
        full: bool = False,
    ) -> tuple[Array, Array]:
        """cos and sin of the rotation angles at ``pos`` (attention factor applied).

        Parameters
        ----------
        pos : array or int or sequence
            Positions, any shape.
        xp, device, dtype
            Namespace, device and floating dtype of the result (defaults: those of
            ``pos``, or NumPy; float32, or float64 when ``xp`` is given a float64 dtype).
        full : bool
            ``False``: shape ``pos.shape + (rotary_dim // 2,)``, one value per pair.
            ``True``: shape ``pos.shape + (rotary_dim,)``, laid out for ``self.layout``
            (``"half"``: ``concat(c, c)`` as Hugging Face returns it; ``"interleaved"``:
            each value repeated twice).

        Examples
        --------
        >>> import rotary
        >>> c, s = rotary.RoPE(4).cos_sin([0, 1])
        >>> c.shape
        (2, 2)
        >>> float(c[1, 0]), float(s[0, 1])
        (0.5403022766113281, 0.0)
        """
        if xp is None:
            xp = array_namespace(pos)
        pos = as_positions(pos, xp, device, "pos")
        dev = device if device is not None else creation_device(pos, xp)
        dtype = xp.float32 if dtype is None else dtype
        cdt = compute_dtype(xp, dtype)
        _checks.check_positions_values(pos, xp, "pos")
        c, s = self._half_cos_sin(pos, xp, dev, cdt)
        if full:
            c, s = expand_pairs(c, self.layout, xp), expand_pairs(s, self.layout, xp)
        if c.dtype != dtype:
            c, s = xp.astype(c, dtype), xp.astype(s, dtype)
        return c, s

    # -- rotation ------------------------------------------------------------------
    def rotate(self, x: Array, pos: Any) -> Array:
        """Rotate one array ``x`` of shape ``(..., head_dim)`` at positions ``pos``.

        ``pos`` broadcasts against ``x.shape[:-1]``.  Returns an array of ``x``'s
        namespace, device, shape and dtype.

        Examples
        --------
        >>> import numpy as np, rotary
        >>> x = np.ones((3, 4), dtype=np.float32)
        >>> rotary.RoPE(4).rotate(x, np.arange(3)).round(3)
        array([[ 1.   ,  1.   ,  1.   ,  1.   ],
               [-0.301,  0.99 ,  1.382,  1.01 ],
               [-1.325,  0.98 ,  0.493,  1.02 ]], dtype=float32)
        """
        xp = array_namespace(x, pos, names=("x", "pos"))
        self._check_x(x, xp, "x")
        pos = self._prepare_pos(pos, x, xp, "pos", [("x", x)])
        if is_dask_namespace(xp) and not self.scaling.dynamic:  # one task per block of leading axes
            # (dynamic scalings read the sequence length from all positions: generic lazy path)
            return _dask.rotate(self, x, pos)
        dev = creation_device(x, xp)
        cdt = compute_dtype(xp, x.dtype)
        c, s = self._half_cos_sin(pos, xp, dev, cdt, self._rot_dtype(x))
        return rotate_pairs(x, c, s, layout=self.layout, rotary_dim=self._rot_width, xp=xp)

    def apply(self, q: Array, k: Array, pos: Any, *, k_pos: Any = None) -> tuple[Array, Array]:
        """Rotate queries and keys; ``k_pos`` (default ``pos``) gives the keys' positions.

        Examples
        --------
        >>> import numpy as np, rotary
        >>> rope = rotary.RoPE(8)
        >>> q = np.random.default_rng(0).normal(size=(1, 4, 5, 8)).astype(np.float32)
        >>> qr, kr = rope.apply(q, q, np.arange(5))
        >>> bool(np.allclose((qr * qr).sum(-1), (q * q).sum(-1), rtol=1e-5))
        True
        """
        sig = _eager_signature(q, k, pos) if k_pos is None else None
        if sig is not None:
            hit = _SIGNATURES.get((self._token, sig))
            if hit is not None:
                return self._apply_checked(q, k, pos, *hit)
        xp = array_namespace(q, k, pos, k_pos, names=("q", "k", "pos", "k_pos"))
        for name, a in (("q", q), ("k", k)):
            if not is_array_api_obj(a):
                raise TypeError(f"{name} must be an array, got {type(a).__name__}")
        _checks.check_qk(q, k)
        self._check_x(q, xp, "q")
        self._check_x(k, xp, "k")
        arrays = [("q", q), ("k", k)]
        if q.dtype != k.dtype:
            raise TypeError(f"q and k must have the same dtype, got {q.dtype} and {k.dtype}")
        if is_dask_namespace(xp) and not self.scaling.dynamic:  # one task per block of leading axes
            # (dynamic scalings read the sequence length from all positions: generic lazy path)
            pos = self._prepare_pos(pos, q, xp, "pos", arrays)
            if k_pos is None:
                _checks.check_broadcast(tuple(pos.shape), tuple(k.shape[:-1]), "pos", "k")
                k_pos = pos
            else:
                k_pos = self._prepare_pos(k_pos, k, xp, "k_pos", arrays)
            return _dask.rotate(self, q, pos, "q", "pos"), _dask.rotate(self, k, k_pos, "k", "k_pos")
        dev = creation_device(q, xp)
        cdt = compute_dtype(xp, q.dtype)
        if k_pos is None:
            pos = self._prepare_pos(pos, q, xp, "pos", arrays)
            _checks.check_broadcast(tuple(pos.shape), tuple(k.shape[:-1]), "pos", "k")
            c, s = self._half_cos_sin(pos, xp, dev, cdt, self._rot_dtype(q))
            ck, sk = c, s
        else:
            pos = self._prepare_pos(pos, q, xp, "pos", arrays)
            k_pos = self._prepare_pos(k_pos, k, xp, "k_pos", arrays)
            c, s = self._half_cos_sin(pos, xp, dev, cdt, self._rot_dtype(q))
            ck, sk = self._half_cos_sin(k_pos, xp, dev, cdt, self._rot_dtype(k))
        kw = {"layout": self.layout, "rotary_dim": self._rot_width, "xp": xp}
        out = rotate_pairs(q, c, s, **kw), rotate_pairs(k, ck, sk, **kw)
        if sig is not None and len(_SIGNATURES) < 1024:
            # Everything checked above depends only on ``sig``: later calls skip it.
            _SIGNATURES[(self._token, sig)] = (xp, dev, cdt, not is_real_floating(xp, pos.dtype))
        return out

    def _apply_checked(
        self, q: Array, k: Array, pos: Array, xp: Namespace, dev: Any, cdt: Any, int_pos: bool
    ) -> tuple[Array, Array]:
        """``apply`` for arguments whose types, shapes, dtypes and devices passed the checks
        before: only the position values (concrete here) are checked again."""
        if int_pos:
            rng = _checks.positions_range(pos, xp, "pos")
        else:
            rng = None
            _checks.check_positions_values(pos, xp, "pos")
        c, s = self._half_cos_sin(pos, xp, dev, cdt, self._rot_dtype(q), rng=rng)
        kw = {"layout": self.layout, "rotary_dim": self._rot_width, "xp": xp}
        return rotate_pairs(q, c, s, **kw), rotate_pairs(k, c, s, **kw)

    # -- helpers -------------------------------------------------------------------
    def _check_x(self, x: Array, xp: Namespace, name: str) -> None:
        _checks.check_head_array(x, xp, name, self.head_dim)

    def _prepare_pos(
        self, pos: Any, x: Array, xp: Namespace, name: str, arrays: list[tuple[str, Array]]
    ) -> Array:
        pos = as_positions(pos, xp, creation_device(x, xp), name)
        _checks.check_same_device(xp, [*arrays, (name, pos)])
        _checks.check_broadcast(tuple(pos.shape), tuple(x.shape[:-1]), name, _xname(arrays, x))
        _checks.check_positions_values(pos, xp, name)
        return pos


def _xname(arrays: list[tuple[str, Array]], x: Array) -> str:
    for n, a in arrays:
        if a is x:
            return n
    return "x"


def as_positions(pos: Any, xp: Namespace, device: Any, name: str = "pos") -> Array:
    """Convert ``pos`` (array of ``xp``, Python number or sequence) to an array of ``xp``."""
    if is_array_api_obj(pos):
        dt = pos.dtype
        if xp.isdtype(dt, "bool") or not xp.isdtype(dt, ("integral", "real floating")):
            raise TypeError(f"{name} must hold integer or real floating positions, got dtype {dt}")
        return pos
    if isinstance(pos, (bool, np.bool_)):
        raise TypeError(f"{name} must be integer or real floating positions, got a bool")
    try:
        host = np.asarray(pos)
    except Exception:
        raise TypeError(f"{name} must be an array, a number or a sequence of numbers") from None
    if host.dtype.kind in "iu":
        info = xp.__array_namespace_info__()
        dt = info.default_dtypes(device=device)["integral"]
    elif host.dtype.kind == "f":
        dt = widest_float(xp, device)
    else:
        raise TypeError(f"{name} must be integer or real floating positions, got {host.dtype} values")
    return xp.asarray(host, dtype=dt, device=device)


# -- eager per-call fast path ----------------------------------------------------------
# ``apply`` on NumPy arrays and torch CPU tensors (eager) remembers the argument signatures
# (types, shapes, dtypes, devices) it has validated; a call with a known signature skips the
# namespace lookup and the shape/dtype/device checks, which depend on nothing else.  The
# position values are still checked on every call (``_checks.positions_range``).
_SIGNATURES: dict[tuple, tuple] = {}


def _eager_signature(q: Any, k: Any, pos: Any) -> tuple | None:
    tq = type(q)
    if tq is not type(k) or type(pos) is not tq:
        return None
    mod = tq.__module__
    if mod == "numpy":
        if tq is not np.ndarray:
            return None
        return (tq, q.shape, q.dtype, k.shape, k.dtype, pos.shape, pos.dtype)
    if mod == "torch" and tq.__name__ == "Tensor":
        import torch  # the caller holds torch tensors

        if torch.compiler.is_compiling() or q.device.type != "cpu":
            return None
        if q.requires_grad or k.requires_grad:
            return None
        return (tq, q.shape, q.dtype, q.device, k.shape, k.dtype, k.device, pos.shape, pos.dtype, pos.device)
    return None


def _concrete_int_range(pos: Array, xp: Namespace) -> tuple[int, int] | None:
    """``(min, max)`` of integer positions whose values can be read eagerly, else ``None``."""
    if is_real_floating(xp, pos.dtype) or not is_concrete(pos, xp):
        return None
    return _checks.positions_range(pos, xp, "pos")


def _take_rows(table: Array, idx: Array, xp: Namespace) -> Array:
    """``xp.take(table, idx, axis=0)`` for indices known to be in range (checked eagerly):
    NumPy and torch are called directly (the compat wrappers' negative-index handling costs
    more than the gather itself at decode sizes)."""
    mod = type(table).__module__
    if mod == "numpy":
        return table.take(idx, axis=0)
    if mod == "torch":
        import torch  # the caller holds torch tensors

        return torch.index_select(table, 0, idx)
    return xp.take(table, idx, axis=0)


def _levels_for_range(lo: int, hi: int) -> int:
    m = max(abs(lo), abs(hi))
    levels = 1
    while m >= _RADIX**levels and levels < LEVELS:
        levels += 1
    return levels


#: Positions below this bound are looked up in a per-position table (eager, concrete positions);
#: the table grows by powers of two from 4096 (16 MiB at the bound for head_dim 128, float32).
_POS_TABLE_MAX = 1 << 15
_POS_TABLES: dict[tuple, Array] = {}


def _position_table(key: tuple, consts: tuple, xp: Namespace, dev: Any, dtype: Any, hi: int) -> Array:
    """cos/sin of positions ``0 .. B-1`` side by side, shape ``(B, rotary_dim)``, ``B > hi``."""
    table = _POS_TABLES.get((key, xp, dev, dtype))
    if table is None or table.shape[0] <= hi:
        b = 4096
        while b <= hi:
            b *= 2
        idx = xp.arange(b, device=dev)  # the default integer dtype (int32 in JAX without x64)
        tables, w = consts
        c, s = exact_cos_sin(
            idx, tables, w, xp=xp, dtype=dtype, levels=_levels_for_range(0, b - 1), nonneg=True
        )
        table = xp.concat([c, s], axis=1)  # (B, 2 n): one contiguous row per position
        if len(_POS_TABLES) >= 64:
            _POS_TABLES.clear()
        _POS_TABLES[(key, xp, dev, dtype)] = table
    return table


# -- cached constants ----------------------------------------------------------------
# Keyed by the RoPE's plain-value key and (namespace, device, dtype).  Building them
# is host-side NumPy work done once per configuration.
_HOST_W: dict[tuple, np.ndarray] = {}
_CONSTANTS: dict[tuple, tuple[Array, Array]] = {}


def _host_inv_freq(key: tuple) -> np.ndarray:
    w = _HOST_W.get(key)
    if w is None:
        head_dim, rotary_dim, base, _, skey, _ = key[:6]
        if key[6:] == ("proportional",):
            w = np.asarray(from_key(skey).inv_freq(head_dim, base), dtype=np.float64)
            w = np.concatenate([w[: rotary_dim // 2], np.zeros(head_dim // 2 - rotary_dim // 2)])
        else:
            w = np.asarray(from_key(skey).inv_freq(rotary_dim, base), dtype=np.float64)
        w.setflags(write=False)
        _HOST_W[key] = w
    return w


def _constants(key: tuple, xp: Namespace, dev: Any, dtype: Any) -> tuple[Array, Array]:
    ck = (key, *namespace_key(xp, dev, dtype))
    out = _CONSTANTS.get(ck)
    if out is None:
        if is_jax_namespace(xp):
            import jax  # the caller holds JAX arrays

            # Build concrete constants even when called under jit, so they can be cached.
            with jax.ensure_compile_time_eval():
                out = _build_constants(key, xp, dev, dtype)
        else:
            out = _build_constants(key, xp, dev, dtype)
        _CONSTANTS[ck] = out
    return out


def _build_constants(key: tuple, xp: Namespace, dev: Any, dtype: Any) -> tuple[Array, Array]:
    head_dim, rotary_dim, base, _, skey, _ = key[:6]
    if dtype == "float32recipe":
        hf = getattr(from_key(skey), "float32_inv_freq", None) or float32_inv_freq
        if key[6:] == ("proportional",):
            w32 = hf(head_dim, base, xp=xp, device=dev)[: rotary_dim // 2]
            pad = xp.zeros((head_dim // 2 - rotary_dim // 2,), dtype=w32.dtype, device=dev)
            return (None, xp.concat([w32, pad]))
        return (None, hf(rotary_dim, base, xp=xp, device=dev))
    w = _host_inv_freq(key)
    # np.array(w): a writable copy (torch warns on read-only NumPy buffers).
    return backend_tables(w, xp=xp, device=dev, dtype=dtype), xp.asarray(np.array(w), dtype=dtype, device=dev)


def _torch_constants(token: str, dev: str, dtype: str) -> tuple[Array, Array]:
    import array_api_compat.torch as xp
    import torch

    key = _KEYS.get(token)
    if key is None:
        key = _KEYS[token] = ast.literal_eval(token)  # the repr of a tuple of plain values
    dt = dtype if dtype == "float32recipe" else getattr(torch, dtype)
    return _constants(key, xp, torch.device(dev), dt)


_KEYS: dict[str, tuple] = {}


# torch.compile: these tensors depend only on plain-value arguments, so dynamo may call
# the function at trace time and embed its result as constants instead of tracing the
# NumPy table construction.  (This is what ``torch.compiler.assume_constant_result``
# does; set directly so that importing rotary never imports torch.)
_torch_constants._dynamo_marked_constant = True  # type: ignore[attr-defined]
