"""The one-run auditor (Steinke, Nasr, Jagielski 2023) of the estimation layer.

Oracles: mpmath sums of binomial masses for the tail bound, the Clopper-Pearson closed form for ``delta = 0``,
jax_privacy 2.0.0's p-value and root on identical counts, naive loops for the guesses. Every Monte Carlo states
its false-failure probability and carries a power check: it fails for a doubled alpha, a missing family
correction, a dropped delta term, and for ignoring the insertion probability.
"""

from __future__ import annotations

import math

import jax
import mpmath as mp
import numpy as np
import pytest
from scipy import stats

import snapaudit_jax as sa
from snapaudit_jax.estimation import one_run as orun
from snapaudit_jax.mechanisms.noise import gdp_epsilon

FAILURE = 1e-6  # false-failure probability of each Monte Carlo check below


def _limit(reps: int, rate: float, failure: float = FAILURE) -> int:
    """Largest count c with P(Binomial(reps, rate) > c) <= failure: more than c fails the check."""
    return int(stats.binom.isf(failure, reps, rate))


def _floor(reps: int, rate: float, failure: float = FAILURE) -> int:
    """Smallest count c with P(Binomial(reps, rate) < c) <= failure: fewer than c fails the check."""
    return int(stats.binom.ppf(failure, reps, rate))


# --------------------------------------------------------------------------- exact oracles


def _mp_p_value(m, r, v, eps, delta):
    """The (eps, delta) tail bound with p = 1/2, every mass summed in mpmath."""
    mp.mp.dps = 40
    q = 1 / (1 + mp.e ** (-mp.mpf(eps)))

    def pmf(k):
        return mp.binomial(r, k) * q ** k * (1 - q) ** (r - k)

    beta = mp.fsum(pmf(k) for k in range(v, r + 1))
    scale, below = mp.mpf(0), mp.mpf(0)
    for i in range(1, v + 1):  # max_i P[v - i <= B < v] / i
        below += pmf(v - i)
        scale = max(scale, below / i)
    return float(min(beta + 2 * m * mp.mpf(delta) * scale, 1))


@pytest.mark.parametrize("m,r,v,eps,delta", [(1000, 100, 70, 0.5, 1e-5), (1000, 300, 200, 0.3, 1e-5),
                                             (53, 23, 23, 2.0, 1e-3), (997, 101, 71, 0.7, 0.0), (11, 1, 0, 0.0, 1e-2)])
def test_p_value_matches_mpmath_and_jax_privacy(m, r, v, eps, delta):
    from jax_privacy import auditing

    ours = orun.one_run_p_value(v, r, 0, 0, canaries=m, epsilon=eps, delta=delta, insert_probability=0.5)
    assert ours == pytest.approx(_mp_p_value(m, r, v, eps, delta), rel=1e-10, abs=1e-15)
    assert ours == pytest.approx(auditing._one_run_p_value(m, r, v, eps, delta), rel=1e-12, abs=1e-15)
    # two-sided guesses with p = 1/2: only the totals matter
    split = orun.one_run_p_value(v // 2, r // 2, v - v // 2, r - r // 2, canaries=m, epsilon=eps, delta=delta,
                                 insert_probability=0.5)
    assert split == pytest.approx(ours, rel=1e-12, abs=1e-15)


def test_pure_dp_epsilon_is_the_clopper_pearson_logit():
    """delta = 0, p = 1/2: the bound is logit of the one-sided Clopper-Pearson lower bound on precision."""
    for v, r, alpha in [(80, 100, 0.05), (17, 17, 0.01), (530, 1000, 0.05), (3, 7, 0.2)]:
        q_low = stats.beta.ppf(alpha, v, r - v + 1)
        want = max(0.0, math.log(q_low / (1 - q_low)))
        got = orun.one_run_epsilon(v, r, 0, 0, canaries=2 * r, delta=0.0, alpha=alpha, insert_probability=0.5)
        assert got == pytest.approx(want, abs=1e-8)


