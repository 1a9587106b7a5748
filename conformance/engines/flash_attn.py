"""flash-attn 2.8.3.post2: its Triton rotary kernel, built the way flash-attn's model code builds it.

(Imported as ``conformance.engines.flash_attn``: the name does not shadow the ``flash_attn`` package.)

Install (CPU, Python 3.11; measured here: 89 s the first time, 118 s for the recipe below rerun in
a fresh directory, 207 s with ``tf4`` on 2 busy cores; venv 2.2 GB of which torch 0.75 GB and
triton 1.0 GB, plus the 8 MB sdist unpacked to 107 MB and ``tf4`` 139 MB)::

    python3 -m venv venv && . venv/bin/activate
    pip install torch==2.13.0 numpy                    # the local CPU wheel
    pip install triton==3.9.0 einops transformers==5.24.0 sentencepiece
    FLASH_ATTENTION_SKIP_CUDA_BUILD=TRUE pip download --no-deps --no-build-isolation flash-attn==2.8.3.post2
    tar xzf flash_attn-2.8.3.post2.tar.gz              # beside the venv: where the adapter looks
    pip install --no-deps -e "$ROTARY" array-api-compat    # rotary, for the checker
    pip install --no-deps --target tf4 transformers==4.57.1 huggingface_hub==0.36.0 \
        tokenizers==0.22.1 requests urllib3 certifi charset-normalizer    # (transformers 4, below)

``transformers`` and ``sentencepiece`` are what flash-attn's own model files
(``flash_attn/models/{llama,gpt_neox,gptj,falcon}.py``) import to read a Hugging Face config.
``tf4`` (139 MB, beside the venv, used only on ``PYTHONPATH``) holds transformers 4.57.1 and what it
needs that the venv's transformers 5 does not: the reproduction of the GPT-NeoX finding
(``docs/field/repro/flash_attn/repro_gpt_neox_transformers5.py``) reruns itself with it to show
that the converter works there.
The sdist is never built or installed: its package ``__init__`` imports the CUDA extension
(``flash_attn_2_cuda``), so the adapter registers ``flash_attn`` as a bare package over the
unpacked ``flash_attn-2.8.3.post2/flash_attn`` beside the venv (where the recipe unpacks it;
``$FLASH_ATTN_SRC`` in the worker's environment names another folder) and imports only
``flash_attn.layers.rotary`` (-> ``flash_attn.ops.triton.rotary``) and the model files.  Where a
real flash-attn is already importable (a GPU install), that one is used.  The reproductions
(``docs/field/repro/flash_attn/``) do the same through their ``_load.py``.

Triton interpreter
------------------
Without CUDA the kernel runs in Triton's CPU interpreter.  ``TRITON_INTERPRET=1`` must be in the
environment **before triton's kernels are defined**: triton 3.9 reads it when ``@triton.jit``
decorates ``rotary_kernel`` (``triton/runtime/jit.py``), i.e. when
``flash_attn.ops.triton.rotary`` is first imported; set it before ``import triton`` to be safe.
The adapter sets it itself, and only when ``torch.cuda.is_available()`` is false, before its
lazy imports; if the kernel module was already imported uncompiled-for-interpretation it raises.
``apply_rotary`` wraps its launch in ``with torch.cuda.device(x.device.index)``, which fails on a
CPU tensor (``None < 0``): the adapter replaces ``torch.cuda.device`` by a no-op context only
around its own calls, and only without CUDA.

Packed input (the ``thd`` case)
-------------------------------
``rotate_packed`` calls flash-attn's documented varlen entry point, ``layers/rotary.py:
apply_rotary_emb(x, cos, sin, interleaved, seqlen_offsets=, cu_seqlens=, max_seqlen=)`` on the
packed ``(total_seqlen, nheads, headdim)`` row, with ``cu_seqlens`` and one offset per sequence
(int32 tensors) and the ``RotaryEmbedding`` module's own cos/sin cache for the longest
``offset + length`` (the kernel's ``IS_VARLEN`` path: each sequence reads rows
``seqlen_offsets[i] + j`` of the table).

Which code path, and how the HF config is mapped
------------------------------------------------
flash-attn's RoPE is ``flash_attn.layers.rotary.RotaryEmbedding(dim, base, interleaved,
scale_base)``: ``inv_freq = 1 / base**(arange(0, dim, 2) / dim)`` in float32; a cos/sin cache
``cos(outer(arange(seqlen, float32), inv_freq))`` **cast to the input dtype** (bfloat16 input:
bfloat16 cos/sin), rebuilt when a call needs more rows; ``scale_base`` is xPos (never set: no
HF config has xPos).  There is no scaling of any kind (linear, NTK, YaRN, LongRoPE, Llama 3) and
no multi-row (M-RoPE) position.  The kernel (``ops/triton/rotary.py: rotary_kernel``) reads row
``position`` of the table and rotates the first ``dim`` features in float32.

* Model types flash-attn has a model file for: the adapter calls that file's converter on the
  ``transformers`` config class, exactly as flash-attn's loaders do
  (``llama.llama_config_to_gpt2_config(LlamaConfig)``, ``gpt_neox.gpt_neox_config_to_gpt2_config``,
  ``gptj.gptj_config_to_gpt2_config``, ``falcon.falcon_config_to_gpt2_config``), then reads the
  rotary fields as ``models/gpt.py: create_mixer_cls`` does
  (``int(rotary_emb_fraction * head_dim)``, ``getattr(config, "rotary_emb_base", 10000.0)``,
  ``rotary_emb_scale_base``, ``rotary_emb_interleaved``) and builds ``RotaryEmbedding`` as
  ``modules/mha.py: MHA.__init__`` does.  Consequences kept as they are (engine behaviour):
  the Llama converter sets ``rotary_emb_interleaved=True`` and never reads ``rope_theta`` (only
  its Meta-checkpoint path, ``config_from_meta_checkpoint``, sets ``rotary_emb_base``) nor
  ``rope_scaling``, so every HF Llama runs base 10000 unscaled; the GPT-NeoX converter reads
  ``GPTNeoXConfig.rotary_emb_base``/``rotary_pct``, which transformers 5 no longer has
  (``AttributeError``: build raises it, chained; with transformers 4.57.1 it builds and passes).
  Layout: ``llama.remap_state_dict_hf_llama`` permutes the q/k weight rows from HF's half layout
  to interleaved pairs (``inv_permute``: ``(h two d) -> (h d two)``); the adapter applies that
  permutation to q/k and its inverse to the result (the scores are invariant).
* Any other model type: the generic port a user writes with flash-attn's documented module
  (as Phi-2's original remote code did): ``RotaryEmbedding(int(head_dim *
  partial_rotary_factor), base=rope_theta, interleaved=False)`` from transformers'
  standardized ``rope_parameters`` (per layer type where the config has them).  Unsupported:
  any ``rope_type`` other than ``default``, and M-RoPE (``mrope_section``).

``rotate`` calls ``RotaryEmbedding.forward`` as ``MHA.forward`` does: packed ``qkv`` when q and k
have as many heads, else ``(q, kv)``.  Contiguous positions ``p0 .. p0+n-1`` take the prefill path
(``seqlen_offset=p0``, an int: the cache grows to ``p0 + n``); any other positions take the
KV-cache decoding path (one token per batch row, ``seqlen_offset`` an int64 tensor of the
positions, ``max_seqlen = max(positions) + 1`` as ``InferenceParams.max_seqlen``, i.e. the
generation length).  flash-attn keeps no table of a fixed size (``max_position = None``); but a
decoding offset at or past the table it was given is **not checked**: the kernel masks the
cos/sin load (``other=1.0`` / ``0.0``) and returns the features unrotated (see the report,
``docs/field/repro/flash_attn/repro_offsets_past_table.py``); the int path asserts instead.
With CUDA and ``use_flash_attn`` the decoding step goes through ``flash_attn_with_kvcache``'s own
rotary (the CUDA kernel), not checked here.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.machinery
import os
import sys
import types
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from rotary.testing.engine import Unsupported

NAME = "flash-attn"
PYTHON = "3.11"
INSTALL = """\
python3.11 -m venv $ENGINES/flash_attn/venv && cd $ENGINES/flash_attn && . venv/bin/activate
pip install torch==2.13.0 numpy
pip install triton==3.9.0 einops transformers==5.24.0 sentencepiece
FLASH_ATTENTION_SKIP_CUDA_BUILD=TRUE pip download --no-deps --no-build-isolation flash-attn==2.8.3.post2
tar xzf flash_attn-2.8.3.post2.tar.gz
pip install --no-deps -e "$ROTARY" array-api-compat
pip install --no-deps --target tf4 transformers==4.57.1 huggingface_hub==0.36.0 tokenizers==0.22.1 \\
    requests urllib3 certifi charset-normalizer"""

__all__ = ["INSTALL", "NAME", "PYTHON", "build", "version"]

_VERSION = "2.8.3.post2"
#: The unpacked sdist when ``$FLASH_ATTN_SRC`` is not set: beside the venv, where the recipe unpacks it.
_SRC_DEFAULT = os.path.join(os.path.dirname(sys.prefix), "flash_attn-2.8.3.post2")

# HF model_type -> (flash-attn model file, its HF-config converter, the transformers config class,
# whether its HF state-dict remap permutes q/k rows half -> interleaved)
_MODEL_FILES: dict[str, tuple[str, str, str, bool]] = {
    "llama": ("flash_attn.models.llama", "llama_config_to_gpt2_config", "LlamaConfig", True),
    "gpt_neox": ("flash_attn.models.gpt_neox", "gpt_neox_config_to_gpt2_config", "GPTNeoXConfig", False),
    "gptj": ("flash_attn.models.gptj", "gptj_config_to_gpt2_config", "GPTJConfig", False),
    "falcon": ("flash_attn.models.falcon", "falcon_config_to_gpt2_config", "FalconConfig", False),
}

_ENGINE: dict[str, Any] = {}


def _engine() -> dict[str, Any]:
    """Import flash-attn's rotary module (in the interpreter without CUDA), once."""
    if _ENGINE:
        return _ENGINE
    import torch

    cuda = torch.cuda.is_available()
    if not cuda:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    try:
        import transformers  # before the bare package exists: transformers probes for flash_attn
    except ImportError as e:
        raise ImportError(
            f"transformers is missing ({e}); install flash-attn's environment with:\n{INSTALL}"
        ) from e
    if "flash_attn" not in sys.modules:
        src = os.environ.get("FLASH_ATTN_SRC", _SRC_DEFAULT)
        if os.path.isdir(os.path.join(src, "flash_attn")):
            pkg = types.ModuleType("flash_attn")
            pkg.__path__ = [os.path.join(src, "flash_attn")]
            pkg.__version__ = _VERSION  # type: ignore[attr-defined]
            spec = importlib.machinery.ModuleSpec("flash_attn", None, is_package=True)
            spec.submodule_search_locations = pkg.__path__
            pkg.__spec__ = spec
            sys.modules["flash_attn"] = pkg
    try:
        rotary_layers = importlib.import_module("flash_attn.layers.rotary")
        kernels = importlib.import_module("flash_attn.ops.triton.rotary")
    except ImportError as e:
        raise ImportError(
            f"flash-attn's rotary module is not importable ({e}); install it with:\n{INSTALL}"
        ) from e
    if not cuda:
        from triton.runtime.interpreter import InterpretedFunction

        if not isinstance(kernels.rotary_kernel, InterpretedFunction):
            raise RuntimeError(
                "flash_attn.ops.triton.rotary was imported before TRITON_INTERPRET=1 was set "
                "and there is no CUDA: set TRITON_INTERPRET=1 before importing triton"
            )
    _ENGINE.update(
        torch=torch,
        transformers=transformers,
        rotary=rotary_layers,
        cuda=cuda,
        version=str(getattr(sys.modules["flash_attn"], "__version__", _VERSION)),
    )
    return _ENGINE


