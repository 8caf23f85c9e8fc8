"""Throughput and memory of the JAX simulator against a plain NumPy baseline.

Usage::

    python benchmarks/bench_simulation.py --mechanism {pv,poe,esa,ksa} --trials N \
        [--json] [--out FILE.json] [--seed S] [--chunk-trials C]
    python benchmarks/bench_simulation.py --mechanism pv --classes K --snapshots S --trials N \
        [--scheme {stratified,bootstrap}] [...]

What is measured
----------------
One mechanism at ``eps = 4`` (``delta = 1e-5`` for the Gaussian ones) on the
command line's default clean outputs (:data:`snapaudit_jax.audits.command.DEFAULT_CLEAN`;
ESA: two unit embeddings of ``R^384`` at distance 1.419, one partition) with
the default black-box attack (:func:`snapaudit_jax.audits.active.make_attack`). Each
implementation runs ``N`` trials for *each* of the two hypotheses (clean
output with and without the canary; ``"hypotheses": 2``), so the rates are
``2 N / wall seconds``:

* ``jax``: :func:`snapaudit_jax.simulation.trials.simulate` (bootstrap scheme over
  2000 identical snapshots, one total count), sharded over
  ``--xla_force_host_platform_device_count=<cores>`` host devices like the
  CLI. It is warmed up first with ``min(N, chunk)`` trials per hypothesis, which
  compiles the very chunk functions of the timed run; backend compilations during the
  timed run are counted (``jax_compiles_timed``, expected 0).
* ``numpy`` (the baseline of ``ratio``): the same trials in plain vectorised
  NumPy (``np.random.default_rng(seed)``), written the textbook way: PV adds
  ``k`` normals and takes the arg-max, PoE adds ``k`` Gumbels, ESA adds
  ``d``-dimensional noise to the mean and finds the nearest candidate, KSA
  samples the JEM pair by Gumbel-max over the engine's pair table
  (:func:`snapaudit_jax.mechanisms.ksa.jem_prepare`), then the ``K`` positions. It runs
  in chunks of 2**20 trials (2**14 for ESA), after a one-chunk warm-up, on
  ``min(N, numpy_trials)`` trials per hypothesis (ESA: at most 10**6).
``--snapshots S`` (PV only, with ``--classes K``, default 4) audits ``S`` *sampled* snapshots per
hypothesis, as ``snapaudit audit`` does with ``clean = "sampled"``: vote vectors of ``T = 8``
partitions drawn once (``np.random.default_rng(seed + 1)``), each partition voting for the target
class with probability 0.4 with the canary and 0.15 without (the rest uniform over the other
classes), a black-box attack on the target, counts per snapshot. ``--scheme stratified`` (the
default: every snapshot gets ``ceil(N / S)`` trials, the audit's scheme for sampled snapshots) or
``bootstrap`` (a uniform snapshot per trial, counts per distinct snapshot: ``clean = "fixed"``).
The ``numpy`` baseline is plain chunked float32 NumPy of the same trials: the chunk's vote rows
(tiled rounds of all snapshots, or uniformly drawn ones), plus ``K`` normals each, the arg-max,
hits counted per snapshot (``np.bincount``). ``numpy_same_noise`` runs the engine's black-box draw:
from 4 classes on the target's normal and a coin on ``prod_j Phi((v_t - v_j) / sigma + z)``
(``scipy.special.log_ndtr``, float64), below that ``K - 1`` contrast normals.

* ``numpy_same_noise`` (extra key, ``ratio_same_noise``): NumPy drawing only
  the *sufficient noise* the engine draws (see
  :mod:`snapaudit_jax.mechanisms.base`): PV ``k - 1`` normals in the contrast
  space, PoE one logistic (the noisy margin), ESA ``c`` normals in the span of
  the candidate differences and the attack direction, KSA the engine's alias
  table for the pair. This isolates the JAX execution from the algorithm.

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
from scipy import special  # noqa: E402

import snapaudit_jax as sa  # noqa: E402
from _common import CompileCounter, int_at_least, timed  # noqa: E402
from snapaudit_jax.utils.io import write_json  # noqa: E402
from snapaudit_jax.audits.active import make_attack  # noqa: E402
from snapaudit_jax.mechanisms.ksa import bucket_num_values  # noqa: E402
from snapaudit_jax.mechanisms.pv import _CONDITIONAL_FROM as PV_CONDITIONAL_FROM  # noqa: E402
from snapaudit_jax.audits.command import DEFAULT_CLEAN, esa_unit_pair  # noqa: E402
from snapaudit_jax.simulation.trials import ACCELERATOR_CHUNK_TRIALS, CHUNK_TRIALS, simulate  # noqa: E402

EPSILON, DELTA = 4.0, 1e-5
SNAPSHOTS = 2000
NUMPY_CHUNK = 1 << 20
MAX_Z = 6.0
HYPOTHESES = ("with", "without")

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


PARTITIONS = 8
TARGET_VOTE = {"with": 0.4, "without": 0.15}


def build_snapshot_case(classes: int, snapshots: int, seed: int):
    """PV with ``snapshots`` sampled vote vectors per hypothesis: ``(mechanism, attack, (with, without))``.

    Each of ``PARTITIONS`` partitions votes for the target class 0 with probability ``TARGET_VOTE[hypothesis]``,
    otherwise uniformly for another class; the attack's references are the hypotheses' mean vote vectors.
    """
    rng = np.random.default_rng(seed + 1)
    mech = sa.PrivateVoting.calibrated(EPSILON, DELTA)
    cleans = []
    for hypothesis in HYPOTHESES:
        p_target = TARGET_VOTE[hypothesis]
        probs = np.full(classes, (1.0 - p_target) / (classes - 1))
        probs[0] = p_target
        cleans.append(rng.multinomial(PARTITIONS, probs, size=snapshots).astype(np.float64))
    attack = make_attack(mech, cleans[0].mean(0), cleans[1].mean(0), target=0)
    return mech, attack, tuple(cleans)


# NumPy baselines: ``factory(mech, attack, clean) -> Sampler``.


def gumbel_argmax(rng: np.random.Generator, logits: np.ndarray, m: int) -> np.ndarray:
    """``argmax(logits + Gumbel(0, 1))`` for ``m`` independent draws (noise updated in place)."""
    noisy = rng.gumbel(size=(m, logits.size))
    noisy += logits
    return noisy.argmax(1)


def plain_pv(mech, attack, clean) -> Sampler:
    votes = clean.astype(np.float32)
    sigma = np.float32(mech.sigma)

    def sampler(rng, m):
        z = votes + sigma * rng.standard_normal((m, votes.size), dtype=np.float32)
        return np.count_nonzero(z.argmax(1) == attack.target)

    return sampler


def same_pv(mech, attack, clean) -> Sampler:
    # The arg-max only sees the noise in the contrast space 1^perp (k - 1 dimensions).
    k = clean.size
    contrasts = np.eye(k, k - 1)
    contrasts[k - 1] = -1.0  # columns e_i - e_{k-1}
    basis, _ = np.linalg.qr(contrasts)
    votes = clean.astype(np.float32)
    proj = (float(mech.sigma) * basis.T).astype(np.float32)  # (k - 1, k)

    def sampler(rng, m):
        z = votes + rng.standard_normal((m, k - 1), dtype=np.float32) @ proj
        return np.count_nonzero(z.argmax(1) == attack.target)

    return sampler


def plain_poe(mech, attack, clean) -> Sampler:
    scaled = clean * float(mech.scale)

    def sampler(rng, m):
        return np.count_nonzero(gumbel_argmax(rng, scaled, m) == attack.target)

    return sampler


def same_poe(mech, attack, clean) -> Sampler:
    # Gumbel max-stability: the margin of the target is Logistic(m_t - LSE_{j != t} m_j, 1).
    m_ = clean * float(mech.scale)
    loc = m_[attack.target] - np.logaddexp.reduce(np.delete(m_, attack.target))

    def sampler(rng, m):
        return np.count_nonzero(rng.logistic(loc, 1.0, m) > 0)

    return sampler


def plain_esa(mech, attack, clean) -> Sampler:
    mean = clean.astype(np.float32)
    cand = np.asarray(mech.candidates, np.float32)
    cand_sq = np.sum(cand * cand, axis=1)
    sigma = np.float32(mech.sigma)

    def sampler(rng, m):
        noisy = mean + sigma * rng.standard_normal((m, mean.size), dtype=np.float32)
        return np.count_nonzero(np.argmin(cand_sq - 2.0 * (noisy @ cand.T), axis=1) == attack.target)

    return sampler


def same_esa(mech, attack, clean) -> Sampler:
    # |m + sZ - c_i|^2 = |m - c_i|^2 - 2s<Z, c_i - c_0> + (common terms); <Z, c_i - c_0> only depends
    # on the coordinates of Z in an orthonormal basis Q of span(c_i - c_0, w).
    cand = np.asarray(mech.candidates, np.float64)
    w = np.asarray(attack.reference_with, np.float64) - np.asarray(attack.reference_without, np.float64)
    q, _ = np.linalg.qr(np.vstack([cand[1:] - cand[:1], w]).T)
    sq_dist = np.sum((clean - cand) ** 2, axis=1).astype(np.float32)
    proj_t = (2.0 * float(mech.sigma) * ((cand - cand[:1]) @ q)).T.astype(np.float32)  # (r, c)

    def sampler(rng, m):
        y = rng.standard_normal((m, q.shape[1]), dtype=np.float32)
        return np.count_nonzero(np.argmin(sq_dist - y @ proj_t, axis=1) == attack.target)

    return sampler


def _jem_positions(mech, attack, clean):
    """Engine's JEM table for one histogram, and per pair and position the prefix sizes to draw from."""
    k = mech.top_k
    table = mech.prepare(jnp.asarray(clean, jnp.float32), attack).table
    star = np.asarray(table.pair_pos)
    value = np.asarray(table.pair_value, np.float64)
    c = np.asarray(table.sorted_counts, np.float64)  # decreasing
    pairs = np.arange(star.size)
    # Threshold of position l for gap g = c_(i*) - v: c_(l) - g (exactly v at l = i*).
    thr = c[None, :k] - c[star][:, None] + value[:, None]
    thr[pairs, star] = value
    a = np.sum(c[None, None, :] >= thr[:, :, None], axis=-1)  # |A_l|
    b = np.sum(c[None, None, :] > thr[:, :, None], axis=-1)  # |B_l|
    pos = np.arange(k)[None, :]
    is_star = pos == star[:, None]
    # Before i*: uniform over B_l minus the l chosen; at i*: uniform over A \ B (never
    # chosen before); after i*: uniform over A_l minus the l chosen.
    avail = np.maximum(np.where(pos < star[:, None], b - pos, np.where(is_star, a - b, a - pos)), 1)
    target_pos = int(np.flatnonzero(np.asarray(table.order) == attack.target)[0])

    def positions(rng, p):
        m = p.size
        chosen = np.zeros((m, c.size), bool)
        rows = np.arange(m)
        for l in range(k):
            r = rng.integers(avail[p, l])
            # The r-th (0-based) unchosen sorted position; it lies in the prefix.
            rth_free = np.argmax(np.cumsum(~chosen, axis=1) > r[:, None], axis=1)
            chosen[rows, np.where(is_star[p, l], b[p, l] + r, rth_free)] = True
        return np.count_nonzero(chosen[:, target_pos])

    return table, positions