def test_epsilon_agrees_with_jax_privacy_on_identical_counts_and_is_a_checked_rejection():
    from jax_privacy import auditing

    for m, r, v in [(1000, 100, 80), (1000, 50, 45), (5000, 2000, 1200), (200, 200, 180)]:
        ours = orun.one_run_epsilon(v, r, 0, 0, canaries=m, delta=1e-5, alpha=0.05, insert_probability=0.5)
        theirs = auditing._epsilon_one_run(0, m, r, v, 0.05, 1e-5)
        assert ours == pytest.approx(theirs, abs=2e-6)
        assert orun.one_run_p_value(v, r, 0, 0, canaries=m, epsilon=ours, delta=1e-5, insert_probability=0.5) <= 0.05
        assert orun.one_run_p_value(v, r, 0, 0, canaries=m, epsilon=ours + 1e-6, delta=1e-5,
                                    insert_probability=0.5) > 0.05


def test_general_p_tail_is_the_exact_two_binomial_convolution():
    """delta = 0, p != 1/2: P[Bin(k+, q+) + Bin(k-, q-) >= v] by brute-force mpmath enumeration."""
    mp.mp.dps = 30
    for p, kp, km, vp, vm, eps in [(0.8, 9, 4, 8, 2, 0.4), (0.1, 5, 12, 2, 12, 1.3), (0.3, 0, 7, 0, 6, 0.0)]:
        qp = p * mp.e ** eps / (p * mp.e ** eps + 1 - p)
        qm = (1 - p) * mp.e ** eps / ((1 - p) * mp.e ** eps + p)
        want = mp.fsum(mp.binomial(kp, a) * qp ** a * (1 - qp) ** (kp - a) * mp.binomial(km, b) * qm ** b
                       * (1 - qm) ** (km - b) for a in range(kp + 1) for b in range(km + 1) if a + b >= vp + vm)
        got = orun.one_run_p_value(vp, kp, vm, km, canaries=40, epsilon=eps, delta=0.0, insert_probability=p)
        assert got == pytest.approx(float(want), rel=1e-10)
    # at p = 1/2 the general form reduces to one binomial
    a = orun._p_value(30, 40, 10, 20, 100, 0.3, 0.0, 0.5)
    b = float(stats.binom.sf(39, 60, 1 / (1 + math.exp(-0.3))))
    assert a == pytest.approx(b, rel=1e-12)


def test_guess_counts_match_a_naive_loop_with_index_tie_breaks():
    rng = np.random.default_rng(3)
    scores = rng.integers(0, 5, size=37).astype(float)  # many ties
    inserted = rng.random(37) < 0.5
    pairs = [(1, 0), (5, 5), (0, 7), (18, 19), (37, 0)]
    got = orun.guess_counts(scores, inserted, pairs)
    order = sorted(range(37), key=lambda i: (-scores[i], i))
    for (kp, km), (vp, vm) in zip(pairs, got):
        assert vp == sum(inserted[i] for i in order[:kp])
        assert vm == sum(not inserted[i] for i in order[37 - km:])


# --------------------------------------------------------------------------- Monte Carlo validity and power


def _top_bottom_counts(scores, inserted, pairs):
    """``(runs, G, 2)`` correct guesses of every pair in every run (vectorised :func:`guess_counts`)."""
    runs, m = scores.shape
    order = np.argsort(-scores, axis=1, kind="stable")  # ties by index, as the library
    hits = np.concatenate([np.zeros((runs, 1), np.int64), np.cumsum(np.take_along_axis(inserted, order, 1), 1)], 1)
    total = hits[:, -1]
    return np.stack([np.stack([hits[:, kp], km - (total - hits[:, m - km])], -1) for kp, km in pairs], 1)


def _rejects_zero(counts, pairs, *, m, delta, level, p, drop_delta_term=False):
    """``(runs,)``: some pair rejects eps = 0 at ``level`` (the event "epsilon > 0" of one_run_audit)."""
    table = {}
    out = np.zeros(counts.shape[0], bool)
    for g, (kp, km) in enumerate(pairs):
        for vp, vm in {tuple(x) for x in counts[:, g].tolist()}:
            d = 0.0 if drop_delta_term else delta
            table[g, vp, vm] = orun._p_value(vp, kp, vm, km, m, 0.0, d, p) <= level
        out |= np.array([table[g, vp, vm] for vp, vm in counts[:, g].tolist()])
    return out


