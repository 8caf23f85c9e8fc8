"""The black-box API the attacks query: sequence log-likelihoods and top-k samples of a decoder LM.

Lukas et al. 2023 give the attacker next-token probabilities for any prefix; everything the attacks need
reduces to two jitted kernels over a Flax NNX decoder (:class:`~snapaudit_jax.models.decoders.GPT2` or
``Llama``) and a :class:`~snapaudit_jax.models.tokenizer.Tokenizer`:

* :func:`score_texts` / :func:`continuation_logprobs`: summed next-token log-likelihoods, batched;
* :func:`sample_texts`: top-k sampling with a KV cache, one PRNG stream per prompt.

Both run the model kernels of :mod:`snapaudit_jax.models.inference` (:func:`~snapaudit_jax.models.sequence_nll`,
:func:`~snapaudit_jax.models.decode` with :class:`~snapaudit_jax.models.Sample`).

Framing (the engine's :func:`~snapaudit_jax.models.inference.frame` and ``start_id``, re-exported here): a text
is the start token (the tokenizer's BOS, else its first EOS id, as GPT-2's ``<|endoftext|>``), the text's tokens
and, for whole records, an EOS. :func:`encode_texts` builds training arrays with the same framing, so
:func:`score_texts` on a training record gives exactly the loss DP-SGD minimised
(:func:`snapaudit_jax.dpsgd.sequence_losses`).

Shapes are bucketed (lengths with :func:`snapaudit_jax.models.lm.length_bucket`, batches to ``batch_size``
or the next power of two below it), so repeated calls of similar size reuse the compiled kernels. Rows are
independent: results do not depend on ``batch_size`` or on which other texts share a call (up to float32
round-off of different padded shapes). Sample ``i`` uses the key ``fold_in(key, i)``.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from snapaudit_jax.models import Sample, decode, sequence_nll
from snapaudit_jax.models.inference import frame, start_id
from snapaudit_jax.models.lm import batch_bucket, length_bucket
from snapaudit_jax.utils import validate
from snapaudit_jax.utils.errors import InputError

__all__ = [
    "SequenceScores",
    "start_id",
    "frame",
    "encode_texts",
    "score_texts",
    "continuation_logprobs",
    "sample_texts",
    "max_positions",
]


class SequenceScores(NamedTuple):
    """Output of :func:`score_texts`.

    Attributes:
      nll: ``(n,)`` float64, ``-sum_t log p(x_t | x_<t)`` over the scored tokens.
      tokens: ``(n,)`` int64, number of scored tokens (all but the start token).
    """

    nll: np.ndarray
    tokens: np.ndarray

    @property
    def mean_nll(self) -> np.ndarray:
        """``(n,)`` per-token negative log-likelihood (the training loss of the record)."""
        return self.nll / np.maximum(self.tokens, 1)

    @property
    def perplexity(self) -> np.ndarray:
        """``(n,)`` ``exp(mean_nll)``."""
        return np.exp(self.mean_nll)


def max_positions(model) -> int:
    """Longest sequence the model embeds (``n_positions`` or ``max_position_embeddings``).

    Args:
      model: an NNX decoder with a ``cfg``.

    Returns:
      The number of positions.
    """
    cfg = model.cfg
    return int(getattr(cfg, "n_positions", None) or cfg.max_position_embeddings)


def encode_texts(tokenizer, texts: Sequence[str], length: int, *, eos: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Right-padded framed token arrays, for training with :func:`snapaudit_jax.dpsgd.train`.

    Args:
      tokenizer: the tokenizer.
      texts: ``n`` texts.
      length: ``L``, columns of the output.
      eos: append the EOS token.

    Returns:
      ``(tokens, mask)``: ``(n, L)`` int32 (padding ``tokenizer.pad_id``) and ``(n, L)`` bool.

    Raises:
      ValueError: a framed text is longer than ``length`` (naming its index and length).
    """
    length = validate.positive_int("length", length, minimum=2)
    tokens = np.full((len(texts), length), int(tokenizer.pad_id), np.int32)
    mask = np.zeros((len(texts), length), bool)
    for i, text in enumerate(texts):
        ids = frame(tokenizer, text, eos=eos)
        if len(ids) > length:
            raise InputError(f"texts[{i}] has {len(ids)} tokens framed, more than length={length}")
        tokens[i, : len(ids)] = ids
        mask[i, : len(ids)] = True
    return tokens, mask


