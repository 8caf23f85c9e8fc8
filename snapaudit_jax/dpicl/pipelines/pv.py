"""Private Voting on a language model: each partition votes; the clean output is the vote vector."""

from __future__ import annotations

import numpy as np

from snapaudit_jax.dpicl.pipelines.base import Pipeline
from snapaudit_jax.mechanisms import PrivateVoting

__all__ = ["PrivateVotingPipeline"]


class PrivateVotingPipeline(Pipeline):
    """PV (Wu et al. 2023): each partition votes; Gaussian noise on the vote counts.

    Vote 0 is "Yes" (direct/semantic) or "the model reproduced the canary's secret" (copy); vote 1 the opposite.
    ContextLeak withholds flagged answers, which then count as a vote 1. Constructor arguments: see
    :class:`Pipeline`.
    """

    name = "pv"

    def answers(self, groups):
        """One bool per partition, ``True``: vote 0 (greedy copy of the secret, or ``log P(Yes) > log P(No)``).

        See :meth:`Pipeline.answers`.
        """
        case = self.case
        if case.mode == "copy":
            prompts = [self._copy(g) for g in groups]
            if self.defense == "contextleak":
                texts = self.oracle.generate(prompts, 16)
                votes = np.array([t.strip().startswith(case.secret) for t in texts])
                return list(votes & ~self._leaks([case.query_text + t for t in texts]))
            return list(self.oracle.continues_with(prompts, [" " + case.secret] * len(prompts)))
        lp = self.oracle.label_logprobs([self._yes_no(g) for g in groups], ["Yes", "No"])
        votes = lp[:, 0] > lp[:, 1]
        if self.defense == "contextleak":
            votes &= ~self._leaks(["Yes" if v else "No" for v in votes])
        return list(votes)

    def aggregate(self, answers):
        """The vote vector ``(2,)`` float64 ``[votes 0, votes 1]``. See :meth:`Pipeline.aggregate`."""
        yes = int(np.sum(answers))
        return np.array([yes, len(answers) - yes], np.float64)

    @property
    def sensitivity(self) -> float:
        """``sqrt(2)``: replacing one exemplar moves at most one vote from one count to the other (L2)."""
        return float(np.sqrt(2.0))

    def mechanism(self, epsilon, delta, calibration="analytic"):
        """:class:`~snapaudit_jax.mechanisms.PrivateVoting`: Gaussian noise on the votes.

        ``sigma`` is calibrated to ``(epsilon, delta)`` at L2 sensitivity ``sqrt(2)``.

        See :meth:`Pipeline.mechanism`.
        """
        return PrivateVoting.calibrated(epsilon, delta, self.sensitivity, calibration)
