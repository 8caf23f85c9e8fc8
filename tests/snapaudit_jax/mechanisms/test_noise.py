"""Tests for snapaudit_jax.mechanisms.noise against independent oracles.

Oracles: mpmath at 50 significant digits for the Gaussian-DP privacy profile,
and Google's dp_accounting (PLD library) for the analytic Gaussian sigma.
"""

from __future__ import annotations

import math

import mpmath as mp
import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_mechanism as plm
from dp_accounting.pld.common import DifferentialPrivacyParameters

from snapaudit_jax.mechanisms import noise as cal


@pytest.fixture(autouse=True)
def _mpmath_precision():
    """Every test here runs with 50-digit mpmath, without leaking the setting to other modules."""
    with mp.workdps(50):
        yield


# Grid for the profile: includes large eps/mu (up to 60/12) and small mu.
# On this grid the two terms of the profile cancel by at most ~3 decimal
# digits, so 50-digit arithmetic leaves > 40 correct digits in the oracle.
EPS_GRID = [0.0, 1e-3, 0.1, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 40.0, 60.0]
MU_GRID = [1e-3, 0.01, 0.1, 0.5, 1.0, 1.5, 1.7, 2.0, 4.0, 8.0, 12.0]


def delta_mp(epsilon, mu):
    """High-precision ``Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)``."""
    e, m = mp.mpf(epsilon), mp.mpf(mu)
    return mp.ncdf(-e / m + m / 2) - mp.exp(e) * mp.ncdf(-e / m - m / 2)


def _dpa_delta(sigma, sensitivity, epsilon):
    return plm.GaussianPrivacyLoss(standard_deviation=sigma, sensitivity=sensitivity).get_delta_for_epsilon(epsilon)


# --------------------------------------------------------------------------- gdp_delta


@pytest.mark.parametrize("epsilon", EPS_GRID)
def test_gdp_delta_matches_mpmath(epsilon):
    """gdp_delta agrees with the 50-digit profile to 1e-9 relative wherever delta > 1e-300."""
    checked = 0
    for mu in MU_GRID:
        ref = delta_mp(epsilon, mu)
        got = cal.gdp_delta(epsilon, mu)
        if ref > mp.mpf("1e-300"):
            assert abs(got - ref) <= mp.mpf("1e-9") * ref, (epsilon, mu, got, ref)
            checked += 1
        else:  # below the float range that matters: must underflow to (near) zero, never blow up
            assert 0.0 <= got <= 1e-290, (epsilon, mu, got)
    assert checked >= 1


def test_gdp_delta_special_values():
    """delta(eps; 0) = 0, delta(0; inf) = 1, delta(0; mu) = 2 Phi(mu/2) - 1."""
    assert cal.gdp_delta(1.0, 0.0) == 0.0
    assert cal.gdp_delta(0.0, math.inf) == 1.0
    for mu in [0.1, 1.0, 3.0]:
        ref = 2 * mp.ncdf(mp.mpf(mu) / 2) - 1
        assert cal.gdp_delta(0.0, mu) == pytest.approx(float(ref), rel=1e-12)


def test_gdp_delta_monotone():
    """delta(eps; mu) decreases in eps and increases in mu."""
    eps = np.linspace(0.0, 20.0, 81)
    for mu in [0.3, 1.0, 4.0]:
        d = [cal.gdp_delta(e, mu) for e in eps]
        assert all(a >= b for a, b in zip(d, d[1:]))
    mus = np.linspace(0.05, 10.0, 80)
    for e in [0.5, 3.0]:
        d = [cal.gdp_delta(e, m) for m in mus]
        assert all(a <= b for a, b in zip(d, d[1:]))


# --------------------------------------------------------------------------- gdp_epsilon

EPS_MU_GRID = [0.01, 0.1, 0.5, 1.0, 2.0, 4.0, 8.0, 12.0, 30.0]
EPS_DELTA_GRID = [1e-300, 1e-100, 1e-30, 1e-12, 1e-8, 1e-5, 1e-3, 0.1, 0.5, 0.9, 0.999]


