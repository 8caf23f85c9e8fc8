"""``conformal.data.loaders``: ``load_source`` (the CPA run's adapter) and the generated fixtures.

Fixtures (``tests/fixtures/conformal``) are tiny files in the published formats:
``tab/`` (TAB ECHR JSON) and ``textwash/`` (orig/anon trees and a CSV) are written by hand;
``wikibio/`` (raw ``.box/.nb/.sent/.title/.id`` and Hugging Face JSON lines) and ``blog/``
(Blog Authorship ``id.gender.age.industry.sign.xml`` files, Latin-1, not well-formed XML) are
written by :func:`tests.helpers.cpa.write_generated_fixtures`; ``python -m tests.helpers.cpa``
rewrites them, and :func:`test_generated_fixtures_are_up_to_date` checks the committed copies.
"""

from __future__ import annotations


import pytest

from conformal.data import load_blog_authorship, load_source, load_tab, load_textwash, load_wikibio

from tests.helpers.cpa import BLOG, FIX, TAB, TAB_IDS, TEXTWASH, WIKIBIO, write_generated_fixtures


# ------------------------------------------------------------------------------------------------
# Generated fixtures (WikiBio, Blog Authorship)
# ------------------------------------------------------------------------------------------------


def test_generated_fixtures_are_up_to_date(tmp_path):
    write_generated_fixtures(tmp_path)
    for sub in ("wikibio", "blog"):
        got = sorted(p.relative_to(tmp_path).as_posix() for p in (tmp_path / sub).rglob("*") if p.is_file())
        have = sorted(p.relative_to(FIX).as_posix() for p in (FIX / sub).rglob("*") if p.is_file())
        assert got == have
        for rel in got:
            assert (tmp_path / rel).read_bytes() == (FIX / rel).read_bytes(), rel


# ------------------------------------------------------------------------------------------------
# load_source (the CPA runner's adapter)
# ------------------------------------------------------------------------------------------------


RUNNER_PARAMS = {  # what conformal.run passes, defaults filled in
    "tab": {"path": str(TAB), "levels": ["K1", "K2", "K3"], "releases": ["direct"]},
    "textwash": {"path": str(TEXTWASH), "categories": None},
    "wikibio": {"path": str(WIKIBIO / "raw"), "levels": ["K1", "K2"]},
    "blog_corpus": {"path": str(BLOG), "W": [1, 3, 10], "max_authors": 500},
}


def test_load_source_each_source():
    names = {src: [s.name for s in load_source(src, p, seed=0)] for src, p in RUNNER_PARAMS.items()}
    assert names == {
        "tab": ["tab/K1/direct", "tab/K2/direct", "tab/K3/direct"],
        "textwash": ["textwash/famous", "textwash/fiction", "textwash/semifamous"],
        "wikibio": ["wikibio/K1/name_removed", "wikibio/K2/name_removed"],
        "blog_corpus": ["blog_corpus/W1", "blog_corpus/W3", "blog_corpus/W10"],
    }
    tab = load_source("tab", dict(RUNNER_PARAMS["tab"], releases=["direct", "quasi_id_redaction"]), seed=0)
    assert [s.name for s in tab] == [f"tab/{lv}/{r}" for lv in ("K1", "K2", "K3")
                                     for r in ("direct", "quasi_id_redaction")]
    assert tab[3] == load_tab(TAB, knowledge_level="K2", release="quasi_id_redaction")
    assert load_source("textwash", dict(RUNNER_PARAMS["textwash"], categories=["famous"]), seed=0) == [
        load_textwash(TEXTWASH)["famous"]]
    assert load_source("wikibio", RUNNER_PARAMS["wikibio"], seed=0)[1] == load_wikibio(WIKIBIO / "raw",
                                                                                       knowledge_level="K2")
    blog = load_source("blog_corpus", RUNNER_PARAMS["blog_corpus"], seed=2)
    assert blog[1] == load_blog_authorship(BLOG, W=3, max_authors=500, seed=2)
    extra = load_source("wikibio", {"path": str(WIKIBIO / "mini.jsonl"), "releases": ["direct", "name_removed"],
                                    "levels": ["K2"], "n_documents": 3}, seed=1)
    assert [s.name for s in extra] == ["wikibio/K2/direct", "wikibio/K2/name_removed"]
    assert extra[0].doc_ids == extra[1].doc_ids and extra[0].n_documents == 3
    files = [TAB / "echr_mini_train.json", TAB / "echr_mini_test.json"]
    from_list = load_source("tab", {"path": files, "levels": ["K1"]}, seed=0)[0]
    assert from_list == load_tab(files) and set(from_list.candidates) == set(TAB_IDS)
    demo = load_source("blog_corpus", {"path": BLOG, "W": ["demo", 10], "max_authors": None}, seed=0)
    assert [s.name for s in demo] == ["blog_corpus/demo", "blog_corpus/W10"]


