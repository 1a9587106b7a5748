"""``rotary.hf.patch_linear_attention``: transformers' linear-attention layers on rotary's engine.

For every model type of the catalogue (``tests/hf_linear.py``: Gated DeltaNet, Kimi Delta
Attention, Mamba-2's SSD, Mamba's selective scan, MiniMax's lightning attention), a tiny
random-weight model (eager attention; flash-linear-attention and mamba_ssm absent, so
transformers runs its torch reference code) gives, patched, logits within float32 rounding of
its own: a prefill, a chunk continued from the cache, decoding token by token, and ``generate``
(greedy) giving the same tokens.  Unpatching restores transformers' functions (the same
objects); the families rotary cannot express are refused by name; a function that computes
something else under transformers' name is refused by the probe; packed documents, which
transformers' torch code refuses, are served; and a Qwen3.5 layer written in JAX with
``rotary.linear_attention`` gives the torch layer's outputs.
"""

from __future__ import annotations

import copy
import pickle
import re
import sys
import types

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import hf_linear as L  # noqa: E402

import rotary  # noqa: E402
from rotary.testing import assert_close  # noqa: E402

transformers.logging.set_verbosity_error()

#: Logits within this many float32 ulps of their scale (the largest logit): rounding, after the
#: layers' chunked and recurrent orders differ (measured: 11 at most over the catalogue).
ULPS = 64
N = 21


def tiny(model_type: str):
    """The catalogue's tiny random model of ``model_type`` (its causal LM, else its base model)."""
    fam = L.SERVED.get(model_type) or L.REFUSED[model_type]
    cfg = transformers.AutoConfig.for_model(model_type, **fam.models[model_type])
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    try:
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    except ValueError:
        model = transformers.AutoModel.from_config(cfg)
    return model.eval()


def _out(o):
    logits = getattr(o, "logits", None)
    return o.last_hidden_state if logits is None else logits


def _ids(batch: int = 2, n: int = N):
    return torch.randint(1, 128, (batch, n), generator=torch.Generator().manual_seed(1))


def run(model, model_type: str) -> dict:
    """The model's outputs: the whole prompt; the prompt through the cache (a prefill of 9, a
    chunk of 6 continued from the cache, then one token at a time); ``generate``'s tokens and
    logits (a batch of two, one row left-padded)."""
    ids = _ids()
    out = {}
    with torch.no_grad():
        out["prefill"] = _out(model(ids))
        o = model(ids[:, :9], use_cache=True)
        cache, steps = o.cache, [_out(o)]
        # (MiniMax's full attention misreads a chunk continued from its cache, patched or not)
        plan = (
            [(9, 10), (10, 11), (11, 12)]
            if model_type == "minimax"
            else [(9, 15), *((t, t + 1) for t in range(15, N))]
        )
        for a, b in plan:
            steps.append(_out(model(ids[:, a:b], cache=cache, use_cache=True)))
        out["cached"] = torch.cat(steps, 1)
        if model.can_generate():
            mask = torch.ones_like(ids[:, :12])
            mask[0, :3] = 0  # (a left-padded row)
            g = model.generate(
                ids[:, :12] * mask,
                attention_mask=mask,
                max_new_tokens=4,
                do_sample=False,
                output_logits=True,
                return_dict_in_generate=True,
                pad_token_id=0,
            )
            out["tokens"], out["generate"] = g.sequences, torch.stack(g.logits)
    return out


def _globals(model) -> dict:
    """transformers' recurrence functions as the modeling modules hold them, by identity."""
    mods = {sys.modules[type(m).__module__] for _, m in model.named_modules()}
    names = {n for f in L.FAMILIES for n in f.functions}
    return {(mod.__name__, n): id(getattr(mod, n)) for mod in mods for n in names if hasattr(mod, n)}


