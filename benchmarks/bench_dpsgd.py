"""DP-SGD step cost against the non-private step, on every clipping path: time, peak memory, largest batch.

Usage::

    python benchmarks/bench_dpsgd.py [--json] [--out FILE.json] [--layers 2] [--dim 128] [--heads 4] \
        [--seq 64] [--vocab 1024] [--batch 32] [--records 128] [--microbatch M] [--vmap-microbatch 32] \
        [--tail-microbatch T] [--memory-microbatches 8,16,32,64,128,256] [--memory-budget-mb 1024] [--repeats 10] \
        [--seed 0] [--sweep-batches 8,16,32,64,128,256 --sweep-repeats 3] [--skip-torch] [--vocab-chunk ROWS] \
        [--fit-mb MB] [--paths default,per_record,per_record_vmap,book_keeping,ghost]

What is measured
----------------
A small GPT-2 (:class:`snapaudit_jax.models.decoders.GPT2`, float32, ``--layers`` blocks of width
``--dim``, vocabulary ``--vocab``, every parameter trained: full fine-tuning) on ``--records`` synthetic records
of ``--seq`` tokens (random ids, random lengths from ``seq / 2`` to ``seq``, right-padded). One DP-SGD step is:
the Poisson batch at ``q = batch / records`` (expected batch ``--batch``), per-record gradients of the mean
next-token loss, each clipped to L2 norm ``C`` (the median per-record norm at initialisation, so about half are
clipped), summed, Gaussian noise ``sigma C`` (``sigma = 1``) on the sum, division by ``q N``, and an AdamW
update (optax).

* ``nonprivate`` (the baseline of every ratio): one jitted ``jax.value_and_grad`` of the summed per-record
  losses of the *same* batch at its own size (compiled for every batch size before timing, so that it computes
  no record that is not there, as a non-private trainer's fixed batch would not; ``nonprivate_batch_sizes``),
  ``1 / (q N)``, the same AdamW, the batch's loss returned as the DP steps return theirs (the training loss a run
  reports): what the step costs without DP. The DP steps run their batches in microbatches of ``m`` records
  and the remainder in microbatches of ``t`` (``DPSGDConfig.tail_for``: ``m / 4`` from 8 records up, else
  ``m``), the last padded: that padding is the library's and is timed (``tail_microbatch_size`` in the JSON);
* ``default``: the jitted step of :func:`snapaudit_jax.dpsgd.train` as a user gets it: ``clipping = "auto"``
  (book-keeping wherever it covers every parameter, as here; ``clipping`` in the JSON says which path ran) at
  the library's default microbatch (1 on CPU; ``--microbatch`` overrides it);
* ``per_record``: the same step with ``clipping = "per_record"`` (jax_privacy ``clipped_grad`` over fixed-size
  microbatches of ``m`` records in a ``fori_loop`` with a dynamic trip count, masked padding, jax_privacy's
  Gaussian privatizer, optax), called on the same inputs as ``train`` calls it, with the library's default ``m``
  (1 on CPU; ``--microbatch`` overrides it);
* ``per_record_vmap<M>``, ``book_keeping``, ``ghost``: the same step with ``m = --vmap-microbatch`` (default 32,
  the accelerator default) on each clipping path: per-record gradients vectorised with ``vmap``; ghost norms
  and the clipped sum from one forward and one backward (book-keeping); the norms, then a second backward of
  the clip-weighted loss (ghost clipping).

* ``torch_opacus``, ``torch_opacus_ghost``, ``torch_nonprivate`` (unless ``--skip-torch``; torch, transformers,
  peft and opacus installed: the ``bench`` extra): transformers' ``GPT2LMHeadModel`` holding the same weights, on
  the device torch sees, under Opacus's ``PrivacyEngine`` with per-sample gradients by hooks (its functorch
  fallback for GPT-2's ``Conv1D`` projections), with ghost clipping where Opacus allows it (it refuses the tied
  embedding and LM head: ``torch.opacus_ghost_unsupported`` gives its reason), and plain autograd; the same
  batches, clip norm, noise multiplier and AdamW. The positions are passed per record (``position_ids`` of shape
  ``(B, T)``): with transformers' shared ``(1, T)`` row, Opacus's per-sample gradient of the position embedding
  has one sample and its step fails. ``ratios_vs_torch``: ours over Opacus's step, and each torch step over the
  non-private torch step.

Where the run is goes to standard error, a line per phase after the seconds since it began (the oracle, each
variant's compile and check, each timed step, each sweep point, the memory analysis); standard output holds the
table or the JSON alone.

All are compiled first; then the timed steps rotate over the implementations on step ``t``'s batch, for
``t = 1 .. R``. ``median_step_seconds``, ``records_per_s`` (total records over total time),
``cpu_seconds_per_step`` (process CPU time, all threads) and ``peak_rss_delta_mb`` (the largest rise of the
process's peak RSS during a step, the peak reset before each: ``/proc/self/clear_refs``). ``ratios`` are medians
of the per-step time ratios against ``nonprivate`` on the same batch. ``jax_compiles_timed`` counts XLA
compilations during the timed steps (expected 0).

Arithmetic (``matmul_products``): every timed step's matrix products over the timed batches, counted from its
jaxpr (:func:`snapaudit_jax.models.count_matmul_flops`; nothing runs), per variant and for the non-private step:
``flops``, ``tflop_per_step``, ``over_nonprivate`` (what a path adds: the norms' Gram products, ghost clipping's
second backward, a microbatch's padded units), ``achieved_tflop_per_s`` and ``by_operands`` (the shares by operand
dtype and asked precision; ``float32@highest``: full float32 precision, which a GPU runs without its tensor cores).
A time ratio far above ``over_nonprivate`` is the layout's or memory's, not arithmetic.

Memory by the compiler (``memory``): for each microbatch ``m`` of ``--memory-microbatches``, XLA's memory
analysis of the compiled step (``temp + argument + output`` bytes; nothing runs) of every DP path at microbatch
``m`` and of the non-private step at batch ``m``; ``largest_within_budget`` is the largest listed ``m`` within
``--memory-budget-mb`` per variant: how many records a step can take at once.

Vocabulary slices (``--vocab-chunk ROWS``): every JAX step (the non-private one and each DP path) runs the LM
head a slice of ``ROWS`` vocabulary rows at a time (``DPSGDConfig.vocab_chunk``,
:mod:`snapaudit_jax.models.vocab_head`: no ``(records, seq, vocab)`` logits; book-keeping and ghost clipping take
the head's terms from its hidden states and targets). The times, checks and goals are then those of the sliced
steps, and ``memory["whole_logits"]`` holds the same analysis with the logits formed whole, side by side.

Where it fits (``--fit-mb MB``): before its check, each step's plan is compiled and analysed as above; a DP step
whose plan exceeds ``MB`` is not run (``fit["skipped"]``, with every plan's size in ``fit["compiled_mb"]``; its
goals read ``None``), so that a large model is measured on the paths that fit a machine (the vectorised
per-record path holds ``M`` gradients of the whole model at once). The runs that are kept hold their parameters
and optimizer states side by side through the timing: leave room for them. If the non-private step or every DP
step exceeds ``MB``, the run stops before timing with status 1, naming the sizes, and writes nothing.

Some of the variants (``--paths``, of ``default``, ``per_record``, ``per_record_vmap``, ``book_keeping``,
``ghost``; every one by default, and ``paths`` in the JSON): the others are neither compiled nor timed, the memory
analysis covers the clipping paths they name (``per_record`` for either per-record variant), and a goal whose
variant was left out reads ``None``. The non-private baseline always runs.

Batch sweep (``--sweep-batches``): every variant again at each listed expected batch (``q = b / records``; the
DP steps take ``q`` as an argument, so nothing recompiles; the non-private step compiles for the point's batch
sizes before its timing), ``--sweep-repeats`` timed steps each, rotating: ``sweep[b]`` holds the median step
times and the median per-step ratios against the non-private step on the same batch. Each point's torch side is checked as the
main run's is (below), on the point's step 0: a failure there stops the run the same way (status 1, nothing
printed but the error, no ``--out`` file).

Goals (printed and saved; a missed goal does not fail the run): ``book_keeping`` at most 1.25x the non-private
step's time and 1.3x its compiled memory (at ``--vmap-microbatch``), and its largest batch within the budget at
least 3x the vectorised per-record path's (``nonprivate_ratio`` beside it: the non-private step's own largest
batch over the per-record path's, which no clipping path can beat: where a large vocabulary's logits dominate
every step's memory it is below 3).

Correctness check (before timing, at the initial parameters, step 0's batch; float32 products at full precision:
:func:`snapaudit_jax.models.precision.full_float32_precision`): with the noise off, each DP
variant's clipped sum (read back from AdamW's first moment, ``mu = (1 - b1) S / (q N)``) against an independent
per-record loop (one jitted ``value_and_grad`` per record, clipped and summed in NumPy, float64 comparison), and
the non-private gradient against the loop's unclipped sum; Opacus's per-sample gradients summed against autograd's
batched gradient of the same backward pass (and ghost clipping's norms and clipped sum against them, where it runs),
and after one warm-up step every trainable tensor moved. Beyond a relative L2 error of ``1e-4`` the script stops
before timing, exits with status 1 and writes no ``--out`` file. ``torch.parity`` (reported): ours' and the torch
model's per-record losses and gradient norms on step 0's batch, which agree to float32 rounding when the torch
model holds our weights.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import time

import _torch  # noqa: I001  (first: it sets OMP_WAIT_POLICY before anything loads libgomp)
from _common import CLIPPING_PATHS, int_at_least, sweep_batches

PATHS = CLIPPING_PATHS
#: The DP variants a run can time (--paths): ``per_record_vmap`` is the per-record path at --vmap-microbatch.
VARIANT_KINDS = ("default", "per_record", "per_record_vmap", "book_keeping", "ghost")


def positive_mb(text: str) -> float:
    """An argparse type: a finite number of megabytes above 0."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number of MB above 0, got {text}")
    return value


