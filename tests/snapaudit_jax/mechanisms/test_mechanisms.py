"""Mechanism kernels against independent oracles (closed forms, mpmath, full-dimensional noise)."""

import math

import chex
import jax
import jax.numpy as jnp
import mpmath as mp
import numpy as np
import pytest
from scipy import special, stats

import snapaudit_jax as sa
from snapaudit_jax.audits.active import make_attack
from snapaudit_jax.simulation.exact import exact_hit_probability, exact_score_probability, pv_argmax_probability
from snapaudit_jax.audits.command import esa_unit_pair
from snapaudit_jax.simulation.trials import simulate

# Two-sided z threshold for a false-failure probability of 1e-7 per check.
Z_1E7 = float(stats.norm.isf(0.5e-7))


def _binomial_z(hits, n, p):
    return (hits - n * p) / math.sqrt(n * p * (1 - p))


def test_pv_argmax_probability_matches_mpmath_quadrature():
    """The 1-D integral for P(argmax = t) agrees with a 30-digit mpmath quadrature, also deep in the tail."""
    mp.mp.dps = 30
    cases = [([1.0, 2.0, 0.5], 0.6, 0), ([0.0, 3.0, 2.5, 1.0], 0.3, 0), ([4.0, 1.0, 1.0], 2.0, 2)]
    for votes, sigma, t in cases:
        a = [(votes[t] - v) / sigma for j, v in enumerate(votes) if j != t]
        ref = mp.quad(lambda z, a=a: mp.npdf(z) * mp.fprod(mp.ncdf(ai + z) for ai in a), [-mp.inf, -10, 0, 10, mp.inf])
        p, q = pv_argmax_probability(votes, sigma, t)
        assert p == pytest.approx(float(ref), rel=1e-8), (votes, sigma, t)
        assert q == pytest.approx(float(1 - ref), rel=1e-8)


def test_pv_two_class_closed_form():
    """k = 2 reduces to Phi((v_t - v_o) / (sigma sqrt 2)), with an accurate complement."""
    p, q = pv_argmax_probability([0.0, 3.0], 0.428, 0)
    assert p == pytest.approx(special.ndtr(-3 / (0.428 * math.sqrt(2))), rel=1e-12)
    assert q == pytest.approx(special.ndtr(3 / (0.428 * math.sqrt(2))), rel=1e-12)


@pytest.mark.parametrize("k", [2, 3])
def test_pv_kernel_distribution_matches_exact(k):
    """vmapped one-trial PV kernel: argmax frequencies match the exact probabilities (failure prob ~1e-7 each)."""
    votes = jnp.array([1.0, 2.0, 1.5][:k])
    mech = sa.PrivateVoting(sigma=jnp.float32(0.8))
    n = 200_003
    keys = jax.random.split(jax.random.key(3), n)
    rel = jax.jit(jax.vmap(mech, in_axes=(0, None)))(keys, votes)
    labels = np.asarray(rel.output)
    assert rel.noisy.shape == (n, k)
    for t in range(k):
        p, _ = pv_argmax_probability(np.asarray(votes), 0.8, t)
        assert abs(_binomial_z((labels == t).sum(), n, p)) < Z_1E7


def test_poe_kernel_is_softmax():
    """Gumbel-max over utility*scale samples softmax(utility*scale) (failure prob ~1e-7 per class)."""
    mech = sa.ProductOfExperts.calibrated(2.0, clip=5.0)
    u = jnp.array([-25.11, -10.13, -12.0])
    n = 200_003
    keys = jax.random.split(jax.random.key(5), n)
    labels = np.asarray(jax.jit(jax.vmap(mech, in_axes=(0, None)))(keys, u).output)
    probs = special.softmax(np.asarray(u, np.float64) * 0.2)
    for t in range(3):
        assert abs(_binomial_z((labels == t).sum(), n, probs[t])) < Z_1E7


