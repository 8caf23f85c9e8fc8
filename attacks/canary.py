"""Canary audit of DP-SGD: from scores of inserted and held-out canaries to lower bounds on epsilon.

A canary (:func:`~attacks.corpus.make_canaries`) is a random secret in a fixed template, inserted into the
training data independently with probability ``p``. Its score is ``log P(secret | template prefix)`` under the
trained model (minus the same under a reference model, optionally): members should score higher.

:func:`epsilon_lower_bound` turns member / non-member scores into ``(eps, delta)`` lower bounds with this
package's estimators (:func:`snapaudit_jax.epsilon_std`, :func:`snapaudit_jax.epsilon_gdp`) for the test
"member iff score >= threshold", with exact Clopper-Pearson bounds ``TPR >= tpr_low`` and ``FPR <= fpr_up``
(``alpha / 2`` each). The threshold never comes from the scores that the bound uses:

* ``"split"``: a random ``selection_fraction`` of each group chooses the threshold (the one maximising the
  bound the selection part itself gives), the rest evaluates it;
* ``"bonferroni"``: a grid of thresholds fixed *before* seeing the scores, every one evaluated on all scores
  at ``alpha / (2 G)`` per rate, the best reported (a union bound over the ``2 G`` events).

:func:`jax_privacy_bounds` runs jax_privacy's ``CanaryScoreAuditor`` on the same scores as a cross-check
(Clopper-Pearson with its split and Bonferroni strategies, and the one-run auditor of Steinke et al. 2023).
Its ``epsilon_from_gdp`` is not used: it takes ``abs(mu)``, which turns a worse-than-chance test into
evidence.

Guarantees:
  With probability at least ``1 - alpha`` the ``std`` bound is below the true ``eps`` of every
  ``(eps, delta)``-DP mechanism *if* the member scores are i.i.d. and the non-member scores are i.i.d. given
  membership (each canary is an independent trial). That holds for canaries audited over independent training
  runs; with many canaries in one run it is the usual heuristic (the scores share one model). The ``gdp``
  bound further assumes the mechanism's trade-off curve is Gaussian (mu-GDP). jax_privacy's ``one_run`` bound
  (Steinke et al. 2023) is valid for a single run given independent Bernoulli(1/2) insertion. A canary inserted
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

from snapaudit_jax import _validate
from snapaudit_jax.bounds import clopper_pearson_lower, clopper_pearson_upper
from snapaudit_jax.estimators import epsilon_gdp, epsilon_std, mu_lower

from attacks.blackbox import continuation_logprobs
from attacks.corpus import Canary, CanarySet
from attacks.mia import roc_auc

__all__ = [
    "SELECTIONS",
    "CanaryAuditConfig",
    "canary_scores",
    "epsilon_lower_bound",
    "jax_privacy_bounds",
    "canary_audit",
]

SELECTIONS = ("split", "bonferroni")
_GUARANTEES = (
    "std: valid lower bound on eps at delta with probability >= 1 - alpha if canary scores are independent trials "
    "(independent runs; heuristic for many canaries in one run); gdp: additionally assumes a Gaussian trade-off "
    "curve; the threshold is chosen on scores the bound does not use (split) or Bonferroni-corrected over a grid "
    "fixed in advance."
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
      jax_privacy: also run :func:`jax_privacy_bounds`.
    """

    delta: float = 1e-5
    alpha: float = 0.05
    selection: str = "split"
    selection_fraction: float = 0.5
    thresholds: tuple[float, ...] | None = None
    batch_size: int = 32
    jax_privacy: bool = True

    def validate(self) -> "CanaryAuditConfig":
        """Checks every field; returns ``self`` (errors name the field, the rule and the value)."""
        _validate.open_unit("delta", self.delta)
        _validate.open_unit("alpha", self.alpha)
        _validate.choice("selection", self.selection, SELECTIONS)
        _validate.open_unit("selection_fraction", self.selection_fraction)
        if self.selection == "bonferroni":
            if not self.thresholds:
                raise ValueError(f"thresholds must be a non-empty grid when selection='bonferroni', "
                                 f"got {self.thresholds!r}")
            _validate.finite_array("thresholds", self.thresholds)
        _validate.positive_int("batch_size", self.batch_size)
        return self


