"""A fused Triton RoPE kernel: q and k rotated in one launch, angles computed in the kernel.

Used by the torch backend for CUDA tensors when ``triton`` imports (and for CPU tensors under
Triton's interpreter, ``TRITON_INTERPRET=1``, which is how the suite proves it without a GPU);
``rotary.fast_paths(False)`` turns it off.  It computes what the generic array-API code computes,
in the same order and without fused multiply-adds (``enable_fp_fusion=False``):

- exact angles: ``|p|`` split into three base-4096 digits, each digit's ``(cos, sin)`` gathered
  from the configuration's digit tables, composed with the angle-addition formulas; the sign of
  ``p`` applied to the sine; ``|p| >= 2**36`` gives NaN (as the generic code does for values it
  could not check);
- Hugging Face's float32 recipe: ``float32(p) * inv_freq`` and ``cos``/``sin`` in float32 (on a
  GPU, CUDA's ``cosf``/``sinf``, as torch's; the interpreter uses NumPy's, within an ulp), cast
  to the input dtype, and the rotation rounded to it after every operation, as eager torch does;
- the attention factor multiplied into cos and sin; both pair layouts; partial rotary (the
  features past ``rot`` are copied); a backward pass that rotates by ``-theta`` (``sign=-1``).

Bit-identical to the generic code for exact angles (every dtype) and for the float32 recipe
wherever ``cos``/``sin`` agree (``tests/test_triton.py``).

Launch parameters
    One program handles ``BLOCK_R`` rows (a row: one head of one token) and every pair of them
    (``BLOCK_N``: the pair count rounded up to a power of two).  ``BLOCK_R`` makes a program
    hold about 2048 pairs (``BLOCK_R * BLOCK_N``), so that a program moves 16 KiB of float32 or
    8 KiB of 16-bit data, between 1 and 64 rows: enough work per program to hide the table
    gathers at prefill, and at decoding (a few rows) a handful of programs.  The grid is
    ``cdiv(rows(q), BLOCK_R) + cdiv(rows(k), BLOCK_R)``: the first programs rotate q, the others k.
    Rows are addressed through up to four leading axes with any strides (non-contiguous inputs
    are read in place), and positions through their broadcast strides (never materialised).
"""

from __future__ import annotations

# mypy: disable-error-code="untyped-decorator, no-untyped-def"
# pyright: reportCallIssue=false, reportRedeclaration=false
# (Triton's launch takes the kernel's arguments, some unpacked from lists: no static count)
import os
from typing import Any

import torch
import triton
import triton.language as tl

__all__ = ["INTERPRET", "launch"]

#: Triton's interpreter is on: the kernel runs on CPU tensors (NumPy underneath).
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")

_MAX_POSITION = float(1 << 36)
_PAIRS_PER_PROGRAM = 2048

if INTERPRET:

    @triton.jit
    def _cos(x):
        return tl.cos(x)

    @triton.jit
    def _sin(x):
        return tl.sin(x)

else:  # CUDA's accurate cosf/sinf (tl.cos may lower to an approximation)
    from triton.language.extra import libdevice

    @triton.jit
    def _cos(x):
        return libdevice.cos(x)

    @triton.jit
    def _sin(x):
        return libdevice.sin(x)


@triton.jit
def _to(x, DT: tl.constexpr):
    """float32 ``x`` rounded to ``DT`` to nearest, ties to even.  For bfloat16 the rounding is
    done on the bits first (Triton's interpreter truncates in ``.to(bfloat16)``), so the cast
    itself is exact: one code path, the same bits on a GPU and in the interpreter."""
    if DT == tl.bfloat16:
        b = x.to(tl.uint32, bitcast=True)
        b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
        x = tl.where(x != x, x, b.to(tl.float32, bitcast=True))  # (NaN payloads kept)
    return x.to(DT)


@triton.jit
def _round(x, DT: tl.constexpr, ROUND: tl.constexpr):
    """``x`` rounded to the input dtype when every operation rounds there (float32 recipe)."""
    if ROUND:
        return _to(x, DT).to(tl.float32)
    return x


