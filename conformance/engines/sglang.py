"""sglang 0.5.23's RoPE, built the way sglang's model files build it for a Hugging Face config
(adapter for :func:`rotary.testing.check_model_rope`; imported as ``conformance.engines.sglang``).

Install (CPU, Python 3.11): :data:`INSTALL`; measured here: 405 s into a fresh venv, 2.4 GB (triton
1.0 GB, torch 0.75 GB, sglang 0.2 GB).

The sglang wheel pins ``torch==2.14.1`` and CUDA kernels (``sglang-kernel``, DeepEP, FlashMLA...);
with ``--no-deps`` it runs on the local CPU ``torch==2.13.0`` with the light pure-Python imports
its rotary module needs installed by hand, and ``SGLANG_USE_CPU_ENGINE=1`` (sglang's CPU engine,
set here before the first import).  Without ``sgl_kernel``'s CPU op, ``RotaryEmbedding.forward``
on the CPU engine runs ``forward_native`` (the code its CUDA kernels are tested against).

Code path, per load
-------------------
1. **Config reading**: the config dict is written to a temporary ``config.json`` (with the
   ``architectures`` its checkpoint publishes, where the case omits them) and read as sglang's
   ``get_config`` -> ``HfModelConfigParser.parse`` reads these model types: ``AutoConfig`` of its
   pinned ``transformers==5.19.0`` (which maps legacy ``rope_scaling`` into ``rope_parameters``),
   the text sub-config's attributes copied to the top level.  (That module imports
   ``sglang.srt.configs``, whose image preprocessing needs a torchvision built for this torch;
   PyPI's is a CUDA build, so the two steps are reproduced.)
2. **Model file**: the architecture's attention ``__init__`` call into
   ``sglang.srt.layers.rotary_embedding.get_rope`` is reproduced argument for argument, under
   ``torch.set_default_dtype(dtype)`` as sglang's model loader sets the model dtype (the cos/sin
   cache is kept in the model dtype off CUDA: ``RotaryEmbedding.__init__``):

   ============================== =============================================================
   architecture                   sglang model file: call
   ============================== =============================================================
   LlamaForCausalLM, Phi3ForCLM   ``llama.py`` ``LlamaDecoderLayer``/``LlamaAttention``:
                                  ``get_rope(head_dim, rotary_dim=partial_rotary_factor *
                                  head_dim, max_position=max_position_embeddings,
                                  base=rope_theta, rope_scaling=rope_parameters,
                                  is_neox_style=rope_is_neox_style (True))``
   Ministral3ForCausalLM          ``ministral3.py``: LlamaAttention's RoPE with ``max_position =
                                  getattr(config, "original_max_position_embeddings", 16384)``,
                                  query scale ``1 + beta log(1 + floor(pos / that))``
   Qwen2ForCausalLM, Qwen3ForCLM  ``qwen2.py``/``qwen3.py``: ``get_rope(head_dim, head_dim,
                                  max_position_embeddings, rope_theta, rope_parameters)``
   Qwen2VLForConditionalGen.      ``qwen2_vl.py``: its ``Qwen2Model`` (``MRotaryEmbedding``)
   GptOssForCausalLM              ``gpt_oss.py``: ``get_rope(head_dim, head_dim, max_position,
                                  rope_parameters["rope_theta"], rope_parameters)``
   DeepseekV3ForCausalLM          ``deepseek_v2.py`` ``DeepseekV2AttentionMLA``: ``rope_type``
                                  rewritten to ``deepseek_yarn``, ``get_rope_wrapper(
                                  qk_rope_head_dim, ..., is_neox_style=not rope_interleave)``,
                                  softmax scale from ``compute_mla_mscale_scaling``
   PhiForCausalLM                 ``phi.py``: ``get_rope(head_size, rotary_dim=partial_rotary_factor
                                  * head_size, max_position, rope_theta)``
   GPTJForCausalLM                ``gpt_j.py``: ``get_rope(head_dim, rotary_dim=config.rotary_dim,
                                  max_position, getattr(config, "rope_theta", 10000),
                                  is_neox_style=False)``
   Gemma3ForCausalLM              ``gemma3_causal.py`` ``Gemma3TextModel``: cos/sin from its
                                  ``Gemma3RotaryEmbedding`` (full layers:
                                  ``rope_parameters["full_attention"]``; sliding: default RoPE
                                  at the sliding theta), applied by ``Gemma3Attention.
                                  forward_native`` with ``apply_rotary_pos_emb``; the class is
                                  compiled from that file (importing it needs torchvision)
   ============================== =============================================================

   GPT-NeoX has no sglang model file (sglang serves it through its Transformers backend, i.e.
   Transformers' own RoPE): not supported here.
3. **Rotation**: ``rope.forward(positions, q, k)`` (the op's dispatch: ``forward_cpu`` ->
   ``forward_native`` without ``sgl_kernel``), ``q``/``k`` flattened to ``(tokens, heads *
   head_dim)`` as the model files pass them.

q/k cross in the HF layout: sglang loads HF checkpoints without permuting q/k (its
``is_neox_style`` follows the checkpoint).  Positions index a precomputed ``cos_sin_cache`` of
``max_position`` rows (``* factor`` for YaRN/linear); past it ``forward_native`` raises
``IndexError`` (``max_position`` is reported).

Conformance (rotary's float64 truth, positions to 2**20 + 3, float32 and bfloat16): 12 of the 15
cases pass, GPT-NeoX is not supported (no model file); LongRoPE switches to its long factors one
token late (``positions > original`` where transformers has ``max(positions) + 1 > original``),
dynamic NTK is one static base (see :mod:`conformance.engines.findings`).  Not checked here:
``Gemma3Attention.forward_cpu``, the path sglang's CPU engine takes on CPUs with AMX, rotates with
the attention's own ``get_rope(..., rope_scaling={"rope_type": "default"})``, which drops Gemma 3's
linear factor 8 on the full-attention layers (it needs ``sgl_kernel``'s CPU ops to run).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from typing import Any

import numpy as np

from rotary.testing.engine import Unsupported

from .cases import as_published

NAME = "sglang"
PYTHON = "3.11"
INSTALL = """\
python3.11 -m venv $ENGINES/sglang/venv && cd $ENGINES/sglang
venv/bin/pip install torch==2.13.0 numpy
venv/bin/pip install --no-deps sglang==0.5.23 transformers==5.19.0 tokenizers==0.23.2 \\
  safetensors==0.8.0 huggingface_hub triton==3.9.0 orjson psutil pybase64 requests urllib3 idna \\
  certifi packaging pillow starlette anyio msgspec pydantic pydantic_core typing_inspection pyzmq \\
  tqdm ipython traitlets pygments aiohttp multidict attrs yarl propcache aiohappyeyeballs aiosignal \\
  frozenlist regex httpx2 httpcore2 truststore h11 pyyaml
