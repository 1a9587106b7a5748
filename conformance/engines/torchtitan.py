"""torchtitan 0.3.0: ``torchtitan.models.common.rope`` built from its model flavors.

Install (CPU, Python 3.11; tested in a fresh venv: 8 s and +1.0 GB, almost all of it triton, over
the 968 MB torch 2.13.0 + numpy venv; ``spmd-types`` pinned to the 0.2.3 torchtitan requires, the
unpinned 0.3.x being what pip picks)::

    python3 -m venv venv && venv/bin/pip install torch==2.13.0 numpy
    venv/bin/pip install --no-deps torchtitan==0.3.0 spmd-types==0.2.3 tyro docstring_parser \\
        triton==3.9.0

Imported as ``conformance.engines.torchtitan``; torchtitan is imported only inside functions.

How torchtitan builds RoPE
--------------------------
torchtitan never reads ``config.json`` for RoPE.  Each model family has a table of flavors
(``models/<family>/__init__.py``: ``llama3_configs``, ``gptoss_configs``, ``deepseekv3_configs``,
``qwen3_configs``; ``model_registry(flavor)`` returns them) whose layers each carry a
``RoPE.Config`` (``models/common/rope.py``): ``ComplexRoPE`` (complex cache, adjacent pairs
``(2i, 2i+1)``) or ``CosSinRoPE`` (rotate-half), with ``scaling`` ``"none"``, ``"llama"`` (Llama 3
bands, ComplexRoPE only) or ``"yarn"`` (``_yarn_inv_freq``).  The cache is ``max_seq_len`` rows of
float32 angles ``outer(arange, inv_freq)``; ``_maybe_check_max_pos`` asserts positions
``<= max_seq_len - 1`` (raises on CPU).  The RoPE is a pure rotation: YaRN's attention factor is
"intentionally NOT applied here -- the model folds mscale into its softmax scale" (rope.py,
``_yarn_inv_freq``); only gpt-oss (``gpt_oss/model.py``: ``softmax_scale *= mscale**2``,
``mscale = 0.1 ln(rope_factor) + 1``) and DeepSeek-V3 (``deepseek_v3/model.py``: ``mscale = 0.1 *
config.mscale * ln(rope_factor) + 1``) do so; the shared ``common/attention.py`` GQA ``Attention``
(Llama 3, Qwen3) does not.

What the adapter calls.  From the HF config it picks the family by ``model_type`` and, where a
flavor has the same shape (hidden size, layers, heads, kv heads), takes that flavor's layer-0
``attention.rope`` config verbatim (``model_registry(flavor).model.layers[0].attention.rope``): what
torchtitan runs for that checkpoint, whatever the HF config says.  Without a matching flavor it
writes the ``RoPE.Config`` a user adding that flavor would write from the HF config (``dim`` =
rotated head size, ``max_seq_len`` = ``max_position_embeddings``, ``theta`` = ``rope_theta``,
``scaling``/``scaling_factor``/``low_freq_factor``/``high_freq_factor``/
``original_max_position_embeddings`` or ``rope_factor``/``beta_fast``/``beta_slow``/
``original_seq_len``/``truncate`` from ``rope_scaling``), into the family's attention config.
Families torchtitan lacks are ported through the nearest one: Llama-like half-layout models
(Qwen2, Gemma 3's sliding layers, ...) through Qwen3's ``CosSinRoPE`` + shared ``Attention``.  It
builds ``config.build()`` (the RoPE module) and calls ``rope(q, k, positions)``; the attention
module is built on the meta device only to read its softmax scale (``softmax_scale`` / ``scaling``
relative to ``head_dim ** -0.5``).

Layout.  ``ComplexRoPE`` pairs adjacent features.  torchtitan loads Llama checkpoints through
``llama3/state_dict_adapter.py:Llama3StateDictAdapter.from_hf``, which reverse-permutes the
``q_proj``/``k_proj`` rows (view ``(heads, 2, hd/2, dim)``, swap axes 1 and 2): the adapter applies
that reordering to HF-layout ``q``/``k``, rotates, and reorders back (exact).  DeepSeek-V3's HF
checkpoint is already interleaved (its adapter does not permute) and gpt-oss/Qwen3 use
``CosSinRoPE`` on HF's layout: no reordering.

Not expressible: linear, dynamic NTK, LongRoPE, partial rotary (a RoPE rotates the whole last
axis; only DeepSeek's MLA splits off its rope features), Qwen2-VL's sectioned M-RoPE (the only
M-RoPE, ``qwen3_5/rope.py:MRoPE``, is Qwen3-VL's interleaved T/H/W layout), Llama 4 / Ministral 3
attention temperature.

Conformance: the 8B flavor (Llama 3.1), gpt-oss 20b (YaRN, truncate false, mscale in the softmax
scale) and DeepSeek-V3 671B (mscale**2 in the softmax scale) pass; DeepSeek's table is
``4096 * 4`` = 16384 positions (DeepSeek's reference inference default), not the config's 163840.
Two engine bugs: a YaRN RoPE used with the shared ``Attention`` (Llama 3 / Qwen3 models, the path a
Qwen2.5 128K port takes) loses the attention factor (logits / 1.296 for factor 4); and the "1B" /
"3B" llama3 flavors (Llama 3.2's shapes) use Llama 3.1's ``scaling_factor`` 8 instead of 32.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from rotary.testing.engine import Unsupported

NAME = "torchtitan"
PYTHON = "3.11"
INSTALL = (
    "python3.11 -m venv $ENGINES/torchtitan/venv && . $ENGINES/torchtitan/venv/bin/activate\n"
    "pip install torch==2.13.0 numpy\n"
    "pip install --no-deps torchtitan==0.3.0 spmd-types==0.2.3 tyro docstring_parser triton==3.9.0\n"
    'pip install --no-deps -e "$ROTARY" array-api-compat'
)

#: model_type -> (torchtitan family module, its flavor table, cache class used for a new flavor).
_FAMILIES = {
    "llama": ("llama3", "llama3_configs", "ComplexRoPE"),
    "gpt_oss": ("gpt_oss", "gptoss_configs", "CosSinRoPE"),
    "deepseek_v3": ("deepseek_v3", "deepseekv3_configs", "ComplexRoPE"),
    "qwen3": ("qwen3", "qwen3_configs", "CosSinRoPE"),
}
#: HF configs whose q/k are already in torchtitan's pair layout (no state-dict permutation).
_INTERLEAVED = {"deepseek_v3", "gptj"}


def version() -> str:
    """torchtitan's version; ``ImportError`` with the recipe when it is missing."""
    try:
        from importlib.metadata import version as _v

        import torchtitan  # noqa: F401
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(f"torchtitan is not installed; install it with:\n{INSTALL}") from e
    return _v("torchtitan")


