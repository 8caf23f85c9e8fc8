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
    """The parsed TOML file; unreadable or invalid files raise :class:`ConfigFileError`."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except OSError as err:
        raise ConfigFileError(f"{path}: cannot read the configuration ({err.strerror})") from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigFileError(f"{path}: invalid TOML ({err})") from None


def table(parent: dict, key: str, where: str, default=None) -> dict | None:
    """Pops the sub-table ``key`` of ``parent`` as a new dict (``default`` if absent); a non-table names ``where``."""
    if key not in parent:
        return default
    value = parent.pop(key)
    if not isinstance(value, dict):
        raise ConfigFileError(f"{where}: must be a table ([{where}]), got {value!r}")
    return dict(value)


def take(section: dict, key: str, where: str, convert, default):
    """Pops ``key`` from ``section`` and converts it; conversion errors name ``where.key``."""
    if key not in section:
        return default
    value = section.pop(key)
    try:
        return convert(value)
    except (TypeError, ValueError) as err:
        raise ConfigFileError(f"{where}.{key}: {err}") from None


def choice(options):
    def convert(value):
        if value not in options:
            raise InputError(f"must be one of {', '.join(map(repr, options))}, got {value!r}")
        return value

    return convert


def choices(options):
    def convert(values):
        if isinstance(values, str) or not isinstance(values, list) or not values:
            raise InputError(f"must be a non-empty list of {', '.join(map(repr, options))}, got {values!r}")
        return tuple(choice(options)(v) for v in values)

    return convert


def boolean(value):
    """TOML ``true``/``false`` only (``bool("no")`` would be ``True``)."""
    if not isinstance(value, bool):
        raise InputError(f"must be true or false, got {value!r}")
    return value


def string(value):
    """A non-empty string (``str(5)`` would silently be ``"5"``)."""
    if not isinstance(value, str) or not value.strip():
        raise InputError(f"must be a non-empty string, got {value!r}")
    return value


def number_list(convert):
    """A non-empty list, each entry passed through ``convert``."""
    def check(values):
        if isinstance(values, (str, bool)) or not isinstance(values, list) or not values:
            raise InputError(f"must be a non-empty list of numbers, got {values!r}")
        return tuple(convert(v) for v in values)

    return check


def pos_int(name, minimum=1):
    return lambda v: validate.positive_int(name, v, minimum=minimum)


def reject_unknown(section: dict, where: str):
    if section:
        raise ConfigFileError(f"{where}: unknown key(s) {', '.join(sorted(section))}")
