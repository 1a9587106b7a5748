"""The ownership inventory: what rotary returns belongs to the caller.

Every public callable of rotary (each name in the ``__all__`` of :data:`PUBLIC_MODULES`: functions,
classes, and the public methods and properties of the classes) is called with example arguments
made from its parameters' names (:data:`ARGS`), on one backend.  Every array it returns (inside
tuples, lists, dicts, dataclasses and named tuples) is then overwritten in place, and every call is
made again: each must give exactly what it gave the first time.  A returned array that shares
memory with rotary's state (a cached table, a constant, a plan) fails it.

The inventory is built from ``__all__``: a new public function joins it by itself when its
parameters' names are in :data:`ARGS` (``rope``, ``pos``, ``q``...); one with a new name fails
:func:`build` naming the parameter, until an example is added.  Callables that return no arrays,
or change rotary's settings, are in :data:`NOT_CALLED` with the reason.

``python tests/ownership.py BACKEND`` runs it in a fresh process (``tests/test_ownership.py``):
a failure corrupts the process's state, which no other test may inherit.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
import sys
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

#: The public modules whose ``__all__`` the inventory covers.
PUBLIC_MODULES = (
    "rotary",
    "rotary.positions",
    "rotary.layouts",
    "rotary.learned",
    "rotary.multiaxis",
    "rotary.scaling",
    "rotary.vision",
    "rotary.hf",
    "rotary.distributed",
    "rotary.testing",
    "conformance.against",
    "conformance.calls",
    "conformance.vectors",
)

#: Public callables not called, with the reason (none of them returns an array of rotary's).
NOT_CALLED: dict[str, str] = {
    "rotary.clear_cache": "drops rotary's state (would hide what the inventory looks for)",
    "rotary.set_cache_limit": "a setting (returns an int)",
    "rotary.fast_paths": "a setting (a context manager)",
    "rotary.cache_info": "returns counts (a named tuple of ints)",
    "rotary.CacheInfo": "a named tuple of ints",
    "rotary.scaling.register": "registers a scaling class (returns it)",
    "rotary.testing.available": "lists backends (returns Backend descriptions)",
    "rotary.testing.Backend": "describes a backend (no arrays of rotary's)",
    "rotary.testing.check_rope": "returns a report of floats and strings (covered by its tests)",
    "rotary.testing.check_model_rope": "returns a report of floats and strings (covered by its tests)",
    "rotary.testing.assert_close": "returns None",
    "rotary.testing.Unsupported": "an exception class",
    "rotary.testing.ModelCheck": "a result record of floats and strings",
    "rotary.testing.ModelRopeReport": "a result record of floats and strings",
    "rotary.testing.PropertyResult": "a result record of floats and strings",
    "rotary.testing.RopeReport": "a result record of floats and strings",
    "rotary.hf.patch": "patches a transformers model in place and returns it (tests/test_hf_patch.py)",
    "rotary.hf.unpatch": "restores a patched transformers model and returns it",
    "rotary.hf.patched": "a context manager patching a transformers model",
    "rotary.hf.PatchReport": "a record of module paths and strings",
    "rotary.hf.PatchedModule": "a transformers module's forward, made by patch (tests/test_hf_patch.py)",
    "rotary.hf.patch_linear_attention": "patches a transformers model in place, returns it",
    "rotary.hf.unpatch_linear_attention": "restores a patched transformers model and returns it",
    "rotary.hf.patched_linear_attention": "a context manager patching a transformers model",
    "rotary.hf.LinearPatchReport": "a record of layer paths and strings",
    "rotary.hf.PatchedLayer": "a record of a served layer's path, class and family (strings)",
    "rotary.distributed.sequence_parallel_linear_attention": "needs a JAX mesh (tests/test_distributed.py)",
    "rotary.distributed.exclusive_state_scan": "runs inside a JAX shard_map (tests/test_distributed.py)",
    "rotary.distributed.context_parallel_linear_attention": "needs a torch process group",
    "rotary.distributed.causal_linear_attention_dask": "takes Dask arrays only (not writeable)",
    "conformance.against.load_target": "imports a user's function",
    "conformance.against.run_against": "returns a report of floats and strings",
    "conformance.against.run_golden": "returns a report of floats and strings",
    "conformance.calls.run_calls": "returns a report of floats and strings",
    "conformance.calls.error": "returns a float",
    "conformance.calls.why": "returns a string",
    "conformance.vectors.verify": "returns a report of strings",
    "conformance.vectors.sha256": "returns a string",
    # scalings' hooks that RoPE calls with its own internal values (their results reach callers
    # through RoPE.cos_sin/rotate/apply of a RoPE with that scaling, which the inventory calls)
    "Scaling.dynamic_cos_sin": "a hook RoPE calls with its static cos/sin (covered through RoPE)",
    "Scaling.variants": "returns scalings (no arrays)",
    "Scaling.check_dim": "returns None",
}

#: Callables whose result is a view of the caller's own input, as indexing gives (exempt from
#: :func:`owns`, which holds every other result to owning its memory).
VIEWS_OF_INPUTS: dict[str, str] = {
    "rotary.distributed.shard_sequence": "a slice of x (contiguous sharding), as x[..., a:b, :] gives",
}

HEAD = 16
SEQ = 8


@dataclasses.dataclass
class Env:
    """What the examples are made with: the backend's namespace and how it makes arrays."""

    xp: Any
    asarray: Callable[..., Any]
    float64: bool


