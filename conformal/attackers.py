"""Re-identification attackers that map released documents to distributions over a candidate pool.

Every attacker here implements :class:`Attacker`: ``posterior(documents)``
returns ``(n, m)`` rows summing to 1 over the ``m`` candidates, which the
calibration layer (:mod:`conformal.kernels`) turns into scores and sets. Any
other attacker that returns a distribution plugs in the same way; one that
only ranks candidates can return any monotone weights and use the ``rank``
score.

* :class:`RetrievalAttacker` (Retrieval-CPA): TF-IDF profiles (scikit-learn's
  vectoriser) and queries; cosine similarity, temperature softmax and ranking
  in JAX (profiles as a padded sparse "ELL" matrix gathered against dense
  query chunks).
* :class:`ClueAttacker`: the released text plus clues an LLM extracts from it
  (``direct_plus_clues``), then retrieval.
* :class:`~conformal.profile.ProfileAttacker` (Profile-CPA) lives in
  :mod:`conformal.profile`: it certifies attribute sets, not a distribution.

References:
  Huang et al. 2026 (CPA) Sections 4.3, 6.2 and Appendix B.1.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Protocol

import jax
import jax.numpy as jnp
import numpy as np

from snapaudit_jax.utils.errors import InputError

__all__ = ["Attacker", "RetrievalAttacker", "ClueAttacker", "softmax_posterior", "ell_similarity", "CLUE_PROMPT"]


class Attacker(Protocol):
    """Anything that maps documents to ``(n, m)`` distributions over a fixed candidate pool."""

    def posterior(self, documents: Sequence[str]) -> np.ndarray:
        """The attacker's distribution over the pool for each document.

        Args:
          documents: ``(n,)`` released document texts.

        Returns:
          ``(n, m)`` rows summing to 1.
        """
        ...


@functools.partial(jax.jit, static_argnames=())
def ell_similarity(queries: jax.Array, terms: jax.Array, weights: jax.Array) -> jax.Array:
    """Dot products of dense queries with sparse profiles in padded ("ELL") form.

    Args:
      queries: ``(c, V)`` dense query vectors.
      terms: ``(m, R)`` int32 vocabulary ids of each profile's non-zeros (padding: any id).
      weights: ``(m, R)`` their weights (padding: 0).

    Returns:
      ``(c, m)``: ``queries @ profiles.T``.
    """
    return jnp.einsum("cmr,mr->cm", jnp.take(queries, terms, axis=1), weights)


@jax.jit
def softmax_posterior(similarities: jax.Array, temperature: jax.Array) -> jax.Array:
    """``softmax(similarities / temperature)`` per row: the retrieval pseudo-posterior (CPA B.1).

    Args:
      similarities: ``(n, m)`` similarities.
      temperature: ``()`` softmax temperature (> 0).

    Returns:
      ``(n, m)`` rows summing to 1.
    """
    return jax.nn.softmax(similarities / temperature, axis=-1)


def _ell(matrix) -> tuple[np.ndarray, np.ndarray]:
    """scipy CSR ``(m, V)`` -> padded ``(terms, weights)``, each ``(m, R)``, R = the most non-zeros in a row."""
    csr = matrix.tocsr()
    counts = np.diff(csr.indptr)
    width = max(1, int(counts.max()) if counts.size else 1)
    terms = np.zeros((csr.shape[0], width), np.int32)
    weights = np.zeros((csr.shape[0], width), np.float32)
    rows = np.repeat(np.arange(csr.shape[0]), counts)
    cols = np.arange(csr.nnz) - np.repeat(csr.indptr[:-1], counts)
    terms[rows, cols] = csr.indices
    weights[rows, cols] = csr.data
    return terms, weights


class RetrievalAttacker:
    """TF-IDF retrieval over candidate profiles, with a temperature-softmax pseudo-posterior.

    The vectoriser is fitted on the profile texts only (the attacker's
    auxiliary database); each document is the query. The temperature is part
    of the declared attacker configuration: any value gives valid coverage,
    it only changes set sizes (fix it before seeing the test split).

    Args:
      profiles: ``(m,)`` profile texts, one per candidate.
      temperature: softmax temperature over cosine similarities (> 0).
      chunk: queries per JAX call (memory ``chunk x m x R`` floats).
      vectorizer: scikit-learn ``TfidfVectorizer`` keyword arguments
        (default: English stop words, sublinear tf, unigrams).
    """

    def __init__(self, profiles: Sequence[str], *, temperature: float = 0.5, chunk: int = 16,
                 vectorizer: dict | None = None):
        """Fits the TF-IDF vectoriser on the profiles.

        Args:
          profiles: see :class:`RetrievalAttacker`.
          temperature: see :class:`RetrievalAttacker`.
          chunk: see :class:`RetrievalAttacker`.
          vectorizer: see :class:`RetrievalAttacker`.

        Raises:
          ValueError: for no profile, a profile that is not a string, ``temperature <= 0``, ``chunk < 1``, or
            profiles with no vocabulary (empty or only stop words).
        """
        from sklearn.feature_extraction.text import TfidfVectorizer

        profiles = list(profiles)
        if not profiles:
            raise InputError("profiles must not be empty (the candidate pool has no profile)")
        for i, p in enumerate(profiles):
            if not isinstance(p, str):
                raise InputError(f"profiles[{i}] must be a string, got {type(p).__name__}")
        if not temperature > 0:
            raise InputError(f"temperature must be > 0, got {temperature!r}")
        if chunk < 1:
            raise InputError(f"chunk must be >= 1, got {chunk!r}")
        kwargs = {"sublinear_tf": True, "stop_words": "english", "lowercase": True}
        kwargs.update(vectorizer or {})
        self.vectorizer = TfidfVectorizer(**kwargs)
        try:
            matrix = self.vectorizer.fit_transform(profiles)
        except ValueError as err:  # e.g. every profile empty or only stop words
            raise InputError(f"profiles: cannot build a TF-IDF vocabulary ({err})") from None
        self.temperature = float(temperature)
        self.chunk = int(chunk)
        self.size = len(profiles)
        terms, weights = _ell(matrix)
        self._terms, self._weights = jnp.asarray(terms), jnp.asarray(weights)

    def similarities(self, documents: Sequence[str]) -> np.ndarray:
        """Cosine similarities ``(n, m)`` (TF-IDF rows are L2-normalised).

        Args:
          documents: ``(n,)`` query texts, ``n >= 1``.

        Returns:
          ``(n, m)`` float32 similarities in ``[0, 1]``.

        Raises:
          ValueError: for no document.
        """
        documents = list(documents)
        if not documents:
            raise InputError("documents must not be empty")
        queries = self.vectorizer.transform(documents).astype(np.float32)
        out = np.empty((len(documents), self.size), np.float32)
        width = queries.shape[1]
        for start in range(0, len(documents), self.chunk):
            block = queries[start:start + self.chunk].toarray()
            rows = block.shape[0]
            if rows < self.chunk:  # fixed shapes: pad the last chunk (no recompilation)
                block = np.vstack([block, np.zeros((self.chunk - rows, width), np.float32)])
            sims = ell_similarity(jnp.asarray(block), self._terms, self._weights)
            out[start:start + rows] = np.asarray(sims)[:rows]
        return out

    def posterior(self, documents: Sequence[str]) -> np.ndarray:
        """Pseudo-posterior ``(n, m)``: temperature softmax of the similarities.

        Args:
          documents: ``(n,)`` query texts, ``n >= 1``.

        Returns:
          ``(n, m)`` float32 rows summing to 1.

        Raises:
          ValueError: for no document.
        """
        sims = self.similarities(documents)
        return np.asarray(softmax_posterior(jnp.asarray(sims), jnp.float32(self.temperature)))


CLUE_PROMPT = (
    "Read the text below and list the details that could identify the person it describes: age, gender, "
    "occupation, city, employer, notable events, hobbies. Answer with a short comma-separated list.\n\n"
    "Text: {document}"
)


class ClueAttacker:
    """LLM clue extraction appended to the query, then TF-IDF retrieval (``direct_plus_clues``).

    Args:
      retrieval: the retrieval attacker over the candidate profiles.
      oracle: an :class:`~snapaudit_jax.models.oracle.LLMOracle` (cached,
        counted model calls; greedy decoding, so each document's clues are
        fixed: a deterministic attacker).
      max_new_tokens: length of the clue list.
      prompt: template with a ``{document}`` field.
    """

    def __init__(self, retrieval: RetrievalAttacker, oracle, *, max_new_tokens: int = 48,
                 prompt: str = CLUE_PROMPT):
        """Checks the prompt template and the clue length.

        Args:
          retrieval: see :class:`ClueAttacker`.
          oracle: see :class:`ClueAttacker`.
          max_new_tokens: see :class:`ClueAttacker`.
          prompt: see :class:`ClueAttacker`.

        Raises:
          ValueError: if ``prompt`` has no ``{document}`` field or ``max_new_tokens < 1``.
        """
        if "{document}" not in prompt:
            raise InputError("prompt must contain the field {document}")
        if max_new_tokens < 1:
            raise InputError(f"max_new_tokens must be >= 1, got {max_new_tokens!r}")
        self.retrieval = retrieval
        self.oracle = oracle
        self.max_new_tokens = int(max_new_tokens)
        self.prompt = prompt

    def clues(self, documents: Sequence[str]) -> list[str]:
        """The clue list the LLM extracts from each document.

        Args:
          documents: ``(n,)`` document texts.

        Returns:
          ``(n,)`` clue lists (greedy decoding, stripped).
        """
        prompts = [self.oracle.lm.chat_prompt(self.prompt.format(document=d)) for d in documents]
        return [c.strip() for c in self.oracle.generate(prompts, self.max_new_tokens)]

    def queries(self, documents: Sequence[str]) -> list[str]:
        """The retrieval queries: each document followed by its clue list on a new line.

        Args:
          documents: ``(n,)`` document texts.

        Returns:
          ``(n,)`` query texts.
        """
        return [f"{d}\n{c}" for d, c in zip(documents, self.clues(documents))]

    def posterior(self, documents: Sequence[str]) -> np.ndarray:
        """The retrieval pseudo-posterior of the clue-augmented queries.

        Args:
          documents: ``(n,)`` document texts.

        Returns:
          ``(n, m)`` float32 rows summing to 1.
        """
        return self.retrieval.posterior(self.queries(list(documents)))
