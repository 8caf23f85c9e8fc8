"""Empirical privacy-loss estimators from bounds on TPR and FPR.

Given a test with ``TPR >= tpr_low`` and ``FPR <= fpr_up`` (simultaneously,
with the audit's confidence), these turn the pair into lower bounds on the
mechanism's privacy parameters: ``epsilon_std`` on ``eps`` (assumption-free),
``mu_lower`` on the ``mu`` of a ``mu``-GDP claim; ``epsilon_gdp`` is the
Gaussian envelope's ``eps`` (see its docstring). Audits use them through
:mod:`snapaudit_jax.estimation.layer`.
"""

from __future__ import annotations

import numpy as np
from scipy import special

from snapaudit_jax.mechanisms.noise import gdp_epsilon
from snapaudit_jax.utils import validate
from snapaudit_jax.utils.errors import InputError

__all__ = ["epsilon_std", "mu_lower", "epsilon_gdp", "ESTIMATORS"]

ESTIMATORS = ("gdp", "std")

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

    An ``(eps, delta)``-DP mechanism forces, for every test,
    ``TPR <= e^eps FPR + delta`` and ``1 - FPR <= e^eps (1 - TPR) + delta``
    (Kairouz et al. 2015, Thm. 2.1). Both directions use the same pair of
    one-sided bounds, so::

        eps >= max(0, ln((tpr_low - delta) / fpr_up),
                      ln((1 - fpr_up - delta) / (1 - tpr_low))).

    Args:
      tpr_low: lower bound(s) on the true-positive rate.
      fpr_up: upper bound(s) on the false-positive rate.
      delta: the ``delta`` of the claim being audited, in ``[0, 1)``.
      tpr_low_complement: ``1 - tpr_low`` computed accurately (optional).
      fpr_up_complement: ``1 - fpr_up`` computed accurately (optional).

    Returns:
      The lower bound (NumPy float or array); finite, because rates are
      rounded conservatively into the open unit interval.

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

    A ``mu``-GDP mechanism has ``TPR <= Phi(Phi^-1(FPR) + mu)`` for every
    test (Dong, Roth & Su 2019); the bound is monotone in both arguments, so
    plugging the one-sided bounds in keeps it valid. No ``abs()``: a test
    that does worse than chance gives a negative value (Nasr et al. 2023).
    A ``tpr_low`` of 0 gives ``-inf`` (no evidence). Complements, when given,
    are used for rates above 1/2.
    """
    tpr, tpr_c, fpr, fpr_c = _pairs(tpr_low, fpr_up, tpr_low_complement, fpr_up_complement)
    mu = _probit(tpr, tpr_c) - _probit(fpr, fpr_c)
    return mu if mu.ndim else float(mu)


def epsilon_gdp(tpr_low, fpr_up, delta, *, tpr_low_complement=None, fpr_up_complement=None) -> float:
    """``eps`` of the GDP profile at ``mu_lower`` (``mu <= 0`` gives 0).

    Guarantees:
      The ``eps(delta)`` of the Gaussian envelope ``G_mu_lower``. It is a
      valid lower bound on the release's ``eps`` at ``delta`` only if the
      release's trade-off curve *equals* ``G_mu`` for some ``mu`` (e.g. the
      whole Gaussian-noised vector with fixed clean outputs). Being
      ``mu``-GDP (``f >= G_mu``) is not enough: a post-processed release
      (argmax, nearest candidate) has a smaller ``eps(delta)`` than its
      envelope. :mod:`snapaudit_jax.estimation.layer` applies it accordingly.
    """
    delta = validate.open_unit("delta", delta)
    mu = float(mu_lower(tpr_low, fpr_up, tpr_low_complement=tpr_low_complement, fpr_up_complement=fpr_up_complement))
    if not mu > 0.0:
        return 0.0
    return gdp_epsilon(mu, delta)
