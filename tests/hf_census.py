"""The census of ``transformers``' RoPE families against ``rotary.hf.from_hf``.

For every model type of the *installed* ``transformers`` whose modeling file has a text
``*RotaryEmbedding`` module: its default config (the text part of a composite one), per layer
type, the module's own cos/sin at positions ``arange(32) * 37`` and, through the modeling file's
own ``apply_rotary_pos_emb``, random q/k rotated by them, against ``from_hf(config,
angles="float32")`` on the same q/k: bit for bit.

Each (model type, layer type) pair gets a status: ``match``, ``wrong`` (a number differs: never
allowed), ``refused`` (``from_hf`` raised), or ``skipped`` with the reason the census cannot
compare it (not a text RoPE, a module it cannot call in the standard way...).  ``python
tests/hf_census.py`` prints the table.
"""

from __future__ import annotations

import importlib
import inspect
import os
import re
import warnings
from typing import Any

N = 32
#: The transformers release the table below was taken from (``.ci/constraints.txt`` pins it).
CHECKED_AGAINST = "5.24.0"

#: Every (model type, layer type) pair that does not match, with why.  ``"not yet supported"``
#: and ``"census gap"`` entries are open work (issue 24); a pair that starts to match must leave
#: the table, and a new pair that does not match must enter it with a reason.
EXPECTED: dict[str, tuple[str, str]] = {
    "axk1/-": ("refused", "not yet supported: MLA (qk_rope_head_dim) outside DeepSeek-V2/V3"),
    "axk2/-": ("refused", "not yet supported: MLA (qk_rope_head_dim) outside DeepSeek-V2/V3"),
    "bailing_hybrid/-": ("refused", "not yet supported: MLA (qk_rope_head_dim) outside DeepSeek-V2/V3"),
    "beam/full_attention": ("skipped", "census gap: the module does not take (x, position_ids) (KeyError)"),
    "blt/-": ("skipped", "census gap: the module does not take (x, position_ids) (AttributeError)"),
    "codegen/-": ("refused", "not yet supported: a model-level rotary_dim outside GPT-J"),
    "cohere_compass/full_attention": (
        "skipped",
        "census gap: the module does not take (x, position_ids) (KeyError)",
    ),
    "dbrx/-": ("refused", "not yet supported: the head size is read under another name or rule"),
    "deepseek_v2/-": (
        "skipped",
        "census gap: the module returns complex frequencies (its attention applies them itself)",
    ),
    "deepseek_v32/-": ("refused", "not yet supported: MLA (qk_rope_head_dim) outside DeepSeek-V2/V3"),
    "deepseek_v4/compressed_sparse_attention": (
        "skipped",
        "census gap: the module does not take (x, position_ids) (KeyError)",
    ),
    "deepseek_v4/heavily_compressed_attention": (
        "skipped",
        "census gap: the module does not take (x, position_ids) (KeyError)",
    ),
    "dots3_note/indexed_attention": (
        "refused",
        "not yet supported: MLA (qk_rope_head_dim) outside DeepSeek-V2/V3",
    ),
    "dots3_note/sliding_attention": (
        "refused",
        "not yet supported: MLA (qk_rope_head_dim) outside DeepSeek-V2/V3",
    ),
    "edgetam_video/-": ("skipped", "not a text RoPE (vision/audio modules only)"),
    "efficientloftr/-": ("skipped", "census gap: the module does not take (x, position_ids) (TypeError)"),
    "eomt_dinov3/-": ("skipped", "census gap: the module does not take (x, position_ids) (TypeError)"),
    "ernie4_5_vl_moe/-": (
        "refused",
        "not yet supported: multimodal RoPE beyond Qwen-VL (refused, never read as a plain RoPE)",
    ),
    "esm/-": ("refused", "the default config uses absolute positions (position_embedding_type='absolute')"),
    "esmfold2/-": ("skipped", "census gap: EsmFold2RotaryEmbedding takes no config"),
    "exaone4_5/-": ("skipped", "not a text RoPE (vision/audio modules only)"),
    "glm4_moe/-": ("refused", "not yet supported: the head size is read under another name or rule"),
    "glm4_moe_lite/-": ("refused", "not yet supported: MLA (qk_rope_head_dim) outside DeepSeek-V2/V3"),
    "glm4v/-": ("skipped", "census gap: the module does not take (x, position_ids) (RuntimeError)"),
    "glm4v_moe/-": ("skipped", "census gap: the module does not take (x, position_ids) (RuntimeError)"),
    "glm5_next/-": ("skipped", "not a text RoPE (vision/audio modules only)"),
    "glm_image/-": ("skipped", "not a text RoPE (vision/audio modules only)"),
    "glm_moe_dsa/-": ("refused", "not yet supported: MLA (qk_rope_head_dim) outside DeepSeek-V2/V3"),
    "glm_ocr/-": (
        "refused",
        "not yet supported: multimodal RoPE beyond Qwen-VL (refused, never read as a plain RoPE)",
    ),
    "gptj/-": ("skipped", "census gap: no standard apply_rotary_pos_emb(q, k, cos, sin) to compare through"),
    "granite4_vision/-": ("skipped", "not a text RoPE (vision/audio modules only)"),
    "higgs_audio_v2/-": ("skipped", "not a text RoPE (vision/audio modules only)"),
    "hunyuan_vl/-": ("skipped", "census gap: the module does not take (x, position_ids) (TypeError)"),
    "hy_v4/-": ("refused", "not yet supported: MLA (qk_rope_head_dim) outside DeepSeek-V2/V3"),
    "hy_v4_vl/-": ("refused", "not yet supported: MLA (qk_rope_head_dim) outside DeepSeek-V2/V3"),
    "inkling2/-": ("skipped", "not a text RoPE (vision/audio modules only)"),
    "jetmoe/-": ("refused", "not yet supported: kv_channels as the head size outside ChatGLM"),
    "kimi_k25/-": ("skipped", "not a text RoPE (vision/audio modules only)"),
    "kyutai_speech_to_text/-": ("skipped", "not a text RoPE (vision/audio modules only)"),
    "lasr/-": ("skipped", "not a text RoPE (vision/audio modules only)"),
    "lfm3/conv": ("skipped", "census gap: the module does not take (x, position_ids) (KeyError)"),
    "lfm3_vl/-": ("skipped", "not a text RoPE (vision/audio modules only)"),
    "llama4/-": (
        "skipped",
        "census gap: the module returns complex frequencies (its attention applies them itself)",
    ),
    "longcat_flash/-": ("refused", "not yet supported: MLA (qk_rope_head_dim) outside DeepSeek-V2/V3"),
    "minicpm3/-": ("refused", "not yet supported: MLA (qk_rope_head_dim) outside DeepSeek-V2/V3"),
    "minimax_m3_vl/-": ("refused", "not yet supported: a model-level rotary_dim outside GPT-J"),
    "ministral3/-": (
        "refused",
        "not yet supported: llama_4_scaling_beta (Ministral 3's attention temperature)",
    ),
    "mistral4/-": ("refused", "not yet supported: MLA (qk_rope_head_dim) outside DeepSeek-V2/V3"),
    "mistral_large4/-": ("refused", "not yet supported: MLA (qk_rope_head_dim) outside DeepSeek-V2/V3"),
    "mlcd/-": ("refused", "not yet supported: rope_type 'axial' (MLCD) through from_hf"),
    "moonshine/-": ("refused", "not yet supported: the head size is read under another name or rule"),
    "musicflamingo/-": ("skipped", "census gap: the module does not take (x, position_ids) (AttributeError)"),
    "nemotron3_5_transcribe/-": (
        "refused",
        "not yet supported: partial rotary of this audio model's attention",
    ),
    "nemotron3_diarization/-": (
        "skipped",
        "census gap: the module does not take (x, position_ids) (AttributeError)",
    ),
    "pe_audio/-": ("skipped", "not a text RoPE (vision/audio modules only)"),
    "pe_audio_video/-": ("skipped", "not a text RoPE (vision/audio modules only)"),
    "pe_video/-": ("skipped", "not a text RoPE (vision/audio modules only)"),
    "pixtral/-": ("skipped", "not a text RoPE (vision/audio modules only)"),
    "pocket_tts_audio_tokenizer/-": ("skipped", "not a text RoPE (vision/audio modules only)"),
    "qwen3_omni_moe/-": (
        "refused",
        "not yet supported: multimodal RoPE beyond Qwen-VL (refused, never read as a plain RoPE)",
    ),
    "sam2_video/-": ("skipped", "not a text RoPE (vision/audio modules only)"),
    "sam3/-": ("refused", "not yet supported: rope_type 'axial' (MLCD) through from_hf"),
    "sam3_tracker_video/-": ("skipped", "not a text RoPE (vision/audio modules only)"),
    "video_llama_3/-": ("skipped", "not a text RoPE (vision/audio modules only)"),
    "youtu/-": ("refused", "not yet supported: MLA (qk_rope_head_dim) outside DeepSeek-V2/V3"),
    "zamba2/-": ("refused", "not yet supported: kv_channels as the head size outside ChatGLM"),
}

