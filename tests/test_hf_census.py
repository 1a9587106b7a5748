"""The census of transformers' RoPE families (``tests/hf_census.py``): no wrong answer, every
pair that does not match is in the table with a reason, the docs page is the census."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import hf_census as C  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def census():
    return C.census()


def test_no_family_gives_a_wrong_answer(census):
    wrong = {k: d for k, (s, d) in census.items() if s == "wrong"}
    assert not wrong, "\n".join(f"{k}: {d}" for k, d in sorted(wrong.items()))


def test_every_pair_matches_or_is_in_the_table_with_a_reason(census):
    if transformers.__version__ != C.CHECKED_AGAINST:
        pytest.skip(f"the table is of transformers {C.CHECKED_AGAINST}; this is {transformers.__version__}")
    problems = []
    for key, (status, detail) in sorted(census.items()):
        want = C.EXPECTED.get(key)
        if status == "match":
            if want is not None:
                problems.append(f"{key} now matches: remove it from EXPECTED")
        elif want is None:
            problems.append(f"{key} is {status} ({detail}): new, add it to EXPECTED with a reason")
        elif want[0] != status:
            problems.append(f"{key} is {status} ({detail}), EXPECTED says {want[0]}")
    problems += [f"{k} is in EXPECTED but not in the census" for k in C.EXPECTED if k not in census]
    assert not problems, "\n".join(problems)
    assert all(reason for _, reason in C.EXPECTED.values())  # no bare skips


def test_docs_page_is_the_census(census):
    if transformers.__version__ != C.CHECKED_AGAINST:
        pytest.skip(f"the page is of transformers {C.CHECKED_AGAINST}")
    page = (ROOT / "docs" / "guides" / "hf_census.rst").read_text()
    assert page == C.rst(census), "regenerate: python tests/hf_census.py --rst docs/guides/hf_census.rst"
