"""Decision rules as frozen values (:class:`Split`, :class:`Bonferroni`, :class:`Explicit`) and their interpreter
:func:`threshold_test`: a threshold is never chosen on the data that evaluates it."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from snapaudit_jax.estimation.estimators import ESTIMATORS, objective, select_index
from snapaudit_jax.estimation.rates import RateBound, binomial_bound, binomial_pair
from snapaudit_jax.utils import validate
from snapaudit_jax.utils.errors import InputError

__all__ = ["Bonferroni", "Explicit", "Split", "ThresholdTest", "threshold_test"]

@dataclasses.dataclass(frozen=True)
class Split:
    """Choose the threshold on a ``fraction`` of each group, evaluate it on the rest (``alpha / 2`` per rate).

    With a key, the parts are a random permutation (``fold_in(key, group)``); without, the first ``fraction`` of
    each group in the given order (valid when the scores are i.i.d. in that order).

    Attributes:
      fraction: share of each group's scores used for selection, in ``(0, 1)`` (default 0.5).
    """

    fraction: float = 0.5


@dataclasses.dataclass(frozen=True)
class Bonferroni:
    """A grid of thresholds fixed before seeing the scores.

    Every threshold is evaluated on all scores at ``alpha / (2 G)`` per rate and the best is reported (a union bound
    over the ``2 G`` events).

    Attributes:
      thresholds: the ``G`` thresholds (non-empty, finite).
    """

    thresholds: tuple[float, ...]


@dataclasses.dataclass(frozen=True)
class Explicit:
    """One threshold chosen before the data (``alpha / 2`` per rate).

    Attributes:
      threshold: the threshold (finite).
    """

    threshold: float


@dataclasses.dataclass(frozen=True)
class ThresholdTest:
    """The test "member iff score >= threshold" and its evaluation bounds.

    Attributes:
      rule: the rule's name (``"split"``, ``"bonferroni"``, ``"explicit"``).
      threshold: the chosen threshold.
      tpr: the Clopper-Pearson lower bound on the TPR, on the evaluation scores.
      fpr: the Clopper-Pearson upper bound on the FPR, on the evaluation scores.
      alpha_per_rate: failure probability spent on each of the two rates.
      grid_size: thresholds covered by the correction (1 for split / explicit).
      n_selection: ``(members, non-members)`` used to choose (split), else ``(0, 0)``.
    """

    rule: str
    threshold: float
    tpr: RateBound
    fpr: RateBound
    alpha_per_rate: float
    grid_size: int
    n_selection: tuple[int, int]


def _at_least(sorted_scores: np.ndarray, thresholds: np.ndarray) -> np.ndarray:
    """``#(score >= t)`` for each threshold."""
    return len(sorted_scores) - np.searchsorted(sorted_scores, thresholds, side="left")


def _scores(name: str, value, minimum: int) -> np.ndarray:
    arr = validate.finite_array(name, value)
    if arr.ndim != 1:
        raise InputError(f"{name} must be 1-dimensional, got shape {arr.shape}")
    if len(arr) < minimum:
        raise InputError(f"{name} must hold at least {minimum} scores, got {len(arr)}")
    return arr