def parse_args(argv=None) -> argparse.Namespace:
    """The command line, checked: a bad flag exits with status 2 naming it (before JAX loads when run as a
    script)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a readable table")
    parser.add_argument("--out", help="also write the JSON object to this file (atomically)")
    parser.add_argument("--layers", type=int_at_least(1), default=2)
    parser.add_argument("--dim", type=int_at_least(8), default=128)
    parser.add_argument("--heads", type=int_at_least(1), default=4)
    parser.add_argument("--seq", type=int_at_least(4), default=64, help="tokens per record")
    parser.add_argument("--vocab", type=int_at_least(2), default=1024)
    parser.add_argument("--batch", type=int_at_least(1), default=32, help="expected (Poisson) batch size")
    parser.add_argument("--records", type=int_at_least(1), default=128, help="dataset size N (q = batch / N)")
    parser.add_argument("--microbatch", type=int_at_least(1), default=None,
                        help="microbatch of the 'ours' variant (default: the library's, 1 on CPU)")
    parser.add_argument("--vmap-microbatch", type=int_at_least(1), default=32,
                        help="microbatch of the vectorised variant 'ours_vmap<M>'")
    parser.add_argument("--tail-microbatch", type=int_at_least(1), default=None,
                        help="microbatch of a batch's remainder on the steps with a set microbatch (at most theirs; "
                             "default: the library's, DPSGDConfig.tail_for; the microbatch itself: one size)")
    parser.add_argument("--memory-microbatches", default="8,16,32,64,128,256",
                        help="microbatches of the compiled-memory analysis, comma-separated")
    parser.add_argument("--memory-budget-mb", type=int_at_least(1), default=1024,
                        help="the budget of 'largest_within_budget' (compiled MB)")
    parser.add_argument("--repeats", type=int_at_least(1), default=10, help="timed steps per implementation")
    parser.add_argument("--sweep-batches", default="",
                        help="also time every variant at these expected batches, comma-separated (each <= --records)")
    parser.add_argument("--sweep-repeats", type=int_at_least(1), default=3, help="timed steps per sweep point")
    parser.add_argument("--seed", type=int_at_least(0), default=0)
    parser.add_argument("--skip-torch", action="store_true", help="no PyTorch / Opacus baseline")
    parser.add_argument("--vocab-chunk", type=int_at_least(1), default=None,
                        help="run every JAX step's LM head a slice of this many vocabulary rows at a time")
    parser.add_argument("--fit-mb", type=positive_mb, default=None,
                        help="run only the steps whose compiled plan (temp + arguments + outputs) is at most this "
                        "many MB; the non-private baseline must fit (default: run every step)")
    parser.add_argument("--paths", default=",".join(VARIANT_KINDS),
                        help="the DP variants to time, comma-separated, of " + ", ".join(VARIANT_KINDS)
                        + " (per_record_vmap: the per-record path at --vmap-microbatch; default: every one)")
    parser.add_argument("--perturb-check", choices=("per_record", "book_keeping", "ghost", "torch", "sweep"),
                        help="scale this variant's checked sum by 1 + 1e-3 (torch: Opacus's; sweep: Opacus's at the "
                        "first sweep point; tests that the check can fail)")
    args = parser.parse_args(argv)
    if args.dim % args.heads:
        parser.error(f"--dim must be a multiple of --heads, got {args.dim} and {args.heads}")
    if args.batch > args.records:
        parser.error(f"--batch must be <= --records, got {args.batch} > {args.records}")
    try:
        args.memory_microbatches = sorted({int(x) for x in args.memory_microbatches.split(",") if x.strip()})
    except ValueError:
        args.memory_microbatches = []
    if not args.memory_microbatches or args.memory_microbatches[0] < 1:
        parser.error("--memory-microbatches must be integers >= 1, comma-separated")
    args.sweep_batches = sweep_batches(parser, args.sweep_batches, args.records)
    text, args.paths = args.paths, [x.strip() for x in args.paths.split(",") if x.strip()]
    if not args.paths or set(args.paths) - set(VARIANT_KINDS) or len(set(args.paths)) < len(args.paths):
        parser.error("--paths must name distinct variants of " + ", ".join(VARIANT_KINDS)
                     + f", comma-separated, got {text!r}")
    if args.perturb_check in PATHS and args.perturb_check not in args.paths:
        parser.error(f"--perturb-check {args.perturb_check} needs that variant in --paths, got "
                     f"{','.join(args.paths)!r}")
    if args.skip_torch and args.perturb_check in ("torch", "sweep"):
        parser.error(f"--perturb-check {args.perturb_check} needs the torch baseline (drop --skip-torch)")
    if args.perturb_check == "sweep" and not args.sweep_batches:
        parser.error("--perturb-check sweep needs --sweep-batches")
    if not args.skip_torch:
        missing = _torch.torch_available()
        if missing:
            parser.error(f"the torch baseline needs {missing}; or pass --skip-torch")
    return args


if __name__ == "__main__":  # the flags first: a bad one is answered before JAX loads
    ARGS = parse_args()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from flax import nnx  # noqa: E402

from _common import CompileCounter, Progress, machine_info, measured, paired_ratio, rotate_steps  # noqa: E402
from snapaudit_jax.utils.io import write_json  # noqa: E402
from snapaudit_jax.models.precision import full_float32_precision  # noqa: E402
from snapaudit_jax.finetune.export import hf_config, hf_tensors  # noqa: E402
from snapaudit_jax.dpsgd import DPSGDConfig, poisson_batch, sequence_losses  # noqa: E402
from snapaudit_jax.dpsgd.sampling import microbatch_calls  # noqa: E402
from snapaudit_jax.dpsgd.train import (  # noqa: E402
    _SAMPLE_STREAM, _dp_step, _path_clipped_sum, _prepare, resolve_layers,
)
from snapaudit_jax.models.flops import count_matmul_flops  # noqa: E402
from snapaudit_jax.models.config import GPT2Config  # noqa: E402
from snapaudit_jax.models.decoders import GPT2, stack_layers  # noqa: E402

SUM_TOL = 1e-4
NOISE_MULTIPLIER, LEARNING_RATE, B1 = 1.0, 1e-3, 0.9
GOALS = {"time_over_nonprivate": 1.25, "memory_over_nonprivate": 1.3, "largest_batch_over_per_record": 3.0}


def make_data(records: int, seq: int, vocab: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, vocab, (records, seq)).astype(np.int32)
    lengths = rng.integers(seq // 2, seq + 1, records)
    mask = np.arange(seq)[None, :] < lengths[:, None]
    return np.where(mask, tokens, 0).astype(np.int32), mask


def step_batches(key, records: int, q: float, steps: int) -> list[np.ndarray]:
    """The record indices of steps ``0 .. steps - 1`` as :func:`snapaudit_jax.dpsgd.train`'s Poisson sampler
    draws them from the run key ``key``: every implementation is timed on these batches."""
    sample_key = jax.random.fold_in(key, _SAMPLE_STREAM)
    return [np.flatnonzero(poisson_batch(sample_key, t, records, q)) for t in range(steps)]


def batch_sizes(batches: list[np.ndarray]) -> list[int]:
    """The distinct sizes of ``batches`` (an empty batch runs as one zero-weight record): the sizes the
    non-private step is compiled for before timing."""
    return sorted({max(1, int(b.size)) for b in batches})


def flat64(tree) -> np.ndarray:
    return np.concatenate([np.ravel(np.asarray(x, np.float64)) for x in jax.tree.leaves(tree)])


def same_layout(model, trainable=nnx.Param):
    """``model`` laid out as ``DPSGDConfig(layers="auto")`` trains it on this backend (stacked under one scan, or
    as it is), so that a baseline built from it runs the DP step's layout and flattens in its order."""
    layers, _ = resolve_layers("auto", model, trainable)
    return stack_layers(model) if layers == "scan" else model


