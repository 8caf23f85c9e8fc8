"""Batched sentence embeddings with a BERT encoder (mean pooling + L2 normalisation)."""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Sequence

import jax
import numpy as np
from flax import nnx

from snapaudit_jax.models.bert import mean_pool_normalize
from snapaudit_jax.models.lm import batch_bucket, length_bucket
from snapaudit_jax.models.parallel import DataParallel
from snapaudit_jax.utils.errors import InputError
from snapaudit_jax.utils.files import JSON_MAX_BYTES, read_regular_text

__all__ = ["SentenceEmbedder"]


@functools.partial(jax.jit, static_argnames=("graphdef",))
def _embed(graphdef, state, tokens, mask):
    return mean_pool_normalize(nnx.merge(graphdef, state)(tokens, mask), mask)


class SentenceEmbedder:
    """Sentence embeddings as sentence-transformers computes them for mean-pooling models.

    Texts are tokenised with the checkpoint's ``tokenizer.json`` (with its ``[CLS]``/``[SEP]`` post-processing),
    truncated to ``max_seq_length``, right-padded to a bucketed length and embedded in batches.

    Args:
      name: a label for reports and cache keys.
      config: the :class:`~snapaudit_jax.models.config.BertConfig`.
      module: the :class:`~snapaudit_jax.models.bert.Bert` encoder.
      backend: a ``tokenizers.Tokenizer``; its padding is switched off and its truncation set to
        ``max_seq_length``.
      max_seq_length: token limit per text, capped at ``config.max_position_embeddings``.
      pad_id: id written in padding positions.
      data_parallel: split batches over the local devices; ``None``: automatic
        (:meth:`~snapaudit_jax.models.parallel.DataParallel.auto`).

    Attributes:
      name: the label.
      config: the configuration.
      graphdef: the encoder's NNX graph definition.
      state: its parameters, replicated over ``parallel``'s devices.
      parallel: the :class:`~snapaudit_jax.models.parallel.DataParallel` placement.
      backend: the tokenizer.
      max_seq_length: the effective token limit.
      pad_id: the padding id.
    """

    def __init__(self, name: str, config, module, backend, max_seq_length: int, pad_id: int = 0, *,
                 data_parallel: bool | None = None):
        """Splits ``module`` into graph and parameters, places them and configures the tokenizer.

        Args:
          name: see :class:`SentenceEmbedder`.
          config: see :class:`SentenceEmbedder`.
          module: see :class:`SentenceEmbedder`.
          backend: see :class:`SentenceEmbedder`.
          max_seq_length: see :class:`SentenceEmbedder`.
          pad_id: see :class:`SentenceEmbedder`.
          data_parallel: see :class:`SentenceEmbedder`.
        """
        self.name = name
        self.config = config
        self.graphdef, state = nnx.split(module)
        self.parallel = DataParallel.auto(state, data_parallel)
        self.state = self.parallel.replicate(state)
        self.backend = backend
        self.max_seq_length = int(min(max_seq_length, config.max_position_embeddings))
        self.backend.no_padding()
        self.backend.enable_truncation(max_length=self.max_seq_length)
        self.pad_id = pad_id

    @property
    def dim(self) -> int:
        """Embedding dimension (the encoder's hidden size)."""
        return self.config.hidden_size

    @classmethod
    def from_folder(cls, name: str, folder: str, config, module, *,
                    data_parallel: bool | None = None) -> "SentenceEmbedder":
        """An embedder from a checkpoint folder's tokenizer files and an already loaded encoder.

        ``max_seq_length`` comes from ``sentence_bert_config.json`` if present, else the position limit; the pad id
        is that of ``[PAD]`` (0 if absent).

        Args:
          name: a label for reports and cache keys.
          folder: the checkpoint folder (with ``tokenizer.json``).
          config: the encoder's :class:`~snapaudit_jax.models.config.BertConfig`.
          module: the loaded :class:`~snapaudit_jax.models.bert.Bert`.
          data_parallel: see :class:`SentenceEmbedder`.

        Returns:
          The :class:`SentenceEmbedder`.

        Raises:
          InputError: the folder has no ``tokenizer.json``.
        """
        from tokenizers import Tokenizer as Backend

        path = os.path.join(folder, "tokenizer.json")
        if not os.path.lexists(path):
            raise InputError(f"{folder}: no tokenizer.json")
        backend = Backend.from_str(read_regular_text(path, "tokenizer file", max_bytes=JSON_MAX_BYTES))
        limit = config.max_position_embeddings
        st_config = os.path.join(folder, "sentence_bert_config.json")
        if os.path.lexists(st_config):
            raw = read_regular_text(st_config, "sentence-transformers configuration", max_bytes=JSON_MAX_BYTES)
            try:
                limit = int(json.loads(raw).get("max_seq_length", limit))
            except (ValueError, TypeError, AttributeError) as err:
                raise InputError(f"{st_config}: max_seq_length must be an integer in a JSON object ({err})") \
                    from None
        pad = backend.token_to_id("[PAD]")
        return cls(name, config, module, backend, limit, 0 if pad is None else pad, data_parallel=data_parallel)

    def embed(self, texts: Sequence[str], *, batch_size: int = 32) -> np.ndarray:
        """Unit-norm embeddings of ``texts``, in their order.

        Args:
          texts: the strings to embed (non-empty).
          batch_size: texts per forward pass (texts of similar token length are batched together).

        Returns:
          ``(n, d)`` float32 unit-norm embeddings, ``d = dim``.

        Raises:
          InputError: ``texts`` is empty or holds a non-string.
        """
        texts = list(texts)
        if not texts:
            raise InputError("texts must not be empty")
        for i, t in enumerate(texts):
            if not isinstance(t, str):
                raise InputError(f"texts[{i}] must be a string, got {type(t).__name__}")
        rows = [e.ids for e in self.backend.encode_batch(texts, add_special_tokens=True)]
        out = np.empty((len(rows), self.dim), np.float32)
        order = np.argsort([len(r) for r in rows])  # similar lengths share a bucket
        for start in range(0, len(rows), batch_size):
            idx = order[start:start + batch_size]
            chunk = [rows[i] for i in idx]
            length = length_bucket(max(map(len, chunk)))
            batch = self.parallel.batch_size(batch_bucket(len(chunk)))
            tokens = np.full((batch, length), self.pad_id, np.int32)
            mask = np.zeros((batch, length), bool)
            for j, ids in enumerate(chunk):
                tokens[j, : len(ids)] = ids
                mask[j, : len(ids)] = True
            mask[len(chunk):, 0] = True  # filler rows
            emb = _embed(self.graphdef, self.state, *self.parallel.split(tokens, mask))
            out[idx] = np.asarray(emb)[: len(chunk)]
        return out