def threshold_test(member_scores, nonmember_scores, rule, *, delta: float, alpha: float, estimator: str = "std",
                   key=None) -> ThresholdTest:
    """Chooses and bounds the test "member iff score >= threshold" as ``rule`` says.

    Args:
      member_scores: ``(n1,)`` scores under "canary present" (higher = present).
      nonmember_scores: ``(n0,)`` scores under "canary absent".
      rule: :class:`Split`, :class:`Bonferroni` or :class:`Explicit`.
      delta: the ``delta`` of the audited claim in ``(0, 1)`` (the ``"std"`` objective).
      alpha: joint failure probability of the two reported bounds, in ``(0, 1)``.
      estimator: what the choice maximises: ``"std"`` (``eps_std``) or ``"gdp"`` (``mu_low``).
      key: PRNG key of a random :class:`Split` (optional).

    Returns:
      :class:`ThresholdTest`.

    Raises:
      InputError: scores that are not finite 1-D arrays (or fewer than 2 each for a split), an empty or non-finite
        grid or threshold, a split fraction that leaves an empty part, ``delta`` or ``alpha`` not in ``(0, 1)``, an
        unknown estimator or rule.

    Guarantees:
      For i.i.d. member scores and i.i.d. non-member scores, ``tpr.bound <= TPR`` and ``fpr.bound >= FPR`` of the
      chosen test hold jointly with probability ``>= 1 - alpha``: the split chooses on scores the bounds do not use;
      Bonferroni pays for every grid threshold.
    """
    delta = validate.open_unit("delta", delta)
    alpha = validate.open_unit("alpha", alpha)
    estimator = validate.choice("estimator", estimator, ESTIMATORS)
    if isinstance(rule, Bonferroni):
        m = _scores("member_scores", member_scores, 1)
        n = _scores("nonmember_scores", nonmember_scores, 1)
        grid = validate.finite_array("thresholds", rule.thresholds)
        if grid.ndim != 1 or grid.size == 0:
            raise InputError(f"thresholds must be a non-empty 1-D grid, got shape {grid.shape}")
        a = alpha / (2 * grid.size)
        k1, k0 = _at_least(np.sort(m), grid), _at_least(np.sort(n), grid)
        tl, tl_c = binomial_pair(k1, m.size, "lower", a)
        fu, fu_c = binomial_pair(k0, n.size, "upper", a)
        i = select_index(objective(tl, tl_c, fu, fu_c, estimator, delta), k1 / m.size - k0 / n.size)
        return ThresholdTest("bonferroni", float(grid[i]), binomial_bound(k1[i], m.size, "lower", a),
                             binomial_bound(k0[i], n.size, "upper", a), a, int(grid.size), (0, 0))
    if isinstance(rule, Explicit):
        m = _scores("member_scores", member_scores, 1)
        n = _scores("nonmember_scores", nonmember_scores, 1)
        t = validate.finite_array("threshold", [rule.threshold])[0]
        k1, k0 = int(np.sum(m >= t)), int(np.sum(n >= t))
        return ThresholdTest("explicit", float(t), binomial_bound(k1, m.size, "lower", alpha / 2),
                             binomial_bound(k0, n.size, "upper", alpha / 2), alpha / 2, 1, (0, 0))
    if not isinstance(rule, Split):
        raise InputError(f"rule must be Split, Bonferroni or Explicit for scores, got {rule!r}")
    m = _scores("member_scores", member_scores, 2)
    n = _scores("nonmember_scores", nonmember_scores, 2)
    fraction = validate.open_unit("selection_fraction", rule.fraction)
    parts = []
    for i, (name, s) in enumerate((("member_scores", m), ("nonmember_scores", n))):
        cut = int(round(fraction * len(s))) if key is not None else int(math.floor(fraction * len(s)))
        if not 0 < cut < len(s):
            raise InputError(f"selection_fraction={fraction} leaves an empty selection or evaluation part of "
                             f"{name} ({len(s)} scores)")
        if key is not None:
            import jax

            perm = np.asarray(jax.random.permutation(jax.random.fold_in(key, i), len(s)))
            s = s[perm]
        parts.append((np.sort(s[:cut]), s[cut:]))
    (m_sel, m_ev), (n_sel, n_ev) = parts
    candidates = np.unique(np.concatenate([m_sel, n_sel]))
    k1s, k0s = _at_least(m_sel, candidates), _at_least(n_sel, candidates)
    tl, tl_c = binomial_pair(k1s, m_sel.size, "lower", alpha / 2)
    fu, fu_c = binomial_pair(k0s, n_sel.size, "upper", alpha / 2)
    i = select_index(objective(tl, tl_c, fu, fu_c, estimator, delta), k1s / m_sel.size - k0s / n_sel.size)
    t = float(candidates[i])
    k1, k0 = int(np.sum(m_ev >= t)), int(np.sum(n_ev >= t))
    return ThresholdTest("split", t, binomial_bound(k1, m_ev.size, "lower", alpha / 2),
                         binomial_bound(k0, n_ev.size, "upper", alpha / 2), alpha / 2, 1, (m_sel.size, n_sel.size))
