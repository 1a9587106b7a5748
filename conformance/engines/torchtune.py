"""torchtune 0.6.1: its RoPE modules, built as its model builders build them.

Install (CPU, Python 3.11; tested in a fresh venv: 28 s and +432 MB (torchtune pulls datasets,
torchdata, tiktoken, ...) over the 968 MB torch 2.13.0 + numpy venv, 1.4 GB in all)::

    python3 -m venv venv && venv/bin/pip install torch==2.13.0 numpy
    venv/bin/pip install torchtune==0.6.1 torchao==0.14.1

Imported as ``conformance.engines.torchtune`` (no clash with the engine's package); torchtune is
imported only inside the functions.

How torchtune builds RoPE
-------------------------
torchtune never reads a checkpoint's ``config.json`` for RoPE: each model builder
(``torchtune/models/<family>/_model_builders.py``) hard-codes ``max_seq_len`` and ``rope_base``
and calls its family's component builder, which makes one RoPE module:

* Llama 2 / Llama 3 / Mistral / Gemma / Gemma 2 (``llama2/_component_builders.py:llama2``,
  ``llama3/...:llama3``, ``mistral/...:mistral``, ``gemma/...``, ``gemma2/...``):
  ``modules.RotaryPositionalEmbeddings(dim=head_dim, max_seq_len=max_seq_len, base=rope_base)``;
* Llama 3.1 / 3.2 / 3.3 (``llama3_1/_component_builders.py:llama3_1``):
  ``Llama3ScaledRoPE(dim=head_dim, max_seq_len=max_seq_len, base=rope_base,
  scale_factor=scale_factor)``; ``low_freq_factor=1``, ``high_freq_factor=4`` and
  ``old_context_len=8192`` are never passed, so the module defaults hold whatever a config says;
* Qwen2 / Qwen2.5 (``qwen2/_component_builders.py:qwen2``):
  ``qwen2._positional_embeddings.Qwen2RotaryPositionalEmbeddings(dim, max_seq_len, base)``;
* Phi-3 / Phi-4 (``phi3/_component_builders.py:phi3``):
  ``phi3._position_embeddings.Phi3RotaryPositionalEmbeddings(dim, max_seq_len, base)``.

The adapter maps a Hugging Face config onto that same call: ``dim`` = ``head_dim`` (or
``hidden_size // num_attention_heads``), ``max_seq_len`` = ``max_position_embeddings``, ``base`` =
``rope_theta``, ``scale_factor`` = ``rope_scaling["factor"]`` (Llama 3 scaling only), and calls
the module's ``forward(x, input_pos=positions)``.  Families torchtune 0.6.1 does not have are built
the way one ports them to it, with the generic ``RotaryPositionalEmbeddings`` (Gemma 3's sliding
layers, plain-RoPE configs of other families); everything its modules cannot express raises
:class:`~rotary.testing.engine.Unsupported`.

Layout.  ``RotaryPositionalEmbeddings`` and ``Llama3ScaledRoPE`` rotate adjacent pairs
``(2i, 2i+1)`` (Meta's layout).  torchtune loads a Hugging Face checkpoint through
``models/convert_weights.py:hf_to_tune`` (``gemma2/_convert_weights.py`` for Gemma 2), which
permutes the rows of ``q_proj``/``k_proj`` per head (``_permute``: view ``(heads, 2, hd/2, dim)``,
swap axes 1 and 2), so torchtune's query is HF's query with features reordered half -> interleaved.
The adapter applies that same reordering to the HF-layout ``q``/``k`` it is given, rotates, and
reorders the result back (exact: a permutation, no arithmetic).  Qwen2 and Phi-3 keep HF's
rotate-half layout (``qwen2_hf_to_tune``, ``phi3_hf_to_tune`` do not permute): no reordering.

Precision.  The tables are float32 (``seq_idx * theta`` in float32; built with an explicit
``.float()`` even under a bfloat16 default dtype); positions index a ``max_seq_len``-row cache
(``self.cache[input_pos]``), so a position ``>= max_seq_len`` raises ``IndexError`` on CPU (a
device-side assert on CUDA), although the modules' docstrings say "if exceeded the cached freqs
will be recomputed".  ``RotaryPositionalEmbeddings``/``Llama3ScaledRoPE`` rotate in float32 and
round the result to the input dtype; Qwen2/Phi-3 cast cos/sin to the input dtype first (bfloat16
arithmetic, as Hugging Face does).

Not expressible: linear, dynamic NTK, YaRN and LongRoPE scaling (the only scaled module is
``Llama3ScaledRoPE``; the Qwen2.5 and Phi-3 builders take no scaling, so a 128K YaRN or LongRoPE
checkpoint would run as plain RoPE), partial rotary (the modules rotate the whole head), M-RoPE,
multi-head latent attention, Llama 4 / Ministral 3 attention temperature.  (The Phi-3 builder's
docstring says so for 128K: "does not currently support 128K context length".)

Conformance (rotary's float64 truth, positions to 2**20 + 3): Llama 2, Llama 3.1 and Gemma 3's
sliding layers pass in float32 and bfloat16 below ``max_seq_len``; past it every module raises
``IndexError``, contradicting its docstring (recomputation promised, never done).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from rotary.testing.engine import Unsupported

NAME = "torchtune"
PYTHON = "3.11"
INSTALL = (
    "python3.11 -m venv $ENGINES/torchtune/venv && . $ENGINES/torchtune/venv/bin/activate\n"
    "pip install torch==2.13.0 numpy\npip install torchtune==0.6.1 torchao==0.14.1\n"
    'pip install --no-deps -e "$ROTARY" array-api-compat'
)

#: Families whose torchtune module keeps Hugging Face's rotate-half layout (no q/k permutation);
#: every other family is loaded through ``hf_to_tune``'s permutation to Meta's interleaved layout.
_HALF = {"qwen2": "qwen2", "phi3": "phi3"}


def version() -> str:
    """torchtune's version; ``ImportError`` with the recipe when it is missing."""
    try:
        import torchtune
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(f"torchtune is not installed; install it with:\n{INSTALL}") from e
    return str(torchtune.__version__)


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


