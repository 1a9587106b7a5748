"""``LearnedRoPE``: trained RoPE frequencies as a ``torch.nn.Parameter`` (see :mod:`rotary.learned`).

Examples
--------
>>> import torch, rotary
>>> from rotary.modules.torch import LearnedRoPE
>>> rope = LearnedRoPE(rotary.RoPE(16))                         # starts as the default RoPE
>>> q = k = torch.ones(1, 2, 4, 16)
>>> qr, kr = rope(q, k, torch.arange(4))
>>> qr.sum().backward()
>>> rope.freqs.grad.shape
torch.Size([8])
"""

from __future__ import annotations

# mypy: disable-error-code="misc"
# (the framework's module class is untyped here: mypy sees it as Any)
from typing import Any

import torch

from .. import learned
from .._lib import _validation as v
from .._lib._typing import Layout
from .._rope import RoPE

__all__ = ["LearnedRoPE"]


class LearnedRoPE(torch.nn.Module):
    """RoPE whose frequencies train: a parameter initialised from ``rope`` (a :class:`rotary.RoPE`,
    scaling included, or a head dim for the default RoPE).

    Parameters
    ----------
    rope : RoPE or int
        The initial frequencies, layout and rotated width.
    n_axes, heads
        Coordinates per position, and one set of frequencies per head (RoPE-Mixed: ``n_axes=2,
        heads=H``): see :func:`rotary.learned.frequencies`.
    xpos_scale_base : float, optional
        Also apply xPos in :meth:`forward` (queries scaled, keys inversely).
    dtype, device
        Of the parameter (default float32).
    """

    def __init__(
        self,
        rope: RoPE | int,
        *,
        n_axes: int = 1,
        heads: int | None = None,
        xpos_scale_base: float | None = None,
        dtype: Any = None,
        device: Any = None,
    ) -> None:
        super().__init__()
        if not isinstance(rope, RoPE):
            rope = RoPE(v.check_head_dim(rope))
        self.layout: Layout = rope.layout
        self.head_dim = rope.head_dim
        self.rotary_dim = rope.config.width
        self.xpos_scale_base = xpos_scale_base
        init = learned.frequencies(
            rope, xp=torch, dtype=dtype or torch.float32, device=device, n_axes=n_axes, heads=heads
        )
        self.freqs = torch.nn.Parameter(init)

    def forward(self, q: Any, k: Any, pos: Any, k_pos: Any = None) -> tuple[Any, Any]:
        """Rotated ``(q, k)``; see :func:`rotary.learned.apply`."""
        return learned.apply(
            q,
            k,
            pos,
            self.freqs,
            layout=self.layout,
            rotary_dim=self.rotary_dim,
            k_pos=k_pos,
            xpos_scale_base=self.xpos_scale_base,
        )

    def rotate(self, x: Any, pos: Any) -> Any:
        """``x`` rotated (no xPos scale: that needs queries and keys together)."""
        return learned.rotate(x, pos, self.freqs, layout=self.layout, rotary_dim=self.rotary_dim)

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, layout={self.layout!r}, freqs={tuple(self.freqs.shape)}"
