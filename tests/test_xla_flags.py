"""The XLA flags the test processes compile with (:func:`tests.helpers.bench.fast_compile_xla_flags`): the
installed jaxlib accepts every one of them, and the release table of the flag that only some releases have is
right for the installed one both ways (XLA aborts a process at an unknown flag: a wrong table would stop every
test process of the suite, or leave its compile time on the table)."""

from __future__ import annotations

import importlib.metadata
import math
import os
import subprocess
import sys

import pytest

from tests.helpers import bench

_START = "import jax, jax.numpy as jnp; print(float(jax.jit(lambda x: jnp.tanh(x).sum())(jnp.ones(4))))"


def _start_jax(flags: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, XLA_FLAGS=flags, JAX_PLATFORMS="cpu")
    return subprocess.run([sys.executable, "-c", _START], env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(("version", "legacy"), [("0.10.0", True), ("0.10.2", True), ("0.10.2.dev20261201", True),
                                                 ("0.11.2", False), ("0.9.2", False), ("1.0.0", False)])
def test_the_legacy_emitters_flag_goes_only_to_the_releases_that_have_it(version, legacy):
    flags = bench.fast_compile_xla_flags(version).split()
    assert flags[:2] == bench.BASE_FAST_COMPILE_XLA_FLAGS.split()
    assert (bench.LEGACY_FUSION_EMITTERS_FLAG in flags) is legacy and len(flags) == 2 + legacy


def test_the_installed_jaxlib_takes_the_suites_flags_and_the_table_is_right_for_it():
    installed = bench.fast_compile_xla_flags()
    assert installed == bench.FAST_COMPILE_XLA_FLAGS == bench.fast_compile_xla_flags(
        importlib.metadata.version("jaxlib"))
    proc = _start_jax(installed)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert float(proc.stdout.split()[-1]) == pytest.approx(4 * math.tanh(1.0), rel=1e-6)
    # a flag the release lacks: XLA refuses it (so the run above took every flag), the legacy emitters' flag among
    # them where the table says this release lacks it
    lacking = "--xla_cpu_no_such_flag=true"
    if bench.LEGACY_FUSION_EMITTERS_FLAG not in installed:
        lacking = bench.LEGACY_FUSION_EMITTERS_FLAG
    proc = _start_jax(f"{installed} {lacking}")
    assert proc.returncode != 0 and f"Unknown flag in XLA_FLAGS: {lacking.split('=')[0]}" in proc.stderr, (
        proc.stderr[-2000:])


@pytest.mark.parametrize(("inherited", "expected"), [
    ("", "--xla_force_host_platform_device_count=8"),
    ("--xla_backend_optimization_level=0 --xla_force_host_platform_device_count=2",
     "--xla_backend_optimization_level=0 --xla_force_host_platform_device_count=8"),
    ("--xla_force_host_platform_device_count=4 --xla_llvm_disable_expensive_passes=true",
     "--xla_llvm_disable_expensive_passes=true --xla_force_host_platform_device_count=8"),
])
def test_a_worker_keeps_the_flags_it_inherits_and_sets_its_own_device_count(inherited, expected):
    assert bench.host_devices_xla_flags(8, inherited) == expected
