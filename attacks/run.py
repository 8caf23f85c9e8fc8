"""The PII leakage experiment's run (``snapaudit pii CONFIG.toml``): four training variants, every attack, one table.

As the paper runs it, a **pretrained** decoder (``[model] base``: the embedded SmolLM2-135M by default, or a
local GPT-2 / Llama folder or GGUF file) is **fine-tuned** on a synthetic corpus of e-mail and court-case records
(:mod:`attacks.corpus`) four ways -- ``undefended`` (plain training), ``dp`` (DP-SGD at the configured
``epsilon``), ``scrubbed`` (plain training on records whose tagged PII is replaced by ``[MASK]``) and
``dp_scrubbed`` -- each a copy of the base (``method = "lora"``: the same initial adapters, the base's weights
frozen; ``"full"``: every parameter) with the same optimizer, steps and Poisson batches, the batches and the DP
noise from the run's secret key (:mod:`snapaudit_jax.dpsgd.keys`, as ``snapaudit finetune``; the base, its copy
and the adapters are :mod:`snapaudit_jax.finetune.base`'s, shared with that command). The **public baseline** is
the untouched base: PII it generates itself is not counted as leaked, it calibrates the reference membership
attack, and the queries it already gets right are set aside in reconstruction and inference. Its tokenizer
reads every text.

``base = "scratch"`` keeps the small from-scratch setting (the fast test): a GPT-2 of the configured shape
trained from one random initialisation, with a ``baseline`` model trained on a disjoint *public* corpus (same
distribution, other people) that also supplies the BPE tokenizer (trained on public text only, so its
vocabulary holds no private PII).

Each variant gets, measured as seed 003 measures it (where the CPU-sized setting differs, docs/pii.md says so):

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
* a canary audit: canaries inserted with probability 1/2 into the training records (after scrubbing: the
  audit measures the training algorithm, not the tagger), scored by loss, turned into an epsilon lower bound
  by our one-run auditor (:mod:`snapaudit_jax.estimation.one_run`, Steinke et al. 2023: a declared grid of
  guesses, valid for one training run) -- ``epsilon_audited`` -- with jax_privacy's one-run value beside it
  as a labelled cross-reference (its threshold family is chosen with the labels), and our Clopper-Pearson /
  GDP estimators on a separate threshold-selection split (which treat canaries as independent trials: a
  heuristic within one run).

The configuration is :mod:`attacks.config`, the data :mod:`attacks.data`, the table and the plot
:mod:`attacks.report`.

Output folder: ``results.json`` (one object per variant with the :data:`~attacks.config.RESULT_KEYS`;
``null`` where not applicable), ``results_full.json`` (every attack's details and the DP reports),
``table.md``, ``leakage.png``, ``config.json``, ``run.json`` (the run stamp, :func:`run_folder`), and
``checkpoints/`` + ``variants/`` from which a rerun of the same configuration into the same folder resumes
(finished trainings and attacks are not redone).

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
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from attacks.blackbox import encode_texts, score_texts
from attacks.canary import canary_audit
from attacks.config import REPETITION_BINS, VARIANTS, PIIConfig, headline_label
from attacks.corpus import insert_canaries
from attacks.data import PreparedData, prepare_data
from attacks.extraction import extraction_attack, extraction_samples, lazy_extractability, normalize_pii, tagged_pii
from attacks.inference import inference_attack
from attacks.mia import mia_attack
from attacks.reconstruction import reconstruction_attack
from attacks.report import compare_variants, format_goals, format_metric, format_table, plot_leakage
from snapaudit_jax.models.tokenizer import Tokenizer
from snapaudit_jax.utils.config import ConfigFileError
from snapaudit_jax.utils.errors import InputError
from snapaudit_jax.utils.io import to_json, write_json, write_text
from snapaudit_jax.utils.progress import RunLog
from snapaudit_jax.utils.run_folder import RunFolder

__all__ = ["RESULT_FILES", "RESUME_VERSION", "fingerprint", "initial_model", "perplexity", "run_folder", "run_pii",
           "train_variant", "training_arrays"]

# Of the resume files' layout (``checkpoints/``, ``variants/*.json``), in the run stamp; 3: the batches and noise
# come from the run's secret key (``checkpoints/run_key.json``).
RESUME_VERSION = 4  # 4: rows hold canary_exposure; the variants may fine-tune a pretrained base
RESULT_FILES = ("results.json", "results_full.json", "table.md", "config.json")  # a finished run's files


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
                           accountant=t.accountant, clipping=t.clipping, clipped_sum_dtype=t.clipped_sum_dtype,
                           layers=t.layers,
                           vocab_chunk=t.vocab_chunk or None, seed=config.noise_seed)
    return DPSGDConfig(steps=t.steps, learning_rate=t.learning_rate, batch_size=t.batch_size, optimizer=t.optimizer,
                       non_private=True, layers=t.layers, vocab_chunk=t.vocab_chunk or None, seed=config.noise_seed)


def _root_key(config: PIIConfig, out_dir: str):
    """The key of every variant's batches and noise: secret (drawn once into ``checkpoints/run_key.json``), or
    from ``[run] noise_seed``."""
    from snapaudit_jax.dpsgd.keys import resolve_run_key

    return resolve_run_key(None, config.noise_seed, os.path.join(out_dir, "checkpoints"))[0]


def initial_model(config: PIIConfig, data: PreparedData, base=None):
    """The shared initialisation every variant trains from.

    Args:
      config: the experiment.
      data: its prepared data (the tokenizer of a ``"scratch"`` model).
      base: the pretrained base's NNX decoder (``model.base`` not ``"scratch"``), left unchanged.

    Returns:
      ``(model, trainable)``: a copy of the base sharing its arrays, with the LoRA adapters of ``model.init_seed``
      for ``method = "lora"`` (trainable: the adapters, :data:`snapaudit_jax.finetune.lora.TRAINABLE`), or
      every parameter (``nnx.Param``) for ``method = "full"``; ``"scratch"``: a GPT-2 of ``model.init_seed``.

    Raises:
      ValueError: a pretrained ``model.base`` without ``base``.
    """
    from flax import nnx

    if not config.model.pretrained:
        return _init_model(config, data.tokenizer), nnx.Param
    if base is None:
        raise InputError(f"base: model.base = {config.model.base!r} is pretrained: pass its loaded decoder")
    from snapaudit_jax.finetune.base import fresh_copy
    from snapaudit_jax.finetune.lora import TRAINABLE

    lora = config.model.lora()
    return fresh_copy(base, lora, seed=config.model.init_seed), (TRAINABLE if lora is not None else nnx.Param)


def training_arrays(tokenizer, texts: Sequence[str], max_length: int) -> tuple[np.ndarray, np.ndarray]:
    """The training records as right-padded arrays only as wide as the longest of them needs.

    Every step costs its padded width, so the arrays end at the longest framed record rounded up to a multiple
    of 8 (at most ``max_length``), not at ``max_length`` itself; the padding is masked, so the losses and
    gradients are the same.

    Args:
      tokenizer: the tokenizer.
      texts: the training records.
      max_length: ``model.max_length`` (every framed record fits in it: :func:`attacks.data.prepare_data`).

    Returns:
      ``(tokens, mask)`` of :func:`attacks.blackbox.encode_texts`, ``(n, L)`` with ``L <= max_length``.
    """
    from attacks.blackbox import frame

    longest = max(len(frame(tokenizer, t)) for t in texts)
    return encode_texts(tokenizer, texts, min(int(max_length), max(8, -(-longest // 8) * 8)))


def train_variant(name: str, texts: list[str], dp: bool, config: PIIConfig, data: PreparedData, out_dir: str,
                  log: RunLog, base=None):
    """Trains one model from the shared initialisation, resuming from its checkpoints in ``out_dir``.

    Every variant (a name of :data:`~attacks.config.VARIANTS`) draws the same Poisson batches; the public
    ``baseline`` (``model.base = "scratch"`` only: a pretrained base is its own baseline) draws its own.

    Args:
      name: the variant, or ``"baseline"`` (checkpoints in ``out_dir/checkpoints/<name>``).
      texts: the training records, framed and padded to ``model.max_length``.
      dp: DP-SGD at ``training.epsilon`` (else plain training with the same optimizer and steps).
      config: the experiment.
      data: its prepared data (the tokenizer).
      out_dir: the run folder.
      log: progress log.
      base: the pretrained base's decoder (see :func:`initial_model`).

    Returns:
      ``(model, report)``: the trained NNX decoder and the :func:`snapaudit_jax.dpsgd.train` report (its
      ``epsilon`` and ``delta`` when ``dp``).
    """
    from snapaudit_jax.dpsgd import train

    tokens, mask = training_arrays(data.tokenizer, texts, config.model.max_length)
    cfg = _dpsgd_config(config, dp, len(texts))
    start = time.perf_counter()
    log(f"training {name}: {len(texts)} records, {cfg.steps} steps" + (" (DP-SGD)" if dp else ""))
    model, trainable = initial_model(config, data, base)
    model, history, report = train(
        model, (tokens, mask), cfg, trainable=trainable,
        key=jax.random.fold_in(_root_key(config, out_dir), 1 if name in VARIANTS else 2),  # variants: same batches
        checkpoint_dir=os.path.join(out_dir, "checkpoints", name), checkpoint_every=max(1, cfg.steps // 4),
        progress=log.enabled)
    from snapaudit_jax.dpsgd.keys import RANDOMNESS

    report = dataclasses.replace(report, randomness=RANDOMNESS["secret" if config.noise_seed is None else "seed"])
    loss = np.asarray(history["loss"], np.float64)
    tail = loss[-max(1, len(loss) // 10):]
    log(f"trained {name} in {time.perf_counter() - start:.0f}s; final loss {np.nanmean(tail):.3f}"
        + (f"; epsilon {report.epsilon:.3g} at delta {report.delta_total:.2g}" if report.dp else ""))
    return model, report


def perplexity(model, tokenizer: Tokenizer, texts: Sequence[str], batch_size: int) -> float:
    """Corpus perplexity: ``exp`` of the summed negative log-likelihood over the summed scored tokens.

    Args:
      model: an NNX decoder.
      tokenizer: its tokenizer.
      texts: ``n`` texts, each framed with start and EOS tokens (:func:`attacks.blackbox.frame`).
      batch_size: rows per scoring pass.

    Returns:
      The token-weighted perplexity of ``texts``.
    """
    s = score_texts(model, tokenizer, texts, batch_size=batch_size)
    return float(math.exp(float(np.sum(s.nll)) / float(np.sum(s.tokens))))


def _attack(name: str, model, report, config: PIIConfig, data: PreparedData, baseline, baseline_pii, log,
            baseline_cache: dict | None = None, baseline_losses: dict | None = None) -> dict:
    key = jax.random.fold_in(jax.random.key(config.seed), 1000)  # the same attack randomness for every variant
    bs = config.eval_batch_size
    out: dict[str, Any] = {"variant": name}
    t0 = time.perf_counter()
    scrubbed = name in ("scrubbed", "dp_scrubbed")
    # Evaluation text as the variant was trained: the scrubbed variants are evaluated on scrubbed text.
    train_texts = data.scrubbed if scrubbed else [r.text for r in data.train]
    test_texts = data.scrubbed_test if scrubbed else [r.text for r in data.test]
    out["evaluation_text"] = "scrubbed" if scrubbed else "raw"
    out["perplexity"] = perplexity(model, data.tokenizer, test_texts, bs)
    out["train_perplexity"] = perplexity(model, data.tokenizer, train_texts, bs)
    out["extraction"] = extraction_attack(model, data.tokenizer, data.train, config.extraction,
                                          jax.random.fold_in(key, 1), tagger=data.tagger, baseline_pii=baseline_pii,
                                          tagged_training=data.tagged_train_pii)
    head = _headline_extraction(out["extraction"], config)
    log(f"{name}: extraction ({head['label']}, tagged training PII) precision {format_metric(head['precision'])}, "
        f"recall {format_metric(head['recall'])}")
    if config.lazy_slots:
        out["lazy_extraction"] = _lazy(model, data, out["extraction"]["samples"], config, jax.random.fold_in(key, 6))
    out["reconstruction"] = reconstruction_attack(model, data.tokenizer, data.train, config.reconstruction,
                                                  jax.random.fold_in(key, 2), tagger=data.tagger,
                                                  baseline_model=baseline)
    # Distractors: the training records' own PII of the label (inference_attack's default pool).
    out["inference"] = inference_attack(model, data.tokenizer, data.train, config.inference,
                                        jax.random.fold_in(key, 3), baseline_model=baseline,
                                        baseline_cache=baseline_cache)  # every variant plays the same sets
    rec, inf = out["reconstruction"], out["inference"]
    log(f"{name}: reconstruction {format_metric(rec['accuracy_excluding_baseline'])} excluding what the public "
        f"model gets right ({format_metric(rec['accuracy'])} raw), inference " + ", ".join(
            f"|C| = {g['n_candidates']}: {format_metric(g['accuracy_excluding_baseline'])} "
            f"({format_metric(g['accuracy'])} raw)" for g in inf["by_size"]))
    rng = np.random.default_rng([config.seed, 13])
    members = [train_texts[int(i)] for i in rng.choice(len(data.train), len(data.test), replace=False)]
    losses: dict = {}  # this variant's losses serve both attacks; the baseline's serve every variant
    out["mia"] = mia_attack(model, data.tokenizer, members, test_texts, jax.random.fold_in(key, 4),
                            fprs=config.mia_fprs, batch_size=bs, cache=losses)
    out["mia_reference"] = mia_attack(model, data.tokenizer, members, test_texts, jax.random.fold_in(key, 4),
                                      reference_model=baseline, fprs=config.mia_fprs, batch_size=bs,
                                      cache=losses, reference_cache=baseline_losses)
    audit_delta = report.delta_total if report.dp else config.audit.delta  # the claim's, sampler term included
    audit_cfg = dataclasses.replace(config.audit, delta=audit_delta)
    out["canary_audit"] = canary_audit(model, data.tokenizer, data.canaries, audit_cfg, jax.random.fold_in(key, 5))
    if config.exposure.enabled:  # the same measure, by the same function, as snapaudit finetune's card
        from snapaudit_jax.finetune.memorization import canary_exposure

        out["exposure"] = canary_exposure(model, data.tokenizer, data.canaries, key=jax.random.fold_in(key, 7),
                                          exact_limit=config.exposure.exact_limit,
                                          sample_size=config.exposure.samples).headline()
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
        "canary_exposure": to_json(out["exposure"]["median_inserted"]) if "exposure" in out else None,
        "epsilon_claimed": float(report.epsilon) if report.dp else None,
        "epsilon_audited": audited,
    }
    exposure = (f", canary exposure median {format_metric(out['exposure']['median_inserted'])} bits"
                if "exposure" in out else "")
    log(f"{name}: MIA AUC {out['mia']['auc']:.3f} (loss), {out['mia_reference']['auc']:.3f} (reference model), "
        f"audited epsilon {audited if audited is None else round(audited, 3)}{exposure}"
        f" ({time.perf_counter() - t0:.0f}s of attacks)")
    return out


def _headline_extraction(extraction: Mapping[str, Any], config: PIIConfig) -> dict:
    """Table III's figure: one label (PERSON), unique strings, the training PII as the tagger defines it."""
    label = headline_label(config)
    rates = extraction["tagged"]["per_label"].get(label) or {"precision": float("nan"), "recall": float("nan")}
    return {"label": label, **rates}


