"""The four DP-ICL pipelines (SnapAudit App. A) running on a real language model.

Each pipeline splits the in-context exemplars into partitions (a fresh random
assignment per call), asks the model once per partition and aggregates the
answers into the *clean output* of the non-private counterpart ``M'``:

=========  ==========================================  ==============================  ==================
pipeline   per-partition answer                        clean output                    private release
=========  ==========================================  ==============================  ==================
PV         label: Yes/No, or copy reproduced/not        vote vector ``(2,)``            PrivateVoting
PoE        label log-probs clipped to ``[-Gamma, 0]``    utility sum ``(2,)``            ProductOfExperts
ESA        generated response, embedded                 mean embedding ``(d,)``         ESA (candidate pool)
KSA        generated response, split into keywords      keyword histogram ``(V,)``      JEM top-K
=========  ==========================================  ==============================  ==================

The release goes through the core engine's mechanisms, so the same pipeline
serves Phase A (clean snapshots for the active audit) and the passive
end-to-end audit. Answers come from an :class:`~snapaudit_jax.models.oracle.LLMOracle`,
which deduplicates prompts and counts every logical model call.
"""

from __future__ import annotations

import abc
import dataclasses
import re
from collections.abc import Sequence

import numpy as np

from snapaudit_jax.dpicl.data import AuditContext, DatasetSpec, Example, sample_audit_context
from snapaudit_jax.mechanisms.ksa import KeywordSpaceAggregation
from snapaudit_jax.mechanisms import EmbeddingSpaceAggregation, Mechanism, PrivateVoting, ProductOfExperts
from snapaudit_jax.dpicl.pipelines import prompts as P
from snapaudit_jax.models.oracle import LLMOracle
from snapaudit_jax.utils import validate
from snapaudit_jax.utils.errors import InputError

__all__ = ["AuditCase", "make_case", "Pipeline", "PrivateVotingPipeline", "ProductOfExpertsPipeline",
           "EmbeddingPipeline", "CandidatePool", "candidate_text", "KeywordPipeline", "PIPELINES", "keywords_of"]

_STOPWORDS = frozenset(
    "a an the and or of to in on at for with by from is are was were be been it its this that these those as "
    "i you he she we they me him her us them my your his our their not no yes so do does did have has had will "
    "would can could should may might must shall into about over under than then there here what which who whom "
    "how when where why also just only".split()
)


@dataclasses.dataclass(frozen=True)
class AuditCase:
    """One canary audit: two neighbouring contexts and the query about the canary.

    Attributes:
      spec: the dataset spec (label names for classification).
      mode: ``direct``, ``semantic`` or ``copy``.
      context: the neighbouring exemplar sets (``with_canary`` / ``without_canary``).
      query_text: the text the query shows (canary, paraphrase, or copy prefix).
      secret: copy mode: the canary's continuation (``""`` otherwise).
      decoy: copy mode: the replacement's continuation (``""`` otherwise).
    """

    spec: DatasetSpec
    mode: str
    context: AuditContext
    query_text: str
    secret: str = ""
    decoy: str = ""

    def exemplars(self, b: int) -> tuple[Example, ...]:
        """Context of hypothesis ``b``.

        Args:
          b: 1: with the canary (C1); 0: with the replacement (C0).

        Returns:
          The ``k`` exemplars in prompt order.
        """
        return self.context.with_canary if b else self.context.without_canary


def _secret_pair(rng: np.random.Generator) -> tuple[str, str]:
    words = rng.choice(len(P.SECRET_WORDS), size=4, replace=False)
    digits = rng.choice(9000, size=2, replace=False) + 1000
    return (f"{P.SECRET_WORDS[words[0]]} {P.SECRET_WORDS[words[1]]} {digits[0]}",
            f"{P.SECRET_WORDS[words[2]]} {P.SECRET_WORDS[words[3]]} {digits[1]}")


