"""Throughput and memory of the JAX simulator against a plain NumPy baseline.

Usage::

    python benchmarks/bench_simulation.py --mechanism {pv,poe,esa,ksa} --trials N \
        [--json] [--out FILE.json] [--seed S] [--chunk-trials C]

What is measured
----------------
One mechanism at ``eps = 4`` (``delta = 1e-5`` for the Gaussian ones) on the
command line's default clean outputs (:data:`snapaudit_jax.runner.DEFAULT_CLEAN`;
ESA: two unit embeddings of ``R^384`` at distance 1.419, one partition) with
the default black-box attack (:func:`snapaudit_jax.audit.make_attack`). Each
implementation runs ``N`` trials for *each* of the two hypotheses (clean
output with and without the canary; ``"hypotheses": 2``), so the rates are
``2 N / wall seconds``:

* ``jax``: :func:`snapaudit_jax.simulate.simulate` (bootstrap scheme over
  2000 identical snapshots, one total count), sharded over
  ``--xla_force_host_platform_device_count=<cores>`` host devices like the
  CLI. It is warmed up first with ``min(N, chunk)`` trials, which compiles the
  very chunk function of the timed run; backend compilations during the
  timed run are counted (``jax_compiles_timed``, expected 0).
* ``numpy``: the same trials in plain vectorised NumPy
  (``np.random.default_rng(seed)``), processed in chunks of 2**20 trials so
  memory stays bounded, after a one-chunk warm-up. It samples the same
  distribution through the same reduction as the engine: PV and ESA draw
  float32 normals as the engine does; ESA draws ``N(0, I_r)`` in an
  orthonormal basis of ``span(candidates, w)`` instead of ``d``-dimensional
  noise; KSA reuses the per-histogram JEM pair table of
  :func:`snapaudit_jax.jem.jem_prepare` and samples the pair by Gumbel-max,
  then the ``K`` positions one after the other. Pairs of probability zero are
  dropped from the table (the engine keeps them for static shapes).
* ``numpy_naive`` (ESA only, extra key): full ``d``-dimensional noise on
  ``min(N, 10**6)`` trials per hypothesis; not used for ``ratio``.

NumPy runs with ``OPENBLAS_NUM_THREADS=1`` unless the variable is set
(reported as ``openblas_num_threads``).

``ratio = jax_trials_per_s / numpy_trials_per_s``. ``peak_rss_mb`` is the
process' peak resident memory (``ru_maxrss``) right after the JAX runs,
before any NumPy work; ``numpy_peak_rss_mb`` is the same after the NumPy
baseline (peaks only grow, so it bounds the NumPy run from above).

The hit rates of every implementation are reported per hypothesis
(``jax_hits``, ``numpy_hits``) and compared with a two-sample binomial
z-statistic: beyond 6 standard errors the two did not run the same trials,
the script warns on stderr, writes no ``--out`` file and exits with status 1.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import sys
import time
from collections.abc import Callable

# The simulator shards over host devices; XLA reads this when its backend starts.
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={os.cpu_count() or 1}"
    ).strip()
# OpenBLAS's threaded path makes the tall, skinny products of the ESA baselines erratic
# (up to ~100x slower); NumPy's generators are single-threaded anyway. Read at import.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import snapaudit_jax as sa  # noqa: E402
from snapaudit_jax._io import write_json  # noqa: E402
from snapaudit_jax.audit import make_attack  # noqa: E402
from snapaudit_jax.jem import bucket_num_values  # noqa: E402
from snapaudit_jax.runner import DEFAULT_CLEAN, esa_unit_pair  # noqa: E402
from snapaudit_jax.simulate import CHUNK_TRIALS, simulate  # noqa: E402

EPSILON, DELTA = 4.0, 1e-5
SNAPSHOTS = 2000
NUMPY_CHUNK = 1 << 20
NAIVE_TRIALS = 10**6
NAIVE_CHUNK = 1 << 14  # (chunk, 384) float32 noise: 25 MB
MAX_Z = 6.0
HYPOTHESES = ("with", "without")
_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"

# A NumPy trial sampler: ``sampler(rng, m)`` runs ``m`` trials, returns the hit count.
Sampler = Callable[[np.random.Generator, int], int]


def build_case(name: str):
    """``(mechanism, attack, (clean_with, clean_without))`` of one benchmark."""
    if name == "esa":
        u1, u2 = esa_unit_pair(1.419, 384)
        mech = sa.EmbeddingSpaceAggregation.calibrated(EPSILON, DELTA, np.stack([u1, u2]), partitions=1)
        w, wo = u1, u2
    else:
        w, wo = map(np.asarray, DEFAULT_CLEAN[name])
        if name == "pv":
            mech = sa.PrivateVoting.calibrated(EPSILON, DELTA)
        elif name == "poe":
            mech = sa.ProductOfExperts.calibrated(EPSILON, clip=5.0)
        else:
            mech = sa.KeywordSpaceAggregation.calibrated(EPSILON, top_k=4)
            mech = mech.with_static(num_values=bucket_num_values(np.stack([w, wo])))
    return mech, make_attack(mech, w, wo), (np.asarray(w, np.float64), np.asarray(wo, np.float64))


# NumPy baselines: one factory per mechanism, ``factory(mech, attack, clean) -> Sampler``.


def numpy_pv(mech, attack, clean) -> Sampler:
    votes = clean.astype(np.float32)
    sigma = np.float32(mech.sigma)

    def sampler(rng, m):
        z = votes + sigma * rng.standard_normal((m, votes.size), dtype=np.float32)
        return np.count_nonzero(z.argmax(1) == attack.target)

    return sampler


def numpy_poe(mech, attack, clean) -> Sampler:
    scaled = clean * float(mech.scale)

    def sampler(rng, m):
        z = scaled + rng.gumbel(size=(m, scaled.size))
        return np.count_nonzero(z.argmax(1) == attack.target)

    return sampler


def numpy_esa(mech, attack, clean) -> Sampler:
    # |m + sZ - c_i|^2 = |m - c_i|^2 - 2s<Z, c_i> + (terms common to all i), and <Z, c_i> only
    # depends on the coordinates of Z in an orthonormal basis Q of span(c_1..c_c, w).
    cand = np.asarray(mech.candidates, np.float64)
    w = np.asarray(attack.reference_with, np.float64) - np.asarray(attack.reference_without, np.float64)
    q, _ = np.linalg.qr(np.vstack([cand, w]).T)
    sq_dist = np.sum((clean - cand) ** 2, axis=1).astype(np.float32)
    proj_t = (2.0 * float(mech.sigma) * (cand @ q)).T.astype(np.float32)  # (r, c)

    def sampler(rng, m):
        y = rng.standard_normal((m, q.shape[1]), dtype=np.float32)
        return np.count_nonzero(np.argmin(sq_dist - y @ proj_t, axis=1) == attack.target)

    return sampler


def numpy_esa_naive(mech, attack, clean) -> Sampler:
    mean = clean.astype(np.float32)
    cand = np.asarray(mech.candidates, np.float32)
    cand_sq = np.sum(cand * cand, axis=1)
    sigma = np.float32(mech.sigma)

    def sampler(rng, m):
        noisy = mean + sigma * rng.standard_normal((m, mean.size), dtype=np.float32)
        return np.count_nonzero(np.argmin(cand_sq - 2.0 * (noisy @ cand.T), axis=1) == attack.target)

    return sampler


def numpy_ksa(mech, attack, clean) -> Sampler:
    # Per-histogram precomputation: the engine's JEM pair table, then for every pair
    # (i*, v) and position l the prefix of the sorted items position l draws from.
    k = mech.top_k
    table = mech.prepare(jnp.asarray(clean, jnp.float32), attack).table
    keep = np.isfinite(np.asarray(table.logits))  # zero-probability pairs never win the Gumbel-max
    logits = np.asarray(table.logits, np.float64)[keep]
    star = np.asarray(table.pair_pos)[keep]
    value = np.asarray(table.pair_value, np.float64)[keep]
    c = np.asarray(table.sorted_counts, np.float64)  # decreasing
    d = c.size
    pairs = np.arange(logits.size)
    # Threshold of position l for gap g = c_(i*) - v: c_(l) - g (exactly v at l = i*).
    thr = c[None, :k] - c[star][:, None] + value[:, None]
    thr[pairs, star] = value
    a = np.sum(c[None, None, :] >= thr[:, :, None], axis=-1)  # |A_l|
    b = np.sum(c[None, None, :] > thr[:, :, None], axis=-1)  # |B_l|
    pos = np.arange(k)[None, :]
    is_star = pos == star[:, None]
    # Before i*: uniform over B_l minus the l chosen; at i*: uniform over A \ B (never
    # chosen before); after i*: uniform over A_l minus the l chosen.
    avail = np.where(pos < star[:, None], b - pos, np.where(is_star, a - b, a - pos))
    target_pos = int(np.flatnonzero(np.asarray(table.order) == attack.target)[0])

    def sampler(rng, m):
        p = np.argmax(logits + rng.gumbel(size=(m, logits.size)), axis=1)
        chosen = np.zeros((m, d), bool)
        rows = np.arange(m)
        for l in range(k):
            r = rng.integers(avail[p, l])
            # The r-th (0-based) unchosen sorted position; it lies in the prefix.
            rth_free = np.argmax(np.cumsum(~chosen, axis=1) > r[:, None], axis=1)
            chosen[rows, np.where(is_star[p, l], b[p, l] + r, rth_free)] = True
        return np.count_nonzero(chosen[:, target_pos])

    return sampler


NUMPY = {"pv": numpy_pv, "poe": numpy_poe, "esa": numpy_esa, "ksa": numpy_ksa}


def run_engine(keys, mech, attack, snapshots, trials: int, chunk: int) -> list[int]:
    """Black-box hits of ``simulate`` for every hypothesis."""
    return [
        int(simulate(key, mech, attack, snaps, trials=trials, per_unit=False, chunk_trials=chunk).hits.sum())
        for key, snaps in zip(keys, snapshots)
    ]


def run_numpy(samplers: list[Sampler], rng: np.random.Generator, trials: int, chunk: int) -> list[int]:
    """Hits of every hypothesis' sampler over ``trials`` trials, ``chunk`` at a time."""
    hits = []
    for sampler in samplers:
        total = 0
        for start in range(0, trials, chunk):
            total += int(sampler(rng, min(chunk, trials - start)))
        hits.append(total)
    return hits


