"""The pretrained base of a fine-tuning run, as ``snapaudit finetune`` and ``snapaudit pii`` both read and copy it.

One implementation serves both commands: the base named by a config's ``model.base`` (``"smollm2"``, a GPT-2 /
Llama Hugging Face folder or a Llama ``.gguf`` file) is read in two steps -- :func:`base_header` (tokenizer and
architecture, no weights: every check runs before the weights are loaded) and :func:`load_base` -- and every
trained model starts as :func:`fresh_copy` of it, with the run's LoRA adapters when the method is ``"lora"``. The
copy shares the base's arrays and never writes them (JAX arrays are immutable; the copy's variables are its own),
so the base stays bitwise the public model it was.
"""

from __future__ import annotations

import os
from typing import Any

import jax
from flax import nnx

from snapaudit_jax.finetune.lora import LoRAConfig, apply_lora
from snapaudit_jax.utils.config import ConfigFileError
from snapaudit_jax.utils.errors import InputError
from snapaudit_jax.utils.memory import check_fits

__all__ = ["LORA_STREAM", "base_header", "base_path", "check_lora", "check_training_fits", "fresh_copy",
           "load_base", "max_positions", "parameter_count"]

LORA_STREAM = 7  # the adapters' initialisation: fold_in(key(seed), LORA_STREAM)


def base_path(base: str) -> str:
    """The file or folder of ``base`` (``"smollm2"``: the installed package's GGUF file).

    Args:
      base: a config's ``model.base``.

    Returns:
      The path.
    """
    from snapaudit_jax.models import default_model_path

    return default_model_path(base) if base == "smollm2" else base


_HEADERS: dict[tuple, tuple] = {}  # base_header's memo: (base, what its files are now) -> (tokenizer, cfg)


def _identity(path: str) -> tuple | None:
    """What ``path`` is now: its real path with the size and modification time of the file, or of every entry
    of the folder (a rewritten file changes it); ``None`` where it cannot be read (no memo then)."""
    try:
        real = os.path.realpath(path)
        if os.path.isdir(real):
            with os.scandir(real) as it:
                return real, tuple(sorted((e.name, *_size_and_time(e.stat())) for e in it))
        return real, *_size_and_time(os.stat(real))
    except OSError:
        return None


def _size_and_time(st: os.stat_result) -> tuple[int, int]:
    return st.st_size, st.st_mtime_ns


def base_header(base: str, field: str = "model.base"):
    """The base's tokenizer and architecture config, read without its weights.

    A second call for the same base, its files unchanged (path, sizes and modification times), answers from
    memory: a command reads the header when its configuration is loaded and again when it prepares its data.

    Args:
      base: a config's ``model.base``.
      field: the config key named in errors.

    Returns:
      ``(tokenizer, cfg)``: a :class:`~snapaudit_jax.models.tokenizer.Tokenizer` and a ``GPT2Config`` or
      ``LlamaConfig``.

    Raises:
      ConfigFileError: the base cannot be read, or is not a GPT-2 / Llama decoder (naming ``field``).
    """
    from snapaudit_jax.models import load_tokenizer
    from snapaudit_jax.models.config import GPT2Config, LlamaConfig
    from snapaudit_jax.models.tokenizer import Tokenizer
    from snapaudit_jax.models.weights import gguf_llama_config, open_gguf, read_config

    try:
        path = base_path(base)
        identity = _identity(path)
        if identity is not None and (base, identity) in _HEADERS:
            return _HEADERS[base, identity]
        if path.endswith(".gguf"):  # one parse of the metadata (seconds for a 49k vocabulary) serves both
            reader = open_gguf(path)
            tokenizer, cfg = Tokenizer.from_gguf(reader, path), gguf_llama_config(reader, path)
        else:
            tokenizer = load_tokenizer(base)
            cfg, _ = read_config(path)
    except InputError as err:
        raise ConfigFileError(f"{field}: {err}") from None
    if not isinstance(cfg, (GPT2Config, LlamaConfig)):
        raise ConfigFileError(f"{field}: {base}: fine-tuning needs a GPT-2 or Llama decoder, got a "
                              f"{type(cfg).__name__} checkpoint (a BERT checkpoint is an embedder, not a language "
                              "model)")
    if identity is not None:
        _HEADERS.clear()  # the latest base only: a tokenizer of a 49k vocabulary is not small
        _HEADERS[base, identity] = tokenizer, cfg
    return tokenizer, cfg


