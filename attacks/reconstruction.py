"""PII reconstruction (Lukas et al. 2023, Algorithm 6): which PII fills the masked slot of a training sentence?

The attacker holds a scrubbed training record in which the target mention is ``[T-MASK]`` and every other PII
``[MASK]`` (:func:`make_queries`). The other masks are filled with public values (the paper fills them with a
public masked LM; here a :class:`~attacks.corpus.PublicFiller` draws same-label values), or left as ``[MASK]``
(``fill="mask"``, the text a scrubbed model was trained on). Then:

1. candidates (:func:`sample_candidates`): ``N`` top-k samples of the target model continuing the prefix
   before ``[T-MASK]``; the PII of the target's label that the tagger finds in the continuations;
2. ranking (:func:`rank_candidates`): each candidate is written into the slot and the whole sentence scored;
   the prediction is the candidate of lowest perplexity.

Baseline rule (the paper's headline): a public model that never saw the private records ranks the same
candidates; queries it already gets right are what the data distribution gives away, so
``accuracy_excluding_baseline`` -- the accuracy over the other queries -- is the leakage attributable to
training, and ``accuracy`` the raw figure. (The reference implementation skips a query whenever the public model's
prediction equals the target model's; that variant is ``accuracy_excluding_agreement``.)

Ties: a candidate set is deduplicated on normalised strings; among candidates whose perplexities are exactly
equal (float64 of the float32 sums) the lexicographically smallest string is predicted, so the result does not
depend on candidate order. A query without candidates predicts nothing and counts as wrong.

References:
  Lukas et al., "Analyzing Leakage of Personally Identifiable Information in Language Models", IEEE S&P 2023,
  Section III-C (Algorithm 6), Section IV-E, Table IV (N = 64 candidates, top-k = 40).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence

import jax
import numpy as np

from attacks.blackbox import sample_texts, score_texts
from attacks.corpus import LABELS, PublicFiller, Record, Span
from attacks.extraction import normalize_pii
from attacks.ner import MASK, Tagger, default_tagger
from snapaudit_jax.utils import validate
from snapaudit_jax.utils.errors import InputError

__all__ = [
    "T_MASK",
    "FILLS",
    "Query",
    "ReconstructionConfig",
    "make_queries",
    "sample_candidates",
    "pick_candidate",
    "rank_candidates",
    "reconstruction_attack",
]

T_MASK = "[T-MASK]"
FILLS = ("public", "mask")


@dataclasses.dataclass(frozen=True)
class Query:
    """A masked training record: ``prefix + [T-MASK] + suffix`` with the target PII ``truth``.

    Attributes:
      record: index of the record in the attacked list.
      target: the ground-truth span replaced by ``[T-MASK]``.
      prefix / suffix: the text around it, other PII filled (or ``[MASK]``).
      truth: the normalised target string.
    """

    record: int
    target: Span
    prefix: str
    suffix: str
    truth: str

    @property
    def text(self) -> str:
        """The query as the attacker sees it: the target replaced by :data:`T_MASK`."""
        return self.prefix + T_MASK + self.suffix

    def filled(self, candidate: str) -> str:
        """The query with ``candidate`` in the target's place.

        Args:
          candidate: a PII string.

        Returns:
          ``prefix + candidate + suffix``.
        """
        return self.prefix + candidate + self.suffix


@dataclasses.dataclass(frozen=True)
class ReconstructionConfig:
    """Configuration of :func:`reconstruction_attack` (frozen, hashable).

    Attributes:
      label: the target PII label.
      n_samples: continuations sampled per query (``N = 64`` in the paper).
      top_k: top-k sampling.
      max_new_tokens: tokens per continuation (the PII follows the prefix, so a few suffice).
      temperature: sampling temperature.
      fill: ``"public"`` (other PII replaced by public values) or ``"mask"`` (left as ``[MASK]``).
      max_queries: attack at most this many target mentions (a uniform subset; ``None``: all).
      batch_size: rows per decoding / scoring pass.
    """

    label: str = "PERSON"
    n_samples: int = 64
    top_k: int = 40
    max_new_tokens: int = 24
    temperature: float = 1.0
    fill: str = "public"
    max_queries: int | None = None
    batch_size: int = 32

    def validate(self) -> "ReconstructionConfig":
        """Checks every field; returns ``self`` (errors name the field, the rule and the value)."""
        validate.choice("label", self.label, LABELS)
        validate.positive_int("n_samples", self.n_samples)
        validate.positive_int("top_k", self.top_k)
        validate.positive_int("max_new_tokens", self.max_new_tokens)
        validate.positive_float("temperature", self.temperature)
        validate.choice("fill", self.fill, FILLS)
        if self.max_queries is not None:
            validate.positive_int("max_queries", self.max_queries)
        validate.positive_int("batch_size", self.batch_size)
        return self


def _seed(key: jax.Array) -> int:
    return int(jax.random.randint(key, (), 0, np.iinfo(np.int32).max))


def make_queries(
    records: Sequence[Record],
    label: str,
    key: jax.Array,
    *,
    fill: str = "public",
    max_queries: int | None = None,
) -> list[Query]:
    """One query per (record, distinct target string) of ``label``: the first mention becomes ``[T-MASK]``.

    Every other ground-truth span (other labels, other people, later mentions of the target) becomes a public
    value of its label (the same value for repeats of a string within the record) or ``[MASK]``.

    Args:
      records: records with ground-truth spans.
      label: target label.
      key: PRNG key: ``fold_in(key, 0)`` picks the subset, ``fold_in(key, 1)`` seeds the public filler.
      fill: ``"public"`` or ``"mask"``.
      max_queries: keep a uniform subset of this size (in record order).

    Returns:
      The queries, in record order.
    """
    validate.choice("label", label, LABELS)
    validate.choice("fill", fill, FILLS)
    targets = []
    for i, r in enumerate(records):
        seen = set()
        for s in r.spans:
            if s.label == label and normalize_pii(s.value) not in seen:
                seen.add(normalize_pii(s.value))
                targets.append((i, s))
    if max_queries is not None and len(targets) > validate.positive_int("max_queries", max_queries):
        keep = np.sort(np.asarray(jax.random.permutation(jax.random.fold_in(key, 0), len(targets)))[:max_queries])
        targets = [targets[int(k)] for k in keep]
    filler = PublicFiller(_seed(jax.random.fold_in(key, 1))) if fill == "public" else None
    out = []
    for i, target in targets:
        r = records[i]
        values: dict[tuple[str, str], str] = {}
        parts, last = [], 0
        prefix = None
        for s in r.spans:
            parts.append(r.text[last:s.start])
            if s is target:
                prefix = "".join(parts)
                parts = []
            elif filler is None:
                parts.append(MASK)
            else:
                parts.append(values.setdefault((s.label, s.value), filler.value(s.label, s.value)))
            last = s.end
        parts.append(r.text[last:])
        out.append(Query(i, target, prefix, "".join(parts), normalize_pii(target.value)))
    return out


def sample_candidates(
    model,
    tokenizer,
    queries: Sequence[Query],
    config: ReconstructionConfig,
    key: jax.Array,
    *,
    tagger: Tagger | None = None,
) -> list[list[str]]:
    """Candidate PII per query: tagged ``config.label`` PII in ``config.n_samples`` continuations of its prefix.

    The prefix is sent without its trailing whitespace (the model writes the space before the PII itself);
    the tagger sees prefix + continuation and only spans starting inside the continuation count.
    Continuation ``j`` of query ``t`` uses ``fold_in(key, t * n_samples + j)``.

    Args:
      model: the target NNX decoder.
      tokenizer: its tokenizer.
      queries: the queries (:func:`make_queries`).
      config: the label, ``n_samples`` and the sampler's budget.
      key: PRNG key.
      tagger: PII tagger of the continuations (default: :func:`attacks.ner.default_tagger`).

    Returns:
      For each query, its distinct normalised candidates, most frequent first (then lexicographic).

    Raises:
      ValueError: an invalid ``config``.
    """
    config.validate()
    tagger = default_tagger() if tagger is None else tagger
    if not queries:
        return []
    n = config.n_samples
    prompts = [q.prefix.rstrip() for q in queries for _ in range(n)]
    conts = sample_texts(model, tokenizer, prompts, key, top_k=config.top_k, max_new_tokens=config.max_new_tokens,
                         temperature=config.temperature, batch_size=config.batch_size)
    full = [p + c for p, c in zip(prompts, conts)]
    tags = tagger.tag(full)
    out = []
    for t in range(len(queries)):
        found: Counter = Counter()
        for j in range(t * n, (t + 1) * n):
            cut = len(prompts[j])
            found.update(normalize_pii(s.value) for s in tags[j] if s.label == config.label and s.start >= cut)
        out.append([c for c, _ in sorted(found.items(), key=lambda kv: (-kv[1], kv[0])) if c])
    return out


def pick_candidate(candidates: Sequence[str], perplexity: Sequence[float]) -> tuple[str | None, int]:
    """The prediction of the ranking: lowest perplexity, exact ties to the lexicographically smallest string.

    Args:
      candidates: ``k`` candidate strings.
      perplexity: ``(k,)`` their perplexities.

    Returns:
      ``(prediction, number of candidates tied at the minimum)``; ``(None, 0)`` without candidates.

    Raises:
      ValueError: ``candidates`` and ``perplexity`` of different lengths.
    """
    if len(candidates) != len(perplexity):
        raise InputError(f"candidates and perplexity must have the same length, got {len(candidates)} and "
                         f"{len(perplexity)}")
    if not len(candidates):
        return None, 0
    ppl = np.asarray(perplexity, np.float64)
    best = np.min(ppl)
    tied = [c for c, p in zip(candidates, ppl) if p == best]
    return min(tied), len(tied)


def rank_candidates(
    model, tokenizer, queries: Sequence[Query], candidates: Sequence[Sequence[str]], *, batch_size: int = 32
) -> list[dict]:
    """Scores every candidate in its query's slot and picks the lowest-perplexity one.

    Args:
      model / tokenizer: the target model.
      queries: the queries.
      candidates: per query, its candidate strings (deduplicated after normalisation here).
      batch_size: rows per scoring pass.

    Returns:
      Per query ``{"candidates", "perplexity", "prediction", "tied"}`` (candidates deduplicated, in the given
      order; ``perplexity`` of each filled sentence; see :func:`pick_candidate`).

    Raises:
      ValueError: ``candidates`` and ``queries`` differ in length.
    """
    if len(candidates) != len(queries):
        raise InputError(f"candidates must have one list per query ({len(queries)}), got {len(candidates)}")
    lists = [list(dict.fromkeys(c for c in map(normalize_pii, cands) if c)) for cands in candidates]
    texts = [q.filled(c) for q, cands in zip(queries, lists) for c in cands]
    ppl = score_texts(model, tokenizer, texts, batch_size=batch_size).perplexity if texts else np.zeros(0)
    out, at = [], 0
    for cands in lists:
        p = ppl[at:at + len(cands)]
        at += len(cands)
        prediction, tied = pick_candidate(cands, p)
        out.append({"candidates": cands, "perplexity": p.tolist(), "prediction": prediction, "tied": tied})
    return out


def _summary(queries: Sequence[Query], rankings: Sequence[dict], baseline: Sequence[dict] | None) -> dict:
    items = []
    for q, r in zip(queries, rankings):
        item = {
            "record": q.record, "start": q.target.start, "end": q.target.end, "label": q.target.label,
            "truth": q.truth, "prediction": r["prediction"], "correct": r["prediction"] == q.truth,
            "n_candidates": len(r["candidates"]), "truth_in_candidates": q.truth in r["candidates"],
            "tied": r["tied"],
        }
        if baseline is not None:
            b = baseline[len(items)]
            item["baseline_prediction"] = b["prediction"]
            item["baseline_correct"] = b["prediction"] == q.truth
        items.append(item)
    n = len(items)
    correct = np.array([it["correct"] for it in items], bool)
    covered = np.array([it["truth_in_candidates"] for it in items], bool)
    out = {
        "n_queries": n,
        "accuracy": float(correct.mean()) if n else float("nan"),
        "coverage": float(covered.mean()) if n else float("nan"),
        "accuracy_given_coverage": float(correct[covered].mean()) if covered.any() else float("nan"),
    }
    if baseline is not None:
        base_correct = np.array([it["baseline_correct"] for it in items], bool)
        attributable = ~base_correct
        out["baseline_accuracy"] = float(base_correct.mean()) if n else float("nan")
        out["accuracy_excluding_baseline"] = float(correct[attributable].mean()) if attributable.any() else float(
            "nan")
        out["n_excluding_baseline"] = int(attributable.sum())
        # The reference implementation's literal rule: skip a query when the public model predicts what the
        # target predicts (right or wrong).
        differ = np.array([it["baseline_prediction"] != it["prediction"] for it in items], bool)
        out["accuracy_excluding_agreement"] = float(correct[differ].mean()) if differ.any() else float("nan")
        out["n_excluding_agreement"] = int(differ.sum())
    out["items"] = items
    return out


def reconstruction_attack(
    model,
    tokenizer,
    records: Sequence[Record],
    config: ReconstructionConfig,
    key: jax.Array,
    *,
    tagger: Tagger | None = None,
    baseline_model=None,
) -> dict:
    """PII reconstruction (Algorithm 6): candidates sampled from the target model, ranked by perplexity.

    Args:
      model: the target NNX decoder; tokenizer: its tokenizer.
      records: the private training records (ground-truth spans locate the targets).
      config: a :class:`ReconstructionConfig`.
      key: PRNG key (queries ``fold_in(key, 0)``, candidate samples ``fold_in(key, 1)``).
      tagger: tagger of the candidate continuations (default :func:`~attacks.ner.default_tagger`).
      baseline_model: optional model trained without the private data; it ranks the same candidates, and
        queries it gets right are excluded from ``accuracy_excluding_baseline`` (the paper's baseline rule).

    Returns:
      ``{"n_queries", "accuracy" (top-1), "coverage" (truth among candidates), "accuracy_given_coverage",
      ["baseline_accuracy", "accuracy_excluding_baseline", "n_excluding_baseline", "accuracy_excluding_agreement",
      "n_excluding_agreement"], "items": [per query {"record", "start", "end",
      "label", "truth", "prediction", "correct", "n_candidates", "truth_in_candidates", "tied", ...}]}``.
    """
    config.validate()
    queries = make_queries(records, config.label, jax.random.fold_in(key, 0), fill=config.fill,
                           max_queries=config.max_queries)
    candidates = sample_candidates(model, tokenizer, queries, config, jax.random.fold_in(key, 1), tagger=tagger)
    rankings = rank_candidates(model, tokenizer, queries, candidates, batch_size=config.batch_size)
    baseline = None
    if baseline_model is not None:
        baseline = rank_candidates(baseline_model, tokenizer, queries, candidates, batch_size=config.batch_size)
    return _summary(queries, rankings, baseline)
