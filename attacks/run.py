"""The PII leakage experiment (``snapaudit pii CONFIG.toml``): four training variants, every attack, one table.

A small GPT-2 (our Flax NNX model) is trained on a synthetic corpus of e-mail and court-case records
(:mod:`attacks.corpus`) four ways -- ``undefended`` (plain training), ``dp`` (DP-SGD at the configured
``epsilon``), ``scrubbed`` (plain training on records whose tagged PII is replaced by ``[MASK]``) and
``dp_scrubbed`` -- from the same initialisation, with the same optimizer, steps and Poisson batches. A
``baseline`` model trained on a disjoint *public* corpus (same distribution, other people) serves the
extraction game (PII it also generates is not counted as leaked) and supplies the tokenizer: the BPE is
trained on public text only, so its vocabulary holds no private PII.

Each variant gets, measured as seed 003 measures it (where the CPU-sized setting differs, the README says so):

* held-out perplexity -- for the scrubbed variants on scrubbed held-out text, as the reference scrubs the
  training *and* the test split (a scrubbed model never saw a raw name, so raw text measures the tagger);
* PII extraction (Algorithm 3, Table III): PERSON entities, precision and recall over unique strings, the
  training PII defined by the same tagger that finds PII in the generated text; the ground-truth-span
  variant and all labels are extra columns;
* reconstruction (Algorithm 6, 64 candidates) and inference (``|C| = 100`` and ``500``, distractors from the
  training pool's PII of the same label, the truth once) accuracy over the queries the public baseline model
  does not already get right (the paper's rule), the raw accuracy as an extra column;
* membership inference AUC of the loss attack and of the reference-model (likelihood-ratio) attack that
  calibrates each loss by the public baseline model's (members: training records as trained on, scrubbed for
  the scrubbed variants; non-members: held-out records, scrubbed alike);
* a canary audit: canaries
inserted with probability 1/2 into the training records (after scrubbing: the audit measures the training
algorithm, not the tagger), scored by loss, turned into an epsilon lower bound by our one-run auditor
(:mod:`snapaudit_jax.estimation.one_run`, Steinke et al. 2023: a declared grid of guesses, valid for one training run)
-- ``epsilon_audited`` -- with jax_privacy's one-run value beside it as a labelled cross-reference (its
threshold family is chosen with the labels), and our Clopper-Pearson / GDP estimators on a separate
threshold-selection split (which treat canaries as independent trials: a heuristic within one run).

Output folder: ``results.json`` (one object per variant with the :data:`RESULT_KEYS`; ``null`` where not
applicable), ``results_full.json`` (every attack's details and the DP
reports), ``table.md``, ``leakage.png``, ``config.json``, and ``checkpoints/`` + ``variants/`` from which a
rerun into the same folder resumes (finished trainings and attacks are not redone).

References:
  Lukas et al., Analyzing Leakage of Personally Identifiable Information in Language Models (IEEE S&P
  2023), Tables III-VI; Steinke, Nasr, Jagielski, Privacy Auditing with One (1) Training Run (2023).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import time
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from attacks.blackbox import encode_texts, frame, score_texts
from attacks.canary import CanaryAuditConfig, canary_audit, one_run_insert_probability
from attacks.corpus import CanaryConfig, Corpus, CorpusConfig, insert_canaries, make_canaries, make_corpus
from attacks.extraction import ExtractionConfig, extraction_attack, tagged_pii
from attacks.inference import InferenceConfig, inference_attack
from attacks.mia import mia_attack
from attacks.ner import default_tagger, evaluate_tagger, scrub_text
from attacks.reconstruction import ReconstructionConfig, reconstruction_attack
from snapaudit_jax.estimation.one_run import check_design
from snapaudit_jax.utils import validate
from snapaudit_jax.utils.config import ConfigFileError, read_toml, reject_unknown, table, take
from snapaudit_jax.utils.errors import InputError
from snapaudit_jax.utils.io import to_json, write_json, write_text
from snapaudit_jax.utils.progress import RunLog

__all__ = ["VARIANTS", "RESULT_KEYS", "ModelSettings", "TrainingSettings", "PIIConfig", "load_pii_config",
           "run_pii", "train_tokenizer", "format_table"]

VARIANTS = ("undefended", "dp", "scrubbed", "dp_scrubbed")
RESULT_KEYS = ("perplexity", "extraction_precision", "extraction_recall", "reconstruction_accuracy",
               "reconstruction_accuracy_raw", "inference_accuracy", "inference_accuracy_raw", "mia_auc",
               "mia_auc_reference", "epsilon_claimed", "epsilon_audited")
HEADLINE_LABEL = "PERSON"  # Table III's entity class (the first attacked label when PERSON is not attacked)
_VERSION = 2  # of the resume files' layout


@dataclasses.dataclass(frozen=True)
class ModelSettings:
    """The GPT-2 trained in every variant (and the BPE vocabulary it reads).

    Attributes:
      n_layer, n_embd, n_head: transformer shape (``n_inner = 4 n_embd``).
      max_length: positions; every framed record and canary must fit.
      vocab_size: BPE vocabulary size (trained on the public corpus).
      init_seed: seed of the shared initialisation.
    """

    n_layer: int = 2
    n_embd: int = 128
    n_head: int = 4
    max_length: int = 128
    vocab_size: int = 1024
    init_seed: int = 0

    def validate(self) -> "ModelSettings":
        for name in ("n_layer", "n_embd", "n_head", "max_length"):
            validate.positive_int(name, getattr(self, name))
        validate.positive_int("vocab_size", self.vocab_size, minimum=300)
        validate.positive_int("init_seed", self.init_seed, minimum=0)
        if self.n_embd % self.n_head:
            raise InputError(f"n_embd must be divisible by n_head = {self.n_head}, got {self.n_embd}")
        return self


@dataclasses.dataclass(frozen=True)
class TrainingSettings:
    """Optimisation shared by every variant, and the DP variants' privacy parameters.

    Attributes:
      steps, batch_size (expected Poisson batch), learning_rate, optimizer: the run.
      clip_norm: per-record clipping norm ``C`` of the DP variants.
      epsilon, delta: the DP variants' target ``(epsilon, delta)`` (``delta`` default: ``1 / (10 N)``).
      accountant: accountant the noise is calibrated with (``rdp`` or ``pld``; both are reported).
    """

    steps: int = 400
    batch_size: int = 32
    learning_rate: float = 3e-3
    optimizer: str = "adamw"
    clip_norm: float = 1.0
    epsilon: float = 8.0
    delta: float | None = None
    accountant: str = "pld"

    def validate(self) -> "TrainingSettings":
        validate.positive_int("steps", self.steps)
        validate.positive_int("batch_size", self.batch_size)
        validate.positive_float("learning_rate", self.learning_rate)
        validate.choice("optimizer", self.optimizer, ("sgd", "adam", "adamw"))
        validate.positive_float("clip_norm", self.clip_norm)
        validate.positive_float("epsilon", self.epsilon)
        if self.delta is not None:
            validate.open_unit("delta", self.delta)
        validate.choice("accountant", self.accountant, ("rdp", "pld"))
        return self


@dataclasses.dataclass(frozen=True)
class PIIConfig:
    """A PII leakage experiment (``examples/pii_small.toml`` documents every key).

    Attributes:
      seed: seed of the train/test split and of every attack's key.
      n_test: held-out records (non-members: perplexity and membership inference).
      public_records: records of the public corpus (tokenizer and baseline model).
      variants: which of :data:`VARIANTS` to run.
      corpus: the private corpus (``n_records`` includes the ``n_test`` held-out ones).
      canaries, model, training, extraction, reconstruction, inference, audit: each stage's settings.
      mia_fprs: false-positive rates of the reported membership TPRs (empirical).
      eval_batch_size: rows per scoring pass.
      lazy_slots: PERSON slots of the extraction samples scored by the lazy extractability estimate
        (Algorithm 4) for every training name; ``0`` turns it off.
    """

    seed: int = 0
    n_test: int = 100
    public_records: int = 400
    variants: tuple[str, ...] = VARIANTS
    corpus: CorpusConfig = CorpusConfig(n_records=500, n_people=100)
    canaries: CanaryConfig = CanaryConfig(n_canaries=64)
    model: ModelSettings = ModelSettings()
    training: TrainingSettings = TrainingSettings()
    extraction: ExtractionConfig = ExtractionConfig(n_samples=200, max_new_tokens=96)
    reconstruction: ReconstructionConfig = ReconstructionConfig(n_samples=64, max_queries=100)
    inference: InferenceConfig = InferenceConfig(n_candidates=(100, 500), max_queries=100)
    audit: CanaryAuditConfig = CanaryAuditConfig()
    mia_fprs: tuple[float, ...] = (0.1, 0.01)
    eval_batch_size: int = 32
    lazy_slots: int = 32


_SECTIONS = {
    "corpus": CorpusConfig, "canaries": CanaryConfig, "model": ModelSettings, "training": TrainingSettings,
    "extraction": ExtractionConfig, "reconstruction": ReconstructionConfig, "inference": InferenceConfig,
    "audit": CanaryAuditConfig,
}


def _section(default, body: Any, where: str):
    """``dataclasses.replace(default, **body)`` with lists as tuples, then ``validate()``; errors name ``where``."""
    if not isinstance(body, dict):
        raise ConfigFileError(f"{where}: must be a table, got {body!r}")
    names = {f.name for f in dataclasses.fields(default)}
    unknown = sorted(set(body) - names)
    if unknown:
        raise ConfigFileError(f"{where}: unknown key(s) {', '.join(unknown)} (allowed: {', '.join(sorted(names))})")
    values = {k: tuple(tuple(x) if isinstance(x, list) else x for x in v) if isinstance(v, list) else v
              for k, v in body.items()}
    try:
        return dataclasses.replace(default, **values).validate()
    except (TypeError, ValueError) as err:
        msg = str(err)
        field = msg.split(" ", 1)[0].split("[", 1)[0]
        raise ConfigFileError(f"{where}: {msg}" + (f" ({where}.{field})" if field in names else "")) from None


def _check_one_run_design(config: PIIConfig) -> None:
    """The one-run bounds need fair coins for an (eps, delta) claim (pitfall 11): refused before any training."""
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
    """Reads and validates a TOML PII experiment (errors name ``section.key``, the rule and the value)."""
    raw = read_toml(path)
    run = table(raw, "run", "run", {})
    base = PIIConfig()
    kw: dict[str, Any] = {}
    kw["seed"] = take(run, "seed", "run", lambda v: validate.positive_int("seed", v, minimum=0), 0)
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
        kw[name] = _section(getattr(base, name), raw.pop(name, {}), name)
    reject_unknown(raw, os.fspath(path))
    config = PIIConfig(**kw)
    if config.n_test >= config.corpus.n_records:
        raise ConfigFileError(f"run.n_test: must be < corpus.n_records = {config.corpus.n_records}, "
                              f"got {config.n_test}")
    if config.audit.delta != base.audit.delta and config.training.delta is not None \
            and config.audit.delta != config.training.delta:
        raise ConfigFileError(f"audit.delta: must equal training.delta = {config.training.delta} (the audited "
                              f"claim), got {config.audit.delta}")
    _check_one_run_design(config)
    return config


# ---------------------------------------------------------------------------
# Data, tokenizer, models
# ---------------------------------------------------------------------------


def train_tokenizer(texts, vocab_size: int):
    """A byte-level BPE (``<|endoftext|>`` = id 0: start, end and padding) trained on ``texts``."""
    from tokenizers import Tokenizer as Backend
    from tokenizers import decoders, models, pre_tokenizers, trainers

    from snapaudit_jax.models.tokenizer import Tokenizer

    backend = Backend(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    backend.train_from_iterator(list(texts), trainer)
    return Tokenizer(backend=backend, bos_id=None, eos_ids=(0,), pad_id=0)


@dataclasses.dataclass
class _Data:
    corpus: Corpus
    train: list  # Records (members)
    test: list  # Records (held out)
    public: Corpus
    canaries: Any
    tokenizer: Any
    tagger: Any
    scrubbed: list[str]  # the training records as the scrubbed variants train on them
    scrubbed_test: list[str]  # the held-out records scrubbed alike (the scrubbed variants' evaluation text)
    tagged_train_pii: set  # (label, string) the tagger finds in the training records (Table III's training PII)
    tagger_quality: dict


def _prepare(config: PIIConfig, log) -> _Data:
    _check_one_run_design(config)  # also for a PIIConfig built in code, not read by load_pii_config
    corpus = make_corpus(config.corpus)
    perm = np.random.default_rng([config.seed, 11]).permutation(len(corpus.records))
    test_idx = set(int(i) for i in perm[:config.n_test])
    train = [r for r in corpus.records if r.index not in test_idx]
    test = [r for r in corpus.records if r.index in test_idx]
    # The public corpus: same generator, another seed (other people, organisations, canaries absent).
    public = make_corpus(dataclasses.replace(config.corpus, seed=config.corpus.seed + 7919,
                                             n_records=config.public_records))
    canaries = make_canaries(config.canaries)
    tokenizer = train_tokenizer(public.texts, config.model.vocab_size)
    tagger = default_tagger(config.corpus.locale)
    texts = [r.text for r in train]
    predicted = tagger.tag(texts)
    quality = evaluate_tagger(predicted, [r.spans for r in train])
    scrubbed = [scrub_text(t, spans) for t, spans in zip(texts, predicted)]  # scrub(), without tagging twice
    test_texts = [r.text for r in test]
    scrubbed_test = [scrub_text(t, spans) for t, spans in zip(test_texts, tagger.tag(test_texts))]
    from attacks.extraction import normalize_pii

    tagged_train_pii = {(s.label, normalize_pii(s.value)) for spans in predicted for s in spans}
    label = config.inference.label
    pool = {normalize_pii(s.value) for r in train for s in r.spans if s.label == label}
    if len(pool) < max(config.inference.sizes):
        raise ConfigFileError(
            f"inference.n_candidates: |C| = {max(config.inference.sizes)} needs at least that many distinct "
            f"{label} strings in the training records (the distractor pool, with the truth drawn once), got "
            f"{len(pool)}; lower it or raise corpus.n_people / corpus.n_records")
    log(f"corpus: {len(train)} training records, {len(test)} held out, {len(public.records)} public; "
        f"{int(canaries.inserted.sum())}/{len(canaries.canaries)} canaries inserted; "
        f"tagger recall {quality['all']['recall']:.3f}, precision {quality['all']['precision']:.3f}")
    longest = max(len(frame(tokenizer, t)) for t in texts + scrubbed + test_texts + scrubbed_test + public.texts
                  + [c.text for c in canaries.canaries])
    if longest > config.model.max_length:
        raise ConfigFileError(f"model.max_length: must be >= {longest} (the longest framed record), "
                              f"got {config.model.max_length}")
    return _Data(corpus, train, test, public, canaries, tokenizer, tagger, scrubbed, scrubbed_test, tagged_train_pii,
                 quality)


def _init_model(config: PIIConfig, tokenizer):
    from flax import nnx

    from snapaudit_jax.models.config import GPT2Config
    from snapaudit_jax.models.decoders import GPT2

    m = config.model
    cfg = GPT2Config(vocab_size=tokenizer.vocab_size, n_positions=m.max_length, n_embd=m.n_embd, n_layer=m.n_layer,
                     n_head=m.n_head, n_inner=4 * m.n_embd)
    return GPT2(cfg, nnx.Rngs(m.init_seed))


def _dpsgd_config(config: PIIConfig, dp: bool, n_records: int):
    from snapaudit_jax.dpsgd import DPSGDConfig

    t = config.training
    delta = t.delta if t.delta is not None else 1.0 / (10 * n_records)
    if dp:
        return DPSGDConfig(steps=t.steps, learning_rate=t.learning_rate, clip_norm=t.clip_norm,
                           target_epsilon=t.epsilon, delta=delta, batch_size=t.batch_size, optimizer=t.optimizer,
                           accountant=t.accountant, seed=config.seed)
    return DPSGDConfig(steps=t.steps, learning_rate=t.learning_rate, batch_size=t.batch_size, optimizer=t.optimizer,
                       non_private=True, seed=config.seed)


def _train(name: str, texts: list[str], dp: bool, config: PIIConfig, data: _Data, out_dir: str, log):
    from snapaudit_jax.dpsgd import train

    tokens, mask = encode_texts(data.tokenizer, texts, config.model.max_length)
    cfg = _dpsgd_config(config, dp, len(texts))
    start = time.perf_counter()
    log(f"training {name}: {len(texts)} records, {cfg.steps} steps" + (" (DP-SGD)" if dp else ""))
    model, history, report = train(
        _init_model(config, data.tokenizer), (tokens, mask), cfg,
        key=jax.random.fold_in(jax.random.key(config.seed), 1 if name in VARIANTS else 2),  # variants: same batches
        checkpoint_dir=os.path.join(out_dir, "checkpoints", name), checkpoint_every=max(1, cfg.steps // 4),
        progress=log.enabled)
    loss = np.asarray(history["loss"], np.float64)
    tail = loss[-max(1, len(loss) // 10):]
    log(f"trained {name} in {time.perf_counter() - start:.0f}s; final loss {np.nanmean(tail):.3f}"
        + (f"; epsilon {report.epsilon:.3g} at delta {report.delta:.2g}" if report.dp else ""))
    return model, report


# ---------------------------------------------------------------------------
# Attacks
# ---------------------------------------------------------------------------


def _perplexity(model, data: _Data, texts, batch_size: int) -> float:
    s = score_texts(model, data.tokenizer, texts, batch_size=batch_size)
    return float(math.exp(float(np.sum(s.nll)) / float(np.sum(s.tokens))))


def _attack(name: str, model, report, config: PIIConfig, data: _Data, baseline, baseline_pii, log) -> dict:
    key = jax.random.fold_in(jax.random.key(config.seed), 1000)  # the same attack randomness for every variant
    bs = config.eval_batch_size
    out: dict[str, Any] = {"variant": name}
    t0 = time.perf_counter()
    scrubbed = name in ("scrubbed", "dp_scrubbed")
    # Evaluation text as the variant was trained: the scrubbed variants are evaluated on scrubbed text.
    train_texts = data.scrubbed if scrubbed else [r.text for r in data.train]
    test_texts = data.scrubbed_test if scrubbed else [r.text for r in data.test]
    out["evaluation_text"] = "scrubbed" if scrubbed else "raw"
    out["perplexity"] = _perplexity(model, data, test_texts, bs)
    out["train_perplexity"] = _perplexity(model, data, train_texts, bs)
    out["extraction"] = extraction_attack(model, data.tokenizer, data.train, config.extraction,
                                          jax.random.fold_in(key, 1), tagger=data.tagger, baseline_pii=baseline_pii,
                                          tagged_training=data.tagged_train_pii)
    head = _headline_extraction(out["extraction"], config)
    log(f"{name}: extraction ({head['label']}, tagged training PII) precision {_fmt(head['precision'])}, "
        f"recall {_fmt(head['recall'])}")
    if config.lazy_slots:
        out["lazy_extraction"] = _lazy(model, data, out["extraction"]["samples"], config, jax.random.fold_in(key, 6))
    out["reconstruction"] = reconstruction_attack(model, data.tokenizer, data.train, config.reconstruction,
                                                  jax.random.fold_in(key, 2), tagger=data.tagger,
                                                  baseline_model=baseline)
    # Distractors: the training records' own PII of the label (inference_attack's default pool).
    out["inference"] = inference_attack(model, data.tokenizer, data.train, config.inference,
                                        jax.random.fold_in(key, 3), baseline_model=baseline)
    rec, inf = out["reconstruction"], out["inference"]
    log(f"{name}: reconstruction {_fmt(rec['accuracy_excluding_baseline'])} excluding what the public model gets "
        f"right ({_fmt(rec['accuracy'])} raw), inference " + ", ".join(
            f"|C| = {g['n_candidates']}: {_fmt(g['accuracy_excluding_baseline'])} ({_fmt(g['accuracy'])} raw)"
            for g in inf["by_size"]))
    rng = np.random.default_rng([config.seed, 13])
    members = [train_texts[int(i)] for i in rng.choice(len(data.train), len(data.test), replace=False)]
    out["mia"] = mia_attack(model, data.tokenizer, members, test_texts, jax.random.fold_in(key, 4),
                            fprs=config.mia_fprs, batch_size=bs)
    out["mia_reference"] = mia_attack(model, data.tokenizer, members, test_texts, jax.random.fold_in(key, 4),
                                      reference_model=baseline, fprs=config.mia_fprs, batch_size=bs)
    audit_delta = report.delta if report.dp else config.audit.delta
    audit_cfg = dataclasses.replace(config.audit, delta=audit_delta)
    out["canary_audit"] = canary_audit(model, data.tokenizer, data.canaries, audit_cfg, jax.random.fold_in(key, 5))
    group = next((g for g in out["canary_audit"]["groups"] if g["repetitions"] == 1), None)
    audited = None
    if group is not None and group.get("one_run"):
        audited = float(group["one_run"]["epsilon"])
    out["report"] = _report_dict(report)
    out["row"] = {
        "perplexity": out["perplexity"],
        "extraction_precision": to_json(head["precision"]),
        "extraction_recall": to_json(head["recall"]),
        "reconstruction_accuracy": to_json(rec["accuracy_excluding_baseline"]),
        "reconstruction_accuracy_raw": to_json(rec["accuracy"]),
        "inference_accuracy": to_json(inf["accuracy_excluding_baseline"]),
        "inference_accuracy_raw": to_json(inf["accuracy"]),
        "mia_auc": to_json(out["mia"]["auc"]),
        "mia_auc_reference": to_json(out["mia_reference"]["auc"]),
        "epsilon_claimed": float(report.epsilon) if report.dp else None,
        "epsilon_audited": audited,
    }
    log(f"{name}: MIA AUC {out['mia']['auc']:.3f} (loss), {out['mia_reference']['auc']:.3f} (reference model), "
        f"audited epsilon {audited if audited is None else round(audited, 3)}"
        f" ({time.perf_counter() - t0:.0f}s of attacks)")
    return out


def _headline_label(config: PIIConfig) -> str:
    labels = config.extraction.labels
    return HEADLINE_LABEL if HEADLINE_LABEL in labels else labels[0]


def _headline_extraction(extraction: Mapping[str, Any], config: PIIConfig) -> dict:
    """Table III's figure: one label (PERSON), unique strings, the training PII as the tagger defines it."""
    label = _headline_label(config)
    rates = extraction["tagged"]["per_label"].get(label) or {"precision": float("nan"), "recall": float("nan")}
    return {"label": label, **rates}


