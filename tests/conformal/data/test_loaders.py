"""The CPA data layer: LinkageSuite, the synthetic benchmarks and the dataset loaders (offline, no LLM).

Fixtures (``tests/fixtures/conformal``) are tiny files in the published formats:
``tab/`` (TAB ECHR JSON) and ``textwash/`` (orig/anon trees and a CSV) are written by hand;
``wikibio/`` (raw ``.box/.nb/.sent/.title/.id`` and Hugging Face JSON lines) and ``blog/``
(Blog Authorship ``id.gender.age.industry.sign.xml`` files, Latin-1, not well-formed XML) are
written by :func:`write_generated_fixtures` below; ``python -m tests.conformal.data.test_loaders``
rewrites them, and :func:`test_generated_fixtures_are_up_to_date` checks the committed copies.

Oracles: the fixtures' known contents (which spans are DIRECT/QUASI, which words are names, which
author wrote which post), the definitions of the knowledge ladder (each level's profile holds the
previous level's information), and exact set relations (closed world: every identity is a candidate).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from conformal.data import (
    LinkageSuite,
    blog_ladder,
    blog_suite,
    load_blog_authorship,
    load_source,
    load_tab,
    load_textwash,
    load_wikibio,
    make_people,
    parse_blog_xml,
    parse_wikibio_box,
    profile_text,
    synthetic_ladder,
    synthetic_suite,
    textwash_name_tokens,
)

from tests.helpers.paths import FIXTURES

FIX = FIXTURES / "conformal"
TAB = FIX / "tab"
TEXTWASH = FIX / "textwash"
WIKIBIO = FIX / "wikibio"
BLOG = FIX / "blog"


def _word_in(word: str, text: str) -> bool:
    return re.search(r"(?<!\w)" + re.escape(word) + r"(?!\w)", text, flags=re.IGNORECASE) is not None


# ------------------------------------------------------------------------------------------------
# Generated fixtures (WikiBio, Blog Authorship)
# ------------------------------------------------------------------------------------------------

# (id, title, infobox fields in order (None: "<none>"), tokenised lower-case sentences).
WIKIBIO_PEOPLE = (
    ("1001", "Ada Brennan",
     (("name", "ada brennan"), ("image", None), ("caption", None), ("birth_date", "12 march 1931"),
      ("birth_place", "cork , ireland"), ("nationality", "irish"), ("occupation", "chemist"),
      ("known_for", "synthetic dyes"), ("article_title", "ada brennan")),
     ("ada brennan -lrb- 12 march 1931 -- 4 june 2001 -rrb- was an irish chemist .",
      "brennan is known for her work on synthetic dyes at the university of cork .")),
    ("1002", "Tomas Okafor (footballer)",
     (("name", "tomas okafor"), ("nickname", "the wall"), ("birth_date", "3 july 1988"),
      ("birth_place", "lagos , nigeria"), ("nationality", "nigerian"), ("occupation", "footballer"),
      ("position", "goalkeeper"), ("clubs", "enugu rangers"), ("article_title", "tomas okafor")),
     ("tomas okafor -lrb- born 3 july 1988 -rrb- is a nigerian footballer who plays as a goalkeeper .",
      "nicknamed `` the wall '' , okafor played for enugu rangers .")),
    ("1003", "Michael of Valdora",
     (("name", "michael of valdora"), ("birth_date", "1450"), ("occupation", "bishop"),
      ("religion", "catholic"), ("see", "valdora"), ("article_title", "michael of valdora")),
     ("michael of valdora -lrb- c. 1450 -- 1502 -rrb- was a bishop of the catholic church .",
      "he served as bishop of the see from 1480 until his death .")),
    ("1004", "Lena Sorvino",
     (("name", "lena sorvino"), ("birth_date", "22 may 1975"), ("birth_place", "turin , italy"),
      ("nationality", "italian"), ("occupation", "tennis player"), ("tournament", "wimbledon"),
      ("plays", "right-handed"), ("website", "www.sorvino.example"), ("article_title", "lena sorvino")),
     ("lena sorvino -lrb- born 22 may 1975 -rrb- is an italian former tennis player .",
      "sorvino reached the quarter-finals at wimbledon in 1998 .",
      "she plays right-handed .")),
    ("1005", "Priya Raman",
     (("name", "priya raman"), ("birth_name", "priya lakshmi raman"), ("birth_date", "1 january 1962"),
      ("birth_place", "chennai , india"), ("nationality", "indian"), ("occupation", "architect"),
      ("awards", "aga khan award"), ("article_title", "priya raman")),
     ("priya raman -lrb- born 1 january 1962 -rrb- is an indian architect .",
      "she received the aga khan award in 2004 .")),
)

# (file name, topic words, number of posts). Author 1001234's file is Latin-1 and malformed on purpose.
BLOG_AUTHORS = (
    ("1000331.female.37.indUnk.Leo.xml", ("tomatoes", "compost", "seedlings", "greenhouse", "trowel"), 12),
    ("1001234.male.15.Student.Aries.xml", ("joystick", "speedrun", "boss", "console", "respawn"), 12),
    ("1002001.female.24.Arts.Pisces.xml", ("canvas", "gouache", "easel", "palette", "gallery"), 12),
    ("1003002.male.45.Technology.Virgo.xml", ("kernel", "compiler", "terminal", "router", "debugger"), 12),
    ("1004003.female.17.Student.Gemini.xml", ("homework", "locker", "prom", "biology", "algebra"), 3),
)
_MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
           "November", "December")


def blog_post(k: int, words) -> str:
    """Post ``k`` of an author: deterministic text built from the author's topic words."""
    a, b, c = words[k % 5], words[(k + 2) % 5], words[(k + 4) % 5]
    return (f"Entry number {k}. Today the {a} and the {b} took all my time, again. "
            f"Tomorrow maybe the {c}; I keep a list of {a} notes number {k * 7 + 3}.")


