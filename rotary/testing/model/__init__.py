"""Certify an engine's RoPE against a model's config: ``check_model_rope(adapter, config)``.

:func:`rotary.testing.check_rope` certifies a function ``fn(x, pos)`` at one base and one
layout.  Engines rarely get that wrong; they go wrong in the *mapping* from a model's config to
its RoPE: a scaling read on one code path and dropped on another, an attention factor applied
twice or not at all, a table that clamps positions past its end, bands applied inverted.  Here
``rotary`` reads the config (:func:`rotary.hf.model_rope`: every family and layer type of the
census) and checks an engine's RoPE for it, given through the adapter protocol of
:mod:`rotary.testing.engine`, against float64 truth:

=================  ==============================================================================
``rotation``       q and k rotated as the config says (frequencies, pair layout, partial rotary,
                   M-RoPE position rows), at positions ``0 .. 2**20 + 3`` and past every table
``attention_factor`` cos and sin scaled by the config's attention factor (YaRN ``mscale``, LongRoPE)
``softmax_scale``  the logits' extra factor outside the rotation (MLA: ``mscale(s, mscale_all_dim)**2``)
``query_scale``    queries scaled by the config's position-dependent temperature (Llama 4, Ministral 3)
``positions``      past its table an engine is right or refuses; it may refuse only past the
                   config's context (``max_position_embeddings``); clamped or wrapped is a failure
``packed``         (asked for by name: the field report's ``thd`` case) documents packed in one row
                   (``cu_seqlens``), each rotated at positions restarting at 0
``packed_offsets`` (asked for by name) the packed documents each continuing from its own offset,
                   as a ragged decoding batch holds them
=================  ==============================================================================

The packed checks call the engine's ``rotate_packed(q, k, cu_seqlens, offsets)`` (the optional
hook of :class:`rotary.testing.engine.EngineRope`) on one row of documents of
:data:`PACKED_LENGTHS` tokens, at offsets 0 and then :data:`PACKED_OFFSETS`.  The truth is
rotary's packed rotation: positions from :func:`rotary.positions.from_cu_seqlens` (plus each
document's offset), rotated in float64 with the rotation check's tolerance.  An engine that gets a
document wrong is told which document and from which of its tokens, and at which positions it
rotated them (the row's token index: positions that do not restart; its offset ignored; another
document's offset...).  An engine whose RoPE takes no packed input (no ``rotate_packed``, or one
raising :class:`rotary.testing.engine.Unsupported`) is "not applicable", with the reason.

Each layer type of the config and each dtype asked for is checked apart (an engine that cannot
express one is "not supported", not failed), on data exactly representable in that dtype.
Tolerances are those of :func:`check_rope`: ``ulps * eps(dtype)`` (8 by default) relative to the
data, plus the allowance of the angle kind the engine declares (its ``angles`` attribute:
:func:`rotary.testing.engine.angle_error`; ``2 * 2**-23 * |pos|`` for ``"float32"``), both times the
attention factor.

One mistake fails one check.  The attention factor is measured from norms (a rotation keeps the
norm of the features it turns, whatever their pairing), and the rotation is checked with the
engine's factor brought to the config's; a factor folded into the softmax scale passes both.  A
failure is diagnosed in words, each of them verified against the engine's own numbers:

* how the engine pairs the features, where that is not the config's layout, width or slice
  (each feature rotated alone), q and k judged apart: then nothing is said of frequencies,
  which a wrong pairing makes meaningless;
* where the engine is right within a looser angle kind than it declares, which to declare;
* the positions it rotates at, where its frequencies are the config's: every position off by
  ``delta`` (solved from its angles at position 0), a table indexed by the token's index, the
  positions rounded to float16 or bfloat16, the rotation by ``-pos`` (sin's sign);
* which known mistake of the frequencies the numbers match within tolerance (no scaling, the
  bands inverted, the wrong original context, a clamped or wrapping table...), or another base
  (solved from the engine's frequencies, printed in as few digits as still match);
* per pair, the factor on the config's frequency, from one call at positions rising by 1.25x to
  ``2**20`` on data exact in the dtype: every frequency that agrees with the engine's angle at
  every position (within the dtype's rounding and the angle allowance) forms an interval; a factor
  is printed only where that interval excludes 1 and is narrower than 4%, in as few digits as
  keep it inside; consecutive pairs share one factor only where their intervals overlap; where
  the dtype leaves it wider the message says the dtype cannot resolve it; where none agrees,
  that the pair turns at no single frequency;
* the attention factor of q and of k, and where it matches a known mistake (missing, applied
  twice, on one of them only, ``mscale`` ignored);
* from which position on the engine is wrong (the first wrong position: every position after
  the last right sampled one checked, then bisected, and every one below it, up to ``2**18``;
  where not every position below it was checked, said so), and from which its outputs are NaN
  (the ``positions`` check fails there: NaN is neither a position computed nor a refusal);
* a refusal that depends on the call's token count (a table sized by it);
* for a scaling chosen per call (LongRoPE, dynamic NTK), calls of ``n`` and ``n + 1`` tokens
  where it switches, and a mistake seen only there said so.

An exception raised in the adapter's own code is an "adapter error" (no verdict on the engine:
:func:`rotary.testing.engine.raised_by_adapter`).


The package holds the words of each check beside that check: :mod:`.driver` (the checks over
layer types and dtypes, the rotation check), :mod:`.report`, :mod:`.configs`, :mod:`.truth`,
:mod:`.layer` (the engine's calls), :mod:`.pairing` (pairing and layout), :mod:`.factors`
(attention factor, softmax and query scales), :mod:`.positions` (the positions check, positions
an engine rotates at, where it is wrong), :mod:`.frequencies`, :mod:`.tables`, :mod:`.suspects`
(known mistakes), :mod:`.per_call` (scalings chosen per call), :mod:`.mrope`, :mod:`.angles` (the
declared angle kind), :mod:`.packed`, and :mod:`.diagnosis` (a failure in words).

Examples
--------
An adapter of rotary itself (the float32 recipe, as Hugging Face computes it) passes, and one
that ignores YaRN's attention factor is caught:

>>> import numpy as np, rotary
>>> from rotary.testing import check_model_rope
>>> class Rotary:
...     NAME, INSTALL = "rotary", "pip install rotary"
...     def __init__(self, af=None): self.af = af
...     def version(self): return rotary.__version__
...     def build(self, config, *, layer_type, dtype):
...         rope = rotary.hf.from_hf(config, angles="float32", layer_type=layer_type)
...         af = self.af
...         class Engine:
...             angles = "float32"
...             def rotate(self, q, k, pos):
...                 q, k = rope.apply(q, k, pos[:, None])
...                 f = 1.0 if af is None else af / rope.attention_factor
...                 return q * f, k * f
...         return Engine()
>>> cfg = {"hidden_size": 256, "num_attention_heads": 4, "rope_theta": 1e6, "max_position_embeddings": 4096,
...        "rope_scaling": {"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 4096}}
>>> bool(check_model_rope(Rotary(), cfg, dtypes=("float32",)))
True
>>> report = check_model_rope(Rotary(af=1.0), cfg, dtypes=("float32",))
>>> report.failed  # (the rotation holds: only the factor is wrong)
['attention_factor']
>>> print(report["attention_factor"].message)  # doctest: +ELLIPSIS
cos and sin are scaled by 1.0000 where the config implies 1.2773 ...
"""

from __future__ import annotations

from .configs import import_target, load_config, make_adapter
from .driver import check_model_rope
from .layer import _data as _data  # (tests/test_model_check.py: the data the checks rotate)
from .packed import PACKED_LENGTHS, PACKED_OFFSETS
from .positions import SCAN_AFTER, SCAN_CALL, SCAN_LIMIT
from .report import CONFIG_CHECKS, MODEL_CHECKS, PACKED_CHECKS, ModelCheck, ModelRopeReport

__all__ = [
    "CONFIG_CHECKS",
    "MODEL_CHECKS",
    "PACKED_CHECKS",
    "PACKED_LENGTHS",
    "PACKED_OFFSETS",
    "SCAN_AFTER",
    "SCAN_CALL",
    "SCAN_LIMIT",
    "ModelCheck",
    "ModelRopeReport",
    "check_model_rope",
    "import_target",
    "load_config",
    "make_adapter",
]
