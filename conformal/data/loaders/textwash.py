"""TextWash person descriptions (Kleinberg et al. 2022): the ``orig/`` + ``anon/`` trees or a CSV as linkage suites.

Suite names: ``"textwash/{category}"``.

References:
  Huang et al. 2026, Conformal Privacy Auditing, Section 6.1.
"""

from __future__ import annotations

import csv
import difflib
import glob
import io
import os
import re
from collections.abc import Sequence

import numpy as np

from conformal.data.loaders._common import (
    PathLike,
    check_optional_count,
    check_seed,
    mask_words,
    read_text,
    read_utf8,
    require_path,
    sample_indices,
    squash,
    vocab_of,
)
from conformal.data.suite import LinkageSuite
from snapaudit_jax.utils.errors import InputError


# CSV column names accepted (case-insensitive), first match wins.
TEXTWASH_COLUMNS = {
    "id": ("id", "doc_id", "file", "filename", "file_id", "description_id"),
    "category": ("category", "type", "group", "condition"),
    "orig": ("orig", "original", "text_orig", "orig_text", "original_text"),
    "anon": ("anon", "anonymised", "anonymized", "text_anon", "anon_text", "anonymised_text", "anonymized_text"),
    "name": ("name", "person", "identity", "target", "person_name"),
}
_TEXTWASH_CATEGORY_ALIASES = {"fict": "fiction", "fictional": "fiction", "semi-famous": "semifamous",
                              "semi_famous": "semifamous"}
_TEXTWASH_FILE = re.compile(r"^(?P<category>[A-Za-z-]+)_(?P<num>\d+)(?:_(?P<subject>.+))?$")
_TOKEN = re.compile(r"\w+|[^\w\s]")
_PERSON_PLACEHOLDER = re.compile(r"^PERSON_(?:FIRSTNAME|LASTNAME)_\d+$")


def textwash_name_tokens(orig: str, anon: str) -> list[str]:
    """Words of ``orig`` that the anonymiser replaced by ``PERSON_FIRSTNAME_k``/``PERSON_LASTNAME_k``.

    ``orig`` and ``anon`` are aligned token by token (``difflib``). In a replaced block of equal
    length on both sides, the original words facing a person placeholder are taken; in a block of
    unequal lengths whose anonymised side holds a person placeholder, every original word that does
    not occur in ``anon`` is taken. The result is a superset of the subject's name (other people's
    names are included, and in unequal blocks any other replaced word).

    Args:
      orig: the original description.
      anon: its anonymised version.

    Returns:
      The name words, in order of appearance, without repeats.
    """
    a, b = _TOKEN.findall(orig), _TOKEN.findall(anon)
    in_anon = {t.lower() for t in b}
    out: list[str] = []
    sm = difflib.SequenceMatcher(None, a, b, autojunk=False)
    for op, i1, i2, j1, j2 in sm.get_opcodes():
        if op not in ("replace", "delete") or not any(_PERSON_PLACEHOLDER.match(t) for t in b[j1:j2]):
            continue
        if i2 - i1 == j2 - j1:
            words = [t for t, u in zip(a[i1:i2], b[j1:j2]) if _PERSON_PLACEHOLDER.match(u)]
        else:
            words = list(a[i1:i2])
        out += [t for t in words if t[0].isalpha() and t.lower() not in in_anon]
    return list(dict.fromkeys(out))


def _textwash_category(raw: str) -> str:
    c = raw.strip().lower()
    return _TEXTWASH_CATEGORY_ALIASES.get(c, c)