class Loop:
    """The check's oracle: per-record jitted gradients, clipped and summed in NumPy."""

    def __init__(self, model, tokens, mask, *, clip: float):
        graphdef, params, rest = nnx.split(model, nnx.Param, ...)
        self.params = jax.tree.map(jnp.array, params)
        self.tokens, self.mask = tokens, mask
        self.clip = clip

        @jax.jit
        def grad(params, tokens, mask):
            return jax.value_and_grad(lambda p: sequence_losses(nnx.merge(graphdef, p, rest), tokens, mask)[0])(params)

        self.grad = grad

    def clipped_sum(self, params, indices) -> tuple[list[np.ndarray], np.ndarray]:
        """Leaves of ``sum_i clip(g_i)`` (float32 NumPy) and the per-record norms."""
        total, norms = None, []
        for i in indices:
            _, g = self.grad(params, self.tokens[i : i + 1], self.mask[i : i + 1])
            leaves = [np.asarray(x) for x in jax.tree.leaves(jax.device_get(g))]
            norm = float(np.sqrt(sum(np.sum(np.square(x, dtype=np.float64)) for x in leaves)))
            scale = np.float32(min(1.0, self.clip / norm)) if norm > 0 else np.float32(1.0)
            total = [x * scale for x in leaves] if total is None else [t + x * scale for t, x in zip(total, leaves)]
            norms.append(norm)
        if total is None:
            total = [np.zeros(np.shape(x), np.float32) for x in jax.tree.leaves(params)]
        return total, np.asarray(norms)


class NonPrivate:
    """The non-private step of the same model, batch and optimizer: one batched gradient, no clipping, no noise;
    like the DP steps (their metrics) it returns the batch's summed loss, the training loss a run reports.

    It runs each batch at its own size (``pad_to=None``: compiled once per size, :meth:`warm` before timing), as
    a non-private trainer with no Poisson sampling would run its fixed batch: padding it to one size would time
    records that are not there (the Poisson batches of an expected 32 range over about 26 .. 38) and flatter
    every DP step's ratio. ``pad_to``: one padded size instead (zero-weight copies of the first record).
    """

    def __init__(self, model, tokens, mask, *, normaliser: float, pad_to: int | None = None,
                 vocab_chunk: int | None = None):
        graphdef, params, rest = nnx.split(model, nnx.Param, ...)
        self.params = jax.tree.map(jnp.array, params)
        tx = optax.adamw(LEARNING_RATE, b1=B1)
        self.opt_state = tx.init(self.params)
        self.pad_to = pad_to
        scale = 1.0 / normaliser

        def loss_and_grad(params, idx, weight):
            def loss(p):
                losses = sequence_losses(nnx.merge(graphdef, p, rest), tokens[idx], mask[idx],
                                         vocab_chunk=vocab_chunk)
                return jnp.sum(weight * losses)

            return jax.value_and_grad(loss)(params)

        def step(params, opt_state, idx, weight):
            loss, g = loss_and_grad(params, idx, weight)
            updates, opt_state = tx.update(jax.tree.map(lambda x: x * scale, g), opt_state, params)
            return optax.apply_updates(params, updates), opt_state, loss

        self.grad = jax.jit(lambda params, idx, weight: loss_and_grad(params, idx, weight)[1])
        self._step = jax.jit(step, donate_argnums=(0, 1))

    def padded(self, indices: np.ndarray, size: int | None = None) -> tuple[jax.Array, jax.Array]:
        """Indices padded to ``size`` (default ``pad_to``; with neither, the batch's own size, at least 1) with
        copies of the first record, and their 0/1 weights."""
        size = size if size is not None else self.pad_to if self.pad_to is not None else max(1, indices.size)
        if indices.size > size:
            raise RuntimeError(f"a Poisson batch of {indices.size} records exceeds the padded size {size}")
        idx = np.full(size, indices[0] if indices.size else 0, np.int32)
        idx[: indices.size] = indices
        return jnp.asarray(idx), jnp.asarray(np.arange(size) < indices.size, jnp.float32)

    def step(self, indices: np.ndarray) -> None:
        self.params, self.opt_state, loss = self._step(self.params, self.opt_state, *self.padded(indices))
        jax.block_until_ready((self.params, loss))

    def warm(self, batches: list[np.ndarray]) -> list[int]:
        """One step at every size of ``batches`` (compiling each), so that no timed step compiles; the sizes."""
        sizes = [self.pad_to] if self.pad_to is not None else batch_sizes(batches)
        for size in sizes:
            self.step(next((b for b in batches if max(1, b.size) == size), batches[0]))
        return sizes

    def compiled_bytes(self, batch: int) -> int:
        """XLA's memory analysis of the step at batch ``batch`` (temp + argument + output bytes; nothing runs)."""
        idx, weight = self.padded(np.zeros(1, np.int64), batch)
        return _bytes(self._step.lower(self.params, self.opt_state, idx, weight).compile())

    def matmul_flops(self, batch: int):
        """:func:`~snapaudit_jax.models.flops.count_matmul_flops` of the step at batch ``batch`` (nothing runs)."""
        idx, weight = self.padded(np.zeros(1, np.int64), batch)
        return count_matmul_flops(self._step, shapes(self.params), shapes(self.opt_state), idx, weight)


