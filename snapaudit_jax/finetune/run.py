"""``snapaudit finetune``: DP fine-tuning of a pretrained model on a user's records, beside its non-private twin.

:func:`prepare` checks everything that needs the data and the model before any training: the units (records or
users), ``q``, the default ``delta = 1 / (10 N)`` (a ``delta >= 1 / N`` is refused unless asked for), sigma
calibrated to the target (PLD by default, RDP beside it), the LoRA rank against the projections' widths.
:func:`plan` prints the accountant's plan and a measured step time without training. :func:`run_finetune`
trains the private model and the baseline (same data, model, steps, Poisson batches and seed, clipping and noise
off), evaluates both on the held-out part, measures memorization on the canaries, exports the models, and writes
the report card (:mod:`snapaudit_jax.finetune.report`). The run folder resumes: finished trainings are
checkpoints, finished evaluations are JSON files.

Run folder::

    run.json, run.lock          the configuration stamp and the run's lock
    checkpoints/run_key.json    the secret key of the batches, the noise and (random stopping) the sweep's runs
                                (mode 0600; absent with [run] noise_seed): private state, never release it
    checkpoints/<model>/        DP-SGD checkpoints (resume after a kill); sweep_<j>/ for the runs of a [sweep];
                                private state (their optimizer state replays the noise)
    evaluations/<model>.json    held-out perplexity and canary results of each model; sweep_<j>.json: a run's
                                validation loss
    sweep.json                  with a [sweep]: every run, its candidate and validation loss, the selection and
                                the search's accounting (with random stopping, keep it private: see the report)
    export/private/             the private model as a Hugging Face folder (LoRA merged)
    export/private_adapter/     its LoRA adapter as a PEFT folder (with export/base/ when the base is a GGUF file)
    report.json, report.md      the report card
"""

from __future__ import annotations

import dataclasses
import json
import os
import resource
import tempfile
import time
from typing import Any

import jax
import numpy as np
from flax import nnx

from snapaudit_jax.dpsgd import DPSGDConfig, loss_summary, train
from snapaudit_jax.dpsgd.accounting import compute_epsilon
from snapaudit_jax.dpsgd.keys import RANDOMNESS, resolve_run_key
from snapaudit_jax.dpsgd.noise import check_sampler_delta, coordinates
from snapaudit_jax.dpsgd.sampling import inclusion_threshold
from snapaudit_jax.dpsgd.tuning import expected_noisy_steps
from snapaudit_jax.finetune.base import base_header, check_lora, check_training_fits, fresh_copy, load_base
from snapaudit_jax.finetune.config import FinetuneConfig
from snapaudit_jax.finetune.data import FinetuneData, pack_records, pack_units, prepare_data
from snapaudit_jax.finetune.lora import TRAINABLE, LoRAConfig
from snapaudit_jax.finetune.synthetic import generated
from snapaudit_jax.utils.config import ConfigFileError
from snapaudit_jax.utils.errors import InputError
from snapaudit_jax.utils.files import sha256_file
from snapaudit_jax.utils.io import to_json, write_json
from snapaudit_jax.utils.memory import format_bytes
from snapaudit_jax.utils.progress import RunLog
from snapaudit_jax.utils.run_folder import RunFolder

__all__ = ["Prepared", "prepare", "plan", "run_finetune", "run_folder", "RESULT_FILES", "RESUME_VERSION"]

RESULT_FILES = ("report.json", "report.md")
RESUME_VERSION = 4  # 2: the batches and noise come from the run's secret key (checkpoints/run_key.json); 3: user ids
# compared in canonical form (finetune.data.canonical_user: the keyed splits of integer ids changed); 4: DP-LoRA
# clips by book-keeping by default (finetune.clipping; another float32 summation order)
_TRAIN_STREAM, _SWEEP_STREAM, _PLAN_STREAM = 11, 17, 19  # and base.LORA_STREAM = 7


@dataclasses.dataclass(frozen=True)
class Prepared:
    """What a run needs once every check passed.

    Attributes:
      config: the run.
      lm: the loaded base (:class:`~snapaudit_jax.models.lm.LanguageModel`).
      data: the units, held-out records and canaries.
      dataset: ``(tokens, mask)`` of the training units (``(N, L)``, or ``(N, k, L)`` per user).
      held_out: ``(tokens, mask)`` of the held-out records.
      delta: the guarantee's ``delta`` (given or ``1 / (10 N)``).
      noise_multiplier: sigma (given or calibrated).
      calibration: how sigma was found (target, accountant, achieved epsilons, margin), or ``None``.
      lora: the adapters' configuration (``None`` for full fine-tuning).
      validation: with a ``[sweep]``, ``(tokens, mask)`` of the validation records that score the candidates.
      sweep: with a ``[sweep]``, ``{"candidates", "rule", "distribution", "accounting"}``: the grid, the rule, the
        distribution of ``K`` (random stopping) and the :class:`~snapaudit_jax.dpsgd.tuning.SweepAccounting` of
        the whole search at ``noise_multiplier``.
      trainable_parameters: the coordinates the noise is added to.
      sampler_delta: what the noise sampler's tails add to ``delta`` at the released model's epsilon over its noisy
        steps (:func:`~snapaudit_jax.dpsgd.noise.check_sampler_delta`, refused above a tenth of ``delta``).
    """

    config: FinetuneConfig
    lm: Any
    data: FinetuneData
    dataset: tuple[np.ndarray, np.ndarray]
    held_out: tuple[np.ndarray, np.ndarray]
    delta: float
    noise_multiplier: float
    calibration: dict[str, Any] | None
    lora: LoRAConfig | None
    validation: tuple[np.ndarray, np.ndarray] | None = None
    sweep: dict[str, Any] | None = None
    trainable_parameters: int = 0
    sampler_delta: float = 0.0

    @property
    def sampling_rate(self) -> float:
        """``q = batch_size / N``."""
        return self.config.finetune.batch_size / self.data.num_units

    @property
    def randomness(self) -> str:
        """``"seed"`` with ``[run] noise_seed``, else ``"secret"``."""
        return "secret" if self.config.noise_seed is None else "seed"

    def dpsgd_config(self, private: bool, *, learning_rate=None, clip_norm=None, steps=None,
                     noise_multiplier=None) -> DPSGDConfig:
        """The :class:`~snapaudit_jax.dpsgd.DPSGDConfig` of the private model (or of the baseline).

        Args:
          private: clipping and noise on (else the non-private twin: same steps, batches and seed).
          learning_rate: overrides ``finetune.learning_rate``.
          clip_norm: overrides ``privacy.clip_norm``.
          steps: overrides ``finetune.steps``.
          noise_multiplier: overrides the prepared sigma.

        Returns:
          The configuration.
        """
        ft, privacy = self.config.finetune, self.config.privacy
        common = dict(
            steps=steps or ft.steps, learning_rate=learning_rate or ft.learning_rate, sampling_rate=self.sampling_rate,
            optimizer=ft.optimizer, weight_decay=ft.weight_decay, microbatch_size=ft.microbatch_size or None,
            clipping=ft.clipping, clipped_sum_dtype=ft.clipped_sum_dtype, layers=ft.layers,
            vocab_chunk=ft.vocab_chunk or None,
            seed=self.config.noise_seed, accountant=privacy.accountant,
        )
        if not private:
            return DPSGDConfig(non_private=True, delta=self.delta, **common)
        return DPSGDConfig(clip_norm=clip_norm or privacy.clip_norm,
                           noise_multiplier=noise_multiplier or self.noise_multiplier, delta=self.delta, **common)


