"""The catalogue of linear-attention families rotary serves, and their definitions.

Each :class:`Family` names the models that ship it, the keywords of :func:`rotary.linear_attention`
that serve it, the reference it matches, and makes inputs for a test.  :func:`recurrence` is the
definition every family is checked against: the state update written token by token in float64,
independent of rotary's chunked engine (in the layout of rotary's states, ``S`` is ``F x d_v``)::

    S_t = (D_t + b_t a_t^T) S_{t-1} + k_t v_t^T,        o_t = S_t^T q_t

with RWKV-6's bonus ``o_t = S_{t-1}^T q_t + (q_t . (u * k_t)) v_t`` instead, a document boundary
forgetting everything, and padding (a key mask) writing nothing.

``python tests/linear_families.py --rst docs/guides/linear_families.rst`` writes the guide's table.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from rotary.testing.reference import rotate as rotate_ref


@dataclasses.dataclass(frozen=True)
class Family:
    name: str
    models: str
    keywords: str
    reference: str
    gate: str | None  # None, "token" or "feature"
    rank: str | None = None  # None, "delta" or "dplr"
    bonus: bool = False
    unit_keys: bool = False  # the delta rule's keys are L2-normalised (qk_l2norm=True)
    tied_keys: bool = False  # HGRN2: k = 1 - forget gate


FAMILIES: tuple[Family, ...] = (
    Family(
        "GLA (vector gates)",
        "GLA, Gated Slot Attention's first level",
        "``log_gate`` per key feature ``(..., N, F)``",
        "fla ``naive_recurrent_gla``",
        "feature",
    ),
    Family(
        "HGRN2",
        "HGRN2",
        "``log_gate`` per key feature, ``k = 1 - exp(log_gate)``",
        "fla ``naive_recurrent_hgrn2`` (GLA with tied keys)",
        "feature",
        tied_keys=True,
    ),
    Family(
        "RWKV-6",
        "RWKV-6 (Finch)",
        "``log_gate`` per key feature, ``u`` (the bonus)",
        "fla ``naive_recurrent_rwkv6``",
        "feature",
        bonus=True,
    ),
    Family(
        "DeltaNet",
        "DeltaNet",
        "``beta``",
        "fla ``delta_rule_recurrence``",
        None,
        rank="delta",
        unit_keys=True,
    ),
    Family(
        "Gated DeltaNet",
        "Qwen3-Next, Qwen3.5, Qwen3.5-MoE, Qwen4-exp, OLMo-hybrid, lara_mini",
        "``log_gate`` per token, ``beta``, ``qk_l2norm``, ``scale``",
        "transformers ``torch_chunk_gated_delta_rule``",
        "token",
        rank="delta",
        unit_keys=True,
    ),
    Family(
        "Kimi Delta Attention",
        "Kimi Linear",
        "``log_gate`` per key feature, ``beta``, ``qk_l2norm``, ``scale``",
        "transformers ``chunk_kimi_delta_attention``",
        "feature",
        rank="delta",
        unit_keys=True,
    ),
    Family(
        "RWKV-7",
        "RWKV-7 (Goose)",
        "``log_gate`` per key feature, ``a``, ``b`` (the transition's rank-one term)",
        "fla ``naive_recurrent_dplr_delta_rule``",
        "feature",
        rank="dplr",
        unit_keys=True,
    ),
)

BY_NAME = {f.name: f for f in FAMILIES}


def inputs(
    fam: Family, rng: np.random.Generator, lead: tuple[int, ...], n: int, F: int, dv: int
) -> dict[str, Any]:
    """float64 inputs of ``fam``: ``q``, ``k``, ``v`` and its keywords (``log_gate``, ``beta``,
    ``u``, ``a``, ``b``), the gates strong enough to matter within a chunk."""
    q = rng.normal(size=(*lead, n, F))
    k = rng.normal(size=(*lead, n, F))
    v = rng.normal(size=(*lead, n, dv))
    out: dict[str, Any] = {"q": q, "k": k, "v": v}
    if fam.gate == "token":
        out["log_gate"] = np.log(rng.uniform(0.5, 1.0, size=(*lead, n)))
    elif fam.gate == "feature":
        out["log_gate"] = np.log(rng.uniform(0.3, 1.0, size=(*lead, n, F)))
    if fam.tied_keys:
        out["k"] = 1.0 - np.exp(out["log_gate"])
    if fam.rank == "delta":
        out["beta"] = rng.uniform(0.1, 1.0, size=(*lead, n))
    if fam.rank == "dplr":
        kk = rng.normal(size=(*lead, n, F))
        kk = kk / np.linalg.norm(kk, axis=-1, keepdims=True)
        out["a"] = -kk
        out["b"] = kk * rng.uniform(0.1, 1.0, size=(*lead, n, 1))
    if fam.bonus:
        out["u"] = rng.normal(size=(*lead[:-1], lead[-1], F)) if lead else rng.normal(size=(F,))
    return out


def l2(x: np.ndarray) -> np.ndarray:
    """flash-linear-attention's L2 normalisation: ``x / sqrt(|x|^2 + 1e-6)``."""
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + 1e-6)