def _bytes(compiled) -> int:
    analysis = compiled.memory_analysis()
    return int(analysis.temp_size_in_bytes + analysis.argument_size_in_bytes + analysis.output_size_in_bytes)


def shapes(tree):
    """``tree`` with every array replaced by its shape and dtype: enough to lower and analyse a step, holding
    nothing."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)


def dp_compiled_bytes(run) -> int:
    """XLA's memory analysis of a prepared DP step (:func:`snapaudit_jax.dpsgd.train`'s ``_dp_step``)."""
    return _bytes(_dp_step.lower(run.key, np.int32(0), run.params, run.opt_state, run.rest, run.tokens, run.mask,
                                 run.hyper, graphdef=run.graphdef, spec=run.spec).compile())


def microbatch_flops(run, units: int):
    """:func:`~snapaudit_jax.models.flops.count_matmul_flops` of one call of a prepared DP step's clipped sum over
    ``units`` units: its clipping path, head and operands, exactly as the step's microbatch loop calls it."""
    spec = run.spec

    def call(params, tokens, mask, padding):
        return _path_clipped_sum(spec.clipping, run.graphdef, params, run.rest, tokens, mask, padding,
                                 jnp.float32(1.0), vocab_chunk=spec.vocab_chunk, sum_dtype=spec.sum_dtype)

    return count_matmul_flops(call, shapes(run.params),
                              jax.ShapeDtypeStruct((units, *run.tokens.shape[1:]), run.tokens.dtype),
                              jax.ShapeDtypeStruct((units, *run.mask.shape[1:]), run.mask.dtype),
                              jax.ShapeDtypeStruct((units,), jnp.bool_))


def summed_flops(counts) -> tuple[int, dict[str, int]]:
    """``(total, by_operands)`` of ``counts``, pairs ``(times, MatmulCount)``: each count taken ``times`` times."""
    total, by_operands = 0, {}
    for times, count in counts:
        total += times * count.total
        for key, value in count.by_operands.items():
            by_operands[key] = by_operands.get(key, 0) + times * value
    return total, by_operands


def batch_flops(count, sizes: list[int]) -> tuple[int, dict[str, int]]:
    """:func:`summed_flops` of a step counted by ``count(size)`` over batches of ``sizes`` records, each distinct
    size counted once."""
    per = {size: count(size) for size in set(sizes)}
    return summed_flops((1, per[size]) for size in sizes)


def dp_step_flops(run, sizes: list[int]) -> tuple[int, dict[str, int]]:
    """The matrix-product operations of a prepared DP step over batches of ``sizes`` units: ``(total,
    by_operands)``, each batch's microbatch calls (:func:`~snapaudit_jax.dpsgd.sampling.microbatch_calls`: the padded
    units of its last calls are computed, and counted) times one call's count. The noise and the optimizer
    multiply no matrices."""
    m = run.spec.microbatch_size
    t = run.spec.tail_size or m
    per = {k: microbatch_flops(run, k) for k in {m, t}}
    calls = [microbatch_calls(size, m, t) for size in sizes]
    return summed_flops(pair for full, rest in calls for pair in ((full, per[m]), (rest if t < m else 0, per[t])))


def products_table(counted: dict, sizes: list[int], wall: dict, base: str, ratio_name: str) -> dict:
    """Per step of ``counted`` (``{name: (total, by_operands)}`` over the timed batches of ``sizes``): ``flops``,
    ``tflop_per_step``, ``ratio_name`` (over ``base``'s), ``achieved_tflop_per_s`` (over the summed step times
    ``wall``) and ``by_operands`` (each operand dtype and asked precision's share)."""
    return {name: {"flops": total, "tflop_per_step": round(total / len(sizes) / 1e12, 6),
                   ratio_name: round(total / counted[base][0], 4),
                   "achieved_tflop_per_s": round(total / sum(wall[name]) / 1e12, 4),
                   "by_operands": {k: round(v / total, 4) for k, v in sorted(by.items())}}
            for name, (total, by) in counted.items()}


def ours_step(run, t, params, opt_state, hyper):
    """One call of the jitted step of :func:`snapaudit_jax.dpsgd.train`, exactly as ``train`` makes it."""
    out = _dp_step(run.key, np.int32(t), params, opt_state, run.rest, run.tokens, run.mask, hyper,
                   graphdef=run.graphdef, spec=run.spec)
    jax.block_until_ready(out)
    return out


def noise_draw(params, seed: int, repeats: int) -> dict:
    """One step's noise on a tree shaped like ``params`` (arrays or their shapes), timed apart: ours (exact in its
    tails) beside jax_privacy's.

    Both are jitted ``update`` calls of the optax privatizer on a tree of zeros shaped like ``params``, each
    compiled before timing; the median of ``repeats`` calls after one warm-up.
    """
    from jax_privacy import noise_addition

    from snapaudit_jax.dpsgd import gaussian_privatizer

    tree = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), params)
    out = {"coordinates": int(sum(x.size for x in jax.tree.leaves(tree)))}
    for name, tx in (("ours_seconds", gaussian_privatizer(1.0, jax.random.key(seed))),
                     ("jax_privacy_seconds", noise_addition.gaussian_privatizer(stddev=1.0,
                                                                                prng_key=jax.random.key(seed)))):
        update, state = jax.jit(tx.update), tx.init(tree)
        noisy, state = update(tree, state)
        jax.block_until_ready(noisy)
        times = []
        for _ in range(max(1, repeats)):
            began = time.perf_counter()
            noisy, state = update(tree, state)
            jax.block_until_ready(noisy)
            times.append(time.perf_counter() - began)
        out[name] = round(statistics.median(times), 4)
    out["ratio"] = round(out["ours_seconds"] / out["jax_privacy_seconds"], 3)
    return out


def dp_config(args, q: float, clip: float, path: str, micro: int | None, steps: int,
              layers: str = "auto", vocab_chunk: int | None | str = "args") -> DPSGDConfig:
    """The timed DP step's configuration: ``clip``, ``sigma = NOISE_MULTIPLIER``, AdamW, ``path`` at ``micro``
    (the remainder's microbatch ``--tail-microbatch`` where set, at most ``micro``; else the library's), the blocks
    laid out as ``layers``, the head sliced as ``--vocab-chunk`` (or ``vocab_chunk``)."""
    tail = getattr(args, "tail_microbatch", None)
    return DPSGDConfig(steps=steps, learning_rate=LEARNING_RATE, clip_norm=clip, noise_multiplier=NOISE_MULTIPLIER,
                       delta=1e-5, sampling_rate=q, optimizer="adamw", b1=B1, microbatch_size=micro, clipping=path,
                       tail_microbatch_size=min(tail, micro) if tail is not None and micro is not None else None,
                       layers=layers,
                       vocab_chunk=getattr(args, "vocab_chunk", None) if vocab_chunk == "args" else vocab_chunk)


