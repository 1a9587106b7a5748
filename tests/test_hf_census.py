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
        if status in ("match", "no rope"):
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


def test_partial_factor_read_exactly_where_transformers_reads_it():
    # Regression (issue 24): MiniMax-M2, Moonshine, GLM-4-MoE, Apertus, CWM, Mellum, Ministral 3,
    # Phi-4-multimodal, Solar Open, Step 3.5 and others rotate cos.shape[-1] features, but their
    # partial_rotary_factor was refused ("rotates the whole head"); Gemma 4's and LFM3's default
    # (sliding) layers ignore it in transformers but were read partially (a wrong number).
    probe = C.partial_probe()
    bad = {k: v for k, v in probe.items() if v[0] not in ("match", "refused", "skipped")}
    assert not bad, "\n".join(f"{k}: {s} {d}" for k, (s, d) in sorted(bad.items()))
    assert sum(s == "match" for s, _ in probe.values()) >= 35


def test_known_model_types_are_the_census_matches(census):
    # rotary.hf warns "not one rotary knows" for a model type outside its rules; the families the
    # census reads bit for bit are listed so that they do not warn.
    if transformers.__version__ != C.CHECKED_AGAINST:
        pytest.skip(f"the list is of transformers {C.CHECKED_AGAINST}")
    from rotary._hfconfig import _CENSUS_MATCHED, _family

    matched = {k.split("/")[0] for k, (s, _) in census.items() if s in ("match", "close", "text only")}
    want = {_family(item[3].model_type) for item in C._modules() if len(item) == 4 and item[0] in matched}
    want.discard("")  # a model type whose text config is transformers' bare PreTrainedConfig
    assert set(_CENSUS_MATCHED) == want, (sorted(want - _CENSUS_MATCHED), sorted(_CENSUS_MATCHED - want))


def test_attribute_map_is_transformers():
    # rotary reads a size under the name its config class stores it (transformers'
    # attribute_map): JetMoE's head_dim is kv_channels, DBRX's hidden_size is d_model...
    from rotary._hfconfig import _ATTRIBUTE_MAP, _family

    keys = {"head_dim", "hidden_size", "num_attention_heads", "num_hidden_layers", "max_position_embeddings"}
    seen = set()
    for item in C._modules():
        if len(item) != 4:
            continue
        cfg = item[3]
        fam = _family(cfg.model_type)
        want = {k: v for k, v in (getattr(type(cfg), "attribute_map", None) or {}).items() if k in keys}
        assert _ATTRIBUTE_MAP.get(fam or "", {}) == want, fam
        seen.add(fam)
    assert set(_ATTRIBUTE_MAP) <= seen
