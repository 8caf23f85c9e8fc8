"""Signal-pair search for ESA audits: GreedySearch (GS) and Multi-Sweep Greedy Search (MSGS).

An ESA audit is as strong as the Euclidean distance between the embeddings of
its two signal sentences ``y1`` (canary present) and ``y2`` (canary absent);
for L2-normalised embeddings the distance is at most 2. This module searches
for far-apart pairs by discrete hill climbing over words, with the embedding
model supplied by the caller as a batched function

    ``embed(texts: list[str]) -> array (len(texts), d)``

returning L2-normalised rows. The embedder is where the compute is, so every
call is batched (at most ``batch_size`` texts) and the number of sentences
embedded is reported as ``evaluations``. The search itself is plain
Python/NumPy; its memory is bounded by ``batch_size`` embeddings.

Sentences are whitespace tokens ("words") joined with single spaces. A word
replacement keeps the sentence length, so a pair found from one seed has the
seed's length.

References:
  Xia, Liu & Xiong, "SnapAudit: Active Auditing of Differentially Private
  In-Context Learning via Snapshot-Based Simulation", Sec. 3.3 and Algorithm 2
  (MSGS, subroutine GreedyReplace), Sec. 4.2 / Table 6 (GS baseline),
  App. D.5 / Table 14 (pairs found).
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import math
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from snapaudit_jax.utils import validate
from snapaudit_jax.utils.errors import InputError

__all__ = [
    "SignalPair",
    "greedy_replace",
    "greedy_search",
    "multi_sweep_greedy_search",
    "word_vocabulary",
]

Embed = Callable[[list[str]], Any]

#: Rows returned by ``embed`` must satisfy ``| ||row||_2 - 1 | <= NORM_TOLERANCE``.
NORM_TOLERANCE = 1e-3
_DEFAULT_BATCH_SIZE = 256
_LETTERS = re.compile(r"[^\W\d_]+")


@dataclasses.dataclass(frozen=True)
class SignalPair:
    """A signal-sentence pair and how it was found.

    Attributes:
      sentence_1: ``y1``, the sentence ``A`` of Algorithm 2 (words joined by single spaces).
      sentence_2: ``y2``, the sentence ``B`` of Algorithm 2.
      distance: ``||E(y1) - E(y2)||_2`` in ``[0, 2]``, computed in float64 from the rows ``embed`` returned.
      evaluations: number of sentences embedded by the whole search (all seeds, all sweeps).
      history: one tuple per seed, in seed order, holding the pair's distance after each sweep
        (``sweeps`` entries; non-decreasing). ``history[m][-1]`` is seed ``m``'s final distance.
    """

    sentence_1: str
    sentence_2: str
    distance: float
    evaluations: int
    history: tuple[tuple[float, ...], ...]


# --------------------------------------------------------------------------------------------------------------------
# Validation at the boundary


class _CheckedEmbed:
    """Wraps the caller's ``embed``: validates every returned batch and counts the sentences embedded."""

    def __init__(self, embed: Embed, dim: int | None = None):
        if not callable(embed):
            raise InputError(f"embed must be callable (texts -> (n, d) array), got {embed!r}")
        self._embed = embed
        self.dim = dim
        self.evaluations = 0

    def __call__(self, texts: list[str]) -> np.ndarray:
        raw = self._embed(list(texts))
        try:
            rows = np.asarray(raw, dtype=np.float64)
        except (TypeError, ValueError) as err:
            raise InputError(f"embed must return a numeric (n, d) array, got {type(raw).__name__}: {err}") from None
        expected = f"({len(texts)}, {self.dim if self.dim is not None else 'd'})"
        if rows.ndim != 2 or rows.shape[0] != len(texts) or (self.dim is not None and rows.shape[1] != self.dim):
            raise InputError(f"embed returned shape {rows.shape} for {len(texts)} text(s); expected {expected}")
        if rows.shape[1] < 1:
            raise InputError(f"embed returned shape {rows.shape}; the embedding dimension d must be >= 1")
        finite = np.isfinite(rows).all(axis=1)
        if not finite.all():
            i = int(np.argmin(finite))
            raise InputError(f"embed returned non-finite values (nan/inf) in row {i} for text {texts[i]!r}")
        norms = np.linalg.norm(rows, axis=1)
        off = np.abs(norms - 1.0) > NORM_TOLERANCE
        if off.any():
            i = int(np.argmax(off))
            raise InputError(
                f"embed must return L2-normalised rows (| ||row|| - 1 | <= {NORM_TOLERANCE}), "
                f"got norm {norms[i]:.6g} in row {i} for text {texts[i]!r}"
            )
        self.dim = rows.shape[1]
        self.evaluations += len(texts)
        return rows


