"""DP-SGD training of the Flax decoder models (GPT-2, Llama) with optax.

One step (Abadi et al. 2016, Alg. 1, with Poisson sampling as accounted):

1. Poisson batch: every record independently with probability ``q``
   (:func:`~snapaudit_jax.dpsgd.sampling.poisson_batch`, key ``fold_in(fold_in(key, 0), step)``);
2. per-record gradients of :func:`~snapaudit_jax.dpsgd.gradients.sequence_losses`, each clipped to
   L2 norm ``C`` and summed, over microbatches of ``m`` units and the rest in microbatches of ``t <= m``
   (:func:`~snapaudit_jax.dpsgd.sampling.microbatch_calls`), the last padded (no truncation, see
   :mod:`~snapaudit_jax.dpsgd.sampling`; ``m`` and ``t`` are ``DPSGDConfig.microbatch_for`` and ``tail_for``).
   ``DPSGDConfig.clipping`` picks how: one gradient per unit (jax_privacy ``clipped_grad``; ``m = 1`` on CPU,
   where vmapping over records is slower), or book-keeping or ghost clipping (:mod:`~snapaudit_jax.dpsgd.ghost`:
   the units' norms from the activations and cotangents of one backward pass of the summed loss, no per-unit
   gradient), which ``"auto"`` takes wherever they cover every trainable parameter (on every backend; see
   :func:`resolve_clipping`). The sum is the same to float32 rounding either way;
3. Gaussian noise of std ``sigma C`` added to the *sum* (:func:`~snapaudit_jax.dpsgd.noise.gaussian_privatizer`,
   float32 normals exact to float32 rounding but with probability ``2^-71`` a coordinate, an optax transformation
   whose key, seeded by ``fold_in(key, 1)``, lives in the optimizer state);
4. division by the expected batch size ``q N`` (data-independent; ``optax.scale``), then the
   optimizer (optax SGD / Adam / AdamW).

The whole step is one jitted kernel; sizes (``N``, ``m``, ``L``) and the optimizer kind are static,
while ``q``, ``C``, ``sigma C``, ``1 / (q N)`` and the learning rate are traced, so neither later steps
nor later runs with other privacy settings recompile.

Data parallelism (``train(..., mesh=...)``, :mod:`~snapaudit_jax.dpsgd.parallel`): over a 1-D mesh of ``D``
devices the units are split over the devices (``N`` padded to a multiple of ``D`` with units that are never
selected) and everything else is replicated. Step 1 is unchanged (the same global mask, so the batch of step
``t`` does not depend on ``D``); step 2 runs on every device over the selected units it holds, with
``m`` units per microbatch on each device, and the ``D`` clipped sums are added (``psum``); steps 3 and 4 run
once on the replicated sum, with the same key, so there is one noise draw, the single-device one. Only the
float32 summation order differs from one device. The mesh may span several processes (``jax.distributed``): every
process runs :func:`train` on the same inputs, process 0 writes the checkpoints.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import sys
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.experimental import multihost_utils

from snapaudit_jax.dpsgd import ghost, noise, parallel
from snapaudit_jax.dpsgd.accounting import (
    PROTECTED_UNIT,
    UNIT_GROUP,
    DPReport,
    calibrate_noise_multiplier,
    compute_epsilon,
    make_report,
)
from snapaudit_jax.dpsgd.checkpoint import latest_checkpoint, load_checkpoint, read_meta, save_checkpoint
from snapaudit_jax.dpsgd.config import DPSGDConfig
from snapaudit_jax.dpsgd.gradients import _check_dataset, _clipped_sum
from snapaudit_jax.dpsgd.keys import RANDOMNESS, key_digest, resolve_run_key
from snapaudit_jax.dpsgd.sampling import (
    _poisson_mask, compact_indices, inclusion_threshold, microbatch_calls, sampling_probability,
)
from snapaudit_jax.models.decoders import GPT2, Llama, check_stackable, stack_layers, unstack_layers
from snapaudit_jax.utils import validate
from snapaudit_jax.utils.errors import InputError

__all__ = ["train", "ResolvedPrivacy", "resolve_clipping", "resolve_privacy", "HISTORY_KEYS"]

HISTORY_KEYS = ("step", "batch_size", "loss", "grad_norm_mean", "grad_norm_max", "clipped_fraction")
_SAMPLE_STREAM, _NOISE_STREAM = 0, 1


class ResolvedPrivacy(NamedTuple):
    """The privacy parameters of a run on a given dataset.

    Attributes:
      sampling_rate: accounted Poisson rate ``q``.
      noise_multiplier: ``sigma`` (given or calibrated; ``0`` when non-private).
      clip_norm: ``C`` (``inf`` when non-private).
      expected_batch_size: ``q N``, the normaliser of the noisy sum.
      microbatch_size: records per clipped-gradient call (see ``DPSGDConfig.microbatch_for``).
      tail_microbatch_size: records per call for a batch's remainder (see ``DPSGDConfig.tail_for``).
    """

    sampling_rate: float
    noise_multiplier: float
    clip_norm: float
    expected_batch_size: float
    microbatch_size: int
    tail_microbatch_size: int


def resolve_privacy(config: DPSGDConfig, num_records: int, clipping: str = "per_record") -> ResolvedPrivacy:
    """The privacy parameters of ``config`` on a dataset of ``num_records`` records.

    With ``target_epsilon``, ``sigma`` is calibrated (:func:`~snapaudit_jax.dpsgd.calibrate_noise_multiplier`)
    with ``config.accountant`` at ``config.delta`` for all ``config.steps`` steps at rate ``q``; a non-private
    configuration gets ``sigma = 0`` and ``C = inf``.

    Args:
      config: the run.
      num_records: ``N``.
      clipping: the resolved clipping path (:func:`resolve_clipping`), for the microbatch size ``m``
        (:meth:`DPSGDConfig.microbatch_for`).

    Returns:
      :class:`ResolvedPrivacy` ``(q, sigma, C, q N, m, t)``.

    Raises:
      InputError: ``batch_size > num_records`` or an unreachable ``target_epsilon``.
    """
    q = config.sampling_rate_for(num_records)
    if config.non_private:
        sigma, clip = 0.0, math.inf
    elif config.noise_multiplier is not None:
        sigma, clip = config.noise_multiplier, config.clip_norm
    else:
        sigma = calibrate_noise_multiplier(
            target_epsilon=config.target_epsilon,
            delta=config.delta,
            sampling_rate=q,
            steps=config.steps,
            accountant=config.accountant,
            tol=config.calibration_tol,
            pld_discretization=config.pld_discretization,
        )
        clip = config.clip_norm
    m = config.microbatch_for(num_records, clipping=clipping)
    return ResolvedPrivacy(q, sigma, clip, q * num_records, m, config.tail_for(num_records, m))


@dataclasses.dataclass(frozen=True)
class _StepSpec:
    """Static part of the step kernel (hashable)."""

    num_records: int
    microbatch_size: int
    optimizer: str
    momentum: float
    b1: float
    b2: float
    eps: float
    weight_decay: float
    private: bool
    clipping: str = "per_record"  # resolved: "per_record", "book_keeping" or "ghost"
    vocab_chunk: int | None = None  # the LM head's vocabulary rows a slice (None: whole logits)
    sum_dtype: str = "float32"  # book-keeping's clipped-sum operands (DPSGDConfig.clipped_sum_dtype)
    tail_size: int | None = None  # the batch remainder's microbatch (DPSGDConfig.tail_for; None: microbatch_size)


class _Hyper(NamedTuple):
    """Traced scalars of the step kernel."""

    threshold: jax.Array  # uint32 sampler threshold of q
    clip_norm: jax.Array
    noise_std: jax.Array  # sigma * C
    inv_normaliser: jax.Array  # 1 / (q N)
    learning_rate: jax.Array


def _make_tx(spec: _StepSpec, hyper: _Hyper, noise_key: jax.Array) -> optax.GradientTransformation:
    """``noise -> scale 1 / (q N) -> optimizer``; ``noise_key`` only seeds ``init``."""
    lr = hyper.learning_rate
    if spec.optimizer == "sgd":
        base = optax.sgd(lr, momentum=spec.momentum or None)
    elif spec.optimizer == "adam":
        base = optax.adam(lr, b1=spec.b1, b2=spec.b2, eps=spec.eps)
    else:
        base = optax.adamw(lr, b1=spec.b1, b2=spec.b2, eps=spec.eps, weight_decay=spec.weight_decay)
    parts = [optax.scale(hyper.inv_normaliser), base]
    if spec.private:
        parts.insert(0, noise.gaussian_privatizer(hyper.noise_std, noise_key))
    return optax.chain(*parts)


def _path_clipped_sum(clipping: str, graphdef, params, rest, tokens, mask, padding, clip_norm, *,
                      vocab_chunk: int | None = None, sum_dtype: str = "float32"):
    """One microbatch's clipped sum on a resolved clipping path (traceable): ``ClippedGrads``."""
    if clipping == "per_record":
        return _clipped_sum(graphdef, rest, params, tokens, mask, padding, clip_norm, vocab_chunk)
    if clipping == "book_keeping":
        return ghost.book_keeping_clipped_sum_traced(graphdef, params, rest, tokens, mask, padding, clip_norm,
                                                     vocab_chunk=vocab_chunk, sum_dtype=sum_dtype)
    return ghost.ghost_clipped_sum_traced(graphdef, params, rest, tokens, mask, padding, clip_norm,
                                          vocab_chunk=vocab_chunk)


