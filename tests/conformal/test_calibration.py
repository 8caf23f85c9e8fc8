"""The declared-configuration layer (``conformal.calibration``): ``calibrate`` (float64 thresholds,
Mondrian strata, open-world accounting of identities missing from the pool), ``miss_rate_upper`` and
``coverage_check``.

Oracles: the exact order statistic by brute force; exact finite-sample coverage of random splits of a
finite pool (``exact_split_coverage``); scipy and mpmath Clopper-Pearson; the exact Beta-Binomial law of
the validity check. Monte Carlo assertions use the tolerance ``Z * sd / sqrt(R)`` with a false-failure
probability of about 1e-6 each, and check power with the wrong variant (see ``test_kernels.py``). All seeds
are fixed.
"""

from __future__ import annotations

import math

import mpmath as mp
import numpy as np
import pytest
from scipy import stats

import conformal as cf

from tests.helpers.cpa import (
    ALPHAS,
    POOL_CANDIDATES,
    REPRO_ALPHA,
    Z,
    assert_set_identity,
    brute_threshold,
    exact_split_coverage,
    mc_tol,
    posteriors,
    random_splits,
    repro_scores,
    truncated_pool,
)


# --------------------------------------------------------------------------- the caller's precision (pitfall 10)


def test_calibrate_keeps_float64_thresholds():
    """calibrate / Calibration.thresholds keep float64 thresholds exactly (plain and Mondrian, in to_json too);
    float32 calibration scores still give float32 per-document thresholds."""
    cal = repro_scores()
    c = cf.calibrate(cal, [REPRO_ALPHA, 0.05])
    assert c.qhat[None] == (0.7, 0.9) and c.thresholds(REPRO_ALPHA) == 0.7
    assert c.to_json()["qhat"] == {"all": [0.7, 0.9]}
    strata = ["a", "b"] * 10  # a: 0.5 x3, 0.7 x6, 0.9 x1; b: 0.5 x2, 0.7 x6, 0.9 x2 (n = 10, k = 9)
    mc = cf.calibrate(cal, REPRO_ALPHA, strata=strata)
    q = mc.thresholds(REPRO_ALPHA, ["a", "b", "a"])
    assert q.dtype == np.float64
    np.testing.assert_array_equal(q, [0.7, 0.9, 0.7])
    np.testing.assert_array_equal(q[:2], [brute_threshold(cal[0::2], REPRO_ALPHA),
                                          brute_threshold(cal[1::2], REPRO_ALPHA)])
    q32 = cf.calibrate(cal.astype(np.float32), REPRO_ALPHA, strata=strata).thresholds(REPRO_ALPHA, ["a", "b"])
    assert q32.dtype == np.float32
    np.testing.assert_array_equal(q32, np.float32([0.7, 0.9]))


# --------------------------------------------------------------------------- top-K truncation, open world


