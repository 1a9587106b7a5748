"""Megatron-core 0.19.2: its RoPE built from a Hugging Face config the way Megatron-Bridge 0.6.2 builds it.

Imported as ``conformance.engines.megatron`` (no clash with the ``megatron`` namespace package: the
engine is imported lazily, inside functions, by its full name ``megatron.core...``).

Install (CPU, tested: 51 s, venv 2.2 GB: triton 1.0 GB, torch 0.75 GB, transformers 0.1 GB)
-------------------------------------------------------------------------------------------
megatron-core 0.19.2 ships one cp312 wheel (``Requires-Python >=3.12``) but its Python code runs on
3.11: the wheel is unzipped into a 3.11 venv's site-packages (only ``datasets/helpers_cpp`` is a
cp312 extension, never imported here).  ``triton`` is needed at import (``transformer/moe/ops``),
``transformers`` 5.12.1 (inside Megatron-Bridge 0.6.2's pin ``>=5.8,<=5.12.1``) to read the config
object the way the Bridge reads it.  Transformer Engine and Apex are absent: Megatron falls back to
its unfused RoPE (see "Code path").  See ``INSTALL``.

Code path (Megatron-core 0.19.2 files, Megatron-Bridge 0.6.2 files)
-------------------------------------------------------------------
*Config mapping*, reproduced from Megatron-Bridge (the HF <-> Megatron converter; its package cannot
be imported without ~30 heavy dependencies, so its RoPE logic is restated here, line for line, with
the config object that ``transformers.AutoConfig.for_model`` builds, as the Bridge's
``hf_pretrained.config`` is):

* ``conversion/model_bridge.py`` ``MegatronModelBridge.hf_config_to_provider_kwargs`` /
  ``provider_bridge`` (the generic mapping every bridge starts from): ``rope_theta`` ->
  ``rotary_base`` (else ``transformers_compat.rope_theta_from_hf``), ``partial_rotary_factor`` ->
  ``rotary_percent`` (config *attribute* only), ``head_dim`` -> ``kv_channels``; a ``rope_scaling``
  whose type is ``"yarn"`` -> ``position_embedding_type="yarn"`` and ``yarn_*`` fields from the keys
  *present* (``factor, original_max_position_embeddings, beta_fast, beta_slow, mscale,
  mscale_all_dim``; ``truncate`` -> ``yarn_correction_range_round_to_int``), for MLA providers the
  un-prefixed MLA fields; every other rope type -> ``"rope"`` with no scaling.
* ``llama/llama_bridge.py`` ``LlamaBridge.provider_bridge``: ``llama3`` -> ``rope_scaling=True,
  rope_scaling_factor=factor`` (low/high/original are Megatron's hard-coded 1, 4, 8192), ``linear``
  -> ``seq_len_interpolation_factor=factor``; ``dynamic`` (and any other type) is silently dropped.
* ``qwen/qwen2_bridge.py`` (generic mapping), ``gpt_oss/gpt_oss_bridge.py`` (YaRN fields hard-coded:
  32, 4096, 32, 1, round_to_int False, mscale None), ``ministral3/ministral3_bridge.py`` +
  ``ministral3_provider.py`` (``rotary_base`` from ``rope_parameters["rope_theta"]``, every YaRN
  field a provider *default*: 16, 16384, 32, 1, **round_to_int False**, mscale 1, 1; the Llama 4
  query scale in ``MinistralTEDotProductAttention`` from ``torch.arange(query.shape[0])``),
  ``deepseek/deepseek_v3_bridge.py`` (``MLAModelProvider``; ``apply_rope_fusion=False``),
  ``gemma/gemma3_bridge.py`` + ``gemma3_provider.py`` (``Gemma3RotaryEmbedding``: a global
  ``RotaryEmbedding`` with ``inv_freq /= rope_scaling_factor`` and a local one; restated here from
  core ``RotaryEmbedding`` objects), ``qwen_vl/qwen25_vl_bridge.py`` + ``qwen25_vl_provider.py``
  (``position_embedding_type="mrope"``, ``mrope_section`` the provider default [16, 24, 24], never
  read from the config; used here for Qwen2-VL, whose RoPE is the same and which has no bridge).
* ``gpt_provider.py`` ``_patch_yarn_concentration_factor``: the attention's YaRN factor is
  ``_yarn_get_concentration_factor(yarn_rotary_scaling_factor, yarn_mscale, yarn_mscale_all_dim)``
  when the factor is set, else 1.

Families without a bridge are *user ports* through the same core API (said so in ``describe``):
Phi-2 (``partial_rotary_factor`` -> ``rotary_percent``), GPT-NeoX (``rotary_pct``,
``rotary_emb_base``), GPT-J (``rotary_percent = rotary_dim / head_dim``, ``rotary_interleaved``).
Phi-3 LongRoPE, and any other family, raise :class:`Unsupported` (core has no LongRoPE).

*RoPE*, Megatron-core, as ``models/gpt/gpt_model.py`` ``GPTModel.__init__`` / ``_preprocess`` and
``transformer/multi_latent_attention.py`` ``MLASelfAttention`` construct and call it:
``models/common/embeddings/rotary_pos_embedding.py`` ``RotaryEmbedding(kv_channels, rotary_percent,
rotary_interleaved, seq_len_interpolation_factor, rotary_base, rope_scaling, rope_scaling_factor)``,
``yarn_rotary_pos_embedding.py`` ``YarnRotaryEmbedding`` (``forward`` returns ``(emb, mscale)``),
``MultimodalRotaryEmbedding(position_ids, mrope_section)``; ``forward(max_seq_len, offset)`` gives the
float32 angle table ``emb [seq, 1, 1, dim]``; ``rope_utils.apply_rotary_pos_emb(t, emb, config,
mscale=, cp_group=, mla_rotary_interleaved=)`` rotates ``t [seq, batch, heads, dim]`` in ``t``'s
dtype with ``cos(emb) * mscale`` cast to it (the unfused path: ``config.apply_rope_fusion=False``;
on a GPU with Transformer Engine the Llama bridge turns on TE's fused kernel, which this CPU adapter
cannot run).  Positions: the dynamic-inference path gathers rows of a table ``forward(L)`` by
position (``inference/contexts/dynamic_context.py`` ``apply_rotary_emb_query``); each row depends on
its position only (``arange(L) + offset`` in float32, one multiply by ``inv_freq``), so the adapter
asks ``forward(run_length, offset=run_start)`` for each run of consecutive positions: the same rows,
bit for bit, without a 2**20-row table.  ``max_position`` is ``None``: Megatron recomputes the table
for the length it is asked.  ``torch.cuda.current_device`` is patched to return ``"cpu"`` during
engine calls (and, in the context-parallel path, ``pin_memory``/``.cuda()`` made no-ops).

Packed input (the ``thd`` case)
-------------------------------
``rotate_packed`` runs the thd path ``GPTModel`` takes with ``packed_seq_params``: a table from
position 0 for the longest sequence (``forward(max_seqlen, packed_seq=True)``), then
``apply_rotary_pos_emb(t, freqs, config, cu_seqlens=)`` -> ``_apply_rotary_pos_emb_thd`` (one
sequence at a time, each from row 0).  That path has no per-sequence offset, so the ragged
variant (``packed_offsets``) is not applicable (``Unsupported``, with that reason).

Expresses
---------
Plain RoPE (half or interleaved layout, partial ``rotary_percent``), linear position interpolation,
Llama 3 bands (low 1, high 4, original 8192 hard-coded: only the factor is read), YaRN (GPT path with
the attention factor on cos/sin; MLA path with the softmax-scale multiplier), M-RoPE, Gemma 3's two
RoPEs.  Not: dynamic NTK (the Llama bridge drops it silently, so ``build`` returns plain RoPE: a
failure, not "not supported"), LongRoPE (``Unsupported``).  A Bridge mapping that Megatron cannot
construct (Qwen2.5's YaRN without ``beta_fast``) propagates the engine's ``TypeError`` from ``build``.

Design choices a reader of the report needs
-------------------------------------------
* MLA (DeepSeek) rotates its 64 features interleaved by *de-interleaving* them first
  (``mla_rotary_interleaved=True``: output in the half layout, the same permutation for q and k, so
  scores are unchanged).  The adapter re-interleaves the output to the protocol's layout.
* The GPT-path YaRN factor is applied to cos and sin by the attention (``mscale=``), not by the
  embedding (``GPTModel`` discards the ``mscale`` that ``YarnRotaryEmbedding`` returns).
* ``YarnRotaryEmbedding`` builds its frequencies over ``kv_channels``, ignoring ``rotary_percent``
  (Megatron-LM PR #7476, open); no case here combines YaRN with a partial rotary.
* Absent YaRN keys stay ``None`` in the Bridge's provider: ``beta_fast=None`` crashes
  ``YarnRotaryEmbedding``; ``correction_range_round_to_int=None`` (no ``truncate`` key) is falsy, so the
  ramp bounds are not rounded while Hugging Face rounds them by default.
* Context parallelism: :func:`build_context_parallel` runs Megatron's own CP slicing single-process
  (``get_pos_emb_on_this_cp_rank`` for bshd, ``_apply_rotary_pos_emb_thd`` for packed thd) with a
  stand-in group object per rank, and reassembles the ranks' load-balanced chunks.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from rotary.testing.engine import Unsupported

__all__ = ["INSTALL", "NAME", "PYTHON", "build", "build_context_parallel", "describe", "version"]

NAME = "megatron-core"
PYTHON = "3.11"
INSTALL = """\
python3 -m venv $ENGINES/megatron/venv && cd $ENGINES/megatron
venv/bin/pip install torch==2.13.0 numpy packaging triton==3.9.0 transformers==5.12.1 array-api-compat
venv/bin/pip download --no-deps --python-version 3.12 --only-binary=:all: megatron-core==0.19.2 -d dl
(cd venv/lib/python3.11/site-packages && unzip -q -o ../../../../dl/megatron_core-0.19.2-*.whl)
venv/bin/pip install --no-deps -e "$ROTARY" array-api-compat"""

_DTYPES = ("float32", "bfloat16", "float16")


def version() -> str:
    """megatron-core's version; ``ImportError`` with the install recipe when it is missing."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from megatron.core import package_info
    except ImportError as e:
        raise ImportError(f"megatron-core is not installed; CPU recipe:\n{INSTALL}") from e
    return str(package_info.__version__)