def _check_sum_path(clipped_sum_dtype: str, clipping: str, reason: str) -> None:
    """Refuses bfloat16 clipped-sum operands where the clipping path resolved to other than book-keeping."""
    if clipped_sum_dtype != "float32" and clipping != "book_keeping":
        raise InputError(f"clipped_sum_dtype = {clipped_sum_dtype!r} needs the book-keeping path; clipping "
                         f"resolved to {clipping!r} ({reason})")


def _local_sums(params, rest, hyper: _Hyper, tokens, mask, selected, *, graphdef, microbatch_size: int,
                tail_size: int | None = None, clipping: str = "per_record", vocab_chunk: int | None = None,
                sum_dtype: str = "float32"):
    """Clipped gradient sum over the selected units of ``tokens`` (one device's): ``(grad_sum, sums, maxima)``.

    Microbatches of ``m = microbatch_size`` units, then the rest in microbatches of ``t = tail_size``
    (``DPSGDConfig.tail_for``; ``None`` or ``m``: ``ceil(count / m)`` of ``m``), the last padded; how many of each:
    :func:`~snapaudit_jax.dpsgd.sampling.microbatch_calls`.
    """
    m = microbatch_size
    t = m if tail_size is None else tail_size
    clipped_sum = functools.partial(_path_clipped_sum, clipping, graphdef, params, rest, vocab_chunk=vocab_chunk,
                                    sum_dtype=sum_dtype)
    indices, count = compact_indices(selected, m)
    if t < m:  # the tail's slices end below count + t: every one inside the array (dynamic_slice would clamp)
        indices = jnp.concatenate([indices, jnp.zeros((t,), indices.dtype)])

    def loop(size, offset, calls, carry):
        rows = jnp.arange(size, dtype=jnp.int32)

        def body(i, carry):
            grad_sum, loss_sum, norm_sum, norm_max, clipped = carry
            start = offset + i * size
            ids = jax.lax.dynamic_slice(indices, (start,), (size,))
            padding = start + rows >= count
            out = clipped_sum(tokens[ids], mask[ids], padding, hyper.clip_norm)
            real = ~padding
            norms = jnp.where(real, out.norms, 0.0)
            return (
                jax.tree.map(jnp.add, grad_sum, out.grad_sum),
                loss_sum + jnp.sum(jnp.where(real, out.losses, 0.0)),
                norm_sum + jnp.sum(norms),
                jnp.maximum(norm_max, jnp.max(norms)),
                clipped + jnp.sum(real & (out.norms > hyper.clip_norm), dtype=jnp.int32),
            )

        return jax.lax.fori_loop(0, calls, body, carry)

    zero = jnp.zeros((), jnp.float32)
    carry = (jax.tree.map(jnp.zeros_like, params), zero, zero, zero, jnp.zeros((), jnp.int32))
    full, rest = microbatch_calls(count, m, t)
    carry = loop(m, 0, full, carry)
    if t < m:  # (rest is 0 when t = m: no second copy of the body)
        carry = loop(t, full * m, rest, carry)
    grad_sum, loss_sum, norm_sum, norm_max, clipped = carry
    sums = {"batch_size": count, "loss_sum": loss_sum, "norm_sum": norm_sum, "clipped": clipped}
    return grad_sum, sums, {"norm_max": norm_max}


