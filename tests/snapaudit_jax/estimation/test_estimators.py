"""Tests for snapaudit_jax.estimation.estimators: closed forms, precision near 1, and validity.

The central property: for the Gaussian mechanism, which is exactly mu-GDP, the
rates of every threshold test (and any valid bounds on them) must not give an
estimate above the mechanism's true eps = gdp_epsilon(mu, delta). The tests are
deterministic (closed-form rates; hypothesis with derandomize=True).
"""

from __future__ import annotations

import math

import mpmath as mp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import special

from snapaudit_jax.estimation import estimators as est
from snapaudit_jax.mechanisms.noise import gdp_epsilon


@pytest.fixture(autouse=True)
def _mpmath_precision():
    """Every test here runs with 50-digit mpmath, without leaking the setting to other modules."""
    with mp.workdps(50):
        yield


# Estimates computed from float rates may exceed the exact value by rounding only;
# 1e-9 relative is orders of magnitude above that and orders below any real error.
ROUNDING = 1e-9


def upper_quantile_mp(p):
    """x with P(N(0,1) > x) = p, to 50 digits (root of the log tail; robust for tiny p)."""
    p = mp.mpf(p)
    return mp.findroot(lambda x: mp.log(mp.ncdf(-x)) - mp.log(p), 5)


def gaussian_rates(mu, t):
    """Rates of the test 'output > t' for N(0,1) (null) vs N(mu,1) (alternative), with complements."""
    t = np.asarray(t, dtype=np.float64)
    return dict(
        tpr=special.ndtr(mu - t),
        tpr_c=special.ndtr(t - mu),
        fpr=special.ndtr(-t),
        fpr_c=special.ndtr(t),
    )


# --------------------------------------------------------------------------- epsilon_std


def test_epsilon_std_first_direction():
    """tpr=0.9, fpr=0.01: eps = ln((0.9 - delta)/0.01) (the TPR <= e^eps FPR + delta direction)."""
    for delta in [0.0, 1e-5, 0.05]:
        assert est.epsilon_std(0.9, 0.01, delta) == pytest.approx(math.log((0.9 - delta) / 0.01), rel=1e-14)


def test_epsilon_std_second_direction():
    """tpr=0.999, fpr=0.5: the complement direction ln((1 - 0.5 - delta)/(1 - 0.999)) dominates."""
    delta = 1e-5
    first = math.log((0.999 - delta) / 0.5)
    second = math.log((1 - 0.5 - delta) / (1 - 0.999))
    assert second > first
    assert est.epsilon_std(0.999, 0.5, delta) == pytest.approx(second, rel=1e-14)


def test_epsilon_std_zero_when_tpr_not_above_fpr():
    """epsilon_std is exactly 0 whenever tpr <= fpr (any delta >= 0)."""
    rates = np.array([1e-12, 1e-4, 0.1, 0.3, 0.5, 0.7, 0.99, 1 - 1e-9])
    tpr, fpr = np.meshgrid(rates, rates, indexing="ij")
    mask = tpr <= fpr
    for delta in [0.0, 1e-5, 0.2]:
        out = est.epsilon_std(tpr[mask], fpr[mask], delta)
        assert np.all(out == 0.0)


def test_epsilon_std_delta_above_tpr_is_finite():
    """When tpr_low <= delta the first direction is skipped, not a log of a negative number."""
    out = est.epsilon_std(1e-6, 1e-9, 1e-5)
    assert out == 0.0
    out = est.epsilon_std(np.array([1e-6, 0.5]), np.array([1e-9, 1e-3]), 1e-5)
    assert np.all(np.isfinite(out)) and out[0] == 0.0 and out[1] > 0.0


def test_epsilon_std_vectorised_and_monotone():
    """Array inputs match scalar calls; the bound increases in tpr, decreases in fpr and in delta."""
    tpr = np.linspace(0.05, 0.999, 37)
    out = est.epsilon_std(tpr, 0.02, 1e-5)
    assert out.shape == tpr.shape
    assert out[5] == est.epsilon_std(float(tpr[5]), 0.02, 1e-5)
    assert np.all(np.diff(out) >= 0)
    fpr = np.linspace(1e-4, 0.5, 37)
    assert np.all(np.diff(est.epsilon_std(0.8, fpr, 1e-5)) <= 0)
    deltas = [0.0, 1e-8, 1e-4, 1e-2, 0.1]
    vals = [est.epsilon_std(0.8, 0.01, d) for d in deltas]
    assert all(a >= b for a, b in zip(vals, vals[1:]))


