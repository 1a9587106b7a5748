"""Port a checkpoint: ``config.json`` + safetensors weights to NumPy and JAX, no ``transformers``.

Two halves, as a real port has them:

1. The PyTorch side (``transformers``): a tiny Llama-style model (random weights, Llama 3.1
   RoPE scaling, grouped-query attention) saved with ``save_pretrained`` as ``config.json`` +
   ``model.safetensors``, and the output of its first attention layer for some hidden states
   at some positions: the reference.
2. The port (NumPy and JAX only: it never imports ``transformers`` or ``torch``): the RoPE read
   from ``config.json`` by :func:`rotary.hf.from_hf`, the weights read with ``safetensors``'
   NumPy API, the q/k projection rows moved from the checkpoint's *half* layout to the
   *interleaved* one with :func:`rotary.convert_layout`, and the attention layer run in NumPy
   and in JAX (under ``jax.jit``) with an interleaved RoPE of the same configuration.

Both ports match the torch layer to float32 precision; the same layer with the q/k weights
left in the half layout (and the interleaved RoPE) does not, which the example also prints.

    python examples/port_checkpoint.py [--out DIR] [--seq 8] [--start 5000]

Needs: ``safetensors`` and ``numpy`` for the port (``pip install safetensors``), the ``jax``
extra for its JAX half, and the ``torch`` and ``peers`` extras (``transformers``) to write the
checkpoint.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import tempfile
from typing import Any

import numpy as np

import rotary

#: The tiny model: Llama 3.1's RoPE (base, llama3 scaling) on small heads.
CONFIG = {
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "num_hidden_layers": 1,
    "intermediate_size": 128,
    "vocab_size": 64,
    "max_position_embeddings": 131072,
    "rope_theta": 500000.0,
    "rope_scaling": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
}


def _need(module: str, extra: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise SystemExit(f"this example needs {module!r}: pip install 'rotary[{extra}]'")


# -- 1. the PyTorch side (transformers) -------------------------------------------------------
def save_checkpoint(folder: str, x: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """Save a tiny random Llama to ``folder``; return its first attention layer's output for
    hidden states ``x`` ``(batch, seq, hidden)`` at positions ``pos`` ``(seq,)``."""
    _need("torch", "torch")
    _need("transformers", "peers")
    import torch
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    torch.manual_seed(0)
    config = LlamaConfig(**CONFIG)
    config._attn_implementation = "eager"
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # larger than the default init, so that RoPE visibly matters
        for p in model.parameters():
            if p.ndim == 2:
                p.normal_(0.0, 2.0 / math.sqrt(p.shape[1]))
    model.save_pretrained(folder, safe_serialization=True)

    attn = model.model.layers[0].self_attn
    xt = torch.from_numpy(x)
    pid = torch.from_numpy(pos)[None].expand(x.shape[0], -1)
    n = x.shape[1]
    mask = torch.full((n, n), float("-inf")).triu(1)[None, None]  # causal, additive
    with torch.no_grad():
        cos_sin = model.model.rotary_emb(xt, pid)
        out, _ = attn(xt, position_embeddings=cos_sin, attention_mask=mask)
    return out.numpy()


# -- 2. the port: NumPy and JAX, no transformers, no torch ------------------------------------
def load(folder: str, angles: str = "float32") -> tuple[dict[str, Any], rotary.RoPE, dict[str, np.ndarray]]:
    """The config, the interleaved RoPE of the checkpoint, and layer 0's attention weights with
    q/k rows also in the interleaved layout (``*.interleaved``).

    ``angles="float32"`` reproduces the torch model's own angles (bit-for-bit cos/sin);
    ``"exact"`` gives the true angles, which differ from them by the float32 angle error
    (``~position * 6e-8`` radians)."""
    _need("safetensors", "peers")
    from safetensors.numpy import load_file

    with open(os.path.join(folder, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    rope = rotary.hf.from_hf(folder, angles=angles)  # Llama: the half layout, llama3 scaling, base 5e5
    assert rope.layout == "half"
    rope_il = rotary.RoPE(
        rope.head_dim,
        base=rope.base,
        layout="interleaved",
        rotary_dim=rope.rotary_dim,
        scaling=rope.scaling,
        angles=rope.angles,
        partial=rope.partial,
    )
    tensors = load_file(os.path.join(folder, "model.safetensors"))
    prefix = "model.layers.0.self_attn."
    w = {n: tensors[prefix + n + ".weight"] for n in ("q_proj", "k_proj", "v_proj", "o_proj")}
    # nn.Linear weights are (out_features, in_features): the head features are the rows.
    for n in ("q_proj", "k_proj"):
        w[n + ".interleaved"] = rotary.convert_layout(
            w[n], "half", "interleaved", axis=0, head_dim=rope.head_dim, rotary_dim=rope.rotary_dim
        )
    return config, rope_il, w


def attention(xp: Any, config: dict, rope: rotary.RoPE, w: dict, x: Any, pos: Any, *, layout: str) -> Any:
    """One Llama attention layer with namespace ``xp`` (NumPy or ``jax.numpy``): q/k weights of
    ``layout`` (``"interleaved"``: converted; ``"half"``: as saved)."""
    h, kvh, d = config["num_attention_heads"], config["num_key_value_heads"], rope.head_dim
    b, n, _ = x.shape
    sfx = ".interleaved" if layout == "interleaved" else ""
    q = xp.reshape(x @ w["q_proj" + sfx].T, (b, n, h, d))
    k = xp.reshape(x @ w["k_proj" + sfx].T, (b, n, kvh, d))
    v = xp.reshape(x @ w["v_proj"].T, (b, n, kvh, d))
    q, k, v = (xp.permute_dims(t, (0, 2, 1, 3)) for t in (q, k, v))  # (batch, heads, seq, dim)
    q, k = rope.apply(q, k, pos)
    k = xp.repeat(k, h // kvh, axis=1)
    v = xp.repeat(v, h // kvh, axis=1)
    s = (q @ xp.permute_dims(k, (0, 1, 3, 2))) / math.sqrt(d)
    causal = xp.arange(n)[None, :] <= xp.arange(n)[:, None]
    s = xp.where(causal, s, -xp.inf)
    s = s - xp.max(s, axis=-1, keepdims=True)
    p = xp.exp(s)
    p = p / xp.sum(p, axis=-1, keepdims=True)
    o = xp.reshape(xp.permute_dims(p @ v, (0, 2, 1, 3)), (b, n, h * d))
    return o @ w["o_proj"].T


def port(folder: str, x: np.ndarray, pos: np.ndarray) -> dict[str, np.ndarray]:
    """Layer 0's attention output from the checkpoint in ``folder``, in NumPy and (if installed)
    JAX with the model's float32 angles; NumPy with exact angles; NumPy with the q/k weights
    left unconverted."""
    import array_api_compat.numpy as npx

    config, rope, w = load(folder)
    out = {"numpy": attention(npx, config, rope, w, x, pos, layout="interleaved")}
    _, exact, _ = load(folder, angles="exact")
    out["numpy, exact angles"] = attention(npx, config, exact, w, x, pos, layout="interleaved")
    out["numpy, no convert_layout"] = attention(npx, config, rope, w, x, pos, layout="half")
    if importlib.util.find_spec("jax") is not None:
        import jax
        import jax.numpy as jnp

        wj = {k: jnp.asarray(v) for k, v in w.items()}
        run = jax.jit(lambda xx, pp: attention(jnp, config, rope, wj, xx, pp, layout="interleaved"))
        out["jax"] = np.asarray(run(jnp.asarray(x), jnp.asarray(pos)))
    else:
        print("JAX half skipped: pip install 'rotary[jax]'")
    return out


def main(argv: list[str] | None = None) -> dict[str, float]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None, help="folder for the checkpoint (default: a new temporary folder)")
    p.add_argument("--seq", type=int, default=8, help="tokens")
    p.add_argument("--start", type=int, default=5000, help="position of the first token")
    args = p.parse_args(argv)
    folder = args.out or tempfile.mkdtemp(prefix="rotary_port_")
    os.makedirs(folder, exist_ok=True)

    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, args.seq, CONFIG["hidden_size"])).astype(np.float32)
    pos = np.arange(args.start, args.start + args.seq)
    ref = save_checkpoint(folder, x, pos)
    print(f"checkpoint: {sorted(os.listdir(folder))} in {folder}")
    print(f"RoPE from config.json: {rotary.hf.from_hf(folder)}")
    outs = port(folder, x, pos)
    diffs = {name: float(np.max(np.abs(np.asarray(o) - ref))) for name, o in outs.items()}
    for name, d in diffs.items():
        print(f"max |{name} - torch| = {d:.2e}")
    print(f"max |torch output| = {np.max(np.abs(ref)):.2f}; float32 eps {np.finfo(np.float32).eps:.1e}")
    return diffs


if __name__ == "__main__":
    main()
