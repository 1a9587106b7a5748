"""vLLM 0.33.0's RoPE, built the way vLLM builds it when it loads a model (adapter for
:func:`rotary.testing.check_model_rope`; imported as ``conformance.engines.vllm``).

Install (CPU, tested): :data:`INSTALL`; 60 s into a fresh venv with a warm pip cache, venv 2.1 GB
(vllm 877 MB, torch 754 MB).  The vLLM wheel is a CUDA build (its ``vllm._C`` does not load on
CPU) and pins ``torch==2.14.0`` and ``transformers<5.21``; with ``--no-deps`` it runs on the local
CPU ``torch==2.13.0``, with 50 light imports installed by hand, and ``VLLM_TARGET_DEVICE=cpu``
(set here before the first import) keeps it off CUDA.  Only its pure-PyTorch paths run.

Code path, per load:

1. **Config reading**: the config dict is written to a temporary ``config.json`` (with the
   ``architectures`` its checkpoint publishes, where the case omits them) and read by vLLM's own
   ``vllm.transformers_utils.config.get_config`` (``HFConfigParser`` -> the Transformers config
   class of vLLM's pinned ``transformers==5.20.2`` -> ``patch_rope_parameters``, which maps
   legacy ``rope_scaling``/``type``/``rotary_pct``/``rotary_emb_base`` into ``rope_parameters``).
   ``max_model_len`` is vLLM's default, from ``vllm.config.model._get_and_verify_max_len`` (no
   user ``--max-model-len``).
2. **Model file**: the architecture's attention ``__init__`` call into
   ``vllm.model_executor.layers.rotary_embedding.get_rope`` is reproduced argument for argument,
   inside ``set_current_vllm_config`` and ``set_default_torch_dtype(dtype)`` as vLLM's model
   loader does (``base_loader.py``), so tables not given a dtype are stored in the model dtype:

   ============================== =============================================================
   architecture                   vLLM model file: call
   ============================== =============================================================
   LlamaForCausalLM, Phi3ForCLM   ``llama.py`` ``LlamaAttention._init_rotary_emb``:
                                  ``get_rope(head_dim, max_position=max_position_embeddings,
                                  rope_parameters=config.rope_parameters, is_neox_style=True)``
   Ministral3ForCausalLM          ``mistral.py`` ``MistralAttention`` (LlamaAttention's RoPE;
                                  query scale ``_get_llama_4_attn_scale`` only if the config has
                                  a top-level ``llama_4_scaling`` mapping)
   Qwen2ForCausalLM, Qwen2-VL     ``qwen2.py`` ``Qwen2Attention`` (``set_default_rope_theta(1e6)``,
                                  ``head_dim = hidden_size // num_heads``; Qwen2-VL's language
                                  model is ``Qwen2ForCausalLM`` -> ``MRotaryEmbedding``, table
                                  ``4 * max_position_embeddings``)
   Qwen3ForCausalLM               ``qwen3.py`` ``Qwen3Attention`` (``set_default_rope_theta(1e6)``,
                                  ``head_dim`` from the config)
   GptOssForCausalLM              ``gpt_oss.py`` ``OAIAttention``: a rebuilt YaRN dict (theta,
                                  factor, L0, betas, truncate; nothing else), ``dtype=float32``
   DeepseekV3ForCausalLM          ``deepseek_v2.py`` ``DeepseekV2MLAAttention``: ``rope_type``
                                  rewritten to ``deepseek_yarn``, ``get_rope(qk_rope_head_dim,
                                  ..., is_neox_style=False)``, softmax scale ``* mscale**2``
   GPTJForCausalLM                ``gpt_j.py`` ``GPTJAttention``: ``partial_rotary_factor =
                                  rotary_dim / head_size``, ``is_neox_style=False``
   Gemma3ForCausalLM              ``gemma3.py`` ``Gemma3Attention``: ``rope_parameters[layer_type]``,
                                  ``scaling = query_pre_attn_scalar ** -0.5``
   PhiForCausalLM, GPTNeoXForCLM  no vLLM model file in 0.33: ``registry.py`` sends them to the
                                  Transformers modeling backend, so the RoPE is Transformers'
                                  own ``PhiRotaryEmbedding``/``GPTNeoXRotaryEmbedding`` and
                                  ``apply_rotary_pos_emb`` (5.20.2), positions ``[None, :]``
   ============================== =============================================================

3. **Rotation**: ``rope.forward_native(positions, q, k)`` (``Phi3LongRoPEScaledRotaryEmbedding``
   only has ``forward``), with ``q``/``k`` flattened to ``(tokens, heads * head_dim)`` as the
   model files pass them (MLA: ``(tokens, heads, rope_dim)``).  On a GPU vLLM runs its CUDA kernel
   on the same table (``forward_cuda``), not checked here.

4. **Packed input** (the ``thd`` case): vLLM's RoPE takes a flat batch of scheduled tokens with
   one position per token, computed by the model runner from each request's computed tokens
   (``GPUModelRunner._prepare_inputs``: ``num_computed_tokens[req_indices] + query_pos``, the
   per-request arange from the runner's own ``_get_cumsum_and_arange``, called here).  A restarting
   packed row is a batch of new requests (no computed tokens); the ragged variant, requests
   continuing at their computed tokens (chunked prefill and decoding mixed).

Checked against the real modules: ``scratch/engines/vllm/crosscheck_modules.py`` instantiates
each architecture's vLLM attention/decoder layer on CPU (one layer, gloo group of one; DeepSeek
through ``DeepseekV2Attention``, whose RoPE code is MLA's) and finds the same RoPE class, a
bit-identical table, the same ``mscale`` and softmax scale for every case above.

Design choices of vLLM a reader needs:

* One precomputed ``cos_sin_cache`` per RoPE, angles ``arange(n, float32) * inv_freq`` in float32,
  stored in the model dtype (bf16 tables for bf16 models) and indexed by position: positions past
  the table raise ``IndexError`` in ``forward_native`` (a device-side assert or an out-of-bounds
  read in the CUDA kernel).  The table length is ``max_position`` (``* factor`` for linear and
  YaRN/DeepSeek-YaRN, ``* 4`` for M-RoPE); ``max_model_len`` caps what the scheduler sends.
* ``dynamic``: ``DynamicNTKScalingRotaryEmbedding`` is a static NTK base computed once from
  ``max_trained_positions`` (default ``max_position``, giving the unscaled base) over a table of
  ``max_position`` rows, while ``max_model_len`` is ``factor * max_position_embeddings``.
* ``longrope``: short or long factors are chosen once per load, by ``max_model_len >
  original_max_position_embeddings`` (to keep the KV cache valid), not per sequence as in
  Transformers; the default ``max_model_len`` for LongRoPE is ``original_max_position_embeddings``.
* YaRN's attention factor multiplies the cos/sin table (``mscale``, from ``attention_factor``,
  else ``mscale``/``mscale_all_dim``, else ``0.1 ln s + 1``); DeepSeek MLA's extra
  ``mscale(factor, mscale_all_dim) ** 2`` multiplies the softmax scale (:attr:`softmax_scale`).
* Ministral 3 from its HF ``config.json``: ``MistralAttention`` looks for a top-level
  ``llama_4_scaling`` mapping (what vLLM's Mistral-format ``params.json`` reader makes) and not
  ``rope_parameters["llama_4_scaling_beta"]``, so no query scale (:meth:`VllmRope.query_scale`
  returns ``None``); vllm-project/vllm#48621, still so in 0.33.0 (its YaRN-mscale half is fixed).

Configs it cannot express raise :class:`rotary.testing.engine.Unsupported`: architectures outside
the table above (the adapter reproduces only those model files), and whatever vLLM itself refuses
while reading the config or building the RoPE.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

import numpy as np

from rotary.testing.engine import EngineError, Unsupported

from .cases import as_published

NAME = "vllm"
PYTHON = "3.11"
INSTALL = """\
python3.11 -m venv $ENGINES/vllm/venv && . $ENGINES/vllm/venv/bin/activate
pip install torch==2.13.0 numpy
pip install --no-deps vllm==0.33.0
pip install --no-deps packaging pydantic pydantic_core typing_inspection annotated_types regex \\
  psutil cbor2 pyzmq urllib3 transformers==5.20.2 huggingface_hub tqdm httpx2 idna pyyaml \\
  httpcore2 truststore h11 safetensors tokenizers aiohttp multidict attrs yarl propcache \\
  aiohappyeyeballs aiosignal frozenlist requests certifi openai_harmony openai sniffio anyio \\
  pillow pybase64 cachetools msgspec cloudpickle uvloop py-cpuinfo prometheus_client xgrammar \\
  apache-tvm-ffi==0.1.11 'fastapi<0.137' starlette annotated_doc partial_json_parser \\
  llguidance einops