@pytest.mark.slow
def test_poe_margin_is_logistic():
    """Max-stability: the margin of the Gumbel kernel and the simulator's one-logistic outcome are both
    Logistic(m_t - LSE_{j!=t} m_j, 1) (KS tests, p > 1e-6); power: a location off by 0.1 is rejected."""
    mech = sa.ProductOfExperts.calibrated(4.0, clip=5.0)
    u = np.array([-25.11, -10.13, -12.0])
    attack = make_attack(mech, u, u, target=0)
    n = 50_000
    noisy = jax.jit(jax.vmap(mech, in_axes=(0, None)))(jax.random.split(jax.random.key(9), n), jnp.asarray(u)).noisy
    noisy = np.asarray(noisy, np.float64)
    kernel_margin = noisy[:, 0] - noisy[:, 1:].max(axis=1)
    prepared = mech.prepare(jnp.asarray(u), attack)
    hits, sim_margin = mech.outcomes(mech.noise(jax.random.key(10), n, prepared), prepared[None], attack)
    assert np.array_equal(np.asarray(hits), np.asarray(sim_margin) > 0)
    m = u * float(mech.scale)
    loc = m[0] - special.logsumexp(m[1:])
    for margins in (kernel_margin, np.asarray(sim_margin, np.float64)):
        assert stats.kstest(margins, stats.logistic(loc=loc).cdf).pvalue > 1e-6
        assert stats.kstest(margins, stats.logistic(loc=loc + 0.1).cdf).pvalue < 1e-6


def test_esa_projected_noise_equals_full_noise():
    """ESA's reduced-dimension outcome gives the same release and score as full d-dimensional noise."""
    rng = np.random.default_rng(0)
    d, c = 97, 3
    cand = rng.normal(size=(c, d))
    cand /= np.linalg.norm(cand, axis=1, keepdims=True)
    mean = cand.mean(0) + 0.05 * rng.normal(size=d)
    mech = sa.EmbeddingSpaceAggregation(sigma=jnp.float32(0.3), candidates=jnp.asarray(cand, jnp.float32))
    ref_w, ref_wo = cand[0] + 0.1 * rng.normal(size=d), cand[1]
    attack = make_attack(mech, ref_w, ref_wo, target=0)
    prepared = mech.prepare(jnp.asarray(mean, jnp.float32), attack)
    z = rng.normal(size=(2000, d)).astype(np.float32)
    # Express the full noise in the kernel's orthonormal basis of span(c_i - c_0, w).
    w = attack.reference_with - attack.reference_without
    basis, _ = jnp.linalg.qr(jnp.concatenate([mech.candidates[1:] - mech.candidates[:1], w[None]], 0).T)
    assert basis.shape == (d, c)
    y = z @ np.asarray(basis)
    hit, score = mech.outcomes(jnp.asarray(y.T), jax.tree_util.tree_map(lambda x: x[..., None], prepared), attack)
    noisy = mean[None] + 0.3 * z
    release_full = np.argmin(((noisy[:, None, :] - cand[None]) ** 2).sum(-1), axis=1)
    score_full = noisy @ (np.asarray(attack.reference_with) - np.asarray(attack.reference_without))
    assert np.array_equal(np.asarray(hit), release_full == 0)
    np.testing.assert_allclose(np.asarray(score), score_full, rtol=1e-4, atol=1e-4)


