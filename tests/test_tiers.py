"""The fast tier's hooks (:mod:`tests.helpers.tiers`) on small suites run by pytester, and the real suite's
fast tier: every test module keeps a test in it."""

from __future__ import annotations

import subprocess
import sys
import tomllib

import pytest

from tests.helpers import tiers
from tests.helpers.paths import ROOT

_CONFTEST = "from tests.helpers.tiers import *  # noqa\n"
# (the machine factor fixed at 1: the sleeps below decide, whatever the machine's speed)
_INI = "[pytest]\nfast_test_limit_s = 0.45\nfast_test_machine_factor = 1\nmarkers =\n    slow: the slow tier\n"
_MODULE = """
import time
import pytest

@pytest.fixture
def slow_setup():
    time.sleep(0.3)

def test_quick():
    pass

def test_sleeps():
    time.sleep(0.5)

def test_setup_counts(slow_setup):
    time.sleep(0.3)

@pytest.mark.slow
def test_marked():
    time.sleep(0.5)
"""


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeini(_INI)
    pytester.makeconftest(_CONFTEST)
    pytester.makepyfile(test_mixed=_MODULE)
    return pytester


@pytest.mark.parametrize(
    ("markexpr", "fast"),
    [("", False), ("not slow", True), ("slow", False), ("not slow and not gpu", True), ("slow or not slow", False),
     ("  ", False)],
)
def test_deselects_slow(markexpr, fast):
    assert tiers.deselects_slow(markexpr) is fast


def test_modules_without_selected():
    assert tiers.modules_without_selected(["a", "a", "b"], ["a", "c", "c", "d"]) == ["c", "d"]
    assert tiers.modules_without_selected(["a"], []) == []
    assert tiers.modules_without_selected(["a"], ["c", "d"], exempt=["d", "e"]) == ["c"]


def test_a_fast_tier_run_fails_the_tests_over_the_limit_setup_included(suite):
    result = suite.runpytest("-m", "not slow")
    result.assert_outcomes(passed=1, failed=2, deselected=1)
    result.stdout.fnmatch_lines(["*test_sleeps took * s (setup and call), over the fast tier's limit of 0.45 s*"])
    result.stdout.fnmatch_lines(["*test_setup_counts took * s (setup and call)*"])


def test_a_slow_machine_stretches_the_limit_by_its_factor(suite):
    # a factor of 3 stretches 0.45 s to 1.35 s: the 0.5 s and 0.6 s tests pass; one of 1.5 s does not
    suite.makepyfile(test_long="import time\n\ndef test_long():\n    time.sleep(1.5)\n")
    result = suite.runpytest("-m", "not slow", "-o", "fast_test_machine_factor=3")
    result.assert_outcomes(passed=3, failed=1, deselected=1)
    result.stdout.fnmatch_lines(["*test_long took * s (setup and call), over the fast tier's limit of 0.45 s x 3.00 "
                                 "for this machine's speed (fast_test_machine_factor) = 1.4 s*"])


def test_machine_factor_is_the_slowness_within_one_and_its_most():
    assert tiers.machine_factor(0.5, reference=1.0) == 1.0  # a fast machine keeps the limit
    assert tiers.machine_factor(1.5, reference=1.0) == 1.5
    assert tiers.machine_factor(7.0, reference=1.0, most=2.0) == 2.0
    assert tiers.machine_factor(3 * tiers.REFERENCE_S) == tiers.MAX_FACTOR == 2.0


