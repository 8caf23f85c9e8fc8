"""The synthetic benchmarks (``conformal.data.synthetic``): people, the K1/K2/K3 knowledge ladder, releases and
blog-style authors.

Oracles: the definitions of the knowledge ladder (each level's profile holds the previous level's
information) and exact set relations (closed world: every identity is a candidate).
"""

from __future__ import annotations

import re
import time

import pytest

from conformal.data import blog_ladder, blog_suite, make_people, profile_text, synthetic_ladder, synthetic_suite

from tests.helpers.cpa import word_in


# ------------------------------------------------------------------------------------------------
# Synthetic people and the knowledge ladder
# ------------------------------------------------------------------------------------------------


def test_make_people_deterministic_and_seeded():
    a, b, c = make_people(41, seed=5), make_people(41, seed=5), make_people(41, seed=6)
    assert a == b
    assert a != c and sum(x.name != y.name for x, y in zip(a, c)) > 30
    assert [p.pid for p in a] == [f"p{i:05d}" for i in range(41)]
    with pytest.raises(ValueError, match="n must be an integer >= 1, got 0"):
        make_people(0, seed=0)
    with pytest.raises(ValueError, match="seed must be a non-negative integer, got -1"):
        make_people(3, seed=-1)


_PROFILE_FIELDS = "gender|age|city|occupation|interests|life events|employer|event details|distinctive facts"


def _clauses(profile: str) -> dict[str, str]:
    """``"field: value."`` clauses of a synthetic profile."""
    return dict(re.findall(rf"({_PROFILE_FIELDS}): (.*?)\.(?= (?:{_PROFILE_FIELDS}): |$)", profile))


def test_profile_ladder_holds_previous_levels_information():
    for p in make_people(29, seed=2):
        k1, k2, k3 = (profile_text(p, lv) for lv in ("K1", "K2", "K3"))
        c1, c2, c3 = _clauses(k1), _clauses(k2), _clauses(k3)
        assert set(c1) == {"gender", "age", "city", "occupation"}
        assert k2.startswith(k1) and k3.startswith(k1) and len(k1) < len(k2) < len(k3)
        assert all(c2[f] == v for f, v in c1.items()) and all(c3[f] == v for f, v in c2.items() if f != "interests")
        assert set(c2["interests"].split(", ")) < set(c3["interests"].split(", "))  # K2 knows 3 of the 5
        assert c2["life events"] == "; ".join(p.event_types)
        assert p.employer in k3 and p.employer not in k2
        assert all(clue in k3 and clue not in k2 for clue in p.clues)
        assert p.name not in k3  # never a direct identifier


def test_synthetic_ladder_invariants():
    n_people, n_docs = 257, 61
    ladder = synthetic_ladder(n_people, n_docs, seed=4)
    assert sorted(ladder) == sorted((lv, r) for lv in ("K1", "K2", "K3")
                                    for r in ("direct", "quasi_id_redaction", "rewrite"))
    ref = ladder[("K1", "direct")]
    for (lv, r), s in ladder.items():
        assert s.name == f"synthetic/{lv}/{r}" and (s.knowledge_level, s.release) == (lv, r)
        assert (s.n_documents, s.n_candidates) == (n_docs, n_people)
        assert s.doc_ids == ref.doc_ids and s.identities == ref.identities  # same subjects everywhere
        labels = s.label_indices()
        assert (labels >= 0).all() and s.miss_rate() == 0.0  # closed world
        assert [s.candidates[i] for i in labels] == list(s.identities)
        assert s.document_attributes["city"] == tuple(s.candidate_attributes["city"][i] for i in labels)
        s.check_closed_world()
    assert len(set(ref.identities)) == n_docs
    for r in ("direct", "quasi_id_redaction", "rewrite"):  # the release never changes with the level
        assert ladder[("K1", r)].documents == ladder[("K3", r)].documents
    again = synthetic_ladder(n_people, n_docs, seed=4, levels=("K2",), releases=("rewrite",))
    assert again[("K2", "rewrite")] == ladder[("K2", "rewrite")]  # deterministic, independent of the grid
    other = synthetic_ladder(n_people, n_docs, seed=5, levels=("K2",), releases=("direct",))[("K2", "direct")]
    assert other.identities != ref.identities and other.documents != ladder[("K2", "direct")].documents


