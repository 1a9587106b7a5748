"""The census of ``transformers``' RoPE families against ``rotary.hf.from_hf``.

For every model type of the *installed* ``transformers`` whose modeling file has a text
``*RotaryEmbedding`` module: its default config (the text part of a composite one), per layer
type, the module's own cos/sin at positions ``arange(32) * 37`` and, through the modeling file's
own ``apply_rotary_pos_emb``, random q/k rotated by them, against ``from_hf(config,
angles="float32")`` on the same q/k: bit for bit.

Each (model type, layer type) pair gets a status: ``match``, ``close`` (complex-frequency
modules: within ``torch.polar``'s rounding of cos/sin), ``no rope`` (a layer type both say has
no RoPE), ``wrong`` (a number differs: never allowed), ``refused`` (``from_hf`` raised),
or ``skipped`` with the reason the census cannot compare it (not a text RoPE, a module it cannot
call in the standard way...).  ``partial_probe`` runs every matching model type again with its
``partial_rotary_factor`` halved: the table of attentions that read it must be complete.  ``python
tests/hf_census.py`` prints the table.
"""

from __future__ import annotations

import importlib
import inspect
import os
import re
import warnings
from collections.abc import Iterator
from typing import Any

N = 32
#: The transformers release the table below was taken from (``.ci/constraints.txt`` pins it).
CHECKED_AGAINST = "5.24.0"

#: Config values the census gives where a default config is not one a checkpoint can have, with
#: why: GLM-4-MoE's defaults (hidden_size 4096, 96 heads, no head_dim) make a 42.67-wide head
#: (GLM-4.5's published config.json has head_dim 128); ESM's default has no RoPE.
OVERRIDES: dict[str, dict[str, Any]] = {
    "glm4_moe": {"head_dim": 128},
    # Zamba2's default leaves its attention without position embedding (use_mem_rope false);
    # Zyphra's Zamba2-1.2B sets it
    "zamba2": {"use_mem_rope": True},
    # ESM's default is absolute positions; ESM-2 checkpoints set position_embedding_type="rotary"
    "esm": {"position_embedding_type": "rotary"},
    # GLM-4V's default text config rotates the whole 128-wide head, but its mrope_section [8, 12, 12]
    # covers 32 pairs (the module fails); GLM-4.1V's published config has partial_rotary_factor 0.5
    "glm4v": {"partial_rotary_factor": 0.5},
    "glm4v_moe": {"head_dim": 128},  # as GLM-4-MoE
    # Qwen3-Omni's text config has no head_dim (2048 / 28 heads is not an integer); the published
    # Qwen3-Omni-30B-A3B thinker has 32 heads of 128
    "qwen3_omni_moe": {"num_attention_heads": 32, "head_dim": 128},
    # HunYuan-VL's default has no mrope_section (the module fails); its checkpoints give one,
    # summing to head_dim // 2 over its four axes (position, width, height, image index)
    "hunyuan_vl": {
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [16] * 4}
    },
    # Cohere Compass's default has no RoPE parameters for its layers (the module fails); published
    # configs rotate the sliding layers (Qwen3-VL-style M-RoPE) and leave the global ones NoPE
    "cohere_compass": {
        "num_hidden_layers": 4,
        "layer_types": ["sliding_attention"] * 3 + ["full_attention"],
        "rope_parameters": {
            "sliding_attention": {
                "rope_type": "default",
                "rope_theta": 50000.0,
                "mrope_section": [24, 20, 20],
            },
            "full_attention": None,
        },
    },
}

#: Model types whose RotaryEmbedding is built from sub-configs (BLT's byte-level encoder and
#: decoder, its global transformer and its patcher): each is compared.
SUBCONFIGS: dict[str, tuple[str, ...]] = {
    "blt": ("encoder_config", "decoder_config", "global_config", "patcher_config"),
}