def make_case(
    examples: Sequence[Example],
    spec: DatasetSpec,
    *,
    mode: str,
    num_exemplars: int,
    seed: int,
    oracle: LLMOracle | None = None,
    signals: tuple[str, str] | None = None,
) -> AuditCase:
    """Samples a canary and its neighbouring contexts for one query mode.

    ``copy`` mode appends ``"Reference code: <secret>."`` to a sampled example to make the canary and
    ``"... <decoy>."`` to make the replacement (same prefix); ``signals`` overrides the pair (ESA's signal
    sentences). ``semantic`` mode paraphrases the canary with the model (greedy, once).

    Args:
      examples: the pool (:func:`~snapaudit_jax.dpicl.data.load_examples`).
      spec: its dataset spec.
      mode: ``direct``, ``semantic`` or ``copy``.
      num_exemplars: context size ``k``.
      seed: seed of the context (:func:`~snapaudit_jax.dpicl.data.sample_audit_context`) and of the secret pair.
      oracle: the model, needed for ``semantic`` mode.
      signals: copy mode: ``(secret, decoy)`` to use instead of drawn codes.

    Returns:
      The :class:`AuditCase`.

    Raises:
      InputError: an unknown mode, ``semantic`` without ``oracle``, or too few distinct examples / an invalid
        ``num_exemplars`` or ``seed``.
    """
    if mode not in P.QUERY_MODES:
        raise InputError(f"query mode must be one of {', '.join(P.QUERY_MODES)}, got {mode!r}")
    ctx = sample_audit_context(examples, num_exemplars=num_exemplars, seed=seed)
    if mode == "copy":
        secret, decoy = signals if signals is not None else _secret_pair(np.random.default_rng([seed, 7]))
        base = ctx.canary

        def with_code(code, suffix):
            return dataclasses.replace(base, text=f"{base.text} {P.SECRET_LEAD} {code}.", id=f"{base.id}-{suffix}")

        ctx = AuditContext(with_code(secret, "canary"), with_code(decoy, "decoy"), ctx.exemplars, ctx.position)
        return AuditCase(spec, mode, ctx, f"{base.text} {P.SECRET_LEAD}", secret, decoy)
    if mode == "semantic":
        if oracle is None:
            raise InputError("semantic mode needs a model to paraphrase the canary")
        text = oracle.generate([oracle.lm.chat_prompt(P.paraphrase_instruction(ctx.canary.text))], 64)[0].strip()
        return AuditCase(spec, mode, ctx, text.splitlines()[0] if text else ctx.canary.text)
    return AuditCase(spec, mode, ctx, ctx.canary.text)


def keywords_of(text: str, keep: frozenset[str] | set[str] = frozenset()) -> set[str]:
    """Keywords of one response: lower-case words of letters/digits, stopwords removed except those in ``keep``.

    Args:
      text: the response.
      keep: words counted although they are stopwords: KSA's answer words "yes" / "no" under ``direct`` and
        ``semantic`` queries (else the target answer "yes" is never counted and the audit is blind).

    Returns:
      The set of keywords.
    """
    return {w for w in re.findall(r"[a-z0-9]+", text.lower()) if w not in _STOPWORDS or w in keep}


