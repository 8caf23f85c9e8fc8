"""The configuration of ``snapaudit finetune CONFIG.toml``: data, model, fine-tuning, privacy, baseline, canaries.

:class:`FinetuneConfig` gathers one frozen dataclass per TOML table; :func:`load_finetune_config` reads it
(``examples/finetune_small.toml`` documents every key). Every error names ``section.key``, the rule and the value,
and is raised before any model or data file is read. Checks that need the data (a ``delta`` at or above ``1 / N``,
a rank above a projection's width, a target epsilon no sigma reaches) are made by
:func:`snapaudit_jax.finetune.run.prepare` before any training, naming the same keys.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any

from snapaudit_jax.dpsgd.canaries import CanaryConfig
from snapaudit_jax.dpsgd.config import CLIPPINGS, LAYERS, checked_clipped_sum_dtype
from snapaudit_jax.finetune.synthetic import BYTES_PER_UNIT, GENERATORS, MAX_UNITS
from snapaudit_jax.utils import validate
from snapaudit_jax.utils.config import ConfigFileError, dataclass_section, read_toml, reject_unknown
from snapaudit_jax.utils.errors import InputError
from snapaudit_jax.utils.memory import check_fits

__all__ = [
    "METHODS",
    "UNITS",
    "DataConfig",
    "ModelConfig",
    "TrainConfig",
    "PrivacyConfig",
    "CanarySection",
    "ExportConfig",
    "SweepSection",
    "FinetuneConfig",
    "load_finetune_config",
]

METHODS = ("full", "lora")
UNITS = ("record", "user")
SWEEP_RULES = ("compose", "random_stopping")
MAX_CANDIDATES = 64
MAX_LENGTH = 8192


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """``[data]``: the user's records.

    Attributes:
      path: a local ``.jsonl`` / ``.json`` / ``.csv`` / ``.parquet`` file, read in memory
        (:func:`snapaudit_jax.utils.records.read_records`: no copy in any library cache); ``""`` with ``generate``.
      generate: ``""`` (default: the records are ``path``'s), or the name of a synthetic corpus made in memory at
        run time instead of a file (:data:`snapaudit_jax.finetune.synthetic.GENERATORS`: ``"clinical_notes"``,
        whose records have the columns ``patient`` and ``text``): a corpus of any size, never committed.
      generate_units: with ``generate``, the corpus's units (patients), ``1`` to
        :data:`~snapaudit_jax.finetune.synthetic.MAX_UNITS`.
      generate_seed: with ``generate``, the generator's seed (the corpus is public: it decides nothing secret).
      text_field: the column holding each record's text (unless ``messages_field``).
      messages_field: a column of chat messages (``[{"role", "content"}, ...]``), rendered once with the model's
        chat template (token ids as transformers' ``apply_chat_template(messages, tokenize=True)``); replaces
        ``text_field``.
      train_on: with ``messages_field``: ``"assistant"`` (default) trains on the assistant turns' tokens only (the
        other turns are context), ``"all"`` on every token.
      system_prompt: with ``messages_field``, a system message for conversations without one; ``""`` (default):
        none, and a template that would insert its own default system prompt (SmolLM2's) gets an empty system
        message instead.
      user_field: the column naming each record's user (the protected unit when ``privacy.unit = "user"``).
      held_out_path: a second file of held-out records (same fields), or ``""``. It must be disjoint from
        ``path`` (not the same file, no record of the same text, and at user level no user with training records).
      allow_held_out_overlap: with ``held_out_path``, leave the records it shares with ``path`` out of the
        held-out part (counted in the report) instead of refusing the file.
      held_out_fraction: without ``held_out_path``, each unit (user or record) is held out (never trained on) with
        this probability, by a keyed hash of its id, so that adding or removing a unit moves no other: evaluation
        on private data.
      max_length: tokens per record; a longer record is truncated to it (and counted), never split.
    """

    path: str = ""
    generate: str = ""
    generate_units: int = 0
    generate_seed: int = 0
    text_field: str = "text"
    messages_field: str = ""
    train_on: str = "assistant"
    system_prompt: str = ""
    user_field: str = ""
    held_out_path: str = ""
    allow_held_out_overlap: bool = False
    held_out_fraction: float = 0.1
    max_length: int = 128

    def validate(self) -> "DataConfig":
        """Checks every field.

        Returns:
          ``self``, unchanged.

        Raises:
          InputError: a field breaking its rule (naming the field, the rule and the value).
        """
        if not isinstance(self.generate, str):
            raise InputError(f"generate must be a string, got {self.generate!r}")
        if self.generate:
            validate.choice("generate", self.generate, tuple(GENERATORS))
            if self.path:
                raise InputError(f"path must be empty with generate (the records are made at run time), got "
                                 f"{self.path!r}")
            if self.held_out_path:
                raise InputError(f"held_out_path must be empty with generate (held_out_fraction splits the made "
                                 f"corpus), got {self.held_out_path!r}")
            if validate.positive_int("generate_units", self.generate_units) > MAX_UNITS:
                raise InputError(f"generate_units must be <= {MAX_UNITS}, got {self.generate_units}")
            check_fits("generate_units", self.generate_units * BYTES_PER_UNIT,
                       f"{self.generate_units} generated patients (about 3.5 notes each, made in memory)")
            validate.seed("generate_seed", self.generate_seed)
        else:
            for name in ("generate_units", "generate_seed"):
                if getattr(self, name) != 0:
                    raise InputError(f"{name} must be 0 without generate, got {getattr(self, name)!r}")
            if not isinstance(self.path, str) or not self.path.strip():
                raise InputError(f"path must name the data file (.jsonl, .json, .csv or .parquet), got "
                                 f"{self.path!r}")
        for name in ("text_field", "messages_field", "user_field", "held_out_path", "system_prompt"):
            if not isinstance(getattr(self, name), str):
                raise InputError(f"{name} must be a string, got {getattr(self, name)!r}")
        if not self.messages_field and not self.text_field.strip():
            raise InputError("text_field must name a column (or set messages_field), got ''")
        validate.choice("train_on", self.train_on, ("assistant", "all"))
        if not isinstance(self.allow_held_out_overlap, bool):
            raise InputError(f"allow_held_out_overlap must be true or false, got {self.allow_held_out_overlap!r}")
        if not self.held_out_path:
            value = validate._as_float("held_out_fraction", self.held_out_fraction)
            if not 0.0 < value < 1.0:
                raise InputError(f"held_out_fraction must be in (0, 1), got {self.held_out_fraction!r}")
        if validate.positive_int("max_length", self.max_length, minimum=2) > MAX_LENGTH:
            raise InputError(f"max_length must be <= {MAX_LENGTH}, got {self.max_length}")
        return self


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """``[model]``: the pretrained base.

    Attributes:
      base: ``"smollm2"`` (the embedded SmolLM2-135M-Instruct), a local GPT-2 / Llama Hugging Face folder, or a
        Llama ``.gguf`` file.
      allow_pickle: accept pickle weights in a folder (they can execute code when loaded).
    """

    base: str = "smollm2"
    allow_pickle: bool = False

    def validate(self) -> "ModelConfig":
        """Checks every field.

        Returns:
          ``self``, unchanged.

        Raises:
          InputError: a field breaking its rule (naming the field, the rule and the value).
        """
        if not isinstance(self.base, str) or not self.base.strip():
            raise InputError(f"base must be 'smollm2', a model folder or a .gguf file, got {self.base!r}")
        if not isinstance(self.allow_pickle, bool):
            raise InputError(f"allow_pickle must be true or false, got {self.allow_pickle!r}")
        return self


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """``[finetune]``: what trains and how.

    Attributes:
      method: ``"full"`` (every parameter) or ``"lora"`` (adapters only; the base stays bitwise unchanged).
      rank, alpha, targets: the LoRA adapters (:class:`~snapaudit_jax.finetune.lora.LoRAConfig`).
      steps: optimizer steps (one Poisson batch of units each).
      batch_size: the expected batch ``q N`` of units.
      learning_rate, optimizer, weight_decay: the optimizer (optax).
      microbatch_size: units per vectorised clipped-gradient call (speed only; default: the backend's).
      clipping: how each unit's gradient is clipped (speed and memory only, the same sum to float32 rounding:
        :class:`~snapaudit_jax.dpsgd.DPSGDConfig`'s ``clipping``): ``"auto"`` (book-keeping where it covers
        every trainable parameter: LoRA, and full fine-tuning of a float32 base; else per-record),
        ``"per_record"``, ``"book_keeping"`` or ``"ghost"`` (both refused, naming the parameter, where a
        trainable parameter is not covered: a bfloat16 base's embedding and norm scales).
      clipped_sum_dtype: book-keeping's clipped-sum operands (:class:`~snapaudit_jax.dpsgd.DPSGDConfig`'s
        ``clipped_sum_dtype``): ``"float32"`` (default) or ``"bfloat16"`` (accelerators' matrix units; the norms
        of the rounded factors and a margin of about 1e-4 keep the guarantee unchanged; book-keeping only).
      layers: how the decoder's blocks run in the training step (compile and step time only, the same function to
        float32 rounding: :class:`~snapaudit_jax.dpsgd.DPSGDConfig`'s ``layers``): ``"auto"`` (one scan over
        the stacked blocks on accelerators for 4 blocks or more, unrolled on the CPU), ``"scan"`` or
        ``"unrolled"``.
      vocab_chunk: the LM head a slice of this many vocabulary rows at a time in every training step and held-out
        evaluation (memory only,
        the same function to float32 rounding: :class:`~snapaudit_jax.dpsgd.DPSGDConfig`'s ``vocab_chunk``; no
        ``(units, length, vocabulary)`` logits, one more product with the head); ``0`` (default): whole logits.
      checkpoint_every: steps between checkpoints (resume after a kill).
      devices: data parallelism over this many local devices (``0``: one device; see
        :func:`snapaudit_jax.dpsgd.train`'s ``mesh``); a run resumes only on as many.
    """

    method: str = "lora"
    rank: int = 8
    alpha: float = 16.0
    targets: tuple[str, ...] = ()
    steps: int = 100
    batch_size: int = 16
    learning_rate: float = 1e-3
    optimizer: str = "adamw"
    weight_decay: float = 0.0
    microbatch_size: int = 0
    clipping: str = "auto"
    clipped_sum_dtype: str = "float32"
    layers: str = "auto"
    vocab_chunk: int = 0
    checkpoint_every: int = 10
    devices: int = 0

    def validate(self) -> "TrainConfig":
        """Checks every field.

        Returns:
          ``self``, unchanged.

        Raises:
          InputError: a field breaking its rule (naming the field, the rule and the value).
        """
        validate.choice("method", self.method, METHODS)
        validate.positive_int("rank", self.rank)
        validate.positive_float("alpha", self.alpha)
        for t in self.targets:
            if not isinstance(t, str):
                raise InputError(f"targets must be projection names, got {t!r}")
        if len(set(self.targets)) != len(self.targets):
            raise InputError(f"targets must not repeat a projection, got {list(self.targets)}")
        if validate.positive_int("steps", self.steps) > 10**7:
            raise InputError(f"steps must be <= 10000000, got {self.steps}")
        validate.positive_int("batch_size", self.batch_size)
        validate.positive_float("learning_rate", self.learning_rate)
        validate.choice("optimizer", self.optimizer, ("sgd", "adam", "adamw"))
        validate.nonnegative_float("weight_decay", self.weight_decay)
        validate.positive_int("microbatch_size", self.microbatch_size, minimum=0)
        validate.choice("clipping", self.clipping, CLIPPINGS)
        checked_clipped_sum_dtype(self.clipped_sum_dtype, self.clipping)
        validate.choice("layers", self.layers, LAYERS)
        validate.positive_int("vocab_chunk", self.vocab_chunk, minimum=0)
        validate.positive_int("checkpoint_every", self.checkpoint_every)
        if validate.positive_int("devices", self.devices, minimum=0) > 4096:
            raise InputError(f"devices must be <= 4096, got {self.devices}")
        return self


@dataclasses.dataclass(frozen=True)
class PrivacyConfig:
    """``[privacy]``: the guarantee.

    Attributes:
      unit: ``"record"`` (add/remove one record) or ``"user"`` (add/remove one user with all of their records:
        a user's records in a step are summed and clipped together).
      target_epsilon: calibrate sigma to this epsilon at ``delta`` (``0``: give ``noise_multiplier`` instead).
      noise_multiplier: sigma, instead of ``target_epsilon`` (``0``: calibrate).
      delta: of the guarantee; ``0`` means ``1 / (10 N)`` for ``N`` units. A ``delta >= 1 / N`` is refused
        unless ``allow_large_delta``.
      allow_large_delta: accept ``delta >= 1 / N`` (a guarantee that allows releasing one unit outright).
      clip_norm: L2 clipping norm ``C`` of one unit's gradient.
      accountant: ``"pld"`` (default, tight) or ``"rdp"``: the one sigma is calibrated with; both are reported.
      max_records_per_user: user-level cap ``k``: a user with more records keeps the ``k`` with the smallest keyed
        hashes (of ``seed``, the user and the record), chosen before training (stated in the report).
    """

    unit: str = "record"
    target_epsilon: float = 8.0
    noise_multiplier: float = 0.0
    delta: float = 0.0
    allow_large_delta: bool = False
    clip_norm: float = 1.0
    accountant: str = "pld"
    max_records_per_user: int = 8

    def validate(self) -> "PrivacyConfig":
        """Checks every field.

        Returns:
          ``self``, unchanged.

        Raises:
          InputError: a field breaking its rule (naming the field, the rule and the value).
        """
        validate.choice("unit", self.unit, UNITS)
        validate.nonnegative_float("target_epsilon", self.target_epsilon)
        validate.nonnegative_float("noise_multiplier", self.noise_multiplier)
        if (self.target_epsilon > 0) == (self.noise_multiplier > 0):
            raise InputError(
                "target_epsilon must be > 0 with noise_multiplier = 0, or 0 with noise_multiplier > 0 (exactly one "
                f"of them), got target_epsilon={self.target_epsilon!r}, noise_multiplier={self.noise_multiplier!r}")
        if self.target_epsilon > 1e3:
            raise InputError(f"target_epsilon must be <= 1000, got {self.target_epsilon!r}")
        if self.noise_multiplier and not 0.3 <= self.noise_multiplier <= 1e4:
            raise InputError(f"noise_multiplier must be in [0.3, 10000], got {self.noise_multiplier!r}")
        d = validate._as_float("delta", self.delta)
        if not 0.0 <= d < 1.0:
            raise InputError(f"delta must be in (0, 1) (or 0: 1 / (10 N)), got {self.delta!r}")
        if not isinstance(self.allow_large_delta, bool):
            raise InputError(f"allow_large_delta must be true or false, got {self.allow_large_delta!r}")
        validate.positive_float("clip_norm", self.clip_norm)
        validate.choice("accountant", self.accountant, ("pld", "rdp"))
        if validate.positive_int("max_records_per_user", self.max_records_per_user) > 4096:
            raise InputError(f"max_records_per_user must be <= 4096, got {self.max_records_per_user}")
        return self


@dataclasses.dataclass(frozen=True)
class CanarySection:
    """``[canaries]``: secret canaries for memorization evidence (each its own unit).

    Attributes:
      n_canaries: canaries (``0``: none); each is inserted independently with ``insert_probability``.
      template, digits, insert_probability, seed: as :class:`~snapaudit_jax.dpsgd.canaries.CanaryConfig`;
        ``insert_probability`` must be 1/2 (the report's one-run bound assumes fair coins).
      exact_limit: exposure by exact rank when ``10**digits`` is at most this.
      samples: candidates sampled for the skew-normal exposure extrapolation.
      top_k: the top-k extraction test's ``k``.
    """

    n_canaries: int = 16
    template: str = "my secret code is {secret}"
    digits: int = 6
    insert_probability: float = 0.5
    seed: int = 0
    exact_limit: int = 10_000
    samples: int = 256
    top_k: int = 10

    def validate(self) -> "CanarySection":
        """Checks every field.

        Returns:
          ``self``, unchanged.

        Raises:
          InputError: a field breaking its rule (naming the field, the rule and the value).
        """
        validate.positive_int("n_canaries", self.n_canaries, minimum=0)
        if self.n_canaries:
            self.canary_config().validate()
            if self.insert_probability != 0.5:  # checked here, not after training (one_run_bound's check_design)
                raise InputError(
                    f"insert_probability must be 1/2: the report's one-run bound is an (eps, delta) claim with "
                    f"delta > 0, whose delta term Steinke, Nasr, Jagielski 2023 prove for fair coins, got "
                    f"{self.insert_probability!r}")
        validate.positive_int("exact_limit", self.exact_limit, minimum=0)
        if validate.positive_int("samples", self.samples, minimum=16) > 10**6:
            raise InputError(f"samples must be <= 1000000, got {self.samples}")
        validate.positive_int("top_k", self.top_k)
        return self

    def canary_config(self) -> CanaryConfig:
        """The canaries' :class:`~snapaudit_jax.dpsgd.canaries.CanaryConfig` (inserted once each)."""
        return CanaryConfig(n_canaries=self.n_canaries, template=self.template, digits=self.digits,
                            repetitions=(1,), insert_probability=self.insert_probability, seed=self.seed)


@dataclasses.dataclass(frozen=True)
class ExportConfig:
    """``[export]``: folders serving engines load.

    Attributes:
      hf: write ``export/private`` (and ``export/baseline``) as Hugging Face folders (LoRA merged).
      peft: with LoRA, also write the adapter as a PEFT folder (``export/private_adapter``).
    """

    hf: bool = True
    peft: bool = True

    def validate(self) -> "ExportConfig":
        """Checks every field.

        Returns:
          ``self``, unchanged.

        Raises:
          InputError: a field breaking its rule (naming the field, the rule and the value).
        """
        for name in ("hf", "peft"):
            if not isinstance(getattr(self, name), bool):
                raise InputError(f"{name} must be true or false, got {getattr(self, name)!r}")
        return self


@dataclasses.dataclass(frozen=True)
class SweepSection:
    """``[sweep]``: a hyperparameter search whose selection is accounted (:mod:`snapaudit_jax.dpsgd.tuning`).

    The candidates are the grid ``learning_rate x clip_norm x steps`` (an empty list keeps the value of
    ``[finetune]`` / ``[privacy]``). Every candidate is a DP-SGD run at one common sigma on the training units; each
    is scored by its mean loss on a validation split of whole units, held out of training and disjoint from the
    evaluation split; the best is released, and its epsilon is the sweep's, by ``rule``.

    Attributes:
      learning_rate, clip_norm, steps: the candidates' values (at least one list non-empty to sweep).
      rule: ``"compose"`` (train every candidate once; epsilon of their composition, PLD and RDP) or
        ``"random_stopping"`` (Papernot & Steinke 2022: ``K`` runs, ``K`` from a truncated negative binomial,
        each on a uniformly drawn candidate; only the best is released; RDP).
      mean_runs: random stopping's ``E[K]`` (``0``: the number of candidates).
      eta: random stopping's truncated-negative-binomial shape (``1``: geometric, ``0``: logarithmic), ``> -1``.
      validation_fraction: each training unit is held out to score the candidates with this probability (a keyed
        hash of its id, as ``data.held_out_fraction``; not protected: the report lists the validation split as a
        non-private release).
    """

    learning_rate: tuple[float, ...] = ()
    clip_norm: tuple[float, ...] = ()
    steps: tuple[int, ...] = ()
    rule: str = "compose"
    mean_runs: float = 0.0
    eta: float = 1.0
    validation_fraction: float = 0.1

    @property
    def enabled(self) -> bool:
        """Whether the table sweeps anything."""
        return bool(self.learning_rate or self.clip_norm or self.steps)

    def validate(self) -> "SweepSection":
        """Checks every field.

        Returns:
          ``self``, unchanged.

        Raises:
          InputError: a field breaking its rule (naming the field, the rule and the value).
        """
        for name, check in (("learning_rate", validate.positive_float), ("clip_norm", validate.positive_float),
                            ("steps", validate.positive_int)):
            values = getattr(self, name)
            for v in values:
                check(name, v)
                if name == "steps" and v > 10**7:
                    raise InputError(f"steps must be <= 10000000, got {v}")
            if len(set(values)) != len(values):
                raise InputError(f"{name} must not repeat a value, got {list(values)}")
        if not self.enabled:
            raise InputError("learning_rate must list the candidates' values, or clip_norm or steps must (a [sweep] "
                             "table without them sweeps nothing; remove it), got none")
        n = max(1, len(self.learning_rate)) * max(1, len(self.clip_norm)) * max(1, len(self.steps))
        if n > MAX_CANDIDATES:
            raise InputError(f"learning_rate must, with clip_norm and steps, give at most {MAX_CANDIDATES} "
                             f"candidates, got {n}")
        validate.choice("rule", self.rule, SWEEP_RULES)
        mean = validate.nonnegative_float("mean_runs", self.mean_runs)
        if mean and not 1.0 < mean <= 1000.0:
            raise InputError(f"mean_runs must be in (1, 1000] (or 0: the number of candidates), got {self.mean_runs!r}")
        eta = validate._as_float("eta", self.eta)
        if not (eta > -1.0 and math.isfinite(eta)):
            raise InputError(f"eta must be a finite number > -1, got {self.eta!r}")
        value = validate._as_float("validation_fraction", self.validation_fraction)
        if not 0.0 < value < 1.0:
            raise InputError(f"validation_fraction must be in (0, 1), got {self.validation_fraction!r}")
        return self

    def candidates(self, finetune: TrainConfig, privacy: PrivacyConfig) -> tuple[dict[str, Any], ...]:
        """The grid, ``({"learning_rate", "clip_norm", "steps"}, ...)`` in a fixed order (learning rate outermost).

        Args:
          finetune: supplies ``learning_rate`` and ``steps`` where the sweep lists none.
          privacy: supplies ``clip_norm`` where the sweep lists none.

        Returns:
          The candidates.
        """
        return tuple({"learning_rate": float(lr), "clip_norm": float(c), "steps": int(t)}
                     for lr in (self.learning_rate or (finetune.learning_rate,))
                     for c in (self.clip_norm or (privacy.clip_norm,))
                     for t in (self.steps or (finetune.steps,)))


@dataclasses.dataclass(frozen=True)
class FinetuneConfig:
    """A ``snapaudit finetune`` run (``examples/finetune_small.toml`` documents every key).

    Attributes:
      seed: keys what may be public: the held-out and validation splits and the user cap (keyed hashes of the
        units' ids), the canaries' secrets (with
        ``canaries.seed``) and the LoRA initialisation. Never the batches or the noise (see ``noise_seed``).
      noise_seed: ``None`` (default): the batches, the noise and (random stopping) the sweep's runs come from a
        secret key drawn from the operating system's entropy and kept in the run folder
        (``checkpoints/run_key.json``); an integer: a replayable key from it, and the report then says that the
        guarantee holds only while that seed stays secret.
      baseline: also train the non-private twin (same data, model, steps, Poisson batches and seed).
      eval_batch_size: rows per evaluation pass.
      data, model, finetune, privacy, canaries, export: the tables.
      sweep: the accounted hyperparameter search (``None``: one run with the configured values).
    """

    seed: int = 0
    noise_seed: int | None = None
    baseline: bool = True
    eval_batch_size: int = 16
    data: DataConfig = DataConfig()
    model: ModelConfig = ModelConfig()
    finetune: TrainConfig = TrainConfig()
    privacy: PrivacyConfig = PrivacyConfig()
    canaries: CanarySection = CanarySection()
    export: ExportConfig = ExportConfig()
    sweep: SweepSection | None = None

    def to_table(self) -> dict[str, Any]:
        """The configuration in its TOML shape, ``{section: {key: value}}`` (``[run]`` holds the top-level keys)."""
        out: dict[str, Any] = {"run": {"seed": self.seed, "baseline": self.baseline,
                                       "eval_batch_size": self.eval_batch_size}}
        if self.noise_seed is not None:
            out["run"]["noise_seed"] = self.noise_seed
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if dataclasses.is_dataclass(value):
                out[f.name] = dataclasses.asdict(value)
        return out  # no "sweep" key without a sweep: the stamps of runs without one stay as they were


_SECTIONS = {"data": DataConfig, "model": ModelConfig, "finetune": TrainConfig, "privacy": PrivacyConfig,
             "canaries": CanarySection, "export": ExportConfig}


def _resolve_path(path: str, config_path: str) -> str:
    """A data path relative to the config file's folder (absolute paths are kept)."""
    if not path or os.path.isabs(path):
        return path
    return os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(config_path)), path))


def load_finetune_config(path: str | os.PathLike) -> FinetuneConfig:
    """Reads and validates a ``snapaudit finetune`` TOML file.

    Args:
      path: the TOML file: ``[run]`` (``seed``, ``noise_seed``, ``baseline``, ``eval_batch_size``) and the tables
        ``[data]``, ``[model]``, ``[finetune]``, ``[privacy]``, ``[canaries]``, ``[export]`` and optionally
        ``[sweep]``; absent keys keep the defaults. ``data.path`` and ``data.held_out_path`` are relative to the
        file's folder.

    Returns:
      The validated :class:`FinetuneConfig`.

    Raises:
      ConfigFileError: an unknown table or key, or a value breaking its rule (naming ``section.key``, the rule
        and the value), or an unreadable / invalid TOML file.
    """
    path = os.fspath(path)
    raw = read_toml(path)
    run = raw.pop("run", {})
    if not isinstance(run, dict):
        raise ConfigFileError(f"run: must be a table ([run]), got {run!r}")
    run = dict(run)
    kw: dict[str, Any] = {}
    try:
        if "seed" in run:
            kw["seed"] = validate.seed("seed", run.pop("seed"))
        if "noise_seed" in run:
            kw["noise_seed"] = validate.seed("noise_seed", run.pop("noise_seed"))
        if "baseline" in run:
            value = run.pop("baseline")
            if not isinstance(value, bool):
                raise InputError(f"baseline must be true or false, got {value!r}")
            kw["baseline"] = value
        if "eval_batch_size" in run:
            kw["eval_batch_size"] = validate.positive_int("eval_batch_size", run.pop("eval_batch_size"))
            if kw["eval_batch_size"] > 4096:
                raise InputError(f"eval_batch_size must be <= 4096, got {kw['eval_batch_size']}")
    except InputError as err:
        raise ConfigFileError(f"run.{str(err).split(' ', 1)[0]}: {err}") from None
    reject_unknown(run, "run")
    if "data" not in raw:
        raise ConfigFileError("data.path: the [data] table with the path of the records file (or generate) is "
                              "required")
    for name, kind in _SECTIONS.items():
        body = raw.pop(name, {})
        default = kind()
        if name == "data" and isinstance(body, dict):
            body = dict(body)
            for key in ("path", "held_out_path"):
                if isinstance(body.get(key), str):
                    body[key] = _resolve_path(body[key], path)
        kw[name] = dataclass_section(default, body, name)
    if "sweep" in raw:
        kw["sweep"] = dataclass_section(SweepSection(), raw.pop("sweep"), "sweep")
    reject_unknown(raw, path)
    config = FinetuneConfig(**kw)
    if config.privacy.unit == "user" and not config.data.user_field:
        raise ConfigFileError("data.user_field: privacy.unit = 'user' needs the column naming each record's user, "
                              "got ''")
    return config
