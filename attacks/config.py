"""The PII leakage experiment's configuration (``snapaudit pii CONFIG.toml``): what to train, attack and report.

:class:`PIIConfig` gathers each stage's frozen config -- the corpus and canaries (:mod:`attacks.corpus`), the
GPT-2 (:class:`ModelConfig`), its training (:class:`TrainingConfig`), the attacks (:mod:`attacks.extraction`,
:mod:`attacks.reconstruction`, :mod:`attacks.inference`) and the canary audit (:mod:`attacks.canary`).
:func:`load_pii_config` reads it from TOML (``examples/pii_small.toml`` documents every key); every error names
``section.key``, the rule and the value. :mod:`attacks.run` runs it, :mod:`attacks.report` writes its table.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from attacks.canary import CanaryAuditConfig, one_run_insert_probability
from attacks.corpus import CanaryConfig, CorpusConfig
from attacks.extraction import ExtractionConfig
from attacks.inference import InferenceConfig
from attacks.reconstruction import ReconstructionConfig
from snapaudit_jax.estimation.one_run import check_design
from snapaudit_jax.utils import validate
from snapaudit_jax.utils.config import ConfigFileError, dataclass_section, read_toml, reject_unknown, table, take
from snapaudit_jax.utils.errors import InputError
from snapaudit_jax.utils.memory import check_fits

__all__ = ["VARIANTS", "RESULT_KEYS", "HEADLINE_LABEL", "REPETITION_BINS", "MAX_VOCAB_SIZE", "METHODS",
           "SCRATCH_ONLY", "LORA_ONLY", "ModelConfig", "TrainingConfig", "ExposureConfig", "PIIConfig",
           "load_pii_config", "check_base", "check_one_run_design", "check_sizes", "gpt2_parameters",
           "headline_label"]

VARIANTS = ("undefended", "dp", "scrubbed", "dp_scrubbed")
RESULT_KEYS = ("perplexity", "extraction_precision", "extraction_recall", "reconstruction_accuracy",
               "reconstruction_accuracy_raw", "inference_accuracy", "inference_accuracy_raw", "mia_auc",
               "mia_auc_reference", "canary_exposure", "epsilon_claimed", "epsilon_audited")
HEADLINE_LABEL = "PERSON"  # Table III's entity class (the first attacked label when PERSON is not attacked)
REPETITION_BINS = ((1, 3), (4, 15), (16, None))  # training records holding the attacked PII string
# Token ids are int32 in the model (and the tokenizer's u32): the vocabulary cannot be larger. The tokenizers BPE
# trainer reserves a Vec<String> (24 bytes) and a HashMap<String, u32> (32 bytes + 1 control byte a bucket) of
# vocab_size entries up front and aborts the process (no Python exception) when that allocation fails.
MAX_VOCAB_SIZE = 2**31 - 1
_TOKENIZER_BYTES_PER_ENTRY = 24 + 33
# The corpus builder lays out n_records x 2 person slots as int64 (attacks.corpus._assign), and its Zipf allocation
# holds 4 arrays of n_people float64/int64 values (zipf_counts): lower bounds of what make_corpus allocates.
_BYTES_PER_RECORD = 2 * 8
_BYTES_PER_PERSON = 4 * 8


BASES_SCRATCH = "scratch"  # model.base: a GPT-2 trained from a random initialisation (the small CPU test)
METHODS = ("full", "lora")
# [model] keys of one kind of base only: refused by load_pii_config where they do not apply, never silently ignored
SCRATCH_ONLY = ("n_layer", "n_embd", "n_head", "vocab_size")
LORA_ONLY = ("rank", "alpha", "targets")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """The model every variant trains: a pretrained base fine-tuned (the paper's setting), or a GPT-2 from scratch.

    Attributes:
      base: ``"smollm2"`` (the embedded SmolLM2-135M), a local GPT-2 / Llama Hugging Face folder or a Llama
        ``.gguf`` file -- every variant fine-tunes it, its tokenizer reads the text, and the untouched base is the
        public baseline -- or ``"scratch"``: a GPT-2 of the shape below from a random initialisation, with a BPE
        and a baseline model trained on the public corpus.
      method: ``"lora"`` (adapters only; the base stays bitwise unchanged) or ``"full"`` (every parameter; the
        only method of ``"scratch"``).
      rank, alpha, targets: the LoRA adapters (:class:`~snapaudit_jax.finetune.lora.LoRAConfig`; ``targets``
        empty: the family's default projections).
      allow_pickle: accept pickle weights in a base folder (they can execute code when loaded).
      n_layer, n_embd, n_head: ``"scratch"``: the transformer's shape (``n_inner = 4 n_embd``).
      max_length: positions; every framed record and canary must fit (and, with a base, the base's positions).
      vocab_size: ``"scratch"``: the BPE vocabulary size (trained on the public corpus).
      init_seed: seed of the shared initialisation (``"scratch"``: the weights; LoRA: the adapters).
    """

    base: str = "smollm2"
    method: str = "lora"
    rank: int = 8
    alpha: float = 16.0
    targets: tuple[str, ...] = ()
    allow_pickle: bool = False
    n_layer: int = 2
    n_embd: int = 128
    n_head: int = 4
    max_length: int = 128
    vocab_size: int = 1024
    init_seed: int = 0

    @property
    def pretrained(self) -> bool:
        """Whether the variants fine-tune a pretrained base (``base`` is not ``"scratch"``)."""
        return self.base != BASES_SCRATCH

    def lora(self):
        """The adapters' :class:`~snapaudit_jax.finetune.lora.LoRAConfig`, or ``None`` for ``method = "full"``."""
        if self.method != "lora":
            return None
        from snapaudit_jax.finetune.lora import LoRAConfig

        return LoRAConfig(rank=self.rank, alpha=self.alpha, targets=self.targets)

    def validate(self) -> "ModelConfig":
        """Checks every field.

        Returns:
          ``self``, unchanged.

        Raises:
          ValueError: a size that is not a positive integer, ``vocab_size`` outside ``[300, MAX_VOCAB_SIZE]``, an
            ``init_seed`` outside ``[0, 2**63 - 1]``, ``n_embd`` not divisible by ``n_head``, an empty ``base``, an
            unknown ``method`` or ``"lora"`` with ``base = "scratch"`` (naming the field, the rule and the value).
        """
        if not isinstance(self.base, str) or not self.base.strip():
            raise InputError(f"base must be 'smollm2', 'scratch', a model folder or a .gguf file, got {self.base!r}")
        validate.choice("method", self.method, METHODS)
        if not self.pretrained and self.method != "full":
            raise InputError(f"method must be 'full' with base = 'scratch' (a random initialisation has nothing for "
                             f"adapters to adapt), got {self.method!r}")
        from snapaudit_jax.finetune.lora import LoRAConfig

        LoRAConfig(rank=self.rank, alpha=self.alpha, targets=self.targets)  # rank, alpha and targets: its rules
        if not isinstance(self.allow_pickle, bool):
            raise InputError(f"allow_pickle must be true or false, got {self.allow_pickle!r}")
        for name in ("n_layer", "n_embd", "n_head", "max_length"):
            validate.positive_int(name, getattr(self, name))
        if validate.positive_int("vocab_size", self.vocab_size, minimum=300) > MAX_VOCAB_SIZE:
            raise InputError(f"vocab_size must be <= {MAX_VOCAB_SIZE} (int32 token ids), got {self.vocab_size}")
        validate.seed("init_seed", self.init_seed)
        if self.n_embd % self.n_head:
            raise InputError(f"n_embd must be divisible by n_head = {self.n_head}, got {self.n_embd}")
        return self


@dataclasses.dataclass(frozen=True)
class TrainingConfig:
    """Optimisation shared by every variant, and the DP variants' privacy parameters.

    Attributes:
      steps, batch_size (expected Poisson batch), learning_rate, optimizer: the run.
      clip_norm: per-record clipping norm ``C`` of the DP variants.
      epsilon, delta: the DP variants' target ``(epsilon, delta)`` (``delta`` default: ``1 / (10 N)``).
      accountant: accountant the noise is calibrated with (``rdp`` or ``pld``; both are reported).
      clipping: how the DP variants clip (:class:`~snapaudit_jax.dpsgd.DPSGDConfig`'s ``clipping``: ``"auto"``,
        ``"per_record"``, ``"book_keeping"``, ``"ghost"``; the same sum to float32 rounding, so never the
        guarantee); the path taken and why are in each DP variant's report.
      clipped_sum_dtype: the DP variants' book-keeping clipped-sum operands
        (:class:`~snapaudit_jax.dpsgd.DPSGDConfig`'s ``clipped_sum_dtype``: ``"float32"``, or ``"bfloat16"`` for
        accelerators' matrix units, the guarantee unchanged; book-keeping only).
      layers: how every variant's decoder blocks run in the training step
        (:class:`~snapaudit_jax.dpsgd.DPSGDConfig`'s ``layers``: ``"auto"``, one scan over the stacked blocks on
        accelerators for 4 blocks or more and unrolled on the CPU; ``"scan"``; ``"unrolled"``; compile and step
        time only, the same function to float32 rounding); the layout and why are in each variant's report.
      vocab_chunk: every variant's LM head a slice of this many vocabulary rows at a time in training (memory
        only, the same function to float32 rounding: :class:`~snapaudit_jax.dpsgd.DPSGDConfig`'s
        ``vocab_chunk``); ``0`` (default): whole logits.
    """

    steps: int = 400
    batch_size: int = 32
    learning_rate: float = 3e-3
    optimizer: str = "adamw"
    clip_norm: float = 1.0
    epsilon: float = 8.0
    delta: float | None = None
    accountant: str = "pld"
    clipping: str = "auto"
    clipped_sum_dtype: str = "float32"
    layers: str = "auto"
    vocab_chunk: int = 0

    def validate(self) -> "TrainingConfig":
        """Checks every field.

        Returns:
          ``self``, unchanged.

        Raises:
          ValueError: a non-positive size, rate or norm, ``delta`` outside ``(0, 1)``, or an unknown optimizer or
            accountant (naming the field, the rule and the value).
        """
        validate.positive_int("steps", self.steps)
        validate.positive_int("batch_size", self.batch_size)
        validate.positive_float("learning_rate", self.learning_rate)
        validate.choice("optimizer", self.optimizer, ("sgd", "adam", "adamw"))
        validate.positive_float("clip_norm", self.clip_norm)
        validate.positive_float("epsilon", self.epsilon)
        if self.delta is not None:
            validate.open_unit("delta", self.delta)
        validate.choice("accountant", self.accountant, ("rdp", "pld"))
        from snapaudit_jax.dpsgd.config import CLIPPINGS, LAYERS, checked_clipped_sum_dtype

        validate.choice("clipping", self.clipping, CLIPPINGS)
        checked_clipped_sum_dtype(self.clipped_sum_dtype, self.clipping)
        validate.choice("layers", self.layers, LAYERS)
        validate.positive_int("vocab_chunk", self.vocab_chunk, minimum=0)
        return self


@dataclasses.dataclass(frozen=True)
class ExposureConfig:
    """Canary exposure of every variant (Carlini et al.'s secret sharer; the measure ``snapaudit finetune`` reports,
    by the same function: :func:`snapaudit_jax.finetune.memorization.canary_exposure`).

    Attributes:
      enabled: measure it (``results.json``'s ``canary_exposure``: the median exposure of the inserted canaries,
        in bits; the held-out canaries' beside it in ``results_full.json``).
      samples: secrets drawn (no canary's among them) for the skew-normal extrapolation of each canary's rank.
      exact_limit: rank every canary exactly, scoring the whole space, when ``10**canaries.digits`` is at most
        this.
    """

    enabled: bool = True
    samples: int = 256
    exact_limit: int = 10_000

    def validate(self) -> "ExposureConfig":
        """Checks every field.

        Returns:
          ``self``, unchanged.

        Raises:
          ValueError: ``enabled`` not a bool, ``samples`` outside ``[16, 10**6]`` or a negative ``exact_limit``
            (naming the field, the rule and the value).
        """
        if not isinstance(self.enabled, bool):
            raise InputError(f"enabled must be true or false, got {self.enabled!r}")
        if validate.positive_int("samples", self.samples, minimum=16) > 10**6:
            raise InputError(f"samples must be <= 1000000, got {self.samples}")
        validate.positive_int("exact_limit", self.exact_limit, minimum=0)
        return self


@dataclasses.dataclass(frozen=True)
class PIIConfig:
    """A PII leakage experiment (``examples/pii_small.toml`` documents every key).

    Attributes:
      seed: seed of the train/test split, the shared initialisation's data and every attack's key (public).
      noise_seed: ``None`` (default): every variant's Poisson batches and DP noise come from a secret key drawn
        from the operating system's entropy and kept in the run folder (``checkpoints/run_key.json``); an integer:
        a replayable key from it (the report then says the DP variants' guarantee holds only while it stays
        secret).
      n_test: held-out records (non-members: perplexity and membership inference).
      public_records: records of the public corpus (tokenizer and baseline model).
      variants: which of :data:`VARIANTS` to run.
      corpus: the private corpus (``n_records`` includes the ``n_test`` held-out ones).
      canaries, model, training, extraction, reconstruction, inference, audit, exposure: each stage's settings.
      mia_fprs: false-positive rates of the reported membership TPRs (empirical).
      eval_batch_size: rows per scoring pass.
      lazy_slots: PERSON slots of the extraction samples scored by the lazy extractability estimate
        (Algorithm 4) for every training name; ``0`` turns it off.
    """

    seed: int = 0
    noise_seed: int | None = None
    n_test: int = 100
    public_records: int = 400
    variants: tuple[str, ...] = VARIANTS
    corpus: CorpusConfig = CorpusConfig(n_records=500, n_people=100)
    canaries: CanaryConfig = CanaryConfig(n_canaries=64)
    model: ModelConfig = ModelConfig()
    training: TrainingConfig = TrainingConfig()
    extraction: ExtractionConfig = ExtractionConfig(n_samples=200, max_new_tokens=96)
    reconstruction: ReconstructionConfig = ReconstructionConfig(n_samples=64, max_queries=100)
    inference: InferenceConfig = InferenceConfig(n_candidates=(100, 500), max_queries=100)
    audit: CanaryAuditConfig = CanaryAuditConfig()
    exposure: ExposureConfig = ExposureConfig()
    mia_fprs: tuple[float, ...] = (0.1, 0.01)
    eval_batch_size: int = 32
    lazy_slots: int = 32


_SECTIONS = {
    "corpus": CorpusConfig, "canaries": CanaryConfig, "model": ModelConfig, "training": TrainingConfig,
    "extraction": ExtractionConfig, "reconstruction": ReconstructionConfig, "inference": InferenceConfig,
    "audit": CanaryAuditConfig, "exposure": ExposureConfig,
}


def gpt2_parameters(model: ModelConfig) -> dict[str, int]:
    """Parameter counts of the GPT-2 every variant trains (``n_inner = 4 n_embd``, tied output embedding).

    Args:
      model: the model's shape.

    Returns:
      ``{"vocab_size": V E, "max_length": P E, "n_layer": L (12 E^2 + 13 E) + 2 E}``: the token embedding, the
      position embedding and the blocks with the final layer norm (``E = n_embd``, ``L = n_layer``).
    """
    e = int(model.n_embd)
    # A block: two layer norms (4E), attention (3E^2 + 3E, E^2 + E) and the MLP (4E^2 + 4E, 4E^2 + E).
    return {"vocab_size": int(model.vocab_size) * e, "max_length": int(model.max_length) * e,
            "n_layer": int(model.n_layer) * (12 * e * e + 13 * e) + 2 * e}


def check_sizes(config: PIIConfig) -> None:
    """Refuses, before any data is generated, a model or tokenizer that cannot fit in memory.

    Training holds the float32 parameters and their gradients, and Adam's two moments (``adam``/``adamw``): 8 or 16
    bytes a parameter; the BPE trainer reserves :data:`MAX_VOCAB_SIZE`'s per-entry bytes for ``vocab_size``
    entries. Lower bounds: activations, per-example gradients and checkpoints come on top.

    Args:
      config: the experiment.

    Raises:
      ConfigFileError: the estimate exceeds the machine's available memory; the message names the key whose
        term is largest (``model.vocab_size``, ``model.n_layer`` or ``model.max_length``).
    """
    if config.model.pretrained:
        check_base(config)
        return
    terms = gpt2_parameters(config.model)
    per_parameter = 8 if config.training.optimizer == "sgd" else 16
    biggest = max(terms, key=terms.get)
    total = sum(terms.values())
    m = config.model
    try:
        check_fits(f"model.{biggest}", total * per_parameter + m.vocab_size * _TOKENIZER_BYTES_PER_ENTRY,
                   f"a GPT-2 of {total:,} parameters (n_layer {m.n_layer}, n_embd {m.n_embd}, vocab_size "
                   f"{m.vocab_size}, max_length {m.max_length}) trained with {config.training.optimizer}")
    except InputError as err:
        raise ConfigFileError(str(err)) from None


def check_base(config: PIIConfig):
    """Reads the pretrained base's header (no weights) and refuses, before any data is generated, a base the run
    cannot fine-tune: unreadable or not a decoder, too large to train in memory, adapters it does not have, or
    fewer positions than ``model.max_length``.

    Args:
      config: the experiment, with ``model.base`` not ``"scratch"``.

    Returns:
      ``(tokenizer, cfg)``: the base's tokenizer and architecture config.

    Raises:
      ConfigFileError: naming ``model.base``, ``model.method``, ``model.rank``, ``model.targets`` or
        ``model.max_length``.
    """
    from snapaudit_jax.finetune.base import base_header, check_lora, check_training_fits, max_positions

    m = config.model
    tokenizer, cfg = base_header(m.base, "model.base")
    check_training_fits(cfg, method=m.method, optimizer=config.training.optimizer, field="model.method")
    if m.method == "lora":
        check_lora(cfg, rank=m.rank, alpha=m.alpha, targets=m.targets, section="model")
    if m.max_length > max_positions(cfg):
        raise ConfigFileError(f"model.max_length: must be <= {max_positions(cfg)} (the positions of the base "
                              f"{m.base!r}), got {m.max_length}")
    return tokenizer, cfg


def _check_keys_apply(config: PIIConfig, model_body, run_keys) -> None:
    """Refuses ``[model]`` and ``[run]`` keys that do not apply to the configured base or method (a key that
    would be silently ignored)."""
    m = config.model
    given = model_body if isinstance(model_body, dict) else {}
    if m.pretrained:
        for key in SCRATCH_ONLY:
            if key in given:
                raise ConfigFileError(f"model.{key}: applies to base = 'scratch' only (the pretrained base "
                                      f"{m.base!r} has its own shape and tokenizer), got {given[key]!r}; remove it")
        if "public_records" in run_keys:
            raise ConfigFileError(f"run.public_records: applies to model.base = 'scratch' only (the pretrained base "
                                  f"{m.base!r} is the public baseline), got {run_keys['public_records']!r}; remove it")
    if m.method != "lora":
        for key in LORA_ONLY:
            if key in given:
                raise ConfigFileError(f"model.{key}: applies to method = 'lora' only, got {given[key]!r} with method "
                                      f"= {m.method!r}; remove it")


def _check_corpus_body(body, base: CorpusConfig) -> None:
    """``[corpus]`` sizes against the memory, before :class:`~attacks.corpus.CorpusConfig` validates them (its
    check of the Zipf design already allocates ``n_people`` values)."""
    if not isinstance(body, dict):
        return  # _section names the error
    sizes = {}
    for key in ("n_records", "n_people"):
        try:
            sizes[key] = validate.positive_int(key, body.get(key, getattr(base, key)))
        except InputError as err:
            raise ConfigFileError(f"corpus: {err} (corpus.{key})") from None
    try:
        check_fits("corpus.n_records", sizes["n_records"] * _BYTES_PER_RECORD, f"{sizes['n_records']} records")
        check_fits("corpus.n_people", sizes["n_people"] * _BYTES_PER_PERSON, f"{sizes['n_people']} people")
    except InputError as err:
        raise ConfigFileError(str(err)) from None


def check_one_run_design(config: PIIConfig) -> None:
    """Refuses, before any training, a canary design the configured one-run bounds do not cover (pitfall 11).

    Our one-run bound of an ``(eps, delta)`` claim with ``delta > 0`` and jax_privacy's one-run value both
    need each canary inserted independently with probability 1/2 (Steinke, Nasr, Jagielski 2023).

    Args:
      config: the experiment (read by :func:`load_pii_config` or built in code).

    Raises:
      ConfigFileError: ``canaries.insert_probability`` is not 1/2 while ``audit.one_run`` or
        ``audit.jax_privacy`` is on.
    """
    p = config.canaries.insert_probability
    if config.audit.one_run:
        d = config.training.delta or config.audit.delta
        try:
            check_design(p, d)  # the library's rule (delta > 0 needs fair coins)
        except ValueError:
            raise ConfigFileError(
                f"canaries.insert_probability: must be 1/2 for our one-run bound of an (eps, delta) claim with "
                f"delta = {d} > 0 (Steinke, Nasr, Jagielski 2023 prove the delta term for fair coins), got {p}; set "
                f"it to 0.5 or set audit.one_run = false (epsilon_audited is then null)") from None
    if not config.audit.jax_privacy:
        return
    try:
        one_run_insert_probability(p)  # the library's rule (Steinke, Nasr, Jagielski 2023, Algorithm 1)
    except ValueError:
        raise ConfigFileError(
            f"canaries.insert_probability: the one-run bound (Steinke et al. 2023) requires each canary inserted "
            f"independently with probability 1/2, got {p}; set it to 0.5 or set audit.jax_privacy = false "
            f"(epsilon_audited is then null; the Clopper-Pearson bounds allow any insert_probability)") from None


def load_pii_config(path: str | os.PathLike) -> PIIConfig:
    """Reads and validates a TOML PII experiment.

    Args:
      path: the TOML file: a ``[run]`` table (``seed``, ``noise_seed``, ``n_test``, ``public_records``,
        ``eval_batch_size``, ``variants``, ``mia_fprs``, ``lazy_slots``) and one table per stage (``corpus``,
        ``canaries``, ``model``, ``training``, ``extraction``, ``reconstruction``, ``inference``, ``audit``);
        absent keys keep :class:`PIIConfig`'s defaults.

    Returns:
      The validated :class:`PIIConfig`.

    Raises:
      ConfigFileError: an unknown section or key, a value breaking its rule, ``run.n_test`` not below
        ``corpus.n_records``, an ``audit.delta`` other than ``training.delta``, a corpus, model or tokenizer that
        cannot fit in memory (:func:`check_sizes`), or a canary design the one-run bounds do not cover (errors
        name ``section.key``, the rule and the value), or a file that cannot be read or is not valid TOML.
    """
    raw = read_toml(path)
    run = table(raw, "run", "run", {})
    run_keys = dict(run)
    model_body = raw.get("model", {})
    base = PIIConfig()
    kw: dict[str, Any] = {}
    kw["seed"] = take(run, "seed", "run", lambda v: validate.seed("seed", v), 0)
    kw["noise_seed"] = take(run, "noise_seed", "run", lambda v: validate.seed("noise_seed", v), None)
    kw["n_test"] = take(run, "n_test", "run", lambda v: validate.positive_int("n_test", v, minimum=4), base.n_test)
    kw["public_records"] = take(run, "public_records", "run",
                                lambda v: validate.positive_int("public_records", v, minimum=10), base.public_records)
    kw["eval_batch_size"] = take(run, "eval_batch_size", "run",
                                 lambda v: validate.positive_int("eval_batch_size", v), base.eval_batch_size)

    def variants(v):
        if isinstance(v, str) or not isinstance(v, list) or not v:
            raise InputError(f"must be a non-empty list of {', '.join(VARIANTS)}, got {v!r}")
        for x in v:
            validate.choice("variants[...]", x, VARIANTS)
        if len(set(v)) != len(v):
            raise InputError(f"must not repeat a variant, got {v!r}")
        return tuple(x for x in VARIANTS if x in v)

    kw["variants"] = take(run, "variants", "run", variants, VARIANTS)

    def fprs(v):
        if isinstance(v, str) or not isinstance(v, list) or not v:
            raise InputError(f"must be a non-empty list of rates in (0, 1), got {v!r}")
        return tuple(validate.open_unit("mia_fprs[...]", x) for x in v)

    kw["mia_fprs"] = take(run, "mia_fprs", "run", fprs, base.mia_fprs)
    kw["lazy_slots"] = take(run, "lazy_slots", "run", lambda v: validate.positive_int("lazy_slots", v, minimum=0),
                            base.lazy_slots)
    reject_unknown(run, "run")
    for name in _SECTIONS:
        body = raw.pop(name, {})
        if name == "corpus":
            _check_corpus_body(body, base.corpus)
        kw[name] = dataclass_section(getattr(base, name), body, name)
        for key in ("seed",):  # the stages' own seeds, in the seed range (their validate() takes any int >= 0)
            if hasattr(kw[name], key):
                try:
                    validate.seed(key, getattr(kw[name], key))
                except InputError as err:
                    raise ConfigFileError(f"{name}: {err} ({name}.{key})") from None
    reject_unknown(raw, os.fspath(path))
    config = PIIConfig(**kw)
    _check_keys_apply(config, model_body, run_keys)
    check_sizes(config)
    if config.n_test >= config.corpus.n_records:
        raise ConfigFileError(f"run.n_test: must be < corpus.n_records = {config.corpus.n_records}, "
                              f"got {config.n_test}")
    if config.audit.delta != base.audit.delta and config.training.delta is not None \
            and config.audit.delta != config.training.delta:
        raise ConfigFileError(f"audit.delta: must equal training.delta = {config.training.delta} (the audited "
                              f"claim), got {config.audit.delta}")
    check_one_run_design(config)
    room = 10 ** config.canaries.digits - config.canaries.n_canaries
    if config.exposure.enabled and config.exposure.samples > room:
        raise ConfigFileError(f"exposure.samples: must be <= 10**canaries.digits - canaries.n_canaries = {room} (the "
                              f"sample holds no canary's secret), got {config.exposure.samples}")
    return config



def headline_label(config: PIIConfig) -> str:
    """The entity class of the headline extraction columns: :data:`HEADLINE_LABEL` if attacked, else the first
    attacked label.

    Args:
      config: the experiment.

    Returns:
      A label of ``config.extraction.labels``.
    """
    labels = config.extraction.labels
    return HEADLINE_LABEL if HEADLINE_LABEL in labels else labels[0]
