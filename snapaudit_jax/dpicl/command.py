"""The ``snapaudit audit CONFIG.toml`` command (built into the command line)."""

from __future__ import annotations

from snapaudit_jax.utils.commands import ConfigCommand

__all__ = ["COMMAND"]


def _load(path):
    from snapaudit_jax.dpicl.config import load_config

    return load_config(path)


def _run(config, out_dir, *, progress=True):
    from snapaudit_jax.dpicl.run import run_audit

    return run_audit(config, out_dir, progress=progress)


def _summary(result) -> str | None:
    return f"MIA AUC rows: {len(result['mia']['rows'])} (mia.json)" if result.get("mia") else None


COMMAND = ConfigCommand(
    name="audit",
    help="run real DP-ICL audits from a TOML config (phase A on the LLM, active and passive audits)",
    description="Audit DP-ICL pipelines on a language model as configured in CONFIG.toml (see "
                "examples/quickstart.toml); writes results.json, results_full.json, table.md and PNG plots.",
    example="quickstart.toml",
    load=_load,
    run=_run,
    report="table.md",
    summary=_summary,
)
