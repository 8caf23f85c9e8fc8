"""Subprocess worker: ``snapaudit finetune`` killed at a chosen point, or writing under a file size limit.

Usage:
  python finetune_kill_worker.py CONFIG OUT checkpoint MODEL STEP
  python finetune_kill_worker.py CONFIG OUT export NAME
  python finetune_kill_worker.py CONFIG OUT fsize BYTES

Runs ``snapaudit finetune CONFIG --out OUT --quiet`` in this process.

``checkpoint``: SIGKILLs it as soon as the DP-SGD checkpoint ``STEP`` of ``checkpoints/MODEL`` (``private``,
``baseline``, ``sweep_<j>``) is on disk. ``export``: SIGKILLs it as soon as the exported safetensors file
``NAME`` (``model.safetensors``, ``adapter_model.safetensors``) is written into its temporary folder, before
the folder is renamed into place. No handler, no ``finally`` and no atexit runs, as with ``kill -9`` or a power
cut at that point; exits 3 if the run ended without reaching it.

``fsize``: sets ``RLIMIT_FSIZE`` to ``BYTES`` (SIGXFSZ ignored, so a write past it fails with ``EFBIG``, as a
full disk fails with ``ENOSPC``) and exits with the command's status.
"""

import os
import resource
import signal
import sys

import snapaudit_jax.dpsgd.train  # noqa: F401  (the module, not the function the package exports)
import snapaudit_jax.finetune.export as export_module
from snapaudit_jax.cli import main


def _die():
    os.kill(os.getpid(), signal.SIGKILL)


def _run(config: str, out: str, mode: str, *args: str) -> int:
    if mode == "checkpoint":
        model, step = args[0], int(args[1])
        train_module = sys.modules["snapaudit_jax.dpsgd.train"]
        save = train_module.save_checkpoint

        def save_then_die(directory, done, *a, **kw):
            save(directory, done, *a, **kw)
            if os.path.basename(os.path.normpath(directory)) == model and done == step:
                _die()

        train_module.save_checkpoint = save_then_die
    elif mode == "export":
        put = export_module._put_safetensors

        def put_then_die(folder, name, tensors):
            put(folder, name, tensors)
            if name == args[0]:
                _die()

        export_module._put_safetensors = put_then_die
    elif mode == "fsize":
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        limit = int(args[0])
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
        return main(["finetune", config, "--out", out, "--quiet"])
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    main(["finetune", config, "--out", out, "--quiet"])
    return 3


if __name__ == "__main__":
    sys.exit(_run(*sys.argv[1:]))
