"""Subprocess worker: one of two ``jax.distributed`` CPU processes (gloo collectives) resolving the run key.

Usage:
  python key_broadcast_worker.py PROCESS_ID PORT FOLDER broadcast|local

Calls :func:`snapaudit_jax.dpsgd.keys.resolve_run_key` with no key and no seed (a secret key kept in ``FOLDER``),
with ``processes=True`` (``broadcast``) or ``False`` (``local``: each process on its own, the power check), and
prints one JSON line: the process id, the key's source and its two key words.
"""

import json
import os
import sys

os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")


def main(pid: int, port: str, folder: str, mode: str) -> None:
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=pid)
    from snapaudit_jax.dpsgd.keys import resolve_run_key

    key, source = resolve_run_key(None, None, folder, processes=mode == "broadcast")
    print(json.dumps({"pid": pid, "source": source, "data": [int(x) for x in jax.random.key_data(key)]}), flush=True)
    jax.distributed.shutdown()


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4])