def _resolve_delta(config: FinetuneConfig, n: int) -> float:
    privacy = config.privacy
    if privacy.delta == 0:
        return 1.0 / (10.0 * n)
    if privacy.delta >= 1.0 / n and not privacy.allow_large_delta:
        raise ConfigFileError(
            f"privacy.delta: must be below 1 / N = {1.0 / n:.3g} for N = {n} {config.privacy.unit}s (a delta of "
            f"1 / N allows releasing one {config.privacy.unit} outright), got {privacy.delta}; lower it, leave it "
            "0 for 1 / (10 N), or set privacy.allow_large_delta = true")
    return float(privacy.delta)


def _calibrate(config: FinetuneConfig, q: float, delta: float) -> tuple[float, dict[str, Any] | None]:
    """sigma for the target epsilon (PLD by default), with the other accountant's epsilon beside it."""
    from snapaudit_jax.dpsgd import accounting

    privacy, steps = config.privacy, config.finetune.steps
    if privacy.noise_multiplier:
        return float(privacy.noise_multiplier), None
    try:
        cal = accounting.calibrate(target_epsilon=privacy.target_epsilon, delta=delta, sampling_rate=q, steps=steps,
                                   accountant=privacy.accountant)
    except InputError as err:
        raise ConfigFileError(f"privacy.target_epsilon: {err}") from None
    info = {"target_epsilon": privacy.target_epsilon, **to_json(cal._asdict())}
    return float(cal.noise_multiplier), info


def _sweep_plan(config: FinetuneConfig, q: float, delta: float) -> tuple[float, dict[str, Any] | None, dict]:
    """sigma of every candidate of the ``[sweep]`` and the search's accounting (calibrated to the target, or at the
    given sigma)."""
    from snapaudit_jax.dpsgd import tuning

    sweep, privacy = config.sweep, config.privacy
    candidates = sweep.candidates(config.finetune, privacy)
    params: dict[str, Any] = {}
    distribution = None
    if sweep.rule == "random_stopping":
        mean = sweep.mean_runs or max(2.0, float(len(candidates)))
        try:
            distribution = tuning.TruncatedNegativeBinomial.with_mean(sweep.eta, mean)
        except InputError as err:
            raise ConfigFileError(f"sweep.mean_runs: {err}") from None
        params["distribution"] = distribution
    runs = [(q, c["steps"]) for c in candidates]
    try:
        if privacy.noise_multiplier:
            sigma = float(privacy.noise_multiplier)
            accounting = tuning.account_sweep([(sigma, q, t) for q, t in runs], delta, sweep.rule,
                                              unit=privacy.unit, **params)
            info = None
        else:
            sigma, accounting = tuning.calibrate_sweep(privacy.target_epsilon, delta, runs, sweep.rule,
                                                       unit=privacy.unit, **params)
            info = {"target_epsilon": privacy.target_epsilon, "accountant": f"sweep ({sweep.rule})",
                    "epsilon": accounting.epsilon,
                    "margin": (privacy.target_epsilon - accounting.epsilon) / privacy.target_epsilon,
                    "noise_multiplier": sigma}
    except InputError as err:
        raise ConfigFileError(f"privacy.target_epsilon: {err}") from None
    return sigma, info, {"candidates": candidates, "rule": sweep.rule, "distribution": distribution,
                         "accounting": accounting}


def prepare(config: FinetuneConfig, log=None) -> Prepared:
    """Reads the data and the base's header, makes every check, then loads the weights; trains nothing.

    The order is the checks' order: the tokenizer and architecture (``model.base``), the LoRA rank and targets,
    the memory the training needs, the data (``data.*``), the batch, ``delta`` and sigma
    (``finetune.batch_size``, ``privacy.*``); only then are the weights loaded.

    Args:
      config: the run.
      log: optional progress printer.

    Returns:
      The :class:`Prepared` run.

    Raises:
      ConfigFileError: a model that cannot be read (``model.base``), a LoRA rank or target the model does not have
        (``finetune.rank`` / ``finetune.targets``), a model too large for this machine's memory
        (``finetune.method``), data errors (``data.*``), an expected batch above ``N`` (``finetune.batch_size``), a
        ``delta`` at or above ``1 / N`` (``privacy.delta``), an unreachable target epsilon
        (``privacy.target_epsilon``), or a noise sampler that would add over a tenth of ``delta``
        (``privacy.delta``).
    """
    log = log or (lambda message: None)
    if config.finetune.devices > len(jax.local_devices()):
        raise ConfigFileError(f"finetune.devices: this process has {len(jax.local_devices())} local devices "
                              f"({jax.default_backend()}), got {config.finetune.devices}")
    tokenizer, cfg = base_header(config.model.base)
    lora = None
    if config.finetune.method == "lora":
        lora = check_lora(cfg, rank=config.finetune.rank, alpha=config.finetune.alpha,
                          targets=config.finetune.targets, section="finetune")
    check_training_fits(cfg, method=config.finetune.method, optimizer=config.finetune.optimizer,
                        field="finetune.method")
    data = prepare_data(config, tokenizer)
    n = data.num_units
    if config.finetune.batch_size > n:
        raise ConfigFileError(f"finetune.batch_size: the expected batch must be <= N = {n} units, got "
                              f"{config.finetune.batch_size}")
    q = config.finetune.batch_size / n
    inclusion_threshold(q)
    delta = _resolve_delta(config, n)
    sweep = None
    if config.sweep is not None:
        sigma, calibration, sweep = _sweep_plan(config, q, delta)
    else:
        sigma, calibration = _calibrate(config, q, delta)
    log(f"data: {n} training units ({data.stats['train_records']} records, {data.stats['records_truncated']} "
        f"truncated), {data.stats['held_out_records']} held out; q = {q:.4g}, sigma = {sigma:.4g}, delta = {delta:.3g}")
    dataset = pack_units(data.train_units, user_level=config.privacy.unit == "user")
    held_out = pack_records(data.held_out)
    validation = pack_records(data.validation) if data.validation else None
    lm = load_base(config.model.base, allow_pickle=config.model.allow_pickle)
    prep = Prepared(config, lm, data, dataset, held_out, delta, sigma, calibration, lora, validation, sweep)
    trainable = coordinates(nnx.state(_build_model(prep), _trainable(prep)))
    try:
        added = check_sampler_delta(*_noisy_run(prep), trainable, delta, field="privacy.delta")
    except InputError as err:
        raise ConfigFileError(str(err)) from None
    return dataclasses.replace(prep, trainable_parameters=trainable, sampler_delta=added)