REPETITION_BINS = ((1, 3), (4, 15), (16, None))  # training records holding the attacked PII string


def _by_repetition(done: Mapping[str, Any], data: _Data) -> dict:
    """Reconstruction and inference accuracy by how many training records hold the true PII string.

    DP-SGD bounds what one record reveals; a string held by many records is a group of that size, so
    its leakage is not covered by the per-record guarantee. The strata separate the two.
    """
    from attacks.extraction import normalize_pii

    counts: dict[tuple[str, str], int] = {}
    for r in data.train:
        for key in {(s.label, normalize_pii(s.value)) for s in r.spans}:
            counts[key] = counts.get(key, 0) + 1
    out = {}
    for game in ("reconstruction", "inference"):
        rows = []
        for lo, hi in REPETITION_BINS:
            hits = [it["correct"] for it in done[game]["items"]
                    if lo <= counts.get((it["label"], it["truth"]), 0) <= (hi if hi is not None else 1 << 62)]
            rows.append({"records": f"{lo}-{hi}" if hi is not None else f">={lo}", "n_queries": len(hits),
                         "accuracy": float(np.mean(hits)) if hits else None})
        out[game] = rows
    return out


def _lazy(model, data: _Data, samples, config: PIIConfig, key) -> dict:
    """Lazy extractability (seed 003, Algorithm 4) of every training name from the extraction samples.

    ``expected_recall`` turns each estimate (the per-sample probability of generating the name) into the chance
    that ``N`` samples generate it at least once, ``1 - exp(-N * estimate)``, averaged over the names: the
    observed extraction recall's counterpart without the tagger's or the baseline's filtering.
    """
    from attacks.extraction import lazy_extractability, normalize_pii

    names = sorted({normalize_pii(s.value) for r in data.train for s in r.spans if s.label == "PERSON"})
    res = lazy_extractability(model, data.tokenizer, [("PERSON", v) for v in names], samples, key,
                              tagger=data.tagger, max_slots=config.lazy_slots, batch_size=config.eval_batch_size)
    n = len(samples)
    est = np.array([it["estimate"] for it in res["items"]], np.float64)
    res["expected_recall"] = float(np.mean(-np.expm1(-n * est))) if est.size else None
    res["n_targets"] = len(names)
    return res