def load_base(base: str, *, allow_pickle: bool = False, field: str = "model.base"):
    """The base's weights and tokenizer, on one device.

    Args:
      base: a config's ``model.base``.
      allow_pickle: accept pickle weights in a folder (they can execute code when loaded).
      field: the config key named in errors.

    Returns:
      The :class:`~snapaudit_jax.models.lm.LanguageModel`.

    Raises:
      ConfigFileError: the weights cannot be read (naming ``field``).
    """
    from snapaudit_jax.models import load_language_model

    try:
        return load_language_model(base, allow_pickle=allow_pickle, data_parallel=False)
    except InputError as err:
        raise ConfigFileError(f"{field}: {err}") from None


def parameter_count(cfg) -> int:
    """Parameters of a GPT-2 / Llama config (embeddings, blocks, norms, an untied head).

    Args:
      cfg: a ``GPT2Config`` or ``LlamaConfig``.

    Returns:
      The count.
    """
    from snapaudit_jax.models.config import GPT2Config

    if isinstance(cfg, GPT2Config):
        e = cfg.n_embd
        return cfg.vocab_size * e + cfg.n_positions * e + cfg.n_layer * (4 * e + 4 * e * e + 4 * e + 2 * e * cfg.n_inner
                                                                          + cfg.n_inner + e) + 2 * e
    e, d, h, kv, inter = (cfg.hidden_size, cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads,
                          cfg.intermediate_size)
    block = 2 * e + e * (h + 2 * kv) * d + h * d * e + 3 * e * inter
    return cfg.vocab_size * e * (1 if cfg.tie_word_embeddings else 2) + cfg.num_hidden_layers * block + e


def max_positions(cfg) -> int:
    """The longest sequence the base was built for (``n_positions`` / ``max_position_embeddings``).

    Args:
      cfg: a ``GPT2Config`` or ``LlamaConfig``.

    Returns:
      The number of positions.
    """
    return int(getattr(cfg, "n_positions", None) or cfg.max_position_embeddings)


def check_training_fits(cfg, *, method: str, optimizer: str, field: str) -> int:
    """Refuses a training whose float32 weights, gradients and optimizer state exceed the machine's memory.

    Full fine-tuning holds 4 (Adam) or 3 (SGD) float32 copies of every parameter; LoRA holds the frozen weights and
    their activations' gradients, 2 copies (the adapters are small). A lower bound: activations come on top.

    Args:
      cfg: the base's architecture config.
      method: ``"full"`` or ``"lora"``.
      optimizer: ``"sgd"``, ``"adam"`` or ``"adamw"``.
      field: the config key named in the error.

    Returns:
      The bytes estimated.

    Raises:
      ConfigFileError: the estimate exceeds the available memory (naming ``field``).
    """
    total = parameter_count(cfg)
    need = total * 4 * (2 if method == "lora" else (3 if optimizer == "sgd" else 4))
    try:
        check_fits(field, need, f"{method} fine-tuning of {total:,} parameters (weights, gradients and optimizer "
                   "state)")
    except InputError as err:
        raise ConfigFileError(str(err)) from None
    return need


def check_lora(cfg, *, rank: int, alpha: float, targets, section: str) -> LoRAConfig:
    """The adapters of a run, checked against the base (a rank above a projection's width, a target it lacks).

    Args:
      cfg: the base's architecture config.
      rank, alpha, targets: the configured adapters.
      section: the config section named in errors (``"finetune"`` or ``"model"``).

    Returns:
      The :class:`~snapaudit_jax.finetune.lora.LoRAConfig`.

    Raises:
      ConfigFileError: naming ``<section>.rank`` or ``<section>.targets``.
    """
    try:
        lora = LoRAConfig(rank=rank, alpha=alpha, targets=targets)
        lora.resolved_targets(cfg)
    except InputError as err:
        key = "rank" if str(err).startswith("rank") else "targets"
        raise ConfigFileError(f"{section}.{key}: {err}") from None
    return lora


def fresh_copy(module, lora: LoRAConfig | None, *, seed: int) -> Any:
    """A new model of the base's structure sharing its arrays, with LoRA adapters when ``lora`` is given.

    Every call with the same ``seed`` gives the same adapters (the shared initialisation of a run's models).

    Args:
      module: the base's NNX decoder (left unchanged).
      lora: the adapters' configuration, or ``None`` for full fine-tuning.
      seed: the adapters' seed (``fold_in(key(seed), LORA_STREAM)``).

    Returns:
      The copy.
    """
    graphdef, state = nnx.split(module)
    model = nnx.merge(graphdef, state)
    if lora is not None:
        apply_lora(model, lora, key=jax.random.fold_in(jax.random.key(seed), LORA_STREAM))
    return model
