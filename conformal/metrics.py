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
    """Rank of the true identity, ties counted against it (``#{j : p_j >= p_y}``, float32); 0 where missing."""
    p = np.asarray(probs, np.float32)
    y = np.asarray(labels)
    out = np.zeros(y.shape[0], np.int64)
    ok = y >= 0
    py = p[np.flatnonzero(ok), y[ok]]
    out[ok] = np.sum(p[ok] >= py[:, None], axis=1)
    return out


def ranking_metrics(probs, labels, ks=(1, 5, 10)) -> dict:
    """Non-conformal baselines: Top-k accuracy (strict: ties count against), MRR, mean rank of the truth."""
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
