"""Running a benchmark script in a subprocess from the tests (tests never import benchmarks).

The runs of one test module share a JAX compilation cache in a temporary folder, so the steps compiled by one run
are not compiled again by the next, and XLA compiles without its expensive CPU passes (about half the compile
time; the scripts' checks have tolerances far above the float32 rounding this changes) and, where jaxlib has the
choice, with its earlier CPU fusion emitters (a third less compile time again).
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys

from tests.helpers.paths import ROOT

#: XLA's CPU flags of the tests' processes: no expensive passes (about half the compile time of the many small
#: programs), and on jaxlib 0.10 the fusions emitted by its earlier LLVM emitters rather than the MLIR ones (a
#: third less compile time again: the fast tier's training tests, 2 CPU cores, 2026-12-07). jaxlib 0.11 has no
#: such flag, and XLA aborts a process at an unknown one: :func:`fast_compile_xla_flags` adds it by version.
BASE_FAST_COMPILE_XLA_FLAGS = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
LEGACY_FUSION_EMITTERS_FLAG = "--xla_cpu_use_fusion_emitters=false"
#: The jaxlib releases (major, minor) whose XLA has ``xla_cpu_use_fusion_emitters``: read in the shared library of
#: 0.10.0 and 0.10.2 (present) and 0.11.2 (absent).
LEGACY_FUSION_EMITTERS_RELEASES = ((0, 10),)


def fast_compile_xla_flags(jaxlib_version: str | None = None) -> str:
    """``XLA_FLAGS`` for compiling the tests' many small programs quickly on the CPU.

    Args:
      jaxlib_version: the jaxlib release to choose for (default: the installed one, read without importing it).

    Returns:
      :data:`BASE_FAST_COMPILE_XLA_FLAGS`, with :data:`LEGACY_FUSION_EMITTERS_FLAG` where the release has it.
    """
    if jaxlib_version is None:
        try:
            jaxlib_version = importlib.metadata.version("jaxlib")
        except importlib.metadata.PackageNotFoundError:
            return BASE_FAST_COMPILE_XLA_FLAGS
    release = tuple(int(part) for part in re.findall(r"\d+", jaxlib_version)[:2])
    if release in LEGACY_FUSION_EMITTERS_RELEASES:
        return f"{BASE_FAST_COMPILE_XLA_FLAGS} {LEGACY_FUSION_EMITTERS_FLAG}"
    return BASE_FAST_COMPILE_XLA_FLAGS


FAST_COMPILE_XLA_FLAGS = fast_compile_xla_flags()
_DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"


def host_devices_xla_flags(count: int, inherited: str | None = None) -> str:
    """``XLA_FLAGS`` for a worker process with ``count`` XLA host devices that compiles as the suite does.

    Args:
      count: the host devices.
      inherited: the flags the worker was started with (default: its ``XLA_FLAGS``: the suite's
        :data:`FAST_COMPILE_XLA_FLAGS`, unless the run set its own).

    Returns:
      The inherited flags without a device count of theirs, and the count.
    """
    inherited = os.environ.get("XLA_FLAGS", "") if inherited is None else inherited
    kept = [flag for flag in inherited.split() if flag.split("=")[0] != _DEVICE_COUNT_FLAG]
    return " ".join([*kept, f"{_DEVICE_COUNT_FLAG}={count}"])


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