def version() -> str:
    """flash-attn's version (raises ImportError with the install recipe when it is missing)."""
    return str(_engine()["version"])


@contextlib.contextmanager
def _cpu_launch() -> Iterator[None]:
    """``torch.cuda.device`` as a no-op context for the duration of a call, without CUDA."""
    e = _engine()
    if e["cuda"]:
        yield
        return
    torch = e["torch"]
    orig = torch.cuda.device
    torch.cuda.device = lambda *_a, **_k: contextlib.nullcontext()
    try:
        yield
    finally:
        torch.cuda.device = orig


def _hf_kwargs(config: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in config.items() if k != "model_type"}


def _from_model_file(config: Mapping[str, Any]) -> dict[str, Any]:
    """The RotaryEmbedding arguments flash-attn's model file derives from this HF config."""
    e = _engine()
    mt = str(config["model_type"])
    mod_name, conv_name, cls_name, permute = _MODEL_FILES[mt]
    hf_cfg = getattr(e["transformers"], cls_name)(**_hf_kwargs(config))
    conv = getattr(importlib.import_module(mod_name), conv_name)
    try:
        gcfg = conv(hf_cfg)
    except AttributeError as err:
        raise RuntimeError(
            f"flash-attn's {mod_name}.{conv_name} fails on this config under transformers "
            f"{e['transformers'].__version__}: {err}"
        ) from err
    head_dim = gcfg.n_embd // gcfg.n_head  # models/gpt.py: create_mixer_cls
    return {
        "dim": int(getattr(gcfg, "rotary_emb_fraction", 0.0) * head_dim),
        "base": getattr(gcfg, "rotary_emb_base", 10000.0),
        "scale_base": getattr(gcfg, "rotary_emb_scale_base", None),
        "interleaved": getattr(gcfg, "rotary_emb_interleaved", False),
        "head_dim": head_dim,
        "permute": permute,
        "path": f"{mod_name}.{conv_name} -> models/gpt.py create_mixer_cls -> MHA -> RotaryEmbedding",
    }


