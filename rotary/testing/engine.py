"""The adapter protocol through which :func:`rotary.testing.check_model_rope` certifies an engine's
RoPE against a model's config.

An *engine* (vLLM, Megatron-core, flash-attn, llama.cpp's ggml, mlx-lm, your own code...) is given
to the checker as an :class:`Adapter`: from a Hugging Face config it builds the engine's RoPE **the
way the engine itself builds it for that model** (its own config reading, its own defaults, its own
tables), and returns an :class:`EngineRope` that rotates NumPy queries and keys through the engine's
code.  ``rotary`` reads the same config (:func:`rotary.hf.model_rope`) and compares, in float64.

Arrays crossing the protocol are NumPy arrays (the adapter converts to and from its library):

* ``q``: ``(tokens, heads, head_dim)``, ``k``: ``(tokens, kv_heads, head_dim)``, float32 arrays
  whose values are exactly representable in the ``dtype`` the RoPE was built for (the adapter casts
  them to that dtype: bfloat16, float16, float32);
* ``positions``: int64, ``(tokens,)``, or ``(rows, tokens)`` for multimodal RoPE (M-RoPE: the
  temporal, height and width rows);
* ``head_dim`` is the RoPE's width as :func:`rotary.hf.model_rope` reports it (for multi-head
  latent attention, the ``qk_rope_head_dim`` features that rotate).

Feature order
    ``q`` and ``k`` arrive in the **Hugging Face checkpoint's feature order** (the order of the
    rows of ``q_proj``/``k_proj`` in the published weights), and the results are compared in that
    order.  An engine whose converter permutes the q/k weights (llama.cpp's
    ``convert_hf_to_gguf.py`` and Meta's checkpoint converters reorder the rows of a half-layout
    checkpoint so that the engine rotates adjacent pairs) sees other features: the adapter applies
    that same permutation to ``q`` and ``k`` before the engine and its inverse after (see
    ``conformance/engines/torchtune.py``).  Without it, the checker reports the engine's pairing as
    the other layout.  A library that ships no converter (a building block such as
    rotary-embedding-torch) gets the permutation a port of the checkpoint must apply:
    :func:`converter_order`.

Offsets
    ``positions`` are not contiguous (and repeat: each feature is rotated alone at a few
    positions), up to ``2**20 + 3``.  An engine that takes only an offset is called once per run
    of consecutive positions (:func:`offset_runs`), or once per token where its numbers at a
    position depend on where its call starts.

Dtypes
    The checker asks for each dtype apart.  An engine that has no RoPE in a dtype (ggml has no
    bfloat16 RoPE) is **not supported** there: the adapter raises :class:`Unsupported` for that
    dtype, and never computes in another dtype on the engine's behalf.  An engine that does compute
    in a wider dtype by design (a kernel that loads bfloat16, works in float32 and stores
    bfloat16) is checked as it runs: whatever it returns is compared, within the dtype's tolerance.

Angle kinds
    ``EngineRope.angles`` says how the engine forms its angles, which sets the allowance the
    checker grants for them (:data:`ANGLE_KINDS`, :func:`angle_error`): ``"exact"`` none,
    ``"float64"``, ``"float32"`` (``pos * inv_freq`` in float32: Hugging Face's recipe, most
    engines), ``"float32_recurrence"`` (``theta *= theta_scale`` once per pair in float32:
    ggml's ``ggml_rope_ext``) and ``"dtype"`` (formed in the data's dtype).

Packed input
    An engine whose RoPE takes several documents packed in one row (``cu_seqlens``, the ``thd``
    format) implements the optional ``EngineRope.rotate_packed(q, k, cu_seqlens, offsets)``: the
    packed checks (``check_model_rope(..., checks=("packed", "packed_offsets"))``, the field
    report's ``thd`` case) compare it with rotary's packed rotation.  Without it, or where it
    raises :class:`Unsupported`, they are "not applicable", with the reason.

Errors
    An adapter that cannot express a config raises :class:`Unsupported` with the reason: the report
    says "not supported", not "failed".  Any other exception is blamed by where it was raised
    (:func:`raised_by_adapter`), in the traceback after the adapter's innermost frame: nothing
    after it (raised in the adapter's own code), or only frames of the libraries every adapter
    calls (the standard library, NumPy, torch, JAX, CuPy, MLX, array-api-compat...: ``np.stack``
    misused in the adapter's own ``rotate``), make it an **adapter error** (a bug to fix in the
    adapter, not a verdict on the engine); a frame of any other code after it (the engine's, or a
    library the engine calls from its own code) makes it the engine's.  An adapter that
    reproduces a step of the engine in its own code (indexing the engine's table as the engine's
    forward does) raises :class:`EngineError` from the error it meets there; so does one whose
    engine *is* one of those libraries (a kernel of torch or MLX called directly).
"""

