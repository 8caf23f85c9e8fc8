"""The four DP-ICL pipelines (SnapAudit App. A) running on a real language model.

Each pipeline splits the in-context exemplars into partitions (a fresh random
assignment per call), asks the model once per partition and aggregates the
answers into the *clean output* of the non-private counterpart ``M'``:

=========  ==========================================  ==============================  ==================
pipeline   per-partition answer                        clean output                    private release
=========  ==========================================  ==============================  ==================
PV         label: Yes/No, or copy reproduced/not        vote vector ``(2,)``            PrivateVoting
PoE        label log-probs clipped to ``[-Gamma, 0]``    utility sum ``(2,)``            ProductOfExperts
ESA        generated response, embedded                 mean embedding ``(d,)``         ESA (2 candidates)
KSA        generated response, split into keywords      keyword histogram ``(V,)``      JEM top-K
=========  ==========================================  ==============================  ==================

The release goes through the core engine's mechanisms, so the same pipeline
serves Phase A (clean snapshots for the active audit) and the passive
end-to-end audit. Answers come from an :class:`~snapaudit_jax.pipelines.oracle.LLMOracle`,
which deduplicates prompts and counts every logical model call.
"""

from __future__ import annotations

import abc
import dataclasses
import re
from collections.abc import Sequence

import numpy as np

from snapaudit_jax.data import AuditContext, DatasetSpec, Example, sample_audit_context
from snapaudit_jax.jem import KeywordSpaceAggregation
from snapaudit_jax.mechanisms import EmbeddingSpaceAggregation, Mechanism, PrivateVoting, ProductOfExperts
from snapaudit_jax.pipelines import prompts as P
from snapaudit_jax.pipelines.oracle import LLMOracle

__all__ = ["AuditCase", "make_case", "Pipeline", "PrivateVotingPipeline", "ProductOfExpertsPipeline",
           "EmbeddingPipeline", "KeywordPipeline", "PIPELINES", "keywords_of"]

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
      secret / decoy: copy mode: the canary's and the replacement's continuation.
    """

    spec: DatasetSpec
    mode: str
    context: AuditContext
    query_text: str
    secret: str = ""
    decoy: str = ""

    def exemplars(self, b: int) -> tuple[Example, ...]:
        """Context of hypothesis ``b`` (1: with the canary)."""
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

    ``copy`` mode appends ``"Reference code: <secret>."`` to a sampled
    example to make the canary and ``"... <decoy>."`` to make the replacement
    (same prefix); ``signals`` overrides the pair (ESA's signal sentences).
    ``semantic`` mode paraphrases the canary with the model (greedy, once).
    """
    if mode not in P.QUERY_MODES:
        raise ValueError(f"query mode must be one of {', '.join(P.QUERY_MODES)}, got {mode!r}")
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
            raise ValueError("semantic mode needs a model to paraphrase the canary")
        text = oracle.generate([oracle.lm.chat_prompt(P.paraphrase_instruction(ctx.canary.text))], 64)[0].strip()
        return AuditCase(spec, mode, ctx, text.splitlines()[0] if text else ctx.canary.text)
    return AuditCase(spec, mode, ctx, ctx.canary.text)


def keywords_of(text: str, keep: frozenset[str] | set[str] = frozenset()) -> set[str]:
    """Keywords of one response: lower-case words of letters/digits, stopwords removed except those in ``keep``.

    ``keep`` holds the words an audit counts although they are stopwords: KSA's answer words "yes" / "no"
    under ``direct`` and ``semantic`` queries (else the target answer "yes" is never counted and the audit
    is blind).
    """
    return {w for w in re.findall(r"[a-z0-9]+", text.lower()) if w not in _STOPWORDS or w in keep}