def _dp_step_kernel(
    key, step, params, opt_state, rest, tokens, mask, hyper: _Hyper, *, graphdef, spec: _StepSpec, mesh=None
):
    """One DP-SGD step (pure; key first): ``(params, opt_state, metrics)``.

    ``mesh=None``: one device. A 1-D mesh: ``tokens`` and ``mask`` are ``(N_pad, ...)`` split over its axis and
    everything else replicated; the per-unit clipped sums run where the units live and are summed over the axis
    (:mod:`~snapaudit_jax.dpsgd.parallel`), then the one noise draw and the update run on the replicated sum.
    """
    selected = _poisson_mask(jax.random.fold_in(key, _SAMPLE_STREAM), step, spec.num_records, hyper.threshold)
    local = functools.partial(_local_sums, graphdef=graphdef, microbatch_size=spec.microbatch_size,
                              tail_size=spec.tail_size,
                              clipping=spec.clipping, vocab_chunk=spec.vocab_chunk, sum_dtype=spec.sum_dtype)
    if mesh is None:
        grad_sum, sums, maxima = local(params, rest, hyper, tokens, mask, selected)
        metrics = {**sums, **maxima}
    else:
        grad_sum, metrics = parallel._sharded_sums(mesh, local, (params, rest, hyper), tokens, mask, selected)
    tx = _make_tx(spec, hyper, jax.random.fold_in(key, _NOISE_STREAM))
    updates, opt_state = tx.update(grad_sum, opt_state, params)
    params = optax.apply_updates(params, updates)
    if mesh is not None:
        params, opt_state = parallel._constrain_replicated(mesh, (params, opt_state))
    return params, opt_state, metrics


_dp_step = jax.jit(
    _dp_step_kernel, static_argnames=("graphdef", "spec", "mesh"), donate_argnames=("params", "opt_state")
)


def _as_key(key) -> jax.Array:
    key = jnp.asarray(key) if not isinstance(key, jax.Array) else key
    if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
        if key.shape != ():
            raise InputError(f"key must be a single PRNG key, got shape {key.shape}")
        return key
    if key.dtype != jnp.uint32 or key.ndim != 1:
        raise InputError(f"key must be a PRNG key (jax.random.key) or raw uint32 key data, got {key.dtype} {key.shape}")
    return jax.random.wrap_key_data(key)


def _fingerprint(tokens: np.ndarray, mask: np.ndarray) -> str:
    h = hashlib.sha256()
    h.update(repr((tokens.shape, str(tokens.dtype))).encode())
    h.update(np.ascontiguousarray(tokens).tobytes())
    h.update(np.ascontiguousarray(mask).tobytes())
    return h.hexdigest()


def _history(raw: dict[str, list], done: int) -> dict[str, np.ndarray]:
    count = np.asarray(raw["batch_size"], np.int64)
    safe = np.maximum(count, 1)
    empty = count == 0
    with np.errstate(invalid="ignore"):
        return {
            "step": np.arange(1, done + 1, dtype=np.int64),
            "batch_size": count,
            "loss": np.where(empty, np.nan, np.asarray(raw["loss_sum"], np.float64) / safe),
            "grad_norm_mean": np.where(empty, np.nan, np.asarray(raw["norm_sum"], np.float64) / safe),
            "grad_norm_max": np.where(empty, np.nan, np.asarray(raw["norm_max"], np.float64)),
            "clipped_fraction": np.where(empty, np.nan, np.asarray(raw["clipped"], np.float64) / safe),
        }


_RAW_KEYS = ("batch_size", "loss_sum", "norm_sum", "norm_max", "clipped")


def _drain(pending: list, raw: dict[str, list]) -> None:
    for metrics in jax.device_get(parallel._to_local(pending)):  # replicated: this process's copy
        for name in _RAW_KEYS:
            value = metrics[name]
            raw[name].append(int(value) if name in ("batch_size", "clipped") else float(value))
    pending.clear()


