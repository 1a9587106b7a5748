"""litgpt 0.5.13: ``litgpt.model.GPT.rope_cache`` -> ``build_rope_cache``, ``apply_rope``.

Install (CPU, Python 3.11; tested in a fresh venv: the full install, 19 s and +112 MB (lightning,
jsonargparse, ...) over the 968 MB torch 2.13.0 + numpy venv.  It pins ``huggingface-hub<1.4``: in a
venv shared with torchtune, ``datasets`` must then go back to ``<4.8``)::

    python3 -m venv venv && venv/bin/pip install torch==2.13.0 numpy
    venv/bin/pip install litgpt==0.5.13

Imported as ``conformance.engines.litgpt``; litgpt is imported only inside functions.

How litgpt builds RoPE
----------------------
litgpt never reads ``config.json``: a checkpoint is a name in its registry
(``litgpt/config.py``: ``configs``, ``Config.from_name``), whose entry sets ``block_size``,
``head_size``, ``rotary_percentage``, ``rope_base``, ``rope_condense_ratio`` (linear scaling: the
positions are divided by it), ``rope_adjustments`` (``factor`` + Llama 3 keys, or ``factor`` +
YaRN keys, or ``factor`` alone for linear), ``rope_local_base_freq``/``rope_indices`` (Gemma 3's
two tables), ``rope_interleave`` and ``latent_attention`` (DeepSeek's MLA).  ``GPT.rope_cache``
(``model.py``) turns ``rope_adjustments`` into ``extra_config`` and calls
``build_rope_cache(seq_len=max_seq_length, n_elem=rope_n_elem, condense_ratio, base, extra_config,
rope_local_base_freq)``: float32 ``cos``/``sin`` tables of ``block_size`` rows, YaRN's attention
factor multiplied into both.  ``GPT.forward`` indexes them with ``input_pos``
(``batched_index_select``: a position ``>= block_size`` raises), picks Gemma 3's table per layer
(``cos[..., rope_indices[block_idx]]``), and ``CausalSelfAttention.forward`` applies
``apply_rope(q[..., :rope_n_elem], cos, sin)`` (``apply_rope_interleave`` when
``rope_interleave``) and concatenates the unrotated rest; ``MultiheadLatentAttention`` rotates its
``qk_rope_head_dim`` features the same way.  Both attentions multiply the softmax scale by
``mscale**2`` with ``mscale = yarn_get_mscale(factor, mscale_all_dim)`` whenever
``rope_adjustments`` has ``mscale_all_dim``.

What the adapter calls.  ``GPT.rope_cache`` itself (on a stand-in ``self`` holding the ``Config``
and ``max_seq_length = block_size``), then the rows and Gemma 3 column ``GPT.forward`` selects,
then ``apply_rope``/``apply_rope_interleave`` as the attention does.  The softmax multiplier is
read from the attention module built on the meta device (``mscale ** 2``).  The ``Config`` comes
from litgpt's registry: the config's ``_name_or_path`` if it names a registered checkpoint, else
the entry of the same family (``model_type`` matched to the entry's HF name) and shape (hidden
size, layers, heads, kv heads, head size), preferring a general model over a domain variant
(Coder, Math, ...), then ``block_size == max_position_embeddings``, then
``rope_base == rope_theta``.  The registry entry is taken as is where it carries a scaling,
or where the HF config has none, or where it claims a context longer than the scaling's original
window without expressing the scaling (litgpt then runs that checkpoint unscaled: Phi-3-mini-128k).
A scaling the entry lacks but litgpt can express (the model card's YaRN for Qwen2.5, a linear
factor) is added as ``Config.from_name(name, rope_adjustments=...)`` /
``rope_condense_ratio=factor`` (the registry's own precedent: LLaMA-2-7B-32K), the way a user
extends a registered model.  Families litgpt lacks (gpt-oss, DeepSeek-V3, GPT-J) get the
``Config`` a user adding them writes: ``rotary_percentage``, ``rope_base``, ``rope_interleave``,
``latent_attention``, ``rope_adjustments`` with the keys ``GPT.rope_cache`` reads.

Layout.  Registered checkpoints are converted from HF weights without permuting q/k
(``scripts/convert_hf_checkpoint.py``), so ``apply_rope`` (rotate-half) takes HF-layout ``q``/``k``
directly.  ``apply_rope_interleave`` (DeepSeek, GPT-J) takes HF's interleaved features but returns
them de-interleaved (evens then odds, as Hugging Face's ``apply_rotary_pos_emb_interleave`` does;
``q . k`` is unchanged): the adapter re-interleaves its output so features line up (exact).

Precision.  Tables are float32 (``seq_idx / condense_ratio`` times float32 inverse frequencies).
With ``precision="bf16-true"`` (``litgpt generate``: ``fabric.setup_module`` ->
``module.to(bfloat16)``) the ``cos``/``sin`` buffers become bfloat16 and the rotation is bfloat16
arithmetic; the adapter does that for ``dtype="bfloat16"``.

Not expressible: dynamic NTK, LongRoPE (no code for it), M-RoPE, Llama 4 / Ministral 3 attention
temperature.

Conformance: plain, linear (condense ratio), Llama 3, partial (Phi-2, Pythia), GPT-J's interleaved
partial and Gemma 3's two tables pass.  Engine bugs: ``build_rope_cache``'s YaRN blend is inverted
(high-frequency dims get divided by the factor, low-frequency ones kept); without ``mscale`` keys its
attention factor is 1 instead of ``0.1 ln s + 1``; ``GPT.rope_cache`` drops
``rope_adjustments["truncate"]``; ``CausalSelfAttention`` multiplies the softmax scale by
``mscale(s, mscale_all_dim)**2`` for any YaRN model (HF does so only in DeepSeek-style MLA); the
registry's Phi-3-mini-128k-instruct runs without LongRoPE.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

import numpy as np

from rotary.testing.engine import Unsupported

NAME = "litgpt"
PYTHON = "3.11"
INSTALL = (
    "python3.11 -m venv $ENGINES/litgpt/venv && . $ENGINES/litgpt/venv/bin/activate\n"
    "pip install torch==2.13.0 numpy\npip install litgpt==0.5.13\n"
    'pip install --no-deps -e "$ROTARY" array-api-compat'
)

#: HF model_type -> pattern on a registry entry's ``hf_config["name"]``.
_FAMILY = {
    "llama": r"llama",
    "mistral": r"mistral|mathstral|codestral",
    "mixtral": r"mixtral",
    "qwen2": r"^qwen2\.?5?-(?!vl)|^qwq",
    "qwen3": r"^qwen3",
    "phi3": r"^phi-3|^phi-4",
    "phi": r"^phi-[12]",
    "gpt_neox": r"^pythia|^gpt-neox",
    "gemma": r"^gemma-[27]b|^codegemma",
    "gemma2": r"^gemma-2-",
    "gemma3_text": r"^gemma-3-",
    "falcon": r"^falcon",
}
#: HF configs whose q/k pairs are interleaved (litgpt's ``rope_interleave``).
_INTERLEAVED = {"gptj", "deepseek_v3", "deepseek_v2"}


def version() -> str:
    """litgpt's version; ``ImportError`` with the recipe when it is missing."""
    try:
        from importlib.metadata import version as _v

        import litgpt  # noqa: F401
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(f"litgpt is not installed; install it with:\n{INSTALL}") from e
    return _v("litgpt")


