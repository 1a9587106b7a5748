"""``rotary.hf.patch``: rotary's RoPE inside a loaded ``transformers`` model.

The bit-for-bit check of ``angles="float32"`` on every census family's tiny model (prefill and
``generate``) is in ``test_hf_census_models.py`` and ``test_hf_families.py``; here, on a few
tiny models of :mod:`hf_families`:

* exact angles: within the documented bound of the truth (the same weights in float64 with exact
  angles) at position 2**24, where the unpatched model is not;
* ``unpatch`` and ``patched`` restore the model bit for bit;
* refusals name each module, its class, its model type and the reason, and leave the model as
  it was; ``strict=False`` patches the rest and lists what it kept;
* vision towers: Qwen2-VL's, Qwen2.5-VL's (window attention) and Qwen3-VL's are patched by
  default, bit for bit in float32 mode with an image in the prompt (every tower of transformers:
  ``test_hf_vision_towers.py``); one rotary cannot express (Step 3.7's) is refused;
* interop: ``generate`` (KV cache, left padding, static cache), ``torch.compile``, gradient
  checkpointing, bfloat16, ``save_pretrained`` (the same files), pickle and deepcopy.
"""

from __future__ import annotations

import copy
import pickle
import warnings

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import test_hf_families as F  # noqa: E402
from hf_families import BY_NAME  # noqa: E402

import rotary  # noqa: E402

transformers.logging.set_verbosity_error()

EPS32 = float(torch.finfo(torch.float32).eps)
#: The families of the measured benefit (docs/guides/numerics.rst, benchmarks/hf_patch.py).
MEASURED = ("Llama 3.1", "Qwen2.5 (+YaRN)", "Gemma 3", "Phi-3 (LongRoPE)", "DeepSeek-V3")
#: Position offsets of the table.
OFFSETS = (0, 2**16, 2**20, 2**22, 2**24)
SEQ = 16


def tiny(name: str):
    """A fresh copy of the family's tiny random model (the shared one stays unpatched)."""
    return copy.deepcopy(F._tiny_model(BY_NAME[name]))


def _ids(batch: int = 1, seq: int = SEQ):
    return torch.randint(1, 128, (batch, seq), generator=torch.Generator().manual_seed(3))


def _logits(model, ids, pos):
    with torch.no_grad():
        return model(input_ids=ids, position_ids=pos).logits


def truth_model(model):
    """The same weights in float64 with exact angles."""
    m64 = copy.deepcopy(model).double()
    if getattr(m64.config, "_experts_implementation", None) not in (None, "eager"):
        m64.set_experts_implementation("eager")  # (grouped matmuls take no float64)
    return rotary.hf.patch(m64, angles="exact")


def logit_errors(model, offsets=OFFSETS, seq: int = SEQ) -> dict[int, tuple[float, float]]:
    """``{offset: (unpatched error, patched exact error)}``: max |logits - truth| of the float32
    model as transformers runs it and patched with exact angles, at ``position_ids`` offset by
    ``offset`` (float64 truth, :func:`truth_model`)."""
    m64 = truth_model(model)
    ids = _ids(seq=seq)
    out = {}
    for off in offsets:
        pos = torch.arange(seq)[None] + off
        want = _logits(m64, ids, pos)
        plain = _logits(model, ids, pos)
        with rotary.hf.patched(model, angles="exact"):
            exact = _logits(model, ids, pos)
        out[off] = tuple(float((x.double() - want).abs().max()) for x in (plain, exact))
    return out


def bound(errors: dict[int, tuple[float, float]]) -> float:
    """The documented bound of the exact-angle model's logit error at any offset: twice the float32
    model's own error at offset 0, where its float32 angles are accurate too (the network's
    rounding floor; docs/guides/numerics.rst)."""
    return 2 * max(errors[0])


