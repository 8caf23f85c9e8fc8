"""LoRA adapters for the Flax decoders (GPT-2, Llama), named as Hugging Face and PEFT name them.

A LoRA adapter on a linear projection ``y = x W + b`` adds ``(alpha / r) x A B`` with ``A`` ``(d_in, r)`` and
``B`` ``(r, d_out)`` (Hu et al. 2021). ``A`` starts uniform in ``(-1/sqrt(d_in), 1/sqrt(d_in))`` (PEFT's
``kaiming_uniform_(a=sqrt(5))``) and ``B`` at zero, so the adapted model starts equal to the base. Only the
adapters are :class:`flax.nnx.LoRAParam`; training the ``nnx.LoRAParam`` state (:data:`TRAINABLE`) leaves
every base parameter bitwise unchanged.

Our models fuse some projections that Hugging Face keeps apart (Llama's ``q_proj``, ``k_proj``, ``v_proj`` in
``qkv_proj``; ``gate_proj``, ``up_proj`` in ``gate_up_proj``). A target is one Hugging Face projection: its
adapter adds to its own slice of the fused output, so every adapter is exactly the PEFT adapter of that module
(:func:`snapaudit_jax.finetune.export.write_peft_adapter`).

Targets (:data:`TARGETS`):

* Llama: ``q_proj``, ``k_proj``, ``v_proj``, ``o_proj``, ``gate_proj``, ``up_proj``, ``down_proj``;
* GPT-2: ``c_attn`` (Q, K and V in one Conv1D), ``attn.c_proj``, ``c_fc``, ``mlp.c_proj``.

References:
  Hu et al., "LoRA: Low-Rank Adaptation of Large Language Models", ICLR 2022.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from snapaudit_jax.models.config import GPT2Config, LlamaConfig
from snapaudit_jax.models.decoders import GPT2, Llama
from snapaudit_jax.utils import validate
from snapaudit_jax.utils.errors import InputError

__all__ = [
    "DEFAULT_TARGETS",
    "TARGETS",
    "TRAINABLE",
    "LoRAConfig",
    "LoRAProjection",
    "apply_lora",
    "lora_adapters",
    "merge_lora",
    "target_slices",
]

TRAINABLE = nnx.LoRAParam
"""The state filter of the parameters LoRA trains (the adapters only)."""

TARGETS = {
    "llama": ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
    "gpt2": ("c_attn", "attn.c_proj", "c_fc", "mlp.c_proj"),
}
DEFAULT_TARGETS = {"llama": ("q_proj", "v_proj"), "gpt2": ("c_attn",)}


def _family(model_or_cfg) -> str:
    cfg = getattr(model_or_cfg, "cfg", model_or_cfg)
    if isinstance(cfg, LlamaConfig):
        return "llama"
    if isinstance(cfg, GPT2Config):
        return "gpt2"
    raise InputError(f"LoRA needs a GPT-2 or Llama decoder, got {type(model_or_cfg).__name__}")


@dataclasses.dataclass(frozen=True)
class LoRAConfig:
    """LoRA adapters of a fine-tuning run (frozen, hashable).

    Attributes:
      rank: ``r >= 1``, at most the smaller width of every targeted projection.
      alpha: ``> 0``; the adapter's output is scaled by ``alpha / rank``.
      targets: Hugging Face projection names (:data:`TARGETS`); ``()`` means :data:`DEFAULT_TARGETS` of the model.
    """

    rank: int = 8
    alpha: float = 16.0
    targets: tuple[str, ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "rank", validate.positive_int("rank", self.rank))
        object.__setattr__(self, "alpha", validate.positive_float("alpha", self.alpha))
        targets = tuple(self.targets)
        if len(set(targets)) != len(targets):
            raise InputError(f"targets must not repeat a projection, got {list(targets)}")
        for t in targets:
            if not isinstance(t, str):
                raise InputError(f"targets must be projection names, got {t!r}")
        object.__setattr__(self, "targets", targets)

    @property
    def scale(self) -> float:
        """``alpha / rank``."""
        return self.alpha / self.rank

    def resolved_targets(self, model_or_cfg) -> tuple[str, ...]:
        """The targets for a model (its family's defaults if none were given), checked.

        Args:
          model_or_cfg: a :class:`~snapaudit_jax.models.decoders.GPT2` / ``Llama`` or its config.

        Returns:
          The target names, in :data:`TARGETS` order.

        Raises:
          InputError: a name that is not a projection of the model's family, or a rank above a targeted
            projection's width.
        """
        family = _family(model_or_cfg)
        targets = self.targets or DEFAULT_TARGETS[family]
        for t in targets:
            if t not in TARGETS[family]:
                raise InputError(
                    f"targets must be projections of a {family} model ({', '.join(TARGETS[family])}), got {t!r}"
                )
        cfg = getattr(model_or_cfg, "cfg", model_or_cfg)
        slices = target_slices(cfg)
        for t in targets:
            _, start, stop, d_in = slices[t]
            width = min(d_in, stop - start)
            if self.rank > width:
                raise InputError(f"rank must be <= the width {width} of the targeted projection {t!r}, got {self.rank}")
        return tuple(t for t in TARGETS[family] if t in targets)


def target_slices(cfg) -> dict[str, tuple[str, int, int, int]]:
    """Where each Hugging Face projection lives in our modules.

    Args:
      cfg: a :class:`~snapaudit_jax.models.config.GPT2Config` or ``LlamaConfig``.

    Returns:
      ``{name: (attribute of the block, first output column, end column, input width)}``.
    """
    if isinstance(cfg, LlamaConfig):
        e, d, h, kv, inter = (cfg.hidden_size, cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads,
                              cfg.intermediate_size)
        return {
            "q_proj": ("qkv_proj", 0, h * d, e),
            "k_proj": ("qkv_proj", h * d, (h + kv) * d, e),
            "v_proj": ("qkv_proj", (h + kv) * d, (h + 2 * kv) * d, e),
            "o_proj": ("o_proj", 0, e, h * d),
            "gate_proj": ("gate_up_proj", 0, inter, e),
            "up_proj": ("gate_up_proj", inter, 2 * inter, e),
            "down_proj": ("down_proj", 0, e, inter),
        }
    if isinstance(cfg, GPT2Config):
        e = cfg.n_embd
        return {
            "c_attn": ("c_attn", 0, 3 * e, e),
            "attn.c_proj": ("attn_proj", 0, e, e),
            "c_fc": ("c_fc", 0, cfg.n_inner, e),
            "mlp.c_proj": ("mlp_proj", 0, e, cfg.n_inner),
        }
    raise InputError(f"LoRA needs a GPT-2 or Llama config, got {type(cfg).__name__}")


class LoRAProjection(nnx.Module):
    """A projection (``nnx.Linear``) with LoRA adapters on slices of its output.

    Args:
      base: the projection; its parameters stay ``nnx.Param`` (frozen under LoRA training).
      names: the Hugging Face names of the adapters.
      spans: ``(start, stop)`` output columns of each adapter.
      rank: ``r``.
      scale: ``alpha / r``.
      rngs: for ``A``'s initial values.

    Attributes:
      base: the projection.
      names: adapter names.
      spans: their output columns.
      scale: ``alpha / r``.
      lora_a: ``(d_in, r)`` per adapter (``nnx.LoRAParam``).
      lora_b: ``(r, stop - start)`` per adapter (``nnx.LoRAParam``, zero at the start).
    """

    def __init__(self, base: nnx.Linear, names, spans, rank: int, scale: float, rngs: nnx.Rngs):
        """Wraps ``base`` with zero-initialised adapters.

        Args:
          base: see :class:`LoRAProjection`.
          names: see :class:`LoRAProjection`.
          spans: see :class:`LoRAProjection`.
          rank: see :class:`LoRAProjection`.
          scale: see :class:`LoRAProjection`.
          rngs: see :class:`LoRAProjection`.
        """
        d_in = base.kernel.shape[0]
        dtype = base.kernel.dtype
        bound = 1.0 / math.sqrt(d_in)
        self.base = base
        self.names = tuple(names)
        self.spans = tuple((int(a), int(b)) for a, b in spans)
        self.scale = float(scale)
        self.lora_a = nnx.List([
            nnx.LoRAParam(jax.random.uniform(rngs.params(), (d_in, rank), jnp.float32, -bound, bound).astype(dtype))
            for _ in self.names
        ])
        self.lora_b = nnx.List([nnx.LoRAParam(jnp.zeros((rank, b - a), dtype)) for a, b in self.spans])

    def delta(self, index: int) -> jax.Array:
        """The adapter's weight update in the kernel's layout.

        Args:
          index: the adapter's position in :attr:`names`.

        Returns:
          ``scale * A @ B``, ``(d_in, stop - start)``.
        """
        return self.scale * (self.lora_a[index][...] @ self.lora_b[index][...])

    def __call__(self, x):
        """The projection plus every adapter's ``scale * x A B`` on its output columns.

        Args:
          x: ``(..., d_in)`` inputs.

        Returns:
          ``(..., d_out)`` outputs.
        """
        y = self.base(x)
        for i, (start, stop) in enumerate(self.spans):
            update = ((x @ self.lora_a[i][...]) @ self.lora_b[i][...]) * jnp.asarray(self.scale, x.dtype)
            if start == 0 and stop == y.shape[-1]:
                y = y + update
            else:
                y = y.at[..., start:stop].add(update)
        return y


def _blocks(model):
    if not isinstance(model, (GPT2, Llama)):
        raise InputError(f"LoRA needs a GPT-2 or Llama decoder, got {type(model).__name__}")
    return model.blocks


def apply_lora(model, config: LoRAConfig, *, key: jax.Array):
    """Adds LoRA adapters to ``model`` in place and returns it.

    Args:
      model: a :class:`~snapaudit_jax.models.decoders.GPT2` or ``Llama`` without adapters.
      config: the adapters.
      key: PRNG key of the ``A`` matrices (``fold_in(key, layer)``).

    Returns:
      ``model``, whose targeted projections are :class:`LoRAProjection` (the adapted model computes exactly
      the base model's function until ``B`` moves).

    Raises:
      InputError: not a GPT-2 / Llama model, a model that already has adapters, or a bad target or rank.
    """
    targets = config.resolved_targets(model)
    slices = target_slices(model.cfg)
    by_attr: dict[str, list[str]] = {}
    for t in targets:
        by_attr.setdefault(slices[t][0], []).append(t)
    for i, block in enumerate(_blocks(model)):
        rngs = nnx.Rngs(params=jax.random.fold_in(key, i))
        for attr, names in by_attr.items():
            base = getattr(block, attr)
            if isinstance(base, LoRAProjection):
                raise InputError(f"the model already has LoRA adapters on {attr} (block {i})")
            spans = [(slices[n][1], slices[n][2]) for n in names]
            setattr(block, attr, LoRAProjection(base, names, spans, config.rank, config.scale, rngs))
    return model


def lora_adapters(model) -> dict[tuple[int, str], tuple[jax.Array, jax.Array, float]]:
    """Every adapter of a model.

    Args:
      model: a model with adapters (:func:`apply_lora`).

    Returns:
      ``{(block, Hugging Face name): (A (d_in, r), B (r, d_out), scale)}``; empty without adapters.
    """
    out: dict[tuple[int, str], tuple[Any, Any, float]] = {}
    for i, block in enumerate(_blocks(model)):
        for value in vars(block).values():
            if isinstance(value, LoRAProjection):
                for j, name in enumerate(value.names):
                    out[(i, name)] = (value.lora_a[j][...], value.lora_b[j][...], value.scale)
    return out


def merge_lora(model):
    """A copy of ``model`` with every adapter folded into its projection (``W + scale A B``), adapters removed.

    Args:
      model: a model with or without adapters (not modified).

    Returns:
      A plain :class:`~snapaudit_jax.models.decoders.GPT2` / ``Llama`` computing the adapted model's function
      (up to float rounding of the folded sum).
    """
    merged = nnx.clone(model)
    for block in _blocks(merged):
        for attr, value in list(vars(block).items()):
            if not isinstance(value, LoRAProjection):
                continue
            kernel = value.base.kernel[...]
            for j, (start, stop) in enumerate(value.spans):
                delta = value.delta(j).astype(jnp.float32)
                kernel = kernel.at[:, start:stop].set((kernel[:, start:stop].astype(jnp.float32) + delta)
                                                      .astype(kernel.dtype))
            value.base.kernel[...] = kernel
            setattr(block, attr, value.base)
    return merged