def _get(config: Mapping[str, Any], *keys: str, default: Any = None) -> Any:
    for key in keys:
        if config.get(key) is not None:
            return config[key]
    return default


def _shape(config: Mapping[str, Any]) -> tuple[int, int, int, int, int]:
    hidden = int(_get(config, "hidden_size", "n_embd"))
    heads = int(_get(config, "num_attention_heads", "n_head"))
    return (
        hidden,
        int(_get(config, "num_hidden_layers", "n_layer")),
        heads,
        int(_get(config, "num_key_value_heads", default=heads)),
        int(_get(config, "head_dim", default=hidden // heads)),
    )


def _layer_types(config: Mapping[str, Any]) -> list[str] | None:
    if config.get("layer_types"):
        return list(config["layer_types"])
    if config.get("model_type") == "gemma3_text":
        n, p = int(config["num_hidden_layers"]), int(config.get("sliding_window_pattern", 6))
        return ["full_attention" if (i + 1) % p == 0 else "sliding_attention" for i in range(n)]
    return None


def _registry_entry(config: Mapping[str, Any]) -> Any:
    from litgpt.config import Config, configs

    name = config.get("_name_or_path")
    if name:
        try:
            return Config.from_name(str(name))
        except ValueError:
            pass
    pattern = _FAMILY.get(str(config.get("model_type")))
    if pattern is None:
        return None
    theta = _get(config, "rope_theta", "rotary_emb_base", default=10000)
    max_pos = _get(config, "max_position_embeddings", "n_positions")
    found = []
    for entry in configs:
        if not re.search(pattern, entry["hf_config"]["name"], re.IGNORECASE):
            continue
        c = Config(**entry)
        if (c.n_embd, c.n_layer, c.n_head, c.n_query_groups, c.head_size) == _shape(config):
            found.append(c)
    variant = re.compile(r"code|math|guard|vision|distill|function|r1|32k", re.IGNORECASE)
    found.sort(
        key=lambda c: (
            bool(variant.search(c.name)),
            c.block_size != max_pos,
            float(c.rope_base) != float(theta),
        )
    )
    return found[0] if found else None


def _adjustments(config: Mapping[str, Any], rp: Mapping[str, Any], rtype: str) -> dict[str, Any] | None:
    """The litgpt ``Config`` keywords expressing the HF scaling, ``None`` if it has none."""
    if rtype == "llama3":
        return {
            "rope_adjustments": {
                "factor": float(rp["factor"]),
                "low_freq_factor": float(rp.get("low_freq_factor", 1.0)),
                "high_freq_factor": float(rp.get("high_freq_factor", 4.0)),
                "original_max_seq_len": int(rp.get("original_max_position_embeddings", 8192)),
            }
        }
    if rtype == "yarn":
        adj = {
            "factor": float(rp["factor"]),
            "beta_fast": float(rp.get("beta_fast", 32.0)),
            "beta_slow": float(rp.get("beta_slow", 1.0)),
            "original_max_seq_len": int(
                rp.get("original_max_position_embeddings", _get(config, "max_position_embeddings"))
            ),
        }
        adj.update({k: rp[k] for k in ("truncate", "mscale", "mscale_all_dim") if rp.get(k) is not None})
        return {"rope_adjustments": adj}
    if rtype == "linear":
        f = float(rp["factor"])
        return {"rope_condense_ratio": int(f) if f.is_integer() else f}
    return None


def _new_config(config: Mapping[str, Any], theta: float, extra: dict[str, Any]) -> Any:
    """The ``Config`` a user adding this (unregistered) family to litgpt writes."""
    from litgpt.config import Config

    hidden, layers, heads, kv, head = _shape(config)
    rot = head
    for key in ("partial_rotary_factor", "rotary_pct"):
        if config.get(key) is not None:
            rot = int(head * float(config[key]))
    rot = int(config.get("rotary_dim") or rot)
    kw: dict[str, Any] = {
        "name": str(config.get("model_type")),
        "block_size": int(_get(config, "max_position_embeddings", "n_positions", default=4096)),
        "n_embd": hidden,
        "n_layer": layers,
        "n_head": heads,
        "n_query_groups": kv,
        "head_size": head,
        "rotary_percentage": rot / head,
        "rope_base": theta,
        "rope_interleave": config.get("model_type") in _INTERLEAVED,
        **extra,
    }
    if config.get("qk_rope_head_dim"):
        kw["latent_attention"] = {
            k: int(config[k])
            for k in ("q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")
        }
    return Config(**kw)


class LitgptRope:
    """litgpt's ``cos``/``sin`` tables and ``apply_rope``, fed Hugging Face-layout ``q``/``k``."""

    angles = "float32"

    def __init__(self, cfg: Any, block_idx: int, dtype: str) -> None:
        import torch
        from litgpt.model import GPT, CausalSelfAttention, MultiheadLatentAttention

        self.cfg = cfg
        self.block_idx = block_idx
        self.dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
        cos, sin = GPT.rope_cache(SimpleNamespace(config=cfg, max_seq_length=cfg.block_size))
        # fabric.setup_module(model) under "bf16-true"/"16-true" casts the buffers (module.to(dtype)).
        self.cos, self.sin = cos.to(self.dtype), sin.to(self.dtype)
        self.max_position = int(cos.shape[0])
        cls = MultiheadLatentAttention if cfg.latent_attention is not None else CausalSelfAttention
        with torch.device("meta"):
            attn = cls(cfg, block_idx)
        self.softmax_scale = float(attn.mscale) ** 2

    def _one(self, x: np.ndarray, cos: Any, sin: Any) -> np.ndarray:
        import torch
        from litgpt.model import apply_rope, apply_rope_interleave

        n_elem = self.cfg.rope_n_elem
        t = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(self.dtype)
        t = t.permute(1, 0, 2)[None]  # (B, nh, T, hs), as CausalSelfAttention.forward has it
        if self.cfg.rope_interleave:
            roped = apply_rope_interleave(t[..., :n_elem], cos, sin)
            n, h = roped.shape[2], roped.shape[1]  # back to HF's interleaved order (a relabeling)
            roped = roped.reshape(1, h, n, 2, n_elem // 2).transpose(-1, -2).reshape(1, h, n, n_elem)
        else:
            roped = apply_rope(t[..., :n_elem], cos, sin)
        out = torch.cat((roped, t[..., n_elem:]), dim=-1)
        return out[0].permute(1, 0, 2).float().numpy()

    def rotate(self, q: np.ndarray, k: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(q, k)`` rotated as ``GPT.forward`` -> ``CausalSelfAttention.forward`` do."""
        import torch
        from litgpt.model import batched_index_select

        positions = np.asarray(positions, dtype=np.int64)
        if positions.ndim != 1:
            raise Unsupported("litgpt has no M-RoPE: positions must be (tokens,)")
        pos = torch.from_numpy(positions)
        cos = batched_index_select(self.cos, 0, pos).unsqueeze(0)
        sin = batched_index_select(self.sin, 0, pos).unsqueeze(0)
        if self.cfg.rope_indices is not None:
            cos = cos[..., self.cfg.rope_indices[self.block_idx]]
            sin = sin[..., self.cfg.rope_indices[self.block_idx]]
        with torch.no_grad():
            return self._one(q, cos, sin), self._one(k, cos, sin)


def build(config: Mapping[str, Any], *, layer_type: str | None, dtype: str) -> LitgptRope:
    """litgpt's RoPE for ``config``: its registry entry's, extended or written as a user would."""
    version()
    rp = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    rtype = str(rp.get("rope_type", rp.get("type", "default")))
    if "mrope_section" in rp or rtype == "mrope":
        raise Unsupported("litgpt 0.5.13 has no M-RoPE")
    if rp.get("llama_4_scaling_beta") is not None or config.get("attn_temperature_tuning"):
        raise Unsupported("litgpt 0.5.13 has no Llama 4 / Ministral 3 attention temperature (query scale)")
    types = _layer_types(config)
    block_idx = types.index(layer_type) if types and layer_type in types else 0
    theta = _get(config, "rope_theta", "rotary_emb_base", default=rp.get("rope_theta", 10000))
    extra = _adjustments(config, rp, rtype) if rtype != "default" else {}
    entry = _registry_entry(config)
    window: Any = rp.get("original_max_position_embeddings", config.get("original_max_position_embeddings"))
    if entry is not None:
        from litgpt.config import Config

        entry_scaled = entry.rope_adjustments is not None or entry.rope_condense_ratio != 1
        claims_long = window is not None and entry.block_size > int(window)
        if entry_scaled or extra == {} or (extra is None and claims_long):
            cfg = entry  # the registered checkpoint, as litgpt runs it
        elif extra is None:
            raise Unsupported(f"litgpt 0.5.13 has no {rtype!r} RoPE scaling")
        else:  # a scaling the entry lacks, added as a user extends a registered model
            if "rope_condense_ratio" in extra:
                ratio = extra["rope_condense_ratio"]
                extra = {**extra, "block_size": max(entry.block_size, int(entry.block_size * ratio))}
            cfg = Config.from_name(entry.name, **extra)
    else:
        if extra is None:
            raise Unsupported(f"litgpt 0.5.13 has no {rtype!r} RoPE scaling")
        cfg = _new_config(config, float(theta), extra)
    return LitgptRope(cfg, block_idx, dtype)
