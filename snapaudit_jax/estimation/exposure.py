"""Exposure of a canary (Carlini et al. 2019): how far up the model ranks the secret among all it could have been.

Part of the estimation layer (:mod:`snapaudit_jax.estimation`); host statistics in float64, NumPy and SciPy only.

A canary's secret was drawn uniformly from a *randomness space* ``R`` (every ``d``-digit string for the canaries of
:func:`snapaudit_jax.dpsgd.make_canaries`, ``|R| = 10^d``). A model scores every ``r`` in ``R`` with the
log-probability of writing it after the canary's prefix (higher = more likely). Its rank is

    rank = #{r in R : score(r) >= score(canary)}

(the canary counts itself; ties count *against* it, see below), and its exposure

    exposure = log2 |R| - log2 rank,

between 0 (the model prefers every other secret) and ``log2 |R|`` (the model prefers the canary to every other
secret). A secret the model has not seen has exposure about 1 in expectation (its rank is uniform); a memorised one
approaches ``log2 |R|`` (Carlini et al. 2019: rank and exposure of a canary).

Two estimators, both vectorised over several canaries that share one ``R`` (one prefix and one space):

* :func:`exposure_exact` -- the definition, from the scores of *all* of ``R``;
* :func:`exposure_extrapolated` -- when ``R`` is too large to score: fit a skew-normal distribution to the
  perplexity-like values ``-score`` of a uniform sample of ``R`` and read the canary's tail probability off the
  fitted CDF: ``exposure ~ -log2 F(-score(canary))`` (the paper's estimation by extrapolation; TF Privacy's
  ``compute_exposure_extrapolation``). It is an *estimate*, as good as the skew-normal fit of the far tail.

Conventions (and how they differ from TF Privacy's ``secret_sharer/exposures.py``):

1. **Candidates include the canary.** ``candidate_scores`` of :func:`exposure_exact` are the scores of the whole
   space, the canary's own secret included exactly once; each canary score must therefore appear among them (checked:
   exact float equality). TF Privacy's ``compute_exposure_interpolation`` takes reference secrets *without* the
   canaries and uses ``log2(len(references))``.
2. **Ties count against the canary** (the conservative rule: exposure is evidence of memorisation, so a tie never
   raises it): ``rank`` counts every candidate scored ``>=`` the canary, itself included. TF Privacy counts only
   strictly better references (and breaks exact ties by ``argsort`` order). Without ties the two ranks agree.
3. **The extrapolation is capped at** ``log2 |R|``: no secret has a rank below 1, while the fitted CDF can be
   arbitrarily small (or underflow to 0 past ``1e-308``; the cap turns that ``inf`` into ``log2 |R|``). It is also
   never below 0. The log-CDF is SciPy's ``skewnorm.logcdf`` (the log of its Owen's-T CDF): within ``1e-7`` nats of
   ``mpmath`` quadrature down to ``exp(-42)`` (60 bits, the cap of 18-digit secrets) for skewness ``|a| <= 4``
   (tested), an error far below that of the fit itself.

References:
  Carlini, Liu, Erlingsson, Kos, Song, "The Secret Sharer: Evaluating and Testing Unintended Memorization in
  Neural Networks", USENIX Security 2019 (rank, exposure, its estimation by a skew-normal fit).
  TensorFlow Privacy, ``privacy_tests/secret_sharer/exposures.py`` (``compute_exposure_interpolation``,
  ``compute_exposure_extrapolation``).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from scipy import stats

from snapaudit_jax.utils import validate
from snapaudit_jax.utils.errors import InputError

__all__ = ["EXPOSURE_METHODS", "MIN_SAMPLE", "Exposure", "exposure_exact", "exposure_extrapolated"]

EXPOSURE_METHODS = ("exact", "extrapolated")
MIN_SAMPLE = 10  # a three-parameter fit needs a handful of points; real samples hold thousands


class Exposure(NamedTuple):
    """Exposures of canaries that share one randomness space (arrays shaped like the canary scores given).

    Attributes:
      exact: exposures by the definition (:func:`exposure_exact`), or ``None``.
      extrapolated: skew-normal estimates (:func:`exposure_extrapolated`), or ``None``.
      rank: the exact ranks (int64, ``1 <= rank <= space_size``) for ``"exact"``; for ``"extrapolated"`` the
        sample's estimate ``1 + (space_size - 1) * #{sample >= canary} / n`` (float64).
      space_size: ``|R|``.
      method: ``"exact"`` or ``"extrapolated"``: the field that holds the result.
      fit: the skew-normal ``(a, loc, scale)`` of the perplexity-like values ``-score`` (``"extrapolated"``), else
        ``None``.
    """

    exact: np.ndarray | None
    extrapolated: np.ndarray | None
    rank: np.ndarray
    space_size: int
    method: str
    fit: tuple[float, float, float] | None = None

    @property
    def value(self) -> np.ndarray:
        """The exposures of :attr:`method` (``exact`` or ``extrapolated``)."""
        return self.exact if self.method == "exact" else self.extrapolated

    @property
    def max_exposure(self) -> float:
        """``log2 space_size``: the exposure of a canary ranked first."""
        return math.log2(self.space_size)


def _scores(name: str, value, *, ndim_max: int) -> np.ndarray:
    arr = validate.finite_array(name, value, ndim_min=0)
    if arr.ndim > ndim_max:
        raise InputError(f"{name} must have at most {ndim_max} dimension(s), got shape {arr.shape}")
    return arr


def _space_size(value, n_sample: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InputError(f"space_size must be an integer (|R|, the number of possible secrets), got {value!r}")
    value = int(value)
    if value <= n_sample:
        raise InputError(f"space_size must be larger than the sample (the sample is drawn from the space without the "
                         f"canary, so |R| >= {n_sample} + 1), got space_size={value} for {n_sample} sample scores")
    return value


def exposure_exact(canary_score, candidate_scores) -> Exposure:
    """Exposure by its definition: ``log2 |R| - log2 rank`` from the scores of the whole randomness space.

    Args:
      canary_score: the canaries' scores (log-probabilities, higher = more likely): a scalar or ``(m,)``.
      candidate_scores: ``(|R|,)`` the scores of *every* secret of the space, each canary's own secret included
        exactly once (the module docstring's convention 1).

    Returns:
      :class:`Exposure` with ``method="exact"``: ``exact`` (float64) and ``rank`` (int64) shaped like
      ``canary_score``, where ``rank = #{r : candidate_scores[r] >= canary_score}`` (ties count against the canary).

    Raises:
      InputError: non-finite or empty scores, ``candidate_scores`` not 1-D, ``canary_score`` of more than one
        dimension, or a canary score that is not among the candidates' (the space must include the canary).
    """
    s = _scores("canary_score", canary_score, ndim_max=1)
    cand = _scores("candidate_scores", candidate_scores, ndim_max=1)
    if cand.ndim != 1:
        raise InputError(f"candidate_scores must be 1-dimensional (one score per secret of the space), got shape "
                         f"{cand.shape}")
    ordered = np.sort(cand)
    n = ordered.shape[0]
    first = np.searchsorted(ordered, s, side="left")  # candidates scored below the canary
    found = (first < n) & (ordered[np.minimum(first, n - 1)] == s)
    if not np.all(found):
        i = int(np.flatnonzero(np.ravel(~found))[0])
        where = "" if s.ndim == 0 else f"[{i}]"
        raise InputError(
            f"canary_score{where} = {float(np.ravel(s)[i])!r} must be one of candidate_scores (the candidates are "
            f"the whole randomness space, the canary's own secret included once), got none equal")
    rank = (n - first).astype(np.int64)
    exact = math.log2(n) - np.log2(rank.astype(np.float64))
    return Exposure(exact=exact, extrapolated=None, rank=rank, space_size=n, method="exact")


def exposure_extrapolated(canary_score, sample_scores, space_size: int) -> Exposure:
    """Skew-normal estimate of the exposure from a uniform sample of the space (Carlini et al. 2019).

    The perplexity-like values ``x = -sample_scores`` are fitted with :func:`scipy.stats.skewnorm.fit` (maximum
    likelihood); a canary's exposure is ``-log2 F(-canary_score)`` with ``F`` the fitted CDF (its log-CDF, for the far
    tail), clipped to ``[0, log2 space_size]``.

    Args:
      canary_score: the canaries' scores (log-probabilities, higher = more likely): a scalar or ``(m,)``.
      sample_scores: ``(n,)`` scores of secrets drawn uniformly from the space *without* the canaries (``n >= 10``,
        not all equal).
      space_size: ``|R| > n``, the number of possible secrets (a Python int; any size).

    Returns:
      :class:`Exposure` with ``method="extrapolated"``: ``extrapolated`` (float64) shaped like ``canary_score``,
      ``rank`` the sample's rank estimate (float64), ``fit`` the fitted ``(a, loc, scale)``.

    Raises:
      InputError: non-finite or empty scores, ``sample_scores`` not 1-D, fewer than 10 of them or all equal,
        ``space_size`` not an integer larger than the sample.

    Guarantees:
      None beyond the fit: the estimate is as good as the skew-normal model of the space's score distribution in
      the tail where the canary lies, which a sample of ``n`` cannot check below ``1/n``. Use
      :func:`exposure_exact` where the space can be scored.
    """
    s = _scores("canary_score", canary_score, ndim_max=1)
    sample = _scores("sample_scores", sample_scores, ndim_max=1)
    if sample.ndim != 1:
        raise InputError(f"sample_scores must be 1-dimensional (one score per sampled secret), got shape "
                         f"{sample.shape}")
    n = sample.shape[0]
    if n < MIN_SAMPLE:
        raise InputError(f"sample_scores must hold at least {MIN_SAMPLE} scores to fit a skew-normal, got {n}")
    if np.ptp(sample) == 0.0:
        raise InputError(f"sample_scores must not all be equal (a skew-normal needs a spread), got {n} times "
                         f"{float(sample[0])!r}")
    size = _space_size(space_size, n)
    a, loc, scale = (float(v) for v in stats.skewnorm.fit(-sample))
    # Carlini et al. 2019 (extrapolation): exposure ~ -log2 Pr_{r ~ R}[x(r) <= x(canary)], x = -log-probability
    log_cdf = stats.skewnorm.logcdf(-s, a, loc, scale)
    extrapolated = np.clip(-np.asarray(log_cdf, np.float64) / math.log(2.0), 0.0, math.log2(size))
    better = n - np.searchsorted(np.sort(sample), s, side="left")  # sampled secrets scored >= the canary
    rank = 1.0 + (size - 1) * better.astype(np.float64) / n
    return Exposure(exact=None, extrapolated=extrapolated, rank=rank, space_size=size, method="extrapolated",
                    fit=(a, loc, scale))
