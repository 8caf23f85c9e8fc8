"""DP fine-tuning of pretrained language models: ``snapaudit finetune``.

Stages, one module each:

* :mod:`~snapaudit_jax.finetune.config` -- :class:`FinetuneConfig` and :func:`load_finetune_config` (TOML);
* :mod:`~snapaudit_jax.finetune.data` -- records to DP-SGD units (truncation, users and their cap, the held-out
  split, canaries as units of their own);
* :mod:`~snapaudit_jax.finetune.lora` -- LoRA adapters on the Flax decoders, named as Hugging Face and PEFT name
  them; only they train, the base stays bitwise unchanged;
* :mod:`~snapaudit_jax.finetune.run` -- :func:`prepare` (every check before training), :func:`plan`
  (``--plan``), :func:`run_finetune` (the private model, its non-private twin, evaluations, exports);
* :mod:`~snapaudit_jax.finetune.memorization` -- canary exposure, extraction and the one-run bound;
* :mod:`~snapaudit_jax.finetune.export` -- Hugging Face and PEFT folders written without torch;
* :mod:`~snapaudit_jax.finetune.report` -- the report card (``report.json``, ``report.md``).

Example::

    from snapaudit_jax.finetune import load_finetune_config, plan, run_finetune

    config = load_finetune_config("examples/finetune_small.toml")
    print(plan(config))                          # N, q, sigma, epsilon by PLD and RDP, step time
    card = run_finetune(config, "runs/finetune_small")
    print(card["claim"]["epsilon"], card["models"]["private"]["held_out_perplexity"])
"""

from snapaudit_jax.utils.lazy import lazy_package

# Each name loads on first use (:mod:`snapaudit_jax.utils.lazy`): the ``snapaudit`` command line registers
# ``snapaudit finetune`` through :mod:`~snapaudit_jax.finetune.command` without loading JAX.
_EXPORTS = {
    "config": ("FinetuneConfig", "load_finetune_config"),
    "data": ("FinetuneData", "prepare_data"),
    "export": ("read_peft_adapter", "write_hf_folder", "write_peft_adapter"),
    "lora": ("TRAINABLE", "LoRAConfig", "LoRAProjection", "apply_lora", "lora_adapters", "merge_lora"),
    "memorization": ("canary_exposure", "canary_extraction", "one_run_bound", "secret_scores"),
    "report": ("build_report", "format_report"),
    "run": ("Prepared", "plan", "prepare", "run_finetune"),
}
__all__ = [attr for attrs in _EXPORTS.values() for attr in attrs]
__getattr__, __dir__ = lazy_package(__name__, _EXPORTS, ("base", "synthetic"))
