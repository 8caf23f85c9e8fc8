"""One DP-SGD step on the GPT-2-small shape against the non-private step of the same model and batch.

Usage::

    python benchmarks/gpu/dpsgd.py --out dpsgd.json [--records 1024] [--batch 64] [--seq 128] \
        [--microbatch M] [--repeats 5] [--paths book_keeping,book_keeping_bf16,per_record,book_keeping_batch,ghost] \
        [--deadline SECONDS] [--reserve SECONDS] [--json] \
        [--seed S] [--vocab-chunk ROWS]
    python benchmarks/gpu/dpsgd.py --cpu-smoke --out /tmp/dpsgd_smoke.json

What is measured
----------------
:class:`snapaudit_jax.models.decoders.GPT2` (float32) of the GPT-2-small shape (12 layers, width
768, 12 heads, vocabulary 50257; ``--cpu-smoke``: 2 layers x 64, vocabulary 512) on ``--records``
synthetic records of ``--seq`` tokens (``benchmarks/bench_dpsgd.make_data``), Poisson sampling at
``q = batch / records``:

* ``paths``: the jitted step of :func:`snapaudit_jax.dpsgd.train` (``_dp_step``) on each clipping path of
  ``--paths`` (``DPSGDConfig.clipping``): ``per_record`` (per-record gradients vectorised a microbatch of
  records at a time with ``vmap``, jax_privacy ``clipped_grad``), ``book_keeping`` (ghost norms and the clipped
  sum from one forward and one backward: every GPT-2 parameter is covered, the tied head and LayerNorms
  included) and ``ghost`` (the norms, then a second backward of the clip-weighted loss): the Poisson batch,
  each record's gradient clipped to ``C`` (the mean per-record norm of step 0), summed, Gaussian noise
  ``sigma C`` (``sigma = 1``), scaled by ``1 / (q N)``, AdamW; ``dp`` repeats the path ``clipping = "auto"``
  takes on this backend (``auto``: the path and the reason);
* ``book_keeping_batch``: book-keeping with the whole expected batch a microbatch (``ceil(q N)``, the remainder
  at ``tail_for``): whether the accelerators' default of 32 leaves the device idle;
* ``book_keeping_bf16``: book-keeping with bfloat16 clipped-sum operands (``DPSGDConfig.clipped_sum_dtype``: the
  products at the rate of the matrix units, two a dense layer), its check against the float32 gradient within
  ``2^-6`` (the factors' rounding);
* ``nonprivate`` (the limit): one jitted ``value_and_grad`` of the summed per-record losses of the
  *same* batch at its own size (compiled for every batch size before timing, so that it computes no record that
  is not there; the H200 figures of 2026-12-04 timed it padded to one size, which flattered every DP path's
  share), scaled by
  ``1 / (q N)``, the same AdamW -- what the step costs without per-record gradients.

Each path runs at the microbatch a user of the library gets on the backend (``DPSGDConfig.microbatch_for`` and
``tail_for`` with ``microbatch_size`` unset: on an accelerator ``m = min(32, q N)``, 32 at the expected batch of 64,
and the batch's remainder in microbatches of ``m / 4``; on the CPU 1 for ``per_record`` and up to 4 on the fast
paths), recorded per path as ``microbatch_size`` and ``tail_microbatch_size``; ``--microbatch M`` sets ``m`` on
every path but ``book_keeping_batch`` instead (the remainder at the library's ``tail_for(M)``). After the path
``auto`` takes, the paths run in the order of ``--paths`` (default: book-keeping, bfloat16 operands, per-record,
book-keeping with the whole batch a microbatch, ghost clipping).

``--vocab-chunk ROWS``: every step above, the non-private one included, runs the LM head a slice of ``ROWS``
vocabulary rows at a time (``DPSGDConfig.vocab_chunk``: no ``(batch, seq, vocab)`` logits); ``model.vocab_chunk``
in the JSON says which.

Under ``--deadline`` (the kit gives the seconds its budget has left) the path that ``clipping = "auto"`` takes is
checked and timed first, and a further path is started only if its checked and timed compiles (each projected at
the slowest checked compile so far), the timed compiles still owed, the non-private step's compiles and
``--reserve`` seconds for the timed steps fit before the deadline; the others are listed in ``skipped_paths`` with
the projection, and the part writes what it measured instead of being stopped with nothing.

``records_per_s`` is records of the realised batches over the summed step times, timed steps
rotating over the variants after one compiling step each; ``ratio_over_nonprivate`` (``ratio_dp_over_nonprivate``
for ``dp``) is the share of the non-private throughput each path keeps; ``median_step_time_ratio`` the median over
the timed steps of the path's step time over the non-private one's on the same batch (robust to one slow step).

The matrix products each step executes are counted from its jaxpr (:func:`snapaudit_jax.models.count_matmul_flops`;
nothing runs, a second or two a path): ``matmul_flops`` (over the timed steps; a DP step's microbatch calls with
their padded units, ``bench_dpsgd.dp_step_flops``), ``matmul_tflop_per_step`` (their mean) and
``achieved_tflop_per_s`` (over the summed step times) for every path and the non-private step; per path
``matmul_flops_over_nonprivate`` on the same batches, its inverse ``arithmetic_ceiling`` -- the share of the
non-private throughput the path can keep at most where every product runs at one rate (ghost norms' Gram products,
ghost clipping's second backward, padded units; ``null`` with bfloat16 operands, which a device multiplies faster)
-- and ``matmul_flops_by_operands``: each operand dtype's share, ``float32@highest`` the products that ask for full
float32 precision (the fast paths' norms and float32 clipped sums, ghost clipping's both passes: an accelerator runs
them without its matrix units, several times slower than the TF32 of the default precision).

``matmul_rates_tflop_per_s``: the device's rate for one large product (``matmul_rate_shape``) of each operand
class, float32 at the default precision (TF32 on a GPU), at full precision, and bfloat16 operands;
per path ``roofline_share``, the share of the non-private throughput predicted from the two steps' products at
those rates, and ``share_of_roofline_share``, the measured share over it (below 1: the path uses the device worse
than its products allow).

Check (before timing): with ``C`` far above every per-record norm and the noise off, each path's
clipped sum (read back from AdamW's first moment) equals the non-private gradient of the same batch
up to ``--tolerance`` relative L2 (default ``1e-4`` on every backend: the check runs with float32 products at
full precision, :func:`snapaudit_jax.models.precision.full_float32_precision`, where accelerators default to
TF32; the timed steps run at the backend's default); otherwise the script exits 1 and writes no file.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # benchmarks/ (_common, bench_*)
sys.path.append(os.path.dirname(os.path.dirname(HERE)))  # the repository, unless the package is installed

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from flax import nnx  # noqa: E402

from _common import CLIPPING_PATHS  # noqa: E402
from _common import int_at_least, number_at_least, paired_ratio  # noqa: E402
from bench_dpsgd import (  # noqa: E402
    B1, NOISE_MULTIPLIER, NonPrivate, batch_flops, dp_config, dp_step_flops, flat64, make_data, ours_step, rotate,
    same_layout, step_batches,
)
from snapaudit_jax.dpsgd.train import _prepare, resolve_clipping, resolve_layers  # noqa: E402
from snapaudit_jax.models.config import GPT2Config  # noqa: E402
from snapaudit_jax.models.decoders import GPT2  # noqa: E402
from snapaudit_jax.utils.io import write_json  # noqa: E402
from snapaudit_jax.models.precision import full_float32_precision  # noqa: E402

SHAPES = {
    "gpt2-small": dict(n_layer=12, n_embd=768, n_head=12, vocab_size=50257),
    "smoke": dict(n_layer=2, n_embd=64, n_head=4, vocab_size=512),
}
# No microbatch: each path's is the library's on the backend (DPSGDConfig.microbatch_for), unless --microbatch.
GPU_DEFAULTS = dict(records=1024, batch=64, seq=128, repeats=5, reserve=30.0)
SMOKE_DEFAULTS = dict(records=64, batch=8, seq=32, repeats=3, reserve=5.0)
HUGE_CLIP = 1e9
# Each timed variant: (DPSGDConfig.clipping, DPSGDConfig.clipped_sum_dtype).
VARIANTS = {**{path: (path, "float32") for path in CLIPPING_PATHS}, "book_keeping_bf16": ("book_keeping", "bfloat16"),
            "book_keeping_batch": ("book_keeping", "float32")}
# Variants whose microbatch is the expected batch itself (ceil(q N)), whatever the library's default or --microbatch:
# whether the fast path's accelerator default (32) leaves the device idle.
WHOLE_BATCH = ("book_keeping_batch",)
# The default order after the path clipping = "auto" takes (a deadline skips from the end): bfloat16 operands (no
# product at full float32 precision, which a GPU runs without its tensor cores: the accelerators' default may follow
# it), the per-record baseline, the microbatch question, ghost clipping.
PATHS = ("book_keeping", "book_keeping_bf16", "per_record", "book_keeping_batch", "ghost")
# The bfloat16 operands' check against the float32 batched gradient: their rounding, 2^-8 a product at most.
BF16_TOLERANCE = 2.0**-6


def variant_config(args, q: float, clip: float, name: str, micro, steps: int):
    """:func:`bench_dpsgd.dp_config` of variant ``name`` (its clipping path, clipped-sum operands and, for
    :data:`WHOLE_BATCH`, the expected batch as its microbatch)."""
    path, dtype = VARIANTS[name]
    if name in WHOLE_BATCH:
        micro = math.ceil(args.batch)
    return dataclasses.replace(dp_config(args, q, clip, path, micro, steps), clipped_sum_dtype=dtype)


def tolerance_of(name: str, tolerance: float) -> float:
    """The check's tolerance for variant ``name``: ``tolerance``, or the bfloat16 operands' rounding."""
    return tolerance if VARIANTS[name][1] == "float32" else max(tolerance, BF16_TOLERANCE)


def projected_seconds(compiles: dict, nonprivate_compile: float, sizes_left: int, reserve: float) -> float:
    """What one more path costs from here, with what is owed already: its checked and its timed step compiled (each
    about the slowest checked compile so far), the timed steps of the paths checked before it compiled, the
    non-private step compiled for ``sizes_left`` more batch sizes, and ``reserve`` seconds for the timed steps."""
    slowest = max(compiles.values())
    return 2.0 * slowest + sum(compiles.values()) + nonprivate_compile * sizes_left + reserve


# The product (rows, inner, columns) timed for each operand class: large enough to be bound by the device's
# arithmetic rather than its memory or a call's overhead (smoke: a small one).
RATE_SHAPES = {"gpt2-small": (16384, 4096, 4096), "smoke": (256, 64, 256)}


def operand_class(key: str) -> str:
    """The rate class of a :class:`~snapaudit_jax.models.flops.MatmulCount` ``by_operands`` key: full float32
    precision, bfloat16 operands, or float32 at the backend's default precision."""
    if key.endswith("@highest"):
        return "float32@highest"
    return "bfloat16" if key.startswith("bfloat16") else "float32"


