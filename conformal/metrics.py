"""Reporting metrics of an ambiguity-set audit: coverage, set sizes, leakage proxy, ranking baselines.

Documents whose identity is absent from the candidate pool (``label == -1``,
open world) count as not covered in ``coverage`` and are excluded from
``coverage_conditional``; ``candidate_miss_rate`` is their share.
"""

from __future__ import annotations

import numpy as np

from snapaudit_jax.utils.errors import InputError

__all__ = ["set_metrics", "ranking_metrics", "true_ranks"]

_PERCENTILES = (5, 10, 25, 75, 90, 95, 99)


def true_ranks(probs, labels) -> np.ndarray:
    """Rank of the true identity, ties counted against it (``#{j : p_j >= p_y}``, float32); 0 where missing.

    Args:
      probs: ``(n, m)`` attacker weights (compared in float32).
      labels: ``(n,)`` pool position of the truth, ``-1`` if absent.

    Returns:
      ``(n,)`` int64 ranks in ``[1, m]``, 0 for an absent truth.
    """
    p = np.asarray(probs, np.float32)
    y = np.asarray(labels)
    out = np.zeros(y.shape[0], np.int64)
    ok = y >= 0
    py = p[np.flatnonzero(ok), y[ok]]
    out[ok] = np.sum(p[ok] >= py[:, None], axis=1)
    return out


def ranking_metrics(probs, labels, ks=(1, 5, 10)) -> dict:
    """Non-conformal baselines: Top-k accuracy (strict: ties count against), MRR, mean rank of the truth.

    Args:
      probs: ``(n, m)`` attacker weights.
      labels: ``(n,)`` pool position of the truth, ``-1`` if absent (never ranked: a miss).
      ks: the ``k`` of each Top-k accuracy.

    Returns:
      ``{"top<k>": float for each k, "mrr": float, "mean_rank": float or None}`` (``mean_rank`` over the
      documents whose truth is in the pool; ``None`` if there is none).
    """
    ranks = true_ranks(probs, labels)
    found = ranks > 0
    out = {f"top{k}": float(np.mean(found & (ranks <= k))) for k in ks}
    out["mrr"] = float(np.mean(np.where(found, 1.0 / np.maximum(ranks, 1), 0.0)))
    out["mean_rank"] = float(np.mean(ranks[found])) if found.any() else None
    return out


def set_metrics(sets, labels) -> dict:
    """Coverage and size statistics of ambiguity sets.

    Args:
      sets: ``(n, m)`` bool membership.
      labels: ``(n,)`` pool position of the truth, ``-1`` if absent.

    Returns:
      ``{"n", "coverage", "coverage_conditional" (None if no truth is in the pool), "candidate_miss_rate",
      "median_set_size", "mean_set_size", "min_set_size", "max_set_size", "leakage_proxy", "empty_set_rate",
      "singleton_rate", "pool_size", "p<q>_set_size" for q in 5, 10, 25, 75, 90, 95, 99}``.

    Raises:
      ValueError: if the shapes of ``sets`` and ``labels`` disagree or there is no document.
    """
    sets = np.asarray(sets, bool)
    y = np.asarray(labels)
    if sets.ndim != 2 or y.shape != (sets.shape[0],):
        raise InputError(f"sets (n, m) and labels (n,) disagree: {sets.shape} vs {y.shape}")
    if sets.shape[0] == 0:
        raise InputError("no documents to evaluate")
    included = y >= 0
    hit = np.zeros(y.shape[0], bool)
    hit[included] = sets[np.flatnonzero(included), y[included]]
    sizes = sets.sum(axis=1)
    out = {
        "n": int(y.shape[0]),
        "coverage": float(hit.mean()),
        "coverage_conditional": float(hit[included].mean()) if included.any() else None,
        "candidate_miss_rate": float(1.0 - included.mean()),
        "median_set_size": float(np.median(sizes)),
        "mean_set_size": float(sizes.mean()),
        "min_set_size": int(sizes.min()),
        "max_set_size": int(sizes.max()),
        "leakage_proxy": float(np.mean(1.0 / np.maximum(1, sizes))),
        "empty_set_rate": float(np.mean(sizes == 0)),
        "singleton_rate": float(np.mean(sizes == 1)),
        "pool_size": int(sets.shape[1]),
    }
    out.update({f"p{q}_set_size": float(np.percentile(sizes, q)) for q in _PERCENTILES})
    return out
