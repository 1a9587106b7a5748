"""``rotary.hf.patch`` on models as they are deployed (issue 44): cast after patching, unpatching a
part or a wrapper, accelerate's offload hooks, PEFT, dynamic NTK's state between calls."""

from __future__ import annotations

import pickle
import warnings

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import rotary  # noqa: E402

transformers.logging.set_verbosity_error()


def tiny(**rope):
    cfg = transformers.LlamaConfig(
        hidden_size=64,
        num_attention_heads=4,
        num_hidden_layers=2,
        intermediate_size=64,
        vocab_size=128,
        max_position_embeddings=32,
        **rope,
    )
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(cfg).eval()


def _pair(**rope):
    """A model and an unpatched twin with the same weights."""
    a, b = tiny(**rope), tiny(**rope)
    b.load_state_dict(a.state_dict())
    return a, b


def _ids(n: int = 8):
    return torch.randint(0, 128, (1, n), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("cast", ["bfloat16", "half"])
def test_a_cast_after_patching_follows_transformers_in_float32_mode(cast):
    # Issue 44, reproduction 1: patched with angles="float32", then .to(torch.bfloat16) or
    # .half(): the logits differed from the unpatched model cast the same way by 2e-3 (bf16) and
    # 2e-4 (fp16), even at positions 0 to 7 (transformers rotates by the cast inv_freq).
    model, twin = _pair()
    rotary.hf.patch(model, angles="float32")
    model = model.to(torch.bfloat16) if cast == "bfloat16" else model.half()
    twin = twin.to(torch.bfloat16) if cast == "bfloat16" else twin.half()
    with torch.no_grad():
        assert torch.equal(model(_ids()).logits, twin(_ids()).logits)
    assert model.rotary_patch.angles == "float32"


def test_dynamic_ntk_follows_transformers_state_between_calls_in_float32_mode():
    # Issue 44, reproduction 4: a 60-token call, then a 40-token call, both above
    # max_position_embeddings = 32: transformers keeps its grown frequencies between calls, and
    # the patched module did not (6e-4 apart on the second call).
    model, twin = _pair(rope_scaling={"rope_type": "dynamic", "factor": 2.0})
    rotary.hf.patch(model, angles="float32")
    with torch.no_grad():
        for n in (60, 40, 20, 50, 70, 33):
            assert torch.equal(model(_ids(n)).logits, twin(_ids(n)).logits), n


def test_unpatching_a_part_leaves_no_report_behind():
    # Issue 44, reproduction 2: patch(model); unpatch(model.model) restored the modules but left
    # model.rotary_patch, and unpatch(model) then said "not patched".
    model, twin = _pair()
    rotary.hf.patch(model)
    rotary.hf.unpatch(model.model)
    assert not hasattr(model, "rotary_patch")
    with pytest.raises(ValueError, match="not patched"):  # (true now: nothing is)
        rotary.hf.unpatch(model)
    with torch.no_grad():
        assert torch.equal(model(_ids()).logits, twin(_ids()).logits)
    # a patched model still pickles (the report and the modules travel together)
    rotary.hf.patch(model, angles="float32")
    again = pickle.loads(pickle.dumps(model))
    assert [m.path for m in again.rotary_patch.modules] == ["model.rotary_emb"]
    rotary.hf.unpatch(again)
    assert not hasattr(again, "rotary_patch")


def test_unpatching_the_peft_model_leaves_nothing_behind():
    # Issue 44, reproduction 2: patch, then peft.get_peft_model, then unpatch(peft_model) left
    # the report on the base model.
    peft = pytest.importorskip("peft")
    model = tiny()
    rotary.hf.patch(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pm = peft.get_peft_model(model, peft.LoraConfig(target_modules=["q_proj"], r=2))
    rotary.hf.unpatch(pm)
    assert not any(hasattr(m, "rotary_patch") for _, m in pm.named_modules())
    assert not hasattr(model, "rotary_patch")


def test_forwards_wrapped_by_accelerate_are_recognised():
    # Issue 44, reproduction 3: patch, then accelerate.cpu_offload(model), then unpatch(model)
    # raised "is not patched" (rotary's forward still ran, inside accelerate's _old_forward); a
    # second patch was then accepted, and unpatching it left the first one active.
    accelerate = pytest.importorskip("accelerate")
    model, twin = _pair()
    with torch.no_grad():
        before = twin(_ids(), position_ids=torch.arange(8)[None] + 2**24).logits
    rotary.hf.patch(model, angles="float32")
    accelerate.cpu_offload(model, execution_device=torch.device("cpu"))
    with pytest.raises(ValueError, match="already patched"):
        rotary.hf.patch(model)
    rotary.hf.unpatch(model)
    assert not hasattr(model, "rotary_patch")
    with pytest.raises(ValueError, match="not patched"):
        rotary.hf.unpatch(model)
    with torch.no_grad():
        assert torch.equal(model(_ids(), position_ids=torch.arange(8)[None] + 2**24).logits, before)


def _clvp():
    enc = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)
    enc["projection_dim"] = 16
    dec = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_mel_attn_blocks=1)
    cfg = transformers.ClvpConfig(text_config=enc, speech_config=dict(enc), decoder_config=dec)
    return transformers.ClvpModelForConditionalGeneration(cfg).eval()


