"""The Gaussian noise of DP-SGD, drawn exactly out to where its tails no longer matter.

The Gaussian mechanism's guarantee is for Gaussian noise. A sampler whose largest output is ``z_max`` noise units
breaks it with probability, not by rounding: when the one unit that differs between two neighbouring datasets
moves a coordinate of the clipped sum by ``Delta <= C``, every output beyond ``z_max sigma C`` on that side is
possible with the unit and impossible without it, so seeing one proves membership. The float32
``jax.random.normal`` (an ``erfinv`` of a uniform on a ``2^-23`` grid, the sampler of jax_privacy's
``gaussian_privatizer``) returns nothing beyond ``[-5.42, 5.22]``; in bfloat16, nothing beyond
``[-2.89, 2.52]``. At ``sigma = 0.613``, ``q = 0.0224`` and 200 steps (``examples/finetune_scale.toml``), a
gradient on one coordinate makes such an output appear with probability about ``1 - (1 - q P(Z > 5.22 - 1 /
sigma))^200 ~ 7e-4``, 170 times the run's ``delta = 4.4e-6``: the stated ``(epsilon, delta)`` did not hold.

Here each noise coordinate is the inverse-CDF transform of a fair sign and a uniform ``U`` on ``(0, 1/2)``
(:func:`~snapaudit_jax.mechanisms.variates.sign_and_half_uniform`; words of Threefry-2x32 in counter mode under the
step's key, Salmon et al. 2011), drawn in float32 whatever the gradients' dtype. Two 32-bit words resolve ``U`` to a
grid of ``2^-64``; where the first word's 31 uniform bits are all zero (``U < 2^-32``, ``|Z| > 6.23``, probability
``2^-31``) a third word resolves it to ``2^-96``. The grid is so at least as fine as float32's own spacing of ``U``
wherever ``U >= 2^-72`` (``2^-64`` against at least ``2^-55`` above ``2^-32``; ``2^-96`` against at least ``2^-95``
below), and there the output is an exact normal up to float32 rounding (floating-point attacks on the sampler are
out of scope, :mod:`~snapaudit_jax.dpsgd.keys`). Its largest output is ``-ndtri(2^-97) = 11.30``. Below ``2^-72``
the grid is coarser than float32, and all of that mass, :data:`TAIL_PROBABILITY` ``= P(U < 2^-72) = 2^-71`` per
coordinate (``|Z| > 9.67``), is counted as the sampler's deviation. A run of ``T`` steps adding noise to ``d``
coordinates is then within total variation ``eta = T d 2^-71`` of the exact Gaussian mechanism (a coupling step by
step, adaptively; a union bound), so an ``(epsilon, delta)`` guarantee of the exact mechanism holds for the sampler
with ``delta + (1 + e^epsilon) eta`` (:func:`sampler_delta`): ``4.7e-10`` for the ``d = 1.8 M`` adapters of that
example at ``epsilon = 8``, ``3.4e-8`` for its 135 M parameters trained in full (0.8% of its delta).
:class:`~snapaudit_jax.dpsgd.DPReport` states that term beside ``delta`` and the claims print their sum.

An array is drawn :data:`BLOCK` (``2^20``) coordinates at a time, into its own buffer (:func:`add_standard_normal`):
each coordinate's words are hashed from its own counters, so the values do not depend on the block, and a draw's
working memory is one block's words and transforms, not the array's (a GPT-2 4 x 256's DP step, 16 M parameters,
peaked 368 MB higher with the whole draw than without noise; drawn by blocks, 12 MB). The third words are hashed
only where they are needed. On the CPU a block's third plane is drawn (under its own key, as the first plane of a
second two-plane draw, so that a lowered step holds one Threefry function per block size) only when one of its
coordinates needs it (probability ``b 2^-31`` for ``b`` coordinates), so a draw costs no more than
``jax.random.normal``'s (36.3 M coordinates on 2 cores: 0.26 s against 0.33 s). On accelerators, where hashing
is cheap and a conditional can wait on the device, it is drawn for every coordinate and selected. Both evaluate
the same sampler (their values may differ by float32 rounding where XLA fuses them differently).

The privatizer is an optax transformation like jax_privacy's: its state is the key, split at every update. Leaves
of fewer than a million coordinates share one draw (:func:`leaf_noise`), so that a step compiles one noise draw
for them, not one per leaf (an unrolled 30-block model has hundreds).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import optax

from snapaudit_jax.mechanisms.variates import sign_and_half_uniform, word_columns
from snapaudit_jax.utils.errors import InputError

__all__ = ["NOISE_WORDS", "THIRD_PLANE", "TAIL_PROBABILITY", "SAMPLER", "PER_KEY", "DELTA_SHARE", "GROUP_BELOW",
           "GROUPED", "BLOCK", "coordinates", "standard_normal", "add_standard_normal", "refined_normal",
           "lazy_third_plane", "leaf_noise", "noisy_leaves", "sampler_delta", "check_sampler_delta",
           "gaussian_privatizer"]

NOISE_WORDS = 2
"""32-bit words drawn for every noise coordinate: a sign and a uniform on ``(0, 1/2)`` on a grid of ``2^-64``
(refined by a third word to ``2^-96`` where the first word's 31 uniform bits are zero)."""

THIRD_PLANE = 0xFFFFFFFF
"""``fold_in`` data of the key that draws a chunk's third words: never a chunk's index (that would take ``2^63``
coordinates)."""

TAIL_PROBABILITY = 2.0**-71
"""Per coordinate, ``P(U < 2^-72)`` for ``U`` uniform on ``(0, 1/2)``: where the ``2^-96`` grid is coarser than float32
(whose spacing at ``2^-72`` is ``2^-95``), the mass counted as the sampler's deviation from ``N(0, 1)``."""

SAMPLER = (
    "float32 inverse-CDF normals of a fair sign and a uniform on a 2^-64 grid, refined to 2^-96 below 2^-32 (two "
    "Threefry-2x32 words a coordinate, a third under a folded key where the first word has 31 zero uniform bits): "
    "exact to float32 rounding except with probability 2^-71 a coordinate; largest output 11.3 noise units"
)


PER_KEY = (1 << 32) // NOISE_WORDS
"""Coordinates one key draws (its ``2^32`` counters); a larger array draws chunk ``c`` under ``fold_in(key, c)``."""


def lazy_third_plane() -> bool:
    """Whether :func:`standard_normal` draws the third words only when some coordinate needs them (on the CPU)."""
    return jax.default_backend() == "cpu"


def refined_normal(words: jax.Array, third, *, lazy: bool) -> jax.Array:
    """The sampler's transform of two planes of words, with a third plane where the first word's uniform bits are 0.

    Coordinate ``i`` is :func:`~snapaudit_jax.mechanisms.variates.normal_from_bits` of ``words[:, i]`` where
    ``words[0, i] & 0x7FFFFFFF`` is nonzero, else of ``words[:, i]`` followed by ``third()[0, i]``.

    Args:
      words: ``(2, n)`` uint32 words.
      third: a function returning the ``(1, n)`` third plane.
      lazy: call ``third`` under a ``jax.lax.cond`` only when some coordinate needs it (zeros stand in
        otherwise, read by no coordinate); else always.

    Returns:
      ``(n,)`` float32 standard normals.
    """
    rare = (words[0] & jnp.uint32(0x7FFFFFFF)) == 0
    if lazy:
        plane = jax.lax.cond(jnp.any(rare), third, lambda: jnp.zeros((1, words.shape[1]), jnp.uint32))
    else:
        plane = third()
    sign, common = sign_and_half_uniform(words)
    _, refined = sign_and_half_uniform(jnp.concatenate([words, plane]))
    # one transform a draw, not one a plane count: ndtri's coefficient tables are constants of the lowered step
    z = -jax.scipy.special.ndtri(jnp.where(rare, refined, common))
    return jnp.where(sign, z, -z)


BLOCK = 1 << 20
"""Coordinates of an array drawn a loop iteration (:func:`add_standard_normal`): a draw holds one block's words
and transforms at a time, not the whole array's (a step's noise otherwise peaks at several word planes of its
largest leaf: 368 MB of a GPT-2 4 x 256's DP step, its 16 M parameters). The values do not depend on it: each
coordinate's words are hashed from its own counters (:func:`~snapaudit_jax.mechanisms.variates.word_columns`)."""


def _blocks(key: jax.Array, flat: jax.Array, combine, block: int) -> jax.Array:
    """``flat`` (``n <= PER_KEY`` coordinates) with ``combine(piece, z)`` written over each piece, ``z`` the
    pieces' coordinates of :func:`standard_normal` ``(key, (n,))``, ``block`` coordinates a loop iteration. The
    last block ends at ``n`` (moved back over the previous one, whose coordinates it leaves as they are), so every
    iteration has one shape and writes in place."""
    n = flat.shape[0]
    if jax.random.key_impl(key) != "threefry2x32":
        block = n  # no counter access to single columns: one block (word_columns would hash the whole draw)
    size, lazy = min(block, n), lazy_third_plane()

    def one(x, start, done):
        z = refined_normal(
            word_columns(key, n, start, size),
            # the first plane of a second two-plane draw: the same hash shape as the first, so a lowered step
            # holds one Threefry function per block size whatever the sizes of the other leaves
            lambda: word_columns(jax.random.fold_in(key, THIRD_PLANE), n, start, size)[:1],
            lazy=lazy,
        )
        piece = jax.lax.dynamic_slice(x, (start,), (size,))
        fresh = start + jax.lax.iota(jnp.int32, size) >= done
        return jax.lax.dynamic_update_slice(x, jnp.where(fresh, combine(piece, z), piece), (start,))

    if size == n:
        return one(flat, 0, 0)

    def body(b, x):
        return one(x, jnp.minimum(b * size, n - size), b * size)

    return jax.lax.fori_loop(0, -(-n // size), body, flat)


def add_standard_normal(key: jax.Array, x: jax.Array, combine=None, *, block: int | None = None) -> jax.Array:
    """``x`` with :func:`standard_normal` ``(key, x.shape)`` added (or combined), drawn :data:`BLOCK` coordinates at
    a time into ``x``'s own buffer (pure, key first).

    Args:
      key: PRNG key (``threefry2x32``).
      x: the array; its flattened coordinate ``i`` gets the draw's coordinate ``i``.
      combine: ``combine(piece, z) -> piece`` for a float32 ``z`` of the piece's coordinates; default
        ``piece + z`` computed in float32 and cast back to ``x``'s dtype.
      block: coordinates a loop iteration (default :data:`BLOCK`; the values do not depend on it).

    Returns:
      An array of ``x``'s shape and dtype.
    """
    if combine is None:
        def combine(piece, z):
            return (piece.astype(jnp.float32) + z).astype(piece.dtype)

    block = BLOCK if block is None else int(block)
    flat = x.reshape(-1)
    n = flat.shape[0]
    if n <= PER_KEY:
        return _blocks(key, flat, combine, block).reshape(x.shape)
    chunks = [_blocks(jax.random.fold_in(key, c), flat[start:start + PER_KEY], combine, block)
              for c, start in enumerate(range(0, n, PER_KEY))]
    return jnp.concatenate(chunks).reshape(x.shape)


def standard_normal(key: jax.Array, shape, *, block: int | None = None) -> jax.Array:
    """Standard normal float32 noise, exact to float32 rounding but with probability ``2^-71`` (pure, key first).

    Coordinate ``i`` of the flattened output is :func:`refined_normal` of words ``i`` and ``n + i`` of Threefry-2x32
    in counter mode under ``key`` (``n`` coordinates) and, where it needs one, word ``i`` of ``2 n``
    under ``fold_in(key, THIRD_PLANE)``. An array of more than :data:`PER_KEY` coordinates is drawn in chunks of
    ``PER_KEY``, chunk ``c`` so under ``fold_in(key, c)``. It is drawn ``block`` coordinates at a time
    (:func:`add_standard_normal`).

    Args:
      key: PRNG key (``threefry2x32``).
      shape: output shape.
      block: coordinates a loop iteration (default :data:`BLOCK`; the values do not depend on it).

    Returns:
      float32 array of ``shape``.
    """
    shape = tuple(int(d) for d in shape)
    return add_standard_normal(key, jnp.zeros(shape, jnp.float32), lambda piece, z: z, block=block)


def coordinates(tree) -> int:
    """The noise coordinates of a step: the number of entries of every array leaf of ``tree`` (a trainable
    state, or its abstract shapes).

    Args:
      tree: a pytree of arrays or ``jax.ShapeDtypeStruct`` s (an ``nnx.State`` included).

    Returns:
      The total number of entries.
    """
    return sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(tree))


def sampler_delta(epsilon: float, steps: int, coordinates: int) -> float:
    """What the sampler's finite tails add to ``delta``: ``(1 + e^epsilon) * steps * coordinates * 2^-71``.

    If the exact Gaussian mechanism is ``(epsilon, delta)``-DP and the run's output is within total variation
    ``eta`` of it on every dataset, the run is ``(epsilon, delta + (1 + e^epsilon) eta)``-DP; ``eta <= steps *
    coordinates * TAIL_PROBABILITY`` (module docstring).

    Args:
      epsilon: the exact mechanism's epsilon (``inf``: not DP, the result is ``inf``).
      steps: noisy steps.
      coordinates: noise coordinates a step (the trainable parameters).

    Returns:
      The added delta (``inf`` where ``e^epsilon`` overflows).
    """
    if steps == 0 or coordinates == 0:
        return 0.0
    if not math.isfinite(epsilon) or epsilon > 700.0:
        return math.inf
    return (1.0 + math.exp(epsilon)) * steps * coordinates * TAIL_PROBABILITY


DELTA_SHARE = 0.1
"""The largest share of ``delta`` the sampler's term may add before a run is refused (:func:`check_sampler_delta`)."""


def check_sampler_delta(epsilon: float, steps: float, coordinates: int, delta: float, *, field: str = "delta") -> float:
    """The sampler's term of a planned run, refused above :data:`DELTA_SHARE` of ``delta``.

    The claims state ``delta`` plus this term either way; the refusal keeps it close to the ``delta`` asked for.

    Args:
      epsilon: an upper bound on the run's epsilon (the target, or an accountant's for every planned step).
      steps: the noisy steps (expected, for a sweep under random stopping).
      coordinates: the trainable parameters.
      delta: the ``delta`` asked for.
      field: the setting the error names.

    Returns:
      :func:`sampler_delta` of the run.

    Raises:
      InputError: the term passes ``DELTA_SHARE * delta``, naming ``field`` and every factor.
    """
    added = sampler_delta(epsilon, steps, coordinates)
    if added > DELTA_SHARE * delta:
        raise InputError(
            f"{field}: the noise sampler's tails would add {added:.3g} to delta = {delta:.3g}, more than "
            f"{DELTA_SHARE:g} of it ((1 + e^epsilon) T d 2^-71 at epsilon {epsilon:.4g}, T = {steps:g} noisy "
            f"steps, d = {coordinates} trainable parameters; snapaudit_jax.dpsgd.noise): train fewer parameters "
            "(LoRA), take fewer steps or a smaller epsilon, or state a larger delta"
        )
    return added


GROUP_BELOW = 1 << 20
"""Leaves of fewer coordinates draw their noise together (:func:`leaf_noise`)."""

GROUPED = 0xFFFFFFFF
"""``fold_in`` data of the key of the small leaves' joint draw: never a leaf's index."""


def leaf_noise(key: jax.Array, leaves) -> list[jax.Array]:
    """One step's standard normal noise for each of ``leaves`` (float32, each leaf's shape).

    Leaf ``i`` of at least :data:`GROUP_BELOW` coordinates draws :func:`standard_normal` under ``fold_in(key, i)``;
    the smaller leaves share one draw under ``fold_in(key, GROUPED)``, each taking the next of its coordinates in
    leaf order. Every coordinate so has a noise word of its own, and a step compiles one draw for all the small
    leaves (biases, norms, LoRA adapters: hundreds in an unrolled model, each otherwise a Threefry hash and an
    inverse-CDF transform of its own to compile) rather than one each.

    Args:
      key: the step's noise key.
      leaves: arrays (their shapes are read).

    Returns:
      float32 arrays of the leaves' shapes.
    """
    return _leafwise(key, [jnp.zeros(leaf.shape, jnp.float32) for leaf in leaves], lambda piece, z: z)


def noisy_leaves(key: jax.Array, leaves, stddev: jax.Array | float) -> list[jax.Array]:
    """``leaf + stddev * z`` for each of ``leaves``, computed in float32 and cast back to the leaf's dtype, ``z``
    the leaf's :func:`leaf_noise`; a large leaf's noise is drawn block by block into the leaf's own buffer
    (:func:`add_standard_normal`), never whole beside it.

    Args:
      key: the step's noise key.
      leaves: arrays (the clipped sum's leaves).
      stddev: the noise's standard deviation (may be traced).

    Returns:
      Arrays of the leaves' shapes and dtypes.
    """
    def combine(piece, z):
        return (piece.astype(jnp.float32) + stddev * z).astype(piece.dtype)

    return _leafwise(key, leaves, combine)


def _leafwise(key: jax.Array, leaves, combine) -> list[jax.Array]:
    """``combine(leaf, z)`` for each leaf, ``z`` its noise as :func:`leaf_noise` defines it."""
    out: list = [None] * len(leaves)
    small = [i for i, leaf in enumerate(leaves) if leaf.size < GROUP_BELOW]
    if small:
        joint = standard_normal(jax.random.fold_in(key, GROUPED), (sum(leaves[i].size for i in small),))
        start = 0
        for i in small:
            out[i] = combine(leaves[i], joint[start:start + leaves[i].size].reshape(leaves[i].shape))
            start += leaves[i].size
    for i, leaf in enumerate(leaves):
        if out[i] is None:
            out[i] = add_standard_normal(jax.random.fold_in(key, i), leaf, combine)
    return out


def gaussian_privatizer(stddev: jax.Array | float, prng_key: jax.Array) -> optax.GradientTransformation:
    """Adds ``N(0, stddev^2)`` noise to every coordinate of the clipped sum (an optax transformation).

    The state is the key; each update splits it, draws the leaves' noise under the new subkey with
    :func:`leaf_noise`, adds it in float32 and casts the sum back to the leaf's dtype (:func:`noisy_leaves`).

    Args:
      stddev: the noise's standard deviation ``sigma C`` (may be traced).
      prng_key: the noise stream's key (secret: whoever holds it can subtract the noise).

    Returns:
      The ``optax.GradientTransformation``.
    """

    def init(params):
        del params
        return prng_key

    def update(updates, state, params=None):
        del params
        state, sub = jax.random.split(state)
        leaves, treedef = jax.tree.flatten(updates)
        return jax.tree.unflatten(treedef, noisy_leaves(sub, leaves, stddev)), state

    return optax.GradientTransformation(init, update)