pip install --no-deps -e "$ROTARY" array-api-compat
export VLLM_TARGET_DEVICE=cpu   # the adapter also sets it before importing vllm"""

_LLAMA_LIKE = {"LlamaForCausalLM", "MistralForCausalLM", "Ministral3ForCausalLM", "Phi3ForCausalLM"}
_QWEN2_LIKE = {"Qwen2ForCausalLM", "Qwen2VLForConditionalGeneration"}
_HF_BACKEND = {"PhiForCausalLM": "phi", "GPTNeoXForCausalLM": "gpt_neox"}


def _vllm() -> Any:
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import vllm
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(f"vLLM is not installed; CPU recipe:\n{INSTALL}") from e
    return vllm


def version() -> str:
    """vLLM's version (``ImportError`` with the install recipe when it is missing)."""
    return str(_vllm().__version__)


def _torch_dtype(dtype: str) -> Any:
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]


def _read_config(config: Mapping[str, Any]) -> Any:
    """The config object vLLM's ``get_config`` makes of ``config.json``."""
    _vllm()
    from vllm.transformers_utils.config import get_config

    d = as_published(config)
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(d, f)
        try:
            return get_config(tmp, trust_remote_code=False)
        except Exception as e:
            raise Unsupported(f"vLLM's get_config refuses the config: {e!r}") from e


