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
* :func:`load_source` - the adapter of the CPA runner: ``[data.<source>]`` parameters -> suites.

Suite names follow the synthetic ones (``"synthetic/K2/direct"``): ``"tab/{level}/{release}"``,
``"textwash/{category}"``, ``"wikibio/{level}/{release}"``, ``"blog_corpus/W{k}"``.

References:
  Huang et al. 2026, Conformal Privacy Auditing, Section 6.1, Appendix B (Table 3), Tables 4, 7 and 8.
"""

from __future__ import annotations

import csv
import difflib
import glob
import html
import io
import json
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from conformal.data.suite import LinkageSuite
from conformal.data.synthetic import _blog_level, _blog_suite_from
from snapaudit_jax.utils.errors import InputError, MissingFileError

__all__ = [
    "SOURCES",
    "TAB_RELEASES",
    "TAB_LEVELS",
    "WIKIBIO_LEVELS",
    "WIKIBIO_RELEASES",
    "WIKIBIO_K1_FIELDS",
    "TEXTWASH_COLUMNS",
    "load_source",
    "load_tab",
    "load_textwash",
    "load_wikibio",
    "load_blog_authorship",
    "parse_blog_xml",
    "parse_wikibio_box",
    "textwash_name_tokens",
]

PathLike = str | os.PathLike


def _require_path(path: PathLike, what: str) -> str:
    if not isinstance(path, (str, os.PathLike)):
        raise InputError(f"path must be a string or os.PathLike naming the {what} data, got {path!r}")
    path = os.fspath(path)
    if not path:
        raise InputError(f"path must name the {what} data, got ''")
    if not os.path.exists(path):
        raise MissingFileError(f"{what} path {path!r} does not exist")
    return path


def _check_seed(seed) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise InputError(f"seed must be a non-negative integer, got {seed!r}")
    return int(seed)


def _check_optional_count(field: str, value) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise InputError(f"{field} must be None or an integer >= 1, got {value!r}")
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


def _read_utf8(path: str) -> str:
    """Strict UTF-8 (the JSON and WikiBio formats are UTF-8); a bad byte is a clear ``ValueError``."""
    with open(path, "rb") as fh:
        raw = fh.read()
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: must be UTF-8 text ({e})") from None


def _vocab_of(table: Mapping[str, Sequence[str | None]]) -> dict[str, tuple[str, ...]]:
    return {k: tuple(sorted({v for v in vals if v is not None})) for k, vals in table.items()
            if any(v is not None for v in vals)}


def _mask_words(text: str, words: Sequence[str], replacement: str) -> str:
    """Replaces whole-word, case-insensitive occurrences of each of ``words`` (longest first)."""
    for w in sorted({w for w in words if w}, key=lambda w: (-len(w), w)):
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
    elif not isinstance(paths, Sequence):
        raise InputError(f"paths must be a path or a sequence of paths to TAB JSON files, got {paths!r}")
    files: list[str] = []
    for p in paths:
        p = _require_path(p, "TAB")
        if os.path.isdir(p):
            found = sorted(glob.glob(os.path.join(p, "*.json")))
            if not found:
                raise MissingFileError(f"TAB directory {p!r} has no *.json file")
            files += found
        else:
            files.append(p)
    if not files:
        raise InputError("paths must name at least one TAB JSON file, got none")
    return files


def _tab_record(path: str, i: int, rec: Any) -> dict:
    where = f"{path}: record {i}"
    if not isinstance(rec, Mapping):
        raise InputError(f"{where} must be a JSON object, got {type(rec).__name__}")
    doc_id = rec.get("doc_id")
    if not isinstance(doc_id, str) or not doc_id:
        raise InputError(f"{where}: field 'doc_id' must be a non-empty string, got {doc_id!r}")
    where = f"{path}: record {i} (doc_id {doc_id!r})"
    text = rec.get("text")
    if not isinstance(text, str) or not text.strip():
        raise InputError(f"{where}: field 'text' must be a non-empty string, got {type(text).__name__}")
    meta = rec.get("meta")
    if not isinstance(meta, Mapping):
        raise InputError(f"{where}: field 'meta' must be an object, got {type(meta).__name__}")
    annotations = rec.get("annotations")
    if not isinstance(annotations, Mapping) or not annotations:
        raise InputError(f"{where}: field 'annotations' must be a non-empty object of annotators, "
                         f"got {annotations!r:.80}")
    mentions: dict[str, list[tuple[int, int, str, str]]] = {}
    for annotator, ann in annotations.items():
        ems = ann.get("entity_mentions") if isinstance(ann, Mapping) else None
        if not isinstance(ems, list):
            raise InputError(f"{where}: annotations[{annotator!r}] must have a list 'entity_mentions'")
        out = []
        for j, em in enumerate(ems):
            w = f"{where}: annotations[{annotator!r}].entity_mentions[{j}]"
            if not isinstance(em, Mapping):
                raise InputError(f"{w} must be an object, got {type(em).__name__}")
            for f in ("start_offset", "end_offset", "identifier_type", "entity_type"):
                if f not in em:
                    raise InputError(f"{w}: missing field {f!r}")
            s, e = em["start_offset"], em["end_offset"]
            ok = all(isinstance(x, int) and not isinstance(x, bool) for x in (s, e))
            if not (ok and 0 <= s < e <= len(text)):
                raise InputError(f"{w}: offsets must satisfy 0 <= start_offset < end_offset <= len(text) = "
                                 f"{len(text)}, got ({s!r}, {e!r})")
            if em["identifier_type"] not in _TAB_IDENTIFIER_TYPES:
                raise InputError(f"{w}: identifier_type must be one of {_TAB_IDENTIFIER_TYPES}, "
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
        if v is None or v == "" or v == []:
            continue
        if isinstance(v, (list, tuple)):
            v = ", ".join(str(x) for x in v)
        parts.append(f"{k.replace('_', ' ')}: {v}.")
    return " ".join(parts)


def _tab_cases(files: Sequence[str]) -> list[dict]:
    cases: list[dict] = []
    seen: dict[str, str] = {}
    for path in files:
        try:
            data = json.loads(_read_utf8(path))
        except json.JSONDecodeError as e:
            raise InputError(f"{path}: not valid JSON ({e})") from None
        if not isinstance(data, list):
            raise InputError(f"{path}: a TAB file must hold a JSON list of cases, got {type(data).__name__}")
        for i, rec in enumerate(data):
            case = _tab_record(path, i, rec)
            if case["doc_id"] in seen:
                raise InputError(f"{case['where']}: doc_id must be unique, already in {seen[case['doc_id']]}")
            seen[case["doc_id"]] = path
            cases.append(case)
    if not cases:
        raise InputError(f"{list(files)}: no TAB case found (every file holds an empty list)")
    return cases


def _tab_keywords(rest: Sequence[str], n_keywords: int) -> list[str]:
    """The ``n_keywords`` highest TF-IDF terms of each text (ties: alphabetical), fitted over ``rest``."""
    from sklearn.feature_extraction.text import TfidfVectorizer

    vec = TfidfVectorizer(stop_words="english", sublinear_tf=True)
    try:
        X = vec.fit_transform(rest)
    except ValueError as e:  # every word a stop word
        raise InputError(f"TAB keywords: the held-out case texts have no keyword left after stop words ({e})") from None
    terms = vec.get_feature_names_out()
    keywords = []
    for r in range(X.shape[0]):
        row = X.getrow(r)
        order = sorted(zip(-row.data, terms[row.indices]))[:n_keywords]
        keywords.append(" ".join(t for _, t in order))
    return keywords


def _tab_suites(
    paths,
    *,
    levels: Sequence[str],
    releases: Sequence[str],
    annotator: str | None,
    split_fraction: float,
    n_keywords: int,
    n_documents: int | None,
    seed: int,
) -> list[LinkageSuite]:
    """Every (level, release) TAB suite over one read of the files (see :func:`load_tab`)."""
    for lv in levels:
        if lv not in TAB_LEVELS:
            raise InputError(f"knowledge_level must be one of {TAB_LEVELS}, got {lv!r}")
    for r in releases:
        if r not in TAB_RELEASES:
            raise InputError(f"release must be one of {TAB_RELEASES}, got {r!r}")
    if isinstance(split_fraction, bool) or not isinstance(split_fraction, (int, float)) or \
            not 0.0 < float(split_fraction) < 1.0:
        raise InputError(f"split_fraction must be in (0, 1), got {split_fraction!r}")
    if isinstance(n_keywords, bool) or not isinstance(n_keywords, (int, np.integer)) or n_keywords < 1:
        raise InputError(f"n_keywords must be an integer >= 1, got {n_keywords!r}")
    if annotator is not None and (not isinstance(annotator, str) or not annotator):
        raise InputError(f"annotator must be None or a non-empty string, got {annotator!r}")
    n_documents = _check_optional_count("n_documents", n_documents)
    seed = _check_seed(seed)
    files = _tab_files(paths)
    cases = _tab_cases(files)

    firsts, rest, mentions = [], [], []
    for case in cases:
        text = case["text"]
        cut = _tab_split_point(text, float(split_fraction))
        if cut is None:
            raise InputError(f"{case['where']}: field 'text' cannot be split in two non-empty parts")
        if annotator is None:
            ms = [m for ann in case["mentions"].values() for m in ann]
        elif annotator in case["mentions"]:
            ms = case["mentions"][annotator]
        else:
            raise InputError(f"{case['where']}: annotations has no annotator {annotator!r} "
                             f"(has {sorted(case['mentions'])})")
        firsts.append((text, cut))
        rest.append(text[cut:].strip())
        mentions.append(ms)

    def released(release: str) -> list[str]:
        masked_types = ("DIRECT",) if release == "direct" else ("DIRECT", "QUASI")
        out = []
        for (text, cut), ms in zip(firsts, mentions):
            # A mention crossing the cut is masked on the released side.
            spans = [(s, min(e, cut), t) for s, e, it, t in ms if it in masked_types and s < cut]
            out.append(_tab_mask(text[:cut], spans).strip())
        return out

    k1 = [_meta_text(c["meta"]) for c in cases]
    keywords = _tab_keywords(rest, int(n_keywords)) if any(lv != "K1" for lv in levels) else None
    profiles = {"K1": k1}
    if keywords is not None:
        profiles["K2"] = [f"{p} keywords: {k}.".lstrip() for p, k in zip(k1, keywords)]
        profiles["K3"] = [f"{p} case text: {r}" for p, r in zip(profiles["K2"], rest)]

    def meta_value(c: Mapping, a: str) -> str | None:
        v = c["meta"].get(a)
        if v is None:
            return None
        return ", ".join(map(str, v)) if isinstance(v, (list, tuple)) else str(v)

    attr = {a: [meta_value(c, a) for c in cases] for a in ("countries", "legal_branch")}
    vocab = _vocab_of(attr)
    attr = {a: v for a, v in attr.items() if a in vocab}
    docs = _sample(len(cases), n_documents, np.random.default_rng([seed, 11]))
    texts = {r: released(r) for r in releases}
    suites = []
    for lv in levels:
        for release in releases:
            suites.append(LinkageSuite(
                name=f"tab/{lv}/{release}",
                knowledge_level=lv,
                release=release,
                documents=tuple(texts[release][i] for i in docs),
                doc_ids=tuple(cases[i]["doc_id"] for i in docs),
                identities=tuple(cases[i]["doc_id"] for i in docs),
                candidates=tuple(c["doc_id"] for c in cases),
                profiles=tuple(profiles[lv]),
                attributes=vocab,
                candidate_attributes={a: tuple(v) for a, v in attr.items()},
                document_attributes={a: tuple(v[i] for i in docs) for a, v in attr.items()},
                meta={"loader": "conformal.data.loaders.load_tab", "paths": list(files), "annotator": annotator,
                      "split_fraction": float(split_fraction), "n_keywords": int(n_keywords), "seed": seed,
                      "n_cases": len(cases), "n_documents": len(docs)},
            ).check_closed_world())
    return suites


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
    "countries", "applicant"}, "task", "quality_checked", "dataset_type"}``. Fields used: ``doc_id``,
    ``text``, ``meta``, and per mention ``start_offset``, ``end_offset``, ``entity_type``,
    ``identifier_type``; the others are ignored.

    What is built, exactly:

    * Split. Each case text is cut once, at the paragraph boundary (``\\n``; else a sentence end,
      else a space) closest to ``split_fraction`` of its length. The first part is released; the
      second part is the attacker's side information. No profile contains released text.
    * Released document: the first part with every mention masked as ``[ENTITY_TYPE]`` whose
      ``identifier_type`` is ``DIRECT`` (release ``"direct"``) or ``DIRECT``/``QUASI`` (release
      ``"quasi_id_redaction"``), by any annotator (``annotator=None``: union) or by the named one;
      a mention crossing the cut is masked on the released side; overlapping mentions are merged
      (the placeholder is the type of the one starting first).
    * Profiles (Table 7 ladder; each level's text is a prefix of the next one's). ``K1``: the ``meta``
      fields except ``applicant`` (a direct identifier), as ``"key: value."`` in key order. ``K2``: K1
      + ``" keywords: ..."``, the ``n_keywords`` highest-weighted TF-IDF terms (English stop words
      removed, sublinear tf, fitted over the second parts of all loaded cases) of the case's second
      part. ``K3``: K2 + ``" case text: ..."``, the second part's full text.
    * Pool: every loaded case (closed world, 1,268 cases for train+dev+test); documents: all cases,
      or ``n_documents`` of them sampled with ``seed`` (the pool never depends on the sample).

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
      FileNotFoundError: if a path does not exist or a directory has no ``*.json`` file.
      ValueError: naming the file, record and field, for invalid JSON or UTF-8, a non-list top level,
        a missing/ill-typed field, bad offsets, an unknown identifier type, a repeated ``doc_id``,
        a text that cannot be split, or a bad argument.
    """
    return _tab_suites(paths, levels=(knowledge_level,), releases=(release,), annotator=annotator,
                       split_fraction=split_fraction, n_keywords=n_keywords, n_documents=n_documents,
                       seed=seed)[0]


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
                     "orig": _read_text(orig[fname]).strip(), "anon": _read_text(anon[fname]).strip(), "name": None,
                     "where": orig[fname]})
    return rows


