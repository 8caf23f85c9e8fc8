"""Subprocess worker: ``snapaudit finetune`` SIGKILLed right after one chosen checkpoint is written.

Usage:
  python finetune_kill_worker.py CONFIG OUT MODEL STEP

Runs ``snapaudit finetune CONFIG --out OUT --quiet`` in this process and SIGKILLs it as soon as the DP-SGD
checkpoint ``STEP`` of ``checkpoints/MODEL`` (``private``, ``baseline``, ``sweep_<j>``) is on disk: no handler,
no ``finally`` and no atexit runs, as with ``kill -9`` or a power cut at that point. Exits 3 if the run ended
without reaching that checkpoint.
"""

import os
import signal
import sys

from snapaudit_jax.cli import main
import snapaudit_jax.dpsgd.train  # noqa: F401  (the module, not the function the package exports)


def _run(config: str, out: str, model: str, step: int) -> int:
    train_module = sys.modules["snapaudit_jax.dpsgd.train"]
    save = train_module.save_checkpoint

    def save_then_die(directory, done, *args, **kwargs):
        save(directory, done, *args, **kwargs)
        if os.path.basename(os.path.normpath(directory)) == model and done == step:
            os.kill(os.getpid(), signal.SIGKILL)

    train_module.save_checkpoint = save_then_die
    main(["finetune", config, "--out", out, "--quiet"])
    return 3


if __name__ == "__main__":
    sys.exit(_run(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])))