class Pipeline(abc.ABC):
    """A DP-ICL pipeline on an audit case: partitions, per-partition model answers, clean outputs, the DP release.

    Args:
      oracle: the model calls.
      case: the audit case.
      partitions: number of partitions ``T``, in ``[1, k]`` (PoE: one expert per exemplar).
      defense: ``none``, ``basic``, ``strict`` or ``contextleak``.

    Attributes:
      name: the pipeline's registry name (``pv``, ``poe``, ``esa``, ``ksa``).
      max_new_tokens: tokens generated per answer where the pipeline generates text.
      oracle: the model calls.
      case: the audit case.
      partitions: ``T``.
      defense: the defense.
      target: index of the release that signals "canary present" (the attack's target).

    Raises:
      InputError: an unknown defense or ``partitions`` outside ``[1, k]``.
    """

    name: str = ""
    max_new_tokens: int = 32

    def __init__(self, oracle: LLMOracle, case: AuditCase, *, partitions: int, defense: str = "none"):
        """Checks and stores the settings.

        Args:
          oracle: see :class:`Pipeline`.
          case: see :class:`Pipeline`.
          partitions: see :class:`Pipeline`.
          defense: see :class:`Pipeline`.

        Raises:
          InputError: an unknown defense or ``partitions`` outside ``[1, k]``.
        """
        if defense not in P.DEFENSES:
            raise InputError(f"defense must be one of {', '.join(P.DEFENSES)}, got {defense!r}")
        k = case.context.num_exemplars
        if not 1 <= partitions <= k:
            raise InputError(f"partitions must be in [1, {k}] (the number of exemplars), got {partitions}")
        self.oracle, self.case, self.partitions, self.defense = oracle, case, partitions, defense

    # --- prompts ---------------------------------------------------------------------------
    def _format(self, ex: Example) -> str:
        spec = self.case.spec
        label = spec.label_names[ex.label] if ex.label is not None and spec.label_names else None
        return P.format_exemplar(ex.text, label, ex.target)

    def _user(self, group: Sequence[Example], instruction: str) -> str:
        return P.context_block([self._format(e) for e in group]) + "\n\n" + instruction

    def _chat(self, user: str) -> str:
        return self.oracle.lm.chat_prompt(user, system=P.SYSTEM_PROMPTS[self.defense])

    def _yes_no(self, group) -> str:
        return self._chat(self._user(group, P.yes_no_instruction(self.case.mode, self.case.query_text)))

    def _copy(self, group) -> str:
        return self._chat(self._user(group, P.COPY_INSTRUCTION)) + self.case.query_text

    @property
    def query(self) -> str:
        """The user-visible query (for the ContextLeak filter)."""
        if self.case.mode == "copy":
            return f"{P.COPY_INSTRUCTION} {self.case.query_text}"
        return P.yes_no_instruction(self.case.mode, self.case.query_text)

    def _leaks(self, responses: Sequence[str]) -> np.ndarray:
        """ContextLeak L3: a second call per response; True where the filter flags a leak."""
        prompts = [self.oracle.lm.chat_prompt(P.leak_filter_instruction(self.query, r)) for r in responses]
        lp = self.oracle.label_logprobs(prompts, ["Yes", "No"])
        return lp[:, 0] > lp[:, 1]

    # --- partitions and clean outputs ---------------------------------------------------------
    def assign(self, exemplars: Sequence[Example], rng: np.random.Generator) -> list[tuple[Example, ...]]:
        """A random split into ``T`` partitions (sizes differ by at most 1), each in context order.

        Args:
          exemplars: the private exemplar set.
          rng: the generator of this call's assignment.

        Returns:
          The ``T`` partitions, each a tuple of exemplars.
        """
        order = rng.permutation(len(exemplars))
        return [tuple(exemplars[i] for i in sorted(part)) for part in np.array_split(order, self.partitions)]

    def exemplars(self, b: int) -> tuple[Example, ...]:
        """The private exemplar set of hypothesis ``b`` (default: the case's replace-one pair).

        Args:
          b: 1: with the canary; 0: without.

        Returns:
          The exemplars in context order.
        """
        return self.case.exemplars(b)

    @abc.abstractmethod
    def answers(self, groups: Sequence[tuple[Example, ...]]) -> list:
        """Per-partition answers for many partitions (batched model calls through the oracle).

        Args:
          groups: the partitions, each a tuple of exemplars.

        Returns:
          One answer per group, in order; the type is the pipeline's (a vote, log-probs, an embedding, a keyword set).
        """

    @abc.abstractmethod
    def aggregate(self, answers: Sequence) -> np.ndarray:
        """The clean output of one call of ``M'`` from its partitions' answers.

        Args:
          answers: the answers of the call's partitions (from :meth:`answers`).

        Returns:
          The clean output (PV, PoE: ``(2,)``; ESA: ``(d,)``; KSA: the keyword sets, counted by
          :meth:`KeywordPipeline.histograms`).
        """

    @property
    def calls_per_clean(self) -> int:
        """Model calls of one clean output (partitions, plus filter calls under ContextLeak)."""
        return self.partitions * (2 if self.defense == "contextleak" else 1)

    def calls_per_clean_of(self, b: int) -> int:
        """Model calls of one clean output of hypothesis ``b`` (its context may have one partition fewer).

        Args:
          b: 1: with the canary; 0: without.

        Returns:
          The number of partitions of ``b``'s context, doubled under ContextLeak (one filter call each).
        """
        groups = len(self.assign(self.exemplars(b), np.random.default_rng(0)))
        return groups * (2 if self.defense == "contextleak" else 1)

    def clean_calls(self, b: int, n: int, seed: int) -> list:
        """The aggregates of ``n`` calls of ``M'`` under hypothesis ``b``, each with its own partition assignment.

        Call ``i`` draws its assignment from ``default_rng([seed, i])`` under *both* hypotheses: call ``i`` of C1 and
        of C0 split the exemplars the same way, the canary taking the replacement's place, so their clean outputs are
        neighbouring. A call's answer does not depend on ``n``.

        Args:
          b: 1: with the canary; 0: without.
          n: number of calls.
          seed: the assignment seed.

        Returns:
          ``n`` aggregates (:meth:`aggregate`), in call order.
        """
        exemplars = self.exemplars(b)
        calls = [self.assign(exemplars, np.random.default_rng([seed, i])) for i in range(n)]
        answers = self.answers([g for call in calls for g in call])
        out, pos = [], 0
        for call in calls:
            out.append(self.aggregate(answers[pos:pos + len(call)]))
            pos += len(call)
        return out

    def clean_outputs(self, b: int, n: int, seed: int) -> np.ndarray:
        """The clean outputs of hypothesis ``b`` as one array (see :meth:`clean_calls`).

        Args:
          b: 1: with the canary; 0: without.
          n: number of calls.
          seed: the assignment seed.

        Returns:
          ``(n, ...)`` stacked clean outputs.
        """
        return np.stack(self.clean_calls(b, n, seed))

    # --- the private release ----------------------------------------------------------------------
    target: int = 0

    @abc.abstractmethod
    def mechanism(self, epsilon: float, delta: float, calibration: str = "analytic") -> Mechanism:
        """The calibrated DP aggregation of the clean output (the private release).

        Args:
          epsilon: the per-query ``epsilon`` to calibrate for.
          delta: the per-query ``delta`` (unused by the pure-DP pipelines PoE and KSA).
          calibration: Gaussian calibration, ``"analytic"`` or ``"classical"`` (PV, ESA).

        Returns:
          The :class:`~snapaudit_jax.mechanisms.Mechanism`.
        """

    @property
    @abc.abstractmethod
    def sensitivity(self) -> float:
        """The sensitivity of the clean output under replace-one that the mechanism is calibrated for."""


