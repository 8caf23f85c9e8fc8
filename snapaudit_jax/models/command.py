"""The ``snapaudit generate`` and ``snapaudit embed`` commands: one text or a few embeddings from a model.

The command line parses flags and prints; these functions check the request,
load the model and compute. Every error names its flag.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

from snapaudit_jax.utils import validate
from snapaudit_jax.utils.errors import InputError

__all__ = ["embed_texts", "generate_text"]


def _load(load: Callable[..., Any], model: str, allow_pickle: bool):
    """``load(model)``; a checkpoint that cannot be loaded names ``--model``."""
    if not model.strip():
        raise InputError(f"--model must name a model, a .gguf file or a checkpoint folder, got {model!r}")
    try:
        return load(model, allow_pickle=allow_pickle)
    except (ValueError, OSError) as err:
        raise InputError(f"--model: {err}") from None


def _served(server: dict | None, tokenizer: str):
    """The model of an OpenAI-compatible server (``--model openai``): flags checked, server probed."""
    from snapaudit_jax.models import load_tokenizer
    from snapaudit_jax.models.server import ServerConfig, connect

    server = dict(server or {})
    for key, flag in (("base_url", "--base-url"), ("model", "--server-model")):
        if not server.get(key):
            raise InputError(f"{flag} is required with --model openai")
    try:
        config = ServerConfig(**server)
    except InputError as err:
        raise InputError(str(err).replace("model.server.base_url", "--base-url")
                         .replace("model.server.model", "--server-model")
                         .replace("model.server.api_key_env", "--api-key-env")) from None
    try:
        tok = load_tokenizer(tokenizer)
    except (ValueError, OSError) as err:
        raise InputError(f"--tokenizer: {err}") from None
    return connect(config, tok)[0]


def generate_text(model: str, prompt: str, *, chat: bool = False, max_new_tokens: int = 64,
                  temperature: float | None = None, seed: int | None = None,
                  allow_pickle: bool = False, server: dict | None = None,
                  tokenizer: str = "smollm2") -> dict[str, Any]:
    """Greedy or sampled continuation of one prompt.

    Args:
      model: ``"smollm2"``, a ``.gguf`` file or a Hugging Face folder, or ``"openai"``: the model of an
        OpenAI-compatible server (``server``).
      prompt: the prompt text (not empty).
      chat: wrap the prompt in the model's chat template.
      max_new_tokens: tokens to generate (>= 1; with the prompt within the model's positions).
      temperature: sampling temperature (> 0, finite); ``None`` decodes greedily.
      seed: the PRNG seed, required with ``temperature``, in ``[0, 2**63 - 1]``.
      allow_pickle: accept pickle checkpoints (``.bin``/``.pt``).
      server: with ``model = "openai"``: the :class:`~snapaudit_jax.models.server.ServerConfig` fields
        (``base_url``, ``model``, optionally ``api_key_env``, ``timeout_s``...).
      tokenizer: with ``model = "openai"``: the served model's tokenizer (``"smollm2"``, a ``.gguf`` file or a
        Hugging Face folder).

    Returns:
      ``{"model", "text", "token_ids", "seconds"}`` (``seconds``: generation time without loading).

    Raises:
      InputError: a bad flag value (a text that is not valid UTF-8 included) or a model that cannot be loaded (the
        message names the flag).
      ServerError: the server cannot be reached or fails (``model = "openai"``).
    """
    import jax

    from snapaudit_jax.models import load_language_model

    if max_new_tokens < 1:
        raise InputError(f"--max-new-tokens must be >= 1, got {max_new_tokens}")
    if temperature is not None and seed is None:
        raise InputError("--seed is required with --temperature (sampling needs an explicit key)")
    if seed is not None:
        validate.seed("--seed", seed)
    validate.utf8_text("--prompt", prompt)
    for flag, value in (("--base-url", (server or {}).get("base_url")), ("--server-model", (server or {}).get("model")),
                        ("--api-key-env", (server or {}).get("api_key_env"))):
        if isinstance(value, str):
            validate.utf8_text(flag, value)
    if temperature is not None and not 0 < temperature < math.inf:
        raise InputError(f"--temperature must be a finite number > 0, got {temperature}")
    if not prompt.strip():
        raise InputError("--prompt must not be empty")
    if model != "openai" and server:
        raise InputError(f"--base-url, --server-model and --api-key-env need --model openai, got --model {model!r}")
    lm = _served(server, tokenizer) if model == "openai" else _load(load_language_model, model, allow_pickle)
    text = lm.chat_prompt(prompt) if chat else prompt
    n_prompt = len(lm.tokenizer.encode(text))
    if n_prompt + max_new_tokens > lm.max_length:
        raise InputError(f"--max-new-tokens: the prompt's {n_prompt} tokens plus {max_new_tokens} new tokens "
                         f"exceed the model's {lm.max_length} positions (at most {lm.max_length - n_prompt} here), "
                         f"got {max_new_tokens}")
    start = time.perf_counter()
    key = None if seed is None else jax.random.key(seed)
    gen = lm.generate([text], max_new_tokens=max_new_tokens, temperature=temperature, key=key)[0]
    return {"model": model, "text": gen.text, "token_ids": list(gen.token_ids),
            "seconds": time.perf_counter() - start}


def embed_texts(model: str, texts: Sequence[str], *, allow_pickle: bool = False) -> dict[str, Any]:
    """L2-normalised sentence embeddings of ``texts``.

    Args:
      model: ``"minilm"`` or a Hugging Face BERT folder.
      texts: the texts (each non-empty).
      allow_pickle: accept pickle checkpoints.

    Returns:
      ``{"model", "embeddings"}`` with ``embeddings`` a ``(len(texts), d)`` float32 array.

    Raises:
      InputError: an empty text, a text that is not valid UTF-8, or a model that cannot be loaded (the message
        names the flag).
    """
    from snapaudit_jax.models import load_embedder

    for i, text in enumerate(texts):
        if not text.strip():
            raise InputError(f"--text must not be empty, got {text!r} (text {i + 1})")
        validate.utf8_text(f"--text (text {i + 1})", text)
    embedder = _load(load_embedder, model, allow_pickle)
    return {"model": model, "embeddings": embedder.embed(list(texts))}
