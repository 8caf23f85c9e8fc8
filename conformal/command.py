"""The ``snapaudit cpa CONFIG.toml`` command, contributed through the ``snapaudit.commands`` entry point."""

from __future__ import annotations

from snapaudit_jax.utils.commands import ConfigCommand

__all__ = ["COMMAND"]

COMMAND = ConfigCommand(
    name="cpa",
    help="conformal privacy audit of re-identification attackers (certified ambiguity sets)",
    description="Calibrates the declared attackers of CONFIG.toml on each linkage suite and writes "
                "summary.json, report.md, per-document JSONL and plots to the output folder.",
    example="cpa_synthetic.toml",
    load="conformal.config:load_cpa_config",
    run="conformal.run:run_cpa",
    report="report.md",
)
