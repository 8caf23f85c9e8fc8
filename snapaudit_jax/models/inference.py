"""The inference kernels of the decoder models: one decode loop and one next-token scorer.

* :func:`decode`: prefill left-padded prompts into a fixed-size KV cache, then emit tokens one at a time in a
  ``lax.while_loop`` that stops after ``limit`` tokens or when every row has produced an end-of-sequence token.
  How a token is chosen from the logits is a value: :class:`Greedy`, :class:`Sample` (temperature and optional
  top-k, one PRNG key per row) or :class:`BatchSample` (temperature, one key for the batch).
* :func:`token_logprobs` / :func:`sequence_nll`: teacher-forced ``log p(x_t | x_<t)`` of right-padded rows,
  the quantity that training minimises and that membership and PII attacks score.
* :func:`frame` / :func:`start_id`: the one framing of a text into token ids (the start token -- the tokenizer's
  BOS, else its first EOS id, as GPT-2's ``<|endoftext|>`` --, the text's tokens, an optional EOS) that training
  arrays, the PII attacks and the canary memorization audit (:mod:`snapaudit_jax.finetune.memorization`) share.

Both are pure and jit-able: :func:`decode_tokens`, :func:`token_logprobs` and :func:`sequence_nll` trace
inside a caller's ``jax.jit``; :func:`decode` validates its arguments and calls a jitted kernel whose sizes are
static, so calls with the same shapes reuse one compilation.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from snapaudit_jax.mechanisms.base import pytree_dataclass
from snapaudit_jax.models.decoders import empty_cache
from snapaudit_jax.models.layers import positions_from_mask
from snapaudit_jax.models.vocab_head import head_target_logprobs
from snapaudit_jax.utils.errors import InputError

__all__ = [
    "Greedy",
    "Sample",
    "BatchSample",
    "decode",
    "decode_tokens",
    "token_logprobs",
    "sequence_nll",
    "last_token_logprobs",
    "option_logprobs",
    "tree_edge_logprobs",
    "greedy_matches",
    "start_id",
    "frame",
]


@pytree_dataclass
class Greedy:
    """Token choice: the arg-max of the logits (ties to the lowest id)."""


@pytree_dataclass  # not register_dataclass: Sample and BatchSample have the same fields
class Sample:
    """Token choice: a draw from ``softmax(logits / temperature)``, optionally restricted to the top ``k``.

    Row ``b`` draws step ``s`` with ``fold_in(key[b], s)``, so a row's tokens depend on its own key and
    prompt only, not on the batch it shares or on its place in it.

    Attributes:
      key: ``(B,)`` PRNG keys, one per row.
      temperature: scalar ``> 0`` dividing the (float32) logits before the top-k cut.
      top_k: sample among the ``k`` largest logits (Fan et al. 2018); ``None``: the whole vocabulary. Static.
    """

    key: jax.Array
    temperature: jax.Array | float = 1.0
    top_k: int | None = dataclasses.field(default=None, metadata={"static": True})


@pytree_dataclass
class BatchSample:
    """Token choice: a draw from ``softmax(logits / temperature)`` with one key for the whole batch.

    Step ``s`` uses the second half of the ``s + 1``-th ``split`` of ``key`` (``key, sub = split(key)`` once
    per step), drawing all rows at once; a row's tokens therefore depend on the batch shape. Prefer
    :class:`Sample`; this stream is the one :meth:`~snapaudit_jax.models.LanguageModel.generate` has always
    used.

    Attributes:
      key: one PRNG key.
      temperature: scalar ``> 0`` dividing the logits.
    """

    key: jax.Array
    temperature: jax.Array | float = 1.0


Choice = Greedy | Sample | BatchSample


def _choice_state(choose: Choice):
    """The PRNG state a token choice carries through the loop."""
    return choose.key if isinstance(choose, BatchSample) else ()


def _choose(choose: Choice, state, logits: jax.Array, step) -> tuple[jax.Array, object]:
    """``(B,)`` int32 tokens chosen from ``(B, V)`` logits at ``step``, and the next PRNG state."""
    logits = logits.astype(jnp.float32)
    if isinstance(choose, Greedy):
        return jnp.argmax(logits, axis=-1).astype(jnp.int32), state
    if isinstance(choose, BatchSample):
        state, sub = jax.random.split(state)
        return jax.random.categorical(sub, logits / choose.temperature, axis=-1).astype(jnp.int32), state
    if isinstance(choose, Sample):
        logits = logits / choose.temperature
        draw = jax.vmap(lambda k, v: jax.random.categorical(jax.random.fold_in(k, step), v))
        if choose.top_k is None:
            return draw(choose.key, logits).astype(jnp.int32), state
        values, index = jax.lax.top_k(logits, choose.top_k)
        picked = draw(choose.key, values)
        return jnp.take_along_axis(index, picked[:, None], axis=-1)[:, 0].astype(jnp.int32), state
    raise TypeError(f"choose must be Greedy, Sample or BatchSample, got {type(choose).__name__}")


def decode_tokens(
    model,
    tokens: jax.Array,
    mask: jax.Array,
    choose: Choice,
    limit: jax.Array,
    live: jax.Array | None = None,
    *,
    max_new: int,
    eos_ids: tuple[int, ...] = (),
    pad_id: int = 0,
) -> jax.Array:
    """Traceable decode loop (call it inside ``jax.jit``; :func:`decode` is the validated entry point).

    Args:
      model: an NNX decoder (``GPT2`` or ``Llama``).
      tokens: ``(B, L)`` int32 left-padded prompts.
      mask: ``(B, L)`` bool, real prompt tokens (every row needs one).
      choose: the token choice (:class:`Greedy`, :class:`Sample`, :class:`BatchSample`).
      limit: int32 scalar ``1 <= limit <= max_new``, tokens to emit at most (dynamic: no retrace).
      live: ``(B,)`` bool; rows with ``False`` (batch filler) count as finished from the start. ``None``: all.
      max_new: static size of the output and of the KV cache's generated part.
      eos_ids: static end-of-sequence ids; a row stops after emitting one.
      pad_id: static id written after a row stops.

    Returns:
      ``(B, max_new)`` int32 new tokens: the first end-of-sequence token included, ``pad_id`` after it and
      from column ``limit`` on.

    Raises:
      TypeError: ``choose`` is not a :class:`Greedy`, :class:`Sample` or :class:`BatchSample` (at trace time).
    """
    batch, length = tokens.shape
    slots = length + max_new
    key_mask = jnp.zeros((batch, slots), bool).at[:, :length].set(mask)
    positions = positions_from_mask(mask)
    hidden, cache = model(tokens, positions, key_mask, cache=empty_cache(model, batch, slots), index=0)
    eos = jnp.asarray(eos_ids if eos_ids else (-1,), jnp.int32)

    first, rng = _choose(choose, _choice_state(choose), model.logits(hidden[:, -1]), 0)
    out = jnp.full((batch, max_new), pad_id, jnp.int32).at[:, 0].set(first)
    finished = jnp.isin(first, eos)
    if live is not None:
        finished = finished | ~live

    def cond(carry):
        step, _, _, _, finished, _, _, _ = carry
        return (step < limit) & ~jnp.all(finished)

    def body(carry):
        step, cache, last, pos, finished, out, rng, key_mask = carry
        slot = length + step - 1
        key_mask = key_mask.at[:, slot].set(True)
        hidden, cache = model(last[:, None], pos[:, None], key_mask, cache=cache, index=slot)
        chosen, rng = _choose(choose, rng, model.logits(hidden[:, 0]), step)
        nxt = jnp.where(finished, pad_id, chosen)
        out = jax.lax.dynamic_update_slice(out, nxt[:, None], (0, step))
        return step + 1, cache, nxt, pos + 1, finished | jnp.isin(nxt, eos), out, rng, key_mask

    carry = (jnp.int32(1), cache, first, positions[:, -1] + 1, finished, out, rng, key_mask)
    return jax.lax.while_loop(cond, body, carry)[5]


@functools.partial(jax.jit, static_argnames=("graphdef", "max_new", "eos_ids", "pad_id"))
def _decode(graphdef, state, tokens, mask, choose, limit, live, *, max_new, eos_ids, pad_id):
    return decode_tokens(nnx.merge(graphdef, state), tokens, mask, choose, limit, live, max_new=max_new,
                         eos_ids=eos_ids, pad_id=pad_id)


def decode(
    model,
    tokens: jax.typing.ArrayLike,
    mask: jax.typing.ArrayLike,
    choose: Choice | None = None,
    *,
    max_new_tokens: int,
    max_new: int | None = None,
    live: jax.typing.ArrayLike | None = None,
    eos_ids: Sequence[int] = (),
    pad_id: int = 0,
) -> jax.Array:
    """Continues left-padded prompts with a KV cache, one jitted ``lax.while_loop``.

    Args:
      model: an NNX decoder (``GPT2`` or ``Llama``).
      tokens: ``(B, L)`` int left-padded prompts.
      mask: ``(B, L)`` bool, real prompt tokens; every row needs at least one.
      choose: the token choice; ``None``: :class:`Greedy`. :class:`Sample` needs ``(B,)`` keys.
      max_new_tokens: ``>= 1``, tokens to emit at most per row.
      max_new: columns of the output, ``>= max_new_tokens`` (a bucketed size, so that calls with different
        ``max_new_tokens`` share one compilation); ``None``: ``max_new_tokens``.
      live: ``(B,)`` bool; ``False`` marks filler rows, finished from the start. ``None``: every row is live.
      eos_ids: end-of-sequence ids; a row stops after emitting one.
      pad_id: id written after a row stops.

    Returns:
      ``(B, max_new)`` int32 new tokens (see :func:`decode_tokens`).

    Raises:
      InputError: shapes that do not match, a row without a real token,
        ``max_new_tokens < 1``, ``max_new < max_new_tokens``, a prompt plus ``max_new_tokens`` longer than the
        model's positions, a :class:`Sample` whose keys are not one per row, or ``live`` not ``(B,)``.
      TypeError: ``choose`` is not a :class:`Greedy`, :class:`Sample` or :class:`BatchSample`.
    """
    tokens = jnp.asarray(tokens, jnp.int32)
    mask = jnp.asarray(mask, bool)
    if tokens.ndim != 2 or mask.shape != tokens.shape:
        raise InputError(f"tokens and mask must both be (B, L), got {tokens.shape} and {mask.shape}")
    real = np.asarray(mask).sum(axis=1)
    if real.min() < 1:
        raise InputError(f"mask must mark at least one real token in every row, row {int(real.argmin())} has none")
    if int(max_new_tokens) < 1:
        raise InputError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    max_new = int(max_new_tokens) if max_new is None else int(max_new)
    if max_new < max_new_tokens:
        raise InputError(f"max_new must be >= max_new_tokens={max_new_tokens}, got {max_new}")
    cfg = model.cfg
    positions = getattr(cfg, "n_positions", None) or getattr(cfg, "max_position_embeddings", None)
    if positions is not None and int(real.max()) + int(max_new_tokens) > positions:
        raise InputError(f"a prompt of {int(real.max())} tokens plus max_new_tokens={max_new_tokens} exceeds the "
                         f"model's {positions} positions")
    choose = Greedy() if choose is None else choose
    if isinstance(choose, Sample) and jnp.shape(choose.key) != tokens.shape[:1]:
        raise InputError(f"Sample.key must hold one key per row, shape ({tokens.shape[0]},), got "
                         f"{jnp.shape(choose.key)}")
    if live is not None:
        live = jnp.asarray(live, bool)
        if live.shape != tokens.shape[:1]:
            raise InputError(f"live must be ({tokens.shape[0]},), got shape {live.shape}")
    graphdef, state = nnx.split(model)
    return _decode(graphdef, state, tokens, mask, choose, jnp.int32(max_new_tokens), live, max_new=max_new,
                   eos_ids=tuple(int(e) for e in eos_ids), pad_id=int(pad_id))


def token_logprobs(model, tokens: jax.Array, mask: jax.Array, *, vocab_chunk: int | None = None) -> jax.Array:
    """Teacher-forced next-token log-likelihoods of right-padded rows (traceable, differentiable).

    Args:
      model: an NNX decoder (``GPT2`` or ``Llama``).
      tokens: ``(B, L)`` int token ids.
      mask: ``(B, L)`` bool, real tokens; or an integer loss mask: ``0`` padding, :data:`CONTEXT` a real token
        that is attended to but never a target (a chat record's prompt), :data:`TARGET` a real token that is.
      vocab_chunk: ``None``: the whole logits at once; else the head a slice of this many vocabulary rows at a
        time (:mod:`snapaudit_jax.models.vocab_head`: the same numbers to float32 rounding, no ``(B, L, V)``
        array, one more product with the head in a gradient).

    Returns:
      ``(B, L - 1)`` float32: entry ``t - 1`` is ``log p(tokens[t] | tokens[<t])`` where target ``t`` counts
      (:func:`_targets`), else ``0``.
    """
    real = real_tokens(mask)
    hidden, _ = model(tokens, positions_from_mask(real), real)
    return jnp.where(_targets(mask), _picked_logprobs(model, hidden[:, :-1], tokens[:, 1:], vocab_chunk), 0.0)


def _picked_logprobs(model, hidden: jax.Array, targets: jax.Array, vocab_chunk: int | None = None) -> jax.Array:
    """``log p(targets | hidden)``: ``(B, N)`` float32 for hidden states ``(B, N, D)`` and ids ``(B, N)``.

    The one place where scores are read off the model: the LM head, then the targets' entries of a float32
    log-softmax, taken before the normaliser is subtracted (``(x_t - m) - log sum_v exp(x_v - m)``, ``m`` the
    row's maximum, as :func:`jax.nn.log_softmax` computes it): the same numbers, but the gradient has no
    vocabulary-sized log-softmax cotangent to form, which made training steps about a fifth faster on the CPU.
    """
    if vocab_chunk is not None:
        return head_target_logprobs(model.vocab_head(), hidden, targets, vocab_chunk)
    logits = model.logits(hidden).astype(jnp.float32)
    shifted = logits - jax.lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True))
    normaliser = jnp.log(jnp.sum(jnp.exp(shifted), axis=-1))
    return jnp.take_along_axis(shifted, targets[..., None], axis=-1)[..., 0] - normaliser


def _logprobs(model, hidden: jax.Array) -> jax.Array:
    """The LM head and a float32 log-softmax: ``(..., vocab)`` for hidden states ``(..., D)``."""
    return jax.nn.log_softmax(model.logits(hidden).astype(jnp.float32), axis=-1)


def last_token_logprobs(model, tokens: jax.Array, mask: jax.Array, label_ids: jax.Array) -> jax.Array:
    """``log p(label | prompt)`` of single-token labels after left-padded prompts (traceable).

    Args:
      model: an NNX decoder (``GPT2`` or ``Llama``).
      tokens: ``(B, L)`` int left-padded prompts.
      mask: ``(B, L)`` bool, real prompt tokens.
      label_ids: ``(V,)`` int, one token id per label.

    Returns:
      ``(B, V)`` float32 next-token log-probabilities of the labels after each prompt.
    """
    hidden, _ = model(tokens, positions_from_mask(mask), mask)
    return _logprobs(model, hidden[:, -1])[:, label_ids]


def option_logprobs(model, tokens, positions, key_mask, allowed, gather, targets, target_mask) -> jax.Array:
    """``sum_s log p(option_v[s] | prompt, option_v[:s])`` of multi-token options packed after each prompt.

    Every option of a row is scored in the same forward pass: the layout (built on the host by
    :meth:`~snapaudit_jax.models.LanguageModel.label_logprobs`) lets each option token attend to the prompt's
    real tokens and its own option's earlier tokens only, with positions continuing the prompt's.

    Args:
      model: an NNX decoder (``GPT2`` or ``Llama``).
      tokens: ``(B, W)`` int, prompt slots then the packed options.
      positions: ``(B, W)`` int position ids.
      key_mask: ``(B, W)`` bool, real tokens.
      allowed: ``(B, W, W)`` bool attention pattern.
      gather: ``(B, V, S)`` int, the position whose hidden state predicts each target.
      targets: ``(B, V, S)`` int option token ids.
      target_mask: ``(B, V, S)`` bool, real option tokens.

    Returns:
      ``(B, V)`` float32 summed log-likelihood of each option.
    """
    hidden, _ = model(tokens, positions, key_mask, allowed=allowed)
    b, v, span = targets.shape
    picked_hidden = jnp.take_along_axis(hidden, gather.reshape(b, v * span)[..., None], axis=1)
    picked = _picked_logprobs(model, picked_hidden, targets.reshape(b, v * span))
    return jnp.sum(jnp.where(target_mask, picked.reshape(b, v, span), 0.0), axis=-1)


def tree_edge_logprobs(model, tokens, positions, key_mask, allowed, parents, targets) -> jax.Array:
    """``log p(target_e | the path of parent_e)`` of a token tree packed after each prompt (one forward pass).

    The layout (built on the host by :meth:`~snapaudit_jax.models.LanguageModel.continuation_logprobs`) holds the
    prompt, then one slot per tree node, each attending to the prompt's real tokens and to its ancestors and
    itself only, at the position its depth gives: every node's hidden state is the one it has at the end of its
    own path, so one pass gives the next-token distribution of every node.

    Args:
      model: an NNX decoder (``GPT2`` or ``Llama``).
      tokens: ``(B, W)`` int, prompt slots then the tree's node tokens.
      positions: ``(B, W)`` int position ids.
      key_mask: ``(B, W)`` bool, real tokens.
      allowed: ``(B, W, W)`` bool attention pattern.
      parents: ``(B, E)`` int, the slot whose hidden state predicts each edge's token (the prompt's last slot for
        the root's edges).
      targets: ``(B, E)`` int, each edge's token.

    Returns:
      ``(B, E)`` float32 edge log-probabilities.
    """
    hidden, _ = model(tokens, positions, key_mask, allowed=allowed)
    logp = _logprobs(model, hidden)  # (B, W, vocab): one log-softmax per slot, shared by its children
    vocab = logp.shape[-1]
    flat = parents.astype(jnp.int32) * vocab + targets.astype(jnp.int32)
    return jnp.take_along_axis(logp.reshape(logp.shape[0], -1), flat, axis=1)


def greedy_matches(model, tokens: jax.Array, mask: jax.Array, targets: jax.Array, target_mask: jax.Array, *,
                   span: int) -> jax.Array:
    """Whether greedy decoding would emit the last ``span`` tokens of each row (one teacher-forced pass).

    Args:
      model: an NNX decoder (``GPT2`` or ``Llama``).
      tokens: ``(B, L)`` int left-padded rows: prompt then the ``span`` candidate tokens.
      mask: ``(B, L)`` bool, real tokens.
      targets: ``(B, span)`` int, the candidate tokens.
      target_mask: ``(B, span)`` bool, the candidate's real tokens (the others always match).
      span: static, the candidate length.

    Returns:
      ``(B,)`` bool: every argmax equals its target.
    """
    hidden, _ = model(tokens, positions_from_mask(mask), mask)
    best = jnp.argmax(model.logits(hidden[:, -span - 1:-1]), axis=-1)
    return jnp.all((best == targets) | ~target_mask, axis=-1)


CONTEXT, TARGET = 1, 2  # the values of an integer loss mask (0: padding)


def real_tokens(mask: jax.Array) -> jax.Array:
    """The real tokens of a mask.

    Args:
      mask: ``(..., L)`` bool real-token mask, or an integer loss mask (``0`` padding, :data:`CONTEXT`,
        :data:`TARGET`).

    Returns:
      The bool mask itself, or the loss mask's nonzero entries.
    """
    return mask if mask.dtype == jnp.bool_ else mask > 0


def target_tokens(mask: jax.Array) -> jax.Array:
    """The tokens a loss scores as targets.

    Args:
      mask: as :func:`real_tokens`.

    Returns:
      A bool mask's real tokens, or an integer loss mask's :data:`TARGET` entries.
    """
    return mask if mask.dtype == jnp.bool_ else mask == TARGET


def _targets(mask: jax.Array, score_from: jax.Array | None = None) -> jax.Array:
    """``(B, L - 1)`` bool: target ``t`` counts when token ``t - 1`` is real and token ``t`` a target (a bool
    mask: both real; an integer loss mask: ``mask[t - 1] > 0`` and ``mask[t] == TARGET``), and
    ``t >= score_from``."""
    valid = target_tokens(mask)[:, 1:] & real_tokens(mask)[:, :-1]
    if score_from is not None:
        valid = valid & (jnp.arange(1, mask.shape[1])[None, :] >= score_from[:, None])
    return valid


def sequence_nll(model, tokens: jax.Array, mask: jax.Array, score_from: jax.Array | None = None, *,
                 vocab_chunk: int | None = None):
    """Summed next-token negative log-likelihood of each row, and the number of targets (traceable).

    Args:
      model: an NNX decoder (``GPT2`` or ``Llama``).
      tokens: ``(B, L)`` int token ids, right-padded.
      mask: ``(B, L)`` bool, real tokens; or an integer loss mask (:func:`token_logprobs`).
      score_from: optional ``(B,)`` int, first target position scored per row (``1``: all after the first
        token); ``None``: ``1``.
      vocab_chunk: as :func:`token_logprobs`.

    Returns:
      ``(nll, count)``: ``(B,)`` float32 ``-sum_t log p(tokens[t] | tokens[<t])`` over real targets
      ``t >= score_from`` and ``(B,)`` int32 their number.
    """
    picked = token_logprobs(model, tokens, mask, vocab_chunk=vocab_chunk)
    valid = _targets(mask, score_from)
    return -jnp.sum(jnp.where(valid, picked, 0.0), axis=-1), jnp.sum(valid, axis=-1)


# --- framing ------------------------------------------------------------------------------------------------


def start_id(tokenizer) -> int:
    """The token every framed sequence starts with: BOS, else the first EOS id.

    Args:
      tokenizer: the tokenizer.

    Returns:
      The start token id.

    Raises:
      InputError: the tokenizer has neither.
    """
    if tokenizer.bos_id is not None:
        return int(tokenizer.bos_id)
    if tokenizer.eos_ids:
        return int(tokenizer.eos_ids[0])
    raise InputError("tokenizer must have a bos_id or an eos id to start sequences, got neither")


def frame(tokenizer, text: str, *, eos: bool = True, start: bool = True) -> list[int]:
    """``[start] + tokens(text) (+ [eos])``: the text's tokens as a continuation (never a BOS inside).

    Args:
      tokenizer: the tokenizer.
      text: the text.
      eos: append the first EOS id (whole records; prompts and prefixes go without).
      start: prepend :func:`start_id` (``False``: the tokens of a continuation that follows a framed prefix).

    Returns:
      The framed token ids.

    Raises:
      InputError: ``start`` and the tokenizer has neither a BOS nor an EOS id.
    """
    encode = getattr(tokenizer, "encode_continuation", None) or tokenizer.encode
    ids = ([start_id(tokenizer)] if start else []) + list(encode(text))
    if eos and tokenizer.eos_ids:
        ids.append(int(tokenizer.eos_ids[0]))
    return ids
