"""The XLA flags of the benchmark scripts' smoke runs in the tests; this module never imports JAX."""

from __future__ import annotations

# LLVM's optimisation passes skipped: about a third less compilation of the tiny benchmark shapes; the HLO passes,
# which decide the arithmetic, run as before. The test processes themselves compile at XLA's default
# (tests/conftest.py says why).
FAST_COMPILE = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