class Pipeline(abc.ABC):
    """A DP-ICL pipeline on an audit case.

    Args:
      oracle: the model calls.
      case: the audit case.
      partitions: number of partitions ``T`` (PoE: one expert per exemplar).
      defense: ``none``, ``basic``, ``strict`` or ``contextleak``.
    """

    name: str = ""
    max_new_tokens: int = 32

    def __init__(self, oracle: LLMOracle, case: AuditCase, *, partitions: int, defense: str = "none"):
        if defense not in P.DEFENSES:
            raise ValueError(f"defense must be one of {', '.join(P.DEFENSES)}, got {defense!r}")
        k = case.context.num_exemplars
        if not 1 <= partitions <= k:
            raise ValueError(f"partitions must be in [1, {k}] (the number of exemplars), got {partitions}")
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
        """A random split into ``T`` partitions (sizes differ by at most 1), each in context order."""
        order = rng.permutation(len(exemplars))
        return [tuple(exemplars[i] for i in sorted(part)) for part in np.array_split(order, self.partitions)]

    def exemplars(self, b: int) -> tuple[Example, ...]:
        """The private exemplar set of hypothesis ``b`` (1: with the canary; default: the case's replace-one pair)."""
        return self.case.exemplars(b)

    @abc.abstractmethod
    def answers(self, groups: Sequence[tuple[Example, ...]]) -> list:
        """Per-partition answers for many partitions (batched model calls)."""

    @abc.abstractmethod
    def aggregate(self, answers: Sequence) -> np.ndarray:
        """The clean output of one call from its partitions' answers."""

    @property
    def calls_per_clean(self) -> int:
        """Model calls of one clean output (partitions, plus filter calls under ContextLeak)."""
        return self.partitions * (2 if self.defense == "contextleak" else 1)

    def calls_per_clean_of(self, b: int) -> int:
        """Model calls of one clean output of hypothesis ``b`` (its context may have one partition fewer)."""
        groups = len(self.assign(self.exemplars(b), np.random.default_rng(0)))
        return groups * (2 if self.defense == "contextleak" else 1)

    def clean_calls(self, b: int, n: int, seed: int) -> list:
        """The aggregates of ``n`` calls of ``M'`` under hypothesis ``b``, each with its own partition assignment.

        Call ``i`` draws its assignment from ``default_rng([seed, i])`` under
        *both* hypotheses: call ``i`` of C1 and of C0 split the exemplars the
        same way, the canary taking the replacement's place, so their clean
        outputs are neighbouring. A call's answer does not depend on ``n``.
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
        """``(n, ...)`` clean outputs of hypothesis ``b`` (see :meth:`clean_calls`)."""
        return np.stack(self.clean_calls(b, n, seed))

    # --- the private release ----------------------------------------------------------------------
    target: int = 0

    @abc.abstractmethod
    def mechanism(self, epsilon: float, delta: float, calibration: str = "analytic") -> Mechanism:
        """The calibrated DP aggregation."""

    @property
    @abc.abstractmethod
    def sensitivity(self) -> float:
        """The sensitivity the mechanism is calibrated for."""


class PrivateVotingPipeline(Pipeline):
    """PV (Wu et al. 2023): each partition votes; Gaussian noise on the vote counts.

    Vote 0 is "Yes" (direct/semantic) or "the model reproduced the canary's
    secret" (copy); vote 1 the opposite. ContextLeak withholds flagged answers,
    which then count as a vote 1.
    """

    name = "pv"

    def answers(self, groups):
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
        yes = int(np.sum(answers))
        return np.array([yes, len(answers) - yes], np.float64)

    @property
    def sensitivity(self) -> float:
        return float(np.sqrt(2.0))

    def mechanism(self, epsilon, delta, calibration="analytic"):
        return PrivateVoting.calibrated(epsilon, delta, self.sensitivity, calibration)


class ProductOfExpertsPipeline(Pipeline):
    """PoE (Romijnders et al. 2026): one expert per exemplar; clipped label log-probs summed.

    Labels are Yes/No (direct/semantic) or the canary's secret vs the decoy as
    continuations (copy). ContextLeak replaces a flagged expert's log-probs by
    ``-Gamma`` for every label.
    """

    name = "poe"

    def __init__(self, oracle, case, *, clip: float = 5.0, defense: str = "none"):
        super().__init__(oracle, case, partitions=case.context.num_exemplars, defense=defense)
        if not clip > 0:
            raise ValueError(f"clip must be > 0, got {clip}")
        self.clip = float(clip)

    def assign(self, exemplars, rng):
        return [(e,) for e in exemplars]  # per-example experts: no randomness

    @property
    def labels(self) -> list[str]:
        if self.case.mode == "copy":
            return [" " + self.case.secret, " " + self.case.decoy]
        return ["Yes", "No"]

    def answers(self, groups):
        prompts = [self._copy(g) if self.case.mode == "copy" else self._yes_no(g) for g in groups]
        lp = np.clip(self.oracle.label_logprobs(prompts, self.labels), -self.clip, 0.0)
        if self.defense == "contextleak":
            texts = [self.labels[int(i)].strip() for i in np.argmax(lp, axis=1)]
            lp[self._leaks(texts)] = -self.clip
        return list(lp)

    def aggregate(self, answers):
        return np.sum(answers, axis=0)

    @property
    def sensitivity(self) -> float:
        return self.clip

    def mechanism(self, epsilon, delta, calibration="analytic"):
        return ProductOfExperts.calibrated(epsilon, self.clip)


class EmbeddingPipeline(Pipeline):
    """ESA (Wu et al. 2023): partitions answer with text; the mean embedding is noised.

    The signal sentences ``y1`` (canary present) and ``y2`` are the two
    candidates. Copy mode makes them the canary's and the replacement's
    continuation, so the model answers by copying; direct/semantic modes ask
    the model to reply with ``y1`` or ``y2`` (App. D.2). The 0-shot candidate
    stage is run separately (:meth:`candidate_coverage`): ESA's guarantee holds
    for any candidate pool, which does not see the private examples, so the
    active audit conditions on the pool ``{y1, y2}``.
    """

    name = "esa"
    max_new_tokens = 48

    def __init__(self, oracle, case, *, signals: tuple[str, str], partitions: int = 1, defense: str = "none"):
        super().__init__(oracle, case, partitions=partitions, defense=defense)
        self.signals = signals
        self._signal_embeddings = None

    @property
    def candidates(self) -> np.ndarray:
        if self._signal_embeddings is None:
            self._signal_embeddings = self.oracle.embed(list(self.signals))
        return self._signal_embeddings

    def _prompt(self, group):
        if self.case.mode == "copy":
            return self._copy(group)
        y1, y2 = self.signals
        return self._chat(self._user(group, P.esa_generator_instruction(self.case.query_text, self.case.mode, y1, y2)))

    def answers(self, groups):
        texts = self.oracle.generate([self._prompt(g) for g in groups], self.max_new_tokens)
        texts = [t.strip().splitlines()[0] if t.strip() else "" for t in texts]
        if self.defense == "contextleak":
            flagged = self._leaks(texts)
            texts = [P.WITHHELD if f else t for t, f in zip(texts, flagged)]
        texts = [t.rstrip(".") if t else P.WITHHELD for t in texts]
        return list(self.oracle.embed(texts))

    def aggregate(self, answers):
        return np.mean(answers, axis=0)

    @property
    def sensitivity(self) -> float:
        return 2.0 / self.partitions

    def mechanism(self, epsilon, delta, calibration="analytic"):
        return EmbeddingSpaceAggregation.calibrated(epsilon, delta, self.candidates, partitions=self.partitions,
                                                    calibration=calibration)

    def candidate_coverage(self, calls: int, seed: int) -> dict:
        """Runs the 0-shot candidate stage ``calls`` times; how often each signal comes back."""
        y1, y2 = self.signals
        rng = np.random.default_rng([seed, 11])
        prompts = [self.oracle.lm.chat_prompt(P.esa_candidate_instruction(y1, y2, int(s)))
                   for s in rng.integers(0, 10**6, calls)]
        texts = [t.strip().rstrip(".") for t in self.oracle.generate(prompts, self.max_new_tokens)]
        hits = {"y1": sum(t == y1.rstrip(".") for t in texts), "y2": sum(t == y2.rstrip(".") for t in texts)}
        return {"calls": calls, **hits, "other": calls - hits["y1"] - hits["y2"]}


class KeywordPipeline(Pipeline):
    """KSA (Wu et al. 2023): keyword histogram of the partitions' answers; JEM top-K.

    Every answer contributes each of its keywords once, so replacing one
    exemplar moves every count by at most 1 in either direction (utility
    sensitivity 2). The keyword domain is fixed after Phase A from the answers
    under both hypotheses (:meth:`histograms`). The target keyword is "yes"
    (direct/semantic) or the first word of the canary's secret (copy).
    """

    name = "ksa"

    NEIGHBOURING = ("replace_one", "add_remove")

    def __init__(self, oracle, case, *, partitions: int = 8, top_k: int = 4, defense: str = "none",
                 neighbouring: str = "replace_one"):
        super().__init__(oracle, case, partitions=partitions, defense=defense)
        if neighbouring not in self.NEIGHBOURING:
            raise ValueError(f"neighbouring must be one of {', '.join(self.NEIGHBOURING)}, got {neighbouring!r}")
        k = case.context.num_exemplars
        if neighbouring == "add_remove" and partitions != k:
            raise ValueError(f"neighbouring='add_remove' needs one exemplar per partition (partitions = "
                             f"num_exemplars = {k}): only then does adding an exemplar add one whole keyword set "
                             f"(every count moves by 0 or +1, Delta_u = 1); got partitions={partitions}")
        self.top_k = int(top_k)
        self.neighbouring = neighbouring
        self.vocabulary: tuple[str, ...] | None = None

    def exemplars(self, b: int) -> tuple[Example, ...]:
        """Hypothesis ``b``'s exemplars: under ``add_remove`` the context without the canary drops it (``k - 1``
        exemplars) instead of holding a replacement."""
        if self.neighbouring == "add_remove" and not b:
            ctx = self.case.context
            return tuple(e for i, e in enumerate(ctx.without_canary) if i != ctx.position)
        return self.case.exemplars(b)

    def assign(self, exemplars, rng):
        if self.neighbouring == "add_remove":
            return [(e,) for e in exemplars]  # one partition per exemplar: no randomness
        return super().assign(exemplars, rng)

    @property
    def target_keyword(self) -> str:
        return self.case.secret.split()[0] if self.case.mode == "copy" else "yes"

    @property
    def answer_keywords(self) -> frozenset[str]:
        """Words counted even if they are stopwords: the answers the audit distinguishes."""
        return frozenset({self.target_keyword} if self.case.mode == "copy" else {"yes", "no"})

    @property
    def target(self) -> int:
        if self.vocabulary is None:
            raise ValueError("the keyword vocabulary is fixed by histograms(); call it first")
        return self.vocabulary.index(self.target_keyword)

    def _prompt(self, group):
        return self._copy(group) if self.case.mode == "copy" else self._yes_no(group)

    def answers(self, groups):
        texts = self.oracle.generate([self._prompt(g) for g in groups], self.max_new_tokens)
        if self.defense == "contextleak":
            flagged = self._leaks(texts)
            texts = [P.WITHHELD if f else t for t, f in zip(texts, flagged)]
        return [frozenset(keywords_of(t, self.answer_keywords)) for t in texts]

    def aggregate(self, answers):
        return tuple(answers)  # the partitions' keyword sets, counted by histograms()

    def clean_outputs(self, b, n, seed):
        """Histograms need the vocabulary of both hypotheses: use :meth:`clean_calls` and :meth:`histograms`."""
        raise NotImplementedError("KSA clean outputs are histograms over a shared vocabulary: use histograms()")

    def histograms(self, sets_with: Sequence, sets_without: Sequence) -> tuple[np.ndarray, np.ndarray]:
        """Counts over a vocabulary fixed from both hypotheses' answers: ``(n, V)`` each."""
        vocab = sorted({w for call in list(sets_with) + list(sets_without) for s in call for w in s}
                       | {self.target_keyword})
        self.vocabulary = tuple(vocab)
        return self.count(sets_with), self.count(sets_without)

    def count(self, calls: Sequence) -> np.ndarray:
        """Keyword counts ``(n, V)`` of calls over the fixed vocabulary (words outside it are not counted)."""
        if self.vocabulary is None:
            raise ValueError("the keyword vocabulary is fixed by histograms(); call it first")
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
        k = min(self.top_k, len(self.vocabulary) if self.vocabulary else self.top_k)
        return KeywordSpaceAggregation.calibrated(epsilon, k, self.sensitivity)

    def reconstruction_prompts(self, keyword_ids: np.ndarray) -> list[str]:
        """Final answers of KSA from the selected keywords (for the end-to-end passive audit)."""
        return [
            self.oracle.lm.chat_prompt(P.ksa_reconstruction_instruction(self.query, [self.vocabulary[i] for i in row]))
            for row in np.asarray(keyword_ids)
        ]


PIPELINES = {"pv": PrivateVotingPipeline, "poe": ProductOfExpertsPipeline, "esa": EmbeddingPipeline,
             "ksa": KeywordPipeline}
