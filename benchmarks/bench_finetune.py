"""DP fine-tuning step on the SmolLM2-135M shape: ours (full and LoRA) against the non-private step and Opacus + PEFT.

Usage::

    python benchmarks/bench_finetune.py [--json] [--out FILE.json] [--method full|lora|both] [--layers L] \
        [--dim 576] [--heads 9] [--kv-heads 3] [--intermediate 1536] [--vocab 49152] [--seq 64] [--batch 8] \
        [--records 64] [--repeats 5] [--rank 8] [--alpha 16] [--targets q_proj v_proj] [--microbatch M] \
        [--sweep-batches 8,16,32,64 --sweep-repeats 3] [--skip-torch] [--seed 0]

What is measured
----------------
A Llama decoder (:class:`snapaudit_jax.models.decoders.Llama`, float32, random weights) of the SmolLM2-135M shape:
width 576, 9 query and 3 key/value heads of 64, SwiGLU 1536, vocabulary 49152, tied embeddings, RoPE base 1e5,
30 layers (``--layers``; the CPU default is 2, the shape's other sizes unchanged; the JSON's ``shape`` says which
was run). ``--records`` synthetic records of ``--seq`` tokens (random ids and lengths from ``seq / 2`` to ``seq``,
right-padded); Poisson sampling at ``q = batch / records``; the batches of steps ``0 .. R`` are
:func:`snapaudit_jax.dpsgd.poisson_batch`'s, the ones our step draws, and every implementation runs on them.

Per method (``full``: every ``nnx.Param``; ``lora``: :func:`snapaudit_jax.finetune.lora.apply_lora` adapters of
rank ``--rank`` on ``--targets``, the ``nnx.LoRAParam`` state only):

* ``ours_dp_<m>``: the jitted step of :func:`snapaudit_jax.dpsgd.train` (``_prepare`` and ``_dp_step``, as
  ``benchmarks/bench_dpsgd.py`` calls them) with the library's default clipping path (``clipping = "auto"``:
  book-keeping where it covers every trainable parameter, as here) and microbatch (``--microbatch``;
  default 1 on CPU), each unit's gradient clipped to ``C`` (the mean per-record norm at step 0), summed,
  Gaussian noise ``sigma C`` (``sigma = 1``), divided by ``q N``, AdamW;
* ``ours_dp_<path>_<m>``: the same step on each other clipping path (``DPSGDConfig.clipping``; every path covers
  both methods on this float32 shape, embeddings, tied head and RMSNorms included):
  ``per_record`` (jax_privacy, vmapped), ``book_keeping`` (ghost norms and the clipped sum from one forward and
  one backward) and ``ghost`` (the norms, then a second backward pass of the clip-weighted loss);
* ``ours_nonprivate_<m>``: the same step of a ``DPSGDConfig(non_private=True)`` run (no clipping, no noise; it
  still computes per-record gradients, ``C = inf``);
* ``ours_batched_<m>``: one jitted ``jax.grad`` of the summed per-record losses of the same batch (no per-record
  gradients; compiled once per distinct batch size before timing, so nothing is padded), ``1 / (q N)``, the same
  AdamW: what a plain fine-tuning step costs;
* ``torch_opacus_<m>``: transformers' ``LlamaForCausalLM`` of the same config (``snapaudit_jax.finetune.export``'s
  ``hf_config``) holding *our* weights (``hf_tensors``), LoRA by PEFT ``get_peft_model`` with the same rank, alpha,
  targets and adapter values; Opacus ``PrivacyEngine.make_private`` (``grad_sample_mode="hooks"``,
  ``loss_reduction="mean"``, expected batch ``q N``), same ``C`` and ``sigma``, torch AdamW;
* ``torch_opacus_ghost_<m>``: the same with ``grad_sample_mode="ghost"`` (Opacus's ghost clipping: per-sample
  norms from the hooks, then a second backward of the clip-weighted losses; its criterion wrapper around
  ``CrossEntropyLoss(ignore_index=-100)`` reduces each sequence to its mean loss over real targets, as ours).
  Opacus refuses a parameter used by two modules under ghost clipping, so full fine-tuning of the tied-embedding
  shape has none (``torch.opacus_ghost_unsupported`` gives Opacus's reason);
* ``torch_nonprivate_<m>``: the same torch model, one batched backward, the same AdamW.

The torch side runs on the first CUDA device where torch sees one (weights, adapters, batches and optimizer state
on it; each step synchronises before its time is taken), else on the CPU; ``torch.device`` says which.

Same function on both sides: the same weights, adapters, loss (each record's mean next-token cross-entropy over
its real targets) and batches. After a warm-up step each, the ``R`` timed steps go through every implementation in
turn (the order rotating from step to step). ``median_step_seconds`` is the median of the ``R`` steps;
``tokens_per_s`` counts the real (unpadded) tokens of the timed batches over their summed step times. ``ratios``
(and the goals) are medians over the steps of the per-step ratio on the same batch: Poisson batch sizes vary, so a
ratio of median steps would compare different batches, and a median of paired ratios is robust to a step slowed by
other load; ``ratios_total_time`` gives summed step times (the inverse ratio of ``tokens_per_s``).
``peak_rss_delta_mb``: the largest rise of the process's peak RSS during one step, the peak reset before each step
(``/proc/self/clear_refs``; ``null`` where that is not allowed). PyTorch runs ``torch.set_num_threads(cores)``,
the cores XLA's CPU client uses, with ``OMP_WAIT_POLICY=PASSIVE`` unless set (OpenMP threads spinning at
barriers take the cores from the working thread when other processes run).

Batch sweep (``--sweep-batches``): every variant again at each listed expected batch (``q = b / records``), fresh
steps at that ``q`` with the main run's clip norms (ours' DP steps take ``q`` as an argument and do not recompile;
the batched step compiles for the point's batch sizes, the torch modules are built, checked and warmed up again),
``--sweep-repeats`` timed steps each, rotating: ``sweep[b]`` holds the median step times and the median per-step
ratios (``dp_<m>_over_batched`` etc.: ours against the batched step, against Opacus, and Opacus against torch's
non-private step).

Goals (printed and saved; a missed goal does not fail the run): ``ours_dp_lora <= 1.25 x`` the non-private LoRA step
and faster than ``torch_opacus_lora`` and ``torch_opacus_ghost_lora``; ``ours_dp_full <= 2 x`` the non-private full
step. The non-private step is given both ways: ``ours_batched`` (the cost of DP against plain fine-tuning) and
``ours_nonprivate`` (``train(non_private=True)``, which also computes per-record gradients, so its ratio is close to
1 by design).

Checks (before timing; on failure the script exits 1 and writes no ``--out`` file):

* ours: step 0 with ``C = inf`` and the noise off; the clipped sum (read back from AdamW's first moment,
  ``mu = (1 - b1) S / (q N)``) of every ``ours_dp*`` step and of ``ours_nonprivate`` equals the batched gradient sum
  of the same batch within ``1e-4`` relative L2 (float64);
* torch: on batch 0, the sum of Opacus's per-sample gradients equals ``n`` times the batched gradient that
  autograd accumulates in the same backward pass, within ``1e-4``; ghost clipping's per-sample norms and clipped
  sum (``C``: ours' mean norm) equal those computed from the per-sample gradients, within ``1e-4``; after one DP
  step every trainable tensor has moved and (LoRA) no base weight has; the same torch checks again at each sweep
  point, on the point's step 0 (``checks["sweep <b>: ..."]``; a failure there stops the run the same way).

Each check runs with float32 products at full precision
(:func:`snapaudit_jax.models.precision.full_float32_precision`: on accelerators, whose default is TF32, the checked
step compiles apart from the timed one); the timed steps run at the backend's default.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import math
import os
import statistics
import sys
import time

import _torch  # noqa: I001  (first: it sets OMP_WAIT_POLICY before anything loads libgomp)
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from _common import CompileCounter, int_at_least, machine_info, measured, paired_ratio, rotate_steps, sweep_batches
from bench_dpsgd import (
    batch_flops, dp_step_flops, flat64, make_data, noise_draw, ours_step, products_table, same_layout, shapes,
    step_batches,
)
from snapaudit_jax.dpsgd import DPSGDConfig, ghost, sequence_losses
from snapaudit_jax.dpsgd.train import _prepare
from snapaudit_jax.finetune.export import hf_config, hf_tensors
from snapaudit_jax.finetune.lora import TARGETS, LoRAConfig, LoRAProjection, apply_lora, lora_adapters
from snapaudit_jax.models.config import LlamaConfig
from snapaudit_jax.models.decoders import Llama
from snapaudit_jax.models.flops import count_matmul_flops
from snapaudit_jax.utils.errors import InputError
from snapaudit_jax.utils.io import write_json
from snapaudit_jax.models.precision import full_float32_precision

# SmolLM2-135M (HuggingFaceTB/SmolLM2-135M config.json).
SMOLLM2 = dict(layers=30, dim=576, heads=9, kv_heads=3, intermediate=1536, vocab=49152)
SMOLLM2_FIXED = dict(rms_norm_eps=1e-5, rope_theta=1e5, tie_word_embeddings=True, max_position_embeddings=8192)
CPU_LAYERS = 2
SUM_TOL = 1e-4
NOISE_MULTIPLIER, LEARNING_RATE, B1, DELTA = 1.0, 1e-3, 0.9, 1e-5
LORA_B_STD = 0.02
GOALS = {"lora_dp_over_nonprivate": 1.25, "full_dp_over_nonprivate": 2.0}
METHODS = ("full", "lora")


# ---------------------------------------------------------------------------
# Ours
# ---------------------------------------------------------------------------


def make_config(args) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=args.vocab, hidden_size=args.dim, intermediate_size=args.intermediate,
        num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
        head_dim=args.dim // args.heads, **SMOLLM2_FIXED,
    )


def build_models(args) -> tuple[LlamaConfig, dict]:
    cfg = make_config(args)
    models = {}
    for method in args.methods:
        model = Llama(cfg, rngs=nnx.Rngs(args.seed))  # the same base weights for both methods
        if method == "lora":
            apply_lora(model, LoRAConfig(rank=args.rank, alpha=args.alpha, targets=tuple(args.targets)),
                       key=jax.random.key(args.seed + 1))
            rng = np.random.default_rng(args.seed + 2)
            for block in model.blocks:
                for value in vars(block).values():
                    if isinstance(value, LoRAProjection):
                        for b in value.lora_b:
                            b[...] = jnp.asarray(rng.normal(0.0, LORA_B_STD, b[...].shape), b[...].dtype)
        models[method] = model
    return cfg, models


class Batched:
    """The plain step: one ``jax.grad`` of the summed per-record losses of the batch, ``1 / (q N)``, AdamW."""

    def __init__(self, model, trainable, tokens, mask, *, inv_normaliser: float):
        graphdef, params, rest = nnx.split(model, trainable, ...)
        self.params = jax.tree.map(jnp.array, params)
        self.rest = rest  # an argument of the jitted step, never a constant in it (LoRA: the frozen base weights)
        defaults = DPSGDConfig(steps=1, learning_rate=LEARNING_RATE, non_private=True, batch_size=1)
        tx = optax.chain(optax.scale(inv_normaliser),
                         optax.adamw(LEARNING_RATE, b1=B1, b2=defaults.b2, eps=defaults.eps,
                                     weight_decay=defaults.weight_decay))
        self.opt_state = tx.init(self.params)
        self.tokens, self.mask = tokens, mask
        self.inv_normaliser = inv_normaliser

        def step(params, opt_state, rest, tokens, mask, idx):
            def loss(p):
                return jnp.sum(sequence_losses(nnx.merge(graphdef, p, rest), tokens[idx], mask[idx]))

            updates, opt_state = tx.update(jax.grad(loss)(params), opt_state, params)
            return optax.apply_updates(params, updates), opt_state

        self._step = jax.jit(step, donate_argnums=(0, 1))

    def check_sum(self, indices: np.ndarray) -> np.ndarray:
        """The gradient sum of one step from copies of the state (AdamW's first moment ``(1 - b1) S / (q N)``)."""
        params, opt_state = jax.tree.map(jnp.array, self.params), jax.tree.map(jnp.array, self.opt_state)
        _, opt_after = self._step(params, opt_state, self.rest, self.tokens, self.mask,
                                  jnp.asarray(indices, jnp.int32))
        return flat64(optax.tree_utils.tree_get(opt_after, "mu")) / (self.inv_normaliser * (1.0 - B1))

    def step(self, indices: np.ndarray) -> None:
        self.params, self.opt_state = self._step(self.params, self.opt_state, self.rest, self.tokens, self.mask,
                                                 jnp.asarray(indices, jnp.int32))
        jax.block_until_ready(self.params)

    def matmul_flops(self, size: int):
        """:func:`~snapaudit_jax.models.flops.count_matmul_flops` of the step on a batch of ``size`` records."""
        return count_matmul_flops(self._step, shapes(self.params), shapes(self.opt_state), self.rest, self.tokens,
                                  self.mask, jax.ShapeDtypeStruct((size,), jnp.int32))


class Ours:
    """Our DP and non-private ``train`` steps of one method, and the batched plain step."""

    def __init__(self, model, trainable, data, *, q: float, microbatch: int | None, key, batches):
        tokens_np, mask_np = data
        self.key = key
        base = dict(steps=len(batches), learning_rate=LEARNING_RATE, sampling_rate=q, optimizer="adamw", b1=B1,
                    microbatch_size=microbatch)
        dp = dict(clip_norm=1.0, noise_multiplier=NOISE_MULTIPLIER, delta=DELTA, **base)
        self.runs = {"dp": _prepare(model, data, DPSGDConfig(**dp), key, trainable)}
        graphdef, params, rest = nnx.split(model, trainable, ...)
        if not ghost.not_covered(graphdef, params, rest, jnp.asarray(tokens_np[:1]), jnp.asarray(mask_np[:1])):
            # every path covers the model (LoRA, and full fine-tuning of the float32 shape): the others beside
            # the default
            for path in ("per_record", "book_keeping", "ghost"):
                if path != self.runs["dp"].spec.clipping:
                    self.runs[f"dp_{path}"] = _prepare(model, data, DPSGDConfig(clipping=path, **dp), key,
                                                       trainable)
        self.runs["nonprivate"] = _prepare(model, data, DPSGDConfig(non_private=True, **base), key, trainable)
        self.batched = Batched(same_layout(model, trainable), trainable, jnp.asarray(tokens_np), jnp.asarray(mask_np),
                               inv_normaliser=1.0 / (q * tokens_np.shape[0]))
        self.batches = batches
        self.num_records = tokens_np.shape[0]
        self.q = q
        self.state = {}

    def check(self, perturb: bool = False) -> tuple[dict, dict, float]:
        """Step 0 with ``C = inf`` and no noise against the batched gradient sum (stops at the first failure).

        Returns ``(relative errors, compile seconds, mean per-record gradient norm)``.
        """
        compile_s, errors = {}, {}
        start = time.perf_counter()
        batched = self.batched.check_sum(self.batches[0])
        compile_s["batched"] = round(time.perf_counter() - start, 2)
        norm_mean = float("nan")
        for name, run in self.runs.items():
            params0, opt0 = jax.tree.map(jnp.array, run.params), jax.tree.map(jnp.array, run.opt_state)
            hyper = run.hyper._replace(clip_norm=jnp.float32(np.inf), noise_std=jnp.float32(0.0))
            start = time.perf_counter()
            _, opt_after, metrics = ours_step(run, 0, params0, opt0, hyper)
            compile_s[name] = round(time.perf_counter() - start, 2)
            if int(metrics["batch_size"]) != self.batches[0].size:
                raise RuntimeError(f"ours_{name}: step 0 has {int(metrics['batch_size'])} records, "
                                   f"poisson_batch {self.batches[0].size}")
            total = flat64(optax.tree_utils.tree_get(opt_after, "mu")) * (self.q * self.num_records) / (1.0 - B1)
            if perturb:
                total = total * (1.0 + 1e-3)
            errors[name] = float(np.linalg.norm(total - batched) / np.linalg.norm(batched))
            if name == "dp":
                norm_mean = float(metrics["norm_sum"]) / max(1, int(metrics["batch_size"]))
            if not errors[name] <= SUM_TOL:
                break
        return errors, compile_s, norm_mean

    def start(self, clip: float, sizes: list[int]) -> dict:
        """Sets ``C`` and warms every step up (compiling the batched step for every batch size to be timed)."""
        for name, run in self.runs.items():
            if name.startswith("dp"):
                self.runs[name] = run._replace(hyper=run.hyper._replace(
                    clip_norm=jnp.float32(clip), noise_std=jnp.float32(NOISE_MULTIPLIER * clip)))
        compile_s = {}
        for name, run in self.runs.items():
            start = time.perf_counter()
            self.state[name] = ours_step(run, 0, run.params, run.opt_state, run.hyper)[:2]
            compile_s[name + "_warmup"] = round(time.perf_counter() - start, 2)
        start = time.perf_counter()
        for size in sorted(set(sizes)):  # every batch size of the timed steps, so that none compiles there
            self.batched.step(next(b for b in self.batches if b.size == size))
        compile_s["batched_warmup"] = round(time.perf_counter() - start, 2)
        compile_s["batched_sizes"] = sorted(set(sizes) | {self.batches[0].size})
        return compile_s

    def products(self, sizes: list[int], wall: dict, method: str) -> dict:
        """The matrix products of the timed steps over batches of ``sizes`` records, from their jaxprs: the DP
        steps' (their microbatch calls, padded units included) and the batched step's, each over the batched one,
        with the rate achieved over the summed step times ``wall`` and the shares by operand dtype and precision."""
        counted = {f"ours_batched_{method}": batch_flops(self.batched.matmul_flops, sizes)}
        counted.update({f"ours_{kind}_{method}": dp_step_flops(run, sizes) for kind, run in self.runs.items()
                        if kind.startswith("dp")})
        return products_table(counted, sizes, wall, f"ours_batched_{method}", "over_batched")

    def step(self, name: str, t: int) -> None:
        if name == "batched":
            self.batched.step(self.batches[t])
            return
        run = self.runs[name]
        params, opt_state, metrics = ours_step(run, t, *self.state[name], run.hyper)
        self.state[name] = params, opt_state
        if int(metrics["batch_size"]) != self.batches[t].size:
            raise RuntimeError(f"ours_{name}: step {t} batch differs from poisson_batch")


# ---------------------------------------------------------------------------
# PyTorch: transformers + PEFT + Opacus
# ---------------------------------------------------------------------------


def _torch_modules(method: str, model, cfg: LlamaConfig, args):
    """A ``LlamaForCausalLM`` (PEFT-wrapped for LoRA) holding ``model``'s weights (and adapters)."""
    import peft
    import torch
    import transformers

    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**hf_config(cfg)))
    tensors = {k: torch.from_numpy(np.array(v)) for k, v in hf_tensors(model, lora="base").items()}
    missing, unexpected = hf.load_state_dict(tensors, strict=False)
    if unexpected or set(missing) - {"lm_head.weight"}:
        raise RuntimeError(f"torch model: missing {missing}, unexpected {unexpected}")
    hf = hf.float()
    if method == "full":
        return hf
    lora = peft.LoraConfig(r=args.rank, lora_alpha=args.alpha, target_modules=list(args.targets), lora_dropout=0.0,
                           bias="none")
    wrapped = peft.get_peft_model(hf, lora)
    with torch.no_grad():
        for (layer, name), (a, b, _) in lora_adapters(model).items():
            part = "mlp" if name in ("gate_proj", "up_proj", "down_proj") else "self_attn"
            module = wrapped.get_submodule(f"base_model.model.model.layers.{layer}.{part}.{name}")
            module.lora_A["default"].weight.copy_(torch.from_numpy(np.array(a).T))
            module.lora_B["default"].weight.copy_(torch.from_numpy(np.array(b).T))
    return wrapped