class PrivateVotingPipeline(Pipeline):
    """PV (Wu et al. 2023): each partition votes; Gaussian noise on the vote counts.

    Vote 0 is "Yes" (direct/semantic) or "the model reproduced the canary's secret" (copy); vote 1 the opposite.
    ContextLeak withholds flagged answers, which then count as a vote 1. Constructor arguments: see
    :class:`Pipeline`.
    """

    name = "pv"

    def answers(self, groups):
        """One bool per partition, ``True``: vote 0 (greedy copy of the secret, or ``log P(Yes) > log P(No)``).

        See :meth:`Pipeline.answers`.
        """
        case = self.case
        if case.mode == "copy":
            prompts = [self._copy(g) for g in groups]
            if self.defense == "contextleak":
                texts = self.oracle.generate(prompts, 16)
                votes = np.array([t.strip().startswith(case.secret) for t in texts])
                return list(votes & ~self._leaks([case.query_text + t for t in texts]))
            return list(self.oracle.continues_with(prompts, [" " + case.secret] * len(prompts)))
        lp = self.oracle.label_logprobs([self._yes_no(g) for g in groups], ["Yes", "No"])
        votes = lp[:, 0] > lp[:, 1]
        if self.defense == "contextleak":
            votes &= ~self._leaks(["Yes" if v else "No" for v in votes])
        return list(votes)

    def aggregate(self, answers):
        """The vote vector ``(2,)`` float64 ``[votes 0, votes 1]``. See :meth:`Pipeline.aggregate`."""
        yes = int(np.sum(answers))
        return np.array([yes, len(answers) - yes], np.float64)

    @property
    def sensitivity(self) -> float:
        """``sqrt(2)``: replacing one exemplar moves at most one vote from one count to the other (L2)."""
        return float(np.sqrt(2.0))

    def mechanism(self, epsilon, delta, calibration="analytic"):
        """:class:`~snapaudit_jax.mechanisms.PrivateVoting`: Gaussian noise on the votes.

        ``sigma`` is calibrated to ``(epsilon, delta)`` at L2 sensitivity ``sqrt(2)``.

        See :meth:`Pipeline.mechanism`.
        """
        return PrivateVoting.calibrated(epsilon, delta, self.sensitivity, calibration)


class ProductOfExpertsPipeline(Pipeline):
    """PoE (Romijnders et al. 2026): one expert per exemplar; clipped label log-probs summed.

    Labels are Yes/No (direct/semantic) or the canary's secret vs the decoy as continuations (copy). ContextLeak
    replaces a flagged expert's log-probs by ``-Gamma`` for every label.

    Args:
      oracle: the model calls.
      case: the audit case (``T`` is its number of exemplars).
      clip: ``Gamma > 0``: each expert's log-probs are clipped to ``[-Gamma, 0]``.
      defense: see :class:`Pipeline`.

    Attributes:
      clip: ``Gamma``.

    Raises:
      InputError: ``clip <= 0`` or an unknown defense.
    """

    name = "poe"

    def __init__(self, oracle, case, *, clip: float = 5.0, defense: str = "none"):
        """Checks and stores the settings, one partition per exemplar.

        Args:
          oracle: see :class:`ProductOfExpertsPipeline`.
          case: see :class:`ProductOfExpertsPipeline`.
          clip: see :class:`ProductOfExpertsPipeline`.
          defense: see :class:`ProductOfExpertsPipeline`.

        Raises:
          InputError: ``clip <= 0`` or an unknown defense.
        """
        super().__init__(oracle, case, partitions=case.context.num_exemplars, defense=defense)
        if not clip > 0:
            raise InputError(f"clip must be > 0, got {clip}")
        self.clip = float(clip)

    def assign(self, exemplars, rng):
        """One expert per exemplar, in order; ``rng`` is unused. See :meth:`Pipeline.assign`."""
        return [(e,) for e in exemplars]  # per-example experts: no randomness

    @property
    def labels(self) -> list[str]:
        """The two labels scored: ``["Yes", "No"]``, or (copy) the secret and the decoy with a leading space."""
        if self.case.mode == "copy":
            return [" " + self.case.secret, " " + self.case.decoy]
        return ["Yes", "No"]

    def answers(self, groups):
        """One ``(2,)`` array of clipped label log-probs per expert. See :meth:`Pipeline.answers`."""
        prompts = [self._copy(g) if self.case.mode == "copy" else self._yes_no(g) for g in groups]
        lp = np.clip(self.oracle.label_logprobs(prompts, self.labels), -self.clip, 0.0)
        if self.defense == "contextleak":
            texts = [self.labels[int(i)].strip() for i in np.argmax(lp, axis=1)]
            lp[self._leaks(texts)] = -self.clip
        return list(lp)

    def aggregate(self, answers):
        """The utility ``(2,)``: the experts' clipped log-probs summed. See :meth:`Pipeline.aggregate`."""
        return np.sum(answers, axis=0)

    @property
    def sensitivity(self) -> float:
        """``Gamma``: replacing one exemplar changes one expert, each utility by at most the clip."""
        return self.clip

    def mechanism(self, epsilon, delta, calibration="analytic"):
        """:class:`~snapaudit_jax.mechanisms.ProductOfExperts`: the exponential mechanism.

        Pure ``epsilon``-DP per query at sensitivity ``Gamma`` (``delta`` and ``calibration`` unused).

        See :meth:`Pipeline.mechanism`.
        """
        return ProductOfExperts.calibrated(epsilon, self.clip)


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


