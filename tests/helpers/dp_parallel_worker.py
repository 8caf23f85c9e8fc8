"""Subprocess worker for the data-parallel DP-SGD tests (8 XLA host devices, set before JAX is imported).

Usage:
  python dp_parallel_worker.py parity OUT.npz
  python dp_parallel_worker.py killed CHECKPOINT_DIR KILL_AT_STEP
  python dp_parallel_worker.py resume CHECKPOINT_DIR OUT.npz

``parity`` trains the same runs with ``mesh=None`` and on 8 devices in one process and saves the parameters,
histories and noise deltas to ``OUT.npz``; ``killed`` trains :func:`gpt2_run` on 8 devices with a checkpoint
every step and SIGKILLs itself from the progress callback once step ``KILL_AT_STEP`` is done (before its
checkpoint); ``resume`` first checks that the checkpoint is refused with another device count, then finishes the
run on 8 devices from it. Each prints one JSON line.
"""

import json
import os
import signal
import sys

from tests.helpers.bench import host_devices_xla_flags

os.environ["XLA_FLAGS"] = host_devices_xla_flags(8)  # compiled as the suite compiles
os.environ["JAX_PLATFORMS"] = "cpu"  # host devices, also on a machine with an accelerator

import jax  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from snapaudit_jax.dpsgd import DPSGDConfig, poisson_batch, train  # noqa: E402
from snapaudit_jax.finetune.lora import LoRAConfig, apply_lora  # noqa: E402
from snapaudit_jax.models.config import GPT2Config, LlamaConfig  # noqa: E402
from snapaudit_jax.models.decoders import GPT2, Llama  # noqa: E402
from snapaudit_jax.utils.errors import InputError  # noqa: E402

DEVICES = 8
VOCAB, L = 61, 12
N_GPT2 = 29  # records (N, L): padded to 32 units, 4 per device
N_USERS, K = 23, 2  # user units (N, k, L): padded to 24, 3 per device
GPT2_CFG = GPT2Config(vocab_size=VOCAB, n_positions=16, n_embd=16, n_layer=1, n_head=2, n_inner=32)
LLAMA_CFG = LlamaConfig(
    vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
    num_key_value_heads=1, head_dim=8, max_position_embeddings=64,
)
# One compiled step per (model, mesh): every GPT-2 run shares N, L, m and the optimizer kind (SGD, momentum 0.9).
GPT2_CONFIG = DPSGDConfig(
    steps=5, learning_rate=0.2, clip_norm=4.5, noise_multiplier=1.1, sampling_rate=0.4, optimizer="sgd",
    momentum=0.9, microbatch_size=3, delta=1e-5, pld_discretization=1e-2,
)
GPT2_KEY = 3
# Noise only: C = 1e-20 makes the clipped sum < 3e-19 while sigma C = 0.1; SGD at learning rate 1 for one step
# (momentum's first step is plain SGD) moves the parameters by -noise / (q N).
NOISE_CONFIG = DPSGDConfig(**{**GPT2_CONFIG.__dict__, "steps": 1, "learning_rate": 1.0, "clip_norm": 1e-20,
                              "noise_multiplier": 1e19})
LORA_CONFIG = DPSGDConfig(
    steps=5, learning_rate=0.05, clip_norm=0.3, noise_multiplier=0.9, sampling_rate=0.5, optimizer="adam",
    microbatch_size=2, delta=1e-5, pld_discretization=1e-2,
)


