"""Certify any RoPE implementation: ``check_rope(rotate_fn)`` measures every property.

``rotate_fn(x, pos)`` must return ``x`` (shape ``(..., seq, head_dim)``) rotated at the
positions ``pos`` (shape ``(seq,)``).  The checker builds its inputs in the namespace
``xp`` (NumPy by default), on ``device``, in ``dtype``, calls ``rotate_fn`` a few dozen
times and compares with an independent float64 oracle (:mod:`rotary.testing.reference`,
the explicit rotation matrix with correctly rounded cos/sin).

Tolerances
----------
Errors are measured relative to the size of the data (``max(1, max|x|)`` for rotated
vectors, ``|q| |k|`` for scores), so they read in units of ``eps(dtype)`` (the spacing
of the dtype at 1.0: 2**-52, 2**-23, 2**-10, 2**-7 for float64/32/16, bfloat16):

* ``ulps * eps(dtype)`` (default 8 eps) for output rounding and the rotation arithmetic;
* plus, per element, an *angle allowance* ``2 * angle_eps * |position|`` (``theta_0 = 1``
  is the fastest frequency): the error a rotation angle ``pos * theta`` formed in a
  floating type with relative precision ``angle_eps`` may make.  The default
  ``angle_eps = 2**-23`` accepts the common float32 recipe (Hugging Face's, whose error
  reaches ~6e-2 near position 2**20); ``angle_eps=0`` demands exact angles (what
  ``rotary`` itself guarantees: < 1e-6 absolute up to 2**36).

Examples
--------
>>> import rotary
>>> from rotary.testing import check_rope
>>> report = check_rope(lambda x, pos: rotary.rotate(x, pos), angle_eps=0.0)
>>> bool(report), report.failed
(True, [])
>>> bad = check_rope(lambda x, pos: rotary.rotate(x, pos), layout="interleaved")
>>> bad.failed
['matrix_form', 'long_positions', 'layout']
>>> print(bad["layout"].message)  # doctest: +NORMALIZE_WHITESPACE +ELLIPSIS
looks like the 'half' layout (feature 0 pairs with 32, ...),
but was checked as layout='interleaved'...
"""

from __future__ import annotations

import dataclasses
import math
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from .._lib._compat import is_array, to_numpy
from .._lib._validation import check_float
from . import reference
from .asserts import eps

__all__ = ["PROPERTIES", "PropertyResult", "RopeReport", "check_rope"]

#: The properties, in report order, with what each asserts.
PROPERTIES: dict[str, str] = {
    "matrix_form": "agrees with the float64 rotation-matrix form R_pos x (positions 0..987)",
    "long_positions": "agrees with the float64 truth at positions 2**10 .. 2**20",
    "relative_position": "<R_m q, R_n k> == <q, R_{n-m} k>",
    "shift_invariance": "scores unchanged when every position is shifted by s (up to 2**16)",
    "norm": "|R_m x| == |x|",
    "inverse": "rotating by -m undoes rotating by m",
    "composition": "rotating by a then by b == rotating by a + b",
    "layout": "features are paired as the layout says",
    "dtype": "output has the input's dtype and shape",
    "device": "output has the input's array type and device",
    "no_mutation": "inputs (x and pos) are left unchanged",
}


def _dtype_name(dtype: Any) -> str:
    s = str(dtype)
    for name in ("bfloat16", "float16", "float32", "float64"):
        if name in s:
            return name
    try:
        return np.dtype(dtype).name
    except TypeError:
        raise TypeError(f"dtype must be a real floating dtype, got {dtype!r}") from None


@dataclasses.dataclass
class PropertyResult:
    """The outcome of one property: worst measured error against its tolerance there."""

    name: str
    passed: bool
    error: float
    tol: float
    ulps: float
    message: str = ""

    @property
    def description(self) -> str:
        return PROPERTIES.get(self.name, self.name)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "passed": self.passed,
            "error": _json_float(self.error),
            "tol": _json_float(self.tol),
            "ulps": _json_float(self.ulps),
            "message": self.message,
        }


def _json_float(v: float) -> float | str:
    return v if math.isfinite(v) else str(v)