def _word(name: str, value: Any) -> str:
    if not isinstance(value, str):
        raise InputError(f"{name} must be a string, got {value!r}")
    if not value or value.split() != [value]:
        raise InputError(f"{name} must be one non-empty word without whitespace, got {value!r}")
    return value


def _vocabulary(vocabulary: Any) -> tuple[str, ...]:
    if isinstance(vocabulary, str) or not isinstance(vocabulary, Iterable):
        raise InputError(f"vocabulary must be a sequence of words, got {type(vocabulary).__name__} {vocabulary!r:.60}")
    words = tuple(_word(f"vocabulary[{i}]", w) for i, w in enumerate(vocabulary))
    if not words:
        raise InputError("vocabulary must contain at least one word, got an empty vocabulary")
    seen: dict[str, int] = {}
    for i, w in enumerate(words):
        if w in seen:
            raise InputError(f"vocabulary must not repeat words, got {w!r} at positions {seen[w]} and {i}")
        seen[w] = i
    return words


def _sentence(name: str, value: Any) -> list[str]:
    """A sentence given as a string (split on whitespace) or as a sequence of words."""
    if isinstance(value, str):
        words = value.split()
    elif isinstance(value, Iterable):
        words = [_word(f"{name}[{i}]", w) for i, w in enumerate(value)]
    else:
        raise InputError(f"{name} must be a sentence (a string or a sequence of words), got {value!r}")
    if not words:
        raise InputError(f"{name} must contain at least one word, got {value!r}")
    return words


def _seeds(seeds: Any) -> list[list[str]]:
    if isinstance(seeds, str):
        raise InputError(
            f"seeds must be a sequence of seed sentences, got a single string {seeds!r:.60}; wrap it in a list"
        )
    if not isinstance(seeds, Iterable):
        raise InputError(f"seeds must be a sequence of seed sentences, got {seeds!r}")
    out = []
    for i, seed in enumerate(seeds):
        if not isinstance(seed, str):
            raise InputError(f"seeds[{i}] must be a string (a sentence), got {seed!r}")
        out.append(_sentence(f"seeds[{i}]", seed))
    if not out:
        raise InputError("seeds must contain at least one seed sentence, got none")
    return out


def _search_options(batch_size: Any, max_rounds: Any, min_gain: Any) -> tuple[int, int | None, float]:
    batch_size = validate.positive_int("batch_size", batch_size)
    if max_rounds is not None:
        max_rounds = validate.positive_int("max_rounds", max_rounds)
    min_gain = validate.nonnegative_float("min_gain", min_gain)
    return batch_size, max_rounds, min_gain


def _anchor(value: Any) -> np.ndarray:
    anchor = validate.finite_array("anchor_embedding", value)
    if anchor.ndim != 1:
        raise InputError(f"anchor_embedding must have shape (d,), got {anchor.shape}")
    norm = float(np.linalg.norm(anchor))
    if abs(norm - 1.0) > NORM_TOLERANCE:
        raise InputError(
            f"anchor_embedding must be L2-normalised (| ||a|| - 1 | <= {NORM_TOLERANCE}), got norm {norm:.6g}"
        )
    return anchor


# --------------------------------------------------------------------------------------------------------------------
# GreedyReplace


@dataclasses.dataclass(frozen=True)
class _Climb:
    words: list[str]
    embedding: np.ndarray  # (d,) float64
    distance: float
    replacements: int  # improving replacements applied
    converged: bool  # stopped because no replacement improves (not because of max_rounds)


def _candidates(words: list[str], vocabulary: tuple[str, ...]) -> Iterable[tuple[int, int, str]]:
    """``(position, vocabulary index, text)`` of every single-word replacement, position-major; no-ops skipped."""
    n = len(words)
    for pos in range(n):
        head = " ".join(words[:pos])
        tail = " ".join(words[pos + 1 :])
        head = head + " " if head else ""
        tail = " " + tail if tail else ""
        current = words[pos]
        for j, w in enumerate(vocabulary):
            if w != current:
                yield pos, j, head + w + tail


