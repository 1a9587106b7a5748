"""MaxText 0.2.5 (JAX): the RoPE its attention layer builds for a model's config.

Install (CPU, Python 3.12; measured here from a warm pip cache: 82 s, venv 930 MB)::

    python3.12 -m venv $ENGINES/maxtext/venv && cd $ENGINES/maxtext
    venv/bin/pip install jax flax && venv/bin/pip install --no-deps maxtext==0.2.5
    venv/bin/pip install --no-deps aqtp packaging pathwaysutils fastapi starlette annotated-doc \
        anyio pydantic pydantic-core typing-inspection annotated-types opentelemetry-api requests \
        urllib3 idna certifi charset-normalizer uvicorn click omegaconf jinja2 markupsafe qwix \
        tokamax immutabledict xprof fire termcolor six jaxtyping einshape tqdm
    venv/bin/pip install --no-deps -e "$ROTARY" array-api-compat   # rotary, for the checker

(the wheel's dependency list is the full TPU/GPU training stack; the list above is what
``import maxtext.layers.attentions`` needs.  Without ``google-cloud-storage``, importing its
layers prints ``[NO-OP] gcs_storage dependency missing; using stubs.`` on stdout
(``common/gcloud_stub.py``): the first line of every MaxText reproduction's ``.out``.)

How MaxText gets a model's RoPE
-------------------------------
MaxText never reads a Hugging Face ``config.json``: each checkpoint it converts
(``maxtext/checkpoint_conversion/to_maxtext.py``, hard-coded HF configs in
``utils/hf_model_configs.py``) runs with a model yml (``maxtext/configs/models/<name>.yml``)
over ``configs/base.yml``, whose RoPE keys are ``rope_type`` (``default`` | ``llama3.1`` | ``yarn``),
``rope_min_timescale``/``rope_max_timescale`` (1 / ``rope_theta``), ``local_rope_max_timescale``,
``rope_linear_scaling_factor``, ``rope_use_scale``, the YaRN keys (``rope_factor``,
``original_max_position_embeddings``, ``max_position_embeddings``, ``beta_fast``/``beta_slow``,
``rope_interleave``, ``rope_truncate``, ``rope_attention_scaling``, ``mscale``), ``use_mrope``/
``mrope_section`` and ``partial_rotary_factor``.  This adapter writes those keys from the HF config
as the shipped ymls do for the same family (``llama2-7b``, ``llama3.1-8b``, ``qwen2.5-7b``,
``gpt-oss-20b``, ``deepseek3-671b``, ``gemma3-4b``, ``qwen3-vl-*``), over the base.yml defaults, and
then calls MaxText's own selection, ``maxtext.layers.attentions.Attention.init_rotary_embedding``,
on a stand-in ``self`` carrying those fields (the decoder's constructor arguments: ``use_mrope``,
``mrope_section``, ``partial_rotary_factor``, ``attention_type``).  That method picks:

* ``model_name`` starting ``llama3.1`` -> ``embeddings.LLaMARotaryEmbedding`` (interleaved pairs;
  ``_apply_scaling_factor`` hard-codes factor 8, low 1, high 4, L0 8192: the config's values are
  never read);
* ``rope_type: yarn`` -> ``embeddings.YarnRotaryEmbedding`` (a complex64 table
  ``freqs_cis[max_position_embeddings, d/2]`` looked up with ``.at[position].get()``; its
  ``attention_scaling`` flag multiplies by ``0.1 ln(factor) + 1`` with no mscale keys; MLA instead
  multiplies the softmax scale by ``(0.1 * mscale * ln(factor) + 1)**2`` when
  ``max_position_embeddings > original_max_position_embeddings``, ``attention_mla.py``);
* ``use_mrope`` -> ``embeddings.Qwen3OmniMoeThinkerTextRotaryEmbedding`` (Qwen3-VL's *interleaved*
  M-RoPE, the only M-RoPE MaxText has; the qwen2 decoder passes ``use_mrope``/``mrope_section``);
* a ``partial_rotary_factor < 1`` constructor argument -> ``embeddings.PartialRotaryEmbedding``;
* otherwise ``embeddings.RotaryEmbedding`` (``rope_linear_scaling_factor`` multiplies the
  timescales, except on Gemma 3's sliding layers, which take ``local_rope_max_timescale``).

Each module is called as the attention layer calls it, ``rope(x[B, S, N, H], positions[B, S])`` with
int32 positions, inside ``jax.jit``, with ``fprop_dtype`` = the model dtype (``RotaryEmbedding``
casts sin/cos to the input dtype, so bfloat16 runs with bfloat16 sin/cos).

Layouts: q/k cross the protocol in the HF layout.  Where MaxText's checkpoint conversion permutes
the q/k weights, the adapter applies the same permutation to q/k and its inverse to the result:
Llama 3.1 (``param_mapping.LLAMA31_MAXTEXT_TO_HF_PARAM_HOOK_FN.adjust_rope``: half -> interleaved)
and GPT-J's rotated features (``llama_or_mistral_ckpt.permute_to_match_maxtext_rope``: interleaved
-> half).  ``YarnRotaryEmbedding(interleave=True)`` (DeepSeek MLA) reads interleaved pairs but
returns ``[real..., imag...]`` ("attention scores are invariant", its docstring); the adapter
re-interleaves its output.

Design choices a reader needs: MaxText has no rope config per checkpoint beyond its yml, so a
config key no yml sets (Qwen2.5's optional YaRN block) is mapped here the way ``gpt-oss-20b.yml``
writes YaRN; ``YarnRotaryEmbedding`` keeps a table of ``max_position_embeddings`` rows and JAX
clamps out-of-range gathers, so positions at or past it silently get the last row
(``max_position`` reports the table size); ``LLaMARotaryEmbedding`` ignores the config's llama3
constants (a Llama 3.2 factor-32 config gets factor 8); the M-RoPE layout is Qwen3-VL's
interleaved one (a Qwen2-VL config is rotated with the wrong rows at image positions).

Not expressible (``Unsupported``): dynamic NTK, LongRoPE, a YaRN ``attention_factor`` or
``mscale != mscale_all_dim`` on a non-MLA model, a per-position query scale (Ministral 3 /
``llama_4_scaling_beta``; MaxText's ``temperature_tuning`` exists for Llama 4's NoPE layers only),
interleaved layouts outside Llama 3.1 / MLA / GPT-J, model types with no MaxText family.
"""

