"""Synthetic blog-style authors, a re-identification benchmark in the style of the Blog Authorship Corpus.

:func:`blog_suite` imitates the Blog Authorship Corpus (Schler et al. 2006): authors with gender, age, industry
and astrological sign write posts drawn from a topic mixture (2-3 favourite topics of 20, one often tied to the
industry) plus a few signature words at a low rate. Released documents are held-out posts; the profile of an
author at level ``W{k}`` is the concatenation of ``k`` other posts, so a larger ``W`` identifies more; level
``"demo"`` profiles hold the demographic fields only. :func:`blog_suite_from_posts` builds the same suite from
real posts (:mod:`conformal.data.loaders.blog`).

Determinism: every draw comes from ``numpy.random.default_rng`` keyed by the seed (and by the author index where
a draw is per author) and from a seeded ``Faker`` instance, as :mod:`conformal.data.synthetic`'s people.

References:
  Huang et al. 2026, Conformal Privacy Auditing, Sections 3.3 and 6.1, Table 8.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence

import numpy as np
from faker import Faker

from conformal.data import _vocab as V
from conformal.data.suite import LinkageSuite
from conformal.data.synthetic import _check_count, _check_seed, _pick, age_range
from snapaudit_jax.utils.errors import InputError

__all__ = ["BLOG_LEVELS", "BlogAuthor", "blog_demo_profile", "blog_ladder", "blog_suite", "blog_suite_from_posts",
           "make_blog_authors", "parse_blog_level"]

BLOG_LEVELS = ("W1", "W3", "W10", "demo")

@dataclasses.dataclass(frozen=True)
class BlogAuthor:
    """A synthetic blog author (Blog Authorship Corpus fields) and its posts.

    Attributes:
      aid: Unique author id.
      gender: ``"female"`` or ``"male"``.
      age: 13-48 (the corpus's age groups 13-17, 23-27, 33-48).
      industry: A Blog Authorship Corpus industry label (``"indUnk"``, ``"Student"``, ...).
      sign: Astrological sign.
      topics: The author's favourite topics.
      signature: The author's signature words (used at a low rate).
      posts: The author's posts, in a random order.
    """

    aid: str
    gender: str
    age: int
    industry: str
    sign: str
    topics: tuple[str, ...]
    signature: tuple[str, ...]
    posts: tuple[str, ...]


_TOPIC_NAMES = tuple(V.BLOG_TOPICS)
P_FUNCTION_WORD, P_SIGNATURE_WORD, P_SELF_MENTION = 0.48, 0.012, 0.12
BLOG_BACKGROUND = 0.35  # topic mass spread over all topics (the rest on the 2-3 favourites)


def _industry_p() -> np.ndarray:
    p = np.full(len(V.BLOG_INDUSTRIES), 1.0)
    rest = 1.0 - sum(V.BLOG_INDUSTRY_P_HEAVY.values())
    p *= rest / (len(p) - len(V.BLOG_INDUSTRY_P_HEAVY))
    for name, q in V.BLOG_INDUSTRY_P_HEAVY.items():
        p[V.BLOG_INDUSTRIES.index(name)] = q
    return p / p.sum()


def _post(rng: np.random.Generator, mix: np.ndarray, signature: Sequence[str], author_self: Sequence[str]) -> str:
    """One post: 4-8 pseudo-sentences of 6-12 words (function words, words of a topic drawn from the
    author's mixture, and the author's signature words at rate ``P_SIGNATURE_WORD``)."""
    n_sent = int(rng.integers(4, 9))
    lengths = rng.integers(6, 13, size=n_sent)
    topics = rng.choice(len(mix), size=n_sent, p=mix)
    total = int(lengths.sum())
    u = rng.random(total)
    fw = rng.integers(len(V.BLOG_FUNCTION_WORDS), size=total)
    tw = rng.integers(1 << 30, size=total)
    sw = rng.integers(len(signature), size=total)
    sents, t = [], 0
    for k, length in enumerate(lengths):
        vocab = V.BLOG_TOPICS[_TOPIC_NAMES[int(topics[k])]]
        words = []
        for j in range(t, t + int(length)):
            if u[j] < P_SIGNATURE_WORD:
                words.append(signature[int(sw[j])])
            elif u[j] < P_SIGNATURE_WORD + P_FUNCTION_WORD:
                words.append(V.BLOG_FUNCTION_WORDS[int(fw[j])])
            else:
                words.append(vocab[int(tw[j]) % len(vocab)])
        t += int(length)
        sents.append(" ".join(words).capitalize() + ".")
    if rng.random() < P_SELF_MENTION:
        sents.insert(int(rng.integers(len(sents) + 1)), _pick(rng, author_self))
    return " ".join(sents)


def make_blog_authors(n_authors: int, *, posts_per_author: int, seed: int) -> tuple[BlogAuthor, ...]:
    """Draws ``n_authors`` synthetic blog authors with ``posts_per_author`` posts each.

    Args:
      n_authors: Number of authors, >= 1.
      posts_per_author: Posts per author, >= 1.
      seed: Non-negative integer.

    Returns:
      ``(n_authors,)`` :class:`BlogAuthor` values, ids ``"a00000"``, ``"a00001"``, ...

    Raises:
      ValueError: if a count is < 1 or the seed is not a non-negative integer.
    """
    n_authors = _check_count("n_authors", n_authors)
    posts_per_author = _check_count("posts_per_author", posts_per_author)
    seed = _check_seed(seed)
    rng = np.random.default_rng([seed, 505])
    fake = Faker("en_US")
    fake.seed_instance(seed)
    ind_p = _industry_p()
    n_topics = len(_TOPIC_NAMES)
    authors = []
    for i in range(n_authors):
        gender = ("female", "male")[int(rng.integers(2))]
        band = V.BLOG_AGE_BANDS[int(rng.choice(len(V.BLOG_AGE_BANDS), p=V.BLOG_AGE_BAND_P))]
        age = int(rng.integers(band[0], band[1] + 1))
        industry = V.BLOG_INDUSTRIES[int(rng.choice(len(V.BLOG_INDUSTRIES), p=ind_p))]
        n_fav = int(rng.integers(2, 4))
        fav = list(rng.choice(n_topics, size=n_fav, replace=False))
        linked = V.INDUSTRY_TOPIC.get(industry)
        if linked is not None and rng.random() < 0.6 and _TOPIC_NAMES.index(linked) not in fav:
            fav[0] = _TOPIC_NAMES.index(linked)
        mix = np.full(n_topics, BLOG_BACKGROUND / n_topics)
        mix[fav] += (1.0 - BLOG_BACKGROUND) * rng.dirichlet(np.full(n_fav, 2.0))
        mix /= mix.sum()
        signature = tuple(dict.fromkeys(fake.words(4) + [fake.first_name().lower()]))
        word = {"female": "girl" if age < 20 else "woman", "male": "guy" if age < 20 else "man"}[gender]
        author_self = (f"I am {age} now, can you believe it.", f"Being a {word} in {industry} is not easy.")
        posts = tuple(_post(rng, mix, signature, author_self) for _ in range(posts_per_author))
        authors.append(BlogAuthor(
            aid=f"a{i:05d}", gender=gender, age=age, industry=industry,
            sign=V.SIGNS[int(rng.integers(len(V.SIGNS)))],
            topics=tuple(_TOPIC_NAMES[int(t)] for t in fav), signature=signature, posts=posts,
        ))
    return tuple(authors)


def parse_blog_level(W) -> tuple[str, int | None]:
    """The knowledge level of a blog suite and its number of profile posts.

    Args:
      W: profile posts per author: an integer ``k >= 1``, ``"W<k>"``, or ``"demo"`` (demographic profiles).

    Returns:
      ``("W<k>", k)``, or ``("demo", None)``.

    Raises:
      ValueError: for any other value.
    """
    if isinstance(W, str):
        if W == "demo":
            return "demo", None
        m = re.fullmatch(r"W(\d+)", W)
        if m:
            W = int(m.group(1))
        else:
            raise InputError(f"W must be a positive integer, 'W<k>' or 'demo', got {W!r}")
    if isinstance(W, bool) or not isinstance(W, (int, np.integer)) or W < 1:
        raise InputError(f"W must be a positive integer, 'W<k>' or 'demo', got {W!r}")
    return f"W{int(W)}", int(W)


def blog_demo_profile(gender: str, age: int, industry: str, sign: str) -> str:
    """The ``demo`` profile: the four Blog Authorship Corpus file-name fields.

    Args:
      gender: ``"male"`` or ``"female"``.
      age: age in years.
      industry: the industry field.
      sign: the astrological sign field.

    Returns:
      ``"gender: ... age: ... (<age range>). industry: ... sign: ..."``.
    """
    return f"gender: {gender}. age: {age} ({age_range(age)}). industry: {industry}. sign: {sign}."


def blog_suite(
    n_authors: int,
    *,
    posts_per_author: int,
    W,
    n_released_per_author: int = 1,
    seed: int,
) -> LinkageSuite:
    """A blog-authorship linkage suite with ``W`` profile posts per author.

    Every author's posts (random order) are split as: the first ``n_released_per_author`` are
    released (the documents), the next ``W`` form the profile. The split does not depend on ``W``,
    so suites with the same ``n_authors``, ``posts_per_author`` and ``seed`` share the released
    posts and a larger ``W`` extends the smaller profile (W=10 profiles contain the W=3 posts).

    Args:
      n_authors: Number of authors (the pool; closed world).
      posts_per_author: Posts generated per author; must be >= ``n_released_per_author + W``.
      W: Profile posts per author (``1``, ``3``, ``10``, any k >= 1, or ``"W3"``), or ``"demo"``
        for demographic-only profiles.
      n_released_per_author: Released posts per author.
      seed: Non-negative integer.

    Returns:
      A :class:`LinkageSuite` named ``"blog/W{k}"`` (or ``"blog/demo"``), knowledge level
      ``"W{k}"``/``"demo"``, release ``"post"``, attributes ``gender``, ``age_range``, ``industry``,
      ``sign``.

    Raises:
      ValueError: for a bad ``W``, sizes, seed, or an author with too few posts for ``W``.
    """
    return blog_ladder(n_authors, posts_per_author=posts_per_author, levels=(W,),
                       n_released_per_author=n_released_per_author, seed=seed)[parse_blog_level(W)[0]]


def blog_ladder(
    n_authors: int,
    *,
    posts_per_author: int,
    levels: Sequence = (1, 3, 10, "demo"),
    n_released_per_author: int = 1,
    seed: int,
) -> dict[str, LinkageSuite]:
    """:func:`blog_suite` for several ``W`` over the same authors and released posts.

    Args:
      n_authors: Number of authors (the pool; closed world).
      posts_per_author: Posts generated per author; must be >= ``n_released_per_author + W`` for every level.
      levels: The ``W`` of each suite (see :func:`blog_suite`), at least one.
      n_released_per_author: Released posts per author.
      seed: Non-negative integer.

    Returns:
      ``{"W1": suite, "W3": suite, "W10": suite, "demo": suite}`` (keys from ``levels``).

    Raises:
      ValueError: as :func:`blog_suite`.
    """
    parsed = [parse_blog_level(W) for W in levels]
    if not parsed:
        raise InputError("levels must name at least one W, got ()")
    n_released_per_author = _check_count("n_released_per_author", n_released_per_author)
    posts_per_author = _check_count("posts_per_author", posts_per_author)
    for level, w in parsed:
        need = n_released_per_author + (w or 0)
        if posts_per_author < need:
            raise InputError(f"posts_per_author must be >= n_released_per_author + W = {need} for level {level}, "
                             f"got {posts_per_author}")
    authors = make_blog_authors(n_authors, posts_per_author=posts_per_author, seed=seed)
    rows = [(a.aid, a.gender, a.age, a.industry, a.sign, a.posts) for a in authors]
    return {
        level: blog_suite_from_posts(
            rows, level=level, w=w, n_released=n_released_per_author, seed=seed, name_prefix="blog",
            meta={"generator": "conformal.data.synthetic_blogs.blog_suite", "seed": int(seed), "n_authors": n_authors,
                  "posts_per_author": posts_per_author, "W": level,
                  "n_released_per_author": n_released_per_author},
        )
        for level, w in parsed
    }


def blog_suite_from_posts(
    authors: Sequence[tuple[str, str, int, str, str, Sequence[str]]],
    *,
    level: str,
    w: int | None,
    n_released: int,
    seed: int,
    name_prefix: str,
    meta: Mapping,
) -> LinkageSuite:
    """A blog linkage suite from authors whose posts are already in release order.

    Shared by the synthetic generator (:func:`blog_ladder`) and the corpus loader
    (:func:`conformal.data.loaders.load_blog_authorship`). Each author's first ``n_released`` posts
    are released (the documents, shuffled with ``seed``); the next ``w`` posts, joined, are the
    profile (``w=None``: the demographic profile of :func:`blog_demo_profile`).

    Args:
      authors: ``(author id, gender, age, industry, sign, posts)`` per author; the pool, in order.
      level: the knowledge level (``"W3"``, ``"demo"``), the suite name's last part.
      w: profile posts per author, or ``None`` for ``"demo"``.
      n_released: released posts per author; every author must have ``n_released + (w or 0)`` posts.
      seed: seed of the document order.
      name_prefix: the suite name's first part (``"blog"``, ``"blog_corpus"``).
      meta: the suite's ``meta`` (copied).

    Returns:
      A closed-world :class:`LinkageSuite` named ``"{name_prefix}/{level}"``, release ``"post"``,
      attributes ``gender``, ``age_range``, ``industry``, ``sign``.
    """
    docs, doc_ids, ids = [], [], []
    for aid, *_rest, posts in authors:
        for j in range(n_released):
            docs.append(posts[j])
            doc_ids.append(f"{aid}/post{j}")
            ids.append(aid)
    order = np.random.default_rng([int(seed), 606]).permutation(len(docs))
    docs = [docs[i] for i in order]
    doc_ids = [doc_ids[i] for i in order]
    ids = [ids[i] for i in order]
    if w is None:
        profiles = [blog_demo_profile(g, age, ind, sign) for _aid, g, age, ind, sign, _posts in authors]
    else:
        profiles = [" ".join(posts[n_released:n_released + w]) for *_rest, posts in authors]
    cand_attr = {
        "gender": [a[1] for a in authors],
        "age_range": [age_range(a[2]) for a in authors],
        "industry": [a[3] for a in authors],
        "sign": [a[4] for a in authors],
    }
    vocab = {k: tuple(sorted(set(v))) for k, v in cand_attr.items()}
    pos = {a[0]: j for j, a in enumerate(authors)}
    doc_attr = {k: tuple(v[pos[y]] for y in ids) for k, v in cand_attr.items()}
    return LinkageSuite(
        name=f"{name_prefix}/{level}",
        knowledge_level=level,
        release="post",
        documents=tuple(docs),
        doc_ids=tuple(doc_ids),
        identities=tuple(ids),
        candidates=tuple(a[0] for a in authors),
        profiles=tuple(profiles),
        attributes=vocab,
        candidate_attributes={k: tuple(v) for k, v in cand_attr.items()},
        document_attributes=doc_attr,
        meta=dict(meta),
    )
