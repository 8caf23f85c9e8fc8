"""Joint Exponential Mechanism: efficient sampler vs brute-force enumeration."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import special, stats

import snapaudit_jax as sa
from snapaudit_jax.audits.active import make_attack
from snapaudit_jax.mechanisms.ksa import bucket_num_values, jem_noise, jem_prepare, jem_select, sequence_utility

# Chi-square tests reject at p < 1e-6: the false-failure probability of each check.
P_REJECT = 1e-6


def _enumerate(counts, k, scale, floor=False):
    """Exact JEM distribution by brute force: P(s) ~ exp(-scale * max_i (c_(i) - c[s_i]))."""
    counts = np.asarray(counts, np.float64)
    top = np.sort(counts)[::-1][:k]
    seqs = list(itertools.permutations(range(counts.size), k))
    gaps = np.array([max(top[i] - counts[s[i]] for i in range(k)) for s in seqs])
    if floor:
        gaps = np.floor(gaps)
    logw = -scale * gaps
    return seqs, np.exp(logw - special.logsumexp(logw)), special.logsumexp(logw)


def _sample(counts, k, scale, n, seed, num_values=None):
    table = jem_prepare(jnp.asarray(counts, jnp.float32), k, jnp.float32(scale), num_values)
    noise = jem_noise(jax.random.key(seed), n, k)
    return np.asarray(jax.jit(jax.vmap(lambda z: jem_select(z, table, k)))(noise)), table


def _histogram(samples, seqs):
    index = {s: i for i, s in enumerate(seqs)}
    out = np.zeros(len(seqs))
    for s in map(tuple, samples):
        out[index[s]] += 1
    return out


def _chi2_pvalue(observed, probs):
    n = observed.sum()
    expected = probs * n
    keep = expected > 5  # pool the rare cells into one
    obs = np.append(observed[keep], observed[~keep].sum())
    exp = np.append(expected[keep], expected[~keep].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    return stats.chisquare(obs, exp).pvalue


@pytest.mark.slow
@pytest.mark.parametrize(
    "counts,k,scale",
    [
        ([3.5, 2.25, 2.0, 0.75, 0.5, 2.25], 3, 1.5),  # non-integer (dyadic) counts, a tie
        ([4, 4, 4, 1, 1, 0], 2, 0.8),  # integer counts, ties at the top
        ([2, 1, 1, 0], 4, 2.0),  # k = d: all permutations
    ],
)
def test_jem_matches_enumeration(counts, k, scale):
    """Sampled sequences follow the enumerated distribution (chi-square, false-failure prob 1e-6)."""
    seqs, probs, log_z = _enumerate(counts, k, scale)
    samples, table = _sample(counts, k, scale, 300_000, seed=1)
    # The pair table carries the whole normaliser: exact check.
    assert float(special.logsumexp(np.asarray(table.logits, np.float64))) == pytest.approx(log_z, abs=2e-5)
    assert all(len(set(s)) == k for s in map(tuple, samples[:1000]))  # distinct items
    assert _chi2_pvalue(_histogram(samples, seqs), probs) > P_REJECT


@pytest.mark.slow
def test_jem_test_distinguishes_floored_gaps():
    """Power check: with non-integer counts the same test rejects the floor(diff) variant of JEM."""
    counts, k, scale = [3.5, 2.25, 2.0, 0.75, 0.5, 2.25], 3, 1.5
    seqs, floored, _ = _enumerate(counts, k, scale, floor=True)
    samples, _ = _sample(counts, k, scale, 300_000, seed=2)
    assert _chi2_pvalue(_histogram(samples, seqs), floored) < 1e-30


@pytest.mark.slow
def test_jem_num_values_bound_does_not_change_distribution():
    """A tighter static bound on distinct counts gives the same table (up to padding)."""
    counts = np.array([5, 5, 3, 3, 3, 1, 0, 0], np.float32)
    bound = bucket_num_values(counts[None])
    assert bound == 4
    full = jem_prepare(jnp.asarray(counts), 3, jnp.float32(1.0))
    small = jem_prepare(jnp.asarray(counts), 3, jnp.float32(1.0), bound)
    lf = np.asarray(full.logits)
    ls = np.asarray(small.logits)
    assert special.logsumexp(lf) == pytest.approx(special.logsumexp(ls), abs=1e-5)
    np.testing.assert_allclose(np.sort(lf[np.isfinite(lf)]), np.sort(ls[np.isfinite(ls)]), rtol=1e-6)


@pytest.mark.slow
def test_joint_exponential_topk_public_kernel():
    """The one-call kernel returns distinct ids and concentrates on the true top-k at large epsilon."""
    counts = jnp.array([9.0, 1.0, 7.0, 0.0, 8.0])
    keys = jax.random.split(jax.random.key(0), 500)
    seqs = np.asarray(jax.vmap(lambda key: sa.joint_exponential_topk(key, counts, k=3, epsilon=200.0))(keys))
    assert np.all(seqs == np.array([0, 4, 2]))


@pytest.mark.slow
def test_ksa_outcome_hit_and_likelihood_ratio_score():
    """KSA hit is 'target selected'; the white-box score is u_with(s) - u_without(s)."""
    w = np.array([8, 7, 6, 5, 5, 2, 2, 1, 1, 0], np.float32)
    wo = np.array([8, 7, 6, 5, 4, 3, 2, 1, 1, 0], np.float32)
    mech = sa.KeywordSpaceAggregation.calibrated(4.0, top_k=4, num_values=bucket_num_values(np.stack([w, wo])))
    attack = make_attack(mech, w, wo)
    assert attack.target == 4
    prepared = mech.prepare(jnp.asarray(w), attack)
    noise = mech.noise(jax.random.key(1), 64, prepared)  # (K + 2, 64): trial axis last
    hit, score = mech.outcomes(noise, jax.tree_util.tree_map(lambda x: x[..., None], prepared), attack)
    seqs = jax.vmap(lambda z: jem_select(z, prepared.table, 4))(noise.T)
    for s, h, sc in zip(np.asarray(seqs), np.asarray(hit), np.asarray(score)):
        assert h == (4 in s)
        top_w, top_wo = np.sort(w)[::-1][:4], np.sort(wo)[::-1][:4]
        expect = -np.max(top_w - w[s]) + np.max(top_wo - wo[s])
        assert sc == pytest.approx(expect)
        assert float(sequence_utility(jnp.asarray(top_w), jnp.asarray(w), jnp.asarray(s))) == -np.max(top_w - w[s])


def test_jem_utility_sensitivity_is_two_for_replace_one_and_one_for_add_remove():
    """Brute force over every length-K sequence: a replace-one change (one partition's keyword set replaced:
    every count moves by -1, 0 or +1) moves u(s) by at most 2; adding one partition's set (every count moves by
    0 or +1) by at most 1; both bounds are attained (KeywordPipeline.sensitivity states the same)."""
    rng = np.random.default_rng(11)
    d, k = 5, 3
    worst = {"replace": 0.0, "add": 0.0}
    for _ in range(300):
        c = rng.integers(0, 6, size=d).astype(float)
        old, new = rng.random(d) < 0.5, rng.random(d) < 0.5  # the changed partition's keyword sets
        changes = {"replace": new.astype(float) - old, "add": new.astype(float)}
        for kind, delta in changes.items():
            c2 = c + delta
            top1, top2 = np.sort(c)[::-1][:k], np.sort(c2)[::-1][:k]
            seqs = np.array(list(itertools.permutations(range(d), k)))  # every sequence; u as sequence_utility
            u1, u2 = -np.max(top1 - c[seqs], axis=1), -np.max(top2 - c2[seqs], axis=1)
            worst[kind] = max(worst[kind], float(np.max(np.abs(u1 - u2))))
    assert worst == {"replace": 2.0, "add": 1.0}