@pytest.mark.slow
def test_null_false_alarms_below_alpha_and_the_check_tells_six_from_five_percent():
    """No leakage (scores independent of the coins), 1,000 fair-coin canaries, the default declared grid.

    30,000 runs: the check fails above _limit(30000, 0.05, 1e-4) (5.47%) with false-failure probability 1e-4 at
    a true 5%; a procedure at jax_privacy's measured 6.1% would pass it with probability < 1e-5, and the same
    grid without its family correction (alpha per pair) is caught, as is a point estimate reported as a bound.
    """
    runs, m, delta, alpha, failure = 30_000, 1000, 1e-5, 0.05, 1e-4
    rng = np.random.default_rng(0)
    pairs = orun.default_grid(m)
    counts = np.zeros((runs, len(pairs), 2), np.int64)
    for lo in range(0, runs, 5000):
        scores = rng.normal(size=(5000, m))
        inserted = rng.random((5000, m)) < 0.5
        counts[lo:lo + 5000] = _top_bottom_counts(scores, inserted, pairs)
    alarms = _rejects_zero(counts, pairs, m=m, delta=delta, level=alpha / len(pairs), p=0.5)
    limit = _limit(runs, alpha, failure)
    assert alarms.sum() <= limit
    assert limit < 0.055 * runs  # tells 6% (jax_privacy's measured rate) from 5%
    assert stats.binom.cdf(limit, runs, 0.061) < 1e-5
    # power: the same pairs each at alpha (no union bound) exceed alpha
    uncorrected = _rejects_zero(counts, pairs, m=m, delta=delta, level=alpha, p=0.5)
    assert uncorrected.sum() > limit
    # and a point estimate reported as a bound (logit of the best pair's raw precision) is caught too
    r = np.array([kp + km for kp, km in pairs])
    point = (counts.sum(-1) / r > 0.5).any(axis=1)  # logit(v / r) > 0 for some pair
    assert point.sum() > limit
    # the Monte Carlo's event is the library's: epsilon > 0 exactly where some pair rejects eps = 0
    rng = np.random.default_rng(1)
    for _ in range(40):
        scores, inserted = rng.normal(size=m) + 0.15 * (ins := rng.random(m) < 0.5), ins
        res = orun.one_run_audit(scores, inserted, insert_probability=0.5, delta=delta, alpha=alpha)
        c = _top_bottom_counts(scores[None], inserted[None], pairs)
        assert (res.epsilon > 0) == bool(_rejects_zero(c, pairs, m=m, delta=delta, level=alpha / len(pairs),
                                                       p=0.5)[0])


def test_single_pair_is_near_its_size_and_fails_for_a_doubled_alpha():
    """One declared pair, delta = 0: the size is the binomial test's (close to alpha); 2 alpha is caught."""
    runs, m, alpha = 20_000, 400, 0.05
    rng = np.random.default_rng(2)
    pairs = ((100, 100),)
    counts = _top_bottom_counts(rng.normal(size=(runs, m)), rng.random((runs, m)) < 0.5, pairs)
    alarms = _rejects_zero(counts, pairs, m=m, delta=0.0, level=alpha, p=0.5)
    assert alarms.sum() <= _limit(runs, alpha)
    assert alarms.sum() >= _floor(runs, 0.035)  # close to its size: the check has room to fail
    doubled = _rejects_zero(counts, pairs, m=m, delta=0.0, level=2 * alpha, p=0.5)
    assert doubled.sum() > _limit(runs, alpha)


def test_delta_term_is_needed_for_a_mechanism_that_leaks_with_probability_delta():
    """A (0, d)-DP run: with probability d it releases every coin, else nothing. The bound at (0, d) holds;
    without its delta term it rejects eps = 0 in about d + alpha of the runs."""
    runs, m, d, alpha = 20_000, 200, 0.03, 0.05
    rng = np.random.default_rng(4)
    inserted = rng.random((runs, m)) < 0.5
    leak = rng.random(runs) < d
    scores = np.where(leak[:, None], inserted.astype(float), 0.0) + rng.normal(size=(runs, m)) * (~leak[:, None])
    pairs = ((100, 100),)
    counts = _top_bottom_counts(scores, inserted, pairs)
    with_term = _rejects_zero(counts, pairs, m=m, delta=d, level=alpha, p=0.5)
    without = _rejects_zero(counts, pairs, m=m, delta=d, level=alpha, p=0.5, drop_delta_term=True)
    assert with_term.sum() <= _limit(runs, alpha)
    assert without.sum() > _limit(runs, alpha)


