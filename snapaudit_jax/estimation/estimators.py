"""Empirical privacy-loss estimators from bounds on TPR and FPR.

Given a test with ``TPR >= tpr_low`` and ``FPR <= fpr_up`` (simultaneously,
with the audit's confidence), these turn the pair into lower bounds on the
mechanism's privacy parameters: ``epsilon_std`` on ``eps`` (assumption-free),
``mu_lower`` on the ``mu`` of a ``mu``-GDP claim; ``epsilon_gdp`` is the
Gaussian envelope's ``eps`` (see its docstring). Audits use them through
:mod:`snapaudit_jax.estimation`.
"""

from __future__ import annotations

import numpy as np
from scipy import special

from snapaudit_jax.mechanisms.noise import gdp_epsilon
from snapaudit_jax.estimation.rates import RateBound
from snapaudit_jax.utils import validate
from snapaudit_jax.utils.errors import InputError

__all__ = ["ASSUMPTION_FREE", "DEFAULT_ESTIMATOR", "ESTIMATORS", "VIOLATION_RTOL", "check_estimator", "epsilon_gdp",
           "epsilon_std", "estimate", "is_violation", "mu_lower", "objective", "select_index"]


# Rates are handled as (rate, 1 - rate) pairs so that rates within 1e-16 of 1
# keep their precision. A TPR complement below _TINY or an FPR below _TINY is
# rounded up to it, which is conservative (it lowers the bound).
_TINY = float(np.finfo(np.float64).smallest_subnormal)


def _pairs(tpr_low, fpr_up, tpr_low_complement, fpr_up_complement):
    tpr = np.clip(np.asarray(tpr_low, dtype=np.float64), 0.0, 1.0)
    fpr = np.clip(np.asarray(fpr_up, dtype=np.float64), 0.0, 1.0)
    tpr_c = 1.0 - tpr if tpr_low_complement is None else np.clip(np.asarray(tpr_low_complement, np.float64), 0.0, 1.0)
    fpr_c = 1.0 - fpr if fpr_up_complement is None else np.clip(np.asarray(fpr_up_complement, np.float64), 0.0, 1.0)
    return tpr, np.maximum(tpr_c, _TINY), np.maximum(fpr, _TINY), fpr_c


def _probit(x, complement):
    with np.errstate(divide="ignore"):
        return np.where(x <= 0.5, special.ndtri(x), -special.ndtri(complement))


def epsilon_std(tpr_low, fpr_up, delta, *, tpr_low_complement=None, fpr_up_complement=None):
    """Standard ``(eps, delta)`` lower bound from a hypothesis test.

    An ``(eps, delta)``-DP mechanism forces, for every test, ``TPR <= e^eps FPR + delta`` and
    ``1 - FPR <= e^eps (1 - TPR) + delta`` (Kairouz et al. 2015, Thm. 2.1). Both directions use the same pair of
    one-sided bounds, so::

        eps >= max(0, ln((tpr_low - delta) / fpr_up),
                      ln((1 - fpr_up - delta) / (1 - tpr_low))).

    Args:
      tpr_low: lower bound(s) on the true-positive rate (array-like, clipped to ``[0, 1]``).
      fpr_up: upper bound(s) on the false-positive rate.
      delta: the ``delta`` of the claim being audited, in ``[0, 1)``.
      tpr_low_complement: ``1 - tpr_low`` computed accurately (optional).
      fpr_up_complement: ``1 - fpr_up`` computed accurately (optional).

    Returns:
      The lower bound: a float for scalar input, else a float64 array of the broadcast shape; finite, because rates
      are rounded conservatively into the open unit interval.

    Raises:
      InputError: ``delta`` not in ``[0, 1)``.

    Guarantees:
      Assumption-free: if ``tpr_low``/``fpr_up`` hold, so does the bound.
    """
    delta = validate.nonnegative_float("delta", delta)  # 0 audits a pure-DP claim
    if delta >= 1.0:
        raise InputError(f"delta must be in [0, 1), got {delta}")
    tpr, tpr_c, fpr, fpr_c = _pairs(tpr_low, fpr_up, tpr_low_complement, fpr_up_complement)
    with np.errstate(divide="ignore", invalid="ignore"):
        num1 = tpr - delta
        e1 = np.where(num1 > 0, np.log(np.where(num1 > 0, num1, 1.0)) - np.log(fpr), -np.inf)
        num2 = fpr_c - delta
        e2 = np.where(num2 > 0, np.log(np.where(num2 > 0, num2, 1.0)) - np.log(tpr_c), -np.inf)
    out = np.maximum(np.maximum(e1, e2), 0.0)
    return out if out.ndim else float(out)


