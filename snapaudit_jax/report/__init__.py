"""The report layer shared by the commands: tables and plots.

* :mod:`~snapaudit_jax.report.tables` -- the ``snapaudit simulate`` table;
* :mod:`~snapaudit_jax.report.plots` -- matplotlib (the ``plots`` extra): :func:`pyplot`, :func:`save_figure`
  (atomic, format from the suffix) and :func:`plot_epsilon`.
"""

from snapaudit_jax.report import plots, tables
from snapaudit_jax.report.plots import plot_epsilon, pyplot, save_figure
from snapaudit_jax.report.tables import format_table

__all__ = ["format_table", "plot_epsilon", "plots", "pyplot", "save_figure", "tables"]
