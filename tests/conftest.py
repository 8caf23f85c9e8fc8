"""Suite-wide set-up: the fast tier's limits (:mod:`tests.helpers.tiers`) and XLA settings of the test processes.

The test processes keep no persistent XLA compilation cache. They kept one under
``.pytest_cache/jax-compilation-cache`` until 2026-12-06, when two clean-clone runs of the whole suite each lost a
worker to a segmentation fault inside XLA:CPU's serialisation of a compiled training step for that cache
(``compilation_cache.put_executable_and_time`` -> ``executable.serialize()``, in ``test_train_clipping.py``,
after the worker had run other files; the file alone, and after ``test_ghost.py``, passed), and xdist then hung
on the lost worker. An earlier run had crashed once while deserialising from it. The commands that tests run in
subprocesses (the private-data suite, the benchmark smoke runs) keep their own environment and caches.
Lowering a jitted function that captures more than 16 KiB of constants fails the test (see below).

The test processes compile at XLA's default optimisation level, the level users run. (Without LLVM's passes,
the flags of :func:`tests.helpers.bench.bench_env`, a cold run took 20 min instead of 25; only the benchmark
smoke runs, which compile in subprocesses with a cache of their own, use those flags.)
"""

import jax

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

# A jitted function that closes over a large array makes it an XLA constant: compilation then constant-folds it
# (seconds, and XLA's "constant folding ... file a bug" alarm on every run). Kernels take arrays as arguments;
# pyproject's filterwarnings turns jax's warning past 16 KiB (the tiny test models are larger) into a failure of
# the test that lowered it.
jax.config.update("jax_captured_constants_warn_bytes", 1 << 14)
