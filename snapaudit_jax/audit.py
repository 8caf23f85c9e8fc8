"""Phase C: attack design, simulation and valid empirical-epsilon lower bounds.

:func:`audit` is the engine's entry point. It

1. designs the attack (target release, white-box reference outputs) and, for
   the white-box threat, the decision threshold -- always on data that the
   final bounds do not use (selection snapshots and/or selection trials);
2. estimates TPR and FPR on the evaluation data (simulation or exact ``h_b``);
3. turns them into one-sided bounds ``TPR_low``, ``FPR_up`` that hold
   simultaneously with probability at least ``confidence``;
4. converts the pair into ``eps_emp`` with the standard or the GDP estimator.

Bounding methods (``method`` x ``clean``):

============  ============================================================  ===========================
method        ``clean="sampled"`` (snapshots are i.i.d. LLM draws)           ``clean="fixed"``
============  ============================================================  ===========================
simulate      stratified trials; one-sided empirical Bernstein on the        bootstrap trials; exact
              per-snapshot success rates (covers snapshot *and* Monte        Clopper-Pearson on each rate
              Carlo error), ``alpha/2`` per rate
exact         exact ``h_b`` per snapshot; empirical Bernstein over           exact rates, no error
              snapshots, ``alpha/2`` per rate
paper         SnapAudit App. C.2: Bernstein(snapshots) + Hoeffding(MC),      (same)
              ``alpha/4`` per event; ``sigma^2`` is the plug-in variance
              of simulated per-distinct-snapshot rates
============  ============================================================  ===========================

``clean="fixed"`` audits the DP noise stage on clean outputs that are known
exactly (deterministic pipeline, or neighbouring clean outputs chosen by the
auditor): the snapshot distribution *is* the input distribution.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
import warnings as _warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from snapaudit_jax import _validate
from snapaudit_jax.bounds import (
    clopper_pearson_lower,
    clopper_pearson_upper,
    empirical_bernstein_radius,
    hoeffding_radius,
)
from snapaudit_jax.estimators import ESTIMATORS, epsilon_gdp, epsilon_std, mu_lower
from snapaudit_jax.exact import exact_hit_probability, exact_score_grid, exact_score_probability, supports_exact
from snapaudit_jax.jem import KeywordSpaceAggregation, bucket_num_values
from snapaudit_jax.mechanisms import Attack, EmbeddingSpaceAggregation, Mechanism
from snapaudit_jax.simulate import MAX_TRIALS, SimulationCounts, simulate
from snapaudit_jax.snapshots import check_clean, dedupe

__all__ = ["audit", "AuditResult", "RateBound", "THREATS", "METHODS", "CLEAN_MODELS", "make_attack"]

THREATS = ("black", "white")
METHODS = ("simulate", "exact", "paper")
CLEAN_MODELS = ("sampled", "fixed")

_PILOT, _SELECT, _EVAL = 0, 1, 2
_PILOT_TRIALS = 1 << 14
VIOLATION_RTOL = 1e-6


@dataclasses.dataclass(frozen=True)
class RateBound:
    """A one-sided bound on one success rate (TPR: lower, FPR: upper).

    Attributes:
      estimate: point estimate of the rate.
      bound: the one-sided confidence bound.
      complement: ``1 - bound``, computed without cancellation.
      variance: variance entering the Bernstein term (``nan`` if none).
      variance_term / range_term / monte_carlo_term: parts of the radius
        (``bound = estimate -/+ sum of parts``, clipped to ``[0, 1]``) or,
        for Clopper-Pearson, ``monte_carlo_term = |bound - estimate|``.
      trials: evaluation trials (0 for exact rates).
      snapshots: evaluation snapshots.
      failure_probability: failure probability spent on this rate.
    """

    estimate: float
    bound: float
    complement: float
    variance: float
    variance_term: float
    range_term: float
    monte_carlo_term: float
    trials: int
    snapshots: int
    failure_probability: float


@dataclasses.dataclass(frozen=True)
class AuditResult:
    """Immutable, JSON-serialisable result of one audit (one ``eps_theory``)."""

    mechanism: str
    threat: str
    method: str
    estimator: str
    clean: str
    epsilon_theory: float
    delta: float
    epsilon_emp: float
    epsilon_std: float
    epsilon_gdp: float
    mu_emp: float
    tpr_hat: float
    fpr_hat: float
    tpr_low: float
    fpr_up: float
    violation: bool
    trials: int
    selection_trials: int
    snapshots: int
    selection_snapshots: int
    confidence: float
    target: int | None
    threshold: float | None
    tpr: RateBound
    fpr: RateBound
    noise: dict
    assumptions: str
    warnings: tuple[str, ...]
    seed: int | None
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return _jsonable(dataclasses.asdict(self))

    def to_json(self, **kwargs) -> str:
        return json.dumps(self.to_dict(), allow_nan=False, **kwargs)

    def summary(self) -> dict[str, Any]:
        """The fields of the command-line JSON contract."""
        d = self.to_dict()
        keys = (
            "mechanism", "threat", "method", "estimator", "epsilon_theory", "delta", "epsilon_emp", "mu_emp",
            "tpr_hat", "fpr_hat", "tpr_low", "fpr_up", "trials", "snapshots", "confidence", "violation", "seconds",
        )
        return {k: d[k] for k in keys}


def _jsonable(x):
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.bool_, bool)):
        return bool(x)
    if isinstance(x, (float, np.floating)):
        x = float(x)
        if math.isnan(x):
            return None
        if math.isinf(x):
            return "inf" if x > 0 else "-inf"
        return x
    return x


# ---------------------------------------------------------------------------
# Rate bounds
# ---------------------------------------------------------------------------


def _finish(estimate, estimate_complement, radius_parts, side, **kw) -> RateBound:
    radius = sum(radius_parts)
    if side == "lower":
        bound, complement = max(0.0, estimate - radius), min(1.0, estimate_complement + radius)
    else:
        bound, complement = min(1.0, estimate + radius), max(0.0, estimate_complement - radius)
    var_term, range_term, mc_term = radius_parts
    return RateBound(float(estimate), float(bound), float(complement), variance_term=float(var_term),
                     range_term=float(range_term), monte_carlo_term=float(mc_term), **kw)


def estimate(tpr: RateBound, fpr: RateBound, delta: float, estimator: str) -> tuple[float, float, float, float]:
    """``(epsilon_emp, epsilon_std, epsilon_gdp, mu_emp)`` from the two rate bounds."""
    kw = dict(tpr_low_complement=tpr.complement, fpr_up_complement=fpr.complement)
    eps_std = float(epsilon_std(tpr.bound, fpr.bound, delta, **kw))
    eps_gdp = float(epsilon_gdp(tpr.bound, fpr.bound, delta, **kw))
    mu = float(mu_lower(tpr.bound, fpr.bound, **kw))
    return (eps_gdp if estimator == "gdp" else eps_std), eps_std, eps_gdp, mu


def _sample_variance(x: np.ndarray) -> float:
    """Unbiased sample variance; exactly 0 for constant samples (no rounding residue)."""
    return float(np.var(x, ddof=1)) if np.ptp(x) > 0 else 0.0


def _bernstein_parts(variance: float, n: int, alpha: float) -> tuple[float, float]:
    log_term = math.log(2.0 / alpha)
    return math.sqrt(2.0 * max(variance, 0.0) * log_term / n), 7.0 * log_term / (3.0 * (n - 1))


def _bound_stratified(hits: np.ndarray, trials: np.ndarray, side: str, alpha: float) -> RateBound:
    rates = hits / trials
    n = rates.size
    var = _sample_variance(rates)
    var_term, range_term = _bernstein_parts(var, n, alpha)
    return _finish(float(rates.mean()), float(np.mean((trials - hits) / trials)), (var_term, range_term, 0.0), side,
                   variance=var,
                   trials=int(trials.sum()), snapshots=n, failure_probability=alpha)


def _bound_binomial(hits: int, trials: int, snapshots: int, side: str, alpha: float) -> RateBound:
    est = hits / trials
    # 1 - CP_lower(k, n) = CP_upper(n - k, n) and vice versa (relabel the outcomes).
    if side == "lower":
        bound = float(clopper_pearson_lower(hits, trials, alpha))
        complement = float(clopper_pearson_upper(trials - hits, trials, alpha))
    else:
        bound = float(clopper_pearson_upper(hits, trials, alpha))
        complement = float(clopper_pearson_lower(trials - hits, trials, alpha))
    return RateBound(est, bound, complement, math.nan, 0.0, 0.0, abs(bound - est), trials, snapshots, alpha)


def _bound_paper(counts: SimulationCounts, hits: np.ndarray, side: str, alpha: float) -> RateBound:
    # SnapAudit App. C.2 with alpha/4 per event: log(2 / (alpha/4)) = log(8/alpha).
    m = int(counts.trials.sum())
    unit_rate = np.where(counts.trials > 0, hits / np.maximum(counts.trials, 1), hits.sum() / m)
    per_snapshot = unit_rate[counts.unit_index]
    n = per_snapshot.size
    var = _sample_variance(per_snapshot)
    var_term, range_term = _bernstein_parts(var, n, alpha)
    mc_term = float(hoeffding_radius(m, alpha, two_sided=True))
    return _finish(float(hits.sum() / m), float((m - hits.sum()) / m), (var_term, range_term, mc_term), side,
                   variance=var,
                   trials=m, snapshots=n, failure_probability=alpha)


def _bound_exact(probabilities: tuple[np.ndarray, np.ndarray], clean: str, side: str, alpha: float) -> RateBound:
    p, q = probabilities
    est, est_c = float(np.mean(p)), float(np.mean(q))
    n = p.size
    if clean == "fixed":
        return RateBound(est, est, est_c, 0.0, 0.0, 0.0, 0.0, 0, n, 0.0)
    var = _sample_variance(p)
    var_term, range_term = _bernstein_parts(var, n, alpha)
    return _finish(est, est_c, (var_term, range_term, 0.0), side, variance=var, trials=0, snapshots=n,
                   failure_probability=alpha)


def _anticipated_bounds(tpr, fpr, *, method, clean, trials, n1, n0, alpha, tpr_c=None, fpr_c=None):
    """The bounds the evaluation would give at these rates (threshold search only).

    Returns ``(tpr_low, tpr_low_complement, fpr_up, fpr_up_complement)``.
    """
    tpr = np.asarray(tpr, np.float64)
    fpr = np.asarray(fpr, np.float64)
    tpr_c = 1.0 - tpr if tpr_c is None else np.asarray(tpr_c, np.float64)
    fpr_c = 1.0 - fpr if fpr_c is None else np.asarray(fpr_c, np.float64)
    if method == "exact" and clean == "fixed":
        return tpr, tpr_c, fpr, fpr_c
    if method == "exact":
        r1 = empirical_bernstein_radius(0.0, n1, alpha / 2)
        r0 = empirical_bernstein_radius(0.0, n0, alpha / 2)
    elif method == "paper":
        a = alpha / 4
        r1 = empirical_bernstein_radius(0.0, n1, a) + hoeffding_radius(trials, a, two_sided=True)
        r0 = empirical_bernstein_radius(0.0, n0, a) + hoeffding_radius(trials, a, two_sided=True)
    elif clean == "fixed":
        k1, k0 = np.round(tpr * trials), np.round(fpr * trials)
        return (
            clopper_pearson_lower(k1, trials, alpha / 2),
            clopper_pearson_upper(trials - k1, trials, alpha / 2),
            clopper_pearson_upper(k0, trials, alpha / 2),
            clopper_pearson_lower(trials - k0, trials, alpha / 2),
        )
    else:
        q1, q0 = -(-trials // n1), -(-trials // n0)
        r1 = empirical_bernstein_radius(tpr * tpr_c / q1, n1, alpha / 2)
        r0 = empirical_bernstein_radius(fpr * fpr_c / q0, n0, alpha / 2)
    return tpr - r1, tpr_c + r1, fpr + r0, fpr_c - r0


def _objective(tl, tl_c, fu, fu_c, estimator, delta):
    kw = dict(tpr_low_complement=np.clip(tl_c, 0.0, 1.0), fpr_up_complement=np.clip(fu_c, 0.0, 1.0))
    tl, fu = np.clip(tl, 0.0, 1.0), np.clip(fu, 0.0, 1.0)
    if estimator == "gdp":
        return np.asarray(mu_lower(tl, fu, **kw), np.float64)
    return np.asarray(epsilon_std(tl, fu, delta, **kw), np.float64)


# ---------------------------------------------------------------------------
# Attack design
# ---------------------------------------------------------------------------


def _best_threshold(objective: np.ndarray, youden: np.ndarray) -> int:
    """Index of the best objective; near-ties (GDP is flat in the threshold for Gaussian scores) go to
    the threshold with the largest TPR - FPR rather than to an extreme of the grid."""
    best = float(np.max(objective))
    if not np.isfinite(best):
        return int(np.argmax(objective))
    ties = objective >= best - 1e-9 * max(1.0, abs(best))
    return int(np.argmax(np.where(ties, youden, -np.inf)))


def make_attack(mechanism: Mechanism, reference_with, reference_without, target: int | None = None) -> Attack:
    """Builds an :class:`Attack` from two reference clean outputs.

    The default target is the release the canary moves towards
    (``Mechanism.default_target``).
    """
    r1 = np.asarray(reference_with, np.float64)
    r0 = np.asarray(reference_without, np.float64)
    context = {}
    if isinstance(mechanism, EmbeddingSpaceAggregation):
        context["candidates"] = np.asarray(mechanism.candidates)
    if target is None:
        target = type(mechanism).default_target(r1, r0, **context)
    num = type(mechanism).num_targets(r1.shape, **context)
    if not isinstance(target, (int, np.integer)) or not 0 <= int(target) < num:
        raise ValueError(f"target must be an integer in [0, {num}), got {target!r}")
    return Attack(jnp.asarray(r1, jnp.float32), jnp.asarray(r0, jnp.float32), int(target))


def _assumptions(method: str, clean: str, threat: str, estimator: str, mechanism: Mechanism) -> str:
    parts = []
    if method == "paper":
        parts.append(
            "SnapAudit App. C.2 radius: empirical Bernstein over snapshots + Hoeffding over trials, "
            "alpha/4 per event; sigma^2 is the plug-in variance of simulated per-distinct-snapshot rates "
            "(exact when all snapshots of a hypothesis are identical)."
        )
    elif clean == "fixed":
        parts.append("Clean outputs are fixed: the snapshots are the exact input distribution of the DP noise stage.")
        parts.append(
            "Exact success probabilities: no statistical error."
            if method == "exact"
            else "Trials are i.i.d.; one-sided Clopper-Pearson bound on each rate, alpha/2 each."
        )
    else:
        parts.append("Snapshots are i.i.d. draws of the clean stage.")
        parts.append(
            "Exact h_b per snapshot; one-sided empirical Bernstein bound (Maurer & Pontil 2009) over snapshots, "
            "alpha/2 per rate."
            if method == "exact"
            else "Every snapshot gets the same number of trials; one-sided empirical Bernstein bound (Maurer & Pontil "
            "2009) on the per-snapshot success rates covers snapshot and Monte Carlo error, alpha/2 per rate."
        )
    if threat == "white":
        parts.append(
            "The threshold was chosen from exact score distributions of the selection clean outputs, without "
            "evaluation data."
            if supports_exact(mechanism, "white")
            else "The threshold was chosen on selection trials independent of the evaluation trials."
        )
    if estimator == "gdp":
        note = "" if mechanism.gaussian else " (not a Gaussian mechanism: this assumption is doubtful)"
        parts.append("epsilon_emp from the GDP conversion assumes the mechanism is mu-GDP for some mu" + note + ".")
    else:
        parts.append("epsilon_emp from the standard estimator needs no further assumption.")
    return " ".join(parts)


# ---------------------------------------------------------------------------
# The audit
# ---------------------------------------------------------------------------


def _per_snapshot_pair(fn, snapshots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Evaluates ``fn -> (p, 1 - p)`` once per distinct snapshot and expands to every snapshot."""
    distinct, inverse, _ = dedupe(snapshots)
    p, q = fn(distinct)
    return np.asarray(p)[inverse], np.asarray(q)[inverse]


