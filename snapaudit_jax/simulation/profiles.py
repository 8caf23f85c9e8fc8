"""Exact privacy profiles ``eps(delta)`` of a release for one audited pair (host-side, float64).

With the clean outputs fixed, a DP-ICL release is a known pair of output
distributions ``(P_1, P_0)`` (with / without the canary). Its privacy profile
is the hockey-stick divergence in both directions::

    delta(eps) = max(sup_S P_1(S) - e^eps P_0(S),  sup_S P_0(S) - e^eps P_1(S)),

and ``eps(delta)`` is the smallest ``eps >= 0`` with ``delta(eps) <= delta``
(Balle, Barthe & Gaboardi 2018, Thm. 1). This is the exact ``eps`` the pair
attains; every valid lower bound from a test on this pair is below it.

Three shapes of release cover the audited mechanisms:

* a finite set of outputs (PV's argmax label, PoE's label, ESA's nearest of
  two candidates; mixtures over several fixed clean outputs average the
  output probabilities): :func:`discrete_epsilon` -- the supremum is attained
  by ``S = {o : P_1(o) > e^eps P_0(o)}``;
* a Gaussian vector ``N(m_1, s^2 I)`` vs ``N(m_0, s^2 I)`` (PV's noisy votes,
  ESA's noisy mean, white-box): exactly ``mu``-GDP with ``mu = |m_1 - m_0|/s``,
  :func:`~snapaudit_jax.mechanisms.noise.gdp_epsilon`;
* a location pair of standard logistic laws (PoE's white-box margin, a
  difference of Gumbel noises): :func:`logistic_epsilon` -- the likelihood
  ratio is monotone, so threshold sets attain the supremum.

References:
  Balle, Barthe & Gaboardi, "Privacy Amplification by Subsampling", NeurIPS 2018 (hockey-stick profile).
  Dong, Roth & Su, "Gaussian Differential Privacy", JRSS-B 2022 (Gaussian trade-off curves).
"""

from __future__ import annotations

import math

import numpy as np
from scipy import optimize, special

from snapaudit_jax.mechanisms.noise import gdp_epsilon
from snapaudit_jax.utils import validate
from snapaudit_jax.utils.errors import InputError

__all__ = ["discrete_delta", "discrete_epsilon", "gaussian_epsilon", "logistic_delta", "logistic_epsilon"]


def _check_distribution(name: str, p) -> np.ndarray:
    arr = validate.finite_array(name, p)
    if arr.ndim != 1:
        raise InputError(f"{name} must be a 1-D probability vector, got shape {arr.shape}")
    if np.any(arr < 0) or abs(float(arr.sum()) - 1.0) > 1e-6:
        raise InputError(f"{name} must be non-negative and sum to 1 (within 1e-6), got sum {float(arr.sum())!r}")
    return arr


def _log_pair(p1, p0) -> tuple[np.ndarray, np.ndarray]:
    """Validated ``(log p1, log p0)`` of two output distributions of one shape (``-inf`` for impossible outputs)."""
    a, b = _check_distribution("p1", p1), _check_distribution("p0", p0)
    if a.shape != b.shape:
        raise InputError(f"p1 and p0 must have one shape, got {a.shape} and {b.shape}")
    with np.errstate(divide="ignore"):
        return np.log(a), np.log(b)


def _log_hockey(log_p: np.ndarray, log_q: np.ndarray, eps: float) -> float:
    """``log sum_o max(0, p_o - e^eps q_o)`` from log-probabilities (no cancellation for tiny ``q``)."""
    gap = log_q + eps - log_p  # < 0 where p > e^eps q
    keep = gap < 0
    if not np.any(keep):
        return -math.inf
    terms = log_p[keep] + np.log(-np.expm1(gap[keep]))
    return float(special.logsumexp(terms))


def discrete_delta(p1, p0, epsilon: float) -> float:
    """``delta(eps)`` of a pair of finite output distributions, the larger of both directions.

    Args:
      p1: ``(K,)`` output probabilities with the canary.
      p0: ``(K,)`` output probabilities without it.
      epsilon: ``eps >= 0``.

    Returns:
      ``max(sum_o max(0, p1_o - e^eps p0_o), sum_o max(0, p0_o - e^eps p1_o))`` as a float.

    Raises:
      InputError: ``p1`` or ``p0`` not a 1-D probability vector (non-negative, summing to 1 within 1e-6), of
        different shapes, or ``epsilon < 0``.
    """
    la, lb = _log_pair(p1, p0)
    eps = validate.nonnegative_float("epsilon", epsilon)
    return float(math.exp(max(_log_hockey(la, lb, eps), _log_hockey(lb, la, eps))))


