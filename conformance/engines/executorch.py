"""ExecuTorch 1.5.1: the Llama ``Rope`` of ``executorch/examples/models/llama/rope.py``, built from
the ``ModelArgs`` its example configs write for each family.

Install (CPU, Python 3.11; tested in a fresh venv: about 2 minutes and 1.5 GB in all; the wheel
requires no torch of its own, so the CPU torch 2.13.0 installed first stays, and it ships
``examples/models/llama`` with its ``rope.py``, ``model_args.py`` and ``llama_transformer.py``,
though not the example configs' JSON files, which are quoted from the repository below)::

    python3.11 -m venv venv && venv/bin/pip install torch==2.13.0 numpy
    venv/bin/pip install executorch==1.5.1

Imported as ``conformance.engines.executorch`` (the package name does not clash: absolute imports
find the engine's top-level ``executorch``); ExecuTorch is imported only inside the functions.

How ExecuTorch builds RoPE
--------------------------
ExecuTorch's LLM export (``examples/models/llama/export_llama_lib.py``, the models of
``EXECUTORCH_DEFINED_MODELS``) never reads a Hugging Face ``config.json``: each model is a
``params.json`` of ``ModelArgs`` fields (``examples/models/<family>/config/*.json``; Meta's own
``params.json`` for Llama 2 / 3.x) plus a weight converter.  ``construct_transformer`` makes **one**
``Rope(ModelArgs)`` for every layer; ``Transformer.forward`` takes ``rope.get_freqs(input_pos,
seqlen)`` (rows of a precomputed table: ``freqs_cos[input_pos]`` on the static-shape path) and each
attention calls ``rope.forward(q, k, freqs_cos, freqs_sin)`` on ``(batch, seq, heads, head_dim)``.
``Rope`` has two paths:

* ``use_hf_rope: false`` (Meta's layout: Llama 2 / 3.x, SmolLM2, Granite, SmolLM3):
  ``precompute_freqs_cis(head_dim, end, rope_freq_base, use_scaled_rope, rope_scale_factor,
  high_freq_factor)`` and ``apply_rotary_emb`` on adjacent pairs ``(2i, 2i+1)``, in float32.  Llama
  3 scaling (``apply_scaling``) hard-codes ``low_freq_factor = 1`` and ``old_context_len = 8192``;
  ``rope_scale_factor`` is not read from the checkpoint's scaling but set by the model class
  (``model.py``: 8 for ``llama3``/``llama3_1``, **32 for every other class**, Llama 3.2 included).
  ``partial_rotary_factor`` is ignored on this path.  Hugging Face checkpoints reach it through
  torchtune's ``hf_to_tune`` (``smollm2/convert_weights.py``), which permutes the q/k rows half ->
  interleaved: the adapter applies that permutation before the engine and its inverse after.
* ``use_hf_rope: true`` (Qwen2.5, Qwen3, Phi-4-mini, GLM, Gemma 2/3, CodeGen):
  ``hf_precompute_freqs_cis(head_dim, end, rope_freq_base, partial_rotary_factor, short_factor=,
  long_factor=, original_max_pos=, max_position_embeddings=, attention_factor=)`` and
  ``hf_apply_rotary_emb`` (rotate-half over the first ``int(head_dim * partial_rotary_factor)``
  features).  LongRoPE (Phi-4-mini's ``rope_scaling_short_factor``/``rope_scaling_long_factor``)
  is computed in float64, cos/sin times the attention factor, stored in float32; the factors are
  chosen **once, by the table's length** (``long_factor`` when ``end >
  original_max_position_embeddings``), not per sequence.  GPT-J / CodeGen-style interleaved
  checkpoints are turned to rotate-half by the converter (Qualcomm's ``transform_weight``
  permutation for CodeGen): the adapter reorders the rotated features likewise.

The table has ``end = max_context_len`` rows, **twice that** when ``ffn_dim_multiplier`` is set
(the "sharded checkpoint" branch of ``Rope.__init__``: Meta's Llama 3 ``params.json`` and every
example config set it; Llama 2's does not).  The adapter sets ``max_context_len`` (and
``max_seq_len``) to the config's ``max_position_embeddings``, as an export for the model's full
context does (the CLI's default is 128).  A position past the table raises ``IndexError`` in
``get_freqs`` (the static-shape path; the dynamic-shape path's ``torch._check`` refuses
``input_pos >= max_context_len`` instead).

Dtypes.  The export casts the model with ``model.to(dtype)`` (``LLMEdgeManager.to_dtype``), which
casts the ``Rope``'s float32 tables too; the adapter does the same.  The Meta path then rotates in
float32 with bfloat16/float16 cos and sin, the Hugging Face path entirely in the dtype.

Gemma 3 is run by the Qualcomm ``static_llama`` (``examples/qualcomm/oss_scripts/llama``), which
builds its sliding layers' table with ``rope.py``'s ``hf_precompute_freqs_cis(head_dim,
max_context_len, local_rope_theta, partial_rotary_factor)``; the portable Llama transformer reads
no ``local_rope_theta`` (its one ``Rope`` would give every layer ``rope_theta``).  The adapter
builds that sliding table and applies it with ``hf_apply_rotary_emb``.

Not expressible (``Unsupported``): linear, dynamic NTK and YaRN scaling (``ModelArgs`` has no field
for them: a Qwen2.5 128K or Gemma 3 4B checkpoint would run as plain RoPE), Llama 3 scaling with
``low_freq_factor`` other than 1 or an original context other than 8192, M-RoPE, multi-head latent
attention, Llama 4 / Ministral 3 attention temperature.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from rotary.testing.engine import EngineError, Unsupported

NAME = "executorch"
PYTHON = "3.11"
INSTALL = (
    "python3.11 -m venv $ENGINES/executorch/venv && . $ENGINES/executorch/venv/bin/activate\n"
    "pip install torch==2.13.0 numpy\npip install executorch==1.5.1\n"
    'pip install --no-deps -e "$ROTARY" array-api-compat'
)

__all__ = ["INSTALL", "NAME", "PYTHON", "build", "version"]

#: Families run on the Hugging Face path (``use_hf_rope: true`` in ExecuTorch's example configs,
#: or ported as its CodeGen example is: partial rotary needs this path).
_HF_ROPE = {"qwen2", "qwen3", "phi3", "glm", "gemma2", "gemma3_text", "phi", "gpt_neox", "gptj", "codegen"}
#: HF checkpoints whose q/k pairs are interleaved (turned to rotate-half by the converter).
_INTERLEAVED = {"gptj", "codegen"}


def version() -> str:
    """ExecuTorch's version; ``ImportError`` with the recipe when it is missing."""
    try:
        from importlib.metadata import version as _v

        import executorch.examples.models.llama.rope  # noqa: F401
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(f"executorch is not installed; install it with:\n{INSTALL}") from e
    return _v("executorch")


