"""The estimation layer and the validity of every printed epsilon.

Oracles: mpmath for the exact privacy profiles, closed forms for Gaussian pairs, brute-force definitions of
the hockey-stick divergence and of Holm's procedure. Every Monte Carlo states its false-failure probability
and carries a power check (the test fails for a doubled alpha, a Wald radius, a dropped Bernstein term, a
missing Bonferroni or Holm correction).
"""

from __future__ import annotations

import math

import mpmath as mp
import numpy as np
import pytest
from scipy import special, stats

import snapaudit_jax as sa
from snapaudit_jax import estimation as est
from snapaudit_jax.simulation import profiles
from snapaudit_jax.audits.active import CURVE_POINTS
from snapaudit_jax.mechanisms.noise import classical_gaussian_sigma, gaussian_sigma
from snapaudit_jax.simulation.exact import exact_output_distribution
from snapaudit_jax.audits.command import SimulateConfig, esa_unit_pair, run_simulate

DELTA = 1e-5
FAILURE = 1e-6  # false-failure probability of each Monte Carlo check below


def _limit(reps: int, rate: float, failure: float = FAILURE) -> int:
    """Largest count c with P(Binomial(reps, rate) > c) <= failure: more than c fails the check."""
    return int(stats.binom.isf(failure, reps, rate))


# --------------------------------------------------------------------------- mpmath oracles


def _mp_argmax(votes, sigma, j):
    """P(argmax(votes + sigma Z) = j) by mpmath quadrature (Z ~ N(0, I))."""
    v = [mp.mpf(x) for x in votes]
    others = [i for i in range(len(v)) if i != j]

    def f(z):
        out = mp.npdf(z)
        for i in others:
            out *= mp.ncdf((v[j] - v[i]) / sigma + z)
        return out

    return mp.quad(f, [-mp.inf, -5, 0, 5, mp.inf])


def _mp_discrete_eps(p1, p0, delta):
    """Smallest eps with max_dir sum_o max(0, p - e^eps q) <= delta (mpmath bisection, both directions)."""
    def hockey(a, b, e):
        return mp.fsum(max(mp.mpf(0), x - mp.e ** e * y) for x, y in zip(a, b))

    def eps_dir(a, b):
        if hockey(a, b, 0) <= delta:
            return mp.mpf(0)
        lo, hi = mp.mpf(0), mp.mpf(60)
        for _ in range(200):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if hockey(a, b, mid) > delta else (lo, mid)
        return hi

    return max(eps_dir(p1, p0), eps_dir(p0, p1))


def _mp_gaussian_eps(mu, delta):
    """eps(delta) of G_mu: the root of Phi(-e/mu + mu/2) - e^e Phi(-e/mu - mu/2) = delta (mpmath)."""
    mu = mp.mpf(mu)

    def d(e):
        return mp.ncdf(-e / mu + mu / 2) - mp.e ** e * mp.ncdf(-e / mu - mu / 2)

    lo, hi = mp.mpf(0), mp.mpf(200)
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if d(mid) > delta else (lo, mid)
    return hi


@pytest.fixture(autouse=True)
def _mp_precision():
    with mp.workdps(40):
        yield


def test_pv_black_box_profiles_match_mpmath():
    """Flaw 1, black-box: [1,2]/[0,3] has exact eps 11.82 (a binary release), [1,3]/[0,4] 16.98 (a violation)."""
    sigma = classical_gaussian_sigma(16.0, DELTA, math.sqrt(2))
    mech = sa.PrivateVoting.calibrated(16.0, DELTA, calibration="classical")
    assert float(mech.sigma) == pytest.approx(sigma, rel=1e-7)
    s = mp.mpf(float(mech.sigma))
    for w, wo, expected in (([1.0, 2.0], [0.0, 3.0], 11.82), ([1.0, 3.0], [0.0, 4.0], 16.98)):
        p1 = [_mp_argmax(w, s, j) for j in range(2)]
        p0 = [_mp_argmax(wo, s, j) for j in range(2)]
        ref = float(_mp_discrete_eps(p1, p0, mp.mpf(DELTA)))
        r = sa.audit(mech, [w], [wo], epsilon_theory=16.0, method="exact", clean="fixed")
        assert r.epsilon_profile == pytest.approx(ref, abs=1e-6)
        assert r.epsilon_emp == pytest.approx(expected, abs=5e-3)
        assert r.violation == (expected > 16.0)
        # The envelope's eps is reported, labelled, and never decides the violation.
        assert "envelope" in r.epsilon_gdp_label and r.epsilon_gdp > 18.5
    # The issue's numbers: P(label 0) with / without the canary.
    p1 = exact_output_distribution(mech, np.array([[1.0, 2.0]]), sa.make_attack(mech, [1.0, 2.0], [0.0, 3.0],
                                                                                 target=0))[0]
    assert p1[0] == pytest.approx(0.049343, rel=1e-4)