@pytest.mark.parametrize("mu", EPS_MU_GRID)
def test_gdp_epsilon_inverts_profile(mu):
    """At the returned eps the 50-digit profile equals delta (1e-8 rel.); eps = 0 iff 2Phi(mu/2)-1 <= delta."""
    for delta in EPS_DELTA_GRID:
        eps = cal.gdp_epsilon(mu, delta)
        at_zero = 2 * mp.ncdf(mp.mpf(mu) / 2) - 1  # delta(0; mu)
        if at_zero <= delta:
            assert eps == 0.0, (mu, delta, eps)
        else:
            assert eps > 0.0
            assert abs(delta_mp(eps, mu) - delta) <= mp.mpf("1e-8") * delta, (mu, delta, eps)


def test_gdp_epsilon_zero_threshold_is_sharp():
    """eps switches from 0 to > 0 exactly at the mu where 2 Phi(mu/2) - 1 = delta."""
    for delta in [1e-6, 1e-3, 0.2]:
        mu0 = float(2 * mp.sqrt(2) * mp.erfinv(mp.mpf(delta)))  # 2 Phi^-1((1 + delta)/2)
        assert cal.gdp_epsilon(mu0 * (1 - 1e-9), delta) == 0.0
        assert cal.gdp_epsilon(mu0 * (1 + 1e-6), delta) > 0.0


def test_gdp_epsilon_nonpositive_and_infinite_mu():
    """mu <= 0 (including -inf) gives eps = 0; mu = inf gives eps = inf."""
    for mu in [0.0, -0.0, -1e-12, -3.0, -math.inf]:
        assert cal.gdp_epsilon(mu, 1e-5) == 0.0
    assert cal.gdp_epsilon(math.inf, 1e-5) == math.inf


def test_gdp_epsilon_monotone_in_mu():
    """gdp_epsilon is non-decreasing in mu, strictly increasing once positive."""
    mus = np.geomspace(1e-3, 40.0, 120)
    for delta in [1e-10, 1e-5, 0.05]:
        eps = np.array([cal.gdp_epsilon(m, delta) for m in mus])
        assert np.all(np.diff(eps) >= 0.0)
        pos = eps > 0
        assert np.all(np.diff(eps[pos]) > 0.0)


# --------------------------------------------------------------------------- gdp_mu / analytic sigma


@pytest.mark.parametrize("delta", [1e-300, 1e-10, 1e-5, 1e-3, 0.5, 0.99])
def test_gdp_mu_round_trip(delta):
    """gdp_epsilon(gdp_mu(eps, delta), delta) == eps (1e-10 rel.); mu* is the mpmath root to 1e-9 rel."""
    for eps in [1e-3, 0.01, 0.1, 1.0, 4.0, 16.0, 60.0]:
        mu = cal.gdp_mu(eps, delta)
        assert cal.gdp_epsilon(mu, delta) == pytest.approx(eps, rel=1e-10)
        # Bracket the root in mu-space (checking delta(eps; mu) == delta directly is
        # ill-conditioned when mu << eps, where d log delta / d log mu is ~ (eps/mu)^2).
        assert delta_mp(eps, mu * (1 - 1e-9)) < delta < delta_mp(eps, mu * (1 + 1e-9))


SIGMA_CASES = [
    (eps, delta, sens)
    for eps in [0.1, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0]
    for delta in [1e-10, 1e-5, 1e-3]
    for sens in [1.0, math.sqrt(2.0)]
]

# dp_accounting's from_privacy_guarantee bisects sigma with BinarySearchParameters'
# default *absolute* tolerance 1e-7 and returns the upper end of the final bracket,
# i.e. a sigma in [sigma*, sigma* + 1e-7]. Its delta is a float evaluation of the
# same profile (observed agreement with ours ~1e-12 relative), so we allow a 1e-10
# relative slack on either side for rounding. Observed theirs - ours: 0 .. 7e-8.
DPA_ABS_TOL = 1e-7
FLOAT_SLACK = 1e-10