@pytest.mark.parametrize("model_type", sorted(L.SERVED))
def test_served_model_matches_transformers(model_type):
    fam = L.SERVED[model_type]
    model = tiny(model_type)
    functions = _globals(model)
    want = run(model, model_type)
    rotary.hf.patch_linear_attention(model)
    report = model.rotary_linear_patch
    assert report.layers and {layer.family for layer in report.layers} == {fam.name}
    if fam.functions != ("forward",):
        assert {n for layer in report.layers for n in layer.functions} <= set(fam.functions)
    got = run(model, model_type)
    assert _globals(model) == functions  # (nothing global changes)
    for key, ref in want.items():
        if key == "tokens":
            assert torch.equal(got[key], ref), (got[key], ref)
        else:
            assert_close(got[key], ref.numpy(), like=ref, ulps=ULPS, scale=float(ref.abs().max()))
    rotary.hf.unpatch_linear_attention(model)
    assert not hasattr(model, "rotary_linear_patch")
    for layer in report.layers:
        module = model.get_submodule(layer.path)
        for method in layer.methods:
            assert method not in vars(module)
            assert getattr(module, method).__func__ is getattr(type(module), method)
    assert _globals(model) == functions


#: One model type per family, for what is checked once per family.
ONE_PER_FAMILY = ("qwen3_next", "kimi_linear", "mamba2", "mamba", "minimax")


@pytest.mark.parametrize("model_type", ONE_PER_FAMILY)
def test_gradients_match_transformers(model_type):
    """Training (the fused kernels answer ``None`` as their torch fallback does, so Mamba's and
    Mamba-2's layers take the unfused path, whose scan is rotary's): every parameter's gradient
    within float32 rounding of the largest."""
    model = tiny(model_type).train()
    ids = _ids()

    def grads():
        model.zero_grad()
        _out(model(ids)).pow(2).mean().backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    want = grads()
    with rotary.hf.patched_linear_attention(model):
        got = grads()
    assert got.keys() == want.keys()
    scale = max(float(g.abs().max()) for g in want.values())
    for name, ref in want.items():
        assert_close(got[name], ref.numpy(), like=ref, ulps=ULPS, scale=scale)


@pytest.mark.parametrize("model_type", ["qwen3_next", "minimax"])
def test_bfloat16_model(model_type):
    """A bfloat16 model (MiniMax's decay tables rounded to bfloat16, rotary's decay per step
    from the rounded slope; the delta rule's sums in float32 in both): logits within bfloat16
    rounding, the same tokens."""
    model = tiny(model_type).to(torch.bfloat16)
    want = run(model, model_type)
    with rotary.hf.patched_linear_attention(model):
        got = run(model, model_type)
    assert torch.equal(got["tokens"], want["tokens"])
    eps = float(torch.finfo(torch.bfloat16).eps)
    for key in ("prefill", "cached", "generate"):  # (generate's logits come back in float32)
        ref = want[key].float()
        assert_close(got[key], ref.numpy(), like=want[key], ulps=0, atol=2 * eps * float(ref.abs().max()))


