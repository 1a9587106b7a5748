"""Certify an engine's RoPE against a model's config: ``check_model_rope(adapter, config)``.

:func:`rotary.testing.check_rope` certifies a function ``fn(x, pos)`` at one base and one
layout.  Engines rarely get that wrong; they go wrong in the *mapping* from a model's config to
its RoPE: a scaling read on one code path and dropped on another, an attention factor applied
twice or not at all, a table that clamps positions past its end, bands applied inverted.  Here
``rotary`` reads the config (:func:`rotary.hf.model_rope`: every family and layer type of the
census) and checks an engine's RoPE for it, given through the adapter protocol of
:mod:`rotary.testing.engine`, against float64 truth:

=================  ==============================================================================
``rotation``       q and k rotated as the config says (frequencies, pair layout, partial rotary,
                   M-RoPE position rows), at positions ``0 .. 2**20 + 3`` and past every table
``attention_factor`` cos and sin scaled by the config's attention factor (YaRN ``mscale``, LongRoPE)
``softmax_scale``  the logits' extra factor outside the rotation (MLA: ``mscale(s, mscale_all_dim)**2``)
``query_scale``    queries scaled by the config's position-dependent temperature (Llama 4, Ministral 3)
``positions``      past its table an engine is right or refuses; it may refuse only past the
                   config's context (``max_position_embeddings``); clamped or wrapped is a failure
=================  ==============================================================================

Each layer type of the config and each dtype asked for is checked apart (an engine that cannot
express one is "not supported", not failed).  Tolerances are those of :func:`check_rope`:
``ulps * eps(dtype)`` (8 by default) relative to the data, plus the angle allowance
``2 * 2**-23 * |pos|`` where the engine forms its angles in float32 (its ``angles`` attribute;
none for ``"exact"``), both times the attention factor.  A failure is diagnosed in words: which
frequencies and by what factor, which attention factor, from which position on, and which known
mistake the engine's numbers match (no scaling, the other layout, the bands inverted, ``mscale``
ignored, a clamped table...).

Examples
--------
An adapter of rotary itself (the float32 recipe, as Hugging Face computes it) passes, and one
that ignores YaRN's attention factor is caught:

>>> import numpy as np, rotary
>>> from rotary.testing import check_model_rope
>>> class Rotary:
...     NAME, INSTALL = "rotary", "pip install rotary"
...     def __init__(self, af=None): self.af = af
...     def version(self): return rotary.__version__
...     def build(self, config, *, layer_type, dtype):
...         rope = rotary.hf.from_hf(config, angles="float32", layer_type=layer_type)
...         af = self.af
...         class Engine:
...             angles = "float32"
...             def rotate(self, q, k, pos):
...                 q, k = rope.apply(q, k, pos[:, None])
...                 f = 1.0 if af is None else af / rope.attention_factor
...                 return q * f, k * f
...         return Engine()
>>> cfg = {"hidden_size": 256, "num_attention_heads": 4, "rope_theta": 1e6, "max_position_embeddings": 4096,
...        "rope_scaling": {"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 4096}}
>>> bool(check_model_rope(Rotary(), cfg, dtypes=("float32",)))
True
>>> report = check_model_rope(Rotary(af=1.0), cfg, dtypes=("float32",))
>>> report.failed
['rotation', 'attention_factor']
>>> print(report["attention_factor"].message)  # doctest: +ELLIPSIS
cos and sin are scaled by 1.0000 where the config implies 1.2773 ...
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Literal

import numpy as np

from .. import hf
from .._config import RopeConfig
from .._hfconfig import _as_dict
from .._rope import RoPE
from ..multiaxis import MRoPE
from ..scaling import Default, DynamicNTK, Factors, Frequencies, Llama3, LongRoPE, YaRN
from .asserts import eps
from .engine import Unsupported

__all__ = ["MODEL_CHECKS", "ModelCheck", "ModelRopeReport", "check_model_rope", "load_config", "make_adapter"]

#: The checks, in report order, with what each asserts.
MODEL_CHECKS: dict[str, str] = {
    "rotation": "q and k rotated as the config says, at positions 0 .. 2**20 + 3",
    "attention_factor": "cos and sin scaled by the config's attention factor",
    "softmax_scale": "the logits' extra factor outside the rotation (MLA with YaRN)",
    "query_scale": "queries scaled by the config's position-dependent temperature",
    "positions": "positions past a table are right or refused, never clamped or wrapped",
}

Status = Literal["pass", "fail", "not supported"]


@dataclasses.dataclass
class ModelCheck:
    """One check of one layer type in one dtype.  ``error``: the worst error in units of its
    tolerance (``<= 1`` passes; ``nan`` where no number applies)."""

    check: str
    layer_type: str | None
    dtype: str
    status: Status
    error: float = math.nan
    message: str = ""

    @property
    def passed(self) -> bool:
        return self.status != "fail"

    def to_dict(self) -> dict[str, Any]:
        err = self.error if math.isfinite(self.error) else None
        return {**dataclasses.asdict(self), "error": err}


@dataclasses.dataclass
class ModelRopeReport:
    """Every check of an engine against one config; truthy iff none failed ("not supported" is
    not a failure).  ``str`` gives a readable table, ``to_dict`` the JSON of the field report."""

    engine: str
    version: str
    config: str
    results: list[ModelCheck]

    def __bool__(self) -> bool:
        return all(r.passed for r in self.results)

    @property
    def failed(self) -> list[str]:
        """The checks that failed (each once, in report order)."""
        out: list[str] = []
        for r in self.results:
            if not r.passed and r.check not in out:
                out.append(r.check)
        return out

    @property
    def supported(self) -> bool:
        """Some layer type and dtype was checked (the engine could express the config)."""
        return any(r.status != "not supported" for r in self.results)

    def __getitem__(self, check: str) -> ModelCheck:
        """The worst result of ``check`` (a failure first)."""
        rows = [r for r in self.results if r.check == check]
        if not rows:
            raise KeyError(f"no check {check!r}; checks: {sorted({r.check for r in self.results})}")
        order = {"fail": 0, "pass": 1, "not supported": 2}
        return min(rows, key=lambda r: (order[r.status], -r.error if math.isfinite(r.error) else 0.0))

    def __iter__(self) -> Iterator[ModelCheck]:
        return iter(self.results)

    def to_dict(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "version": self.version,
            "config": self.config,
            "passed": bool(self),
            "supported": self.supported,
            "results": [r.to_dict() for r in self.results],
        }

    def __str__(self) -> str:
        lines = [f"check_model_rope({self.engine} {self.version}, {self.config})"]
        lines.append(f"  {'check':<17} {'layer type':<20} {'dtype':<9} {'status':<14} {'error':>8}")
        for r in self.results:
            e = f"{r.error:8.3g}" if math.isfinite(r.error) else f"{'-':>8}"
            lines.append(f"  {r.check:<17} {r.layer_type or '-':<20} {r.dtype:<9} {r.status:<14} {e}")
            if r.message and r.status != "pass":
                lines.append(f"      -> {r.message}")
        if not self.supported:
            lines.append("  not supported: the engine cannot express this config")
        else:
            lines.append("  all checks hold" if self else f"  FAILED: {', '.join(self.failed)}")
        return "\n".join(lines)


# -- configs and adapters --------------------------------------------------------------------------
def load_config(config: Any) -> tuple[dict[str, Any], str]:
    """``config`` as a dict and a name: a dict, a ``config.json`` path (or its folder), JSON text,
    a case of the field report's matrix (``conformance.engines.cases``), or a ``model_type`` of the
    census (its ``transformers`` config class's defaults; needs ``transformers``)."""
    if isinstance(config, Mapping):
        d = dict(config)
        return d, str(d.get("model_type", "config"))
    if not isinstance(config, str):
        d = _as_dict(config)
        return d, str(d.get("model_type", type(config).__name__))
    text = config.strip()
    if text.startswith("{"):
        d = json.loads(text)
        return d, str(d.get("model_type", "config"))
    import os

    if os.path.exists(text):
        d = _as_dict(text)
        return d, os.path.basename(os.path.normpath(text))
    try:
        from conformance.engines.cases import CASES  # the field report's matrix (shipped beside rotary)

        if text in CASES:
            return dict(CASES[text].config), text
    except ImportError:
        pass
    try:
        from transformers import CONFIG_MAPPING
    except ImportError:
        raise ValueError(
            f"config {config!r} is not a path, JSON or a case of the field report; a model type needs "
            "transformers (pip install transformers)"
        ) from None
    if text not in CONFIG_MAPPING:
        raise ValueError(f"config {config!r}: no such file, case or transformers model type") from None
    cfg = CONFIG_MAPPING[text]()
    return cfg.to_dict(), text


class _FunctionAdapter:
    """A bare ``build(config, *, layer_type, dtype)`` function as an adapter."""

    INSTALL = ""

    def __init__(self, build: Callable[..., Any], name: str) -> None:
        self._build, self.NAME = build, name

    def version(self) -> str:
        mod = importlib.import_module(self._build.__module__.partition(".")[0])
        return str(getattr(mod, "__version__", "unknown"))

    def build(self, config: Mapping[str, Any], *, layer_type: str | None, dtype: str) -> Any:
        return self._build(config, layer_type=layer_type, dtype=dtype)


def make_adapter(target: Any) -> Any:
    """An adapter from a module or object with ``build`` (and ``NAME``, ``version``), a
    ``"module"`` / ``"module:attribute"`` string naming one, or a bare ``build`` function."""
    if isinstance(target, str):
        mod_name, _, attr = target.partition(":")
        obj: Any = importlib.import_module(mod_name)
        for part in filter(None, attr.split(".")):
            obj = getattr(obj, part)
        target = obj
    if hasattr(target, "build"):
        return target
    if callable(target):
        return _FunctionAdapter(target, getattr(target, "__qualname__", "engine"))
    raise TypeError(f"an adapter has a build(config, *, layer_type, dtype) method; got {target!r}")


# -- truth --------------------------------------------------------------------------------------
Rope = RoPE | MRoPE


def _layers(config: Mapping[str, Any]) -> list[tuple[str | None, int, Rope]]:
    """``(layer type, first layer index, RoPE)`` of each distinct RoPE of the config."""
    m = hf.model_rope(config)
    out: list[tuple[str | None, int, Rope]] = []
    if m.layers:
        types = m.layer_types if m.layer_types and len(set(m.layer_types)) > 1 else None
        seen: set[Any] = set()
        for i, r in enumerate(m.layers):
            if r is None:
                continue
            lt = types[i] if types else None
            if (lt, r) in seen:
                continue
            seen.add((lt, r))
            out.append((lt, i, r))
        return out
    try:
        return [(None, 0, hf.mrope_from_hf(config))]
    except ValueError:
        return [(None, 0, hf.from_hf(config))]


def _rope_config(rope: Rope) -> RopeConfig:
    return rope.rope.config if isinstance(rope, MRoPE) else rope.config


def _truth(rope: Rope, x: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """``x`` ``(tokens, heads, d)`` rotated by ``rope`` at ``pos`` (``(tokens,)`` or ``(rows, tokens)``)."""
    p = pos[..., None] if pos.ndim == 2 else pos[:, None]
    return np.asarray(rope.rotate(np.asarray(x, dtype=np.float64), p))


def _context(config: Mapping[str, Any], rope: Rope) -> int:
    """The positions the config claims: ``max_position_embeddings``; with YaRN, at least ``factor``
    times its original context (Qwen2.5's 128K: 4 x 32768 over a config saying 32768); with
    dynamic NTK, ``factor`` times ``max_position_embeddings`` (positions past it are what the
    scaling is for).  Linear scaling says nothing of the kind: Vicuna-16k keeps 4096 there, Gemma 3
    the extended 131072."""
    d = _as_dict(config)
    sub = d.get("text_config")
    text: Mapping[str, Any] = sub if isinstance(sub, Mapping) else d
    n = 0
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        if isinstance(text.get(key), int):
            n = int(text[key])
            break
    sc = _rope_config(rope).scaling
    if isinstance(sc, YaRN):
        return max(n, int(sc.factor * sc.original_max_position_embeddings))
    if isinstance(sc, DynamicNTK):
        return max(n, int(sc.factor * sc.max_position_embeddings))
    return max(n, int(getattr(sc, "original_max_position_embeddings", 0) or 0))


# -- positions and data ---------------------------------------------------------------------------
def _spread(extra: Sequence[int]) -> np.ndarray:
    base = [0, 1, 2, 3, 7, 100, 1000, 4095, 4096, 4097, 8191, 8192, 32767, 32768, 65536, 131071, 131072]
    base += [262143, 262144, 2**20 - 1, 2**20, 2**20 + 3]
    e = [int(p) for q in extra for p in (q - 1, q, q + 1, q + 5) if 0 <= p <= 2**20 + 3]
    return np.unique(np.asarray(base + e, dtype=np.int64))


def _rows(pos: np.ndarray, n_rows: int) -> np.ndarray:
    """M-RoPE position rows: distinct per row (an image's temporal, height and width indices)."""
    if n_rows == 1:
        return pos
    return np.stack([pos // (r + 1) + 7 * r for r in range(n_rows)])


def _data(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """Normal data exactly representable in ``dtype`` (float32 arrays crossing the protocol)."""
    x = rng.standard_normal(shape)
    if dtype == "bfloat16":
        bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
        rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)  # to nearest even
        return rounded.view(np.float32)
    return x.astype(np.float16 if dtype == "float16" else np.float32).astype(np.float32)


# -- the checks ---------------------------------------------------------------------------------
_ANGLE_EPS = {"exact": 0.0, "float64": 2.0**-52, "float32": 2.0**-23}


@dataclasses.dataclass
class _Call:
    pos: np.ndarray  # (tokens,) or (rows, tokens)
    q: np.ndarray
    k: np.ndarray
    out: tuple[np.ndarray, np.ndarray] | None  # None: the engine raised
    error: str = ""


class _Layer:
    """One layer type's RoPE, one dtype, one built engine RoPE: its calls and their errors."""

    def __init__(
        self, rope: Rope, eng: Any, dtype: str, ulps: float, heads: tuple[int, int], softmax: float
    ) -> None:
        self.rope, self.eng, self.dtype = rope, eng, dtype
        self.cfg = _rope_config(rope)
        self.n_rows = len(rope.sections) if isinstance(rope, MRoPE) else 1
        self.af = float(self.cfg.attention_factor)
        # The logits are what matter: an engine may scale cos and sin by the attention factor or
        # fold its square into the softmax scale.  Both outputs times sqrt(engine's softmax scale /
        # the config's) give the logits of the config's convention.
        self.softmax = (float(getattr(eng, "softmax_scale", 1.0)), softmax)
        self.fold = math.sqrt(self.softmax[0] / self.softmax[1])
        self.angle_eps = _ANGLE_EPS.get(str(getattr(eng, "angles", "float32")), 2.0**-23)
        self.ulps, self.heads = ulps, heads
        self.rng = np.random.default_rng(0)

    def call(self, pos: np.ndarray) -> _Call:
        rows = _rows(pos, self.n_rows)
        n = pos.shape[0]
        q = _data(self.rng, (n, self.heads[0], self.cfg.head_dim), self.dtype)
        k = _data(self.rng, (n, self.heads[1], self.cfg.head_dim), self.dtype)
        qc, kc = q.copy(), k.copy()
        try:
            oq, ok = self.eng.rotate(qc, kc, rows.copy())
            out = (np.asarray(oq, dtype=np.float64) * self.fold, np.asarray(ok, dtype=np.float64) * self.fold)
        except Unsupported:
            raise
        except Exception as e:
            return _Call(
                rows, q, k, None, f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
            )
        if not (np.array_equal(qc, q) and np.array_equal(kc, k)):
            return _Call(rows, q, k, None, "the engine changed its inputs in place")
        for o, x in zip(out, (q, k), strict=True):
            if o.shape != x.shape:
                return _Call(rows, q, k, None, f"the engine returned shape {o.shape} for {x.shape}")
        return _Call(rows, q, k, out)

    def tol(self, c: _Call, x: np.ndarray) -> np.ndarray:
        """Per element of ``x``'s rotation: ``ulps * eps`` plus the angle allowance, relative to
        the data's scale, times the attention factor."""
        p = np.abs(c.pos if c.pos.ndim == 1 else c.pos.max(axis=0)).astype(np.float64)
        base = self.ulps * eps(self.dtype) + 2.0 * self.angle_eps * p
        return (max(1.0, self.af) * base)[:, None, None] * np.ones_like(x)

    def errors(self, c: _Call, rope: Rope | None = None, fn: Any = None) -> np.ndarray:
        """Per token: the worst error of q and k in units of tolerance, against ``rope``'s
        rotation (default the config's) or ``fn(x, pos)``."""
        assert c.out is not None
        worst = np.zeros(c.q.shape[0])
        for x, o in zip((c.q, c.k), c.out, strict=True):
            want = fn(x, c.pos) if fn is not None else _truth(rope or self.rope, x, c.pos)
            scale = max(1.0, float(np.abs(x).max()))
            e = np.abs(o - want) / scale / self.tol(c, x)
            worst = np.maximum(worst, np.where(np.isfinite(e), e, np.inf).max(axis=(1, 2)))
        return worst


def check_model_rope(
    adapter: Any,
    config: Any,
    *,
    layer_types: Sequence[str | None] | None = None,
    dtypes: Sequence[str] = ("float32", "bfloat16"),
    positions: Sequence[int] | None = None,
    ulps: float = 8.0,
    heads: tuple[int, int] = (2, 1),
) -> ModelRopeReport:
    """Certify ``adapter``'s RoPE for ``config`` (see the module docstring for the checks).

    Parameters
    ----------
    adapter : adapter, module, ``"module[:attribute]"`` or build function
        The engine, given through :mod:`rotary.testing.engine`'s protocol.
    config : dict or str or path
        A Hugging Face config: a dict, a ``config.json`` path, JSON text, a case of the field
        report (``"yarn"``, ``"llama3"``...) or a ``transformers`` model type (its defaults).
    layer_types : sequence, optional
        Only these layer types (default: every distinct RoPE of the config).
    dtypes : sequence of str
        ``"float32"``, ``"bfloat16"``, ``"float16"`` (each checked apart).
    positions : sequence of int, optional
        Extra positions to check (table boundaries are added: the config's context, its
        scaling's original context, the engine's ``max_position``).
    ulps : float
        Output tolerance in units of ``eps(dtype)``.
    heads : (int, int)
        Query and key/value heads of the data (grouped-query by default).

    Returns
    -------
    ModelRopeReport
        Truthy when no check failed.
    """
    ad = make_adapter(adapter)
    cfg, cname = load_config(config)
    name = str(getattr(ad, "NAME", type(ad).__name__))
    try:
        version = str(ad.version())
    except ImportError:
        raise
    except Exception as e:  # an adapter without a version: the report still runs
        version = f"unknown ({type(e).__name__})"
    model = hf.model_rope(cfg)
    results: list[ModelCheck] = []
    for lt, index, rope in _layers(cfg):
        if layer_types is not None and lt is not None and lt not in layer_types:
            continue  # (a config whose layers share one RoPE has one, whatever the name asked)
        for dtype in dtypes:
            results.extend(_check_layer(ad, cfg, model, lt, index, rope, dtype, positions or (), ulps, heads))
    return ModelRopeReport(name, version, cname, results)


def _check_layer(
    ad: Any,
    cfg: dict[str, Any],
    model: hf.ModelRope,
    lt: str | None,
    index: int,
    rope: Rope,
    dtype: str,
    extra: Sequence[int],
    ulps: float,
    heads: tuple[int, int],
) -> list[ModelCheck]:
    def row(check: str, status: Status, error: float = math.nan, message: str = "") -> ModelCheck:
        return ModelCheck(check, lt, dtype, status, error, message)

    try:
        eng = ad.build(cfg, layer_type=lt, dtype=dtype)
    except Unsupported as e:
        return [row("rotation", "not supported", message=str(e))]
    except Exception as e:
        return [row("rotation", "fail", message=f"building the engine's RoPE raised {_exc(e)}")]
    layer = _Layer(rope, eng, dtype, ulps, heads, float(model.attention.get("softmax_scale_multiplier", 1.0)))
    context = _context(cfg, rope)
    table = getattr(eng, "max_position", None)
    marks = [
        context,
        *(x for x in (table, getattr(layer.cfg.scaling, "original_max_position_embeddings", None)) if x),
    ]
    try:
        calls = [layer.call(np.arange(64)), *_spread_calls(layer, _spread([*marks, *extra]))]
    except Unsupported as e:
        return [row("rotation", "not supported", message=str(e))]
    out = [_rotation(layer, calls, context, row)]
    out.append(_attention_factor(layer, calls, row))
    out.append(_softmax_scale(layer, calls, row))
    out.append(_query_scale(eng, model, index, row))
    out.append(_positions(layer, calls, context, table, row))
    return out


def _spread_calls(layer: _Layer, pos: np.ndarray) -> list[_Call]:
    """One call over every spread position; where the engine refuses it, one call per position
    (so the refused positions are known)."""
    c = layer.call(pos)
    if c.out is not None:
        return [c]
    return [layer.call(pos[i : i + 1]) for i in range(pos.shape[0])]


def _exc(e: BaseException) -> str:
    s = str(e).splitlines()[0][:200] if str(e) else ""
    return f"{type(e).__name__}: {s}" if s else type(e).__name__


def _scalar_pos(c: _Call) -> np.ndarray:
    return c.pos if c.pos.ndim == 1 else c.pos[0]


def _rotation(layer: _Layer, calls: list[_Call], context: int, row: Any) -> ModelCheck:
    ran = [c for c in calls if c.out is not None]
    if not ran:
        return row("rotation", "fail", message=f"the engine raised on every call: {calls[0].error}")
    worst, bad = 0.0, list[int]()
    for c in ran:
        e = layer.errors(c)
        worst = max(worst, float(e.max()))
        bad.extend(int(p) for p in _scalar_pos(c)[e > 1.0])
    if worst <= 1.0:
        return row("rotation", "pass", worst)
    return row("rotation", "fail", worst, _diagnose(layer, ran, sorted(set(bad))))


def _attention_factor(layer: _Layer, calls: list[_Call], row: Any) -> ModelCheck:
    c = calls[0]  # positions 0 .. 63
    if c.out is None:
        return row("attention_factor", "fail", message=f"the engine raised: {c.error}")
    f = _factor(layer, c)
    err = abs(f / layer.af - 1.0) / (layer.ulps * eps(layer.dtype))
    msg = f"{f:.4f} (the config's {layer.af:.4f})"
    if err <= 1.0:
        return row("attention_factor", "pass", err, msg)
    return row("attention_factor", "fail", err, _factor_words(layer, f))


def _factor(layer: _Layer, c: _Call) -> float:
    """The engine's scale of cos and sin: median |rotated pair| / |input pair| over q and k."""
    assert c.out is not None
    cfg = layer.cfg
    ratios = []
    for x, o in zip((c.q, c.k), c.out, strict=True):
        zx, zo = _pairs(x, cfg), _pairs(o, cfg)
        big = np.abs(zx) > 0.5
        ratios.append(np.abs(zo[big]) / np.abs(zx[big]))
    return float(np.median(np.concatenate(ratios)))


def _factor_words(layer: _Layer, f: float) -> str:
    af, sc = layer.af, layer.cfg.scaling
    words = f"cos and sin are scaled by {f:.4f} where the config implies {af:.4f}"
    if layer.fold != 1.0:
        words += f" (the engine's softmax scale {layer.softmax[0]:.6g} folded in)"
    if abs(f - 1.0) < 1e-3 and af != 1.0:
        why = _af_origin(sc, layer.cfg)
        return f"{words} ({why}): the attention factor is missing"
    if abs(f - af * af) < 2e-3 * af * af and af != 1.0:
        return f"{words}: the attention factor is applied twice"
    if isinstance(sc, YaRN) and sc.mscale and sc.mscale_all_dim:
        g = YaRN._mscale(sc.factor)
        if abs(f - g) < 1e-3:
            return (
                f"{words}: 0.1 ln({sc.factor:g}) + 1 = {g:.4f}, i.e. mscale={sc.mscale:g} / "
                f"mscale_all_dim={sc.mscale_all_dim:g} ignored"
            )
    return words


def _af_origin(sc: Any, cfg: RopeConfig) -> str:
    if isinstance(sc, YaRN):
        if sc.attention_factor_ is not None:
            return f"YaRN attention_factor={sc.attention_factor_:g}"
        if sc.mscale and sc.mscale_all_dim:
            return f"YaRN mscale({sc.factor:g}, {sc.mscale:g}) / mscale({sc.factor:g}, {sc.mscale_all_dim:g})"
        return f"YaRN 0.1 ln({sc.factor:g}) + 1"
    if isinstance(sc, LongRoPE):
        return "LongRoPE sqrt(1 + ln(s) / ln(L0))"
    return f"{type(sc).__name__}'s attention factor"


def _softmax_scale(layer: _Layer, calls: list[_Call], row: Any) -> ModelCheck:
    got, want = layer.softmax
    err = abs(got / want - 1.0) / 1e-5
    msg = f"{got:.6g} (the config's {want:.6g})"
    if err <= 1.0:
        return row("softmax_scale", "pass", err, msg)
    f = _factor(layer, calls[0]) if calls[0].out is not None else math.nan
    if abs(f / layer.af - 1.0) <= layer.ulps * eps(layer.dtype):  # folded: the logits are right
        raw = f / layer.fold
        return row(
            "softmax_scale",
            "pass",
            0.0,
            f"{got:.6g}: the engine folds the attention factor into its softmax scale "
            f"({want:.6g} x {layer.af:.4f}**2 / {raw:.4f}**2; the logits are the config's)",
        )
    extra = ""
    if abs(got - 1.0) < 1e-9:
        extra = ": the engine applies none (MLA with YaRN multiplies the softmax scale by mscale**2)"
    return row(
        "softmax_scale",
        "fail",
        err,
        f"the logits are scaled by {got:.6g} where the config implies {want:.6g}{extra}",
    )


def _query_scale(eng: Any, model: hf.ModelRope, index: int, row: Any) -> ModelCheck:
    pos = np.array([0, 1, 4095, 4096, 8192, 16383, 16384, 65536, 262143, 2**20], dtype=np.int64)
    want = model.query_scale(index, pos) if model.layers else None
    fn = getattr(eng, "query_scale", None)
    got = None if fn is None else fn(pos.copy())
    if want is None and got is None:
        return row("query_scale", "pass", 0.0, "none")
    w = np.ones(pos.shape) if want is None else np.asarray(want, dtype=np.float64)
    g = np.ones(pos.shape) if got is None else np.asarray(got, dtype=np.float64).reshape(-1)
    err = float(np.max(np.abs(g - w) / w)) / (8 * 2.0**-23)
    if err <= 1.0:
        return row("query_scale", "pass", err, "none" if want is None else "")
    k = int(np.argmax(np.abs(g - w)))
    j = int(np.argmax(np.abs(g - w) / w > 8 * 2.0**-23))  # the first position where they differ
    if got is None:
        beta = model.attention.get("llama_4_scaling_beta", model.attention.get("attn_scale"))
        return row(
            "query_scale",
            "fail",
            err,
            f"the engine scales no query; the config implies {w[j]:.4f} at position {pos[j]} "
            f"(from there on; {w[k]:.4f} at {pos[k]}): beta {beta}, 1 + beta log(1 + floor(pos / L))",
        )
    first = int(pos[np.argmax(np.abs(g - w) / w > 8 * 2.0**-23)])
    return row(
        "query_scale",
        "fail",
        err,
        f"queries scaled by {g[k]:.4f} at position {pos[k]} where the config implies {w[k]:.4f} "
        f"(wrong from position {first} on)",
    )


def _positions(layer: _Layer, calls: list[_Call], context: int, table: Any, row: Any) -> ModelCheck:
    refused = sorted(int(p) for c in calls if c.out is None for p in np.atleast_1d(_scalar_pos(c)))
    if not refused:
        top = max(int(_scalar_pos(c).max()) for c in calls)
        return row("positions", "pass", 0.0, f"every position computed, up to {top}")
    first = refused[0]
    err = next(c.error for c in calls if c.out is None)
    if first < context:
        return row(
            "positions",
            "fail",
            math.inf,
            f"the engine refuses position {first} ({err}) although the config's context is {context}",
        )
    return row(
        "positions",
        "pass",
        0.0,
        f"refuses positions from {first} on (past the config's context {context}): {err}",
    )


# -- diagnosis ----------------------------------------------------------------------------------
def _pairs(x: np.ndarray, cfg: RopeConfig) -> np.ndarray:
    """The rotated pairs of ``x`` ``(..., d)`` as complex numbers ``(..., width/2)``."""
    w, h = cfg.width, cfg.width // 2
    if cfg.layout == "half":
        return x[..., :h] + 1j * x[..., h:w]
    return x[..., 0:w:2] + 1j * x[..., 1:w:2]


def _with(cfg: RopeConfig, rope: Rope, **changes: Any) -> Rope:
    c = dataclasses.replace(cfg, **changes)
    if isinstance(rope, MRoPE):
        return MRoPE(
            c.head_dim,
            rope.sections,
            interleaved=rope.interleaved,
            rows=rope._rows if rope._custom_rows else None,
            base=c.base,
            layout=c.layout,
            rotary_dim=c.rotary_dim,
            scaling=c.scaling,
            angles="exact",
        )
    return RoPE.from_config(c)


def _suspects(
    layer: _Layer, context: int
) -> list[tuple[str, Callable[[np.ndarray, np.ndarray], np.ndarray]]]:
    """Known mistakes, each as the rotation it would give: ``(words, fn(x, pos))``."""
    rope, cfg, af = layer.rope, layer.cfg, layer.af
    sc = cfg.scaling
    out: list[tuple[str, Callable[[np.ndarray, np.ndarray], np.ndarray]]] = []

    def rot(r: Rope, factor: float = 1.0) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
        return lambda x, p: _truth(r, x, p) * factor

    other = "interleaved" if cfg.layout == "half" else "half"
    out.append(
        (f"the {other!r} pair layout (the config's is {cfg.layout!r})", rot(_with(cfg, rope, layout=other)))
    )
    if not isinstance(sc, Default):
        plain = _with(cfg, rope, scaling=None)
        out.append(
            (f"no scaling: plain RoPE at base {cfg.base:g} ({type(sc).__name__} not applied)", rot(plain))
        )
        if af != 1.0:
            out.append((f"plain RoPE, but with the attention factor {af:.4f}", rot(plain, af)))
            out.append(("the scaled frequencies without the attention factor", rot(rope, 1.0 / af)))
    if cfg.base != 10000.0:
        out.append(
            (
                f"base 10000 (the config's rope_theta {cfg.base:g} not read)",
                rot(_with(cfg, rope, base=10000.0), 1.0),
            )
        )
    factor = getattr(sc, "factor", None)
    if isinstance(sc, (YaRN, Llama3)) and factor:
        w = sc.inv_freq(cfg.freq_dim, cfg.base)
        w0 = Default().inv_freq(cfg.freq_dim, cfg.base)
        inv = w0 * (1.0 + 1.0 / factor - w / w0)
        name = "YaRN ramp" if isinstance(sc, YaRN) else "Llama 3 bands"
        out.append(
            (
                f"the {name} inverted (high frequencies divided by {factor:g}, low ones kept)",
                rot(_with(cfg, rope, scaling=Frequencies(tuple(float(f) for f in inv))), af),
            )
        )
    if isinstance(sc, Llama3) and sc.factor != 8.0:
        l8 = dataclasses.replace(sc, factor=8.0)
        out.append(
            (
                f"Llama 3 with factor 8 (hard-coded; the config's is {sc.factor:g})",
                rot(_with(cfg, rope, scaling=l8)),
            )
        )
    if isinstance(sc, YaRN):
        flip = dataclasses.replace(sc, truncate=not sc.truncate)
        out.append(
            (
                f"YaRN with truncate={not sc.truncate} (the config's is {sc.truncate})",
                rot(_with(cfg, rope, scaling=flip)),
            )
        )
        if sc.mscale and sc.mscale_all_dim:
            g = YaRN._mscale(sc.factor)
            out.append(
                (
                    f"YaRN's attention factor 0.1 ln({sc.factor:g}) + 1 = {g:.4f}: "
                    "mscale and mscale_all_dim ignored",
                    rot(rope, g / af),
                )
            )
    if isinstance(sc, LongRoPE):
        for label, fac in (("long", sc.long_factor), ("short", sc.short_factor)):
            r = _with(cfg, rope, scaling=Factors(fac))
            out.append((f"LongRoPE's {label} factors at every length", rot(r, af)))
    if isinstance(rope, MRoPE):
        alt = None
        if not rope._custom_rows:
            try:
                alt = MRoPE(
                    cfg.head_dim,
                    rope.sections,
                    interleaved=not rope.interleaved,
                    base=cfg.base,
                    layout=cfg.layout,
                    rotary_dim=cfg.rotary_dim,
                    scaling=cfg.scaling,
                )
            except ValueError:  # (sections that cannot be laid out round robin)
                alt = None
        if alt is not None:
            kind = "consecutive" if rope.interleaved else "interleaved (Qwen3-VL)"
            out.append((f"M-RoPE sections laid out {kind}", rot(alt)))
        out.append(
            (
                "M-RoPE with the temporal row for every frequency (text positions only)",
                lambda x, p: _truth(rope, x, np.broadcast_to(p[:1], p.shape).copy()),
            )
        )
    out.append(("rotation by -pos (the transposed rotation)", lambda x, p: _truth(rope, x, -p)))
    return out


def _diagnose(layer: _Layer, calls: list[_Call], bad: list[int]) -> str:
    words: list[str] = []
    cfg = layer.cfg
    first = bad[0] if bad else None
    # a known mistake that explains every call
    for label, fn in _suspects(layer, 0):
        if all(float(layer.errors(c, fn=fn).max()) <= 1.0 for c in calls):
            words.append(f"the engine's numbers match {label}")
            break
    else:
        clamp = _clamped(layer, calls, first)
        if clamp:
            words.append(clamp)
    # partial rotary: the features that should pass through
    d, w = cfg.head_dim, cfg.width
    if w < d:
        moved = max(float(np.abs(c.out[0][..., w:] - c.q[..., w:]).max()) for c in calls if c.out is not None)
        if moved > layer.ulps * eps(layer.dtype) * 4:
            words.append(
                f"features {w}..{d - 1} should pass through unchanged ({w} of {d} rotate) "
                f"but change by up to {moved:.3g}"
            )
    # (a failure from some position on: the frequencies are read below it)
    freq = _frequency_words(layer, calls, below=first if first is not None and first > 64 else math.inf)
    if freq:
        words.append(freq)
    f = _factor(layer, calls[0]) if calls[0].pos.shape[-1] == 64 else layer.af
    if abs(f / layer.af - 1.0) > layer.ulps * eps(layer.dtype):
        words.append(_factor_words(layer, f))
    if first is not None:
        words.append(f"wrong from position {first} on")
    return "; ".join(words) if words else "wrong values (no known mistake matches)"


def _clamped(layer: _Layer, calls: list[_Call], first: int | None) -> str:
    """Positions past a table read its last row (clamped) or wrap around it."""
    if first is None or first <= 0:
        return ""
    marks = {first - 1, first}
    table = getattr(layer.eng, "max_position", None)
    if table:
        marks |= {int(table) - 1, int(table)}
    for cap in sorted(m for m in marks if m > 0):

        def clamp(x: np.ndarray, p: np.ndarray, cap: int = cap) -> np.ndarray:
            return _truth(layer.rope, x, np.minimum(p, cap - 1))

        def wrap(x: np.ndarray, p: np.ndarray, cap: int = cap) -> np.ndarray:
            return _truth(layer.rope, x, p % cap)

        at = f"from position {cap} on the engine rotates by the angle of position"
        if all(float(layer.errors(c, fn=clamp).max()) <= 1.0 for c in calls):
            return f"{at} {cap - 1}: positions clamped to a table of {cap} rows"
        if all(float(layer.errors(c, fn=wrap).max()) <= 1.0 for c in calls):
            return f"{at} p mod {cap}: positions wrap around a table of {cap} rows"
    return ""


def _frequency_words(layer: _Layer, calls: list[_Call], below: float = math.inf) -> str:
    """Which frequencies the engine turns at, against the config's.  Per pair, its angle (the
    median over q's heads) at increasing positions, unwrapped by the running estimate: the first
    angle above 0.05 rad (reached in steps of at most 10x, so not yet wrapped) starts it, each
    later one refines it while the estimate predicts the phase to within pi."""
    cfg = layer.cfg
    if isinstance(layer.rope, MRoPE):
        return ""
    true = cfg.host_inv_freq() * 1.0
    seen: dict[int, np.ndarray] = {}  # position -> the engine's angle of every pair there
    for c in calls:
        if c.out is None or c.pos.ndim != 1:
            continue
        zx, zo = _pairs(c.q, cfg), _pairs(c.out[0], cfg)
        ang = np.median(np.angle(zo / zx), axis=1)  # (tokens, pairs)
        for t, p in enumerate(c.pos):
            if 0 < p < below:
                seen.setdefault(int(p), ang[t])
    ratio = np.full(true.shape, np.nan)
    for i, wi in enumerate(true):
        if wi == 0:
            continue
        est = None
        for p in sorted(seen):
            a = float(seen[p][i])
            if est is None:
                if abs(a) > 0.05:
                    est = a / p
                continue
            if abs(est) * p > 1e6:  # (the recipe's error takes over)
                break
            pred = est * p
            est = (a + 2 * math.pi * round((pred - a) / (2 * math.pi))) / p
        if est is not None:
            ratio[i] = est / wi
    good = np.isfinite(ratio)
    # (an angle near 2 at position p carries the engine's recipe error, up to 2 angle_eps p: relative
    # to the angle, 2 angle_eps / w, large for the slowest frequencies in float32)
    slack = 1e-3 + 16 * eps(layer.dtype) + 4.0 * layer.angle_eps / np.maximum(np.abs(true), 1e-300)
    off = good & (np.abs(ratio - 1.0) > slack)
    if not off.any():
        return ""
    groups: list[tuple[int, int, float]] = []
    for i in (int(j) for j in np.nonzero(off)[0]):
        r = float(ratio[i])
        if groups and groups[-1][1] == i - 1 and abs(groups[-1][2] - r) <= 0.02 * abs(r):
            a, _, r0 = groups[-1]
            groups[-1] = (a, int(i), r0)
        else:
            groups.append((int(i), int(i), r))
    parts = [f"{a}..{b} x{_ratio(r)}" if a != b else f"{a} x{_ratio(r)}" for a, b, r in groups[:6]]
    more = f" (+{len(groups) - 6} more groups)" if len(groups) > 6 else ""
    return f"frequencies (pair index, x the config's) {', '.join(parts)}{more}"


def _ratio(r: float) -> str:
    """``1/8`` for an inverse integer factor, else three digits."""
    if 0 < abs(r) < 0.75 and abs(1 / r - round(1 / r)) < 0.01 * abs(1 / r):
        return f"1/{round(1 / r)}"
    return f"{r:.3g}"
