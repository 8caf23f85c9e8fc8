"""``snapaudit cpa CONFIG.toml``: the run of a conformal privacy audit of declared attacker configurations.

A run builds linkage suites (synthetic K1-K3 ladder x release mechanisms,
Blog-style authors with W profile posts, or real datasets from local files),
applies each configured attacker to each of its suites, splits the documents
into calibration and test parts of the declared sizes (seeded; the same split
for every suite over the same documents), calibrates one threshold per
attacker x suite x alpha, and evaluates the test documents. Stress tests:
drift (calibrate on one suite, test on another), top-K truncation of the
pool, and Mondrian (per-stratum) calibration over pooled suites.

Output folder: ``summary.json`` (one row per suite/alpha with the keys
``suite, knowledge_level, alpha, n_cal, n_test, coverage,
coverage_conditional, candidate_miss_rate, median_set_size, mean_set_size,
leakage_proxy, qhat, top1`` and more; ``qhat`` is ``null`` for +inf, i.e.
full sets), ``report.md``, ``documents/<attacker>/<suite>.jsonl`` (one line
per document of both splits), ``alpha_dial_<attacker>.png``,
``set_sizes_<attacker>.png``, ``config.json``, ``run.json`` (the run stamp,
:func:`run_folder`), and for LLM attackers the model-answer cache
``llm_cache.jsonl`` (an interrupted run resumes from it).

Guarantees:
  Every coverage statement holds for the declared configuration (data
  source, release, knowledge level, attacker, split sizes) under
  exchangeability of calibration and test documents; drift rows show what
  happens when it is broken. Thresholds never see test documents.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import os
import time
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from conformal.calibration import Calibration, calibrate, coverage_check
from conformal.config import DATA_DEFAULTS, AttackerConfig, CPAConfig
from conformal.kernels import prediction_sets, scores, truncate_top_k
from conformal.metrics import ranking_metrics, set_metrics
from conformal.report import format_report, safe_name, write_plots
from snapaudit_jax.utils.config import ConfigFileError
from snapaudit_jax.utils.errors import InputError
from snapaudit_jax.utils.io import atomic_write, dumps, to_json, write_json, write_text
from snapaudit_jax.utils.progress import RunLog
from snapaudit_jax.utils.run_folder import RunFolder

__all__ = ["RESULT_FILES", "RESUME_FILES", "build_suites", "check_references", "run_cpa", "run_folder"]

RESULT_FILES = ("summary.json", "report.md", "validity_checks.json", "config.json")  # a finished run's files
RESUME_FILES = ("llm_cache.jsonl",)  # what a rerun resumes from (adopted in an unstamped folder)


def build_suites(config: CPAConfig) -> dict[str, Any]:
    """``{suite name: LinkageSuite}`` of every configured data source.

    Args:
      config: the run's configuration (its ``data`` sections and ``seed``).

    Returns:
      ``{suite name: LinkageSuite}`` in the order of the sections.

    Raises:
      ConfigFileError: naming ``data.<source>.<key>``, for sizes or values a generator or loader refuses, a
        path that does not exist or a dataset file in a wrong format.
    """
    from conformal.data.synthetic import synthetic_ladder
    from conformal.data.synthetic_blogs import blog_suite

    suites = {}
    for source, p in config.data.items():
        if source == "synthetic":
            if p["n_documents"] > p["n_people"]:
                raise ConfigFileError(f"data.synthetic.n_documents: must be <= n_people = {p['n_people']}, "
                                      f"got {p['n_documents']}")
            try:
                ladder = synthetic_ladder(p["n_people"], p["n_documents"], seed=config.seed, releases=p["releases"],
                                          levels=p["levels"], pool=p["pool"])
            except ValueError as err:
                raise _generator_error(source, err) from None
            suites.update({s.name: s for s in ladder.values()})
        elif source == "blog":
            for w in p["W"]:
                try:
                    s = blog_suite(p["n_authors"], posts_per_author=p["posts_per_author"], W=w,
                                   n_released_per_author=p["n_released_per_author"], seed=config.seed)
                except ValueError as err:
                    raise _generator_error(source, err) from None
                suites[s.name] = s
        else:
            from conformal.data import loaders

            try:
                loaded = loaders.load_source(source, p, seed=config.seed)
            except OSError as err:  # FileNotFoundError: a path, or a file it needs, does not exist
                raise ConfigFileError(f"data.{source}.path: {err}") from None
            except ValueError as err:
                raise ConfigFileError(f"data.{err}") from None
            for s in loaded:
                suites[s.name] = s
    return suites


def _generator_error(source: str, err: ValueError) -> ConfigFileError:
    """A generator's argument error as ``data.<source>.<key>: ...`` (``knowledge_level`` is ``levels``)."""
    msg = str(err)
    head = msg.split(" ", 1)[0]
    key = {"knowledge_level": "levels", "release": "releases"}.get(head, head)
    return ConfigFileError(f"data.{source}.{key}: {msg}" if key in DATA_DEFAULTS[source] else f"data.{source}: {msg}")


