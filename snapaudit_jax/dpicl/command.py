"""The ``snapaudit audit CONFIG.toml`` command (built into the command line)."""

from __future__ import annotations

from snapaudit_jax.utils.commands import ConfigCommand

__all__ = ["COMMAND"]

COMMAND = ConfigCommand(
    name="audit",
    help="run real DP-ICL audits from a TOML config (phase A on the LLM, active and passive audits)",
    description="Audit DP-ICL pipelines on a language model as configured in CONFIG.toml (see "
                "examples/quickstart.toml); writes results.json, results_full.json, table.md and PNG plots.",
    example="quickstart.toml",
    load="snapaudit_jax.dpicl.config:load_config",
    run="snapaudit_jax.dpicl.run:run_audit",
    report="table.md",
    summary="snapaudit_jax.dpicl.report:mia_summary",
)