def test_unpatch_restores_transformers_functions_and_other_models_are_untouched():
    a, b = tiny("qwen3_next"), tiny("qwen3_next")
    layer_a, layer_b = a.model.layers[0].linear_attn, b.model.layers[0].linear_attn
    mod = sys.modules[type(layer_a).__module__]
    chunk, recurrent = mod.torch_chunk_gated_delta_rule, mod.torch_recurrent_gated_delta_rule
    x = torch.randn(1, 7, 64, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        before = layer_b(x)
        with rotary.hf.patched_linear_attention(a) as report:
            assert [layer.path for layer in report.layers] == ["model.layers.0.linear_attn"]
            assert "forward" in vars(layer_a) and "forward" not in vars(layer_b)
            assert (
                mod.torch_chunk_gated_delta_rule is chunk
                and mod.torch_recurrent_gated_delta_rule is recurrent
            )
            assert torch.equal(layer_b(x), before)  # the same class, another model: transformers' code
        assert "forward" not in vars(layer_a) and not hasattr(a, "rotary_linear_patch")
        assert layer_a.forward.__func__ is type(layer_a).forward
        with pytest.raises(ValueError, match="not patched"):
            rotary.hf.unpatch_linear_attention(a)


def test_combines_with_rotarys_rope():
    """``rotary.hf.patch`` (RoPE in the attention layers) and ``patch_linear_attention`` (the
    linear-attention layers) on one model, each undone by its own unpatch."""
    model = tiny("qwen3_next")
    ids = _ids()
    with torch.no_grad():
        want = _out(model(ids))
        rotary.hf.patch_linear_attention(rotary.hf.patch(model, angles="float32"))
        assert [m.path for m in model.rotary_patch.modules] == ["model.rotary_emb"]
        assert [m.path for m in model.rotary_linear_patch.layers] == ["model.layers.0.linear_attn"]
        got = _out(model(ids))
        rotary.hf.unpatch_linear_attention(rotary.hf.unpatch(model))
        assert torch.equal(_out(model(ids)), want)
    assert_close(got, want.numpy(), like=want, ulps=ULPS, scale=float(want.abs().max()))


def test_patched_model_pickles_and_deep_copies():
    model = rotary.hf.patch_linear_attention(tiny("mamba2"))
    ids = _ids(1, 9)
    with torch.no_grad():
        want = _out(model(ids))
        for other in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
            assert [m.path for m in other.rotary_linear_patch.layers] == [
                m.path for m in model.rotary_linear_patch.layers
            ]
            assert torch.equal(_out(other(ids)), want)
            rotary.hf.unpatch_linear_attention(other)
    with pytest.raises(ValueError, match="already patched"):
        rotary.hf.patch_linear_attention(model)


def test_accelerate_hooks():
    """A layer wrapped by accelerate's hooks (``device_map``, offloading): served through the
    hook's ``_old_forward``, and restored there."""
    hooks = pytest.importorskip("accelerate.hooks")
    model = tiny("mamba2")
    layer = model.backbone.layers[0].mixer
    hooks.add_hook_to_module(layer, hooks.ModelHook())
    ids = _ids()
    with torch.no_grad():
        want = _out(model(ids))
        rotary.hf.patch_linear_attention(model)
        assert type(vars(layer)["_old_forward"]).__name__ == "LinearForward"
        got = _out(model(ids))
        rotary.hf.unpatch_linear_attention(model)
        assert vars(layer)["_old_forward"].__func__ is type(layer).forward
    assert_close(got, want.numpy(), like=want, ulps=ULPS, scale=float(want.abs().max()))


@pytest.mark.parametrize("model_type", sorted(L.REFUSED))
def test_refused_by_name(model_type):
    fam = L.REFUSED[model_type]
    model = tiny(model_type)
    with pytest.raises(ValueError, match=rf"(?s){model_type!r}, {re.escape(fam.name)}.*{fam.reason}"):
        rotary.hf.patch_linear_attention(model)
    with pytest.raises(ValueError, match=re.escape(fam.name)):
        rotary.hf.patch_linear_attention(model, strict=False)  # (nothing it could serve)
    assert not hasattr(model, "rotary_linear_patch")
    assert not any(isinstance(f, rotary.hf.LinearPatchReport) for f in vars(model).values())


def test_strict_false_serves_the_others_and_lists_what_it_kept():
    both = torch.nn.ModuleDict({"ssd": tiny("mamba2"), "rwkv": tiny("rwkv")})
    with pytest.raises(ValueError, match=r"(?s)rwkv\.blocks\.0\.attention \(RwkvSelfAttention.*RWKV \(v4\)"):
        rotary.hf.patch_linear_attention(both)
    report = rotary.hf.patch_linear_attention(both, strict=False).rotary_linear_patch
    assert [m.path for m in report.layers] == ["ssd.backbone.layers.0.mixer", "ssd.backbone.layers.1.mixer"]
    assert [p for p, _ in report.kept] == ["rwkv.rwkv.blocks.0.attention", "rwkv.rwkv.blocks.1.attention"]
    assert "kept rwkv.rwkv.blocks.0.attention: RWKV (v4)" in str(report)
    rotary.hf.unpatch_linear_attention(both)


def test_not_a_linear_attention_model():
    cfg = transformers.LlamaConfig(
        hidden_size=32, num_attention_heads=2, num_hidden_layers=1, intermediate_size=32, vocab_size=64
    )
    with pytest.raises(ValueError, match="no linear-attention layer"):
        rotary.hf.patch_linear_attention(transformers.AutoModelForCausalLM.from_config(cfg))
    with pytest.raises(TypeError, match="transformers"):
        rotary.hf.patch_linear_attention(object())


# -- layers written here: the probe, and what transformers' torch code refuses --------------------
def _layer_module(name: str, fn, call: str) -> type:
    """A layer class (``Layer``) in a module of its own whose forward calls ``fn`` under
    transformers' ``name``: ``call`` is its return expression."""
    mod = types.ModuleType("hf_linear_probe_layer")
    setattr(mod, name, fn)
    code = (
        "import torch\n"
        "class Layer(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.w = torch.nn.Parameter(torch.ones(()))\n"
        "    def forward(self, *args, **kw):\n"
        f"        return {call}\n"
    )
    exec(compile(code, "<hf_linear_probe_layer>", "exec"), mod.__dict__)
    return mod.Layer


def _gdn_layer(rule) -> type:
    call = "torch_chunk_gated_delta_rule(*args, use_qk_l2norm_in_kernel=True, **kw)"
    return _layer_module("torch_chunk_gated_delta_rule", rule, call)


def _gdn():
    from transformers.models.qwen3_next import modeling_qwen3_next as qn

    return qn.torch_chunk_gated_delta_rule


def _inputs(n=13, hk=2, hv=4, d=8):
    g = torch.Generator().manual_seed(4)
    q, k = torch.randn(1, n, hk, d, generator=g), torch.randn(1, n, hk, d, generator=g)
    v = torch.randn(1, n, hv, d, generator=g)
    return q, k, v, -torch.rand(1, n, hv, generator=g), torch.rand(1, n, hv, generator=g)


def test_a_function_that_differs_is_refused_by_the_probe():
    ref = _gdn()

    def doubled(query, key, value, g, beta, **kw):  # the queries scaled twice
        out, state = ref(query, key, value, g=g, beta=beta, **kw)
        return out * 2.0, state

    with pytest.raises(ValueError, match=r"(?s)\(Layer, .*Gated DeltaNet.*does not match transformers'"):
        rotary.hf.patch_linear_attention(_gdn_layer(doubled)())
    layer = _gdn_layer(ref)()  # transformers' own function under its name: served
    x = _inputs()
    with torch.no_grad():
        want, _ = layer(*x)
        rotary.hf.patch_linear_attention(layer)
        got, _ = layer(*x)
    assert_close(got, want.numpy(), like=want, ulps=ULPS, scale=float(want.abs().max()))


def test_packed_documents_which_transformers_torch_code_refuses():
    """flash-linear-attention's ``cu_seqlens`` (the delta rule: each document's output and final
    state, as separate calls give them) and mamba_ssm's ``seq_idx`` (the SSD)."""
    layer = _gdn_layer(_gdn())()
    q, k, v, g, beta = _inputs()
    cu = torch.tensor([0, 5, 13])
    with torch.no_grad():
        with pytest.raises(ValueError, match="packed sequences"):
            layer(q, k, v, g, beta, cu_seqlens=cu)
        parts = [
            layer(*(x[:, a:b] for x in (q, k, v, g, beta)), output_final_state=True)
            for a, b in ((0, 5), (5, 13))
        ]
        rotary.hf.patch_linear_attention(layer)
        out, states = layer(q, k, v, g, beta, cu_seqlens=cu, output_final_state=True)
    want = torch.cat([p[0] for p in parts], 1)
    assert_close(out, want.numpy(), like=want, ulps=ULPS, scale=float(want.abs().max()))
    want_states = torch.cat([p[1] for p in parts], 0)  # (documents, value heads, d_k, d_v)
    assert_close(states, want_states.numpy(), like=want, ulps=ULPS, scale=float(want_states.abs().max()))

    from transformers.models.mamba2 import modeling_mamba2 as m2

    ssd = _layer_module("mamba2_chunk_scan", m2.mamba2_chunk_scan, "mamba2_chunk_scan(*args, **kw)")()
    g = torch.Generator().manual_seed(6)
    x, dt = torch.randn(1, 13, 4, 3, generator=g), torch.randn(1, 13, 4, generator=g)
    B, C = torch.randn(1, 13, 2, 5, generator=g), torch.randn(1, 13, 2, 5, generator=g)
    A, D = -torch.rand(4, generator=g) - 0.1, torch.randn(4, generator=g)
    kw = {"D": D, "dt_bias": torch.randn(4, generator=g), "dt_softplus": True, "return_final_states": True}
    seq_idx = torch.tensor([[0] * 5 + [1] * 8], dtype=torch.int32)
    with torch.no_grad():
        with pytest.raises(ValueError, match="packed sequences"):
            ssd(x, dt, A, B, C, 4, seq_idx=seq_idx, **kw)
        parts = [ssd(x[:, a:b], dt[:, a:b], A, B[:, a:b], C[:, a:b], 4, **kw) for a, b in ((0, 5), (5, 13))]
        rotary.hf.patch_linear_attention(ssd)
        out, state = ssd(x, dt, A, B, C, 4, seq_idx=seq_idx, **kw)
    want = torch.cat([p[0] for p in parts], 1)
    assert_close(out, want.numpy(), like=want, ulps=ULPS, scale=float(want.abs().max()))
    assert_close(state, parts[1][1].numpy(), like=want, ulps=ULPS, scale=float(parts[1][1].abs().max()))


# -- the same layer in JAX -------------------------------------------------------------------------
def test_qwen3_5_layer_in_jax_gives_the_torch_layers_outputs():
    """The docs' port (docs/guides/porting.rst): a Qwen3.5 Gated DeltaNet layer, written in JAX
    around one ``rotary.linear_attention`` call, gives the torch layer's outputs (under
    ``jax.jit``)."""
    pytest.importorskip("jax")
    import functools

    import jax
    import jax.numpy as jnp

    torch_layer = tiny("qwen3_5_text").model.layers[0].linear_attn
    x = torch.randn(2, 19, 64, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        want = torch_layer(x)
    p = {name: jnp.asarray(t.detach().numpy()) for name, t in torch_layer.state_dict().items()}
    layer = jax.jit(functools.partial(qwen3_5_gated_deltanet, hk=2, hv=4, dk=16, dv=8))  # (one compile)
    got = layer(p, jnp.asarray(x.numpy()))
    assert_close(got, want.numpy(), like=got, ulps=ULPS, scale=float(want.abs().max()))


def qwen3_5_gated_deltanet(p, x, *, hk, hv, dk, dv, eps=1e-6):
    """Qwen3.5's ``Qwen3_5GatedDeltaNet.forward`` (no cache) in JAX: the projections, the causal
    depthwise convolution, the gates, rotary's gated delta rule, the gated RMS norm."""
    import jax
    import jax.numpy as jnp

    b, n, _ = x.shape
    w = p["conv1d.weight"][:, 0, :]  # (channels, kernel)
    xs = x @ p["in_proj_qkv.weight"].T
    pad = jnp.pad(xs, ((0, 0), (w.shape[1] - 1, 0), (0, 0)))
    xs = jax.nn.silu(sum(pad[:, j : j + n] * w[:, j] for j in range(w.shape[1])))
    q, k, v = jnp.split(xs, [hk * dk, 2 * hk * dk], axis=-1)
    heads = lambda t, h, d: t.reshape(b, n, hk, h // hk, d).transpose(0, 2, 3, 1, 4)  # noqa: E731
    beta = jax.nn.sigmoid(x @ p["in_proj_b.weight"].T)
    g = -jnp.exp(p["A_log"]) * jax.nn.softplus(x @ p["in_proj_a.weight"].T + p["dt_bias"])
    gates = lambda t: t.reshape(b, n, hk, hv // hk).transpose(0, 2, 3, 1)  # noqa: E731
    # each key head serves hv / hk value heads (broadcast, as gates and beta are per value head)
    k = jnp.broadcast_to(heads(k, hk, dk), (b, hk, hv // hk, n, dk))
    o = rotary.linear_attention(
        heads(q, hk, dk), k, heads(v, hv, dv), causal=True, normalize=False,
        log_gate=gates(g), beta=gates(beta), qk_l2norm=True, scale=dk**-0.5,
    )  # fmt: skip
    o = o.transpose(0, 3, 1, 2, 4).reshape(b, n, hv, dv)
    z = (x @ p["in_proj_z.weight"].T).reshape(b, n, hv, dv)
    o = o * jax.lax.rsqrt(jnp.mean(o * o, axis=-1, keepdims=True) + eps) * p["norm.weight"] * jax.nn.silu(z)
    return o.reshape(b, n, hv * dv) @ p["out_proj.weight"].T


def test_family_table_is_generated():
    """docs/guides/hf_linear.rst is the catalogue's own table."""
    import pathlib

    page = pathlib.Path(__file__).parent.parent / "docs" / "guides" / "hf_linear.rst"
    hint = f"regenerate: python tests/hf_linear.py --rst {page}"
    assert page.read_text(encoding="utf-8") == L.rst(), hint


def test_every_catalogued_model_type_is_one_of_this_transformers():
    known = transformers.models.auto.configuration_auto.CONFIG_MAPPING_NAMES
    assert set(L.SERVED) | set(L.REFUSED) <= set(known)
    assert not np.intersect1d(sorted(L.SERVED), sorted(L.REFUSED)).size
