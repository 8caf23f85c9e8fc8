"""The Blog Authorship Corpus loader (``conformal.data.loaders.blog``) on the XML fixtures (Latin-1, not
well-formed XML; written by :func:`tests.helpers.cpa.write_generated_fixtures`).

Oracles: which author wrote which post.
"""

from __future__ import annotations

import re
import shutil

import pytest

from conformal.data import load_blog_authorship, parse_blog_xml

from tests.helpers.cpa import BLOG, BLOG_AUTHORS, blog_post


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
