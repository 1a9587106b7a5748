"""Long context: angle accuracy at large positions, and what each scaling does to the frequencies.

Figure 1 (``angle_error.png``): the largest |cos error| and |sin error| per octave of
positions, 2**0 .. 2**24, for the common float32 recipe (``angles="float32"``, what
Hugging Face LLaMA computes) and for ``rotary``'s default exact angles, measured
against an extended-precision reference, for a LLaMA-like head (d = 128, base 10000).

Figure 2 (``wavelengths.png``): the wavelength ``2 pi / theta_i`` of every frequency
pair of that head under each context-extension scaling (linear / position
interpolation, NTK-aware, YaRN, Llama 3, LongRoPE) extending a 4096-token model 8x.
The frequencies are read back from the rotation ``rotary`` actually applies at
position 1 of a 32768-token sequence (so length-dependent scalings are in effect).

    python examples/long_context.py [--out DIR] [--max-log2 24] [--per-octave 256]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile

import numpy as np

import rotary

#: The optional libraries the examples use, and the extra of ``pyproject.toml`` that installs each.
EXTRAS = {"matplotlib": "plot", "torch": "torch", "jax": "jax", "dask": "dask", "distributed": "dask"}


def require(*modules: str) -> None:
    """Exit with a message naming the extra to install if a library this example needs is missing."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        extras = ",".join(dict.fromkeys(EXTRAS[m] for m in missing))
        sys.exit(
            f"{os.path.basename(__file__)} needs {', '.join(missing)}, not installed here: "
            f'pip install ".[{extras}]" in the rotary checkout'
        )


HEAD_DIM, BASE, L0, FACTOR = 128, 10000.0, 4096, 8