def _generic_port(config: Mapping[str, Any], layer_type: str | None) -> dict[str, Any]:
    """RotaryEmbedding as a user porting the model builds it (no flash-attn model file)."""
    e = _engine()
    mt = str(config["model_type"])
    try:
        cfg = e["transformers"].AutoConfig.for_model(mt, **_hf_kwargs(config)).get_text_config()
    except (ValueError, KeyError) as err:
        raise Unsupported(f"transformers has no config class for model_type {mt!r} ({err})") from err
    rp = dict(getattr(cfg, "rope_parameters", None) or {})
    if rp and all(isinstance(v, Mapping) for v in rp.values()):  # per layer type
        lt = layer_type or sorted(rp)[0]
        rp = dict(rp.get(lt) or {})
    if "mrope_section" in rp:
        raise Unsupported("M-RoPE: flash-attn's RotaryEmbedding takes one position per token")
    kind = str(rp.get("rope_type", "default"))
    if kind != "default":
        raise Unsupported(
            f"flash-attn's RotaryEmbedding has no {kind!r} scaling "
            "(only base, interleaved and xPos scale_base)"
        )
    head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
    prf = float(rp.get("partial_rotary_factor", getattr(cfg, "partial_rotary_factor", None) or 1.0))
    return {
        "dim": int(head_dim * prf),
        "base": float(rp.get("rope_theta", 10000.0)),
        "scale_base": None,
        "interleaved": False,
        "head_dim": head_dim,
        "permute": False,
        "path": "generic port: layers/rotary.py "
        "RotaryEmbedding(head_dim * partial_rotary_factor, rope_theta)",
    }


