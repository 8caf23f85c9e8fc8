"""Privacy accounting of DP-SGD with Poisson sampling, noise calibration and the DP report.

All accounting is delegated to Google's ``dp_accounting``: the ``T`` steps of DP-SGD are the
event ``SelfComposed(PoissonSampled(q, Gaussian(sigma)), T)`` under add/remove-one adjacency,
evaluated by its ``RdpAccountant`` (default orders) and its ``PLDAccountant`` (pessimistic
discretisation). :func:`calibrate_noise_multiplier` is ``dp_accounting.calibrate_dp_mechanism`` (Brent's method
with a guaranteed non-positive epsilon gap) on a bracket found here; :func:`calibrate` solves for a relative
window below the target with coarse-to-fine accountants (:func:`search_window`). Host-side float64 Python; runs once
per training run, never per step.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib.metadata
import logging
import math
from typing import Any, NamedTuple

import dp_accounting
from dp_accounting.pld import PLDAccountant
from dp_accounting.rdp import RdpAccountant
from dp_accounting.rdp.rdp_privacy_accountant import DEFAULT_RDP_ORDERS as _ORDERS

from snapaudit_jax.dpsgd.config import ACCOUNTANTS
from snapaudit_jax.dpsgd.noise import SAMPLER, sampler_delta
from snapaudit_jax.utils import validate
from snapaudit_jax.utils.errors import InputError
from snapaudit_jax.utils.io import dumps, to_json

__all__ = [
    "DPReport",
    "dpsgd_event",
    "compute_epsilon",
    "calibrate_noise_multiplier",
    "Calibration",
    "calibrate",
    "search_window",
    "pld_ladder",
    "AccountantEpsilons",
    "plan_epsilons",
    "PROTECTED_UNIT",
    "ADJACENCY",
]

PROTECTED_UNIT = "one training sequence: one row (tokens[i], mask[i]) of the dataset"
UNIT_GROUP = "one unit: the rows tokens[i] of the (N, k, L) dataset, sampled, summed and clipped together"
ADJACENCY = "add/remove one record"
NOT_COVERED = (
    "per-step metrics in the training history (losses, gradient norms, clipped fractions, realised batch "
    "sizes) are computed from the private data without noise and are not covered by (epsilon, delta)",
    "hyper-parameter choices tuned on the private data, and any other release from it, are not accounted",
    "a person contributing several sequences is protected only to the group-privacy bound",
)
# Calibration searches sigma in [_SIGMA_MIN, _SIGMA_MAX]: below ~0.3 the PLD accountant is very slow
# and the epsilons are in the hundreds; above 1e4 both accountants are at their resolution floor.
_SIGMA_MIN = 0.3
_SIGMA_MAX = 1e4
# A PLD calibration at a fine value interval first finds the root with this coarse one, then brackets it within
# _NARROW (relative) on each side with the fine accountant.
_COARSE_PLD = 1e-2
_NARROW = 0.02


class _DroppedOrderFilter(logging.Filter):
    """Drops dp_accounting's per-call warning that an RDP order did not converge and was excluded."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Excluding this order from the epsilon computation" not in record.getMessage()


@contextlib.contextmanager
def _quiet_dropped_orders():
    # Excluding an order only makes the RDP bound looser (the minimum is over fewer orders), never invalid.
    logger, flt = logging.getLogger("absl"), _DroppedOrderFilter()
    logger.addFilter(flt)
    try:
        yield
    finally:
        logger.removeFilter(flt)


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - both are dependencies
        return "unknown"


def dpsgd_event(noise_multiplier: float, sampling_rate: float, steps: int) -> dp_accounting.DpEvent:
    """The ``dp_accounting`` event of ``steps`` Poisson-sampled Gaussian DP-SGD steps.

    Args:
      noise_multiplier: ``sigma > 0`` (noise std over the L2 sensitivity ``C`` of the clipped sum).
      sampling_rate: Poisson inclusion probability ``q`` in ``(0, 1]``.
      steps: number of steps ``T >= 1``.

    Returns:
      ``SelfComposedDpEvent(PoissonSampledDpEvent(q, GaussianDpEvent(sigma)), T)``.

    References:
      Abadi et al. 2016, "Deep learning with differential privacy", Alg. 1; Mironov, Talwar & Zhang
      2019, "Renyi differential privacy of the sampled Gaussian mechanism".
    """
    gaussian = dp_accounting.GaussianDpEvent(noise_multiplier)
    return dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(sampling_rate, gaussian), steps)


def _check(noise_multiplier, sampling_rate, steps, delta, accountant, pld_discretization):
    sigma = validate.nonnegative_float("noise_multiplier", noise_multiplier)
    q = validate._as_float("sampling_rate", sampling_rate)
    if not 0.0 < q <= 1.0:
        raise InputError(f"sampling_rate must be in (0, 1], got {sampling_rate!r}")
    steps = validate.positive_int("steps", steps)
    delta = validate.open_unit("delta", delta)
    accountant = validate.choice("accountant", accountant, ACCOUNTANTS)
    pld_discretization = validate.positive_float("pld_discretization", pld_discretization)
    return sigma, q, steps, delta, accountant, pld_discretization


