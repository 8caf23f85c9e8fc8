"""Packages that load their parts on first use (:mod:`snapaudit_jax.utils.lazy`): importing them, or building the
command line, starts no JAX, and every exported name is the object its submodule defines."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys

import pytest

from tests.helpers.paths import ROOT

PACKAGES = ("snapaudit_jax", "snapaudit_jax.dpicl", "snapaudit_jax.finetune", "conformal", "attacks")

_PROBE = """
import json, sys
import snapaudit_jax, snapaudit_jax.dpicl, snapaudit_jax.finetune, conformal, attacks
from snapaudit_jax.cli import build_parser
build_parser()  # every command registered, the entry points' included
before = sorted(m for m in ("jax", "flax", "scipy", "torch") if m in sys.modules)
snapaudit_jax.simulate
print(json.dumps({"before": before, "after": "jax" in sys.modules}))
"""


def test_importing_the_packages_and_building_the_command_line_loads_no_jax():
    proc = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=120,
                          cwd=str(ROOT), env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    # power: the first exported name read loads its part, and JAX with it
    assert json.loads(proc.stdout) == {"before": [], "after": True}


@pytest.mark.parametrize("name", PACKAGES)
def test_every_exported_name_is_its_submodules_object(name):
    package = importlib.import_module(name)
    origin = {attr: module for module, attrs in package._EXPORTS.items() for attr in attrs}
    for attr in package.__all__:
        value = getattr(package, attr)
        if attr in origin:
            assert value is getattr(importlib.import_module(f"{name}.{origin[attr]}"), attr), attr
        else:  # a subpackage or submodule
            assert value is importlib.import_module(f"{name}.{attr}"), attr
    assert set(package.__all__) <= set(dir(package))


def test_an_unknown_name_is_an_attribute_error_naming_the_package():
    import snapaudit_jax

    with pytest.raises(AttributeError, match="module 'snapaudit_jax' has no attribute 'simulat'"):
        snapaudit_jax.simulat
    with pytest.raises(ImportError, match="cannot import name 'nothing' from 'conformal'"):
        exec("from conformal import nothing", {})  # the statement's own error, as a user meets it
    assert snapaudit_jax.dpsgd is importlib.import_module("snapaudit_jax.dpsgd")  # a subpackage, loaded when read
