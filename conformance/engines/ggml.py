"""llama.cpp's ggml (vendored in llama-cpp-python 0.3.36, ggml 0.25.3): ``ggml_rope_ext`` and
``ggml_rope_multi`` on the CPU backend, with a Hugging Face config mapped the way llama.cpp maps it.

Install (CPU, Python 3.11; measured here on 2 shared cores: 23 min, 21 of them compiling
llama.cpp; venv 1.2 GB (torch 0.8 GB), the unpacked source 0.2 GB)::

    python3.11 -m venv $ENGINES/ggml/venv && cd $ENGINES/ggml
    venv/bin/pip install torch==2.13.0 numpy
    venv/bin/pip download --no-deps --no-binary llama-cpp-python llama-cpp-python==0.3.36 -d dl
    tar xzf dl/llama_cpp_python-0.3.36.tar.gz    # the source: ggml, llama.cpp and its converter
    export CMAKE_ARGS="-DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
        -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF" CMAKE_BUILD_PARALLEL_LEVEL=2
    venv/bin/pip install ./llama_cpp_python-0.3.36
    venv/bin/pip install transformers==4.57.6 sentencepiece protobuf pyyaml tqdm requests
    venv/bin/pip install --no-deps -e "$ROTARY" array-api-compat

The unpacked source stays beside the venv (``$LLAMA_CPP_SRC``, default
``llama_cpp_python-0.3.36/vendor/llama.cpp`` beside it): the adapter runs its converter.
``torch``, ``transformers`` (the version ``requirements/requirements-convert_hf_to_gguf.txt``
pins), ``sentencepiece`` and ``protobuf`` are the converter's imports; the RoPE itself is the
compiled ``libggml-base``/``libggml-cpu`` that ``llama_cpp`` loads, called through ``ctypes``.

Why this build.  llama-cpp-python is how Python users run llama.cpp, and its sdist vendors a
current llama.cpp (ggml 0.25.3, with ``conversion/``, the converter split into modules).
``ggml-python`` 0.0.45 binds a ggml snapshot of its own; the adapter runs
the llama.cpp people install today, converter, runtime and kernel from one source tree.

How llama.cpp maps a Hugging Face config (each step is llama.cpp's own code where it can be)
-------------------------------------------------------------------------------------------
1. **Converter** (``convert_hf_to_gguf.py``, run as its ``main`` runs it): the config is written
   as ``config.json`` into an empty model folder (with the published ``architectures`` the matrix's
   dicts leave out, and placeholders for the non-RoPE sizes a converter asserts), loaded by
   ``ModelBase.load_hparams`` (``AutoConfig``, falling back to the raw JSON as the converter does),
   the class ``get_model_class(get_model_architecture(...))`` instantiated, and its
   ``set_gguf_parameters()`` and ``generate_extra_tensors()`` run: the GGUF metadata
   (``<arch>.rope.*``, ``context_length``, ``attention.key_length``, ``attention.temperature_scale``)
   and the extra tensors (``rope_freqs``: Llama 3's factors; ``rope_factors_long``/``_short``:
   LongRoPE) are read back from the converter's ``GGUFWriter``.  An architecture the converter does
   not know (GPT-J) is not supported.
2. **q/k feature order**: q and k arrive in the HF checkpoint's feature order.  The converter's
   ``modify_tensors`` is run on the q/k projection weights with each row holding its own index;
   the rows it yields are the permutation llama.cpp's q/k carry (``LlamaModel.permute`` for
   Llama-family models: half -> interleaved, with ``LLAMA_ROPE_TYPE_NORM``; none for NEOX models;
   GPT-NeoX's fused ``query_key_value`` regrouped per head).  The adapter permutes the given q/k
   that way, rotates, and permutes back (exact).
3. **Loader** (``src/llama-model.cpp`` ``load_hparams`` and each ``models/<arch>.cpp``
   ``load_arch_hparams``): ``n_ctx_orig_yarn`` = ``rope.scaling.original_context_length`` or
   ``n_ctx_train``; ``freq_scale = 1/rope.scaling.factor`` (1 without one); ``n_rot`` =
   ``rope.dimension_count`` or the head size; ``rope_attn_factor``; YaRN ``beta_fast``/
   ``beta_slow``/``log_mul`` read only by the architectures that read them (``mistral3``,
   ``deepseek2`` with its ``/ 0.1`` undoing the converter's ``0.1 *``); the sliding-window base
   (``rope.freq_base_swa``, scale 1) for SWA layers.  Defaults from ``llama-hparams.h``.
4. **Context** (``src/llama-context.cpp``, default ``llama_context_params``, ``n_ctx = 0`` i.e.
   the trained context): ``yarn_ext_factor`` 1 for YaRN else 0; ``yarn_attn_factor`` =
   ``get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim)`` (``log_mul``) or
   ``get_mscale(factor, 1)``, times ``1 / (1 + 0.1 ln factor)`` (ggml's ``rope_yarn`` multiplies it
   back), times ``rope_attn_factor``; ``n_ctx_orig_yarn`` as loaded.  LongRoPE picks its long
   factors when ``n_ctx_seq > n_ctx_orig_yarn`` (``llama_model::get_rope_factors``): with the
   default context (the trained one, 131072 for Phi-3 128k) always the long ones.
5. **Rope mode** (``llama_model_rope_type``): read from ``src/llama-model.cpp``'s own switch (and
   ``src/llama-arch.cpp``'s name table), not restated: NORM (adjacent pairs), NEOX (halves), MROPE.
6. **Graph** (``src/models/<arch>.cpp``): ``ggml_rope_ext(ctx, Qcur[n_embd_head, n_head, n_tokens],
   pos, rope_factors, n_rot, rope_type, n_ctx_orig, freq_base, freq_scale, ext_factor, attn_factor,
   beta_fast, beta_slow)``; ``ggml_rope_multi`` with the converter's ``rope.dimension_sections`` and
   4 position rows (t, h, w, and 0) for Qwen2-VL; DeepSeek-V2/V3's softmax scale
   ``mscale**2 / sqrt(qk_head_dim)`` (``models/deepseek2.cpp``); Ministral 3's query temperature
   ``log(floor(pos / n_ctx_orig_yarn) + 1) * temperature_scale + 1`` (``llm_graph_input_attn_temp``).
   ggml forms the angles by recurrence: ``theta = pos`` then ``theta *= powf(base, -2/n_dims)``
   per pair, in float32, and rotates in float32 (F16 tensors are read into float32 and each output
   rounded to F16).  ggml's CPU RoPE takes F32 and F16 only: bfloat16 is not supported.

Everything else llama.cpp's runtime would use from the metadata is restated from the C++ above
(it is compiled): the adapter cites each line it mirrors.

Conformance (rotary's float64 truth, positions to 2**20 + 3, float32 and float16, angles of kind
``"float32_recurrence"``): 11 of the 15 cases pass, GPT-J is not supported (the converter has no
``GPTJForCausalLM``); YaRN ignores ``truncate`` (gpt-oss), dynamic NTK converts to plain RoPE,
and LongRoPE picks its factors by the context size (see :mod:`conformance.engines.findings`).
Each mapping step was checked by breaking it: without the q/k permutation the checker reports the
other layout, with ``n_ctx_orig`` = ``max_position_embeddings`` it reports the wrong original length
(``yarn_original``).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import re
import sys
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from rotary.testing.engine import Unsupported

from .cases import as_published

NAME = "ggml"
PYTHON = "3.11"
#: ggml's CPU RoPE takes F32 and F16 tensors (``ggml_compute_forward_rope``): no bfloat16.
DTYPES = ("float32", "float16")
INSTALL = """\
python3.11 -m venv $ENGINES/ggml/venv && cd $ENGINES/ggml
venv/bin/pip install torch==2.13.0 numpy
venv/bin/pip download --no-deps --no-binary llama-cpp-python llama-cpp-python==0.3.36 -d dl
tar xzf dl/llama_cpp_python-0.3.36.tar.gz
export CMAKE_ARGS="-DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \\
  -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF" CMAKE_BUILD_PARALLEL_LEVEL=2
