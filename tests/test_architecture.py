"""The layering rules of docs/architecture.md, checked on the source tree (AST, every import statement)."""

from __future__ import annotations

import ast
import importlib
import pkgutil

import pytest

import snapaudit_jax

from tests.helpers.paths import ROOT


def _imports(package: str):
    """``(file, line, module, names)`` of every import in ``package``, function-level ones included."""
    for path in sorted((ROOT / package).rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    yield path.relative_to(ROOT), node.lineno, alias.name, ()
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                yield path.relative_to(ROOT), node.lineno, node.module, tuple(a.name for a in node.names)


def _top(module: str) -> str:
    return module.split(".")[0]


def test_snapaudit_jax_imports_neither_conformal_nor_attacks():
    bad = [f"{f}:{n} {m}" for f, n, m, _ in _imports("snapaudit_jax") if _top(m) in ("conformal", "attacks")]
    assert not bad, bad


@pytest.mark.parametrize("package", ["conformal", "attacks"])
def test_applications_use_public_names_only(package):
    bad = []
    for f, n, module, names in _imports(package):
        if _top(module) != "snapaudit_jax":
            continue
        private = [p for p in module.split(".") if p.startswith("_")] + [x for x in names if x.startswith("_")]
        if private:
            bad.append(f"{f}:{n} {module} {names}")
    assert not bad, bad


def test_conformal_needs_nothing_from_the_dpicl_application():
    bad = [f"{f}:{n} {m}" for f, n, m, _ in _imports("conformal") if m.startswith("snapaudit_jax.dpicl")]
    assert not bad, bad


def test_conformal_and_attacks_do_not_import_each_other():
    assert not [m for _, _, m, _ in _imports("conformal") if _top(m) == "attacks"]
    assert not [m for _, _, m, _ in _imports("attacks") if _top(m) == "conformal"]


def test_utils_import_no_jax_and_no_other_stage():
    for f, n, module, _ in _imports("snapaudit_jax/utils"):
        assert _top(module) not in ("jax", "flax", "optax"), f"{f}:{n} {module}"
        if _top(module) == "snapaudit_jax":
            assert module.startswith("snapaudit_jax.utils"), f"{f}:{n} {module}"


def test_tests_never_import_benchmarks():
    bad = [f"{f}:{n} {m}" for f, n, m, _ in _imports("tests") if _top(m) == "benchmarks"]
    assert not bad, bad


def test_top_level_exposes_every_stage_subpackage():
    subpackages = sorted(m.name for m in pkgutil.iter_modules(snapaudit_jax.__path__) if m.ispkg)
    assert subpackages == ["audits", "dpicl", "dpsgd", "estimation", "finetune", "mechanisms", "models", "report",
                           "simulation", "utils"]
    for name in subpackages:
        importlib.import_module(f"snapaudit_jax.{name}")
        assert getattr(snapaudit_jax, name).__name__ == f"snapaudit_jax.{name}", name
    # no flat stage modules left at the top: only the command line and the package entry
    flat = sorted(m.name for m in pkgutil.iter_modules(snapaudit_jax.__path__) if not m.ispkg)
    assert flat == ["__main__", "cli"]


def test_every_package_exports_what_its_all_names():
    for package in ("snapaudit_jax", "conformal", "attacks"):
        for info in pkgutil.walk_packages(importlib.import_module(package).__path__, package + "."):
            if info.name.endswith("__main__"):
                continue
            module = importlib.import_module(info.name)
            for name in getattr(module, "__all__", ()):
                assert hasattr(module, name), f"{info.name}.__all__ names {name!r}, which it lacks"


def test_one_mechanism_registry_feeds_every_caller():
    from snapaudit_jax import cli, mechanisms
    from snapaudit_jax.audits.command import MECHANISMS
    from snapaudit_jax.dpicl.pipelines import PIPELINES
    from snapaudit_jax.dpicl.config import PIPELINE_NAMES

    assert mechanisms.names() == cli.BUILT_IN_MECHANISMS == MECHANISMS == tuple(PIPELINES) == PIPELINE_NAMES
    for name in mechanisms.names():
        assert mechanisms.mechanism_class(name).name == name
    with pytest.raises(mechanisms.registry.InputError, match=r"--mechanism must be one of 'pv', .*got 'xyz'"):
        mechanisms.build("xyz", 1.0, 1e-5, 1.0, field="--mechanism")


def test_config_commands_of_other_packages_come_from_entry_points():
    import tomllib

    from snapaudit_jax.utils.commands import ConfigCommand, discover

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["snapaudit.commands"]
    assert declared == {"cpa": "conformal.command:COMMAND", "pii": "attacks.command:COMMAND"}
    found = discover()
    assert sorted(found) == ["cpa", "pii"]  # the installed metadata carries them
    assert all(isinstance(c, ConfigCommand) for c in found.values())
    assert found["cpa"].report == "report.md" and found["pii"].report == "table.md"


def _undocumented(folder: str) -> list[str]:
    """Public functions, classes and public methods without a docstring, or without ``Args:`` though they take
    parameters (an override may refer to the documented base method instead)."""
    out = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in tree.body:
            members = [node]
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                members += [m for m in node.body if isinstance(m, ast.FunctionDef)]
            for m in members:
                if not isinstance(m, (ast.FunctionDef, ast.ClassDef)):
                    continue
                if m.name.startswith("_") and m.name not in ("__call__", "__init__"):
                    continue
                doc = ast.get_docstring(m) or ""
                params = isinstance(m, ast.FunctionDef) and [
                    a.arg for a in m.args.args + m.args.kwonlyargs if a.arg not in ("self", "cls")]
                if m.name == "__init__" and not params:
                    continue
                if not doc or (params and "Args:" not in doc and "See :meth:" not in doc):
                    out.append(f"{path.relative_to(ROOT)}:{m.lineno} {m.name}")
    return out


@pytest.mark.parametrize("folder", [
    "snapaudit_jax/utils", "snapaudit_jax/mechanisms", "snapaudit_jax/simulation", "snapaudit_jax/estimation",
    "snapaudit_jax/audits", "snapaudit_jax/report", "snapaudit_jax/models", "snapaudit_jax/dpsgd",
    "snapaudit_jax/dpicl", "snapaudit_jax/finetune", "conformal", "attacks",
])
def test_public_api_has_google_docstrings(folder):
    missing = _undocumented(folder)
    assert not missing, missing
