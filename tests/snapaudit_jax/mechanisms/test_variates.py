"""Tail-exact variates and alias tables against closed forms."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import special, stats

from snapaudit_jax.mechanisms import variates as sampling
from snapaudit_jax.utils.errors import InputError


def _words(hi, lo):
    return jnp.stack([jnp.asarray(hi, jnp.uint32), jnp.asarray(lo, jnp.uint32)])


def test_half_uniform_resolves_tiny_values():
    """u keeps float32 relative precision far below 2^-32 (where one 32-bit word would stop)."""
    lo = np.array([0, 1, 1000, 2**31, 2**32 - 1], np.uint32)
    _, u = sampling.sign_and_half_uniform(_words(np.zeros(5, np.uint32), lo))
    expected = (lo.astype(np.float64) + 0.5) * 2.0**-64
    np.testing.assert_allclose(np.asarray(u, np.float64), expected, rtol=1e-6)
    _, top = sampling.sign_and_half_uniform(_words([0x7FFFFFFF], [2**32 - 1]))
    assert 0.4999 < float(top[0]) <= 0.5


def test_normal_transform_is_the_inverse_cdf_deep_in_the_tail():
    """normal_from_bits = -ndtri(u) with the sign bit, accurate where jax.random.normal has no mass (|z| > 5.4)."""
    hi = np.array([0, 0, 5, 2**20, 2**30, 0x80000000 | 3], np.uint32)
    lo = np.array([7, 2**31, 0, 0, 0, 0], np.uint32)
    z = np.asarray(sampling.normal_from_bits(_words(hi, lo)), np.float64)
    u = ((hi & 0x7FFFFFFF).astype(np.float64) + (lo.astype(np.float64) + 0.5) * 2.0**-32) * 2.0**-32
    expected = np.where(hi >> 31, -special.ndtri(u), special.ndtri(u))
    np.testing.assert_allclose(z, expected, rtol=2e-6)
    assert np.abs(z).max() > 8.5


def test_logistic_and_gumbel_transforms():
    hi = np.array([0, 3, 2**24, 0x80000000, 0x80000000 | 2**29], np.uint32)
    lo = np.array([1, 0, 0, 5, 0], np.uint32)
    u = ((hi & 0x7FFFFFFF).astype(np.float64) + (lo.astype(np.float64) + 0.5) * 2.0**-32) * 2.0**-32
    sign = (hi >> 31).astype(bool)
    x = np.asarray(sampling.logistic_from_bits(_words(hi, lo)), np.float64)
    np.testing.assert_allclose(x, np.where(sign, 1, -1) * np.log((1 - u) / u), rtol=2e-6)
    assert np.abs(x).max() > 40  # far beyond the ~16.6 reach of float32-uniform logistics


@pytest.mark.parametrize(
    "name,dist", [("normal", stats.norm), ("logistic", stats.logistic), ("gumbel", stats.gumbel_r)]
)
def test_variates_follow_their_law(name, dist):
    """KS test on 200k draws (false-failure prob 1e-6); power: a shift of 0.03 is rejected."""
    x = np.asarray(getattr(sampling, name)(jax.random.key(0), (200_000,)), np.float64)
    assert stats.kstest(x, dist.cdf).pvalue > 1e-6
    assert stats.kstest(x, lambda v: dist.cdf(v - 0.03)).pvalue < 1e-6


def test_normal_tail_frequency():
    """P(|Z| > 4) on 2^24 draws matches 2 Phi(-4) (z-test at 5.3 sd, false-failure prob ~1e-7: 16% of the expected
    1,063); power: the same draws 5% too wide (2,335 expected) miss it by 39 sd."""
    n = 1 << 24

    def counts(key):
        z = jnp.abs(sampling.normal(key, (n,)))
        return jnp.sum(z > 4.0), jnp.sum(1.05 * z > 4.0)

    count, wide = (int(c) for c in jax.jit(counts)(jax.random.key(1)))
    p = 2 * special.ndtr(-4.0)
    sd = np.sqrt(n * p)
    assert abs(count - n * p) < 5.3 * sd
    assert abs(wide - n * p) > 5.3 * sd


@pytest.mark.parametrize("seed", range(4))
def test_alias_table_reproduces_softmax(seed):
    """The probabilities implied by the table equal softmax(logits), rare cells included."""
    rng = np.random.default_rng(seed)
    n = 64
    logits = rng.normal(scale=4.0, size=n)
    logits[rng.integers(0, n, 5)] = -np.inf
    logits[3] = logits.max() - 20.0  # a cell with probability ~1e-9
    table = sampling.alias_table(jnp.asarray(logits, jnp.float32))
    keep = np.where(np.asarray(table.keep_all), 1.0, np.asarray(table.threshold, np.float64) / 2.0**32)
    implied = keep / n
    np.add.at(implied, np.asarray(table.alias), (1.0 - keep) / n)
    target = special.softmax(logits)
    np.testing.assert_allclose(implied, target, rtol=1e-5, atol=2.0**-32 / n)
    assert implied[3] == pytest.approx(target[3], rel=0.05)


def test_alias_draw_frequencies():
    """Draws follow the table (chi-square, false-failure prob 1e-6)."""
    logits = jnp.log(jnp.array([0.5, 0.25, 0.125, 0.0625, 0.0625, 0.0, 0.0, 0.0]) + 1e-30)
    table = sampling.alias_table(logits)
    words = jax.random.bits(jax.random.key(3), (400_000, 2), jnp.uint32)
    cells = np.asarray(jax.vmap(lambda w: sampling.alias_draw(w, table))(words))
    counts = np.bincount(cells, minlength=8)
    assert counts[5:].sum() == 0
    probs = np.array([0.5, 0.25, 0.125, 0.0625, 0.0625])
    assert stats.chisquare(counts[:5], probs * counts.sum()).pvalue > 1e-6


def test_alias_table_needs_power_of_two():
    with pytest.raises(ValueError, match="power-of-two"):
        sampling.alias_table(jnp.zeros(6))


def test_random_words_are_jax_counter_mode_threefry():
    """random_words is the layout of jax.random.bits without partitionable Threefry, per key and under vmap; raw
    keys of the default implementation give the typed key's words; an rbg key falls back to jax.random.bits."""
    key = jax.random.key(7)
    for shape in [(1,), (5,), (3, 1001), (2, 2, 2)]:
        with jax.threefry_partitionable(False):
            expected = np.asarray(jax.random.bits(key, shape, jnp.uint32))
        got = np.asarray(sampling.random_words(key, shape))
        assert got.shape == shape and got.dtype == np.uint32
        assert np.array_equal(got, expected), shape
    keys = jax.random.split(key, 4)
    looped = np.stack([np.asarray(sampling.random_words(k, (5,))) for k in keys])
    assert np.array_equal(np.asarray(jax.vmap(lambda k: sampling.random_words(k, (5,)))(keys)), looped)
    assert np.array_equal(np.asarray(sampling.random_words(jax.random.PRNGKey(7), (9,))),
                          np.asarray(sampling.random_words(key, (9,))))
    rbg = jax.random.key(1, impl="rbg")
    expected = np.asarray(jax.random.bits(rbg, (4,), jnp.uint32))
    assert np.array_equal(np.asarray(sampling.random_words(rbg, (4,))), expected)
    assert sampling.random_words(key, (0, 3)).shape == (0, 3)


