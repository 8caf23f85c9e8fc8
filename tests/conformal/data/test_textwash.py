"""The TextWash loader (``conformal.data.loaders.textwash``) on the orig/anon trees and the CSV fixture.

Oracles: the fixtures' known contents (which words are names).
"""

from __future__ import annotations

import shutil

import pytest

from conformal.data import load_textwash, textwash_name_tokens

from tests.helpers.cpa import TEXTWASH, word_in


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
        assert not word_in(name, p0)
    assert "pop singer from Valdora" in p0 and "Paper Lanterns" in p0
    assert not word_in("Viktor", famous.profiles[2]) and "racing cyclist" in famous.profiles[2]
    assert not word_in("Bram", suites["fiction"].profiles[0])
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
    assert not word_in("Rosa", famous.profiles[0]) and not word_in("Ilves", famous.profiles[0])  # name column
    assert not word_in("Jonas", famous.profiles[1]) and "weather" in famous.profiles[1]  # inferred tokens
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
