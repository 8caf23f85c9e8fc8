"""Tests for snapaudit_jax.estimation.bounds: exactness against mpmath and coverage by Monte Carlo.

Coverage tests draw ``R`` independent repetitions with a fixed seed and count the
misses ``F`` of a one-sided bound at level ``alpha``. For a valid bound the miss
probability is ``q <= alpha``, so ``F`` is stochastically dominated by
``Binomial(R, alpha)``; a check fails only if ``F > c`` with
``P(Binomial(R, alpha) > c) <= level``. Each test splits a false-failure
probability of 1e-6 over its checks (Bonferroni). Power checks show that known-wrong
bounds exceed the same threshold ``c``.
"""

from __future__ import annotations

import math

import mpmath as mp
import numpy as np
import pytest
from scipy import stats

from snapaudit_jax.estimation import bounds as b


@pytest.fixture(autouse=True)
def _mpmath_precision():
    """Every test here runs with 40-digit mpmath, without leaking the setting to other modules."""
    with mp.workdps(40):
        yield


FALSE_FAILURE = 1e-6  # per test function, Bonferroni-split over its checks
R = 20_000
ALPHA = 0.05


def miss_threshold(n_checks: int, reps: int = R, alpha: float = ALPHA) -> int:
    """Largest miss count still accepted: P(Bin(reps, alpha) > c) <= FALSE_FAILURE / n_checks."""
    return int(stats.binom.isf(FALSE_FAILURE / n_checks, reps, alpha))


# --------------------------------------------------------------------------- Clopper-Pearson, exactness


def binom_cdf_mp(k, n, p):
    """P(Bin(n, p) <= k) via the regularized incomplete beta, 40 digits."""
    if k >= n:
        return mp.mpf(1)
    return mp.betainc(n - k, k + 1, 0, 1 - mp.mpf(p), regularized=True)


def binom_sf_mp(k, n, p):
    """P(Bin(n, p) >= k), 40 digits."""
    if k <= 0:
        return mp.mpf(1)
    return mp.betainc(k, n - k + 1, 0, mp.mpf(p), regularized=True)


def root_in_bracket(f, lo, hi):
    """mpmath root of f in [lo, hi]; asserts a sign change so the root is independent of the guess."""
    lo, hi = mp.mpf(lo), mp.mpf(hi)
    assert f(lo) * f(hi) < 0, "tested value is not within the bracket around the true root"
    return mp.findroot(f, (lo, hi), solver="anderson")