def _textwash_rows_from_csv(path: str) -> list[dict]:
    reader = csv.DictReader(io.StringIO(_read_utf8(path), newline=""), strict=True)
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
        ).check_closed_world()
    return suites


# ------------------------------------------------------------------------------------------------
# WikiBio
# ------------------------------------------------------------------------------------------------

WIKIBIO_LEVELS = ("K1", "K2")
WIKIBIO_RELEASES = ("direct", "name_removed")
WIKIBIO_K1_FIELDS = ("birth_date", "birth_place", "nationality", "occupation")
# Infobox fields never put in a profile: names (they would make linkage trivial) and media/links.
_WIKIBIO_MEDIA = frozenset({"image", "imagesize", "caption", "alt", "signature", "website", "url", "article", "logo"})
_BOX_KEY = re.compile(r"^(?P<field>.+?)(?:_(?P<pos>\d+))?$")
# Words of a name or title that are not masked everywhere ("Michael III of Alexandria").
_NAME_FUNCTION_WORDS = frozenset({"of", "the", "and", "a", "an", "in", "on", "at", "to", "for", "by", "with", "from"})
# Penn Treebank escapes of the tokenised WikiBio text.
_PTB = {"-lrb-": "(", "-rrb-": ")", "-lsb-": "[", "-rsb-": "]", "-lcb-": "{", "-rcb-": "}", "``": '"', "''": '"'}


