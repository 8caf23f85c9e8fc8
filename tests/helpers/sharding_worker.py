"""Subprocess worker for the device-count and multi-process tests.

Usage: python _sharding_worker.py LOCAL_DEVICES [COORDINATOR NUM_PROCESSES PROCESS_ID]
Prints one JSON line with simulation counts (only process 0 prints in multi-process mode).
"""

import json
import os
import sys

from tests.helpers.bench import host_devices_xla_flags

local_devices = int(sys.argv[1])
os.environ["XLA_FLAGS"] = host_devices_xla_flags(local_devices)  # compiled as the suite compiles
os.environ["JAX_PLATFORMS"] = "cpu"  # host devices, also on a machine with an accelerator

import jax  # noqa: E402

if len(sys.argv) > 2:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=sys.argv[2], num_processes=int(sys.argv[3]), process_id=int(sys.argv[4])
    )

import numpy as np  # noqa: E402

import snapaudit_jax as sa  # noqa: E402
from snapaudit_jax.audits.active import make_attack  # noqa: E402
from snapaudit_jax.mechanisms.ksa import bucket_num_values  # noqa: E402
from snapaudit_jax.simulation.trials import simulate  # noqa: E402

pv = sa.PrivateVoting.calibrated(4.0, 1e-5)
rng = np.random.default_rng(0)
votes = np.array([[1.0, 2.0, 0.0], [2.0, 1.0, 0.0], [1.0, 1.0, 1.0]])[rng.integers(0, 3, 37)]
attack = make_attack(pv, votes.mean(0), np.array([0.0, 3.0, 0.0]), target=0)
key = jax.random.key(42)
out = {"devices": len(jax.devices())}
boot = simulate(key, pv, attack, votes, trials=300_001, threshold=0.5, histogram=(-8.0, 8.0, 64),
                chunk_trials=1 << 16)
out["bootstrap_hits"] = boot.hits.tolist()
out["bootstrap_trials"] = boot.trials.tolist()
out["bootstrap_score_hits"] = boot.score_hits.tolist()
out["histogram"] = boot.histogram.tolist()
strat = simulate(key, pv, attack, votes, trials=100_000, scheme="stratified", chunk_trials=1 << 15)
out["stratified_hits"] = strat.hits.tolist()
w = np.array([8, 7, 6, 5, 5, 2, 2, 1, 1, 0], np.float32)
wo = np.array([8, 7, 6, 5, 4, 3, 2, 1, 1, 0], np.float32)
ksa = sa.KeywordSpaceAggregation.calibrated(4.0, top_k=4, num_values=bucket_num_values(np.stack([w, wo])))
ksa_counts = simulate(key, ksa, make_attack(ksa, w, wo), np.stack([w, wo, w]), trials=50_000, chunk_trials=1 << 14)
out["ksa_hits"] = ksa_counts.hits.tolist()
if jax.process_index() == 0:
    print(json.dumps(out), flush=True)