# ---------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------


def _failed(out: dict) -> bool:
    """Records (``checks_failed``) and says whether any check so far failed."""
    failed = [k for k, v in out["checks"].items()
              if k != "tolerance" and (v is False or (not isinstance(v, bool) and not v <= SUM_TOL))]
    if failed:
        out["checks_failed"] = failed
    return bool(failed)


def benchmark(args) -> dict:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cfg, models = build_models(args)
    tokens_np, mask_np = make_data(args.records, args.seq, args.vocab, args.seed)
    data = (tokens_np, mask_np)
    q = args.batch / args.records
    key = jax.random.key(args.seed)
    batches = step_batches(key, args.records, q, args.repeats + 1)
    sizes = [int(b.size) for b in batches[1:]]
    real_tokens = [int(mask_np[b].sum()) for b in batches[1:]]

    out = {"checks": {"tolerance": SUM_TOL}, "compile_seconds": {}, "clip_norm": {}, "parity": {}}
    num_params = {}
    trainable = {}
    ours, torch_side = {}, {}
    threads = {"xla_cpu_intra_op": cores, "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY")}
    if not args.skip_torch:  # main() checked that it imports
        import torch

        torch.manual_seed(args.seed)
        threads["torch"] = _torch.configure(cores)
    for method in args.methods:
        model = models[method]
        flt = nnx.LoRAParam if method == "lora" else nnx.Param
        num_params[method] = int(sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param))))
        trainable[method] = int(sum(x.size for x in jax.tree.leaves(nnx.state(model, flt))))
        side = ours[method] = Ours(model, flt, data, q=q, microbatch=args.microbatch, key=key, batches=batches)
        with full_float32_precision():
            errors, compile_s, norm_mean = side.check(perturb=args.perturb_check == "ours")
        out["checks"].update({f"ours_{name}_{method}": err for name, err in errors.items()})
        if _failed(out):
            return out
        clip = out["clip_norm"][method] = norm_mean
        out["compile_seconds"][f"ours_{method}"] = {**compile_s, **side.start(clip, sizes)}
        if not args.skip_torch:
            ts = torch_side[method] = _torch.Torch(
                lambda method=method: _torch_modules(method, models[method], cfg, args), data, q=q, batches=batches,
                clip=clip, noise_multiplier=NOISE_MULTIPLIER, learning_rate=LEARNING_RATE, b1=B1,
                loader_batch=args.batch)
            if ts.trainable_parameters != trainable[method]:
                raise RuntimeError(f"{method}: torch trains {ts.trainable_parameters} parameters, ours "
                                   f"{trainable[method]}")
            check = ts.check(perturb=args.perturb_check == "torch")
            out["checks"].update(_torch_checks(check, ts, method))
            if ts.ghost_unsupported:
                out.setdefault("torch_opacus_ghost_unsupported", {})[method] = ts.ghost_unsupported
            with full_float32_precision():
                ours_losses = np.asarray(sequence_losses(model, jnp.asarray(tokens_np[batches[0]]),
                                                         jnp.asarray(mask_np[batches[0]])), np.float64)
            out["parity"][method] = {
                "loss_max_abs_diff": float(np.max(np.abs(ours_losses - check["losses"]))),
                "mean_record_grad_norm": {"ours": norm_mean, "torch": check["norm_mean"]},
            }
            out["compile_seconds"][f"torch_{method}"] = ts.start()
            out["checks"][f"torch_opacus_{method}_updates"] = ts.moved_ok
            if _failed(out):
                return out

    names = []
    for method in args.methods:
        names += [("ours", method, kind) for kind in ours[method].runs] + [("ours", method, "batched")]
        if not args.skip_torch:
            names += [("torch", method, kind) for kind in torch_side[method].kinds()]

    def label(side, method, kind):
        if side == "torch":
            kind = {"dp": "opacus", "ghost": "opacus_ghost"}.get(kind, kind)
        return f"{side}_{kind}_{method}"

    wall = {label(*n): [] for n in names}
    cpu = dict.fromkeys(wall, 0.0)
    peak = {k: [] for k in wall}
    with CompileCounter() as compiles:
        for t in range(1, args.repeats + 1):
            shift = (t - 1) % len(names)  # the order rotates, so that no variant always follows the same one
            for side, method, kind in names[shift:] + names[:shift]:
                impl = ours[method] if side == "ours" else torch_side[method]
                s, c, rise = measured(lambda: impl.step(kind, t))  # noqa: B023
                name = label(side, method, kind)
                wall[name].append(s)
                cpu[name] += c
                peak[name].append(rise)

    total_tokens = sum(real_tokens)
    variants = {}
    for name, times in wall.items():
        rises = [r for r in peak[name] if r is not None]
        variants[name] = {
            "median_step_seconds": round(statistics.median(times), 4),
            "step_seconds": [round(s, 4) for s in times],
            "tokens_per_s": round(total_tokens / sum(times), 1),
            "records_per_s": round(sum(sizes) / sum(times), 2),
            "cpu_seconds_per_step": round(cpu[name] / len(times), 3),
            "peak_rss_delta_mb": round(max(rises), 1) if rises else None,
        }

    total_time = {}

    def ratio(a, b):
        """The median over steps of ``a``'s step time over ``b``'s on the same batch (``total_time``: summed times)."""
        if a not in variants or b not in variants:
            return None
        total_time[f"{a}/{b}"] = round(sum(wall[a]) / sum(wall[b]), 3)
        return paired_ratio(wall, a, b)

    ratios, goals = {}, {}
    for method in args.methods:
        ratios[f"dp_over_batched_{method}"] = ratio(f"ours_dp_{method}", f"ours_batched_{method}")
        for path in ("per_record", "book_keeping", "ghost"):
            if f"ours_dp_{path}_{method}" in variants:
                ratios[f"dp_{path}_over_batched_{method}"] = ratio(f"ours_dp_{path}_{method}",
                                                                   f"ours_batched_{method}")
        ratios[f"dp_over_train_nonprivate_{method}"] = ratio(f"ours_dp_{method}", f"ours_nonprivate_{method}")
        if not args.skip_torch:
            ratios[f"dp_over_opacus_{method}"] = ratio(f"ours_dp_{method}", f"torch_opacus_{method}")
            ratios[f"opacus_over_torch_nonprivate_{method}"] = ratio(f"torch_opacus_{method}",
                                                                     f"torch_nonprivate_{method}")
            if f"torch_opacus_ghost_{method}" in variants:
                ratios[f"dp_over_opacus_ghost_{method}"] = ratio(f"ours_dp_{method}", f"torch_opacus_ghost_{method}")
                ratios[f"opacus_ghost_over_torch_nonprivate_{method}"] = ratio(f"torch_opacus_ghost_{method}",
                                                                               f"torch_nonprivate_{method}")
            ratios[f"batched_over_torch_nonprivate_{method}"] = ratio(f"ours_batched_{method}",
                                                                      f"torch_nonprivate_{method}")
        limit = GOALS[f"{method}_dp_over_nonprivate"]
        vs_batched, vs_train = ratios[f"dp_over_batched_{method}"], ratios[f"dp_over_train_nonprivate_{method}"]
        goals[f"{method}_dp_within_{limit:g}x_nonprivate"] = {
            "limit": limit, "ratio_vs_batched": vs_batched, "met_vs_batched": vs_batched <= limit,
            "ratio_vs_train_nonprivate": vs_train, "met_vs_train_nonprivate": vs_train <= limit,
        }
        if method == "lora":
            r = ratios.get("dp_over_opacus_lora")
            goals["lora_dp_faster_than_opacus_peft"] = {"ratio": r, "met": None if r is None else r < 1.0}
            r = ratios.get("dp_over_opacus_ghost_lora")
            goals["lora_dp_faster_than_opacus_ghost_peft"] = {"ratio": r, "met": None if r is None else r < 1.0}

    # the arithmetic of our steps (torch's cannot be counted from a jaxpr): what DP adds over the batched step
    out["matmul_products"] = {}
    for method in args.methods:
        out["matmul_products"].update(ours[method].products(sizes, wall, method))
    out["noise_draw"] = {m: noise_draw(nnx.state(models[m], nnx.LoRAParam if m == "lora" else nnx.Param),
                                       args.seed, args.repeats) for m in args.methods}
    shape = {
        "name": "SmolLM2-135M" if args.full_shape else "SmolLM2-135M shape, shrunk",
        "full_shape": args.full_shape,
        "layers": args.layers, "layers_full_shape": SMOLLM2["layers"], "hidden_size": args.dim,
        "heads": args.heads, "kv_heads": args.kv_heads, "head_dim": cfg.head_dim,
        "intermediate_size": args.intermediate, "vocab": args.vocab, "tie_word_embeddings": True,
        "rope_theta": cfg.rope_theta, "parameters": num_params, "dtype": "float32",
    }
    out.update({
        "shape": shape, "seq": args.seq, "records": args.records, "expected_batch": args.batch,
        "sampling_rate": q, "batch_sizes": sizes, "real_tokens": real_tokens, "methods": list(args.methods),
        "lora": {"rank": args.rank, "alpha": args.alpha, "targets": list(args.targets), "b_init_std": LORA_B_STD},
        "trainable_parameters": trainable, "noise_multiplier": NOISE_MULTIPLIER, "optimizer": "adamw",
        "learning_rate": LEARNING_RATE,
        "microbatch_size": {m: ours[m].runs["dp"].spec.microbatch_size for m in args.methods},
        "clipping": {f"ours_{kind}_{m}": run.spec.clipping for m in args.methods for kind, run in ours[m].runs.items()
                     if kind.startswith("dp")},
        "microbatch_sizes": {f"ours_{kind}_{m}": run.spec.microbatch_size for m in args.methods
                             for kind, run in ours[m].runs.items()},
        "tail_microbatch_sizes": {f"ours_{kind}_{m}": run.spec.tail_size for m in args.methods
                                  for kind, run in ours[m].runs.items()},
        "threads": threads, "repeats": args.repeats, "variants": variants, "ratios": ratios,
        "ratios_total_time": total_time, "goals": goals,
        "jax_compiles_timed": compiles.count,
        "peak_rss_method": "max over timed steps of VmHWM - VmRSS, VmHWM reset before each step (clear_refs 5)",
    })
    if args.skip_torch:
        out["torch"] = {"skipped": True}
    else:
        import opacus
        import peft
        import torch
        import transformers

        out["torch"] = {
            "skipped": False, "torch": torch.__version__, "transformers": transformers.__version__,
            "peft": peft.__version__, "opacus": opacus.__version__,
            "device": str(torch_side[args.methods[0]].device),
            "cuda_device": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
            "opacus_setup": _torch.OPACUS_SETUP,
            "opacus_ghost_setup": _torch.OPACUS_GHOST_SETUP,
            "opacus_ghost_unsupported": out.pop("torch_opacus_ghost_unsupported", {}),
            "opacus_notes": (
                "LoRA: the base model is frozen (PEFT), so Opacus hooks only the LoRA nn.Linear modules; full: "
                "Opacus has no grad sampler for LlamaRMSNorm and computes its per-sample gradients with its "
                "functorch fallback, the tied embedding/lm_head weight accumulates both modules' grad samples, "
                "rotary embeddings have no parameters; checked against autograd before timing"),
            "attn_implementation": getattr(torch_side[args.methods[0]].plain.config, "_attn_implementation", None),
        }
    # The sweep's points build their own steps: the main run's go first (Opacus's per-sample gradients of full
    # fine-tuning alone take batch x parameters floats).
    ours.clear()
    torch_side.clear()
    side = ts = impl = None  # noqa: F841  (the loops' last references)
    gc.collect()
    out["sweep"] = {}
    for b in args.sweep_batches:
        point = out["sweep"][str(b)] = sweep_point(args, cfg, models, data, key, out["clip_norm"], b)
        gc.collect()
        out["jax_compiles_timed"] += point["jax_compiles_timed"]
        out["checks"].update({f"sweep {b}: {k}": v for k, v in point["torch_checks"].items()})
        if _failed(out):
            return out
    return out