def _make_accountant(accountant: str, pld_discretization: float):
    add_remove = dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
    if accountant == "rdp":
        return RdpAccountant(neighboring_relation=add_remove)
    return PLDAccountant(neighboring_relation=add_remove, value_discretization_interval=pld_discretization)


def compute_epsilon(
    *,
    noise_multiplier: float,
    sampling_rate: float,
    steps: int,
    delta: float,
    accountant: str = "rdp",
    pld_discretization: float = 1e-4,
) -> float:
    """``epsilon`` at ``delta`` of ``steps`` DP-SGD steps (Poisson sampling, add/remove adjacency).

    Args:
      noise_multiplier: ``sigma >= 0`` (noise std over the clipping norm ``C``); ``0`` gives ``inf``.
      sampling_rate: Poisson rate ``q`` in ``(0, 1]``.
      steps: ``T >= 1``.
      delta: in ``(0, 1)``.
      accountant: ``"rdp"`` (dp_accounting ``RdpAccountant``, default orders 1.1 ... 1024) or ``"pld"``
        (``PLDAccountant``, pessimistic, ``pld_discretization``).
      pld_discretization: value discretisation interval of the PLD accountant.

    Returns:
      The accountant's ``epsilon`` (an upper bound for the mechanism of :func:`dpsgd_event`).

    Raises:
      InputError: an argument out of range or an unknown accountant.

    Guarantees:
      Both accountants return upper bounds on the optimal ``epsilon`` of the Poisson-subsampled Gaussian
      mechanism composed ``T`` times under add/remove-one adjacency (RDP: by the RDP-to-DP conversion, loose;
      PLD: by pessimistic discretisation, tight up to the interval). dp_accounting's warnings that it dropped
      an RDP order it could not evaluate (small ``sigma``, orders near 1) are silenced: dropping orders only
      loosens the RDP bound.
    """
    sigma, q, steps, delta, accountant, disc = _check(
        noise_multiplier, sampling_rate, steps, delta, accountant, pld_discretization
    )
    if sigma == 0.0:
        return math.inf
    return _epsilon(sigma, q, steps, delta, accountant, disc)


@functools.lru_cache(maxsize=4096)
def _epsilon(sigma: float, q: float, steps: int, delta: float, accountant: str, disc: float) -> float:
    # A pure function of validated numbers, memoised: calibrations, plans, reports and resumed runs ask for the
    # same epsilon again, and one PLD evaluation at a small sigma costs seconds.
    acc = _make_accountant(accountant, disc)
    with _quiet_dropped_orders():
        return float(acc.compose(dpsgd_event(sigma, q, steps)).get_epsilon(delta))


def calibrate_noise_multiplier(
    *,
    target_epsilon: float,
    delta: float,
    sampling_rate: float,
    steps: int,
    accountant: str = "rdp",
    tol: float = 1e-4,
    pld_discretization: float = 1e-4,
) -> float:
    """The smallest ``sigma`` (within ``tol``) whose ``epsilon`` at ``delta`` is ``<= target_epsilon``.

    Brackets the root in ``[0.3, 1e4]``: for PLD at an interval below 1e-2, around the root of a coarse PLD
    accountant (interval 1e-2, much cheaper), every bracket end checked with the fine one; otherwise by
    doubling/halving from ``sigma = 1``. Then runs ``dp_accounting.calibrate_dp_mechanism`` (Brent's method) on
    the bracket. Memoised on the validated arguments: the same calibration again runs no search. The mechanism
    is that of :func:`dpsgd_event`: ``steps`` Poisson-sampled Gaussian steps at rate ``q``, add/remove-one
    adjacency.

    Args:
      target_epsilon: ``> 0``.
      delta: in ``(0, 1)``.
      sampling_rate: ``q`` in ``(0, 1]``.
      steps: ``T >= 1``.
      accountant: ``"rdp"`` or ``"pld"`` (see :func:`compute_epsilon`).
      tol: absolute tolerance on ``sigma``.
      pld_discretization: PLD value discretisation interval.

    Returns:
      ``sigma`` with ``epsilon(sigma) <= target_epsilon`` and ``|sigma - sigma*| <= tol`` for the exact root
      ``sigma*``; hence ``epsilon(sigma - 2 tol) > target_epsilon``. If the target is met already at
      ``sigma = 0.3`` (the search floor), ``0.3`` is returned (its epsilon is below the target).

    Raises:
      InputError: invalid arguments, or ``target_epsilon`` unreachable: even
        ``sigma = 1e4`` gives a larger ``epsilon`` (the accountant's resolution floor for this ``delta``).
      ArithmeticError: the calibrated ``sigma`` fails the final ``epsilon <= target_epsilon`` check (a bug in
        the calibration; dp_accounting guarantees it does not happen).
    """
    target = validate.positive_float("target_epsilon", target_epsilon)
    _, q, steps, delta, accountant, disc = _check(1.0, sampling_rate, steps, delta, accountant, pld_discretization)
    tol = validate.positive_float("tol", tol)
    return _calibrated_sigma(target, q, steps, delta, accountant, tol, disc)


