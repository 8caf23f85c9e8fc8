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


def plot_epsilon(
    path: str | os.PathLike,
    series: Mapping[str, Sequence[AuditResult] | Sequence[tuple[float, float]]],
    *,
    title: str | None = None,
) -> None:
    """Draws ``eps_emp`` against ``eps_theory`` for each named series, with ``y = x``.

    A series is a list of :class:`AuditResult` or of ``(eps_theory, eps_emp)``
    pairs. Points above the diagonal are certified violations (at the audit's
    confidence). The PNG is written atomically.
    """
    plt = _pyplot()
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