def cp_cases():
    cases = []
    for n in [1, 2, 7, 50, 1000]:
        for k in sorted({0, 1, 2, n // 2, n - 2, n - 1, n}):
            if 0 <= k <= n:
                cases.append((k, n))
    return cases


@pytest.mark.parametrize("alpha", [0.05, 0.025])
def test_cp_defining_property(alpha):
    """P(Bin(n, upper) <= k) == alpha and P(Bin(n, lower) >= k) == alpha to 1e-8 relative (mpmath)."""
    for k, n in cp_cases():
        up = float(b.clopper_pearson_upper(k, n, alpha))
        lo = float(b.clopper_pearson_lower(k, n, alpha))
        if k < n:
            assert abs(binom_cdf_mp(k, n, up) / alpha - 1) <= 1e-8, (k, n, up)
        if k > 0:
            assert abs(binom_sf_mp(k, n, lo) / alpha - 1) <= 1e-8, (k, n, lo)


@pytest.mark.parametrize("alpha", [0.05, 1e-6])
def test_cp_matches_mpmath_root(alpha):
    """Bounds equal the 40-digit roots of the defining equations to 1e-10 relative (incl. alpha=1e-6)."""
    # The defining-property check above is ill-conditioned for bounds near 1 with tiny alpha
    # (d log P / d log u ~ n/alpha); comparing the bound itself is not.
    for k, n in cp_cases():
        up = float(b.clopper_pearson_upper(k, n, alpha))
        lo = float(b.clopper_pearson_lower(k, n, alpha))
        if k < n:
            ref = root_in_bracket(lambda u, k=k, n=n: binom_cdf_mp(k, n, u) - alpha, up * (1 - 1e-3),
                                  min(up * (1 + 1e-3), 1))
            assert abs(up - ref) <= 1e-10 * ref, (k, n, up, ref)
        if k > 0:
            ref = root_in_bracket(lambda p, k=k, n=n: binom_sf_mp(k, n, p) - alpha, lo * (1 - 1e-3),
                                  min(lo * (1 + 1e-3), 1))
            assert abs(lo - ref) <= 1e-10 * ref, (k, n, lo, ref)


@pytest.mark.parametrize("k", [0, 1, 3, 10])
def test_cp_tiny_rates_keep_relative_precision(k):
    """n = 10^7, alpha = 0.025: bounds of order 1e-7 are exact to 1e-10 relative."""
    n, alpha = 10**7, 0.025
    up = float(b.clopper_pearson_upper(k, n, alpha))
    assert 1e-8 < up < 1e-5
    assert abs(binom_cdf_mp(k, n, up) / alpha - 1) <= 1e-8
    ref = root_in_bracket(lambda u: binom_cdf_mp(k, n, u) - alpha, up * (1 - 1e-3), up * (1 + 1e-3))
    assert abs(up - ref) <= 1e-10 * ref
    lo = float(b.clopper_pearson_lower(k, n, alpha))
    if k == 0:
        assert lo == 0.0
    else:
        assert abs(binom_sf_mp(k, n, lo) / alpha - 1) <= 1e-8
        ref = root_in_bracket(lambda p: binom_sf_mp(k, n, p) - alpha, lo * (1 - 1e-3), lo * (1 + 1e-3))
        assert abs(lo - ref) <= 1e-10 * ref


@pytest.mark.parametrize("n", [1, 7, 50, 1000, 10**7])
def test_cp_edge_cases(n):
    """k=0: lower=0, upper=1-alpha^(1/n); k=n: upper=1, lower=alpha^(1/n) (closed forms, 1e-12 rel.)."""
    alpha = 0.025
    log_a = mp.log(mp.mpf(alpha)) / n
    assert float(b.clopper_pearson_lower(0, n, alpha)) == 0.0
    assert float(b.clopper_pearson_upper(0, n, alpha)) == pytest.approx(float(-mp.expm1(log_a)), rel=1e-12)
    assert float(b.clopper_pearson_upper(n, n, alpha)) == 1.0
    assert float(b.clopper_pearson_lower(n, n, alpha)) == pytest.approx(float(mp.exp(log_a)), rel=1e-12)


def test_cp_vectorised_and_ordered():
    """Array inputs broadcast like scalar calls; lower <= k/n <= upper and both increase in k."""
    n = 97
    k = np.arange(n + 1)
    lo = b.clopper_pearson_lower(k, n, 0.01)
    up = b.clopper_pearson_upper(k, n, 0.01)
    assert lo.shape == up.shape == (n + 1,)
    for i in [0, 1, 13, 50, 96, 97]:
        assert lo[i] == float(b.clopper_pearson_lower(i, n, 0.01))
        assert up[i] == float(b.clopper_pearson_upper(i, n, 0.01))
    assert np.all(lo <= k / n) and np.all(k / n <= up)
    assert np.all(np.diff(lo) > 0) and np.all(np.diff(up) > 0)


# --------------------------------------------------------------------------- Clopper-Pearson, coverage

CP_P = [1e-4, 1e-3, 0.01, 0.3, 0.5, 0.9, 0.999]
CP_N = [50, 1000]


def _binomial_draws(seed=20240601):
    rng = np.random.default_rng(seed)
    return {(p, n): rng.binomial(n, p, size=R) for p in CP_P for n in CP_N}


def test_cp_coverage_monte_carlo():
    """One-sided CP bounds at alpha=0.05 cover p in >= 95% of 20000 draws; false-failure prob. <= 1e-6."""
    draws = _binomial_draws()
    c = miss_threshold(2 * len(draws))
    for (p, n), k in draws.items():
        misses_up = int(np.sum(b.clopper_pearson_upper(k, n, ALPHA) < p))
        misses_lo = int(np.sum(b.clopper_pearson_lower(k, n, ALPHA) > p))
        assert misses_up <= c, ("upper", p, n, misses_up, c)
        assert misses_lo <= c, ("lower", p, n, misses_lo, c)


def test_cp_coverage_power_check():
    """The coverage test rejects a Wald upper bound at p=1e-3, n=1000 and CP at the wrong quantile (alpha=0.1)."""
    draws = _binomial_draws()
    c = miss_threshold(2 * len(draws))  # same threshold as the coverage test
    p, n = 1e-3, 1000
    k = draws[(p, n)]
    phat = k / n
    wald_upper = phat + stats.norm.ppf(1 - ALPHA) * np.sqrt(phat * (1 - phat) / n)
    assert int(np.sum(wald_upper < p)) > c  # k = 0 alone has probability ~0.37
    # A one-sided bound at the wrong level (alpha doubled) is rejected where CP is nearly exact.
    p, n = 0.5, 1000
    k = draws[(p, n)]
    assert int(np.sum(b.clopper_pearson_upper(k, n, 2 * ALPHA) < p)) > c


# --------------------------------------------------------------------------- empirical Bernstein


def test_empirical_bernstein_closed_form():
    """Radius == sqrt(2 V ln(2/a)/n) + 7 ln(2/a)/(3(n-1)); inf for n < 2; negative V clipped to 0."""
    v = np.array([0.0, 1e-4, 0.05, 0.25])
    for n in [2, 10, 2000]:
        for a in [0.05, 1e-3]:
            ref = np.sqrt(2 * v * math.log(2 / a) / n) + 7 * math.log(2 / a) / (3 * (n - 1))
            np.testing.assert_allclose(b.empirical_bernstein_radius(v, n, a), ref, rtol=1e-14)
    assert np.all(np.isinf(b.empirical_bernstein_radius(v, 1, 0.05)))
    assert float(b.empirical_bernstein_radius(-0.3, 10, 0.05)) == float(b.empirical_bernstein_radius(0.0, 10, 0.05))
    n_arr = np.array([1, 2, 50])
    out = b.empirical_bernstein_radius(0.1, n_arr, 0.05)
    assert np.isinf(out[0]) and np.all(np.isfinite(out[1:]))


def _two_point(low, high, q):
    """X = low + (high - low) Bernoulli(q): (sample mean, sample variance) from the count, exactly."""

    def sample(rng, n, reps):
        k = rng.binomial(n, q, size=reps)
        mean = low + (high - low) * k / n
        var = (high - low) ** 2 * k * (n - k) / (n * (n - 1))
        return mean, var

    return sample, low + (high - low) * q


def _continuous(draw, mean_true, chunk_elems=4_000_000):
    """Sample mean and unbiased variance of n i.i.d. draws, R times, in memory-bounded chunks."""

    def sample(rng, n, reps):
        rows = max(1, chunk_elems // n)
        means, variances = [], []
        for start in range(0, reps, rows):
            x = draw(rng, (min(rows, reps - start), n))
            means.append(x.mean(axis=1))
            variances.append(x.var(axis=1, ddof=1))
        return np.concatenate(means), np.concatenate(variances)

    return sample, mean_true


EB_DISTRIBUTIONS = {
    "bernoulli(0.01)": _two_point(0.0, 1.0, 0.01),
    "bernoulli(0.5)": _two_point(0.0, 1.0, 0.5),
    "two-point{0.3,0.8}(0.01)": _two_point(0.3, 0.8, 0.01),  # variance 2.5e-3, skewed
    "beta(200,800)": _continuous(lambda rng, shape: rng.beta(200.0, 800.0, size=shape), 0.2),  # variance 1.6e-4
    "near-constant 0.7+1e-3*U": _continuous(lambda rng, shape: 0.7 + 1e-3 * rng.random(size=shape), 0.7 + 5e-4),
}
EB_N = [10, 100, 2000]


def _eb_stats(name, n, seed):
    sample, mean_true = EB_DISTRIBUTIONS[name]
    rng = np.random.default_rng([seed, n, sorted(EB_DISTRIBUTIONS).index(name)])
    mean, var = sample(rng, n, R)
    return mean, var, mean_true


@pytest.mark.parametrize("name", sorted(EB_DISTRIBUTIONS))
def test_empirical_bernstein_coverage(name):
    """Both one-sided EB bounds at alpha=0.05 hold in >= 95% of 20000 reps for n in {10,100,2000}.

    False-failure probability <= 1e-6."""
    c = miss_threshold(2 * len(EB_N))
    for n in EB_N:
        mean, var, mu = _eb_stats(name, n, seed=7)
        radius = b.empirical_bernstein_radius(var, n, ALPHA)
        misses_up = int(np.sum(mu - mean > radius))  # E X - mean <= radius
        misses_lo = int(np.sum(mean - mu > radius))  # same radius for 1 - X
        assert misses_up <= c, ("upper", name, n, misses_up, c)
        assert misses_lo <= c, ("lower", name, n, misses_lo, c)


def test_empirical_bernstein_power_check():
    """Dropping the 7 ln(2/a)/(3(n-1)) term fails the same coverage test (Bernoulli(0.01), n=100; two-point, n=10)."""
    c = miss_threshold(2 * len(EB_N))
    for name, n in [("bernoulli(0.01)", 100), ("two-point{0.3,0.8}(0.01)", 10)]:
        mean, var, mu = _eb_stats(name, n, seed=7)
        sqrt_term_only = np.sqrt(2 * var * math.log(2 / ALPHA) / n)
        # P(no success) = 0.99^n >= 0.36: then V = 0, the radius is 0 and the bound misses.
        assert int(np.sum(mu - mean > sqrt_term_only)) > c, (name, n)


# --------------------------------------------------------------------------- Hoeffding


def test_hoeffding_closed_form():
    """One-sided radius sqrt(ln(1/a)/(2n)); two-sided uses ln(2/a), i.e. equals one-sided at a/2."""
    n = np.array([1, 10, 1000, 10**6])
    for a in [0.05, 1e-3, 1e-9]:
        np.testing.assert_allclose(b.hoeffding_radius(n, a), np.sqrt(math.log(1 / a) / (2 * n)), rtol=1e-14)
        np.testing.assert_allclose(
            b.hoeffding_radius(n, a, two_sided=True), np.sqrt(math.log(2 / a) / (2 * n)), rtol=1e-14
        )
        np.testing.assert_allclose(b.hoeffding_radius(n, a, two_sided=True), b.hoeffding_radius(n, a / 2), rtol=1e-14)
        assert np.all(b.hoeffding_radius(n, a, two_sided=True) > b.hoeffding_radius(n, a))


def test_hoeffding_coverage_and_power():
    """One-sided Hoeffding covers Bernoulli(0.5), n=100, in >= 95% of 20000 reps; half the radius does not.

    False-failure probability <= 1e-6."""
    rng = np.random.default_rng(11)
    n, p = 100, 0.5
    mean = rng.binomial(n, p, size=R) / n
    c = miss_threshold(2)
    radius = float(b.hoeffding_radius(n, ALPHA))
    assert int(np.sum(p - mean > radius)) <= c
    assert int(np.sum(p - mean > radius / 2)) > c  # power: P(k <= 43) ~ 0.097
