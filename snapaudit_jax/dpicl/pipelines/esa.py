"""Embedding Space Aggregation on a language model: generated answers embedded, the mean embedding released
through a candidate pool."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from snapaudit_jax.dpicl.pipelines import prompts as P
from snapaudit_jax.dpicl.pipelines.base import Pipeline
from snapaudit_jax.dpicl.pipelines.candidates import CandidatePool, candidate_text
from snapaudit_jax.mechanisms import EmbeddingSpaceAggregation
from snapaudit_jax.utils import validate

__all__ = ["EmbeddingPipeline"]


class EmbeddingPipeline(Pipeline):
    """ESA (Wu et al. 2023; SnapAudit Alg. 5): the partitions' answers embedded and averaged, with Gaussian noise.

    The release is the candidate nearest to the noisy mean embedding.

    Copy mode makes the signal sentences ``y1`` (canary present) and ``y2`` the canary's and the replacement's
    continuation, so the model answers by copying; direct/semantic modes ask the model to reply with ``y1`` or
    ``y2`` (App. D.2). The candidates are a :class:`CandidatePool`: the fixed pool ``(y1, y2)`` (default here) or
    one drawn by the constrained 0-shot candidate stage (:meth:`draw_pool`, App. D.2), set as :attr:`pool` before
    any snapshot is taken.

    Args:
      oracle: the model calls (with a sentence embedder).
      case: the audit case.
      signals: ``(y1, y2)``.
      partitions: ``T`` (default 1).
      defense: see :class:`Pipeline`.
      pool: the candidate pool (``None``: the fixed pool of ``signals``).

    Attributes:
      signals: ``(y1, y2)``.
      pool: the candidate pool the release chooses from.

    Raises:
      InputError: as :class:`Pipeline`.

    Guarantees:
      The candidate stage's prompt holds the query's signals and a pseudo-seed, never the private examples, so
      the pool is independent of the private context: for every fixed pool the release is post-processing of the
      Gaussian mean, and ESA's claim holds conditionally on the pool. An audit with the pool drawn once and held
      fixed (treated as public) therefore tests the claim; a violation with one pool is a violation of the claim.

    References:
      SnapAudit (Alg. 5; App. D.2 for the constrained candidate stage).
    """

    name = "esa"
    max_new_tokens = 48

    def __init__(self, oracle, case, *, signals: tuple[str, str], partitions: int = 1, defense: str = "none",
                 pool: CandidatePool | None = None):
        """Checks and stores the settings.

        Args:
          oracle: see :class:`EmbeddingPipeline`.
          case: see :class:`EmbeddingPipeline`.
          signals: see :class:`EmbeddingPipeline`.
          partitions: see :class:`EmbeddingPipeline`.
          defense: see :class:`EmbeddingPipeline`.
          pool: see :class:`EmbeddingPipeline`.
        """
        super().__init__(oracle, case, partitions=partitions, defense=defense)
        self.signals = tuple(signals)
        self.pool = CandidatePool.fixed(self.signals) if pool is None else pool
        self._embedded: dict[tuple[str, ...], np.ndarray] = {}

    def embed_texts(self, texts: Sequence[str]) -> np.ndarray:
        """Embeddings of candidate texts with the oracle's embedder (kept per text tuple).

        Args:
          texts: the texts.

        Returns:
          ``(c, d)`` float32 unit-norm embeddings.
        """
        texts = tuple(texts)
        if texts not in self._embedded:
            self._embedded[texts] = self.oracle.embed(list(texts))
        return self._embedded[texts]

    @property
    def candidates(self) -> np.ndarray:
        """Embeddings ``(c, d)`` of :attr:`pool`'s texts, in release-index order."""
        return self.embed_texts(self.pool.texts)

    @property
    def signal_embeddings(self) -> np.ndarray:
        """Embeddings ``(2, d)`` of ``(y1, y2)`` (the passive white-box attack's direction)."""
        return self.embed_texts(self.signals)

    @property
    def target(self) -> int | None:
        """Index of ``y1`` in the pool; ``None`` where the pool lacks it (the audit's default rule applies)."""
        return self.pool.target

    def _prompt(self, group):
        if self.case.mode == "copy":
            return self._copy(group)
        y1, y2 = self.signals
        return self._chat(self._user(group, P.esa_generator_instruction(self.case.query_text, self.case.mode, y1, y2)))

    def answers(self, groups):
        """One ``(d,)`` embedding per partition: of its answer's first line, trailing '.' dropped.

        Empty or flagged answers are replaced by the withheld text. See :meth:`Pipeline.answers`.
        """
        texts = self.oracle.generate([self._prompt(g) for g in groups], self.max_new_tokens)
        texts = [t.strip().splitlines()[0] if t.strip() else "" for t in texts]
        if self.defense == "contextleak":
            flagged = self._leaks(texts)
            texts = [P.WITHHELD if f else t for t, f in zip(texts, flagged)]
        texts = [t.rstrip(".") if t else P.WITHHELD for t in texts]
        return list(self.oracle.embed(texts))

    def aggregate(self, answers):
        """The mean embedding ``(d,)``. See :meth:`Pipeline.aggregate`."""
        return np.mean(answers, axis=0)

    @property
    def sensitivity(self) -> float:
        """``2 / T``: replacing one exemplar changes one of the ``T`` unit-norm embeddings averaged (L2)."""
        return 2.0 / self.partitions

    def mechanism(self, epsilon, delta, calibration="analytic"):
        """:class:`~snapaudit_jax.mechanisms.EmbeddingSpaceAggregation` over :attr:`candidates`.

        Gaussian ``sigma`` for ``(epsilon, delta)`` at L2 sensitivity ``2 / T``.

        See :meth:`Pipeline.mechanism`.
        """
        return EmbeddingSpaceAggregation.calibrated(epsilon, delta, self.candidates, partitions=self.partitions,
                                                    calibration=calibration)

    # --- the 0-shot candidate stage (SnapAudit Alg. 5 line 8, constrained as in App. D.2) ---------------------
    def candidate_prompts(self, calls: int, seed) -> list[str]:
        """``calls`` prompts of the constrained 0-shot candidate stage: no exemplar, only the signals.

        Each prompt carries a pseudo-seed (greedy decoding is deterministic; the number varies the answer and the
        order the signals are listed in). The pseudo-seeds are
        ``numpy.random.default_rng([*seed, 11]).integers(0, 10**6, calls)``.

        Args:
          calls: number of prompts, ``>= 1``.
          seed: an int or a sequence of ints.

        Returns:
          The chat prompts.

        Raises:
          InputError: ``calls`` is not an integer ``>= 1``.
        """
        calls = validate.positive_int("calls", calls)
        y1, y2 = self.signals
        rng = np.random.default_rng([*(int(s) for s in np.atleast_1d(seed)), 11])
        return [self.oracle.lm.chat_prompt(P.esa_candidate_instruction(y1, y2, int(s)))
                for s in rng.integers(0, 10**6, calls)]

    def draw_pools(self, calls: int, seeds: Sequence) -> list[CandidatePool]:
        """One candidate stage of ``calls`` model calls per seed (batched): ``len(seeds) * calls`` calls.

        Args:
          calls: ``T_cand >= 1``.
          seeds: one seed per pool (see :meth:`candidate_prompts`).

        Returns:
          One ``"sampled"`` :class:`CandidatePool` per seed.

        Raises:
          InputError: ``calls`` is not an integer ``>= 1``.
        """
        prompts = [self.candidate_prompts(calls, s) for s in seeds]
        outputs = self.oracle.generate([p for ps in prompts for p in ps], self.max_new_tokens)
        return [CandidatePool.from_draws(self.signals, [candidate_text(o, self.signals)
                                                         for o in outputs[i * calls:(i + 1) * calls]], s)
                for i, s in enumerate(seeds)]

    def draw_pool(self, calls: int, seed) -> CandidatePool:
        """The pool of one candidate stage of ``calls`` model calls.

        Args:
          calls: ``T_cand >= 1``.
          seed: the pseudo-seed stream's seed (see :meth:`candidate_prompts`).

        Returns:
          The ``"sampled"`` :class:`CandidatePool`.

        Raises:
          InputError: ``calls`` is not an integer ``>= 1``.
        """
        return self.draw_pools(calls, [seed])[0]

    def candidate_coverage(self, calls: int, seed: int) -> dict:
        """Runs the 0-shot candidate stage ``calls`` times; how often each signal comes back (a diagnostic).

        Args:
          calls: ``T_cand >= 1``.
          seed: the pseudo-seed stream's seed.

        Returns:
          ``{"calls", "y1", "y2", "other"}``.
        """
        return {"calls": calls, **self.draw_pool(calls, seed).counts()}