class EmbeddingPipeline(Pipeline):
    """ESA (Wu et al. 2023; SnapAudit Alg. 5): the partitions' answers embedded and averaged, with Gaussian noise.

    The release is the candidate nearest to the noisy mean embedding.

    Copy mode makes the signal sentences ``y1`` (canary present) and ``y2`` the canary's and the replacement's
    continuation, so the model answers by copying; direct/semantic modes ask the model to reply with ``y1`` or
    ``y2`` (App. D.2). The candidates are a :class:`CandidatePool`: the fixed pool ``(y1, y2)`` (default here) or
    one drawn by the constrained 0-shot candidate stage (:meth:`draw_pool`, App. D.2), set as :attr:`pool` before
    any snapshot is taken.

    Args:
      oracle: the model calls (with a sentence embedder).
      case: the audit case.
      signals: ``(y1, y2)``.
      partitions: ``T`` (default 1).
      defense: see :class:`Pipeline`.
      pool: the candidate pool (``None``: the fixed pool of ``signals``).

    Attributes:
      signals: ``(y1, y2)``.
      pool: the candidate pool the release chooses from.

    Raises:
      InputError: as :class:`Pipeline`.

    Guarantees:
      The candidate stage's prompt holds the query's signals and a pseudo-seed, never the private examples, so
      the pool is independent of the private context: for every fixed pool the release is post-processing of the
      Gaussian mean, and ESA's claim holds conditionally on the pool. An audit with the pool drawn once and held
      fixed (treated as public) therefore tests the claim; a violation with one pool is a violation of the claim.

    References:
      SnapAudit (Alg. 5; App. D.2 for the constrained candidate stage).
    """

    name = "esa"
    max_new_tokens = 48

    def __init__(self, oracle, case, *, signals: tuple[str, str], partitions: int = 1, defense: str = "none",
                 pool: CandidatePool | None = None):
        """Checks and stores the settings.

        Args:
          oracle: see :class:`EmbeddingPipeline`.
          case: see :class:`EmbeddingPipeline`.
          signals: see :class:`EmbeddingPipeline`.
          partitions: see :class:`EmbeddingPipeline`.
          defense: see :class:`EmbeddingPipeline`.
          pool: see :class:`EmbeddingPipeline`.
        """
        super().__init__(oracle, case, partitions=partitions, defense=defense)
        self.signals = tuple(signals)
        self.pool = CandidatePool.fixed(self.signals) if pool is None else pool
        self._embedded: dict[tuple[str, ...], np.ndarray] = {}

    def embed_texts(self, texts: Sequence[str]) -> np.ndarray:
        """Embeddings of candidate texts with the oracle's embedder (kept per text tuple).

        Args:
          texts: the texts.

        Returns:
          ``(c, d)`` float32 unit-norm embeddings.
        """
        texts = tuple(texts)
        if texts not in self._embedded:
            self._embedded[texts] = self.oracle.embed(list(texts))
        return self._embedded[texts]

    @property
    def candidates(self) -> np.ndarray:
        """Embeddings ``(c, d)`` of :attr:`pool`'s texts, in release-index order."""
        return self.embed_texts(self.pool.texts)

    @property
    def signal_embeddings(self) -> np.ndarray:
        """Embeddings ``(2, d)`` of ``(y1, y2)`` (the passive white-box attack's direction)."""
        return self.embed_texts(self.signals)

    @property
    def target(self) -> int | None:
        """Index of ``y1`` in the pool; ``None`` where the pool lacks it (the audit's default rule applies)."""
        return self.pool.target

    def _prompt(self, group):
        if self.case.mode == "copy":
            return self._copy(group)
        y1, y2 = self.signals
        return self._chat(self._user(group, P.esa_generator_instruction(self.case.query_text, self.case.mode, y1, y2)))

    def answers(self, groups):
        """One ``(d,)`` embedding per partition: of its answer's first line, trailing '.' dropped.

        Empty or flagged answers are replaced by the withheld text. See :meth:`Pipeline.answers`.
        """
        texts = self.oracle.generate([self._prompt(g) for g in groups], self.max_new_tokens)
        texts = [t.strip().splitlines()[0] if t.strip() else "" for t in texts]
        if self.defense == "contextleak":
            flagged = self._leaks(texts)
            texts = [P.WITHHELD if f else t for t, f in zip(texts, flagged)]
        texts = [t.rstrip(".") if t else P.WITHHELD for t in texts]
        return list(self.oracle.embed(texts))

    def aggregate(self, answers):
        """The mean embedding ``(d,)``. See :meth:`Pipeline.aggregate`."""
        return np.mean(answers, axis=0)

    @property
    def sensitivity(self) -> float:
        """``2 / T``: replacing one exemplar changes one of the ``T`` unit-norm embeddings averaged (L2)."""
        return 2.0 / self.partitions

    def mechanism(self, epsilon, delta, calibration="analytic"):
        """:class:`~snapaudit_jax.mechanisms.EmbeddingSpaceAggregation` over :attr:`candidates`.

        Gaussian ``sigma`` for ``(epsilon, delta)`` at L2 sensitivity ``2 / T``.

        See :meth:`Pipeline.mechanism`.
        """
        return EmbeddingSpaceAggregation.calibrated(epsilon, delta, self.candidates, partitions=self.partitions,
                                                    calibration=calibration)

    # --- the 0-shot candidate stage (SnapAudit Alg. 5 line 8, constrained as in App. D.2) ---------------------
    def candidate_prompts(self, calls: int, seed) -> list[str]:
        """``calls`` prompts of the constrained 0-shot candidate stage: no exemplar, only the signals.

        Each prompt carries a pseudo-seed (greedy decoding is deterministic; the number varies the answer and the
        order the signals are listed in). The pseudo-seeds are
        ``numpy.random.default_rng([*seed, 11]).integers(0, 10**6, calls)``.

        Args:
          calls: number of prompts, ``>= 1``.
          seed: an int or a sequence of ints.

        Returns:
          The chat prompts.

        Raises:
          InputError: ``calls`` is not an integer ``>= 1``.
        """
        calls = validate.positive_int("calls", calls)
        y1, y2 = self.signals
        rng = np.random.default_rng([*(int(s) for s in np.atleast_1d(seed)), 11])
        return [self.oracle.lm.chat_prompt(P.esa_candidate_instruction(y1, y2, int(s)))
                for s in rng.integers(0, 10**6, calls)]

    def draw_pools(self, calls: int, seeds: Sequence) -> list[CandidatePool]:
        """One candidate stage of ``calls`` model calls per seed (batched): ``len(seeds) * calls`` calls.

        Args:
          calls: ``T_cand >= 1``.
          seeds: one seed per pool (see :meth:`candidate_prompts`).

        Returns:
          One ``"sampled"`` :class:`CandidatePool` per seed.

        Raises:
          InputError: ``calls`` is not an integer ``>= 1``.
        """
        prompts = [self.candidate_prompts(calls, s) for s in seeds]
        outputs = self.oracle.generate([p for ps in prompts for p in ps], self.max_new_tokens)
        return [CandidatePool.from_draws(self.signals, [candidate_text(o, self.signals)
                                                         for o in outputs[i * calls:(i + 1) * calls]], s)
                for i, s in enumerate(seeds)]

    def draw_pool(self, calls: int, seed) -> CandidatePool:
        """The pool of one candidate stage of ``calls`` model calls.

        Args:
          calls: ``T_cand >= 1``.
          seed: the pseudo-seed stream's seed (see :meth:`candidate_prompts`).

        Returns:
          The ``"sampled"`` :class:`CandidatePool`.

        Raises:
          InputError: ``calls`` is not an integer ``>= 1``.
        """
        return self.draw_pools(calls, [seed])[0]

    def candidate_coverage(self, calls: int, seed: int) -> dict:
        """Runs the 0-shot candidate stage ``calls`` times; how often each signal comes back (a diagnostic).

        Args:
          calls: ``T_cand >= 1``.
          seed: the pseudo-seed stream's seed.

        Returns:
          ``{"calls", "y1", "y2", "other"}``.
        """
        return {"calls": calls, **self.draw_pool(calls, seed).counts()}


