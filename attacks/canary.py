"""Canary audit of DP-SGD: from scores of inserted and held-out canaries to lower bounds on epsilon.

A canary (:func:`~attacks.corpus.make_canaries`) is a random secret in a fixed template, inserted into the
training data independently with probability ``p``. Its score is ``log P(secret | template prefix)`` under the
trained model (minus the same under a reference model, optionally): members should score higher.

:func:`epsilon_lower_bound` turns member / non-member scores into ``(eps, delta)`` lower bounds with this
package's estimation layer (:mod:`snapaudit_jax.estimation`: the decision rules ``Split`` / ``Bonferroni``,
:func:`~snapaudit_jax.estimation.threshold_test` and the estimators) for the test "member iff score >= threshold",
with exact Clopper-Pearson bounds ``TPR >= tpr_low`` and ``FPR <= fpr_up`` (``alpha / 2`` each). The threshold
never comes from the scores that the bound uses:

* ``"split"``: a random ``selection_fraction`` of each group chooses the threshold (the one maximising the
  bound the selection part itself gives), the rest evaluates it;
* ``"bonferroni"``: a grid of thresholds fixed *before* seeing the scores, every one evaluated on all scores
  at ``alpha / (2 G)`` per rate, the best reported (a union bound over the ``2 G`` events).

:func:`canary_audit` bounds each repetition group's canaries as *one run* with this package's one-run auditor
(:func:`snapaudit_jax.estimation.one_run.one_run_audit`, Steinke, Nasr, Jagielski 2023): the canaries of one repetition
count (assigned by index, before the coins) with their coins, a declared grid of ``(k_+, k_-)`` guesses fixed by
the group's size, the union bound over it. This is the bound valid for one training run, and the one the PII
experiment reports as ``epsilon_audited``.

:func:`jax_privacy_bounds` runs jax_privacy's ``CanaryScoreAuditor`` on the same scores as a labelled
cross-reference (Clopper-Pearson with its split and Bonferroni strategies, and its one-run auditor, whose
threshold family is chosen with the labels: 6.1% false ``eps > 0`` at a nominal 5%, see
:mod:`snapaudit_jax.estimation.one_run`).
Its ``epsilon_from_gdp`` is not used: it takes ``abs(mu)``, which turns a worse-than-chance test into
evidence.

Guarantees:
  With probability at least ``1 - alpha`` the ``std`` bound is below the true ``eps`` of every
  ``(eps, delta)``-DP mechanism *if* the member scores are i.i.d. and the non-member scores are i.i.d. given
  membership (each canary is an independent trial). That holds for canaries audited over independent training
  runs; with many canaries in one run it is the usual heuristic (the scores share one model): the one-run
  bound (``one_run``) is the valid one there. The ``gdp``
  entry's ``mu_lower`` bounds the ``mu`` of a ``mu``-GDP claim; its ``epsilon_gdp`` is the ``eps(delta)`` of the
  Gaussian envelope and bounds the ``(eps, delta)`` of the training run only if its trade-off curve is Gaussian.
  jax_privacy's ``one_run`` bound
  (Steinke et al. 2023) is valid for a single run given independent Bernoulli(1/2) insertion, and only then:
  it scores its "member" guesses against the 1/2 prior, so with insertion probability ``p = 0.8`` and no
  leakage at all it reported ``eps > 0`` in 400 of 400 simulated runs (median 1.23). :func:`jax_privacy_bounds` and
  :func:`canary_audit` (with ``jax_privacy``) therefore refuse any ``insert_probability`` but 1/2; the
  Clopper-Pearson bounds of :func:`epsilon_lower_bound` condition on membership and hold for any ``p``
  (pitfall 11 of the house conventions). A canary inserted
  ``r`` times is protected only at group size ``r``: compare its group's bound with the group-privacy epsilon,
  not with the per-record one.

References:
  Jagielski, Ullman, Oprea, "Auditing Differentially Private Machine Learning", NeurIPS 2020.
  Nasr, Hayes, Steinke, Balle, Tramèr, Jagielski, Carlini, Terzis, "Tight Auditing of Differentially Private
  Machine Learning", USENIX Security 2023 (GDP estimator).
  Steinke, Nasr, Jagielski, "Privacy Auditing with One (1) Training Run", NeurIPS 2023.
  Carlini et al., "The Secret Sharer", USENIX Security 2019 (canaries).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import numpy as np

from attacks.blackbox import continuation_logprobs
from attacks.corpus import Canary, CanarySet
from attacks.mia import roc_auc
from snapaudit_jax.estimation import Bonferroni, Split, ThresholdTest, estimate, threshold_test
from snapaudit_jax.estimation.one_run import check_design
from snapaudit_jax.finetune.memorization import one_run_bound
from snapaudit_jax.utils import validate
from snapaudit_jax.utils.errors import InputError

__all__ = [
    "SELECTIONS",
    "CanaryAuditConfig",
    "canary_scores",
    "epsilon_lower_bound",
    "jax_privacy_bounds",
    "one_run_insert_probability",
    "canary_audit",
]

SELECTIONS = ("split", "bonferroni")
_GUARANTEES = (
    "std: valid lower bound on eps at delta with probability >= 1 - alpha if canary scores are independent trials "
    "(independent runs; heuristic for many canaries in one run); gdp: mu_lower bounds the mu of a mu-GDP claim, "
    "epsilon_gdp is the Gaussian envelope's eps (a bound only for a Gaussian trade-off curve); the threshold is "
    "chosen on scores the bound does not use (split) or Bonferroni-corrected over a grid fixed in advance."
)


@dataclasses.dataclass(frozen=True)
class CanaryAuditConfig:
    """Configuration of :func:`canary_audit` (frozen, hashable).

    Attributes:
      delta: the ``delta`` of the audited claim (e.g. the training run's delta).
      alpha: failure probability of each bound.
      selection: ``"split"`` or ``"bonferroni"`` (then ``thresholds`` is required).
      selection_fraction: share of each group that chooses the threshold (``"split"``).
      thresholds: the fixed grid (``"bonferroni"``), in score units, decided before scoring.
      batch_size: rows per scoring pass.
      jax_privacy: also run :func:`jax_privacy_bounds` (a cross-reference); its one-run bound requires canaries
        inserted with probability 1/2 (:func:`canary_audit` refuses any other ``insert_probability`` while this
        is on).
      one_run: bound each repetition group with :func:`snapaudit_jax.estimation.one_run.one_run_audit` (``delta > 0``
        requires ``insert_probability = 1/2``, refused before scoring otherwise).
      one_run_pairs: the declared ``(k_plus, k_minus)`` grid, the same for every group (default: each group's
        :func:`snapaudit_jax.estimation.one_run.default_grid`, fixed by its size).
    """

    delta: float = 1e-5
    alpha: float = 0.05
    selection: str = "split"
    selection_fraction: float = 0.5
    thresholds: tuple[float, ...] | None = None
    batch_size: int = 32
    jax_privacy: bool = True
    one_run: bool = True
    one_run_pairs: tuple[tuple[int, int], ...] | None = None

    def validate(self) -> "CanaryAuditConfig":
        """Checks every field; returns ``self`` (errors name the field, the rule and the value)."""
        validate.open_unit("delta", self.delta)
        validate.open_unit("alpha", self.alpha)
        validate.choice("selection", self.selection, SELECTIONS)
        validate.open_unit("selection_fraction", self.selection_fraction)
        if self.selection == "bonferroni":
            if not self.thresholds:
                raise InputError(f"thresholds must be a non-empty grid when selection='bonferroni', "
                                 f"got {self.thresholds!r}")
            validate.finite_array("thresholds", self.thresholds)
        validate.positive_int("batch_size", self.batch_size)
        if self.one_run_pairs is not None:
            if not self.one_run_pairs:
                raise InputError("one_run_pairs must be a non-empty grid of (k_plus, k_minus) pairs, got ()")
            for i, pair in enumerate(self.one_run_pairs):
                if not isinstance(pair, (tuple, list)) or len(pair) != 2:
                    raise InputError(f"one_run_pairs[{i}] must be a pair (k_plus, k_minus), got {pair!r}")
                for j, k in enumerate(pair):
                    validate.positive_int(f"one_run_pairs[{i}][{j}]", k, minimum=0)
        return self


def canary_scores(model, tokenizer, canaries: CanarySet | Sequence[Canary], *, reference_model=None,
                  batch_size: int = 32) -> np.ndarray:
    """``(n,)`` scores ``log P(continuation | prefix)`` (minus the reference model's), higher = member.

    Args:
      model: the target NNX decoder.
      tokenizer: its tokenizer (shared with the reference model).
      canaries: the ``n`` canaries (a :class:`~attacks.corpus.CanarySet` or a sequence of canaries).
      reference_model: optional reference model whose log-probability is subtracted (calibrated score).
      batch_size: rows per scoring pass.

    Returns:
      ``(n,)`` float64 scores, in canary order.
    """
    items = canaries.canaries if isinstance(canaries, CanarySet) else tuple(canaries)
    prefixes = [c.prefix for c in items]
    conts = [c.continuation for c in items]
    score = continuation_logprobs(model, tokenizer, prefixes, conts, batch_size=batch_size)
    if reference_model is not None:
        score = score - continuation_logprobs(reference_model, tokenizer, prefixes, conts, batch_size=batch_size)
    return score


def _result(test: ThresholdTest, delta: float) -> dict:
    eps_std, mu, eps_gdp = estimate(test.tpr, test.fpr, delta)
    return {"threshold": test.threshold, "tpr_low": test.tpr.bound, "fpr_up": test.fpr.bound,
            "member_hits": int(test.tpr.hits), "n_members": test.tpr.trials, "nonmember_hits": int(test.fpr.hits),
            "n_nonmembers": test.fpr.trials, "epsilon_std": eps_std, "mu_lower": mu, "epsilon_gdp": eps_gdp}


def epsilon_lower_bound(
    member_scores,
    nonmember_scores,
    *,
    delta: float,
    alpha: float = 0.05,
    key: jax.Array | None = None,
    thresholds: Sequence[float] | None = None,
    selection_fraction: float = 0.5,
) -> dict:
    """``(eps, delta)`` lower bounds from canary scores (see the module docstring).

    The decision rule is a value of :mod:`snapaudit_jax.estimation` (``Split`` or ``Bonferroni``) and
    :func:`snapaudit_jax.estimation.threshold_test` chooses and bounds it, as in every other audit.

    Args:
      member_scores: ``(n1,)`` scores of inserted canaries (higher = member).
      nonmember_scores: ``(n0,)`` scores of held-out canaries.
      delta: ``delta`` of the audited claim, in ``(0, 1)``.
      alpha: failure probability of each reported bound, in ``(0, 1)``.
      key: PRNG key of the selection / evaluation split (``"split"``; required then).
      thresholds: a grid fixed in advance: Bonferroni selection instead of a split.
      selection_fraction: share of each group used to choose the threshold (``"split"``).

    Returns:
      ``{"selection", "alpha", "delta", "std": {...}, "gdp": {...}, "guarantees"}`` where ``std`` and ``gdp``
      each hold the threshold chosen for that estimator and its evaluation ``{"threshold", "tpr_low", "fpr_up",
      "member_hits", "n_members", "nonmember_hits", "n_nonmembers", "epsilon_std", "mu_lower", "epsilon_gdp"}``;
      the bound of the estimator is ``std["epsilon_std"]`` and ``gdp["mu_lower"]`` (its ``epsilon_gdp`` is the
      Gaussian envelope's ``eps``).

    Raises:
      ValueError: bad scores, rates or fractions, or ``"split"`` without a key or with a part left empty.

    Guarantees:
      See the module docstring: the ``std`` bound holds with probability ``>= 1 - alpha`` for independent
      canary trials; ``gdp["mu_lower"]`` bounds the ``mu`` of a ``mu``-GDP claim under the same condition.
    """
    delta = validate.open_unit("delta", delta)
    alpha = validate.open_unit("alpha", alpha)
    out = {"selection": "bonferroni" if thresholds is not None else "split", "alpha": alpha, "delta": delta,
           "guarantees": _GUARANTEES}
    if thresholds is not None:
        grid = validate.finite_array("thresholds", thresholds)
        if grid.ndim != 1:
            raise InputError(f"thresholds must be 1-dimensional, got shape {grid.shape}")
        rule = Bonferroni(tuple(grid.tolist()))
    else:
        if key is None:
            raise InputError("key must be a PRNG key for selection='split' (no hidden default key), got None")
        rule = Split(validate.open_unit("selection_fraction", selection_fraction))
    for name in ("std", "gdp"):
        test = threshold_test(member_scores, nonmember_scores, rule, delta=delta, alpha=alpha, estimator=name,
                              key=key)
        out[name] = _result(test, delta)
    if thresholds is not None:
        out["grid_size"] = len(rule.thresholds)
    else:
        out["n_selection"] = test.n_selection
    return out


def one_run_insert_probability(insert_probability) -> float:
    """``insert_probability`` if the one-run bound's design allows it (exactly 1/2), else ``ValueError``.

    Args:
      insert_probability: the probability with which each canary was inserted.

    Returns:
      ``insert_probability`` as a float (0.5).

    Raises:
      ValueError: ``insert_probability`` outside ``(0, 1)`` or not 1/2 (Steinke, Nasr, Jagielski 2023,
        Algorithm 1).
    """
    p = validate.open_unit("insert_probability", insert_probability)
    if p != 0.5:  # Steinke, Nasr, Jagielski 2023, Algorithm 1: S uniform on {-1, +1}^m
        raise InputError(
            f"insert_probability must be 1/2 for jax_privacy's one-run bound (Steinke et al. 2023 assume each "
            f"canary is inserted independently with probability 1/2), got {p}; insert with probability 0.5 or turn "
            f"jax_privacy off (CanaryAuditConfig(jax_privacy=False)): the Clopper-Pearson bounds of "
            f"epsilon_lower_bound hold for any insert_probability")
    return p


def jax_privacy_bounds(member_scores, nonmember_scores, *, delta: float, insert_probability: float,
                       alpha: float = 0.05, seed: int = 0) -> dict:
    """jax_privacy ``CanaryScoreAuditor`` on the same scores (cross-check).

    Args:
      member_scores: ``(n1,)`` scores of inserted canaries (higher = member).
      nonmember_scores: ``(n0,)`` scores of held-out canaries.
      delta: ``delta`` of the audited claim, in ``(0, 1)``.
      insert_probability: the probability with which each canary was independently inserted (required, no
        default: the scores cannot tell, and a default of 1/2 would certify any design). Must be ``0.5``.
      alpha: significance of every bound, in ``(0, 0.5)``.
      seed: seed of jax_privacy's ``Split`` strategy.

    Returns:
      ``{"cp_split", "cp_bonferroni"}`` (Clopper-Pearson, two-sided rule search, its ``Split(0.5, seed)`` and
      ``Bonferroni()`` over all observed thresholds), ``"one_run"`` (Steinke et al. 2023, Bonferroni) and
      ``"auroc"``. Significance ``alpha`` (the C-P methods need ``alpha < 0.5``).

    Raises:
      ValueError: ``insert_probability`` other than 1/2, ``delta`` or ``alpha`` out of range.

    Guarantees:
      ``one_run`` is a lower bound on ``eps`` at ``delta`` with probability ``>= 1 - alpha`` for one training
      run only if every canary was inserted independently with probability exactly 1/2 (Steinke et al. 2023,
      Algorithm 1); with ``p > 1/2`` it reports ``eps > 0`` without any leakage, hence the refusal. The
      Clopper-Pearson entries condition on membership (valid for any ``p``, like :func:`epsilon_lower_bound`),
      but are refused with it: call :func:`epsilon_lower_bound` for ``p != 1/2``.
    """
    from jax_privacy import auditing

    one_run_insert_probability(insert_probability)
    delta = validate.open_unit("delta", delta)
    alpha = validate.open_unit("alpha", alpha)
    if alpha >= 0.5:
        raise InputError(f"alpha must be < 0.5 for jax_privacy's Clopper-Pearson bounds, got {alpha}")
    auditor = auditing.CanaryScoreAuditor(np.asarray(member_scores, np.float64), np.asarray(nonmember_scores,
                                                                                            np.float64))
    return {
        "cp_split": float(auditor.epsilon_clopper_pearson(alpha, delta, one_sided=False,
                                                          threshold_strategy=auditing.Split(0.5, seed))),
        "cp_bonferroni": float(auditor.epsilon_clopper_pearson(alpha, delta, one_sided=False)),
        "one_run": float(auditor.epsilon_one_run(alpha, delta)),
        "auroc": float(auditor.attack_auroc()),
    }


def canary_audit(
    model,
    tokenizer,
    canaries: CanarySet,
    config: CanaryAuditConfig,
    key: jax.Array,
    *,
    reference_model=None,
) -> dict:
    """Scores every canary and bounds epsilon separately for each repetition count.

    Members of group ``r`` are the canaries inserted ``r`` times; the non-members (all held-out canaries) are
    shared by the groups for the Clopper-Pearson bounds. The one-run bound of group ``r`` uses exactly the
    canaries assigned ``r`` repetitions (by index, before the coins), included or not, with their coins.
    Each group's bounds hold at ``alpha`` on their own (not simultaneously).

    Args:
      model: the trained NNX decoder; tokenizer: its tokenizer.
      canaries: the :class:`~attacks.corpus.CanarySet` whose inserted canaries were in the training data.
      config: a :class:`CanaryAuditConfig`.
      key: PRNG key; group ``r`` splits with ``fold_in(key, r)``.
      reference_model: optional reference model (calibrated scores).

    Returns:
      ``{"scores", "inserted", "repetitions", "groups": [{"repetitions", "n_members", "n_nonmembers", "auc",
      "bounds": epsilon_lower_bound(...), "one_run": OneRunResult.to_dict() or None,
      "jax_privacy": jax_privacy_bounds(...) or None}]}``.

    Raises:
      ValueError: an invalid ``config``; ``config.jax_privacy`` with ``canaries.insert_probability`` other
        than 1/2; ``config.one_run`` with ``delta > 0`` and ``insert_probability`` other than 1/2 (all raised
        before any scoring).

    Guarantees:
      ``bounds`` as :func:`epsilon_lower_bound` (any ``insert_probability``). ``one_run["epsilon"]`` is a
      lower bound on the training run's ``eps`` at ``delta`` with probability ``>= 1 - alpha`` (group ``r``:
      the ``eps`` of group privacy for ``r`` records), given the stated independent insertion
      (:mod:`snapaudit_jax.estimation.one_run`). ``jax_privacy["one_run"]`` is a cross-reference only. A group's
      Clopper-Pearson non-members include the held-out canaries of other repetition counts.
    """
    config.validate()
    if config.jax_privacy:
        one_run_insert_probability(canaries.insert_probability)
    if config.one_run:
        check_design(canaries.insert_probability, config.delta)
    scores = canary_scores(model, tokenizer, canaries, reference_model=reference_model, batch_size=config.batch_size)
    inserted, reps = canaries.inserted, canaries.repetitions
    one_run = (one_run_bound(scores, canaries, delta=config.delta, alpha=config.alpha,
                             pairs=config.one_run_pairs or None) if config.one_run else None)
    non = scores[~inserted]
    groups = []
    for r in sorted(set(reps.tolist())):
        mem = scores[inserted & (reps == r)]
        group = {"repetitions": r, "n_members": len(mem), "n_nonmembers": len(non)}
        group["one_run"] = one_run[r].to_dict() if one_run else None
        if len(mem) < 2 or len(non) < 2:
            group.update(auc=None, bounds=None, jax_privacy=None, skipped="fewer than 2 members or non-members")
            groups.append(group)
            continue
        group["auc"] = roc_auc(mem, non)
        group["bounds"] = epsilon_lower_bound(
            mem, non, delta=config.delta, alpha=config.alpha, key=jax.random.fold_in(key, r),
            thresholds=config.thresholds if config.selection == "bonferroni" else None,
            selection_fraction=config.selection_fraction)
        group["jax_privacy"] = (jax_privacy_bounds(mem, non, delta=config.delta, alpha=config.alpha, seed=r,
                                                   insert_probability=canaries.insert_probability)
                                if config.jax_privacy else None)
        groups.append(group)
    return {"scores": scores.tolist(), "inserted": inserted.tolist(), "repetitions": reps.tolist(), "groups": groups}