VISION = re.compile(r"Vision|Audio|Speech|Image|Video|Encoder|Visual|Patch|Depth")


def _text_config(cfg: Any) -> Any:
    get = getattr(cfg, "get_text_config", None)
    if get is None:
        return cfg
    try:
        return get(decoder=True)
    except TypeError:
        return get()


def _families() -> list[tuple[str, Any, str]]:
    """``(model type folder, modeling module, text RotaryEmbedding class name)``."""
    import transformers.models as models

    root = os.path.dirname(models.__file__)
    out = []
    for name in sorted(os.listdir(root)):
        path = os.path.join(root, name, f"modeling_{name}.py")
        if not os.path.exists(path):
            continue
        classes = re.findall(r"^class (\w*RotaryEmbedding)\(", open(path).read(), re.M)
        if not classes:
            continue
        text = [c for c in classes if not VISION.search(c)]
        out.append((name, f"transformers.models.{name}.modeling_{name}", text[0] if text else ""))
    return out


def _config_class(mod: Any, cls: Any) -> Any:
    ann = inspect.signature(cls.__init__).parameters.get("config")
    if ann is None or ann.annotation is inspect.Parameter.empty:
        return None
    a = ann.annotation
    return getattr(mod, a.split("|")[0].strip(), None) if isinstance(a, str) else a


