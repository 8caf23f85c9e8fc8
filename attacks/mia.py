"""Loss-based membership inference on records: scores, ROC AUC and TPR at low FPR.

Score of a record: minus its per-token loss under the target model (Yeom et al. 2018), or, with a reference
model, minus the loss difference target - reference (difficulty calibration, Watson et al. 2022; Carlini et al.
2021's reference-model attack). Higher means "member". (Lukas et al. 2023 use a shadow-model attack; the loss
attack is its cheapest instance and needs no shadow training.)

Two low-FPR summaries, both *empirical* (never confidence bounds):

* :func:`tpr_at_fpr_heldout`: the threshold is set on a calibration split of non-members (at most
  ``floor(fpr * m)`` of the ``m`` calibration scores exceed it), then TPR and FPR are measured on members and
  on the remaining non-members; the FPR measured there estimates the attack's true FPR without selection bias.
* :func:`roc_point`: the ROC curve's best TPR with empirical FPR <= ``fpr`` on the same data (optimistic:
  threshold and rates come from the same scores).

References:
  Yeom, Giacomelli, Fredrikson, Jha, "Privacy Risk in Machine Learning", CSF 2018.
  Carlini, Chien, Nasr, Song, Terzis, Tramèr, "Membership Inference Attacks From First Principles", S&P 2022
  (report TPR at low FPR).
  Lukas et al., IEEE S&P 2023, Fig. 7a (MI ROC AUC of the four training variants).
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np

from attacks.blackbox import score_texts
from snapaudit_jax.estimation import roc_auc
from snapaudit_jax.utils import validate
from snapaudit_jax.utils.errors import InputError

__all__ = ["membership_scores", "roc_auc", "roc_curve", "roc_point", "tpr_at_fpr_heldout", "mia_attack"]


def _scores(name: str, value) -> np.ndarray:
    arr = validate.finite_array(name, value)
    if arr.ndim != 1:
        raise InputError(f"{name} must be 1-dimensional, got shape {arr.shape}")
    return arr


def _losses(model, tokenizer, texts: Sequence[str], batch_size: int, cache: dict | None) -> np.ndarray:
    """Per-token mean losses of ``texts`` under ``model``, read from ``cache`` (keyed by the texts) when there."""
    ident = tuple(texts)
    if cache is not None and ident in cache:
        return cache[ident]
    losses = np.asarray(score_texts(model, tokenizer, texts, batch_size=batch_size).mean_nll)
    if cache is not None:
        cache[ident] = losses
    return losses


def membership_scores(model, tokenizer, texts: Sequence[str], *, reference_model=None, batch_size: int = 16,
                      cache: dict | None = None, reference_cache: dict | None = None):
    """``(n,)`` membership scores: ``-loss`` or ``-(loss - reference loss)`` (per-token losses, EOS-framed).

    Args:
      model: the target NNX decoder; tokenizer: its tokenizer (shared with the reference).
      texts: the records to score.
      reference_model: optional reference model (e.g. the baseline trained without the private data).
      batch_size: rows per scoring pass.
      cache: optional dict the caller keeps for ``model`` alone: its losses, keyed by the texts, are read from
        it instead of scored again (the loss and the reference attack score the same records).
      reference_cache: the same for ``reference_model`` (e.g. kept across the variants of one experiment,
        which share their public reference).
    """
    score = -_losses(model, tokenizer, texts, batch_size, cache)
    if reference_model is not None:
        score = score + _losses(reference_model, tokenizer, texts, batch_size, reference_cache)
    return score


def roc_curve(member_scores, nonmember_scores) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The empirical ROC curve of the rule ``score >= threshold``.

    Args:
      member_scores: ``(n1,)`` finite scores of members (higher = member).
      nonmember_scores: ``(n0,)`` finite scores of non-members.

    Returns:
      ``(fpr, tpr, thresholds)``, thresholds decreasing from ``+inf`` (nothing flagged) through every distinct
      score (the last one flags everything).

    Raises:
      ValueError: scores that are not finite or not 1-dimensional.
    """
    m = np.sort(_scores("member_scores", member_scores))
    n = np.sort(_scores("nonmember_scores", nonmember_scores))
    thresholds = np.concatenate([[np.inf], np.unique(np.concatenate([m, n]))[::-1]])
    tpr = (len(m) - np.searchsorted(m, thresholds, side="left")) / len(m)
    fpr = (len(n) - np.searchsorted(n, thresholds, side="left")) / len(n)
    return fpr, tpr, thresholds


def roc_point(member_scores, nonmember_scores, fpr: float) -> dict:
    """Largest empirical TPR over thresholds whose empirical FPR is ``<= fpr`` (same data: optimistic).

    Args:
      member_scores: ``(n1,)`` finite scores of members.
      nonmember_scores: ``(n0,)`` finite scores of non-members.
      fpr: the target false-positive rate, in ``(0, 1)``.

    Returns:
      ``{"fpr_target", "tpr", "fpr", "threshold", "rule": "score >= threshold", "kind": "empirical curve point"}``.

    Raises:
      ValueError: ``fpr`` outside ``(0, 1)``, or scores that are not finite or not 1-dimensional.
    """
    fpr = validate.open_unit("fpr", fpr)
    f, t, th = roc_curve(member_scores, nonmember_scores)
    ok = np.flatnonzero(f <= fpr)
    best = ok[np.argmax(t[ok])]  # f[0] = 0, so ok is never empty
    return {"fpr_target": fpr, "tpr": float(t[best]), "fpr": float(f[best]), "threshold": float(th[best]),
            "rule": "score >= threshold", "kind": "empirical curve point"}


