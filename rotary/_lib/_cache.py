"""All of rotary's state, and the one rule that keeps it sound.

rotary keeps three things between calls (``docs/guides/state.rst`` lists each, with its key,
its bound and the benchmark row that justifies it):

- the **byte cache**: device constants (frequency and digit tables, per-position tables,
  decoding rows), host frequencies, RoPE objects of the functional API and JAX ``jit``
  wrappers; least recently used entries go first once the bytes held exceed the budget
  (default 64 MiB; ``ROTARY_CACHE_BYTES`` or :func:`set_cache_limit`);
- the **checked signatures**: the argument types, shapes, dtypes and devices that passed
  the checks, with a backend's decoding plan for them (at most 4096, then it starts over);
- the **fast-path switch** (:func:`fast_paths`), per thread and per ``asyncio`` task.

The rule, enforced here and nowhere else: **a value is stored only when it was made in a
plain eager scope**.  Each array library registers, when rotary first sees its arrays,
whether the current context is plain (no ``torch.compile``/``torch.export`` trace, fake or
functional mode, inference mode, ``torch.func`` transform; no JAX trace or default-device
override), a scope that clears what it can for building (fake and other dispatch modes,
inference mode), and how a stored value is made valid in the current context (a real tensor
becomes fake under a fake mode that refuses real tensors).  Whatever ran before, a stored
value is one that a plain eager call would have made.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import threading
from collections.abc import Callable, Hashable, Iterator
from typing import Any, Literal, NamedTuple, TypeVar

from . import _compat
from ._process import after_fork_in_child
from ._validation import check_bool, check_int

__all__ = [
    "CacheInfo",
    "cache_info",
    "clear_cache",
    "context_clean",
    "fast_paths",
    "fast_paths_enabled",
    "get_or_build",
    "memo_add",
    "memo_get",
    "register_library",
    "set_cache_limit",
]

V = TypeVar("V")

#: The kinds of state, each switchable off for the benchmarks (:func:`without`).
StateKind = Literal[
    "constants", "position_table", "decode_rows", "ropes", "jit", "signatures", "plans", "namespaces"
]
STATE_KINDS: tuple[StateKind, ...] = (
    "constants",
    "position_table",
    "decode_rows",
    "ropes",
    "jit",
    "signatures",
    "plans",
    "namespaces",
)

_DEFAULT_LIMIT = 64 * 2**20


class CacheInfo(NamedTuple):
    """What the cache holds: ``entries``, ``nbytes`` (of ``limit``), and the ``hits``,
    ``misses`` and ``evictions`` since the last :func:`clear_cache`."""

    entries: int
    nbytes: int
    limit: int
    hits: int
    misses: int
    evictions: int


# -- the libraries' context rules ------------------------------------------------------------------
class _Library(NamedTuple):
    clean: Callable[[], bool]  # the current context is a plain eager scope
    checks_hold: Callable[[], bool]  # checked signatures and plans made here hold in a plain scope
    scope: Callable[[], contextlib.AbstractContextManager[Any]]  # as plain a scope as can be entered
    adapt: Callable[[Any], Any]  # a stored value, valid in the current context
    clear: Callable[[], None]  # drops the library's own state (clear_cache)


_LIBRARIES: dict[str, _Library] = {}


def register_library(
    name: str,
    *,
    clean: Callable[[], bool],
    scope: Callable[[], contextlib.AbstractContextManager[Any]] | None = None,
    adapt: Callable[[Any], Any] | None = None,
    clear: Callable[[], None] | None = None,
    checks_hold: Callable[[], bool] | None = None,
) -> None:
    """Register an array library's context rules (the backend layer does, on first use), and
    the state it keeps of its own (torch: the constants compiled graphs read).

    ``checks_hold``: a context (default: a plain one, ``clean``) whose checked signatures and
    decoding plans hold in every plain one.  Plans hold no array of the call (they read the
    byte cache, whose values are built in ``scope``), so torch's inference mode is such a
    context: serving under it keeps its memo."""
    _LIBRARIES[name] = _Library(
        clean,
        checks_hold or clean,
        scope or contextlib.nullcontext,
        adapt or (lambda v: v),
        clear or (lambda: None),
    )


def context_clean() -> bool:
    """The current context is a plain eager scope for every library rotary has seen: what is
    made here may be stored."""
    for lib in _LIBRARIES.values():
        if not lib.clean():
            return False
    return True


def _adapt(value: Any) -> Any:
    for lib in _LIBRARIES.values():
        value = lib.adapt(value)
    return value


@contextlib.contextmanager
def _build_scope() -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        for lib in list(_LIBRARIES.values()):
            stack.enter_context(lib.scope())
        yield


# -- the byte cache --------------------------------------------------------------------------------
def _env_limit() -> int:
    raw = os.environ.get("ROTARY_CACHE_BYTES")
    if not raw:
        return _DEFAULT_LIMIT
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"ROTARY_CACHE_BYTES must be an integer number of bytes, got {raw!r}") from None
    if value < 0:
        raise ValueError(f"ROTARY_CACHE_BYTES must be >= 0, got {value}")
    return value


class _Cache:
    """Entries in least-recently-used order, each with its bytes.

    The entries live in a plain ``dict`` (its insertion order is the order of use: a hit is
    taken out and put back at the end), never an ``OrderedDict``: a key's ``__hash__`` and
    ``__eq__`` are Python code (a configuration's, a scaling's, a user's) that runs inside the
    dictionary's own operations, and an exception raised there (``KeyboardInterrupt``,
    ``MemoryError``) leaves a plain ``dict`` as it was, where it left an ``OrderedDict``'s links
    and table apart for good (issue 50).  So every change is one ``dict`` operation, atomic
    whatever a key's code raises; an interrupt between two of them loses at most the entry in
    hand.  The bytes held are recomputed from the entries, never kept as a running count, so an
    interrupt between any two bytecodes leaves the accounting true; the lock is re-made in a
    forked child (:meth:`after_fork`, run by :mod:`._process`)."""

    def __init__(self, limit: int) -> None:
        self._data: dict[Hashable, tuple[Any, int]] = {}
        self._lock = threading.RLock()
        self.limit = limit
        self.hits = self.misses = self.evictions = 0

    @property
    def nbytes(self) -> int:
        return sum([n for _, n in list(self._data.values())])

    def get(self, key: Hashable) -> Any:
        with self._lock:
            hit = self._data.pop(key, None)
            if hit is None:
                self.misses += 1
                return None
            self._data[key] = hit  # (now the most recently used)
            self.hits += 1
            return hit[0]

    def put(self, key: Hashable, value: Any, nbytes: int) -> None:
        with self._lock:
            self._data.pop(key, None)
            if nbytes <= self.limit:
                self._data[key] = (value, nbytes)
            self._shrink()

    def _shrink(self) -> None:
        held = self.nbytes
        while held > self.limit and self._data:
            _, n = self._data.pop(next(iter(self._data)))  # (the least recently used)
            held -= n
            self.evictions += 1

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self.hits = self.misses = self.evictions = 0

    def after_fork(self) -> None:
        """In a forked child: a new lock (the parent's may be held by a thread that does not
        exist here), and no entries if a thread was inside the cache when the process forked."""
        held = not self._lock.acquire(blocking=False)
        self._lock = threading.RLock()
        if held:
            self._data = {}


_CACHE = _Cache(_env_limit())
_OFF: set[str] = set()
after_fork_in_child(lambda: _CACHE.after_fork())


def get_or_build(key: Hashable, build: Callable[[], tuple[V, int]], kind: StateKind) -> V:
    """The value stored under ``key``, else ``build()``'s ``(value, nbytes)`` value.

    ``build`` runs in the plainest scope the libraries allow (outside fake and inference
    modes); its value is stored only when that scope is a plain eager one
    (:func:`context_clean`).  The value returned is made valid in the caller's context.
    """
    hashable = _hashable(key)
    if kind not in _OFF and hashable:
        hit = _CACHE.get(key)
        if hit is not None:
            return _adapt(hit)
    with _build_scope():
        value, nbytes = build()
        # (a key that cannot be hashed, e.g. a library's unhashable device object, is never
        # stored: the value is built for each call, never guessed from another key)
        keep = kind not in _OFF and hashable and context_clean()
    if keep:  # (read-only where the library allows: a stored value is rotary's, never the caller's)
        _CACHE.put(key, _compat.freeze(value), nbytes)
    return _adapt(value)


def _hashable(key: Hashable) -> bool:
    try:
        hash(key)
    except TypeError:
        return False
    return True


def cache_info() -> CacheInfo:
    """The state of rotary's cache of frequency tables and device constants.

    Examples
    --------
    >>> import numpy as np, rotary
    >>> rotary.clear_cache()
    >>> _ = rotary.rotate(np.ones((4, 8)), [0, 1, 2, 3])
    >>> info = rotary.cache_info()
    >>> info.entries > 0, info.nbytes <= info.limit
    (True, True)
    """
    c = _CACHE
    with c._lock:
        return CacheInfo(len(c._data), c.nbytes, c.limit, c.hits, c.misses, c.evictions)


def clear_cache() -> None:
    """Drop all of rotary's state: every cached table, constant, RoPE object and compiled JAX
    function, and every checked argument signature with its decoding plan.  Everything is
    rebuilt on demand; results do not change (:func:`fast_paths` is a setting, not state,
    and keeps its value)."""
    _CACHE.clear()
    _MEMO.clear()
    _compat.memo_types(enabled=True)
    for lib in list(_LIBRARIES.values()):
        lib.clear()


def set_cache_limit(nbytes: int) -> int:
    """Set the cache's byte budget (``0`` disables caching); returns the previous one.

    Least recently used entries are evicted at once if the cache holds more.  The default
    is 64 MiB, or ``ROTARY_CACHE_BYTES`` from the environment.
    """
    n = check_int(nbytes, "nbytes", minimum=0)
    with _CACHE._lock:
        old = _CACHE.limit
        _CACHE.limit = n
        _CACHE._shrink()
    return old


@contextlib.contextmanager
def without(*kinds: StateKind) -> Iterator[None]:
    """Neither read nor store the ``kinds`` of state inside the block (for the benchmarks,
    which measure each piece of state with and without it in one run; not thread-safe)."""
    bad = set(kinds) - set(STATE_KINDS)
    if bad:
        raise ValueError(f"unknown state kinds {sorted(bad)}; expected some of {STATE_KINDS}")
    old = set(_OFF)
    _OFF.update(kinds)
    _compat.memo_types(enabled="namespaces" not in _OFF)
    try:
        yield
    finally:
        _OFF.clear()
        _OFF.update(old)
        _compat.memo_types(enabled="namespaces" not in _OFF)


# -- checked signatures ----------------------------------------------------------------------
_MEMO: dict[Hashable, Any] = {}
_MAX_MEMO = 4096
_MISSING: Any = object()


def memo_get(key: Hashable) -> Any:
    """What :func:`memo_add` stored with ``key`` (an entry point and its arguments' types,
    shapes, dtypes and devices, which passed the checks before: the checks that depend on
    nothing else need not run again), or :data:`MISSING`."""
    if "signatures" in _OFF:
        return _MISSING
    plan = _MEMO.get(key, _MISSING)
    return None if plan is not _MISSING and "plans" in _OFF else plan


MISSING = _MISSING


def memo_add(key: Hashable, plan: Any = None) -> None:
    """Remember that ``key`` passed the checks, with a backend's ``plan`` for it (a shortcut
    that reads only the byte cache), in a context where checks hold (a plain eager scope, or one
    a library declares equivalent for them: torch's inference mode)."""
    if "signatures" in _OFF or not all(lib.checks_hold() for lib in _LIBRARIES.values()):
        return
    if len(_MEMO) >= _MAX_MEMO:
        _MEMO.clear()
    _MEMO[key] = plan


# -- fast paths ------------------------------------------------------------------------------
_FAST: contextvars.ContextVar[bool] = contextvars.ContextVar("rotary_fast_paths", default=True)


def fast_paths_enabled() -> bool:
    """The switch's value here (not traceable by ``torch.compile``: read it outside traced code,
    or after a check that the code is not being compiled)."""
    return _FAST.get()


@contextlib.contextmanager
def fast_paths(enabled: bool) -> Iterator[None]:
    """Turn rotary's eager fast paths on or off inside a ``with`` block (in this thread or
    ``asyncio`` task only).

    The fast paths (blocked NumPy/torch kernels, per-position tables) compute exactly what
    the generic array-API code computes, bit for bit; turning them off is for checking
    that, and for debugging.

    Examples
    --------
    >>> import numpy as np, rotary
    >>> x = np.random.default_rng(0).normal(size=(2, 300, 64)).astype(np.float32)
    >>> fast = rotary.rotate(x, np.arange(300))
    >>> with rotary.fast_paths(False):
    ...     slow = rotary.rotate(x, np.arange(300))
    >>> bool((fast == slow).all())
    True
    """
    token = _FAST.set(check_bool(enabled, "enabled"))
    try:
        yield
    finally:
        _FAST.reset(token)
