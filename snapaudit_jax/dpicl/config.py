"""The ``snapaudit audit`` configuration: TOML -> :class:`AuditConfig` (every error names ``section.key``).

Sections ``[model]``, ``[audit]``, ``[pipelines.<name>]`` (one per registered
pipeline), ``[mia]`` and ``[one_run]``; ``examples/quickstart.toml`` documents
every key.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any


from snapaudit_jax.audits.active import CLEAN_MODELS
from snapaudit_jax.dpicl.one_run import OneRunConfig
from snapaudit_jax.simulation.trials import MAX_TRIALS
from snapaudit_jax.utils import validate
from snapaudit_jax.utils.config import ConfigFileError, read_toml
from snapaudit_jax.utils.config import boolean as _boolean
from snapaudit_jax.utils.config import choice as _choice
from snapaudit_jax.utils.config import choices as _choices
from snapaudit_jax.utils.config import number_list as _number_list
from snapaudit_jax.utils.config import pos_int as _pos_int
from snapaudit_jax.utils.config import reject_unknown as _reject_unknown
from snapaudit_jax.utils.config import string as _string
from snapaudit_jax.utils.config import table as _table
from snapaudit_jax.utils.config import take as _take
from snapaudit_jax.utils.errors import InputError
from snapaudit_jax.utils.memory import check_fits
from snapaudit_jax.dpicl.pipelines import PIPELINES

__all__ = ["AuditConfig", "ConfigFileError", "MAX_EPSILON", "MiaConfig", "PipelineConfig", "load_config",
           "pipeline_sensitivity"]

PIPELINE_NAMES = tuple(PIPELINES)  # one pipeline per registered mechanism name
ON_MISMATCH = ("sampled", "fail")
FIXED_MIXTURE_NOTE = ("clean = fixed: the bound is for the release with its partition assignment drawn from the "
                      "recorded ones (a mixture); a violation is evidence that some assignment's release violates "
                      "the claim.")
DEFAULT_DATASET = {"pv": "agnews", "poe": "agnews", "esa": "samsum", "ksa": "samsum"}
_DEFAULT_PARTITIONS = {"pv": 3, "esa": 1, "ksa": 8}
ESA_CANDIDATES = ("sampled", "fixed")
METHODS = ("simulate", "exact")
# run_audit folds int(epsilon * 1000) into the passive runs' PRNG key, a uint32: int(epsilon * 1000) < 2^32, so
# every epsilon up to MAX_EPSILON (and below 4294967.296) is accepted.
MAX_EPSILON = (2**32 - 1) / 1000
# The one-run audit gives each canary and its decoy distinct codes among the 9000 4-digit numbers (one_run.make_slots).
ONE_RUN_CODES = 9000
# Phase A keeps, per pipeline and context, snapshots clean outputs of at least 2 float64 values (PV's two vote
# counts, PoE's two utilities; ESA and KSA have more): 32 bytes per snapshot for both contexts, a lower bound.
_BYTES_PER_SNAPSHOT = 2 * 2 * 8
# T_cand: the paper leaves it open. With the constrained stage close to a fair coin over {y1, y2}, 8 draws miss
# y1 with probability 2**-8 (either signal: 2**-7), for 8 calls -- little next to Phase A's 2 * snapshots * T.
DEFAULT_CANDIDATE_CALLS = 8


@dataclasses.dataclass(frozen=True)
class PipelineConfig:
    """``[pipelines.<name>]``: one DP-ICL pipeline.

    Attributes:
      name: ``pv``, ``poe``, ``esa`` or ``ksa``.
      dataset: dataset name (``agnews``, ``trec``, ``samsum``, ``xsum``).
      data_path: local file/folder of the dataset (default: the shipped demo data).
      num_exemplars: context size ``k``.
      partitions: ``T`` (PV 3, ESA 1, KSA 8; PoE uses one expert per exemplar).
      clip: PoE's ``Gamma``.
      top_k: KSA's ``K``.
      signals: ESA's signal sentences: ``"msgs"``, ``"gs"`` or a list of two sentences.
      signal_vocabulary: ESA: words for the signal search.
      signal_seeds: ESA: seed sentences for the signal search.
      signal_sweeps: ESA: MSGS sweeps.
      neighbouring: KSA: ``replace_one`` (default; Delta_u = 2) or ``add_remove`` (the canary's context
        without it drops it; needs one exemplar per partition, Delta_u = 1).
      reconstruct: KSA: run the reconstruction prompt in the passive audit
        (the black-box decision is then "target keyword in the final answer").
      candidates: ESA's candidate pool: ``"sampled"`` (default; the paper's constrained 0-shot stage, run
        ``candidate_calls`` times once per audit before Phase A, its distinct answers the pool, off-signal
        answers included) or ``"fixed"`` (the two signal sentences, no model call).
      candidate_calls: ESA's ``T_cand`` (default 8: ``DEFAULT_CANDIDATE_CALLS``); with ``"fixed"`` the number
        of calls of the candidate-stage diagnostic (``candidate_coverage``, not counted in the budgets).
    """

    name: str
    dataset: str
    data_path: str | None = None
    num_exemplars: int = 6
    partitions: int | None = None
    clip: float = 5.0
    top_k: int = 4
    signals: Any = "msgs"
    signal_vocabulary: int = 120
    signal_seeds: int = 2
    signal_sweeps: int = 2
    reconstruct: bool = False
    neighbouring: str = "replace_one"
    candidates: str = "sampled"
    candidate_calls: int = DEFAULT_CANDIDATE_CALLS


@dataclasses.dataclass(frozen=True)
class MiaConfig:
    """``[mia]``: clean-output membership inference (SnapAudit Table 12).

    Attributes:
      canaries: audit cases (canaries) per pipeline, query and defense (``>= 2``).
      pipelines: pipelines to attack, of ``pv``, ``poe``, ``ksa``.
      queries: query modes, of ``direct``, ``semantic``, ``copy``.
      defenses: defenses, of ``none``, ``basic``, ``strict``, ``contextleak``.
    """

    canaries: int = 6
    pipelines: tuple[str, ...] = ("pv", "poe")
    queries: tuple[str, ...] = ("direct", "copy")
    defenses: tuple[str, ...] = ("none", "strict")


@dataclasses.dataclass(frozen=True)
class AuditConfig:
    """A full audit run (see ``examples/quickstart.toml``).

    Attributes:
      llm: ``[model] llm``: ``"smollm2"``, a ``.gguf`` file or a Hugging Face folder (GPT-2 or Llama), or
        ``"openai"``: the model of an OpenAI-compatible server (``[model.server]``).
      server: ``[model.server]`` with ``llm = "openai"``: the
        :class:`~snapaudit_jax.models.server.ServerConfig` (``base_url``, ``model``, ``api_key_env``,
        ``timeout_s``, ``max_concurrency``, ``max_retries``), else ``None``.
      server_tokenizer: ``[model.server] tokenizer``: the served model's tokenizer, read locally (``"smollm2"``,
        a ``.gguf`` file or a Hugging Face folder with ``tokenizer.json``); prompts are rendered and tokenised
        with it and sent as token ids.
      embedder: ``[model] embedder``: ESA's sentence embedder, ``"minilm"`` or a BERT folder (loaded only with an
        ESA pipeline).
      allow_pickle: ``[model] allow_pickle``: accept pickle checkpoints (they can execute code).
      epsilons: the per-query ``epsilon`` (``epsilon_theory``) each pipeline is calibrated for and audited at.
      delta: ``delta`` of the claims, in ``(0, 1)``.
      confidence: confidence level of the lower bounds, in ``(0, 1)``.
      query: audit query mode: ``direct``, ``semantic`` or ``copy``.
      defense: ``none``, ``basic``, ``strict`` or ``contextleak``.
      threats: ``black`` and/or ``white``.
      snapshots: Phase A: calls of ``M'`` per neighbouring context (``n_llm >= 2``).
      trials: simulated DP-noise trials per hypothesis (active audit).
      passive_runs: end-to-end runs per context of the passive audit (``>= 2``; ``None``: ``snapshots``); ESA
        with a sampled pool gets fewer within the same budget (:func:`~snapaudit_jax.dpicl.run.passive_plan`).
      clean: clean-output model of the active audit: ``"fixed"`` (exact clean outputs of the recorded
        assignments) or ``"sampled"`` (i.i.d. draws); see :mod:`snapaudit_jax.dpicl.run`.
      on_mismatch: ``clean = "fixed"`` whose determinism check fails: ``"sampled"`` (fall back) or ``"fail"``.
      calibration: Gaussian calibration of PV and ESA: ``"analytic"`` or ``"classical"``.
      method: ``"simulate"`` (default) or ``"exact"`` (closed-form rates of PV, PoE and two-candidate ESA;
        refused for KSA, and for an ESA pool of other than 2 candidates under the black-box threat).
      seed: seed of the partition assignments, the DP-noise trials, the passive runs and ESA's pseudo-seeds.
      case_seed: seed of the audit case (canary, exemplars, secret).
      batch_size: prompts per model batch.
      verify: partition answers recomputed without the cache (determinism check; 0: none).
      pipelines: one :class:`PipelineConfig` per ``[pipelines.<name>]`` section, in file order.
      mia: ``[mia]``, or ``None``.
      one_run: ``[one_run]`` (:class:`~snapaudit_jax.dpicl.one_run.OneRunConfig`), or ``None``.
    """

    llm: str = "smollm2"
    embedder: str = "minilm"
    allow_pickle: bool = False
    server: Any = None
    server_tokenizer: str | None = None
    epsilons: tuple[float, ...] = (1.0, 2.0, 4.0, 8.0, 16.0)
    delta: float = 1e-5
    confidence: float = 0.95
    query: str = "copy"
    defense: str = "none"
    threats: tuple[str, ...] = ("black", "white")
    snapshots: int = 200
    trials: int = 200_000
    passive_runs: int | None = None
    clean: str = "fixed"
    on_mismatch: str = "sampled"
    calibration: str = "analytic"
    method: str = "simulate"
    seed: int = 0
    case_seed: int = 0
    batch_size: int = 8
    verify: int = 4
    pipelines: tuple[PipelineConfig, ...] = ()
    mia: MiaConfig | None = None
    one_run: OneRunConfig | None = None


def load_config(path: str | os.PathLike) -> AuditConfig:
    """Reads and validates a TOML audit configuration.

    Args:
      path: the TOML file (sections ``[model]``, ``[audit]``, ``[pipelines.<name>]``, ``[mia]``, ``[one_run]``).

    Returns:
      The :class:`AuditConfig`, defaults filled in.

    Raises:
      ConfigFileError: unreadable file, invalid TOML, no pipeline, unknown or invalid keys, or inconsistent
        settings (e.g. ``partitions > num_exemplars``, ``method = "exact"`` with KSA); the message names
        ``section.key``, the rule and the value.
    """
    from snapaudit_jax.dpicl.data import DATASETS
    from snapaudit_jax.dpicl.pipelines.prompts import DEFENSES, QUERY_MODES

    path = os.fspath(path)
    raw = read_toml(path)
    model = _table(raw, "model", "model", {})
    audit_s = _table(raw, "audit", "audit", {})
    pipes = _table(raw, "pipelines", "pipelines", {})
    mia = _table(raw, "mia", "mia")
    one_run = _table(raw, "one_run", "one_run")
    _reject_unknown(raw, path)
    kw: dict[str, Any] = {}
    kw["llm"] = _take(model, "llm", "model", _string, "smollm2")
    kw["embedder"] = _take(model, "embedder", "model", _string, "minilm")
    kw["allow_pickle"] = _take(model, "allow_pickle", "model", _boolean, False)
    server = _table(model, "server", "model.server")
    _reject_unknown(model, "model")
    if kw["llm"] == "openai":
        from snapaudit_jax.models.server import server_from_table

        kw["server"], kw["server_tokenizer"] = server_from_table(server, "model.server", '[model] llm = "openai"')
    elif server is not None:
        raise ConfigFileError(f"model.server: only read with [model] llm = \"openai\", got llm = {kw['llm']!r}")
    if audit_s.get("epsilons") == []:
        raise ConfigFileError("audit.epsilons: must list at least one epsilon, got []")
    kw["epsilons"] = _take(audit_s, "epsilons", "audit", _number_list(_epsilon), (1.0, 2.0, 4.0, 8.0, 16.0))
    kw["delta"] = _take(audit_s, "delta", "audit", lambda v: validate.open_unit("delta", v), 1e-5)
    kw["confidence"] = _take(audit_s, "confidence", "audit", lambda v: validate.confidence("confidence", v), 0.95)
    kw["query"] = _take(audit_s, "query", "audit", _choice(QUERY_MODES), "copy")
    kw["defense"] = _take(audit_s, "defense", "audit", _choice(DEFENSES), "none")
    kw["threats"] = _take(audit_s, "threats", "audit", _choices(("black", "white")), ("black", "white"))
    kw["snapshots"] = _take(audit_s, "snapshots", "audit", _pos_int("snapshots", 2), 200)
    kw["trials"] = _take(audit_s, "trials", "audit", _trials, 200_000)
    kw["passive_runs"] = _take(audit_s, "passive_runs", "audit", _pos_int("passive_runs", 2), None)
    for key in ("snapshots", "passive_runs"):
        if kw[key] is not None:
            try:
                check_fits(f"audit.{key}", _BYTES_PER_SNAPSHOT * kw[key], f"{kw[key]} clean outputs per context")
            except InputError as err:
                raise ConfigFileError(str(err)) from None
    kw["clean"] = _take(audit_s, "clean", "audit", _choice(CLEAN_MODELS), "fixed")
    kw["on_mismatch"] = _take(audit_s, "on_mismatch", "audit", _choice(ON_MISMATCH), "sampled")
    kw["calibration"] = _take(audit_s, "calibration", "audit", _choice(("analytic", "classical")), "analytic")
    kw["method"] = _take(audit_s, "method", "audit", _choice(METHODS), "simulate")
    kw["seed"] = _take(audit_s, "seed", "audit", lambda v: validate.seed("seed", v), 0)
    kw["case_seed"] = _take(audit_s, "case_seed", "audit", lambda v: validate.seed("case_seed", v), 0)
    kw["batch_size"] = _take(audit_s, "batch_size", "audit", _pos_int("batch_size"), 8)
    kw["verify"] = _take(audit_s, "verify", "audit", _pos_int("verify", 0), 4)
    _reject_unknown(audit_s, "audit")
    if not pipes:
        raise ConfigFileError(f"{path}: no [pipelines.<name>] section (choose from {', '.join(PIPELINE_NAMES)})")
    settings = []
    for name, body in pipes.items():
        where = f"pipelines.{name}"
        if name not in PIPELINE_NAMES:
            raise ConfigFileError(f"{where}: unknown pipeline (choose from {', '.join(PIPELINE_NAMES)})")
        body = _table({name: body}, name, where)
        for key in ("candidates", "candidate_calls"):
            if key in body and name != "esa":
                raise ConfigFileError(f"{where}.{key}: only ESA has a candidate stage, got {body[key]!r}")
        s = dict(
            name=name,
            dataset=_take(body, "dataset", where, _choice(tuple(DATASETS)), DEFAULT_DATASET[name]),
            data_path=_take(body, "data_path", where, _string, None),
            num_exemplars=_take(body, "num_exemplars", where, _pos_int("num_exemplars", 2),
                                max(6, _DEFAULT_PARTITIONS.get(name) or 0)),  # KSA: one exemplar per partition
            partitions=_take(body, "partitions", where, _pos_int("partitions"), _DEFAULT_PARTITIONS.get(name)),
            clip=_take(body, "clip", where, lambda v: validate.positive_float("clip", v), 5.0),
            top_k=_take(body, "top_k", where, _pos_int("top_k"), 4),
            signals=_take(body, "signals", where, _signals, "msgs"),
            signal_vocabulary=_take(body, "signal_vocabulary", where, _pos_int("signal_vocabulary", 2), 120),
            signal_seeds=_take(body, "signal_seeds", where, _pos_int("signal_seeds"), 2),
            signal_sweeps=_take(body, "signal_sweeps", where, _pos_int("signal_sweeps"), 2),
            reconstruct=_take(body, "reconstruct", where, _boolean, False),
            neighbouring=_take(body, "neighbouring", where, _choice(("replace_one", "add_remove")), "replace_one"),
            candidates=_take(body, "candidates", where, _choice(ESA_CANDIDATES), "sampled"),
            candidate_calls=_take(body, "candidate_calls", where, _pos_int("candidate_calls"),
                                  DEFAULT_CANDIDATE_CALLS),
        )
        _reject_unknown(body, where)
        if s["neighbouring"] != "replace_one" and name != "ksa":
            raise ConfigFileError(f"{where}.neighbouring: only KSA takes 'add_remove' (the other pipelines are "
                                  f"calibrated for replace-one), got {s['neighbouring']!r}")
        if s["neighbouring"] == "add_remove" and s["partitions"] != s["num_exemplars"]:
            raise ConfigFileError(f"{where}.neighbouring: 'add_remove' needs one exemplar per partition "
                                  f"(partitions = num_exemplars = {s['num_exemplars']}), got partitions="
                                  f"{s['partitions']}")
        if s["partitions"] is not None and s["partitions"] > s["num_exemplars"]:
            raise ConfigFileError(f"{where}.partitions: must be <= num_exemplars={s['num_exemplars']}, "
                                  f"got {s['partitions']}")
        settings.append(PipelineConfig(**s))
    kw["pipelines"] = tuple(settings)
    for p in settings:
        _check_claims(f"pipelines.{p.name}", p, kw["epsilons"], kw["delta"], kw["calibration"])
    if kw["method"] == "exact" and any(p.name == "ksa" for p in settings):
        raise ConfigFileError("audit.method: 'exact' has no closed form for KSA's top-K release ([pipelines.ksa]); "
                              "use \"simulate\" or drop the pipeline, got 'exact'")
    if mia is not None:
        kw["mia"] = MiaConfig(
            canaries=_take(mia, "canaries", "mia", _pos_int("canaries", 2), 6),
            pipelines=_take(mia, "pipelines", "mia", _choices(("pv", "poe", "ksa")), ("pv", "poe")),
            queries=_take(mia, "queries", "mia", _choices(QUERY_MODES), ("direct", "copy")),
            defenses=_take(mia, "defenses", "mia", _choices(DEFENSES), ("none", "strict")),
        )
        _reject_unknown(mia, "mia")
    if one_run is not None:
        from snapaudit_jax.dpicl.one_run import parse_config

        poe = next((p for p in settings if p.name == "poe"), None)
        kw["one_run"] = parse_config(one_run, epsilons=kw["epsilons"], threats=kw["threats"],
                                       clip=poe.clip if poe else 5.0, seed=kw["seed"])
        _check_one_run(kw["one_run"], kw["delta"], kw["calibration"])
    return AuditConfig(**kw)


def _epsilon(value) -> float:
    """An ``epsilon`` of ``audit.epsilons``: finite, > 0 and with ``int(epsilon * 1000)`` a uint32."""
    eps = validate.positive_float("epsilon", value)
    if eps * 1000 >= 2**32:  # int(eps * 1000), what run_audit folds in, is then no uint32
        raise InputError(f"epsilon must be below 4294967.296 (the audit folds int(epsilon * 1000) into a 32-bit "
                         f"PRNG key), got {value!r}")
    return eps


def _trials(value) -> int:
    """``audit.trials``: an integer in ``[1, MAX_TRIALS]`` (the simulator's int32 trial indices)."""
    trials = validate.positive_int("trials", value)
    if trials > MAX_TRIALS:
        raise InputError(f"must be <= {MAX_TRIALS} per hypothesis (the simulator's int32 trial indices), got {value!r}")
    return trials


def pipeline_sensitivity(settings: PipelineConfig) -> float:
    """The sensitivity a pipeline's mechanism is calibrated for (its pipeline class's ``sensitivity``).

    Args:
      settings: the pipeline's settings.

    Returns:
      PV ``sqrt(2)``; PoE the clip; ESA ``2 / T``; KSA 1 under ``add_remove``, else 2.
    """
    if settings.name == "pv":
        return 2.0 ** 0.5
    if settings.name == "poe":
        return float(settings.clip)
    if settings.name == "esa":
        return 2.0 / (settings.partitions or 1)
    return 1.0 if settings.neighbouring == "add_remove" else 2.0


def _calibrate(name: str, epsilon: float, delta: float, sensitivity: float, calibration: str) -> None:
    from snapaudit_jax.mechanisms.noise import (exponential_mechanism_scale, float32_noise_parameter,
                                                gaussian_sigma)

    if name in ("pv", "esa"):
        float32_noise_parameter("sigma", gaussian_sigma(epsilon, delta, sensitivity, calibration), epsilon=epsilon,
                                delta=delta, sensitivity=sensitivity)
    else:
        float32_noise_parameter("scale", exponential_mechanism_scale(epsilon, sensitivity), epsilon=epsilon,
                                sensitivity=sensitivity)


def _check_claims(where: str, settings: PipelineConfig, epsilons, delta: float, calibration: str) -> None:
    """Refuses, before any model call, a claim the pipeline's mechanism cannot be calibrated for (the limits of
    :mod:`snapaudit_jax.mechanisms.noise`); a PoE clip that alone causes it is named instead of the epsilons."""
    sensitivity = pipeline_sensitivity(settings)
    for eps in epsilons:
        try:
            _calibrate(settings.name, eps, delta, sensitivity, calibration)
        except InputError as err:
            if settings.name == "poe":
                try:
                    _calibrate("poe", eps, delta, pipeline_sensitivity(PipelineConfig("poe", "agnews")), calibration)
                except InputError:
                    pass
                else:
                    raise ConfigFileError(f"{where}.clip: {err}") from None
            raise ConfigFileError(f"audit.epsilons: {err} ({where})") from None


def _check_one_run(settings: OneRunConfig, delta: float, calibration: str) -> None:
    """``[one_run]``: its seed in the seed range and its epsilons calibrated for PV (at ``audit.delta``, the
    per-query delta of its noise) and PoE, before any model call."""
    try:
        validate.seed("seed", settings.seed)
    except InputError as err:
        raise ConfigFileError(f"one_run.seed: {err}") from None
    for key, m in (("canaries", settings.canaries), ("poe_canaries", settings.poe_canaries)):
        if m is not None and 2 * m > ONE_RUN_CODES:
            raise ConfigFileError(f"one_run.{key}: must be <= {ONE_RUN_CODES // 2} (each canary and its decoy get "
                                  f"distinct codes among the {ONE_RUN_CODES} 4-digit numbers), got {m}")
    for eps in settings.epsilons:
        try:
            if "pv" in settings.pipelines:
                _calibrate("pv", eps, delta, 2.0 ** 0.5, calibration)
            if "poe" in settings.pipelines:
                _calibrate("poe", eps, delta, settings.clip, calibration)
        except InputError as err:
            raise ConfigFileError(f"one_run.epsilons: {err}") from None


def _signals(value):
    if value in ("msgs", "gs"):
        return value
    if isinstance(value, list) and len(value) == 2 and all(isinstance(v, str) and v.strip() for v in value):
        return tuple(value)
    raise InputError(f'must be "msgs", "gs" or a list of two sentences, got {value!r}')
