"""A process's whole life: what rotary holds across a fork, in one place.

rotary imports a library's modules only when it first sees that library's arrays (its backend,
``array_api_compat``'s wrapper, the Triton kernel).  Python imports a module under a lock of
that module, held until its code has run; a process that forks while another thread is inside
such an import leaves the child a lock held by a thread that does not exist there, and the
child's first import of that module waits on it forever (issue 50: a torch ``DataLoader``
forking workers while another thread makes rotary's first torch call).  The contract:

- every import rotary makes after its own import goes through :func:`load`, which imports under
  one lock the first time, and the lazy imports of another library's code that rotary runs
  the first time it sees a library's arrays (``array_api_compat``'s dispatch) run under it too
  (:func:`importing`); what a library imports inside its own computations is its own (Dask
  imports ``distributed`` the first time it rechunks);
- :func:`os.register_at_fork` takes that lock before a fork and gives it back after, in the
  parent and in the child: a fork waits until an import in progress is done, so no module is
  ever half imported in a child;
- the other state with a lock (the byte cache, torch's compile constants) registers what a child
  re-makes with :func:`after_fork_in_child`: its locks (held, in the child, by no thread) and its
  entries if a thread was changing them when the process forked.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import threading
from collections.abc import Callable, Iterator
from types import ModuleType

__all__ = ["after_fork_in_child", "importing", "load"]

_IMPORT = threading.RLock()
_LOADED: set[str] = set()  # (imported, completely, by load: read without the lock)
_IN_CHILD: list[Callable[[], None]] = []
#: How long a fork waits for an import in progress; past it (an import waiting on the forking
#: thread itself: a cycle no lock can break) the fork goes ahead without the lock.  (Python runs
#: the before-fork hooks registered when the fork began: a module that an import in progress
#: brings in and that registers its own hooks meanwhile gets its after-hooks alone, that once;
#: ``logging``'s, imported so, says "cannot release un-acquired lock" and is otherwise right.)
_FORK_WAIT_S = 10.0


def load(name: str) -> ModuleType:
    """The module ``name``, imported the first time under the lock a fork waits for.

    Python's ``import`` statement in a function body is a lazy import that a fork may catch
    half done; this is rotary's only way to import after its own import.  ``torch.compile``
    calls it for real at trace time and keeps the module as a constant (the attribute set below
    is what ``torch.compiler.assume_constant_result`` sets): nothing of it is traced.
    """
    if name in _LOADED:
        module = sys.modules.get(name)
        if module is not None:
            return module
    with _IMPORT:
        module = importlib.import_module(name)
        _LOADED.add(name)
    return module


load._dynamo_marked_constant = True  # type: ignore[attr-defined]


@contextlib.contextmanager
def importing() -> Iterator[None]:
    """Hold the lock a fork waits for around another library's code that may import lazily
    (``array_api_compat``'s dispatch imports its wrapper of a library at that library's first
    array).  (Dynamo cannot trace a lock: :mod:`._compat` enters it outside its traces.)"""
    with _IMPORT:
        yield


def after_fork_in_child(fn: Callable[[], None]) -> Callable[[], None]:
    """Run ``fn`` in every forked child (after the import lock is re-made), in registration order."""
    _IN_CHILD.append(fn)
    return fn


_HELD = [False]


def _before() -> None:
    _HELD[0] = _IMPORT.acquire(timeout=_FORK_WAIT_S)


def _in_parent() -> None:
    if _HELD[0]:
        _HELD[0] = False
        _IMPORT.release()


def _in_child() -> None:
    global _IMPORT
    _HELD[0] = False
    _IMPORT = threading.RLock()  # (the parent's, held here by the thread that forked, or by none)
    for fn in _IN_CHILD:
        fn()


if hasattr(os, "register_at_fork"):  # (POSIX: DataLoader workers and multiprocessing fork)
    os.register_at_fork(before=_before, after_in_parent=_in_parent, after_in_child=_in_child)