def is_violation(epsilon_emp: float, epsilon_theory: float) -> bool:
    """``epsilon_emp > epsilon_theory`` beyond the numerical tolerance of the conversions (1e-6 relative).

    Exact audits of tight mechanisms give ``epsilon_emp == epsilon_theory`` up
    to root-finding error; that equality is not a violation.
    """
    return bool(epsilon_emp > epsilon_theory * (1.0 + VIOLATION_RTOL))


@dataclasses.dataclass(frozen=True)
class _Run:
    """What the stages of one audit share."""

    mechanism: Mechanism
    attack: Attack
    method: str
    clean: str
    estimator: str
    delta: float
    alpha: float
    key: jax.Array
    devices: Any
    label: str | None  # progress-bar label, None for silence

    def stream(self, pass_id: int, hypothesis: int) -> jax.Array:
        return jax.random.fold_in(jax.random.fold_in(self.key, pass_id), hypothesis)

    def progress(self, suffix: str) -> str | None:
        return None if self.label is None else f"{self.label} {suffix}"


def _check_snapshots(mechanism: Mechanism, with_canary, without_canary):
    """Validated ``(mechanism, x1, x0)``; KSA gets a static bound on distinct counts that covers them."""
    candidates = np.asarray(mechanism.candidates) if isinstance(mechanism, EmbeddingSpaceAggregation) else None
    x1 = check_clean("with_canary", with_canary, mechanism=mechanism.name, candidates=candidates)
    x0 = check_clean("without_canary", without_canary, mechanism=mechanism.name, candidates=candidates)
    if x1.shape[1:] != x0.shape[1:]:
        raise ValueError(f"with_canary has shape {x1.shape[1:]} per snapshot but without_canary has {x0.shape[1:]}")
    if isinstance(mechanism, KeywordSpaceAggregation):
        if mechanism.top_k > x1.shape[1]:
            raise ValueError(f"top_k must be <= the vocabulary size {x1.shape[1]}, got {mechanism.top_k}")
        needed = bucket_num_values(np.concatenate([x1, x0]))
        if mechanism.num_values is None or mechanism.num_values < needed:
            mechanism = mechanism.with_static(num_values=needed)
    return mechanism, x1, x0


