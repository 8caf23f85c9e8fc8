"""``snapaudit cpa`` configuration: the TOML file of a conformal privacy audit, read and validated.

:func:`load_cpa_config` turns ``[run]``, ``[data.<source>]``, ``[attackers.<name>]``, ``[[drift]]``,
``[truncation]`` and ``[mondrian]`` into a frozen :class:`CPAConfig` (``examples/cpa_synthetic.toml``
documents every key). Errors name ``section.key``, the rule and the value.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from conformal.kernels import SCORES
from snapaudit_jax.utils import validate
from snapaudit_jax.utils.config import ConfigFileError, choice, pos_int, read_toml, reject_unknown, table, take
from snapaudit_jax.utils.errors import InputError
from snapaudit_jax.utils.memory import check_fits

__all__ = ["ATTACKER_KINDS", "DATA_SOURCES", "DATA_DEFAULTS", "AttackerConfig", "CPAConfig", "load_cpa_config"]

# The values of ``attackers.<name>.kind`` and the ``[data.<source>]`` section names.
ATTACKER_KINDS = ("retrieval", "clues", "profile")
DATA_SOURCES = ("synthetic", "blog", "tab", "textwash", "wikibio", "blog_corpus")


@dataclasses.dataclass(frozen=True)
class AttackerConfig:
    """``[attackers.<name>]``: one declared attacker configuration.

    Attributes:
      name: label in reports.
      kind: ``retrieval`` (TF-IDF), ``clues`` (LLM clues + retrieval) or ``profile`` (LLM attributes).
      suites: glob patterns of the suites it attacks (default every suite).
      temperature: retrieval softmax temperature.
      top_k: restrict each pool to the top-K retrieved candidates (0: whole pool).
      model: language model of LLM attackers: ``smollm2``, a checkpoint path, or ``openai`` (the model of the
        OpenAI-compatible server in ``[server]``).
      samples: forced-choice samples per document and attribute (``profile``).
      max_new_tokens: length of the clue list (``clues``).
      attributes: the attributes a ``profile`` attacker asks about (default: every attribute of the
        suite); the identity set is every profile consistent with all of their certified sets.
    """

    name: str
    kind: str
    suites: tuple[str, ...] = ("*",)
    temperature: float = 0.5
    top_k: int = 0
    model: str = "smollm2"
    samples: int = 10
    max_new_tokens: int = 48
    attributes: tuple[str, ...] | None = None

    @property
    def uses_server(self) -> bool:
        """Whether this attacker calls the ``[server]`` model (an LLM attacker with ``model = "openai"``)."""
        return self.kind != "retrieval" and self.model == "openai"


@dataclasses.dataclass(frozen=True)
class CPAConfig:
    """A conformal privacy audit run (``examples/cpa_synthetic.toml`` documents every key).

    Attributes:
      seed: seed of the calibration/test splits and of sampling attackers.
      alphas: miscoverage levels.
      report_alpha: the level of the per-document sets and the set-size plots.
      n_cal / n_test: declared split sizes (documents).
      splits: independent random splits (metrics are averaged; ``coverage_sd`` is their spread).
      score: nonconformity score (``aps``, ``rank``, ``prob``).
      confidence: confidence of the miss-rate bounds and of the validity check.
      data: ``{source: parameters}``.
      attackers: the attacker configurations.
      drift: ``(attacker, calibrate_suite, test_suite)`` stress tests.
      truncation: ``(attacker, suite, (K, ...))`` or ``None``.
      mondrian: ``(attacker, (suite, ...))`` or ``None``: pooled vs per-suite calibration.
      batch_size: LLM batch size.
      server: ``[server]``, read when an attacker has ``model = "openai"``: the
        :class:`~snapaudit_jax.models.server.ServerConfig` of the OpenAI-compatible server (``base_url``,
        ``model``, ``api_key_env``, ``timeout_s``, ``max_concurrency``, ``max_retries``), or ``None``.
      server_tokenizer: ``[server] tokenizer``: the served model's tokenizer, read locally (``"smollm2"``, a
        ``.gguf`` file or a model folder), or ``None``.
    """

    seed: int = 0
    alphas: tuple[float, ...] = (0.01, 0.05, 0.1, 0.2)
    report_alpha: float = 0.05
    n_cal: int = 200
    n_test: int = 200
    splits: int = 1
    score: str = "aps"
    confidence: float = 0.95
    data: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
    attackers: tuple[AttackerConfig, ...] = ()
    drift: tuple[tuple[str, str, str], ...] = ()
    truncation: tuple[str, str, tuple[int, ...]] | None = None
    mondrian: tuple[str, tuple[str, ...]] | None = None
    batch_size: int = 8
    server: Any = None
    server_tokenizer: str | None = None


# ---------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------


def _alphas(values):
    if isinstance(values, str) or not isinstance(values, list) or not values:
        raise InputError(f"must be a non-empty list of levels in (0, 1), got {values!r}")
    out = tuple(validate.open_unit("alpha", v) for v in values)
    if len(set(out)) != len(out):
        raise InputError(f"must not repeat a level, got {values!r}")
    return tuple(sorted(out))


def _string(value):
    if not isinstance(value, str) or not value:
        raise InputError(f"must be a non-empty string, got {value!r}")
    return value


def _str_list(values):
    if isinstance(values, str) or not isinstance(values, list) or not values or \
            not all(isinstance(v, str) and v for v in values):
        raise InputError(f"must be a non-empty list of strings, got {values!r}")
    return tuple(values)


def _int_list(name):
    def convert(values):
        if isinstance(values, str) or not isinstance(values, list) or not values:
            raise InputError(f"must be a non-empty list of integers >= 1, got {values!r}")
        return tuple(validate.positive_int(name, v) for v in values)

    return convert


# The retrieval posterior is softmax(similarities / temperature) in float32 (conformal.attackers): the temperature
# must be a normal float32, and with cosine similarities in [-1, 1] the quotient then stays below 2^126, finite.
MIN_TEMPERATURE = float(np.finfo(np.float32).tiny)
MAX_TEMPERATURE = float(np.finfo(np.float32).max)
# Lower bounds of what the synthetic generators hold per item: a Person has 11 fields (one 8-byte reference each,
# plus a 16-byte object header; its strings not counted), a released document at least one str object (49 bytes of
# header, its text not counted) per suite; a blog post one str as well.
_PERSON_BYTES = 11 * 8 + 16
_TEXT_BYTES = 49


def _temperature(value) -> float:
    t = validate.positive_float("temperature", value)
    if not MIN_TEMPERATURE <= t <= MAX_TEMPERATURE:
        raise InputError(f"must be in [{MIN_TEMPERATURE:.6g}, {MAX_TEMPERATURE:.6g}] (the float32 softmax of "
                         f"similarities / temperature needs a normal float32), got {value!r}")
    return t


def _check_sizes(source: str, out: dict, where: str) -> None:
    """Refuses, before generating anything, a synthetic corpus that cannot fit in memory (a ConfigFileError)."""
    try:
        _plan_sizes(source, out, where)
    except InputError as err:
        raise ConfigFileError(str(err)) from None


def _plan_sizes(source: str, out: dict, where: str) -> None:
    if source == "synthetic":
        people, documents = int(out["n_people"]), int(out["n_documents"])  # validated integers (3.0 allowed)
        suites = len(out["levels"]) * len(out["releases"])
        check_fits(f"{where}.n_people", people * _PERSON_BYTES, f"{people} people")
        check_fits(f"{where}.n_documents", documents * suites * _TEXT_BYTES + people * _PERSON_BYTES,
                   f"{documents} documents in each of {suites} suites, with {people} people")
    elif source == "blog":
        authors, per_author = int(out["n_authors"]), int(out["posts_per_author"])
        check_fits(f"{where}.posts_per_author", authors * per_author * _TEXT_BYTES,
                   f"{authors} authors x {per_author} posts")


# ``[data.<source>]``: every key the run reads and its default (``path`` has none: it is required). The
# loader sources pass further keys through to :func:`conformal.data.load_source`, which checks them.
DATA_DEFAULTS = {
    "synthetic": {"n_people": 1000, "n_documents": 400, "levels": ["K1", "K2", "K3"],
                  "releases": ["direct", "quasi_id_redaction", "rewrite"], "pool": None},
    "blog": {"n_authors": 300, "posts_per_author": 12, "W": [1, 3, 10], "n_released_per_author": 1},
    "tab": {"path": None, "levels": ["K1", "K2", "K3"], "releases": ["direct"]},
    "textwash": {"path": None, "categories": None},
    "wikibio": {"path": None, "levels": ["K1", "K2"]},
    "blog_corpus": {"path": None, "W": [1, 3, 10], "max_authors": 500},
}


_LOADER_SOURCES = ("tab", "textwash", "wikibio", "blog_corpus")


def _data_section(source: str, body: dict, where: str) -> dict:
    body = dict(body)
    out = {}
    for key, default in DATA_DEFAULTS[source].items():
        if key in body:
            out[key] = body.pop(key)
        elif key == "path" and default is None:
            raise ConfigFileError(f"{where}.path: required (a local file or folder of the {source} data)")
        else:
            out[key] = default
    if source in _LOADER_SOURCES:
        out.update(body)  # loader-specific options, validated by conformal.data.load_source
    else:
        reject_unknown(body, where)
    for key, value in out.items():
        if key in ("n_people", "n_documents", "n_authors", "posts_per_author", "n_released_per_author",
                   "max_authors"):
            take({key: value}, key, where, pos_int(key), None)
        elif key in ("levels", "releases", "categories") and value is not None:
            out[key] = take({key: value}, key, where, _str_list, None)
        elif key == "W":
            take({key: value}, key, where, _int_list("W"), None)
        elif key == "pool" and value is not None:
            take({key: value}, key, where, lambda v: validate.positive_float("pool", v), None)
            if not 0 < float(value) <= 1:
                raise ConfigFileError(f"{where}.pool: must be in (0, 1], got {value!r}")
        elif key == "path" and not isinstance(value, str):
            raise ConfigFileError(f"{where}.path: must be a string, got {value!r}")
    _check_sizes(source, out, where)
    return out


def load_cpa_config(path: str | os.PathLike) -> CPAConfig:
    """Reads and validates a TOML CPA configuration (errors name ``section.key``, the rule and the value).

    Args:
      path: the TOML file.

    Returns:
      The validated, frozen configuration.

    Raises:
      ConfigFileError: for a file that cannot be read or is not valid TOML, and, naming ``section.key``,
        for an unknown section or key, a missing required key, or a value that breaks its rule (also a
        ``ValueError``).
    """
    path = os.fspath(path)
    raw = read_toml(path)
    run = table(raw, "run", "run", {})
    data = table(raw, "data", "data", {})
    attackers = table(raw, "attackers", "attackers", {})
    drift = raw.pop("drift", [])
    truncation = table(raw, "truncation", "truncation")
    mondrian = table(raw, "mondrian", "mondrian")
    server = table(raw, "server", "server")
    reject_unknown(raw, path)
    kw: dict[str, Any] = {}
    kw["seed"] = take(run, "seed", "run", lambda v: validate.seed("seed", v), 0)
    kw["alphas"] = take(run, "alphas", "run", _alphas, (0.01, 0.05, 0.1, 0.2))
    kw["report_alpha"] = take(run, "report_alpha", "run", lambda v: validate.open_unit("report_alpha", v),
                              0.05 if 0.05 in kw["alphas"] else kw["alphas"][0])
    if kw["report_alpha"] not in kw["alphas"]:
        raise ConfigFileError(f"run.report_alpha: must be one of run.alphas {list(kw['alphas'])}, "
                              f"got {kw['report_alpha']!r}")
    kw["n_cal"] = take(run, "n_cal", "run", pos_int("n_cal"), 200)
    kw["n_test"] = take(run, "n_test", "run", pos_int("n_test"), 200)
    kw["splits"] = take(run, "splits", "run", pos_int("splits"), 1)
    kw["score"] = take(run, "score", "run", choice(SCORES), "aps")
    kw["confidence"] = take(run, "confidence", "run", lambda v: validate.open_unit("confidence", v), 0.95)
    kw["batch_size"] = take(run, "batch_size", "run", pos_int("batch_size"), 8)
    reject_unknown(run, "run")
    if not data:
        raise ConfigFileError(f"{path}: no [data.<source>] section (choose from {', '.join(DATA_SOURCES)})")
    sections = {}
    for source, body in data.items():
        if source not in DATA_SOURCES:
            raise ConfigFileError(f"data.{source}: unknown data source (choose from {', '.join(DATA_SOURCES)})")
        if not isinstance(body, dict):
            raise ConfigFileError(f"data.{source}: must be a table")
        sections[source] = _data_section(source, body, f"data.{source}")
    kw["data"] = sections
    if not attackers:
        raise ConfigFileError(f"{path}: no [attackers.<name>] section")
    settings = []
    for name, body in attackers.items():
        where = f"attackers.{name}"
        if not isinstance(body, dict):
            raise ConfigFileError(f"{where}: must be a table")
        try:  # the name is part of the output files' names (alpha_dial_<name>.png, documents/<name>/...)
            validate.file_name("attacker name", name)
        except InputError as err:
            raise ConfigFileError(f"{where[:60]}: {err}") from None
        body = dict(body)
        if "kind" not in body:
            raise ConfigFileError(f"{where}.kind: required (one of {', '.join(ATTACKER_KINDS)})")
        s = AttackerConfig(
            name=name,
            kind=take(body, "kind", where, choice(ATTACKER_KINDS), None),
            suites=take(body, "suites", where, _str_list, ("*",)),
            temperature=take(body, "temperature", where, _temperature, 0.5),
            top_k=take(body, "top_k", where, pos_int("top_k", 0), 0),
            model=take(body, "model", where, _string, "smollm2"),
            samples=take(body, "samples", where, pos_int("samples"), 10),
            max_new_tokens=take(body, "max_new_tokens", where, pos_int("max_new_tokens"), 48),
            attributes=take(body, "attributes", where, _str_list, None),
        )
        if s.attributes is not None and s.kind != "profile":
            raise ConfigFileError(f"{where}.attributes: only for kind 'profile', got kind {s.kind!r}")
        reject_unknown(body, where)
        if s.kind != "retrieval" and s.model not in ("smollm2", "openai") and not os.path.exists(s.model):
            raise ConfigFileError(f"{where}.model: must be 'smollm2', 'openai' (the [server] model) or an existing "
                                  f".gguf file or model folder, got {s.model!r}")
        settings.append(s)
    kw["attackers"] = tuple(settings)
    served = [s.name for s in settings if s.uses_server]
    if served:
        from snapaudit_jax.models.server import server_from_table

        kw["server"], kw["server_tokenizer"] = server_from_table(
            server, "server", f'attackers.{served[0]}.model = "openai"')
    elif server is not None:
        raise ConfigFileError('server: only read when an LLM attacker has model = "openai", and none has')
    attacker_name = choice(tuple(sorted(a.name for a in settings)))

    if not isinstance(drift, list):
        raise ConfigFileError("drift: must be an array of tables ([[drift]])")
    drifts = []
    for i, body in enumerate(drift):
        where = f"drift[{i}]"
        if not isinstance(body, dict):
            raise ConfigFileError(f"{where}: must be a table ([[drift]]), got {body!r}")
        body = dict(body)
        for key in ("attacker", "calibrate", "test"):
            if key not in body:
                raise ConfigFileError(f"{where}.{key}: required")
        drifts.append((take(body, "attacker", where, attacker_name, None),
                       take(body, "calibrate", where, _string, None), take(body, "test", where, _string, None)))
        reject_unknown(body, where)
    kw["drift"] = tuple(drifts)
    if truncation is not None:
        body = truncation
        for key in ("attacker", "suite", "top_k"):
            if key not in body:
                raise ConfigFileError(f"truncation.{key}: required")
        kw["truncation"] = (take(body, "attacker", "truncation", attacker_name, None),
                            take(body, "suite", "truncation", _string, None),
                            take(body, "top_k", "truncation", _int_list("top_k"), None))
        reject_unknown(body, "truncation")
    if mondrian is not None:
        body = mondrian
        for key in ("attacker", "suites"):
            if key not in body:
                raise ConfigFileError(f"mondrian.{key}: required")
        kw["mondrian"] = (take(body, "attacker", "mondrian", attacker_name, None),
                          take(body, "suites", "mondrian", _str_list, None))
        if len(kw["mondrian"][1]) < 2:
            raise ConfigFileError("mondrian.suites: must list at least 2 suites (the strata)")
        reject_unknown(body, "mondrian")
    return CPAConfig(**kw)

