"""snapaudit_jax.utils.errors: the error hierarchy and the exit status the command line gives each kind."""

from __future__ import annotations


import pytest

from snapaudit_jax import cli
from snapaudit_jax.models.weights import CheckpointError
from snapaudit_jax.models.config import ConfigError
from snapaudit_jax.models.tokenizer import TokenizerError
from snapaudit_jax.utils import (
    ClaimViolation,
    ConfigFileError,
    DependencyError,
    InputError,
    MissingFileError,
    SnapAuditError,
    validate,
)



def test_error_classes_carry_their_exit_status_and_stay_builtin_compatible():
    assert InputError("x").exit_code == ConfigFileError("x").exit_code == MissingFileError("x").exit_code == 2
    assert DependencyError("x").exit_code == 2 and ClaimViolation("x").exit_code == 3
    assert SnapAuditError("x").exit_code == 1
    for cls in (ConfigFileError, CheckpointError, ConfigError, TokenizerError, MissingFileError):
        assert issubclass(cls, InputError) and issubclass(cls, ValueError)
    assert issubclass(MissingFileError, FileNotFoundError) and issubclass(DependencyError, RuntimeError)
    with pytest.raises(InputError, match=r"trials must be an integer >= 1, got 0"):
        validate.positive_int("trials", 0)


@pytest.mark.parametrize("raised, code, needle, traceback", [
    (InputError("--trials must be an integer >= 1, got 0"), 2, "--trials must be", False),
    (ConfigFileError("data.tab.path: missing"), 2, "data.tab.path", False),
    (DependencyError("plotting needs matplotlib"), 2, "matplotlib", False),
    (PermissionError(13, "Permission denied"), 2, "Permission denied", False),
    (ClaimViolation("claim refuted"), 3, "claim refuted", False),
    (ZeroDivisionError("division by zero"), 1, "internal error", True),
    (ValueError("a numpy shape mismatch"), 1, "internal error", True),
    (KeyError("rows"), 1, "internal error", True),
])
def test_cli_maps_errors_to_exit_statuses(monkeypatch, capsys, raised, code, needle, traceback):
    def command(args):
        raise raised

    monkeypatch.setitem(cli._COMMANDS, "embed", command)
    assert cli.main(["embed", "--text", "a"]) == code
    err = capsys.readouterr().err
    assert needle in err
    assert ("Traceback (most recent call last)" in err) == traceback