venv/bin/pip install --no-deps -e "$ROTARY" array-api-compat"""

__all__ = ["INSTALL", "NAME", "PYTHON", "build", "version"]

_DTYPES = {"float32", "bfloat16", "float16"}


def _engine() -> Any:
    os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
    try:
        import sglang
        import sglang.srt.layers.rotary_embedding
    except ImportError as e:
        raise ImportError(f"sglang is not installed ({e}); install it with:\n{INSTALL}") from e
    return sglang


def version() -> str:
    """sglang's version (raises ImportError with the install recipe when it is missing)."""
    return str(_engine().__version__)


def _hf_config(config: Mapping[str, Any]) -> Any:
    """The Transformers config sglang reads from this config.json: ``HfModelConfigParser.parse``
    (``sglang/srt/utils/hf_transformers/config.py``) for these model types, i.e.
    ``AutoConfig.from_pretrained`` and the text sub-config's attributes copied onto the top level
    where missing (that module imports ``sglang.srt.configs``, whose image processors need a
    torchvision build for this torch; the two steps are reproduced)."""
    from transformers import AutoConfig

    cfg = as_published(config)
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f)
        try:
            hf = AutoConfig.from_pretrained(d, trust_remote_code=False)
        except (ValueError, KeyError) as e:
            raise Unsupported(f"sglang cannot read this config: {e}") from None
    text = getattr(hf, "text_config", None)
    if text is not None:
        items = text.items() if hasattr(text, "items") else vars(text).items()
        for key, val in items:
            if not hasattr(hf, key) and val is not None:
                setattr(hf, key, val)
    return hf