def _blog_file(name: str, words, n: int) -> bytes:
    parts = ["<Blog>\n\n"]
    for k in range(n):
        text = blog_post(k, words)
        if name.startswith("1001234"):
            if k == 0:
                text += " Mom made caf\u00e9 au lait &amp; cr\u00eapes &nbsp;yum & more <3"
            if k == 5:  # an unclosed post: ends at the next <date>
                parts.append(f"<date>{k + 1},{_MONTHS[k % 12]},2004</date>\n<post>\n\n      {text}\n\n\n")
                continue
        parts.append(f"<date>{k + 1},{_MONTHS[k % 12]},2004</date>\n<post>\n\n      {text}\n\n\n</post>\n\n\n")
    parts.append("<date>30,December,2004</date>\n<post>\n\n   \n</post>\n\n")  # an empty post: dropped
    parts.append("</Blog>\n")
    return "".join(parts).encode("latin-1")


def _box_line(fields) -> str:
    toks = []
    for f, v in fields:
        if v is None:
            toks.append(f"{f}:<none>")
        else:
            toks += [f"{f}_{i + 1}:{w}" for i, w in enumerate(v.split())]
    return "\t".join(toks)


def write_generated_fixtures(root: Path) -> None:
    """Writes ``root/wikibio`` and ``root/blog`` (deterministic; no randomness)."""
    raw = root / "wikibio" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    files = {".box": [], ".nb": [], ".sent": [], ".title": [], ".id": []}
    for pid, title, fields, sents in WIKIBIO_PEOPLE:
        files[".box"].append(_box_line(fields))
        files[".nb"].append(str(len(sents)))
        files[".sent"] += list(sents)
        files[".title"].append(title)
        files[".id"].append(pid)
    for ext, lines in files.items():
        (raw / f"mini{ext}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    with open(root / "wikibio" / "mini.jsonl", "w", encoding="utf-8") as fh:
        for pid, title, fields, sents in WIKIBIO_PEOPLE:
            table = {"column_header": [f for f, _ in fields], "row_number": [1] * len(fields),
                     "content": ["<none>" if v is None else v for _, v in fields]}
            if pid == "1003":  # the list-of-objects variant of `table`
                table = [{"column_header": f, "content": "<none>" if v is None else v} for f, v in fields]
            rec = {"id": pid, "input_text": {"table": table, "context": title}, "target_text": " ".join(sents) + "\n"}
            fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
    blog = root / "blog"
    blog.mkdir(parents=True, exist_ok=True)
    for name, words, n in BLOG_AUTHORS:
        (blog / name).write_bytes(_blog_file(name, words, n))


def test_generated_fixtures_are_up_to_date(tmp_path):
    write_generated_fixtures(tmp_path)
    for sub in ("wikibio", "blog"):
        got = sorted(p.relative_to(tmp_path).as_posix() for p in (tmp_path / sub).rglob("*") if p.is_file())
        have = sorted(p.relative_to(FIX).as_posix() for p in (FIX / sub).rglob("*") if p.is_file())
        assert got == have
        for rel in got:
            assert (tmp_path / rel).read_bytes() == (FIX / rel).read_bytes(), rel


# ------------------------------------------------------------------------------------------------
# LinkageSuite
# ------------------------------------------------------------------------------------------------


def _tiny_suite(**over) -> LinkageSuite:
    kw = dict(
        name="tiny/K1/direct", knowledge_level="K1", release="direct",
        documents=("alpha doc", "beta doc two", "gamma doc three words"), doc_ids=("d0", "d1", "d2"),
        identities=("a", "b", "c"), candidates=("c", "a", "b", "z"),
        profiles=("pc", "pa", "pb", "pz one"),
        attributes={"city": ("Oslo", "Rome")},
        candidate_attributes={"city": ("Oslo", None, "Rome", "Rome")},
        document_attributes={"city": (None, "Rome", "Oslo")},
        meta={"seed": 3, "nested": {"k": [1, 2]}},
    )
    kw.update(over)
    return LinkageSuite(**kw)


def test_suite_save_load_round_trip(tmp_path):
    s = _tiny_suite()
    path = tmp_path / "sub" / "suite.json"
    s.save(path)
    t = LinkageSuite.load(path)
    assert t == s and t.to_dict() == s.to_dict()
    assert LinkageSuite.from_json(s.to_json()) == s
    assert [p.name for p in path.parent.iterdir()] == ["suite.json"]  # no temporary file left
    with pytest.raises(TypeError):
        t.meta["seed"] = 4  # read-only


def test_suite_save_is_atomic(tmp_path, monkeypatch):
    path = tmp_path / "suite.json"
    _tiny_suite().save(path)
    before = path.read_bytes()

    def boom(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        _tiny_suite(name="other").save(path)
    assert path.read_bytes() == before  # the old file is intact
    assert sorted(p.name for p in tmp_path.iterdir()) == ["suite.json"]  # no partial/temporary file


@pytest.mark.parametrize("content, match", [
    (b'{"format_version": 1, "name": "x"', "valid JSON"),
    (b"\xff\xfe\x00garbage", "UTF-8"),
    (b"[1, 2]", "JSON object"),
    (b'{"format_version": 2}', "format_version must be 1"),
    (b'{"format_version": 1, "name": "x"}', "must have field 'knowledge_level'"),
])
def test_suite_load_corrupt_files(tmp_path, content, match):
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=match) as e:
        LinkageSuite.load(path)
    assert str(path) in str(e.value)


def test_suite_load_missing_or_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        LinkageSuite.load(tmp_path / "nope.json")
    with pytest.raises(ValueError, match="must be a file"):
        LinkageSuite.load(tmp_path)
    rec = _tiny_suite().to_dict()
    rec["identities"] = ["a", "b"]
    (tmp_path / "short.json").write_text(json.dumps(rec))
    with pytest.raises(ValueError, match=r"identities must have one entry per document \(3\), got 2"):
        LinkageSuite.load(tmp_path / "short.json")


def test_suite_subset_summary_and_open_world():
    s = _tiny_suite()
    np.testing.assert_array_equal(s.label_indices(), [1, 2, 0])
    assert s.miss_rate() == 0.0 and s.check_closed_world() is s
    sub = s.subset([2, 0])
    assert sub.doc_ids == ("d2", "d0") and sub.identities == ("c", "a")
    assert sub.document_attributes["city"] == ("Oslo", None) and sub.candidates == s.candidates
    assert sub.meta["parent_n_documents"] == 3
    assert s.subset(np.array([True, False, True])).doc_ids == ("d0", "d2")
    for bad, match in (([0, 0], "must not repeat"), ([3], r"must lie in \[0, 3\)"), ([], "at least one"),
                       (np.array([True, False]), "shape")):
        with pytest.raises(ValueError, match=match):
            s.subset(bad)
    summ = s.summary()
    assert summ == {"name": "tiny/K1/direct", "knowledge_level": "K1", "release": "direct", "n_documents": 3,
                    "n_candidates": 4, "n_identities": 3, "miss_rate": 0.0, "mean_document_words": 3.0,
                    "mean_profile_words": 1.25, "attributes": {"city": 2}}
    json.dumps(summ)
    # Open world: dropping "b" from the pool makes document d1 a miss (label -1), explicitly accounted.
    ow = s.subset_candidates([0, 1, 3])
    np.testing.assert_array_equal(ow.label_indices(), [1, -1, 0])
    assert ow.miss_rate() == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match=r"identities\[1\] = 'b' \(doc_id 'd1'\) must be in candidates \(closed "
                                         r"world\).*1 of 3 documents"):
        ow.check_closed_world()
    direct = _tiny_suite(identities=("a", "q", "c"))  # built directly with an identity outside the pool
    assert direct.miss_rate() == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="'q'"):
        direct.check_closed_world()


