"""The two test tiers, and the hooks that keep the fast one fast (registered by ``tests/conftest.py``).

* The **fast tier**, ``python -m pytest -q -m "not slow"``: what developers run while they work. Every test module
  keeps at least one test in it, and no test in it may take longer than :data:`FAST_TEST_LIMIT_S` (its setup
  included: a module fixture that trains a model counts against the first test that uses it).
* The **whole suite**, ``python -m pytest -q -n 2 --dist loadfile`` (the README's test line and ``.ci/run``): both
  tiers, the gate.

``slow`` is for what must be slow: whole-command runs on the embedded model, training runs, Monte Carlo validity
checks at full size, subprocess fleets (several devices or processes), the benchmark and GPU-kit smoke runs.
A test that is slow only because of its size or because it reloads a model is shrunk or shares its fixture
instead.

The limit is for the development machine at its usual speed, and that machine's speed varies (the whole suite
took 17 min 56 s on it one day and 30 min 49 s the next). Where a test goes over the limit in a fast-tier run, its
process times a reference workload once (:func:`reference_seconds`: tracing, compiling and running small XLA
programs, what most tests spend their time on) and stretches the limit by the machine's slowness against
:data:`REFERENCE_S`, at most :data:`MAX_FACTOR` times (:func:`machine_factor`; the ini option
``fast_test_machine_factor`` fixes the factor instead).

In a fast-tier run, a test over the (stretched) limit fails with a message that names the limit and the factor,
and a test module none of whose tests is in the tier fails the session. In any other run the tests outside
``slow`` over the limit itself are listed at the end (timings on a loaded machine are no verdict on the gate).
Both work under pytest-xdist: the workers hand their findings to the controller.
"""

from __future__ import annotations

import itertools
import statistics
import time

import pytest

#: The most seconds (setup plus call) a test outside the ``slow`` tier may take on the 2-core development machine
#: (the ini option ``fast_test_limit_s`` overrides it, for the tests of these hooks).
FAST_TEST_LIMIT_S = 5.0
#: Seconds :func:`reference_seconds` takes on the development machine at its usual speed, where the limit holds
#: as it is. Its median of three took 0.36-0.43 s there on 2026-12-07 (a new process or one that had compiled
#: hundreds of programs), when the machine ran about 1.9x slower than on 2026-12-06: 1.72x at the start of the day
#: (the whole suite at XLA's default level, 30 min 49 s against 17 min 56 s) and 1.10x more by the evening (the
#: whole suite of one commit, 25 min 10 s against 22 min 50 s).
REFERENCE_S = 0.2
#: The most the limit stretches on a slow machine: a test over ``MAX_FACTOR`` times the limit always fails.
MAX_FACTOR = 2.0
#: The marker of the slow tier.
SLOW = "slow"

#: Test modules with no test in the fast tier, each for a reason of its own (every other module keeps one).
SLOW_ONLY_MODULES = {
    "tests/snapaudit_jax/dpsgd/test_multihost.py": "two jax.distributed processes",
    "tests/snapaudit_jax/finetune/test_export_consumers.py": "every test reads one whole snapaudit finetune run",
    "tests/benchmarks/test_bench_finetune.py": "runs the benchmark script in subprocesses (torch, Opacus, jax)",
    "tests/benchmarks/test_gpu_kit.py": "runs the GPU kit's scripts in subprocesses",
    "tests/snapaudit_jax/models/test_transformers_serve.py": "starts a real transformers serve process",
}

_SETUP_KEY = pytest.StashKey[dict]()
_FACTOR_KEY = pytest.StashKey[tuple]()
_SALT = itertools.count()
_OVER_KEY = pytest.StashKey[list]()
_DESELECTED_KEY = pytest.StashKey[list]()
_EMPTY_MODULES_KEY = pytest.StashKey[list]()


def deselects_slow(markexpr: str) -> bool:
    """Whether a ``-m`` expression leaves out the tests marked only ``slow`` (it is then a fast-tier run).

    Args:
      markexpr: the ``-m`` option's text (``""`` when not given).

    Returns:
      ``True`` for ``"not slow"`` and any expression a test marked ``slow`` alone does not match.
    """
    if not markexpr.strip():
        return False
    from _pytest.mark.expression import Expression

    return not Expression.compile(markexpr).evaluate(lambda name, **kwargs: name == SLOW)


def modules_without_selected(selected: list[str], deselected: list[str], exempt=()) -> list[str]:
    """The test modules every collected test of which was deselected, less those ``exempt``.

    Args:
      selected: the module path of each selected test.
      deselected: the module path of each deselected test.
      exempt: module paths allowed to have no selected test.

    Returns:
      The sorted module paths that appear in ``deselected`` and not in ``selected`` or ``exempt``.
    """
    return sorted(set(deselected) - set(selected) - set(exempt))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        "fast_test_limit_s", f"the fast tier's limit per test in seconds (default {FAST_TEST_LIMIT_S})",
        type="string", default=str(FAST_TEST_LIMIT_S),
    )
    parser.addini(
        "fast_test_machine_factor", "the factor on that limit for the machine's speed: 'auto' (default: measured "
        "when a test goes over the limit) or a number", type="string", default="auto",
    )


