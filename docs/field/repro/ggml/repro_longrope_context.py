"""llama.cpp (llama-cpp-python 0.3.36): LongRoPE's short or long factors are chosen once per
context, by its size (llama_model::get_rope_factors: long when n_ctx_seq > n_ctx_orig_yarn), not
per sequence as transformers does.  With llama.cpp's default context (n_ctx = 0: the trained one,
131072 for Phi-3 mini 128k) every prompt gets the long factors: a 4096-token prompt is rotated
with angles transformers computes only for sequences longer than 4096 tokens."""

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

LONG = [float(v) for v in np.round(np.geomspace(1.08, 64.8, 48), 6)]
SHORT = [float(v) for v in np.round(np.geomspace(1.0, 2.7, 48), 6)]
config = {  # shaped like Phi-3 mini 128k (48 factors per list, rising like the published ones)
    "architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "hidden_size": 3072,
    "num_attention_heads": 32, "num_key_value_heads": 32, "num_hidden_layers": 32,
    "intermediate_size": 8192, "vocab_size": 32064, "rms_norm_eps": 1e-5,
    "max_position_embeddings": 131072, "original_max_position_embeddings": 4096, "rope_theta": 10000.0,
    "rope_scaling": {"long_factor": LONG, "short_factor": SHORT, "type": "longrope"},
}  # fmt: skip
with tempfile.TemporaryDirectory() as d:
    (Path(d) / "config.json").write_text(json.dumps(config))
    hp = ModelBase.load_hparams(Path(d), False)
    cls = get_model_class(get_model_architecture(hp, ModelType.TEXT))
    m = cls(Path(d), gguf.LlamaFileType.ALL_F32, Path(d) / "m.gguf", dry_run=True)
    m.set_gguf_parameters()
    tensors = {n: t.numpy() for n, t in m.generate_extra_tensors()}
    kv = {k: v.value for sh in m.gguf_writer.kv_data for k, v in sh.items() if "rope" in k or "context" in k}
print("GGUF metadata:", kv)
print("GGUF tensors:", sorted(tensors))
n_ctx_train = kv["phi3.context_length"]  # llama_context_default_params: n_ctx = 0 -> n_ctx_train
n_ctx_orig = kv["phi3.rope.scaling.original_context_length"]
chosen = "long" if n_ctx_train > n_ctx_orig else "short"  # llama_model::get_rope_factors
print(f"n_ctx_seq {n_ctx_train} > n_ctx_orig_yarn {n_ctx_orig}: rope_factors_{chosen} for every prompt")
factors = np.ascontiguousarray(tensors[f"rope_factors_{chosen}.weight"], dtype=np.float32)
attn = kv["phi3.rope.scaling.attn_factor"]  # llama-context.cpp: yarn_attn_factor *= rope_attn_factor

# 2. ggml_rope_ext as models/phi3.cpp calls it
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

D, THETA = 96, kv["phi3.rope.freq_base"]
NEOX = 2  # llama_model_rope_type(LLM_ARCH_PHI3)
pos = np.array([1, 10, 100, 1000, 4095], dtype=np.int32)  # a prompt of 4096 tokens
x = np.random.default_rng(0).standard_normal((len(pos), 1, D)).astype(np.float32)
ctx = g.ggml_init(Params(1 << 24, None, False))
a = g.ggml_new_tensor_3d(ctx, 0, D, 1, len(pos))
ctypes.memmove(g.ggml_get_data(a), x.ctypes.data, x.nbytes)
b = g.ggml_new_tensor_1d(ctx, 26, len(pos))
ctypes.memmove(g.ggml_get_data(b), pos.ctypes.data, pos.nbytes)
c = g.ggml_new_tensor_1d(ctx, 0, D // 2)
ctypes.memmove(g.ggml_get_data(c), factors.ctypes.data, factors.nbytes)
r = g.ggml_rope_ext(ctx, a, b, c, D, NEOX, n_ctx_orig, THETA, 1.0, 0.0, attn, 32.0, 1.0)
gf = g.ggml_new_graph(ctx)
g.ggml_build_forward_expand(gf, r)
cpu.ggml_graph_compute_with_ctx(ctx, gf, 1)
out = np.ctypeslib.as_array(ctypes.cast(g.ggml_get_data(r), ctypes.POINTER(ctypes.c_float)), (len(pos), D))


def longrope_f64(ext):  # transformers' LongRoPE, float64, half layout
    inv = 1.0 / (np.asarray(ext, np.float64) * THETA ** (np.arange(0, D, 2) / D))
    ang = pos.astype(np.float64)[:, None] * inv
    af = np.sqrt(1 + np.log(131072 / 4096) / np.log(4096))
    x1, x2 = x[:, 0, : D // 2].astype(np.float64), x[:, 0, D // 2 :].astype(np.float64)
    return af * np.concatenate([x1 * np.cos(ang) - x2 * np.sin(ang), x2 * np.cos(ang) + x1 * np.sin(ang)], -1)


for label, ext in (("short_factor (transformers, <= 4096 tokens)", SHORT), ("long_factor", LONG)):
    e = np.abs(out - longrope_f64(ext)).max(axis=-1)
    print(f"max|ggml - f64 {label}| at {pos.tolist()}: {np.array2string(e, precision=3)}")