def test_pv_three_classes_output_distribution_matches_mpmath():
    mech = sa.PrivateVoting(sigma=np.float32(0.8))
    votes = np.array([[2.0, 1.0, 0.0]])
    attack = sa.make_attack(mech, votes[0], votes[0], target=0)
    got = exact_output_distribution(mech, votes, attack)[0]
    ref = [float(_mp_argmax(votes[0], mp.mpf(float(mech.sigma)), j)) for j in range(3)]
    np.testing.assert_allclose(got, ref, rtol=1e-8)
    assert got.sum() == pytest.approx(1.0, abs=1e-9)


def test_white_box_profiles_match_mpmath_and_the_flaw_values():
    """White-box: PV classical at 16 gives 18.90; ESA T=1 with sensitivity 1 at 16 gives 25.40 (pair 1.419)."""
    mech = sa.PrivateVoting.calibrated(16.0, DELTA, calibration="classical")
    r = sa.audit(mech, [[1.0, 2.0]], [[0.0, 3.0]], epsilon_theory=16.0, method="exact", clean="fixed",
                 threat="white")
    ref = float(_mp_gaussian_eps(math.sqrt(2) / float(mech.sigma), mp.mpf(DELTA)))
    assert r.epsilon_profile == pytest.approx(ref, abs=1e-6) and r.epsilon_emp == pytest.approx(18.90, abs=5e-3)
    assert r.violation and r.epsilon_emp >= r.epsilon_std  # at least as tight as the single threshold
    u1, u2 = esa_unit_pair(1.419, 384)
    esa = sa.EmbeddingSpaceAggregation.calibrated(16.0, DELTA, np.stack([u1, u2]), sensitivity=1.0)
    r = sa.audit(esa, u1[None], u2[None], epsilon_theory=16.0, method="exact", clean="fixed", threat="white")
    ref = float(_mp_gaussian_eps(1.419 / float(esa.sigma), mp.mpf(DELTA)))
    assert r.epsilon_emp == pytest.approx(ref, abs=1e-5) and r.epsilon_emp == pytest.approx(25.40, abs=5e-3)


def test_logistic_profile_matches_mpmath():
    """PoE white-box margin: a logistic location pair; brute-force sup over thresholds in mpmath."""
    d = 3.0
    for delta in (1e-5, 1e-2):
        def hockey(e):
            sig = lambda x: 1 / (1 + mp.e ** (-x))  # noqa: E731
            # sup_t sig(d - t) - e^e sig(-t) at the root of the log-likelihood ratio (mpmath findroot)
            t = mp.findroot(lambda t: mp.log(sig(d - t) * sig(t - d)) - mp.log(sig(t) * sig(-t)) - e, d / 2)
            return sig(d - t) - mp.e ** e * sig(-t)

        lo, hi = mp.mpf(0), mp.mpf(d)
        for _ in range(80):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if hockey(mid) > delta else (lo, mid)
        assert profiles.logistic_epsilon(d, delta) == pytest.approx(float(hi), abs=1e-7)


def test_discrete_profile_brute_force_and_edge_cases():
    rng = np.random.default_rng(5)
    for _ in range(20):
        p1, p0 = rng.dirichlet(np.ones(4)), rng.dirichlet(np.ones(4))
        for delta in (0.0, 1e-3, 0.1):
            eps = profiles.discrete_epsilon(p1, p0, delta)
            assert profiles.discrete_delta(p1, p0, eps) <= delta + 1e-12
            if eps > 1e-9:
                assert profiles.discrete_delta(p1, p0, eps - 1e-6) > delta
    assert profiles.discrete_epsilon([0.5, 0.5], [1.0, 0.0], 0.1) == math.inf  # mass 0.5 never seen without
    assert profiles.discrete_epsilon([0.5, 0.5], [0.5, 0.5], 0.0) == 0.0
    with pytest.raises(ValueError, match="p1"):
        profiles.discrete_epsilon([0.5, 0.6], [0.5, 0.5], 1e-5)