def _report_dict(report) -> dict:
    return to_json(report.to_dict() if hasattr(report, "to_dict") else dataclasses.asdict(report))


# ---------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------


def _fingerprint(config: PIIConfig) -> str:
    return hashlib.sha256(json.dumps(_config_json(config), sort_keys=True).encode()).hexdigest()[:16]


def _config_json(config: PIIConfig) -> dict:
    return to_json(dataclasses.asdict(config))


def _read_resume_json(path: str, what: str):
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError) as err:
        raise ConfigFileError(f"{path}: not a readable {what} ({err}); delete it (or choose another --out folder) "
                              "to recompute") from None


def _check_run_folder(config: PIIConfig, out_dir: str) -> None:
    """Refuses, before any work and changing nothing, a run folder of another configuration or with corrupted
    resume files (``run.json``, ``variants/*.json``)."""
    if not os.path.isdir(out_dir):
        return
    stamp = {"version": _VERSION, "config": _fingerprint(config)}
    stamp_path = os.path.join(out_dir, "run.json")
    if os.path.exists(stamp_path):
        old = _read_resume_json(stamp_path, "run stamp")
        if not isinstance(old, dict):
            raise ConfigFileError(f"{stamp_path}: a run stamp must be a JSON object {{\"version\", \"config\"}}, got "
                                  f"{str(old)[:80]!r}; choose another --out folder")
        if old != stamp:
            raise ConfigFileError(f"{out_dir}: holds a run of another configuration ({old.get('config')}, this one "
                                  f"is {stamp['config']}); choose another --out folder")
    for name in ("baseline_pii", *VARIANTS):
        path = os.path.join(out_dir, "variants", f"{name}.json")
        if not os.path.exists(path):
            continue
        done = _read_resume_json(path, "resume file")
        ok = (isinstance(done, list) and all(isinstance(p, list) and len(p) == 2 for p in done)) \
            if name == "baseline_pii" else (isinstance(done, dict) and isinstance(done.get("row"), dict))
        if not ok:
            shape = "a list of [label, string] pairs" if name == "baseline_pii" else 'an object with a "row" object'
            raise ConfigFileError(f"{path}: a resume file must hold {shape}, got {str(done)[:80]!r}; delete it to "
                                  "recompute")