# --------------------------------------------------------------------------------------------
# Megatron-Bridge 0.6.2's config mapping (RoPE fields only)
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass
class _Provider:
    """The RoPE fields of the provider Megatron-Bridge builds (a ``TransformerConfig`` subclass)."""

    bridge: str
    kind: str = "gpt"  # "gpt" (GPTModel), "mla", "gemma3", "mrope"
    hidden_size: int = 0
    num_attention_heads: int = 1
    num_query_groups: int | None = None
    kv_channels: int | None = None
    position_embedding_type: str = "rope"
    rotary_base: float = 10000
    rotary_percent: float = 1.0
    rotary_interleaved: bool = False
    rope_scaling: bool = False
    rope_scaling_factor: float = 1.0
    seq_len_interpolation_factor: float | None = None
    yarn: dict[str, Any] = dataclasses.field(default_factory=dict)
    mla: dict[str, Any] = dataclasses.field(default_factory=dict)
    mrope_section: list[int] | None = None
    rotary_base_local: float | None = None
    softmax_scale: float = 1.0  # relative to 1/sqrt(qk head dim)
    llama4: tuple[float, int] | None = None  # (beta, length) of Ministral 3's query scale
    apply_rope_fusion: bool = False  # what the bridge asks for (needs TE on a GPU; unfused here)
    notes: list[str] = dataclasses.field(default_factory=list)


