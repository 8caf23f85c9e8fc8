"""The DP-SGD noise: a Gaussian exact in its tails (scipy's ``ndtri`` and normal distribution as oracles), the
privatizer built on it, and what a truncated sampler does to the stated delta.

Monte Carlo tests state their false-alarm probability and check their power on a perturbed sampler.
"""

from __future__ import annotations

import math
from fractions import Fraction

import jax
import jax.numpy as jnp
from jax.extend import core as jcore
import numpy as np
import pytest
from scipy import special, stats

from snapaudit_jax.dpsgd import noise
from snapaudit_jax.mechanisms.variates import normal_from_bits, random_words

ALPHA = 1e-6  # false-alarm probability of each Monte Carlo test below


def _words_for(k: int) -> tuple[int, int, int]:
    """Three words whose uniform on (0, 1/2) is about 2^-k (sign bit clear)."""
    if k <= 32:
        return 2 ** (32 - k), 0, 0
    if k <= 64:
        return 0, 2 ** (64 - k), 0
    return 0, 0, 2 ** (96 - k)


def _uniform(hi: int, w1: int, w2: int) -> float:
    """The sampler's uniform, exactly: the middle of a ``2^-64`` cell, or of a ``2^-96`` cell where ``hi`` is 0."""
    if hi:
        return float((hi + Fraction(2 * w1 + 1, 2**33)) / 2**32)
    return float((w1 + (Fraction(w2) + Fraction(1, 2)) / 2**32) / 2**64)


def _sampler(words: np.ndarray, *, lazy: bool) -> np.ndarray:
    """``refined_normal`` of ``(3, n)`` words: the first two planes, the third on demand."""
    words = jnp.asarray(words, jnp.uint32)
    return np.asarray(jax.jit(lambda w: noise.refined_normal(w[:2], lambda: w[2:], lazy=lazy))(words))


@pytest.mark.parametrize("lazy", [True, False])
def test_every_tail_probability_down_to_2_to_the_minus_97_maps_to_its_normal_quantile(lazy):
    """The transform at ``u = 2^-2 ... 2^-96`` (and the outermost cell's middle, ``2^-97``) equals scipy's float64
    quantile ``ndtri(u)`` to float32 precision, drawn with the third word on demand or always; the largest output
    is 11.3 noise units."""
    words = [_words_for(k) for k in range(2, 97)] + [(0, 0, 0), (1, 0, 0), (0x7FFFFFFF, 0xFFFFFFFF, 7)]
    u = np.array([_uniform(*w) for w in words])
    z = _sampler(np.array(words, np.uint32).T, lazy=lazy).astype(np.float64)
    np.testing.assert_allclose(z, special.ndtri(u), rtol=1e-6)
    assert u[95] == 2.0**-97 and z[95] == pytest.approx(-11.3034, abs=1e-4)
    assert u[96] == 2.0**-32 + 2.0**-65 and u[-1] == 0.5 - 2.0**-65
    negative = _sampler(np.array([(1 << 31, 0, 0)], np.uint32).T, lazy=lazy)
    assert negative[0] == pytest.approx(11.3034, abs=1e-4)  # the sign bit mirrors it


def test_the_third_word_refines_exactly_the_coordinates_below_2_to_the_minus_32():
    """Changing the third plane changes the output where the first word's 31 uniform bits are zero (and the
    second's value is small enough for float32 to see the third's bits) and nowhere else; the on-demand and the
    always-drawn evaluations agree to float32 rounding, with and without such coordinates."""
    rng = np.random.default_rng(0)
    words = rng.integers(0, 2**32, size=(3, 4096), dtype=np.uint64).astype(np.uint32)
    rare = np.zeros(4096, bool)
    rare[[3, 100, 4000]] = True
    words[0, rare] &= np.uint32(1 << 31)
    words[1, rare] = [0, 5, 1000]  # small enough that float32 keeps the third word's bits of u
    other = words.copy()
    other[2] = rng.integers(0, 2**32, size=4096, dtype=np.uint64).astype(np.uint32)
    a, b = _sampler(words, lazy=True), _sampler(other, lazy=True)
    assert np.all(a[rare] != b[rare]) and np.array_equal(a[~rare], b[~rare])
    np.testing.assert_allclose(a, _sampler(words, lazy=False), rtol=1e-6)  # fused apart: float32 rounding may differ
    common = words[:, ~rare]
    np.testing.assert_allclose(_sampler(common, lazy=True), _sampler(common, lazy=False), rtol=1e-6)
    np.testing.assert_allclose(_sampler(common, lazy=True), normal_from_bits(jnp.asarray(common[:2])), rtol=1e-6)


