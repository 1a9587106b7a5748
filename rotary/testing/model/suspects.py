"""Known mistakes of the frequencies (no scaling, exponents over the head, base 10000, bands or ramp
inverted, a hard-coded factor, YaRN's truncate or original context), with those of per-call
scalings and M-RoPE."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from ...multiaxis import MRoPE
from ...scaling import Default, Frequencies, Llama3, LongRoPE, YaRN
from .layer import _Layer
from .mrope import _mrope_suspects
from .per_call import _longrope_suspects
from .truth import _at, _with


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
        out += _longrope_suspects(layer, sc)
    if isinstance(rope, MRoPE):
        out += _mrope_suspects(layer, rope)
    return out