_YARN_FIELDS = {  # GPTModelProvider dataclass fields and their defaults
    "yarn_rotary_scaling_factor": None,
    "yarn_original_max_position_embeddings": None,
    "yarn_beta_fast": None,
    "yarn_beta_slow": None,
    "yarn_mscale": None,
    "yarn_mscale_all_dim": None,
    "yarn_correction_range_round_to_int": None,
}
_YARN_MAP = (  # MegatronModelBridge.YARN_ROPE_SCALING_MAPPING
    ("factor", "yarn_rotary_scaling_factor"),
    ("original_max_position_embeddings", "yarn_original_max_position_embeddings"),
    ("beta_fast", "yarn_beta_fast"),
    ("beta_slow", "yarn_beta_slow"),
    ("mscale", "yarn_mscale"),
    ("mscale_all_dim", "yarn_mscale_all_dim"),
)
_MLA_MAP = (  # MegatronModelBridge.MLA_ROPE_SCALING_MAPPING
    ("factor", "rotary_scaling_factor"),
    ("original_max_position_embeddings", "original_max_position_embeddings"),
    ("beta_fast", "beta_fast"),
    ("beta_slow", "beta_slow"),
    ("mscale", "mscale"),
    ("mscale_all_dim", "mscale_all_dim"),
)
_CONFIG_MAP = (  # the RoPE-relevant rows of MegatronModelBridge.CONFIG_MAPPING
    ("hidden_size", "hidden_size"),
    ("num_attention_heads", "num_attention_heads"),
    ("num_key_value_heads", "num_query_groups"),
    ("head_dim", "kv_channels"),
    ("rope_theta", "rotary_base"),
    ("partial_rotary_factor", "rotary_percent"),
    ("q_lora_rank", "q_lora_rank"),
    ("kv_lora_rank", "kv_lora_rank"),
    ("qk_nope_head_dim", "qk_head_dim"),
    ("qk_rope_head_dim", "qk_pos_emb_head_dim"),
    ("v_head_dim", "v_head_dim"),
)


def _hf_config(config: Mapping[str, Any]) -> Any:
    """The ``transformers`` config object the Bridge reads (``AutoConfig`` of the config.json)."""
    try:
        from transformers import AutoConfig
    except ImportError as e:  # pragma: no cover
        raise ImportError(f"transformers reads configs as Megatron-Bridge does:\n{INSTALL}") from e
    cfg = dict(config)
    return AutoConfig.for_model(cfg.pop("model_type"), **cfg)


def _rope_theta_from_hf(hf: Any) -> float:
    """``megatron.bridge.models.conversion.transformers_compat.rope_theta_from_hf``."""
    if getattr(hf, "rope_theta", None) is not None:
        return hf.rope_theta
    rp = getattr(hf, "rope_parameters", None)
    if rp:
        if rp.get("rope_theta") is not None:
            return rp["rope_theta"]
        for key, name in (("global", "base"), ("full_attention", "rope_theta")):
            sub = rp.get(key)
            if isinstance(sub, dict) and sub.get(name) is not None:
                return sub[name]
    dt = getattr(hf, "default_theta", None)
    if isinstance(dt, int | float) and dt:
        return float(dt)
    if isinstance(dt, dict) and dt.get("global") is not None:
        return dt["global"]
    raise ValueError("rope_theta not found in config")