def test_general_insertion_probability_is_valid_and_ignoring_it_is_not():
    """p = 0.8, no leakage, pure eps claim: exact two-binomial bound <= alpha; scoring against 1/2 is caught."""
    runs, m, alpha, p = 20_000, 300, 0.05, 0.8
    rng = np.random.default_rng(5)
    pairs = ((60, 0), (30, 30), (0, 60))
    counts = _top_bottom_counts(rng.normal(size=(runs, m)), rng.random((runs, m)) < p, pairs)
    alarms = _rejects_zero(counts, pairs, m=m, delta=0.0, level=alpha / 3, p=p)
    assert alarms.sum() <= _limit(runs, alpha)
    wrong_prior = _rejects_zero(counts, pairs, m=m, delta=0.0, level=alpha / 3, p=0.5)
    assert wrong_prior.sum() > _limit(runs, alpha)


@pytest.mark.slow
def test_gaussian_canaries_bounded_by_the_true_epsilon_and_the_bound_grows_with_m():
    """Scores N(mu S_i, 1): the run is mu-GDP in each coin, so (eps(delta), delta)-DP for G_mu.

    Validity: over 40 runs at m = 2,000 no bound exceeds eps(delta) (expected exceedances <= 0.05 * 40 = 2;
    P(> 10) < 1e-6). Power: the median bound grows from m = 100 to m = 10,000 and is positive at 10,000.
    """
    mu, delta = 2.0, 1e-5
    true_eps = gdp_epsilon(mu, delta)
    rng = np.random.default_rng(6)
    over = 0
    for _ in range(40):
        s = rng.random(2000) < 0.5
        res = orun.one_run_audit(rng.normal(size=2000) + mu * s, s, insert_probability=0.5, delta=delta)
        over += res.epsilon > true_eps
        assert res.family_size == len(orun.default_grid(2000))
    assert over <= _limit(40, 0.05)
    medians = []
    for m in (100, 1000, 10_000):
        vals = []
        for _ in range(5):
            s = rng.random(m) < 0.5
            vals.append(orun.one_run_audit(rng.normal(size=m) + mu * s, s, insert_probability=0.5,
                                           delta=delta).epsilon)
        medians.append(float(np.median(vals)))
    assert medians[0] < medians[1] < medians[2] < true_eps
    assert medians[2] > 1.0


# --------------------------------------------------------------------------- rules and errors


def test_held_out_selection_uses_its_key_and_evaluates_the_rest_at_alpha():
    rng = np.random.default_rng(7)
    s = rng.random(3001) < 0.5
    scores = rng.normal(size=3001) + 1.5 * s
    a = orun.one_run_audit(scores, s, insert_probability=0.5, delta=1e-5, rule=orun.HeldOut(0.3),
                           key=jax.random.key(1))
    b = orun.one_run_audit(scores, s, insert_probability=0.5, delta=1e-5, rule=orun.HeldOut(0.3),
                           key=jax.random.key(1))
    assert a == b and a.rule == "held_out" and a.family_size == 1 and a.alpha_per_pair == 0.05
    assert a.n_selection == 900 and a.canaries == 2101 and a.epsilon > 0
    assert a.epsilon == pytest.approx(orun.one_run_epsilon(a.correct_plus, a.k_plus, a.correct_minus, a.k_minus,
                                                           canaries=2101, delta=1e-5, alpha=0.05,
                                                           insert_probability=0.5))
    with pytest.raises(ValueError, match="key must be a PRNG key"):
        orun.one_run_audit(scores, s, insert_probability=0.5, delta=1e-5, rule=orun.HeldOut())


