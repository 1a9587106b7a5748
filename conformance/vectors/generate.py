"""Write the golden vectors: ``python3 conformance/vectors/generate.py`` from the repo root.

Each case of ``conformance.vectors.CASES`` becomes ``<name>.npz`` (inputs drawn from a
seeded generator, outputs from the float64 rotation-matrix definition in
``rotary.testing.reference``), and ``index.json`` lists them with their parameters and
SHA-256 checksums.  Deterministic: re-running it rewrites identical files.
"""

from __future__ import annotations

import io
import json
import sys
import zipfile
from pathlib import Path

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from conformance.vectors import CASES, FORMAT_VERSION, HERE, INDEX, compute, sha256


def _write_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """An uncompressed .npz with fixed timestamps, so the bytes (and checksum) are reproducible."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as zf:
        for name, a in arrays.items():
            buf = io.BytesIO()
            np.lib.format.write_array(buf, np.ascontiguousarray(a), allow_pickle=False)
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            zf.writestr(info, buf.getvalue())


def main() -> None:
    entries = []
    for i, (name, spec) in enumerate(CASES.items()):
        rng = np.random.default_rng(1000 + i)
        n = len(spec["positions"])
        x = rng.uniform(-1.0, 1.0, size=(n, spec["head_dim"]))
        arrays = compute(spec, x)
        path = HERE / f"{name}.npz"
        _write_npz(path, arrays)
        entries.append(
            {
                "name": name,
                "file": path.name,
                "layout": spec["layout"],
                "base": spec["base"],
                "head_dim": spec["head_dim"],
                "rotary_dim": spec.get("rotary_dim") or spec["head_dim"],
                "scaling": {"rope_type": "linear", "factor": spec["linear_factor"]}
                if "linear_factor" in spec
                else None,
                "n": n,
                "pos_dtype": arrays["pos"].dtype.name,
                "sha256": sha256(path),
            }
        )
    index = {
        "format_version": FORMAT_VERSION,
        "generator": "conformance/vectors/generate.py",
        "definition": "out[n] = R(pos[n]) @ x[n], R block-diagonal; pair i rotated by pos[n] * theta[i]",
        "cases": entries,
    }
    INDEX.write_text(json.dumps(index, indent=2) + "\n")
    total = sum((HERE / e["file"]).stat().st_size for e in entries)
    print(f"wrote {len(entries)} cases ({total / 1024:.0f} KiB) and {INDEX.name} to {HERE}")


if __name__ == "__main__":
    main()
