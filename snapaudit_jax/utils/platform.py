"""Host-platform setup."""

from __future__ import annotations

import contextlib
import os

__all__ = ["full_float32_precision", "use_all_cpu_cores"]


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


def full_float32_precision(backend: str | None = None):
    """A context in which float32 matrix products run at full float32 precision, for correctness checks.

    Accelerators run float32 products at reduced precision by default (TF32 on NVIDIA GPUs from Ampere on, bf16
    passes on TPUs): a relative error near 1e-3 in a result that is right, beyond a float32 check's 1e-4. There
    the context is ``jax.default_matmul_precision("highest")``; computations traced inside it compile apart from
    the same computations outside (the setting is part of jit's cache key), so a checked step and a timed step at
    the backend's default are two executables. XLA's CPU backend computes float32 products in float32 whatever
    the setting: on the CPU the context is empty and the checked executable is the timed one.

    Args:
      backend: the platform (``"cpu"``, ``"gpu"``, ``"tpu"``); default :func:`jax.default_backend`.
    """
    import jax

    if (backend or jax.default_backend()) == "cpu":
        return contextlib.nullcontext()
    return jax.default_matmul_precision("highest")
