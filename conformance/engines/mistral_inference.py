"""mistral-inference 1.6.0: ``mistral_inference.rope.precompute_freqs_cis``, ``apply_rotary_emb``.

Install (CPU, Python 3.11; tested in a fresh venv: 0.6 s and +0.24 MB over the 968 MB
torch 2.13.0 + numpy venv)::

    python3 -m venv venv && venv/bin/pip install torch==2.13.0 numpy
    venv/bin/pip install --no-deps mistral-inference==1.6.0

Only ``mistral_inference/rope.py`` imports without the dependencies: ``transformer.py`` needs
``xformers`` (CUDA attention) and ``args.py`` ``simple_parsing``, so the adapter reproduces the two
lines of ``Transformer.freqs_cis`` that build the table (below) instead of instantiating the model.
Imported as ``conformance.engines.mistral_inference``; the engine is imported only inside functions.

How mistral-inference builds RoPE
---------------------------------
It loads Mistral's own checkpoint folders (``consolidated.safetensors`` + ``params.json`` ->
``args.TransformerArgs``), never a Hugging Face ``config.json``.  ``transformer.py:Transformer``::

    theta = self.args.rope_theta or 1000000.0          # params.json without rope_theta -> 1e6
    self._precomputed_freqs_cis = precompute_freqs_cis(self.args.head_dim, 128_000, theta)
    ...
    freqs_cis = self.freqs_cis[input_metadata[0].positions]   # one table for every layer

and ``transformer_layers.py:Attention.forward`` calls ``apply_rotary_emb(xq, xk, freqs_cis)``:
``xq`` viewed as complex numbers of adjacent pairs ``(2i, 2i+1)`` times the complex64 table
(float32 angles ``outer(arange(128_000), freqs)``, ``torch.polar``), result cast back to the input
dtype.  The table is always 128 000 rows, whatever the model's context: a position ``>= 128_000``
raises ``IndexError`` on CPU.  There is no RoPE scaling of any kind (no YaRN: version 1.6.0 has none;
``rope_theta`` and ``head_dim`` are the only RoPE parameters), no partial rotary, one RoPE for all
layers; the only other RoPE is Pixtral's 2-D vision ``precompute_freqs_cis_2d``.

Mapping.  The adapter writes the ``params.json`` a Hugging Face config corresponds to:
``head_dim`` = ``head_dim`` or ``hidden_size // num_attention_heads``, ``rope_theta`` = the config's
``rope_theta`` (absent -> ``None``, so the engine's 1e6 default applies, as it would for such a
``params.json``).  Configs of other families (Llama 2, ...) are ported the same way: the engine's
Transformer is Llama's.

Layout.  Mistral's consolidated checkpoints keep Meta's interleaved q/k layout; Hugging Face's
checkpoints (``convert_mistral_weights_to_hf.py``) permute the q/k rows per head so that
rotate-half applies.  Fed HF-layout ``q``/``k``, the adapter undoes that permutation (view a head as
``(2, hd/2)``, transpose: feature ``2i + j`` <- ``j * hd/2 + i``), which gives exactly the q/k the
engine computes from the consolidated weights, rotates, and permutes the result back (a
relabeling: ``q . k`` is unchanged).

Not expressible: every RoPE scaling (linear, dynamic, Llama 3, YaRN, LongRoPE), partial rotary,
M-RoPE, per-layer-type RoPE (Gemma 3), multi-head latent attention, attention temperature.

Conformance: the plain-RoPE case (Llama 2 ported) passes in float32 and bfloat16 up to 127 999 and
raises ``IndexError`` from 128 000 on; no disagreement.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from rotary.testing.engine import EngineError, Unsupported

NAME = "mistral-inference"
PYTHON = "3.11"
INSTALL = (
    "python3.11 -m venv $ENGINES/mistral_inference/venv && . $ENGINES/mistral_inference/venv/bin/activate\n"
    "pip install torch==2.13.0 numpy\npip install --no-deps mistral-inference==1.6.0\n"
    'pip install --no-deps -e "$ROTARY" array-api-compat'
)

_TABLE = 128_000  # transformer.py: precompute_freqs_cis(self.args.head_dim, 128_000, theta)


def version() -> str:
    """mistral-inference's version; ``ImportError`` with the recipe when it is missing."""
    try:
        from importlib.metadata import version as _v

        import mistral_inference.rope  # noqa: F401
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(f"mistral-inference is not installed; install it with:\n{INSTALL}") from e
    return _v("mistral-inference")


