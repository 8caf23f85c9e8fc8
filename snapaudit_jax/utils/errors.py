"""The error hierarchy and the exit status the command line gives each kind.

Every error the library raises on purpose is a :class:`SnapAuditError`; the
command line maps it to its :attr:`~SnapAuditError.exit_code` and prints the
message. Anything else that escapes a command is an internal bug: exit status 1
with the traceback.

=====================  ======  ==================================================
class                  status  meaning
=====================  ======  ==================================================
:class:`InputError`      2     bad input: a flag, config key, file, model, dataset
:class:`ConfigFileError` 2     an invalid TOML run configuration (names the key)
:class:`MissingFileError` 2    an input file or folder that does not exist
:class:`DependencyError` 2     a missing optional package or embedded model
:class:`ServerError`     2     a model server that failed, or lacks a capability
:class:`ClaimViolation`  3     an audit refuted a privacy claim (opt-in)
other exceptions         1     an internal bug (traceback printed)
=====================  ======  ==================================================

:class:`InputError` is also a :class:`ValueError`, :class:`MissingFileError` a
:class:`FileNotFoundError`, and :class:`DependencyError` and
:class:`ServerError` are :class:`RuntimeError` subclasses, so ``except ValueError`` in callers keeps working.
"""

from __future__ import annotations

__all__ = [
    "EXIT_BUG",
    "EXIT_INPUT",
    "EXIT_OK",
    "EXIT_VIOLATION",
    "ClaimViolation",
    "ConfigFileError",
    "DependencyError",
    "InputError",
    "MissingFileError",
    "ServerError",
    "SnapAuditError",
]

EXIT_OK, EXIT_BUG, EXIT_INPUT, EXIT_VIOLATION = 0, 1, 2, 3


class SnapAuditError(Exception):
    """Base class of the errors snapaudit-jax raises on purpose.

    Attributes:
      exit_code: the command line's exit status for this kind of error.
    """

    exit_code: int = EXIT_BUG

    def __init__(self, *args):
        """The message (first argument) with every registered secret redacted
        (:func:`snapaudit_jax.utils.secrets.redact`): an error quoting a server's answer that echoes the API key
        cannot carry it further.

        Args:
          *args: the exception's arguments, the message first.
        """
        from snapaudit_jax.utils.secrets import redact

        if args and isinstance(args[0], str):
            args = (redact(args[0]), *args[1:])
        super().__init__(*args)


class InputError(SnapAuditError, ValueError):
    """Bad input; the message names the field (flag, ``section.key``, file), the rule and the value."""

    exit_code = EXIT_INPUT


class ConfigFileError(InputError):
    """An invalid run configuration; the message names ``section.key``."""


class MissingFileError(InputError, FileNotFoundError):
    """An input file or folder that does not exist (also a :class:`FileNotFoundError`)."""


class DependencyError(SnapAuditError, RuntimeError):
    """An optional package or an embedded model is missing; the message gives the install command."""

    exit_code = EXIT_INPUT


class ServerError(SnapAuditError, RuntimeError):
    """A model server failed (after its retries), answered malformed data, or lacks a capability the run needs.

    The message names the request (endpoint and what was asked) and the server's base URL, never credentials.
    """

    exit_code = EXIT_INPUT


class ClaimViolation(SnapAuditError):
    """An audit refuted the privacy claim it was asked to check (``--fail-on-violation``)."""

    exit_code = EXIT_VIOLATION