@pytest.mark.parametrize("over, match", [
    ({"doc_ids": ("d0", "d0", "d2")}, "doc_ids must be unique, got 'd0'"),
    ({"candidates": ("c", "a", "b", "a")}, "candidates must be unique, got 'a'"),
    ({"profiles": ("p",)}, r"profiles must have one entry per candidate \(4\), got 1"),
    ({"documents": ()}, "documents must be non-empty"),
    ({"documents": ("x", 3, "y")}, r"documents\[1\] must be a string, got 3"),
    ({"candidate_attributes": {"city": ("Oslo", "Paris", None, None)}},
     r"candidate_attributes\['city'\]\[1\] must be in the vocabulary.*'Paris'"),
    ({"document_attributes": {"age": ("1", "2", "3")}}, "key 'age' must be declared in attributes"),
    ({"name": ""}, "name must be a non-empty string"),
    ({"meta": {"x": float("nan")}}, "meta must be JSON-serialisable"),
])
def test_suite_validation_errors(over, match):
    with pytest.raises(ValueError, match=match):
        _tiny_suite(**over)


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
        assert not any(_word_in(v, r_text) for v in values), (pid, r_text)
        shown += sum(_word_in(v, d_text) for v in values)
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


# ------------------------------------------------------------------------------------------------
# TAB
# ------------------------------------------------------------------------------------------------

TAB_IDS = ("001-900001", "001-900002", "001-900003", "001-900004")


def _tab_case(path: Path, doc_id: str) -> dict:
    for f in ("echr_mini_train.json", "echr_mini_test.json"):
        for rec in json.loads((path / f).read_text()):
            if rec["doc_id"] == doc_id:
                return rec
    raise KeyError(doc_id)


def test_tab_documents_pool_and_ladder():
    suites = {(lv, r): load_tab(TAB, knowledge_level=lv, release=r)
              for lv in ("K1", "K2", "K3") for r in ("direct", "quasi_id_redaction")}
    for (lv, r), s in suites.items():
        assert s.name == f"tab/{lv}/{r}"
        assert sorted(s.candidates) == list(TAB_IDS) and sorted(s.doc_ids) == list(TAB_IDS)
        assert s.identities == s.doc_ids and s.miss_rate() == 0.0
        assert dict(s.attributes) == {"countries": ("FRE", "SYL"), "legal_branch": ("CHAMBER", "COMMITTEE",
                                                                                   "GRANDCHAMBER")}
    k1, k2, k3 = (suites[(lv, "direct")] for lv in ("K1", "K2", "K3"))
    j = k1.candidates.index("001-900004")
    assert k1.profiles[j] == "articles: 10. countries: SYL. legal branch: COMMITTEE. year: 2009."
    for i in range(4):
        assert k2.profiles[i].startswith(k1.profiles[i] + " keywords: ")
        assert k3.profiles[i].startswith(k2.profiles[i] + " case text: ")
        case = _tab_case(TAB, k3.candidates[i])
        assert case["meta"]["applicant"] not in k1.profiles[i] + k2.profiles[i]
        doc = k3.documents[k3.doc_ids.index(k3.candidates[i])]
        # No verbatim copy: the released first part and the profile's case text are disjoint halves.
        held_out = k3.profiles[i].split(" case text: ", 1)[1]
        assert doc.split("\n")[0] not in held_out and held_out in case["text"] and held_out not in doc
    assert len(k2.profiles[j].split(" keywords: ")[1].split()) <= 20
    assert "vell" in k2.profiles[j].split(" keywords: ")[1].split()


