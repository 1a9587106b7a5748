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
        self.settings = learned.Settings.of(rope, xpos_scale_base)
        init = learned.frequencies(
            self.settings.rope,
            xp=torch,
            dtype=dtype or torch.float32,
            device=device,
            n_axes=n_axes,
            heads=heads,
        )
        self.freqs = torch.nn.Parameter(init)

    def __prepare_scriptable__(self) -> torch.nn.Module:
        """``torch.jit.script`` refuses clearly: rotary is Python code over the array API, which
        TorchScript cannot compile."""
        raise TypeError(
            "torch.jit.script cannot compile rotary (Python code over the array API standard); use "
            "torch.compile, torch.export.export, or torch.jit.trace (positions are data of the trace)"
        )

    def forward(self, q: Any, k: Any, pos: Any, k_pos: Any = None) -> tuple[Any, Any]:
        """Rotated ``(q, k)``; see :func:`rotary.learned.apply`."""
        return self.settings.apply(q, k, pos, self.freqs, k_pos)

    def rotate(self, x: Any, pos: Any) -> Any:
        """``x`` rotated (no xPos scale: that needs queries and keys together)."""
        return self.settings.rotate(x, pos, self.freqs)

    def extra_repr(self) -> str:
        return f"{self.settings.rope!r}, freqs={tuple(self.freqs.shape)}"