def _noisy_run(prep: Prepared) -> tuple[float, float]:
    """``(epsilon, noisy steps)`` of the released model, for the noise sampler's term.

    The sweep's epsilon over its (expected) steps; else the target's (the calibrated one is at most that) or, for
    a given sigma, RDP's for every step (at least the reported one, the smaller of two accountants; as
    :func:`snapaudit_jax.dpsgd.train` checks it).
    """
    config = prep.config
    if prep.sweep is not None:
        acc = prep.sweep["accounting"]
        return acc.epsilon, expected_noisy_steps(prep.sweep["rule"], acc.runs,
                                                 [c["steps"] for c in prep.sweep["candidates"]])
    if config.privacy.target_epsilon > 0:
        return config.privacy.target_epsilon, float(config.finetune.steps)
    steps = config.finetune.steps
    return compute_epsilon(noise_multiplier=prep.noise_multiplier, sampling_rate=prep.sampling_rate, steps=steps,
                           delta=prep.delta, accountant="rdp"), float(steps)


def _build_model(prep: Prepared):
    """A fresh copy of the base (sharing its arrays), with the run's LoRA adapters when ``method = "lora"``."""
    return fresh_copy(prep.lm.module, prep.lora, seed=prep.config.seed)


def _trainable(prep: Prepared):
    return TRAINABLE if prep.lora is not None else nnx.Param


def _timed(fn, repeats: int = 2) -> tuple[float, float]:
    """``(first call, mean of the next calls)`` in seconds: the first compiles, the others are the steady cost."""
    began = time.perf_counter()
    jax.block_until_ready(fn())
    first = time.perf_counter() - began
    began = time.perf_counter()
    for _ in range(repeats):
        jax.block_until_ready(fn())
    return first, (time.perf_counter() - began) / repeats


