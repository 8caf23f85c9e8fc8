"""Hyperparameter-sweep accounting (snapaudit_jax.dpsgd.tuning).

Oracles: dp_accounting's accountants on ``ComposedDpEvent`` / ``SelfComposedDpEvent`` built here directly;
Papernot & Steinke 2022 Theorem 2 evaluated here in mpmath from the base RDP curves, with ``E[K]`` summed from
Definition 1's product-form pmf (not the closed form); dp_accounting's ``RepeatAndSelectDpEvent`` (an
independent implementation of Theorems 2 and 6); scipy.stats / mpmath pmfs for the sampler.
"""

from __future__ import annotations

import json
import math

import dp_accounting
import jax
import mpmath
import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.pld import PLDAccountant
from dp_accounting.rdp import RdpAccountant
from dp_accounting.rdp.rdp_privacy_accountant import DEFAULT_RDP_ORDERS
from scipy import stats

from snapaudit_jax.dpsgd.tuning import (
    Candidate,
    Compose,
    PoissonRepetitions,
    RandomStopping,
    SweepAccounting,
    TruncatedNegativeBinomial,
    account_sweep,
    draw_candidates,
    draw_repetitions,
    repeat_and_select_rdp,
)
from snapaudit_jax.utils.errors import InputError

DELTA = 1e-5
DISC = 1e-2  # PLD value discretisation interval, in the code and the oracle alike (equalities hold for any)
AR = dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
ORDERS = np.asarray(DEFAULT_RDP_ORDERS, dtype=np.float64)
CANDIDATES = [Candidate(1.0, 0.05, 20), (1.5, 0.02, 30), (0.8, 0.01, 10)]


def event(sigma, q, steps):
    return dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps)


def rdp_acc():
    return RdpAccountant(neighboring_relation=AR)


def pld_acc():
    return PLDAccountant(AR, value_discretization_interval=DISC)


def base_curve(c):
    return rdp_acc().compose(event(*c)).rdp


# --- compose --------------------------------------------------------------------------------------------------

def test_compose_equals_dp_accounting_composed_event():
    out = account_sweep(CANDIDATES, DELTA, "compose", pld_discretization=DISC)
    composed = dp_accounting.ComposedDpEvent([event(*c) for c in CANDIDATES])
    rdp = rdp_acc().compose(composed)
    # our RDP is the sum of curves converted by dp_accounting's public compute_epsilon: equal to get_epsilon
    assert out.epsilon_rdp == pytest.approx(rdp.get_epsilon(DELTA), rel=1e-12)
    np.testing.assert_allclose(out.rdp, rdp.rdp, rtol=1e-12)
    assert out.epsilon_pld == pld_acc().compose(composed).get_epsilon(DELTA)
    assert out.epsilon == min(out.epsilon_rdp, out.epsilon_pld)
    singles = [min(rdp_acc().compose(event(*c)).get_epsilon(DELTA), pld_acc().compose(event(*c)).get_epsilon(DELTA))
               for c in CANDIDATES]
    np.testing.assert_allclose(out.candidate_epsilons, singles, rtol=1e-12)
    assert out.epsilon > max(out.candidate_epsilons) and out.runs == 3.0 and out.distribution is None
    assert out == account_sweep(CANDIDATES, DELTA, Compose(pld_discretization=DISC))  # name and value agree


def test_composing_k_identical_candidates_equals_self_composition():
    c = (1.2, 0.05, 20)
    out = account_sweep([c] * 3, DELTA, "compose", pld_discretization=DISC)
    self_composed = dp_accounting.SelfComposedDpEvent(event(*c), 3)
    assert out.epsilon_rdp == pytest.approx(rdp_acc().compose(self_composed).get_epsilon(DELTA), rel=1e-12)
    # PLD: three sequential convolutions vs one self-convolution, equal up to FFT rounding (observed ~1e-11)
    assert out.epsilon_pld == pytest.approx(pld_acc().compose(self_composed).get_epsilon(DELTA), rel=1e-9)


# --- random stopping: the RDP bound ---------------------------------------------------------------------------