def _best_replacement(
    words: list[str], anchor: np.ndarray, embed: _CheckedEmbed, vocabulary: tuple[str, ...], batch_size: int
) -> tuple[float, tuple[int, int] | None, np.ndarray | None]:
    """The farthest single-word replacement: ``(distance, (position, vocabulary index), embedding (d,))``.

    The first strict maximum in (position, vocabulary index) order wins, so ties go to the lowest position,
    then the lowest vocabulary index. Only one batch of candidates is held at a time.
    """
    best_distance, best_move, best_embedding = -math.inf, None, None
    candidates = _candidates(words, vocabulary)
    while batch := list(itertools.islice(candidates, batch_size)):
        rows = embed([text for _, _, text in batch])
        dists = np.linalg.norm(rows - anchor, axis=1)
        k = int(np.argmax(dists))
        if dists[k] > best_distance:
            best_distance, best_move, best_embedding = float(dists[k]), batch[k][:2], rows[k].copy()
    return best_distance, best_move, best_embedding


def _climb(
    words: list[str],
    embedding: np.ndarray,
    anchor: np.ndarray,
    embed: _CheckedEmbed,
    vocabulary: tuple[str, ...],
    batch_size: int,
    max_rounds: int | None,
    min_gain: float,
) -> _Climb:
    """GreedyReplace from ``words`` (whose embedding is given) against ``anchor``."""
    words = list(words)
    distance = float(np.linalg.norm(embedding - anchor))
    replacements = 0
    while max_rounds is None or replacements < max_rounds:
        best_distance, best_move, best_embedding = _best_replacement(words, anchor, embed, vocabulary, batch_size)
        if best_move is None or not best_distance > distance + min_gain:
            return _Climb(words, embedding, distance, replacements, converged=True)
        pos, j = best_move
        words[pos] = vocabulary[j]
        embedding, distance = best_embedding, best_distance
        replacements += 1
    return _Climb(words, embedding, distance, replacements, converged=False)


def greedy_replace(
    sentence_words: str | Sequence[str],
    anchor_embedding: Any,
    embed: Embed,
    vocabulary: Sequence[str],
    *,
    batch_size: int = _DEFAULT_BATCH_SIZE,
    max_rounds: int | None = None,
    min_gain: float = 0.0,
) -> tuple[list[str], float, int]:
    """GreedyReplace: hill-climb one sentence away from an anchor embedding, one word at a time.

    Each round embeds every single-word replacement of the current sentence
    (every position times every vocabulary word, skipping replacements of a
    word by itself) in calls of at most ``batch_size`` texts, and applies the
    one with the largest distance to the anchor if it beats the current
    distance by more than ``min_gain``. Ties go to the lowest position, then
    the lowest vocabulary index. The climb stops when no replacement improves
    or after ``max_rounds`` rounds, so the distance never decreases.

    Args:
      sentence_words: the starting sentence, as a sequence of words or a string (split on whitespace).
        Its words need not be in ``vocabulary``.
      anchor_embedding: ``(d,)`` L2-normalised embedding to move away from.
      embed: ``texts -> (len(texts), d)`` array of L2-normalised rows (float32 is fine); called with at most
        ``batch_size`` texts at a time.
      vocabulary: candidate words, distinct, each non-empty and free of whitespace.
      batch_size: most texts per ``embed`` call.
      max_rounds: most rounds (replacements); ``None`` runs until no replacement improves, which terminates
        because the distance strictly increases over a finite set of sentences.
      min_gain: a replacement must improve the distance by more than this (``0`` is the paper's rule; a small
        positive value guards against embedders whose output depends on the batch).

    Returns:
      ``(words, distance, evaluations)``: the final sentence's words, its distance to the anchor (float64,
      from the rows ``embed`` returned), and the number of sentences embedded -- 1 for the starting sentence
      plus every candidate of every round.

    Raises:
      InputError: an empty sentence or vocabulary, a repeated or malformed vocabulary word, ``batch_size`` or
        ``max_rounds`` < 1, ``min_gain`` < 0, an anchor that is not a finite unit ``(d,)`` vector, or ``embed``
        returning the wrong shape, non-finite values or rows that are not unit-norm (tolerance 1e-3).

    References:
      SnapAudit (Xia, Liu & Xiong), Algorithm 2, subroutine GreedyReplace.
    """
    words = _sentence("sentence_words", sentence_words)
    vocabulary = _vocabulary(vocabulary)
    batch_size, max_rounds, min_gain = _search_options(batch_size, max_rounds, min_gain)
    anchor = _anchor(anchor_embedding)
    checked = _CheckedEmbed(embed, dim=anchor.shape[0])
    start = checked([" ".join(words)])[0]
    climb = _climb(words, start, anchor, checked, vocabulary, batch_size, max_rounds, min_gain)
    return climb.words, climb.distance, checked.evaluations