def _torch_checks(check: dict, ts: _torch.Torch, method: str) -> dict[str, float]:
    """The relative errors of one Opacus check, named by method (``torch_opacus_<method>`` etc.)."""
    return {f"{name}_{method}": err for name, err in _torch.check_errors(check, ts.ghost_unsupported).items()}


def sweep_point(args, cfg, models: dict, data, key, clip: dict, batch: int) -> dict:
    """Every variant's step time at expected batch ``batch`` (``q = batch / records``), side by side.

    Fresh steps of every method at ``q`` (ours: the DP steps take ``q`` as an argument, so nothing recompiles; the
    batched step compiles for each batch size before timing; torch: fresh modules, checked and warmed up on the
    point's step 0), the clip norms of the main run, ``--sweep-repeats`` timed steps, the order rotating.
    """
    q = batch / args.records
    batches = step_batches(key, args.records, q, args.sweep_repeats + 1)
    sizes = [int(b.size) for b in batches[1:]]
    steps, checks = {}, {}
    for method in args.methods:
        flt = nnx.LoRAParam if method == "lora" else nnx.Param
        side = Ours(models[method], flt, data, q=q, microbatch=args.microbatch, key=key, batches=batches)
        side.start(clip[method], sizes)
        steps.update({f"ours_{kind}_{method}": functools.partial(side.step, kind) for kind in [*side.runs, "batched"]})
        if not args.skip_torch:
            ts = _torch.Torch(lambda method=method: _torch_modules(method, models[method], cfg, args), data, q=q,
                              batches=batches, clip=clip[method], noise_multiplier=NOISE_MULTIPLIER,
                              learning_rate=LEARNING_RATE, b1=B1, loader_batch=batch)
            check = ts.check(perturb=args.perturb_check == "sweep" and batch == args.sweep_batches[0])
            checks.update(_torch_checks(check, ts, method))
            ts.start()
            checks[f"torch_opacus_{method}_updates"] = ts.moved_ok
            steps.update({f"torch_{_TORCH_KINDS[kind]}_{method}": functools.partial(ts.step, kind)
                          for kind in ts.kinds()})
    wall, compiled = rotate_steps(steps, args.sweep_repeats)

    def ratio(a, b):
        return None if a not in wall or b not in wall else paired_ratio(wall, a, b)

    ratios = {}
    for method in args.methods:
        for name in wall:
            if name.startswith("ours_dp") and name.endswith(f"_{method}"):
                ratios[f"{name.removeprefix('ours_')}_over_batched"] = ratio(name, f"ours_batched_{method}")
        if not args.skip_torch:
            ratios[f"dp_{method}_over_opacus"] = ratio(f"ours_dp_{method}", f"torch_opacus_{method}")
            ratios[f"dp_{method}_over_opacus_ghost"] = ratio(f"ours_dp_{method}", f"torch_opacus_ghost_{method}")
            ratios[f"opacus_{method}_over_torch_nonprivate"] = ratio(f"torch_opacus_{method}",
                                                                     f"torch_nonprivate_{method}")
    return {"sampling_rate": q, "batch_sizes": sizes,
            "median_step_seconds": {name: round(statistics.median(w), 4) for name, w in wall.items()},
            "ratios": {k: v for k, v in ratios.items() if v is not None}, "torch_checks": checks,
            "jax_compiles_timed": compiled}


