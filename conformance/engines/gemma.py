"""Google DeepMind's ``gemma`` 4.0.1 (JAX, ``gemma.gm``): the RoPE its attention layers apply.

Install (CPU, Python 3.12: ``gemma`` 4.x requires it, 3.3.0 is the last release for 3.11; measured
here from a warm pip cache: 3.5 minutes, venv 2.9 GB, no torch)::

    python3.12 -m venv $ENGINES/gemma/venv && cd $ENGINES/gemma
    venv/bin/pip install "jax[cpu]" flax einops jaxtyping treescope sentencepiece absl-py \
        "etils[edc,enp,epath,epy,etree]"
    venv/bin/pip install --no-deps gemma==4.0.1 kauldron clu grain ...   # the list in INSTALL
    venv/bin/pip install --no-deps -e "$ROTARY" array-api-compat   # rotary, for the checker

(``pip install gemma`` resolves for many minutes: its ``kauldron`` dependency pulls the whole
training stack.  The ``--no-deps`` list in :data:`INSTALL` is what ``import gemma.gm.nn._gemma``
needs: ``_gemma`` imports ``gm.ckpts``, whose policy loader touches ``kauldron.train`` and so
``clu.metric_writers``, which imports TensorFlow.)

How gemma gets a model's RoPE
-----------------------------
``gemma`` never reads a Hugging Face ``config.json``: it ships one class per checkpoint
(``gemma/gm/nn/_gemma.py``: ``Gemma2_2B`` ... ``Gemma3_27B``), each a ``Transformer`` with a
``TransformerConfig`` (``gm/nn/_config.py``) whose RoPE fields are ``head_dim``,
``attention_types`` (``LOCAL_SLIDING`` / ``GLOBAL`` per layer; Gemma 3: the pattern
``GEMMA3_ATTENTION_PATTERN``, five sliding layers then one global), ``local_base_frequency`` /
``global_base_frequency`` (Gemma 3: 10_000 / 1_000_000) and ``local_scale_factor`` /
``global_scale_factor`` (Gemma 3 4B, 12B, 27B: global 8.0).  ``Transformer.setup`` gives each
``Block`` (and its ``Attention``) the local or the global pair by the layer's attention type, and
``Attention.__call__`` rotates q and k with
``gm.math._positional_embeddings.apply_rope(x[B, L, N, H], positions[B, L], base_frequency=,
scale_factor=)``: half layout (``jnp.split`` into halves), ``timescale = base**(2i/H)`` in float32,
``angle = pos / timescale / scale_factor`` (position interpolation), sin/cos in float32, the
product in float32 (bfloat16 inputs promote), cast back to the input's dtype.

The adapter maps a Hugging Face config to a gemma model as follows:

* a Gemma checkpoint that gemma ships (``model_type`` ``gemma2``, ``gemma3_text``/``gemma3``, and
  ``num_hidden_layers``, ``hidden_size``, ``num_attention_heads``, ``num_key_value_heads``,
  ``head_dim`` equal to a shipped class's): **that class**, with its own config (gemma-3-4b's
  text config is ``gm.nn.Gemma3_4B``); the config's RoPE keys are not read, as gemma does not
  read them;
* any other Gemma 2/3 config: the family's shipped config with the checkpoint's sizes and RoPE
  keys (``rope_local_base_freq`` -> ``local_base_frequency``, ``rope_theta`` ->
  ``global_base_frequency``, a ``linear`` factor on the full-attention layers ->
  ``global_scale_factor``, ``layer_types`` or ``sliding_window_pattern`` -> ``attention_types``),
  as the shipped classes write them;
* another model type (Llama, Qwen, ...): gemma ships no such model, but its building blocks are
  public ("Allow users to create their own transformers", ``gm.nn``): a port onto a
  ``TransformerConfig`` with every layer ``GLOBAL``, ``rope_theta`` -> ``global_base_frequency``,
  a ``linear`` factor -> ``global_scale_factor``.

The adapter then binds that ``Transformer`` (no weights: flax builds the submodules in ``setup``),
takes the ``Attention`` module of the first layer of the asked layer type (``sliding_attention``
-> ``LOCAL_SLIDING``, ``full_attention`` -> ``GLOBAL``; no layer type: layer 0) and calls
``apply_rope`` with that module's ``rope_base_frequency`` and ``rope_scale_factor``, exactly as
its ``__call__`` does: q ``(1, tokens, heads, head_dim)`` and k apart, int32 positions
``(1, tokens)``, inside ``jax.jit``, in the model dtype.  ``softmax_scale`` is the module's
``query_pre_attn_scalar`` over the config's (``query_pre_attn_scalar**-0.5``, else
``head_dim**-0.5``): 1 wherever gemma scales the queries as the checkpoint does.

Not expressible (``Unsupported``): every RoPE scaling but ``linear`` (dynamic NTK, Llama 3, YaRN,
LongRoPE: ``apply_rope`` has a base and a position divisor only); a per-position query scale;
partial rotary (Phi-2, GPT-NeoX, GPT-J: gemma's only partial RoPE, Gemma 4's ``rope_proportion``,
rotates the first pairs of each *half* of the head with exponents over the whole head, not the
first features with exponents over the rotated ones); the interleaved layout (gemma has no
checkpoint converter that would reorder the q/k rows); M-RoPE; multi-head latent attention;
Gemma 3n and Gemma 4 (``gm.nn.gemma3n``, ``gm.nn.gemma4``: other modules, not wired here).
gemma's RoPE takes per-token positions, no packed input (``cu_seqlens``): the ``thd`` checks are
not applicable.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from rotary.testing.engine import Unsupported

NAME = "gemma"
PYTHON = "3.12"
INSTALL = """\
python3.12 -m venv $ENGINES/gemma/venv && cd $ENGINES/gemma
venv/bin/pip install "jax[cpu]" flax einops jaxtyping treescope sentencepiece absl-py \\
    "etils[edc,enp,epath,epy,etree]"