def _lacks(config: Mapping[str, Any], layer_type: str | None) -> list[str]:
    rp = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    if layer_type == "sliding_attention" and config.get("rope_local_base_freq") is not None:
        rp = {}  # Gemma 3's local layers: plain RoPE on rope_local_base_freq
    rtype = str(rp.get("rope_type", rp.get("type", "default")))
    why = []
    if rtype not in ("default", "mrope"):
        why.append(f"no {rtype!r} RoPE scaling (no scaling at all; rope_theta is its only RoPE parameter)")
    if "mrope_section" in rp or rtype == "mrope":
        why.append("no M-RoPE")
    if layer_type is not None and (
        config.get("rope_local_base_freq") is not None or isinstance(rp.get(layer_type), Mapping)
    ):
        why.append("no per-layer-type RoPE (transformer.py: one freqs_cis for every layer)")
    if config.get("qk_rope_head_dim"):
        why.append("no multi-head latent attention")
    else:
        head = _head_dim(config)
        rot = head
        for key in ("partial_rotary_factor", "rotary_pct"):
            if config.get(key) is not None:
                rot = int(head * float(config[key]))
        rot = int(config.get("rotary_dim") or rot)
        if rot != head:
            why.append(f"no partial rotary ({rot} of {head} features)")
    if rp.get("llama_4_scaling_beta") is not None or config.get("attn_temperature_tuning"):
        why.append("no attention temperature (query scale)")
    return why


def _head_dim(config: Mapping[str, Any]) -> int:
    if config.get("head_dim"):
        return int(config["head_dim"])
    hidden = config.get("hidden_size", config.get("n_embd"))
    return int(hidden) // int(config.get("num_attention_heads", config.get("n_head")))


class MistralInferenceRope:
    """mistral-inference's complex table and ``apply_rotary_emb``, fed HF-layout ``q``/``k``."""

    angles = "float32"
    softmax_scale = 1.0

    def __init__(self, freqs_cis: Any, dtype: str, permute: bool) -> None:
        import torch

        self.freqs_cis = freqs_cis
        self.permute = permute
        self.dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
        self.max_position = int(freqs_cis.shape[0])

    def _in(self, x: np.ndarray) -> Any:
        import torch

        x = np.asarray(x, dtype=np.float32)
        n, h, d = x.shape
        if self.permute:
            x = x.reshape(n, h, 2, d // 2).swapaxes(-1, -2).reshape(n, h, d)
        return torch.from_numpy(np.ascontiguousarray(x)).to(self.dtype)

    def _out(self, y: Any) -> np.ndarray:
        y = y.float().numpy()
        if self.permute:
            n, h, d = y.shape
            y = y.reshape(n, h, d // 2, 2).swapaxes(-1, -2).reshape(n, h, d)
        return y

    def rotate(self, q: np.ndarray, k: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(q, k)`` through ``apply_rotary_emb(xq, xk, freqs_cis[positions])`` (xq: (tokens,
        heads, head_dim), as ``Attention.forward`` has it)."""
        import torch
        from mistral_inference.rope import apply_rotary_emb

        positions = np.asarray(positions, dtype=np.int64)
        if positions.ndim != 1:
            raise Unsupported("mistral-inference has no M-RoPE: positions must be (tokens,)")
        try:
            freqs = self.freqs_cis[torch.from_numpy(positions)]  # Transformer.forward_partial
        except IndexError as e:  # (the engine's own indexing, reproduced here: its refusal)
            raise EngineError from e
        with torch.no_grad():
            qo, ko = apply_rotary_emb(self._in(q), self._in(k), freqs_cis=freqs)
        return self._out(qo), self._out(ko)


def build(config: Mapping[str, Any], *, layer_type: str | None, dtype: str) -> MistralInferenceRope:
    """mistral-inference's RoPE for the ``params.json`` equivalent of ``config``."""
    version()
    from mistral_inference.rope import precompute_freqs_cis

    why = _lacks(config, layer_type)
    if why:
        raise Unsupported("mistral-inference 1.6.0 has " + "; ".join(why))
    rope_theta = config.get("rope_theta")  # TransformerArgs.rope_theta (None when params.json lacks it)
    theta = rope_theta or 1000000.0  # Transformer.freqs_cis
    freqs_cis = precompute_freqs_cis(_head_dim(config), _TABLE, theta)
    permute = config.get("model_type") not in ("gptj", "codegen")
    return MistralInferenceRope(freqs_cis, dtype, permute)
