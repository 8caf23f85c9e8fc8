"""Model calls of the pipelines, deduplicated, cached on disk and counted.

Clean outputs are computed with greedy decoding, which is deterministic, so a
prompt asked many times is computed once and its answer reused ("counted n
times"). The cache is an append-only JSONL file: an interrupted run resumes
with every answer it had already computed; a torn last line is ignored (and cut
off before the next answer is appended), any other invalid line is an error.
:meth:`LLMOracle.verify` recomputes a sample without the cache, in other batch
compositions, to confirm the determinism the cache relies on.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Sequence

import numpy as np

from snapaudit_jax.models.embedder import SentenceEmbedder
from snapaudit_jax.models.lm import LanguageModel
from snapaudit_jax.utils.errors import InputError
from snapaudit_jax.utils.files import read_regular
from snapaudit_jax.utils.io import named_os_errors

__all__ = ["LLMOracle", "CallStats", "read_cache"]


@dataclasses.dataclass
class CallStats:
    """Logical calls (what a deployed pipeline would pay) and unique computations, per model.

    Attributes:
      calls: language-model calls requested (label scoring, copy checks and generation).
      computed: language-model answers actually computed (not in the cache, deduplicated).
      cached: language-model calls answered from the cache or by a duplicate in the same request.
      embed_calls: sentence-embedder calls requested.
      embed_computed: embeddings actually computed.
    """

    calls: int = 0  # language-model calls
    computed: int = 0
    cached: int = 0
    embed_calls: int = 0  # sentence-embedder calls
    embed_computed: int = 0

    def as_dict(self) -> dict:
        """The counters as a ``{field: int}`` dictionary."""
        return dataclasses.asdict(self)


def _key(kind: str, model: str, *parts) -> str:
    """SHA-256 of a request (kind, model and every part): the cache key and the manifest's prompt hash."""
    h = hashlib.sha256()
    for p in (kind, model, *parts):
        h.update(str(p).encode())
        h.update(b"\x00")
    return h.hexdigest()


def _valid_row(row) -> bool:
    key = row.get("k") if isinstance(row, dict) else None
    return isinstance(key, str) and len(key) == 64 and all(c in "0123456789abcdef" for c in key) and "v" in row


def read_cache(path: str | os.PathLike) -> tuple[dict[str, object], int | None]:
    """The answers of a JSONL answer cache and the byte offset of its torn last line.

    Each line is ``{"k": <64 hex digits>, "v": <answer>}`` and ends with a newline; what follows the last
    newline is a write that an interruption cut short, and is ignored.

    Args:
      path: the cache file.

    Returns:
      ``(answers, torn)``: the answers by key, and the byte offset where the torn last line starts
      (``None``: the file ends with a newline).

    Raises:
      InputError: the file cannot be read, or a complete line is not such a record (the
        message names the file and the line).
    """
    path = os.fspath(path)
    data = read_regular(path, "answer cache")
    *lines, rest = data.split(b"\n")
    cache: dict[str, object] = {}
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as err:
            raise InputError(f"{path}: line {lineno} of the answer cache is not JSON ({err}); the file is corrupted: "
                             "delete it to recompute the answers") from None
        if not _valid_row(row):
            shown = line[:80].decode(errors="replace")
            raise InputError(f"{path}: line {lineno} of the answer cache must be an object "
                             f'{{"k": <64 hex digits>, "v": <answer>}}, got {shown!r}; delete the file to recompute '
                             "the answers")
        cache[row["k"]] = row["v"]
    return cache, (len(data) - len(rest) if rest else None)