from __future__ import annotations

import math
import types
from collections.abc import Mapping
from typing import Any

import numpy as np

from rotary.testing.engine import Unsupported

NAME = "maxtext"
PYTHON = "3.12"
INSTALL = """\
python3.12 -m venv $ENGINES/maxtext/venv && cd $ENGINES/maxtext
venv/bin/pip install jax flax && venv/bin/pip install --no-deps maxtext==0.2.5
venv/bin/pip install --no-deps aqtp packaging pathwaysutils fastapi starlette annotated-doc anyio \\
    pydantic pydantic-core typing-inspection annotated-types opentelemetry-api requests urllib3 idna \\
    certifi charset-normalizer uvicorn click omegaconf jinja2 markupsafe qwix tokamax immutabledict \
    xprof fire termcolor six jaxtyping einshape tqdm
venv/bin/pip install --no-deps -e "$ROTARY" array-api-compat"""

__all__ = ["INSTALL", "NAME", "PYTHON", "build", "version"]

# base.yml defaults of the RoPE keys (maxtext/configs/base.yml, 0.2.5).
_BASE: dict[str, Any] = {
    "rope_type": "default",
    "rope_linear_scaling_factor": 1.0,
    "rope_use_scale": True,
    "rope_min_timescale": 1,
    "rope_max_timescale": 10_000,
    "local_rope_max_timescale": -1,
    "max_position_embeddings": 163840,
    "original_max_position_embeddings": 4096,
    "rope_factor": 40,
    "beta_fast": 32,
    "beta_slow": 1,
    "mscale": 1.0,
    "rope_interleave": True,
    "rope_truncate": True,
    "rope_attention_scaling": False,
    "rope_pairwise": False,
    "use_mrope": False,
    "mrope_section": [24, 20, 20],
    "partial_rotary_factor": 1.0,
    "attention_type": "global",
}

