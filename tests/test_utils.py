"""snapaudit_jax.utils: the error hierarchy and its exit statuses, the one JSON rule, atomic writes, progress."""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest

from snapaudit_jax import cli
from snapaudit_jax.models.weights import CheckpointError
from snapaudit_jax.models.config import ConfigError
from snapaudit_jax.models.tokenizer import TokenizerError
from snapaudit_jax.utils import (
    ClaimViolation,
    ConfigFileError,
    Counter,
    DependencyError,
    InputError,
    MissingFileError,
    Progress,
    RunLog,
    SnapAuditError,
    atomic_write,
    dumps,
    to_json,
    validate,
    write_json,
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


def test_to_json_one_rule_for_non_finite_numbers():
    obj = {"a": math.inf, "b": -np.inf, "c": np.float32("nan"), "d": np.float64(0.25), "e": np.int64(3),
           "f": (1, 2.5), "g": np.bool_(True), "h": np.array(2.0), 4: {"x": [np.float16(1.5), None, "s"]},
           "i": {2, 1}}
    out = to_json(obj)
    assert out == {"a": None, "b": None, "c": None, "d": 0.25, "e": 3, "f": [1, 2.5], "g": True, "h": 2.0,
                   "4": {"x": [1.5, None, "s"]}, "i": [1, 2]}
    assert type(out["e"]) is int and type(out["d"]) is float and type(out["g"]) is bool
    text = dumps(obj)
    assert "NaN" not in text and "Infinity" not in text and json.loads(text) == out
    with pytest.raises(TypeError, match="no JSON form for ndarray"):
        to_json({"v": np.zeros(3)})
    with pytest.raises(TypeError, match="no JSON form for object"):
        to_json([object()])


def test_write_json_is_atomic_and_strict(tmp_path):
    path = tmp_path / "sub" / "r.json"
    write_json(path, {"eps": math.inf, "n": np.int32(2)})
    assert json.loads(path.read_text()) == {"eps": None, "n": 2}
    before = path.read_bytes()

    def fail(fh):
        fh.write(b"{\"partial\": ")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_write(path, fail)
    assert path.read_bytes() == before  # the old file survives whole
    assert sorted(os.listdir(path.parent)) == ["r.json"]  # and no temporary file is left behind
    with pytest.raises(TypeError):
        write_json(tmp_path / "bad.json", {"x": object()})
    assert not (tmp_path / "bad.json").exists()


def test_progress_printer_follows_the_protocol(capsys, monkeypatch):
    log = RunLog(True)
    assert isinstance(log, Progress) and isinstance(RunLog(False), Progress)
    log("stage one")
    for done in range(0, 101):
        log.bar(done, 100, "prompts")
    err = capsys.readouterr().err
    assert "] stage one\n" in err
    assert err.count("\n") == 2  # one message line, one finished bar
    assert "100/100 new prompts" in err and err.count("\r") < 10  # rate-limited
    quiet = RunLog(False)
    quiet("x")
    quiet.bar(1, 1, "y")
    c = Counter("sim", 10, enabled=False)
    c.update(10)
    assert capsys.readouterr().err == ""
