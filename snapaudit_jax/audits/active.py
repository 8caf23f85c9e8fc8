"""Phase C: attack design, simulation and valid empirical-epsilon lower bounds.

:func:`audit` is the engine's entry point. It

1. designs the attack (target release, white-box reference outputs) and, for
   the white-box threat, the decision threshold -- always on data that the
   final bounds do not use (selection snapshots and/or selection trials);
2. estimates TPR and FPR on the evaluation data (simulation or exact ``h_b``);
3. turns them into one-sided bounds ``TPR_low``, ``FPR_up`` that hold
   simultaneously with probability at least ``confidence``;
4. hands them to the estimation layer (:func:`snapaudit_jax.estimation.audit_result`), which turns the
   pair into ``eps_emp`` with the assumption-free standard estimator (or, with ``method="exact"`` and
   fixed clean outputs, the release's exact privacy profile), tests the ``mu``-GDP claim under
   ``estimator="gdp"``, and decides ``violation`` from valid estimates only.

Bounding methods (``method`` x ``clean``):

============  ============================================================  ===========================
method        ``clean="sampled"`` (snapshots are i.i.d. LLM draws)           ``clean="fixed"``
============  ============================================================  ===========================
simulate      stratified trials; one-sided empirical Bernstein on the        bootstrap trials; exact
              per-snapshot success rates (covers snapshot *and* Monte        Clopper-Pearson on each rate
              Carlo error), ``alpha/2`` per rate
exact         exact ``h_b`` per snapshot; empirical Bernstein over           exact rates, no error; exact
              snapshots, ``alpha/2`` per rate                                privacy profile of the release
paper         SnapAudit App. C.2: Bernstein(snapshots) + Hoeffding(MC),      (same)
              ``alpha/4`` per event; ``sigma^2`` is the plug-in variance
              of simulated per-distinct-snapshot rates: a heuristic,
              labelled so, never a violation
============  ============================================================  ===========================

``clean="fixed"`` audits the DP noise stage on clean outputs that are known
exactly (deterministic pipeline, or neighbouring clean outputs chosen by the
auditor): the snapshot distribution *is* the input distribution.
"""

from __future__ import annotations

import dataclasses
import math
import time
import warnings as _warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from snapaudit_jax.estimation.bounds import (
    clopper_pearson_lower,
    clopper_pearson_upper,
    empirical_bernstein_radius,
    hoeffding_radius,
)
from snapaudit_jax.estimation import (
    VIOLATION_RTOL,
    AuditResult,
    RateBound,
    TradeoffCurve,
    audit_result,
    bernstein_bound,
    binomial_bound,
    binomial_pair,
    certified_curve,
    check_estimator,
    exact_rate,
    is_violation,
    objective,
    paper_bound,
    select_index,
)
from snapaudit_jax.simulation.exact import (
    exact_hit_probability,
    exact_release_epsilon,
    exact_score_grid,
    exact_score_probability,
    supports_exact,
)
from snapaudit_jax.mechanisms.ksa import KeywordSpaceAggregation, bucket_num_values
from snapaudit_jax.mechanisms import Attack, EmbeddingSpaceAggregation, Mechanism
from snapaudit_jax.simulation.trials import MAX_TRIALS, simulate
from snapaudit_jax.simulation.snapshots import check_clean, dedupe
from snapaudit_jax.utils import validate
from snapaudit_jax.utils.errors import InputError

__all__ = ["audit", "AuditResult", "RateBound", "THREATS", "METHODS", "CLEAN_MODELS", "CURVE_POINTS", "make_attack",
           "is_violation", "VIOLATION_RTOL"]

THREATS = ("black", "white")
METHODS = ("simulate", "exact", "paper")
CLEAN_MODELS = ("sampled", "fixed")
CURVE_POINTS = 24  # white-box certified trade-off curve: thresholds fixed on selection data