def _max_model_len(hf_config: Any, user: int | None = None) -> int:
    """vLLM's ``max_model_len`` (``_get_and_verify_max_len``): its default, or ``user``'s
    ``--max-model-len`` checked against the config as vLLM checks it."""
    from vllm.config.model import _get_and_verify_max_len
    from vllm.transformers_utils.model_arch_config_convertor import (
        MODEL_ARCH_CONFIG_CONVERTORS,
        ModelArchConfigConvertorBase,
    )

    cls = MODEL_ARCH_CONFIG_CONVERTORS.get(hf_config.model_type, ModelArchConfigConvertorBase)
    conv = cls(hf_config, hf_config.get_text_config())
    arch = SimpleNamespace(derived_max_model_len_and_key=conv.derive_max_model_len_and_key())
    return int(_get_and_verify_max_len(hf_config, arch, None, user, False, None))


class VllmRope:
    """One vLLM RoPE (a ``get_rope`` module, or Transformers' for the Transformers backend)."""

    angles = "float32"

    def __init__(
        self,
        *,
        rope: Any,
        arch: str,
        dtype: Any,
        head_dim: int,
        max_position: int | None,
        max_model_len: int,
        softmax_scale: float,
        flat: bool,
        hf: Any = None,
        query_scaler: Any = None,
    ) -> None:
        self.rope = rope
        self.arch = arch
        self.dtype = dtype
        self.head_dim = head_dim
        self.max_position = max_position
        self.max_model_len = max_model_len
        self.softmax_scale = softmax_scale
        self._flat = flat
        self._hf = hf
        self._query_scaler = query_scaler

    def __repr__(self) -> str:
        name = type(self.rope).__name__ if self.rope is not None else "transformers"
        return (
            f"VllmRope({self.arch}: {name}, table={self.max_position}, "
            f"max_model_len={self.max_model_len}, dtype={self.dtype})"
        )

    def rotate(self, q: np.ndarray, k: np.ndarray, positions: np.ndarray) -> tuple[Any, Any]:
        """``(q, k)`` rotated by vLLM at ``positions``."""
        import torch

        qt = torch.from_numpy(np.ascontiguousarray(q, dtype=np.float32)).to(self.dtype)
        kt = torch.from_numpy(np.ascontiguousarray(k, dtype=np.float32)).to(self.dtype)
        pos = torch.from_numpy(np.ascontiguousarray(positions, dtype=np.int64))
        if self._hf is not None:
            qo, ko = self._hf(qt, kt, pos)
        else:
            n = qt.shape[0]
            qi, ki = (qt.reshape(n, -1), kt.reshape(n, -1)) if self._flat else (qt, kt)
            with torch.no_grad():
                fwd = getattr(self.rope, "forward_native", self.rope.forward)
                qo, ko = fwd(pos, qi, ki)
        return (qo.reshape(q.shape).float().numpy(), ko.reshape(k.shape).float().numpy())

    def rotate_packed(
        self, q: np.ndarray, k: np.ndarray, cu_seqlens: np.ndarray, offsets: np.ndarray
    ) -> tuple[Any, Any]:
        """A flat batch of requests, as vLLM's model runner hands it to the model: request ``i``
        schedules ``cu_seqlens[i+1] - cu_seqlens[i]`` tokens after ``offsets[i]`` computed ones
        (its KV cache).  The positions are the runner's (``GPUModelRunner._prepare_inputs``:
        ``num_computed_tokens[req_indices] + query_pos``, ``query_pos`` from the runner's own
        ``_get_cumsum_and_arange``); the RoPE rotates the flat row at them (:meth:`rotate`)."""
        num_scheduled = np.diff(np.asarray(cu_seqlens, dtype=np.int64))
        num_computed = np.asarray(offsets, dtype=np.int64)
        if self._hf is not None:
            raise Unsupported(
                f"{self.arch} runs on vLLM's Transformers backend, whose RoPE is Transformers' "
                "(positions per batch row, no flat batch of requests checked here)"
            )
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner

        total = int(num_scheduled.sum())
        query_pos = np.zeros(total, dtype=np.int64)
        runner = SimpleNamespace(arange_np=np.arange(max(total, num_scheduled.size), dtype=np.int64))
        cu = GPUModelRunner._get_cumsum_and_arange(runner, num_scheduled, query_pos)  # type: ignore[arg-type]
        if not np.array_equal(cu, np.asarray(cu_seqlens)[1:]):
            raise EngineError(f"vLLM's cumulative token counts {cu} are not cu_seqlens[1:]")
        req_indices = np.repeat(runner.arange_np[: num_scheduled.size], num_scheduled)
        positions = num_computed[req_indices] + query_pos
        return self.rotate(q, k, positions)

    def query_scale(self, positions: np.ndarray) -> np.ndarray | None:
        """``MistralAttention._get_llama_4_attn_scale`` where vLLM applies it, else ``None``."""
        if self._query_scaler is None:
            return None
        import torch

        pos = torch.from_numpy(np.ascontiguousarray(positions, dtype=np.int64))
        return self._query_scaler(pos).squeeze(-1).double().numpy()