def test_epsilon_std_tpr_complement_precision():
    """tpr within 1e-20 of 1 (given as a complement) gives ln((0.5 - delta)/1e-20) to 1e-13 (mpmath)."""
    delta = 1e-5
    got = est.epsilon_std(1.0, 0.5, delta, tpr_low_complement=1e-20)
    ref = mp.log((1 - mp.mpf(0.5) - mp.mpf(delta)) / mp.mpf("1e-20"))
    assert got == pytest.approx(float(ref), rel=1e-13)
    # Without the complement tpr = 1.0 exactly is taken at face value (complement rounded to
    # the smallest subnormal): a far larger, different number.
    assert est.epsilon_std(1.0, 0.5, delta) > 700


def test_epsilon_std_both_complements_precision():
    """tpr = 1-1e-25, fpr = 1-1e-18 (complements), delta=1e-20: eps = ln((1e-18 - 1e-20)/1e-25) (mpmath)."""
    tc, fc, delta = mp.mpf("1e-25"), mp.mpf("1e-18"), mp.mpf("1e-20")
    tpr, fpr = 1 - tc, 1 - fc
    ref = max(mp.log((tpr - delta) / fpr), mp.log((1 - fpr - delta) / (1 - tpr)))
    got = est.epsilon_std(1.0, 1.0, 1e-20, tpr_low_complement=1e-25, fpr_up_complement=1e-18)
    assert got == pytest.approx(float(ref), rel=1e-13)
    assert est.epsilon_std(1.0, 1.0, 1e-20) == 0.0  # the information is lost without complements


def test_epsilon_std_rejects_invalid_delta():
    """A negative or nan delta is refused (it would inflate the lower bound); delta = 0 is a pure-DP claim."""
    # 0.9 and 0.01 give ln(0.9/0.01) = 4.50 at delta = 0; delta = -0.5 would give ln(1.4/0.01) = 4.94.
    assert est.epsilon_std(0.9, 0.01, 0.0) == pytest.approx(math.log(90.0))
    for bad in [-0.5, math.nan, 1.0]:
        with pytest.raises(ValueError, match="delta"):
            est.epsilon_std(0.9, 0.01, bad)


# --------------------------------------------------------------------------- mu_lower

RATES = np.array([1e-300, 1e-30, 1e-8, 1e-3, 0.1, 0.3, 0.5, 0.6, 0.9, 0.999, 1 - 1e-9])


def test_mu_lower_equals_probit_difference():
    """mu_lower == ndtri(tpr) - ndtri(fpr) over a grid of rates (both signs)."""
    tpr, fpr = np.meshgrid(RATES, RATES, indexing="ij")
    got = est.mu_lower(tpr, fpr)
    np.testing.assert_allclose(got, special.ndtri(tpr) - special.ndtri(fpr), rtol=1e-12, atol=1e-12)


def test_mu_lower_no_abs_and_no_evidence():
    """Worse-than-chance tests give negative mu (no abs()); tpr=0 gives -inf; scalars give floats."""
    got = est.mu_lower(0.1, 0.3)
    assert isinstance(got, float)
    assert got == pytest.approx(float(special.ndtri(0.1) - special.ndtri(0.3)), rel=1e-14)
    assert got < 0
    assert est.mu_lower(0.0, 0.3) == -math.inf
    assert est.mu_lower(0.0, 0.0) == -math.inf
    assert math.isfinite(est.mu_lower(0.3, 0.0))  # fpr = 0 is rounded up, conservatively


def test_mu_lower_tpr_complement_precision():
    """tpr = 1 - 1e-20 via complement gives Phi^-1(1 - 1e-20) ~ 9.2623 to 1e-13 (mpmath), not +38."""
    z20 = upper_quantile_mp("1e-20")
    # two independent mpmath routes agree
    assert abs(z20 - mp.sqrt(2) * mp.erfinv(1 - 2 * mp.mpf("1e-20"))) < mp.mpf("1e-30")
    got = est.mu_lower(1.0, 0.5, tpr_low_complement=1e-20)
    assert got == pytest.approx(float(z20), rel=1e-13)
    assert 9.26 < got < 9.27


