"""Noise calibration with a relative margin (``calibrate``, coarse-to-fine) and ``plan_epsilons``.

Oracle: dp_accounting's accountants built here directly on the event
``SelfComposed(PoissonSampled(q, Gaussian(sigma)), T)`` under add/remove-one adjacency. For speed the grid uses
the PLD value discretisation interval ``1e-3 * target`` (1e-3 at epsilon 1, 8e-3 at epsilon 8: a tenth of the
1% window) in the calibration and in the oracle alike, so every inequality below compares the same deterministic
accountant number: no tolerance is needed, and none is used.
"""

from __future__ import annotations

import dp_accounting
import pytest
from dp_accounting.pld import PLDAccountant
from dp_accounting.rdp import RdpAccountant

from snapaudit_jax.dpsgd import accounting
from snapaudit_jax.dpsgd.accounting import (
    AccountantEpsilons,
    Calibration,
    calibrate,
    plan_epsilons,
)
from snapaudit_jax.utils.errors import InputError

DELTA = 1e-5
DISC = 1e-3  # PLD value discretisation interval outside the grid (calibration and oracle)
MARGIN = 0.01


def oracle(sigma, q, steps, accountant, delta=DELTA, disc=DISC):
    """epsilon by dp_accounting directly."""
    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps)
    relation = dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
    if accountant == "pld":
        acc = PLDAccountant(relation, value_discretization_interval=disc)
    else:
        acc = RdpAccountant(neighboring_relation=relation)
    return acc.compose(event).get_epsilon(delta)


def within_margin(eps, target, margin=MARGIN):
    """The claim calibrate makes: epsilon in [(1 - margin) target, target]."""
    return (1.0 - margin) * target <= eps <= target


GRID = [(acc, q, steps, target) for acc in ("pld", "rdp") for q in (0.01, 0.1) for steps in (10, 100)
        for target in (1.0, 8.0)]


@pytest.mark.parametrize("accountant,q,steps,target", GRID)
def test_calibrated_sigma_lands_within_one_percent_below_the_target(accountant, q, steps, target):
    """epsilon(sigma) in [0.99 target, target] by dp_accounting directly; power: sigma 2% lower exceeds the
    target, and an overshooting calibration (sigma * 1.05) fails the 1% check."""
    disc = DISC * target
    cal = calibrate(target, DELTA, q, steps, accountant=accountant, pld_discretization=disc)
    assert isinstance(cal, Calibration) and cal.accountant == accountant and cal.target_epsilon == target
    assert not cal.floor_hit  # every grid point needs sigma > 0.3
    sigma = cal.noise_multiplier
    eps = oracle(sigma, q, steps, accountant, disc=disc)
    assert within_margin(eps, target), (sigma, eps)
    assert cal.epsilon == eps and cal.margin == pytest.approx((target - eps) / target, rel=1e-12, abs=1e-15)
    assert 0.0 <= cal.margin <= MARGIN
    other = "rdp" if accountant == "pld" else "pld"
    assert cal.epsilon_other == oracle(sigma, q, steps, other, disc=disc)
    # power: the check rejects a sigma 2% too small (above the target) and one 5% too large (> 1% below it)
    assert oracle(0.98 * sigma, q, steps, accountant, disc=disc) > target
    assert not within_margin(oracle(1.05 * sigma, q, steps, accountant, disc=disc), target)


@pytest.mark.parametrize("target,q,steps", [pytest.param(8.0, 0.024, 30, marks=pytest.mark.slow), (1.0, 0.1, 100),
                                             (3.0, 0.05, 2000)])
def test_the_requested_accountant_decides_and_is_evaluated_at_most_twice(monkeypatch, target, q, steps):
    """At the default interval 1e-4 the coarser PLD accountants (1e-2, 1e-3) find the window and the requested one
    is evaluated once or twice; the result is in the window by dp_accounting at 1e-4. Power: coarse levels off by
    5% (either way) cost more evaluations of the requested accountant but never a sigma outside the window."""
    for bias in (1.0, 1.05, 0.95):
        accounting._epsilon.cache_clear()
        original, fine = accounting._epsilon, []

        def counted(sigma, q_, steps_, delta, acc, disc, bias=bias, original=original, fine=fine):
            if disc == 1e-4:
                fine.append(sigma)
                return original(sigma, q_, steps_, delta, acc, disc)
            return bias * original(sigma, q_, steps_, delta, acc, disc)

        monkeypatch.setattr(accounting, "_epsilon", counted)
        cal = calibrate(target, DELTA, q, steps)
        monkeypatch.undo()
        eps = oracle(cal.noise_multiplier, q, steps, "pld", disc=1e-4)
        assert within_margin(eps, target) and cal.epsilon == eps, (bias, cal)
        assert len(set(fine)) <= (2 if bias == 1.0 else 6), (bias, fine)
    assert accounting.pld_ladder(1e-4) == (1e-2, 1e-3, 1e-4)
    assert accounting.pld_ladder(1e-3) == (1e-2, 1e-3) and accounting.pld_ladder(5e-3) == (5e-3,)