def tpr_at_fpr_heldout(member_scores, nonmember_eval_scores, nonmember_calibration_scores, fpr: float) -> dict:
    """TPR and FPR at a threshold set on held-out non-members (see the module docstring).

    The threshold is the ``(k + 1)``-th largest calibration score with ``k = floor(fpr * m)``, and the rule is
    ``score > threshold`` (strict), so at most ``k`` calibration scores are flagged, ties included.

    Args:
      member_scores: ``(n1,)`` finite scores of members.
      nonmember_eval_scores: ``(n0,)`` scores of the non-members that measure the FPR.
      nonmember_calibration_scores: ``(m,)`` scores of the non-members that set the threshold.
      fpr: the target false-positive rate, in ``(0, 1)``.

    Returns:
      ``{"fpr_target", "threshold", "rule", "tpr", "fpr", "n_members", "n_nonmembers_eval", "n_calibration",
      "kind": "held-out threshold, empirical rates"}``.

    Raises:
      ValueError: ``fpr`` outside ``(0, 1)``, or scores that are not finite or not 1-dimensional.
    """
    fpr = validate.open_unit("fpr", fpr)
    m = _scores("member_scores", member_scores)
    n = _scores("nonmember_eval_scores", nonmember_eval_scores)
    c = np.sort(_scores("nonmember_calibration_scores", nonmember_calibration_scores))[::-1]
    k = int(np.floor(fpr * len(c)))
    threshold = float(c[k])
    return {"fpr_target": fpr, "threshold": threshold, "rule": "score > threshold",
            "tpr": float(np.mean(m > threshold)), "fpr": float(np.mean(n > threshold)), "n_members": len(m),
            "n_nonmembers_eval": len(n), "n_calibration": len(c), "kind": "held-out threshold, empirical rates"}


def mia_attack(
    model,
    tokenizer,
    members: Sequence[str],
    nonmembers: Sequence[str],
    key: jax.Array,
    *,
    reference_model=None,
    fprs: Sequence[float] = (0.1, 0.01),
    calibration_fraction: float = 0.5,
    batch_size: int = 16,
    cache: dict | None = None,
    reference_cache: dict | None = None,
) -> dict:
    """Loss-based membership inference of training records against held-out records.

    Args:
      model: the target NNX decoder; tokenizer: its tokenizer.
      members: training records (texts exactly as trained on).
      nonmembers: records from the same distribution that were not trained on.
      key: PRNG key splitting the non-members into calibration / evaluation parts.
      reference_model: optional reference model (calibrated score).
      fprs: target false-positive rates.
      calibration_fraction: share of non-members used to set the held-out thresholds.
      batch_size: rows per scoring pass.
      cache: optional dict of ``model``'s losses, kept by the caller for this model alone
        (:func:`membership_scores`).
      reference_cache: the same for ``reference_model``.

    Returns:
      ``{"auc" (all scores), "n_members", "n_nonmembers", "member_scores", "nonmember_scores",
      "heldout": [tpr_at_fpr_heldout per fpr], "curve": [roc_point per fpr], "score": description}``.

    Raises:
      ValueError: fewer than 2 non-members, or a bad fraction or rate.
    """
    calibration_fraction = validate.open_unit("calibration_fraction", calibration_fraction)
    if len(members) < 1 or len(nonmembers) < 2:
        raise InputError(f"need >= 1 member and >= 2 non-members, got {len(members)} and {len(nonmembers)}")
    fprs = [validate.open_unit("fprs[...]", f) for f in fprs]
    scoring = {"reference_model": reference_model, "batch_size": batch_size, "cache": cache,
               "reference_cache": reference_cache}
    sm = membership_scores(model, tokenizer, members, **scoring)
    sn = membership_scores(model, tokenizer, nonmembers, **scoring)
    perm = np.asarray(jax.random.permutation(key, len(sn)))
    n_cal = min(max(1, int(round(calibration_fraction * len(sn)))), len(sn) - 1)
    cal, ev = sn[perm[:n_cal]], sn[perm[n_cal:]]
    return {
        "auc": roc_auc(sm, sn),
        "n_members": len(sm),
        "n_nonmembers": len(sn),
        "member_scores": sm.tolist(),
        "nonmember_scores": sn.tolist(),
        "heldout": [tpr_at_fpr_heldout(sm, ev, cal, f) for f in fprs],
        "curve": [roc_point(sm, sn, f) for f in fprs],
        "score": "-(loss - reference loss)" if reference_model is not None else "-loss",
    }
