"""Shared transformer pieces: attention with a fixed-size KV cache, RoPE, masks.

Shapes: ``B`` batch, ``L`` new tokens, ``S`` cache slots, ``H`` query heads,
``K`` key/value heads (grouped-query attention: ``H % K == 0``), ``D`` head dim.

A KV cache holds ``S`` slots per sequence; new tokens are written at slot
``index`` onwards. Prompts are left-padded, so slot order is time order and a
query at slot ``q`` may attend to slots ``<= q`` whose ``key_mask`` is set.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from snapaudit_jax.models.config import RopeScaling

__all__ = ["LayerCache", "attend", "causal_allowed", "rope_frequencies", "apply_rope", "positions_from_mask"]

_NEG = -1e30  # masked logits (finite, so fully masked rows stay NaN-free)


class LayerCache(NamedTuple):
    """Keys and values of one layer: ``(B, S, K, D)`` each."""

    k: jax.Array
    v: jax.Array


def causal_allowed(key_mask: jax.Array, index, length: int) -> jax.Array:
    """``(B, L, S)`` bool: query ``i`` (slot ``index + i``) may see slot ``j``.

    Args:
      key_mask: ``(B, S)`` slots holding real tokens (written, not padding).
      index: slot of the first new token (scalar).
      length: number of new tokens ``L``.
    """
    slots = key_mask.shape[-1]
    query_slot = index + jnp.arange(length)
    causal = jnp.arange(slots)[None, :] <= query_slot[:, None]  # (L, S)
    return causal[None] & key_mask[:, None, :]


def attend(q: jax.Array, k: jax.Array, v: jax.Array, allowed: jax.Array) -> jax.Array:
    """Scaled dot-product attention with grouped-query heads.

    Args:
      q: ``(B, L, H, D)``; k, v: ``(B, S, K, D)``; allowed: ``(B, L, S)`` bool.

    Returns:
      ``(B, L, H, D)``.
    """
    b, length, heads, dim = q.shape
    kv_heads = k.shape[2]
    q = q.reshape(b, length, kv_heads, heads // kv_heads, dim)
    scores = jnp.einsum("blkgd,bskd->bkgls", q, k) / math.sqrt(dim)
    scores = jnp.where(allowed[:, None, None], scores, _NEG)
    probs = jax.nn.softmax(scores, axis=-1)
    out = jnp.einsum("bkgls,bskd->blkgd", probs, v)
    return out.reshape(b, length, heads, dim)


def write_cache(cache: LayerCache, k: jax.Array, v: jax.Array, index) -> LayerCache:
    """Writes ``(B, L, K, D)`` keys/values at slot ``index``."""
    zero = jnp.zeros((), jnp.int32)
    start = (zero, jnp.asarray(index, jnp.int32), zero, zero)
    return LayerCache(jax.lax.dynamic_update_slice(cache.k, k, start), jax.lax.dynamic_update_slice(cache.v, v, start))


def positions_from_mask(mask: jax.Array) -> jax.Array:
    """Position ids of left-padded rows: 0 at the first real token; padding gets 1 (as HF ``generate``)."""
    pos = jnp.cumsum(mask.astype(jnp.int32), axis=-1) - 1
    return jnp.where(mask, pos, 1)


def rope_frequencies(head_dim: int, theta: float, scaling: RopeScaling) -> jax.Array:
    """Inverse frequencies ``(D/2,)`` of rotary embeddings, with Llama-3, linear or per-frequency scaling.

    References:
      Su et al. 2021 (RoFormer); Llama 3 frequency scaling (Meta 2024, the
      ``llama3`` rope type of Hugging Face ``config.json``).
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


def apply_rope(x: jax.Array, positions: jax.Array, inv_freq: jax.Array) -> jax.Array:
    """Rotates ``(B, L, heads, D)`` by ``positions`` ``(B, L)`` (half-split convention of HF Llama)."""
    freqs = positions[..., None].astype(jnp.float32) * inv_freq  # (B, L, D/2)
    cos = jnp.cos(freqs)[:, :, None, :]
    sin = jnp.sin(freqs)[:, :, None, :]
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
