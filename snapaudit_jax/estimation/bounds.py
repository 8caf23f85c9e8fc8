"""One-sided confidence bounds for success probabilities (host-side, float64).

All functions are vectorised over NumPy arrays and use the *one-sided*
failure probability ``alpha`` they are given: the caller splits its total
failure probability across events (union bound).
"""

from __future__ import annotations

import numpy as np
from scipy import special

__all__ = [
    "clopper_pearson_lower",
    "clopper_pearson_upper",
    "empirical_bernstein_radius",
    "hoeffding_radius",
]


def clopper_pearson_lower(successes, trials, alpha):
    """Exact one-sided binomial lower confidence bound at level ``1 - alpha``.

    Args:
      successes: number of successes ``k`` (array-like of ints).
      trials: number of trials ``n >= 1`` (broadcast against ``successes``).
      alpha: one-sided failure probability in ``(0, 1)``.

    Returns:
      ``p_low`` (float64 array of the broadcast shape, 0-d for scalars; 0 where ``k = 0``) with
      ``P(p_low > p) <= alpha`` for ``k ~ Binomial(n, p)``.

    Guarantees:
      Valid for every ``p`` and ``n`` (Clopper & Pearson 1934): the lower bound is the ``alpha`` quantile of
      ``Beta(k, n - k + 1)``.
    """
    k = np.asarray(successes, dtype=np.float64)
    n = np.asarray(trials, dtype=np.float64)
    with np.errstate(all="ignore"):
        low = special.betaincinv(k, n - k + 1.0, alpha)
    return np.where(k <= 0, 0.0, low)


def clopper_pearson_upper(successes, trials, alpha):
    """Exact one-sided binomial upper confidence bound at level ``1 - alpha`` (see :func:`clopper_pearson_lower`).

    The upper bound is the ``1 - alpha`` quantile of ``Beta(k + 1, n - k)``, computed through the complemented
    incomplete beta so that tiny rates keep full relative precision.

    Args:
      successes: number of successes ``k`` (array-like of ints).
      trials: number of trials ``n >= 1``.
      alpha: one-sided failure probability in ``(0, 1)``.

    Returns:
      ``p_up`` (float64 array of the broadcast shape; 1 where ``k = n``) with ``P(p_up < p) <= alpha``.
    """
    k = np.asarray(successes, dtype=np.float64)
    n = np.asarray(trials, dtype=np.float64)
    with np.errstate(all="ignore"):
        up = special.betainccinv(k + 1.0, n - k, alpha)
    return np.where(k >= n, 1.0, up)


def empirical_bernstein_radius(variance, n, alpha):
    """One-sided empirical Bernstein radius of Maurer & Pontil (2009), Thm. 4.

    For i.i.d. ``X_1..X_n`` in ``[0, 1]`` with sample variance ``V_n`` (denominator ``n - 1``), with probability at
    least ``1 - alpha``::

        E[X] - mean(X) <= sqrt(2 V_n ln(2/alpha) / n) + 7 ln(2/alpha) / (3 (n - 1)).

    Applying it to ``1 - X`` gives the lower side with the same radius.

    Args:
      variance: sample variance ``V_n`` (array-like; negative values count as 0).
      n: sample size ``n >= 2``.
      alpha: one-sided failure probability in ``(0, 1)``.

    Returns:
      The radius, a float64 array of the broadcast shape (``inf`` where ``n < 2``).
    """
    v = np.maximum(np.asarray(variance, dtype=np.float64), 0.0)
    n = np.asarray(n, dtype=np.float64)
    log_term = np.log(2.0 / alpha)
    with np.errstate(divide="ignore", invalid="ignore"):
        radius = np.sqrt(2.0 * v * log_term / n) + 7.0 * log_term / (3.0 * (n - 1.0))
    return np.where(n >= 2, radius, np.inf)


def hoeffding_radius(n, alpha, *, two_sided: bool = False):
    """Hoeffding radius ``sqrt(ln(c/alpha) / (2 n))`` for means of ``n`` i.i.d. ``[0, 1]`` variables.

    Args:
      n: sample size (array-like).
      alpha: failure probability in ``(0, 1)``.
      two_sided: ``False``: ``c = 1``, a one-sided bound; ``True``: ``c = 2``, the two-sided constant that
        SnapAudit (App. C.2) uses for its Monte Carlo term.

    Returns:
      The radius, a float64 array of the shape of ``n``.
    """
    n = np.asarray(n, dtype=np.float64)
    c = 2.0 if two_sided else 1.0
    return np.sqrt(np.log(c / alpha) / (2.0 * n))
