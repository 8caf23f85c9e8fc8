"""The secret run key over several processes: process 0 draws (or reads) it and every process trains with it.

Two real ``jax.distributed`` CPU processes (gloo collectives, a loopback coordinator) resolve the key for one
run, each with its own checkpoint folder: both get process 0's key, only process 0's folder holds it, and a
second pair of processes reads the stored key back. Power: resolved without the broadcast, the two processes
draw different keys (their noise would differ, and a data-parallel step would mix two noise streams).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest

from snapaudit_jax.dpsgd.keys import KEY_FILE
from tests.helpers.paths import ROOT

WORKER = ROOT / "tests" / "helpers" / "key_broadcast_worker.py"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _pair(folders, mode):
    port = str(_free_port())
    procs = [subprocess.Popen([sys.executable, str(WORKER), str(i), port, str(folders[i]), mode], cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
    out = []
    try:
        for proc in procs:
            stdout, stderr = proc.communicate(timeout=180)
            assert proc.returncode == 0, stderr[-2000:]
            out.append(json.loads([line for line in stdout.splitlines() if line.startswith("{")][-1]))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return sorted(out, key=lambda r: r["pid"])


@pytest.mark.slow
def test_process_zero_draws_the_secret_key_and_every_process_uses_it(tmp_path):
    folders = [tmp_path / "p0", tmp_path / "p1"]
    first = _pair(folders, "broadcast")
    assert [r["source"] for r in first] == ["secret", "secret"]
    assert first[0]["data"] == first[1]["data"]
    stored = json.loads((folders[0] / KEY_FILE).read_text())["key_data"]
    assert stored == first[0]["data"] and not (folders[1] / KEY_FILE).exists()
    again = _pair(folders, "broadcast")  # a resumed run: the stored key, on every process
    assert again[0]["data"] == again[1]["data"] == first[0]["data"]
    # power: each process resolving on its own draws its own key
    alone = _pair([tmp_path / "q0", tmp_path / "q1"], "local")
    assert alone[0]["data"] != alone[1]["data"]


def test_in_one_process_the_broadcast_returns_the_stored_key(tmp_path):
    """``processes=True`` in a single process: process 0 is this one, and the key it sends itself is the stored one."""
    from snapaudit_jax.dpsgd.keys import resolve_run_key

    key, source = resolve_run_key(None, None, tmp_path, processes=True)
    stored = json.loads((tmp_path / KEY_FILE).read_text())["key_data"]
    import jax

    assert source == "secret" and [int(x) for x in jax.random.key_data(key)] == stored
