"""Every count the docs state is the count of the data it describes (or generated from it).

Generated pages (``docs/guides/hf_census.rst``, ``docs/guides/field_report.rst``) are checked
against their generators elsewhere; here the hand-written pages quote them, or count test tables,
and each quoted number is compared with the source it counts.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))


def _read(path: str) -> str:
    return " ".join((ROOT / path).read_text().split())  # (one line: counts across line breaks)


def _count(path: str, pattern: str) -> int:
    m = re.search(pattern, _read(path))
    assert m, f"{path}: no match for {pattern!r} (the sentence changed: update this test)"
    words = {"Nine": 9, "Ten": 10, "Eleven": 11, "Twelve": 12}
    return int(words.get(m.group(1), m.group(1)))


def test_census_count_is_the_census_page() -> None:
    page = _count("docs/guides/hf_census.rst", r"(\d+) pairs match bit for bit")
    assert _count("README.md", r"\[(\d+) \(model, layer type\) pairs bit for bit") == page


def test_field_report_counts() -> None:
    from conformance.engines import field
    from conformance.engines.cases import CASES

    assert _count("README.md", r"runs it on (\d+) engines") == len(field.ENGINES)
    guide = _read("docs/guides/conformance.rst")
    named = re.search(r"a case of the field report \((.*?)\), or a ``transformers`` model type", guide)
    assert named and re.findall(r"``(\w+)``", named.group(1)) == list(CASES)


def test_state_contexts_count() -> None:
    import state_scenarios

    assert _count("docs/guides/state.rst", r"a first context \((\d+) of them") == len(
        state_scenarios.CONTEXTS
    )


def test_transform_matrix_counts() -> None:
    import transforms

    text = "on (\\d+) public functions under (\\d+) torch transforms and (\\d+) JAX ones"
    m = re.search(text, _read("docs/guides/performance.rst"))
    assert m, "performance.rst: the transform matrix sentence changed"
    assert tuple(map(int, m.groups())) == (
        len(transforms.CASES),
        len(transforms.TORCH_TRANSFORMS),
        len(transforms.JAX_TRANSFORMS),
    )


def test_published_families_count() -> None:
    import hf_families

    assert _count("docs/guides/porting.rst", r"published configs of (\d+) families") == len(
        hf_families.FAMILIES
    )


def test_census_models_count() -> None:
    pytest.importorskip("transformers")
    import test_hf_census_models as t

    n = len({*t.TINY, *t.COMPOSITE})
    assert _count("docs/guides/porting.rst", r"the census added \((\d+) model types") == n


def test_golden_vectors_and_properties_counts() -> None:
    from conformance import vectors
    from rotary.testing import PROPERTIES

    assert _count("docs/guides/conformance.rst", r"(Nine|Ten|Eleven|\d+) cases of RoPE outputs") == len(
        vectors.index_names()
    )
    assert f"{len(PROPERTIES)}/{len(PROPERTIES)} hold" in _read("docs/guides/conformance.rst")