def run_pii(config: PIIConfig, out_dir: str, *, progress: bool = True) -> dict:
    """Trains the variants, runs every attack and writes the run folder (resuming from it)."""
    _check_run_folder(config, out_dir)  # another run's folder or a corrupted resume file: before any work
    log = RunLog(progress)
    t0 = time.perf_counter()
    data = _prepare(config, log)  # every data/config error is raised before anything is written
    os.makedirs(out_dir, exist_ok=True)
    stamp = {"version": _VERSION, "config": _fingerprint(config)}
    stamp_path = os.path.join(out_dir, "run.json")
    if os.path.exists(stamp_path):
        with open(stamp_path) as fh:
            old = json.load(fh)
        if old != stamp:
            raise ConfigFileError(f"{out_dir}: holds a run of another configuration ({old.get('config')}, this one "
                                  f"is {stamp['config']}); choose another --out folder")
    else:
        write_json(stamp_path, stamp)

    baseline, _ = _train("baseline", data.public.texts, False, config, data, out_dir, log)
    base_samples_path = os.path.join(out_dir, "variants", "baseline_pii.json")
    if os.path.exists(base_samples_path):
        with open(base_samples_path) as fh:
            baseline_pii = [tuple(x) for x in json.load(fh)]
    else:
        from attacks.extraction import extraction_samples

        n_base = config.extraction.n_baseline_samples or config.extraction.n_samples
        samples = extraction_samples(baseline, data.tokenizer, n_base,
                          jax.random.fold_in(jax.random.fold_in(jax.random.key(config.seed), 1000), 99),
                          config.extraction)
        baseline_pii = sorted(tagged_pii(samples, data.tagger, config.extraction.labels))
        write_json(base_samples_path, [list(p) for p in baseline_pii])
    log(f"baseline: {len(baseline_pii)} distinct PII strings in its samples (not counted as leaked)")

    results, full = {}, {}
    for name in config.variants:
        path = os.path.join(out_dir, "variants", f"{name}.json")
        if os.path.exists(path):
            with open(path) as fh:
                done = json.load(fh)
            log(f"{name}: attacks already done (resumed from {path})")
        else:
            scrubbed = name in ("scrubbed", "dp_scrubbed")
            texts = insert_canaries(data.scrubbed if scrubbed else [r.text for r in data.train], data.canaries)
            model, report = _train(name, texts, name.startswith("dp"), config, data, out_dir, log)
            done = to_json(_attack(name, model, report, config, data, baseline, baseline_pii, log))
            write_json(path, done)
        results[name] = done["row"]
        full[name] = {k: v for k, v in done.items() if k != "row"}
        full[name]["by_repetition"] = _by_repetition(done, data)

    seconds = time.perf_counter() - t0
    write_json(os.path.join(out_dir, "results.json"), results)
    write_json(os.path.join(out_dir, "results_full.json"),
               {"variants": full, "tagger": to_json(data.tagger_quality), "seconds": seconds,
                "corpus": {"train_records": len(data.train), "test_records": len(data.test),
                           "public_records": len(data.public.records),
                           "canaries_inserted": int(data.canaries.inserted.sum()),
                           "canaries_held_out": int((~data.canaries.inserted).sum())}})
    write_json(os.path.join(out_dir, "config.json"), _config_json(config))
    write_text(os.path.join(out_dir, "table.md"), format_table(results, full, config, data.tagger_quality))
    _plot(os.path.join(out_dir, "leakage.png"), results, log)
    log(f"done in {seconds:.0f}s -> {out_dir}")
    return {"results": results, "full": full, "seconds": seconds}