def _hf_backend(config: Any, module: str, dtype: Any) -> Any:
    """The RoPE part of Transformers' attention for vLLM's Transformers modeling backend."""
    import importlib

    import torch
    from vllm.utils.torch_utils import set_default_torch_dtype

    mod = importlib.import_module(f"transformers.models.{module}.modeling_{module}")
    emb_cls = {"phi": "PhiRotaryEmbedding", "gpt_neox": "GPTNeoXRotaryEmbedding"}[module]
    with set_default_torch_dtype(dtype):
        emb = getattr(mod, emb_cls)(config=config)
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    ndims = int(head_dim * config.rope_parameters.get("partial_rotary_factor", 1.0))

    def apply(q: Any, k: Any, pos: Any) -> tuple[Any, Any]:
        # [tokens, heads, d] -> [1, heads, tokens, d], as the attention module holds them.
        qs, ks = q.transpose(0, 1)[None], k.transpose(0, 1)[None]
        with torch.no_grad():
            cos, sin = emb(qs, position_ids=pos[None, :])
            if module == "phi":  # PhiAttention.forward: split, rotate, concatenate
                qr, kr = mod.apply_rotary_pos_emb(qs[..., :ndims], ks[..., :ndims], cos, sin)
                qs = torch.cat((qr, qs[..., ndims:]), dim=-1)
                ks = torch.cat((kr, ks[..., ndims:]), dim=-1)
            else:  # GPT-NeoX's apply_rotary_pos_emb splits by cos.shape[-1] itself
                qs, ks = mod.apply_rotary_pos_emb(qs, ks, cos, sin)
        return qs[0].transpose(0, 1), ks[0].transpose(0, 1)

    return apply, head_dim, ndims