_TORCH_KINDS = {"dp": "opacus", "ghost": "opacus_ghost", "nonprivate": "nonprivate"}


def readable(r: dict) -> str:
    s = r["shape"]
    head = (
        f"{s['name']}: Llama {s['layers']} layers (of {s['layers_full_shape']}) x {s['hidden_size']}, heads "
        f"{s['heads']}/{s['kv_heads']}, MLP {s['intermediate_size']}, vocab {s['vocab']}, seq {r['seq']} | "
        f"N={r['records']}, Poisson q={r['sampling_rate']:.4g} (expected batch {r['expected_batch']}, realised "
        f"{min(r['batch_sizes'])}..{max(r['batch_sizes'])}), sigma={r['noise_multiplier']:g}, C "
        + ", ".join(f"{m} {c:.4g}" for m, c in r["clip_norm"].items())
        + f", LoRA r={r['lora']['rank']} alpha={r['lora']['alpha']:g} on {'/'.join(r['lora']['targets'])}, AdamW"
    )
    rows = [("", "median step s", "tokens/s", "records/s", "CPU s/step", "peak RSS +MB")]
    for name, v in r["variants"].items():
        mem = "n/a" if v["peak_rss_delta_mb"] is None else f"{v['peak_rss_delta_mb']:.0f}"
        rows.append((name, f"{v['median_step_seconds']:.4f}", f"{v['tokens_per_s']:.1f}", f"{v['records_per_s']:.2f}",
                     f"{v['cpu_seconds_per_step']:.3f}", mem))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    table = "\n".join("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths)))
                      for row in rows)
    ratios = ", ".join(f"{k} {v:.3g}" for k, v in r["ratios"].items() if v is not None)
    goal_lines = []
    for name, g in r["goals"].items():
        if "limit" in g:
            goal_lines.append(f"goal {name}: vs batched {g['ratio_vs_batched']:.3g}x "
                              f"({'met' if g['met_vs_batched'] else 'NOT met'}), vs train(non_private) "
                              f"{g['ratio_vs_train_nonprivate']:.3g}x "
                              f"({'met' if g['met_vs_train_nonprivate'] else 'NOT met'})")
        else:
            state = "n/a (--skip-torch)" if g["met"] is None else ("met" if g["met"] else "NOT met")
            goal_lines.append(f"goal {name}: {'n/a' if g['ratio'] is None else format(g['ratio'], '.3g') + 'x'} "
                              f"({state})")
    checks = ", ".join(f"{k} {v:.1e}" if not isinstance(v, bool) else f"{k} {v}"
                       for k, v in r["checks"].items() if k != "tolerance")
    paths = ", ".join(f"{k} {v.replace('_', '-')} (microbatch {r['microbatch_sizes'][k]})"
                      for k, v in r["clipping"].items())
    if r["sweep"]:
        points = r["sweep"]
        keys = list(dict.fromkeys(k for p in points.values() for k in p["ratios"]))
        rows = [("step time ratio at expected batch", *points)]
        rows += [(k, *(f"{p['ratios'][k]:.2f}x" if k in p["ratios"] else "-" for p in points.values())) for k in keys]
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        table += "\n" + "\n".join("  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in rows)
    draws = ", ".join(f"{m} {d['coordinates']:,} coordinates {d['ours_seconds']:.3g} s (jax_privacy's "
                      f"jax.random.normal {d['jax_privacy_seconds']:.3g} s)" for m, d in r["noise_draw"].items())
    tail = (
        f"noise draw, timed apart: {draws}\n"
        f"clipping paths: {paths}\n"
        f"ratios (median of per-step time ratios): {ratios}\n"
        + "matrix products over our batched step's (from the jaxprs): "
        + ", ".join(f"{k} {v['over_batched']:.3f}x" for k, v in r.get("matmul_products", {}).items()
                    if not k.startswith("ours_batched")) + "\n"
        + "\n".join(goal_lines) + "\n"
        f"checks: {checks} (tolerance {SUM_TOL:g}); compiles during timing {r['jax_compiles_timed']}; threads "
        f"{r['threads']}; {r['cpu_count']} CPUs, load at start {r['loadavg_at_start']}; total "
        f"{r['wall_seconds_total']:.0f} s"
    )
    return f"{head}\n{table}\n{tail}"


def parse(argv=None) -> argparse.Namespace:
    """The checked arguments (exits with status 2 naming a bad flag)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a readable table")
    parser.add_argument("--out", help="also write the JSON object to this file (atomically)")
    parser.add_argument("--method", choices=("full", "lora", "both"), default="both")
    parser.add_argument("--layers", type=int_at_least(1), default=None,
                        help=f"decoder layers (SmolLM2-135M: 30; default {CPU_LAYERS} on CPU, 30 elsewhere)")
    parser.add_argument("--dim", type=int_at_least(2), default=SMOLLM2["dim"], help="hidden size")
    parser.add_argument("--heads", type=int_at_least(1), default=SMOLLM2["heads"], help="query heads")
    parser.add_argument("--kv-heads", type=int_at_least(1), default=SMOLLM2["kv_heads"], help="key/value heads")
    parser.add_argument("--intermediate", type=int_at_least(1), default=SMOLLM2["intermediate"],
                        help="SwiGLU hidden size")
    parser.add_argument("--vocab", type=int_at_least(2), default=SMOLLM2["vocab"])
    parser.add_argument("--seq", type=int_at_least(4, 8192), default=64, help="tokens per record")
    parser.add_argument("--batch", type=int_at_least(1), default=8, help="expected (Poisson) batch size")
    parser.add_argument("--records", type=int_at_least(1), default=64, help="dataset size N (q = batch / N)")
    parser.add_argument("--repeats", type=int_at_least(1), default=5, help="timed steps per implementation")
    parser.add_argument("--rank", type=int_at_least(1), default=8, help="LoRA rank")
    parser.add_argument("--alpha", type=float, default=16.0, help="LoRA alpha (scale alpha / rank)")
    parser.add_argument("--targets", nargs="+", default=["q_proj", "v_proj"], metavar="PROJ",
                        help=f"LoRA targets, of {', '.join(TARGETS['llama'])}")
    parser.add_argument("--microbatch", type=int_at_least(1), default=None,
                        help="records per clipped-gradient call of ours (default: the library's, 1 on CPU)")
    parser.add_argument("--sweep-batches", default="",
                        help="also time every variant at these expected batches, comma-separated (each <= --records)")
    parser.add_argument("--sweep-repeats", type=int_at_least(1), default=3, help="timed steps per sweep point")
    parser.add_argument("--skip-torch", action="store_true", help="no PyTorch / Opacus baseline")
    parser.add_argument("--seed", type=int_at_least(0), default=0)
    parser.add_argument("--perturb-check", choices=("ours", "torch", "sweep"), default=None,
                        help="scale that side's checked sums by 1 + 1e-3 (torch: both Opacus modes; sweep: Opacus's "
                        "at the first sweep point; tests that the checks can fail)")
    args = parser.parse_args(argv)
    if args.layers is None:
        args.layers = CPU_LAYERS if jax.default_backend() == "cpu" else SMOLLM2["layers"]
    if args.dim % args.heads:
        parser.error(f"--dim must be a multiple of --heads, got {args.dim} and {args.heads}")
    if args.heads % args.kv_heads:
        parser.error(f"--heads must be a multiple of --kv-heads, got {args.heads} and {args.kv_heads}")
    if args.batch > args.records:
        parser.error(f"--batch must be <= --records, got {args.batch} > {args.records}")
    args.sweep_batches = sweep_batches(parser, args.sweep_batches, args.records)
    if not (math.isfinite(args.alpha) and args.alpha > 0):
        parser.error(f"--alpha must be a finite number > 0, got {args.alpha}")
    bad = [t for t in args.targets if t not in TARGETS["llama"]]
    if bad or len(set(args.targets)) != len(args.targets):
        parser.error(f"--targets must be distinct Llama projections ({', '.join(TARGETS['llama'])}), got "
                     f"{' '.join(args.targets)}")
    try:
        LoRAConfig(rank=args.rank, alpha=args.alpha, targets=tuple(args.targets)).resolved_targets(make_config(args))
    except InputError as exc:
        parser.error(f"--rank/--targets: {exc}")
    if args.skip_torch and args.perturb_check in ("torch", "sweep"):
        parser.error(f"--perturb-check {args.perturb_check} needs the torch baseline (drop --skip-torch)")
    if args.perturb_check == "sweep" and not args.sweep_batches:
        parser.error("--perturb-check sweep needs --sweep-batches")
    args.methods = METHODS if args.method == "both" else (args.method,)
    args.full_shape = all(getattr(args, k) == v for k, v in SMOLLM2.items())
    if not args.skip_torch:
        missing = _torch.torch_available()
        if missing:
            parser.error(f"the torch baseline needs {missing}; or pass --skip-torch")

    return args


def main(argv=None) -> int:
    args = parse(argv)
    rc, result = run(args)
    if rc == 0 and args.out:
        write_json(args.out, result)
    return rc


def run(args) -> tuple[int, dict]:
    """Runs the benchmark of parsed ``args`` and prints it: ``(exit status, result)``; 1 when a check failed."""
    start = time.perf_counter()
    result = machine_info()
    result.update(benchmark(args))
    result["wall_seconds_total"] = round(time.perf_counter() - start, 1)
    if "checks_failed" in result:
        print(json.dumps(result["checks"]) if args.json else f"checks: {result['checks']}", flush=True)
        print(f"error: correctness check failed: {', '.join(result['checks_failed'])} (relative L2 tolerance "
              f"{SUM_TOL:g}; *_updates: a DP step must move every adapter and no base weight)", file=sys.stderr)
        return 1, result
    print(json.dumps(result) if args.json else readable(result), flush=True)
    if result["jax_compiles_timed"]:
        print(f"warning: {result['jax_compiles_timed']} XLA compilation(s) during the timed steps", file=sys.stderr)
    return 0, result


if __name__ == "__main__":
    sys.exit(main())
