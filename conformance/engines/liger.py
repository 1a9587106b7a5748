"""liger-kernel 0.8.5: its Triton RoPE kernels, fed the cos/sin Hugging Face's own rotary class computes.

(Imported as ``conformance.engines.liger``; the engine's package is ``liger_kernel``: no shadowing.)

Install (CPU, Python 3.11; measured here: 102 s the first time, 62 s for the recipe below rerun in
a fresh directory with pip's cache warm; venv 2.2 GB of which torch 0.75 GB, triton 1.0 GB,
transformers 0.13 GB)::

    python3 -m venv venv && . venv/bin/activate
    pip install torch==2.13.0 numpy                    # the local CPU wheel
    pip install triton==3.9.0 packaging && pip install --no-deps liger-kernel==0.8.5
    pip install transformers==5.24.0                   # the models liger patches
    pip install --no-deps -e "$ROTARY" array-api-compat    # rotary, for the checker

Importing ``liger_kernel`` logs two harmless lines on CPU: its CuTe-DSL and Ascend ``rope``
backends fail to import (``nvidia-cutlass-dsl`` absent; ``triton.language.math.tanh`` absent in
triton 3.9); the dispatcher (``liger_kernel/backends/dispatch.py``) then resolves ``rope`` to
``nvidia-triton`` (``ops/backends/_triton/rope.py`` -> ``ops/rope.py: LigerRopeFunction``).

Triton interpreter
------------------
Without CUDA the kernels run in Triton's CPU interpreter.  ``TRITON_INTERPRET=1`` must be in the
environment **before the kernels are defined**: triton 3.9 reads it when ``@triton.jit`` decorates
``_triton_rope`` (``triton/runtime/jit.py``), i.e. when ``liger_kernel.ops.rope`` is first
imported; set it before ``import triton`` to be safe.  The adapter sets it itself, only when
``torch.cuda.is_available()`` is false, before its lazy imports, and raises if the kernels were
already defined for compilation.

Which code path, and how the HF config is mapped
------------------------------------------------
liger has no RoPE of its own: ``apply_liger_kernel_to_<model>(rope=True)``
(``transformers/monkey_patch.py``, looked up in ``MODEL_TYPE_TO_APPLY_LIGER_FN``) replaces the
``apply_rotary_pos_emb`` of transformers' ``modeling_<model>.py`` with a liger function; the cos/sin
it rotates with still come from transformers' ``<Model>RotaryEmbedding`` (every scaling, attention
factor and dynamic update is HF's).  The adapter therefore:

1. runs liger's own ``apply_liger_kernel_to_<model_type>(rope=True, <every other flag False>)``,
   records which function it installs under which name of the HF modeling module, and restores
   the module (no lasting monkey patch);
2. builds transformers' rotary class for the config (``AutoConfig.for_model(model_type,
   **config).get_text_config()``, the class ``<X>RotaryEmbedding`` of ``modeling_<type>``) and
   calls it as the model does, ``rotary_emb(hidden_states, position_ids[, layer_type])`` with
   ``hidden_states`` of the model dtype: cos/sin are computed in float32 and cast to that dtype;
3. calls the installed function as HF's attention calls ``apply_rotary_pos_emb``:
   ``(q, k, cos, sin)`` with ``q``/``k`` of shape ``(1, heads, tokens, head_dim)``, transposed
   views of ``(1, tokens, heads, head_dim)`` as the projections produce them.  Partial rotary
   (Phi, GPT-NeoX): the full heads with cos/sin of the rotary width (the kernel rotates the first
   ``cos.shape[-1]`` features).  GPT-OSS: ``liger_rotary_pos_emb_gpt_oss`` (cos/sin of width
   ``head_dim / 2``, ``rotary_dim = head_dim``).  The kernel computes in the cos/sin dtype
   (bfloat16 in, bfloat16 arithmetic).  Where HF's attention multiplies queries after RoPE
   (Ministral 3's ``get_llama_4_attn_scale``), ``query_scale`` calls that HF function.

Model types liger has no ``apply_liger_kernel_to_*`` for (here Ministral 3, Phi-2, GPT-NeoX): the
generic port a user writes with liger's documented ``liger_rotary_pos_emb``, i.e. the same
replacement of ``modeling_<type>.apply_rotary_pos_emb``, where that function has liger's
signature and HF's half layout (``rotate_half``).  Unsupported: GPT-J (interleaved,
``apply_rotary_pos_emb(tensor, sin, cos)``; liger's kernel is half-layout only), DeepSeek-V3
(``apply_liger_kernel_to_deepseek_v3(rope=True)`` installs nothing: "interleaved partial RoPE is
incompatible with liger_rotary_pos_emb").

M-RoPE (Qwen2-VL): liger's kernel is ``liger_multimodal_rotary_pos_emb(q, k, cos, sin,
mrope_section)`` (``ops/qwen2vl_mrope.py``) on 3-row cos/sin ``(3, batch, tokens, head_dim)``,
as transformers' Qwen2-VL passed them to ``apply_multimodal_rotary_pos_emb`` before
huggingface/transformers#48105.  Under transformers 5.24 ``apply_liger_kernel_to_qwen2_vl``
raises ``ImportError`` (``Qwen2VLCausalLMOutputWithPast`` is gone) before patching, and the name
it patches no longer exists (``Qwen2VLRotaryEmbedding`` recomposes the sections itself and the
attention calls the plain ``apply_rotary_pos_emb``): the kernel is unreachable from an HF model.
The adapter still checks the kernel, called as that call site did, with the 3 rows from
``Qwen2VLRotaryEmbedding.forward`` whose section recomposition is replaced by the former
``cat((freqs, freqs))``; ``patch`` on the built object says so.

No table (``max_position = None``): HF computes cos/sin per call.  Angles: float32 (HF's).

bfloat16 is refused without CUDA (``Unsupported``): the kernels compute in the cos/sin dtype
(``.to(sin_row.dtype)``), and Triton's interpreter stores bfloat16 as ``uint16`` and runs the
arithmetic on those bits (garbage; its debugging guide: "does not support operations on bfloat16",
triton-lang/triton#4972, #10945).  float16, which the interpreter computes correctly, exercises the
same low-precision path.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import io
import logging
import os
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np

from rotary.testing.engine import Unsupported

NAME = "liger-kernel"
PYTHON = "3.11"
INSTALL = """\
python3.11 -m venv $ENGINES/liger/venv && cd $ENGINES/liger && . venv/bin/activate
pip install torch==2.13.0 numpy
pip install triton==3.9.0 packaging && pip install --no-deps liger-kernel==0.8.5
pip install transformers==5.24.0
pip install --no-deps -e "$ROTARY" array-api-compat"""

__all__ = ["INSTALL", "NAME", "PYTHON", "build", "version"]

_ENGINE: dict[str, Any] = {}
_MISSING = object()
# model_type -> what liger's apply_liger_kernel_to_<model_type>(rope=True) installs: (name, function, note)
_PATCHES: dict[str, tuple[str | None, Any, str]] = {}


def _engine() -> dict[str, Any]:
    """Import liger's RoPE functions (in the interpreter without CUDA), once."""
    if _ENGINE:
        return _ENGINE
    import torch

    cuda = torch.cuda.is_available()
    if not cuda:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    try:
        import transformers
        from liger_kernel.ops import qwen2vl_mrope, rope
        from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN
        from liger_kernel.transformers.qwen2vl_mrope import liger_multimodal_rotary_pos_emb
        from liger_kernel.transformers.rope import liger_rotary_pos_emb
    except ImportError as e:
        raise ImportError(f"liger-kernel is not importable ({e}); install it with:\n{INSTALL}") from e
    if not cuda:
        from triton.runtime.interpreter import InterpretedFunction

        for k in (rope._triton_rope, qwen2vl_mrope._triton_qwen2vl_mrope):
            if not isinstance(k, InterpretedFunction):
                raise RuntimeError(
                    "liger_kernel's kernels were imported before TRITON_INTERPRET=1 was set "
                    "and there is no CUDA: set TRITON_INTERPRET=1 before importing triton"
                )
    from importlib.metadata import version as v

    _ENGINE.update(
        torch=torch,
        transformers=transformers,
        patches=MODEL_TYPE_TO_APPLY_LIGER_FN,
        cuda=cuda,
        rope=liger_rotary_pos_emb,
        mrope=liger_multimodal_rotary_pos_emb,
        version=v("liger-kernel"),
    )
    return _ENGINE


