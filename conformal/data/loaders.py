"""Loaders for the published formats of the CPA paper's datasets (local files only; nothing is downloaded).

Each loader reads a local path, validates the records and returns
:class:`~conformal.data.suite.LinkageSuite` objects. Errors name the file, the
record and the field/rule: a missing path raises ``FileNotFoundError``; a wrong
format or a missing/ill-typed field raises ``ValueError``.

* :func:`load_tab` - Text Anonymization Benchmark (Pilan et al. 2022), the
  ``echr_{train,dev,test}.json`` files.
* :func:`load_textwash` - TextWash person descriptions (Kleinberg et al. 2022),
  either the published ``orig/`` + ``anon/`` trees of ``.txt`` files or a CSV.
* :func:`load_wikibio` - WikiBio (Lebret et al. 2016 infobox + first paragraph),
  the raw ``SET.box/SET.nb/SET.sent`` files or the Hugging Face ``wiki_bio`` JSON(L) records.
* :func:`load_blog_authorship` - Blog Authorship Corpus (Schler et al. 2006), a
  folder of ``{id}.{gender}.{age}.{industry}.{sign}.xml`` files.

References:
  Huang et al. 2026, Conformal Privacy Auditing, Section 6.1, Appendix B (Table 3), Table 8.
"""

from __future__ import annotations

import csv
import difflib
import glob
import html
import json
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from conformal.data.suite import LinkageSuite
from conformal.data.synthetic import _blog_level, _blog_suite_from

__all__ = [
    "TAB_RELEASES",
    "TAB_LEVELS",
    "WIKIBIO_LEVELS",
    "WIKIBIO_RELEASES",
    "WIKIBIO_K1_FIELDS",
    "load_tab",
    "load_textwash",
    "load_wikibio",
    "load_blog_authorship",
    "parse_blog_xml",
    "parse_wikibio_box",
    "textwash_name_tokens",
    "TEXTWASH_COLUMNS",
]

PathLike = str | os.PathLike


def _require_path(path: PathLike, what: str) -> str:
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{what} path {path!r} does not exist")
    return path


def _check_seed(seed) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    return int(seed)


def _check_optional_count(field: str, value) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{field} must be None or an integer >= 1, got {value!r}")
    return int(value)


def _sample(n: int, k: int | None, rng: np.random.Generator) -> list[int]:
    """``k`` of ``range(n)`` without replacement, in increasing order (all of them if ``k`` is None)."""
    if k is None or k >= n:
        return list(range(n))
    return sorted(int(i) for i in rng.choice(n, size=k, replace=False))


def _read_text(path: str) -> str:
    """UTF-8, falling back to Latin-1 (which never fails) for files with stray bytes."""
    with open(path, "rb") as fh:
        raw = fh.read()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("latin-1")


def _vocab_of(table: Mapping[str, Sequence[str | None]]) -> dict[str, tuple[str, ...]]:
    return {k: tuple(sorted({v for v in vals if v is not None})) for k, vals in table.items()
            if any(v is not None for v in vals)}


def _mask_words(text: str, words: Sequence[str], replacement: str) -> str:
    """Replaces whole-word, case-insensitive occurrences of each of ``words`` (longest first)."""
    for w in sorted({w for w in words if w}, key=len, reverse=True):
        text = re.sub(r"(?<!\w)" + re.escape(w) + r"(?!\w)", replacement, text, flags=re.IGNORECASE)
    return text


def _squash(text: str) -> str:
    return re.sub(r"[ \t]+", " ", re.sub(r" +([,.;:!?])", r"\1", text)).strip()


# ------------------------------------------------------------------------------------------------
# TAB
# ------------------------------------------------------------------------------------------------

TAB_RELEASES = ("direct", "quasi_id_redaction")
TAB_LEVELS = ("K1", "K2", "K3")
_TAB_IDENTIFIER_TYPES = ("DIRECT", "QUASI", "NO_MASK")
_TAB_META_EXCLUDED = ("applicant",)  # a direct identifier: never part of a profile


def _tab_files(paths) -> list[str]:
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    files: list[str] = []
    for p in paths:
        p = _require_path(p, "TAB")
        if os.path.isdir(p):
            found = sorted(glob.glob(os.path.join(p, "*.json")))
            if not found:
                raise FileNotFoundError(f"TAB directory {p!r} has no *.json file")
            files += found
        else:
            files.append(p)
    if not files:
        raise ValueError("paths must name at least one TAB JSON file, got none")
    return files