def torch_gpt2(model, cfg: GPT2Config):
    """A transformers ``GPT2LMHeadModel`` (float32, tied head, every parameter trainable) holding ``model``'s
    weights: the Opacus side's model."""
    import torch
    import transformers

    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(**hf_config(cfg)))
    tensors = {k: torch.from_numpy(np.array(v)) for k, v in hf_tensors(model).items()}
    missing, unexpected = hf.load_state_dict(tensors, strict=False)
    if unexpected or set(missing) - {"lm_head.weight"}:
        raise RuntimeError(f"torch model: missing {missing}, unexpected {unexpected}")
    return hf.float()


def torch_side(args, model, cfg, data, q: float, batches: list, clip: float):
    """The Opacus (hooks, ghost where Opacus allows it) and non-private torch steps on ``batches``."""
    import torch

    torch.manual_seed(args.seed)
    return _torch.Torch(lambda: torch_gpt2(model, cfg), data, q=q, batches=batches, clip=clip,
                        noise_multiplier=NOISE_MULTIPLIER, learning_rate=LEARNING_RATE, b1=B1,
                        loader_batch=max(1, round(q * data[0].shape[0])))


def torch_names(side) -> dict[str, str]:
    """``{variant name: the torch side's step kind}``."""
    return {TORCH_LABELS[kind]: kind for kind in side.kinds()}


TORCH_LABELS = {"dp": "torch_opacus", "ghost": "torch_opacus_ghost", "nonprivate": "torch_nonprivate"}


