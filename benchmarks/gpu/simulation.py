"""The simulator at 10^9 trials per hypothesis on one accelerator, against the device's random-bit throughput.

Usage::

    python benchmarks/gpu/simulation.py --out simulation.json [--trials N] [--cases pv_k2,pv_k16,poe,esa,ksa] \
        [--deadline SECONDS] [--json] [--seed S]
    python benchmarks/gpu/simulation.py --cpu-smoke --out /tmp/simulation_smoke.json

What is measured
----------------
The cases of ``benchmarks/bench_simulation.py`` (``eps = 4``, black-box attack, both hypotheses):
``pv_k2`` (PV, SnapAudit Table 11 votes), ``pv_k16`` (PV, 16 classes, 2000 sampled snapshots per
hypothesis, stratified scheme: the audit of sampled snapshots), ``poe``, ``esa`` (``d = 384``, two
candidates) and ``ksa`` (JEM top-4 of 10 keywords). Each runs ``N`` trials per hypothesis (default
10^9; ``--cpu-smoke`` 2^20) through :func:`snapaudit_jax.simulation.trials.simulate` with the
backend's defaults (on a GPU: ``ACCELERATOR_CHUNK_TRIALS`` per call, blocks vectorised to
``ACCELERATOR_STEP_TRIALS`` per scan step, capped at ``ACCELERATOR_STEP_ELEMENTS`` noise elements),
after a warm-up that compiles the timed functions.

The physical limit is the device's own random-bit throughput, measured in the same process:
``jax.random.bits`` (JAX's default, partitionable Threefry) and the simulator's counter-mode
:func:`snapaudit_jax.mechanisms.variates.random_words`, each as 32-bit words per second over one
large array. A case's *words per trial* count what its black-box draw consumes (``hit_noise``: two words per
normal or logistic variate, one per uint32 word -- PV from 4 classes on draws the target's normal
and a coin, four words --, one per bootstrap snapshot index), so
``limit_trials_per_s = words_per_s / words_per_trial`` and ``fraction_of_limit`` is the share of
the random-bit throughput the whole simulation (noise transform, release, counting) reaches.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # benchmarks/ (_common, bench_*)
sys.path.append(os.path.dirname(os.path.dirname(HERE)))  # the repository, unless the package is installed

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from _common import CompileCounter, int_at_least  # noqa: E402
from bench_simulation import SNAPSHOTS, build_case, build_snapshot_case  # noqa: E402
from snapaudit_jax.mechanisms import variates  # noqa: E402
from snapaudit_jax.simulation.trials import _noise_shapes, simulate  # noqa: E402
from snapaudit_jax.utils.io import write_json  # noqa: E402

CASES = ("pv_k2", "pv_k16", "poe", "esa", "ksa")
FULL_TRIALS, SMOKE_TRIALS = 10**9, 1 << 20
WARMUP_TRIALS = 1 << 24


def case_inputs(name: str, seed: int):
    """``(mechanism, attack, [snapshots per hypothesis], scheme)`` of one case."""
    if name == "pv_k16":
        mech, attack, cleans = build_snapshot_case(16, SNAPSHOTS, seed)
        return mech, attack, list(cleans), "stratified"
    mech, attack, cleans = build_case(name.removesuffix("_k2"))
    return mech, attack, [np.tile(clean, (SNAPSHOTS, 1)) for clean in cleans], "bootstrap"


def words_per_trial(mech, attack, snapshots: np.ndarray, scheme: str) -> int:
    """32-bit words one black-box trial consumes (``hit_noise``): two per float variate, one per integer word, one
    per snapshot index."""
    leaves = _noise_shapes(mech, attack, snapshots[0], scores=False)
    words = sum(math.prod(leaf.shape) * (1 if jnp.issubdtype(leaf.dtype, jnp.integer) else 2) for leaf in leaves)
    if scheme == "bootstrap" and len(np.unique(snapshots, axis=0)) > 1:
        words += 1
    return int(words)


def bit_throughput(size: int, repeats: int = 5) -> dict:
    """32-bit words per second of ``jax.random.bits`` and ``random_words`` over one ``(size,)`` array."""
    key = jax.random.key(1)
    fns = {"jax_random_bits": jax.jit(lambda k: jax.random.bits(k, (size,), jnp.uint32)),
           "random_words": jax.jit(lambda k: variates.random_words(k, (size,)))}
    out = {}
    for name, fn in fns.items():
        jax.block_until_ready(fn(key))
        best = math.inf
        for r in range(repeats):
            start = time.perf_counter()
            jax.block_until_ready(fn(jax.random.fold_in(key, r)))
            best = min(best, time.perf_counter() - start)
        out[name] = {"words_per_s": round(size / best, 1), "seconds": round(best, 6), "words": size}
    return out


def run_case(name: str, trials: int, seed: int, limits: dict) -> dict:
    mech, attack, snapshots, scheme = case_inputs(name, seed)
    keys = [jax.random.fold_in(jax.random.key(seed), h) for h in range(len(snapshots))]

    def hits(n):
        return [simulate(k, mech, attack, s, trials=n, scheme=scheme).hits.sum() for k, s in zip(keys, snapshots)]

    start = time.perf_counter()
    with CompileCounter() as warm:
        jax.block_until_ready(hits(min(trials, WARMUP_TRIALS)))
    first = time.perf_counter() - start
    with CompileCounter() as timed:
        start = time.perf_counter()
        counts = [int(h) for h in hits(trials)]
        seconds = time.perf_counter() - start
    run_trials = -(-trials // SNAPSHOTS) * SNAPSHOTS if scheme == "stratified" else trials
    rate = len(snapshots) * run_trials / seconds
    words = words_per_trial(mech, attack, snapshots[0], scheme)
    row = {
        "case": name, "status": "ok", "mechanism": mech.name, "scheme": scheme,
        "classes": int(np.shape(snapshots[0])[-1]),
        "distinct_snapshots": [int(len(np.unique(s, axis=0))) for s in snapshots],
        "trials_per_hypothesis": run_trials, "hypotheses": len(snapshots), "seconds": round(seconds, 4),
        "trials_per_s": round(rate, 1), "ns_per_trial": round(1e9 / rate, 4), "words_per_trial": words,
        "hit_rates": [round(c / run_trials, 7) for c in counts],
        "warmup_seconds": round(first, 3), "compile_seconds": round(warm.seconds, 3), "jax_compiles_timed": timed.count,
    }
    for src, limit in limits.items():
        limit_rate = limit["words_per_s"] / words
        row[f"limit_trials_per_s_{src}"] = round(limit_rate, 1)
        row[f"fraction_of_limit_{src}"] = round(rate / limit_rate, 4)
    return row


def _estimate(name: str, trials: int, rows: list[dict]) -> float:
    """Seconds a case may take: 30 s of compilation plus the slowest rate seen so far, or 5 s per 10^9 trials."""
    ns = max([r["ns_per_trial"] for r in rows if r.get("status") == "ok"] or [5.0])
    return 30.0 + 2 * trials * ns * 1e-9 * (4 if name == "ksa" else 1)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write the JSON result to this file (atomically)")
    parser.add_argument("--json", action="store_true", help="print the JSON result instead of readable lines")
    parser.add_argument("--cpu-smoke", action="store_true", help=f"{SMOKE_TRIALS} trials on the CPU, about 20 s")
    parser.add_argument("--trials", type=int_at_least(1, 2_000_000_000), help=f"trials per hypothesis "
                        f"(default {FULL_TRIALS:.0e}; smoke {SMOKE_TRIALS})")
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated subset of {','.join(CASES)}")
    parser.add_argument("--deadline", type=float, help="seconds from the start after which no case starts")
    parser.add_argument("--seed", type=int_at_least(0), default=0)
    args = parser.parse_args(argv)
    cases = [c for c in args.cases.split(",") if c]
    unknown = [c for c in cases if c not in CASES]
    if unknown or not cases:
        parser.error(f"--cases must name some of {', '.join(CASES)}, got {args.cases!r}")
    if args.deadline is not None and not args.deadline > 0:
        parser.error(f"--deadline must be > 0 seconds, got {args.deadline}")
    backend = jax.default_backend()
    if not args.cpu_smoke and backend == "cpu":
        print("error: no accelerator (jax.default_backend() is 'cpu'); use --cpu-smoke on a CPU", file=sys.stderr)
        return 2
    trials = args.trials or (SMOKE_TRIALS if args.cpu_smoke else FULL_TRIALS)
    start = time.perf_counter()
    limits = bit_throughput(1 << (22 if backend == "cpu" else 28))
    rows, failed = [], False
    for name in cases:
        left = None if args.deadline is None else args.deadline - (time.perf_counter() - start)
        if left is not None and left < _estimate(name, trials, rows):
            rows.append({"case": name, "status": "skipped", "reason": f"{left:.0f} s left before the deadline"})
            continue
        try:
            rows.append(run_case(name, trials, args.seed, limits))
        except Exception as err:  # recorded; the other cases still run
            failed = True
            rows.append({"case": name, "status": "error", "error": f"{type(err).__name__}: {err}"})
        row = rows[-1]
        if not args.json:
            if row["status"] == "ok":
                print(f"{name}: {row['trials_per_s'] / 1e6:,.1f} M trials/s ({row['words_per_trial']} words/trial, "
                      f"{row['fraction_of_limit_jax_random_bits']:.2f} of jax.random.bits' limit, "
                      f"{row['fraction_of_limit_random_words']:.2f} of random_words'), compile "
                      f"{row['compile_seconds']:.1f} s, hit rates {row['hit_rates']}", flush=True)
            else:
                print(f"{name}: {row['status']}: {row.get('error') or row.get('reason')}", flush=True)
    result = {
        "part": "simulation", "backend": backend, "device": str(jax.devices()[0].device_kind),
        "devices": len(jax.devices()), "jax": jax.__version__, "trials_per_hypothesis": trials,
        "random_bits": limits, "cases": rows, "wall_seconds": round(time.perf_counter() - start, 2),
    }
    if args.json:
        print(json.dumps(result), flush=True)
    else:
        print(f"random words/s: jax.random.bits {limits['jax_random_bits']['words_per_s'] / 1e9:.2f} G, "
              f"random_words {limits['random_words']['words_per_s'] / 1e9:.2f} G; {result['wall_seconds']:.0f} s")
    if args.out:
        write_json(args.out, result)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
