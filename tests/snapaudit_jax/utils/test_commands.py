"""ConfigCommand targets: callables or lazily imported ``module:function`` strings."""

from __future__ import annotations

import pytest

from snapaudit_jax.utils.commands import ConfigCommand, resolve


def _command(**kw):
    base = dict(name="x", help="h", description="d", example="e.toml", load=len, run=print, report="r.md")
    return ConfigCommand(**{**base, **kw})


def test_resolve_returns_callables_and_imports_string_targets():
    assert resolve(len) is len
    import os.path

    assert resolve("os.path:join") is os.path.join


def test_the_audit_command_names_its_functions():
    from snapaudit_jax.dpicl.command import COMMAND
    from snapaudit_jax.dpicl.config import load_config
    from snapaudit_jax.dpicl.run import run_audit

    assert resolve(COMMAND.load) is load_config

    assert resolve(COMMAND.run) is run_audit
    assert resolve(COMMAND.summary)({"mia": {"rows": [1, 2]}}) == "MIA AUC rows: 2 (mia.json)"
    assert resolve(COMMAND.summary)({"mia": None}) is None


@pytest.mark.parametrize("field", ["load", "run", "summary"])
def test_malformed_targets_are_refused_naming_the_field(field):
    with pytest.raises(TypeError, match=rf"'x': {field} must be a callable or a 'module:function' target, "
                                        r"got 'no colon'"):
        _command(**{field: "no colon"})


def test_a_missing_function_is_an_attribute_error():
    with pytest.raises(AttributeError):
        resolve("os.path:no_such_function")
