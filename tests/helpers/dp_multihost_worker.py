"""Subprocess worker for the multi-process (``jax.distributed``) DP-SGD tests: 4 CPU devices in all.

Usage:
  python dp_multihost_worker.py multi OUT_DIR COORDINATOR PROCESS_ID   # one of 2 processes x 2 host devices
  python dp_multihost_worker.py single OUT_DIR                         # 1 process x 4 host devices

``multi`` (run by both processes, gloo collectives): ``mesh=2`` (process 0's devices only) and a key that differs
between the processes (both refused); the tiny GPT-2 run on ``mesh=4`` (all global devices) uninterrupted; then
with a checkpoint every step, stopped after step 3 (the step-3 checkpoint is copied to ``OUT_DIR/ckpt_after3`` by
process 0); then resumed to the end from a model with other weights. It counts this process's
``save_checkpoint`` calls and saves ``OUT_DIR/multi_<PROCESS_ID>.npz``. ``single``: the same run with
``mesh=None`` and ``mesh=4``, saved to ``OUT_DIR/single.npz``, then, once a line arrives on stdin, an attempt to
resume on 4 devices of one process from ``OUT_DIR/ckpt_after3`` (refused: another process layout). Each prints
one JSON line.
"""

import json
import os
import shutil
import sys

from tests.helpers.bench import host_devices_xla_flags

mode, out_dir = sys.argv[1], sys.argv[2]
os.environ["XLA_FLAGS"] = host_devices_xla_flags(2 if mode == "multi" else 4)  # compiled as the suite compiles
os.environ["JAX_PLATFORMS"] = "cpu"  # host devices, also on a machine with an accelerator

import jax  # noqa: E402

if mode == "multi":
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=sys.argv[3], num_processes=2, process_id=int(sys.argv[4]))

import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402

from snapaudit_jax.dpsgd import DPSGDConfig, train  # noqa: E402
from snapaudit_jax.models.config import GPT2Config  # noqa: E402
from snapaudit_jax.models.decoders import GPT2  # noqa: E402
from snapaudit_jax.utils.errors import InputError  # noqa: E402

VOCAB, L, N = 61, 12, 29  # N = 29 records: padded to 32 units, 8 per device
GPT2_CFG = GPT2Config(vocab_size=VOCAB, n_positions=16, n_embd=16, n_layer=1, n_head=2, n_inner=32)
CONFIG = DPSGDConfig(
    steps=5, learning_rate=0.2, clip_norm=4.5, noise_multiplier=1.1, sampling_rate=0.4, optimizer="sgd",
    momentum=0.9, microbatch_size=3, delta=1e-5, pld_discretization=1e-2,
)
KEY, STOP = 3, 3
_train_module = sys.modules["snapaudit_jax.dpsgd.train"]
_saves = {"calls": 0}
_save_checkpoint = _train_module.save_checkpoint


def _counting_save(*args, **kwargs):
    _saves["calls"] += 1
    return _save_checkpoint(*args, **kwargs)


_train_module.save_checkpoint = _counting_save


def data():
    """``(N, L)`` records of 2..L real tokens, even rows right-padded, odd rows left-padded."""
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, VOCAB, (N, L)).astype(np.int32)
    lens = rng.integers(2, L + 1, N)
    pos = np.arange(L)[None, :]
    mask = np.where((np.arange(N) % 2 == 0)[:, None], pos < lens[:, None], pos >= (L - lens)[:, None])
    return tokens, mask


def run(mesh, seed=0, **kwargs):
    return train(GPT2(GPT2_CFG, rngs=nnx.Rngs(seed)), data(), CONFIG, key=jax.random.key(KEY), mesh=mesh, **kwargs)


def flat(model) -> np.ndarray:
    return np.concatenate([np.ravel(np.asarray(x)) for x in jax.tree.leaves(nnx.state(model, nnx.Param))])


def local_only(model) -> bool:
    """Every array of ``model`` lives on this process's devices only (usable without the other process)."""
    return all(x.is_fully_addressable for x in jax.tree.leaves(nnx.state(model)) if isinstance(x, jax.Array))


def multi() -> dict:
    pid = jax.process_index()
    ckpt = os.path.join(out_dir, "ckpt")
    out: dict = {"process": pid, "processes": jax.process_count(), "devices": len(jax.devices()),
                 "local_devices": len(jax.local_devices())}
    arrays: dict[str, np.ndarray] = {}
    try:  # 2 of the 4 global devices are process 0's: refused on both processes
        run(2)
        out["mesh_2_refused"] = None
    except InputError as err:
        out["mesh_2_refused"] = str(err)
    try:  # process 1 with another key: refused on both processes, before any step
        train(GPT2(GPT2_CFG, rngs=nnx.Rngs(0)), data(), CONFIG, key=jax.random.key(KEY + pid), mesh=4)
        out["other_key_refused"] = None
    except InputError as err:
        out["other_key_refused"] = str(err)
    model, history, report = run(4)
    arrays["uninterrupted"], arrays["batch"] = flat(model), history["batch_size"]
    out["uninterrupted_local"], out["report"] = local_only(model), report.to_dict()

    saves = _saves["calls"]
    _, history, _ = run(4, checkpoint_dir=ckpt, checkpoint_every=1, stop_after=STOP)
    out["saves_first"] = _saves["calls"] - saves
    out["on_disk_after_stop"] = sorted(os.listdir(ckpt))  # after the barrier: process 0's writes are complete
    if pid == 0:
        name = f"step_{STOP:08d}"
        shutil.copytree(os.path.join(ckpt, name), os.path.join(out_dir, "ckpt_after3", name))
    multihost_utils.sync_global_devices("dp_multihost_worker: copied")

    saves, seen = _saves["calls"], []
    model, history, report = run(4, seed=9, checkpoint_dir=ckpt, checkpoint_every=1,
                                 progress=lambda info: seen.append(info["step"]))
    out["saves_resume"], out["resumed_steps"] = _saves["calls"] - saves, seen
    out["resumed_local"], out["resumed_report"] = local_only(model), report.to_dict()
    out["on_disk_after_resume"] = sorted(os.listdir(ckpt))
    arrays["resumed"], arrays["resumed_batch"] = flat(model), history["batch_size"]
    np.savez(os.path.join(out_dir, f"multi_{pid}.npz"), **arrays)
    return out


def single() -> dict:
    arrays: dict[str, np.ndarray] = {}
    for name, mesh in (("one_device", None), ("four_devices", 4)):
        model, history, _ = run(mesh)
        arrays[name], arrays[f"{name}_batch"] = flat(model), history["batch_size"]
    arrays["init"] = flat(GPT2(GPT2_CFG, rngs=nnx.Rngs(0)))
    sys.stdin.readline()  # the test's signal: the 2-process run is done, OUT_DIR/ckpt_after3 is complete
    try:  # the 2-process checkpoint on 4 devices of one process: refused (another summation order)
        run(4, seed=9, checkpoint_dir=os.path.join(out_dir, "ckpt_after3"))
        refused = None
    except InputError as err:
        refused = str(err)
    np.savez(os.path.join(out_dir, "single.npz"), **arrays)
    return {"devices": len(jax.devices()), "processes": jax.process_count(), "refused": refused}


if __name__ == "__main__":
    result = multi() if mode == "multi" else single()
    print(json.dumps(result), flush=True)