def plain_ksa(mech, attack, clean) -> Sampler:
    table, positions = _jem_positions(mech, attack, clean)
    logits = np.asarray(table.logits, np.float64)
    keep = np.flatnonzero(np.isfinite(logits))  # zero-probability pairs never win the Gumbel-max

    def sampler(rng, m):
        return positions(rng, keep[gumbel_argmax(rng, logits[keep], m)])

    return sampler


def same_ksa(mech, attack, clean) -> Sampler:
    table, positions = _jem_positions(mech, attack, clean)
    n = table.logits.shape[0]
    keep_all = np.asarray(table.alias.keep_all)
    threshold = np.asarray(table.alias.threshold, np.float64) / 2.0**32
    alias = np.asarray(table.alias.alias)

    def sampler(rng, m):
        cell = rng.integers(0, n, m)
        stay = keep_all[cell] | (rng.random(m) < threshold[cell])
        return positions(rng, np.where(stay, cell, alias[cell]))

    return sampler


def _snapshot_rows(scheme: str, n: int):
    """``rows(rng, m) -> (m,) int``: the snapshot of each of ``m`` trials (stratified: rounds of 0..n-1 in order,
    continuing across chunks; bootstrap: uniform draws)."""
    if scheme == "bootstrap":
        return lambda rng, m: rng.integers(0, n, m)
    start = [0]

    def rows(rng, m):
        out = (start[0] + np.arange(m)) % n
        start[0] = (start[0] + m) % n
        return out

    return rows