def test_quasi_id_redaction_removes_the_quasi_identifiers():
    people = make_people(199, seed=8)
    by_id = {p.pid: p for p in people}
    direct = synthetic_suite(people, knowledge_level="K2", release="direct", n_documents=97, seed=8)
    redacted = synthetic_suite(people, knowledge_level="K2", release="quasi_id_redaction", n_documents=97, seed=8)
    shown = 0
    for d_text, r_text, pid in zip(direct.documents, redacted.documents, redacted.identities):
        p = by_id[pid]
        values = [p.city, p.occupation, p.employer, str(p.age), *p.name.split()]
        assert not any(word_in(v, r_text) for v in values), (pid, r_text)
        shown += sum(word_in(v, d_text) for v in values)
        assert any(e in r_text for e in p.events)  # events stay (K2/K3 knowledge can still link)
    assert shown > 97  # power: the direct release does mention them


def test_synthetic_open_world_pool():
    people = make_people(101, seed=1)
    s = synthetic_suite(people, knowledge_level="K1", release="direct", n_documents=40, seed=1, pool=0.75)
    assert s.miss_rate() == pytest.approx(1 - 30 / 40) and (s.label_indices() < 0).sum() == 10
    assert s.n_candidates == 101 - 10
    with pytest.raises(ValueError, match="closed world"):
        s.check_closed_world()
    with pytest.raises(ValueError, match=r"pool must be None or a fraction in \(0, 1\], got 1.5"):
        synthetic_suite(people, knowledge_level="K1", release="direct", n_documents=4, seed=1, pool=1.5)
    with pytest.raises(ValueError, match="n_documents must be <= len"):
        synthetic_suite(people, knowledge_level="K1", release="direct", n_documents=102, seed=1)
    with pytest.raises(ValueError, match="release must be one of"):
        synthetic_suite(people, knowledge_level="K1", release="leak", n_documents=4, seed=1)


def test_synthetic_scales_to_thousands_of_candidates():
    t0 = time.perf_counter()
    s = synthetic_ladder(3001, 211, seed=0, levels=("K3",), releases=("quasi_id_redaction",))[
        ("K3", "quasi_id_redaction")]
    b = blog_suite(1009, posts_per_author=11, W=10, seed=0)
    elapsed = time.perf_counter() - t0
    assert s.n_candidates == 3001 and b.n_candidates == 1009 and b.n_documents == 1009
    assert (s.label_indices() >= 0).all() and (b.label_indices() >= 0).all()
    assert elapsed < 20.0, elapsed  # about 3 s on 2 CPU cores


# ------------------------------------------------------------------------------------------------
# Synthetic blog authors
# ------------------------------------------------------------------------------------------------


def test_blog_suites_w_1_3_10():
    ladder = blog_ladder(53, posts_per_author=12, levels=(1, 3, 10, "demo"), seed=3)
    assert sorted(ladder) == ["W1", "W10", "W3", "demo"]
    w1, w3, w10 = ladder["W1"], ladder["W3"], ladder["W10"]
    for lv, s in ladder.items():
        assert s.name == f"blog/{lv}" and s.knowledge_level == lv and s.release == "post"
        assert s.n_candidates == 53 and s.n_documents == 53 and s.miss_rate() == 0.0
        assert s.documents == w1.documents and s.identities == w1.identities
    for j in range(53):
        assert w10.profiles[j].startswith(w3.profiles[j]) and w3.profiles[j].startswith(w1.profiles[j])
        assert len(w1.profiles[j]) < len(w3.profiles[j]) < len(w10.profiles[j])
    for doc, y in zip(w10.documents, w10.identities):  # released posts never in the profile
        assert doc not in w10.profiles[w10.candidates.index(y)]
    assert all(p.startswith("gender: ") and "industry: " in p for p in ladder["demo"].profiles)
    assert blog_suite(53, posts_per_author=12, W=3, seed=3) == w3  # deterministic
    assert blog_suite(53, posts_per_author=12, W="W3", seed=4).documents != w3.documents
    with pytest.raises(ValueError, match="posts_per_author must be >= n_released_per_author \\+ W = 11"):
        blog_suite(5, posts_per_author=10, W=10, seed=0)
    with pytest.raises(ValueError, match="W must be a positive integer, 'W<k>' or 'demo', got 0"):
        blog_suite(5, posts_per_author=10, W=0, seed=0)