def _apply(mod: Any, cfg: Any, q: Any, k: Any, cos: Any, sin: Any) -> tuple[Any, Any] | None:
    """q and k rotated as the modeling file's attention rotates them: its apply_rotary_pos_emb
    (the ``_interleave`` one where the config asks for it, as DeepSeek-V3's attention does), on
    the first ``cos.shape[-1]`` features where the attention splits them off first (Phi,
    StableLM, Persimmon)."""
    import torch

    fn = getattr(mod, "apply_rotary_pos_emb", None)
    inter = getattr(mod, "apply_rotary_pos_emb_interleave", None)
    if inter is not None and getattr(cfg, "rope_interleave", False):
        fn = inter
    if fn is None:
        return None
    params = list(inspect.signature(fn).parameters)
    if params[:3] == ["x", "cos", "sin"]:  # one tensor at a time (Gemma 3n, Gemma 4)
        return fn(q, cos, sin), fn(k, cos, sin)
    if params[:4] != ["q", "k", "cos", "sin"]:
        return None
    try:
        return fn(q, k, cos, sin)
    except RuntimeError:
        r = cos.shape[-1]
        if r >= q.shape[-1]:
            raise
        qr, kr = fn(q[..., :r], k[..., :r], cos, sin)
        return torch.cat([qr, q[..., r:]], dim=-1), torch.cat([kr, k[..., r:]], dim=-1)


def _deinterleaves(mod: Any, cfg: Any) -> bool:
    """DeepSeek-V3's attention (``rope_interleave``) reads interleaved pairs and writes them in
    the half layout (both q and k: the scores are the interleaved rotation's)."""
    return getattr(mod, "apply_rotary_pos_emb_interleave", None) is not None and bool(
        getattr(cfg, "rope_interleave", False)
    )


