"""Privacy accounting of a hyperparameter sweep: several DP-SGD runs on the same private training data.

A ``[sweep]`` trains candidate configurations (learning rate, clipping norm, steps, ...) on the same private
training set and keeps the one that scores best on a validation split. The released model then depends on every
candidate's training run, so its ``epsilon`` is that of the whole procedure, not of the winning run. Two rules,
frozen values interpreted in one place (:func:`account_sweep`):

* :class:`Compose` -- every candidate trained once; the composition of all their DP-SGD runs (dp_accounting
  ``ComposedDpEvent``, RDP and PLD). It covers releasing *all* trained models, hence any selection computed
  from them (post-processing).
* :class:`RandomStopping` -- Papernot & Steinke 2022: a random number ``K`` of runs (truncated negative
  binomial or Poisson, :func:`draw_repetitions`), each on a random candidate (:func:`draw_candidates`); only
  the best one is released. RDP bound of their Theorems 2 and 6 (:func:`repeat_and_select_rdp`).

What either rule covers, exactly (also in :attr:`SweepAccounting.covered` / ``not_covered``):

* Protected: each record of the private *training* set, under add/remove-one adjacency, with the validation
  split held fixed. Selecting by scores on a fixed validation split that is disjoint from the training set is
  then post-processing of the training runs, and is covered.
* Not protected: the records of the validation split. Their scores decide which model is released, with no
  noise; this accounting gives them no guarantee (a non-private release of the validation data, to be listed in
  the run's report). Scores computed on records of the protected training set are not post-processing of the
  trained models (they read those records directly, without noise) and void the guarantee, whether or not the
  records were trained on; validate only on the held-out split.
  Privatising the choice itself (report-noisy-max or the exponential mechanism over the scores, with its own
  ``epsilon`` for the validation records) is not implemented here.

Host-side float64 Python with numpy; PRNG draws come from explicit JAX keys.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import dp_accounting
import jax
import jax.numpy as jnp
import numpy as np
from dp_accounting.pld import PLDAccountant
from dp_accounting.rdp import RdpAccountant
from dp_accounting.rdp.rdp_privacy_accountant import DEFAULT_RDP_ORDERS, compute_delta
from scipy import optimize, special

from snapaudit_jax.dpsgd.accounting import (
    _check,
    _epsilon,
    _JumpsOverWindow,
    _quiet_dropped_orders,
    _Unreachable,
    compute_epsilon,
    dpsgd_event,
    pld_ladder,
    search_window,
)
from snapaudit_jax.utils import validate
from snapaudit_jax.utils.errors import InputError
from snapaudit_jax.utils.io import JSONRecord

__all__ = [
    "RULES",
    "Candidate",
    "TruncatedNegativeBinomial",
    "PoissonRepetitions",
    "Compose",
    "RandomStopping",
    "SweepAccounting",
    "account_sweep",
    "calibrate_sweep",
    "repeat_and_select_rdp",
    "draw_repetitions",
    "draw_candidates",
    "expected_noisy_steps",
]

RULES = ("compose", "random_stopping")

_ADD_REMOVE = dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
# Tail mass below which the inverse-CDF sampler stops extending its table (far below float64 resolution of u).
_TAIL_CUTOFF = 1e-18


class Candidate(NamedTuple):
    """The privacy parameters of one candidate DP-SGD run of a sweep (its other hyperparameters do not matter).

    Attributes:
      noise_multiplier: ``sigma > 0``.
      sampling_rate: Poisson rate ``q`` in ``(0, 1]``.
      steps: ``T >= 1``.
    """

    noise_multiplier: float
    sampling_rate: float
    steps: int


@dataclasses.dataclass(frozen=True)
class TruncatedNegativeBinomial:
    """The truncated negative binomial distribution ``D_{eta, gamma}`` of the number of runs ``K >= 1``.

    ``P[K = k] = (1 - gamma)^k / (gamma^-eta - 1) * prod_{l=0}^{k-1} (l + eta) / (l + 1)`` for ``eta != 0``
    and ``(1 - gamma)^k / (k log(1 / gamma))`` for ``eta = 0`` (logarithmic); ``eta = 1`` is the geometric
    distribution ``gamma (1 - gamma)^(k-1)``.

    Attributes:
      eta: shape, ``> -1``.
      gamma: in ``(0, 1)``.

    Raises:
      InputError: (on construction) ``eta <= -1`` or not finite, ``gamma`` outside ``(0, 1)``.

    References:
      Papernot & Steinke 2022, "Hyperparameter Tuning with Renyi Differential Privacy" (ICLR), Definition 1
      and Eq. (4) (the mean).
    """

    eta: float
    gamma: float

    def __post_init__(self):
        eta = validate._as_float("eta", self.eta)
        if not (eta > -1.0 and math.isfinite(eta)):
            raise InputError(f"eta must be a finite number > -1, got {self.eta!r}")
        object.__setattr__(self, "eta", eta)
        object.__setattr__(self, "gamma", validate.open_unit("gamma", self.gamma))

    @property
    def mean(self) -> float:
        """``E[K] = eta (1 - gamma) / (gamma (1 - gamma^eta))``; ``(1/gamma - 1) / log(1/gamma)`` at ``eta = 0``."""
        eta, gamma = self.eta, self.gamma
        if eta == 0.0:
            return (1.0 / gamma - 1.0) / math.log(1.0 / gamma)
        # eta (1 - gamma) / (gamma (1 - gamma^eta)), with 1 - gamma^eta = -expm1(eta log gamma)
        return eta * (1.0 - gamma) / (gamma * -math.expm1(eta * math.log(gamma)))

    @classmethod
    def with_mean(cls, eta: float, mean: float) -> TruncatedNegativeBinomial:
        """The distribution of shape ``eta`` whose mean is ``mean`` (``gamma`` solved by Brent's method).

        Args:
          eta: shape, ``> -1``.
          mean: ``E[K] > 1``.

        Returns:
          The distribution (its :attr:`mean` equals ``mean`` to about ``1e-12`` relative; the accounting uses
          the exact ``gamma`` returned, so the solve's error has no privacy effect).

        Raises:
          InputError: ``eta`` or ``mean`` out of range.
        """
        mean = validate._as_float("mean", mean)
        if not (mean > 1.0 and math.isfinite(mean)):
            raise InputError(f"mean must be a finite number > 1, got {mean!r}")
        cls(eta, 0.5)  # validates eta
        # E[K] decreases from +inf (gamma -> 0) to 1 (gamma -> 1); solve in log(gamma).
        f = lambda t: math.log(cls(eta, math.exp(t)).mean) - math.log(mean)  # noqa: E731
        lo = -1.0
        while f(lo) < 0.0:
            lo *= 2.0
            if lo < -512.0:
                raise InputError(f"mean must be at most about e^500 for eta={eta!r}, got {mean!r}")
        hi = -1e-12
        t = optimize.brentq(f, lo, hi, xtol=1e-15, rtol=1e-14) if f(hi) < 0.0 else hi
        return cls(eta, math.exp(t))

    def log_pmf(self, k: np.ndarray) -> np.ndarray:
        """``log P[K = k]`` for integers ``k >= 1``.

        Args:
          k: integer array, any shape.

        Returns:
          Float64 array of the same shape.
        """
        k = np.asarray(k, dtype=np.float64)
        eta, log_1m = self.eta, math.log1p(-self.gamma)
        if eta == 0.0:
            return k * log_1m - np.log(k) - math.log(-math.log(self.gamma))
        # prod_{l<k} (l + eta)/(l + 1) = Gamma(k + eta) / (Gamma(eta) Gamma(k + 1)); for eta < 0 Gamma(eta) < 0 and
        # gamma^-eta - 1 < 0, so both logs take absolute values.
        log_norm = math.log(abs(math.expm1(-eta * math.log(self.gamma))))
        return (special.gammaln(k + eta) - special.gammaln(eta) - special.gammaln(k + 1.0) + k * log_1m
                - log_norm)

    def to_dict(self) -> dict[str, Any]:
        """``{"distribution": "truncated_negative_binomial", "eta", "gamma", "mean"}``."""
        return {"distribution": "truncated_negative_binomial", "eta": self.eta, "gamma": self.gamma,
                "mean": self.mean}

    _first = 1

    def _tail_ratio(self, k: int) -> float:
        # p_{j+1}/p_j = (1 - gamma)(j + eta)/(j + 1): decreasing in j to 1 - gamma for eta >= 1, increasing to it for
        # eta < 1; so max(ratio at k, 1 - gamma) bounds every later ratio.
        return max((1.0 - self.gamma) * (k + self.eta) / (k + 1.0), 1.0 - self.gamma)


@dataclasses.dataclass(frozen=True)
class PoissonRepetitions:
    """A Poisson number of runs ``K ~ Poisson(mean)``, ``K >= 0`` (``K = 0``: a fixed default is released).

    Attributes:
      mean: ``mu >= 1``.

    Raises:
      InputError: (on construction) ``mean < 1`` or not finite.

    References:
      Papernot & Steinke 2022, Theorem 6.
    """

    mean: float

    def __post_init__(self):
        mean = validate._as_float("mean", self.mean)
        if not (mean >= 1.0 and math.isfinite(mean)):
            raise InputError(f"mean must be a finite number >= 1, got {self.mean!r}")
        object.__setattr__(self, "mean", mean)

    def log_pmf(self, k: np.ndarray) -> np.ndarray:
        """``log P[K = k]`` for integers ``k >= 0``.

        Args:
          k: integer array, any shape.

        Returns:
          Float64 array of the same shape.
        """
        k = np.asarray(k, dtype=np.float64)
        return -self.mean + k * math.log(self.mean) - special.gammaln(k + 1.0)

    def to_dict(self) -> dict[str, Any]:
        """``{"distribution": "poisson", "mean"}``."""
        return {"distribution": "poisson", "mean": self.mean}

    _first = 0

    def _tail_ratio(self, k: int) -> float:
        return self.mean / (k + 1.0)  # p_{j+1}/p_j = mu/(j + 1), decreasing in j


Distribution = TruncatedNegativeBinomial | PoissonRepetitions


@dataclasses.dataclass(frozen=True)
class Compose:
    """Sweep rule: every candidate trained once, all runs composed (dp_accounting ``ComposedDpEvent``).

    Attributes:
      pld_discretization: value discretisation interval of the PLD accountant.
    """

    pld_discretization: float = 1e-4

    def __post_init__(self):
        object.__setattr__(self, "pld_discretization",
                           validate.positive_float("pld_discretization", self.pld_discretization))


@dataclasses.dataclass(frozen=True)
class RandomStopping:
    """Sweep rule: ``K ~ distribution`` runs, each on a uniformly random candidate; only the best is released.

    Attributes:
      distribution: :class:`TruncatedNegativeBinomial` or :class:`PoissonRepetitions`.

    Raises:
      InputError: (on construction) ``distribution`` of another type.

    References:
      Papernot & Steinke 2022, Theorems 2 and 6.
    """

    distribution: Distribution

    def __post_init__(self):
        if not isinstance(self.distribution, (TruncatedNegativeBinomial, PoissonRepetitions)):
            raise InputError("distribution must be a TruncatedNegativeBinomial or PoissonRepetitions, got "
                             f"{self.distribution!r}")


UNITS = ("record", "user")


def _protected(unit: str) -> str:
    """The protected unit's words (``unit``: ``"record"`` or ``"user"``)."""
    unit = validate.choice("unit", unit, UNITS)
    whole = " with all of their records" if unit == "user" else ""
    return f"each {unit} of the private training set (add/remove one {unit}{whole}), the validation split held fixed"
_VALIDATION_NOT_COVERED = (
    "the validation split that scores the candidates: its records decide, without noise, which model is released "
    "and get no guarantee from this accounting (a non-private release of the validation data)",
    "scores or a selection computed on records of the protected training set: a further non-private use of those "
    "records, not post-processing; it voids the guarantee",
    "every candidate's per-step training metrics (as for a single run)",
)
_COMMON_ASSUMPTIONS = (
    "the validation split is disjoint from the training set and fixed before training",
    "each candidate is the DP-SGD mechanism of dpsgd_event (Poisson sampling, clipped sum plus Gaussian noise) "
    "with its own fresh randomness",
)


@dataclasses.dataclass(frozen=True)
class SweepAccounting(JSONRecord):
    """The privacy guarantee of a hyperparameter sweep (:func:`account_sweep`), JSON-serialisable.

    Attributes:
      rule: ``"compose"`` or ``"random_stopping"``.
      epsilon: the guarantee at ``delta`` of what ``covered`` says is released (compose: ``min`` of the RDP
        and PLD bounds; random stopping: the RDP bound).
      delta: ``delta`` of the guarantee.
      epsilon_rdp: the RDP accountant's bound.
      epsilon_pld: the PLD accountant's bound (compose), ``None`` for random stopping (no PLD analysis).
      candidate_epsilons: each candidate's own ``epsilon`` at ``delta`` as a single run (compose: ``min`` of RDP
        and PLD; random stopping: RDP), for comparison.
      runs: compose: the number of candidates trained; random stopping: ``E[K]``, the expected number of
        runs (the drawn ``K`` is random and must not be released).
      distribution: the distribution of ``K`` (random stopping) as a dict, else ``None``.
      orders: the RDP orders.
      rdp: RDP of the whole procedure at each order (composes with further releases by adding).
      covered: what the guarantee protects and what release it covers.
      not_covered: releases the guarantee does not cover.
      assumptions: under which assumptions it holds.
    """

    rule: str
    epsilon: float
    delta: float
    epsilon_rdp: float
    epsilon_pld: float | None
    candidate_epsilons: tuple[float, ...]
    runs: float
    distribution: dict[str, Any] | None
    orders: tuple[float, ...]
    rdp: tuple[float, ...]
    covered: str
    not_covered: tuple[str, ...]
    assumptions: tuple[str, ...]


def _candidates(candidates: Sequence[Any], delta: float) -> tuple[tuple[Candidate, ...], float]:
    if isinstance(candidates, (str, bytes)) or not isinstance(candidates, Sequence) or not candidates:
        raise InputError(f"candidates must be a non-empty sequence of (noise_multiplier, sampling_rate, steps), "
                         f"got {candidates!r}")
    out = []
    for i, c in enumerate(candidates):
        try:
            sigma, q, steps = c
        except (TypeError, ValueError):
            raise InputError(f"candidates[{i}] must be (noise_multiplier, sampling_rate, steps), got {c!r}") from None
        sigma, q, steps, delta, _, _ = _check(sigma, q, steps, delta, "rdp", 1e-4)
        if sigma == 0.0:
            raise InputError(f"candidates[{i}].noise_multiplier must be > 0 (a run without noise has no finite "
                             f"epsilon), got {c[0]!r}")
        out.append(Candidate(sigma, q, steps))
    return tuple(out), delta


def _rule(rule: Any, params: dict[str, Any]) -> Compose | RandomStopping:
    if isinstance(rule, (Compose, RandomStopping)):
        if params:
            raise InputError(f"parameters {sorted(params)} must be None when rule is a value ({rule!r}); set them "
                             "on the value")
        return rule
    name = validate.choice("rule", rule, RULES)
    try:
        return Compose(**params) if name == "compose" else RandomStopping(**params)
    except TypeError as err:
        raise InputError(f"rule {name!r} takes {'pld_discretization' if name == 'compose' else 'distribution'}, "
                         f"got {sorted(params)} ({err})") from None


def _composed_pld_epsilon(cands: Sequence[Candidate], delta: float, disc: float) -> float:
    """PLD epsilon of the composition of the candidates' runs; runs with the same ``(sigma, q)`` are one event.

    Composing ``T_1`` and ``T_2`` steps of the same Poisson-sampled Gaussian is ``T_1 + T_2`` steps of it (one
    self-composition, exactly), which dp_accounting's PLD evaluates far faster than a composition of
    different events.
    """
    merged: dict[tuple[float, float], int] = {}
    for c in cands:
        merged[(c.noise_multiplier, c.sampling_rate)] = merged.get((c.noise_multiplier, c.sampling_rate), 0) + c.steps
    groups = tuple((sigma, q, steps) for (sigma, q), steps in merged.items())
    if len(groups) == 1:  # one event: compute_epsilon's number, from its memo
        return _epsilon(*groups[0], delta, "pld", disc)
    return _composed_groups_epsilon(groups, delta, disc)


@functools.lru_cache(maxsize=1024)
def _composed_groups_epsilon(groups: tuple[tuple[float, float, int], ...], delta: float, disc: float) -> float:
    # Memoised: a calibration's last evaluation is the one account_sweep makes at the sigma it returns.
    event = dp_accounting.ComposedDpEvent([dpsgd_event(sigma, q, steps) for sigma, q, steps in groups])
    return float(PLDAccountant(_ADD_REMOVE, value_discretization_interval=disc).compose(event).get_epsilon(delta))


def _rdp_curve(c: Candidate, orders: np.ndarray) -> np.ndarray:
    with _quiet_dropped_orders():
        acc = RdpAccountant(orders=orders, neighboring_relation=_ADD_REMOVE)
        return acc.compose(dpsgd_event(c.noise_multiplier, c.sampling_rate, c.steps)).rdp


def _rdp_epsilon(orders: np.ndarray, rdp: np.ndarray, delta: float) -> float:
    # dp_accounting's public RDP -> (epsilon, delta) conversion (Canonne, Kamath & Steinke 2020, Prop. 12 /
    # Asoodeh et al. 2020), the one RdpAccountant.get_epsilon uses.
    with _quiet_dropped_orders():
        return float(dp_accounting.rdp.compute_epsilon(orders, rdp, delta)[0])


def repeat_and_select_rdp(orders: Sequence[float], rdp: Sequence[float], distribution: Distribution) -> np.ndarray:
    """RDP of running a base algorithm ``K ~ distribution`` times and releasing only the best output.

    Truncated negative binomial ``D_{eta, gamma}`` (Theorem 2), for each order ``lambda > 1``::

        eps'(lambda) = eps(lambda) + (1 + eta) min_{lh} [(1 - 1/lh) eps(lh) + log(1/gamma) / lh]
                       + log(E[K]) / (lambda - 1)

    with the minimum over the given orders ``lh >= 1``. Poisson ``K ~ Poisson(mu)`` (Theorem 6)::

        eps'(lambda) = eps(lambda) + mu * delta_hat(lambda) + log(mu) / (lambda - 1),

    where ``delta_hat(lambda)`` is the base algorithm's ``delta`` at ``eps_hat = log(1 + 1/(lambda - 1))``
    obtained from its RDP curve (dp_accounting ``compute_delta``). Finally each order takes the smallest bound
    of all orders ``>= lambda`` (Renyi divergence is non-decreasing in the order).

    Args:
      orders: RDP orders ``>= 1``, shape ``(n_orders,)``.
      rdp: the base algorithm's RDP at each order (``inf`` allowed), shape ``(n_orders,)``.
      distribution: :class:`TruncatedNegativeBinomial` or :class:`PoissonRepetitions`.

    Returns:
      The procedure's RDP at each order, shape ``(n_orders,)`` (``inf`` where no bound holds, e.g. order 1).

    Raises:
      InputError: orders below 1, lengths that differ, negative or nan RDP, or another distribution type.

    Guarantees:
      If the base algorithm ``Q`` (a run and its score, on a totally ordered score with a fixed tie-break) is
      ``(lambda, eps(lambda))``-RDP at every given order, the procedure that draws ``K`` independently of the
      data, runs ``Q`` ``K`` times with independent randomness and releases only the best run (not ``K``, not
      the other runs) is ``(lambda, eps'(lambda))``-RDP. This matches dp_accounting's
      ``RepeatAndSelectDpEvent`` (which takes the mean and solves ``gamma`` itself) up to that solve.

    References:
      Papernot & Steinke 2022, "Hyperparameter Tuning with Renyi Differential Privacy" (ICLR), Theorem 2
      (truncated negative binomial; Eq. (4) for ``E[K]``) and Theorem 6 (Poisson).
    """
    orders = np.asarray(orders, dtype=np.float64)
    rdp = np.asarray(rdp, dtype=np.float64)
    if orders.ndim != 1 or orders.shape != rdp.shape or orders.size == 0:
        raise InputError(f"orders and rdp must be 1-d of the same non-zero length, got shapes {orders.shape} and "
                         f"{rdp.shape}")
    if not np.all(orders >= 1.0):
        raise InputError(f"orders must all be >= 1, got min {orders.min()!r}")
    if np.any(np.isnan(rdp)) or np.any(rdp < 0.0):
        raise InputError("rdp must be >= 0 at every order (inf allowed), got "
                         f"{rdp[np.isnan(rdp) | (rdp < 0.0)][:3].tolist()}")
    above = orders > 1.0
    out = np.full(orders.shape, np.inf)
    if isinstance(distribution, TruncatedNegativeBinomial):
        eta, gamma = distribution.eta, distribution.gamma
        # Theorem 2: the (lambda_hat, eps_hat) term, minimised over the available orders.
        finite = np.isfinite(rdp)  # (1 - 1/1) * inf at order 1 would be nan; an infinite term never wins the min
        hat = np.where(finite, (1.0 - 1.0 / orders) * np.where(finite, rdp, 0.0), np.inf)
        c = (1.0 + eta) * np.min(hat + math.log(1.0 / gamma) / orders)
        log_mean = math.log(distribution.mean)
        out[above] = rdp[above] + c + log_mean / (orders[above] - 1.0)
    elif isinstance(distribution, PoissonRepetitions):
        mu = distribution.mean
        for i in np.flatnonzero(above):
            # Theorem 6: Q is (eps_hat, delta_hat)-DP with e^eps_hat = 1 + 1/(lambda - 1).
            delta_hat = compute_delta(orders, rdp, math.log1p(1.0 / (orders[i] - 1.0)))[0]
            out[i] = rdp[i] + mu * delta_hat + math.log(mu) / (orders[i] - 1.0)
    else:
        raise InputError(f"distribution must be a TruncatedNegativeBinomial or PoissonRepetitions, got "
                         f"{distribution!r}")
    # Monotonicity in the order: a bound at lambda' >= lambda is one at lambda.
    by_order = np.argsort(orders, kind="stable")
    envelope = np.minimum.accumulate(out[by_order][::-1])[::-1]
    out[by_order] = envelope
    return out


def account_sweep(
    candidates: Sequence[tuple[float, float, int]],
    delta: float,
    rule: str | Compose | RandomStopping = "compose",
    *,
    unit: str = "record",
    **params: Any,
) -> SweepAccounting:
    """The ``(epsilon, delta)`` of a hyperparameter sweep of DP-SGD runs on the same private training data.

    ``"compose"`` (:class:`Compose`): the ``ComposedDpEvent`` of every candidate's :func:`dpsgd_event`,
    evaluated by dp_accounting's RDP (sum of the candidates' RDP curves, its RDP-to-DP conversion) and PLD
    accountants. ``"random_stopping"`` (:class:`RandomStopping`): the base algorithm is "pick a candidate at
    random, train it, score it"; its RDP at each order is at most the maximum over the candidates' RDP, and
    :func:`repeat_and_select_rdp` gives the RDP of releasing the best of ``K`` runs, converted to
    ``(epsilon, delta)`` by dp_accounting's conversion.

    Args:
      candidates: the candidates' ``(noise_multiplier, sampling_rate, steps)`` (:class:`Candidate` or
        tuples), at least one; for random stopping, the configurations each run draws from uniformly.
      delta: in ``(0, 1)``.
      rule: ``"compose"``, ``"random_stopping"``, or a :class:`Compose` / :class:`RandomStopping` value.
      unit: the protected unit the ``covered`` text names: ``"record"`` (default) or ``"user"`` (one DP-SGD
        unit is all of a user's records); the accounting is the same.
      **params: with a rule name, the fields of its value: ``pld_discretization`` (compose),
        ``distribution`` (random stopping, required).

    Returns:
      A :class:`SweepAccounting`.

    Raises:
      InputError: an invalid candidate (``noise_multiplier`` must be ``> 0``), ``delta``, ``rule`` or parameter.

    Guarantees:
      Protected: each record of the private training set under add/remove-one adjacency, the validation split
      held fixed, for the release stated in ``covered``. Compose covers releasing every candidate's model
      (adaptively chosen candidates included, as long as the choice uses only earlier models and the held-out
      scores), hence the selected model. Random stopping covers releasing only the selected run (its
      configuration, model and score) and requires ``K`` and the candidate choices to be drawn independently of
      the data (:func:`draw_candidates`) and ``K`` and the other runs never to be released. The mixture step is
      valid because a random choice of candidate with data-independent weights ``w_i`` gives, for neighbouring
      datasets, the mixtures ``sum_i w_i P_i`` and ``sum_i w_i P'_i``, and ``exp((lambda - 1) D_lambda(P || P'))
      = int P^lambda P'^(1 - lambda)`` is jointly convex in ``(P, P')`` for ``lambda > 1``, so
      ``D_lambda(mixture) <= max_i D_lambda(P_i || P'_i)``; with the max it holds for any data-independent
      weights. Neither rule protects the validation records (see ``not_covered``).

    References:
      Papernot & Steinke 2022, "Hyperparameter Tuning with Renyi Differential Privacy" (ICLR), Theorems 2 and
      6; Mironov 2017, "Renyi differential privacy", Prop. 1 (composition); van Erven & Harremoes 2014,
      "Renyi divergence and Kullback-Leibler divergence", Thm. 3 and 13 (monotonicity, joint convexity).
    """
    cands, delta = _candidates(candidates, delta)
    rule = _rule(rule, params)
    protected = _protected(unit)
    orders = np.asarray(DEFAULT_RDP_ORDERS, dtype=np.float64)
    curves = np.stack([_rdp_curve(c, orders) for c in cands])
    single_rdp = [_rdp_epsilon(orders, curve, delta) for curve in curves]
    if isinstance(rule, Compose):
        disc = rule.pld_discretization
        rdp = curves.sum(axis=0)
        eps_rdp = _rdp_epsilon(orders, rdp, delta)
        eps_pld = _composed_pld_epsilon(cands, delta, disc)
        single = tuple(min(r, compute_epsilon(noise_multiplier=c.noise_multiplier, sampling_rate=c.sampling_rate,
                                              steps=c.steps, delta=delta, accountant="pld",
                                              pld_discretization=disc))
                       for r, c in zip(single_rdp, cands))
        return SweepAccounting(
            rule="compose", epsilon=min(eps_rdp, eps_pld), delta=delta, epsilon_rdp=eps_rdp, epsilon_pld=eps_pld,
            candidate_epsilons=single, runs=float(len(cands)), distribution=None,
            orders=tuple(orders.tolist()), rdp=tuple(rdp.tolist()),
            covered=f"{protected}; releasing every candidate's trained model (all {len(cands)} runs), hence any "
                    "selection computed from those models and the held-out validation scores",
            not_covered=_VALIDATION_NOT_COVERED,
            assumptions=_COMMON_ASSUMPTIONS + (
                "the candidates are fixed before training, or each is chosen only from earlier candidates' models "
                "and held-out scores",),
        )
    dist = rule.distribution
    rdp = repeat_and_select_rdp(orders, curves.max(axis=0), dist)
    eps_rdp = _rdp_epsilon(orders, rdp, delta)
    return SweepAccounting(
        rule="random_stopping", epsilon=eps_rdp, delta=delta, epsilon_rdp=eps_rdp, epsilon_pld=None,
        candidate_epsilons=tuple(single_rdp), runs=dist.mean, distribution=dist.to_dict(),
        orders=tuple(orders.tolist()), rdp=tuple(rdp.tolist()),
        covered=f"{protected}; releasing only the best of K runs (its configuration, model and score), K drawn "
                f"from {dist.to_dict()}",
        not_covered=_VALIDATION_NOT_COVERED + (
            "K, the other runs' models, scores and configurations, and the order of the runs: releasing any of "
            "them voids the bound",),
        assumptions=_COMMON_ASSUMPTIONS + (
            "K is drawn from the stated distribution independently of the data (draw_repetitions); with K = 0 "
            "(Poisson) a fixed data-independent default is released",
            "each run draws its candidate independently of the data and of the other runs (draw_candidates: "
            "uniform); the bound uses the maximum of the candidates' RDP, valid for any data-independent choice",
            "the best run is chosen by its score with a fixed tie-break (a total order)",
        ),
    )


def expected_noisy_steps(rule: str, runs: float, steps: Sequence[int]) -> float:
    """The expected number of noisy DP-SGD steps a sweep takes (what the noise sampler's term counts).

    Args:
      rule: ``"compose"`` (every candidate trains once) or ``"random_stopping"``.
      runs: the expected number of runs (:attr:`SweepAccounting.runs`); used by random stopping.
      steps: the candidates' steps.

    Returns:
      ``sum(steps)`` for compose; ``runs * max(steps)`` for random stopping (each run trains one candidate, at
      most the longest).
    """
    return float(sum(steps)) if rule == "compose" else runs * max(steps)


def calibrate_sweep(
    target_epsilon: float,
    delta: float,
    runs: Sequence[tuple[float, int]],
    rule: str | Compose | RandomStopping = "compose",
    *,
    max_margin: float = 0.01,
    unit: str = "record",
    **params: Any,
) -> tuple[float, SweepAccounting]:
    """The one noise multiplier of every candidate of a sweep whose accounted ``epsilon`` is just below a target.

    Every candidate runs at the same ``sigma``; :func:`account_sweep` gives the sweep's ``epsilon(sigma)``, which
    decreases in ``sigma``. :func:`~snapaudit_jax.dpsgd.accounting.search_window` solves
    ``(1 - max_margin) target <= epsilon(sigma) <= target``: for a composition first on the PLD bound alone at
    the coarser intervals of :func:`~snapaudit_jax.dpsgd.accounting.pld_ladder` (cheap, and within a few parts in
    ten thousand at 1e-3), then on ``min(RDP, PLD)`` at the rule's interval, usually once; for random stopping
    on its RDP bound.

    Args:
      target_epsilon: the sweep's target, ``> 0``.
      delta: in ``(0, 1)``.
      runs: the candidates' ``(sampling_rate, steps)``, at least one.
      rule: as :func:`account_sweep`.
      max_margin: the largest allowed ``(target - epsilon) / target``, in ``(0, 1)``.
      unit: the protected unit, as :func:`account_sweep`.
      **params: the rule's parameters, as :func:`account_sweep`.

    Returns:
      ``(sigma, accounting)``: ``accounting = account_sweep(...)`` at ``sigma``, with ``accounting.epsilon <=
      target_epsilon``.

    Raises:
      InputError: an invalid argument; a target no ``sigma <= 1e4`` reaches; or the margin unattainable (the
        accountant's ``epsilon`` jumps over the window).

    Guarantees:
      ``accounting.epsilon <= target_epsilon`` (the returned accounting is the one evaluated at the returned
      ``sigma``), and ``>= (1 - max_margin) target_epsilon`` unless the search floor ``sigma = 0.3`` already meets
      the target.
    """
    target = validate.positive_float("target_epsilon", target_epsilon)
    max_margin = validate._as_float("max_margin", max_margin)
    if not 0.0 < max_margin < 1.0:
        raise InputError(f"max_margin must be in (0, 1), got {max_margin!r}")
    if isinstance(runs, (str, bytes)) or not isinstance(runs, Sequence) or not runs:
        raise InputError(f"runs must be a non-empty sequence of (sampling_rate, steps), got {runs!r}")
    pairs = []
    for i, r in enumerate(runs):
        try:
            q, steps = r
        except (TypeError, ValueError):
            raise InputError(f"runs[{i}] must be (sampling_rate, steps), got {r!r}") from None
        pairs.append((q, steps))
    rule = _rule(rule, params)
    _protected(unit)
    orders = np.asarray(DEFAULT_RDP_ORDERS, dtype=np.float64)
    delta = _candidates([(1.0, q, steps) for q, steps in pairs], delta)[1]

    @functools.lru_cache(maxsize=None)
    def rdp_epsilon(sigma: float) -> float:
        # The RDP side of the sweep's accounting, never below the accounted epsilon of a composition.
        # A Poisson-sampled Gaussian's RDP is additive over steps: one curve per sampling rate, scaled.
        unit = {q: _rdp_curve(Candidate(sigma, q, 1), orders) for q in {q for q, _ in pairs}}
        curves = np.stack([steps * unit[q] for q, steps in pairs])
        rdp = curves.sum(axis=0) if isinstance(rule, Compose) else repeat_and_select_rdp(
            orders, curves.max(axis=0), rule.distribution)
        return _rdp_epsilon(orders, rdp, delta)

    if isinstance(rule, RandomStopping):
        levels = [rdp_epsilon]
    else:
        # Coarser PLD accountants say where to look; the last level is account_sweep's epsilon itself.
        *coarse, disc = pld_ladder(rule.pld_discretization)
        levels = [functools.partial(_sweep_pld, pairs, delta, d) for d in coarse]
        levels.append(lambda sigma: min(rdp_epsilon(sigma), _sweep_pld(pairs, delta, disc, sigma)))
    try:
        sigma, _ = search_window(levels, target, (1.0 - max_margin) * target)
    except _Unreachable as err:
        raise InputError(f"target_epsilon {target} is unreachable for this sweep: even sigma = 1e4 gives "
                         f"epsilon {err.epsilon:.4g}") from None
    except _JumpsOverWindow as err:
        raise InputError(f"max_margin is unattainable: the sweep's epsilon jumps from {err.above:.6g} (above "
                         f"{target}) to {err.below:.6g} between sigma = {err.low:.8g} and {err.high:.8g}; raise "
                         "max_margin") from None
    accounting = account_sweep([(sigma, q, steps) for q, steps in pairs], delta, rule, unit=unit)
    if not accounting.epsilon <= target:  # the search's epsilon is account_sweep's; a mismatch is a bug
        raise ArithmeticError(f"calibrate_sweep: epsilon {accounting.epsilon} above the target {target} at sigma "
                              f"{sigma}")
    return sigma, accounting


def _sweep_pld(pairs, delta: float, disc: float, sigma: float) -> float:
    return _composed_pld_epsilon([Candidate(sigma, q, steps) for q, steps in pairs], delta, disc)


def _key(key: Any) -> jax.Array:
    if isinstance(key, jax.Array):
        return key
    return jax.random.key(validate.seed("key", key))


def _uniforms(key: Any, shape: tuple[int, ...]) -> np.ndarray:
    # 53 random bits from two uint32 words: a float64 uniform on [0, 1) with the full mantissa (float32 uniforms
    # would cut the tail of K at 2^-24).
    bits = np.asarray(jax.random.bits(_key(key), shape + (2,), dtype=jnp.uint32)).astype(np.uint64)
    return ((bits[..., 0] >> np.uint64(5)) * np.uint64(1 << 26) + (bits[..., 1] >> np.uint64(6))) / float(2**53)


def _inverse_cdf(distribution: Distribution, u: np.ndarray) -> np.ndarray:
    flat = u.ravel()
    order = np.argsort(flat, kind="stable")
    us = flat[order]
    out = np.empty(flat.shape, dtype=np.int64)
    done, offset, k0, chunk = 0, 0.0, distribution._first, 1024
    while done < us.size:
        ks = np.arange(k0, k0 + chunk, dtype=np.int64)
        pmf = np.exp(distribution.log_pmf(ks))
        cdf = offset + np.cumsum(pmf)
        ratio = distribution._tail_ratio(int(ks[-1]))
        tail_small = ratio < 1.0 and pmf[-1] * ratio / (1.0 - ratio) < _TAIL_CUTOFF
        # K = min{k : F(k) > u}; u left over once the tail is negligible lies within rounding of F = 1.
        n_here = us.size - done if tail_small else int(np.searchsorted(us[done:], cdf[-1], side="left"))
        idx = np.minimum(np.searchsorted(cdf, us[done:done + n_here], side="right"), chunk - 1)
        out[order[done:done + n_here]] = ks[idx]
        done += n_here
        offset, k0, chunk = float(cdf[-1]), k0 + chunk, min(2 * chunk, 1 << 20)
    return out.reshape(u.shape)


def draw_repetitions(key: Any, distribution: Distribution, shape: tuple[int, ...] = ()) -> int | np.ndarray:
    """Draws the number of runs ``K`` of a random-stopping sweep (inverse CDF, float64, explicit key).

    Args:
      key: a JAX PRNG key (``jax.random.key``) or an integer seed in ``[0, 2**63 - 1]``.
      distribution: :class:`TruncatedNegativeBinomial` (``K >= 1``) or :class:`PoissonRepetitions` (``K >= 0``).
      shape: the shape of independent draws (``()``: one ``int``).

    Returns:
      ``K`` as an ``int`` for ``shape == ()``, else an int64 array of ``shape``.

    Raises:
      InputError: a bad seed, shape or distribution.

    Guarantees:
      Deterministic in ``key``. Exact in law up to float64 rounding: ``K = min{k : F(k) > u}`` with ``u``
      uniform on the 2^53-point grid of ``[0, 1)`` and ``F`` the float64 cumulative sum of :meth:`log_pmf`
      (its table stops once the remaining tail is below 1e-18).
    """
    if not isinstance(distribution, (TruncatedNegativeBinomial, PoissonRepetitions)):
        raise InputError(f"distribution must be a TruncatedNegativeBinomial or PoissonRepetitions, got "
                         f"{distribution!r}")
    try:
        shape = tuple(validate.positive_int("shape", s, minimum=0) for s in shape)
    except TypeError:
        raise InputError(f"shape must be a tuple of integers >= 0, got {shape!r}") from None
    ks = _inverse_cdf(distribution, _uniforms(key, shape))
    return int(ks) if shape == () else ks


def draw_candidates(key: Any, distribution: Distribution, num_candidates: int) -> tuple[int, ...]:
    """The plan of a random-stopping sweep: the candidate index of each of its ``K`` runs.

    ``K = draw_repetitions(fold_in(key, 0), distribution)``; run ``j`` trains candidate
    ``randint(fold_in(fold_in(key, 1), j), (), 0, num_candidates)`` (uniform, independent; a run's draw depends
    only on ``key`` and ``j``, and ``K`` is padded to a power of two so that few sizes compile). Train run ``j``
    with a key derived from ``fold_in(key, 2)`` and ``j`` so that the runs' randomness is independent.

    Args:
      key: a JAX PRNG key or an integer seed.
      distribution: the distribution of ``K``.
      num_candidates: ``>= 1``.

    Returns:
      ``K`` candidate indices in ``[0, num_candidates)`` (empty when a Poisson ``K`` is 0). Keep it secret:
      the guarantee of :func:`account_sweep` does not cover releasing ``K`` or the plan.

    Raises:
      InputError: a bad key, distribution or ``num_candidates``.
    """
    num_candidates = validate.positive_int("num_candidates", num_candidates)
    key = _key(key)
    k = draw_repetitions(jax.random.fold_in(key, 0), distribution)
    if k == 0:
        return ()
    bucket = 1 << (k - 1).bit_length()
    picks = _pick(jax.random.fold_in(key, 1), bucket, num_candidates)
    return tuple(int(i) for i in np.asarray(picks)[:k])


@functools.partial(jax.jit, static_argnums=1)
def _pick(key: jax.Array, bucket: int, num_candidates: int) -> jax.Array:
    draw = lambda j: jax.random.randint(jax.random.fold_in(key, j), (), 0, num_candidates)  # noqa: E731
    return jax.vmap(draw)(jnp.arange(bucket))