def recurrence(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    *,
    log_gate: np.ndarray | None = None,
    beta: np.ndarray | None = None,
    a: np.ndarray | None = None,
    b: np.ndarray | None = None,
    u: np.ndarray | None = None,
    runs: np.ndarray | None = None,
    key_mask: np.ndarray | None = None,
    pos: np.ndarray | None = None,
    qk_l2norm: bool = False,
    scale: float = 1.0,
    S0: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """``(out, S)``: the family's state update token by token, float64.  ``q`` ``(..., Hq, N, F)``,
    ``k`` and the per-token arguments ``(..., Hk, N, .)`` with ``Hq`` a multiple of ``Hk``
    (grouped-query heads), ``runs`` ``(N,)`` document ids, ``pos`` positions (RoPE rotates q and k
    after the normalisation and the scale)."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    if qk_l2norm:
        q, k = l2(q), l2(k)
    q = q * scale
    if pos is not None:
        q, k = rotate_ref(q, pos), rotate_ref(k, pos)
    hq, hk = q.shape[-3], k.shape[-3]
    grp = hq // hk
    n, F, dv = k.shape[-2], k.shape[-1], v.shape[-1]
    lead = np.broadcast_shapes(k.shape[:-2], v.shape[:-2])
    k = np.broadcast_to(k, (*lead, n, F))
    v = np.broadcast_to(v, (*lead, n, dv))

    def tok(x: Any, shape: tuple[int, ...]) -> np.ndarray | None:
        return None if x is None else np.broadcast_to(np.asarray(x, dtype=np.float64), shape)

    g = None
    pf = log_gate is not None and np.ndim(log_gate) == k.ndim
    if log_gate is not None:
        g = tok(log_gate, (*lead, n, F) if pf else (*lead, n))
    bt = tok(beta, (*lead, n))
    av, bv = tok(a, (*lead, n, F)), tok(b, (*lead, n, F))
    uv = None if u is None else np.broadcast_to(np.asarray(u, dtype=np.float64), (*lead[:-1], hk, F))
    keep = None if key_mask is None else np.broadcast_to(key_mask, (*lead, n)).astype(np.float64)
    S = (
        np.zeros((*lead, F, dv))
        if S0 is None
        else np.array(np.broadcast_to(S0, (*lead, F, dv)), dtype=np.float64)
    )
    out = np.zeros((*np.broadcast_shapes(q.shape[:-2], (*lead[:-1], hq)), n, dv))
    heads = np.arange(hq) // grp

    def read(qt: np.ndarray, St: np.ndarray) -> np.ndarray:  # q heads against their key head's state
        return np.einsum("...hf,...hfv->...hv", qt, St[..., heads, :, :])

    for t in range(n):
        if runs is not None and t > 0 and runs[t] != runs[t - 1]:
            S = S * 0.0
        kt, vt = k[..., t, :], v[..., t, :]
        at = None if av is None else av[..., t, :]
        bvt = None if bv is None else bv[..., t, :]
        if keep is not None:
            m = keep[..., t, None]
            kt, vt = kt * m, vt * m
            at = None if at is None else at * m
            bvt = None if bvt is None else bvt * m
        qt = q[..., t, :]
        if uv is not None:
            own = np.sum(qt * uv[..., heads, :] * kt[..., heads, :], axis=-1, keepdims=True)
            out[..., t, :] = read(qt, S) + own * vt[..., heads, :]
        D = None if g is None else np.exp(g[..., t, :] if pf else g[..., t, None])  # (..., F) or (..., 1)
        Sg = S if D is None else S * D[..., :, None]
        if bt is not None:  # the delta rule: S <- D S - beta k (k^T D S) + beta k v^T
            pred = np.einsum("...f,...fv->...v", kt, Sg)
            S = Sg + kt[..., :, None] * (bt[..., t, None] * (vt - pred))[..., None, :]
        elif at is not None:  # diagonal plus rank one: S <- D S + b (a^T S) + k v^T
            assert bvt is not None
            ua = np.einsum("...f,...fv->...v", at, S)
            S = Sg + bvt[..., :, None] * ua[..., None, :] + kt[..., :, None] * vt[..., None, :]
        else:
            S = Sg + kt[..., :, None] * vt[..., None, :]
        if uv is None:
            out[..., t, :] = read(qt, S)
    return out, S


def keywords(fam: Family, x: dict[str, Any], convert: Callable[[np.ndarray], Any]) -> dict[str, Any]:
    """rotary's keywords for the inputs ``x`` of ``fam`` (arrays converted by ``convert``)."""
    kw: dict[str, Any] = {"causal": True, "normalize": False}
    for name in ("log_gate", "beta", "u", "a", "b"):
        if name in x:
            kw[name] = convert(x[name])
    if fam.unit_keys and fam.rank == "delta":
        kw["qk_l2norm"] = True
        kw["scale"] = x["q"].shape[-1] ** -0.5
    return kw


def oracle_keywords(fam: Family, x: dict[str, Any]) -> dict[str, Any]:
    kw = {n: x[n] for n in ("log_gate", "beta", "u", "a", "b") if n in x}
    if fam.unit_keys and fam.rank == "delta":
        kw["qk_l2norm"] = True
        kw["scale"] = x["q"].shape[-1] ** -0.5
    return kw


def rst() -> str:
    """The guide's table of families (generated: ``--rst``)."""
    lines = [
        ".. Generated by tests/linear_families.py --rst: do not edit.",
        "",
        "Linear-attention families",
        "=========================",
        "",
        "Every family below runs on one chunk engine (:func:`rotary.linear_attention`, see",
        ":doc:`linear_attention`), on every backend, and is checked by the test suite against its",
        "float64 recurrence written token by token (``tests/linear_families.py``), chunked and",
        "decoding, with states, grouped-query heads, key masks, packed documents, RoPE and gradients.",
        "",
        ".. list-table::",
        "   :header-rows: 1",
        "",
        "   * - family",
        "     - models",
        "     - keywords (with ``causal=True, normalize=False``)",
        "     - checked against",
    ]
    for f in FAMILIES:
        lines += [
            f"   * - {f.name}",
            f"     - {f.models}",
            f"     - {f.keywords}",
            f"     - the float64 recurrence; {f.reference}",
        ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--rst":
        with open(sys.argv[2], "w", encoding="utf-8") as fh:
            fh.write(rst())
    else:
        print(rst())