def _by_repetition(done: Mapping[str, Any], data: PreparedData) -> dict:
    """Reconstruction and inference accuracy by how many training records hold the true PII string.

    DP-SGD bounds what one record reveals; a string held by many records is a group of that size, so
    its leakage is not covered by the per-record guarantee. The strata separate the two.
    """
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


def _lazy(model, data: PreparedData, samples, config: PIIConfig, key) -> dict:
    """Lazy extractability (seed 003, Algorithm 4) of every training name from the extraction samples.

    ``expected_recall`` turns each estimate (the per-sample probability of generating the name) into the chance
    that ``N`` samples generate it at least once, ``1 - exp(-N * estimate)``, averaged over the names: the
    observed extraction recall's counterpart without the tagger's or the baseline's filtering.
    """
    names = sorted({normalize_pii(s.value) for r in data.train for s in r.spans if s.label == "PERSON"})
    res = lazy_extractability(model, data.tokenizer, [("PERSON", v) for v in names], samples, key,
                              tagger=data.tagger, max_slots=config.lazy_slots, batch_size=config.eval_batch_size)
    n = len(samples)
    est = np.array([it["estimate"] for it in res["items"]], np.float64)
    res["expected_recall"] = float(np.mean(-np.expm1(-n * est))) if est.size else None
    res["n_targets"] = len(names)
    return res