def test_tab_releases_mask_the_right_spans(tmp_path):
    direct = load_tab(TAB, release="direct")
    quasi = load_tab(TAB, release="quasi_id_redaction")
    doc_d = direct.documents[direct.doc_ids.index("001-900004")]
    doc_q = quasi.documents[quasi.doc_ids.index("001-900004")]
    # DIRECT spans of the released half are masked in both releases.
    for span in ("13579/08", "Ms Hedda Brom"):
        assert span not in doc_d and span not in doc_q
    assert "[CODE]" in doc_d and "[PERSON]" in doc_d
    # QUASI spans are masked only by the quasi-identifier redaction; NO_MASK and unannotated text stay.
    for span in ("journalist", "2 October 2008"):
        assert span in doc_d and span not in doc_q
    assert "Sylvania" in doc_q and "[DATETIME]" in doc_q and "[MISC]" in doc_q
    # Case 001-900001: "Ms L. Varga" is QUASI for annotator1 and DIRECT for annotator2.
    i = direct.doc_ids.index("001-900001")
    assert "Ms L. Varga" not in direct.documents[i]  # union of the annotators
    two = _write_json(tmp_path / "two.json", [_tab_case(TAB, "001-900001"), _tab_case(TAB, "001-900003")])
    a1 = load_tab(two, annotator="annotator1")
    with pytest.raises(ValueError, match="record 1 .*'001-900003'.*annotations has no annotator 'annotator2'"):
        load_tab(two, annotator="annotator2")  # 001-900003 has annotator1 only
    a2 = load_tab(_write_json(tmp_path / "one.json", [_tab_case(TAB, "001-900001")]), annotator="annotator2")
    i1 = a1.doc_ids.index("001-900001")
    assert "Ms L. Varga" in a1.documents[i1] and "Ms L. Varga" not in a2.documents[0]
    assert "Republic of Freedonia" in a1.documents[i1]  # NO_MASK


def test_tab_mask_crossing_the_cut_and_overlaps(tmp_path):
    text = "First part names Anna Berg here.\nSecond part about Anna Berg again."
    cut = text.index("\n") + 1
    ems = [{"entity_type": "PERSON", "start_offset": 17, "end_offset": 26, "identifier_type": "DIRECT"},
           {"entity_type": "MISC", "start_offset": 22, "end_offset": cut + 6, "identifier_type": "QUASI"},
           {"entity_type": "LOC", "start_offset": 0, "end_offset": 5, "identifier_type": "QUASI"}]
    rec = {"doc_id": "x1", "text": text, "meta": {"year": 2001}, "annotations": {"a": {"entity_mentions": ems}}}
    other = dict(rec, doc_id="x2", annotations={"a": {"entity_mentions": []}})
    (tmp_path / "cases.json").write_text(json.dumps([rec, other]))
    q = load_tab(tmp_path / "cases.json", release="quasi_id_redaction")
    assert q.documents[0] == "[LOC] part names [PERSON]"  # merged overlap, masked up to the cut
    d = load_tab(tmp_path / "cases.json", release="direct", knowledge_level="K3")
    assert d.documents[0] == "First part names [PERSON] here."
    assert d.profiles[0].endswith("case text: Second part about Anna Berg again.")


def test_tab_subsample_is_seeded():
    a = load_tab(TAB, n_documents=2, seed=7)
    assert a == load_tab(TAB, n_documents=2, seed=7)
    assert a.n_documents == 2 and a.n_candidates == 4 and a.miss_rate() == 0.0
    subsets = {load_tab(TAB, n_documents=2, seed=s).doc_ids for s in range(12)}
    assert len(subsets) > 1


def _write_json(path: Path, data) -> Path:
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("mutate, match", [
    (lambda r: r.pop("doc_id"), "record 0: field 'doc_id' must be a non-empty string, got None"),
    (lambda r: r.update(text=""), "field 'text' must be a non-empty string"),
    (lambda r: r.update(meta=[1]), "field 'meta' must be an object, got list"),
    (lambda r: r.update(annotations={}), "field 'annotations' must be a non-empty object"),
    (lambda r: r["annotations"]["annotator2"]["entity_mentions"][0].update(end_offset=10 ** 6),
     r"offsets must satisfy 0 <= start_offset < end_offset <= len\(text\)"),
    (lambda r: r["annotations"]["annotator2"]["entity_mentions"][0].update(identifier_type="SECRET"),
     "identifier_type must be one of .* got 'SECRET'"),
    (lambda r: r["annotations"]["annotator2"]["entity_mentions"][0].pop("entity_type"),
     "missing field 'entity_type'"),
    (lambda r: r.update(text="x" * 60, annotations={"a": {"entity_mentions": []}}),
     "cannot be split in two non-empty parts"),
])
def test_tab_bad_records(tmp_path, mutate, match):
    rec = json.loads((TAB / "echr_mini_test.json").read_text())[0]
    mutate(rec)
    path = _write_json(tmp_path / "bad.json", [rec])
    with pytest.raises(ValueError, match=match) as e:
        load_tab(path)
    assert str(path) in str(e.value)


