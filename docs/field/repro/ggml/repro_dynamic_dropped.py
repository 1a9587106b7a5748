"""llama.cpp (llama-cpp-python 0.3.36): convert_hf_to_gguf.py writes no RoPE scaling for
rope_scaling {type: dynamic} (TextModel.set_gguf_parameters: `elif rope_type == "dynamic": pass`,
"HunYuan, handled in model class"), and llama.cpp has no dynamic-NTK scaling type, so a Llama
checkpoint with dynamic NTK runs as plain RoPE: past max_position_embeddings (a context set larger
than the trained one, -c 8192) its angles are not the ones transformers computes."""

import ctypes
import json
import logging
import os
import sys
import tempfile
from pathlib import Path

import llama_cpp
import numpy as np

# 1. llama.cpp's converter on the config (its source is the unpacked llama-cpp-python sdist)
SRC = Path(os.environ.get("LLAMA_CPP_SRC", Path(sys.prefix).parent / "llama_cpp_python-0.3.36/vendor/llama.cpp"))
sys.path[:0] = [str(SRC / "gguf-py"), str(SRC)]
logging.disable(logging.WARNING)
import gguf  # noqa: E402
from conversion import ModelBase, ModelType, get_model_architecture, get_model_class  # noqa: E402

config = {  # Llama 2 7B with the rope_scaling transformers documents for dynamic NTK
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
    "num_attention_heads": 32, "num_key_value_heads": 32, "num_hidden_layers": 32,
    "intermediate_size": 11008, "vocab_size": 32000, "rms_norm_eps": 1e-5,
    "max_position_embeddings": 4096, "rope_theta": 10000.0,
    "rope_scaling": {"type": "dynamic", "factor": 2.0},
}  # fmt: skip
with tempfile.TemporaryDirectory() as d:
    (Path(d) / "config.json").write_text(json.dumps(config))
    hp = ModelBase.load_hparams(Path(d), False)
    cls = get_model_class(get_model_architecture(hp, ModelType.TEXT))
    m = cls(Path(d), gguf.LlamaFileType.ALL_F32, Path(d) / "m.gguf", dry_run=True)
    m.set_gguf_parameters()
    kv = {k: v.value for sh in m.gguf_writer.kv_data for k, v in sh.items() if ".rope." in k}
print("GGUF rope metadata:", kv)

# 2. ggml_rope_ext as models/llama.cpp calls it with that metadata (no scaling: freq_scale 1)
lib = Path(llama_cpp.__file__).parent / "lib"
g = ctypes.CDLL(str(lib / "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
cpu = ctypes.CDLL(str(lib / "libggml-cpu.so"), mode=ctypes.RTLD_GLOBAL)
vp, f = ctypes.c_void_p, ctypes.c_float


class Params(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", vp), ("no_alloc", ctypes.c_bool)]


g.ggml_init.argtypes, g.ggml_init.restype = [Params], vp
g.ggml_new_tensor_1d.argtypes, g.ggml_new_tensor_1d.restype = [vp, ctypes.c_int, ctypes.c_int64], vp
g.ggml_new_tensor_3d.argtypes = [vp, ctypes.c_int] + [ctypes.c_int64] * 3
g.ggml_new_tensor_3d.restype = vp
g.ggml_get_data.argtypes, g.ggml_get_data.restype = [vp], vp
g.ggml_rope_ext.argtypes = [vp, vp, vp, vp] + [ctypes.c_int] * 3 + [f] * 6
g.ggml_rope_ext.restype = vp
g.ggml_new_graph.argtypes, g.ggml_new_graph.restype = [vp], vp
g.ggml_build_forward_expand.argtypes = [vp, vp]
cpu.ggml_graph_compute_with_ctx.argtypes = [vp, vp, ctypes.c_int]

D, THETA, N = 128, kv["llama.rope.freq_base"], 8192  # one prefill of 8192 tokens
NORM = 0  # llama_model_rope_type(LLM_ARCH_LLAMA): adjacent pairs (the converter permutes q/k)
pos = np.arange(N, dtype=np.int32)
x = np.random.default_rng(0).standard_normal((N, 1, D)).astype(np.float32)
ctx = g.ggml_init(Params(1 << 26, None, False))
a = g.ggml_new_tensor_3d(ctx, 0, D, 1, N)
ctypes.memmove(g.ggml_get_data(a), x.ctypes.data, x.nbytes)
b = g.ggml_new_tensor_1d(ctx, 26, N)
ctypes.memmove(g.ggml_get_data(b), pos.ctypes.data, pos.nbytes)
r = g.ggml_rope_ext(ctx, a, b, None, D, NORM, 4096, THETA, 1.0, 0.0, 1.0, 32.0, 1.0)
gf = g.ggml_new_graph(ctx)
g.ggml_build_forward_expand(gf, r)
cpu.ggml_graph_compute_with_ctx(ctx, gf, 1)
out = np.ctypeslib.as_array(ctypes.cast(g.ggml_get_data(r), ctypes.POINTER(ctypes.c_float)), (N, D))


def rope_f64(base):  # adjacent pairs (2i, 2i+1), float64
    ang = pos.astype(np.float64)[:, None] * base ** (-np.arange(0, D, 2) / D)
    x1, x2 = x[:, 0, 0::2].astype(np.float64), x[:, 0, 1::2].astype(np.float64)
    y = np.empty((N, D))
    y[:, 0::2], y[:, 1::2] = x1 * np.cos(ang) - x2 * np.sin(ang), x2 * np.cos(ang) + x1 * np.sin(ang)
    return y


# transformers' dynamic NTK for a sequence of N > max_position_embeddings tokens
dyn = THETA * ((2.0 * N / 4096) - (2.0 - 1)) ** (D / (D - 2))
at = [1, 100, 4095, 4096, 8191]
for label, base in (("plain RoPE, base 10000", THETA), (f"dynamic NTK, base {dyn:.1f}", dyn)):
    e = np.abs(out - rope_f64(base)).max(axis=-1)[at]
    print(f"max|ggml - f64 {label}| at {at}: {np.array2string(e, precision=3)}")
