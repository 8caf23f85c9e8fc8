"""The ``snapaudit pii CONFIG.toml`` command, contributed through the ``snapaudit.commands`` entry point."""

from __future__ import annotations

from snapaudit_jax.utils.commands import ConfigCommand

__all__ = ["COMMAND"]

COMMAND = ConfigCommand(
    name="pii",
    help="PII leakage of a pretrained LM fine-tuned undefended, with DP-SGD, scrubbed and both",
    description="Fine-tunes the pretrained base of CONFIG.toml four ways (undefended, DP-SGD, scrubbed, scrubbed + "
                "DP-SGD; model.base = 'scratch': a small GPT-2 trained from a random initialisation instead) on a "
                "synthetic PII corpus, runs the extraction, reconstruction, inference, membership and canary "
                "attacks, and writes results.json, results_full.json, table.md and leakage.png to the output "
                "folder (a rerun resumes).",
    example="pii_small.toml",
    load="attacks.config:load_pii_config",
    run="attacks.run:run_pii",
    report="table.md",
)