#: The ``rope_parameters`` key the module is called with per layer type, where a modeling file
#: keys them by RoPE label (DeepseekV4Attention: sliding layers "main", compressed ones "compress").
ROPE_KEYS: dict[str, dict[str, str]] = {
    "deepseek_v4": {
        "sliding_attention": "main",
        "compressed_sparse_attention": "compress",
        "heavily_compressed_attention": "compress",
    }
}

#: Every (model type, layer type) pair that does not match, with why: not a text RoPE, complex
#: frequencies compared within torch.polar's rounding, or a multimodal RoPE that is not a rotation
#: at image positions.  A pair that starts to match must leave the table, and a new pair that does
#: not match must enter it with a reason.
EXPECTED: dict[str, tuple[str, str]] = {
    "deepseek_v2/-": (
        "close",
        "complex frequencies (torch.polar): cos/sin within 1 ulp of torch.cos/sin, q/k within 4 ulps",
    ),
    "edgetam_video/-": ("skipped", "not a text RoPE (vision/audio modules only)"),
    "efficientloftr/-": (
        "skipped",
        "not a text RoPE (EfficientLoFTRRotaryEmbedding takes (x), not position ids)",
    ),
    "eomt_dinov3/-": (
        "skipped",
        "not a text RoPE (EomtDinov3RotaryEmbedding takes (pixel_values), not position ids)",
    ),
    "esmfold2/-": (
        "skipped",
        "not a text RoPE: EsmFold2RotaryEmbedding rotates by atom coordinates (ref_pos x/y/z)",
    ),
    "exaone4_5/-": ("skipped", "not a text RoPE (vision/audio modules only)"),
    "glm5_next/-": ("skipped", "not a text RoPE (vision/audio modules only)"),
    "glm_image/-": ("skipped", "not a text RoPE (vision/audio modules only)"),
    "glmasr/-": ("skipped", "not a text RoPE (built by GlmAsrEncoder for its GlmAsrEncoderConfig)"),
    "granite4_vision/-": ("skipped", "not a text RoPE (vision/audio modules only)"),
    "higgs_audio_v2/-": ("skipped", "not a text RoPE (vision/audio modules only)"),
    "hunyuan_vl/-": (
        "text only",
        "text positions match; at image positions HunYuan-VL's XD-RoPE is not a rotation (the two "
        "features of a pair take different position rows): model_rope and mrope_from_hf refuse it",
    ),
    "inkling2/-": ("skipped", "not a text RoPE (vision/audio modules only)"),
    "kimi_k25/-": ("skipped", "not a text RoPE (vision/audio modules only)"),
    "kyutai_speech_to_text/-": ("skipped", "not a text RoPE (vision/audio modules only)"),
    "lasr/-": ("skipped", "not a text RoPE (vision/audio modules only)"),
    "lfm3_vl/-": ("skipped", "not a text RoPE (vision/audio modules only)"),
    "llama4/-": (
        "close",
        "complex frequencies (torch.polar): cos/sin within 1 ulp of torch.cos/sin, q/k within 4 ulps",
    ),
    "mlcd/-": (
        "skipped",
        "not a text RoPE (MLCDRotaryEmbedding takes a MLCDVisionConfig): rotary.hf.vision_rope reads it",
    ),
    "musicflamingo/-": (
        "skipped",
        "not a text RoPE (MusicFlamingoRotaryEmbedding takes (timestamps, seq_len), not position ids)",
    ),
    "nemotron3_5_transcribe/-": (
        "skipped",
        "not a text RoPE (Nemotron3_5TranscribeRotaryEmbedding takes a Nemotron3_5TranscribeAsrAudioConfig)",
    ),
    "nemotron3_diarization/-": (
        "skipped",
        "not a text RoPE (built by Nemotron3DiarizationAudioModel for its Nemotron3DiarizationAudioConfig)",
    ),
    "pe_audio/-": ("skipped", "not a text RoPE (vision/audio modules only)"),
    "pe_audio_video/-": ("skipped", "not a text RoPE (vision/audio modules only)"),
    "pe_video/-": ("skipped", "not a text RoPE (vision/audio modules only)"),
    "pixtral/-": ("skipped", "not a text RoPE (vision/audio modules only)"),
    "pocket_tts_audio_tokenizer/-": ("skipped", "not a text RoPE (vision/audio modules only)"),
    "sam2_video/-": ("skipped", "not a text RoPE (vision/audio modules only)"),
    "sam3/-": ("skipped", "not a text RoPE (vision/audio modules only)"),
    "sam3_tracker_video/-": ("skipped", "not a text RoPE (vision/audio modules only)"),
    "video_llama_3/-": ("skipped", "not a text RoPE (vision/audio modules only)"),
}