@triton.jit
def _rows(
    X,
    O,
    P,
    T,
    block,
    R,
    L1,
    L2,
    L3,
    xs0,
    xs1,
    xs2,
    xs3,
    xsd,
    ps0,
    ps1,
    ps2,
    ps3,
    af,
    sign,
    D: tl.constexpr,
    N: tl.constexpr,
    HALF: tl.constexpr,
    EXACT: tl.constexpr,
    ROUND: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_P: tl.constexpr,
):
    r = block * BLOCK_R + tl.arange(0, BLOCK_R).to(tl.int64)
    rmask = r < R
    i3 = r % L3
    t = r // L3
    i2 = t % L2
    t = t // L2
    i1 = t % L1
    i0 = t // L1
    xrow = i0 * xs0 + i1 * xs1 + i2 * xs2 + i3 * xs3
    prow = i0 * ps0 + i1 * ps1 + i2 * ps2 + i3 * ps3
    j = tl.arange(0, BLOCK_N)
    jmask = j < N
    m2 = rmask[:, None] & jmask[None, :]
    p = tl.load(P + prow, mask=rmask, other=0).to(tl.int64)
    if EXACT:
        neg = p < 0
        mag = tl.where(neg, -p, p)
        valid = mag < (1 << 36)
        mag = tl.where(valid, mag, 0)
        d0 = mag & 4095
        d1 = (mag >> 12) & 4095
        d2 = mag >> 24
        # tables: (3 levels, 2 [cos, sin], ROWS, N) float32, contiguous
        c = tl.load(T + (d0 * N)[:, None] + j[None, :], mask=m2, other=1.0)
        s = tl.load(T + ROWS * N + (d0 * N)[:, None] + j[None, :], mask=m2, other=0.0)
        tc = tl.load(T + 2 * ROWS * N + (d1 * N)[:, None] + j[None, :], mask=m2, other=1.0)
        ts = tl.load(T + 3 * ROWS * N + (d1 * N)[:, None] + j[None, :], mask=m2, other=0.0)
        c, s = c * tc - s * ts, s * tc + c * ts
        tc = tl.load(T + 4 * ROWS * N + (d2 * N)[:, None] + j[None, :], mask=m2, other=1.0)
        ts = tl.load(T + 5 * ROWS * N + (d2 * N)[:, None] + j[None, :], mask=m2, other=0.0)
        c, s = c * tc - s * ts, s * tc + c * ts
        s = s * tl.where(neg, -1.0, 1.0)[:, None]
        nan = float("nan")
        c = tl.where(valid[:, None], c, nan)
        s = tl.where(valid[:, None], s, nan)
    else:
        w = tl.load(T + j, mask=jmask, other=0.0)
        ang = p.to(tl.float32)[:, None] * w[None, :]
        c = _cos(ang)
        s = _sin(ang)
    c = c * af
    s = s * af
    DT: tl.constexpr = O.dtype.element_ty
    c = _round(c, DT, ROUND)
    s = _round(s, DT, ROUND) * sign
    if HALF:
        f1 = j
        f2 = j + N
    else:
        f1 = 2 * j
        f2 = 2 * j + 1
    x1 = tl.load(X + xrow[:, None] + (f1 * xsd)[None, :], mask=m2, other=0.0).to(tl.float32)
    x2 = tl.load(X + xrow[:, None] + (f2 * xsd)[None, :], mask=m2, other=0.0).to(tl.float32)
    y1 = _round(_round(x1 * c, DT, ROUND) - _round(x2 * s, DT, ROUND), DT, ROUND)
    y2 = _round(_round(x2 * c, DT, ROUND) + _round(x1 * s, DT, ROUND), DT, ROUND)
    orow = r * D
    tl.store(O + orow[:, None] + f1[None, :], _to(y1, DT), mask=m2)
    tl.store(O + orow[:, None] + f2[None, :], _to(y2, DT), mask=m2)
    if BLOCK_P > 0:  # partial rotary: the features past the pairs, copied
        f = 2 * N + tl.arange(0, BLOCK_P)
        mp = rmask[:, None] & (f < D)[None, :]
        v = tl.load(X + xrow[:, None] + (f * xsd)[None, :], mask=mp, other=0.0)
        tl.store(O + orow[:, None] + f[None, :], v, mask=mp)


@triton.jit
def _rope_kernel(
    Q,
    QO,
    PQ,
    K,
    KO,
    PK,
    T,
    NQB,
    RQ,
    QL1,
    QL2,
    QL3,
    qs0,
    qs1,
    qs2,
    qs3,
    qsd,
    pqs0,
    pqs1,
    pqs2,
    pqs3,
    RK,
    KL1,
    KL2,
    KL3,
    ks0,
    ks1,
    ks2,
    ks3,
    ksd,
    pks0,
    pks1,
    pks2,
    pks3,
    af,
    sign,
    D: tl.constexpr,
    N: tl.constexpr,
    HALF: tl.constexpr,
    EXACT: tl.constexpr,
    ROUND: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_P: tl.constexpr,
):
    pid = tl.program_id(0)
    if pid < NQB:
        _rows(Q, QO, PQ, T, pid, RQ, QL1, QL2, QL3, qs0, qs1, qs2, qs3, qsd, pqs0, pqs1, pqs2, pqs3,
              af, sign, D, N, HALF, EXACT, ROUND, ROWS, BLOCK_R, BLOCK_N, BLOCK_P)  # fmt: skip
    else:
        _rows(K, KO, PK, T, pid - NQB, RK, KL1, KL2, KL3, ks0, ks1, ks2, ks3, ksd, pks0, pks1, pks2, pks3,
              af, sign, D, N, HALF, EXACT, ROUND, ROWS, BLOCK_R, BLOCK_N, BLOCK_P)  # fmt: skip


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _geometry(x: Any, p: Any) -> tuple[int, list[int], list[int], int, list[int]]:
    """Rows of ``x``, its leading sizes and strides (padded to four axes), its feature stride,
    and the positions' strides broadcast to ``x``'s leading axes."""
    lead = list(x.shape[:-1])
    pb = p.broadcast_to(tuple(lead))
    pad = 4 - len(lead)
    sizes = [1] * pad + lead
    strides = [0] * pad + list(x.stride()[:-1])
    pstrides = [0] * pad + list(pb.stride())
    rows = 1
    for n in lead:
        rows *= n
    return rows, sizes, strides, x.stride(-1), pstrides