def angle_errors(max_log2: int, per_octave: int, seed: int = 0) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Max |cos|, |sin| error per octave [2**o, 2**(o+1)) for each angle method."""
    rng = np.random.default_rng(seed)
    octaves = np.arange(max_log2)
    pos = np.concatenate(
        [np.unique(rng.integers(2**o, 2 ** (o + 1), size=per_octave, dtype=np.int64)) for o in octaves]
    )
    which = np.floor(np.log2(pos)).astype(np.int64)
    ld = np.longdouble
    two_pi = ld(2) * ld("3.14159265358979323846264338327950288")
    ang = np.fmod(pos.astype(ld)[:, None] * rotary.inv_freq(HEAD_DIM, BASE).astype(ld)[None, :], two_pi)
    c_true, s_true = np.cos(ang).astype(np.float64), np.sin(ang).astype(np.float64)
    errs = {}
    for method in ("float32", "exact"):
        c, s = rotary.RoPE(HEAD_DIM, base=BASE, angles=method).cos_sin(pos)  # float32 NumPy
        e = np.maximum(np.abs(c - c_true), np.abs(s - s_true)).max(axis=-1)
        errs[method] = np.array([e[which == o].max() for o in octaves])
    return octaves, errs


def scalings() -> dict[str, rotary.RoPE]:
    """The scalings compared (each also accepted as a Hugging Face ``rope_scaling`` dict)."""
    from rotary import scaling as sc

    half = HEAD_DIM // 2
    # A LongRoPE-style long factor rising from 1 (fast pairs) to 2 * FACTOR (slow pairs);
    # real models (Phi-3) ship searched factors.
    long_factor = tuple(float(f) for f in np.geomspace(1.0, 2.0 * FACTOR, half))
    cfgs = {
        "default": None,
        "linear": sc.Linear(FACTOR),
        "NTK-aware": sc.NTK(FACTOR),
        "YaRN": sc.YaRN(FACTOR, original_max_position_embeddings=L0),
        "Llama 3": sc.Llama3(FACTOR, L0, low_freq_factor=1.0, high_freq_factor=4.0),
        "LongRoPE": sc.LongRoPE((1.0,) * half, long_factor, L0, factor=FACTOR),
    }
    return {name: rotary.RoPE(HEAD_DIM, base=BASE, scaling=cfg) for name, cfg in cfgs.items()}


def applied_inv_freq(rope: rotary.RoPE, seq_len: int) -> np.ndarray:
    """Frequencies of the rotation applied at position 1 within a ``seq_len``-token sequence."""
    c, s = rope.cos_sin(np.array([1, seq_len - 1]), dtype=np.float64)
    return np.arctan2(s[0], c[0])  # every theta_i < pi, so the angle at position 1 is theta_i


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None, help="folder for the PNGs (default: a new temporary folder)")
    p.add_argument("--max-log2", type=int, default=24, help="positions up to 2**max_log2")
    p.add_argument("--per-octave", type=int, default=256, help="random positions per octave")
    args = p.parse_args(argv)
    require("matplotlib")
    out = args.out or tempfile.mkdtemp(prefix="rotary-long-context-")
    os.makedirs(out, exist_ok=True)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # -- 1. angle error vs position ---------------------------------------------------
    octaves, errs = angle_errors(args.max_log2, args.per_octave)
    print(f"max |cos/sin error| vs extended precision, d = {HEAD_DIM}, float32 results")
    print(f"{'positions':>22} {'float32 recipe':>15} {'rotary exact':>13}")
    for o, a, b in zip(octaves, errs["float32"], errs["exact"]):
        if o % 4 == 0 or o == octaves[-1]:
            print(f"{f'[2^{o}, 2^{o + 1})':>22} {a:15.2e} {b:13.2e}")
    fig, ax = plt.subplots(figsize=(6, 3.6), dpi=100)
    x = 2.0**octaves
    ax.loglog(x, np.maximum(errs["float32"], 1e-9), "o-", ms=3, label='float32 recipe (angles="float32")')
    ax.loglog(x, np.maximum(errs["exact"], 1e-9), "s-", ms=3, label='rotary default (angles="exact")')
    ax.axhline(1e-6, color="gray", ls=":", lw=1)
    ax.set_xlabel("position (start of octave)")
    ax.set_ylabel("max |cos/sin error|")
    ax.set_title(f"RoPE angle error vs position (d = {HEAD_DIM}, base = {BASE:g}, float32)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    p1 = os.path.join(out, "angle_error.png")
    fig.savefig(p1)
    plt.close(fig)

    # -- 2. wavelength per frequency under each scaling -------------------------------
    seq_len = FACTOR * L0
    waves = {name: 2 * np.pi / applied_inv_freq(r, seq_len) for name, r in scalings().items()}
    idx = np.arange(HEAD_DIM // 2)
    print(f"\nwavelength (tokens) of pairs 0 / 32 / 63, {FACTOR}x extension of a {L0}-token model:")
    for name, w in waves.items():
        print(f"{name:>10}: {w[0]:9.1f} {w[32]:11.1f} {w[-1]:13.1f}")
    fig, ax = plt.subplots(figsize=(6, 3.6), dpi=100)
    for name, w in waves.items():
        ref = name == "default"
        ax.semilogy(idx, w, lw=1.8 if ref else 1.2, ls="--" if ref else "-", label=name)
    ax.axhline(L0, color="gray", ls=":", lw=1)
    ax.text(1, L0 * 1.3, f"original context {L0}", fontsize=8, color="gray")
    ax.set_xlabel("frequency pair i")
    ax.set_ylabel(r"wavelength $2\pi/\theta_i$ (tokens)")
    ax.set_title(f"Scalings, {FACTOR}x context extension (d = {HEAD_DIM}, base = {BASE:g})")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    p2 = os.path.join(out, "wavelengths.png")
    fig.savefig(p2)
    plt.close(fig)
    print(f"\nsaved {p1}\nsaved {p2}")
    return {"octaves": octaves, "errors": errs, "wavelengths": waves}


if __name__ == "__main__":
    main()