def plain_pv_snapshots(mech, attack, clean: np.ndarray, scheme: str) -> Sampler:
    votes = clean.astype(np.float32)
    sigma = np.float32(mech.sigma)
    n, k = votes.shape
    rows = _snapshot_rows(scheme, n)

    def sampler(rng, m):
        idx = rows(rng, m)
        z = rng.standard_normal((m, k), dtype=np.float32)
        z *= sigma
        z += votes[idx]
        hit = z.argmax(1) == attack.target
        return np.bincount(idx[hit], minlength=n).sum()  # hits per snapshot, summed for the rate check

    return sampler


def same_pv_snapshots(mech, attack, clean: np.ndarray, scheme: str) -> Sampler:
    votes = clean.astype(np.float32)
    n, k = votes.shape
    rows = _snapshot_rows(scheme, n)
    sigma = float(mech.sigma)
    if k >= PV_CONDITIONAL_FROM:
        # The engine's black-box draw: the target's normal, then a coin on P(hit | z) = prod_j Phi(...).
        t = attack.target
        gaps = (votes[:, t : t + 1] - np.delete(votes, t, axis=1)) / sigma  # (n, k - 1)

        def sampler(rng, m):
            idx = rows(rng, m)
            z = rng.standard_normal(m)
            log_p = special.log_ndtr(gaps[idx] + z[:, None]).sum(axis=1)
            hit = rng.random(m) < np.exp(log_p)
            return np.bincount(idx[hit], minlength=n).sum()

        return sampler
    proj = (sigma * np.asarray(sa.mechanisms.pv.contrast_basis(k), np.float64).T).astype(np.float32)

    def sampler(rng, m):
        idx = rows(rng, m)
        z = rng.standard_normal((m, k - 1), dtype=np.float32) @ proj
        z += votes[idx]
        hit = z.argmax(1) == attack.target
        return np.bincount(idx[hit], minlength=n).sum()

    return sampler