class KeywordPipeline(Pipeline):
    """KSA (Wu et al. 2023): keyword histogram of the partitions' answers; JEM top-K.

    Every answer contributes each of its keywords once, so replacing one exemplar moves every count by at most 1
    in either direction (utility sensitivity 2). The keyword domain is fixed after Phase A from the answers under
    both hypotheses (:meth:`histograms`). The target keyword is "yes" (direct/semantic) or the first word of the
    canary's secret (copy).

    Args:
      oracle: the model calls.
      case: the audit case.
      partitions: ``T`` (default 8).
      top_k: ``K``, keywords released.
      defense: see :class:`Pipeline`.
      neighbouring: ``"replace_one"`` (the case's contexts) or ``"add_remove"`` (the context without the canary
        drops it; needs ``partitions = k``).

    Attributes:
      top_k: ``K``.
      neighbouring: the neighbouring relation.
      vocabulary: the keyword domain, ``None`` until :meth:`histograms` fixes it.

    Raises:
      InputError: an unknown ``neighbouring``, ``add_remove`` with ``partitions != k``, or as :class:`Pipeline`.
    """

    name = "ksa"

    NEIGHBOURING = ("replace_one", "add_remove")

    def __init__(self, oracle, case, *, partitions: int = 8, top_k: int = 4, defense: str = "none",
                 neighbouring: str = "replace_one"):
        """Checks and stores the settings.

        Args:
          oracle: see :class:`KeywordPipeline`.
          case: see :class:`KeywordPipeline`.
          partitions: see :class:`KeywordPipeline`.
          top_k: see :class:`KeywordPipeline`.
          defense: see :class:`KeywordPipeline`.
          neighbouring: see :class:`KeywordPipeline`.

        Raises:
          InputError: see :class:`KeywordPipeline`.
        """
        super().__init__(oracle, case, partitions=partitions, defense=defense)
        if neighbouring not in self.NEIGHBOURING:
            raise InputError(f"neighbouring must be one of {', '.join(self.NEIGHBOURING)}, got {neighbouring!r}")
        k = case.context.num_exemplars
        if neighbouring == "add_remove" and partitions != k:
            raise InputError(f"neighbouring='add_remove' needs one exemplar per partition (partitions = "
                             f"num_exemplars = {k}): only then does adding an exemplar add one whole keyword set "
                             f"(every count moves by 0 or +1, Delta_u = 1); got partitions={partitions}")
        self.top_k = int(top_k)
        self.neighbouring = neighbouring
        self.vocabulary: tuple[str, ...] | None = None

    def exemplars(self, b: int) -> tuple[Example, ...]:
        """Hypothesis ``b``'s exemplars; under ``add_remove`` C0 drops the canary instead of replacing it.

        C0 then has ``k - 1`` exemplars. See :meth:`Pipeline.exemplars`.
        """
        if self.neighbouring == "add_remove" and not b:
            ctx = self.case.context
            return tuple(e for i, e in enumerate(ctx.without_canary) if i != ctx.position)
        return self.case.exemplars(b)

    def assign(self, exemplars, rng):
        """Under ``add_remove`` one partition per exemplar (``rng`` unused). See :meth:`Pipeline.assign`."""
        if self.neighbouring == "add_remove":
            return [(e,) for e in exemplars]  # one partition per exemplar: no randomness
        return super().assign(exemplars, rng)

    @property
    def target_keyword(self) -> str:
        """The keyword signalling "canary present": the first word of the secret (copy) or ``"yes"``."""
        return self.case.secret.split()[0] if self.case.mode == "copy" else "yes"

    @property
    def answer_keywords(self) -> frozenset[str]:
        """Words counted even if they are stopwords: the answers the audit distinguishes."""
        return frozenset({self.target_keyword} if self.case.mode == "copy" else {"yes", "no"})

    @property
    def target(self) -> int:
        """Index of :attr:`target_keyword` in :attr:`vocabulary`.

        Raises:
          InputError: the vocabulary is not fixed yet (:meth:`histograms`).
        """
        if self.vocabulary is None:
            raise InputError("the keyword vocabulary is fixed by histograms(); call it first")
        return self.vocabulary.index(self.target_keyword)

    def _prompt(self, group):
        return self._copy(group) if self.case.mode == "copy" else self._yes_no(group)

    def answers(self, groups):
        """One ``frozenset`` of keywords per partition (:func:`keywords_of`; flagged answers: the withheld text).

        See :meth:`Pipeline.answers`.
        """
        texts = self.oracle.generate([self._prompt(g) for g in groups], self.max_new_tokens)
        if self.defense == "contextleak":
            flagged = self._leaks(texts)
            texts = [P.WITHHELD if f else t for t, f in zip(texts, flagged)]
        return [frozenset(keywords_of(t, self.answer_keywords)) for t in texts]

    def aggregate(self, answers):
        """The tuple of the partitions' keyword sets (counted by :meth:`histograms`). See :meth:`Pipeline.aggregate`."""
        return tuple(answers)  # the partitions' keyword sets, counted by histograms()

    def clean_outputs(self, b, n, seed):
        """Not available for KSA: use :meth:`clean_calls` and :meth:`histograms`. See :meth:`Pipeline.clean_outputs`.

        Raises:
          NotImplementedError: always (histograms need the vocabulary of both hypotheses).
        """
        raise NotImplementedError("KSA clean outputs are histograms over a shared vocabulary: use histograms()")

    def histograms(self, sets_with: Sequence, sets_without: Sequence) -> tuple[np.ndarray, np.ndarray]:
        """Counts over a vocabulary fixed from both hypotheses' answers (sets :attr:`vocabulary`).

        Args:
          sets_with: ``n`` aggregates (:meth:`clean_calls`) with the canary.
          sets_without: ``n'`` aggregates without it.

        Returns:
          ``(counts_with, counts_without)``: ``(n, V)`` and ``(n', V)`` float64 keyword counts; the vocabulary is the
          sorted union of their keywords and :attr:`target_keyword`.
        """
        vocab = sorted({w for call in list(sets_with) + list(sets_without) for s in call for w in s}
                       | {self.target_keyword})
        self.vocabulary = tuple(vocab)
        return self.count(sets_with), self.count(sets_without)

    def count(self, calls: Sequence) -> np.ndarray:
        """Keyword counts of calls over the fixed vocabulary (words outside it are not counted).

        Args:
          calls: aggregates (:meth:`clean_calls`), each a tuple of keyword sets.

        Returns:
          ``(n, V)`` float64 counts.

        Raises:
          InputError: the vocabulary is not fixed yet (:meth:`histograms`).
        """
        if self.vocabulary is None:
            raise InputError("the keyword vocabulary is fixed by histograms(); call it first")
        index = {w: i for i, w in enumerate(self.vocabulary)}
        out = np.zeros((len(calls), len(index)))
        for r, call in enumerate(calls):
            for keywords in call:
                for w in keywords:
                    if w in index:
                        out[r, index[w]] += 1
        return out

    @property
    def sensitivity(self) -> float:
        """Sensitivity ``Delta_u`` of JEM's utility ``u(s) = -max_i (c_(i) - c[s_i])`` over the histogram.

        ``replace_one`` (the case's neighbouring contexts: the canary replaces one exemplar), and equally
        add/remove of an exemplar that shares a partition: one partition's keyword set changes, so every count
        moves by -1, 0 or +1, ``c_(i)`` and ``c[s_i]`` by up to 1 each in opposite directions: ``Delta_u = 2``.
        ``add_remove`` with one exemplar per partition: adding the exemplar adds one whole keyword set, every
        count moves by 0 or +1 in the same direction, the difference by at most 1: ``Delta_u = 1``
        (Gillenwater et al. 2022). Both bounds are attained (tested by brute force).
        """
        return 1.0 if self.neighbouring == "add_remove" else 2.0

    def mechanism(self, epsilon, delta, calibration="analytic"):
        """:class:`~snapaudit_jax.mechanisms.ksa.KeywordSpaceAggregation`: JEM top-``min(K, V)``.

        Pure ``epsilon``-DP at utility sensitivity :attr:`sensitivity` (``delta`` and ``calibration`` unused).

        See :meth:`Pipeline.mechanism`.
        """
        k = min(self.top_k, len(self.vocabulary) if self.vocabulary else self.top_k)
        return KeywordSpaceAggregation.calibrated(epsilon, k, self.sensitivity)

    def reconstruction_prompts(self, keyword_ids: np.ndarray) -> list[str]:
        """Final answers of KSA from the selected keywords (for the end-to-end passive audit).

        Args:
          keyword_ids: ``(n, K)`` int indices into :attr:`vocabulary`, one row per release.

        Returns:
          One chat prompt per row.
        """
        return [
            self.oracle.lm.chat_prompt(P.ksa_reconstruction_instruction(self.query, [self.vocabulary[i] for i in row]))
            for row in np.asarray(keyword_ids)
        ]


PIPELINES = {"pv": PrivateVotingPipeline, "poe": ProductOfExpertsPipeline, "esa": EmbeddingPipeline,
             "ksa": KeywordPipeline}