_PILOT, _SELECT, _EVAL = 0, 1, 2
_PILOT_TRIALS = 1 << 14


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
        tl, tl_c = binomial_pair(k1, trials, "lower", alpha / 2)
        fu, fu_c = binomial_pair(k0, trials, "upper", alpha / 2)
        return tl, tl_c, fu, fu_c
    else:
        q1, q0 = -(-trials // n1), -(-trials // n0)
        r1 = empirical_bernstein_radius(tpr * tpr_c / q1, n1, alpha / 2)
        r0 = empirical_bernstein_radius(fpr * fpr_c / q0, n0, alpha / 2)
    return tpr - r1, tpr_c + r1, fpr + r0, fpr_c - r0


# ---------------------------------------------------------------------------
# Attack design
# ---------------------------------------------------------------------------


def make_attack(mechanism: Mechanism, reference_with, reference_without, target: int | None = None) -> Attack:
    """Builds an :class:`Attack` from two reference clean outputs.

    Args:
      mechanism: the mechanism (ESA supplies its candidates for the default target).
      reference_with: reference clean output with the canary (shape of one clean output).
      reference_without: reference clean output without it.
      target: the release signalling "canary present"; ``None``: the release the canary moves towards
        (``Mechanism.default_target``).

    Returns:
      The :class:`Attack` with float32 references.

    Raises:
      InputError: ``target`` is not an integer in ``[0, num_targets)``.
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
        raise InputError(f"target must be an integer in [0, {num}), got {target!r}")
    return Attack(jnp.asarray(r1, jnp.float32), jnp.asarray(r0, jnp.float32), int(target))


def _assumptions(method: str, clean: str, threat: str, mechanism: Mechanism, curve: bool) -> list[str]:
    parts = []
    if method == "paper":
        parts.append(
            "SnapAudit App. C.2 radius: empirical Bernstein over snapshots + Hoeffding over trials, "
            "alpha/4 per event; sigma^2 is the plug-in variance of simulated per-distinct-snapshot rates, which "
            "Maurer-Pontil's theorem does not cover (exact only when all snapshots of a hypothesis are identical)."
        )
    elif clean == "fixed":
        parts.append("Clean outputs are fixed: the snapshots are the exact input distribution of the DP noise stage "
                     "(with several distinct snapshots, the bound is for the mixture over them).")
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
        if curve:
            parts.append("The certified trade-off curve uses a threshold grid fixed on the same selection data, "
                         "Bonferroni-corrected over its 2G rates (exact rates need no correction); epsilon_curve "
                         "holds at the stated confidence on its own, not jointly with epsilon_emp.")
    return parts


# ---------------------------------------------------------------------------
# The audit
# ---------------------------------------------------------------------------


def _per_snapshot_pair(fn, snapshots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Evaluates ``fn -> (p, 1 - p)`` once per distinct snapshot and expands to every snapshot."""
    distinct, inverse, _ = dedupe(snapshots)
    p, q = fn(distinct)
    return np.asarray(p)[inverse], np.asarray(q)[inverse]


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
        raise InputError(f"with_canary has shape {x1.shape[1:]} per snapshot but without_canary has {x0.shape[1:]}")
    if isinstance(mechanism, KeywordSpaceAggregation):
        if mechanism.top_k > x1.shape[1]:
            raise InputError(f"top_k must be <= the vocabulary size {x1.shape[1]}, got {mechanism.top_k}")
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


def _curve_grid(candidates: np.ndarray, tpr, tpr_c, fpr, points: int, chosen: int) -> np.ndarray:
    """``points`` thresholds from ``candidates`` whose selection FPR (and 1 - TPR) are log-spaced.

    The first inequality of DP is tight where FPR is small, the second where 1 - TPR is small: a third
    of the grid targets each (log-spaced), the last third spreads FPR over the body of the curve. The
    single chosen threshold is always included.
    """
    picks = {chosen}
    third = (points - 1) // 3  # at most 1 + 3 * third <= points thresholds
    fpr = np.asarray(fpr, np.float64)
    for rate in (fpr, np.asarray(tpr_c, np.float64)):
        positive = rate[rate > 0]
        if positive.size == 0:
            continue
        lo = max(float(positive.min()), 1e-300)
        for target in np.geomspace(0.5, lo, third) if lo < 0.5 else [0.5][:third]:
            picks.add(int(np.argmin(np.abs(np.log(np.maximum(rate, 1e-300)) - math.log(target)))))
    for target in np.linspace(0.05, 0.95, third):  # the body of the curve, where small-eps claims fail
        picks.add(int(np.argmin(np.abs(fpr - target))))
    return np.unique(np.asarray(candidates, np.float64)[sorted(picks)])


def _choose_threshold(run: _Run, selection, evaluation, eval_trials: int, selection_trials: int, bins: int,
                      curve_points: int) -> tuple[float, np.ndarray | None]:
    """White-box threshold and curve grid from the selection data only.

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
            raise InputError(f"white-box scores are not finite (range {lo}, {hi}): degenerate attack references")
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
    chosen = select_index(objective(tl, tl_c, fu, fu_c, run.estimator, run.delta), tpr - fpr)
    grid = None
    if curve_points and run.method != "paper":
        grid = _curve_grid(candidates, tpr, tpr_c, fpr, curve_points, chosen)
    return float(candidates[chosen]), grid


def _curve(rates, hypothesis_trials, kind: str, grid: np.ndarray, alpha: float, delta: float) -> TradeoffCurve:
    """Simultaneous bounds at every grid threshold (Bonferroni over ``2 G`` rates unless exact)."""
    g = grid.size
    a = alpha / (2 * g)
    bounds = []
    for side, r in zip(("lower", "upper"), rates):
        if kind == "exact":
            bounds.append((np.mean(r[0], axis=0), np.mean(r[1], axis=0)))
        elif kind == "binomial":
            bounds.append(binomial_pair(r, hypothesis_trials, side, a))
        else:  # per-snapshot rates (n, G) and complements: Bernstein per column
            cols = [bernstein_bound(r[0][:, j], r[1][:, j], side, a) for j in range(g)]
            bounds.append((np.array([c.bound for c in cols]), np.array([c.complement for c in cols])))
    (tl, tl_c), (fu, fu_c) = bounds
    return certified_curve(grid, tl, tl_c, fu, fu_c, delta=delta, alpha_per_rate=0.0 if kind == "exact" else a,
                           exact=kind == "exact")


def _evaluate(run: _Run, evaluation, trials: int, threshold: float | None, grid: np.ndarray | None):
    """``(TPR bound, FPR bound, trials per hypothesis, curve or None)`` on the evaluation snapshots."""
    mech, attack, alpha = run.mechanism, run.attack, run.alpha
    ev1, ev0 = evaluation
    # White-box: one threshold array, column 0 the chosen threshold, the rest the curve grid.
    thr = None if threshold is None else np.concatenate([[threshold], grid if grid is not None else []])
    if run.method == "exact":
        if threshold is None:
            rates = [_per_snapshot_pair(lambda x: exact_hit_probability(mech, x, attack), ev) for ev in (ev1, ev0)]
            curve = None
        else:
            full = [_per_snapshot_pair(lambda x: exact_score_probability(mech, x, attack, thr), ev)
                    for ev in (ev1, ev0)]
            rates = [(p[:, 0], q[:, 0]) for p, q in full]
            curve = None
            if grid is not None:
                cols = [(p[:, 1:], q[:, 1:]) for p, q in full]
                kind = "exact" if run.clean == "fixed" else "bernstein"
                curve = _curve(cols, 0, kind, grid, alpha, run.delta)
        if run.clean == "fixed":
            return exact_rate(*rates[0]), exact_rate(*rates[1]), 0, curve
        return (bernstein_bound(*rates[0], "lower", alpha / 2), bernstein_bound(*rates[1], "upper", alpha / 2), 0,
                curve)
    scheme = "bootstrap" if (run.method == "paper" or run.clean == "fixed") else "stratified"
    counts = [
        simulate(run.stream(_EVAL, b), mech, attack, ev, trials=trials, scheme=scheme,
                 per_unit=(run.method == "paper"), threshold=thr, devices=run.devices,
                 progress=run.progress(f"b={b}"))
        for b, ev in ((1, ev1), (0, ev0))
    ]
    hits = [c.hits if threshold is None else c.score_hits[:, 0] for c in counts]
    curve = None
    if run.method == "paper":
        bounds = []
        for c, h, side in zip(counts, hits, ("lower", "upper")):
            m = int(c.trials.sum())
            unit_rate = np.where(c.trials > 0, h / np.maximum(c.trials, 1), h.sum() / m)
            bounds.append(paper_bound(unit_rate[c.unit_index], h.sum() / m, (m - h.sum()) / m, m, side, alpha / 4))
    elif scheme == "stratified":
        bounds = [bernstein_bound(h / c.trials, (c.trials - h) / c.trials, side, alpha / 2, trials=int(c.trials.sum()))
                  for c, h, side in zip(counts, hits, ("lower", "upper"))]
        if grid is not None:
            cols = [(c.score_hits[:, 1:] / c.trials[:, None], (c.trials[:, None] - c.score_hits[:, 1:]) /
                     c.trials[:, None]) for c in counts]
            curve = _curve(cols, 0, "bernstein", grid, alpha, run.delta)
    else:
        bounds = [binomial_bound(int(h.sum()), c.total_trials, side, alpha / 2, snapshots=len(ev))
                  for c, h, side, ev in zip(counts, hits, ("lower", "upper"), (ev1, ev0))]
        if grid is not None:
            totals = [c.score_hits[:, 1:].sum(axis=0) for c in counts]
            curve = _curve(totals, counts[0].total_trials, "binomial", grid, alpha, run.delta)
    return bounds[0], bounds[1], counts[0].total_trials, curve


def _single_distinct(x: np.ndarray) -> bool:
    return len(dedupe(x)[0]) == 1


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
    curve_points: int = CURVE_POINTS,
    seed: int = 0,
    key: jax.Array | None = None,
    stream: int = 0,
    devices=None,
    progress: bool = False,
) -> AuditResult:
    """Audits one mechanism at one claimed ``(epsilon_theory, delta)``.

    Args:
      mechanism: a calibrated mechanism (``PrivateVoting.calibrated(...)`` etc.).
      with_canary: clean outputs with the canary, ``(n1, length)`` (ESA: ``(n1, d)`` mean embeddings).
      without_canary: clean outputs without the canary, ``(n0, length)``.
      epsilon_theory: the claimed ``eps`` (> 0).
      delta: the claimed ``delta`` in ``(0, 1)`` (also used by the estimators).
      threat: ``"black"`` (decision: release == target) or ``"white"`` (decision: LR score >= threshold).
      method: ``"simulate"``, ``"exact"`` or ``"paper"`` (module docstring; ``"paper"`` is a heuristic).
      estimator: ``"std"`` (default, assumption-free, every mechanism) or ``"gdp"`` (Gaussian mechanisms only:
        audits the ``mu``-GDP claim ``mu = sensitivity / sigma``).
      trials: DP-noise trials per hypothesis (white-box: selection + evaluation), at most ``MAX_TRIALS``.
      confidence: ``gamma`` in ``(0, 1)``; the bounds hold jointly with probability ``>= gamma``.
      clean: ``"sampled"`` or ``"fixed"`` (module docstring).
      target: the release signalling "canary present" (default: the one the canary moves towards).
      attack: a complete :class:`Attack` (overrides ``target``).
      selection_snapshots: ``clean="sampled"``: snapshots per hypothesis held out to design the attack (default 1
        black-box, ``ceil(n/10)`` white-box; 0 when the attack is fully given for the black-box threat).
      selection_fraction: white-box without exact score distributions: share of ``trials`` used to pick the
        threshold, in ``(0, 1)``.
      bins: histogram bins (>= 2) for the white-box threshold search.
      sensitivity: the sensitivity the mechanism was calibrated for; when given, a warning is recorded if the
        references are farther apart, and the ``mu``-GDP claim ``sensitivity / sigma`` is tested under
        ``estimator="gdp"``.
      curve_points: white-box: thresholds of the certified trade-off curve (0: none).
      seed: PRNG seed (used when ``key`` is not given).
      key: PRNG key of this audit (e.g. ``fold_in(key, row)`` for one of several claims).
      stream: the row index recorded with ``key`` (informational).
      devices: devices to shard the simulation over (default: all).
      progress: progress bar on stderr.

    Returns:
      :class:`AuditResult`.

    Raises:
      InputError: invalid arguments or snapshots (the message names the field), too few snapshots (at least
        ``selection_snapshots + 2`` per hypothesis where a Bernstein bound is used), or ``method="exact"`` without a
        closed form for this mechanism and threat.

    Guarantees:
      ``tpr_low <= TPR`` and ``fpr_up >= FPR`` hold simultaneously with probability at least ``confidence`` under
      the assumptions in ``result.assumptions``; then ``epsilon_emp`` is a lower bound on the ``eps`` of every
      ``(eps, delta)`` guarantee of the release, and ``mu_emp`` on the ``mu`` of every ``mu``-GDP guarantee.
      ``method="paper"`` is the paper's heuristic radius and never sets ``violation``. With ``method="exact"`` and
      ``clean="fixed"`` ``epsilon_emp`` is the release's exact privacy profile where it has a closed form
      (``epsilon_profile``).
    """
    start = time.perf_counter()
    if not isinstance(mechanism, Mechanism):
        raise InputError(f"mechanism must be a snapaudit_jax Mechanism, got {type(mechanism).__name__}")
    epsilon_theory = validate.positive_float("epsilon_theory", epsilon_theory)
    delta = validate.open_unit("delta", delta)
    threat = validate.choice("threat", threat, THREATS)
    method = validate.choice("method", method, METHODS)
    clean = validate.choice("clean", clean, CLEAN_MODELS)
    confidence = validate.confidence("confidence", confidence)
    trials = validate.positive_int("trials", trials)
    if trials > MAX_TRIALS:
        raise InputError(f"trials must be <= {MAX_TRIALS} per hypothesis, got {trials}")
    selection_fraction = validate.open_unit("selection_fraction", selection_fraction)
    bins = validate.positive_int("bins", bins, minimum=2)
    curve_points = validate.positive_int("curve_points", curve_points, minimum=0)
    estimator = check_estimator(estimator, mechanism.name, mechanism.gaussian)
    if method == "exact" and not supports_exact(mechanism, threat):
        raise InputError(
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
        s = validate.positive_int("selection_snapshots", selection_snapshots)
    if clean == "sampled" or method == "paper":
        for name, n in (("with_canary", len(x1)), ("without_canary", len(x0))):
            if n - s < 2:
                raise InputError(
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
        alpha=1.0 - confidence, key=jax.random.key(seed) if key is None else key, devices=devices,
        label=f"{mechanism.name} eps={epsilon_theory:g}" if progress else None,
    )
    threshold, selection_trials, grid = None, 0, None
    if threat == "white":
        if not supports_exact(mechanism, "white"):
            selection_trials = max(1, int(round(selection_fraction * trials)))
            if trials - selection_trials < 1:
                raise InputError(f"trials={trials} leaves no evaluation trials after selection")
        threshold, grid = _choose_threshold(run, selection, evaluation, trials - selection_trials, selection_trials,
                                            bins, curve_points)
    tpr_b, fpr_b, eval_trials, curve = _evaluate(run, evaluation, trials - selection_trials, threshold, grid)

    single_pair = clean == "fixed" and _single_distinct(evaluation[0]) and _single_distinct(evaluation[1])
    profile = None
    if method == "exact" and clean == "fixed":
        profile = exact_release_epsilon(mechanism, evaluation[0], evaluation[1], attack, threat, delta)
    noise = {}
    for field in ("sigma", "scale"):
        if hasattr(mechanism, field):
            noise[field] = float(getattr(mechanism, field))
    mu_claim = None
    if sensitivity is not None:
        noise["sensitivity"] = float(sensitivity)
        if mechanism.gaussian:
            mu_claim = float(sensitivity) / float(mechanism.sigma)
    return audit_result(
        mechanism=mechanism.name, threat=threat, method=method, estimator=estimator, clean=clean,
        epsilon_theory=epsilon_theory, delta=delta, tpr=tpr_b, fpr=fpr_b, confidence=confidence,
        assumptions=_assumptions(method, clean, threat, mechanism, curve is not None), trials=int(eval_trials),
        selection_trials=int(selection_trials), snapshots=int(min(len(x1), len(x0))), selection_snapshots=int(s),
        target=int(attack.target), threshold=threshold, noise=noise, warnings=tuple(messages), seed=int(seed),
        seconds=time.perf_counter() - start, mu_claim=mu_claim,
        gaussian_by_construction=bool(mechanism.gaussian and threat == "white" and single_pair and method != "paper"),
        epsilon_profile=profile, curve=curve, heuristic=method == "paper", stream=stream,
    )
