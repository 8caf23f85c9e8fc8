"""Decoder-only language models in Flax NNX: GPT-2 and Llama.

Both expose the same call::

    hidden, cache = model(tokens, positions, key_mask, cache=cache, index=index)
    logits = model.logits(hidden)

* ``tokens``, ``positions``: ``(B, L)`` int32 (positions from
  :func:`~snapaudit_jax.models.layers.positions_from_mask` for left padding);
* ``key_mask``: ``(B, S)`` bool, slots holding real tokens; without a cache
  ``S = L`` and it is the attention mask of the batch;
* ``cache``: a tuple of :class:`~snapaudit_jax.models.layers.LayerCache` (one per
  layer, ``S`` slots) or ``None``; new keys/values are written at ``index``.

``logits`` is separate so scoring can apply the vocabulary projection only to
the positions it needs.

:func:`stack_layers` gives a model whose blocks run as one :func:`jax.lax.scan` over parameters stacked on a
leading layer axis (training, scoring, and decoding with the stacked cache of :func:`empty_cache`): tracing and
compiling cost one block whatever the depth; :func:`unstack_layers` gives the per-block model back.

The compute dtype is the parameters' dtype (:attr:`GPT2.dtype`, :attr:`Llama.dtype`;
:func:`~snapaudit_jax.models.weights.cast_model` casts a model). Below float32
(bfloat16) activations and the KV cache take that dtype, and what transformers
keeps in float32 stays float32: RMSNorm statistics (``LlamaRMSNorm``: normalise
in float32, round, then scale), LayerNorm (computed in float32, rounded once),
the attention softmax, and the logits (float32 sums, float32 result; transformers
returns them rounded to bfloat16). A float32 model computes as it always has.
"""

from __future__ import annotations

import operator

import jax
import jax.numpy as jnp
from flax import nnx

from snapaudit_jax.models.config import GPT2Config, LlamaConfig
from snapaudit_jax.models.layers import (
    LayerCache,
    apply_rope,
    attend,
    attention_bias,
    causal_allowed,
    rope_frequencies,
    rope_tables,
    write_cache,
)
from snapaudit_jax.utils.errors import InputError

__all__ = ["GPT2", "Llama", "StackedBlocks", "check_stackable", "stack_layers", "unstack_layers"]


def _low_precision(x) -> bool:
    """Whether ``x`` is in a floating dtype narrower than float32 (bfloat16, float16)."""
    return jnp.dtype(x.dtype).itemsize < 4


def _rms_norm(norm: nnx.RMSNorm, x):
    """``norm(x)``; below float32 as transformers' ``LlamaRMSNorm``: statistics and normalisation in float32,
    rounded to the input dtype, then multiplied by the scale."""
    if not _low_precision(x):
        return norm(x)
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + norm.epsilon)
    return norm.scale[...] * normed.astype(x.dtype)


def _embed(embed: nnx.Embed, tokens):
    """Rows of the embedding table in its own dtype (``nnx.Embed`` casts to the dtype it was built with).

    An object standing in for the table with a ``lookup`` method (the gradient taps of
    :mod:`snapaudit_jax.dpsgd.ghost`, which see each lookup's ids and output cotangents) is asked for the rows.
    """
    lookup = getattr(embed, "lookup", None)
    if lookup is not None:
        return lookup(tokens)
    return jnp.take(embed.embedding[...], tokens, axis=0)


def _project_vocab(hidden, weight, equation: str):
    """Low-precision logits ``einsum(equation, hidden, weight)`` summed and returned in float32."""
    return jnp.einsum(equation, hidden, weight, preferred_element_type=jnp.float32)


def _mask_bias(key_mask, cache, index, length, allowed=None):
    """The additive attention mask of a forward pass, shared by all layers.

    ``allowed`` ``(B, L, S)`` replaces the causal mask (e.g. several
    continuations packed after one prompt); it must never let a query see a
    later slot, which block-causal prefill attention relies on.
    """
    if allowed is None:
        allowed = causal_allowed(key_mask, 0 if cache is None else index, length)
    return attention_bias(allowed)


