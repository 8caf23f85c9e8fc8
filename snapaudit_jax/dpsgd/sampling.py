"""Poisson sampling with fixed shapes.

Each step draws every record independently (key ``fold_in(key, step)``); the realised batch has a
random size ``~ Binomial(N, q)``. Fixed shapes without truncation: the indices of the sampled records
are compacted into an ``(N_pad,)`` array (``N_pad = ceil(N / m) m``), and the step runs
microbatches of ``m`` rows (a ``lax.fori_loop`` with a *dynamic* trip count) and the remainder in
microbatches of ``t <= m`` rows (a second loop, :func:`microbatch_calls`; the array then has ``t`` more
entries); rows past ``count`` in the last microbatch are masked padding whose clipped gradient is exactly
zero. Every sampled record is used whatever the batch size, so the Poisson accounting holds with no
overflow event; the compiled step never changes shape.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from snapaudit_jax.utils import validate
from snapaudit_jax.utils.errors import InputError

__all__ = ["poisson_batch", "inclusion_threshold", "sampling_probability"]


def inclusion_threshold(sampling_rate: float) -> np.uint32:
    """The sampler's ``uint32`` threshold for rate ``q``: a record is included iff its 32 random bits are ``<=`` it.

    Args:
      sampling_rate: the accounted Poisson rate ``q`` in ``[2^-32, 1]``.

    Returns:
      ``floor(q 2^32) - 1`` as a ``np.uint32``.

    Raises:
      InputError: ``sampling_rate`` is not a number or lies outside ``[2^-32, 1]``.
    """
    q = validate._as_float("sampling_rate", sampling_rate)
    if not 2.0**-32 <= q <= 1.0:
        raise InputError(f"sampling_rate must be in [2**-32, 1], got {sampling_rate!r}")
    return np.uint32(math.floor(q * 2.0**32) - 1)


def sampling_probability(sampling_rate: float) -> float:
    """The exact inclusion probability of the sampler at rate ``q``.

    Args:
      sampling_rate: the accounted Poisson rate ``q`` in ``[2^-32, 1]``.

    Returns:
      ``floor(q 2^32) / 2^32``, in ``(q - 2^-32, q]``: never above the accounted ``q``.

    Raises:
      InputError: as :func:`inclusion_threshold`.
    """
    return (int(inclusion_threshold(sampling_rate)) + 1) / 2.0**32


def _poisson_mask(key: jax.Array, step, num_records: int, threshold) -> jax.Array:
    """``(num_records,)`` bool: record ``i`` in the batch of ``step`` (pure, key first)."""
    bits = jax.random.bits(jax.random.fold_in(key, step), (num_records,), jnp.uint32)
    return bits <= threshold


def poisson_batch(key: jax.Array, step: int, num_records: int, sampling_rate: float) -> jax.Array:
    """The Poisson batch of one DP-SGD step, as a membership mask.

    :func:`~snapaudit_jax.dpsgd.train` draws the batch of step ``t`` (0-based) as
    ``poisson_batch(jax.random.fold_in(key, 0), t, N, q)`` from the run's ``key``.

    Args:
      key: sampling key (typed or raw).
      step: the step index ``t >= 0``.
      num_records: ``N >= 1``.
      sampling_rate: ``q`` in ``[2^-32, 1]``.

    Returns:
      ``(N,)`` bool: whether each record is in the batch.

    Raises:
      InputError: ``step``, ``num_records`` or ``sampling_rate`` out of range.

    Guarantees:
      Given ``key``, the ``N`` indicators of a step are independent Bernoulli with probability
      ``floor(q 2^32) / 2^32``, which lies in ``(q - 2^-32, q]``: never above the accounted ``q``
      (epsilon is non-decreasing in ``q``, so accounting at ``q`` is conservative). Different steps
      use ``fold_in(key, step)``, independent streams for a random key (threefry).
    """
    num_records = validate.positive_int("num_records", num_records)
    step = validate.positive_int("step", step, minimum=0)
    return _poisson_mask(key, step, num_records, inclusion_threshold(sampling_rate))


def microbatch_calls(count, microbatch: int, tail: int):
    """The clipped-gradient calls a batch of ``count`` units runs: ``(full, rest)``, ``full`` microbatches of
    ``m = microbatch`` units, then ``rest`` of ``t = tail <= m``.

    ``full = floor((count + t - 1) / m)``: the whole microbatches, and one more where the remainder exceeds
    ``m - t`` (its ``t``-sized calls would compute ``m`` units anyway, in more calls); the rest, ``count - full m``
    units if positive, in ``ceil(. / t)`` calls. At most ``t - 1`` padded units when the tail runs, else fewer
    than ``t``; ``t = m`` gives ``ceil(count / m)`` microbatches of ``m``. Works on Python and NumPy integers and
    traced JAX ones (integer arithmetic only).

    Args:
      count: the batch's units (``>= 0``).
      microbatch: ``m >= 1``.
      tail: ``1 <= t <= m``.

    Returns:
      ``(full, rest)`` of ``count``'s type.
    """
    full = (count + tail - 1) // microbatch
    return full, (count - full * microbatch + tail - 1) // tail


def compact_indices(selected: jax.Array, microbatch_size: int) -> tuple[jax.Array, jax.Array]:
    """The sampled record indices compacted to a fixed-size array, for microbatches of ``m`` rows.

    ``N_pad = ceil(N / m) m`` so that every microbatch slice ``[i m, (i + 1) m)`` with
    ``i < ceil(count / m)`` lies inside the array (``lax.dynamic_slice`` would clamp otherwise).

    Args:
      selected: ``(N,)`` bool Poisson mask (from :func:`poisson_batch`).
      microbatch_size: ``m >= 1``.

    Returns:
      ``(indices, count)``: ``(N_pad,)`` int32, the sampled indices first (ascending) then ``0`` fill, and
      the int32 scalar number of sampled records.
    """
    n = selected.shape[0]
    padded = -(-n // microbatch_size) * microbatch_size
    (indices,) = jnp.nonzero(selected, size=padded, fill_value=0)
    return indices.astype(jnp.int32), jnp.sum(selected, dtype=jnp.int32)
