"""Trade-off curves (f-DP): the claimed curve of an ``(eps, delta)`` claim, certified curves, and the ROC AUC."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
from scipy import stats

from snapaudit_jax.estimation.estimators import objective
from snapaudit_jax.utils import validate
from snapaudit_jax.utils.errors import InputError
from snapaudit_jax.utils.io import to_json

__all__ = ["TradeoffCurve", "certified_curve", "claimed_tradeoff", "roc_auc"]

def claimed_tradeoff(epsilon: float, delta: float, x) -> np.ndarray:
    """The trade-off curve ``f_{eps, delta}(x) = max(0, 1 - delta - e^eps x, e^-eps (1 - delta - x))`` of a claim.

    Args:
      epsilon: the claimed ``eps``.
      delta: the claimed ``delta``.
      x: type I error rates (FPR) in ``[0, 1]``, array-like.

    Returns:
      The smallest type II error (``1 - TPR``) an ``(eps, delta)``-DP release allows at each ``x``, float64 of the
      shape of ``x``.
    """
    x = np.asarray(x, np.float64)
    return np.maximum.reduce([np.zeros_like(x), 1.0 - delta - math.exp(epsilon) * x,
                              math.exp(-epsilon) * (1.0 - delta - x)])


@dataclasses.dataclass(frozen=True)
class TradeoffCurve:
    """A certified upper bound on the release's trade-off curve at grid points fixed before evaluation.

    For each threshold ``tau_i``: ``FPR(tau_i) <= fpr_up[i]`` and ``TPR(tau_i) >= tpr_low[i]``, all simultaneously
    with the audit's confidence (Bonferroni over the ``2 G`` rates, or exact rates). So the release's trade-off curve
    ``T`` satisfies ``T(x) <= 1 - tpr_low[i]`` for every ``x >= fpr_up[i]``: any claimed curve above that step
    function somewhere is refuted.

    Attributes:
      thresholds: ``(G,)`` the grid (fixed on selection data or a priori).
      fpr_up: ``(G,)`` FPR upper bounds.
      tpr_low: ``(G,)`` TPR lower bounds.
      fpr_up_complement: ``(G,)`` ``1 - fpr_up``, computed without cancellation.
      tpr_low_complement: ``(G,)`` ``1 - tpr_low``, computed without cancellation.
      alpha_per_rate: failure probability of each of the ``2 G`` bounds (0 for exact rates).
      epsilon: ``max_i eps_std(tpr_low[i], fpr_up[i], delta)``: a valid ``(eps, delta)`` lower bound.
      best: index attaining ``epsilon``.
      exact: whether the rates are exact.
    """

    thresholds: tuple[float, ...]
    fpr_up: tuple[float, ...]
    tpr_low: tuple[float, ...]
    fpr_up_complement: tuple[float, ...]
    tpr_low_complement: tuple[float, ...]
    alpha_per_rate: float
    epsilon: float
    best: int
    exact: bool

    def to_dict(self) -> dict[str, Any]:
        """Every field in strict-JSON form (:func:`~snapaudit_jax.utils.io.to_json`)."""
        return to_json(dataclasses.asdict(self))


def certified_curve(thresholds, tpr_low, tpr_low_c, fpr_up, fpr_up_c, *, delta: float, alpha_per_rate: float,
                    exact: bool) -> TradeoffCurve:
    """Builds a :class:`TradeoffCurve` from simultaneous bounds at every grid threshold.

    Args:
      thresholds: ``(G,)`` the grid.
      tpr_low: ``(G,)`` TPR lower bounds.
      tpr_low_c: ``(G,)`` their complements.
      fpr_up: ``(G,)`` FPR upper bounds.
      fpr_up_c: ``(G,)`` their complements.
      delta: the claim's ``delta`` (for ``epsilon``).
      alpha_per_rate: failure probability of each bound, recorded.
      exact: whether the rates are exact, recorded.

    Returns:
      The :class:`TradeoffCurve`.
    """
    eps = objective(tpr_low, tpr_low_c, fpr_up, fpr_up_c, "std", delta)
    best = int(np.argmax(eps))
    def tup(a):
        return tuple(float(v) for v in np.atleast_1d(a))

    return TradeoffCurve(tup(thresholds), tup(fpr_up), tup(tpr_low), tup(fpr_up_c), tup(tpr_low_c),
                         float(alpha_per_rate), float(eps[best]), best, bool(exact))


def _score_vector(name: str, value) -> np.ndarray:
    arr = validate.finite_array(name, value)
    if arr.ndim != 1:
        raise InputError(f"{name} must be 1-dimensional, got shape {arr.shape}")
    return arr


def roc_auc(member_scores, nonmember_scores) -> float:
    """Area under the ROC curve: ``P(S_member > S_nonmember) + P(equal) / 2`` (Mann-Whitney U / (n1 n0)).

    An empirical summary of how well a score separates two groups (members and non-members of a training set,
    canary present or absent), not a confidence bound.

    Args:
      member_scores: ``(n1,)`` scores of the positive group (higher = member).
      nonmember_scores: ``(n0,)`` scores of the negative group.

    Returns:
      The AUC in ``[0, 1]`` (ties count one half, as ``sklearn.metrics.roc_auc_score``).

    Raises:
      InputError: an empty, non-finite or not 1-dimensional score array (naming it).

    References:
      Mann & Whitney, Ann. Math. Statist. 18 (1947); Hanley & McNeil, Radiology 143 (1982), eq. 1.
    """
    m = _score_vector("member_scores", member_scores)
    n = _score_vector("nonmember_scores", nonmember_scores)
    ranks = stats.rankdata(np.concatenate([m, n]), method="average")
    u = ranks[: len(m)].sum() - len(m) * (len(m) + 1) / 2.0
    return float(u / (len(m) * len(n)))
