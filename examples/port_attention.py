"""Port a PyTorch attention layer (Hugging Face layout) to JAX with ``rotary``.

A LLaMA attention layer (``transformers``' ``LlamaAttention`` from a tiny
``LlamaConfig``, random weights, no download; a small self-contained torch module
of the same structure when ``transformers`` is absent) rotates q/k in the
Hugging Face *half* layout.  Its q/k projection weights are moved to the
*interleaved* layout with ``rotary.convert_layout`` (a per-head permutation of
the output rows), and the layer is re-run in JAX, under ``jax.jit``, with
``rotary.apply(..., layout="interleaved")``: the outputs agree over a prefill of
several positions and over KV-cache decode steps.  Skipping the conversion gives
plausible-looking but wrong outputs, which the example also prints.

    python examples/port_attention.py [--seq 12] [--decode 3]
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import math
import os
import sys

import numpy as np

import rotary

#: The optional libraries the examples use, and the extra of ``pyproject.toml`` that installs each.
EXTRAS = {"matplotlib": "plot", "torch": "torch", "jax": "jax", "dask": "dask", "distributed": "dask"}


def require(*modules: str) -> None:
    """Exit with a message naming the extra to install if a library this example needs is missing."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        extras = ",".join(dict.fromkeys(EXTRAS[m] for m in missing))
        sys.exit(
            f"{os.path.basename(__file__)} needs {', '.join(missing)}, not installed here: "
            f'pip install ".[{extras}]" in the rotary checkout'
        )


HIDDEN, HEADS, KV_HEADS, HEAD_DIM, BASE = 64, 4, 2, 16, 10000.0


# -- the PyTorch side -----------------------------------------------------------------
def _torch_layer(which: str = "auto"):
    """(description, layer, run) where ``run(x, pos, cache)`` returns (output, cache) on torch tensors."""
    import torch

    torch.manual_seed(0)
    if which == "auto":
        which = "llama" if importlib.util.find_spec("transformers") is not None else "tiny"
    if which == "llama":
        from transformers import DynamicCache, LlamaConfig
        from transformers.models.llama.modeling_llama import LlamaAttention, LlamaRotaryEmbedding

        cfg = LlamaConfig(
            hidden_size=HIDDEN,
            num_attention_heads=HEADS,
            num_key_value_heads=KV_HEADS,
            head_dim=HEAD_DIM,
            intermediate_size=4 * HIDDEN,
            num_hidden_layers=1,
            vocab_size=32,
            rope_theta=BASE,
        )
        cfg._attn_implementation = "eager"
        layer = LlamaAttention(cfg, layer_idx=0).eval()
        rope = LlamaRotaryEmbedding(cfg)
        with torch.no_grad():
            for lin in (layer.q_proj, layer.k_proj, layer.v_proj, layer.o_proj):
                lin.weight.normal_(0.0, 1.0 / math.sqrt(lin.in_features))

        def run(x, pos, cache):
            cache = DynamicCache(config=cfg) if cache is None else cache
            pid = torch.as_tensor(pos)[None]
            past = cache.get_seq_length()
            n, t = x.shape[1], past + x.shape[1]
            # additive causal mask over (new queries) x (cached + new keys)
            allowed = torch.arange(t)[None, :] <= (past + torch.arange(n))[:, None]
            mask = torch.zeros(1, 1, n, t).masked_fill(~allowed, float("-inf"))
            with torch.no_grad():
                cos_sin = rope(x, pid)
                out, _ = layer(x, position_embeddings=cos_sin, attention_mask=mask, past_key_values=cache)
            return out, cache

        return "transformers LlamaAttention", layer, run

    layer = _tiny_module_class()()

    def run(x, pos, cache):
        with torch.no_grad():
            return layer(x, torch.as_tensor(pos), cache)

    return "self-contained torch module", layer, run


def _tiny_module_class():
    import torch
    from torch import nn

    class TinyHFAttention(nn.Module):
        """LLaMA-style attention, Hugging Face conventions: half layout, float32 angles, GQA."""

        def __init__(self) -> None:
            super().__init__()
            self.q_proj = nn.Linear(HIDDEN, HEADS * HEAD_DIM, bias=False)
            self.k_proj = nn.Linear(HIDDEN, KV_HEADS * HEAD_DIM, bias=False)
            self.v_proj = nn.Linear(HIDDEN, KV_HEADS * HEAD_DIM, bias=False)
            self.o_proj = nn.Linear(HEADS * HEAD_DIM, HIDDEN, bias=False)
            inv = 1.0 / BASE ** (torch.arange(0, HEAD_DIM, 2, dtype=torch.float32) / HEAD_DIM)
            self.register_buffer("inv_freq", inv)

        @staticmethod
        def _rotate_half(x):
            h = x.shape[-1] // 2
            return torch.cat((-x[..., h:], x[..., :h]), dim=-1)

        def forward(self, x, pos, cache=None):
            b, n, _ = x.shape
            q = self.q_proj(x).view(b, n, HEADS, HEAD_DIM).transpose(1, 2)
            k = self.k_proj(x).view(b, n, KV_HEADS, HEAD_DIM).transpose(1, 2)
            v = self.v_proj(x).view(b, n, KV_HEADS, HEAD_DIM).transpose(1, 2)
            emb = pos.float()[:, None] * self.inv_freq
            emb = torch.cat((emb, emb), dim=-1)
            cos, sin = emb.cos(), emb.sin()
            q = q * cos + self._rotate_half(q) * sin
            k = k * cos + self._rotate_half(k) * sin
            if cache is not None:
                k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)
            rep = HEADS // KV_HEADS
            kk, vv = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
            s = q @ kk.transpose(-1, -2) / math.sqrt(HEAD_DIM)
            t = kk.shape[2]
            allowed = torch.arange(t)[None, :] <= (t - n + torch.arange(n))[:, None]
            s = s.masked_fill(~allowed, float("-inf"))
            o = (s.softmax(-1) @ vv).transpose(1, 2).reshape(b, n, HEADS * HEAD_DIM)
            return self.o_proj(o), (k, v)

    return TinyHFAttention


