"""Thin framework modules that hold trained RoPE frequencies as a parameter.

- :mod:`rotary.modules.torch`: ``LearnedRoPE``, a ``torch.nn.Module``;
- :mod:`rotary.modules.flax`: ``LearnedRoPE``, a Flax NNX module (where flax is installed).

Each imports its framework when imported (``rotary`` itself never does); the math is
:mod:`rotary.learned`'s.
"""
