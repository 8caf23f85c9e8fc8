"""The one :class:`AuditResult` and its factory :func:`audit_result`: what ``epsilon_emp`` is, when
``violation`` may be set, which assumptions the result states."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any


from snapaudit_jax.estimation.curves import TradeoffCurve
from snapaudit_jax.estimation.estimators import ASSUMPTION_FREE, ESTIMATORS, VIOLATION_RTOL, estimate, is_violation
from snapaudit_jax.estimation.rates import RateBound
from snapaudit_jax.utils import validate
from snapaudit_jax.utils.io import JSONRecord

__all__ = ["AuditResult", "GDP_BY_CONSTRUCTION_LABEL", "GDP_ENVELOPE_LABEL", "HEURISTIC_NOTE", "audit_result"]

@dataclasses.dataclass(frozen=True)
class AuditResult(JSONRecord):
    """Immutable, JSON-serialisable result of one audit (one ``eps_theory``); built by :func:`audit_result`.

    ``epsilon_emp`` is the ``(eps, delta)`` lower bound that ``violation`` is decided from: the assumption-free
    standard estimator, an exact privacy profile (``method="exact"``, fixed clean outputs), or -- only where the
    release's trade-off curve is Gaussian by construction -- the GDP conversion. ``epsilon_gdp`` is always the
    ``eps(delta)`` of the envelope ``G_{mu_emp}`` (``epsilon_gdp_label`` says whether it bounds the release).
    ``mu_claim`` / ``mu_violation`` test the ``mu``-GDP claim of a Gaussian mechanism; ``heuristic`` marks
    SnapAudit's App. C.2 radius, which never sets a violation.

    Attributes:
      mechanism: the mechanism's name (the pipeline's for passive audits).
      threat: ``"black"`` or ``"white"``.
      method: ``"simulate"``, ``"exact"``, ``"paper"`` or ``"passive"``.
      estimator: ``"std"`` or ``"gdp"``.
      clean: the clean-output model: ``"sampled"``, ``"fixed"`` or ``"end-to-end"`` (passive).
      epsilon_theory: the claimed ``eps``.
      delta: the claimed ``delta``.
      epsilon_emp: the headline ``(eps, delta)`` lower bound (above).
      epsilon_std: the standard estimator on ``(tpr_low, fpr_up)``.
      epsilon_gdp: ``eps(delta)`` of the Gaussian envelope ``G_{mu_emp}``.
      mu_emp: the GDP lower bound ``Phi^-1(tpr_low) - Phi^-1(fpr_up)``.
      tpr_hat: TPR point estimate.
      fpr_hat: FPR point estimate.
      tpr_low: TPR lower bound.
      fpr_up: FPR upper bound.
      violation: ``epsilon_emp > epsilon_theory`` beyond the 1e-6 relative tolerance (never when ``heuristic``).
      trials: evaluation trials per hypothesis (0 for exact rates).
      selection_trials: trials per hypothesis spent on choosing the threshold (or selection runs, passive).
      snapshots: snapshots per hypothesis (the smaller of the two counts).
      selection_snapshots: snapshots per hypothesis held out for the attack design.
      confidence: joint confidence of ``tpr_low`` and ``fpr_up``.
      target: the release signalling "canary present", or ``None``.
      threshold: the white-box threshold, or ``None``.
      tpr: the TPR lower bound with its parts.
      fpr: the FPR upper bound with its parts.
      noise: the noise parameters (``sigma`` or ``scale``, and ``sensitivity`` when given).
      assumptions: the sentences under which the bounds hold, joined.
      warnings: warnings recorded during the audit (e.g. references farther apart than the sensitivity).
      seed: PRNG seed, or ``None``.
      seconds: wall-clock time of the audit.
      mu_claim: the ``mu`` the calibration implies (``sensitivity / sigma``), or ``None``.
      mu_violation: ``mu_emp > mu_claim`` beyond the tolerance (``estimator="gdp"`` only, never when ``heuristic``).
      epsilon_gdp_label: :data:`GDP_ENVELOPE_LABEL` or :data:`GDP_BY_CONSTRUCTION_LABEL`.
      epsilon_profile: the release's exact ``eps(delta)``, or ``None``.
      epsilon_curve: the certified trade-off curve's ``epsilon``, or ``None``.
      curve: the certified :class:`TradeoffCurve` as a dict, or ``None``.
      heuristic: the bounds are SnapAudit's App. C.2 heuristic (``method="paper"``).
      gaussian_by_construction: ``estimator="gdp"`` and the release's trade-off curve is exactly Gaussian.
      violation_p_value: p-value of the ``(eps, delta)`` claim (set by
        :func:`~snapaudit_jax.audits.command.familywise`), or ``None``.
      familywise_violation: Holm's family-wise verdict on the ``(eps, delta)`` claim, or ``None``.
      mu_violation_p_value: p-value of the ``mu``-GDP claim, or ``None``.
      mu_familywise_violation: Holm's family-wise verdict on the ``mu``-GDP claim, or ``None``.
      stream: the row index of this audit's key stream.
    """

    mechanism: str
    threat: str
    method: str
    estimator: str
    clean: str
    epsilon_theory: float
    delta: float
    epsilon_emp: float
    epsilon_std: float
    epsilon_gdp: float
    mu_emp: float
    tpr_hat: float
    fpr_hat: float
    tpr_low: float
    fpr_up: float
    violation: bool
    trials: int
    selection_trials: int
    snapshots: int
    selection_snapshots: int
    confidence: float
    target: int | None
    threshold: float | None
    tpr: RateBound
    fpr: RateBound
    noise: dict
    assumptions: str
    warnings: tuple[str, ...]
    seed: int | None
    seconds: float
    mu_claim: float | None = None
    mu_violation: bool = False
    epsilon_gdp_label: str = ""
    epsilon_profile: float | None = None
    epsilon_curve: float | None = None
    curve: dict | None = None
    heuristic: bool = False
    gaussian_by_construction: bool = False
    violation_p_value: float | None = None
    familywise_violation: bool | None = None
    mu_violation_p_value: float | None = None
    mu_familywise_violation: bool | None = None
    stream: int = 0

    def summary(self) -> dict[str, Any]:
        """The fields of the command-line JSON contract, as a dict in strict-JSON form.

        A heuristic result (``method="paper"``) also carries ``"heuristic": true`` and ``"note"``
        (:data:`HEURISTIC_NOTE`), as the table and the full record do: its ``epsilon_emp`` is not a certified bound.
        """
        d = self.to_dict()
        keys = (
            "mechanism", "threat", "method", "estimator", "epsilon_theory", "delta", "epsilon_emp", "mu_emp",
            "tpr_hat", "fpr_hat", "tpr_low", "fpr_up", "trials", "snapshots", "confidence", "violation", "seconds",
        )
        out = {k: d[k] for k in keys}
        if self.heuristic:
            out.update(heuristic=True, note=HEURISTIC_NOTE)
        return out


HEURISTIC_NOTE = ("method=paper is SnapAudit's heuristic radius: eps_emp is not certified and no violation is "
                  "flagged")


GDP_ENVELOPE_LABEL = ("eps(delta) of the Gaussian envelope G_mu_emp: bounds the release's eps only if its trade-off "
                      "curve is Gaussian; never used for the (eps, delta) violation")
GDP_BY_CONSTRUCTION_LABEL = ("eps(delta) of G_mu_emp: a valid (eps, delta) lower bound here, since the release (the "
                             "whole Gaussian-noised vector, fixed clean outputs) has a Gaussian trade-off curve and "
                             "the white-box score is its likelihood-ratio statistic")


def audit_result(*, mechanism: str, threat: str, method: str, estimator: str, clean: str, epsilon_theory: float,
                 delta: float, tpr: RateBound, fpr: RateBound, confidence: float, assumptions: Sequence[str],
                 trials: int, selection_trials: int = 0, snapshots: int = 0, selection_snapshots: int = 0,
                 target: int | None = None, threshold: float | None = None, noise: dict | None = None,
                 warnings: Sequence[str] = (), seed: int | None = None, seconds: float = 0.0,
                 mu_claim: float | None = None, gaussian_by_construction: bool = False,
                 epsilon_profile: float | None = None, curve: TradeoffCurve | None = None,
                 heuristic: bool = False, stream: int = 0) -> AuditResult:
    """The one :class:`AuditResult` factory: estimates, the headline bound, the flags and the assumptions.

    Args:
      mechanism: the mechanism's (or pipeline's) name.
      threat: ``"black"`` or ``"white"``.
      method: how the bounds were obtained (``"simulate"``, ``"exact"``, ``"paper"``, ``"passive"``).
      estimator: ``"std"`` or ``"gdp"``.
      clean: the clean-output model (``"sampled"``, ``"fixed"``, ``"end-to-end"``).
      epsilon_theory: the claimed ``eps``.
      delta: the claimed ``delta`` in ``(0, 1)``.
      tpr: the TPR lower bound of the pre-selected decision rule.
      fpr: the FPR upper bound of the same rule (joint confidence ``confidence`` with ``tpr``).
      confidence: the joint confidence of the two bounds.
      assumptions: sentences on how the bounds were obtained (the estimator's sentence is appended).
      trials: evaluation trials per hypothesis.
      selection_trials: trials spent on the selection.
      snapshots: snapshots per hypothesis.
      selection_snapshots: snapshots held out for the attack design.
      target: the target release.
      threshold: the white-box threshold.
      noise: noise parameters to record (copied).
      warnings: warnings to record.
      seed: the PRNG seed.
      seconds: wall-clock time.
      mu_claim: the ``mu`` the calibration implies (Gaussian mechanisms), tested when ``estimator="gdp"``.
      gaussian_by_construction: the release's trade-off curve is exactly Gaussian for this pair.
      epsilon_profile: the exact ``eps(delta)`` of the release (exact rates only): the headline then.
      curve: a certified trade-off curve (reported; its ``epsilon`` holds at ``confidence`` on its own).
      heuristic: the bounds come from :func:`paper_bound`: never a violation.
      stream: the row index of the audit's key stream.

    Returns:
      :class:`AuditResult`.

    Raises:
      InputError: an unknown ``estimator`` or ``delta`` not in ``(0, 1)``.
    """
    estimator = validate.choice("estimator", estimator, ESTIMATORS)
    eps_std, mu, eps_gdp = estimate(tpr, fpr, delta)
    headline = eps_std
    parts = list(assumptions)
    if epsilon_profile is not None:
        headline = max(headline, float(epsilon_profile))
        parts.append("epsilon_emp is the exact privacy profile eps(delta) of the release for the audited pair "
                     "(fixed clean outputs, exact output probabilities).")
    elif estimator == "gdp" and gaussian_by_construction:
        headline = max(headline, eps_gdp)
        parts.append("epsilon_emp also uses the GDP conversion, valid here: " + GDP_BY_CONSTRUCTION_LABEL + ".")
    elif heuristic:
        parts.append("epsilon_emp applies the standard estimator to the heuristic radius.")
    else:
        parts.append(ASSUMPTION_FREE)
    label = GDP_BY_CONSTRUCTION_LABEL if gaussian_by_construction else GDP_ENVELOPE_LABEL
    if estimator == "gdp":
        parts.append(
            "estimator=gdp audits the mu-GDP claim: mu_emp is a valid lower bound on the mu of any mu-GDP guarantee"
            + (f" and is tested against mu_claim = sensitivity / sigma = {mu_claim:.6g}" if mu_claim is not None
               else "") + "; epsilon_gdp is the envelope's eps.")
    if heuristic:
        parts.insert(0, "HEURISTIC (SnapAudit App. C.2): not a certified bound; no violation is flagged from it.")
    mu_violation = bool(estimator == "gdp" and mu_claim is not None and not heuristic
                        and mu > mu_claim * (1.0 + VIOLATION_RTOL))
    return AuditResult(
        mechanism=mechanism, threat=threat, method=method, estimator=estimator, clean=clean,
        epsilon_theory=float(epsilon_theory), delta=float(delta), epsilon_emp=float(headline), epsilon_std=eps_std,
        epsilon_gdp=eps_gdp, mu_emp=mu, tpr_hat=tpr.estimate, fpr_hat=fpr.estimate, tpr_low=tpr.bound,
        fpr_up=fpr.bound, violation=(not heuristic) and is_violation(headline, epsilon_theory), trials=int(trials),
        selection_trials=int(selection_trials), snapshots=int(snapshots), selection_snapshots=int(selection_snapshots),
        confidence=float(confidence), target=target, threshold=threshold, tpr=tpr, fpr=fpr, noise=dict(noise or {}),
        assumptions=" ".join(parts), warnings=tuple(warnings), seed=seed, seconds=float(seconds),
        mu_claim=None if mu_claim is None else float(mu_claim), mu_violation=mu_violation, epsilon_gdp_label=label,
        epsilon_profile=None if epsilon_profile is None else float(epsilon_profile),
        epsilon_curve=None if curve is None else curve.epsilon, curve=None if curve is None else curve.to_dict(),
        heuristic=bool(heuristic), gaussian_by_construction=bool(estimator == "gdp" and gaussian_by_construction),
        stream=int(stream),
    )
