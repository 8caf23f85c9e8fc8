"""The test processes' bound on compiled programs (:mod:`tests.helpers.compiled`), against the kernel's own count
of the process's memory maps."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.helpers import compiled
from tests.helpers.paths import ROOT

pytestmark = pytest.mark.skipif(compiled.map_count() is None, reason="no /proc/self/maps (not Linux)")

def test_the_limit_and_count_are_the_kernels():
    assert compiled.map_limit() >= 1024  # Linux's minimum setting is far above; the default is 65530
    assert 0 < compiled.map_count() < compiled.map_limit()


@pytest.mark.parametrize(
    ("count", "limit", "fraction", "over"),
    [(None, 100, 0.5, False), (60, None, 0.5, False), (50, 100, 0.5, False), (51, 100, 0.5, True),
     (10, 10, 0.9, True)],
)
def test_over_share(count, limit, fraction, over):
    assert compiled.over_share(count, limit, fraction) is over


_RELEASE = """
import json
import jax, jax.numpy as jnp
from tests.helpers import compiled

PROGRAMS = 15  # distinct programs compiled: each loads about three maps


def compile_many(tag):
    functions = [jax.jit(lambda x, i=i: jnp.sin(x) * (i + tag) + jnp.cos(x) ** 2) for i in range(PROGRAMS)]
    for f in functions:
        f(jnp.ones(3)).block_until_ready()
    return functions


compile_many(0.125)
compiled.release_compiled()  # the first programs also grow the allocator's own maps, which stay
before = compiled.map_count()
functions = compile_many(0.25)  # still referenced: only jax's caches hold the executables
loaded = compiled.map_count() - before
compiled.release_compiled()
print(json.dumps({"programs": PROGRAMS, "loaded": loaded, "left": compiled.map_count() - before,
                  "works": float(functions[3](jnp.zeros(3))[0])}))
"""


def test_release_unloads_the_programs_jax_keeps():
    """In a new process (a long-lived one's first release would drop all it compiled before: seconds, which grow
    with what ran before), the programs that only jax's caches keep unload, and their functions compile again."""
    proc = subprocess.run([sys.executable, "-c", _RELEASE], capture_output=True, text=True, timeout=120,
                          cwd=str(ROOT), env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout)
    assert r["loaded"] >= 2 * r["programs"]
    assert r["left"] <= 0.25 * r["loaded"]
    assert r["works"] == 1.0  # the functions still work: they compile again


_CONFTEST = "from tests.helpers.compiled import *  # noqa\n"
_COMPILE = """
import jax, jax.numpy as jnp, json, pathlib
from tests.helpers import compiled

KEEP = []  # kept alive, as a library's module-level jitted functions are: only a release unloads their programs


def test_compiles():
    compiled.MAPS_FRACTION = {fraction}  # read by the hook after this test
    fs = [jax.jit(lambda x, i=i: jnp.tanh(x) * (i + {offset}) - x) for i in range(12)]
    for f in fs:
        f(jnp.ones(2)).block_until_ready()
    KEEP.extend(fs)
    pathlib.Path("{name}.json").write_text(json.dumps(compiled.map_count()))
"""
_CHECK = """
import json, pathlib
from tests.helpers import compiled


def test_maps():
    assert compiled.map_count() {relation} json.loads(pathlib.Path("{name}.json").read_text()) - 20
"""


def test_the_hook_releases_past_its_share_of_the_limit(pytester: pytest.Pytester, monkeypatch):
    """In a new pytest process (in this one a release would drop every program the process compiled before: its
    time would grow with what ran before): a process never over its share keeps its programs (power), and one
    over it lets them go after the test that put it there."""
    pytester.makepyfile(
        test_a=_COMPILE.format(fraction=1.0, offset=0.5, name="a"), test_b=_CHECK.format(relation=">=", name="a"),
        test_c=_COMPILE.format(fraction=0.0, offset=0.25, name="c"), test_d=_CHECK.format(relation="<", name="c"))
    pytester.makeconftest(_CONFTEST)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")  # a bare pytest: its start is most of the time
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=4)