venv/bin/pip install ./llama_cpp_python-0.3.36
venv/bin/pip install transformers==4.57.6 sentencepiece protobuf pyyaml tqdm requests
venv/bin/pip install --no-deps -e "$ROTARY" array-api-compat"""

__all__ = ["DTYPES", "INSTALL", "NAME", "PYTHON", "build", "version"]

_SDIST = "llama_cpp_python-0.3.36"
#: The llama.cpp source (converter, gguf-py, src/) when ``$LLAMA_CPP_SRC`` is not set.
_SRC_DEFAULT = os.path.join(os.path.dirname(sys.prefix), _SDIST, "vendor", "llama.cpp")

#: Non-RoPE fields a converter reads that the matrix's dicts leave out (placeholders; the
#: published value where a converter uses it, e.g. gpt-oss's sliding window).
_PLACEHOLDERS: dict[str, Any] = {
    "vocab_size": 256,
    "intermediate_size": 64,
    "rms_norm_eps": 1e-6,
    "layer_norm_eps": 1e-5,
    "layer_norm_epsilon": 1e-5,
    "sliding_window": 128,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 64,
    "n_routed_experts": 4,
    "n_shared_experts": 1,
    "first_k_dense_replace": 1,
    "tie_word_embeddings": False,
}

_GGML_TYPE = {"float32": 0, "float16": 1}  # GGML_TYPE_F32, GGML_TYPE_F16 (ggml.h)
_GGML_TYPE_I32 = 26
_ROPE_MODE = {"LLAMA_ROPE_TYPE_NORM": 0, "LLAMA_ROPE_TYPE_NEOX": 2, "LLAMA_ROPE_TYPE_MROPE": 8}

_STATE: dict[str, Any] = {}


def _src() -> Path:
    return Path(os.environ.get("LLAMA_CPP_SRC", _SRC_DEFAULT))


def _engine() -> dict[str, Any]:
    """llama_cpp's ggml libraries through ctypes, and llama.cpp's converter, once."""
    if _STATE:
        return _STATE
    try:
        import llama_cpp
    except ImportError as e:
        raise ImportError(f"llama-cpp-python is not installed ({e}); install it with:\n{INSTALL}") from e
    src = _src()
    if not (src / "convert_hf_to_gguf.py").is_file():
        raise ImportError(
            f"llama.cpp's source is not at {src} (set LLAMA_CPP_SRC); install it with:\n{INSTALL}"
        )
    lib = Path(llama_cpp.__file__).parent / "lib"
    base = ctypes.CDLL(str(lib / "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
    cpu = ctypes.CDLL(str(lib / "libggml-cpu.so"), mode=ctypes.RTLD_GLOBAL)
    vp, i32, i64, f32 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_float

    class InitParams(ctypes.Structure):  # struct ggml_init_params (ggml.h)
        _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", vp), ("no_alloc", ctypes.c_bool)]

    base.ggml_init.argtypes, base.ggml_init.restype = [InitParams], vp
    base.ggml_free.argtypes, base.ggml_free.restype = [vp], None
    base.ggml_new_tensor_1d.argtypes, base.ggml_new_tensor_1d.restype = [vp, i32, i64], vp
    base.ggml_new_tensor_3d.argtypes, base.ggml_new_tensor_3d.restype = [vp, i32, i64, i64, i64], vp
    base.ggml_get_data.argtypes, base.ggml_get_data.restype = [vp], vp
    base.ggml_rope_ext.argtypes = [vp, vp, vp, vp, i32, i32, i32, f32, f32, f32, f32, f32, f32]
    base.ggml_rope_ext.restype = vp
    base.ggml_rope_multi.argtypes = [vp, vp, vp, vp, i32, ctypes.POINTER(i32), i32, i32]
    base.ggml_rope_multi.argtypes += [f32] * 6
    base.ggml_rope_multi.restype = vp
    base.ggml_new_graph.argtypes, base.ggml_new_graph.restype = [vp], vp
    base.ggml_build_forward_expand.argtypes, base.ggml_build_forward_expand.restype = [vp, vp], None
    base.ggml_version.restype = base.ggml_commit.restype = ctypes.c_char_p
    cpu.ggml_graph_compute_with_ctx.argtypes, cpu.ggml_graph_compute_with_ctx.restype = [vp, vp, i32], i32
    _STATE.update(
        base=base,
        cpu=cpu,
        InitParams=InitParams,
        version=f"{llama_cpp.__version__} (ggml {base.ggml_version().decode()}, "
        f"llama.cpp {base.ggml_commit().decode()})",
    )
    return _STATE


def version() -> str:
    """llama-cpp-python's version with its ggml's (ImportError with the recipe when missing)."""
    return str(_engine()["version"])


# -- 1, 2: the converter ----------------------------------------------------------------------------
@contextlib.contextmanager
def _converter_on_path() -> Iterator[None]:
    """``convert_hf_to_gguf.py``'s imports: its ``gguf-py`` and its ``conversion`` package."""
    src = str(_src())
    added = [p for p in (str(Path(src) / "gguf-py"), src) if p not in sys.path]
    sys.path[:0] = added
    try:
        yield
    finally:
        for p in added:
            sys.path.remove(p)