def _jax_normal_extremes() -> tuple[float, float]:
    """The smallest and largest float32 ``jax.random.normal`` can return: its transform at the extreme uniforms."""
    lo, hi = np.nextafter(np.float32(-1), np.float32(0)), np.float32(1)
    out = []
    for mantissa in (0, 2**23 - 1):
        x = np.float32(1 + mantissa * 2.0**-23) - np.float32(1)
        u = max(lo, np.float32(x * (hi - lo) + lo))
        out.append(float(np.sqrt(np.float32(2)) * jax.scipy.special.erfinv(jnp.float32(u))))
    return out[0], out[1]


def test_jax_random_normal_stops_near_5_sigma_so_a_neighbour_is_told_apart_far_more_often_than_delta():
    """The example the module docstring gives: at ``examples/finetune_scale.toml``'s sigma, q, steps and delta, a
    unit whose clipped gradient lies on one coordinate produces an output the other neighbour cannot with
    probability ``1 - (1 - q P(Z > z_max - 1/sigma))^T``: over 100 times delta for ``jax.random.normal``'s range,
    under ``1e-20`` for this sampler's. That probability is a lower bound on the run's true delta at any epsilon."""
    low, high = _jax_normal_extremes()
    assert -5.43 < low < -5.41 and 5.21 < high < 5.23
    empirical = jax.random.normal(jax.random.key(0), (1 << 24,))
    assert low <= float(empirical.min()) and float(empirical.max()) <= high

    sigma, q, steps, delta = 0.613153, 0.0224266, 200, 4.38e-6

    def told_apart(z_max: float) -> float:
        return -math.expm1(steps * math.log1p(-q * stats.norm.sf(z_max - 1 / sigma)))

    ours = float(-_sampler(np.zeros((3, 1), np.uint32), lazy=True)[0])
    assert told_apart(high) > 100 * delta
    assert told_apart(ours) < 1e-20


def test_the_noise_is_standard_normal_in_the_bulk():
    """Kolmogorov-Smirnov against N(0, 1) on 2^22 draws (false alarm ALPHA); power: a 1% scale error is found."""
    z = np.asarray(noise.standard_normal(jax.random.key(1), (1 << 22,)), np.float64)
    assert stats.kstest(z, "norm").pvalue > ALPHA
    assert stats.kstest(z * 1.01, "norm").pvalue < ALPHA
    assert abs(z.mean()) * math.sqrt(z.size) < 5.0  # |N(0, 1)| > 5: 6e-7


def test_the_noise_is_exact_beyond_6_sigma():
    """Draws whose first word's 31 uniform bits are zero, where the third word refines ``u``, are the normal
    conditioned on ``|Z| > -ndtri(2^-32) = 6.23``: their distribution matches scipy's conditional tail (KS, false
    alarm ALPHA), as far as the 2^-97 cell; power: the same test finds a 0.2% scale error out there."""
    n = 1 << 18
    words = np.array(jax.random.bits(jax.random.key(2), (3, n), jnp.uint32))
    words[0] &= np.uint32(1 << 31)  # keep the sign, zero the top 31 bits of u
    z = np.abs(_sampler(words, lazy=True).astype(np.float64))
    z0 = -special.ndtri(2.0**-32)
    assert z.min() >= z0 * (1 - 1e-6)

    def tail_cdf(x):
        return -np.expm1(stats.norm.logsf(x) - stats.norm.logsf(z0))

    assert stats.kstest(z, tail_cdf).pvalue > ALPHA
    assert stats.kstest(z * 1.002, tail_cdf).pvalue < ALPHA