def timed(fn, *args):
    start = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - start


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def binomial_z(hits1: int, n1: int, hits2: int, n2: int) -> float:
    """Two-sample z-statistic of the difference of two binomial rates (pooled variance)."""
    diff = hits1 / n1 - hits2 / n2
    if diff == 0:
        return 0.0
    pooled = (hits1 + hits2) / (n1 + n2)
    return abs(diff) / math.sqrt(pooled * (1 - pooled) * (1 / n1 + 1 / n2))


def benchmark(name: str, trials: int, seed: int, chunk: int) -> dict:
    mech, attack, cleans = build_case(name)
    stream = jax.random.key(seed)
    keys = [jax.random.fold_in(stream, h) for h in range(len(cleans))]
    snapshots = [np.tile(clean, (SNAPSHOTS, 1)) for clean in cleans]

    run_engine(keys[:1], mech, attack, snapshots[:1], min(trials, chunk), chunk)  # compiles
    compiles = []

    def count_compiles(event: str, duration: float, **kwargs) -> None:
        if event == _COMPILE_EVENT:
            compiles.append(duration)

    jax.monitoring.register_event_duration_secs_listener(count_compiles)
    jax_hits, jax_s = timed(run_engine, keys, mech, attack, snapshots, trials, chunk)
    jax.monitoring.unregister_event_duration_listener(count_compiles)
    jax_peak = peak_rss_mb()

    rng = np.random.default_rng(seed)
    samplers = [NUMPY[name](mech, attack, clean) for clean in cleans]
    run_numpy(samplers[:1], rng, min(trials, NUMPY_CHUNK), NUMPY_CHUNK)
    np_hits, np_s = timed(run_numpy, samplers, rng, trials, NUMPY_CHUNK)
    np_peak = peak_rss_mb()

    jax_rate, np_rate = len(cleans) * trials / jax_s, len(cleans) * trials / np_s
    result = {
        "mechanism": name,
        "trials": trials,
        "hypotheses": len(cleans),
        "jax_trials_per_s": round(jax_rate, 1),
        "numpy_trials_per_s": round(np_rate, 1),
        "ratio": round(jax_rate / np_rate, 3),
        "peak_rss_mb": round(jax_peak, 1),
        "numpy_peak_rss_mb": round(np_peak, 1),
        "jax_seconds": round(jax_s, 3),
        "numpy_seconds": round(np_s, 3),
        "jax_compiles_timed": len(compiles),
        "devices": len(jax.devices()),
        "openblas_num_threads": os.environ["OPENBLAS_NUM_THREADS"],
        "chunk_trials": chunk,
        "numpy_chunk_trials": NUMPY_CHUNK,
        "jax_hits": {h: j / trials for h, j in zip(HYPOTHESES, jax_hits)},
        "numpy_hits": {h: n / trials for h, n in zip(HYPOTHESES, np_hits)},
    }
    z = [binomial_z(j, trials, n, trials) for j, n in zip(jax_hits, np_hits)]
    if name == "esa":
        naive_trials = min(trials, NAIVE_TRIALS)
        naive = [numpy_esa_naive(mech, attack, clean) for clean in cleans]
        run_numpy(naive[:1], rng, min(naive_trials, NAIVE_CHUNK), NAIVE_CHUNK)
        naive_hits, naive_s = timed(run_numpy, naive, rng, naive_trials, NAIVE_CHUNK)
        result["numpy_naive_trials"] = naive_trials
        result["numpy_naive_trials_per_s"] = round(len(cleans) * naive_trials / naive_s, 1)
        result["numpy_naive_seconds"] = round(naive_s, 3)
        result["numpy_naive_hits"] = {h: n / naive_trials for h, n in zip(HYPOTHESES, naive_hits)}
        z += [binomial_z(j, trials, n, naive_trials) for j, n in zip(jax_hits, naive_hits)]
    result["max_hit_z"] = round(max(z), 3)
    return result


