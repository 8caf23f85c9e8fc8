"""DP-SGD for the Flax decoder language models (GPT-2, Llama), on jax_privacy, dp_accounting and optax.

Stages, one module each:

* :mod:`~snapaudit_jax.dpsgd.config` -- :class:`DPSGDConfig`, the frozen run configuration;
* :mod:`~snapaudit_jax.dpsgd.sampling` -- Poisson sampling with fixed shapes (no truncation);
* :mod:`~snapaudit_jax.dpsgd.gradients` -- per-record loss and clipped gradient sums (jax_privacy),
  evaluation (:func:`loss_summary`: mean per-record loss and perplexity);
* :mod:`~snapaudit_jax.dpsgd.noise` -- the Gaussian noise, exact in its tails, and what its sampler adds to delta;
* :mod:`~snapaudit_jax.dpsgd.accounting` -- epsilon (RDP and PLD), noise calibration, :class:`DPReport`;
* :mod:`~snapaudit_jax.dpsgd.checkpoint` -- atomic safetensors + JSON checkpoints;
* :mod:`~snapaudit_jax.dpsgd.train` -- :func:`train`, the jitted DP-SGD step and the loop.

Example::

    from snapaudit_jax.dpsgd import DPSGDConfig, loss_summary, train

    config = DPSGDConfig(steps=1000, learning_rate=1e-3, clip_norm=1.0, target_epsilon=8.0,
                         delta=1e-6, batch_size=256)
    model, history, report = train(model, (tokens, mask), config, key=jax.random.key(0),
                                   checkpoint_dir="runs/dp", progress=True)
    print(report.summary())
    json.dump(report.to_dict(), open("report.json", "w"))
    print(loss_summary(model, (test_tokens, test_mask)).perplexity)
"""

from snapaudit_jax.dpsgd.accounting import (
    ADJACENCY,
    PROTECTED_UNIT,
    AccountantEpsilons,
    Calibration,
    DPReport,
    calibrate,
    calibrate_noise_multiplier,
    compute_epsilon,
    dpsgd_event,
    plan_epsilons,
)
from snapaudit_jax.dpsgd.canaries import (
    Canary,
    CanaryConfig,
    CanarySet,
    canary_continuation,
    canary_prefix,
    group_digits,
    insert_canaries,
    make_canaries,
)
from snapaudit_jax.dpsgd.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from snapaudit_jax.dpsgd.config import ACCOUNTANTS, CLIPPINGS, LAYERS, OPTIMIZERS, DPSGDConfig
from snapaudit_jax.dpsgd.gradients import (
    ClippedGrads,
    LossSummary,
    clipped_grad_sum,
    loss_summary,
    record_losses,
    sequence_losses,
    unit_losses,
)
from snapaudit_jax.dpsgd.noise import gaussian_privatizer, sampler_delta
from snapaudit_jax.dpsgd.sampling import inclusion_threshold, poisson_batch, sampling_probability
from snapaudit_jax.dpsgd.train import (
    HISTORY_KEYS,
    SCAN_MIN_LAYERS,
    ResolvedPrivacy,
    resolve_clipping,
    resolve_layers,
    resolve_privacy,
    train,
)
from snapaudit_jax.dpsgd.tuning import (
    RULES,
    Candidate,
    Compose,
    PoissonRepetitions,
    RandomStopping,
    SweepAccounting,
    TruncatedNegativeBinomial,
    account_sweep,
    draw_candidates,
    draw_repetitions,
    repeat_and_select_rdp,
)

__all__ = [
    "ACCOUNTANTS",
    "CLIPPINGS",
    "LAYERS",
    "ADJACENCY",
    "AccountantEpsilons",
    "Calibration",
    "Candidate",
    "Compose",
    "Canary",
    "CanaryConfig",
    "CanarySet",
    "ClippedGrads",
    "DPReport",
    "DPSGDConfig",
    "HISTORY_KEYS",
    "LossSummary",
    "OPTIMIZERS",
    "PROTECTED_UNIT",
    "PoissonRepetitions",
    "RULES",
    "RandomStopping",
    "ResolvedPrivacy",
    "SweepAccounting",
    "TruncatedNegativeBinomial",
    "account_sweep",
    "calibrate",
    "calibrate_noise_multiplier",
    "canary_continuation",
    "canary_prefix",
    "clipped_grad_sum",
    "compute_epsilon",
    "dpsgd_event",
    "draw_candidates",
    "draw_repetitions",
    "gaussian_privatizer",
    "group_digits",
    "inclusion_threshold",
    "insert_canaries",
    "latest_checkpoint",
    "load_checkpoint",
    "loss_summary",
    "make_canaries",
    "plan_epsilons",
    "poisson_batch",
    "record_losses",
    "repeat_and_select_rdp",
    "resolve_clipping",
    "resolve_layers",
    "SCAN_MIN_LAYERS",
    "resolve_privacy",
    "sampler_delta",
    "sampling_probability",
    "save_checkpoint",
    "sequence_losses",
    "unit_losses",
    "train",
]
