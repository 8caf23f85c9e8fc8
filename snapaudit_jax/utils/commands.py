"""The config-file commands of the ``snapaudit`` command line, and how packages contribute them.

A :class:`ConfigCommand` is ``snapaudit NAME CONFIG.toml [--out DIR] [--quiet]``:
load and check the TOML file, check the output folder, run into it, print its
report. The run owns its folder (:class:`~snapaudit_jax.utils.run_folder.RunFolder`:
a stamp of its configuration and a lock held while it runs), so a folder of
another configuration or one that another run holds is refused before any work.
``snapaudit_jax`` defines ``audit``; other installed packages add theirs
through the ``snapaudit.commands`` entry-point group (``conformal`` adds
``cpa``, ``attacks`` adds ``pii``), so the command line never imports them by
name and the packages depend on ``snapaudit_jax`` one way only.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import re
from collections.abc import Callable, Mapping
from importlib import metadata
from typing import Any

from snapaudit_jax.utils.io import check_output_dir

__all__ = ["ENTRY_POINT_GROUP", "ConfigCommand", "default_out", "discover", "resolve", "run_command"]

ENTRY_POINT_GROUP = "snapaudit.commands"


@dataclasses.dataclass(frozen=True)
class ConfigCommand:
    """One ``snapaudit NAME CONFIG.toml`` command.

    Attributes:
      name: the sub-command (``"cpa"``).
      help: one line for ``snapaudit --help``.
      description: the paragraph of ``snapaudit NAME --help``.
      example: the example configuration's file name under ``examples/``.
      load: ``load(path) -> config``; raises :class:`~snapaudit_jax.utils.errors.ConfigFileError` naming the key.
      run: ``run(config, out_dir, *, progress) -> dict``; writes the results into ``out_dir``.
      report: the file of ``out_dir`` printed when the run is done (``"report.md"``).
      summary: optional ``summary(result) -> str | None``, one more line printed after the report.
      plan: optional ``plan(config) -> str``: with it the command takes ``--plan``, which prints what a run
        would do and writes nothing.

    ``load``, ``run`` and ``summary`` are callables or ``"module:function"`` targets, resolved when the
    command runs (:func:`resolve`); a package's entry point then needs no wrapper functions.
    """

    name: str
    help: str
    description: str
    example: str
    load: Callable[[str], Any] | str
    run: Callable[..., Mapping[str, Any]] | str
    report: str
    summary: Callable[[Mapping[str, Any]], str | None] | str | None = None
    plan: Callable[[Any], str] | str | None = None

    def __post_init__(self):
        for field in ("load", "run", "summary", "plan"):
            target = getattr(self, field)
            if isinstance(target, str) and not re.fullmatch(r"[\w.]+:\w+", target):
                raise TypeError(f"ConfigCommand {self.name!r}: {field} must be a callable or a 'module:function' "
                                f"target, got {target!r}")


def resolve(target: Callable | str) -> Callable:
    """The callable a :class:`ConfigCommand` field names.

    Args:
      target: a callable (returned as it is) or a ``"module:function"`` string (the module is imported).

    Returns:
      The callable.

    Raises:
      ImportError: the module cannot be imported.
      AttributeError: the module has no such function.
    """
    if callable(target):
        return target
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def discover() -> dict[str, ConfigCommand]:
    """The commands of the installed packages' ``snapaudit.commands`` entry points, by name.

    Returns:
      ``{name: ConfigCommand}`` sorted by name.

    Raises:
      TypeError: an entry point does not name a :class:`ConfigCommand` or its name differs from the entry's.
    """
    found = {}
    for entry in metadata.entry_points(group=ENTRY_POINT_GROUP):
        command = entry.load()
        if not isinstance(command, ConfigCommand) or command.name != entry.name:
            raise TypeError(f"entry point {entry.name} = {entry.value} of group {ENTRY_POINT_GROUP} must be a "
                            f"ConfigCommand named {entry.name!r}, got {command!r:.80}")
        found[entry.name] = command
    return dict(sorted(found.items()))


def default_out(config_path: str) -> str:
    """The output folder of a config-file command run without ``--out``.

    Args:
      config_path: the TOML configuration.

    Returns:
      ``runs/<config file name without suffix>``.
    """
    return os.path.join("runs", os.path.splitext(os.path.basename(config_path))[0])


def run_command(command: ConfigCommand, config_path: str, out: str | None = None, *,
                progress: bool = True) -> tuple[Mapping[str, Any], str]:
    """Loads ``config_path``, runs it into ``out`` and returns the result and the report's text.

    Args:
      command: the command.
      config_path: its TOML configuration.
      out: the output folder (default ``runs/<config file name without suffix>``).
      progress: progress lines on stderr.

    Returns:
      ``(result, report)``: what ``command.run`` returned and the text of its report file.

    Raises:
      InputError: a bad configuration, an output folder that cannot be written, or one the run may not own (of
        another configuration, held by another live run; the command's ``run`` refuses it) -- before any work.
    """
    config = resolve(command.load)(config_path)
    out = out or default_out(config_path)
    check_output_dir("--out", out)  # before any work: nothing is created if it could not be written
    result = resolve(command.run)(config, out, progress=progress)
    with open(os.path.join(out, command.report)) as fh:
        return result, fh.read()