def canary_scores(model, tokenizer, canaries: CanarySet | Sequence[Canary], *, reference_model=None,
                  batch_size: int = 32) -> np.ndarray:
    """``(n,)`` scores ``log P(continuation | prefix)`` (minus the reference model's), higher = member."""
    items = canaries.canaries if isinstance(canaries, CanarySet) else tuple(canaries)
    prefixes = [c.prefix for c in items]
    conts = [c.continuation for c in items]
    score = continuation_logprobs(model, tokenizer, prefixes, conts, batch_size=batch_size)
    if reference_model is not None:
        score = score - continuation_logprobs(reference_model, tokenizer, prefixes, conts, batch_size=batch_size)
    return score


def _scores(name: str, value, minimum: int) -> np.ndarray:
    arr = _validate.finite_array(name, value)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-dimensional, got shape {arr.shape}")
    if len(arr) < minimum:
        raise ValueError(f"{name} must hold at least {minimum} scores, got {len(arr)}")
    return arr


def _at_least(sorted_scores: np.ndarray, thresholds: np.ndarray) -> np.ndarray:
    """``#(score >= t)`` for each threshold."""
    return len(sorted_scores) - np.searchsorted(sorted_scores, thresholds, side="left")


def _bounds(k1, n1: int, k0, n0: int, a: float):
    """``(tpr_low, 1 - tpr_low, fpr_up, 1 - fpr_up)``, each complement computed exactly (Beta symmetry)."""
    return (clopper_pearson_lower(k1, n1, a), clopper_pearson_upper(n1 - k1, n1, a),
            clopper_pearson_upper(k0, n0, a), clopper_pearson_lower(n0 - k0, n0, a))


def _objectives(k1, n1, k0, n0, a, delta):
    tl, tl_c, fu, fu_c = _bounds(k1, n1, k0, n0, a)
    std = epsilon_std(tl, fu, delta, tpr_low_complement=tl_c, fpr_up_complement=fu_c)
    mu = mu_lower(tl, fu, tpr_low_complement=tl_c, fpr_up_complement=fu_c)
    return np.atleast_1d(std), np.atleast_1d(mu)


