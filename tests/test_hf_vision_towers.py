"""Every vision tower of the installed ``transformers`` whose rotary module is an axial RoPE:
read by :func:`rotary.hf.vision_rope` (bit for bit) or refused, naming why.

* the census: every rotary module class of transformers' modeling files that computes axial RoPE
  parameters (``compute_axial_rope_parameters``) belongs to a config model type that
  ``vision_rope`` serves or refuses;
* each served tower, tiny, runs on an ``h x w`` image: the position ids it passes its rotary
  module are ``positions(h, w)``; rotary's ``angles="float32"`` cos/sin at them are the module's
  output bit for bit, exact angles are within float32 rounding of the float64 reference, and
  ``rotary.hf.patch`` leaves the tower's output bit for bit in float32 mode (or refuses it with
  the reason, where its machinery does not reach the module);
* the towers that permute their tokens into windows after building the ids (Qwen2.5-VL,
  Qwen2.5-Omni, EXAONE 4.5): their blocks get rotary's cos/sin at the grid in window order;
* a refused tower's module is what the refusal says: its cos/sin rebuilt from 1-D RoPEs in the
  arrangement named (which an ``AxialRoPE`` does not have).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import importlib
import inspect
import pathlib
import re
import warnings
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import rotary  # noqa: E402
from rotary.testing import reference  # noqa: E402

transformers.logging.set_verbosity_error()
EPS32 = float(np.finfo(np.float32).eps)

#: Small sizes every tiny tower takes (those its config class has): head_dim 16.
TINY = {
    "hidden_size": 32,
    "embed_dim": 32,
    "num_heads": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "depth": 1,
    "num_hidden_layers": 1,
    "intermediate_size": 32,
    "out_hidden_size": 32,
    "deepstack_visual_indexes": [],
    "fullatt_block_indexes": [],
    "patch_size": 2,
    "num_position_embeddings": 16,
    "rope_parameters": {"rope_type": "axial", "rope_theta": 1000.0},  # (not the default: read, not assumed)
}


@dataclasses.dataclass(frozen=True)
class Tower:
    """A vision tower of transformers, tiny: where it lives and how to run it.

    ``inputs``: ``"patches"`` (flat patches ``(h * w, C * T * P * P)`` and ``grid_thw``),
    ``"image"`` (``(1, C, h * P, w * P)``), ``"embeds"`` (``(h * w, hidden)`` and ``grid_thw``),
    ``"buffer"`` (the ``position_ids`` buffer the module is called with, built at init).
    ``kept``: why ``rotary.hf.patch`` refuses the module (its machinery, not the reading).
    """

    module: str
    cls: str
    config: dict[str, Any] = dataclasses.field(default_factory=dict)
    grid: tuple[int, int] = (8, 12)
    inputs: str = "patches"
    kept: str = ""


#: ``get_window_index``'s windows of 4 merge blocks over the 4 x 6 blocks of an 8 x 12 grid:
#: one full window and one partial one.
WINDOWED = {"window_size": 16}
#: SAM's memory attention: a 4 x 6 feature grid (``rope_feat_sizes`` is (w, h)).
MEMORY = {
    "memory_attention_hidden_size": 32,
    "memory_attention_num_attention_heads": 2,
    "memory_attention_num_layers": 1,
    "memory_attention_rope_feat_sizes": [6, 4],
}
#: Why rotary.hf.patch leaves a module that vision_rope reads: its probe finds no layout of rotary's
#: float32 cos/sin in the module's output (SAM's modules return a leading axis ``(1, tokens,
#: width)``, equal after it; Pixtral's float32 frequencies: see SERVED).
NOT_THOSE = "its cos/sin are not those of"

SERVED: dict[str, Tower] = {
    # (Qwen2-VL's head width is embed_dim's, hidden_size is its merger's output)
    "qwen2_vl_vision": Tower("qwen2_vl", "Qwen2VisionTransformerPretrainedModel", {"hidden_size": 64}),
    "qwen2_5_vl_vision": Tower("qwen2_5_vl", "Qwen2_5_VisionTransformerPretrainedModel", WINDOWED),
    "qwen2_5_omni_vision_encoder": Tower("qwen2_5_omni", "Qwen2_5OmniVisionEncoder", WINDOWED),
    "exaone4_5_vision": Tower("exaone4_5", "Exaone4_5_VisionModel", WINDOWED),
    "qwen3_vl_vision": Tower("qwen3_vl", "Qwen3VLVisionModel"),
    "qwen3_vl_moe_vision": Tower("qwen3_vl_moe", "Qwen3VLMoeVisionModel"),
    "qwen3_5_vision": Tower("qwen3_5", "Qwen3_5VisionModel"),
    "qwen3_5_moe_vision": Tower("qwen3_5_moe", "Qwen3_5MoeVisionModel"),
    "qwen3_omni_moe_vision_encoder": Tower("qwen3_omni_moe", "Qwen3OmniMoeVisionEncoder"),
    "qwen4_exp_vision": Tower("qwen4_exp", "Qwen4ExpVisionModel"),
    "glm4v_vision": Tower("glm4v", "Glm4vVisionModel", {"spatial_merge_size": 4, "out_hidden_size": 32}),
    "glm4v_moe_vision": Tower("glm4v_moe", "Glm4vMoeVisionModel"),
    "glm_ocr_vision": Tower("glm_ocr", "GlmOcrVisionModel"),
    "glm5_next_vision": Tower("glm5_next", "Glm5NextVisionModel"),
    "cohere_compass_vision": Tower("cohere_compass", "CohereCompassVisionModel"),
    "dots3_note_vision_encoder": Tower(
        "dots3_note",
        "Dots3NoteVisionModel",
        {"mlp_layer_types": ["dense"], "per_layer_config": {}, "adapter_in_dim": 32},
    ),
    "ernie4_5_vl_moe_vision": Tower("ernie4_5_vl_moe", "Ernie4_5_VLMoeVisionTransformerPretrainedModel"),
    "lfm3_vl_vision": Tower("lfm3_vl", "Lfm3VlVisionModel"),
    "paddleocr_vl_vision": Tower("paddleocr_vl", "PaddleOCRVisionEncoder", inputs="embeds"),
    "video_llama_3_vision": Tower("video_llama_3", "VideoLlama3VisionModel"),
    "mlcd_vision_model": Tower("mlcd", "MLCDVisionModel", inputs="image"),
    "muse_glimmer_vision": Tower(
        "muse_glimmer", "MuseGlimmerVisionModel", {"pos_emb_height": 5, "pos_emb_width": 5}
    ),
    "muse_spark_vision": Tower(
        "muse_spark", "MuseSparkVisionModel", {"pos_emb_height": 5, "pos_emb_width": 5}
    ),
    "minimax_m3_vl_vision": Tower(
        "minimax_m3_vl", "MiniMaxM3VLVisionModel", {"hidden_size": 40, "num_attention_heads": 2}
    ),
    "pixtral": Tower(
        "pixtral",
        "PixtralVisionModel",
        {"head_dim": 16},
        inputs="image",
        # (its float32 frequencies are 1 / theta**(2j/d) in float32 taken every other one; rotary's
        # float32 recipe rounds the correctly rounded even/odd frequencies: an ulp apart)
        kept=NOT_THOSE,
    ),
    "sam2_video": Tower("sam2_video", "Sam2VideoMemoryAttention", MEMORY, (4, 6), "buffer", NOT_THOSE),
    "sam3_tracker_video": Tower(
        "sam3_tracker_video", "Sam3TrackerVideoMemoryAttention", MEMORY, (4, 6), "buffer", NOT_THOSE
    ),
    "edgetam_video": Tower(
        "edgetam_video",
        "EdgeTamVideoMemoryAttention",
        {**MEMORY, "memory_attention_rope_k_sizes": [3, 2]},
        (4, 6),
        "buffer",
        NOT_THOSE,
    ),
    "sam3_vit_model": Tower(
        "sam3", "Sam3ViTLayer", {"image_size": 28, "window_size": 4}, (14, 14), "buffer", NOT_THOSE
    ),
}
#: The model types vision_rope refuses, and words of the reason it gives.
REFUSED = {
    "gemma4_vision": "own half-layout RoPE",
    "kimi_k25_vision": "pair by pair",
    "inkling2_vision": "first block of pairs to the column",
    "step3p5_vision": "first block of pairs to the column",
}


# -- the census -----------------------------------------------------------------------------------
@functools.cache
def axial_modules() -> dict[str, tuple[str, type]]:
    """model_type -> (modeling module, class) of every rotary module of the installed transformers
    that computes axial RoPE parameters, keyed by the model type of the config it takes."""
    root = pathlib.Path(transformers.models.__file__).parent
    out: dict[str, tuple[str, type]] = {}
    for path in sorted(root.glob("*/modeling_*.py")):
        if "compute_axial_rope_parameters" not in path.read_text(encoding="utf-8"):
            continue
        mod = importlib.import_module(f"transformers.models.{path.parent.name}.{path.stem}")
        for cls in vars(mod).values():
            if not (inspect.isclass(cls) and cls.__module__ == mod.__name__):
                continue
            if "compute_axial_rope_parameters" not in vars(cls):
                continue
            ann = inspect.signature(cls.__init__).parameters["config"].annotation
            config_cls = getattr(mod, ann) if isinstance(ann, str) else ann
            out[config_cls.model_type] = (path.parent.name, cls)
    return out


def test_every_axial_vision_tower_is_served_or_refused():
    found = axial_modules()
    assert len(found) >= 30  # (transformers 5.24 has 33)
    assert set(found) <= set(SERVED) | set(REFUSED), sorted(set(found) - set(SERVED) - set(REFUSED))
    for mt, why in REFUSED.items():
        with pytest.raises(ValueError, match=f"vision_rope cannot express the {mt} vision RoPE: .*{why}"):
            rotary.hf.vision_rope({"model_type": mt, "hidden_size": 32, "num_attention_heads": 2})


# -- building and running a tiny tower ------------------------------------------------------------
def _config(mt: str, extra: dict[str, Any] | None = None):
    cls = transformers.CONFIG_MAPPING[mt]
    names = inspect.signature(cls.__init__).parameters
    kw = {k: v for k, v in TINY.items() if k in names or hasattr(cls, k)}
    kw.update(extra or {})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = cls(**kw)
    for k, v in (extra or {}).items():  # (SAM 3 tracker's __post_init__ derives feature sizes)
        setattr(cfg, k, v)
    cfg._attn_implementation = "eager"
    return cfg


@functools.cache
def tiny_tower(mt: str):
    """``(config, tower)`` of a tiny tower (shared: copy it before patching)."""
    t = SERVED[mt]
    cfg = _config(mt, t.config)
    mod = importlib.import_module(f"transformers.models.{t.module}.modeling_{t.module}")
    torch.manual_seed(0)
    tower = getattr(mod, t.cls)(cfg)
    return cfg, tower.eval()


def rotary_module(tower):
    (module,) = [m for m in tower.modules() if re.search(r"(Rotary|Rope)\w*Embedding", type(m).__name__)]
    return module


def _inputs(mt: str, cfg, tower) -> dict[str, Any]:
    t = SERVED[mt]
    h, w = t.grid
    gen = torch.Generator().manual_seed(1)
    channels = getattr(cfg, "in_channels", None) or getattr(cfg, "num_channels", None) or 3
    frames = getattr(cfg, "temporal_patch_size", None) or getattr(cfg, "patch_temporal", None) or 1
    p = cfg.patch_size
    if t.inputs == "image":
        return {"pixel_values": torch.randn(1, channels, h * p, w * p, generator=gen)}
    names = list(inspect.signature(tower.forward).parameters)
    width = cfg.hidden_size if t.inputs == "embeds" else channels * frames * p * p
    kw: dict[str, Any] = {names[0]: torch.randn(h * w, width, generator=gen)}
    for name in ("grid_thw", "image_grid_thw"):
        if name in names:
            kw[name] = torch.tensor([[1, h, w]])
    if "merge_sizes" in names:
        kw["merge_sizes"] = torch.tensor([1])  # (VideoLLaMA3's image processor: merge size 1)
    return kw


class _Called(Exception):
    pass


def _call(module, run) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``(args, kwargs)`` the tower passes ``module`` when ``run()`` runs (stopped there)."""
    got: list[Any] = []

    def hook(_, args, kwargs):
        got.extend((args, kwargs))
        raise _Called

    handle = module.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        with pytest.raises(_Called), torch.no_grad():
            run()
    finally:
        handle.remove()
    return got[0], got[1]


