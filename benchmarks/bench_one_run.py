"""One-run auditors side by side: ours (snapaudit_jax.estimation.one_run) and jax_privacy 2.0.0's, on the same scores.

Usage::

    python benchmarks/bench_one_run.py [--json] [--out FILE.json] [--null-runs N] [--power-runs R] \
        [--canaries M ...] [--mu MU ...] [--delta D] [--alpha A] [--seed S]

What is measured
----------------
* ``null``: ``N`` runs (default 5,000) of 1,000 canaries, each included by a fair coin, with N(0, 1) scores
  for included and excluded canaries alike (no leakage). For each auditor the share of runs reporting
  ``eps > 0`` (a false alarm: the run leaks nothing), with its exact 95% Clopper-Pearson interval. Ours:
  :func:`snapaudit_jax.estimation.one_run.one_run_audit` with the default declared grid (12 pairs fixed by ``m``);
  jax_privacy: ``CanaryScoreAuditor(in, out).epsilon_one_run(alpha, delta)`` (its default ``Bonferroni``).
* ``power``: scores ``N(mu S_i, 1)`` -- each canary's score is a Gaussian mechanism of its own coin, so the
  run is ``mu``-GDP in each coin and its exact ``eps(delta)`` is that of ``G_mu`` (``exact_epsilon``).
  For ``m`` in ``--canaries`` (default 1e2 .. 1e5), ``mu`` in ``--mu`` and ``delta`` in ``--power-delta``
  (default 1e-5 and 1e-8), ``R`` runs each: the median bound of ours (declared grid and ``HeldOut(0.5)``)
  and of jax_privacy, and the seconds per call. The theorem's ``delta`` term grows as ``2 m delta``: at a
  fixed ``delta`` the bound stops growing once ``m delta`` is no longer small.

Each script run draws the same scores for both auditors. The JSON (``--out``, written atomically) holds
every number printed. The differences are explained in the docstring of :mod:`snapaudit_jax.estimation.one_run`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from _common import int_at_least

import jax

from snapaudit_jax.utils.io import write_json
from snapaudit_jax.estimation.bounds import clopper_pearson_lower, clopper_pearson_upper
from snapaudit_jax.mechanisms.noise import gdp_epsilon
from snapaudit_jax.estimation.one_run import HeldOut, default_grid, one_run_audit


def _jax_privacy(scores, inserted, alpha, delta):
    from jax_privacy import auditing

    return float(auditing.CanaryScoreAuditor(scores[inserted], scores[~inserted]).epsilon_one_run(alpha, delta))


def _rate(hits: int, n: int) -> dict:
    lo, hi = float(clopper_pearson_lower(hits, n, 0.025)), float(clopper_pearson_upper(hits, n, 0.025))
    return {"alarms": int(hits), "runs": n, "rate": hits / n, "ci95": [lo, hi]}


def null_rates(runs: int, m: int, alpha: float, delta: float, seed: int) -> dict:
    rng = np.random.default_rng([seed, 0])
    ours = theirs = 0
    t_ours = t_theirs = 0.0
    for _ in range(runs):
        inserted = rng.random(m) < 0.5
        scores = rng.normal(size=m)
        t0 = time.perf_counter()
        ours += one_run_audit(scores, inserted, insert_probability=0.5, delta=delta, alpha=alpha).epsilon > 0
        t1 = time.perf_counter()
        theirs += _jax_privacy(scores, inserted, alpha, delta) > 0
        t2 = time.perf_counter()
        t_ours, t_theirs = t_ours + t1 - t0, t_theirs + t2 - t1
    return {"canaries": m, "insert_probability": 0.5, "alpha": alpha, "delta": delta,
            "ours": {**_rate(ours, runs), "seconds_per_call": t_ours / runs},
            "jax_privacy": {**_rate(theirs, runs), "seconds_per_call": t_theirs / runs}}


def power_curve(canaries, mus, runs: int, alpha: float, deltas, seed: int) -> list[dict]:
    out = []
    for delta, mu in ((d, mu) for d in deltas for mu in mus):
        for m in canaries:
            rng = np.random.default_rng([seed, 1, m, int(mu * 1000)])
            vals = {"ours_grid": [], "ours_held_out": [], "jax_privacy": []}
            secs = {k: 0.0 for k in vals}
            for r in range(runs):
                inserted = rng.random(m) < 0.5
                scores = rng.normal(size=m) + mu * inserted
                held_key = jax.random.key(seed * 1000 + r)
                for name in vals:
                    t0 = time.perf_counter()
                    if name == "jax_privacy":
                        vals[name].append(_jax_privacy(scores, inserted, alpha, delta))
                    else:
                        rule = HeldOut(0.5) if name == "ours_held_out" else None
                        vals[name].append(one_run_audit(scores, inserted, insert_probability=0.5, delta=delta,
                                                        alpha=alpha, rule=rule, key=held_key).epsilon)
                    secs[name] += time.perf_counter() - t0
            row = {"mu": mu, "delta": delta, "canaries": m, "runs": runs, "exact_epsilon": gdp_epsilon(mu, delta),
                   "grid_pairs": len(default_grid(m))}
            for name in vals:
                row[name] = {"median": float(np.median(vals[name])), "min": float(np.min(vals[name])),
                             "max": float(np.max(vals[name])), "seconds_per_call": secs[name] / runs}
            out.append(row)
            print(f"delta={delta:g} mu={mu:g} m={m:>6d}  exact eps {row['exact_epsilon']:.3f}  ours(grid) "
                  f"{row['ours_grid']['median']:.3f}  ours(held-out) {row['ours_held_out']['median']:.3f}  "
                  f"jax_privacy {row['jax_privacy']['median']:.3f}", flush=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print the JSON result")
    ap.add_argument("--out", help="write the JSON result to this file (atomically)")
    ap.add_argument("--null-runs", type=int_at_least(1), default=5000)
    ap.add_argument("--power-runs", type=int_at_least(1), default=5)
    ap.add_argument("--canaries", type=int_at_least(10), nargs="+", default=[100, 1000, 10_000, 100_000])
    ap.add_argument("--mu", type=float, nargs="+", default=[1.0, 2.0])
    ap.add_argument("--delta", type=float, default=1e-5, help="delta of the null runs")
    ap.add_argument("--power-delta", type=float, nargs="+", default=[1e-5, 1e-8],
                    help="deltas of the power curve (the bound's delta term grows as 2 m delta)")
    ap.add_argument("--alpha", type=float, default=0.05)
    ap.add_argument("--seed", type=int_at_least(0), default=0)
    args = ap.parse_args(argv)
    if not 0 < args.alpha < 1:
        ap.error(f"--alpha must be in (0, 1), got {args.alpha}")
    for d in [args.delta, *args.power_delta]:
        if not 0 < d < 1:
            ap.error(f"--delta and --power-delta must be in (0, 1), got {d}")
    if any(not mu > 0 for mu in args.mu):
        ap.error(f"--mu values must be > 0, got {args.mu}")
    t0 = time.perf_counter()
    null = null_rates(args.null_runs, 1000, args.alpha, args.delta, args.seed)
    for name in ("ours", "jax_privacy"):
        r = null[name]
        print(f"null, 1000 fair-coin canaries: {name:12s} eps > 0 in {r['alarms']}/{r['runs']} runs "
              f"({100 * r['rate']:.2f}%, 95% CI {100 * r['ci95'][0]:.2f}-{100 * r['ci95'][1]:.2f}%)", flush=True)
    power = power_curve(args.canaries, args.mu, args.power_runs, args.alpha, args.power_delta, args.seed)
    result = {"benchmark": "one_run", "seed": args.seed, "null": null, "power": power,
              "seconds": time.perf_counter() - t0}
    if args.json:
        print(json.dumps(result, indent=2))
    if args.out:
        write_json(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