# -- the JAX side ---------------------------------------------------------------------
def port_weights(layer, convert: bool = True) -> dict:
    """torch weights -> JAX arrays; q/k output rows moved from half to interleaved layout."""
    import jax.numpy as jnp

    names = ("q_proj", "k_proj", "v_proj", "o_proj")
    w = {n: jnp.asarray(getattr(layer, n).weight.detach().cpu().numpy()) for n in names}
    if convert:
        # torch.nn.Linear weights are (out_features, in_features): the head features are rows.
        for n in ("q_proj", "k_proj"):
            w[n] = rotary.convert_layout(w[n], "half", "interleaved", axis=0, head_dim=HEAD_DIM)
    return w


def jax_attention(w: dict, x, pos, cache=None):
    """LLaMA attention in JAX with interleaved-layout RoPE from ``rotary``; returns (out, cache)."""
    import jax
    import jax.numpy as jnp

    b, n, _ = x.shape
    q = (x @ w["q_proj"].T).reshape(b, n, HEADS, HEAD_DIM).transpose(0, 2, 1, 3)
    k = (x @ w["k_proj"].T).reshape(b, n, KV_HEADS, HEAD_DIM).transpose(0, 2, 1, 3)
    v = (x @ w["v_proj"].T).reshape(b, n, KV_HEADS, HEAD_DIM).transpose(0, 2, 1, 3)
    q, k = rotary.apply(q, k, pos, layout="interleaved")  # keys are cached already rotated
    if cache is not None:
        k, v = jnp.concatenate([cache[0], k], axis=2), jnp.concatenate([cache[1], v], axis=2)
    rep = HEADS // KV_HEADS
    kk, vv = jnp.repeat(k, rep, axis=1), jnp.repeat(v, rep, axis=1)
    s = q @ jnp.swapaxes(kk, -1, -2) / math.sqrt(HEAD_DIM)
    t = kk.shape[2]
    allowed = jnp.arange(t)[None, :] <= (t - n + jnp.arange(n))[:, None]
    s = jnp.where(allowed, s, -jnp.inf)
    o = (jax.nn.softmax(s, axis=-1) @ vv).transpose(0, 2, 1, 3).reshape(b, n, HEADS * HEAD_DIM)
    return o @ w["o_proj"].T, (k, v)


@functools.cache
def jitted_attention():
    """``jax_attention`` under ``jax.jit`` (positions traced), compiled once per shape."""
    import jax

    return jax.jit(jax_attention)


def main(argv: list[str] | None = None) -> dict[str, float]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None, help="output folder (accepted for uniformity; nothing is drawn)")
    p.add_argument("--seq", type=int, default=12, help="prefill length")
    p.add_argument("--decode", type=int, default=3, help="KV-cache decode steps after the prefill")
    p.add_argument("--start", type=int, default=0, help="position of the first token")
    p.add_argument(
        "--layer",
        choices=("auto", "llama", "tiny"),
        default="auto",
        help="llama: transformers' LlamaAttention; tiny: the self-contained module; auto: llama if installed",
    )
    args = p.parse_args(argv)
    require("torch", "jax")

    import jax.numpy as jnp
    import torch

    attend = jitted_attention()
    kind, layer, run_torch = _torch_layer(args.layer)
    print(f"PyTorch layer: {kind}; {HEADS} query heads, {KV_HEADS} kv heads, head_dim {HEAD_DIM}")
    w = port_weights(layer)
    w_naive = port_weights(layer, convert=False)

    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, args.seq + args.decode, HIDDEN)).astype(np.float32)
    pos = np.arange(args.start, args.start + args.seq + args.decode)

    diffs: dict[str, float] = {}
    t_cache = j_cache = n_cache = None
    steps = [("prefill", slice(0, args.seq))]
    steps += [(f"decode {i + 1}", slice(args.seq + i, args.seq + i + 1)) for i in range(args.decode)]
    print(f"{'step':>9} {'positions':>12} {'max |torch - jax|':>18} {'without convert_layout':>23}")
    for name, sl in steps:
        xt = torch.from_numpy(x[:, sl])
        out_t, t_cache = run_torch(xt, torch.from_numpy(pos[sl]), t_cache)
        out_j, j_cache = attend(w, jnp.asarray(x[:, sl]), jnp.asarray(pos[sl]), j_cache)
        out_n, n_cache = attend(w_naive, jnp.asarray(x[:, sl]), jnp.asarray(pos[sl]), n_cache)
        ref = out_t.numpy()
        diffs[name] = float(np.max(np.abs(np.asarray(out_j) - ref)))
        naive = float(np.max(np.abs(np.asarray(out_n) - ref)))
        span = f"{pos[sl][0]}..{pos[sl][-1]}" if sl.stop - sl.start > 1 else f"{pos[sl][0]}"
        print(f"{name:>9} {span:>12} {diffs[name]:18.2e} {naive:23.2e}")
    print(f"\nmax |output| {np.max(np.abs(ref)):.2f}; float32 eps {np.finfo(np.float32).eps:.1e}")
    return diffs


if __name__ == "__main__":
    main()
