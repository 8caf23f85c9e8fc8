"""Validation of user input at the Python boundary.

Every check returns the converted value or raises
:class:`~snapaudit_jax.utils.errors.InputError` naming the field, the rule and
the value.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from snapaudit_jax.utils.errors import InputError

__all__ = ["NAME_PATTERN", "SEED_MAX", "choice", "confidence", "file_name", "finite_array", "nonnegative_float",
           "open_unit", "positive_float", "positive_int", "seed", "unit_closed_open", "utf8_text"]

# Seeds go to jax.random.key, which takes a signed 64-bit integer, and to numpy.random.default_rng, which takes
# any integer >= 0: the range both accept.
SEED_MAX = 2**63 - 1
# A name the run writes into file names (a cpa attacker's ``alpha_dial_<name>.png``): a letter or digit, then
# letters, digits, '_', '.', '-'; at most 64 characters, so every derived file name stays far below the 255
# bytes of a path component (NAME_MAX) and no name is '.', '..', hidden, or holds a separator.
NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}"


def _as_float(name: str, value: Any) -> float:
    if isinstance(value, bool):
        raise InputError(f"{name} must be a number, got {value!r}")
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise InputError(f"{name} must be a number, got {value!r}") from None
    if math.isnan(out):
        raise InputError(f"{name} must be a number, got nan")
    return out


def positive_float(name: str, value: Any, *, allow_inf: bool = False) -> float:
    """A finite number ``> 0`` (``inf`` too if ``allow_inf``).

    Args:
      name: the field named in errors.
      value: the value (a bool is refused).
      allow_inf: accept ``inf``.

    Returns:
      ``value`` as a float.

    Raises:
      InputError: not a number, nan, ``<= 0``, or ``inf`` when not allowed.
    """
    out = _as_float(name, value)
    if not out > 0.0 or (math.isinf(out) and not allow_inf):
        raise InputError(f"{name} must be a finite number > 0, got {value!r}")
    return out


def nonnegative_float(name: str, value: Any, *, allow_inf: bool = False) -> float:
    """A finite number ``>= 0`` (``inf`` too if ``allow_inf``).

    Args:
      name: the field named in errors.
      value: the value (a bool is refused).
      allow_inf: accept ``inf``.

    Returns:
      ``value`` as a float.

    Raises:
      InputError: not a number, nan, ``< 0``, or ``inf`` when not allowed.
    """
    out = _as_float(name, value)
    if out < 0.0 or (math.isinf(out) and not allow_inf):
        raise InputError(f"{name} must be a finite number >= 0, got {value!r}")
    return out


def open_unit(name: str, value: Any) -> float:
    """A number in the open interval ``(0, 1)`` (a probability such as ``delta``, ``alpha`` or a confidence).

    Args:
      name: the field named in errors.
      value: the value (a bool is refused).

    Returns:
      ``value`` as a float.

    Raises:
      InputError: not a number, nan, or outside ``(0, 1)``.
    """
    out = _as_float(name, value)
    if not 0.0 < out < 1.0:
        raise InputError(f"{name} must be in (0, 1), got {value!r}")
    return out


def confidence(name: str, value: Any) -> float:
    """A confidence level in ``(0, 1)`` whose complement ``alpha = 1 - confidence`` is also in ``(0, 1)`` in
    float64 (a confidence below ``2**-53``, a subnormal say, would make ``alpha`` round to exactly 1).

    Args:
      name: the field named in errors.
      value: the value (a bool is refused).

    Returns:
      ``value`` as a float.

    Raises:
      InputError: not a number in ``(0, 1)``, or one whose ``1 - value`` rounds to 1.
    """
    out = open_unit(name, value)
    if not 0.0 < 1.0 - out < 1.0:
        raise InputError(f"{name} must be in (0, 1) with alpha = 1 - {name} in (0, 1) too, but 1 - {value!r} rounds "
                         f"to {1.0 - out!r} in float64")
    return out


def unit_closed_open(name: str, value: Any) -> float:
    """A number in ``[0, 1)`` (e.g. a ``delta`` where 0, a pure claim, is allowed).

    Args:
      name: the field named in errors.
      value: the value (a bool is refused).

    Returns:
      ``value`` as a float.

    Raises:
      InputError: not a number, nan, or outside ``[0, 1)``.
    """
    out = nonnegative_float(name, value)
    if not out < 1.0:
        raise InputError(f"{name} must be in [0, 1), got {value!r}")
    return out


def positive_int(name: str, value: Any, *, minimum: int = 1, maximum: int | None = None) -> int:
    """An integer ``>= minimum`` (and ``<= maximum`` if given); integral floats such as ``3.0`` are accepted up to
    ``2**53`` in magnitude (beyond, a float is not an exact integer).

    Args:
      name: the field named in errors.
      value: the value (a bool is refused).
      minimum: the smallest allowed value (default 1).
      maximum: the largest allowed value, or ``None``.

    Returns:
      ``value`` as an int.

    Raises:
      InputError: not an integer (or an integral float), ``< minimum`` or ``> maximum``.
    """
    rule = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
    if isinstance(value, bool):
        raise InputError(f"{name} must be an integer {rule}, got {value!r}")
    if isinstance(value, float) and value.is_integer():
        if abs(value) > 2.0**53:  # past 2**53 a float is no exact integer (1e308 would become a 309-digit int)
            raise InputError(f"{name} must be an integer {rule}, got {value!r} (a float beyond 2**53 is not an "
                             "exact integer)")
        value = int(value)
    if not isinstance(value, (int, np.integer)):
        raise InputError(f"{name} must be an integer {rule}, got {value!r}")
    if value < minimum or (maximum is not None and value > maximum):
        raise InputError(f"{name} must be an integer {rule}, got {value!r}")
    return int(value)


def seed(name: str, value: Any) -> int:
    """A PRNG seed: an integer in ``[0, SEED_MAX]`` (``SEED_MAX = 2**63 - 1``, what ``jax.random.key`` takes).

    Args:
      name: the field named in errors.
      value: the value (a bool is refused; integral floats such as ``3.0`` are accepted).

    Returns:
      ``value`` as an int.

    Raises:
      InputError: not an integer, negative, or above ``SEED_MAX``.
    """
    try:
        out = positive_int(name, value, minimum=0)
    except InputError:
        out = None
    if out is None or out > SEED_MAX:
        raise InputError(f"{name} must be an integer in [0, 2**63 - 1] (a 64-bit seed), got {value!r}")
    return out


def file_name(name: str, value: Any) -> str:
    """A name the run uses in file names: it must match :data:`NAME_PATTERN`.

    Args:
      name: the field named in errors.
      value: the value.

    Returns:
      ``value``, unchanged.

    Raises:
      InputError: not a string, or not 1 to 64 letters, digits, ``_``, ``.`` and ``-`` starting with a letter or
        digit.
    """
    if not isinstance(value, str) or not re.fullmatch(NAME_PATTERN, value):
        shown = value if not isinstance(value, str) or len(value) <= 80 else f"{value[:40]}...({len(value)} chars)"
        raise InputError(f"{name} must be 1 to 64 letters, digits, '_', '.' or '-' starting with a letter or digit "
                         f"(it names output files), got {shown!r}")
    return value


def utf8_text(name: str, value: str) -> str:
    """A text that is valid Unicode (encodable as UTF-8).

    A command-line argument holding bytes that are not UTF-8 reaches Python as lone surrogates
    (``surrogateescape``); no tokenizer can encode them.

    Args:
      name: the flag or field named in errors.
      value: the text.

    Returns:
      ``value``, unchanged.

    Raises:
      InputError: ``value`` holds a lone surrogate (the message gives its position and the original byte).
    """
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as err:
        char = value[err.start]
        byte = f"byte 0x{ord(char) - 0xDC00:02x}" if 0xDC80 <= ord(char) <= 0xDCFF else f"U+{ord(char):04X}"
        raise InputError(f"{name} must be valid UTF-8 text, but character {err.start} is not ({byte}, not "
                         "UTF-8-encoded input)") from None
    return value


def choice(name: str, value: Any, options: Sequence[str]) -> str:
    """One of ``options``.

    Args:
      name: the field named in errors.
      value: the value.
      options: the allowed values.

    Returns:
      ``value``, unchanged.

    Raises:
      InputError: ``value`` is not in ``options`` (the message lists them).
    """
    if value not in options:
        raise InputError(f"{name} must be one of {', '.join(map(repr, options))}, got {value!r}")
    return value


def finite_array(name: str, value: Any, *, ndim_min: int = 1, dtype=np.float64) -> np.ndarray:
    """Converts to a non-empty, non-ragged, finite float array.

    Args:
      name: the field named in errors.
      value: array-like.
      ndim_min: the smallest allowed number of dimensions.
      dtype: the result's dtype (default float64).

    Returns:
      The array (:func:`numpy.asarray` of ``value``, so possibly not a copy).

    Raises:
      InputError: ragged, complex or non-numeric input (strings, objects: never cast), fewer than ``ndim_min``
        dimensions, no elements, or a nan/inf entry (the message gives its index).
    """
    try:
        raw = np.asarray(value)
        # A cast never drops an imaginary part or parses text: only booleans, integers and reals are numbers here.
        if raw.dtype.kind not in "biuf":
            what = "complex" if raw.dtype.kind == "c" else f"non-numeric ({raw.dtype})"
            raise InputError(f"{name} must be a rectangular array of real numbers, got {what} input "
                             "(ragged or non-numeric input)")
        arr = np.asarray(raw, dtype=dtype)
    except (TypeError, ValueError) as err:
        if isinstance(err, InputError):
            raise
        raise InputError(f"{name} must be a rectangular numeric array (ragged or non-numeric input): {err}") from None
    if arr.ndim < ndim_min:
        raise InputError(f"{name} must have at least {ndim_min} dimension(s), got shape {arr.shape}")
    if arr.size == 0:
        raise InputError(f"{name} must not be empty, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        bad = np.argwhere(~np.isfinite(arr))[0]
        index = tuple(int(i) for i in bad)
        raise InputError(f"{name} must be finite (no nan/inf), found {arr[index]} at index {index}")
    return arr
