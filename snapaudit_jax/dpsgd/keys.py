"""The run key of DP-SGD: secret by default, kept only with the run's private state.

DP-SGD's guarantee holds for someone who sees the released model but not the randomness that made it: the Poisson
batches and the Gaussian noise. If that randomness can be regenerated (from a public or default seed), the
released model is a deterministic function of the data, and adding or removing one unit changes it from one
value to another that anyone can compute: no ``(epsilon, delta)`` holds. So a run's key comes from the operating
system's entropy unless its owner asks for a replayable one.

Where the key comes from (:func:`resolve_run_key`, the ``randomness`` of a :class:`~snapaudit_jax.dpsgd.DPReport`):

* ``"secret"`` (the default): 64 bits from :func:`secrets.token_bytes` (the operating system's CSPRNG), used as
  the key data of JAX's ``threefry2x32`` generator (Salmon et al. 2011, the counter-based Threefry-2x32 with 20
  rounds; its key is two 32-bit words). With a checkpoint folder the key is written there once, in
  :data:`KEY_FILE` (mode ``0600``, atomically, never replaced), so that a stopped run resumes bit for bit; the
  checkpoints' ``meta.json`` hold only its SHA-256 digest (:func:`key_digest`). Whoever reads that file, or a
  checkpoint's optimizer state (it holds the noise generator's current key), can replay the noise: both are
  private state, kept with the private data.
* ``"seed"``: ``jax.random.key(seed)`` from a seed the user chose. The run is replayable, and the guarantee holds
  only while that seed stays secret; the report says so.
* ``"caller"``: a key passed to :func:`~snapaudit_jax.dpsgd.train` by the calling program, whose responsibility
  it is to draw it secretly and uniformly.

Not defended against: floating-point attacks on the Gaussian sampler (the noise is float32, an inverse-CDF
transform of uniform bits, :mod:`~snapaudit_jax.dpsgd.noise`, exact in its tails to ``|z| = 9.67``; the low-order bits
of a float sum of a value and such noise can reveal the value, Mironov 2012, Jin et al. 2022), timing side channels,
and a reader of the run's private state.
Brute force over the 64-bit key space costs ``2**64`` training runs.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import tempfile

import jax
import jax.numpy as jnp
import numpy as np

from snapaudit_jax.utils.errors import InputError
from snapaudit_jax.utils.io import named_os_errors

__all__ = ["KEY_IMPL", "KEY_FILE", "KEY_BITS", "fresh_key", "key_digest", "stored_key", "resolve_run_key",
           "RANDOMNESS"]

KEY_IMPL = "threefry2x32"
KEY_BITS = 64
KEY_FILE = "run_key.json"
_FORMAT = 1

RANDOMNESS = {
    "secret": ("batches and noise from a secret key: 64 bits of the operating system's entropy (threefry2x32), "
               "kept only in the run's private state"),
    "seed": ("batches and noise replayable from a seed the user chose: the guarantee holds only while that seed "
             "stays secret"),
    "caller": ("batches and noise from the caller's key: the guarantee holds only if that key is secret and "
               "uniformly random"),
}


def fresh_key() -> jax.Array:
    """A ``threefry2x32`` key from 64 bits of the operating system's entropy (:func:`secrets.token_bytes`).

    Returns:
      A typed PRNG key.
    """
    data = np.frombuffer(secrets.token_bytes(KEY_BITS // 8), dtype=np.uint32).copy()
    return jax.random.wrap_key_data(jnp.asarray(data), impl=KEY_IMPL)


def key_digest(key: jax.Array) -> str:
    """SHA-256 (64 hex digits) of a key's implementation and data: names the key without revealing it.

    Args:
      key: a typed PRNG key.

    Returns:
      The digest.
    """
    data = np.asarray(jax.device_get(jax.random.key_data(key)), np.uint32)
    h = hashlib.sha256(b"snapaudit-jax run key\0")
    h.update(str(jax.random.key_impl(key)).encode())
    h.update(b"\0")
    h.update(np.ascontiguousarray(data).astype("<u4").tobytes())
    return h.hexdigest()


def _read(path: str) -> jax.Array:
    try:
        with open(path) as fh:
            body = json.load(fh)
        data = body["key_data"]
        impl = body["impl"]
        ok = (body.get("format") == _FORMAT and impl == KEY_IMPL and isinstance(data, list) and len(data) == 2
              and all(isinstance(x, int) and 0 <= x < 2**32 for x in data))
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise InputError(f"run key {path}: not readable ({err}); it is the run's private state, restore it or "
                         "start the run in a new folder") from None
    if not ok:
        raise InputError(f"run key {path}: must hold format {_FORMAT}, impl {KEY_IMPL!r} and two 32-bit words; "
                         "restore it or start the run in a new folder")
    return jax.random.wrap_key_data(jnp.asarray(np.asarray(data, np.uint32)), impl=impl)


def stored_key(directory: str | os.PathLike) -> jax.Array:
    """The secret key of the run whose private state is ``directory``: read, or drawn and written once.

    The file :data:`KEY_FILE` is created with mode ``0600`` by a hard link from a complete temporary file, so two
    runs racing on one folder agree on one key and a reader never sees half a key.

    Args:
      directory: the folder (created if missing).

    Returns:
      The typed ``threefry2x32`` key.

    Raises:
      InputError: an unreadable or malformed key file.
    """
    directory = os.fspath(directory)
    path = os.path.join(directory, KEY_FILE)
    if os.path.exists(path):
        return _read(path)
    os.makedirs(directory, exist_ok=True)
    key = fresh_key()
    body = {"format": _FORMAT, "impl": KEY_IMPL,
            "key_data": [int(x) for x in np.asarray(jax.random.key_data(key))],
            "note": "the secret key of this run's batches and noise: private, never release it"}
    fd, tmp = tempfile.mkstemp(prefix=".tmp-run_key-", dir=directory)
    try:
        os.fchmod(fd, 0o600)
        with named_os_errors(path), os.fdopen(fd, "w") as fh:
            json.dump(body, fh)
            fh.flush()
            os.fsync(fh.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass  # another run drew first: use its key
    finally:
        os.unlink(tmp)
    return _read(path)


def _broadcast(key: jax.Array | None) -> jax.Array:
    """Process 0's key on every process (``jax.distributed``); the others pass ``None``."""
    from jax.experimental import multihost_utils

    data = (np.zeros(2, np.uint32) if key is None
            else np.asarray(jax.device_get(jax.random.key_data(key)), np.uint32))
    data = np.asarray(multihost_utils.broadcast_one_to_all(data), np.uint32)
    return jax.random.wrap_key_data(jnp.asarray(data), impl=KEY_IMPL)


def resolve_run_key(key, seed: int | None, directory: str | os.PathLike | None = None, *,
                    processes: bool = False) -> tuple[jax.Array | None, str]:
    """The run key and where it came from (``"caller"``, ``"seed"`` or ``"secret"``).

    Args:
      key: the caller's key, or ``None``.
      seed: a replayable seed the user chose, or ``None`` for a secret key.
      directory: where a secret key is kept (read or drawn once); ``None``: a fresh key, not kept.
      processes: a run over several processes: process 0 draws or reads the secret key and sends it to the
        others (the folder then need not be shared for the key).

    Returns:
      ``(key, source)``; ``key`` is ``None`` when the caller's key is to be used as given.
    """
    if key is not None:
        return None, "caller"
    if seed is not None:
        return jax.random.key(seed), "seed"
    if processes:
        mine = None
        if jax.process_index() == 0:
            mine = stored_key(directory) if directory is not None else fresh_key()
        return _broadcast(mine), "secret"
    return (stored_key(directory) if directory is not None else fresh_key()), "secret"