def _tab_record(path: str, i: int, rec: Any) -> dict:
    where = f"{path}: record {i}"
    if not isinstance(rec, Mapping):
        raise ValueError(f"{where} must be a JSON object, got {type(rec).__name__}")
    doc_id = rec.get("doc_id")
    if not isinstance(doc_id, str) or not doc_id:
        raise ValueError(f"{where}: field 'doc_id' must be a non-empty string, got {doc_id!r}")
    where = f"{path}: record {i} (doc_id {doc_id!r})"
    text = rec.get("text")
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"{where}: field 'text' must be a non-empty string, got {type(text).__name__}")
    meta = rec.get("meta")
    if not isinstance(meta, Mapping):
        raise ValueError(f"{where}: field 'meta' must be an object, got {type(meta).__name__}")
    annotations = rec.get("annotations")
    if not isinstance(annotations, Mapping) or not annotations:
        raise ValueError(f"{where}: field 'annotations' must be a non-empty object of annotators, "
                         f"got {annotations!r:.80}")
    mentions: dict[str, list[tuple[int, int, str, str]]] = {}
    for annotator, ann in annotations.items():
        ems = ann.get("entity_mentions") if isinstance(ann, Mapping) else None
        if not isinstance(ems, list):
            raise ValueError(f"{where}: annotations[{annotator!r}] must have a list 'entity_mentions'")
        out = []
        for j, em in enumerate(ems):
            w = f"{where}: annotations[{annotator!r}].entity_mentions[{j}]"
            if not isinstance(em, Mapping):
                raise ValueError(f"{w} must be an object, got {type(em).__name__}")
            for f in ("start_offset", "end_offset", "identifier_type", "entity_type"):
                if f not in em:
                    raise ValueError(f"{w}: missing field {f!r}")
            s, e = em["start_offset"], em["end_offset"]
            if not (isinstance(s, int) and isinstance(e, int) and 0 <= s < e <= len(text)):
                raise ValueError(f"{w}: offsets must satisfy 0 <= start_offset < end_offset <= len(text) = "
                                 f"{len(text)}, got ({s!r}, {e!r})")
            if em["identifier_type"] not in _TAB_IDENTIFIER_TYPES:
                raise ValueError(f"{w}: identifier_type must be one of {_TAB_IDENTIFIER_TYPES}, "
                                 f"got {em['identifier_type']!r}")
            out.append((s, e, str(em["identifier_type"]), str(em["entity_type"])))
        mentions[str(annotator)] = out
    return {"doc_id": doc_id, "text": text, "meta": dict(meta), "mentions": mentions,
            "dataset_type": rec.get("dataset_type"), "where": where}


def _tab_split_point(text: str, fraction: float) -> int | None:
    """Paragraph boundary closest to ``fraction * len(text)`` (else a sentence end, else a space)."""
    target = fraction * len(text)
    for pattern in (r"\n+", r"(?<=[.!?])\s+", r"\s+"):
        cuts = [m.end() for m in re.finditer(pattern, text) if text[:m.start()].strip() and text[m.end():].strip()]
        if cuts:
            return min(cuts, key=lambda c: (abs(c - target), c))
    return None


def _tab_mask(text: str, spans: Sequence[tuple[int, int, str]]) -> str:
    """Replaces each (merged) span by ``[ENTITY_TYPE]`` (the type of the span that starts first)."""
    out, pos = [], 0
    merged: list[list] = []
    for s, e, t in sorted(spans):
        if merged and s < merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e, t])
    for s, e, t in merged:
        out.append(text[pos:s])
        out.append(f"[{t}]")
        pos = e
    out.append(text[pos:])
    return "".join(out)


def _meta_text(meta: Mapping[str, Any]) -> str:
    parts = []
    for k in sorted(meta):
        if k in _TAB_META_EXCLUDED:
            continue
        v = meta[k]
        if isinstance(v, (list, tuple)):
            v = ", ".join(str(x) for x in v)
        parts.append(f"{k.replace('_', ' ')}: {v}.")
    return " ".join(parts)


