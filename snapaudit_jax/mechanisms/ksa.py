"""Joint Exponential Mechanism for private top-K and the KSA mechanism.

JEM (Gillenwater, Joseph, Munoz Medina & Ribero Diaz 2022) samples a whole
length-``K`` sequence of distinct items ``s`` with probability proportional
to ``exp(scale * u(s))`` where, for counts sorted decreasingly
``c_(1) >= ... >= c_(d)``,

    u(s) = -max_{i <= K} (c_(i) - c[s_i])

and ``scale = eps / (2 Delta_u)``.

Efficient exact sampling (no enumeration of the ``d!/(d-K)!`` sequences).
For a gap ``g >= 0`` let ``A_l(g) = {j : c_j >= c_(l) - g}`` and
``B_l(g) = {j : c_j > c_(l) - g}``; both are prefixes of the sorted order and
grow with ``l``. A sequence has utility exactly ``-g`` iff ``s_l in A_l`` for
all ``l`` and some ``s_l`` lies in ``A_l \\ B_l``; splitting by the *first*
such position ``i`` gives the count

    m(i, g) = prod_{l<i} (|B_l| - l) * (|A_i| - |B_i|) * prod_{l>i} (|A_l| - l)

(positions 0-based). Non-zero terms need ``g = c_(i) - v`` for a count value
``v``, so the pairs ``(i, v)`` -- at most ``K * U`` of them, ``U`` the number
of distinct count values -- carry the whole distribution:
``P(i, v) ~ m(i, g) exp(-scale * g)``. The pair is drawn from an alias table
(two 32-bit words); given the pair, the sequence is drawn uniformly position
by position (one word each). Gaps are exact differences of the counts (no
flooring), so real-valued counts are supported; integer or dyadic counts are
exact in floating point.
"""

from __future__ import annotations

from typing import ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from snapaudit_jax.mechanisms.noise import exponential_mechanism_scale, float32_noise_parameter
from snapaudit_jax.mechanisms.base import Mechanism, Release, pytree_dataclass, static_field
from snapaudit_jax.mechanisms.variates import AliasTable, alias_draw, alias_table, random_words
from snapaudit_jax.utils import validate

__all__ = [
    "JemTable",
    "jem_prepare",
    "jem_select",
    "joint_exponential_topk",
    "sequence_utility",
    "KeywordSpaceAggregation",
]

_SENTINEL = np.iinfo(np.int32).max // 2


class JemTable(NamedTuple):
    """Per-histogram sampling table of JEM.

    Attributes:
      order: ``(d,)`` item ids by decreasing count (ties by id).
      sorted_counts: ``(d,)`` counts in that order.
      logits: ``(P,)`` unnormalised log-probabilities of the pairs, ``P`` the
        power of two at or above ``K * U`` (padding cells are ``-inf``).
      pair_pos: ``(P,)`` position ``i`` of each pair.
      pair_value: ``(P,)`` count value ``v`` of each pair.
      alias: alias table of ``softmax(logits)``.
    """

    order: jax.Array
    sorted_counts: jax.Array
    logits: jax.Array
    pair_pos: jax.Array
    pair_value: jax.Array
    alias: AliasTable


