"""Every write failure of every command is a clean error: exit 2, the errno's text and the file, nothing partial.

The operating system reports a full disk (ENOSPC), a quota (EDQUOT), a file size limit (EFBIG) or an I/O error
(EIO) when the data reaches the device, at ``write`` or at the latest at ``fsync``, and without a file name; a
read-only file system (EROFS) or a revoked permission (EACCES) refuses the file itself. The injector below makes
the ``at``-th ``fsync`` of a regular file under the run's folder fail with such an errno (or removes the whole
folder first: a folder that vanishes mid-run), which every writer of the project goes through (result JSON and
text, snapshots, checkpoints and their safetensors, exports, answer caches, the run key). Each command must
then print ``snapaudit <command>: error: [Errno N] <strerror>: '<file>'`` with a file inside the folder, print no
traceback, leave no temporary file (visible or hidden) behind, and finish when rerun without the fault.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import stat
from pathlib import Path

import pytest

from snapaudit_jax.cli import main

_CLASSES = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO, errno.EROFS, errno.EACCES)


@contextlib.contextmanager
def failing_fsync(root: Path, at: int, code: int | None):
    """The ``at``-th fsync of a regular file under ``root`` raises ``OSError(code)`` without a file name, as the
    kernel reports it; ``code=None`` removes ``root`` instead and lets the fsync succeed (the folder vanished).

    Yields:
      A dict whose ``"fired"`` says whether the fault happened, and ``"count"`` how many fsyncs were seen.
    """
    real = os.fsync
    state = {"count": 0, "fired": False}
    prefix = str(root) + os.sep

    def fsync(fd):
        if stat.S_ISREG(os.fstat(fd).st_mode) and os.readlink(f"/proc/self/fd/{fd}").startswith(prefix):
            state["count"] += 1
            if state["count"] == at:
                state["fired"] = True
                if code is None:
                    shutil.rmtree(root)
                else:
                    raise OSError(code, os.strerror(code))
        return real(fd)

    os.fsync = fsync
    try:
        yield state
    finally:
        os.fsync = real


def _leftovers(root: Path) -> list[str]:
    """Temporary files and folders (``.tmp-*``, ``.<name>.tmp-*``, ``.probe-*``, ``.<name>.old-*``) under
    ``root``."""
    if not root.exists():
        return []
    return [str(p) for p in root.rglob("*") if p.name.startswith((".tmp-", ".probe-")) or ".tmp-" in p.name
            or ".old-" in p.name]


def _clean_error(capsys, command: str, code: int | None, root: Path) -> str:
    """The one error line, checked: the command, the errno and its text, a file under ``root``, no traceback."""
    err = capsys.readouterr().err
    assert "Traceback" not in err and "internal error" not in err, err[-3000:]
    last = err.strip().splitlines()[-1]
    number = errno.ENOENT if code is None else code
    assert last.startswith(f"snapaudit {command}: error: [Errno {number}] {os.strerror(number)}: '{root}{os.sep}"), last
    return last


def _simulate(out: Path) -> list[str]:
    return ["simulate", "--mechanism", "pv", "--trials", "2000", "--epsilon", "1,4", "--quiet", "--out", str(out)]


@pytest.mark.parametrize("code", [*_CLASSES, None], ids=[*(errno.errorcode[c] for c in _CLASSES), "vanished"])
def test_simulate_write_failures_are_clean_errors(tmp_path, capsys, code):
    folder = tmp_path / "results"
    folder.mkdir()
    out = folder / "sim.json"
    with failing_fsync(folder, 1, code) as fault:
        assert main(_simulate(out)) == 2
    assert fault["fired"]
    line = _clean_error(capsys, "simulate", code, folder)
    assert line.endswith(f"'{out}'")  # the file itself, not only its temporary sibling
    assert not out.exists() and _leftovers(folder) == []
    assert main(_simulate(out)) == 0
    assert [r["epsilon_theory"] for r in json.loads(out.read_text())] == [1.0, 4.0]


def test_the_injector_fails_writes_outside_the_project_too(tmp_path):
    """Power check of the injector: a plain file's fsync under the folder fails with the errno and no name, one
    outside it does not."""
    (tmp_path / "in").mkdir()
    with failing_fsync(tmp_path / "in", 1, errno.ENOSPC) as fault:
        with open(tmp_path / "out.txt", "w") as fh:
            fh.write("x")
            os.fsync(fh.fileno())
        with open(tmp_path / "in" / "f.txt", "w") as fh, pytest.raises(OSError) as err:
            fh.write("x")
            os.fsync(fh.fileno())
    assert fault == {"count": 1, "fired": True}
    assert err.value.errno == errno.ENOSPC and err.value.filename is None


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """Tiny configurations of the config commands: an audit of a tiny Llama folder, a synthetic CPA run and a
    LoRA fine-tuning run of 30 users' notes."""
    from snapaudit_jax.dpicl.data import load_examples
    from tests.helpers.bad_input.common import CPA_OK
    from tests.helpers.tiny_llm import make_tiny_llm_folder
    from tests.snapaudit_jax.finetune.test_finetune import _lean, _notes

    root = tmp_path_factory.mktemp("write_failures")
    llm = make_tiny_llm_folder(str(root / "tiny"), [e.text for e in load_examples("agnews")])
    (root / "audit.toml").write_text(
        f'[model]\nllm = "{llm}"\n\n[audit]\nepsilons = [2, 8]\nsnapshots = 6\ntrials = 20000\npassive_runs = 6\n'
        'verify = 2\n\n[pipelines.pv]\nnum_exemplars = 6\npartitions = 3\n')
    (root / "cpa.toml").write_text(CPA_OK)
    rows = _notes()
    model = make_tiny_llm_folder(str(root / "model"), [r["text"] for r in rows], vocab_size=300)
    data = root / "notes.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return {"audit": str(root / "audit.toml"), "cpa": str(root / "cpa.toml"),
            "finetune": _lean(root, model, str(data))}


# (command, the failing fsync, errno or None for a vanished folder, a file only a finished run has); the audit
# writes 11 files (the 5th a snapshot, the 9th the results), cpa 16 (the 8th a document cache, the 16th a plot)
# and finetune 16 (the 3rd the first checkpoint's meta.json, then evaluations, export, report)
_CASES = [("audit", 5, errno.ENOSPC, "results.json"), ("audit", 9, None, "results.json"),
          ("cpa", 8, errno.EACCES, "summary.json"), ("cpa", 16, errno.EDQUOT, "set_sizes_r.png"),
          ("finetune", 3, errno.EIO, "report.json")]


@pytest.mark.slow
@pytest.mark.parametrize("command, at, code, last", _CASES,
                         ids=[f"{c}-{a}-{errno.errorcode[e] if e else 'vanished'}" for c, a, e, _ in _CASES])
def test_config_command_write_failures_are_clean_errors_and_the_rerun_finishes(inputs, tmp_path, capsys,
                                                                                command, at, code, last):
    out = tmp_path / "run"
    argv = [command, inputs[command], "--out", str(out), "--quiet"]
    with failing_fsync(out, at, code) as fault:
        assert main(argv) == 2
    assert fault["fired"]
    failed = _clean_error(capsys, command, code, out).rsplit("'", 2)[-2]  # the file (a rename's target)
    assert not os.path.exists(failed) and _leftovers(out) == [] and not (out / last).exists()
    assert main(argv) == 0
    assert (out / last).is_file() and _leftovers(out) == []
