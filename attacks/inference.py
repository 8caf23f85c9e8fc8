"""PII inference (Lukas et al. 2023, Section III-C): reconstruction with a candidate set that holds the truth.

The attacker of the inference game additionally knows a set ``C`` of ``|C|`` candidate PII strings that
contains the target's (e.g. the people of a known organisation). Each query (:func:`~attacks.reconstruction.
make_queries`) gets the true string once plus ``|C| - 1`` distractors drawn uniformly without replacement from a
pool of same-label PII -- by default the training records' own PII of the label, as the paper draws them (the
reference implementation samples them from the training split's tagged PII), so no distractor is a name the
model never saw -- and Algorithm 6's ranking (:func:`~attacks.reconstruction.rank_candidates`, lowest
perplexity, exact ties to the lexicographically smallest string) picks one. Chance accuracy is ``1 / |C|``.

Several set sizes can be played on the same queries (Table V reports ``|C| = 100`` and ``500``, the
default); the first size is the headline, each size draws its own distractors.

References:
  Lukas et al., "Analyzing Leakage of Personally Identifiable Information in Language Models", IEEE S&P 2023,
  Algorithm 6 and Table V (|C| = 100 and 500).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import numpy as np

from attacks.corpus import LABELS, Record
from attacks.extraction import normalize_pii
from attacks.reconstruction import FILLS, _summary, make_queries, rank_candidates
from snapaudit_jax.utils import validate
from snapaudit_jax.utils.errors import InputError

__all__ = ["InferenceConfig", "candidate_sets", "inference_attack"]


@dataclasses.dataclass(frozen=True)
class InferenceConfig:
    """Configuration of :func:`inference_attack` (frozen, hashable).

    Attributes:
      label: target PII label.
      n_candidates: ``|C|``, candidates per query including the truth; a tuple plays every size on the same
        queries (the first is the headline). Default ``(100, 500)``, the paper's Table V.
      fill: ``"public"`` or ``"mask"`` (see :mod:`attacks.reconstruction`).
      max_queries: attack at most this many target mentions (uniform subset; ``None``: all).
      batch_size: rows per scoring pass.
    """

    label: str = "PERSON"
    n_candidates: int | tuple[int, ...] = (100, 500)
    fill: str = "public"
    max_queries: int | None = None
    batch_size: int = 32

    def validate(self) -> "InferenceConfig":
        """Checks every field; returns ``self`` (errors name the field, the rule and the value)."""
        validate.choice("label", self.label, LABELS)
        if isinstance(self.n_candidates, tuple):
            if not self.n_candidates:
                raise InputError("n_candidates must hold at least one set size, got ()")
            for size in self.n_candidates:
                validate.positive_int("n_candidates[...]", size, minimum=2)
            if len(set(self.n_candidates)) != len(self.n_candidates):
                raise InputError(f"n_candidates must not repeat a size, got {list(self.n_candidates)}")
        else:
            validate.positive_int("n_candidates", self.n_candidates, minimum=2)
        validate.choice("fill", self.fill, FILLS)
        if self.max_queries is not None:
            validate.positive_int("max_queries", self.max_queries)
        validate.positive_int("batch_size", self.batch_size)
        return self

    @property
    def sizes(self) -> tuple[int, ...]:
        """The candidate-set sizes played, headline first."""
        return self.n_candidates if isinstance(self.n_candidates, tuple) else (self.n_candidates,)


def candidate_sets(truths: Sequence[str], pool: Sequence[str], n_candidates: int, key: jax.Array) -> list[list[str]]:
    """Per truth: itself plus ``n_candidates - 1`` distinct distractors from ``pool`` (sorted).

    Args:
      truths: normalised true strings.
      pool: candidate strings (normalised and deduplicated here).
      n_candidates: ``|C|``.
      key: query ``t`` draws with ``fold_in(key, t)``.

    Raises:
      ValueError: the pool has fewer than ``n_candidates - 1`` strings other than a truth.
    """
    n_candidates = validate.positive_int("n_candidates", n_candidates, minimum=2)
    pool = sorted(set(filter(None, map(normalize_pii, pool))))
    index = {p: i for i, p in enumerate(pool)}
    out = []
    for t, truth in enumerate(truths):
        others = len(pool) - (truth in index)
        if others < n_candidates - 1:
            raise InputError(f"n_candidates={n_candidates} needs a pool of at least {n_candidates - 1} strings other "
                             f"than the truth, got {others}")
        weights = np.ones(len(pool))
        if truth in index:
            weights[index[truth]] = 0.0
        draw = jax.random.choice(jax.random.fold_in(key, t), len(pool), (n_candidates - 1,), replace=False,
                                 p=weights / weights.sum())
        out.append(sorted([truth] + [pool[int(i)] for i in np.asarray(draw)]))
    return out


def inference_attack(
    model,
    tokenizer,
    records: Sequence[Record],
    config: InferenceConfig,
    key: jax.Array,
    *,
    candidate_pool: Sequence[str] | None = None,
    baseline_model=None,
    baseline_cache: dict | None = None,
) -> dict:
    """PII inference: top-1 accuracy of the perplexity ranking over ``|C|`` candidates containing the truth.

    Args:
      model: the target NNX decoder; tokenizer: its tokenizer.
      records: the private training records (targets from their ground-truth spans).
      config: an :class:`InferenceConfig`.
      key: PRNG key (queries ``fold_in(key, 0)``; the first size's candidate sets ``fold_in(key, 1)``, every
        further size ``s`` ``fold_in(fold_in(key, 1), s)``).
      candidate_pool: strings the distractors come from (default: every distinct ``config.label`` string in
        ``records``, the training pool of the paper).
      baseline_model: optional model without the private data; it ranks the same sets, and queries it gets
        right are excluded from ``accuracy_excluding_baseline`` (see :mod:`attacks.reconstruction`).
      baseline_cache: optional dict kept by the caller across calls that share ``baseline_model`` (e.g. one
        experiment's variants): the baseline's rankings, keyed by the queries' texts and the candidate sets, are
        read from it instead of scored again (a call with other queries or sets misses and adds its own).

    Returns:
      The first size's game as :func:`~attacks.reconstruction.reconstruction_attack` returns it (``coverage``
      is 1 by construction), plus ``"n_candidates"``, ``"chance"`` (``1 / |C|``) and ``"by_size"``: one such
      dict per size in ``config.sizes`` (the first is the headline itself, without its items).

    Raises:
      ValueError: the pool holds fewer than ``|C| - 1`` strings other than a truth.
    """
    config.validate()
    queries = make_queries(records, config.label, jax.random.fold_in(key, 0), fill=config.fill,
                           max_queries=config.max_queries)
    if candidate_pool is None:
        candidate_pool = [s.value for r in records for s in r.spans if s.label == config.label]
    games = []
    for i, size in enumerate(config.sizes):
        sets_key = jax.random.fold_in(key, 1) if i == 0 else jax.random.fold_in(jax.random.fold_in(key, 1), size)
        sets = candidate_sets([q.truth for q in queries], candidate_pool, size, sets_key)
        rankings = rank_candidates(model, tokenizer, queries, sets, batch_size=config.batch_size)
        baseline = None
        if baseline_model is not None:
            ident = (tuple(q.text for q in queries), tuple(tuple(c) for c in sets))
            if baseline_cache is not None and ident in baseline_cache:
                baseline = baseline_cache[ident]
            else:
                baseline = rank_candidates(baseline_model, tokenizer, queries, sets, batch_size=config.batch_size)
                if baseline_cache is not None:
                    baseline_cache[ident] = baseline
        game = _summary(queries, rankings, baseline)
        game["n_candidates"] = size
        game["chance"] = 1.0 / size
        games.append(game)
    out = dict(games[0])
    out["by_size"] = [{k: v for k, v in g.items() if k != "items" or j} for j, g in enumerate(games)]
    return out
