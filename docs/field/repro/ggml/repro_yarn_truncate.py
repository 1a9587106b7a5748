"""llama.cpp (ggml 0.25.3 in llama-cpp-python 0.3.36): ggml_rope_yarn_corr_dims always floors and
ceils the YaRN correction range, and convert_hf_to_gguf.py writes no `truncate`, so gpt-oss
(rope_scaling.truncate = false) gets the truncated ramp: the frequencies in the ramp band differ
from Hugging Face's (and OpenAI's) at every position > 0."""

import ctypes
import math
from pathlib import Path

import llama_cpp
import numpy as np

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

# gpt-oss-20b config.json: head_dim 64, rope_theta 150000, yarn factor 32, original 4096, truncate false
D, THETA, FACTOR, L0 = 64, 150000.0, 32.0, 4096
NEOX = 2  # llama_model_rope_type(LLM_ARCH_OPENAI_MOE)
# llama-context.cpp: ext_factor 1 for YaRN; attn_factor = get_mscale(32) / (1 + 0.1 ln 32) = 1
pos = np.array([1, 100, 1000, 4096, 32768, 131071], dtype=np.int32)
x = np.random.default_rng(0).standard_normal((len(pos), 1, D)).astype(np.float32)

ctx = g.ggml_init(Params(1 << 24, None, False))
a = g.ggml_new_tensor_3d(ctx, 0, D, 1, len(pos))  # GGML_TYPE_F32, [head_dim, heads, tokens]
ctypes.memmove(g.ggml_get_data(a), x.ctypes.data, x.nbytes)
b = g.ggml_new_tensor_1d(ctx, 26, len(pos))  # GGML_TYPE_I32 positions
ctypes.memmove(g.ggml_get_data(b), pos.ctypes.data, pos.nbytes)
r = g.ggml_rope_ext(ctx, a, b, None, D, NEOX, L0, THETA, 1 / FACTOR, 1.0, 1.0, 32.0, 1.0)
gf = g.ggml_new_graph(ctx)
g.ggml_build_forward_expand(gf, r)
cpu.ggml_graph_compute_with_ctx(ctx, gf, 1)
out = np.ctypeslib.as_array(ctypes.cast(g.ggml_get_data(r), ctypes.POINTER(ctypes.c_float)), (len(pos), D))


def yarn_f64(p, truncate):  # Hugging Face's YaRN, float64, half layout
    i = np.arange(D // 2)
    inv = THETA ** (-2.0 * i / D)
    cd = lambda r: D * math.log(L0 / (2 * math.pi * r)) / (2 * math.log(THETA))  # noqa: E731
    lo, hi = cd(32.0), cd(1.0)
    if truncate:
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, D - 1)
    ramp = np.clip((i - lo) / (hi - lo), 0, 1)
    inv = inv / FACTOR * ramp + inv * (1 - ramp)
    ang = np.asarray(p, np.float64)[:, None] * inv
    return np.cos(ang), np.sin(ang), 0.1 * math.log(FACTOR) + 1


x1, x2 = x[:, 0, : D // 2].astype(np.float64), x[:, 0, D // 2 :].astype(np.float64)
for trunc in (False, True):
    c, s, af = yarn_f64(pos, trunc)
    ref = af * np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)
    e = np.abs(out - ref).max(axis=-1)
    print(f"max|ggml - f64 YaRN(truncate={trunc})| at {pos.tolist()}: {np.array2string(e, precision=3)}")
