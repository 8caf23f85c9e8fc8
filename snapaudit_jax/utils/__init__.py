"""Shared utilities of every snapaudit-jax command and of the ``conformal`` and ``attacks`` packages.

* :mod:`~snapaudit_jax.utils.errors` -- the error hierarchy and its exit statuses;
* :mod:`~snapaudit_jax.utils.validate` -- checks of Python arguments (each error names the field);
* :mod:`~snapaudit_jax.utils.config` -- reading TOML run configurations (each error names ``section.key``);
* :mod:`~snapaudit_jax.utils.io` -- atomic writes, the one JSON rule, output-path checks;
* :mod:`~snapaudit_jax.utils.memory` -- memory planning: refuse a size that cannot fit before allocating it;
* :mod:`~snapaudit_jax.utils.progress` -- the progress protocol and its stderr printer;
* :mod:`~snapaudit_jax.utils.run_folder` -- run folders owned by one run (configuration stamp, exclusive lock);
* :mod:`~snapaudit_jax.utils.quiet` -- library output silenced under ``--quiet``;
* :mod:`~snapaudit_jax.utils.platform` -- host setup (one XLA device per CPU core).

These modules import neither JAX nor any other part of snapaudit-jax.
"""

from snapaudit_jax.utils import config, errors, io, memory, platform, progress, quiet, run_folder, validate
from snapaudit_jax.utils.errors import (
    ClaimViolation,
    ConfigFileError,
    DependencyError,
    InputError,
    MissingFileError,
    SnapAuditError,
)
from snapaudit_jax.utils.io import atomic_write, dumps, to_json, write_json, write_text
from snapaudit_jax.utils.platform import use_all_cpu_cores
from snapaudit_jax.utils.progress import Counter, Progress, RunLog
from snapaudit_jax.utils.run_folder import RunFolder

__all__ = [
    "ClaimViolation",
    "ConfigFileError",
    "Counter",
    "DependencyError",
    "InputError",
    "MissingFileError",
    "Progress",
    "RunFolder",
    "RunLog",
    "SnapAuditError",
    "atomic_write",
    "config",
    "dumps",
    "errors",
    "io",
    "memory",
    "platform",
    "progress",
    "quiet",
    "run_folder",
    "to_json",
    "use_all_cpu_cores",
    "validate",
    "write_json",
    "write_text",
]