def test_refusals_name_towers_truly():
    # Issue 44, reproduction 6: CLVP's text encoder was called "(a vision/audio tower)".
    with pytest.raises(ValueError) as e:
        rotary.hf.patch(_clvp())
    lines = {ln.split()[0]: ln for ln in str(e.value).splitlines() if "rotary_pos_emb" in ln}
    assert "(a vision/audio tower)" not in lines["text_encoder_model.rotary_pos_emb"]
    assert "(a vision/audio tower)" in lines["speech_encoder_model.rotary_pos_emb"]


@pytest.mark.parametrize("angles", ["exact", "float32"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_decoding_steps_fast_path_gives_the_generic_codes_bits(angles, dtype):
    # Issue 44, reproduction 5: a patched module's decoding step cost 4.9x the unpatched one
    # (150 us against 31 us); a few positions now read rows of a table of the generic code's own
    # outputs (benchmarks/hf_patch.py: "decoding step" rows).  Issue 49: past the first 4096
    # positions it cost 6.1x again (position 100,000); each block of 4096 positions has its
    # table.  The same bits, and arrays that own their memory; positions across two blocks or
    # negative take the generic code.
    llama3 = {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8}
    model = tiny(rope_scaling={**llama3, "low_freq_factor": 1.0, "high_freq_factor": 4.0})
    rotary.hf.patch(model, angles=angles)  # (then the cast: the order float32 mode takes)
    model = model.to(getattr(torch, dtype))
    module = model.model.rotary_emb
    x = torch.zeros(1, 1, 64, dtype=getattr(torch, dtype))
    steps = [[[0]], [[5]], [[4095]], [[4096]], [[7, 8, 9]], [[2**20]], [[100_000]], [[2**20 + 4095]]]
    steps += [[[4096 * 25 - 1, 4096 * 25]], [[-3]], [[2**35 + 7]], [[100_000], [100_001]], [[0, 2**20]]]
    for p in steps:
        pos = torch.tensor(p)
        fast = module(x, pos)
        with rotary.fast_paths(False):
            slow = module(x, pos)
        for a, b in zip(fast, slow, strict=True):
            assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), p
            assert a.untyped_storage().nbytes() == a.numel() * a.element_size()


def test_the_decoding_step_costs_the_same_few_kernels_at_every_position():
    """Issue 49: a patched module's decoding step at position 100,000 of a long context ran the
    exact angles' whole computation (some 60 kernels: 6.1x the unpatched module, 529 us against
    87 us), as only the first 4096 positions had rows; now the position read and two row copies,
    at any position."""
    from torch.profiler import profile

    llama3 = {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8}
    model = tiny(rope_scaling={**llama3, "low_freq_factor": 1.0, "high_freq_factor": 4.0})
    rotary.hf.patch(model, angles="exact")
    module = model.model.rotary_emb
    x = torch.zeros(1, 1, 64)
    counts = {}
    for p in (4095, 100_000, 2**20, 2**30 + 5):
        pos = torch.tensor([[p]])
        module(x, pos)  # (the block's table, built once)
        with torch.no_grad(), profile() as prof:
            module(x, pos)
        counts[p] = [e.name for e in prof.events() if e.name.startswith("aten::") and e.cpu_parent is None]
    assert all(c == counts[4095] for c in counts.values()) and len(counts[4095]) <= 5, counts


def test_roformer_the_model_rope_was_introduced_with_is_served():
    # Issue 44, reproduction 6: RoFormer was refused with "has no rotary embedding module".  Its
    # sinusoidal table ([sin | cos] of the interleaved pairs, float64 NumPy rounded) is rotary's
    # exact cos/sin bit for bit: served in both modes, equal to transformers inside the table
    # (prefill and generate with its cache) and past it, where the table ends in an index error.
    cfg = transformers.RoFormerConfig(
        hidden_size=64,
        num_attention_heads=2,
        num_hidden_layers=2,
        intermediate_size=32,
        vocab_size=64,
        embedding_size=64,
        max_position_embeddings=64,
        is_decoder=True,
    )
    torch.manual_seed(0)
    model = transformers.RoFormerForCausalLM(cfg).eval()
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = model(ids).logits
        gen = model.generate(ids, max_new_tokens=5, do_sample=False)
        with pytest.raises(IndexError):
            model(torch.zeros(1, 80, dtype=torch.long))
    for angles in ("exact", "float32"):
        rotary.hf.patch(model, angles=angles)
        assert [m.path for m in model.rotary_patch.modules] == ["roformer.encoder.embed_positions"]
        with torch.no_grad():
            assert torch.equal(model(ids).logits, ref)
            assert torch.equal(model.generate(ids, max_new_tokens=5, do_sample=False), gen)
            assert torch.isfinite(model(torch.zeros(1, 80, dtype=torch.long)).logits).all()
        rotary.hf.unpatch(model)
        with torch.no_grad():
            assert torch.equal(model(ids).logits, ref)