def version() -> str:
    """liger-kernel's version (raises ImportError with the install recipe when it is missing)."""
    return str(_engine()["version"])


def _liger_patch(model_type: str, module: Any) -> tuple[str | None, Any, str]:
    """What ``apply_liger_kernel_to_<model_type>(rope=True)`` installs in ``module``:
    ``(name, function, note)``; ``name`` None when it installs nothing (or has no such patch)."""
    if model_type in _PATCHES:  # liger's warnings are logged once per process: keep the first reading
        return _PATCHES[model_type]
    _PATCHES[model_type] = found = _read_patch(model_type, module)
    return found


def _read_patch(model_type: str, module: Any) -> tuple[str | None, Any, str]:
    e = _engine()
    fn = e["patches"].get(model_type)
    if fn is None:
        return None, None, f"liger has no apply_liger_kernel_to_* for model_type {model_type!r}"
    params = inspect.signature(fn).parameters
    kw = {n: False for n, p in params.items() if isinstance(p.default, bool)}
    kw["rope"] = True
    before = dict(vars(module))
    log = io.StringIO()
    handler = logging.StreamHandler(log)
    logging.getLogger("liger_kernel").addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fn(**kw)
    except Exception as err:  # the patch itself fails under this transformers
        return None, None, f"{fn.__name__}(rope=True) raises {type(err).__name__}: {err}"
    finally:
        logging.getLogger("liger_kernel").removeHandler(handler)
        after = dict(vars(module))
        for k, val in after.items():  # undo the monkey patch
            if before.get(k, _MISSING) is not val:
                if k in before:
                    setattr(module, k, before[k])
                else:
                    delattr(module, k)
    changed = [k for k, val in after.items() if before.get(k, _MISSING) is not val]
    said = "; ".join([str(w.message) for w in caught] + [s for s in log.getvalue().splitlines() if s])
    if not changed:
        return None, None, f"{fn.__name__}(rope=True) installs no RoPE kernel" + (f" ({said})" * bool(said))
    name = changed[0]
    func = after[name]
    note = f"{fn.__name__}(rope=True) sets {module.__name__}.{name} = {func.__module__}.{func.__name__}"
    if name not in before:
        note += f" (a name transformers {e['transformers'].__version__} does not define: never called)"
    return name, func, note


