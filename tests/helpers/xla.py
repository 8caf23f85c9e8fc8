"""The XLA flags the test suite compiles with (see ``tests/conftest.py``); this module never imports JAX."""

from __future__ import annotations

import os

# LLVM's optimisation passes skipped: about a third less compilation of the tiny test models; the HLO passes,
# which decide the arithmetic, run as before.
FAST_COMPILE = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"


def use_fast_compile() -> None:
    """Adds :data:`FAST_COMPILE` to this process's ``XLA_FLAGS`` (inherited by its subprocesses) unless
    ``SNAPAUDIT_TEST_XLA_OPTIMIZE=1`` asks for XLA's default; call it before JAX starts its backend."""
    flags = os.environ.get("XLA_FLAGS", "")
    if os.environ.get("SNAPAUDIT_TEST_XLA_OPTIMIZE") != "1" and FAST_COMPILE not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} {FAST_COMPILE}".strip()