@functools.lru_cache(maxsize=256)
def _calibrated_sigma(target: float, q: float, steps: int, delta: float, accountant: str, tol: float,
                      disc: float) -> float:
    # A pure function of validated numbers, memoised like _epsilon: a PLD calibration runs a Brent search of
    # dozens of accountant evaluations (seconds to tens of seconds), and a plan, its run, a resumed run and the
    # candidates of a sweep ask for the same one again.
    def eps(sigma: float) -> float:
        return _epsilon(sigma, q, steps, delta, accountant, disc)

    lo, hi = (_narrow_bracket(target, q, steps, delta, accountant, tol, disc, eps)
              or _wide_bracket(target, q, steps, delta, accountant, eps))
    if lo == hi:  # the search floor meets the target
        return hi
    with _quiet_dropped_orders():
        sigma = dp_accounting.calibrate_dp_mechanism(
            lambda: _make_accountant(accountant, disc),
            lambda s: dpsgd_event(s, q, steps),
            target,
            delta,
            bracket_interval=dp_accounting.ExplicitBracketInterval(lo, hi),
            tol=tol,
        )
    sigma = float(sigma)
    if eps(sigma) > target:  # calibrate_dp_mechanism guarantees this; keep the claim checked
        raise ArithmeticError(f"calibration returned noise_multiplier={sigma} with epsilon above {target}")
    return sigma


def _narrow_bracket(target, q, steps, delta, accountant, tol, disc, eps) -> tuple[float, float] | None:
    """``(lo, hi)`` with ``eps(lo) > target >= eps(hi)``, a few percent apart, found around the root of a coarse
    PLD accountant (value interval :data:`_COARSE_PLD`: one evaluation costs about 1/50 of one at 1e-4), so that
    the fine accountant's Brent search starts close; ``(s, s)`` if the floor ``s`` meets the target; ``None``
    (search the wide bracket) for RDP, a coarse interval already, or a coarse calibration that fails. Every
    bracket end is checked with the fine accountant: the coarse one only says where to look."""
    if accountant != "pld" or disc >= _COARSE_PLD:
        return None
    try:
        guess = _calibrated_sigma(target, q, steps, delta, accountant, tol, _COARSE_PLD)
    except (InputError, ArithmeticError):
        return None
    hi, step = guess, _NARROW
    while eps(hi) > target:  # the coarse accountant is the more pessimistic one, so this rarely loops
        if hi >= _SIGMA_MAX:
            return None
        hi, step = min(hi * (1.0 + step), _SIGMA_MAX), 2.0 * step  # steps double: a far guess costs log steps
    lo, step = hi, _NARROW
    while True:
        lo = max(lo / (1.0 + step), _SIGMA_MIN)
        if eps(lo) > target:
            return lo, hi
        if lo <= _SIGMA_MIN:
            return _SIGMA_MIN, _SIGMA_MIN
        hi, step = lo, 2.0 * step


def _wide_bracket(target, q, steps, delta, accountant, eps) -> tuple[float, float]:
    """``(lo, hi)`` with ``eps(lo) > target >= eps(hi)``, by doubling or halving from ``sigma = 1``; ``(s, s)``
    if the floor ``s`` meets the target."""
    lo, hi = 1.0, 1.0
    if eps(hi) > target:
        while True:
            lo, hi = hi, min(hi * 2.0, _SIGMA_MAX)
            at_hi = eps(hi)
            if at_hi <= target:
                break
            if hi >= _SIGMA_MAX:
                raise InputError(
                    f"target_epsilon={target!r} is unreachable with the {accountant} accountant: epsilon is "
                    f"{at_hi:.6g} even at noise_multiplier={_SIGMA_MAX:g} (delta={delta!r}, sampling_rate={q!r}, "
                    f"steps={steps})"
                )
    else:
        while True:
            hi, lo = lo, lo / 2.0
            if lo < _SIGMA_MIN:
                if eps(_SIGMA_MIN) <= target:
                    return _SIGMA_MIN, _SIGMA_MIN
                lo = _SIGMA_MIN
                break
            if eps(lo) > target:
                break
    return lo, hi


class Calibration(NamedTuple):
    """The result of :func:`calibrate`: a noise multiplier and what both accountants say of it.

    Attributes:
      noise_multiplier: the calibrated ``sigma``.
      accountant: the accountant ``sigma`` was calibrated with (``"pld"`` or ``"rdp"``).
      target_epsilon: the target.
      epsilon: ``epsilon(sigma)`` at ``delta`` by ``accountant`` (``<= target_epsilon``).
      epsilon_other: ``epsilon(sigma)`` by the other accountant (RDP beside PLD, PLD beside RDP); for RDP
        calibrations it is the tighter bound and for PLD ones the looser.
      margin: ``(target_epsilon - epsilon) / target_epsilon``, in ``[0, max_margin]`` unless ``floor_hit``.
      floor_hit: the search floor ``sigma = 0.3`` already meets the target; ``noise_multiplier`` is then ``0.3``
        and ``margin`` may exceed ``max_margin`` (a smaller ``sigma`` would be needed to use the whole budget).
    """

    noise_multiplier: float
    accountant: str
    target_epsilon: float
    epsilon: float
    epsilon_other: float
    margin: float
    floor_hit: bool