from __future__ import annotations

import inspect
import os
import types
from collections.abc import Mapping
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np

__all__ = [
    "ANGLE_KINDS",
    "Adapter",
    "AngleKind",
    "EngineError",
    "EngineRope",
    "Unsupported",
    "adapter_files",
    "adapter_site",
    "angle_error",
    "config_rope",
    "converter_order",
    "offset_runs",
    "raised_by_adapter",
    "round_to",
]

#: How an engine forms its angles (``EngineRope.angles``).
AngleKind = Literal["exact", "float64", "float32", "float32_recurrence", "dtype"]

#: Each angle kind, with the rounding analysis its allowance comes from (:func:`angle_error`).
ANGLE_KINDS: dict[str, str] = {
    "exact": "correctly rounded angles (rotary's exact method): no allowance",
    "float64": "pos * inv_freq in float64: two roundings, relative error 2**-52",
    "float32": "pos * inv_freq in float32 (Hugging Face's recipe, most engines): two roundings, "
    "relative error 2**-23",
    "float32_recurrence": "theta_i = pos * s**i by repeated float32 multiplication, theta *= s once "
    "per pair (ggml's ggml_rope_ext): s = base**(-2/d) carries one ulp (2**-23) into every step and "
    "each step rounds (2**-24), so pair i's angle is off by up to 1.5 i 2**-23, plus 2 2**-23 for a "
    "scaling's interpolation and mix: (1.5 i + 2) 2**-23",
    "dtype": "pos * inv_freq in the data's dtype: the position, the frequency and their product "
    "rounded, relative error 1.5 eps(dtype)",
}


def angle_error(kind: str, inv_freq: np.ndarray, dtype: str) -> tuple[np.ndarray, float]:
    """The allowance for an engine's angles: per pair, the relative error its angle may carry, and
    the absolute error per unit of position the checker grants every feature.

    Each is **twice** the rounding bound of :data:`ANGLE_KINDS`.  The absolute allowance is the
    relative one times the largest angle per position: ``1`` for every kind but
    ``"float32_recurrence"``, whose error grows with the pair index (there it is the largest
    ``error_i * |inv_freq_i|``, at least float32's).

    Parameters
    ----------
    kind : str
        One of :data:`ANGLE_KINDS`.
    inv_freq : ndarray
        The config's frequencies, ``(pairs,)``.
    dtype : str
        The data's dtype (for ``"dtype"``).

    Returns
    -------
    (ndarray, float)
        The relative allowance per pair and the absolute allowance per unit of position.

    Examples
    --------
    >>> import numpy as np
    >>> from rotary.testing.engine import angle_error
    >>> w = 10000.0 ** (-np.arange(64) / 64)
    >>> rel, per_pos = angle_error("float32", w, "float32")
    >>> per_pos == 2 * 2.0**-23
    True
    >>> rel, per_pos = angle_error("float32_recurrence", w, "float32")
    >>> round(per_pos / 2.0**-23, 1), bool(rel[0] == 4 * 2.0**-23)
    (9.3, True)
    """
    from .asserts import eps

    w = np.abs(np.asarray(inv_freq, dtype=np.float64))
    i = np.arange(w.shape[0], dtype=np.float64)
    one = np.ones_like(w)
    if kind == "exact":
        return 0.0 * one, 0.0
    if kind == "float64":
        return 2 * 2.0**-52 * one, 2 * 2.0**-52
    if kind == "float32":
        return 2 * 2.0**-23 * one, 2 * 2.0**-23
    if kind == "dtype":
        e = 2 * 1.5 * eps(dtype)
        return e * one, e
    if kind == "float32_recurrence":
        rel = 2 * (1.5 * i + 2) * 2.0**-23
        return rel, max(2 * 2.0**-23, float(np.max(rel * w, initial=0.0)))
    raise ValueError(f"EngineRope.angles must be one of {sorted(ANGLE_KINDS)}; got {kind!r}")


