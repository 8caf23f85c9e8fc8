"""The estimation layer: rate bounds -> decision rules -> estimators -> one :class:`AuditResult`.

Every audit of the engine -- the active snapshot audit (:func:`snapaudit_jax.audits.active`), the passive
end-to-end baseline (:func:`snapaudit_jax.passive_audit`) and the DP-SGD canary audit
(:mod:`attacks.canary`) -- goes through this module, in four steps:

1. **Rate bounds** (:class:`RateBound`): one-sided bounds on a success rate -- exact Clopper-Pearson
   (i.i.d. trials), one-sided empirical Bernstein (Maurer & Pontil 2009; i.i.d. per-snapshot rates in
   ``[0, 1]``), exact rates (no error), or SnapAudit's App. C.2 radius (a heuristic, see
   :func:`paper_bound`). :func:`rebound` re-derives a bound at another failure probability from the
   same sufficient statistics (family-wise corrections).
2. **Decision rules as frozen values**, interpreted by :func:`threshold_test`: :class:`Split` (choose on
   one part, evaluate on the other),
   :class:`Bonferroni` (a grid fixed in advance, every threshold evaluated at ``alpha / (2 G)`` per
   rate) and :class:`Explicit` (a threshold chosen before the data).
3. **Estimators** (:func:`estimate`): the assumption-free ``(eps, delta)`` bound ``eps_std`` (both
   hypothesis-testing inequalities of DP on ``(TPR_low, FPR_up)``: Kairouz et al. 2015), the GDP
   bound ``mu_low`` (valid for any ``mu``-GDP claim) and the ``eps(delta)`` of the Gaussian envelope
   ``G_{mu_low}`` -- which bounds the release's ``eps`` only when its trade-off curve *is* Gaussian.
4. **One result factory** (:func:`audit_result`) that decides what ``epsilon_emp`` is, when
   ``violation`` may be set (only from assumption-free estimates, never from a heuristic) and which
   assumptions the result states.

One-run audits (many canaries with their own coins, one run of the mechanism; Steinke, Nasr, Jagielski 2023)
are the same layer's :mod:`snapaudit_jax.estimation.one_run`, re-exported here: :func:`one_run_audit` with the rule
values :class:`DeclaredGrid` and :class:`HeldOut`.

Claims and their flags:

* the ``(eps, delta)`` claim: ``violation`` iff ``epsilon_emp > epsilon_theory`` (1e-6 relative
  tolerance), where ``epsilon_emp`` is assumption-free (``eps_std``, or an exact privacy profile),
  or the envelope ``eps`` where the release is Gaussian by construction;
* the ``mu``-GDP claim (Gaussian mechanisms, ``mu_claim = sensitivity / sigma``): ``mu_violation``
  iff ``mu_low > mu_claim``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy import stats

from snapaudit_jax.estimation.bounds import (
    clopper_pearson_lower,
    clopper_pearson_upper,
    empirical_bernstein_radius,
    hoeffding_radius,
)
from snapaudit_jax.estimation.estimators import epsilon_gdp, epsilon_std, mu_lower
from snapaudit_jax.estimation.one_run import DeclaredGrid, HeldOut, OneRunResult, one_run_audit
from snapaudit_jax.utils import validate
from snapaudit_jax.utils.errors import InputError
from snapaudit_jax.utils.io import dumps, to_json

__all__ = [
    "AuditResult",
    "Bonferroni",
    "DeclaredGrid",
    "HeldOut",
    "OneRunResult",
    "one_run_audit",
    "DEFAULT_ESTIMATOR",
    "ESTIMATORS",
    "Explicit",
    "RateBound",
    "Split",
    "ThresholdTest",
    "TradeoffCurve",
    "VIOLATION_RTOL",
    "audit_result",
    "bernstein_bound",
    "binomial_bound",
    "binomial_pair",
    "certified_curve",
    "check_estimator",
    "claimed_tradeoff",
    "estimate",
    "exact_rate",
    "holm",
    "is_violation",
    "objective",
    "paper_bound",
    "rebound",
    "roc_auc",
    "select_index",
    "threshold_test",
    "violation_p_value",
    "clopper_pearson_lower",
    "clopper_pearson_upper",
    "empirical_bernstein_radius",
    "hoeffding_radius",
    "epsilon_std",
    "epsilon_gdp",
    "mu_lower",
]

ESTIMATORS = ("std", "gdp")
DEFAULT_ESTIMATOR = "std"
VIOLATION_RTOL = 1e-6

ASSUMPTION_FREE = "epsilon_emp is the standard estimator on (TPR_low, FPR_up): it needs no further assumption."


# ---------------------------------------------------------------------------
# Rate bounds
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RateBound:
    """A one-sided bound on one success rate (TPR: lower, FPR: upper).

    Attributes:
      estimate: point estimate of the rate.
      bound: the one-sided confidence bound.
      complement: ``1 - bound``, computed without cancellation.
      variance: variance entering the Bernstein term (``nan`` if none).
      variance_term / range_term / monte_carlo_term: parts of the radius
        (``bound = estimate -/+ sum of parts``, clipped to ``[0, 1]``) or,
        for Clopper-Pearson, ``monte_carlo_term = |bound - estimate|``.
      trials: evaluation trials (0 for exact rates).
      snapshots: evaluation snapshots.
      failure_probability: failure probability spent on this rate.
      kind: ``"clopper-pearson"``, ``"bernstein"``, ``"exact"`` or ``"paper"``.
      side: ``"lower"`` or ``"upper"``.
      hits: successes (Clopper-Pearson), else ``None``.
      estimate_complement: ``1 - estimate`` computed directly.
    """

    estimate: float
    bound: float
    complement: float
    variance: float
    variance_term: float
    range_term: float
    monte_carlo_term: float
    trials: int
    snapshots: int
    failure_probability: float
    kind: str = "clopper-pearson"
    side: str = "lower"
    hits: int | None = None
    estimate_complement: float = math.nan


def binomial_pair(hits, trials, side: str, alpha):
    """Vectorised Clopper-Pearson ``(bound, 1 - bound)``, the complement exact by Beta symmetry.

    ``1 - CP_lower(k, n) = CP_upper(n - k, n)`` and vice versa (relabel the outcomes).
    """
    k = np.asarray(hits, np.float64)
    n = np.asarray(trials, np.float64)
    if side == "lower":
        return clopper_pearson_lower(k, n, alpha), clopper_pearson_upper(n - k, n, alpha)
    return clopper_pearson_upper(k, n, alpha), clopper_pearson_lower(n - k, n, alpha)


def binomial_bound(hits: int, trials: int, side: str, alpha: float, *, snapshots: int | None = None) -> RateBound:
    """Exact one-sided Clopper-Pearson bound from ``hits`` successes in ``trials`` i.i.d. trials.

    Guarantees:
      ``P(bound > rate) <= alpha`` (lower side) for every rate and ``trials``.
    """
    hits, trials = int(hits), int(trials)
    if trials < 1 or not 0 <= hits <= trials:
        raise InputError(f"hits must be in [0, trials] with trials >= 1, got hits={hits}, trials={trials}")
    bound, complement = (float(x) for x in binomial_pair(hits, trials, side, alpha))
    est = hits / trials
    return RateBound(est, bound, complement, math.nan, 0.0, 0.0, abs(bound - est), trials,
                     trials if snapshots is None else int(snapshots), float(alpha), "clopper-pearson", side, hits,
                     (trials - hits) / trials)


def _sample_variance(x: np.ndarray) -> float:
    """Unbiased sample variance; exactly 0 for constant samples (no rounding residue)."""
    return float(np.var(x, ddof=1)) if np.ptp(x) > 0 else 0.0


def _bernstein_parts(variance: float, n: int, alpha: float) -> tuple[float, float]:
    # Maurer & Pontil 2009, Thm. 4 (one-sided).
    log_term = math.log(2.0 / alpha)
    return math.sqrt(2.0 * max(variance, 0.0) * log_term / n), 7.0 * log_term / (3.0 * (n - 1))


def _finish(estimate, estimate_complement, parts, side, **kw) -> RateBound:
    radius = sum(parts)
    if side == "lower":
        bound, complement = max(0.0, estimate - radius), min(1.0, estimate_complement + radius)
    else:
        bound, complement = min(1.0, estimate + radius), max(0.0, estimate_complement - radius)
    var_term, range_term, mc_term = parts
    return RateBound(float(estimate), float(bound), float(complement), variance_term=float(var_term),
                     range_term=float(range_term), monte_carlo_term=float(mc_term), side=side,
                     estimate_complement=float(estimate_complement), **kw)


def bernstein_bound(rates, rate_complements, side: str, alpha: float, *, trials: int = 0) -> RateBound:
    """One-sided empirical Bernstein bound on the mean of i.i.d. per-snapshot rates in ``[0, 1]``.

    Args:
      rates: ``(n,)`` per-snapshot success rates (simulated ``hits / trials`` with equal trials, or exact).
      rate_complements: ``(n,)`` ``1 - rates`` computed directly.
      side: ``"lower"`` or ``"upper"``.
      alpha: failure probability of this bound.
      trials: simulated trials behind the rates (0 for exact rates), recorded only.

    Guarantees:
      With probability ``>= 1 - alpha`` the mean of the rates' distribution is on the bounded side
      (Maurer & Pontil 2009, Thm. 4), for ``n >= 2``.
    """
    r = np.asarray(rates, np.float64)
    n = r.size
    if n < 2:
        raise InputError(f"the empirical Bernstein bound needs at least 2 snapshots, got {n}")
    var = _sample_variance(r)
    var_term, range_term = _bernstein_parts(var, n, alpha)
    return _finish(float(r.mean()), float(np.mean(rate_complements)), (var_term, range_term, 0.0), side,
                   variance=var, trials=int(trials), snapshots=n, failure_probability=float(alpha), kind="bernstein")


def exact_rate(p, q) -> RateBound:
    """The exact rate ``mean(p)`` (and ``mean(q) = 1 - mean(p)``): no statistical error."""
    p, q = np.asarray(p, np.float64), np.asarray(q, np.float64)
    est, est_c = float(np.mean(p)), float(np.mean(q))
    return RateBound(est, est, est_c, 0.0, 0.0, 0.0, 0.0, 0, p.size, 0.0, "exact", "lower", None, est_c)


def paper_bound(per_snapshot_rates, estimate: float, estimate_complement: float, trials: int, side: str,
                alpha: float) -> RateBound:
    """SnapAudit App. C.2: Bernstein over snapshots + two-sided Hoeffding over ``trials`` (a heuristic).

    The variance is the plug-in variance of *simulated* per-snapshot rates, not of the true ``h_b``;
    Maurer-Pontil's theorem does not cover that plug-in, so this radius is the paper's heuristic and
    :func:`audit_result` never sets a violation from it. It is exact only when all snapshots of a
    hypothesis are identical (then the variance is 0).
    """
    r = np.asarray(per_snapshot_rates, np.float64)
    var = _sample_variance(r)
    var_term, range_term = _bernstein_parts(var, r.size, alpha)
    mc_term = float(hoeffding_radius(trials, alpha, two_sided=True))
    return _finish(float(estimate), float(estimate_complement), (var_term, range_term, mc_term), side, variance=var,
                   trials=int(trials), snapshots=r.size, failure_probability=float(alpha), kind="paper")


def rebound(rate: RateBound, alpha: float) -> RateBound:
    """The same bound from the same sufficient statistics at failure probability ``alpha``."""
    if rate.kind == "exact":
        return rate
    if rate.kind == "clopper-pearson":
        return binomial_bound(rate.hits, rate.trials, rate.side, alpha, snapshots=rate.snapshots)
    var_term, range_term = _bernstein_parts(rate.variance, rate.snapshots, alpha)
    mc_term = float(hoeffding_radius(rate.trials, alpha, two_sided=True)) if rate.kind == "paper" else 0.0
    return _finish(rate.estimate, rate.estimate_complement, (var_term, range_term, mc_term), rate.side,
                   variance=rate.variance, trials=rate.trials, snapshots=rate.snapshots,
                   failure_probability=float(alpha), kind=rate.kind)


# ---------------------------------------------------------------------------
# Estimators
# ---------------------------------------------------------------------------


def estimate(tpr: RateBound, fpr: RateBound, delta: float) -> tuple[float, float, float]:
    """``(eps_std, mu_low, eps_gdp_envelope)`` from a TPR lower and an FPR upper bound.

    Guarantees:
      If both bounds hold: ``eps_std`` is below the ``eps`` of every ``(eps, delta)`` guarantee of the
      release (assumption-free); ``mu_low`` is below the ``mu`` of every ``mu``-GDP guarantee;
      ``eps_gdp_envelope = eps(delta)`` of ``G_{mu_low}`` bounds the release's ``eps`` only if its
      trade-off curve equals ``G_mu`` for some ``mu`` (post-processing keeps ``f >= G_mu`` with a
      smaller ``eps(delta)``).
    """
    kw = dict(tpr_low_complement=tpr.complement, fpr_up_complement=fpr.complement)
    return (float(epsilon_std(tpr.bound, fpr.bound, delta, **kw)), float(mu_lower(tpr.bound, fpr.bound, **kw)),
            float(epsilon_gdp(tpr.bound, fpr.bound, delta, **kw)))


def check_estimator(estimator: str | None, mechanism: str, gaussian: bool) -> str:
    """The validated estimator (``None``: the default); ``"gdp"`` only for a mechanism that claims a ``mu``.

    Raises:
      ValueError: an unknown estimator, or ``"gdp"`` for a pure-epsilon mechanism (PoE, KSA).
    """
    estimator = validate.choice("estimator", DEFAULT_ESTIMATOR if estimator is None else estimator, ESTIMATORS)
    if estimator == "gdp" and not gaussian:
        raise InputError(f"estimator must be 'std' for {mechanism}: 'gdp' audits a mu-GDP claim, but {mechanism} is "
                         "a pure-epsilon mechanism that claims no mu")
    return estimator


def is_violation(epsilon_emp: float, epsilon_theory: float) -> bool:
    """``epsilon_emp > epsilon_theory`` beyond the numerical tolerance of the conversions (1e-6 relative).

    Exact audits of tight mechanisms give ``epsilon_emp == epsilon_theory`` up to root-finding error;
    that equality is not a violation.
    """
    return bool(epsilon_emp > epsilon_theory * (1.0 + VIOLATION_RTOL))


def select_index(objective: np.ndarray, youden: np.ndarray) -> int:
    """Index of the best objective; near-ties (GDP is flat in the threshold for Gaussian scores) go to
    the entry with the largest TPR - FPR rather than to an extreme of the grid."""
    objective = np.asarray(objective, np.float64)
    best = float(np.max(objective))
    if not np.isfinite(best):
        return int(np.argmax(objective))
    ties = objective >= best - 1e-9 * max(1.0, abs(best))
    return int(np.argmax(np.where(ties, youden, -np.inf)))


def objective(tpr_low, tpr_low_c, fpr_up, fpr_up_c, estimator: str, delta: float) -> np.ndarray:
    """The quantity a decision rule is chosen to maximise: ``eps_std`` (``"std"``) or ``mu_low`` (``"gdp"``)."""
    kw = dict(tpr_low_complement=np.clip(tpr_low_c, 0.0, 1.0), fpr_up_complement=np.clip(fpr_up_c, 0.0, 1.0))
    tl, fu = np.clip(tpr_low, 0.0, 1.0), np.clip(fpr_up, 0.0, 1.0)
    if estimator == "gdp":
        return np.atleast_1d(np.asarray(mu_lower(tl, fu, **kw), np.float64))
    return np.atleast_1d(np.asarray(epsilon_std(tl, fu, delta, **kw), np.float64))


# ---------------------------------------------------------------------------
# Decision rules (frozen values) and their interpreter
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Split:
    """Choose the threshold on a ``fraction`` of each group, evaluate it on the rest (``alpha / 2`` per rate).

    With a key, the parts are a random permutation (``fold_in(key, group)``); without, the first
    ``fraction`` of each group in the given order (valid when the scores are i.i.d. in that order).
    """

    fraction: float = 0.5


@dataclasses.dataclass(frozen=True)
class Bonferroni:
    """A grid of thresholds fixed before seeing the scores; every one is evaluated on all scores at
    ``alpha / (2 G)`` per rate and the best is reported (a union bound over the ``2 G`` events)."""

    thresholds: tuple[float, ...]


@dataclasses.dataclass(frozen=True)
class Explicit:
    """One threshold chosen before the data (``alpha / 2`` per rate)."""

    threshold: float


@dataclasses.dataclass(frozen=True)
class ThresholdTest:
    """The test "member iff score >= threshold" and its evaluation bounds.

    Attributes:
      rule: the rule's name (``"split"``, ``"bonferroni"``, ``"explicit"``).
      threshold: the chosen threshold.
      tpr / fpr: the evaluation bounds (Clopper-Pearson).
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
      delta: the ``delta`` of the audited claim (the ``"std"`` objective).
      alpha: joint failure probability of the two reported bounds.
      estimator: what the choice maximises: ``"std"`` (``eps_std``) or ``"gdp"`` (``mu_low``).
      key: PRNG key of a random :class:`Split` (optional).

    Returns:
      :class:`ThresholdTest`.

    Guarantees:
      For i.i.d. member scores and i.i.d. non-member scores, ``tpr.bound <= TPR`` and
      ``fpr.bound >= FPR`` of the chosen test hold jointly with probability ``>= 1 - alpha``: the
      split chooses on scores the bounds do not use; Bonferroni pays for every grid threshold.
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


