"""The embedded SmolLM2 as a Flax language model, loaded once per test process.

Reading and dequantising the GGUF file takes about 9 s; the tests that use the real model (parity with
transformers, the copy query, ``transformers serve``) share this one instance, and with it its compiled
functions. Tests must not change it (its parameters or its tokenizer).
"""

from __future__ import annotations

import functools


@functools.lru_cache(maxsize=1)
def smollm2():
    """The embedded SmolLM2-135M-Instruct (``load_language_model("smollm2")``), the same object every call.

    Returns:
      The :class:`~snapaudit_jax.models.lm.LanguageModel`.

    Raises:
      CheckpointError: the embedded model's package is not installed.
    """
    from snapaudit_jax.models import load_language_model

    return load_language_model("smollm2")