def _rope_type(hf: Any) -> str | None:
    rs: Any = getattr(hf, "rope_scaling", None)
    if isinstance(rs, dict) and rs:
        return rs.get("type") or rs.get("rope_type")
    return None


def _generic(hf: Any, bridge: str, *, mla: bool = False) -> _Provider:
    """``MegatronModelBridge.hf_config_to_provider_kwargs`` + ``provider_bridge`` (RoPE part)."""
    kw: dict[str, Any] = {}
    for hf_name, name in _CONFIG_MAP:
        if hasattr(hf, hf_name) and name not in kw:
            kw[name] = getattr(hf, hf_name)
    if "rotary_base" not in kw:
        with contextlib.suppress(ValueError):
            kw["rotary_base"] = _rope_theta_from_hf(hf)
    p = _Provider(bridge=bridge, kind="mla" if mla else "gpt", yarn=dict(_YARN_FIELDS))
    for name in (
        "hidden_size",
        "num_attention_heads",
        "num_query_groups",
        "kv_channels",
        "rotary_base",
        "rotary_percent",
    ):
        if name in kw:  # the dataclass default otherwise
            setattr(p, name, kw[name])
    rs: Any = getattr(hf, "rope_scaling", None)
    rope_type = _rope_type(hf)
    if rope_type == "yarn":
        if mla:
            p.mla = {m: rs[h] for h, m in _MLA_MAP if rs.get(h) is not None}
        else:
            for h, m in _YARN_MAP:
                if rs.get(h) is not None:
                    p.yarn[m] = rs[h]
            if "truncate" in rs:
                p.yarn["yarn_correction_range_round_to_int"] = rs["truncate"]
    elif mla:
        p.mla = {"rotary_scaling_factor": 1.0, "mscale_all_dim": 1.0}
    if mla:
        p.mla.update(
            {
                k: kw[k]
                for k in ("q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim")
                if kw.get(k) is not None
            }
        )
    p.position_embedding_type = "yarn" if rope_type == "yarn" and not mla else "rope"
    if rope_type not in (None, "default", "yarn"):
        p.notes.append(f"generic Bridge mapping ignores rope type {rope_type!r}")
    return p


def _provider(config: Mapping[str, Any], layer_type: str | None) -> _Provider:
    """The provider Megatron-Bridge 0.6.2 builds for ``config`` (RoPE fields), by model type."""
    mt = config.get("model_type")
    if mt == "phi3" and config.get("rope_scaling"):
        raise Unsupported("Megatron-core has no LongRoPE, and Megatron-Bridge 0.6.2 has no Phi-3 bridge")
    if mt not in _FAMILIES:
        raise Unsupported(f"Megatron-Bridge 0.6.2 has no bridge for model_type {mt!r} (and no port here)")
    hf = _hf_config(config)
    return _FAMILIES[mt](hf, layer_type)


def _llama(hf: Any, layer_type: str | None) -> _Provider:
    p = _generic(hf, "LlamaBridge")
    p.apply_rope_fusion = True
    p.rotary_percent = 1.0
    rs: Any = getattr(hf, "rope_scaling", None)
    if rs:
        rope_type = rs.get("rope_type", rs.get("type"))
        if rope_type == "llama3":
            p.rope_scaling = True
            p.rope_scaling_factor = rs.get("factor", 8.0)
        elif rope_type == "linear":
            p.seq_len_interpolation_factor = rs["factor"]
        elif rope_type not in (None, "default", "yarn"):
            p.notes.append(f"LlamaBridge drops rope type {rope_type!r} silently: plain RoPE")
    return p


def _qwen2(hf: Any, layer_type: str | None) -> _Provider:
    return _generic(hf, "Qwen2Bridge")


def _gpt_oss(hf: Any, layer_type: str | None) -> _Provider:
    p = _generic(hf, "GptOssBridge")
    p.position_embedding_type = "yarn"
    p.yarn.update(
        yarn_rotary_scaling_factor=32.0,
        yarn_original_max_position_embeddings=4096,
        yarn_beta_fast=32.0,
        yarn_beta_slow=1.0,
        yarn_correction_range_round_to_int=False,
        yarn_mscale=None,
        yarn_mscale_all_dim=None,
    )
    return p


def _ministral3(hf: Any, layer_type: str | None) -> _Provider:
    text = getattr(hf, "text_config", None) or hf
    rp = text.rope_parameters
    p = _Provider(
        bridge="Ministral3Bridge",
        hidden_size=text.hidden_size,
        num_attention_heads=text.num_attention_heads,
        num_query_groups=text.num_key_value_heads,
        kv_channels=text.head_dim,
        rotary_base=rp["rope_theta"],
        position_embedding_type="yarn",
        yarn={
            "yarn_rotary_scaling_factor": 16.0,
            "yarn_original_max_position_embeddings": 16384,
            "yarn_beta_fast": 32.0,
            "yarn_beta_slow": 1.0,
            "yarn_correction_range_round_to_int": False,
            "yarn_mscale": 1.0,
            "yarn_mscale_all_dim": 1.0,
        },
    )
    p.llama4 = (rp["llama_4_scaling_beta"], rp["original_max_position_embeddings"])
    return p


