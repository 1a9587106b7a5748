"""Context-extension scalings of the RoPE frequencies.

A scaling maps the default inverse frequencies ``base**(-2i/d)`` to new ones and may
carry an *attention factor* ``af`` that multiplies cos and sin (so the attention logits
scale by ``af**2``), exactly as Hugging Face ``transformers`` applies it: once.

=================  ===============  ==============================================  =========
class              ``rope_type``    frequencies                                     dynamic
=================  ===============  ==============================================  =========
``Default``        ``default``      ``base**(-2i/d)``                               no
``Linear``         ``linear``       divided by ``factor`` (position interpolation)  no
``NTK``            ``ntk``          base ``base * factor**(d/(d-2))`` (NTK-aware)   no
``DynamicNTK``     ``dynamic``      NTK base from the sequence length               yes
``YaRN``           ``yarn``         ramp between interpolation and extrapolation    no
``Llama3``         ``llama3``       wavelength bands (Llama 3.1 / 3.2 / 4)          no
``LongRoPE``       ``longrope``     per-frequency short/long factors                yes
``Factors``        ``factors``      per-frequency divisors (LongRoPE's building     no
                                    block)
``Frequencies``    ``frequencies``  given per pair (re-rotating cached keys)        no
=================  ===============  ==============================================  =========

Dynamic scalings read the sequence length ``seq_len = max(pos) + 1`` from the positions,
in the backend (no value branching: every candidate set of frequencies is evaluated and
``where`` picks one), so they run under ``jax.jit`` and ``torch.compile(fullgraph=True)``.
``seq_len`` is the maximum over the whole batch, as Hugging Face takes it;
``per_sequence=True`` takes it per batch row (the maximum over the last axis).

Every scaling is a frozen, hashable dataclass whose fields are checked on construction;
:func:`resolve` turns ``None``, a scaling or a Hugging Face ``rope_scaling`` dict into
one.  A subclass defines ``inv_freq`` (and optionally ``attention_factor``,
``float32_inv_freq``); decorate it with :func:`register` to make its ``rope_type`` known
to :func:`from_dict`.

Examples
--------
>>> import numpy as np, rotary
>>> import dataclasses
>>> @dataclasses.dataclass(frozen=True)
... class Half(rotary.Scaling):
...     def inv_freq(self, dim, base):
...         return rotary.inv_freq(dim, base) / 2
>>> rotary.RoPE(8, scaling=Half()).inv_freq()
array([0.5   , 0.05  , 0.005 , 0.0005])
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np

from ._lib import _validation as v
from ._lib._typing import AngleMethod, Array, Device, DType, Namespace
from ._math._freqs import float32_exponents
from ._math._freqs import float32_inv_freq as default_float32_inv_freq
from ._math._freqs import inv_freq as default_inv_freq

__all__ = [
    "NTK",
    "Default",
    "DynamicNTK",
    "Factors",
    "Frequencies",
    "Linear",
    "Llama3",
    "LongRoPE",
    "Scaling",
    "YaRN",
    "from_dict",
    "register",
    "resolve",
]

#: ``static(i)``: cos and sin (attention factor not applied) of the ``i``-th of a dynamic
#: scaling's :meth:`Scaling.variants`, computed by the caller's angle method.
StaticCosSin = Callable[[int], tuple[Array, Array]]


@dataclasses.dataclass(frozen=True)
class Scaling:
    """Base class: the unscaled frequencies, attention factor 1."""

    #: Name used in Hugging Face configs (``rope_type``).
    rope_type: ClassVar[str] = "default"
    #: True when the frequencies depend on the sequence length (dynamic NTK, LongRoPE).
    dynamic: ClassVar[bool] = False

    def check_dim(self, dim: int) -> None:
        """Raise ``ValueError`` if this scaling cannot serve ``dim`` rotated features."""

    def inv_freq(self, dim: int, base: float) -> np.ndarray:
        """Inverse frequencies (float64, shape ``(dim // 2,)``) for ``dim`` rotated features."""
        return default_inv_freq(dim, base)

    def attention_factor(self, dim: int, base: float) -> float:
        """Factor multiplying cos and sin (1.0 unless the scaling says otherwise)."""
        return 1.0

    def float32_inv_freq(self, dim: int, base: float, *, xp: Namespace, device: Device = None) -> Array:
        """The frequencies as Hugging Face computes them in float32 (an array of ``xp``)."""
        return default_float32_inv_freq(dim, base, xp=xp, device=device)

    # -- dynamic scalings ----------------------------------------------------------------------
    def variants(self) -> tuple[Scaling, ...]:
        """The static scalings whose angles :meth:`dynamic_cos_sin` chooses between."""
        return ()

    def dynamic_cos_sin(
        self,
        pos: Array,
        static: StaticCosSin,
        *,
        dim: int,
        base: float,
        angles: AngleMethod,
        xp: Namespace,
        device: Device,
        dtype: DType,
        wide: DType,
    ) -> tuple[Array, Array]:
        """cos/sin (attention factor not applied) at ``pos`` for a dynamic scaling, without
        value branching.  ``wide`` is the widest float of the device."""
        raise NotImplementedError(f"{type(self).__name__} is not a dynamic scaling")


def _check(obj: Any, cls: str, name: str, check: Callable[..., Any] = v.check_float, **kw: Any) -> None:
    """Normalise the field ``obj.<name>`` with ``check(value, label, **kw)``; errors name it
    ``"{cls} {name}"`` without a trailing ``_``."""
    object.__setattr__(obj, name, check(getattr(obj, name), f"{cls} {name.rstrip('_')}", **kw))


def _optional(obj: Any, cls: str, name: str, **kw: Any) -> None:
    """:func:`_check` a float field that may be ``None``."""
    if getattr(obj, name) is not None:
        _check(obj, cls, name, **kw)


@dataclasses.dataclass(frozen=True)
class Default(Scaling):
    """No scaling (HF ``rope_type="default"``)."""

    rope_type: ClassVar[str] = "default"


@dataclasses.dataclass(frozen=True)
class Linear(Scaling):
    """Position interpolation: every frequency divided by ``factor`` (HF ``"linear"``).

    Examples
    --------
    >>> from rotary.scaling import Linear
    >>> Linear(4.0).inv_freq(4, 10000.0)
    array([0.25  , 0.0025])
    """

    factor: float
    rope_type: ClassVar[str] = "linear"

    def __post_init__(self) -> None:
        _check(self, "Linear", "factor", minimum=1.0)

    def inv_freq(self, dim: int, base: float) -> np.ndarray:
        return default_inv_freq(dim, base) / self.factor

    def float32_inv_freq(self, dim: int, base: float, *, xp: Namespace, device: Device = None) -> Array:
        return default_float32_inv_freq(dim, base, xp=xp, device=device) / self.factor


@dataclasses.dataclass(frozen=True)
class Backwards(Scaling):
    """The default frequencies, negated: a rotation by ``-theta`` (NanoChat, whose
    ``rotate_half`` flips the signs).  ``"float32"`` angles negate Hugging Face's float32
    frequencies, so they are its bits.

    Examples
    --------
    >>> from rotary.scaling import Backwards
    >>> Backwards().inv_freq(4, 10000.0)
    array([-1.  , -0.01])
    """

    rope_type: ClassVar[str] = "backwards"

    def inv_freq(self, dim: int, base: float) -> np.ndarray:
        return -default_inv_freq(dim, base)

    def float32_inv_freq(self, dim: int, base: float, *, xp: Namespace, device: Device = None) -> Array:
        return -default_float32_inv_freq(dim, base, xp=xp, device=device)


def _check_pairs(values: tuple[float, ...], dim: int, name: str) -> None:
    if len(values) != dim // 2:
        raise ValueError(f"{name} must have rotary_dim // 2 = {dim // 2} entries, got {len(values)}")


def _check_ntk_dim(cls: str, dim: int) -> None:
    if dim < 4:
        raise ValueError(
            f"{cls} needs at least 4 rotated features (its base grows as factor**(d / (d - 2))), "
            f"got rotary_dim={dim}"
        )


@dataclasses.dataclass(frozen=True)
class NTK(Scaling):
    """NTK-aware scaling: the base becomes ``base * factor**(d / (d - 2))``.

    The lowest frequency is then stretched by ``factor`` while the highest is kept.
    (Hugging Face has only the dynamic variant, :class:`DynamicNTK`.)

    Examples
    --------
    >>> from rotary.scaling import NTK
    >>> w = NTK(4.0).inv_freq(8, 10000.0)  # default: [1, 0.1, 0.01, 0.001]
    >>> float(w[0]), round(float(w[-1] * 4 / 0.001), 6)  # lowest frequency divided by 4
    (1.0, 1.0)
    """

    factor: float
    rope_type: ClassVar[str] = "ntk"

    def __post_init__(self) -> None:
        _check(self, "NTK", "factor", minimum=1.0)

    def check_dim(self, dim: int) -> None:
        _check_ntk_dim("NTK", dim)

    def scaled_base(self, dim: int, base: float) -> float:
        """The NTK base for ``dim`` rotated features."""
        return float(base) * self.factor ** (dim / (dim - 2))

    def inv_freq(self, dim: int, base: float) -> np.ndarray:
        return default_inv_freq(dim, self.scaled_base(dim, base))

    def float32_inv_freq(self, dim: int, base: float, *, xp: Namespace, device: Device = None) -> Array:
        return default_float32_inv_freq(dim, self.scaled_base(dim, base), xp=xp, device=device)


@dataclasses.dataclass(frozen=True)
class Factors(Scaling):
    """Per-frequency divisors: ``inv_i = base**(-2i/d) / factors[i]`` (LongRoPE's short or long set).

    Examples
    --------
    >>> from rotary.scaling import Factors
    >>> Factors((1.0, 2.0)).inv_freq(4, 10000.0)
    array([1.   , 0.005])
    """

    factors: tuple[float, ...]
    rope_type: ClassVar[str] = "factors"

    def __post_init__(self) -> None:
        _check(self, "Factors", "factors", v.check_positive_floats)

    def check_dim(self, dim: int) -> None:
        _check_pairs(self.factors, dim, "Factors factors")

    def inv_freq(self, dim: int, base: float) -> np.ndarray:
        self.check_dim(dim)
        return default_inv_freq(dim, base) / np.asarray(self.factors, dtype=np.float64)

    def float32_inv_freq(self, dim: int, base: float, *, xp: Namespace, device: Device = None) -> Array:
        # HF (longrope): 1 / (ext * base**(arange(0, d, 2) / d)), all in float32.
        self.check_dim(dim)
        ext = xp.asarray(self.factors, dtype=xp.float32, device=device)
        return 1.0 / (ext * float(base) ** float32_exponents(dim, xp=xp, device=device))


@dataclasses.dataclass(frozen=True)
class Frequencies(Scaling):
    """Explicit per-pair frequencies: ``inv_i = freqs[i]`` whatever the base (attention factor 1).

    For rotations whose frequencies come from elsewhere: a checkpoint's own table, or the
    *difference* of two RoPEs' frequencies, which re-rotates cached keys from one to the
    other in one exact rotation (:func:`rotary.positions.rerotate_keys`).  Entries may be
    zero (that pair does not rotate) or negative (it rotates backwards).  ``"float32"``
    angles use ``float32(freqs[i])``.

    Examples
    --------
    >>> import numpy as np, rotary
    >>> rope = rotary.RoPE(4, scaling=rotary.scaling.Frequencies((0.5, -0.25)))
    >>> rope.inv_freq()
    array([ 0.5 , -0.25])
    >>> c, s = rope.cos_sin([2])
    >>> np.round(s, 6)
    array([[ 0.841471, -0.479426]], dtype=float32)
    """

    freqs: tuple[float, ...]
    rope_type: ClassVar[str] = "frequencies"

    def __post_init__(self) -> None:
        items = v.check_sequence(self.freqs, "Frequencies freqs", "finite numbers")
        if not items:
            raise ValueError("Frequencies freqs must hold at least one frequency")
        freqs = tuple(v.check_float(f, f"Frequencies freqs[{i}]") for i, f in enumerate(items))
        object.__setattr__(self, "freqs", freqs)

    def check_dim(self, dim: int) -> None:
        _check_pairs(self.freqs, dim, "Frequencies freqs")

    def inv_freq(self, dim: int, base: float) -> np.ndarray:
        self.check_dim(dim)
        return np.asarray(self.freqs, dtype=np.float64)

    def float32_inv_freq(self, dim: int, base: float, *, xp: Namespace, device: Device = None) -> Array:
        self.check_dim(dim)
        return xp.asarray(self.freqs, dtype=xp.float32, device=device)


@dataclasses.dataclass(frozen=True)
class YaRN(Scaling):
    """YaRN (HF ``"yarn"``): interpolate low frequencies, keep high ones, ramp between.

    Parameters
    ----------
    factor : float
        Context extension factor ``s >= 1``.
    original_max_position_embeddings : int
        Pre-training context length ``L0``.
    attention_factor_ : float, optional
        Overrides the attention factor (HF ``attention_factor``); by default
        ``g(s, mscale) / g(s, mscale_all_dim)`` when both are set (DeepSeek), else
        ``g(s) = 0.1 ln(s) + 1``.
    beta_fast, beta_slow : float
        Rotation counts bounding the ramp (defaults 32 and 1; ``beta_fast > beta_slow > 0``).
    mscale, mscale_all_dim : float, optional
        DeepSeek's attention-factor parameters (non-negative).
    truncate : bool
        Round the ramp bounds to integers (HF default True; GPT-OSS uses False).

    Examples
    --------
    >>> from rotary.scaling import YaRN
    >>> y = YaRN(4.0, 4096)
    >>> y.correction_range(128, 10000.0)
    (20, 46)
    >>> round(y.attention_factor(128, 10000.0), 5)
    1.13863
    """

    factor: float
    original_max_position_embeddings: int
    attention_factor_: float | None = None
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool = True
    rope_type: ClassVar[str] = "yarn"

    def __post_init__(self) -> None:
        _check(self, "YaRN", "factor", minimum=1.0)
        _check(self, "YaRN", "original_max_position_embeddings", v.check_int, minimum=1)
        for name, default in (("beta_fast", 32.0), ("beta_slow", 1.0)):  # HF: ``beta_fast or 32``...
            if getattr(self, name) is None:
                object.__setattr__(self, name, default)
            _check(self, "YaRN", name, above=0.0)
        if not self.beta_fast > self.beta_slow:
            raise ValueError(
                f"YaRN beta_fast must be > beta_slow, got beta_fast={self.beta_fast}, "
                f"beta_slow={self.beta_slow}"
            )
        _optional(self, "YaRN", "attention_factor_", above=0.0)
        _optional(self, "YaRN", "mscale", minimum=0.0)
        _optional(self, "YaRN", "mscale_all_dim", minimum=0.0)
        _check(self, "YaRN", "truncate", v.check_bool)

    @staticmethod
    def _mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    def attention_factor(self, dim: int, base: float) -> float:
        if self.attention_factor_ is not None:
            return self.attention_factor_
        s = self.factor
        if self.mscale and self.mscale_all_dim:
            return float(self._mscale(s, self.mscale) / self._mscale(s, self.mscale_all_dim))
        return self._mscale(s)

    def correction_range(self, dim: int, base: float) -> tuple[float, float]:
        """The ramp bounds ``(lo, hi)`` in frequency-index units (HF ``find_correction_range``)."""
        L0 = self.original_max_position_embeddings

        def cd(rot: float) -> float:
            return (dim * math.log(L0 / (rot * 2 * math.pi))) / (2 * math.log(base))

        lo, hi = cd(self.beta_fast), cd(self.beta_slow)
        if self.truncate:
            lo, hi = math.floor(lo), math.ceil(hi)
        return max(lo, 0), min(hi, dim - 1)

    def _bounds(self, dim: int, base: float) -> tuple[float, float]:
        lo, hi = self.correction_range(dim, base)
        if lo == hi:
            hi += 0.001  # HF: avoid a zero-width ramp
        return lo, hi

    def inv_freq(self, dim: int, base: float) -> np.ndarray:
        w = default_inv_freq(dim, base)
        lo, hi = self._bounds(dim, base)
        ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - lo) / (hi - lo), 0.0, 1.0)
        extrapolation = 1.0 - ramp
        return (w / self.factor) * (1.0 - extrapolation) + w * extrapolation

    def float32_inv_freq(self, dim: int, base: float, *, xp: Namespace, device: Device = None) -> Array:
        pos_freqs = float(base) ** float32_exponents(dim, xp=xp, device=device)
        extrap = 1.0 / pos_freqs
        interp = 1.0 / (self.factor * pos_freqs)
        lo, hi = self._bounds(dim, base)
        ramp = xp.clip((xp.arange(dim // 2, dtype=xp.float32, device=device) - lo) / (hi - lo), 0.0, 1.0)
        ef = 1.0 - ramp
        return interp * (1.0 - ef) + extrap * ef


@dataclasses.dataclass(frozen=True)
class Llama3(Scaling):
    """Llama 3 scaling (HF ``"llama3"``): wavelength bands, smooth in between.

    Wavelengths ``2 pi / inv`` shorter than ``L0 / high_freq_factor`` keep their frequency,
    longer than ``L0 / low_freq_factor`` are divided by ``factor``, the band between
    interpolates.  Llama 3.1 uses ``factor=8``, Llama 3.2 1B/3B ``factor=32`` (``L0 = 8192``,
    low 1, high 4).  ``low_freq_factor == high_freq_factor`` (Llama 4 Scout: both 1) leaves no
    band between: a frequency is kept or divided.

    Examples
    --------
    >>> from rotary.scaling import Llama3
    >>> w = Llama3(8.0, 8192).inv_freq(128, 500000.0)
    >>> float(w[0]), float(w[-1] * 8 / Llama3(1.0, 8192).inv_freq(128, 500000.0)[-1])
    (1.0, 1.0)
    """

    factor: float
    original_max_position_embeddings: int
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    rope_type: ClassVar[str] = "llama3"

    def __post_init__(self) -> None:
        _check(self, "Llama3", "factor", minimum=1.0)
        _check(self, "Llama3", "original_max_position_embeddings", v.check_int, minimum=1)
        _check(self, "Llama3", "low_freq_factor", above=0.0)
        _check(self, "Llama3", "high_freq_factor", above=0.0)
        lo, hi = self.low_freq_factor, self.high_freq_factor
        if not hi >= lo:
            raise ValueError(
                f"Llama3 needs low_freq_factor <= high_freq_factor, got low_freq_factor={lo!r}, "
                f"high_freq_factor={hi!r}"
            )

    def _combine(self, inv: Array, xp: Namespace) -> Array:
        L0 = self.original_max_position_embeddings
        lff, hff, s = self.low_freq_factor, self.high_freq_factor, self.factor
        low_wl, high_wl = L0 / lff, L0 / hff
        wavelen = 2 * math.pi / inv
        out = xp.where(wavelen > low_wl, inv / s, inv)
        if hff == lff:  # no band between (HF's smooth factor would divide by zero, unused)
            return out
        smooth = (L0 / wavelen - lff) / (hff - lff)
        smoothed = (1 - smooth) * out / s + smooth * out
        medium = xp.logical_and(xp.logical_not(wavelen < high_wl), xp.logical_not(wavelen > low_wl))
        return xp.where(medium, smoothed, out)

    def inv_freq(self, dim: int, base: float) -> np.ndarray:
        return self._combine(default_inv_freq(dim, base), np)

    def float32_inv_freq(self, dim: int, base: float, *, xp: Namespace, device: Device = None) -> Array:
        return self._combine(default_float32_inv_freq(dim, base, xp=xp, device=device), xp)


# -- dynamic scalings ------------------------------------------------------------------------
def _seq_len(pos: Array, xp: Namespace, per_sequence: bool) -> Array:
    """``max(pos) + 1``: 0-d, or per sequence of shape ``pos.shape[:-1] + (1, 1)``, which
    broadcasts against cos/sin ``pos.shape + (d/2,)``."""
    if per_sequence and pos.ndim >= 1:
        return xp.max(pos, axis=-1, keepdims=True)[..., None] + 1
    return xp.max(pos) + 1


def _select(
    cond: Array, a: tuple[Array, Array], b: tuple[Array, Array], xp: Namespace
) -> tuple[Array, Array]:
    """``where(cond, a, b)`` for (cos, sin) pairs."""
    return xp.where(cond, a[0], b[0]), xp.where(cond, a[1], b[1])


@dataclasses.dataclass(frozen=True)
class DynamicNTK(Scaling):
    """Dynamic NTK (HF ``"dynamic"``): the NTK base follows the sequence length.

    With ``L = max_position_embeddings`` and ``n = seq_len = max(pos) + 1``: for ``n <= L``
    the default frequencies; beyond, base ``base * (factor * n / L - (factor - 1))**(d / (d - 2))``.

    Parameters
    ----------
    factor : float
        Scaling factor (>= 1).
    max_position_embeddings : int
        The length ``L`` beyond which the base grows.
    per_sequence : bool
        ``False`` (default, as HF): one ``seq_len`` for the whole batch.  ``True``:
        ``seq_len`` per batch row, from the last axis of the positions, which must then be
        the sequence axis: ``(batch, seq)`` or ``(batch, 1, seq)``; positions ``(batch, seq, 1)``
        for ``(batch, seq, heads, dim)`` data would give each token its own length.

    Notes
    -----
    Hugging Face's module is stateful: after a long sequence it keeps the grown frequencies
    for later shorter ones (down to ``L``).  Here the frequencies are a pure function of the
    positions given, which equals HF on a fresh module.  In ``"exact"`` mode the grown branch
    is computed in the widest float of the backend (float64: error ~1e-12; float32-only
    backends: the float32 recipe's error); the ``n <= L`` branch is exact.

    Examples
    --------
    >>> import numpy as np, rotary
    >>> rope = rotary.RoPE(8, scaling=rotary.scaling.DynamicNTK(2.0, 16))
    >>> c_short, _ = rope.cos_sin(np.arange(16))
    >>> c_long, _ = rope.cos_sin(np.arange(32))
    >>> bool(np.allclose(c_short, rotary.RoPE(8).cos_sin(np.arange(16))[0]))
    True
    >>> bool(np.allclose(c_long[:16], c_short))
    False
    """

    factor: float
    max_position_embeddings: int
    per_sequence: bool = False
    rope_type: ClassVar[str] = "dynamic"
    dynamic: ClassVar[bool] = True

    def __post_init__(self) -> None:
        _check(self, "DynamicNTK", "factor", minimum=1.0)
        _check(self, "DynamicNTK", "max_position_embeddings", v.check_int, minimum=1)
        _check(self, "DynamicNTK", "per_sequence", v.check_bool)

    def check_dim(self, dim: int) -> None:
        _check_ntk_dim("DynamicNTK", dim)

    def variants(self) -> tuple[Scaling, ...]:
        return (Default(),)

    def float32_inv_freq(self, dim: int, base: float, *, xp: Namespace, device: Device = None) -> Array:
        # HF's init-time frequencies: the dynamic formula at seq_len = L, in Python floats.
        L, f = self.max_position_embeddings, self.factor
        b = float(base) * ((f * L / L) - (f - 1)) ** (dim / (dim - 2))
        return default_float32_inv_freq(dim, b, xp=xp, device=device)

    def dynamic_cos_sin(
        self,
        pos: Array,
        static: StaticCosSin,
        *,
        dim: int,
        base: float,
        angles: AngleMethod,
        xp: Namespace,
        device: Device,
        dtype: DType,
        wide: DType,
    ) -> tuple[Array, Array]:
        L, f = self.max_position_embeddings, self.factor
        n = _seq_len(pos, xp, self.per_sequence)
        short = static(0)
        if angles == "float32":
            # HF's tensor path, op for op: seq_len as float32, base in float32, then pow.
            n32 = xp.astype(xp.clip(n, min=L), xp.float32)
            b = base * ((f * n32 / L) - (f - 1)) ** (dim / (dim - 2))
            inv = 1.0 / (b ** float32_exponents(dim, xp=xp, device=device))
            ang = xp.astype(pos, xp.float32)[..., None] * inv
        else:
            nf = xp.clip(xp.astype(n, wide), min=float(L))
            log_b = math.log(base) + (dim / (dim - 2)) * xp.log(f * nf / L - (f - 1))
            exps = xp.arange(0, dim, 2, dtype=wide, device=device) / dim
            ang = xp.astype(pos, wide)[..., None] * xp.exp(-exps * log_b)
        grown = (xp.cos(ang), xp.sin(ang))
        if grown[0].dtype != dtype:
            grown = (xp.astype(grown[0], dtype), xp.astype(grown[1], dtype))
        return _select(n > L, grown, short, xp)


@dataclasses.dataclass(frozen=True)
class LongRoPE(Scaling):
    """LongRoPE (HF ``"longrope"``, Phi-3): per-frequency factors, short or long by sequence length.

    ``inv_i = base**(-2i/d) / ext_i`` with ``ext = long_factor`` when
    ``seq_len = max(pos) + 1 > original_max_position_embeddings`` else ``short_factor``.

    Parameters
    ----------
    short_factor, long_factor : sequence of float
        ``rotary_dim // 2`` positive factors each.
    original_max_position_embeddings : int
        Pre-training context length ``L0`` (at least 2).
    factor : float, optional
        Extension factor (HF default ``max_position_embeddings / L0``); sets the attention
        factor ``sqrt(1 + ln(factor) / ln(L0))`` (1 when ``factor <= 1``).
    attention_factor_ : float, optional
        Overrides the attention factor.
    per_sequence : bool
        ``True``: choose short/long per batch row instead of for the whole batch (the last
        axis of the positions is the sequence axis, as for :class:`DynamicNTK`).

    Examples
    --------
    >>> from rotary.scaling import LongRoPE
    >>> sc = LongRoPE((1.0,) * 64, (4.0,) * 64, 4096, factor=32.0)
    >>> round(sc.attention_factor(128, 10000.0), 5)
    1.19024
    """

    short_factor: tuple[float, ...]
    long_factor: tuple[float, ...]
    original_max_position_embeddings: int
    factor: float | None = None
    attention_factor_: float | None = None
    per_sequence: bool = False
    rope_type: ClassVar[str] = "longrope"
    dynamic: ClassVar[bool] = True

    def __post_init__(self) -> None:
        _check(self, "LongRoPE", "short_factor", v.check_positive_floats)
        _check(self, "LongRoPE", "long_factor", v.check_positive_floats)
        short, long = self.short_factor, self.long_factor
        if len(short) != len(long):
            raise ValueError(
                f"LongRoPE short_factor and long_factor must have the same length, got {len(short)} "
                f"and {len(long)}"
            )
        _check(self, "LongRoPE", "original_max_position_embeddings", v.check_int, minimum=2)
        if self.factor is None and self.attention_factor_ is None:
            raise ValueError(
                "LongRoPE needs factor (max_position_embeddings / original_max_position_embeddings) "
                "or attention_factor"
            )
        _optional(self, "LongRoPE", "factor", above=0.0)
        _optional(self, "LongRoPE", "attention_factor_", above=0.0)
        _check(self, "LongRoPE", "per_sequence", v.check_bool)

    def check_dim(self, dim: int) -> None:
        _check_pairs(self.short_factor, dim, "LongRoPE short_factor")
        _check_pairs(self.long_factor, dim, "LongRoPE long_factor")

    def variants(self) -> tuple[Scaling, ...]:
        return (Factors(self.short_factor), Factors(self.long_factor))

    def attention_factor(self, dim: int, base: float) -> float:
        if self.attention_factor_ is not None:
            return self.attention_factor_
        assert self.factor is not None  # checked on construction: factor or attention_factor
        s = self.factor
        if s <= 1.0:
            return 1.0
        return math.sqrt(1 + math.log(s) / math.log(self.original_max_position_embeddings))

    def inv_freq(self, dim: int, base: float) -> np.ndarray:
        """The short-factor frequencies (used while ``seq_len <= L0``)."""
        return Factors(self.short_factor).inv_freq(dim, base)

    def float32_inv_freq(self, dim: int, base: float, *, xp: Namespace, device: Device = None) -> Array:
        return Factors(self.short_factor).float32_inv_freq(dim, base, xp=xp, device=device)

    def dynamic_cos_sin(
        self, pos: Array, static: StaticCosSin, *, xp: Namespace, **_: Any
    ) -> tuple[Array, Array]:
        n = _seq_len(pos, xp, self.per_sequence)
        return _select(n > self.original_max_position_embeddings, static(1), static(0), xp)


_REGISTRY: dict[str, type[Scaling]] = {}


def register(cls: type[Scaling]) -> type[Scaling]:
    """Class decorator: make a scaling's ``rope_type`` known to :func:`from_dict`."""
    if not (isinstance(cls, type) and issubclass(cls, Scaling)):
        raise TypeError(f"register needs a Scaling subclass, got {cls!r}")
    if "rope_type" not in cls.__dict__:
        raise ValueError(f"{cls.__name__} must define its own rope_type to be registered")
    _REGISTRY[cls.rope_type] = cls
    return cls


for _cls in (Default, Linear, NTK, Factors, Frequencies, YaRN, Llama3, DynamicNTK, LongRoPE, Backwards):
    register(_cls)


def resolve(scaling: Any) -> Scaling:
    """Normalise the ``scaling=`` argument: ``None``, a :class:`Scaling`, or an HF ``rope_scaling`` dict."""
    if scaling is None:
        return Default()
    if isinstance(scaling, Scaling):
        try:
            hash(scaling)
        except TypeError:
            raise TypeError(
                f"scaling {type(scaling).__name__} must be hashable (a frozen dataclass with "
                "plain-value fields)"
            ) from None
        return scaling
    if isinstance(scaling, dict):
        return from_dict(scaling)
    raise TypeError(
        "scaling must be None, a rotary.scaling.Scaling instance or a Hugging Face "
        f"rope_scaling dict, got {type(scaling).__name__}"
    )


def as_fields(scaling: Any) -> tuple[str, tuple[Any, ...]]:
    """``scaling`` (a :class:`Scaling` or an HF dict, resolved) as its ``rope_type`` and field
    values: plain values that a ``torch.compile`` trace can receive as constants."""
    sc = resolve(scaling)
    return type(sc).rope_type, tuple(getattr(sc, f.name) for f in dataclasses.fields(sc) if f.init)


def from_fields(kind: str, values: tuple[Any, ...]) -> Scaling:
    """The scaling of :func:`as_fields`' result."""
    return _REGISTRY[kind](*values)


#: Keys HunYuan's published NTK-alpha dicts carry that transformers' ``ntk_alpha`` ignores.
_NTK_ALPHA_IGNORED = frozenset({"factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim"})


def _ntk_alpha(d: dict[str, Any]) -> Scaling:
    """HunYuan's NTK-alpha (``{"type": "dynamic", "alpha": a}``, transformers' ``ntk_alpha``): the
    base becomes ``base * alpha**(d / (d - 2))`` for every position, i.e. :class:`NTK` with
    ``factor=alpha`` (transformers: ``compute_ntk_alpha_rope_parameters``)."""
    unknown = sorted(k for k in d if k not in _NTK_ALPHA_IGNORED and k not in _ROPE_KEYS and k != "alpha")
    if unknown:
        raise ValueError(
            f"rope_type 'ntk_alpha' does not take {', '.join(map(repr, unknown))}; it takes 'alpha'"
        )
    if d.get("alpha") is None:
        raise ValueError("rope_type 'ntk_alpha' needs 'alpha' in the scaling dict")
    return NTK(factor=d["alpha"])


#: HF dict keys whose dataclass field has another name.
_RENAMES = {"attention_factor": "attention_factor_"}
#: Keys of HF dicts that describe the RoPE, not the scaling.
_ROPE_KEYS = frozenset(
    {
        "rope_type",
        "type",
        "rope_theta",
        "partial_rotary_factor",
        "max_position_embeddings",
        "mrope_section",
        "mrope_interleaved",
        "original_max_position_embeddings",
        "head_dim",
    }
)


def from_dict(d: dict[str, Any], **defaults: Any) -> Scaling:
    """Build a scaling from a Hugging Face ``rope_scaling`` / ``rope_parameters`` dict.

    ``defaults`` fill fields the dict lacks (``from_hf`` passes ``max_position_embeddings``
    and ``original_max_position_embeddings``).  Keys that are neither a field of the scaling
    nor a RoPE key HF puts beside it (``rope_theta``, ``partial_rotary_factor``...) are an
    error, as are missing required fields.  ``None`` values count as absent.

    Examples
    --------
    >>> from rotary.scaling import from_dict
    >>> from_dict({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096})
    YaRN(factor=4.0, original_max_position_embeddings=4096, attention_factor_=None, beta_fast=32.0, \
beta_slow=1.0, mscale=None, mscale_all_dim=None, truncate=True)
    """
    if not isinstance(d, dict):
        raise TypeError(f"rope_scaling must be a dict, got {type(d).__name__}")
    kind = d.get("rope_type", d.get("type", "default"))
    if kind == "ntk_alpha" or (kind == "dynamic" and d.get("alpha") is not None):
        return _ntk_alpha(d)
    if kind not in _REGISTRY:
        raise v.unknown_option("rope_type", kind, _REGISTRY)
    cls = _REGISTRY[kind]
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = [k for k in d if _RENAMES.get(k, k) not in fields and k not in _ROPE_KEYS]
    if unknown:
        names = sorted(n.rstrip("_") for n in fields)
        raise ValueError(
            f"rope_type {kind!r} does not take {', '.join(repr(k) for k in sorted(unknown))}; "
            f"its parameters are {names}"
        )
    given = [*defaults.items(), *((_RENAMES.get(k, k), val) for k, val in d.items())]
    kw = {k: val for k, val in given if k in fields and val is not None}
    missing = [
        n
        for n, f in fields.items()
        if n not in kw and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise ValueError(
            f"rope_type {kind!r} needs {', '.join(repr(m) for m in missing)} in the scaling dict"
        )
    return cls(**kw)