def test_word_columns_are_the_columns_of_the_whole_two_plane_draw():
    """Columns [start, start + size) of random_words(key, (2, n)), at the first, a middle and the last columns, with
    start static or traced (under jit), for raw and typed keys and for an rbg key (its fallback); the start is read
    (a neighbouring block differs) and too many words are refused."""
    key = jax.random.key(11)
    n = 1001
    whole = np.asarray(sampling.random_words(key, (2, n)))
    traced = jax.jit(lambda k, s: sampling.word_columns(k, n, s, 64))
    for start in (0, 300, n - 64):
        assert np.array_equal(np.asarray(sampling.word_columns(key, n, start, 64)), whole[:, start:start + 64])
        assert np.array_equal(np.asarray(traced(key, start)), whole[:, start:start + 64])
    assert not np.array_equal(np.asarray(traced(key, 301)), whole[:, 300:364])
    assert np.array_equal(np.asarray(sampling.word_columns(jax.random.key_data(key), n, 5, 3)), whole[:, 5:8])
    rbg = jax.random.key(1, impl="rbg")
    assert np.array_equal(np.asarray(sampling.word_columns(rbg, 10, 4, 3)),
                          np.asarray(sampling.random_words(rbg, (2, 10)))[:, 4:7])
    with pytest.raises(InputError, match="2\\^32"):
        sampling.word_columns(key, (1 << 31) + 1, 0, 4)


def _byte_pair_pvalue(words: np.ndarray) -> float:
    """Chi-square p-value of the joint law of the top bytes of neighbouring words (256 x 256 cells)."""
    top = (words >> 24).astype(np.int64)
    cells = np.bincount(top[0::2] * 256 + top[1::2], minlength=65536)
    return stats.chisquare(cells).pvalue


def test_random_words_are_uniform_and_pairwise_independent():
    """Top bytes of neighbouring words (one Threefry hash) and of words half the array apart (the two halves of
    one hash) are jointly uniform (chi-square, false-failure prob 1e-6 each); power: a stuck bit is rejected."""
    n = 1 << 22
    words = np.asarray(sampling.random_words(jax.random.key(11), (n,)))
    assert _byte_pair_pvalue(words) > 1e-6
    halves = np.stack([words[: n // 2], words[n // 2:]], axis=1).reshape(-1)  # word c next to word c + n/2
    assert _byte_pair_pvalue(halves) > 1e-6
    assert _byte_pair_pvalue(words | np.uint32(1 << 24)) < 1e-6


def test_random_words_refuses_more_than_2_32_words():
    with pytest.raises(ValueError, match=r"at most 2\^32 words per key, got shape \(65536, 65537\)"):
        sampling.random_words(jax.random.key(0), (65536, 65537))