def benchmark(args) -> dict:
    cfg = GPT2Config(
        vocab_size=args.vocab, n_positions=args.seq, n_embd=args.dim, n_layer=args.layers, n_head=args.heads,
        n_inner=4 * args.dim,
    )
    model = GPT2(cfg, rngs=nnx.Rngs(args.seed))
    data = make_data(args.records, args.seq, args.vocab, args.seed)
    tokens, mask = jnp.asarray(data[0]), jnp.asarray(data[1])
    q = args.batch / args.records
    key = jax.random.key(args.seed)
    batches = step_batches(key, args.records, q, args.repeats + 1)
    largest = max(batch_sizes(batches))

    say = getattr(args, "progress", None) or (lambda message: None)
    say(f"the check's oracle: {batches[0].size} per-record gradients, one at a time")
    loop = Loop(model, tokens, mask, clip=np.inf)
    initial = shapes(loop.params)
    num_params = int(sum(x.size for x in jax.tree.leaves(initial)))
    # The unclipped sum (the non-private gradient's oracle) and the per-record norms at initialisation; the clip
    # norm is their median.
    with full_float32_precision():
        leaves, norms = loop.clipped_sum(loop.params, batches[0])
        unclipped = np.concatenate([np.ravel(x.astype(np.float64)) for x in leaves])
        clip = loop.clip = float(np.median(norms))
        loop_sum = np.concatenate([np.ravel(x.astype(np.float64))
                                   for x in loop.clipped_sum(loop.params, batches[0])[0]])
    del loop, leaves  # the oracle's parameters and float32 sum

    nonprivate = NonPrivate(same_layout(model), tokens, mask, normaliser=args.records * q,
                            vocab_chunk=args.vocab_chunk)
    # Where it fits (--fit-mb): a step whose compiled plan alone exceeds the limit is not run (the vectorised
    # per-record path holds M gradients of the whole model at once); the baseline must fit.
    fit = {"limit_mb": args.fit_mb, "compiled_mb": {}, "skipped": []}
    if args.fit_mb is not None:
        fit["compiled_mb"]["nonprivate"] = round(nonprivate.compiled_bytes(largest) / 2**20, 2)
        if fit["compiled_mb"]["nonprivate"] > args.fit_mb:
            return {"fit": fit, "nothing_fits": "nonprivate"}
    start = time.perf_counter()
    with full_float32_precision():
        batched = flat64(nonprivate.grad(nonprivate.params, *nonprivate.padded(batches[0])))
    compile_s = {"nonprivate": round(time.perf_counter() - start, 2)}
    rel_err = {"nonprivate": float(np.linalg.norm(batched - unclipped) / np.linalg.norm(unclipped))}
    every = {"default": ("default", "auto", args.microbatch),
             "per_record": ("per_record", "per_record", args.microbatch),
             f"per_record_vmap{args.vmap_microbatch}": ("per_record_vmap", "per_record", args.vmap_microbatch),
             "book_keeping": ("book_keeping", "book_keeping", args.vmap_microbatch),
             "ghost": ("ghost", "ghost", args.vmap_microbatch)}
    variants = {name: (path, micro) for name, (kind, path, micro) in every.items() if kind in args.paths}
    runs = {}
    for name, (path, micro) in variants.items():
        say(f"{name}: compile and check")
        run = _prepare(model, data, dp_config(args, q, clip, path, micro, args.repeats + 1), key)
        start = time.perf_counter()  # the compile: in the plan's analysis (it is reused) or in the first call
        if args.fit_mb is not None:
            fit["compiled_mb"][name] = round(dp_compiled_bytes(run) / 2**20, 2)
            if fit["compiled_mb"][name] > args.fit_mb:
                fit["skipped"].append(name)
                continue
        runs[name] = run
        # Check (and compile): step 0 with the noise off; AdamW's first moment is (1 - b1) S / (q N).
        params0, opt0 = jax.tree.map(jnp.array, run.params), jax.tree.map(jnp.array, run.opt_state)
        with full_float32_precision():
            _, opt_after, metrics = ours_step(run, 0, params0, opt0, run.hyper._replace(noise_std=jnp.float32(0.0)))
        compile_s[name] = round(time.perf_counter() - start, 2)
        if int(metrics["batch_size"]) != batches[0].size:
            raise RuntimeError(f"{name}: step 0 batch has {int(metrics['batch_size'])} records, not {batches[0].size}")
        ours_sum = flat64(optax.tree_utils.tree_get(opt_after, "mu")) * (args.records * q) / (1.0 - B1)
        if name == args.perturb_check:  # the check's power: a sum off by 1e-3 must fail it
            ours_sum = ours_sum * (1.0 + 1e-3)
        rel_err[name] = float(np.linalg.norm(ours_sum - loop_sum) / np.linalg.norm(loop_sum))
        del ours_sum, params0, opt0, opt_after
    del unclipped, batched, loop_sum  # float64 copies of the whole model: not held through the timing
    if not runs:
        return {"fit": fit, "nothing_fits": "every DP variant"}

    torch_info, parity, ts, torch_steps = None, {}, None, {}
    if not args.skip_torch:  # main() checked that it imports
        threads = _torch.configure(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                                   else os.cpu_count())
        ts = torch_side(args, model, cfg, data, q, batches, clip)
        check = ts.check(perturb=args.perturb_check == "torch")
        rel_err.update(_torch.check_errors(check, ts.ghost_unsupported))
        with full_float32_precision():
            ours_losses = np.asarray(sequence_losses(model, tokens[batches[0]], mask[batches[0]]), np.float64)
        # The two frameworks hold the same weights: the same per-record losses and gradient norms (float32 apart)
        parity = {"loss_max_abs_diff": float(np.max(np.abs(ours_losses - check["losses"]))),
                  "record_grad_norms_rel_error": float(np.linalg.norm(check["norms"] - norms) / np.linalg.norm(norms))}
        compile_s["torch"] = ts.start()
        torch_steps = torch_names(ts)
        torch_info = {**_torch.versions(), "device": str(ts.device), "threads": threads,
                      "opacus_setup": _torch.OPACUS_SETUP, "opacus_ghost_setup": _torch.OPACUS_GHOST_SETUP,
                      "opacus_ghost_unsupported": ts.ghost_unsupported, "updates_ok": ts.moved_ok,
                      "opacus_notes": ("transformers' GPT2LMHeadModel holding our weights (its Conv1D projections: "
                                       "Opacus's functorch fallback computes their per-sample gradients); the tied "
                                       "embedding / LM head weight accumulates both modules' grad samples")}

    if _failed(rel_err, torch_info is None or torch_info["updates_ok"]):
        return {"check_rel_error": rel_err, "checks_failed": True,
                "torch": {"skipped": True} if torch_info is None else {"skipped": False, **torch_info}}

    say("warm-up: one step of every variant")
    nonprivate_sizes = nonprivate.warm(batches[1:])  # compiles the step for every timed batch size
    state = {name: ours_step(run, 0, run.params, run.opt_state, run.hyper)[:2] for name, run in runs.items()}
    names = [*runs, "nonprivate", *torch_steps]
    wall, cpu, peak = ({name: [] for name in names} for _ in range(3))
    sizes = [int(b.size) for b in batches[1:]]

    def step(name, t):
        if name == "nonprivate":
            nonprivate.step(batches[t])
            return
        if name in torch_steps:
            ts.step(torch_steps[name], t)
            return
        params, opt_state, metrics = ours_step(runs[name], t, *state[name], runs[name].hyper)
        state[name] = params, opt_state
        if int(metrics["batch_size"]) != batches[t].size:
            raise RuntimeError(f"{name}: step {t} batch differs from poisson_batch")

    with CompileCounter() as compiles:
        for t in range(1, args.repeats + 1):
            say(f"timed step {t} of {args.repeats}: {len(names)} variants")
            shift = (t - 1) % len(names)  # the order rotates: no variant always follows the same one
            for name in names[shift:] + names[:shift]:
                seconds, cpu_s, rise = measured(lambda: step(name, t))  # noqa: B023
                wall[name].append(seconds)
                cpu[name].append(cpu_s)
                peak[name].append(rise)

    def rates(name):
        times, rises = wall[name], [r for r in peak[name] if r is not None]
        return {
            "median_step_seconds": round(statistics.median(times), 4),
            "records_per_s": round(sum(sizes) / sum(times), 1),
            "cpu_seconds_per_step": round(sum(cpu[name]) / len(times), 4),
            "peak_rss_delta_mb": round(max(rises), 1) if rises else None,
            "step_seconds": [round(x, 4) for x in times],
        }

    ratio = functools.partial(paired_ratio, wall)
    ratios = {name: ratio(name, "nonprivate") for name in runs}
    say("matrix products: every timed step's, from its jaxpr")
    products = matmul_products(runs, nonprivate, sizes, wall)
    ratios_torch = {}
    if torch_steps:
        ratios_torch = {f"{name}_over_opacus": ratio(name, "torch_opacus") for name in [*runs, "nonprivate"]}
        ratios_torch["opacus_over_torch_nonprivate"] = ratio("torch_opacus", "torch_nonprivate")
        if "torch_opacus_ghost" in torch_steps:
            ratios_torch["opacus_ghost_over_torch_nonprivate"] = ratio("torch_opacus_ghost", "torch_nonprivate")
        ratios_torch["nonprivate_over_torch_nonprivate"] = ratio("nonprivate", "torch_nonprivate")
    sweep = {}
    for b in args.sweep_batches:
        say(f"sweep: expected batch {b}")
        point = sweep[str(b)] = sweep_point(args, model, cfg, data, key, clip,
                                            {name: variants[name] for name in runs}, b)
        point_errors = {f"sweep {b}: {name}": err for name, err in point.get("check_rel_error", {}).items()}
        if _failed(point_errors, point.get("updates_ok", True)):
            # a point whose Opacus step is wrong stops the run as the main run's check does: no table, no file
            return {"check_rel_error": {**rel_err, **point_errors}, "checks_failed": True,
                    "torch": {"skipped": False, **torch_info, "updates_ok": point["updates_ok"]}}

    # The timed states are done with: the plans below are analysed from their shapes, so that a large model's
    # parameters and optimizer states (one set a variant) do not sit beside every compile.
    state.clear()
    runs = {name: run._replace(params=shapes(run.params), opt_state=shapes(run.opt_state))
            for name, run in runs.items()}
    nonprivate.params, nonprivate.opt_state = shapes(nonprivate.params), shapes(nonprivate.opt_state)
    say("memory: XLA's analysis of every step's plan")
    analysed = [path for path in PATHS if path in {p for p, _ in variants.values()}]  # ("auto": one of them)
    # Memory by the compiler: every DP path at each microbatch, the non-private step at that batch (and, with
    # sliced heads, the same with the logits formed whole).
    memory = {"microbatches": list(args.memory_microbatches), "budget_mb": args.memory_budget_mb,
              "vocab_chunk": args.vocab_chunk,
              **compiled_memory(args, model, data, key, q, clip, nonprivate, args.vocab_chunk, analysed)}
    if args.vocab_chunk is not None:
        whole = NonPrivate(same_layout(model), tokens, mask, normaliser=args.records * q)
        whole.params, whole.opt_state = shapes(whole.params), shapes(whole.opt_state)
        memory["whole_logits"] = compiled_memory(args, model, data, key, q, clip, whole, None, analysed)
    at = args.vmap_microbatch
    at_mb = {name: fit["compiled_mb"].get(name) or round(dp_compiled_bytes(run) / 2**20, 2)
             for name, run in runs.items() if run.spec.microbatch_size == at}
    at_mb["nonprivate"] = round(nonprivate.compiled_bytes(at) / 2**20, 2)
    memory[f"compiled_mb_at_{at}"] = at_mb

    largest = memory["largest_within_budget"]  # (a path left out by --paths: not analysed, its goals None)
    batch_ratio = (None if not largest.get("per_record") or largest.get("book_keeping") is None
                   else round(largest["book_keeping"] / largest["per_record"], 2))
    # What no clipping path can beat: the non-private step's own largest batch over the per-record path's (when
    # the logits of a large vocabulary dominate every step's memory, it is below the goal's 3x).
    ceiling = (None if not largest.get("per_record") or largest["nonprivate"] is None
               else round(largest["nonprivate"] / largest["per_record"], 2))
    memory_ratio = (round(at_mb["book_keeping"] / at_mb["nonprivate"], 3) if "book_keeping" in at_mb
                    else None)

    def at_most(ratio, limit):  # None: the variant did not fit (--fit-mb), so the goal was not measured
        return {"limit": limit, "ratio": ratio, "met": None if ratio is None else ratio <= limit}

    goals = {
        "book_keeping_time": at_most(ratios.get("book_keeping"), GOALS["time_over_nonprivate"]),
        # the same limit for the step users get: clipping = "auto" at the backend's default microbatch
        "default_time": {**at_most(ratios.get("default"), GOALS["time_over_nonprivate"]),
                         "clipping": runs["default"].spec.clipping if "default" in runs else None,
                         "microbatch": runs["default"].spec.microbatch_size if "default" in runs else None},
        "book_keeping_memory": at_most(memory_ratio, GOALS["memory_over_nonprivate"]),
        "book_keeping_largest_batch": {"limit": GOALS["largest_batch_over_per_record"], "ratio": batch_ratio,
                                       "met": None if batch_ratio is None
                                       else batch_ratio >= GOALS["largest_batch_over_per_record"],
                                       "nonprivate_ratio": ceiling},
    }
    return {
        "model": {"kind": "GPT2", "layers": args.layers, "dim": args.dim, "heads": args.heads, "seq": args.seq,
                  "vocab": args.vocab, "vocab_chunk": args.vocab_chunk, "parameters": num_params,
                  "trained": "every parameter (full fine-tuning)"},
        "records": args.records, "expected_batch": args.batch, "sampling_rate": q, "batch_sizes": sizes,
        "paths": list(args.paths),
        "nonprivate_batch_sizes": nonprivate_sizes,
        "microbatch_size": {name: run.spec.microbatch_size for name, run in runs.items()},
        "tail_microbatch_size": {name: run.spec.tail_size for name, run in runs.items()},
        "clipping": {name: run.spec.clipping for name, run in runs.items()},
        "clip_norm": clip, "clipped_fraction_step0": float(np.mean(norms > clip)),
        "noise_multiplier": NOISE_MULTIPLIER, "optimizer": "adamw", "repeats": args.repeats,
        "variants": {name: rates(name) for name in names}, "ratios_over_nonprivate": ratios,
        "matmul_products": products,
        "ratios_vs_torch": ratios_torch, "memory": memory, "goals": goals, "fit": fit, "check_rel_error": rel_err,
        "torch": {"skipped": True} if torch_info is None else {"skipped": False, **torch_info, "parity": parity},
        "compile_seconds": compile_s,
        "jax_compiles_timed": compiles.count + sum(point["jax_compiles_timed"] for point in sweep.values()),
        "sweep": sweep,
        "noise_draw": noise_draw(initial, args.seed, args.repeats),
    }


