"""Runs the tiny models on several XLA host devices and prints their outputs as JSON (see test_models.py).

Usage: python -m tests.helpers.parallel_worker LLM_FOLDER BERT_FOLDER DEVICES
"""

import json
import os
import sys

from tests.helpers.bench import host_devices_xla_flags

os.environ["XLA_FLAGS"] = host_devices_xla_flags(int(sys.argv[3]))  # compiled as the suite compiles
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402

from snapaudit_jax.models import load_embedder, load_language_model  # noqa: E402
from snapaudit_jax.models.parallel import CPU_REPLICA_BYTES, DataParallel  # noqa: E402

from tests.helpers.parallel_inputs import PARALLEL_LABELS, PARALLEL_PROMPTS, PARALLEL_TEXTS  # noqa: E402

lm = load_language_model(sys.argv[1])
emb = load_embedder(sys.argv[2])
fits = {"w": jax.ShapeDtypeStruct((CPU_REPLICA_BYTES // 8,), np.float32)}  # 2 replicas: exactly the budget
too_big = {"w": jax.ShapeDtypeStruct((CPU_REPLICA_BYTES // 8 + 1,), np.float32)}
print(json.dumps({
    "auto": [DataParallel.auto(fits).size, DataParallel.auto(too_big).size, DataParallel.auto(too_big, True).size,
             DataParallel.auto(fits, False).size],
    "devices": lm.parallel.size,
    "logprobs": lm.label_logprobs(PARALLEL_PROMPTS, PARALLEL_LABELS).tolist(),
    "multi": lm.label_logprobs(PARALLEL_PROMPTS, ["t4 t5", "t8"]).tolist(),
    "greedy": [list(g.token_ids) for g in lm.generate(PARALLEL_PROMPTS, max_new_tokens=6)],
    "match": lm.greedy_continues_with(PARALLEL_PROMPTS, ["t4"] * len(PARALLEL_PROMPTS)).tolist(),
    "embed": emb.embed(PARALLEL_TEXTS).tolist(),
}))
