"""The accelerator benchmark kit: every part in turn, each in its own process, under one time budget.

Usage (``benchmarks/gpu/run.sh`` calls it after installing)::

    python benchmarks/gpu/kit.py --out DIR [--budget SECONDS] [--parts simulation,dpsgd,finetune,llm,tests]
    python benchmarks/gpu/kit.py --cpu-smoke --out DIR

Parts (each writes ``DIR/<part>.json``; see ``benchmarks/gpu/README.md``):

* ``simulation`` -- ``simulation.py``: 10^9 trials per hypothesis for PV (k = 2, 16), PoE, ESA, KSA
  against the device's random-bit throughput;
* ``dpsgd`` -- ``dpsgd.py``: a DP-SGD step of GPT-2-small against the non-private step;
* ``finetune`` -- ``finetune.py``: DP fine-tuning (full and LoRA) of the SmolLM2 shape, ours against the
  non-private step and Opacus (hooks and ghost clipping) + PEFT on the same device;
* ``llm`` -- ``llm.py``: bfloat16 prefill and decode of three Llama shapes against transformers;
* ``tests`` -- the accelerator-relevant tests on the default backend: the simulator's counts across
  chunk sizes, device counts and vectorised blocks, its kernels' exactness (variates, mechanisms),
  and bfloat16 model parity.

Every part gets ``--deadline`` (the seconds left of ``--budget`` minus a margin, less the least time of each
part after it, ``LEAST``, but never under its own) and a hard timeout at the budget;
a part that fails, times out or is skipped is recorded in ``DIR/kit.json`` with its exit status and
the tail of its output, and the kit goes on. Exit status: 0 if every part that ran succeeded.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PARTS = ("simulation", "dpsgd", "finetune", "llm", "tests")
# Seconds each part is planned for on one H200 (llm: mostly XLA compilation of the unrolled models; dpsgd: five
# variants of GPT-2-small, each compiled twice (checked and timed), the per-record one measured at about 56 s of
# compilation with the blocks unrolled -- they now run under one scan there, DPSGDConfig.layers = "auto", not yet
# measured on the device; a deadline stops it starting further variants; finetune: an estimate,
# not yet measured there -- about a dozen compiles of a 4-layer SmolLM2 shape and the torch side).
PLANNED = {"simulation": 90, "dpsgd": 240, "finetune": 180, "llm": 210, "tests": 120}
MARGIN = 15
# The least time each part measures something in (its own thresholds: dpsgd and finetune skip themselves below 60
# and 90 s; one simulation case, one LLM shape, the test subset): a part's deadline leaves the parts after it this
# much, so that the first cannot spend the whole budget (dpsgd, finetune and llm stop starting work at theirs).
LEAST = {"simulation": 30, "dpsgd": 60, "finetune": 90, "llm": 60, "tests": 60}
TEST_FILES = (
    "tests/snapaudit_jax/simulation/test_trials.py",
    "tests/snapaudit_jax/mechanisms/test_variates.py",
    "tests/snapaudit_jax/mechanisms/test_mechanisms.py",
    "tests/snapaudit_jax/models/test_bfloat16.py",
    "tests/snapaudit_jax/dpsgd/test_noise.py",  # the DP noise's transform and tails on the device's ndtri
)
# The smoke run keeps the kit's plumbing honest, not the tests (CI runs them all): a quick subset.
SMOKE_TESTS = "chunk_size or random_words_are_jax or kv_cache"


def _tail(text: str, chars: int = 3000) -> str:
    return text[-chars:]


def environment() -> dict:
    """Versions and devices, read in a child process (this one never imports jax)."""
    code = (
        "import json, platform, jax\n"
        "info = {'python': platform.python_version(), 'jax': jax.__version__, 'backend': jax.default_backend(),\n"
        "        'devices': [d.device_kind for d in jax.devices()]}\n"
        "try:\n"
        "    import jaxlib, flax; info.update(jaxlib=jaxlib.__version__, flax=flax.__version__)\n"
        "except ImportError: pass\n"
        "try:\n"
        "    import torch; info.update(torch=torch.__version__, torch_cuda=torch.cuda.is_available())\n"
        "except ImportError: pass\n"
        "try:\n"
        "    import transformers; info.update(transformers=transformers.__version__)\n"
        "except ImportError: pass\n"
        "print(json.dumps(info))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    info = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else {"error": _tail(proc.stderr)}
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
        if smi.returncode == 0:
            info["nvidia_smi"] = smi.stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        pass
    info.update(machine=platform.machine(), cpu_count=os.cpu_count())
    return info


def command(part: str, out_dir: str, smoke: bool, deadline: float) -> list[str]:
    out = os.path.join(out_dir, f"{part}.json")
    if part == "tests":
        junit = os.path.join(out_dir, "tests.xml")
        select = ["-k", SMOKE_TESTS] if smoke else []
        return [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}", *select,
                *TEST_FILES]
    args = [sys.executable, os.path.join(HERE, f"{part}.py"), "--out", out]
    if smoke:
        args.append("--cpu-smoke")
    return [*args, "--deadline", f"{deadline:.0f}"]


def tests_summary(out_dir: str) -> dict:
    """Counts of the JUnit report pytest wrote."""
    import xml.etree.ElementTree as ET

    path = os.path.join(out_dir, "tests.xml")
    if not os.path.exists(path):
        return {}
    root = ET.parse(path).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    failed = [f"{case.get('classname')}::{case.get('name')}" for case in suite.iter("testcase")
              if case.find("failure") is not None or case.find("error") is not None]
    return {**counts, "failed": failed, "seconds": float(suite.get("time", 0.0))}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for the JSON files (created)")
    parser.add_argument("--cpu-smoke", action="store_true", help="every part tiny, on the CPU (about 90 s)")
    parser.add_argument("--budget", type=float, default=None, help="seconds for all parts (default 450; smoke 600)")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated subset of {','.join(PARTS)}")
    args = parser.parse_args(argv)
    parts = [p for p in args.parts.split(",") if p]
    if not parts or any(p not in PARTS for p in parts):
        parser.error(f"--parts must name some of {', '.join(PARTS)}, got {args.parts!r}")
    budget = args.budget if args.budget is not None else (600.0 if args.cpu_smoke else 450.0)
    if not (math.isfinite(budget) and budget > 0):
        parser.error(f"--budget must be a finite number of seconds > 0, got {args.budget}")
    os.makedirs(args.out, exist_ok=True)
    start = time.perf_counter()
    env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false", PYTHONUNBUFFERED="1", TQDM_DISABLE="1")
    if args.cpu_smoke:
        env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [env.get("PYTHONPATH"), ROOT]))
    summary = {"mode": "cpu-smoke" if args.cpu_smoke else "accelerator", "budget_seconds": budget,
               "margin_seconds": MARGIN, "least_seconds": {p: LEAST[p] for p in parts},
               "environment": environment(), "parts": {}}
    print(f"kit: {summary['mode']}, {summary['environment']}", flush=True)
    ok = True
    for index, part in enumerate(parts):
        left = budget - (time.perf_counter() - start)
        later = sum(LEAST[p] for p in parts[index + 1:])
        deadline = min(left - MARGIN, max(LEAST[part], left - MARGIN - later))
        if left < 30:
            summary["parts"][part] = {"status": "skipped", "reason": f"{left:.0f} s of the budget left"}
            print(f"kit: {part}: skipped ({left:.0f} s left)", flush=True)
            continue
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(command(part, args.out, args.cpu_smoke, deadline), cwd=ROOT, env=env,
                                  capture_output=True, text=True, timeout=left)
            rc, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
        except subprocess.TimeoutExpired as err:
            partial = err.stdout or ""  # bytes in some Python versions, even with text=True
            stdout = partial.decode(errors="replace") if isinstance(partial, bytes) else partial
            rc, stderr = "timeout", f"killed after {left:.0f} s"
        row = {"status": "ok" if rc == 0 else "failed", "returncode": rc, "started_at_seconds": round(budget - left, 1),
               "deadline_seconds": None if part == "tests" else round(deadline, 1),  # pytest: the timeout only
               "seconds": round(time.perf_counter() - t0, 1),
               "stdout_tail": _tail(stdout),
               "stderr_tail": _tail(stderr)}
        if part == "tests":
            row["summary"] = tests_summary(args.out)
        summary["parts"][part] = row
        ok &= rc == 0
        print(f"kit: {part}: {row['status']} in {row['seconds']} s\n{_tail(stdout, 1500)}", flush=True)
        if rc != 0:
            print(_tail(stderr, 1500), file=sys.stderr, flush=True)
    summary["wall_seconds"] = round(time.perf_counter() - start, 1)
    sys.path.insert(0, ROOT)
    from snapaudit_jax.utils.io import write_json

    write_json(os.path.join(args.out, "kit.json"), summary)
    print(f"kit: done in {summary['wall_seconds']} s: " + ", ".join(
        f"{p} {r['status']}" for p, r in summary["parts"].items()), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