def load_tab(
    paths,
    *,
    knowledge_level: str = "K1",
    release: str = "direct",
    annotator: str | None = None,
    split_fraction: float = 0.5,
    n_keywords: int = 20,
    n_documents: int | None = None,
    seed: int = 0,
) -> LinkageSuite:
    """Text Anonymization Benchmark cases as a linkage suite (one identity per case).

    Format (TAB v1.0): each JSON file is a list of cases ``{"doc_id", "text", "annotations": {annotator:
    {"entity_mentions": [{"entity_type", "start_offset", "end_offset", "span_text", "identifier_type"
    (DIRECT/QUASI/NO_MASK), "entity_id", ...}]}}, "meta": {"year", "legal_branch", "articles",
    "countries", "applicant"}, "task", "quality_checked", "dataset_type"}``.

    What is built, exactly:

    * Split. Each case text is cut once, at the paragraph boundary (``\\n``; else a sentence end,
      else a space) closest to ``split_fraction`` of its length. The first part is released; the
      second part is the attacker's side information. No profile contains released text.
    * Released document: the first part with every mention masked as ``[ENTITY_TYPE]`` whose
      ``identifier_type`` is ``DIRECT`` (release ``"direct"``) or ``DIRECT``/``QUASI`` (release
      ``"quasi_id_redaction"``), by any annotator (``annotator=None``: union) or by the named one;
      a mention crossing the cut is masked on the released side.
    * Profiles. ``K1``: the ``meta`` fields except ``applicant`` (a direct identifier), as
      ``"key: value."``. ``K2``: K1 + the ``n_keywords`` highest-weighted TF-IDF terms (English stop
      words removed, sublinear tf, fitted over the second parts of all loaded cases) of the case's
      second part. ``K3``: K2 + the second part's full text.
    * Pool: every loaded case (closed world); documents: all cases, or ``n_documents`` of them
      sampled with ``seed``.

    Args:
      paths: A TAB JSON file, a directory (all its ``*.json`` files) or a sequence of files.
      knowledge_level: ``"K1"``, ``"K2"`` or ``"K3"``.
      release: ``"direct"`` or ``"quasi_id_redaction"``.
      annotator: Mask with this annotator's mentions only (every case must have it); ``None``: union.
      split_fraction: Where to cut the text, in ``(0, 1)``.
      n_keywords: Keywords per ``K2``/``K3`` profile.
      n_documents: Released cases (``None``: all).
      seed: Seed of the document subsample.

    Returns:
      A suite named ``"tab/{level}/{release}"`` with attributes ``countries`` and ``legal_branch``
      (where the meta has them).

    Raises:
      FileNotFoundError: if a path does not exist.
      ValueError: naming the file, record and field, for invalid JSON, a non-list top level, a
        missing/ill-typed field, bad offsets, an unknown identifier type, a repeated ``doc_id``,
        a text that cannot be split, or a bad argument.
    """
    if knowledge_level not in TAB_LEVELS:
        raise ValueError(f"knowledge_level must be one of {TAB_LEVELS}, got {knowledge_level!r}")
    if release not in TAB_RELEASES:
        raise ValueError(f"release must be one of {TAB_RELEASES}, got {release!r}")
    if not isinstance(split_fraction, (int, float)) or not 0.0 < float(split_fraction) < 1.0:
        raise ValueError(f"split_fraction must be in (0, 1), got {split_fraction!r}")
    if isinstance(n_keywords, bool) or not isinstance(n_keywords, int) or n_keywords < 1:
        raise ValueError(f"n_keywords must be an integer >= 1, got {n_keywords!r}")
    n_documents = _check_optional_count("n_documents", n_documents)
    seed = _check_seed(seed)
    files = _tab_files(paths)

    cases: list[dict] = []
    seen: dict[str, str] = {}
    for path in files:
        try:
            with open(path, encoding="utf-8") as fh:
                data = json.load(fh)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not valid JSON ({e})") from None
        if not isinstance(data, list):
            raise ValueError(f"{path}: a TAB file must hold a JSON list of cases, got {type(data).__name__}")
        for i, rec in enumerate(data):
            case = _tab_record(path, i, rec)
            if case["doc_id"] in seen:
                raise ValueError(f"{case['where']}: doc_id must be unique, already in {seen[case['doc_id']]}")
            seen[case["doc_id"]] = path
            cases.append(case)
    if not cases:
        raise ValueError(f"{files}: no TAB case found")

    masked_types = ("DIRECT",) if release == "direct" else ("DIRECT", "QUASI")
    released, rest = [], []
    for case in cases:
        text = case["text"]
        cut = _tab_split_point(text, float(split_fraction))
        if cut is None:
            raise ValueError(f"{case['where']}: field 'text' cannot be split in two non-empty parts")
        if annotator is None:
            ms = [m for ann in case["mentions"].values() for m in ann]
        elif annotator in case["mentions"]:
            ms = case["mentions"][annotator]
        else:
            raise ValueError(f"{case['where']}: annotations has no annotator {annotator!r} "
                             f"(has {sorted(case['mentions'])})")
        spans = [(s, min(e, cut), t) for s, e, it, t in ms if it in masked_types and s < cut]
        released.append(_tab_mask(text[:cut], spans).strip())
        rest.append(text[cut:].strip())

    profiles = [_meta_text(c["meta"]) for c in cases]
    if knowledge_level in ("K2", "K3"):
        from sklearn.feature_extraction.text import TfidfVectorizer

        vec = TfidfVectorizer(stop_words="english", sublinear_tf=True)
        X = vec.fit_transform(rest)
        terms = vec.get_feature_names_out()
        keywords = []
        for r in range(X.shape[0]):
            row = X.getrow(r)
            order = sorted(zip(-row.data, terms[row.indices]))[:n_keywords]
            keywords.append(" ".join(t for _, t in order))
        profiles = [f"{p} keywords: {k}." for p, k in zip(profiles, keywords)]
    if knowledge_level == "K3":
        profiles = [f"{p} case text: {r}" for p, r in zip(profiles, rest)]

    attr = {a: [None if c["meta"].get(a) is None else
                (", ".join(map(str, c["meta"][a])) if isinstance(c["meta"][a], list) else str(c["meta"][a]))
                for c in cases] for a in ("countries", "legal_branch")}
    vocab = _vocab_of(attr)
    attr = {a: v for a, v in attr.items() if a in vocab}
    docs = _sample(len(cases), n_documents, np.random.default_rng([seed, 11]))
    return LinkageSuite(
        name=f"tab/{knowledge_level}/{release}",
        knowledge_level=knowledge_level,
        release=release,
        documents=tuple(released[i] for i in docs),
        doc_ids=tuple(cases[i]["doc_id"] for i in docs),
        identities=tuple(cases[i]["doc_id"] for i in docs),
        candidates=tuple(c["doc_id"] for c in cases),
        profiles=tuple(profiles),
        attributes=vocab,
        candidate_attributes={a: tuple(v) for a, v in attr.items()},
        document_attributes={a: tuple(v[i] for i in docs) for a, v in attr.items()},
        meta={"loader": "conformal.data.loaders.load_tab", "paths": files, "annotator": annotator,
              "split_fraction": float(split_fraction), "n_keywords": n_keywords, "seed": seed,
              "n_cases": len(cases), "n_documents": len(docs)},
    )


