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

from snapaudit_jax.utils.lazy import lazy_package

# Each name loads on first use (:mod:`snapaudit_jax.utils.lazy`): the ``snapaudit`` command line registers
# ``snapaudit cpa`` through :mod:`conformal.command` without loading JAX.
_EXPORTS = {
    "config": ("AttackerConfig", "CPAConfig", "load_cpa_config"),
    "calibration": ("Calibration", "CoverageCheck", "calibrate", "coverage_check", "miss_rate_upper"),
    "kernels": (
        "FIXED_POINT_BITS", "SCORES", "aps_scores", "candidate_scores", "conformal_rank", "frequencies_from_samples",
        "leakage_proxy", "prediction_sets", "prob_scores", "pvalues", "quantize", "rank_scores", "sample_frequencies",
        "scores", "set_sizes", "threshold", "truncate_top_k",
    ),
    "metrics": ("ranking_metrics", "set_metrics", "true_ranks"),
    "run": ("run_cpa",),
}
__all__ = [attr for attrs in _EXPORTS.values() for attr in attrs]
__getattr__, __dir__ = lazy_package(__name__, _EXPORTS, ("attackers", "data", "mapie_adapter", "profile", "report"))
