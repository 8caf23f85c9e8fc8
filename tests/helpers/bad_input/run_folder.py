"""Bad-input cases: run folders owned by another configuration or run (see :mod:`tests.helpers.bad_input`).

Each folder is stamped by the command's own :func:`run_folder` (the stamp a real run writes) and, where the case
says finished, holds the files of a finished run: results, report, plots, answer cache, snapshots. A locked
folder is held by this process for the case's duration (another open file, so the run's ``flock`` conflicts
with it as with any other process). Every case must exit 2 before any work and leave every byte as it was.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable
from pathlib import Path

from tests.helpers.bad_input.common import AUDIT_OK, CPA_OK, HASH, NO_LLM, PII_OK, Case, _snapshot_pair, _write

_FINISHED = {  # the files of a finished run, by command (beside its stamp)
    "audit": {"results.json": "[]\n", "results_full.json": '{"summary": {}, "results": []}\n',
              "table.md": "# audit\n", "pv.png": b"\x89PNG\r\n\x1a\n",
              "llm_cache.jsonl": f'{{"k": "{HASH}", "v": 1}}\n'},
    "cpa": {"summary.json": "[]\n", "report.md": "# cpa\n", "validity_checks.json": "[]\n", "config.json": "{}\n",
            "documents/r/s.jsonl": "{}\n"},
    "pii": {"results.json": "{}\n", "results_full.json": "{}\n", "table.md": "# pii\n", "config.json": "{}\n",
            "variants/undefended.json": json.dumps({"row": {}}), "checkpoints/baseline/step_1.npz": b"PK\x05\x06"},
}
_HOLDER = f"pid {os.getpid()} on "  # the cases run in this process, which holds their locks


def _audit(trials: int) -> str:
    return NO_LLM + f"[audit]\ntrials = {trials}\n[pipelines.pv]\n"


def _folder(command: str, toml: str, out: Path):
    """The command's :class:`~snapaudit_jax.utils.run_folder.RunFolder` of ``toml``'s configuration at ``out``."""
    if command == "audit":
        from snapaudit_jax.dpicl.config import load_config as load
        from snapaudit_jax.dpicl.run import run_folder
    elif command == "cpa":
        from conformal.config import load_cpa_config as load
        from conformal.run import run_folder
    else:
        from attacks.config import load_pii_config as load
        from attacks.run import run_folder
    path = _write(out.parent / "stamp.toml", toml)
    config = load(path)
    os.unlink(path)
    return run_folder(config, out)


def _finished(tmp: Path, command: str, toml: str, *, stamp: bool = True, files: dict | None = None) -> Path:
    """A finished run folder of ``toml`` at ``tmp/run``: its stamp (unless ``stamp=False``), its result files,
    then ``files`` (``{name: content}``)."""
    out = tmp / "run"
    if stamp:
        with _folder(command, toml, out).claim():
            pass
    for name, content in {**_FINISHED[command], **(files or {})}.items():
        _write(out / name, content)
    if command == "audit":
        _snapshot_pair(out)
    return out


def _files(tmp: Path, files: dict) -> Path:
    """A folder ``tmp/run`` holding ``files`` only (``{name: content}``), no stamp."""
    for name, content in files.items():
        _write(tmp / "run" / name, content)
    return tmp / "run"


def _into(command: str, toml: str, out: Callable[[Path], Path], with_stack: bool = False):
    """``snapaudit COMMAND c.toml --out <out(tmp)>`` (``out(tmp, stack)`` when ``with_stack``)."""
    def build(tmp: Path, stack: contextlib.ExitStack | None = None) -> list[str]:
        folder = out(tmp, stack) if with_stack else out(tmp)
        return [command, _write(tmp / "c.toml", toml), "--quiet", "--out", str(folder)]

    return build


def _locked(command: str, toml: str):
    """A finished run folder of ``toml`` itself, held (locked) by this process for the case's duration."""
    def out(tmp: Path, stack: contextlib.ExitStack) -> Path:
        folder = _finished(tmp, command, toml)
        stack.enter_context(_folder(command, toml, folder).claim())
        return folder

    return out


def _edited_stamp(tmp: Path) -> Path:
    """A finished audit whose stamp's configuration was edited by hand (its fingerprint no longer matches)."""
    out = _finished(tmp, "audit", _audit(2000))
    stamp = json.loads((out / "run.json").read_text())
    stamp["config"]["audit"]["trials"] = 3000
    (out / "run.json").write_text(json.dumps(stamp))
    return out


def _other_version(tmp: Path) -> Path:
    """A finished cpa run stamped by a version whose resume files are of version 0."""
    import dataclasses

    from snapaudit_jax.utils.io import write_json

    out = _finished(tmp, "cpa", CPA_OK)
    write_json(out / "run.json", dataclasses.replace(_folder("cpa", CPA_OK, out), version=0).stamp())
    return out


