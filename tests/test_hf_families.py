"""``rotary.hf`` against every model family's own ``transformers`` implementation.

For each family of :mod:`hf_families` (published ``config.json`` values):

* the config object ``transformers`` builds from the published dict reads as the same RoPE
  (our defaults per ``model_type`` are ``transformers``' defaults);
* cos/sin equal the family's rotary module on the published config: bit-for-bit with
  ``angles="float32"``, within HF's own float32 angle error with ``angles="exact"``;
* a tiny random model of the family gives the same logits with ``rotary.hf.patch`` (bit-for-bit
  with ``angles="float32"``, ``generate`` included; to float32 precision with ``"exact"``).

Families without a ``transformers`` implementation (``fmt=None``) are read from their published
values only (``test_hf.py``).
"""

from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hf_families import FAMILIES, Family  # noqa: E402

import rotary  # noqa: E402

transformers.logging.set_verbosity_error()

EPS32 = float(np.finfo(np.float32).eps)
COMPARED = [f for f in FAMILIES if f.fmt is not None]
IDS = [f.name for f in COMPARED]


def _config(d: dict):
    """transformers' config object of a config dict (a deep copy: transformers edits nested dicts)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return transformers.AutoConfig.for_model(**copy.deepcopy(d))


def _text(cfg):
    return cfg.get_text_config(decoder=True) if hasattr(cfg, "get_text_config") else cfg


def _ropes(f: Family, config, angles: str) -> dict:
    """layer type (or None) -> rotary's RoPE / MRoPE of that layer type."""
    if not f.layer_types:
        m = rotary.hf.model_rope(config, angles=angles)
        first = next(r for r in m.layers if r is not None)
        return {None: first}
    return {lt: _by_type(config, lt, angles) for lt in f.layer_types}


def _by_type(config, layer_type, angles):
    m = rotary.hf.model_rope(config, angles=angles)
    i = m.layer_types.index(layer_type)
    return m.layers[i]


