"""The field report's case matrix: its home is :mod:`rotary.testing.cases` (the kit reads a case
by name too, and nothing under ``rotary/`` imports from ``conformance``); re-exported here, where
the engines' adapters and the field report have always read it."""

from rotary.testing.cases import ARCHITECTURES, CASES, Case, as_published

__all__ = ["ARCHITECTURES", "CASES", "Case", "as_published"]