def _wikibio_excluded(field: str) -> bool:
    """Name-like (``name``, ``birth_name``, ``nickname``, ``names``, ``pseudonym``) or media fields."""
    parts = field.lower().split("_")
    return parts[0] in _WIKIBIO_MEDIA or any(p.endswith(("name", "names")) or p == "pseudonym" for p in parts)


def _detok(text: str) -> str:
    return " ".join(_PTB.get(w, w) for w in text.split())


def parse_wikibio_box(line: str) -> dict[str, str]:
    """One line of a WikiBio ``SET.box`` file -> ``{field: value}`` (empty fields dropped).

    Each tab-separated token is ``fieldname_position:word`` or ``fieldname:<none>``; the words of
    a field are joined in position order.

    Raises:
      ValueError: naming the token, if one has no ``:``, an empty field name or a repeated position.
    """
    fields: dict[str, list[tuple[int, str]]] = {}
    for tok in line.rstrip("\n").split("\t"):
        if not tok.strip():
            continue
        if ":" not in tok:
            raise InputError(f"box token must be 'field_position:word', got {tok!r}")
        key, word = tok.split(":", 1)
        m = _BOX_KEY.match(key)
        if m is None:
            raise InputError(f"box token must have a field name before ':', got {tok!r}")
        field, pos = m["field"], int(m["pos"] or 0)
        if word == "<none>" or not word.strip():
            fields.setdefault(field, [])
            continue
        if any(p == pos for p, _ in fields.get(field, ())):
            raise InputError(f"box token position must not repeat within field {field!r}, got {tok!r}")
        fields.setdefault(field, []).append((pos, word))
    return {f: " ".join(w for _, w in sorted(v)) for f, v in fields.items() if v}


