"""``LinkageSuite`` (``conformal.data.suite``): save/load round trips, atomic writes, subsets and validation."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from conformal.data import LinkageSuite


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
    with pytest.raises(ValueError, match="is a folder, not a file"):
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
