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
``packed``         (asked for by name: the field report's ``thd`` case) documents packed in one row
                   (``cu_seqlens``), each rotated at positions restarting at 0
``packed_offsets`` (asked for by name) the packed documents each continuing from its own offset,
                   as a ragged decoding batch holds them
=================  ==============================================================================

The packed checks call the engine's ``rotate_packed(q, k, cu_seqlens, offsets)`` (the optional
hook of :class:`rotary.testing.engine.EngineRope`) on one row of documents of
:data:`PACKED_LENGTHS` tokens, at offsets 0 and then :data:`PACKED_OFFSETS`.  The truth is
rotary's packed rotation: positions from :func:`rotary.positions.from_cu_seqlens` (plus each
document's offset), rotated in float64 with the rotation check's tolerance.  An engine that gets a
document wrong is told which document and from which of its tokens, and at which positions it
rotated them (the row's token index: positions that do not restart; its offset ignored; another
document's offset...).  An engine whose RoPE takes no packed input (no ``rotate_packed``, or one
raising :class:`rotary.testing.engine.Unsupported`) is "not applicable", with the reason.

Each layer type of the config and each dtype asked for is checked apart (an engine that cannot
express one is "not supported", not failed), on data exactly representable in that dtype.
Tolerances are those of :func:`check_rope`: ``ulps * eps(dtype)`` (8 by default) relative to the
data, plus the allowance of the angle kind the engine declares (its ``angles`` attribute:
:func:`rotary.testing.engine.angle_error`; ``2 * 2**-23 * |pos|`` for ``"float32"``), both times the
attention factor.

One mistake fails one check.  The attention factor is measured from norms (a rotation keeps the
norm of the features it turns, whatever their pairing), and the rotation is checked with the
engine's factor brought to the config's; a factor folded into the softmax scale passes both.  A
failure is diagnosed in words, each of them verified against the engine's own numbers:

* how the engine pairs the features, where that is not the config's layout, width or slice
  (each feature rotated alone), q and k judged apart: then nothing is said of frequencies,
  which a wrong pairing makes meaningless;