def _wikibio_raw(path: str) -> tuple[list[dict], str]:
    if os.path.isdir(path):
        boxes = sorted(glob.glob(os.path.join(path, "*.box")))
        if len(boxes) != 1:
            raise InputError(f"{path}: a WikiBio split folder must hold exactly one *.box file, found {len(boxes)}")
        box = boxes[0]
    else:
        box = path
    prefix = box[:-4]
    for ext in (".nb", ".sent"):
        if not os.path.isfile(prefix + ext):
            raise MissingFileError(f"WikiBio file {prefix + ext!r} (next to {box!r}) does not exist")
    box_lines = _read_utf8(box).splitlines()
    nb_lines = _read_utf8(prefix + ".nb").splitlines()
    while nb_lines and not nb_lines[-1].strip():
        nb_lines.pop()
    sents = _read_utf8(prefix + ".sent").splitlines()
    if not box_lines:
        raise InputError(f"{box}: no WikiBio article (the file is empty)")
    if len(nb_lines) != len(box_lines):
        raise InputError(f"{prefix}.nb: must have one line per article of {box} ({len(box_lines)}), "
                         f"got {len(nb_lines)}")
    extra = {}
    for ext in (".id", ".title"):
        if os.path.isfile(prefix + ext):
            lines = _read_utf8(prefix + ext).splitlines()
            if len(lines) != len(box_lines):
                raise InputError(f"{prefix}{ext}: must have one line per article ({len(box_lines)}), got {len(lines)}")
            extra[ext] = lines
    records, pos = [], 0
    for i, (bl, nb) in enumerate(zip(box_lines, nb_lines)):
        try:
            k = int(nb)
        except ValueError:
            raise InputError(f"{prefix}.nb: line {i + 1} must be a sentence count, got {nb!r}") from None
        if k < 1 or pos + k > len(sents):
            raise InputError(f"{prefix}.nb: line {i + 1}: count must be in [1, {len(sents) - pos}] (the sentences "
                             f"left in {prefix}.sent), got {k}")
        try:
            box_fields = parse_wikibio_box(bl)
        except ValueError as e:
            raise InputError(f"{box}: line {i + 1}: {e}") from None
        rid = extra[".id"][i].strip() if ".id" in extra else ""
        records.append({"id": rid or f"{os.path.basename(prefix)}-{i}",
                        "title": extra[".title"][i].strip() or None if ".title" in extra else None,
                        "box": {f: _detok(v) for f, v in box_fields.items()},
                        "text": _detok(" ".join(s.strip() for s in sents[pos:pos + k])),
                        "where": f"{box}: line {i + 1}"})
        pos += k
    if pos != len(sents):
        raise InputError(f"{prefix}.sent: must have the {pos} lines that {prefix}.nb counts, got {len(sents)}")
    return records, "raw"


def _wikibio_json(path: str) -> tuple[list[dict], str]:
    text = _read_utf8(path)
    try:
        data = json.loads(text)
        recs = data if isinstance(data, list) else [data]
    except json.JSONDecodeError as whole:
        recs = []
        for i, line in enumerate(text.splitlines()):
            if not line.strip():
                continue
            try:
                recs.append(json.loads(line))
            except json.JSONDecodeError as e:
                if i == 0:
                    raise InputError(f"{path}: not valid JSON nor JSON lines ({whole})") from None
                raise InputError(f"{path}: line {i + 1} is not valid JSON ({e})") from None
    records = []
    for i, rec in enumerate(recs):
        where = f"{path}: record {i}"
        if not isinstance(rec, Mapping):
            raise InputError(f"{where} must be a JSON object, got {type(rec).__name__}")
        inp = rec.get("input_text")
        if not isinstance(inp, Mapping):
            raise InputError(f"{where}: field 'input_text' must be an object with 'table' and 'context', "
                             f"got {type(inp).__name__}")
        table = inp.get("table")
        if isinstance(table, Mapping):
            headers, contents = table.get("column_header"), table.get("content")
        elif isinstance(table, list):
            headers = [c.get("column_header") if isinstance(c, Mapping) else None for c in table]
            contents = [c.get("content") if isinstance(c, Mapping) else None for c in table]
        else:
            raise InputError(f"{where}: field 'input_text.table' must be an object of lists or a list of objects, "
                             f"got {type(table).__name__}")
        if not isinstance(headers, list) or not isinstance(contents, list) or len(headers) != len(contents):
            raise InputError(f"{where}: 'input_text.table' must have equally long 'column_header' and 'content' lists")
        box: dict[str, str] = {}
        for h, c in zip(headers, contents):
            if not isinstance(h, str) or not isinstance(c, str):
                raise InputError(f"{where}: table entries must be strings, got ({h!r}, {c!r})")
            if c.strip() and c.strip() != "<none>":
                c = _detok(c)
                box[h] = (box[h] + " " + c) if h in box else c
        target = rec.get("target_text")
        if not isinstance(target, str) or not target.strip():
            raise InputError(f"{where}: field 'target_text' must be a non-empty string, got {target!r:.80}")
        context = inp.get("context")
        rid = rec.get("id")
        records.append({"id": str(rid) if rid is not None else f"wb{i:06d}",
                        "title": context.strip() if isinstance(context, str) and context.strip() else None,
                        "box": box, "text": _detok(target), "where": where})
    return records, "hf_json"