def test_exact_profile_is_at_least_the_single_test_for_mixtures():
    """Several distinct fixed clean outputs (a mixture): the black-box profile still bounds every test."""
    mech = sa.PrivateVoting.calibrated(4.0, DELTA)
    x1 = np.array([[1.0, 2.0, 0.0], [2.0, 1.0, 0.0]])
    x0 = np.array([[0.0, 3.0, 0.0], [1.0, 2.0, 0.0]])
    r = sa.audit(mech, x1, x0, epsilon_theory=4.0, method="exact", clean="fixed", target=0)
    assert r.epsilon_profile is not None and r.epsilon_emp >= r.epsilon_std - 1e-12
    assert not r.violation


# --------------------------------------------------------------------------- estimators by claim


def test_issue_examples_are_valid_now():
    """pv classical eps=16 black exact: 11.82 and no violation; poe with gdp is refused (it claims no mu)."""
    r = run_simulate(SimulateConfig(mechanism="pv", calibration="classical", epsilons=(16.0,), clean_with=(1, 2),
                                    clean_without=(0, 3), method="exact"))[0]
    assert r.estimator == "std" and r.epsilon_emp == pytest.approx(11.82, abs=5e-3) and not r.violation
    with pytest.raises(ValueError, match="estimator must be 'std' for poe.*pure-epsilon"):
        SimulateConfig(mechanism="poe", epsilons=(4.0,), estimator="gdp", method="exact").validate()
    with pytest.raises(ValueError, match="estimator must be 'std'.*claims no mu"):
        sa.audit(sa.ProductOfExperts.calibrated(4.0, clip=5.0), [[-25.11, -10.13]], [[-28.76, -5.15]],
                 epsilon_theory=4.0, estimator="gdp", method="exact", clean="fixed")


def test_gdp_audits_the_mu_claim_not_the_epsilon_claim():
    """ESA with sensitivity 1 (true distance 1.419): the mu-GDP claim 1/sigma is violated (black-box, simulated),
    the (eps, delta) claim of the label release at eps=1 is not. Analytic PV never violates its mu claim."""
    u1, u2 = esa_unit_pair(1.419, 16)
    esa = sa.EmbeddingSpaceAggregation.calibrated(1.0, DELTA, np.stack([u1, u2]), sensitivity=1.0)
    with pytest.warns(UserWarning):
        r = sa.audit(esa, u1[None], u2[None], epsilon_theory=1.0, clean="fixed", estimator="gdp", trials=2_000_000,
                     sensitivity=1.0)
    assert r.mu_claim == pytest.approx(1.0 / float(esa.sigma)) and r.mu_violation and not r.violation
    assert r.epsilon_emp == r.epsilon_std and "never used for the (eps, delta) violation" in r.epsilon_gdp_label
    pv = sa.PrivateVoting.calibrated(2.0, DELTA)
    for threat in ("black", "white"):
        r = sa.audit(pv, [[1.0, 2.0]], [[0.0, 3.0]], epsilon_theory=2.0, method="exact", clean="fixed",
                     estimator="gdp", threat=threat, sensitivity=math.sqrt(2))
        assert not r.mu_violation and r.mu_emp <= r.mu_claim * (1 + 1e-6)
        assert r.gaussian_by_construction == (threat == "white")


@pytest.mark.slow
@pytest.mark.parametrize("mechanism", ["poe", "ksa"])
def test_pure_dp_mechanisms_never_flag_a_violation(mechanism):
    """Exactly calibrated exponential mechanisms: no violation at any eps, threat or method; gdp refused."""
    for eps in (1.0, 16.0):
        for threat in ("black", "white"):
            methods = ("simulate", "exact", "paper") if mechanism == "poe" else ("simulate", "paper")
            for method in methods:
                r = run_simulate(SimulateConfig(mechanism=mechanism, epsilons=(eps,), threat=threat, method=method,
                                                trials=100_000, snapshots=50, seed=int(eps)))[0]
                assert not r.violation and not r.familywise_violation, (eps, threat, method, r.epsilon_emp)
                assert r.epsilon_emp <= eps * (1 + 1e-6)
        with pytest.raises(ValueError, match="estimator"):
            SimulateConfig(mechanism=mechanism, estimator="gdp").validate()