def test_mu_lower_both_complements_precision():
    """tpr = 1-1e-20, fpr = 1-1e-18 (complements): mu = z(1e-20) - z(1e-18) to 1e-12 (mpmath)."""
    ref = upper_quantile_mp("1e-20") - upper_quantile_mp("1e-18")
    got = est.mu_lower(1.0, 1.0, tpr_low_complement=1e-20, fpr_up_complement=1e-18)
    assert got == pytest.approx(float(ref), rel=1e-12)
    assert est.mu_lower(1.0, 1.0) == -math.inf  # without complements: no evidence


# --------------------------------------------------------------------------- epsilon_gdp


def test_epsilon_gdp_is_gdp_epsilon_of_mu_lower():
    """epsilon_gdp == gdp_epsilon(mu_lower(...), delta) where mu > 0, else 0."""
    for tpr in RATES:
        for fpr in RATES:
            for delta in [1e-10, 1e-5, 0.1]:
                mu = est.mu_lower(tpr, fpr)
                expected = gdp_epsilon(mu, delta) if mu > 0 else 0.0
                assert est.epsilon_gdp(tpr, fpr, delta) == expected
                if tpr <= fpr:
                    assert est.epsilon_gdp(tpr, fpr, delta) == 0.0


def test_epsilon_gdp_complements_forwarded():
    """epsilon_gdp passes complements to mu_lower."""
    mu = est.mu_lower(1.0, 0.5, tpr_low_complement=1e-20)
    assert est.epsilon_gdp(1.0, 0.5, 1e-5, tpr_low_complement=1e-20) == gdp_epsilon(mu, 1e-5)


def test_epsilon_gdp_monotone():
    """epsilon_gdp is non-decreasing in tpr and non-increasing in fpr and in delta."""
    tprs = np.linspace(0.01, 0.999, 61)
    e = [est.epsilon_gdp(t, 0.01, 1e-5) for t in tprs]
    assert all(a <= b for a, b in zip(e, e[1:]))
    fprs = np.geomspace(1e-8, 0.9, 61)
    e = [est.epsilon_gdp(0.8, f, 1e-5) for f in fprs]
    assert all(a >= b for a, b in zip(e, e[1:]))
    e = [est.epsilon_gdp(0.8, 0.01, d) for d in [1e-12, 1e-8, 1e-5, 1e-2, 0.3]]
    assert all(a >= b for a, b in zip(e, e[1:]))


@pytest.mark.parametrize("bad", [0.0, 1.0, -1e-5, math.nan])
def test_epsilon_gdp_validates_delta(bad):
    """epsilon_gdp rejects delta outside (0, 1) with a ValueError naming delta."""
    with pytest.raises(ValueError, match="delta"):
        est.epsilon_gdp(0.9, 0.1, bad)


# --------------------------------------------------------------------------- validity on the Gaussian mechanism

MUS = [0.1, 0.5, 1.0, 2.0, 4.0, 8.0]
DELTAS = [1e-10, 1e-5, 1e-2]


def _thresholds(mu, eps):
    # A dense grid plus the two optimal (likelihood-ratio) thresholds where the DP
    # inequalities are tight: t* = eps/mu + mu/2 (first direction), mu - t* (second).
    t_star = eps / mu + mu / 2
    return np.concatenate([np.linspace(-12.0, 12.0 + mu, 601), [t_star, mu - t_star]])


@pytest.mark.parametrize("mu", MUS)
def test_estimators_valid_and_tight_at_true_gaussian_rates(mu):
    """At the exact rates of every threshold test of a mu-GDP Gaussian, eps_gdp == eps(mu) and eps_std <= eps(mu).

    eps_std is tight at the likelihood-ratio threshold t*."""
    for delta in DELTAS:
        eps_true = gdp_epsilon(mu, delta)
        t = _thresholds(mu, eps_true)
        r = gaussian_rates(mu, t)
        kw = dict(tpr_low_complement=r["tpr_c"], fpr_up_complement=r["fpr_c"])
        eps_std = est.epsilon_std(r["tpr"], r["fpr"], delta, **kw)
        assert np.all(eps_std <= eps_true * (1 + ROUNDING)), (mu, delta, eps_std.max(), eps_true)
        # Tightness: the likelihood-ratio thresholds attain eps(mu) in each direction.
        assert eps_std[-2] == pytest.approx(eps_true, rel=ROUNDING)
        assert eps_std[-1] == pytest.approx(eps_true, rel=ROUNDING)
        mus = est.mu_lower(r["tpr"], r["fpr"], **kw)
        np.testing.assert_allclose(mus, mu, rtol=0, atol=1e-12)
        for i in range(0, t.size, 25):
            eps_gdp = est.epsilon_gdp(r["tpr"][i], r["fpr"][i], delta, tpr_low_complement=r["tpr_c"][i],
                                      fpr_up_complement=r["fpr_c"][i])
            assert eps_gdp == pytest.approx(eps_true, rel=ROUNDING)
            assert eps_gdp <= eps_true * (1 + ROUNDING)


