"""Suite-wide set-up: the fast tier's limits (:mod:`tests.helpers.tiers`) and a persistent XLA compilation cache.

The cache keeps the compiled kernels of the tests (XLA programs of their tiny models and kernels, keyed by the
program, the flags and the jax version) under ``.pytest_cache/jax-compilation-cache`` in the repository, so a
second run of a tier compiles little. It is set in this process only: the commands that tests run in
subprocesses (the private-data suite, the benchmark smoke runs) keep their own environment.
Lowering a jitted function that captures more than 16 KiB of constants fails the test (see below).

The test processes compile at XLA's default optimisation level, the level users run. (Without LLVM's passes,
the flags of :func:`tests.helpers.bench.bench_env`, a cold run took 20 min instead of 25, but a test process then
crashed once with a segmentation fault while deserialising an executable from this cache; only the benchmark
smoke runs, which compile in subprocesses with a cache of their own, use those flags.)
"""

import jax

from tests.helpers.paths import ROOT
from tests.helpers.tiers import (  # noqa: F401  (pytest finds hooks by name in this module)
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
