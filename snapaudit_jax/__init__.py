"""snapaudit-jax: JAX-accelerated auditing of the privacy of LLM pipelines.

Stages, one module each:

* :mod:`~snapaudit_jax.calibration` -- Gaussian/GDP calibration, exponential-mechanism scales;
* :mod:`~snapaudit_jax.mechanisms` and :mod:`~snapaudit_jax.jem` -- PV, PoE, ESA, KSA kernels;
* :mod:`~snapaudit_jax.simulate` -- Phase B bootstrap simulation (sharded, chunked);
* :mod:`~snapaudit_jax.exact` and :mod:`~snapaudit_jax.profiles` -- exact success probabilities and exact
  privacy profiles of releases;
* :mod:`~snapaudit_jax.estimation` -- the one estimation layer: rate bounds, decision rules as values,
  estimators, certified trade-off curves, Holm, and the :class:`AuditResult` factory (its formulas live in
  :mod:`~snapaudit_jax.bounds` and :mod:`~snapaudit_jax.estimators`);
* :mod:`~snapaudit_jax.one_run` -- the one-run auditor (many canaries, one run; Steinke, Nasr, Jagielski 2023),
  part of the estimation layer;
* :mod:`~snapaudit_jax.audit` -- Phase C, the active (snapshot) audit;
* :mod:`~snapaudit_jax.passive` -- the passive black-box baseline;
* :mod:`~snapaudit_jax.one_run_icl` -- one-run audits of DP-ICL pipelines (many canaries in one private set,
  the ``[one_run]`` section of ``snapaudit audit``);
* :mod:`~snapaudit_jax.snapshots` -- snapshot files.
"""

from snapaudit_jax import estimation, one_run, profiles
from snapaudit_jax.audit import audit, make_attack
from snapaudit_jax.bounds import (
    clopper_pearson_lower,
    clopper_pearson_upper,
    empirical_bernstein_radius,
    hoeffding_radius,
)
from snapaudit_jax.calibration import (
    analytic_gaussian_sigma,
    classical_gaussian_sigma,
    exponential_mechanism_scale,
    gaussian_sigma,
    gdp_delta,
    gdp_epsilon,
    gdp_mu,
)
from snapaudit_jax.estimation import (
    AuditResult,
    Bonferroni,
    Explicit,
    RateBound,
    Split,
    ThresholdTest,
    TradeoffCurve,
    audit_result,
    holm,
    threshold_test,
)
from snapaudit_jax.estimators import epsilon_gdp, epsilon_std, mu_lower
from snapaudit_jax.exact import (
    exact_hit_probability,
    exact_output_distribution,
    exact_release_epsilon,
    exact_score_probability,
    pv_argmax_probability,
)
from snapaudit_jax.jem import KeywordSpaceAggregation, jem_prepare, jem_select, joint_exponential_topk
from snapaudit_jax.mechanisms import (
    Attack,
    EmbeddingSpaceAggregation,
    Mechanism,
    PrivateVoting,
    ProductOfExperts,
    Release,
)
from snapaudit_jax.one_run import DeclaredGrid, HeldOut, OneRunResult, one_run_audit
from snapaudit_jax.passive import passive_audit
from snapaudit_jax.simulate import SimulationCounts, simulate
from snapaudit_jax.snapshots import Snapshots, load_snapshots, save_snapshots
from snapaudit_jax.utils.platform import use_all_cpu_cores

__version__ = "0.1.0"

__all__ = [
    "AuditResult",
    "Attack",
    "Bonferroni",
    "Explicit",
    "Split",
    "ThresholdTest",
    "TradeoffCurve",
    "audit_result",
    "estimation",
    "exact_output_distribution",
    "exact_release_epsilon",
    "holm",
    "one_run",
    "one_run_audit",
    "DeclaredGrid",
    "HeldOut",
    "OneRunResult",
    "profiles",
    "threshold_test",
    "EmbeddingSpaceAggregation",
    "KeywordSpaceAggregation",
    "Mechanism",
    "PrivateVoting",
    "ProductOfExperts",
    "RateBound",
    "Release",
    "SimulationCounts",
    "Snapshots",
    "analytic_gaussian_sigma",
    "audit",
    "classical_gaussian_sigma",
    "clopper_pearson_lower",
    "clopper_pearson_upper",
    "empirical_bernstein_radius",
    "epsilon_gdp",
    "epsilon_std",
    "exact_hit_probability",
    "exact_score_probability",
    "exponential_mechanism_scale",
    "gaussian_sigma",
    "gdp_delta",
    "gdp_epsilon",
    "gdp_mu",
    "hoeffding_radius",
    "jem_prepare",
    "jem_select",
    "joint_exponential_topk",
    "load_snapshots",
    "make_attack",
    "mu_lower",
    "passive_audit",
    "pv_argmax_probability",
    "save_snapshots",
    "simulate",
    "use_all_cpu_cores",
]