def _sensitivity_warnings(mechanism: Mechanism, attack: Attack, sensitivity: float | None) -> list[str]:
    if sensitivity is None:
        return []
    dist = type(mechanism).neighbour_distance(np.asarray(attack.reference_with), np.asarray(attack.reference_without))
    if dist <= float(sensitivity) * (1.0 + 1e-6):
        return []
    msg = (
        f"the reference clean outputs are {dist:.6g} apart but the noise is calibrated for sensitivity "
        f"{float(sensitivity):.6g}: if they come from neighbouring contexts, the claimed sensitivity is too small"
    )
    _warnings.warn(msg, stacklevel=3)
    return [msg]


def _choose_threshold(run: _Run, selection, evaluation, eval_trials: int, selection_trials: int, bins: int) -> float:
    """White-box threshold from the selection data only.

    With exact score distributions (PV, ESA, PoE) the rates of the selection
    clean outputs are computed, so no trials are spent; otherwise a pilot run
    fixes a histogram range and ``selection_trials`` independent trials fill it.
    Each threshold is scored by the bound the evaluation would give.
    """
    mech, attack = run.mechanism, run.attack
    sel1, sel0 = selection
    if not selection_trials:
        candidates = exact_score_grid(mech, np.concatenate([sel1, sel0]), attack)
        (tpr, tpr_c), (fpr, fpr_c) = (
            tuple(np.mean(part, axis=0) for part in _per_snapshot_pair(
                lambda x: exact_score_probability(mech, x, attack, candidates), sel))
            for sel in (sel1, sel0)
        )
    else:
        pilots = [
            simulate(run.stream(_PILOT, b), mech, attack, sel, trials=_PILOT_TRIALS, per_unit=False,
                     track_scores=True, devices=run.devices)
            for b, sel in ((1, sel1), (0, sel0))
        ]
        lo = min(p.score_min for p in pilots)
        hi = max(p.score_max for p in pilots)
        if not (math.isfinite(lo) and math.isfinite(hi)):
            raise ValueError(f"white-box scores are not finite (range {lo}, {hi}): degenerate attack references")
        span = hi - lo if hi > lo else 1.0
        lo, hi = lo - 0.5 * span, hi + 0.5 * span
        hists = [
            simulate(run.stream(_SELECT, b), mech, attack, sel, trials=selection_trials, per_unit=False,
                     histogram=(lo, hi, bins), devices=run.devices, progress=run.progress(f"select b={b}")).histogram
            for b, sel in ((1, sel1), (0, sel0))
        ]
        # #(score >= edge_j) = mass of bins j+1.. (bin 0 is the underflow).
        k1 = np.cumsum(hists[0][::-1])[::-1][1:]
        k0 = np.cumsum(hists[1][::-1])[::-1][1:]
        n = selection_trials
        tpr, tpr_c, fpr, fpr_c = k1 / n, (n - k1) / n, k0 / n, (n - k0) / n
        candidates = lo + (hi - lo) / bins * np.arange(bins + 1)
    tl, tl_c, fu, fu_c = _anticipated_bounds(
        tpr, fpr, method=run.method, clean=run.clean, trials=eval_trials, n1=len(evaluation[0]),
        n0=len(evaluation[1]), alpha=run.alpha, tpr_c=tpr_c, fpr_c=fpr_c,
    )
    if selection_trials:
        # Rates seen on few selection trials are noisy: score each threshold by
        # the worse of its selection-data bound and the anticipated evaluation bound.
        a = run.alpha / 2
        tl = np.minimum(tl, clopper_pearson_lower(k1, n, a))
        tl_c = np.maximum(tl_c, clopper_pearson_upper(n - k1, n, a))
        fu = np.maximum(fu, clopper_pearson_upper(k0, n, a))
        fu_c = np.minimum(fu_c, clopper_pearson_lower(n - k0, n, a))
    objective = _objective(tl, tl_c, fu, fu_c, run.estimator, run.delta)
    return float(candidates[_best_threshold(objective, tpr - fpr)])


