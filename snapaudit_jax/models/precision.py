"""Numerical precision of float32 matrix products, by backend."""

from __future__ import annotations

import contextlib

import jax

__all__ = ["full_float32_precision"]


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
    if (backend or jax.default_backend()) == "cpu":
        return contextlib.nullcontext()
    return jax.default_matmul_precision("highest")
