"""Rotary's RoPE inside a loaded ``transformers`` model: the machinery of :func:`rotary.hf.patch`.

Torch-free (the model is duck-typed): a model is anything with ``named_modules()``; a rotary
embedding module is one whose class is named for one (``*RotaryEmbedding``,
``*RopePositionEmbedding``...) or that holds an ``inv_freq`` and takes ``position_ids``.  A module
is served when its forward takes ``(x, position_ids[, layer_type])`` and, on probe positions,
returns exactly the cos/sin of the RoPE rotary reads from its config (``angles="float32"``) in one
of the layouts transformers uses: ``concat(c, c)``, each value twice, one per pair, or complex
``c + i s``; ``(sin, cos)`` (GPT-J) and ``-sin`` (NanoChat) included.  Its ``forward`` is then
replaced by a :class:`RotaryForward` that gives the same layout from rotary's ``cos_sin``.  What
does not match is refused with the reason: nothing is skipped silently.

The reading of configs is :mod:`rotary.hf`'s (handed in as ``read``): this layer knows modules.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import re
import types
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal

import numpy as np

from ._backends import backend_for
from ._backends._generic import sized
from ._lib._compat import array_namespace, device, namespace_of, to_numpy
from ._lib._typing import AngleMethod
from ._lib._typing import Layout as Pairing
from ._math._rotation import expand_pairs
from ._rope import RoPE, Rotary, hf_polar
from .multiaxis import AxialRoPE, MRoPE

#: ``read(config, keys, angles)``: rotary's RoPE per ``layer_type`` key of a module's config
#: (``None``: a module called without one); a ``ValueError`` says why it cannot.
Reader = Callable[[Any, tuple[str | None, ...], AngleMethod], dict[str | None, Rotary]]

Layout = Literal["cat", "interleave", "pairs", "complex", "table"]

#: Probe positions: ``arange(N) * step`` (different frequencies give different values).
_N = 32
_STEP = 37
_NAMED = re.compile(r"(Rotary|RoPE|Rope)\w*Embedding")
#: RoFormer's, the model RoPE was introduced with: a table of ``[sin | cos]`` of the pairs (an
#: ``nn.Embedding``), read by its attention in the interleaved layout.
_TABLE = re.compile(r"RoFormerSinusoidal\w*Embedding")
#: What names a vision or audio tower, in a module's path or its config's model type ("encoder"
#: alone does not: CLVP's text encoder is an encoder of text).
_TOWER = re.compile(r"vision|visual|audio|speech|video|(^|[._])vit([._]|$)")


@dataclasses.dataclass(frozen=True)
class Output:
    """How a rotary embedding module returns cos/sin.

    Attributes
    ----------
    layout : {"cat", "interleave", "pairs", "complex", "table"}
        ``concat(c, c)`` (Llama), each value twice (GLM, Cohere), one per pair (GPT-J),
        complex ``c + i s`` (DeepSeek-V2, Llama 4: ``torch.polar``), or one array
        ``concat(s, c)`` of the pairs (RoFormer's sinusoidal table).
    sin_first : bool
        ``(sin, cos)`` rather than ``(cos, sin)`` (GPT-J, CodeGen).
    sin_negated : bool
        ``-sin`` of rotary's angle (NanoChat rotates by ``-theta`` with a flipped ``rotate_half``).
    dtype : dtype or None
        The dtype it returns whatever ``x`` is (Qwen-VL vision: float32); ``None``: ``x.dtype``.
    """

    layout: Layout
    sin_first: bool = False
    sin_negated: bool = False
    dtype: Any = None


@dataclasses.dataclass(frozen=True)
class PatchedModule:
    """One rotary embedding module that :func:`rotary.hf.patch` replaced.

    Attributes
    ----------
    path : str
        Its name in ``model.named_modules()``.
    module_class : str
        Its class name (``"LlamaRotaryEmbedding"``).
    model_type : str or None
        The ``model_type`` of the config it was built from.
    ropes : mapping
        Rotary's RoPE (or M-RoPE) per ``layer_type`` it is called with (``None``: without one).
    output : Output
        The layout of its cos/sin, kept.
    """

    path: str
    module_class: str
    model_type: str | None
    ropes: Mapping[str | None, Rotary]
    output: Output

    def __post_init__(self) -> None:
        if not isinstance(self.ropes, types.MappingProxyType):
            object.__setattr__(self, "ropes", types.MappingProxyType(dict(self.ropes)))

    def __reduce__(self) -> tuple[Any, ...]:
        # (a mapping proxy does not pickle or deepcopy: the RoPEs travel as a dict)
        return (type(self), (self.path, self.module_class, self.model_type, dict(self.ropes), self.output))


@dataclasses.dataclass(frozen=True)
class PatchReport:
    """What :func:`rotary.hf.patch` did to a model (``model.rotary_patch``).

    Attributes
    ----------
    angles : {"exact", "float32"}
        The angle method of every replaced module.
    modules : tuple of PatchedModule
        The modules replaced, in ``named_modules()`` order.
    kept : tuple of (str, str)
        ``(path, reason)`` of rotary embedding modules left as they are (``strict=False`` only).
    """

    angles: AngleMethod
    modules: tuple[PatchedModule, ...]
    kept: tuple[tuple[str, str], ...] = ()

    def __str__(self) -> str:
        lines = [f"rotary patch, angles={self.angles!r}: {len(self.modules)} module(s) replaced"]
        for m in self.modules:
            ropes = ", ".join(f"{k or '-'}: {r!r}" for k, r in m.ropes.items())
            lines.append(f"  {m.path} ({m.module_class}, {m.model_type}): {ropes}")
        lines += [f"  kept {path}: {why}" for path, why in self.kept]
        return "\n".join(lines)


class RotaryForward:
    """What a patched module's ``forward`` becomes: its own cos/sin layout, from rotary's RoPE.

    Picklable (a plain object of plain values), so a patched model pickles and deep-copies.
    """

    angles: AngleMethod

    def __init__(
        self,
        entry: PatchedModule,
        angles: AngleMethod,
        names: tuple[str, str],
        previous: Any,
        module: Any = None,
    ) -> None:
        self.entry = entry
        self.angles = angles
        self.names = names  # the module's parameter names for x and position_ids
        self.previous = previous  # an instance ``forward`` that was there before (restored by unpatch)
        self.ropes = dict(entry.ropes)
        self.module = module
        self.owner: Any = None  # (the model whose rotary_patch reports it)
        # float32 mode is transformers' numbers bit for bit: where those depend on the module's
        # state (dynamic scalings grow their frequencies and keep them between calls) or on its
        # buffers as cast after patching (model.to(bfloat16)), the module's own forward gives them
        self.stateful = angles == "float32" and any(not r.static for r in self.ropes.values())
        inv = None if module is None else module.__dict__.get("_buffers", {}).get("inv_freq")
        self._patched_dtype = None if inv is None else inv.dtype  # (a cast changes it)

    def _own(self) -> Any:
        """The module's own forward where float32 mode must follow its state or cast buffers."""
        if self.angles != "float32" or self.module is None:
            return None
        inv = self.module.__dict__.get("_buffers", {}).get("inv_freq")
        if not self.stateful and (inv is None or inv.dtype == self._patched_dtype or not _narrow(inv)):
            return None
        if self.previous is not None:
            return self.previous
        return type(self.module).forward.__get__(self.module)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        own = self._own()
        if own is not None:
            return own(*args, **kwargs)
        if len(args) > 3:
            raise TypeError(
                f"{self.entry.path}: forward takes (x, position_ids[, layer_type]), got {len(args)} args"
            )
        bound = dict(zip((*self.names, "layer_type"), args))
        bound.update(kwargs)
        x, position_ids = bound[self.names[0]], bound[self.names[1]]
        key = bound.get("layer_type")
        rope = self.ropes.get(key)
        if rope is None:
            raise ValueError(
                f"{self.entry.path} ({self.entry.module_class}) was patched for layer_type in "
                f"{sorted(self.ropes, key=str)}, called with {key!r}"
            )
        return cos_sin(rope, self.entry.output, self.angles, x, position_ids, self.entry.path)


#: Decoding steps (a few positions in one block of this many) read the patched module's output
#: rows from the block's table of the generic code's rows, at any position: one table built per
#: block of steps (``benchmarks/hf_patch.py``'s decoding-step rows, at 4095, 100,000 and 2^20).
_ROWS = 4096
_FEW = 64


class TableForward(RotaryForward):
    """RoFormer's positional table, ``forward(input_ids_shape, cache_length=0, position_ids=None)``
    -> ``concat(sin, cos)`` of the pairs at those positions (``cache_length + arange(seq)`` by
    default), from rotary's RoPE: its own table's bits inside the table, and every position past
    it (where the table ends, an index error)."""

    def __call__(self, input_ids_shape: Any, cache_length: Any = 0, position_ids: Any = None) -> Any:
        weight = self.module.weight
        xp = array_namespace(weight)
        if position_ids is None:
            seq = int(input_ids_shape[1])
            start = int(cache_length)
            position_ids = xp.arange(start, start + seq, dtype=xp.int64, device=device(weight))
        rope = self.ropes[None]
        compute = xp.float64 if weight.dtype == xp.float64 else xp.float32
        c, s = rope.cos_sin(position_ids, dtype=compute)
        out = xp.concat([s, c], axis=-1)
        return out if out.dtype == weight.dtype else xp.astype(out, weight.dtype)


def _plan_table(
    path: str, module: Any, config: Any, angles: AngleMethod
) -> tuple[PatchedModule | None, tuple[str, str], str]:
    """RoFormer's table: served when rotary's cos/sin of the interleaved pairs are its rows, bit
    for bit (probed at every row); else refused with the reason.  Its rows are computed in
    float64 (NumPy) and rounded: transformers' own recipe is the exact angles', so both modes
    serve them with ``angles="exact"``."""
    names = ("input_ids_shape", "position_ids")
    weight = getattr(module, "weight", None)
    if weight is None or weight.ndim != 2 or weight.shape[1] % 2:
        return None, names, "its table is not (positions, even head_dim)"
    dim = int(weight.shape[1])
    rope = RoPE(dim, layout="interleaved")
    xp = array_namespace(weight)
    rows = xp.arange(int(weight.shape[0]), dtype=xp.int64, device=device(weight))
    c, s = rope.cos_sin(rows, dtype=xp.float32)
    want = to_numpy(xp.concat([s, c], axis=-1))
    if weight.dtype != xp.float32 or not np.array_equal(to_numpy(weight.detach()), want):
        return (
            None,
            names,
            (
                "its table is not the sinusoidal table of base 10000 (trained or replaced rows, or cast "
                "from float32): rotary does not know the angles it holds"
            ),
        )
    entry = PatchedModule(path, type(module).__name__, _model_type(config), {None: rope}, Output("table"))
    return entry, names, ""


def cos_sin(rope: Rotary, out: Output, angles: AngleMethod, x: Any, pos: Any, path: str) -> Any:
    """Rotary's cos/sin of ``pos`` laid out as ``out`` says, in the dtype the module returns."""
    # (arrays of one type, the usual call: the namespace without the general lookup)
    same = type(pos) is type(x)
    xp = namespace_of(x, pos, names=("x", "position_ids")) if same else array_namespace(x, pos)
    rows = _few_rows(rope, out, angles, x, pos, path, xp)
    if rows is not None:
        return rows
    return _cos_sin(rope, out, angles, x, pos, path, xp)


def _few_rows(rope: Rotary, out: Output, angles: AngleMethod, x: Any, pos: Any, path: str, xp: Any) -> Any:
    """The fast path of a decoding step (:meth:`Backend.few_rows`: a few integer positions in
    one block of ``_ROWS``, on the backend's allowlist): the rows of the block's table of the
    generic code's own outputs, the same bits (``tests/test_hf_patch_deployed.py``); ``None``
    elsewhere."""
    if out.layout == "complex" or not isinstance(rope, RoPE) or not rope.static:
        return None
    dtype = x.dtype if out.dtype is None else out.dtype

    def make(dev: Any, start: int) -> tuple[Any, int]:
        block = xp.arange(start, start + _ROWS, dtype=pos.dtype, device=dev)
        a, b = _cos_sin(rope, out, angles, x, xp.reshape(block, (1, _ROWS)), path, xp)
        return sized((a[0], b[0]))

    return backend_for(xp).few_rows(("hf rows", rope, out, angles, str(dtype)), make, x, pos, _ROWS)


def _cos_sin(rope: Rotary, out: Output, angles: AngleMethod, x: Any, pos: Any, path: str, xp: Any) -> Any:
    if isinstance(rope, MRoPE):
        if pos.ndim == 2:  # text positions: every row the same (transformers expands them)
            pos = pos[None, ...]
    elif not isinstance(rope, AxialRoPE) and pos.ndim != 2:
        raise ValueError(
            f"{path}: position_ids of shape {tuple(pos.shape)} given to a RoPE of one position row "
            "(batch, seq)"
        )
    dtype = x.dtype if out.dtype is None else out.dtype
    if out.layout == "complex":
        real = xp.float64 if dtype == xp.complex128 else xp.float32
    else:
        real = dtype
    compute = xp.float64 if angles == "exact" and real == xp.float64 else xp.float32
    if out.layout == "complex" and angles == "float32" and isinstance(rope, RoPE) and rope.static:
        # (transformers forms these with torch.polar, whose rounding differs from cos/sin's)
        be = backend_for(xp)
        z = hf_polar(rope, pos, be, device(x))
        return z if z.dtype == dtype else xp.astype(z, dtype)
    c, s = rope.cos_sin(pos, dtype=compute)
    if out.sin_negated:
        s = -s
    if out.layout == "complex":
        return xp.astype(c, dtype) + xp.astype(s, dtype) * 1j
    if out.layout != "pairs":
        pairing: Pairing = "half" if out.layout == "cat" else "interleaved"
        c, s = expand_pairs(c, pairing, xp), expand_pairs(s, pairing, xp)
    c, s = xp.astype(c, dtype), xp.astype(s, dtype)
    return (s, c) if out.sin_first else (c, s)


# -- finding and probing modules -----------------------------------------------------------------
def is_rotary_module(module: Any) -> bool:
    """A rotary embedding module: its class is named for one (``*Rotary*Embedding``,
    ``*Rope*Embedding``), or it holds an ``inv_freq`` and its forward takes ``position_ids``."""
    if _NAMED.search(type(module).__name__) or _TABLE.search(type(module).__name__):
        return True
    if "inv_freq" not in getattr(module, "_buffers", {}):
        return False
    try:
        return "position_ids" in inspect.signature(type(module).forward).parameters
    except (TypeError, ValueError):
        return False


def _signature(module: Any) -> tuple[tuple[str, str], bool, bool] | str:
    """``((x name, position_ids name), takes layer_type, layer_type optional)``, or why not."""
    try:
        params = list(inspect.signature(type(module).forward).parameters.values())[1:]  # (self)
    except (AttributeError, TypeError, ValueError):
        return "its forward has no signature"
    names = [p.name for p in params]
    if len(names) in (2, 3) and names[1] == "position_ids" and names[2:] in ([], ["layer_type"]):
        optional = len(params) == 3 and params[2].default is not inspect.Parameter.empty
        return (names[0], names[1]), len(names) == 3, optional
    return f"its forward takes ({', '.join(names)}), not (x, position_ids[, layer_type])"


def _keys(module: Any, takes: bool, optional: bool) -> tuple[str | None, ...]:
    """The ``layer_type`` values the module is called with: those it built a RoPE for."""
    if not takes:
        return (None,)
    per_type = getattr(module, "rope_type", None)
    if isinstance(per_type, Mapping) and per_type:
        return tuple(sorted(per_type))
    return (None,) if optional else tuple(sorted(getattr(module, "layer_types", None) or ()))


def _tensor(module: Any, model: Any) -> Any:
    """A tensor of the module (else of the model): the namespace and device to probe with."""
    for t in (*module.buffers(), *model.parameters(), *model.buffers()):
        return t
    return None


def _probe_positions(xp: Any, dev: Any, rope: Rotary, step: int) -> Any:
    p = xp.reshape(xp.arange(_N, dtype=xp.int64, device=dev) * step, (1, _N))
    if isinstance(rope, AxialRoPE):  # a vision tower's (tokens, axes) patch coordinates
        p = p[0, :] // 7
        return xp.stack([p, p % 5 + p // 3, p // 2 + 1][: rope.n_axes], axis=-1)
    if not isinstance(rope, MRoPE):
        return p
    rows = [p, p // 2 + 7, p % 5 + p // 3, p // 11 + 2]  # different rows, as an image's grid gives
    return xp.stack(rows[: len(rope.sections)])


def _step(config: Any) -> int:
    """Probe spacing, within ``max_position_embeddings`` (GPT-J indexes a table by position)."""
    limit = getattr(config, "max_position_embeddings", None)
    if isinstance(limit, int) and limit > _N:
        return max(1, min(_STEP, (limit - 1) // (_N - 1)))
    return _STEP


def _layout_of(got: Any, c: np.ndarray, s: np.ndarray) -> Output | None:
    """Which :class:`Output` makes rotary's per-pair ``(c, s)`` the module's output ``got``."""
    if not isinstance(got, tuple):
        g = to_numpy(got)
        if not np.iscomplexobj(g) or g.shape != c.shape:
            return None
        eps = float(np.finfo(np.float32).eps)  # torch.polar rounds within an ulp of cos/sin
        close = np.abs(np.real(g) - c).max(initial=0) <= eps and np.abs(np.imag(g) - s).max(initial=0) <= eps
        return Output("complex") if close else None
    if len(got) != 2:
        return None
    a, b = to_numpy(got[0]), to_numpy(got[1])
    shapes: dict[Layout, Callable[[np.ndarray], np.ndarray]] = {
        "cat": lambda u: np.concatenate([u, u], axis=-1),
        "interleave": lambda u: np.repeat(u, 2, axis=-1),
        "pairs": lambda u: u,
    }
    for layout, expand in shapes.items():
        cc, ss = expand(c), expand(s)
        for sin_first, (first, second) in ((False, (a, b)), (True, (b, a))):
            if first.shape != cc.shape or not np.array_equal(first, cc):
                continue
            if np.array_equal(second, ss):
                return Output(layout, sin_first)
            if np.array_equal(second, -ss):
                return Output(layout, sin_first, sin_negated=True)
    return None


def _probe(probe: Any, t: Any, ropes: Mapping[str | None, Rotary], config: Any) -> Output | str:
    """The :class:`Output` of module ``probe`` (a copy: dynamic and LongRoPE modules update their
    buffers as they run), found by calling it on probe positions (on the namespace and device of
    tensor ``t``) and comparing with rotary's float32 cos/sin; or why it cannot be served."""
    xp = array_namespace(t)
    dev = device(t)
    forward = type(probe).forward
    found: set[Output] = set()
    for key, rope in ropes.items():
        kw = {} if key is None else {"layer_type": key}
        pos = _probe_positions(xp, dev, rope, _step(config))
        dtypes = {}
        try:
            for dt in (xp.float32, xp.float64, xp.float16):  # values, then the dtype it returns
                got = forward(probe, xp.zeros((1, _N, 8), dtype=dt, device=dev), pos, **kw)
                dtypes[dt] = (got[0] if isinstance(got, tuple) else got).dtype
                if dt == xp.float32:
                    c, s = rope.cos_sin(pos, dtype=xp.float32)
                    layout = _layout_of(got, to_numpy(c), to_numpy(s))
        except Exception as e:  # (whatever the module raises: the reason it is refused)
            return f"its forward fails on position_ids of shape {tuple(pos.shape)} ({type(e).__name__}: {e})"
        what = f" (layer_type {key!r})" if key is not None else ""
        if layout is None:
            return (
                f"its cos/sin{what} are not those of {rope!r}, the RoPE rotary reads from its config "
                "(in any layout transformers uses)"
            )
        if layout.layout != "complex" and all(dtypes[dt] == dt for dt in dtypes):
            fixed = None
        elif len(set(dtypes.values())) == 1:
            fixed = dtypes[xp.float32]
        else:
            return f"the dtype of its cos/sin{what} follows the input's in a way rotary does not ({dtypes})"
        found.add(dataclasses.replace(layout, dtype=fixed))
    if len(found) != 1:
        return f"its layer types return cos/sin in different layouts ({sorted(map(repr, found))})"
    return found.pop()


def _text_config(config: Any) -> Any:
    get = getattr(config, "get_text_config", None)
    if get is None:
        return config
    try:
        return get(decoder=True)
    except TypeError:
        return get()


def _model_type(config: Any) -> str | None:
    return getattr(config, "model_type", None)


@dataclasses.dataclass
class _Plan:
    """One rotary embedding module: what replaces it (``entry``), or why nothing can."""

    path: str
    module: Any
    model_type: str | None
    entry: PatchedModule | None
    names: tuple[str, str] = ("x", "position_ids")
    reason: str = ""


def plan(model: Any, angles: AngleMethod, read: Reader) -> list[_Plan]:
    """Every rotary embedding module of ``model``: what rotary puts in its place, or why not."""
    if not callable(getattr(model, "named_modules", None)):
        raise TypeError(f"model must be a transformers (torch) model, got {type(model).__name__}")
    default = _text_config(getattr(model, "config", None))
    out: list[_Plan] = []
    done: dict[tuple[type, int], tuple[PatchedModule | None, tuple[str, str], str]] = {}
    for path, module in model.named_modules():
        if not is_rotary_module(module):
            continue
        found = installed(module)
        if found is not None:
            raise ValueError(
                f"{path or type(model).__name__} is already patched (angles={found[1].angles!r}): "
                "call rotary.hf.unpatch(model) first"
            )
        config = getattr(module, "config", None) or default
        key = (type(module), id(config))
        if key not in done:
            done[key] = _plan_one(path, module, model, config, angles, read)
        entry, names, reason = done[key]
        if entry is not None:
            entry = dataclasses.replace(entry, path=path)
        out.append(_Plan(path, module, _model_type(config), entry, names, reason))
    return out


def _plan_one(
    path: str, module: Any, model: Any, config: Any, angles: AngleMethod, read: Reader
) -> tuple[PatchedModule | None, tuple[str, str], str]:
    if _TABLE.search(type(module).__name__):
        return _plan_table(path, module, config, angles)
    sig = _signature(module)
    if isinstance(sig, str):
        return None, ("x", "position_ids"), sig
    names, takes, optional = sig
    keys = _keys(module, takes, optional)
    if not keys:
        return None, names, "it takes a layer_type but names none it serves (no rope_type mapping)"
    if config is None:
        return None, names, "neither it nor the model has a config"
    try:
        f32 = read(config, keys, "float32")
        ropes = f32 if angles == "float32" else read(config, keys, angles)
    except ValueError as e:
        return None, names, f"rotary cannot read its config: {e}"
    t = _tensor(module, model)
    if t is None:
        return None, names, "it holds no tensor to probe with"
    output = _probe(copy.deepcopy(module), t, f32, config)
    narrow = sorted({str(b.dtype) for b in module.buffers() if _narrow(b)})
    if isinstance(output, str) and narrow:
        # model.to(dtype) casts buffers: the module then rotates by rounded frequencies.  Exact
        # angles serve it as its config (and a freshly built module) say; float32 cannot.
        cast = (
            f"its frequency buffers were cast to {', '.join(narrow)} (by model.to(dtype); load with dtype=)"
        )
        if angles == "float32":
            why = "it rotates by rounded frequencies, which angles='float32' does not reproduce"
            return None, names, f"{cast}: {why}"
        try:
            fresh = type(module)(config)
        except Exception as e:  # (whatever its constructor raises)
            return None, names, f"{cast}, and it cannot be rebuilt from its config ({type(e).__name__}: {e})"
        output = _probe(fresh, t, f32, config)
    if isinstance(output, str):
        return None, names, output
    return PatchedModule(path, type(module).__name__, _model_type(config), ropes, output), names, ""


def _narrow(t: Any) -> bool:
    """A floating tensor narrower than float32 (a buffer that ``model.to(bfloat16)`` cast)."""
    xp = array_namespace(t)
    return bool(xp.isdtype(t.dtype, "real floating")) and xp.finfo(t.dtype).bits < 32


def refusal(model: Any, refused: Iterable[_Plan]) -> str:
    """The error of modules rotary cannot serve: each named, with its family and the reason."""
    lines = []
    for p in refused:
        tower = " (a vision/audio tower)" if _TOWER.search(f"{p.path} {p.model_type}") else ""
        lines.append(
            f"  {p.path} ({type(p.module).__name__}, model type {p.model_type!r}){tower}: {p.reason}"
        )
    return (
        f"rotary cannot serve {len(lines)} rotary embedding module(s) of {type(model).__name__}:\n"
        + "\n".join(lines)
        + "\npass strict=False to patch the others and leave these as they are (listed in "
        "model.rotary_patch.kept)"
    )


def install(plans: Iterable[_Plan], angles: AngleMethod, owner: Any) -> list[RotaryForward]:
    """Replace each planned module's forward (after every check passed: all or nothing); each
    knows the ``owner`` whose ``rotary_patch`` reports it."""
    out = []
    for p in plans:
        assert p.entry is not None
        previous = p.module.__dict__.get("forward")
        kind = TableForward if p.entry.output.layout == "table" else RotaryForward
        fwd = kind(p.entry, angles, p.names, previous, p.module)
        fwd.owner = owner
        p.module.forward = fwd
        out.append(fwd)
    return out


def installed(module: Any) -> tuple[str, RotaryForward] | None:
    """``(attribute, forward)`` where rotary's forward sits in ``module``: its own ``forward``, or
    inside a wrapper (accelerate's ``_old_forward``; ``functools.wraps`` and ``partial`` chains)."""
    # (a hooked module calls its _old_forward: the hook's own __wrapped__ may be stale)
    for attr in ("_old_forward",) if "_old_forward" in module.__dict__ else ("forward",):
        f = module.__dict__.get(attr)
        for _ in range(8):  # (a bounded unwrap)
            if isinstance(f, RotaryForward):
                return attr, f
            inner = getattr(f, "__wrapped__", None) or getattr(f, "func", None)
            if inner is None or inner is f:
                break
            f = inner
    return None


def uninstall(model: Any) -> int:
    """Restore every patched module's own forward (wrapped or not); the number restored.  Each
    owner's report then lists only the modules still patched, and goes when none is."""
    n = 0
    owners: dict[int, Any] = {}
    for _, module in model.named_modules():
        found = installed(module)
        if found is None:
            continue
        attr, fwd = found
        if attr == "forward" and module.__dict__.get("forward") is fwd:
            if fwd.previous is None:
                del module.forward
            else:
                module.forward = fwd.previous
        else:  # (inside a wrapper: the wrapper now calls the module's own forward)
            own = fwd.previous if fwd.previous is not None else type(module).forward.__get__(module)
            if module.__dict__.get(attr) is fwd:
                setattr(module, attr, own)
            else:
                module.forward = _rewrap(module.__dict__[attr], fwd, own)
        owner = getattr(fwd, "owner", None)
        if owner is not None:
            owners[id(owner)] = owner
        n += 1
    for owner in (*owners.values(), *(m for _, m in model.named_modules())):
        _refresh_report(owner)
    return n


def _rewrap(f: Any, target: Any, own: Any) -> Any:
    """``f`` with ``target`` replaced by ``own`` inside its ``functools.partial`` chain."""
    import functools

    if f is target:
        return own
    if isinstance(f, functools.partial):
        return functools.partial(_rewrap(f.func, target, own), *f.args, **f.keywords)
    raise ValueError(
        f"rotary's forward sits inside a wrapper it cannot rebuild ({type(f).__name__}); remove the "
        "wrapper (e.g. accelerate.hooks.remove_hook_from_module) before unpatching"
    )


def _refresh_report(owner: Any) -> None:
    """``owner.rotary_patch`` lists the modules still patched (none: it goes)."""
    rep = getattr(owner, "__dict__", {}).get("rotary_patch")
    if not isinstance(rep, PatchReport):
        return
    live = set()
    for path, module in owner.named_modules():
        found = installed(module)
        if found is not None and getattr(found[1], "owner", None) is owner:
            live.add(path)
    keep = tuple(m for m in rep.modules if m.path in live)
    if not keep:
        del owner.__dict__["rotary_patch"]
    elif len(keep) != len(rep.modules):
        owner.__dict__["rotary_patch"] = dataclasses.replace(rep, modules=keep)