def tower_ids(mt: str):
    """``(x, position_ids)`` the tiny tower passes its rotary module for its ``h x w`` image."""
    cfg, tower = tiny_tower(mt)
    module = rotary_module(tower)
    if SERVED[mt].inputs == "buffer":  # (built at init: ``self.rotary_emb(x, self.position_ids)``)
        return torch.zeros(1), tower.position_ids
    args, kwargs = _call(module, lambda: tower(**_inputs(mt, cfg, tower)))
    got = {**dict(zip(("x", "position_ids"), args)), **kwargs}
    return got["x"], got["position_ids"]


def _output(out):
    return out if isinstance(out, torch.Tensor) else out[0]


def reference_cos(tower: rotary.vision.VisionRoPE, pos: np.ndarray) -> np.ndarray:
    """Per-pair cos of the tower's axial RoPE at ``pos`` (float64, correctly rounded)."""
    rope = tower.rope
    cols = []
    for a, width in enumerate(rope.split):
        th = reference.theta(width, rope.base)
        if tower.name == "pixtral":  # (the even / odd frequencies of one head_dim RoPE)
            th = reference.theta(rope.head_dim, rope.base)[a::2]
        cols.append(reference.cos_sin(pos[:, a].astype(np.float64), th)[0])
    return np.concatenate(cols, axis=-1)