def census() -> dict[str, tuple[str, str]]:
    """``{"model_type/layer_type": (status, detail)}``."""
    import numpy as np
    import torch

    import rotary

    out: dict[str, tuple[str, str]] = {}
    pos = torch.arange(N)[None] * 37
    gen = torch.Generator().manual_seed(0)
    for name, modname, clsname in _families():
        if not clsname:
            out[f"{name}/-"] = ("skipped", "not a text RoPE (vision/audio modules only)")
            continue
        try:
            mod = importlib.import_module(modname)
        except Exception as e:  # pragma: no cover - an optional dependency of the model
            out[f"{name}/-"] = ("skipped", f"modeling file does not import here ({type(e).__name__})")
            continue
        cls = getattr(mod, clsname)
        cfg_cls = _config_class(mod, cls)
        if cfg_cls is None:
            out[f"{name}/-"] = ("skipped", f"{clsname} takes no config")
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                cfg = _text_config(cfg_cls())
            except Exception as e:
                out[f"{name}/-"] = ("skipped", f"default config cannot be built ({type(e).__name__})")
                continue
            types = sorted({t for t in (getattr(cfg, "layer_types", None) or [None]) if t is not None}) or [
                None
            ]
            if "layer_type" not in inspect.signature(cls.forward).parameters:
                types = [None]  # one RoPE for every layer that has attention
            for lt in types:
                key = f"{name}/{lt or '-'}"
                try:
                    emb = cls(cfg)
                    kw = {}
                    if lt is not None and "layer_type" in inspect.signature(emb.forward).parameters:
                        kw["layer_type"] = lt
                    res = emb(torch.zeros(1, N, 8), pos, **kw)
                except Exception as e:
                    out[key] = ("skipped", f"the module does not take (x, position_ids) ({type(e).__name__})")
                    continue
                if not (isinstance(res, tuple) and len(res) == 2):
                    out[key] = ("skipped", "the module returns complex frequencies, not (cos, sin)")
                    continue
                cos, sin = res
                try:
                    rope = rotary.hf.from_hf(cfg, angles="float32", layer_type=lt)
                except Exception as e:
                    out[key] = ("refused", f"{type(e).__name__}: {str(e)[:140]}")
                    continue
                d = rope.head_dim
                q = torch.randn(1, 2, N, d, generator=gen)
                k = torch.randn(1, 2, N, d, generator=gen)
                try:
                    want = _apply(mod, cfg, q, k, cos, sin)
                except Exception as e:
                    out[key] = ("wrong", f"apply_rotary_pos_emb fails on rotary's head_dim {d}: {e}")
                    continue
                if want is None:
                    out[key] = (
                        "skipped",
                        "no standard apply_rotary_pos_emb(q, k, cos, sin) to compare through",
                    )
                    continue
                got = rope.apply(q, k, pos[0])
                if _deinterleaves(mod, cfg):
                    got = tuple(rotary.convert_layout(x, "interleaved", "half") for x in got)
                diff = max(float((a - b).abs().max()) for a, b in zip(got, want, strict=True))
                same = all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
                out[key] = ("match", "") if same else ("wrong", f"max |difference| {diff:.3g}")
    del np
    return out


def table(result: dict[str, tuple[str, str]]) -> str:
    import transformers

    lines = [f"census against transformers {transformers.__version__}"]
    for key in sorted(result):
        status, detail = result[key]
        lines.append(f"{key:<48} {status:<8} {detail}")
    return "\n".join(lines)


def rst(result: dict[str, tuple[str, str]]) -> str:
    """The census as the docs page ``docs/guides/hf_census.rst``."""
    from collections import Counter

    counts = Counter(s for s, _ in result.values())
    out = [
        "The Hugging Face census",
        "=======================",
        "",
        ".. This page is generated: python tests/hf_census.py --rst docs/guides/hf_census.rst",
        "",
        f"Every model type of ``transformers`` {CHECKED_AGAINST} with a ``*RotaryEmbedding`` module,",
        "per layer type: its default config (the text part of a composite one) read by",
        '``rotary.hf.from_hf(config, angles="float32")``, and q/k rotated by it compared, bit for',
        "bit, with the modeling file's own cos/sin and ``apply_rotary_pos_emb`` (``tests/hf_census.py``,",
        "run by ``tests/test_hf_census.py``).",
        "",
        f"{counts['match']} pairs match bit for bit, {counts.get('wrong', 0)} differ, "
        f"{counts['refused']} are refused with a clear error, {counts['skipped']} are not compared "
        "(the reasons below).",
        "",
        ".. list-table::",
        "   :header-rows: 1",
        "   :widths: 40 12 48",
        "",
        "   * - model type / layer type",
        "     - status",
        "     - why",
    ]
    for key in sorted(result):
        status, _ = result[key]
        why = EXPECTED.get(key, ("", ""))[1] if status != "match" else ""
        out += [f"   * - ``{key}``", f"     - {status}", f"     - {why}"]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    import sys

    r = census()
    if len(sys.argv) > 2 and sys.argv[1] == "--rst":
        with open(sys.argv[2], "w") as f:
            f.write(rst(r))
    else:
        print(table(r))
        from collections import Counter

        print(Counter(s for s, _ in r.values()))
