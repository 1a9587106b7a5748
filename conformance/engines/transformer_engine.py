"""Transformer Engine 2.20.2: its pure-PyTorch RoPE (``transformer_engine/pytorch/attention/rope.py``).

Imported as ``conformance.engines.transformer_engine`` (the engine's own package is never imported
by that name here: its ``__init__`` needs the CUDA core library).

Install (CPU, tested: 46 s, venv 974 MB, torch 0.75 GB of it)
-------------------------------------------------------------
The ``transformer-engine`` 2.20.2 wheel is a pure-Python meta package; the compiled parts
(``transformer_engine_torch``, ``libtransformer_engine.so``) come from CUDA-only packages, and
``import transformer_engine`` raises on a machine without them.  The wheel is unzipped into a 3.11
venv's site-packages and ``rope.py`` is loaded by file path, with its two compiled imports
(``transformer_engine_torch``, used only by the fused path, and ``cpp_extensions.fused_attn.QKVFormat``)
stubbed for the time of the load.  Where the real extension is importable (a GPU machine) the real
module is imported instead.  No 2.20.0 is on the registry: 2.20.2 is the 2.20 release.  See ``INSTALL``.

Code path
---------
``rope.py`` ``RotaryPositionEmbedding(dim, rotary_percent, seq_len_interpolation_factor,
pretrained_max_position_embeddings, rotary_base, interleaved).forward(max_seq_len, offset)`` ->
the float32 angle table ``emb [seq, 1, 1, rot_dim]`` (``inv_freq = 1 / base ** (arange(0, dim, 2) /
dim)`` with ``dim = int(head_dim * rotary_percent)``; positions ``arange(max_seq_len) + offset`` in
float32, autocast off), and ``apply_rotary_pos_emb(t, freqs, tensor_format="sbhd",
interleaved=, fused=False)`` -> ``_apply_rotary_pos_emb_base``: ``cos(freqs).to(t.dtype)``,
``t * cos + rotate_half(t) * sin`` in ``t``'s dtype on the first ``rot_dim`` features, the rest passed
through.  (``fused=True`` calls ``tex.fused_rope_forward``, CUDA only, not run here.)  Each run of
consecutive positions is asked as ``forward(run_length, offset=run_start)``: without
``pretrained_max_position_embeddings`` a row depends on its position only, so these are the rows of
a full table, bit for bit.  ``max_position`` is ``None`` (TE builds the table for the length asked).
``torch.cuda.current_device`` (used for ``inv_freq``'s device) is patched to return ``"cpu"``.

How a config is mapped
----------------------
TE reads no model config and has no model files: this is a *user port* through its documented API,
as someone moving a Hugging Face model onto TE would write it: ``rotary_base`` = ``rope_theta``
(``rotary_emb_base`` for GPT-NeoX; Gemma 3's sliding layers ``rope_local_base_freq``),
``rotary_percent`` = ``partial_rotary_factor`` / ``rotary_pct`` / ``rotary_dim / head_dim``,
``interleaved=True`` for GPT-J, and a ``linear`` rope scaling as ``seq_len_interpolation_factor``
(the docstring: "If not None, discrete positions will be interpolated by this factor").  TE has no
NTK, Llama 3, YaRN, LongRoPE or multi-axis RoPE: those raise :class:`Unsupported`.

Expresses
---------
Plain RoPE (half or interleaved), partial rotary, per-layer-type bases (one module per type), and,
on paper, linear interpolation (ignored in practice, below).  Not: dynamic NTK, Llama 3, YaRN (no
attention factor either), LongRoPE, M-RoPE (``Unsupported``).  No softmax scale or query scale.

Design choices a reader of the report needs
-------------------------------------------
* ``seq_len_interpolation_factor`` takes effect only together with
  ``pretrained_max_position_embeddings`` (``forward``: ``if pretrained is not None and factor is not
  None``); alone it is silently ignored, contrary to its docstring.  With both, positions are divided
  by the factor while ``max_seq_len <= pretrained * factor``, and by ``max_seq_len / pretrained``
  beyond ("dynamic linear scaling", inherited from NeMo), so a row then depends on the table length.
* Packed input (the ``thd`` case): ``rotate_packed`` calls ``apply_rotary_pos_emb`` with
  ``tensor_format="thd"``, ``cu_seqlens`` (int32) and, for a ragged batch continuing at offsets,
  ``start_positions`` (int32, one per sequence), on one table from position 0
  (``forward(max(offset + length))``); the unfused path splits the row by ``cu_seqlens`` and rotates
  sequence ``i`` by ``freqs[start_positions[i]:]``.
* Context parallelism: :func:`build_context_parallel` runs TE's own CP slicing
  (``_get_freqs_on_this_cp_rank``: chunks ``r`` and ``2 cp - 1 - r``) for sbhd, and the unfused thd
  path (``cu_seqlens // cp_size``), which needs no process group, every rank in this process.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import sys
import types
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from rotary.testing.engine import Unsupported

__all__ = ["INSTALL", "NAME", "PYTHON", "build", "build_context_parallel", "version"]

NAME = "transformer-engine"
PYTHON = "3.11"
INSTALL = """\
python3 -m venv $ENGINES/transformer_engine/venv && cd $ENGINES/transformer_engine
venv/bin/pip install torch==2.13.0 numpy array-api-compat
venv/bin/pip download --no-deps transformer-engine==2.20.2 -d dl
(cd venv/lib/python3.11/site-packages && unzip -q -o ../../../../dl/transformer_engine-2.20.2-*.whl)
venv/bin/pip install --no-deps -e "$ROTARY" array-api-compat"""

_DTYPES = ("float32", "bfloat16", "float16")
_ROPE: Any = None


def version() -> str:
    """Transformer Engine's version; ``ImportError`` with the install recipe when it is missing."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        if importlib.util.find_spec("transformer_engine") is None:
            raise PackageNotFoundError("transformer_engine")
        return dist_version("transformer-engine")
    except PackageNotFoundError as e:
        raise ImportError(f"transformer-engine is not installed; CPU recipe:\n{INSTALL}") from e