def _baseline_info(config: PIIConfig) -> dict:
    """What the public baseline model is, and how the variants start (``results_full.json``)."""
    m = config.model
    if m.pretrained:
        return {"model": m.base, "kind": "pretrained base, untouched",
                "variants": f"fine-tuned copies of the base ({m.method}"
                            + (f", rank {m.rank}, alpha {m.alpha:g}" if m.method == "lora" else "") + ")"}
    return {"model": "scratch", "kind": f"GPT-2 trained on {config.public_records} public records",
            "variants": "GPT-2 trained from one random initialisation"}


def _report_dict(report) -> dict:
    return to_json(report.to_dict() if hasattr(report, "to_dict") else dataclasses.asdict(report))


def fingerprint(config: PIIConfig) -> str:
    """The configuration's fingerprint in the run stamps of earlier versions (``{"version": 2, "config": ...}``).

    A folder stamped so with this configuration's fingerprint is resumed (and stamped anew,
    :func:`run_folder`); one of another fingerprint is refused.

    Args:
      config: the experiment.

    Returns:
      16 hex digits of the SHA-256 of the configuration's JSON (sorted keys).
    """
    return hashlib.sha256(json.dumps(_config_json(config), sort_keys=True).encode()).hexdigest()[:16]


def _config_json(config: PIIConfig) -> dict:
    return to_json(dataclasses.asdict(config))