@pytest.mark.slow
def test_truncation_conditional_and_unconditional_coverage():
    """CPA Corollary 5.3 over 1000 random splits (99 calibration documents; top-8 drops ~16% of the truths).

    Each split calibrates on its included documents (``calibrate(..., n_missing=...)``). Given the split's number
    n_inc of included calibration documents, the included test documents are exchangeable with them, so the expected
    coverage conditional on inclusion is exactly ``exact_split_coverage`` of the included pool at (n_inc, k(n_inc))
    (k(n_inc)/(n_inc + 1) without ties; the pool has ties near mass 1), and the unconditional one is that times the
    split's included test share. Both are checked two-sided on per-split differences (false-failure 1e-6 each), as
    are Corollary 5.3's (1 - rho)(1 - alpha) and the reported `set_metrics` fields. The miss-rate bound covers rho
    with probability >= 0.95 exactly (hypergeometric sum over the calibration miss count).
    Power: the order statistic k - 1 fails the exact conditional check (its own exact value is predicted too);
    unconditional coverage is below 1 - alpha (the miss cannot be ignored); the observed miss rate used as a bound
    (an estimate, pitfall 4) covers rho only ~50% of the time.
    """
    _, _, _, kept, pos, s = truncated_pool()
    included = pos >= 0
    n_pool, n_inc_pool = s.size, int(included.sum())
    rho = 1 - n_inc_pool / n_pool
    assert 0.08 < rho < 0.3
    inc_scores = s[included]
    n_cal, reps, conf = 99, 1000, 0.95
    perms = random_splits(np.random.default_rng(31), n_pool, n_cal, reps)
    qhat = np.empty((reps, len(ALPHAS)), np.float32)
    wrong = np.empty((reps, len(ALPHAS)), np.float32)
    certified = np.empty((reps, len(ALPHAS)))
    n_inc = np.empty(reps, int)
    for r in range(reps):
        cal = s[perms[r, :n_cal]]
        cal_inc = cal[np.isfinite(cal)]
        n_inc[r] = cal_inc.size
        c = cf.calibrate(cal_inc, ALPHAS, n_missing=n_cal - cal_inc.size, confidence=conf)
        assert c.n_cal == {None: cal_inc.size} and c.n_missing == n_cal - cal_inc.size
        assert c.miss_rate_upper == cf.miss_rate_upper(c.n_missing, n_cal, conf)
        qhat[r] = c.qhat[None]
        certified[r] = [c.certified_coverage(a) for a in ALPHAS]
        ordered = np.sort(cal_inc)
        for j, a in enumerate(ALPHAS):
            k = cf.conformal_rank(cal_inc.size, a)
            assert 2 <= k <= cal_inc.size  # finite thresholds in every split (precondition of the power check)
            wrong[r, j] = ordered[k - 2]
    test = perms[:, n_cal:]
    inc = included[test]
    inc_share = inc.mean(axis=1)  # the split's included test share
    covered = inc[:, :, None] & (s[test][:, :, None] <= qhat[:, None, :])  # a missed truth is never covered
    covered_wrong = inc[:, :, None] & (s[test][:, :, None] <= wrong[:, None, :])
    uncond = covered.mean(axis=1)
    cond = covered.sum(axis=1) / inc.sum(axis=1)[:, None]
    cond_wrong = covered_wrong.sum(axis=1) / inc.sum(axis=1)[:, None]
    ks = {n: [cf.conformal_rank(n, a) for a in ALPHAS] for n in np.unique(n_inc)}
    exact = {n: exact_split_coverage(inc_scores, n, k + [v - 1 for v in k]) for n, k in ks.items()}
    exact = np.stack([exact[n] for n in n_inc])  # (reps, 2 * len(ALPHAS)): order statistics k, then k - 1
    for j, a in enumerate(ALPHAS):
        e_cond, e_wrong = exact[:, j], exact[:, len(ALPHAS) + j]
        d = cond[:, j] - e_cond
        assert abs(d.mean()) <= mc_tol(d), (a, d.mean())
        d = cond_wrong[:, j] - e_wrong  # the oracle also predicts the wrong statistic ...
        assert abs(d.mean()) <= mc_tol(d), (a, d.mean())
        d = cond_wrong[:, j] - e_cond  # ... which is caught (E[d] ~ -1/(n_inc + 1) ~ -0.012, >= 2.3 tol)
        assert d.mean() < -mc_tol(d), (a, d.mean())
        d = uncond[:, j] - inc_share * e_cond
        assert abs(d.mean()) <= mc_tol(d), (a, d.mean())
        assert cond[:, j].mean() >= 1 - a - mc_tol(cond[:, j])
        assert uncond[:, j].mean() >= (1 - rho) * (1 - a) - mc_tol(uncond[:, j])  # Corollary 5.3
        assert certified[:, j].mean() <= (1 - rho) * (1 - a)
        assert uncond[:, j].mean() < 1 - a - mc_tol(uncond[:, j])  # power: the miss rate matters
    # the miss-rate bound: P(rho <= U(X)) >= conf exactly, X ~ Hypergeometric(pool, missed, n_cal)
    x = np.arange(n_cal + 1)
    pmf = stats.hypergeom.pmf(x, n_pool, n_pool - n_inc_pool, n_cal)
    upper = np.array([cf.miss_rate_upper(int(v), n_cal, conf) for v in x])
    assert np.sum(pmf[rho <= upper]) >= conf
    assert np.sum(pmf[rho <= x / n_cal]) < 0.6  # power: the plug-in estimate is not a bound
    # set_metrics reports the same three quantities for the sets of the last split
    last = test[-1]
    sets = np.asarray(cf.prediction_sets(kept[last], qhat[-1, 0]))
    metrics = cf.set_metrics(sets, pos[last])
    assert metrics["coverage"] == pytest.approx(uncond[-1, 0], abs=1e-12)
    assert metrics["coverage_conditional"] == pytest.approx(cond[-1, 0], abs=1e-12)
    assert metrics["candidate_miss_rate"] == pytest.approx(1 - inc_share[-1], abs=1e-12)


