"""Plots of conformal audits (needs the ``plots`` extra): the alpha dial and set-size distributions."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import numpy as np

from snapaudit_jax.report import pyplot, save_figure

__all__ = ["plot_alpha_dial", "plot_set_sizes"]


def _save(fig, path) -> None:
    save_figure(fig, path, fmt="png", bbox_inches="tight")


def plot_alpha_dial(path: str | os.PathLike, rows: Sequence[Mapping], *, title: str | None = None) -> None:
    """Coverage (with the 1 - alpha target), median set size and E[1/|C|] against alpha, one line per suite."""
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
    """Box plots of test-document set sizes per suite (log scale; empty sets drawn at 0.5)."""
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