def test_tab_bad_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_tab(tmp_path / "missing.json")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"has no \*\.json file"):
        load_tab(tmp_path / "empty")
    (tmp_path / "trunc.json").write_text('[{"doc_id": "a", ')
    with pytest.raises(ValueError, match="trunc.json: not valid JSON"):
        load_tab(tmp_path / "trunc.json")
    (tmp_path / "latin.json").write_bytes(b'[{"doc_id": "caf\xe9"}]')
    with pytest.raises(ValueError, match="latin.json: must be UTF-8"):
        load_tab(tmp_path / "latin.json")
    with pytest.raises(ValueError, match="must hold a JSON list of cases, got dict"):
        load_tab(_write_json(tmp_path / "obj.json", {"doc_id": "a"}))
    with pytest.raises(ValueError, match="no TAB case found"):
        load_tab(_write_json(tmp_path / "nothing.json", []))
    dup = tmp_path / "dup"
    dup.mkdir()
    shutil.copy(TAB / "echr_mini_test.json", dup / "a.json")
    shutil.copy(TAB / "echr_mini_test.json", dup / "b.json")
    with pytest.raises(ValueError, match="doc_id must be unique, already in .*a.json"):
        load_tab(dup)
    for kw, match in (({"knowledge_level": "K4"}, "knowledge_level must be one of"),
                      ({"release": "rewrite"}, "release must be one of"),
                      ({"split_fraction": 1.0}, r"split_fraction must be in \(0, 1\), got 1.0"),
                      ({"n_keywords": 0}, "n_keywords must be an integer >= 1, got 0"),
                      ({"n_documents": 0}, "n_documents must be None or an integer >= 1, got 0"),
                      ({"seed": -2}, "seed must be a non-negative integer, got -2")):
        with pytest.raises(ValueError, match=match):
            load_tab(TAB, **kw)


# ------------------------------------------------------------------------------------------------
# TextWash
# ------------------------------------------------------------------------------------------------


def test_textwash_tree():
    suites = load_textwash(TEXTWASH)
    assert sorted(suites) == ["famous", "fiction", "semifamous"]
    famous = suites["famous"]
    assert famous.name == "textwash/famous" and famous.knowledge_level == "orig" and famous.release == "textwash"
    assert famous.candidates == ("famous_1_d_1_1", "famous_2_d_1_1", "famous_3_d_1_2")
    assert famous.doc_ids == famous.candidates and famous.identities == famous.candidates
    assert famous.candidate_attributes["subject"] == ("d_1_1", "d_1_1", "d_1_2")
    for doc_id, doc in zip(famous.doc_ids, famous.documents):
        assert doc == (TEXTWASH / "anon" / f"{doc_id}.txt").read_text().strip()  # released = anon
    p0 = famous.profiles[0]
    for name in ("Lena", "Marquez", "Otto", "Brandt"):  # identity tokens removed from the orig text
        assert not _word_in(name, p0)
    assert "pop singer from Valdora" in p0 and "Paper Lanterns" in p0
    assert not _word_in("Viktor", famous.profiles[2]) and "racing cyclist" in famous.profiles[2]
    assert not _word_in("Bram", suites["fiction"].profiles[0])
    assert suites["fiction"].profiles[1] == (TEXTWASH / "orig" / "fict_2_d_2_2.txt").read_text().strip()
    assert [s.n_candidates for s in suites.values()] == [3, 2, 1]
    only = load_textwash(TEXTWASH, categories=["fict"])  # the file-name alias
    assert list(only) == ["fiction"] and only["fiction"] == suites["fiction"]
    sub = load_textwash(TEXTWASH, n_documents=2, seed=1)["famous"]
    assert sub.n_documents == 2 and sub.n_candidates == 3 and sub.miss_rate() == 0.0
    assert sub == load_textwash(TEXTWASH, n_documents=2, seed=1)["famous"]


def test_textwash_name_tokens():
    orig = (TEXTWASH / "orig" / "famous_1_d_1_1.txt").read_text()
    anon = (TEXTWASH / "anon" / "famous_1_d_1_1.txt").read_text()
    assert set(textwash_name_tokens(orig, anon)) == {"Lena", "Marquez", "Otto", "Brandt"}
    assert textwash_name_tokens("Hasan Daniel is a friend.", "PERSON_FIRSTNAME_2 is a friend.") == ["Hasan", "Daniel"]
    assert textwash_name_tokens("A baker from Leeds.", "A OCCUPATION_1 from LOCATION_1.") == []


def test_textwash_csv():
    suites = load_textwash(TEXTWASH / "textwash.csv")
    assert sorted(suites) == ["famous", "fiction"]
    famous = suites["famous"]
    assert famous.candidates == ("famous_10", "famous_11")
    assert famous.documents[0].startswith("PERSON_FIRSTNAME_1 PERSON_LASTNAME_1 is a OCCUPATION_1")
    assert not _word_in("Rosa", famous.profiles[0]) and not _word_in("Ilves", famous.profiles[0])  # name column
    assert not _word_in("Jonas", famous.profiles[1]) and "weather" in famous.profiles[1]  # inferred tokens
    assert suites["fiction"].profiles == ("A shy baker who whistles while kneading dough and keeps a diary of "
                                          "every loaf.",)