def _fmt(x, digits=3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def format_table(results: Mapping[str, dict], full: Mapping[str, dict], config: PIIConfig, tagger: dict) -> str:
    """Markdown in the spirit of seed 003's Tables III-VI."""
    sizes = config.inference.sizes
    label = _headline_label(config)
    lines = ["# PII leakage of a small GPT-2 trained four ways", "",
             f"Extraction (Table III): {label} strings in {config.extraction.n_samples} top-{config.extraction.top_k}"
             " samples, precision and recall over unique strings against the training PII as the same tagger finds "
             "it, PII the public baseline model also generates removed. Reconstruction "
             f"({config.reconstruction.n_samples} sampled candidates) and inference (|C| = {sizes[0]}, chance "
             f"{1 / sizes[0]:.3f}) of {config.reconstruction.label}: accuracy over the queries the public baseline "
             "model does not already get right. MIA: loss attack (and the reference-model attack calibrated by the "
             "public baseline model), members vs held-out records, scrubbed text for the scrubbed variants (as the "
             "perplexity). Epsilon audited: our one-run lower bound from the canaries inserted once (95%, declared "
             "guess grid).", "",
             "| variant | perplexity | extraction precision | extraction recall | reconstruction acc. | "
             "inference acc. | MIA AUC (loss) | MIA AUC (reference) | epsilon claimed | epsilon audited |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, r in results.items():
        lines.append(f"| {name} | {_fmt(r['perplexity'], 2)} | {_fmt(r['extraction_precision'])} | "
                     f"{_fmt(r['extraction_recall'])} | {_fmt(r['reconstruction_accuracy'])} | "
                     f"{_fmt(r['inference_accuracy'])} | {_fmt(r['mia_auc'])} | {_fmt(r['mia_auc_reference'])} | "
                     f"{_fmt(r['epsilon_claimed'], 2)} | {_fmt(r['epsilon_audited'], 2)} |")

    def pr(rates):
        return f"{_fmt((rates or {}).get('precision'))} / {_fmt((rates or {}).get('recall'))}"

    lines += ["", "Extra columns. Extraction precision / recall: the headline label against the ground-truth spans "
              "(counts the tagger's misses), and every attacked label (micro) against tagged and ground-truth PII. "
              "Accuracy raw: over every query; public model: the baseline model ranking the same lists; agreement "
              "rule: the reference implementation's (a query is skipped when the public model predicts what the "
              "target predicts).", "",
              f"| variant | extraction {label}, ground truth | all labels, tagged | all labels, ground truth | "
              "reconstruction raw / public model / agreement rule | "
              + " | ".join(f"inference |C| = {s}: excl. public / raw / public model" for s in sizes) + " |",
              "|---|---:|---:|---:|---:|" + "---:|" * len(sizes)]
    for name, f in full.items():
        ex, rec = f["extraction"], f["reconstruction"]
        games = {g["n_candidates"]: g for g in f["inference"].get("by_size", [f["inference"]])}
        cells = [pr(ex["per_label"].get(label)), pr(ex.get("tagged")), pr(ex),
                 f"{_fmt(rec.get('accuracy'))} / {_fmt(rec.get('baseline_accuracy'))} / "
                 f"{_fmt(rec.get('accuracy_excluding_agreement'))}"]
        for size in sizes:
            g = games.get(size, {})
            cells.append(f"{_fmt(g.get('accuracy_excluding_baseline'))} / {_fmt(g.get('accuracy'))} / "
                         f"{_fmt(g.get('baseline_accuracy'))}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "The public model's reconstruction ranks candidates sampled from each variant's own model, so it "
              "measures the ranking step only; its inference accuracy is what the data distribution alone gives "
              "away.", ""]
    lines += ["", "Accuracy by how many training records hold the attacked PII (DP bounds one record's "
              "influence; repeated PII is a group):", "",
              "| variant | game | " + " | ".join(r["records"] + " records" for r in
                                                  next(iter(full.values()))["by_repetition"]["inference"]) + " |",
              "|---|---|" + "---:|" * len(REPETITION_BINS)]
    for name, f in full.items():
        for game in ("reconstruction", "inference"):
            cells = [f"{_fmt(r['accuracy'])} (n={r['n_queries']})" for r in f["by_repetition"][game]]
            lines.append(f"| {name} | {game} | " + " | ".join(cells) + " |")
    lazy = {n: (f.get("lazy_extraction") or {}).get("expected_recall") for n, f in full.items()}
    if any(v is not None for v in lazy.values()):
        lines += ["", "Lazy extractability (Algorithm 4, PERSON): expected share of training names that the "
                  f"{config.extraction.n_samples} samples generate at least once: "
                  + ", ".join(f"{n} {_fmt(v)}" for n, v in lazy.items()) + ".", ""]
    lines += ["", "Canary audit (canaries inserted once): our one-run bound (declared grid of top-k+ / bottom-k- "
              "guesses, union bound over it) is the reported epsilon_audited; jax_privacy's one-run value is a "
              "cross-reference (its thresholds are a frontier chosen with the labels, 6.1% false eps > 0 at a "
              "nominal 5%); our Clopper-Pearson estimators on a separate threshold split (standard eps and the GDP "
              "mu lower bound) treat the canaries as independent trials, a cross-check, not a one-run bound.", "",
              "| variant | canary AUC | one-run (ours) | guesses k+/k- (correct) | one-run (jax_privacy, "
              "cross-reference) | CP split std (ours) | CP split mu_low (ours) | CP Bonferroni (jax_privacy) |",
              "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, f in full.items():
        group = next((g for g in f["canary_audit"]["groups"] if g["repetitions"] == 1), None)
        if group is None or group.get("bounds") is None:
            continue
        jp, ours, one = group.get("jax_privacy") or {}, group["bounds"], group.get("one_run") or {}
        guesses = (f"{one['k_plus']}/{one['k_minus']} ({one['correct_plus'] + one['correct_minus']})"
                   if one else "-")
        lines.append(f"| {name} | {_fmt(group['auc'])} | {_fmt(one.get('epsilon'), 2)} | {guesses} | "
                     f"{_fmt(jp.get('one_run'), 2)} | {_fmt(ours['std']['epsilon_std'], 2)} | "
                     f"{_fmt(ours['gdp']['mu_lower'], 2)} | {_fmt(jp.get('cp_bonferroni'), 2)} |")
    lines += ["", f"Tagger (scrubbing) on the training records: recall {tagger['all']['recall']:.3f}, precision "
              f"{tagger['all']['precision']:.3f}; PII it misses stays in the scrubbed variants' training data.", ""]
    for name, f in full.items():
        rep = f.get("report") or {}
        if rep.get("dp"):
            lines.append(f"- {name}: (epsilon, delta) = ({rep.get('epsilon_pld', float('nan')):.3g} PLD / "
                         f"{rep.get('epsilon_rdp', float('nan')):.3g} RDP, {rep.get('delta'):.2g}); protected unit: "
                         f"{rep.get('protected_unit')}; adjacency: {rep.get('adjacency')}; Poisson sampling q = "
                         f"{rep.get('sampling_rate', float('nan')):.4g}, {rep.get('steps')} steps, C = "
                         f"{rep.get('clip_norm')}, sigma = {rep.get('noise_multiplier', float('nan')):.4g}.")
    return "\n".join(lines) + "\n"


def _plot(path: str, results: Mapping[str, dict], log) -> None:
    from snapaudit_jax.report import pyplot, save_figure
    from snapaudit_jax.utils.errors import DependencyError

    try:
        plt = pyplot()
    except DependencyError:
        log("matplotlib not installed: no plot")
        return

    keys = ("extraction_precision", "extraction_recall", "reconstruction_accuracy", "inference_accuracy", "mia_auc")
    names = list(results)
    fig, ax = plt.subplots(figsize=(8, 3.5))
    width = 0.8 / max(1, len(names))
    for i, name in enumerate(names):
        vals = [results[name][k] if results[name][k] is not None else 0.0 for k in keys]
        ax.bar(np.arange(len(keys)) + i * width, vals, width, label=name)
    ax.set_xticks(np.arange(len(keys)) + 0.4 - width / 2, [k.replace("_", "\n") for k in keys], fontsize=8)
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize=8)
    ax.set_title("PII leakage by training variant")
    fig.tight_layout()
    save_figure(fig, path, fmt="png", dpi=120)
