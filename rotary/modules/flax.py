"""``LearnedRoPE``: trained RoPE frequencies as a Flax NNX parameter (see :mod:`rotary.learned`).

Examples
--------
>>> import jax, jax.numpy as jnp, rotary
>>> from flax import nnx
>>> from rotary.modules.flax import LearnedRoPE
>>> rope = LearnedRoPE(rotary.RoPE(16))
>>> q = jnp.ones((1, 2, 4, 16))
>>> def loss(m):
...     qr, kr = m(q, q, jnp.arange(4))
...     return (qr * kr).sum()
>>> grads = nnx.grad(loss)(rope)
>>> grads.freqs.value.shape
(8,)
"""

from __future__ import annotations

# mypy: disable-error-code="misc"
# (the framework's module class is untyped here: mypy sees it as Any)
from typing import Any

import jax.numpy as jnp
from flax import nnx

from .. import learned
from .._rope import RoPE

__all__ = ["LearnedRoPE"]


class LearnedRoPE(nnx.Module):
    """RoPE whose frequencies train: an ``nnx.Param`` initialised from ``rope`` (a
    :class:`rotary.RoPE`, or a head dim); same options as :class:`rotary.modules.torch.LearnedRoPE`."""

    def __init__(
        self,
        rope: RoPE | int,
        *,
        n_axes: int = 1,
        heads: int | None = None,
        xpos_scale_base: float | None = None,
        dtype: Any = None,
    ) -> None:
        self.settings = learned.Settings.of(rope, xpos_scale_base)
        init = learned.frequencies(
            self.settings.rope, xp=jnp, dtype=dtype or jnp.float32, n_axes=n_axes, heads=heads
        )
        self.freqs = nnx.Param(init)

    def __call__(self, q: Any, k: Any, pos: Any, k_pos: Any = None) -> tuple[Any, Any]:
        """Rotated ``(q, k)``; see :func:`rotary.learned.apply`."""
        return self.settings.apply(q, k, pos, self.freqs.value, k_pos)

    def rotate(self, x: Any, pos: Any) -> Any:
        """``x`` rotated (no xPos scale)."""
        return self.settings.rotate(x, pos, self.freqs.value)