def _match(patterns, names) -> list[str]:
    return [n for n in names if any(fnmatch.fnmatchcase(n, pat) for pat in patterns)]


def _split(doc_ids, n_cal: int, n_test: int, seed: int, split: int) -> tuple[np.ndarray, np.ndarray]:
    """Calibration and test positions: a seeded permutation of the sorted document ids.

    Suites over the same documents get the same split, so a drift test never
    evaluates a document its threshold was calibrated on.
    """
    ids = list(doc_ids)
    order = sorted(range(len(ids)), key=ids.__getitem__)
    perm = np.random.default_rng([seed, 7, split]).permutation(len(ids))
    chosen = np.asarray(order)[perm]
    return chosen[:n_cal], chosen[n_cal:n_cal + n_test]


# ---------------------------------------------------------------------------
# Attackers -> per-document weights over candidates
# ---------------------------------------------------------------------------


@dataclasses.dataclass
class _Attack:
    """One attacker on one suite: distributions (or identity scores) over each document's pool."""

    probs: np.ndarray | None  # (n, m) distributions, or None for score-based attackers
    cand_scores: np.ndarray | None  # (n, m) nonconformity scores (profile attacker)
    labels: np.ndarray  # (n,) pool position of the truth, -1 if absent
    pools: np.ndarray | None  # (n, K) candidate indices after top-K truncation, else None
    llm_calls: int = 0


class _Models:
    """Lazily loaded language models and their cached, counted oracles (shared by all attackers).

    ``model = "openai"`` is the model of ``config.server``: probed once, with the capabilities its attackers
    need checked before any output exists (a profile attacker reads forced-choice label log-probabilities).
    """

    def __init__(self, out_dir: str, config: CPAConfig, log):
        self.out_dir, self.config, self.log = out_dir, config, log
        self.batch_size = config.batch_size
        self._oracles = {}

    def oracle(self, model: str, key: str = "model"):
        """The cached oracle of ``model``; a checkpoint that cannot be loaded names ``key`` (a config key)."""
        if model not in self._oracles:
            from snapaudit_jax.models import load_language_model
            from snapaudit_jax.models.oracle import LLMOracle

            if model == "openai":
                from snapaudit_jax.models.server import connect_configured

                needs = [("logprobs", f"the profile attacker {a.name!r} (forced-choice label log-probabilities)")
                         for a in self.config.attackers if a.kind == "profile" and a.uses_server]
                lm = connect_configured(self.config.server, self.config.server_tokenizer, needs=needs, log=self.log)
            else:
                self.log(f"loading language model {model}")
                try:
                    lm = load_language_model(model)
                except (ValueError, OSError) as err:
                    raise ConfigFileError(f"{key}: {err}") from None
            cache = os.path.join(self.out_dir, "llm_cache.jsonl")
            self._oracles[model] = LLMOracle(lm, cache_path=cache, batch_size=self.batch_size, progress=self.log.bar)
        return self._oracles[model]

    def servers(self) -> list[dict]:
        """What the run's manifest records of the model servers it used (``server_info`` of each)."""
        return [o.lm.server_info for o in self._oracles.values() if hasattr(o.lm, "server_info")]