# ---------------------------------------------------------------------------
# Trade-off curves (f-DP)
# ---------------------------------------------------------------------------


def claimed_tradeoff(epsilon: float, delta: float, x) -> np.ndarray:
    """The trade-off curve ``f_{eps, delta}(x) = max(0, 1 - delta - e^eps x, e^-eps (1 - delta - x))``."""
    x = np.asarray(x, np.float64)
    return np.maximum.reduce([np.zeros_like(x), 1.0 - delta - math.exp(epsilon) * x,
                              math.exp(-epsilon) * (1.0 - delta - x)])


@dataclasses.dataclass(frozen=True)
class TradeoffCurve:
    """A certified upper bound on the release's trade-off curve at grid points fixed before evaluation.

    For each threshold ``tau_i``: ``FPR(tau_i) <= fpr_up[i]`` and ``TPR(tau_i) >= tpr_low[i]``, all
    simultaneously with the audit's confidence (Bonferroni over the ``2 G`` rates, or exact rates). So
    the release's trade-off curve ``T`` satisfies ``T(x) <= 1 - tpr_low[i]`` for every ``x >= fpr_up[i]``:
    any claimed curve above that step function somewhere is refuted.

    Attributes:
      thresholds: ``(G,)`` the grid (fixed on selection data or a priori).
      fpr_up, tpr_low: ``(G,)`` bounds; ``fpr_up_complement``, ``tpr_low_complement`` their complements.
      alpha_per_rate: failure probability of each of the ``2 G`` bounds.
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
        return to_json(dataclasses.asdict(self))


def certified_curve(thresholds, tpr_low, tpr_low_c, fpr_up, fpr_up_c, *, delta: float, alpha_per_rate: float,
                    exact: bool) -> TradeoffCurve:
    """Builds a :class:`TradeoffCurve` from simultaneous bounds at every grid threshold."""
    eps = objective(tpr_low, tpr_low_c, fpr_up, fpr_up_c, "std", delta)
    best = int(np.argmax(eps))
    def tup(a):
        return tuple(float(v) for v in np.atleast_1d(a))

    return TradeoffCurve(tup(thresholds), tup(fpr_up), tup(tpr_low), tup(fpr_up_c), tup(tpr_low_c),
                         float(alpha_per_rate), float(eps[best]), best, bool(exact))


# ---------------------------------------------------------------------------
# Several claims: Holm
# ---------------------------------------------------------------------------


def _p_value(tpr: RateBound, fpr: RateBound, violated_at) -> float:
    """Smallest ``alpha`` with ``violated_at(rebound(tpr, alpha/2), rebound(fpr, alpha/2))`` (bisection)."""
    def violated(a: float) -> bool:
        return bool(violated_at(rebound(tpr, a / 2), rebound(fpr, a / 2)))

    if tpr.kind == "exact" and fpr.kind == "exact":
        return 0.0 if violated(0.5) else 1.0
    if not violated(1.0 - 1e-12):
        return 1.0
    lo, hi = -300.0, 0.0  # log10(alpha)
    if violated(10.0 ** lo):
        return 0.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if violated(10.0 ** mid):
            hi = mid
        else:
            lo = mid
    return float(min(1.0, 10.0 ** hi))


def violation_p_value(tpr: RateBound, fpr: RateBound, delta: float, epsilon_theory: float, *,
                      gaussian_by_construction: bool = False) -> float:
    """Smallest ``alpha`` at which the bounds (``alpha / 2`` each) certify ``eps_emp > epsilon_theory``.

    A valid p-value for the null "the release is ``(epsilon_theory, delta)``-DP": under it, the
    event "``eps_emp`` at level ``alpha`` exceeds ``epsilon_theory``" implies a failed bound, which has
    probability ``<= alpha``. ``eps_emp`` is ``eps_std``, or ``max(eps_std, eps_gdp)`` for a release that
    is Gaussian by construction. Exact rates give 0 (violated) or 1. Found by bisection (monotone in ``alpha``).
    """
    def violated(t, f):
        eps_std, _, eps_gdp = estimate(t, f, delta)
        return is_violation(max(eps_std, eps_gdp) if gaussian_by_construction else eps_std, epsilon_theory)

    return _p_value(tpr, fpr, violated)


def mu_violation_p_value(tpr: RateBound, fpr: RateBound, mu_claim: float) -> float:
    """Smallest ``alpha`` at which the bounds certify ``mu_low > mu_claim`` (a p-value for the ``mu``-GDP claim)."""
    return _p_value(tpr, fpr, lambda t, f: estimate(t, f, 0.5)[1] > mu_claim * (1.0 + VIOLATION_RTOL))


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
      ValueError: an empty, non-finite or not 1-dimensional score array (naming it).

    References:
      Mann & Whitney, Ann. Math. Statist. 18 (1947); Hanley & McNeil, Radiology 143 (1982), eq. 1.
    """
    m = _score_vector("member_scores", member_scores)
    n = _score_vector("nonmember_scores", nonmember_scores)
    ranks = stats.rankdata(np.concatenate([m, n]), method="average")
    u = ranks[: len(m)].sum() - len(m) * (len(m) + 1) / 2.0
    return float(u / (len(m) * len(n)))