def build(
    config: Mapping[str, Any], *, layer_type: str | None, dtype: str, max_model_len: int | None = None
) -> VllmRope:
    """vLLM's RoPE for ``config`` (a published HF config dict), as its model file builds it.

    ``max_model_len`` is vLLM's ``--max-model-len`` (default: vLLM's own, from the config); only
    LongRoPE's RoPE reads it (long or short factors for the whole load).
    """
    _vllm()
    import torch
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers import rotary_embedding as re_mod
    from vllm.transformers_utils.config import set_default_rope_theta
    from vllm.utils.torch_utils import set_default_torch_dtype

    tdt = _torch_dtype(dtype)
    full = _read_config(config)
    arch = full.architectures[0]
    cfg = full.get_text_config()
    max_model_len = _max_model_len(full, max_model_len)
    layer_types = list(getattr(cfg, "layer_types", None) or [])
    if layer_type is not None and layer_type not in layer_types:
        raise ValueError(f"layer_type {layer_type!r} not in the config's {sorted(set(layer_types))}")

    if arch in _HF_BACKEND:
        apply, head_dim, _ = _hf_backend(cfg, _HF_BACKEND[arch], tdt)
        return VllmRope(
            rope=None,
            arch=arch,
            dtype=tdt,
            head_dim=head_dim,
            max_position=None,
            max_model_len=max_model_len,
            softmax_scale=1.0,
            flat=False,
            hf=apply,
        )

    vc = VllmConfig()
    # What vLLM's RoPE reads of the model config (Phi3LongRoPEScaledRotaryEmbedding only).
    vc.model_config = SimpleNamespace(max_model_len=max_model_len, hf_config=full)
    re_mod._ROPE_DICT.clear()  # a fresh load: get_rope's memo does not key on max_model_len
    scaler = None
    flat = True
    softmax = 1.0
    with set_current_vllm_config(vc), set_default_torch_dtype(tdt):
        try:
            if arch in _LLAMA_LIKE:
                head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
                rope = re_mod.get_rope(
                    head_dim,
                    max_position=getattr(cfg, "max_position_embeddings", 8192),
                    rope_parameters=getattr(cfg, "rope_parameters", None),
                    is_neox_style=True,
                )
                l4 = getattr(cfg, "llama_4_scaling", None)
                if arch in ("MistralForCausalLM", "Ministral3ForCausalLM") and l4 is not None:
                    from vllm.model_executor.models.mistral import MistralAttention

                    me = SimpleNamespace(
                        llama_4_scaling_original_max_position_embeddings=l4[
                            "original_max_position_embeddings"
                        ],
                        llama_4_scaling_beta=l4["beta"],
                    )

                    def scaler(pos: Any, _me: Any = me) -> Any:
                        return MistralAttention._get_llama_4_attn_scale(_me, pos)
            elif arch in _QWEN2_LIKE:
                set_default_rope_theta(cfg, default_theta=1000000)
                head_dim = cfg.hidden_size // cfg.num_attention_heads
                rope = re_mod.get_rope(
                    head_dim,
                    max_position=cfg.max_position_embeddings,
                    rope_parameters=cfg.rope_parameters,
                    dual_chunk_attention_config=getattr(cfg, "dual_chunk_attention_config", None),
                )
            elif arch == "Qwen3ForCausalLM":  # qwen3.py: Qwen3DecoderLayer, Qwen3Attention
                set_default_rope_theta(cfg, default_theta=1000000)
                head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
                rope = re_mod.get_rope(
                    head_dim,
                    max_position=cfg.max_position_embeddings,
                    rope_parameters=cfg.rope_parameters,
                    dual_chunk_attention_config=getattr(cfg, "dual_chunk_attention_config", None),
                )
            elif arch == "GptOssForCausalLM":
                head_dim = cfg.head_dim
                rp = cfg.rope_parameters
                rope = re_mod.get_rope(
                    head_dim,
                    max_position=cfg.max_position_embeddings,
                    dtype=torch.float32,
                    rope_parameters={
                        "rope_theta": rp["rope_theta"],
                        "rope_type": "yarn",
                        "factor": rp["factor"],
                        "original_max_position_embeddings": rp["original_max_position_embeddings"],
                        "beta_fast": rp["beta_fast"],
                        "beta_slow": rp["beta_slow"],
                        "truncate": rp.get("truncate", True),
                    },
                    is_neox_style=True,
                )
            elif arch == "DeepseekV3ForCausalLM":
                from vllm.model_executor.models.deepseek_v2 import yarn_get_mscale

                flat = False
                head_dim = cfg.qk_rope_head_dim
                qk_head_dim = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim
                rp = cfg.rope_parameters
                if rp["rope_type"] != "default":
                    rp["rope_type"] = (
                        "deepseek_llama_scaling" if rp.get("attention_factor") == 1.0 else "deepseek_yarn"
                    )
                rope = re_mod.get_rope(
                    head_dim,
                    max_position=getattr(cfg, "max_position_embeddings", 8192),
                    rope_parameters=rp,
                    is_neox_style=False,
                )
                scaling = qk_head_dim**-0.5
                if rp["rope_type"] != "default" and rp["rope_type"] == "deepseek_yarn":
                    mscale = yarn_get_mscale(rp["factor"], float(rp.get("mscale_all_dim", False)))
                    scaling = scaling * mscale * mscale
                softmax = scaling / qk_head_dim**-0.5
            elif arch == "GPTJForCausalLM":
                head_dim = cfg.hidden_size // cfg.num_attention_heads
                rp = getattr(cfg, "rope_parameters", {})
                rp["partial_rotary_factor"] = cfg.rotary_dim / head_dim
                rope = re_mod.get_rope(
                    head_dim,
                    max_position=getattr(cfg, "max_position_embeddings", 8192),
                    rope_parameters=rp,
                    is_neox_style=False,
                )
            elif arch == "Gemma3ForCausalLM":
                head_dim = cfg.head_dim
                lt = layer_type if layer_type is not None else cfg.layer_types[0]
                rope = re_mod.get_rope(
                    head_dim,
                    max_position=cfg.max_position_embeddings,
                    rope_parameters=cfg.rope_parameters[lt],
                    is_neox_style=True,
                )
                softmax = cfg.query_pre_attn_scalar**-0.5 / head_dim**-0.5
            else:
                raise Unsupported(f"architecture {arch}: no vLLM model file reproduced")
        except Unsupported:
            raise
        except Exception as e:
            raise Unsupported(f"vLLM fails to build {arch}'s RoPE: {e!r}") from e
    return VllmRope(
        rope=rope,
        arch=arch,
        dtype=tdt,
        head_dim=head_dim,
        max_position=_table_rows(rope),
        max_model_len=max_model_len,
        softmax_scale=float(softmax),
        flat=flat,
        query_scaler=scaler,
    )


def _table_rows(rope: Any) -> int:
    """The positions ``0 .. n-1`` the engine's table serves correctly."""
    if hasattr(rope, "long_short_cos_sin_cache"):  # Phi3LongRoPEScaledRotaryEmbedding
        long = rope.use_long_rope
        return int(rope.max_position_embeddings if long else rope.original_max_position_embeddings)
    return int(rope.cos_sin_cache.shape[0])