def _result(threshold, k1, n1, k0, n0, a, delta) -> dict:
    tl, tl_c, fu, fu_c = (float(x) for x in _bounds(k1, n1, k0, n0, a))
    eps = float(epsilon_std(tl, fu, delta, tpr_low_complement=tl_c, fpr_up_complement=fu_c))
    mu = float(mu_lower(tl, fu, tpr_low_complement=tl_c, fpr_up_complement=fu_c))
    gdp = float(epsilon_gdp(tl, fu, delta, tpr_low_complement=tl_c, fpr_up_complement=fu_c))
    return {"threshold": float(threshold), "tpr_low": tl, "fpr_up": fu, "member_hits": int(k1), "n_members": n1,
            "nonmember_hits": int(k0), "n_nonmembers": n0, "epsilon_std": eps, "mu_lower": mu, "epsilon_gdp": gdp}


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
      the bound of the estimator is ``std["epsilon_std"]`` and ``gdp["epsilon_gdp"]``.

    Raises:
      ValueError: bad scores, rates or fractions, or ``"split"`` without a key or with a part left empty.

    Guarantees:
      See the module docstring: the ``std`` bound holds with probability ``>= 1 - alpha`` for independent
      canary trials; the ``gdp`` bound additionally assumes a Gaussian trade-off curve.
    """
    delta = _validate.open_unit("delta", delta)
    alpha = _validate.open_unit("alpha", alpha)
    m = _scores("member_scores", member_scores, 1 if thresholds is not None else 2)
    n = _scores("nonmember_scores", nonmember_scores, 1 if thresholds is not None else 2)
    out = {"selection": "bonferroni" if thresholds is not None else "split", "alpha": alpha, "delta": delta,
           "guarantees": _GUARANTEES}
    if thresholds is not None:
        grid = _validate.finite_array("thresholds", thresholds)
        if grid.ndim != 1:
            raise ValueError(f"thresholds must be 1-dimensional, got shape {grid.shape}")
        a = alpha / (2 * len(grid))
        k1, k0 = _at_least(np.sort(m), grid), _at_least(np.sort(n), grid)
        std, mu = _objectives(k1, len(m), k0, len(n), a, delta)
        for name, objective in (("std", std), ("gdp", mu)):
            i = int(np.argmax(objective))
            out[name] = _result(grid[i], k1[i], len(m), k0[i], len(n), a, delta)
        out["grid_size"] = len(grid)
        return out
    if key is None:
        raise ValueError("key must be a PRNG key for selection='split' (no hidden default key), got None")
    fraction = _validate.open_unit("selection_fraction", selection_fraction)
    parts = []
    for i, (name, s) in enumerate((("member_scores", m), ("nonmember_scores", n))):
        perm = np.asarray(jax.random.permutation(jax.random.fold_in(key, i), len(s)))
        cut = int(round(fraction * len(s)))
        if not 0 < cut < len(s):
            raise ValueError(f"selection_fraction={fraction} leaves an empty selection or evaluation part of "
                             f"{name} ({len(s)} scores)")
        parts.append((np.sort(s[perm[:cut]]), np.sort(s[perm[cut:]])))
    (m_sel, m_ev), (n_sel, n_ev) = parts
    candidates = np.unique(np.concatenate([m_sel, n_sel]))
    std, mu = _objectives(_at_least(m_sel, candidates), len(m_sel), _at_least(n_sel, candidates), len(n_sel),
                          alpha / 2, delta)
    for name, objective in (("std", std), ("gdp", mu)):
        t = candidates[int(np.argmax(objective))]
        k1, k0 = _at_least(m_ev, np.array([t]))[0], _at_least(n_ev, np.array([t]))[0]
        out[name] = _result(t, k1, len(m_ev), k0, len(n_ev), alpha / 2, delta)
    out["n_selection"] = (len(m_sel), len(n_sel))
    return out


def jax_privacy_bounds(member_scores, nonmember_scores, *, delta: float, alpha: float = 0.05, seed: int = 0) -> dict:
    """jax_privacy ``CanaryScoreAuditor`` on the same scores (cross-check).

    Returns:
      ``{"cp_split", "cp_bonferroni"}`` (Clopper-Pearson, two-sided rule search, its ``Split(0.5, seed)`` and
      ``Bonferroni()`` over all observed thresholds), ``"one_run"`` (Steinke et al. 2023, Bonferroni) and
      ``"auroc"``. Significance ``alpha`` (the C-P methods need ``alpha < 0.5``).
    """
    from jax_privacy import auditing

    delta = _validate.open_unit("delta", delta)
    alpha = _validate.open_unit("alpha", alpha)
    if alpha >= 0.5:
        raise ValueError(f"alpha must be < 0.5 for jax_privacy's Clopper-Pearson bounds, got {alpha}")
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
    shared by the groups. Each group's bounds hold at ``alpha`` on their own (not simultaneously).

    Args:
      model: the trained NNX decoder; tokenizer: its tokenizer.
      canaries: the :class:`~attacks.corpus.CanarySet` whose inserted canaries were in the training data.
      config: a :class:`CanaryAuditConfig`.
      key: PRNG key; group ``r`` splits with ``fold_in(key, r)``.
      reference_model: optional reference model (calibrated scores).

    Returns:
      ``{"scores", "inserted", "repetitions", "groups": [{"repetitions", "n_members", "n_nonmembers", "auc",
      "bounds": epsilon_lower_bound(...), "jax_privacy": jax_privacy_bounds(...) or None}]}``.
    """
    config.validate()
    scores = canary_scores(model, tokenizer, canaries, reference_model=reference_model, batch_size=config.batch_size)
    inserted, reps = canaries.inserted, canaries.repetitions
    non = scores[~inserted]
    groups = []
    for r in sorted(set(reps.tolist())):
        mem = scores[inserted & (reps == r)]
        group = {"repetitions": r, "n_members": len(mem), "n_nonmembers": len(non)}
        if len(mem) < 2 or len(non) < 2:
            group.update(auc=None, bounds=None, jax_privacy=None, skipped="fewer than 2 members or non-members")
            groups.append(group)
            continue
        group["auc"] = roc_auc(mem, non)
        group["bounds"] = epsilon_lower_bound(
            mem, non, delta=config.delta, alpha=config.alpha, key=jax.random.fold_in(key, r),
            thresholds=config.thresholds if config.selection == "bonferroni" else None,
            selection_fraction=config.selection_fraction)
        group["jax_privacy"] = (jax_privacy_bounds(mem, non, delta=config.delta, alpha=config.alpha, seed=r)
                                if config.jax_privacy else None)
        groups.append(group)
    return {"scores": scores.tolist(), "inserted": inserted.tolist(), "repetitions": reps.tolist(), "groups": groups}