VISION = re.compile(r"Vision|Audio|Speech|Image|Video|Encoder|Visual|Patch|Depth|ViT")


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


def _mla_mode(mod: Any) -> str | None:
    """How the modeling file's multi-head latent attention (the class whose forward splits
    ``compressed_kv`` into the latent and ``qk_rope_head_dim`` parts) rotates ``q_rot``/``k_rot``,
    read from its source: ``"flag"`` (``apply_rotary_pos_emb_interleave`` when
    ``config.rope_interleave``), ``"interleave"`` (always), ``"plain"`` (``apply_rotary_pos_emb``);
    ``None``: no such attention."""
    for obj in vars(mod).values():
        if not (inspect.isclass(obj) and obj.__module__ == mod.__name__ and "forward" in vars(obj)):
            continue
        src = inspect.getsource(obj.forward)
        if "compressed_kv" not in src or "qk_rope_head_dim" not in src:
            continue
        if "rope_interleave" in src:
            return "flag"
        return "interleave" if "apply_rotary_pos_emb_interleave(" in src else "plain"
    return None


def _uses_interleave(mod: Any, cfg: Any) -> bool:
    """Whether the attention calls ``apply_rotary_pos_emb_interleave`` (DeepSeek-V3 style: reads
    interleaved pairs and writes them in the half layout)."""
    if getattr(mod, "apply_rotary_pos_emb_interleave", None) is None:
        return False
    mode = _mla_mode(mod)
    if mode is None:  # no MLA attention: the config flag alone decides, as DeepSeek-V3's does
        return bool(getattr(cfg, "rope_interleave", False))
    return mode == "interleave" or (mode == "flag" and bool(getattr(cfg, "rope_interleave", True)))


def _apply(mod: Any, cfg: Any, q: Any, k: Any, cos: Any, sin: Any) -> tuple[Any, Any] | None:
    """q and k rotated as the modeling file's attention rotates them: its apply_rotary_pos_emb
    (the ``_interleave`` one where the attention calls it, as DeepSeek-V3's does when
    ``rope_interleave``), on the first ``cos.shape[-1]`` features where the attention splits
    them off first (Phi, StableLM, Persimmon)."""
    import torch

    fn = getattr(mod, "apply_rotary_pos_emb", None)
    if _uses_interleave(mod, cfg):
        fn = mod.apply_rotary_pos_emb_interleave
    if fn is None:
        return None
    params = list(inspect.signature(fn).parameters)
    if params[:3] == ["x", "cos", "sin"]:  # one tensor at a time (Gemma 3n, Gemma 4)
        return fn(q, cos, sin), fn(k, cos, sin)
    if params[:3] == ["tensor", "sin", "cos"]:
        # GPT-J, CodeGen: the module returns (sin, cos), one per pair; the attention rotates the
        # first rotary_dim features of (batch, seq, heads, dim) tensors, one tensor at a time
        sin, cos = cos, sin
        r = 2 * sin.shape[-1]

        def one(x: Any) -> Any:
            xt = x.transpose(1, 2)
            return torch.cat([fn(xt[..., :r], sin, cos), xt[..., r:]], dim=-1).transpose(1, 2)

        return one(q), one(k)
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