def _deepseek_v3(hf: Any, layer_type: str | None) -> _Provider:
    p = _generic(hf, "DeepSeekV3Bridge (MLAModelProvider)", mla=True)
    p.apply_rope_fusion = False
    # MLASelfAttention.__init__: softmax_scale = mscale**2 / sqrt(q_head_dim), with
    # mscale = _yarn_get_mscale(rotary_scaling_factor, mscale_all_dim) (MLATransformerConfig defaults 40, 0)
    from megatron.core.models.common.embeddings.yarn_rotary_pos_embedding import _yarn_get_mscale

    m = _yarn_get_mscale(p.mla.get("rotary_scaling_factor", 40), p.mla.get("mscale_all_dim", 0.0))
    p.softmax_scale = m * m
    return p


def _gemma3_provider(hf: Any, layer_type: str | None) -> _Provider:
    p = _generic(hf, "Gemma3ModelBridge (Gemma3ModelProvider)")
    p.kind = "gemma3"
    p.rotary_base_local = _rope_local_base_freq_from_hf(hf)
    p.rotary_base = _rope_theta_from_hf(hf)
    p.rope_scaling_factor = _rope_scaling_factor_from_hf(hf)
    # softmax_scale = 1 / sqrt(query_pre_attn_scalar), relative to 1 / sqrt(head_dim)
    p.softmax_scale = math.sqrt((p.kv_channels or 0) / hf.query_pre_attn_scalar)
    return p


def _rope_local_base_freq_from_hf(hf: Any) -> float:
    """``transformers_compat.rope_local_base_freq_from_hf``."""
    if getattr(hf, "rope_local_base_freq", None) is not None:
        return hf.rope_local_base_freq
    rp = getattr(hf, "rope_parameters", None)
    if rp:
        if rp.get("rope_local_base_freq") is not None:
            return rp["rope_local_base_freq"]
        for key, name in (("local", "base"), ("sliding_attention", "rope_theta")):
            sub = rp.get(key)
            if isinstance(sub, dict) and sub.get(name) is not None:
                return sub[name]
    raise ValueError("rope_local_base_freq not found in config")


def _rope_scaling_factor_from_hf(hf: Any, default: float = 1.0) -> float:
    """``transformers_compat.rope_scaling_factor_from_hf``."""
    rs: Any = getattr(hf, "rope_scaling", None)
    if isinstance(rs, dict) and rs.get("factor") is not None:
        return rs["factor"]
    rp = getattr(hf, "rope_parameters", None)
    if rp:
        for key in ("full_attention", "global"):
            sub = rp.get(key)
            if isinstance(sub, dict) and sub.get("factor") is not None:
                return sub["factor"]
        if rp.get("factor") is not None:
            return rp["factor"]
    return default


def _qwen2_vl(hf: Any, layer_type: str | None) -> _Provider:
    text = hf.text_config
    p = _generic(text, "Qwen25VLBridge (Qwen25VLModelProvider; Qwen2-VL has no bridge of its own)")
    p.kind = "mrope"
    p.rotary_base = _rope_theta_from_hf(text)
    p.position_embedding_type = "mrope"
    p.mrope_section = [16, 24, 24]  # Qwen25VLModelProvider.mrope_section default, not read from the config
    return p


def _port(hf: Any, bridge: str, *, percent: float, base: float, interleaved: bool = False) -> _Provider:
    rope_type = _rope_type(hf)
    p = _Provider(
        bridge=bridge,
        rotary_percent=percent,
        rotary_base=base,
        rotary_interleaved=interleaved,
        yarn=dict(_YARN_FIELDS),
    )
    if rope_type == "linear":
        p.seq_len_interpolation_factor = hf.rope_scaling["factor"]
    elif rope_type not in (None, "default"):
        raise Unsupported(f"user port through Megatron-core: no {rope_type!r} scaling in RotaryEmbedding")
    return p


def _phi(hf: Any, layer_type: str | None) -> _Provider:
    p = _port(
        hf,
        f"user port (no {type(hf).__name__} bridge): partial_rotary_factor -> rotary_percent",
        percent=getattr(hf, "partial_rotary_factor", None) or 1.0,
        base=_rope_theta_from_hf(hf),
    )
    p.hidden_size, p.num_attention_heads = hf.hidden_size, hf.num_attention_heads
    return p


def _gpt_neox(hf: Any, layer_type: str | None) -> _Provider:
    rp = hf.rope_parameters or {}
    p = _port(
        hf,
        "user port (no GPT-NeoX bridge): rotary_pct -> rotary_percent",
        percent=rp.get("partial_rotary_factor", 1.0),
        base=_rope_theta_from_hf(hf),
    )
    p.hidden_size, p.num_attention_heads = hf.hidden_size, hf.num_attention_heads
    return p