def _newer_format(tmp: Path) -> Path:
    out = _finished(tmp, "cpa", CPA_OK)
    stamp = json.loads((out / "run.json").read_text())
    (out / "run.json").write_text(json.dumps({**stamp, "format": 2}))
    return out


CASES: list[Case] = [
    # Another configuration into a finished folder: refused naming the first differing key, both values.
    Case("audit-finished-folder-of-another-configuration",
         _into("audit", _audit(3000), lambda t: _finished(t, "audit", _audit(2000))),
         ("--out", "holds a run of another configuration", "audit.trials is 2000 there, 3000 here",
          "choose another --out folder")),
    Case("cpa-finished-folder-of-another-configuration",
         _into("cpa", CPA_OK, lambda t: _finished(t, "cpa", CPA_OK.replace("n_cal = 10", "n_cal = 12"))),
         ("--out", "holds a run of another configuration", "run.n_cal is 12 there, 10 here",
          "choose another --out folder")),
    Case("pii-finished-folder-of-another-configuration",
         _into("pii", PII_OK, lambda t: _finished(t, "pii", PII_OK.replace("seed = 1", "seed = 2"))),
         ("--out", "holds a run of another configuration", "run.seed is 2 there, 1 here",
          "choose another --out folder")),
    Case("audit-finished-folder-of-another-pipeline",
         _into("audit", AUDIT_OK, lambda t: _finished(t, "audit", AUDIT_OK.replace("pv", "poe"))),
         ("--out", "holds a run of another configuration", "pipelines.pv is not set there", "here")),
    # A folder another live run holds: refused naming the holder.
    Case("audit-folder-locked", _into("audit", AUDIT_OK, _locked("audit", AUDIT_OK), with_stack=True),
         ("--out", "is in use by another run", _HOLDER, "snapaudit audit", "run.lock", "wait for it"),
         with_stack=True),
    Case("cpa-folder-locked", _into("cpa", CPA_OK, _locked("cpa", CPA_OK), with_stack=True),
         ("--out", "is in use by another run", _HOLDER, "snapaudit cpa", "run.lock"), with_stack=True),
    Case("pii-folder-locked", _into("pii", PII_OK, _locked("pii", PII_OK), with_stack=True),
         ("--out", "is in use by another run", _HOLDER, "snapaudit pii", "run.lock"), with_stack=True),
    # Corrupted or foreign stamps.
    Case("audit-run-stamp-not-json",
         _into("audit", AUDIT_OK,
               lambda t: _finished(t, "audit", AUDIT_OK, stamp=False, files={"run.json": '{"format": 1, "comm'})),
         ("--out", "run.json is not a readable run stamp", "Unterminated string", "choose another --out folder")),
    Case("audit-run-stamp-not-a-stamp",
         _into("audit", AUDIT_OK, lambda t: _finished(t, "audit", AUDIT_OK, stamp=False, files={"run.json": "[1, 2]"})),
         ("--out", "run.json is not a run stamp", "format, command, version, fingerprint, config", "[1, 2]")),
    Case("audit-run-stamp-edited", _into("audit", _audit(3000), _edited_stamp),
         ("--out", "run.json is corrupted or was edited", "does not match the configuration it records")),
    Case("audit-run-stamp-of-cpa", _into("audit", AUDIT_OK, lambda t: _finished(t, "cpa", CPA_OK)),
         ("--out", "holds a run of snapaudit cpa, not of snapaudit audit", "choose another --out folder")),
    Case("cpa-run-stamp-other-version", _into("cpa", CPA_OK, _other_version),
         ("--out", "resume files are of version 0", "reads version 1")),
    Case("cpa-run-stamp-newer-format", _into("cpa", CPA_OK, _newer_format),
         ("--out", "run.json has format 2", "reads format 1")),
    # Unstamped folders: a finished run of an earlier version, files of no run.
    Case("audit-unstamped-finished-run",
         _into("audit", AUDIT_OK, lambda t: _finished(t, "audit", AUDIT_OK, stamp=False)),
         ("--out", "holds a finished run without a run stamp (run.json)", "results.json, results_full.json",
          "llm_cache.jsonl, snapshots", "can be moved into a new one")),
    Case("cpa-unstamped-finished-run", _into("cpa", CPA_OK, lambda t: _finished(t, "cpa", CPA_OK, stamp=False)),
         ("--out", "holds a finished run without a run stamp", "config.json, report.md, summary.json")),
    Case("cpa-unstamped-foreign-files",
         _into("cpa", CPA_OK, lambda t: _files(t, {"notes.txt": "my notes"})),
         ("--out", "is not empty and holds no run stamp", "notes.txt", "llm_cache.jsonl",
          "choose an empty or new --out folder")),
    Case("pii-unstamped-checkpoints",
         _into("pii", PII_OK, lambda t: _files(t, {"checkpoints/dp/step_2.npz": b"PK"})),
         ("--out", "holds no run stamp", "checkpoints", "adopts an unstamped folder only if it holds no file")),
]