def test_declared_grid_reports_every_pair_and_the_best():
    rng = np.random.default_rng(8)
    s = rng.random(500) < 0.5
    scores = rng.normal(size=500) + 2.0 * s
    pairs = ((10, 0), (50, 50), (200, 0))
    res = orun.one_run_audit(scores, s, insert_probability=0.5, delta=1e-5, rule=orun.DeclaredGrid(pairs))
    assert res.family_size == 3 and res.alpha_per_pair == pytest.approx(0.05 / 3)
    assert [p[:2] for p in res.pairs] == [list(x) for x in pairs] or [tuple(p[:2]) for p in res.pairs] == list(pairs)
    assert res.epsilon == max(p[4] for p in res.pairs)
    for kp, km, vp, vm, eps in res.pairs:
        assert eps == orun.one_run_epsilon(vp, kp, vm, km, canaries=500, delta=1e-5, alpha=0.05 / 3,
                                           insert_probability=0.5)
    assert res.to_dict()["pairs"][1][:2] == [50, 50]
    assert sa.one_run_audit is orun.one_run_audit


@pytest.mark.parametrize("kwargs,match", [
    (dict(inserted=[1, 0, 1]), r"inserted must have one entry per score: got 3 flags for 4 scores"),
    (dict(inserted=[1, 0, 2, 1]), r"inserted must be binary \(bool or 0/1\), got 2 at index 2"),
    (dict(inserted=[0.5, 0, 1, 1]), r"inserted must be binary .* got 0.5 at index 0"),
    (dict(inserted=["a", "b", "c", "d"]), r"inserted must be binary .* dtype"),
    (dict(scores=[0.1, np.nan, 0.3, 0.4]), r"scores must be finite"),
    (dict(rule=orun.DeclaredGrid(((3, 2),))), r"k_plus \+ k_minus must be <= the number of canaries \(4\), got 3 \+ 2"),
    (dict(rule=orun.DeclaredGrid(((0, 0),))), r"at least one guess"),
    (dict(rule=orun.DeclaredGrid(((-1, 2),))), r"k_plus\) must be an integer >= 0, got -1"),
    (dict(rule=orun.DeclaredGrid(())), r"rule.pairs must be a non-empty grid"),
    (dict(insert_probability=1.0, delta=0.0), r"insert_probability must be in \(0, 1\), got 1.0"),
    (dict(insert_probability=0.0, delta=0.0), r"insert_probability must be in \(0, 1\), got 0.0"),
    (dict(insert_probability=0.3), r"insert_probability must be 1/2 for an \(eps, delta\) claim with delta > 0"),
    (dict(delta=1.0), r"delta must be in \[0, 1\), got 1.0"),
    (dict(alpha=0.0), r"alpha must be in \(0, 1\), got 0.0"),
    (dict(rule="grid"), r"rule must be a DeclaredGrid or HeldOut, got str"),
])
def test_bad_input_names_argument_rule_and_value(kwargs, match):
    args = dict(scores=[0.1, 0.2, 0.3, 0.4], inserted=[1, 0, 1, 0], insert_probability=0.5, delta=1e-5)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        orun.one_run_audit(args.pop("scores"), args.pop("inserted"), **args)


def test_pure_claims_allow_any_probability_and_counts_are_checked():
    res = orun.one_run_audit([3.0, 2.0, 1.0, 0.0], [1, 1, 0, 0], insert_probability=0.3, delta=0.0,
                             rule=orun.DeclaredGrid(((2, 2),)))
    assert res.correct == 4 and res.insert_probability == 0.3
    with pytest.raises(ValueError, match=r"correct_plus must be <= k_plus \(3\), got 4"):
        orun.one_run_p_value(4, 3, 0, 1, canaries=10, epsilon=0.0, delta=0.0, insert_probability=0.5)
    with pytest.raises(ValueError, match=r"epsilon must be a finite number >= 0"):
        orun.one_run_p_value(1, 3, 0, 1, canaries=10, epsilon=-1.0, delta=0.0, insert_probability=0.5)
    with pytest.raises(ValueError, match=r"HeldOut|empty part"):
        orun.one_run_audit([1.0, 2.0], [1, 0], insert_probability=0.5, delta=0.0, rule=orun.HeldOut(0.2),
                           key=jax.random.key(0))
