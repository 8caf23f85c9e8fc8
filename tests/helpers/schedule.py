"""Longest modules first: the order in which ``pytest -n 2 --dist loadfile`` hands out the test modules.

xdist's loadfile scheduling gives each worker a module and, as it finishes one, the next in its queue. By default
it queues the modules by their number of tests, so a module of two long tests (the GPU kit's smoke run, three to
four minutes) starts last and one worker ends alone. With ``--no-loadscope-reorder`` (pyproject's ``addopts``) it
keeps the collection order, which :func:`pytest_collection_modifyitems` sorts by each module's measured time in
``tests/durations.json``, longest first (the greedy longest-processing-time rule); a module the file does not list
counts 0 s. The tests of a module keep their order, and stale times cost balance, never a test.

Refresh the file from a whole-suite run's JUnit XML (``pytest -n 2 --dist loadfile --junitxml=run.xml``)::

    python -m tests.helpers.schedule run.xml
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

from tests.helpers.paths import ROOT

DURATIONS = ROOT / "tests" / "durations.json"


def module_of(nodeid: str) -> str:
    """The module part of a test's node id (``tests/x/test_y.py::test_z[a]`` -> ``tests/x/test_y.py``)."""
    return nodeid.split("::", 1)[0]


def load(path: Path = DURATIONS) -> dict[str, float]:
    """The measured seconds per module; ``{}`` where the file is missing or unreadable."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in data.items() if isinstance(v, (int, float))} if isinstance(data, dict) else {}


def order(items: list, seconds: dict[str, float]) -> list:
    """``items`` with their modules sorted by ``seconds``, longest first; stable otherwise (ties, unknown modules
    and the tests inside a module keep the collection order)."""
    first: dict[str, int] = {}
    for i, item in enumerate(items):
        first.setdefault(module_of(item.nodeid), i)

    def key(indexed):
        i, item = indexed
        module = module_of(item.nodeid)
        return -seconds.get(module, 0.0), first[module], i

    return [item for _, item in sorted(enumerate(items), key=key)]


def pytest_collection_modifyitems(session, config, items) -> None:
    """Sorts the collected tests' modules by their measured time, longest first (see the module docstring)."""
    items[:] = order(items, load())


def from_junit(xml_path: str | Path, root: Path = ROOT) -> dict[str, float]:
    """Seconds per module file from a JUnit XML report (its ``classname`` is the dotted module, with a class
    name after it for tests in classes)."""
    totals: dict[str, float] = defaultdict(float)
    for case in ET.parse(xml_path).iter("testcase"):
        parts = case.get("classname", "").split(".")
        for n in range(len(parts), 0, -1):
            path = "/".join(parts[:n]) + ".py"
            if (root / path).is_file():
                totals[path] += float(case.get("time", 0.0))
                break
    return {path: round(s, 1) for path, s in sorted(totals.items(), key=lambda kv: (-kv[1], kv[0]))}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m tests.helpers.schedule RUN.xml", file=sys.stderr)
        return 2
    DURATIONS.write_text(json.dumps(from_junit(argv[0]), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