def test_the_reference_workload_compiles_new_programs_on_every_call():
    """Every call traces and compiles its programs anew (none comes from jax's caches, or it would time
    nothing of the machine's compiling speed)."""
    import jax

    compiles = []

    def listen(event, duration, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            compiles.append(duration)

    tiers.reference_seconds(1)  # the process's first programs (its input array's) outside the count
    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        seconds = tiers.reference_seconds(3)
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
    assert len(compiles) == 3 and 0 < sum(compiles) < seconds


def test_the_whole_suite_lists_them_and_passes(suite):
    result = suite.runpytest()
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(["*tests outside 'slow' over 0.45 s*", "*test_setup_counts", "*test_sleeps"])
    assert "test_marked" not in result.stdout.str().split("over 0.45 s")[1]


@pytest.fixture
def modules(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeini(_INI)
    pytester.makeconftest(_CONFTEST)
    pytester.makepyfile(
        test_all_slow="import pytest\n\n@pytest.mark.slow\ndef test_only():\n    pass\n",
        test_one_fast=(
            "import pytest\n\ndef test_quick():\n    pass\n\n@pytest.mark.slow\ndef test_marked():\n    pass\n"
        ),
    )
    return pytester


def test_a_module_with_no_fast_test_fails_the_fast_tier(modules):
    result = modules.runpytest("-m", "not slow")
    assert result.ret == pytest.ExitCode.TESTS_FAILED  # every test that ran passed: the module check fails the run
    result.assert_outcomes(passed=1, deselected=2)
    result.stdout.fnmatch_lines(["*test modules with no test in the fast tier*", "*test_all_slow.py"])
    assert "test_one_fast.py" not in result.stdout.str().split("no test in the fast tier")[1]
    assert modules.runpytest().ret == pytest.ExitCode.OK


def test_a_selection_of_tests_is_not_the_tier(modules):
    assert modules.runpytest("-m", "not slow", "-k", "quick or only").ret == pytest.ExitCode.OK
    assert modules.runpytest("-m", "not slow", "test_all_slow.py", "test_one_fast.py::test_quick").ret == 0


@pytest.mark.slow
def test_under_xdist_the_workers_findings_reach_the_controller(modules, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # the workers are new processes: they import tests.helpers.tiers
    modules.makepyfile(test_sleeps="import time\n\ndef test_sleeps():\n    time.sleep(0.5)\n")
    result = modules.runpytest("-m", "not slow", "-n", "2", "-p", "xdist")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(passed=1, failed=1)  # (the controller does not count deselected tests)
    result.stdout.fnmatch_lines([
        "*test_sleeps took * s (setup and call), over the fast tier's limit of 0.45 s*",
        "*test modules with no test in the fast tier*", "*test_all_slow.py",
    ])
    result = modules.runpytest("-n", "2", "-p", "xdist")
    assert result.ret == pytest.ExitCode.OK
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(["*tests outside 'slow' over 0.45 s*", "*test_sleeps.py::test_sleeps"])


@pytest.mark.slow
def test_every_module_of_the_suite_keeps_a_fast_test(request):
    """The real fast tier keeps a test of every module but the listed ones.

    Where this session collected the whole suite and deselected nothing (the whole-suite run; pytest-xdist's workers
    collect everything too), the tiers are read off its tests, through the function the module check uses; else a
    collection of the real fast tier (no test runs) in a subprocess must pass the module check.
    """
    modules = {str(path.relative_to(ROOT)) for path in (ROOT / "tests").rglob("test_*.py")}
    items = request.session.items
    paths = [str(item.path.relative_to(ROOT)) if item.path.is_relative_to(ROOT) else str(item.path) for item in items]
    if set(paths) == modules and not tiers.deselected(request.config):
        fast = [p for p, item in zip(paths, items) if item.get_closest_marker(tiers.SLOW) is None]
        slow = [p for p, item in zip(paths, items) if item.get_closest_marker(tiers.SLOW) is not None]
        assert tiers.modules_without_selected(fast, slow, tiers.SLOW_ONLY_MODULES) == []
        collected = set(fast)
    else:
        result = subprocess.run(
            [sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "not slow", "-p", "no:cacheprovider"],
            cwd=ROOT, capture_output=True, text=True, timeout=600,
        )
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        assert "with no test in the fast tier" not in result.stdout
        collected = {line.split("::")[0] for line in result.stdout.splitlines() if "::" in line}
    assert set(tiers.SLOW_ONLY_MODULES) <= modules
    assert collected == modules - set(tiers.SLOW_ONLY_MODULES), sorted(collected ^ modules)


@pytest.mark.slow
def test_a_worker_that_dies_fails_the_run_and_is_not_replaced(pytester: pytest.Pytester):
    """With the project's own options (pyproject's ``addopts``), a worker that dies of a segmentation fault (as
    XLA does past the memory-map limit, :mod:`tests.helpers.compiled`) fails its test and the run, and no worker
    replaces it (power: with restarts allowed, one does)."""
    with open(ROOT / "pyproject.toml", "rb") as fh:
        addopts = tomllib.load(fh)["tool"]["pytest"]["ini_options"]["addopts"]
    pytester.makeini(f"[pytest]\naddopts = {addopts}\n")
    pytester.makepyfile(
        test_dies="import os, signal\n\ndef test_dies():\n    os.kill(os.getpid(), signal.SIGSEGV)\n",
        test_fine="def test_fine():\n    pass\n",
    )
    result = pytester.runpytest_subprocess("-n", "2", "-p", "xdist", "--dist", "loadfile", timeout=120)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*worker gw* crashed and worker restarting disabled*"])
    result.assert_outcomes(passed=1, failed=1)
    assert "replacing crashed worker" not in result.stdout.str()
    again = pytester.runpytest_subprocess("-n", "2", "-p", "xdist", "--dist", "loadfile", "--max-worker-restart=1",
                                          timeout=120)
    again.stdout.fnmatch_lines(["*replacing crashed worker*"])
