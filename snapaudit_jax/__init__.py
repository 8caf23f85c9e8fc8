"""snapaudit-jax: JAX-accelerated auditing of the privacy of LLM pipelines.

The data's way, one subpackage per stage (``docs/architecture.md``)::

    config -> models -> dpicl (Phase A: clean outputs) -> simulation (Phase B: noise trials)
           -> estimation (bounds) -> audits (active, passive) -> report

* :mod:`~snapaudit_jax.utils` -- errors and exit statuses, validation, TOML config, atomic I/O, progress;
* :mod:`~snapaudit_jax.mechanisms` -- PV, PoE, ESA, KSA kernels, their calibration and the name registry;
* :mod:`~snapaudit_jax.simulation` -- snapshots, the bootstrap simulation, exact probabilities and profiles;
* :mod:`~snapaudit_jax.estimation` -- rate bounds, decision rules, estimators, trade-off curves, Holm, the
  one-run auditor and :class:`AuditResult`;
* :mod:`~snapaudit_jax.audits` -- the active (snapshot) audit, the passive baseline, ``snapaudit simulate``;
* :mod:`~snapaudit_jax.models` -- Flax GPT-2, Llama and BERT, checkpoints, the inference kernel, the answer cache;
* :mod:`~snapaudit_jax.dpicl` -- the DP-ICL application (datasets, pipelines, MSGS, ``snapaudit audit``);
* :mod:`~snapaudit_jax.dpsgd` -- DP-SGD training and accounting;
* :mod:`~snapaudit_jax.report` -- tables and plots shared by the commands.
"""

from snapaudit_jax.utils.lazy import lazy_package

__version__ = "0.1.0"

#: The names the package exports, by the subpackage each comes from: each loads on first use
#: (:mod:`snapaudit_jax.utils.lazy`), so that ``import snapaudit_jax`` starts no JAX.
_EXPORTS = {
    "audits": ("audit", "make_attack", "passive_audit"),
    "estimation": (
        "AuditResult", "Bonferroni", "DeclaredGrid", "Explicit", "HeldOut", "OneRunResult", "RateBound", "Split",
        "ThresholdTest", "TradeoffCurve", "audit_result", "clopper_pearson_lower", "clopper_pearson_upper",
        "empirical_bernstein_radius", "epsilon_gdp", "epsilon_std", "hoeffding_radius", "holm", "mu_lower", "one_run",
        "one_run_audit", "threshold_test",
    ),
    "mechanisms": (
        "Attack", "EmbeddingSpaceAggregation", "KeywordSpaceAggregation", "Mechanism", "PrivateVoting",
        "ProductOfExperts", "Release", "analytic_gaussian_sigma", "classical_gaussian_sigma",
        "exponential_mechanism_scale", "gaussian_sigma", "gdp_delta", "gdp_epsilon", "gdp_mu", "jem_prepare",
        "jem_select", "joint_exponential_topk",
    ),
    "simulation": (
        "SimulationCounts", "Snapshots", "exact_hit_probability", "exact_output_distribution",
        "exact_release_epsilon", "exact_score_probability", "load_snapshots", "profiles", "pv_argmax_probability",
        "save_snapshots", "simulate",
    ),
    "utils": ("use_all_cpu_cores",),
}
#: The subpackages, each an attribute of the package (``sa.dpsgd``) loaded on first use.
_SUBPACKAGES = ("dpicl", "dpsgd", "finetune", "models")

__all__ = [*_EXPORTS, "report", *(attr for attrs in _EXPORTS.values() for attr in attrs)]
__getattr__, __dir__ = lazy_package(__name__, _EXPORTS, ("report", *_SUBPACKAGES))