# -- exact angles ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["Llama 3.1", "Gemma 3", "DeepSeek-V3"])
def test_exact_within_bound_at_2_24_where_unpatched_is_not(name):
    model = tiny(name)
    errs = logit_errors(model, offsets=(0, 2**24))
    b = bound(errs)
    plain, exact = errs[2**24]
    assert exact <= b, (errs, b)
    assert plain > 100 * b, (errs, b)  # transformers' float32 angles: far outside it


def test_float64_model_patched_float32_is_transformers_float64():
    # A float64 model keeps transformers' float32 angles (cast to float64) in float32 mode.
    model = tiny("Qwen2.5 (+YaRN)").double()
    ids, pos = _ids(), torch.arange(SEQ)[None] + 2**20
    want = _logits(model, ids, pos)
    with rotary.hf.patched(model, angles="float32"):
        assert torch.equal(_logits(model, ids, pos), want)


# -- restoring ------------------------------------------------------------------------------------
def test_unpatch_restores_bitwise():
    model = tiny("Gemma 3")
    ids, pos = _ids(), torch.arange(SEQ)[None] + 2**22
    want = _logits(model, ids, pos)
    assert rotary.hf.patch(model) is model
    assert not torch.equal(_logits(model, ids, pos), want)  # exact angles change the numbers here
    assert rotary.hf.unpatch(model) is model
    assert torch.equal(_logits(model, ids, pos), want)
    assert not hasattr(model, "rotary_patch")
    assert all("forward" not in vars(m) for m in model.modules())


def test_patched_restores_on_error_and_reports():
    model = tiny("Phi-3 (LongRoPE)")
    ids, pos = _ids(), torch.arange(SEQ)[None]
    want = _logits(model, ids, pos)
    with pytest.raises(RuntimeError, match="inside"):
        with rotary.hf.patched(model, angles="float32") as report:
            assert report.angles == "float32" and [m.path for m in report.modules] == ["model.rotary_emb"]
            (entry,) = report.modules
            assert entry.module_class == "Phi3RotaryEmbedding" and entry.model_type == "phi3"
            assert isinstance(entry.ropes[None].scaling, rotary.scaling.LongRoPE)
            assert entry.output.layout == "cat"
            raise RuntimeError("inside")
    assert not hasattr(model, "rotary_patch")
    assert torch.equal(_logits(model, ids, pos), want)


# -- refusals -------------------------------------------------------------------------------------
def _gpt2():
    cfg = transformers.GPT2Config(n_embd=32, n_head=2, n_layer=1, vocab_size=64, n_positions=32)
    return transformers.GPT2LMHeadModel(cfg)


def test_refuses_a_model_without_rotary_embedding():
    with pytest.raises(ValueError, match="GPT2LMHeadModel has no rotary embedding module"):
        rotary.hf.patch(_gpt2())


def test_refuses_a_module_whose_cos_sin_are_not_what_its_config_says():
    # The module was built with one base; its config now says another: rotary would compute
    # other angles than the model does, so it refuses rather than change the model silently.
    model = tiny("Llama 3.1")
    ids, pos = _ids(), torch.arange(SEQ)[None]
    want = _logits(model, ids, pos)
    model.model.rotary_emb.config = copy.deepcopy(model.config)
    model.model.rotary_emb.config.rope_parameters["rope_theta"] = 1234.0
    with pytest.raises(ValueError) as e:
        rotary.hf.patch(model)
    msg = str(e.value)
    assert "model.rotary_emb (LlamaRotaryEmbedding, model type 'llama')" in msg
    assert "are not those of RoPE(16, base=1234" in msg and "strict=False" in msg
    assert "forward" not in vars(model.model.rotary_emb) and not hasattr(model, "rotary_patch")
    assert torch.equal(_logits(model, ids, pos), want)


