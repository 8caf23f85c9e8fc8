"""Atomic file output and the one JSON rule.

A result file is either complete or absent: :func:`atomic_write` writes a
temporary file next to the target and renames it into place. Every JSON file
and every ``--json`` line goes through :func:`to_json`: numpy scalars become
Python numbers, tuples and sets lists, and non-finite floats (``nan``, ``inf``,
``-inf``) ``null``, so the output is strict JSON (RFC 8259) that any reader
accepts. A field that may be infinite documents what its ``null`` means.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import re
import tempfile
from collections.abc import Callable
from typing import IO, Any

import numpy as np

from snapaudit_jax.utils.errors import InputError
from snapaudit_jax.utils.secrets import redact

__all__ = ["PLOT_FORMATS", "JSONRecord", "atomic_write", "check_output_dir", "check_output_file", "dumps",
           "named_os_errors", "save_safetensors", "to_json", "write_json", "write_text"]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write(path: str | os.PathLike, write: Callable[[IO[bytes]], Any]) -> None:
    """Calls ``write(fh)`` on a temporary file next to ``path``, then renames it into place.

    The folder is created if needed; the file gets the permissions :func:`open` would give. On any error the
    temporary file is removed and ``path`` is left as it was.

    Args:
      path: the target file.
      write: ``write(fh)`` writes the content to a binary file object.
    """
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    suffix = os.path.splitext(path)[1]
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=suffix, dir=directory)
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # the permissions open() would give, not mkstemp's 0600
        with named_os_errors(path), os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def named_os_errors(path: str | os.PathLike):
    """Gives an :class:`OSError` raised inside the block without a file name the name ``path``.

    A full disk, a quota or a file size limit reached by ``write`` raises an error without a file name; with it,
    the message says which file could not be written: ``[Errno 28] No space left on device: 'path'``.

    Args:
      path: the file the block writes.

    Yields:
      Nothing; the block runs.

    Raises:
      OSError: of the same class and errno, with ``filename = path`` when it had none.
    """
    try:
        yield
    except OSError as err:
        if err.filename is not None or err.errno is None:
            raise
        raise type(err)(err.errno, err.strerror, os.fspath(path)) from None


_OS_ERROR = re.compile(r"os error (\d+)\)?\s*$")


def save_safetensors(tensors: dict[str, np.ndarray], path: str | os.PathLike, metadata: dict | None = None) -> None:
    """``safetensors.numpy.save_file`` then ``fsync``, its I/O failures raised as :class:`OSError` naming ``path``.

    safetensors reports a failed write (a full disk, a quota, a file size limit) as its own ``SafetensorError``
    with the operating system's error code in the text; this raises that code as ``OSError(errno, strerror,
    path)`` instead, which every command reports as a clean error naming the file.

    Args:
      tensors: name -> array.
      path: the file written (not atomically: callers write into a temporary folder or file and rename it; a
        failed write's partial file is removed).
      metadata: the header's string metadata.

    Raises:
      OSError: the file could not be written, with its errno and ``path``.
    """
    from safetensors.numpy import save_file

    path = os.fspath(path)
    try:
        save_file(tensors, path, metadata=metadata)
    except Exception as err:  # safetensors' SafetensorError derives from Exception only
        found = _OS_ERROR.search(str(err)) if type(err).__name__ == "SafetensorError" else None
        if found is None:
            raise
        code = int(found.group(1))
        with contextlib.suppress(OSError):
            os.unlink(path)  # the partial file
        raise OSError(code, os.strerror(code), path) from None
    with named_os_errors(path), open(path, "rb+") as fh:
        os.fsync(fh.fileno())


def to_json(obj: Any) -> Any:
    """The strict-JSON form of ``obj`` (the project's one rule for numbers).

    Args:
      obj: nested dicts, lists, tuples and sets of numbers, strings, booleans, ``None`` and numpy scalars or
        0-d arrays.

    Returns:
      A copy made of JSON types: dict keys as strings, numpy scalars as Python numbers, tuples and sets as lists,
      non-finite floats as ``None``.

    Raises:
      TypeError: a value JSON has no form for (an object, a non-scalar array).
    """
    if isinstance(obj, dict):
        return {str(k): to_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_json(v) for v in obj]
    if isinstance(obj, (set, frozenset)):
        return [to_json(v) for v in sorted(obj, key=repr)]
    if isinstance(obj, np.ndarray) and obj.ndim == 0:
        obj = obj.item()
    if isinstance(obj, (bool, np.bool_)):
        return bool(obj)
    if isinstance(obj, (int, np.integer)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        x = float(obj)
        return x if math.isfinite(x) else None
    if obj is None or isinstance(obj, str):
        return obj
    raise TypeError(f"to_json: no JSON form for {type(obj).__name__} {obj!r:.80}")


def dumps(obj: Any, **kwargs) -> str:
    """``json.dumps(to_json(obj))``, strict (``allow_nan=False``), registered secrets redacted
    (:func:`snapaudit_jax.utils.secrets.redact`).

    Args:
      obj: anything :func:`to_json` accepts.
      **kwargs: passed to :func:`json.dumps`.

    Returns:
      The JSON text.

    Raises:
      TypeError: a value JSON has no form for.
    """
    return redact(json.dumps(to_json(obj), allow_nan=False, **kwargs))


def write_json(path: str | os.PathLike, obj: Any) -> None:
    """Writes :func:`to_json` of ``obj`` (indented strict JSON, trailing newline) to ``path``, atomically.

    Args:
      path: the output file.
      obj: anything :func:`to_json` accepts.

    Raises:
      TypeError: a value JSON has no form for.
    """
    data = (dumps(obj, indent=2) + "\n").encode()
    atomic_write(path, lambda fh: fh.write(data))


def write_text(path: str | os.PathLike, text: str) -> None:
    """Writes ``text`` (UTF-8) to ``path``, atomically, registered secrets redacted.

    Args:
      path: the output file.
      text: the content.
    """
    data = redact(text).encode()
    atomic_write(path, lambda fh: fh.write(data))


# Formats every matplotlib Agg build writes without extra software (pgf needs LaTeX; raw/rgba are buffers).
PLOT_FORMATS = ("png", "pdf", "svg", "svgz", "eps", "ps", "jpg", "jpeg", "tif", "tiff", "webp")


def _nearest_existing(path: str) -> str:
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    return parent


def _probe_writable(name: str, directory: str, what: str) -> None:
    """Creates and removes a temporary file in ``directory``: the only test that also holds on /proc or as root."""
    if not os.path.isdir(directory):
        raise InputError(f"{name}: {what} must be in a folder, but {directory!r} is not a folder")
    try:
        fd, tmp = tempfile.mkstemp(prefix=".probe-", dir=directory)
    except OSError as err:
        raise InputError(f"{name}: {what} must be writable, but {directory!r} refuses new files "
                         f"({err.strerror or err})") from None
    os.close(fd)
    os.unlink(tmp)


def _check_name_lengths(name: str, path: str, existing: str) -> None:
    """Refuses a path component the file system cannot hold (``PC_NAME_MAX``, 255 bytes on most) or a path longer
    than ``PC_PATH_MAX``, so that a long ``--out`` fails before the work instead of with ``ENAMETOOLONG`` after it."""
    full = os.path.abspath(path)
    try:
        name_max = os.pathconf(existing, "PC_NAME_MAX")
        path_max = os.pathconf(existing, "PC_PATH_MAX")
    except (OSError, ValueError):  # the platform does not say: nothing to refuse here
        return
    below = os.path.relpath(full, os.path.abspath(existing))
    for part in [] if below == os.curdir else below.split(os.sep):
        size = len(os.fsencode(part))
        if name_max > 0 and size > name_max:
            shown = part if len(part) <= 60 else f"{part[:30]}...{part[-10:]}"
            raise InputError(f"{name}: each name in the path must be at most {name_max} bytes on this file system "
                             f"(NAME_MAX), got {size} bytes in {shown!r}")
    if path_max > 0 and len(os.fsencode(full)) >= path_max:
        raise InputError(f"{name}: the path must be shorter than {path_max} bytes (PATH_MAX), got "
                         f"{len(os.fsencode(full))} bytes")


def check_output_file(name: str, path: str | os.PathLike, suffixes: tuple[str, ...]) -> str:
    """Refuses an output file that could not be written, before any work (nothing is created).

    Args:
      name: the flag or config key, named in the error (e.g. ``"--out"``).
      path: the file to be written later (its folder may not exist yet: it is created then).
      suffixes: allowed suffixes without the dot (case-insensitive).

    Returns:
      The suffix in lower case (the format to write).

    Raises:
      InputError: a folder path, a wrong suffix, a name longer than the file system allows, or a location that
        refuses new files.
    """
    path = os.fspath(path)
    suffix = os.path.splitext(path)[1].lower().lstrip(".")
    if not path or path.endswith(os.sep) or os.path.isdir(path):
        raise InputError(f"{name}: must be a file path, got the folder {path!r}")
    if suffix not in suffixes:
        raise InputError(f"{name}: must end in {', '.join('.' + s for s in suffixes)}, got {path!r}")
    existing = _nearest_existing(path)
    _check_name_lengths(name, path, existing)
    _probe_writable(name, existing, "the output file's folder")
    return suffix


def check_output_dir(name: str, path: str | os.PathLike) -> None:
    """Refuses an output folder that could not be created or written, before any work (nothing is created).

    Args:
      name: the flag or config key, named in the error (e.g. ``"--out"``).
      path: the folder to be written later (it may not exist yet).

    Raises:
      InputError: an empty ``path``, an existing file, a dangling symbolic link (``path`` or an ancestor; the
        target named), a name longer than the file system allows, or a nearest existing ancestor that refuses new
        files.
    """
    path = os.fspath(path)
    if not path:
        raise InputError(f"{name}: must be a folder path, got ''")
    broken = _dangling_link(path)
    if broken is not None:
        what = "is" if broken == path else f"lies under {broken!r}, which is"
        raise InputError(f"{name}: {path!r} {what} a symbolic link to {os.readlink(broken)!r}, which does not exist "
                         f"(or loops); create its target or choose another {name}")
    if os.path.exists(path) and not os.path.isdir(path):
        raise InputError(f"{name}: must be a folder, but {path!r} is a file")
    target = path if os.path.isdir(path) else _nearest_existing(os.path.join(path, "x"))
    _check_name_lengths(name, path, target)
    _probe_writable(name, target, "the output folder")


def _dangling_link(path: str) -> str | None:
    """The first of ``path`` and its ancestors that is a symbolic link whose target does not resolve, or None."""
    current = os.path.abspath(path)
    while True:
        if os.path.islink(current) and not os.path.exists(current):
            return path if current == os.path.abspath(path) else current
        parent = os.path.dirname(current)
        if parent == current:
            return None
        current = parent


class JSONRecord:
    """Mixin of a dataclass record written as strict JSON: :meth:`to_dict` and :meth:`to_json`."""

    def to_dict(self) -> dict[str, Any]:
        """Every field in strict-JSON form (:func:`to_json`: non-finite numbers ``None``, tuples lists)."""
        return to_json(dataclasses.asdict(self))

    def to_json(self, **kwargs) -> str:
        """:meth:`to_dict` as a strict JSON string.

        Args:
          **kwargs: passed to :func:`json.dumps` (e.g. ``indent``).

        Returns:
          The JSON text.
        """
        return dumps(self.to_dict(), **kwargs)
