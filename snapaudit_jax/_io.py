"""Atomic file output: a result file is either complete or absent."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from typing import IO, Any


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write(path: str | os.PathLike, write: Callable[[IO[bytes]], Any]) -> None:
    """Calls ``write(fh)`` on a temporary file next to ``path``, then renames it into place."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    suffix = os.path.splitext(path)[1]
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=suffix, dir=directory)
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # the permissions open() would give, not mkstemp's 0600
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_json(path: str | os.PathLike, obj: Any) -> None:
    """Writes ``obj`` as strict JSON (no NaN/Infinity), atomically."""
    data = (json.dumps(obj, indent=2, allow_nan=False) + "\n").encode()
    atomic_write(path, lambda fh: fh.write(data))


def write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write(path, lambda fh: fh.write(text.encode()))
