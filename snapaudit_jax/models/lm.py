"""Batched, jitted inference for the decoder models: generation and label scoring.

Prompts are left-padded to a bucketed length and batches to a power of two,
so repeated calls with similar sizes reuse one compiled function. Generation
decodes greedily (or at a temperature, with an explicit key) with the decode
kernel of :mod:`snapaudit_jax.models.inference`.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from snapaudit_jax.models.inference import (
    BatchSample,
    Greedy,
    decode_tokens,
    greedy_matches,
    last_token_logprobs,
    option_logprobs,
    tree_edge_logprobs,
)
from snapaudit_jax.models.parallel import DataParallel
from snapaudit_jax.models.tokenizer import Tokenizer
from snapaudit_jax.utils.errors import InputError

__all__ = ["LanguageModel", "Generation", "chat_prompt", "prompt_ids", "length_bucket", "batch_bucket"]

_LENGTHS = (16, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192)


def length_bucket(n: int) -> int:
    """Padded sequence length for ``n`` tokens: the smallest bucket ``>= n`` (at most 1.5x padding).

    Args:
      n: number of tokens.

    Returns:
      A length from 16, 32, 48, 64, 96, ... 8192, or beyond 8192 ``n`` rounded up to a multiple of 4096.
    """
    for b in _LENGTHS:
        if n <= b:
            return b
    return -(-n // 4096) * 4096


def batch_bucket(n: int) -> int:
    """Padded batch size for ``n`` rows: the smallest power of two ``>= n``.

    Args:
      n: number of rows.

    Returns:
      The power of two (``1`` for ``n <= 1``).
    """
    return 1 << max(0, (n - 1).bit_length())


@dataclasses.dataclass(frozen=True)
class Generation:
    """One generated continuation.

    Attributes:
      text: the decoded new tokens (special tokens skipped).
      token_ids: the new token ids, the end-of-sequence token included if one was emitted.
      prompt_tokens: number of prompt tokens.
    """

    text: str
    token_ids: tuple[int, ...]
    prompt_tokens: int


def _left_pad(rows: Sequence[Sequence[int]], length: int, batch: int, pad: int):
    tokens = np.full((batch, length), pad, np.int32)
    mask = np.zeros((batch, length), bool)
    for i, ids in enumerate(rows):
        ids = list(ids)[-length:]
        tokens[i, length - len(ids):] = ids
        mask[i, length - len(ids):] = True
    for i in range(len(rows), batch):  # filler rows: one token so no row is fully masked
        tokens[i, -1] = pad
        mask[i, -1] = True
    return tokens, mask


@functools.partial(jax.jit, static_argnames=("graphdef", "max_new", "greedy", "eos_ids", "pad_id"))
def _generate(graphdef, state, tokens, mask, key, temperature, live, limit, *, max_new, greedy, eos_ids, pad_id):
    """``(B, max_new)`` new tokens (:func:`~snapaudit_jax.models.inference.decode_tokens`): greedy, or
    :class:`~snapaudit_jax.models.inference.BatchSample` with ``key``; rows with ``live`` false (batch filler)
    count as finished from the start and the loop stops after ``limit <= max_new`` tokens (both dynamic, so
    they do not retrace)."""
    choose = Greedy() if greedy else BatchSample(key, temperature)
    return decode_tokens(nnx.merge(graphdef, state), tokens, mask, choose, limit, live, max_new=max_new,
                         eos_ids=eos_ids, pad_id=pad_id)


@functools.partial(jax.jit, static_argnames=("graphdef",))
def _packed_option_logprobs(graphdef, state, tokens, positions, key_mask, allowed, gather, targets, target_mask):
    """Jitted :func:`~snapaudit_jax.models.inference.option_logprobs`: ``(B, V)``."""
    return option_logprobs(nnx.merge(graphdef, state), tokens, positions, key_mask, allowed, gather, targets,
                           target_mask)


def _pack_options(rows, options, length: int, batch: int, pad: int):
    """Host-side layout of prompts followed by packed options (see :meth:`LanguageModel.label_logprobs`).

    Row ``b``: the left-padded prompt in slots ``[0, length)``, then option
    ``v`` in slots ``length + v*S + [0, S)`` (right-padded). An option token
    sees the prompt's real tokens and the earlier tokens of its own option
    only, with positions continuing the prompt's, so each option is scored as
    if it were the only continuation.
    """
    n_opt, span = len(options), max(map(len, options))
    width = length + n_opt * span
    tokens, prompt_mask = _left_pad(rows, length, batch, pad)
    tokens = np.concatenate([tokens, np.full((batch, n_opt * span), pad, np.int32)], axis=1)
    key_mask = np.concatenate([prompt_mask, np.zeros((batch, n_opt * span), bool)], axis=1)
    opt_ids = np.full((n_opt, span), pad, np.int32)
    opt_mask = np.zeros((n_opt, span), bool)
    for v, ids in enumerate(options):
        opt_ids[v, : len(ids)] = ids
        opt_mask[v, : len(ids)] = True
    tokens[:, length:] = opt_ids.reshape(-1)
    key_mask[:, length:] = opt_mask.reshape(-1)
    prompt_pos = np.where(prompt_mask, np.cumsum(prompt_mask, axis=1) - 1, 1)
    positions = np.concatenate(
        [prompt_pos, (prompt_pos[:, -1:] + 1 + np.tile(np.arange(span), n_opt)[None, :])], axis=1)
    allowed = np.zeros((batch, width, width), bool)
    causal = np.tril(np.ones((length, length), bool))
    allowed[:, :length, :length] = causal[None] & prompt_mask[:, None, :]
    allowed[:, length:, :length] = prompt_mask[:, None, :]
    own = np.kron(np.eye(n_opt, dtype=bool), np.tril(np.ones((span, span), bool)))
    allowed[:, length:, length:] = own[None]
    gather = length + np.arange(n_opt)[:, None] * span + np.arange(span)[None, :] - 1
    gather[:, 0] = length - 1
    return (tokens, positions.astype(np.int32), key_mask, allowed, np.broadcast_to(gather, (batch, n_opt, span)),
            np.broadcast_to(opt_ids, (batch, n_opt, span)), np.broadcast_to(opt_mask, (batch, n_opt, span)))


_PACKED_OPTION_TOKENS = 512  # option tokens packed after one prompt per forward pass
_TREE_NODES = 256  # tree nodes packed after one prompt per forward pass


@functools.partial(jax.jit, static_argnames=("graphdef",))
def _tree_logprobs(graphdef, state, tokens, positions, key_mask, allowed, parents, targets):
    """Jitted :func:`~snapaudit_jax.models.inference.tree_edge_logprobs`: ``(B, E)``."""
    return tree_edge_logprobs(nnx.merge(graphdef, state), tokens, positions, key_mask, allowed, parents, targets)


class _Trie:
    """The token tree of several continuations: node 0 is the empty path; a node's parent has a smaller id."""

    def __init__(self, sequences: Sequence[Sequence[int]]):
        self.parent, self.token, self.depth, self.children = [-1], [-1], [0], [[]]
        edges: dict[tuple[int, int], int] = {}
        self.leaves = []
        for ids in sequences:
            node = 0
            for t in ids:
                child = edges.get((node, int(t)))
                if child is None:
                    child = edges[(node, int(t))] = len(self.parent)
                    self.parent.append(node)
                    self.token.append(int(t))
                    self.depth.append(self.depth[node] + 1)
                    self.children.append([])
                    self.children[node].append(child)
                node = child
            self.leaves.append(node)

    def chain(self, node: int) -> list[int]:
        """The node's ancestors below the root, then the node."""
        out = []
        while node > 0:
            out.append(node)
            node = self.parent[node]
        return out[::-1]

    def chunks(self, capacity: int) -> list[tuple[list[int], list[int]]]:
        """``(slots, owned)`` per forward pass: the non-root inner nodes in depth-first order, each pass holding
        its nodes' ancestors (repeated where a pass starts below them), ``owned`` the nodes whose children's edges
        the pass scores (the first pass also scores the root's)."""
        inner, stack = [], [0]
        while stack:
            node = stack.pop()
            if node and self.children[node]:
                inner.append(node)
            stack.extend(reversed(self.children[node]))
        out: list[tuple[list[int], list[int]]] = []
        slots: list[int] = []
        owned: list[int] = []
        held: set[int] = set()
        for node in inner:
            need = [a for a in self.chain(node) if a not in held]
            if slots and len(slots) + len(need) > capacity:
                out.append((slots, owned))
                slots, owned, held = [], [], set()
                need = self.chain(node)
            slots.extend(need)
            held.update(need)
            owned.append(node)
        out.append((slots, owned))
        return out



