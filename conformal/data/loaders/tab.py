"""Text Anonymization Benchmark (Pilan et al. 2022): the ``echr_{train,dev,test}.json`` files as linkage suites.

Suite names: ``"tab/{level}/{release}"``.

References:
  Huang et al. 2026, Conformal Privacy Auditing, Section 6.1, Table 7.
"""

from __future__ import annotations

import glob
import json
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from conformal.data.loaders._common import (
    check_optional_count,
    check_seed,
    read_utf8,
    require_path,
    sample_indices,
    vocab_of,
)
from conformal.data.suite import LinkageSuite
from snapaudit_jax.utils.errors import InputError, MissingFileError


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
        p = require_path(p, "TAB")
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
            data = json.loads(read_utf8(path))
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


def load_tab_suites(
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
    """Every (level, release) TAB suite over one read of the files (see :func:`load_tab`).

    Args:
      paths: A TAB JSON file, a directory (all its ``*.json`` files) or a sequence of files.
      levels: Knowledge levels, each ``"K1"``, ``"K2"`` or ``"K3"``.
      releases: Releases, each ``"direct"`` or ``"quasi_id_redaction"``.
      annotator: Mask with this annotator's mentions only; ``None``: union.
      split_fraction: Where to cut the text, in ``(0, 1)``.
      n_keywords: Keywords per ``K2``/``K3`` profile.
      n_documents: Released cases (``None``: all).
      seed: Seed of the document subsample.

    Returns:
      One suite per (level, release), level-major, named ``"tab/{level}/{release}"``.

    Raises:
      FileNotFoundError: as :func:`load_tab`.
      ValueError: as :func:`load_tab`.
    """
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
    n_documents = check_optional_count("n_documents", n_documents)
    seed = check_seed(seed)
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
    vocab = vocab_of(attr)
    attr = {a: v for a, v in attr.items() if a in vocab}
    docs = sample_indices(len(cases), n_documents, np.random.default_rng([seed, 11]))
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
    return load_tab_suites(paths, levels=(knowledge_level,), releases=(release,), annotator=annotator,
                           split_fraction=split_fraction, n_keywords=n_keywords, n_documents=n_documents,
                           seed=seed)[0]