def _mean_from_pmf(eta, gamma):
    """E[K] = sum_k k P[K = k] from Definition 1's product form, in mpmath (independent of the closed form):
    terms by the ratio P[k+1]/P[k] = (1 - gamma)(k + eta)/(k + 1), summed until the geometric tail bound on
    what is left is below 1e-30."""
    mpmath.mp.dps = 40
    eta, gamma = mpmath.mpf(eta), mpmath.mpf(gamma)
    if eta == 0:
        p = (1 - gamma) / mpmath.log(1 / gamma)
    else:
        p = (1 - gamma) * eta / (gamma ** -eta - 1)
    total, mean, k = mpmath.mpf(0), mpmath.mpf(0), 1
    while True:
        total += p
        mean += k * p
        ratio = (1 - gamma) * (k + eta) / (k + 1) if eta != 0 else (1 - gamma) * k / (k + 1)
        bound = max(ratio, 1 - gamma)  # every later ratio is below this
        if k > 10 and (k + 1) * p * bound / (1 - bound) ** 2 < mpmath.mpf("1e-30"):
            break
        p *= ratio
        k += 1
    assert abs(total - 1) < 1e-25
    return mean


def _theorem2(orders, rdp, eta, gamma, mean, *, drop_log_mean=False, drop_one_plus_eta=False):
    """Papernot & Steinke Thm 2 at each order > 1, then the monotone envelope; in mpmath."""
    mpmath.mp.dps = 30
    hat = min((1 - 1 / mpmath.mpf(lh)) * mpmath.mpf(e) + mpmath.log(1 / mpmath.mpf(gamma)) / lh
              for lh, e in zip(orders, rdp) if math.isfinite(e))
    factor = 1 if drop_one_plus_eta else 1 + mpmath.mpf(eta)
    raw = []
    for lam, e in zip(orders, rdp):
        if lam <= 1 or not math.isfinite(e):
            raw.append(math.inf)
            continue
        term = 0 if drop_log_mean else mpmath.log(mean) / (lam - 1)
        raw.append(float(mpmath.mpf(e) + factor * hat + term))
    return np.array([min(raw[i:]) for i in range(len(raw))])  # orders ascending


@pytest.mark.parametrize("eta", [0.0, 0.5, 1.0, 2.0, -0.5])
def test_random_stopping_rdp_is_theorem_2_at_every_order(eta):
    """One or three candidates (per-order max of their curves); power: dropping log(E[K])/(lambda-1) or the
    (1 + eta) factor gives a different bound, which the comparison's tolerance rejects."""
    dist = TruncatedNegativeBinomial.with_mean(eta, 8.0)
    mean = _mean_from_pmf(eta, dist.gamma)
    assert float(mean) == pytest.approx(dist.mean, rel=1e-12) and dist.mean == pytest.approx(8.0, rel=1e-12)
    curves = np.stack([base_curve(c) for c in CANDIDATES])
    for cands, base in ((CANDIDATES[:1], curves[0]), (CANDIDATES, curves.max(axis=0))):
        out = account_sweep(cands, DELTA, "random_stopping", distribution=dist)
        expected = _theorem2(ORDERS, base, eta, dist.gamma, mean)
        np.testing.assert_allclose(out.rdp, expected, rtol=1e-10)
        assert out.epsilon == pytest.approx(dp_accounting.rdp.compute_epsilon(ORDERS, expected, DELTA)[0], rel=1e-9)
        for wrong in (dict(drop_log_mean=True), dict(drop_one_plus_eta=True)):
            if wrong.get("drop_one_plus_eta") and eta == 0.0:
                continue  # (1 + eta) = 1: nothing to drop
            bad = _theorem2(ORDERS, base, eta, dist.gamma, mean, **wrong)
            assert not np.allclose(out.rdp, bad, rtol=1e-6), wrong
        assert out.epsilon > max(out.candidate_epsilons)
        assert out.runs == dist.mean and out.epsilon_pld is None and out.rule == "random_stopping"


@pytest.mark.parametrize("dist", [TruncatedNegativeBinomial(1.0, 0.1), TruncatedNegativeBinomial.with_mean(0.0, 10.0),
                                  TruncatedNegativeBinomial.with_mean(2.0, 10.0), PoissonRepetitions(10.0)],
                         ids=["geometric", "logarithmic", "eta2", "poisson"])
def test_random_stopping_matches_dp_accounting_repeat_and_select(dist):
    """dp_accounting's RepeatAndSelectDpEvent (its own gamma solve, to 1e-9; no envelope for Poisson, so
    compare with its envelope)."""
    c = CANDIDATES[0]
    shape = math.inf if isinstance(dist, PoissonRepetitions) else dist.eta
    theirs = rdp_acc().compose(dp_event.RepeatAndSelectDpEvent(event(*c), dist.mean, shape)).rdp
    envelope = np.minimum.accumulate(theirs[::-1])[::-1]
    out = account_sweep([c], DELTA, RandomStopping(dist))
    np.testing.assert_allclose(out.rdp, envelope, rtol=1e-8)


