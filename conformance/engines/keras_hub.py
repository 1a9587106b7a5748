"""keras-hub 0.32.0 (Keras 3.15, JAX backend): the RoPE its model builds for a Hugging Face config.

Install (CPU, Python 3.11; measured here: 26 s + 3 s, venv 761 MB)::

    python3 -m venv venv
    venv/bin/pip install jax keras regex tokenizers
    venv/bin/pip install --no-deps keras-hub==0.32.0 safetensors sentencepiece
    venv/bin/pip install --no-deps -e "$ROTARY" array-api-compat   # rotary, for the checker
    export KERAS_BACKEND=jax   # the adapter sets it when unset

(imported as ``conformance.engines.keras_hub``; the engine is imported only inside functions.)

Code path
---------
``keras_hub.models.Backbone.from_preset("hf://...")`` runs
``keras_hub/src/utils/transformers/preset_loader.py``: ``model_type`` picks a converter
(``convert_llama3`` for every ``llama``, ``convert_qwen`` for ``qwen2``, ``convert_gpt_oss``,
``convert_gemma3`` for ``gemma3``/``gemma3_text``, ``convert_mistral``...) whose
``convert_backbone_config(hf_config)`` gives the backbone's arguments.  The adapter calls that very
function (non-RoPE keys the case configs lack, e.g. ``vocab_size``, get placeholders), then builds
the rotary layer exactly as the family's attention ``build()`` does from the arguments its
backbone and decoder pass down (building the whole backbone would allocate every weight):

* llama -> ``LlamaAttention``: ``models.llama.llama_rotary_embedding.LlamaRotaryEmbedding(
  max_wavelength=rope_theta, position_scaling_factor=1.0, frequency_adjustment_factor=factor,
  low_freq_factor, high_freq_factor, pretraining_sequence_length)``; ``convert_llama3`` raises for
  any ``rope_scaling`` that is not ``llama3`` (``KeyError`` on the legacy ``type`` key).
* qwen2 -> ``QwenAttention``: ``layers.RotaryEmbedding(max_wavelength=rope_theta,
  scaling_factor=rope_scaling_factor)``; ``convert_qwen`` never reads ``rope_scaling`` (the
  backbone default ``rope_scaling_factor=1.0`` stays).
* gpt_oss -> ``GptOssAttention``: ``RotaryEmbedding(rope_type="yarn", scaling_factor=factor,
  beta_fast=32, beta_slow=1, original_max_position_embeddings=4096, truncate=False)`` (all but the
  factor hard-coded in ``gpt_oss_attention.py``).
* gemma3 -> ``Gemma3Backbone``: layer ``i`` slides when ``i % 6 < 5``, with
  ``rope_wavelength`` hard-coded 10 000 (sliding) / 1 000 000 (global) and
  ``local_rope_scaling_factor``/``global_rope_scaling_factor`` from the converter;
  ``CachedGemma3Attention``: ``RotaryEmbedding(max_wavelength, scaling_factor)``.
* phi3 (no HF converter; keras-hub's presets came from
  ``tools/checkpoint_conversion/convert_phi3_checkpoints.py``, which passes
  ``rope_scaling["type"]``, ``short_factor``, ``long_factor``, ``max_position_embeddings``,
  ``original_max_position_embeddings``): ``Phi3Attention`` ->
  ``models.phi3.phi3_rotary_embedding.Phi3SuScaledRotaryEmbedding`` (short/long factors switched
  on ``start_index + seq_len > pretraining_sequence_length``).  ``Phi3Attention`` accepts only
  ``"su"``; HF renamed it ``"longrope"``, which the adapter maps back to ``"su"``.
* gpt_neox (no HF converter; ``tools/checkpoint_conversion/convert_gpt_neox_checkpoints.py``:
  ``rotary_percentage=rotary_pct``, ``rotary_max_wavelength=rotary_emb_base``) ->
  ``GPTNeoXAttention``: ``RotaryEmbedding(max_wavelength)`` on ``x[..., :int(head * pct)]``.

Calls: ``layer(x[B, S, heads, head_dim], positions=...)`` (the layer's documented ``positions``
argument, as the attentions' vLLM route passes per-token positions), i.e. the angles of a prefill
at those sequence indices.  Phi-3's factor switch depends on ``start_index + seq_len``, so it is
run as the prefill over ``0..max(positions)`` would: ``_compute_cos_sin_embedding(x,
start_index=max(positions) + 1 - S, positions)`` and ``_apply_rotary_pos_emb`` (its ``call`` would
turn 1-D positions into 2-D ones, which its ``einsum("i,j->ij")`` rejects).  The layers run with
``dtype=<dtype>`` as the backbone's dtype policy (cos/sin cast to the compute dtype; the YaRN
factor ``0.1 ln(s) + 1`` is computed in it too).  Layout: half (``[-x2, x1]``), the HF layout of
all these families, so q/k pass unchanged.

Design choices a reader needs: converters copy only the RoPE keys their backbone has (qwen2's
drops ``rope_scaling`` silently; llama's accepts only ``llama3``); gpt-oss's YaRN constants and
Gemma 3's wavelengths are hard-coded, not read; ``RotaryEmbedding(rope_type="dynamic")`` is not
HF's dynamic NTK (it rescales at every length; no converter selects it); ``GPTNeoXAttention.call``
rotates without ``start_index``, so in cached decoding the new query is rotated at position 0
(keras-team/keras-hub PR #2870, open) -- this adapter checks the prefill path.

Not expressible (``Unsupported``): model types with no keras-hub converter or model (Ministral 3,
DeepSeek-V3, Phi-2, GPT-J, Qwen2-VL), and what a converter refuses (Llama linear / dynamic).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from rotary.testing.engine import Unsupported

NAME = "keras_hub"
PYTHON = "3.11"
INSTALL = """\
python3.11 -m venv $ENGINES/keras_hub/venv && cd $ENGINES/keras_hub
venv/bin/pip install jax keras regex tokenizers
venv/bin/pip install --no-deps keras-hub==0.32.0 safetensors sentencepiece
venv/bin/pip install --no-deps -e "$ROTARY" array-api-compat
export KERAS_BACKEND=jax"""

__all__ = ["INSTALL", "NAME", "PYTHON", "build", "version"]

_PLACEHOLDERS: dict[str, Any] = {
    "vocab_size": 256,
    "intermediate_size": 64,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "use_sliding_window": False,
    "sliding_window": 4096,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "attention_dropout": 0.0,
    "layer_norm_eps": 1e-5,
}


def _import() -> Any:
    os.environ.setdefault("KERAS_BACKEND", "jax")
    try:
        import keras_hub
    except ImportError as e:  # pragma: no cover
        raise ImportError(f"keras-hub is not installed ({e}); install it with:\n{INSTALL}") from e
    return keras_hub


def version() -> str:
    """keras-hub's version, with Keras' and its backend (raises ImportError when missing)."""
    keras_hub = _import()
    import keras

    return f"{keras_hub.__version__} (keras {keras.__version__}, {keras.backend.backend()})"


def _with_placeholders(config: Mapping[str, Any]) -> dict[str, Any]:
    cfg = dict(config)
    for k, v in _PLACEHOLDERS.items():
        cfg.setdefault(k, v)
    cfg.setdefault("num_key_value_heads", cfg.get("num_attention_heads"))
    return cfg


def _converter(model_type: str) -> Any:
    """The module ``preset_loader.TransformersPresetLoader`` picks for ``model_type``."""
    from keras_hub.src.utils.transformers import preset_loader

    try:
        loader = preset_loader.TransformersPresetLoader(None, {"model_type": model_type})
    except ValueError as e:
        raise Unsupported(str(e)) from None
    conv = loader.converter
    return conv


def _head_dim(cfg: Mapping[str, Any]) -> int:
    return int(cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"])


class _Rope:
    """One keras-hub rotary layer, called as its attention calls it."""

    def __init__(self, layer: Any, dtype: str, rot_dim: int | None, phi3: bool) -> None:
        self.layer = layer
        self.dtype = dtype
        self.rot_dim = rot_dim
        self.phi3 = phi3
        self.angles = "float32"
        self.max_position = None
        self.softmax_scale = 1.0

    def _apply(self, x: np.ndarray, pos: np.ndarray) -> np.ndarray:
        from keras import ops

        r = x.shape[-1] if self.rot_dim is None else self.rot_dim
        xt = ops.cast(ops.convert_to_tensor(x[None, ..., :r]), self.dtype)  # (1, S, heads, r)
        p = ops.convert_to_tensor(pos.astype(np.int32))
        if self.phi3:  # as a prefill over 0..max(pos): factor by start_index + seq_len
            start = int(pos.max()) + 1 - pos.shape[0]
            cos, sin = self.layer._compute_cos_sin_embedding(xt, start_index=start, positions=p)
            y = self.layer._apply_rotary_pos_emb(xt, cos, sin)
        else:
            y = self.layer(xt, positions=p)
        out = np.asarray(ops.convert_to_numpy(ops.cast(y, "float32")))[0]
        if r != x.shape[-1]:
            rest = np.asarray(ops.convert_to_numpy(ops.cast(ops.cast(x[..., r:], self.dtype), "float32")))
            out = np.concatenate([out, rest], axis=-1)
        return out

    def rotate(self, q: np.ndarray, k: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        pos = np.asarray(positions, dtype=np.int64)
        if pos.ndim != 1:
            raise Unsupported("M-RoPE positions")
        return self._apply(np.asarray(q, np.float32), pos), self._apply(np.asarray(k, np.float32), pos)

    def query_scale(self, positions: np.ndarray) -> None:
        return None


def build(config: Mapping[str, Any], *, layer_type: str | None, dtype: str) -> _Rope:
    """keras-hub's RoPE for ``config`` (see the module docstring for the code path)."""
    _import()
    from keras_hub.src.layers.modeling.rotary_embedding import RotaryEmbedding

    if dtype not in ("float32", "bfloat16", "float16"):
        raise Unsupported(f"dtype {dtype!r}")
    mt = str(config.get("model_type"))
    cfg = _with_placeholders(config)
    if mt == "phi3":  # tools/checkpoint_conversion/convert_phi3_checkpoints.py
        from keras_hub.src.models.phi3.phi3_rotary_embedding import Phi3SuScaledRotaryEmbedding

        rs = config.get("rope_scaling")
        if rs is None:
            return _Rope(
                RotaryEmbedding(max_wavelength=config.get("rope_theta", 10000), dtype=dtype),
                dtype,
                None,
                False,
            )
        kind = rs.get("type", rs.get("rope_type"))
        kind = {"longrope": "su"}.get(kind, kind)
        if kind != "su":
            raise Unsupported(f"Phi3Attention: rope_scaling_type {kind!r} (only None or 'su')")
        layer = Phi3SuScaledRotaryEmbedding(
            inverese_freq_short_factor=rs["short_factor"],
            inverese_freq_long_factor=rs["long_factor"],
            max_sequence_length=config["max_position_embeddings"],
            pretraining_sequence_length=config["original_max_position_embeddings"],
            max_wavelength=config.get("rope_theta", 10000),
            dtype=dtype,
        )
        return _Rope(layer, dtype, None, True)
    if mt == "gpt_neox":  # tools/checkpoint_conversion/convert_gpt_neox_checkpoints.py
        head = config["hidden_size"] // config["num_attention_heads"]
        layer = RotaryEmbedding(max_wavelength=config["rotary_emb_base"], dtype=dtype)
        return _Rope(layer, dtype, int(head * config["rotary_pct"]), False)
    conv = _converter(mt)
    try:
        kw = conv.convert_backbone_config(cfg)
    except (KeyError, ValueError) as e:
        raise Unsupported(
            f"{conv.__name__.rsplit('.', 1)[-1]}.convert_backbone_config refuses this "
            f"config: {type(e).__name__}: {e}"
        ) from None
    if mt == "llama":  # Llama3Backbone -> LlamaBackbone -> LlamaTransformerDecoder -> LlamaAttention
        from keras_hub.src.models.llama.llama_rotary_embedding import LlamaRotaryEmbedding

        layer = LlamaRotaryEmbedding(
            max_wavelength=kw.get("rope_max_wavelength", 10000),
            position_scaling_factor=kw.get("rope_position_scaling_factor", 1.0),
            frequency_adjustment_factor=kw.get("rope_frequency_adjustment_factor"),
            low_freq_factor=kw.get("rope_low_freq_factor"),
            high_freq_factor=kw.get("rope_high_freq_factor"),
            pretraining_sequence_length=kw.get("rope_pretraining_sequence_length"),
            dtype=dtype,
        )
    elif mt in ("qwen2", "mistral"):  # QwenAttention / MistralAttention
        layer = RotaryEmbedding(
            max_wavelength=kw.get("rope_max_wavelength", 10000),
            scaling_factor=kw.get("rope_scaling_factor", 1.0),
            dtype=dtype,
        )
    elif mt == "gpt_oss":  # GptOssAttention.build
        layer = RotaryEmbedding(
            max_wavelength=kw.get("rope_max_wavelength", 10000),
            scaling_factor=kw.get("rope_scaling_factor", 1.0),
            rope_type="yarn",
            beta_fast=32.0,
            beta_slow=1.0,
            original_max_position_embeddings=4096,
            truncate=False,
            dtype=dtype,
        )
    elif mt in ("gemma3", "gemma3_text"):  # Gemma3Backbone.__init__: layer i slides when i % 6 < 5
        n = int(kw["num_layers"])
        kinds = [
            "sliding_attention" if kw["use_sliding_window_attention"] and i % 6 < 5 else "full_attention"
            for i in range(n)
        ]
        want = layer_type or "full_attention"
        if want not in kinds:
            raise Unsupported(f"no {want!r} layer")
        sliding = want == "sliding_attention"
        layer = RotaryEmbedding(
            max_wavelength=10_000.0 if sliding else 1_000_000.0,
            scaling_factor=kw["local_rope_scaling_factor"] if sliding else kw["global_rope_scaling_factor"],
            dtype=dtype,
        )
    else:
        raise Unsupported(f"keras-hub's {mt!r} model is not wired in this adapter")
    r = _Rope(layer, dtype, None, False)
    if _head_dim(cfg) % 2:
        raise Unsupported("odd head_dim")
    return r