@dataclasses.dataclass
class RopeReport:
    """Every property's result; truthy iff all hold.  ``str`` gives a readable table."""

    config: dict[str, Any]
    results: list[PropertyResult]

    def __bool__(self) -> bool:
        return all(r.passed for r in self.results)

    @property
    def failed(self) -> list[str]:
        """Names of the properties that do not hold."""
        return [r.name for r in self.results if not r.passed]

    def __getitem__(self, name: str) -> PropertyResult:
        for r in self.results:
            if r.name == name:
                return r
        raise KeyError(f"no property {name!r}; properties: {[r.name for r in self.results]}")

    def __iter__(self) -> Iterator[PropertyResult]:
        return iter(self.results)

    def to_dict(self) -> dict[str, Any]:
        return {"passed": bool(self), "config": dict(self.config), "results": [r.to_dict() for r in self]}

    def __repr__(self) -> str:
        cfg = ", ".join(f"{k}={v!r}" for k, v in self.config.items())
        n = len(self.results)
        status = "all hold" if self else f"FAILED: {', '.join(self.failed)}"
        return f"<RopeReport {cfg}: {n - len(self.failed)}/{n} properties hold; {status}>"

    def __str__(self) -> str:
        cfg = ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in self.config.items())
        lines = [
            f"check_rope({cfg})",
            f"  {'property':<18} {'status':<6} {'error':>9} {'tol':>9} {'ulps':>9}",
        ]
        for r in self.results:
            st = "ok" if r.passed else "FAIL"
            lines.append(f"  {r.name:<18} {st:<6} {r.error:9.2e} {r.tol:9.2e} {r.ulps:9.3g}")
            if r.message:
                lines.append(f"      -> {r.message}")
        n = len(self.results)
        tail = "all properties hold" if self else f"FAILED {len(self.failed)}/{n}: {', '.join(self.failed)}"
        lines.append(f"  {n - len(self.failed)}/{n} hold: {tail}")
        return "\n".join(lines)


@dataclasses.dataclass
class _Ctx:
    """Inputs and conversions for one ``check_rope`` run."""

    fn: Callable[[Any, Any], Any]
    xp: Any
    device: Any
    dtype: Any
    pos_dtype: Any
    d: int
    layout: str
    base: float
    ulps: float
    angle_eps: float

    def __post_init__(self) -> None:
        self.dname = _dtype_name(self.dtype)
        self.eps = eps(self.dname)
        self.base_tol = self.ulps * self.eps
        self.th = reference.theta(self.d, self.base)

    def arr(self, host: np.ndarray, host_dtype: Any = np.float64, dtype: Any = None) -> Any:
        kw = {} if self.device is None else {"device": self.device}
        dtype = self.dtype if dtype is None else dtype
        return self.xp.asarray(np.asarray(host, dtype=host_dtype), dtype=dtype, **kw)

    def positions(self, host: Any) -> Any:
        return self.arr(host, np.int64, self.pos_dtype)

    def host(self, a: Any) -> np.ndarray:
        return np.asarray(to_numpy(a), dtype=np.float64)

    def data(self, seed: int) -> tuple[Any, np.ndarray]:
        """Normal(0, 1) data of the checked shape and dtype, and its exact float64 value."""
        x = self.arr(np.random.default_rng(seed).normal(size=(1, 2, _SEQ, self.d)))
        return x, self.host(x)

    def call(self, x: Any, pos: Any) -> Any:
        """``rotate_fn(x, pos)``, which must return an array."""
        out = self.fn(x, pos)
        if not is_array(out):
            raise _Fail(f"rotate_fn returned a {type(out).__name__}, not an array (of the input's library)")
        return out

    def rot(self, x: Any, pos_host: Any) -> np.ndarray:
        """Call ``rotate_fn`` and return its result on the host in float64 (shape checked)."""
        h = self.host(self.call(x, self.positions(pos_host)))
        if h.shape != tuple(x.shape):
            raise _Fail(f"rotate_fn returned shape {h.shape} for input shape {tuple(x.shape)}")
        return h

    def allowance(self, pos: Any) -> np.ndarray:
        return 2.0 * self.angle_eps * np.abs(np.asarray(pos, dtype=np.float64))


class _Fail(Exception):
    pass


def _measure(name: str, ctx: _Ctx, err: Any, tol: Any) -> PropertyResult:
    err = np.asarray(err, dtype=np.float64)
    tol = np.broadcast_to(np.asarray(tol, dtype=np.float64), err.shape)
    err = np.where(np.isfinite(err), err, np.inf)
    k = int(np.argmax(err / tol))  # the worst element (every property measures a non-empty array)
    e, t = float(err.flat[k]), float(tol.flat[k])
    passed = bool(np.all(err <= tol))
    message = ""
    if not passed:
        message = f"error {e:.3g} exceeds tolerance {t:.3g} ({e / t:.3g}x)"
        if not math.isfinite(e):
            message = "non-finite output (NaN or inf)"
    return PropertyResult(name, passed, e, t, e / ctx.eps, message)


