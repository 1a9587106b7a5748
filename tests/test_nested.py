"""torch nested jagged tensors served in their own layout: values and offsets in, a nested tensor
of the same structure out, each document as if alone.

The reproductions of issue 42 (237a6c9): ``rotate``/``convert_layout``/``linear_attention``
refused them with a remedy (``.to_dense()``) that itself raises for jagged tensors; ``apply`` of
separately built q and k crashed (``'NestedIntNode' object has no attribute 'mod'``); ``cos_sin``
of nested positions crashed (``view(): cannot view shape (2, j3, 1)``).
"""

from __future__ import annotations

import warnings

import pytest

import rotary

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")

LENGTHS = (3, 5, 1, 4)


def _nested(rng, *tail, dtype=torch.float64):
    parts = [torch.tensor(rng.normal(size=(n, *tail)), dtype=dtype) for n in LENGTHS]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.nested.nested_tensor(parts, layout=torch.jagged)


def test_rotate_apply_serve_nested_in_their_layout(rng):
    x = _nested(rng, 2, 8)  # (docs, tokens, heads, head_dim)
    k = _nested(rng, 2, 8)
    out = rotary.rotate(x)
    assert out.is_nested and out.layout == torch.jagged and out.shape[-2:] == x.shape[-2:]
    for got, doc in zip(out.unbind(), x.unbind(), strict=True):
        want = rotary.rotate(doc, torch.arange(doc.shape[0])[:, None])
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    _qr, kr = rotary.apply(x, k)  # built separately (237a6c9: AttributeError)
    for got, doc in zip(kr.unbind(), k.unbind(), strict=True):
        torch.testing.assert_close(
            got, rotary.rotate(doc, torch.arange(doc.shape[0])[:, None]), rtol=0, atol=0
        )
    # heads before tokens: (docs, heads, tokens, head_dim)
    xt = x.transpose(1, 2)
    got = rotary.RoPE(8).rotate(xt)
    assert got.is_nested and got.shape[1] == 2
    torch.testing.assert_close(got.transpose(1, 2).values(), out.values(), rtol=0, atol=0)
    # positions as a nested tensor of the same documents
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pos = torch.nested.nested_tensor([torch.arange(n) + 100 for n in LENGTHS], layout=torch.jagged)
    got = rotary.rotate(x, pos)
    for g, doc in zip(got.unbind(), x.unbind(), strict=True):
        torch.testing.assert_close(
            g, rotary.rotate(doc, torch.arange(100, 100 + doc.shape[0])[:, None]), rtol=0, atol=0
        )


def test_cos_sin_of_nested_positions(rng):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pos = torch.nested.nested_tensor([torch.arange(n) for n in LENGTHS], layout=torch.jagged)
    c, s = rotary.RoPE(8).cos_sin(pos)  # 237a6c9: RuntimeError view()
    assert c.is_nested and s.is_nested
    for cd, sd, n in zip(c.unbind(), s.unbind(), LENGTHS, strict=True):
        wc, ws = rotary.RoPE(8).cos_sin(torch.arange(n))
        torch.testing.assert_close(cd, wc, rtol=0, atol=0)
        torch.testing.assert_close(sd, ws, rtol=0, atol=0)


def test_convert_layout_of_nested(rng):
    x = _nested(rng, 2, 8)
    out = rotary.convert_layout(x, "interleaved", "half")
    assert out.is_nested
    for g, doc in zip(out.unbind(), x.unbind(), strict=True):
        torch.testing.assert_close(g, rotary.convert_layout(doc, "interleaved", "half"), rtol=0, atol=0)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("heads_first", [False, True])
def test_both_attentions_on_nested(rng, causal, heads_first):
    q, k, v = (_nested(rng, 2, 8) for _ in range(3))
    if heads_first:
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    rope = rotary.RoPE(8)
    for f in (rotary.linear_attention, rotary.attention):
        out = f(q, k, v, None, rope=rope, causal=causal)
        assert out.is_nested and out._ragged_idx == q._ragged_idx
        for got, dq, dk, dv in zip(out.unbind(), q.unbind(), k.unbind(), v.unbind(), strict=True):
            if not heads_first:
                got, dq, dk, dv = (t.transpose(0, 1) for t in (got, dq, dk, dv))
            want = f(dq, dk, dv, torch.arange(dq.shape[-2]), causal=causal)
            torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    # states per document
    _, st = rotary.linear_attention(q, k, v, None, rope=rope, causal=True, return_state=True)
    assert tuple(st.S.shape) == (2, len(LENGTHS), 8, 8)
    assert st.offset.tolist() == list(LENGTHS)


def test_nested_refusals_name_a_remedy_that_works(rng):
    x = _nested(rng, 2, 8)
    dense = torch.zeros(x.values().shape, dtype=x.dtype)
    with pytest.raises(TypeError, match="must all be nested"):
        rotary.linear_attention(x, x, dense, None)
    with pytest.raises(TypeError, match="both be nested"):
        rotary.apply(x, dense)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        other = torch.nested.nested_tensor(
            [torch.zeros(n, 2, 8, dtype=x.dtype) for n in (4, 4, 4, 1)], layout=torch.jagged
        )
    with pytest.raises(ValueError, match="different documents"):
        rotary.apply(x, other)
    with pytest.raises(ValueError, match="carry their documents"):
        rotary.linear_attention(x, x, x, None, cu_seqlens=[0, 13])
    # positions (docs, tokens, 1): refused in the words rotate uses, naming what was passed
    # (issue 50: the attentions named internal shapes, "pos of shape (13, 1) ... (2, 13)")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pos = torch.nested.nested_tensor([torch.arange(n)[:, None] for n in LENGTHS], layout=torch.jagged)
    for f in (rotary.rotate, rotary.linear_attention, rotary.attention):
        args = (x, pos) if f is rotary.rotate else (x, x, x, pos)
        with pytest.raises(ValueError, match=r"pos must be a nested array of one position per token"):
            f(*args)
    # a strided nested tensor: refused, with the remedy spelled out; the remedy works
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        strided = torch.nested.nested_tensor([t for t in x.unbind()])
    with pytest.raises(
        TypeError, match=r"torch.nested.nested_tensor\(list\(x.unbind\(\)\), layout=torch.jagged\)"
    ):
        rotary.rotate(strided)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fixed = torch.nested.nested_tensor(list(strided.unbind()), layout=torch.jagged)
    torch.testing.assert_close(rotary.rotate(fixed).values(), rotary.rotate(x).values(), rtol=0, atol=0)
