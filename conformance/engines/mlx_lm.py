"""mlx-lm 0.32.2 on mlx 0.32.4 (CPU build): the RoPE its model file builds for a config.

Install (CPU, Python 3.12; measured here: 21 s, venv 334 MB)::

    python3.12 -m venv $ENGINES/mlx_lm/venv && cd $ENGINES/mlx_lm
    venv/bin/pip install "mlx[cpu]==0.32.4" mlx-lm==0.32.2
    venv/bin/pip install --no-deps -e "$ROTARY" array-api-compat   # rotary, for the checker

(imported as ``conformance.engines.mlx_lm``; the engine's ``mlx_lm`` is imported only inside
functions.)

Code path
---------
Exactly ``mlx_lm.utils.load_model`` without weights: ``mlx_lm.utils._get_classes(config)`` picks the
model file (``MODEL_REMAPPING``: ``mistral`` -> ``llama``, ...), ``ModelArgs.from_dict(config)``
keeps the keys the file declares, ``Model(args)`` builds the layers (MLX arrays are lazy: the
weights are never materialised).  Required non-RoPE fields absent from the case configs
(``vocab_size``, ``intermediate_size``, ``rms_norm_eps``...) get placeholders, and
``num_hidden_layers`` is capped at 8.  The adapter then takes the attention module of the first
layer of the requested type (Gemma 3: ``Attention.is_sliding``; gpt-oss: the model's
``layer_types``) and calls its ``rope`` exactly as the attention's ``__call__`` does,
``rope(x[B, heads, L, head_dim], offset=...)``, with the batch as the tokens and
``offset = mx.array(positions)`` (the per-sequence offsets of mlx-lm's batched generation),
i.e. ``mx.fast.rope`` at each token's position.  What each model file builds (HF config keys
read by its ``ModelArgs``):

* llama, qwen2, gemma3_text, gpt_oss, ministral3, deepseek_v3, gptj ->
  ``models.rope_utils.initialize_rope(dims, base, traditional, scaling_config,
  max_position_embeddings)``: ``default``/``linear`` -> ``nn.RoPE(scale=1/factor)``; ``dynamic`` ->
  ``DynamicNTKScalingRoPE`` (``seq_len = max(L + offset, max_position_embeddings)``: one call is
  one prefill, so the adapter runs it as the prefill over positions ``0..max(positions)`` and reads
  the rows of the given positions); ``llama3`` -> ``Llama3RoPE`` (reads factor, low/high and
  original_max from the config); ``yarn`` -> ``YarnRoPE`` (``floor``/``ceil`` of the correction
  range always: it has no ``truncate`` argument; the input is multiplied by
  ``g(factor, mscale) / g(factor, mscale_all_dim)`` with defaults ``mscale=1``,
  ``mscale_all_dim=0``); ``mrope`` -> a plain ``nn.RoPE`` (qwen2_vl in mlx-lm is the text model).
* phi3 -> ``rope_utils.SuScaledRoPE`` directly (``long_factor`` at every position:
  ``short_factor`` is accepted and never used; input scaled by
  ``sqrt(1 + ln(max_pos / original_max) / ln(original_max))``).
* phi, gpt_neox -> ``nn.RoPE(int(partial_rotary_factor * head_dim))`` / ``int(head_dim * rotary_pct)``.
* gptj -> ``initialize_rope(rotary_dim, base=10000, traditional=True)`` on the first
  ``rotary_dim`` features.
* deepseek_v3: ``traditional=True`` on ``qk_rope_head_dim`` features, softmax scale times
  ``(0.1 * mscale_all_dim * ln(factor) + 1)**2`` (``DeepseekV3Attention.__init__``).
* ministral3: queries times ``_get_llama_4_attn_scale(L, offset, llama_4_scaling_beta,
  original_max_position_embeddings)`` (``query_scale``).
* gemma3_text: sliding layers ``initialize_rope(head_dim, rope_local_base_freq)``, full layers
  ``rope_theta`` with ``rope_scaling``.

q/k cross in the HF layout, which is the layout of mlx-lm's converted weights (no permutation).
``mx.fast.rope`` computes the angles in float32 and returns the input dtype (bfloat16 in,
bfloat16 out); no table is kept (``max_position`` is None).  M-RoPE with position rows that
differ (image tokens) raises ``Unsupported``: mlx-lm has 1-D offsets only (vision models are
mlx-vlm's); text positions are checked.

Design choices a reader needs: ``YarnRoPE`` has no ``truncate`` (gpt-oss's ``truncate: false``
is dropped); ``SuScaledRoPE`` never uses ``short_factor`` (Phi-3 prompts under
``original_max_position_embeddings`` get the long factors; ml-explore/mlx-lm PR #660 "Fix
SuScaledRoPE" is not in 0.32.2's code); YaRN's attention factor multiplies the input before
``mx.fast.rope`` rather than cos/sin (the same product).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from rotary.testing.engine import Unsupported

NAME = "mlx_lm"
PYTHON = "3.12"
INSTALL = """\
python3.12 -m venv $ENGINES/mlx_lm/venv && cd $ENGINES/mlx_lm
venv/bin/pip install "mlx[cpu]==0.32.4" mlx-lm==0.32.2
venv/bin/pip install --no-deps -e "$ROTARY" array-api-compat"""

__all__ = ["INSTALL", "NAME", "PYTHON", "build", "version"]

_PLACEHOLDERS: dict[str, Any] = {
    "vocab_size": 256,
    "intermediate_size": 64,
    "rms_norm_eps": 1e-6,
    "layer_norm_eps": 1e-5,
    "moe_intermediate_size": 64,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "n_shared_experts": 1,
    "num_local_experts": 4,
    "first_k_dense_replace": 1,
    "layer_norm_epsilon": 1e-5,
    "n_inner": None,
    "tie_word_embeddings": False,
}


def version() -> str:
    """mlx-lm's version, with mlx's (raises ImportError with the install recipe when missing)."""
    try:
        import mlx.core as mx
        import mlx_lm
    except ImportError as e:  # pragma: no cover
        raise ImportError(f"mlx-lm is not installed ({e}); install it with:\n{INSTALL}") from e
    return f"{mlx_lm.__version__} (mlx {mx.__version__})"


def _dtype(dtype: str) -> Any:
    import mlx.core as mx

    try:
        return {"float32": mx.float32, "bfloat16": mx.bfloat16, "float16": mx.float16}[dtype]
    except KeyError:
        raise Unsupported(f"dtype {dtype!r}") from None


def _model(config: Mapping[str, Any]) -> Any:
    from mlx_lm.utils import _get_classes

    try:
        model_cls, args_cls = _get_classes(dict(config))
    except ValueError as e:
        raise Unsupported(str(e)) from None
    cfg = dict(config)
    cfg["num_hidden_layers"] = min(int(cfg.get("num_hidden_layers", cfg.get("n_layer", 8))), 8)
    if "n_layer" in cfg:
        cfg["n_layer"] = min(int(cfg["n_layer"]), 8)
    for name, v in _PLACEHOLDERS.items():  # also read by nested ModelArgs (qwen2_vl's text model)
        cfg.setdefault(name, v)
    for name, p in inspect.signature(args_cls).parameters.items():
        if p.default is inspect.Parameter.empty and name not in cfg and name != "text_config":
            cfg[name] = 8
    try:
        return model_cls(args_cls.from_dict(cfg))
    except (AssertionError, KeyError, ValueError) as e:
        raise Unsupported(f"mlx-lm cannot build {config.get('model_type')!r}: {e!r}") from None


def _attention(layer: Any) -> Any:
    for name in ("self_attn", "attention", "attn", "mixer"):
        a = getattr(layer, name, None)
        if a is not None and hasattr(a, "rope"):
            return a
    raise Unsupported(f"no attention with a rope in {type(layer).__name__}")


def _layer_types(model: Any) -> list[str] | None:
    for m in (model, getattr(model, "model", None), getattr(model, "language_model", None)):
        lt = getattr(m, "layer_types", None)
        if isinstance(lt, list) and lt and isinstance(lt[0], str):
            return lt
    return None


class _Rope:
    """One mlx-lm attention's rope, called as the attention calls it."""

    def __init__(
        self, attn: Any, dtype: str, head_dim: int, rot_dim: int, softmax_scale: float, qscale: Any
    ) -> None:
        self.attn = attn
        self.rope = attn.rope
        self.dtype = dtype
        self.head_dim = head_dim
        self.rot_dim = rot_dim
        self.softmax_scale = softmax_scale
        self._qscale = qscale
        self.angles = "float32"
        self.max_position = None

    def _apply(self, x: np.ndarray, pos: np.ndarray) -> np.ndarray:
        import mlx.core as mx
        from mlx_lm.models.rope_utils import DynamicNTKScalingRoPE

        dt = _dtype(self.dtype)
        r = self.rot_dim
        # (tokens, heads, d) -> (B=tokens, heads, L=1, d); gptj rotates x[..., :rotary_dim] only
        xr = x[..., :r] if r != self.head_dim and self._split else x
        if isinstance(self.rope, DynamicNTKScalingRoPE):  # one prefill over 0..max(pos)
            n = int(pos.max()) + 1
            out = np.empty(xr.shape, dtype=np.float32)
            for h in range(xr.shape[1]):
                full = np.zeros((1, 1, n, xr.shape[-1]), dtype=np.float32)
                full[0, 0, pos] = xr[:, h]
                y = self.rope(mx.array(full).astype(dt), offset=0)
                out[:, h] = np.asarray(y[0, 0, mx.array(pos.astype(np.int32))].astype(mx.float32))
        else:
            xe = mx.array(np.ascontiguousarray(xr[:, :, None, :])).astype(dt)
            y = self.rope(xe, offset=mx.array(pos.astype(np.int32)))
            out = np.asarray(y.astype(mx.float32))[:, :, 0, :]
        if xr is not x:
            rest = np.asarray(mx.array(x[..., r:]).astype(dt).astype(mx.float32))
            out = np.concatenate([out, rest], axis=-1)
        return out

    _split = False

    def rotate(self, q: np.ndarray, k: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        pos = np.asarray(positions, dtype=np.int64)
        if pos.ndim == 2:
            if not np.all(pos == pos[:1]):
                raise Unsupported(
                    "M-RoPE image positions: mlx-lm's qwen2_vl is the text model "
                    "(initialize_rope maps 'mrope' to a plain nn.RoPE over 1-D offsets)"
                )
            pos = pos[0]
        return self._apply(np.asarray(q, np.float32), pos), self._apply(np.asarray(k, np.float32), pos)

    def query_scale(self, positions: np.ndarray) -> np.ndarray | None:
        if self._qscale is None:
            return None
        import mlx.core as mx

        pos = np.asarray(positions, dtype=np.int64)
        pos = pos[0] if pos.ndim == 2 else pos
        fn, beta, length = self._qscale
        s = fn(1, mx.array(pos.astype(np.int32)), beta, length)
        return np.asarray(s.astype(mx.float32)).reshape(-1)


def build(config: Mapping[str, Any], *, layer_type: str | None, dtype: str) -> _Rope:
    """mlx-lm's RoPE for ``config`` (see the module docstring for the code path)."""
    version()
    _dtype(dtype)
    model = _model(config)
    layers = list(model.layers)
    lts = _layer_types(model)
    idx = 0
    if layer_type is not None:
        for i, layer in enumerate(layers):
            a = _attention(layer)
            t = (
                ("sliding_attention" if a.is_sliding else "full_attention")
                if hasattr(a, "is_sliding")
                else (lts[i] if lts else "full_attention")
            )
            if t == layer_type:
                idx = i
                break
        else:
            raise Unsupported(f"no layer of type {layer_type!r}")
    attn = _attention(layers[idx])
    mt = str(config.get("model_type"))
    # the width the rope rotates and the head it sits in
    if mt.startswith("deepseek"):
        head_dim = rot_dim = int(config["qk_rope_head_dim"])
        qk_head_dim = head_dim + int(config["qk_nope_head_dim"])
    else:
        head_dim = int(
            getattr(attn, "head_dim", 0)
            or config.get("head_dim")
            or (config.get("hidden_size") or config["n_embd"])
            // (config.get("num_attention_heads") or config["n_head"])
        )
        qk_head_dim = head_dim
        rot_dim = int(getattr(attn, "rotary_dim", 0) or head_dim)
    scale = next(
        (
            float(getattr(attn, n))
            for n in ("scale", "sm_scale", "scale_attn")
            if isinstance(getattr(attn, n, None), (int, float))
        ),
        qk_head_dim**-0.5,
    )
    softmax_scale = scale / qk_head_dim**-0.5
    qscale = None
    if mt == "ministral3":
        mod = inspect.getmodule(type(attn))
        rp = config["rope_parameters"]
        qscale = (
            mod._get_llama_4_attn_scale,
            rp["llama_4_scaling_beta"],
            rp["original_max_position_embeddings"],
        )
    r = _Rope(attn, dtype, head_dim, rot_dim, softmax_scale, qscale)
    r._split = mt == "gptj"  # GPTJAttention slices q[..., :rotary_dim] before its rope
    if math.isclose(softmax_scale, 1.0, rel_tol=1e-12):
        r.softmax_scale = 1.0
    return r