# HF model_type -> (MaxText decoder_block, model_name of the family's yml)
_FAMILIES = {
    "llama": ("llama2", "llama2-7b"),
    "mistral": ("mistral", "mistral-7b"),
    "qwen2": ("qwen2", "qwen2.5-7b"),
    "qwen2_vl": ("qwen2", "qwen2.5-7b"),
    "qwen3": ("qwen3", "qwen3-8b"),
    "gpt_oss": ("gpt_oss", "gpt-oss-20b"),
    "deepseek_v2": ("deepseek", "deepseek2-16b"),
    "deepseek_v3": ("deepseek", "deepseek3-671b"),
    "gemma3_text": ("gemma3", "gemma3-4b"),
    "gemma3": ("gemma3", "gemma3-4b"),
    # no MaxText model: ported with its generic layers (PartialRotaryEmbedding after the
    # checkpoint conversion's permutation), as the docstring says
    "phi": ("llama2", "phi (port)"),
    "gpt_neox": ("llama2", "gpt-neox (port)"),
    "gptj": ("llama2", "gpt-j (port)"),
}


def version() -> str:
    """MaxText's version (raises ImportError with the install recipe when it is missing)."""
    try:
        from importlib.metadata import version as v

        import maxtext.layers.attentions  # noqa: F401
    except ImportError as e:  # pragma: no cover
        raise ImportError(f"MaxText is not installed ({e}); install it with:\n{INSTALL}") from e
    return v("maxtext")


def _get(config: Mapping[str, Any], *names: str, default: Any = None) -> Any:
    for n in names:
        if config.get(n) is not None:
            return config[n]
    return default