def _evaluate(run: _Run, evaluation, trials: int, threshold: float | None) -> tuple[RateBound, RateBound, int]:
    """``(TPR bound, FPR bound, trials per hypothesis)`` on the evaluation snapshots."""
    mech, attack, alpha = run.mechanism, run.attack, run.alpha
    ev1, ev0 = evaluation
    if run.method == "exact":
        if threshold is None:
            rates = [_per_snapshot_pair(lambda x: exact_hit_probability(mech, x, attack), ev) for ev in (ev1, ev0)]
        else:
            rates = [
                _per_snapshot_pair(lambda x: exact_score_probability(mech, x, attack, threshold), ev)
                for ev in (ev1, ev0)
            ]
        return _bound_exact(rates[0], run.clean, "lower", alpha / 2), _bound_exact(rates[1], run.clean, "upper",
                                                                                    alpha / 2), 0
    scheme = "bootstrap" if (run.method == "paper" or run.clean == "fixed") else "stratified"
    counts = [
        simulate(run.stream(_EVAL, b), mech, attack, ev, trials=trials, scheme=scheme,
                 per_unit=(run.method == "paper"), threshold=threshold, devices=run.devices,
                 progress=run.progress(f"b={b}"))
        for b, ev in ((1, ev1), (0, ev0))
    ]
    hits = [c.hits if threshold is None else c.score_hits for c in counts]
    if run.method == "paper":
        bounds = (_bound_paper(counts[0], hits[0], "lower", alpha / 4), _bound_paper(counts[1], hits[1], "upper",
                                                                                      alpha / 4))
    elif scheme == "stratified":
        bounds = (_bound_stratified(hits[0], counts[0].trials, "lower", alpha / 2),
                  _bound_stratified(hits[1], counts[1].trials, "upper", alpha / 2))
    else:
        bounds = (_bound_binomial(int(hits[0].sum()), counts[0].total_trials, len(ev1), "lower", alpha / 2),
                  _bound_binomial(int(hits[1].sum()), counts[1].total_trials, len(ev0), "upper", alpha / 2))
    return bounds[0], bounds[1], counts[0].total_trials


