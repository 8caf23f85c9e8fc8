"""Reading TOML run configurations: every error names ``section.key``, the rule and the value.

A section is read by popping its keys with :func:`take` and a converter
(:func:`choice`, :func:`choices`, :func:`boolean`, :func:`string`,
:func:`number_list`, :func:`pos_int` or any callable that raises
:class:`ValueError`), then :func:`reject_unknown` refuses what is left.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib

from snapaudit_jax.utils import validate
from snapaudit_jax.utils.errors import ConfigFileError, InputError
from snapaudit_jax.utils.files import check_regular_file, read_regular

CONFIG_MAX_BYTES = 1 << 20
"""The largest TOML configuration read (1 MiB; the shipped ones are a few KiB)."""

__all__ = ["ConfigFileError", "check_regular_file", "read_toml", "table", "take", "choice", "choices", "pos_int",
           "boolean", "string", "number_list", "reject_unknown", "dataclass_section"]


def read_toml(path: str | os.PathLike) -> dict:
    """Reads and parses a TOML file.

    The file must be a regular file of at most :data:`CONFIG_MAX_BYTES` (a FIFO, socket or device is refused
    without being opened, so nothing blocks; see :mod:`snapaudit_jax.utils.files`) and UTF-8 text, as TOML
    requires (a UTF-16 file is named as such).

    Args:
      path: the file.

    Returns:
      The parsed document as a dict.

    Raises:
      ConfigFileError: the file does not exist, is a symlink loop, is not a regular file, is too large, cannot be
        read, is not UTF-8, or is not valid TOML.
    """
    path = os.fspath(path)
    data = read_regular(path, "configuration", ConfigFileError, max_bytes=CONFIG_MAX_BYTES)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        bom = {b"\xff\xfe": "UTF-16 (little-endian)", b"\xfe\xff": "UTF-16 (big-endian)"}.get(data[:2])
        found = f"it is {bom} text" if bom else f"byte {err.start} (0x{data[err.start]:02x}) is not UTF-8"
        raise ConfigFileError(f"{path}: a TOML configuration must be UTF-8 text, but {found}; save it as UTF-8") \
            from None
    try:
        return tomllib.loads(text.removeprefix("\ufeff"))  # a UTF-8 byte-order mark is harmless
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


def _tuples(value):
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def dataclass_section(default, body, where: str):
    """A TOML table read into a frozen dataclass section: ``dataclasses.replace(default, **body)``, then ``validate()``.

    A list becomes a tuple (nested lists nested tuples), and a string is refused where the default is a tuple; a key
    whose default is a bool or a str must be given one (TOML's integers are not booleans here). Anything else is
    left to the section's ``validate()``.

    Args:
      default: the section's defaults (a dataclass instance with a ``validate()`` returning the instance and
        raising :class:`ValueError` / :class:`InputError` whose message starts with the field's name).
      body: the parsed table.
      where: the section's dotted name, used in errors.

    Returns:
      The validated section.

    Raises:
      ConfigFileError: ``body`` not a table, an unknown key, a value of the wrong kind or one breaking its rule
        (``where: <the rule and the value> (where.key)``; without the key for a rule over several keys).
    """
    if not isinstance(body, dict):
        raise ConfigFileError(f"{where}: must be a table ([{where}]), got {body!r}")
    names = [f.name for f in dataclasses.fields(default)]
    unknown = sorted(set(body) - set(names))
    if unknown:
        raise ConfigFileError(f"{where}: unknown key(s) {', '.join(unknown)} (allowed: {', '.join(sorted(names))})")
    values = {}
    for key, value in body.items():
        kind = type(getattr(default, key))
        if kind is tuple:
            if isinstance(value, str):
                raise ConfigFileError(f"{where}.{key}: must be a list, got {value!r}")
            value = _tuples(value)
        elif kind is bool and not isinstance(value, bool):
            raise ConfigFileError(f"{where}.{key}: must be true or false, got {value!r}")
        elif kind is str and not isinstance(value, str):
            raise ConfigFileError(f"{where}.{key}: must be a string, got {value!r}")
        values[key] = value
    try:
        return dataclasses.replace(default, **values).validate()
    except (TypeError, ValueError) as err:
        msg = str(err)
        field = msg.split(" ", 1)[0].split("[", 1)[0].rstrip(":")
        raise ConfigFileError(f"{where}: {msg}" + (f" ({where}.{field})" if field in names else "")) from None
