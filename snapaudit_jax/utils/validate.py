"""Validation of user input at the Python boundary.

Every check returns the converted value or raises
:class:`~snapaudit_jax.utils.errors.InputError` naming the field, the rule and
the value.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from snapaudit_jax.utils.errors import InputError

__all__ = ["choice", "finite_array", "nonnegative_float", "open_unit", "positive_float", "positive_int",
           "unit_closed_open"]


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


def positive_int(name: str, value: Any, *, minimum: int = 1) -> int:
    """An integer ``>= minimum``; integral floats such as ``3.0`` are accepted.

    Args:
      name: the field named in errors.
      value: the value (a bool is refused).
      minimum: the smallest allowed value (default 1).

    Returns:
      ``value`` as an int.

    Raises:
      InputError: not an integer (or an integral float), or ``< minimum``.
    """
    if isinstance(value, bool):
        raise InputError(f"{name} must be an integer >= {minimum}, got {value!r}")
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, (int, np.integer)):
        raise InputError(f"{name} must be an integer >= {minimum}, got {value!r}")
    if value < minimum:
        raise InputError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


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
      InputError: ragged or non-numeric input, fewer than ``ndim_min`` dimensions, no elements, or a nan/inf entry
        (the message gives its index).
    """
    try:
        arr = np.asarray(value, dtype=dtype)
    except (TypeError, ValueError) as err:
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