@pytest.mark.parametrize("eta", [0.0, 1.0])
def test_random_stopping_beats_composition_for_many_runs(eta):
    """E[K] = 100 runs: more than one run costs, but far less than composing 100 runs (PLD, directly)."""
    c = (1.0, 0.01, 100)
    out = account_sweep([c], DELTA, "random_stopping", distribution=TruncatedNegativeBinomial.with_mean(eta, 100.0))
    single_pld = pld_acc().compose(event(*c)).get_epsilon(DELTA)
    composed_pld = pld_acc().compose(dp_accounting.SelfComposedDpEvent(event(*c), 100)).get_epsilon(DELTA)
    assert max(single_pld, out.candidate_epsilons[0]) < out.epsilon < 0.6 * composed_pld


def test_repeat_and_select_rdp_keeps_infinite_orders_and_rejects_bad_curves():
    dist = TruncatedNegativeBinomial(1.0, 0.5)
    out = repeat_and_select_rdp([1.0, 2.0, 4.0], [math.inf, 0.1, 0.3], dist)
    assert np.all(np.isfinite(out[1:])) and out[0] == out[1]  # order 1 borrows the bound of order 2
    with pytest.raises(InputError, match="rdp must be >= 0"):
        repeat_and_select_rdp([2.0], [-1.0], dist)
    with pytest.raises(InputError, match="orders must all be >= 1"):
        repeat_and_select_rdp([0.5], [1.0], dist)


# --- the result and bad input ---------------------------------------------------------------------------------

def test_the_result_says_what_is_covered_and_is_strict_json():
    out = account_sweep(CANDIDATES[:1], DELTA, "random_stopping", distribution=TruncatedNegativeBinomial(1.0, 0.2))
    assert isinstance(out, SweepAccounting)
    assert "training set" in out.covered and "only the best" in out.covered
    assert any("validation split" in s for s in out.not_covered)
    assert any("K, the other runs" in s for s in out.not_covered)
    blob = json.loads(out.to_json())
    assert blob["distribution"] == {"distribution": "truncated_negative_binomial", "eta": 1.0, "gamma": 0.2,
                                    "mean": pytest.approx(5.0)}
    assert blob["rdp"][0] is not None and len(blob["orders"]) == len(ORDERS)


@pytest.mark.parametrize("args,kwargs,match", [
    (([(0.0, 0.1, 10)], DELTA), {}, r"candidates\[0\].noise_multiplier must be > 0"),
    (([(1.0, 1.5, 10)], DELTA), {}, r"sampling_rate must be in \(0, 1\], got 1.5"),
    (([], DELTA), {}, r"candidates must be a non-empty sequence"),
    (([(1.0, 0.1)], DELTA), {}, r"candidates\[0\] must be \(noise_multiplier, sampling_rate, steps\)"),
    (([(1.0, 0.1, 10)], 0.0), {}, r"delta must be in \(0, 1\), got 0.0"),
    (([(1.0, 0.1, 10)], DELTA, "best_of"), {}, r"rule must be one of"),
    (([(1.0, 0.1, 10)], DELTA, "random_stopping"), {}, r"rule 'random_stopping' takes distribution"),
    (([(1.0, 0.1, 10)], DELTA, Compose()), {"pld_discretization": 1e-3}, r"must be None when rule is a value"),
])
def test_bad_sweeps_are_named(args, kwargs, match):
    with pytest.raises(InputError, match=match):
        account_sweep(*args, **kwargs)


@pytest.mark.parametrize("make,match", [
    (lambda: TruncatedNegativeBinomial(-1.0, 0.5), r"eta must be a finite number > -1, got -1.0"),
    (lambda: TruncatedNegativeBinomial(1.0, 1.0), r"gamma must be in \(0, 1\), got 1.0"),
    (lambda: TruncatedNegativeBinomial.with_mean(1.0, 1.0), r"mean must be a finite number > 1, got 1.0"),
    (lambda: PoissonRepetitions(0.5), r"mean must be a finite number >= 1, got 0.5"),
    (lambda: RandomStopping(3), r"distribution must be a TruncatedNegativeBinomial or PoissonRepetitions"),
])
def test_bad_distributions_are_named(make, match):
    with pytest.raises(InputError, match=match):
        make()


# --- sampling K -----------------------------------------------------------------------------------------------