def _textwash_rows_from_tree(root: str) -> list[dict]:
    for base in (root, os.path.join(root, "person_descriptions")):
        orig_dir, anon_dir = os.path.join(base, "orig"), os.path.join(base, "anon")
        if os.path.isdir(orig_dir) and os.path.isdir(anon_dir):
            break
    else:
        raise InputError(f"{root}: a TextWash tree must contain 'orig/' and 'anon/' folders of .txt files "
                         "(or person_descriptions/orig and person_descriptions/anon)")
    orig = {os.path.basename(p): p for p in glob.glob(os.path.join(orig_dir, "*.txt"))}
    anon = {os.path.basename(p): p for p in glob.glob(os.path.join(anon_dir, "*.txt"))}
    if not orig:
        raise InputError(f"{orig_dir}: no .txt file")
    for only, there, missing in ((set(orig) - set(anon), orig_dir, anon_dir), (set(anon) - set(orig), anon_dir,
                                                                                 orig_dir)):
        if only:
            name = sorted(only)[0]
            raise InputError(f"{os.path.join(there, name)}: has no counterpart in {missing} "
                             f"({len(only)} unpaired file(s))")
    rows = []
    for fname in sorted(orig):
        stem = fname[:-4]
        m = _TEXTWASH_FILE.match(stem)
        if not m:
            raise InputError(f"{orig[fname]}: file name must be '<category>_<number>[_<subject>].txt', got {fname!r}")
        rows.append({"id": stem, "category": _textwash_category(m["category"]), "subject": m["subject"],
                     "orig": read_text(orig[fname]).strip(), "anon": read_text(anon[fname]).strip(), "name": None,
                     "where": orig[fname]})
    return rows


def _textwash_rows_from_csv(path: str) -> list[dict]:
    reader = csv.DictReader(io.StringIO(read_utf8(path), newline=""), strict=True)
    try:
        header = reader.fieldnames or []
        lower = {h.strip().lower(): h for h in header}
        col = {}
        for key, aliases in TEXTWASH_COLUMNS.items():
            col[key] = next((lower[a] for a in aliases if a in lower), None)
            if col[key] is None and key != "name":
                raise InputError(f"{path}: TextWash CSV needs a {key!r} column (one of {aliases}), got header {header}")
        rows = []
        for rec in reader:
            where = f"{path}: record ending on line {reader.line_num}"
            if None in rec:
                raise InputError(f"{where}: has {len(header) + len(rec[None])} fields, more than the "
                                 f"{len(header)} columns of the header")
            row = {k: (rec.get(c) if c else None) for k, c in col.items()}
            for k in ("id", "category", "orig", "anon"):
                if row[k] is None or not row[k].strip():
                    raise InputError(f"{where}: column {col[k]!r} must be non-empty, got {row[k]!r}")
            m = _TEXTWASH_FILE.match(row["id"].strip())
            rows.append({"id": row["id"].strip(), "category": _textwash_category(row["category"]),
                         "subject": m["subject"] if m else None, "orig": row["orig"].strip(),
                         "anon": row["anon"].strip(), "name": (row["name"] or "").strip() or None,
                         "where": where})
    except csv.Error as e:
        raise InputError(f"{path}: malformed CSV near line {reader.line_num} ({e})") from None
    if not rows:
        raise InputError(f"{path}: TextWash CSV has no data row")
    return rows