def calibrate(
    target_epsilon: float,
    delta: float,
    sampling_rate: float,
    steps: int,
    *,
    accountant: str = "pld",
    max_margin: float = 0.01,
    pld_discretization: float = 1e-4,
) -> Calibration:
    """The noise multiplier whose ``epsilon`` lies within ``max_margin`` (relative) below ``target_epsilon``.

    Solves ``(1 - max_margin) target <= epsilon(sigma) <= target`` by :func:`search_window`: for PLD at a fine
    value interval, first with coarser PLD accountants (intervals 1e-2 and 1e-3, which give the same ``epsilon``
    to a few parts in ten thousand at a tenth and a hundredth of the cost), each aiming at the middle of the
    window from where the coarser one stopped, so that the requested accountant is evaluated once or twice;
    RDP directly. The mechanism is that of :func:`dpsgd_event`.

    Args:
      target_epsilon: ``> 0``.
      delta: in ``(0, 1)``.
      sampling_rate: ``q`` in ``(0, 1]``.
      steps: ``T >= 1``.
      accountant: ``"pld"`` (default; dp_accounting's ``PLDAccountant``, pessimistic) or ``"rdp"``.
      max_margin: the largest allowed ``(target - epsilon) / target``, in ``(0, 1)``.
      pld_discretization: PLD value discretisation interval (also for ``epsilon_other`` when it is PLD).

    Returns:
      A :class:`Calibration`.

    Raises:
      InputError: an invalid argument; ``target_epsilon`` unreachable (even ``sigma = 1e4`` gives a larger
        ``epsilon``); or ``max_margin`` unattainable because the accountant's ``epsilon`` jumps over the whole
        window ``[(1 - max_margin) target, target]`` (PLD discretisation coarser than the window: use a smaller
        ``pld_discretization`` or a larger ``max_margin``).

    Guarantees:
      ``epsilon <= target_epsilon`` always (the requested accountant's number at the returned ``sigma``, an
      upper bound on the true epsilon of the mechanism; the coarser accountants only say where to look);
      ``epsilon >= (1 - max_margin) target_epsilon`` unless ``floor_hit``. Both are statements about the
      accountant's number at the given settings, not about the (smaller, unknown) exact epsilon.

    References:
      Dowell & Jarratt 1971, "A modified regula falsi method for computing the root of an equation" (the
      Illinois method); Koskela, Jalko & Honkela 2020 (PLD accounting).
    """
    target = validate.positive_float("target_epsilon", target_epsilon)
    _, q, steps, delta, accountant, disc = _check(1.0, sampling_rate, steps, delta, accountant, pld_discretization)
    max_margin = validate._as_float("max_margin", max_margin)
    if not 0.0 < max_margin < 1.0:
        raise InputError(f"max_margin must be in (0, 1), got {max_margin!r}")

    def level(interval: float):
        return lambda sigma: _epsilon(sigma, q, steps, delta, accountant, interval)

    ladder = pld_ladder(disc) if accountant == "pld" else (disc,)
    try:
        sigma, eps = search_window([level(d) for d in ladder], target, (1.0 - max_margin) * target)
    except _Unreachable as err:
        raise InputError(
            f"target_epsilon={target!r} is unreachable with the {accountant} accountant: epsilon is "
            f"{err.epsilon:.6g} even at noise_multiplier={_SIGMA_MAX:g} (delta={delta!r}, sampling_rate={q!r}, "
            f"steps={steps})"
        ) from None
    except _JumpsOverWindow as err:
        raise InputError(
            f"max_margin={max_margin!r} is unattainable with the {accountant} accountant: its epsilon jumps from "
            f"{err.above:.6g} (> target_epsilon={target!r}) at noise_multiplier={err.low!r} to {err.below:.6g} at "
            f"{err.high!r}; use a smaller pld_discretization (now {disc!r}) or a larger max_margin"
        ) from None
    if eps > target:  # search_window guarantees this; keep the claim checked
        raise ArithmeticError(f"calibration returned noise_multiplier={sigma} with epsilon {eps} above {target}")
    other = "rdp" if accountant == "pld" else "pld"
    at_other = compute_epsilon(
        noise_multiplier=sigma, sampling_rate=q, steps=steps, delta=delta, accountant=other, pld_discretization=disc
    )
    return Calibration(
        noise_multiplier=float(sigma),
        accountant=accountant,
        target_epsilon=target,
        epsilon=float(eps),
        epsilon_other=float(at_other),
        margin=(target - eps) / target,
        floor_hit=bool(sigma <= _SIGMA_MIN),
    )


def pld_ladder(interval: float) -> tuple[float, ...]:
    """The PLD value intervals a calibration at ``interval`` evaluates, coarsest first: 1e-2 and 1e-3 where at
    least five times ``interval``, then ``interval``. One PLD evaluation costs about inversely to its interval
    (dp_accounting builds the loss distribution point by point), and the ``epsilon`` of the coarser ones is
    within about 4e-2 (1e-2) and 4e-4 (1e-3) relative of the finest one's (measured from ``sigma`` 0.35 to 2,
    ``q`` 0.024 to 0.5, 20 to 1,000 steps).

    Args:
      interval: the PLD value discretisation interval the result is stated at, ``> 0``.

    Returns:
      The intervals, decreasing, ending with ``interval``.
    """
    return tuple(d for d in (1e-2, 1e-3) if d >= 5.0 * interval) + (interval,)


