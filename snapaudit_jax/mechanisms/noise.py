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
    "FLOAT32_TINY",
    "FLOAT32_MAX",
    "MAX_CANCELLED_BITS",
    "float32_noise_parameter",
    "gdp_delta",
    "gdp_epsilon",
    "gdp_mu",
    "classical_gaussian_sigma",
    "analytic_gaussian_sigma",
    "gaussian_sigma",
    "exponential_mechanism_scale",
]


# The kernels scale their noise by a float32 parameter (sigma, or the exponential mechanism's eps / (2 Delta)): it
# must be a normal float32. Below the smallest normal 2^-126 float32 loses precision and then rounds to 0 (no
# noise at all); above its largest value it is inf.
FLOAT32_TINY = float(np.finfo(np.float32).tiny)
FLOAT32_MAX = float(np.finfo(np.float32).max)
# delta(eps; mu) is a difference of two terms; float64 keeps 53 bits, and when the first term exceeds delta by a
# factor 2^b the difference keeps 53 - b of them. The analytic calibration must keep at least float32's 24 bits
# (the precision the kernels draw noise at): b <= 29. Beyond it (tiny eps with tiny delta) the root is noise.
MAX_CANCELLED_BITS = 29
# gdp_mu brackets mu* below this bound (sigma >= 1e-6 Delta); mu* ~ sqrt(2 eps) for large eps, so eps beyond ~1e11.
_MU_LIMIT = 1e6


def float32_noise_parameter(name: str, value: float, *, epsilon: float, sensitivity: float,
                            delta: float | None = None) -> float:
    """Checks that a calibrated noise parameter survives the kernels' float32 cast.

    Args:
      name: the parameter (``"sigma"``, ``"scale"``).
      value: its float64 value.
      epsilon: the claimed ``eps`` it was calibrated for (named first in the message).
      sensitivity: the sensitivity it was calibrated for.
      delta: the claimed ``delta`` (Gaussian mechanisms), or ``None``.

    Returns:
      ``value``, unchanged.

    Raises:
      InputError: ``value`` is not a normal float32 (0, subnormal, or beyond float32's largest value).
    """
    if not FLOAT32_TINY <= value <= FLOAT32_MAX:
        side = "below float32's smallest normal value (the noise would lose precision or round to 0)" \
            if value < FLOAT32_TINY else "beyond float32's largest value (it would be inf)"
        with_delta = "" if delta is None else f", delta {delta:g}"
        raise InputError(f"epsilon {epsilon:g} (sensitivity {sensitivity:g}{with_delta}) gives {name} = {value:.6g}, "
                         f"{side}; the kernels need {name} in [{FLOAT32_TINY:.6g}, {FLOAT32_MAX:.6g}]")
    return value


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
      ArithmeticError: the root could not be bracketed (``mu*`` beyond ``1e6``: ``epsilon`` beyond about
        ``1e11``), or float64 cancellation leaves fewer than 24 bits of ``delta(eps; mu)`` at the root
        (:data:`MAX_CANCELLED_BITS`; tiny ``epsilon`` with tiny ``delta``).

    References:
      Balle & Wang 2018, Alg. 1 (analytic Gaussian mechanism).
    """
    epsilon = validate.positive_float("epsilon", epsilon)
    delta = validate.open_unit("delta", delta)
    log_target = math.log(delta)

    def f(m: float) -> float:  # increasing in m
        value = _log_gdp_delta(epsilon, m) - log_target
        if math.isnan(value):  # eps / mu overflows float64 (eps near 1e308): no root can be computed
            raise ArithmeticError(f"delta(eps; mu) is not a number in float64 at eps = {epsilon:g}, mu = {m:g}")
        return value

    hi = _bracket_up(f, 1.0, _MU_LIMIT)
    lo = hi / 2.0
    while f(lo) > 0.0:
        lo /= 2.0
        if lo < 1e-300:
            raise ArithmeticError("could not bracket mu from below")
    mu = float(optimize.brentq(f, lo, hi, xtol=1e-15, rtol=4 * np.finfo(float).eps, maxiter=500))
    cancelled = (float(special.log_ndtr(-epsilon / mu + mu / 2.0)) - log_target) / math.log(2.0)
    if cancelled > MAX_CANCELLED_BITS:
        raise ArithmeticError(f"delta(eps; mu) cancels {cancelled:.0f} of float64's 53 bits at eps = {epsilon:g}, "
                              f"delta = {delta:g}: its root mu* cannot be trusted")
    return mu


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
      InputError: an argument out of its range, or an ``(epsilon, delta)`` that :func:`gdp_mu` cannot solve in
        float64 (``epsilon`` beyond about ``1e11``, or tiny ``epsilon`` with tiny ``delta``).

    Guarantees:
      Exact for every ``eps > 0``: the Gaussian mechanism with this ``sigma`` and L2 sensitivity ``Delta`` is
      ``(eps, delta)``-DP and no smaller ``sigma`` is (Balle & Wang 2018, Thm. 8).
    """
    sensitivity = validate.positive_float("sensitivity", sensitivity)
    try:
        mu = gdp_mu(epsilon, delta)
    except ArithmeticError as err:
        raise InputError(f"epsilon {epsilon:g} with delta {delta:g} has no analytic Gaussian calibration in float64 "
                         f"({err}); it solves epsilon up to about 1e11, and not tiny epsilon with tiny delta") from None
    return sensitivity / mu


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
