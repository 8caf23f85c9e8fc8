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

In a fast-tier run, a test over the limit fails with a message that names the limit, and a test module none of
whose tests is in the tier fails the session. In any other run the over-limit tests outside ``slow`` are listed
at the end (timings on a loaded machine are no verdict on the gate). Both work under pytest-xdist: the workers
hand their findings to the controller.
"""

from __future__ import annotations

import pytest

#: The most seconds (setup plus call) a test outside the ``slow`` tier may take on the 2-core development machine
#: (the ini option ``fast_test_limit_s`` overrides it, for the tests of these hooks).
FAST_TEST_LIMIT_S = 5.0
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
    if _fast_tier(item.config):
        report.outcome = "failed"
        report.longrepr = (
            f"{item.nodeid} took {total:.1f} s (setup and call), over the fast tier's limit of {limit} s "
            f"(tests/helpers/tiers.py FAST_TEST_LIMIT_S): shrink it, share its fixture, or mark it "
            f"@pytest.mark.{SLOW}"
        )
    else:
        item.config.stash[_OVER_KEY].append((item.nodeid, total))
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