def test_refuses_hunyuan_vl_xd_rope():
    cfg = transformers.AutoConfig.for_model("hunyuan_vl").text_config
    tiny_cfg = dict(hidden_size=64, num_attention_heads=1, num_key_value_heads=1, head_dim=64,
                    num_hidden_layers=1, intermediate_size=64, vocab_size=128)  # fmt: skip
    for k, val in tiny_cfg.items():
        setattr(cfg, k, val)
    cfg.rope_parameters = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [8] * 4}
    model = transformers.AutoModel.from_config(cfg)
    with pytest.raises(ValueError) as e:
        rotary.hf.patch(model)
    msg = str(e.value)
    assert "rotary_emb (HunYuanVLRotaryEmbedding, model type 'hunyuan_vl_text')" in msg
    assert "not a rotation" in msg


def _step3p7():
    """A tiny Step 3.7 (text RoPE, and a vision tower whose pairs take the column first)."""
    text = dict(hidden_size=64, num_attention_heads=4, num_attention_groups=2, num_key_value_heads=2,
                head_dim=16, num_hidden_layers=1, intermediate_size=64, vocab_size=128,
                layer_types=["full_attention"])  # fmt: skip
    vision = dict(hidden_size=32, num_attention_heads=2, num_hidden_layers=1, intermediate_size=32)
    cfg = transformers.AutoConfig.for_model("step3p7", text_config=text, vision_config=vision)
    torch.manual_seed(0)
    return transformers.AutoModelForImageTextToText.from_config(cfg).eval()


def test_vision_tower_rotary_cannot_express_refused_unless_not_strict():
    model = _step3p7()
    with pytest.raises(ValueError) as e:
        rotary.hf.patch(model)
    msg = str(e.value)
    assert "vision_model.rotary_emb (Step3p7VisionRotaryEmbedding, model type 'step3p5_vision')" in msg
    assert "(a vision/audio tower)" in msg and "first block of pairs to the column" in msg
    assert "language_model" not in msg  # the text RoPE is served
    with rotary.hf.patched(model, strict=False) as report:
        assert [m.path for m in report.modules] == ["model.language_model.rotary_emb"]
        assert [p for p, _ in report.kept] == ["model.vision_model.rotary_emb"]
        assert "forward" not in vars(model.model.vision_model.rotary_emb)


def _vl_model(name: str):
    """A tiny Qwen2.5-VL / Qwen3-VL whose vocabulary holds its image tokens (Qwen2.5-VL with a
    windowed block before the full one: window order matters)."""
    d = F._tiny_dict(BY_NAME[name])
    d.update(image_token_id=5, video_token_id=6, vision_start_token_id=4, vision_end_token_id=7)
    if name == "Qwen2.5-VL":
        d["vision_config"] = {
            **d["vision_config"],
            "depth": 2,
            "fullatt_block_indexes": [1],
            "window_size": 56,
        }
    cfg = F._config(d)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    return getattr(transformers, BY_NAME[name].model)(cfg).eval()