def _wikibio_records(path: PathLike) -> tuple[str, list[dict], str]:
    path = _require_path(path, "WikiBio")
    if os.path.isdir(path) or path.endswith(".box"):
        records, fmt = _wikibio_raw(path)
    elif path.endswith((".json", ".jsonl")):
        records, fmt = _wikibio_json(path)
    else:
        raise InputError(f"path must be a .box file, a folder with one, or a .json/.jsonl file, got {path!r}")
    if not records:
        raise InputError(f"{path}: no WikiBio article found")
    seen: dict[str, str] = {}
    for r in records:
        if r["id"] in seen:
            raise InputError(f"{r['where']}: id must be unique, got {r['id']!r} already at {seen[r['id']]}")
        seen[r["id"]] = r["where"]
        if not r["text"].strip():
            raise InputError(f"{r['where']}: the biography text must be non-empty")
    return path, records, fmt


def _wikibio_suites(
    path: PathLike,
    *,
    levels: Sequence[str],
    releases: Sequence[str],
    k1_fields: Sequence[str],
    max_candidates: int | None,
    n_documents: int | None,
    seed: int,
) -> list[LinkageSuite]:
    """Every (level, release) WikiBio suite over one read of the files (see :func:`load_wikibio`)."""
    for lv in levels:
        if lv not in WIKIBIO_LEVELS:
            raise InputError(f"knowledge_level must be one of {WIKIBIO_LEVELS}, got {lv!r}")
    for r in releases:
        if r not in WIKIBIO_RELEASES:
            raise InputError(f"release must be one of {WIKIBIO_RELEASES}, got {r!r}")
    if isinstance(k1_fields, str) or not isinstance(k1_fields, Sequence) or not k1_fields or \
            not all(isinstance(f, str) and f for f in k1_fields):
        raise InputError(f"k1_fields must be a non-empty sequence of field names, got {k1_fields!r}")
    max_candidates = _check_optional_count("max_candidates", max_candidates)
    n_documents = _check_optional_count("n_documents", n_documents)
    seed = _check_seed(seed)
    path, records, fmt = _wikibio_records(path)
    pool = [records[i] for i in _sample(len(records), max_candidates, np.random.default_rng([seed, 31]))]
    docs = _sample(len(pool), n_documents, np.random.default_rng([seed, 32]))

    def fields(box: Mapping[str, str], level: str) -> list[str]:
        k1 = [f for f in dict.fromkeys(k1_fields) if f in box]
        keys = k1 if level == "K1" else k1 + [f for f in box if f not in k1]
        return [f"{f.replace('_', ' ')}: {box[f]}." for f in keys if not _wikibio_excluded(f)]

    def released(r: Mapping, release: str) -> str:
        if release == "direct":
            return r["text"]
        title = re.sub(r"\([^)]*\)", " ", r["title"] or "")  # "John Smith (footballer)": disambiguation
        words = (r["box"].get("name", "") + " " + title).replace("_", " ").split()
        words = [w for w in words if any(ch.isalnum() for ch in w) and w.lower() not in _NAME_FUNCTION_WORDS]
        return _mask_words(r["text"], words, "[NAME]")

    attr = {a: [r["box"].get(a) for r in pool] for a in ("nationality", "occupation")}
    vocab = _vocab_of(attr)
    attr = {a: v for a, v in attr.items() if a in vocab}
    suites = []
    for lv in levels:
        profiles = tuple(" ".join(fields(r["box"], lv)) for r in pool)
        for release in releases:
            suites.append(LinkageSuite(
                name=f"wikibio/{lv}/{release}",
                knowledge_level=lv,
                release=release,
                documents=tuple(released(pool[i], release) for i in docs),
                doc_ids=tuple(pool[i]["id"] for i in docs),
                identities=tuple(pool[i]["id"] for i in docs),
                candidates=tuple(r["id"] for r in pool),
                profiles=profiles,
                attributes=vocab,
                candidate_attributes={a: tuple(v) for a, v in attr.items()},
                document_attributes={a: tuple(v[i] for i in docs) for a, v in attr.items()},
                meta={"loader": "conformal.data.loaders.load_wikibio", "path": path, "format": fmt,
                      "k1_fields": list(k1_fields), "seed": seed, "n_articles": len(records),
                      "n_candidates": len(pool), "n_documents": len(docs)},
            ).check_closed_world())
    return suites


