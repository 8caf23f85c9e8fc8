"""The configuration of a DP-SGD run: one frozen, hashable dataclass validated on construction.

Every error names the field, the rule and the value (``ValueError``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from snapaudit_jax.utils import validate
from snapaudit_jax.utils.errors import InputError

__all__ = ["DPSGDConfig", "OPTIMIZERS", "ACCOUNTANTS", "CLIPPINGS", "LAYERS", "CLIPPED_SUM_DTYPES",
           "checked_clipped_sum_dtype"]

OPTIMIZERS = ("sgd", "adam", "adamw")
ACCOUNTANTS = ("rdp", "pld")
CLIPPINGS = ("auto", "per_record", "book_keeping", "ghost")
LAYERS = ("auto", "scan", "unrolled")
CLIPPED_SUM_DTYPES = ("float32", "bfloat16")
#: The most units of a default CPU microbatch on the fast clipping paths (see :meth:`DPSGDConfig.microbatch_for`).
CPU_FAST_MICROBATCH = 4
#: The smallest microbatch whose batch remainder runs in smaller microbatches by default (:meth:`DPSGDConfig.tail_for`).
TAIL_MIN_MICROBATCH = 8
#: From an expected batch of this many microbatches a batch's remainder runs at the microbatch size by default.
TAIL_MAX_BATCH_MICROBATCHES = 8


def checked_clipped_sum_dtype(clipped_sum_dtype: Any, clipping: str) -> str:
    """``clipped_sum_dtype`` checked: one of :data:`CLIPPED_SUM_DTYPES`, and ``"float32"`` unless ``clipping`` can
    be book-keeping (``"book_keeping"`` or ``"auto"``; where ``"auto"`` resolves elsewhere the run refuses it).

    Args:
      clipped_sum_dtype: the setting.
      clipping: the requested clipping path (already checked).

    Returns:
      The dtype's name.

    Raises:
      InputError: an unknown dtype, or bfloat16 with ``"per_record"`` or ``"ghost"``, naming both settings.
    """
    dtype = validate.choice("clipped_sum_dtype", clipped_sum_dtype, CLIPPED_SUM_DTYPES)
    if dtype != "float32" and clipping in ("per_record", "ghost"):
        raise InputError(f"clipped_sum_dtype = {dtype!r} needs the book-keeping path, got clipping = {clipping!r} "
                         "(use \"book_keeping\" or \"auto\")")
    return dtype


def _unit_interval_open_right(name: str, value: Any) -> float:
    out = validate._as_float(name, value)
    if not 0.0 <= out < 1.0:
        raise InputError(f"{name} must be in [0, 1), got {value!r}")
    return out


@dataclasses.dataclass(frozen=True)
class DPSGDConfig:
    """A DP-SGD (or, with ``non_private=True``, a plain) training run of a decoder language model.

    The privacy knobs: ``clip_norm`` ``C`` bounds each record's gradient, Gaussian noise of standard
    deviation ``noise_multiplier * C`` is added to the *sum* of clipped gradients of a Poisson-sampled batch,
    and the result is divided by the expected batch size ``q * N``. Give either ``noise_multiplier`` or
    ``target_epsilon`` (then ``noise_multiplier`` is calibrated so that ``accountant`` reports
    ``epsilon <= target_epsilon`` at ``delta`` after ``steps`` steps), and either ``sampling_rate`` ``q`` or
    the expected ``batch_size`` (``q = batch_size / N``). Fields are validated and normalised on construction.

    Attributes:
      steps: optimizer steps ``T >= 1`` (each one Poisson-sampled batch).
      learning_rate: optimizer step size ``> 0``.
      clip_norm: per-record L2 clipping norm ``C > 0`` (ignored when ``non_private``).
      noise_multiplier: ``sigma >= 0``; noise std on the clipped sum is ``sigma * C``.
      target_epsilon: ``> 0``; calibrate ``sigma`` to it instead of giving ``sigma``.
      delta: ``delta`` in ``(0, 1)`` of the reported ``(epsilon, delta)``; required unless ``non_private``.
        A common choice is well below ``1 / N``.
      sampling_rate: Poisson inclusion probability ``q`` in ``[2^-32, 1]``.
      batch_size: expected batch size ``q * N`` (an integer ``>= 1``), instead of ``sampling_rate``.
      optimizer: ``"sgd"``, ``"adam"`` or ``"adamw"`` (optax).
      momentum: SGD momentum in ``[0, 1)`` (0: plain SGD).
      b1: Adam(W) first-moment decay in ``[0, 1)``.
      b2: Adam(W) second-moment decay in ``[0, 1)``.
      eps: Adam(W) epsilon ``> 0``.
      weight_decay: AdamW decoupled weight decay ``>= 0``.
      microbatch_size: units per clipped-gradient call (``None``: the backend's, :meth:`microbatch_for`: on the
        CPU 1 for per-unit gradients and up to 4 on the fast clipping paths, ``min(32, ceil(q N))`` on
        accelerators).
        Changes speed, memory and float summation order only, never the sampled batch (no truncation) nor the
        privacy guarantee.
      tail_microbatch_size: units per clipped-gradient call for what is left of a Poisson batch after its full
        microbatches (``None``: :meth:`tail_for`'s default, a quarter of the microbatch from 8 units up where the
        expected batch is under 8 microbatches; equal to the microbatch size: every call at that size). Speed
        only, like ``microbatch_size``.
      clipping: how each unit's clipped gradient enters the sum (:mod:`~snapaudit_jax.dpsgd.ghost`; the same sum
        to float32 rounding, so never the guarantee): ``"per_record"`` (one gradient per unit, jax_privacy),
        ``"book_keeping"`` (ghost norms and the clipped sum from one forward and one backward),
        ``"ghost"`` (ghost norms, then a second backward of the clip-weighted loss: less memory), or
        ``"auto"`` (default): book-keeping when the fast paths cover every trainable parameter (DP-LoRA, and full
        fine-tuning of a float32 decoder), else per-record; on every backend (measured faster than per-record, or
        as fast, on every shape tried, the CPU's included: ``benchmarks/bench_finetune.py``,
        ``bench_dpsgd.py``). The report says which and why.
      clipped_sum_dtype: the operands of book-keeping's clipped-sum products (:mod:`~snapaudit_jax.dpsgd.ghost`):
        ``"float32"`` (default) or ``"bfloat16"`` (the matrix units of accelerators; float32 accumulation). With
        bfloat16 the dense factors are rounded once and the norms taken of them, the weighted operand enters as
        two bfloat16 terms, and the clip factors leave the margin of that split (about ``10^-4`` of a unit's
        norm), so each unit's share of the sum stays within ``clip_norm`` and the guarantee is unchanged; the
        sum is the float32 path's to the factors' rounding (0.2% on the tested models). Book-keeping only
        (refused for ``"per_record"`` and ``"ghost"``, and where ``"auto"`` resolves to another path).
      layers: how the decoder's blocks run in the training step (speed of compilation only, the same function to
        float32 rounding): ``"scan"`` (:func:`~snapaudit_jax.models.decoders.stack_layers`: one
        :func:`jax.lax.scan` over the blocks' stacked parameters, so the step compiles in about the time of one
        block), ``"unrolled"`` (one traced copy per block), or ``"auto"`` (default): on accelerators, scan for
        GPT-2 and Llama decoders of at least :data:`~snapaudit_jax.dpsgd.train.SCAN_MIN_LAYERS` blocks of one
        structure (every clipping path), else unrolled; on the CPU unrolled (the scanned step runs 1.2-1.4x as
        long there: ``benchmarks/bench_compile.py``). The model is given back unrolled either way. The report
        says which and why.
      vocab_chunk: ``None`` (default): the LM head's logits are formed whole; an integer: the head runs a slice
        of this many vocabulary rows at a time on every path, the non-private step's included
        (:mod:`snapaudit_jax.models.vocab_head`; the book-keeping and ghost paths take the head's per-unit terms
        from its hidden states and targets): no ``(units, L, V)`` array, at the cost of one more product with the
        head. Memory only: the same function to float32 rounding, so never the guarantee
        (``benchmarks/bench_dpsgd.py --vocab-chunk``).
      accountant: ``"rdp"`` or ``"pld"``: the accountant used to calibrate ``sigma`` to ``target_epsilon``
        (the report always gives both).
      calibration_tol: absolute tolerance on the calibrated ``sigma``.
      pld_discretization: value discretisation interval of the PLD accountant.
      non_private: turn clipping and noise off (plain optax training on the same Poisson batches and the
        same normaliser ``q * N``); the report then says ``dp = False``.
      seed: ``None`` (default): :func:`~snapaudit_jax.dpsgd.train` draws a secret key from the operating
        system's entropy when it gets no ``key``; an integer in ``[0, 2**63 - 1]``: the replayable key
        ``jax.random.key(seed)`` instead, and the guarantee then holds only while the seed stays secret (the
        report says so).

    Raises:
      InputError: (on construction) a field out of range, both or neither of
        ``noise_multiplier`` / ``target_epsilon`` (private runs), either of them set with ``non_private``,
        no ``delta`` for a private run, or both or neither of ``sampling_rate`` / ``batch_size``.
    """

    steps: int
    learning_rate: float
    clip_norm: float = 1.0
    noise_multiplier: float | None = None
    target_epsilon: float | None = None
    delta: float | None = None
    sampling_rate: float | None = None
    batch_size: int | None = None
    optimizer: str = "adamw"
    momentum: float = 0.0
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 1e-4
    microbatch_size: int | None = None
    tail_microbatch_size: int | None = None
    accountant: str = "rdp"
    calibration_tol: float = 1e-4
    pld_discretization: float = 1e-4
    non_private: bool = False
    seed: int | None = None
    clipping: str = "auto"
    layers: str = "auto"
    vocab_chunk: int | None = None
    clipped_sum_dtype: str = "float32"

    def __post_init__(self):
        fix = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731
        fix("steps", validate.positive_int("steps", self.steps))
        fix("learning_rate", validate.positive_float("learning_rate", self.learning_rate))
        if not isinstance(self.non_private, bool):
            raise InputError(f"non_private must be a bool, got {self.non_private!r}")
        if self.non_private:
            for name in ("noise_multiplier", "target_epsilon"):
                if getattr(self, name) is not None:
                    raise InputError(
                        f"{name} must be None when non_private=True (clipping and noise are off), "
                        f"got {getattr(self, name)!r}"
                    )
            if self.delta is not None:
                fix("delta", validate.open_unit("delta", self.delta))
        else:
            fix("clip_norm", validate.positive_float("clip_norm", self.clip_norm))
            if (self.noise_multiplier is None) == (self.target_epsilon is None):
                raise InputError(
                    "exactly one of noise_multiplier and target_epsilon must be set, got "
                    f"noise_multiplier={self.noise_multiplier!r}, target_epsilon={self.target_epsilon!r}"
                )
            if self.noise_multiplier is not None:
                fix("noise_multiplier", validate.nonnegative_float("noise_multiplier", self.noise_multiplier))
            else:
                fix("target_epsilon", validate.positive_float("target_epsilon", self.target_epsilon))
            if self.delta is None:
                raise InputError("delta must be in (0, 1), got None (required unless non_private=True)")
            fix("delta", validate.open_unit("delta", self.delta))
        if (self.sampling_rate is None) == (self.batch_size is None):
            raise InputError(
                "exactly one of sampling_rate and batch_size must be set, got "
                f"sampling_rate={self.sampling_rate!r}, batch_size={self.batch_size!r}"
            )
        if self.sampling_rate is not None:
            q = validate._as_float("sampling_rate", self.sampling_rate)
            if not 0.0 < q <= 1.0:
                raise InputError(f"sampling_rate must be in (0, 1], got {self.sampling_rate!r}")
            if q < 2.0**-32:
                raise InputError(f"sampling_rate must be >= 2**-32 (sampler resolution), got {self.sampling_rate!r}")
            fix("sampling_rate", q)
        else:
            fix("batch_size", validate.positive_int("batch_size", self.batch_size))
        fix("optimizer", validate.choice("optimizer", self.optimizer, OPTIMIZERS))
        fix("momentum", _unit_interval_open_right("momentum", self.momentum))
        fix("b1", _unit_interval_open_right("b1", self.b1))
        fix("b2", _unit_interval_open_right("b2", self.b2))
        fix("eps", validate.positive_float("eps", self.eps))
        fix("weight_decay", validate.nonnegative_float("weight_decay", self.weight_decay))
        if self.microbatch_size is not None:
            fix("microbatch_size", validate.positive_int("microbatch_size", self.microbatch_size))
        if self.tail_microbatch_size is not None:
            fix("tail_microbatch_size", validate.positive_int("tail_microbatch_size", self.tail_microbatch_size))
            if self.microbatch_size is not None and self.tail_microbatch_size > self.microbatch_size:
                raise InputError(f"tail_microbatch_size must be <= microbatch_size={self.microbatch_size}, "
                                 f"got {self.tail_microbatch_size}")
        fix("accountant", validate.choice("accountant", self.accountant, ACCOUNTANTS))
        fix("calibration_tol", validate.positive_float("calibration_tol", self.calibration_tol))
        fix("pld_discretization", validate.positive_float("pld_discretization", self.pld_discretization))
        if self.seed is not None:
            fix("seed", validate.seed("seed", self.seed))
        fix("clipping", validate.choice("clipping", self.clipping, CLIPPINGS))
        fix("clipped_sum_dtype", checked_clipped_sum_dtype(self.clipped_sum_dtype, self.clipping))
        fix("layers", validate.choice("layers", self.layers, LAYERS))
        if self.vocab_chunk is not None:
            fix("vocab_chunk", validate.positive_int("vocab_chunk", self.vocab_chunk))

    @property
    def private(self) -> bool:
        """Whether clipping and noise are on (``not non_private``)."""
        return not self.non_private

    def sampling_rate_for(self, num_records: int) -> float:
        """The Poisson sampling rate ``q`` for a dataset of ``num_records`` records.

        Args:
          num_records: ``N >= 1``.

        Returns:
          ``sampling_rate`` if set, else ``batch_size / N``.

        Raises:
          InputError: ``num_records < 1`` or ``batch_size`` larger than it.
        """
        num_records = validate.positive_int("num_records", num_records)
        if self.sampling_rate is not None:
            return self.sampling_rate
        if self.batch_size > num_records:
            raise InputError(f"batch_size must be <= the number of records N={num_records}, got {self.batch_size}")
        return self.batch_size / num_records

    def microbatch_for(self, num_records: int, backend: str | None = None, clipping: str = "per_record") -> int:
        """Units per clipped-gradient call for a dataset of ``num_records`` units.

        The default trades vectorisation against padding: a Poisson batch of ``K`` units runs ``ceil(K / m)``
        microbatches of ``m``, the last padded. On accelerators ``m = min(32, ceil(q N))``. On the CPU a vmapped
        per-unit gradient costs more than a loop of single ones (2 cores: 1.15-1.6x on a GPT-2 of 2 x 128, 3x on
        the SmolLM2 shape at ``m = 4``), so ``"per_record"`` takes ``m = 1``; book-keeping and ghost clipping
        take the largest power of two ``<= min(4, q N / 4)`` (1 below an expected batch of 8), which keeps the
        expected padding under an eighth of the batch. Book-keeping's step at ``m = 4`` against ``m = 1``, as a
        multiple of the batched non-private step (2 cores, 2026-12-06): GPT-2 2 x 128, expected batches 16-256,
        0.64-0.93x against 0.95-1.13x (``benchmarks/bench_dpsgd.py``); the SmolLM2 shape (2 layers), expected
        batches 16 and 32, DP-LoRA 1.06-1.10x against 1.22-1.26x, DP-full 1.47-1.71x against 1.42-1.73x, the
        same within noise (``bench_finetune.py``).

        Args:
          num_records: ``N``.
          backend: the JAX backend the step runs on (default ``jax.default_backend()``); only used when
            ``microbatch_size`` is ``None``.
          clipping: the resolved clipping path, ``"per_record"``, ``"book_keeping"`` or ``"ghost"`` (what
            :func:`~snapaudit_jax.dpsgd.resolve_clipping` made of ``"auto"``).

        Returns:
          ``microbatch_size`` if set; else the default above.

        Raises:
          InputError: as :meth:`sampling_rate_for` (only when ``microbatch_size`` is ``None``); ``clipping`` not
            one of the three paths.
        """
        if clipping not in CLIPPINGS[1:]:
            raise InputError(f"clipping must be a resolved path ({', '.join(CLIPPINGS[1:])}), got {clipping!r}")
        if self.microbatch_size is not None:
            return self.microbatch_size
        if backend is None:
            import jax

            backend = jax.default_backend()
        expected = self.sampling_rate_for(num_records) * num_records
        if backend != "cpu":
            return max(1, min(32, math.ceil(expected)))
        if clipping == "per_record" or expected < 8:
            return 1
        return min(CPU_FAST_MICROBATCH, 2 ** int(math.floor(math.log2(expected / 4))))

    def tail_for(self, num_records: int, microbatch: int) -> int:
        """Units per clipped-gradient call for what a Poisson batch leaves after its microbatches of ``microbatch``.

        A batch of ``K`` units runs ``floor(K / m)`` microbatches of ``m`` units, then the remaining ``K mod m`` in
        ``ceil((K mod m) / t)`` microbatches of ``t``, the last padded, or in one more of ``m`` where the
        remainder exceeds ``m - t`` (:func:`~snapaudit_jax.dpsgd.sampling.microbatch_calls`): fewer than ``t``
        padded units a step instead of up to ``m - 1``. At an expected batch of ``m`` (the accelerators' default
        ``m = min(32, q N)``) a batch of ``m + 1`` units would run ``2 m``: 45% more units than records on average
        at ``m = 32`` (Poisson batch sizes), against 11% with ``t = 8``. The smaller call is compiled as well
        (once: a second copy of the clipped-sum body in the step, up to about twice the step's compile time), and
        the saving shrinks as the batch grows (at ``m = 32``: 1.23 against 1.05 units a record at an expected
        batch of 64, 1.06 against 1.01 at 256, 1.03 against 1.01 at 512), so the default is ``t = ceil(m / 4)``
        from :data:`TAIL_MIN_MICROBATCH` units up where the expected batch ``q N`` is under
        :data:`TAIL_MAX_BATCH_MICROBATCHES` microbatches, else ``t = m`` (one size, one compiled body).

        Args:
          num_records: ``N`` (with the sampling rate, the expected batch ``q N``).
          microbatch: the run's microbatch size ``m`` (:meth:`microbatch_for`).

        Returns:
          ``tail_microbatch_size`` if set, else the default above; ``t = m`` means one size.

        Raises:
          InputError: ``tail_microbatch_size`` larger than ``microbatch``; as :meth:`sampling_rate_for`.
        """
        microbatch = validate.positive_int("microbatch", microbatch)
        if self.tail_microbatch_size is not None:
            if self.tail_microbatch_size > microbatch:
                raise InputError(f"tail_microbatch_size must be <= the microbatch size {microbatch}, "
                                 f"got {self.tail_microbatch_size}")
            return self.tail_microbatch_size
        expected = self.sampling_rate_for(num_records) * num_records
        if microbatch < TAIL_MIN_MICROBATCH or expected >= TAIL_MAX_BATCH_MICROBATCHES * microbatch:
            return microbatch
        return -(-microbatch // 4)

    def to_dict(self) -> dict[str, Any]:
        """The fields as a JSON-serialisable dictionary."""
        return dataclasses.asdict(self)
