"""Reading TOML run configurations: every error names ``section.key``, the rule and the value."""

from __future__ import annotations

import os
import tomllib

from snapaudit_jax import _validate

__all__ = ["ConfigFileError", "read_toml", "take", "choice", "choices", "pos_int", "reject_unknown"]


class ConfigFileError(ValueError):
    """An invalid run configuration (the message names the key)."""


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
            raise ValueError(f"must be one of {', '.join(map(repr, options))}, got {value!r}")
        return value

    return convert


def choices(options):
    def convert(values):
        if isinstance(values, str) or not isinstance(values, list) or not values:
            raise ValueError(f"must be a non-empty list of {', '.join(map(repr, options))}, got {values!r}")
        return tuple(choice(options)(v) for v in values)

    return convert


def pos_int(name, minimum=1):
    return lambda v: _validate.positive_int(name, v, minimum=minimum)


def reject_unknown(section: dict, where: str):
    if section:
        raise ConfigFileError(f"{where}: unknown key(s) {', '.join(sorted(section))}")
