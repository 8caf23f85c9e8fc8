"""The kit's DP fine-tuning part: ``bench_finetune.py`` on the accelerator, Opacus + PEFT on the same device.

Usage::

    python benchmarks/gpu/finetune.py --out finetune.json [--layers 4] [--method both] [--deadline SECONDS] \
        [--next-factor 2] [--skip-torch]
    python benchmarks/gpu/finetune.py --cpu-smoke --out /tmp/finetune_smoke.json

It runs :mod:`bench_finetune` (see its docstring for what is measured and checked) with sizes for one
accelerator: the SmolLM2-135M shape cut to ``--layers`` decoder layers (default 4; our steps run the blocks
under one scan there, ``DPSGDConfig.layers = "auto"``, so ``--layers 30`` compiles about as fast), 128 tokens,
expected batch 32 of 256 records, 3 timed steps per variant, both methods. Ours takes the clipping path ``auto``
picks on the backend beside the other two; the torch side (transformers, PEFT, Opacus hooks and ghost clipping)
runs on the CUDA device torch sees. Correctness checks
run with float32 products at full precision on both sides; the timed steps at each backend's default.

The methods run one at a time, LoRA first (DP-LoRA against Opacus + PEFT is the comparison the accelerator
issue asks for): the JSON is rewritten after each, so a part stopped by the kit's timeout during full fine-tuning
keeps LoRA's figures. Under ``--deadline`` a further method starts only if the time left is more than
``--next-factor`` (default 2) times what the previous one took (full fine-tuning's steps cost more than LoRA's);
one that does not is listed in ``skipped_methods`` with the figures.

``--cpu-smoke``: a one-layer toy of the shape, LoRA only, on the CPU (about 30 s). ``--deadline`` below 90
seconds skips the part (status ``skipped``). The JSON holds ``part``, ``status``, ``methods`` (those measured, in
order), ``runs`` (each method's ``bench_finetune`` result, with the arguments used), ``skipped_methods`` and
``wall_seconds``; the exit status is ``bench_finetune``'s (1: a failed check; the file then holds the methods
measured before it, or is not written).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # benchmarks/ (_common, bench_*)
sys.path.append(os.path.dirname(os.path.dirname(HERE)))  # the repository, unless the package is installed

import bench_finetune  # noqa: E402
from _common import number_at_least  # noqa: E402
from snapaudit_jax.utils.io import write_json  # noqa: E402

ACCELERATOR = ["--method", "both", "--seq", "128", "--batch", "32", "--records", "256", "--repeats", "3"]
SMOKE = ["--method", "lora", "--layers", "1", "--dim", "64", "--heads", "4", "--kv-heads", "2", "--intermediate",
         "96", "--vocab", "256", "--seq", "16", "--batch", "4", "--records", "16", "--repeats", "1"]
MIN_DEADLINE = 90
NEXT_METHOD_FACTOR = 2.0
ORDER = ("lora", "full")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="write the JSON result to this file (atomically)")
    parser.add_argument("--cpu-smoke", action="store_true", help="a one-layer toy, LoRA only, on the CPU")
    parser.add_argument("--layers", type=int, default=4, help="decoder layers of the SmolLM2 shape (accelerator)")
    parser.add_argument("--method", choices=("full", "lora", "both"), default=None)
    parser.add_argument("--deadline", type=number_at_least(0.0),
                        help=f"seconds; skipped if fewer than {MIN_DEADLINE} are given")
    parser.add_argument("--skip-torch", action="store_true", help="no PyTorch / Opacus + PEFT side")
    parser.add_argument("--next-factor", type=number_at_least(0.0, strict=True), default=NEXT_METHOD_FACTOR,
                        help="under --deadline, a further method starts only if the time left is more than this "
                        f"many times what the previous method took (default {NEXT_METHOD_FACTOR:g})")
    args = parser.parse_args(argv)
    if args.layers < 1:
        parser.error(f"--layers must be an integer >= 1, got {args.layers}")
    import jax

    if not args.cpu_smoke and jax.default_backend() == "cpu":
        print("error: no accelerator (jax.default_backend() is 'cpu'); use --cpu-smoke on a CPU", file=sys.stderr)
        return 2
    flags = list(SMOKE if args.cpu_smoke else [*ACCELERATOR, "--layers", str(args.layers)])
    if args.method is not None:
        flags[flags.index("--method") + 1] = args.method
    if args.skip_torch or bench_finetune._torch.torch_available() is not None:
        flags.append("--skip-torch")  # recorded in the JSON (torch.skipped)
    start = time.perf_counter()
    if args.deadline is not None and args.deadline < MIN_DEADLINE:
        result = {"part": "finetune", "status": "skipped", "reason": f"{args.deadline:.0f} s left before the deadline",
                  "wall_seconds": round(time.perf_counter() - start, 1)}
        print(f"finetune: skipped: {result['reason']}", flush=True)
        write_json(args.out, result)
        return 0
    chosen = flags[flags.index("--method") + 1]
    methods = [m for m in ORDER if chosen in (m, "both")]
    result = {"part": "finetune", "status": "ok", "methods": [], "runs": {}, "skipped_methods": {}}
    previous = None
    for method in methods:
        elapsed = time.perf_counter() - start
        if previous is not None and args.deadline is not None:
            left = args.deadline - elapsed
            if left < args.next_factor * previous:
                result["skipped_methods"][method] = (f"not started at {elapsed:.0f} s of the {args.deadline:.0f} s "
                                                     f"deadline: {left:.0f} s left, under {args.next_factor:g} "
                                                     f"times the {previous:.0f} s the method before it took")
                print(f"finetune: {method} skipped: {result['skipped_methods'][method]}", flush=True)
                continue
        one = list(flags)
        one[one.index("--method") + 1] = method
        t0 = time.perf_counter()
        rc, run = bench_finetune.run(bench_finetune.parse(one))
        if rc != 0:
            return rc  # a failed check: the file holds the methods measured before it, if any
        previous = time.perf_counter() - t0
        result["methods"].append(method)
        result["runs"][method] = {**run, "arguments": one}
        result["wall_seconds"] = round(time.perf_counter() - start, 1)
        write_json(args.out, result)  # what is measured so far, should the kit's timeout stop the next method
    result["wall_seconds"] = round(time.perf_counter() - start, 1)
    write_json(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
