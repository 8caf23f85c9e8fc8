"""Carrying a file larger than one device call in parts (benchmarks/gpu/stage.py), and run.sh's one-run mode."""

import hashlib
import importlib.util
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.helpers.paths import ROOT

GPU = os.path.join(str(ROOT), "benchmarks", "gpu")
_spec = importlib.util.spec_from_file_location("gpu_stage", os.path.join(GPU, "stage.py"))
stage = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(stage)


def _pinned(tmp_path, size=2500, seed=0):
    data = np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()
    source = tmp_path / "model.whl"
    source.write_bytes(data)
    return str(source), stage.Staged("model.whl", "model==1", size, hashlib.sha256(data).hexdigest()), data


def test_parts_carried_by_separate_calls_reassemble_to_the_pinned_file(tmp_path):
    """Three parts of 1000 bytes: the first call holds part 0 and reports the file incomplete, the second brings
    the rest and gets the file, byte for byte, its parts then dropped; a later call finds it held."""
    source, pinned, data = _pinned(tmp_path)
    parts = stage.split(source, pinned, str(tmp_path / "stage"), part_bytes=1000)
    assert [os.path.getsize(p) for p in parts] == [1000, 1000, 500]
    assert [os.path.basename(os.path.dirname(p)) for p in parts] == ["a", "b", "c"]
    first, second, hold = tmp_path / "call1", tmp_path / "call2", str(tmp_path / "hold")
    (first / "a").mkdir(parents=True)
    os.replace(parts[0], first / "a" / os.path.basename(parts[0]))
    assert stage.receive(pinned, str(first), hold, part_bytes=1000) is None
    assert sorted(os.listdir(hold)) == ["model.whl.part0"]
    for k in (1, 2):
        (second / "abc"[k]).mkdir(parents=True)
        os.replace(parts[k], second / "abc"[k] / os.path.basename(parts[k]))
    whole = stage.receive(pinned, str(second), hold, part_bytes=1000)
    assert open(whole, "rb").read() == data and os.listdir(hold) == ["model.whl"]
    assert stage.receive(pinned, str(tmp_path / "nothing"), hold, part_bytes=1000) == whole


def test_a_corrupted_part_or_another_file_is_refused(tmp_path):
    """A flipped byte in a carried part fails the SHA-256 check: nothing is written and the held parts are
    dropped (carry them again), as is a whole file an earlier call left and that no longer matches; a source that
    is not the pinned file is not split."""
    source, pinned, data = _pinned(tmp_path)
    parts = stage.split(source, pinned, str(tmp_path / "stage"), part_bytes=1000)
    with open(parts[1], "r+b") as f:
        f.seek(10)
        f.write(bytes([data[1010] ^ 1]))
    hold = str(tmp_path / "hold")
    with pytest.raises(stage.StageError, match="SHA-256 [0-9a-f]{64}, the pinned model.whl has " + pinned.sha256):
        stage.receive(pinned, str(tmp_path / "stage"), hold, part_bytes=1000)
    assert os.listdir(hold) == []
    with open(os.path.join(hold, "model.whl"), "wb") as f:  # an earlier call's file, damaged since
        f.write(data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(stage.StageError, match="SHA-256"):
        stage.receive(pinned, str(tmp_path / "nothing"), hold, part_bytes=1000)
    assert os.listdir(hold) == []
    other = stage.Staged("model.whl", "model==1", 2501, pinned.sha256)
    with pytest.raises(stage.StageError, match="2500 bytes, the pinned model.whl has 2501"):
        stage.split(source, other, str(tmp_path / "stage2"), part_bytes=1000)
    assert not (tmp_path / "stage2").exists()


def test_the_smollm2_wheel_travels_in_two_calls_within_their_limit():
    """The pinned wheel's parts: two, each with room beside the working tree and the wheels in 64 MiB."""
    names = stage.part_names(stage.SMOLLM2)
    assert names == [f"{stage.SMOLLM2.name}.part0", f"{stage.SMOLLM2.name}.part1"]
    assert stage.PART_BYTES <= 48 * 2**20 and stage.SMOLLM2.size - stage.PART_BYTES <= stage.PART_BYTES


@pytest.mark.slow
def test_run_sh_one_run_mode_checks_its_arguments_and_smokes_a_config(tmp_path):
    """``run.sh --pii CONFIG --cpu-smoke`` installs the project and checks the config; bad uses exit 2 naming
    what is wrong, before anything is installed."""
    run = os.path.join(GPU, "run.sh")
    env = dict(os.environ, PYTHON=sys.executable, KIT_OUT=str(tmp_path / "out"), KIT_SITE=str(tmp_path / "site"),
               KIT_WHEELS="0", STAGE_HOLD=str(tmp_path / "hold"))
    env.pop("OUT", None)
    missing = "--finetune: no config file 'examples/nothing.toml'"
    for argv, message in ((["--finetune", "examples/nothing.toml"], missing),
                          (["--pii", "examples/pii_gpu.toml", "--finetune", "examples/finetune_scale.toml"],
                           "one of --finetune and --pii, once"),
                          (["--pii", "examples/pii_gpu.toml", "--parts", "dpsgd"], "drop --parts"),
                          (["--pii"], "--pii needs a value"),
                          (["--plan", "--pii", "examples/pii_gpu.toml"], "--plan goes with --finetune CONFIG")):
        proc = subprocess.run(["bash", run, *argv], env=env, capture_output=True, text=True, timeout=60, cwd=str(ROOT))
        assert proc.returncode == 2 and message in proc.stderr, (argv, proc.stderr)
    assert not (tmp_path / "site").exists()
    proc = subprocess.run(["bash", run, "--cpu-smoke", "--pii", "examples/pii_gpu.toml"], env=env,
                          capture_output=True, text=True, timeout=300, cwd=str(ROOT))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "installed snapaudit-jax" in proc.stdout
    assert "examples/pii_gpu.toml checked" in (tmp_path / "out" / "pii_gpu.plan.txt").read_text()