def offset_runs(positions: Any) -> list[tuple[int, int, int]]:
    """``positions`` ``(tokens,)`` cut into runs of consecutive positions, for an engine that takes
    only an offset (``rotate(x, offset=o)`` turns ``x``'s token ``j`` at position ``o + j``): one
    ``(start, stop, offset)`` per run, tokens ``start .. stop - 1`` at positions ``offset ..
    offset + stop - start - 1``.  One engine call per run: a call at positions ``0 .. n - 1`` is
    one run; a repeated or isolated position is a run of one token.

    Examples
    --------
    >>> from rotary.testing.engine import offset_runs
    >>> offset_runs([0, 1, 2, 4095, 4096, 7, 7])
    [(0, 3, 0), (3, 5, 4095), (5, 6, 7), (6, 7, 7)]
    """
    p = np.asarray(positions, dtype=np.int64).reshape(-1)
    if p.size == 0:
        return []
    cuts = np.flatnonzero(np.diff(p) != 1) + 1
    starts = np.concatenate([[0], cuts])
    stops = np.concatenate([cuts, [p.size]])
    return [(int(a), int(b), int(p[a])) for a, b in zip(starts, stops, strict=True)]


def config_rope(config: Mapping[str, Any], layer_type: str | None, library: str) -> Any:
    """The config's RoPE for ``layer_type`` (:class:`rotary.RoPE`, read by :func:`rotary.hf.model_rope`
    with float32 angles), for an adapter of a library that reads no config and ships no model
    table: what a user porting the checkpoint writes by hand, to map onto the library's arguments
    (``.config.base``, ``.config.width``, ``.config.layout``, ``.config.scaling``...).  Raises
    :class:`Unsupported` naming ``library`` for M-RoPE and a query scale, which no such library has.

    Examples
    --------
    >>> from rotary.testing.engine import config_rope
    >>> rope = config_rope({"hidden_size": 256, "num_attention_heads": 4, "rope_theta": 1e6}, None, "lib")
    >>> rope.config.base, rope.config.width, rope.config.layout
    (1000000.0, 64, 'half')
    """
    import rotary

    model = rotary.hf.model_rope(config, angles="float32")
    if not model.layers:  # (a config without its layers: its one RoPE, as the kit reads it)
        try:
            rotary.hf.mrope_from_hf(config)
        except ValueError:
            return rotary.hf.from_hf(config, angles="float32", layer_type=layer_type)
        raise Unsupported(f"{library} has no M-RoPE (one position per token)")
    types = model.layer_types
    found = [
        (i, r)
        for i, r in enumerate(model.layers)
        if r is not None and (layer_type is None or (types is not None and types[i] == layer_type))
    ]
    if not found or not isinstance(found[0][1], rotary.RoPE):
        raise Unsupported(f"{library} has no M-RoPE (one position per token)")
    if model.query_scale(found[0][0], np.array([0, 2**20])) is not None:
        raise Unsupported(f"{library} has no query scale (Llama 4 / Ministral 3 attention temperature)")
    return found[0][1]


def converter_order(layout: str, width: int, head_dim: int, engine: str = "interleaved") -> np.ndarray:
    """Where each feature of an engine pairing features in the ``engine`` layout comes from in a
    checkpoint of ``layout`` (``q_engine = q_checkpoint[..., order]``): for an engine that rotates
    adjacent pairs, the permutation llama.cpp's and Meta's converters apply to the rows of
    ``q_proj``/``k_proj`` per head, interleaving the halves of a half-layout head's ``width``
    rotated features, ``[0, w/2, 1, w/2 + 1, ...]`` (the rest kept); for a rotate-half engine and
    an interleaved checkpoint, its inverse; the identity where the layouts agree.
    ``np.argsort(order)`` takes the engine's outputs back to the checkpoint's order.

    Examples
    --------
    >>> from rotary.testing.engine import converter_order
    >>> converter_order("half", 4, 6).tolist()
    [0, 2, 1, 3, 4, 5]
    >>> converter_order("interleaved", 4, 6, engine="half").tolist()
    [0, 2, 1, 3, 4, 5]
    >>> converter_order("interleaved", 6, 6, engine="half").tolist()
    [0, 2, 4, 1, 3, 5]
    """
    order = np.arange(head_dim)
    if layout == engine:
        return order
    h = width // 2
    order[:width] = np.stack([np.arange(h), np.arange(h) + h], axis=-1).reshape(-1)
    return order if layout == "half" else np.argsort(order)


