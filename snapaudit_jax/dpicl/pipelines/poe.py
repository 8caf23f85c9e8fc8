"""Product of Experts on a language model: each partition's clipped label log-probabilities, summed."""

from __future__ import annotations

import numpy as np

from snapaudit_jax.dpicl.pipelines.base import Pipeline
from snapaudit_jax.mechanisms import ProductOfExperts
from snapaudit_jax.utils.errors import InputError

__all__ = ["ProductOfExpertsPipeline"]


class ProductOfExpertsPipeline(Pipeline):
    """PoE (Romijnders et al. 2026): one expert per exemplar; clipped label log-probs summed.

    Labels are Yes/No (direct/semantic) or the canary's secret vs the decoy as continuations (copy). ContextLeak
    replaces a flagged expert's log-probs by ``-Gamma`` for every label.

    Args:
      oracle: the model calls.
      case: the audit case (``T`` is its number of exemplars).
      clip: ``Gamma > 0``: each expert's log-probs are clipped to ``[-Gamma, 0]``.
      defense: see :class:`Pipeline`.

    Attributes:
      clip: ``Gamma``.

    Raises:
      InputError: ``clip <= 0`` or an unknown defense.
    """

    name = "poe"

    def __init__(self, oracle, case, *, clip: float = 5.0, defense: str = "none"):
        """Checks and stores the settings, one partition per exemplar.

        Args:
          oracle: see :class:`ProductOfExpertsPipeline`.
          case: see :class:`ProductOfExpertsPipeline`.
          clip: see :class:`ProductOfExpertsPipeline`.
          defense: see :class:`ProductOfExpertsPipeline`.

        Raises:
          InputError: ``clip <= 0`` or an unknown defense.
        """
        super().__init__(oracle, case, partitions=case.context.num_exemplars, defense=defense)
        if not clip > 0:
            raise InputError(f"clip must be > 0, got {clip}")
        self.clip = float(clip)

    def assign(self, exemplars, rng):
        """One expert per exemplar, in order; ``rng`` is unused. See :meth:`Pipeline.assign`."""
        return [(e,) for e in exemplars]  # per-example experts: no randomness

    @property
    def labels(self) -> list[str]:
        """The two labels scored: ``["Yes", "No"]``, or (copy) the secret and the decoy with a leading space."""
        if self.case.mode == "copy":
            return [" " + self.case.secret, " " + self.case.decoy]
        return ["Yes", "No"]

    def answers(self, groups):
        """One ``(2,)`` array of clipped label log-probs per expert. See :meth:`Pipeline.answers`."""
        prompts = [self._copy(g) if self.case.mode == "copy" else self._yes_no(g) for g in groups]
        lp = np.clip(self.oracle.label_logprobs(prompts, self.labels), -self.clip, 0.0)
        if self.defense == "contextleak":
            texts = [self.labels[int(i)].strip() for i in np.argmax(lp, axis=1)]
            lp[self._leaks(texts)] = -self.clip
        return list(lp)

    def aggregate(self, answers):
        """The utility ``(2,)``: the experts' clipped log-probs summed. See :meth:`Pipeline.aggregate`."""
        return np.sum(answers, axis=0)

    @property
    def sensitivity(self) -> float:
        """``Gamma``: replacing one exemplar changes one expert, each utility by at most the clip."""
        return self.clip

    def mechanism(self, epsilon, delta, calibration="analytic"):
        """:class:`~snapaudit_jax.mechanisms.ProductOfExperts`: the exponential mechanism.

        Pure ``epsilon``-DP per query at sensitivity ``Gamma`` (``delta`` and ``calibration`` unused).

        See :meth:`Pipeline.mechanism`.
        """
        return ProductOfExperts.calibrated(epsilon, self.clip)
