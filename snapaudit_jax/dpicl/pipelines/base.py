"""The shared base of the four DP-ICL pipelines (SnapAudit App. A) on a real language model: the audit case,
the canary's keywords and :class:`Pipeline`; one module per pipeline beside it (``pv``, ``poe``, ``esa``, ``ksa``),
as :mod:`snapaudit_jax.mechanisms` holds one per mechanism.

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
from snapaudit_jax.dpicl.pipelines import prompts as P
from snapaudit_jax.mechanisms import Mechanism
from snapaudit_jax.models.oracle import LLMOracle
from snapaudit_jax.utils.errors import InputError

__all__ = ["AuditCase", "Pipeline", "keywords_of", "make_case"]

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