def matmul_rates(shape: tuple[int, int, int], repeats: int = 5) -> dict[str, float]:
    """TFLOP/s of one jitted product of ``shape`` per operand class (float32 at the default precision, float32 at
    full precision, bfloat16 operands accumulated in float32; the operands made in their dtype beforehand), the
    median of ``repeats`` timed calls after one compiling call."""
    m, k, n = shape
    keys = jax.random.split(jax.random.key(0))
    out = {}
    for name, dtype, precision in (("float32", jnp.float32, None), ("float32@highest", jnp.float32, "highest"),
                                   ("bfloat16", jnp.bfloat16, None)):
        a = jax.random.normal(keys[0], (m, k), dtype)
        b = jax.random.normal(keys[1], (k, n), dtype)
        fn = jax.jit(functools.partial(jnp.matmul, precision=precision, preferred_element_type=jnp.float32))
        jax.block_until_ready(fn(a, b))
        times = []
        for _ in range(repeats):
            began = time.perf_counter()
            jax.block_until_ready(fn(a, b))
            times.append(time.perf_counter() - began)
        out[name] = round(2 * m * k * n / statistics.median(times) / 1e12, 4)
        del a, b
    return out


def roofline_seconds(by_operands: dict[str, int], rates: dict[str, float]) -> float:
    """Seconds of the products ``by_operands`` (counts) at the measured ``rates`` (TFLOP/s per operand class)."""
    return sum(count / (rates[operand_class(key)] * 1e12) for key, count in by_operands.items())