def _canary_work(prep: Prepared) -> tuple[int, int, list[str]]:
    """What each model's memorization measurement scores: ``(continuations, forward passes, a sample of 512)``.

    Exposure scores the whole space when it is exact, else the sample and the canaries; the extraction's beam search
    (a space too large to score whole) scores every value of each group after each surviving beam, then the final
    beams. Every call scores a token tree (:meth:`~snapaudit_jax.models.LanguageModel.continuation_logprobs`), whose
    passes are counted here from the continuations' own tokens.
    """
    from snapaudit_jax.finetune.memorization import _space
    from snapaudit_jax.models.lm import _TREE_NODES, _Trie

    tokenizer, section, canaries = prep.lm.tokenizer, prep.config.canaries, prep.data.canaries
    space = _space(canaries)

    def passes(continuations):
        return len(_Trie([tokenizer.encode_continuation(c) for c in continuations]).chunks(_TREE_NODES))

    def spread(k):
        return [space.continuation(space.secret(i * (space.size // k) % space.size)) for i in range(k)]

    if space.size <= section.exact_limit:
        whole = [space.continuation(space.secret(i)) for i in range(space.size)]
        return len(whole), passes(whole), spread(512)
    exposure = spread(section.samples + len(canaries.canaries))
    count, total = len(exposure), passes(exposure)
    width = max(1, section.top_k)
    gap = space.template.split("{secret}")[0][len(space.prefix):]
    sizes = [4] * (space.digits // 4) + ([space.digits % 4] if space.digits % 4 else [])
    for j, size in enumerate(sizes):
        labels = [(gap if j == 0 else " ") + f"{v:0{size}d}" for v in range(10**size)]
        prompts = 1 if j == 0 else width
        count += prompts * len(labels)
        total += prompts * passes(labels)
    final = spread(width)
    return count + len(final), total + passes(final), spread(512)


def _phase_timing(prep: Prepared) -> dict[str, Any]:
    """The run's time on this machine, phase by phase, each from one measured step of its kind (after compiling).

    Kinds: one microbatch of the training step's clipped gradient sum, on the clipping path the run takes
    (:func:`~snapaudit_jax.dpsgd.resolve_clipping`) and with its microbatch size ``m``, every unit at the longest
    unit's length (a DP-SGD step runs ``E[ceil(K / m)]`` of them, ``K ~ Binomial(N, q)`` the Poisson batch's size,
    and the twin's step costs the same: same batches, same path); one evaluation batch of held-out records; the
    canary memorization measurement of the base model (exposure, extraction, one-run bound), once per model
    evaluated (:func:`_canary_work` counts the continuations and forward passes it scores). Each phase is its count
    of steps times the measured cost; compilation is counted once per kind (twice for training: the private and the
    twin's kernels; the canaries' is inside the base model's measurement, as in the run).
    """
    from snapaudit_jax.dpsgd import record_losses
    from snapaudit_jax.dpsgd.train import _check_sum_path, _path_clipped_sum, resolve_clipping, resolve_layers
    from snapaudit_jax.models.decoders import stack_layers
    from snapaudit_jax.models.flops import count_matmul_flops

    cfg = prep.config
    model = _build_model(prep)
    graphdef, params, rest = nnx.split(model, _trainable(prep), ...)
    tokens, mask = prep.dataset
    chunk = cfg.finetune.vocab_chunk or None
    path, reason = resolve_clipping(cfg.finetune.clipping, graphdef, params, rest, tokens[:1], mask[:1],
                                    vocab_chunk=chunk)
    dtype = cfg.finetune.clipped_sum_dtype
    _check_sum_path(dtype, path, reason)  # refused here as the run would refuse it
    layers, layers_reason = resolve_layers(cfg.finetune.layers, model, _trainable(prep))
    if layers == "scan":  # the step measured in the layout the run trains in
        graphdef, params, rest = nnx.split(stack_layers(model), _trainable(prep), ...)
    dp_config = prep.dpsgd_config(False)
    size = dp_config.microbatch_for(prep.data.num_units, clipping=path)
    tail = dp_config.tail_for(prep.data.num_units, size)
    longest = int(np.argmax((mask.reshape(mask.shape[0], -1) > 0).sum(axis=1)))
    # The frozen weights are an argument, not a closure: captured, XLA would constant-fold them (seconds of
    # compilation and its "constant folding is taking > 1s ... file a bug" alarm), and the run's step does not.
    fn = jax.jit(lambda p, r, t, m, pad: _path_clipped_sum(path, graphdef, p, r, t, m, pad, 1.0, vocab_chunk=chunk,
                                                           sum_dtype=dtype).grad_sum)

    def measure(units):
        """(compile seconds, seconds a call, compiled plan, matrix-product operations) of one microbatch of
        ``units`` longest units (every unit is computed at the dataset's padded length, whatever its own)."""
        t = jax.numpy.asarray(np.repeat(tokens[longest:longest + 1], units, axis=0))
        m = jax.numpy.asarray(np.repeat(mask[longest:longest + 1], units, axis=0))
        padding = jax.numpy.zeros(units, bool)
        began = time.perf_counter()
        compiled = fn.lower(params, rest, t, m, padding).compile()
        lowering = time.perf_counter() - began
        compile_s, seconds = _timed(lambda: compiled(params, rest, t, m, padding))
        return compile_s + lowering, seconds, compiled, count_matmul_flops(fn, params, rest, t, m, padding)

    compile_train, per_microbatch, compiled, counted = measure(size)
    flops_microbatch = counted.total
    # the share a GPU runs without its tensor cores (full float32 precision: the fast paths' norms and sums)
    full_precision = sum(v for k, v in counted.by_operands.items() if k.endswith("@highest")) / max(1, counted.total)
    analysis = compiled.memory_analysis()  # XLA's plan of the microbatch (None where a backend has none)
    trainable = prep.trainable_parameters
    batch = prep.sampling_rate * prep.data.num_units
    microbatches, tails = _expected_microbatches(prep.data.num_units, prep.sampling_rate, size, tail)
    per_tail, flops_tail = 0.0, 0
    if tail < size:  # the step compiles and runs the remainder's smaller microbatch too
        compile_tail, per_tail, _, counted = measure(tail)
        flops_tail = counted.total
        compile_train += compile_tail
    per_step = per_microbatch * microbatches + per_tail * tails
    flops_step = flops_microbatch * microbatches + flops_tail * tails
    if prep.sweep is None:
        private_steps = baseline_steps = cfg.finetune.steps
    else:
        steps = [c["steps"] for c in prep.sweep["candidates"]]
        private_steps = prep.sweep["accounting"].runs * sum(steps) / len(steps)  # expected, over the runs
        baseline_steps = max(steps)
    bs = cfg.eval_batch_size
    held_tokens, held_mask = prep.held_out
    rows = (held_tokens[:bs], held_mask[:bs])
    compile_eval, per_batch = _timed(lambda: record_losses(prep.lm.module, rows, batch_size=bs, vocab_chunk=chunk),
                                     repeats=1)
    models = 2 + bool(cfg.baseline)  # base, private, baseline: each evaluated (and its canaries scored)
    phases = {"private_training": per_step * private_steps}
    if cfg.baseline:
        phases["baseline_training"] = per_step * baseline_steps
    training_steps = private_steps + (baseline_steps if cfg.baseline else 0)
    phases["evaluations"] = per_batch * -(-len(prep.data.held_out) // bs) * models
    if prep.sweep is not None:
        runs = prep.sweep["accounting"].runs
        phases["sweep_validation"] = per_batch * -(-len(prep.data.validation) // bs) * runs
    measured = {"clipping": path, "clipping_reason": reason, "layers": layers, "layers_reason": layers_reason,
                "microbatch_size": size, "tail_microbatch_size": tail, "tail_microbatches_per_step": tails,
                "seconds_per_tail_microbatch": per_tail,
                "microbatches_per_step": microbatches, "seconds_per_microbatch": per_microbatch,
                "seconds_per_unit": per_microbatch / size, "seconds_per_eval_batch": per_batch,
                # the step's matrix products (models.flops, from the jaxpr): the same on every backend
                "matmul_flops_per_microbatch": flops_microbatch, "matmul_flops_per_tail_microbatch": flops_tail,
                "matmul_tflop_per_step": flops_step / 1e12,
                "matmul_pflop_training": flops_step * training_steps / 1e15,
                "achieved_tflop_per_s": flops_microbatch / per_microbatch / 1e12,
                "matmul_share_full_float32_precision": full_precision,
                "vocab_chunk": chunk,
                # the whole logits of a microbatch and their cotangent (float32): what vocab_chunk leaves out
                "logits_bytes": 2 * 4 * size * tokens.shape[-1] * (tokens.shape[1] if tokens.ndim == 3 else 1)
                * _vocab(prep)}
    if analysis is not None:
        measured["microbatch_compiled_bytes"] = int(analysis.temp_size_in_bytes + analysis.argument_size_in_bytes
                                                    + analysis.output_size_in_bytes)
    if prep.data.canaries is not None:
        count, passes, _ = _canary_work(prep)
        began = time.perf_counter()
        _memorization(prep.lm.module, prep)  # the base model's measurement, as the run does it first
        one = time.perf_counter() - began
        measured["seconds_canary_memorization_base"] = one
        measured["canary_continuations_per_model"] = count
        measured["canary_passes_per_model"] = passes
        phases["canary_memorization"] = one * models  # the first model's time includes the scoring's compilation
    if cfg.export.hf:
        # One Hugging Face folder of the base model (public weights; a merged private export costs the same),
        # written into a temporary folder and deleted: each full folder the run exports costs this much.
        from snapaudit_jax.finetune.export import write_hf_folder

        with tempfile.TemporaryDirectory(prefix="snapaudit-plan-export-") as scratch:
            began = time.perf_counter()
            write_hf_folder(prep.lm.module, prep.lm.tokenizer, os.path.join(scratch, "base"),
                            source=cfg.model.base)
            folder = time.perf_counter() - began
        base = cfg.model.base
        folders = 1 + bool(prep.lora is not None and cfg.export.peft and (base == "smollm2" or base.endswith(".gguf")))
        measured["seconds_per_export_folder"] = folder
        phases["export"] = folder * folders
    phases["compilation"] = 2 * compile_train + compile_eval
    return {**measured, "expected_batch": batch, "seconds_per_step": per_step, "phases": phases,
            "seconds_total": sum(phases.values()), "trainable_parameters": trainable,
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


def _vocab(prep: Prepared) -> int:
    """The base's vocabulary size (the LM head's rows)."""
    return int(prep.lm.module.cfg.vocab_size)


def _expected_microbatches(units: int, rate: float, size: int, tail: int | None = None) -> tuple[float, float]:
    """The microbatches a Poisson step runs, ``K ~ Binomial(units, rate)``: the expected calls of ``m = size``
    units and of ``t = tail`` units (:func:`~snapaudit_jax.dpsgd.sampling.microbatch_calls`; ``t = None`` or
    ``m``: ``(E[ceil(K / m)], 0)``)."""
    from scipy import stats

    from snapaudit_jax.dpsgd.sampling import microbatch_calls

    k = np.arange(units + 1)
    p = stats.binom.pmf(k, units, rate)
    full, rest = microbatch_calls(k, size, size if tail is None else tail)
    return float(np.sum(p * full)), float(np.sum(p * rest))


def plan_dict(prep: Prepared, *, timing: bool = True) -> dict[str, Any]:
    """The accountant's plan of a prepared run (trains nothing).

    Args:
      prep: the prepared run.
      timing: measure a step of each kind on this machine and estimate each phase's time.

    Returns:
      ``{"units", "unit", "sampling_rate", "expected_batch", "steps", "noise_multiplier", "delta",
      "epsilon_pld", "epsilon_rdp", "calibration", "parameters", "trainable_parameters", "sampler_delta",
      "memory", "timing"}`` (the last two with ``timing``; ``sampler_delta``: what the noise sampler's tails add
      to ``delta``, :attr:`Prepared.sampler_delta`).
    """
    cfg = prep.config
    q, steps, sigma = prep.sampling_rate, cfg.finetune.steps, prep.noise_multiplier
    if prep.sweep is not None:
        acc = prep.sweep["accounting"]
        eps = {"pld": acc.epsilon_pld, "rdp": acc.epsilon_rdp}
    else:
        eps = {name: compute_epsilon(noise_multiplier=sigma, sampling_rate=q, steps=steps, delta=prep.delta,
                                     accountant=name) for name in ("pld", "rdp")}
    total = coordinates(nnx.state(prep.lm.module, nnx.Param))
    out = {
        "units": prep.data.num_units, "unit": cfg.privacy.unit, "sampling": "poisson", "sampling_rate": q,
        "expected_batch": q * prep.data.num_units, "steps": steps, "clip_norm": cfg.privacy.clip_norm,
        "noise_multiplier": sigma, "delta": prep.delta, "epsilon_pld": eps["pld"], "epsilon_rdp": eps["rdp"],
        "calibration": prep.calibration, "data": prep.data.stats, "method": cfg.finetune.method,
        "parameters": total, "trainable_parameters": prep.trainable_parameters,
        "sampler_delta": prep.sampler_delta,
    }
    if prep.sweep is not None:
        acc = prep.sweep["accounting"]
        out["sweep"] = {"rule": prep.sweep["rule"], "candidates": list(prep.sweep["candidates"]),
                        "expected_runs": acc.runs, "epsilon": acc.epsilon,
                        "candidate_epsilons": list(acc.candidate_epsilons), "covered": acc.covered,
                        "not_covered": list(acc.not_covered)}
        out["steps"] = max(c["steps"] for c in prep.sweep["candidates"])
    if timing:
        t = _phase_timing(prep)
        out["timing"] = t
        trainable = t["trainable_parameters"]
        moments = 2 if cfg.finetune.optimizer != "sgd" else 0
        out["memory"] = {"parameters_bytes": 4 * total, "trainable_state_bytes": 4 * trainable * (2 + moments),
                         "peak_rss_bytes_measured": t["peak_rss_bytes"]}
        if "microbatch_compiled_bytes" in t:
            out["memory"]["microbatch_compiled_bytes"] = t["microbatch_compiled_bytes"]
    return to_json(out)


def format_plan(info: dict[str, Any]) -> str:
    """The plan as the lines ``snapaudit finetune --plan`` prints.

    Args:
      info: :func:`plan_dict`'s dictionary.

    Returns:
      The text.
    """
    cal = info.get("calibration")
    data = info["data"]
    lines = [
        f"units N = {info['units']} ({info['unit']}s; {data['train_records']} training records, "
        f"{data['records_truncated']} truncated to {data['max_length']} tokens)",
        f"Poisson sampling q = {info['sampling_rate']:.6g}, expected batch {info['expected_batch']:.4g}, "
        f"{info['steps']} steps, clip C = {info['clip_norm']:g}",
        f"noise multiplier sigma = {info['noise_multiplier']:.6g}"
        + (f" (calibrated to epsilon {cal['target_epsilon']:g} with {cal['accountant']}; margin "
           f"{100 * cal['margin']:.2f}% below the target)" if cal else " (given)"),
    ]
    if data.get("users") is not None:
        lines.append(f"users: {data['users']}; {data['users_capped']} capped at {data['max_records_per_user']} "
                     f"records, which drops {data['records_dropped_by_cap']} of the {data['records_read']} records "
                     f"read ({100 * data['records_dropped_by_cap'] / max(1, data['records_read']):.0f}%)")
        if data.get("users_with_several_spellings"):
            lines.append(f"user ids: {data['users_with_several_spellings']} users appear under several spellings, "
                         f"each merged into one unit ({data['user_id_rule']})")
    if data.get("held_out_records_left_out_as_overlapping"):
        lines.append(f"held-out file: {data['held_out_records_left_out_as_overlapping']} records shared with the "
                     "training data left out of the held-out part (data.allow_held_out_overlap)")
    if data.get("train_on") == "assistant turns":
        lines.append(f"chat records trained on their answers only; unusable and left out: "
                     f"{data['records_without_answer']} without an answer, {data['records_answer_cut']} whose "
                     f"first answer does not fit {data['max_length']} tokens")
    sweep = info.get("sweep")
    if sweep:
        pld = "" if info["epsilon_pld"] is None else f"{info['epsilon_pld']:.4f} (PLD), "
        lines[2] = lines[2].replace("noise multiplier sigma", "noise multiplier sigma of every candidate")
        lines += [
            f"sweep: {len(sweep['candidates'])} candidates, rule {sweep['rule']}, {sweep['expected_runs']:.4g} "
            "runs" + (" expected" if sweep["rule"] == "random_stopping" else ""),
            *(f"  candidate {i}: learning rate {c['learning_rate']:g}, clip {c['clip_norm']:g}, {c['steps']} steps "
              f"(epsilon {e:.4f} alone)" for i, (c, e) in enumerate(zip(sweep["candidates"],
                                                                       sweep["candidate_epsilons"]))),
            f"epsilon of the released model (the whole sweep) at delta = {info['delta']:.3g}: {pld}"
            f"{info['epsilon_rdp']:.4f} (RDP)",
        ]
    else:
        lines.append(f"epsilon at delta = {info['delta']:.3g}: {info['epsilon_pld']:.4f} (PLD), "
                     f"{info['epsilon_rdp']:.4f} (RDP)")
    lines.append(f"noise: exact to float32 rounding but with probability 2^-71 a coordinate; its sampler adds "
                 f"{info['sampler_delta']:.2g} to delta over {info['trainable_parameters']:,} trainable parameters "
                 "(snapaudit_jax.dpsgd.noise)")
    if "timing" in info:
        t, mem = info["timing"], info["memory"]
        lines += [
            f"{info['method']} fine-tuning: {t['trainable_parameters']:,} of {info['parameters']:,} parameters train",
            f"clipping: {t['clipping'].replace('_', '-')} ({t['clipping_reason']}), {t['microbatch_size']} units a "
            f"microbatch, {t['microbatches_per_step']:.3g} microbatches a step on average"
            + (f" and {t['tail_microbatches_per_step']:.3g} of {t['tail_microbatch_size']} units (the remainder; "
               f"{t['seconds_per_tail_microbatch']:.3g} s each)" if t.get("tail_microbatches_per_step") else ""),
            f"layers: {t.get('layers', 'unrolled')} ({t.get('layers_reason', '')})",
            f"step time on this machine: {t['seconds_per_microbatch']:.3g} s a microbatch, about "
            f"{t['seconds_per_step']:.3g} s a step; the run, about {t['seconds_total'] / 60:.1f} min: "
            + ", ".join(f"{name.replace('_', ' ')} {sec / 60:.1f}" for name, sec in t["phases"].items())
            + " (min, each from one measured step of its kind)",
            f"matrix products: {t['matmul_tflop_per_step']:.3g} TFLOP a step, {t['matmul_pflop_training']:.3g} PFLOP "
            f"over the training steps ({t['achieved_tflop_per_s']:.3g} TFLOP/s on this machine; another device "
            "trains in about the PFLOP over its sustained rate), "
            f"{100 * t['matmul_share_full_float32_precision']:.0f}% of them at full float32 precision (which a GPU "
            "runs without its tensor cores)",
            f"memory: parameters {format_bytes(mem['parameters_bytes'])}, trainable state "
            f"{format_bytes(mem['trainable_state_bytes'])}, peak resident "
            f"{format_bytes(mem['peak_rss_bytes_measured'])} measured",
        ]
        if "microbatch_compiled_bytes" in mem:
            lines.append(
                f"memory of one microbatch's clipped gradient sum (XLA's analysis: temporaries, arguments, outputs): "
                f"{format_bytes(mem['microbatch_compiled_bytes'])}; "
                + (f"the LM head in slices of {t['vocab_chunk']} vocabulary rows (finetune.vocab_chunk)"
                   if t.get("vocab_chunk") else
                   f"its whole logits and their cotangent take {format_bytes(t['logits_bytes'])} "
                   "(finetune.vocab_chunk slices them)"))
    return "\n".join(lines)


def plan(config: FinetuneConfig) -> str:
    """``snapaudit finetune CONFIG --plan``: the accountant's plan and the step's measured cost; trains nothing.

    Args:
      config: the run.

    Returns:
      The plan's text.

    Raises:
      ConfigFileError: as :func:`prepare`.
    """
    return format_plan(plan_dict(prepare(config)))


def run_folder(config: FinetuneConfig, out_dir: str | os.PathLike) -> RunFolder:
    """The run folder ``out_dir`` as a run of ``config`` owns it (stamp and lock).

    Args:
      config: the run.
      out_dir: the folder.

    Returns:
      The :class:`~snapaudit_jax.utils.run_folder.RunFolder` of command ``finetune``.
    """
    table = config.to_table()
    if config.data.generate:  # the made corpus's digest (the same records for the same generator, size and seed)
        table["data"]["sha256"] = generated(config.data.generate, config.data.generate_units,
                                            config.data.generate_seed)[1]
    else:
        table["data"]["sha256"] = _file_digest(config.data.path, "data.path")
    if config.data.held_out_path:
        table["data"]["held_out_sha256"] = _file_digest(config.data.held_out_path, "data.held_out_path")
    return RunFolder(out_dir, "finetune", table, version=RESUME_VERSION, results=RESULT_FILES)


def _file_digest(path: str, field: str) -> str:
    """The data file's SHA-256 (the run folder's stamp), its type checked before it is opened."""
    return sha256_file(path, "data file", ConfigFileError, field=field)


def _root_key(prep: Prepared, out_dir: str) -> jax.Array:
    """The key of every training's batches and noise and of random stopping's runs: secret (drawn once into
    ``checkpoints/run_key.json``), or from ``[run] noise_seed``."""
    return resolve_run_key(None, prep.config.noise_seed, os.path.join(out_dir, "checkpoints"))[0]


def _train_one(name: str, prep: Prepared, private: bool, out_dir: str, log, *, candidate: dict | None = None,
               key: jax.Array | None = None) -> tuple[Any, dict, dict]:
    """Trains one model into ``checkpoints/<name>`` (resuming); ``candidate`` overrides the hyperparameters."""
    hyper = {} if candidate is None else {"learning_rate": candidate["learning_rate"],
                                          "clip_norm": candidate["clip_norm"], "steps": candidate["steps"]}
    config = prep.dpsgd_config(private, **hyper)
    model = _build_model(prep)
    unit = ("one user: all of the user's records (at most "
            f"{prep.config.privacy.max_records_per_user}, drawn before training), summed and clipped together"
            if prep.config.privacy.unit == "user" else "one record: one training sequence (truncated, never split)")

    what = "loss per user (summed over the user's records)" if prep.config.privacy.unit == "user" else "loss"

    def progress(info):
        log(f"{name}: step {info['step']}/{info['steps']}, {what} {info['loss']:.4f}, batch {info['batch_size']}")

    if key is None:
        key = jax.random.fold_in(_root_key(prep, out_dir), _TRAIN_STREAM)
    trained, history, report = train(
        model, prep.dataset, config, key=key,
        checkpoint_dir=os.path.join(out_dir, "checkpoints", name),
        checkpoint_every=prep.config.finetune.checkpoint_every, progress=progress,
        trainable=_trainable(prep), protected_unit=unit, mesh=prep.config.finetune.devices or None,
    )
    rep = report.to_dict()
    rep["randomness"] = RANDOMNESS[prep.randomness]
    if private and prep.calibration and prep.sweep is None:
        rep["target_epsilon"] = prep.calibration["target_epsilon"]
        rep["calibration_accountant"] = prep.calibration["accountant"]
    return trained, {k: np.asarray(v).tolist() for k, v in history.items()}, rep


def _run_sweep(prep: Prepared, out_dir: str, log) -> tuple[tuple[Any, dict, dict], dict[str, Any]]:
    """Trains the sweep's runs, scores each on the validation split, and returns the best with the sweep's record.

    Compose: run ``j`` is candidate ``j``. Random stopping: ``K`` and the runs' candidates come from
    :func:`~snapaudit_jax.dpsgd.tuning.draw_candidates` (data-independent, from the run's secret key: ``K`` must
    stay private). Run ``j`` trains with the key ``fold_in(fold_in(root, 17), j)`` (``root``: the run's secret
    key, or ``key(noise_seed)``) into ``checkpoints/sweep_<j>`` and is scored by its mean token loss on the
    validation records (``evaluations/sweep_<j>.json``); the lowest loss wins (the earliest run on a tie, a
    non-finite loss never wins). Only the best model is kept in memory.
    """
    from snapaudit_jax.dpsgd.tuning import draw_candidates

    sweep, cfg = prep.sweep, prep.config
    candidates = sweep["candidates"]
    if sweep["rule"] == "compose":
        plan = tuple(range(len(candidates)))
    else:
        plan = draw_candidates(jax.random.fold_in(_root_key(prep, out_dir), _PLAN_STREAM), sweep["distribution"],
                               len(candidates))
    root = jax.random.fold_in(_root_key(prep, out_dir), _SWEEP_STREAM)
    secret_count = sweep["rule"] == "random_stopping"
    if secret_count:  # K, the runs' candidates and scores stay in the run folder: no line per run
        log("sweep (random stopping): training the runs; their number, candidates and scores stay private "
            "(sweep.json in the run folder), so no line is printed per run")
    quiet = (lambda message: None) if secret_count else log  # noqa: E731
    best, best_loss, runs = None, float("inf"), []
    for j, c in enumerate(plan):
        name = f"sweep_{j}"
        quiet(f"sweep run {j + 1}/{len(plan)}: candidate {c} {candidates[c]}")
        trained = _train_one(name, prep, True, out_dir, quiet, candidate=candidates[c],
                             key=jax.random.fold_in(root, j))
        path = os.path.join(out_dir, "evaluations", f"{name}.json")
        if os.path.exists(path):
            with open(path) as fh:
                score = json.load(fh)
        else:
            summary = loss_summary(trained[0], prep.validation, batch_size=cfg.eval_batch_size,
                                   vocab_chunk=cfg.finetune.vocab_chunk or None)
            score = to_json({"run": j, "candidate": c, "validation": summary.to_dict()})
            write_json(path, score)
        loss = score["validation"]["token_loss"]
        loss = float("inf") if loss is None or not np.isfinite(loss) else float(loss)
        runs.append({"run": j, "candidate": c, **candidates[c], "validation_loss": loss,
                     "epsilon_alone": trained[2]["epsilon"]})
        quiet(f"sweep run {j + 1}/{len(plan)}: validation loss {loss:.4f}")
        if best is None or loss < best_loss:
            best, best_loss = (j, trained), loss
    selected, trained = best
    record = {"rule": sweep["rule"], "runs": runs, "selected_run": selected,
              "selected": dict(runs[selected]), "accounting": sweep["accounting"].to_dict()}
    return trained, record


def _evaluate(name: str, model, prep: Prepared, out_dir: str, log) -> dict[str, Any]:
    path = os.path.join(out_dir, "evaluations", f"{name}.json")
    if os.path.exists(path):
        with open(path) as fh:
            log(f"{name}: evaluation resumed from {path}")
            return json.load(fh)
    summary = loss_summary(model, prep.held_out, batch_size=prep.config.eval_batch_size,
                           vocab_chunk=prep.config.finetune.vocab_chunk or None)
    out: dict[str, Any] = {"held_out": summary.to_dict()}
    log(f"{name}: held-out perplexity {summary.token_perplexity:.3f}")
    if prep.data.canaries is not None:
        out["canaries"] = _memorization(model, prep)
        exp = out["canaries"]["exposure"]
        log(f"{name}: canary exposure of the inserted canaries median {exp['median_inserted']:.3g}, max "
            f"{exp['max_inserted']:.3g} bits (held-out controls median {exp['median_held_out']:.3g})")
    out = to_json(out)
    write_json(path, out)
    return out


def _memorization(model, prep: Prepared) -> dict[str, Any]:
    """Exposure, extraction and the one-run epsilon lower bound of a model on the run's canaries.

    Exposure rows use the exact rank where ``10**digits <= canaries.exact_limit`` and the skew-normal
    extrapolation beside it; the headline is the exact value where there is one. The one-run bound tests the
    canaries' coins (each inserted with probability 1/2) with their scores ``log P(secret | prefix)``.
    """
    from snapaudit_jax.finetune.memorization import (
        canaries_for_a_positive_bound,
        canary_exposure,
        canary_extraction,
        one_run_bound,
        one_run_ceiling,
    )

    section, canaries, tokenizer = prep.config.canaries, prep.data.canaries, prep.lm.tokenizer
    key = jax.random.fold_in(jax.random.key(prep.config.seed), 13)
    exposure = canary_exposure(model, tokenizer, canaries, key=key, exact_limit=section.exact_limit,
                               sample_size=section.samples)
    top_k = tuple(sorted({1, section.top_k}))
    extraction = canary_extraction(model, tokenizer, canaries, top_k=top_k, exact_limit=section.exact_limit,
                                   exposure=exposure)
    bounds = one_run_bound(exposure.scores, canaries, delta=prep.delta)
    one = bounds[min(bounds)]
    ceiling = one_run_ceiling(canaries, delta=prep.delta)[min(bounds)]
    needed = None if ceiling > 0 else canaries_for_a_positive_bound(delta=prep.delta, alpha=one.alpha)
    rates = extraction.rates()
    return {
        "exposure": exposure.headline(),
        "extraction": {
            "method": extraction.method, "greedy_inserted": rates["inserted"]["greedy"],
            f"top_{section.top_k}_inserted": rates["inserted"][f"top_{section.top_k}"],
            "rates": rates, "greedy_continuation": extraction.greedy_continuation,
        },
        "one_run": {"epsilon": one.epsilon, "delta": one.delta, "alpha": one.alpha, "confidence": 1.0 - one.alpha,
                    "canaries": one.canaries, "guarantees": one.guarantees,
                    "ceiling": ceiling, "canaries_for_a_positive_bound": needed,
                    "note": f"a {100 * (1 - one.alpha):.0f}% lower bound on the epsilon of the training run "
                            "(Steinke, Nasr, Jagielski 2023); ceiling: the bound if every coin were guessed right, "
                            "the most these canaries can show"},
    }


def run_finetune(config: FinetuneConfig, out_dir: str, *, progress: bool = True) -> dict[str, Any]:
    """Trains the private model and its baseline, evaluates, exports and writes the report card (resuming).

    Args:
      config: the run (:func:`~snapaudit_jax.finetune.config.load_finetune_config`).
      out_dir: the run folder (see the module docstring), owned by this run.
      progress: progress lines on stderr.

    Returns:
      The report card (``report.json``'s content).

    Raises:
      ConfigFileError: as :func:`prepare`, or ``out_dir`` holding a run of another configuration (before any work).
      InputError: ``out_dir`` held by another live run.

    Guarantees:
      The private model (``export/private``, its adapter, every checkpoint's parameters) is ``(epsilon, delta)``-DP
      for the configured unit under add/remove adjacency, with ``epsilon`` the report's accountant bound, under
      :func:`snapaudit_jax.dpsgd.train`'s assumptions: the batches and the noise come from a secret key drawn from
      the operating system's entropy (``checkpoints/run_key.json``; with ``[run] noise_seed``, from that seed, and
      the guarantee holds only while it stays secret). The key, the checkpoints' optimizer states (the noise
      generator's state) and, with random stopping, the number of runs are private state, never released. With
      a ``[sweep]``, ``epsilon`` is the whole search's (:func:`snapaudit_jax.dpsgd.tuning.account_sweep`, the
      rule the report names), the validation split held fixed; with ``compose`` it covers every run's
      checkpoints, with ``random_stopping`` only the released run (``sweep.json`` and the other runs' checkpoints
      stay private). The baseline, the held-out evaluations and
      the canary results are computed from the private data without noise: the report lists each as a non-private
      release.
    """
    from snapaudit_jax.finetune.report import build_report, write_report

    folder = run_folder(config, out_dir)
    folder.check()
    # With random stopping the run's duration depends on K, which must stay private: no times in the log or card.
    secret_count = config.sweep is not None and config.sweep.rule == "random_stopping"
    log = RunLog(progress, clock=not secret_count)
    began = time.perf_counter()
    prep = prepare(config, log)
    with folder.claim():
        models, sweep = {}, None
        if prep.sweep is None:
            models["private"] = _train_one("private", prep, True, out_dir, log)
        else:
            models["private"], sweep = _run_sweep(prep, out_dir, log)
            write_json(os.path.join(out_dir, "sweep.json"), sweep)
        if config.baseline:
            chosen = key = None
            if sweep is not None:  # the twin of the released run: its hyperparameters, batches and seed
                chosen = prep.sweep["candidates"][sweep["selected"]["candidate"]]
                key = jax.random.fold_in(jax.random.fold_in(_root_key(prep, out_dir), _SWEEP_STREAM),
                                         sweep["selected_run"])
            models["baseline"] = _train_one("baseline", prep, False, out_dir, log, candidate=chosen, key=key)
        evaluations = {"base": _evaluate("base", prep.lm.module, prep, out_dir, log)}
        for name, (model, _, _) in models.items():
            evaluations[name] = _evaluate(name, model, prep, out_dir, log)
        exports = _export(prep, models, out_dir, log)
        card = build_report(prep, {k: (h, r) for k, (_, h, r) in models.items()}, evaluations, exports,
                            seconds=None if secret_count else time.perf_counter() - began, sweep=sweep)
        write_report(out_dir, card)
    log(f"done -> {out_dir}" if secret_count else f"done in {time.perf_counter() - began:.0f}s -> {out_dir}")
    return card


def _export(prep: Prepared, models: dict, out_dir: str, log) -> dict[str, str]:
    if not prep.config.export.hf:
        return {}
    from snapaudit_jax.finetune.export import write_hf_folder, write_peft_adapter

    out: dict[str, str] = {}
    root = os.path.join(out_dir, "export")
    target = os.path.join(root, "private")
    if not os.path.isdir(target):
        write_hf_folder(models["private"][0], prep.lm.tokenizer, target, source=prep.config.model.base)
    out["private"] = target
    if prep.lora is not None and prep.config.export.peft:
        base = prep.config.model.base
        if base == "smollm2" or base.endswith(".gguf"):
            base = os.path.join(root, "base")
            if not os.path.isdir(base):
                write_hf_folder(prep.lm.module, prep.lm.tokenizer, base, source=prep.config.model.base)
            out["base"] = base
        adapter = os.path.join(root, "private_adapter")
        if not os.path.isdir(adapter):
            write_peft_adapter(models["private"][0], adapter, base_model_name_or_path=os.path.abspath(base))
        out["private_adapter"] = adapter
    log(f"exported: {', '.join(out.values())}")
    return out