def _rotary_class(module: Any) -> Any:
    names = [
        n
        for n, c in vars(module).items()
        if isinstance(c, type)
        and n.endswith("RotaryEmbedding")
        and c.__module__ == module.__name__
        and "Vision" not in n
    ]
    if not names:
        raise Unsupported(f"{module.__name__} has no text rotary embedding class")
    return getattr(module, names[0])


class LigerRope:
    """liger's kernel applied with HF's cos/sin for one config, layer type and dtype."""

    angles = "float32"
    max_position = None
    softmax_scale = 1.0

    def __init__(
        self,
        fn: Any,
        rotary: Any,
        module: Any,
        hf_cfg: Any,
        layer_type: str | None,
        dtype: str,
        mrope: bool,
        patch: str,
    ) -> None:
        e = _engine()
        self._torch = e["torch"]
        self.dtype = getattr(self._torch, dtype)
        self.fn, self.rotary, self.module, self.hf_cfg = fn, rotary, module, hf_cfg
        self.layer_type, self.mrope, self.patch = layer_type, mrope, patch
        self._takes_layer_type = "layer_type" in inspect.signature(rotary.forward).parameters

    def __repr__(self) -> str:
        return f"{self.fn.__name__} with {type(self.rotary).__name__} cos/sin [{self.patch}]"

    def _cos_sin(self, position_ids: Any) -> tuple[Any, Any]:
        x = self._torch.zeros(1, dtype=self.dtype)
        with self._torch.no_grad():
            if self._takes_layer_type:
                return self.rotary(x, position_ids, self.layer_type)  # type: ignore[no-any-return]
            return self.rotary(x, position_ids)  # type: ignore[no-any-return]

    def rotate_packed(
        self, q: np.ndarray, k: np.ndarray, cu_seqlens: np.ndarray, offsets: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """liger's kernel takes no packing: it applies the cos and sin it is given."""
        raise Unsupported(
            "liger-kernel's liger_rotary_pos_emb(q, k, cos, sin) takes no cu_seqlens or offsets: it "
            "applies the cos and sin its caller gathered (Hugging Face's rotary class, per batch row)"
        )

    def rotate(self, q: np.ndarray, k: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        torch = self._torch
        pos = np.asarray(positions, dtype=np.int64)
        if self.mrope:
            rows = pos if pos.ndim == 2 else np.broadcast_to(pos, (3, pos.shape[-1]))
            position_ids = torch.from_numpy(np.ascontiguousarray(rows))[:, None, :]  # (3, batch 1, tokens)
        elif pos.ndim == 1:
            position_ids = torch.from_numpy(pos)[None]  # (batch 1, tokens)
        else:
            raise Unsupported("M-RoPE positions for a model with one position row")
        cos, sin = self._cos_sin(position_ids)
        # copies (the kernel rotates in place), viewed as HF's (1, heads, tokens, head_dim) transposes
        qt = torch.tensor(np.asarray(q, np.float32)).to(self.dtype)[None].transpose(1, 2)
        kt = torch.tensor(np.asarray(k, np.float32)).to(self.dtype)[None].transpose(1, 2)
        with torch.no_grad():
            if self.mrope:
                qo, ko = self.fn(qt, kt, cos, sin, self.rotary.mrope_section)
            else:
                qo, ko = self.fn(qt, kt, cos, sin)
        return qo[0].transpose(0, 1).float().numpy(), ko[0].transpose(0, 1).float().numpy()

    def query_scale(self, positions: np.ndarray) -> np.ndarray | None:
        """HF's post-RoPE query factor (Ministral 3's ``get_llama_4_attn_scale``), else None."""
        rp = dict(getattr(self.hf_cfg, "rope_parameters", None) or {})
        f = getattr(self.module, "get_llama_4_attn_scale", None)
        if f is None or rp.get("llama_4_scaling_beta") is None:
            return None
        pos = self._torch.from_numpy(np.asarray(positions, dtype=np.int64).reshape(-1))[None]
        s = f(pos, rp.get("llama_4_scaling_beta"), rp.get("original_max_position_embeddings")).to(self.dtype)
        return s.reshape(-1).double().numpy()


def build(config: Mapping[str, Any], *, layer_type: str | None, dtype: str) -> LigerRope:
    """liger's RoPE for ``config`` (see the module docstring for the mapping)."""
    e = _engine()
    if dtype not in ("float32", "bfloat16", "float16"):
        raise Unsupported(f"dtype {dtype!r}")
    if dtype == "bfloat16" and not e["cuda"]:
        raise Unsupported(
            "bfloat16 in Triton's CPU interpreter: liger computes in the cos/sin dtype and "
            "the interpreter does bfloat16 arithmetic on the raw bits (documented: 'does not "
            "support operations on bfloat16'); check bfloat16 on a GPU"
        )
    mt = str(config.get("model_type", ""))
    tf = e["transformers"]
    try:
        hf_cfg = tf.AutoConfig.for_model(mt, **{k: v for k, v in config.items() if k != "model_type"})
    except (ValueError, KeyError) as err:
        raise Unsupported(f"transformers has no config class for model_type {mt!r}") from err
    text_cfg = hf_cfg.get_text_config()
    module = importlib.import_module(type(text_cfg).__module__.replace(".configuration_", ".modeling_"))
    cls = _rotary_class(module)
    with contextlib.redirect_stderr(io.StringIO()):
        rotary = cls(config=text_cfg)
    if layer_type is None and getattr(text_cfg, "layer_types", None):
        layer_type = text_cfg.layer_types[0]
    name, fn, note = _liger_patch(mt, module)
    mrope = hasattr(rotary, "mrope_section")
    if mrope:
        # liger's M-RoPE kernel, called as transformers' apply_multimodal_rotary_pos_emb call site did
        # (before huggingface/transformers#48105): 3-row cos/sin, without the section recomposition.
        if hasattr(rotary, "recomposition_frequencies"):
            rotary.recomposition_frequencies = lambda f: e["torch"].cat((f, f), dim=-1)
        note += (
            "; checked: liger_multimodal_rotary_pos_emb(q, k, cos, sin, mrope_section) on the 3-row "
            f"cos/sin of {cls.__name__}"
        )
        return LigerRope(e["mrope"], rotary, module, text_cfg, layer_type, dtype, True, note)
    if fn is not None and name in vars(module):
        return LigerRope(fn, rotary, module, text_cfg, layer_type, dtype, False, note)
    if e["patches"].get(mt) is not None:  # liger patches this model but installs no live RoPE kernel
        if "raises" in note:
            raise RuntimeError(note)
        raise Unsupported(note)
    hf_apply = getattr(module, "apply_rotary_pos_emb", None)
    params = list(inspect.signature(hf_apply).parameters)[:4] if hf_apply is not None else []
    if params != ["q", "k", "cos", "sin"] or not hasattr(module, "rotate_half"):
        raise Unsupported(
            f"{note}; {module.__name__}.apply_rotary_pos_emb is not the half-layout "
            "(q, k, cos, sin) rotation liger_rotary_pos_emb replaces (interleaved layout)"
        )
    note += f"; generic port: {module.__name__}.apply_rotary_pos_emb replaced by liger_rotary_pos_emb"
    return LigerRope(e["rope"], rotary, module, text_cfg, layer_type, dtype, False, note)