def _rel(out: np.ndarray, ref: np.ndarray, scale: float) -> np.ndarray:
    return np.abs(out - ref) / scale


#: Every call uses x of shape (1, 2, _SEQ, head_dim) and pos of shape (_SEQ,): one shape, so
#: backends that compile per shape (JAX) compile once.
_SEQ = 16

_MATRIX_POS = np.array([0, 1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 233, 377, 610, 987])
# odd positions from 2**10 to 2**20 - 1, and 2**20 itself: within the documented range
_LONG_POS = np.unique(np.minimum(np.round(np.geomspace(2**10, 2**20, 15)).astype(np.int64) | 1, 2**20 - 1))
_LONG_POS = np.concatenate([_LONG_POS, [2**20]])[:16]


def _scale(xh: np.ndarray) -> float:
    return max(1.0, float(np.max(np.abs(xh))))


def _against_truth(
    ctx: _Ctx, name: str, seed: int, pos: np.ndarray, diagnose: bool = False
) -> PropertyResult:
    """Rotated data at ``pos`` against the float64 oracle."""
    x, xh = ctx.data(seed)
    out = ctx.rot(x, pos)
    scale = _scale(xh)
    ref = reference.rotate(xh, pos, layout=ctx.layout, th=ctx.th)
    tol = ctx.base_tol + ctx.allowance(pos)[None, None, :, None]
    res = _measure(name, ctx, _rel(out, ref, scale), tol)
    if diagnose and not res.passed:
        res.message += _diagnose(ctx, xh, out, scale)
    return res


def _p_matrix_form(ctx: _Ctx) -> PropertyResult:
    return _against_truth(ctx, "matrix_form", 1, _MATRIX_POS, diagnose=True)


def _diagnose(ctx: _Ctx, xh: np.ndarray, out: np.ndarray, scale: float) -> str:
    """Guess what is wrong: the other layout, the opposite sign, another base."""
    close = 64 * ctx.eps + ctx.allowance(_MATRIX_POS.max())
    other = "interleaved" if ctx.layout == "half" else "half"
    for label, lay, pos in (
        (f"it matches the {other!r} layout instead", other, _MATRIX_POS),
        ("it rotates by -pos (wrong sign / transposed rotation)", ctx.layout, -_MATRIX_POS),
        (f"it rotates by -pos in the {other!r} layout", other, -_MATRIX_POS),
    ):
        if np.max(_rel(out, reference.rotate(xh, pos, layout=lay, th=ctx.th), scale)) <= close:
            return f"; {label}"
    # Estimate the base from the angle of pair 1 (head_dim >= 4) at position 1.
    a, b = reference.pair_indices(ctx.d, ctx.layout)[1]
    xa, xb = xh[0, :, 1, a], xh[0, :, 1, b]
    oa, ob = out[0, :, 1, a], out[0, :, 1, b]
    t1 = float(np.median(np.arctan2(xa * ob - xb * oa, xa * oa + xb * ob)))
    if not 0 < t1 < 1:
        return ""
    return (
        f"; the angle of pair 1 at position 1 is {t1:.6g} (expected {ctx.th[1]:.6g}), "
        f"i.e. base ~ {t1 ** (-ctx.d / 2):.4g}"
    )


def _p_long_positions(ctx: _Ctx) -> PropertyResult:
    return _against_truth(ctx, "long_positions", 2, _LONG_POS)


_M = np.array([0, 3, 17, 100, 1000, 4000, 7, 2500, 0, 42, 999, 4096, 1, 333, 3000, 64])
_N = np.array([0, 5, 2, 1100, 10, 4096, 7, 17, 4000, 41, 0, 1, 2048, 3333, 30, 4095])