# ------------------------------------------------------------------------------------------------
# TextWash
# ------------------------------------------------------------------------------------------------

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
        raise ValueError(f"{root}: a TextWash tree must contain 'orig/' and 'anon/' folders of .txt files "
                         "(or person_descriptions/orig and person_descriptions/anon)")
    orig = {os.path.basename(p): p for p in glob.glob(os.path.join(orig_dir, "*.txt"))}
    anon = {os.path.basename(p): p for p in glob.glob(os.path.join(anon_dir, "*.txt"))}
    if not orig:
        raise ValueError(f"{orig_dir}: no .txt file")
    for only, there, missing in ((set(orig) - set(anon), orig_dir, anon_dir), (set(anon) - set(orig), anon_dir,
                                                                                 orig_dir)):
        if only:
            name = sorted(only)[0]
            raise ValueError(f"{os.path.join(there, name)}: has no counterpart in {missing} "
                             f"({len(only)} unpaired file(s))")
    rows = []
    for fname in sorted(orig):
        stem = fname[:-4]
        m = _TEXTWASH_FILE.match(stem)
        if not m:
            raise ValueError(f"{orig[fname]}: file name must be '<category>_<number>[_<subject>].txt', got {fname!r}")
        rows.append({"id": stem, "category": _textwash_category(m["category"]), "subject": m["subject"],
                     "orig": _read_text(orig[fname]).strip(), "anon": _read_text(anon[fname]).strip(), "name": None,
                     "where": orig[fname]})
    return rows


