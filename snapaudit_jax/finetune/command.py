"""The ``snapaudit finetune CONFIG.toml`` command (built into the command line)."""

from __future__ import annotations

from snapaudit_jax.utils.commands import ConfigCommand

__all__ = ["COMMAND"]

COMMAND = ConfigCommand(
    name="finetune",
    help="DP fine-tuning of a pretrained model (full or LoRA) on your records, beside a non-private baseline",
    description="Fine-tunes the base model of CONFIG.toml with DP-SGD at the stated (epsilon, delta) for the stated "
                "unit (record or user), trains the non-private twin, measures held-out perplexity and canary "
                "memorization, exports Hugging Face and PEFT folders and writes report.json and report.md "
                "(a rerun resumes). --plan prints the accountant's plan and the step's cost without training.",
    example="finetune_small.toml",
    load="snapaudit_jax.finetune.config:load_finetune_config",
    run="snapaudit_jax.finetune.run:run_finetune",
    report="report.md",
    plan="snapaudit_jax.finetune.run:plan",
)