@pytest.mark.parametrize("mu", [0.5, 2.0])
def test_estimators_valid_without_complements_away_from_one(mu):
    """Without complements, rates <= 1 - 1e-6 still give eps_std <= eps(mu) and eps_gdp ~= eps(mu)."""
    delta = 1e-5
    eps_true = gdp_epsilon(mu, delta)
    t = _thresholds(mu, eps_true)
    r = gaussian_rates(mu, t)
    keep = (r["tpr"] <= 1 - 1e-6) & (r["fpr"] <= 1 - 1e-6)
    eps_std = est.epsilon_std(r["tpr"][keep], r["fpr"][keep], delta)
    assert np.all(eps_std <= eps_true * (1 + ROUNDING))
    for tpr, fpr in zip(r["tpr"][keep][::20], r["fpr"][keep][::20]):
        assert est.epsilon_gdp(tpr, fpr, delta) == pytest.approx(eps_true, rel=ROUNDING)


@settings(derandomize=True, max_examples=300, deadline=None)
@given(
    mu=st.floats(0.05, 10.0),
    t=st.floats(-10.0, 20.0),
    delta=st.sampled_from([1e-12, 1e-8, 1e-5, 1e-3, 0.05]),
    shrink_tpr=st.floats(0.0, 1.0),
    grow_fpr=st.floats(0.0, 1.0),
)
def test_estimators_valid_under_any_valid_rate_bounds(mu, t, delta, shrink_tpr, grow_fpr):
    """Any tpr_low <= TPR and fpr_up >= FPR of a mu-GDP Gaussian test give eps_std, eps_gdp <= eps(mu)."""
    r = gaussian_rates(mu, t)
    tpr_low = float(r["tpr"]) * shrink_tpr
    tpr_low_c = float(r["tpr_c"]) + float(r["tpr"]) * (1 - shrink_tpr)
    fpr_up = float(r["fpr"]) + float(r["fpr_c"]) * grow_fpr
    fpr_up_c = float(r["fpr_c"]) * (1 - grow_fpr)
    kw = dict(tpr_low_complement=tpr_low_c, fpr_up_complement=fpr_up_c)
    eps_true = gdp_epsilon(mu, delta)
    assert est.epsilon_std(tpr_low, fpr_up, delta, **kw) <= eps_true * (1 + ROUNDING)
    assert est.epsilon_gdp(tpr_low, fpr_up, delta, **kw) <= eps_true * (1 + ROUNDING)


def test_validity_power_check_wrong_estimators_fail():
    """The validity checks reject ln(tpr/fpr) without delta and a GDP estimate with abs(mu)."""
    mu, delta = 1.0, 1e-5
    eps_true = gdp_epsilon(mu, delta)
    r = gaussian_rates(mu, _thresholds(mu, eps_true))
    no_delta = np.log(r["tpr"]) - np.log(r["fpr"])
    assert np.any(no_delta > eps_true * (1 + ROUNDING))  # grows like mu*t in the tail
    # abs(): valid but loose bounds (tpr_low = TPR/1e6, fpr_up = 1/2) make mu_lower negative;
    # |mu_lower| then claims more privacy loss than the mechanism has.
    t = 2.0
    rr = gaussian_rates(mu, t)
    tpr_low, fpr_up = float(rr["tpr"]) * 1e-6, 0.5
    mu_hat = est.mu_lower(tpr_low, fpr_up)
    assert mu_hat < 0 and est.epsilon_gdp(tpr_low, fpr_up, delta) == 0.0
    assert gdp_epsilon(abs(mu_hat), delta) > eps_true * (1 + ROUNDING)
