"""PII extraction (:mod:`attacks.extraction`), observed (Algorithm 3) and lazy (Algorithm 4): hand-built sets
with exact expected precision and recall, a scripted tagger, and the lazy estimate against
:func:`attacks.blackbox.continuation_logprobs`.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("faker")

from attacks import (  # noqa: E402
    ExtractionConfig,
    continuation_logprobs,
    extraction_attack,
    extraction_metrics,
    lazy_extractability,
)
from tests.helpers.attack_lm import (  # noqa: E402
    BATCH,
    SHORT,
    FixedTagger,
    small_lm,
)


@pytest.fixture(scope="module")
def lm():
    """``(model, tokenizer)``: random GPT-2 (width 32, 2 layers, 64 positions) and a BPE trained on the small
    corpus."""
    return small_lm()


def test_extraction_metrics_on_hand_built_sets():
    train = {("PERSON", "Alice Smith"), ("PERSON", "Bob Jones"), ("PERSON", "Carol White"), ("EMAIL", "a@b.com")}
    generated = {("PERSON", "Alice  Smith "), ("PERSON", "Bob Jones"), ("PERSON", "Zed Moe"), ("EMAIL", "a@b.com"),
                 ("ORG", "Lee LLC")}
    baseline = {("PERSON", "Bob Jones"), ("ORG", "Lee LLC")}
    out = extraction_metrics(generated, train, baseline)
    # extracted = {Alice Smith, Zed Moe, a@b.com}; hits = {Alice Smith, a@b.com}
    assert (out["true_positives"], out["n_extracted"], out["n_training"]) == (2, 3, 4)
    assert out["precision"] == pytest.approx(2 / 3) and out["recall"] == pytest.approx(2 / 4)
    assert out["n_baseline_removed"] == 2
    assert out["per_label"]["PERSON"]["precision"] == pytest.approx(1 / 2)
    assert out["per_label"]["PERSON"]["recall"] == pytest.approx(1 / 3)
    assert out["per_label"]["EMAIL"]["recall"] == 1.0
    assert np.isnan(out["per_label"]["ORG"]["precision"]) and np.isnan(out["per_label"]["ORG"]["recall"])
    assert extraction_metrics(generated, train)["precision"] == pytest.approx(3 / 5)


def test_extraction_attack_and_lazy_estimate(lm):
    model, tok = lm
    tagger = FixedTagger(["Alice Smith", "Zed Moe", "Alice Smith"])
    cfg = ExtractionConfig(n_samples=6, max_new_tokens=12, top_k=5, batch_size=BATCH, labels=("PERSON",))
    out = extraction_attack(model, tok, SHORT, cfg, jax.random.key(2), tagger=tagger,
                            baseline_pii=[("PERSON", "Zed Moe")])
    assert (out["precision"], out["recall"]) == (1.0, 0.25)  # Alice of {Alice, Bob, Carol, Dan}
    assert out["samples"] == extraction_attack(model, tok, SHORT, cfg, jax.random.key(2), tagger=tagger)["samples"]
    items = {it["value"]: it for it in out["items"]}
    assert items["Alice Smith"] == {"label": "PERSON", "value": "Alice Smith", "train_records": 2,
                                    "generated_count": 4, "extracted": True}
    assert items["Bob Jones"]["generated_count"] == 0 and not items["Bob Jones"]["extracted"]
    # Lazy estimate: (1/N) sum over the N slots of P(value | sample[:4]) -- oracle from continuation_logprobs.
    samples = out["samples"]
    lazy = lazy_extractability(model, tok, [("PERSON", "Bob Jones"), ("ORG", "Lee LLC")], samples,
                               jax.random.key(3), tagger=tagger, batch_size=BATCH)
    heads = [s[: min(4, len(s))] for s in samples]
    prefixes = [h.rstrip() for h in heads]
    conts = [h[len(p):] + "Bob Jones" for h, p in zip(heads, prefixes)]
    expected = np.exp(continuation_logprobs(model, tok, prefixes, conts, batch_size=BATCH)).mean()
    assert lazy["items"][0]["estimate"] == pytest.approx(expected, rel=1e-6)
    assert lazy["items"][1]["estimate"] == 0.0 and lazy["items"][1]["log_estimate"] == -np.inf
    assert lazy["slots"] == {"PERSON": 6}


def test_extraction_against_tagged_training_pii(lm):
    """Table III's variant: the training PII is what the tagger finds, not the ground-truth spans."""
    model, tok = lm
    tagger = FixedTagger(["Alice Smith", "Zed Moe", "Alice Smith"])
    cfg = ExtractionConfig(n_samples=6, max_new_tokens=12, top_k=5, batch_size=BATCH, labels=("PERSON",))
    # The tagger saw Zed Moe (a ground-truth miss) and Alice in the training text, plus an ORG (not attacked).
    tagged = [("PERSON", "Alice Smith"), ("PERSON", " Zed  Moe "), ("ORG", "Lee LLC")]
    out = extraction_attack(model, tok, SHORT, cfg, jax.random.key(2), tagger=tagger, tagged_training=tagged)
    # Generated {Alice, Zed}: both are tagged training PII; the ground truth {Alice, Bob, Carol, Dan} has Alice.
    assert (out["tagged"]["precision"], out["tagged"]["recall"]) == (1.0, 1.0)
    assert out["tagged"]["n_training"] == 2  # ORG filtered out: only attacked labels count
    assert (out["precision"], out["recall"]) == (0.5, 0.25)
    assert "tagged" not in extraction_attack(model, tok, SHORT, cfg, jax.random.key(2), tagger=tagger)
    with pytest.raises(ValueError, match="tagged_training must hold"):
        extraction_attack(model, tok, SHORT, cfg, jax.random.key(2), tagger=tagger, tagged_training=["Alice"])


@pytest.mark.parametrize("call, match", [
    (lambda: ExtractionConfig(top_k=0).validate(), r"top_k must be an integer >= 1, got 0"),
    (lambda: ExtractionConfig(labels=("NAME",)).validate(), r"labels\[\.\.\.\] must be one of .*got 'NAME'"),
    (lambda: extraction_metrics([("PERSON",)], []), r"generated must hold \(label, string\) pairs"),
])
def test_bad_input_names_field_rule_and_value(call, match):
    with pytest.raises(ValueError, match=match):
        call()