def _attack(settings: AttackerConfig, suite, rows: np.ndarray, config: CPAConfig, models: _Models) -> _Attack:
    from conformal.attackers import ClueAttacker, RetrievalAttacker
    from conformal.profile import ProfileAttacker, identity_scores

    docs = [suite.documents[i] for i in rows]
    labels = suite.label_indices()[rows]
    calls = 0
    if settings.kind in ("retrieval", "clues"):
        retrieval = RetrievalAttacker(suite.profiles, temperature=settings.temperature)
        if settings.kind == "clues":
            oracle = models.oracle(settings.model)
            before = oracle.stats.calls
            probs = ClueAttacker(retrieval, oracle, max_new_tokens=settings.max_new_tokens).posterior(docs)
            calls = oracle.stats.calls - before
        else:
            probs = retrieval.posterior(docs)
        if settings.top_k:
            k = min(settings.top_k, probs.shape[1])
            pools, probs, labels = (np.asarray(x) for x in truncate_top_k(probs, k, labels))
            return _Attack(probs, None, labels, pools, calls)
        return _Attack(probs, None, labels, None, calls)
    if not suite.attributes:
        raise InputError(f"attacker {settings.name!r} (profile) needs attribute vocabularies; suite {suite.name!r} "
                         "has none")
    attributes = dict(suite.attributes)
    if settings.attributes is not None:
        attributes = {a: attributes[a] for a in settings.attributes}
    oracle = models.oracle(settings.model)
    before = oracle.stats.calls
    attacker = ProfileAttacker(oracle, attributes, samples=settings.samples,
                               key=jax.random.fold_in(jax.random.key(config.seed), 1001))
    freqs = attacker.frequencies(docs, [suite.doc_ids[i] for i in rows])
    cand = identity_scores(freqs, attributes, suite.candidate_attributes, config.score)
    return _Attack(None, cand, labels, None, oracle.stats.calls - before)


# ---------------------------------------------------------------------------
# Calibration and evaluation
# ---------------------------------------------------------------------------


def _true_scores(att: _Attack, idx: np.ndarray, score: str) -> tuple[np.ndarray, int]:
    """Scores of the documents ``idx`` whose truth is in the pool, and how many were not."""
    lab = att.labels[idx]
    keep = idx[lab >= 0]
    if keep.size == 0:
        return np.zeros(0, np.float32), int(idx.size)
    if att.probs is not None:
        s = np.asarray(scores(att.probs[keep], att.labels[keep], score))
    else:
        s = att.cand_scores[keep, att.labels[keep]]
    return s.astype(_precision(att)), int(idx.size - keep.size)


def _precision(att: _Attack):
    """The dtype of the attack's scores: float64 for float64 posteriors (scored in float64 by conformal.kernels),
    float32 otherwise. A threshold read back from JSON is a float64 holding that dtype's value: it is cast back,
    so the sets compare in the scores' own precision, as the calibration did."""
    source = att.probs if att.probs is not None else att.cand_scores
    return np.float64 if np.asarray(source).dtype == np.float64 else np.float32


def _sets(att: _Attack, idx: np.ndarray, qhat, score: str) -> np.ndarray:
    q = np.asarray(qhat, _precision(att))
    if att.probs is not None:
        return np.asarray(prediction_sets(att.probs[idx], q, score))
    return att.cand_scores[idx] <= q.reshape(-1, 1)


def _ranking(att: _Attack, idx: np.ndarray) -> dict:
    if att.probs is not None:
        return ranking_metrics(att.probs[idx], att.labels[idx])
    weights = 1.0 - att.cand_scores[idx]  # smaller score = more plausible
    weights = weights / np.maximum(weights.sum(axis=1, keepdims=True), 1e-30)
    return ranking_metrics(weights, att.labels[idx])


def _evaluate(att_cal: _Attack, att_test: _Attack, cal: np.ndarray, test: np.ndarray, config: CPAConfig,
              strata_cal=None, strata_test=None) -> tuple[Calibration, list[dict], dict]:
    cal_scores, n_missing = _true_scores(att_cal, cal, config.score)
    calibration = calibrate(cal_scores, list(config.alphas), score=config.score, strata=strata_cal,
                            n_missing=n_missing, confidence=config.confidence)
    ranking = _ranking(att_test, test)
    per_alpha, sets_by_alpha = [], {}
    for alpha in config.alphas:
        qhat = calibration.thresholds(alpha, strata_test if calibration.mondrian else None)
        sets = _sets(att_test, test, qhat, config.score)
        sets_by_alpha[alpha] = sets
        m = set_metrics(sets, att_test.labels[test])
        m.update(alpha=alpha, qhat=qhat, certified_coverage=calibration.certified_coverage(alpha))
        per_alpha.append(m)
    test_scores, _ = _true_scores(att_test, test, config.score)
    # Bonferroni over the splits: a row's alarm (any split) keeps the false-alarm rate <= 1 - confidence.
    check_confidence = 1.0 - (1.0 - config.confidence) / config.splits
    check = coverage_check(cal_scores, test_scores, config.alphas, confidence=check_confidence) \
        if test_scores.size and not calibration.mondrian else None
    return calibration, per_alpha, {"ranking": ranking, "check": check, "sets": sets_by_alpha}


