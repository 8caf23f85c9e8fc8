"""One-run audits of DP-ICL pipelines (PV, PoE): many canaries in one private exemplar set, one run.

The design (Steinke, Nasr, Jagielski 2023, applied to DP-ICL):

* ``m`` canary **slots**, each built like the copy-mode canary of :func:`~snapaudit_jax.dpicl.pipelines.make_case`:
  an example text followed by ``"Reference code: <code>."``. Slot ``j`` holds canary ``j``'s *secret* if its
  coin ``S_j = 1`` (probability ``p``) and its *decoy* otherwise -- the replace-one neighbouring relation that
  the pipelines' calibration (:attr:`~snapaudit_jax.dpicl.pipelines.Pipeline.sensitivity`) assumes. Codes are unique
  per slot. Examples, codes and coins are drawn from the config seed before any model call
  (:func:`make_slots`).
* A **fixed partition assignment** that does not depend on the coins (:func:`partition_groups`): item ``i``
  (slots first, then ``base_exemplars`` shared non-canary exemplars) goes to partition ``i mod T`` (PV); PoE
  has one expert per item. Flipping one coin changes one partition's prompt (PV: one vote per query) or one
  expert (PoE: each utility moves by at most the clip), which is what the per-query calibration covers.
* **Query** ``j`` is the copy query for slot ``j``'s prefix, asked of every partition / expert on the *same*
  private set; its release is the pipeline's calibrated mechanism with fresh noise (key
  ``fold_in(key, j)``). Score ``j``: white-box, the release's noisy margin for "reproduced canary ``j``'s
  secret" (PV: ``noisy_0 - noisy_1``; PoE: the logistic margin, which PoE's guarantee covers); black-box,
  1 if the released label is "secret", else 0. Both depend on the releases alone.
* The auditor is :func:`snapaudit_jax.estimation.one_run.one_run_audit` (declared default grid) on the ``m`` scores.

The claim it tests is the guarantee of the **whole transcript of m answers** with respect to one exemplar,
i.e. the composition over the ``m`` queries (:func:`composed_claim`), never the per-query ``eps``:

* PV (Gaussian noise ``sigma`` on the votes, L2 sensitivity ``sqrt(2)`` under replace-one): the ``m`` vote
  vectors together are one Gaussian mechanism with sensitivity ``sqrt(2 m)``, i.e. exactly ``mu``-GDP with
  ``mu = sqrt(m) sqrt(2) / sigma`` (Dong, Roth, Su 2022, Cor. 3.3); ``eps(delta)`` from the GDP closed form,
  checked against ``dp_accounting``'s PLD accountant.
* PoE (exponential mechanism, pure ``eps0`` per query): every ``eps0``-DP mechanism is dominated by binary
  randomized response ``RR_eps0``, so the exact optimal composition (Kairouz, Oh, Viswanath 2015, Thm 3.3)
  is that of ``m`` RR's: privacy loss ``eps0 (2B - m)`` with ``B ~ Binomial(m, e^eps0 / (1 + e^eps0))``;
  ``eps(delta)`` from that closed form, checked against ``dp_accounting``'s PLD of ``(eps0, 0)``-DP.
* Basic composition ``(m eps0, m delta0)`` is reported for reference.

Interaction inside one prompt (power, not validity): a PV partition prompt holds ``~m / T`` canary slots, so
to answer query ``j`` the model must find slot ``j`` among them and copy its code; neighbouring slots compete
for its attention and copying, and a small model copies less reliably from a long, code-dense context.
That lowers the gap between "secret" and "decoy" scores, i.e. the bound's power. Validity needs only DP
with respect to each coin with the others held fixed, which the fixed assignment and the calibration give
however the canaries interact. PoE's experts see one exemplar each, so its canaries do not share a prompt.

Guarantees:
  With probability at least ``1 - alpha`` over the coins and the DP noise, each reported one-run
  ``epsilon`` is at most the ``eps`` of every ``(eps, delta)`` guarantee that the ``m`` releases have together
  with respect to one slot's content (replace-one), provided the pipeline's per-query guarantee holds for
  the fixed assignment (greedy, deterministic clean answers; see the determinism check of Phase A) and the
  coins are independent with the stated ``p``. A bound above the composed claim is a violation.

References:
  Steinke, Nasr, Jagielski, "Privacy Auditing with One (1) Training Run", NeurIPS 2023; Kairouz, Oh,
  Viswanath, "The Composition Theorem for Differential Privacy", ICML 2015; Dong, Roth, Su, "Gaussian
  Differential Privacy", JRSS-B 2022.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from scipy import optimize, stats

from snapaudit_jax.mechanisms.noise import gdp_epsilon
from snapaudit_jax.dpicl.data import Example
from snapaudit_jax.estimation import is_violation
from snapaudit_jax.mechanisms import Attack
from snapaudit_jax.estimation.one_run import DeclaredGrid, check_design, default_grid, one_run_audit, one_run_epsilon
from snapaudit_jax.utils import validate
from snapaudit_jax.utils.config import ConfigFileError
from snapaudit_jax.utils.config import choice as _choice
from snapaudit_jax.utils.config import choices as _choices
from snapaudit_jax.utils.config import number_list as _number_list
from snapaudit_jax.utils.config import pos_int as _pos_int
from snapaudit_jax.utils.config import reject_unknown as _reject_unknown
from snapaudit_jax.utils.config import string as _string
from snapaudit_jax.utils.config import take as _take
from snapaudit_jax.utils.errors import InputError

__all__ = ["OneRunConfig", "CanarySlots", "parse_config", "make_slots", "partition_groups",
           "gaussian_composition", "pure_composition", "composed_claim", "one_run_pipeline", "format_section",
           "ceiling", "INTERACTION_NOTE", "GUARANTEES"]

ONE_RUN_PIPELINES = ("pv", "poe")
INTERACTION_NOTE = (
    "Canaries share a PV partition prompt (about m/T slots each): to answer query j the model must find slot j "
    "among them and copy its code, so neighbouring canaries compete for its attention and copying; this costs "
    "power (a smaller secret/decoy score gap), not validity, which needs only DP with respect to each canary's "
    "coin with the other coins held fixed. PoE's experts see one exemplar each, so its canaries do not interact.")
GUARANTEES = (
    "With probability >= 1 - alpha over the coins and the DP noise, each one-run epsilon is at most the eps of every "
    "(eps, delta) guarantee the m releases have together with respect to one slot's content (replace-one), given "
    "the per-query guarantee for the fixed, coin-independent assignment (deterministic greedy clean answers) and "
    "independent coins with the stated insert_probability; a bound above the composed claim is a violation.")
_STREAM = {"pv": 1, "poe": 2}  # noise-key streams per pipeline


@dataclasses.dataclass(frozen=True)
class OneRunConfig:
    """``[one_run]``: the one-run (many-canary) audit of PV / PoE.

    Attributes:
      canaries: ``m``, PV's canary slots (>= 2).
      poe_canaries: PoE's canary slots (its model calls grow as ``m (m + base_exemplars)``; default ``canaries``).
      insert_probability: ``p``, each slot's probability of holding its secret, in ``(0, 1)``.
      delta: the audited ``delta`` of the composed claim, in ``[0, 1)``; ``delta > 0`` needs ``p = 1/2`` (the
        one-run theorem's rule). Its ``delta`` term is ``2 m delta``: keep it small.
      alpha: family-wise failure probability of the bound, in ``(0, 1)``.
      pipelines: subset of ``pv``, ``poe``.
      epsilons: per-query ``eps`` the pipelines are calibrated for (default: ``audit.epsilons``).
      threats: ``black`` and/or ``white`` (default: ``audit.threats``).
      partitions: PV's ``T`` (slot ``j`` and base exemplar ``b`` go to partition ``index mod T``).
      base_exemplars: fixed non-canary exemplars added to the private set (>= 0).
      clip: PoE's ``Gamma`` (default: ``pipelines.poe.clip``, else 5).
      dataset: the dataset the slot texts come from (default: AG News).
      data_path: its local file or folder, ``"hub"``, or ``None`` (the demo data).
      seed: seed of the slots, codes, coins and DP noise (default: ``audit.seed``).
      pairs: the declared ``(k_plus, k_minus)`` guesses, fixed before the run (default: the library's
        :func:`~snapaudit_jax.estimation.one_run.default_grid` of each pipeline's ``m``); the union bound covers
        them all, so one pair reaches further with few canaries. ``"all"``: the one pair ``(m // 2, m - m // 2)``
        of each pipeline's ``m`` (every canary guessed).
    """

    canaries: int = 32
    poe_canaries: int | None = None
    insert_probability: float = 0.5
    delta: float = 1e-6
    alpha: float = 0.05
    pipelines: tuple[str, ...] = ONE_RUN_PIPELINES
    epsilons: tuple[float, ...] = (1.0, 4.0, 16.0)
    threats: tuple[str, ...] = ("black", "white")
    partitions: int = 4
    base_exemplars: int = 0
    clip: float = 5.0
    dataset: str = "agnews"
    data_path: str | None = None
    seed: int = 0
    pairs: tuple[tuple[int, int], ...] | str | None = None

    def pairs_for(self, pipeline: str) -> tuple[tuple[int, int], ...] | None:
        """The declared pairs of ``pipeline``.

        Args:
          pipeline: ``"pv"`` or ``"poe"``.

        Returns:
          ``pairs``; for ``"all"`` the one pair ``(m // 2, m - m // 2)`` of the pipeline's ``m``; ``None``: the
          library's default grid of its ``m``.
        """
        if self.pairs == "all":
            m = self.slots_for(pipeline)
            return ((m // 2, m - m // 2),)
        return self.pairs

    def slots_for(self, pipeline: str) -> int:
        """The number of canary slots ``m`` of ``pipeline``.

        Args:
          pipeline: ``"pv"`` or ``"poe"``.

        Returns:
          ``poe_canaries`` for ``"poe"`` when set, else ``canaries``.
        """
        return self.poe_canaries if pipeline == "poe" and self.poe_canaries is not None else self.canaries


def _pairs(value) -> tuple[tuple[int, int], ...] | str:
    if value == "all":
        return "all"
    if not isinstance(value, (list, tuple)) or not value:
        raise InputError(f"pairs must be \"all\" or a non-empty list of [k_plus, k_minus] pairs, got {value!r}")
    out = []
    for i, pair in enumerate(value):
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise InputError(f"pairs[{i}] must be a pair [k_plus, k_minus], got {pair!r}")
        kp = validate.positive_int(f"pairs[{i}][0] (k_plus)", pair[0], minimum=0)
        km = validate.positive_int(f"pairs[{i}][1] (k_minus)", pair[1], minimum=0)
        if kp + km == 0:
            raise InputError(f"pairs[{i}] must make at least one guess (k_plus + k_minus >= 1), got {pair!r}")
        out.append((kp, km))
    return tuple(out)


def parse_config(section: dict, *, epsilons: tuple[float, ...], threats: tuple[str, ...], clip: float,
                   seed: int) -> OneRunConfig:
    """Validates a ``[one_run]`` TOML table (consumed: known keys are popped).

    Args:
      section: the parsed table.
      epsilons: default of ``epsilons`` (``audit.epsilons``).
      threats: default of ``threats`` (``audit.threats``).
      clip: default of ``clip`` (``pipelines.poe.clip``, else 5).
      seed: default of ``seed`` (``audit.seed``).

    Returns:
      The :class:`OneRunConfig`.

    Raises:
      ConfigFileError: an unknown key, or a value out of range; the message names ``one_run.<key>``, the rule and
        the value. ``delta > 0`` with ``insert_probability != 1/2`` is refused here, before any model call, by the
        one-run library's own rule.
    """
    from snapaudit_jax.dpicl.data import DATASETS

    w = "one_run"
    s = dict(section)
    kw: dict[str, Any] = {}
    kw["canaries"] = _take(s, "canaries", w, _pos_int("canaries", 2), 32)
    kw["poe_canaries"] = _take(s, "poe_canaries", w, _pos_int("poe_canaries", 2), None)
    kw["insert_probability"] = _take(s, "insert_probability", w,
                                     lambda v: validate.open_unit("insert_probability", v), 0.5)
    kw["delta"] = _take(s, "delta", w, lambda v: validate.unit_closed_open("delta", v), 1e-6)
    kw["alpha"] = _take(s, "alpha", w, lambda v: validate.open_unit("alpha", v), 0.05)
    kw["pipelines"] = _take(s, "pipelines", w, _choices(ONE_RUN_PIPELINES), ONE_RUN_PIPELINES)
    if s.get("epsilons") == []:
        raise ConfigFileError(f"{w}.epsilons: must list at least one epsilon, got []")
    kw["epsilons"] = _take(s, "epsilons", w, _number_list(lambda e: validate.positive_float("epsilon", e)), epsilons)
    kw["threats"] = _take(s, "threats", w, _choices(("black", "white")), threats)
    kw["partitions"] = _take(s, "partitions", w, _pos_int("partitions"), 4)
    kw["base_exemplars"] = _take(s, "base_exemplars", w, _pos_int("base_exemplars", 0), 0)
    kw["clip"] = _take(s, "clip", w, lambda v: validate.positive_float("clip", v), clip)
    kw["dataset"] = _take(s, "dataset", w, _choice(tuple(DATASETS)), "agnews")
    kw["data_path"] = _take(s, "data_path", w, _string, None)
    kw["seed"] = _take(s, "seed", w, _pos_int("seed", 0), seed)
    kw["pairs"] = _take(s, "pairs", w, _pairs, None)
    _reject_unknown(s, w)
    if kw["pairs"] not in (None, "all"):
        smallest = min(kw["canaries"], kw["poe_canaries"] or kw["canaries"]) if "poe" in kw["pipelines"] \
            else kw["canaries"]
        for i, (kp, km) in enumerate(kw["pairs"]):
            if kp + km > smallest:
                raise ConfigFileError(f"{w}.pairs[{i}]: k_plus + k_minus must be <= the number of canaries "
                                      f"({smallest}), got {kp} + {km}")
    if kw["partitions"] > kw["canaries"] + kw["base_exemplars"]:
        raise ConfigFileError(f"{w}.partitions: must be <= canaries + base_exemplars = "
                              f"{kw['canaries'] + kw['base_exemplars']} (every partition needs an exemplar), "
                              f"got {kw['partitions']}")
    try:  # the one-run library's design rule (delta > 0 needs p = 1/2)
        check_design(kw["insert_probability"], kw["delta"])
    except ValueError as err:
        raise ConfigFileError(f"{w}.insert_probability: {err}") from None
    return OneRunConfig(**kw)


# ---------------------------------------------------------------------------
# Slots, coins and partitions
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class CanarySlots:
    """``m`` canary slots, the fixed base exemplars and the coins.

    Attributes:
      canaries: ``(m,)`` slot texts with their secret (``"... Reference code: <secret>."``).
      decoys: ``(m,)`` the same texts with the decoy code.
      secrets: ``(m,)`` the secret codes.
      decoy_codes: ``(m,)`` the decoy codes (all ``2 m`` codes distinct).
      prefixes: ``(m,)`` copy queries: the slot text up to ``"Reference code:"``.
      base: fixed non-canary exemplars.
      coins: ``(m,)`` ``True`` where the slot holds its secret.
    """

    canaries: tuple[Example, ...]
    decoys: tuple[Example, ...]
    secrets: tuple[str, ...]
    decoy_codes: tuple[str, ...]
    prefixes: tuple[str, ...]
    base: tuple[Example, ...]
    coins: tuple[bool, ...]

    @property
    def size(self) -> int:
        """The number of slots ``m``."""
        return len(self.canaries)

    def realized(self, coins: Sequence[bool] | None = None) -> tuple[Example, ...]:
        """The private set: slot ``j`` holds its canary or decoy by coin ``j``, then the base exemplars.

        Args:
          coins: ``(m,)`` coins to use instead of :attr:`coins` (``None``: the drawn ones).

        Returns:
          The ``m + len(base)`` exemplars, slots first.

        Raises:
          InputError: ``coins`` does not have one entry per slot.
        """
        coins = self.coins if coins is None else tuple(bool(c) for c in coins)
        if len(coins) != self.size:
            raise InputError(f"coins must have one entry per slot ({self.size}), got {len(coins)}")
        return tuple(c if s else d for c, d, s in zip(self.canaries, self.decoys, coins)) + self.base


def make_slots(examples: Sequence[Example], *, canaries: int, base_exemplars: int, insert_probability: float,
               seed: int) -> CanarySlots:
    """Draws ``canaries`` slots, ``base_exemplars`` base exemplars, the codes and the coins (no model call).

    Args:
      examples: the pool (e.g. :func:`~snapaudit_jax.dpicl.data.load_examples`).
      canaries: ``m >= 2``.
      base_exemplars: ``>= 0``.
      insert_probability: ``p`` in ``(0, 1)``.
      seed: ``>= 0``.

    Returns:
      :class:`CanarySlots`; the ``m + base_exemplars`` texts have distinct contents, the ``2 m`` codes are
      distinct, and coin ``j`` is ``U_j < p`` for i.i.d. uniforms of the stream ``default_rng([seed, 2])``.

    Raises:
      InputError: an argument out of range, or fewer than ``m + base_exemplars`` distinct examples.
    """
    from snapaudit_jax.dpicl.data import sample_audit_context
    from snapaudit_jax.dpicl.pipelines import prompts as P

    m = validate.positive_int("canaries", canaries, minimum=2)
    b = validate.positive_int("base_exemplars", base_exemplars, minimum=0)
    p = validate.open_unit("insert_probability", insert_probability)
    seed = validate.positive_int("seed", seed, minimum=0)
    try:
        ctx = sample_audit_context(examples, num_exemplars=m + b - 1, seed=seed)
    except ValueError as err:
        raise InputError(f"canaries + base_exemplars = {m + b} distinct examples are needed: {err}") from None
    pool = (ctx.canary, *ctx.without_canary)  # m + b distinct contents
    rng = np.random.default_rng([seed, 1])
    digits = rng.choice(9000, size=2 * m, replace=False) + 1000  # distinct numbers: distinct codes
    secrets, decoys_c = [], []
    for j in range(m):
        w = rng.choice(len(P.SECRET_WORDS), size=4, replace=False)
        secrets.append(f"{P.SECRET_WORDS[w[0]]} {P.SECRET_WORDS[w[1]]} {digits[2 * j]}")
        decoys_c.append(f"{P.SECRET_WORDS[w[2]]} {P.SECRET_WORDS[w[3]]} {digits[2 * j + 1]}")
    coins = np.random.default_rng([seed, 2]).random(m) < p

    def coded(ex, code, j, suffix):
        return dataclasses.replace(ex, text=f"{ex.text} {P.SECRET_LEAD} {code}.", id=f"{ex.id}-slot{j}-{suffix}")

    return CanarySlots(
        canaries=tuple(coded(pool[j], secrets[j], j, "canary") for j in range(m)),
        decoys=tuple(coded(pool[j], decoys_c[j], j, "decoy") for j in range(m)),
        secrets=tuple(secrets), decoy_codes=tuple(decoys_c),
        prefixes=tuple(f"{pool[j].text} {P.SECRET_LEAD}" for j in range(m)),
        base=tuple(pool[m:]), coins=tuple(bool(c) for c in coins))


def partition_groups(slots: CanarySlots, pipeline: str, partitions: int,
                     coins: Sequence[bool] | None = None) -> list[tuple[Example, ...]]:
    """The fixed groups the model answers on: PV ``T`` partitions (item ``i`` -> ``i mod T``), PoE one per item.

    The assignment depends on the item indices alone, never on the coins, so flipping coin ``j`` changes exactly
    one group: partition ``j mod T`` (PV) or expert ``j`` (PoE).

    Args:
      slots: the canary slots.
      pipeline: ``"pv"`` or ``"poe"``.
      partitions: PV's ``T`` (ignored for PoE).
      coins: coins to realise the private set with (``None``: the slots' own).

    Returns:
      The groups, each a tuple of exemplars in item order.

    Raises:
      InputError: an unknown pipeline, ``partitions`` outside ``[1, number of items]``, or ``coins`` of the wrong
        length.
    """
    items = slots.realized(coins)
    if pipeline == "poe":
        return [(e,) for e in items]
    if pipeline != "pv":
        raise InputError(f"pipeline must be one of {', '.join(ONE_RUN_PIPELINES)}, got {pipeline!r}")
    t = validate.positive_int("partitions", partitions)
    if t > len(items):
        raise InputError(f"partitions must be <= the number of exemplars ({len(items)}), got {t}")
    return [tuple(items[i] for i in range(t_, len(items), t)) for t_ in range(t)]


# ---------------------------------------------------------------------------
# The composed claim
# ---------------------------------------------------------------------------


def gaussian_composition(sigma: float, sensitivity: float, queries: int, delta: float) -> dict:
    """``queries`` Gaussian releases with noise ``sigma`` and L2 sensitivity ``sensitivity``, composed.

    Args:
      sigma: noise standard deviation ``> 0``.
      sensitivity: L2 sensitivity of one release ``> 0``.
      queries: ``m >= 1``.
      delta: the ``delta`` at which ``eps`` is reported, in ``[0, 1)``.

    Returns:
      ``{"mu", "epsilon_gdp", "epsilon_pld"}``: ``mu = sqrt(m) sensitivity / sigma`` (the composition is exactly
      ``mu``-GDP; Dong, Roth, Su 2022, Cor. 3.3), ``eps(delta)`` of ``G_mu`` (closed form) and of
      ``dp_accounting``'s PLD accountant (pessimistic discretisation, so ``>=`` the closed form).
      ``delta = 0`` gives ``eps = inf`` for both.

    Raises:
      InputError: an argument out of range.
    """
    import dp_accounting
    from dp_accounting.pld import PLDAccountant

    sigma = validate.positive_float("sigma", sigma)
    sens = validate.positive_float("sensitivity", sensitivity)
    m = validate.positive_int("queries", queries)
    d = validate.unit_closed_open("delta", delta)
    mu = math.sqrt(m) * sens / sigma
    if d == 0.0:
        return {"mu": mu, "epsilon_gdp": math.inf, "epsilon_pld": math.inf}
    # GaussianDpEvent is sensitivity 1 under ADD_OR_REMOVE_ONE (REPLACE_ONE would double it); the replace-one
    # sensitivity of the votes is in the noise multiplier sigma / sensitivity.
    acc = PLDAccountant(dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)
    acc.compose(dp_accounting.GaussianDpEvent(sigma / sens), m)
    return {"mu": mu, "epsilon_gdp": gdp_epsilon(mu, d), "epsilon_pld": float(acc.get_epsilon(d))}


def _kov_delta(epsilon: float, eps0: float, m: int) -> float:
    # Kairouz, Oh, Viswanath 2015, Thm 3.3: m-fold RR_eps0, loss eps0 (2B - m), B ~ Bin(m, e^eps0 / (1 + e^eps0))
    b = np.arange(m + 1)
    logp = stats.binom.logpmf(b, m, 1.0 / (1.0 + math.exp(-eps0)))
    loss = eps0 * (2 * b - m)
    keep = loss > epsilon
    return float(np.sum(np.exp(logp[keep]) * -np.expm1(epsilon - loss[keep])))


def pure_composition(epsilon: float, queries: int, delta: float) -> dict:
    """``queries`` pure ``epsilon``-DP releases, composed optimally (any such mechanism is dominated by RR).

    Args:
      epsilon: per-query ``eps0 > 0``.
      queries: ``m >= 1``.
      delta: the ``delta`` at which ``eps`` is reported, in ``[0, 1)``.

    Returns:
      ``{"epsilon_kov", "epsilon_pld"}``: the smallest ``eps`` with ``delta(eps) <= delta`` under the exact optimal
      composition (Kairouz, Oh, Viswanath 2015, Thm 3.3; at ``delta = 0`` it is ``m eps0``) and
      ``dp_accounting``'s PLD of an ``(eps0, 0)``-DP mechanism self-composed ``m`` times (its ``PLDAccountant`` is
      not used: in dp_accounting 0.4 it ignores the count of a composed ``RandomizedResponseDpEvent``).

    Raises:
      InputError: an argument out of range.
    """
    from dp_accounting.pld import common
    from dp_accounting.pld import privacy_loss_distribution as pld

    e0 = validate.positive_float("epsilon", epsilon)
    m = validate.positive_int("queries", queries)
    d = validate.unit_closed_open("delta", delta)
    if d == 0.0:
        return {"epsilon_kov": m * e0, "epsilon_pld": m * e0}
    if _kov_delta(0.0, e0, m) <= d:
        kov = 0.0
    else:
        kov = float(optimize.brentq(lambda e: _kov_delta(e, e0, m) - d, 0.0, m * e0, xtol=1e-12, maxiter=500))
    dist = pld.from_privacy_parameters(common.DifferentialPrivacyParameters(e0, 0.0)).self_compose(m)
    return {"epsilon_kov": kov, "epsilon_pld": float(dist.get_epsilon_for_delta(d))}


def composed_claim(pipeline: str, mechanism, *, epsilon: float, delta0: float, sensitivity: float, queries: int,
                   delta: float) -> dict:
    """The claim of the whole run: ``m`` queries of the pipeline's calibrated mechanism, composed.

    Args:
      pipeline: ``"pv"`` (Gaussian composition of the mechanism's float32 ``sigma``) or ``"poe"`` (pure
        composition of ``epsilon``; ``mechanism`` and ``sensitivity`` unused).
      mechanism: the calibrated per-query mechanism (PV: a ``PrivateVoting``).
      epsilon: the per-query ``eps0``.
      delta0: the per-query ``delta`` of PV's calibration (for the basic composition).
      sensitivity: PV's L2 sensitivity of one release.
      queries: ``m``.
      delta: the ``delta`` at which the composed ``epsilon`` is reported.

    Returns:
      ``{"composition", "epsilon", "epsilon_check", "basic_epsilon", "basic_delta", ...}``: ``epsilon`` is the
      compared claim at ``delta`` (PV: exact GDP; PoE: exact KOV), ``epsilon_check`` the PLD accountant's,
      ``basic_*`` basic composition of the per-query ``(eps0, delta0)`` (PoE: ``delta0 = 0``); PV adds ``mu`` and
      ``sigma``.

    Raises:
      InputError: an argument out of range (see :func:`gaussian_composition`, :func:`pure_composition`).
    """
    m = queries
    if pipeline == "pv":
        sigma = float(mechanism.sigma)  # the float32 sigma the release uses
        c = gaussian_composition(sigma, sensitivity, m, delta)
        return {"composition": f"Gaussian, exact: mu = sqrt(m) * {sensitivity:.4g} / sigma (GDP); PLD check",
                "epsilon": c["epsilon_gdp"], "epsilon_check": c["epsilon_pld"], "mu": c["mu"], "sigma": sigma,
                "basic_epsilon": m * epsilon, "basic_delta": m * delta0}
    c = pure_composition(epsilon, m, delta)
    return {"composition": "pure eps0 per query, exact optimal (Kairouz-Oh-Viswanath via RR); PLD check",
            "epsilon": c["epsilon_kov"], "epsilon_check": c["epsilon_pld"], "basic_epsilon": m * epsilon,
            "basic_delta": 0.0}


# ---------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------


def _cases(slots: CanarySlots, spec):
    from snapaudit_jax.dpicl.data import AuditContext
    from snapaudit_jax.dpicl.pipelines import AuditCase

    items = slots.realized()
    for j in range(slots.size):
        others = items[:j] + items[j + 1:]
        ctx = AuditContext(slots.canaries[j], slots.decoys[j], others, min(j, len(others)))
        yield AuditCase(spec, "copy", ctx, slots.prefixes[j], slots.secrets[j], slots.decoy_codes[j])


def clean_answers(pipeline: str, slots: CanarySlots, settings: OneRunConfig, oracle, spec, *, defense: str,
                  log=None) -> tuple[np.ndarray, Any]:
    """The clean outputs of the ``m`` queries on the realised private set, and the last pipeline built.

    PV: votes ``(reproduced secret j, not)`` over the ``T`` fixed partitions; PoE: clipped log-prob sums of
    ``(secret j, decoy j)`` over one expert per exemplar. Greedy decoding: each is the exact clean output.

    Args:
      pipeline: ``"pv"`` or ``"poe"``.
      slots: the canary slots (their coins realise the private set).
      settings: the ``[one_run]`` settings (``partitions``, ``clip``).
      oracle: the :class:`~snapaudit_jax.models.oracle.LLMOracle`.
      spec: the dataset spec.
      defense: the pipelines' defense.
      log: progress callable, optional.

    Returns:
      ``(clean, pipeline)``: ``(m, 2)`` float64 clean outputs, and the pipeline of the last query (to calibrate
      the mechanism with).
    """
    from snapaudit_jax.dpicl.pipelines import PrivateVotingPipeline, ProductOfExpertsPipeline

    groups = partition_groups(slots, pipeline, settings.partitions)
    out, pipe = [], None
    for j, case in enumerate(_cases(slots, spec)):
        if pipeline == "pv":
            pipe = PrivateVotingPipeline(oracle, case, partitions=len(groups), defense=defense)
        else:
            pipe = ProductOfExpertsPipeline(oracle, case, clip=settings.clip, defense=defense)
        out.append(pipe.aggregate(pipe.answers(groups)))
        if log is not None and ((j + 1) % max(1, slots.size // 8) == 0 or j + 1 == slots.size):
            log(f"    queries {j + 1}/{slots.size} answered")
    return np.stack(out).astype(np.float64), pipe


@jax.jit
def _release(mechanism, clean: jax.Array, key: jax.Array) -> tuple[jax.Array, jax.Array]:
    attack = Attack(jnp.array([1.0, 0.0], jnp.float32), jnp.array([0.0, 1.0], jnp.float32), 0)

    def one(j, c):
        prepared = mechanism.prepare(c, attack)
        noise = jax.tree_util.tree_map(lambda x: x[..., 0], mechanism.noise(jax.random.fold_in(key, j), 1, prepared))
        return mechanism.outcome(noise, prepared, attack)

    return jax.vmap(one)(jnp.arange(clean.shape[0]), clean)


def release_scores(mechanism, clean, key: jax.Array) -> tuple[np.ndarray, np.ndarray]:
    """``(hits, margins)`` of one release per query, query ``j`` with key ``fold_in(key, j)``.

    Args:
      mechanism: a calibrated :class:`~snapaudit_jax.mechanisms.base.PrivateVoting` or
        :class:`~snapaudit_jax.mechanisms.base.ProductOfExperts`.
      clean: ``(m, 2)`` clean outputs (label 0 = "secret j").
      key: the run's PRNG key.

    Returns:
      ``hits`` ``(m,)`` bool: the released label is "secret j" (black-box); ``margins`` ``(m,)`` float64: the
      white-box statistic the mechanism's guarantee covers (PV ``noisy_0 - noisy_1``; PoE the logistic margin).
      Each has exactly the distribution of the release (the simulator protocol of
      :mod:`snapaudit_jax.mechanisms.base`).

    Raises:
      InputError: ``clean`` not of shape ``(m, 2)`` or not finite.
    """
    c = validate.finite_array("clean", clean)
    if c.ndim != 2 or c.shape[1] != 2:
        raise InputError(f"clean must have shape (m, 2) (one clean output per query), got {c.shape}")
    hits, scores = _release(mechanism, jnp.asarray(c, jnp.float32), key)
    return np.asarray(hits), np.asarray(scores, np.float64)


def one_run_pipeline(pipeline: str, settings: OneRunConfig, oracle, examples, spec, *, delta0: float,
                     calibration: str, defense: str, log=None) -> list[dict]:
    """One-run audits of ``pipeline`` at every ``settings.epsilons`` (one clean pass, one release per eps).

    Args:
      pipeline: ``pv`` or ``poe``.
      settings: the ``[one_run]`` settings.
      oracle: the :class:`~snapaudit_jax.dpicl.pipelines.LLMOracle` (cached: reruns compute nothing).
      examples: the dataset's examples (the slot texts are drawn from them).
      spec: the dataset spec.
      delta0: the per-query ``delta`` the PV noise is calibrated for (``audit.delta``).
      calibration: PV's Gaussian calibration (``analytic`` or ``classical``).
      defense: the pipelines' defense.
      log: progress callable, optional.

    Returns:
      One dict per ``eps`` with the slots' coins, the composed claim, and per threat the
      :class:`~snapaudit_jax.estimation.one_run.OneRunResult` fields and ``violation``.

    Raises:
      InputError: invalid settings or too few distinct examples for the slots (see :func:`make_slots`).

    Guarantees:
      See the module docstring; the coins and the DP keys are fixed before any model call.
    """
    m = settings.slots_for(pipeline)
    declared = settings.pairs_for(pipeline)
    slots = make_slots(examples, canaries=m, base_exemplars=settings.base_exemplars,
                       insert_probability=settings.insert_probability, seed=settings.seed)
    coins = np.array(slots.coins)
    calls0, t0 = oracle.stats.calls, time.perf_counter()
    progress, oracle.progress = oracle.progress, None
    try:
        clean, pipe = clean_answers(pipeline, slots, settings, oracle, spec, defense=defense, log=log)
    finally:
        oracle.progress = progress
    calls, llm_seconds = oracle.stats.calls - calls0, time.perf_counter() - t0
    groups = len(partition_groups(slots, pipeline, settings.partitions))
    rows = []
    for eps in settings.epsilons:
        t1 = time.perf_counter()
        mech = pipe.mechanism(eps, delta0, calibration)
        claim = composed_claim(pipeline, mech, epsilon=eps, delta0=delta0, sensitivity=pipe.sensitivity,
                               queries=m, delta=settings.delta)
        key = jax.random.fold_in(jax.random.fold_in(jax.random.key(settings.seed), _STREAM[pipeline]),
                                 int(round(eps * 1000)))
        hits, margins = release_scores(mech, clean, key)
        threats = {}
        for threat in settings.threats:
            scores = margins if threat == "white" else hits.astype(np.float64)
            res = one_run_audit(scores, coins, insert_probability=settings.insert_probability,
                                delta=settings.delta, alpha=settings.alpha,
                                rule=DeclaredGrid(declared) if declared else None)
            threats[threat] = {**res.to_dict(), "violation": is_violation(res.epsilon, claim["epsilon"])}
        rows.append({
            "pipeline": pipeline, "epsilon_per_query": float(eps), "delta_per_query": delta0 if pipeline == "pv"
            else 0.0, "canaries": m, "groups": groups, "base_exemplars": settings.base_exemplars,
            "insert_probability": settings.insert_probability, "delta": settings.delta, "alpha": settings.alpha,
            "claim": claim, "threats": threats, "llm_calls": int(calls),
            "seconds": float(llm_seconds + time.perf_counter() - t1),
            "ceiling": ceiling(m, delta=settings.delta, alpha=settings.alpha,
                               insert_probability=settings.insert_probability, pairs=declared),
            "inserted": int(coins.sum()), "coins": coins.astype(int).tolist(),
            "clean_secret_rate": _secret_rate(pipeline, clean, coins)})
    return rows


def ceiling(canaries: int, *, delta: float, alpha: float, insert_probability: float,
            pairs: Sequence[tuple[int, int]] | None = None) -> float:
    """The largest bound the declared grid can give for ``canaries`` (every guess right): the design's reach.

    With few canaries it is 0 (e.g. ``m = 4``, ``alpha = 0.05``; ``m = 12`` reaches 0.71): no outcome of the run
    can then show ``eps > 0``, however much the pipeline leaks.

    Args:
      canaries: ``m``.
      delta: the audited ``delta``.
      alpha: family-wise failure probability, split evenly over the pairs.
      insert_probability: ``p``.
      pairs: the declared ``(k_plus, k_minus)`` grid (default:
        :func:`~snapaudit_jax.estimation.one_run.default_grid` of ``canaries``).

    Returns:
      The largest one-run ``epsilon`` over the pairs, each with all its guesses correct.
    """
    pairs = tuple(pairs) if pairs else default_grid(canaries)
    level = alpha / len(pairs)
    return max(one_run_epsilon(kp, kp, km, km, canaries=canaries, delta=delta, alpha=level,
                               insert_probability=insert_probability) for kp, km in pairs)


def _secret_rate(pipeline: str, clean: np.ndarray, coins: np.ndarray) -> dict:
    """How clearly the clean answers separate the coins (diagnostic of power, not part of the bound)."""
    signal = clean[:, 0] if pipeline == "pv" else clean[:, 0] - clean[:, 1]
    return {"mean_with_secret": float(signal[coins].mean()) if coins.any() else None,
            "mean_with_decoy": float(signal[~coins].mean()) if (~coins).any() else None,
            "signal": "votes for the secret" if pipeline == "pv" else "utility margin secret - decoy"}


def _num(x: float | None, spec: str = ".2f") -> str:
    if x is None or (isinstance(x, float) and math.isinf(x)):
        return "inf"
    return format(x, spec)


def format_section(rows: list[dict], snapshot_rows: list[dict]) -> str:
    """The ``table.md`` section: one line per pipeline and eps, next to the snapshot audit's numbers.

    Args:
      rows: the one-run rows (:func:`one_run_pipeline`).
      snapshot_rows: the ``results.json`` rows of the snapshot audits (their active rows are shown alongside).

    Returns:
      The Markdown section, or ``""`` without rows.
    """
    if not rows:
        return ""
    r0 = rows[0]
    lines = ["## One-run audit (many canaries, one run)", "",
             f"m canaries in one private exemplar set, each holding its secret with probability "
             f"{r0['insert_probability']:g}, one copy query per canary; the bound tests the composed claim of the "
             f"m answers at delta = {r0['delta']:g} (one-run delta term 2 m delta), alpha = {r0['alpha']:g}. "
             f"{INTERACTION_NOTE}", "",
             "| pipeline | eps/query | composition | composed eps | one-run black | one-run white | k+/k- (white) "
             "| correct (white) | m | ceiling | groups | calls | snapshot active black/white | snapshot calls |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        t = r["threats"]
        ref = {row["threat"]: row for row in snapshot_rows
               if row["pipeline"] == r["pipeline"] and row["mode"] == "active"
               and abs(row["epsilon_theory"] - r["epsilon_per_query"]) < 1e-12}
        snap = "/".join(f"{ref[k]['epsilon_emp']:.2f}" if k in ref else "-" for k in ("black", "white"))
        snap_calls = next((str(v["llm_calls"]) for v in ref.values()), "-")
        w = t.get("white")
        kk = f"{w['k_plus']}/{w['k_minus']}" if w else "-"
        cc = f"{w['correct_plus'] + w['correct_minus']}" if w else "-"
        comp = "GDP (PLD)" if r["pipeline"] == "pv" else "KOV (PLD)"
        flags = ["black", "white"]
        cells = []
        for k in flags:
            cells.append(f"{t[k]['epsilon']:.2f}{' VIOLATION' if t[k]['violation'] else ''}" if k in t else "-")
        lines.append(f"| {r['pipeline']} | {r['epsilon_per_query']:g} | {comp} | {_num(r['claim']['epsilon'])} "
                     f"({_num(r['claim']['epsilon_check'])}) | {cells[0]} | {cells[1]} | {kk} | {cc} "
                     f"| {r['canaries']} | {r['ceiling']:.2f} | {r['groups']} | {r['llm_calls']} | {snap} "
                     f"| {snap_calls} |")
    lines += ["", "composed eps: the claim of the m answers together at the audited delta (exact GDP for PV, exact "
              "Kairouz-Oh-Viswanath composition for PoE; dp_accounting PLD in brackets); one-run entries are "
              "lower bounds on it (violation only if above it), never compared with the per-query eps. groups: PV "
              "partitions / PoE experts. ceiling: the bound if every guess were right (the reach of m canaries). "
              "See one_run.json for coins, guesses and assumptions.", ""]
    return "\n".join(lines)
