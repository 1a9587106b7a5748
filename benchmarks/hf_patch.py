"""``rotary.hf.patch`` on tiny random-weight models: logit error far out, and the forward time.

Errors (the numerics guide's table and plot): five families' tiny models (``tests/hf_families.py``:
Llama 3.1 llama3, Qwen2.5 YaRN, Gemma 3 layer types, Phi-3 LongRoPE, DeepSeek-V3 MLA + YaRN)
against the truth, the same weights in float64 with exact angles; max |logits - truth| of the
float32 model as transformers runs it and patched with ``angles="exact"``, at ``position_ids``
offset by 0, 2^16, 2^20, 2^22, 2^24 (``tests/test_hf_patch.py``'s ``logit_errors``).

Timing (``python3 -m benchmarks --only hfpatch``): one forward of a small Llama 3.1 model
(prefill at offset 2^20), patched against unpatched, side by side in one run; and the call of
its rotary embedding module alone, the part the patch replaces: 1024 positions, and a decoding
step at position 4095 and 100,000 of its 131,072-position context and at 2^20 of a 2^21 one.

Usage: ``python3 benchmarks/hf_patch.py [--plot docs/img/hf_patch_error.png]``
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def errors() -> dict[str, dict[int, tuple[float, float]]]:
    """``{family: {offset: (unpatched error, patched exact error)}}`` and the bound per family."""
    import test_hf_patch as t

    return {name: t.logit_errors(t.tiny(name)) for name in t.MEASURED}


def table(errs: dict[str, dict[int, tuple[float, float]]]) -> str:
    """The errors as an RST list-table (the numerics guide's)."""
    import test_hf_patch as t

    offsets = list(next(iter(errs.values())))
    out = [".. list-table::", "   :header-rows: 1", "", "   * - family"]
    out += [f"     - {_offset(o)}" for o in offsets]
    out.append("     - bound")
    for name, e in errs.items():
        out.append(f"   * - {name}")
        out += [f"     - {e[o][0]:.1e} / {e[o][1]:.1e}" for o in offsets]
        out.append(f"     - {t.bound(e):.1e}")
    return "\n".join(out) + "\n"


def _offset(o: int) -> str:
    return "0" if o == 0 else f"2^{o.bit_length() - 1}"


def plot(errs: dict[str, dict[int, tuple[float, float]]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    for i, (name, e) in enumerate(errs.items()):
        color = f"C{i}"
        xs = [max(o, 2**12) for o in e]  # offset 0 drawn at 2^12 on the log axis
        ax.plot(xs, [v[0] for v in e.values()], "-o", color=color, label=f"{name}: transformers")
        ax.plot(xs, [v[1] for v in e.values()], "--s", color=color, label=f"{name}: patched (exact)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks([2**12, 2**16, 2**20, 2**22, 2**24], ["0", "2^16", "2^20", "2^22", "2^24"])
    ax.set_xlabel("position_ids offset")
    ax.set_ylabel("max |logits - float64 truth|")
    ax.set_title("rotary.hf.patch: float32 logit error far out (tiny random models)")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=6.5, ncol=2, loc="upper left")
    fig.tight_layout()
    fig.savefig(path)


def bench_patch(quick: bool, reps: int) -> list[Any]:
    """Forward time of a small Llama 3.1 model: unpatched, patched exact, patched float32."""
    try:
        import torch
        import transformers
    except ImportError as e:
        return [{"section": "HF patch", "backend": "torch eager", "case": f"skipped: {e}"}]
    from hf_families import BY_NAME  # (tests/: the published Llama 3.1 config.json)

    import rotary

    from ._timing import compare
    from .rope import _rows

    transformers.logging.set_verbosity_error()
    small = dict(hidden_size=256, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2)
    small |= dict(intermediate_size=512, vocab_size=1024)
    cfg = transformers.AutoConfig.for_model(**{**copy.deepcopy(BY_NAME["Llama 3.1"].config), **small})
    torch.manual_seed(0)
    base = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    exact = rotary.hf.patch(copy.deepcopy(base), angles="exact")
    f32 = rotary.hf.patch(copy.deepcopy(base), angles="float32")
    seq = 256 if quick else 1024
    ids = torch.randint(0, 1024, (1, seq), generator=torch.Generator().manual_seed(1))
    pos = torch.arange(seq)[None] + 2**20

    def run(model: Any) -> Any:
        def f() -> Any:
            with torch.no_grad():
                return model(input_ids=ids, position_ids=pos, use_cache=False).logits

        return f

    label = f"Llama 3.1 forward, {seq} tokens"
    cases = {
        f"{label}: patched (exact)": run(exact),
        f"{label}: patched (float32)": run(f32),
        f"{label}: transformers": run(base),
    }
    peer = f"{label}: transformers"
    rows = _rows(
        "HF patch",
        "torch eager",
        compare(cases, reps=reps),
        {f"{label}: patched (exact)": (peer, 1.1), f"{label}: patched (float32)": (peer, 1.1)},
        floor=None,
    )
    # the part the patch replaces: the rotary embedding module's call (cos/sin of every position)
    x = torch.zeros(1, seq, cfg.hidden_size)
    emb = f"rotary_emb, {seq} positions"

    def call(model: Any) -> Any:
        module = model.model.rotary_emb
        return lambda: module(x, pos)

    cases = {
        f"{emb}: patched (exact)": call(exact),
        f"{emb}: patched (float32)": call(f32),
        f"{emb}: transformers": call(base),
    }
    peer = f"{emb}: transformers"
    targets = {f"{emb}: patched (exact)": (peer, 1.25), f"{emb}: patched (float32)": (peer, 1.25)}
    rows += _rows("HF patch", "torch eager", compare(cases, reps=reps, inner=20), targets, floor=None)
    # a decoding step: the module's call at one position, early and far into long contexts (each
    # block of 4096 positions has its rows: the block's table is built before the timing)
    rows += _decoding_rows(base, exact, f32, cfg.hidden_size, 4095, reps)
    rows += _decoding_rows(base, exact, f32, cfg.hidden_size, 100_000, reps)
    cfg2 = transformers.AutoConfig.for_model(**{**cfg.to_dict(), "max_position_embeddings": 2**21})
    torch.manual_seed(0)
    base2 = transformers.AutoModelForCausalLM.from_config(cfg2).eval()
    exact2 = rotary.hf.patch(copy.deepcopy(base2), angles="exact")
    f32_2 = rotary.hf.patch(copy.deepcopy(base2), angles="float32")
    return rows + _decoding_rows(base2, exact2, f32_2, cfg2.hidden_size, 2**20, reps)


#: The patched module's decoding step against the unpatched one's, at any position (issue 49).
DECODE_TARGET = 1.3


def _decoding_rows(base: Any, exact: Any, f32: Any, hidden: int, position: int, reps: int) -> list[Any]:
    """The rotary embedding module's call at one position of ``base``'s context
    (``max_position_embeddings`` in the label): patched (exact, float32) against transformers."""
    import torch

    from ._timing import compare
    from .rope import _rows

    x1, p1 = torch.zeros(1, 1, hidden), torch.tensor([[position]])
    context = base.config.max_position_embeddings
    one = f"rotary_emb, decoding step at {position:,} of {context:,}"

    def step(model: Any) -> Any:
        module = model.model.rotary_emb
        return lambda: module(x1, p1)

    cases = {
        f"{one}: patched (exact)": step(exact),
        f"{one}: patched (float32)": step(f32),
        f"{one}: transformers": step(base),
    }
    peer = f"{one}: transformers"
    targets = {
        f"{one}: patched (exact)": (peer, DECODE_TARGET),
        f"{one}: patched (float32)": (peer, DECODE_TARGET),
    }
    return _rows(
        "HF patch", "torch eager", compare(cases, reps=reps, warmup=50, inner=200), targets, floor=None
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plot", metavar="PNG", help="also draw the plot (docs/img/hf_patch_error.png)")
    args = ap.parse_args(argv)
    errs = errors()
    print(table(errs))
    if args.plot:
        plot(errs, args.plot)


if __name__ == "__main__":
    main()