# -- served towers --------------------------------------------------------------------------------
@pytest.mark.parametrize("mt", sorted(SERVED))
def test_positions_are_the_ids_the_tower_builds_and_cos_sin_are_bitwise(mt):
    cfg, tower = tiny_tower(mt)
    module = rotary_module(tower)
    x, ids = tower_ids(mt)
    vt = rotary.hf.vision_rope(cfg, angles="float32")
    assert vt.rope.base == 1000.0  # (the config's rope_theta, not the default)
    pos = vt.positions(*SERVED[mt].grid)
    assert pos.dtype.kind == ids.numpy().dtype.kind and np.array_equal(pos, ids.numpy()), (pos, ids)
    want_c, want_s = (t.reshape(ids.shape[0], -1) for t in type(module).forward(module, x, ids))
    got_c, got_s = vt.rope.cos_sin(ids, dtype=want_c.dtype, full=True)
    if mt == "pixtral":  # (an ulp of frequency apart in float32: see SERVED)
        assert float((got_c - want_c).abs().max()) <= 8 * EPS32
    else:
        assert torch.equal(got_c, want_c) and torch.equal(got_s, want_s)
    exact, _ = rotary.hf.vision_rope(cfg).rope.cos_sin(pos)
    assert float(np.abs(exact - reference_cos(vt, pos)).max()) <= EPS32  # (1 ulp at |cos| <= 1)


