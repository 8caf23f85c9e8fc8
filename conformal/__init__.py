"""Conformal Privacy Auditing: certified re-identification ambiguity sets.

Calibration layer (pure JAX kernels, usable on their own):
:func:`aps_scores`, :func:`rank_scores`, :func:`prob_scores`,
:func:`threshold`, :func:`prediction_sets`, :func:`pvalues`,
:func:`sample_frequencies`, :func:`truncate_top_k`; the declared-configuration
layer: :func:`calibrate` (Mondrian strata, open-world accounting),
:func:`coverage_check`; metrics: :func:`set_metrics`, :func:`ranking_metrics`;
the ``snapaudit cpa`` application: :class:`CPAConfig`, :func:`load_cpa_config`,
:func:`run_cpa` (:mod:`conformal.config`, :mod:`conformal.run`, :mod:`conformal.report`).

References:
  Huang et al. 2026, Conformal Privacy Auditing: Calibrated Re-identification
  Attacks with Statistical Guarantees.
"""

from conformal.config import AttackerConfig, CPAConfig, load_cpa_config
from conformal.calibration import Calibration, CoverageCheck, calibrate, coverage_check, miss_rate_upper
from conformal.kernels import (
    FIXED_POINT_BITS,
    SCORES,
    aps_scores,
    candidate_scores,
    conformal_rank,
    frequencies_from_samples,
    leakage_proxy,
    prediction_sets,
    prob_scores,
    pvalues,
    quantize,
    rank_scores,
    sample_frequencies,
    scores,
    set_sizes,
    threshold,
    truncate_top_k,
)
from conformal.metrics import ranking_metrics, set_metrics, true_ranks
from conformal.run import run_cpa

__all__ = [
    "FIXED_POINT_BITS",
    "SCORES",
    "AttackerConfig",
    "CPAConfig",
    "Calibration",
    "CoverageCheck",
    "aps_scores",
    "calibrate",
    "candidate_scores",
    "conformal_rank",
    "coverage_check",
    "frequencies_from_samples",
    "leakage_proxy",
    "load_cpa_config",
    "miss_rate_upper",
    "prediction_sets",
    "prob_scores",
    "pvalues",
    "quantize",
    "rank_scores",
    "ranking_metrics",
    "run_cpa",
    "sample_frequencies",
    "scores",
    "set_metrics",
    "set_sizes",
    "threshold",
    "true_ranks",
    "truncate_top_k",
]