def run_folder(config: PIIConfig, out_dir: str | os.PathLike) -> RunFolder:
    """The run folder ``out_dir`` as a run of ``config`` owns it: its stamp and its lock.

    The stamp records every key of the configuration file, defaults filled in (``run.eval_batch_size`` too:
    evaluation is recomputed in batches, not cached). A folder holds resume files only with a stamp
    (checkpoints carry no configuration of their own), so an unstamped one is adopted only when empty.

    Args:
      config: the experiment.
      out_dir: the run folder (it may not exist yet).

    Returns:
      The :class:`~snapaudit_jax.utils.run_folder.RunFolder` of command ``pii`` (resume files of version
      :data:`RESUME_VERSION`; the stamp of earlier versions with :func:`fingerprint` is recognised).
    """
    fields = [f.name for f in dataclasses.fields(config)]
    sections = [name for name in fields if dataclasses.is_dataclass(getattr(config, name))]
    table = {"run": {name: getattr(config, name) for name in fields if name not in sections},
             **{name: dataclasses.asdict(getattr(config, name)) for name in sections}}
    return RunFolder(out_dir, "pii", table, version=RESUME_VERSION, results=RESULT_FILES,
                     legacy={"version": RESUME_VERSION, "config": fingerprint(config)})


def _read_resume_json(path: str, what: str):
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError) as err:
        raise ConfigFileError(f"{path}: not a readable {what} ({err}); delete it (or choose another --out folder) "
                              "to recompute") from None