@pytest.mark.parametrize("mt", sorted(mt for mt, t in SERVED.items() if not t.kept))
def test_patch_serves_the_tower_bitwise_in_float32_mode(mt):
    cfg, shared = tiny_tower(mt)
    tower = copy.deepcopy(shared)
    kw = _inputs(mt, cfg, tower)
    with torch.no_grad():
        want = _output(tower(**kw))
    with rotary.hf.patched(tower, angles="float32") as report:  # strict: the tower is served
        (entry,) = report.modules
        assert entry.ropes[None] == rotary.hf.vision_rope(cfg, angles="float32").rope
        with torch.no_grad():
            assert torch.equal(_output(tower(**kw)), want)
    with rotary.hf.patched(tower), torch.no_grad():  # exact angles
        got = _output(tower(**kw))
    assert float((got - want).abs().max()) <= 64 * EPS32 * max(1.0, float(want.abs().max()))


@pytest.mark.parametrize("mt", sorted(mt for mt, t in SERVED.items() if t.kept))
def test_patch_refuses_the_modules_its_probe_cannot_match(mt):
    _, tower = tiny_tower(mt)
    module = rotary_module(tower)
    with pytest.raises(ValueError, match=f"{type(module).__name__}.*{SERVED[mt].kept}"):
        rotary.hf.patch(copy.deepcopy(tower))


