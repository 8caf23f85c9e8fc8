"""Phase A: clean snapshots of a DP-ICL pipeline, saved with a manifest, resumable.

``n`` calls of the non-private counterpart ``M'`` per neighbouring context,
each with its own random partition assignment. Prompts repeat across calls
and greedy decoding is deterministic, so every distinct prompt is computed
once and reused; the manifest reports logical calls, unique computations and
a determinism check that recomputes a sample without the cache.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import os
import time

import numpy as np

from snapaudit_jax.dpicl.pipelines.base import Pipeline
from snapaudit_jax.dpicl.pipelines.esa import EmbeddingPipeline
from snapaudit_jax.dpicl.pipelines.ksa import KeywordPipeline
from snapaudit_jax.models.oracle import LLMOracle
from snapaudit_jax.simulation.snapshots import Snapshots, dedupe, load_snapshots, save_snapshots
from snapaudit_jax.utils.errors import InputError
from snapaudit_jax.utils.io import write_json

__all__ = ["SnapshotRun", "generate_snapshots", "case_fingerprint"]


@dataclasses.dataclass(frozen=True)
class SnapshotRun:
    """Snapshots of one pipeline and how they were made.

    Attributes:
      snapshots: the clean outputs with and without the canary (ESA: with the candidates and target).
      manifest: the run's manifest (fingerprint, model calls, unique computations, determinism check,
        ``oracle_calls`` -- every oracle counter's change over this Phase A, determinism check included --, ...;
        ``"resumed": True`` when loaded from the run folder).
    """

    snapshots: Snapshots
    manifest: dict


def _model_identity(pipeline: Pipeline) -> str:
    """What the oracle keys the model's answers by (:attr:`LLMOracle.model_identity`; ``lm.name`` for others)."""
    oracle = pipeline.oracle
    return getattr(oracle, "model_identity", None) or oracle.lm.name


def case_fingerprint(pipeline: Pipeline, snapshots: int, seed: int) -> str:
    """Hash of everything that determines the snapshots.

    The model (its identity: a served model's includes the server's URL and fingerprint, so snapshots computed
    against one server are never resumed against another), case, pipeline settings, ``n`` and seed; ESA: the
    candidate pool, whose embeddings and target index the snapshot file holds, and how it was drawn, so that a run
    folder of another pool setting is recomputed, from the answer cache, not reused.

    Args:
      pipeline: the pipeline.
      snapshots: ``n_llm``.
      seed: partition-assignment seed.

    Returns:
      The SHA-256 hex digest.
    """
    case = pipeline.case
    parts = {
        "model": _model_identity(pipeline),  # a server's identity (URL, model id, fingerprint), not its label
        "embedder": getattr(pipeline.oracle.embedder, "name", None),
        "pipeline": pipeline.name,
        "partitions": pipeline.partitions,
        "defense": pipeline.defense,
        "mode": case.mode,
        "query": case.query_text,
        "secret": case.secret,
        "decoy": case.decoy,
        "with": [e.text for e in pipeline.exemplars(1)],
        "without": [e.text for e in pipeline.exemplars(0)],
        "snapshots": snapshots,
        "seed": seed,
        "extra": {k: v for k, v in vars(pipeline).items() if isinstance(v, (int, float, str, tuple))},
    }
    if isinstance(pipeline, EmbeddingPipeline):
        pool = pipeline.pool
        parts["candidate_pool"] = {"source": pool.source, "texts": pool.texts, "draws": pool.draws, "seed": pool.seed}
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def _same(a, b) -> bool:
    if isinstance(a, (frozenset, set)):
        return a == b
    return bool(np.allclose(np.asarray(a, np.float64), np.asarray(b, np.float64), atol=1e-3))