@pytest.mark.parametrize("eps,delta,sens", SIGMA_CASES)
def test_analytic_sigma_vs_dp_accounting(eps, delta, sens):
    """Our sigma <= dp_accounting's and within its 1e-7 search tolerance; it is (eps, delta)-DP per dp_accounting."""
    ours = cal.analytic_gaussian_sigma(eps, delta, sens)
    theirs = plm.GaussianPrivacyLoss.from_privacy_guarantee(
        DifferentialPrivacyParameters(eps, delta), sens
    ).standard_deviation
    assert -FLOAT_SLACK * ours <= theirs - ours <= DPA_ABS_TOL + FLOAT_SLACK * ours
    # Validity per the independent library: delta at our sigma does not exceed the target.
    assert _dpa_delta(ours, sens, eps) <= delta * (1 + 1e-6)
    # Tightness (power): 1e-4 less noise already violates (eps, delta)-DP.
    assert _dpa_delta(ours * (1 - 1e-4), sens, eps) > delta


def test_sigma_power_check_detects_wrong_sigma():
    """The comparison above would reject a sigma 1e-6 too small and one 1e-6 too large (relative)."""
    eps, delta, sens = 2.0, 1e-5, 1.0
    ours = cal.analytic_gaussian_sigma(eps, delta, sens)
    theirs = plm.GaussianPrivacyLoss.from_privacy_guarantee(
        DifferentialPrivacyParameters(eps, delta), sens
    ).standard_deviation
    too_small, too_large = ours * (1 - 1e-6), ours * (1 + 1e-6)
    assert _dpa_delta(too_small, sens, eps) > delta * (1 + 1e-6)  # fails the validity check
    assert too_large - theirs > DPA_ABS_TOL + FLOAT_SLACK * too_large  # fails the "<= theirs" check


def test_analytic_sigma_scales_with_sensitivity():
    """sigma = sensitivity / gdp_mu(eps, delta) and gaussian_sigma dispatches to it."""
    for sens in [0.5, 1.0, 3.0]:
        s = cal.analytic_gaussian_sigma(1.5, 1e-6, sens)
        assert s == pytest.approx(sens / cal.gdp_mu(1.5, 1e-6), rel=1e-15)
        assert cal.gaussian_sigma(1.5, 1e-6, sens) == s
        assert cal.gaussian_sigma(1.5, 1e-6, sens, calibration="classical") == cal.classical_gaussian_sigma(
            1.5, 1e-6, sens
        )


# --------------------------------------------------------------------------- classical sigma


def test_classical_sigma_closed_form():
    """classical sigma == Delta sqrt(2 ln(1.25/delta)) / eps (mpmath)."""
    for eps, delta, sens in [(0.5, 1e-5, 1.0), (1.0, 1e-3, 2.0), (16.0, 1e-5, math.sqrt(2)), (0.01, 0.3, 0.1)]:
        ref = mp.mpf(sens) * mp.sqrt(2 * mp.log(mp.mpf(1.25) / mp.mpf(delta))) / mp.mpf(eps)
        assert cal.classical_gaussian_sigma(eps, delta, sens) == pytest.approx(float(ref), rel=1e-14)


def test_classical_sigma_undersized_for_large_eps():
    """At eps=16, delta=1e-5, Delta=sqrt 2 the classical sigma is below the analytic one and not (eps, delta)-DP."""
    eps, delta, sens = 16.0, 1e-5, math.sqrt(2.0)
    classical = cal.classical_gaussian_sigma(eps, delta, sens)
    analytic = cal.analytic_gaussian_sigma(eps, delta, sens)
    assert classical < analytic
    assert float(delta_mp(eps, sens / classical)) > delta  # the flaw: the promised delta is exceeded


def test_classical_sigma_valid_for_small_eps():
    """At eps=0.5 (< 1) the classical sigma is larger than the analytic one, hence (eps, delta)-DP."""
    for delta in [1e-10, 1e-5, 1e-2]:
        eps, sens = 0.5, math.sqrt(2.0)
        classical = cal.classical_gaussian_sigma(eps, delta, sens)
        assert classical > cal.analytic_gaussian_sigma(eps, delta, sens)
        assert float(delta_mp(eps, sens / classical)) <= delta


# --------------------------------------------------------------------------- exponential mechanism


