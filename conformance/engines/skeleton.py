"""A skeleton adapter: copy it to ``conformance/engines/<your_engine>.py`` (or anywhere
importable) and replace each block marked ``ENGINE:`` with your engine's own code.

As committed, its "engine" is a stand-in built from ``rotary`` that works the way llama.cpp and
Meta's code do: its converter reorders the q/k features of a half-layout checkpoint so that the
engine rotates adjacent pairs.  It passes on every case it can express
(``tests/test_skeleton_adapter.py``)::

    python -m conformance --against conformance.engines.skeleton --config yarn

The protocol (:mod:`rotary.testing.engine`) in six rules:

1. ``build(config, *, layer_type, dtype)`` reads the Hugging Face config **as your engine reads
   it** (its own config code, defaults and tables), for one layer type (``None``: the model's
   only RoPE; see :func:`build`) and one dtype.  An engine with no config reader (each model's
   RoPE written in its code) maps the config to its per-model parameters as its own converter or
   examples do, and is certified with the config of the checkpoint each entry ports: a failure
   then means the shipped parameters disagree with it.  What it cannot express raises
   :class:`Unsupported` with the reason.
2. ``q``/``k`` arrive in the **Hugging Face checkpoint's feature order**.  If your engine's
   converter permutes the q/k weights (llama.cpp's ``convert_hf_to_gguf.py``, Meta's), apply that
   permutation before your engine and its inverse after (:func:`_converter_order`).  If your
   library ships no converter, apply the permutation a port of the checkpoint must apply
   (:func:`rotary.testing.engine.converter_order`) and say so in your docstring.  If it takes
   only an offset, not positions, call it once per run of consecutive positions
   (:func:`rotary.testing.engine.offset_runs`): the kit's positions are not contiguous.
3. A dtype your engine has no RoPE in is **not supported**: raise :class:`Unsupported`; never
   compute in another dtype on its behalf.
4. Declare how your engine forms its angles (``angles``: one of
   :data:`rotary.testing.engine.ANGLE_KINDS`, the least precise step from the frequencies to the
   angle: float32 ``inv_freq`` is ``"float32"``), any factor it puts on the logits outside the
   rotation (``softmax_scale``), the size of its position table (``max_position``) and its query
   temperature (``query_scale``).
5. If your engine's RoPE takes packed input (several documents in one row: ``cu_seqlens``, the
   ``thd`` format, per-document offsets), implement ``rotate_packed(q, k, cu_seqlens, offsets)``
   and hand the engine the packing as it takes it; ``--config thd`` checks it.  Without it the
   packed checks are "not applicable"; what your engine cannot take (offsets, say) raises
   :class:`Unsupported` with the reason.
6. An exception in this module's own code (or in NumPy, torch... called from it) is reported as
   an *adapter error* (a bug to fix here); one raised in your engine's code, or in a library your
   engine's code calls, is your engine's.  Where this module reproduces a step of the engine
   (indexing the engine's table as its forward does), raise :class:`EngineError` from the error
   it meets.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

import rotary
from rotary.testing.engine import EngineError, Unsupported, round_to

NAME = "skeleton"  # ENGINE: your engine's name
PYTHON = "3.11"
#: ENGINE: the exact install recipe on a CPU machine, in its own venv ($ENGINES/<module>/venv).
INSTALL = (
    "python3.11 -m venv $ENGINES/skeleton/venv && . $ENGINES/skeleton/venv/bin/activate\n"
    'pip install numpy\npip install --no-deps -e "$ROTARY" array-api-compat'
)
#: The dtypes checked by default (``check_model_rope``, the command line, the field report's rows);
#: one your engine has no RoPE in, listed here or asked for with ``--dtypes``: refuse it in build.
DTYPES = ("float32", "bfloat16", "float16")

__all__ = ["DTYPES", "INSTALL", "NAME", "PYTHON", "build", "version"]


def version() -> str:
    """ENGINE: your engine's version, raising ``ImportError`` with the recipe when it is missing::

    try:
        import my_engine
    except ImportError as e:
        raise ImportError(f"my-engine is not installed; install it with:\\n{INSTALL}") from e
    return my_engine.__version__
    """
    return rotary.__version__


def _converter_order(layout: str, width: int, head_dim: int) -> np.ndarray:
    """Where each of the engine's q/k features comes from in the Hugging Face checkpoint.

    ENGINE: the permutation your converter applies to the rows of ``q_proj``/``k_proj`` (per
    head), or the identity.  llama.cpp (``LlamaModel.permute``) and Meta's converters interleave
    the halves of a half-layout head, ``[0, w/2, 1, w/2 + 1, ...]``, so that the engine's
    adjacent pairs ``(0, 1), (2, 3)...`` are Hugging Face's ``(0, w/2), (1, w/2 + 1)...``.
    """
    order = np.arange(head_dim)
    if layout == "half":
        h = width // 2
        order[:width] = np.stack([np.arange(h), np.arange(h) + h], axis=-1).reshape(-1)
    return order


class SkeletonRope:
    """The engine's RoPE for one config, layer type and dtype, as the checker calls it."""

    # ENGINE: how the engine forms its angles; declare the least precise step.  "float32": inv_freq
    # computed in float32 (1 / base ** (arange(0, d, 2) / d), float32 pow), the product
    # pos * inv_freq in float32 or float64; "float64": both in float64; "exact": correctly rounded
    # angles only; "dtype": the product in the data's 16-bit dtype; "float32_recurrence": ggml's
    # theta *= s per pair.  Tighter than the engine's arithmetic fails a correct engine; looser
    # widens the rotation tolerance.
    angles = "float32"
    max_position = None  # ENGINE: the rows of the engine's cos/sin table, if it keeps one
    takes_offsets = True  # ENGINE: whether its packed call takes per-document offsets

    def __init__(self, model: Any, index: int, rope: Any, order: np.ndarray, dtype: str) -> None:
        self.model, self.index, self.rope, self.dtype = model, index, rope, dtype
        self.order = order
        self.back = np.argsort(order)
        # ENGINE: the factor on the logits outside the rotation, relative to 1/sqrt(head_dim)
        # (MLA with YaRN: mscale(factor, mscale_all_dim)**2)
        self.softmax_scale = float(model.attention.get("softmax_scale_multiplier", 1.0))

    def rotate(self, q: np.ndarray, k: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``q`` ``(tokens, heads, head_dim)``, ``k`` ``(tokens, kv_heads, head_dim)`` (float32
        values exact in the dtype, in the checkpoint's feature order) rotated at ``positions``
        ``(tokens,)``; returns them in the same order."""
        if positions.ndim != 1:
            raise Unsupported("the skeleton's engine has no M-RoPE (positions of several rows)")
        # into the engine's order and dtype
        qe, ke = q[..., self.order], k[..., self.order]
        try:
            # ENGINE: your engine's call, on its own tensors in self.dtype
            qo, ko = self.rope.apply(qe, ke, positions[:, None])
        except IndexError as e:  # (only where this module reproduces the engine's own step)
            raise EngineError from e
        # back to the checkpoint's order, as the dtype's values (NumPy has no bfloat16)
        return round_to(np.asarray(qo)[..., self.back], self.dtype), round_to(
            np.asarray(ko)[..., self.back], self.dtype
        )

    def rotate_packed(
        self, q: np.ndarray, k: np.ndarray, cu_seqlens: np.ndarray, offsets: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Several documents packed in one row (``thd``): document ``i`` is tokens
        ``cu_seqlens[i] .. cu_seqlens[i+1] - 1`` of ``q`` and ``k``, its token ``j`` at position
        ``offsets[i] + j``.  Delete this method if your engine takes no packed input (the packed
        checks are then "not applicable"); raise ``Unsupported`` for what it cannot take."""
        if offsets.any() and not self.takes_offsets:
            raise Unsupported("the skeleton's engine restarts every document at 0 (no offsets)")
        qe, ke = q[..., self.order], k[..., self.order]
        # ENGINE: your engine's packed call, given cu_seqlens (and offsets) as it takes them.  The
        # stand-in: rotary's positions of the packing, plus each document's offset.
        pos = rotary.positions.from_cu_seqlens(cu_seqlens) + np.repeat(offsets, np.diff(cu_seqlens))
        qo, ko = self.rope.apply(qe, ke, pos[:, None])
        return round_to(np.asarray(qo)[..., self.back], self.dtype), round_to(
            np.asarray(ko)[..., self.back], self.dtype
        )

    def query_scale(self, positions: np.ndarray) -> Any:
        """ENGINE: the factor the engine multiplies queries by after RoPE (Llama 4 / Ministral 3
        attention temperature), ``None`` where it applies none."""
        return self.model.query_scale(self.index, positions) if self.model.layers else None


def build(config: Mapping[str, Any], *, layer_type: str | None, dtype: str) -> SkeletonRope:
    """The engine's RoPE for ``config`` (a Hugging Face config dict), ``layer_type`` and ``dtype``."""
    if dtype not in DTYPES:
        raise Unsupported(f"the skeleton's engine has no {dtype} RoPE")
    # ENGINE: read the config as your engine does.  The stand-in reads it with rotary.hf.
    # An engine with no config reader (theta, head_dim, rotary fraction and scaling written per
    # model in its code): find the entry that ports this checkpoint, or write its parameters from
    # the config as the engine's converter/examples do (rope_theta, head_dim or hidden_size //
    # num_attention_heads, partial_rotary_factor, rope_scaling), and build its RoPE from them;
    # raise Unsupported(reason) for what they cannot express (a scaling, partial rotary...).
    model = rotary.hf.model_rope(config, angles="float32")
    # ENGINE: layer_type is a name of the config's layer_types ("sliding_attention",
    # "full_attention"), given only where they hold two names or more (gpt-oss too, whose layers
    # share one RoPE); None: the model has one RoPE.  Return the RoPE your engine gives those
    # layers; an engine with one RoPE for every layer builds it for every name, and raises
    # Unsupported where the config's layer types differ in RoPE (Gemma 3).
    types = model.layer_types
    found = [
        (i, r)
        for i, r in enumerate(model.layers)
        if r is not None and (layer_type is None or (types is not None and types[i] == layer_type))
    ]
    index, rope = found[0] if found else (0, None)
    if not isinstance(rope, rotary.RoPE):
        raise Unsupported("the skeleton's engine has one plain RoPE per layer type (no M-RoPE)")
    cfg = rope.config
    order = _converter_order(cfg.layout, cfg.width, cfg.head_dim)
    # the stand-in engine rotates adjacent pairs of the converter's order, as llama.cpp's NORM mode
    engine_rope = rotary.RoPE.from_config(dataclasses.replace(cfg, layout="interleaved"))
    return SkeletonRope(model, index, engine_rope, order, dtype)