def _rope_params(config: Mapping[str, Any], layer_type: str | None) -> dict[str, Any]:
    rp = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if layer_type is not None and isinstance(rp.get(layer_type), Mapping):
        rp = rp[layer_type]
    return dict(rp)


def _head_dim(config: Mapping[str, Any]) -> int:
    if config.get("head_dim"):
        return int(config["head_dim"])
    hidden = config.get("hidden_size", config.get("n_embd"))
    heads = config.get("num_attention_heads", config.get("n_head"))
    return int(hidden) // int(heads)


def _rotary_dim(config: Mapping[str, Any], head_dim: int) -> int:
    rot = head_dim
    for key in ("partial_rotary_factor", "rotary_pct"):
        if config.get(key) is not None:
            rot = int(head_dim * float(config[key]))
    return int(config.get("rotary_dim") or rot)


def _lacks(config: Mapping[str, Any], rp: Mapping[str, Any], rtype: str) -> list[str]:
    why = []
    if rtype not in ("default", "llama3", "longrope", "mrope"):
        why.append(
            f"no {rtype!r} RoPE scaling (ModelArgs has Llama 3 scaling (use_scaled_rope) and "
            "LongRoPE (rope_scaling_short_factor/long_factor) only)"
        )
    if "mrope_section" in rp:
        why.append("no M-RoPE (the Llama Rope takes one position per token)")
    if config.get("qk_rope_head_dim"):
        why.append("no multi-head latent attention (rotating qk_rope_head_dim of each head)")
    if rp.get("llama_4_scaling_beta") is not None or config.get("attn_temperature_tuning"):
        why.append("no Llama 4 / Ministral 3 attention temperature (query scale)")
    if rtype == "llama3":
        low = float(rp.get("low_freq_factor", 1.0))
        orig = int(rp.get("original_max_position_embeddings", 8192))
        if low != 1.0 or orig != 8192:
            why.append(
                f"no Llama 3 scaling with low_freq_factor {low:g} / original context {orig} "
                "(apply_scaling hard-codes 1 and 8192)"
            )
    return why