def benchmark(args, shape: str, started: float) -> dict:
    cfg = GPT2Config(n_positions=args.seq, n_inner=4 * SHAPES[shape]["n_embd"], **SHAPES[shape])
    model = GPT2(cfg, rngs=nnx.Rngs(args.seed))
    tokens_np, mask_np = make_data(args.records, args.seq, cfg.vocab_size, args.seed)
    tokens, mask = jnp.asarray(tokens_np), jnp.asarray(mask_np)
    q = args.batch / args.records
    key = jax.random.key(args.seed)
    batches = step_batches(key, args.records, q, args.repeats + 1)
    nonprivate = NonPrivate(same_layout(model), tokens, mask, normaliser=args.records * q,
                            vocab_chunk=args.vocab_chunk)
    num_params = int(sum(x.size for x in jax.tree.leaves(nonprivate.params)))
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    auto = resolve_clipping("auto", graphdef, params, rest, tokens[:1], mask[:1], vocab_chunk=args.vocab_chunk)
    layers = resolve_layers("auto", model, nnx.Param)  # every step below (and the baseline) runs this layout

    start = time.perf_counter()
    with full_float32_precision():
        batched = flat64(nonprivate.grad(nonprivate.params, *nonprivate.padded(batches[0])))
    np_compile = time.perf_counter() - start
    # Check, each path: huge clip, no noise -> the clipped sum equals the batched gradient (and compiles the step:
    # the clip norm and the noise are arguments of the compiled step, not constants).
    # The path clipping = "auto" takes goes first; one that would not be checked, compiled and timed before
    # --deadline (projected_seconds) is skipped with those after it, and the part writes what it measured.
    order = sorted(args.paths, key=lambda p: p != auto[0])
    sizes = [int(b.size) for b in batches[1:]]
    sizes_left = len(set(sizes))  # the check's compile ran at full precision, padded
    # The matrix products of the timed steps, counted from their jaxprs (nothing runs): the non-private step at
    # each batch's size here, each path after its check (its seconds in the deadline's projection).
    start = time.perf_counter()
    flops = {"nonprivate": batch_flops(lambda size: nonprivate.matmul_flops(max(1, size)), sizes)}  # as it runs
    count_seconds = {"nonprivate": time.perf_counter() - start}
    checks, compile_seconds, clip, skipped, checked_compiles = {}, {"nonprivate": round(np_compile, 2)}, None, {}, {}
    for path in order:
        if checks and args.deadline is not None:
            elapsed = time.perf_counter() - started
            need = projected_seconds(checked_compiles, np_compile, sizes_left, args.reserve)
            if skipped:
                skipped[path] = f"not started: {next(iter(skipped))}, before it, did not fit the deadline"
                continue
            if elapsed + need > args.deadline:
                skipped[path] = (f"not started at {elapsed:.0f} s of the {args.deadline:.0f} s deadline: checking, "
                                 f"compiling and timing it with the paths before it projected {need:.0f} s more")
                continue
        run = _prepare(model, (tokens_np, mask_np), variant_config(args, q, HUGE_CLIP, path, args.microbatch, 1),
                       key)
        start = time.perf_counter()
        with full_float32_precision():
            _, opt_after, metrics = ours_step(run, 0, jax.tree.map(jnp.array, run.params),
                                              jax.tree.map(jnp.array, run.opt_state),
                                              run.hyper._replace(noise_std=jnp.float32(0.0)))
        checked_compiles[path] = time.perf_counter() - start
        compile_seconds[path] = round(checked_compiles[path], 2)
        dp_sum = flat64(optax.tree_utils.tree_get(opt_after, "mu")) * (args.records * q) / (1.0 - B1)
        checks[path] = float(np.linalg.norm(dp_sum - batched) / np.linalg.norm(batched))
        if int(metrics["batch_size"]) != batches[0].size:
            raise RuntimeError(f"{path} step 0 has {int(metrics['batch_size'])} records, poisson_batch "
                               f"{batches[0].size}")
        if clip is None:  # the timed steps clip at the mean per-record norm of step 0 (many records clipped)
            clip = float(metrics["norm_sum"]) / max(1, int(metrics["batch_size"]))
        start = time.perf_counter()
        flops[path] = dp_step_flops(run, sizes)
        count_seconds[path] = time.perf_counter() - start
        checked_compiles[path] += count_seconds[path]

    timed = [p for p in args.paths if p in checks]
    runs, state = {}, {}
    for path in timed:
        runs[path] = _prepare(model, (tokens_np, mask_np),
                              variant_config(args, q, clip, path, args.microbatch, args.repeats + 1), key)
        state[path] = ours_step(runs[path], 0, runs[path].params, runs[path].opt_state, runs[path].hyper)[:2]
    nonprivate_sizes = nonprivate.warm(batches[1:])  # compiles the step for every timed batch size
    wall, compiled = rotate(runs, state, nonprivate, batches, args.repeats)
    rates_measured = matmul_rates(RATE_SHAPES[shape])  # after the timed steps: nothing of it in theirs
    roofline = {name: roofline_seconds(counts, rates_measured) for name, (_, counts) in flops.items()}

    def rates(name):
        total = flops[name][0]
        return {"records_per_s": round(sum(sizes) / sum(wall[name]), 2),
                "median_step_seconds": round(statistics.median(wall[name]), 5), "step_seconds": wall[name],
                "matmul_flops": total, "matmul_tflop_per_step": round(total / len(sizes) / 1e12, 6),
                "achieved_tflop_per_s": round(total / sum(wall[name]) / 1e12, 4)}

    paths = {path: {**rates(path), "check_rel_error": checks[path], "clipped_sum_dtype": VARIANTS[path][1],
                    "microbatch_size": runs[path].spec.microbatch_size,
                    "tail_microbatch_size": runs[path].spec.tail_size,
                    "ratio_over_nonprivate": round(sum(wall["nonprivate"]) / sum(wall[path]), 4),
                    "median_step_time_ratio": paired_ratio(wall, path, "nonprivate"),
                    "matmul_flops_over_nonprivate": round(flops[path][0] / flops["nonprivate"][0], 4),
                    "arithmetic_ceiling": (round(flops["nonprivate"][0] / flops[path][0], 4)
                                           if all(k.split("@")[0] == "float32" for k in flops[path][1]) else None),
                    "matmul_flops_by_operands": {k: round(v / flops[path][0], 4) for k, v in flops[path][1].items()},
                    "roofline_share": round(roofline["nonprivate"] / roofline[path], 4),
                    "share_of_roofline_share": round(sum(wall["nonprivate"]) / sum(wall[path])
                                                     / (roofline["nonprivate"] / roofline[path]), 4)}
             for path in timed}
    default = auto[0] if auto[0] in paths else order[0]
    out = {
        "model": {"kind": "GPT2", "shape": shape, "layers": cfg.n_layer, "dim": cfg.n_embd, "heads": cfg.n_head,
                  "vocab": cfg.vocab_size, "vocab_chunk": args.vocab_chunk, "seq": args.seq,
                  "parameters": num_params},
        "records": args.records, "expected_batch": args.batch, "sampling_rate": q, "batch_sizes": sizes,
        "nonprivate_batch_sizes": nonprivate_sizes, "microbatch_size": runs[default].spec.microbatch_size,
        "tail_microbatch_size": runs[default].spec.tail_size,
        "clip_norm": clip,
        "noise_multiplier": NOISE_MULTIPLIER, "optimizer": "adamw",
        "auto": {"path": auto[0], "reason": auto[1]}, "layers": {"layout": layers[0], "reason": layers[1]},
        "dp_path": default, "paths": paths, "skipped_paths": skipped,
        "dp": rates(default), "nonprivate": rates("nonprivate"),
        # the float32 variants' worst check (the bfloat16 one's is in its "paths" entry, with its own tolerance)
        "check_rel_error": max((e for p, e in checks.items() if VARIANTS[p][1] == "float32"), default=0.0),
        "compile_seconds": compile_seconds,
        "matmul_count_seconds": {name: round(value, 2) for name, value in count_seconds.items()},
        "matmul_rates_tflop_per_s": rates_measured, "matmul_rate_shape": list(RATE_SHAPES[shape]),
        "jax_compiles_timed": compiled,
    }
    out["ratio_dp_over_nonprivate"] = paths[default]["ratio_over_nonprivate"]
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write the JSON result to this file (atomically)")
    parser.add_argument("--json", action="store_true", help="print the JSON result instead of a readable summary")
    parser.add_argument("--cpu-smoke", action="store_true", help="a 2-layer GPT-2 on the CPU, about 20 s")
    parser.add_argument("--records", type=int_at_least(2))
    parser.add_argument("--batch", type=int_at_least(1), help="expected (Poisson) batch")
    parser.add_argument("--seq", type=int_at_least(4), help="tokens per record")
    parser.add_argument("--microbatch", type=int_at_least(1),
                        help="records per clipped-gradient call on every path (default: each path's library default)")
    parser.add_argument("--repeats", type=int_at_least(1), help="timed steps per implementation")
    parser.add_argument("--tolerance", type=number_at_least(0.0, strict=True),
                        help="relative L2 error allowed by the check")
    parser.add_argument("--deadline", type=number_at_least(0.0),
                        help="seconds from the start; the part is skipped if fewer than 60 are given, and a clipping "
                        "path that would not be timed before it is skipped (the path clipping='auto' takes is "
                        "timed first)")
    parser.add_argument("--reserve", type=number_at_least(0.0),
                        help="seconds the deadline's projection keeps for the timed steps (default 30; smoke 5)")
    parser.add_argument("--paths", default=",".join(PATHS),
                        help=f"clipping paths timed, comma-separated (default: {','.join(PATHS)})")
    parser.add_argument("--seed", type=int_at_least(0), default=0)
    parser.add_argument("--vocab-chunk", type=int_at_least(1), default=None,
                        help="run every step's LM head a slice of this many vocabulary rows at a time")
    args = parser.parse_args(argv)
    args.paths = [p for p in args.paths.split(",") if p]
    if not args.paths or any(p not in PATHS for p in args.paths) or len(set(args.paths)) < len(args.paths):
        parser.error(f"--paths must name some of {', '.join(PATHS)} once each, got {','.join(args.paths)!r}")
    for name, value in (SMOKE_DEFAULTS if args.cpu_smoke else GPU_DEFAULTS).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.batch > args.records:
        parser.error(f"--batch must be <= --records, got {args.batch} > {args.records}")
    backend = jax.default_backend()
    if not args.cpu_smoke and backend == "cpu":
        print("error: no accelerator (jax.default_backend() is 'cpu'); use --cpu-smoke on a CPU", file=sys.stderr)
        return 2
    tolerance = args.tolerance if args.tolerance is not None else 1e-4
    result = {"part": "dpsgd", "backend": backend, "device": str(jax.devices()[0].device_kind), "jax": jax.__version__}
    start = time.perf_counter()
    if args.deadline is not None and args.deadline < 60:
        result.update(status="skipped", reason=f"{args.deadline:.0f} s left before the deadline")
    else:
        result.update(status="ok", **benchmark(args, "smoke" if args.cpu_smoke else "gpt2-small", start))
    result["wall_seconds"] = round(time.perf_counter() - start, 2)
    if args.json:
        print(json.dumps(result), flush=True)
    elif result["status"] == "ok":
        m = result["model"]
        dp, nonprivate = result["dp"]["records_per_s"], result["nonprivate"]["records_per_s"]
        each = ", ".join(f"{p} {r['records_per_s']:,.1f} ({r['ratio_over_nonprivate']:.3f} of at most "
                         f"{'n/a' if r['arithmetic_ceiling'] is None else format(r['arithmetic_ceiling'], '.3f')}, "
                         f"{r['achieved_tflop_per_s']:.3g} TFLOP/s, "
                         f"microbatch "
                         f"{r['microbatch_size']}/{r['tail_microbatch_size']})" for p, r in result["paths"].items())
        print(f"DP-SGD GPT-2 {m['shape']} ({m['parameters']:,} params, seq {m['seq']}, "
              f"batches {result['batch_sizes']}): records/s (share of non-private of at most its arithmetic's, "
              f"products' rate, microbatch/remainder's) {each}; non-private {nonprivate:,.1f} "
              f"({result['nonprivate']['achieved_tflop_per_s']:.3g} TFLOP/s); auto takes {result['dp_path']} "
              f"({dp:,.1f}); check rel. error {result['check_rel_error']:.1e}; compile {result['compile_seconds']}"
              + "".join(f"; {p} skipped: {why}" for p, why in result["skipped_paths"].items()), flush=True)
    else:
        print(f"DP-SGD: skipped: {result['reason']}", flush=True)
    failed = [p for p, r in result.get("paths", {}).items() if not r["check_rel_error"] <= tolerance_of(p, tolerance)]
    if result["status"] == "ok" and failed:
        error = result["paths"][failed[0]]["check_rel_error"]
        print(f"error: the {failed[0]} path's clipped sum differs from the batched gradient by {error:.2e} > "
              f"{tolerance_of(failed[0], tolerance):g} (relative L2)", file=sys.stderr)
        return 1
    if args.out:
        write_json(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