def _f(env: Env, shape: tuple[int, ...], seed: int) -> Any:
    data = np.random.default_rng(seed).standard_normal(shape)
    return env.asarray(data, "float32")


#: Example scalings, one per class.
def _scalings() -> list[Any]:
    from rotary import scaling as s

    half = HEAD // 2
    return [
        s.Default(),
        s.Linear(2.0),
        s.NTK(2.0),
        s.DynamicNTK(2.0, 4),
        s.Llama3(8.0, 4),
        s.YaRN(4.0, 4),
        s.LongRoPE(tuple([1.0] * half), tuple([2.0] * half), 4, factor=4.0),
        s.Factors(tuple(1.0 + i / 8 for i in range(half))),
        s.Frequencies(tuple(1.0 / (i + 1) for i in range(half))),
    ]


_HF = {
    "model_type": "llama",
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "rope_theta": 1e4,
    "max_position_embeddings": 64,
    "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16},
}
_QWEN2_VL = {
    "model_type": "qwen2_vl",
    "hidden_size": 64,
    "num_attention_heads": 4,
    "image_token_id": 9,
    "video_token_id": 8,
    "vision_start_token_id": 7,
    "rope_scaling": {"type": "mrope", "mrope_section": [4, 2, 2]},
    "vision_config": {"spatial_merge_size": 2},
}
_PIXTRAL = {"model_type": "pixtral", "hidden_size": 64, "num_attention_heads": 2, "head_dim": 32}


def _ropes() -> list[Any]:
    import rotary

    return [
        rotary.RoPE(HEAD),
        rotary.RoPE(HEAD, layout="interleaved", rotary_dim=8, scaling=rotary.YaRN(4.0, 4)),
        rotary.RoPE(HEAD, angles="float32", scaling={"rope_type": "linear", "factor": 2.0}),
        *(rotary.RoPE(HEAD, scaling=sc) for sc in _scalings()),
    ]


#: Position examples: decoding (one position), a prefill, beyond the per-position table,
#: negative, fractional.  Every callable taking ``pos`` is called with each.
POSITIONS: tuple[Callable[[Env], Any], ...] = (
    lambda e: e.asarray(np.array([5])),
    lambda e: e.asarray(np.arange(SEQ)),
    lambda e: e.asarray(np.arange(SEQ) + 40000),
    lambda e: e.asarray(np.arange(SEQ) - 3),
    lambda e: e.asarray(np.arange(SEQ) + 0.5, "float64" if e.float64 else "float32"),
    lambda e: [5],
    lambda e: 7,
)