class FlashAttnRope:
    """flash-attn's ``RotaryEmbedding`` for one config, called as ``MHA.forward`` calls it."""

    angles = "float32"
    max_position = None
    softmax_scale = 1.0

    def __init__(self, args: Mapping[str, Any], dtype: str) -> None:
        e = _engine()
        self._torch = e["torch"]
        self.dtype = getattr(self._torch, dtype)
        self.args = dict(args)
        self.module = e["rotary"].RotaryEmbedding(
            args["dim"], base=args["base"], interleaved=args["interleaved"], scale_base=args["scale_base"]
        )

    def __repr__(self) -> str:
        a = self.args
        return (
            f"RotaryEmbedding({a['dim']}, base={a['base']}, interleaved={a['interleaved']}, "
            f"scale_base={a['scale_base']}) [{a['path']}]"
        )

    def _layout(self, x: Any, inverse: bool) -> Any:
        """flash-attn's Llama weight remap (``inv_permute``) applied to the features, or undone."""
        if not self.args["permute"]:
            return x
        *lead, d = x.shape
        if inverse:
            return x.reshape(*lead, d // 2, 2).transpose(-1, -2).reshape(*lead, d)
        return x.reshape(*lead, 2, d // 2).transpose(-1, -2).reshape(*lead, d)

    def rotate(self, q: np.ndarray, k: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        torch = self._torch
        pos = np.asarray(positions, dtype=np.int64)
        if pos.ndim != 1:
            raise Unsupported("M-RoPE positions: flash-attn's RotaryEmbedding takes one position per token")
        if pos.size and pos.min() < 0:
            raise Unsupported("negative positions: flash-attn indexes its cos/sin table by position")
        n = pos.shape[0]
        # copies: the engine rotates in place
        qt = self._layout(torch.tensor(np.asarray(q, np.float32)).to(self.dtype), False)
        kt = self._layout(torch.tensor(np.asarray(k, np.float32)).to(self.dtype), False)
        prefill = n > 0 and bool(np.array_equal(pos, pos[0] + np.arange(n)))
        if prefill:  # (batch 1, seqlen n), seqlen_offset an int: the cache grows to p0 + n
            qb, kb = qt[None], kt[None]
            kw: dict[str, Any] = {"seqlen_offset": int(pos[0])}
        else:  # decoding: batch n of one token each, offsets = positions, table = generation length
            qb, kb = qt[:, None], kt[:, None]
            kw = {"seqlen_offset": torch.from_numpy(pos), "max_seqlen": int(pos.max()) + 1}
        with _cpu_launch():
            if qb.shape[2] == kb.shape[2]:  # MHA.forward, num_heads_kv == num_heads: packed qkv
                qkv = torch.stack([qb, kb, torch.zeros_like(kb)], dim=2).contiguous()
                qkv = self.module(qkv, **kw)
                qo, ko = qkv[:, :, 0], qkv[:, :, 1]
            else:  # MHA.forward with GQA: q and a packed kv
                kv = torch.stack([kb, torch.zeros_like(kb)], dim=2).contiguous()
                qo, kv = self.module(qb.contiguous(), kv, **kw)
                ko = kv[:, :, 0]
        qo, ko = (qo[0], ko[0]) if prefill else (qo[:, 0], ko[:, 0])
        return (self._layout(qo, True).float().numpy(), self._layout(ko, True).float().numpy())

    def rotate_packed(
        self, q: np.ndarray, k: np.ndarray, cu_seqlens: np.ndarray, offsets: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Packed documents through flash-attn's varlen rotary: ``apply_rotary_emb(x, cos, sin,
        interleaved, seqlen_offsets=<offsets, int32 (batch,)>, cu_seqlens=<int32>, max_seqlen=)``
        on ``x`` ``(total_seqlen, nheads, headdim)``, with the module's own cos/sin cache
        (``_update_cos_sin_cache(max(offset + length))``, cast to the input dtype as its
        ``forward`` does)."""
        torch = self._torch
        cu = np.asarray(cu_seqlens, dtype=np.int64)
        off = np.asarray(offsets, dtype=np.int64)
        lengths = np.diff(cu)
        apply = _engine()["rotary"].apply_rotary_emb
        outs = []
        with _cpu_launch():
            for x in (q, k):
                t = self._layout(torch.tensor(np.asarray(x, np.float32)).to(self.dtype), False).contiguous()
                self.module._update_cos_sin_cache(int((off + lengths).max()), device=t.device, dtype=t.dtype)
                y = apply(
                    t,
                    self.module._cos_cached,
                    self.module._sin_cached,
                    interleaved=self.args["interleaved"],
                    seqlen_offsets=torch.from_numpy(off.astype(np.int32)),
                    cu_seqlens=torch.from_numpy(cu.astype(np.int32)),
                    max_seqlen=int(lengths.max()),
                )
                outs.append(self._layout(y, True).float().numpy())
        return outs[0], outs[1]


def build(config: Mapping[str, Any], *, layer_type: str | None, dtype: str) -> FlashAttnRope:
    """flash-attn's RoPE for ``config`` (see the module docstring for the mapping)."""
    _engine()
    if dtype not in ("float32", "bfloat16", "float16"):
        raise Unsupported(f"dtype {dtype!r}")
    mt = str(config.get("model_type", ""))
    args = _from_model_file(config) if mt in _MODEL_FILES else _generic_port(config, layer_type)
    if args["dim"] <= 0:
        raise Unsupported("no rotary features (rotary_emb_fraction 0)")
    if args["head_dim"] > 256:
        raise Unsupported("flash-attn's apply_rotary asserts headdim <= 256")
    return FlashAttnRope(args, dtype)