class _Unreachable(Exception):
    def __init__(self, epsilon: float):
        super().__init__(epsilon)
        self.epsilon = epsilon


class _JumpsOverWindow(Exception):
    def __init__(self, low: float, above: float, high: float, below: float):
        super().__init__(low, above, high, below)
        self.low, self.above, self.high, self.below = low, above, high, below


def search_window(levels, target: float, window_low: float, *, floor: float = _SIGMA_MIN,
                  ceiling: float = _SIGMA_MAX) -> tuple[float, float]:
    """``sigma`` in ``[floor, ceiling]`` with ``window_low <= levels[-1](sigma) <= target``, and that epsilon.

    Every level is an ``epsilon(sigma)``, decreasing in ``sigma``, and each approximates the next. The levels
    before the last are solved for the middle half (in ``log epsilon``) of the window, each starting from where
    the one before stopped with its last secant slope; the last level is solved for the window itself. Each
    solve steps from its start along the secant of ``log epsilon`` against ``log sigma`` (slope -2 at first)
    until the root is bracketed, then runs the Illinois variant of false position inside the bracket.

    Args:
      levels: callables ``sigma -> epsilon``, coarsest first; the last is the one the result is stated with.
      target: the window's upper end, ``> 0``.
      window_low: its lower end, in ``(0, target)``.
      floor: the smallest ``sigma`` searched.
      ceiling: the largest ``sigma`` searched.

    Returns:
      ``(sigma, epsilon)`` with ``epsilon = levels[-1](sigma) <= target``: in the window, or ``sigma = floor``
      where the floor already meets the target (below the window).

    Raises:
      _Unreachable: ``levels[-1](ceiling) > target``.
      _JumpsOverWindow: the last level has no ``sigma`` in the window (it jumps from above ``target`` to below
        ``window_low`` between two values of ``sigma`` a relative 1e-12 apart).
    """
    sigma, slope = 1.0, -2.0
    span = math.log(target / window_low)
    for i, eps in enumerate(levels):
        last = i == len(levels) - 1
        if last:
            low, high = window_low, target
        else:
            low, high = target * math.exp(-0.75 * span), target * math.exp(-0.25 * span)
        sigma, slope, value = _solve_level(eps, low, high, sigma, slope, floor, ceiling, last)
    return sigma, value


def _solve_level(eps, low: float, high: float, start: float, slope: float, floor: float, ceiling: float,
                 last: bool) -> tuple[float, float, float]:
    """One level of :func:`search_window`: ``(sigma, slope, eps(sigma))`` with ``low <= eps(sigma) <= high``, or
    the floor meeting ``high``; for a level before the last, the best point reached where that fails."""
    aim = 0.5 * (math.log(low) + math.log(high))
    u_floor, u_ceiling = math.log(floor), math.log(ceiling)

    def at(u: float) -> tuple[float, float]:
        value = eps(math.exp(u))
        return value, (math.log(value) if value > 0.0 else -math.inf) - aim

    u = min(max(math.log(start), u_floor), u_ceiling)
    value, g = at(u)
    above = below = None  # (u, g, value) with g > 0 (epsilon above the window) and g < 0 (below it)
    step = 0.0
    while True:
        if low <= value <= high:
            return math.exp(u), slope, value
        if value > high:
            above = (u, g, value)
            if u >= u_ceiling:
                if last:
                    raise _Unreachable(value)
                return math.exp(u), slope, value
        else:
            below = (u, g, value)
            if u <= u_floor:
                return math.exp(u), slope, value  # the floor meets the target (floor_hit)
        if above is not None and below is not None:
            break
        # Not bracketed yet: a secant step, at least twice the last one, towards the window.
        jump = -g / slope if math.isfinite(g) else (-1.0 if g < 0 else 1.0)
        jump = math.copysign(max(abs(jump), 2.0 * abs(step), 1e-4), jump)
        u_next = min(max(u + jump, u_floor), u_ceiling)
        value_next, g_next = at(u_next)
        if math.isfinite(g) and math.isfinite(g_next) and u_next != u:
            secant = (g_next - g) / (u_next - u)
            if secant < -0.05:
                slope = secant
        step, u, value, g = u_next - u, u_next, value_next, g_next
    # Illinois false position on [above, below] (above[0] < below[0]: epsilon decreases in sigma); every fourth
    # step bisects, so that the bracket at least halves every four evaluations even where epsilon jumps.
    (ua, ga, va), (ub, gb, vb) = above, below
    side, steps = 0, 0
    while ub - ua > 1e-12 * max(1.0, abs(ub)):
        steps += 1
        if steps % 4 == 0 or not (math.isfinite(ga) and math.isfinite(gb)):
            u = 0.5 * (ua + ub)
        else:
            u = ub - gb * (ub - ua) / (gb - ga)
            guard = 1e-3 * (ub - ua)
            u = min(max(u, ua + guard), ub - guard)
        value, g = at(u)
        if low <= value <= high:
            if math.isfinite(ga) and math.isfinite(gb) and ub != ua:
                slope = min((gb - ga) / (ub - ua), -0.05)
            return math.exp(u), slope, value
        if value > high:
            ua, ga, va = u, g, value
            if side == -1:
                gb /= 2.0
            side = -1
        else:
            ub, gb, vb = u, g, value
            if side == 1:
                ga /= 2.0
            side = 1
    if last:
        raise _JumpsOverWindow(math.exp(ua), va, math.exp(ub), vb)
    return math.exp(ub), slope, vb