# --------------------------------------------------------------------------------------------------------------------
# GS and MSGS


def multi_sweep_greedy_search(
    seeds: Sequence[str],
    embed: Embed,
    vocabulary: Sequence[str],
    *,
    sweeps: int,
    batch_size: int = _DEFAULT_BATCH_SIZE,
    max_rounds: int | None = None,
    min_gain: float = 0.0,
) -> SignalPair:
    """Multi-Sweep Greedy Search (MSGS): the farthest signal pair found from several seeds.

    For each seed ``s``: ``A = B = s``; sweep ``t = 1..sweeps`` runs
    GreedyReplace on ``B`` against the fixed ``A`` when ``t`` is odd and on
    ``A`` against the fixed ``B`` when ``t`` is even. Each sweep starts from
    the current pair, so a seed's distance never decreases from sweep to
    sweep. The pair with the largest final distance over all seeds is
    returned (ties: the earliest seed).

    When a sweep applies no replacement and the sweep before it ran to
    convergence (or it is the first sweep, where ``A = B``), both sentences
    are local optima against each other and every later sweep would repeat
    the same evaluations without a change; those sweeps are skipped (their
    distance is still recorded in ``history``). This assumes ``embed`` is a
    deterministic function of each text.

    Args:
      seeds: seed sentences (strings, split on whitespace), ``M >= 1`` of them.
      embed: ``texts -> (len(texts), d)`` array of L2-normalised rows; at most ``batch_size`` texts per call.
      vocabulary: candidate words, distinct, each non-empty and free of whitespace.
      sweeps: ``T >= 1``, the number of alternating GreedyReplace sweeps per seed.
      batch_size: most texts per ``embed`` call.
      max_rounds: most rounds per GreedyReplace call (``None``: until no replacement improves).
      min_gain: a replacement must improve the distance by more than this.

    Returns:
      A :class:`SignalPair` with ``sentence_1 = A``, ``sentence_2 = B``; ``evaluations`` counts every
      sentence embedded (one per seed, plus every candidate); ``history[m]`` has ``sweeps`` distances.

    Raises:
      InputError: no seeds or an empty seed, an empty or malformed vocabulary, ``sweeps``, ``batch_size``
        or ``max_rounds`` < 1, ``min_gain`` < 0, or ``embed`` returning the wrong shape, non-finite values
        or rows that are not unit-norm (tolerance 1e-3).

    References:
      SnapAudit (Xia, Liu & Xiong), Sec. 3.3, Algorithm 2.
    """
    seed_words = _seeds(seeds)
    vocabulary = _vocabulary(vocabulary)
    sweeps = validate.positive_int("sweeps", sweeps)
    batch_size, max_rounds, min_gain = _search_options(batch_size, max_rounds, min_gain)
    checked = _CheckedEmbed(embed)

    best: tuple[float, list[str], list[str]] | None = None
    history: list[tuple[float, ...]] = []
    for words in seed_words:
        seed_embedding = checked([" ".join(words)])[0]
        a, b = list(words), list(words)
        ea, eb = seed_embedding, seed_embedding
        distances: list[float] = []
        previous_converged = True  # before sweep 1, A = B: the two roles are symmetric
        for t in range(1, sweeps + 1):
            if t % 2 == 1:  # anchor A, optimise B
                climb = _climb(b, eb, ea, checked, vocabulary, batch_size, max_rounds, min_gain)
                b, eb = climb.words, climb.embedding
            else:  # anchor B, optimise A
                climb = _climb(a, ea, eb, checked, vocabulary, batch_size, max_rounds, min_gain)
                a, ea = climb.words, climb.embedding
            distances.append(climb.distance)
            if climb.replacements == 0 and climb.converged and previous_converged:
                distances.extend([climb.distance] * (sweeps - t))
                break
            previous_converged = climb.converged
        history.append(tuple(distances))
        if best is None or distances[-1] > best[0]:
            best = (distances[-1], a, b)

    distance, a, b = best
    return SignalPair(" ".join(a), " ".join(b), distance, checked.evaluations, tuple(history))