def mu_lower(tpr_low, fpr_up, *, tpr_low_complement=None, fpr_up_complement=None):
    """GDP lower bound ``mu >= Phi^-1(tpr_low) - Phi^-1(fpr_up)``.

    A ``mu``-GDP mechanism has ``TPR <= Phi(Phi^-1(FPR) + mu)`` for every test (Dong, Roth & Su 2019); the bound is
    monotone in both arguments, so plugging the one-sided bounds in keeps it valid. No ``abs()``: a test that does
    worse than chance gives a negative value (Nasr et al. 2023).

    Args:
      tpr_low: lower bound(s) on the true-positive rate.
      fpr_up: upper bound(s) on the false-positive rate.
      tpr_low_complement: ``1 - tpr_low`` computed accurately (optional; used for rates above 1/2).
      fpr_up_complement: ``1 - fpr_up`` computed accurately (optional; used for rates above 1/2).

    Returns:
      The bound: a float for scalar input, else a float64 array; ``-inf`` where ``tpr_low = 0`` (no evidence).
    """
    tpr, tpr_c, fpr, fpr_c = _pairs(tpr_low, fpr_up, tpr_low_complement, fpr_up_complement)
    mu = _probit(tpr, tpr_c) - _probit(fpr, fpr_c)
    return mu if mu.ndim else float(mu)


def epsilon_gdp(tpr_low, fpr_up, delta, *, tpr_low_complement=None, fpr_up_complement=None) -> float:
    """``eps(delta)`` of the GDP profile at ``mu_lower`` (``mu <= 0`` gives 0).

    Args:
      tpr_low: lower bound on the true-positive rate (scalar).
      fpr_up: upper bound on the false-positive rate (scalar).
      delta: the ``delta`` at which ``eps`` is taken, in ``(0, 1)``.
      tpr_low_complement: ``1 - tpr_low`` computed accurately (optional).
      fpr_up_complement: ``1 - fpr_up`` computed accurately (optional).

    Returns:
      ``gdp_epsilon(mu_lower, delta)`` as a float.

    Raises:
      InputError: ``delta`` not in ``(0, 1)``.

    Guarantees:
      The ``eps(delta)`` of the Gaussian envelope ``G_mu_lower``. It is a valid lower bound on the release's ``eps``
      at ``delta`` only if the release's trade-off curve *equals* ``G_mu`` for some ``mu`` (e.g. the whole
      Gaussian-noised vector with fixed clean outputs). Being ``mu``-GDP (``f >= G_mu``) is not enough: a
      post-processed release (argmax, nearest candidate) has a smaller ``eps(delta)`` than its envelope.
      :mod:`snapaudit_jax.estimation` applies it accordingly.
    """
    delta = validate.open_unit("delta", delta)
    mu = float(mu_lower(tpr_low, fpr_up, tpr_low_complement=tpr_low_complement, fpr_up_complement=fpr_up_complement))
    if not mu > 0.0:
        return 0.0
    return gdp_epsilon(mu, delta)


# Dispatch on two rate bounds, the violation rule, threshold objectives

ESTIMATORS = ("std", "gdp")
DEFAULT_ESTIMATOR = "std"
VIOLATION_RTOL = 1e-6

ASSUMPTION_FREE = "epsilon_emp is the standard estimator on (TPR_low, FPR_up): it needs no further assumption."


def estimate(tpr: RateBound, fpr: RateBound, delta: float) -> tuple[float, float, float]:
    """The three estimates from a TPR lower and an FPR upper bound.

    Args:
      tpr: the TPR lower bound.
      fpr: the FPR upper bound.
      delta: the claim's ``delta`` in ``(0, 1)``.

    Returns:
      ``(eps_std, mu_low, eps_gdp_envelope)`` as floats.

    Raises:
      InputError: ``delta`` not in ``(0, 1)``.

    Guarantees:
      If both bounds hold: ``eps_std`` is below the ``eps`` of every ``(eps, delta)`` guarantee of the release
      (assumption-free); ``mu_low`` is below the ``mu`` of every ``mu``-GDP guarantee;
      ``eps_gdp_envelope = eps(delta)`` of ``G_{mu_low}`` bounds the release's ``eps`` only if its trade-off curve
      equals ``G_mu`` for some ``mu`` (post-processing keeps ``f >= G_mu`` with a smaller ``eps(delta)``).
    """
    kw = dict(tpr_low_complement=tpr.complement, fpr_up_complement=fpr.complement)
    return (float(epsilon_std(tpr.bound, fpr.bound, delta, **kw)), float(mu_lower(tpr.bound, fpr.bound, **kw)),
            float(epsilon_gdp(tpr.bound, fpr.bound, delta, **kw)))


