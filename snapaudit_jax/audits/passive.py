"""Passive black-box auditing: the end-to-end baseline.

A passive auditor cannot decompose the pipeline; it runs the whole private
pipeline ``n`` times per hypothesis and bounds TPR and FPR with exact
Clopper-Pearson intervals. Each run is an independent end-to-end draw, so the
bounds need no assumption about the clean stage.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from snapaudit_jax.estimation import (
    DEFAULT_ESTIMATOR,
    ESTIMATORS,
    AuditResult,
    Split,
    audit_result,
    binomial_bound,
    threshold_test,
)
from snapaudit_jax.mechanisms import Attack, Mechanism
from snapaudit_jax.utils.progress import Counter
from snapaudit_jax.utils import validate
from snapaudit_jax.utils.errors import InputError

__all__ = ["passive_audit", "passive_bounds", "mechanism_pipeline"]


def mechanism_pipeline(mechanism: Mechanism, clean_with, clean_without, attack: Attack) -> Callable:
    """An end-to-end pipeline for :func:`passive_audit` from one mechanism and fixed clean outputs.

    Args:
      mechanism: the mechanism.
      clean_with: one clean output with the canary.
      clean_without: one clean output without it.
      attack: the attack deciding ``hit`` and ``score``.

    Returns:
      ``pipeline(key, b) -> (hit, score)``: one trial on ``clean_with`` (``b = 1``) or ``clean_without``
      (``b = 0``), a bool and a float32 scalar.
    """
    clean = (jnp.asarray(clean_without, jnp.float32), jnp.asarray(clean_with, jnp.float32))

    def pipeline(key, b: int):
        prepared = mechanism.prepare(clean[b], attack)
        noise = mechanism.noise(key, 1, prepared)
        return mechanism.outcome(jax.tree_util.tree_map(lambda x: x[..., 0], noise), prepared, attack)

    return pipeline


@functools.lru_cache(maxsize=64)
def _vectorized(pipeline: Callable, b: int):
    """``jit(vmap)`` of one pipeline and hypothesis, cached so repeated audits do not retrace."""
    return jax.jit(jax.vmap(lambda stream, t: pipeline(jax.random.fold_in(stream, t), b), in_axes=(None, 0)))


def _run(pipeline, key, b: int, n: int, vectorized: bool, batch: int, bar: Counter, offset: int):
    stream = jax.random.fold_in(key, b)
    hits = np.empty(n, bool)
    scores = np.empty(n, np.float64)
    if vectorized:
        run = _vectorized(pipeline, b)
        for start in range(0, n, batch):
            h, s = run(stream, jnp.arange(start, start + batch))
            stop = min(n, start + batch)
            hits[start:stop] = np.asarray(h)[: stop - start]
            scores[start:stop] = np.asarray(s)[: stop - start]
            bar.update(offset + stop)
    else:
        for t in range(n):
            h, s = pipeline(jax.random.fold_in(stream, t), b)
            hits[t] = bool(h)
            scores[t] = float(s)
            bar.update(offset + t + 1)
    return hits, scores


def passive_audit(
    key: jax.Array,
    pipeline: Callable,
    *,
    trials: int,
    epsilon_theory: float,
    delta: float = 1e-5,
    threat: str = "black",
    estimator: str = DEFAULT_ESTIMATOR,
    confidence: float = 0.95,
    selection_fraction: float = 0.5,
    mu_claim: float | None = None,
    vectorized: bool = True,
    batch: int = 4096,
    name: str = "pipeline",
    progress: bool = False,
) -> AuditResult:
    """Passive audit of an end-to-end pipeline.

    Args:
      key: PRNG key; run ``t`` of hypothesis ``b`` uses ``fold_in(fold_in(key, b), t)``.
      pipeline: ``(key, b) -> (hit, score)`` with ``b = 1`` the canary context; ``hit`` is the black-box decision,
        ``score`` the white-box statistic (larger means "canary present"; return 0 if there is none).
      trials: end-to-end runs per hypothesis (>= 1).
      epsilon_theory: the claimed ``eps`` (> 0).
      delta: the claimed ``delta`` in ``(0, 1)``.
      threat: ``"black"`` or ``"white"`` (threshold chosen on the first ``selection_fraction`` of the runs,
        evaluated on the rest).
      estimator: ``"std"`` (assumption-free) or ``"gdp"`` (also tests ``mu_claim``, the pipeline's ``mu``-GDP
        claim, with ``mu_emp``; the envelope ``eps`` never sets the ``(eps, delta)`` violation).
      confidence: joint confidence of the two bounds, in ``(0, 1)``.
      selection_fraction: white-box selection share, in ``(0, 1)``.
      mu_claim: the ``mu`` a Gaussian pipeline claims (tested under ``estimator="gdp"``).
      vectorized: ``jit(vmap(pipeline))`` in batches; ``False`` calls it in a Python loop (pipelines that are not
        traceable, e.g. LLM calls).
      batch: vectorised batch size.
      name: recorded as the result's ``mechanism``.
      progress: progress bar on stderr.

    Returns:
      :class:`~snapaudit_jax.audits.active.AuditResult` with ``method="passive"``.

    Raises:
      InputError: an argument out of its range (as :func:`passive_bounds`).

    Guarantees:
      Runs are i.i.d. per hypothesis, so the one-sided Clopper-Pearson bounds (``alpha/2`` each) hold jointly with
      probability ``>= confidence``.
    """
    start = time.perf_counter()
    trials = validate.positive_int("trials", trials)
    bar = Counter(f"passive {name}", 2 * trials, progress, unit="trials")
    h1, s1 = _run(pipeline, key, 1, trials, vectorized, batch, bar, 0)
    h0, s0 = _run(pipeline, key, 0, trials, vectorized, batch, bar, trials)
    return passive_bounds(
        (h1, s1), (h0, s0), epsilon_theory=epsilon_theory, delta=delta, threat=threat, estimator=estimator,
        confidence=confidence, selection_fraction=selection_fraction, mu_claim=mu_claim, name=name, start=start,
    )


def passive_bounds(
    with_canary: tuple[np.ndarray, np.ndarray],
    without_canary: tuple[np.ndarray, np.ndarray],
    *,
    epsilon_theory: float,
    delta: float = 1e-5,
    threat: str = "black",
    estimator: str = DEFAULT_ESTIMATOR,
    confidence: float = 0.95,
    selection_fraction: float = 0.5,
    mu_claim: float | None = None,
    name: str = "pipeline",
    start: float | None = None,
) -> AuditResult:
    """The passive audit's statistics from the outcomes of end-to-end runs.

    Args:
      with_canary: ``(hits, scores)``, ``(n,)`` bool and ``(n,)`` float arrays of the runs with the canary (i.i.d.
        runs, in run order).
      without_canary: ``(hits, scores)`` of the runs without it, of the same length.
      epsilon_theory: the claimed ``eps`` (> 0).
      delta: the claimed ``delta`` in ``(0, 1)``.
      threat: ``"black"`` or ``"white"``.
      estimator: ``"std"`` or ``"gdp"``.
      confidence: joint confidence of the two bounds, in ``(0, 1)``.
      selection_fraction: white-box: share of the runs (the first ones) used to choose the threshold, in ``(0, 1)``.
      mu_claim: the ``mu`` a Gaussian pipeline claims (tested under ``estimator="gdp"``).
      name: recorded as the result's ``mechanism``.
      start: ``time.perf_counter()`` at the start of the audit (default: now), for ``seconds``.

    Returns:
      :class:`~snapaudit_jax.audits.active.AuditResult` with ``method="passive"``.

    Raises:
      InputError: an argument out of its range, or hits and scores that are not non-empty 1-D arrays of one length.
    """
    start = time.perf_counter() if start is None else start
    epsilon_theory = validate.positive_float("epsilon_theory", epsilon_theory)
    delta = validate.open_unit("delta", delta)
    threat = validate.choice("threat", threat, ("black", "white"))
    estimator = validate.choice("estimator", estimator, ESTIMATORS)
    confidence = validate.confidence("confidence", confidence)
    selection_fraction = validate.open_unit("selection_fraction", selection_fraction)
    (h1, s1), (h0, s0) = ((np.asarray(h, bool), np.asarray(sc, np.float64)) for h, sc in (with_canary, without_canary))
    if not (h1.shape == s1.shape == h0.shape == s0.shape) or h1.ndim != 1 or h1.size == 0:
        raise InputError(f"hits and scores must be non-empty 1-D arrays of one length, got shapes "
                         f"{h1.shape}, {s1.shape}, {h0.shape}, {s0.shape}")
    trials = h1.size
    alpha = 1.0 - confidence
    assumptions = ["End-to-end runs are i.i.d.; one-sided Clopper-Pearson bound on each rate, alpha/2 each."]
    threshold, n_sel = None, 0
    if threat == "white":
        test = threshold_test(s1, s0, Split(selection_fraction), delta=delta, alpha=alpha, estimator=estimator)
        threshold, tpr_b, fpr_b, n_sel = test.threshold, test.tpr, test.fpr, test.n_selection[0]
        assumptions.append("The threshold was chosen on the first selection_fraction of the runs, independent of "
                           "the evaluation runs.")
    else:
        tpr_b = binomial_bound(int(h1.sum()), trials, "lower", alpha / 2)
        fpr_b = binomial_bound(int(h0.sum()), trials, "upper", alpha / 2)
    return audit_result(
        mechanism=name, threat=threat, method="passive", estimator=estimator, clean="end-to-end",
        epsilon_theory=epsilon_theory, delta=delta, tpr=tpr_b, fpr=fpr_b, confidence=confidence,
        assumptions=assumptions, trials=tpr_b.trials, selection_trials=n_sel, threshold=threshold, mu_claim=mu_claim,
        seconds=time.perf_counter() - start,
    )
