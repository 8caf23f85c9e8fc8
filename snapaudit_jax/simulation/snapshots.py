"""Clean-output snapshots: validation, de-duplication and ``.npz`` files.

A snapshot set holds, per hypothesis, ``n`` clean outputs of the
non-private pipeline ``M'`` stacked along axis 0: ``with`` (canary present,
``b = 1``) and ``without`` (``b = 0``). An ``.npz`` snapshot file contains

* ``with``: ``(n1, ...)`` and ``without``: ``(n0, ...)`` float arrays;
* optionally ``candidates``: ``(c, d)`` (ESA candidate embeddings);
* optionally ``target``: the release that signals "canary present".

Files are read with ``allow_pickle=False`` and written atomically.
"""

from __future__ import annotations

import dataclasses
import os
import zipfile

import numpy as np

from snapaudit_jax.utils import validate
from snapaudit_jax.utils.errors import InputError
from snapaudit_jax.utils.io import atomic_write

__all__ = ["Snapshots", "dedupe", "load_snapshots", "save_snapshots", "check_clean"]


@dataclasses.dataclass(frozen=True)
class Snapshots:
    """Clean outputs of both hypotheses (and ESA candidates, if any).

    Attributes:
      with_canary: ``(n1, ...)`` clean outputs with the canary (``b = 1``).
      without_canary: ``(n0, ...)`` clean outputs without it (``b = 0``).
      candidates: ``(c, d)`` ESA candidate embeddings, or ``None``.
      target: the release that signals "canary present", or ``None`` (the default target).
    """

    with_canary: np.ndarray
    without_canary: np.ndarray
    candidates: np.ndarray | None = None
    target: int | None = None


def dedupe(snapshots: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Distinct snapshots in first-appearance order.

    Args:
      snapshots: ``(n, ...)`` array.

    Returns:
      ``(distinct, inverse, multiplicity)``: ``(D, ...)`` distinct rows, ``(n,)`` int index of each snapshot's row
      (``distinct[inverse] == snapshots``) and ``(D,)`` int count of each row.
    """
    arr = np.asarray(snapshots)
    flat = arr.reshape(arr.shape[0], -1)
    _, first, inverse, counts = np.unique(flat, axis=0, return_index=True, return_inverse=True, return_counts=True)
    order = np.argsort(first)
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    return arr[first[order]], rank[inverse.reshape(-1)], counts[order]


def check_clean(name: str, value, *, mechanism: str, candidates: np.ndarray | None = None) -> np.ndarray:
    """Validates one hypothesis' clean outputs for ``mechanism``.

    Args:
      name: the field named in errors.
      value: the clean outputs, ``(n, length)`` array-like.
      mechanism: the mechanism name (``"pv"``, ``"poe"``, ``"esa"``, ``"ksa"``).
      candidates: ``(c, d)`` candidate embeddings (required for ``"esa"``).

    Returns:
      The clean outputs as a float64 ``(n, length)`` array.

    Raises:
      InputError: a non-finite, empty, ragged or not 2-D array; ESA without candidates or with another embedding
        dimension; fewer than 2 entries per snapshot (PV, PoE, KSA); negative KSA counts.
    """
    arr = validate.finite_array(name, value, ndim_min=2)
    if arr.ndim != 2:
        raise InputError(f"{name} must have shape (n_snapshots, length), got {arr.shape}")
    if mechanism == "esa":
        if candidates is None:
            raise InputError("esa needs candidate embeddings (candidates of shape (c, d))")
        if candidates.shape[1] != arr.shape[1]:
            raise InputError(
                f"{name} has embedding dimension {arr.shape[1]} but candidates have dimension {candidates.shape[1]}"
            )
    elif arr.shape[1] < 2:
        raise InputError(f"{name} must have at least 2 entries per snapshot (classes or keywords), got {arr.shape[1]}")
    if mechanism == "ksa" and np.any(arr < 0):
        raise InputError(f"{name} holds keyword counts and must be >= 0, found {arr.min()}")
    return arr


def load_snapshots(path: str | os.PathLike) -> Snapshots:
    """Reads an ``.npz`` snapshot file (see the module docstring).

    Args:
      path: the ``.npz`` file.

    Returns:
      The :class:`Snapshots` (float64 arrays).

    Raises:
      InputError: missing file or a folder, not an ``.npz`` archive, missing ``with``/``without`` arrays, arrays
        that are empty, ragged, non-numeric or not finite, ``candidates`` not ``(c, d)``, a non-integer
        ``target``, or ``with`` and ``without`` snapshots of different shapes.
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        raise InputError(f"snapshot file {path!r} is a folder, not an .npz file")
    if not os.path.isfile(path):
        raise InputError(f"snapshot file {path!r} does not exist")
    try:
        with np.load(path, allow_pickle=False) as data:
            contents = {k: np.asarray(data[k]) for k in data.files}
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as err:
        raise InputError(f"snapshot file {path!r} is not a readable .npz archive: {err}") from None
    for key in ("with", "without"):
        if key not in contents:
            raise InputError(f"snapshot file {path!r} has no array {key!r} (found: {sorted(contents)})")
    out = {}
    for key in ("with", "without"):
        out[key] = validate.finite_array(f"{path}:{key}", contents[key], ndim_min=2)
    candidates = None
    if "candidates" in contents:
        candidates = validate.finite_array(f"{path}:candidates", contents["candidates"], ndim_min=2)
        if candidates.ndim != 2:
            raise InputError(f"{path}:candidates must have shape (c, d), got {candidates.shape}")
    target = None
    if "target" in contents:
        t = contents["target"]
        if t.shape != () or not np.issubdtype(t.dtype, np.integer):
            raise InputError(f"{path}:target must be a scalar integer, got {t!r}")
        target = int(t)
    if out["with"].shape[1:] != out["without"].shape[1:]:
        raise InputError(
            f"{path}: 'with' snapshots have shape {out['with'].shape[1:]} per snapshot but "
            f"'without' have {out['without'].shape[1:]}"
        )
    return Snapshots(out["with"], out["without"], candidates, target)


def save_snapshots(path: str | os.PathLike, snapshots: Snapshots) -> None:
    """Writes an ``.npz`` snapshot file atomically (temporary file + rename).

    Args:
      path: the output file.
      snapshots: the :class:`Snapshots` to write (``candidates`` and ``target`` only if not ``None``).
    """
    arrays = {"with": np.asarray(snapshots.with_canary), "without": np.asarray(snapshots.without_canary)}
    if snapshots.candidates is not None:
        arrays["candidates"] = np.asarray(snapshots.candidates)
    if snapshots.target is not None:
        arrays["target"] = np.asarray(int(snapshots.target))
    atomic_write(path, lambda fh: np.savez(fh, **arrays))
