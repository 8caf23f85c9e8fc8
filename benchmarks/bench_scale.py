"""Memory and device-count invariance of the simulator at scale (up to 10^9 trials per hypothesis).

Usage::

    python benchmarks/bench_scale.py [--trials 1e6 1e7 1e8 1e9] [--compare-devices 1 8] [--compare-trials N] \
        [--json] [--out FILE.json] [--seed S]

What is measured
----------------
Each run is a fresh Python process (so that its peak resident memory, ``ru_maxrss``, is its own)
that calls :func:`snapaudit_jax.simulation.trials.simulate` for both hypotheses of one audit:
Private Voting at ``eps = 4``, ``delta = 1e-5``, 3 classes and 37 snapshots with 3 distinct vote
vectors (bootstrap scheme, counts per distinct snapshot), a white-box threshold and a 64-bin score
histogram -- every accumulator the simulator has.

* ``memory``: one run per ``--trials`` value on one XLA host device per CPU core (as the CLI runs):
  ``peak_rss_mb`` (whole process, after the run), ``baseline_rss_mb`` (the same process after JAX
  started and compiled one tiny simulation, before the measured one), seconds and trials/s. The goal
  is ``peak_rss_mb(max trials) <= 1.5 x peak_rss_mb(min trials)`` (``memory_goal_met``).
* ``devices``: ``--compare-trials`` trials (default the largest ``--trials``) on each
  ``--compare-devices`` count of host devices (``--xla_force_host_platform_device_count``); every
  count array (hits, trials, score hits per unit, histogram, score min/max) must be identical
  (``counts_identical``).

Exit status 1 (and no ``--out`` file) if the counts differ or the memory goal is missed.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RSS_GOAL = 1.5


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def worker(devices: int, trials: int, seed: int) -> dict:
    """One measured run in this process (``devices`` must be set before jax starts: see :func:`run_worker`)."""
    import jax
    import numpy as np

    import snapaudit_jax as sa
    from snapaudit_jax.audits.active import make_attack
    from snapaudit_jax.simulation.trials import simulate

    mech = sa.PrivateVoting.calibrated(4.0, 1e-5)
    rng = np.random.default_rng(0)
    distinct = {"with": np.array([[1.0, 2.0, 0.0], [2.0, 1.0, 0.0], [1.0, 1.0, 1.0]]),
                "without": np.array([[0.0, 3.0, 0.0], [1.0, 2.0, 0.0], [0.0, 2.0, 1.0]])}
    snapshots = {h: v[rng.integers(0, 3, 37)] for h, v in distinct.items()}
    attack = make_attack(mech, snapshots["with"].mean(0), snapshots["without"].mean(0), target=0)
    options = dict(threshold=0.5, histogram=(-8.0, 8.0, 64), track_scores=True)
    key = jax.random.key(seed)
    for h, snaps in enumerate(snapshots.values()):  # compile both hypotheses' chunk functions
        simulate(jax.random.fold_in(key, h), mech, attack, snaps, trials=min(trials, 1 << 22), **options)
    baseline = _peak_rss_mb()
    start = time.perf_counter()
    counts = {}
    for h, (name, snaps) in enumerate(snapshots.items()):
        out = simulate(jax.random.fold_in(key, h), mech, attack, snaps, trials=trials, **options)
        counts[name] = {"hits": out.hits.tolist(), "trials": out.trials.tolist(),
                        "score_hits": out.score_hits.tolist(), "histogram": out.histogram.tolist(),
                        "score_min": out.score_min, "score_max": out.score_max}
    seconds = time.perf_counter() - start
    return {"devices": len(jax.devices()), "trials": trials, "hypotheses": 2, "seconds": round(seconds, 3),
            "trials_per_s": round(2 * trials / seconds, 1), "baseline_rss_mb": round(baseline, 1),
            "peak_rss_mb": round(_peak_rss_mb(), 1), "counts": counts}


def run_worker(devices: int, trials: int, seed: int) -> dict:
    """:func:`worker` in a fresh process with ``devices`` XLA host devices."""
    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
               PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", str(devices), str(trials), str(seed)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"worker (devices={devices}, trials={trials}) failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def trial_count(text: str) -> int:
    """An argparse type: a trial count in ``[1, MAX_TRIALS]`` written as an integer or ``1e9``."""
    from snapaudit_jax.simulation.trials import MAX_TRIALS

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a trial count such as 1000000 or 1e9, got {text!r}") from None
    if value != int(value) or not 1 <= value <= MAX_TRIALS:
        raise argparse.ArgumentTypeError(f"must be an integer in [1, {MAX_TRIALS}], got {text}")
    return int(value)


def main(argv=None) -> int:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--worker":
        print(json.dumps(worker(*map(int, sys.argv[2:5]))), flush=True)
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=trial_count, nargs="+", default=[10**6, 10**7, 10**8, 10**9],
                        help="trials per hypothesis of the memory runs")
    parser.add_argument("--compare-devices", type=int, nargs="+", default=[1, 8], help="host device counts compared")
    parser.add_argument("--compare-trials", type=trial_count, help="trials of the device comparison (default: "
                        "the largest --trials)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of readable lines")
    parser.add_argument("--out", help="also write the JSON object to this file (atomically)")
    args = parser.parse_args(argv)
    bad = [d for d in args.compare_devices if d < 1]
    if bad:
        parser.error(f"--compare-devices must be integers >= 1, got {bad[0]}")

    sys.path.insert(0, ROOT)
    from snapaudit_jax.utils.io import write_json

    cores = os.cpu_count() or 1
    memory = [run_worker(cores, n, args.seed) for n in sorted(args.trials)]
    for row in memory:
        if not args.json:
            print(f"memory: {row['trials']:,} trials x 2 on {row['devices']} devices: "
                  f"peak RSS {row['peak_rss_mb']:.0f} MB "
                  f"(after start-up {row['baseline_rss_mb']:.0f} MB), {row['trials_per_s'] / 1e6:.1f} M trials/s",
                  flush=True)
    ratio = memory[-1]["peak_rss_mb"] / memory[0]["peak_rss_mb"]
    compare_trials = args.compare_trials or max(args.trials)
    by_devices = {}
    for d in args.compare_devices:
        if d == cores and compare_trials == memory[-1]["trials"]:
            by_devices[d] = memory[-1]
        else:
            by_devices[d] = run_worker(d, compare_trials, args.seed)
        if not args.json:
            row = by_devices[d]
            print(f"devices: {compare_trials:,} trials x 2 on {d} devices: {row['seconds']:.1f} s, "
                  f"{row['trials_per_s'] / 1e6:.1f} M trials/s", flush=True)
    reference = by_devices[args.compare_devices[0]]["counts"]
    identical = all(row["counts"] == reference for row in by_devices.values())
    result = {
        "memory": [{k: v for k, v in row.items() if k != "counts"} for row in memory],
        "rss_ratio_max_over_min_trials": round(ratio, 3),
        "rss_goal": RSS_GOAL,
        "memory_goal_met": ratio <= RSS_GOAL,
        "compare_trials": compare_trials,
        "devices": {str(d): {k: v for k, v in row.items() if k != "counts"} for d, row in by_devices.items()},
        "counts_identical": identical,
        "counts": reference,
        "cores": cores,
    }
    if args.json:
        print(json.dumps(result), flush=True)
    else:
        print(f"peak RSS {memory[-1]['trials']:,} / {memory[0]['trials']:,} trials: {ratio:.2f}x "
              f"(goal <= {RSS_GOAL}x); "
              f"counts on {args.compare_devices} devices identical: {identical}", flush=True)
    if not identical:
        print("error: the device counts gave different simulation counts", file=sys.stderr)
        return 1
    if ratio > RSS_GOAL:
        print(f"error: peak RSS grew {ratio:.2f}x from {memory[0]['trials']:,} to {memory[-1]['trials']:,} trials "
              f"(goal <= {RSS_GOAL}x)", file=sys.stderr)
        return 1
    if args.out:
        write_json(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