def test_pv_contrast_noise_equals_full_noise():
    """PV's (k-1)-dimensional contrast noise gives the same release and score as k-dimensional noise."""
    rng = np.random.default_rng(1)
    k = 5
    votes = np.array([3.0, 1.0, 2.0, 2.5, 0.0])
    mech = sa.PrivateVoting(sigma=jnp.float32(0.7))
    attack = make_attack(mech, votes + [1, 0, -1, 0, 0], votes, target=0)
    prepared = mech.prepare(jnp.asarray(votes, jnp.float32), attack)
    z = rng.normal(size=(3000, k)).astype(np.float32)
    y = z @ np.asarray(prepared.basis)  # coordinates in the contrast basis
    hit, score = mech.outcomes(jnp.asarray(y.T), jax.tree_util.tree_map(lambda x: x[..., None], prepared), attack)
    noisy = votes + 0.7 * z
    w = np.array([1.0, 0, -1.0, 0, 0])
    assert np.array_equal(np.asarray(hit), noisy.argmax(1) == 0)
    np.testing.assert_allclose(np.asarray(score), noisy @ w, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_outcome_matches_batched_outcomes():
    """The one-trial outcome equals the batched outcomes, with shared and per-trial prepared inputs."""
    u1, u2 = esa_unit_pair(1.2, 16)
    cases = [
        (sa.PrivateVoting.calibrated(2.0, 1e-5), np.array([[1.0, 2.0, 0.0], [2.0, 1.0, 0.0]])),
        (sa.ProductOfExperts.calibrated(2.0, clip=5.0), np.array([[-3.0, -1.0], [-1.0, -2.0]])),
        (sa.EmbeddingSpaceAggregation.calibrated(2.0, 1e-5, np.stack([u1, u2])), np.stack([u1, u2])),
        (sa.KeywordSpaceAggregation.calibrated(2.0, top_k=2, num_values=4), np.array([[3.0, 2, 2, 0], [2, 3, 2, 0]])),
    ]
    for mech, clean in cases:
        attack = make_attack(mech, clean[0], clean[1])
        prepared = jax.vmap(mech.prepare, in_axes=(0, None))(jnp.asarray(clean, jnp.float32), attack)
        example = jax.tree_util.tree_map(lambda x: x[0], prepared)
        noise = mech.noise(jax.random.key(4), 6, example)
        rows = jax.tree_util.tree_map(lambda x: jnp.moveaxis(x[np.array([0, 1, 1, 0, 1, 0])], 0, -1), prepared)
        hits, scores = jax.jit(type(mech).outcomes)(mech, noise, rows, attack)
        one_trial = jax.jit(type(mech).outcome)
        for t, row in enumerate([0, 1, 1, 0, 1, 0]):
            one = jax.tree_util.tree_map(lambda x, row=row: x[row], prepared)
            h, sc = one_trial(mech, jax.tree_util.tree_map(lambda x, t=t: x[..., t], noise), one, attack)
            assert bool(h) == bool(hits[t]) and float(sc) == pytest.approx(float(scores[t]), rel=1e-5, abs=1e-5)


@pytest.mark.slow
def test_mechanisms_are_jittable_vmappable_key_first():
    """Every kernel takes the key first, runs under jit and vmaps over keys."""
    u1, u2 = esa_unit_pair(1.0, 8)
    cases = [
        (sa.PrivateVoting.calibrated(1.0, 1e-5), jnp.array([1.0, 2.0])),
        (sa.ProductOfExperts.calibrated(1.0, clip=5.0), jnp.array([-3.0, -1.0])),
        (sa.EmbeddingSpaceAggregation.calibrated(1.0, 1e-5, np.stack([u1, u2])), jnp.asarray(u1, jnp.float32)),
        (sa.KeywordSpaceAggregation.calibrated(1.0, top_k=2), jnp.array([3.0, 2.0, 2.0, 0.0])),
    ]
    for mech, clean in cases:
        keys = jax.random.split(jax.random.key(0), 7)
        rel = jax.jit(jax.vmap(mech, in_axes=(0, None)))(keys, clean)
        assert rel.output.shape[0] == 7
        again = jax.jit(jax.vmap(mech, in_axes=(0, None)))(keys, clean)
        assert np.array_equal(np.asarray(rel.output), np.asarray(again.output))  # pure: same key, same output


def test_noise_parameters_are_traced_leaves():
    """A new epsilon (sigma / scale) reuses the trace: mechanisms are pytrees with array leaves."""

    @jax.jit
    @chex.assert_max_traces(n=1)
    def release(mech, key, clean):
        return mech(key, clean).output

    key, votes = jax.random.key(0), jnp.array([1.0, 2.0])
    for eps in (1.0, 4.0, 16.0):
        release(sa.PrivateVoting.calibrated(eps, 1e-5), key, votes)
    chex.clear_trace_counter()


def test_default_target_is_the_direction_of_the_canary():
    """PV/PoE/KSA target the entry the canary raises; ESA the candidate the mean moves towards."""
    pv = sa.PrivateVoting.calibrated(1.0, 1e-5)
    assert make_attack(pv, [1, 2], [0, 3]).target == 0
    poe = sa.ProductOfExperts.calibrated(1.0, clip=5.0)
    assert make_attack(poe, [-25.11, -10.13], [-28.76, -5.15]).target == 0
    u1, u2 = esa_unit_pair(1.419, 16)
    esa = sa.EmbeddingSpaceAggregation.calibrated(1.0, 1e-5, np.stack([u2, u1]))
    assert make_attack(esa, u1, u2).target == 1
    with pytest.raises(ValueError, match="target"):
        make_attack(pv, [1, 2], [0, 3], target=5)


CASES = [
    ("pv", lambda: sa.PrivateVoting.calibrated(2.0, 1e-5), np.array([[1.0, 2.0, 0.5]]), np.array([[0.0, 3.0, 0.5]])),
    ("poe", lambda: sa.ProductOfExperts.calibrated(2.0, clip=5.0), np.array([[-25.11, -10.13]]),
     np.array([[-28.76, -5.15]])),
]


@pytest.mark.parametrize("threat", ["black", "white"])
@pytest.mark.parametrize("name,make,x1,x0", CASES + [("esa", None, None, None)])
def test_simulator_matches_exact_rates(name, make, x1, x0, threat):
    """Simulated success counts agree with exact h_b (binomial z-test, false-failure prob ~1e-7 per check)."""
    if name == "esa":
        u1, u2 = esa_unit_pair(1.419, 32)
        mech = sa.EmbeddingSpaceAggregation.calibrated(2.0, 1e-5, np.stack([u1, u2]), sensitivity=1.0)
        x1, x0 = u1[None], u2[None]
    else:
        mech = make()
    attack = make_attack(mech, x1[0], x0[0])
    n = 300_007
    for b, x in ((1, x1), (0, x0)):
        thr = 0.25 if threat == "white" else None
        counts = simulate(jax.random.key(11 + b), mech, attack, np.repeat(x, 3, axis=0), trials=n, threshold=thr,
                          per_unit=False)
        if threat == "black":
            p, _ = exact_hit_probability(mech, x, attack)
            hits = counts.hits.sum()
        else:
            p, _ = exact_score_probability(mech, x, attack, thr)
            hits = counts.score_hits.sum()
        assert counts.total_trials == n
        assert abs(_binomial_z(hits, n, float(p[0]))) < Z_1E7, (name, threat, b)


PV_CONDITIONAL_CASES = [
    ([3.0, 1.0, 2.5, 0.0], 0.8, 0),
    ([2.0, 2.0, 2.0, 2.0, 1.0, 0.0, 3.0], 1.1, 3),
    (list(np.arange(16.0) % 5), 1.4, 15),
]


@pytest.mark.slow
@pytest.mark.parametrize("votes,sigma,target", PV_CONDITIONAL_CASES)
def test_pv_conditional_hit_has_the_arg_max_law(votes, sigma, target):
    """PV's black-box-only draw (the target's normal and a coin on prod Phi) hits at the exact rate of the arg-max
    (pv_argmax_probability, checked against mpmath above) on 2^20 trials, like the full draw (z-tests, false-failure
    prob 1e-7 each); power: a sigma 5% off is rejected by the same test."""
    n = 1 << 20
    votes = np.asarray(votes)
    mech = sa.PrivateVoting(sigma=jnp.float32(sigma))
    attack = make_attack(mech, votes, votes, target=target)
    example = mech.prepare(jnp.asarray(votes, jnp.float32), attack)
    prepared = jax.tree_util.tree_map(lambda x: x[..., None], example)

    @jax.jit
    def rates(mech, key):
        words = mech.hit_noise(key, n, example)
        full = mech.outcomes(mech.noise(jax.random.fold_in(key, 1), n, example), prepared, attack)[0]
        return jnp.sum(mech.hit_outcomes(words, prepared, attack)), jnp.sum(full), words.dtype == jnp.uint32

    p, _ = pv_argmax_probability(votes, sigma, target)
    hits, full_hits, conditional = rates(mech, jax.random.key(len(votes)))
    assert bool(conditional)  # from 4 classes on, the conditional draw is the one used
    assert abs(_binomial_z(int(hits), n, p)) < Z_1E7
    assert abs(_binomial_z(int(full_hits), n, p)) < Z_1E7
    off, _, _ = rates(sa.PrivateVoting(sigma=jnp.float32(sigma * 1.05)), jax.random.key(len(votes)))
    assert abs(_binomial_z(int(off), n, p)) > Z_1E7


def _coin_words(u: np.ndarray, heads: bool) -> np.ndarray:
    """``(2, m)`` words whose sign_and_half_uniform is ``(heads, u)``."""
    x = np.asarray(u, np.float64) * 2.0**32
    hi = np.floor(x)
    lo = np.floor((x - hi) * 2.0**32)
    return np.stack([hi.astype(np.uint64) | (np.uint64(1 << 31) if heads else np.uint64(0)),
                     lo.astype(np.uint64)]).astype(np.uint32)


@pytest.mark.slow
def test_pv_conditional_hit_is_exact_in_both_tails():
    """Quantile-spaced coins around p = P(hit | z) ~ 1e-12 and around 1 - p ~ 1e-12: the decision flips exactly at
    p (float64 reference, within 1e-5 relative), so neither tail is lost to float32 rounding of p near 0 or 1."""
    votes = np.array([3.0, 1.0, 2.5, 0.0, 3.0])
    sigma, target = 0.3, 0
    mech = sa.PrivateVoting(sigma=jnp.float32(sigma))
    attack = make_attack(mech, votes, votes, target=target)
    prepared = jax.tree_util.tree_map(lambda x: x[..., None], mech.prepare(jnp.asarray(votes, jnp.float32), attack))
    others = [(votes[target] - v) / sigma for j, v in enumerate(votes) if j != target]
    for heads, z_target, tail in ((True, -5.5, "p"), (False, 7.0, "q")):
        # z = -ndtri(u) * (+1 if the sign bit is set): words for the target's normal.
        u_z = special.ndtr(-abs(z_target))
        z_words = _coin_words(np.array([u_z]), z_target > 0)
        z = float(np.asarray(sa.mechanisms.variates.normal_from_bits(jnp.asarray(z_words)))[0])
        log_p = sum(special.log_ndtr(a + z) for a in others)
        edge = math.exp(log_p) if tail == "p" else -math.expm1(log_p)
        assert 1e-14 < edge < 1e-9, edge
        grid = edge * np.array([1 - 1e-4, 1 - 1e-5, 1 + 1e-5, 1 + 1e-4])
        coins = _coin_words(grid, heads)
        words = np.stack([np.repeat(z_words, grid.size, axis=1), coins])
        hit = np.asarray(mech.hit_outcomes(jnp.asarray(words), prepared, attack))
        below = grid < edge
        # heads: hit iff u < p; tails: hit iff u > 1 - p (V = 1 - u < p).
        assert np.array_equal(hit, below if heads else ~below), (tail, grid, edge, hit)


def test_tree_definitions_tell_the_mechanism_classes_apart():
    """Two pytree dataclasses with the same fields must not share a tree definition: jit's cache compares them, and
    with ``jax.tree_util.register_dataclass`` (jax 0.10) they compared equal, so a PoE simulation could run the
    program traced for PV. Power: ``register_dataclass`` itself gives equal definitions here."""
    import dataclasses

    from snapaudit_jax.models.inference import BatchSample, Sample

    pv, poe = sa.PrivateVoting.calibrated(4.0, 1e-5), sa.ProductOfExperts.calibrated(4.0, clip=5.0)
    assert jax.tree_util.tree_structure(pv) != jax.tree_util.tree_structure(poe)
    assert jax.tree_util.tree_structure(pv) == jax.tree_util.tree_structure(sa.PrivateVoting.calibrated(2.0, 1e-3))
    key = jax.random.key(0)
    assert jax.tree_util.tree_structure(Sample(key)) != jax.tree_util.tree_structure(BatchSample(key))
    # the round trip keeps the class, its traced leaves and its static fields
    sample = Sample(key, 0.5, top_k=3)
    again = jax.tree_util.tree_unflatten(*reversed(jax.tree_util.tree_flatten(sample)))
    assert type(again) is Sample and again.top_k == 3 and again.temperature == 0.5
    paths = [jax.tree_util.keystr(path) for path, _ in jax.tree_util.tree_flatten_with_path(sample)[0]]
    assert paths == [".key", ".temperature"]
    # power: the library registration this replaces confuses two such classes
    pair = []
    for name in ("One", "Two"):
        pair.append(jax.tree_util.register_dataclass(dataclasses.make_dataclass(name, [("x", float)], frozen=True)))
    assert jax.tree_util.tree_structure(pair[0](1.0)) == jax.tree_util.tree_structure(pair[1](1.0))
