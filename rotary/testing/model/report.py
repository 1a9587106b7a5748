"""The report: each check's result (:class:`ModelCheck`) and every check of an engine against one
config (:class:`ModelRopeReport`)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from typing import Any, Literal

#: The checks, in report order, with what each asserts.
MODEL_CHECKS: dict[str, str] = {
    "rotation": "q and k rotated as the config says, at positions 0 .. 2**20 + 3",
    "attention_factor": "cos and sin scaled by the config's attention factor",
    "softmax_scale": "the logits' extra factor outside the rotation (MLA with YaRN)",
    "query_scale": "queries scaled by the config's position-dependent temperature",
    "positions": "positions past a table are right or refused, never clamped or wrapped",
    "packed": "documents packed in one row (cu_seqlens), each rotated at positions restarting at 0",
    "packed_offsets": "packed documents each continuing from its own offset (a ragged decoding batch)",
}


#: The checks of a config, run by default.
CONFIG_CHECKS = ("rotation", "attention_factor", "softmax_scale", "query_scale", "positions")


#: The checks of packed input (``rotate_packed``), run when asked for (the ``thd`` case).
PACKED_CHECKS = ("packed", "packed_offsets")


Status = Literal["pass", "fail", "not supported", "not applicable", "adapter error"]


@dataclasses.dataclass
class ModelCheck:
    """One check of one layer type in one dtype.  ``error``: the worst error in units of its
    tolerance (``<= 1`` passes; ``nan`` where no number applies)."""

    check: str
    layer_type: str | None
    dtype: str
    status: Status
    error: float = math.nan
    message: str = ""

    @property
    def passed(self) -> bool:
        """It holds, or the engine cannot express it, or it does not apply to the engine (an
        adapter error is no pass)."""
        return self.status in ("pass", "not supported", "not applicable")

    def to_dict(self) -> dict[str, Any]:
        """The JSON of the field report (the error to three digits: what reproduces across
        machines)."""
        err = float(f"{self.error:.3g}") if math.isfinite(self.error) else None
        return {**dataclasses.asdict(self), "error": err}


@dataclasses.dataclass
class ModelRopeReport:
    """Every check of an engine against one config; truthy iff none failed and the adapter raised
    no error of its own ("not supported" is not a failure; an adapter error is no verdict on the
    engine, and no pass either).  ``str`` gives a readable table, ``to_dict`` the JSON of the field
    report."""

    engine: str
    version: str
    config: str
    results: list[ModelCheck]

    def __bool__(self) -> bool:
        return all(r.passed for r in self.results)

    @property
    def failed(self) -> list[str]:
        """The checks the engine failed (each once, in report order)."""
        return list(dict.fromkeys(r.check for r in self.results if r.status == "fail"))

    @property
    def adapter_errors(self) -> list[str]:
        """The checks the adapter's own code raised in (each once, in report order)."""
        return list(dict.fromkeys(r.check for r in self.results if r.status == "adapter error"))

    @property
    def supported(self) -> bool:
        """Some layer type and dtype was checked (the engine could express the config, and the
        checks asked for apply to it)."""
        return any(r.status not in ("not supported", "not applicable") for r in self.results)

    def __getitem__(self, check: str) -> ModelCheck:
        """The worst result of ``check`` (a failure first)."""
        rows = [r for r in self.results if r.check == check]
        if not rows:
            raise KeyError(f"no check {check!r}; checks: {sorted({r.check for r in self.results})}")
        order = {"fail": 0, "adapter error": 1, "pass": 2, "not supported": 3, "not applicable": 4}
        return min(rows, key=lambda r: (order[r.status], -r.error if math.isfinite(r.error) else 0.0))

    def __iter__(self) -> Iterator[ModelCheck]:
        return iter(self.results)

    def to_dict(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "version": self.version,
            "config": self.config,
            "passed": bool(self),
            "supported": self.supported,
            "results": [r.to_dict() for r in self.results],
        }

    def __str__(self) -> str:
        lines = [f"check_model_rope({self.engine} {self.version}, {self.config})"]
        lines.append(f"  {'check':<17} {'layer type':<20} {'dtype':<9} {'status':<14} {'error':>8}")
        for r in self.results:
            e = f"{r.error:8.3g}" if math.isfinite(r.error) else f"{'-':>8}"
            lines.append(f"  {r.check:<17} {r.layer_type or '-':<20} {r.dtype:<9} {r.status:<14} {e}")
            if r.message:  # (a passing check's words too: "refuses positions from 4096 on")
                lines.append(f"      -> {r.message}")
        if not self.supported and all(r.status == "not applicable" for r in self.results):
            lines.append("  not applicable: the engine takes no such input")
        elif not self.supported:
            lines.append("  not supported: the engine cannot express this config")
        elif self:
            lines.append("  all checks hold")
        else:
            if self.failed:
                lines.append(f"  FAILED: {', '.join(self.failed)}")
            if self.adapter_errors:
                lines.append(f"  ADAPTER ERROR (fix the adapter): {', '.join(self.adapter_errors)}")
        return "\n".join(lines)