@functools.partial(jax.jit, static_argnames=("graphdef", "span"))
def _greedy_match(graphdef, state, tokens, mask, targets, target_mask, *, span):
    """Jitted :func:`~snapaudit_jax.models.inference.greedy_matches`."""
    return greedy_matches(nnx.merge(graphdef, state), tokens, mask, targets, target_mask, span=span)


@functools.partial(jax.jit, static_argnames=("graphdef",))
def _last_logprobs(graphdef, state, tokens, mask, label_ids):
    """Jitted :func:`~snapaudit_jax.models.inference.last_token_logprobs`: ``(B, n_labels)``."""
    return last_token_logprobs(nnx.merge(graphdef, state), tokens, mask, label_ids)


def chat_prompt(tokenizer: Tokenizer, user: str, system: str | None = None) -> str:
    """The chat-template rendering of one user turn (with an optional system prompt).

    Args:
      tokenizer: the model's tokenizer (its chat template).
      user: the user message.
      system: a system message, or ``None`` (none is added).

    Returns:
      The rendered prompt, ending with the generation prompt of the assistant turn.

    Raises:
      TokenizerError: the tokenizer has no chat template, or the template fails.
    """
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True)


def prompt_ids(tokenizer: Tokenizer, prompts, max_length: int) -> list[list[int]]:
    """Token ids of prompts given as texts (tokenised) or as id lists, checked against the position limit.

    Args:
      tokenizer: the model's tokenizer.
      prompts: texts or token id lists (not empty).
      max_length: the model's position limit.

    Returns:
      One id list per prompt.

    Raises:
      InputError: no prompts, a prompt empty after tokenisation, or one longer than ``max_length``.
    """
    if not prompts:
        raise InputError("prompts must not be empty")
    if all(isinstance(p, str) for p in prompts):
        rows = tokenizer.encode_batch(list(prompts))
    else:
        rows = [list(map(int, p)) for p in prompts]
    for i, ids in enumerate(rows):
        if not ids:
            raise InputError(f"prompts[{i}] is empty after tokenisation")
        if len(ids) > max_length:
            raise InputError(f"prompts[{i}] has {len(ids)} tokens, more than the model's {max_length}")
    return rows