def _check_run_folder(out_dir: str) -> None:
    """Refuses, before any work and changing nothing, a run folder with corrupted resume files
    (``variants/*.json``); its stamp and lock are :func:`run_folder`'s."""
    if not os.path.isdir(out_dir):
        return
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
    """Trains the variants, runs every attack and writes the run folder (resuming from it).

    Args:
      config: the experiment (:func:`attacks.config.load_pii_config`).
      out_dir: the run folder (see the module docstring), owned by this run (:func:`run_folder`: stamped with
        the configuration, locked while the run writes it); finished trainings and attacks in it are not redone.
      progress: log progress to stderr.

    Returns:
      ``{"results": {variant: row of RESULT_KEYS}, "full": {variant: every attack's details}, "seconds"}``.

    Raises:
      ConfigFileError: ``out_dir`` holds a run of another configuration (naming the first differing key) or a
        corrupted resume file, or a data or config error of :func:`attacks.data.prepare_data`.
      InputError: ``out_dir`` is held by another live run, holds a run of another command, a corrupted stamp,
        or files without a stamp. All are raised before anything is written.
    """
    folder = run_folder(config, out_dir)
    folder.check()  # a folder of another configuration or held by a live run: before any work, nothing changed
    _check_run_folder(out_dir)  # a corrupted resume file: before any work
    log = RunLog(progress)
    t0 = time.perf_counter()
    data = prepare_data(config, log)  # every data/config error is raised before anything is written
    base = None
    if config.model.pretrained:  # its weights too: an unreadable file leaves no folder behind
        from snapaudit_jax.finetune.base import load_base

        base = load_base(config.model.base, allow_pickle=config.model.allow_pickle).module
    _check_noise_sampler(config, data, base)
    with folder.claim():  # the folder is made, locked and stamped only now
        return _pii(config, out_dir, data, base, log, t0)


