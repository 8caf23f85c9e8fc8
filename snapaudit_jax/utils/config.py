"""Reading TOML run configurations: every error names ``section.key``, the rule and the value.

A section is read by popping its keys with :func:`take` and a converter
(:func:`choice`, :func:`choices`, :func:`boolean`, :func:`string`,
:func:`number_list`, :func:`pos_int` or any callable that raises
:class:`ValueError`), then :func:`reject_unknown` refuses what is left.
"""

from __future__ import annotations

import os
import tomllib

from snapaudit_jax.utils import validate
from snapaudit_jax.utils.errors import ConfigFileError, InputError

__all__ = ["ConfigFileError", "read_toml", "table", "take", "choice", "choices", "pos_int", "boolean", "string",
           "number_list", "reject_unknown"]


def read_toml(path: str | os.PathLike) -> dict:
    """Reads and parses a TOML file.

    Args:
      path: the file.

    Returns:
      The parsed document as a dict.

    Raises:
      ConfigFileError: the file cannot be read or is not valid TOML.
    """
    path = os.fspath(path)
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except OSError as err:
        raise ConfigFileError(f"{path}: cannot read the configuration ({err.strerror})") from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigFileError(f"{path}: invalid TOML ({err})") from None


def table(parent: dict, key: str, where: str, default=None) -> dict | None:
    """Pops the sub-table ``key`` of ``parent`` as a new dict.

    Args:
      parent: the enclosing table (modified: ``key`` is removed).
      key: the sub-table's key.
      where: the table's dotted name, used in errors.
      default: returned when ``key`` is absent.

    Returns:
      A copy of the sub-table, or ``default``.

    Raises:
      ConfigFileError: the value is not a table.
    """
    if key not in parent:
        return default
    value = parent.pop(key)
    if not isinstance(value, dict):
        raise ConfigFileError(f"{where}: must be a table ([{where}]), got {value!r}")
    return dict(value)


def take(section: dict, key: str, where: str, convert, default):
    """Pops ``key`` from ``section`` and converts it.

    Args:
      section: the table (modified: ``key`` is removed).
      key: the key.
      where: the section's dotted name; errors name ``where.key``.
      convert: the converter; a :class:`TypeError` or :class:`ValueError` it raises becomes a
        :class:`ConfigFileError`.
      default: returned (unconverted) when ``key`` is absent.

    Returns:
      The converted value, or ``default``.

    Raises:
      ConfigFileError: the conversion failed.
    """
    if key not in section:
        return default
    value = section.pop(key)
    try:
        return convert(value)
    except (TypeError, ValueError) as err:
        raise ConfigFileError(f"{where}.{key}: {err}") from None


def choice(options):
    """A converter that accepts one of ``options``.

    Args:
      options: the allowed values.

    Returns:
      ``convert(value) -> value``, raising :class:`InputError` for a value not in ``options``.
    """
    def convert(value):
        if value not in options:
            raise InputError(f"must be one of {', '.join(map(repr, options))}, got {value!r}")
        return value

    return convert


def choices(options):
    """A converter that accepts a non-empty list of values from ``options``.

    Args:
      options: the allowed values.

    Returns:
      ``convert(values) -> tuple``, raising :class:`InputError` for a non-list, an empty list or a value not in
      ``options``.
    """
    def convert(values):
        if isinstance(values, str) or not isinstance(values, list) or not values:
            raise InputError(f"must be a non-empty list of {', '.join(map(repr, options))}, got {values!r}")
        return tuple(choice(options)(v) for v in values)

    return convert


def boolean(value):
    """Converts TOML ``true``/``false`` only (``bool("no")`` would be ``True``).

    Args:
      value: the TOML value.

    Returns:
      ``value``, a bool.

    Raises:
      InputError: ``value`` is not a bool.
    """
    if not isinstance(value, bool):
        raise InputError(f"must be true or false, got {value!r}")
    return value


def string(value):
    """Converts a non-empty string (``str(5)`` would silently be ``"5"``).

    Args:
      value: the TOML value.

    Returns:
      ``value``, unchanged.

    Raises:
      InputError: ``value`` is not a string or is blank.
    """
    if not isinstance(value, str) or not value.strip():
        raise InputError(f"must be a non-empty string, got {value!r}")
    return value


def number_list(convert):
    """A converter for a non-empty list, each entry passed through ``convert``.

    Args:
      convert: the converter of one entry.

    Returns:
      ``check(values) -> tuple``, raising :class:`InputError` for a string, bool, non-list or empty list (and
      whatever ``convert`` raises).
    """
    def check(values):
        if isinstance(values, (str, bool)) or not isinstance(values, list) or not values:
            raise InputError(f"must be a non-empty list of numbers, got {values!r}")
        return tuple(convert(v) for v in values)

    return check


def pos_int(name, minimum=1):
    """A converter for an integer ``>= minimum``.

    Args:
      name: the field named in errors.
      minimum: the smallest allowed value.

    Returns:
      ``convert(value) -> int`` (:func:`snapaudit_jax.utils.validate.positive_int`), raising :class:`InputError`.
    """
    return lambda v: validate.positive_int(name, v, minimum=minimum)


def reject_unknown(section: dict, where: str):
    """Refuses the keys left in ``section`` after every known key was taken.

    Args:
      section: the remaining table.
      where: the section's dotted name, used in the error.

    Raises:
      ConfigFileError: ``section`` is not empty (the message lists the unknown keys).
    """
    if section:
        raise ConfigFileError(f"{where}: unknown key(s) {', '.join(sorted(section))}")