class _Prepared(NamedTuple):
    """Everything a run's steps need (built once per :func:`train` call)."""

    key: jax.Array
    privacy: ResolvedPrivacy
    spec: _StepSpec
    hyper: _Hyper
    graphdef: Any
    params: Any
    opt_state: Any
    rest: Any
    tokens: jax.Array
    mask: jax.Array
    identity: dict[str, Any]
    mesh: Any  # None or the 1-D data-parallel jax.sharding.Mesh
    clipping_reason: str
    layers: str
    layers_reason: str
    coordinates: int  # the trainable parameters: the noise's coordinates


def _check_sampler_delta(config: DPSGDConfig, privacy: ResolvedPrivacy, coordinates: int) -> None:
    """:func:`~snapaudit_jax.dpsgd.noise.check_sampler_delta` of a private run, before it trains.

    The epsilon is the target's or, with a given ``sigma``, RDP's for every planned step (an upper bound on the
    reported one, the smaller of two accountants).
    """
    if not config.private or config.delta is None or privacy.noise_multiplier <= 0.0:
        return
    if config.target_epsilon is not None:
        eps = config.target_epsilon
    else:
        eps = compute_epsilon(noise_multiplier=privacy.noise_multiplier, sampling_rate=privacy.sampling_rate,
                              steps=config.steps, delta=config.delta, accountant="rdp")
    noise.check_sampler_delta(eps, config.steps, coordinates, config.delta)


def _prepare(model, dataset, config: DPSGDConfig, key, trainable=nnx.Param, mesh=None) -> _Prepared:
    """Validates the data, resolves ``q``/``sigma`` (calibration), and builds the step's static and traced inputs.

    ``mesh``: ``None`` or a resolved 1-D mesh (:func:`~snapaudit_jax.dpsgd.parallel._resolve_mesh`); the units are
    then padded and split over it and everything else is replicated.
    """
    tokens_np, mask_np = _check_dataset(dataset, model, units=True)
    n = tokens_np.shape[0]
    key = _as_key(key)
    graphdef, params, rest = nnx.split(model, trainable, ...)
    if not jax.tree.leaves(params):
        raise InputError(f"trainable must select at least one parameter of the model, got {trainable!r}")
    clipping, clipping_reason = resolve_clipping(config.clipping, graphdef, params, rest, tokens_np[:1], mask_np[:1],
                                                 vocab_chunk=config.vocab_chunk)
    if config.private:
        _check_sum_path(config.clipped_sum_dtype, clipping, clipping_reason)
    layers, layers_reason = resolve_layers(config.layers, model, trainable)
    if layers == "scan":
        graphdef, params, rest = nnx.split(stack_layers(model), trainable, ...)
    privacy = resolve_privacy(config, n, clipping)
    coordinates = noise.coordinates(params)
    _check_sampler_delta(config, privacy, coordinates)
    spec = _StepSpec(
        num_records=n,
        microbatch_size=privacy.microbatch_size,
        tail_size=privacy.tail_microbatch_size,
        optimizer=config.optimizer,
        momentum=config.momentum,
        b1=config.b1,
        b2=config.b2,
        eps=config.eps,
        weight_decay=config.weight_decay,
        private=config.private,
        clipping=clipping,
        vocab_chunk=config.vocab_chunk,
        sum_dtype=config.clipped_sum_dtype if config.private else "float32",
    )
    hyper = _Hyper(
        threshold=jnp.asarray(inclusion_threshold(privacy.sampling_rate)),
        clip_norm=jnp.float32(privacy.clip_norm),
        noise_std=jnp.float32(privacy.noise_multiplier * privacy.clip_norm if config.private else 0.0),
        inv_normaliser=jnp.float32(1.0 / privacy.expected_batch_size),
        learning_rate=jnp.float32(config.learning_rate),
    )
    params = jax.tree.map(jnp.array, params)  # a copy: the step donates its buffers
    opt_state = _make_tx(spec, hyper, jax.random.fold_in(key, _NOISE_STREAM)).init(params)
    identity = {
        # The requested clipping is in "clipping" as resolved: the path sets the float32 summation order.
        "config": {k: v for k, v in config.to_dict().items()
                   if k not in ("clipping", "layers", "vocab_chunk", "clipped_sum_dtype")},
        # None: the per-record path, as in checkpoints written before the fast paths.
        "clipping": None if clipping == "per_record" else clipping,
        # The parameters' tree (stacked or one per block) and the float32 rounding of the step; None: unrolled, as
        # in checkpoints written before the scan.
        "layers": None if layers == "unrolled" else layers,
        # The head's slices (float32 rounding of the loss); None: whole logits, as in checkpoints before them.
        "vocab_chunk": config.vocab_chunk,
        # The clipped sum's operands; None: float32, as in checkpoints written before bfloat16 ones.
        "clipped_sum_dtype": None if spec.sum_dtype == "float32" else spec.sum_dtype,
        "sampling_rate": privacy.sampling_rate,
        "noise_multiplier": privacy.noise_multiplier,
        "dataset_sha256": _fingerprint(tokens_np, mask_np),
        "dataset_shape": list(tokens_np.shape),
        "model": f"{type(model).__name__}({getattr(model, 'cfg', None)!r})",
        "trainable": getattr(trainable, "__name__", repr(trainable)),
        # The key's digest only: a checkpoint's meta.json never holds the key (keys.py); the key of a secret run
        # is in the checkpoint folder's run_key.json.
        "key_sha256": key_digest(key),
        "key_impl": str(jax.random.key_impl(key)),
        # The noise sampler (checkpoints written with jax.random.normal's, truncated at 5.2 sigma, do not resume).
        "noise": noise.SAMPLER,
        # The device count sets the float32 summation order of the clipped sums: a checkpoint resumes bit for
        # bit only on as many devices (None: the single-device step, as in checkpoints written before meshes).
        "data_parallel_devices": None if mesh is None else int(mesh.devices.size),
        # So does the process layout: the all-reduce across processes (gloo on CPU) adds the partial sums in
        # another order than one process's (measured on 4 devices: 2 processes x 2 vs 1 x 4 differ in 770 of
        # 3488 parameters by up to 2.4e-7). None: one process, as in checkpoints written before multi-process.
        "data_parallel_processes": (
            len({d.process_index for d in mesh.devices.flat}) if parallel._spans_processes(mesh) else None
        ),
    }
    if parallel._spans_processes(mesh):
        _check_same_run(identity)
    if mesh is None:
        tokens, mask = jnp.asarray(tokens_np), jnp.asarray(mask_np)
    else:
        tokens, mask = parallel._shard_units(mesh, tokens_np, mask_np)
        key, hyper, params, opt_state, rest = parallel._replicate(mesh, (key, hyper, params, opt_state, rest))
    return _Prepared(key, privacy, spec, hyper, graphdef, params, opt_state, rest, tokens, mask, identity, mesh,
                     clipping_reason, layers, layers_reason, coordinates)