class LLMOracle:
    """Cached, counted access to a language model and a sentence embedder.

    Requests are keyed by the SHA-256 of their kind, the model's identity (:attr:`model_identity`) and their
    content; each distinct request is computed once (in batches of ``batch_size``) and appended to the cache file.

    Args:
      lm: the pipeline's language model.
      embedder: sentence embedder (ESA), optional.
      cache_path: JSONL file for answers, read if it exists (``None``: in memory only).
      batch_size: prompts per model batch.
      progress: callable ``(done, total, label)`` for progress reporting, optional.

    Attributes:
      lm: the language model.
      embedder: the sentence embedder, or ``None``.
      cache_path: the cache file, or ``None``.
      batch_size: prompts per model batch.
      progress: the progress callable, or ``None``.
      stats: the :class:`CallStats` of this oracle.
      requested: hashes of every distinct request made through this oracle.
      model_identity: what the language model's answers are keyed by: its ``identity`` where it has one (a
        model server: base URL, served model id and fingerprint, so that answers of one server are never reused
        for another), else its ``name`` (an in-process model).
    """

    def __init__(self, lm: LanguageModel, embedder: SentenceEmbedder | None = None, *, cache_path: str | None = None,
                 batch_size: int = 8, progress=None):
        """Opens the oracle, loading the answers already in ``cache_path``.

        Args:
          lm: see :class:`LLMOracle`.
          embedder: see :class:`LLMOracle`.
          cache_path: see :class:`LLMOracle`.
          batch_size: see :class:`LLMOracle`.
          progress: see :class:`LLMOracle`.

        Raises:
          InputError: the cache file cannot be read or is corrupted (see :func:`read_cache`).
        """
        self.lm = lm
        self.embedder = embedder
        self.cache_path = cache_path
        self.batch_size = batch_size
        self.progress = progress
        self.stats = CallStats()
        self.requested: set[str] = set()  # hashes of every distinct request made through this oracle
        self.model_identity = getattr(lm, "identity", None) or lm.name
        self._cache: dict[str, object] = {}
        self._torn: int | None = None  # byte offset where the next append must start (a torn last line)
        if cache_path and os.path.exists(cache_path):
            self._cache, self._torn = read_cache(cache_path)

    def __len__(self) -> int:
        return len(self._cache)

    def _store(self, items: dict[str, object]) -> None:
        self._cache.update(items)
        if self.cache_path:
            with named_os_errors(self.cache_path), open(self.cache_path, "a") as fh:
                if self._torn is not None:  # cut the torn last line off before appending
                    fh.truncate(self._torn)
                    self._torn = None
                for k, v in items.items():
                    fh.write(json.dumps({"k": k, "v": v}) + "\n")
                fh.flush()
                os.fsync(fh.fileno())

    def _run(self, kind: str, keys: list[str], payloads: list, compute, label: str) -> list:
        """Answers of ``keys``: cached ones reused, the others computed once each and stored.

        ``compute(payloads)`` returns one answer per payload. A model that streams its answers (a server
        backend: ``lm.streams_answers``) is given all of them at once with ``on_result=(i, answer)``, called as
        each answer arrives, and every answer is stored immediately: a run killed mid-request loses no finished
        call. Other models compute ``batch_size`` payloads at a time, stored per batch.
        """
        self.requested.update(keys)
        todo = {}
        for k, p in zip(keys, payloads):
            if k not in self._cache and k not in todo:
                todo[k] = p
        if kind == "embed":
            self.stats.embed_calls += len(keys)
            self.stats.embed_computed += len(todo)
        else:
            self.stats.calls += len(keys)
            self.stats.cached += len(keys) - len(todo)
        items = list(todo.items())
        model = self.embedder if kind == "embed" else self.lm
        if items and getattr(model, "streams_answers", False):
            done = [0]

            def store(i, value):
                self._store({items[i][0]: value})
                if kind != "embed":
                    self.stats.computed += 1
                done[0] += 1
                if self.progress:
                    self.progress(done[0], len(items), label)

            compute([p for _, p in items], on_result=store)
            return [self._cache[k] for k in keys]
        step = self.batch_size
        for start in range(0, len(items), step):
            chunk = items[start:start + step]
            values = compute([p for _, p in chunk])
            self._store({k: v for (k, _), v in zip(chunk, values)})
            if kind != "embed":
                self.stats.computed += len(chunk)
            if self.progress:
                self.progress(min(start + step, len(items)), len(items), label)
        return [self._cache[k] for k in keys]

    # --- the four kinds of model calls ---------------------------------------------------------
    def label_logprobs(self, prompts: Sequence[str], labels: Sequence[str]) -> np.ndarray:
        """``log P(label | prompt)`` of every prompt and label (:meth:`LanguageModel.label_logprobs`), cached.

        Args:
          prompts: the prompt texts.
          labels: the label texts (part of each prompt's cache key).

        Returns:
          ``(n, n_labels)`` float64 log-probabilities.
        """
        keys = [_key("logprobs", self.model_identity, p, *labels) for p in prompts]

        def compute(ps, on_result=None):
            if on_result is None:
                return self.lm.label_logprobs(ps, labels, batch_size=self.batch_size).tolist()
            return self.lm.label_logprobs(ps, labels, on_result=on_result)

        out = self._run("logprobs", keys, list(prompts), compute, "label scoring")
        return np.asarray(out, np.float64).reshape(len(prompts), len(labels))

    def continues_with(self, prompts: Sequence[str], continuations: Sequence[str]) -> np.ndarray:
        """Whether greedy decoding reproduces each continuation (:meth:`LanguageModel.greedy_continues_with`), cached.

        Args:
          prompts: the prompt texts.
          continuations: one continuation per prompt.

        Returns:
          ``(n,)`` bool.
        """
        keys = [_key("continues", self.model_identity, p, c) for p, c in zip(prompts, continuations)]

        def compute(pairs, on_result=None):
            ps, cs = zip(*pairs)
            if on_result is None:
                return self.lm.greedy_continues_with(ps, cs, batch_size=self.batch_size).tolist()
            return self.lm.greedy_continues_with(ps, cs, on_result=on_result)

        out = self._run("continues", keys, list(zip(prompts, continuations)), compute, "copy checks")
        return np.asarray(out, bool)

    def generate(self, prompts: Sequence[str], max_new_tokens: int) -> list[str]:
        """Greedy continuations (text), cached.

        Args:
          prompts: the prompt texts.
          max_new_tokens: tokens to emit at most (part of the cache key).

        Returns:
          One generated text per prompt, in order.
        """
        keys = [_key("generate", self.model_identity, max_new_tokens, p) for p in prompts]

        def compute(ps, on_result=None):
            if on_result is None:
                return [g.text for g in self.lm.generate(ps, max_new_tokens=max_new_tokens,
                                                         batch_size=self.batch_size)]
            return self.lm.generate(ps, max_new_tokens=max_new_tokens, on_result=lambda i, g: on_result(i, g.text))

        return self._run("generate", keys, list(prompts), compute, "generation")

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Unit-norm sentence embeddings, cached.

        Args:
          texts: the texts to embed.

        Returns:
          ``(n, d)`` float32 embeddings.

        Raises:
          InputError: the oracle has no sentence embedder.
        """
        if self.embedder is None:
            raise InputError("this pipeline needs a sentence embedder")
        keys = [_key("embed", self.embedder.name, t) for t in texts]
        out = self._run("embed", keys, list(texts),
                        lambda ts: self.embedder.embed(ts, batch_size=max(self.batch_size, 16)).tolist(),
                        "embedding")
        return np.asarray(out, np.float32)

    # --- determinism check -----------------------------------------------------------------------
    def verify(self, prompts: Sequence[str], labels: Sequence[str] | None = None) -> dict:
        """Recomputes ``prompts`` one at a time (no cache) and compares with the cached batched answers.

        Args:
          prompts: the prompts to check.
          labels: check label scoring with these labels; ``None``: check greedy generation (32 new tokens).

        Returns:
          ``{"checked", "max_abs_diff", "mismatches"}`` for label scoring (``mismatches``: prompts whose arg-max
          label differs) or ``{"checked", "mismatches"}`` for generation (``mismatches``: differing texts).
        """
        if labels is not None:
            cached = self.label_logprobs(prompts, labels)
            fresh = np.concatenate([self.lm.label_logprobs([p], labels, batch_size=1) for p in prompts])
            diff = np.abs(cached - fresh)
            flips = int(np.sum(np.argmax(cached, 1) != np.argmax(fresh, 1)))
            return {"checked": len(prompts), "max_abs_diff": float(diff.max()), "mismatches": flips}
        cached = self.generate(prompts, 32)
        fresh = [self.lm.generate([p], max_new_tokens=32, batch_size=1)[0].text for p in prompts]
        return {"checked": len(prompts), "mismatches": int(sum(a != b for a, b in zip(cached, fresh)))}
