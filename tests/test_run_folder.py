"""Run folders owned by one run (:mod:`snapaudit_jax.utils.run_folder`): the stamp, the lock, and what they
refuse, on folders of every kind and with two runs at once.

The lock tests need no sleeps: a holder in a subprocess says when it holds the lock (a line on its stdout),
is killed with SIGKILL, and its death is awaited with ``wait()``. The bad-input suite
(:mod:`tests.helpers.bad_input.run_folder`) checks that each refusal of the command line leaves every byte of
the folder as it was; the run tests of audit and cpa resume a real finished folder and refuse another
configuration into it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys

import pytest

from snapaudit_jax.utils.errors import ConfigFileError, InputError
from snapaudit_jax.utils.run_folder import LOCK_FILE, STAMP_FILE, RunFolder, first_difference
from tests.helpers.bad_input.common import CPA_OK, _tree
from tests.helpers.paths import ROOT

CONFIG = {"audit": {"trials": 2000, "epsilons": (1.0, 4.0)}, "pipelines": {"pv": {"partitions": 3}}}


def _folder(path, config=CONFIG, **kw) -> RunFolder:
    return RunFolder(path, "audit", config, results=("results.json",), resume=("llm_cache.jsonl", "snapshots"),
                     **kw)


def _other(trials=3000):
    return {**CONFIG, "audit": {**CONFIG["audit"], "trials": trials}}


def test_the_stamp_records_the_configuration_and_another_one_is_refused_naming_the_key(tmp_path):
    out = tmp_path / "run"
    folder = _folder(out)
    folder.check()  # a new folder: nothing to refuse, nothing made
    assert not out.exists()
    with folder.claim():
        assert sorted(os.listdir(out)) == [STAMP_FILE, LOCK_FILE]
        holder = json.loads((out / LOCK_FILE).read_text())
        assert holder["pid"] == os.getpid() and holder["command"] == "snapaudit audit" and holder["started"]
    assert os.listdir(out) == [STAMP_FILE]  # a finished run removes its lock file
    stamp = json.loads((out / STAMP_FILE).read_text())
    assert stamp == {"format": 1, "command": "audit", "version": 1, "fingerprint": folder.fingerprint,
                     "config": {"audit": {"trials": 2000, "epsilons": [1.0, 4.0]},
                                "pipelines": {"pv": {"partitions": 3}}}}
    text = json.dumps({"command": "audit", "version": 1, "config": stamp["config"]}, sort_keys=True,
                      separators=(",", ":"))
    assert stamp["fingerprint"] == hashlib.sha256(text.encode()).hexdigest()
    before = _tree(out)
    with _folder(out).claim():  # the same configuration again: resumed, the stamp left as it was
        pass
    assert _tree(out) == before
    for config, message in [
        (_other(), "audit.trials is 2000 there, 3000 here"),
        ({**CONFIG, "pipelines": {"pv": {"partitions": 3}, "poe": {"clip": 5}}},
         'pipelines.poe is not set there, {"clip": 5} here'),
        ({"audit": CONFIG["audit"]}, 'pipelines is {"pv": {"partitions": 3}} there, not set here'),
        ({**CONFIG, "audit": {**CONFIG["audit"], "epsilons": (1.0, 4.0, 8.0)}},
         "audit.epsilons is [1.0, 4.0] there, [1.0, 4.0, 8.0] here"),
    ]:
        with pytest.raises(ConfigFileError, match=re.escape(f"--out {out} holds a run of another configuration: "
                                                            f"{message}; choose another --out folder")):
            _folder(out, config).check()
        with pytest.raises(ConfigFileError, match="another configuration"):
            with _folder(out, config).claim():
                pytest.fail("claimed a folder of another configuration")
    assert _tree(out) == before
    assert first_difference({"a": {"b": 1.0}}, {"a": {"b": 1}}) == ("a.b", "1.0", "1")  # not silently equal
    assert first_difference(stamp["config"], _folder(out).config) is None


def test_unstamped_folders_adopted_only_with_resume_files_and_legacy_stamps(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with _folder(empty).claim():
        pass
    interrupted = tmp_path / "interrupted"  # an earlier version's interrupted run: resume files only
    (interrupted / "snapshots").mkdir(parents=True)
    (interrupted / "llm_cache.jsonl").write_text("")
    with _folder(interrupted).claim():
        pass
    assert json.loads((interrupted / STAMP_FILE).read_text())["fingerprint"] == _folder(interrupted).fingerprint
    finished = tmp_path / "finished"
    (finished / "snapshots").mkdir(parents=True)
    (finished / "results.json").write_text("[]")
    with pytest.raises(InputError, match="holds a finished run without a run stamp"):
        _folder(finished).check()
    (finished / "results.json").unlink()
    (finished / "notes.txt").write_text("mine")
    with pytest.raises(InputError, match="it holds notes.txt, and snapaudit audit adopts an unstamped folder only"):
        _folder(finished).check()
    # pii's stamp of earlier versions: its own fingerprint is this run's (restamped when claimed), another is not
    legacy = {"version": 2, "config": "0123456789abcdef"}
    old = tmp_path / "legacy"
    old.mkdir()
    (old / STAMP_FILE).write_text(json.dumps(legacy))
    with pytest.raises(ConfigFileError, match="written by an earlier version, records only the fingerprint "
                                              "0123456789abcdef; this configuration's is fedcba9876543210"):
        _folder(old, legacy={"version": 2, "config": "fedcba9876543210"}).check()
    mine = _folder(old, legacy=legacy)
    mine.check()
    assert json.loads((old / STAMP_FILE).read_text()) == legacy  # check writes nothing
    with mine.claim():
        pass
    assert json.loads((old / STAMP_FILE).read_text()) == mine.stamp()


def test_two_runs_racing_into_one_folder_the_second_is_refused_under_the_lock(tmp_path):
    """Run A checks an empty folder; before A claims it, run B (another configuration) claims it. While B
    holds the lock, A is refused naming B; after B, A's check under the lock finds B's stamp and refuses."""
    out = tmp_path / "run"
    a, b = _folder(out), _folder(out, _other())
    a.check()
    with b.claim():
        with pytest.raises(InputError, match=re.escape(f"--out {out} is in use by another run: pid {os.getpid()} on ")):
            a.check()
        with pytest.raises(InputError, match="is in use by another run"):
            with a.claim():
                pytest.fail("two runs held one folder")
    with pytest.raises(ConfigFileError, match="audit.trials is 3000 there, 2000 here"):
        with a.claim():
            pytest.fail("claimed a folder another run stamped")
    with _folder(tmp_path / "free").claim():  # power: the same claim of a folder nobody raced for succeeds
        pass


_HOLDER = """
import json, sys
from snapaudit_jax.utils.run_folder import RunFolder

