"""Make flash-attn 2.8.3.post2's Triton rotary code importable on a CPU machine (``import _load``).

flash-attn's package ``__init__`` imports its CUDA extension (``flash_attn_2_cuda``), which a CPU
machine does not have, so the recipe (``conformance/engines/flash_attn.py``: ``INSTALL``) only
unpacks the sdist beside the venv, never builds it.  This helper, imported by each reproduction
before any ``flash_attn`` import, does what the conformance adapter does:

* registers ``flash_attn`` as a bare package over the unpacked ``flash_attn/`` folder, without
  running its ``__init__`` (``$FLASH_ATTN_SRC``, default ``flash_attn-2.8.3.post2`` beside the
  venv, where the recipe unpacks it); where that folder is missing and a real flash-attn is
  installed (a GPU machine), the real one is used;
* without CUDA, sets ``TRITON_INTERPRET=1`` before triton's kernels are defined (triton reads it
  when ``@triton.jit`` decorates ``rotary_kernel``) and replaces ``torch.cuda.device`` by a no-op
  context: ``apply_rotary`` wraps its launch in ``with torch.cuda.device(x.device.index)``, which
  fails on a CPU tensor.

transformers is imported first: it probes for an installed ``flash_attn`` when imported.
"""

import contextlib
import importlib
import importlib.machinery
import os
import sys
import types

import torch
import transformers  # noqa: F401  (before the bare package exists)

VERSION = "2.8.3.post2"
SRC = os.environ.get("FLASH_ATTN_SRC", os.path.join(os.path.dirname(sys.prefix), f"flash_attn-{VERSION}"))
CUDA = torch.cuda.is_available()

if not CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
    torch.cuda.device = lambda *_a, **_k: contextlib.nullcontext()

if "flash_attn" not in sys.modules and os.path.isdir(os.path.join(SRC, "flash_attn")):
    pkg = types.ModuleType("flash_attn")
    pkg.__path__ = [os.path.join(SRC, "flash_attn")]
    pkg.__version__ = VERSION
    spec = importlib.machinery.ModuleSpec("flash_attn", None, is_package=True)
    spec.submodule_search_locations = pkg.__path__
    pkg.__spec__ = spec
    sys.modules["flash_attn"] = pkg

try:
    _kernels = importlib.import_module("flash_attn.ops.triton.rotary")
except ImportError as e:
    raise ImportError(
        f"flash-attn's source is not at {SRC} and no flash-attn is installed ({e}): unpack the sdist "
        "beside the venv as conformance/engines/flash_attn.py's INSTALL recipe does, or set FLASH_ATTN_SRC"
    ) from e

if not CUDA:
    from triton.runtime.interpreter import InterpretedFunction

    if not isinstance(_kernels.rotary_kernel, InterpretedFunction):
        raise RuntimeError(
            "flash_attn.ops.triton.rotary was compiled for a GPU, but there is no CUDA: "
            "set TRITON_INTERPRET=1 before importing triton"
        )
