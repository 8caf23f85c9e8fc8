"""Profile-CPA: an LLM infers attributes, conformal attribute sets filter the candidate profiles.

The attacker never sees the candidate list. For each attribute ``a`` (gender,
age range, occupation, city, ...) with a finite value vocabulary, it samples
``m`` forced-choice answers from the LLM per document (sampling-only access;
the forced-choice distribution is the LLM's normalised probability of each
value as the answer, and each document draws with its own key), giving
frequencies ``p_a``. A value's attribute score is its APS (or rank/prob) score
under ``p_a``.

Joint calibration. The identity score of candidate ``y`` is the largest of its
attribute scores, ``T(x, y) = max_a s_a(x, v_a(y))`` (a value unknown for a
candidate scores 0: it cannot rule the candidate out). Calibrating ``T`` on the
true identities and keeping ``{y : T(x, y) <= qhat}`` is exactly "the profiles
consistent with every certified attribute set" when every attribute set uses
the same threshold ``qhat``, and it covers the truth with probability
``>= 1 - alpha`` without a union bound over attributes.

References:
  Huang et al. 2026 (CPA) Section 4.3, Appendix B.1 (Profile attacker), Lemma 5.1.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from conformal.kernels import SCORES, candidate_scores, sample_frequencies
from snapaudit_jax.utils.errors import InputError

__all__ = ["ProfileAttacker", "identity_scores", "attribute_sets", "ATTRIBUTE_QUESTIONS", "example_id"]

ATTRIBUTE_QUESTIONS = {
    "gender": "What is the gender of the person described?",
    "age_range": "What is the age range of the person described?",
    "occupation": "What is the occupation of the person described?",
    "city": "In which city does the person described live?",
}


def example_id(doc_id: str) -> int:
    """A stable 31-bit id of a document (its sampling stream: the same in every split and batch).

    Args:
      doc_id: the document's id.

    Returns:
      An integer in ``[0, 2**31)``.
    """
    return zlib.crc32(doc_id.encode()) & 0x7FFFFFFF


class ProfileAttacker:
    """An LLM that predicts attributes of a document's subject by ``m`` forced-choice samples each.

    Args:
      oracle: an :class:`~snapaudit_jax.models.oracle.LLMOracle` (cached, counted calls).
      attributes: attribute name -> its value vocabulary.
      samples: ``m``, forced-choice samples per document and attribute (the attacker's budget).
      key: PRNG key of the sampling randomness.
      questions: attribute name -> question (default :data:`ATTRIBUTE_QUESTIONS`, else
        "What is the {attribute} of the person described?").
    """

    def __init__(self, oracle, attributes: Mapping[str, Sequence[str]], *, samples: int, key: jax.Array,
                 questions: Mapping[str, str] | None = None):
        """Checks the vocabularies and the sampling budget.

        Args:
          oracle: see :class:`ProfileAttacker`.
          attributes: see :class:`ProfileAttacker`.
          samples: see :class:`ProfileAttacker`.
          key: see :class:`ProfileAttacker`.
          questions: see :class:`ProfileAttacker`.

        Raises:
          ValueError: if ``attributes`` is empty, an attribute has fewer than 2 values or repeats one, or
            ``samples`` is not an integer >= 1.
        """
        if not attributes:
            raise InputError("attributes must name at least one attribute with its values")
        for name, values in attributes.items():
            if len(values) < 2:
                raise InputError(f"attributes[{name!r}] must list at least 2 values, got {list(values)!r}")
            if len(set(values)) != len(values):
                raise InputError(f"attributes[{name!r}] lists a value twice")
        if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
            raise InputError(f"samples must be an integer >= 1, got {samples!r}")
        self.oracle = oracle
        self.attributes = {k: tuple(v) for k, v in attributes.items()}
        self.samples = samples
        self.key = key
        self.questions = dict(ATTRIBUTE_QUESTIONS)
        self.questions.update(questions or {})

    def _prompt(self, document: str, attribute: str) -> str:
        question = self.questions.get(attribute, f"What is the {attribute.replace('_', ' ')} of the person described?")
        user = f"Text: {document}\n\n{question} Answer with the value only."
        return self.oracle.lm.chat_prompt(user)

    def distributions(self, documents: Sequence[str]) -> dict[str, np.ndarray]:
        """The LLM's forced-choice distribution over each attribute's values: ``{a: (n, V_a)}``.

        Args:
          documents: ``(n,)`` document texts.

        Returns:
          ``{attribute: (n, V_a) float32}``, rows summing to 1.
        """
        out = {}
        for name, values in self.attributes.items():
            prompts = [self._prompt(d, name) for d in documents]
            logp = self.oracle.label_logprobs(prompts, [f" {v}" for v in values])  # leading space: a fresh word
            logp = logp - np.logaddexp.reduce(logp, axis=1, keepdims=True)
            out[name] = np.exp(logp).astype(np.float32)
        return out

    def frequencies(self, documents: Sequence[str], doc_ids: Sequence[str]) -> dict[str, np.ndarray]:
        """``m`` forced-choice samples per document and attribute -> frequencies ``{a: (n, V_a)}``.

        Document ``d`` of attribute number ``j`` draws with
        ``fold_in(fold_in(key, j), example_id(d))``: independent of the data,
        of the other documents and of how documents are split or batched.

        Args:
          documents: ``(n,)`` document texts.
          doc_ids: ``(n,)`` their ids (the sampling streams, see :func:`example_id`).

        Returns:
          ``{attribute: (n, V_a) float32}`` sample frequencies, rows summing to 1.

        Raises:
          ValueError: if ``documents`` and ``doc_ids`` differ in length.
        """
        if len(documents) != len(doc_ids):
            raise InputError(f"got {len(documents)} documents but {len(doc_ids)} doc_ids")
        ids = jnp.asarray([example_id(d) for d in doc_ids], jnp.uint32)
        dists = self.distributions(documents)
        return {name: np.asarray(sample_frequencies(jax.random.fold_in(self.key, j), dists[name], self.samples,
                                                    example_ids=ids))
                for j, name in enumerate(self.attributes)}


def _value_index(values: Sequence[str], column: Sequence[str | None], attribute: str) -> np.ndarray:
    lookup = {v: i for i, v in enumerate(values)}
    out = np.full(len(column), -1, np.int64)
    for c, v in enumerate(column):
        if v is None:
            continue
        if v not in lookup:
            raise InputError(f"candidate {c} has {attribute} = {v!r}, not in the vocabulary {list(values)!r}")
        out[c] = lookup[v]
    return out


def identity_scores(frequencies: Mapping[str, np.ndarray], attributes: Mapping[str, Sequence[str]],
                    candidate_values: Mapping[str, Sequence[str | None]], score: str = "aps") -> np.ndarray:
    """``T(x, y) = max_a s_a(x, v_a(y))`` for every document and candidate: ``(n, m)`` float32.

    Args:
      frequencies: ``{a: (n, V_a)}`` per-document attribute distributions.
      attributes: ``{a: values}`` vocabularies (column order of ``frequencies``).
      candidate_values: ``{a: (m,)}`` each candidate's value (``None``: unknown, score 0).
      score: attribute score (one of :data:`~conformal.kernels.SCORES`).

    Returns:
      ``(n, m)`` float32 identity scores (smaller: more plausible).

    Raises:
      ValueError: for an unknown ``score``, no attribute, an attribute without vocabulary or candidate
        values, or a candidate value outside the vocabulary.
    """
    if score not in SCORES:
        raise InputError(f"score must be one of {', '.join(SCORES)}, got {score!r}")
    if not frequencies:
        raise InputError("frequencies must hold at least one attribute")
    out = None
    for name, freq in frequencies.items():
        if name not in attributes or name not in candidate_values:
            raise InputError(f"attribute {name!r} has no vocabulary or no candidate values")
        per_value = np.asarray(candidate_scores(freq, score))  # (n, V_a)
        idx = _value_index(attributes[name], candidate_values[name], name)
        cand = np.where(idx[None, :] >= 0, per_value[:, np.maximum(idx, 0)], np.float32(0.0))
        out = cand if out is None else np.maximum(out, cand)
    return out.astype(np.float32)


def attribute_sets(frequencies: Mapping[str, np.ndarray], qhat: float, score: str = "aps") -> dict[str, np.ndarray]:
    """The certified attribute sets ``{a: (n, V_a) bool}`` at a joint threshold ``qhat``.

    Args:
      frequencies: ``{a: (n, V_a)}`` per-document attribute distributions.
      qhat: the threshold calibrated on :func:`identity_scores`.
      score: attribute score (one of :data:`~conformal.kernels.SCORES`).

    Returns:
      ``{a: (n, V_a) bool}``: the values whose score is ``<= qhat``.
    """
    return {name: np.asarray(candidate_scores(freq, score)) <= qhat for name, freq in frequencies.items()}