def round_to(x: Any, dtype: str) -> np.ndarray:
    """``x`` rounded to ``dtype`` (to nearest, ties to even), as a float32 array: bfloat16 without
    ``ml_dtypes`` (what a kernel storing that dtype returns; the checker's data are exact in it).

    Examples
    --------
    >>> from rotary.testing.engine import round_to
    >>> round_to([1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8], "bfloat16").tolist()
    [1.0, 1.015625]
    """
    a = np.asarray(x, dtype=np.float32)
    if dtype == "bfloat16":
        bits = a.view(np.uint32).astype(np.uint64)
        return ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).astype(np.uint32).view(np.float32)
    if dtype == "float16":
        return a.astype(np.float16).astype(np.float32)
    if dtype in ("float32", "float64"):
        return a
    raise ValueError(f"dtype must be 'float32', 'bfloat16' or 'float16'; got {dtype!r}")


class Unsupported(Exception):
    """The engine cannot express this config (a scaling it lacks, an M-RoPE, a dtype...).

    Raised by :meth:`Adapter.build` (or :meth:`EngineRope.rotate`); reported as "not supported"
    with the message as its reason, never as a failure.
    """


class EngineError(Exception):
    """Raised by an adapter **on the engine's behalf**: a step the adapter reproduces from the
    engine's code (its forward indexing its own table, say) failed there.

    Raise it from the error met (``raise EngineError from e``): the report shows that error, as
    the engine's.  Any other exception raised in the adapter's module is an adapter error.
    """


def adapter_files(adapter: Any) -> frozenset[str]:
    """The source files of an adapter's own code: its module (a module adapter), the modules of
    its class and base classes (an object), or of its ``build`` function."""
    if isinstance(adapter, types.ModuleType):
        objs: list[Any] = [adapter]
    elif isinstance(adapter, (types.FunctionType, types.MethodType)):
        objs = [adapter]
    else:
        wrapped = getattr(adapter, "_build", None)  # (a bare build function the checker wrapped)
        objs = [wrapped] if callable(wrapped) else [c for c in type(adapter).__mro__ if c is not object]
    files: set[str] = set()
    for o in objs:
        try:
            f = inspect.getsourcefile(o) or inspect.getfile(o)
        except TypeError:  # (a built-in)
            continue
        files.add(os.path.realpath(f))
    return frozenset(files)


#: Libraries every adapter calls: a frame of theirs after the adapter's innermost one is no
#: engine's code (the standard library's modules are added from ``sys.stdlib_module_names``).
COMMON_LIBRARIES = frozenset(
    {
        "numpy",
        "torch",
        "jax",
        "jaxlib",
        "cupy",
        "mlx",
        "array_api_compat",
        "array_api_strict",
        "array_api_extra",
        "ml_dtypes",
        "dask",
        "einops",
    }
)


def _common(frame: types.FrameType) -> bool:
    import sys

    top = str(frame.f_globals.get("__name__", "")).split(".")[0]
    return top in COMMON_LIBRARIES or top in getattr(sys, "stdlib_module_names", ()) or top == "builtins"


def adapter_site(exc: BaseException, files: frozenset[str]) -> str:
    """`` (raised at adapter.py:42)``, or `` (raised at adapter.py:42, inside numpy)``: the
    adapter's innermost frame in ``exc``'s traceback (``""`` where it has none)."""
    tb, site, lib = exc.__traceback__, "", ""
    while tb is not None:
        f = tb.tb_frame
        if os.path.realpath(f.f_code.co_filename) in files:
            site, lib = f"{os.path.basename(f.f_code.co_filename)}:{tb.tb_lineno}", ""
        elif site and not lib:
            lib = str(f.f_globals.get("__name__", "")).split(".")[0]
        tb = tb.tb_next
    if not site:
        return ""
    return f" (raised at {site}{', inside ' + lib if lib else ''})"