def _model_args(
    config: Mapping[str, Any], rp: Mapping[str, Any], rtype: str, hf_rope: bool
) -> dict[str, Any]:
    """The ``ModelArgs`` fields an ExecuTorch ``params.json`` for this checkpoint holds (the RoPE
    and shape ones), plus the export's context length and KV-cache flags."""
    head_dim = _head_dim(config)
    heads = int(config.get("num_attention_heads", config.get("n_head")))
    ctx = int(config.get("max_position_embeddings", config.get("n_positions", 2048)))
    theta = config.get("rope_theta", rp.get("rope_theta", config.get("rotary_emb_base", 10000.0)))
    args: dict[str, Any] = {
        "dim": head_dim * heads,
        "n_heads": heads,
        "n_kv_heads": int(config.get("num_key_value_heads") or heads),
        "head_dim": head_dim,
        "n_layers": 1,
        "rope_theta": float(theta),
        "use_hf_rope": hf_rope,
        "max_seq_len": ctx,
        "max_context_len": ctx,
        "use_kv_cache": True,  # get_freqs indexes the table at input_pos
        "enable_dynamic_shape": False,  # the static-shape path: freqs_cos[input_pos]
        # Meta's Llama 2 params.json has no ffn_dim_multiplier; Llama 3's and every example
        # config (qwen2_5, qwen3, phi_4_mini, smollm2, gemma3...) set it (Rope doubles its table).
        "ffn_dim_multiplier": None if (config.get("model_type") == "llama" and rtype == "default") else 1,
    }
    if hf_rope:
        args["partial_rotary_factor"] = _rotary_dim(config, head_dim) / head_dim
    if rtype == "llama3":
        factor = float(rp["factor"])
        # model.py: the model class decides rope_scale_factor (llama3/llama3_1: the params' value,
        # default 8; every other class, llama3_2 included: 32).  The adapter exports a factor-32
        # checkpoint as llama3_2 and any other as llama3_1 with its factor in params.json.
        args["use_scaled_rope"] = True
        args["rope_scale_factor"] = int(factor) if factor.is_integer() else factor
        args["high_freq_factor"] = rp.get("high_freq_factor", 4)
    if rtype == "longrope":  # as phi_4_mini/config/config.json
        args["rope_scaling_short_factor"] = list(rp["short_factor"])
        args["rope_scaling_long_factor"] = list(rp["long_factor"])
        args["original_max_position_embeddings"] = int(
            config.get("original_max_position_embeddings", rp.get("original_max_position_embeddings", ctx))
        )
        args["max_position_embeddings"] = ctx
        if rp.get("attention_factor") is not None:
            args["rope_scaling_attention_factor"] = float(rp["attention_factor"])
    return args


def _torch_dtype(dtype: str) -> Any:
    import torch

    try:
        return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    except KeyError:
        raise Unsupported(f"ExecuTorch's LLM export has no {dtype} (dtype_override fp32/bf16/fp16)") from None


