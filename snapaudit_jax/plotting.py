"""Plots of empirical against theoretical epsilon (needs the ``plots`` extra)."""

from __future__ import annotations

import io
import os
from collections.abc import Mapping, Sequence

from snapaudit_jax._io import atomic_write
from snapaudit_jax.audit import AuditResult

__all__ = ["plot_epsilon"]


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise RuntimeError("plotting needs matplotlib: pip install 'snapaudit-jax[plots]'") from err
    return plt


def _tradeoff_panel(ax, results: Sequence[AuditResult]) -> None:
    """Certified trade-off points (step upper bound on the release's curve) against the claimed curves."""
    import numpy as np

    from snapaudit_jax.estimation import claimed_tradeoff

    x = np.linspace(0.0, 1.0, 401)
    for i, r in enumerate(results):
        c = r.curve
        colour = f"C{i % 10}"
        fpr = np.asarray(c["fpr_up"], float)
        type2 = 1.0 - np.asarray(c["tpr_low"], float)
        order = np.argsort(fpr)
        # The release's curve T satisfies T(x) <= min{1 - tpr_low_i : fpr_up_i <= x} (T is non-increasing).
        steps = np.minimum.accumulate(type2[order])
        xs = np.concatenate([[0.0], fpr[order], [1.0]])
        ys = np.concatenate([[1.0], steps, steps[-1:]])
        ax.step(xs, ys, where="post", color=colour,
                label=f"certified, eps={r.epsilon_theory:g}")
        ax.plot(x, claimed_tradeoff(r.epsilon_theory, r.delta, x), color=colour, linestyle=":", linewidth=1,
                label=f"claimed f_(eps={r.epsilon_theory:g}, delta)")
    ax.set_xlabel("type I error (FPR)")
    ax.set_ylabel("type II error (1 - TPR)")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_title("trade-off: certified upper bound vs claim\n(a claim above the steps is refuted)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6)


def plot_epsilon(
    path: str | os.PathLike,
    series: Mapping[str, Sequence[AuditResult] | Sequence[tuple[float, float]]],
    *,
    title: str | None = None,
    curves: Sequence[AuditResult] = (),
) -> None:
    """Draws ``eps_emp`` against ``eps_theory`` for each named series, with ``y = x``.

    A series is a list of :class:`AuditResult` or of ``(eps_theory, eps_emp)``
    pairs. Points above the diagonal are certified violations (at the audit's
    confidence). Results in ``curves`` that carry a certified trade-off curve
    (white-box audits) get a second panel with their curves against the
    claimed ``f_(eps, delta)``. The PNG is written atomically.
    """
    plt = _pyplot()
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
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    atomic_write(path, lambda fh: fh.write(buf.getvalue()))