def test_exponential_mechanism_scale():
    """Score multiplier is eps / (2 Delta_u)."""
    for eps, sens in [(1.0, 1.0), (0.3, 2.0), (8.0, 0.25)]:
        assert cal.exponential_mechanism_scale(eps, sens) == pytest.approx(eps / (2 * sens), rel=1e-15)


# --------------------------------------------------------------------------- input validation

BAD_CALLS = [
    (cal.gdp_delta, (-0.1, 1.0), "epsilon"),
    (cal.gdp_delta, (math.nan, 1.0), "epsilon"),
    (cal.gdp_delta, (1.0, -1.0), "mu"),
    (cal.gdp_delta, (1.0, math.nan), "mu"),
    (cal.gdp_epsilon, (1.0, 0.0), "delta"),
    (cal.gdp_epsilon, (1.0, 1.0), "delta"),
    (cal.gdp_epsilon, (1.0, math.nan), "delta"),
    (cal.gdp_epsilon, (math.nan, 1e-5), "mu"),
    (cal.gdp_mu, (0.0, 1e-5), "epsilon"),
    (cal.gdp_mu, (-1.0, 1e-5), "epsilon"),
    (cal.gdp_mu, (math.nan, 1e-5), "epsilon"),
    (cal.gdp_mu, (1.0, 1.5), "delta"),
    (cal.classical_gaussian_sigma, (0.0, 1e-5, 1.0), "epsilon"),
    (cal.classical_gaussian_sigma, (math.nan, 1e-5, 1.0), "epsilon"),
    (cal.classical_gaussian_sigma, (1.0, 0.0, 1.0), "delta"),
    (cal.classical_gaussian_sigma, (1.0, 1.0, 1.0), "delta"),
    (cal.classical_gaussian_sigma, (1.0, math.nan, 1.0), "delta"),
    (cal.classical_gaussian_sigma, (1.0, 1e-5, 0.0), "sensitivity"),
    (cal.classical_gaussian_sigma, (1.0, 1e-5, -2.0), "sensitivity"),
    (cal.classical_gaussian_sigma, (1.0, 1e-5, math.nan), "sensitivity"),
    (cal.analytic_gaussian_sigma, (-1.0, 1e-5, 1.0), "epsilon"),
    (cal.analytic_gaussian_sigma, (1.0, -1e-5, 1.0), "delta"),
    (cal.analytic_gaussian_sigma, (1.0, 1e-5, 0.0), "sensitivity"),
    (cal.analytic_gaussian_sigma, (1.0, 1e-5, math.nan), "sensitivity"),
    (cal.exponential_mechanism_scale, (0.0, 1.0), "epsilon"),
    (cal.exponential_mechanism_scale, (math.nan, 1.0), "epsilon"),
    (cal.exponential_mechanism_scale, (1.0, 0.0), "sensitivity"),
    (cal.exponential_mechanism_scale, (1.0, -1.0), "sensitivity"),
    (cal.gaussian_sigma, (1.0, 1e-5, 1.0, "optimal"), "calibration"),
]


@pytest.mark.parametrize("fn,args,name", BAD_CALLS, ids=lambda x: getattr(x, "__name__", None))
def test_bad_inputs_raise_value_error_naming_argument(fn, args, name):
    """Invalid inputs raise ValueError whose message names the offending argument."""
    with pytest.raises(ValueError, match=name):
        fn(*args)


# --------------------------------------------------------------------------- float32 and float64 limits


def test_float32_noise_parameter_accepts_exactly_the_normal_float32_range():
    f32 = np.finfo(np.float32)
    for ok in (float(f32.tiny), 1.0, float(f32.max)):
        assert cal.float32_noise_parameter("sigma", ok, epsilon=1.0, sensitivity=1.0) == ok
        assert np.float32(ok) == ok and np.isfinite(np.float32(ok))
    for bad, side in ((float(np.nextafter(f32.tiny, 0, dtype=np.float32)), "below"),
                      (float(f32.max) * (1 + 1e-7), "beyond"), (1e-50, "below")):
        with pytest.raises(ValueError, match=f"epsilon 2 \\(sensitivity 3, delta 0.1\\) gives sigma = .*, {side}"):
            cal.float32_noise_parameter("sigma", bad, epsilon=2.0, sensitivity=3.0, delta=0.1)
    with np.errstate(over="ignore"):  # what it prevents: 0 and inf
        assert np.float32(1e-50) == 0.0 and np.isinf(np.float32(float(f32.max) * (1 + 1e-7)))