def _get_rope_config(hf: Any) -> tuple[Any, Any]:
    """``sglang.srt.utils.hf_transformers.common.get_rope_config`` (qwen2.py's reader)."""
    rp = getattr(hf, "rope_parameters", None)
    if rp is not None:
        return rp.get("rope_theta", getattr(hf, "rope_theta", 10000)), rp
    return getattr(hf, "rope_theta", 10000), getattr(hf, "rope_scaling", None)


def _mla_mscale_scaling(rope_scaling: Mapping[str, Any], base: float) -> float:
    """``sglang.srt.configs.model_config.compute_mla_mscale_scaling``."""
    from sglang.srt.layers.rotary_embedding.yarn import yarn_get_mscale

    rope_type = rope_scaling.get("rope_type") or rope_scaling.get("type")
    if rope_type == "default":
        return base
    if not rope_scaling.get("apply_yarn_scaling", True) or not rope_scaling.get("apply_scale", True):
        return base
    mscale = yarn_get_mscale(
        rope_scaling.get("factor", 1.0), float(rope_scaling.get("mscale_all_dim", False))
    )
    return base * mscale * mscale


def _rope_args(hf: Any, arch: str, layer_type: str | None) -> dict[str, Any]:
    """The ``get_rope`` arguments of ``arch``'s sglang model file (see the module docstring)."""
    heads = hf.num_attention_heads
    rp = getattr(hf, "rope_parameters", None)
    out: dict[str, Any] = {"is_neox_style": True, "rope_scaling": None, "scale_q": None, "softmax": 1.0}
    if arch in ("LlamaForCausalLM", "MistralForCausalLM", "Phi3ForCausalLM", "Ministral3ForCausalLM"):
        if rp is not None:  # llama.py LlamaDecoderLayer.__init__
            theta, scaling = rp.get("rope_theta", 10000), rp
        else:
            theta, scaling = getattr(hf, "rope_theta", 10000), getattr(hf, "rope_scaling", None)
        if scaling is not None and getattr(hf, "original_max_position_embeddings", None):
            scaling["original_max_position_embeddings"] = hf.original_max_position_embeddings
        head_dim = getattr(hf, "head_dim", hf.hidden_size // heads)
        max_pos = getattr(hf, "max_position_embeddings", 8192)
        if arch == "Ministral3ForCausalLM":  # ministral3.py Ministral3DecoderLayer
            theta, scaling = rp["rope_theta"], rp
            max_pos = getattr(hf, "original_max_position_embeddings", 16384)
            beta = rp.get("llama_4_scaling_beta")
            if beta is not None:
                out["scale_q"] = (float(beta), int(max_pos))
        out.update(
            head_size=head_dim,
            rotary_dim=int(getattr(hf, "partial_rotary_factor", 1) * head_dim),
            max_position=max_pos,
            base=theta,
            rope_scaling=scaling,
            is_neox_style=getattr(hf, "rope_is_neox_style", True),
        )
    elif arch in ("Qwen2ForCausalLM", "Qwen2VLForConditionalGeneration", "Qwen3ForCausalLM"):
        if arch == "Qwen3ForCausalLM":  # qwen3.py Qwen3DecoderLayer
            if rp and "rope_theta" in rp:
                theta, scaling = rp["rope_theta"], rp
            else:
                theta, scaling = getattr(hf, "rope_theta", 1000000), getattr(hf, "rope_scaling", None)
        else:  # qwen2.py Qwen2DecoderLayer
            theta, scaling = _get_rope_config(hf)
        head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // heads
        out.update(
            head_size=head_dim,
            rotary_dim=head_dim,
            max_position=getattr(hf, "max_position_embeddings", 32768),
            base=theta,
            rope_scaling=scaling,
        )
    elif arch == "GptOssForCausalLM":  # gpt_oss.py GptOssDecoderLayer
        head_dim = getattr(hf, "head_dim", hf.hidden_size // heads)
        out.update(
            head_size=head_dim,
            rotary_dim=head_dim,
            max_position=getattr(hf, "max_position_embeddings", 8192),
            base=rp["rope_theta"],
            rope_scaling=rp,
        )
    elif arch == "DeepseekV3ForCausalLM":  # deepseek_v2.py DeepseekV2DecoderLayer, AttentionMLA
        scaling = rp if rp.get("rope_type") != "default" else None
        if scaling:
            scaling["rope_type"] = "deepseek_yarn"
        d = int(hf.qk_rope_head_dim)
        qk = int(hf.qk_nope_head_dim) + d
        out.update(
            head_size=d,
            rotary_dim=d,
            max_position=hf.max_position_embeddings,
            base=rp["rope_theta"],
            rope_scaling=scaling,
            is_neox_style=not getattr(hf, "rope_interleave", True),
            wrapper=True,
        )
        if scaling and scaling.get("apply_yarn_scaling", True):
            out["softmax"] = _mla_mscale_scaling(scaling, qk**-0.5) / qk**-0.5
    elif arch == "PhiForCausalLM":  # phi.py PhiAttention
        head = hf.hidden_size // heads
        out.update(
            head_size=head,
            rotary_dim=int(hf.partial_rotary_factor * head),
            max_position=getattr(hf, "max_position_embeddings", 2048),
            base=rp["rope_theta"],
        )
    elif arch == "GPTJForCausalLM":  # gpt_j.py GPTJAttention
        out.update(
            head_size=hf.hidden_size // heads,
            rotary_dim=hf.rotary_dim,
            max_position=getattr(hf, "max_position_embeddings", 8192),
            base=getattr(hf, "rope_theta", 10000),
            is_neox_style=False,
        )
    elif arch == "Gemma3ForCausalLM":  # gemma3_causal.py Gemma3TextModel (see _Gemma3Rope)
        head_dim = getattr(hf, "head_dim", hf.hidden_size // heads)
        out.update(head_size=head_dim, gemma3=True)
        out["softmax"] = float(hf.query_pre_attn_scalar) ** -0.5 / head_dim**-0.5
    else:
        raise Unsupported(
            f"no sglang model file for {arch} (sglang would serve it through its Transformers "
            "backend, i.e. Transformers' own RoPE)"
        )
    return out


class _Rope:
    """One sglang RoPE module, called as the model file's attention calls it."""

    angles = "float32"

    def __init__(self, rope: Any, args: Mapping[str, Any], dtype: str) -> None:
        self.rope, self.args, self.dtype = rope, args, dtype
        table = getattr(rope, "cos_sin_cache", None)
        if table is None:  # Phi3LongRoPEScaledRotaryEmbedding: short rows, then long rows
            table = rope.long_cos_sin_cache
        self.max_position = int(table.shape[0])
        self.softmax_scale = float(args["softmax"])
        if abs(self.softmax_scale - 1.0) < 1e-12:
            self.softmax_scale = 1.0

    def rotate(self, q: np.ndarray, k: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        import torch

        dt = getattr(torch, self.dtype)
        n, hq, d = q.shape
        pos = torch.from_numpy(np.ascontiguousarray(positions, dtype=np.int64))
        qt = torch.from_numpy(np.ascontiguousarray(q, dtype=np.float32)).to(dt)
        kt = torch.from_numpy(np.ascontiguousarray(k, dtype=np.float32)).to(dt)
        if not self.args.get("wrapper"):  # (tokens, heads * d) as the model files pass them;
            qt, kt = qt.reshape(n, hq * d), kt.reshape(n, -1)  # MLA passes (tokens, heads, d)
        with torch.no_grad():
            oq, ok = self.rope.forward(pos, qt, kt)
        return (
            oq.float().reshape(q.shape).numpy().copy(),
            ok.float().reshape(k.shape).numpy().copy(),
        )

    def query_scale(self, positions: np.ndarray) -> np.ndarray | None:
        if self.args["scale_q"] is None:
            return None
        import torch

        beta, length = self.args["scale_q"]
        pos = np.asarray(positions, dtype=np.int64)
        pos = pos[0] if pos.ndim == 2 else pos
        p = torch.from_numpy(pos)
        # ministral3.py _get_llama_4_attn_scale (then .to(q.dtype), as transformers' own
        # Ministral3Attention does: the data's rounding, not the factor's)
        s = 1 + beta * torch.log(1 + torch.floor(p / length))
        return s.float().numpy()


def _gemma3_rotary_class() -> Any:
    """sglang's ``Gemma3RotaryEmbedding``, compiled from ``sglang/srt/models/gemma3_causal.py``
    itself (importing that module needs a torchvision built for this torch)."""
    import ast
    import importlib.util

    import torch
    from torch import nn
    from transformers import ROPE_INIT_FUNCTIONS

    spec = importlib.util.find_spec("sglang.srt.models")
    assert spec is not None and spec.submodule_search_locations is not None
    path = os.path.join(next(iter(spec.submodule_search_locations)), "gemma3_causal.py")
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Gemma3RotaryEmbedding")
    ns: dict[str, Any] = {
        "torch": torch,
        "nn": nn,
        "ROPE_INIT_FUNCTIONS": ROPE_INIT_FUNCTIONS,
        "Gemma3TextConfig": Any,
    }
    exec(compile(ast.Module(body=[node], type_ignores=[]), path, "exec"), ns)
    return ns["Gemma3RotaryEmbedding"]


class _Gemma3Rope(_Rope):
    """Gemma 3 as sglang runs it off the CPU-AMX path: ``Gemma3TextModel`` computes cos/sin once
    per forward with its ``rotary_emb`` (full attention: ``rope_parameters["full_attention"]``)
    or ``rotary_emb_local`` (sliding: default RoPE at the local theta), and
    ``Gemma3Attention.forward_native`` applies them with ``apply_rotary_pos_emb``."""

    def __init__(self, hf: Any, layer_type: str | None, args: Mapping[str, Any], dtype: str) -> None:
        import copy

        rope_params = hf.rope_parameters  # Gemma3TextModel.__init__, as written there
        if isinstance(rope_params, dict) and "full_attention" in rope_params:
            global_theta = rope_params["full_attention"].get("rope_theta", 1000000.0)
            local_theta = rope_params["sliding_attention"].get("rope_theta", 10000.0)
        else:
            global_theta = rope_params.get("rope_theta", 10000.0) if rope_params else 10000.0
            local_theta = getattr(hf, "rope_local_base_freq", 10000.0)
        cfg = copy.deepcopy(hf)
        if layer_type == "sliding_attention":
            cfg.rope_parameters = {"rope_type": "default", "rope_theta": local_theta}
        else:
            cfg.rope_parameters = {**rope_params["full_attention"], "rope_theta": global_theta}
        self.emb = _gemma3_rotary_class()(config=cfg)
        self.args, self.dtype = args, dtype
        self.max_position = None
        self.softmax_scale = float(args["softmax"])
        if abs(self.softmax_scale - 1.0) < 1e-12:
            self.softmax_scale = 1.0

    def rotate(self, q: np.ndarray, k: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        import torch
        from sglang.srt.layers.rotary_embedding.utils import apply_rotary_pos_emb_native_eager

        dt = getattr(torch, self.dtype)
        pos = torch.from_numpy(np.ascontiguousarray(positions, dtype=np.int64))
        qt = torch.from_numpy(np.ascontiguousarray(q, dtype=np.float32)).to(dt)
        kt = torch.from_numpy(np.ascontiguousarray(k, dtype=np.float32)).to(dt)
        with torch.no_grad():
            cos, sin = self.emb(qt, pos[None])  # cos/sin in the hidden states' dtype
            cos, sin = cos.reshape(-1, cos.shape[-1]), sin.reshape(-1, sin.shape[-1])
            # apply_rotary_pos_emb off CUDA/NPU/AMX is this function under torch.compile
            oq, ok = apply_rotary_pos_emb_native_eager(qt, kt, cos, sin)
        return oq.float().numpy().copy(), ok.float().numpy().copy()


def build(config: Mapping[str, Any], *, layer_type: str | None, dtype: str) -> _Rope:
    """sglang's RoPE for ``config`` (see the module docstring for the code path)."""
    _engine()
    if dtype not in _DTYPES:
        raise Unsupported(f"dtype {dtype!r}")
    import torch
    from sglang.srt.layers.rotary_embedding import get_rope, get_rope_wrapper

    hf = _hf_config(config)
    arch = hf.architectures[0]  # (as_published gave the config its architectures)
    args = _rope_args(hf, arch, layer_type)
    if args.get("gemma3"):
        return _Gemma3Rope(hf, layer_type, args, dtype)
    old = torch.get_default_dtype()
    torch.set_default_dtype(getattr(torch, dtype))  # model_loader: set_default_torch_dtype
    try:
        kw = {k: args[k] for k in ("rotary_dim", "max_position", "base", "rope_scaling", "is_neox_style")}
        if args.get("wrapper"):
            rope = get_rope_wrapper(args["head_size"], **kw, device="cpu")
        else:
            rope = get_rope(args["head_size"], **kw)
    finally:
        torch.set_default_dtype(old)
    return _Rope(rope, args, dtype)
