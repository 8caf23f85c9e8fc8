"""Several claims at once: violation p-values and Holm's step-down procedure."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from snapaudit_jax.estimation.estimators import VIOLATION_RTOL, estimate, is_violation
from snapaudit_jax.estimation.rates import RateBound, rebound
from snapaudit_jax.utils import validate

__all__ = ["holm", "mu_violation_p_value", "violation_p_value"]

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

    A valid p-value for the null "the release is ``(epsilon_theory, delta)``-DP": under it, the event "``eps_emp``
    at level ``alpha`` exceeds ``epsilon_theory``" implies a failed bound, which has probability ``<= alpha``.
    ``eps_emp`` is ``eps_std``, or ``max(eps_std, eps_gdp)`` for a release that is Gaussian by construction. Exact
    rates give 0 (violated) or 1. Found by bisection (monotone in ``alpha``).

    Args:
      tpr: the TPR lower bound (re-derived at each ``alpha / 2`` by :func:`rebound`).
      fpr: the FPR upper bound.
      delta: the claim's ``delta`` in ``(0, 1)``.
      epsilon_theory: the claimed ``eps``.
      gaussian_by_construction: the release's trade-off curve is exactly Gaussian (the GDP conversion counts).

    Returns:
      The p-value in ``[0, 1]``.
    """
    def violated(t, f):
        eps_std, _, eps_gdp = estimate(t, f, delta)
        return is_violation(max(eps_std, eps_gdp) if gaussian_by_construction else eps_std, epsilon_theory)

    return _p_value(tpr, fpr, violated)


def mu_violation_p_value(tpr: RateBound, fpr: RateBound, mu_claim: float) -> float:
    """Smallest ``alpha`` at which the bounds certify ``mu_low > mu_claim`` (a p-value for the ``mu``-GDP claim).

    Args:
      tpr: the TPR lower bound.
      fpr: the FPR upper bound.
      mu_claim: the claimed ``mu``.

    Returns:
      The p-value in ``[0, 1]``.
    """
    return _p_value(tpr, fpr, lambda t, f: estimate(t, f, 0.5)[1] > mu_claim * (1.0 + VIOLATION_RTOL))


def holm(p_values: Sequence[float], alpha: float) -> np.ndarray:
    """Holm's step-down rejections at family-wise error ``alpha`` (Holm 1979).

    Args:
      p_values: ``(m,)`` p-values, one per hypothesis.
      alpha: family-wise error rate in ``(0, 1)``.

    Returns:
      ``(m,)`` bool, ``True`` where the hypothesis is rejected.

    Raises:
      InputError: ``alpha`` not in ``(0, 1)``.
    """
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