def _image_inputs(model, grid=(1, 12, 16), seed=4):
    """A prompt with one image of ``grid`` patches: input_ids, pixel_values, image_grid_thw."""
    vc = model.config.vision_config
    thw = torch.tensor([grid])
    n = int(thw.prod())
    width = vc.in_channels * vc.temporal_patch_size * vc.patch_size**2
    pixels = torch.randn(n, width, generator=torch.Generator().manual_seed(seed))
    image = torch.full((n // vc.spatial_merge_size**2,), model.config.image_token_id)
    ids = torch.cat([torch.tensor([1, 2, 4]), image, torch.tensor([7, 9, 10, 11])])[None]
    return {
        "input_ids": ids,
        "pixel_values": pixels,
        "image_grid_thw": thw,
        "mm_token_type_ids": (ids == model.config.image_token_id).long(),
    }


@pytest.mark.parametrize("name", ["Qwen2.5-VL", "Qwen3-VL"])
def test_vl_model_with_image_patched_by_default_bitwise_in_float32_mode(name):
    # The vision tower and the text model, each rotary's RoPE (strict: nothing refused); with an
    # image in the prompt the tower runs, and in float32 mode the logits are transformers' bit for bit.
    model = _vl_model(name)
    kw = _image_inputs(model)
    with torch.no_grad():
        want = model(**kw).logits
        other = model(**{**kw, "pixel_values": _image_inputs(model, seed=5)["pixel_values"]}).logits
    assert not torch.equal(other, want)  # (the image reaches the logits)
    with rotary.hf.patched(model, angles="float32") as report:
        assert [m.path for m in report.modules] == [
            "model.visual.rotary_pos_emb",
            "model.language_model.rotary_emb",
        ]
        assert not report.kept
        with torch.no_grad():
            got = model(**kw).logits
    assert torch.equal(got, want)
    with rotary.hf.patched(model), torch.no_grad():  # exact angles (the default), strict
        exact = model(**kw).logits
    assert float((exact - want).abs().max()) <= 64 * EPS32 * max(1.0, float(want.abs().max()))


def test_vision_tower_rotary_reads_is_patched():
    # Qwen2-VL's vision tower: its (row, col) RoPE through rotary.hf.vision_rope, bit for bit.
    model = copy.deepcopy(F._tiny_model(BY_NAME["Qwen2-VL"]))
    vcfg = model.config.vision_config
    grid = torch.tensor([[1, 4, 6]])
    n = int(grid.prod())
    width = vcfg.in_channels * vcfg.temporal_patch_size * vcfg.patch_size**2
    pixels = torch.randn(n, width, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        want = model.model.visual(pixels, grid_thw=grid).last_hidden_state
        with rotary.hf.patched(model, angles="float32") as report:
            paths = {m.path for m in report.modules}
            assert paths == {"model.visual.rotary_pos_emb", "model.language_model.rotary_emb"}
            got = model.model.visual(pixels, grid_thw=grid).last_hidden_state
    assert torch.equal(got, want)


def test_argument_and_state_errors():
    model = tiny("Qwen2.5 (+YaRN)")
    with pytest.raises(ValueError, match="angles must be 'exact' or 'float32', got 'float64'"):
        rotary.hf.patch(model, angles="float64")
    with pytest.raises(TypeError, match="strict must be"):
        rotary.hf.patch(model, strict="no")
    with pytest.raises(TypeError, match="model must be a transformers"):
        rotary.hf.patch(model.config)
    with pytest.raises(ValueError, match="is not patched"):
        rotary.hf.unpatch(model)
    with rotary.hf.patched(model):
        with pytest.raises(ValueError, match=r"already patched \(angles='exact'\).*unpatch"):
            rotary.hf.patch(model, angles="float32")
        with pytest.raises(ValueError, match=r"layer_type in \[None\], called with 'sliding_attention'"):
            model.model.rotary_emb(torch.zeros(1), torch.arange(3)[None], layer_type="sliding_attention")


# -- interop --------------------------------------------------------------------------------------
@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_generate_left_padding_and_caches_bitwise_in_float32_mode(cache):
    model = tiny("Llama 3.1")
    ids = _ids(batch=2, seq=6)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0  # left padding: positions from the mask
    ids = ids.masked_fill(mask == 0, 0)
    kw = {"cache_implementation": "static"} if cache == "static" else {}
    want = F.generate(model, ids, mask, **kw)
    with rotary.hf.patched(model, angles="float32"):
        got = F.generate(model, ids, mask, **kw)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    with rotary.hf.patched(model, angles="exact"):
        _, scores = F.generate(model, ids, mask, **kw)
    eps = float(torch.finfo(torch.float32).eps)
    assert float((scores - want[1]).abs().max()) <= 64 * eps * float(want[1].abs().max())


def test_torch_compile_gives_the_eager_numbers():
    model = tiny("Qwen2.5 (+YaRN)")
    ids, pos = _ids(), torch.arange(SEQ)[None] + 2**20
    with rotary.hf.patched(model, angles="exact"):
        want = _logits(model, ids, pos)
        torch._dynamo.reset()
        compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = _logits(compiled, ids, pos)
    torch._dynamo.reset()
    assert torch.equal(got, want)


def test_gradient_checkpointing_gradients_unchanged_in_float32_mode():
    model = tiny("Gemma 3")
    model.activation_checkpointing_enable()
    model.train()
    ids, pos = _ids(), torch.arange(SEQ)[None] + 100

    def grads():
        model.zero_grad()
        model(input_ids=ids, position_ids=pos, labels=ids).loss.backward()
        return [p.grad.clone() for p in model.parameters() if p.grad is not None]

    want = grads()
    with rotary.hf.patched(model, angles="float32"):
        got = grads()
    assert len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


def test_bfloat16_model():
    # Loaded in bfloat16 (dtype=): transformers keeps its frequencies in float32, and so does the patch.
    f = BY_NAME["DeepSeek-V3"]
    cfg = F._config(F._tiny_dict(f))
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()
    ids, pos = _ids(), torch.arange(SEQ)[None] + 2**16
    want = _logits(model, ids, pos)
    assert want.dtype == torch.bfloat16
    with rotary.hf.patched(model, angles="float32"):
        assert torch.equal(_logits(model, ids, pos), want)
    with rotary.hf.patched(model, angles="exact"):  # cos/sin exact, then rounded to bfloat16
        assert _logits(model, ids, pos).dtype == torch.bfloat16


def test_model_cast_with_to_rotates_by_rounded_frequencies():
    # model.to(bfloat16) casts the inv_freq buffers too: transformers then rotates by frequencies
    # rounded to bfloat16.  float32 mode cannot reproduce that (refused, saying why); exact mode
    # serves the RoPE of the config, as a module freshly built from it computes.
    model = tiny("Qwen2.5 (+YaRN)").to(torch.bfloat16)
    emb, pos = model.model.rotary_emb, torch.arange(SEQ)[None] + 2**12
    x = torch.zeros(1, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"frequency buffers were cast to torch\.bfloat16.*angles='float32'"):
        rotary.hf.patch(model, angles="float32")
    rounded = emb(x, pos)[0]
    c, _ = rotary.hf.from_hf(model.config).cos_sin(pos, dtype=torch.float32, full=True)
    with rotary.hf.patched(model, angles="exact"):
        exact = emb(x, pos)[0]
    assert torch.equal(exact, c.to(torch.bfloat16))
    assert not torch.equal(rounded, exact)


def test_save_pretrained_writes_the_same_files(tmp_path):
    model = tiny("Phi-3 (LongRoPE)")
    model.save_pretrained(tmp_path / "plain")
    with rotary.hf.patched(model):
        model.save_pretrained(tmp_path / "patched")
    plain = sorted(p.name for p in (tmp_path / "plain").iterdir())
    assert plain == sorted(p.name for p in (tmp_path / "patched").iterdir())
    for name in plain:
        assert (tmp_path / "plain" / name).read_bytes() == (tmp_path / "patched" / name).read_bytes(), name
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "patched")
    assert not hasattr(reloaded, "rotary_patch")
    assert all("forward" not in vars(m) for m in reloaded.modules())


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_patched_model_copies_and_pickles(how):
    model = tiny("Gemma 3")
    ids, pos = _ids(), torch.arange(SEQ)[None] + 2**24
    plain = _logits(model, ids, pos)
    rotary.hf.patch(model)
    want = _logits(model, ids, pos)
    other = copy.deepcopy(model) if how == "deepcopy" else pickle.loads(pickle.dumps(model))
    assert torch.equal(_logits(other, ids, pos), want)
    assert [m.path for m in other.rotary_patch.modules] == ["model.rotary_emb"]
    rotary.hf.unpatch(other)
    assert torch.equal(_logits(other, ids, pos), plain)
    assert torch.equal(_logits(model, ids, pos), want)  # the original stays patched
