"""Canary exposure scoring: the continuations' token tree against one packed pass per label group.

Usage::

    python benchmarks/bench_exposure.py [--json] [--out FILE.json] [--model smollm2] [--digits 4] \
        [--prefix "my secret code is"] [--repeats 1]

What is measured
----------------
Exposure ranks a canary among every secret of its space: ``log P(" dddd" | prefix)`` for all ``10^digits``
secrets under ``--model`` (default: the embedded SmolLM2-135M-Instruct, float32, one process).

* ``tree`` (what ``snapaudit finetune`` runs): :meth:`~snapaudit_jax.models.LanguageModel.continuation_logprobs`,
  the secrets' tokens as one tree after the prefix; every inner node is computed once (packed with its ancestors,
  256 nodes a pass) and its next-token distribution scores all its children.
* ``packed`` (the baseline, what ran before): :meth:`~snapaudit_jax.models.LanguageModel.label_logprobs`, every
  secret's tokens packed after the prefix, 512 label tokens a pass.

Each runs once to compile, then ``--repeats`` timed times (alternating). Reported: seconds, the speedup, the
largest score difference (float32 summation order), and the rank check: every secret's rank (ties counted
against it, as exposure counts them) under the tree equals the packed one's up to the secrets whose packed scores
lie within twice the largest difference of its own (near ties that float32 can order either way). The run exits
with status 1, writing no ``--out`` file, when a score differs by more than ``1e-4`` nats or a rank moves further.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from _common import int_at_least, machine_info
from snapaudit_jax.models import load_language_model
from snapaudit_jax.models.inference import frame
from snapaudit_jax.utils.io import write_json

SCORE_TOL = 1e-4


def _ranks(scores: np.ndarray) -> np.ndarray:
    """Rank of every score among all, ties counted against it (1 + the number of others at least as high)."""
    order = np.sort(scores)
    return len(scores) - np.searchsorted(order, scores, side="left")


def benchmark(args) -> dict:
    lm = load_language_model(args.model, data_parallel=False)
    prompt = frame(lm.tokenizer, args.prefix, eos=False)
    secrets = [" " + f"{i:0{args.digits}d}" for i in range(10**args.digits)]
    runs = {"tree": lambda: lm.continuation_logprobs(prompt, secrets),
            "packed": lambda: lm.label_logprobs([prompt], secrets)[0]}
    scores, seconds = {}, {name: [] for name in runs}
    for name, fn in runs.items():
        began = time.perf_counter()
        scores[name] = fn()
        seconds[name + "_first_call"] = time.perf_counter() - began
    for _ in range(args.repeats):
        for name, fn in runs.items():
            began = time.perf_counter()
            fn()
            seconds[name].append(time.perf_counter() - began)
    tree, packed = scores["tree"], scores["packed"]
    diff = float(np.abs(tree - packed).max())
    moved = np.abs(_ranks(tree) - _ranks(packed))
    near = np.array([int(np.sum(np.abs(packed - s) <= 2 * diff)) - 1 for s in packed])
    return {
        "model": args.model, "secrets": len(secrets), "digits": args.digits, "prefix": args.prefix,
        "tokens_per_secret": len(lm.tokenizer.encode_continuation(secrets[-1])),
        "seconds_tree": min(seconds["tree"]), "seconds_packed": min(seconds["packed"]),
        "seconds_tree_first_call": seconds["tree_first_call"],
        "seconds_packed_first_call": seconds["packed_first_call"],
        "speedup": min(seconds["packed"]) / min(seconds["tree"]),
        "max_score_difference": diff, "ranks_moved": int(np.sum(moved > 0)),
        "ranks_moved_beyond_near_ties": int(np.sum(moved > near)),
    }


def readable(r: dict) -> str:
    return (f"{r['secrets']} secrets of {r['tokens_per_secret']} tokens after {r['prefix']!r} ({r['model']}):\n"
            f"  tree   {r['seconds_tree']:.2f} s (first call {r['seconds_tree_first_call']:.2f} s)\n"
            f"  packed {r['seconds_packed']:.2f} s (first call {r['seconds_packed_first_call']:.2f} s)\n"
            f"  speedup {r['speedup']:.1f}x; largest score difference {r['max_score_difference']:.2e} nats; "
            f"{r['ranks_moved']} ranks moved, {r['ranks_moved_beyond_near_ties']} beyond near ties")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a readable summary")
    parser.add_argument("--out", help="also write the JSON object to this file (atomically)")
    parser.add_argument("--model", default="smollm2", help="a model name, Hugging Face folder or .gguf file")
    parser.add_argument("--digits", type=int_at_least(1, 6), default=4)
    parser.add_argument("--prefix", default="my secret code is")
    parser.add_argument("--repeats", type=int_at_least(1), default=1)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    result = machine_info()
    result.update(benchmark(args))
    result["wall_seconds_total"] = round(time.perf_counter() - start, 1)
    print(json.dumps(result) if args.json else readable(result), flush=True)
    if not result["max_score_difference"] <= SCORE_TOL or result["ranks_moved_beyond_near_ties"]:
        print(f"error: the tree's scores differ by {result['max_score_difference']:.2e} (tolerance {SCORE_TOL}) or "
              f"{result['ranks_moved_beyond_near_ties']} ranks moved beyond near ties", file=sys.stderr)
        return 1
    if args.out:
        write_json(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