def _prefix_sizes(neg_sorted: jax.Array, threshold: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(#{c_j >= t}, #{c_j > t})`` for counts given as ``-c`` ascending."""
    a = jnp.searchsorted(neg_sorted, -threshold, side="right")
    b = jnp.searchsorted(neg_sorted, -threshold, side="left")
    return a.astype(jnp.int32), b.astype(jnp.int32)


def _safe_log(x: jax.Array) -> jax.Array:
    xf = x.astype(jnp.float32)
    return jnp.where(xf > 0, jnp.log(jnp.where(xf > 0, xf, 1.0)), -jnp.inf)


def jem_prepare(counts: jax.Array, k: int, scale: jax.Array, num_values: int | None = None) -> JemTable:
    """Builds the pair table of JEM for one histogram (pure, vmappable).

    Args:
      counts: ``(d,)`` item counts (any reals), cast to float32.
      k: sequence length ``K <= d`` (static).
      scale: ``eps / (2 Delta_u)``, a float32 scalar.
      num_values: static upper bound on the number of distinct count values (default ``d``); a smaller bound makes
        sampling cheaper. It must not be exceeded.

    Returns:
      A :class:`JemTable`.
    """
    counts = jnp.asarray(counts, jnp.float32)
    d = counts.shape[0]
    u = d if num_values is None else num_values
    order = jnp.argsort(-counts, stable=True).astype(jnp.int32)
    c = counts[order]
    neg = -c
    values = jnp.unique(c, size=u, fill_value=jnp.inf)  # ascending, padded with inf
    ci = c[:k]
    # threshold[i, v, l] = c_(l) - g with g = c_(i) - v; exactly v when l == i.
    thr = c[None, None, :k] - ci[:, None, None] + values[None, :, None]
    a, b = _prefix_sizes(neg, thr.reshape(-1))
    a = a.reshape(thr.shape)
    b = b.reshape(thr.shape)
    pos = jnp.arange(k)
    i = pos[:, None, None]
    l = pos[None, None, :]
    log_terms = jnp.where(l < i, _safe_log(b - l), jnp.where(l == i, _safe_log(a - b), _safe_log(a - l)))
    log_count = jnp.sum(log_terms, axis=-1)  # (k, U)
    gap = ci[:, None] - values[None, :]
    valid = jnp.isfinite(values)[None, :] & (gap >= 0)
    logits = jnp.where(valid, log_count - scale * jnp.where(valid, gap, 0.0), -jnp.inf).reshape(-1)
    pairs = 1 << max(0, (k * u - 1).bit_length())
    pad = pairs - k * u
    logits = jnp.concatenate([logits, jnp.full((pad,), -jnp.inf)])
    return JemTable(
        order=order,
        sorted_counts=c,
        logits=logits,
        pair_pos=jnp.concatenate([jnp.repeat(pos, u), jnp.zeros((pad,), pos.dtype)]).astype(jnp.int32),
        pair_value=jnp.concatenate([jnp.tile(values, k), jnp.zeros((pad,), values.dtype)]),
        alias=alias_table(logits),
    )


def jem_noise(key: jax.Array, num: int, k: int) -> jax.Array:
    """Randomness of ``num`` JEM draws.

    Args:
      key: PRNG key.
      num: number of draws (static).
      k: sequence length ``K`` (static).

    Returns:
      ``(num, K + 2)`` uint32 words per draw: two for the alias-table pair, then one per position.
    """
    return random_words(key, (num, k + 2))


def jem_select(words: jax.Array, table: JemTable, k: int) -> jax.Array:
    """One JEM draw from its random words.

    Args:
      words: ``(K + 2,)`` uint32 words (a row of :func:`jem_noise`).
      table: the :class:`JemTable` of the histogram.
      k: sequence length ``K`` (static).

    Returns:
      ``(K,)`` int32 distinct item ids, the sampled sequence.
    """
    p = alias_draw(words[:2], table.alias)
    bits = words[2:]
    i_star = table.pair_pos[p]
    c = table.sorted_counts
    thr = c[:k] - c[i_star] + table.pair_value[p]
    thr = jnp.where(jnp.arange(k) == i_star, table.pair_value[p], thr)
    a, b = _prefix_sizes(-c, thr)
    ranks = jnp.arange(k, dtype=jnp.int32)

    def step(chosen_sorted, inputs):
        l, a_l, b_l, word = inputs
        is_star = l == i_star
        size = jnp.where(l < i_star, b_l, jnp.where(is_star, a_l - b_l, a_l))
        avail = jnp.maximum(jnp.where(is_star, size, size - l), 1)
        r = (word % avail.astype(jnp.uint32)).astype(jnp.int32)
        # r-th unchosen index of the prefix: r + #{j : chosen_j - j <= r}.
        skipped = jnp.sum((chosen_sorted - ranks) <= r).astype(jnp.int32)
        x = jnp.where(is_star, b_l + r, r + skipped)
        chosen_sorted = jnp.sort(chosen_sorted.at[k - 1].set(x))
        return chosen_sorted, x

    init = jnp.full((k,), _SENTINEL, jnp.int32)
    _, positions = jax.lax.scan(step, init, (ranks, a, b, bits))
    return table.order[positions]


def joint_exponential_topk(
    key: jax.Array,
    counts: jax.Array,
    *,
    k: int,
    epsilon: float,
    sensitivity: float = 1.0,
    num_values: int | None = None,
) -> jax.Array:
    """Samples the JEM top-``k`` sequence of item ids for one histogram.

    Args:
      key: PRNG key.
      counts: ``(d,)`` counts.
      k: sequence length (static).
      epsilon: privacy parameter (> 0).
      sensitivity: sensitivity ``Delta_u`` of the utility ``u``: 1 for add/remove neighbours, 2 for replace-one
        (swap) neighbours.
      num_values: static bound on the number of distinct counts (default ``d``).

    Returns:
      ``(k,)`` int32 item ids (distinct).

    Raises:
      InputError: ``epsilon`` or ``sensitivity`` is not a finite number > 0.

    Guarantees:
      ``epsilon``-DP when each count moves by at most ``sensitivity`` in the sense above (Gillenwater et al. 2022,
      Lemma 3.2).

    References:
      Gillenwater et al. 2022, "A Joint Exponential Mechanism for Differentially Private Top-k", ICML, Alg. 1 and
      Lemma 3.7.
    """
    scale = exponential_mechanism_scale(epsilon, sensitivity)
    table = jem_prepare(counts, k, jnp.float32(scale), num_values)
    return jem_select(jem_noise(key, 1, k)[0], table, k)


def sequence_utility(sorted_top: jax.Array, counts: jax.Array, sequence: jax.Array) -> jax.Array:
    """JEM utility ``u(s) = -max_i (c_(i) - c[s_i])`` of a sequence.

    Args:
      sorted_top: ``(K,)`` the ``K`` largest counts in decreasing order (``c_(1), ..., c_(K)``).
      counts: ``(d,)`` the counts.
      sequence: ``(K,)`` int item ids.

    Returns:
      The utility, a float scalar ``<= 0``.
    """
    return -jnp.max(sorted_top - counts[sequence])


class _KsaPrepared(NamedTuple):
    table: JemTable
    top_with: jax.Array
    top_without: jax.Array


@pytree_dataclass
class KeywordSpaceAggregation(Mechanism):
    """Keyword Space Aggregation (Wu et al. 2023; SnapAudit Alg. 6).

    Selects the top-``K`` keywords of the per-partition keyword histogram ``(d,)`` with the Joint Exponential
    Mechanism. The black-box decision is "the target keyword is selected"; the white-box score is the JEM
    log-likelihood ratio ``u_with(s) - u_without(s)`` of the selected sequence.

    Attributes:
      scale: ``eps / (2 Delta_u)``, ``()`` float32.
      top_k: ``K`` (static, default 4).
      num_values: static bound on distinct count values (``None``: vocabulary size).

    Guarantees:
      ``eps``-DP. Replacing one exemplar changes one partition's response, so keyword counts move by at most 1 *in
      both directions*: ``Delta_u = 2`` (the default of :meth:`calibrated`).
    """

    scale: jax.Array
    top_k: int = static_field(4)
    num_values: int | None = static_field(None)
    name: ClassVar[str] = "ksa"
    gaussian: ClassVar[bool] = False

    @classmethod
    def from_claim(cls, epsilon: float, delta: float, sensitivity: float, *, top_k: int,
                   num_values: int | None = None):
        """The registry's constructor: :meth:`calibrated`; ``delta`` is unused (pure DP).

        Args:
          epsilon: the claimed ``eps`` (> 0).
          delta: unused.
          sensitivity: sensitivity ``Delta_u`` of the JEM utility.
          top_k: sequence length ``K``.
          num_values: static bound on distinct count values (``None``: vocabulary size).

        Returns:
          The calibrated :class:`KeywordSpaceAggregation`.

        Raises:
          InputError: as :meth:`calibrated`.
        """
        return cls.calibrated(epsilon, top_k, sensitivity, num_values)

    @classmethod
    def calibrated(cls, epsilon: float, top_k: int, sensitivity: float = 2.0, num_values: int | None = None):
        """KSA with the exponential-mechanism scale ``epsilon / (2 sensitivity)``.

        Args:
          epsilon: the claimed ``eps`` (> 0).
          top_k: sequence length ``K >= 1``.
          sensitivity: sensitivity ``Delta_u`` of the JEM utility (default 2, replace-one neighbours).
          num_values: static bound on distinct count values (``None``: vocabulary size).

        Returns:
          The calibrated :class:`KeywordSpaceAggregation`.

        Raises:
          InputError: ``top_k`` not a positive integer, ``epsilon`` or ``sensitivity`` not a finite number > 0, or
            ``epsilon / (2 sensitivity)`` not a normal float32.
        """
        top_k = validate.positive_int("top_k", top_k)
        scale = float32_noise_parameter("scale", exponential_mechanism_scale(epsilon, sensitivity), epsilon=epsilon,
                                        sensitivity=sensitivity)
        return cls(
            scale=jnp.float32(scale),
            top_k=top_k,
            num_values=num_values,
        )

    @classmethod
    def neighbour_distance(cls, reference_with, reference_without):
        """Largest count increase plus largest count decrease: the change of the JEM utility it bounds.

        See :meth:`Mechanism.neighbour_distance`.
        """
        diff = np.asarray(reference_with, np.float64) - np.asarray(reference_without, np.float64)
        return float(max(diff.max(), 0.0) + max((-diff).max(), 0.0))

    def noise_unit(self):
        """``1 / scale``. See :meth:`Mechanism.noise_unit`."""
        return 1.0 / float(self.scale)

    def __call__(self, key, clean):
        """One trial on a ``(d,)`` histogram: ``Release(sequence (K,), sequence (K,))``.

        See :meth:`Mechanism.__call__`.
        """
        table = jem_prepare(clean, self.top_k, self.scale, self.num_values)
        seq = jem_select(jem_noise(key, 1, self.top_k)[0], table, self.top_k)
        return Release(seq, seq)

    def prepare(self, clean, attack):
        """The :class:`JemTable` of the histogram and the top-``K`` counts ``(K,)`` of both references.

        See :meth:`Mechanism.prepare`.
        """
        k = self.top_k
        return _KsaPrepared(
            table=jem_prepare(clean, k, self.scale, self.num_values),
            top_with=jax.lax.top_k(attack.reference_with, k)[0],
            top_without=jax.lax.top_k(attack.reference_without, k)[0],
        )

    def noise(self, key, num, prepared):
        """``(K + 2, num)`` uint32 words (:func:`jem_noise`, transposed). See :meth:`Mechanism.noise`."""
        return jem_noise(key, num, self.top_k).T

    def outcomes(self, noise, prepared, attack):
        # JEM's sequential selection is per trial: vmap over the trailing trial axis; leaves shared by
        # all trials (trailing size 1) are broadcast instead.
        """Hit: the target keyword is selected; score: ``u_with(s) - u_without(s)``. See :meth:`Mechanism.outcomes`."""
        num = noise.shape[-1]
        shared = jax.tree_util.tree_map(lambda x: x.shape[-1] == 1 and num != 1, prepared)
        prepared = jax.tree_util.tree_map(lambda x, s: x[..., 0] if s else x, prepared, shared)
        axes = jax.tree_util.tree_map(lambda s: None if s else -1, shared)
        return jax.vmap(self._outcome_one, in_axes=(-1, axes, None))(noise, prepared, attack)

    def _outcome_one(self, noise, prepared, attack):
        seq = jem_select(noise, prepared.table, self.top_k)
        hit = jnp.any(seq == attack.target)
        score = sequence_utility(prepared.top_with, attack.reference_with, seq) - sequence_utility(
            prepared.top_without, attack.reference_without, seq
        )
        return hit, score


def count_distinct_values(histograms: np.ndarray) -> int:
    """Largest number of distinct count values over the rows of a histogram matrix.

    Args:
      histograms: ``(n, d)`` counts.

    Returns:
      ``max`` over rows of the number of distinct values in the row.
    """
    h = np.asarray(histograms)
    s = np.sort(h, axis=-1)
    return int(np.max(1 + np.sum(s[:, 1:] != s[:, :-1], axis=-1)))


def bucket_num_values(histograms: np.ndarray) -> int:
    """:func:`count_distinct_values` rounded up to a power of two and capped at ``d`` (a static ``num_values``).

    Args:
      histograms: ``(n, d)`` counts.

    Returns:
      The bound, an int in ``[1, d]``.
    """
    u = count_distinct_values(histograms)
    d = np.asarray(histograms).shape[-1]
    return int(min(d, 1 << (u - 1).bit_length()))