def _pairs_equal(theirs: Any, ours: Any) -> bool:
    """transformers' cos (or sin) of every feature equals rotary's one per pair: concatenated
    halves (``cat(c, c)``), repeated pairs, or one per pair."""
    import torch

    n = ours.shape[-1]
    w = theirs.shape[-1]
    if w == n:
        return bool(torch.equal(theirs, ours))
    if w != 2 * n:
        return False
    return bool(torch.equal(theirs[..., :n], ours) and torch.equal(theirs[..., n:], ours)) or bool(
        torch.equal(theirs[..., ::2], ours) and torch.equal(theirs[..., 1::2], ours)
    )


def _compare(mod: Any, cls: Any, cfg: Any, lt: str | None, gen: Any) -> tuple[str, str]:
    """One (config, layer type): transformers' module and attention against ``from_hf``."""
    import torch

    import rotary

    pos = torch.arange(N)[None] * 37
    rp = getattr(cfg, "rope_parameters", None)
    key = ROPE_KEYS.get(cfg.model_type, {}).get(lt or "", lt)
    if lt is not None and isinstance(rp, dict) and any(isinstance(x, dict) for x in rp.values()):
        if rp.get(key) is None:  # transformers has no RoPE for these layers: rotary must say so
            try:
                rotary.hf.from_hf(cfg, angles="float32", layer_type=lt)
            except ValueError as e:
                if "no RoPE" in str(e):
                    return "no rope", ""
                return "wrong", f"transformers has no RoPE here, rotary: {e}"
            return "wrong", "transformers has no RoPE here, rotary gives one"
    try:
        emb = cls(cfg)
        kw = {}
        if lt is not None and "layer_type" in inspect.signature(emb.forward).parameters:
            kw["layer_type"] = key
        res = emb(torch.zeros(1, N, 8), pos, **kw)
    except Exception as e:
        return "skipped", f"the module does not take (x, position_ids) ({type(e).__name__})"
    if isinstance(res, torch.Tensor) and res.is_complex():
        return _compare_complex(mod, cfg, lt, res, pos, gen)
    if not (isinstance(res, tuple) and len(res) == 2):
        return "skipped", "the module returns neither (cos, sin) nor complex frequencies"
    cos, sin = res
    try:
        rope = rotary.hf.from_hf(cfg, angles="float32", layer_type=lt)
    except Exception as e:
        return "refused", f"{type(e).__name__}: {str(e)[:140]}"
    d = rope.head_dim
    q = torch.randn(1, 2, N, d, generator=gen)
    k = torch.randn(1, 2, N, d, generator=gen)
    try:
        want = _apply(mod, cfg, q, k, cos, sin)
    except Exception as e:
        return "wrong", f"apply_rotary_pos_emb fails on rotary's head_dim {d}: {e}"
    if want is None:
        return "skipped", "no standard apply_rotary_pos_emb(q, k, cos, sin) to compare through"
    got = rope.apply(q, k, pos[0])
    if _uses_interleave(mod, cfg):
        got = tuple(rotary.convert_layout(x, "interleaved", "half") for x in got)
    diff = max(float((a - b).abs().max()) for a, b in zip(got, want, strict=True))
    if not all(torch.equal(a, b) for a, b in zip(got, want, strict=True)):
        return "wrong", f"max |difference| {diff:.3g}"
    c, s = rope.cos_sin(pos[0], dtype=torch.float32)
    if "tensor" in inspect.signature(_apply_fn(mod, cfg)).parameters:
        cos, sin = sin, cos  # GPT-J / CodeGen return (sin, cos)
    if isinstance(rope.scaling, rotary.scaling.Backwards):
        s = -s  # NanoChat: sin(theta) with a rotate_half of flipped signs is rotary's sin(-theta)
    r = c.shape[-1]
    if not (_pairs_equal(cos[0][..., : cos.shape[-1]], c) and _pairs_equal(sin[0], s)):
        return "wrong", f"q and k match, cos/sin differ (widths {cos.shape[-1]} and {r} pairs)"
    # multimodal: different position rows, as an image's grid gives (three: (t, h, w); two: (h, w))
    sec = (rp or {}).get("mrope_section") if isinstance(rp, dict) else None
    m_rope = False  # a text RoPE that does not take 3-D position ids
    for n_rows in (len(sec),) if isinstance(sec, list) else (3, 2):
        pos3 = torch.stack([pos, pos // 2 + 7, pos % 5 + pos // 3, pos // 11 + 2][:n_rows])
        try:
            res3 = emb(torch.zeros(1, N, 8), pos3, **kw)
        except Exception:
            continue
        m_rope = res3[0].shape == res[0].shape and not torch.equal(res3[0], res[0])
        break
    mrope = _mrope_of(cfg, lt)
    if m_rope and mrope is None:
        try:
            rotary.hf.mrope_from_hf(cfg, angles="float32")
        except ValueError as e:
            if "not a rotation" in str(e):
                return "text only", f"text positions match; at image positions: {e}"
        return "wrong", "text positions match; transformers applies M-RoPE to 3-D position ids, rotary a RoPE"
    if mrope is not None:
        if not m_rope:
            return "wrong", "text positions match; rotary reads an M-RoPE, transformers a RoPE"
        cos, sin = res3
        c, s = mrope.cos_sin(pos3[:, 0], dtype=torch.float32)
        if not (_pairs_equal(cos[0], c) and _pairs_equal(sin[0], s)):
            return "wrong", "text positions match, M-RoPE cos/sin of 3-D position ids differ"
        want = _apply(mod, cfg, q, k, cos, sin)
        got = mrope.apply(q, k, pos3[:, :, None, :])
        if not all(torch.equal(a, b) for a, b in zip(got, want, strict=True)):
            return "wrong", "text positions match, M-RoPE q/k of 3-D position ids differ"
    return "match", ""


def _compare_complex(
    mod: Any, cfg: Any, lt: str | None, freqs_cis: Any, pos: Any, gen: Any
) -> tuple[str, str]:
    """DeepSeek-V2, Llama 4: ``freqs_cis = torch.polar(1, angles)`` and ``apply_rotary_emb`` (a
    complex product over pairs ``(2i, 2i + 1)``).  ``torch.polar`` rounds cos/sin differently
    from ``torch.cos``/``torch.sin`` (at most an ulp), so these compare within that: status
    ``"close"`` when cos/sin are within 1 ulp of 1 and q/k within 4 ulps of their size."""
    import torch

    import rotary

    fn = getattr(mod, "apply_rotary_emb", None)
    if fn is None:
        return "skipped", "complex frequencies without an apply_rotary_emb to compare through"
    try:
        rope = rotary.hf.from_hf(cfg, angles="float32", layer_type=lt)
    except Exception as e:
        return "refused", f"{type(e).__name__}: {str(e)[:140]}"
    eps = float(torch.finfo(torch.float32).eps)
    c, s = rope.cos_sin(pos[0], dtype=torch.float32)
    dc = max(float((freqs_cis.real[0] - c).abs().max()), float((freqs_cis.imag[0] - s).abs().max()))
    q = torch.randn(1, 2, N, rope.head_dim, generator=gen)
    k = torch.randn(1, 2, N, rope.head_dim, generator=gen)
    if "freqs_cis.unsqueeze(1)" in inspect.getsource(fn):  # (batch, heads, seq, dim) tensors
        want = fn(q, k, freqs_cis)
    else:  # (batch, seq, heads, dim)
        want = tuple(x.transpose(1, 2) for x in fn(q.transpose(1, 2), k.transpose(1, 2), freqs_cis))
    got = rope.apply(q, k, pos[0])
    dq = max(float((a - b).abs().max()) for a, b in zip(got, want, strict=True))
    scale = max(float(q.abs().max()), float(k.abs().max()))
    if dc <= eps and dq <= 4 * eps * scale:
        exact = dc == 0 and dq == 0
        return (
            ("match", "")
            if exact
            else ("close", f"cos/sin {dc / eps:.2g} ulp, q/k {dq / eps / scale:.2g} ulp")
        )
    return "wrong", f"cos/sin differ by {dc:.3g}, q/k by {dq:.3g}"


def _mrope_of(cfg: Any, lt: str | None) -> Any:
    """rotary's M-RoPE of the layers of type ``lt`` (``None``: the model's), if they have one."""
    import rotary

    try:
        m = rotary.hf.model_rope(cfg, angles="float32")
    except ValueError:  # another layer type is refused (the partial probe)
        return None
    layers = [r for t, r in zip(m.layer_types or [None] * len(m.layers), m.layers) if lt in (None, t)]
    if not m.layers:
        layers = [rotary.hf.from_hf(cfg, angles="float32", layer_type=lt)]
    first = next((r for r in layers if r is not None), None)
    return first if isinstance(first, rotary.MRoPE) else None


def _apply_fn(mod: Any, cfg: Any) -> Any:
    return mod.apply_rotary_pos_emb_interleave if _uses_interleave(mod, cfg) else mod.apply_rotary_pos_emb


def _layer_types(cls: Any, cfg: Any) -> list[str | None]:
    if "layer_type" not in inspect.signature(cls.forward).parameters:
        return [None]  # one RoPE for every layer that has attention
    return sorted({t for t in (getattr(cfg, "layer_types", None) or []) if t is not None}) or [None]


def _owner(mod: Any, clsname: str) -> str | None:
    """The vision/audio class that builds ``clsname`` when only such classes build it (its
    ``__init__`` takes a vision/audio/encoder config), else ``None``."""
    owners = []
    for obj in vars(mod).values():
        if not (inspect.isclass(obj) and obj.__module__ == mod.__name__ and "__init__" in vars(obj)):
            continue
        try:
            src = inspect.getsource(obj.__init__)
        except (OSError, TypeError):  # a generated __init__ (dataclass configs)
            continue
        if f"{clsname}(" not in src:
            continue
        ann = inspect.signature(obj.__init__).parameters.get("config")
        a = "" if ann is None else str(ann.annotation)
        owners.append((obj.__name__, a))
    if owners and all(VISION.search(a) for _, a in owners):
        return ", ".join(f"{n} for its {a.split('.')[-1].strip(chr(39) + '>')}" for n, a in owners)
    return None


def _modules() -> Iterator[tuple[str, Any, Any, Any] | tuple[str, str]]:
    """Per model type: ``(name, modeling module, RotaryEmbedding class, default text config)``, or
    ``(name, reason)`` where there is none to compare."""
    for name, modname, clsname in _families():
        if not clsname:
            yield name, "not a text RoPE (vision/audio modules only)"
            continue
        try:
            mod = importlib.import_module(modname)
        except Exception as e:  # pragma: no cover - an optional dependency of the model
            yield name, f"modeling file does not import here ({type(e).__name__})"
            continue
        cls = getattr(mod, clsname)
        cfg_cls = _config_class(mod, cls)
        if cfg_cls is None:
            yield name, f"{clsname} takes no config"
            continue
        if "position_ids" not in inspect.signature(cls.forward).parameters:
            args = ", ".join(list(inspect.signature(cls.forward).parameters)[1:])
            yield name, f"not a text RoPE ({clsname} takes ({args}), not position ids)"
            continue
        if VISION.search(cfg_cls.__name__):
            yield name, f"not a text RoPE ({clsname} takes a {cfg_cls.__name__})"
            continue
        owner = _owner(mod, clsname)
        if owner is not None:
            yield name, f"not a text RoPE (built by {owner})"
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                cfg = _text_config(cfg_cls(**OVERRIDES.get(name, {})))
            except Exception as e:
                yield name, f"default config cannot be built ({type(e).__name__})"
                continue
        for sub in SUBCONFIGS.get(name, ()):
            yield f"{name}[{sub}]", mod, cls, getattr(cfg, sub)
        if name not in SUBCONFIGS:
            yield name, mod, cls, cfg


def census() -> dict[str, tuple[str, str]]:
    """``{"model_type/layer_type": (status, detail)}``."""
    import torch

    out: dict[str, tuple[str, str]] = {}
    gen = torch.Generator().manual_seed(0)
    for item in _modules():
        if len(item) == 2:
            out[f"{item[0]}/-"] = ("skipped", item[1])
            continue
        name, mod, cls, cfg = item
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for lt in _layer_types(cls, cfg):
                out[f"{name}/{lt or '-'}"] = _compare(mod, cls, cfg, lt, gen)
    return out


def _honours(mod: Any, cls: Any, cfg: Any, probe: Any, lt: str | None, pos: Any) -> bool:
    """Whether transformers rotates fewer features with ``probe`` than with ``cfg``: its module's
    cos narrows and its attention runs on the narrower cos."""
    import torch

    import rotary

    kw = (
        {"layer_type": lt}
        if lt is not None and "layer_type" in inspect.signature(cls.forward).parameters
        else {}
    )
    d = rotary.hf.from_hf(cfg, angles="float32", layer_type=lt).head_dim
    try:
        before = cls(cfg)(torch.zeros(1, N, 8), pos, **kw)
        cos, sin = cls(probe)(torch.zeros(1, N, 8), pos, **kw)
        if cos.shape[-1] == before[0].shape[-1]:
            return False  # transformers ignores the factor
        q = torch.randn(1, 2, N, d)
        return _apply(mod, probe, q, q, cos, sin) is not None
    except Exception:
        return False  # transformers cannot run it either


def partial_probe() -> dict[str, tuple[str, str]]:
    """Whether rotary knows which attentions read ``partial_rotary_factor`` (a table, since a
    config cannot say it): every matching model type again with its factor halved in every
    ``rope_parameters``.  ``{"model_type/layer_type": (status, detail)}``: ``"match"``;
    ``"refused"`` where transformers ignores the factor (its cos/sin keep their width) or cannot
    run it; ``"gap"`` where transformers honours it and rotary refuses; ``"answers"`` where
    rotary answers and transformers cannot run it; ``"wrong"``."""
    import copy

    import torch

    import rotary

    out: dict[str, tuple[str, str]] = {}
    gen = torch.Generator().manual_seed(1)
    pos = torch.arange(N)[None] * 37
    for item in _modules():
        if len(item) == 2:
            continue
        name, mod, cls, cfg = item
        if getattr(cfg, "qk_rope_head_dim", None) is not None:
            continue  # MLA: the factor is qk_rope_head_dim / head_dim (tests/test_hf.py)
        rp = getattr(cfg, "rope_parameters", None)
        if not isinstance(rp, dict):
            continue
        probe = copy.deepcopy(cfg)
        nested = [val for val in probe.rope_parameters.values() if isinstance(val, dict)]
        for p in nested or [probe.rope_parameters]:
            p["partial_rotary_factor"] = float(p.get("partial_rotary_factor") or 1.0) / 2
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for lt in _layer_types(cls, cfg):
                key = f"{name}/{lt or '-'}"
                try:
                    rotary.hf.from_hf(cfg, angles="float32", layer_type=lt)
                except Exception:
                    continue  # not supported as published: the census says why
                status, detail = _compare(mod, cls, probe, lt, gen)
                if status == "refused" and _honours(mod, cls, cfg, probe, lt, pos):
                    status = "gap"
                elif status == "wrong" and detail.startswith("apply_rotary_pos_emb fails"):
                    status, detail = "answers", f"rotary answers a config transformers cannot run: {detail}"
                out[key] = (status, detail)
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
        f"{counts['match']} pairs match bit for bit, {counts.get('close', 0)} within ``torch.polar``'s "
        f"rounding (complex frequencies), {counts.get('text only', 0)} at text positions only (not a "
        f"rotation at image positions), {counts.get('no rope', 0)} are layer types both say have no "
        f"RoPE, {counts.get('wrong', 0)} differ, {counts.get('refused', 0)} are refused, "
        f"{counts.get('skipped', 0)} are not text RoPEs (the reasons below).  Each matching "
        "model type is also run with its ``partial_rotary_factor`` halved (``partial_probe``): rotary "
        "reads it wherever transformers does, and refuses it where transformers ignores it.",
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