def readable(r: dict) -> str:
    line = (
        f"{r['mechanism']}: {r['trials']:,} trials x {r['hypotheses']} hypotheses on {r['devices']} devices | "
        f"jax {r['jax_trials_per_s'] / 1e6:,.2f} M/s ({r['jax_seconds']:.2f} s) | "
        f"numpy {r['numpy_trials_per_s'] / 1e6:,.2f} M/s ({r['numpy_seconds']:.2f} s) | ratio {r['ratio']:.2f} | "
        f"peak RSS {r['peak_rss_mb']:.0f} MB after jax, {r['numpy_peak_rss_mb']:.0f} MB after numpy | "
        f"hit rates jax {r['jax_hits']} numpy {r['numpy_hits']} (max z {r['max_hit_z']})"
    )
    if "numpy_naive_trials_per_s" in r:
        line += f" | naive numpy (d-dim noise) {r['numpy_naive_trials_per_s'] / 1e6:,.3f} M/s"
    return line


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mechanism", required=True, choices=sorted(NUMPY))
    parser.add_argument("--trials", required=True, type=positive_int, help="trials per hypothesis")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a readable line")
    parser.add_argument("--out", help="also write the JSON object to this file (atomically)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--chunk-trials", type=positive_int, default=CHUNK_TRIALS, help="trials per jitted call")
    args = parser.parse_args(argv)

    result = benchmark(args.mechanism, args.trials, args.seed, args.chunk_trials)
    print(json.dumps(result) if args.json else readable(result), flush=True)
    if result["jax_compiles_timed"]:
        print(f"warning: {result['jax_compiles_timed']} XLA compilation(s) inside the timed JAX run", file=sys.stderr)
    if result["max_hit_z"] > MAX_Z:
        print(
            f"error: hit rates differ by {result['max_hit_z']} > {MAX_Z} binomial standard errors: "
            "the implementations did not run the same trials",
            file=sys.stderr,
        )
        return 1
    if args.out:
        write_json(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