def test_textwash_bad_input(tmp_path):
    with pytest.raises(FileNotFoundError, match="TextWash path .* does not exist"):
        load_textwash(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="must contain 'orig/' and 'anon/' folders"):
        load_textwash(tmp_path / "empty")
    tree = tmp_path / "tree"
    shutil.copytree(TEXTWASH, tree)
    (tree / "anon" / "famous_3_d_1_2.txt").unlink()
    with pytest.raises(ValueError, match="famous_3_d_1_2.txt: has no counterpart in"):
        load_textwash(tree)
    shutil.copy(TEXTWASH / "anon" / "famous_1_d_1_1.txt", tree / "anon" / "famous_3_d_1_2.txt")
    (tree / "orig" / "oops.txt").write_text("x")
    (tree / "anon" / "oops.txt").write_text("x")
    with pytest.raises(ValueError, match="file name must be '<category>_<number>"):
        load_textwash(tree)
    (tree / "orig" / "oops.txt").unlink()
    (tree / "anon" / "oops.txt").unlink()
    (tree / "anon" / "famous_1_d_1_1.txt").write_text("  \n")
    with pytest.raises(ValueError, match="orig and anon texts must be non-empty"):
        load_textwash(tree)
    with pytest.raises(ValueError, match=r"categories must name categories of the data .*got 'celebrity'"):
        load_textwash(TEXTWASH, categories=["celebrity"])
    with pytest.raises(ValueError, match="categories must be None or a non-empty list"):
        load_textwash(TEXTWASH, categories="famous")
    with pytest.raises(ValueError, match="categories must not repeat"):
        load_textwash(TEXTWASH, categories=["fict", "fiction"])
    bad_csvs = {
        "nocol.csv": ("ID,Category,Original\nf_1,famous,text\n", "needs a 'anon' column"),
        "empty_cell.csv": ("id,category,orig,anon\nf_1,famous,text,\n", "column 'anon' must be non-empty"),
        "extra.csv": ("id,category,orig,anon\nf_1,famous,a,b,c\n", "more than the 4 columns"),
        "quote.csv": ('id,category,orig,anon\nf_1,famous,"a"b,c\n', "malformed CSV"),
        "header.csv": ("id,category,orig,anon\n", "has no data row"),
        "dup.csv": ("id,category,orig,anon\nf_1,famous,a,b\nf_1,famous,c,d\n", "id 'f_1' must be unique"),
    }
    for name, (content, match) in bad_csvs.items():
        (tmp_path / name).write_text(content)
        with pytest.raises(ValueError, match=match) as e:
            load_textwash(tmp_path / name)
        assert name in str(e.value)
    (tmp_path / "data.tsv").write_text("x")
    with pytest.raises(ValueError, match="must be a folder with orig/ and anon/ or a .csv file"):
        load_textwash(tmp_path / "data.tsv")


# ------------------------------------------------------------------------------------------------
# WikiBio
# ------------------------------------------------------------------------------------------------


def test_parse_wikibio_box():
    line = "name_1:ada\tname_2:brennan\timage:<none>\tbirth_date_2:march\tbirth_date_1:12\tknown_for_1:dyes\t"
    assert parse_wikibio_box(line) == {"name": "ada brennan", "birth_date": "12 march", "known_for": "dyes"}
    with pytest.raises(ValueError, match="box token must be 'field_position:word', got 'oops'"):
        parse_wikibio_box("name_1:a\toops")
    with pytest.raises(ValueError, match="position must not repeat within field 'name'"):
        parse_wikibio_box("name_1:a\tname_1:b")


@pytest.mark.parametrize("path", [WIKIBIO / "raw", WIKIBIO / "raw" / "mini.box", WIKIBIO / "mini.jsonl"])
def test_wikibio_documents_pool_and_ladder(path):
    k1 = load_wikibio(path, knowledge_level="K1", release="direct")
    k2 = load_wikibio(path, knowledge_level="K2", release="direct")
    named = load_wikibio(path, knowledge_level="K2")
    ids = tuple(p[0] for p in WIKIBIO_PEOPLE)
    for s in (k1, k2, named):
        assert s.candidates == ids and s.doc_ids == ids and s.identities == ids and s.miss_rate() == 0.0
        assert dict(s.attributes) == {"nationality": ("indian", "irish", "italian", "nigerian"),
                                      "occupation": ("architect", "bishop", "chemist", "footballer",
                                                     "tennis player")}
        assert s.candidate_attributes["nationality"][2] is None  # 1003 has no nationality field
    assert named.name == "wikibio/K2/name_removed" and k1.name == "wikibio/K1/direct"
    assert k1.profiles[0] == "birth date: 12 march 1931. birth place: cork , ireland. nationality: irish. " \
                             "occupation: chemist."
    for i in range(5):
        assert k2.profiles[i].startswith(k1.profiles[i]) and len(k2.profiles[i]) > len(k1.profiles[i])
        assert named.profiles[i] == k2.profiles[i]
    assert k2.profiles[0].endswith("known for: synthetic dyes.")
    everything = " ".join(k2.profiles)
    for hidden in ("name:", "brennan", "the wall", "lakshmi", "www.sorvino", "image", "article title"):
        assert hidden not in everything  # names, nicknames, birth names, websites, media never in profiles
    assert "tournament: wimbledon." in k2.profiles[3]  # "tournament" is not a name field
    assert k1.documents[0].startswith("ada brennan ( 12 march 1931 -- 4 june 2001 ) was an irish chemist .")
    assert '" the wall "' in k1.documents[1]
    assert named.documents[0].startswith("[NAME] [NAME] ( 12 march 1931")
    assert "brennan" not in named.documents[0] and "[NAME] is known" in named.documents[0]
    assert "footballer" in named.documents[1]  # the title's disambiguation is not masked
    assert named.documents[2].startswith("[NAME] of [NAME] (") and "bishop of the see" in named.documents[2]


def test_wikibio_formats_agree_and_sampling_is_seeded():
    raw = load_wikibio(WIKIBIO / "raw", knowledge_level="K2")
    hf = load_wikibio(WIKIBIO / "mini.jsonl", knowledge_level="K2")
    assert (raw.documents, raw.profiles, raw.candidates) == (hf.documents, hf.profiles, hf.candidates)
    assert raw.meta["format"] == "raw" and hf.meta["format"] == "hf_json"
    s = load_wikibio(WIKIBIO / "raw", max_candidates=4, n_documents=2, seed=3)
    assert s.n_candidates == 4 and s.n_documents == 2 and set(s.identities) <= set(s.candidates)
    assert s == load_wikibio(WIKIBIO / "raw", max_candidates=4, n_documents=2, seed=3)
    assert len({load_wikibio(WIKIBIO / "raw", max_candidates=3, seed=k).candidates for k in range(10)}) > 1
    custom = load_wikibio(WIKIBIO / "raw", k1_fields=("occupation",), release="direct")
    assert custom.profiles[0] == "occupation: chemist."