def _batch_size(n: int, batch_size: int) -> int:
    return batch_size if n >= batch_size else min(batch_size, batch_bucket(n))


def _length(n: int, limit: int) -> int:
    return min(length_bucket(n), limit)


@functools.partial(jax.jit, static_argnames=("graphdef",))
def _logprob_kernel(graphdef, state, tokens, mask, score_from):
    """Summed ``log p(x_t | x_<t)`` over real targets ``t >= score_from``, and their count: ``(B,)`` each
    (:func:`snapaudit_jax.models.sequence_nll` of right-padded ``(B, L)`` rows)."""
    nll, count = sequence_nll(nnx.merge(graphdef, state), tokens, mask, score_from)
    return -nll, count


def _score_rows(model, rows: list[list[int]], score_from: list[int], pad_id: int, batch_size: int):
    """Host loop of :func:`_logprob_kernel`: rows sorted by length, chunked, padded, scattered back."""
    limit = max_positions(model)
    for i, ids in enumerate(rows):
        if len(ids) > limit:
            raise InputError(f"sequence {i} has {len(ids)} tokens, more than the model's {limit} positions")
    graphdef, state = nnx.split(model)
    logp = np.zeros(len(rows), np.float64)
    count = np.zeros(len(rows), np.int64)
    order = np.argsort([len(r) for r in rows], kind="stable")
    for begin in range(0, len(rows), batch_size):
        idx = order[begin:begin + batch_size]
        width = _length(max(len(rows[i]) for i in idx), limit)
        batch = _batch_size(len(idx), batch_size)
        tokens = np.full((batch, width), pad_id, np.int32)
        mask = np.zeros((batch, width), bool)
        start = np.ones(batch, np.int32)
        for j, i in enumerate(idx):
            tokens[j, : len(rows[i])] = rows[i]
            mask[j, : len(rows[i])] = True
            start[j] = score_from[i]
        mask[len(idx):, 0] = True  # filler rows: one real token, nothing scored
        lp, n = _logprob_kernel(graphdef, state, jnp.asarray(tokens), jnp.asarray(mask), jnp.asarray(start))
        logp[idx] = np.asarray(lp, np.float64)[: len(idx)]
        count[idx] = np.asarray(n, np.int64)[: len(idx)]
    return logp, count


def score_texts(model, tokenizer, texts: Sequence[str], *, batch_size: int = 16, eos: bool = True) -> SequenceScores:
    """Negative log-likelihood of every framed text (all tokens after the start token).

    Args:
      model: an NNX decoder (``GPT2`` or ``Llama``).
      tokenizer: its tokenizer.
      texts: ``n`` texts.
      batch_size: rows per forward pass.
      eos: frame with a final EOS (as training records).

    Returns:
      :class:`SequenceScores` (``nll``, ``tokens``; ``mean_nll`` and ``perplexity`` derived).

    Raises:
      ValueError: empty ``texts`` or a text longer than the model's context.
    """
    batch_size = validate.positive_int("batch_size", batch_size)
    if len(texts) == 0:
        raise InputError("texts must not be empty")
    rows = [frame(tokenizer, t, eos=eos) for t in texts]
    logp, count = _score_rows(model, rows, [1] * len(rows), int(tokenizer.pad_id), batch_size)
    return SequenceScores(-logp, count)


def continuation_logprobs(
    model, tokenizer, prefixes: Sequence[str], continuations: Sequence[str], *, batch_size: int = 16
) -> np.ndarray:
    """``log P(continuation | start, prefix)`` for each pair: ``(n,)`` float64.

    Prefix and continuation are tokenised separately (the continuation as the model would emit it after the
    prefix), so include any leading space in the continuation.

    Args:
      model: an NNX decoder (``GPT2`` or ``Llama``).
      tokenizer: its tokenizer.
      prefixes: ``n`` prefixes, framed with the start token and no EOS.
      continuations: ``n`` continuations; only their tokens are scored.
      batch_size: rows per forward pass.

    Returns:
      ``(n,)`` float64 summed log-probabilities of the continuation tokens.

    Raises:
      ValueError: different lengths, an empty continuation, or a pair longer than the model's context.
    """
    batch_size = validate.positive_int("batch_size", batch_size)
    if len(prefixes) != len(continuations):
        raise InputError(f"prefixes and continuations must have the same length, got {len(prefixes)} and "
                         f"{len(continuations)}")
    if len(prefixes) == 0:
        raise InputError("prefixes must not be empty")
    rows, starts = [], []
    for i, (p, c) in enumerate(zip(prefixes, continuations)):
        head = frame(tokenizer, p, eos=False)
        tail = frame(tokenizer, c, eos=False, start=False)
        if not tail:
            raise InputError(f"continuations[{i}] is empty after tokenisation: {c!r}")
        rows.append(head + tail)
        starts.append(len(head))
    logp, _ = _score_rows(model, rows, starts, int(tokenizer.pad_id), batch_size)
    return logp