PLAIN = {"pv": plain_pv, "poe": plain_poe, "esa": plain_esa, "ksa": plain_ksa}
SAME_NOISE = {"pv": same_pv, "poe": same_poe, "esa": same_esa, "ksa": same_ksa}
PLAIN_LIMITS = {"esa": (10**6, 1 << 14)}  # (max trials, chunk) where the plain baseline is slow


def run_engine(keys, mech, attack, snapshots, trials: int, chunk: int, scheme: str = "bootstrap") -> list[int]:
    """Black-box hits of ``simulate`` for every hypothesis (per unit when the snapshots differ, summed here)."""
    per_unit = any(len(np.unique(snaps, axis=0)) > 1 for snaps in snapshots)
    return [
        int(simulate(key, mech, attack, snaps, trials=trials, scheme=scheme, per_unit=per_unit,
                     chunk_trials=chunk).hits.sum())
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


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def binomial_z(hits1: int, n1: int, hits2: int, n2: int) -> float:
    """Two-sample z-statistic of the difference of two binomial rates (pooled variance)."""
    diff = hits1 / n1 - hits2 / n2
    if diff == 0:
        return 0.0
    pooled = (hits1 + hits2) / (n1 + n2)
    return abs(diff) / math.sqrt(pooled * (1 - pooled) * (1 / n1 + 1 / n2))


def benchmark(name: str, trials: int, seed: int, chunk: int | None = None, classes: int | None = None,
              snapshots: int | None = None, scheme: str = "stratified") -> dict:
    stream = jax.random.key(seed)
    if chunk is None:  # the simulator's default for the backend
        chunk = CHUNK_TRIALS if jax.default_backend() == "cpu" else ACCELERATOR_CHUNK_TRIALS
    if snapshots is None:
        mech, attack, cleans = build_case(name)
        engine_snapshots = [np.tile(clean, (SNAPSHOTS, 1)) for clean in cleans]
        scheme = "bootstrap"
        plain = [PLAIN[name](mech, attack, clean) for clean in cleans]
        same = [SAME_NOISE[name](mech, attack, clean) for clean in cleans]
        plain_trials, plain_chunk = PLAIN_LIMITS.get(name, (trials, NUMPY_CHUNK))
    else:
        mech, attack, cleans = build_snapshot_case(classes, snapshots, seed)
        engine_snapshots = list(cleans)
        # Stratified NumPy chunks are whole rounds of the snapshots, so every snapshot gets the same trials.
        round_chunk = max(1, NUMPY_CHUNK // snapshots) * snapshots
        plain_chunk = round_chunk if scheme == "stratified" else NUMPY_CHUNK
        plain = [plain_pv_snapshots(mech, attack, clean, scheme) for clean in cleans]
        same = [same_pv_snapshots(mech, attack, clean, scheme) for clean in cleans]
        if scheme == "stratified":
            trials = -(-trials // snapshots) * snapshots  # what simulate runs: ceil(N / S) rounds
        plain_trials = trials
    keys = [jax.random.fold_in(stream, h) for h in range(len(cleans))]

    # Compiles the very chunk functions of the timed run (every hypothesis: distinct-snapshot counts may differ).
    run_engine(keys, mech, attack, engine_snapshots, min(trials, chunk), chunk, scheme)
    with CompileCounter() as compiles:
        jax_hits, jax_s = timed(run_engine, keys, mech, attack, engine_snapshots, trials, chunk, scheme)
    jax_peak = peak_rss_mb()

    rng = np.random.default_rng(seed)
    plain_trials = min(trials, plain_trials)
    run_numpy(plain[:1], rng, min(plain_trials, plain_chunk), plain_chunk)
    np_hits, np_s = timed(run_numpy, plain, rng, plain_trials, plain_chunk)
    np_peak = peak_rss_mb()
    same_chunk = plain_chunk if snapshots is not None else NUMPY_CHUNK
    run_numpy(same[:1], rng, min(trials, same_chunk), same_chunk)
    same_hits, same_s = timed(run_numpy, same, rng, trials, same_chunk)

    h = len(cleans)
    jax_rate, np_rate, same_rate = h * trials / jax_s, h * plain_trials / np_s, h * trials / same_s
    result = {
        "mechanism": name,
        "trials": trials,
        "hypotheses": h,
        "classes": int(np.shape(cleans[0])[-1]),
        "snapshots": snapshots if snapshots is not None else SNAPSHOTS,
        "distinct_snapshots": [int(len(np.unique(c, axis=0))) for c in engine_snapshots],
        "scheme": scheme,
        "jax_trials_per_s": round(jax_rate, 1),
        "numpy_trials_per_s": round(np_rate, 1),
        "ratio": round(jax_rate / np_rate, 3),
        "jax_ns_per_trial": round(1e9 / jax_rate, 2),
        "numpy_ns_per_trial": round(1e9 / np_rate, 2),
        "peak_rss_mb": round(jax_peak, 1),
        "numpy_same_noise_trials_per_s": round(same_rate, 1),
        "ratio_same_noise": round(jax_rate / same_rate, 3),
        "numpy_trials": plain_trials,
        "numpy_peak_rss_mb": round(np_peak, 1),
        "jax_seconds": round(jax_s, 3),
        "numpy_seconds": round(np_s, 3),
        "numpy_same_noise_seconds": round(same_s, 3),
        "jax_compiles_timed": compiles.count,
        "devices": len(jax.devices()),
        "openblas_num_threads": os.environ["OPENBLAS_NUM_THREADS"],
        "chunk_trials": chunk,
        "jax_hits": {hyp: j / trials for hyp, j in zip(HYPOTHESES, jax_hits)},
        "numpy_hits": {hyp: n / plain_trials for hyp, n in zip(HYPOTHESES, np_hits)},
        "numpy_same_noise_hits": {hyp: n / trials for hyp, n in zip(HYPOTHESES, same_hits)},
    }
    z = [binomial_z(j, trials, n, plain_trials) for j, n in zip(jax_hits, np_hits)]
    z += [binomial_z(j, trials, n, trials) for j, n in zip(jax_hits, same_hits)]
    result["max_hit_z"] = round(max(z), 3)
    return result


def readable(r: dict) -> str:
    return (
        f"{r['mechanism']}{case(r)}: {r['trials']:,} trials x {r['hypotheses']} hypotheses on {r['devices']} devices | "
        f"jax {r['jax_trials_per_s'] / 1e6:,.2f} M/s | numpy {r['numpy_trials_per_s'] / 1e6:,.3f} M/s "
        f"(ratio {r['ratio']:.2f}) | numpy same noise {r['numpy_same_noise_trials_per_s'] / 1e6:,.2f} M/s "
        f"(ratio {r['ratio_same_noise']:.2f}) | peak RSS {r['peak_rss_mb']:.0f} MB after jax | hit rates "
        f"with/without: jax {rates(r['jax_hits'])}, numpy {rates(r['numpy_hits'])}, "
        f"same noise {rates(r['numpy_same_noise_hits'])} (max z {r['max_hit_z']})"
    )


def case(r: dict) -> str:
    """`` (k = K, S sampled snapshots, scheme)`` for a ``--snapshots`` run, else nothing."""
    if r["distinct_snapshots"] == [1] * r["hypotheses"]:
        return ""
    return f" (k = {r['classes']}, {r['snapshots']} sampled snapshots, {r['scheme']})"


def rates(hits: dict) -> str:
    return "/".join(f"{hits[h]:.5f}" for h in HYPOTHESES)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mechanism", required=True, choices=sorted(PLAIN))
    parser.add_argument("--trials", required=True, type=int_at_least(1), help="trials per hypothesis")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a readable line")
    parser.add_argument("--out", help="also write the JSON object to this file (atomically)")
    parser.add_argument("--seed", type=int_at_least(0), default=0)
    parser.add_argument("--chunk-trials", type=int_at_least(1), default=None,
                        help="trials per jitted call (default: the simulator's for the backend)")
    parser.add_argument("--snapshots", type=int_at_least(2), help="PV only: this many sampled snapshots per hypothesis")
    parser.add_argument("--classes", type=int_at_least(2), help="PV with --snapshots: number of classes (default 4)")
    parser.add_argument("--scheme", choices=("stratified", "bootstrap"), default="stratified",
                        help="with --snapshots: the simulator's scheme (default stratified, as for sampled snapshots)")
    args = parser.parse_args(argv)
    if (args.snapshots is not None or args.classes is not None) and args.mechanism != "pv":
        parser.error(f"--snapshots and --classes need --mechanism pv, got --mechanism {args.mechanism}")
    if args.classes is not None and args.snapshots is None:
        parser.error("--classes needs --snapshots (the default case has the two classes of SnapAudit Table 11)")

    result = benchmark(args.mechanism, args.trials, args.seed, args.chunk_trials, classes=args.classes or 4,
                       snapshots=args.snapshots, scheme=args.scheme)
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