@pytest.mark.slow  # compiles the sampler for a leaf of 2^20 coordinates (its bfloat16 tails): 4-5.5 s cold
def test_the_privatizer_adds_sigma_c_times_the_sampler_to_every_leaf_in_float32():
    """The update is ``leaf + stddev * z`` computed in float32 and cast back, ``z`` drawn under ``split(key)[1]``:
    a leaf of at least ``GROUP_BELOW`` coordinates under ``fold_in(sub, leaf index)``, the smaller ones sharing one
    draw under ``fold_in(sub, GROUPED)`` in leaf order; the next update uses the split key's other half; a bfloat16
    leaf gets the float32 draw rounded once (over 128 distinct values and tails past 4.5, where bfloat16
    ``jax.random.normal`` has 128 values below 2.9)."""
    key = jax.random.key(3)
    large = (2, noise.GROUP_BELOW // 2)
    grads = {"a": jnp.ones((1000,), jnp.float32), "b": jnp.zeros(large, jnp.bfloat16),
             "c": jnp.full((3, 7), 2.0, jnp.float32)}
    tx = noise.gaussian_privatizer(0.5, key)
    state = tx.init(grads)
    out, state = tx.update(grads, state)
    rest, sub = jax.random.split(key)
    joint = noise.standard_normal(jax.random.fold_in(sub, noise.GROUPED), (1021,))  # a, then c
    np.testing.assert_array_equal(out["a"], 1.0 + 0.5 * joint[:1000])
    np.testing.assert_array_equal(out["c"], 2.0 + 0.5 * joint[1000:].reshape(3, 7))
    expected_b = (0.5 * noise.standard_normal(jax.random.fold_in(sub, 1), large)).astype(jnp.bfloat16)
    np.testing.assert_array_equal(out["b"], expected_b)
    assert out["b"].dtype == jnp.bfloat16
    b = np.asarray(out["b"], np.float32)
    assert len(np.unique(b)) > 128 and np.abs(b).max() / 0.5 > 4.5
    assert jax.random.key_data(state).tolist() == jax.random.key_data(rest).tolist()
    again, _ = tx.update(grads, state)
    assert not np.array_equal(again["a"], out["a"])


def _hashes(jaxpr) -> int:
    """Threefry hashes in a traced program, its sub-programs (``cond`` branches, nested jits) included."""
    count = 0
    for eqn in jaxpr.eqns:
        count += eqn.primitive.name == "threefry2x32"
        for value in eqn.params.values():
            for sub in value if isinstance(value, (tuple, list)) else (value,):
                if isinstance(sub, jcore.ClosedJaxpr):
                    count += _hashes(sub.jaxpr)
                elif isinstance(sub, jcore.Jaxpr):
                    count += _hashes(sub)
    return count


def test_the_small_leaves_joint_draw_is_one_compiled_draw_and_independent_across_leaves():
    """Many small leaves trace to the two Threefry hashes of one draw (its two planes and its third), against two
    per leaf when drawn leaf by leaf (what XLA would compile: every call site is inlined), and their noise is the
    joint draw's consecutive slices: no two leaves share a coordinate's noise (a leaf's slice correlates with no
    other)."""
    leaves = [jnp.zeros((64 + i, 32)) for i in range(12)]
    key = jax.random.key(0)
    assert _hashes(jax.make_jaxpr(lambda k: noise.leaf_noise(k, leaves))(key).jaxpr) == 2
    one_each = jax.make_jaxpr(lambda k: [noise.standard_normal(jax.random.fold_in(k, i), x.shape)
                                         for i, x in enumerate(leaves)])(key)
    assert _hashes(one_each.jaxpr) == 24
    z = noise.leaf_noise(jax.random.key(6), leaves)
    assert [x.shape for x in z] == [x.shape for x in leaves]
    flat = [np.asarray(x).ravel()[:2048] for x in z]
    corr = np.corrcoef(np.stack(flat))
    assert np.abs(corr - np.eye(12)).max() < 0.15  # 2048 pairs: |r| < 0.15 fails w.p. < 1e-11 a pair


def test_sampler_delta_is_the_total_variation_bound():
    """``(1 + e^eps) T d 2^-71``, exactly; zero without steps or coordinates; infinite without a finite epsilon."""
    assert noise.TAIL_PROBABILITY == 2.0**-71
    assert noise.sampler_delta(8.0, 200, 1_843_200) == (1 + math.exp(8.0)) * 200 * 1_843_200 * 2.0**-71
    assert 4.6e-10 < noise.sampler_delta(8.0, 200, 1_843_200) < 4.7e-10
    assert noise.sampler_delta(8.0, 0, 10) == noise.sampler_delta(8.0, 10, 0) == 0.0
    assert noise.sampler_delta(math.inf, 1, 1) == noise.sampler_delta(800.0, 1, 1) == math.inf


@pytest.mark.slow
def test_an_array_larger_than_one_keys_counters_is_drawn_in_chunks_under_folded_keys(monkeypatch):
    """Past ``PER_KEY`` coordinates chunk ``c`` comes from ``fold_in(key, c)`` (here with ``PER_KEY = 1000``),
    so no counter repeats; below it, one key draws the whole array."""
    key = jax.random.key(4)
    whole = noise.standard_normal(key, (2, 900))
    monkeypatch.setattr(noise, "PER_KEY", 1000)
    chunked = np.asarray(noise.standard_normal(key, (2, 900))).ravel()
    first = np.asarray(noise.standard_normal(jax.random.fold_in(key, 0), (1000,)))
    second = np.asarray(noise.standard_normal(jax.random.fold_in(key, 1), (800,)))
    np.testing.assert_array_equal(chunked, np.concatenate([first, second]))
    assert not np.array_equal(chunked, np.asarray(whole).ravel())


def test_standard_normal_is_the_refined_transform_of_its_keys_words():
    """Two planes under the key, the third the first of two under ``fold_in(key, THIRD_PLANE)``; on the CPU the
    third is drawn on demand (both evaluations agree, the test above)."""
    key = jax.random.key(5)
    first = random_words(key, (2, 3000))
    third = random_words(jax.random.fold_in(key, noise.THIRD_PLANE), (2, 3000))[:1]
    expected = noise.refined_normal(first, lambda: third, lazy=False).reshape(3, 1000)
    np.testing.assert_allclose(noise.standard_normal(key, (3, 1000)), expected, rtol=1e-6)
    assert noise.lazy_third_plane() == (jax.default_backend() == "cpu")
    assert noise.NOISE_WORDS * noise.PER_KEY == 2**32


@pytest.mark.slow
def test_the_draw_is_the_same_whatever_its_block_and_the_last_block_adds_its_noise_once():
    """A draw's values do not depend on the block it is drawn in: blocks that divide the array, blocks that do not
    (the last moved back over its neighbour) and one block give the same noise, which is the refined transform of
    the whole draw's words; adding it to an array adds every coordinate's noise exactly once (power: a last block
    that added again over its neighbour's coordinates would double them)."""
    key = jax.random.key(9)
    n = 10_007
    expected = noise.refined_normal(random_words(key, (2, n)),
                                    lambda: random_words(jax.random.fold_in(key, noise.THIRD_PLANE), (2, n))[:1],
                                    lazy=False)
    whole = np.asarray(noise.standard_normal(key, (n,), block=n))
    np.testing.assert_allclose(whole, expected, rtol=1e-6)
    for block in (1000, 10_006):
        np.testing.assert_allclose(noise.standard_normal(key, (n,), block=block), whole, rtol=1e-6, atol=0)
    added = np.asarray(noise.add_standard_normal(key, jnp.ones((n,)), block=1000)) - 1.0
    np.testing.assert_allclose(added, whole, rtol=1e-5, atol=1e-6)  # 1 + z - 1: float32 rounding of the sum
    halves = noise.add_standard_normal(key, jnp.zeros((n,), jnp.bfloat16), block=1000)
    assert halves.dtype == jnp.bfloat16
    np.testing.assert_array_equal(halves, whole.astype(jnp.bfloat16))


def _temp_bytes(fn, n: int) -> int:
    compiled = jax.jit(fn, donate_argnums=1).lower(jax.random.key(0), jax.ShapeDtypeStruct((n,), jnp.float32))
    return int(compiled.compile().memory_analysis().temp_size_in_bytes)


def test_a_draws_working_memory_is_its_blocks_not_its_arrays(monkeypatch):
    """XLA's plan of a draw into a donated array holds one block's words and transforms: four times the array adds
    less than a byte a coordinate to its working memory (the two word planes alone are 8 bytes a coordinate); so
    does the privatizer's update of a large leaf. Power, on the CPU (where XLA keeps the hash's planes; another
    backend may fuse them away): one block the size of the array grows by at least those 8 bytes."""
    block, small, large = 1 << 16, noise.GROUP_BELOW, 4 * noise.GROUP_BELOW

    def draw(size):
        return lambda k, x: noise.add_standard_normal(k, x, block=size)

    def privatize(k, x):
        tx = noise.gaussian_privatizer(0.5, k)
        return tx.update([x], tx.init([x]))[0][0]

    assert _temp_bytes(draw(block), large) - _temp_bytes(draw(block), small) < large - small
    monkeypatch.setattr(noise, "BLOCK", block)
    assert _temp_bytes(privatize, large) - _temp_bytes(privatize, small) < large - small
    if jax.default_backend() == "cpu":
        assert _temp_bytes(draw(large), large) - _temp_bytes(draw(small), small) >= 8 * (large - small)


@pytest.mark.slow  # trains a step to checkpoint it: 5-7 s cold
def test_a_checkpoint_drawn_by_another_sampler_is_refused_on_resume(tmp_path, monkeypatch):
    """The sampler is part of a run's identity: a checkpoint written with other noise (here: a run whose sampler
    is named otherwise, as the checkpoints written with ``jax.random.normal`` have none) does not resume."""
    from snapaudit_jax.dpsgd import DPSGDConfig, train
    from snapaudit_jax.utils.errors import InputError
    from tests.snapaudit_jax.dpsgd.test_dpsgd import BASE, DATA, make_model

    config = DPSGDConfig(steps=2, learning_rate=0.1, clip_norm=1.0, noise_multiplier=1.0, sampling_rate=0.5, **BASE)
    train(make_model(), DATA, config, key=jax.random.key(0), checkpoint_dir=str(tmp_path), stop_after=1)
    monkeypatch.setattr(noise, "SAMPLER", "jax.random.normal (float32)")
    with pytest.raises(InputError, match=r"noise differs from this run \(checkpoint 'float32 inverse-CDF normals .*', "
                                         r"run 'jax.random.normal \(float32\)'\)"):
        train(make_model(), DATA, config, key=jax.random.key(0), checkpoint_dir=str(tmp_path))


def test_coordinates_counts_every_entry_of_a_trainable_state_concrete_or_abstract():
    """An ``nnx.Linear(3, 4)`` has 12 kernel and 4 bias entries; a LoRA filter counts the adapters only."""
    from flax import nnx

    layer = nnx.Linear(3, 4, rngs=nnx.Rngs(0))
    assert noise.coordinates(nnx.state(layer, nnx.Param)) == 16
    assert noise.coordinates(jax.eval_shape(lambda: nnx.state(layer, nnx.Param))) == 16
    lora = nnx.LoRA(3, 2, 4, rngs=nnx.Rngs(0))
    assert noise.coordinates(nnx.state(lora, nnx.LoRAParam)) == 3 * 2 + 2 * 4
    assert noise.coordinates({}) == 0
