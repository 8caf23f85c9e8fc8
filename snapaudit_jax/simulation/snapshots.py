"""Clean-output snapshots: validation, de-duplication and ``.npz`` files.

A snapshot set holds, per hypothesis, ``n`` clean outputs of the
non-private pipeline ``M'`` stacked along axis 0: ``with`` (canary present,
``b = 1``) and ``without`` (``b = 0``). An ``.npz`` snapshot file contains

* ``with``: ``(n1, ...)`` and ``without``: ``(n0, ...)`` float arrays;
* optionally ``candidates``: ``(c, d)`` (ESA candidate embeddings);
* optionally ``target``: the release that signals "canary present".

Files are read with ``allow_pickle=False`` and written atomically. Before any array is decompressed,
:func:`read_npz_headers` reads every member's shape and dtype from its ``.npy`` header and the zip directory's
sizes: a file that is not a zip (a raw ``.npy``), complex, string or object arrays (never cast), a header that
disagrees with the zip entry, a wrong shape, or arrays larger than the machine's memory are refused first.
"""

from __future__ import annotations

import dataclasses
import math
import os
import zipfile

import numpy as np

from snapaudit_jax.utils import validate
from snapaudit_jax.utils.files import open_regular
from snapaudit_jax.utils.errors import InputError
from snapaudit_jax.utils.io import atomic_write
from snapaudit_jax.utils.memory import check_fits

__all__ = ["Snapshots", "dedupe", "load_snapshots", "save_snapshots", "check_clean", "read_npz_headers",
           "FLOAT32_MAX"]