def greedy_search(
    seed: str,
    embed: Embed,
    vocabulary: Sequence[str],
    *,
    batch_size: int = _DEFAULT_BATCH_SIZE,
    max_rounds: int | None = None,
    min_gain: float = 0.0,
) -> SignalPair:
    """GreedySearch (GS), the single-sweep baseline: ``A = seed`` fixed, ``B`` climbed away from it once.

    Equal to :func:`multi_sweep_greedy_search` with one seed and ``sweeps=1``.

    Args:
      seed: the seed sentence (a string, split on whitespace).
      embed: ``texts -> (len(texts), d)`` array of L2-normalised rows; at most ``batch_size`` texts per call.
      vocabulary: candidate words, distinct, each non-empty and free of whitespace.
      batch_size: most texts per ``embed`` call.
      max_rounds: most GreedyReplace rounds (``None``: until no replacement improves).
      min_gain: a replacement must improve the distance by more than this.

    Returns:
      A :class:`SignalPair` with ``sentence_1`` the seed (re-joined with single spaces), ``sentence_2`` the
      climbed sentence and ``history == ((distance,),)``.

    Raises:
      InputError: as :func:`multi_sweep_greedy_search`, or a ``seed`` that is not a string.

    References:
      SnapAudit (Xia, Liu & Xiong), Sec. 4.2 ("GS refers to one GreedySearch"), Table 6.
    """
    if not isinstance(seed, str):
        raise InputError(f"seed must be a string (a sentence), got {seed!r}")
    return multi_sweep_greedy_search(
        [seed], embed, vocabulary, sweeps=1, batch_size=batch_size, max_rounds=max_rounds, min_gain=min_gain
    )


# --------------------------------------------------------------------------------------------------------------------
# Vocabulary


def word_vocabulary(
    texts: Iterable[str],
    *,
    max_words: int,
    min_count: int = 1,
    seed: int | None = None,
) -> tuple[str, ...]:
    """A search vocabulary from a corpus: lowercase alphabetic words, most frequent first.

    Words are the maximal runs of letters (Unicode letters; no digits or
    ``_``) of each lowercased text, so ``"Don't stop, 4U!"`` gives ``don``,
    ``t``, ``stop`` and ``u``. Words seen fewer than ``min_count`` times are
    dropped. Without ``seed`` the ``max_words`` most frequent words are kept;
    with ``seed`` a uniform random subset of ``max_words`` eligible words is
    kept (``numpy.random.default_rng(seed)``), which gives a more diverse,
    less stop-word-heavy vocabulary. Either way the result is ordered by
    decreasing count, ties alphabetically.

    Args:
      texts: the corpus, a sequence of strings.
      max_words: the most words to return (``>= 1``); fewer if fewer are eligible.
      min_count: the least number of occurrences for a word to be eligible (``>= 1``).
      seed: optional non-negative integer seed for the random subsample.

    Returns:
      The vocabulary as a tuple of distinct words.

    Raises:
      InputError: ``texts`` a single string or containing a non-string, ``max_words`` or ``min_count`` < 1,
        a negative or non-integer ``seed``, or no eligible word.
    """
    if isinstance(texts, str):
        raise InputError(f"texts must be a sequence of strings, got a single string {texts!r:.60}; wrap it in a list")
    if not isinstance(texts, Iterable):
        raise InputError(f"texts must be a sequence of strings, got {texts!r}")
    max_words = validate.positive_int("max_words", max_words)
    min_count = validate.positive_int("min_count", min_count)
    if seed is not None:
        seed = validate.positive_int("seed", seed, minimum=0)
    counts: collections.Counter[str] = collections.Counter()
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise InputError(f"texts[{i}] must be a string, got {text!r}")
        counts.update(_LETTERS.findall(text.lower()))
    eligible = sorted((w for w, c in counts.items() if c >= min_count), key=lambda w: (-counts[w], w))
    if not eligible:
        raise InputError(f"texts contain no alphabetic word occurring at least min_count={min_count} time(s)")
    if seed is None or len(eligible) <= max_words:
        return tuple(eligible[:max_words])
    keep = np.sort(np.random.default_rng(seed).choice(len(eligible), size=max_words, replace=False))
    return tuple(eligible[i] for i in keep)