def _gptj(hf: Any, layer_type: str | None) -> _Provider:
    head_dim = hf.n_embd // hf.n_head
    rp = getattr(hf, "rope_parameters", None) or {}
    p = _port(
        hf,
        "user port (no GPT-J bridge): rotary_dim / head_dim -> rotary_percent, interleaved",
        percent=(hf.rotary_dim or head_dim) / head_dim,
        base=rp.get("rope_theta", 10000.0),
        interleaved=True,
    )
    p.hidden_size, p.num_attention_heads = hf.n_embd, hf.n_head
    return p


_FAMILIES = {
    "llama": _llama,
    "qwen2": _qwen2,
    "gpt_oss": _gpt_oss,
    "ministral3": _ministral3,
    "mistral3": _ministral3,
    "deepseek_v3": _deepseek_v3,
    "gemma3_text": _gemma3_provider,
    "gemma3": _gemma3_provider,
    "qwen2_vl": _qwen2_vl,
    "qwen2_5_vl": _qwen2_vl,
    "phi": _phi,
    "phi3": _phi,  # without LongRoPE (refused in _provider)
    "gpt_neox": _gpt_neox,
    "gptj": _gptj,
}


def describe(config: Mapping[str, Any], *, layer_type: str | None = None) -> dict[str, Any]:
    """The Megatron fields the adapter derives for ``config`` (which bridge, which RoPE class)."""
    p = _provider(config, layer_type)
    return dataclasses.asdict(p)


# --------------------------------------------------------------------------------------------
# Running Megatron-core on a CPU
# --------------------------------------------------------------------------------------------


class _Group:
    """A stand-in context-parallel process group: Megatron only asks its ``size()`` and ``rank()``."""

    def __init__(self, size: int, rank: int) -> None:
        self._size, self._rank = size, rank

    def size(self) -> int:
        return self._size

    def rank(self) -> int:
        return self._rank


@contextlib.contextmanager
def _cpu(cp: bool = False) -> Iterator[None]:
    """``torch.cuda.current_device() -> "cpu"`` (and, for CP, no pinned memory, ``.cuda()`` a no-op)."""
    import torch

    saved = torch.cuda.current_device, torch.tensor, torch.Tensor.cuda
    torch.cuda.current_device = lambda: "cpu"
    if cp:

        def tensor(*args: Any, pin_memory: bool = False, **kwargs: Any) -> Any:
            return saved[1](*args, **kwargs)

        torch.tensor = tensor
        torch.Tensor.cuda = lambda self, *a, **k: self
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        torch.cuda.current_device, torch.tensor, torch.Tensor.cuda = saved


def _runs(pos: np.ndarray) -> list[tuple[int, int]]:
    """``(start, length)`` of each run of consecutive positions."""
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


