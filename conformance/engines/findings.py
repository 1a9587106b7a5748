"""What the field report found: each disagreement between an engine and rotary, classified, with
its minimal upstream reproduction (``docs/field/repro/<engine>/``: the engine, torch or JAX and
NumPy only, against a float64 formula written out in the script, and the output it printed).

A disagreement is a bug in the engine, a documented design choice of the engine, a limitation of
the test environment (CPU, Triton's interpreter), or a bug in rotary (none so far: each of the
engines' numbers was checked against the published formula, and against ``transformers`` where it
implements the family).  ``tests/test_field_report.py`` checks that every failed cell of the
committed report is explained by a finding naming its case, and that every reproduction exists.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

__all__ = ["FINDINGS", "Finding"]

Kind = Literal["engine bug", "design choice", "test environment", "rotary bug"]


@dataclasses.dataclass(frozen=True)
class Finding:
    engine: str  # the adapter module
    title: str
    kind: Kind
    cases: tuple[str, ...]  # the cases of the matrix it explains (none: found outside the matrix)
    detail: str
    repro: str  # under docs/field/repro/
    upstream: str = ""


FINDINGS: tuple[Finding, ...] = (
    Finding(
        "vllm",
        "Ministral 3 from its Hugging Face config gets no Llama 4 query scale",
        "engine bug",
        ("yarn_mscale",),
        "``MistralAttention`` turns the query scale on only for a top-level ``llama_4_scaling`` "
        "mapping, which only vLLM's Mistral-format (``params.json``) reader creates; it never reads "
        "``rope_parameters['llama_4_scaling_beta']``.  Queries (and logits) are off by 6.9% at "
        "position 16384, 16.1% at 65536, 27.7% at 262143.  The YaRN half of the same report "
        "(``mscale``/``mscale_all_dim`` ignored, a 27% attention-factor error) is fixed in 0.33.0: "
        "the factor is 1.0 as the config implies.",
        "vllm/repro_ministral3_llama4.py",
        "vllm-project/vllm#48621 (open; fix in #48629)",
    ),
    Finding(
        "vllm",
        "dynamic NTK: the cos/sin table is half the length vLLM serves",
        "engine bug",
        ("dynamic",),
        "For ``{type: dynamic, factor: 2}`` on a 4096-position model vLLM serves ``max_model_len`` "
        "8192 but builds ``DynamicNTKScalingRotaryEmbedding``'s table for 4096 positions: positions "
        "4096-8191 raise ``IndexError`` on the CPU (an out-of-bounds read on a GPU).  Inside the "
        "table the base is not scaled at any length.",
        "vllm/repro_dynamic_ntk_table.py",
        "vllm-project/vllm#55910 (open)",
    ),
    Finding(
        "vllm",
        "LongRoPE picks short or long factors once per model load",
        "design choice",
        ("longrope",),
        "``Phi3LongRoPEScaledRotaryEmbedding`` uses the long factors whenever ``max_model_len`` "
        "exceeds ``original_max_position_embeddings`` (a code comment and the warning vLLM prints at "
        "load say so), not per sequence as transformers does: with ``--max-model-len 131072`` short "
        "prompts get long factors.  With the default ``max_model_len`` (4096) the table has 4096 "
        "rows and a position past it silently reads another row (no bounds check; vLLM's scheduler "
        "never sends one).",
        "vllm/repro_longrope_factors.py",
    ),
    Finding(
        "megatron",
        "Megatron-Bridge's YaRN mapping leaves absent keys unset",
        "engine bug",
        ("yarn",),
        "The generic YaRN mapping copies only the keys a config has: without ``beta_fast``, "
        "``beta_slow`` and ``truncate`` (Qwen2.5's model-card ``rope_scaling``) the provider's "
        "``yarn_beta_fast``/``yarn_beta_slow`` stay ``None`` (``YarnRotaryEmbedding`` raises "
        "``TypeError``) and ``yarn_correction_range_round_to_int=None`` skips the rounding "
        "transformers does by default (ramp 23.6-39.65 instead of 23-40: 18.6 rad at 131071).",
        "megatron/repro_yarn_absent_keys.py",
        "related: NVIDIA-NeMo/Megatron-Bridge#5627",
    ),
    Finding(
        "megatron",
        "Ministral 3's YaRN ramp is not rounded",
        "engine bug",
        ("yarn_mscale",),
        "``Ministral3ModelProvider`` hard-codes ``yarn_correction_range_round_to_int=False``; the "
        "config has no ``truncate`` key, so transformers rounds the ramp's bounds (and Megatron with "
        "rounding on matches it exactly).  Frequencies 20-37 differ by up to 25%: 0.2 rad at "
        "position 1000, 54 rad at 262143.",
        "megatron/repro_ministral3_truncate.py",
    ),
    Finding(
        "megatron",
        "Ministral 3's query scale is computed from the token's index, not its position",
        "engine bug",
        ("yarn_mscale",),
        "``MinistralTEDotProductAttention`` forms the Llama 4 query scale from "
        "``torch.arange(query.shape[0])``: decoding one token scales it by 1.0 where transformers "
        "gives 1.069 at position 16384 and 1.277 at 262143; context parallelism and packed batches "
        "shift it too.  The reproduction quotes the Bridge's code (its module imports Transformer "
        "Engine's attention).",
        "megatron/repro_ministral3_query_scale.py",
    ),
    Finding(
        "megatron",
        "Megatron-Bridge's Llama mapping drops dynamic NTK",
        "engine bug",
        ("dynamic",),
        "``LlamaBridge`` builds plain RoPE for ``rope_type: dynamic`` (core Megatron has no dynamic "
        "NTK) without a warning: right while a sequence fits 4096 tokens, 343 rad off at 8192.",
        "megatron/repro_llama_dynamic_dropped.py",
    ),
    Finding(
        "transformer_engine",
        "``seq_len_interpolation_factor`` is ignored unless ``pretrained_max_position_embeddings`` is set",
        "engine bug",
        ("linear", "layer_types"),
        "``RotaryPositionEmbedding`` documents ``seq_len_interpolation_factor`` as linear "
        "interpolation, but applies it only with ``pretrained_max_position_embeddings`` too (a NeMo "
        "'dynamic linear scaling' in the code): given alone, the angles are those of no scaling.  "
        "With both set, a position's angle depends on the length of the table built.",
        "transformer_engine/repro_interpolation_factor_ignored.py",
        "docstring and code disagree since NVIDIA/TransformerEngine#453",
    ),
    Finding(
        "flash_attn",
        "the Hugging Face Llama converter ignores ``rope_theta`` and ``rope_scaling``",
        "engine bug",
        ("linear", "dynamic", "llama3"),
        "``llama_config_to_gpt2_config`` never reads them: every Hugging Face-format Llama runs "
        "at base 10000 with no scaling (only the Meta-checkpoint loader sets the base); Llama 2 "
        "passes because its base is 10000.  Up to 3.1 rad against Llama 3.1.",
        "flash_attn/repro_llama_hf_config.py",
    ),
    Finding(
        "flash_attn",
        "the GPT-NeoX converter reads attributes transformers 5 removed",
        "engine bug",
        ("partial_neox",),
        "``gpt_neox_config_to_gpt2_config`` reads ``rotary_emb_base`` and ``rotary_pct``, gone "
        "from ``GPTNeoXConfig`` in transformers 5: ``AttributeError``.  With transformers 4.57.1 the "
        "converter works and Pythia passes.",
        "flash_attn/repro_gpt_neox_transformers5.py",
    ),
    Finding(
        "flash_attn",
        "decoding offsets past the cos/sin table come back unrotated",
        "engine bug",
        (),
        "In the KV-cache path (tensor ``seqlen_offsets``) a position at or past the table's end is "
        "loaded with the mask's fill values, cos 1 and sin 0: the token is not rotated, silently "
        "(the integer-offset path asserts instead).  The adapter sizes the table to cover every "
        "position, so the matrix does not see it.",
        "flash_attn/repro_offsets_past_table.py",
    ),
    Finding(
        "liger",
        "the Qwen2-VL M-RoPE kernel is unreachable under transformers 5",
        "engine bug",
        (),
        "``apply_liger_kernel_to_qwen2_vl`` raises ``ImportError`` before patching, and the function "
        "it patches (``apply_multimodal_rotary_pos_emb``) is gone from transformers "
        "(huggingface/transformers#48105): a Qwen2-VL model calls liger's kernel 0 times.  The "
        "kernel itself is right: the adapter calls it as the old call site did, and it passes.",
        "liger/repro_qwen2vl_mrope_patch.py",
    ),
    Finding(
        "liger",
        "dynamic NTK keeps a longer call's frequencies (transformers' stateful module)",
        "design choice",
        ("dynamic",),
        "liger's cos and sin come from transformers' ``LlamaRotaryEmbedding``, whose dynamic NTK grows "
        "``inv_freq`` for a call longer than ``max_position_embeddings`` and resets it only for a call "
        "*shorter* than it: a later call of 4096 or 4097 tokens (Llama 2, factor 2) after a longer one "
        "is rotated with the longer call's frequencies (cos off by 2.0 against its own length's; a "
        "fresh module, or a call of 100 tokens first, gives its own).  The kit's calls of 4096 and "
        "4097 tokens come after its long ones.",
        "liger/repro_dynamic_kept.py",
    ),
    Finding(
        "liger",
        "bfloat16 cannot be checked in Triton's interpreter",
        "test environment",
        (),
        "liger computes in the cos/sin dtype; Triton's CPU interpreter runs bfloat16 arithmetic on "
        "the raw bits (errors near 1e35; triton-lang/triton#4972).  The adapter refuses bfloat16 "
        "without CUDA (n/s), and checks float16, which the interpreter computes correctly.",
        "liger/repro_interpreter_bf16.py",
    ),
    Finding(
        "torchtune",
        "past ``max_seq_len`` the cache raises, though the docstring says it is recomputed",
        "design choice",
        (),
        "``RotaryPositionalEmbeddings`` documents that the cached frequencies are recomputed when "
        "exceeded; any position >= ``max_seq_len`` raises ``IndexError`` instead.  It fails safely "
        "(the kit accepts a refusal past the config's context).",
        "torchtune/repro_table_overflow.py",
    ),
    Finding(
        "torchtitan",
        "the shared attention drops YaRN's attention factor",
        "engine bug",
        ("yarn",),
        "``rope.py`` says the model folds YaRN's ``mscale`` into the softmax scale, but only the "
        "gpt-oss and DeepSeek-V3 model files do; the shared ``common/attention.py`` (Llama 3, "
        "Qwen3) does not: logits 1.2965x too small for factor 4 (the frequencies are right).",
        "torchtitan/repro_yarn_attention_factor.py",
    ),
    Finding(
        "torchtitan",
        "the DeepSeek-V3 flavor's table stops at 16384 positions",
        "design choice",
        ("yarn_mla",),
        "The ``671B`` flavor builds its YaRN table for ``4096 * 4`` positions, the default of "
        "DeepSeek's reference inference code, where the config claims 163840 (YaRN factor 40 over "
        "4096): positions from 16384 on raise.  It refuses, never answers wrong; a long-context "
        "run needs the flavor edited.",
        "torchtitan/repro_deepseek_table.py",
    ),
    Finding(
        "torchtitan",
        "the Qwen3 8B flavor has no YaRN, and its table stops at 40960 positions",
        "design choice",
        ("yarn_original",),
        "torchtitan reads no ``config.json``: a checkpoint runs with its registered flavor, and the "
        "``qwen3`` ``8B`` flavor is plain RoPE with a 40960-position table.  Qwen3-8B's model card "
        "serves 131072 tokens with YaRN (factor 4 over 32768): with the flavor as registered, pairs "
        "24..63 turn up to 4x faster than YaRN's from position 1 on, cos and sin lack its attention "
        "factor 1.1386, and positions from 40960 on raise.  A long-context run needs the flavor edited "
        "(which then meets the shared attention's missing factor: the finding on ``yarn``).",
        "torchtitan/repro_qwen3_flavor_no_yarn.py",
    ),
    Finding(
        "torchtitan",
        "the Llama 3.2 1B/3B flavors keep factor 8",
        "engine bug",
        (),
        "The ``llama3`` flavors ``1B`` and ``3B`` have Llama 3.2's shapes but ``scaling_factor`` 8 "
        "instead of 32: 2.5-3.1 rad at position 65536 (the same bug as meta-llama/llama-models#241).",
        "torchtitan/repro_llama32_factor.py",
    ),
    Finding(
        "litgpt",
        "YaRN: the ramp inverted, the attention factor 1, ``truncate`` dropped",
        "engine bug",
        ("yarn", "yarn_original", "yarn_no_truncate", "yarn_mla"),
        "``build_rope_cache`` divides the high-frequency pairs by the factor and keeps the low ones "
        "(the reverse of YaRN; equal to it with the ramp reversed, to 1.7e-7); without ``mscale`` "
        "keys the attention factor is 1 (transformers: 0.1 ln s + 1); ``GPT.rope_cache`` forwards no "
        "``truncate``; and every ``CausalSelfAttention``, not only MLA's, multiplies the softmax "
        "scale by ``mscale(s, mscale_all_dim)**2``.  litgpt's own test feeds litgpt's tables to both "
        "sides, which is how this got through.  On Qwen3-8B's 128K YaRN (``yarn_original``) the "
        "registry's ``block_size`` 40960 also refuses positions from 40960 on.",
        "litgpt/repro_yarn.py",
    ),
    Finding(
        "litgpt",
        "Phi-3-mini-128k runs without LongRoPE",
        "engine bug",
        ("longrope",),
        "The registry entry has ``block_size`` 131072 but litgpt has no LongRoPE: the checkpoint "
        "runs as plain RoPE with attention factor 1 instead of 1.19.",
        "litgpt/repro_phi3_longrope.py",
    ),
    Finding(
        "maxtext",
        "the YaRN table clamps every position past ``max_position_embeddings``",
        "design choice",
        ("yarn", "yarn_original", "yarn_no_truncate", "yarn_mla"),
        "``YarnRotaryEmbedding`` precomputes ``freqs_cis`` for ``max_position_embeddings`` rows and "
        "gathers with ``.at[pos].get()``, which JAX clamps: every position at or past the table "
        "rotates as its last row, silently.  Qwen2.5's config says 32768 and Qwen3-8B's 40960, "
        "though the YaRN of their model cards targets 128K.",
        "maxtext/repro_yarn_table.py",
    ),
    Finding(
        "maxtext",
        "M-RoPE is Qwen3-VL's interleaved layout only",
        "design choice",
        ("mrope",),
        "MaxText's one M-RoPE interleaves the sections round robin (Qwen3-VL); Qwen2-VL's "
        "consecutive sections get the wrong rows at image positions (error near 2; text positions, "
        "all rows equal, pass).",
        "maxtext/repro_mrope_layout.py",
    ),
    Finding(
        "maxtext",
        "Llama 3 scaling constants are hard-coded",
        "engine bug",
        (),
        "``LLaMARotaryEmbedding._apply_scaling_factor`` fixes factor 8, low 1, high 4 and 8192: a "
        "Llama 3.2 config (factor 32) gets factor 8.",
        "maxtext/repro_llama3_hardcoded.py",
    ),
    Finding(
        "mlx_lm",
        "``YarnRoPE`` ignores ``truncate``",
        "engine bug",
        ("yarn_no_truncate",),
        "The correction range is always floored and ceiled, so gpt-oss's ``truncate: false`` is "
        "lost from position 1 on (vLLM and sglang fixed the same: vllm-project/vllm#28244, "
        "sgl-project/sglang#14270).",
        "mlx_lm/repro_yarn_truncate.py",
    ),
    Finding(
        "mlx_lm",
        "``SuScaledRoPE`` never uses ``short_factor``",
        "engine bug",
        ("longrope",),
        "The long factors apply at every length (ml-explore/mlx-lm#660, marked merged, is not in "
        "0.32.2's code): error 6.5 with the short factors' truth at short lengths.",
        "mlx_lm/repro_longrope_short.py",
    ),
    Finding(
        "keras_hub",
        "``convert_qwen`` drops ``rope_scaling``",
        "engine bug",
        ("yarn",),
        "Qwen2.5's 128K YaRN loads as plain RoPE: wrong at every position.",
        "keras_hub/repro_qwen_yarn.py",
    ),
    Finding(
        "keras_hub",
        "GPT-NeoX rotates the decoding query at position 0",
        "engine bug",
        (),
        "``GPTNeoXAttention.call`` passes no ``start_index`` to its rotary embedding, so cached "
        "decoding rotates each new query at 0 (logits off by 0.17 at t=15).  The prefill the "
        "matrix checks passes.",
        "keras_hub/repro_neox_decode.py",
        "keras-team/keras-hub#2870 (open)",
    ),
    Finding(
        "keras_hub",
        "``RotaryEmbedding(rope_type='dynamic')`` is not transformers' dynamic NTK",
        "design choice",
        (),
        "It rescales the frequencies at every length (error near 5 at 100 tokens against "
        "transformers' formula); no Hugging Face converter uses it.",
        "keras_hub/repro_dynamic.py",
    ),
    Finding(
        "executorch",
        "LongRoPE picks short or long factors once, by the length of the cos/sin table",
        "design choice",
        ("longrope",),
        "``hf_precompute_freqs_cis`` uses the long factors whenever the table it builds has more "
        'rows than ``original_max_position_embeddings`` (its comment: "Selection mirrors HF", '
        "with the table's length as the sequence length), not per sequence as transformers does: "
        "an export for Phi-4-mini's full context (``max_context_len`` 131072) rotates prompts "
        "shorter than 4096 with the long factors (2.3 rad off at position 5, 7.6 at 2047).  One "
        "static table is what an exported graph keeps (as vLLM does per load).",
        "executorch/repro_longrope_factors.py",
    ),
    Finding(
        "executorch",
        'the doubled "sharded checkpoint" table switches LongRoPE to its long factors',
        "engine bug",
        (),
        "``Rope`` builds ``2 * max_context_len`` rows whenever ``ffn_dim_multiplier`` is set, and "
        "``phi_4_mini/config/config.json`` sets it (to 1): an export with ``max_context_len`` "
        "4096, the original context, which no sequence can pass, gets an 8192-row table and so the "
        "long factors at every position (8.3 rad off at position 2047 against transformers' short "
        "ones); only a context up to 2048 gets the short factors.",
        "executorch/repro_longrope_factors.py",
    ),
    Finding(
        "ggml",
        "YaRN ignores ``truncate``",
        "engine bug",
        ("yarn_no_truncate",),
        "``ggml_rope_yarn_corr_dims`` always floors and ceils the correction range, and "
        "``convert_hf_to_gguf.py`` writes no ``truncate`` key, so gpt-oss's ``truncate: false`` is "
        "lost: pairs 9-17 turn at 0.997x to 1.76x transformers' rates from position 1 on (error 2.8 "
        "at position 4096).  vLLM and sglang fixed the same "
        "(vllm-project/vllm#28244, sgl-project/sglang#14270); no llama.cpp report found.",
        "ggml/repro_yarn_truncate.py",
    ),
    Finding(
        "ggml",
        "dynamic NTK converts to plain RoPE",
        "engine bug",
        ("dynamic",),
        "``TextModel.set_gguf_parameters`` passes over ``rope_type: dynamic`` (a comment says "
        "HunYuan handles it in its model class) and llama.cpp has no dynamic-NTK scaling type: a "
        "Llama checkpoint with dynamic NTK becomes a GGUF with no RoPE scaling, silently (other "
        "unknown types log a warning).  Up to ``max_position_embeddings`` that is transformers' "
        "result; with a larger context (``-c 8192``) every position of a longer sequence is off "
        "(error 6.4 at position 100 of 8192 tokens).",
        "ggml/repro_dynamic_dropped.py",
    ),
    Finding(
        "ggml",
        "LongRoPE picks its factors by the context size",
        "engine bug",
        ("longrope",),
        "``llama_model::get_rope_factors`` uses the long factors when the context's ``n_ctx_seq`` "
        "exceeds ``original_max_position_embeddings``, not by the sequence's length as transformers "
        "does.  With the default context (the trained 131072 for Phi-3 mini 128k) a short prompt "
        "gets the long factors (error 5.9 at position 100); with ``-c 4096`` the short ones apply "
        "past 4096 too.",
        "ggml/repro_longrope_context.py",
        "ggml-org/llama.cpp#24823 (closed as stale; fix ggml-org/llama.cpp#24875 closed unmerged)",
    ),
    Finding(
        "sglang",
        "LongRoPE switches to the long factors one token late",
        "engine bug",
        ("longrope",),
        "``Phi3LongRoPEScaledRotaryEmbedding.forward`` takes the long factors when "
        "``torch.any(positions > original_max_position_embeddings)``; transformers when the "
        "sequence is longer than it (``max(position_ids) + 1 > original_max_position_embeddings``). "
        "A prompt of exactly 4097 tokens is rotated with the short factors at every position "
        "(error 4.8 at position 100 against transformers' long-factor angles).  The choice is also "
        "per batch, as in vLLM before 0.33 (vllm-project/vllm#6283).",
        "sglang/repro_longrope_boundary.py",
    ),
    Finding(
        "sglang",
        "dynamic NTK is one static base for factor x the trained length",
        "design choice",
        ("dynamic",),
        "``DynamicNTKScalingRotaryEmbedding`` computes the base transformers uses for a sequence of "
        "``factor * max_position_embeddings`` tokens (30528 for Llama 2 with factor 2) and uses it "
        "at every length, over a table of that many rows (positions past it raise "
        "``IndexError``): one rotation per model keeps the KV cache valid (vLLM's original design). "
        "transformers keeps ``rope_theta`` up to ``max_position_embeddings`` tokens: a 100-token "
        "prompt is off by 3.3 at position 99.",
        "sglang/repro_dynamic_static.py",
    ),
    Finding(
        "rotary_embedding_torch",
        "positions built in the data's dtype: wrong from 257 in bfloat16, NaN from 65520 in float16",
        "engine bug",
        ("default", "linear", "partial", "partial_neox", "interleaved", "layer_types"),
        "``RotaryEmbedding.get_seq_pos`` builds the positions as ``torch.arange(seq_len, "
        "dtype=t.dtype) + offset``, in the data's dtype, before its float32 angles "
        "(``rotate_queries_or_keys``): a bfloat16 token at position 257 is rotated at 256 (error "
        "0.97 against the float64 rotation), a float16 one at 2049 at 2048, and float16 positions "
        "from 65520 on are infinite, so the rotated features are NaN.  float32 is exact.  A call "
        "of several tokens from an offset rounds twice (``arange`` alone, then the sum), so its "
        "numbers also depend on where the call starts.  Building the positions in float32 (the "
        "dtype of its ``freqs``) fixes it.",
        "rotary_embedding_torch/repro_positions_in_data_dtype.py",
    ),
)
