"""WikiBio (Lebret et al. 2016, infobox + first paragraph): the raw ``SET.box/SET.nb/SET.sent`` files or the
Hugging Face ``wiki_bio`` JSON(L) records as linkage suites.

Suite names: ``"wikibio/{level}/{release}"``.

References:
  Huang et al. 2026, Conformal Privacy Auditing, Section 6.1.
"""

from __future__ import annotations

import glob
import json
import os
import re
from collections.abc import Mapping, Sequence

import numpy as np

from conformal.data.loaders._common import (
    PathLike,
    check_optional_count,
    check_seed,
    mask_words,
    read_utf8,
    require_path,
    sample_indices,
    vocab_of,
)
from conformal.data.suite import LinkageSuite
from snapaudit_jax.utils.errors import InputError, MissingFileError


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

    Args:
      line: one line of a ``SET.box`` file.

    Returns:
      ``{field: words joined by spaces}``.

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
    box_lines = read_utf8(box).splitlines()
    nb_lines = read_utf8(prefix + ".nb").splitlines()
    while nb_lines and not nb_lines[-1].strip():
        nb_lines.pop()
    sents = read_utf8(prefix + ".sent").splitlines()
    if not box_lines:
        raise InputError(f"{box}: no WikiBio article (the file is empty)")
    if len(nb_lines) != len(box_lines):
        raise InputError(f"{prefix}.nb: must have one line per article of {box} ({len(box_lines)}), "
                         f"got {len(nb_lines)}")
    extra = {}
    for ext in (".id", ".title"):
        if os.path.isfile(prefix + ext):
            lines = read_utf8(prefix + ext).splitlines()
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
    text = read_utf8(path)
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
    path = require_path(path, "WikiBio")
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


def load_wikibio_suites(
    path: PathLike,
    *,
    levels: Sequence[str],
    releases: Sequence[str],
    k1_fields: Sequence[str],
    max_candidates: int | None,
    n_documents: int | None,
    seed: int,
) -> list[LinkageSuite]:
    """Every (level, release) WikiBio suite over one read of the files (see :func:`load_wikibio`).

    Args:
      path: As :func:`load_wikibio`.
      levels: Knowledge levels, each ``"K1"`` or ``"K2"``.
      releases: Releases, each ``"direct"`` or ``"name_removed"``.
      k1_fields: Infobox fields of the ``K1`` profile, in order.
      max_candidates: Articles sampled into the pool (``None``: all).
      n_documents: Released articles (``None``: all pool articles).
      seed: Seed of both samples.

    Returns:
      One suite per (level, release), level-major, named ``"wikibio/{level}/{release}"``.

    Raises:
      FileNotFoundError: as :func:`load_wikibio`.
      ValueError: as :func:`load_wikibio`.
    """
    for lv in levels:
        if lv not in WIKIBIO_LEVELS:
            raise InputError(f"knowledge_level must be one of {WIKIBIO_LEVELS}, got {lv!r}")
    for r in releases:
        if r not in WIKIBIO_RELEASES:
            raise InputError(f"release must be one of {WIKIBIO_RELEASES}, got {r!r}")
    if isinstance(k1_fields, str) or not isinstance(k1_fields, Sequence) or not k1_fields or \
            not all(isinstance(f, str) and f for f in k1_fields):
        raise InputError(f"k1_fields must be a non-empty sequence of field names, got {k1_fields!r}")
    max_candidates = check_optional_count("max_candidates", max_candidates)
    n_documents = check_optional_count("n_documents", n_documents)
    seed = check_seed(seed)
    path, records, fmt = _wikibio_records(path)
    pool = [records[i] for i in sample_indices(len(records), max_candidates, np.random.default_rng([seed, 31]))]
    docs = sample_indices(len(pool), n_documents, np.random.default_rng([seed, 32]))

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
        return mask_words(r["text"], words, "[NAME]")

    attr = {a: [r["box"].get(a) for r in pool] for a in ("nationality", "occupation")}
    vocab = vocab_of(attr)
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

    Args:
      path: A ``.box`` file, a folder holding one ``SET.box`` with its companions, or a ``.json``/``.jsonl`` file.
      knowledge_level: ``"K1"`` or ``"K2"``.
      release: ``"name_removed"`` or ``"direct"``.
      k1_fields: Infobox fields of the ``K1`` profile, in order.
      max_candidates: Articles sampled into the pool (``None``: all).
      n_documents: Released articles (``None``: all pool articles).
      seed: Seed of both samples.

    Returns:
      A suite named ``"wikibio/{level}/{release}"`` with attributes ``nationality`` and
      ``occupation`` where present.

    Raises:
      FileNotFoundError: if ``path`` or a companion file does not exist.
      ValueError: naming the file and line/record, for a wrong format or missing field, a repeated
        id, an empty text, or a bad argument.
    """
    return load_wikibio_suites(path, levels=(knowledge_level,), releases=(release,), k1_fields=k1_fields,
                               max_candidates=max_candidates, n_documents=n_documents, seed=seed)[0]
