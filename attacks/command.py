"""The ``snapaudit pii CONFIG.toml`` command, contributed through the ``snapaudit.commands`` entry point."""

from __future__ import annotations

from snapaudit_jax.utils.commands import ConfigCommand

__all__ = ["COMMAND"]


def _load(path):
    from attacks.config import load_pii_config

    return load_pii_config(path)


def _run(config, out_dir, *, progress=True):
    from attacks.run import run_pii

    return run_pii(config, out_dir, progress=progress)


COMMAND = ConfigCommand(
    name="pii",
    help="PII leakage of a small GPT-2 trained undefended, with DP-SGD, scrubbed and both",
    description="Trains the four variants of CONFIG.toml on a synthetic PII corpus, runs the extraction, "
                "reconstruction, inference, membership and canary attacks, and writes results.json, "
                "results_full.json, table.md and leakage.png to the output folder (a rerun resumes).",
    example="pii_small.toml",
    load=_load,
    run=_run,
    report="table.md",
)