def _qhat_json(q):
    """A scalar threshold (``None`` if infinite: every set is full); ``None`` for Mondrian's per-group ones."""
    return to_json(float(q)) if np.ndim(q) == 0 else None


def _row(kind, attacker, suite_name, level, release, m: dict, ranking: dict, n_cal, n_test, extra=None) -> dict:
    row = {
        "suite": suite_name, "knowledge_level": level, "alpha": m["alpha"], "n_cal": n_cal, "n_test": n_test,
        "coverage": m["coverage"], "coverage_conditional": m["coverage_conditional"],
        "candidate_miss_rate": m["candidate_miss_rate"], "median_set_size": m["median_set_size"],
        "mean_set_size": m["mean_set_size"], "leakage_proxy": m["leakage_proxy"], "qhat": _qhat_json(m["qhat"]),
        "top1": ranking["top1"],
        "kind": kind, "attacker": attacker, "release": release,
        "top5": ranking.get("top5"), "mrr": ranking["mrr"], "empty_set_rate": m["empty_set_rate"],
        "p90_set_size": m["p90_set_size"], "max_set_size": m["max_set_size"], "pool_size": m["pool_size"],
        "certified_coverage": m["certified_coverage"],
    }
    row.update(extra or {})
    return row


def _average(rows_by_split: list[list[dict]]) -> list[dict]:
    """Averages numeric row fields over splits; adds ``coverage_sd`` (spread over splits)."""
    if len(rows_by_split) == 1:
        return [dict(r, splits=1, coverage_sd=0.0) for r in rows_by_split[0]]
    out = []
    for group in zip(*rows_by_split):
        row = dict(group[0])
        for key, value in row.items():
            values = [g[key] for g in group]
            if isinstance(value, (int, float)) and not isinstance(value, bool) and \
                    all(isinstance(v, (int, float)) for v in values) and key not in ("alpha",):
                row[key] = float(np.mean(values))
            elif isinstance(value, bool):
                row[key] = any(values)
        row["splits"] = len(group)
        row["coverage_sd"] = float(np.std([g["coverage"] for g in group], ddof=1))
        out.append(row)
    return out


def _doc_lines(att: _Attack, suite, rows, positions, split_name: str, sets_by_alpha, report_alpha,
               score: str) -> list[dict]:
    """JSONL records of documents ``positions`` (indices into the attack arrays)."""
    lines = []
    q_scores = np.full(len(positions), np.nan)
    lab = att.labels[positions]
    ok = lab >= 0
    if ok.any():
        if att.probs is not None:
            q_scores[ok] = np.asarray(scores(att.probs[positions[ok]], lab[ok], score))
        else:
            q_scores[ok] = att.cand_scores[positions[ok], lab[ok]]
    weights = att.probs if att.probs is not None else -att.cand_scores
    for j, pos in enumerate(positions):
        doc = int(rows[pos])
        top = np.argsort(-weights[pos])[:10]
        pool = att.pools[pos] if att.pools is not None else np.arange(len(suite.candidates))
        names = [suite.candidates[int(i)] for i in pool]
        record = {
            "doc_id": suite.doc_ids[doc], "split": split_name, "identity": suite.identities[doc],
            "query": suite.documents[doc],
            "top_candidates": [{"candidate": names[c], "weight": float(weights[pos, c])} for c in top],
            "score": None if np.isnan(q_scores[j]) else float(q_scores[j]),
            "in_pool": bool(lab[j] >= 0),
        }
        membership = sets_by_alpha[j]
        record["set_size"] = {str(a): int(membership[a].sum()) for a in membership}
        chosen = membership[report_alpha]
        record["set"] = [names[c] for c in np.flatnonzero(chosen)] if chosen.sum() <= 100 else None
        record["covered"] = {str(a): bool(lab[j] >= 0 and membership[a][lab[j]]) for a in membership}
        lines.append(record)
    return lines


def _write_jsonl(path: str, records: list[dict]) -> None:

    data = "".join(dumps(r) + "\n" for r in records).encode()
    atomic_write(path, lambda fh: fh.write(data))


