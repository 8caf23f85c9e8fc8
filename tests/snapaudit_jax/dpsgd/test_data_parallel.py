"""Data-parallel DP-SGD (``train(..., mesh=...)``) against the single-device step.

Oracles: the single-device run (``mesh=None``) of the same model, data, configuration and key, in the same
process; :func:`~snapaudit_jax.dpsgd.poisson_batch` for the batch sizes; the chi-square distribution (scipy) for
the noise; an uninterrupted 8-device run for the kill -9 resume. 8 XLA host devices need ``XLA_FLAGS`` before JAX
is imported, so the runs live in subprocesses (``tests/helpers/dp_parallel_worker.py``), started once for the
module: the killed run and the parity run side by side, then the resume. They share a compilation cache in a
temporary folder, so the 8-device GPT-2 step is compiled once for the three processes.

Measured (8 host devices, 5 steps): parameters within 2.4e-7 (GPT-2, all parameters, SGD with momentum, moved by up
to 2.5) and 4.5e-8 (Llama LoRA adapters on user units, Adam) of the single-device run, from the float32 order of
the partial sums: at most 5% of the tested ``atol + rtol |x|`` with ``rtol=1e-5, atol=1e-6``, while training moves
them by more than 0.1. The noise-only step is bitwise the single-device one.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx
from jax.sharding import Mesh
from scipy import stats

from snapaudit_jax.dpsgd import DPSGDConfig, train
from snapaudit_jax.models.config import GPT2Config
from snapaudit_jax.models.decoders import GPT2
from snapaudit_jax.utils.errors import InputError

from tests.helpers.paths import ROOT

WORKER = str(ROOT / "tests" / "helpers" / "dp_parallel_worker.py")
RTOL, ATOL = 1e-5, 1e-6  # parameters, 8 devices vs 1 (measured: <= 5% of atol + rtol |x|)
ALPHA = 1e-6  # false-failure probability of each statistical check
KILL_AT = 4  # the killed run dies once step 4 is done, before its checkpoint: steps 2 and 3 are on disk


def _env(cache: Path) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    # PYTHONPATH: this tree, not an installed copy; the worker adds its device count to the suite's XLA_FLAGS
    env.update(
        JAX_COMPILATION_CACHE_DIR=str(cache),
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
        JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
    )
    return env


def _start(env, *args) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, WORKER, *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def _result(proc: subprocess.Popen, timeout: float = 400) -> dict:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-3000:]
    return json.loads([line for line in out.splitlines() if line.startswith("{")][-1])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The three workers' results: parity (JSON and arrays), the killed run, and the resume."""
    tmp = tmp_path_factory.mktemp("dp_parallel")
    env = _env(tmp / "xla_cache")
    checkpoints = tmp / "ckpt"
    killed = _start(env, "killed", checkpoints, KILL_AT)
    parity = _start(env, "parity", tmp / "parity.npz")
    started = [killed, parity]
    try:
        _, killed_err = killed.communicate(timeout=400)
        on_disk = sorted(os.listdir(checkpoints))
        resume = _start(env, "resume", checkpoints, tmp / "resume.npz")
        started.append(resume)
        resumed = _result(resume)
        parity_out = _result(parity)
    finally:
        for proc in started:  # only on a failure or timeout: the workers this fixture started
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return {
        "parity": parity_out,
        "arrays": dict(np.load(tmp / "parity.npz")),
        "killed_rc": killed.returncode,
        "killed_err": killed_err,
        "on_disk_after_kill": on_disk,
        "resume": resumed,
        "resumed": dict(np.load(tmp / "resume.npz")),
        "on_disk_after_resume": sorted(os.listdir(checkpoints)),
    }