# The simulator computes in float32 (trials.simulate casts the clean outputs): a larger magnitude would become inf.
FLOAT32_MAX = float(np.finfo(np.float32).max)
_NPY_MAGIC = b"\x93NUMPY"
# Array kinds read as numbers: bool, signed and unsigned integers, reals. Complex ('c') would lose its imaginary
# part in the float64 cast; strings, objects, structured, dates and durations are not clean outputs.
_NUMERIC_KINDS = "biuf"


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
      InputError: a non-finite, empty, ragged, complex or not 2-D array, or one beyond float32's range; ESA without
        candidates or with another embedding dimension; fewer than 2 entries per snapshot (PV, PoE, KSA); negative
        KSA counts.
    """
    arr = validate.finite_array(name, value, ndim_min=2)
    if arr.ndim != 2:
        raise InputError(f"{name} must have shape (n_snapshots, length), got {arr.shape}")
    peak = float(np.max(np.abs(arr)))
    if peak > FLOAT32_MAX:
        index = tuple(int(i) for i in np.unravel_index(int(np.argmax(np.abs(arr))), arr.shape))
        raise InputError(f"{name} must be within float32's range |x| <= {FLOAT32_MAX:.6g} (the simulator computes in "
                         f"float32, where it would become inf), found {arr[index]:.6g} at index {index}")
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


def read_npz_headers(path: str | os.PathLike) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """The shape and dtype of every ``.npy`` member of an ``.npz`` file, read without decompressing any data.

    Only the zip directory and each member's ``.npy`` header (its first bytes) are read, so a small file that
    would decompress to gigabytes costs nothing here.

    Args:
      path: the ``.npz`` file (a regular file: a FIFO or device is refused without being opened).

    Returns:
      ``{key: (shape, dtype)}`` with ``key`` the member name without ``.npy``, in the archive's order.

    Raises:
      InputError: a missing file, a symlink loop, a folder or a non-regular file; a file that is not a zip archive
        (a raw ``.npy`` array is named as such); a member whose ``.npy`` header is unreadable or claims more bytes
        than the zip entry holds.
    """
    path = os.fspath(path)
    with open_regular(path, "snapshot file") as fh:  # the type checked before opening: a FIFO never blocks
        return _npz_headers(path, fh)


def _npz_headers(path: str, fh) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    if not zipfile.is_zipfile(fh):
        fh.seek(0)
        head = fh.read(len(_NPY_MAGIC))
        kind = "a raw .npy array (save it with numpy.savez)" if head == _NPY_MAGIC else "not a zip archive"
        raise InputError(f"snapshot file {path!r} is not a readable .npz archive: it is {kind}")
    out = {}
    try:
        with zipfile.ZipFile(fh) as archive:
            for info in archive.infolist():
                if not info.filename.endswith(".npy"):
                    continue
                key = info.filename[: -len(".npy")]
                with archive.open(info) as member:
                    version = np.lib.format.read_magic(member)
                    if version == (1, 0):
                        shape, fortran, dtype = np.lib.format.read_array_header_1_0(member)
                    else:
                        shape, fortran, dtype = np.lib.format.read_array_header_2_0(member)
                    offset = member.tell()
                out[key] = (tuple(int(n) for n in shape), np.dtype(dtype))
                if dtype.hasobject:
                    continue  # pickled data: its size says nothing, and it is refused by the caller
                claimed = offset + math.prod(shape) * dtype.itemsize
                if claimed > info.file_size:
                    raise InputError(f"snapshot file {path!r} is not a readable .npz archive: array {key!r} claims "
                                     f"shape {tuple(shape)} of {dtype} ({claimed} bytes) but its zip entry holds "
                                     f"{info.file_size} bytes")
    except (zipfile.BadZipFile, ValueError, OSError, EOFError, NotImplementedError) as err:
        if isinstance(err, InputError):
            raise
        raise InputError(f"snapshot file {path!r} is not a readable .npz archive: {err}") from None
    return out


def _check_layout(path: str, headers: dict) -> None:
    """Refuses, from the headers alone, arrays that :func:`load_snapshots` would refuse after loading them."""
    for key in ("with", "without"):
        if key not in headers:
            raise InputError(f"snapshot file {path!r} has no array {key!r} (found: {sorted(headers)})")
    for key in ("with", "without", "candidates", "target"):
        if key not in headers:
            continue
        shape, dtype = headers[key]
        if dtype.hasobject:
            raise InputError(f"{path}:{key} has dtype object: Object arrays cannot be loaded without pickle, which "
                             "is refused (save numbers, not Python objects)")
        if dtype.kind not in _NUMERIC_KINDS:
            what = "complex numbers (the imaginary part would be lost)" if dtype.kind == "c" else "non-numeric data"
            raise InputError(f"{path}:{key} must hold real numbers, got dtype {dtype} ({what})")
        if key != "target" and len(shape) < 2:
            raise InputError(f"{path}:{key} must have at least 2 dimension(s), got shape {shape}")
    if "candidates" in headers and len(headers["candidates"][0]) != 2:
        raise InputError(f"{path}:candidates must have shape (c, d), got {headers['candidates'][0]}")
    if headers["with"][0][1:] != headers["without"][0][1:]:
        raise InputError(f"{path}: 'with' snapshots have shape {headers['with'][0][1:]} per snapshot but "
                         f"'without' have {headers['without'][0][1:]}")
    # Each array is decompressed (its own dtype), then converted to float64 for the checks.
    needed = sum(math.prod(shape) * (dtype.itemsize + (8 if dtype != np.float64 else 0))
                 for key, (shape, dtype) in headers.items() if key in ("with", "without", "candidates"))
    shapes = ", ".join(f"{k} {headers[k][0]} {headers[k][1]}" for k in ("with", "without", "candidates")
                       if k in headers)
    check_fits(f"snapshot file {path!r}", needed, f"its arrays ({shapes}), decompressed and as float64,")


def load_snapshots(path: str | os.PathLike) -> Snapshots:
    """Reads an ``.npz`` snapshot file (see the module docstring).

    The layout (names, dtypes, shapes, sizes) is checked from the headers (:func:`read_npz_headers`) before any
    array is decompressed; only ``with``, ``without``, ``candidates`` and ``target`` are loaded.

    Args:
      path: the ``.npz`` file.

    Returns:
      The :class:`Snapshots` (float64 arrays).

    Raises:
      InputError: missing file, a folder, a FIFO or other non-regular file, a symlink loop, not an ``.npz``
        archive (a raw ``.npy`` included), missing ``with``/``without`` arrays, complex, string or object arrays,
        arrays that are empty, ragged or not finite, ``candidates`` not ``(c, d)``, a non-integer ``target``,
        ``with`` and ``without`` snapshots of different shapes, or arrays too large for the machine's memory.
    """
    path = os.fspath(path)
    headers = read_npz_headers(path)
    _check_layout(path, headers)
    try:
        with open_regular(path, "snapshot file") as fh, np.load(fh, allow_pickle=False) as data:
            contents = {k: np.asarray(data[k]) for k in ("with", "without", "candidates", "target") if k in headers}
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as err:
        raise InputError(f"snapshot file {path!r} is not a readable .npz archive: {err}") from None
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
