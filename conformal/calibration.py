"""Calibration of a declared attacker configuration: thresholds, Mondrian strata, open-world accounting, checks.

:func:`calibrate` turns calibration scores into a :class:`Calibration` (one
threshold per alpha, optionally per stratum), records how many calibration
documents had their identity outside the candidate pool, and bounds the
candidate-miss probability. :func:`coverage_check` tests held-out data against
the calibration with an exact null distribution (a validity alarm for drift).

References:
  Huang et al. 2026 (CPA) Theorem 5.2, Corollary 5.3; Vovk 2012 (conditional
  validity of inductive conformal predictors: the Beta law of coverage given
  the calibration set); Vovk et al. 2005 (Mondrian conformal prediction).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from scipy import stats

from conformal.kernels import SCORES, _alpha_list, _score_dtype, conformal_rank, pvalues, threshold
from snapaudit_jax.utils.errors import InputError

__all__ = ["Calibration", "calibrate", "miss_rate_upper", "coverage_check", "CoverageCheck"]


def miss_rate_upper(n_missing: int, n_total: int, confidence: float) -> float:
    """One-sided Clopper–Pearson upper bound on the candidate-miss probability rho.

    Holds with probability ``>= confidence`` when the ``n_total`` documents are
    i.i.d. draws of the release/attacker configuration.

    Args:
      n_missing: documents whose identity is not in the pool, ``0 <= n_missing <= n_total``.
      n_total: documents observed, ``>= 1``.
      confidence: one-sided confidence level in ``(0, 1)``.

    Returns:
      The upper bound in ``(0, 1]`` (``1.0`` when every document missed).

    Raises:
      ValueError: for ``n_total < 1``, ``n_missing`` outside ``[0, n_total]`` or ``confidence`` outside ``(0, 1)``.
    """
    if n_total < 1:
        raise InputError(f"n_total must be >= 1, got {n_total}")
    if not 0 <= n_missing <= n_total:
        raise InputError(f"n_missing must be in [0, {n_total}], got {n_missing}")
    if not 0 < confidence < 1:
        raise InputError(f"confidence must be in (0, 1), got {confidence}")
    if n_missing == n_total:
        return 1.0
    return float(stats.beta.ppf(confidence, n_missing + 1, n_total - n_missing))


@dataclasses.dataclass(frozen=True)
class Calibration:
    """Thresholds of one declared attacker configuration.

    Attributes:
      score: the nonconformity score (``aps``, ``rank`` or ``prob``).
      alphas: miscoverage levels.
      qhat: ``{stratum: (qhat per alpha)}``; the single stratum ``None``
        unless Mondrian; ``inf`` means full sets.
      n_cal: ``{stratum: calibration scores used}`` (identities in the pool).
      n_missing: calibration documents whose identity is not in the pool
        (open world; they carry no score).
      miss_rate_upper: Clopper–Pearson upper bound on the miss probability at
        ``confidence`` (a bound, not the observed rate).
      confidence: confidence of ``miss_rate_upper``.

    Guarantees:
      For a new exchangeable document whose identity is in its pool, the set
      ``{y : s(x, y) <= qhat}`` covers it with probability ``>= 1 - alpha``
      (per stratum for Mondrian). Unconditionally, coverage is
      ``>= (1 - rho)(1 - alpha)``, and with probability ``>= confidence`` over
      the calibration draw ``rho <= miss_rate_upper``
      (:meth:`certified_coverage`).
    """

    score: str
    alphas: tuple[float, ...]
    qhat: Mapping[Any, tuple[float, ...]]
    n_cal: Mapping[Any, int]
    n_missing: int
    miss_rate_upper: float
    confidence: float

    @property
    def mondrian(self) -> bool:
        """Whether the thresholds are per stratum (Mondrian) rather than one for all documents."""
        return set(self.qhat) != {None}

    def thresholds(self, alpha: float, strata: Sequence[Any] | None = None):
        """The threshold at ``alpha`` (must be one of :attr:`alphas`): a float, or one per test document.

        Per document (Mondrian), a float32 array when every threshold is a
        float32 value (always so for the kernels' scores), else float64: the
        calibrated values exactly, never rounded (a float32 copy of a float64
        threshold could fall below it and lose coverage).

        Args:
          alpha: a calibrated miscoverage level.
          strata: ``(k,)`` strata of the test documents (Mondrian only; ``None`` otherwise).

        Returns:
          The threshold (a float; ``inf`` means full sets), or ``(k,)`` thresholds, one per test document.

        Raises:
          ValueError: for an ``alpha`` that was not calibrated, strata given to a non-Mondrian calibration, strata
            missing for a Mondrian one, or a stratum that was not calibrated.
        """
        try:
            j = self.alphas.index(alpha)
        except ValueError:
            raise InputError(f"alpha {alpha!r} was not calibrated (calibrated: {list(self.alphas)})") from None
        if not self.mondrian:
            if strata is not None:
                raise InputError("strata given, but this calibration is not Mondrian")
            return self.qhat[None][j]
        if strata is None:
            raise InputError("a Mondrian calibration needs the strata of the test documents")
        out = np.empty(len(strata), np.float64)
        for i, s in enumerate(strata):
            if s not in self.qhat:
                raise InputError(f"stratum {s!r} of test document {i} was not calibrated (known: {sorted(self.qhat)})")
            out[i] = self.qhat[s][j]
        with np.errstate(over="ignore"):
            narrow = out.astype(np.float32)
        return narrow if np.array_equal(narrow, out) else out

    def certified_coverage(self, alpha: float) -> float:
        """Lower bound ``(1 - miss_rate_upper)(1 - alpha)`` on unconditional coverage (CPA Cor. 5.3).

        Args:
          alpha: a calibrated miscoverage level.

        Returns:
          The lower bound, a float in ``[0, 1)``.

        Raises:
          ValueError: for an ``alpha`` that was not calibrated.
        """
        if alpha not in self.alphas:
            raise InputError(f"alpha {alpha!r} was not calibrated (calibrated: {list(self.alphas)})")
        return (1.0 - self.miss_rate_upper) * (1.0 - alpha)

    def to_json(self) -> dict:
        """The calibration as JSON-ready values (the stratum ``None`` is named ``"all"``).

        Returns:
          ``{"score", "alphas", "qhat", "n_cal", "n_missing", "miss_rate_upper", "confidence"}``.
        """
        def key(s):
            return "all" if s is None else str(s)

        return {
            "score": self.score,
            "alphas": list(self.alphas),
            "qhat": {key(s): [float(v) for v in q] for s, q in self.qhat.items()},
            "n_cal": {key(s): n for s, n in self.n_cal.items()},
            "n_missing": self.n_missing,
            "miss_rate_upper": self.miss_rate_upper,
            "confidence": self.confidence,
        }


def calibrate(
    cal_scores,
    alpha: float | Sequence[float],
    *,
    score: str = "aps",
    strata: Sequence[Any] | None = None,
    n_missing: int = 0,
    confidence: float = 0.95,
) -> Calibration:
    """Split-conformal thresholds from the scores of calibration documents.

    Args:
      cal_scores: ``(n,)`` scores of the calibration documents whose true
        identity is in their candidate pool.
      alpha: one level or several, each in (0, 1).
      score: the score the values were computed with (recorded; sets must use it).
      strata: optional ``(n,)`` stratum of each calibration document (Mondrian:
        a threshold per stratum, valid conditionally on the stratum).
      n_missing: calibration documents whose identity was absent from the pool
        (open world); they enter only the miss-rate bound.
      confidence: confidence of the miss-rate upper bound.

    Raises:
      ValueError: empty calibration set (or stratum), alpha outside (0, 1),
        NaN scores, mismatched strata.

    Guarantees:
      Those of :class:`Calibration`. Each threshold is one of the calibration
      scores exactly, in their own dtype (float64 scores give float64
      thresholds: see :func:`conformal.threshold`); compare test scores with
      it in that precision.
    """
    if score not in SCORES:
        raise InputError(f"score must be one of {', '.join(SCORES)}, got {score!r}")
    alphas = tuple(float(a) for a in _alpha_list(alpha)[0])  # validated as given, before float()
    s = np.asarray(cal_scores)
    s = s.astype(_score_dtype(s), copy=False)  # the caller's floating dtype; float32 for integers, as before
    if s.ndim != 1:
        raise InputError(f"cal_scores must have shape (n,), got shape {s.shape}")
    if s.size == 0:
        raise InputError("cal_scores is empty: the calibration set must hold at least 1 document with its identity "
                         "in the pool")
    if np.isnan(s).any():
        raise InputError(f"cal_scores must not be NaN (index {int(np.argmax(np.isnan(s)))})")
    if isinstance(n_missing, bool) or not isinstance(n_missing, (int, np.integer)) or n_missing < 0:
        raise InputError(f"n_missing must be an integer >= 0, got {n_missing!r}")
    upper = miss_rate_upper(int(n_missing), s.size + int(n_missing), confidence)
    if strata is None:
        q = tuple(float(v) for v in np.asarray(threshold(s, list(alphas))))
        return Calibration(score, alphas, {None: q}, {None: int(s.size)}, int(n_missing), upper, confidence)
    strata = list(strata)
    if len(strata) != s.size:
        raise InputError(f"strata must have one entry per calibration score ({s.size}), got {len(strata)}")
    qhat, counts = {}, {}
    for stratum in sorted(set(strata), key=str):
        idx = np.asarray([i for i, x in enumerate(strata) if x == stratum])
        qhat[stratum] = tuple(float(v) for v in np.asarray(threshold(s[idx], list(alphas))))
        counts[stratum] = int(idx.size)
    return Calibration(score, alphas, qhat, counts, int(n_missing), upper, confidence)


@dataclasses.dataclass(frozen=True)
class CoverageCheck:
    """Exact test of held-out coverage against a calibration (a validity alarm).

    Attributes:
      alphas: levels tested.
      covered: held-out documents covered at each level.
      n_test: held-out documents (identities in the pool).
      lower_quantile: per level, the smallest count ``c`` with
        ``P(covered <= c) >= (1 - confidence) / len(alphas)`` under
        exchangeability; fewer covered documents raise the alarm.
      pvalue: per level, ``P(covered <= observed)`` under exchangeability.
      alarm: some level covers fewer than its ``lower_quantile``.
      ks_statistic: one-sided Kolmogorov–Smirnov distance ``sup_u (F(u) - u)``
        of the held-out conformal p-values (descriptive: the p-values share a
        calibration set, so they are not independent).
      confidence: family-wise confidence of ``alarm`` (Bonferroni over alphas).

    Guarantees:
      If calibration and held-out documents are exchangeable, ``alarm`` is
      raised with probability ``<= 1 - confidence``. Given the calibration
      set, each held-out document is covered independently with probability
      ``C ~ Beta(k, n + 1 - k)`` (no ties; ties only raise coverage), so the
      count is Beta-Binomial(n_test, k, n + 1 - k); the test is exact.
    """

    alphas: tuple[float, ...]
    covered: tuple[int, ...]
    n_test: int
    lower_quantile: tuple[int, ...]
    pvalue: tuple[float, ...]
    alarm: bool
    ks_statistic: float
    confidence: float


def coverage_check(cal_scores, test_scores, alphas: Sequence[float] = (0.05, 0.1, 0.2), *,
                   confidence: float = 0.99) -> CoverageCheck:
    """Tests whether held-out scores are covered as often as exchangeability with the calibration implies.

    Args:
      cal_scores: ``(n,)`` calibration scores (the thresholds' source).
      test_scores: ``(k,)`` held-out scores of true identities (in the pool).
      alphas: levels to test (Bonferroni over them).
      confidence: family-wise confidence (false-alarm probability ``<= 1 - confidence``).

    Scores are compared in their promoted dtype (float64 if either is float64;
    the promotion is exact), the threshold being the exact order statistic in
    that dtype, so coverage counts and p-values follow ``s <= qhat`` on the
    values as given.
    """
    dtype = _score_dtype(cal_scores, test_scores)
    cal = np.asarray(cal_scores, dtype)
    test = np.asarray(test_scores, dtype)
    for name, v in (("cal_scores", cal), ("test_scores", test)):
        if v.size == 0:
            raise InputError(f"{name} is empty: coverage_check needs at least 1 calibration and 1 test score")
    if not 0 < confidence < 1:
        raise InputError(f"confidence must be in (0, 1), got {confidence}")
    alphas = tuple(float(a) for a in _alpha_list(alphas)[0])
    n, k_test = cal.size, test.size
    qhat = np.asarray(threshold(cal, list(alphas)))
    level = (1.0 - confidence) / len(alphas)
    covered, lower, pvals = [], [], []
    for a, q in zip(alphas, qhat):
        k = conformal_rank(n, a)
        c = int(np.sum(test <= q))
        covered.append(c)
        if k > n:  # full sets: coverage is 1 for every document
            lower.append(k_test)
            pvals.append(1.0)
            continue
        law = stats.betabinom(k_test, k, n + 1 - k)
        lower.append(int(law.ppf(level)))  # smallest c with P(X <= c) >= level
        pvals.append(float(law.cdf(c)))
    alarm = any(p < level for p in pvals)
    pv = np.sort(np.asarray(pvalues(cal, test), np.float64))
    ecdf = np.arange(1, pv.size + 1) / pv.size
    ks = float(max(0.0, np.max(ecdf - pv)))
    return CoverageCheck(alphas, tuple(covered), int(k_test), tuple(lower), tuple(pvals), bool(alarm), ks, confidence)
