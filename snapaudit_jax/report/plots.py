"""Plots (needs the ``plots`` extra): the shared figure writer and the epsilon plots of the audits.

:func:`pyplot` loads matplotlib's non-interactive backend or says how to
install it; :func:`save_figure` writes a figure atomically in the format its
suffix names. The ``cpa`` and ``pii`` commands draw their own figures with
both.
"""

from __future__ import annotations

import io
import os
from collections.abc import Mapping, Sequence

from snapaudit_jax.audits.active import AuditResult
from snapaudit_jax.utils.errors import DependencyError
from snapaudit_jax.utils.io import PLOT_FORMATS, atomic_write, check_output_file

__all__ = ["plot_epsilon", "pyplot", "save_figure"]


def pyplot():
    """``matplotlib.pyplot`` on the Agg backend.

    Returns:
      The ``matplotlib.pyplot`` module.

    Raises:
      DependencyError: matplotlib is not installed (the message gives the install command).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise DependencyError("plotting needs matplotlib: pip install 'snapaudit-jax[plots]'") from err
    return plt


def save_figure(fig, path: str | os.PathLike, *, fmt: str | None = None, svg_copy: bool = False,
                **savefig) -> None:
    """Writes ``fig`` to ``path`` atomically and closes it.

    Args:
      fig: a matplotlib figure.
      path: the output file; its suffix names the format unless ``fmt`` is given.
      fmt: a format of :data:`~snapaudit_jax.utils.io.PLOT_FORMATS`, default the suffix's.
      svg_copy: also write the figure as SVG beside ``path`` (its suffix replaced by ``.svg``; atomically, after
        ``path``): the vector copy that a run folder's ``report.html`` shows inline.
      **savefig: further arguments of ``Figure.savefig`` (``dpi``, ``bbox_inches``).

    Raises:
      InputError: ``path`` is a folder, has an unknown suffix or cannot be written.
    """
    if fmt is None:
        fmt = check_output_file("path", path, PLOT_FORMATS)
    buf, vector = io.BytesIO(), io.BytesIO()
    try:
        fig.savefig(buf, format=fmt, **savefig)
        if svg_copy and fmt != "svg":
            fig.savefig(vector, format="svg", **{k: v for k, v in savefig.items() if k != "dpi"})
    finally:
        pyplot().close(fig)
    atomic_write(path, lambda fh: fh.write(buf.getvalue()))
    if vector.getbuffer().nbytes:
        atomic_write(os.path.splitext(os.fspath(path))[0] + ".svg", lambda fh: fh.write(vector.getvalue()))


def _tradeoff_panel(ax, results: Sequence[AuditResult]) -> None:
    """The certified trade-off curves as log-log ROC lower bounds against the largest ROC each claim allows.

    A trade-off curve ``f`` and a ROC are one object (``TPR = 1 - f(FPR)``); log-log axes show the tails
    where large-epsilon claims fail. Each certified point ``(fpr_up, tpr_low)`` holds simultaneously with
    the others; a point above its claim's line refutes the claim (Kairouz et al. 2015).
    """
    import numpy as np

    from snapaudit_jax.estimation import claimed_tradeoff

    x = np.geomspace(1e-16, 1.0, 400)
    lowest = 1.0
    for i, r in enumerate(results):
        c = r.curve
        colour = f"C{i % 10}"
        fpr = np.asarray(c["fpr_up"], float)
        tpr = np.asarray(c["tpr_low"], float)
        keep = (fpr > 0) & (tpr > 0)
        order = np.argsort(fpr[keep])
        ax.plot(fpr[keep][order], tpr[keep][order], marker="o", markersize=3, color=colour,
                label=f"certified ROC, eps={r.epsilon_theory:g} (eps_curve {c['epsilon']:.2f})")
        ax.plot(x, 1.0 - claimed_tradeoff(r.epsilon_theory, r.delta, x), color=colour, linestyle=":", linewidth=1,
                label=f"largest ROC of ({r.epsilon_theory:g}, {r.delta:g})-DP")
        if keep.any():
            lowest = min(lowest, float(fpr[keep].min()), float(tpr[keep].min()))
    ax.set_xscale("log")
    ax.set_yscale("log")
    floor = max(1e-16, lowest / 10)
    ax.set_xlim(floor, 1.0)
    ax.set_ylim(floor, 1.5)
    ax.set_xlabel("FPR (certified upper bound)")
    ax.set_ylabel("TPR (certified lower bound)")
    ax.set_title("certified trade-off curve as a ROC: a point above\nits claim's dotted line refutes the claim",
                 fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=6)


def plot_epsilon(
    path: str | os.PathLike,
    series: Mapping[str, Sequence[AuditResult] | Sequence[tuple[float, float]]],
    *,
    title: str | None = None,
    curves: Sequence[AuditResult] = (),
    svg_copy: bool = False,
) -> None:
    """Draws ``eps_emp`` against ``eps_theory`` for each named series, with ``y = x``.

    Points above the diagonal are certified violations (at the audit's confidence). Results in ``curves`` that carry
    a certified trade-off curve (white-box audits) get a second panel with their curves against the claimed
    ``f_(eps, delta)``. The file is written atomically, in the format its suffix names.

    Args:
      path: the output file; its suffix is one of :data:`~snapaudit_jax.utils.io.PLOT_FORMATS`.
      series: label -> a list of :class:`AuditResult` or of ``(eps_theory, eps_emp)`` pairs (each non-empty).
      title: the plot's title (optional).
      curves: results whose certified trade-off curves are drawn in the second panel.
      svg_copy: also write an SVG copy beside ``path`` (:func:`save_figure`).

    Raises:
      InputError: ``path`` is a folder, has an unknown suffix or cannot be written.
      DependencyError: matplotlib is not installed.
    """
    fmt = check_output_file("path", path, PLOT_FORMATS)
    plt = pyplot()
    with_curves = [r for r in curves if isinstance(r, AuditResult) and r.curve]
    if with_curves:
        fig, (ax, ax2) = plt.subplots(1, 2, figsize=(10.5, 4.5), dpi=120)
        _tradeoff_panel(ax2, with_curves)
    else:
        fig, ax = plt.subplots(figsize=(5.5, 4.5), dpi=120)
    top = 0.0
    for label, results in series.items():
        pairs = [(r.epsilon_theory, r.epsilon_emp) if isinstance(r, AuditResult) else tuple(r) for r in results]
        xs = [x for x, _ in pairs]
        ys = [y for _, y in pairs]
        top = max(top, max(xs), max(ys))
        ax.plot(xs, ys, marker="o", label=label)
    ax.plot([0, top * 1.05], [0, top * 1.05], color="black", linestyle="--", linewidth=1, label="y = x")
    ax.set_xlabel("epsilon_theory")
    ax.set_ylabel("epsilon_emp (lower bound)")
    if title:
        ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path, fmt=fmt, svg_copy=svg_copy)