def load_wikibio(
    path: PathLike,
    *,
    knowledge_level: str = "K1",
    release: str = "name_removed",
    k1_fields: Sequence[str] = WIKIBIO_K1_FIELDS,
    max_candidates: int | None = None,
    n_documents: int | None = None,
    seed: int = 0,
) -> LinkageSuite:
    """WikiBio biographies (infobox + first paragraph) as a linkage suite.

    Formats (Lebret et al. 2016, the data behind the Hugging Face ``wiki_bio`` dataset):

    * Raw: ``SET.box`` (one infobox per line, tab-separated ``fieldname_position:word`` tokens,
      ``fieldname:<none>`` for an empty field), ``SET.nb`` (sentences per article), ``SET.sent``
      (one tokenised sentence per line) and optional ``SET.id`` / ``SET.title`` (one line per
      article; the id names the identity, else ``SET-<line>``). ``path`` is the ``.box`` file or a
      folder holding exactly one. Penn Treebank escapes (``-lrb-`` ...) are turned back into brackets.
    * JSON / JSON lines (``.json``, ``.jsonl``): records ``{"input_text": {"table": {"column_header":
      [...], "row_number": [...], "content": [...]}, "context": title}, "target_text": text}`` as
      exported by ``datasets`` (``table`` may also be a list of ``{"column_header", "content"}``),
      with an optional ``"id"`` (else ``wb<record>``).

    What is built: one identity per article. Released document = the biography text; release
    ``"name_removed"`` (the default: the paper's released biographies are lightly edited) replaces
    the words of the infobox ``name`` field and of the title (without a parenthesised
    disambiguation, without ``of``/``the``/... ) by ``[NAME]`` (whole word, case-insensitive);
    ``"direct"`` releases the text as is. Profiles never contain name-like
    fields (``name``, ``birth_name``, ``nickname``, ... any ``_``-part ending in ``name``) nor
    media fields (``image``, ``caption``, ``alt``, ``signature``, ``website``, ``article_title``, ...).
    ``K1``: the ``k1_fields`` present in the infobox, in that order; ``K2``: K1 followed by every other
    infobox field, in infobox order (the K1 text is a prefix of the K2 text); each as
    ``"field: value."``. Pool: all articles, or ``max_candidates`` sampled with ``seed``; documents:
    all pool articles, or ``n_documents`` of them sampled with ``seed`` (closed world).

    Returns:
      A suite named ``"wikibio/{level}/{release}"`` with attributes ``nationality`` and
      ``occupation`` where present.

    Raises:
      FileNotFoundError: if ``path`` or a companion file does not exist.
      ValueError: naming the file and line/record, for a wrong format or missing field, a repeated
        id, an empty text, or a bad argument.
    """
    return _wikibio_suites(path, levels=(knowledge_level,), releases=(release,), k1_fields=k1_fields,
                           max_candidates=max_candidates, n_documents=n_documents, seed=seed)[0]


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
        raise InputError(f"{path}: file name must be '{{id}}.{{gender}}.{{age}}.{{industry}}.{{sign}}.xml' "
                         f"with gender male/female, got {name!r}")
    text = _read_text(path)
    if not re.search(r"<blog\b", text, re.IGNORECASE):
        raise InputError(f"{path}: not a Blog Authorship file: no <Blog> root element")
    posts = [re.sub(r"\s+", " ", html.unescape(p)).strip() for p in _BLOG_POST.findall(text)]
    fields = {"id": m["id"], "gender": m["gender"].lower(), "age": int(m["age"]), "industry": m["industry"],
              "sign": m["sign"]}
    return fields, [p for p in posts if p]


def _blog_files(path: PathLike) -> tuple[str, list[tuple[str, str]]]:
    """The folder and its ``(author id, file)`` pairs; every ``.xml`` name is checked, ids must be unique."""
    path = _require_path(path, "Blog Authorship")
    if not os.path.isdir(path):
        raise InputError(f"path must be a folder of Blog Authorship .xml files, got the file {path!r}")
    files = sorted(glob.glob(os.path.join(path, "*.xml")))
    if not files:
        raise MissingFileError(f"Blog Authorship folder {path!r} has no .xml file")
    out, seen = [], {}
    for f in files:
        m = _BLOG_FILE.match(os.path.basename(f))
        if not m:
            raise InputError(f"{f}: file name must be '{{id}}.{{gender}}.{{age}}.{{industry}}.{{sign}}.xml' "
                             f"with gender male/female, got {os.path.basename(f)!r}")
        aid = str(int(m["id"]))
        if aid in seen:
            raise InputError(f"{f}: author id must be unique, got {m['id']!r} also in {seen[aid]}")
        seen[aid] = f
        out.append((aid, f))
    return path, out


def _blog_rows(files: Sequence[tuple[str, str]], *, max_authors: int | None, need: int, seed: int):
    """Eligible authors (>= ``need`` posts), visiting the files in a seeded order; posts seeded-shuffled."""
    order = np.random.default_rng([seed, 41]).permutation(len(files))
    rows, n_parsed = [], 0
    for i in order:
        fields, posts = parse_blog_xml(files[int(i)][1])
        n_parsed += 1
        if len(posts) < need:
            continue
        perm = np.random.default_rng([seed, 42, int(fields["id"])]).permutation(len(posts))
        rows.append((files[int(i)][0], fields["gender"], fields["age"], fields["industry"], fields["sign"],
                     [posts[int(j)] for j in perm]))
        if max_authors is not None and len(rows) == max_authors:
            break
    rows.sort(key=lambda r: int(r[0]))
    return rows, n_parsed