def test_paper_method_is_labelled_heuristic_and_never_flags():
    mech = sa.PrivateVoting.calibrated(16.0, DELTA, calibration="classical")
    r = sa.audit(mech, np.tile([1.0, 2.0], (2000, 1)), np.tile([0.0, 3.0], (2000, 1)), epsilon_theory=0.05,
                 method="paper", trials=100_000, target=0)
    assert r.heuristic and r.assumptions.startswith("HEURISTIC") and r.epsilon_emp > 0.05 and not r.violation


# --------------------------------------------------------------------------- certified trade-off curve


def test_certified_curve_white_box_exact_and_simulated():
    mech = sa.PrivateVoting.calibrated(16.0, DELTA, calibration="classical")
    ex = sa.audit(mech, [[1.0, 2.0]], [[0.0, 3.0]], epsilon_theory=16.0, method="exact", clean="fixed",
                  threat="white")
    assert ex.curve["exact"] and ex.curve["alpha_per_rate"] == 0.0
    assert ex.epsilon_curve <= ex.epsilon_profile * (1 + 1e-9) and ex.epsilon_curve > 15.0
    sim = sa.audit(mech, [[1.0, 2.0]] * 3, [[0.0, 3.0]] * 3, epsilon_theory=16.0, clean="fixed", threat="white",
                   trials=400_000)
    g = len(sim.curve["thresholds"])
    assert 2 <= g <= CURVE_POINTS
    assert sim.curve["alpha_per_rate"] == pytest.approx(0.05 / (2 * g))
    assert sim.epsilon_curve <= ex.epsilon_profile
    # The certified points are below the exact curve G_mu of the release (type II bound above it).
    mu = math.sqrt(2) / float(mech.sigma)
    fpr, tpr = np.array(sim.curve["fpr_up"]), np.array(sim.curve["tpr_low"])
    assert np.all(1 - tpr >= special.ndtr(-special.ndtri(np.clip(fpr, 1e-300, 1)) - mu) - 1e-12)


@pytest.mark.slow
def test_simulate_counts_a_threshold_grid_like_single_thresholds():
    """simulate(threshold=grid) gives the same counts as one run per threshold (same key, same trials)."""
    import jax

    mech = sa.PrivateVoting.calibrated(2.0, DELTA)
    attack = sa.make_attack(mech, [1.0, 2.0], [0.0, 3.0])
    snaps = np.array([[1.0, 2.0], [0.0, 3.0], [1.0, 2.0]])
    grid = np.array([-0.5, 0.0, 0.7, 1.3])
    for scheme in ("bootstrap", "stratified"):
        both = sa.simulate(jax.random.key(3), mech, attack, snaps, trials=30_000, threshold=grid, scheme=scheme)
        for j, t in enumerate(grid):
            one = sa.simulate(jax.random.key(3), mech, attack, snaps, trials=30_000, threshold=float(t), scheme=scheme)
            np.testing.assert_array_equal(both.score_hits[:, j], one.score_hits)


# --------------------------------------------------------------------------- Monte Carlo validity with power


def test_clopper_pearson_coverage_and_doubled_alpha_power():
    """Joint miss rate of (tpr_low, fpr_up) at alpha = 0.05 over R = 20000 binomial experiments.

    Valid: misses <= the 1e-6 upper quantile of Bin(R, 0.05). Power: the same data at a doubled alpha
    (0.1 split as 0.05 per rate) misses more than that limit (the check would catch the error)."""
    rng = np.random.default_rng(11)
    reps, n, tpr, fpr = 20_000, 4000, 0.3, 0.01
    k1, k0 = rng.binomial(n, tpr, reps), rng.binomial(n, fpr, reps)
    limit = _limit(reps, 0.05)

    def misses(alpha):
        tl, _ = est.binomial_pair(k1, n, "lower", alpha / 2)
        fu, _ = est.binomial_pair(k0, n, "upper", alpha / 2)
        return int(np.sum((tl > tpr) | (fu < fpr)))

    assert misses(0.05) <= limit
    assert misses(0.10) > limit
    # The scalar path agrees with the vectorised one.
    b = est.binomial_bound(int(k1[0]), n, "lower", 0.025)
    assert b.bound == pytest.approx(float(est.binomial_pair(k1[:1], n, "lower", 0.025)[0][0]), rel=1e-12)


