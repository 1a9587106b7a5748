"""A causal language model whose RoPE frequencies train (``rotary.modules.torch.LearnedRoPE``).

The task: copy the token seen ``--offset`` positions back.  A one-layer causal model with
trained frequencies (initialised as the default RoPE, as lucidrains ``learned_freq=True`` does)
learns it; the loss and how the frequencies moved are printed.

    python examples/train_learned_lm.py [--steps 80] [--offset 3]
"""

from __future__ import annotations

import argparse

import rotary


def main(argv: list[str] | None = None) -> list[float]:
    import torch

    from rotary.modules.torch import LearnedRoPE

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--offset", type=int, default=3)
    p.add_argument("--seq", type=int, default=24)
    p.add_argument("--vocab", type=int, default=16)
    p.add_argument("--dim", type=int, default=32)
    args = p.parse_args(argv)
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    d = args.dim
    rope = LearnedRoPE(rotary.RoPE(d))
    start = rope.freqs.detach().clone()
    emb, qkv, out = (
        torch.nn.Embedding(args.vocab, d),
        torch.nn.Linear(d, 3 * d),
        torch.nn.Linear(d, args.vocab),
    )
    params = [*emb.parameters(), *qkv.parameters(), *out.parameters(), *rope.parameters()]
    opt = torch.optim.Adam(params, lr=1e-2)
    pos = torch.arange(args.seq)
    losses = []
    for step in range(args.steps):
        tok = torch.randint(0, args.vocab, (32, args.seq), generator=gen)
        q, k, v = qkv(emb(tok)).chunk(3, dim=-1)
        q, k = rope(q, k, pos)
        logits = out(rotary.attention(q, k, v, causal=True))
        tgt = tok[:, : -args.offset]
        loss = torch.nn.functional.cross_entropy(logits[:, args.offset :].flatten(0, 1), tgt.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss))
        if step % max(1, args.steps // 8) == 0 or step == args.steps - 1:
            print(f"step {step:4d}  loss {loss.item():.3f}")
    moved = (rope.freqs.detach() - start).abs().max()
    print(f"frequencies moved by up to {float(moved):.3g} (the largest starts at 1)")
    return losses


if __name__ == "__main__":
    main()