class LanguageModel:
    """A decoder model (GPT-2 or Llama) with its tokenizer: batched, jitted generation and scoring.

    Args:
      name: a label for reports (and the answer cache's keys).
      config: the model config (:class:`~snapaudit_jax.models.config.GPT2Config` or ``LlamaConfig``).
      module: the NNX model.
      tokenizer: a :class:`~snapaudit_jax.models.tokenizer.Tokenizer`.
      data_parallel: split each batch over the local devices (weights replicated); ``None`` decides by
        :meth:`DataParallel.auto <snapaudit_jax.models.parallel.DataParallel.auto>` (on CPU: while the replicas
        fit a host-memory budget).

    Attributes:
      name: the label.
      identity: what the answer cache keys the model's answers by (:class:`~snapaudit_jax.models.LLMOracle`): the
        name, and for a model loaded from files (:func:`~snapaudit_jax.models.load_language_model`) a digest of
        their names, sizes and modification times (:func:`~snapaudit_jax.models.local_identity`).
      config: the model config.
      tokenizer: the tokenizer.
      graphdef: the model's NNX graph definition.
      state: its parameters, replicated over ``parallel``'s devices.
      parallel: the :class:`~snapaudit_jax.models.parallel.DataParallel` placement.
      max_length: the model's position limit (prompt plus new tokens).
    """

    def __init__(self, name: str, config, module, tokenizer: Tokenizer, *, data_parallel: bool | None = None):
        """Splits ``module`` into graph and parameters and places the parameters on the devices.

        Args:
          name: see :class:`LanguageModel`.
          config: see :class:`LanguageModel`.
          module: see :class:`LanguageModel`.
          tokenizer: see :class:`LanguageModel`.
          data_parallel: see :class:`LanguageModel`.
        """
        self.name = name
        self.identity = name
        self.config = config
        self.tokenizer = tokenizer
        self.graphdef, state = nnx.split(module)
        self.parallel = DataParallel.auto(state, data_parallel)
        self.state = self.parallel.replicate(state)
        self.max_length = getattr(config, "max_position_embeddings", None) or config.n_positions

    def _batch(self, rows: int) -> int:
        """Padded batch size: a power of two, and a multiple of the device count."""
        return self.parallel.batch_size(batch_bucket(rows))

    @property
    def module(self):
        """The NNX model, merged from ``graphdef`` and ``state``."""
        return nnx.merge(self.graphdef, self.state)

    # --- prompts ---------------------------------------------------------------
    def chat_prompt(self, user: str, system: str | None = None) -> str:
        """The chat-template rendering of one user turn (with an optional system prompt).

        Args:
          user: the user message.
          system: a system message, or ``None`` (none is added).

        Returns:
          The rendered prompt, ending with the generation prompt of the assistant turn.

        Raises:
          TokenizerError: the tokenizer has no chat template, or the template fails.
        """
        return chat_prompt(self.tokenizer, user, system)

    def _ids(self, prompts) -> list[list[int]]:
        return prompt_ids(self.tokenizer, prompts, self.max_length)

    # --- generation ----------------------------------------------------------
    def generate(
        self,
        prompts: Sequence[str] | Sequence[Sequence[int]],
        *,
        max_new_tokens: int = 32,
        temperature: float | None = None,
        key: jax.Array | None = None,
        batch_size: int = 8,
    ) -> list[Generation]:
        """Continues every prompt; greedy unless ``temperature`` is given (then ``key`` is required).

        Prompts are processed in batches of ``batch_size`` (padded to a power of two); generation stops at an
        end-of-sequence token or after ``max_new_tokens`` tokens. Sampling draws one key per batch
        (``fold_in(key, start)`` with the batch's first prompt index) with
        :class:`~snapaudit_jax.models.inference.BatchSample`.

        Args:
          prompts: texts (tokenised with the model's tokenizer, BOS as configured) or token id lists.
          max_new_tokens: tokens to emit at most per prompt, ``>= 1``.
          temperature: sampling temperature, finite and ``> 0``; ``None``: greedy decoding.
          key: PRNG key for sampling; required with ``temperature``.
          batch_size: prompts per forward batch.

        Returns:
          One :class:`Generation` per prompt, in order.

        Raises:
          InputError: empty ``prompts``, a prompt empty after tokenisation, ``max_new_tokens < 1``, an invalid
            ``temperature``, sampling without ``key``, or a prompt plus ``max_new_tokens`` over ``max_length``.
        """
        if max_new_tokens < 1:
            raise InputError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        greedy = temperature is None
        if not greedy:
            if not 0 < temperature < float("inf"):
                raise InputError(f"temperature must be a finite number > 0, got {temperature}")
            if key is None:
                raise InputError("temperature sampling needs an explicit PRNG key")
        key = jax.random.key(0) if key is None else key
        rows = self._ids(prompts)
        longest = max(map(len, rows))
        if longest + max_new_tokens > self.max_length:
            raise InputError(
                f"a prompt of {longest} tokens plus max_new_tokens={max_new_tokens} exceeds the model's "
                f"{self.max_length} positions"
            )
        max_new = length_bucket(max_new_tokens)
        results: list[Generation] = []
        for start in range(0, len(rows), batch_size):
            chunk = rows[start:start + batch_size]
            length = length_bucket(max(map(len, chunk)))
            batch = self._batch(len(chunk))
            tokens, mask, live = self.parallel.split(
                *_left_pad(chunk, length, batch, self.tokenizer.pad_id), jnp.asarray(np.arange(batch) < len(chunk)))
            out = _generate(
                self.graphdef, self.state, tokens, mask, jax.random.fold_in(key, start),
                jnp.float32(1.0 if greedy else temperature), live,
                jnp.int32(max_new_tokens), max_new=max_new, greedy=greedy,
                eos_ids=tuple(self.tokenizer.eos_ids), pad_id=int(self.tokenizer.pad_id),
            )
            out = np.asarray(out)
            for i, ids in enumerate(chunk):
                gen = []
                for t in out[i, :max_new_tokens]:
                    gen.append(int(t))
                    if int(t) in self.tokenizer.eos_ids:
                        break
                results.append(Generation(self.tokenizer.decode(gen), tuple(gen), len(ids)))
        return results

    # --- scoring -------------------------------------------------------------
    def label_logprobs(
        self, prompts: Sequence[str], labels: Sequence[str], *, normalize: bool = False, batch_size: int = 8
    ) -> np.ndarray:
        """``log P(label | prompt)`` for every prompt and label.

        Labels are tokenised on their own and appended to the prompt, so include any leading space they need.
        Single-token labels cost one forward pass per batch of prompts. Multi-token labels are teacher-forced all
        at once: they are packed after the prompt (up to 512 label tokens per pass), each seeing the prompt and its
        own earlier tokens only, so the prompt is computed once for all labels.

        Args:
          prompts: the prompt texts.
          labels: the label texts (non-empty).
          normalize: renormalise over the labels (log-softmax per prompt).
          batch_size: prompts per forward batch.

        Returns:
          ``(n_prompts, n_labels)`` float64 log-probabilities (summed over a label's tokens).

        Raises:
          InputError: empty ``prompts`` or ``labels``, a label or prompt empty after tokenisation, or a prompt plus
            its longest label over ``max_length``.
        """
        if not labels:
            raise InputError("labels must not be empty")
        label_ids = [self.tokenizer.encode_continuation(lab) for lab in labels]
        for lab, ids in zip(labels, label_ids):
            if not ids:
                raise InputError(f"label {lab!r} is empty after tokenisation")
        rows = self._ids(list(prompts))
        longest = max(map(len, rows)) + max(map(len, label_ids))
        if longest > self.max_length:
            raise InputError(f"a prompt plus its longest label has {longest} tokens, more than the model's "
                             f"{self.max_length} positions")
        out = np.empty((len(rows), len(labels)), np.float64)
        single = all(len(ids) == 1 for ids in label_ids)
        for start in range(0, len(rows), batch_size):
            chunk = rows[start:start + batch_size]
            if single:
                length = length_bucket(max(map(len, chunk)))
                tokens, mask = self.parallel.split(
                    *_left_pad(chunk, length, self._batch(len(chunk)), self.tokenizer.pad_id))
                lp = _last_logprobs(self.graphdef, self.state, tokens, mask, jnp.asarray([i[0] for i in label_ids]))
                out[start:start + len(chunk)] = np.asarray(lp)[: len(chunk)]
                continue
            length = length_bucket(max(map(len, chunk)))
            batch = self._batch(len(chunk))
            span = max(map(len, label_ids))
            group = max(1, _PACKED_OPTION_TOKENS // span)
            group = min(group, len(label_ids))
            for first in range(0, len(label_ids), group):
                options = label_ids[first:first + group]
                used = len(options)
                options = options + [options[-1]] * (group - used)  # one shape for every group
                packed = self.parallel.split(*_pack_options(chunk, options, length, batch, self.tokenizer.pad_id))
                lp = _packed_option_logprobs(self.graphdef, self.state, *packed)
                out[start:start + len(chunk), first:first + used] = np.asarray(lp)[: len(chunk), :used]
        if normalize:
            out = out - np.logaddexp.reduce(out, axis=1, keepdims=True)
        return out

    def continuation_logprobs(self, prompt, continuations: Sequence[str], *, batch_size: int = 4,
                              nodes_per_pass: int = _TREE_NODES) -> np.ndarray:
        """``log P(continuation | prompt)`` of many continuations of one prompt, sharing their common prefixes.

        The continuations' tokens (each tokenised on its own, as :meth:`label_logprobs` does) form a tree; every
        inner node is computed once, packed with its ancestors after the prompt (:func:`~snapaudit_jax.models.
        inference.tree_edge_logprobs`), and its next-token distribution scores all of its children. A
        continuation's score is the sum of its edges. For ``10^k`` digit strings split into one token per digit
        the forward passes see about ``10^(k-1)`` nodes instead of ``k 10^k`` tokens. The scores equal
        :meth:`label_logprobs`'s up to float32 summation order.

        Args:
          prompt: the prompt (text, or token ids as :meth:`generate` takes them).
          continuations: the continuation texts (non-empty after tokenisation).
          batch_size: passes per forward batch.
          nodes_per_pass: tree nodes packed after the prompt in one pass.

        Returns:
          ``(n,)`` float64 summed log-probabilities.

        Raises:
          InputError: no continuations, one empty after tokenisation, or the prompt plus the longest continuation
            over ``max_length``.
        """
        if len(continuations) == 0:
            raise InputError("continuations must not be empty")
        ids = [self.tokenizer.encode_continuation(c) for c in continuations]
        for c, x in zip(continuations, ids):
            if not x:
                raise InputError(f"continuation {c!r} is empty after tokenisation")
        row = self._ids([prompt])[0]
        if len(row) + max(map(len, ids)) > self.max_length:
            raise InputError(f"the prompt plus its longest continuation has {len(row) + max(map(len, ids))} tokens, "
                             f"more than the model's {self.max_length} positions")
        trie = _Trie(ids)
        passes = trie.chunks(nodes_per_pass)
        length = length_bucket(len(row))
        width = length + nodes_per_pass
        start = length - len(row)  # the prompt's first real slot (left padding)
        edges = [[c for node in ([0] if i == 0 else []) + owned for c in trie.children[node]]
                 for i, (_, owned) in enumerate(passes)]
        n_edges = batch_bucket(max(map(len, edges)))
        edge_logp = np.zeros(len(trie.parent), np.float64)
        for first in range(0, len(passes), batch_size):
            group = list(range(first, min(first + batch_size, len(passes))))
            batch = self._batch(len(group))
            tokens = np.full((batch, width), self.tokenizer.pad_id, np.int32)
            key_mask = np.zeros((batch, width), bool)
            positions = np.ones((batch, width), np.int32)
            allowed = np.zeros((batch, width, width), bool)
            parents = np.full((batch, n_edges), length - 1, np.int32)
            targets = np.zeros((batch, n_edges), np.int32)
            for b in range(batch):
                tokens[b, start:length], key_mask[b, start:length] = row, True
                positions[b, start:length] = np.arange(len(row))
                allowed[b, start:length, start:length] = np.tril(np.ones((len(row), len(row)), bool))
                allowed[b, length:, start:length] = True  # every node slot (and padding) sees the prompt
                if b >= len(group):
                    continue
                slots, _ = passes[group[b]]
                where = {node: length + k for k, node in enumerate(slots)}
                for node, slot in where.items():
                    tokens[b, slot], key_mask[b, slot] = trie.token[node], True
                    positions[b, slot] = len(row) - 1 + trie.depth[node]
                    allowed[b, slot, [where[a] for a in trie.chain(node)]] = True
                for e, child in enumerate(edges[group[b]]):
                    parent = trie.parent[child]
                    parents[b, e] = length - 1 if parent == 0 else where[parent]
                    targets[b, e] = trie.token[child]
            packed = self.parallel.split(tokens, positions, key_mask, allowed, parents, targets)
            lp = np.asarray(_tree_logprobs(self.graphdef, self.state, *packed), np.float64)
            for b, i in enumerate(group):
                for e, child in enumerate(edges[i]):
                    edge_logp[child] = lp[b, e]
        score = np.zeros(len(trie.parent), np.float64)
        for node in range(1, len(trie.parent)):  # parents have smaller ids
            score[node] = score[trie.parent[node]] + edge_logp[node]
        return score[trie.leaves]

    def greedy_continues_with(
        self, prompts: Sequence[str], continuations: Sequence[str], *, batch_size: int = 8
    ) -> np.ndarray:
        """Whether greedy decoding of each prompt begins with its continuation.

        Exact and cheap: greedy decoding emits the continuation iff, teacher-forced, the arg-max at every
        continuation position is the continuation's token (ties aside), so one forward pass replaces step-by-step
        decoding.

        Args:
          prompts: the prompt texts.
          continuations: one continuation text per prompt (tokenised without BOS).
          batch_size: prompts per forward batch.

        Returns:
          ``(n,)`` bool.

        Raises:
          InputError: the two lists differ in length, a prompt or continuation is empty after tokenisation, or a
            prompt is longer than ``max_length``.
        """
        if len(prompts) != len(continuations):
            raise InputError(f"got {len(prompts)} prompts but {len(continuations)} continuations")
        rows = self._ids(list(prompts))
        conts = [self.tokenizer.encode_continuation(c) for c in continuations]
        for c, ids in zip(continuations, conts):
            if not ids:
                raise InputError(f"continuation {c!r} is empty after tokenisation")
        out = np.empty(len(rows), bool)
        for start in range(0, len(rows), batch_size):
            chunk = list(zip(rows[start:start + batch_size], conts[start:start + batch_size]))
            span = max(len(c) for _, c in chunk)
            seqs = [p + c for p, c in chunk]
            batch = self._batch(len(seqs))
            t = np.zeros((batch, span), np.int32)
            m = np.zeros((batch, span), bool)
            for i, (_, c) in enumerate(chunk):
                t[i, span - len(c):] = c
                m[i, span - len(c):] = True
            tokens, mask = _left_pad(seqs, length_bucket(max(map(len, seqs))), batch, self.tokenizer.pad_id)
            tokens, mask, t, m = self.parallel.split(tokens, mask, t, m)
            match = _greedy_match(self.graphdef, self.state, tokens, mask, t, m, span=span)
            out[start:start + len(chunk)] = np.asarray(match)[: len(chunk)]
        return out