def _blog_suites(
    path: PathLike,
    *,
    levels: Sequence,
    max_authors: int | None,
    n_released_per_author: int,
    min_profile_posts: int | None,
    seed: int,
) -> list[LinkageSuite]:
    """One suite per ``W`` in ``levels`` over the same authors and released posts (see :func:`load_blog_authorship`)."""
    if isinstance(levels, (str, int)) or not isinstance(levels, Sequence) or not levels:
        raise InputError(f"W must be a non-empty list of post counts (or 'demo'), got {levels!r}")
    parsed = [_blog_level(W) for W in levels]
    names = [lv for lv, _ in parsed]
    if len(set(names)) != len(names):
        raise InputError(f"W must not repeat a level, got {list(levels)}")
    max_authors = _check_optional_count("max_authors", max_authors)
    if isinstance(n_released_per_author, bool) or not isinstance(n_released_per_author, (int, np.integer)) or \
            n_released_per_author < 1:
        raise InputError(f"n_released_per_author must be an integer >= 1, got {n_released_per_author!r}")
    n_released = int(n_released_per_author)
    largest = max([w for _, w in parsed if w is not None], default=1)
    if min_profile_posts is None:
        min_profile_posts = max(10, largest)
    min_profile_posts = _check_optional_count("min_profile_posts", min_profile_posts)
    if largest > min_profile_posts:
        raise InputError(f"W must be <= min_profile_posts = {min_profile_posts}, got {largest}")
    seed = _check_seed(seed)
    path, files = _blog_files(path)
    need = n_released + min_profile_posts
    rows, n_parsed = _blog_rows(files, max_authors=max_authors, need=need, seed=seed)
    if not rows:
        raise InputError(f"{path}: no author has >= n_released_per_author + min_profile_posts = {need} posts "
                         f"({n_parsed} files parsed)")
    return [
        _blog_suite_from(
            rows, level=level, w=w, n_released=n_released, seed=seed, name_prefix="blog_corpus",
            meta={"loader": "conformal.data.loaders.load_blog_authorship", "path": path, "W": level, "seed": seed,
                  "max_authors": max_authors, "n_released_per_author": n_released,
                  "min_profile_posts": min_profile_posts, "n_files": len(files), "n_files_parsed": n_parsed,
                  "n_authors": len(rows)},
        ).check_closed_world()
        for level, w in parsed
    ]


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

    Format: a folder of ``{id}.{gender}.{age}.{industry}.{sign}.xml`` files (19,320 in the corpus),
    each ``<Blog><date>..</date><post>..</post>...</Blog>``, parsed by :func:`parse_blog_xml`. Every
    ``.xml`` name must follow the pattern and author ids must be unique; other files are ignored.

    What is built (paper Section 6.1, Table 4): an author is eligible if it has at least
    ``n_released_per_author + min_profile_posts`` non-empty posts. Eligibility does not depend on
    ``W`` (``W <= min_profile_posts``), so the same ``seed``/``max_authors`` give the same authors
    and released posts for every ``W``. The files are visited in a seeded random order until
    ``max_authors`` eligible authors are found (all eligible authors if ``None``), so only as many
    files are parsed as needed. Each author's posts are shuffled (seeded by ``seed`` and the author
    id); the first ``n_released_per_author`` are released, the next ``W`` are concatenated into the
    profile (disjoint from the released posts; the W=3 profile is a prefix of the W=10 one).
    ``W="demo"``: the profile holds the file-name fields (gender, age, industry, sign) only. Pool:
    every sampled author (closed world).

    Args:
      path: Folder of ``{id}.{gender}.{age}.{industry}.{sign}.xml`` files.
      W: Profile posts per author (an int >= 1 or ``"W3"``) or ``"demo"``.
      max_authors: Authors to sample (``None``: every eligible author).
      n_released_per_author: Released posts per author.
      min_profile_posts: Posts reserved for profiles (eligibility threshold); ``W`` must not exceed it.
      seed: Seed of the author sample and of the post shuffles.

    Returns:
      A suite named ``"blog_corpus/{level}"`` (``"blog_corpus/W3"``, ``"blog_corpus/demo"``), release
      ``"post"``, attributes ``gender``, ``age_range``, ``industry``, ``sign``.

    Raises:
      FileNotFoundError: if ``path`` does not exist or holds no ``.xml`` file.
      ValueError: naming the file, for a badly named or non-Blog file or a repeated author id; for
        bad arguments; if no author is eligible.
    """
    if min_profile_posts is None:
        raise InputError("min_profile_posts must be an integer >= 1, got None")
    return _blog_suites(path, levels=(W,), max_authors=max_authors, n_released_per_author=n_released_per_author,
                        min_profile_posts=min_profile_posts, seed=seed)[0]


# ------------------------------------------------------------------------------------------------
# The runner's adapter
# ------------------------------------------------------------------------------------------------

SOURCES = ("tab", "textwash", "wikibio", "blog_corpus")

# source -> (required keys, {optional key: default}). The first keys are those the CPA runner passes
# (``conformal.runner._DATA_KEYS``); the others are for library callers.
_SOURCE_PARAMS: dict[str, tuple[tuple[str, ...], dict[str, Any]]] = {
    "tab": (("path",), {"levels": list(TAB_LEVELS), "releases": ["direct"], "annotator": None,
                        "split_fraction": 0.5, "n_keywords": 20, "n_documents": None}),
    "textwash": (("path",), {"categories": None, "n_documents": None}),
    "wikibio": (("path",), {"levels": list(WIKIBIO_LEVELS), "releases": ["name_removed"],
                            "k1_fields": list(WIKIBIO_K1_FIELDS), "max_candidates": None, "n_documents": None}),
    "blog_corpus": (("path",), {"W": [1, 3, 10], "max_authors": 500, "n_released_per_author": 1,
                                "min_profile_posts": None}),
}


def _names(source: str, key: str, value, allowed: Sequence[str]) -> list[str]:
    if isinstance(value, str) or not isinstance(value, Sequence) or not value:
        raise InputError(f"{source}.{key} must be a non-empty list of values from {list(allowed)}, got {value!r}")
    for v in value:
        if v not in allowed:
            raise InputError(f"{source}.{key} must only hold values from {list(allowed)}, got {v!r}")
    if len(set(value)) != len(value):
        raise InputError(f"{source}.{key} must not repeat a value, got {list(value)}")
    return list(value)


def load_source(source: str, params: Mapping[str, Any], *, seed: int) -> list[LinkageSuite]:
    """The linkage suites of one ``[data.<source>]`` section of a CPA configuration.

    Parameters (the CPA runner passes the first ones with their defaults filled in; the others are
    optional, for library callers; see each loader for what is built):

    * ``"tab"``: ``path`` (file, folder or list of TAB JSON files), ``levels`` (default
      ``["K1", "K2", "K3"]``), ``releases`` (``["direct"]``; also ``"quasi_id_redaction"``);
      optional ``annotator``, ``split_fraction``, ``n_keywords``, ``n_documents``. One suite per
      (level, release): ``"tab/K2/direct"``.
    * ``"textwash"``: ``path`` (tree or CSV), ``categories`` (``None``: all); optional ``n_documents``.
      One suite per category: ``"textwash/famous"``.
    * ``"wikibio"``: ``path`` (``.box`` file/folder or ``.json``/``.jsonl``), ``levels``
      (``["K1", "K2"]``); optional ``releases`` (``["name_removed"]``; also ``"direct"``),
      ``k1_fields``, ``max_candidates``, ``n_documents``. One suite per (level, release):
      ``"wikibio/K1/name_removed"``.
    * ``"blog_corpus"``: ``path`` (folder of XML files), ``W`` (``[1, 3, 10]``; ``"demo"`` allowed),
      ``max_authors`` (``500``; ``None``: all eligible); optional ``n_released_per_author`` (1),
      ``min_profile_posts`` (default ``max(10, max W)``). One suite per W: ``"blog_corpus/W3"``.

    Files are read once per call; suites are returned in level-major order, names unique.

    Args:
      source: One of :data:`SOURCES`.
      params: The section's parameters.
      seed: Non-negative integer seed of every sample (documents, authors, post shuffles).

    Returns:
      The suites, each closed-world (every document's identity is a candidate).

    Raises:
      FileNotFoundError: if a path does not exist.
      ValueError: naming ``source.key``, the rule and the value, for an unknown source or key, a
        missing ``path`` or a bad value; and the loaders' format errors (naming file and record).
    """
    if source not in _SOURCE_PARAMS:
        raise InputError(f"source must be one of {list(SOURCES)}, got {source!r}")
    if not isinstance(params, Mapping):
        raise InputError(f"{source} parameters must be a mapping, got {type(params).__name__}")
    required, optional = _SOURCE_PARAMS[source]
    unknown = sorted(str(k) for k in params if k not in required and k not in optional)
    if unknown:
        raise InputError(f"{source}.{unknown[0]} is not a parameter of source {source!r} "
                         f"(allowed: {', '.join(list(required) + list(optional))}), got {params[unknown[0]]!r}")
    p = {**optional, **params}
    for k in required:
        if p.get(k) is None:
            raise InputError(f"{source}.{k} is required (a local file or folder of the {source} data), got None")
    path = p["path"]
    paths = path if source == "tab" and isinstance(path, (list, tuple)) and path else [path]
    if not all(isinstance(x, (str, os.PathLike)) and os.fspath(x) for x in paths):
        raise InputError(f"{source}.path must be a non-empty path string, got {path!r}")
    seed = _check_seed(seed)
    try:
        if source == "tab":
            return _tab_suites(p["path"], levels=_names(source, "levels", p["levels"], TAB_LEVELS),
                               releases=_names(source, "releases", p["releases"], TAB_RELEASES),
                               annotator=p["annotator"], split_fraction=p["split_fraction"],
                               n_keywords=p["n_keywords"], n_documents=p["n_documents"], seed=seed)
        if source == "textwash":
            return list(load_textwash(p["path"], categories=p["categories"], n_documents=p["n_documents"],
                                      seed=seed).values())
        if source == "wikibio":
            return _wikibio_suites(p["path"], levels=_names(source, "levels", p["levels"], WIKIBIO_LEVELS),
                                   releases=_names(source, "releases", p["releases"], WIKIBIO_RELEASES),
                                   k1_fields=p["k1_fields"], max_candidates=p["max_candidates"],
                                   n_documents=p["n_documents"], seed=seed)
        return _blog_suites(p["path"], levels=p["W"], max_authors=p["max_authors"],
                            n_released_per_author=p["n_released_per_author"],
                            min_profile_posts=p["min_profile_posts"], seed=seed)
    except ValueError as e:
        msg = str(e)
        # Argument errors of the loaders name the bare argument: qualify them with the source.
        key = {"knowledge_level": "levels", "release": "releases"}.get(msg.split(" ", 1)[0], msg.split(" ", 1)[0])
        if (key in required or key in optional) and msg.split(" ", 2)[1:2] == ["must"]:
            raise InputError(f"{source}.{key} {msg.split(' ', 1)[1]}") from None
        raise