venv/bin/pip install --no-deps gemma==4.0.1 kauldron clu grain array_record dialog lark \\
    ml_collections immutabledict typeguard wrapt six chex toolz cloudpickle portpicker \\
    tensorflow tensorboard keras tensorflow-datasets tensorflow-metadata promise toml gast \\
    astunparse termcolor packaging flatbuffers google-pasta opt-einsum h5py namex optree rich \\
    markdown-it-py mdurl pygments requests urllib3 idna certifi charset-normalizer pandas \\
    python-dateutil pytz tzdata mediapy ipython traitlets matplotlib pillow pyparsing cycler \\
    kiwisolver fonttools
venv/bin/pip install --no-deps -e "$ROTARY" array-api-compat"""
DTYPES = ("float32", "bfloat16")

__all__ = ["DTYPES", "INSTALL", "NAME", "PYTHON", "build", "version"]

# HF model_type -> the gemma family whose shipped classes it is matched against
_FAMILIES = {"gemma2": "Gemma2", "gemma3_text": "Gemma3", "gemma3": "Gemma3"}
_SHIPPED = {
    "Gemma2": ("Gemma2_2B", "Gemma2_9B", "Gemma2_27B"),
    "Gemma3": ("Gemma3_270M", "Gemma3_1B", "Gemma3_4B", "Gemma3_12B", "Gemma3_27B"),
}
_NOT_WIRED = ("gemma", "gemma3n", "gemma3n_text", "gemma4", "gemma4_text")


def _import() -> Any:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # (gm.ckpts imports TensorFlow)
    try:
        from gemma.gm.nn import _gemma
    except ImportError as e:  # pragma: no cover
        raise ImportError(f"gemma is not installed ({e}); install it with:\n{INSTALL}") from e
    return _gemma


def version() -> str:
    """gemma's version, with JAX's (raises ImportError with the install recipe when missing)."""
    _import()
    import gemma
    import jax

    return f"{gemma.__version__} (jax {jax.__version__})"


def _get(config: Mapping[str, Any], *names: str, default: Any = None) -> Any:
    for n in names:
        if config.get(n) is not None:
            return config[n]
    return default


def _base(theta: Any) -> Any:
    """A base frequency as the shipped configs write it (an int: ``1_000_000``)."""
    t = float(theta)
    return int(t) if t.is_integer() else t


def _rope_params(config: Mapping[str, Any], layer_type: str) -> dict[str, Any]:
    """The config's RoPE parameters for one layer type (legacy ``rope_scaling`` or
    ``rope_parameters``, per layer type or not)."""
    rs = _get(config, "rope_parameters", "rope_scaling", default={}) or {}
    if isinstance(rs.get("full_attention"), Mapping) or isinstance(rs.get("sliding_attention"), Mapping):
        return dict(rs.get(layer_type) or {})
    rs = dict(rs)
    if config.get("model_type") in _FAMILIES and layer_type == "sliding_attention":
        # Gemma 3's legacy keys: rope_scaling is the full layers'; the sliding ones use
        # rope_local_base_freq unscaled
        return {"rope_theta": _get(config, "rope_local_base_freq", default=10_000.0)}
    return rs


def _scale_factor(rs: Mapping[str, Any]) -> float:
    kind = str(rs.get("rope_type", rs.get("type", "default")))
    if kind == "default":
        return 1.0
    if kind == "linear":
        return float(rs["factor"])
    raise Unsupported(
        f"gemma has no {kind!r} RoPE scaling: apply_rope takes a base frequency and a linear "
        "scale_factor (position interpolation) only"
    )


def _check_expressible(config: Mapping[str, Any], head_dim: int) -> None:
    mt = str(config.get("model_type", ""))
    if mt in _NOT_WIRED:
        raise Unsupported(f"gemma's {mt!r} models (other modules) are not wired in this adapter")
    if "qk_rope_head_dim" in config or "kv_lora_rank" in config:
        raise Unsupported("no multi-head latent attention in gemma")
    rs = _get(config, "rope_parameters", "rope_scaling", default={}) or {}
    if rs.get("mrope_section") is not None or str(rs.get("type", rs.get("rope_type"))) == "mrope":
        raise Unsupported("no M-RoPE in gemma's text models")
    if _get(config, "llama_4_scaling_beta") is not None or rs.get("llama_4_scaling_beta") is not None:
        raise Unsupported("no per-position query scale (llama_4_scaling_beta) in gemma")
    frac = _get(config, "partial_rotary_factor", "rotary_pct")
    if mt == "gptj":
        raise Unsupported(
            "GPT-J's interleaved pairs over 64 of 256 features: gemma rotates halves (no converter "
            "reorders q/k rows) and has no partial rotary of that kind"
        )
    if frac is not None and float(frac) < 1.0:
        raise Unsupported(
            "partial rotary: gemma's only partial RoPE (Gemma 4's rope_proportion) rotates the first "
            "pairs of each half of the head with exponents over the whole head, not the first "
            f"{int(head_dim * float(frac))} features with exponents over them"
        )


def _config_for(config: Mapping[str, Any]) -> tuple[Any, str]:
    """gemma's ``TransformerConfig`` for ``config``, and where it comes from."""
    _gemma = _import()
    from gemma.gm.nn import _config, _modules

    mt = str(config.get("model_type", ""))
    n_layers = int(_get(config, "num_hidden_layers", "n_layer"))
    hidden = int(_get(config, "hidden_size", "n_embd"))
    n_heads = int(_get(config, "num_attention_heads", "n_head"))
    n_kv = int(_get(config, "num_key_value_heads", default=n_heads))
    head_dim = int(_get(config, "head_dim", default=hidden // n_heads))
    _check_expressible(config, head_dim)
    local, glob = _modules.AttentionType.LOCAL_SLIDING, _modules.AttentionType.GLOBAL
    family = _FAMILIES.get(mt)
    if family is not None:
        for name in _SHIPPED[family]:
            c = getattr(_gemma, name).config
            if (c.num_layers, c.embed_dim, c.num_heads, c.num_kv_heads, c.head_dim) == (
                n_layers,
                hidden,
                n_heads,
                n_kv,
                head_dim,
            ):
                return c, f"gm.nn.{name}"
    full, sliding = _rope_params(config, "full_attention"), _rope_params(config, "sliding_attention")
    types = config.get("layer_types")
    if types is not None:
        kinds = tuple(local if t == "sliding_attention" else glob for t in types)
    elif family == "Gemma3":
        kinds = _config.make_attention_layers_types(_gemma.GEMMA3_ATTENTION_PATTERN, num_layers=n_layers)
    elif family == "Gemma2":
        kinds = _config.make_attention_layers_types((local, glob), num_layers=n_layers)
    else:
        kinds = (glob,) * n_layers
    theta = _get(full, "rope_theta") or _get(config, "rope_theta", "rotary_emb_base", default=10_000.0)
    local_theta = _get(sliding, "rope_theta") or theta
    template = getattr(_gemma, _SHIPPED[family][0]).config if family else None
    fields: dict[str, Any] = {
        "num_embed": int(config.get("vocab_size", 256)),
        "embed_dim": hidden,
        "hidden_dim": int(config.get("intermediate_size", 4 * hidden)),
        "num_heads": n_heads,
        "head_dim": head_dim,
        "num_kv_heads": n_kv,
        "attention_types": kinds,
        "local_base_frequency": _base(local_theta),
        "global_base_frequency": _base(theta),
        "local_scale_factor": _scale_factor(sliding) if family else 1.0,
        "global_scale_factor": _scale_factor(full),
    }
    if template is not None:
        return dataclasses.replace(template, **fields, vision_encoder=None), f"{family} family config"
    return (
        _config.TransformerConfig(
            final_logit_softcap=None, use_post_attn_norm=False, use_post_ffw_norm=False, **fields
        ),
        "a port onto gm.nn's TransformerConfig",
    )


def _jnp_dtype(dtype: str) -> Any:
    import jax.numpy as jnp

    try:
        return {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}[dtype]
    except KeyError:
        raise Unsupported(f"dtype {dtype!r}") from None


class _Rope:
    """One gemma ``Attention`` module's RoPE, called as its ``__call__`` calls it."""

    angles = "float32"
    max_position = None  # (no table: angles from the positions on every call)

    def __init__(self, attn: Any, dtype: str, softmax_scale: float, source: str) -> None:
        import jax
        from gemma.gm.math import _positional_embeddings

        self.attn = attn
        self.dtype = dtype
        self.softmax_scale = softmax_scale
        self.source = source
        base, scale = attn.rope_base_frequency, attn.rope_scale_factor

        def rope(x: Any, p: Any) -> Any:  # Attention.__call__ (gm/nn/_modules.py)
            return _positional_embeddings.apply_rope(x, p, base_frequency=base, scale_factor=scale)

        self._fn = jax.jit(rope)

    def rotate(self, q: np.ndarray, k: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        import jax.numpy as jnp

        pos = np.asarray(positions)
        if pos.ndim != 1:
            raise Unsupported("M-RoPE positions")
        p = jnp.asarray(pos[None], dtype=jnp.int32)  # segment_pos (B, L), int32 as the Transformer's
        dt = _jnp_dtype(self.dtype)
        out = []
        for x in (q, k):
            xe = jnp.asarray(np.asarray(x, dtype=np.float32)[None], dtype=dt)
            out.append(np.asarray(self._fn(xe, p).astype(jnp.float32))[0])
        return out[0], out[1]

    def query_scale(self, positions: np.ndarray) -> None:
        return None


def build(config: Mapping[str, Any], *, layer_type: str | None, dtype: str) -> _Rope:
    """gemma's RoPE for ``config`` (see the module docstring for the mapping)."""
    _import()
    from gemma.gm.nn import _modules, _transformer

    if dtype not in DTYPES:
        raise Unsupported(f"dtype {dtype!r} (the adapter's rows cover {', '.join(DTYPES)})")
    cfg, source = _config_for(config)
    want = {
        None: None,
        "sliding_attention": _modules.AttentionType.LOCAL_SLIDING,
        "full_attention": _modules.AttentionType.GLOBAL,
    }
    if layer_type not in want:
        raise Unsupported(f"gemma has no {layer_type!r} layers (LOCAL_SLIDING and GLOBAL only)")
    kinds = list(cfg.attention_types)
    if want[layer_type] is None:
        index = 0
    elif want[layer_type] in kinds:
        index = kinds.index(want[layer_type])
    else:
        raise Unsupported(f"{source} has no {want[layer_type].name} layer")
    model = _transformer.Transformer(config=dataclasses.replace(cfg, vision_encoder=None)).bind({})
    attn = model.blocks[index].attn  # Transformer.setup -> Block.setup -> Attention
    hf_scalar = config.get("query_pre_attn_scalar")
    want_scale = float(hf_scalar) ** -0.5 if hf_scalar else cfg.head_dim**-0.5
    return _Rope(attn, dtype, float(attn.query_pre_attn_scalar) / want_scale, source)
