"""Keyword Space Aggregation on a language model: generated answers split into keywords, the keyword histogram
released by joint exponential top-K."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from snapaudit_jax.dpicl.data import Example
from snapaudit_jax.dpicl.pipelines import prompts as P
from snapaudit_jax.dpicl.pipelines.base import Pipeline, keywords_of
from snapaudit_jax.mechanisms.ksa import KeywordSpaceAggregation
from snapaudit_jax.utils.errors import InputError

__all__ = ["KeywordPipeline"]


class KeywordPipeline(Pipeline):
    """KSA (Wu et al. 2023): keyword histogram of the partitions' answers; JEM top-K.

    Every answer contributes each of its keywords once, so replacing one exemplar moves every count by at most 1
    in either direction (utility sensitivity 2). The keyword domain is fixed after Phase A from the answers under
    both hypotheses (:meth:`histograms`). The target keyword is "yes" (direct/semantic) or the first word of the
    canary's secret (copy).

    Args:
      oracle: the model calls.
      case: the audit case.
      partitions: ``T`` (default 8).
      top_k: ``K``, keywords released.
      defense: see :class:`Pipeline`.
      neighbouring: ``"replace_one"`` (the case's contexts) or ``"add_remove"`` (the context without the canary
        drops it; needs ``partitions = k``).

    Attributes:
      top_k: ``K``.
      neighbouring: the neighbouring relation.
      vocabulary: the keyword domain, ``None`` until :meth:`histograms` fixes it.

    Raises:
      InputError: an unknown ``neighbouring``, ``add_remove`` with ``partitions != k``, or as :class:`Pipeline`.
    """

    name = "ksa"

    NEIGHBOURING = ("replace_one", "add_remove")

    def __init__(self, oracle, case, *, partitions: int = 8, top_k: int = 4, defense: str = "none",
                 neighbouring: str = "replace_one"):
        """Checks and stores the settings.

        Args:
          oracle: see :class:`KeywordPipeline`.
          case: see :class:`KeywordPipeline`.
          partitions: see :class:`KeywordPipeline`.
          top_k: see :class:`KeywordPipeline`.
          defense: see :class:`KeywordPipeline`.
          neighbouring: see :class:`KeywordPipeline`.

        Raises:
          InputError: see :class:`KeywordPipeline`.
        """
        super().__init__(oracle, case, partitions=partitions, defense=defense)
        if neighbouring not in self.NEIGHBOURING:
            raise InputError(f"neighbouring must be one of {', '.join(self.NEIGHBOURING)}, got {neighbouring!r}")
        k = case.context.num_exemplars
        if neighbouring == "add_remove" and partitions != k:
            raise InputError(f"neighbouring='add_remove' needs one exemplar per partition (partitions = "
                             f"num_exemplars = {k}): only then does adding an exemplar add one whole keyword set "
                             f"(every count moves by 0 or +1, Delta_u = 1); got partitions={partitions}")
        self.top_k = int(top_k)
        self.neighbouring = neighbouring
        self.vocabulary: tuple[str, ...] | None = None

    def exemplars(self, b: int) -> tuple[Example, ...]:
        """Hypothesis ``b``'s exemplars; under ``add_remove`` C0 drops the canary instead of replacing it.

        C0 then has ``k - 1`` exemplars. See :meth:`Pipeline.exemplars`.
        """
        if self.neighbouring == "add_remove" and not b:
            ctx = self.case.context
            return tuple(e for i, e in enumerate(ctx.without_canary) if i != ctx.position)
        return self.case.exemplars(b)

    def assign(self, exemplars, rng):
        """Under ``add_remove`` one partition per exemplar (``rng`` unused). See :meth:`Pipeline.assign`."""
        if self.neighbouring == "add_remove":
            return [(e,) for e in exemplars]  # one partition per exemplar: no randomness
        return super().assign(exemplars, rng)

    @property
    def target_keyword(self) -> str:
        """The keyword signalling "canary present": the first word of the secret (copy) or ``"yes"``."""
        return self.case.secret.split()[0] if self.case.mode == "copy" else "yes"

    @property
    def answer_keywords(self) -> frozenset[str]:
        """Words counted even if they are stopwords: the answers the audit distinguishes."""
        return frozenset({self.target_keyword} if self.case.mode == "copy" else {"yes", "no"})

    @property
    def target(self) -> int:
        """Index of :attr:`target_keyword` in :attr:`vocabulary`.

        Raises:
          InputError: the vocabulary is not fixed yet (:meth:`histograms`).
        """
        if self.vocabulary is None:
            raise InputError("the keyword vocabulary is fixed by histograms(); call it first")
        return self.vocabulary.index(self.target_keyword)

    def _prompt(self, group):
        return self._copy(group) if self.case.mode == "copy" else self._yes_no(group)

    def answers(self, groups):
        """One ``frozenset`` of keywords per partition (:func:`keywords_of`; flagged answers: the withheld text).

        See :meth:`Pipeline.answers`.
        """
        texts = self.oracle.generate([self._prompt(g) for g in groups], self.max_new_tokens)
        if self.defense == "contextleak":
            flagged = self._leaks(texts)
            texts = [P.WITHHELD if f else t for t, f in zip(texts, flagged)]
        return [frozenset(keywords_of(t, self.answer_keywords)) for t in texts]

    def aggregate(self, answers):
        """The tuple of the partitions' keyword sets (counted by :meth:`histograms`). See :meth:`Pipeline.aggregate`."""
        return tuple(answers)  # the partitions' keyword sets, counted by histograms()

    def clean_outputs(self, b, n, seed):
        """Not available for KSA: use :meth:`clean_calls` and :meth:`histograms`. See :meth:`Pipeline.clean_outputs`.

        Raises:
          NotImplementedError: always (histograms need the vocabulary of both hypotheses).
        """
        raise NotImplementedError("KSA clean outputs are histograms over a shared vocabulary: use histograms()")

    def histograms(self, sets_with: Sequence, sets_without: Sequence) -> tuple[np.ndarray, np.ndarray]:
        """Counts over a vocabulary fixed from both hypotheses' answers (sets :attr:`vocabulary`).

        Args:
          sets_with: ``n`` aggregates (:meth:`clean_calls`) with the canary.
          sets_without: ``n'`` aggregates without it.

        Returns:
          ``(counts_with, counts_without)``: ``(n, V)`` and ``(n', V)`` float64 keyword counts; the vocabulary is the
          sorted union of their keywords and :attr:`target_keyword`.
        """
        vocab = sorted({w for call in list(sets_with) + list(sets_without) for s in call for w in s}
                       | {self.target_keyword})
        self.vocabulary = tuple(vocab)
        return self.count(sets_with), self.count(sets_without)

    def count(self, calls: Sequence) -> np.ndarray:
        """Keyword counts of calls over the fixed vocabulary (words outside it are not counted).

        Args:
          calls: aggregates (:meth:`clean_calls`), each a tuple of keyword sets.

        Returns:
          ``(n, V)`` float64 counts.

        Raises:
          InputError: the vocabulary is not fixed yet (:meth:`histograms`).
        """
        if self.vocabulary is None:
            raise InputError("the keyword vocabulary is fixed by histograms(); call it first")
        index = {w: i for i, w in enumerate(self.vocabulary)}
        out = np.zeros((len(calls), len(index)))
        for r, call in enumerate(calls):
            for keywords in call:
                for w in keywords:
                    if w in index:
                        out[r, index[w]] += 1
        return out

    @property
    def sensitivity(self) -> float:
        """Sensitivity ``Delta_u`` of JEM's utility ``u(s) = -max_i (c_(i) - c[s_i])`` over the histogram.

        ``replace_one`` (the case's neighbouring contexts: the canary replaces one exemplar), and equally
        add/remove of an exemplar that shares a partition: one partition's keyword set changes, so every count
        moves by -1, 0 or +1, ``c_(i)`` and ``c[s_i]`` by up to 1 each in opposite directions: ``Delta_u = 2``.
        ``add_remove`` with one exemplar per partition: adding the exemplar adds one whole keyword set, every
        count moves by 0 or +1 in the same direction, the difference by at most 1: ``Delta_u = 1``
        (Gillenwater et al. 2022). Both bounds are attained (tested by brute force).
        """
        return 1.0 if self.neighbouring == "add_remove" else 2.0

    def mechanism(self, epsilon, delta, calibration="analytic"):
        """:class:`~snapaudit_jax.mechanisms.ksa.KeywordSpaceAggregation`: JEM top-``min(K, V)``.

        Pure ``epsilon``-DP at utility sensitivity :attr:`sensitivity` (``delta`` and ``calibration`` unused).

        See :meth:`Pipeline.mechanism`.
        """
        k = min(self.top_k, len(self.vocabulary) if self.vocabulary else self.top_k)
        return KeywordSpaceAggregation.calibrated(epsilon, k, self.sensitivity)

    def reconstruction_prompts(self, keyword_ids: np.ndarray) -> list[str]:
        """Final answers of KSA from the selected keywords (for the end-to-end passive audit).

        Args:
          keyword_ids: ``(n, K)`` int indices into :attr:`vocabulary`, one row per release.

        Returns:
          One chat prompt per row.
        """
        return [
            self.oracle.lm.chat_prompt(P.ksa_reconstruction_instruction(self.query, [self.vocabulary[i] for i in row]))
            for row in np.asarray(keyword_ids)
        ]
