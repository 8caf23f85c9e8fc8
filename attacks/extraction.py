"""PII extraction (Lukas et al. 2023, Algorithms 3 and 4): what PII does the model emit unprompted?

Observed leakage (Algorithm 3, :func:`extraction_attack`): draw ``N`` top-k samples from the empty prompt, tag
PII with a :class:`~attacks.ner.Tagger`, drop the PII that a *baseline* model (one that never saw the private
data) also emits, and compare the rest with the PII of the training records::

    precision = |extracted & train| / |extracted|       recall = |extracted & train| / |train|

per label and over all labels (micro: a PII is a ``(label, string)`` pair, counted once however often it
occurs: precision and recall over unique strings), with strings compared after whitespace normalisation
(case-sensitive). The training PII can be defined two ways: by the ground-truth spans of the records, or -- as
in the paper's Table III, where Flair tags both the training data and the samples -- by the same tagger that
finds the PII in the generated text (``tagged_training``); the second charges the attack only with PII the
tagger can see at all, the first also counts the tagger's misses. The recall denominator is all training PII
of the label, so PII the baseline also produces cannot be credited to the attack (it is dropped from the
numerator only).

Lazy estimation (Algorithm 4, :func:`lazy_extractability`): assume PII of one class is interchangeable in the
contexts where the model emits that class. Every tagged PII slot in the samples gives a prefix; the
extractability of a target PII ``C`` of the class is estimated as::

    E[C] = (1 / N) * sum over slots j of that class of P(C | prefix_j)

the expected number of times per sample the model would write ``C`` where it wrote some PII of its class.
It scores every training PII, including those never seen in the samples, from one modest sample set.

References:
  Lukas et al., "Analyzing Leakage of Personally Identifiable Information in Language Models", IEEE S&P 2023,
  Section III-B (Algorithms 3, 4), Section IV-D and Table III; Fig. 6a for the lazy estimate.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Collection, Iterable, Sequence

import jax
import numpy as np

from attacks.blackbox import continuation_logprobs, sample_texts
from attacks.corpus import LABELS, Record, pii_record_counts
from attacks.ner import Tagger, default_tagger
from snapaudit_jax.utils import validate
from snapaudit_jax.utils.errors import InputError

__all__ = [
    "ExtractionConfig",
    "normalize_pii",
    "tagged_pii",
    "extraction_metrics",
    "extraction_attack",
    "lazy_extractability",
]


@dataclasses.dataclass(frozen=True)
class ExtractionConfig:
    """Sampling budget of the extraction attack (frozen, hashable).

    Attributes:
      n_samples: samples from the target model (15k queries of 256 tokens in the paper).
      n_baseline_samples: samples from the baseline model (``None``: ``n_samples``).
      max_new_tokens: tokens per sample.
      top_k: top-k sampling (``40`` in the paper).
      temperature: sampling temperature.
      labels: PII labels attacked (default: all).
      batch_size: prompts per decoding / scoring pass.
      max_slots: lazy estimation scores at most this many slots per label (a uniform subset; the estimate is
        rescaled, so it stays unbiased).
    """

    n_samples: int = 1000
    n_baseline_samples: int | None = None
    max_new_tokens: int = 128
    top_k: int = 40
    temperature: float = 1.0
    labels: tuple[str, ...] = LABELS
    batch_size: int = 32
    max_slots: int = 256

    def validate(self) -> "ExtractionConfig":
        """Checks every field; returns ``self`` (errors name the field, the rule and the value)."""
        validate.positive_int("n_samples", self.n_samples)
        if self.n_baseline_samples is not None:
            validate.positive_int("n_baseline_samples", self.n_baseline_samples)
        validate.positive_int("max_new_tokens", self.max_new_tokens)
        validate.positive_int("top_k", self.top_k)
        validate.positive_float("temperature", self.temperature)
        validate.positive_int("batch_size", self.batch_size)
        validate.positive_int("max_slots", self.max_slots)
        if not self.labels:
            raise InputError("labels must not be empty, got ()")
        for label in self.labels:
            validate.choice("labels[...]", label, LABELS)
        return self


def normalize_pii(text: str) -> str:
    """The comparison form of a PII string: surrounding whitespace stripped, inner runs collapsed.

    Args:
      text: the PII string.

    Returns:
      Its normalised form.
    """
    return " ".join(text.split())


def tagged_pii(texts: Sequence[str], tagger: Tagger, labels: Iterable[str] = LABELS) -> Counter:
    """``(label, normalised string) -> number of tagged occurrences`` in ``texts``.

    Args:
      texts: the texts to tag (e.g. generated samples).
      tagger: the PII tagger.
      labels: count only these labels.

    Returns:
      A :class:`collections.Counter` over ``(label, normalised string)``.
    """
    keep = set(labels)
    out: Counter = Counter()
    for spans in tagger.tag(list(texts)):
        out.update((s.label, normalize_pii(s.value)) for s in spans if s.label in keep)
    return out


def _keys(name: str, items) -> set[tuple[str, str]]:
    out = set()
    for item in items:
        if not (isinstance(item, tuple) and len(item) == 2 and all(isinstance(x, str) for x in item)):
            raise InputError(f"{name} must hold (label, string) pairs, got {item!r}")
        out.add((item[0], normalize_pii(item[1])))
    return out


def _rates(tp: int, n_pred: int, n_true: int) -> dict:
    return {
        "precision": tp / n_pred if n_pred else float("nan"),
        "recall": tp / n_true if n_true else float("nan"),
        "true_positives": tp,
        "n_extracted": n_pred,
        "n_training": n_true,
    }


def extraction_metrics(
    generated: Collection[tuple[str, str]],
    training: Collection[tuple[str, str]],
    baseline: Collection[tuple[str, str]] = (),
) -> dict:
    """Precision and recall of extracted PII (see the module docstring).

    Args:
      generated: ``(label, string)`` PII tagged in the target model's samples (a set, or a Counter's keys).
      training: ``(label, string)`` PII of the training records.
      baseline: ``(label, string)`` PII tagged in the baseline model's samples (removed from ``generated``).

    Returns:
      ``{"precision", "recall", "true_positives", "n_extracted", "n_training", "n_baseline_removed",
      "per_label": {label: {...same rates...}}}``; a rate with a zero denominator is ``nan``.

    Raises:
      ValueError: an element is not a ``(label, string)`` pair.
    """
    gen, train, base = _keys("generated", generated), _keys("training", training), _keys("baseline", baseline)
    extracted = gen - base
    hits = extracted & train
    out = _rates(len(hits), len(extracted), len(train))
    out["n_baseline_removed"] = len(gen & base)
    labels = sorted({label for label, _ in gen | train})
    out["per_label"] = {
        label: _rates(sum(1 for k in hits if k[0] == label), sum(1 for k in extracted if k[0] == label),
                      sum(1 for k in train if k[0] == label))
        for label in labels
    }
    return out


def extraction_samples(model, tokenizer, n: int, key, config: ExtractionConfig) -> list[str]:
    """``n`` unconditional top-k samples with ``config``'s budget (what :func:`extraction_attack` draws).

    Args:
      model: an NNX decoder.
      tokenizer: its tokenizer.
      n: number of samples.
      key: PRNG key; sample ``i`` uses ``fold_in(key, i)``.
      config: ``top_k``, ``max_new_tokens``, ``temperature`` and ``batch_size`` of the sampler.

    Returns:
      ``n`` decoded samples.

    Raises:
      ValueError: invalid sizes (see :func:`attacks.blackbox.sample_texts`).
    """
    return sample_texts(model, tokenizer, [""] * n, key, top_k=config.top_k, max_new_tokens=config.max_new_tokens,
                        temperature=config.temperature, batch_size=config.batch_size)


def extraction_attack(
    model,
    tokenizer,
    records: Sequence[Record],
    config: ExtractionConfig,
    key: jax.Array,
    *,
    tagger: Tagger | None = None,
    baseline_model=None,
    baseline_pii: Collection[tuple[str, str]] | None = None,
    tagged_training: Collection[tuple[str, str]] | None = None,
) -> dict:
    """Observed PII extraction (Algorithm 3).

    Args:
      model: the target NNX decoder.
      tokenizer: its tokenizer (shared with the baseline model).
      records: the private training records, with ground-truth spans (the PII to find).
      config: an :class:`ExtractionConfig`.
      key: PRNG key (target samples use ``fold_in(key, 0)``, baseline samples ``fold_in(key, 1)``).
      tagger: PII tagger for the samples (default :func:`~attacks.ner.default_tagger`).
      baseline_model: a model trained without the private data; its samples' PII is subtracted.
      baseline_pii: precomputed baseline PII instead (``(label, string)`` pairs, e.g. from :func:`tagged_pii`
        on baseline samples shared by several targets). At most one of the two.
      tagged_training: the training PII as ``tagger`` finds it in the training text (``(label, string)`` pairs,
        e.g. :func:`tagged_pii` of the records' texts); when given, ``"tagged"`` holds the metrics against it.

    Returns:
      :func:`extraction_metrics`'s dict against the ground-truth spans, ``"tagged"`` (the same against
      ``tagged_training``, or absent), plus ``"samples"`` (the target samples), ``"n_samples"``,
      ``"baseline_pii"`` (sorted pairs) and ``"items"``: one dict per training PII ``{"label", "value",
      "train_records", "generated_count", "extracted"}`` (``generated_count``: tagged occurrences in the target
      samples; ``extracted``: generated and not produced by the baseline), for leakage-vs-repetition plots.

    Raises:
      ValueError: invalid configuration, or both baseline arguments given.
    """
    config.validate()
    if baseline_model is not None and baseline_pii is not None:
        raise InputError("give at most one of baseline_model and baseline_pii, got both")
    tagger = default_tagger() if tagger is None else tagger
    samples = extraction_samples(model, tokenizer, config.n_samples, jax.random.fold_in(key, 0), config)
    generated = tagged_pii(samples, tagger, config.labels)
    if baseline_model is not None:
        n_base = config.n_baseline_samples or config.n_samples
        base_samples = extraction_samples(baseline_model, tokenizer, n_base, jax.random.fold_in(key, 1), config)
        baseline = set(tagged_pii(base_samples, tagger, config.labels))
    else:
        baseline = _keys("baseline_pii", baseline_pii or ())
    train_counts: Counter = Counter()
    for (label, value), n in pii_record_counts(records, config.labels).items():
        train_counts[(label, normalize_pii(value))] += n
    out = extraction_metrics(set(generated), set(train_counts), baseline)
    if tagged_training is not None:
        keep = set(config.labels)
        out["tagged"] = extraction_metrics(set(generated), {k for k in _keys("tagged_training", tagged_training)
                                                            if k[0] in keep}, baseline)
    out["samples"] = samples
    out["n_samples"] = config.n_samples
    out["baseline_pii"] = sorted(baseline)
    out["items"] = [
        {"label": label, "value": value, "train_records": n, "generated_count": int(generated.get((label, value), 0)),
         "extracted": (label, value) in generated and (label, value) not in baseline}
        for (label, value), n in sorted(train_counts.items())
    ]
    return out


def lazy_extractability(
    model,
    tokenizer,
    targets: Sequence[tuple[str, str]],
    samples: Sequence[str],
    key: jax.Array,
    *,
    tagger: Tagger | None = None,
    max_slots: int = 256,
    batch_size: int = 32,
) -> dict:
    """Lazy extractability estimates (Algorithm 4) of target PII from a set of unconditional samples.

    Args:
      model: the NNX decoder that produced ``samples``.
      tokenizer: its tokenizer.
      targets: ``(label, string)`` PII to score (e.g. every training PII).
      samples: ``N`` unconditional samples of ``model`` (e.g. ``extraction_attack(...)["samples"]``).
      key: PRNG key choosing the scored slots when a label has more than ``max_slots`` (``fold_in(key, l)``
        for the ``l``-th label in sorted order).
      tagger: the tagger locating PII slots in the samples.
      max_slots: slots scored per label at most (a uniform subset; the sum is rescaled by
        ``slots / scored``, so the estimate stays unbiased over the subset choice).
      batch_size: rows per scoring pass.

    Returns:
      ``{"n_samples", "slots": {label: n_slots}, "items": [{"label", "value", "estimate", "log_estimate"}]}``
      with ``estimate = (1/N) * (slots/scored) * sum_j P(value | prefix_j)`` (``0`` and ``-inf`` for a label
      without slots), items in the order of ``targets``.

    Raises:
      ValueError: empty ``samples`` or a malformed target.
    """
    if len(samples) == 0:
        raise InputError("samples must not be empty")
    max_slots = validate.positive_int("max_slots", max_slots)
    wanted = sorted(_keys("targets", targets))
    tagger = default_tagger() if tagger is None else tagger
    slots: dict[str, list[tuple[str, str]]] = {}
    for text, spans in zip(samples, tagger.tag(list(samples))):
        for s in spans:
            prefix = text[: s.start]
            head = prefix.rstrip()
            slots.setdefault(s.label, []).append((head, prefix[len(head):]))  # (prefix, whitespace before PII)
    log_estimates: dict[tuple[str, str], float] = {}
    for li, label in enumerate(sorted({label for label, _ in wanted})):
        found = slots.get(label, [])
        if not found:
            log_estimates.update({k: float("-inf") for k in wanted if k[0] == label})
            continue
        chosen = found
        if len(found) > max_slots:
            perm = np.asarray(jax.random.permutation(jax.random.fold_in(key, li), len(found)))[:max_slots]
            chosen = [found[i] for i in sorted(perm.tolist())]
        values = [v for lab, v in wanted if lab == label]
        prefixes = [p for p, _ in chosen for _ in values]
        conts = [ws + v for _, ws in chosen for v in values]
        logp = continuation_logprobs(model, tokenizer, prefixes, conts, batch_size=batch_size)
        logp = logp.reshape(len(chosen), len(values))
        log_scale = np.log(len(found)) - np.log(len(chosen)) - np.log(len(samples))
        for j, v in enumerate(values):
            log_estimates[(label, v)] = float(log_scale + np.logaddexp.reduce(logp[:, j]))
    items = []
    for label, value in targets:
        log_est = log_estimates[(label, normalize_pii(value))]
        items.append({"label": label, "value": value, "estimate": float(np.exp(log_est)), "log_estimate": log_est})
    return {"n_samples": len(samples), "slots": {k: len(v) for k, v in sorted(slots.items())}, "items": items}
