"""The PII experiment's report: the Markdown table (``table.md``) and the leakage plot (``leakage.png``).

:func:`format_table` lays the run's results out in the spirit of Lukas et al. 2023, Tables III-VI;
:func:`plot_leakage` draws the headline rates per variant with the engine's matplotlib helpers
(:func:`snapaudit_jax.report.plots.pyplot`, :func:`~snapaudit_jax.report.plots.save_figure`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from attacks.config import REPETITION_BINS, PIIConfig, headline_label
from snapaudit_jax.utils.errors import DependencyError

__all__ = ["GOALS", "compare_variants", "format_goals", "format_metric", "format_table", "plot_leakage"]

GOALS = {"dp_over_undefended_perplexity": 1.5, "dp_over_undefended_extraction_recall": 0.5}
"""The scale run's goals (issue: the PII experiment at a scale where DP learns): the DP variant's held-out
perplexity at most 1.5x the undefended one's and its headline extraction recall at most half of it. Printed by
every run with both variants, never asserted: a goal missed is a result, not an error."""


def compare_variants(results: Mapping[str, dict]) -> dict | None:
    """What DP cost in utility and bought in extraction: the ``dp`` variant against ``undefended``.

    Args:
      results: ``{variant: row}`` (``results.json``).

    Returns:
      ``None`` without both variants; else ``{goal name: {"ratio", "goal", "met"}, "note"}`` for each of
      :data:`GOALS` (``ratio`` and ``met`` ``None`` with a ``"reason"`` where the undefended figure is zero or
      undefined: nothing extracted leaves no ratio).
    """
    if not {"undefended", "dp"} <= set(results):
        return None
    out: dict = {"note": "goals of the scale run (docs/pii.md), printed, never asserted"}
    for name, goal in GOALS.items():
        key = "perplexity" if name.endswith("perplexity") else "extraction_recall"
        dp, undefended = results["dp"].get(key), results["undefended"].get(key)
        if dp is None or undefended is None or not np.isfinite(dp) or not np.isfinite(undefended) or undefended <= 0:
            out[name] = {"ratio": None, "goal": goal, "met": None,
                         "reason": f"undefended {key} is {undefended!r}: no ratio"}
            continue
        ratio = float(dp) / float(undefended)
        out[name] = {"ratio": ratio, "goal": goal, "met": bool(ratio <= goal)}
    return out


def format_goals(goals: Mapping[str, dict], *, words: bool = False) -> str:
    """:func:`compare_variants`'s ratios, each beside its goal and whether it is met (or why there is none).

    Args:
      goals: :func:`compare_variants`'s dict.
      words: names with spaces for the table (else as the JSON keys, for the log).

    Returns:
      One line, the goals separated by ``"; "``.
    """
    return "; ".join(
        f"{name.replace('_', ' ') if words else name} {format_metric(g['ratio'], 2)} (goal <= {g['goal']:g}: "
        + ("met" if g["met"] else "missed" if g["met"] is not None else g["reason"]) + ")"
        for name, g in goals.items() if name != "note")


def format_metric(x: float | None, digits: int = 3) -> str:
    """A table cell or log figure: ``x`` with ``digits`` decimals, ``"-"`` for ``None``.

    Args:
      x: the value, or ``None`` (not applicable).
      digits: decimals.

    Returns:
      The formatted value.
    """
    return "-" if x is None else f"{x:.{digits}f}"


def format_table(results: Mapping[str, dict], full: Mapping[str, dict], config: PIIConfig, tagger: dict) -> str:
    """Markdown in the spirit of seed 003's Tables III-VI.

    Args:
      results: ``{variant: row}``, each row holding the :data:`~attacks.config.RESULT_KEYS`.
      full: ``{variant: details}``: every attack's details (``extraction``, ``reconstruction``, ``inference``,
        ``canary_audit``, ``by_repetition``, ``report``, optionally ``lazy_extraction``), in the order of
        ``results``.
      config: the experiment.
      tagger: the tagger's quality on the training records (``tagger["all"]["recall"]``, ``["precision"]``).

    Returns:
      The Markdown text, ending with a newline.
    """
    sizes = config.inference.sizes
    label = headline_label(config)
    m = config.model
    title = (f"# PII leakage of {m.base} fine-tuned four ways ({m.method})" if m.pretrained
             else "# PII leakage of a small GPT-2 trained four ways")
    public = ("Public baseline: the pretrained base itself, untouched (every variant fine-tunes a copy of it)."
              if m.pretrained else "Public baseline: a GPT-2 of the same shape trained on a disjoint public corpus.")
    lines = [title, "", public + " "
             f"Extraction (Table III): {label} strings in {config.extraction.n_samples} top-{config.extraction.top_k}"
             " samples, precision and recall over unique strings against the training PII as the same tagger finds "
             "it, PII the public baseline model also generates removed. Reconstruction "
             f"({config.reconstruction.n_samples} sampled candidates) and inference (|C| = {sizes[0]}, chance "
             f"{1 / sizes[0]:.3f}) of {config.reconstruction.label}: accuracy over the queries the public baseline "
             "model does not already get right. MIA: loss attack (and the reference-model attack calibrated by the "
             "public baseline model), members vs held-out records, scrubbed text for the scrubbed variants (as the "
             "perplexity). Canary exposure: median over the inserted canaries, in bits (log2 of the secret space at "
             "most). Epsilon audited: our one-run lower bound from the canaries inserted once (95%, declared "
             "guess grid).", "",
             "| variant | perplexity | extraction precision | extraction recall | reconstruction acc. | "
             "inference acc. | MIA AUC (loss) | MIA AUC (reference) | canary exposure | epsilon claimed | "
             "epsilon audited |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, r in results.items():
        lines.append(f"| {name} | {format_metric(r['perplexity'], 2)} | {format_metric(r['extraction_precision'])} | "
                     f"{format_metric(r['extraction_recall'])} | {format_metric(r['reconstruction_accuracy'])} | "
                     f"{format_metric(r['inference_accuracy'])} | {format_metric(r['mia_auc'])} | "
                     f"{format_metric(r['mia_auc_reference'])} | {format_metric(r.get('canary_exposure'), 2)} | "
                     f"{format_metric(r['epsilon_claimed'], 2)} | {format_metric(r['epsilon_audited'], 2)} |")

    def pr(rates):
        return f"{format_metric((rates or {}).get('precision'))} / {format_metric((rates or {}).get('recall'))}"

    lines += ["", "Extra columns. Extraction precision / recall: the headline label against the ground-truth spans "
              "(counts the tagger's misses), and every attacked label (micro) against tagged and ground-truth PII. "
              "Accuracy raw: over every query; public model: the baseline model ranking the same lists; agreement "
              "rule: the reference implementation's (a query is skipped when the public model predicts what the "
              "target predicts).", "",
              f"| variant | extraction {label}, ground truth | all labels, tagged | all labels, ground truth | "
              "reconstruction raw / public model / agreement rule | "
              + " | ".join(f"inference |C| = {s}: excl. public / raw / public model" for s in sizes) + " |",
              "|---|---:|---:|---:|---:|" + "---:|" * len(sizes)]
    for name, f in full.items():
        ex, rec = f["extraction"], f["reconstruction"]
        games = {g["n_candidates"]: g for g in f["inference"].get("by_size", [f["inference"]])}
        cells = [pr(ex["per_label"].get(label)), pr(ex.get("tagged")), pr(ex),
                 f"{format_metric(rec.get('accuracy'))} / {format_metric(rec.get('baseline_accuracy'))} / "
                 f"{format_metric(rec.get('accuracy_excluding_agreement'))}"]
        for size in sizes:
            g = games.get(size, {})
            cells.append(f"{format_metric(g.get('accuracy_excluding_baseline'))} / "
                         f"{format_metric(g.get('accuracy'))} / {format_metric(g.get('baseline_accuracy'))}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "The public model's reconstruction ranks candidates sampled from each variant's own model, so it "
              "measures the ranking step only; its inference accuracy is what the data distribution alone gives "
              "away.", ""]
    lines += ["", "Accuracy by how many training records hold the attacked PII (DP bounds one record's "
              "influence; repeated PII is a group):", "",
              "| variant | game | " + " | ".join(r["records"] + " records" for r in
                                                  next(iter(full.values()))["by_repetition"]["inference"]) + " |",
              "|---|---|" + "---:|" * len(REPETITION_BINS)]
    for name, f in full.items():
        for game in ("reconstruction", "inference"):
            cells = [f"{format_metric(r['accuracy'])} (n={r['n_queries']})" for r in f["by_repetition"][game]]
            lines.append(f"| {name} | {game} | " + " | ".join(cells) + " |")
    lazy = {n: (f.get("lazy_extraction") or {}).get("expected_recall") for n, f in full.items()}
    if any(v is not None for v in lazy.values()):
        lines += ["", "Lazy extractability (Algorithm 4, PERSON): expected share of training names that the "
                  f"{config.extraction.n_samples} samples generate at least once: "
                  + ", ".join(f"{n} {format_metric(v)}" for n, v in lazy.items()) + ".", ""]
    lines += ["", "Canary audit (canaries inserted once): our one-run bound (declared grid of top-k+ / bottom-k- "
              "guesses, union bound over it) is the reported epsilon_audited; jax_privacy's one-run value is a "
              "cross-reference (its thresholds are a frontier chosen with the labels, 6.1% false eps > 0 at a "
              "nominal 5%); our Clopper-Pearson estimators on a separate threshold split (standard eps and the GDP "
              "mu lower bound) treat the canaries as independent trials, a cross-check, not a one-run bound.", "",
              "| variant | canary AUC | one-run (ours) | guesses k+/k- (correct) | one-run (jax_privacy, "
              "cross-reference) | CP split std (ours) | CP split mu_low (ours) | CP Bonferroni (jax_privacy) |",
              "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, f in full.items():
        group = next((g for g in f["canary_audit"]["groups"] if g["repetitions"] == 1), None)
        if group is None or group.get("bounds") is None:
            continue
        jp, ours, one = group.get("jax_privacy") or {}, group["bounds"], group.get("one_run") or {}
        guesses = (f"{one['k_plus']}/{one['k_minus']} ({one['correct_plus'] + one['correct_minus']})"
                   if one else "-")
        lines.append(f"| {name} | {format_metric(group['auc'])} | {format_metric(one.get('epsilon'), 2)} | {guesses} | "
                     f"{format_metric(jp.get('one_run'), 2)} | {format_metric(ours['std']['epsilon_std'], 2)} | "
                     f"{format_metric(ours['gdp']['mu_lower'], 2)} | {format_metric(jp.get('cp_bonferroni'), 2)} |")
    goals = compare_variants(results)
    if goals is not None:
        lines += ["", "DP against undefended (" + goals["note"] + "): " + format_goals(goals, words=True) + ".", ""]
    lines += ["", f"Tagger (scrubbing) on the training records: recall {tagger['all']['recall']:.3f}, precision "
              f"{tagger['all']['precision']:.3f}; PII it misses stays in the scrubbed variants' training data.", ""]
    for name, f in full.items():
        rep = f.get("report") or {}
        if rep.get("dp"):
            lines.append(f"- {name}: (epsilon, delta) = ({rep.get('epsilon_pld', float('nan')):.3g} PLD / "
                         f"{rep.get('epsilon_rdp', float('nan')):.3g} RDP, {rep.get('delta'):.2g}); protected unit: "
                         f"{rep.get('protected_unit')}; adjacency: {rep.get('adjacency')}; Poisson sampling q = "
                         f"{rep.get('sampling_rate', float('nan')):.4g}, {rep.get('steps')} steps, C = "
                         f"{rep.get('clip_norm')}, sigma = {rep.get('noise_multiplier', float('nan')):.4g}; "
                         f"randomness: {rep.get('randomness')}.")
    return "\n".join(lines) + "\n"


def plot_leakage(path: str, results: Mapping[str, dict], log: Callable[[str], None]) -> None:
    """Bar chart of the headline rates (extraction precision and recall, reconstruction and inference accuracy,
    MIA AUC) per variant; ``None`` is drawn as 0.

    Without matplotlib it logs so and draws nothing.

    Args:
      path: the PNG file, written atomically.
      results: ``{variant: row}`` of :func:`attacks.run.run_pii`.
      log: progress log (one line when matplotlib is missing).
    """
    from snapaudit_jax.report.plots import pyplot, save_figure

    try:
        plt = pyplot()
    except DependencyError:
        log("matplotlib not installed: no plot")
        return

    keys = ("extraction_precision", "extraction_recall", "reconstruction_accuracy", "inference_accuracy", "mia_auc")
    names = list(results)
    fig, ax = plt.subplots(figsize=(8, 3.5))
    width = 0.8 / max(1, len(names))
    for i, name in enumerate(names):
        vals = [results[name][k] if results[name][k] is not None else 0.0 for k in keys]
        ax.bar(np.arange(len(keys)) + i * width, vals, width, label=name)
    ax.set_xticks(np.arange(len(keys)) + 0.4 - width / 2, [k.replace("_", "\n") for k in keys], fontsize=8)
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize=8)
    ax.set_title("PII leakage by training variant")
    fig.tight_layout()
    save_figure(fig, path, fmt="png", svg_copy=True, dpi=120)  # the SVG: report.html's copy
