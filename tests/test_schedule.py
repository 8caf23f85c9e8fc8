"""The modules' order for xdist (tests/helpers/schedule.py): longest first by tests/durations.json, stable."""

import json
from types import SimpleNamespace

from tests.helpers import schedule
from tests.helpers.paths import ROOT


def _items(*nodeids):
    return [SimpleNamespace(nodeid=n) for n in nodeids]


def test_modules_go_longest_first_and_keep_their_tests_order():
    items = _items("tests/a.py::t1", "tests/b.py::t1", "tests/a.py::t2", "tests/c.py::t1", "tests/d.py::t1",
                   "tests/b.py::t2[x]", "tests/e.py::t1")
    got = [i.nodeid for i in schedule.order(items, {"tests/b.py": 50.0, "tests/d.py": 200.0, "tests/a.py": 1.0})]
    assert got == ["tests/d.py::t1", "tests/b.py::t1", "tests/b.py::t2[x]", "tests/a.py::t1", "tests/a.py::t2",
                   "tests/c.py::t1", "tests/e.py::t1"]  # unknown modules (c, e) last, in collection order
    contiguous = _items("tests/a.py::t1", "tests/a.py::t2", "tests/b.py::t1", "tests/c.py::t1")
    assert schedule.order(contiguous, {}) == contiguous  # no times: pytest's collection order, unchanged


def test_durations_come_from_a_junit_report_by_module_file(tmp_path):
    (tmp_path / "tests" / "x").mkdir(parents=True)
    (tmp_path / "tests" / "x" / "test_y.py").write_text("")
    (tmp_path / "tests" / "test_z.py").write_text("")
    report = tmp_path / "run.xml"
    report.write_text(
        '<testsuites><testsuite>'
        '<testcase classname="tests.x.test_y" name="test_a" time="2.5"/>'
        '<testcase classname="tests.x.test_y.TestK" name="test_b" time="1.25"/>'  # a test in a class
        '<testcase classname="tests.test_z" name="test_c[1]" time="7"/>'
        '</testsuite></testsuites>')
    assert schedule.from_junit(report, root=tmp_path) == {"tests/test_z.py": 7.0, "tests/x/test_y.py": 3.8}
    assert list(schedule.from_junit(report, root=tmp_path)) == ["tests/test_z.py", "tests/x/test_y.py"]


def test_the_suite_runs_in_the_sorted_order_under_xdist(pytestconfig):
    """xdist keeps the collection order only without its own reordering (pyproject's addopts), and the shipped
    times name test modules of this repository (a module renamed there would silently lose its place)."""
    assert pytestconfig.getoption("loadscopereorder") is False
    times = json.loads(schedule.DURATIONS.read_text())
    assert times and all(v >= 0 for v in times.values())
    missing = [m for m in times if not (ROOT / m).is_file()]
    assert not missing, missing
    assert schedule.load() == times
    assert schedule.load(ROOT / "no-such-file.json") == {}
