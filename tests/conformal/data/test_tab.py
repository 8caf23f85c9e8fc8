"""The TAB loader (``conformal.data.loaders.tab``) on the hand-written ECHR fixtures (``tests/fixtures/conformal/tab``).

Oracles: the fixtures' known contents (which spans are DIRECT/QUASI).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conformal.data import load_tab

from tests.helpers.cpa import TAB, TAB_IDS


# ------------------------------------------------------------------------------------------------
# TAB
# ------------------------------------------------------------------------------------------------


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
