"""Suite-wide set-up: the fast tier's limits (:mod:`tests.helpers.tiers`) and a persistent XLA compilation cache.

The cache keeps the compiled kernels of the tests (XLA programs of their tiny models and kernels, keyed by the
program, the flags and the jax version) under ``.pytest_cache/jax-compilation-cache`` in the repository, so a
second run of a tier compiles little. It is set in this process only: the commands that tests run in
subprocesses (the private-data suite, the benchmark smoke runs) keep their own environment.
Lowering a jitted function that captures more than 16 KiB of constants fails the test (see below).

XLA compiles the suite's programs without LLVM's optimisation passes (``tests.helpers.xla.FAST_COMPILE``, added to
``XLA_FLAGS`` before JAX starts its backend, so the commands tests run in subprocesses inherit it): compilation of
the tiny test models dominates the suite, and these flags cut it by about a third (measured on 2 CPU cores:
``test_ghost.py`` 116 -> 81 s, ``test_trials.py`` + ``test_kernels.py`` 106 -> 82 s from an empty cache). They
change how fast the compiled code runs, not what it computes (XLA's HLO passes, which decide the arithmetic, run
as before). ``SNAPAUDIT_TEST_XLA_OPTIMIZE=1`` runs the suite at XLA's default instead. The workers of the
multi-device and multi-process tests set their own ``XLA_FLAGS`` (device counts), so the programs of DP training
and the simulator are also compiled at the default optimisation level in every run of the suite.
"""

from tests.helpers.xla import use_fast_compile

use_fast_compile()

import jax  # noqa: E402  (after XLA_FLAGS: the backend reads them when it starts)

from tests.helpers.paths import ROOT  # noqa: E402
from tests.helpers.tiers import (  # noqa: E402,F401  (pytest finds hooks by name in this module)
    pytest_addoption,
    pytest_collection_finish,
    pytest_configure,
    pytest_deselected,
    pytest_runtest_makereport,
    pytest_sessionfinish,
    pytest_terminal_summary,
    pytest_testnodedown,
)

jax.config.update("jax_compilation_cache_dir", str(ROOT / ".pytest_cache" / "jax-compilation-cache"))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.1)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
# A jitted function that closes over a large array makes it an XLA constant: compilation then constant-folds it
# (seconds, and XLA's "constant folding ... file a bug" alarm on every run). Kernels take arrays as arguments;
# pyproject's filterwarnings turns jax's warning past 16 KiB (the tiny test models are larger) into a failure of
# the test that lowered it.
jax.config.update("jax_captured_constants_warn_bytes", 1 << 14)