def raised_by_adapter(exc: BaseException, files: frozenset[str]) -> bool:
    """Whether ``exc`` is the adapter's own error (the rule of the module docstring): it is no
    :class:`EngineError`, and in the traceback of the error it was raised ``from`` (if any), an
    adapter frame (one of ``files``) comes after which only frames of
    :data:`COMMON_LIBRARIES` (and the standard library) do."""
    root: BaseException | None = exc
    while root is not None:
        if isinstance(root, EngineError):
            return False
        if root.__cause__ is None:
            break
        root = root.__cause__
    assert root is not None
    frames = []
    tb = root.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    mine = [i for i, f in enumerate(frames) if os.path.realpath(f.f_code.co_filename) in files]
    return bool(mine) and all(_common(f) for f in frames[mine[-1] + 1 :])


@runtime_checkable
class EngineRope(Protocol):
    """One engine RoPE built for one config, layer type and dtype.

    Attributes
    ----------
    angles : {"exact", "float64", "float32", "float32_recurrence", "dtype"}
        How the engine forms its angles (sets the angle allowance: :func:`angle_error`).
        Optional: default ``"float32"``.
    max_position : int or None
        The positions the engine's precomputed table covers (``0 .. max_position - 1``), if it
        keeps one; ``None`` if it computes angles on the fly.  Optional.  Positions past it are
        still checked: the engine must be right there or raise.
    softmax_scale : float
        The multiplier this engine applies to the attention logits for this config *outside* the
        rotation, relative to ``1 / sqrt(qk_head_dim)`` (e.g. DeepSeek YaRN's
        ``mscale(factor, mscale_all_dim) ** 2``).  Optional: default 1.0.
    """

    def rotate(self, q: np.ndarray, k: np.ndarray, positions: np.ndarray) -> tuple[Any, Any]:
        """``(q, k)`` rotated by the engine at ``positions`` (shapes as given, features in the
        Hugging Face checkpoint's order; any float dtype, NumPy or convertible with
        ``numpy.asarray``): whatever factor the engine multiplies into cos/sin is included.  Must
        not modify ``q`` or ``k``."""
        ...

    # Optional:
    # def query_scale(self, positions: np.ndarray) -> np.ndarray | None:
    #     """The per-position factor the engine multiplies queries by after RoPE for this config
    #     (Llama 4 / Ministral 3 attention temperature), ``None`` where it applies none."""
    #
    # def rotate_packed(self, q, k, cu_seqlens, offsets) -> tuple[Any, Any]:
    #     """Packed input (``thd``): ``q`` ``(tokens, heads, head_dim)`` and ``k`` hold several
    #     documents in one row, document ``i`` at tokens ``cu_seqlens[i] .. cu_seqlens[i+1] - 1``
    #     (``cu_seqlens``: int64, ``(documents + 1,)``, from 0 to ``tokens``), its token ``j`` at
    #     position ``offsets[i] + j`` (``offsets``: int64, ``(documents,)``; all 0 for packed
    #     training data, each request's cached length for a ragged decoding batch).  Hand the
    #     engine the packing **as it takes it** (``cu_seqlens`` and ``seqlen_offsets``, ``thd``
    #     with ``start_positions``...), never positions the adapter computed for it, unless the
    #     engine's RoPE itself takes per-token positions from its runner.  Raise
    #     :class:`Unsupported` with the reason for what it cannot take (offsets, say): the packed
    #     check is then "not applicable".  Without this method it is "not applicable" too."""


class Adapter(Protocol):
    """An engine as the checker sees it (a module or an object with these names).

    Attributes
    ----------
    NAME : str
        The engine's name (``"vllm"``).
    INSTALL : str
        The exact install recipe on a CPU machine (shown when the engine is absent).
    """

    NAME: str
    INSTALL: str

    def version(self) -> str:
        """The engine's version; raises ``ImportError`` when it is not installed."""
        ...

    def build(self, config: Mapping[str, Any], *, layer_type: str | None, dtype: str) -> EngineRope:
        """The engine's RoPE for ``config`` (a Hugging Face config dict, as published) and layer
        type (``None``: the model's only RoPE), in ``dtype`` (``"float32"``, ``"bfloat16"``,
        ``"float16"``).  Raises :class:`Unsupported` where the engine cannot express it (a
        scaling it lacks, or a dtype it has no RoPE in)."""
        ...