def reference_seconds(programs: int = 8) -> float:
    """Seconds to trace, compile and run ``programs`` small XLA programs new to the process (what most of the
    suite's tests spend their time on): the machine's speed at the moment, in the process's own setting.

    Args:
      programs: how many distinct programs (each call's are new: nothing comes from jax's caches).

    Returns:
      The wall-clock seconds of the whole loop.
    """
    import jax
    import jax.numpy as jnp

    salt = next(_SALT)
    start = time.perf_counter()
    for i in range(programs):
        scale = salt * programs + i + 0.5  # a constant of the program: a new program for every call and index
        f = jax.jit(lambda x, scale=scale: (jnp.tanh(x @ x.T) * scale).sum(axis=0) + jnp.cos(x[0]))
        f(jnp.ones((8, 8), jnp.float32)).block_until_ready()
    return time.perf_counter() - start


def machine_factor(seconds: float, reference: float = REFERENCE_S, most: float = MAX_FACTOR) -> float:
    """How much slower than usual the machine runs, as a factor on the fast tier's limit.

    Args:
      seconds: what :func:`reference_seconds` took now.
      reference: what it takes on the development machine at its usual speed.
      most: the largest factor.

    Returns:
      ``seconds / reference`` within ``[1, most]``: a fast machine never tightens the limit, and a very slow one
      stretches it ``most`` times at most.
    """
    return min(most, max(1.0, seconds / reference))


def _factor(config: pytest.Config) -> tuple[float, str]:
    """This process's factor and where it comes from: the ini option's number, or measured once, when a test
    first goes over the limit."""
    if _FACTOR_KEY not in config.stash:
        fixed = str(config.getini("fast_test_machine_factor")).strip()
        if fixed == "auto":
            reference_seconds(2)  # jax's own first-use costs, outside the timing
            seconds = statistics.median(reference_seconds() for _ in range(3))
            config.stash[_FACTOR_KEY] = (machine_factor(seconds), f"the reference workload took {seconds:.2f} s "
                                         f"against its usual {REFERENCE_S} s, at most {MAX_FACTOR}x")
        else:
            config.stash[_FACTOR_KEY] = (float(fixed), "fast_test_machine_factor")
    return config.stash[_FACTOR_KEY]


def _limit(config: pytest.Config) -> float:
    return float(config.getini("fast_test_limit_s"))


def _fast_tier(config: pytest.Config) -> bool:
    return deselects_slow(config.getoption("markexpr") or "")


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_SETUP_KEY] = {}
    config.stash[_OVER_KEY] = []
    config.stash[_DESELECTED_KEY] = []


def deselected(config: pytest.Config) -> list[pytest.Item]:
    """The tests this session deselected (``-m``, ``-k``, ``--deselect`` and other plugins)."""
    return config.stash[_DESELECTED_KEY]


def pytest_deselected(items: list[pytest.Item]) -> None:
    if items:
        items[0].config.stash[_DESELECTED_KEY].extend(items)


def pytest_collection_finish(session: pytest.Session) -> None:
    config = session.config
    whole_modules = not config.getoption("keyword") and not any("::" in arg for arg in config.args)
    empty: list[str] = []
    if _fast_tier(config) and whole_modules:
        root = config.rootpath
        empty = modules_without_selected(
            [str(item.path) for item in session.items], [str(item.path) for item in config.stash[_DESELECTED_KEY]],
            [str(root / path) for path in SLOW_ONLY_MODULES],
        )
    config.stash[_EMPTY_MODULES_KEY] = empty


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    if item.get_closest_marker(SLOW) is not None or report.when == "teardown":
        return report
    setup = item.config.stash[_SETUP_KEY]
    if report.when == "setup":
        setup[item.nodeid] = report.duration
        return report
    total, limit = setup.pop(item.nodeid, 0.0) + report.duration, _limit(item.config)
    if total <= limit or not report.passed:
        return report
    if not _fast_tier(item.config):
        item.config.stash[_OVER_KEY].append((item.nodeid, total))
        return report
    factor, why = _factor(item.config)
    if total > limit * factor:
        report.outcome = "failed"
        report.longrepr = (
            f"{item.nodeid} took {total:.1f} s (setup and call), over the fast tier's limit of {limit} s x "
            f"{factor:.2f} for this machine's speed ({why}) = {limit * factor:.1f} s (tests/helpers/tiers.py "
            f"FAST_TEST_LIMIT_S, machine_factor): shrink it, share its fixture, or mark it @pytest.mark.{SLOW}"
        )
    return report


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    over = config.stash[_OVER_KEY]
    if over:
        terminalreporter.section(f"tests outside '{SLOW}' over {_limit(config)} s")
        for nodeid, total in sorted(over, key=lambda row: -row[1]):
            terminalreporter.line(f"{total:7.1f} s  {nodeid}")
    empty = config.stash.get(_EMPTY_MODULES_KEY, [])
    if empty:
        terminalreporter.section("test modules with no test in the fast tier")
        for path in empty:
            terminalreporter.line(path)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    if hasattr(config, "workeroutput"):  # a pytest-xdist worker: its findings go to the controller
        config.workeroutput["tiers_empty_modules"] = list(config.stash.get(_EMPTY_MODULES_KEY, []))
        config.workeroutput["tiers_over"] = [list(row) for row in config.stash[_OVER_KEY]]
        return
    if config.stash.get(_EMPTY_MODULES_KEY, []) and exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """pytest-xdist's controller: gathers what each worker found (every worker collects the whole selection)."""
    out = getattr(node, "workeroutput", None) or {}
    config = node.config
    empty = set(config.stash.get(_EMPTY_MODULES_KEY, [])) | set(out.get("tiers_empty_modules", []))
    config.stash[_EMPTY_MODULES_KEY] = sorted(empty)
    config.stash[_OVER_KEY].extend((nodeid, total) for nodeid, total in out.get("tiers_over", []))
