"""Noise calibration and the Gaussian-DP privacy profile.

Everything here is scalar, host-side float64 arithmetic (NumPy/SciPy): it runs
once per audit, never per trial.

The Gaussian-DP (GDP) privacy profile of a mechanism with trade-off curve
``G_mu`` is (Dong, Roth & Su 2019, Cor. 2.13; Balle & Wang 2018, Thm. 8)::

    delta(eps; mu) = Phi(-eps/mu + mu/2) - exp(eps) * Phi(-eps/mu - mu/2).

The Gaussian mechanism with L2 sensitivity ``Delta`` and noise ``sigma`` is
exactly ``mu``-GDP with ``mu = Delta / sigma``; hence the *analytic* Gaussian
calibration (Balle & Wang 2018) is ``sigma = Delta / mu*(eps, delta)`` where
``mu*`` is the largest ``mu`` with ``delta(eps; mu) <= delta``.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import optimize, special

from snapaudit_jax.utils import validate
from snapaudit_jax.utils.errors import InputError

__all__ = [
    "gdp_delta",
    "gdp_epsilon",
    "gdp_mu",
    "classical_gaussian_sigma",
    "analytic_gaussian_sigma",
    "gaussian_sigma",
    "exponential_mechanism_scale",
]


def _log_gdp_delta(epsilon: float, mu: float) -> float:
    """``log delta(eps; mu)``, stable for large ``eps`` and ``mu``."""
    if mu <= 0.0:
        return -math.inf
    if math.isinf(mu):
        return 0.0
    log_a = float(special.log_ndtr(-epsilon / mu + mu / 2.0))
    log_b = float(special.log_ndtr(-epsilon / mu - mu / 2.0))
    gap = epsilon + log_b - log_a  # <= 0 in exact arithmetic
    if gap >= 0.0:
        return -math.inf
    return log_a + math.log(-math.expm1(gap))


def gdp_delta(epsilon: float, mu: float) -> float:
    """Privacy profile ``delta(eps; mu)`` of a ``mu``-GDP mechanism.

    Args:
      epsilon: ``eps >= 0``.
      mu: GDP parameter ``mu >= 0`` (``inf`` allowed).

    Returns:
      The smallest ``delta`` such that a ``mu``-GDP mechanism is ``(eps, delta)``-DP, as a float.

    Raises:
      InputError: ``epsilon`` is not a finite number >= 0, or ``mu`` is not a number >= 0.

    References:
      Dong, Roth & Su 2019, "Gaussian Differential Privacy", Cor. 2.13; Balle & Wang 2018, "Improving the Gaussian
      mechanism", Thm. 8.
    """
    epsilon = validate.nonnegative_float("epsilon", epsilon)
    mu = validate.nonnegative_float("mu", mu, allow_inf=True)
    return math.exp(_log_gdp_delta(epsilon, mu))


def _bracket_up(f, start: float, limit: float = 1e6) -> float:
    x = start
    while f(x) <= 0.0:
        x *= 2.0
        if x > limit:
            raise ArithmeticError(f"could not bracket a root below {limit}")
    return x


def gdp_epsilon(mu: float, delta: float) -> float:
    """Smallest ``eps >= 0`` with ``delta(eps; mu) <= delta``.

    This converts a GDP parameter into the equivalent ``(eps, delta)`` pair; ``mu <= 0`` gives ``eps = 0``.

    Args:
      mu: GDP parameter (any real; ``mu <= 0`` means no distinguishability).
      delta: target ``delta`` in ``(0, 1)``.

    Returns:
      ``eps`` as a float (``inf`` for ``mu = inf``).

    Raises:
      InputError: ``delta`` is not in ``(0, 1)`` or ``mu`` is nan.
      ArithmeticError: the root could not be bracketed (``eps`` beyond ``1e6``).
    """
    delta = validate.open_unit("delta", delta)
    mu = float(mu)
    if math.isnan(mu):
        raise InputError(f"mu must be a number, got {mu}")
    if mu <= 0.0:
        return 0.0
    if math.isinf(mu):
        return math.inf
    log_target = math.log(delta)
    if _log_gdp_delta(0.0, mu) <= log_target:
        return 0.0

    def f(e: float) -> float:  # decreasing in e
        return log_target - _log_gdp_delta(e, mu)

    hi = _bracket_up(f, max(1.0, mu * mu))
    return float(optimize.brentq(f, 0.0, hi, xtol=1e-13, rtol=4 * np.finfo(float).eps, maxiter=500))


def gdp_mu(epsilon: float, delta: float) -> float:
    """Largest ``mu`` such that a ``mu``-GDP mechanism is ``(eps, delta)``-DP.

    Args:
      epsilon: ``eps > 0``.
      delta: ``delta`` in ``(0, 1)``.

    Returns:
      ``mu*(eps, delta)`` as a float.

    Raises:
      InputError: ``epsilon`` is not a finite number > 0 or ``delta`` is not in ``(0, 1)``.
      ArithmeticError: the root could not be bracketed (extreme ``epsilon`` or ``delta``).

    References:
      Balle & Wang 2018, Alg. 1 (analytic Gaussian mechanism).
    """
    epsilon = validate.positive_float("epsilon", epsilon)
    delta = validate.open_unit("delta", delta)
    log_target = math.log(delta)

    def f(m: float) -> float:  # increasing in m
        return _log_gdp_delta(epsilon, m) - log_target

    hi = _bracket_up(f, 1.0)
    lo = hi / 2.0
    while f(lo) > 0.0:
        lo /= 2.0
        if lo < 1e-300:
            raise ArithmeticError("could not bracket mu from below")
    return float(optimize.brentq(f, lo, hi, xtol=1e-15, rtol=4 * np.finfo(float).eps, maxiter=500))


def classical_gaussian_sigma(epsilon: float, delta: float, sensitivity: float) -> float:
    """Classical Gaussian noise ``sigma = Delta * sqrt(2 ln(1.25/delta)) / eps``.

    Args:
      epsilon: ``eps > 0``.
      delta: ``delta`` in ``(0, 1)``.
      sensitivity: L2 sensitivity ``Delta > 0``.

    Returns:
      ``sigma`` as a float (same unit as ``sensitivity``).

    Raises:
      InputError: an argument out of its range.

    Guarantees:
      ``(eps, delta)``-DP only for ``eps < 1`` (Dwork & Roth 2014, Thm. A.1). For larger ``eps`` it can under-size
      the noise; this is one of the flaws the engine is built to detect, so it is offered, not refused.
    """
    epsilon = validate.positive_float("epsilon", epsilon)
    delta = validate.open_unit("delta", delta)
    sensitivity = validate.positive_float("sensitivity", sensitivity)
    return sensitivity * math.sqrt(2.0 * math.log(1.25 / delta)) / epsilon


def analytic_gaussian_sigma(epsilon: float, delta: float, sensitivity: float) -> float:
    """Smallest ``sigma`` making the Gaussian mechanism ``(eps, delta)``-DP.

    ``sigma = Delta / mu*(eps, delta)`` (the GDPtoSIGMA of SnapAudit App. A).

    Args:
      epsilon: ``eps > 0``.
      delta: ``delta`` in ``(0, 1)``.
      sensitivity: L2 sensitivity ``Delta > 0``.

    Returns:
      ``sigma`` as a float (same unit as ``sensitivity``).

    Raises:
      InputError: an argument out of its range.

    Guarantees:
      Exact for every ``eps > 0``: the Gaussian mechanism with this ``sigma`` and L2 sensitivity ``Delta`` is
      ``(eps, delta)``-DP and no smaller ``sigma`` is (Balle & Wang 2018, Thm. 8).
    """
    sensitivity = validate.positive_float("sensitivity", sensitivity)
    return sensitivity / gdp_mu(epsilon, delta)


def gaussian_sigma(epsilon: float, delta: float, sensitivity: float, calibration: str = "analytic") -> float:
    """Gaussian noise ``sigma`` by :func:`analytic_gaussian_sigma` or :func:`classical_gaussian_sigma`.

    Args:
      epsilon: ``eps > 0``.
      delta: ``delta`` in ``(0, 1)``.
      sensitivity: L2 sensitivity ``Delta > 0``.
      calibration: ``"analytic"`` (default) or ``"classical"``.

    Returns:
      ``sigma`` as a float.

    Raises:
      InputError: an unknown ``calibration`` or an argument out of its range.
    """
    if calibration == "analytic":
        return analytic_gaussian_sigma(epsilon, delta, sensitivity)
    if calibration == "classical":
        return classical_gaussian_sigma(epsilon, delta, sensitivity)
    raise InputError(f"calibration must be 'analytic' or 'classical', got {calibration!r}")


def exponential_mechanism_scale(epsilon: float, sensitivity: float) -> float:
    """Score multiplier ``eps / (2 Delta_u)`` of the exponential mechanism.

    Sampling ``argmax_k (u_k * eps/(2 Delta_u) + Gumbel)`` is ``eps``-DP when every utility moves by at most
    ``Delta_u`` between neighbours (McSherry & Talwar 2007). PoE uses ``Delta_u = Gamma`` (the clip); JEM uses the
    sensitivity of its sequence utility (1 for add/remove neighbours, 2 for replace-one neighbours; Gillenwater et
    al. 2022).

    Args:
      epsilon: ``eps > 0``.
      sensitivity: utility sensitivity ``Delta_u > 0``.

    Returns:
      The scale as a float.

    Raises:
      InputError: ``epsilon`` or ``sensitivity`` is not a finite number > 0.
    """
    epsilon = validate.positive_float("epsilon", epsilon)
    sensitivity = validate.positive_float("sensitivity", sensitivity)
    return epsilon / (2.0 * sensitivity)