def _prefill_blocks(length: int, index) -> int:
    """Query blocks of block-causal attention: only for a pass starting at slot 0 (a prefill)."""
    if isinstance(index, int) and index == 0:
        return max(1, min(4, length // 64))
    return 1


def _self_attention(q, k, v, bias, cache, index):
    """Attention of new tokens over the cache (or over themselves without a cache)."""
    blocks = _prefill_blocks(q.shape[1], 0 if cache is None else index)
    if cache is None:
        return attend(q, k, v, bias, causal_blocks=blocks), None
    cache = write_cache(cache, k, v, index)
    return attend(q, cache.k, cache.v, bias, causal_blocks=blocks), cache


def check_stackable(blocks):
    """Raises unless ``blocks`` can be stacked (nothing is traced or copied).

    Args:
      blocks: a decoder's blocks.

    Returns:
      Their common :class:`flax.nnx.GraphDef` (one block's structure).

    Raises:
      InputError: fewer than two blocks, or blocks that differ in structure (e.g. LoRA adapters on some layers
        only), named by index.
    """
    if len(blocks) < 2:
        raise InputError(f"stacking the layers needs at least two blocks, got {len(blocks)}")
    graphdef = nnx.graphdef(blocks[0])
    for i, block in enumerate(blocks[1:], start=1):
        if nnx.graphdef(block) != graphdef:
            raise InputError(f"block {i} differs in structure from block 0 (adapters or modules on some layers "
                             "only): the layers cannot be stacked")
    return graphdef


def _stacked_state(blocks):
    """``(graphdef, state)`` of ``blocks`` stacked along a new leading axis (the layer axis); see
    :func:`check_stackable`."""
    graphdef = check_stackable(blocks)
    return graphdef, jax.tree.map(lambda *leaves: jnp.stack(leaves), *(nnx.state(block) for block in blocks))


class StackedBlocks(nnx.Module):
    """A decoder's blocks as one block whose every parameter has a leading layer axis, run by one scan.

    Tracing and compiling a forward and backward pass then cost one block whatever the depth (the unrolled
    blocks cost one each: ``benchmarks/bench_compile.py``), and the optimizer and the DP noise see one array per
    parameter kind instead of one per layer. :func:`stack_layers` builds it, :func:`unstack_layers` gives the
    decoder back its blocks (loading, LoRA, export and the transformers parity work on those).

    Args:
      blocks: the decoder's blocks, all of one structure.

    Attributes:
      layers: one block holding every block's parameters stacked (``(n, ...)``).
      count: the number of blocks ``n``.
    """

    scans_blocks = True  # the decoders run it (or a stand-in marked alike) as one call without a KV cache

    def __init__(self, blocks):
        """Stacks ``blocks`` (their parameters are copied; the blocks are not modified).

        Args:
          blocks: see :class:`StackedBlocks`.
        """
        graphdef, state = _stacked_state(blocks)
        self.layers = nnx.merge(graphdef, state)
        self.count = len(blocks)

    def __len__(self) -> int:
        return self.count

    def unstacked(self) -> list:
        """Every block as a module of its own (its parameters sliced out of the stack), in order.

        Returns:
          The ``n`` blocks; writing to them does not change the stack.
        """
        graphdef, state = nnx.split(self.layers)
        return [nnx.merge(graphdef, jax.tree.map(operator.itemgetter(i), state)) for i in range(self.count)]

    def __call__(self, x, *args):
        """``x`` through every block in order, without a KV cache, as one :func:`jax.lax.scan`.

        Args:
          x: ``(B, L, E)`` hidden states.
          *args: the blocks' shared inputs (GPT-2: the attention bias; Llama: the RoPE tables and the bias).

        Returns:
          ``(B, L, E)`` hidden states after the last block.
        """
        graphdef, state = nnx.split(self.layers)

        def body(h, layer_state):
            h, _ = nnx.merge(graphdef, layer_state)(h, *args, None, 0)
            return h, None

        return jax.lax.scan(body, x, state)[0]

    def cached(self, x, *args, cache: LayerCache, index):
        """``x`` through every block with a stacked KV cache, as one :func:`jax.lax.scan` over the blocks and their
        caches.

        Args:
          x: ``(B, L, E)`` hidden states.
          *args: the blocks' shared inputs, as :meth:`__call__`.
          cache: one :class:`~snapaudit_jax.models.layers.LayerCache` whose keys and values carry a leading layer
            axis (``(n, B, S, K, D)``: :func:`empty_cache` of a stacked model).
          index: slot of the first new token.

        Returns:
          ``(hidden, cache)``: the hidden states after the last block and the cache with the new keys and values
          written at ``index`` (a new stacked cache: decoding copies it once per step, where an unrolled model
          writes in place).
        """
        graphdef, state = nnx.split(self.layers)

        def body(h, xs):
            layer_state, k, v = xs
            h, new = nnx.merge(graphdef, layer_state)(h, *args, LayerCache(k, v), index)
            return h, (new.k, new.v)

        h, (k, v) = jax.lax.scan(body, x, (state, cache.k, cache.v))
        return h, LayerCache(k, v)


def stack_layers(model):
    """``model`` with its blocks stacked into one :class:`StackedBlocks` (a scan over the layers).

    Args:
      model: a :class:`GPT2` or :class:`Llama` (LoRA adapters, if any, applied to every block alike).

    Returns:
      A new model computing the same function (same outputs up to float32 rounding, tested), whose parameters
      under ``blocks.layers`` have a leading layer axis; ``model`` is not modified. A stacked model is returned
      as it is.

    Raises:
      InputError: fewer than two blocks, or blocks of different structure.
    """
    if isinstance(model.blocks, StackedBlocks):
        return model
    return _with_blocks(model, lambda blocks: StackedBlocks(list(blocks)))


def unstack_layers(model):
    """``model`` with one module per block again (the inverse of :func:`stack_layers`, bitwise).

    Args:
      model: a decoder, stacked or not.

    Returns:
      A new model with ``blocks`` a list of blocks; an unstacked ``model`` is returned as it is.
    """
    if not isinstance(model.blocks, StackedBlocks):
        return model
    return _with_blocks(model, lambda blocks: nnx.List(blocks.unstacked()))


def _with_blocks(model, make):
    """A copy of ``model`` (its parameters copied) whose ``blocks`` are ``make(the copy's blocks)``."""
    graphdef, state = nnx.split(model)
    copy = nnx.merge(graphdef, state, copy=True)
    copy.blocks = make(copy.blocks)
    return copy


def _run_blocks(model, x, args, cache, index):
    """``x`` through every block, with the new cache (``None`` without one): one scan for stacked blocks without a
    cache or with a stacked one, else block by block (a stacked model's blocks sliced out of the stack for a tuple
    of per-layer caches)."""
    blocks = model.blocks
    if getattr(type(blocks), "scans_blocks", False):  # StackedBlocks, or the gradient taps' stand-in for one
        if cache is None:
            return blocks(x, *args), None
        if isinstance(cache, LayerCache):  # a stacked cache (empty_cache of a stacked model)
            return blocks.cached(x, *args, cache=cache, index=index)
        blocks = blocks.unstacked()
    new_cache = []
    for i, block in enumerate(blocks):
        x, layer_cache = block(x, *args, None if cache is None else cache[i], index)
        new_cache.append(layer_cache)
    return x, (None if cache is None else tuple(new_cache))


class _GPT2Block(nnx.Module):
    def __init__(self, cfg: GPT2Config, rngs: nnx.Rngs):
        e = cfg.n_embd
        self.cfg = cfg
        self.ln_1 = nnx.LayerNorm(e, epsilon=cfg.layer_norm_epsilon, rngs=rngs)
        self.c_attn = nnx.Linear(e, 3 * e, rngs=rngs)  # HF Conv1D: (in, out), x @ W + b
        self.attn_proj = nnx.Linear(e, e, rngs=rngs)
        self.ln_2 = nnx.LayerNorm(e, epsilon=cfg.layer_norm_epsilon, rngs=rngs)
        self.c_fc = nnx.Linear(e, cfg.n_inner, rngs=rngs)
        self.mlp_proj = nnx.Linear(cfg.n_inner, e, rngs=rngs)

    def __call__(self, x, bias, cache, index):
        cfg = self.cfg
        b, length, _ = x.shape
        q, k, v = jnp.split(self.c_attn(self.ln_1(x)), 3, axis=-1)
        shape = (b, length, cfg.n_head, cfg.head_dim)
        out, cache = _self_attention(q.reshape(shape), k.reshape(shape), v.reshape(shape), bias, cache, index)
        x = x + self.attn_proj(out.reshape(b, length, cfg.n_embd))
        h = self.c_fc(self.ln_2(x))
        h = jax.nn.gelu(h, approximate=cfg.activation == "gelu_new")
        return x + self.mlp_proj(h), cache


class GPT2(nnx.Module):
    """GPT-2 language model with tied input/output embeddings (Radford et al. 2019).

    Args:
      cfg: the model's configuration.
      rngs: PRNG streams for the (random) initial parameters; a loaded checkpoint overwrites them.

    Attributes:
      cfg: the configuration.
      wte: token embedding ``(V, E)``, also the output projection.
      wpe: learned position embedding ``(n_positions, E)``.
      blocks: the ``cfg.n_layer`` transformer blocks.
      ln_f: the final LayerNorm.
    """

    def __init__(self, cfg: GPT2Config, rngs: nnx.Rngs):
        """Builds the embeddings and blocks with randomly initialised parameters.

        Args:
          cfg: see :class:`GPT2`.
          rngs: see :class:`GPT2`.
        """
        self.cfg = cfg
        self.wte = nnx.Embed(cfg.vocab_size, cfg.n_embd, rngs=rngs)
        self.wpe = nnx.Embed(cfg.n_positions, cfg.n_embd, rngs=rngs)
        self.blocks = nnx.List([_GPT2Block(cfg, rngs) for _ in range(cfg.n_layer)])
        self.ln_f = nnx.LayerNorm(cfg.n_embd, epsilon=cfg.layer_norm_epsilon, rngs=rngs)

    @property
    def num_layers(self) -> int:
        """Number of transformer blocks (KV-cache layers)."""
        return self.cfg.n_layer

    @property
    def dtype(self):
        """Compute dtype: the token embedding's (activations and the KV cache take it)."""
        return self.wte.embedding.dtype

    def cache_shape(self) -> tuple[int, int]:
        """Per-slot shape of one layer's KV cache.

        Returns:
          ``(heads, head_dim)``: ``(cfg.n_head, cfg.head_dim)``.
        """
        return self.cfg.n_head, self.cfg.head_dim

    def __call__(self, tokens, positions, key_mask, cache=None, index=0, allowed=None):
        """Runs the blocks over new tokens, reading and writing the KV cache if one is given.

        Args:
          tokens: ``(B, L)`` int32 token ids.
          positions: ``(B, L)`` int32 position ids (:func:`~snapaudit_jax.models.layers.positions_from_mask`
            for left-padded rows).
          key_mask: ``(B, S)`` bool, slots holding real tokens; without a cache ``S = L``.
          cache: one :class:`~snapaudit_jax.models.layers.LayerCache` per layer, each ``(B, S, H, D)`` (for a
            stacked model also one ``LayerCache`` of ``(n, B, S, H, D)``: :func:`empty_cache`), or ``None``
            (attention over the new tokens only).
          index: slot of the first new token in the cache (int or int32 scalar); ignored without a cache.
          allowed: optional ``(B, L, S)`` bool replacing the causal mask; it must never let a query see a later slot.

        Returns:
          ``(hidden, cache)``: ``(B, L, E)`` final-LayerNorm states in the compute dtype, and the updated tuple of
          ``LayerCache`` (new keys/values written at ``index``; a stacked cache for a stacked one), or ``None``
          without a cache.
        """
        x = _embed(self.wte, tokens) + _embed(self.wpe, positions)
        bias = _mask_bias(key_mask, cache, index, tokens.shape[1], allowed)
        x, new_cache = _run_blocks(self, x, (bias,), cache, index)
        return self.ln_f(x), new_cache

    def logits(self, hidden):
        """Vocabulary logits through the tied embedding.

        Args:
          hidden: ``(..., E)`` hidden states from :meth:`__call__`.

        Returns:
          ``(..., V)`` logits: float32 (or the dtype of a wider model), summed in float32 below it.
        """
        if _low_precision(hidden):
            return _project_vocab(hidden, self.wte.embedding[...], "...e,ve->...v")
        return self.wte.attend(hidden)

    def vocab_head(self) -> nnx.Embed:
        """The module of :meth:`logits`: the tied embedding (its table is the head's ``(V, E)`` rows)."""
        return self.wte


class _LlamaBlock(nnx.Module):
    def __init__(self, cfg: LlamaConfig, rngs: nnx.Rngs):
        e, d = cfg.hidden_size, cfg.head_dim
        self.cfg = cfg
        self.input_norm = nnx.RMSNorm(e, epsilon=cfg.rms_norm_eps, rngs=rngs)
        # Q, K and V (and the gate and up projections) are fused into one matrix product each.
        heads, kv = cfg.num_attention_heads, cfg.num_key_value_heads
        self.qkv_proj = nnx.Linear(e, (heads + 2 * kv) * d, use_bias=cfg.attention_bias, rngs=rngs)
        self.o_proj = nnx.Linear(heads * d, e, use_bias=cfg.attention_bias, rngs=rngs)
        self.post_norm = nnx.RMSNorm(e, epsilon=cfg.rms_norm_eps, rngs=rngs)
        self.gate_up_proj = nnx.Linear(e, 2 * cfg.intermediate_size, use_bias=cfg.mlp_bias, rngs=rngs)
        self.down_proj = nnx.Linear(cfg.intermediate_size, e, use_bias=cfg.mlp_bias, rngs=rngs)

    def __call__(self, x, rope, bias, cache, index):
        cfg = self.cfg
        b, length, _ = x.shape
        heads, kv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        qkv = self.qkv_proj(_rms_norm(self.input_norm, x))
        qk = apply_rope(qkv[..., : (heads + kv) * d].reshape(b, length, heads + kv, d), *rope)
        q, k = qk[:, :, :heads], qk[:, :, heads:]
        v = qkv[..., (heads + kv) * d:].reshape(b, length, kv, d)
        out, cache = _self_attention(q, k, v, bias, cache, index)
        x = x + self.o_proj(out.reshape(b, length, -1))
        gate, up = jnp.split(self.gate_up_proj(_rms_norm(self.post_norm, x)), 2, axis=-1)
        return x + self.down_proj(jax.nn.silu(gate) * up), cache


class Llama(nnx.Module):
    """Llama-architecture language model (Touvron et al. 2023): also SmolLM2.

    Args:
      cfg: the model's configuration.
      rngs: PRNG streams for the (random) initial parameters; a loaded checkpoint overwrites them.

    Attributes:
      cfg: the configuration.
      embed: token embedding ``(V, E)`` (also the output projection when ``cfg.tie_word_embeddings``).
      blocks: the ``cfg.num_hidden_layers`` transformer blocks (fused Q/K/V and gate/up projections).
      norm: the final RMSNorm.
      lm_head: the output projection ``E -> V``, or ``None`` with tied embeddings.
    """

    def __init__(self, cfg: LlamaConfig, rngs: nnx.Rngs):
        """Builds the embeddings and blocks with randomly initialised parameters.

        Args:
          cfg: see :class:`Llama`.
          rngs: see :class:`Llama`.
        """
        self.cfg = cfg
        self.embed = nnx.Embed(cfg.vocab_size, cfg.hidden_size, rngs=rngs)
        self.blocks = nnx.List([_LlamaBlock(cfg, rngs) for _ in range(cfg.num_hidden_layers)])
        self.norm = nnx.RMSNorm(cfg.hidden_size, epsilon=cfg.rms_norm_eps, rngs=rngs)
        self.lm_head = None if cfg.tie_word_embeddings else nnx.Linear(
            cfg.hidden_size, cfg.vocab_size, use_bias=False, rngs=rngs
        )

    @property
    def num_layers(self) -> int:
        """Number of transformer blocks (KV-cache layers)."""
        return self.cfg.num_hidden_layers

    @property
    def dtype(self):
        """Compute dtype: the token embedding's (activations and the KV cache take it)."""
        return self.embed.embedding.dtype

    def cache_shape(self) -> tuple[int, int]:
        """Per-slot shape of one layer's KV cache.

        Returns:
          ``(kv_heads, head_dim)``: ``(cfg.num_key_value_heads, cfg.head_dim)``.
        """
        return self.cfg.num_key_value_heads, self.cfg.head_dim

    def __call__(self, tokens, positions, key_mask, cache=None, index=0, allowed=None):
        """Runs the blocks over new tokens, reading and writing the KV cache if one is given.

        Args:
          tokens: ``(B, L)`` int32 token ids.
          positions: ``(B, L)`` int32 position ids, the RoPE angles
            (:func:`~snapaudit_jax.models.layers.positions_from_mask` for left-padded rows).
          key_mask: ``(B, S)`` bool, slots holding real tokens; without a cache ``S = L``.
          cache: one :class:`~snapaudit_jax.models.layers.LayerCache` per layer, each ``(B, S, K, D)`` (for a
            stacked model also one ``LayerCache`` of ``(n, B, S, K, D)``: :func:`empty_cache`), or ``None``
            (attention over the new tokens only).
          index: slot of the first new token in the cache (int or int32 scalar); ignored without a cache.
          allowed: optional ``(B, L, S)`` bool replacing the causal mask; it must never let a query see a later slot.

        Returns:
          ``(hidden, cache)``: ``(B, L, E)`` final-RMSNorm states in the compute dtype, and the updated tuple of
          ``LayerCache`` (new keys/values written at ``index``; a stacked cache for a stacked one), or ``None``
          without a cache.
        """
        cfg = self.cfg
        rope = rope_tables(positions, rope_frequencies(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling))
        bias = _mask_bias(key_mask, cache, index, tokens.shape[1], allowed)
        x = _embed(self.embed, tokens)
        x, new_cache = _run_blocks(self, x, (rope, bias), cache, index)
        return _rms_norm(self.norm, x), new_cache

    def logits(self, hidden):
        """Vocabulary logits through ``lm_head`` (or the tied embedding).

        Args:
          hidden: ``(..., E)`` hidden states from :meth:`__call__`.

        Returns:
          ``(..., V)`` logits: float32 (or the dtype of a wider model), summed in float32 below it.
        """
        if _low_precision(hidden):
            if self.lm_head is None:
                return _project_vocab(hidden, self.embed.embedding[...], "...e,ve->...v")
            return _project_vocab(hidden, self.lm_head.kernel[...], "...e,ev->...v")
        return self.embed.attend(hidden) if self.lm_head is None else self.lm_head(hidden)

    def vocab_head(self) -> nnx.Embed | nnx.Linear:
        """The module of :meth:`logits`: ``lm_head``, or the tied embedding."""
        return self.embed if self.lm_head is None else self.lm_head


def empty_cache(model, batch: int, slots: int) -> tuple[LayerCache, ...] | LayerCache:
    """A zero KV cache of ``slots`` slots for every layer of ``model``.

    Args:
      model: a :class:`GPT2` or :class:`Llama`.
      batch: rows ``B``.
      slots: slots ``S`` per row (prompt plus generated tokens).

    Returns:
      ``model.num_layers`` :class:`~snapaudit_jax.models.layers.LayerCache`, each holding ``(B, S, K, D)``
      zeros in the model's compute dtype (``model.dtype``: float32, or bfloat16 for a bfloat16 model); for a
      stacked model (:func:`stack_layers`) one ``LayerCache`` of ``(n, B, S, K, D)`` zeros, which its blocks
      read and write under one scan.
    """
    kv_heads, dim = model.cache_shape()
    if isinstance(model.blocks, StackedBlocks):
        zeros = jnp.zeros((model.num_layers, batch, slots, kv_heads, dim), model.dtype)
        return LayerCache(zeros, zeros)
    zeros = jnp.zeros((batch, slots, kv_heads, dim), model.dtype)
    return tuple(LayerCache(zeros, zeros) for _ in range(model.num_layers))
