"""BERT encoder in Flax NNX with mean pooling and L2 normalisation (sentence embeddings)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from snapaudit_jax.models.config import BertConfig
from snapaudit_jax.models.layers import attend, attention_bias

__all__ = ["Bert", "mean_pool_normalize"]


class _BertLayer(nnx.Module):
    def __init__(self, cfg: BertConfig, rngs: nnx.Rngs):
        h = cfg.hidden_size
        self.cfg = cfg
        self.query = nnx.Linear(h, h, rngs=rngs)
        self.key = nnx.Linear(h, h, rngs=rngs)
        self.value = nnx.Linear(h, h, rngs=rngs)
        self.attn_out = nnx.Linear(h, h, rngs=rngs)
        self.attn_norm = nnx.LayerNorm(h, epsilon=cfg.layer_norm_eps, rngs=rngs)
        self.intermediate = nnx.Linear(h, cfg.intermediate_size, rngs=rngs)
        self.output = nnx.Linear(cfg.intermediate_size, h, rngs=rngs)
        self.out_norm = nnx.LayerNorm(h, epsilon=cfg.layer_norm_eps, rngs=rngs)

    def __call__(self, x, bias):
        cfg = self.cfg
        b, length, _ = x.shape
        shape = (b, length, cfg.num_attention_heads, cfg.head_dim)
        att = attend(self.query(x).reshape(shape), self.key(x).reshape(shape), self.value(x).reshape(shape), bias)
        x = self.attn_norm(x + self.attn_out(att.reshape(b, length, -1)))
        h = self.intermediate(x)
        if cfg.activation == "relu":
            h = jax.nn.relu(h)
        else:
            h = jax.nn.gelu(h, approximate=cfg.activation == "gelu_new")
        return self.out_norm(x + self.output(h))


class Bert(nnx.Module):
    """BERT encoder (Devlin et al. 2019); returns the last hidden states ``(B, L, H)``.

    Post-LayerNorm layers, absolute learned positions, token type 0 for every token, bidirectional attention over
    the unmasked tokens.

    Args:
      cfg: the encoder's configuration.
      rngs: PRNG streams for the (random) initial parameters; a loaded checkpoint overwrites them.

    Attributes:
      cfg: the configuration.
      layers: the ``cfg.num_hidden_layers`` encoder layers.
    """

    def __init__(self, cfg: BertConfig, rngs: nnx.Rngs):
        """Builds the embeddings and layers with randomly initialised parameters.

        Args:
          cfg: see :class:`Bert`.
          rngs: see :class:`Bert`.
        """
        self.cfg = cfg
        self.word = nnx.Embed(cfg.vocab_size, cfg.hidden_size, rngs=rngs)
        self.position = nnx.Embed(cfg.max_position_embeddings, cfg.hidden_size, rngs=rngs)
        self.token_type = nnx.Embed(cfg.type_vocab_size, cfg.hidden_size, rngs=rngs)
        self.embed_norm = nnx.LayerNorm(cfg.hidden_size, epsilon=cfg.layer_norm_eps, rngs=rngs)
        self.layers = nnx.List([_BertLayer(cfg, rngs) for _ in range(cfg.num_hidden_layers)])

    def __call__(self, tokens, mask):
        """Encodes a batch of right-padded token rows.

        Args:
          tokens: ``(B, L)`` int32 token ids, right-padded.
          mask: ``(B, L)`` bool, real (non-padding) tokens; padding is never attended to.

        Returns:
          ``(B, L, H)`` float hidden states of the last layer (``H = cfg.hidden_size``); rows at padding
          positions are not meaningful.
        """
        positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
        x = self.word(tokens) + self.position(positions) + self.token_type(jnp.zeros_like(tokens))
        x = self.embed_norm(x)
        length = tokens.shape[1]
        bias = attention_bias(jnp.broadcast_to(mask[:, None, :], (tokens.shape[0], length, length)))  # bidirectional
        for layer in self.layers:
            x = layer(x, bias)
        return x


def mean_pool_normalize(hidden: jax.Array, mask: jax.Array) -> jax.Array:
    """Mean of the unmasked token states, L2-normalised (sentence-transformers' Pooling + Normalize).

    Args:
      hidden: ``(B, L, H)`` float token states.
      mask: ``(B, L)`` bool, the tokens to average.

    Returns:
      ``(B, H)`` unit-norm embeddings, in ``hidden``'s dtype (a zero vector for a row without tokens).
    """
    m = mask.astype(hidden.dtype)[..., None]
    mean = jnp.sum(hidden * m, axis=1) / jnp.maximum(jnp.sum(m, axis=1), 1e-9)
    return mean / jnp.maximum(jnp.linalg.norm(mean, axis=-1, keepdims=True), 1e-12)