def test_gdp_mu_refuses_a_root_lost_to_cancellation():
    """At eps = 1e-10, delta = 1e-300 the profile cancels ~249 bits: Brent's root there is noise (the 50-digit
    delta at it is off by orders of magnitude), and it is refused; up to 29 bits the root keeps float32's 24."""
    from scipy import optimize

    eps, delta = 1e-10, 1e-300
    log_target = math.log(delta)
    def f(m):
        return cal._log_gdp_delta(eps, m) - log_target

    lo = 0.5  # gdp_mu's search without its check
    while f(lo) > 0.0:
        lo /= 2.0
    garbage = optimize.brentq(f, lo, 2 * lo, xtol=1e-15, rtol=4 * np.finfo(float).eps, maxiter=500)
    assert abs(mp.log(delta_mp(eps, garbage)) - mp.log(delta)) > 10  # the unchecked root is wrong
    with pytest.raises(ArithmeticError, match="cancels 249 of float64's 53 bits"):
        cal.gdp_mu(eps, delta)
    with pytest.raises(ValueError, match=r"epsilon 1e-10 with delta 1e-300 has no analytic Gaussian calibration"):
        cal.analytic_gaussian_sigma(eps, delta, 1.0)
    for eps, delta in ((1e-5, 1e-300), (1e-6, 1e-100), (1e-8, 1e-10)):  # 27 to 29 bits cancelled: accepted, and
        mu = cal.gdp_mu(eps, delta)  # exact to float32's precision 2^-24, the precision sigma is cast to
        assert delta_mp(eps, mu * (1 - 2.0**-24)) < delta < delta_mp(eps, mu * (1 + 2.0**-24)), (eps, delta)


def test_analytic_calibration_range_ends_where_the_solver_does():
    mu = cal.gdp_mu(1e11, 1e-5)
    assert delta_mp(1e11, mu * (1 - 1e-9)) < 1e-5 < delta_mp(1e11, mu * (1 + 1e-9))  # still exact at 1e11
    with pytest.raises(ValueError, match=r"epsilon 1e\+12 .*could not bracket a root below 1000000.0"):
        cal.analytic_gaussian_sigma(1e12, 1e-5, math.sqrt(2))


def test_every_mechanism_refuses_a_noise_parameter_float32_cannot_hold():
    from snapaudit_jax.mechanisms import EmbeddingSpaceAggregation, KeywordSpaceAggregation, PrivateVoting
    from snapaudit_jax.mechanisms import ProductOfExperts

    tiny = float(np.finfo(np.float32).tiny)
    assert float(ProductOfExperts.calibrated(tiny, 0.5).scale) == tiny  # scale = eps / (2 * 0.5) = eps: the edge
    with pytest.raises(ValueError, match="gives scale = .*, below float32's smallest normal"):
        ProductOfExperts.calibrated(tiny / 2, 0.5)
    with pytest.raises(ValueError, match=r"epsilon 1e\+300 \(sensitivity 2\) gives scale = 2.5e\+299, beyond"):
        KeywordSpaceAggregation.calibrated(1e300, 4)
    with pytest.raises(ValueError, match=r"epsilon 1e\+50 \(sensitivity 1.41421, delta 1e-05\) gives sigma"):
        PrivateVoting.calibrated(1e50, 1e-5, calibration="classical")
    with pytest.raises(ValueError, match=r"epsilon 1 \(sensitivity 1e-50, delta 1e-05\) gives sigma"):
        EmbeddingSpaceAggregation.calibrated(1.0, 1e-5, np.eye(2), sensitivity=1e-50)
    with pytest.raises(ValueError, match="candidates must be within float32's range"):
        EmbeddingSpaceAggregation.calibrated(1.0, 1e-5, [[1e39, 0.0], [0.0, 1.0]])
    assert float(PrivateVoting.calibrated(16.0, 1e-5).sigma) > 0  # the ordinary claims pass
