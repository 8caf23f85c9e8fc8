"""Model configurations (frozen, hashable: usable as static jit arguments).

Built from a Hugging Face ``config.json`` dictionary or from GGUF metadata;
unsupported options are refused with an error naming the field.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from snapaudit_jax.utils.errors import InputError

__all__ = ["GPT2Config", "LlamaConfig", "BertConfig", "RopeScaling", "config_from_hf"]


class ConfigError(InputError):
    """A checkpoint configuration this package cannot run."""


def _get(cfg: dict, *names, default=None, required=False, source="config.json"):
    for name in names:
        if name in cfg and cfg[name] is not None:
            return cfg[name]
    if required:
        raise ConfigError(f"{source}: missing required field {names[0]!r}")
    return default


@dataclasses.dataclass(frozen=True)
class GPT2Config:
    """GPT-2 (learned positions, LayerNorm, GELU MLP, Conv1D weight layout).

    Attributes:
      vocab_size: number of token ids.
      n_positions: maximum sequence length (learned position embeddings).
      n_embd: hidden size.
      n_layer: number of transformer blocks.
      n_head: attention heads per block.
      n_inner: MLP hidden size (Hugging Face default ``4 * n_embd``).
      layer_norm_epsilon: LayerNorm epsilon.
      activation: ``"gelu_new"`` (tanh approximation, the default) or ``"gelu"`` (exact erf form).
      bos_token_id: beginning-of-sequence id, or ``None``.
      eos_token_id: end-of-sequence id, or ``None``.
    """

    vocab_size: int
    n_positions: int
    n_embd: int
    n_layer: int
    n_head: int
    n_inner: int
    layer_norm_epsilon: float = 1e-5
    activation: str = "gelu_new"  # tanh approximation; "gelu" is the exact erf form
    bos_token_id: int | None = None
    eos_token_id: int | None = None

    @property
    def head_dim(self) -> int:
        """Dimension of one attention head, ``n_embd // n_head``."""
        return self.n_embd // self.n_head

    @classmethod
    def from_hf(cls, cfg: dict, source: str = "config.json") -> "GPT2Config":
        """The config of a GPT-2 ``config.json`` dictionary.

        ``gelu_pytorch_tanh`` and ``gelu_fast`` map to ``"gelu_new"``; Hugging Face names such as ``hidden_size``
        are accepted as aliases.

        Args:
          cfg: the parsed ``config.json``.
          source: the file name used in error messages.

        Returns:
          The :class:`GPT2Config`.

        Raises:
          ConfigError: a required field is missing, or the activation or an attention option
            (``scale_attn_by_inverse_layer_idx``, ``reorder_and_upcast_attn``, ``add_cross_attention``,
            ``scale_attn_weights=false``) is not supported.
        """
        activation = _get(cfg, "activation_function", default="gelu_new")
        if activation in ("gelu_new", "gelu_pytorch_tanh", "gelu_fast"):
            activation = "gelu_new"
        elif activation != "gelu":
            raise ConfigError(f"{source}: activation_function {activation!r} is not supported (gelu_new, gelu)")
        for flag in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn", "add_cross_attention"):
            if cfg.get(flag):
                raise ConfigError(f"{source}: {flag}=true is not supported")
        if cfg.get("scale_attn_weights") is False:
            raise ConfigError(f"{source}: scale_attn_weights=false is not supported")
        n_embd = _get(cfg, "n_embd", "hidden_size", required=True, source=source)
        return cls(
            vocab_size=_get(cfg, "vocab_size", required=True, source=source),
            n_positions=_get(cfg, "n_positions", "max_position_embeddings", required=True, source=source),
            n_embd=n_embd,
            n_layer=_get(cfg, "n_layer", "num_hidden_layers", required=True, source=source),
            n_head=_get(cfg, "n_head", "num_attention_heads", required=True, source=source),
            n_inner=_get(cfg, "n_inner", default=4 * n_embd),
            layer_norm_epsilon=float(_get(cfg, "layer_norm_epsilon", default=1e-5)),
            activation=activation,
            bos_token_id=_get(cfg, "bos_token_id"),
            eos_token_id=_get(cfg, "eos_token_id"),
        )


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """RoPE frequency scaling: ``"default"``, ``"linear"``, ``"llama3"`` or ``"freq_factors"``.

    ``"freq_factors"`` divides each inverse frequency by an explicit factor: llama.cpp stores the Llama-3 scaling
    of a GGUF file that way, as the ``rope_freqs.weight`` tensor.

    Attributes:
      rope_type: ``"default"`` (no scaling), ``"linear"``, ``"llama3"`` or ``"freq_factors"``.
      factor: divisor of the frequencies (``linear``; the low-frequency divisor of ``llama3``).
      low_freq_factor: ``llama3``: wavelengths above ``original_max_position_embeddings / low_freq_factor`` are
        divided by ``factor``.
      high_freq_factor: ``llama3``: wavelengths below ``original_max_position_embeddings / high_freq_factor`` are
        kept; those in between are interpolated.
      original_max_position_embeddings: ``llama3``: the context length of pre-training.
      freq_factors: ``freq_factors``: one divisor per inverse frequency, ``head_dim / 2`` of them; else ``None``.
    """

    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    freq_factors: tuple[float, ...] | None = None

    @classmethod
    def from_hf(cls, scaling: dict | None, source: str = "config.json") -> "RopeScaling":
        """The scaling of a Hugging Face ``rope_scaling`` entry.

        Args:
          scaling: the ``rope_scaling`` dictionary (type in ``rope_type`` or ``type``); ``None`` or empty: no scaling.
          source: the file name used in error messages.

        Returns:
          The :class:`RopeScaling` (``"default"``, ``"linear"`` or ``"llama3"``).

        Raises:
          ConfigError: a scaling type other than ``default``, ``linear`` or ``llama3``.
        """
        if not scaling:
            return cls()
        kind = scaling.get("rope_type", scaling.get("type", "default"))
        if kind == "default":
            return cls()
        if kind == "linear":
            return cls("linear", factor=float(scaling["factor"]))
        if kind == "llama3":
            return cls(
                "llama3",
                factor=float(scaling["factor"]),
                low_freq_factor=float(scaling["low_freq_factor"]),
                high_freq_factor=float(scaling["high_freq_factor"]),
                original_max_position_embeddings=int(scaling["original_max_position_embeddings"]),
            )
        raise ConfigError(f"{source}: rope_scaling type {kind!r} is not supported (default, linear, llama3)")


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
    """Llama (RMSNorm, RoPE, grouped-query attention, SwiGLU).

    Attributes:
      vocab_size: number of token ids.
      hidden_size: hidden size.
      intermediate_size: SwiGLU MLP hidden size.
      num_hidden_layers: number of transformer blocks.
      num_attention_heads: query heads per block.
      num_key_value_heads: key/value heads (grouped-query attention; divides ``num_attention_heads``).
      head_dim: dimension of one head.
      max_position_embeddings: maximum sequence length.
      rms_norm_eps: RMSNorm epsilon.
      rope_theta: RoPE base.
      rope_scaling: the RoPE frequency scaling.
      tie_word_embeddings: the output projection is the transposed input embedding (no ``lm_head``).
      attention_bias: the Q/K/V and output projections have biases.
      mlp_bias: the MLP projections have biases.
      bos_token_id: beginning-of-sequence id, or ``None``.
      eos_token_id: end-of-sequence id, a tuple of them, or ``None``.
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int = 8192
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling = RopeScaling()
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    bos_token_id: int | None = None
    eos_token_id: int | tuple[int, ...] | None = None

    @classmethod
    def from_hf(cls, cfg: dict, source: str = "config.json") -> "LlamaConfig":
        """The config of a Llama ``config.json`` dictionary.

        The RoPE scaling is read from ``rope_scaling`` (or ``rope_parameters``) and ``rope_theta`` from the top
        level or that dictionary; a list ``eos_token_id`` becomes a tuple.

        Args:
          cfg: the parsed ``config.json``.
          source: the file name used in error messages.

        Returns:
          The :class:`LlamaConfig`.

        Raises:
          ConfigError: a required field is missing, ``hidden_act`` is not ``silu``, or the RoPE scaling type is
            not supported.
        """
        hidden = _get(cfg, "hidden_size", required=True, source=source)
        heads = _get(cfg, "num_attention_heads", required=True, source=source)
        act = _get(cfg, "hidden_act", default="silu")
        if act != "silu":
            raise ConfigError(f"{source}: hidden_act {act!r} is not supported (silu)")
        rope = cfg.get("rope_scaling") or cfg.get("rope_parameters")
        theta = _get(cfg, "rope_theta", default=None)
        if theta is None and isinstance(rope, dict):
            theta = rope.get("rope_theta")
        eos = _get(cfg, "eos_token_id")
        return cls(
            vocab_size=_get(cfg, "vocab_size", required=True, source=source),
            hidden_size=hidden,
            intermediate_size=_get(cfg, "intermediate_size", required=True, source=source),
            num_hidden_layers=_get(cfg, "num_hidden_layers", required=True, source=source),
            num_attention_heads=heads,
            num_key_value_heads=_get(cfg, "num_key_value_heads", default=heads),
            head_dim=_get(cfg, "head_dim", default=hidden // heads),
            max_position_embeddings=_get(cfg, "max_position_embeddings", default=8192),
            rms_norm_eps=float(_get(cfg, "rms_norm_eps", default=1e-6)),
            rope_theta=float(theta if theta is not None else 10000.0),
            rope_scaling=RopeScaling.from_hf(rope, source),
            tie_word_embeddings=bool(_get(cfg, "tie_word_embeddings", default=False)),
            attention_bias=bool(_get(cfg, "attention_bias", default=False)),
            mlp_bias=bool(_get(cfg, "mlp_bias", default=False)),
            bos_token_id=_get(cfg, "bos_token_id"),
            eos_token_id=tuple(eos) if isinstance(eos, list) else eos,
        )


@dataclasses.dataclass(frozen=True)
class BertConfig:
    """BERT encoder (post-LayerNorm, GELU MLP, absolute positions).

    Attributes:
      vocab_size: number of token ids.
      hidden_size: hidden size.
      num_hidden_layers: number of encoder layers.
      num_attention_heads: attention heads per layer.
      intermediate_size: MLP hidden size.
      max_position_embeddings: maximum sequence length.
      type_vocab_size: number of token types (segment embeddings).
      layer_norm_eps: LayerNorm epsilon.
      activation: ``"gelu"`` (exact), ``"gelu_new"`` (tanh approximation) or ``"relu"``.
    """

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    activation: str = "gelu"

    @property
    def head_dim(self) -> int:
        """Dimension of one attention head, ``hidden_size // num_attention_heads``."""
        return self.hidden_size // self.num_attention_heads

    @classmethod
    def from_hf(cls, cfg: dict, source: str = "config.json") -> "BertConfig":
        """The config of a BERT ``config.json`` dictionary.

        Args:
          cfg: the parsed ``config.json``.
          source: the file name used in error messages.

        Returns:
          The :class:`BertConfig`.

        Raises:
          ConfigError: a required field is missing, ``hidden_act`` is not ``gelu``, ``gelu_new`` or ``relu``, or
            ``position_embedding_type`` is not ``absolute``.
        """
        act = _get(cfg, "hidden_act", default="gelu")
        if act not in ("gelu", "gelu_new", "relu"):
            raise ConfigError(f"{source}: hidden_act {act!r} is not supported (gelu, gelu_new, relu)")
        if _get(cfg, "position_embedding_type", default="absolute") != "absolute":
            raise ConfigError(f"{source}: position_embedding_type {cfg['position_embedding_type']!r} is not supported")
        return cls(
            vocab_size=_get(cfg, "vocab_size", required=True, source=source),
            hidden_size=_get(cfg, "hidden_size", required=True, source=source),
            num_hidden_layers=_get(cfg, "num_hidden_layers", required=True, source=source),
            num_attention_heads=_get(cfg, "num_attention_heads", required=True, source=source),
            intermediate_size=_get(cfg, "intermediate_size", required=True, source=source),
            max_position_embeddings=_get(cfg, "max_position_embeddings", default=512),
            type_vocab_size=_get(cfg, "type_vocab_size", default=2),
            layer_norm_eps=float(_get(cfg, "layer_norm_eps", default=1e-12)),
            activation=act,
        )


_ARCHITECTURES = {"gpt2": GPT2Config, "llama": LlamaConfig, "bert": BertConfig}


def config_from_hf(cfg: dict[str, Any], source: str = "config.json"):
    """The config object for a Hugging Face ``config.json`` (dispatch on ``model_type``).

    Args:
      cfg: the parsed ``config.json``; ``model_type`` must be ``"gpt2"``, ``"llama"`` or ``"bert"``.
      source: the file name used in error messages.

    Returns:
      A :class:`GPT2Config`, :class:`LlamaConfig` or :class:`BertConfig`.

    Raises:
      ConfigError: an unsupported ``model_type`` or an invalid field (see the classes' ``from_hf``).
    """
    kind = cfg.get("model_type")
    if kind not in _ARCHITECTURES:
        raise ConfigError(
            f"{source}: model_type {kind!r} is not supported (supported: {', '.join(sorted(_ARCHITECTURES))})"
        )
    return _ARCHITECTURES[kind].from_hf(cfg, source)