_FAST_COVER = "the fast paths cover every trainable parameter (ghost.not_covered is empty)"
_MEASURED = ("book-keeping, the measured default on every backend (2 CPU cores, benchmarks/bench_finetune.py, "
             "SmolLM2 shape: DP-full 1.01x the batched non-private step against per-record's 1.24x at expected "
             "batch 32, 1.56x against 1.92x at 8, DP-LoRA 1.17x against 1.19x; bench_dpsgd.py, GPT-2 2 x 128 with "
             "a 1,024-token vocabulary, one record a microbatch: 0.77-1.19x against per-record's 0.74-1.08x at "
             "8-256, 3-14% slower on that small shape)")


def resolve_clipping(requested: str, graphdef, params, rest, tokens, mask, *,
                     vocab_chunk: int | None = None) -> tuple[str, str]:
    """The clipping path of a run and why: ``(path, reason)``.

    Args:
      requested: ``DPSGDConfig.clipping``.
      graphdef, params, rest: ``nnx.split(model, trainable, ...)``.
      tokens, mask: one or a few units of the data (traced abstractly, see :func:`ghost.not_covered`).
      vocab_chunk: ``DPSGDConfig.vocab_chunk`` (a vocabulary-sliced head is covered through its own terms).

    Returns:
      ``("per_record" | "book_keeping" | "ghost", reason)``: ``"auto"`` is book-keeping when the fast paths
      cover every trainable parameter (on every backend: measured faster than the per-record path, or as fast,
      on every shape tried, CPU included) and the per-record path otherwise, the reason naming what is not
      covered.

    Raises:
      InputError: ``"book_keeping"`` or ``"ghost"`` requested for a model with a parameter they do not cover, or
        with a tapped layer called twice per forward pass (both named).
    """
    if requested == "per_record":
        return "per_record", "requested (clipping = \"per_record\")"
    try:
        missing = ghost.not_covered(graphdef, params, rest, jnp.asarray(tokens), jnp.asarray(mask),
                                    vocab_chunk=vocab_chunk)
        why = ""
    except InputError as err:
        missing, why = None, str(err)
    if missing == ():
        if requested == "auto":
            return "book_keeping", f"auto: {_FAST_COVER}; {_MEASURED}"
        return requested, f"requested (clipping = \"{requested}\"; {_FAST_COVER})"
    if missing:  # by kind: every block's copy of a parameter named once, "blocks.*.ln_1.scale"
        kinds = sorted({".".join("*" if part.isdigit() else part for part in name.split(".")) for name in missing})
        why = f"{len(missing)} trainable parameter{'s' if len(missing) > 1 else ''} not covered ({', '.join(kinds)})"
    if requested != "auto":
        raise InputError(f"clipping = {requested!r} does not cover this model: {why}; use \"auto\" or "
                         "\"per_record\"")
    return "per_record", f"auto: the fast paths do not cover this model: {why}"


SCAN_MIN_LAYERS = 4
"""The fewest blocks ``layers = "auto"`` scans (``benchmarks/bench_compile.py``: below it the unrolled step
compiles about as fast)."""


def _block_patterns(model, trainable) -> dict[str, set[int]]:
    """Trainable parameters under ``blocks`` by their path with the block index replaced by ``*``, with the
    indices of the blocks that have them trainable."""
    _, params, _ = nnx.split(model, trainable, ...)
    found: dict[str, set[int]] = {}
    for path, _ in nnx.to_flat_state(params):
        if len(path) > 1 and path[0] == "blocks" and isinstance(path[1], int):
            found.setdefault(".".join(map(str, ("blocks", "*") + tuple(path[2:]))), set()).add(path[1])
    return found


_CPU_LAYERS_REASON = ("on the CPU unrolled, the measured default (benchmarks/bench_compile.py, GPT-2 12 x 256: the "
                      "scanned step compiles in 0.38-0.45x the time but runs 1.04-1.31x as long, a loss after 40 to "
                      "400 steps; layers = \"scan\" forces the scan)")


