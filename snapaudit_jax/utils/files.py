"""Reading the files a user names: regular files only, checked before they are opened.

Every path a command reads on the user's behalf (configurations, data and held-out files, snapshots, model
folders' files, attack inputs) goes through this module, so that no input can block or run without end:

1. the path is resolved with :func:`os.stat` (symlinks followed; a loop, a missing target or a dangling link is
   refused with what it points to), and anything but a regular file (folder, FIFO, socket, character or block
   device) is refused *without opening it* (opening a FIFO blocks until a writer comes; reading ``/dev/zero``
   never ends; opening some devices has side effects);
2. the file is then opened with ``O_NONBLOCK`` and checked again on the open descriptor (``fstat``), so a path
   swapped for a FIFO between the two steps is refused, not waited on;
3. a size limit, where the caller gives one (configurations, JSON sidecars), is checked on the descriptor and
   enforced while reading (a file that grows past it is refused, not read to the end).

Errors name the field (``data.path``), the path, the rule and what was found, as :class:`InputError` (or the
caller's subclass).
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import stat
from typing import BinaryIO

from snapaudit_jax.utils.errors import InputError

__all__ = ["JSON_MAX_BYTES", "check_regular_file", "open_regular", "read_regular", "read_regular_text", "sha256_file"]

_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))

_CHUNK = 1 << 20

JSON_MAX_BYTES = 64 << 20
"""The largest JSON file of a model folder read (64 MiB; a large vocabulary's tokenizer.json is ~20 MiB)."""


def _label(path: str, what: str, field: str | None) -> str:
    return f"{field}: {path}" if field else path


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a plain file")


def _stat_error(path: str, what: str, field: str | None, err: OSError, error: type[InputError]) -> InputError:
    where = _label(path, what, field)
    if err.errno == errno.ELOOP:
        return error(f"{where}: cannot read the {what}: it is a symlink loop (too many levels of symbolic links)")
    if err.errno in (errno.ENOENT, errno.ENOTDIR):
        if os.path.islink(path):
            return error(f"{where}: cannot read the {what}: it is a symbolic link to {os.readlink(path)!r}, which "
                         "does not exist")
        return error(f"{where}: cannot read the {what}: it does not exist")
    return error(f"{where}: cannot read the {what} ({err.strerror or err})")


def check_regular_file(path: str | os.PathLike, what: str, error: type[InputError] = InputError, *,
                       field: str | None = None, max_bytes: int | None = None) -> int:
    """Refuses, without opening it, a path that is not an existing regular file (symlinks are followed).

    For a path handed to a library that opens it itself (safetensors, a tokenizer); code that reads the file uses
    :func:`open_regular`, which checks again on the open descriptor.

    Args:
      path: the file.
      what: what the file is, in the message (``"configuration"``, ``"snapshot file"``).
      error: the exception class raised.
      field: the configuration key or flag that named the path (``"data.path"``), first in the message.
      max_bytes: the largest size accepted, or ``None``.

    Returns:
      The file's size in bytes.

    Raises:
      InputError: (of class ``error``) a missing path or dangling symlink, a symlink loop, a folder, a FIFO,
        socket or device, or a file larger than ``max_bytes``.
    """
    path = os.fspath(path)
    try:
        st = os.stat(path)
    except OSError as err:
        raise _stat_error(path, what, field, err, error) from None
    _check_mode(path, what, field, st, error, max_bytes)
    return st.st_size


def _check_mode(path, what, field, st: os.stat_result, error, max_bytes) -> None:
    where = _label(path, what, field)
    if stat.S_ISDIR(st.st_mode):
        raise error(f"{where}: the {what} is a folder, not a file")
    if not stat.S_ISREG(st.st_mode):
        raise error(f"{where}: the {what} must be a regular file, got {_kind(st.st_mode)} (not opened)")
    if max_bytes is not None and st.st_size > max_bytes:
        raise error(f"{where}: the {what} must be at most {max_bytes} bytes, got {st.st_size}")


def open_regular(path: str | os.PathLike, what: str, error: type[InputError] = InputError, *,
                 field: str | None = None, max_bytes: int | None = None) -> BinaryIO:
    """Opens a regular file for reading in binary mode, after the checks of :func:`check_regular_file`.

    Args:
      path, what, error, field, max_bytes: as :func:`check_regular_file`.

    Returns:
      The open file (the caller closes it; a ``with`` block does).

    Raises:
      InputError: as :func:`check_regular_file`, also when the path became something else between the check and
        the open; or the file cannot be opened (permissions), naming the cause.
    """
    path = os.fspath(path)
    check_regular_file(path, what, error, field=field, max_bytes=max_bytes)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as err:
        raise _stat_error(path, what, field, err, error) from None
    try:
        _check_mode(path, what, field, os.fstat(fd), error, max_bytes)
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        fcntl.fcntl(fd, fcntl.F_SETFL, flags & ~os.O_NONBLOCK)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: str | os.PathLike, what: str, error: type[InputError] = InputError, *,
                 field: str | None = None, max_bytes: int | None = None) -> bytes:
    """The bytes of a regular file (see :func:`open_regular`); a file growing past ``max_bytes`` is refused.

    Args:
      path, what, error, field, max_bytes: as :func:`check_regular_file`.

    Returns:
      The file's content.

    Raises:
      InputError: as :func:`open_regular`; a read error, naming the cause.
    """
    with open_regular(path, what, error, field=field, max_bytes=max_bytes) as fh:
        try:
            data = fh.read() if max_bytes is None else fh.read(max_bytes + 1)
        except OSError as err:
            raise error(f"{_label(os.fspath(path), what, field)}: cannot read the {what} "
                        f"({err.strerror or err})") from None
    if max_bytes is not None and len(data) > max_bytes:
        raise error(f"{_label(os.fspath(path), what, field)}: the {what} must be at most {max_bytes} bytes; it grew "
                    "past that while being read")
    return data


def read_regular_text(path: str | os.PathLike, what: str, error: type[InputError] = InputError, *,
                      field: str | None = None, max_bytes: int | None = None) -> str:
    """The UTF-8 text of a regular file (a leading byte-order mark dropped); other encodings are refused.

    Args:
      path, what, error, field, max_bytes: as :func:`check_regular_file`.

    Returns:
      The decoded text.

    Raises:
      InputError: as :func:`read_regular`; the bytes are not UTF-8 (the offset is named).
    """
    raw = read_regular(path, what, error, field=field, max_bytes=max_bytes)
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise error(f"{_label(os.fspath(path), what, field)}: the {what} is not UTF-8 text (byte {err.start})") \
            from None


def sha256_file(path: str | os.PathLike, what: str, error: type[InputError] = InputError, *,
                field: str | None = None) -> str:
    """The SHA-256 hex digest of a regular file's bytes, read in 1 MiB blocks (see :func:`open_regular`).

    Args:
      path, what, error, field: as :func:`check_regular_file`.

    Returns:
      64 hex digits.

    Raises:
      InputError: as :func:`open_regular`; a read error, naming the cause.
    """
    h = hashlib.sha256()
    with open_regular(path, what, error, field=field) as fh:
        try:
            for block in iter(lambda: fh.read(_CHUNK), b""):
                h.update(block)
        except OSError as err:
            raise error(f"{_label(os.fspath(path), what, field)}: cannot read the {what} "
                        f"({err.strerror or err})") from None
    return h.hexdigest()
