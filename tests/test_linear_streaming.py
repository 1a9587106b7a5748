"""Causal linear attention streams the sequence: bounded memory, no masking by ``where`` on the hot
path, a decoding step of a few kernels, the fast decoding step bit for bit the generic one.

Through the public API only: operations are counted with a torch dispatch mode, memory in a
fresh interpreter (tracemalloc sees NumPy's buffers), never timed.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections import Counter

import numpy as np
import pytest

import rotary


def _aten_ops(fn):
    """``(counts, where_shapes)`` of the aten operations ``fn`` dispatches (a dispatch mode: the
    generic code, as any tracer sees it)."""
    torch = pytest.importorskip("torch")
    from torch.utils._python_dispatch import TorchDispatchMode

    seen: Counter[str] = Counter()
    shapes: list[tuple[int, ...]] = []

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = str(func.overloadpacket.__name__)
            seen[name] += 1
            out = func(*args, **(kwargs or {}))
            if name == "where":
                shapes.append(tuple(out.shape))
            return out

    with torch.no_grad(), Count():
        fn()
    return seen, shapes


def _kernels(fn):
    """The aten calls ``fn`` makes (the profiler's top-level ones: what eager decoding runs)."""
    torch = pytest.importorskip("torch")
    from torch.profiler import profile

    fn()
    fn()  # (the first call checks, the second builds the decoding plan)
    with torch.no_grad(), profile() as prof:
        fn()
    return [
        e.name
        for e in prof.events()
        if e.name.startswith("aten::")
        and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::"))
    ]


def _qkv(n, heads=2, d=16, seed=0):
    torch = pytest.importorskip("torch")
    g = np.random.default_rng(seed)
    return [torch.from_numpy(g.standard_normal((1, heads, n, d), dtype=np.float32)) for _ in range(3)]


def test_causal_hot_path_masks_by_multiplication_and_streams():
    """No ``where`` on the chunks (237a6c9 masked every chunk's scores and every feature by
    ``where``: 514 calls at 64k); the only one left is the denominator's (one per part, a value
    per query: a query that sees no key gets 0).  The operations grow with the number of streamed
    parts, never with the chunks inside one."""
    torch = pytest.importorskip("torch")
    counts, totals = {}, {}
    for n in (4096, 8192):
        q, k, v = _qkv(n)
        counts[n], shapes = _aten_ops(
            lambda q=q, k=k, v=v, n=n: rotary.linear_attention(q, k, v, torch.arange(n), causal=True)
        )
        # the where calls left: the denominator's (a value per query) and the exact angles' (a
        # value per position and pair): never on a (C, C) mask, never on features of width 16
        assert all(s[-2:] != (64, 64) and s[-1] != 16 for s in shapes), sorted(set(shapes))
        assert counts[n]["where"] <= 4 * (n // 512), counts[n]
        totals[n] = sum(counts[n].values())
    # twice the tokens: twice the parts, so at most twice the operations (plus the setup's)
    assert totals[8192] <= 2 * totals[4096] + 10, totals


def test_decoding_step_is_a_few_kernels_and_fast_path_is_the_generic_bits():
    """One token from a state: a small fixed number of kernels, the same at every position and
    for every form of the position (237a6c9: a chunk of one token through the chunked form, some
    90; issue 49: a list ``[t]`` fell off the shortcut, 119, and ``pos=None`` with ``rope=`` was
    refused); the torch shortcut computes the generic code's bits."""
    torch = pytest.importorskip("torch")
    q, k, v = (x[..., :1, :] for x in _qkv(1, heads=4, d=64))
    kk, vv, _ = _qkv(40, heads=4, d=64, seed=1)
    st = rotary.linear_attention_state(kk, vv, torch.arange(40))
    rope = rotary.RoPE(64)
    lengths = {}
    for pos in (torch.tensor([40]), torch.tensor(40), np.array([40]), 40, [40], None, 5000):

        def call(pos=pos):
            kw = {"rope": rope} if pos is None else {}
            return rotary.linear_attention(q, k, v, pos, causal=True, state=st, return_state=True, **kw)

        kernels = _kernels(call)
        lengths[repr(pos)] = len(kernels)
        assert len(kernels) <= 36, kernels
        out, new = call()
        with rotary.fast_paths(False):
            ref, ref_state = call()
        assert torch.equal(out, ref) and torch.equal(new.S, ref_state.S) and torch.equal(new.z, ref_state.z)
        assert new.offset == ref_state.offset == 41
    # (a tensor position adds its .item())
    assert lengths["40"] == lengths["5000"] == lengths["[40]"] == lengths["None"] == lengths["array([40])"], (
        lengths
    )


_MEMORY = """
import tracemalloc, numpy as np, rotary
n, h, d = {n}, 4, 64
g = np.random.default_rng(0)
q, k, v = (g.standard_normal((1, h, n, d), dtype=np.float32) for _ in range(3))
p = np.arange(n)
rotary.linear_attention(q, k, v, p, causal=True)  # (the position table is kept state: built here)
tracemalloc.start()
out = rotary.linear_attention(q, k, v, p, causal=True)
peak = tracemalloc.get_traced_memory()[1]
print((peak - out.nbytes) / 2**20, out.nbytes / 2**20)
"""


def _extra_memory(n):
    code = textwrap.dedent(_MEMORY.format(n=n))
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    return [float(x) for x in res.stdout.split()[-2:]]


def test_working_memory_is_independent_of_length():
    """Beyond the output, the same working memory at 8k and 32k tokens (one part's features and
    rotations at a time), at most a quarter of the output at 32k (237a6c9: 5.25 times the output,
    at every length)."""
    small, _ = _extra_memory(8192)
    large, out = _extra_memory(32768)
    assert large <= 1.25 * small + 0.5, (small, large)
    assert large <= 0.25 * out, (large, out)


def test_jax_streams_through_a_scan():
    """Under ``jax.jit`` a long causal call is one ``lax.scan`` over parts (its body traced once)."""
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    q = k = v = jnp.ones((1, 2, 4096, 8), dtype=jnp.float32)
    jaxpr = str(
        jax.make_jaxpr(lambda q, k, v: rotary.linear_attention(q, k, v, jnp.arange(4096), causal=True))(
            q, k, v
        )
    )
    assert "scan" in jaxpr