def check_references(config: CPAConfig, suites: Mapping[str, Any]) -> None:
    """Raises :class:`ConfigFileError` for split sizes, suite names and attacker kinds the suites cannot serve.

    Args:
      config: the run's configuration.
      suites: the suites of :func:`build_suites`.

    Raises:
      ConfigFileError: for split sizes above a suite's documents, an attacker whose ``suites`` match none,
        a ``profile`` attacker on a suite without attribute vocabularies (or asking about attributes it lacks),
        an unknown suite in ``[[drift]]``, ``[truncation]`` or ``[mondrian]``, or a truncation attacker that
        is a profile attacker or has ``top_k``.
    """
    names = ", ".join(suites)
    need = config.n_cal + config.n_test
    for name, s in suites.items():
        if s.n_documents < need:
            raise ConfigFileError(f"run.n_cal + run.n_test = {need} exceeds the {s.n_documents} documents of "
                                  f"suite {name!r}")
    by_name = {a.name: a for a in config.attackers}
    for a in config.attackers:
        targets = _match(a.suites, suites)
        if not targets:
            raise ConfigFileError(f"attackers.{a.name}.suites: {list(a.suites)} match no suite (suites: {names})")
        if a.kind == "profile":
            for t in targets:
                if not suites[t].attributes:
                    raise ConfigFileError(f"attackers.{a.name}: kind 'profile' needs attribute vocabularies; "
                                          f"suite {t!r} has none (restrict attackers.{a.name}.suites)")
                missing = sorted(set(a.attributes or ()) - set(suites[t].attributes))
                if missing:
                    raise ConfigFileError(f"attackers.{a.name}.attributes: {missing} not attributes of suite "
                                          f"{t!r} (it has {sorted(suites[t].attributes)})")
    for _, cal_name, test_name in config.drift:
        for n in (cal_name, test_name):
            if n not in suites:
                raise ConfigFileError(f"drift: unknown suite {n!r} (suites: {names})")
    if config.truncation is not None:
        attacker_name, suite_name, _ = config.truncation
        if suite_name not in suites:
            raise ConfigFileError(f"truncation.suite: unknown suite {suite_name!r} (suites: {names})")
        if by_name[attacker_name].kind == "profile" or by_name[attacker_name].top_k:
            raise ConfigFileError("truncation.attacker: must be a retrieval or clues attacker without top_k, "
                                  f"got {attacker_name!r}")
    if config.mondrian is not None:
        for n in config.mondrian[1]:
            if n not in suites:
                raise ConfigFileError(f"mondrian.suites: unknown suite {n!r} (suites: {names})")


def run_cpa(config: CPAConfig, out_dir: str, *, progress: bool = True) -> dict:
    """Runs every configured attacker on its suites, the stress tests, and writes the run folder.

    Every error a configuration can cause (a folder of another configuration or held by a live run,
    :func:`check_references`, a model that does not load, a model server that cannot be reached or lacks a
    capability an attacker needs, a corrupted answer cache) is raised before the output folder is made or
    changed.

    Args:
      config: the run's configuration.
      out_dir: the run folder, owned by this run (:func:`run_folder`: stamped with the configuration, locked
        while the run writes it; made if missing); a rerun of the same configuration reuses its
        ``llm_cache.jsonl``, another configuration is refused.
      progress: log progress lines on stderr.

    Returns:
      ``{"rows": summary rows, "checks": validity checks, "seconds": float, "suites": {name: summary},
      "servers": [{"backend", "base_url", "model"}, ...]}`` (``servers``: the model servers the LLM attackers
      used, none for in-process models).

    Raises:
      ConfigFileError: as :func:`build_suites` and :func:`check_references`, for a language model that cannot
        be loaded, or for a folder stamped with another configuration (naming the first differing key).
      ServerError: the ``[server]`` probe failed or lacks log-probs a profile attacker needs.
      InputError: for a corrupted ``llm_cache.jsonl`` in ``out_dir``, or a folder held by another live run, of
        another command, with a corrupted stamp, or unstamped with a finished run or foreign files.
    """
    folder = run_folder(config, out_dir)
    folder.check()  # a folder of another configuration or held by a live run: refused first, nothing changed
    log = RunLog(progress)
    t0 = time.perf_counter()
    suites = build_suites(config)
    log(f"{len(suites)} suites: " + ", ".join(f"{n} ({s.n_documents} docs x {s.n_candidates} candidates)"
                                              for n, s in suites.items()))
    check_references(config, suites)  # every error a config can cause is raised before anything is written
    cache = os.path.join(out_dir, "llm_cache.jsonl")
    if os.path.exists(cache):
        from snapaudit_jax.models.oracle import read_cache

        read_cache(cache)  # a corrupted answer cache of an earlier run: refused before any model is loaded
    models = _Models(out_dir, config, log)
    for attacker in config.attackers:  # models load before the folder is made: a bad checkpoint writes nothing
        if attacker.kind != "retrieval":
            models.oracle(attacker.model, f"attackers.{attacker.name}.model")
    with folder.claim():  # the folder is made, locked and stamped only now
        return _cpa(config, out_dir, suites, models, log, t0)