def clopper_pearson_upper_mp(x: int, n: int, confidence: float) -> float:
    """p with P(Bin(n, p) <= x) = 1 - confidence (one-sided upper bound), by 40-digit root finding."""
    if x == n:
        return 1.0
    with mp.workdps(40):
        target = mp.mpf(1) - mp.mpf(confidence)

        def tail(p):  # P(X <= x) = I_{1-p}(n - x, x + 1)
            return mp.betainc(n - x, x + 1, 0, 1 - p, regularized=True) - target

        lo, hi = mp.mpf(0), mp.mpf(1)
        for _ in range(120):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if tail(mid) > 0 else (lo, mid)
        return float((lo + hi) / 2)


@pytest.mark.parametrize("n,conf", [(1, 0.95), (20, 0.95), (99, 0.9), (300, 0.99)])
def test_miss_rate_upper_matches_clopper_pearson(n, conf):
    for x in sorted({0, 1, n // 3, n - 1, n}):
        got = cf.miss_rate_upper(x, n, conf)
        assert got == pytest.approx(clopper_pearson_upper_mp(x, n, conf), rel=1e-9, abs=1e-12)
    assert cf.miss_rate_upper(0, n, conf) == pytest.approx(1 - (1 - conf) ** (1 / n), rel=1e-12)


@pytest.mark.parametrize("rho", [0.005, 0.05, 0.3])
def test_miss_rate_upper_coverage(rho):
    """P(rho <= U(X)) >= confidence for X ~ Bin(n, rho): exactly (sum over x) and by Monte Carlo.

    MC: 20000 draws, assertion at false-failure 1e-6 (normal approximation of a binomial proportion). Power: the
    Wald bound x/n + z sqrt(x/n (1 - x/n) / n) under-covers at small rho (exact sum below the confidence).
    """
    n, conf = 60, 0.95
    upper = np.array([cf.miss_rate_upper(x, n, conf) for x in range(n + 1)])
    pmf = stats.binom.pmf(np.arange(n + 1), n, rho)
    assert np.sum(pmf[rho <= upper]) >= conf
    x = np.random.default_rng(40).binomial(n, rho, 20000)
    hit = rho <= upper[x]
    assert hit.mean() >= conf - Z * math.sqrt(conf * (1 - conf) / hit.size)
    phat = np.arange(n + 1) / n
    wald = phat + stats.norm.ppf(conf) * np.sqrt(phat * (1 - phat) / n)
    if rho < 0.1:
        assert np.sum(pmf[rho <= wald]) < conf


# --------------------------------------------------------------------------- Mondrian


def test_mondrian_per_stratum_coverage():
    """Two strata of very different scores (sharp vs diffuse attackers), 1000 stratified splits (99 + 99
    calibration documents), alpha = 0.1, raw-probability scores 1 - p_y.

    Per stratum, `calibrate(strata=...)` gives mean coverage `exact_split_coverage` (k/(n+1) = 0.9 but for one
    tie) within tol (two-sided) and >= 1 - alpha - tol, false-failure 1e-6 each. Power: the pooled threshold
    under-covers the hard stratum, and the per-stratum order statistic k - 1 under-covers both (the same
    assertion). (APS would invert the picture: a sharp attacker's truth has mass p_y close to 1, so its APS scores
    are the larger ones.)
    """
    rng = np.random.default_rng(60)
    easy, easy_labels = posteriors(rng, 1000, POOL_CANDIDATES, signal=3.0, spread=(1.5, 3.0))
    hard, hard_labels = posteriors(rng, 1000, POOL_CANDIDATES, signal=0.5, spread=(0.2, 1.0))
    probs, labels = np.concatenate([easy, hard]), np.concatenate([easy_labels, hard_labels])
    strata = np.repeat(np.array(["easy", "hard"]), 1000)
    s = np.asarray(cf.prob_scores(probs, labels))
    assert np.median(s[:1000]) < np.quantile(s[1000:], 0.1)  # very different score distributions
    reps, per, a = 1000, 99, 0.1
    k = cf.conformal_rank(per, a)
    assert k == 90
    pe = random_splits(rng, 1000, per, reps)
    ph = random_splits(rng, 1000, per, reps) + 1000
    cov = {"easy": np.empty(reps), "hard": np.empty(reps)}
    wrong = {"easy": np.empty(reps), "hard": np.empty(reps)}
    pooled_hard = np.empty(reps)
    for r in range(reps):
        cal_idx = np.concatenate([pe[r, :per], ph[r, :per]])
        c = cf.calibrate(s[cal_idx], a, score="prob", strata=strata[cal_idx])
        assert c.mondrian and c.n_cal == {"easy": per, "hard": per}
        for name, perm in (("easy", pe), ("hard", ph)):
            test = s[perm[r, per:]]
            cov[name][r] = np.mean(test <= np.float32(c.qhat[name][0]))
            wrong[name][r] = np.mean(test <= np.sort(s[perm[r, :per]])[k - 2])
        pooled = float(cf.threshold(s[cal_idx], a))
        pooled_hard[r] = np.mean(s[ph[r, per:]] <= pooled)
    for name in cov:
        exact = exact_split_coverage(s[strata == name], per, k)
        assert abs(exact - k / (per + 1)) < 1e-3
        assert abs(cov[name].mean() - exact) <= mc_tol(cov[name]), (name, cov[name].mean())
        assert cov[name].mean() >= 1 - a - mc_tol(cov[name]), (name, cov[name].mean())
        assert wrong[name].mean() < 1 - a - mc_tol(wrong[name]), (name, wrong[name].mean())
    assert pooled_hard.mean() < 1 - a - mc_tol(pooled_hard)
    # the per-document thresholds and the sets of the last split agree with the per-stratum rule
    test_idx = np.concatenate([pe[-1, per:per + 5], ph[-1, per:per + 5]])
    q = c.thresholds(a, list(strata[test_idx]))
    np.testing.assert_array_equal(q, [c.qhat[x][0] for x in strata[test_idx]])
    sets = assert_set_identity(probs[test_idx], q, "prob")
    np.testing.assert_array_equal(sets[np.arange(10), labels[test_idx]], s[test_idx] <= q)


def test_calibration_object_errors():
    c = cf.calibrate(np.linspace(0, 1, 20), [0.1, 0.2], strata=["a", "b"] * 10)
    with pytest.raises(ValueError, match="not calibrated"):
        c.thresholds(0.3, ["a"])
    with pytest.raises(ValueError, match="needs the strata"):
        c.thresholds(0.1)
    with pytest.raises(ValueError, match="stratum 'c'"):
        c.thresholds(0.1, ["a", "c"])
    with pytest.raises(ValueError, match="one entry per calibration score"):
        cf.calibrate(np.linspace(0, 1, 20), 0.1, strata=["a"])
    plain = cf.calibrate(np.linspace(0, 1, 20), 0.1)
    with pytest.raises(ValueError, match="not Mondrian"):
        plain.thresholds(0.1, ["a"])
    assert plain.to_json()["qhat"] == {"all": [float(cf.threshold(np.linspace(0, 1, 20), 0.1))]}  # float64 kept
    plain32 = cf.calibrate(np.linspace(0, 1, 20).astype(np.float32), 0.1)
    assert plain32.to_json()["qhat"] == {"all": [float(cf.threshold(np.linspace(0, 1, 20).astype(np.float32), 0.1))]}


# --------------------------------------------------------------------------- coverage_check


def test_coverage_check_false_alarm_rate_and_power():
    """Under exchangeability the alarm rate is <= 1 - confidence (Beta-Binomial law, Bonferroni over 3 alphas).

    300 runs at confidence 0.9: #alarms <= the 1 - 1e-6 quantile of Bin(300, 0.1) (false-failure <= 1e-6 since
    #alarms is dominated by that binomial). Power of the Monte Carlo: the naive Binomial(n_test, 1 - alpha) law
    (ignoring the calibration draw) alarms far more often and fails the same bound. Drift (test scores shifted
    up by 0.3) fires the alarm in >= 45 of 50 runs.
    """
    rng = np.random.default_rng(90)
    n, k_test, runs, conf = 99, 500, 300, 0.9
    level = (1 - conf) / len(ALPHAS)
    alarms = naive_alarms = 0
    for _ in range(runs):
        x = rng.random(n + k_test)
        chk = cf.coverage_check(x[:n], x[n:], ALPHAS, confidence=conf)
        alarms += chk.alarm
        assert chk.n_test == k_test and chk.alphas == ALPHAS
        naive_alarms += any(
            stats.binom.cdf(c, k_test, 1 - a) < level for c, a in zip(chk.covered, ALPHAS)
        )
        qs = np.asarray(cf.threshold(x[:n].astype(np.float32), list(ALPHAS)))
        assert chk.covered == tuple(int(np.sum(x[n:].astype(np.float32) <= q)) for q in qs)
    bound = stats.binom.isf(1e-6, runs, 1 - conf)
    assert alarms <= bound
    assert naive_alarms > bound
    drift = 0
    for _ in range(50):
        x = rng.random(n + k_test)
        drift += cf.coverage_check(x[:n], x[n:] + 0.3, ALPHAS, confidence=conf).alarm
    assert drift >= 45


def test_coverage_check_exact_law_and_full_sets():
    """lower_quantile / pvalue follow Beta-Binomial(n_test, k, n+1-k); k > n gives full coverage, no alarm."""
    cal = np.linspace(0, 1, 9)
    chk = cf.coverage_check(cal, np.linspace(0, 2, 40), (0.05, 0.5), confidence=0.99)
    assert chk.lower_quantile[0] == 40 and chk.pvalue[0] == 1.0 and chk.covered[0] == 40  # k = 10 > 9
    law = stats.betabinom(40, 5, 5)
    assert chk.pvalue[1] == pytest.approx(law.cdf(chk.covered[1]))
    lq = chk.lower_quantile[1]
    assert law.cdf(lq) >= 0.005 and (lq == 0 or law.cdf(lq - 1) < 0.005)
    with pytest.raises(ValueError, match="cal_scores is empty"):
        cf.coverage_check([], [0.1])
    with pytest.raises(ValueError, match="test_scores is empty"):
        cf.coverage_check([0.1], [])
    with pytest.raises(ValueError, match="confidence"):
        cf.coverage_check([0.1], [0.1], confidence=1.0)
