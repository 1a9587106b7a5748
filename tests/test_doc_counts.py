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


def test_array_libraries_counts() -> None:
    from conformance.calls import CALLS

    page = "docs/guides/array_libraries.rst"
    assert _count(page, r"The (\d+) public functions are") == len(CALLS)
    assert _count(page, r"array libraries \((\d+) public functions each") == len(CALLS)


def test_ndonnx_model_sizes() -> None:
    ndx = pytest.importorskip("ndonnx")
    import rotary

    text = _read("docs/guides/array_libraries.rst")
    m = re.search(
        r"head dimension 128 is a model of (\d+) nodes and ([\d.]+) MB .*? it is (\d+) nodes and ([\d.]+) KB",
        text,
    )
    assert m, "array_libraries.rst: the model size sentence changed"
    got = []
    for kw in ({}, {"angles": "float32"}):
        q = ndx.argument(shape=("batch", 8, "seq", 128), dtype=ndx.float32)
        k = ndx.argument(shape=("batch", 2, "seq", 128), dtype=ndx.float32)
        p = ndx.argument(shape=("seq",), dtype=ndx.int64)
        qr, kr = rotary.RoPE(128, base=500000.0, **kw).apply(q, k, p)
        model = ndx.build({"q": q, "k": k, "pos": p}, {"q_rot": qr, "k_rot": kr})
        got.append((len(model.graph.node), len(model.SerializeToString())))
    assert int(m.group(1)) == got[0][0] and float(m.group(2)) == round(got[0][1] / 1e6, 1)
    assert int(m.group(3)) == got[1][0] and float(m.group(4)) == round(got[1][1] / 1e3, 1)


#: The guides that explain the benchmark table: every ratio they quote is a target of a row.
RATIO_PAGES = (
    "docs/guides/performance.rst",
    "docs/guides/state.rst",
    "docs/guides/linear_attention.rst",
    "docs/guides/numerics.rst",
)


@pytest.mark.parametrize("page", RATIO_PAGES)
def test_guides_quote_no_measured_ratio(page: str) -> None:
    """A ratio written into a guide (``1.16x``, ``~180x``) goes stale with the next run: the
    guides name the rows of ``benchmarks/results-cpu.json`` instead, and the only ratios they
    write are the rows' targets."""
    import json

    rows = json.loads((ROOT / "benchmarks/results-cpu.json").read_text())["rows"]
    targets = {float(r[t]) for r in rows for t in ("target", "floor_target") if r.get(t) is not None}
    quoted = [float(x) for x in re.findall(r"(?<![\w.])~?(\d+(?:\.\d+)?)x\b", _read(page))]
    assert [x for x in quoted if x not in targets] == [], f"{page} quotes measured ratios"
