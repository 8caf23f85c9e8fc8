"""Run descriptions and their interpretation: ``SimulateConfig -> [AuditResult]``.

The command line parses flags into a :class:`SimulateConfig` and calls
:func:`run_simulate`; library users can do the same.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import numpy as np

from snapaudit_jax.audits.active import CLEAN_MODELS, CURVE_POINTS, METHODS, THREATS, AuditResult, audit
from snapaudit_jax.estimation import check_estimator, holm, mu_violation_p_value, violation_p_value
from snapaudit_jax.mechanisms import Mechanism, registry
from snapaudit_jax.simulation.snapshots import Snapshots, check_clean, load_snapshots
from snapaudit_jax.simulation.trials import MAX_TRIALS, check_float32_clean
from snapaudit_jax.utils import validate
from snapaudit_jax.utils.errors import InputError
from snapaudit_jax.utils.memory import check_fits

__all__ = ["SimulateConfig", "familywise",
           "MECHANISMS", "DEFAULT_CLEAN", "MAX_CURVE_POINTS", "build_snapshots", "build_mechanism", "run_simulate",
           "esa_unit_pair", "neighbour_check"]

MECHANISMS = registry.names()  # the built-in four: "pv", "poe", "esa", "ksa"
CALIBRATIONS = ("analytic", "classical")

# Clean outputs used when none are given: PV and PoE from SnapAudit Table 11
# (TREC); KSA: 10 keywords, the canary's partition says the target keyword
# (index 4) instead of keyword 5, which moves the target onto the top-4 border.
DEFAULT_CLEAN = {
    "pv": ([1.0, 2.0], [0.0, 3.0]),
    "poe": ([-25.11, -10.13], [-28.76, -5.15]),
    "ksa": ([8, 7, 6, 5, 5, 2, 2, 1, 1, 0], [8, 7, 6, 5, 4, 3, 2, 1, 1, 0]),
}
DEFAULT_CLIP = 5.0  # covers the Table 11 PoE utilities, which differ by up to 4.98
DEFAULT_TOP_K = 4
DEFAULT_KSA_SENSITIVITY = 2.0
# The certified curve's thresholds are picked among the audit's candidate thresholds: at most 4001 (the exact score
# grid of simulation.exact.exact_score_grid) or bins + 1 = 2049 (the simulated histogram's edges). More points add
# no threshold, only a Python loop over them.
MAX_CURVE_POINTS = 4001


@dataclasses.dataclass(frozen=True)
class SimulateConfig:
    """Everything ``snapaudit simulate`` needs (flags of the same names); check it with :meth:`validate`.

    The clean outputs come from one source at most: ``snapshot``, ``clean_with``/``clean_without``, or (ESA)
    ``distance``/``dim``; none gives :data:`DEFAULT_CLEAN` (ESA: the unit-vector shorthand).

    Attributes:
      mechanism: a registered mechanism name (``"pv"``, ``"poe"``, ``"esa"``, ``"ksa"``).
      epsilons: the claimed epsilons, one audit each.
      delta: the claimed ``delta`` in ``(0, 1)``.
      threat: ``"black"`` or ``"white"``.
      calibration: Gaussian calibration of PV/ESA, ``"analytic"`` or ``"classical"``.
      sensitivity: forced sensitivity (``None``: :func:`default_sensitivity`).
      clean_with: clean output with the canary (PV, PoE, KSA), or ``None``.
      clean_without: clean output without the canary, given with ``clean_with``.
      snapshot: path of an ``.npz`` snapshot file, or ``None``.
      distance: ESA: Euclidean distance of the two unit signal vectors (default 1.419).
      dim: ESA: embedding dimension (default 384).
      partitions: ESA: number of partitions ``T`` (default 1).
      clip: PoE: the clip ``Gamma`` (default :data:`DEFAULT_CLIP`).
      top_k: KSA: number ``K`` of selected keywords (default :data:`DEFAULT_TOP_K`).
      target: the release signalling "canary present" (``None``: the snapshot file's, else the default target).
      trials: DP-noise trials per hypothesis.
      snapshots: copies of the given clean outputs (ignored for a snapshot file).
      confidence: joint confidence of each audit's bounds, and ``1 - confidence`` the family-wise error of Holm.
      method: ``"simulate"``, ``"exact"`` or ``"paper"``.
      estimator: ``"std"``, ``"gdp"`` or ``None`` (the default estimator).
      clean: ``"auto"`` (``"fixed"`` for vectors, ``"sampled"`` for a snapshot file), ``"fixed"`` or ``"sampled"``.
      seed: PRNG seed of the run, in ``[0, 2**63 - 1]``.
      curve_points: white-box: thresholds of the certified trade-off curve (0: none; at most
        :data:`MAX_CURVE_POINTS`).
      strict_neighbours: refuse clean outputs farther apart than the sensitivity (:func:`neighbour_check`) instead
        of auditing them with a warning.
    """

    mechanism: str
    epsilons: tuple[float, ...] = (1.0, 2.0, 4.0, 8.0, 16.0)
    delta: float = 1e-5
    threat: str = "black"
    calibration: str = "analytic"
    sensitivity: float | None = None
    clean_with: tuple[float, ...] | None = None
    clean_without: tuple[float, ...] | None = None
    snapshot: str | None = None
    distance: float | None = None
    dim: int | None = None
    partitions: int | None = None
    clip: float | None = None
    top_k: int | None = None
    target: int | None = None
    trials: int = 1_000_000
    snapshots: int = 2000
    confidence: float = 0.95
    method: str = "simulate"
    estimator: str | None = None
    clean: str = "auto"
    seed: int = 0
    curve_points: int = CURVE_POINTS
    strict_neighbours: bool = False

    def validate(self) -> "SimulateConfig":
        """Checks every field and their combinations.

        Returns:
          ``self``, unchanged.

        Raises:
          InputError: a field out of its range (``trials`` above :data:`MAX_TRIALS`, a seed outside
            ``[0, 2**63 - 1]``, ``curve_points`` above :data:`MAX_CURVE_POINTS`), clean outputs given in more
            than one way (or ``clean_with`` without ``clean_without``), or an option for another mechanism
            (``distance``/``dim``/``partitions`` outside ESA, ``clip`` outside PoE, ``top_k`` outside KSA,
            ``calibration="classical"`` for PoE/KSA, ``clean_with`` for ESA, ``estimator="gdp"`` for a pure-epsilon
            mechanism).
        """
        validate.choice("mechanism", self.mechanism, MECHANISMS)
        if not self.epsilons:
            raise InputError("epsilon must list at least one value")
        for e in self.epsilons:
            validate.positive_float("epsilon", e)
        validate.open_unit("delta", self.delta)
        validate.choice("threat", self.threat, THREATS)
        validate.choice("calibration", self.calibration, CALIBRATIONS)
        if self.sensitivity is not None:
            validate.positive_float("sensitivity", self.sensitivity)
        trials = validate.positive_int("trials", self.trials)
        if trials > MAX_TRIALS:
            raise InputError(f"trials must be <= {MAX_TRIALS} per hypothesis (the simulator's int32 trial indices), "
                             f"got {trials}")
        validate.positive_int("snapshots", self.snapshots)
        validate.seed("seed", self.seed)
        validate.confidence("confidence", self.confidence)
        validate.choice("method", self.method, METHODS)
        if self.estimator is not None:
            check_estimator(self.estimator, self.mechanism, registry.mechanism_class(self.mechanism).gaussian)
        validate.choice("clean", self.clean, ("auto",) + CLEAN_MODELS)
        if validate.positive_int("curve_points", self.curve_points, minimum=0) > MAX_CURVE_POINTS:
            raise InputError(f"curve_points must be <= {MAX_CURVE_POINTS} (the candidate thresholds the curve is "
                             f"picked from), got {self.curve_points}")
        if self.dim is not None:
            validate.positive_int("dim", self.dim, minimum=2)
        if self.clip is not None:
            validate.positive_float("clip", self.clip)
        if self.top_k is not None:
            validate.positive_int("top_k", self.top_k)
        if self.partitions is not None:
            validate.positive_int("partitions", self.partitions)
        sources = [
            name
            for name, given in (
                ("snapshot", self.snapshot is not None),
                ("clean_with", self.clean_with is not None or self.clean_without is not None),
                ("distance", self.distance is not None or self.dim is not None),
            )
            if given
        ]
        if len(sources) > 1:
            raise InputError(f"{sources[0]} conflicts with {sources[1]}: give the clean outputs one way only")
        if (self.clean_with is None) != (self.clean_without is None):
            raise InputError("clean_with and clean_without must be given together")
        if (self.distance is not None or self.dim is not None) and self.mechanism != "esa":
            raise InputError(f"distance and dim describe ESA embeddings, not mechanism {self.mechanism!r}")
        if self.mechanism == "esa" and self.clean_with is not None:
            raise InputError("clean_with cannot describe esa, which needs candidate embeddings: use distance/dim or "
                             "a snapshot file with 'candidates'")
        for name, value, owner in (("top_k", self.top_k, "ksa"), ("clip", self.clip, "poe"),
                                   ("partitions", self.partitions, "esa")):
            if value is not None and self.mechanism != owner:
                raise InputError(f"{name} applies to mechanism {owner!r} only, not {self.mechanism!r}, got {value!r}")
        if self.calibration == "classical" and self.mechanism in ("poe", "ksa"):
            raise InputError(f"calibration applies to the Gaussian mechanisms pv and esa, not {self.mechanism!r}")
        return self


def esa_unit_pair(distance: float, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """Two unit vectors of ``R^dim`` at Euclidean distance ``distance``.

    Args:
      distance: the distance, in ``(0, 2]``.
      dim: the dimension (>= 2).

    Returns:
      ``(u1, u2)``, each ``(dim,)`` float64: ``u1 = e_0`` and ``u2`` in the span of ``e_0, e_1``.

    Raises:
      InputError: ``distance`` outside ``(0, 2]`` or ``dim < 2``.
    """
    distance = validate.positive_float("distance", distance)
    if distance > 2.0:
        raise InputError(f"distance between unit vectors must be in (0, 2], got {distance}")
    dim = validate.positive_int("dim", dim, minimum=2)
    cos = 1.0 - distance * distance / 2.0
    u1 = np.zeros(dim)
    u2 = np.zeros(dim)
    u1[0] = 1.0
    u2[0], u2[1] = cos, math.sqrt(max(0.0, 1.0 - cos * cos))
    return u1, u2


def build_snapshots(config: SimulateConfig) -> tuple[Snapshots, str]:
    """The clean outputs of the run and the resolved clean model.

    Vectors given on the command line (or the defaults, or the ESA shorthand) are the auditor's chosen neighbouring
    clean outputs, repeated ``snapshots`` times; they are known exactly, so ``clean="auto"`` resolves to
    ``"fixed"``. A snapshot file holds LLM draws: ``"sampled"``.

    ESA shorthand with ``T`` partitions: candidates ``u1, u2`` at the given distance; without the canary every
    partition answers ``u2`` (mean ``u2``); with it, the canary's partition answers ``u1`` (mean
    ``((T-1) u2 + u1)/T``). For ``T = 1`` the means are ``u1`` and ``u2``.

    Args:
      config: the run's configuration.

    Returns:
      ``(snapshots, clean)``: the :class:`~snapaudit_jax.simulation.snapshots.Snapshots` and ``"fixed"`` or
      ``"sampled"``.

    Raises:
      InputError: an unreadable or invalid snapshot file (ESA: without ``candidates``), or clean outputs that are
        not finite flat vectors of one length valid for the mechanism.
    """
    n = config.snapshots
    m = config.mechanism
    names = ("with", "without")
    if config.snapshot is not None:
        try:
            snaps = load_snapshots(config.snapshot)
        except ValueError as err:  # every error of the file names the flag
            raise InputError(str(err) if str(err).startswith("snapshot ") else f"snapshot file: {err}") from None
        if m == "esa" and snaps.candidates is None:
            raise InputError(f"snapshot file {config.snapshot!r} has no 'candidates' array, which esa needs")
        resolved = "sampled"
        names = tuple(f"snapshot file {config.snapshot!r}: array {k!r}" for k in names)
    elif m == "esa":
        d = 1.419 if config.distance is None else config.distance
        dim = 384 if config.dim is None else config.dim
        t = 1 if config.partitions is None else config.partitions
        # u1, u2, the mean with the canary and the two candidates (float64), then the mechanism's float32 candidates
        # and the attack's two float32 references: 56 bytes per dimension before the snapshots themselves.
        check_fits("dim", 56 * dim, f"the ESA signal vectors of dimension {dim}")
        _check_snapshot_memory("dim" if config.dim is not None else "snapshots", n, dim)
        u1, u2 = esa_unit_pair(d, dim)
        with_mean = ((t - 1) * u2 + u1) / t
        snaps = Snapshots(np.tile(with_mean, (n, 1)), np.tile(u2, (n, 1)), candidates=np.stack([u1, u2]))
        resolved = "fixed"
    else:
        w, wo = (config.clean_with, config.clean_without) if config.clean_with is not None else DEFAULT_CLEAN[m]
        w = validate.finite_array("clean_with", w)
        wo = validate.finite_array("clean_without", wo)
        if w.ndim != 1 or wo.ndim != 1:
            raise InputError("clean_with and clean_without must be flat vectors")
        if w.shape != wo.shape:
            raise InputError(f"clean_with has {w.size} entries but clean_without has {wo.size}")
        _check_snapshot_memory("snapshots", n, w.size)
        snaps = Snapshots(np.tile(w, (n, 1)), np.tile(wo, (n, 1)))
        resolved = "fixed"
        names = ("clean_with", "clean_without")
    check_clean(names[0], snaps.with_canary, mechanism=m, candidates=snaps.candidates)
    check_clean(names[1], snaps.without_canary, mechanism=m, candidates=snaps.candidates)
    clean = resolved if config.clean == "auto" else config.clean
    return snaps, clean


def _check_snapshot_memory(field: str, n: int, length: int) -> None:
    """Refuses ``n`` copies of two clean outputs of ``length`` values that cannot fit: both float64 arrays
    (``np.tile``, alive for the whole run), then for one hypothesis at a time the simulator's float32 copy and the
    two float32 copies ``numpy.unique`` makes to find the distinct snapshots: 28 bytes per value and snapshot."""
    check_fits(field, n * length * (2 * 8 + 3 * 4), f"{n} snapshots of {length} values per hypothesis (float64, "
               "and float32 copies for the simulator)")


def neighbour_check(config: SimulateConfig, snapshots: Snapshots) -> str | None:
    """Whether the clean outputs of both hypotheses are neighbouring under the stated sensitivity.

    The distance is the mechanism's :meth:`~snapaudit_jax.mechanisms.Mechanism.neighbour_distance` (in the norm
    its sensitivity bounds: PV and ESA L2, PoE L-infinity, KSA the largest count increase plus the largest
    decrease), in float64, between the two hypotheses' mean clean outputs (for fixed vectors: the vectors
    themselves).

    Args:
      config: the run's configuration.
      snapshots: the run's snapshots (:func:`build_snapshots`).

    Returns:
      ``None`` if the distance is within the sensitivity (up to a relative ``1e-6``), else the message: clean
      outputs farther apart than the sensitivity cannot come from neighbouring inputs of a mechanism with that
      sensitivity, so a violation found on them says nothing about the claim.
    """
    cls = registry.mechanism_class(config.mechanism)
    w = np.mean(np.asarray(snapshots.with_canary, np.float64), axis=0)
    wo = np.mean(np.asarray(snapshots.without_canary, np.float64), axis=0)
    distance = cls.neighbour_distance(w, wo)
    sensitivity = default_sensitivity(config)
    if distance <= sensitivity * (1.0 + 1e-6):
        return None
    if config.snapshot is not None:
        source = f"snapshot file {config.snapshot!r}: the means of 'with' and 'without'"
    elif config.mechanism == "esa":
        source = f"distance {1.419 if config.distance is None else config.distance:g}: the ESA shorthand's means"
    else:
        source = "clean_with and clean_without"
    return (f"{source} are {distance:.6g} apart ({cls.name}'s neighbour distance) but the sensitivity is "
            f"{sensitivity:.6g}: they are not neighbouring clean outputs, so the audit does not test the claim")


def default_sensitivity(config: SimulateConfig) -> float:
    """The sensitivity the run calibrates for: ``config.sensitivity`` if given, else the mechanism's default.

    Defaults: PV ``sqrt(2)``; ESA ``2/T``; PoE the clip ``Gamma``; KSA 2 (replace-one neighbours).

    Args:
      config: the run's configuration.

    Returns:
      The sensitivity as a float.
    """
    if config.sensitivity is not None:
        return float(config.sensitivity)
    return {
        "pv": math.sqrt(2.0),
        "esa": 2.0 / (config.partitions or 1),
        "poe": config.clip or DEFAULT_CLIP,
        "ksa": DEFAULT_KSA_SENSITIVITY,
    }[config.mechanism]


def build_mechanism(config: SimulateConfig, epsilon: float, snapshots: Snapshots) -> Mechanism:
    """The calibrated mechanism of the run at one ``epsilon``.

    Args:
      config: the run's configuration.
      epsilon: the claimed ``eps`` of this row.
      snapshots: the run's snapshots (ESA takes its candidates from them).

    Returns:
      The mechanism from :func:`snapaudit_jax.mechanisms.build`.

    Raises:
      InputError: a claim or option the mechanism refuses (a noise parameter float32 cannot hold is blamed on
        ``sensitivity`` or ``clip`` when a forced one causes it, else on ``epsilon``).
    """
    options = {
        "pv": {"calibration": config.calibration},
        "esa": {"candidates": snapshots.candidates, "partitions": config.partitions or 1,
                "calibration": config.calibration},
        "poe": {},
        "ksa": {"top_k": config.top_k or DEFAULT_TOP_K},
    }[config.mechanism]
    sensitivity = default_sensitivity(config)
    try:
        return registry.build(config.mechanism, epsilon, config.delta, sensitivity, field="--mechanism", **options)
    except InputError as err:
        forced = "sensitivity" if config.sensitivity is not None else "clip" if config.clip is not None else None
        if forced is None:
            raise
        try:  # the default sensitivity calibrates fine at this epsilon: the forced one is what is out of range
            registry.build(config.mechanism, epsilon, config.delta,
                           default_sensitivity(dataclasses.replace(config, sensitivity=None, clip=None)), **options)
        except InputError:
            raise err from None
        raise InputError(f"{forced} {sensitivity:g}: {err}") from None


def run_simulate(config: SimulateConfig, *, progress: bool = False, devices=None) -> list[AuditResult]:
    """Audits the configured mechanism at every ``epsilon``; one result each.

    Row ``i`` draws its randomness from ``fold_in(key(seed), i)``, so the rows are independent audits. Every result
    carries ``violation_p_value`` (the smallest failure probability at which its bounds certify
    ``epsilon_emp > epsilon_theory``) and ``familywise_violation``: Holm's step-down over the rows at
    ``1 - confidence`` family-wise (Holm 1979), the flag ``--fail-on-violation`` uses. Heuristic results
    (``method="paper"``) never count as violations.

    Args:
      config: the run's configuration (validated here).
      progress: progress bars on stderr.
      devices: devices to shard the simulation over (default: all).

    Returns:
      One :class:`~snapaudit_jax.estimation.AuditResult` per entry of ``config.epsilons``, in order.

    Raises:
      InputError: an invalid configuration, snapshot file or audit argument, a claim some mechanism cannot be
        calibrated for (every epsilon is checked before the first audit), or clean outputs that are not
        neighbouring under the sensitivity with ``strict_neighbours`` (without it, each result carries the
        warning).
    """
    config.validate()
    snaps, clean = build_snapshots(config)
    apart = neighbour_check(config, snaps)
    if apart is not None and config.strict_neighbours:
        raise InputError(f"{apart} (strict_neighbours)")
    mechanisms = [build_mechanism(config, eps, snaps) for eps in config.epsilons]  # every claim before any audit
    if config.method != "exact":  # the simulator's float32 must carry every row's noise
        names = {"pv": "clean_with", "poe": "clean_with", "ksa": "clean_with", "esa": "distance"}
        name = f"snapshot file {config.snapshot!r}" if config.snapshot is not None else names[config.mechanism]
        for mech in mechanisms:
            for outputs in (snaps.with_canary, snaps.without_canary):
                check_float32_clean(name, mech, outputs)
    target = config.target if config.target is not None else snaps.target
    root = jax.random.key(config.seed)
    results = []
    for row, (eps, mech) in enumerate(zip(config.epsilons, mechanisms)):
        results.append(
            audit(
                mech,
                snaps.with_canary,
                snaps.without_canary,
                epsilon_theory=eps,
                delta=config.delta,
                threat=config.threat,
                method=config.method,
                estimator=config.estimator,
                trials=config.trials,
                confidence=config.confidence,
                clean=clean,
                target=target,
                sensitivity=default_sensitivity(config),
                curve_points=config.curve_points,
                seed=config.seed,
                key=jax.random.fold_in(root, row),
                stream=row,
                devices=devices,
                progress=progress,
            )
        )
    if apart is not None and config.snapshot is not None:  # the audit's own check sees its selection snapshots only
        results = [r if apart in r.warnings else dataclasses.replace(r, warnings=r.warnings + (apart,))
                   for r in results]
    return familywise(results, 1.0 - config.confidence)


def familywise(results: list[AuditResult], alpha: float) -> list[AuditResult]:
    """Adds p-values and Holm's family-wise flags at family-wise error ``alpha`` (Holm 1979).

    ``violation_p_value`` / ``familywise_violation`` test the ``(eps, delta)`` claims of the rows;
    ``mu_violation_p_value`` / ``mu_familywise_violation`` the ``mu``-GDP claims of ``estimator="gdp"`` rows. Rows
    whose headline is an exact privacy profile have p-value 0 (violated) or 1; heuristic rows (``method="paper"``) 1.

    Args:
      results: the rows' results.
      alpha: family-wise error rate in ``(0, 1)``.

    Returns:
      Copies of ``results`` with those four fields set (the ``mu`` ones ``None`` where no ``mu`` claim is tested).

    Raises:
      InputError: ``alpha`` not in ``(0, 1)``.
    """
    import dataclasses

    eps_p, mu_p = [], []
    for r in results:
        if r.heuristic:
            p = 1.0
        elif r.epsilon_profile is not None:
            p = 0.0 if r.violation else 1.0
        else:
            p = violation_p_value(r.tpr, r.fpr, r.delta, r.epsilon_theory,
                                  gaussian_by_construction=r.gaussian_by_construction)
        eps_p.append(p)
        gdp = r.estimator == "gdp" and r.mu_claim is not None and not r.heuristic
        mu_p.append(mu_violation_p_value(r.tpr, r.fpr, r.mu_claim) if gdp else 1.0)
    eps_reject, mu_reject = holm(eps_p, alpha), holm(mu_p, alpha)
    out = []
    for r, p, f, q, g in zip(results, eps_p, eps_reject, mu_p, mu_reject):
        gdp = r.estimator == "gdp" and r.mu_claim is not None
        out.append(dataclasses.replace(r, violation_p_value=float(p), familywise_violation=bool(f),
                                       mu_violation_p_value=float(q) if gdp else None,
                                       mu_familywise_violation=bool(g) if gdp else None))
    return out


def parse_vector(name: str, text: str) -> tuple[float, ...]:
    """Parses a comma-separated list of numbers: ``"1,2,3"`` -> ``(1.0, 2.0, 3.0)``.

    Args:
      name: the flag named in errors.
      text: the list.

    Returns:
      The finite numbers as a tuple of floats.

    Raises:
      InputError: an empty entry, an entry that is not a number, or a non-finite number.
    """
    parts = [p.strip() for p in str(text).split(",")]
    if not parts or any(p == "" for p in parts):
        raise InputError(f"{name} must be a comma-separated list of numbers, got {text!r}")
    out = []
    for p in parts:
        try:
            v = float(p)
        except ValueError:
            raise InputError(f"{name}: could not parse {p!r} as a number (in {text!r})") from None
        if not math.isfinite(v):
            raise InputError(f"{name} must be finite, got {p!r}")
        out.append(v)
    return tuple(out)

