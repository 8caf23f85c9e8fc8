"""Atomic DP-SGD checkpoints: safetensors for the arrays, JSON for the rest.

A checkpoint is a folder ``<dir>/step_<8 digits>/`` holding ``state.safetensors`` (model
parameters under ``params/<path>`` and optimizer state, including the noise generator's key, under
``opt_state/<path>``) and ``meta.json`` (step, the SHA-256 digest of the run key -- never the key --,
accountant ledger, the configuration and fingerprints of the data and model it belongs to, the history so far).
A checkpoint is private state: its optimizer state holds the noise generator's current key, which replays the
noise of the steps after it, and its parameters before the last step are covered only as part of the whole
sequence; keep the checkpoint folder (with a secret run's ``run_key.json``) with the private data. It is written to a
temporary folder next to it, fsynced, then renamed into place: a checkpoint folder is complete or
absent. The two newest are kept.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from snapaudit_jax.utils.errors import InputError
from snapaudit_jax.utils.io import named_os_errors, save_safetensors

__all__ = ["save_checkpoint", "latest_checkpoint", "load_checkpoint", "read_meta", "CHECKPOINT_FORMAT"]

CHECKPOINT_FORMAT = 1
_NAME = re.compile(r"^step_(\d{8})$")
_KEEP = 2


def _is_typed_key(leaf) -> bool:
    return hasattr(leaf, "dtype") and jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key)


def _flatten(prefix: str, tree) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    arrays, typed = {}, {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        name = prefix + jax.tree_util.keystr(path)
        if _is_typed_key(leaf):
            typed[name] = str(jax.random.key_impl(leaf))
            leaf = jax.random.key_data(leaf)
        arrays[name] = np.asarray(jax.device_get(leaf))
    return arrays, typed


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(directory: str | os.PathLike, step: int, params, opt_state, meta: dict[str, Any]) -> str:
    """Writes the checkpoint of ``step`` atomically; older ones beyond the two newest are deleted.

    Args:
      directory: the run's checkpoint folder (created if missing).
      step: steps completed; the folder is ``step_<8 digits>`` (replaced if it exists).
      params: parameter pytree.
      opt_state: optimizer state pytree (typed PRNG keys, such as the noise generator's, are stored as key
        data with their implementation name).
      meta: JSON-serialisable metadata (``step``, ``format`` and ``typed_keys`` are added).

    Returns:
      The path of the checkpoint folder.
    """
    directory = os.fspath(directory)
    os.makedirs(directory, exist_ok=True)
    arrays, typed = _flatten("params", params)
    opt_arrays, opt_typed = _flatten("opt_state", opt_state)
    arrays.update(opt_arrays)
    typed.update(opt_typed)
    meta = dict(meta, step=int(step), format=CHECKPOINT_FORMAT, typed_keys=typed)
    final = os.path.join(directory, f"step_{step:08d}")
    tmp = tempfile.mkdtemp(prefix=f".tmp-step_{step:08d}-", dir=directory)
    try:
        save_safetensors(arrays, os.path.join(tmp, "state.safetensors"))
        meta_path = os.path.join(tmp, "meta.json")
        with named_os_errors(meta_path), open(meta_path, "w") as fh:
            json.dump(meta, fh, indent=1)  # the history may hold NaN losses (a diverged run)
            fh.flush()
            os.fsync(fh.fileno())
        if os.path.exists(final):
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync_dir(directory)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for old in _checkpoints(directory)[:-_KEEP]:
        shutil.rmtree(os.path.join(directory, old), ignore_errors=True)
    return final


def _checkpoints(directory: str) -> list[str]:
    names = [n for n in os.listdir(directory) if _NAME.match(n)]
    complete = [n for n in names if os.path.isfile(os.path.join(directory, n, "meta.json"))]
    return sorted(complete)


def latest_checkpoint(directory: str | os.PathLike) -> str | None:
    """The newest complete checkpoint folder under ``directory``.

    Args:
      directory: the run's checkpoint folder (may not exist).

    Returns:
      The path of the highest ``step_<8 digits>`` folder holding ``meta.json``, or ``None`` if there is none.
    """
    directory = os.fspath(directory)
    if not os.path.isdir(directory):
        return None
    found = _checkpoints(directory)
    return os.path.join(directory, found[-1]) if found else None


def _restore(prefix: str, template, arrays: dict[str, np.ndarray], typed: dict[str, str], source: str):
    leaves = []
    paths, treedef = jax.tree_util.tree_flatten_with_path(template)
    for path, like in paths:
        name = prefix + jax.tree_util.keystr(path)
        if name not in arrays:
            raise InputError(f"checkpoint {source}: array {name!r} is missing (model or optimizer differs)")
        value = arrays[name]
        if _is_typed_key(like):
            if name not in typed:
                raise InputError(f"checkpoint {source}: {name!r} is not stored as a PRNG key")
            leaves.append(jax.random.wrap_key_data(jnp.asarray(value), impl=typed[name]))
            continue
        like_shape, like_dtype = tuple(np.shape(like)), np.dtype(like.dtype)
        if value.shape != like_shape or value.dtype != like_dtype:
            raise InputError(
                f"checkpoint {source}: array {name!r} has shape {value.shape} dtype {value.dtype}, "
                f"expected {like_shape} {like_dtype}"
            )
        leaves.append(jnp.asarray(value))
    return jax.tree_util.tree_unflatten(treedef, leaves)


def read_meta(path: str | os.PathLike) -> dict[str, Any]:
    """The ``meta.json`` of a checkpoint folder (its step, history and the run's identity), arrays unread.

    Args:
      path: the checkpoint folder.

    Returns:
      The ``meta.json`` dictionary.

    Raises:
      InputError: unreadable or not a JSON object.
    """
    path = os.fspath(path)
    try:
        with open(os.path.join(path, "meta.json")) as fh:
            meta = json.load(fh)
    except (OSError, ValueError) as err:
        raise InputError(f"checkpoint {path}: not readable ({err})") from None
    if not isinstance(meta, dict):
        raise InputError(f"checkpoint {path}: meta.json must hold a JSON object, got {type(meta).__name__}")
    return meta


def load_checkpoint(path: str | os.PathLike, params_template, opt_state_template):
    """``(params, opt_state, meta)`` of a checkpoint folder, shaped like the templates.

    Args:
      path: the checkpoint folder (from :func:`latest_checkpoint`).
      params_template: a parameter pytree with the expected structure, shapes and dtypes.
      opt_state_template: an optimizer state pytree likewise.

    Returns:
      ``(params, opt_state, meta)``: the restored pytrees (typed PRNG keys rewrapped) and the ``meta.json``
      dictionary.

    Raises:
      InputError: unreadable checkpoint, wrong format, or arrays missing / of another
        shape or dtype / not stored as a PRNG key where the template has one.
    """
    from safetensors.numpy import load_file

    path = os.fspath(path)
    try:
        with open(os.path.join(path, "meta.json")) as fh:
            meta = json.load(fh)
        arrays = load_file(os.path.join(path, "state.safetensors"))
    except (OSError, ValueError) as err:
        raise InputError(f"checkpoint {path}: not readable ({err})") from None
    except Exception as err:  # safetensors raises its own error types for corrupt headers
        raise InputError(f"checkpoint {path}: not readable ({err})") from None
    if meta.get("format") != CHECKPOINT_FORMAT:
        raise InputError(f"checkpoint {path}: format must be {CHECKPOINT_FORMAT}, got {meta.get('format')!r}")
    typed = meta.get("typed_keys", {})
    params = _restore("params", params_template, arrays, typed, path)
    opt_state = _restore("opt_state", opt_state_template, arrays, typed, path)
    return params, opt_state, meta