def discrete_epsilon(p1, p0, delta: float) -> float:
    """Exact ``eps(delta)`` of a release with finitely many outputs.

    Args:
      p1: ``(K,)`` output probabilities with the canary.
      p0: ``(K,)`` output probabilities without it.
      delta: in ``[0, 1)``.

    Returns:
      The smallest ``eps >= 0`` with ``delta(eps) <= delta``; ``inf`` if an output of mass ``> delta`` is
      impossible under the other hypothesis.

    Raises:
      InputError: invalid distributions (as :func:`discrete_delta`) or ``delta`` not in ``[0, 1)``.

    Guarantees:
      Exact up to root finding (``|error| < 1e-12`` in ``eps``): the pair is ``(eps(delta), delta)``-DP and no
      smaller ``eps`` holds at that ``delta``.
    """
    la, lb = _log_pair(p1, p0)
    delta = validate.nonnegative_float("delta", delta)
    if delta >= 1.0:
        raise InputError(f"delta must be in [0, 1), got {delta}")
    if delta == 0.0:  # pure DP: the largest log-ratio over outputs either side can produce
        with np.errstate(invalid="ignore"):
            ratios = [np.where(np.isneginf(lp), -np.inf, lp - lq) for lp, lq in ((la, lb), (lb, la))]
        return float(max(0.0, *(float(np.max(r)) for r in ratios)))
    log_target = math.log(delta)
    out = 0.0
    for lp, lq in ((la, lb), (lb, la)):
        if _log_hockey(lp, lq, 0.0) <= log_target:
            continue
        # Mass on outputs the other side never produces cannot be paid for by any eps.
        if float(special.logsumexp(np.where(np.isneginf(lq), lp, -np.inf))) > log_target:
            return math.inf
        finite = ~np.isneginf(lq) & ~np.isneginf(lp)
        hi = float(np.max(lp[finite] - lq[finite])) + 1e-9  # delta(hi) is the impossible-output mass only
        def f(e, lp=lp, lq=lq):
            return _log_hockey(lp, lq, e) - log_target

        if f(hi) > 0:
            return math.inf
        out = max(out, float(optimize.brentq(f, 0.0, hi, xtol=1e-13, rtol=4 * np.finfo(float).eps, maxiter=500)))
    return out


def gaussian_epsilon(distance: float, sigma: float, delta: float) -> float:
    """Exact ``eps(delta)`` of ``N(m_1, sigma^2 I)`` vs ``N(m_0, sigma^2 I)`` with ``|m_1 - m_0| = distance``.

    Args:
      distance: ``|m_1 - m_0| >= 0`` (L2).
      sigma: noise standard deviation (> 0).
      delta: in ``(0, 1)``.

    Returns:
      ``gdp_epsilon(distance / sigma, delta)`` (0 for ``distance = 0``).

    Raises:
      InputError: an argument out of its range.
    """
    distance = validate.nonnegative_float("distance", distance)
    sigma = validate.positive_float("sigma", sigma)
    return gdp_epsilon(distance / sigma, delta) if distance > 0 else 0.0


def _log_sigmoid(x):
    return -np.logaddexp(0.0, -x)


def logistic_delta(shift: float, epsilon: float) -> float:
    """``delta(eps)`` of ``Logistic(shift, 1)`` vs ``Logistic(0, 1)`` (symmetric in the two directions).

    Args:
      shift: the location difference (finite; its sign does not matter).
      epsilon: ``eps >= 0``.

    Returns:
      ``delta(eps)`` as a float (0 for ``eps >= |shift|``).

    Raises:
      InputError: a non-finite ``shift`` or ``epsilon < 0``.
    """
    d = abs(validate.finite_array("shift", [shift])[0])
    eps = validate.nonnegative_float("epsilon", epsilon)
    if eps >= d:  # the likelihood ratio lies in (e^-d, e^d)
        return 0.0

    # delta = sup_t P_1(X >= t) - e^eps P_0(X >= t), P_1 = Logistic(d, 1), P_0 = Logistic(0, 1). Its
    # derivative is f_0(t) (e^eps - LR(t)) with LR(t) = f_1(t) / f_0(t) increasing from e^-d to e^d (a
    # log-concave location family): the supremum is at the root of log LR(t) = eps.
    def log_density(x):
        return _log_sigmoid(x) + _log_sigmoid(-x)

    t_star = optimize.brentq(lambda t: log_density(t - d) - log_density(t) - eps, -60.0, d + 60.0,
                             xtol=1e-14, maxiter=500)
    a = float(_log_sigmoid(d - t_star))
    b = eps + float(_log_sigmoid(-t_star))
    return float(math.exp(a) * -math.expm1(b - a)) if b < a else 0.0


def logistic_epsilon(shift: float, delta: float) -> float:
    """Exact ``eps(delta)`` of a location pair of standard logistic laws at distance ``|shift|``.

    Args:
      shift: the location difference.
      delta: in ``(0, 1)``.

    Returns:
      ``eps(delta)`` as a float in ``[0, |shift|]``.

    Raises:
      InputError: ``delta`` not in ``(0, 1)``.

    Guarantees:
      Exact up to numerical optimisation (about ``1e-9`` in ``eps``): threshold sets are optimal for a monotone
      likelihood ratio (Neyman-Pearson).
    """
    delta = validate.open_unit("delta", delta)
    d = abs(float(shift))
    if d == 0.0 or logistic_delta(d, 0.0) <= delta:
        return 0.0
    def f(e):
        return math.log(max(logistic_delta(d, e), 1e-300)) - math.log(delta)

    return float(optimize.brentq(f, 0.0, d, xtol=1e-12, maxiter=300))
