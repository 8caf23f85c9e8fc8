"""The ``snapaudit audit`` report: ``table.md`` and the epsilon plots."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["determinism_line", "format_report", "mia_summary", "plot_pipeline"]


def plot_pipeline(path: str, name: str, rows: list[dict]) -> None:
    """``PIPELINE.png`` (and its SVG copy, for ``report.html``): eps_emp against eps_theory, one line per mode and
    threat.

    Args:
      path: the PNG file (written atomically).
      name: the pipeline, in the title.
      rows: its result rows (``mode``, ``threat``, ``epsilon_theory``, ``epsilon_emp``).

    Raises:
      DependencyError: matplotlib is not installed.
    """
    from snapaudit_jax.report import plot_epsilon

    series = {}
    for r in rows:
        series.setdefault(f"{r['mode']} {r['threat']}-box", []).append((r["epsilon_theory"], r["epsilon_emp"]))
    plot_epsilon(path, series, title=f"{name}: 95% lower bounds on epsilon", svg_copy=True)


def _pool_lines(info: dict) -> list[str]:
    """ESA's candidate pool in the report: what it holds, how it was drawn and what it lacks."""
    pool = info["candidate_pool"]
    if pool["source"] == "fixed":
        out = [f"ESA candidate pool: fixed (y1, y2), no candidate calls; candidate stage (diagnostic, not counted): "
               f"{info.get('candidate_coverage')}."]
    else:
        out = [f"ESA candidate pool: sampled once before Phase A by {pool['calls']} constrained 0-shot calls (no "
               f"private examples; counted in the active budget): draws y1 {pool['y1']}, y2 {pool['y2']}, other "
               f"{pool['other']}; {len(pool['texts'])} candidates {pool['texts']}."]
    out += [f"WARNING (ESA black-box): {p}." for p in pool["problems"]]
    fresh = info.get("passive_candidate_pools")
    if fresh:
        out.append(f"ESA passive runs: a fresh pool per run ({fresh['calls_per_run']} calls each, counted), "
                   f"{fresh['runs']} runs per context within the active budget; {fresh['with_y1']} of "
                   f"{fresh['runs']} pools hold y1.")
    return out


def determinism_line(check: Mapping[str, Any] | None, clean: str | None = None) -> str:
    """The report's sentence on Phase A's determinism check and the clean model the active audits used.

    Args:
      check: the manifest's ``determinism_check`` (``checked``, ``mismatches`` and, for label scoring,
        ``max_abs_diff``), or ``None`` when it did not run (``verify = 0``).
      clean: the clean model of the active audits (``fixed``, ``sampled``, ...), or ``None`` if unknown.

    Returns:
      One Markdown line: the measured mismatch rate, and how the active audits treated the snapshots.
    """
    used = f" Active audits used clean = `{clean}`." if clean else ""
    if not check:
        return f"Phase A determinism check: not run (`verify = 0`).{used}"
    n, bad = int(check["checked"]), int(check["mismatches"])
    rate = bad / n if n else 0.0
    what = "arg-max labels changed" if "max_abs_diff" in check else "answers changed"
    line = (f"Phase A determinism check: {n} prompts recomputed one at a time against their batched answers; "
            f"{bad} {what} (mismatch rate {rate:.1%})")
    if "max_abs_diff" in check:
        line += f", largest log-probability difference {check['max_abs_diff']:.2g}"
    return line + "." + used


def format_report(rows: list[dict], summaries: dict, mia: dict | None, one_run: dict | None = None) -> str:
    """The ``table.md`` report of a run.

    Markdown tables of ``epsilon_emp`` by pipeline and ``epsilon_theory``, for active/passive and black/white, with
    each pipeline's Phase A manifest line (and ESA's signals and candidate pool), the MIA table and the one-run
    section (``[one_run]``) next to the active audit's numbers.

    Args:
      rows: the ``results.json`` rows (``pipeline``, ``mode``, ``threat``, ``epsilon_theory``, ``epsilon_emp``,
        ``llm_calls``).
      summaries: per pipeline, its summary (``manifest`` and the ESA pool entries).
      mia: the ``mia.json`` object, or ``None``.
      one_run: the ``one_run.json`` object, or ``None``.

    Returns:
      The Markdown text, ending with a newline.
    """
    lines = ["# DP-ICL audit", ""]
    for name, info in summaries.items():
        m = info["manifest"]
        lines.append(f"## {name}")
        lines.append(
            f"query `{m['query']}`, defense `{m['defense']}`, model `{m['model']}`; phase A: {m['snapshots']} calls "
            f"of M' per context = {m['llm_calls']} model calls, {m['unique_computations']} computed "
            f"(the rest reused: greedy decoding is deterministic), {m['seconds']:.1f} s; distinct snapshots "
            f"{m['distinct_snapshots']}."
        )
        lines.append(determinism_line(m.get("determinism_check"), info.get("clean")))
        if "signals" in info:
            lines.append(f"ESA signals: {info['signals']}.")
        if "candidate_pool" in info:
            lines += _pool_lines(info)
        lines.append("")
        lines.append("| eps_theory | active black | active white | passive black | passive white "
                     "| LLM calls active/passive |")
        lines.append("|---:|---:|---:|---:|---:|---:|")
        mine = [r for r in rows if r["pipeline"] == name]
        for eps in sorted({r["epsilon_theory"] for r in mine}):
            cell = {}
            calls = {}
            for r in mine:
                if r["epsilon_theory"] == eps:
                    cell[(r["mode"], r["threat"])] = f"{r['epsilon_emp']:.2f}"
                    calls[r["mode"]] = r["llm_calls"]
            shown = [cell.get((m, t), "-") for m in ("active", "passive") for t in ("black", "white")]
            lines.append(f"| {eps:g} | " + " | ".join(shown)
                         + f" | {calls.get('active', '-')}/{calls.get('passive', '-')} |")
        lines.append("")
    if mia:
        lines.append("## Clean-output membership inference (AUC)")
        lines.append("")
        lines.append("| pipeline | query | defense | AUC |")
        lines.append("|---|---|---|---:|")
        for r in mia["rows"]:
            lines.append(f"| {r['pipeline']} | {r['query']} | {r['defense']} | {r['auc']:.2f} |")
        lines.append("")
    if one_run:
        from snapaudit_jax.dpicl.one_run import format_section

        lines.append(format_section(one_run["rows"], rows))
    lines.append("Entries are 95%-confidence lower bounds on epsilon (see results_full.json for assumptions). "
                 "Active audits with clean = fixed treat each snapshot as the exact clean output of its recorded "
                 "partition assignment (greedy decoding; see the determinism check); passive audits are end to end.")
    return "\n".join(lines) + "\n"


def mia_summary(result: Mapping[str, Any]) -> str | None:
    """The line ``snapaudit audit`` prints after its report when the run had a membership-inference section.

    Args:
      result: what :func:`~snapaudit_jax.dpicl.run.run_audit` returned.

    Returns:
      ``"MIA AUC rows: N (mia.json)"``, or ``None`` without MIA rows.
    """
    return f"MIA AUC rows: {len(result['mia']['rows'])} (mia.json)" if result.get("mia") else None
