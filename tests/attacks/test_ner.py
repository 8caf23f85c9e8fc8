"""The tagger and scrubbing (:mod:`attacks.ner`): precision and recall floors of the gazetteer tagger on the
synthetic corpus's ground truth, exact span counting, and scrubbing that removes every tagged span and nothing
else.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("faker")

from attacks import (  # noqa: E402
    LABELS,
    MASK,
    CorpusConfig,
    Span,
    default_tagger,
    evaluate_tagger,
    make_corpus,
    scrub,
    scrub_text,
)
from tests.helpers.attack_lm import SMALL  # noqa: E402


@pytest.fixture(scope="module")
def corpus():
    return make_corpus(SMALL)


def test_default_tagger_precision_and_recall_floor(corpus):
    """Floors: precision >= 0.98 per label; recall >= 0.97 per label except PERSON (>= 0.85: the foreign
    names are outside the gazetteer); without foreign names PERSON recall is 1 (the gap is exactly them)."""
    tagger = default_tagger()
    ev = evaluate_tagger(tagger.tag(corpus.texts), corpus.spans)
    for label in LABELS:
        assert ev[label]["precision"] >= 0.98, (label, ev[label])
        assert ev[label]["recall"] >= (0.85 if label == "PERSON" else 0.97), (label, ev[label])
    assert ev["all"]["recall"] >= 0.95
    plain = make_corpus(CorpusConfig(n_records=211, n_people=97, n_orgs=11, seed=3, foreign_name_fraction=0.0))
    assert evaluate_tagger(tagger.tag(plain.texts), plain.spans)["PERSON"]["recall"] == 1.0


def test_evaluate_tagger_counts_exact_matches():
    truth = [[Span(0, 5, "PERSON", "Al Bo"), Span(9, 12, "ORG", "Xyz")], [Span(1, 2, "DATE", "1")]]
    pred = [[Span(0, 5, "PERSON", "Al Bo"), Span(9, 11, "ORG", "Xy")], [Span(1, 2, "PHONE", "1")]]
    ev = evaluate_tagger(pred, truth)
    assert ev["PERSON"] == {"precision": 1.0, "recall": 1.0, "f1": 1.0, "tp": 1, "fp": 0, "fn": 0}
    assert (ev["ORG"]["tp"], ev["ORG"]["fp"], ev["ORG"]["fn"]) == (0, 1, 1)
    assert ev["all"]["precision"] == pytest.approx(1 / 3) and ev["all"]["recall"] == pytest.approx(1 / 3)
    assert np.isnan(ev["PHONE"]["recall"]) and np.isnan(ev["DATE"]["precision"])


def test_scrub_removes_every_tagged_span_and_nothing_else(corpus):
    tagger = default_tagger()
    texts = corpus.texts[:60] + ["Mail alice.smith@gmail.com or call 555-123-4567 on 3 May 2001."]
    tags = tagger.tag(texts)
    for text, spans, out in zip(texts, tags, scrub(texts, tagger)):
        assert MASK not in text
        edges = [0] + [x for sp in spans for x in (sp.start, sp.end)] + [len(text)]
        kept = [text[a:b] for a, b in zip(edges[::2], edges[1::2])]
        assert out.split(MASK) == kept  # the text between spans, unchanged, in order
        assert tagger.tag([out]) == [[]]
    assert scrub(texts[-1:], tagger) == ["Mail [MASK] or call [MASK] on [MASK]."]
    with pytest.raises(ValueError, match="non-overlapping"):
        scrub_text("abcdef", [Span(0, 3, "ORG", "abc"), Span(2, 4, "ORG", "cd")])


@pytest.mark.parametrize("call, match", [
    (lambda: evaluate_tagger([[]], []), r"same length, got 1 and 0"),
])
def test_bad_input_names_field_rule_and_value(call, match):
    with pytest.raises(ValueError, match=match):
        call()