def holm(p_values: Sequence[float], alpha: float) -> np.ndarray:
    """Holm's step-down rejections at family-wise error ``alpha`` (Holm 1979)."""
    p = np.asarray(p_values, np.float64)
    alpha = validate.open_unit("alpha", alpha)
    order = np.argsort(p, kind="stable")
    reject = np.zeros(p.size, bool)
    for rank, i in enumerate(order):
        if p[i] <= alpha / (p.size - rank):
            reject[i] = True
        else:
            break
    return reject


# ---------------------------------------------------------------------------
# The result
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class AuditResult:
    """Immutable, JSON-serialisable result of one audit (one ``eps_theory``).

    ``epsilon_emp`` is the ``(eps, delta)`` lower bound that ``violation`` is decided from: the
    assumption-free standard estimator, an exact privacy profile (``method="exact"``, fixed clean
    outputs), or -- only where the release's trade-off curve is Gaussian by construction -- the GDP
    conversion. ``epsilon_gdp`` is always the ``eps(delta)`` of the envelope ``G_{mu_emp}``
    (``epsilon_gdp_label`` says whether it bounds the release). ``mu_claim`` / ``mu_violation`` test
    the ``mu``-GDP claim of a Gaussian mechanism; ``heuristic`` marks SnapAudit's App. C.2 radius,
    which never sets a violation.
    """

    mechanism: str
    threat: str
    method: str
    estimator: str
    clean: str
    epsilon_theory: float
    delta: float
    epsilon_emp: float
    epsilon_std: float
    epsilon_gdp: float
    mu_emp: float
    tpr_hat: float
    fpr_hat: float
    tpr_low: float
    fpr_up: float
    violation: bool
    trials: int
    selection_trials: int
    snapshots: int
    selection_snapshots: int
    confidence: float
    target: int | None
    threshold: float | None
    tpr: RateBound
    fpr: RateBound
    noise: dict
    assumptions: str
    warnings: tuple[str, ...]
    seed: int | None
    seconds: float
    mu_claim: float | None = None
    mu_violation: bool = False
    epsilon_gdp_label: str = ""
    epsilon_profile: float | None = None
    epsilon_curve: float | None = None
    curve: dict | None = None
    heuristic: bool = False
    gaussian_by_construction: bool = False
    violation_p_value: float | None = None
    familywise_violation: bool | None = None
    mu_violation_p_value: float | None = None
    mu_familywise_violation: bool | None = None
    stream: int = 0

    def to_dict(self) -> dict[str, Any]:
        """Every field in strict-JSON form (:func:`~snapaudit_jax.utils.io.to_json`: non-finite numbers ``None``)."""
        return to_json(dataclasses.asdict(self))

    def to_json(self, **kwargs) -> str:
        """:meth:`to_dict` as a JSON string; ``kwargs`` go to :func:`json.dumps`."""
        return dumps(self.to_dict(), **kwargs)

    def summary(self) -> dict[str, Any]:
        """The fields of the command-line JSON contract."""
        d = self.to_dict()
        keys = (
            "mechanism", "threat", "method", "estimator", "epsilon_theory", "delta", "epsilon_emp", "mu_emp",
            "tpr_hat", "fpr_hat", "tpr_low", "fpr_up", "trials", "snapshots", "confidence", "violation", "seconds",
        )
        return {k: d[k] for k in keys}


