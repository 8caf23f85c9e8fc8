"""One-run audits: many canaries, each included by its own coin, one run of the mechanism.

Part of the estimation layer (:mod:`snapaudit_jax.estimation`). The design (Steinke, Nasr and Jagielski
2023): ``m`` canaries, canary ``i`` included in the private input independently with probability ``p``
(``S_i = +1``) or not (``S_i = -1``); the mechanism runs *once*; each canary gets a score from its output
(higher = "included"). The attacker guesses the ``k_+`` highest-scored canaries as included and the ``k_-``
lowest-scored as not included, abstaining on the rest, and counts its correct guesses ``W``.

The bound (:func:`one_run_p_value`): if the run is ``(eps, delta)``-DP with respect to each canary's inclusion
(all other canaries' coins held fixed), the guesses ``T`` are a function of the output alone, and ``T`` has
exactly ``r = k_+ + k_-`` non-zero entries, then, given ``T``, coordinate by coordinate
``P[S_i = T_i | T, S_<i] <= q_{T_i}`` with ``q_+ = p e^eps / (p e^eps + 1 - p)`` and
``q_- = (1 - p) e^eps / ((1 - p) e^eps + p)``, so ``W`` is stochastically dominated by
``Binomial(k_+, q_+) + Binomial(k_-, q_-)`` for ``delta = 0``. For ``p = 1/2`` (``q_+ = q_- = q``) and
``delta > 0`` the paper's theorem adds the ``delta`` term::

    P[W >= v] <= beta + 2 m delta * max_{1 <= i <= v} P[v - i <= B < v] / i,   B ~ Binomial(r, q),
    beta = P[B >= v].

Both tails are computed exactly (SciPy's regularised incomplete beta, sums of probability masses), never by a
normal approximation. The lower bound on ``eps`` is the largest ``eps`` whose p-value is ``<= alpha'``: DP at
``eps`` implies DP at every larger ``eps``, so rejecting ``eps`` rejects every smaller one, and the bisection
returns an ``eps`` whose rejection it has checked (the reported value never exceeds the crossing).

Where the analysis does not reach, the auditor refuses: an ``(eps, delta)`` claim with ``delta > 0`` needs
``p = 1/2`` (the ``delta`` term is proved for fair coins); a pure ``eps`` claim (``delta = 0``) takes any
``p`` in ``(0, 1)``.

Choosing ``(k_+, k_-)`` (pitfall 1): either a :class:`DeclaredGrid` of pairs fixed before the scores are seen,
every pair evaluated at ``alpha / G`` (a union bound over the ``G`` pairs: the family-wise error is
``<= alpha``), or :class:`HeldOut`: a random part of the canaries (split by a PRNG key, before scoring
matters) picks the best candidate fractions on its own scores and coins, and the other part alone is evaluated
at ``alpha``, with ``m`` its own size (its coins are independent of the selection part's, which are then fixed
inputs of the run).

Compared with jax_privacy 2.0.0's ``CanaryScoreAuditor.epsilon_one_run`` on the same scores (see
:func:`attacks.canary.jax_privacy_bounds`; ``benchmarks/bench_one_run.py`` measures both side by side):

1. **Threshold family.** jax_privacy evaluates every observed score as a threshold, prunes them to the Pareto
   frontier of the (false-negative, true-negative) counts -- counts that use the membership labels -- and
   divides ``alpha`` only by the frontier's size. The correction then does not cover the thresholds that
   could have been picked, and on no-leakage scores (1,000 fair-coin canaries, ``alpha = 0.05``,
   ``delta = 1e-5``) it reported ``eps > 0`` in 6.1% of 5,000 runs. Here the family is declared before the
   data (or chosen on held-out canaries), so the false-alarm rate is at most ``alpha`` by construction.
2. **Guesses.** jax_privacy guesses "included" for every score ``>=`` a threshold, so ties make the number of
   guesses a random block size; here exactly ``k_+`` (and ``k_-``) canaries are guessed, ties broken by
   canary index, which is fixed before the coins (the theorem needs ``||T||_1 <= r`` for a fixed ``r``).
3. **Two-sided guesses.** jax_privacy supports ``k_- = 0`` only; here ``k_-`` guesses of "not included"
   count too (the paper's attacker).
4. **Insertion probability.** jax_privacy assumes ``p = 1/2`` without saying so (with ``p = 0.8`` and no
   leakage it reported ``eps > 0`` in 400 of 400 runs); here ``p`` is a required argument, analysed exactly
   for ``delta = 0`` and refused for ``delta > 0`` unless it is 1/2.
5. **Root finding.** jax_privacy's ``brentq(xtol=1e-6)`` may return a point just past the crossing (a
   p-value slightly above ``alpha``); the bisection here returns a checked rejected ``eps``.
6. **Same formula.** On identical ``(m, r, v, eps, delta)`` the p-value equals jax_privacy's
   ``_one_run_p_value`` to 1e-12 (tested); the differences above are all in the procedure around it.

Guarantees:
  With probability at least ``1 - alpha`` over the coins (and the mechanism's randomness), the reported
  ``epsilon`` is at most the ``eps`` of every ``(eps, delta)`` guarantee the run has with respect to each
  canary's inclusion, *if* canaries are included independently with the stated ``p`` and the guesses are a
  function of the run's output (the scores) alone. Canaries may interact in the run (share one model or one
  prompt): validity needs only DP with respect to each canary's coin; interaction costs power, not validity.

References:
  Steinke, Nasr, Jagielski, "Privacy Auditing with One (1) Training Run", NeurIPS 2023 (the dominance
  argument, the ``(eps, delta)`` theorem and its p-value computation).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import jax
import numpy as np
from scipy import stats

from snapaudit_jax.utils import validate
from snapaudit_jax.utils.errors import InputError

__all__ = [
    "DEFAULT_FRACTIONS",
    "DeclaredGrid",
    "HeldOut",
    "OneRunResult",
    "check_design",
    "default_grid",
    "guess_counts",
    "one_run_audit",
    "one_run_epsilon",
    "one_run_p_value",
]

# Candidate (k_+/m, k_-/m) fractions for HeldOut selection and default_grid: one-sided and symmetric guesses.
_FRACTIONS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5)
DEFAULT_FRACTIONS: tuple[tuple[float, float], ...] = tuple(
    [(f, 0.0) for f in _FRACTIONS] + [(f, f) for f in _FRACTIONS if 2 * f <= 1.0])
_EPS_CAP = 1e3        # p-values are ~1 long before this (q -> 1); the search never needs more
_BISECTIONS = 80
_GUARANTEES = ("one-run bound (Steinke, Nasr, Jagielski 2023): with probability >= 1 - alpha it is below the eps "
               "of the run's (eps, delta) guarantee with respect to each canary's inclusion, given independent "
               "inclusion with the stated probability and guesses that depend on the output alone; the guess "
               "pairs are declared in advance (union bound over the family) or chosen on held-out canaries")


@dataclasses.dataclass(frozen=True)
class DeclaredGrid:
    """Guess pairs ``(k_+, k_-)`` fixed before the scores are seen; each is evaluated at ``alpha / len(pairs)``.

    Attributes:
      pairs: the ``G`` pairs ``(k_plus, k_minus)``, each with ``1 <= k_plus + k_minus <= m``.
    """

    pairs: tuple[tuple[int, int], ...]


@dataclasses.dataclass(frozen=True)
class HeldOut:
    """Choose ``(k_+/m, k_-/m)`` on a random ``fraction`` of the canaries, evaluate on the rest at ``alpha``.

    Attributes:
      fraction: share of the canaries used for selection only, in ``(0, 1)``.
      candidates: fractions ``(f_+, f_-)`` of the evaluation part's size to choose from.
    """

    fraction: float = 0.5
    candidates: tuple[tuple[float, float], ...] = DEFAULT_FRACTIONS


@dataclasses.dataclass(frozen=True)
class OneRunResult:
    """A one-run lower bound and everything needed to check it.

    Attributes:
      epsilon: the lower bound on ``eps`` (0 when no ``eps >= 0`` is rejected).
      delta: the claim's ``delta``.
      alpha: the family-wise failure probability.
      insert_probability: each canary's inclusion probability ``p``.
      canaries: ``m`` in the bound (all canaries, or the evaluation part under :class:`HeldOut`).
      k_plus: "included" guesses of the chosen pair.
      k_minus: "not included" guesses of the chosen pair.
      correct_plus: correct "included" guesses.
      correct_minus: correct "not included" guesses.
      rule: ``"declared_grid"`` or ``"held_out"``.
      family_size: pairs covered by the union bound.
      alpha_per_pair: the level each pair is tested at (``alpha / family_size``).
      n_selection: canaries used for selection only (0 for a declared grid).
      pairs: per evaluated pair ``(k_plus, k_minus, correct_plus, correct_minus, epsilon)``.
      guarantees: the assumptions under which ``epsilon`` is a bound.
    """

    epsilon: float
    delta: float
    alpha: float
    insert_probability: float
    canaries: int
    k_plus: int
    k_minus: int
    correct_plus: int
    correct_minus: int
    rule: str
    family_size: int
    alpha_per_pair: float
    n_selection: int
    pairs: tuple[tuple[int, int, int, int, float], ...]
    guarantees: str = _GUARANTEES

    @property
    def guesses(self) -> int:
        """Number of guesses ``r = k_plus + k_minus``."""
        return self.k_plus + self.k_minus

    @property
    def correct(self) -> int:
        """Number of correct guesses ``W = correct_plus + correct_minus``."""
        return self.correct_plus + self.correct_minus

    def to_dict(self) -> dict:
        """The fields as a dict (``pairs`` as lists), ready for JSON."""
        out = dataclasses.asdict(self)
        out["pairs"] = [list(p) for p in self.pairs]
        return out


# --- validation -------------------------------------------------------------------------------------------


def _probability(p) -> float:
    return validate.open_unit("insert_probability", p)


def check_design(insert_probability, delta) -> tuple[float, float]:
    """Checks that the analysis covers the design; ``delta > 0`` needs ``p = 1/2``.

    Call it before any scoring or model call, so a design the bound cannot use fails first.

    Args:
      insert_probability: each canary's inclusion probability ``p`` in ``(0, 1)``.
      delta: the claim's ``delta`` in ``[0, 1)``.

    Returns:
      ``(p, delta)`` as floats.

    Raises:
      InputError: ``p`` not in ``(0, 1)``, ``delta`` not in ``[0, 1)``, or ``delta > 0`` with ``p != 1/2``.
    """
    p, delta = _probability(insert_probability), validate.unit_closed_open("delta", delta)
    if delta > 0.0 and p != 0.5:
        raise InputError(
            f"insert_probability must be 1/2 for an (eps, delta) claim with delta > 0 (the delta term of Steinke, "
            f"Nasr, Jagielski 2023 is proved for fair coins), got insert_probability={p} with delta={delta}; include "
            f"canaries with probability 0.5, or audit a pure eps claim (delta=0), which any probability allows")
    return p, delta


def _counts(name: str, value) -> int:
    return validate.positive_int(name, value, minimum=0)


def _scores_and_mask(scores, inserted) -> tuple[np.ndarray, np.ndarray]:
    s = validate.finite_array("scores", scores)
    if s.ndim != 1:
        raise InputError(f"scores must be 1-dimensional (one score per canary), got shape {s.shape}")
    raw = np.asarray(inserted)
    if raw.ndim != 1:
        raise InputError(f"inserted must be 1-dimensional (one flag per canary), got shape {raw.shape}")
    if raw.shape[0] != s.shape[0]:
        raise InputError(f"inserted must have one entry per score: got {raw.shape[0]} flags for {s.shape[0]} scores")
    if raw.dtype != bool:
        if not np.issubdtype(raw.dtype, np.number):
            raise InputError(f"inserted must be binary (bool or 0/1), got dtype {raw.dtype}")
        bad = np.flatnonzero((raw != 0) & (raw != 1))
        if bad.size:
            i = int(bad[0])
            raise InputError(f"inserted must be binary (bool or 0/1), got {raw[i].item()!r} at index {i}")
    return s, raw.astype(bool)


def _pair(name: str, pair, m: int) -> tuple[int, int]:
    try:
        kp, km = pair
    except (TypeError, ValueError):
        raise InputError(f"{name} must be a pair (k_plus, k_minus), got {pair!r}") from None
    kp, km = _counts(f"{name}[0] (k_plus)", kp), _counts(f"{name}[1] (k_minus)", km)
    if kp + km > m:
        raise InputError(f"{name}: k_plus + k_minus must be <= the number of canaries ({m}), got {kp} + {km}")
    if kp + km == 0:
        raise InputError(f"{name}: k_plus + k_minus must be >= 1 (at least one guess), got (0, 0)")
    return kp, km


# --- the tail bound ---------------------------------------------------------------------------------------


def _q(epsilon: float, p: float) -> tuple[float, float]:
    # P[S_i = +1 | guess +1] <= p e^eps / (p e^eps + 1 - p) under eps-DP (Bayes with the likelihood ratio <= e^eps)
    qp = 1.0 / (1.0 + (1.0 - p) / p * math.exp(-epsilon))
    qm = 1.0 / (1.0 + p / (1.0 - p) * math.exp(-epsilon))
    return qp, qm


def _delta_scale(v: int, r: int, q: float) -> float:
    """``max_{1 <= i <= v} P[v - i <= B <= v - 1] / i`` for ``B ~ Binomial(r, q)`` (0 when ``v = 0``)."""
    if v <= 0:
        return 0.0
    below = stats.binom.pmf(np.arange(v - 1, -1, -1), r, q)  # P[B = v-1], P[B = v-2], ..., P[B = 0]
    return float(np.max(np.cumsum(below) / np.arange(1, v + 1)))


def _p_value(vp: int, kp: int, vm: int, km: int, m: int, epsilon: float, delta: float, p: float) -> float:
    qp, qm = _q(epsilon, p)
    v, r = vp + vm, kp + km
    if p == 0.5:
        beta = float(stats.binom.sf(v - 1, r, qp))  # P[B >= v]
        if delta > 0.0:
            beta += 2.0 * m * delta * _delta_scale(v, r, qp)
        return min(beta, 1.0)
    # delta = 0, any p: P[B_+ + B_- >= v] = sum_j P[B_+ = j] P[B_- >= v - j]
    j = np.arange(kp + 1)
    return min(float(np.sum(stats.binom.pmf(j, kp, qp) * stats.binom.sf(v - 1 - j, km, qm))), 1.0)


def one_run_p_value(correct_plus: int, k_plus: int, correct_minus: int, k_minus: int, *, canaries: int,
                    epsilon: float, delta: float, insert_probability: float) -> float:
    """P-value of "the run is ``(epsilon, delta)``-DP" given the correct guesses (module docstring).

    Args:
      correct_plus: correct "included" guesses among the ``k_plus`` guessed included.
      k_plus: number of "included" guesses.
      correct_minus: correct "not included" guesses among the ``k_minus`` guessed not included.
      k_minus: number of "not included" guesses.
      canaries: ``m``, the number of canaries with independent coins (the ``delta`` term scales with it).
      epsilon: the claim's ``eps >= 0``.
      delta: the claim's ``delta`` in ``[0, 1)``.
      insert_probability: each canary's inclusion probability ``p`` (1/2 when ``delta > 0``).

    Returns:
      An upper bound on ``P[W >= correct_plus + correct_minus]`` under the claim, capped at 1.

    Raises:
      InputError: counts out of range (``correct <= k``, ``1 <= k_plus + k_minus <= canaries``), ``epsilon < 0``,
        ``delta`` or ``insert_probability`` out of range, or ``delta > 0`` with ``insert_probability != 1/2``.
    """
    m = validate.positive_int("canaries", canaries)
    kp, km = _pair("(k_plus, k_minus)", (k_plus, k_minus), m)
    vp, vm = _counts("correct_plus", correct_plus), _counts("correct_minus", correct_minus)
    if vp > kp:
        raise InputError(f"correct_plus must be <= k_plus ({kp}), got {vp}")
    if vm > km:
        raise InputError(f"correct_minus must be <= k_minus ({km}), got {vm}")
    eps = validate.nonnegative_float("epsilon", epsilon)
    p, d = check_design(insert_probability, delta)
    return _p_value(vp, kp, vm, km, m, eps, d, p)


def _epsilon(vp: int, kp: int, vm: int, km: int, m: int, level: float, delta: float, p: float) -> float:
    def rejected(eps):
        return _p_value(vp, kp, vm, km, m, eps, delta, p) <= level

    if not rejected(0.0):
        return 0.0
    lo, hi = 0.0, 1.0
    while rejected(hi):
        lo, hi = hi, 2.0 * hi
        if hi > _EPS_CAP:
            return lo
    for _ in range(_BISECTIONS):
        mid = 0.5 * (lo + hi)
        if rejected(mid):
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-10 * max(1.0, lo):
            break
    return lo  # checked: its p-value is <= level


def one_run_epsilon(correct_plus: int, k_plus: int, correct_minus: int, k_minus: int, *, canaries: int,
                    delta: float, alpha: float, insert_probability: float) -> float:
    """The largest ``eps >= 0`` that :func:`one_run_p_value` rejects at level ``alpha`` (0 if none).

    One pair at level ``alpha``: a family of pairs needs its own correction (:func:`one_run_audit` does it).

    Args:
      correct_plus: correct "included" guesses.
      k_plus: number of "included" guesses.
      correct_minus: correct "not included" guesses.
      k_minus: number of "not included" guesses.
      canaries: ``m``, the number of canaries with independent coins.
      delta: the claim's ``delta`` in ``[0, 1)``.
      alpha: the level, in ``(0, 1)``.
      insert_probability: each canary's inclusion probability ``p``.

    Returns:
      The lower bound on ``eps``, a float whose p-value has been checked to be ``<= alpha``.

    Raises:
      InputError: as :func:`one_run_p_value`, or ``alpha`` not in ``(0, 1)``.

    Guarantees:
      For a pair fixed before the run, the returned value exceeds the true ``eps`` with probability at most
      ``alpha`` under the assumptions of the module docstring.
    """
    a = validate.open_unit("alpha", alpha)
    one_run_p_value(correct_plus, k_plus, correct_minus, k_minus, canaries=canaries, epsilon=0.0, delta=delta,
                    insert_probability=insert_probability)  # validates everything
    return _epsilon(int(correct_plus), int(k_plus), int(correct_minus), int(k_minus), int(canaries), a,
                    float(delta), float(insert_probability))


# --- guesses from scores ----------------------------------------------------------------------------------


def _order(scores: np.ndarray) -> np.ndarray:
    # descending score, ties by canary index (fixed before the coins, so the guesses depend on the output alone)
    return np.lexsort((np.arange(scores.shape[0]), -scores))


def guess_counts(scores, inserted, pairs: Sequence[tuple[int, int]]) -> np.ndarray:
    """Correct guesses of the top-``k_+`` / bottom-``k_-`` attacker for each pair (ties broken by canary index).

    Args:
      scores: ``(m,)`` finite scores, higher = guessed included.
      inserted: ``(m,)`` inclusion flags (bool or 0/1).
      pairs: ``G`` pairs ``(k_plus, k_minus)`` with ``1 <= k_plus + k_minus <= m``.

    Returns:
      ``(G, 2)`` int64 ``(correct_plus, correct_minus)`` per pair.

    Raises:
      InputError: scores and flags of different lengths or not 1-D, non-finite scores, non-binary flags, or a pair
        out of range.
    """
    s, mask = _scores_and_mask(scores, inserted)
    m = s.shape[0]
    checked = [_pair(f"pairs[{i}]", pr, m) for i, pr in enumerate(pairs)]
    hits = np.concatenate([[0], np.cumsum(mask[_order(s)])])  # hits[k] = included among the top k
    total = int(hits[-1])
    return np.array([(int(hits[kp]), km - (total - int(hits[m - km]))) for kp, km in checked], np.int64).reshape(-1, 2)


def default_grid(canaries: int) -> tuple[tuple[int, int], ...]:
    """A declared grid for ``m`` canaries: ``k = round(f m)`` for ``f`` in 1%..50%, one-sided and symmetric.

    It depends on ``m`` alone (known before any score), so it is a valid :class:`DeclaredGrid`.

    Args:
      canaries: ``m >= 1``.

    Returns:
      The distinct pairs ``(k_plus, k_minus)`` of :data:`DEFAULT_FRACTIONS` scaled to ``m``.

    Raises:
      InputError: ``canaries`` is not a positive integer.
    """
    m = validate.positive_int("canaries", canaries)
    out = []
    for i, fractions in enumerate(DEFAULT_FRACTIONS):
        pair = _scaled(fractions, m, f"DEFAULT_FRACTIONS[{i}]")
        if pair is not None and pair not in out:
            out.append(pair)
    return tuple(out)


def _grid_result(s, mask, pairs, *, m, delta, alpha, p, rule, n_selection) -> OneRunResult:
    counts = guess_counts(s, mask, pairs)
    level = alpha / len(pairs)
    table = []
    for (kp, km), (vp, vm) in zip(pairs, counts):
        table.append((int(kp), int(km), int(vp), int(vm), _epsilon(int(vp), kp, int(vm), km, m, level, delta, p)))
    best = max(range(len(table)), key=lambda i: (table[i][4], -i))
    kp, km, vp, vm, eps = table[best]
    return OneRunResult(epsilon=eps, delta=delta, alpha=alpha, insert_probability=p, canaries=m, k_plus=kp,
                        k_minus=km, correct_plus=vp, correct_minus=vm, rule=rule, family_size=len(pairs),
                        alpha_per_pair=level, n_selection=n_selection, pairs=tuple(table))


def _scaled(fraction_pair, m: int, where: str) -> tuple[int, int] | None:
    try:
        fp, fm = (float(x) for x in fraction_pair)
    except (TypeError, ValueError):
        raise InputError(f"{where} must be a pair of fractions (f_plus, f_minus), got {fraction_pair!r}") from None
    if not (0.0 <= fp <= 1.0 and 0.0 <= fm <= 1.0 and 0.0 < fp + fm <= 1.0):
        raise InputError(f"{where} must be fractions in [0, 1] with 0 < f_plus + f_minus <= 1, got {fraction_pair!r}")
    kp, km = round(fp * m), round(fm * m)
    if fp > 0:
        kp = max(1, kp)
    if fm > 0:
        km = max(1, km)
    return (kp, km) if 1 <= kp + km <= m else None


def one_run_audit(scores, inserted, *, insert_probability: float, delta: float, alpha: float = 0.05,
                  rule: DeclaredGrid | HeldOut | None = None, key: jax.Array | None = None) -> OneRunResult:
    """One-run lower bound on ``eps`` from per-canary scores and inclusion flags (module docstring).

    Args:
      scores: ``(m,)`` finite scores from the one run, higher = "included" (e.g. a canary's log-likelihood under the
        trained model, or the private release's vote for its secret).
      inserted: ``(m,)`` the coins: ``True``/1 where the canary was included.
      insert_probability: the probability ``p`` each coin came up "included" (required: the scores cannot tell, and
        the bound depends on it).
      delta: the ``delta`` of the audited claim, in ``[0, 1)``; ``delta > 0`` requires ``p = 1/2``.
      alpha: family-wise failure probability, in ``(0, 1)``.
      rule: a :class:`DeclaredGrid` (default: :func:`default_grid` of ``m``) or :class:`HeldOut`.
      key: PRNG key of the :class:`HeldOut` split (required then; no hidden default key).

    Returns:
      A :class:`OneRunResult`; ``epsilon`` is the bound.

    Raises:
      InputError: scores and flags of different lengths or non-binary flags, a pair with ``k_plus + k_minus``
        larger than the number of canaries, ``insert_probability`` outside ``(0, 1)``, ``delta > 0`` with
        ``insert_probability != 1/2``, ``alpha`` or ``delta`` out of range, an empty or unknown rule, a
        :class:`HeldOut` split without a key or with a part too small to guess in.

    Guarantees:
      See the module docstring: ``epsilon`` exceeds the run's ``eps`` (with respect to each canary's inclusion) with
      probability at most ``alpha``, for the whole family of pairs.
    """
    s, mask = _scores_and_mask(scores, inserted)
    m = s.shape[0]
    p, d = check_design(insert_probability, delta)
    a = validate.open_unit("alpha", alpha)
    if rule is None:
        rule = DeclaredGrid(default_grid(m))
    if isinstance(rule, DeclaredGrid):
        if not rule.pairs:
            raise InputError("rule.pairs must be a non-empty grid of (k_plus, k_minus), got ()")
        pairs = tuple(_pair(f"rule.pairs[{i}]", pr, m) for i, pr in enumerate(rule.pairs))
        return _grid_result(s, mask, pairs, m=m, delta=d, alpha=a, p=p, rule="declared_grid", n_selection=0)
    if not isinstance(rule, HeldOut):
        raise InputError(f"rule must be a DeclaredGrid or HeldOut, got {type(rule).__name__}")
    if key is None:
        raise InputError("key must be a PRNG key for rule=HeldOut (no hidden default key), got None")
    frac = validate.open_unit("rule.fraction", rule.fraction)
    if not rule.candidates:
        raise InputError("rule.candidates must be a non-empty tuple of fractions (f_plus, f_minus), got ()")
    n_sel = int(round(frac * m))
    if n_sel < 1 or m - n_sel < 1:
        raise InputError(f"rule.fraction={frac} leaves an empty part of {m} canaries (selection {n_sel}, "
                         f"evaluation {m - n_sel}); use more canaries or another fraction")
    perm = np.asarray(jax.random.permutation(key, m))
    sel, ev = perm[:n_sel], np.sort(perm[n_sel:])
    best, best_eps = None, -1.0
    for i, cand in enumerate(rule.candidates):
        where = f"rule.candidates[{i}]"
        on_sel, on_ev = _scaled(cand, n_sel, where), _scaled(cand, ev.size, where)
        if on_sel is None or on_ev is None:
            continue
        (vp, vm), = guess_counts(s[sel], mask[sel], [on_sel])
        eps = _epsilon(int(vp), on_sel[0], int(vm), on_sel[1], n_sel, a, d, p)
        if eps > best_eps:
            best, best_eps = on_ev, eps
    if best is None:
        raise InputError(f"rule.candidates: no candidate gives a guess on the {n_sel} selection and {ev.size} "
                         f"evaluation canaries; use more canaries or larger fractions")
    return _grid_result(s[ev], mask[ev], (best,), m=int(ev.size), delta=d, alpha=a, p=p, rule="held_out",
                        n_selection=n_sel)
