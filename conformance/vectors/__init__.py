"""Golden vectors: RoPE outputs computed in float64 from the rotation-matrix definition.

``CASES`` specifies them, ``generate.py`` (beside this file) writes them, ``load()``
reads them back and ``verify()`` checks them against their checksums and a fresh
float64 computation.  The format is described in ``README.md`` beside this file.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np

from rotary.testing import reference

__all__ = ["CASES", "case_theta", "compute", "index", "index_names", "load", "sha256", "verify"]

HERE = Path(__file__).resolve().parent
INDEX = HERE / "index.json"
FORMAT_VERSION = 1

_INT_POS = [0, 1, 2, 3, 4, 5, 7, 8, 15, 16, 31, 100, 255, 256, 1000, 1023, 1024, 4095, 4096, 4097]
_INT_POS += [10_000, 65_535, 65_536, 100_000, 2**20 - 1, 2**20, 2**24 - 1, 2**24, 2**24 + 1]
_INT_POS += [2**28 + 3, 2**31 - 1, -1, -4096, -(2**20)]
_FRAC_POS = [0.5, 1.25, 2.75, 7.125, 100.5, 1000.125, 4095.75, 4096.5, 65_536.25, 2**20 + 0.5, -3.5, -1000.25]

#: name -> parameters (layout, base, head_dim, rotary_dim, linear scaling factor, positions).
CASES: dict[str, dict[str, Any]] = {
    "half_d8_base10": dict(layout="half", base=10.0, head_dim=8, positions=_INT_POS),
    "interleaved_d8_base10": dict(layout="interleaved", base=10.0, head_dim=8, positions=_INT_POS),
    "half_d64": dict(layout="half", base=10000.0, head_dim=64, positions=_INT_POS),
    "interleaved_d64": dict(layout="interleaved", base=10000.0, head_dim=64, positions=_INT_POS),
    "half_d128_base5e5": dict(layout="half", base=500000.0, head_dim=128, positions=_INT_POS),
    "interleaved_d128_base1e6": dict(layout="interleaved", base=1e6, head_dim=128, positions=_INT_POS),
    "half_d64_rotary32": dict(layout="half", base=10000.0, head_dim=64, rotary_dim=32, positions=_INT_POS),
    "interleaved_d64_fractional": dict(layout="interleaved", base=10000.0, head_dim=64, positions=_FRAC_POS),
    "half_d64_linear4": dict(layout="half", base=10000.0, head_dim=64, linear_factor=4.0, positions=_INT_POS),
}


def case_theta(spec: dict[str, Any]) -> np.ndarray:
    """The case's frequencies in float64 (the definition, divided by a linear factor)."""
    r = spec.get("rotary_dim") or spec["head_dim"]
    return reference.theta(r, spec["base"]) / float(spec.get("linear_factor", 1.0))


def compute(spec: dict[str, Any], x: np.ndarray, th: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Every array of a case from its spec and inputs ``x``, in float64 (the matrix form).

    ``th`` (default :func:`case_theta`) gives the frequencies: the stored ones define a case, so
    a platform whose ``pow`` rounds differently still reproduces the stored outputs.
    """
    pos = np.asarray(spec["positions"])
    pos = pos.astype(np.float64 if pos.dtype.kind == "f" else np.int64)
    th = case_theta(spec) if th is None else np.asarray(th, dtype=np.float64)
    cos, sin = reference.cos_sin(pos, th)
    out = reference.rotate(x, pos, layout=spec["layout"], rotary_dim=spec.get("rotary_dim"), th=th)
    return {"x": x, "pos": pos, "theta": th, "cos": cos, "sin": sin, "out": out}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def index() -> dict[str, Any]:
    """``index.json``: the format version and every case's parameters and checksum."""
    return json.loads(INDEX.read_text())


def index_names() -> list[str]:
    """The names of the stored cases."""
    return [e["name"] for e in index()["cases"]]


def load() -> list[dict[str, Any]]:
    """Every case: its index entry plus its arrays (``x``, ``pos``, ``theta``, ``cos``, ``sin``, ``out``)."""
    out = []
    for entry in index()["cases"]:
        with np.load(HERE / entry["file"]) as f:
            arrays = {k: f[k] for k in f.files}
        out.append({**entry, **arrays})
    return out


def verify() -> list[dict[str, Any]]:
    """Check each stored case: checksum, spec, and a fresh float64 recomputation of every array.

    Returns one dict per case: ``name``, ``passed``, ``max_ulps`` (float64 ulps, relative to
    ``max(1, |value|)``) and ``message``.
    """
    idx = index()
    results = []
    stored_names = [e["name"] for e in idx["cases"]]
    for name in CASES:
        if name not in stored_names:
            results.append(
                {
                    "name": name,
                    "passed": False,
                    "max_ulps": float("inf"),
                    "message": "missing from index.json: run conformance/vectors/generate.py",
                }
            )
    for entry in idx["cases"]:
        path = HERE / entry["file"]
        msgs = []
        if sha256(path) != entry["sha256"]:
            msgs.append("sha256 mismatch (file changed since index.json was written)")
        spec = CASES.get(entry["name"])
        if spec is None:
            msgs.append("not a case of conformance.vectors.CASES")
            results.append(
                {"name": entry["name"], "passed": False, "max_ulps": float("inf"), "message": "; ".join(msgs)}
            )
            continue
        with np.load(path) as f:
            stored = {k: f[k] for k in f.files}
        fresh = compute(spec, stored["x"], stored.get("theta"))
        th_def = case_theta(spec)
        if stored.get("theta") is None or stored["theta"].shape != th_def.shape:
            msgs.append("theta missing or of the wrong shape")
        elif np.any(np.abs(stored["theta"] - th_def) > 2 * 2.0**-52 * th_def):
            msgs.append("stored theta differs from base**(-2i/r) by more than 2 ulps")
        worst = 0.0
        for k, v in fresh.items():
            s = stored.get(k)
            if s is None or s.shape != v.shape:
                msgs.append(f"array {k!r} missing or of the wrong shape")
                continue
            e = np.abs(s.astype(np.float64) - v) / (2.0**-52 * np.maximum(1.0, np.abs(v)))
            worst = max(worst, float(e.max()) if e.size else 0.0)
        if worst > 1.0:
            msgs.append(f"stored arrays differ from a fresh float64 computation by {worst:.3g} ulps")
        results.append(
            {"name": entry["name"], "passed": not msgs, "max_ulps": worst, "message": "; ".join(msgs)}
        )
    return results