def check_estimator(estimator: str | None, mechanism: str, gaussian: bool) -> str:
    """The validated estimator; ``"gdp"`` only for a mechanism that claims a ``mu``.

    Args:
      estimator: ``"std"``, ``"gdp"`` or ``None`` (the default, ``"std"``).
      mechanism: the mechanism's name, used in the error.
      gaussian: whether the mechanism is Gaussian (claims a ``mu``).

    Returns:
      The estimator name.

    Raises:
      InputError: an unknown estimator, or ``"gdp"`` for a pure-epsilon mechanism (PoE, KSA).
    """
    estimator = validate.choice("estimator", DEFAULT_ESTIMATOR if estimator is None else estimator, ESTIMATORS)
    if estimator == "gdp" and not gaussian:
        raise InputError(f"estimator must be 'std' for {mechanism}: 'gdp' audits a mu-GDP claim, but {mechanism} is "
                         "a pure-epsilon mechanism that claims no mu")
    return estimator


def is_violation(epsilon_emp: float, epsilon_theory: float) -> bool:
    """``epsilon_emp > epsilon_theory`` beyond the numerical tolerance of the conversions (1e-6 relative).

    Exact audits of tight mechanisms give ``epsilon_emp == epsilon_theory`` up to root-finding error; that equality
    is not a violation.

    Args:
      epsilon_emp: the empirical lower bound.
      epsilon_theory: the claimed ``eps``.

    Returns:
      ``True`` iff ``epsilon_emp > epsilon_theory * (1 + VIOLATION_RTOL)``.
    """
    return bool(epsilon_emp > epsilon_theory * (1.0 + VIOLATION_RTOL))


def select_index(objective: np.ndarray, youden: np.ndarray) -> int:
    """Index of the best objective, near-ties broken by the largest TPR - FPR.

    Near-ties (GDP is flat in the threshold for Gaussian scores) go to the entry with the largest Youden index rather
    than to an extreme of the grid.

    Args:
      objective: ``(G,)`` values to maximise (e.g. :func:`objective`).
      youden: ``(G,)`` ``TPR - FPR`` estimates of the same entries.

    Returns:
      The index (the plain arg-max when no objective is finite).
    """
    objective = np.asarray(objective, np.float64)
    best = float(np.max(objective))
    if not np.isfinite(best):
        return int(np.argmax(objective))
    ties = objective >= best - 1e-9 * max(1.0, abs(best))
    return int(np.argmax(np.where(ties, youden, -np.inf)))


def objective(tpr_low, tpr_low_c, fpr_up, fpr_up_c, estimator: str, delta: float) -> np.ndarray:
    """The quantity a decision rule is chosen to maximise: ``eps_std`` (``"std"``) or ``mu_low`` (``"gdp"``).

    Args:
      tpr_low: ``(G,)`` TPR lower bounds.
      tpr_low_c: ``(G,)`` their complements.
      fpr_up: ``(G,)`` FPR upper bounds.
      fpr_up_c: ``(G,)`` their complements.
      estimator: ``"std"`` or ``"gdp"``.
      delta: the claim's ``delta`` (``"std"`` only).

    Returns:
      ``(G,)`` float64 (at least 1-D).
    """
    kw = dict(tpr_low_complement=np.clip(tpr_low_c, 0.0, 1.0), fpr_up_complement=np.clip(fpr_up_c, 0.0, 1.0))
    tl, fu = np.clip(tpr_low, 0.0, 1.0), np.clip(fpr_up, 0.0, 1.0)
    if estimator == "gdp":
        return np.atleast_1d(np.asarray(mu_lower(tl, fu, **kw), np.float64))
    return np.atleast_1d(np.asarray(epsilon_std(tl, fu, delta, **kw), np.float64))