class AccountantEpsilons(NamedTuple):
    """``epsilon`` of one DP-SGD run by both accountants (:func:`plan_epsilons`).

    Attributes:
      rdp: by dp_accounting's ``RdpAccountant`` (default orders).
      pld: by its ``PLDAccountant`` (pessimistic).
    """

    rdp: float
    pld: float

    @property
    def epsilon(self) -> float:
        """The tighter bound, ``min(rdp, pld)`` (both are valid upper bounds)."""
        return min(self.rdp, self.pld)


def plan_epsilons(
    noise_multiplier: float,
    sampling_rate: float,
    steps: int,
    delta: float,
    *,
    pld_discretization: float = 1e-4,
) -> AccountantEpsilons:
    """Both accountants' ``epsilon`` at ``delta`` for a planned run (:func:`compute_epsilon` twice).

    Args:
      noise_multiplier: ``sigma >= 0`` (``0`` gives ``inf``).
      sampling_rate: ``q`` in ``(0, 1]``.
      steps: ``T >= 1``.
      delta: in ``(0, 1)``.
      pld_discretization: PLD value discretisation interval.

    Returns:
      An :class:`AccountantEpsilons`.

    Raises:
      InputError: an argument out of range.

    Guarantees:
      As :func:`compute_epsilon`: both are upper bounds for the mechanism of :func:`dpsgd_event` under
      add/remove-one adjacency.
    """
    common = dict(noise_multiplier=noise_multiplier, sampling_rate=sampling_rate, steps=steps, delta=delta,
                  pld_discretization=pld_discretization)
    return AccountantEpsilons(rdp=compute_epsilon(**common, accountant="rdp"),
                              pld=compute_epsilon(**common, accountant="pld"))


