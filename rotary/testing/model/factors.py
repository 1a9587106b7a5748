"""The factors: the attention factor (measured from norms), the softmax scale and the query scale,
with the words of each."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from ... import hf
from ...scaling import LongRoPE, YaRN
from ..asserts import eps
from ..engine import raised_by_adapter
from .layer import _adapter_error, _Call, _exc, _Layer
from .report import ModelCheck


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
