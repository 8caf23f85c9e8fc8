"""Text tables of the reports."""

from __future__ import annotations

import math

from snapaudit_jax.estimation.result import HEURISTIC_NOTE

__all__ = ["format_table"]


def _fmt(x, spec):
    return f"{x:{spec}}" if isinstance(x, (int, float)) and math.isfinite(x) else str(x)


def format_table(results) -> str:
    """The ``snapaudit simulate`` table: one row per claimed epsilon, then labels, warnings and assumptions.

    Args:
      results: a non-empty sequence of :class:`~snapaudit_jax.estimation.AuditResult` of one run (the header and
        assumptions are the first result's).

    Returns:
      The table as text, lines joined by newlines (no trailing newline).
    """
    r0 = results[0]
    gdp = r0.estimator == "gdp" and any(r.mu_claim is not None for r in results)
    curve = any(r.epsilon_curve is not None for r in results)
    several = len(results) > 1
    head = (
        f"mechanism={r0.mechanism} threat={r0.threat} method={r0.method} estimator={r0.estimator} "
        f"clean={r0.clean} delta={r0.delta:g} confidence={r0.confidence:g} trials/hyp={r0.trials:,} "
        f"snapshots={r0.snapshots:,}"
    )
    cols = f"{'eps_theory':>10} {'eps_emp':>9} {'mu_emp':>8} {'TPR_hat':>10} {'FPR_hat':>10} {'TPR_low':>10} " \
           f"{'FPR_up':>10} {'violation':>9}"
    if several:
        cols += f" {'holm':>5}"
    if gdp:
        cols += f" {'mu_claim':>8} {'mu_viol':>7}" + (f" {'mu_holm':>7}" if several else "") + f" {'eps_env':>8}"
    if curve:
        cols += f" {'eps_curve':>9}"
    cols += f" {'seconds':>8}"
    lines = [head, cols]
    for r in results:
        line = (
            f"{_fmt(r.epsilon_theory, '10.3g')} {_fmt(r.epsilon_emp, '9.3f')} {_fmt(r.mu_emp, '8.3f')} "
            f"{_fmt(r.tpr_hat, '10.4g')} {_fmt(r.fpr_hat, '10.4g')} {_fmt(r.tpr_low, '10.4g')} "
            f"{_fmt(r.fpr_up, '10.4g')} {('YES' if r.violation else 'no'):>9}"
        )
        if several:
            line += f" {('YES' if r.familywise_violation else 'no'):>5}"
        if gdp:
            line += f" {_fmt(r.mu_claim, '8.3f')} {('YES' if r.mu_violation else 'no'):>7}"
            if several:
                line += f" {('YES' if r.mu_familywise_violation else 'no'):>7}"
            line += f" {_fmt(r.epsilon_gdp, '8.3f')}"
        if curve:
            line += f" {_fmt(r.epsilon_curve, '9.3f')}"
        lines.append(line + f" {_fmt(r.seconds, '8.2f')}")
    if r0.heuristic:
        lines.append(f"note: {HEURISTIC_NOTE}")
    elif any(r.epsilon_profile is not None for r in results):
        lines.append("eps_emp: the exact privacy profile eps(delta) of the release for the audited pair")
    else:
        lines.append("eps_emp: (eps, delta) lower bound at the stated confidence"
                     + (" (GDP conversion: the release is Gaussian by construction)"
                        if any(r.gaussian_by_construction for r in results) else " (assumption-free)"))
    if several:
        lines.append("violation: this row's bound above eps_theory (per row); holm: the family verdict over the rows "
                     "(Holm at 1 - confidence); each row uses its own key stream")
    if gdp:
        lines.append("mu_viol: this row's mu_emp > mu_claim (the mu-GDP claim), a per-row test: a true claim is "
                     "flagged with probability up to 1 - confidence in each row"
                     + ("; mu_holm: the family verdict over the rows (Holm at 1 - confidence)" if several else ""))
        lines.append(f"eps_env: {r0.epsilon_gdp_label}")
    if curve:
        lines.append("eps_curve: max over the certified trade-off curve's grid (Bonferroni over the grid; "
                     "full curve in --out, drawn by --plot)")
    for w in sorted({w for r in results for w in r.warnings}):
        lines.append(f"warning: {w}")
    lines.append(f"assumptions: {r0.assumptions}")
    return "\n".join(lines)
