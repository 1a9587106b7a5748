"""No host synchronisation anywhere in a call, for the whole public API.

- torch ``meta`` tensors have no values: every entry point must run on them (nothing read back).
- JAX under ``jax.transfer_guard("disallow")``: after a warm call (programs compiled, constants
  on the device), an eager call moves nothing between host and device (Python scalars included).
"""

from __future__ import annotations

import numpy as np
import pytest

import rotary


def _calls(q, k, v, p, p2, p3, q1, k1, v1, p1):  # type: ignore[no-untyped-def]
    rope, axial, mrope = rotary.RoPE(16), rotary.AxialRoPE(16, 2), rotary.MRoPE(16, (2, 3, 3))
    interleaved = rotary.RoPE(16, layout="interleaved", rotary_dim=8, base=500.0)
    st = rotary.linear_attention(q, k, v, p, causal=True, return_state=True)[1]
    return {
        "apply": lambda: rotary.apply(q, k, p),
        "rotate": lambda: rotary.rotate(q, p, layout="interleaved"),
        "RoPE.apply": lambda: rope.apply(q, k, p),
        "RoPE.apply partial interleaved": lambda: interleaved.apply(q, k, p),
        "RoPE.rotate decode": lambda: rope.rotate(q1, p1),
        "RoPE.cos_sin": lambda: rope.cos_sin(p, full=True),
        "AxialRoPE.apply": lambda: axial.apply(q, k, p2),
        "MRoPE.apply": lambda: mrope.apply(q, k, p3),
        "attention": lambda: rotary.attention(q, k, v, p, causal=True),
        "attention decode": lambda: rotary.attention(q1, k, v, p1, k_pos=p),
        "linear_attention": lambda: rotary.linear_attention(q, k, v, p),
        "linear_attention causal": lambda: rotary.linear_attention(q, k, v, p, causal=True, chunk_size=4),
        "linear_attention_state": lambda: rotary.linear_attention_state(k, v, p),
        "decode state": lambda: rotary.linear_attention(
            q1, k1, v1, p1, causal=True, state=st, return_state=True
        ),
    }


def _inputs(make, arange):  # type: ignore[no-untyped-def]
    q, k, v = make((2, 4, 8, 16)), make((2, 4, 8, 16)), make((2, 4, 8, 16))
    p = arange(8)
    p2 = arange(16).reshape(8, 2)
    p3 = p[None, :] * arange(3)[:, None]
    q1, k1, v1, p1 = q[:, :, -1:], k[:, :, -1:], v[:, :, -1:], p[-1:] + 1
    return q, k, v, p, p2, p3, q1, k1, v1, p1


def test_every_entry_point_runs_on_torch_meta_tensors():
    torch = pytest.importorskip("torch")
    ins = _inputs(lambda s: torch.empty(s, device="meta"), lambda n: torch.arange(n, device="meta"))
    for name, call in _calls(*ins).items():
        out = call()
        leaves = out if isinstance(out, tuple) else (out,)
        for x in leaves:
            for a in x if isinstance(x, tuple) else (x,):
                if hasattr(a, "device"):
                    assert a.device.type == "meta", name


def test_every_entry_point_is_transfer_free_on_jax():
    jax = pytest.importorskip("jax")
    jnp = pytest.importorskip("jax.numpy")
    rng = np.random.default_rng(0)
    ins = _inputs(lambda s: jnp.asarray(rng.normal(size=s), dtype=jnp.float32), jnp.arange)
    for name, call in _calls(*ins).items():
        want = call()  # warm: programs compiled, constants on the device
        with jax.transfer_guard("disallow"):
            got = call()
        for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want), strict=True):
            assert np.array_equal(np.asarray(a), np.asarray(b)), name