def _rope_params(config: Mapping[str, Any], layer_type: str | None) -> dict[str, Any]:
    rp = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if layer_type is not None and isinstance(rp.get(layer_type), Mapping):
        rp = rp[layer_type]
    return dict(rp)


def _head_dim(config: Mapping[str, Any]) -> int:
    if config.get("qk_rope_head_dim"):
        return int(config["qk_rope_head_dim"])
    if config.get("head_dim"):
        return int(config["head_dim"])
    return int(config.get("hidden_size", config.get("n_embd"))) // int(
        config.get("num_attention_heads", config.get("n_head"))
    )


def _lacks(config: Mapping[str, Any], rp: Mapping[str, Any], rtype: str) -> list[str]:
    why = []
    if rtype not in ("default", "llama3", "yarn", "mrope"):
        why.append(f"no {rtype!r} RoPE scaling (RoPE.Config.scaling is none/llama/yarn)")
    if "mrope_section" in rp:
        why.append(
            "no Qwen2-VL M-RoPE (its only MRoPE, qwen3_5/rope.py, is Qwen3-VL's interleaved T/H/W layout)"
        )
    if not config.get("qk_rope_head_dim"):  # DeepSeek's MLA splits its rope features off itself
        full = _head_dim(config)
        rot = full
        for key in ("partial_rotary_factor", "rotary_pct"):
            if config.get(key) is not None:
                rot = int(full * float(config[key]))
        rot = int(config.get("rotary_dim") or rot)
        if rot != full:
            why.append(f"no partial rotary ({rot} of {full} features): a RoPE rotates the whole last axis")
    if rp.get("llama_4_scaling_beta") is not None or config.get("attn_temperature_tuning"):
        why.append("no Llama 4 / Ministral 3 attention temperature (query scale)")
    return why


def _flavor(config: Mapping[str, Any], family: str, table: str) -> tuple[Any, str | None]:
    """The family's attention config of the flavor shaped like ``config`` (else the first
    flavor's, as a template), and the flavor's name (``None`` when none matched)."""
    import importlib

    mod = importlib.import_module(f"torchtitan.models.{family}")
    names = list(getattr(mod, table))
    shape = (
        config.get("hidden_size"),
        config.get("num_hidden_layers"),
        config.get("num_attention_heads"),
        config.get("num_key_value_heads", config.get("num_attention_heads")),
    )
    template = None
    for name in names:
        model = mod.model_registry(name).model
        att = model.layers[0].attention
        n_heads = getattr(att, "n_heads", None)
        n_kv = getattr(att, "n_kv_heads", None) or n_heads
        if template is None and not name.startswith("debug"):
            template = att
        if (model.dim, len(model.layers), n_heads, n_kv) == shape:
            return att, name
    return template, None


def _new_rope_config(
    cls: Any, config: Mapping[str, Any], rp: Mapping[str, Any], rtype: str, theta: float
) -> Any:
    """The ``RoPE.Config`` a user adding a flavor for this HF config writes."""
    kw: dict[str, Any] = {
        "dim": _head_dim(config),
        "max_seq_len": int(config.get("max_position_embeddings", 4096)),
        "theta": float(theta),
    }
    if rtype == "llama3":
        kw.update(
            scaling="llama",
            scaling_factor=float(rp["factor"]),
            low_freq_factor=float(rp.get("low_freq_factor", 1.0)),
            high_freq_factor=float(rp.get("high_freq_factor", 4.0)),
            original_max_position_embeddings=int(rp.get("original_max_position_embeddings", 8192)),
        )
    elif rtype == "yarn":
        kw.update(
            scaling="yarn",
            rope_factor=float(rp["factor"]),
            beta_fast=float(rp.get("beta_fast", 32.0)),
            beta_slow=float(rp.get("beta_slow", 1.0)),
            original_seq_len=int(
                rp.get("original_max_position_embeddings", config.get("max_position_embeddings", 4096))
            ),
            truncate=bool(rp.get("truncate", True)),
        )
    return cls.Config(**kw)