stamp = json.load(open(sys.argv[1] + "/run.json"))
with RunFolder(sys.argv[1], stamp["command"], stamp["config"], version=stamp["version"]).claim():
    print("holding", flush=True)
    sys.stdin.read()  # until killed
"""


@pytest.mark.slow
def test_a_live_holder_refuses_a_second_cpa_run_and_its_death_frees_the_folder(tmp_path, capsys):
    """A process holds a cpa run folder: ``snapaudit cpa`` into it exits 2 naming the holder's pid and changes
    no byte. SIGKILL leaves its lock file behind, but the kernel released the lock: the same command then runs."""
    from conformal.config import load_cpa_config
    from conformal.run import run_folder
    from snapaudit_jax.cli import main

    config = tmp_path / "c.toml"
    config.write_text(CPA_OK)
    out = tmp_path / "run"
    with run_folder(load_cpa_config(config), out).claim():  # stamp it as this configuration's run
        pass
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(out)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert holder.stdout.readline() == "holding\n"
        before = _tree(tmp_path)
        assert main(["cpa", str(config), "--out", str(out), "--quiet"]) == 2
        err = capsys.readouterr().err
        assert f"--out {out} is in use by another run: pid {holder.pid} on " in err and "snapaudit cpa" in err
        assert "Traceback" not in err and _tree(tmp_path) == before
    finally:
        holder.kill()  # SIGKILL: no cleanup runs in the holder
        holder.wait()
    assert (out / LOCK_FILE).exists() and str(holder.pid) in (out / LOCK_FILE).read_text()  # stale, not held
    assert main(["cpa", str(config), "--out", str(out), "--quiet"]) == 0
    assert (out / "summary.json").exists() and not (out / LOCK_FILE).exists()
