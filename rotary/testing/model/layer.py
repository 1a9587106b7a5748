"""One layer type in one dtype: the engine's calls (:class:`_Call`), their data, positions and errors
against the truth (:class:`_Layer`)."""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ...multiaxis import MRoPE
from ..asserts import eps
from ..engine import (
    EngineError,
    Unsupported,
    adapter_site,
    angle_error,
    raised_by_adapter,
    round_to,
)
from .truth import Rope, _rope_config, _truth


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
