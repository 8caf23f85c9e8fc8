"""Blog Authorship Corpus (Schler et al. 2006): a folder of ``{id}.{gender}.{age}.{industry}.{sign}.xml`` files
as linkage suites with ``W`` profile posts per author.

Suite names: ``"blog_corpus/W{k}"`` (``"blog_corpus/demo"``).

References:
  Huang et al. 2026, Conformal Privacy Auditing, Section 6.1, Table 4.
"""

from __future__ import annotations

import glob
import html
import os
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from conformal.data.loaders._common import PathLike, check_optional_count, check_seed, read_text, require_path
from conformal.data.suite import LinkageSuite
from conformal.data.synthetic_blogs import blog_suite_from_posts, parse_blog_level
from snapaudit_jax.utils.errors import InputError, MissingFileError


_BLOG_FILE = re.compile(r"^(?P<id>\d+)\.(?P<gender>male|female)\.(?P<age>\d+)\.(?P<industry>[^.]+)\."
                        r"(?P<sign>[^.]+)\.xml$", re.IGNORECASE)
_BLOG_POST = re.compile(r"<post>(.*?)(?:</post>|(?=<post>)|(?=<date>)|(?=</blog>)|\Z)", re.IGNORECASE | re.DOTALL)


def parse_blog_xml(path: PathLike) -> tuple[dict[str, Any], list[str]]:
    """Reads one Blog Authorship Corpus file, leniently.

    The corpus files are not well-formed XML (stray ``&``, unescaped ``<``, non-UTF-8 bytes), so
    posts are cut out with a regular expression: the text between ``<post>`` and ``</post>`` (or
    the next ``<post>``/``<date>``/``</Blog>``), HTML entities unescaped, whitespace collapsed;
    empty posts are dropped. Bytes are decoded as UTF-8, else Latin-1.

    Args:
      path: one ``{id}.{gender}.{age}.{industry}.{sign}.xml`` file.

    Returns:
      ``(fields, posts)`` with ``fields = {"id", "gender", "age", "industry", "sign"}`` from the file
      name ``{id}.{gender}.{age}.{industry}.{sign}.xml``.

    Raises:
      FileNotFoundError: if the file does not exist.
      ValueError: naming the file, if its name does not follow the pattern or it has no ``<Blog>`` root.
    """
    path = require_path(path, "Blog Authorship")
    name = os.path.basename(path)
    m = _BLOG_FILE.match(name)
    if not m:
        raise InputError(f"{path}: file name must be '{{id}}.{{gender}}.{{age}}.{{industry}}.{{sign}}.xml' "
                         f"with gender male/female, got {name!r}")
    text = read_text(path)
    if not re.search(r"<blog\b", text, re.IGNORECASE):
        raise InputError(f"{path}: not a Blog Authorship file: no <Blog> root element")
    posts = [re.sub(r"\s+", " ", html.unescape(p)).strip() for p in _BLOG_POST.findall(text)]
    fields = {"id": m["id"], "gender": m["gender"].lower(), "age": int(m["age"]), "industry": m["industry"],
              "sign": m["sign"]}
    return fields, [p for p in posts if p]


def _blog_files(path: PathLike) -> tuple[str, list[tuple[str, str]]]:
    """The folder and its ``(author id, file)`` pairs; every ``.xml`` name is checked, ids must be unique."""
    path = require_path(path, "Blog Authorship")
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


def load_blog_authorship_suites(
    path: PathLike,
    *,
    levels: Sequence,
    max_authors: int | None,
    n_released_per_author: int,
    min_profile_posts: int | None,
    seed: int,
) -> list[LinkageSuite]:
    """One suite per ``W`` in ``levels`` over the same authors and released posts (see :func:`load_blog_authorship`).

    Args:
      path: A folder of Blog Authorship ``.xml`` files.
      levels: The ``W`` of each suite (``1``, ``"W3"``, ``"demo"``, ...), at least one, none repeated.
      max_authors: Authors sampled (``None``: every eligible author).
      n_released_per_author: Released posts per author, >= 1.
      min_profile_posts: Profile posts an author needs to be eligible (``None``: ``max(10, max W)``).
      seed: Seed of the file order and of each author's post shuffle.

    Returns:
      One closed-world suite per level, in the order of ``levels``, named ``"blog_corpus/W{k}"``.

    Raises:
      FileNotFoundError: if the folder does not exist or has no ``.xml`` file.
      ValueError: for bad arguments, a malformed file name, a repeated author id or no eligible author.
    """
    if isinstance(levels, (str, int)) or not isinstance(levels, Sequence) or not levels:
        raise InputError(f"W must be a non-empty list of post counts (or 'demo'), got {levels!r}")
    parsed = [parse_blog_level(W) for W in levels]
    names = [lv for lv, _ in parsed]
    if len(set(names)) != len(names):
        raise InputError(f"W must not repeat a level, got {list(levels)}")
    max_authors = check_optional_count("max_authors", max_authors)
    if isinstance(n_released_per_author, bool) or not isinstance(n_released_per_author, (int, np.integer)) or \
            n_released_per_author < 1:
        raise InputError(f"n_released_per_author must be an integer >= 1, got {n_released_per_author!r}")
    n_released = int(n_released_per_author)
    largest = max([w for _, w in parsed if w is not None], default=1)
    if min_profile_posts is None:
        min_profile_posts = max(10, largest)
    min_profile_posts = check_optional_count("min_profile_posts", min_profile_posts)
    if largest > min_profile_posts:
        raise InputError(f"W must be <= min_profile_posts = {min_profile_posts}, got {largest}")
    seed = check_seed(seed)
    path, files = _blog_files(path)
    need = n_released + min_profile_posts
    rows, n_parsed = _blog_rows(files, max_authors=max_authors, need=need, seed=seed)
    if not rows:
        raise InputError(f"{path}: no author has >= n_released_per_author + min_profile_posts = {need} posts "
                         f"({n_parsed} files parsed)")
    return [
        blog_suite_from_posts(
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
    return load_blog_authorship_suites(path, levels=(W,), max_authors=max_authors,
                                       n_released_per_author=n_released_per_author,
                                       min_profile_posts=min_profile_posts, seed=seed)[0]