def _rope_module() -> Any:
    """TE's ``rope.py``: the real module where the compiled extension imports, else loaded by path
    with the extension stubbed (the stubs are removed from ``sys.modules`` afterwards)."""
    global _ROPE
    if _ROPE is not None:
        return _ROPE
    version()
    if importlib.util.find_spec("transformer_engine_torch") is not None:  # pragma: no cover (GPU)
        _ROPE = importlib.import_module("transformer_engine.pytorch.attention.rope")
        return _ROPE
    spec = importlib.util.find_spec("transformer_engine")
    assert spec is not None and spec.submodule_search_locations
    path = Path(next(iter(spec.submodule_search_locations))) / "pytorch" / "attention" / "rope.py"

    def fused(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("Transformer Engine's fused RoPE needs its CUDA extension (stubbed on CPU)")

    tex = types.ModuleType("transformer_engine_torch")
    tex.__dict__.update(
        {
            n: fused
            for n in (
                "fused_rope_forward",
                "fused_rope_backward",
                "fused_qkv_rope_forward",
                "fused_qkv_rope_backward",
            )
        }
    )
    fa = types.ModuleType("transformer_engine.pytorch.cpp_extensions.fused_attn")
    fa.__dict__["QKVFormat"] = {"sbhd": 0, "bshd": 1, "thd": 2}
    stubs = {"transformer_engine_torch": tex, fa.__name__: fa}
    added = [n for n in stubs if n not in sys.modules]
    sys.modules.update({n: stubs[n] for n in added})
    try:
        mspec = importlib.util.spec_from_file_location("_transformer_engine_rope", path)
        assert mspec is not None and mspec.loader is not None
        mod = importlib.util.module_from_spec(mspec)
        mspec.loader.exec_module(mod)
    finally:
        for n in added:
            sys.modules.pop(n, None)
    _ROPE = mod
    return mod


@contextlib.contextmanager
def _cpu() -> Iterator[None]:
    """``torch.cuda.current_device() -> "cpu"`` for the time of an engine call."""
    import torch

    saved = torch.cuda.current_device
    torch.cuda.current_device = lambda: "cpu"
    try:
        yield
    finally:
        torch.cuda.current_device = saved


def _rope_params(config: Mapping[str, Any], layer_type: str | None) -> dict[str, Any]:
    """The RoPE part of a config as a porter reads it (legacy ``rope_scaling`` or ``rope_parameters``)."""
    rp = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    if layer_type is not None and isinstance(rp.get(layer_type), Mapping):
        rp = dict(rp[layer_type])
    return rp


def _port(config: Mapping[str, Any], layer_type: str | None) -> dict[str, Any]:
    """``RotaryPositionEmbedding`` arguments for ``config``: the user port the module doc describes."""
    mt = config.get("model_type")
    rp = _rope_params(config, layer_type)
    rope_type = rp.get("rope_type") or rp.get("type") or "default"
    if "mrope_section" in rp or rope_type == "mrope":
        raise Unsupported("Transformer Engine has no multimodal (M-RoPE) rotary embedding")
    if rope_type not in ("default", "linear"):
        raise Unsupported(
            f"Transformer Engine's RotaryPositionEmbedding has no {rope_type!r} scaling "
            "(only rotary_base, rotary_percent and linear position interpolation)"
        )
    if "qk_rope_head_dim" in config:
        head_dim = int(config["qk_rope_head_dim"])
    elif mt == "gptj":
        head_dim = int(config["n_embd"]) // int(config["n_head"])
    else:
        head_dim = int(config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"])
    base = config.get("rope_theta", rp.get("rope_theta", config.get("rotary_emb_base", 10000.0)))
    if mt in ("gemma3", "gemma3_text") and layer_type == "sliding_attention":
        base = config.get("rope_local_base_freq", rp.get("rope_theta", 10000.0))
        rope_type = "default"
    if "partial_rotary_factor" in config or "partial_rotary_factor" in rp:
        percent = float(config.get("partial_rotary_factor", rp.get("partial_rotary_factor")))
    elif "rotary_pct" in config:
        percent = float(config["rotary_pct"])
    elif config.get("rotary_dim"):
        percent = int(config["rotary_dim"]) / head_dim
    else:
        percent = 1.0
    return {
        "dim": head_dim,
        "rotary_percent": percent,
        "rotary_base": float(base),
        "seq_len_interpolation_factor": float(rp["factor"]) if rope_type == "linear" else None,
        "interleaved": mt == "gptj",
    }


def _runs(pos: np.ndarray) -> list[tuple[int, int]]:
    cuts = np.flatnonzero(np.diff(pos) != 1) + 1
    return [(int(c[0]), len(c)) for c in np.split(pos, cuts)]


def _cp_index(starts: np.ndarray, lengths: np.ndarray, cp: int, rank: int) -> np.ndarray:
    """The tokens rank ``rank`` of ``cp`` holds: chunks ``rank`` and ``2 cp - 1 - rank`` of each sequence."""
    parts = []
    for s, n in zip(starts, lengths):
        c = int(n) // (2 * cp)
        lo = (2 * cp - 1 - rank) * c
        parts += [s + np.arange(rank * c, (rank + 1) * c), s + np.arange(lo, lo + c)]
    return np.concatenate(parts)


class _TERope:
    """Transformer Engine's RoPE for one config, layer type and dtype."""

    angles = "float32"
    max_position: int | None = None
    softmax_scale = 1.0

    def __init__(self, config: Mapping[str, Any], layer_type: str | None, dtype: str) -> None:
        import torch

        if dtype not in _DTYPES:
            raise Unsupported(f"dtype {dtype!r}")
        self.args = _port(config, layer_type)
        self.dtype = getattr(torch, dtype)
        te = _rope_module()
        self._apply_fn = te.apply_rotary_pos_emb
        with _cpu():
            self.module = te.RotaryPositionEmbedding(**self.args)

    def _freqs(self, pos: np.ndarray) -> Any:
        import torch

        with _cpu():
            return torch.cat([self.module(n, offset=s) for s, n in _runs(pos)])

    def _apply(self, x: np.ndarray, freqs: Any, **kw: Any) -> np.ndarray:
        import torch

        t = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(self.dtype)
        thd = kw.get("tensor_format") == "thd"
        y = self._apply_fn(
            t if thd else t[:, None],
            freqs,
            interleaved=self.args["interleaved"],
            fused=False,
            **({"tensor_format": "sbhd"} | kw),
        )
        return (y if thd else y[:, 0]).float().numpy()

    def rotate(self, q: np.ndarray, k: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(q, k)`` rotated by TE at ``positions`` (float32 NumPy arrays)."""
        freqs = self._freqs(np.asarray(positions, dtype=np.int64))
        return self._apply(q, freqs), self._apply(k, freqs)

    def rotate_packed(
        self, q: np.ndarray, k: np.ndarray, cu_seqlens: np.ndarray, offsets: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Packed documents in TE's ``thd`` format: one table ``forward(max_seq_len)`` from
        position 0 long enough for every document, ``apply_rotary_pos_emb(t, freqs,
        tensor_format="thd", cu_seqlens=<int32>, start_positions=<offsets>, fused=False)``
        (``start_positions`` only where some document has an offset: packed training passes none)."""
        import torch

        cu = np.asarray(cu_seqlens, dtype=np.int64)
        off = np.asarray(offsets, dtype=np.int64)
        with _cpu():
            freqs = self.module(int((off + np.diff(cu)).max()))
        kw: dict[str, Any] = {"tensor_format": "thd", "cu_seqlens": torch.from_numpy(cu.astype(np.int32))}
        if off.any():
            kw["start_positions"] = torch.from_numpy(off.astype(np.int32))
        return self._apply(q, freqs, **kw), self._apply(k, freqs, **kw)


class _TECPRope(_TERope):
    """The same RoPE through TE's context-parallel slicing, every rank run in this process."""

    def __init__(
        self, config: Mapping[str, Any], layer_type: str | None, dtype: str, cp_size: int, packed: bool
    ) -> None:
        super().__init__(config, layer_type, dtype)
        self.cp_size, self.packed = cp_size, packed

    def rotate(self, q: np.ndarray, k: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Positions: ``0..S-1`` (sbhd) or packed sequences each ``0..S_i-1`` (thd), each ``S_i`` a
        multiple of ``2 * cp_size``; rank ``r`` holds chunks ``r`` and ``2 cp - 1 - r`` of each."""
        import torch

        pos = np.asarray(positions, dtype=np.int64)
        starts = np.flatnonzero(pos == 0)
        lengths = np.diff(np.append(starts, len(pos)))
        cp = self.cp_size
        if not (
            starts.size
            and starts[0] == 0
            and all(np.array_equal(pos[s : s + n], np.arange(n)) for s, n in zip(starts, lengths))
        ):
            raise Unsupported("context parallelism rotates whole sequences 0..S-1")
        if np.any(lengths % (2 * cp)) or (not self.packed and len(lengths) > 1):
            raise Unsupported(f"CP needs sequences of a multiple of 2 * cp_size = {2 * cp} (sbhd: one)")
        freqs = self._freqs(np.arange(int(lengths.max())))
        outs = [np.empty_like(q), np.empty_like(k)]
        for r in range(cp):
            idx = _cp_index(starts, lengths, cp, r)
            kw: dict[str, Any] = {"cp_size": cp, "cp_rank": r}
            if self.packed:
                cu = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int32)
                kw |= {"tensor_format": "thd", "cu_seqlens": cu}
            for o, x in zip(outs, (q, k)):
                o[idx] = self._apply(x[idx], freqs, **kw)
        return outs[0], outs[1]


def build(config: Mapping[str, Any], *, layer_type: str | None, dtype: str) -> _TERope:
    """TE's RoPE for ``config``, ported through its documented API (see the module doc)."""
    return _TERope(config, layer_type, dtype)


def build_context_parallel(
    config: Mapping[str, Any], *, layer_type: str | None, dtype: str, cp_size: int = 2, packed: bool = False
) -> _TERope:
    """:func:`build`, rotating through TE's context-parallel slicing with ``cp_size`` ranks
    (``packed``: the thd format; else sbhd)."""
    if cp_size < 1:
        raise ValueError("cp_size >= 1")
    return _TECPRope(config, layer_type, dtype, cp_size, packed)
