"""Rate bounds as values: one-sided bounds on a success rate, and re-bounding at another failure probability."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from snapaudit_jax.estimation.bounds import (
    clopper_pearson_lower,
    clopper_pearson_upper,
    hoeffding_radius,
)
from snapaudit_jax.utils.errors import InputError

__all__ = ["RateBound", "bernstein_bound", "binomial_bound", "binomial_pair", "exact_rate", "paper_bound", "rebound"]

@dataclasses.dataclass(frozen=True)
class RateBound:
    """A one-sided confidence bound on one success rate (TPR: lower, FPR: upper).

    Attributes:
      estimate: point estimate of the rate.
      bound: the one-sided confidence bound, at failure probability ``failure_probability``.
      complement: ``1 - bound``, computed without cancellation.
      variance: variance entering the Bernstein term (``nan`` if none).
      variance_term: the Bernstein variance part of the radius.
      range_term: the Bernstein range part of the radius.
      monte_carlo_term: the Hoeffding part of the radius (``"paper"``) or, for Clopper-Pearson,
        ``|bound - estimate|``. For the Bernstein and paper kinds ``bound = estimate -/+ (sum of the three
        parts)``, clipped to ``[0, 1]``.
      trials: evaluation trials (0 for exact rates).
      snapshots: evaluation snapshots.
      failure_probability: failure probability spent on this rate (0 for exact rates).
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

    Args:
      hits: successes ``k`` (array-like).
      trials: trials ``n`` (array-like, broadcast with ``hits``).
      side: ``"lower"``, or ``"upper"`` (any other value).
      alpha: one-sided failure probability.

    Returns:
      ``(bound, complement)``, float64 arrays of the broadcast shape.
    """
    k = np.asarray(hits, np.float64)
    n = np.asarray(trials, np.float64)
    if side == "lower":
        return clopper_pearson_lower(k, n, alpha), clopper_pearson_upper(n - k, n, alpha)
    return clopper_pearson_upper(k, n, alpha), clopper_pearson_lower(n - k, n, alpha)


def binomial_bound(hits: int, trials: int, side: str, alpha: float, *, snapshots: int | None = None) -> RateBound:
    """Exact one-sided Clopper-Pearson bound from ``hits`` successes in ``trials`` i.i.d. trials.

    Args:
      hits: successes, in ``[0, trials]``.
      trials: i.i.d. trials (>= 1).
      side: ``"lower"`` (TPR) or ``"upper"`` (FPR).
      alpha: one-sided failure probability.
      snapshots: snapshots behind the trials, recorded only (default ``trials``).

    Returns:
      The :class:`RateBound` (``kind="clopper-pearson"``).

    Raises:
      InputError: ``trials < 1`` or ``hits`` outside ``[0, trials]``.

    Guarantees:
      ``P(bound > rate) <= alpha`` (lower side; ``P(bound < rate) <= alpha`` upper side) for every rate and
      ``trials``.
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

    Returns:
      The :class:`RateBound` (``kind="bernstein"``).

    Raises:
      InputError: fewer than 2 rates.

    Guarantees:
      With probability ``>= 1 - alpha`` the mean of the rates' distribution is on the bounded side (Maurer & Pontil
      2009, Thm. 4), for ``n >= 2``.
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
    """The exact rate ``mean(p)`` (and ``mean(q) = 1 - mean(p)``): no statistical error.

    Args:
      p: ``(n,)`` exact per-snapshot success probabilities.
      q: ``(n,)`` their complements ``1 - p``, computed directly.

    Returns:
      The :class:`RateBound` (``kind="exact"``, ``bound = estimate``, failure probability 0).
    """
    p, q = np.asarray(p, np.float64), np.asarray(q, np.float64)
    est, est_c = float(np.mean(p)), float(np.mean(q))
    return RateBound(est, est, est_c, 0.0, 0.0, 0.0, 0.0, 0, p.size, 0.0, "exact", "lower", None, est_c)


def paper_bound(per_snapshot_rates, estimate: float, estimate_complement: float, trials: int, side: str,
                alpha: float) -> RateBound:
    """SnapAudit App. C.2: Bernstein over snapshots + two-sided Hoeffding over ``trials`` (a heuristic).

    The variance is the plug-in variance of *simulated* per-snapshot rates, not of the true ``h_b``; Maurer-Pontil's
    theorem does not cover that plug-in, so this radius is the paper's heuristic and :func:`audit_result` never sets
    a violation from it. It is exact only when all snapshots of a hypothesis are identical (then the variance is 0).

    Args:
      per_snapshot_rates: ``(n,)`` simulated success rate of each snapshot's unit.
      estimate: the pooled success rate.
      estimate_complement: ``1 - estimate`` computed directly.
      trials: total simulated trials (the Hoeffding term's ``n``).
      side: ``"lower"`` or ``"upper"``.
      alpha: failure probability of each of the two terms.

    Returns:
      The :class:`RateBound` (``kind="paper"``).
    """
    r = np.asarray(per_snapshot_rates, np.float64)
    var = _sample_variance(r)
    var_term, range_term = _bernstein_parts(var, r.size, alpha)
    mc_term = float(hoeffding_radius(trials, alpha, two_sided=True))
    return _finish(float(estimate), float(estimate_complement), (var_term, range_term, mc_term), side, variance=var,
                   trials=int(trials), snapshots=r.size, failure_probability=float(alpha), kind="paper")


def rebound(rate: RateBound, alpha: float) -> RateBound:
    """The same bound from the same sufficient statistics at failure probability ``alpha``.

    Args:
      rate: a :class:`RateBound` of any kind.
      alpha: the new failure probability.

    Returns:
      A :class:`RateBound` at ``alpha`` (exact rates are returned unchanged).
    """
    if rate.kind == "exact":
        return rate
    if rate.kind == "clopper-pearson":
        return binomial_bound(rate.hits, rate.trials, rate.side, alpha, snapshots=rate.snapshots)
    var_term, range_term = _bernstein_parts(rate.variance, rate.snapshots, alpha)
    mc_term = float(hoeffding_radius(rate.trials, alpha, two_sided=True)) if rate.kind == "paper" else 0.0
    return _finish(rate.estimate, rate.estimate_complement, (var_term, range_term, mc_term), rate.side,
                   variance=rate.variance, trials=rate.trials, snapshots=rate.snapshots,
                   failure_probability=float(alpha), kind=rate.kind)