def _convert(config: Mapping[str, Any]) -> dict[str, Any]:
    """Run llama.cpp's converter on ``config`` (no weights): its GGUF metadata, extra tensors
    and the q/k row permutation it applies."""
    cfg = as_published(config)
    for k, v in _PLACEHOLDERS.items():
        cfg.setdefault(k, v)
    logging.disable(logging.WARNING)  # the converter's info/warning lines
    try:
        with _converter_on_path(), tempfile.TemporaryDirectory() as d:
            import gguf
            import torch
            from conversion import ModelBase, ModelType, get_model_architecture, get_model_class

            folder = Path(d)
            (folder / "config.json").write_text(json.dumps(cfg))
            hparams = ModelBase.load_hparams(folder, False)  # as convert_hf_to_gguf.main
            arch = get_model_architecture(hparams, ModelType.TEXT)
            try:
                cls = get_model_class(arch)
            except NotImplementedError as e:
                raise Unsupported(f"llama.cpp's converter: {e}") from None
            with torch.inference_mode():
                model = cls(folder, gguf.LlamaFileType.ALL_F32, folder / "m.gguf", dry_run=True)
                impl = getattr(model, "impl", model)  # Mistral3Model delegates to its impl
                impl.set_gguf_parameters()
                extra = {n: t.float().numpy() for n, t in impl.generate_extra_tensors()}  # (+ metadata)
                kv = {k: v.value for shard in impl.gguf_writer.kv_data for k, v in shard.items()}
                perm = _qk_rows(impl, impl.hparams, torch)
            return {"arch": impl.gguf_writer.arch, "kv": kv, "extra": extra, "perm": perm}
    finally:
        logging.disable(logging.NOTSET)


