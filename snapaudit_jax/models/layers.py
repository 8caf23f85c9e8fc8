"""Shared transformer pieces: attention with a fixed-size KV cache, RoPE, masks.

Shapes: ``B`` batch, ``L`` new tokens, ``S`` cache slots, ``H`` query heads,
``K`` key/value heads (grouped-query attention: ``H % K == 0``), ``D`` head dim.

A KV cache holds ``S`` slots per sequence; new tokens are written at slot
``index`` onwards. Prompts are left-padded, so slot order is time order and a
query at slot ``q`` may attend to slots ``<= q`` whose ``key_mask`` is set.

Dtypes: queries, keys, values and the cache are in the model's compute dtype
(its parameters' dtype). In a lower precision (bfloat16) the attention scores
and their softmax are float32, as in transformers, and the RoPE tables are
cast to the compute dtype as ``LlamaRotaryEmbedding`` does; float32 models
compute exactly as before these rules.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from snapaudit_jax.models.config import RopeScaling

__all__ = [
    "LayerCache",
    "attend",
    "attention_bias",
    "causal_allowed",
    "rope_frequencies",
    "rope_tables",
    "apply_rope",
    "positions_from_mask",
]

_NEG = -1e30  # masked logits (finite, so fully masked rows stay NaN-free)


class LayerCache(NamedTuple):
    """Keys and values of one layer: ``(B, S, K, D)`` each.

    Attributes:
      k: ``(B, S, K, D)`` keys.
      v: ``(B, S, K, D)`` values.
    """

    k: jax.Array
    v: jax.Array


def causal_allowed(key_mask: jax.Array, index, length: int) -> jax.Array:
    """Which cache slots each new query may attend to (causal, real tokens only).

    Args:
      key_mask: ``(B, S)`` bool, slots holding real tokens (written, not padding).
      index: slot of the first new token (scalar).
      length: number of new tokens ``L``.

    Returns:
      ``(B, L, S)`` bool: query ``i`` (slot ``index + i``) may see slot ``j <= index + i`` whose ``key_mask``
      is set.
    """
    slots = key_mask.shape[-1]
    query_slot = index + jnp.arange(length)
    causal = jnp.arange(slots)[None, :] <= query_slot[:, None]  # (L, S)
    return causal[None] & key_mask[:, None, :]


def attention_bias(allowed: jax.Array) -> jax.Array:
    """Additive attention mask from a boolean one; built once per forward pass and shared by every layer.

    Args:
      allowed: ``(B, L, S)`` bool, query/slot pairs that may attend.

    Returns:
      ``(B, 1, 1, L, S)`` float32: ``0`` where allowed, ``-1e30`` elsewhere.
    """
    return jnp.where(allowed, 0.0, _NEG).astype(jnp.float32)[:, None, None]


def _low_precision(dtype) -> bool:
    """Whether ``dtype`` is a floating dtype narrower than float32 (bfloat16, float16)."""
    return jnp.dtype(dtype).itemsize < 4


def _group_queries(q, kv_heads, scale: bool):
    """``(B, L, H, D)`` -> ``(B*K, G, L, D)`` (the ``G = H/K`` query heads of each key/value head), scaled by
    ``1 / sqrt(D)`` if ``scale``."""
    b, length, heads, dim = q.shape
    if scale:
        q = q * (1.0 / math.sqrt(dim))
    q = q.reshape(b, length, kv_heads, heads // kv_heads, dim)
    return q.transpose(0, 2, 3, 1, 4).reshape(b * kv_heads, heads // kv_heads, length, dim)


def _attend_grouped(q, k, v, bias):
    """Attention of grouped queries ``(N, G, L, D)`` over ``(N, S, D)`` keys/values; bias ``(B, 1, 1, L, S)``.

    The softmax is normalised after the value product (``L x D`` divisions instead of ``L x S``). float32
    (or wider) inputs come scaled by ``1 / sqrt(D)``; narrower ones unscaled: their scores, softmax and the value
    product's accumulation are float32 (the scale applied to the float32 scores), and the output is rounded
    to the inputs' dtype once.
    """
    n, groups, length, dim = q.shape
    b, slots = bias.shape[0], k.shape[1]
    low = _low_precision(q.dtype)
    scores = jnp.einsum("nqd,nsd->nqs", q.reshape(n, groups * length, dim), k,
                        preferred_element_type=jnp.float32 if low else None)
    if low:
        scores = scores * (1.0 / math.sqrt(dim))
    scores = scores.reshape(b, n // b, groups, length, slots) + bias
    weights = jnp.exp(scores - jnp.max(scores, axis=-1, keepdims=True))
    total = jnp.sum(weights, axis=-1)
    if not low:
        out = jnp.einsum("nqs,nsd->nqd", weights.reshape(n, groups * length, slots), v)
        return out.reshape(b, n // b, groups, length, dim) / total[..., None]
    # Unnormalised weights lie in [0, 1]: rounded to the value dtype like transformers' softmax(...).to(dtype).
    out = jnp.einsum("nqs,nsd->nqd", weights.reshape(n, groups * length, slots).astype(v.dtype), v,
                     preferred_element_type=jnp.float32)
    return (out.reshape(b, n // b, groups, length, dim) / total[..., None]).astype(v.dtype)


def attend(q: jax.Array, k: jax.Array, v: jax.Array, bias: jax.Array, *, causal_blocks: int = 1) -> jax.Array:
    """Scaled dot-product attention with grouped-query heads.

    The ``H / K`` query heads of a key/value head are stacked along the query axis, so each of the ``B * K``
    groups is one larger matrix product (faster on CPU than many small ones).

    Args:
      q: ``(B, L, H, D)`` queries (unscaled; scaled by ``1 / sqrt(D)`` here).
      k: ``(B, S, K, D)`` keys, in the dtype of ``q``.
      v: ``(B, S, K, D)`` values, in the dtype of ``q``.
      bias: ``(B, 1, 1, L, S)`` additive mask from :func:`attention_bias`.
      causal_blocks: for a causal pass whose first query sits at slot 0 (a prefill), split the queries into
        this many blocks; block ``[a, e)`` only reads slots ``[0, e)``, skipping keys the mask hides anyway
        (about half the work for many blocks). Query rows with no visible key (padding) differ from the
        unsplit result; their outputs are never used. ``1``: no split.

    Returns:
      ``(B, L, H, D)`` attention outputs in the dtype of ``q``. Below float32 the scores, their softmax and
      the value product's sums are float32 (transformers upcasts the softmax alike).
    """
    b, length, heads, dim = q.shape
    slots, kv_heads = k.shape[1], k.shape[2]
    qg = _group_queries(q, kv_heads, scale=not _low_precision(q.dtype))
    k = k.transpose(0, 2, 1, 3).reshape(b * kv_heads, slots, dim)
    v = v.transpose(0, 2, 1, 3).reshape(b * kv_heads, slots, dim)
    blocks = max(1, min(causal_blocks, length))
    if blocks == 1:
        out = _attend_grouped(qg, k, v, bias)
        return out.transpose(0, 3, 1, 2, 4).reshape(b, length, heads, dim)
    edges = [round(i * length / blocks) for i in range(blocks + 1)]
    out = jnp.concatenate(
        [_attend_grouped(qg[:, :, a:e], k[:, :e], v[:, :e], bias[..., a:e, :e]) for a, e in zip(edges, edges[1:])],
        axis=3,
    )
    return out.transpose(0, 3, 1, 2, 4).reshape(b, length, heads, dim)


def write_cache(cache: LayerCache, k: jax.Array, v: jax.Array, index) -> LayerCache:
    """Writes new keys and values into a layer's cache.

    Args:
      cache: the layer's cache, ``(B, S, K, D)`` each.
      k: ``(B, L, K, D)`` new keys.
      v: ``(B, L, K, D)`` new values.
      index: slot of the first new token (int or int32 scalar, may be traced).

    Returns:
      A new :class:`LayerCache` with slots ``[index, index + L)`` replaced.
    """
    zero = jnp.zeros((), jnp.int32)
    start = (zero, jnp.asarray(index, jnp.int32), zero, zero)
    return LayerCache(jax.lax.dynamic_update_slice(cache.k, k, start), jax.lax.dynamic_update_slice(cache.v, v, start))


def positions_from_mask(mask: jax.Array) -> jax.Array:
    """Position ids of left-padded rows: 0 at the first real token; padding gets 1 (as HF ``generate``).

    Args:
      mask: ``(B, L)`` bool, real tokens.

    Returns:
      ``(B, L)`` int32 position ids.
    """
    pos = jnp.cumsum(mask.astype(jnp.int32), axis=-1) - 1
    return jnp.where(mask, pos, 1)


def rope_frequencies(head_dim: int, theta: float, scaling: RopeScaling) -> jax.Array:
    """Inverse frequencies of rotary embeddings, with Llama-3, linear or per-frequency scaling.

    Args:
      head_dim: head dimension ``D`` (even).
      theta: RoPE base.
      scaling: the frequency scaling (``"default"``: none).

    Returns:
      ``(D/2,)`` float32 inverse frequencies ``theta ** (-2i / D)``, scaled.

    References:
      Su et al. 2021 (RoFormer); Llama 3 frequency scaling (Meta 2024, the ``llama3`` rope type of Hugging
      Face ``config.json``).
    """
    inv = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    if scaling.rope_type == "linear":
        return inv / scaling.factor
    if scaling.rope_type == "freq_factors":  # llama.cpp rope_freqs: theta_i = pos * inv_i / factor_i
        return inv / jnp.asarray(scaling.freq_factors, jnp.float32)
    if scaling.rope_type == "llama3":
        old = scaling.original_max_position_embeddings
        low_wavelen = old / scaling.low_freq_factor
        high_wavelen = old / scaling.high_freq_factor
        wavelen = 2.0 * math.pi / inv
        scaled = jnp.where(wavelen > low_wavelen, inv / scaling.factor, inv)
        smooth = (old / wavelen - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor)
        smoothed = (1.0 - smooth) * scaled / scaling.factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        return jnp.where(medium, smoothed, scaled)
    return inv


def rope_tables(positions: jax.Array, inv_freq: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Cosine and sine tables of the rotary angles ``positions * inv_freq`` (computed once per forward pass).

    Args:
      positions: ``(B, L)`` int position ids.
      inv_freq: ``(D/2,)`` inverse frequencies from :func:`rope_frequencies`.

    Returns:
      ``(cos, sin)``, each ``(B, L, 1, D/2)`` float32.
    """
    freqs = positions[..., None].astype(jnp.float32) * inv_freq
    return jnp.cos(freqs)[:, :, None, :], jnp.sin(freqs)[:, :, None, :]


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotates query or key vectors by precomputed tables (half-split convention of HF Llama).

    Args:
      x: ``(B, L, heads, D)`` queries or keys.
      cos: ``(B, L, 1, D/2)`` from :func:`rope_tables`.
      sin: ``(B, L, 1, D/2)`` from :func:`rope_tables`.

    Returns:
      ``(B, L, heads, D)`` rotated vectors in the dtype of ``x`` (the float32 tables are rounded to it first,
      as transformers' ``LlamaRotaryEmbedding`` does).
    """
    cos, sin = cos.astype(x.dtype), sin.astype(x.dtype)
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