@dataclasses.dataclass(frozen=True)
class DPReport:
    """What a DP-SGD claim needs (seed 002, "What the accountant must know"), JSON-serialisable.

    Attributes:
      dp: whether the run is differentially private (clipping on, ``noise_multiplier > 0`` and a ``delta``).
      epsilon_rdp: ``epsilon`` at ``delta`` by dp_accounting's RDP accountant (``inf`` if not DP).
      epsilon_pld: the same by its PLD accountant (tighter; ``inf`` if not DP).
      delta: ``delta`` of the guarantee (``None`` for a non-private run without one).
      noise_multiplier: ``sigma``; the Gaussian noise on the clipped sum has std ``sigma * clip_norm``.
      clip_norm: per-record L2 clipping norm ``C`` (``inf``: no clipping).
      sampling: ``"poisson"``: each record independently in each step's batch.
      sampling_rate: the accounted ``q``; the sampler includes a record with probability
        ``floor(q 2^32) / 2^32`` (``sampling_probability``), never more than ``q``.
      sampling_probability: the sampler's exact inclusion probability.
      expected_batch_size: ``q * N``, the (data-independent) normaliser of the noisy sum.
      steps: steps taken and accounted.
      steps_planned: steps of the configuration (more than ``steps`` for a stopped run).
      dataset_size: ``N`` records.
      protected_unit: the unit the guarantee protects (one training sequence, one dataset row).
      adjacency: the neighbouring relation (add/remove one record).
      target_epsilon: the calibration target, or ``None`` if ``noise_multiplier`` was given.
      calibration_accountant: the accountant ``sigma`` was calibrated with, or ``None``.
      accountants: per accountant (``"rdp"``, ``"pld"``): ``implementation``, ``version`` and the settings
        it ran with.
      software: versions of the libraries of the run (jax, flax, optax, jax-privacy, dp-accounting).
      optimizer: the optimizer (post-processing; no privacy effect).
      learning_rate: its step size (no privacy effect).
      microbatch_size: records per clipped-gradient call (no privacy effect).
      tail_microbatch_size: records per call for a batch's remainder after its full microbatches (no privacy
        effect; ``None``: as ``microbatch_size``).
      clipping: how the clipped sum was computed (``DPSGDConfig.clipping`` resolved: ``"per_record"``,
        ``"book_keeping"`` or ``"ghost"``; the same sum to float32 rounding, no privacy effect).
      clipping_reason: why that path (``"auto"``'s choice and what the fast paths did not cover).
      clipped_sum_dtype: the operands of book-keeping's clipped-sum products (``"float32"``, or ``"bfloat16"``:
        each unit's share still within ``clip_norm``, no privacy effect).
      layers: how the decoder's blocks ran (``DPSGDConfig.layers`` resolved: ``"scan"`` or ``"unrolled"``; the
        same function to float32 rounding, no privacy effect).
      layers_reason: why.
      not_covered: releases the guarantee does not cover (the training history, tuning on the private data,
        several sequences of one person beyond group privacy).
      randomness: where the batches and the noise came from (:data:`~snapaudit_jax.dpsgd.keys.RANDOMNESS`): a
        secret key, a user's seed (the guarantee holds only while it stays secret), or the caller's key.
      noise: the Gaussian sampler (:data:`~snapaudit_jax.dpsgd.noise.SAMPLER`).
      noise_coordinates: noise coordinates a step (the trainable parameters; ``0`` if not given).
      sampler_delta: what the sampler's finite tails add to ``delta``
        (:func:`~snapaudit_jax.dpsgd.noise.sampler_delta` at :attr:`epsilon`, ``steps`` and ``noise_coordinates``).

    Guarantees:
      ``epsilon_rdp`` and ``epsilon_pld`` are both upper bounds on the privacy loss of the mechanism
      described (``steps`` Poisson-sampled Gaussian steps at ``sampling_rate`` and ``noise_multiplier``,
      sensitivity ``clip_norm`` under ``adjacency``) at ``delta``; :attr:`epsilon`, the smaller, is one too.
      The run's noise, drawn by ``noise``, makes it ``(epsilon, delta + sampler_delta)``-DP
      (:attr:`delta_total`). They hold only under the assumptions of :func:`~snapaudit_jax.dpsgd.train` and not
      for anything listed in ``not_covered``.
    """

    dp: bool
    epsilon_rdp: float
    epsilon_pld: float
    delta: float | None
    noise_multiplier: float
    clip_norm: float
    sampling: str
    sampling_rate: float
    sampling_probability: float
    expected_batch_size: float
    steps: int
    steps_planned: int
    dataset_size: int
    protected_unit: str
    adjacency: str
    target_epsilon: float | None
    calibration_accountant: str | None
    accountants: dict[str, dict[str, Any]]
    software: dict[str, str]
    optimizer: str
    learning_rate: float
    microbatch_size: int
    not_covered: tuple[str, ...]
    tail_microbatch_size: int | None = None
    clipping: str = "per_record"
    clipping_reason: str = ""
    clipped_sum_dtype: str = "float32"
    layers: str = "unrolled"
    layers_reason: str = ""
    randomness: str = "batches and noise from the caller's key: the guarantee holds only if that key is secret " \
                      "and uniformly random"
    noise: str = SAMPLER
    noise_coordinates: int = 0
    sampler_delta: float = 0.0

    @property
    def delta_total(self) -> float | None:
        """``delta + sampler_delta``: the delta of the run's guarantee (``None`` without a ``delta``)."""
        return None if self.delta is None else self.delta + self.sampler_delta

    @property
    def epsilon(self) -> float:
        """The tighter of the two accountants' bounds, ``min(epsilon_rdp, epsilon_pld)`` (``inf`` if not DP)."""
        return min(self.epsilon_rdp, self.epsilon_pld)

    def to_dict(self) -> dict[str, Any]:
        """A strict-JSON dictionary of every field plus ``epsilon``.

        Returns:
          The fields and ``epsilon``; ``inf`` becomes ``None`` (``dp`` says whether the epsilons are finite),
          tuples become lists.
        """
        out = dataclasses.asdict(self)
        out["epsilon"] = self.epsilon
        out["delta_total"] = self.delta_total
        return to_json(out)

    def to_json(self, **kwargs) -> str:
        """``json.dumps`` of :meth:`to_dict` (strict JSON).

        Args:
          **kwargs: passed to ``json.dumps`` (e.g. ``indent``).

        Returns:
          The JSON text.
        """
        return dumps(self.to_dict(), **kwargs)

    def summary(self) -> str:
        """One human-readable line: the ``(epsilon, delta)`` claim and its parameters, or "NOT differentially private".

        Returns:
          The line.
        """
        if not self.dp:
            return (
                f"NOT differentially private (noise_multiplier={self.noise_multiplier:g}, "
                f"clip_norm={self.clip_norm:g}); {self.steps} steps, Poisson q={self.sampling_rate:.6g}, "
                f"N={self.dataset_size}"
            )
        return (
            f"(epsilon={self.epsilon_pld:.4g} [PLD], {self.epsilon_rdp:.4g} [RDP], delta={self.delta_total:.3g})-DP "
            f"for {self.protected_unit} under {self.adjacency}; Poisson sampling q={self.sampling_rate:.6g} "
            f"(expected batch {self.expected_batch_size:.4g}) of N={self.dataset_size}, {self.steps} steps, "
            f"C={self.clip_norm:g}, sigma={self.noise_multiplier:.6g}"
        )