GDP_ENVELOPE_LABEL = ("eps(delta) of the Gaussian envelope G_mu_emp: bounds the release's eps only if its trade-off "
                      "curve is Gaussian; never used for the (eps, delta) violation")
GDP_BY_CONSTRUCTION_LABEL = ("eps(delta) of G_mu_emp: a valid (eps, delta) lower bound here, since the release (the "
                             "whole Gaussian-noised vector, fixed clean outputs) has a Gaussian trade-off curve and "
                             "the white-box score is its likelihood-ratio statistic")


def audit_result(*, mechanism: str, threat: str, method: str, estimator: str, clean: str, epsilon_theory: float,
                 delta: float, tpr: RateBound, fpr: RateBound, confidence: float, assumptions: Sequence[str],
                 trials: int, selection_trials: int = 0, snapshots: int = 0, selection_snapshots: int = 0,
                 target: int | None = None, threshold: float | None = None, noise: dict | None = None,
                 warnings: Sequence[str] = (), seed: int | None = None, seconds: float = 0.0,
                 mu_claim: float | None = None, gaussian_by_construction: bool = False,
                 epsilon_profile: float | None = None, curve: TradeoffCurve | None = None,
                 heuristic: bool = False, stream: int = 0) -> AuditResult:
    """The one :class:`AuditResult` factory: estimates, the headline bound, the flags and the assumptions.

    Args:
      tpr / fpr: the bounds of the pre-selected decision rule (joint confidence ``confidence``).
      assumptions: sentences on how the bounds were obtained (the estimator's sentence is appended).
      mu_claim: the ``mu`` the calibration implies (Gaussian mechanisms), tested when ``estimator="gdp"``.
      gaussian_by_construction: the release's trade-off curve is exactly Gaussian for this pair.
      epsilon_profile: the exact ``eps(delta)`` of the release (exact rates only): the headline then.
      curve: a certified trade-off curve (reported; its ``epsilon`` holds at ``confidence`` on its own).
      heuristic: the bounds come from :func:`paper_bound`: never a violation.
      Other arguments are recorded as given.

    Returns:
      :class:`AuditResult`.
    """
    estimator = validate.choice("estimator", estimator, ESTIMATORS)
    eps_std, mu, eps_gdp = estimate(tpr, fpr, delta)
    headline = eps_std
    parts = list(assumptions)
    if epsilon_profile is not None:
        headline = max(headline, float(epsilon_profile))
        parts.append("epsilon_emp is the exact privacy profile eps(delta) of the release for the audited pair "
                     "(fixed clean outputs, exact output probabilities).")
    elif estimator == "gdp" and gaussian_by_construction:
        headline = max(headline, eps_gdp)
        parts.append("epsilon_emp also uses the GDP conversion, valid here: " + GDP_BY_CONSTRUCTION_LABEL + ".")
    elif heuristic:
        parts.append("epsilon_emp applies the standard estimator to the heuristic radius.")
    else:
        parts.append(ASSUMPTION_FREE)
    label = GDP_BY_CONSTRUCTION_LABEL if gaussian_by_construction else GDP_ENVELOPE_LABEL
    if estimator == "gdp":
        parts.append(
            "estimator=gdp audits the mu-GDP claim: mu_emp is a valid lower bound on the mu of any mu-GDP guarantee"
            + (f" and is tested against mu_claim = sensitivity / sigma = {mu_claim:.6g}" if mu_claim is not None
               else "") + "; epsilon_gdp is the envelope's eps.")
    if heuristic:
        parts.insert(0, "HEURISTIC (SnapAudit App. C.2): not a certified bound; no violation is flagged from it.")
    mu_violation = bool(estimator == "gdp" and mu_claim is not None and not heuristic
                        and mu > mu_claim * (1.0 + VIOLATION_RTOL))
    return AuditResult(
        mechanism=mechanism, threat=threat, method=method, estimator=estimator, clean=clean,
        epsilon_theory=float(epsilon_theory), delta=float(delta), epsilon_emp=float(headline), epsilon_std=eps_std,
        epsilon_gdp=eps_gdp, mu_emp=mu, tpr_hat=tpr.estimate, fpr_hat=fpr.estimate, tpr_low=tpr.bound,
        fpr_up=fpr.bound, violation=(not heuristic) and is_violation(headline, epsilon_theory), trials=int(trials),
        selection_trials=int(selection_trials), snapshots=int(snapshots), selection_snapshots=int(selection_snapshots),
        confidence=float(confidence), target=target, threshold=threshold, tpr=tpr, fpr=fpr, noise=dict(noise or {}),
        assumptions=" ".join(parts), warnings=tuple(warnings), seed=seed, seconds=float(seconds),
        mu_claim=None if mu_claim is None else float(mu_claim), mu_violation=mu_violation, epsilon_gdp_label=label,
        epsilon_profile=None if epsilon_profile is None else float(epsilon_profile),
        epsilon_curve=None if curve is None else curve.epsilon, curve=None if curve is None else curve.to_dict(),
        heuristic=bool(heuristic), gaussian_by_construction=bool(estimator == "gdp" and gaussian_by_construction),
        stream=int(stream),
    )