@pytest.mark.parametrize("source, params, exc, match", [
    ("reddit", {"path": "x"}, ValueError, "source must be one of .* got 'reddit'"),
    ("tab", ["path"], ValueError, "tab parameters must be a mapping, got list"),
    ("tab", {"levels": ["K1"]}, ValueError, "tab.path is required"),
    ("tab", {"path": 3}, ValueError, "tab.path must be a non-empty path string, got 3"),
    ("tab", {"path": str(TAB), "level": ["K1"]}, ValueError, "tab.level is not a parameter of source 'tab'"),
    ("tab", {"path": str(TAB), "levels": ["K1", "K9"]}, ValueError,
     r"tab.levels must only hold values from \['K1', 'K2', 'K3'\], got 'K9'"),
    ("tab", {"path": str(TAB), "levels": "K1"}, ValueError, "tab.levels must be a non-empty list"),
    ("tab", {"path": str(TAB), "releases": ["direct", "direct"]}, ValueError, "tab.releases must not repeat"),
    ("tab", {"path": str(TAB), "split_fraction": 2}, ValueError, r"tab.split_fraction must be in \(0, 1\), got 2"),
    ("tab", {"path": "/no/such/tab"}, FileNotFoundError, "TAB path '/no/such/tab' does not exist"),
    ("textwash", {"path": str(TEXTWASH), "categories": "famous"}, ValueError,
     "textwash.categories must be None or a non-empty list"),
    ("wikibio", {"path": str(WIKIBIO / "raw"), "levels": ["K3"]}, ValueError,
     r"wikibio.levels must only hold values from \['K1', 'K2'\], got 'K3'"),
    ("wikibio", {"path": str(WIKIBIO / "raw"), "max_candidates": -1}, ValueError,
     "wikibio.max_candidates must be None or an integer >= 1, got -1"),
    ("blog_corpus", {"path": str(BLOG), "W": [1, 0]}, ValueError, "blog_corpus.W must be a positive integer"),
    ("blog_corpus", {"path": str(BLOG), "W": [3, "W3"]}, ValueError, "blog_corpus.W must not repeat a level"),
    ("blog_corpus", {"path": str(BLOG), "W": 3}, ValueError, "blog_corpus.W must be a non-empty list"),
    ("blog_corpus", {"path": str(BLOG), "max_authors": 0}, ValueError,
     "blog_corpus.max_authors must be None or an integer >= 1, got 0"),
    ("blog_corpus", {"path": str(BLOG), "n_released_per_author": 0}, ValueError,
     "blog_corpus.n_released_per_author must be an integer >= 1, got 0"),
    ("blog_corpus", {"path": str(BLOG), "W": [1, 12], "min_profile_posts": 10}, ValueError,
     "blog_corpus.W must be <= min_profile_posts = 10, got 12"),
])
def test_load_source_errors(source, params, exc, match):
    with pytest.raises(exc, match=match):
        load_source(source, params, seed=0)


def test_load_source_bad_seed():
    with pytest.raises(ValueError, match="seed must be a non-negative integer, got -1"):
        load_source("tab", RUNNER_PARAMS["tab"], seed=-1)