def _check_noise_sampler(config: PIIConfig, data: PreparedData, base) -> None:
    """Refuses, before the folder is made, DP variants whose noise sampler would add over a tenth of delta
    (:func:`snapaudit_jax.dpsgd.noise.check_sampler_delta` at the target epsilon, naming ``training.delta``)."""
    if not any(name.startswith("dp") for name in config.variants):
        return
    from flax import nnx

    from snapaudit_jax.dpsgd.noise import check_sampler_delta, coordinates

    model, trainable = initial_model(config, data, base)
    delta = _dpsgd_config(config, True, len(data.train) + int(data.canaries.inserted.sum())).delta
    try:
        check_sampler_delta(config.training.epsilon, config.training.steps,
                            coordinates(nnx.state(model, trainable)), delta,
                            field="training.delta")
    except InputError as err:
        raise ConfigFileError(str(err)) from None


def _pii(config: PIIConfig, out_dir: str, data: PreparedData, base, log: RunLog, t0: float) -> dict:
    """:func:`run_pii` once its folder is claimed: the trainings, the attacks and the files."""
    if base is not None:  # the public baseline is the pretrained base itself, untouched
        baseline = base
        log(f"baseline: the pretrained base {config.model.base!r} (public; every variant fine-tunes a copy, "
            f"{config.model.method})")
    else:
        baseline, _ = train_variant("baseline", data.public.texts, False, config, data, out_dir, log)
    base_samples_path = os.path.join(out_dir, "variants", "baseline_pii.json")
    if os.path.exists(base_samples_path):
        with open(base_samples_path) as fh:
            baseline_pii = [tuple(x) for x in json.load(fh)]
    else:
        n_base = config.extraction.n_baseline_samples or config.extraction.n_samples
        samples = extraction_samples(baseline, data.tokenizer, n_base,
                          jax.random.fold_in(jax.random.fold_in(jax.random.key(config.seed), 1000), 99),
                          config.extraction)
        baseline_pii = sorted(tagged_pii(samples, data.tagger, config.extraction.labels))
        write_json(base_samples_path, [list(p) for p in baseline_pii])
    log(f"baseline: {len(baseline_pii)} distinct PII strings in its samples (not counted as leaked)")

    results, full = {}, {}
    baseline_rankings: dict = {}  # the baseline ranks the same inference sets for every variant: once
    baseline_losses: dict = {}  # and scores the same membership records (scrubbed or raw) once
    for name in config.variants:
        path = os.path.join(out_dir, "variants", f"{name}.json")
        if os.path.exists(path):
            with open(path) as fh:
                done = json.load(fh)
            log(f"{name}: attacks already done (resumed from {path})")
        else:
            scrubbed = name in ("scrubbed", "dp_scrubbed")
            texts = insert_canaries(data.scrubbed if scrubbed else [r.text for r in data.train], data.canaries)
            model, report = train_variant(name, texts, name.startswith("dp"), config, data, out_dir, log, base)
            done = to_json(_attack(name, model, report, config, data, baseline, baseline_pii, log,
                                   baseline_rankings, baseline_losses))
            write_json(path, done)
        results[name] = done["row"]
        full[name] = {k: v for k, v in done.items() if k != "row"}
        full[name]["by_repetition"] = _by_repetition(done, data)

    goals = compare_variants(results)
    if goals is not None:
        log("DP against undefended: " + format_goals(goals))
    seconds = time.perf_counter() - t0
    write_json(os.path.join(out_dir, "results.json"), results)
    write_json(os.path.join(out_dir, "results_full.json"),
               {"variants": full, "tagger": to_json(data.tagger_quality), "seconds": seconds, "goals": goals,
                "baseline": _baseline_info(config),
                "corpus": {"train_records": len(data.train), "test_records": len(data.test),
                           "public_records": len(data.public.records) if data.public is not None else None,
                           "canaries_inserted": int(data.canaries.inserted.sum()),
                           "canaries_held_out": int((~data.canaries.inserted).sum())}})
    write_json(os.path.join(out_dir, "config.json"), _config_json(config))
    write_text(os.path.join(out_dir, "table.md"), format_table(results, full, config, data.tagger_quality))
    plot_leakage(os.path.join(out_dir, "leakage.png"), results, log)
    log(f"done in {seconds:.0f}s -> {out_dir}")
    return {"results": results, "full": full, "seconds": seconds}