def audit(
    mechanism: Mechanism,
    with_canary,
    without_canary,
    *,
    epsilon_theory: float,
    delta: float = 1e-5,
    threat: str = "black",
    method: str = "simulate",
    estimator: str | None = None,
    trials: int = 1_000_000,
    confidence: float = 0.95,
    clean: str = "sampled",
    target: int | None = None,
    attack: Attack | None = None,
    selection_snapshots: int | None = None,
    selection_fraction: float = 0.2,
    bins: int = 2048,
    sensitivity: float | None = None,
    seed: int = 0,
    devices=None,
    progress: bool = False,
) -> AuditResult:
    """Audits one mechanism at one claimed ``(epsilon_theory, delta)``.

    Args:
      mechanism: a calibrated mechanism (``PrivateVoting.calibrated(...)`` etc.).
      with_canary: clean outputs with the canary, ``(n1, ...)``.
      without_canary: clean outputs without the canary, ``(n0, ...)``.
      epsilon_theory: the claimed ``eps``.
      delta: the claimed ``delta`` (also used by the estimators).
      threat: ``"black"`` (decision: release == target) or ``"white"``
        (decision: LR score >= threshold).
      method: ``"simulate"``, ``"exact"`` or ``"paper"`` (module docstring).
      estimator: ``"gdp"`` or ``"std"``; default ``"gdp"`` for Gaussian
        mechanisms (PV, ESA) and ``"std"`` otherwise.
      trials: DP-noise trials per hypothesis (white-box: selection + evaluation).
      confidence: ``gamma``; bounds hold jointly with probability ``>= gamma``.
      clean: ``"sampled"`` or ``"fixed"`` (module docstring).
      target: the release signalling "canary present" (default: the one the
        canary moves towards).
      attack: a complete :class:`Attack` (overrides ``target``).
      selection_snapshots: ``clean="sampled"``: snapshots per hypothesis held
        out to design the attack (default 1 black-box, ``ceil(n/10)`` white-box;
        0 when the attack is fully given for the black-box threat).
      selection_fraction: white-box: share of ``trials`` used to pick the threshold.
      bins: histogram bins for the white-box threshold search.
      sensitivity: the sensitivity the mechanism was calibrated for; when
        given, a warning is recorded if the references are farther apart.
      seed: PRNG seed.
      devices: devices to shard the simulation over (default: all).
      progress: progress bar on stderr.

    Returns:
      :class:`AuditResult`.

    Raises:
      ValueError: invalid arguments or snapshots (the message names the field).

    Guarantees:
      ``tpr_low <= TPR`` and ``fpr_up >= FPR`` hold simultaneously with
      probability at least ``confidence`` under the assumptions in
      ``result.assumptions``; then ``epsilon_std`` is a lower bound on the
      ``eps`` of every ``(eps, delta)`` guarantee the mechanism satisfies,
      and ``epsilon_gdp`` is one if the mechanism is ``mu``-GDP.
    """
    start = time.perf_counter()
    if not isinstance(mechanism, Mechanism):
        raise ValueError(f"mechanism must be a snapaudit_jax Mechanism, got {type(mechanism).__name__}")
    epsilon_theory = _validate.positive_float("epsilon_theory", epsilon_theory)
    delta = _validate.open_unit("delta", delta)
    threat = _validate.choice("threat", threat, THREATS)
    method = _validate.choice("method", method, METHODS)
    clean = _validate.choice("clean", clean, CLEAN_MODELS)
    confidence = _validate.open_unit("confidence", confidence)
    trials = _validate.positive_int("trials", trials)
    if trials > MAX_TRIALS:
        raise ValueError(f"trials must be <= {MAX_TRIALS} per hypothesis, got {trials}")
    selection_fraction = _validate.open_unit("selection_fraction", selection_fraction)
    bins = _validate.positive_int("bins", bins, minimum=2)
    if estimator is None:
        estimator = "gdp" if mechanism.gaussian else "std"
    estimator = _validate.choice("estimator", estimator, ESTIMATORS)
    if method == "exact" and not supports_exact(mechanism, threat):
        raise ValueError(
            f"method='exact' has no closed form for {mechanism.name} with the {threat}-box attack"
            + (" (ESA needs exactly 2 candidates)" if isinstance(mechanism, EmbeddingSpaceAggregation) else "")
            + "; use method='simulate'"
        )
    mechanism, x1, x0 = _check_snapshots(mechanism, with_canary, without_canary)

    # Attack design uses held-out selection snapshots when the snapshots are random draws.
    needs_selection = clean == "sampled" and (threat == "white" or (attack is None and target is None))
    s = 0
    if needs_selection:
        if selection_snapshots is None:
            selection_snapshots = 1 if threat == "black" else max(1, math.ceil(min(len(x1), len(x0)) / 10))
        s = _validate.positive_int("selection_snapshots", selection_snapshots)
    if clean == "sampled" or method == "paper":
        for name, n in (("with_canary", len(x1)), ("without_canary", len(x0))):
            if n - s < 2:
                raise ValueError(
                    f"{name} needs at least {s + 2} snapshots ({s} for attack selection + 2 for the Bernstein bound), "
                    f"got {n}"
                )
    selection = (x1[:s], x0[:s]) if s else (x1, x0)
    evaluation = (x1[s:], x0[s:]) if s else (x1, x0)
    if attack is None:
        attack = make_attack(mechanism, selection[0].mean(axis=0), selection[1].mean(axis=0), target)
    messages = _sensitivity_warnings(mechanism, attack, sensitivity)

    run = _Run(
        mechanism=mechanism, attack=attack, method=method, clean=clean, estimator=estimator, delta=delta,
        alpha=1.0 - confidence, key=jax.random.key(seed), devices=devices,
        label=f"{mechanism.name} eps={epsilon_theory:g}" if progress else None,
    )
    threshold, selection_trials = None, 0
    if threat == "white":
        if not supports_exact(mechanism, "white"):
            selection_trials = max(1, int(round(selection_fraction * trials)))
            if trials - selection_trials < 1:
                raise ValueError(f"trials={trials} leaves no evaluation trials after selection")
        threshold = _choose_threshold(run, selection, evaluation, trials - selection_trials, selection_trials, bins)
    tpr_b, fpr_b, eval_trials = _evaluate(run, evaluation, trials - selection_trials, threshold)

    eps_emp, eps_std, eps_gdp, mu = estimate(tpr_b, fpr_b, delta, estimator)
    noise = {}
    for field in ("sigma", "scale"):
        if hasattr(mechanism, field):
            noise[field] = float(getattr(mechanism, field))
    if sensitivity is not None:
        noise["sensitivity"] = float(sensitivity)
    return AuditResult(
        mechanism=mechanism.name,
        threat=threat,
        method=method,
        estimator=estimator,
        clean=clean,
        epsilon_theory=epsilon_theory,
        delta=delta,
        epsilon_emp=eps_emp,
        epsilon_std=eps_std,
        epsilon_gdp=eps_gdp,
        mu_emp=mu,
        tpr_hat=tpr_b.estimate,
        fpr_hat=fpr_b.estimate,
        tpr_low=tpr_b.bound,
        fpr_up=fpr_b.bound,
        violation=is_violation(eps_emp, epsilon_theory),
        trials=int(eval_trials),
        selection_trials=int(selection_trials),
        snapshots=int(min(len(x1), len(x0))),
        selection_snapshots=int(s),
        confidence=confidence,
        target=int(attack.target),
        threshold=threshold,
        tpr=tpr_b,
        fpr=fpr_b,
        noise=noise,
        assumptions=_assumptions(method, clean, threat, estimator, mechanism),
        warnings=tuple(messages),
        seed=int(seed),
        seconds=time.perf_counter() - start,
    )
