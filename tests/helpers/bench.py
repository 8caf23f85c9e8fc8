"""Running a benchmark script in a subprocess from the tests (tests never import benchmarks).

The runs of one test module share a JAX compilation cache in a temporary folder, so the steps compiled by one run
are not compiled again by the next, and XLA compiles without its expensive CPU passes (about half the compile
time; the scripts' checks have tolerances far above the float32 rounding this changes).
"""

from __future__ import annotations

import os
import subprocess
import sys

from tests.helpers.paths import ROOT

# XLA on the CPU without its expensive passes: about half the compile time of the scripts' many small steps.
FAST_COMPILE_XLA_FLAGS = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"


def bench_env(cache_dir) -> dict[str, str]:
    """The environment of the scripts' runs: the shared compilation cache in ``cache_dir``, the CPU backend.

    Args:
      cache_dir: a folder for the persistent compilation cache (``tmp_path_factory.mktemp(...)``).

    Returns:
      A copy of ``os.environ`` with the cache and XLA settings.
    """
    return dict(os.environ, JAX_COMPILATION_CACHE_DIR=str(cache_dir), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0", JAX_PLATFORMS="cpu",
                XLA_FLAGS=FAST_COMPILE_XLA_FLAGS)


def run_script(name: str, args, env, timeout: float) -> subprocess.CompletedProcess:
    """``python benchmarks/<name> args`` from the repository root, its output captured.

    Args:
      name: the script's file name under ``benchmarks/`` (``"bench_dpsgd.py"``).
      args: its command-line arguments.
      env: the environment (:func:`bench_env`).
      timeout: seconds.

    Returns:
      The finished process.
    """
    script = os.path.join(str(ROOT), "benchmarks", name)
    return subprocess.run([sys.executable, script, *args], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=str(ROOT))