def _maxtext_config(
    config: Mapping[str, Any], layer_type: str | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The MaxText config keys (base.yml + the family's yml conventions) and the attention
    constructor arguments for this HF config, or Unsupported."""
    mt = str(config.get("model_type", ""))
    if mt not in _FAMILIES:
        raise Unsupported(f"MaxText 0.2.5 has no model for model_type {mt!r}")
    block, model_name = _FAMILIES[mt]
    c = dict(_BASE, decoder_block=block, model_name=model_name, dtype="float32")
    rs = dict(_get(config, "rope_parameters", "rope_scaling", default={}) or {})
    if isinstance(rs.get("full_attention"), Mapping):  # per-layer-type rope_parameters
        rs = dict(rs.get(layer_type or "full_attention") or {})
    kind = str(rs.get("rope_type", rs.get("type", "default")))
    theta = _get(rs, "rope_theta") or _get(config, "rope_theta", "rotary_emb_base", default=10000.0)
    c["rope_max_timescale"] = theta
    n_heads = _get(config, "num_attention_heads", "n_head")
    hidden = _get(config, "hidden_size", "n_embd")
    head_dim = int(_get(config, "head_dim", default=hidden // n_heads))
    ctor: dict[str, Any] = {
        "head_dim": head_dim,
        "partial_rotary_factor": None,
        "use_mrope": False,
        "mrope_section": None,
        "attention_type": "global",
        "permute": None,
    }
    if _get(config, "llama_4_scaling_beta") is not None or rs.get("llama_4_scaling_beta") is not None:
        raise Unsupported("no per-position query scale (llama_4_scaling_beta) in MaxText")
    if kind == "default":
        pass
    elif kind == "linear":
        c["rope_linear_scaling_factor"] = float(rs["factor"])
    elif kind == "llama3":
        if mt != "llama":
            raise Unsupported("MaxText's llama3.1 RoPE is wired to Llama models only")
        # llama3.1-8b.yml: model_name llama3.1-*, rope_type left 'default'; the scaling constants
        # are hard-coded in LLaMARotaryEmbedding._apply_scaling_factor (the config's are not read).
        c["model_name"] = "llama3.1-8b"
        ctor["permute"] = "half_to_interleaved"
    elif kind == "yarn":
        mscale, mscale_all = rs.get("mscale"), rs.get("mscale_all_dim")
        if rs.get("attention_factor") is not None:
            raise Unsupported(
                "YaRN attention_factor: MaxText's YarnRotaryEmbedding has only the "
                "0.1 ln(factor) + 1 flag (rope_attention_scaling)"
            )
        c.update(
            rope_type="yarn",
            rope_factor=rs["factor"],
            original_max_position_embeddings=int(
                rs.get("original_max_position_embeddings") or config["max_position_embeddings"]
            ),
            max_position_embeddings=int(config["max_position_embeddings"]),
            beta_fast=rs.get("beta_fast", 32),
            beta_slow=rs.get("beta_slow", 1),
            rope_truncate=bool(rs.get("truncate", True)),
        )
        if mt.startswith("deepseek"):  # deepseek3-671b.yml: MLA, interleaved, softmax-scale mscale
            c.update(
                attention_type="mla",
                rope_interleave=True,
                rope_attention_scaling=False,
                mscale=float(mscale if mscale is not None else 1.0),
            )
            ctor["head_dim"] = int(config["qk_rope_head_dim"])
            ctor["qk_head_dim"] = int(config["qk_rope_head_dim"]) + int(config["qk_nope_head_dim"])
        else:  # gpt-oss-20b.yml: concatenated layout, attention scaling on the output
            if mscale is not None or mscale_all is not None:
                raise Unsupported(
                    "YaRN mscale/mscale_all_dim outside MLA: MaxText's "
                    "rope_attention_scaling is 0.1 ln(factor) + 1 or nothing"
                )
            c.update(rope_interleave=False, rope_attention_scaling=True)
    elif kind == "mrope" or "mrope_section" in rs:
        section = [int(s) for s in rs["mrope_section"]]
        c.update(use_mrope=True, mrope_section=section)
        ctor.update(use_mrope=True, mrope_section=tuple(section))
        if kind not in ("mrope", "default"):
            raise Unsupported(f"M-RoPE with {kind!r} scaling")
    else:
        raise Unsupported(
            f"MaxText 0.2.5 has no {kind!r} RoPE scaling (base.yml rope_type: default, "
            "llama3.1 or yarn; rope_linear_scaling_factor)"
        )
    if mt == "gemma3_text" or mt == "gemma3":  # gemma3-4b.yml
        c["local_rope_max_timescale"] = _get(config, "rope_local_base_freq", default=10000.0)
        if layer_type == "sliding_attention":
            ctor["attention_type"] = "local_sliding"
    elif layer_type == "sliding_attention":
        ctor["attention_type"] = "local_sliding"
    # partial rotary (no MaxText model: the generic PartialRotaryEmbedding, as gemma4 passes it)
    frac = _get(config, "partial_rotary_factor", "rotary_pct")
    if mt == "gptj":
        frac = int(config["rotary_dim"]) / head_dim
        ctor["permute"] = "interleaved_to_half"
    if frac is not None and float(frac) < 1.0:
        ctor["partial_rotary_factor"] = float(frac)
    return c, ctor


def _jnp_dtype(dtype: str) -> Any:
    import jax.numpy as jnp

    try:
        return {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}[dtype]
    except KeyError:
        raise Unsupported(f"dtype {dtype!r}") from None


class _Rope:
    """One MaxText rotary module, called as its attention layer calls it."""

    def __init__(
        self,
        module: Any,
        dtype: str,
        permute: str | None,
        rot_dim: int,
        out_concat: bool,
        max_position: int | None,
        softmax_scale: float,
    ) -> None:
        import jax

        self.module = module
        self.dtype = dtype
        self.permute = permute
        self.rot_dim = rot_dim
        self.out_concat = out_concat
        self.max_position = max_position
        self.softmax_scale = softmax_scale
        self.angles = "float32"
        self._fn = jax.jit(lambda x, p: module(x, p))

    def _to_engine(self, x: np.ndarray) -> np.ndarray:
        r = self.rot_dim
        a, rest = x[..., :r], x[..., r:]
        if self.permute == "half_to_interleaved":  # adjust_rope (to_maxtext direction)
            a = np.stack([a[..., : r // 2], a[..., r // 2 :]], axis=-1).reshape(a.shape)
        elif self.permute == "interleaved_to_half":  # permute_to_match_maxtext_rope
            a = np.concatenate([a[..., ::2], a[..., 1::2]], axis=-1)
        return np.concatenate([a, rest], axis=-1)

    def _from_engine(self, x: np.ndarray) -> np.ndarray:
        r = self.rot_dim
        a, rest = x[..., :r], x[..., r:]
        if self.permute == "half_to_interleaved" or self.out_concat:  # engine pairs (2i, 2i+1)
            if self.permute == "half_to_interleaved":
                a = np.concatenate([a[..., ::2], a[..., 1::2]], axis=-1)
            else:  # YarnRotaryEmbedding(interleave=True) returns [real..., imag...]
                a = np.stack([a[..., : r // 2], a[..., r // 2 :]], axis=-1).reshape(a.shape)
        elif self.permute == "interleaved_to_half":
            a = np.stack([a[..., : r // 2], a[..., r // 2 :]], axis=-1).reshape(a.shape)
        return np.concatenate([a, rest], axis=-1)

    def rotate(self, q: np.ndarray, k: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        import jax.numpy as jnp

        pos = np.asarray(positions)
        if pos.ndim == 2:  # (3, tokens) -> MaxText's (batch, seq, 3)
            p = jnp.asarray(np.moveaxis(pos, 0, -1)[None], dtype=jnp.int32)
        else:
            p = jnp.asarray(pos[None], dtype=jnp.int32)
        dt = _jnp_dtype(self.dtype)
        out = []
        for x in (q, k):
            xe = jnp.asarray(self._to_engine(np.asarray(x, dtype=np.float32))[None], dtype=dt)
            y = np.asarray(self._fn(xe, p).astype(jnp.float32))[0]
            out.append(self._from_engine(y))
        return out[0], out[1]

    def query_scale(self, positions: np.ndarray) -> None:
        return None


def build(config: Mapping[str, Any], *, layer_type: str | None, dtype: str) -> _Rope:
    """MaxText's RoPE for ``config`` (see the module docstring for the mapping)."""
    version()
    from maxtext.common.common_types import AttentionType, ShardMode
    from maxtext.layers import attentions, embeddings

    c, ctor = _maxtext_config(config, layer_type)
    dt = _jnp_dtype(dtype)
    cfg = types.SimpleNamespace(**c, shard_mode=ShardMode.AUTO)
    stub = types.SimpleNamespace(
        config=cfg,
        head_dim=ctor["head_dim"],
        qk_rope_head_dim=ctor["head_dim"],
        rope_type=str(c["rope_type"]).lower(),
        rope_max_timescale=c["rope_max_timescale"],
        partial_rotary_factor=ctor["partial_rotary_factor"],
        use_mrope=ctor["use_mrope"],
        mrope_section=ctor["mrope_section"],
        is_vision=False,
        is_qwen3_hybrid=False,
        mesh=None,
        dtype=dt,
        rngs=None,
        attention_type=AttentionType.LOCAL_SLIDING
        if ctor["attention_type"] == "local_sliding"
        else AttentionType.GLOBAL,
    )
    module = attentions.Attention.init_rotary_embedding(stub)
    max_position = None
    softmax_scale = 1.0
    out_concat = False
    if isinstance(module, embeddings.YarnRotaryEmbedding):
        max_position = int(module.max_position_embeddings)
        out_concat = bool(module.interleave and not module.pairwise)
    if c["attention_type"] == "mla":  # attention_mla.py, MLA.__init__ "Set softmax scaling."
        if c["max_position_embeddings"] > c["original_max_position_embeddings"]:
            m = 0.1 * c["mscale"] * math.log(c["rope_factor"]) + 1.0
            softmax_scale = m * m
    rot_dim = ctor["head_dim"]
    if ctor["partial_rotary_factor"] is not None:
        rot_dim = int(ctor["head_dim"] * ctor["partial_rotary_factor"])
    return _Rope(module, dtype, ctor["permute"], rot_dim, out_concat, max_position, softmax_scale)
