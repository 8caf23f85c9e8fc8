"""Helpers shared by the dataset loaders: path and argument checks, seeded sampling, text reading and masking."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence

import numpy as np

from snapaudit_jax.utils.errors import InputError, MissingFileError
from snapaudit_jax.utils.files import read_regular


PathLike = str | os.PathLike


def require_path(path: PathLike, what: str) -> str:
    """The path of the ``what`` data, checked to exist.

    Args:
      path: a file or folder.
      what: the dataset's name, for the messages.

    Returns:
      ``os.fspath(path)``.

    Raises:
      ValueError: if ``path`` is not a string or ``os.PathLike``, or is empty.
      FileNotFoundError: if it does not exist.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise InputError(f"path must be a string or os.PathLike naming the {what} data, got {path!r}")
    path = os.fspath(path)
    if not path:
        raise InputError(f"path must name the {what} data, got ''")
    if not os.path.exists(path):
        raise MissingFileError(f"{what} path {path!r} does not exist")
    return path


def check_seed(seed) -> int:
    """A seed checked to be a non-negative integer.

    Args:
      seed: the seed.

    Returns:
      ``int(seed)``.

    Raises:
      ValueError: for a bool, a non-integer or a negative value.
    """
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise InputError(f"seed must be a non-negative integer, got {seed!r}")
    return int(seed)


def check_optional_count(field: str, value) -> int | None:
    """A count that may be ``None`` (no limit), else an integer >= 1.

    Args:
      field: the argument's name, for the message.
      value: the count or ``None``.

    Returns:
      ``None`` or ``int(value)``.

    Raises:
      ValueError: for a bool, a non-integer or a value < 1.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise InputError(f"{field} must be None or an integer >= 1, got {value!r}")
    return int(value)


def sample_indices(n: int, k: int | None, rng: np.random.Generator) -> list[int]:
    """``k`` of ``range(n)`` without replacement, in increasing order (all of them if ``k`` is None).

    Args:
      n: the population size.
      k: the sample size, or ``None`` for all.
      rng: the random generator.

    Returns:
      ``min(k, n)`` sorted indices.
    """
    if k is None or k >= n:
        return list(range(n))
    return sorted(int(i) for i in rng.choice(n, size=k, replace=False))


def read_bytes(path: str) -> bytes:
    """The bytes of a regular file; a FIFO, socket, device or folder is refused without blocking on it
    (:func:`snapaudit_jax.utils.files.read_regular`).

    Args:
      path: the file.

    Returns:
      Its content.

    Raises:
      InputError: naming the file, for anything but a regular file or a file that cannot be read.
    """
    return read_regular(path, "data file")


def read_text(path: str) -> str:
    """UTF-8, falling back to Latin-1 (which never fails) for files with stray bytes.

    Args:
      path: a text file.

    Returns:
      The decoded text.

    Raises:
      ValueError: naming the file, for anything but a regular file (see :func:`read_bytes`).
    """
    raw = read_bytes(path)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("latin-1")


def read_utf8(path: str) -> str:
    """Strict UTF-8 (the JSON and WikiBio formats are UTF-8); a bad byte is a clear ``ValueError``.

    Args:
      path: a UTF-8 text file (a byte-order mark is skipped).

    Returns:
      The decoded text.

    Raises:
      ValueError: naming the file, for bytes that are not UTF-8 or anything but a regular file.
    """
    raw = read_bytes(path)
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: must be UTF-8 text ({e})") from None


def vocab_of(table: Mapping[str, Sequence[str | None]]) -> dict[str, tuple[str, ...]]:
    """The sorted value vocabulary of each attribute that has a known value.

    Args:
      table: ``{attribute: (m,) values}``, ``None`` for unknown.

    Returns:
      ``{attribute: sorted distinct values}``, without attributes whose values are all ``None``.
    """
    return {k: tuple(sorted({v for v in vals if v is not None})) for k, vals in table.items()
            if any(v is not None for v in vals)}


def mask_words(text: str, words: Sequence[str], replacement: str) -> str:
    """Replaces whole-word, case-insensitive occurrences of each of ``words`` (longest first).

    Args:
      text: the text.
      words: the words to mask (empty ones are ignored).
      replacement: the placeholder, e.g. ``"[NAME]"``.

    Returns:
      The masked text.
    """
    for w in sorted({w for w in words if w}, key=lambda w: (-len(w), w)):
        text = re.sub(r"(?<!\w)" + re.escape(w) + r"(?!\w)", replacement, text, flags=re.IGNORECASE)
    return text


def squash(text: str) -> str:
    """Collapses runs of spaces and tabs and the spaces before punctuation (after masking).

    Args:
      text: the text.

    Returns:
      The text, stripped.
    """
    return re.sub(r"[ \t]+", " ", re.sub(r" +([,.;:!?])", r"\1", text)).strip()