def test_bernstein_coverage_fails_for_wald_and_for_a_dropped_range_term():
    """Per-snapshot rates of a rare event (rate 0.5 in 2% of snapshots, 0 otherwise), n = 40 snapshots.

    The one-sided empirical Bernstein upper bound misses the mean 0.01 in <= alpha/2 of R = 4000 runs (limit:
    1e-6 quantile). Power: a Wald radius z sqrt(V/n), and the Bernstein radius without its 7 ln(2/a)/(3(n-1))
    term, both miss far more often (all-zero samples have V = 0)."""
    rng = np.random.default_rng(12)
    reps, n, a = 4000, 40, 0.025
    mean = 0.02 * 0.5
    limit = _limit(reps, a)
    miss = wald = dropped = 0
    for _ in range(reps):
        rates = np.where(rng.random(n) < 0.02, 0.5, 0.0)
        b = est.bernstein_bound(rates, 1 - rates, "upper", a)
        miss += b.bound < mean
        v = np.var(rates, ddof=1)
        wald += rates.mean() + special.ndtri(1 - a) * math.sqrt(v / n) < mean
        dropped += rates.mean() + b.variance_term < mean
    assert miss <= limit
    assert wald > limit and dropped > limit


@pytest.mark.slow
def test_audit_false_alarms_at_the_nominal_rate_with_power():
    """sa.audit on a fixed PV pair: the joint miss of (tpr_low, fpr_up) against the exact rates over R = 1500
    seeded audits stays below the 1e-6 quantile of Bin(R, 0.05); the same results re-bounded at a doubled
    alpha (est.rebound) exceed it, and so do the point estimates (tpr_hat, fpr_hat) reported as bounds."""
    mech = sa.PrivateVoting.calibrated(1.0, DELTA)
    w, wo = np.array([[1.0, 2.0]]), np.array([[0.0, 3.0]])
    attack = sa.make_attack(mech, w[0], wo[0], target=0)
    tpr = float(sa.exact_hit_probability(mech, w, attack)[0][0])
    fpr = float(sa.exact_hit_probability(mech, wo, attack)[0][0])
    reps = 1500
    limit = _limit(reps, 0.05)
    miss = miss_doubled = miss_point = 0
    for seed in range(reps):
        r = sa.audit(mech, w, wo, epsilon_theory=1.0, clean="fixed", target=0, trials=3000, seed=seed)
        miss += r.tpr_low > tpr or r.fpr_up < fpr
        t2, f2 = est.rebound(r.tpr, 0.05), est.rebound(r.fpr, 0.05)
        miss_doubled += t2.bound > tpr or f2.bound < fpr
        miss_point += r.tpr_hat > tpr or r.fpr_hat < fpr
    assert miss <= limit
    assert miss_doubled > limit
    assert miss_point > limit


def test_canary_grid_needs_its_bonferroni():
    """No leakage (all scores N(0, 1)), a grid of 40 thresholds fixed in advance, R = 400 runs.

    The reported eps_std > 0 in <= alpha of the runs (limit: 1e-6 quantile). Its validity rests on the 2 G
    grid bounds holding simultaneously at the layer's per-rate alpha / (2 G): they miss a true rate in <= alpha
    of the runs. Power: at alpha / 2 per rate (no Bonferroni) they miss far more often."""
    rng = np.random.default_rng(13)
    grid = np.linspace(-2.0, 2.5, 40)
    true = special.ndtr(-grid)  # P(N(0,1) >= t) for members and non-members alike
    reps, alpha, size = 400, 0.05, 300
    limit = _limit(reps, alpha)
    positive = corrected = uncorrected = 0
    for _ in range(reps):
        m, n = rng.normal(size=size), rng.normal(size=size)
        t = est.threshold_test(m, n, est.Bonferroni(tuple(grid)), delta=DELTA, alpha=alpha)
        positive += est.estimate(t.tpr, t.fpr, DELTA)[0] > 0
        k1 = (m[None] >= grid[:, None]).sum(1)
        k0 = (n[None] >= grid[:, None]).sum(1)

        def missed(a, k1=k1, k0=k0):
            tl, _ = est.binomial_pair(k1, size, "lower", a)
            fu, _ = est.binomial_pair(k0, size, "upper", a)
            return bool(np.any(tl > true) or np.any(fu < true))

        corrected += missed(t.alpha_per_rate)
        uncorrected += missed(alpha / 2)
    assert t.alpha_per_rate == pytest.approx(alpha / (2 * grid.size))
    assert positive <= limit and corrected <= limit
    assert uncorrected > limit


