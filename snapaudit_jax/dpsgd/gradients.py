"""Per-record loss and per-record clipped gradient sums of the decoder models.

The loss of a record is the next-token cross-entropy averaged over its real target tokens: target
``t + 1`` counts when tokens ``t`` and ``t + 1`` are both real (``mask``), so left or right padding
never contributes. Averaging per record (rather than summing tokens) keeps one record's gradient on
the scale of one example whatever its length; the clipping norm bounds it either way.

Per-record gradients, their clipping to L2 norm ``C`` and the sum are jax_privacy's
``clipped_grad`` (vmap over records, ``nan_safe`` clipping, padding rows zeroed by
``is_padding_example``).

:func:`record_losses` and :func:`loss_summary` evaluate a trained model on a dataset (the mean
per-record loss and perplexity), in fixed-size jitted batches.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax_privacy import clipping

from snapaudit_jax.models.inference import CONTEXT, TARGET, sequence_nll
from snapaudit_jax.models.vocab_head import checked_chunk
from snapaudit_jax.utils import validate
from snapaudit_jax.utils.errors import InputError

__all__ = ["ClippedGrads", "LossSummary", "sequence_losses", "unit_losses", "clipped_grad_sum", "record_losses",
           "loss_summary"]


class ClippedGrads(NamedTuple):
    """Output of :func:`clipped_grad_sum`.

    Attributes:
      grad_sum: sum over non-padding records of the clipped per-record gradients (a pytree like the
        model's ``nnx.Param`` state).
      losses: ``(B,)`` per-record losses (padding rows: whatever their tokens give; ignore them).
      norms: ``(B,)`` per-record gradient L2 norms before clipping.
    """

    grad_sum: nnx.State
    losses: jax.Array
    norms: jax.Array


def sequence_losses(model, tokens: jax.Array, mask: jax.Array, *, vocab_chunk: int | None = None) -> jax.Array:
    """``(B,)`` next-token cross-entropy of each row, averaged over its real targets.

    Args:
      model: a decoder (:class:`~snapaudit_jax.models.decoders.GPT2` or ``Llama``).
      tokens: ``(B, L)`` int token ids.
      mask: ``(B, L)`` bool, real tokens.
      vocab_chunk: ``None``, or the head's vocabulary rows a slice (:func:`snapaudit_jax.models.token_logprobs`).

    Returns:
      ``(B,)`` float32: ``-mean_t log p(tokens[t+1] | tokens[<=t])`` over targets ``t + 1`` with
      ``mask[t] & mask[t+1]``; ``0`` for a row without targets
      (:func:`snapaudit_jax.models.sequence_nll` over the count).
    """
    nll, count = sequence_nll(model, tokens, mask, vocab_chunk=vocab_chunk)
    return nll / jnp.maximum(count, 1)


def unit_losses(model, tokens: jax.Array, mask: jax.Array, *, vocab_chunk: int | None = None) -> jax.Array:
    """Each privacy unit's loss: the sum of its records' :func:`sequence_losses`, so a user's records are summed
    before the unit's gradient is clipped (traceable; every clipping path's loss).

    Args:
      model: a GPT-2 or Llama.
      tokens: ``(U, L)`` one record a unit, or ``(U, k, L)`` a user's ``k`` records (all-padding rows add 0).
      mask: ``tokens``' shape, ``True`` on real tokens.
      vocab_chunk: as :func:`sequence_losses`.

    Returns:
      ``(U,)`` float32.
    """
    length = tokens.shape[-1]
    rows = sequence_losses(model, tokens.reshape(-1, length), mask.reshape(-1, length), vocab_chunk=vocab_chunk)
    return rows.reshape(tokens.shape[0], -1).sum(axis=1)


def _loss_fn(graphdef, rest, vocab_chunk=None):
    # One example is one unit: a record (1, L) or a user's records (1, k, L).
    def loss(params, tokens, mask):
        return jnp.sum(unit_losses(nnx.merge(graphdef, params, rest), tokens, mask, vocab_chunk=vocab_chunk))

    return loss


def _clipped_sum(graphdef, rest, params, tokens, mask, padding, clip_norm, vocab_chunk=None) -> ClippedGrads:
    """Traceable core: jax_privacy clipped gradient sum of one ``(m, L)`` microbatch."""
    fn = clipping.clipped_grad(
        _loss_fn(graphdef, rest, vocab_chunk),
        argnums=0,
        l2_clip_norm=clip_norm,
        batch_argnums=(1, 2),
        keep_batch_dim=True,
        return_values=True,
        return_grad_norms=True,
    )
    grad_sum, aux = fn(params, tokens, mask, is_padding_example=padding)
    return ClippedGrads(grad_sum, aux.values, aux.grad_norms)


@functools.partial(jax.jit, static_argnames=("graphdef", "vocab_chunk"))
def _clipped_sum_jit(graphdef, rest, params, tokens, mask, padding, clip_norm, vocab_chunk=None):
    return _clipped_sum(graphdef, rest, params, tokens, mask, padding, clip_norm, vocab_chunk)


def clipped_grad_sum(model, tokens, mask, *, clip_norm: float, padding=None, trainable=nnx.Param,
                     method: str = "per_record", vocab_chunk: int | None = None,
                     sum_dtype: str = "float32") -> ClippedGrads:
    """Sum of per-record gradients of :func:`sequence_losses`, each clipped to L2 norm ``clip_norm``.

    No noise is added here: the sum is the input of the Gaussian mechanism in
    :func:`~snapaudit_jax.dpsgd.train`.

    Example (DP-LoRA's clipped sum by book-keeping: one forward and one backward, no per-record gradient)::

        from flax import nnx
        from snapaudit_jax.dpsgd import clipped_grad_sum

        out = clipped_grad_sum(model, tokens, mask, clip_norm=1.0, trainable=nnx.LoRAParam,
                               method="book_keeping")
        out.grad_sum  # an nnx.State of the adapters; out.norms: each record's gradient norm

    Args:
      model: a decoder module (its ``nnx.Param`` state is differentiated, or the ``trainable`` state).
      tokens: ``(B, L)`` int token ids (one record per row), or ``(B, k, L)``: unit ``i`` is the ``k`` rows
        ``tokens[i]``, whose losses are summed before the unit's gradient is clipped (user-level DP).
      mask: ``tokens``' shape, bool, real tokens.
      clip_norm: ``C > 0`` (``inf``: no clipping).
      padding: optional ``(B,)`` bool; padding units contribute exactly zero.
      trainable: the ``nnx`` filter of the differentiated parameters (default ``nnx.Param``).
      method: how (:class:`~snapaudit_jax.dpsgd.DPSGDConfig`'s ``clipping``): ``"per_record"`` (default;
        jax_privacy's vmapped per-record gradients), ``"book_keeping"`` or ``"ghost"``
        (:mod:`~snapaudit_jax.dpsgd.ghost`: for models whose every trainable parameter it covers: dense layers,
        LoRA adapters, embeddings, the tied head, LayerNorm/RMSNorm), or ``"auto"``
        (:func:`~snapaudit_jax.dpsgd.resolve_clipping`: book-keeping where it covers every trainable
        parameter, else per-record). The
        same sum to float32 rounding (tested to ``1e-5``).
      vocab_chunk: ``None`` (the whole logits), or the LM head's vocabulary rows a slice on every path
        (:mod:`snapaudit_jax.models.vocab_head`: no ``(B, L, V)`` array; the same sum to float32 rounding).
      sum_dtype: book-keeping's clipped-sum operands (:class:`~snapaudit_jax.dpsgd.DPSGDConfig`'s
        ``clipped_sum_dtype``): ``"float32"`` (default), or ``"bfloat16"`` (each unit's share still within
        ``C``: :func:`~snapaudit_jax.dpsgd.ghost.book_keeping_clipped_sum_traced`); only where ``method``
        resolves to book-keeping.

    Returns:
      :class:`ClippedGrads` ``(grad_sum, losses, norms)``.

    Raises:
      InputError: an invalid ``clip_norm``, ``method`` or ``sum_dtype``, ``tokens`` and ``mask`` not both
        ``(B, L)``, ``padding`` not ``(B,)``, ``"book_keeping"`` / ``"ghost"`` for a model with a trainable
        parameter they do not cover (named), or bfloat16 operands off the book-keeping path.

    Guarantees:
      ``grad_sum = sum_i [not padding_i] g_i min(1, C / ||g_i||)`` (``g_i`` the gradient of unit ``i``'s loss,
      the sum of its rows' losses) (jax_privacy ``clip_pytree``; NaN/inf
      gradients are zeroed first), so adding or removing one record changes it by at most ``C`` in L2 norm,
      whatever the record and the rest of the batch.
    """
    clip_norm = validate.positive_float("clip_norm", clip_norm, allow_inf=True)
    tokens = jnp.asarray(tokens, jnp.int32)
    mask = jnp.asarray(mask, bool)
    if tokens.ndim not in (2, 3) or mask.shape != tokens.shape:
        raise InputError(f"tokens and mask must both be (B, L) or (B, k, L), got {tokens.shape} and {mask.shape}")
    padding = jnp.zeros(tokens.shape[0], bool) if padding is None else jnp.asarray(padding, bool)
    if padding.shape != tokens.shape[:1]:
        raise InputError(f"padding must be ({tokens.shape[0]},), got shape {padding.shape}")
    from snapaudit_jax.dpsgd.config import CLIPPED_SUM_DTYPES, CLIPPINGS

    validate.choice("method", method, CLIPPINGS)
    validate.choice("sum_dtype", sum_dtype, CLIPPED_SUM_DTYPES)
    vocab_chunk = checked_chunk(vocab_chunk)
    graphdef, params, rest = nnx.split(model, trainable, ...)
    reason = "requested"
    if method != "per_record":
        from snapaudit_jax.dpsgd import ghost
        from snapaudit_jax.dpsgd.train import resolve_clipping

        method, reason = resolve_clipping(method, graphdef, params, rest, tokens[:1], mask[:1],
                                          vocab_chunk=vocab_chunk)
    if sum_dtype != "float32" and method != "book_keeping":
        raise InputError(f"sum_dtype = {sum_dtype!r} needs the book-keeping path; method is {method!r} ({reason})")
    if method == "book_keeping":
        return ghost._bk_jit(graphdef, params, rest, tokens, mask, padding, np.float32(clip_norm),
                             vocab_chunk=vocab_chunk, sum_dtype=sum_dtype)
    if method == "ghost":
        return ghost._ghost_jit(graphdef, params, rest, tokens, mask, padding, np.float32(clip_norm),
                                vocab_chunk=vocab_chunk)
    return _clipped_sum_jit(graphdef, rest, params, tokens, mask, padding, np.float32(clip_norm), vocab_chunk)


def _model_limits(model) -> tuple[int | None, int | None]:
    cfg = getattr(model, "cfg", None)
    vocab = getattr(cfg, "vocab_size", None)
    positions = getattr(cfg, "n_positions", None)  # GPT-2's learned positions; RoPE has no table
    return vocab, positions


def _check_dataset(dataset, model, *, units: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Validates ``(tokens, mask)`` against ``model``; returns int32 tokens (padding ids zeroed) and the mask: bool,
    or an int8 loss mask (``0`` padding, ``CONTEXT``, ``TARGET``; see
    :func:`~snapaudit_jax.models.inference.token_logprobs`) when it holds a ``TARGET``.

    ``(N, L)`` arrays hold one record per row. With ``units``, ``(N, k, L)`` arrays are also accepted: unit ``i``
    is the ``k`` rows ``tokens[i]``, of which empty rows (no real token) are padding and every unit needs one
    row with a target.
    """
    try:
        tokens, mask = dataset
    except (TypeError, ValueError):
        raise InputError("dataset must be a pair (tokens, mask) of (N, L) arrays") from None
    tokens, mask = np.asarray(tokens), np.asarray(mask)
    if units and tokens.ndim == 3:
        if tokens.shape[0] < 1 or tokens.shape[1] < 1 or tokens.shape[2] < 2:
            raise InputError(f"dataset tokens must be (N, k, L) with N, k >= 1 and L >= 2, got shape {tokens.shape}")
        if mask.shape != tokens.shape:
            raise InputError(f"dataset mask must have the tokens' shape {tokens.shape}, got {mask.shape}")
        n, k, length = tokens.shape
        flat_mask = np.asarray(mask).reshape(n * k, length)
        used = (flat_mask != 0).any(axis=1)  # the mask's values are checked with the rows below
        if not used.reshape(n, k).any(axis=1).all():
            unit = int(np.argmin(used.reshape(n, k).any(axis=1)))
            raise InputError(f"dataset unit {unit} has no record (every row of tokens[{unit}] is empty)")
        flat_tokens, flat_mask = _check_dataset(
            (tokens.reshape(n * k, length)[used], flat_mask[used]), model
        )
        out_tokens = np.zeros((n * k, length), np.int32)
        out_mask = np.zeros((n * k, length), flat_mask.dtype)
        out_tokens[used], out_mask[used] = flat_tokens, flat_mask
        return out_tokens.reshape(n, k, length), out_mask.reshape(n, k, length)
    if tokens.ndim != 2 or tokens.shape[0] < 1 or tokens.shape[1] < 2:
        what = "(N, L) or (N, k, L)" if units else "(N, L)"
        raise InputError(f"dataset tokens must be {what} with N >= 1 and L >= 2, got shape {tokens.shape}")
    if not np.issubdtype(tokens.dtype, np.integer):
        raise InputError(f"dataset tokens must be integer token ids, got dtype {tokens.dtype}")
    if mask.shape != tokens.shape:
        raise InputError(f"dataset mask must have the tokens' shape {tokens.shape}, got {mask.shape}")
    if mask.dtype != np.bool_:
        if not np.issubdtype(mask.dtype, np.integer) or not np.isin(mask, (0, CONTEXT, TARGET)).all():
            raise InputError(f"dataset mask must be boolean (or 0/1), or a loss mask of 0 (padding), {CONTEXT} "
                             f"(context, never a target) and {TARGET} (target), got values "
                             f"{sorted(np.unique(mask).tolist())[:8]}")
        mask = mask.astype(bool) if not (mask == TARGET).any() else mask.astype(np.int8)
    real_mask = mask if mask.dtype == np.bool_ else mask > 0
    scored = mask if mask.dtype == np.bool_ else mask == TARGET
    vocab, positions = _model_limits(model)
    real = tokens[real_mask]
    if real.size and (real.min() < 0 or (vocab is not None and real.max() >= vocab)):
        bad = real.min() if real.min() < 0 else real.max()
        raise InputError(f"dataset tokens must be in [0, vocab_size={vocab}), got token id {bad}")
    targets = np.sum(scored[:, 1:] & real_mask[:, :-1], axis=1)
    if np.any(targets == 0):
        row = int(np.argmax(targets == 0))
        raise InputError(
            f"dataset mask row {row} has no next-token target (needs a target token after a real token); "
            "drop such records before training"
        )
    longest = int(real_mask.sum(axis=1).max())
    if positions is not None and longest > positions:
        raise InputError(f"dataset records must hold at most n_positions={positions} real tokens, got {longest}")
    tokens = np.where(real_mask, tokens, 0).astype(np.int32)  # padding ids are never read; keep them in range
    return tokens, mask


@functools.partial(jax.jit, static_argnames=("graphdef", "vocab_chunk"))
def _losses_jit(graphdef, state, tokens, mask, vocab_chunk=None):
    return sequence_losses(nnx.merge(graphdef, state), tokens, mask, vocab_chunk=vocab_chunk)


def record_losses(model, dataset, *, batch_size: int = 64, vocab_chunk: int | None = None) -> np.ndarray:
    """:func:`sequence_losses` of every record of ``dataset``, in jitted batches (evaluation; not private).

    Args:
      model: a decoder (:class:`~snapaudit_jax.models.decoders.GPT2` or ``Llama``).
      dataset: ``(tokens, mask)``, ``(N, L)`` token ids and real-token mask (as for
        :func:`~snapaudit_jax.dpsgd.train`; every row needs two consecutive real tokens).
      batch_size: rows per forward pass; the last batch is padded, so one ``(min(batch_size, N), L)`` shape
        is compiled per ``L``.
      vocab_chunk: ``None`` (whole logits), or the LM head's vocabulary rows a slice
        (:mod:`snapaudit_jax.models.vocab_head`: no ``(batch_size, L, V)`` array; the same losses to float32
        rounding).

    Returns:
      ``(N,)`` float64: each record's mean next-token cross-entropy (nats).

    Raises:
      InputError: invalid dataset (shape, dtype, mask, token range, a row without a
        target, more real tokens than GPT-2's positions), ``batch_size`` or ``vocab_chunk``.
    """
    tokens, mask = _check_dataset(dataset, model)
    batch_size = validate.positive_int("batch_size", batch_size)
    vocab_chunk = checked_chunk(vocab_chunk)
    n = tokens.shape[0]
    b = min(batch_size, n)
    padded = -(-n // b) * b
    rows = np.resize(np.arange(n), padded)  # padding rows repeat real records and are dropped
    graphdef, state = nnx.split(model)
    out = [
        _losses_jit(graphdef, state, jnp.asarray(tokens[rows[i : i + b]]), jnp.asarray(mask[rows[i : i + b]]),
                    vocab_chunk)
        for i in range(0, padded, b)
    ]
    return np.concatenate([np.asarray(x, np.float64) for x in jax.device_get(out)])[:n]


class LossSummary(NamedTuple):
    """Output of :func:`loss_summary`.

    Attributes:
      losses: ``(N,)`` per-record mean next-token loss (nats).
      targets: ``(N,)`` next-token targets per record.
      mean_loss: mean of ``losses`` over records (every record weighs the same).
      perplexity: ``exp(mean_loss)``.
      token_loss: loss per target token, ``sum(losses * targets) / sum(targets)``.
      token_perplexity: ``exp(token_loss)`` (the usual language-model perplexity).
    """

    losses: np.ndarray
    targets: np.ndarray
    mean_loss: float
    perplexity: float
    token_loss: float
    token_perplexity: float

    def to_dict(self) -> dict[str, float | int]:
        """The scalar fields (and ``num_records``, ``num_targets``) as a JSON-able dictionary.

        Returns:
          ``{"num_records", "num_targets", "mean_loss", "perplexity", "token_loss", "token_perplexity"}``.
        """
        return {
            "num_records": int(self.losses.size),
            "num_targets": int(self.targets.sum()),
            "mean_loss": self.mean_loss,
            "perplexity": self.perplexity,
            "token_loss": self.token_loss,
            "token_perplexity": self.token_perplexity,
        }


def loss_summary(model, dataset, *, batch_size: int = 64, vocab_chunk: int | None = None) -> LossSummary:
    """Mean per-record loss and perplexity of ``model`` on ``dataset`` (evaluation; not private).

    Args:
      model: a decoder (:class:`~snapaudit_jax.models.decoders.GPT2` or ``Llama``).
      dataset: ``(tokens, mask)`` as for :func:`record_losses`.
      batch_size: rows per forward pass (see :func:`record_losses`).
      vocab_chunk: as :func:`record_losses`.

    Returns:
      The :class:`LossSummary` (per-record losses, target counts, record- and token-weighted losses and
      perplexities; ``inf`` perplexity for a diverged model).

    Raises:
      InputError: invalid dataset or ``batch_size``.
    """
    losses = record_losses(model, dataset, batch_size=batch_size, vocab_chunk=vocab_chunk)
    mask = np.asarray(dataset[1])
    real, scored = (mask, mask) if mask.dtype == np.bool_ else (mask > 0, mask == TARGET)
    targets = np.sum(scored[:, 1:] & real[:, :-1], axis=1).astype(np.int64)
    mean = float(np.mean(losses))
    token = float(np.sum(losses * targets) / np.sum(targets))
    with np.errstate(over="ignore"):  # a diverged model has perplexity inf
        return LossSummary(losses, targets, mean, float(np.exp(mean)), token, float(np.exp(token)))
