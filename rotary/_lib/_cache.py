"""The one cache: host tables and device constants, bounded by a byte budget.

Entries are evicted least recently used first once the bytes held exceed the budget
(default 64 MiB; ``ROTARY_CACHE_BYTES`` in the environment or :func:`set_cache_limit`
change it).  The caller decides what may be stored: the backend layer hands only real
arrays here, never JAX tracers, FakeTensors or functional tensors (see
:mod:`rotary._backends`), so a trace or an export never poisons later eager calls.
"""

from __future__ import annotations

import collections
import contextlib
import os
import threading
import types
from collections.abc import Callable, Hashable, Iterator
from typing import Any, NamedTuple, TypeVar

from ._validation import check_bool, check_int

__all__ = [
    "CacheInfo",
    "cache_info",
    "clear_cache",
    "fast_paths",
    "fast_paths_enabled",
    "get_or_build",
    "set_cache_limit",
]

V = TypeVar("V")

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
    def __init__(self, limit: int) -> None:
        self._data: collections.OrderedDict[Hashable, tuple[Any, int]] = collections.OrderedDict()
        self._lock = threading.RLock()
        self.limit = limit
        self.nbytes = self.hits = self.misses = self.evictions = 0

    def get(self, key: Hashable) -> Any:
        with self._lock:
            hit = self._data.get(key)
            if hit is None:
                self.misses += 1
                return None
            self._data.move_to_end(key)
            self.hits += 1
            return hit[0]

    def put(self, key: Hashable, value: Any, nbytes: int) -> None:
        with self._lock:
            old = self._data.pop(key, None)
            if old is not None:
                self.nbytes -= old[1]
            if nbytes > self.limit:
                return
            self._data[key] = (value, nbytes)
            self.nbytes += nbytes
            self._shrink()

    def _shrink(self) -> None:
        while self.nbytes > self.limit and self._data:
            _, (_, n) = self._data.popitem(last=False)
            self.nbytes -= n
            self.evictions += 1

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self.nbytes = self.hits = self.misses = self.evictions = 0


_CACHE = _Cache(_env_limit())


def get_or_build(key: Hashable, build: Callable[[], tuple[V, int, bool]]) -> V:
    """The value cached under ``key``, else ``build()``'s.

    ``build`` returns ``(value, nbytes, storable)``; the value is stored only when
    ``storable`` (a real array, not a tracer or fake tensor).
    """
    hit = _CACHE.get(key)
    if hit is not None:
        return hit
    value, nbytes, storable = build()
    if storable:
        _CACHE.put(key, value, nbytes)
    return value


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
    """Drop every cached table and constant (they are rebuilt on demand)."""
    _CACHE.clear()


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


# -- fast paths ------------------------------------------------------------------------------
_FAST = [True]


def fast_paths_enabled() -> bool:
    return _FAST[0]


@contextlib.contextmanager
def fast_paths(enabled: bool) -> Iterator[None]:
    """Turn rotary's eager fast paths on or off inside a ``with`` block.

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
    check_bool(enabled, "enabled")
    old = _FAST[0]
    _FAST[0] = enabled
    try:
        yield
    finally:
        _FAST[0] = old


# -- interned objects -------------------------------------------------------------------------
# The objects are attributes of a module object, not items of a dict: ``torch.compile`` reads a
# module attribute as it is when the trace reaches it, and a dict as it was when the trace first
# read it (so a second configuration interned in the same trace would not be found).
_INTERNED = types.ModuleType("rotary._interned")
_HANDLES: dict[Hashable, str] = {}
_MAX_INTERNED = 1024


def intern(key: Hashable, make: Callable[[], Any]) -> str:
    """A short handle for the object ``make()`` stands for under ``key`` (made once); look it up
    with :func:`interned`.  Handles are strings, so a ``torch.compile`` trace can receive one
    as a constant.  At most 1024 objects are held (then the table starts over)."""
    with _CACHE._lock:
        handle = _HANDLES.get(key)
        if handle is None:
            if len(_HANDLES) >= _MAX_INTERNED:
                for h in _HANDLES.values():
                    delattr(_INTERNED, h)
                _HANDLES.clear()
            handle = f"rotary_{len(_HANDLES)}_{hash(key) & 0xFFFFFFFF:x}"
            setattr(_INTERNED, handle, make())
            _HANDLES[key] = handle
        return handle


def interned(handle: str) -> Any:
    """The object behind ``handle``."""
    return getattr(_INTERNED, handle)


# -- checked signatures ----------------------------------------------------------------------
_MEMO: dict[Hashable, Any] = {}
_MAX_MEMO = 4096


def memo_has(key: Hashable) -> bool:
    """``key`` (an entry point and its arguments' types, shapes, dtypes and devices) passed the
    checks before: the ones that depend on nothing else need not run again."""
    return key in _MEMO


def memo_plan(key: Hashable) -> Any:
    """The plan stored with ``key`` (a backend's shortcut for these arguments), or ``None``."""
    return _MEMO.get(key)


def memo_add(key: Hashable, plan: Any = None) -> None:
    if len(_MEMO) >= _MAX_MEMO:
        _MEMO.clear()
    _MEMO[key] = plan
