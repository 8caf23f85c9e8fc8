"""Host-platform setup."""

from __future__ import annotations

import os

__all__ = ["use_all_cpu_cores"]


def use_all_cpu_cores(count: int | None = None) -> None:
    """Exposes one XLA host device per CPU core, unless ``XLA_FLAGS`` already sets a count.

    XLA runs the simulator's loops on one thread per CPU device; several host devices let
    :func:`snapaudit_jax.simulation.trials` shard blocks over the cores. It only takes effect if called before JAX
    initialises its backends (the first computation or ``jax.devices()`` call); accelerators are unaffected.

    Args:
      count: number of host devices (default: ``os.cpu_count()``).
    """
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        n = count or os.cpu_count() or 1
        os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={n}".strip()