def test_edgetam_key_positions():
    cfg, tower = tiny_tower("edgetam_video")
    vt = rotary.hf.vision_rope(cfg, angles="float32")
    w, h = cfg.memory_attention_rope_k_sizes
    assert np.array_equal(vt.positions(h, w), tower.position_ids_k.numpy())


@pytest.mark.parametrize("mt", ["qwen2_5_vl_vision", "qwen2_5_omni_vision_encoder", "exaone4_5_vision"])
def test_windowed_towers_rotate_in_window_order(mt):
    # The tower builds the ids in merge order, then permutes tokens and cos/sin rows into windows
    # of window_size // patch_size // spatial_merge_size merge blocks: the blocks get rotary's
    # cos/sin at the grid in window order.
    cfg, tower = tiny_tower(mt)
    block = tower.blocks[0]
    _, kwargs = _call(block, lambda: tower(**_inputs(mt, cfg, tower)))
    cos, sin = kwargs["position_embeddings"]
    vt = rotary.hf.vision_rope(cfg, angles="float32")
    n = cfg.window_size // cfg.patch_size // cfg.spatial_merge_size
    windowed = rotary.vision.Grid("merge", merge=cfg.spatial_merge_size, window=n)(*SERVED[mt].grid)
    assert not np.array_equal(windowed, vt.positions(*SERVED[mt].grid))  # (a real permutation)
    c, s = vt.rope.cos_sin(torch.from_numpy(windowed), dtype=cos.dtype, full=True)
    assert torch.equal(c, cos) and torch.equal(s, sin)


@pytest.mark.parametrize("mt", sorted(SERVED))
def test_default_theta_is_the_config_class_default(mt):
    cls = transformers.CONFIG_MAPPING[mt]
    d = _config(mt, SERVED[mt].config).to_dict()
    del d["rope_parameters"]  # (a config.json without it: the class's default)
    assert rotary.hf.vision_rope(d).rope.base == cls.default_theta


# -- refused towers -------------------------------------------------------------------------------
def _pairs(rope: rotary.RoPE, coord: torch.Tensor) -> torch.Tensor:
    return rope.cos_sin(coord, dtype=torch.float32)[0]


#: The module's cos, rebuilt from one 1-D RoPE of ``head_dim / 2`` features per coordinate
#: (per-pair cos ``cr`` at the row, ``cc`` at the column), in the arrangement each refusal names.
ARRANGEMENT = {
    "gemma4_vision": lambda cr, cc: torch.cat([cr, cr, cc, cc], -1),  # each axis its own half layout
    "kimi_k25_vision": lambda cr, cc: torch.stack([cc, cr], -1).flatten(-2).repeat(1, 2),  # alternating
    "inkling2_vision": lambda cr, cc: torch.cat([cc, cr], -1).repeat_interleave(2, -1),  # column first
    "step3p5_vision": lambda cr, cc: torch.cat([cc, cr], -1).repeat(1, 2),  # column first
}


@pytest.mark.parametrize("mt", sorted(REFUSED))
def test_refused_tower_is_what_the_refusal_says(mt):
    module_name, cls = axial_modules()[mt]
    cfg = _config(mt, {"head_dim": 16})
    module = cls(cfg)
    with pytest.raises(ValueError, match=f"{cls.__name__}.*{REFUSED[mt]}"):
        rotary.hf.patch(module)
    ids = torch.from_numpy(rotary.vision.Grid("merge")(4, 6))
    rope = rotary.RoPE(16 // 2, base=1000.0, angles="float32")
    want = ARRANGEMENT[mt](_pairs(rope, ids[:, 0]), _pairs(rope, ids[:, 1]))
    got = module(torch.zeros(1), ids[None] if mt == "gemma4_vision" else ids)[0]
    assert torch.equal(got.reshape(want.shape), want), module_name