def _cpa(config: CPAConfig, out_dir: str, suites: dict, models: _Models, log, t0: float) -> dict:
    """:func:`run_cpa` once its folder is claimed: the attacks, calibrations, stress tests and files."""
    rows: list[dict] = []
    attacks: dict[tuple[str, str], tuple[_Attack, np.ndarray]] = {}
    by_name = {a.name: a for a in config.attackers}

    def attack_of(attacker: AttackerConfig, suite_name: str):
        key = (attacker.name, suite_name)
        if key not in attacks:
            suite = suites[suite_name]
            used = sorted({int(i) for s in range(config.splits)
                           for part in _split(suite.doc_ids, config.n_cal, config.n_test, config.seed, s)
                           for i in part})
            rows_used = np.asarray(used, np.int64)
            start = time.perf_counter()
            att = _attack(attacker, suite, rows_used, config, models)
            log(f"{attacker.name} on {suite_name}: {len(rows_used)} documents attacked "
                f"in {time.perf_counter() - start:.1f}s" + (f", {att.llm_calls} LLM calls" if att.llm_calls else ""))
            attacks[key] = (att, rows_used)
        return attacks[key]

    def positions(rows_used: np.ndarray, doc_idx: np.ndarray) -> np.ndarray:
        lookup = {int(d): p for p, d in enumerate(rows_used)}
        return np.asarray([lookup[int(d)] for d in doc_idx], np.int64)

    checks = []
    for attacker in config.attackers:
        targets = _match(attacker.suites, suites)
        if not targets:
            raise ConfigFileError(f"attackers.{attacker.name}.suites: {list(attacker.suites)} match no suite "
                                  f"(suites: {', '.join(suites)})")
        for name in targets:
            suite = suites[name]
            att, rows_used = attack_of(attacker, name)
            per_split = []
            for s in range(config.splits):
                cal_docs, test_docs = _split(suite.doc_ids, config.n_cal, config.n_test, config.seed, s)
                cal, test = positions(rows_used, cal_docs), positions(rows_used, test_docs)
                calibration, metrics, info = _evaluate(att, att, cal, test, config)
                check = info["check"]
                extra = {"validity_alarm": None if check is None else check.alarm,
                         "n_cal_in_pool": calibration.n_cal[None], "llm_calls": att.llm_calls,
                         "top_k": attacker.top_k or None}
                per_split.append([_row("standard", attacker.name, name, suite.knowledge_level, suite.release, m,
                                       info["ranking"], config.n_cal, config.n_test, extra) for m in metrics])
                if s == 0:
                    if check is not None:
                        checks.append({"attacker": attacker.name, "suite": name, **dataclasses.asdict(check)})
                    _write_documents(out_dir, attacker.name, name, att, rows_used, suite, cal, test, calibration,
                                     config, info["sets"])
            rows.extend(_average(per_split))

    for attacker_name, cal_name, test_name in config.drift:
        for n in (cal_name, test_name):
            if n not in suites:
                raise ConfigFileError(f"drift: unknown suite {n!r} (suites: {', '.join(suites)})")
        attacker = by_name[attacker_name]
        att_c, rows_c = attack_of(attacker, cal_name)
        att_t, rows_t = attack_of(attacker, test_name)
        per_split = []
        for s in range(config.splits):
            cal_docs, _ = _split(suites[cal_name].doc_ids, config.n_cal, config.n_test, config.seed, s)
            _, test_docs = _split(suites[test_name].doc_ids, config.n_cal, config.n_test, config.seed, s)
            overlap = ({suites[cal_name].doc_ids[i] for i in cal_docs}
                       & {suites[test_name].doc_ids[i] for i in test_docs})
            calibration, metrics, info = _evaluate(att_c, att_t, positions(rows_c, cal_docs),
                                                   positions(rows_t, test_docs), config)
            check = info["check"]
            extra = {"calibrated_on": cal_name, "tested_on": test_name, "shared_documents": len(overlap),
                     "validity_alarm": None if check is None else check.alarm}
            test_suite = suites[test_name]
            per_split.append([_row("drift", attacker_name, f"{cal_name}->{test_name}", test_suite.knowledge_level,
                                   test_suite.release, m, info["ranking"], config.n_cal, config.n_test, extra)
                              for m in metrics])
        rows.extend(_average(per_split))
        log(f"drift {cal_name} -> {test_name} done")

    if config.truncation is not None:
        attacker_name, suite_name, ks = config.truncation
        if suite_name not in suites:
            raise ConfigFileError(f"truncation.suite: unknown suite {suite_name!r} (suites: {', '.join(suites)})")
        full, rows_used = attack_of(by_name[attacker_name], suite_name)
        if full.probs is None or full.pools is not None:
            raise ConfigFileError("truncation.attacker: must be a retrieval or clues attacker without top_k")
        for k in ks:
            k = min(k, full.probs.shape[1])
            pools, probs, labels = (np.asarray(x) for x in truncate_top_k(full.probs, k, full.labels))
            att = _Attack(probs, None, labels, pools)
            per_split = []
            for s in range(config.splits):
                cal_docs, test_docs = _split(suites[suite_name].doc_ids, config.n_cal, config.n_test, config.seed, s)
                calibration, metrics, info = _evaluate(att, att, positions(rows_used, cal_docs),
                                                       positions(rows_used, test_docs), config)
                extra = {"top_k": k, "n_cal_in_pool": calibration.n_cal[None],
                         "miss_rate_upper": calibration.miss_rate_upper}
                per_split.append([_row("truncation", attacker_name, f"{suite_name}@top{k}",
                                       suites[suite_name].knowledge_level, suites[suite_name].release, m,
                                       info["ranking"], config.n_cal, config.n_test, extra) for m in metrics])
            rows.extend(_average(per_split))
        log(f"truncation sweep on {suite_name} done")

    if config.mondrian is not None:
        rows.extend(_mondrian(config, suites, by_name, attack_of, positions))
        log("Mondrian calibration done")

    seconds = time.perf_counter() - t0
    write_json(os.path.join(out_dir, "config.json"), _config_json(config))
    write_json(os.path.join(out_dir, "summary.json"), rows)
    write_json(os.path.join(out_dir, "validity_checks.json"), checks)
    write_text(os.path.join(out_dir, "report.md"), format_report(rows, config))
    write_plots(out_dir, rows, config, _set_sizes(config, attacks, suites))
    log(f"done in {seconds:.1f}s -> {out_dir}")
    return {"rows": rows, "checks": checks, "seconds": seconds, "suites": {n: s.summary() for n, s in suites.items()},
            "servers": models.servers()}