def matmul_products(runs: dict, nonprivate: NonPrivate, sizes: list[int], wall: dict) -> dict:
    """Every timed step's matrix products over the timed batches of ``sizes`` records, counted from the jaxprs
    (:func:`~snapaudit_jax.models.flops.count_matmul_flops`; nothing runs): per variant and the non-private step
    (each batch at its own size, as it runs), ``flops`` (over the timed steps), ``tflop_per_step``,
    ``over_nonprivate`` (the arithmetic a path adds: norms' Gram products, a second backward, padded units),
    ``achieved_tflop_per_s`` (over the summed step times ``wall``) and ``by_operands`` (each operand dtype and asked
    precision's share)."""
    counted = {"nonprivate": batch_flops(lambda size: nonprivate.matmul_flops(max(1, size)), sizes)}  # as it runs
    counted.update({name: dp_step_flops(run, sizes) for name, run in runs.items()})
    return products_table(counted, sizes, wall, "nonprivate", "over_nonprivate")


def compiled_memory(args, model, data, key, q: float, clip: float, nonprivate: NonPrivate,
                    vocab_chunk: int | None, paths: list[str]) -> dict:
    """``{"compiled_mb": {variant: [MB at each --memory-microbatches]}, "largest_within_budget": {variant: m}}``:
    XLA's memory analysis of each clipping path of ``paths`` (those of the variants ``--paths`` times) at
    microbatch ``m`` (its head sliced as ``vocab_chunk``) and of ``nonprivate``'s step at batch ``m``."""
    compiled = {"nonprivate": [], **{path: [] for path in paths}}
    for m in args.memory_microbatches:
        compiled["nonprivate"].append(round(nonprivate.compiled_bytes(m) / 2**20, 2))
        for path in paths:
            run = _prepare(model, data, dp_config(args, q, clip, path, m, 1, vocab_chunk=vocab_chunk), key)
            run = run._replace(params=shapes(run.params), opt_state=shapes(run.opt_state))
            compiled[path].append(round(dp_compiled_bytes(run) / 2**20, 2))
    largest = {name: max((m for m, mb in zip(args.memory_microbatches, mbs) if mb <= args.memory_budget_mb),
                         default=None) for name, mbs in compiled.items()}
    return {"compiled_mb": compiled, "largest_within_budget": largest}


def _failed(errors: dict[str, float], updates_ok: bool) -> bool:
    """Whether a check failed: a relative error over :data:`SUM_TOL`, or an Opacus step that left a trainable tensor
    unchanged."""
    return not max(errors.values(), default=0.0) <= SUM_TOL or not updates_ok


def sweep_point(args, model, cfg, data, key, clip: float, variants: dict, batch: int) -> dict:
    """Every variant's step time at expected batch ``batch`` (``q = batch / records``), side by side.

    The DP steps take ``q`` as a traced argument (nothing recompiles); the non-private step compiles for the point's
    batch sizes before timing; the torch steps (unless ``--skip-torch``) run on fresh modules, checked
    and warmed up on the point's step 0. ``--sweep-repeats`` timed steps, the order rotating.
    """
    records = args.records
    q = batch / records
    batches = step_batches(key, records, q, args.sweep_repeats + 1)
    nonprivate = NonPrivate(same_layout(model), jnp.asarray(data[0]), jnp.asarray(data[1]), normaliser=records * q,
                            vocab_chunk=args.vocab_chunk)
    sizes = nonprivate.warm(batches[1:])
    runs, state = {}, {}
    for name, (path, micro) in variants.items():
        run = runs[name] = _prepare(model, data, dp_config(args, q, clip, path, micro, args.sweep_repeats + 1), key)
        state[name] = ours_step(run, 0, run.params, run.opt_state, run.hyper)[:2]
    torch_steps, checks = {}, {}
    if not args.skip_torch:
        ts = torch_side(args, model, cfg, data, q, batches, clip)
        first = batch == args.sweep_batches[0]
        checks = _torch.check_errors(ts.check(perturb=args.perturb_check == "sweep" and first), ts.ghost_unsupported)
        ts.start()
        torch_steps = {name: functools.partial(ts.step, kind) for name, kind in torch_names(ts).items()}
    wall, compiled = rotate(runs, state, nonprivate, batches, args.sweep_repeats, torch_steps)
    ratio = functools.partial(paired_ratio, wall)

    point = {
        "sampling_rate": q, "batch_sizes": [int(b.size) for b in batches[1:]], "nonprivate_batch_sizes": sizes,
        "median_step_seconds": {name: round(statistics.median(w), 4) for name, w in wall.items()},
        "ratios_over_nonprivate": {name: ratio(name, "nonprivate") for name in runs},
        "jax_compiles_timed": compiled,
    }
    if torch_steps:
        point["ratios_vs_torch"] = {
            **{f"{name}_over_opacus": ratio(name, "torch_opacus") for name in [*runs, "nonprivate"]},
            **{f"{name.removeprefix('torch_')}_over_torch_nonprivate": ratio(name, "torch_nonprivate")
               for name in torch_steps if name != "torch_nonprivate"}}
        point["check_rel_error"] = checks
        point["updates_ok"] = ts.moved_ok
    return point


def rotate(runs: dict, state: dict, nonprivate: NonPrivate, batches: list, repeats: int,
           others: dict | None = None) -> tuple[dict, int]:
    """Times steps ``1 .. repeats`` of every DP run (continuing from ``state``, updated), the non-private step and
    ``others`` (``{name: step(t)}``, the torch side's), on step ``t``'s batch, the order rotating from step to step
    (no variant always follows the same one).

    Returns:
      ``({name: [wall seconds per step]}, XLA compilations during the timed steps)``.
    """
    def dp_step(name, t):
        params, opt_state, metrics = ours_step(runs[name], t, *state[name], runs[name].hyper)
        state[name] = params, opt_state
        if int(metrics["batch_size"]) != batches[t].size:
            raise RuntimeError(f"{name}: step {t}'s batch differs from poisson_batch")

    steps = {name: functools.partial(dp_step, name) for name in runs}
    steps["nonprivate"] = lambda t: nonprivate.step(batches[t])
    return rotate_steps({**steps, **(others or {})}, repeats)


