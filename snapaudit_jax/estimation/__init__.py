"""Phase C's statistics, one layer: rate bounds -> decision rules -> estimators -> one :class:`AuditResult`.

Every audit of the engine -- the active snapshot audit (:func:`snapaudit_jax.audit`), the passive end-to-end
baseline (:func:`snapaudit_jax.passive_audit`) and the DP-SGD canary audit (:mod:`attacks.canary`) -- goes
through this package, in four steps, one module each:

1. **Rate bounds** (:mod:`~snapaudit_jax.estimation.rates`, formulas in :mod:`~snapaudit_jax.estimation.bounds`):
   one-sided bounds on a success rate as :class:`RateBound` values -- exact Clopper-Pearson (i.i.d. trials),
   one-sided empirical Bernstein (Maurer & Pontil 2009; i.i.d. per-snapshot rates in ``[0, 1]``), exact rates
   (no error), or SnapAudit's App. C.2 radius (a heuristic, see :func:`paper_bound`). :func:`rebound` re-derives
   a bound at another failure probability from the same sufficient statistics (family-wise corrections).
2. **Decision rules as frozen values** (:mod:`~snapaudit_jax.estimation.rules`), interpreted by
   :func:`threshold_test`: :class:`Split` (choose on one part, evaluate on the other), :class:`Bonferroni` (a
   grid fixed in advance, every threshold evaluated at ``alpha / (2 G)`` per rate) and :class:`Explicit` (a
   threshold chosen before the data).
3. **Estimators** (:mod:`~snapaudit_jax.estimation.estimators`, :func:`estimate`): the assumption-free
   ``(eps, delta)`` bound ``eps_std`` (both hypothesis-testing inequalities of DP on ``(TPR_low, FPR_up)``:
   Kairouz et al. 2015), the GDP bound ``mu_low`` (valid for any ``mu``-GDP claim) and the ``eps(delta)`` of the
   Gaussian envelope ``G_{mu_low}`` -- which bounds the release's ``eps`` only when its trade-off curve *is*
   Gaussian.
4. **One result factory** (:mod:`~snapaudit_jax.estimation.result`, :func:`audit_result`) that decides what
   ``epsilon_emp`` is, when ``violation`` may be set (only from assumption-free estimates, never from a
   heuristic) and which assumptions the result states.

Certified trade-off curves and the ROC AUC are :mod:`~snapaudit_jax.estimation.curves`; violation p-values and
Holm's procedure over several claims :mod:`~snapaudit_jax.estimation.claims`. One-run audits (many canaries
with their own coins, one run of the mechanism; Steinke, Nasr, Jagielski 2023) are
:mod:`~snapaudit_jax.estimation.one_run`: :func:`one_run_audit` with the rule values :class:`DeclaredGrid` and
:class:`HeldOut`.

Claims and their flags:

* the ``(eps, delta)`` claim: ``violation`` iff ``epsilon_emp > epsilon_theory`` (1e-6 relative tolerance),
  where ``epsilon_emp`` is assumption-free (``eps_std``, or an exact privacy profile), or the envelope ``eps``
  where the release is Gaussian by construction;
* the ``mu``-GDP claim (Gaussian mechanisms, ``mu_claim = sensitivity / sigma``): ``mu_violation`` iff
  ``mu_low > mu_claim``.
"""

from snapaudit_jax.estimation import bounds, claims, curves, estimators, exposure, one_run, rates, result, rules
from snapaudit_jax.estimation.bounds import (
    clopper_pearson_lower,
    clopper_pearson_upper,
    empirical_bernstein_radius,
    hoeffding_radius,
)
from snapaudit_jax.estimation.claims import (
    holm,
    mu_violation_p_value,
    violation_p_value,
)
from snapaudit_jax.estimation.curves import (
    TradeoffCurve,
    certified_curve,
    claimed_tradeoff,
    roc_auc,
)
from snapaudit_jax.estimation.estimators import (
    ASSUMPTION_FREE,
    DEFAULT_ESTIMATOR,
    ESTIMATORS,
    VIOLATION_RTOL,
    check_estimator,
    epsilon_gdp,
    epsilon_std,
    estimate,
    is_violation,
    mu_lower,
    objective,
    select_index,
)
from snapaudit_jax.estimation.exposure import Exposure, exposure_exact, exposure_extrapolated
from snapaudit_jax.estimation.one_run import DeclaredGrid, HeldOut, OneRunResult, one_run_audit
from snapaudit_jax.estimation.rates import (
    RateBound,
    bernstein_bound,
    binomial_bound,
    binomial_pair,
    exact_rate,
    paper_bound,
    rebound,
)
from snapaudit_jax.estimation.result import (
    AuditResult,
    GDP_BY_CONSTRUCTION_LABEL,
    GDP_ENVELOPE_LABEL,
    HEURISTIC_NOTE,
    audit_result,
)
from snapaudit_jax.estimation.rules import (
    Bonferroni,
    Explicit,
    Split,
    ThresholdTest,
    threshold_test,
)

__all__ = [
    "ASSUMPTION_FREE",
    "AuditResult",
    "Bonferroni",
    "DEFAULT_ESTIMATOR",
    "DeclaredGrid",
    "ESTIMATORS",
    "Explicit",
    "Exposure",
    "GDP_BY_CONSTRUCTION_LABEL",
    "GDP_ENVELOPE_LABEL",
    "HEURISTIC_NOTE",
    "HeldOut",
    "OneRunResult",
    "RateBound",
    "Split",
    "ThresholdTest",
    "TradeoffCurve",
    "VIOLATION_RTOL",
    "audit_result",
    "bernstein_bound",
    "binomial_bound",
    "binomial_pair",
    "bounds",
    "certified_curve",
    "check_estimator",
    "claimed_tradeoff",
    "claims",
    "clopper_pearson_lower",
    "clopper_pearson_upper",
    "curves",
    "empirical_bernstein_radius",
    "epsilon_gdp",
    "epsilon_std",
    "estimate",
    "estimators",
    "exact_rate",
    "exposure",
    "exposure_exact",
    "exposure_extrapolated",
    "hoeffding_radius",
    "holm",
    "is_violation",
    "mu_lower",
    "mu_violation_p_value",
    "objective",
    "one_run",
    "one_run_audit",
    "paper_bound",
    "rates",
    "rebound",
    "result",
    "roc_auc",
    "rules",
    "select_index",
    "threshold_test",
    "violation_p_value",
]
