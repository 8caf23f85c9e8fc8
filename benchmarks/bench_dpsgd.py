"""DP-SGD step throughput: our jitted clipped-gradient step against a per-record Python loop.

Usage::

    python benchmarks/bench_dpsgd.py [--json] [--out FILE.json] [--layers 2] [--dim 128] [--heads 4] \
        [--seq 64] [--vocab 1024] [--batch 32] [--records 128] [--microbatch M] [--vmap-microbatch 32] \
        [--repeats 10] [--seed 0]

What is measured
----------------
A small GPT-2 (:class:`snapaudit_jax.models.decoders.GPT2`, float32, ``--layers`` blocks of width
``--dim``, vocabulary ``--vocab``) on ``--records`` synthetic records of ``--seq`` tokens (random
ids, random lengths from ``seq / 2`` to ``seq``, right-padded). One DP-SGD step is: the Poisson
batch at ``q = batch / records`` (expected batch ``--batch``), per-record gradients of the mean
next-token loss, each clipped to L2 norm ``C`` (the median per-record norm at initialisation, so
about half are clipped), summed, Gaussian noise ``sigma C`` (``sigma = 1``) on the sum, division by
``q N``, and an AdamW update (optax).

* ``ours``: the jitted step of :func:`snapaudit_jax.dpsgd.train` (jax_privacy ``clipped_grad``
  over fixed-size microbatches of ``m`` records in a ``fori_loop`` with a dynamic trip count, masked
  padding, jax_privacy's Gaussian privatizer, optax), called on the same inputs as ``train`` calls
  it, with the library's default ``m`` (1 on CPU; ``--microbatch`` overrides it);
* ``ours_vmap<M>``: the same step with ``m = --vmap-microbatch`` (default 32, the accelerator
  default): per-record gradients vectorised with ``vmap``;
* ``loop`` (the baseline of the ratios): for every record of the *same* Poisson batch, one call of a
  jitted ``jax.value_and_grad`` of that record's loss; the gradient is fetched, its norm computed,
  clipped and summed in NumPy (float32), NumPy Gaussian noise is added, and one jitted optax AdamW
  update applies the result.

All are warmed up (compiled) first; then the timed steps alternate between the implementations on
step ``t``'s batch, for ``t = 1 .. R``. ``steps_per_s`` uses the median step time,
``records_per_s`` the total records over the total time, ``cpu_seconds_per_step`` the process CPU
time (all threads) per step, which is less sensitive to other load on the machine.
``jax_compiles_timed`` counts XLA compilations during the timed steps (expected 0: the batch size
varies, the compiled step does not).

Correctness check (before timing, at the initial parameters, step 0's batch): with the noise off,
each variant's clipped sum (read back from AdamW's first moment, ``mu = (1 - b1) S / (q N)``)
against the loop's clipped sum, in float64. Beyond a relative L2 error of ``1e-4`` the script exits
with status 1 and writes no ``--out`` file.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from _common import CompileCounter, int_at_least, machine_info
from snapaudit_jax.utils.io import write_json
from snapaudit_jax.dpsgd import DPSGDConfig, poisson_batch, sequence_losses
from snapaudit_jax.dpsgd.train import _SAMPLE_STREAM, _dp_step, _prepare
from snapaudit_jax.models.config import GPT2Config
from snapaudit_jax.models.decoders import GPT2

SUM_TOL = 1e-4
NOISE_MULTIPLIER, LEARNING_RATE, B1 = 1.0, 1e-3, 0.9


def make_data(records: int, seq: int, vocab: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, vocab, (records, seq)).astype(np.int32)
    lengths = rng.integers(seq // 2, seq + 1, records)
    mask = np.arange(seq)[None, :] < lengths[:, None]
    return np.where(mask, tokens, 0).astype(np.int32), mask


def flat64(tree) -> np.ndarray:
    return np.concatenate([np.ravel(np.asarray(x, np.float64)) for x in jax.tree.leaves(tree)])


class Loop:
    """The baseline: per-record jitted gradients, clipped, summed and noised in NumPy, then a jitted AdamW update."""

    def __init__(self, model, tokens, mask, *, clip: float, sigma: float, normaliser: float, seed: int):
        graphdef, params, rest = nnx.split(model, nnx.Param, ...)
        self.params = jax.tree.map(jnp.array, params)
        self.tokens, self.mask = tokens, mask
        self.clip, self.sigma, self.normaliser = clip, sigma, normaliser
        self.rng = np.random.default_rng(seed)
        tx = optax.adamw(LEARNING_RATE, b1=B1)
        self.opt_state = tx.init(self.params)

        @jax.jit
        def grad(params, tokens, mask):
            return jax.value_and_grad(lambda p: sequence_losses(nnx.merge(graphdef, p, rest), tokens, mask)[0])(params)

        @jax.jit
        def update(grads, opt_state, params):
            updates, opt_state = tx.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state

        self.grad, self.update = grad, update

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

    def step(self, indices) -> None:
        total, _ = self.clipped_sum(self.params, indices)
        std = np.float32(self.sigma * self.clip)
        noisy = [(t + std * self.rng.standard_normal(t.shape, np.float32)) / np.float32(self.normaliser) for t in total]
        grads = jax.tree.unflatten(jax.tree.structure(self.params), noisy)
        self.params, self.opt_state = self.update(grads, self.opt_state, self.params)
        jax.block_until_ready(self.params)


def ours_step(run, t, params, opt_state, hyper):
    """One call of the jitted step of :func:`snapaudit_jax.dpsgd.train`, exactly as ``train`` makes it."""
    out = _dp_step(run.key, np.int32(t), params, opt_state, run.rest, run.tokens, run.mask, hyper,
                   graphdef=run.graphdef, spec=run.spec)
    jax.block_until_ready(out)
    return out


def benchmark(args) -> dict:
    cfg = GPT2Config(
        vocab_size=args.vocab, n_positions=args.seq, n_embd=args.dim, n_layer=args.layers, n_head=args.heads,
        n_inner=4 * args.dim,
    )
    model = GPT2(cfg, rngs=nnx.Rngs(args.seed))
    tokens_np, mask_np = make_data(args.records, args.seq, args.vocab, args.seed)
    tokens, mask = jnp.asarray(tokens_np), jnp.asarray(mask_np)
    q = args.batch / args.records
    key = jax.random.key(args.seed)
    sample_key = jax.random.fold_in(key, _SAMPLE_STREAM)
    batches = [np.flatnonzero(poisson_batch(sample_key, t, args.records, q)) for t in range(args.repeats + 1)]

    loop = Loop(model, tokens, mask, clip=1.0, sigma=NOISE_MULTIPLIER, normaliser=args.records * q, seed=args.seed)
    initial = jax.tree.map(jnp.array, loop.params)
    num_params = int(flat64(initial).size)
    # Clip norm: the median per-record gradient norm at initialisation (the loop's gradient compiles here).
    start = time.perf_counter()
    _, norms = loop.clipped_sum(initial, batches[0])
    loop_compile_s = time.perf_counter() - start
    clip = loop.clip = float(np.median(norms))
    loop_leaves, _ = loop.clipped_sum(initial, batches[0])
    loop_sum = np.concatenate([np.ravel(x.astype(np.float64)) for x in loop_leaves])

    variants = {"ours": args.microbatch, f"ours_vmap{args.vmap_microbatch}": args.vmap_microbatch}
    runs, compile_s, rel_err = {}, {}, {}
    for name, micro in variants.items():
        config = DPSGDConfig(
            steps=args.repeats + 1, learning_rate=LEARNING_RATE, clip_norm=clip, noise_multiplier=NOISE_MULTIPLIER,
            delta=1e-5, sampling_rate=q, optimizer="adamw", b1=B1, microbatch_size=micro,
        )
        run = runs[name] = _prepare(model, (tokens_np, mask_np), config, key)
        # Check (and compile): step 0 with the noise off; AdamW's first moment is (1 - b1) S / (q N).
        params0, opt0 = jax.tree.map(jnp.array, run.params), jax.tree.map(jnp.array, run.opt_state)
        start = time.perf_counter()
        _, opt_after, metrics = ours_step(run, 0, params0, opt0, run.hyper._replace(noise_std=jnp.float32(0.0)))
        compile_s[name] = round(time.perf_counter() - start, 2)
        if int(metrics["batch_size"]) != batches[0].size:
            raise RuntimeError(f"{name}: step 0 batch has {int(metrics['batch_size'])} records, not {batches[0].size}")
        ours_sum = flat64(optax.tree_utils.tree_get(opt_after, "mu")) * (args.records * q) / (1.0 - B1)
        rel_err[name] = float(np.linalg.norm(ours_sum - loop_sum) / np.linalg.norm(loop_sum))

    loop.step(batches[0])  # compiles the update
    state = {name: ours_step(run, 0, run.params, run.opt_state, run.hyper)[:2] for name, run in runs.items()}
    names = [*runs, "loop"]
    wall = {name: [] for name in names}
    cpu = {name: 0.0 for name in names}
    sizes = []
    with CompileCounter() as compiles:
        for t in range(1, args.repeats + 1):
            for name in names:
                start, start_cpu = time.perf_counter(), time.process_time()
                if name == "loop":
                    loop.step(batches[t])
                else:
                    params, opt_state, metrics = ours_step(runs[name], t, *state[name], runs[name].hyper)
                    state[name] = params, opt_state
                wall[name].append(time.perf_counter() - start)
                cpu[name] += time.process_time() - start_cpu
                if name != "loop" and int(metrics["batch_size"]) != batches[t].size:
                    raise RuntimeError(f"{name}: step {t} batch differs from poisson_batch")
            sizes.append(int(batches[t].size))

    def rates(name):
        times = wall[name]
        return {
            "steps_per_s": round(1.0 / statistics.median(times), 3),
            "records_per_s": round(sum(sizes) / sum(times), 1),
            "median_step_seconds": round(statistics.median(times), 4),
            "cpu_seconds_per_step": round(cpu[name] / len(times), 4),
        }

    out = {
        "model": {"kind": "GPT2", "layers": args.layers, "dim": args.dim, "heads": args.heads, "seq": args.seq,
                  "vocab": args.vocab, "parameters": num_params},
        "records": args.records,
        "expected_batch": args.batch,
        "sampling_rate": q,
        "microbatch_size": {name: run.spec.microbatch_size for name, run in runs.items()},
        "batch_sizes": sizes,
        "clip_norm": clip,
        "clipped_fraction_step0": float(np.mean(norms > clip)),
        "noise_multiplier": NOISE_MULTIPLIER,
        "optimizer": "adamw",
        "repeats": args.repeats,
    }
    out.update({name: rates(name) for name in names})
    for name in runs:
        suffix = "" if name == "ours" else "_" + name.removeprefix("ours_")
        out["ratio" + suffix] = round(out[name]["records_per_s"] / out["loop"]["records_per_s"], 2)
        out["ratio_steps" + suffix] = round(out[name]["steps_per_s"] / out["loop"]["steps_per_s"], 2)
    out.update({
        "variants": list(runs),
        "clipped_sum_rel_error": rel_err,
        "compile_seconds": {**compile_s, "loop_first_batch": round(loop_compile_s, 2)},
        "jax_compiles_timed": compiles.count,
    })
    return out


def readable(r: dict) -> str:
    m = r["model"]
    head = (
        f"GPT-2 {m['layers']} layers x {m['dim']} dim, vocab {m['vocab']}, seq {m['seq']} ({m['parameters']:,} "
        f"params) | N={r['records']}, Poisson q={r['sampling_rate']:.4g} (expected batch {r['expected_batch']}, "
        f"realised {min(r['batch_sizes'])}..{max(r['batch_sizes'])}), C={r['clip_norm']:.4g}, "
        f"sigma={r['noise_multiplier']:g}, AdamW"
    )
    rows = [("", "microbatch", "steps/s", "records/s", "median step s", "CPU s/step", "vs loop")]
    for name in [*r["variants"], "loop"]:
        x = r[name]
        micro = str(r["microbatch_size"][name]) if name in r["microbatch_size"] else "1 (Python)"
        ratio = f"{x['records_per_s'] / r['loop']['records_per_s']:.2f}x"
        rows.append((name, micro, f"{x['steps_per_s']:.2f}", f"{x['records_per_s']:.1f}",
                     f"{x['median_step_seconds']:.4f}", f"{x['cpu_seconds_per_step']:.3f}", ratio))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    table = "\n".join("  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in rows)
    errors = ", ".join(f"{name} {err:.1e}" for name, err in r["clipped_sum_rel_error"].items())
    tail = (
        f"clipped-sum relative error vs loop: {errors} (tolerance {SUM_TOL:g}); compiles during timing "
        f"{r['jax_compiles_timed']}; compile s {r['compile_seconds']}; {r['cpu_count']} CPUs, load at start "
        f"{r['loadavg_at_start']}; total {r['wall_seconds_total']:.0f} s"
    )
    return f"{head}\n{table}\n{tail}"


def main(argv=None) -> int:
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
    parser.add_argument("--repeats", type=int_at_least(1), default=10, help="timed steps per implementation")
    parser.add_argument("--seed", type=int_at_least(0), default=0)
    args = parser.parse_args(argv)
    if args.dim % args.heads:
        parser.error(f"--dim must be a multiple of --heads, got {args.dim} and {args.heads}")
    if args.batch > args.records:
        parser.error(f"--batch must be <= --records, got {args.batch} > {args.records}")

    start = time.perf_counter()
    result = machine_info()
    result.update(benchmark(args))
    result["wall_seconds_total"] = round(time.perf_counter() - start, 1)
    print(json.dumps(result) if args.json else readable(result), flush=True)
    if result["jax_compiles_timed"]:
        print(f"warning: {result['jax_compiles_timed']} XLA compilation(s) during the timed steps", file=sys.stderr)
    worst = max(result["clipped_sum_rel_error"].values())
    if not worst <= SUM_TOL:
        print(f"error: a clipped sum differs from the loop's by {worst:.2e} > {SUM_TOL} (relative L2)", file=sys.stderr)
        return 1
    if args.out:
        write_json(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