def make_report(
    *,
    private: bool,
    noise_multiplier: float,
    clip_norm: float,
    sampling_rate: float,
    sampling_probability: float,
    dataset_size: int,
    steps: int,
    steps_planned: int,
    delta: float | None,
    target_epsilon: float | None,
    calibration_accountant: str | None,
    pld_discretization: float,
    optimizer: str,
    learning_rate: float,
    microbatch_size: int,
    tail_microbatch_size: int | None = None,
    clipping: str = "per_record",
    clipping_reason: str = "",
    clipped_sum_dtype: str = "float32",
    layers: str = "unrolled",
    layers_reason: str = "",
    protected_unit: str = PROTECTED_UNIT,
    adjacency: str = ADJACENCY,
    not_covered: tuple[str, ...] = NOT_COVERED,
    randomness: str | None = None,
    noise_coordinates: int = 0,
) -> DPReport:
    """Runs both accountants and assembles a :class:`DPReport`.

    The run is DP when ``private``, ``noise_multiplier > 0``, ``clip_norm`` finite and ``delta`` given; then
    ``epsilon_rdp`` and ``epsilon_pld`` are :func:`compute_epsilon` of ``steps`` steps at ``sampling_rate``
    (``0`` for ``steps = 0``), else both are ``inf``.

    Args:
      private: clipping and noise were on.
      noise_multiplier: ``sigma`` used.
      clip_norm: ``C`` used (``inf`` when non-private).
      sampling_rate: the accounted Poisson rate ``q``.
      sampling_probability: the sampler's exact inclusion probability (:func:`sampling_probability`).
      dataset_size: ``N``.
      steps: steps done (accounted).
      steps_planned: steps of the configuration.
      delta: ``delta`` of the guarantee, or ``None``.
      target_epsilon: calibration target, or ``None``.
      calibration_accountant: accountant of the calibration, or ``None``.
      pld_discretization: PLD value discretisation interval.
      optimizer: optimizer name.
      learning_rate: step size.
      microbatch_size: records per clipped-gradient call.
      tail_microbatch_size: records per call for a batch's remainder (``None``: as ``microbatch_size``).
      clipping: the clipping path (``"per_record"``, ``"book_keeping"``, ``"ghost"``).
      clipping_reason: why that path.
      clipped_sum_dtype: the operands of book-keeping's clipped-sum products.
      layers: how the decoder's blocks ran (``"scan"`` or ``"unrolled"``).
      layers_reason: why.
      protected_unit: the unit the guarantee protects (default: one dataset row).
      adjacency: the neighbouring relation (default: add/remove one record).
      not_covered: the releases the guarantee does not cover.
      randomness: where the batches and noise came from (default: the caller's key).
      noise_coordinates: noise coordinates a step (the trainable parameters), for ``sampler_delta``.

    Returns:
      The :class:`DPReport`.
    """
    dp = private and noise_multiplier > 0.0 and math.isfinite(clip_norm) and delta is not None
    if not dp:
        eps_rdp = eps_pld = math.inf
    elif steps == 0:
        eps_rdp = eps_pld = 0.0
    else:
        common = dict(noise_multiplier=noise_multiplier, sampling_rate=sampling_rate, steps=steps, delta=delta)
        eps_rdp = compute_epsilon(**common, accountant="rdp")
        eps_pld = compute_epsilon(**common, accountant="pld", pld_discretization=pld_discretization)
    dpa = _version("dp-accounting")
    return DPReport(
        dp=dp,
        epsilon_rdp=eps_rdp,
        epsilon_pld=eps_pld,
        delta=delta,
        noise_multiplier=noise_multiplier,
        clip_norm=clip_norm,
        sampling="poisson",
        sampling_rate=sampling_rate,
        sampling_probability=sampling_probability,
        expected_batch_size=sampling_rate * dataset_size,
        steps=steps,
        steps_planned=steps_planned,
        dataset_size=dataset_size,
        protected_unit=protected_unit,
        adjacency=adjacency,
        target_epsilon=target_epsilon,
        calibration_accountant=calibration_accountant,
        accountants={
            "rdp": {
                "implementation": "dp_accounting.rdp.RdpAccountant",
                "version": dpa,
                "orders": f"DEFAULT_RDP_ORDERS ({len(_ORDERS)} orders, {_ORDERS[0]:g} to {_ORDERS[-1]:g})",
                "neighboring_relation": "ADD_OR_REMOVE_ONE",
            },
            "pld": {
                "implementation": "dp_accounting.pld.PLDAccountant",
                "version": dpa,
                "value_discretization_interval": pld_discretization,
                "pessimistic_estimate": True,
                "neighboring_relation": "ADD_OR_REMOVE_ONE",
            },
        },
        software={name: _version(name) for name in ("jax", "flax", "optax", "jax-privacy", "dp-accounting")},
        optimizer=optimizer,
        learning_rate=learning_rate,
        microbatch_size=microbatch_size,
        tail_microbatch_size=tail_microbatch_size,
        clipping=clipping,
        clipping_reason=clipping_reason,
        clipped_sum_dtype=clipped_sum_dtype,
        layers=layers,
        layers_reason=layers_reason,
        not_covered=tuple(not_covered),
        **({} if randomness is None else {"randomness": randomness}),
        noise=SAMPLER if private and noise_multiplier > 0.0 else "none (no noise added)",
        noise_coordinates=noise_coordinates,
        sampler_delta=sampler_delta(min(eps_rdp, eps_pld), steps, noise_coordinates) if dp else 0.0,
    )