class ExecutorchRope:
    """ExecuTorch's ``Rope`` (or Gemma 3's sliding table), fed Hugging Face-layout ``q``/``k``."""

    softmax_scale = 1.0

    def __init__(self, rope: Any, table: Any, dtype: str, order: np.ndarray, angles: str) -> None:
        self.rope = rope  # the Rope module (None: Gemma 3's sliding table in ``table``)
        self.table = table
        self.dtype = _torch_dtype(dtype)
        self.order = order
        self.back = np.argsort(order)
        self.angles = angles
        cos = rope.freqs_cos if rope is not None else table[0]
        self.max_position = int(cos.shape[0])

    def _freqs(self, pos: Any) -> tuple[Any, Any]:
        if self.rope is not None:  # Transformer.forward: rope.get_freqs(input_pos, seqlen)
            return self.rope.get_freqs(pos, int(pos.shape[0]))
        try:  # static_llama indexes its local table at the positions
            return self.table[0][pos], self.table[1][pos]
        except IndexError as e:
            raise EngineError(f"position past the {self.max_position}-row sliding table") from e

    def rotate(self, q: np.ndarray, k: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(q, k)`` through ``rope.forward(q, k, *rope.get_freqs(positions, seqlen))``."""
        import torch

        positions = np.asarray(positions, dtype=np.int64)
        if positions.ndim != 1:
            raise Unsupported("ExecuTorch's Llama Rope has no M-RoPE: positions must be (tokens,)")

        def to_engine(x: np.ndarray) -> Any:
            x = np.ascontiguousarray(np.asarray(x, dtype=np.float32)[..., self.order])
            return torch.from_numpy(x).to(self.dtype)[None]  # (1, seq, heads, head_dim)

        def back(y: Any) -> np.ndarray:
            return np.asarray(y[0].float().numpy())[..., self.back]

        pos = torch.from_numpy(positions)
        with torch.no_grad():
            cos, sin = self._freqs(pos)
            if self.rope is not None:
                qo, ko = self.rope.forward(to_engine(q), to_engine(k), cos, sin)
            else:
                from executorch.examples.models.llama.rope import hf_apply_rotary_emb

                qo, ko = hf_apply_rotary_emb(to_engine(q), to_engine(k), cos, sin, unsqueeze_dim=1)
        return back(qo), back(ko)

    def rotate_packed(
        self, q: np.ndarray, k: np.ndarray, cu_seqlens: np.ndarray, offsets: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """ExecuTorch's exported LLMs take one sequence per call: no packed input."""
        raise Unsupported(
            "ExecuTorch's Llama export runs one sequence per call (tokens and input_pos of one "
            "sequence, max_batch_size 1): it takes no cu_seqlens"
        )


def build(config: Mapping[str, Any], *, layer_type: str | None, dtype: str) -> ExecutorchRope:
    """ExecuTorch's RoPE for ``config`` as its example ``params.json`` for the family sets it."""
    version()
    from executorch.examples.models.llama.model_args import ModelArgs
    from executorch.examples.models.llama.rope import Rope, hf_precompute_freqs_cis

    tdt = _torch_dtype(dtype)
    model_type = str(config.get("model_type", ""))
    gemma_sliding = model_type == "gemma3_text" and layer_type == "sliding_attention"
    rp = {} if gemma_sliding else _rope_params(config, layer_type)
    rtype = str(rp.get("rope_type", rp.get("type", "default")))
    if rtype == "su":
        rtype = "longrope"
    why = _lacks(config, rp, rtype)
    hf_rope = model_type in _HF_ROPE or rtype == "longrope"
    head_dim = _head_dim(config)
    rot = _rotary_dim(config, head_dim)
    if not hf_rope and rot != head_dim:
        why.append(
            f"no partial rotary ({rot} of {head_dim} features) on the Meta path "
            "(precompute_freqs_cis ignores partial_rotary_factor)"
        )
    if why:
        raise Unsupported("ExecuTorch 1.5.1's Llama Rope has " + "; ".join(why))
    args = ModelArgs(**_model_args(config, rp, rtype, hf_rope))
    # the converter's q/k order: Meta path (hf_to_tune's permutation, feature 2i + j <- j d/2 + i);
    # interleaved checkpoints on the HF path (rotated features 2i + j -> j r/2 + i)
    order = np.arange(head_dim)
    if not hf_rope:
        order = np.arange(head_dim).reshape(2, head_dim // 2).T.reshape(-1)
    elif model_type in _INTERLEAVED:
        order[:rot] = np.arange(rot).reshape(rot // 2, 2).T.reshape(-1)
    longrope = rtype == "longrope"
    angles = "float64" if longrope else "float32"
    if gemma_sliding:
        theta = float(config.get("rope_local_base_freq", 10000.0))
        cos, sin = hf_precompute_freqs_cis(head_dim, args.max_context_len, theta, args.partial_rotary_factor)
        return ExecutorchRope(None, (cos.to(tdt), sin.to(tdt)), dtype, order, angles)
    rope = Rope(args).to(tdt)  # LLMEdgeManager.to_dtype: model.to(dtype) casts the tables too
    return ExecutorchRope(rope, None, dtype, order, angles)
