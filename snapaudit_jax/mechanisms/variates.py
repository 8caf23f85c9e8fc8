"""Random variates that are exact in the tails, and alias-table sampling.

Audits live in the tails: a false-positive rate of 1e-7 is an ordinary
number at ``eps = 16``. The float32 samplers of ``jax.random`` cannot reach
such events: ``jax.random.normal`` applies ``erfinv`` to a uniform with
resolution ``2^-23`` and never exceeds about 5.4 in absolute value (the mass
beyond, ~6e-8, is missing); Gumbel and logistic variates built from
``uniform`` stop near 16.6. Biased tails bias TPR/FPR and so the bounds.

Here every continuous variate is an exact transform of ``(s, u)``: a fair
sign bit ``s`` and ``u`` uniform on ``(0, 1/2)`` built from two 32-bit words,
whose float32 value keeps full relative precision down to ``2^-64``:

* normal: ``s * (-ndtri(u))``           (``P(Z > z) = Phi(-z)`` down to ``z ~ 9.2``)
* logistic: ``s * log((1 - u) / u)``    (tails down to ``2^-64``)
* exponential: ``-log1p(-u)`` or ``-log(u)`` by ``s``; Gumbel: ``-log(E)``.

Categorical draws over many small-probability cells use an alias table with
32-bit coins (Walker 1977; Vose 1991): two words per draw, probabilities
resolved to ``2^-32`` of a cell, instead of one Gumbel per cell.

The words come from :func:`random_words`: Threefry-2x32 (Salmon et al. 2011)
in counter mode over ``0, 1, ..., n - 1`` under the caller's key, one hash per
two words. That is the layout of ``jax.random.bits`` without
``jax_threefry_partitionable``; the partitionable layout (JAX's default since
0.5) hashes a 64-bit counter per word so that sharded arrays need no
communication, which costs about three times as much on CPU. The simulator
shards by block keys (``fold_in``), so it never needs that property.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.extend.random import threefry_2x32

from snapaudit_jax.utils.errors import InputError

__all__ = [
    "random_words",
    "word_columns",
    "sign_and_half_uniform",
    "normal",
    "logistic",
    "gumbel",
    "normal_from_bits",
    "logistic_from_bits",
    "AliasTable",
    "alias_table",
    "alias_draw",
]

_2P32 = 2.0**-32
_MAX_WORDS = 1 << 32  # distinct 32-bit counters under one key


def _threefry_data(key: jax.Array) -> jax.Array | None:
    """A Threefry key's raw ``uint32`` data (a typed key's or a raw key as given); ``None`` for other
    implementations."""
    if jax.random.key_impl(key) != "threefry2x32":
        return None
    return jax.random.key_data(key) if jnp.issubdtype(key.dtype, jax.dtypes.prng_key) else key


def random_words(key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """Uniform random 32-bit words: Threefry-2x32 of ``key`` in counter mode (pure; vmaps over keys).

    Word ``i`` of the flattened output is one half of ``threefry2x32(key, (c, c + n/2))`` for the counters
    ``c < n/2`` (odd ``n`` is padded by one): every hash input is distinct, so the words are independent uniform
    words as far as Threefry is a pseudo-random function. Keys of another implementation (``rbg``) fall back to
    ``jax.random.bits``.

    Args:
      key: PRNG key (typed, or a raw ``uint32`` key of the default implementation).
      shape: output shape, at most ``2^32`` words in all.

    Returns:
      ``shape`` uint32 words.

    Raises:
      InputError: more than ``2^32`` words for one key.
    """
    shape = tuple(int(d) for d in shape)
    n = math.prod(shape)
    if n > _MAX_WORDS:
        raise InputError(f"random_words draws at most 2^32 words per key, got shape {shape} ({n} words)")
    data = _threefry_data(key)
    if data is None:
        return jax.random.bits(key, shape, jnp.uint32)
    if n == 0:
        return jnp.zeros(shape, jnp.uint32)
    return threefry_2x32(data, jax.lax.iota(jnp.uint32, n)).reshape(shape)


def word_columns(key: jax.Array, n: int, start, size: int) -> jax.Array:
    """Columns ``[start, start + size)`` of ``random_words(key, (2, n))``, hashing only their own counters.

    :func:`random_words` hashes the counter pair ``(c, n + c)`` into its words ``c`` and ``n + c``: column ``c`` of
    a ``(2, n)`` draw is one hash, so a block of columns is drawn without the others (a loop over blocks then holds
    one block's words at a time, not the whole draw's).

    Args:
      key: PRNG key, as :func:`random_words`.
      n: the columns of the whole draw (``2 n <= 2^32`` words).
      start: the first column (an int or a traced integer scalar); ``start + size <= n``.
      size: the columns drawn (static).

    Returns:
      ``(2, size)`` uint32 words, equal to ``random_words(key, (2, n))[:, start:start + size]``.

    Raises:
      InputError: more than ``2^32`` words for one key.
    """
    if 2 * n > _MAX_WORDS:
        raise InputError(f"random_words draws at most 2^32 words per key, got 2 x {n} words")
    data = _threefry_data(key)
    if data is None:
        return jax.lax.dynamic_slice(random_words(key, (2, n)), (0, start), (2, size))
    first = jnp.asarray(start, jnp.uint32) + jax.lax.iota(jnp.uint32, size)
    return threefry_2x32(data, jnp.concatenate([first, first + jnp.uint32(n)])).reshape(2, size)


def sign_and_half_uniform(words: jax.Array) -> tuple[jax.Array, jax.Array]:
    """A fair sign and a uniform on ``(0, 1/2)`` from two or more planes of 32-bit words.

    The first word gives the sign (top bit) and 31 high bits of ``u``; each further plane refines ``u`` by 32 bits,
    so ``P planes`` resolve ``u`` to cells of width ``2^(-32 P)`` (the middle of the cell is returned): tiny ``u``
    keep float32 relative precision down to ``2^(-32 P - 1)`` (``2^-65`` for two planes, ``2^-97`` for three).
    Each cell, the outermost included, has probability ``2^(1 - 32 P)`` given the sign.

    Args:
      words: ``(P, ...)`` uint32 words, ``P >= 2``.

    Returns:
      ``(sign, u)``: ``(...)`` bool and ``(...)`` float32 with ``u`` uniform on ``(0, 1/2)``.
    """
    hi = words[0]  # planes, not a trailing axis: contiguous
    sign = (hi >> 31) == 1
    scale = jnp.float32(_2P32)
    frac = jnp.float32(0.5)
    for plane in range(words.shape[0] - 1, 0, -1):  # innermost first: (w + frac) 2^-32 keeps the low bits
        frac = (words[plane].astype(jnp.float32) + frac) * scale
    u = ((hi & 0x7FFFFFFF).astype(jnp.float32) + frac) * scale
    return sign, u


def normal_from_bits(words: jax.Array) -> jax.Array:
    """Standard normal variates from random words (inverse-CDF transform, exact in the tails).

    Args:
      words: ``(P, ...)`` uint32 words, ``P >= 2`` (see :func:`sign_and_half_uniform`).

    Returns:
      ``(...)`` float32 standard normals.
    """
    sign, u = sign_and_half_uniform(words)
    z = -jax.scipy.special.ndtri(u)
    return jnp.where(sign, z, -z)


def logistic_from_bits(words: jax.Array) -> jax.Array:
    """Standard logistic variates from random words (exact in the tails).

    Args:
      words: ``(2, ...)`` uint32 words.

    Returns:
      ``(...)`` float32 standard logistic variates.
    """
    sign, u = sign_and_half_uniform(words)
    x = jnp.log1p(-u) - jnp.log(u)
    return jnp.where(sign, x, -x)


def _words(key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    # Flat planes: XLA's CPU loops vectorise poorly over a small minor axis, so the
    # transform runs on 1-D arrays and the caller's shape is restored afterwards.
    return random_words(key, (2, math.prod(shape)))


def normal(key: jax.Array, shape=()) -> jax.Array:
    """Standard normal float32 variates, exact in the tails (see the module docstring).

    Args:
      key: PRNG key.
      shape: output shape (default ``()``, a scalar).

    Returns:
      float32 array of ``shape``.
    """
    return normal_from_bits(_words(key, shape)).reshape(shape)


def logistic(key: jax.Array, shape=()) -> jax.Array:
    """Standard logistic float32 variates, exact in the tails.

    Args:
      key: PRNG key.
      shape: output shape (default ``()``, a scalar).

    Returns:
      float32 array of ``shape``.
    """
    return logistic_from_bits(_words(key, shape)).reshape(shape)


def gumbel(key: jax.Array, shape=()) -> jax.Array:
    """Standard Gumbel float32 variates ``-log(E)``, ``E ~ Exp(1)``, exact in both tails.

    Args:
      key: PRNG key.
      shape: output shape (default ``()``, a scalar).

    Returns:
      float32 array of ``shape``.
    """
    sign, u = sign_and_half_uniform(_words(key, shape))
    e = jnp.where(sign, -jnp.log1p(-u), -jnp.log(u))
    return (-jnp.log(e)).reshape(shape)


class AliasTable(NamedTuple):
    """Alias table over ``n`` cells (``n`` a power of two).

    Attributes:
      threshold: ``(n,)`` uint32: keep the cell if ``coin < threshold``.
      keep_all: ``(n,)`` bool: the cell never defers to its alias.
      alias: ``(n,)`` int32 alias of each cell.
    """

    threshold: jax.Array
    keep_all: jax.Array
    alias: jax.Array


def alias_table(logits: jax.Array) -> AliasTable:
    """Builds an alias table for ``softmax(logits)`` (pure, vmappable).

    Vose's construction pairs every under-full cell with an over-full one; a cell that starts under-full keeps its
    exact probability, so rare cells are resolved to float32 relative precision (and to ``2^-32 / n`` absolute, the
    coin's resolution).

    Args:
      logits: ``(n,)`` float unnormalised log-probabilities, ``n`` a power of two; ``-inf`` cells get probability 0.

    Returns:
      The :class:`AliasTable`.

    Raises:
      InputError: ``n`` is not a power of two.
    """
    n = logits.shape[0]
    if n & (n - 1):
        raise InputError(f"alias tables need a power-of-two number of cells, got {n}")
    p = jax.nn.softmax(logits)
    scaled = p * n

    def body(_, state):
        q, keep, alias, done = state
        small = ~done & (q < 1.0)
        large = ~done & (q >= 1.0)
        has_pair = jnp.any(small) & jnp.any(large)
        s = jnp.argmax(small)
        l = jnp.argmax(large)
        # Cell s keeps q[s] of its slot and sends the rest to l.
        new_q = q.at[l].add(jnp.where(has_pair, q[s] - 1.0, 0.0))
        keep = keep.at[s].set(jnp.where(has_pair, q[s], keep[s]))
        alias = alias.at[s].set(jnp.where(has_pair, l, alias[s]))
        done = done.at[s].set(done[s] | has_pair)
        return new_q, keep, alias, done

    init = (scaled, jnp.ones((n,), jnp.float32), jnp.arange(n, dtype=jnp.int32), jnp.zeros((n,), bool))
    q, keep, alias, done = jax.lax.fori_loop(0, n, body, init)
    # Unpaired cells (numerical leftovers, all ~1) keep their whole slot.
    keep = jnp.where(done, keep, 1.0)
    keep_all = keep >= 1.0
    threshold = jnp.floor(jnp.clip(keep, 0.0, 1.0) * jnp.float32(2.0**32))
    threshold = jnp.minimum(threshold, jnp.float32(2.0**32 - 256)).astype(jnp.uint32)
    return AliasTable(threshold=threshold, keep_all=keep_all, alias=alias)


def alias_draw(words: jax.Array, table: AliasTable) -> jax.Array:
    """One draw from an alias table.

    Args:
      words: ``(2,)`` uint32 words: the cell is ``words[0] mod n``, the coin ``words[1]``.
      table: the :class:`AliasTable` over ``n`` cells.

    Returns:
      The drawn cell, an int32 scalar.
    """
    n = table.threshold.shape[0]
    cell = (words[0] & jnp.uint32(n - 1)).astype(jnp.int32)
    keep = table.keep_all[cell] | (words[1] < table.threshold[cell])
    return jnp.where(keep, cell, table.alias[cell])