def _write_documents(out_dir, attacker, suite_name, att, rows_used, suite, cal, test, calibration, config, test_sets):
    records = []
    for split_name, pos in (("cal", cal), ("test", test)):
        if split_name == "test":
            sets = test_sets
        else:
            sets = {a: _sets(att, pos, calibration.thresholds(a), config.score) for a in config.alphas}
        per_doc = [{a: sets[a][j] for a in config.alphas} for j in range(len(pos))]
        records += _doc_lines(att, suite, rows_used, pos, split_name, per_doc, config.report_alpha, config.score)
    _write_jsonl(os.path.join(out_dir, "documents", safe_name(attacker), safe_name(suite_name) + ".jsonl"), records)


def _mondrian(config, suites, by_name, attack_of, positions) -> list[dict]:
    """Pooled vs per-suite (Mondrian) calibration over documents of several suites (strata)."""
    attacker_name, names = config.mondrian
    for n in names:
        if n not in suites:
            raise ConfigFileError(f"mondrian.suites: unknown suite {n!r} (suites: {', '.join(suites)})")
    attacker = by_name[attacker_name]
    out = []
    for mode in ("pooled", "mondrian"):
        per_split = []
        for s in range(config.splits):
            cal_scores, strata, n_missing = [], [], 0
            tests = []
            for n in names:
                att, rows_used = attack_of(attacker, n)
                cal_docs, test_docs = _split(suites[n].doc_ids, config.n_cal, config.n_test, config.seed, s)
                # each stratum contributes the calibration documents of its own split half
                sc, miss = _true_scores(att, positions(rows_used, cal_docs), config.score)
                cal_scores.append(sc)
                strata += [n] * sc.size
                n_missing += miss
                tests.append((n, att, positions(rows_used, test_docs)))
            calibration = calibrate(np.concatenate(cal_scores), list(config.alphas), score=config.score,
                                    strata=strata if mode == "mondrian" else None, n_missing=n_missing,
                                    confidence=config.confidence)
            split_rows = []
            for n, att, test in tests:
                ranking = _ranking(att, test)
                for alpha in config.alphas:
                    qhat = calibration.thresholds(alpha, [n] * len(test) if calibration.mondrian else None)
                    m = set_metrics(_sets(att, test, qhat, config.score), att.labels[test])
                    q = float(qhat[0]) if np.ndim(qhat) else float(qhat)
                    m.update(alpha=alpha, qhat=q, certified_coverage=calibration.certified_coverage(alpha))
                    split_rows.append(_row(mode, attacker_name, f"{mode}:{n}", suites[n].knowledge_level,
                                           suites[n].release, m, ranking, config.n_cal * len(names),
                                           config.n_test, {"strata": list(names)}))
            per_split.append(split_rows)
        out.extend(_average(per_split))
    return out