def test_holm_controls_familywise_false_alarms_and_needs_its_correction():
    """Eight claims at the null boundary (binary releases exactly (2, delta)-DP; the FPR is known exactly, the TPR
    is estimated from 2000 trials): over R = 1000 families the family-wise false-alarm rate is <= alpha with Holm
    (limit: 1e-6 quantile); flagging any row at its own alpha is not. The p-values are super-uniform."""
    rng = np.random.default_rng(14)
    eps, n, fpr = 2.0, 2000, 0.02
    tpr = math.exp(eps) * fpr + DELTA
    reps, rows, alpha = 1000, 8, 0.05
    limit = _limit(reps, alpha)
    f = est.exact_rate([fpr], [1 - fpr])
    holm_alarms = naive_alarms = 0
    all_p = []
    cache = {}  # p-values depend on the count only: compute each distinct count once

    def p_value(k):
        if k not in cache:
            cache[k] = est.violation_p_value(est.binomial_bound(k, n, "lower", alpha / 2), f, DELTA, eps)
        return cache[k]

    for _ in range(reps):
        ps = [p_value(int(k)) for k in rng.binomial(n, tpr, rows)]
        all_p += ps
        holm_alarms += bool(np.any(est.holm(ps, alpha)))
        naive_alarms += bool(np.any(np.array(ps) <= alpha))
    assert holm_alarms <= limit
    assert naive_alarms > limit
    assert np.sum(np.array(all_p) <= alpha) <= _limit(reps * rows, alpha)


def test_holm_matches_its_definition():
    rng = np.random.default_rng(15)
    for _ in range(200):
        p = rng.random(6) ** 3
        order = np.argsort(p)
        expected = np.zeros(6, bool)
        for rank, i in enumerate(order):
            if p[i] > 0.05 / (6 - rank):
                break
            expected[i] = True
        np.testing.assert_array_equal(est.holm(p, 0.05), expected)


def test_rows_use_their_own_key_streams_and_holm_in_the_cli(capsys):
    from snapaudit_jax.cli import main

    code = main(["simulate", "--mechanism", "poe", "--estimator", "gdp", "--method", "exact"])
    err = capsys.readouterr().err
    assert code == 2 and "--estimator" in err and "claims no mu" in err

    rows = run_simulate(SimulateConfig(mechanism="pv", epsilons=(2.0, 2.0), trials=20_000))
    assert rows[0].tpr_hat != rows[1].tpr_hat and [r.stream for r in rows] == [0, 1]
    code = main(["simulate", "--mechanism", "pv", "--calibration", "classical", "--epsilon", "8,16", "--threat",
                 "white", "--method", "exact", "--fail-on-violation"])
    out = capsys.readouterr().out
    assert code == 3 and "holm" in out and "exact privacy profile" in out


def test_gaussian_sigma_roundtrip_sanity():
    """The mu the calibration implies is sensitivity / sigma of the sigma used (float32 in the mechanism)."""
    mech = sa.PrivateVoting.calibrated(4.0, DELTA)
    r = sa.audit(mech, [[1.0, 2.0]], [[0.0, 3.0]], epsilon_theory=4.0, method="exact", clean="fixed",
                 estimator="gdp", threat="white", sensitivity=math.sqrt(2))
    assert r.mu_claim == pytest.approx(math.sqrt(2) / gaussian_sigma(4.0, DELTA, math.sqrt(2)), rel=1e-6)
    assert r.epsilon_emp == pytest.approx(4.0, rel=1e-5)