def _p_relative_position(ctx: _Ctx) -> PropertyResult:
    rng = np.random.default_rng(3)
    # Two heads, each one vector repeated along the sequence: row i sits at _M[i] (q), _N[i] (k).
    q = np.repeat(rng.normal(size=(1, 2, 1, ctx.d)), _SEQ, axis=2)
    k = np.repeat(rng.normal(size=(1, 2, 1, ctx.d)), _SEQ, axis=2)
    qx, kx = ctx.arr(q), ctx.arr(k)
    qh, kh = ctx.host(qx)[0, :, 0], ctx.host(kx)[0, :, 0]  # (2, d)
    lhs = np.sum(ctx.rot(qx, _M) * ctx.rot(kx, _N), axis=-1)[0]  # (2, seq)
    rhs = np.einsum("hsd,hd->hs", ctx.rot(kx, _N - _M)[0], qh)
    norm = (np.linalg.norm(qh, axis=-1) * np.linalg.norm(kh, axis=-1))[:, None]
    err = np.abs(lhs - rhs) / norm
    tol = 2 * ctx.base_tol + ctx.allowance(np.abs(_M) + np.abs(_N) + np.abs(_N - _M))[None, :]
    return _measure("relative_position", ctx, err, tol)


_SHIFTS = (1, 999, 2**16 + 7)


def _p_shift_invariance(ctx: _Ctx) -> PropertyResult:
    p0 = np.arange(_SEQ)
    q, qh = ctx.data(4)
    k, kh = ctx.data(5)
    norms = np.linalg.norm(qh[0], axis=-1)[:, :, None] * np.linalg.norm(kh[0], axis=-1)[:, None, :]
    s0 = np.einsum("hid,hjd->hij", ctx.rot(q, p0)[0], ctx.rot(k, p0)[0])
    errs, tols = [], []
    for s in _SHIFTS:
        ss = np.einsum("hid,hjd->hij", ctx.rot(q, p0 + s)[0], ctx.rot(k, p0 + s)[0])
        errs.append(np.abs(ss - s0) / norms)
        tols.append(2 * ctx.base_tol + ctx.allowance(2 * (s + p0[:, None] + p0[None, :])))
    res = _measure("shift_invariance", ctx, np.stack(errs), np.stack(tols)[:, None])
    if not res.passed:
        worst = int(np.argmax([np.max(e / t) for e, t in zip(errs, tols)]))
        res.message += f" (at shift {_SHIFTS[worst]})"
    return res


def _p_norm(ctx: _Ctx) -> PropertyResult:
    pos = np.concatenate([_MATRIX_POS[::2], _LONG_POS[::2]])
    x, xh = ctx.data(6)
    out = ctx.rot(x, pos)
    nx = np.linalg.norm(xh, axis=-1)
    err = np.abs(np.linalg.norm(out, axis=-1) - nx) / np.maximum(nx, 1e-300)
    return _measure("norm", ctx, err, ctx.base_tol)


def _p_inverse(ctx: _Ctx) -> PropertyResult:
    pos = _MATRIX_POS + np.array([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3000, 65536])
    x, xh = ctx.data(7)
    once = ctx.call(x, ctx.positions(pos))
    back = ctx.rot(once, -pos)
    scale = _scale(xh)
    tol = ctx.base_tol + 2 * ctx.allowance(pos)[None, None, :, None]
    return _measure("inverse", ctx, _rel(back, xh, scale), tol)


def _p_composition(ctx: _Ctx) -> PropertyResult:
    a = _MATRIX_POS
    b = np.array([5, 0, 1, 700, 4096, 3, 2, 1, 100, 9, 11, 2000, 60000, 31, 1, 7])
    x, xh = ctx.data(8)
    twice = ctx.rot(ctx.call(x, ctx.positions(a)), b)
    once = ctx.rot(x, a + b)
    scale = _scale(xh)
    tol = 2 * ctx.base_tol + ctx.allowance(np.abs(a) + np.abs(b) + np.abs(a + b))[None, None, :, None]
    return _measure("composition", ctx, _rel(twice, once, scale), tol)


def _partners(ctx: _Ctx) -> np.ndarray:
    """For each feature j, the feature its rotation mixes it with most (basis vectors at pos 1)."""
    d, n = ctx.d, 2 * _SEQ
    rows = []
    for start in range(0, d, n):  # basis vectors e_start.., n per call (zero rows past d), at position 1
        block = np.eye(n, d, k=start).reshape(1, 2, _SEQ, d)
        out = ctx.rot(ctx.arr(block), np.ones(_SEQ, dtype=np.int64))
        rows.append(out.reshape(n, d)[: d - start])
    mix = np.abs(np.concatenate(rows))
    np.fill_diagonal(mix, -1.0)
    return np.argmax(mix, axis=1)


