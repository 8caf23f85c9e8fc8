"""The candidate pool of the generation pipelines: the answers ESA chooses among, and how a raw output becomes one."""

from __future__ import annotations

import dataclasses
import re

import numpy as np

from snapaudit_jax.utils.errors import InputError

__all__ = ["CandidatePool", "candidate_text"]


_OPTION_NUMBER = re.compile(r"^[12][.)]\s+")


def _first_line(text: str) -> str:
    """Stripped, the first line, without trailing '.' (how ESA's answers are read)."""
    t = text.strip()
    return (t.splitlines()[0].strip() if t else "").rstrip(".").rstrip()


def candidate_text(output: str, signals: tuple[str, str]) -> str:
    """One answer of ESA's 0-shot candidate stage as a candidate text.

    The answer is read as the generator's answers are (stripped, first line, trailing '.' dropped); the option
    number ``"1. "`` / ``"2. "`` under which :func:`~snapaudit_jax.dpicl.pipelines.prompts.esa_candidate_instruction`
    lists the signals is dropped too. An answer that then equals a signal is that signal, as given (so its embedding
    is the fixed pool's); any other answer is kept as its own text (an off-signal candidate).

    Args:
      output: the generated answer.
      signals: ``(y1, y2)``.

    Returns:
      The candidate text.
    """
    line = _first_line(output)
    bare = _OPTION_NUMBER.sub("", line, count=1).rstrip(".").rstrip()
    for option in (line, bare):
        for y in signals:
            if option == _first_line(y):
                return y
    return bare


@dataclasses.dataclass(frozen=True)
class CandidatePool:
    """ESA's candidate pool: the texts its release chooses from, and how they were drawn.

    Attributes:
      texts: the distinct candidates in release-index order: ``y1`` (if drawn), ``y2`` (if drawn), then the
        other answers in order of first appearance. A pool whose draws are only signals, both present, is
        the fixed pool ``(y1, y2)`` exactly.
      signals: ``(y1, y2)``.
      source: ``"fixed"`` (``texts = (y1, y2)``, no model call) or ``"sampled"`` (SnapAudit Alg. 5 line 8).
      draws: ``"sampled"``: the ``T_cand`` answers as candidate texts (:func:`candidate_text`), in draw order.
      seed: ``"sampled"``: the seed of the pseudo-seed stream (:meth:`EmbeddingPipeline.candidate_prompts`).

    Guarantees:
      Releasing the nearest of the ``T_cand`` draws (duplicates included) and the nearest of the distinct
      ``texts`` give the same text: equal texts have equal embeddings, hence equal distances.
    """

    texts: tuple[str, ...]
    signals: tuple[str, str]
    source: str = "fixed"
    draws: tuple[str, ...] = ()
    seed: tuple[int, ...] | None = None

    @classmethod
    def fixed(cls, signals: tuple[str, str]) -> CandidatePool:
        """The pool ``(y1, y2)`` of the two signal sentences (no candidate stage).

        Args:
          signals: ``(y1, y2)``.

        Returns:
          The fixed :class:`CandidatePool`.
        """
        return cls(tuple(signals), tuple(signals))

    @classmethod
    def from_draws(cls, signals: tuple[str, str], draws, seed) -> CandidatePool:
        """The pool of a candidate stage's answers.

        Args:
          signals: ``(y1, y2)``.
          draws: the ``T_cand`` answers, already :func:`candidate_text`.
          seed: the pseudo-seed stream's seed (an int or a sequence of ints).

        Returns:
          A ``"sampled"`` :class:`CandidatePool` (texts: ``y1``, ``y2`` if drawn, then the other answers in order of
          first appearance).

        Raises:
          InputError: no draws.
        """
        draws = tuple(draws)
        if not draws:
            raise InputError("a sampled candidate pool needs at least one draw, got 0")
        signals = tuple(signals)
        others = list(dict.fromkeys(d for d in draws if d not in signals))
        texts = tuple(y for y in signals if y in draws) + tuple(others)
        return cls(texts, signals, "sampled", draws, tuple(int(s) for s in np.atleast_1d(seed)))

    @property
    def calls(self) -> int:
        """Model calls of the candidate stage (``T_cand``; 0 for the fixed pool)."""
        return len(self.draws)

    @property
    def target(self) -> int | None:
        """Index of ``y1`` (the release signalling "canary present"); ``None`` if the pool lacks it."""
        return self.texts.index(self.signals[0]) if self.signals[0] in self.texts else None

    def counts(self) -> dict:
        """How many draws were ``y1``, ``y2`` or another text (the fixed pool: one each, no draw).

        Returns:
          ``{"y1", "y2", "other"}`` counts.
        """
        if self.source == "fixed":
            return {"y1": 1, "y2": 1, "other": 0}
        y1 = sum(d == self.signals[0] for d in self.draws)
        y2 = sum(d == self.signals[1] for d in self.draws)
        return {"y1": y1, "y2": y2, "other": len(self.draws) - y1 - y2}

    def problems(self) -> list[str]:
        """What the pool lacks for a black-box audit, in plain words.

        Returns:
          The problems (empty: both signals present and more than one candidate).
        """
        out = []
        if self.target is None:
            out.append("the candidate pool lacks y1 (the signal of 'canary present'), so no release signals the "
                       "canary: the black-box attack has no signal; its target is the candidate chosen by the "
                       "default rule (the one the canary's clean output moves towards)")
        if len(self.texts) == 1:
            out.append("the candidate pool has a single candidate, so every release is the same text and the "
                       "black-box attack cannot tell the contexts apart")
        elif self.signals[1] not in self.texts and self.target is not None:
            out.append("the candidate pool lacks y2: releases other than y1 are off-signal texts")
        return out

    def to_dict(self) -> dict:
        """The pool as a JSON-able dictionary.

        Returns:
          ``source``, ``texts``, ``calls``, ``draws``, ``seed``, the :meth:`counts`, ``target`` and ``problems``.
        """
        return {"source": self.source, "texts": list(self.texts), "calls": self.calls, "draws": list(self.draws),
                "seed": None if self.seed is None else list(self.seed), **self.counts(), "target": self.target,
                "problems": self.problems()}