def resolve_layers(requested: str, model, trainable, backend: str | None = None) -> tuple[str, str]:
    """How the blocks of a run's model run, and why: ``(layers, reason)``.

    Args:
      requested: ``DPSGDConfig.layers``.
      model: the model to train (unstacked).
      trainable: the filter of the trained parameters.
      backend: the JAX backend the step runs on (default ``jax.default_backend()``).

    Returns:
      ``("scan" | "unrolled", reason)``; ``"auto"`` scans, on accelerators, a
      :class:`~snapaudit_jax.models.decoders.GPT2` or ``Llama`` of at least :data:`SCAN_MIN_LAYERS` blocks of one
      structure, trained alike in every block (on every clipping path: the fast paths tap the stacked blocks
      inside the scan); on the CPU it stays unrolled (the scanned step runs slower there: the reason says how
      much).

    Raises:
      InputError: ``"scan"`` requested for a model that cannot be stacked (not one of our decoders, fewer than two
        blocks, blocks of different structure, a trainable filter that selects a parameter in some blocks only),
        named.
    """
    if requested == "unrolled":
        return "unrolled", "requested (layers = \"unrolled\")"
    why = None
    if not isinstance(model, (GPT2, Llama)):
        why = f"{type(model).__name__} is not one of the decoders (GPT2, Llama) whose blocks can be stacked"
    elif requested == "auto" and len(model.blocks) < SCAN_MIN_LAYERS:
        return "unrolled", f"auto: {len(model.blocks)} blocks, fewer than {SCAN_MIN_LAYERS} (unrolled compiles as fast)"
    elif requested == "auto" and (backend or jax.default_backend()) == "cpu":
        return "unrolled", f"auto: {_CPU_LAYERS_REASON}"
    else:
        count = len(model.blocks)
        uneven = sorted(name for name, blocks in _block_patterns(model, trainable).items() if len(blocks) != count)
        if uneven:
            why = f"the trainable filter selects {', '.join(uneven)} in some blocks only"
        else:
            try:
                check_stackable(model.blocks)
            except InputError as err:
                why = str(err)
    if why is not None:
        if requested == "scan":
            raise InputError(f"layers = \"scan\" cannot run this model: {why}; use \"auto\" or \"unrolled\"")
        return "unrolled", f"auto: {why}"
    if requested == "scan":
        return "scan", "requested (layers = \"scan\")"
    return "scan", f"auto: {len(model.blocks)} blocks of one structure, one scan (compiles in the time of one block)"


def _check_same_run(identity: dict[str, Any]) -> None:
    """Raises on every process unless all processes describe the same run (configuration, data, model, key)."""
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).digest()
    gathered = np.asarray(multihost_utils.process_allgather(np.frombuffer(digest, np.uint8)))
    differ = [i for i in range(gathered.shape[0]) if not np.array_equal(gathered[i], gathered[0])]
    if differ:
        raise InputError(
            "every process must call train with the same configuration, dataset, model architecture and key, "
            f"got runs of processes {differ} that differ from process 0's"
        )


def _progress_line(info: dict[str, Any]) -> None:
    print(
        f"dpsgd step {info['step']}/{info['steps']}: loss {info['loss']:.4f}, batch {info['batch_size']}, "
        f"clipped {info['clipped']}/{info['batch_size']}, {info['seconds']:.1f}s",
        file=sys.stderr,
        flush=True,
    )