def sample_texts(
    model,
    tokenizer,
    prompts: Sequence[str],
    key: jax.Array,
    *,
    top_k: int = 40,
    max_new_tokens: int = 64,
    temperature: float = 1.0,
    batch_size: int = 16,
) -> list[str]:
    """Top-k samples continuing each prompt (``""``: unconditional, from the start token alone).

    Args:
      model: an NNX decoder.
      tokenizer: its tokenizer.
      prompts: ``n`` prompts (repeat a prompt to draw several samples).
      key: PRNG key; prompt ``i`` uses ``fold_in(key, i)`` whatever the batching.
      top_k: sample among the ``k`` most likely tokens (Fan et al. 2018; ``k = 40`` in Lukas et al. 2023).
      max_new_tokens: tokens per sample at most; a sample ends at its first EOS (not included).
      temperature: divides the logits before the top-k cut.
      batch_size: prompts per decoding pass.

    Returns:
      ``n`` decoded continuations (without the prompt).

    Raises:
      ValueError: invalid sizes, or a prompt plus ``max_new_tokens`` longer than the model's context.
    """
    ids = _sample_ids(model, tokenizer, prompts, key, top_k=top_k, max_new_tokens=max_new_tokens,
                      temperature=temperature, batch_size=batch_size)
    return [tokenizer.decode(row) for row in ids]


def _sample_ids(model, tokenizer, prompts, key, *, top_k, max_new_tokens, temperature, batch_size) -> list[list[int]]:
    """Token ids of :func:`sample_texts` (before decoding), EOS excluded."""
    batch_size = validate.positive_int("batch_size", batch_size)
    max_new_tokens = validate.positive_int("max_new_tokens", max_new_tokens)
    top_k = validate.positive_int("top_k", top_k)
    temperature = validate.positive_float("temperature", temperature)
    vocab = int(model.cfg.vocab_size)
    if top_k > vocab:
        raise InputError(f"top_k must be <= the vocabulary size {vocab}, got {top_k}")
    if len(prompts) == 0:
        raise InputError("prompts must not be empty")
    limit = max_positions(model)
    rows = [frame(tokenizer, p, eos=False) for p in prompts]
    for i, ids in enumerate(rows):
        if len(ids) + max_new_tokens > limit:
            raise InputError(f"prompts[{i}] has {len(ids)} tokens; with max_new_tokens={max_new_tokens} that "
                             f"exceeds the model's {limit} positions")
    eos_ids = tuple(int(e) for e in tokenizer.eos_ids)
    pad = int(tokenizer.pad_id)
    max_new = length_bucket(max_new_tokens)
    keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(len(rows)))
    out: list[list[int]] = [[] for _ in rows]
    order = np.argsort([len(r) for r in rows], kind="stable")
    for begin in range(0, len(rows), batch_size):
        idx = order[begin:begin + batch_size]
        width = length_bucket(max(len(rows[i]) for i in idx))
        batch = _batch_size(len(idx), batch_size)
        tokens = np.full((batch, width), pad, np.int32)
        mask = np.zeros((batch, width), bool)
        for j, i in enumerate(idx):
            tokens[j, width - len(rows[i]):] = rows[i]
            mask[j, width - len(rows[i]):] = True
        mask[len(idx):, -1] = True  # filler rows: one real token
        row_keys = keys[np.concatenate([idx, np.full(batch - len(idx), idx[0])])]
        new = decode(
            model, tokens, mask, Sample(row_keys, jnp.float32(temperature), top_k), max_new_tokens=max_new_tokens,
            max_new=max_new, live=np.arange(batch) < len(idx), eos_ids=eos_ids, pad_id=pad,
        )
        new = np.asarray(new)
        for j, i in enumerate(idx):
            for t in new[j, :max_new_tokens]:
                if int(t) in eos_ids:
                    break
                out[i].append(int(t))
    return out