def run_folder(config: CPAConfig, out_dir: str | os.PathLike) -> RunFolder:
    """The run folder ``out_dir`` as a run of ``config`` owns it: its stamp and its lock.

    The stamp records every key of the configuration file, defaults filled in, except those that cannot change
    results: ``run.batch_size`` (model answers are cached by prompt, whatever the batch) and the server's
    transport (``api_key_env``, ``timeout_s``, ``max_concurrency``, ``max_retries``, the backoff); ``server``
    keeps ``base_url``, ``model`` and ``tokenizer``.

    Args:
      config: the run's configuration.
      out_dir: the run folder (it may not exist yet).

    Returns:
      The :class:`~snapaudit_jax.utils.run_folder.RunFolder` of command ``cpa``.
    """
    other_tables = ("data", "attackers", "drift", "truncation", "mondrian", "server", "server_tokenizer")
    table: dict[str, Any] = {
        "run": {f.name: getattr(config, f.name) for f in dataclasses.fields(config)
                if f.name not in other_tables and f.name != "batch_size"},
        "data": {source: dict(params) for source, params in config.data.items()},
        "attackers": {a.name: {k: v for k, v in dataclasses.asdict(a).items() if k != "name"}
                      for a in config.attackers},
    }
    if config.drift:
        table["drift"] = [{"attacker": a, "calibrate": c, "test": t} for a, c, t in config.drift]
    if config.truncation is not None:
        attacker, suite, top_k = config.truncation
        table["truncation"] = {"attacker": attacker, "suite": suite, "top_k": top_k}
    if config.mondrian is not None:
        table["mondrian"] = {"attacker": config.mondrian[0], "suites": config.mondrian[1]}
    if config.server is not None:
        table["server"] = {**config.server.public(), "tokenizer": config.server_tokenizer}
    return RunFolder(out_dir, "cpa", table, results=RESULT_FILES, resume=RESUME_FILES)


def _config_json(config: CPAConfig) -> dict:
    d = dataclasses.asdict(config)
    d["data"] = {k: dict(v) for k, v in config.data.items()}
    if config.server is not None:  # the URL holds no credentials (refused); the key is named, never read here
        d["server"] = {"backend": "openai", **config.server.public(), "tokenizer": config.server_tokenizer,
                       "api_key_env": config.server.api_key_env, "timeout_s": config.server.timeout_s,
                       "max_concurrency": config.server.max_concurrency, "max_retries": config.server.max_retries,
                       "request_budget_s": config.server.budget_s}
    return d


def _set_sizes(config: CPAConfig, attacks, suites) -> dict[str, dict[str, np.ndarray]]:
    """``{attacker: {suite: (n_test,) set sizes}}`` at ``report_alpha`` on the first split, for the plots."""
    out: dict[str, dict[str, np.ndarray]] = {}
    for attacker in config.attackers:
        sizes = {}
        for (name, suite_name), (att, rows_used) in attacks.items():
            if name != attacker.name or suite_name not in suites:
                continue
            cal_docs, test_docs = _split(suites[suite_name].doc_ids, config.n_cal, config.n_test, config.seed, 0)
            lookup = {int(d): p for p, d in enumerate(rows_used)}
            cal = np.asarray([lookup[int(d)] for d in cal_docs])
            test = np.asarray([lookup[int(d)] for d in test_docs])
            cal_scores, n_missing = _true_scores(att, cal, config.score)
            if cal_scores.size == 0:
                continue
            qhat = calibrate(cal_scores, [config.report_alpha], score=config.score,
                             n_missing=n_missing).thresholds(config.report_alpha)
            sizes[suite_name] = _sets(att, test, qhat, config.score).sum(axis=1)
        out[attacker.name] = sizes
    return out