def train(
    model,
    dataset,
    config: DPSGDConfig,
    *,
    key: jax.Array | None = None,
    checkpoint_dir: str | None = None,
    checkpoint_every: int | None = None,
    stop_after: int | None = None,
    progress: bool | Callable[[dict[str, Any]], None] = False,
    trainable: Any = nnx.Param,
    protected_unit: str | None = None,
    mesh: Any = None,
) -> tuple[Any, dict[str, np.ndarray], DPReport]:
    """Trains a decoder language model with DP-SGD (or plainly, with ``config.non_private``).

    Args:
      model: a :class:`~snapaudit_jax.models.decoders.GPT2` or ``Llama`` (flax.nnx); not modified.
      dataset: ``(tokens, mask)``, ``(N, L)`` int token ids and ``(N, L)`` bool real-token mask (or an int8
        loss mask: ``0`` padding, ``1`` context that is never a target, ``2`` target, as a chat record trained on
        its answers); one row is one record (the protected unit). Every row needs a target after a real token.
        Or ``(N, k, L)`` arrays: unit ``i`` is the ``k`` rows ``tokens[i]`` (e.g. one user's records; empty rows
        are padding), sampled as one, its rows' losses summed and the gradient of the sum clipped as one
        (user-level DP).
      config: the run (:class:`~snapaudit_jax.dpsgd.DPSGDConfig`).
      key: the run's PRNG key, typed or raw ``uint32`` data: batch of step ``t`` from
        ``fold_in(fold_in(key, 0), t)``, noise generator seeded by ``fold_in(key, 1)``. The guarantee needs it
        secret and uniformly random. Default: ``jax.random.key(config.seed)`` when ``config.seed`` is set (a
        replayable run; the report says the guarantee then holds only while the seed stays secret), else a secret
        key from the operating system's entropy (:mod:`~snapaudit_jax.dpsgd.keys`), kept in
        ``checkpoint_dir/run_key.json`` (mode ``0600``) so that a stopped run resumes with it. Over several
        processes process 0 draws or reads it and sends it to the others.
      checkpoint_dir: if set, resume from its newest checkpoint (which must belong to the same configuration,
        data, model architecture and key) and save checkpoints there. Its checkpoints and ``run_key.json`` are
        private state (they replay the noise): keep them with the private data. With a mesh over several
        processes it must be one folder that every process sees (a shared file system): process 0 writes, every
        process reads, and no process goes on before a checkpoint is complete
        (``multihost_utils.sync_global_devices``).
      checkpoint_every: save every this many steps (and always when the call ends); default: only when the
        call ends.
      stop_after: stop once this many steps (in total, ``<= config.steps``) are done, e.g. to split a run
        over jobs; the report then accounts the steps done.
      progress: ``True``: print a line to stderr about every ``steps / 10`` steps (and at the end); a
        callable: call it instead with a dict ``{"step", "steps", "batch_size", "loss", "clipped",
        "seconds"}`` (``loss``: mean per-record loss of that step's batch, NaN if empty; not private).
      trainable: the ``nnx`` state filter of the parameters to train (default ``nnx.Param``: all of them;
        ``nnx.LoRAParam``: LoRA adapters only, see :mod:`snapaudit_jax.finetune.lora`). Parameters outside it
        are returned bitwise unchanged.
      protected_unit: the report's words for one unit (default: one row, or one ``tokens[i]`` group).
      mesh: data parallelism (see the module docstring): ``None`` (one device, the default), a number ``D`` of
        local devices (the first ``D`` of ``jax.local_devices()``, as ``jax.make_mesh((D,), ("data",))``), or a
        1-D :class:`jax.sharding.Mesh` of local devices (any axis name and type). The units are split over its
        axis; the returned model's arrays are replicated on it. A checkpoint records ``D`` (``None`` without a
        mesh) and is resumed only with the same ``D``, since ``D`` sets the float32 summation order. With
        several processes (``jax.process_count() > 1``, after ``jax.distributed.initialize``) an int ``D`` counts
        global devices (the first ``D`` of ``jax.devices()``; at least one of every process), and a mesh holds
        devices of every process or of this process only (a process-local run, as with one process). Every
        process must then call :func:`train` with the same model, dataset, configuration, key and options;
        each holds the whole dataset and places the units of its own devices. The returned model's arrays are
        this process's copy (on its first device of the mesh), usable without the other processes. A
        checkpoint also records the number of processes (``None`` for one) and is resumed only with as many,
        since the cross-process all-reduce adds in another order.

    Returns:
      ``(trained_model, history, report)``: a new model with the trained parameters; ``history`` maps
      :data:`HISTORY_KEYS` to ``(steps_done,)`` arrays (``loss`` is the mean per-record loss of the realised
      batch, NaN for an empty batch); the :class:`~snapaudit_jax.dpsgd.DPReport`.

    Raises:
      InputError: ``config`` not a :class:`DPSGDConfig`; invalid dataset, key,
        ``stop_after``, ``checkpoint_every`` or ``progress``; unreachable target epsilon; an unreadable
        checkpoint, or one of another run (configuration, data, model, key or device count) in
        ``checkpoint_dir``; ``mesh`` not ``None``, not a device count in ``[1, len(jax.local_devices())]`` and not
        a 1-D mesh of local devices (several processes: not a count in ``[1, len(jax.devices())]`` that reaches
        every process, or a 1-D mesh of devices of some processes but not all, or not of this one; or a
        configuration, dataset, model architecture or key that differs between the processes).

    Guarantees:
      With ``config.non_private = False`` and ``sigma > 0``, the sequence of parameters (every checkpoint and
      the returned model) is ``(epsilon, delta)``-DP for one record under add/remove adjacency, with
      ``epsilon`` the report's accountant bound for ``steps`` Poisson-sampled Gaussian steps: each record
      enters each step's batch independently with probability at most ``q``, its clipped gradient changes the
      noisy sum by at most ``C`` in L2 norm, the noise is ``N(0, sigma^2 C^2 I)`` on the sum, and everything
      after is post-processing. This assumes the records of ``dataset`` are the units to protect, the key is
      secret and random, and the ``history`` and progress reports (not private) are not released. A run
      stopped and resumed from a checkpoint is bit-for-bit the uninterrupted run (same batches, same noise).

      With a ``mesh`` the guarantee is unchanged: the batches are the same Poisson masks (the batch of step
      ``t`` is the single-device one, whatever ``D``), each unit's gradient is clipped to ``C`` on the device that
      holds it, the ``D`` partial sums are added, and one Gaussian draw of std ``sigma C`` (the single-device
      draw, from the same key, computed once on the replicated sum) is added to that sum once. The batch sizes
      equal the single-device ones exactly; the parameters (and the loss and norm metrics) agree with the
      single-device run up to the float32 summation order of the ``D`` partial sums (measured on tiny GPT-2 and
      Llama-LoRA runs of 5 steps on 8 host devices: at most 2.4e-7 apart, within 5% of the tested
      ``atol=1e-6 + rtol=1e-5 |x|``). A run on ``D`` devices stopped and resumed (also after ``kill -9``) on
      ``D`` devices is bit-for-bit the uninterrupted one.

      Over several processes the guarantee is again unchanged, provided every process passes the same inputs
      (dataset, model, configuration and key; the key must reach every process but stays secret): the step is
      the one-process program on ``D`` devices with the all-reduce spanning the processes, one noise draw on
      the replicated sum, the same batch sizes. Measured on a tiny GPT-2 run of 5 steps on 2 CPU processes x 2
      host devices (gloo): the parameters are bitwise equal on both processes and within 2.4e-7 of the
      one-process 4-device and single-device runs (within 6% of the tolerance above), not bitwise equal to the
      one-process 4-device run (another summation order); stopped after 3 steps and resumed on 2 processes,
      bit-for-bit the uninterrupted 2-process run. A run whose configuration, dataset, model architecture or key
      differs between processes is refused on every process (their run identities are compared); the initial
      weights are not compared and must be the same (the same seed or checkpoint).

    References:
      Abadi et al. 2016, "Deep learning with differential privacy", Alg. 1; Mironov, Talwar & Zhang 2019.
    """
    if not isinstance(config, DPSGDConfig):
        raise InputError(f"config must be a DPSGDConfig, got {type(config).__name__}")
    stop = config.steps if stop_after is None else validate.positive_int("stop_after", stop_after)
    if stop > config.steps:
        raise InputError(f"stop_after must be <= config.steps={config.steps}, got {stop_after}")
    if checkpoint_every is not None:
        checkpoint_every = validate.positive_int("checkpoint_every", checkpoint_every)
    if not (isinstance(progress, bool) or callable(progress)):
        raise InputError(f"progress must be a bool or a callable, got {progress!r}")
    mesh = parallel._resolve_mesh(mesh)
    multi = parallel._spans_processes(mesh)  # a jax.distributed run: process 0 writes the checkpoints
    drawn, randomness = resolve_run_key(key, config.seed, checkpoint_dir, processes=multi)
    run = _prepare(model, dataset, config, key if drawn is None else drawn, trainable, mesh)
    privacy, params, opt_state = run.privacy, run.params, run.opt_state

    raw: dict[str, list] = {name: [] for name in _RAW_KEYS}
    start = 0
    if checkpoint_dir is not None:
        found = latest_checkpoint(checkpoint_dir)
        if found is not None:
            meta = read_meta(found)  # the run's identity before the arrays: a refusal that names what differs
            for name, value in run.identity.items():
                if meta.get("run", {}).get(name) != value:
                    raise InputError(
                        f"checkpoint {found}: {name} differs from this run (checkpoint "
                        f"{meta.get('run', {}).get(name)!r}, run {value!r}); use another checkpoint_dir"
                    )
            params, opt_state, meta = load_checkpoint(found, params, opt_state)
            if mesh is not None:
                params, opt_state = parallel._replicate(mesh, (params, opt_state))
            start = int(meta["step"])
            raw = {name: list(meta["history"][name]) for name in _RAW_KEYS}
            if start > stop:
                raise InputError(f"stop_after must be >= the checkpoint's step {start}, got {stop_after}")
        if multi:  # every process has looked for and read the checkpoint before process 0 may replace it
            multihost_utils.sync_global_devices("snapaudit_jax.dpsgd.train: checkpoint read")

    def save(done: int) -> None:
        _drain(pending, raw)
        if not multi or jax.process_index() == 0:
            ledger = {
                "event": "SelfComposed(PoissonSampled(q, Gaussian(sigma)), steps)",
                "sampling_rate": privacy.sampling_rate,
                "noise_multiplier": privacy.noise_multiplier,
                "steps": done,
                "private": config.private,
            }
            if config.private and privacy.noise_multiplier > 0:
                ledger["epsilon_rdp"] = compute_epsilon(
                    noise_multiplier=privacy.noise_multiplier,
                    sampling_rate=privacy.sampling_rate,
                    steps=done,
                    delta=config.delta,
                )
            meta = {"run": run.identity, "accountant": ledger, "history": raw}
            save_checkpoint(checkpoint_dir, done, *parallel._to_local((params, opt_state)), meta)
        if multi:  # no process runs ahead of the checkpoint (or reads a half-pruned folder)
            multihost_utils.sync_global_devices(f"snapaudit_jax.dpsgd.train: checkpoint {done} saved")

    report_progress = _progress_line if progress is True else (progress or None)
    pending: list = []
    every = max(1, config.steps // 10)
    began = time.perf_counter()
    for t in range(start, stop):
        params, opt_state, metrics = _dp_step(
            run.key, np.int32(t), params, opt_state, run.rest, run.tokens, run.mask, run.hyper,
            graphdef=run.graphdef, spec=run.spec, mesh=run.mesh,
        )
        pending.append(metrics)
        done = t + 1
        if report_progress is not None and (done % every == 0 or done == stop):
            _drain(pending, raw)
            count = raw["batch_size"][-1]
            report_progress({
                "step": done,
                "steps": config.steps,
                "batch_size": count,
                "loss": raw["loss_sum"][-1] / count if count else float("nan"),
                "clipped": raw["clipped"][-1],
                "seconds": time.perf_counter() - began,
            })
        if checkpoint_dir is not None and done < stop and checkpoint_every and done % checkpoint_every == 0:
            save(done)
    if checkpoint_dir is not None and stop > start:
        save(stop)
    _drain(pending, raw)

    report = make_report(
        private=config.private,
        noise_multiplier=privacy.noise_multiplier,
        clip_norm=privacy.clip_norm,
        sampling_rate=privacy.sampling_rate,
        sampling_probability=sampling_probability(privacy.sampling_rate),
        dataset_size=run.spec.num_records,
        steps=stop,
        steps_planned=config.steps,
        delta=config.delta,
        target_epsilon=config.target_epsilon,
        calibration_accountant=config.accountant if config.target_epsilon is not None else None,
        pld_discretization=config.pld_discretization,
        optimizer=config.optimizer,
        learning_rate=config.learning_rate,
        microbatch_size=privacy.microbatch_size,
        tail_microbatch_size=privacy.tail_microbatch_size,
        clipping=run.spec.clipping,
        clipping_reason=run.clipping_reason,
        clipped_sum_dtype=run.spec.sum_dtype,
        layers=run.layers,
        layers_reason=run.layers_reason,
        protected_unit=protected_unit or (PROTECTED_UNIT if run.tokens.ndim == 2 else UNIT_GROUP),
        randomness=RANDOMNESS[randomness],
        noise_coordinates=run.coordinates,
    )
    rest = run.rest
    if multi:  # replicated over every process: this process's copy, usable without the other processes
        params, rest = parallel._to_local((params, rest))
    return unstack_layers(nnx.merge(run.graphdef, params, rest)), _history(raw, stop), report