def load_textwash(
    path: PathLike,
    *,
    categories: Sequence[str] | None = None,
    n_documents: int | None = None,
    seed: int = 0,
) -> dict[str, LinkageSuite]:
    """TextWash person descriptions as one linkage suite per category.

    Formats:

    * The published tree (``paper/study1/person_descriptions`` of the TextWash repository):
      ``orig/`` and ``anon/`` folders (directly under ``path`` or under
      ``path/person_descriptions``) of ``.txt`` files with the same names,
      ``<category>_<number>[_<subject>].txt`` (``famous_100_d_1_5.txt``); ``fict`` is read as
      ``fiction``; the optional tail (``d_1_5``: the described person) becomes the attribute
      ``subject``.
    * A CSV (UTF-8, header row) with columns, case-insensitive, first alias found:
      id (``id``, ``doc_id``, ``file``, ``filename``, ``file_id``, ``description_id``), category
      (``category``, ``type``, ``group``, ``condition``), original text (``orig``, ``original``,
      ``text_orig``, ``orig_text``, ``original_text``), anonymised text (``anon``, ``anonymised``,
      ``anonymized``, ``text_anon``, ``anon_text``, ``anonymised_text``, ``anonymized_text``) and,
      optionally, the person's name (``name``, ``person``, ``identity``, ``target``, ``person_name``).

    What is built (paper Section 6.1): each description is an identity. Released document = the
    ``anon`` text. Profile = the ``orig`` text with the identity's name tokens removed: the words of
    the ``name`` column when given, otherwise the words that the anonymiser replaced by
    ``PERSON_FIRSTNAME_k``/``PERSON_LASTNAME_k`` (see :func:`textwash_name_tokens`), removed
    everywhere (whole word, case-insensitive). Pool = every description of the same category
    (closed world); documents: all, or ``n_documents`` sampled per category with ``seed``.

    Args:
      path: The tree (a folder) or a CSV file.
      categories: Categories to build (``None``: every category found).
      n_documents: Released descriptions per category (``None``: all).
      seed: Seed of the document subsample.

    Returns:
      ``{category: LinkageSuite}`` named ``"textwash/{category}"``, knowledge level ``"orig"``,
      release ``"textwash"``.

    Raises:
      FileNotFoundError: if ``path`` does not exist.
      ValueError: naming the file/line, for a missing folder or column, an unpaired file, a
        badly named file, an empty text, a repeated id, or an unknown requested category.
    """
    path = require_path(path, "TextWash")
    n_documents = check_optional_count("n_documents", n_documents)
    seed = check_seed(seed)
    if categories is not None and (isinstance(categories, str) or not isinstance(categories, Sequence)
                                   or not categories or not all(isinstance(c, str) and c for c in categories)):
        raise InputError(f"categories must be None or a non-empty list of category names, got {categories!r}")
    if os.path.isdir(path):
        rows, fmt = _textwash_rows_from_tree(path), "tree"
    elif path.lower().endswith(".csv"):
        rows, fmt = _textwash_rows_from_csv(path), "csv"
    else:
        raise InputError(f"{path}: TextWash input must be a folder with orig/ and anon/ or a .csv file")
    seen: dict[str, str] = {}
    for r in rows:
        if not r["orig"] or not r["anon"]:
            raise InputError(f"{r['where']}: orig and anon texts must be non-empty")
        if r["id"] in seen:
            raise InputError(f"{r['where']}: id {r['id']!r} must be unique, already at {seen[r['id']]}")
        seen[r["id"]] = r["where"]
    found = sorted({r["category"] for r in rows})
    wanted = found if categories is None else [_textwash_category(c) for c in categories]
    for c in wanted:
        if c not in found:
            raise InputError(f"categories must name categories of the data {found}, got {c!r}")
    if len(set(wanted)) != len(wanted):
        raise InputError(f"categories must not repeat a category (aliases included), got {list(categories)}")

    suites = {}
    for k, cat in enumerate(wanted):
        group = [r for r in rows if r["category"] == cat]
        profiles = []
        for r in group:
            names = r["name"].split() if r["name"] else textwash_name_tokens(r["orig"], r["anon"])
            profiles.append(squash(mask_words(r["orig"], names, "")))
        subj = [r["subject"] for r in group]
        attr = {"subject": subj} if any(s is not None for s in subj) else {}
        docs = sample_indices(len(group), n_documents, np.random.default_rng([seed, 21, k]))
        suites[cat] = LinkageSuite(
            name=f"textwash/{cat}",
            knowledge_level="orig",
            release="textwash",
            documents=tuple(group[i]["anon"] for i in docs),
            doc_ids=tuple(group[i]["id"] for i in docs),
            identities=tuple(group[i]["id"] for i in docs),
            candidates=tuple(r["id"] for r in group),
            profiles=tuple(profiles),
            attributes=vocab_of(attr),
            candidate_attributes={a: tuple(v) for a, v in attr.items()},
            document_attributes={a: tuple(v[i] for i in docs) for a, v in attr.items()},
            meta={"loader": "conformal.data.loaders.load_textwash", "path": path, "format": fmt,
                  "category": cat, "seed": seed, "n_descriptions": len(group), "n_documents": len(docs)},
        ).check_closed_world()
    return suites