def _positions(f: Family, mrope: bool):
    base = torch.arange(f.length)
    pos = torch.stack([base + s for s in f.starts])  # (B, S)
    if mrope:  # three different rows, as an image's (t, h, w) grid would give
        return torch.stack([pos, pos // 2 + 7, pos % 5 + pos // 3])
    return pos


def _pairs(f: Family, out, n: int):
    """Per-pair (cos, sin) from a rotary module's output."""
    if f.fmt == "complex":
        return out.real.contiguous(), out.imag.contiguous()
    c, s = out
    if f.fmt == "cat":
        return c[..., :n], s[..., :n]
    if f.fmt == "interleave":
        return c[..., ::2], s[..., ::2]
    return c, s


def _module_class(f: Family):
    model = _tiny_model(f)
    mods = [m for m in model.modules() if _is_rotary(m)]
    return type(mods[0]) if mods else None


def _is_rotary(m) -> bool:
    name = type(m).__name__
    return name.endswith("RotaryEmbedding") and "Vision" not in name


def _hf_cos_sin(f: Family, config, pos, layer_type, n):
    """transformers' per-pair cos/sin for the published config (a fresh, stateless module)."""
    x = torch.zeros(1, dtype=torch.float32)
    if f.fmt == "gptj":
        from transformers.models.gptj.modeling_gptj import create_sinusoidal_positions

        table = create_sinusoidal_positions(int(pos.max()) + 1, config.rotary_dim)[pos]
        return table[..., n:], table[..., :n]
    cls = _module_class(f)
    mod = cls(_text(config))
    out = mod(x, pos, layer_type) if layer_type is not None else mod(x, pos)
    return _pairs(f, out, n)


@pytest.mark.parametrize("f", COMPARED, ids=IDS)
def test_transformers_config_object_reads_the_same(f):
    obj = _config(f.config)
    for lt in f.layer_types or (None,):
        assert rotary.hf.from_hf(obj, layer_type=lt) == rotary.hf.from_hf(f.config, layer_type=lt)
    a, b = rotary.hf.model_rope(obj), rotary.hf.model_rope(f.config)
    assert repr(a.layers) == repr(b.layers)
    assert a.rope_slice == b.rope_slice


def cos_sin_diffs(f: Family) -> dict:
    """max |ours - transformers| of per-pair cos and sin, per angle method (and layer type)."""
    config = _config(f.config)
    out = {}
    for angles in ("float32", "exact"):
        for lt, rope in _ropes(f, config, angles).items():
            mrope = isinstance(rope, rotary.MRoPE)
            pos = _positions(f, mrope)
            c, s = rope.cos_sin(pos)
            hc, hs = _hf_cos_sin(f, config, pos, lt, c.shape[-1])
            assert c.shape == hc.shape and c.dtype == hc.dtype, (c.shape, hc.shape)
            d = max(float((c - hc).abs().max()), float((s - hs).abs().max()))
            out[(angles, lt)] = d
            if angles == "exact" or f.fmt == "complex":
                # (transformers' complex families build cos/sin with torch.polar, which rounds
                # differently from torch.cos/sin by up to an ulp)
                w = np.abs(rope.inv_freq())
                p = np.abs(pos.numpy().astype(np.float64)).max()
                bound = 4 * EPS32 * (1.0 + p * w.max()) * max(1.0, rope.attention_factor)
                assert d <= bound, (f.name, lt, d, bound)
            else:
                assert d == 0.0, (f.name, lt, angles, d)
    return out


@pytest.mark.parametrize("f", COMPARED, ids=IDS)
def test_cos_sin_equal_transformers(f):
    cos_sin_diffs(f)


# -- tiny models --------------------------------------------------------------------------------
def _tiny_dict(f: Family) -> dict:
    base = dict(f.config)
    tiny = {**dict(f.tiny), "pad_token_id": 0}  # within the tiny vocabulary
    if "text_config" in base and not f.model.endswith("ConditionalGeneration"):  # the text model alone
        text = dict(base["text_config"])
        text.update(tiny)
        return text
    if "text_config" in base:  # a multimodal model: small text and vision configs
        text = dict(base["text_config"])
        vision = tiny.pop("vision_config", None)
        text.update(tiny)
        out = {k: v for k, v in base.items() if k not in ("text_config", "vision_config")}
        out["text_config"] = text
        if vision is not None:
            out["vision_config"] = vision
        return out
    base.update(tiny)
    return base


_MODELS: dict = {}


def _tiny_model(f: Family):
    if f.name not in _MODELS:
        d = _tiny_dict(f)
        cfg = _config(d)
        if hasattr(cfg, "_attn_implementation"):
            cfg._attn_implementation = "eager"
        torch.manual_seed(0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cls = getattr(transformers, f.model)
            model = cls.from_config(cfg) if f.model.startswith("Auto") else cls(cfg)
        _MODELS[f.name] = model.eval()
    return _MODELS[f.name]


def generate(model, ids, mask=None, new=4, **kw):
    """Greedy ``(sequences, scores)`` of ``new`` tokens (the second on from the KV cache), or None
    for a model that does not generate (shared with ``test_hf_census_models.py`` and
    ``test_hf_patch.py``)."""
    if not getattr(model, "can_generate", lambda: False)():
        return None
    with torch.no_grad():
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids) if mask is None else mask,
            max_new_tokens=new,
            do_sample=False,
            output_scores=True,
            return_dict_in_generate=True,
            pad_token_id=0,
            **kw,
        )
    return out.sequences, torch.stack(out.scores)


def _scores(model, ids):
    out = generate(model, ids, new=2)  # (a prefill and a cached step: the suite's time is short)
    return None if out is None else out[1]


def logits_diffs(f: Family) -> dict:
    """max |logits(rotary.hf.patch) - logits(transformers)| of a tiny random model, per angle
    method, and of ``generate``'s scores with ``angles="float32"``."""
    model = _tiny_model(f)
    cfg = model.config
    ids = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(1))
    tl = cfg.get_text_config(decoder=True) if hasattr(cfg, "get_text_config") else cfg
    l0 = getattr(tl, "original_max_position_embeddings", None) or 32
    start = min(l0, 40)  # past LongRoPE's switch in the tiny Phi configs
    pos = torch.stack([torch.arange(12), torch.arange(12) + start])
    kwargs = {"position_ids": pos}
    if f.model.endswith("ConditionalGeneration"):
        kwargs["position_ids"] = torch.stack([pos, pos // 2 + 3, pos % 4 + pos // 3])
    with torch.no_grad():
        want = model(input_ids=ids, **kwargs).logits
    want_gen = _scores(model, ids)
    out = {}
    for angles in ("float32", "exact"):
        with rotary.hf.patched(model, angles=angles) as report:  # every module served (strict)
            assert not report.kept
            with torch.no_grad():
                got = model(input_ids=ids, **kwargs).logits
            if angles == "float32" and want_gen is not None:
                out["generate"] = float((_scores(model, ids) - want_gen).abs().max())
        out[angles] = float((got - want).abs().max())
    scale = max(1.0, float(want.abs().max()))
    # (complex families too: the patch forms their cos/sin with torch.polar, as transformers does)
    assert out["float32"] == 0.0 and out.get("generate", 0.0) == 0.0, (f.name, out)
    assert out["exact"] <= 64 * EPS32 * scale, (f.name, out)
    return out


@pytest.mark.parametrize("f", COMPARED, ids=IDS)
def test_tiny_model_logits_unchanged(f):
    logits_diffs(f)


def test_defaults_match_transformers_config_classes():
    # A config.json without rope_theta (or partial_rotary_factor) reads as transformers reads it.
    from transformers import CONFIG_MAPPING

    from rotary._hfconfig import _KNOWN, DEFAULT_THETA

    checked = 0
    for family in sorted(_KNOWN):
        for mt in (f"{family}_text", family):
            if mt in CONFIG_MAPPING:
                break
        else:
            continue
        want = CONFIG_MAPPING[mt].default_theta
        got = DEFAULT_THETA.get(family, 10000.0)
        if family == "gemma4":
            continue  # per-layer-type defaults in rope_parameters (their configs carry them)
        if isinstance(want, dict) and set(want) == {"global", "local"}:
            want = {"full_attention": want["global"], "sliding_attention": want["local"]}
        assert got == want, (family, got, want)
        checked += 1
    assert checked >= 30
    for family, prf in {"phi": 0.5, "stablelm": 0.25, "gpt_neox": 0.25, "glm": 0.5, "glm4": 0.5}.items():
        d = {"model_type": family, "hidden_size": 64, "num_attention_heads": 4}
        assert _config(d).to_dict()["rope_parameters"]["partial_rotary_factor"] == prf
        assert rotary.hf.from_hf(d).rotary_dim == int(16 * prf)


def internlm2_diffs() -> dict:
    """InternLM2 is remote code (not in transformers 5.23): its published config against
    transformers' own dynamic-NTK rotary embedding (the formula InternLM2's code uses too)."""
    from hf_families import BY_NAME
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    f = BY_NAME["InternLM2 (dynamic)"]
    llama = _config(dict(f.config, model_type="llama"))
    out = {}
    for angles in ("float32", "exact"):
        rope = rotary.hf.from_hf(f.config, angles=angles)
        for starts in ((0, 100), f.starts):  # within max_position_embeddings, and beyond it
            pos = torch.stack([torch.arange(f.length) + s for s in starts])
            c, s = rope.cos_sin(pos)
            hc, hs = LlamaRotaryEmbedding(llama)(torch.zeros(1), pos)
            n = c.shape[-1]
            d = max(float((c - hc[..., :n]).abs().max()), float((s - hs[..., :n]).abs().max()))
            out[(angles, starts[-1])] = d
    return out


def test_internlm2_dynamic_ntk_equals_transformers():
    d = internlm2_diffs()
    assert d[("float32", 100)] == 0.0 and d[("float32", 40000)] == 0.0, d
    assert max(d.values()) < 4 * EPS32 * 41000, d


def test_gemma4_proportional_with_factor_equals_transformers():
    from hf_families import BY_NAME

    f = BY_NAME["Gemma 4"]
    d = copy.deepcopy(f.config)
    d["rope_parameters"]["full_attention"]["factor"] = 8.0
    cls = _module_class(f)
    mod = cls(_config(d))
    pos = _positions(f, False)
    for angles in ("float32", "exact"):
        rope = rotary.hf.from_hf(d, layer_type="full_attention", angles=angles)
        c, s = rope.cos_sin(pos)
        hc, hs = mod(torch.zeros(1), pos, "full_attention")
        n = c.shape[-1]
        diff = max(float((c - hc[..., :n]).abs().max()), float((s - hs[..., :n]).abs().max()))
        assert diff == 0.0 if angles == "float32" else diff < 4 * EPS32 * 3100, (angles, diff)
