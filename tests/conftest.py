"""Suite-wide set-up: the fast tier's limits (:mod:`tests.helpers.tiers`) and XLA settings of the test processes.

The test processes let go of their compiled XLA programs when they hold half of Linux's limit on memory maps
(:mod:`tests.helpers.compiled`): every program holds maps, and a worker of the whole suite that kept all of them
passed the limit of 65530 maps per process and died of a segmentation fault inside XLA (in clean-clone runs of
2026-12-06, in a compile or in the persistent compilation cache's serialisation; xdist then hung on the lost
worker). They keep no persistent compilation cache either; the commands that tests run in subprocesses (the
private-data suite, the benchmark smoke runs) keep their own environment and caches.
Lowering a jitted function that captures more than 16 KiB of constants fails the test (see below).

The test processes, and the commands they run in subprocesses, compile without XLA's expensive CPU passes and, on
jaxlib 0.10, with its earlier CPU fusion emitters (:data:`tests.helpers.bench.FAST_COMPILE_XLA_FLAGS`, set here
before JAX starts its backend) unless ``XLA_FLAGS`` is already set (an empty value included:
``XLA_FLAGS= pytest ...`` compiles at XLA's default level, the level users run). Most of the suite's time is
compilation of small programs; the checks' tolerances are far above what the optimisation level changes, and tests
that compare two runs bit for bit compare programs compiled alike. (One run of 2026-12-05 under these flags crashed
while deserialising a persistent-cache entry; the test processes have kept no persistent cache since, and the
memory-map limit above, found later, crashed workers that way at either level.)
"""

import os

from tests.helpers.bench import FAST_COMPILE_XLA_FLAGS

os.environ.setdefault("XLA_FLAGS", FAST_COMPILE_XLA_FLAGS)

import jax  # noqa: E402  (after XLA_FLAGS: the backend reads it once, when it starts)

from tests.helpers.compiled import pytest_runtest_teardown  # noqa: F401  (a hook, found by name)
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