* where the engine is right within a looser angle kind than it declares, which to declare;
* the positions it rotates at, where its frequencies are the config's: every position off by
  ``delta`` (solved from its angles at position 0), a table indexed by the token's index, the
  positions rounded to float16 or bfloat16, the rotation by ``-pos`` (sin's sign);
* which known mistake of the frequencies the numbers match within tolerance (no scaling, the
  bands inverted, the wrong original context, a clamped or wrapping table...), or another base
  (solved from the engine's frequencies, printed in as few digits as still match);
* per pair, the factor on the config's frequency, from one call at positions rising by 1.25x to
  ``2**20`` on data exact in the dtype: every frequency that agrees with the engine's angle at
  every position (within the dtype's rounding and the angle allowance) forms an interval; a factor
  is printed only where that interval excludes 1 and is narrower than 4%, in as few digits as
  keep it inside; consecutive pairs share one factor only where their intervals overlap; where
  the dtype leaves it wider the message says the dtype cannot resolve it; where none agrees,
  that the pair turns at no single frequency;
* the attention factor of q and of k, and where it matches a known mistake (missing, applied
  twice, on one of them only, ``mscale`` ignored);
* from which position on the engine is wrong (the first wrong position: every position after
  the last right sampled one checked, then bisected, and every one below it, up to ``2**18``;
  where not every position below it was checked, said so), and from which its outputs are NaN
  (the ``positions`` check fails there: NaN is neither a position computed nor a refusal);
* a refusal that depends on the call's token count (a table sized by it);
* for a scaling chosen per call (LongRoPE, dynamic NTK), calls of ``n`` and ``n + 1`` tokens
  where it switches, and a mistake seen only there said so.

An exception raised in the adapter's own code is an "adapter error" (no verdict on the engine:
:func:`rotary.testing.engine.raised_by_adapter`).

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
>>> report.failed  # (the rotation holds: only the factor is wrong)
['attention_factor']
>>> print(report["attention_factor"].message)  # doctest: +ELLIPSIS
cos and sin are scaled by 1.0000 where the config implies 1.2773 ...
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import itertools
import json
import math
import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Literal

import numpy as np

from .. import hf
from .._config import RopeConfig
from .._hfconfig import _as_dict
from .._rope import RoPE
from ..multiaxis import MRoPE, _round_robin
from ..scaling import Default, DynamicNTK, Factors, Frequencies, Llama3, LongRoPE, YaRN
from .asserts import eps
from .engine import (
    ANGLE_KINDS,
    EngineError,
    Unsupported,
    adapter_files,
    adapter_site,
    angle_error,
    raised_by_adapter,
    round_to,
)

__all__ = [
    "CONFIG_CHECKS",
    "MODEL_CHECKS",
    "PACKED_CHECKS",
    "PACKED_LENGTHS",
    "PACKED_OFFSETS",
    "ModelCheck",
    "ModelRopeReport",
    "check_model_rope",
    "import_target",
    "load_config",
    "make_adapter",
]

#: The checks, in report order, with what each asserts.
MODEL_CHECKS: dict[str, str] = {
    "rotation": "q and k rotated as the config says, at positions 0 .. 2**20 + 3",
    "attention_factor": "cos and sin scaled by the config's attention factor",
    "softmax_scale": "the logits' extra factor outside the rotation (MLA with YaRN)",
    "query_scale": "queries scaled by the config's position-dependent temperature",
    "positions": "positions past a table are right or refused, never clamped or wrapped",
    "packed": "documents packed in one row (cu_seqlens), each rotated at positions restarting at 0",
    "packed_offsets": "packed documents each continuing from its own offset (a ragged decoding batch)",
}
#: The checks of a config, run by default.
CONFIG_CHECKS = ("rotation", "attention_factor", "softmax_scale", "query_scale", "positions")
#: The checks of packed input (``rotate_packed``), run when asked for (the ``thd`` case).
PACKED_CHECKS = ("packed", "packed_offsets")
#: The packed row: documents of these lengths, 32 tokens (one of a single token).
PACKED_LENGTHS = (7, 1, 12, 4, 8)
#: Where each document continues in ``packed_offsets`` (each capped so that the document ends
#: within the config's context).
PACKED_OFFSETS = (9, 2047, 0, 31, 4000)

Status = Literal["pass", "fail", "not supported", "not applicable", "adapter error"]


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
        """It holds, or the engine cannot express it, or it does not apply to the engine (an
        adapter error is no pass)."""
        return self.status in ("pass", "not supported", "not applicable")

    def to_dict(self) -> dict[str, Any]:
        """The JSON of the field report (the error to three digits: what reproduces across
        machines)."""
        err = float(f"{self.error:.3g}") if math.isfinite(self.error) else None
        return {**dataclasses.asdict(self), "error": err}


@dataclasses.dataclass
class ModelRopeReport:
    """Every check of an engine against one config; truthy iff none failed and the adapter raised
    no error of its own ("not supported" is not a failure; an adapter error is no verdict on the
    engine, and no pass either).  ``str`` gives a readable table, ``to_dict`` the JSON of the field
    report."""

    engine: str
    version: str
    config: str
    results: list[ModelCheck]

    def __bool__(self) -> bool:
        return all(r.passed for r in self.results)

    @property
    def failed(self) -> list[str]:
        """The checks the engine failed (each once, in report order)."""
        return list(dict.fromkeys(r.check for r in self.results if r.status == "fail"))

    @property
    def adapter_errors(self) -> list[str]:
        """The checks the adapter's own code raised in (each once, in report order)."""
        return list(dict.fromkeys(r.check for r in self.results if r.status == "adapter error"))

    @property
    def supported(self) -> bool:
        """Some layer type and dtype was checked (the engine could express the config, and the
        checks asked for apply to it)."""
        return any(r.status not in ("not supported", "not applicable") for r in self.results)

    def __getitem__(self, check: str) -> ModelCheck:
        """The worst result of ``check`` (a failure first)."""
        rows = [r for r in self.results if r.check == check]
        if not rows:
            raise KeyError(f"no check {check!r}; checks: {sorted({r.check for r in self.results})}")
        order = {"fail": 0, "adapter error": 1, "pass": 2, "not supported": 3, "not applicable": 4}
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
            if r.message:  # (a passing check's words too: "refuses positions from 4096 on")
                lines.append(f"      -> {r.message}")
        if not self.supported and all(r.status == "not applicable" for r in self.results):
            lines.append("  not applicable: the engine takes no such input")
        elif not self.supported:
            lines.append("  not supported: the engine cannot express this config")
        elif self:
            lines.append("  all checks hold")
        else:
            if self.failed:
                lines.append(f"  FAILED: {', '.join(self.failed)}")
            if self.adapter_errors:
                lines.append(f"  ADAPTER ERROR (fix the adapter): {', '.join(self.adapter_errors)}")
        return "\n".join(lines)


# -- configs and adapters --------------------------------------------------------------------------
def load_config(config: Any) -> tuple[dict[str, Any], str]:
    """``config`` as a dict and a name: a dict, a ``config.json`` path (or its folder), JSON text,
    a case of the field report's matrix (:mod:`rotary.testing.cases`), or a ``model_type`` of the
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
    from .cases import CASES

    if text in CASES:
        return dict(CASES[text].config), text
    # (optional, imported by name: rotary type-checks with its core dependencies alone)
    try:
        CONFIG_MAPPING = importlib.import_module("transformers").CONFIG_MAPPING
    except ImportError:
        raise ValueError(
            f"config {config!r} is not a path, JSON or a case of the field report; a model type needs "
            "transformers (pip install transformers)"
        ) from None
    if text not in CONFIG_MAPPING:
        raise ValueError(f"config {config!r}: no such file, case or transformers model type") from None
    cfg = CONFIG_MAPPING[text]()
    return cfg.to_dict(), text


def _case_checks(config: Any) -> tuple[str, ...] | None:
    """The checks of a case of the field report named by ``config`` (``None``: the default)."""
    if not isinstance(config, str):
        return None
    from .cases import CASES

    case = CASES.get(config.strip())
    return None if case is None else case.checks


class _FunctionAdapter:
    """A bare ``build(config, *, layer_type, dtype)`` function as an adapter."""

    INSTALL = ""

    def __init__(self, build: Callable[..., Any], name: str) -> None:
        self._build, self.NAME = build, name

    def version(self) -> str:
        # (the function's own package where it is one; a function defined in a script, a
        # notebook or exec'd code has none to import: its version is unknown, not "not installed")
        top = str(getattr(self._build, "__module__", None) or "").partition(".")[0]
        mod = sys.modules.get(top)
        if mod is None:
            try:
                mod = importlib.import_module(top)
            except ImportError:
                return "unknown"
        return str(getattr(mod, "__version__", "unknown"))

    def build(self, config: Mapping[str, Any], *, layer_type: str | None, dtype: str) -> Any:
        return self._build(config, layer_type=layer_type, dtype=dtype)


def import_target(spec: str) -> tuple[Any, str]:
    """``(module, attribute)`` named by ``"module[:attribute]"`` or ``"path/to/file.py[:attribute]"``:
    a file is imported as a module named after it, its folder put first on ``sys.path`` (so it
    imports as a script run from there would, its neighbours too: no ``PYTHONPATH`` needed)."""
    head, sep, attr = spec.rpartition(":") if ".py:" in spec else spec.partition(":")
    if not sep:
        head, attr = spec, ""
    if head.endswith(".py") or "/" in head or os.sep in head:
        path = os.path.abspath(os.path.expanduser(head))
        if not os.path.isfile(path):
            raise ImportError(f"no such file: {head}")
        folder = os.path.dirname(path)
        if folder not in sys.path:
            sys.path.insert(0, folder)
        head = os.path.splitext(os.path.basename(path))[0]
    return importlib.import_module(head), attr


def make_adapter(target: Any) -> Any:
    """An adapter from a module or object with ``build`` (and ``NAME``, ``version``), a
    ``"module"`` / ``"module:attribute"`` string naming one (or a ``"path/to/adapter.py"`` file,
    :func:`import_target`), or a bare ``build`` function."""
    if isinstance(target, str):
        obj, attr = import_target(target)
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
    n = _max_positions(config)
    sc = _rope_config(rope).scaling
    if isinstance(sc, YaRN):
        return max(n, int(sc.factor * sc.original_max_position_embeddings))
    if isinstance(sc, DynamicNTK):
        return max(n, int(sc.factor * sc.max_position_embeddings))
    return max(n, int(getattr(sc, "original_max_position_embeddings", 0) or 0))


def _max_positions(config: Mapping[str, Any]) -> int:
    """The config's ``max_position_embeddings`` (or its older names; 0 if none)."""
    d = _as_dict(config)
    sub = d.get("text_config")
    text: Mapping[str, Any] = sub if isinstance(sub, Mapping) else d
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        if isinstance(text.get(key), int):
            return int(text[key])
    return 0


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
    return round_to(rng.standard_normal(shape), dtype)


# -- the checks ---------------------------------------------------------------------------------
@dataclasses.dataclass
class _Call:
    pos: np.ndarray  # (tokens,) or (rows, tokens)
    q: np.ndarray
    k: np.ndarray
    out: tuple[np.ndarray, np.ndarray] | None  # the engine's (float64); None: the engine raised
    error: str = ""
    adapter: bool = False  # the exception was raised in the adapter's own code
    switch: bool = False  # a call on either side of where a scaling chosen per call switches


class _Layer:
    """One layer type's RoPE, one dtype, one built engine RoPE: its calls and their errors."""

    def __init__(
        self,
        rope: Rope,
        eng: Any,
        dtype: str,
        ulps: float,
        heads: tuple[int, int],
        softmax: float,
        code: frozenset[str],
    ) -> None:
        self.rope, self.eng, self.dtype, self.code = rope, eng, dtype, code
        self.cfg = _rope_config(rope)
        self.n_rows = len(rope.sections) if isinstance(rope, MRoPE) else 1
        self.af = float(self.cfg.attention_factor)
        # The logits are what matter: an engine may scale cos and sin by the attention factor or
        # fold its square into the softmax scale (the engine's softmax scale over the config's).
        self.softmax = (float(getattr(eng, "softmax_scale", 1.0)), softmax)
        self.fold = math.sqrt(self.softmax[0] / self.softmax[1])
        kind = str(getattr(eng, "angles", "float32"))
        self.angle_rel, self.angle_coef = angle_error(kind, self.cfg.host_inv_freq(), dtype)
        self.ulps, self.heads = ulps, heads
        self.rng = np.random.default_rng(0)
        self.scan_rng = np.random.default_rng(1)  # (the scans below the last right sampled position)
        # The rotation check is blind to the engine's factor (its own check measures it): the
        # features the engine scales are brought to the config's factor, per tensor.
        self.norm: tuple[tuple[float, np.ndarray], ...] = ()
        self.max_positions = 0  # (the config's max_position_embeddings)
        self.nonfinite: dict[tuple[int, ...], list[str]] = {}  # (_nonfinite_words, per wrong positions)

    def run(self, pos: np.ndarray, q: np.ndarray, k: np.ndarray) -> _Call:
        rows = _rows(pos, self.n_rows)
        return self._guarded(rows, q, k, lambda qc, kc: self.eng.rotate(qc, kc, rows.copy()))

    def run_packed(
        self, pos: np.ndarray, q: np.ndarray, k: np.ndarray, cu_seqlens: np.ndarray, offsets: np.ndarray
    ) -> _Call:
        """The engine's ``rotate_packed`` on one packed row; ``pos``: the positions it implies."""
        fn = self.eng.rotate_packed
        return self._guarded(pos, q, k, lambda qc, kc: fn(qc, kc, cu_seqlens.copy(), offsets.copy()))

    def _guarded(self, pos: np.ndarray, q: np.ndarray, k: np.ndarray, fn: Any) -> _Call:
        qc, kc = q.copy(), k.copy()
        try:
            oq, ok = fn(qc, kc)
            out = (np.asarray(oq, dtype=np.float64), np.asarray(ok, dtype=np.float64))
        except Unsupported:
            raise
        except Exception as e:
            mine = raised_by_adapter(e, self.code)
            return _Call(pos, q, k, None, _exc(e) + (adapter_site(e, self.code) if mine else ""), mine)
        if not (np.array_equal(qc, q) and np.array_equal(kc, k)):
            return _Call(pos, q, k, None, "the engine changed its inputs in place")
        for o, x in zip(out, (q, k), strict=True):
            if o.shape != x.shape:
                return _Call(pos, q, k, None, f"the engine returned shape {o.shape} for {x.shape}")
        return _Call(pos, q, k, out)

    def call(self, pos: np.ndarray, rng: np.random.Generator | None = None) -> _Call:
        """The engine at ``pos`` on normal data exactly representable in the dtype (drawn from
        ``rng``, default the layer's own)."""
        n = pos.shape[0]
        rng = self.rng if rng is None else rng
        q = _data(rng, (n, self.heads[0], self.cfg.head_dim), self.dtype)
        k = _data(rng, (n, self.heads[1], self.cfg.head_dim), self.dtype)
        return self.run(pos, q, k)

    def normalized(self, c: _Call) -> tuple[np.ndarray, ...]:
        """The engine's outputs with its factor replaced by the config's (see ``norm``)."""
        assert c.out is not None
        if not self.norm:
            return c.out
        return tuple(np.where(m, o * s, o) for o, (s, m) in zip(c.out, self.norm, strict=True))

    def tol(self, c: _Call, x: np.ndarray) -> np.ndarray:
        """Per element of ``x``'s rotation: ``ulps * eps`` plus the angle allowance, relative to
        the data's scale, times the attention factor."""
        p = np.abs(c.pos if c.pos.ndim == 1 else c.pos.max(axis=0)).astype(np.float64)
        p = np.nan_to_num(p, nan=0.0, posinf=0.0)
        base = self.ulps * eps(self.dtype) + self.angle_coef * p
        return (max(1.0, self.af) * base)[:, None, None] * np.ones_like(x)

    def errors(
        self,
        c: _Call,
        rope: Rope | None = None,
        fn: Any = None,
        tensors: tuple[int, ...] = (0, 1),
        at: Callable[[np.ndarray], np.ndarray] | None = None,
    ) -> np.ndarray:
        """Per token: the worst error of q and k (or of ``tensors``: 0 q, 1 k; the engine's factor
        brought to the config's) in units of tolerance, against ``rope``'s rotation (default the
        config's) or ``fn(x, pos)``; the angle allowance at positions ``at(pos)`` where given (a
        suspect that rotates at other positions)."""
        worst = np.zeros(c.q.shape[0])
        tc = c if at is None else _Call(at(c.pos), c.q, c.k, None)
        for t, (x, o) in enumerate(zip((c.q, c.k), self.normalized(c), strict=True)):
            if t not in tensors:
                continue
            want = fn(x, c.pos) if fn is not None else _truth(rope or self.rope, x, c.pos)
            scale = max(1.0, float(np.abs(x).max()))
            with np.errstate(invalid="ignore"):
                e = np.abs(o - want) / scale / self.tol(tc, x)
            e = np.where(np.isfinite(e), e, np.inf)
            # (where the rotation compared with is not finite either, they agree: a suspect
            # whose positions overflow gives NaN where the engine does)
            e = np.where(~np.isfinite(want) & ~np.isfinite(o), 0.0, e)
            worst = np.maximum(worst, e.max(axis=(1, 2)))
        return worst


def check_model_rope(
    adapter: Any,
    config: Any,
    *,
    layer_types: Sequence[str | None] | None = None,
    dtypes: Sequence[str] | None = None,
    positions: Sequence[int] | None = None,
    ulps: float = 8.0,
    heads: tuple[int, int] = (2, 1),
    checks: Sequence[str] | None = None,
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
    dtypes : sequence of str, optional
        ``"float32"``, ``"bfloat16"``, ``"float16"`` (each checked apart); default: the
        adapter's own ``DTYPES`` where it declares them, else float32 and bfloat16.
    positions : sequence of int, optional
        Extra positions to check (table boundaries are added: the config's context, its
        scaling's original context, the engine's ``max_position``).
    ulps : float
        Output tolerance in units of ``eps(dtype)``.
    heads : (int, int)
        Query and key/value heads of the data (grouped-query by default).
    checks : sequence of str, optional
        The checks to run (names of :data:`MODEL_CHECKS`): default :data:`CONFIG_CHECKS`;
        :data:`PACKED_CHECKS` run only when named, or when ``config`` names a case of the field
        report that runs them (``"thd"``).

    Returns
    -------
    ModelRopeReport
        Truthy when no check failed and the adapter raised no error of its own.
    """
    if checks is None:
        checks = _case_checks(config)
    wanted = tuple(CONFIG_CHECKS if checks is None else dict.fromkeys(checks))
    unknown = [c for c in wanted if c not in MODEL_CHECKS]
    if unknown or not wanted:
        raise ValueError(f"checks must name some of {list(MODEL_CHECKS)}; got {list(checks or [])}")
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
    code = adapter_files(ad)
    if dtypes is None:
        dtypes = tuple(getattr(ad, "DTYPES", None) or ("float32", "bfloat16"))
    results: list[ModelCheck] = []
    for lt, index, rope in _layers(cfg):
        if layer_types is not None and lt is not None and lt not in layer_types:
            continue  # (a config whose layers share one RoPE has one, whatever the name asked)
        for dtype in dtypes:
            results.extend(
                _check_layer(
                    ad, cfg, model, lt, index, rope, dtype, positions or (), ulps, heads, code, wanted
                )
            )
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
    code: frozenset[str],
    wanted: tuple[str, ...] = CONFIG_CHECKS,
) -> list[ModelCheck]:
    def row(check: str, status: Status, error: float = math.nan, message: str = "") -> ModelCheck:
        return ModelCheck(check, lt, dtype, status, error, message)

    first = wanted[0] if not any(c in CONFIG_CHECKS for c in wanted) else "rotation"
    try:
        eng = ad.build(cfg, layer_type=lt, dtype=dtype)
    except Unsupported as e:
        return [row(first, "not supported", message=str(e))]
    except Exception as e:
        if raised_by_adapter(e, code):
            return [row(first, "adapter error", message=_adapter_error(e))]
        return [row(first, "fail", message=f"building the engine's RoPE raised {_exc(e)}")]
    layer = _Layer(
        rope, eng, dtype, ulps, heads, float(model.attention.get("softmax_scale_multiplier", 1.0)), code
    )
    context = _context(cfg, rope)
    layer.max_positions = _max_positions(cfg)
    out: list[ModelCheck] = []
    if any(c in CONFIG_CHECKS for c in wanted):
        got = _config_checks(eng, model, index, layer, context, extra, row, code)
        out += [r for r in got if r.check in wanted or r.status == "not supported"]
    out += [_packed(layer, check, context, row) for check in PACKED_CHECKS if check in wanted]
    return out


def _config_checks(
    eng: Any,
    model: hf.ModelRope,
    index: int,
    layer: _Layer,
    context: int,
    extra: Sequence[int],
    row: Any,
    code: frozenset[str],
) -> list[ModelCheck]:
    table = getattr(eng, "max_position", None)
    marks = [
        context,
        *(x for x in (table, getattr(layer.cfg.scaling, "original_max_position_embeddings", None)) if x),
    ]
    try:
        calls = [layer.call(np.arange(64)), *_spread_calls(layer, _spread([*marks, *extra]))]
        calls += [dataclasses.replace(layer.call(np.arange(n)), switch=True) for n in _switch_lengths(layer)]
        factors = _measure_factor(layer, calls[0])
        out = [_rotation(layer, calls, row)]
    except Unsupported as e:
        return [row("rotation", "not supported", message=str(e))]
    out.append(_attention_factor(layer, calls[0], factors, row))
    out.append(_softmax_scale(layer, factors, row))
    out.append(_query_scale(eng, model, index, row, code))
    out.append(_positions(layer, calls, context, row))
    return out


def _switch_lengths(layer: _Layer) -> tuple[int, ...]:
    """Call lengths on either side of where a scaling chosen per call switches: LongRoPE's short
    and long factors at ``original_max_position_embeddings``, dynamic NTK's growth past the
    context (a call of ``n`` tokens at positions ``0 .. n-1``)."""
    sc = layer.cfg.scaling
    n0 = 0
    if isinstance(sc, LongRoPE):
        n0 = int(sc.original_max_position_embeddings)
    elif isinstance(sc, DynamicNTK):
        n0 = int(sc.max_position_embeddings)
    return (n0, n0 + 1) if 0 < n0 <= 65536 else ()


def _spread_calls(layer: _Layer, pos: np.ndarray) -> list[_Call]:
    """One call over every spread position; where the engine refuses it, one call per position
    (so the refused positions are known)."""
    c = layer.call(pos)
    if c.out is not None:
        return [c]
    return [layer.call(pos[i : i + 1]) for i in range(pos.shape[0])]


def _exc(e: BaseException) -> str:
    if isinstance(e, EngineError) and e.__cause__ is not None and not str(e):
        return _exc(e.__cause__)
    s = str(e).splitlines()[0][:200] if str(e) else ""
    return f"{type(e).__name__}: {s}" if s else type(e).__name__


def _adapter_error(e: BaseException) -> str:
    """``adapter error: TypeError: ... (raised at adapter.py:42)``."""
    tb, last = e.__traceback__, None
    while tb is not None:
        last, tb = tb, tb.tb_next
    at = ""
    if last is not None:
        at = f" (raised at {os.path.basename(last.tb_frame.f_code.co_filename)}:{last.tb_lineno})"
    return f"adapter error: {_exc(e)}{at}"


def _scalar_pos(c: _Call) -> np.ndarray:
    return c.pos if c.pos.ndim == 1 else c.pos[0]


def _rotation(layer: _Layer, calls: list[_Call], row: Any) -> ModelCheck:
    ran = [c for c in calls if c.out is not None]
    if not ran:
        c = calls[0]
        if c.adapter:
            return row("rotation", "adapter error", message=f"adapter error: {c.error}")
        return row("rotation", "fail", message=f"the engine raised on every call: {c.error}")
    worst, bad = 0.0, list[int]()
    for c in ran:
        e = layer.errors(c)
        worst = max(worst, float(e.max()))
        bad.extend(int(p) for p in _scalar_pos(c)[e > 1.0])
    if worst <= 1.0:
        return row("rotation", "pass", worst)
    return row("rotation", "fail", worst, _diagnose(layer, ran, sorted(set(bad))))


# -- the attention factor, from norms ---------------------------------------------------------------
@dataclasses.dataclass
class _Factors:
    """The engine's scale of cos and sin per tensor (q, k), measured from norms: a rotation keeps
    the norm of the features it turns, whatever their pairing, so ``|out| / |in|`` over the
    features the engine changes is its factor at every token.  ``lo``/``hi``: each tensor's range
    over tokens and heads (one factor: equal within rounding).  q and k are judged apart."""

    f: tuple[float, float]
    lo: tuple[float, float]
    hi: tuple[float, float]


def _measure_factor(layer: _Layer, c: _Call) -> _Factors | None:
    """The engine's factor at positions 0 .. 63 (and ``layer.norm`` set from it)."""
    if c.out is None:
        return None
    fs, lo, hi, norm = [], [], [], []
    for x, o in zip((c.q, c.k), c.out, strict=True):
        moved = (np.abs(o - x) > 2 * eps(layer.dtype) * np.maximum(np.abs(x), 1e-30)).any(axis=(0, 1))
        if moved.any():
            num = np.sqrt(np.sum(o[..., moved] ** 2, axis=-1))
            den = np.sqrt(np.sum(x[..., moved] ** 2, axis=-1))
            r = (num / np.maximum(den, 1e-300)).ravel()
            f = float(np.median(r))
            lo.append(float(np.min(r)))
            hi.append(float(np.max(r)))
        else:
            f = 1.0
            lo.append(1.0)
            hi.append(1.0)
        fs.append(f)
        ok = math.isfinite(f) and f > 1e-6
        # (the features the config rotates too: in bfloat16 a slow pair turns by less than
        # rounding at these positions, yet carries the factor at every other)
        norm.append((layer.af / f if ok else 1.0, moved | (np.arange(x.shape[-1]) < layer.cfg.width)))
    layer.norm = tuple(norm)
    return _Factors((fs[0], fs[1]), (lo[0], lo[1]), (hi[0], hi[1]))


def _digits(dtype: str) -> int:
    """Decimals a factor measured in ``dtype`` is printed with."""
    e = eps(dtype)
    return 4 if e <= 2.0**-20 else 3 if e <= 2.0**-10 else 2


def _attention_factor(layer: _Layer, c: _Call, fac: _Factors | None, row: Any) -> ModelCheck:
    if fac is None:
        if c.adapter:
            return row("attention_factor", "adapter error", message=f"adapter error: {c.error}")
        return row("attention_factor", "fail", message=f"the engine raised: {c.error}")
    af, tol, n = layer.af, layer.ulps * eps(layer.dtype), _digits(layer.dtype)
    fq, fk = fac.f
    err = max(abs(f / af - 1.0) for f in fac.f) / tol
    f = fq if abs(fq / af - 1.0) >= abs(fk / af - 1.0) else fk
    if err <= 1.0:
        return row("attention_factor", "pass", err, f"{f:.{n}f} (the config's {af:.4f})")
    folded = max(abs(g * layer.fold / af - 1.0) for g in fac.f) / tol
    if layer.fold != 1.0 and folded <= 1.0:
        return row(
            "attention_factor",
            "pass",
            folded,
            f"{f:.{n}f} on cos and sin, the rest folded into the engine's softmax scale "
            f"{layer.softmax[0]:.6g} (the logits are the config's: {af:.4f}**2)",
        )
    return row("attention_factor", "fail", err, _factor_words(layer, fac))


def _factor_words(layer: _Layer, fac: _Factors) -> str:
    """What is wrong with the engine's factor, q and k judged apart: each tensor's factor against
    the config's, whether it is one factor over the tokens, and the mistake it matches."""
    af, sc, tol, n = layer.af, layer.cfg.scaling, layer.ulps * eps(layer.dtype), _digits(layer.dtype)
    right = [abs(f / af - 1.0) <= tol for f in fac.f]
    spread = [hi / max(lo, 1e-300) - 1.0 > 2 * tol for lo, hi in zip(fac.lo, fac.hi, strict=True)]
    fq, fk = fac.f
    names = ("q", "k")
    if abs(fq / fk - 1.0) > tol or right[0] != right[1]:
        parts = [
            f"{t}'s cos and sin are scaled by {f:.{n}f}" + (" (the config's)" if ok else "")
            for t, f, ok in zip(names, fac.f, right, strict=True)
        ]
        k_part = parts[1].replace("cos and sin are scaled ", "")
        words = f"{parts[0]}, {k_part}, where the config implies {af:.4f} for both"
    else:
        words = f"cos and sin are scaled by {fq:.{n}f} where the config implies {af:.4f}"
    for t, bad, lo, hi in zip(names, spread, fac.lo, fac.hi, strict=True):
        if bad:
            words += f" ({t}'s is not one factor: from {lo:.{n}f} to {hi:.{n}f} over its tokens and heads)"
    if layer.fold != 1.0:
        words += f" (the engine's softmax scale {layer.softmax[0]:.6g} does not make up for it)"
    wrong = [t for t, ok in zip(names, right, strict=True) if not ok]
    fs = [f for f, ok in zip(fac.f, right, strict=True) if not ok]
    who = "" if len(wrong) == 2 else f" on {wrong[0]}"
    if abs(af - 1.0) > tol and all(abs(f - 1.0) <= tol for f in fs):
        return f"{words} ({_af_origin(sc)}): the attention factor is missing{who}"
    if abs(af - 1.0) > tol and all(abs(f / (af * af) - 1.0) <= tol for f in fs):
        return f"{words}: the attention factor is applied twice{who}"
    if isinstance(sc, YaRN) and sc.mscale and sc.mscale_all_dim:
        g = YaRN._mscale(sc.factor)
        if all(abs(f / g - 1.0) <= tol for f in fs) and abs(g / af - 1.0) > tol:
            return (
                f"{words}: 0.1 ln({sc.factor:g}) + 1 = {g:.4f}{who}, i.e. mscale={sc.mscale:g} / "
                f"mscale_all_dim={sc.mscale_all_dim:g} ignored"
            )
    if abs(af - 1.0) <= tol and len(wrong) == 1:
        return f"{words}: {wrong[0]} alone is scaled"
    return words


def _af_origin(sc: Any) -> str:
    if isinstance(sc, YaRN):
        if sc.attention_factor_ is not None:
            return f"YaRN attention_factor={sc.attention_factor_:g}"
        if sc.mscale and sc.mscale_all_dim:
            return f"YaRN mscale({sc.factor:g}, {sc.mscale:g}) / mscale({sc.factor:g}, {sc.mscale_all_dim:g})"
        return f"YaRN 0.1 ln({sc.factor:g}) + 1"
    if isinstance(sc, LongRoPE):
        return "LongRoPE sqrt(1 + ln(s) / ln(L0))"
    return f"{type(sc).__name__}'s attention factor"


def _softmax_scale(layer: _Layer, fac: _Factors | None, row: Any) -> ModelCheck:
    got, want = layer.softmax
    err = abs(got / want - 1.0) / 1e-5
    msg = f"{got:.6g} (the config's {want:.6g})"
    if err <= 1.0:
        return row("softmax_scale", "pass", err, msg)
    af, tol = layer.af, layer.ulps * eps(layer.dtype)
    if fac is not None and all(abs(f * layer.fold / af - 1.0) <= tol for f in fac.f):
        return row(
            "softmax_scale",
            "pass",
            0.0,
            f"{got:.6g}: the engine folds the attention factor into its softmax scale "
            f"({want:.6g} x {af:.4f}**2 / {fac.f[0]:.4f}**2; the logits are the config's)",
        )
    extra = ""
    if abs(got - 1.0) < 1e-9:
        extra = ": the engine applies none (MLA with YaRN multiplies the softmax scale by mscale**2)"
    elif (
        fac is not None
        and abs(af - 1.0) > tol
        and all(abs(f / af - 1.0) <= tol for f in fac.f)
        and abs(got / (want * af * af) - 1.0) <= 1e-5
    ):
        extra = (
            f": the attention factor is applied twice, on cos and sin ({af:.4f}) and again here as its square"
        )
    return row(
        "softmax_scale",
        "fail",
        err,
        f"the logits are scaled by {got:.6g} where the config implies {want:.6g}{extra}",
    )


def _query_scale(eng: Any, model: hf.ModelRope, index: int, row: Any, code: frozenset[str]) -> ModelCheck:
    pos = np.array([0, 1, 4095, 4096, 8192, 16383, 16384, 65536, 262143, 2**20], dtype=np.int64)
    want = model.query_scale(index, pos) if model.layers else None
    fn = getattr(eng, "query_scale", None)
    try:
        got = None if fn is None else fn(pos.copy())
    except Exception as e:
        if raised_by_adapter(e, code):
            return row("query_scale", "adapter error", message=_adapter_error(e))
        return row("query_scale", "fail", message=f"the engine's query scale raised {_exc(e)}")
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
    return row(
        "query_scale",
        "fail",
        err,
        f"queries scaled by {g[k]:.4f} at position {pos[k]} where the config implies {w[k]:.4f} "
        f"(wrong from position {pos[j]} on)",
    )


def _positions(layer: _Layer, calls: list[_Call], context: int, row: Any) -> ModelCheck:
    calls = [c for c in calls if not c.switch]  # (each position is probed alone by the spread)
    nonfinite = _nonfinite_words(layer, [c for c in calls if c.out is not None])
    if nonfinite:  # (an output that is NaN is no position computed, and no refusal either)
        return row(
            "positions",
            "fail",
            math.inf,
            f"{nonfinite[0]}: neither right nor refused (raise for the positions the engine cannot compute)",
        )
    refused = sorted(
        ((int(p), c) for c in calls if c.out is None for p in np.atleast_1d(_scalar_pos(c))),
        key=lambda t: t[0],
    )
    if not refused:
        top = max(int(_scalar_pos(c).max()) for c in calls)
        return row("positions", "pass", 0.0, f"every position computed, up to {top}")
    first, c = refused[0]
    if c.adapter:
        return row("positions", "adapter error", message=f"adapter error at position {first}: {c.error}")
    if first < context:
        words = f"the engine refuses position {first} ({c.error}) although the config's context is {context}"
        n = int(np.atleast_1d(_scalar_pos(c)).shape[0])
        if first >= n and layer.call(np.arange(first + 1, dtype=np.int64)).out is not None:
            # (refused in a call of n tokens, computed in a call of first + 1)
            words += (
                f": in a call of {first + 1} tokens it computes it, so its table has as many rows as "
                f"the call has tokens (size it by the largest position, or the context, not the token count)"
            )
        return row("positions", "fail", math.inf, words)
    return row(
        "positions",
        "pass",
        0.0,
        f"refuses positions from {first} on (past the config's context {context}): {c.error}",
    )


# -- packed input ----------------------------------------------------------------------------------
def _packed_row(check: str, context: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(cu_seqlens, offsets, positions)`` of the packed row of ``check``: the positions rotary's
    packing implies (:func:`rotary.positions.from_cu_seqlens`, plus each document's offset)."""
    from ..positions import from_cu_seqlens

    lengths = np.asarray(PACKED_LENGTHS, dtype=np.int64)
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    offsets = np.zeros_like(lengths)
    if check == "packed_offsets":
        offsets = np.asarray(PACKED_OFFSETS, dtype=np.int64)
        if context:
            offsets = np.minimum(offsets, np.maximum(context - lengths, 0))
    pos = np.asarray(from_cu_seqlens(cu), dtype=np.int64) + np.repeat(offsets, lengths)
    return cu, offsets, pos


def _packed(layer: _Layer, check: str, context: int, row: Any) -> ModelCheck:
    """One packed row through the engine's ``rotate_packed``, against rotary's packed rotation."""
    if getattr(layer.eng, "rotate_packed", None) is None:
        return row(
            check,
            "not applicable",
            message="the engine's RoPE, as adapted, takes no packed input (no rotate_packed)",
        )
    if layer.n_rows > 1:
        return row(
            check,
            "not applicable",
            message="M-RoPE: a packed row's documents imply one position per token, not M-RoPE's rows",
        )
    cu, offsets, pos = _packed_row(check, context)
    n = int(cu[-1])
    q = _data(layer.rng, (n, layer.heads[0], layer.cfg.head_dim), layer.dtype)
    k = _data(layer.rng, (n, layer.heads[1], layer.cfg.head_dim), layer.dtype)
    try:
        c = layer.run_packed(pos, q, k, cu, offsets)
    except Unsupported as e:
        return row(check, "not applicable", message=str(e))
    if c.out is None:
        if c.adapter:
            return row(check, "adapter error", message=f"adapter error: {c.error}")
        return row(check, "fail", math.inf, f"the engine raised on the packed row: {c.error}")
    # (blind to the engine's factor, as the rotation check: the attention factor check measures it)
    saved = layer.norm
    _measure_factor(layer, c)
    try:
        err = layer.errors(c)
        worst = float(err.max())
        if worst <= 1.0:
            return row(check, "pass", worst, _packed_words(cu, offsets))
        return row(check, "fail", worst, _packed_diagnosis(layer, c, err, cu, offsets))
    finally:
        layer.norm = saved


def _packed_words(cu: np.ndarray, offsets: np.ndarray) -> str:
    lengths = np.diff(cu)
    words = f"{lengths.size} documents of {lengths.min()} to {lengths.max()} tokens in one row of {cu[-1]}"
    if offsets.any():
        return f"{words}, at offsets {', '.join(map(str, offsets.tolist()))}"
    return f"{words}, each from position 0"


def _rotated_at(layer: _Layer, c: _Call, t: int, top: int) -> int | None:
    """The position ``0 .. top`` at which the config's rotation of token ``t``'s q and k gives the
    engine's output within tolerance (the closest match), ``None`` where none does."""
    cand = np.arange(top + 1, dtype=np.int64)
    worst = np.zeros(cand.shape[0])
    for x, o in zip((c.q, c.k), layer.normalized(c), strict=True):
        xs = np.ascontiguousarray(np.broadcast_to(x[t], (cand.shape[0], *x.shape[1:])))
        want = _truth(layer.rope, xs, cand)
        tol = layer.tol(_Call(cand, xs, xs, None), xs)
        err = np.abs(o[t][None] - want) / max(1.0, float(np.abs(x).max())) / tol
        worst = np.maximum(worst, np.where(np.isfinite(err), err, np.inf).max(axis=(1, 2)))
    i = int(np.argmin(worst))
    return int(cand[i]) if worst[i] <= 1.0 else None


def _span(xs: Sequence[int]) -> str:
    """``5..11`` for a run, else the first few values."""
    xs = list(xs)
    if len(xs) > 1 and all(b - a == 1 for a, b in itertools.pairwise(xs)):
        return f"{xs[0]}..{xs[-1]}"
    head = ", ".join(map(str, xs[:6]))
    return head + (", ..." if len(xs) > 6 else "")


def _packed_diagnosis(layer: _Layer, c: _Call, e: np.ndarray, cu: np.ndarray, offsets: np.ndarray) -> str:
    """Which documents are wrong, from which of their tokens, and at which positions the engine
    rotated them (each read off the engine's own numbers)."""
    top = int(cu[-1] + offsets.max() + np.diff(cu).max())
    n = offsets.size
    found: list[tuple[int, int, str, str]] = []  # (document, first wrong token, kind, words)
    for d in range(n):
        a, b, off = int(cu[d]), int(cu[d + 1]), int(offsets[d])
        if not (e[a:b] > 1.0).any():
            continue
        j0 = int(np.argmax(e[a:b] > 1.0))
        got = [_rotated_at(layer, c, t, top) for t in range(a + j0, b)]
        kind, words = _packed_how(d, a, j0, got, [off + j for j in range(j0, b - a)], offsets)
        found.append((d, j0, kind, words))
    parts: list[str] = []
    shown: list[str] = []
    for i, (d, j0, kind, words) in enumerate(found):
        if kind in shown:
            continue
        a, b = int(cu[d]), int(cu[d + 1])
        head = (
            f"document {d} of {n} (0-based; tokens {a}..{b - 1} of the row) is wrong from its token {j0} "
            f"on (token {a + j0} of the row): {words}"
        )
        same = [f for f in found[i + 1 :] if f[2] == kind and kind != "other"]
        if same:
            froms = ", ".join(f"{f[0]} (from its token {f[1]})" for f in same)
            head += (
                f"; so are documents {froms}, in the same way"
                if len(same) > 1
                else (f"; so is document {froms}, in the same way")
            )
        parts.append(head)
        shown.append(kind)
        if len(parts) == 3:
            break
    rest = [str(f[0]) for f in found if f[2] not in shown]
    if rest:
        parts.append(f"documents {', '.join(rest)} are wrong too")
    return "; ".join(parts)


def _packed_how(
    d: int, a: int, j0: int, got: list[int | None], want: list[int], offsets: np.ndarray
) -> tuple[str, str]:
    """One document's mistake as ``(kind, words)``: ``got`` (the position the engine's numbers
    match, per token from ``j0``) against ``want``."""
    if any(g is None for g in got):
        return "values", "its tokens match the config's rotation at no position (wrong values, not positions)"
    g = [int(x) for x in got if x is not None]
    js = list(range(j0, j0 + len(g)))
    off = int(offsets[d])
    one = len(g) == 1
    at = f"rotated at position{'' if one else 's'} {_span(g)} where "
    at += f"{'it is' if one else 'they are'} at {_span(want)}"
    if off and g == js:
        return "offset ignored", f"{at}: its offset {off} is ignored (positions from 0)"
    if g == [a + j for j in js]:
        return "row index", f"{at}, the row's token index: positions do not restart at the document's start"
    if off and g == [a + j + off for j in js]:
        return (
            "row index + offset",
            f"{at}, its offset plus the row's token index: positions do not restart at the document's start",
        )
    for e2 in range(offsets.size):
        if e2 != d and int(offsets[e2]) != off and g == [int(offsets[e2]) + j for j in js]:
            return (
                f"offset of {e2}",
                f"{at}: document {e2}'s offset {int(offsets[e2])} instead of its own {off}",
            )
    shift = {x - w for x, w in zip(g, want, strict=True)}
    if len(shift) == 1:
        return "shift", f"{at}: shifted by {shift.pop():+d}"
    return "other", at


# -- diagnosis ----------------------------------------------------------------------------------
def _pairs(x: np.ndarray, cfg: RopeConfig) -> np.ndarray:
    """The rotated pairs of ``x`` ``(..., d)`` as complex numbers ``(..., width/2)``."""
    w, h = cfg.width, cfg.width // 2
    if cfg.layout == "half":
        return x[..., :h] + 1j * x[..., h:w]
    return x[..., 0:w:2] + 1j * x[..., 1:w:2]


def _partners(layout: str, width: int, d: int) -> np.ndarray:
    """Per feature, the feature ``layout`` pairs it with over ``width`` features (-1: none)."""
    j = np.arange(d)
    h = width // 2
    if layout == "half":
        p = np.where(j < h, j + h, j - h)
    else:
        p = j ^ 1
    return np.where(j < width, p, -1)


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


def _at(rope: Rope, factor: float) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """``rope``'s rotation with cos and sin scaled by ``factor`` (its own attention factor replaced)."""
    cfg = _rope_config(rope)
    own, w = float(cfg.attention_factor), cfg.width

    def fn(x: np.ndarray, p: np.ndarray) -> np.ndarray:
        y = _truth(rope, x, p)
        if own != factor:
            y[..., :w] *= factor / own
        return y

    return fn


def _positional_suspects(layer: _Layer, calls: list[_Call]) -> list[tuple[str, Any, Any]]:
    """Known mistakes in the positions the engine rotates by (its frequencies the config's), each
    as the rotation it would give and the positions it rotates at (for the angle allowance):
    ``(words, fn(x, pos), at(pos))``; each names what to fix."""
    rope = layer.rope
    truth = _at(rope, layer.af)
    out: list[tuple[str, Any, Any]] = []
    delta = _offset(layer, calls)
    if delta:
        out.append(
            (
                f"the config's rotation at position p {'+' if delta > 0 else '-'} {abs(delta)}: every "
                f"position off by {delta:+d} (rotate by the token's own position)",
                lambda x, p: truth(x, p + delta),
                lambda p: p + delta,
            )
        )
    out.append(
        (
            "the config's rotation at each token's index in the call (0, 1, 2 ...), not at its "
            "position: the table is indexed by token index (index it by the positions)",
            lambda x, p: truth(x, np.broadcast_to(np.arange(p.shape[-1]), p.shape).copy()),
            lambda p: np.broadcast_to(np.arange(p.shape[-1]), p.shape),
        )
    )
    for name, dt in (("float16", np.float16), ("bfloat16", None)):

        def rounded(x: np.ndarray, p: np.ndarray, dt: Any = dt, name: str = name) -> np.ndarray:
            with np.errstate(over="ignore", invalid="ignore"):
                f = p.astype(np.float64)
                q = f.astype(dt).astype(np.float64) if dt is not None else round_to(f, name)
                return _truth_any(rope, x, q) * (layer.af / float(layer.cfg.attention_factor))

        out.append(
            (
                f"the config's rotation at the positions rounded to {name} (cast to {name} before "
                "the angles: keep positions integer or float32)",
                rounded,
                None,
            )
        )
    w, layout = layer.cfg.width, layer.cfg.layout

    def swapped(x: np.ndarray, p: np.ndarray) -> np.ndarray:
        # x sin + rotate_half(x) cos = rotate_half(the rotation by -pos of x)
        t = truth(x, -p)
        r = t[..., :w]
        if layout == "half":
            turned = np.concatenate([-r[..., w // 2 :], r[..., : w // 2]], axis=-1)
        else:
            turned = np.stack([-r[..., 1::2], r[..., 0::2]], axis=-1).reshape(r.shape)
        return np.concatenate([turned, t[..., w:]], axis=-1)

    out.append(
        (
            "cos and sin swapped (x sin + rotate_half(x) cos where RoPE is x cos + rotate_half(x) sin)",
            swapped,
            None,
        )
    )
    out.append(
        (
            "the rotation by -pos: sin has the wrong sign (x cos - rotate_half(x) sin where RoPE is "
            "x cos + rotate_half(x) sin, rotate_half(x) = (-x2, x1))",
            lambda x, p: truth(x, -p),
            None,
        )
    )
    return out


def _truth_any(rope: Rope, x: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """:func:`_truth` at any real positions (non-finite ones give NaN, as an engine's would)."""
    bad = ~np.isfinite(pos)
    y = _truth(rope, x, np.where(bad, 0.0, pos))
    mask = bad if bad.ndim == 1 else bad.any(axis=0)
    y[mask, :, : _rope_config(rope).width] = np.nan  # (the features past the width pass through)
    return y


def _offset(layer: _Layer, calls: list[_Call]) -> int:
    """The whole number ``delta`` of positions the engine's angles at position 0 amount to (every
    pair turned by ``w_i delta``), solved pair by pair from the slowest; 0 where none fits."""
    c = calls[0]
    if c.out is None or c.pos.ndim != 1 or c.pos[0] != 0 or c.pos.shape[0] < 2 or c.pos[1] != 1:
        return 0
    xs = (c.q[:2], c.k[:2])
    want = tuple(_truth(layer.rope, x, c.pos[:2]) for x in xs)
    noise = layer.ulps * eps(layer.dtype) * max(1.0, layer.af)
    theta, slack = _pair_angles(layer, xs, tuple(o[:2] for o in c.out), noise)
    w, _ = _pair_angles(layer, xs, want, 0.0)  # (row 1: each pair's angle at position 1, its frequency)
    freq = w[1]
    keep = freq > 0
    if not keep.any():
        return 0
    order = np.argsort(freq[keep])
    f, a, t = freq[keep][order], theta[0][keep][order], slack[0][keep][order]
    # (the angle kind's allowance is relative to the angle w_i delta)
    iv = _turn_rate(f, a, t, float(np.max(layer.angle_rel, initial=0.0)), bound=math.pi / float(f[0]))
    if iv is None:
        return 0
    cands = [d for d in range(math.ceil(iv[0]), math.floor(iv[1]) + 1) if d != 0]
    return cands[0] if len(cands) == 1 else 0


def _suspects(layer: _Layer) -> list[tuple[str, Callable[[np.ndarray, np.ndarray], np.ndarray]]]:
    """Known mistakes of the rotation's frequencies (the pairing holds; the factor is the
    attention factor check's), each as the rotation it would give at the config's factor:
    ``(words, fn(x, pos))``."""
    rope, cfg, af = layer.rope, layer.cfg, layer.af
    sc = cfg.scaling
    out: list[tuple[str, Callable[[np.ndarray, np.ndarray], np.ndarray]]] = []
    if not isinstance(sc, Default):
        plain = _with(cfg, rope, scaling=None)
        out.append(
            (f"no scaling: plain RoPE at base {cfg.base:g} ({type(sc).__name__} not applied)", _at(plain, af))
        )
    if cfg.width < cfg.head_dim and cfg.partial != "proportional":
        out.append(
            (
                f"frequencies with exponents over the head's {cfg.head_dim} features, not the "
                f"{cfg.width} it rotates (inv_freq = base**(-2i/{cfg.head_dim}): divide by rotary_dim)",
                _at(_with(cfg, rope, base=cfg.base ** (cfg.width / cfg.head_dim)), af),
            )
        )
    if cfg.base != 10000.0:
        out.append(
            (
                f"base 10000 (the config's rope_theta {cfg.base:g} not read)",
                _at(_with(cfg, rope, base=10000.0), af),
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
                _at(_with(cfg, rope, scaling=Frequencies(tuple(float(f) for f in inv))), af),
            )
        )
    if isinstance(sc, Llama3) and sc.factor != 8.0:
        l8 = dataclasses.replace(sc, factor=8.0)
        out.append(
            (
                f"Llama 3 with factor 8 (hard-coded; the config's is {sc.factor:g})",
                _at(_with(cfg, rope, scaling=l8), af),
            )
        )
    if isinstance(sc, YaRN):
        flip = dataclasses.replace(sc, truncate=not sc.truncate)
        out.append(
            (
                f"YaRN with truncate={not sc.truncate} (the config's is {sc.truncate})",
                _at(_with(cfg, rope, scaling=flip), af),
            )
        )
        n, n0 = layer.max_positions, sc.original_max_position_embeddings
        if n and n != n0:
            wrong = dataclasses.replace(sc, original_max_position_embeddings=n)
            out.append(
                (
                    f"YaRN with max_position_embeddings {n} as its original context (the config's "
                    f"original_max_position_embeddings is {n0})",
                    _at(_with(cfg, rope, scaling=wrong), af),
                )
            )
    if isinstance(sc, LongRoPE):
        by: dict[str, Any] = {}
        for label, fac in (("long", sc.long_factor), ("short", sc.short_factor)):
            by[label] = _at(_with(cfg, rope, scaling=Factors(fac)), af)
            out.append((f"LongRoPE's {label} factors at every length", by[label]))
        n0 = sc.original_max_position_embeddings

        def per_token(x: np.ndarray, p: np.ndarray, n0: int = n0) -> np.ndarray:
            long = (p if p.ndim == 1 else p.max(axis=0)) >= n0
            return np.where(long[:, None, None], by["long"](x, p), by["short"](x, p))

        def late(x: np.ndarray, p: np.ndarray, n0: int = n0) -> np.ndarray:
            return by["long"](x, p) if int(np.max(p)) > n0 else by["short"](x, p)

        def late_rows(x: np.ndarray, p: np.ndarray, n0: int = n0) -> np.ndarray:
            # (one table: n0 short rows, then the long ones, read at p + n0 in a long call)
            if int(np.max(p)) > n0:
                return by["long"](x, p)
            past = (p if p.ndim == 1 else p.max(axis=0)) >= n0
            return np.where(past[:, None, None], by["long"](x, p - n0), by["short"](x, p))

        one_late = (
            f"LongRoPE's long factors only in a call whose largest position exceeds {n0} (max(pos) > "
            f"{n0}) where transformers takes them for a call longer than {n0} (max(pos) + 1 > {n0}): "
            f"one token late"
        )
        out.append((one_late, late))
        out.append(
            (
                f"{one_late}; in a call of {n0 + 1} tokens position {n0} reads the long factors' row 0 "
                f"(one table of {n0} short rows, then the long ones)",
                late_rows,
            )
        )
        out.append(
            (
                f"LongRoPE's short factors below position {n0} and its long ones from {n0} on, chosen per "
                f"token (transformers chooses one set per call: the long factors for every token of a "
                f"call longer than original_max_position_embeddings {n0})",
                per_token,
            )
        )
    if isinstance(rope, MRoPE):
        alt = None
        if not rope._custom_rows:
            # (the other layout: consecutive sections, or Qwen3-VL's round robin as transformers
            # lays it out for any sections, whose rows' counts need not be the sections)
            rows = list(_round_robin(rope.sections)) if not rope.interleaved else None
            sections = tuple(rows.count(j) for j in range(len(rope.sections))) if rows else rope.sections
            alt = MRoPE(
                cfg.head_dim,
                sections,
                rows=rows,
                base=cfg.base,
                layout=cfg.layout,
                rotary_dim=cfg.rotary_dim,
                scaling=cfg.scaling,
            )
        if alt is not None:
            kind = "consecutive" if rope.interleaved else "interleaved (Qwen3-VL)"
            out.append((f"M-RoPE sections laid out {kind}", _at(alt, af)))
        out.append(
            (
                "M-RoPE with the temporal row for every frequency (text positions only)",
                lambda x, p: _truth(rope, x, np.broadcast_to(p[:1], p.shape).copy()),
            )
        )
    return out


#: Past the last right sampled position, the kit checks up to :data:`SCAN_AFTER` positions in
#: calls of :data:`SCAN_CALL` (then bisects); below it, every position up to :data:`SCAN_LIMIT`.
SCAN_CALL = 4096
SCAN_AFTER = 65536
SCAN_LIMIT = 2**18


def _first_wrong(
    layer: _Layer, calls: list[_Call], bad: list[int], test: Callable[[_Call], np.ndarray] | None = None
) -> tuple[int, bool, int]:
    """The first wrong position, from the first wrong sampled one (``bad[0]``), as ``(position,
    exact, below)``: every position below ``below`` was checked right, and ``exact`` when that is
    every position below ``position``.

    Every position after the last right sampled one is checked, in calls of :data:`SCAN_CALL`, up
    to :data:`SCAN_AFTER` of them (a mistake need not stay wrong once it starts: float16
    positions are right again at every even one past 2048); past that, a bisection (which assumes
    it stays wrong).  Then every position below the last right sampled one that no call checked,
    up to :data:`SCAN_LIMIT`, on data of their own (the draws of every other call unchanged): a
    right sampled position says nothing of its neighbours (positions rounded to bfloat16 are right
    at 1000 and wrong at 257), and a wrong one found there is the first."""
    first = bad[0]
    if first < 0:
        return first, False, first

    def wrong(ps: np.ndarray, rng: np.random.Generator | None = None) -> np.ndarray:
        c = layer.call(ps, rng)
        if c.out is None:
            return np.ones(ps.shape, dtype=bool)
        return test(c) if test is not None else layer.errors(c) > 1.0

    checked = {int(p) for c in calls for p in _scalar_pos(c) if int(p) not in bad}
    right = [p for p in checked if p < first]
    lo0 = lo = max(right, default=-1)  # lo right (-1: from position 0), hi wrong
    hi, found, exact, start = first, None, True, lo + 1
    while start < hi and start - lo0 <= SCAN_AFTER:
        ps = np.arange(start, min(hi, start + SCAN_CALL), dtype=np.int64)
        w = wrong(ps)
        if w.any():
            found = int(ps[int(np.argmax(w))])
            break
        start, lo = int(ps[-1]) + 1, int(ps[-1])
    if found is None and start < hi:
        while hi - lo > 1:  # (a long gap: bisection, which assumes it stays wrong)
            mid = (lo + hi) // 2
            if wrong(np.array([mid], dtype=np.int64))[0]:
                hi = mid
            else:
                lo = mid
        exact = False
    if found is None:
        found = hi
    top = 0  # (every position below top was checked right by the calls)
    while top in checked:
        top += 1
    stop = min(lo0, found, SCAN_LIMIT)
    for s0 in range(top, stop, SCAN_CALL):
        ps = np.arange(s0, min(stop, s0 + SCAN_CALL), dtype=np.int64)
        w = wrong(ps, layer.scan_rng)
        if w.any():
            return int(ps[int(np.argmax(w))]), True, int(ps[int(np.argmax(w))])
    if stop < min(lo0, found):  # (below the last right sampled one, not every position checked)
        return found, False, stop
    return found, exact, found if exact else start


def _first_seen(first: int, below: int, wrong: str = "wrong", right: str = "right") -> str:
    """How a first wrong position that :func:`_first_wrong` could not prove first was found."""
    return (
        f"first seen {wrong} at position {first} of the positions checked (every position below "
        f"{below} checked {right}, and some past it)"
    )


def _diagnose(layer: _Layer, calls: list[_Call], bad: list[int]) -> str:
    """The rotation check's failure in words: each a verified statement naming what to fix."""
    tail, first = [], None
    wrong = [c for c in calls if c.out is not None and bool((layer.errors(c) > 1.0).any())]
    if wrong and all(c.switch for c in wrong):
        # (wrong only in calls whose length decides the scaling: no position is wrong alone)
        parts = []
        for c in wrong:
            e = layer.errors(c) > 1.0
            n = int(c.pos.shape[-1])
            at = int(_scalar_pos(c)[e][0])
            first = at if first is None else min(first, at)
            parts.append(
                f"a call of {n} tokens (positions 0..{n - 1}) at {int(e.sum())} of its positions from {at}"
            )
        tail = [f"wrong in {' and in '.join(parts)}, and right in every other call checked"]
    elif bad:
        first, exact, checked = _first_wrong(layer, calls, bad)
        tail = [f"wrong from position {first} on" if exact else _first_seen(first, checked)]
        if isinstance(layer.cfg.scaling, (LongRoPE, DynamicNTK)):
            # (a scaling chosen per call: which positions are wrong depends on the call)
            tail = [f"{tail[0]} in the calls checked (the scaling depends on each call's length)"]
    tail = [*_nonfinite_words(layer, calls), *tail]
    pairing = _pairing_words(layer, calls)
    if pairing:  # (the pairs are not the config's: no frequency of a pair means anything)
        return "; ".join([pairing, *tail])
    kind = _angle_kind_words(layer, calls)
    if kind:  # (right within a coarser angle kind: the declaration is what to fix)
        return "; ".join([kind, *tail])
    words: list[str] = []
    moved = [
        label
        for label, fn, at in _positional_suspects(layer, calls)
        if all(float(layer.errors(c, fn=fn, at=at).max()) <= 1.0 for c in calls)
    ]
    if moved:  # (the frequencies are the config's: the positions are what is wrong)
        return "; ".join([f"the engine's numbers match {moved[0]}", *tail])
    matched = [
        label
        for label, fn in _suspects(layer)
        if all(float(layer.errors(c, fn=fn).max()) <= 1.0 for c in calls)
    ]
    kept = _kept_growth_words(layer, calls)
    if kept:
        matched.insert(0, kept)
    if not matched:
        matched = _looser_match(layer, calls)
    cap = None
    if matched:
        also = f" (and, within {layer.dtype}'s precision, {'; '.join(matched[1:])})" if matched[1:] else ""
        words.append(f"the engine's numbers match {matched[0]}{also}")
    else:
        clamp, cap = _clamped(layer, calls, first)
        if clamp:
            words.append(clamp)
        table = int(getattr(layer.eng, "max_position", None) or 0)
        outside = (
            "wrong past it, where it reads outside its table (neither clamped nor wrapped: refuse "
            "positions past it, or size the table by the context)"
        )
        if not clamp and table and bad and min(bad) >= table:
            # (right at every position checked below the engine's own table, wrong past it)
            cap = table
            words.append(
                f"right at every position checked below the engine's table of {table} rows (its "
                f"max_position), {outside}"
            )
        elif not clamp and table and bad and max(bad) >= table:
            # (a known mistake below the table, and reads past it)
            below = [
                label
                for label, fn in _suspects(layer)
                if all(_worst_below(layer, c, fn, table) <= 1.0 for c in calls)
            ]
            if below:
                cap = table
                words.append(
                    f"below the engine's table of {table} rows (its max_position) its numbers match "
                    f"{below[0]}; {outside}"
                )
    passed = _pass_through_words(layer, calls)
    if passed:
        words.append(passed)
    freqs = _measure_frequencies(layer, calls, below=cap or math.inf)
    base = "" if matched or cap else _base_words(layer, calls, freqs)
    words += [base] if base else _frequency_words(layer, freqs)
    words += tail
    return "; ".join(words) if words else "wrong values (no known mistake matches)"


def _kept_growth_words(layer: _Layer, calls: list[_Call]) -> str:
    """Where the engine's numbers are those of transformers' stateful dynamic NTK over the calls
    in the order they ran: a call keeps the frequencies grown for the longest call before it while
    it has at least ``L`` tokens, and resets only below ``L``."""
    cfg, sc = layer.cfg, layer.cfg.scaling
    if not isinstance(sc, DynamicNTK) or not any(c.switch for c in calls):
        return ""
    big_l, cached, d = int(sc.max_position_embeddings), int(sc.max_position_embeddings), cfg.freq_dim
    longest = 0
    for c in calls:
        if c.out is None:
            continue
        n = int(np.max(c.pos)) + 1
        if n > cached:
            cached = n
        if n < big_l and cached > big_l:
            cached = big_l
        if cached > n:
            longest = max(longest, cached)
        grown = cfg.base * (sc.factor * cached / big_l - (sc.factor - 1.0)) ** (d / (d - 2))
        fn = _at(_with(cfg, layer.rope, base=grown if cached > big_l else cfg.base, scaling=None), layer.af)
        if float(layer.errors(c, fn=fn).max()) > 1.0:
            return ""
    if not longest:
        return ""
    return (
        f"transformers' stateful dynamic NTK: a call keeps the frequencies grown for the longest call "
        f"before it (here {longest} tokens) while it has at least max_position_embeddings {big_l} "
        f"tokens, and resets only below {big_l} (a fresh module, and the config's rotation, use each "
        f"call's own length)"
    )


def _nonfinite_words(layer: _Layer, calls: list[_Call]) -> list[str]:
    """Where the engine's outputs are NaN or infinite: from which position on."""
    bad = sorted({int(p) for c in calls if c.out is not None for p in _scalar_pos(c)[_nonfinite(c)]})
    if not bad:
        return []
    if tuple(bad) not in layer.nonfinite:  # (the rotation and the positions check both say it)
        first, exact, below = _first_wrong(layer, calls, bad, lambda c: _nonfinite(c))
        words = f"the engine's outputs are {_first_seen(first, below, 'NaN or infinite', 'finite')}"
        if exact:
            words = f"the engine's outputs are NaN or infinite from position {first} on"
        layer.nonfinite[tuple(bad)] = [words]
    return layer.nonfinite[tuple(bad)]


def _nonfinite(c: _Call) -> np.ndarray:
    """Per token: whether any of the engine's outputs is NaN or infinite."""
    assert c.out is not None
    return np.asarray(~np.isfinite(c.out[0]).all(axis=(1, 2)) | ~np.isfinite(c.out[1]).all(axis=(1, 2)))


#: Angle kinds from the tightest allowance to the loosest.
_KINDS = ("exact", "float64", "float32", "float32_recurrence")


def _looser_kinds(layer: _Layer) -> tuple[str, ...]:
    """The angle kind the engine declares, then each looser one (none past an unknown kind)."""
    declared = str(getattr(layer.eng, "angles", "float32"))
    return (declared, *_KINDS[_KINDS.index(declared) + 1 :]) if declared in _KINDS else (declared,)


@contextlib.contextmanager
def _allowance(layer: _Layer, kind: str) -> Iterator[None]:
    """The layer's angle allowance set to ``kind``'s, restored after."""
    saved = layer.angle_rel, layer.angle_coef
    layer.angle_rel, layer.angle_coef = angle_error(kind, layer.cfg.host_inv_freq(), layer.dtype)
    try:
        yield
    finally:
        layer.angle_rel, layer.angle_coef = saved


def _angle_kind_words(layer: _Layer, calls: list[_Call]) -> str:
    """Where the engine is right within a looser angle kind than it declares: what to declare."""
    declared, *looser = _looser_kinds(layer)
    for kind in looser:
        with _allowance(layer, kind):
            if all(float(layer.errors(c).max()) <= 1.0 for c in calls):
                return (
                    f"the engine declares angles={declared!r} but its numbers are right within the "
                    f"allowance of angles={kind!r} ({ANGLE_KINDS[kind].split(':')[0]}): declare "
                    f"angles = {kind!r} if that is how it forms its angles"
                )
    return ""


def _worst_below(layer: _Layer, c: _Call, fn: Any, limit: int) -> float:
    """The worst error of call ``c`` against ``fn`` over its tokens at positions below ``limit``."""
    if c.out is None:
        return 0.0
    e = layer.errors(c, fn=fn)[np.asarray(_scalar_pos(c)) < limit]
    return float(e.max()) if e.size else 0.0


def _looser_match(layer: _Layer, calls: list[_Call]) -> list[str]:
    """A known mistake the engine's numbers match only within a looser angle kind than it
    declares (its own rounding beyond the declared kind's, on top of the mistake): said so."""
    declared, *looser = _looser_kinds(layer)
    for kind in looser:
        with _allowance(layer, kind):
            found = [
                label
                for label, fn, at in _positional_suspects(layer, calls)
                if all(float(layer.errors(c, fn=fn, at=at).max()) <= 1.0 for c in calls)
            ] + [
                label
                for label, fn in _suspects(layer)
                if all(float(layer.errors(c, fn=fn).max()) <= 1.0 for c in calls)
            ]
        if found:
            return [
                f"{found[0]}, within the allowance of angles={kind!r} (its angles carry more "
                f"rounding than the declared {declared!r} allows)"
            ]
    return []


def _pass_through_words(layer: _Layer, calls: list[_Call]) -> str:
    """Features past the rotated width that the engine changes (without pairing them)."""
    d, w = layer.cfg.head_dim, layer.cfg.width
    if w >= d:
        return ""
    diffs = [np.abs(c.out[0][..., w:] - c.q[..., w:]) for c in calls if c.out is not None]
    moved = max(float(x.max()) for x in diffs)
    if moved <= layer.ulps * eps(layer.dtype) * 4:
        return ""
    words = f"features {w}..{d - 1} should pass through unchanged ({w} of {d} rotate)"
    words += f" but change by up to {moved:.3g}"
    x = np.concatenate([c.q[..., w:].ravel() for c in calls if c.out is not None])
    o = np.concatenate([c.out[0][..., w:].ravel() for c in calls if c.out is not None])
    r = float(np.median(o / np.where(x == 0, 1.0, x)))
    if np.all(np.abs(o - r * x) <= layer.ulps * eps(layer.dtype) * np.maximum(np.abs(x), 1.0)):
        words += f": they are scaled by {r:.{_digits(layer.dtype)}f}"
    return words


def _pairing_words(layer: _Layer, calls: list[_Call]) -> str:
    """How the engine pairs the features, where that is not the config's pairing ('' where it is),
    q and k judged apart (a message names which of them is wrong).

    Each feature alone (a unit vector, exact in every dtype) is rotated at a few positions: the
    features of the engine's output that are not exactly 0 are those it mixes that one with.
    """
    cfg = layer.cfg
    d = cfg.head_dim
    top = max(int(_scalar_pos(c).max()) for c in calls)
    probe = sorted({p for p in (1, 3, 100, 1000, 30011, top) if p <= top})
    n = len(probe)
    pos = np.repeat(np.asarray(probe, dtype=np.int64), d)
    eye = np.tile(np.eye(d, dtype=np.float32), (n, 1))
    q = np.ascontiguousarray(np.broadcast_to(eye[:, None, :], (n * d, layer.heads[0], d)))
    k = np.ascontiguousarray(np.broadcast_to(eye[:, None, :], (n * d, layer.heads[1], d)))
    c = layer.run(pos, q, k)
    if c.out is None:
        return ""
    # (the config's links are those it turns by more than rounding at some probed position)
    tau = 16 * eps(layer.dtype) * max(1.0, layer.af)
    seen = np.abs(_truth(layer.rope, q[:, :1], c.pos)[:, 0]) > tau
    truth = np.asarray(seen.reshape(n, d, d).any(axis=0), dtype=bool)
    np.fill_diagonal(truth, False)
    words = []
    for t, o in enumerate(c.out):
        # (a feature the engine does not mix in stays exactly 0: any other value is a link)
        # ([j, i]: feature j reaches output feature i)
        mixed = np.asarray((np.abs(o) > 0).any(axis=1).reshape(n, d, d).any(axis=0), dtype=bool)
        np.fill_diagonal(mixed, False)
        words.append(_pairing_of(layer, calls, mixed, truth, t))
    if words[0] == words[1]:
        return words[0].replace("{the engine}", "the engine")
    named = [w.replace("{the engine}", who) for w, who in zip(words, ("q", "k"), strict=True)]
    if not words[0] or not words[1]:
        ok = "k" if not words[1] else "q"
        return f"{named[0] or named[1]} ({ok}'s pairing is the config's)"
    return "; ".join(named)


def _pairing_of(layer: _Layer, calls: list[_Call], mixed: np.ndarray, truth: np.ndarray, t: int) -> str:
    """The words of :func:`_pairing_words` for one tensor (``t``: 0 q, 1 k), ``{the engine}``
    standing for its name."""
    cfg = layer.cfg
    d, w = cfg.head_dim, cfg.width
    partner = _partners(cfg.layout, w, d)
    j = np.arange(d)
    own = np.zeros((d, d), dtype=bool)
    own[j[partner >= 0], partner[partner >= 0]] = True
    strange = mixed & ~own  # links the config does not make
    still = truth & own & ~mixed  # pairs that visibly turn in the config, not in the engine
    if not strange.any() and not still.any():
        return ""
    many = np.nonzero(mixed.sum(axis=1) > 1)[0]
    if many.size:
        f = int(many[0])
        return (
            f"{{the engine}} mixes feature {f} with features {', '.join(map(str, np.nonzero(mixed[f])[0]))}: "
            "not a rotation of feature pairs"
        )
    rotated = np.nonzero(mixed.any(axis=1))[0]
    if rotated.size == 0:
        return f"{{the engine}} rotates no feature (the config rotates {w} of {d})"
    theirs = np.where(mixed.any(axis=1), mixed.argmax(axis=1), -1)
    lay, width = "", 0
    gap = np.abs(theirs[rotated] - rotated)
    if np.all(theirs[rotated] == (rotated ^ 1)):
        lay, width = "interleaved", int(rotated.max()) + 1 + int(rotated.max() % 2 == 0)
    elif np.all(gap == gap[0]) and np.all(np.minimum(rotated, theirs[rotated]) < gap[0]):
        lay, width = "half", 2 * int(gap[0])
    if lay and width == w and lay != cfg.layout:
        words = f"{{the engine}} pairs features in the {lay!r} layout (the config's is {cfg.layout!r})"
        fn = _at(_with(cfg, layer.rope, layout=lay), layer.af)
        if all(float(layer.errors(x, fn=fn, tensors=(t,)).max()) <= 1.0 for x in calls):
            words += ", and its numbers match the config's RoPE in that layout"
        return words
    if lay and (width > w or (width < w and lay == "half")):
        lays = f"the {lay!r} layout" + ("" if lay == cfg.layout else f" (the config's is {cfg.layout!r})")
        turns = f"rotates {width} of the {d} features" if lay == "half" else f"turns features 0..{width - 1}"
        words = f"{{the engine}} {turns} in {lays} where the config rotates {w}"
        if width > w:
            words += f": features {w}..{min(width, d) - 1} should pass through unchanged"
        return words
    s0 = int(rotated.min())
    block = rotated - s0
    if (
        0 < s0
        and rotated.size == w
        and int(rotated.max()) == s0 + w - 1
        and np.array_equal(theirs[rotated] - s0, _partners(cfg.layout, w, w)[block])
    ):
        # (the config's pairing, on another slice of the head)
        words = (
            f"{{the engine}} rotates features {s0}..{s0 + w - 1} where the config rotates 0..{w - 1} "
            f"(the wrong slice of the head: rotate the first {w} features, pass the other {d - w} through)"
        )
        perm = np.concatenate([np.arange(s0, s0 + w), np.arange(s0), np.arange(s0 + w, d)])
        back = np.argsort(perm)
        truth_at = _at(layer.rope, layer.af)

        def sliced(x: np.ndarray, p: np.ndarray) -> np.ndarray:
            return truth_at(np.ascontiguousarray(x[..., perm]), p)[..., back]

        if all(float(layer.errors(x, fn=sliced, tensors=(t,)).max()) <= 1.0 for x in calls):
            words += ", and its numbers match the config's rotation of that slice"
        return words
    if still.any() and not strange.any():
        idle = np.nonzero(still.any(axis=1))[0]
        return (
            f"features {_ranges(idle)} do not turn in {{the engine}} (the config pairs them: "
            f"{cfg.layout!r} layout over {w})"
        )
    f = int(np.nonzero(strange.any(axis=1))[0][0])
    mine = int(partner[f])
    says = f"pairs it with {mine}" if mine >= 0 else "passes it through"
    return f"{{the engine}} pairs feature {f} with {int(theirs[f])} where the config {says}"


def _ranges(idx: Sequence[int] | np.ndarray) -> str:
    """``0..3, 7, 9..10``."""
    out: list[list[int]] = []
    for i in (int(x) for x in idx):
        if out and out[-1][1] == i - 1:
            out[-1][1] = i
        else:
            out.append([i, i])
    return ", ".join(f"{a}..{b}" if a != b else f"{a}" for a, b in out)


def _clamped(layer: _Layer, calls: list[_Call], first: int | None) -> tuple[str, int | None]:
    """Positions past a table read its last row (clamped) or wrap around it: words and the table's size."""
    if first is None or first <= 0:
        return "", None
    marks = {first - 1, first}
    table = getattr(layer.eng, "max_position", None)
    if table:
        marks |= {int(table) - 1, int(table)}
    truth = _at(layer.rope, layer.af)
    for cap in sorted(m for m in marks if m > 0):

        def clamp(x: np.ndarray, p: np.ndarray, cap: int = cap) -> np.ndarray:
            return truth(x, np.minimum(p, cap - 1))

        def wrap(x: np.ndarray, p: np.ndarray, cap: int = cap) -> np.ndarray:
            return truth(x, p % cap)

        at = f"from position {cap} on the engine rotates by the angle of position"
        if all(float(layer.errors(c, fn=clamp).max()) <= 1.0 for c in calls):
            return f"{at} {cap - 1}: positions clamped to a table of {cap} rows", cap
        if all(float(layer.errors(c, fn=wrap).max()) <= 1.0 for c in calls):
            return f"{at} p mod {cap}: positions wrap around a table of {cap} rows", cap
    return "", None


# -- frequencies --------------------------------------------------------------------------------
def _ladder(top: int) -> np.ndarray:
    """Positions ``1 .. 16``, then up by factors of 1.25 to ``top``: each angle predicted from the
    ones before within far less than a turn, so every turn is counted."""
    ps = list(range(1, min(top, 16) + 1))
    p = 16.0
    while p * 1.25 < top:
        p *= 1.25
        ps.append(int(p))
    if top > 16:
        ps.append(top)
    return np.unique(np.asarray(ps, dtype=np.int64))


def _pair_angles(
    layer: _Layer, xs: Sequence[np.ndarray], outs: Sequence[np.ndarray], noise: float
) -> tuple[np.ndarray, np.ndarray]:
    """Per position and pair, the angle the outputs are turned by from the inputs (over q's and
    k's heads: the angle of ``sum out * conj(in)``), and how far rounding may move it: an output
    error of ``noise`` times the data's scale per element (the rotation check's tolerance)."""
    cfg = layer.cfg
    z: Any = 0.0
    wsum: Any = 0.0
    asum: Any = 0.0
    for x, o in zip(xs, outs, strict=True):
        zx, zo = _pairs(x, cfg), _pairs(o, cfg)
        z = z + (zo * np.conj(zx)).sum(axis=1)
        wsum = wsum + (np.abs(zx) ** 2).sum(axis=1)
        scale = np.maximum(1.0, np.abs(x).max(axis=(1, 2)))[:, None]
        asum = asum + np.abs(zx).sum(axis=1) * scale
    slack = np.where(np.abs(z) > 0.5 * noise * wsum, noise, math.pi)
    return np.angle(z), slack


def _turn_rate(
    pos: np.ndarray, theta: np.ndarray, slack: np.ndarray, rel: float, bound: float = math.pi
) -> tuple[float, float] | None:
    """Every frequency ``w`` (``|w| <= bound``) whose angles ``w * p`` agree with the measured
    ones ``theta`` (mod 2 pi) within ``slack + rel * |w p|`` at each position, as an interval
    ``(lo, hi)``; ``None`` when none does.  Positions are taken in order while the turn count
    stays unambiguous."""
    lo, hi = -bound, bound
    for p, a, t in zip(pos.tolist(), theta.tolist(), slack.tolist(), strict=True):
        if not math.isfinite(a):
            return None
        t = t + rel * max(abs(lo), abs(hi)) * p
        n0 = math.ceil((lo * p - t - a) / (2 * math.pi))
        n1 = math.floor((hi * p + t - a) / (2 * math.pi))
        if n1 < n0:
            return None
        if n1 > n0:
            break
        u = a + 2 * math.pi * n0
        lo, hi = max(lo, (u - t) / p), min(hi, (u + t) / p)
        if lo > hi:
            return None
    return lo, hi


@dataclasses.dataclass
class _Frequencies:
    """The engine's frequency per pair, measured on one call at positions ``1 .. top``: ``(pair,
    the config's frequency, the interval of the engine's or None where none fits)``."""

    top: int
    pairs: list[tuple[int, float, tuple[float, float] | None]]
    #: per pair, the interval within the rotation check's own allowance (wider)
    wide: dict[int, tuple[float, float] | None] = dataclasses.field(default_factory=dict)


def _measure_frequencies(layer: _Layer, calls: list[_Call], below: float = math.inf) -> _Frequencies | None:
    """Which frequencies the engine turns at, each as the interval of every frequency consistent
    with the engine's angles at every position of one call at positions ``1 .. top``
    (:func:`_ladder`; below ``below``, a table's end), on data exact in the dtype, within the
    output's rounding and the angle kind's allowance.  The config's frequency comes from its own
    float64 rotation of the same call (per call for dynamic scalings)."""
    cfg = layer.cfg
    if isinstance(layer.rope, MRoPE):
        return None
    top = max(int(_scalar_pos(c).max()) for c in calls)
    top = int(min(top, below - 1))
    if top < 2:
        return None
    c = layer.call(_ladder(top))
    if c.out is None:
        return None
    xs = (c.q, c.k)
    want = tuple(_truth(layer.rope, x, c.pos) for x in xs)
    theta, slack = _pair_angles(layer, xs, c.out, layer.ulps * eps(layer.dtype) * max(1.0, layer.af))
    theta_t, _ = _pair_angles(layer, xs, want, 0.0)
    pos = c.pos.astype(np.float64)
    pairs: list[tuple[int, float, tuple[float, float] | None]] = []
    wides: dict[int, tuple[float, float] | None] = {}
    for i in range(cfg.width // 2):
        t = _turn_rate(pos, theta_t[:, i], np.full(pos.shape, 1e-9), 0.0)
        if t is None or t[0] <= 0.0 <= t[1]:
            continue  # (a frequency 0: proportional RoPE's idle pairs)
        iv = _turn_rate(pos, theta[:, i], slack[:, i], float(layer.angle_rel[i]))
        wide = _turn_rate(pos, theta[:, i], slack[:, i] + layer.angle_coef * pos, 0.0)
        pairs.append((i, 0.5 * (t[0] + t[1]), iv if iv is not None else wide))
        wides[i] = wide
    return _Frequencies(top, pairs, wides)


def _base_words(layer: _Layer, calls: list[_Call], freqs: _Frequencies | None) -> str:
    """Where the engine's frequencies are another base's (the config's scaling kept, or none): that
    base, in as few digits as still match the engine's numbers."""
    cfg = layer.cfg
    if freqs is None or cfg.base <= 1.0:
        return ""
    fd = float(cfg.freq_dim)
    best: list[tuple[float, float]] = []  # (relative error of the base, the base)
    for i, wt, iv in freqs.pairs:
        if iv is None or i == 0 or iv[0] <= 0.0:
            continue
        mid, width = 0.5 * (iv[0] + iv[1]), iv[1] - iv[0]
        e = 2 * i / fd
        # (plain RoPE's w_i = b**-e; or the config's frequency at base b' over base b: (b/b')**e)
        best.append((width / mid / e, math.exp(-math.log(mid) / e)))
        best.append((width / mid / e, cfg.base * math.exp(-math.log(mid / wt) / e)))
    if not best:
        return ""
    best.sort()
    tried: set[float] = set()
    for _, b in best[:4]:
        for digits in range(3, 10):
            bb = float(f"{b:.{digits}g}")
            if bb in tried or abs(bb / cfg.base - 1.0) < 1e-12:
                continue
            tried.add(bb)
            for keep in (True, False):
                scaling = cfg.scaling if keep else None
                try:
                    fn = _at(_with(cfg, layer.rope, base=bb, scaling=scaling), layer.af)
                except ValueError:
                    continue
                if all(float(layer.errors(c, fn=fn).max()) <= 1.0 for c in calls):
                    sc = type(cfg.scaling).__name__
                    what = (
                        f"the config's {sc} scaling at base {bb:g}"
                        if keep and not isinstance(cfg.scaling, Default)
                        else f"plain RoPE at base {bb:g}"
                    )
                    has = "" if isinstance(cfg.scaling, Default) else f" with {sc} scaling"
                    return (
                        f"the engine's numbers match {what} (the config's rope_theta is "
                        f"{cfg.base:g}{has}): its base is wrong"
                    )
    return ""


def _frequency_words(layer: _Layer, freqs: _Frequencies | None) -> list[str]:
    """The pairs whose frequency is not the config's, each verified (see
    :func:`_measure_frequencies`): over the config's frequency the engine's is an interval of
    factors.  A pair is listed with a factor when its interval excludes 1 (and so does its interval
    within the rotation check's own allowance: no factor the check itself cannot see) and is
    narrower than 4%;
    consecutive pairs share one factor only where their intervals overlap (the factor printed lies
    in every one of them), never by a fixed percentage; a pair whose interval excludes 1 but is
    wider is said unresolved; one whose interval is empty even with the rotation check's
    allowance turns at no single frequency."""
    if freqs is None:
        return []
    cfg, top = layer.cfg, freqs.top
    found: list[tuple[int, float, float]] = []
    unresolved: list[int] = []
    lost: list[int] = []
    for i, wt, iv in freqs.pairs:
        if iv is None:
            lost.append(i)
            continue
        lo, hi = sorted((iv[0] / wt, iv[1] / wt))
        if lo <= 1.0 <= hi:
            continue
        wide = freqs.wide.get(i)
        if wide is not None and min(wide) <= wt <= max(wide):
            continue  # (the config's frequency, within the rotation check's own allowance)
        mid = 0.5 * (lo + hi)
        if hi - lo <= 0.04 * abs(mid):
            found.append((i, lo, hi))
        else:
            unresolved.append(i)
    words = []
    if found:
        groups: list[tuple[int, int, float, float]] = []  # (first, last, the intersection)
        for i, lo, hi in found:
            if groups and groups[-1][1] == i - 1 and max(lo, groups[-1][2]) <= min(hi, groups[-1][3]):
                a, _, glo, ghi = groups[-1]
                groups[-1] = (a, i, max(lo, glo), min(hi, ghi))
            else:
                groups.append((i, i, lo, hi))
        parts = [
            f"{a}..{b} x{_ratio(lo, hi)}" if a != b else f"{a} x{_ratio(lo, hi)}"
            for a, b, lo, hi in groups[:6]
        ]
        more = f" (+{len(groups) - 6} more groups)" if len(groups) > 6 else ""
        per_call = (
            f" in a call up to position {top}" if isinstance(cfg.scaling, (DynamicNTK, LongRoPE)) else ""
        )
        words.append(f"frequencies (pair index, x the config's{per_call}) {', '.join(parts)}{more}")
    if unresolved:
        words.append(
            f"pairs {_ranges(unresolved)} turn at another frequency, by a factor {layer.dtype} cannot "
            f"resolve up to position {top}"
        )
    if lost:
        words.append(f"pairs {_ranges(lost)} turn at no single frequency up to position {top}")
    return words


def _ratio(lo: float, hi: float) -> str:
    """A factor known to lie in ``[lo, hi]`` (which excludes 1): ``1/8`` or ``4`` when that is in
    it, else a number in it, in as few digits (at least three) as keep it there."""
    mid = 0.5 * (lo + hi)
    if 0 < abs(mid) < 0.75:
        n = round(1 / mid)
        if abs(n) >= 2 and lo <= 1 / n <= hi:
            return f"1/{n}"
    n = round(mid)
    if n not in (0, 1) and lo <= n <= hi:
        return f"{n}"
    for k in range(3, 17):
        if lo <= float(f"{mid:.{k}g}") <= hi:
            return f"{mid:.{k}g}"
    return f"{mid!r}"