def _pmf_oracle(dist, k):
    if isinstance(dist, PoissonRepetitions):
        return stats.poisson.pmf(k, dist.mean)
    eta, gamma = dist.eta, dist.gamma
    if eta == 0.0:
        return stats.logser.pmf(k, 1.0 - gamma)
    if eta == 1.0:
        return stats.geom.pmf(k, gamma)
    if eta > 0.0:
        return stats.nbinom.pmf(k, eta, gamma) / (1.0 - stats.nbinom.pmf(0, eta, gamma))
    mpmath.mp.dps = 30
    e, g = mpmath.mpf(eta), mpmath.mpf(gamma)
    return np.array([float((1 - g) ** int(j) / (g ** -e - 1) * mpmath.rf(e, int(j)) / mpmath.factorial(int(j)))
                     for j in k])


def _chi_square_pvalue(draws, dist, first):
    """Pearson chi-square of the draws against ``dist``'s pmf on bins first..m-1 and a tail bin >= m, m the first
    value whose expected count is below 5 (the pmfs here are unimodal with a large first bin)."""
    n = draws.size
    k = np.arange(first, first + 2000)
    p = _pmf_oracle(dist, k)
    m = first + int(np.flatnonzero(n * p < 5.0)[0])
    assert m >= first + 2
    probs = np.append(p[: m - first], 1.0 - p[: m - first].sum())
    counts = np.append([np.sum(draws == j) for j in range(first, m)], np.sum(draws >= m))
    chi2 = np.sum((counts - n * probs) ** 2 / (n * probs))
    return stats.chi2.sf(chi2, len(probs) - 1)


SAMPLER_CASES = [
    (TruncatedNegativeBinomial(1.0, 0.25), 1),
    (TruncatedNegativeBinomial.with_mean(0.0, 5.0), 2),
    (TruncatedNegativeBinomial.with_mean(2.0, 5.0), 3),
    (TruncatedNegativeBinomial.with_mean(-0.5, 5.0), 4),
    (PoissonRepetitions(4.0), 5),
]


@pytest.mark.parametrize("dist,seed", SAMPLER_CASES, ids=["geometric", "logarithmic", "eta2", "eta-0.5", "poisson"])
def test_draw_repetitions_follows_the_distribution(dist, seed):
    """20,000 draws pass Pearson's chi-square at level 1e-3 (false-failure probability 1e-3 per case, 5e-3 for
    the five; seeds fixed); power: the same draws are rejected at that level against the shape eta + 0.2 (same
    gamma) or a Poisson mean 10% higher. (A 10% change of gamma is not detectable at eta = -0.5, where nearly all
    mass is at K = 1 and the change sits in the far tail.) The sampler's log_pmf equals the independent pmf."""
    first = 0 if isinstance(dist, PoissonRepetitions) else 1
    k = np.arange(first, first + 60)
    np.testing.assert_allclose(np.exp(dist.log_pmf(k)), _pmf_oracle(dist, k), rtol=1e-9)
    draws = draw_repetitions(jax.random.key(seed), dist, (20_000,))
    assert draws.dtype == np.int64 and draws.min() >= first
    assert _chi_square_pvalue(draws, dist, first) > 1e-3
    if isinstance(dist, PoissonRepetitions):
        wrong = PoissonRepetitions(dist.mean * 1.1)
    else:
        wrong = TruncatedNegativeBinomial(dist.eta + 0.2, dist.gamma)
    assert _chi_square_pvalue(draws, wrong, first) < 1e-3


def test_draws_are_deterministic_in_the_key():
    dist = TruncatedNegativeBinomial(1.0, 0.1)
    a = draw_repetitions(jax.random.key(7), dist, (50,))
    np.testing.assert_array_equal(a, draw_repetitions(7, dist, (50,)))  # an int seed is jax.random.key(seed)
    assert not np.array_equal(a, draw_repetitions(jax.random.key(8), dist, (50,)))
    one = draw_repetitions(7, dist)
    assert isinstance(one, int) and one >= 1
    key = jax.random.key(11)
    plan = draw_candidates(key, dist, 4)
    assert plan == draw_candidates(key, dist, 4)
    assert len(plan) == draw_repetitions(jax.random.fold_in(key, 0), dist)
    assert all(0 <= i < 4 for i in plan)
    with pytest.raises(InputError, match="key must be an integer"):
        draw_repetitions(-1, dist)
    with pytest.raises(InputError, match="num_candidates must be an integer >= 1"):
        draw_candidates(key, dist, 0)