def readable(r: dict) -> str:
    m = r["model"]
    head = (
        f"GPT-2 {m['layers']} layers x {m['dim']} dim, vocab {m['vocab']}, seq {m['seq']} ({m['parameters']:,} "
        f"params, full fine-tuning) | N={r['records']}, Poisson q={r['sampling_rate']:.4g} (expected batch "
        f"{r['expected_batch']}, realised {min(r['batch_sizes'])}..{max(r['batch_sizes'])}), C={r['clip_norm']:.4g}, "
        f"sigma={r['noise_multiplier']:g}, AdamW"
    )
    rows = [("", "microbatch", "records/s", "median step s", "CPU s/step", "peak RSS +MB", "vs its non-private",
             "products vs it")]
    vs_torch = r["ratios_vs_torch"]
    for name, x in r["variants"].items():
        micro = str(r["microbatch_size"].get(name, "batch"))
        tail = r.get("tail_microbatch_size", {}).get(name)
        if tail is not None and str(tail) != micro:
            micro += f" (rest {tail})"
        if name.startswith("torch_"):
            micro = "batch"
            own = vs_torch.get(f"{name.removeprefix('torch_')}_over_torch_nonprivate")
            ratio = "1" if own is None else f"{own:.2f}x"
        else:
            ratio = "1" if name == "nonprivate" else f"{r['ratios_over_nonprivate'][name]:.2f}x"
        counted = r.get("matmul_products", {}).get(name)
        rows.append((name, micro, f"{x['records_per_s']:.1f}", f"{x['median_step_seconds']:.4f}",
                     f"{x['cpu_seconds_per_step']:.3f}", str(x["peak_rss_delta_mb"]), ratio,
                     "" if counted is None else f"{counted['over_nonprivate']:.3f}x"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    table = "\n".join("  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in rows)
    mem = r["memory"]
    sliced = "" if mem.get("vocab_chunk") is None else f" (head in slices of {mem['vocab_chunk']} rows)"
    mem_rows = [(f"compiled MB at microbatch{sliced}", *map(str, mem["microbatches"]),
                 f"largest <= {mem['budget_mb']} MB")]
    for name, mbs in mem["compiled_mb"].items():
        mem_rows.append((name, *map(str, mbs), str(mem["largest_within_budget"][name])))
    for name, mbs in mem.get("whole_logits", {}).get("compiled_mb", {}).items():
        largest = mem["whole_logits"]["largest_within_budget"][name]
        mem_rows.append((f"{name} (whole logits)", *map(str, mbs), str(largest)))
    widths = [max(len(row[i]) for row in mem_rows) for i in range(len(mem_rows[0]))]
    mem_table = "\n".join("  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in mem_rows)
    goals = "; ".join(f"{name} {g['ratio']} (limit {g['limit']:g}, "
                      + {True: "met", False: "missed", None: "n/a"}[g["met"]]
                      + (f"; the non-private step's own ratio {g['nonprivate_ratio']}" if "nonprivate_ratio" in g
                         else "") + ")"
                      for name, g in r["goals"].items())
    if r["sweep"]:
        sweep_rows = [("time vs non-private at expected batch", *r["sweep"])]
        for name in next(iter(r["sweep"].values()))["ratios_over_nonprivate"]:
            sweep_rows.append((name, *(f"{p['ratios_over_nonprivate'][name]:.2f}x" for p in r["sweep"].values())))
        for name in next(iter(r["sweep"].values())).get("ratios_vs_torch", {}):
            sweep_rows.append((name, *(f"{p['ratios_vs_torch'][name]:.2f}x" for p in r["sweep"].values())))
        sweep_rows.append(("nonprivate step s", *(f"{p['median_step_seconds']['nonprivate']:.4f}"
                                                   for p in r["sweep"].values())))
        widths = [max(len(row[i]) for row in sweep_rows) for i in range(len(sweep_rows[0]))]
        mem_table += "\n" + "\n".join("  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in sweep_rows)
    errors = ", ".join(f"{name} {err:.1e}" for name, err in r["check_rel_error"].items())
    if vs_torch:
        t = r["torch"]
        goals += ("\ntorch (Opacus " + t["opacus"] + f", {t['device']}): "
                  + ", ".join(f"{k} {v:.2f}x" for k, v in vs_torch.items())
                  + f"; parity: per-record losses within {t['parity']['loss_max_abs_diff']:.1e}, gradient norms "
                  f"{t['parity']['record_grad_norms_rel_error']:.1e} relative"
                  + (f"; Opacus ghost clipping: {t['opacus_ghost_unsupported']}" if t["opacus_ghost_unsupported"]
                     else ""))
    d = r["noise_draw"]
    tail = (
        f"noise draw, timed apart: {d['coordinates']:,} coordinates {d['ours_seconds']:.3g} s (jax_privacy's "
        f"jax.random.normal {d['jax_privacy_seconds']:.3g} s)\n"
        f"goals: {goals}\nchecks (relative L2 against the per-record loop): {errors} (tolerance {SUM_TOL:g}); "
        f"compiles during timing {r['jax_compiles_timed']}; compile s {r['compile_seconds']}; {r['cpu_count']} CPUs, "
        f"load at start {r['loadavg_at_start']}; total {r['wall_seconds_total']:.0f} s"
    )
    fit = r["fit"]
    if fit["skipped"]:
        tail += (f"\nnot run (compiled step over --fit-mb {fit['limit_mb']:g}): "
                 + ", ".join(f"{name} {fit['compiled_mb'][name]:,.0f} MB" for name in fit["skipped"]))
    return f"{head}\n{table}\n{mem_table}\n{tail}"


def run(args: argparse.Namespace) -> int:
    """Measures, checks and reports (the flags of :func:`parse_args`); the exit status."""
    start = time.perf_counter()
    args.progress = Progress()
    result = machine_info()
    result.update(benchmark(args))
    result["wall_seconds_total"] = round(time.perf_counter() - start, 1)
    if "nothing_fits" in result:
        fit = result["fit"]
        print(f"error: --fit-mb {fit['limit_mb']:g}: {result['nothing_fits']} needs more (compiled MB: "
              + ", ".join(f"{name} {mb:g}" for name, mb in fit["compiled_mb"].items()) + "); nothing was timed",
              file=sys.stderr)
        return 1
    if "checks_failed" not in result:  # a failed check stops the run before timing: nothing to show but the checks
        print(json.dumps(result) if args.json else readable(result), flush=True)
        if result["jax_compiles_timed"]:
            print(f"warning: {result['jax_compiles_timed']} XLA compilation(s) during the timed steps",
                  file=sys.stderr)
    worst = max(result["check_rel_error"], key=result["check_rel_error"].get)
    if not result["check_rel_error"][worst] <= SUM_TOL:
        against = "autograd's batched gradient" if "torch" in worst else "the per-record loop's"
        print(f"error: correctness check failed: {worst}'s sum differs from {against} by "
              f"{result['check_rel_error'][worst]:.2e} > {SUM_TOL} (relative L2)", file=sys.stderr)
        return 1
    if not result["torch"].get("updates_ok", True):
        print("error: correctness check failed: an Opacus step left a trainable tensor unchanged", file=sys.stderr)
        return 1
    if args.out:
        write_json(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(run(ARGS))