def launch(
    q: Any,
    k: Any,
    pq: Any,
    pk: Any,
    table: Any,
    *,
    rot: int,
    half: bool,
    exact: bool,
    af: float,
    sign: float,
) -> tuple[Any, Any]:
    """Rotate ``q`` and ``k`` (same dtype and feature width, at most four leading axes; ``k`` may
    be ``None``) at integer positions ``pq``/``pk`` (broadcasting against their leading axes) by
    ``rot`` features: exact angles from the digit ``table`` ``(3, 2, 4097, rot/2)``, or the
    float32 recipe from the frequencies ``table`` ``(rot/2,)``.  Outputs are new contiguous
    tensors (an empty one for a missing ``k``)."""
    d = q.shape[-1]
    n = rot // 2
    qo = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    rq, qsz, qst, qsd, pqs = _geometry(q, pq)
    if k is None:  # one tensor: no k programs
        k, pk, ko = q, pq, torch.empty((0,), dtype=q.dtype, device=q.device)
        rk, ksz, kst, ksd, pks = 0, qsz, qst, qsd, pqs
    else:
        ko = torch.empty(k.shape, dtype=k.dtype, device=k.device)
        rk, ksz, kst, ksd, pks = _geometry(k, pk)
    block_n = _next_pow2(n)
    block_r = max(1, min(64, _PAIRS_PER_PROGRAM // block_n))
    block_p = _next_pow2(d - rot) if d > rot else 0
    nqb = triton.cdiv(rq, block_r)
    grid = (nqb + triton.cdiv(rk, block_r),)
    if grid[0] == 0:
        return qo, ko
    round_each = not exact and q.dtype != torch.float32
    extra = {} if INTERPRET else {"enable_fp_fusion": False}
    _rope_kernel[grid](
        q, qo, pq, k, ko, pk, table, nqb,
        rq, qsz[1], qsz[2], qsz[3], *qst, qsd, *pqs,
        rk, ksz[1], ksz[2], ksz[3], *kst, ksd, *pks,
        float(af), float(sign),
        D=d, N=n, HALF=half, EXACT=exact, ROUND=round_each, ROWS=4097,
        BLOCK_R=block_r, BLOCK_N=block_n, BLOCK_P=block_p, **extra,
    )  # fmt: skip
    return qo, ko


# -- the custom op: one kernel for torch.compile (no graph break), autograd by the same kernel ----
@torch.library.custom_op("rotary::rope", mutates_args=())
def rope_op(
    q: torch.Tensor,
    k: torch.Tensor | None,
    pq: torch.Tensor,
    pk: torch.Tensor | None,
    table: torch.Tensor,
    rot: int,
    half: bool,
    exact: bool,
    af: float,
    sign: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``q`` and ``k`` rotated by the fused kernel (see :func:`launch`)."""
    return launch(q, k, pq, pk, table, rot=rot, half=half, exact=exact, af=af, sign=sign)


@rope_op.register_fake
def _(q, k, pq, pk, table, rot, half, exact, af, sign):
    kshape = (0,) if k is None else k.shape
    return torch.empty(q.shape, dtype=q.dtype, device=q.device), torch.empty(
        kshape, dtype=q.dtype, device=q.device
    )


def _setup(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    _, _, pq, pk, table, rot, half, exact, af, sign = inputs
    ctx.save_for_backward(pq, pk, table)  # positions and the constant: no cos/sin kept
    ctx.args = (rot, half, exact, af, sign)


def _backward(ctx: Any, gq: Any, gk: Any) -> tuple[Any, ...]:
    pq, pk, table = ctx.saved_tensors
    rot, half, exact, af, sign = ctx.args
    k_given = pk is not None
    dq, dk = rope_op(gq, gk if k_given else None, pq, pk, table, rot, half, exact, af, -sign)  # by -theta
    return dq, (dk if k_given else None), None, None, None, None, None, None, None, None


rope_op.register_autograd(_backward, setup_context=_setup)