def _p_layout(ctx: _Ctx) -> PropertyResult:
    d = ctx.d
    partner = _partners(ctx)
    expected = {
        "half": (np.arange(d) + d // 2) % d,
        "interleaved": np.arange(d) ^ 1,
    }
    detected = next((name for name, p in expected.items() if np.array_equal(partner, p)), None)
    wrong = float(np.mean(partner != expected[ctx.layout]))
    res = PropertyResult("layout", wrong == 0.0, wrong, 0.0, 0.0)
    if detected is not None and detected != ctx.layout:
        res.message = (
            f"looks like the {detected!r} layout (feature 0 pairs with {partner[0]}, "
            f"feature 1 with {partner[1]}), but was checked as layout={ctx.layout!r}: check it with "
            f"layout={detected!r}, or convert with rotary.convert_layout"
        )
    elif detected is None:
        res.message = (
            f"features are paired like neither layout (feature j pairs with {partner[:6].tolist()}... "
            f"for j = 0..5); {ctx.layout!r} expects {expected[ctx.layout][:6].tolist()}..."
        )
    return res


def _p_dtype(ctx: _Ctx) -> PropertyResult:
    x, _ = ctx.data(9)
    out = ctx.call(x, ctx.positions(np.arange(_SEQ)))
    msgs = []
    if _dtype_name(out.dtype) != ctx.dname:
        msgs.append(f"returned dtype {out.dtype} for {ctx.dname} input")
    if tuple(out.shape) != tuple(x.shape):
        msgs.append(f"returned shape {tuple(out.shape)} for input shape {tuple(x.shape)}")
    return PropertyResult("dtype", not msgs, float(bool(msgs)), 0.0, 0.0, "; ".join(msgs))


def _p_device(ctx: _Ctx) -> PropertyResult:
    from array_api_compat import device as dev_of

    x, _ = ctx.data(10)
    out = ctx.fn(x, ctx.positions(np.arange(_SEQ)))
    msgs = []
    if type(out) is not type(x):
        msgs.append(
            f"returned a {type(out).__module__}.{type(out).__name__} for a {type(x).__module__}."
            f"{type(x).__name__} input"
        )
    else:
        dx, do = dev_of(x), dev_of(out)
        if str(do) != str(dx):
            msgs.append(f"returned an array on device {do} for input on device {dx}")
    return PropertyResult("device", not msgs, float(bool(msgs)), 0.0, 0.0, "; ".join(msgs))


def _p_no_mutation(ctx: _Ctx) -> PropertyResult:
    pos_h = np.arange(_SEQ) + 5
    x, xh = ctx.data(11)
    pos = ctx.positions(pos_h)
    ctx.fn(x, pos)
    after_x = ctx.host(x)
    after_p = np.asarray(to_numpy(pos))
    msgs = []
    dx = float(np.max(np.abs(after_x - xh)))
    if not np.array_equal(after_x, xh):
        msgs.append(f"modified its input x in place (max change {dx:.3g})")
    if not np.array_equal(after_p, pos_h):
        msgs.append("modified its input pos in place")
    err = dx if msgs and math.isfinite(dx) else float(bool(msgs))
    return PropertyResult("no_mutation", not msgs, err, 0.0, err / ctx.eps, "; ".join(msgs))


#: The runner of property ``name`` is ``_p_<name>``.
_RUNNERS: dict[str, Callable[[_Ctx], PropertyResult]] = {name: globals()[f"_p_{name}"] for name in PROPERTIES}


def _resolve_dtype(xp: Any, dtype: Any) -> Any:
    if not isinstance(dtype, str):
        return dtype
    name = _dtype_name(dtype)
    if name == "bfloat16":
        mod = getattr(xp, "__name__", "")
        if "torch" in mod:
            import torch

            return torch.bfloat16
        if hasattr(xp, "bfloat16"):
            return xp.bfloat16
        raise ValueError(f"namespace {mod} has no bfloat16")
    return getattr(xp, name)


def _default_pos_dtype(xp: Any, device: Any) -> Any:
    try:
        return xp.__array_namespace_info__().default_dtypes(device=device)["integral"]
    except Exception:
        from array_api_compat import array_namespace

        return array_namespace(xp.asarray([0])).__array_namespace_info__().default_dtypes()["integral"]


def check_rope(
    rotate_fn: Callable[[Any, Any], Any],
    *,
    layout: str = "half",
    base: float = 10000.0,
    xp: Any = None,
    head_dim: int = 64,
    dtype: Any = "float32",
    device: Any = None,
    pos_dtype: Any = None,
    ulps: float = 8.0,
    angle_eps: float | None = None,
    properties: list[str] | None = None,
) -> RopeReport:
    """Check a RoPE implementation against every property RoPE must have.

    Parameters
    ----------
    rotate_fn : callable
        ``rotate_fn(x, pos)``: ``x`` of shape ``(batch, heads, seq, head_dim)`` (an
        array of ``xp``), ``pos`` integer positions of shape ``(seq,)`` (array of ``xp``,
        may be negative or up to 2**20); returns ``x`` rotated at ``pos``.
    layout : {"half", "interleaved"}
        The pairing the implementation claims.
    base : float
        The RoPE base it claims (frequencies ``base**(-2i/head_dim)``).
    xp : namespace, optional
        Array namespace the inputs are created in (``numpy``, ``torch``, ``jax.numpy``,
        ...); default NumPy.
    head_dim : int
        Feature dimension to check (even).
    dtype : str or dtype
        Input dtype (``"float32"``, ``"float16"``, ``"bfloat16"``, ``"float64"`` or a dtype object).
    device : optional
        Device to create inputs on (passed as ``device=``).
    pos_dtype : dtype, optional
        Dtype of ``pos`` (default: the namespace's default integer dtype).
    ulps : float
        Tolerance for rotation arithmetic and rounding, in units of ``eps(dtype)``.
    angle_eps : float, optional
        Relative precision allowed for the rotation angles (see the module docs);
        default ``2**-23`` (float32 angles); ``0`` demands exact angles.
    properties : list of str, optional
        Check only these (names in :data:`PROPERTIES`).

    Returns
    -------
    RopeReport
        Truthy iff every property holds; ``str(report)`` is a table of each property's
        worst error and tolerance; ``report.failed`` names the failures, each with a
        message saying why; ``report.to_dict()`` for JSON.

    Examples
    --------
    >>> import numpy as np
    >>> from rotary.testing import check_rope
    >>> def my_rope(x, pos):  # the half layout, angles in float64
    ...     h = x.shape[-1] // 2
    ...     ang = pos[:, None] * 10000.0 ** (-np.arange(h) / h)
    ...     c, s = np.cos(ang).astype(x.dtype), np.sin(ang).astype(x.dtype)
    ...     x1, x2 = x[..., :h], x[..., h:]
    ...     return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)
    >>> report = check_rope(my_rope)
    >>> bool(report)
    True
    >>> report["relative_position"].passed
    True
    """
    if layout not in ("half", "interleaved"):
        raise ValueError(f"layout must be 'half' or 'interleaved', got {layout!r}")
    if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim < 4 or head_dim % 2:
        raise ValueError(f"head_dim must be an even integer >= 4, got {head_dim!r}")
    ulps = check_float(ulps, "ulps", above=0.0)
    angle_eps = 2.0**-23 if angle_eps is None else check_float(angle_eps, "angle_eps", minimum=0.0)
    if not callable(rotate_fn):
        raise TypeError(f"rotate_fn must be callable as rotate_fn(x, pos), got {type(rotate_fn).__name__}")
    names = list(PROPERTIES) if properties is None else list(properties)
    unknown = [n for n in names if n not in PROPERTIES]
    if unknown:
        raise ValueError(f"unknown properties {unknown}; known: {list(PROPERTIES)}")
    if xp is None:
        xp = np
    dt = _resolve_dtype(xp, dtype)
    pdt = _default_pos_dtype(xp, device) if pos_dtype is None else pos_dtype
    ctx = _Ctx(rotate_fn, xp, device, dt, pdt, head_dim, layout, float(base), ulps, angle_eps)
    config = {
        "layout": layout,
        "base": ctx.base,
        "head_dim": head_dim,
        "dtype": ctx.dname,
        "namespace": getattr(xp, "__name__", str(xp)),
        "device": str(device) if device is not None else "default",
        "angle_eps": ctx.angle_eps,
    }
    results = []
    for name in names:
        try:
            results.append(_RUNNERS[name](ctx))
        except Exception as e:  # a _Fail, or the implementation under test raised: a failure
            msg = str(e)
            if not isinstance(e, _Fail):
                where = traceback.extract_tb(e.__traceback__)[-1]
                loc = f"{where.filename.rsplit('/', 1)[-1]}:{where.lineno}"
                msg = f"rotate_fn raised {type(e).__name__}: {e} ({loc})"
            results.append(PropertyResult(name, False, math.inf, ctx.base_tol, math.inf, msg))
    return RopeReport(config, results)
