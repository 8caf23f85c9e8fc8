"""The ``snapaudit cpa CONFIG.toml`` command, contributed through the ``snapaudit.commands`` entry point."""

from __future__ import annotations

from snapaudit_jax.utils.commands import ConfigCommand

__all__ = ["COMMAND"]


def _load(path):
    from conformal.config import load_cpa_config

    return load_cpa_config(path)


def _run(config, out_dir, *, progress=True):
    from conformal.run import run_cpa

    return run_cpa(config, out_dir, progress=progress)


COMMAND = ConfigCommand(
    name="cpa",
    help="conformal privacy audit of re-identification attackers (certified ambiguity sets)",
    description="Calibrates the declared attackers of CONFIG.toml on each linkage suite and writes "
                "summary.json, report.md, per-document JSONL and plots to the output folder.",
    example="cpa_synthetic.toml",
    load=_load,
    run=_run,
    report="report.md",
)