def _textwash_rows_from_csv(path: str) -> list[dict]:
    with open(path, newline="", encoding="utf-8-sig") as fh:
        reader = csv.DictReader(fh)
        header = reader.fieldnames or []
        lower = {h.strip().lower(): h for h in header}
        col = {}
        for key, aliases in TEXTWASH_COLUMNS.items():
            col[key] = next((lower[a] for a in aliases if a in lower), None)
            if col[key] is None and key != "name":
                raise ValueError(f"{path}: TextWash CSV needs a {key!r} column (one of {aliases}), got header {header}")
        rows = []
        for i, rec in enumerate(reader, start=2):
            row = {k: (rec.get(c) if c else None) for k, c in col.items()}
            for k in ("id", "category", "orig", "anon"):
                if row[k] is None or not row[k].strip():
                    raise ValueError(f"{path}: line {i}: column {col[k]!r} must be non-empty")
            m = _TEXTWASH_FILE.match(row["id"].strip())
            rows.append({"id": row["id"].strip(), "category": _textwash_category(row["category"]),
                         "subject": m["subject"] if m else None, "orig": row["orig"].strip(),
                         "anon": row["anon"].strip(), "name": (row["name"] or "").strip() or None,
                         "where": f"{path}: line {i}"})
    if not rows:
        raise ValueError(f"{path}: TextWash CSV has no data row")
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

    Returns:
      ``{category: LinkageSuite}`` named ``"textwash/{category}"``, knowledge level ``"orig"``,
      release ``"textwash"``.

    Raises:
      FileNotFoundError: if ``path`` does not exist.
      ValueError: naming the file/line, for a missing folder or column, an unpaired file, a
        badly named file, an empty text, a repeated id, or an unknown requested category.
    """
    path = _require_path(path, "TextWash")
    n_documents = _check_optional_count("n_documents", n_documents)
    seed = _check_seed(seed)
    if os.path.isdir(path):
        rows, fmt = _textwash_rows_from_tree(path), "tree"
    elif path.lower().endswith(".csv"):
        rows, fmt = _textwash_rows_from_csv(path), "csv"
    else:
        raise ValueError(f"{path}: TextWash input must be a folder with orig/ and anon/ or a .csv file")
    seen: dict[str, str] = {}
    for r in rows:
        if not r["orig"] or not r["anon"]:
            raise ValueError(f"{r['where']}: orig and anon texts must be non-empty")
        if r["id"] in seen:
            raise ValueError(f"{r['where']}: id {r['id']!r} must be unique, already at {seen[r['id']]}")
        seen[r["id"]] = r["where"]
    found = sorted({r["category"] for r in rows})
    wanted = found if categories is None else [_textwash_category(c) for c in categories]
    for c in wanted:
        if c not in found:
            raise ValueError(f"categories: {c!r} is not in the data, which has {found}")

    suites = {}
    for k, cat in enumerate(wanted):
        group = [r for r in rows if r["category"] == cat]
        profiles = []
        for r in group:
            names = r["name"].split() if r["name"] else textwash_name_tokens(r["orig"], r["anon"])
            profiles.append(_squash(_mask_words(r["orig"], names, "")))
        subj = [r["subject"] for r in group]
        attr = {"subject": subj} if any(s is not None for s in subj) else {}
        docs = _sample(len(group), n_documents, np.random.default_rng([seed, 21, k]))
        suites[cat] = LinkageSuite(
            name=f"textwash/{cat}",
            knowledge_level="orig",
            release="textwash",
            documents=tuple(group[i]["anon"] for i in docs),
            doc_ids=tuple(group[i]["id"] for i in docs),
            identities=tuple(group[i]["id"] for i in docs),
            candidates=tuple(r["id"] for r in group),
            profiles=tuple(profiles),
            attributes=_vocab_of(attr),
            candidate_attributes={a: tuple(v) for a, v in attr.items()},
            document_attributes={a: tuple(v[i] for i in docs) for a, v in attr.items()},
            meta={"loader": "conformal.data.loaders.load_textwash", "path": path, "format": fmt,
                  "category": cat, "seed": seed, "n_descriptions": len(group), "n_documents": len(docs)},
        )
    return suites


# ------------------------------------------------------------------------------------------------
# WikiBio
# ------------------------------------------------------------------------------------------------

WIKIBIO_LEVELS = ("K1", "K2")
WIKIBIO_RELEASES = ("direct", "name_removed")
WIKIBIO_K1_FIELDS = ("birth_date", "birth_place", "nationality", "occupation")
# Infobox fields never put in a profile: names (they would make linkage trivial) and media.
_WIKIBIO_EXCLUDED = re.compile(r"(name|^image|^caption|^alt$|^signature|^website|^article_title)")
_BOX_KEY = re.compile(r"^(?P<field>.+?)(?:_(?P<pos>\d+))?$")


def parse_wikibio_box(line: str) -> dict[str, str]:
    """One line of a WikiBio ``SET.box`` file -> ``{field: value}`` (empty fields dropped).

    Each tab-separated token is ``fieldname_position:word`` or ``fieldname:<none>``.
    """
    fields: dict[str, list[tuple[int, str]]] = {}
    for tok in line.rstrip("\n").split("\t"):
        if not tok.strip():
            continue
        if ":" not in tok:
            raise ValueError(f"box token must be 'field_position:word', got {tok!r}")
        key, word = tok.split(":", 1)
        m = _BOX_KEY.match(key)
        field, pos = m["field"], int(m["pos"] or 0)
        if word == "<none>":
            fields.setdefault(field, [])
            continue
        fields.setdefault(field, []).append((pos, word))
    return {f: " ".join(w for _, w in sorted(v)) for f, v in fields.items() if v}


def _wikibio_raw(path: str) -> tuple[list[dict], str]:
    if os.path.isdir(path):
        boxes = sorted(glob.glob(os.path.join(path, "*.box")))
        if len(boxes) != 1:
            raise ValueError(f"{path}: a WikiBio split folder must hold exactly one *.box file, found {len(boxes)}")
        box = boxes[0]
    else:
        box = path
    prefix = box[:-4]
    for ext in (".nb", ".sent"):
        if not os.path.isfile(prefix + ext):
            raise FileNotFoundError(f"WikiBio file {prefix + ext!r} (next to {box!r}) does not exist")
    with open(box, encoding="utf-8") as fh:
        box_lines = fh.read().splitlines()
    with open(prefix + ".nb", encoding="utf-8") as fh:
        nb_lines = [ln for ln in fh.read().splitlines() if ln.strip()]
    with open(prefix + ".sent", encoding="utf-8") as fh:
        sents = fh.read().splitlines()
    if len(nb_lines) != len(box_lines):
        raise ValueError(f"{prefix}.nb: must have one line per article of {box} ({len(box_lines)}), "
                         f"got {len(nb_lines)}")
    extra = {}
    for ext in (".id", ".title"):
        if os.path.isfile(prefix + ext):
            with open(prefix + ext, encoding="utf-8") as fh:
                lines = fh.read().splitlines()
            if len(lines) < len(box_lines):
                raise ValueError(f"{prefix}{ext}: must have one line per article ({len(box_lines)}), got {len(lines)}")
            extra[ext] = lines
    records, pos = [], 0
    for i, (bl, nb) in enumerate(zip(box_lines, nb_lines)):
        try:
            k = int(nb)
        except ValueError:
            raise ValueError(f"{prefix}.nb: line {i + 1} must be a sentence count, got {nb!r}") from None
        if k < 1 or pos + k > len(sents):
            raise ValueError(f"{prefix}.nb: line {i + 1}: count {k} runs past the end of {prefix}.sent "
                             f"({len(sents)} lines)")
        try:
            box_fields = parse_wikibio_box(bl)
        except ValueError as e:
            raise ValueError(f"{box}: line {i + 1}: {e}") from None
        records.append({"id": extra[".id"][i].strip() if ".id" in extra else f"{os.path.basename(prefix)}-{i}",
                        "title": extra[".title"][i].strip() if ".title" in extra else None,
                        "box": box_fields, "text": " ".join(s.strip() for s in sents[pos:pos + k]),
                        "where": f"{box}: line {i + 1}"})
        pos += k
    if pos != len(sents):
        raise ValueError(f"{prefix}.sent: has {len(sents)} lines but {prefix}.nb counts {pos}")
    return records, "raw"


def _wikibio_json(path: str) -> tuple[list[dict], str]:
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    try:
        data = json.loads(text)
        recs = data if isinstance(data, list) else [data]
    except json.JSONDecodeError:
        recs = []
        for i, line in enumerate(text.splitlines()):
            if not line.strip():
                continue
            try:
                recs.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}: line {i + 1} is not valid JSON ({e})") from None
    records = []
    for i, rec in enumerate(recs):
        where = f"{path}: record {i}"
        if not isinstance(rec, Mapping):
            raise ValueError(f"{where} must be a JSON object, got {type(rec).__name__}")
        inp = rec.get("input_text")
        if not isinstance(inp, Mapping):
            raise ValueError(f"{where}: field 'input_text' must be an object with 'table' and 'context'")
        table = inp.get("table")
        if isinstance(table, Mapping):
            headers, contents = table.get("column_header"), table.get("content")
        elif isinstance(table, list):
            headers = [c.get("column_header") if isinstance(c, Mapping) else None for c in table]
            contents = [c.get("content") if isinstance(c, Mapping) else None for c in table]
        else:
            raise ValueError(f"{where}: field 'input_text.table' must be an object of lists or a list of objects")
        if not isinstance(headers, list) or not isinstance(contents, list) or len(headers) != len(contents):
            raise ValueError(f"{where}: 'input_text.table' must have equally long 'column_header' and 'content' lists")
        box: dict[str, str] = {}
        for h, c in zip(headers, contents):
            if not isinstance(h, str) or not isinstance(c, str):
                raise ValueError(f"{where}: table entries must be strings, got ({h!r}, {c!r})")
            if c.strip() and c.strip() != "<none>":
                box[h] = (box[h] + " " + c.strip()) if h in box else c.strip()
        target = rec.get("target_text")
        if not isinstance(target, str) or not target.strip():
            raise ValueError(f"{where}: field 'target_text' must be a non-empty string")
        context = inp.get("context")
        rid = rec.get("id")
        records.append({"id": str(rid) if rid is not None else f"wb{i:06d}",
                        "title": context.strip() if isinstance(context, str) and context.strip() else None,
                        "box": box, "text": target.strip(), "where": where})
    return records, "hf_json"


def load_wikibio(
    path: PathLike,
    *,
    knowledge_level: str = "K1",
    release: str = "direct",
    k1_fields: Sequence[str] = WIKIBIO_K1_FIELDS,
    max_candidates: int | None = None,
    n_documents: int | None = None,
    seed: int = 0,
) -> LinkageSuite:
    """WikiBio biographies (infobox + first paragraph) as a linkage suite.

    Formats (Lebret et al. 2016, the data behind the Hugging Face ``wiki_bio`` dataset):

    * Raw: ``SET.box`` (one infobox per line, tab-separated ``fieldname_position:word`` tokens,
      ``fieldname:<none>`` for an empty field), ``SET.nb`` (sentences per article), ``SET.sent``
      (one tokenised sentence per line) and optional ``SET.id`` / ``SET.title``. ``path`` is the
      ``.box`` file or a folder holding one.
    * JSON / JSON lines (``.json``, ``.jsonl``): records ``{"input_text": {"table": {"column_header":
      [...], "row_number": [...], "content": [...]}, "context": title}, "target_text": text}`` as
      exported by ``datasets`` (``table`` may also be a list of ``{"column_header", "content"}``),
      with an optional ``"id"``.

    What is built: one identity per article (``id``). Released document = the biography text;
    release ``"name_removed"`` replaces the words of the infobox ``name`` field and of the title
    by ``[NAME]`` (whole word, case-insensitive). Profiles never contain name-like fields (any field
    whose name contains ``name``) nor ``image``/``caption``/``alt``/``signature``/``website``.
    ``K1``: the ``k1_fields`` present in the infobox; ``K2``: every remaining infobox field; each
    as ``"field: value."``. Pool: all articles, or ``max_candidates`` sampled with ``seed``;
    documents: all pool articles, or ``n_documents`` of them sampled with ``seed``.

    Returns:
      A suite named ``"wikibio/{level}/{release}"`` with attributes ``nationality`` and
      ``occupation`` where present.

    Raises:
      FileNotFoundError: if ``path`` or a companion file does not exist.
      ValueError: naming the file and line/record, for a wrong format or missing field.
    """
    if knowledge_level not in WIKIBIO_LEVELS:
        raise ValueError(f"knowledge_level must be one of {WIKIBIO_LEVELS}, got {knowledge_level!r}")
    if release not in WIKIBIO_RELEASES:
        raise ValueError(f"release must be one of {WIKIBIO_RELEASES}, got {release!r}")
    if isinstance(k1_fields, str) or not k1_fields:
        raise ValueError(f"k1_fields must be a non-empty sequence of field names, got {k1_fields!r}")
    max_candidates = _check_optional_count("max_candidates", max_candidates)
    n_documents = _check_optional_count("n_documents", n_documents)
    seed = _check_seed(seed)
    path = _require_path(path, "WikiBio")
    if os.path.isdir(path) or path.endswith(".box"):
        records, fmt = _wikibio_raw(path)
    elif path.endswith((".json", ".jsonl")):
        records, fmt = _wikibio_json(path)
    else:
        raise ValueError(f"{path}: WikiBio input must be a .box file, a folder with one, or a .json/.jsonl file")
    if not records:
        raise ValueError(f"{path}: no WikiBio article found")
    seen: dict[str, str] = {}
    for r in records:
        if r["id"] in seen:
            raise ValueError(f"{r['where']}: id {r['id']!r} must be unique, already at {seen[r['id']]}")
        seen[r["id"]] = r["where"]
        if not r["text"].strip():
            raise ValueError(f"{r['where']}: the biography text is empty")
    pool = [records[i] for i in _sample(len(records), max_candidates, np.random.default_rng([seed, 31]))]
    docs = _sample(len(pool), n_documents, np.random.default_rng([seed, 32]))

    def profile(box: Mapping[str, str]) -> str:
        keys = [f for f in k1_fields if f in box] if knowledge_level == "K1" else list(box)
        return " ".join(f"{f.replace('_', ' ')}: {box[f]}." for f in keys if not _WIKIBIO_EXCLUDED.search(f))

    def released(r: Mapping) -> str:
        if release == "direct":
            return r["text"]
        words = (r["box"].get("name", "") + " " + (r["title"] or "")).replace("_", " ").split()
        words = [w for w in words if any(ch.isalnum() for ch in w)]
        return _mask_words(r["text"], words, "[NAME]")

    attr = {a: [r["box"].get(a) for r in pool] for a in ("nationality", "occupation")}
    vocab = _vocab_of(attr)
    attr = {a: v for a, v in attr.items() if a in vocab}
    return LinkageSuite(
        name=f"wikibio/{knowledge_level}/{release}",
        knowledge_level=knowledge_level,
        release=release,
        documents=tuple(released(pool[i]) for i in docs),
        doc_ids=tuple(pool[i]["id"] for i in docs),
        identities=tuple(pool[i]["id"] for i in docs),
        candidates=tuple(r["id"] for r in pool),
        profiles=tuple(profile(r["box"]) for r in pool),
        attributes=vocab,
        candidate_attributes={a: tuple(v) for a, v in attr.items()},
        document_attributes={a: tuple(v[i] for i in docs) for a, v in attr.items()},
        meta={"loader": "conformal.data.loaders.load_wikibio", "path": path, "format": fmt,
              "k1_fields": list(k1_fields), "seed": seed, "n_articles": len(records), "n_candidates": len(pool),
              "n_documents": len(docs)},
    )


# ------------------------------------------------------------------------------------------------
# Blog Authorship Corpus
# ------------------------------------------------------------------------------------------------

_BLOG_FILE = re.compile(r"^(?P<id>\d+)\.(?P<gender>male|female)\.(?P<age>\d+)\.(?P<industry>[^.]+)\."
                        r"(?P<sign>[^.]+)\.xml$", re.IGNORECASE)
_BLOG_POST = re.compile(r"<post>(.*?)(?:</post>|(?=<post>)|(?=<date>)|(?=</blog>)|\Z)", re.IGNORECASE | re.DOTALL)


def parse_blog_xml(path: PathLike) -> tuple[dict[str, Any], list[str]]:
    """Reads one Blog Authorship Corpus file, leniently.

    The corpus files are not well-formed XML (stray ``&``, unescaped ``<``, non-UTF-8 bytes), so
    posts are cut out with a regular expression: the text between ``<post>`` and ``</post>`` (or
    the next ``<post>``/``<date>``/``</Blog>``), HTML entities unescaped, whitespace collapsed;
    empty posts are dropped. Bytes are decoded as UTF-8, else Latin-1.

    Returns:
      ``(fields, posts)`` with ``fields = {"id", "gender", "age", "industry", "sign"}`` from the file
      name ``{id}.{gender}.{age}.{industry}.{sign}.xml``.

    Raises:
      FileNotFoundError: if the file does not exist.
      ValueError: naming the file, if its name does not follow the pattern or it has no ``<Blog>`` root.
    """
    path = _require_path(path, "Blog Authorship")
    name = os.path.basename(path)
    m = _BLOG_FILE.match(name)
    if not m:
        raise ValueError(f"{path}: file name must be '{{id}}.{{gender}}.{{age}}.{{industry}}.{{sign}}.xml' "
                         f"with gender male/female, got {name!r}")
    text = _read_text(path)
    if not re.search(r"<blog\b", text, re.IGNORECASE):
        raise ValueError(f"{path}: not a Blog Authorship file: no <Blog> root element")
    posts = [re.sub(r"\s+", " ", html.unescape(p)).strip() for p in _BLOG_POST.findall(text)]
    fields = {"id": m["id"], "gender": m["gender"].lower(), "age": int(m["age"]), "industry": m["industry"],
              "sign": m["sign"]}
    return fields, [p for p in posts if p]


def load_blog_authorship(
    path: PathLike,
    *,
    W,
    max_authors: int | None = None,
    n_released_per_author: int = 1,
    min_profile_posts: int = 10,
    seed: int = 0,
) -> LinkageSuite:
    """Blog Authorship Corpus authors as a linkage suite with ``W`` profile posts per author.

    What is built (paper Section 6.1, Table 4): an author is eligible if it has at least
    ``n_released_per_author + min_profile_posts`` non-empty posts. Eligibility does not depend on
    ``W`` (``W <= min_profile_posts``), so the same ``seed``/``max_authors`` give the same authors
    and released posts for every ``W``. The files are visited in a seeded random order until
    ``max_authors`` eligible authors are found (all eligible authors if ``None``), so only as many
    files are parsed as needed. Each author's posts are shuffled (seeded by ``seed`` and the author
    id); the first ``n_released_per_author`` are released, the next ``W`` are concatenated into the
    profile (disjoint from the released posts). ``W="demo"``: the profile holds the file-name fields
    (gender, age, industry, sign) only.

    Args:
      path: Folder of ``{id}.{gender}.{age}.{industry}.{sign}.xml`` files (other files are ignored).
      W: Profile posts per author (an int >= 1 or ``"W3"``) or ``"demo"``.
      max_authors: Authors to sample (``None``: every eligible author).
      n_released_per_author: Released posts per author.
      min_profile_posts: Posts reserved for profiles (eligibility threshold); ``W`` must not exceed it.
      seed: Seed of the author sample and of the post shuffles.

    Returns:
      A suite named ``"blog_authorship/{level}"``, release ``"post"``, attributes ``gender``,
      ``age_range``, ``industry``, ``sign``.

    Raises:
      FileNotFoundError: if ``path`` does not exist or holds no ``.xml`` file.
      ValueError: naming the file, for a badly named or non-Blog file; for bad arguments; if no
        author is eligible.
    """
    level, w = _blog_level(W)
    max_authors = _check_optional_count("max_authors", max_authors)
    n_released = _check_optional_count("n_released_per_author", n_released_per_author)
    min_profile_posts = _check_optional_count("min_profile_posts", min_profile_posts)
    if w is not None and w > min_profile_posts:
        raise ValueError(f"W must be <= min_profile_posts = {min_profile_posts}, got {w}")
    seed = _check_seed(seed)
    path = _require_path(path, "Blog Authorship")
    if not os.path.isdir(path):
        raise ValueError(f"{path}: Blog Authorship input must be a folder of .xml files")
    files = sorted(glob.glob(os.path.join(path, "*.xml")))
    if not files:
        raise FileNotFoundError(f"Blog Authorship folder {path!r} has no .xml file")
    order = np.random.default_rng([seed, 41]).permutation(len(files))
    need = n_released + min_profile_posts
    rows, n_parsed = [], 0
    for i in order:
        fields, posts = parse_blog_xml(files[int(i)])
        n_parsed += 1
        if len(posts) < need:
            continue
        perm = np.random.default_rng([seed, 42, int(fields["id"])]).permutation(len(posts))
        rows.append((fields["id"], fields["gender"], fields["age"], fields["industry"], fields["sign"],
                     [posts[int(j)] for j in perm]))
        if max_authors is not None and len(rows) == max_authors:
            break
    if not rows:
        raise ValueError(f"{path}: no author has >= n_released_per_author + min_profile_posts = {need} posts")
    rows.sort(key=lambda r: int(r[0]))
    return _blog_suite_from(
        rows, level=level, w=w, n_released=n_released, seed=seed, name_prefix="blog_authorship",
        meta={"loader": "conformal.data.loaders.load_blog_authorship", "path": path, "W": level, "seed": seed,
              "max_authors": max_authors, "n_released_per_author": n_released,
              "min_profile_posts": min_profile_posts, "n_files": len(files), "n_files_parsed": n_parsed,
              "n_authors": len(rows)},
    )

