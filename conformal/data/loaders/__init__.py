"""Loaders for the published formats of the CPA paper's datasets (local files only; nothing is downloaded).

One module per dataset: :mod:`~conformal.data.loaders.tab`, :mod:`~conformal.data.loaders.textwash`,
:mod:`~conformal.data.loaders.wikibio`, :mod:`~conformal.data.loaders.blog`; this package re-exports their
loaders and holds :func:`load_source`.

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
* :func:`load_source` - the adapter of the CPA run (:mod:`conformal.run`): ``[data.<source>]``
  parameters -> suites.

Suite names follow the synthetic ones (``"synthetic/K2/direct"``): ``"tab/{level}/{release}"``,
``"textwash/{category}"``, ``"wikibio/{level}/{release}"``, ``"blog_corpus/W{k}"``.

References:
  Huang et al. 2026, Conformal Privacy Auditing, Section 6.1, Appendix B (Table 3), Tables 4, 7 and 8.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from conformal.data.loaders._common import check_seed
from conformal.data.loaders.blog import load_blog_authorship, load_blog_authorship_suites, parse_blog_xml
from conformal.data.loaders.tab import TAB_LEVELS, TAB_RELEASES, load_tab, load_tab_suites
from conformal.data.loaders.textwash import TEXTWASH_COLUMNS, load_textwash, textwash_name_tokens
from conformal.data.loaders.wikibio import (
    WIKIBIO_K1_FIELDS,
    WIKIBIO_LEVELS,
    WIKIBIO_RELEASES,
    load_wikibio,
    load_wikibio_suites,
    parse_wikibio_box,
)
from conformal.data.suite import LinkageSuite
from snapaudit_jax.utils.errors import InputError

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
    "load_tab_suites",
    "load_textwash",
    "load_wikibio",
    "load_wikibio_suites",
    "load_blog_authorship",
    "load_blog_authorship_suites",
    "parse_blog_xml",
    "parse_wikibio_box",
    "textwash_name_tokens",
]

SOURCES = ("tab", "textwash", "wikibio", "blog_corpus")

# source -> (required keys, {optional key: default}). The first keys are those the CPA runner passes
# (``conformal.config.DATA_DEFAULTS``); the others are for library callers.
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
    seed = check_seed(seed)
    try:
        if source == "tab":
            return load_tab_suites(p["path"], levels=_names(source, "levels", p["levels"], TAB_LEVELS),
                                   releases=_names(source, "releases", p["releases"], TAB_RELEASES),
                                   annotator=p["annotator"], split_fraction=p["split_fraction"],
                                   n_keywords=p["n_keywords"], n_documents=p["n_documents"], seed=seed)
        if source == "textwash":
            return list(load_textwash(p["path"], categories=p["categories"], n_documents=p["n_documents"],
                                      seed=seed).values())
        if source == "wikibio":
            return load_wikibio_suites(p["path"], levels=_names(source, "levels", p["levels"], WIKIBIO_LEVELS),
                                       releases=_names(source, "releases", p["releases"], WIKIBIO_RELEASES),
                                       k1_fields=p["k1_fields"], max_candidates=p["max_candidates"],
                                       n_documents=p["n_documents"], seed=seed)
        return load_blog_authorship_suites(p["path"], levels=p["W"], max_authors=p["max_authors"],
                                           n_released_per_author=p["n_released_per_author"],
                                           min_profile_posts=p["min_profile_posts"], seed=seed)
    except ValueError as e:
        msg = str(e)
        # Argument errors of the loaders name the bare argument: qualify them with the source.
        key = {"knowledge_level": "levels", "release": "releases"}.get(msg.split(" ", 1)[0], msg.split(" ", 1)[0])
        if (key in required or key in optional) and msg.split(" ", 2)[1:2] == ["must"]:
            raise InputError(f"{source}.{key} {msg.split(' ', 1)[1]}") from None
        if msg.startswith(f"{source}.") or isinstance(e, OSError):  # a missing file: the caller names the path
            raise
        # A format error of the data (it names the file and the record): the key is the source's path.
        raise InputError(f"{source}.path: {msg}") from None
