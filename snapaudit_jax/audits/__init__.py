"""Audits of DP-ICL mechanisms from clean outputs: active (snapshot) and passive (black-box baseline).

* :mod:`~snapaudit_jax.audits.active` -- :func:`audit`, SnapAudit's Phase C (threshold selection on separate
  trials, counts, bounds, the :class:`~snapaudit_jax.estimation.AuditResult`);
* :mod:`~snapaudit_jax.audits.passive` -- :func:`passive_audit`, the passive black-box baseline;
* :mod:`~snapaudit_jax.audits.command` -- the ``snapaudit simulate`` command: :class:`SimulateConfig` ->
  :func:`run_simulate` -> ``[AuditResult]``.

The package is ``audits`` (plural) so that the top-level function
:func:`snapaudit_jax.audit` and the stage do not share a name.
"""

from snapaudit_jax.audits import active, command, passive
from snapaudit_jax.audits.active import (
    CLEAN_MODELS,
    CURVE_POINTS,
    METHODS,
    THREATS,
    AuditResult,
    audit,
    is_violation,
    make_attack,
)
from snapaudit_jax.audits.command import SimulateConfig, familywise, run_simulate
from snapaudit_jax.audits.passive import passive_audit, passive_bounds

__all__ = [
    "CLEAN_MODELS", "CURVE_POINTS", "METHODS", "THREATS", "AuditResult", "SimulateConfig", "active", "audit",
    "command", "familywise", "is_violation", "make_attack", "passive", "passive_audit", "passive_bounds",
    "run_simulate",
]