def test_a_tighter_max_margin_is_met():
    cal = calibrate(1.0, DELTA, 0.1, 100, max_margin=1e-7, pld_discretization=DISC)
    eps = oracle(cal.noise_multiplier, 0.1, 100, "pld")
    assert within_margin(eps, 1.0, margin=1e-7) and cal.margin <= 1e-7


def test_the_search_floor_is_reported_when_it_already_meets_the_target():
    cal = calibrate(8.0, DELTA, 1e-4, 1, pld_discretization=1e-2)
    assert cal.floor_hit and cal.noise_multiplier == 0.3
    assert cal.epsilon == oracle(0.3, 1e-4, 1, "pld", disc=1e-2) <= 8.0
    assert cal.margin > MARGIN  # the margin cannot hold there, and the result says why


def test_an_unreachable_target_names_target_epsilon():
    with pytest.raises(InputError, match=r"target_epsilon=1e-06 is unreachable"):
        calibrate(1e-6, 1e-9, 0.1, 100, pld_discretization=DISC)


@pytest.mark.parametrize("kwargs,match", [
    (dict(max_margin=0.0), r"max_margin must be in \(0, 1\), got 0.0"),
    (dict(max_margin=1.0), r"max_margin must be in \(0, 1\), got 1.0"),
    (dict(accountant="gdp"), r"accountant must be one of"),
    (dict(pld_discretization=0.0), r"pld_discretization"),
])
def test_bad_arguments_are_named(kwargs, match):
    with pytest.raises(InputError, match=match):
        calibrate(1.0, DELTA, 0.1, 10, **kwargs)


def test_an_accountant_that_jumps_over_the_window_is_reported_not_returned(monkeypatch):
    """A step-shaped epsilon (2 below sigma = 1.5, 0.5 above) has no sigma in [0.99, 1]: InputError naming
    max_margin once the bracket has closed on the step, never a sigma outside the window."""
    calls = []
    monkeypatch.setattr(accounting, "_epsilon", lambda sigma, *a: calls.append(sigma) or (2.0 if sigma < 1.5 else 0.5))
    with pytest.raises(InputError, match=r"max_margin=0.01 is unattainable with the pld accountant"):
        accounting.calibrate(1.0, DELTA, 0.1, 10)
    assert len(calls) < 250  # the bracket halves at least every four evaluations: about 4 x 40 to close on 1e-12


def test_plan_epsilons_gives_both_accountants():
    out = plan_epsilons(1.0, 0.01, 100, DELTA, pld_discretization=DISC)
    assert isinstance(out, AccountantEpsilons)
    assert out.rdp == oracle(1.0, 0.01, 100, "rdp") and out.pld == oracle(1.0, 0.01, 100, "pld")
    assert out.epsilon == min(out.rdp, out.pld) == out.pld


def test_a_repeated_calibration_runs_no_search_and_returns_the_same_sigma(monkeypatch):
    """A plan, its run and a resumed run calibrate the same numbers: the second call is answered from memory
    (no accountant evaluated), identically; other numbers evaluate it again."""
    args = dict(target_epsilon=2.0, delta=1e-5, sampling_rate=0.01, steps=50, accountant="rdp")
    first = calibrate(**args)
    monkeypatch.setattr(accounting, "_make_accountant", lambda *a: pytest.fail("accountant evaluated again"))
    assert calibrate(**args) == first
    with pytest.raises(pytest.fail.Exception, match="accountant evaluated again"):
        calibrate(**{**args, "steps": 51})


@pytest.mark.parametrize("shift", [1.0, 1.3, 0.7])
def test_the_coarse_pass_only_says_where_to_look(shift):
    """A fine PLD calibration brackets the root around the coarse accountant's answer, every end checked with
    the fine one: with the fine epsilon shifted 30% either way from the coarse one (a coarse guess far off), the
    bracket still holds the fine root, eps(lo) > target >= eps(hi)."""
    q, steps, delta, target = 0.1, 3, 1e-3, 4.0

    def fine(sigma):  # a "fine" interval of 1e-3 (below the coarse 1e-2), ten times cheaper than 1e-4
        return accounting._epsilon(sigma * shift, q, steps, delta, "pld", 1e-3)

    lo, hi = accounting._narrow_bracket(target, q, steps, delta, "pld", 1e-4, 1e-3, fine)
    assert fine(lo) > target >= fine(hi) and lo < hi
    if shift == 1.0:  # the coarse answer is close: one step of 2% either side
        assert hi / lo <= 1.02**2 + 1e-12
    assert accounting._narrow_bracket(target, q, steps, delta, "rdp", 1e-4, 1e-3, fine) is None
    assert accounting._narrow_bracket(target, q, steps, delta, "pld", 1e-4, 1e-2, fine) is None