def _verify(pipeline: Pipeline, sample: int, seed: int) -> dict:
    """Recomputes ``sample`` partition answers without the cache, one prompt per batch."""
    rng = np.random.default_rng([seed, 99])
    groups = []
    for b in (1, 0):
        for i in rng.choice(10**6, size=max(1, sample // 2), replace=False):
            groups.append(pipeline.assign(pipeline.exemplars(b), np.random.default_rng([seed, int(i)]))[0])
    cached = pipeline.answers(groups)
    fresh_pipeline = copy.copy(pipeline)
    fresh_pipeline.oracle = LLMOracle(pipeline.oracle.lm, pipeline.oracle.embedder, batch_size=1)
    fresh = fresh_pipeline.answers(groups)
    mismatches = sum(not _same(a, b) for a, b in zip(cached, fresh))
    return {"checked": len(groups), "mismatches": int(mismatches)}


def generate_snapshots(
    pipeline: Pipeline,
    *,
    snapshots: int,
    seed: int,
    run_dir: str | None = None,
    verify: int = 4,
) -> SnapshotRun:
    """Phase A for one pipeline: ``snapshots`` clean outputs of ``M'`` per context.

    Args:
      pipeline: the pipeline (its oracle caches answers; give it a ``cache_path`` in ``run_dir`` to resume
        interrupted runs).
      snapshots: ``n_llm >= 2``, calls of ``M'`` per context.
      seed: partition-assignment seed (call ``i`` uses ``default_rng([seed, i])`` under both contexts).
      run_dir: folder for ``<name>.npz`` and ``<name>.manifest.json``; an existing pair with the same fingerprint
        is loaded instead of recomputed.
      verify: partition answers to recompute uncached (0: no check).

    Returns:
      :class:`SnapshotRun`. A :class:`KeywordPipeline` gets its ``vocabulary`` fixed (from the answers or the
      manifest).

    Raises:
      InputError: ``snapshots < 2``, or an existing manifest that is not readable JSON.
    """
    if snapshots < 2:
        raise InputError(f"snapshots must be >= 2, got {snapshots}")
    fingerprint = case_fingerprint(pipeline, snapshots, seed)
    npz = manifest_path = None
    if run_dir is not None:
        os.makedirs(run_dir, exist_ok=True)
        npz = os.path.join(run_dir, f"{pipeline.name}.npz")
        manifest_path = os.path.join(run_dir, f"{pipeline.name}.manifest.json")
        if os.path.isfile(npz) and os.path.isfile(manifest_path):
            try:
                with open(manifest_path) as fh:
                    manifest = json.load(fh)
            except ValueError as err:
                raise InputError(f"{manifest_path}: not a readable snapshot manifest ({err}); delete it and {npz} to "
                                 "recompute the snapshots") from None
            if isinstance(manifest, dict) and manifest.get("fingerprint") == fingerprint:
                if isinstance(pipeline, KeywordPipeline):
                    pipeline.vocabulary = tuple(manifest["vocabulary"])
                return SnapshotRun(load_snapshots(npz), manifest | {"resumed": True})
    start = time.perf_counter()
    before = dataclasses.replace(pipeline.oracle.stats)
    requested_before = set(pipeline.oracle.requested)
    if isinstance(pipeline, KeywordPipeline):
        w, wo = pipeline.histograms(pipeline.clean_calls(1, snapshots, seed), pipeline.clean_calls(0, snapshots, seed))
    else:
        w, wo = pipeline.clean_outputs(1, snapshots, seed), pipeline.clean_outputs(0, snapshots, seed)
    stats = pipeline.oracle.stats
    candidates = pipeline.candidates if isinstance(pipeline, EmbeddingPipeline) else None
    target = pipeline.target
    snaps = Snapshots(w, wo, candidates=candidates, target=None if target is None else int(target))
    manifest = {
        "fingerprint": fingerprint,
        "pipeline": pipeline.name,
        "model": pipeline.oracle.lm.name,
        "model_identity": _model_identity(pipeline),
        "embedder": getattr(pipeline.oracle.embedder, "name", None),
        "query": pipeline.case.mode,
        "defense": pipeline.defense,
        "partitions": pipeline.partitions,
        "snapshots": snapshots,
        "seed": seed,
        "canary_id": pipeline.case.context.canary.id,
        "llm_calls": stats.calls - before.calls,
        "unique_computations": stats.computed - before.computed,
        "reused_answers": stats.cached - before.cached,
        "distinct_snapshots": {"with": int(len(dedupe(w)[0])), "without": int(len(dedupe(wo)[0]))},
        "prompt_hashes": sorted(pipeline.oracle.requested - requested_before),
        "seconds": time.perf_counter() - start,
        "determinism_check": _verify(pipeline, verify, seed) if verify else None,
        "note": "greedy decoding is deterministic: each distinct prompt is computed once and its answer reused",
    }
    # Every oracle call of this Phase A, the determinism check's cached side included: what a run that resumes
    # from these files counts as resumed (it asks neither the model nor the cache again).
    manifest["oracle_calls"] = {f.name: getattr(stats, f.name) - getattr(before, f.name)
                                for f in dataclasses.fields(stats)}
    server = getattr(pipeline.oracle.lm, "server_info", None)
    if server is not None:  # a served model: its id and base URL (never credentials: the URL may hold none)
        manifest["server"] = server
    if isinstance(pipeline, EmbeddingPipeline):
        manifest["candidate_pool"] = pipeline.pool.to_dict()
    if isinstance(pipeline, KeywordPipeline):
        manifest["vocabulary"] = list(pipeline.vocabulary)
        manifest["target_keyword"] = pipeline.target_keyword
    if run_dir is not None:
        save_snapshots(npz, snaps)
        write_json(manifest_path, manifest)
    return SnapshotRun(snaps, manifest)