class _MegatronRope:
    """Megatron-core's RoPE for one provider, layer type and dtype."""

    angles = "float32"
    max_position: int | None = None

    def __init__(self, p: _Provider, layer_type: str | None, dtype: str) -> None:
        import torch

        if dtype not in _DTYPES:
            raise Unsupported(f"dtype {dtype!r}")
        self.p, self.dtype = p, getattr(torch, dtype)
        self.softmax_scale = p.softmax_scale
        self.describe = dataclasses.asdict(p)
        with _cpu():
            self._build(layer_type)

    def _build(self, layer_type: str | None) -> None:
        from megatron.core.models.common.embeddings.rotary_pos_embedding import (
            MultimodalRotaryEmbedding,
            RotaryEmbedding,
        )
        from megatron.core.models.common.embeddings.yarn_rotary_pos_embedding import (
            YarnRotaryEmbedding,
            _yarn_get_concentration_factor,
        )
        from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig

        p = self.p
        self.mscale = 1.0
        self.mla = p.kind == "mla"
        if self.mla:
            self.config = MLATransformerConfig(
                num_layers=1,
                hidden_size=p.hidden_size,
                num_attention_heads=p.num_attention_heads,
                rotary_base=p.rotary_base,
                apply_rope_fusion=False,
                **p.mla,
            )
            c = self.config
            # MLASelfAttention.__init__, rope_type "yarn"
            self.module: Any = YarnRotaryEmbedding(
                c.qk_pos_emb_head_dim,
                rotary_base=c.rotary_base,
                scaling_factor=c.rotary_scaling_factor,
                original_max_position_embeddings=c.original_max_position_embeddings,
                beta_fast=c.beta_fast,
                beta_slow=c.beta_slow,
                mscale=c.mscale,
                mscale_all_dim=c.mscale_all_dim,
            )
            return
        self.config = TransformerConfig(
            num_layers=1,
            hidden_size=p.hidden_size,
            num_attention_heads=p.num_attention_heads,
            num_query_groups=p.num_query_groups,
            kv_channels=p.kv_channels,
            rotary_interleaved=p.rotary_interleaved,
            apply_rope_fusion=False,
            mrope_section=p.mrope_section,
        )
        c = self.config
        common = {
            "kv_channels": c.kv_channels,
            "rotary_percent": p.rotary_percent,
            "rotary_interleaved": c.rotary_interleaved,
            "seq_len_interpolation_factor": p.seq_len_interpolation_factor,
        }
        y = p.yarn
        if p.kind == "gemma3":  # Gemma3ModelProvider.provide -> Gemma3RotaryEmbedding
            if layer_type not in ("sliding_attention", "full_attention"):
                raise ValueError("Gemma 3 has a RoPE per layer type: pass layer_type")
            if layer_type == "full_attention":
                self.module = RotaryEmbedding(
                    rope_scaling=False, rotary_base=p.rotary_base, **{**common, "rotary_percent": 1.0}
                )
                self.module.inv_freq /= p.rope_scaling_factor
            else:
                self.module = RotaryEmbedding(
                    rope_scaling=False, rotary_base=p.rotary_base_local, **{**common, "rotary_percent": 1.0}
                )
        elif p.kind == "mrope":
            self.module = MultimodalRotaryEmbedding(rotary_base=p.rotary_base, **common)
        elif p.position_embedding_type == "yarn":  # GPTModel.__init__, 'yarn'
            self.module = YarnRotaryEmbedding(
                rotary_base=p.rotary_base,
                scaling_factor=y["yarn_rotary_scaling_factor"],
                original_max_position_embeddings=y["yarn_original_max_position_embeddings"],
                beta_fast=y["yarn_beta_fast"],
                beta_slow=y["yarn_beta_slow"],
                mscale=y["yarn_mscale"],
                mscale_all_dim=y["yarn_mscale_all_dim"],
                correction_range_round_to_int=y["yarn_correction_range_round_to_int"],
                **common,
            )
        else:  # GPTModel.__init__, 'rope'
            self.module = RotaryEmbedding(
                rotary_base=p.rotary_base,
                rope_scaling=p.rope_scaling,
                rope_scaling_factor=p.rope_scaling_factor,
                **common,
            )
        # Attention._yarn_concentration_factor, as Megatron-Bridge patches it (gpt_provider.py)
        if y.get("yarn_rotary_scaling_factor") is not None:
            self.mscale = _yarn_get_concentration_factor(
                y["yarn_rotary_scaling_factor"], y.get("yarn_mscale"), y.get("yarn_mscale_all_dim")
            )

    # -- angles -------------------------------------------------------------------------------
    def _emb(self, out: Any) -> Any:
        if isinstance(out, tuple):  # YarnRotaryEmbedding.forward -> (emb, mscale)
            out, mscale = out
            if self.mla:  # MLA applies the returned mscale; GPTModel discards it
                self.mscale = mscale
        return out

    def _freqs(self, pos: np.ndarray, cp_group: _Group | None = None, packed: bool = False) -> Any:
        import torch

        if self.p.kind == "mrope":
            pid = torch.as_tensor(np.asarray(pos, dtype=np.int64).reshape(3, 1, -1))
            return self.module(pid, self.p.mrope_section, cp_group=cp_group)
        if cp_group is not None or packed:
            return self._emb(self.module(int(pos.shape[-1]), packed_seq=packed, cp_group=cp_group))
        return torch.cat([self._emb(self.module(n, offset=s)) for s, n in _runs(pos)])

    # -- rotation -----------------------------------------------------------------------------
    def _apply(self, x: np.ndarray, freqs: Any, cp_group: _Group, cu_seqlens: Any = None) -> np.ndarray:
        import torch
        from megatron.core.models.common.embeddings.rope_utils import apply_rotary_pos_emb

        t = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(self.dtype)
        if cu_seqlens is None:
            t = t[:, None]  # [seq, batch=1, heads, dim]
        y = apply_rotary_pos_emb(
            t,
            freqs,
            config=self.config,
            cu_seqlens=cu_seqlens,
            mscale=self.mscale,
            cp_group=cp_group,
            mla_rotary_interleaved=self.mla,
        )
        y = (y if cu_seqlens is not None else y[:, 0]).float().numpy()
        if self.mla:  # de-interleaved by Megatron: back to the interleaved layout (a permutation)
            h = y.shape[-1] // 2
            z = np.empty_like(y)
            z[..., 0::2], z[..., 1::2] = y[..., :h], y[..., h:]
            y = z
        return y

    def rotate(self, q: np.ndarray, k: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(q, k)`` rotated by Megatron at ``positions`` (float32 NumPy arrays)."""
        pos = np.asarray(positions, dtype=np.int64)
        with _cpu():
            freqs = self._freqs(pos)
            group = _Group(1, 0)
            return self._apply(q, freqs, group), self._apply(k, freqs, group)

    def rotate_packed(
        self, q: np.ndarray, k: np.ndarray, cu_seqlens: np.ndarray, offsets: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Packed sequences through Megatron's thd path, as ``GPTModel`` runs it with
        ``packed_seq_params`` (``qkv_format="thd"``): the table ``RotaryEmbedding(max_seqlen,
        packed_seq=True)`` from position 0, then ``apply_rotary_pos_emb(t [t, h, d], freqs, config,
        cu_seqlens=<int32>, cp_group=<size 1>)`` -> ``_apply_rotary_pos_emb_thd``, which rotates
        each sequence from row 0 of the table.  That path takes no per-sequence offset."""
        import torch

        if self.p.kind == "mrope":
            raise Unsupported("M-RoPE: Megatron's thd path takes M-RoPE angles per token, not per sequence")
        off = np.asarray(offsets, dtype=np.int64)
        if off.any():
            raise Unsupported(
                "Megatron-core's thd RoPE (rope_utils._apply_rotary_pos_emb_thd) rotates every packed "
                "sequence from position 0: it takes no per-sequence offset"
            )
        cu = np.asarray(cu_seqlens, dtype=np.int64)
        with _cpu():
            freqs = self._freqs(np.arange(int(np.diff(cu).max())), packed=True)
            group = _Group(1, 0)
            cut = torch.from_numpy(cu.astype(np.int32))
            return (
                self._apply(q, freqs, group, cu_seqlens=cut),
                self._apply(k, freqs, group, cu_seqlens=cut),
            )

    def query_scale(self, positions: np.ndarray) -> np.ndarray | None:
        """Ministral 3's Llama 4 query scale as ``MinistralTEDotProductAttention.forward`` forms it:
        from ``torch.arange(query.shape[0])``, the tokens' indices, not their positions."""
        if self.p.llama4 is None:
            return None
        import torch

        beta, length = self.p.llama4
        idx = torch.arange(np.asarray(positions).shape[-1])
        s = 1 + beta * torch.log(1 + torch.floor(idx / length))
        return s.to(self.dtype).double().numpy()


class _MegatronCPRope(_MegatronRope):
    """The same RoPE through Megatron's context-parallel path, every rank run in this process."""

    def __init__(self, p: _Provider, layer_type: str | None, dtype: str, cp_size: int, packed: bool) -> None:
        super().__init__(p, layer_type, dtype)
        self.cp_size, self.packed = cp_size, packed

    def rotate(self, q: np.ndarray, k: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Positions: ``0..S-1`` (bshd), or packed sequences each ``0..S_i-1`` (thd); each ``S_i`` a
        multiple of ``2 * cp_size``.  Each rank holds chunks ``r`` and ``2 cp - 1 - r`` of every
        sequence (Megatron's load balancing); its output is put back in sequence order."""
        import torch

        pos = np.asarray(positions, dtype=np.int64)
        row = pos[0] if pos.ndim == 2 else pos
        starts = np.flatnonzero(row == 0)
        lengths = np.diff(np.append(starts, len(row)))
        cp = self.cp_size
        mrope = self.p.kind == "mrope"
        seqs_ok = (
            bool(starts.size)
            and starts[0] == 0
            and all(np.array_equal(row[s : s + n], np.arange(n)) for s, n in zip(starts, lengths))
        )
        if not (seqs_ok or (mrope and starts.size and starts[0] == 0)):
            raise Unsupported("context parallelism rotates whole sequences from position 0 (M-RoPE: row 0)")
        if np.any(lengths % (2 * cp)) or (not self.packed and len(lengths) > 1):
            raise Unsupported(f"CP needs sequences of a multiple of 2 * cp_size = {2 * cp} (bshd: one)")
        outs = [np.empty_like(q), np.empty_like(k)]
        with _cpu(cp=True):
            for r in range(cp):
                group = _Group(cp, r)
                idx = _cp_index(starts, lengths, cp, r)
                if self.packed and mrope:  # thd, M-RoPE: angles of every packed token (exact mapping)
                    freqs = self._freqs(pos)
                    cu = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int32)
                    res = [self._apply(x[idx], freqs, group, cu_seqlens=cu) for x in (q, k)]
                elif self.packed:  # thd: table of the longest sequence, Megatron slices per sequence and rank
                    freqs = self._freqs(np.arange(int(lengths.max())), packed=True)
                    cu = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int32)
                    res = [self._apply(x[idx], freqs, group, cu_seqlens=cu) for x in (q, k)]
                else:  # bshd: GPTModel asks the embedding for this rank's slice (get_pos_emb_on_this_cp_rank)
                    freqs = self._freqs(pos, cp_group=group)
                    res = [self._apply(x[idx], freqs, group) for x in (q, k)]
                for o, y in zip(outs, res):
                    o[idx] = y
        return outs[0], outs[1]


def build(config: Mapping[str, Any], *, layer_type: str | None, dtype: str) -> _MegatronRope:
    """Megatron-core's RoPE for ``config`` as Megatron-Bridge 0.6.2 maps it (see the module doc).

    Raises :class:`Unsupported` for families neither the Bridge nor a port here covers, and
    propagates the engine's own errors (a Bridge mapping Megatron cannot build is a failure)."""
    version()
    return _MegatronRope(_provider(config, layer_type), layer_type, dtype)


def build_context_parallel(
    config: Mapping[str, Any], *, layer_type: str | None, dtype: str, cp_size: int = 2, packed: bool = False
) -> _MegatronRope:
    """:func:`build`, rotating through Megatron's context-parallel slicing with ``cp_size`` ranks
    (``packed``: the thd path, ``_apply_rotary_pos_emb_thd``; else bshd, ``get_pos_emb_on_this_cp_rank``)."""
    version()
    if cp_size < 1:
        raise ValueError("cp_size >= 1")
    return _MegatronCPRope(_provider(config, layer_type), layer_type, dtype, cp_size, packed)
