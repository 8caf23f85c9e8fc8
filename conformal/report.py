"""The report of a ``snapaudit cpa`` run: ``report.md`` and the plots (the ``plots`` extra draws them).

:func:`format_report` writes the Markdown tables at ``report_alpha``; :func:`write_plots` draws
``alpha_dial_<attacker>.png`` (:func:`plot_alpha_dial`) and ``set_sizes_<attacker>.png``
(:func:`plot_set_sizes`) with :func:`snapaudit_jax.report.pyplot` and :func:`~snapaudit_jax.report.save_figure`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import numpy as np

from conformal.config import CPAConfig
from snapaudit_jax.report import pyplot, save_figure

__all__ = ["format_report", "plot_alpha_dial", "plot_set_sizes", "safe_name", "write_plots"]


def safe_name(name: str) -> str:
    """A suite or attacker label as a file name: ``/`` -> ``__``, ``->`` -> ``_to_``, ``*`` -> ``all``.

    Args:
      name: the label (``"synthetic/K2/direct"``, ``"a->b"``).

    Returns:
      The file-name part (``"synthetic__K2__direct"``).
    """
    return name.replace("/", "__").replace("->", "_to_").replace("*", "all")


def format_report(rows: list[dict], config: CPAConfig) -> str:
    """Markdown tables at ``report_alpha``: standard suites, then the stress tests.

    Args:
      rows: the rows of ``summary.json``.
      config: the run's configuration (``report_alpha``, ``score``, split sizes, ``confidence``).

    Returns:
      The Markdown text of ``report.md``.
    """
    a = config.report_alpha
    lines = [f"# Conformal privacy audit (alpha = {a}, score = {config.score}, n_cal = {config.n_cal}, "
             f"n_test = {config.n_test}, splits = {config.splits})", ""]
    if config.server is not None:
        served = ", ".join(a.name for a in config.attackers if a.uses_server)
        lines += [f"LLM attackers {served}: model `{config.server.model}` of the OpenAI-compatible server at "
                  f"{config.server.base_url} (prompts tokenised locally with `{config.server_tokenizer}`). Coverage "
                  "does not assume the server is deterministic: every document is attacked once, by the same "
                  "requests, before the calibration/test split is applied, so server noise cannot tell the two "
                  "apart.", ""]
    header = ("| attacker | suite | level | Top-1 | coverage | cond. coverage | miss rate | median abs(C) | "
              "mean abs(C) | E[1/abs(C)] | qhat | alarm |")
    for kind, title in (("standard", "Suites"), ("drift", "Drift (calibrate -> test)"),
                        ("truncation", "Top-K truncation"), ("pooled", "Pooled calibration over strata"),
                        ("mondrian", "Mondrian (per-stratum) calibration")):
        mine = [r for r in rows if r["kind"] == kind and r["alpha"] == a]
        if not mine:
            continue
        lines += [f"## {title}", "", header, "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        for r in mine:
            qhat = "inf" if r["qhat"] is None else f"{r['qhat']:.4g}"
            cond = "-" if r["coverage_conditional"] is None else f"{r['coverage_conditional']:.3f}"
            alarm = {True: "yes", False: "no", None: "-"}[r.get("validity_alarm")]
            lines.append(f"| {r['attacker']} | {r['suite']} | {r['knowledge_level']} | {r['top1']:.3f} | "
                         f"{r['coverage']:.3f} | {cond} | {r['candidate_miss_rate']:.3f} | "
                         f"{r['median_set_size']:g} | {r['mean_set_size']:.1f} | {r['leakage_proxy']:.4f} | "
                         f"{qhat} | {alarm} |")
        lines.append("")
    lines.append("Coverage holds for the declared configuration under exchangeability of calibration and test "
                 "documents; qhat = inf means full sets. 'alarm': the exact Beta-Binomial validity check of the test "
                 "scores against the calibration scores rejected exchangeability (one-sided: under-coverage; "
                 f"false-alarm probability <= {1 - config.confidence:g} per row, Bonferroni over the levels and "
                 "splits).")
    return "\n".join(lines) + "\n"


def _save(fig, path) -> None:
    save_figure(fig, path, fmt="png", svg_copy=True, bbox_inches="tight")  # the SVG: report.html's copy


def plot_alpha_dial(path: str | os.PathLike, rows: Sequence[Mapping], *, title: str | None = None) -> None:
    """Coverage (with the 1 - alpha target), median set size and E[1/|C|] against alpha, one line per suite.

    Args:
      path: the PNG file.
      rows: standard rows of one attacker (``suite``, ``alpha``, ``coverage``, ``median_set_size``,
        ``leakage_proxy``).
      title: the figure title.

    Raises:
      DependencyError: matplotlib is not installed.
    """
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8), dpi=110)
    suites = sorted({r["suite"] for r in rows})
    for suite in suites:
        mine = sorted((r for r in rows if r["suite"] == suite), key=lambda r: r["alpha"])
        a = [r["alpha"] for r in mine]
        axes[0].plot(a, [r["coverage"] for r in mine], marker="o", label=suite)
        axes[1].plot(a, [max(r["median_set_size"], 0.5) for r in mine], marker="o", label=suite)
        axes[2].plot(a, [r["leakage_proxy"] for r in mine], marker="o", label=suite)
    grid = np.linspace(min(r["alpha"] for r in rows), max(r["alpha"] for r in rows), 50)
    axes[0].plot(grid, 1 - grid, "k--", lw=1, label="1 - alpha")
    axes[0].set_ylabel("coverage")
    axes[1].set_ylabel("median |C|")
    axes[1].set_yscale("log")
    axes[2].set_ylabel("E[1/|C|] (leakage proxy)")
    for ax in axes:
        ax.set_xlabel("alpha")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    if title:
        fig.suptitle(title)
    _save(fig, path)
    plt.close(fig)


def plot_set_sizes(path: str | os.PathLike, sizes: Mapping[str, np.ndarray], *, title: str | None = None) -> None:
    """Box plots of test-document set sizes per suite (log scale; empty sets drawn at 0.5).

    Args:
      path: the PNG file.
      sizes: ``{suite: (n_test,) set sizes}``.
      title: the axes title.

    Raises:
      DependencyError: matplotlib is not installed.
    """
    plt = pyplot()
    names = sorted(sizes)
    fig, ax = plt.subplots(figsize=(max(5, 1.1 * len(names)), 4.2), dpi=110)
    ax.boxplot([np.maximum(np.asarray(sizes[n], float), 0.5) for n in names], showfliers=True)
    ax.set_xticks(range(1, len(names) + 1), names, rotation=35, ha="right", fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("|C| (test documents)")
    ax.grid(alpha=0.3, axis="y")
    if title:
        ax.set_title(title)
    _save(fig, path)
    plt.close(fig)


def write_plots(out_dir: str, rows: list[dict], config: CPAConfig,
                set_sizes: Mapping[str, Mapping[str, np.ndarray]]) -> None:
    """Writes ``alpha_dial_<attacker>.png`` and ``set_sizes_<attacker>.png`` of every attacker with standard rows.

    Args:
      out_dir: the run folder.
      rows: the rows of ``summary.json``.
      config: the run's configuration (its attackers and ``report_alpha``).
      set_sizes: ``{attacker: {suite: (n_test,) set sizes at report_alpha}}``; an attacker without
        any gets no set-size plot.

    Raises:
      DependencyError: matplotlib is not installed.
    """
    for attacker in config.attackers:
        mine = [r for r in rows if r["kind"] == "standard" and r["attacker"] == attacker.name]
        if not mine:
            continue
        plot_alpha_dial(os.path.join(out_dir, f"alpha_dial_{safe_name(attacker.name)}.png"), mine,
                        title=f"{attacker.name}: the alpha dial")
        sizes = set_sizes.get(attacker.name)
        if sizes:
            plot_set_sizes(os.path.join(out_dir, f"set_sizes_{safe_name(attacker.name)}.png"), sizes,
                           title=f"{attacker.name}: set sizes at alpha = {config.report_alpha}")