def _lacks(config: Mapping[str, Any], rp: Mapping[str, Any], rtype: str, head_dim: int) -> list[str]:
    """What torchtune's RoPE modules cannot express in this config."""
    why = []
    if rtype not in ("default", "llama3", "mrope"):
        why.append(f"no {rtype!r} RoPE scaling (its only scaled RoPE is Llama3ScaledRoPE)")
    if "mrope_section" in rp:
        why.append("no M-RoPE (no Qwen2-VL model; its only multi-axis RoPE is the vision 2-D grid)")
    rot = head_dim
    if config.get("qk_rope_head_dim"):
        why.append("no multi-head latent attention (rotating qk_rope_head_dim of each head)")
    for key in ("partial_rotary_factor", "rotary_pct"):
        if config.get(key) is not None and float(config[key]) < 1.0:
            rot = int(head_dim * float(config[key]))
    if config.get("rotary_dim"):
        rot = int(config["rotary_dim"])
    if rot != head_dim:
        why.append(f"no partial rotary ({rot} of {head_dim} features): its modules rotate the whole head")
    if rp.get("llama_4_scaling_beta") is not None or config.get("attn_temperature_tuning"):
        why.append("no Llama 4 / Ministral 3 attention temperature (query scale)")
    return why


def _layer_kind(config: Mapping[str, Any], layer_type: str | None) -> str | None:
    if layer_type is None or config.get("model_type") != "gemma3_text":
        return None
    return layer_type


class TorchtuneRope:
    """A torchtune RoPE module, fed Hugging Face-layout ``q``/``k``."""

    angles = "float32"
    softmax_scale = 1.0

    def __init__(self, module: Any, dtype: str, permute: bool) -> None:
        import torch

        self.module = module
        self.permute = permute
        self.dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
        self.max_position = int(module.cache.shape[0])

    def _one(self, x: np.ndarray, pos: Any) -> np.ndarray:
        import torch

        x = np.asarray(x, dtype=np.float32)
        n, h, d = x.shape
        if self.permute:  # hf_to_tune's _permute: feature 2i + j <- j * d/2 + i
            x = x.reshape(n, h, 2, d // 2).swapaxes(-1, -2).reshape(n, h, d)
        t = torch.from_numpy(np.ascontiguousarray(x)).to(self.dtype)[None]
        with torch.no_grad():
            y = self.module(t, input_pos=pos)[0].float().numpy()
        if self.permute:
            y = y.reshape(n, h, d // 2, 2).swapaxes(-1, -2).reshape(n, h, d)
        return y

    def rotate(self, q: np.ndarray, k: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(q, k)`` through the module's ``forward(x, input_pos=positions)``."""
        import torch

        positions = np.asarray(positions, dtype=np.int64)
        if positions.ndim != 1:
            raise Unsupported("torchtune has no M-RoPE: positions must be (tokens,)")
        pos = torch.from_numpy(positions)[None]
        return self._one(q, pos), self._one(k, pos)


def build(config: Mapping[str, Any], *, layer_type: str | None, dtype: str) -> TorchtuneRope:
    """torchtune's RoPE for ``config`` as its family's component builder makes it."""
    version()
    from torchtune.models.llama3_1._position_embeddings import Llama3ScaledRoPE
    from torchtune.models.phi3._position_embeddings import Phi3RotaryPositionalEmbeddings
    from torchtune.models.qwen2._positional_embeddings import Qwen2RotaryPositionalEmbeddings
    from torchtune.modules import RotaryPositionalEmbeddings

    model_type = str(config.get("model_type", ""))
    kind = _layer_kind(config, layer_type)
    rp = {} if kind == "sliding_attention" else _rope_params(config, layer_type)
    rtype = str(rp.get("rope_type", rp.get("type", "default")))
    head_dim = _head_dim(config)
    why = _lacks(config, rp, rtype, head_dim)
    if why:
        raise Unsupported("torchtune 0.6.1 has " + "; ".join(why))
    theta = config.get("rope_theta", rp.get("rope_theta", config.get("rotary_emb_base", 10000.0)))
    if kind == "sliding_attention":  # Gemma 3, ported with the Gemma 2 builder: plain local RoPE
        theta = config.get("rope_local_base_freq", 10000.0)
    max_seq_len = int(config.get("max_position_embeddings", config.get("n_positions", 4096)))
    family = _HALF.get(model_type)
    if rtype == "llama3":
        if family is not None:
            raise Unsupported(f"torchtune's {family} builder has no Llama 3 scaling")
        # llama3_1/_component_builders.py: only scale_factor is passed on.
        module = Llama3ScaledRoPE(
            dim=head_dim, max_seq_len=max_seq_len, base=theta, scale_factor=rp["factor"]
        )
    elif family == "qwen2":
        module = Qwen2RotaryPositionalEmbeddings(dim=head_dim, max_seq_len=max_seq_len, base=theta)
    elif family == "phi3":
        module = Phi3RotaryPositionalEmbeddings(dim=head_dim, max_seq_len=max_seq_len, base=theta)
    else:
        module = RotaryPositionalEmbeddings(dim=head_dim, max_seq_len=max_seq_len, base=theta)
    permute = family is None and model_type not in ("gptj", "codegen")
    return TorchtuneRope(module, dtype, permute)
