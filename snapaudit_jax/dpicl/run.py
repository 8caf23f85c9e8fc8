"""``snapaudit audit CONFIG.toml``: real DP-ICL audits end to end.

Clean-output model of the active audit (``[audit] clean``):

* ``fixed`` (default): each snapshot is the exact clean output of its
  recorded partition assignment -- greedy decoding is deterministic, which
  Phase A checks by recomputing a sample without the cache. Call ``i`` of
  both contexts uses the same assignment, so every pair is neighbouring and,
  by joint convexity of the hockey-stick divergence, the DP claim covers the
  pipeline with its assignment drawn from the recorded ones: the audit bounds
  only the Monte Carlo error (Clopper-Pearson). The bound is for that mixture
  over the recorded assignments; a violation of it is evidence that some
  assignment's release violates the claim. If the determinism check finds a
  recomputed answer that differs, the snapshots are not exact clean outputs:
  ``[audit] on_mismatch`` then either falls back to ``sampled`` (default; the
  warning and the assumption say so) or stops with an error (``"fail"``).
* ``sampled``: the snapshots are i.i.d. draws of a random clean stage (e.g.
  sampled decoding); an empirical Bernstein bound adds the snapshot error,
  of order ``1 / n_llm``.

ESA's candidate pool (``[pipelines.esa] candidates``): ``"sampled"`` (default)
runs the paper's constrained 0-shot candidate stage (SnapAudit Alg. 5 line 8,
App. D.2) ``candidate_calls`` times, once per audit and before Phase A;
``"fixed"`` uses the two signal sentences. The stage never sees the private
examples, so the pool is data-independent: the active audit conditions on the
drawn pool (treated as public), which is recorded in the results. Its calls
count in both budgets: the active audit pays them once; every passive
end-to-end run draws its own pool, as the deployed mechanism does, so the
passive budget (the active audit's, at ``passive_runs = snapshots``) buys
fewer runs (:func:`passive_plan`). Pseudo-seeds
(:meth:`~snapaudit_jax.dpicl.pipelines.EmbeddingPipeline.candidate_prompts`): the
active pool's from ``seed = [audit.seed]``, passive run ``r``'s from
``[audit.seed + 1, r]`` (shared by run ``r`` of both contexts, like its
partition assignment).

Phase A runs the pipelines on the language model (clean snapshots, cached and
resumable), Phase B/C audits the private releases with the core engine
(active), and the same pipelines are audited end to end with the same
model-call budget (passive). A run folder receives ``results.json`` (one row
per pipeline, mode, threat and epsilon), ``results_full.json``, ``table.md``,
PNG plots, the snapshots with their manifests, the model-answer cache, the
run stamp ``run.json`` (:func:`run_folder`: a rerun of the same configuration
resumes, another one is refused) and, if configured, ``mia.json``
(clean-output membership-inference AUC) and ``one_run.json`` (``[one_run]``:
one-run audits of PV/PoE with many canaries in one private set,
:mod:`snapaudit_jax.dpicl.one_run`; also a section of ``table.md`` and the
``one_run`` entry of ``results_full.json``).

The configuration file is TOML; every section and key is documented in
:class:`AuditConfig` and ``examples/quickstart.toml``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time

import jax
import numpy as np

from snapaudit_jax.audits.active import AuditResult, audit
from snapaudit_jax.estimation import roc_auc
from snapaudit_jax.mechanisms import Attack
from snapaudit_jax.audits.passive import passive_bounds
from snapaudit_jax.utils import validate
from snapaudit_jax.utils.config import ConfigFileError
from snapaudit_jax.utils.errors import InputError
from snapaudit_jax.utils.io import write_json, write_text
from snapaudit_jax.utils.progress import RunLog as _Log
from snapaudit_jax.utils.run_folder import RunFolder
from snapaudit_jax.dpicl.config import DEFAULT_DATASET, FIXED_MIXTURE_NOTE, AuditConfig, PipelineConfig
from snapaudit_jax.dpicl.pipelines import PIPELINES
from snapaudit_jax.dpicl.report import format_report, plot_pipeline


__all__ = ["RESULT_FILES", "RESUME_FILES", "check_run_folder", "passive_plan", "run_audit", "run_folder",
           "server_needs"]

RESULT_FILES = ("results.json", "results_full.json", "table.md")  # a finished run's files
RESUME_FILES = ("llm_cache.jsonl", "snapshots")  # what a rerun resumes from (adopted in an unstamped folder)
# AuditConfig fields that are not keys of the [audit] table.
_OTHER_TABLES = ("llm", "embedder", "allow_pickle", "server", "server_tokenizer", "pipelines", "mia", "one_run")

# ---------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------


def _signal_pair(settings: PipelineConfig, examples, oracle, log) -> tuple[tuple[str, str], dict]:
    from snapaudit_jax.dpicl.msgs import greedy_search, multi_sweep_greedy_search, word_vocabulary

    if isinstance(settings.signals, tuple):
        y1, y2 = settings.signals
        d = float(np.linalg.norm(np.subtract(*oracle.embed([y1, y2]))))
        return (y1, y2), {"method": "given", "distance": d}
    vocab = word_vocabulary([e.text for e in examples], max_words=settings.signal_vocabulary, min_count=1, seed=0)
    seeds = [" ".join(e.text.split()[:6]) for e in examples[: settings.signal_seeds]]
    embed = oracle.embedder.embed
    log(f"  signal search ({settings.signals}, {len(vocab)} words, {len(seeds)} seeds)")
    gs = greedy_search(seeds[0], embed, vocab, batch_size=256, max_rounds=8)
    if settings.signals == "gs":
        pair = gs
    else:
        pair = multi_sweep_greedy_search(seeds, embed, vocab, sweeps=settings.signal_sweeps, batch_size=256,
                                         max_rounds=8)
    info = {"method": settings.signals, "distance": pair.distance, "gs_distance": gs.distance,
            "evaluations": pair.evaluations + (0 if pair is gs else gs.evaluations)}
    return (pair.sentence_1, pair.sentence_2), info


def _esa_pool(config: AuditConfig, settings: PipelineConfig, pipeline, log):
    """ESA's candidate pool for the whole audit, drawn once before Phase A (``settings.candidates``).

    Raises:
      ValueError: ``audit.method = "exact"`` with the black-box threat and a sampled pool of other than 2
        candidates (raised before any snapshot is computed).
    """
    from snapaudit_jax.dpicl.pipelines import CandidatePool

    if settings.candidates == "fixed":
        return CandidatePool.fixed(pipeline.signals)
    log(f"  candidate stage: {settings.candidate_calls} constrained 0-shot calls (no private examples)")
    pool = pipeline.draw_pool(settings.candidate_calls, config.seed)
    log(f"  candidate pool: {len(pool.texts)} candidates (draws: y1 {pool.counts()['y1']}, y2 {pool.counts()['y2']}, "
        f"other {pool.counts()['other']})")
    if config.method == "exact" and "black" in config.threats and len(pool.texts) != 2:
        raise InputError(
            f"pipelines.esa.candidates: audit.method = \"exact\" needs exactly 2 ESA candidates for the black-box "
            f"release, but the sampled pool ({settings.candidate_calls} candidate calls) has {len(pool.texts)}: "
            f"{list(pool.texts)}; set pipelines.esa.candidates = \"fixed\" (the pool y1, y2) or audit.method = "
            "\"simulate\"")
    return pool


def _pool_notes(pool) -> tuple[list[str], tuple[str, ...]]:
    """``(assumption notes, black-box warnings)`` of the active ESA audit with ``pool``."""
    if pool.source == "fixed":
        note = ("ESA candidate pool fixed to the two signal sentences (y1, y2): data-independent, so the release is "
                "post-processing of the Gaussian mean for this pool.")
    else:
        note = (f"ESA candidate pool drawn once, before Phase A, by {pool.calls} constrained 0-shot calls that do not "
                f"see the private examples: data-independent and treated as public, the audit is conditional on "
                f"it ({len(pool.texts)} candidates: {list(pool.texts)}).")
    return [note], tuple(f"ESA: {p}" for p in pool.problems())


def passive_plan(runs: int, calls_per_pair: int, candidate_calls: int = 0) -> tuple[int, int]:
    """``(runs per context, model calls)`` of a passive audit with the active audit's budget.

    ``runs`` end-to-end runs per context cost ``calls_per_pair`` calls per pair of runs (one per context). ESA with
    a sampled pool (``candidate_calls = T_cand > 0``): the active audit pays ``runs * calls_per_pair + T_cand``
    calls (Phase A at ``snapshots = runs``, then one candidate stage); every passive run draws its own pool,
    ``calls_per_pair + 2 T_cand`` per pair, so that budget buys ``floor(budget / (calls_per_pair + 2 T_cand))``
    runs per context (at least 1).

    Args:
      runs: runs per context wanted (``>= 1``).
      calls_per_pair: model calls of one clean output under each context, summed (``>= 1``).
      candidate_calls: ``T_cand >= 0`` (0: no per-run candidate stage).

    Returns:
      ``(runs per context, model calls in all)``.

    Raises:
      InputError: an argument that is not an integer in range.
    """
    runs = validate.positive_int("runs", runs)
    calls_per_pair = validate.positive_int("calls_per_pair", calls_per_pair)
    candidate_calls = validate.positive_int("candidate_calls", candidate_calls, minimum=0)
    if not candidate_calls:
        return runs, runs * calls_per_pair
    per_pair = calls_per_pair + 2 * candidate_calls
    n = max(1, (runs * calls_per_pair + candidate_calls) // per_pair)
    return n, n * per_pair


def _clean_model(config: AuditConfig, check: dict, log) -> tuple[str, list[str], tuple[str, ...]]:
    """``(clean model, assumption notes, warnings)`` of the active audits after Phase A's determinism check.

    Raises:
      ValueError: ``clean = "fixed"``, a mismatch, and ``on_mismatch = "fail"`` (nothing is written then).
    """
    if config.clean != "fixed":
        return config.clean, [], ()
    mismatches = int(check.get("mismatches") or 0)
    if not mismatches:
        return "fixed", [FIXED_MIXTURE_NOTE], ()
    msg = (f"determinism check: {mismatches} of {check.get('checked')} answers changed when recomputed, so the "
           "snapshots are not the exact clean outputs of their assignments")
    if config.on_mismatch == "fail":
        raise InputError(f"audit.clean: {msg}; clean = \"fixed\" needs a deterministic clean stage (set "
                         "audit.clean = \"sampled\" or audit.on_mismatch = \"sampled\")")
    log(f"  WARNING: {msg}: falling back to clean = \"sampled\"")
    return "sampled", [f"clean = fixed was configured, but the {msg}: audited as clean = sampled (i.i.d. draws, "
                       "empirical Bernstein snapshot term)."], (msg + "; audited as clean = sampled",)


def _apriori_attack(pipeline) -> Attack:
    """An attack fixed before seeing any output (the passive auditor's)."""
    import jax.numpy as jnp

    from snapaudit_jax.dpicl.pipelines import EmbeddingPipeline, KeywordPipeline, PrivateVotingPipeline

    if isinstance(pipeline, PrivateVotingPipeline):
        r1, r0 = np.array([1.0, 0.0]), np.array([0.0, 1.0])
    elif isinstance(pipeline, EmbeddingPipeline):
        r1, r0 = pipeline.signal_embeddings  # the fixed pool's candidates
        return Attack(jnp.asarray(r1, jnp.float32), jnp.asarray(r0, jnp.float32), int(pipeline.target or 0))
    elif isinstance(pipeline, KeywordPipeline):
        r1 = np.zeros(len(pipeline.vocabulary))
        r1[pipeline.target] = 1.0
        r0 = np.zeros_like(r1)
    else:
        r1 = r0 = np.zeros(2)
    return Attack(jnp.asarray(r1, jnp.float32), jnp.asarray(r0, jnp.float32), int(pipeline.target))


def _passive_outcomes(pipeline, mechanism, attack, clean: np.ndarray, key) -> tuple[np.ndarray, np.ndarray]:
    """``(hits, scores)`` of end-to-end runs: one private release per clean output."""
    import jax.numpy as jnp

    def one(k, c):
        prepared = mechanism.prepare(c, attack)
        noise = jax.tree_util.tree_map(lambda x: x[..., 0], mechanism.noise(k, 1, prepared))
        return mechanism.outcome(noise, prepared, attack)

    keys = jax.random.split(key, clean.shape[0])
    hits, scores = jax.jit(jax.vmap(one))(keys, jnp.asarray(clean, jnp.float32))
    return np.asarray(hits), np.asarray(scores)


def _esa_fresh_pool_outcomes(pipeline, mechanism, pools, clean: np.ndarray, key) -> tuple[np.ndarray, np.ndarray]:
    """``(hits, scores)`` of end-to-end ESA runs, run ``r`` releasing the candidate of its own pool ``pools[r]``
    nearest to its noisy mean: hit iff the released text is ``y1``; score ``<noisy mean, e(y1) - e(y2)>``."""
    import jax.numpy as jnp

    y1 = pipeline.signals[0]
    embedded = [pipeline.embed_texts(p.texts) for p in pools]
    width = max(len(e) for e in embedded)
    # Padding with copies of candidate 0 releases the same text (equal embeddings, equal distances).
    cands = np.stack([np.concatenate([e, np.repeat(e[:1], width - len(e), axis=0)]) for e in embedded])
    is_y1 = np.array([[t == y1 for t in p.texts] + [p.texts[0] == y1] * (width - len(p.texts)) for p in pools])
    e1, e2 = pipeline.signal_embeddings
    direction = jnp.asarray(e1 - e2, jnp.float32)

    def one(k, c, cand, y1_mask):
        release = dataclasses.replace(mechanism, candidates=cand)(k, c)
        return y1_mask[release.output], jnp.dot(release.noisy, direction)

    keys = jax.random.split(key, len(pools))
    hits, scores = jax.jit(jax.vmap(one))(keys, jnp.asarray(clean, jnp.float32), jnp.asarray(cands, jnp.float32),
                                          jnp.asarray(is_y1))
    return np.asarray(hits), np.asarray(scores)


def _ksa_reconstructed_hits(pipeline, mechanism, clean, key) -> np.ndarray:
    """KSA end to end: JEM release -> reconstruction prompt -> model -> target keyword in the answer?"""
    import jax.numpy as jnp

    from snapaudit_jax.dpicl.pipelines import keywords_of

    keys = jax.random.split(key, clean.shape[0])
    seqs = np.asarray(jax.jit(jax.vmap(lambda k, c: mechanism(k, c).output))(keys, jnp.asarray(clean, jnp.float32)))
    texts = pipeline.oracle.generate(pipeline.reconstruction_prompts(seqs), pipeline.max_new_tokens)
    return np.array([pipeline.target_keyword in keywords_of(t, pipeline.answer_keywords) for t in texts])


def _row(pipeline: str, mode: str, result: AuditResult, llm_calls: int, seconds: float) -> dict:
    return {
        "pipeline": pipeline,
        "mode": mode,
        "threat": result.threat,
        "epsilon_theory": result.epsilon_theory,
        "epsilon_emp": result.epsilon_emp,
        "llm_calls": int(llm_calls),
        "seconds": float(seconds),
    }


def _clean_signal(pipeline, clean) -> float:
    """A scalar membership signal of one clean output (larger: canary more likely present)."""
    from snapaudit_jax.dpicl.pipelines import KeywordPipeline, ProductOfExpertsPipeline

    if isinstance(pipeline, ProductOfExpertsPipeline):
        return float(clean[0] - clean[1])
    if isinstance(pipeline, KeywordPipeline):
        return float(clean)
    return float(clean[0])


def run_folder(config: AuditConfig, out_dir: str | os.PathLike) -> RunFolder:
    """The run folder ``out_dir`` as a run of ``config`` owns it: its stamp and its lock.

    The stamp records every key of the configuration file, defaults filled in, except those that cannot change
    results: ``model.allow_pickle``, ``audit.batch_size`` (model answers are cached by prompt, whatever the
    batch) and the server's transport (``api_key_env``, ``timeout_s``, ``max_concurrency``, ``max_retries``,
    the backoff); ``model.server`` keeps ``base_url``, ``model`` and ``tokenizer``.

    Args:
      config: the audit configuration.
      out_dir: the run folder (it may not exist yet).

    Returns:
      The :class:`~snapaudit_jax.utils.run_folder.RunFolder` of command ``audit``.
    """
    model = {"llm": config.llm, "embedder": config.embedder}
    if config.server is not None:
        model["server"] = {**config.server.public(), "tokenizer": config.server_tokenizer}
    table = {
        "model": model,
        "audit": {f.name: getattr(config, f.name) for f in dataclasses.fields(config)
                  if f.name not in _OTHER_TABLES and f.name != "batch_size"},
        "pipelines": {p.name: {k: v for k, v in dataclasses.asdict(p).items() if k != "name"}
                      for p in config.pipelines},
    }
    for section in ("mia", "one_run"):
        if getattr(config, section) is not None:
            table[section] = dataclasses.asdict(getattr(config, section))
    return RunFolder(out_dir, "audit", table, results=RESULT_FILES, resume=RESUME_FILES)


def _llm_calls(stats, summaries: dict) -> dict:
    """``summary.llm_calls``: the run's logical model calls, counted as a fresh run counts them.

    A Phase A loaded from the run folder's snapshot files asked nothing of the model or the cache in this
    process; its calls, recorded in its manifest, count as ``resumed``.
    """
    resumed = {"calls": 0, "embed_calls": 0}
    for info in summaries.values():
        manifest = info["manifest"]
        if manifest.get("resumed"):
            phase_a = manifest.get("oracle_calls") or {"calls": manifest["llm_calls"]}
            for key in resumed:
                resumed[key] += int(phase_a.get(key, 0))
    out = stats.as_dict()
    out["calls"] += resumed["calls"]
    out["embed_calls"] += resumed["embed_calls"]
    out["resumed"], out["embed_resumed"] = resumed["calls"], resumed["embed_calls"]
    out["note"] = ("calls: the run's logical language-model calls, as a fresh run counts them = computed (answers "
                   "computed now) + cached (answered from llm_cache.jsonl) + resumed (Phase A loaded from "
                   "snapshots/); the same for the embedder's embed_calls")
    return out


def check_run_folder(out_dir: str | os.PathLike) -> None:
    """Refuses a run folder whose resume files are corrupted, before any work (nothing is changed).

    Checks the model-answer cache ``llm_cache.jsonl`` line by line, every ``snapshots/<name>.manifest.json`` and
    the snapshot file next to it. A missing folder passes.

    Args:
      out_dir: the run folder.

    Raises:
      InputError: a corrupted file (the message names it, the line or the array, and says to delete it).
    """
    from snapaudit_jax.models.oracle import read_cache
    from snapaudit_jax.simulation.snapshots import load_snapshots

    out_dir = os.fspath(out_dir)
    if not os.path.isdir(out_dir):
        return
    cache = os.path.join(out_dir, "llm_cache.jsonl")
    if os.path.exists(cache):
        read_cache(cache)
    snaps = os.path.join(out_dir, "snapshots")
    if not os.path.isdir(snaps):
        return
    for name in sorted(os.listdir(snaps)):
        if not name.endswith(".manifest.json"):
            continue
        path = os.path.join(snaps, name)
        npz = path[: -len(".manifest.json")] + ".npz"
        try:
            with open(path) as fh:
                manifest = json.load(fh)
        except (OSError, ValueError) as err:
            raise InputError(f"{path}: not a readable snapshot manifest ({err}); delete it and {npz} to recompute "
                             "the snapshots") from None
        if not isinstance(manifest, dict) or not isinstance(manifest.get("fingerprint"), str):
            raise InputError(f"{path}: a snapshot manifest must be a JSON object with a 'fingerprint' string, got "
                             f"{str(manifest)[:80]!r}; delete it and {npz} to recompute the snapshots")
        if os.path.exists(npz):
            try:
                load_snapshots(npz)
            except ValueError as err:
                raise InputError(f"{err}; delete it and {path} to recompute the snapshots") from None


def _load_datasets(config: AuditConfig) -> dict:
    """``{(dataset, data_path): examples}`` of every pipeline; a bad ``data_path`` names its key, and a context
    the dataset cannot fill names ``num_exemplars`` (:func:`_check_contexts`), all before any model call."""
    from snapaudit_jax.dpicl.data import load_examples

    out = {}
    for p in config.pipelines:
        if (p.dataset, p.data_path) not in out:
            try:
                out[(p.dataset, p.data_path)] = load_examples(p.dataset, p.data_path)
            except (ValueError, OSError, ImportError) as err:
                raise ConfigFileError(f"pipelines.{p.name}.data_path: {err}") from None
    s = config.one_run
    one_run_examples = None
    if s is not None and s.data_path != "hub":  # None: the shipped demo data
        try:
            one_run_examples = load_examples(s.dataset, s.data_path)
        except (ValueError, OSError, ImportError) as err:
            raise ConfigFileError(f"one_run.data_path: {err}") from None
    _check_contexts(config, out, one_run_examples)
    return out


def _check_contexts(config: AuditConfig, datasets: dict, one_run_examples) -> None:
    """Draws every audit context and the one-run slots once (cheap and deterministic, no model call) so that a
    dataset with too few distinct examples for ``num_exemplars`` (or ``one_run.canaries + base_exemplars``) is
    refused naming the key before the run folder is touched."""
    from snapaudit_jax.dpicl.data import sample_audit_context

    for p in config.pipelines:
        try:
            sample_audit_context(datasets[(p.dataset, p.data_path)], num_exemplars=p.num_exemplars,
                                 seed=config.case_seed)
        except InputError as err:
            raise ConfigFileError(f"pipelines.{p.name}.num_exemplars: {err}") from None
    s = config.one_run
    if one_run_examples is not None:
        from snapaudit_jax.dpicl.one_run import make_slots

        for pipeline in s.pipelines:
            m = s.slots_for(pipeline)
            key = "poe_canaries" if pipeline == "poe" and s.poe_canaries is not None else "canaries"
            try:
                make_slots(one_run_examples, canaries=m, base_exemplars=s.base_exemplars,
                           insert_probability=s.insert_probability, seed=s.seed)
            except InputError as err:
                raise ConfigFileError(f"one_run.{key}: {err}") from None


def _load_model(key: str, load, name: str, allow_pickle: bool):
    """``load(name)``; a checkpoint that cannot be loaded names its config key (``model.llm``)."""
    try:
        return load(name, allow_pickle=allow_pickle)
    except (ValueError, OSError) as err:
        raise ConfigFileError(f"{key}: {err}") from None


def server_needs(config: AuditConfig) -> list[tuple[str, str]]:
    """The server capabilities a configuration's Phase A needs: ``[("logprobs", who), ...]``.

    Label scoring (PoE; PV outside the copy mode; the ContextLeak filter) and PV's greedy copy checks read
    echoed log-probabilities; a server without them can still decode, so PV's copy mode falls back to greedy
    decoding, and ESA and KSA only generate.

    Args:
      config: the audit configuration.

    Returns:
      The needed ``(capability, needed_by)`` pairs.
    """
    names = {p.name for p in config.pipelines}
    needs = []
    if "poe" in names:
        needs.append(("logprobs", "PoE (label log-probabilities)"))
    if "pv" in names and config.query != "copy":
        needs.append(("logprobs", f"PV in the {config.query} query mode (Yes/No log-probabilities)"))
    if config.defense == "contextleak" and names & {"pv", "poe"}:
        needs.append(("logprobs", "the ContextLeak filter (Yes/No log-probabilities)"))
    return needs


def run_audit(config: AuditConfig, out_dir: str, *, progress: bool = True) -> dict:
    """Runs the configured audits and writes the run folder.

    Args:
      config: a checked configuration (:func:`~snapaudit_jax.dpicl.config.load_config`).
      out_dir: the run folder, owned by this run (:func:`run_folder`: stamped with the configuration, locked
        while the run writes it); a rerun of the same configuration resumes from its model-answer cache and
        snapshots, another configuration is refused.
      progress: progress lines on stderr.

    Returns:
      ``{"rows", "summary", "mia", "one_run"}``: ``rows`` as written to ``results.json`` (one per pipeline, mode,
      threat and epsilon), ``summary`` (the configuration, per-pipeline manifests, and ``llm_calls``: the run's
      logical model calls, the same fresh or resumed, split into ``computed``, ``cached`` and ``resumed``), and
      the ``mia`` and ``one_run`` objects (``None`` unless configured).

    Raises:
      InputError: a folder held by another live run, of another command, or unstamped with a finished run or
        foreign files; a corrupted stamp or resume file (:func:`check_run_folder`) -- all before the folder
        changes; the determinism check failing with ``on_mismatch = "fail"``; ``method = "exact"`` with the
        black-box threat and a sampled ESA pool of other than 2 candidates.
      ConfigFileError: a folder stamped with another configuration (naming the first differing key), or a data
        file or model the configuration names cannot be loaded (before the folder changes).
    """
    from snapaudit_jax.models import load_embedder, load_language_model

    folder = run_folder(config, out_dir)
    log = _Log(progress)
    # Everything that can be refused is refused before the folder is created or anything in it changes: a folder
    # of another configuration or held by a live run, the resume files of an earlier run, the data files, then
    # the models. The folder is made, locked and stamped only then.
    folder.check()
    check_run_folder(out_dir)
    datasets = _load_datasets(config)
    if config.llm == "openai":
        from snapaudit_jax.models.server import connect_configured

        lm = connect_configured(config.server, config.server_tokenizer, needs=server_needs(config), log=log)
    else:
        log(f"loading {config.llm}")
        lm = _load_model("model.llm", load_language_model, config.llm, config.allow_pickle)
    needs_embedder = any(p.name == "esa" for p in config.pipelines)
    embedder = _load_model("model.embedder", load_embedder, config.embedder, config.allow_pickle) \
        if needs_embedder else None
    with folder.claim():
        return _audit(config, out_dir, datasets, lm, embedder, log)


def _audit(config: AuditConfig, out_dir: str, datasets: dict, lm, embedder, log) -> dict:
    """:func:`run_audit` once its folder is claimed: Phase A, the active and passive audits, the files."""
    from snapaudit_jax.dpicl.data import get_spec
    from snapaudit_jax.dpicl.pipelines import KeywordPipeline, LLMOracle, make_case
    from snapaudit_jax.dpicl.pipelines.phase_a import generate_snapshots

    oracle = LLMOracle(lm, embedder, cache_path=os.path.join(out_dir, "llm_cache.jsonl"),
                       batch_size=config.batch_size, progress=log.bar)
    n_passive = config.passive_runs or config.snapshots
    rows, full, summaries = [], [], {}
    for settings in config.pipelines:
        log(f"pipeline {settings.name}: dataset {settings.dataset}, query {config.query}, defense {config.defense}")
        spec = get_spec(settings.dataset)
        examples = datasets[(settings.dataset, settings.data_path)]
        extra = {}
        signals = None
        if settings.name == "esa":
            signals, extra["signals"] = _signal_pair(settings, examples, oracle, log)
        case = make_case(examples, spec, mode=config.query, num_exemplars=settings.num_exemplars,
                         seed=config.case_seed, oracle=oracle, signals=signals if config.query == "copy" else None)
        kwargs = {"defense": config.defense}
        if settings.name == "poe":
            kwargs["clip"] = settings.clip
        else:
            kwargs["partitions"] = settings.partitions
        if settings.name == "esa":
            kwargs["signals"] = signals
        if settings.name == "ksa":
            kwargs["top_k"] = settings.top_k
            kwargs["neighbouring"] = settings.neighbouring
        pipeline = PIPELINES[settings.name](oracle, case, **kwargs)
        pool_notes, pool_warnings, candidate_calls = [], (), 0
        if settings.name == "esa":
            pipeline.pool = _esa_pool(config, settings, pipeline, log)  # once, before any snapshot or trial
            extra["candidate_pool"] = pipeline.pool.to_dict()
            pool_notes, pool_warnings = _pool_notes(pipeline.pool)
            candidate_calls = pipeline.pool.calls
        log(f"  phase A: {config.snapshots} calls of M' per context")
        run = generate_snapshots(pipeline, snapshots=config.snapshots, seed=config.seed,
                                 run_dir=os.path.join(out_dir, "snapshots"), verify=config.verify)
        snaps = run.snapshots
        if isinstance(pipeline, KeywordPipeline) and pipeline.vocabulary is None:
            pipeline.vocabulary = tuple(run.manifest["vocabulary"])
        if settings.name == "esa" and settings.candidates == "fixed":
            extra["candidate_coverage"] = pipeline.candidate_coverage(settings.candidate_calls, config.seed)
        active_calls = run.manifest["llm_calls"] + candidate_calls
        clean, notes, extra_warnings = _clean_model(config, run.manifest.get("determinism_check") or {}, log)
        # Passive runs: fresh partition assignments (seed stream 1), the same model-call budget; ESA with a
        # sampled pool: a fresh pool per run (pseudo-seeds of run r from [seed + 1, r]; run r of both contexts
        # shares it, as it shares the partition assignment).
        runs, passive_calls = passive_plan(n_passive, pipeline.calls_per_clean_of(1) + pipeline.calls_per_clean_of(0),
                                           candidate_calls)
        log(f"  passive: {runs} end-to-end runs per context")
        t0 = time.perf_counter()
        if isinstance(pipeline, KeywordPipeline):
            passive_clean = tuple(pipeline.count(pipeline.clean_calls(b, runs, config.seed + 1)) for b in (1, 0))
        else:
            passive_clean = tuple(pipeline.clean_outputs(b, runs, config.seed + 1) for b in (1, 0))
        passive_pools = None
        if candidate_calls:
            passive_pools = tuple(pipeline.draw_pools(candidate_calls, [(config.seed + 1, r) for r in range(runs)])
                                  for _ in (1, 0))
            extra["passive_candidate_pools"] = {
                "runs": runs, "calls_per_run": candidate_calls, "fresh_per_run": True,
                "with_y1": sum(p.target is not None for p in passive_pools[0]),
                "with_both_signals": sum(set(p.signals) <= set(p.texts) for p in passive_pools[0]),
                "sizes": [len(p.texts) for p in passive_pools[0]],
            }
        passive_llm_seconds = time.perf_counter() - t0
        attack = _apriori_attack(pipeline)
        for eps in config.epsilons:
            mech = pipeline.mechanism(eps, config.delta, config.calibration)
            for threat in config.threats:
                target = None if snaps.target is None else int(snaps.target)  # None: the default rule
                res = audit(mech, snaps.with_canary, snaps.without_canary, epsilon_theory=eps, delta=config.delta,
                            threat=threat, trials=config.trials, confidence=config.confidence, clean=clean,
                            target=target, sensitivity=pipeline.sensitivity, seed=config.seed, method=config.method)
                warns = res.warnings + extra_warnings + (pool_warnings if threat == "black" else ())
                res = dataclasses.replace(res, assumptions=" ".join([res.assumptions, *notes, *pool_notes]),
                                          warnings=warns)
                rows.append(_row(settings.name, "active", res, active_calls, res.seconds))
                full.append({"pipeline": settings.name, "mode": "active", **res.to_dict()})
            t1 = time.perf_counter()
            key = jax.random.fold_in(jax.random.key(config.seed), int(eps * 1000))
            if passive_pools is not None:
                outcomes = [_esa_fresh_pool_outcomes(pipeline, mech, pools, c, jax.random.fold_in(key, b))
                            for b, c, pools in ((1, passive_clean[0], passive_pools[0]),
                                                (0, passive_clean[1], passive_pools[1]))]
            else:
                outcomes = [_passive_outcomes(pipeline, mech, attack, c, jax.random.fold_in(key, b))
                            for b, c in ((1, passive_clean[0]), (0, passive_clean[1]))]
            calls = passive_calls
            if isinstance(pipeline, KeywordPipeline) and settings.reconstruct:
                outcomes = [(_ksa_reconstructed_hits(pipeline, mech, c, jax.random.fold_in(key, 10 + b)), o[1])
                            for b, c, o in ((1, passive_clean[0], outcomes[0]), (0, passive_clean[1], outcomes[1]))]
                calls += 2 * runs
            for threat in config.threats:
                res = passive_bounds(outcomes[0], outcomes[1], epsilon_theory=eps, delta=config.delta,
                                     threat=threat, confidence=config.confidence, name=settings.name)
                seconds = time.perf_counter() - t1 + passive_llm_seconds / len(config.epsilons)
                rows.append(_row(settings.name, "passive", res, calls, seconds))
                full.append({"pipeline": settings.name, "mode": "passive", **res.to_dict()})
        summaries[settings.name] = {"manifest": run.manifest, **extra, "active_llm_calls": active_calls,
                                    "passive_runs": runs, "passive_llm_calls": passive_calls, "clean": clean,
                                    "target": None if snaps.target is None else int(snaps.target)}
        plot_rows = [r for r in rows if r["pipeline"] == settings.name]
        plot_pipeline(os.path.join(out_dir, f"{settings.name}.png"), settings.name, plot_rows)
    mia = _run_mia(config, lm, oracle, log) if config.mia else None
    one_run = _run_one_run(config, oracle, log) if config.one_run else None
    summary = {"config": dataclasses.asdict(config), "pipelines": summaries,
               "llm_calls": _llm_calls(oracle.stats, summaries)}
    write_json(os.path.join(out_dir, "results.json"), rows)
    extra_full = {} if one_run is None else {"one_run": one_run}
    write_json(os.path.join(out_dir, "results_full.json"), {"summary": summary, "results": full, **extra_full})
    if mia is not None:
        write_json(os.path.join(out_dir, "mia.json"), mia)
    if one_run is not None:
        write_json(os.path.join(out_dir, "one_run.json"), one_run)
    write_text(os.path.join(out_dir, "table.md"), format_report(rows, summaries, mia, one_run))
    log(f"done: {out_dir}")
    return {"rows": rows, "summary": summary, "mia": mia, "one_run": one_run}


def _run_one_run(config: AuditConfig, oracle, log) -> dict:
    """``[one_run]``: one-run audits of PV/PoE (:mod:`snapaudit_jax.dpicl.one_run`); the ``one_run.json`` object."""
    from snapaudit_jax.dpicl import one_run as one_run_icl
    from snapaudit_jax.dpicl.data import get_spec, load_examples

    s = config.one_run
    spec, examples = get_spec(s.dataset), load_examples(s.dataset, s.data_path)
    rows = []
    for name in s.pipelines:
        m = s.slots_for(name)
        groups = s.partitions if name == "pv" else m + s.base_exemplars
        log(f"one-run {name}: {m} canaries (p = {s.insert_probability:g}), {groups} "
            f"{'partitions' if name == 'pv' else 'experts'}, {m * groups} model calls")
        rows += one_run_icl.one_run_pipeline(name, s, oracle, examples, spec, delta0=config.delta,
                                             calibration=config.calibration, defense=config.defense, log=log)
        for r in rows[-len(s.epsilons):]:
            bounds = ", ".join(f"{t} {v['epsilon']:.2f}" for t, v in r["threats"].items())
            log(f"  eps/query {r['epsilon_per_query']:g}: composed eps {r['claim']['epsilon']:.2f} at delta "
                f"{s.delta:g}; one-run lower bounds {bounds}")
    return {"settings": dataclasses.asdict(s), "interaction": one_run_icl.INTERACTION_NOTE,
            "guarantees": one_run_icl.GUARANTEES,
            "rows": rows}


def _run_mia(config: AuditConfig, lm, oracle, log) -> dict:
    """Clean-output MIA AUC per pipeline, query and defense over ``canaries`` audit cases."""
    from snapaudit_jax.dpicl.data import get_spec, load_examples
    from snapaudit_jax.dpicl.pipelines import PIPELINES, KeywordPipeline, make_case

    mia = config.mia
    out = []
    for name in mia.pipelines:
        settings = next((p for p in config.pipelines if p.name == name), PipelineConfig(name, DEFAULT_DATASET[name]))
        examples = load_examples(settings.dataset, settings.data_path)
        spec = get_spec(settings.dataset)
        for query in mia.queries:
            for defense in mia.defenses:
                log(f"mia: {name} {query} {defense}")
                pos, neg = [], []
                for c in range(mia.canaries):
                    case = make_case(examples, spec, mode=query, num_exemplars=settings.num_exemplars,
                                     seed=1000 + c, oracle=oracle)
                    kwargs = {"defense": defense}
                    if name == "poe":
                        kwargs["clip"] = settings.clip
                    else:
                        kwargs["partitions"] = settings.partitions
                    if name == "ksa":
                        kwargs["top_k"] = settings.top_k
                    pipe = PIPELINES[name](oracle, case, **kwargs)
                    if isinstance(pipe, KeywordPipeline):
                        h1, h0 = pipe.histograms(pipe.clean_calls(1, 1, c), pipe.clean_calls(0, 1, c))
                        pos.append(float(h1[0, pipe.target]))
                        neg.append(float(h0[0, pipe.target]))
                    else:
                        pos.append(_clean_signal(pipe, pipe.clean_outputs(1, 1, c)[0]))
                        neg.append(_clean_signal(pipe, pipe.clean_outputs(0, 1, c)[0]))
                out.append({"pipeline": name, "query": query, "defense": defense, "canaries": mia.canaries,
                            "auc": roc_auc(pos, neg)})
    return {"rows": out, "note": "AUC of a one-call clean-output signal over canaries (SnapAudit Table 12)"}