def records(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``(n, L)`` records of 2..L real tokens, even rows right-padded, odd rows left-padded."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, VOCAB, (n, L)).astype(np.int32)
    lens = rng.integers(2, L + 1, n)
    pos = np.arange(L)[None, :]
    mask = np.where((np.arange(n) % 2 == 0)[:, None], pos < lens[:, None], pos >= (L - lens)[:, None])
    return tokens, mask


def gpt2_data():
    return records(N_GPT2, 0)


def user_data():
    """``(N_USERS, K, L)``: every third user has one record and an empty padding row."""
    tokens, mask = records(N_USERS * K, 1)
    tokens, mask = tokens.reshape(N_USERS, K, L), mask.reshape(N_USERS, K, L).copy()
    mask[::3, 1] = False
    return tokens, mask


def gpt2_model(seed: int = 0):
    return GPT2(GPT2_CFG, rngs=nnx.Rngs(seed))


def lora_model():
    base = Llama(LLAMA_CFG, rngs=nnx.Rngs(0))
    return apply_lora(base, LoRAConfig(rank=2, alpha=4.0, targets=("q_proj", "v_proj", "down_proj")),
                      key=jax.random.key(1))


def flat(model, kind=nnx.Param) -> np.ndarray:
    return np.concatenate([np.ravel(np.asarray(x)) for x in jax.tree.leaves(nnx.state(model, kind))])


def base_params(model) -> np.ndarray:
    return flat(model, nnx.All(nnx.Param, nnx.Not(nnx.LoRAParam)))


def gpt2_run(mesh, **kwargs):
    return train(gpt2_model(), gpt2_data(), GPT2_CONFIG, key=jax.random.key(GPT2_KEY), mesh=mesh, **kwargs)


_EVENTS = {"trace": 0, "lower": 0, "compile": 0}
_NAMES = {
    "/jax/core/compile/jaxpr_trace_duration": "trace",
    "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower",
    "/jax/core/compile/backend_compile_duration": "compile",
}


def _on_event(event, duration, **kwargs):
    if event in _NAMES:
        _EVENTS[_NAMES[event]] += 1


def _counting(fn):
    """``fn()`` and the JAX trace / lowering / backend-compilation events it caused."""
    before = dict(_EVENTS)
    result = fn()
    return result, {name: _EVENTS[name] - before[name] for name in _EVENTS}


def parity(out_path: str) -> dict:
    jax.monitoring.register_event_duration_secs_listener(_on_event)
    out: dict = {}
    arrays: dict[str, np.ndarray] = {}
    # (1) User units (N, k, L) and LoRA adapters only (first, while the killed worker fills the compilation
    # cache with the 8-device GPT-2 step).
    for name, mesh in (("single", None), ("mesh", DEVICES)):
        model, history, _ = train(lora_model(), user_data(), LORA_CONFIG, key=jax.random.key(5), mesh=mesh,
                                  trainable=nnx.LoRAParam)
        arrays[f"lora_{name}"] = flat(model, nnx.LoRAParam)
        arrays[f"lora_{name}_base"] = base_params(model)
        arrays[f"lora_{name}_batch"] = history["batch_size"]
        arrays[f"lora_{name}_loss"] = history["loss"]
    init = lora_model()
    arrays["lora_init"], arrays["lora_init_base"] = flat(init, nnx.LoRAParam), base_params(init)
    # (1) Records (N, L), every parameter trained; the 8-device run is also the uninterrupted reference of the
    # kill -9 test. Its jit events: the step is traced and lowered once, not again for a later step.
    for name, mesh in (("single", None), ("mesh", DEVICES)):
        (model, history, report), events = _counting(lambda mesh=mesh: gpt2_run(mesh))
        out[f"gpt2_{name}_events"] = events
        arrays[f"gpt2_{name}"] = flat(model)
        arrays[f"gpt2_{name}_batch"] = history["batch_size"]
        arrays[f"gpt2_{name}_loss"] = history["loss"]
        arrays[f"gpt2_{name}_clipped"] = history["clipped_fraction"]
        out[f"gpt2_{name}_report"] = report.to_dict()
    arrays["gpt2_init"] = flat(gpt2_model())
    sampler = jax.random.fold_in(jax.random.key(GPT2_KEY), 0)
    arrays["gpt2_oracle_batch"] = np.array(
        [int(poisson_batch(sampler, t, N_GPT2, GPT2_CONFIG.sampling_rate).sum()) for t in range(GPT2_CONFIG.steps)]
    )
    # (2) One noise draw: the noise-only step on one device and on a user-built 8-device mesh (jax.make_mesh
    # defaults to Explicit axes), with the GPT-2 runs' compiled steps (privacy settings are traced).
    for name, mesh in (("single", None), ("mesh", jax.make_mesh((DEVICES,), ("data",)))):
        (model, history, _), events = _counting(
            lambda mesh=mesh: train(gpt2_model(), gpt2_data(), NOISE_CONFIG, key=jax.random.key(11), mesh=mesh)
        )
        out[f"noise_{name}_events"] = events
        arrays[f"noise_{name}"] = flat(model) - arrays["gpt2_init"]
        out[f"noise_{name}_batch"] = int(history["batch_size"][0])
    out["noise_config"] = {
        "sampling_rate": NOISE_CONFIG.sampling_rate,
        "noise_multiplier": NOISE_CONFIG.noise_multiplier,
        "clip_norm": NOISE_CONFIG.clip_norm,
        "num_records": N_GPT2,
    }
    np.savez(out_path, **arrays)
    out["devices"] = len(jax.devices())
    return out


def killed(checkpoint_dir: str, kill_at: int) -> None:
    def progress(info):
        if info["step"] == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    gpt2_run(DEVICES, checkpoint_dir=checkpoint_dir, checkpoint_every=1, progress=progress)
    raise SystemExit("the run was not killed")


def resume(checkpoint_dir: str, out_path: str) -> dict:
    out: dict = {"refused": {}}
    for mesh in (None, 4):  # another device count: refused, naming the field
        try:
            gpt2_run(mesh, checkpoint_dir=checkpoint_dir)
            out["refused"][str(mesh)] = None
        except InputError as err:
            out["refused"][str(mesh)] = str(err)
    seen = []
    model, history, report = train(
        gpt2_model(seed=9), gpt2_data(), GPT2_CONFIG, key=jax.random.key(GPT2_KEY), mesh=DEVICES,
        checkpoint_dir=checkpoint_dir, checkpoint_every=1, progress=lambda info: seen.append(info["step"]),
    )
    out["resumed_steps"] = seen
    out["report"] = report.to_dict()
    np.savez(out_path, params=flat(model), batch=history["batch_size"], loss=history["loss"])
    return out


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "parity":
        result = parity(sys.argv[2])
    elif mode == "killed":
        killed(sys.argv[2], int(sys.argv[3]))
    elif mode == "resume":
        result = resume(sys.argv[2], sys.argv[3])
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    print(json.dumps(result), flush=True)
