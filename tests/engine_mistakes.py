"""Adapters (rotary.testing.engine's protocol) that make the mistakes the field makes, each on top
of rotary's own RoPE: the kit must catch and name every one (tests/test_model_check.py,
tests/test_model_diagnosis.py).

Each engine returns values of the dtype it was built for (its output rounded to bfloat16 or
float16, as a kernel storing that dtype does).  ``compute="dtype"`` makes it compute in that dtype
too (cos and sin rounded to it, each product and the sum rounded: litgpt's ``bf16-true``).  Each
mistake's ``planted(config)`` gives the per-pair factor it puts on the config's frequencies (``None``
where it plants none), for the property tests.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

import rotary
from rotary.scaling import Factors, Frequencies, YaRN
from rotary.testing import Unsupported
from rotary.testing.engine import EngineError
from rotary.testing.engine import round_to as to_dtype

#: YaRN factor 16 without mscale keys: the attention factor 0.1 ln 16 + 1 = 1.2773.
YARN16 = {
    "model_type": "llama",
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_hidden_layers": 2,
    "max_position_embeddings": 131072,
    "rope_theta": 1e6,
    "rope_scaling": {"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 8192},
}


def _rotate_in(rope: Any, x: np.ndarray, pos: np.ndarray, dtype: str, factor: float) -> np.ndarray:
    """``x`` rotated by ``rope`` with every operation rounded to ``dtype``: cos and sin (times
    ``factor`` over rope's own attention factor), each product, the sum."""
    c, s = (np.asarray(t, dtype=np.float32) * np.float32(factor) for t in rope.cos_sin(pos, full=True))
    c, s = to_dtype(c, dtype)[:, None, :], to_dtype(s, dtype)[:, None, :]
    w = c.shape[-1]
    r = x[..., :w]
    if rope.layout == "half":
        turned = np.concatenate([-r[..., w // 2 :], r[..., : w // 2]], axis=-1)
    else:
        turned = np.stack([-r[..., 1::2], r[..., 0::2]], axis=-1).reshape(r.shape)
    out = to_dtype(to_dtype(r * c, dtype) + to_dtype(turned * s, dtype), dtype)
    return np.concatenate([out, x[..., w:]], axis=-1)


class Rotary:
    """rotary's own RoPE for the config, rotating as an engine would (the adapter template)."""

    NAME, INSTALL = "mistake", ""

    def __init__(self, angles: str = "float32", compute: str = "float32") -> None:
        self.angles, self.compute = angles, compute

    def version(self) -> str:
        return rotary.__version__

    def rope(self, config: Mapping[str, Any], layer_type: str | None) -> Any:
        m = rotary.hf.model_rope(config, angles=self.angles)  # type: ignore[arg-type]
        self.model = m
        if m.layers:
            idx = [
                i
                for i, r in enumerate(m.layers)
                if r is not None and (layer_type is None or m.layer_types[i] == layer_type)
            ]
            self.index = idx[0]
            return m.layers[self.index]
        self.index = 0
        return rotary.hf.from_hf(config, angles=self.angles, layer_type=layer_type)  # type: ignore[arg-type]

    def apply(self, rope: Any, q: np.ndarray, k: np.ndarray, pos: np.ndarray, factor: float = 1.0) -> tuple:
        """``rope``'s rotation with cos and sin times ``factor`` (over its own attention factor), in
        float32 or, with ``compute="dtype"``, in the dtype."""
        if self.compute == "dtype" and pos.ndim == 1:
            return tuple(_rotate_in(rope, x, pos, self.dtype, factor) for x in (q, k))
        a, b = rope.apply(q, k, pos[..., None])
        return np.asarray(a) * factor, np.asarray(b) * factor

    def rotate(self, rope: Any, q: np.ndarray, k: np.ndarray, pos: np.ndarray) -> tuple[Any, Any]:
        return self.apply(rope, q, k, pos)

    def build(self, config: Mapping[str, Any], *, layer_type: str | None, dtype: str) -> Any:
        self.dtype = dtype
        rope, me = self.rope(config, layer_type), self
        model, index = self.model, self.index

        class Engine:
            angles = "float32" if me.angles == "float32" else "exact"
            softmax_scale = float(model.attention.get("softmax_scale_multiplier", 1.0))

            def rotate(self, q: np.ndarray, k: np.ndarray, pos: np.ndarray) -> tuple[Any, Any]:
                a, b = me.rotate(rope, q, k, pos)
                return to_dtype(a, dtype), to_dtype(b, dtype)

            def rotate_packed(self, q: np.ndarray, k: np.ndarray, cu: np.ndarray, off: np.ndarray) -> Any:
                """Packed documents at rotary's positions of the packing (plus their offsets)."""
                pos = np.asarray(rotary.positions.from_cu_seqlens(cu)) + np.repeat(off, np.diff(cu))
                return self.rotate(q, k, pos)

            def query_scale(self, pos: np.ndarray) -> Any:
                return me.query_scale(model, index, pos)

        return Engine()

    def query_scale(self, model: Any, index: int, pos: np.ndarray) -> Any:
        return model.query_scale(index, pos) if model.layers else None

    def truth(self, config: Mapping[str, Any]) -> Any:
        """The config's RoPE (exact angles)."""
        return Rotary("exact").rope(config, None)

    def planted(self, config: Mapping[str, Any]) -> np.ndarray | None:
        """The factor this mistake puts on each pair's frequency (``None``: none)."""
        return None


def _replaced(rope: Any, **changes: Any) -> Any:
    return rotary.RoPE.from_config(dataclasses.replace(rope.config, **changes))


def _ratio(mistake: Rotary, config: Mapping[str, Any]) -> np.ndarray:
    """The mistaken RoPE's frequencies over the config's."""
    wrong = type(mistake)("exact").rope(config, None)
    return np.asarray(wrong.inv_freq(), dtype=np.float64) / np.asarray(
        mistake.truth(config).inv_freq(), dtype=np.float64
    )


class NoAttentionFactor(Rotary):
    def rotate(self, rope, q, k, pos):  # type: ignore[no-untyped-def]
        return self.apply(rope, q, k, pos, 1.0 / rope.attention_factor)


class FactorSquared(Rotary):
    """The attention factor applied twice on cos and sin (its square)."""

    def rotate(self, rope, q, k, pos):  # type: ignore[no-untyped-def]
        return self.apply(rope, q, k, pos, rope.attention_factor)


class PlainYarnFactor(Rotary):
    """YaRN's attention factor 0.1 ln s + 1, ignoring mscale / mscale_all_dim."""

    def rotate(self, rope, q, k, pos):  # type: ignore[no-untyped-def]
        return self.apply(rope, q, k, pos, YaRN._mscale(rope.scaling.factor) / rope.attention_factor)


class Clamped(Rotary):
    def __init__(self, rows: int, compute: str = "float32") -> None:
        super().__init__(compute=compute)
        self.rows = rows

    def rotate(self, rope, q, k, pos):  # type: ignore[no-untyped-def]
        return self.apply(rope, q, k, np.minimum(pos, self.rows - 1))


class Wrapped(Clamped):
    def rotate(self, rope, q, k, pos):  # type: ignore[no-untyped-def]
        return self.apply(rope, q, k, pos % self.rows)


class Refuses(Clamped):
    """A table of ``rows`` rows that raises past its end (an engine's refusal: EngineError)."""

    def rotate(self, rope, q, k, pos):  # type: ignore[no-untyped-def]
        if pos.max() >= self.rows:
            raise EngineError(f"IndexError: position {pos.max()} past the table of {self.rows}")
        return self.apply(rope, q, k, pos)


class AdapterBug(Rotary):
    """An adapter whose own code raises (a key the config lacks): an adapter error."""

    def build(self, config, *, layer_type, dtype):  # type: ignore[no-untyped-def]
        return super().build(
            {**config, "rope_theta": config["no_such_key"]}, layer_type=layer_type, dtype=dtype
        )


class InvertedBands(Rotary):
    """Llama 3 / YaRN with the interpolation applied to the high frequencies instead of the low."""

    def rope(self, config, layer_type):  # type: ignore[no-untyped-def]
        r = super().rope(config, layer_type)
        c, s = r.config, r.config.scaling.factor
        w0 = rotary.RoPE(c.head_dim, base=c.base, rotary_dim=c.rotary_dim).inv_freq()
        inv = w0 * (1.0 + 1.0 / s - r.inv_freq() / w0)
        self.af = r.attention_factor
        return _replaced(r, scaling=Frequencies(tuple(float(x) for x in inv)))

    def rotate(self, rope, q, k, pos):  # type: ignore[no-untyped-def]
        return self.apply(rope, q, k, pos, self.af)

    def planted(self, config):  # type: ignore[no-untyped-def]
        return _ratio(self, config)


class OtherLayout(Rotary):
    def rope(self, config, layer_type):  # type: ignore[no-untyped-def]
        r = super().rope(config, layer_type)
        return _replaced(r, layout="half" if r.layout == "interleaved" else "interleaved")


class NoScaling(Rotary):
    """The scaling dropped (its attention factor kept: the frequencies alone are wrong)."""

    def rope(self, config, layer_type):  # type: ignore[no-untyped-def]
        r = super().rope(config, layer_type)
        self.af = r.attention_factor
        return _replaced(r, scaling=None)

    def rotate(self, rope, q, k, pos):  # type: ignore[no-untyped-def]
        return self.apply(rope, q, k, pos, self.af)

    def planted(self, config):  # type: ignore[no-untyped-def]
        return _ratio(self, config)


class WrongOriginalLength(Rotary):
    """YaRN with ``max_position_embeddings`` as the original context (llama.cpp's ``n_ctx_orig``
    set from the context length, not the scaling's original)."""

    def rope(self, config, layer_type):  # type: ignore[no-untyped-def]
        r = super().rope(config, layer_type)
        wrong = dataclasses.replace(
            r.scaling, original_max_position_embeddings=config["max_position_embeddings"]
        )
        return _replaced(r, scaling=wrong)

    def planted(self, config):  # type: ignore[no-untyped-def]
        return _ratio(self, config)


class Llama3Factor8(Rotary):
    def rope(self, config, layer_type):  # type: ignore[no-untyped-def]
        r = super().rope(config, layer_type)
        return _replaced(r, scaling=dataclasses.replace(r.scaling, factor=8.0))


class LongFactorsAlways(Rotary):
    def rope(self, config, layer_type):  # type: ignore[no-untyped-def]
        r = super().rope(config, layer_type)
        self.af = r.attention_factor
        return _replaced(r, scaling=Factors(r.scaling.long_factor))

    def rotate(self, rope, q, k, pos):  # type: ignore[no-untyped-def]
        return self.apply(rope, q, k, pos, self.af)


class WholeHead(Rotary):
    """Partial rotary applied to every feature (rotary_dim ignored; the frequencies still those of
    the rotated width)."""

    def rope(self, config, layer_type):  # type: ignore[no-untyped-def]
        r = super().rope(config, layer_type)
        self.width = r.config.width
        return r

    def rotate(self, rope, q, k, pos):  # type: ignore[no-untyped-def]
        full = rotary.RoPE(q.shape[-1], base=rope.base ** (q.shape[-1] / self.width), angles=self.angles)
        return self.apply(full, q, k, pos)


class TemporalRowOnly(Rotary):
    """M-RoPE read as a 1-D RoPE of the temporal row (right at text positions only)."""

    def rotate(self, rope, q, k, pos):  # type: ignore[no-untyped-def]
        return rope.apply(q, k, np.broadcast_to(pos[:1], pos.shape)[..., None])


class NoQueryScale(Rotary):
    def query_scale(self, model, index, pos):  # type: ignore[no-untyped-def]
        return None


class QueryScaleFromIndex(Rotary):
    """Megatron-Bridge's Ministral 3: the query scale at the token's index in the call, not its
    position."""

    def query_scale(self, model, index, pos):  # type: ignore[no-untyped-def]
        return model.query_scale(index, np.arange(pos.shape[-1]))


class NoSoftmaxScale(Rotary):
    def build(self, config, *, layer_type, dtype):  # type: ignore[no-untyped-def]
        eng = super().build(config, layer_type=layer_type, dtype=dtype)
        eng.softmax_scale = 1.0
        return eng


class NoMRoPE(Rotary):
    def build(self, config, *, layer_type, dtype):  # type: ignore[no-untyped-def]
        if rotary.hf.model_rope(config).layers and isinstance(
            rotary.hf.model_rope(config).layers[0], rotary.MRoPE
        ):
            raise Unsupported("this engine has no M-RoPE")
        return super().build(config, layer_type=layer_type, dtype=dtype)


class InPlace(Rotary):
    def rotate(self, rope, q, k, pos):  # type: ignore[no-untyped-def]
        a, b = rope.apply(q, k, pos[..., None])
        q[...] = 0.0
        return a, b


# module-level instances for the command line (``--against engine_mistakes:CLAMPED``)
CLAMPED = Clamped(4096)
NO_MROPE = NoMRoPE()


class FoldedFactor(Rotary):
    """torchtitan's gpt-oss: cos and sin unscaled, the attention factor's square in the softmax
    scale: the logits are the config's (not a mistake)."""

    def build(self, config, *, layer_type, dtype):  # type: ignore[no-untyped-def]
        eng = super().build(config, layer_type=layer_type, dtype=dtype)
        rope = self.rope(config, layer_type)
        eng.softmax_scale = eng.softmax_scale * rope.attention_factor**2
        self.rotate = lambda rope, q, k, pos: self.apply(rope, q, k, pos, 1.0 / rope.attention_factor)  # type: ignore[method-assign]
        return eng


class FactorTwice(FoldedFactor):
    """The attention factor on cos and sin and, again, in the softmax scale (sglang's YaRN bug)."""

    def build(self, config, *, layer_type, dtype):  # type: ignore[no-untyped-def]
        eng = super().build(config, layer_type=layer_type, dtype=dtype)
        self.rotate = lambda rope, q, k, pos: self.apply(rope, q, k, pos)  # type: ignore[method-assign]
        return eng


class StackBug(Rotary):
    """The adapter's own bug, raised inside NumPy: ``np.stack`` of q and k, whose head counts
    differ (an adapter error, not the engine raising on every call)."""

    def rotate(self, rope, q, k, pos):  # type: ignore[no-untyped-def]
        both = np.stack([q, k])  # (q and k have different head counts: NumPy raises)
        return self.apply(rope, both[0], both[1], pos)


class PositionsInFloat16(Rotary):
    """Positions cast to float16 before the angles: right up to 2048, wrong from 2049 on (2049
    is 2048 in float16)."""

    def rotate(self, rope, q, k, pos):  # type: ignore[no-untyped-def]
        with np.errstate(over="ignore"):
            p = pos.astype(np.float16).astype(np.float64)
        inf = ~np.isfinite(p)  # (from 65520 on: cos(inf) is NaN, as in an engine)
        a, b = (np.array(t, dtype=np.float64) for t in self.apply(rope, q, k, np.where(inf, 0.0, p)))
        a[inf], b[inf] = np.nan, np.nan
        return a, b


class PositionsInDataDtype(Rotary):
    """Positions built in the data's dtype before the angles (rotary-embedding-torch's
    ``arange(n, dtype=t.dtype) + offset``): exact in float32; in bfloat16 wrong from 257 (256 in
    bfloat16), in float16 from 2049 and infinite from 65520 on, where cos and sin are NaN and the
    rotated features with them (the features past the rotated width pass through)."""

    def rotate(self, rope, q, k, pos):  # type: ignore[no-untyped-def]
        with np.errstate(over="ignore"):
            p = to_dtype(pos.astype(np.float32), self.dtype).astype(np.float64)
        inf = ~np.isfinite(p)
        a, b = (np.array(t, dtype=np.float64) for t in self.apply(rope, q, k, np.where(inf, 0.0, p)))
        w = rope.config.width
        a[inf, :, :w], b[inf, :, :w] = np.nan, np.nan
        return a, b


# -- issue 43's planted mistakes (tests/test_kit_words.py) ------------------------------------------
class OffByOne(Rotary):
    """Every position one too far (a KV cache's length added twice, a 1-based position)."""

    def rotate(self, rope, q, k, pos):  # type: ignore[no-untyped-def]
        return self.apply(rope, q, k, pos + 1)


class Base(Rotary):
    """The right recipe at another base (``rope_theta`` mistyped, or an alpha folded in)."""

    def __init__(self, base: float = 10001.0, compute: str = "float32") -> None:
        super().__init__(compute=compute)
        self.base = base

    def rope(self, config, layer_type):  # type: ignore[no-untyped-def]
        return _replaced(super().rope(config, layer_type), base=self.base)

    def planted(self, config):  # type: ignore[no-untyped-def]
        truth = self.truth(config)
        wrong = _replaced(truth, base=self.base)
        return np.asarray(wrong.inv_freq(), dtype=np.float64) / np.asarray(truth.inv_freq(), dtype=np.float64)


class SinFlipped(Rotary):
    """``x cos - rotate_half(x) sin``: the rotation by -pos."""

    def rotate(self, rope, q, k, pos):  # type: ignore[no-untyped-def]
        return self.apply(rope, q, k, -pos)


class WrongSlice(Rotary):
    """Partial rotary applied to the last ``rotary_dim`` features instead of the first."""

    def rotate(self, rope, q, k, pos):  # type: ignore[no-untyped-def]
        d, w = q.shape[-1], rope.config.width
        sub = rotary.RoPE(w, base=rope.base, layout=rope.layout, angles=self.angles)

        def one(x):  # type: ignore[no-untyped-def]
            y = np.asarray(sub.rotate(np.ascontiguousarray(x[..., d - w :]), pos[..., None]))
            return np.concatenate([x[..., : d - w], y], axis=-1)

        return one(q), one(k)


class MixedLayouts(Rotary):
    """q rotated in the config's layout, k in the other."""

    def rotate(self, rope, q, k, pos):  # type: ignore[no-untyped-def]
        other = _replaced(rope, layout="half" if rope.layout == "interleaved" else "interleaved")
        return self.apply(rope, q, k, pos)[0], self.apply(other, q, k, pos)[1]


class FactorOnQOnly(Rotary):
    """The attention factor on q's cos and sin only (k's unscaled)."""

    def rotate(self, rope, q, k, pos):  # type: ignore[no-untyped-def]
        return self.apply(rope, q, k, pos)[0], self.apply(rope, q, k, pos, 1.0 / rope.attention_factor)[1]


class Llama3Shifted(Rotary):
    """Llama 3's bands one pair late: pair ``i`` scaled as the config scales pair ``i - 1``."""

    def rope(self, config, layer_type):  # type: ignore[no-untyped-def]
        r = super().rope(config, layer_type)
        c = r.config
        plain = rotary.RoPE(c.head_dim, base=c.base, rotary_dim=c.rotary_dim)
        w0 = np.asarray(plain.inv_freq(), dtype=np.float64)
        ratio = np.asarray(r.inv_freq(), dtype=np.float64) / w0
        shifted = w0 * np.concatenate([[1.0], ratio[:-1]])
        return _replaced(r, scaling=Frequencies(tuple(float(x) for x in shifted)))

    def planted(self, config):  # type: ignore[no-untyped-def]
        return _ratio(self, config)


class NtkAlpha(Rotary):
    """Dynamic NTK read as static NTK-alpha: base ``b * alpha ** (d / (d - 2))`` at every length."""

    def rope(self, config, layer_type):  # type: ignore[no-untyped-def]
        r = super().rope(config, layer_type)
        d, alpha = r.config.width, float(config["rope_scaling"]["factor"])
        return _replaced(r, base=r.base * alpha ** (d / (d - 2)), scaling=None)


class DeclaredExact(Rotary):
    """Angles formed in float32 (``pos * inv_freq``), declared ``angles = "exact"``."""

    def build(self, config, *, layer_type, dtype):  # type: ignore[no-untyped-def]
        eng = super().build(config, layer_type=layer_type, dtype=dtype)
        type(eng).angles = "exact"
        return eng


class TruncateIgnored(Rotary):
    """YaRN's ``truncate: false`` ignored (the correction range rounded to whole pairs)."""

    def rope(self, config, layer_type):  # type: ignore[no-untyped-def]
        r = super().rope(config, layer_type)
        return _replaced(r, scaling=dataclasses.replace(r.scaling, truncate=True))

    def planted(self, config):  # type: ignore[no-untyped-def]
        return _ratio(self, config)


class TokenIndexTable(Rotary):
    """A cos/sin table indexed by the token's index in the call, not its position."""

    def rotate(self, rope, q, k, pos):  # type: ignore[no-untyped-def]
        return self.apply(rope, q, k, np.broadcast_to(np.arange(pos.shape[-1]), pos.shape).copy())


class TokenCountTable(Rotary):
    """A cos/sin table of as many rows as the call has tokens (positions past it raise)."""

    def rotate(self, rope, q, k, pos):  # type: ignore[no-untyped-def]
        n = pos.shape[-1]
        if pos.max() >= n:
            raise EngineError(f"IndexError: index {pos.max()} is out of bounds for axis 0 with size {n}")
        return self.apply(rope, q, k, pos)


class LongRopePerToken(Rotary):
    """LongRoPE's short factors below the original context and long ones from it on, per token
    (vLLM's and SGLang's choice; transformers chooses one set per call)."""

    def rotate(self, rope, q, k, pos):  # type: ignore[no-untyped-def]
        sc = rope.scaling
        out = []
        for fac in (sc.short_factor, sc.long_factor):
            r = _replaced(rope, scaling=Factors(fac))
            out.append(self.apply(r, q, k, pos, rope.attention_factor / r.attention_factor))
        long = (pos >= sc.original_max_position_embeddings)[:, None, None]
        return tuple(np.where(long, b, a) for a, b in zip(*out, strict=True))


class CosSinSwapped(Rotary):
    """``x sin + rotate_half(x) cos``: cos and sin swapped."""

    def rotate(self, rope, q, k, pos):  # type: ignore[no-untyped-def]
        c, s = (np.asarray(t, dtype=np.float64) for t in rope.cos_sin(pos, full=True))
        w = c.shape[-1]

        def one(x):  # type: ignore[no-untyped-def]
            r = x[..., :w]
            if rope.layout == "half":
                turned = np.concatenate([-r[..., w // 2 :], r[..., : w // 2]], axis=-1)
            else:
                turned = np.stack([-r[..., 1::2], r[..., 0::2]], axis=-1).reshape(r.shape)
            return np.concatenate([r * s[:, None] + turned * c[:, None], x[..., w:]], axis=-1)

        return one(q), one(k)


class HeadDimExponents(Rotary):
    """Partial rotary with ``inv_freq = base**(-2i/head_dim)`` (exponents over the whole head)."""

    def rope(self, config, layer_type):  # type: ignore[no-untyped-def]
        r = super().rope(config, layer_type)
        c = r.config
        return _replaced(r, base=c.base ** (c.width / c.head_dim))

    def planted(self, config):  # type: ignore[no-untyped-def]
        return _ratio(self, config)


class LongRopeLate(Rotary):
    """LongRoPE's long factors when a position exceeds the original context (SGLang's ``>``), one
    token late against transformers' ``max(pos) + 1 > original``."""

    def rotate(self, rope, q, k, pos):  # type: ignore[no-untyped-def]
        sc = rope.scaling
        fac = sc.long_factor if pos.max() > sc.original_max_position_embeddings else sc.short_factor
        r = _replaced(rope, scaling=Factors(fac))
        return self.apply(r, q, k, pos, rope.attention_factor / r.attention_factor)


class StatefulDynamic(Rotary):
    """Dynamic NTK as transformers' module keeps it: the frequencies grown for the longest call
    so far, kept for later calls of ``max_position_embeddings`` tokens or more (reset only below)."""

    def build(self, config, *, layer_type, dtype):  # type: ignore[no-untyped-def]
        self.cached = int(config["max_position_embeddings"])
        return super().build(config, layer_type=layer_type, dtype=dtype)

    def rotate(self, rope, q, k, pos):  # type: ignore[no-untyped-def]
        sc, c = rope.scaling, rope.config
        big_l, n = int(sc.max_position_embeddings), int(pos.max()) + 1
        self.cached = max(self.cached, n)
        if n < big_l and self.cached > big_l:
            self.cached = big_l
        s = self.cached
        base = (
            c.base * (sc.factor * s / big_l - (sc.factor - 1)) ** (c.width / (c.width - 2))
            if s > big_l
            else c.base
        )
        return self.apply(_replaced(rope, base=base, scaling=None), q, k, pos)


class MRopeRoundRobin(Rotary):
    """Qwen2-VL's consecutive M-RoPE sections laid out round robin (Qwen3-VL's layout, as
    transformers' ``apply_interleaved_mrope`` assigns rows for any sections): MaxText's M-RoPE."""

    def rope(self, config, layer_type):  # type: ignore[no-untyped-def]
        r = super().rope(config, layer_type)
        c, nr, n = r.rope.config, len(r.sections), sum(r.sections)
        rr = [next((j for j in range(1, nr) if i % nr == j and i < nr * r.sections[j]), 0) for i in range(n)]
        counts = tuple(rr.count(j) for j in range(nr))
        return rotary.MRoPE(c.head_dim, counts, rows=rr, base=c.base, layout=c.layout, angles=self.angles)