def _copy_raw(tmp_path: Path) -> Path:
    d = tmp_path / "raw"
    shutil.copytree(WIKIBIO / "raw", d)
    return d


def test_wikibio_bad_input(tmp_path):
    with pytest.raises(FileNotFoundError, match="WikiBio path .* does not exist"):
        load_wikibio(tmp_path / "nope.box")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="must hold exactly one \\*.box file, found 0"):
        load_wikibio(tmp_path / "empty")
    d = _copy_raw(tmp_path)
    (d / "mini.nb").unlink()
    with pytest.raises(FileNotFoundError, match="mini.nb"):
        load_wikibio(d)
    d = _copy_raw(tmp_path / "2")
    (d / "mini.nb").write_text("2\n2\n2\n3\n")
    with pytest.raises(ValueError, match=r"mini.nb: must have one line per article of .* \(5\), got 4"):
        load_wikibio(d)
    (d / "mini.nb").write_text("2\n2\n2\n3\nx\n")
    with pytest.raises(ValueError, match="mini.nb: line 5 must be a sentence count, got 'x'"):
        load_wikibio(d)
    (d / "mini.nb").write_text("2\n2\n2\n3\n9\n")
    with pytest.raises(ValueError, match="mini.nb: line 5: count must be in"):
        load_wikibio(d)
    (d / "mini.nb").write_text("2\n2\n2\n3\n1\n")
    with pytest.raises(ValueError, match="mini.sent: must have the 10 lines that .*mini.nb counts, got 11"):
        load_wikibio(d)
    d = _copy_raw(tmp_path / "3")
    (d / "mini.id").write_text("1\n2\n3\n4\n4\n")
    with pytest.raises(ValueError, match="id must be unique, got '4'"):
        load_wikibio(d)
    (d / "mini.id").write_text("1\n2\n")
    with pytest.raises(ValueError, match=r"mini.id: must have one line per article \(5\), got 2"):
        load_wikibio(d)
    d = _copy_raw(tmp_path / "4")
    (d / "mini.box").write_text((d / "mini.box").read_text().replace("name_1:ada", "name_1ada"))
    with pytest.raises(ValueError, match="mini.box: line 1: box token must be"):
        load_wikibio(d)
    lines = (WIKIBIO / "mini.jsonl").read_text().splitlines()
    for name, content, match in (
        ("trunc.jsonl", lines[0] + "\n" + lines[1][:40] + "\n", "line 2 is not valid JSON"),
        ("garbage.json", "{oops", "not valid JSON nor JSON lines"),
        ("notarget.jsonl", lines[0].replace('"target_text"', '"text"') + "\n",
         "record 0: field 'target_text' must be a non-empty string"),
        ("noinput.jsonl", '{"target_text": "x"}\n', "field 'input_text' must be an object"),
        ("ragged.jsonl", json.dumps({"input_text": {"table": {"column_header": ["a"], "content": []}},
                                     "target_text": "x"}), "equally long"),
        ("list.json", "[1]", "record 0 must be a JSON object, got int"),
    ):
        (tmp_path / name).write_text(content)
        with pytest.raises(ValueError, match=match) as e:
            load_wikibio(tmp_path / name)
        assert name in str(e.value)
    (tmp_path / "bio.txt").write_text("x")
    with pytest.raises(ValueError, match="path must be a .box file, a folder with one, or a .json/.jsonl file"):
        load_wikibio(tmp_path / "bio.txt")
    for kw, match in (({"knowledge_level": "K3"}, r"knowledge_level must be one of \('K1', 'K2'\), got 'K3'"),
                      ({"release": "quasi_id_redaction"}, "release must be one of"),
                      ({"k1_fields": "occupation"}, "k1_fields must be a non-empty sequence"),
                      ({"max_candidates": 0}, "max_candidates must be None or an integer >= 1, got 0")):
        with pytest.raises(ValueError, match=match):
            load_wikibio(WIKIBIO / "raw", **kw)


# ------------------------------------------------------------------------------------------------
# Blog Authorship Corpus
# ------------------------------------------------------------------------------------------------


def test_parse_blog_xml_is_lenient():
    fields, posts = parse_blog_xml(BLOG / "1001234.male.15.Student.Aries.xml")
    assert fields == {"id": "1001234", "gender": "male", "age": 15, "industry": "Student", "sign": "Aries"}
    words = BLOG_AUTHORS[1][1]
    assert len(posts) == 12  # the unclosed post is cut at the next <date>; the empty post is dropped
    assert posts[0] == blog_post(0, words) + " Mom made caf\u00e9 au lait & cr\u00eapes \u00a0yum & more <3".replace(
        " \u00a0", " ")
    assert posts[1:] == [blog_post(k, words) for k in range(1, 12)]
    f2, p2 = parse_blog_xml(BLOG / "1004003.female.17.Student.Gemini.xml")
    assert f2["gender"] == "female" and len(p2) == 3


def test_parse_blog_xml_errors(tmp_path):
    bad = tmp_path / "42.other.30.Arts.Leo.xml"
    bad.write_text("<Blog></Blog>")
    with pytest.raises(ValueError, match="file name must be '\\{id\\}.\\{gender\\}"):
        parse_blog_xml(bad)
    html_file = tmp_path / "42.male.30.Arts.Leo.xml"
    html_file.write_text("<html><body>hi</body></html>")
    with pytest.raises(ValueError, match="42.male.30.Arts.Leo.xml: not a Blog Authorship file: no <Blog> root"):
        parse_blog_xml(html_file)
    with pytest.raises(FileNotFoundError):
        parse_blog_xml(tmp_path / "7.male.30.Arts.Leo.xml")