@pytest.mark.slow
def test_eight_devices_give_the_single_device_batches_and_parameters(runs):
    """GPT-2 on (N, L) records (N = 29, padded to 32 units) and Llama LoRA on (N, k, L) user units (N = 23, padded
    to 24): the same batch sizes exactly (also equal to poisson_batch's), the same report, parameters within
    rtol=1e-5, atol=1e-6 of the single-device run while training moved them by > 0.1 (power: a wrong batch or a
    dropped device's units would move them by that order), LoRA base parameters bitwise untouched. The 8-device
    step is traced, lowered and compiled once per run (its outputs keep the inputs' shardings)."""
    a, out = runs["arrays"], runs["parity"]
    assert out["devices"] == 8
    np.testing.assert_array_equal(a["gpt2_single_batch"], a["gpt2_oracle_batch"])
    for kind in ("gpt2", "lora"):
        np.testing.assert_array_equal(a[f"{kind}_mesh_batch"], a[f"{kind}_single_batch"])
        assert len(set(a[f"{kind}_single_batch"].tolist())) > 1  # batch sizes varied: the masks are compared
        np.testing.assert_allclose(a[f"{kind}_mesh"], a[f"{kind}_single"], rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(a[f"{kind}_mesh_loss"], a[f"{kind}_single_loss"], rtol=RTOL)
        assert np.abs(a[f"{kind}_single"] - a[f"{kind}_init"]).max() > 0.1
    np.testing.assert_allclose(a["gpt2_mesh_clipped"], a["gpt2_single_clipped"])
    assert 0 < np.nanmean(a["gpt2_single_clipped"]) < 1  # clipping was active for some records, not all
    np.testing.assert_array_equal(a["lora_single_base"], a["lora_init_base"])
    np.testing.assert_array_equal(a["lora_mesh_base"], a["lora_init_base"])
    assert out["gpt2_mesh_report"] == out["gpt2_single_report"]
    assert out["gpt2_mesh_events"] == {"trace": 1, "lower": 1, "compile": 1}


def _chi2_accepts(stat: float, dof: int) -> bool:
    return stats.chi2.ppf(ALPHA / 2, dof) <= stat <= stats.chi2.isf(ALPHA / 2, dof)


@pytest.mark.slow
def test_one_noise_draw_on_the_summed_gradient(runs):
    """Noise only (C = 1e-20, sigma C = 0.1, SGD at learning rate 1, one step): the update is -noise / (q N).

    On a user-built 8-device mesh (Explicit axes, rebuilt as Auto) it is the single-device update to float32
    rounding (one unit in the last place of the parameter it moves): one draw, from the single-device key. Noise
    drawn on every device and summed would be sqrt(8) times larger (independent draws) or 8 times (the same draw);
    the chi-square check of sum(d^2) / tau^2 ~ chi2_D, tau = sigma C / (q N), D > 3000 parameters, accepts tau at
    ALPHA = 1e-6 (two-sided) and must reject both (power); with the |z| < 5 zero-mean check (5.7e-7) false failure <
    2e-6. The noise runs reuse the GPT-2 runs' compiled steps (no trace, lowering or compilation)."""
    a, out = runs["arrays"], runs["parity"]
    single, mesh = a["noise_single"], a["noise_mesh"]
    assert out["noise_mesh_batch"] == out["noise_single_batch"] > 0
    # float32 rounding apart: the update (its division by q N compiles as the programs compile it, on one device
    # and on eight) is rounded into the parameter, so an element may differ by one unit in the last place of the
    # parameter (2.98e-8 at 0.25 to 0.5 without XLA's expensive CPU passes) beside the update's own rounding
    init = a["gpt2_init"]
    assert init.dtype == mesh.dtype == np.float32
    ulp = np.spacing(np.abs(init) + np.abs(single))
    np.testing.assert_array_less(np.abs(mesh - single), 1e-6 * np.abs(single) + ulp)
    noise = out["noise_config"]
    assert noise["noise_multiplier"] * noise["clip_norm"] == pytest.approx(0.1)
    tau = noise["noise_multiplier"] * noise["clip_norm"] / (noise["sampling_rate"] * noise["num_records"])
    dof = mesh.size
    assert dof > 3000
    assert _chi2_accepts(float(np.sum(mesh.astype(np.float64) ** 2) / tau**2), dof)
    assert abs(mesh.mean()) * math.sqrt(dof) / tau < 5.0
    for wrong in (math.sqrt(8) * tau, 8 * tau):  # power: per-device noise
        assert not _chi2_accepts(float(np.sum(mesh.astype(np.float64) ** 2) / wrong**2), dof)
    for name in ("noise_single_events", "noise_mesh_events"):
        assert out[name] == {"trace": 0, "lower": 0, "compile": 0}, name


@pytest.mark.slow
def test_kill_9_and_resume_on_eight_devices_is_bit_for_bit(runs):
    """A run on 8 devices with a checkpoint every step, SIGKILLed after step 4 (checkpoints 2 and 3 on disk),
    resumed in a new process from a model with other weights: the parameters and history are bitwise those of
    the uninterrupted 8-device run. Resuming with no mesh or 4 devices is refused (the device count, which sets
    the summation order, is part of the run's identity)."""
    assert runs["killed_rc"] == -signal.SIGKILL, runs["killed_err"][-3000:]
    assert runs["on_disk_after_kill"] == ["step_00000002", "step_00000003"]
    resume, resumed, a = runs["resume"], runs["resumed"], runs["arrays"]
    for mesh in ("None", "4"):
        assert resume["refused"][mesh] is not None and "data_parallel_devices differs" in resume["refused"][mesh]
    assert resume["resumed_steps"] == [4, 5]
    assert np.array_equal(resumed["params"], a["gpt2_mesh"])
    np.testing.assert_array_equal(resumed["batch"], a["gpt2_mesh_batch"])
    np.testing.assert_array_equal(resumed["loss"], a["gpt2_mesh_loss"])
    assert resume["report"] == runs["parity"]["gpt2_mesh_report"]
    assert runs["on_disk_after_resume"] == ["step_00000004", "step_00000005"]


def test_bad_mesh_names_mesh_rule_and_value():
    """Device counts outside [1, local devices], non-integers, and meshes that are not 1-D are refused before any
    work, with the field, the rule and the value."""
    model = GPT2(GPT2Config(vocab_size=13, n_positions=8, n_embd=8, n_layer=1, n_head=2, n_inner=8),
                 rngs=nnx.Rngs(0))
    data = (np.ones((5, 4), np.int32), np.ones((5, 4), bool))
    config = DPSGDConfig(steps=1, learning_rate=0.1, clip_norm=1.0, noise_multiplier=1.0, sampling_rate=0.5,
                         delta=1e-5)
    local = len(jax.local_devices())
    two_d = Mesh(np.asarray(jax.local_devices()[:1]).reshape(1, 1), ("data", "model"))
    cases = [
        (0, r"mesh must be a number of local devices in \[1, \d+\], got 0"),
        (-2, r"got -2"),
        (local + 1, rf"in \[1, {local}\], got {local + 1}"),
        (np.int64(local + 1), rf"got np.int64\({local + 1}\)"),
        (True, r"mesh must be None, a number of local devices or a 1-D jax.sharding.Mesh, got bool True"),
        (1.5, r"got float 1.5"),
        ("8", r"got str '8'"),
        (two_d, r"mesh must be 1-D \(one data axis\), got axes \('data', 'model'\) of shape \(1, 1\)"),
    ]
    for mesh, match in cases:
        with pytest.raises(InputError, match=match):
            train(model, data, config, key=jax.random.key(0), mesh=mesh)