def _qk_rows(model: Any, hp: Mapping[str, Any], torch: Any) -> tuple[np.ndarray, np.ndarray]:
    """The converter's q/k row order within one head: ``modify_tensors`` run on the projection
    weights whose row ``r`` holds ``r``; feature ``j`` of llama.cpp's head is HF feature
    ``perm[j]``."""
    n_head = int(hp.get("num_attention_heads") or hp["n_head"])
    n_kv = int(hp.get("num_key_value_heads") or n_head)
    hidden = int(hp.get("hidden_size") or hp["n_embd"])
    mt = hp.get("model_type")

    def rows(name: str, n: int, width: int = 1) -> np.ndarray:
        w = torch.arange(n, dtype=torch.float32)[:, None].repeat(1, width)
        out = list(model.modify_tensors(w, name, 0))
        if len(out) != 1:
            raise Unsupported(f"the converter split {name} into {[o[0] for o in out]}")
        return np.asarray(out[0][1][:, 0].numpy(), dtype=np.int64)

    if mt == "deepseek_v3":  # q_b_proj rows per head [nope, rope]; kv_a_proj_with_mqa [lora, rope]
        nope, rope = int(hp["qk_nope_head_dim"]), int(hp["qk_rope_head_dim"])
        q = (
            rows("model.layers.0.self_attn.q_b_proj.weight", n_head * (nope + rope))[nope : nope + rope]
            - nope
        )
        lora = int(hp["kv_lora_rank"])
        k = rows("model.layers.0.self_attn.kv_a_proj_with_mqa.weight", lora + rope)[lora:] - lora
        return q, k
    hd = int(hp.get("head_dim") or hidden // n_head)
    if mt == "gpt_neox":  # fused rows per head [q, k, v]; llama.cpp's graph views [Q | K | V]
        r = rows("gpt_neox.layers.0.attention.query_key_value.weight", 3 * hidden, hidden)
        return r[:hd], r[hidden : hidden + hd] - hd
    if mt == "phi3":  # fused [Q | K | V], viewed so by models/phi3.cpp
        r = rows("model.layers.0.self_attn.qkv_proj.weight", (n_head + 2 * n_kv) * hd)
        return r[:hd], r[n_head * hd : n_head * hd + hd] - n_head * hd
    q = rows("model.layers.0.self_attn.q_proj.weight", n_head * hd)[:hd]
    k = rows("model.layers.0.self_attn.k_proj.weight", n_kv * hd)[:hd]
    return q, k


# -- 3, 4, 5: the loader, the context, the rope mode ------------------------------------------------
def _rope_type(arch: str) -> int:
    """``llama_model_rope_type`` for a GGUF architecture name, read from llama.cpp's source."""
    src = _src() / "src"
    names = dict(
        (name, enum)
        for enum, name in re.findall(
            r"\{\s*(LLM_ARCH_\w+)\s*,\s*\"([^\"]+)\"\s*\}", (src / "llama-arch.cpp").read_text()
        )
    )
    body = (src / "llama-model.cpp").read_text()
    body = body[body.index("llama_rope_type llama_model_rope_type(") :]
    body = body[: body.index("\n}\n")]
    enum = names.get(arch)
    pending: list[str] = []
    for line in body.splitlines():
        line = line.split("//")[0].strip()
        pending += re.findall(r"case\s+(LLM_ARCH_\w+)\s*:", line)
        m = re.search(r"return\s+(LLAMA_ROPE_TYPE_\w+)", line)
        if m:
            if enum in pending:
                if m.group(1) not in _ROPE_MODE:
                    raise Unsupported(f"llama.cpp's rope type for {arch!r} is {m.group(1)}")
                return _ROPE_MODE[m.group(1)]
            pending = []
    raise Unsupported(f"llama_model_rope_type has no case for {arch!r} ({enum})")


def _runtime(conv: Mapping[str, Any], layer_type: str | None) -> dict[str, Any]:
    """The ``ggml_rope_ext`` arguments llama.cpp's runtime derives from the converter's metadata."""
    arch, kv = conv["arch"], conv["kv"]
    f32 = np.float32

    def get(key: str, default: Any = None) -> Any:
        return kv.get(f"{arch}.{key}", default)

    # llama_model::load_hparams (src/llama-model.cpp) and llama-hparams.h defaults
    n_ctx_train = int(get("context_length"))
    n_ctx_orig_yarn = int(get("rope.scaling.original_context_length", n_ctx_train))
    freq_base = f32(get("rope.freq_base", 10000.0))
    scaling = str(get("rope.scaling.type", "linear"))
    factor = f32(get("rope.scaling.factor", get("rope.scale_linear", 0.0)))
    freq_scale = f32(1.0) if factor == 0 else f32(1.0) / factor
    rope_attn_factor = f32(get("rope.scaling.attn_factor", 1.0))
    n_head = int(get("attention.head_count"))
    n_embd_head_k = int(get("attention.key_length", int(get("embedding_length")) // n_head))
    n_rot = int(get("rope.dimension_count", n_embd_head_k))
    beta_fast, beta_slow, log_mul = f32(32.0), f32(1.0), f32(0.0)
    temp_scale = 0.0
    if arch == "mistral3":  # models/mistral3.cpp load_arch_hparams
        beta_fast = f32(get("rope.scaling.yarn_beta_fast", beta_fast))
        beta_slow = f32(get("rope.scaling.yarn_beta_slow", beta_slow))
        log_mul = f32(get("rope.scaling.yarn_log_multiplier", log_mul))
        temp_scale = float(get("attention.temperature_scale", 0.0))
    if arch == "deepseek2" and get("rope.scaling.yarn_log_multiplier") is not None:
        log_mul = f32(get("rope.scaling.yarn_log_multiplier")) / f32(0.1)  # models/deepseek2.cpp
    swa = layer_type == "sliding_attention"
    if swa:  # llama_model::get_rope_freq_base/scale: hparams.is_swa(il)
        freq_base = f32(get("rope.freq_base_swa", 10000.0))  # llama-hparams.h default
        freq_scale = f32(1.0)  # rope_freq_scale_train_swa (llama-hparams.h; models/openai-moe.cpp copies)
        if arch == "gpt-oss":
            freq_base = f32(get("rope.freq_base_swa", get("rope.freq_base", 10000.0)))
            freq_scale = f32(1.0) if factor == 0 else f32(1.0) / factor

    # llama_context::llama_context (src/llama-context.cpp), default llama_context_params
    if scaling == "none":
        freq_scale = f32(1.0)
    ext_factor = f32(1.0) if scaling == "yarn" else f32(0.0)
    attn_factor = f32(1.0)  # hparams.yarn_attn_factor
    if ext_factor != 0:
        fac = f32(1.0) / freq_scale

        def get_mscale(scale: np.float32, mscale: np.float32) -> np.float32:
            return f32(1.0) if scale <= 1 else f32(f32(0.1) * mscale * f32(np.log(scale)) + f32(1.0))

        if log_mul != 0:
            mscale = log_mul if (arch == "deepseek2" and log_mul != 1) else f32(1.0)
            attn_factor = f32(get_mscale(fac, mscale) / get_mscale(fac, log_mul))
        else:
            attn_factor = get_mscale(fac, f32(1.0))
        attn_factor = f32(attn_factor * (f32(1.0) / (f32(1.0) + f32(0.1) * f32(np.log(fac)))))
    attn_factor = f32(attn_factor * rope_attn_factor)

    # llama_model::get_rope_factors: rope_freqs, else long/short by n_ctx_seq (= n_ctx_train)
    extra = conv["extra"]
    factors = extra.get("rope_freqs.weight")
    if factors is None and "rope_factors_long.weight" in extra:
        key = "long" if n_ctx_train > n_ctx_orig_yarn else "short"
        factors = extra[f"rope_factors_{key}.weight"]
    sections = get("rope.dimension_sections")
    # models/deepseek2.cpp: kq_scale = mscale**2 / sqrt(n_embd_head_k_mla)
    softmax_scale = 1.0
    if arch == "deepseek2":
        org = f32(attn_factor * (f32(1.0) + f32(0.1) * f32(np.log(f32(1.0) / freq_scale))))
        ms = f32(org * (f32(1.0) + f32(0.1) * log_mul * f32(np.log(f32(1.0) / freq_scale))))
        softmax_scale = float(f32(ms * ms))
    return {
        "n_rot": n_rot,
        "mode": _rope_type(arch),
        "n_ctx_orig": n_ctx_orig_yarn,
        "freq_base": float(freq_base),
        "freq_scale": float(freq_scale),
        "ext_factor": float(ext_factor),
        "attn_factor": float(attn_factor),
        "beta_fast": float(beta_fast),
        "beta_slow": float(beta_slow),
        "factors": None if factors is None else np.ascontiguousarray(factors, dtype=np.float32),
        "sections": None if sections is None else [int(s) for s in sections],
        "softmax_scale": softmax_scale,
        "temperature": (temp_scale, n_ctx_orig_yarn) if temp_scale else None,
    }


# -- 6: ggml --------------------------------------------------------------------------------------
class _Rope:
    """ggml's RoPE with the arguments llama.cpp's graph passes, on (tokens, heads, width) data."""

    angles = "float32_recurrence"
    max_position = None

    def __init__(self, rt: Mapping[str, Any], perm: tuple[np.ndarray, np.ndarray], dtype: str) -> None:
        self.rt, self.perm, self.dtype = rt, perm, dtype
        self.softmax_scale = rt["softmax_scale"]

    def _ggml(self, x: np.ndarray, pos: np.ndarray) -> np.ndarray:
        e = _engine()
        base, rt = e["base"], self.rt
        n, h, d = x.shape
        npdt = np.float32 if self.dtype == "float32" else np.float16
        data = np.ascontiguousarray(x, dtype=npdt)
        rows = pos if pos.ndim == 2 else pos[None]
        if rt["sections"] is not None:  # 4 rows: t, h, w and the vision encoder's extra row (0)
            rows = np.concatenate([np.broadcast_to(rows, (3, n)), np.zeros((1, n), np.int64)])
        p = np.ascontiguousarray(rows.reshape(-1), dtype=np.int32)
        size = 2 * data.nbytes + p.nbytes + 4 * d + (4 << 20)
        ctx = base.ggml_init(e["InitParams"](size, None, False))
        if not ctx:
            raise MemoryError("ggml_init failed")
        try:
            a = base.ggml_new_tensor_3d(ctx, _GGML_TYPE[self.dtype], d, h, n)
            ctypes.memmove(base.ggml_get_data(a), data.ctypes.data, data.nbytes)
            b = base.ggml_new_tensor_1d(ctx, _GGML_TYPE_I32, p.size)
            ctypes.memmove(base.ggml_get_data(b), p.ctypes.data, p.nbytes)
            c = None
            if rt["factors"] is not None:
                c = base.ggml_new_tensor_1d(ctx, _GGML_TYPE["float32"], rt["factors"].size)
                ctypes.memmove(base.ggml_get_data(c), rt["factors"].ctypes.data, rt["factors"].nbytes)
            args = (rt["freq_base"], rt["freq_scale"], rt["ext_factor"], rt["attn_factor"])
            args += (rt["beta_fast"], rt["beta_slow"])
            if rt["sections"] is not None:
                sec = (ctypes.c_int * 4)(*rt["sections"])
                out = base.ggml_rope_multi(
                    ctx, a, b, c, rt["n_rot"], sec, rt["mode"], rt["n_ctx_orig"], *args
                )
            else:
                out = base.ggml_rope_ext(ctx, a, b, c, rt["n_rot"], rt["mode"], rt["n_ctx_orig"], *args)
            graph = base.ggml_new_graph(ctx)
            base.ggml_build_forward_expand(graph, out)
            status = e["cpu"].ggml_graph_compute_with_ctx(ctx, graph, 1)
            if status != 0:
                raise RuntimeError(f"ggml_graph_compute_with_ctx returned {status}")
            res = np.empty_like(data)
            ctypes.memmove(res.ctypes.data, base.ggml_get_data(out), res.nbytes)
        finally:
            base.ggml_free(ctx)
        return res.astype(np.float32)

    def rotate(self, q: np.ndarray, k: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        pos = np.asarray(positions, dtype=np.int64)
        if pos.ndim == 2 and self.rt["sections"] is None:
            raise Unsupported("M-RoPE positions for a model llama.cpp runs with a 1-D RoPE")
        out = []
        for x, perm in zip((q, k), self.perm, strict=True):
            x = np.asarray(x, dtype=np.float32)
            d = x.shape[-1]
            full = np.concatenate([perm, np.arange(len(perm), d)]) if len(perm) < d else perm
            y = self._ggml(x[..., full], pos)
            back = np.empty_like(y)
            back[..., full] = y
            out.append(back)
        return out[0], out[1]

    def query_scale(self, positions: np.ndarray) -> np.ndarray | None:
        temp = self.rt["temperature"]
        if temp is None:
            return None
        pos = np.asarray(positions, dtype=np.int64)
        pos = pos[0] if pos.ndim == 2 else pos
        scale, floor = temp  # llm_graph_input_attn_temp::set_input, in float32 as there
        p = pos.astype(np.float32)
        return (np.log(np.floor(p / np.float32(floor)) + 1.0) * np.float32(scale) + 1.0).astype(np.float32)


def build(config: Mapping[str, Any], *, layer_type: str | None, dtype: str) -> _Rope:
    """ggml's RoPE for ``config`` as llama.cpp runs it (see the module docstring)."""
    _engine()
    if dtype not in _GGML_TYPE:
        raise Unsupported(f"ggml's CPU RoPE takes F32 and F16 tensors only, not {dtype}")
    conv = _convert(config)
    rt = _runtime(conv, layer_type)
    return _Rope(rt, conv["perm"], dtype)