#: Coordinates of an axial RoPE: one position, a grid, past the table, fractional.
AXIAL_POSITIONS: tuple[Callable[[Env], Any], ...] = (
    lambda e: e.asarray(np.array([[5, 2]])),
    lambda e: e.asarray(np.arange(2 * SEQ).reshape(SEQ, 2)),
    lambda e: e.asarray(np.arange(2 * SEQ).reshape(SEQ, 2) + 40000),
    lambda e: e.asarray(np.arange(2 * SEQ).reshape(SEQ, 2) + 0.5, "float64" if e.float64 else "float32"),
)

#: M-RoPE position rows: one position, a prefill, past the table.
MROPE_POSITIONS: tuple[Callable[[Env], Any], ...] = (
    lambda e: e.asarray(np.array([[5], [2], [3]])),
    lambda e: e.asarray(np.stack([np.arange(SEQ), np.arange(SEQ) // 2, np.arange(SEQ) % 3])),
    lambda e: e.asarray(np.stack([np.arange(SEQ)] * 3) + 40000),
)

#: Example values by parameter name (each a function of the environment; a list: call with each).
ARGS: dict[str, Any] = {
    "q": lambda e: _f(e, (1, 4, SEQ, HEAD), 1),
    "k": lambda e: _f(e, (1, 2, SEQ, HEAD), 2),
    "v": lambda e: _f(e, (1, 2, SEQ, HEAD), 3),
    "v_": lambda e: _f(e, (1, 2, SEQ, HEAD), 3),
    "x": lambda e: _f(e, (1, 2, SEQ, HEAD), 4),
    "pos": list(POSITIONS),
    "positions": lambda e: e.asarray(np.arange(SEQ)),
    "distance": lambda e: e.asarray(np.arange(SEQ) * 100),
    "delta": lambda e: 3,
    "freqs": lambda e: e.asarray(np.linspace(0.01, 1.0, HEAD // 2), "float32"),
    "dim": lambda e: HEAD,
    "head_dim": lambda e: HEAD,
    "heads": lambda e: 2,
    "base": lambda e: 1e4,
    "xp": lambda e: e.xp,
    "rope": lambda e: _ropes()[0],
    "src": lambda e: _ropes()[0],
    "dst": lambda e: _ropes()[3],
    "lengths": lambda e: e.asarray(np.array([2, 4])),
    "cu_seqlens": lambda e: e.asarray(np.array([0, 2, 6])),
    "mask": lambda e: e.asarray(np.array([[0, 0, 1, 1, 1, 1], [1] * 6])),
    "deltas": lambda e: e.asarray(np.array([[2], [0]])),
    "token_types": lambda e: np.array([[0, 0, 1, 1, 1, 1, 0]]),
    "image_grid_thw": lambda e: [[1, 4, 4]],
    "input_ids": lambda e: e.asarray(np.array([[1, 7, 9, 9, 9, 9, 2]])),
    "sections": lambda e: (4, 2, 2),
    "config": lambda e: _HF,
    "layer_index": lambda e: 0,
    "h": lambda e: 2,
    "w": lambda e: 4,
    "coords": lambda e: np.stack(np.meshgrid(np.arange(2.0), np.arange(3.0), indexing="ij"), -1).reshape(
        -1, 2
    ),
    "seq_len": lambda e: SEQ,
    "rank": lambda e: 1,
    "world": lambda e: 2,
    "d": lambda e: {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16},
    "scaling": lambda e: {"rope_type": "linear", "factor": 2.0},
    "factor": lambda e: 2.0,
    "batch": lambda e: 2,
    "seq": lambda e: SEQ,
    "out": lambda e: (e.xp.ones((2, HEAD)),),
    "name": lambda e: "x",
    "spec": lambda e: {"layout": "half", "base": 10000.0, "head_dim": 8},
    "layout": lambda e: "half",
    "states": lambda e: None,  # *states: see OVERRIDES
    "dtype": lambda e: None,
    "kind": lambda e: "eva02",
}

#: Optional parameters given an example all the same (a call without them means something else).
ALWAYS = frozenset({"pos"})

#: Callables whose examples are not made from their parameters' names alone:
#: ``(args, kwargs)`` functions of the environment (a list: call with each).
OVERRIDES: dict[str, Any] = {
    # plain, packed documents with a state per document, and gates with a state (their outputs and
    # every array of the states: the caller's own)
    "rotary.linear_attention": lambda e: [
        ((ARGS["q"](e), ARGS["k"](e), ARGS["v"](e), e.asarray(np.arange(SEQ))), {"causal": True}),
        (
            (ARGS["q"](e), ARGS["k"](e), ARGS["v"](e), None),
            {"rope": _ropes()[0], "causal": True, "cu_seqlens": np.array([0, 2, SEQ]), "return_state": True},
        ),
        (
            (ARGS["q"](e), ARGS["k"](e), ARGS["v"](e), e.asarray(np.arange(SEQ))),
            {
                "causal": True,
                "decay": 0.9,
                "return_state": True,
                "segment_ids": np.array([0] * 3 + [1] * (SEQ - 3)),
            },
        ),
    ],
    "rotary.convert_layout": lambda e: ((ARGS["x"](e), "half", "interleaved"), {}),
    "rotary.layouts.layout_permutation": lambda e: (("half", "interleaved", HEAD), {}),
    "rotary.combine": lambda e: (
        (
            _call("rotary.linear_attention_state", e),
            _call("rotary.linear_attention_state", e),
        ),
        {},
    ),
    "rotary.hf.mrope_from_hf": lambda e: ((_QWEN2_VL,), {}),
    "rotary.hf.mrope_index": lambda e: ((_QWEN2_VL, ARGS["input_ids"](e), [[1, 4, 4]]), {}),
    "rotary.hf.vision_rope": lambda e: ((_PIXTRAL,), {}),
    "rotary.positions.mrope_text_positions": lambda e: (
        (e.asarray(np.array([[[7, 8]], [[7, 8]], [[7, 8]]])), e.asarray(np.array([[-2]]))),
        {},
    ),
    "rotary.positions.longrope_switch": lambda e: (
        (ARGS["k"](e), e.asarray(np.arange(SEQ)), _ropes()[9]),
        {},
    ),
    "rotary.MRoPE": lambda e: ((HEAD, (4, 2, 2)), {}),
    "rotary.multiaxis.mrope_rows": lambda e: (((4, 2, 2),), {}),
    "rotary.AxialRoPE": lambda e: ((HEAD, 2), {}),
    "MRoPE.apply": lambda e: [((ARGS["q"](e), ARGS["k"](e), p(e)), {}) for p in MROPE_POSITIONS],
    "MRoPE.rotate": lambda e: [((ARGS["x"](e), p(e)), {}) for p in MROPE_POSITIONS],
    "MRoPE.cos_sin": lambda e: [((p(e),), {}) for p in MROPE_POSITIONS],
    "AxialRoPE.apply": lambda e: [((ARGS["q"](e), ARGS["k"](e), p(e)), {}) for p in AXIAL_POSITIONS],
    "AxialRoPE.rotate": lambda e: [((ARGS["x"](e), p(e)), {}) for p in AXIAL_POSITIONS],
    "AxialRoPE.cos_sin": lambda e: [((p(e),), {}) for p in AXIAL_POSITIONS],
    "rotary.positions.mrope_position_ids": lambda e: ((np.array([[0, 0, 1, 1, 1, 1, 0]]), [[1, 4, 4]]), {}),
    "rotary.vision.Grid": lambda e: (("eva02",), {}),
    "rotary.learned.Settings": lambda e: ((_ropes()[0],), {}),
    "rotary.learned.frequencies": lambda e: ((_ropes()[0],), {"xp": e.xp}),
    "rotary.learned.xpos_scale": lambda e: ((e.asarray(np.arange(SEQ)),), {"head_dim": HEAD, "xp": e.xp}),
    "rotary.vision.mixed_frequencies": lambda e: ((HEAD, 2), {"xp": e.xp, "seed": 0}),
    "rotary.vision.VisionRoPE": lambda e: (("eva02", _axial(), lambda h, w: np.zeros((h * w, 2))), {}),
    "rotary.hf.ModelRope": lambda e: ((None, None, (), {}, None, ()), {}),
    "rotary.LinearAttentionState": lambda e: ((e.xp.ones((2, 4, 4)), e.xp.ones((2, 4))), {}),
    "rotary.testing.eps": lambda e: (("float32",), {}),
    "rotary.testing.to_numpy": lambda e: ((ARGS["x"](e),), {}),
    "rotary.testing.reference": lambda e: ((), {}),
    "conformance.against.golden_cases": lambda e: (("half", 10000.0, 64), {}),
    "conformance.calls.leaves": lambda e: (((ARGS["x"](e), [ARGS["k"](e)]),), {}),
    "conformance.vectors.case_theta": lambda e: (({"base": 10.0, "head_dim": 8},), {}),
    "conformance.vectors.compute": lambda e: (
        ({"layout": "half", "base": 10.0, "head_dim": 8, "positions": [0, 5, 70000]}, np.ones((3, 8)), None),
        {},
    ),
    "rotary.RopeConfig": lambda e: ((HEAD,), {}),
    "RoPE.from_config": lambda e: ((_ropes()[1].config,), {}),
    "rotary.RopeConfig.with_scaling": lambda e: ((_scalings()[1],), {}),
    "rotary.distributed.shard_sequence": lambda e: ((ARGS["x"](e),), {"rank": 1, "world": 2}),
}


def _axial() -> Any:
    import rotary

    return rotary.AxialRoPE(HEAD, 2)


#: Instances whose public methods and properties are called, per class (by qualified name): a
#: function making them afresh (each call of the inventory gets its own, as a caller would).
def instances(e: Env) -> dict[str, Callable[[], list[Any]]]:
    from transforms import MINISTRAL3 as config  # (a ModelRope with query scales; head_dim 16)

    import rotary

    return {
        "RoPE": _ropes,
        "MRoPE": lambda: [rotary.MRoPE(HEAD, (4, 2, 2)), rotary.MRoPE(HEAD, (4, 2, 2), interleaved=True)],
        "AxialRoPE": lambda: [_axial()],
        "RopeConfig": lambda: [r.config for r in _ropes()],
        "Scaling": _scalings,
        "LinearAttentionState": lambda: [_call("rotary.linear_attention_state", e)],
        "ModelRope": lambda: [rotary.hf.model_rope(config)],
        "VisionRoPE": lambda: [
            rotary.vision.eva02(HEAD),
            rotary.vision.pixtral(HEAD),
            rotary.vision.qwen2_vl(HEAD),
        ],
        "Settings": lambda: [rotary.learned.Settings.of(rotary.RoPE(HEAD), 16.0)],
        "Grid": lambda: [rotary.vision.Grid("eva02")],
    }


_FIRST: dict[str, Any] = {}


def _call(name: str, e: Env) -> Any:
    """One plain call of a public function by name (for arguments built from results)."""
    mod, _, attr = name.rpartition(".")
    fn = getattr(importlib.import_module(mod), attr)
    return fn(ARGS["k"](e), ARGS["v"](e), e.asarray(np.arange(SEQ)))


@dataclasses.dataclass
class Call:
    """One call: ``name`` (and which example) with a function making its arguments."""

    name: str
    run: Callable[[], Any]


def _owner(cls: type) -> str:
    """The class name an instance table entry is keyed by (scalings share ``Scaling``)."""
    from rotary.scaling import Scaling

    return "Scaling" if issubclass(cls, Scaling) else cls.__name__


def public() -> Iterator[tuple[str, Any, type | None]]:
    """``(qualified name, object, owning class)`` of every public callable and property, each once."""
    seen: set[Any] = set()
    for modname in PUBLIC_MODULES:
        mod = importlib.import_module(modname)
        for name in mod.__all__:
            obj = getattr(mod, name)
            if inspect.ismodule(obj) or id(obj) in seen:
                continue
            seen.add(id(obj))
            qual = f"{modname}.{name}"
            if inspect.isclass(obj):
                yield qual, obj, None
                for attr in dir(obj):
                    if attr.startswith("_") or _defining(obj, attr) is None:
                        continue
                    key = (obj, attr)  # (a method inherited by several public classes: on each)
                    if key in seen:
                        continue
                    seen.add(key)  # type: ignore[arg-type]
                    yield f"{qual}.{attr}", inspect.getattr_static(obj, attr), obj
            elif callable(obj):
                yield qual, obj, None


def _defining(cls: type, attr: str) -> type | None:
    """The rotary/conformance class defining ``attr`` (``None``: inherited from elsewhere)."""
    for base in cls.__mro__:
        if attr in vars(base):
            m = base.__module__
            return base if m.split(".")[0] in ("rotary", "conformance") else None
    return None


def _skip(qual: str, cls: type | None) -> str | None:
    if qual in NOT_CALLED:
        return NOT_CALLED[qual]
    if cls is not None:
        whole = qual.rsplit(".", 1)[0]
        if whole in NOT_CALLED:
            return NOT_CALLED[whole]
        short = f"{_owner(cls)}.{qual.rsplit('.', 1)[1]}"
        if short in NOT_CALLED:
            return NOT_CALLED[short]
    return None


def _examples(qual: str, fn: Any, e: Env, short: str | None = None) -> list[Callable[[], tuple[tuple, dict]]]:
    """Every example of ``fn``: functions making fresh ``(args, kwargs)`` (``ValueError`` naming a
    parameter without an example)."""
    for key in (qual, short):
        if key and key in OVERRIDES:
            over = OVERRIDES[key]
            n = len(over(e)) if isinstance(over(e), list) else 1
            return [(lambda i=i, over=over: _nth(over(e), i)) for i in range(n)]
    sig = inspect.signature(fn)
    combos: list[list[tuple[inspect.Parameter, Callable[[Env], Any]]]] = [[]]
    for p in sig.parameters.values():
        if p.name in ("self", "cls") or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if p.default is not p.empty and p.name not in ALWAYS:
            continue
        if p.name not in ARGS:
            raise ValueError(
                f"{qual}: no example for its parameter {p.name!r}; add one to ARGS or OVERRIDES in "
                f"tests/ownership.py (or list it in NOT_CALLED with the reason it returns no arrays)"
            )
        makers = ARGS[p.name] if isinstance(ARGS[p.name], list) else [ARGS[p.name]]
        combos = [[*c, (p, m)] for c in combos for m in makers]
    return [(lambda c=c: _made_args(c, e)) for c in combos]


def _nth(got: Any, i: int) -> tuple[tuple, dict]:
    return got[i] if isinstance(got, list) else got


def _made_args(combo: list[tuple[inspect.Parameter, Callable[[Env], Any]]], e: Env) -> tuple[tuple, dict]:
    args, kwargs = [], {}
    for p, make in combo:
        if p.kind == p.KEYWORD_ONLY:
            kwargs[p.name] = make(e)
        else:
            args.append(make(e))
    return tuple(args), kwargs


def build(e: Env) -> list[Call]:
    """Every call of the inventory on environment ``e``."""
    calls: list[Call] = []
    table = instances(e)
    for qual, obj, cls in public():
        if _skip(qual, cls) is not None:
            continue
        if cls is None and inspect.isclass(obj) and qual not in OVERRIDES and _owner(obj) in table:
            # a constructor: its examples are the instances of the table (made by it)
            calls.append(Call(qual, _bind(_made, lambda obj=obj: ((obj, e), {}))))
            continue
        if cls is None:
            fn = obj
            for make in _examples(qual, fn, e):
                calls.append(Call(qual, _bind(fn, make)))
            continue
        owner = _owner(cls)
        if isinstance(obj, (staticmethod, classmethod)):  # (alternative constructors)
            fn = getattr(cls, qual.rsplit(".", 1)[1])
            for make in _examples(qual, fn, e, f"{owner}.{qual.rsplit('.', 1)[1]}"):
                calls.append(Call(qual, _bind(fn, make)))
            continue
        if owner not in table:
            raise ValueError(f"{qual}: no instance of {owner} in tests/ownership.py's instances()")
        attr = qual.rsplit(".", 1)[1]
        for j, inst in enumerate(table[owner]()):
            if not hasattr(inst, attr):
                continue
            fresh = _fresh(table[owner], j)
            if isinstance(obj, (property, dataclasses.Field)) or not callable(getattr(inst, attr)):
                get = _bind(lambda a, fresh=fresh: getattr(fresh(), a), lambda attr=attr: ((attr,), {}))
                calls.append(Call(f"{qual} of {inst!r}", get))
                continue
            for make in _examples(qual, getattr(inst, attr), e, f"{owner}.{attr}"):
                method = _bind(lambda *a, attr=attr, fresh=fresh, **k: getattr(fresh(), attr)(*a, **k), make)
                calls.append(Call(f"{qual} of {inst!r}", method))
    return calls + decoding(e)


def decoding(e: Env) -> list[Call]:
    """Decoding steps: one token at a time, through each backend's decoding path (torch's plans
    and one-position pass, NumPy's, the linear-attention step with a carried state); each twice,
    the second time through the plan the first one made."""
    import rotary

    def one(seed: int, heads: int) -> Any:
        return _f(e, (1, heads, 1, HEAD), seed)

    def state() -> Any:
        return rotary.linear_attention_state(ARGS["k"](e), ARGS["v"](e), e.asarray(np.arange(SEQ)))

    steps = {
        "rotary.apply": lambda: rotary.apply(one(5, 4), one(6, 2), e.asarray(np.array([SEQ]))),
        "rotary.apply (int position)": lambda: rotary.apply(one(5, 4), one(6, 2), SEQ),
        "RoPE.apply": lambda: _ropes()[0].apply(one(5, 4), one(6, 2), e.asarray(np.array([SEQ]))),
        "rotary.linear_attention": lambda: rotary.linear_attention(
            one(5, 4),
            one(6, 2),
            one(7, 2),
            e.asarray(np.array([SEQ])),
            causal=True,
            state=state(),
            return_state=True,
        ),
    }
    return [Call(f"decoding step {i}: {name}", step) for name, step in steps.items() for i in (1, 2)]


def _fresh(make: Callable[[], list[Any]], j: int) -> Callable[[], Any]:
    return lambda: make()[j]


def _made(cls: type, e: Env) -> list[Any]:
    return [i for i in instances(e)[_owner(cls)]() if type(i) is cls]


def _bind(fn: Any, make: Callable[[], tuple[tuple, dict]]) -> Callable[[], Any]:
    """A call of ``fn`` with fresh arguments from ``make`` each time (the caller's own arrays)."""

    def call() -> Any:
        args, kwargs = make()
        return fn(*args, **kwargs)

    return call


def arrays(out: Any) -> Iterator[Any]:
    """The arrays in a result (recursively through tuples, lists, dicts, dataclasses)."""
    import array_api_compat

    if isinstance(out, np.ndarray) or (array_api_compat.is_array_api_obj(out) and hasattr(out, "shape")):
        yield out
    elif isinstance(out, (tuple, list)):
        for o in out:
            yield from arrays(o)
    elif isinstance(out, dict):
        for o in out.values():
            yield from arrays(o)
    elif dataclasses.is_dataclass(out) and not isinstance(out, type):
        for f in dataclasses.fields(out):
            yield from arrays(getattr(out, f.name))


def snapshot(out: Any) -> list[np.ndarray]:
    from rotary.testing import to_numpy

    return [np.array(to_numpy(a), copy=True) for a in arrays(out)]


def overwrite(a: Any) -> str | None:
    """Overwrite ``a`` in place with junk; a message where it cannot be written."""
    if isinstance(a, np.ndarray):
        if not a.flags.writeable:
            return "a read-only NumPy array (a view of rotary's state?)"
        a[...] = 7 if a.dtype.kind in "iub" else -1.75
        return None
    mod = type(a).__module__.split(".")[0]
    if mod == "torch":
        import torch

        with torch.no_grad():
            a.fill_(7 if not (a.is_floating_point() or a.is_complex()) else -1.75)
        return None
    if a.shape == () or a.ndim == 0:
        a[()] = 7 if "int" in str(a.dtype) else -1.75
        return None
    a[...] = 7 if "int" in str(a.dtype) else -1.75
    return None


def _buffer(a: Any) -> tuple[int, int] | None:
    """(address, bytes) of the memory that keeps ``a`` alive, where the library says."""
    if isinstance(a, np.ndarray):
        root = a
        while isinstance(root.base, np.ndarray):
            root = root.base
        return root.__array_interface__["data"][0], root.nbytes
    if type(a).__module__.split(".")[0] == "torch":
        st = a.untyped_storage()
        return st.data_ptr(), st.nbytes()
    inner = getattr(a, "_array", None)  # (array-api-strict: a NumPy array inside)
    return _buffer(inner) if isinstance(inner, np.ndarray) else None


def _nbytes(a: Any) -> int:
    if hasattr(a, "element_size"):  # (torch)
        return a.numel() * a.element_size()
    inner = getattr(a, "_array", a)
    return int(inner.nbytes)


def owns(out: Any) -> str | None:
    """Every returned array owns its memory: no two share a buffer, and none is a view of a larger
    one (a KV cache that keeps the keys would keep the rest alive; ``torch.save`` would write it)."""
    seen: dict[int, int] = {}
    for i, a in enumerate(arrays(out)):
        buf = _buffer(a)
        if buf is None or buf[1] == 0:
            continue
        nbytes = _nbytes(a)
        if buf[1] > nbytes:
            return f"array {i} ({nbytes} bytes) is a view of a buffer of {buf[1]} bytes"
        if buf[0] in seen:
            return f"arrays {seen[buf[0]]} and {i} share one buffer"
        seen[buf[0]] = i
    return None


def same(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return len(a) == len(b) and all(
        x.shape == y.shape and x.dtype == y.dtype and np.array_equal(x, y, equal_nan=True)
        for x, y in zip(a, b, strict=True)
    )


def run(backend_name: str) -> dict[str, Any]:
    """The inventory on one backend: ``{"calls": n, "arrays": m, "failures": [...]}``."""
    from rotary.testing import backends

    b = backends.get(backend_name)
    e = Env(b.xp, b.asarray, b.float64)
    calls = build(e)
    first: list[list[np.ndarray] | None] = []
    errors: dict[str, str] = {}
    outs: list[Any] = []
    for c in calls:
        try:
            out = c.run()
        except Exception as ex:  # (a call refused on this backend: recorded, must refuse again)
            errors[c.name] = f"{type(ex).__name__}: {ex}"
            first.append(None)
            outs.append(None)
            continue
        first.append(snapshot(out))
        outs.append(out)
    failures: list[str] = []
    n_arrays = 0
    for c, out in zip(calls, outs, strict=True):
        why = None if c.name in VIEWS_OF_INPUTS else owns(out)
        if why:
            failures.append(f"{c.name}: {why}")
        for a in arrays(out):
            n_arrays += 1
            why = overwrite(a)
            if why:
                failures.append(f"{c.name} returned {why}")
    for c, want in zip(calls, first, strict=True):
        if want is None:
            continue
        got = snapshot(c.run())
        if not same(got, want):
            failures.append(f"{c.name} changed after every returned array was overwritten")
    return {
        "backend": backend_name,
        "calls": len(calls),
        "arrays": n_arrays,
        "refused": errors,
        "failures": failures,
    }


if __name__ == "__main__":
    print(json.dumps(run(sys.argv[1])))
