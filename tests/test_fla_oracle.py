"""flash-linear-attention's naive implementations as a second oracle (``pytest -m fla``).

Needs ``pip install -e ".[fla]"`` (fla-core, whose naive references are plain torch); not in the
default run: transformers uses fla's kernels when it is installed, which changes the outputs the
census tests pin.  Which definitions line up with rotary's:

* ``naive_recurrent_linear_attn(normalize=False)``: ``linear_attention(normalize=False)`` with the
  identity feature map and ``q`` scaled as fla scales it; RoPE applied to q and k beforehand is
  rotary's RoPE in the numerator (there is no denominator);
* ``naive_recurrent_linear_attn(normalize=True)``: rotary's equation 19 without RoPE (fla adds
  ``1e-10`` to the denominator); with RoPE'd q and k it rotates the denominator too, which is not
  equation 19 (rotary keeps the denominator unrotated): they differ, as this test shows;
* ``naive_chunk_simple_gla`` (GLA's scalar gate ``g``, log space, no denominator):
  ``linear_attention(log_gate=g, normalize=False)``;
* ``naive_retention`` (RetNet: a decay ``1 - 2**(-5 - h)`` per head, no denominator):
  ``linear_attention(decay=..., normalize=False)``.
"""

from __future__ import annotations

import numpy as np
import pytest

import rotary

pytestmark = [pytest.mark.fla, pytest.mark.slow]

torch = pytest.importorskip("torch")
naive_la = pytest.importorskip("fla.ops.linear_attn.naive")
naive_gla = pytest.importorskip("fla.ops.simple_gla.naive")
naive_ret = pytest.importorskip("fla.ops.retention.naive")

B, T, H, D = 2, 37, 3, 16


def _bthd(x):
    """rotary's (B, H, T, D) as fla's (B, T, H, D)."""
    return x.transpose(1, 2).contiguous()


def _close(got, want):
    """Within fla's float32 (its naive references compute in float32), relative to the scale."""
    want = want.to(torch.float64)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=2e-6 * float(want.abs().max()))


def _inputs(seed=0):
    g = np.random.default_rng(seed)
    return [torch.tensor(g.standard_normal((B, H, T, D)), dtype=torch.float64) for _ in range(3)]


def test_unnormalised_with_rope_is_rotarys():
    q, k, v = _inputs()
    pos = torch.arange(T)
    qr, kr = rotary.apply(q, k, pos)
    want, _ = naive_la.naive_recurrent_linear_attn(_bthd(qr), _bthd(kr), _bthd(v), scale=1.0, normalize=False)
    got = rotary.linear_attention(q, k, v, pos, causal=True, feature_map="identity", normalize=False)
    _close(_bthd(got), want)


def test_normalised_without_rope_is_equation_19_and_with_rope_is_not():
    q, k, v = _inputs(1)
    fq, fk = (torch.nn.functional.elu(x) + 1 for x in (q, k))
    want, _ = naive_la.naive_recurrent_linear_attn(_bthd(fq), _bthd(fk), _bthd(v), scale=1.0, normalize=True)
    got = rotary.linear_attention(fq, fk, v, None, causal=True, feature_map=lambda x: x)
    _close(_bthd(got), want)
    # fla fed RoPE'd features rotates its denominator too: not equation 19
    pos = torch.arange(T)
    ar, br = rotary.apply(fq, fk, pos)
    fla_rope, _ = naive_la.naive_recurrent_linear_attn(
        _bthd(ar), _bthd(br), _bthd(v), scale=1.0, normalize=True
    )
    eq19 = rotary.linear_attention(fq, fk, v, pos, causal=True, feature_map=lambda x: x)
    assert (fla_rope - _bthd(eq19)).abs().max() > 0.05


def test_simple_gla_gates():
    q, k, v = _inputs(2)
    g = torch.log(
        torch.tensor(np.random.default_rng(3).uniform(0.5, 1.0, size=(B, H, T)), dtype=torch.float64)
    )
    want, S = naive_gla.naive_chunk_simple_gla(
        _bthd(q), _bthd(k), _bthd(v), g.transpose(1, 2).contiguous(), scale=1.0, output_final_state=True
    )
    got, st = rotary.linear_attention(
        q, k, v, None, causal=True, feature_map="identity", normalize=False, log_gate=g, return_state=True
    )
    _close(_bthd(got), want)
    _close(st.S, S)


def test_retention_decay_per_head():
    q, k, v = _inputs(4)
    want = naive_ret.naive_retention(q, k, v)  # (B, H, T, D), q scaled by D**-0.5, float32
    gamma = 1 - 2.0 ** (-5.0 - torch.arange(H, dtype=torch.float64))
    got = rotary.linear_attention(
        q * D**-0.5, k, v, None, causal=True, feature_map="identity", normalize=False, decay=gamma
    )
    _close(got, want)
