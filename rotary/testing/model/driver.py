"""The driver: :func:`check_model_rope` over layer types and dtypes, each layer's checks, and the
rotation check (its failure diagnosed by :mod:`.diagnosis`)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ... import hf
from ..engine import Unsupported, adapter_files, raised_by_adapter
from .configs import _case_checks, load_config, make_adapter
from .diagnosis import _diagnose
from .factors import _attention_factor, _measure_factor, _query_scale, _softmax_scale
from .layer import _adapter_error, _Call, _exc, _Layer, _scalar_pos, _spread
from .packed import _packed
from .per_call import _switch_lengths
from .positions import _positions
from .report import CONFIG_CHECKS, MODEL_CHECKS, PACKED_CHECKS, ModelCheck, ModelRopeReport, Status
from .truth import Rope, _context, _layers, _max_positions


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


def _spread_calls(layer: _Layer, pos: np.ndarray) -> list[_Call]:
    """One call over every spread position; where the engine refuses it, one call per position
    (so the refused positions are known)."""
    c = layer.call(pos)
    if c.out is not None:
        return [c]
    return [layer.call(pos[i : i + 1]) for i in range(pos.shape[0])]


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
