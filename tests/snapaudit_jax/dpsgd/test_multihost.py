"""Multi-process DP-SGD (``jax.distributed``, ``train(..., mesh=...)`` over every process's devices).

Oracles: the same run on 4 devices of one process and on one device (``mesh=None``); the uninterrupted
2-process run for the resume. Two CPU processes with 2 XLA host devices each (4 global devices) join through a
coordinator on 127.0.0.1 and all-reduce with gloo (``jax_cpu_collectives_implementation``), as in
``tests/snapaudit_jax/simulation/test_trials.py``; the runs live in subprocesses
(``tests/helpers/dp_multihost_worker.py``) since the device count and ``jax.distributed`` are set before JAX starts.

Measured (tiny GPT-2, 29 records, 5 steps, SGD with momentum): the 2-process parameters are bitwise equal on both
processes, bitwise equal to the 2-process run stopped after step 3 and resumed, and within 2.4e-7 (<= 6% of
``atol + rtol |x|``, rtol=1e-5, atol=1e-6) of both the one-process 4-device and the one-device run. They are not
bitwise the one-process 4-device parameters (770 of 3488 differ): gloo adds the partial sums across processes in
another order, so the process count is part of a checkpoint's identity.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

from tests.helpers.paths import ROOT

WORKER = str(ROOT / "tests" / "helpers" / "dp_multihost_worker.py")
RTOL, ATOL = 1e-5, 1e-6  # as tests/snapaudit_jax/dpsgd/test_data_parallel.py


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _json(out: str) -> dict:
    return json.loads([line for line in out.splitlines() if line.startswith("{")][-1])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Both processes' results and arrays, and the one-process worker's, run side by side."""
    tmp = tmp_path_factory.mktemp("dp_multihost")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    # PYTHONPATH: this tree, not an installed copy; the worker adds its device count to the suite's XLA_FLAGS
    coordinator = f"127.0.0.1:{_free_port()}"
    pipes = dict(stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    multi = [subprocess.Popen([sys.executable, WORKER, "multi", str(tmp), coordinator, str(pid)], **pipes)
             for pid in range(2)]
    single = subprocess.Popen([sys.executable, WORKER, "single", str(tmp)], stdin=subprocess.PIPE, **pipes)
    try:
        outs = [p.communicate(timeout=400) for p in multi]
        for p, (_, err) in zip(multi, outs):
            assert p.returncode == 0, err[-3000:]
        single_out, single_err = single.communicate(input="\n", timeout=400)  # the checkpoint copy is complete
        assert single.returncode == 0, single_err[-3000:]
    finally:
        for proc in (*multi, single):  # only on a failure or timeout: the workers this fixture started
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return {
        "multi": [_json(out) for out, _ in outs],
        "multi_arrays": [dict(np.load(tmp / f"multi_{pid}.npz")) for pid in range(2)],
        "single": _json(single_out),
        "single_arrays": dict(np.load(tmp / "single.npz")),
    }


@pytest.mark.slow
def test_two_processes_give_the_one_process_batches_and_parameters(runs):
    """2 processes x 2 devices, mesh=4: mesh=2 (process 0's devices only) and a key that differs between the
    processes are refused on both; 4 global
    devices, the same parameters on both processes (bitwise), each
    process's returned model on its own devices only; the batch sizes of the one-device run exactly, the same
    report, and parameters within rtol=1e-5, atol=1e-6 of the one-process 4-device and one-device runs while
    training moved them by > 0.1 (power: a dropped process's units or a second noise draw would move them by
    that order)."""
    (m0, m1), (a0, a1) = runs["multi"], runs["multi_arrays"]
    s, sa = runs["single"], runs["single_arrays"]
    assert [m0["process"], m1["process"]] == [0, 1]
    for m in (m0, m1):
        assert (m["processes"], m["devices"], m["local_devices"]) == (2, 4, 2)
        assert m["uninterrupted_local"] and m["resumed_local"]
    assert (s["processes"], s["devices"]) == (1, 4)
    for m in (m0, m1):  # a key that differs between the processes: refused on both, before any step
        assert m["other_key_refused"] is not None and "processes [1] that differ" in m["other_key_refused"]
        assert "leave processes [1] without one), got 2" in (m["mesh_2_refused"] or "")
    for name in a0:
        assert np.array_equal(a0[name], a1[name]), name
    np.testing.assert_array_equal(a0["batch"], sa["one_device_batch"])
    np.testing.assert_array_equal(a0["batch"], sa["four_devices_batch"])
    assert len(set(a0["batch"].tolist())) > 1
    assert m0["report"] == m1["report"]
    for name in ("four_devices", "one_device"):
        np.testing.assert_allclose(a0["uninterrupted"], sa[name], rtol=RTOL, atol=ATOL, err_msg=name)
    assert np.abs(sa["one_device"] - sa["init"]).max() > 0.1


@pytest.mark.slow
def test_process_zero_writes_the_checkpoints_and_resume_is_bit_for_bit(runs):
    """Checkpoint every step, stopped after step 3: process 0 called save_checkpoint 3 times, process 1 never,
    and both see steps 2 and 3 on disk when train returns (the barrier after each save). Resumed by both
    processes from a model with other weights: steps 4 and 5 run, parameters, batches and report bitwise those
    of the uninterrupted 2-process run. The one-process 4-device run refuses that checkpoint, naming the process
    count (another summation order)."""
    (m0, m1), (a0, _) = runs["multi"], runs["multi_arrays"]
    assert (m0["saves_first"], m1["saves_first"]) == (3, 0)
    assert (m0["saves_resume"], m1["saves_resume"]) == (2, 0)
    for m in (m0, m1):
        assert m["on_disk_after_stop"] == ["step_00000002", "step_00000003"]
        assert m["on_disk_after_resume"] == ["step_00000004", "step_00000005"]
        assert m["resumed_steps"] == [4, 5]
        assert m["resumed_report"] == m0["report"]
    assert np.array_equal(a0["resumed"], a0["uninterrupted"])
    np.testing.assert_array_equal(a0["resumed_batch"], a0["batch"])
    refused = runs["single"]["refused"]
    assert refused is not None and "data_parallel_processes differs" in refused, refused
