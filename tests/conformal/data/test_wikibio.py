"""The WikiBio loader (``conformal.data.loaders.wikibio``) on the raw and JSON lines fixtures (written by
:func:`tests.helpers.cpa.write_generated_fixtures`).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conformal.data import load_wikibio, parse_wikibio_box

from tests.helpers.cpa import WIKIBIO, WIKIBIO_PEOPLE


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