def _author_posts():
    out = {}
    for name, words, n in BLOG_AUTHORS:
        out[name.split(".")[0]] = [blog_post(k, words) for k in range(n)]
    return out


def test_blog_corpus_w_ladder():
    suites = {w: load_blog_authorship(BLOG, W=w) for w in (1, 3, 10)}
    truth = _author_posts()
    w1, w3, w10 = suites[1], suites[3], suites[10]
    for w, s in suites.items():
        assert s.name == f"blog_corpus/W{w}" and s.knowledge_level == f"W{w}" and s.release == "post"
        assert s.candidates == ("1000331", "1001234", "1002001", "1003002")  # 1004003 has only 3 posts
        assert s.n_documents == 4 and s.miss_rate() == 0.0
        assert s.documents == w1.documents and s.identities == w1.identities
        assert s.candidate_attributes["gender"] == ("female", "male", "female", "male")
        assert s.candidate_attributes["age_range"] == ("30-39", "10-19", "20-29", "40-49")
        assert s.candidate_attributes["industry"] == ("indUnk", "Student", "Arts", "Technology")
    for doc, y in zip(w10.documents, w10.identities):
        j = w10.candidates.index(y)
        if y != "1001234":
            assert doc in truth[y]  # a post of its true author
        assert doc not in w10.profiles[j]  # disjoint from the profile
    for j, y in enumerate(w10.candidates):
        assert w10.profiles[j].startswith(w3.profiles[j]) and w3.profiles[j].startswith(w1.profiles[j])
        n_posts = len(re.findall(r"Entry number \d+\.", w10.profiles[j]))
        assert (len(re.findall(r"Entry number \d+\.", w1.profiles[j])), n_posts) == (1, 10)
        if y != "1001234":
            assert all(p in truth[y] for p in re.split(r"(?<=\.) (?=Entry number)", w10.profiles[j]))
    demo = load_blog_authorship(BLOG, W="demo")
    assert demo.profiles[0] == "gender: female. age: 37 (30-39). industry: indUnk. sign: Leo."


def test_blog_corpus_sampling_is_seeded():
    a = load_blog_authorship(BLOG, W=3, max_authors=2, seed=5)
    assert a == load_blog_authorship(BLOG, W=3, max_authors=2, seed=5)
    assert a.n_candidates == 2 and a.meta["n_files_parsed"] >= 2 and a.miss_rate() == 0.0
    pools = {load_blog_authorship(BLOG, W=3, max_authors=2, seed=s).candidates for s in range(8)}
    assert len(pools) > 1
    released = {load_blog_authorship(BLOG, W=1, seed=s).documents for s in range(4)}
    assert len(released) > 1  # the post shuffle depends on the seed


def test_blog_corpus_bad_input(tmp_path):
    with pytest.raises(FileNotFoundError, match="Blog Authorship path .* does not exist"):
        load_blog_authorship(tmp_path / "nope", W=1)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="has no .xml file"):
        load_blog_authorship(tmp_path / "empty", W=1)
    with pytest.raises(ValueError, match="path must be a folder"):
        load_blog_authorship(BLOG / "1000331.female.37.indUnk.Leo.xml", W=1)
    with pytest.raises(ValueError, match="W must be <= min_profile_posts = 10, got 11"):
        load_blog_authorship(BLOG, W=11)
    with pytest.raises(ValueError, match="no author has >= n_released_per_author \\+ min_profile_posts = 14"):
        load_blog_authorship(BLOG, W=1, n_released_per_author=4)
    with pytest.raises(ValueError, match="max_authors must be None or an integer >= 1, got 0"):
        load_blog_authorship(BLOG, W=1, max_authors=0)
    d = tmp_path / "dup"
    shutil.copytree(BLOG, d)
    shutil.copy(d / "1000331.female.37.indUnk.Leo.xml", d / "1000331.male.40.Arts.Leo.xml")
    with pytest.raises(ValueError, match="author id must be unique, got '1000331'"):
        load_blog_authorship(d, W=1)
    d = tmp_path / "badname"
    shutil.copytree(BLOG, d)
    (d / "notes.xml").write_text("<Blog></Blog>")
    with pytest.raises(ValueError, match="notes.xml: file name must be"):
        load_blog_authorship(d, W=1)


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


def test_runner_builds_dataset_suites(tmp_path):
    from conformal.config import load_cpa_config
    from conformal.run import build_suites

    toml = tmp_path / "cpa.toml"
    toml.write_text(f"""
[run]
seed = 1
n_cal = 2
n_test = 2

[data.tab]
path = {json.dumps(str(TAB))}
releases = ["direct", "quasi_id_redaction"]

[data.textwash]
path = {json.dumps(str(TEXTWASH / "textwash.csv"))}

[data.wikibio]
path = {json.dumps(str(WIKIBIO / "mini.jsonl"))}
levels = ["K2"]

[data.blog_corpus]
path = {json.dumps(str(BLOG))}
W = [1, 10]
max_authors = 3

[attackers.retrieval]
kind = "retrieval"
""")
    suites = build_suites(load_cpa_config(toml))
    assert sorted(suites) == sorted(
        [f"tab/{lv}/{r}" for lv in ("K1", "K2", "K3") for r in ("direct", "quasi_id_redaction")]
        + ["textwash/famous", "textwash/fiction", "wikibio/K2/name_removed", "blog_corpus/W1", "blog_corpus/W10"])
    assert suites["blog_corpus/W10"].n_candidates == 3
    assert all(s.miss_rate() == 0.0 for s in suites.values())


if __name__ == "__main__":  # regenerate the WikiBio and Blog fixtures
    write_generated_fixtures(FIX)
    print(f"wrote {FIX / 'wikibio'} and {FIX / 'blog'}", file=sys.stderr)