class TorchtitanRope:
    """A torchtitan RoPE module, fed Hugging Face-layout ``q``/``k``."""

    angles = "float32"

    def __init__(self, module: Any, dtype: str, permute: bool, softmax_scale: float) -> None:
        import torch

        self.module = module
        self.permute = permute
        self.softmax_scale = softmax_scale
        self.dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
        self.max_position = int(module.cache.shape[0])

    def _in(self, x: np.ndarray) -> Any:
        import torch

        x = np.asarray(x, dtype=np.float32)
        n, h, d = x.shape
        if self.permute:  # Llama3StateDictAdapter._reverse_permute: 2i + j <- j * d/2 + i
            x = x.reshape(n, h, 2, d // 2).swapaxes(-1, -2).reshape(n, h, d)
        return torch.from_numpy(np.ascontiguousarray(x)).to(self.dtype)[None]

    def _out(self, y: Any) -> np.ndarray:
        y = y[0].float().numpy()
        if self.permute:
            n, h, d = y.shape
            y = y.reshape(n, h, d // 2, 2).swapaxes(-1, -2).reshape(n, h, d)
        return y

    def rotate(self, q: np.ndarray, k: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(q, k)`` through ``rope(query, key, positions)`` (``positions`` as ``(1, tokens)``)."""
        import torch

        positions = np.asarray(positions, dtype=np.int64)
        if positions.ndim != 1:
            raise Unsupported("torchtitan has no Qwen2-VL M-RoPE: positions must be (tokens,)")
        pos = torch.from_numpy(positions)[None]
        with torch.no_grad():
            qo, ko = self.module(self._in(q), self._in(k), pos)
        return self._out(qo), self._out(ko)


def build(config: Mapping[str, Any], *, layer_type: str | None, dtype: str) -> TorchtitanRope:
    """torchtitan's RoPE for ``config``: its flavor's, or a new flavor's written from the config."""
    version()
    import torch
    from torchtitan.models.common import rope as titan_rope

    model_type = str(config.get("model_type", ""))
    sliding = model_type == "gemma3_text" and layer_type == "sliding_attention"
    rp = {} if sliding else _rope_params(config, layer_type)
    rtype = str(rp.get("rope_type", rp.get("type", "default")))
    why = _lacks(config, rp, rtype)
    if why:
        raise Unsupported("torchtitan 0.3.0 has " + "; ".join(why))
    theta = config.get("rope_theta", rp.get("rope_theta", config.get("rotary_emb_base", 10000.0)))
    if sliding:  # Gemma 3's local layers: plain RoPE on rope_local_base_freq
        theta = config.get("rope_local_base_freq", 10000.0)
    family, table, cls_name = _FAMILIES.get(model_type, ("qwen3", "qwen3_configs", "CosSinRoPE"))
    if rtype == "llama3":
        cls_name = "ComplexRoPE"  # CosSinRoPE raises NotImplementedError for llama scaling
    att, flavor = _flavor(config, family, table)
    if flavor is not None:
        rope_cfg = att.rope
    else:
        rope_cfg = _new_rope_config(getattr(titan_rope, cls_name), config, rp, rtype, theta)
        changes: dict[str, Any] = {"rope": rope_cfg}
        if model_type == "deepseek_v3":  # the reference's ModelArgs.mscale is HF's mscale_all_dim
            changes["mscale"] = float(rp.get("mscale_all_dim", 1.0) or 1.0)
        for name, key in (("n_heads", "num_attention_heads"), ("n_kv_heads", "num_key_value_heads")):
            if hasattr(att, name) and getattr(att, name) is not None and config.get(key):
                changes[name] = int(config[key])
        if (
            hasattr(att, "head_dim")
            and getattr(att, "head_dim", None) is not None
            and model_type != "deepseek_v3"
        ):
            changes["head_dim"] = _head_dim(config)
        if hasattr(att, "dim") and config.get("hidden_size"):
            changes["dim"] = int(config["hidden_size"])
        att = dataclasses.replace(att, **changes)
    with torch.device("meta"):
        attn = att.build()
    qk_dim = getattr(attn, "qk_head_dim", None) or getattr(attn, "head_dim", None)
    scale = getattr(attn, "softmax_scale", None) or getattr(attn, "scaling", None)
    rel = 1.0 if scale is None or qk_dim is None else float(scale) * math.sqrt(qk_dim)
    module = rope_cfg.build()
    permute = isinstance(module, titan_rope.ComplexRoPE) and model_type not in _INTERLEAVED
    return TorchtitanRope(module, dtype, permute, rel)
