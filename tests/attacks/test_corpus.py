"""The synthetic corpus and canaries (:mod:`attacks.corpus`) against exact oracles: determinism, exact spans,
the Zipf allocation against a naive loop of Hamilton's method, and the canaries' Binomial insertion count (fixed
seed, false-failure probability ALPHA).
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from scipy import stats

pytest.importorskip("tokenizers")
pytest.importorskip("faker")

from attacks import (  # noqa: E402
    LABELS,
    CanaryConfig,
    CorpusConfig,
    PublicFiller,
    insert_canaries,
    make_canaries,
    make_corpus,
    pii_record_counts,
    zipf_counts,
)
from tests.helpers.attack_lm import SMALL  # noqa: E402

ALPHA = 1e-6  # false-failure probability of each statistical check


@pytest.fixture(scope="module")
def corpus():
    return make_corpus(SMALL)


def test_corpus_is_deterministic_and_seed_dependent(corpus):
    again = make_corpus(SMALL)
    assert again.records == corpus.records and again.people == corpus.people
    other = make_corpus(CorpusConfig(n_records=211, n_people=97, n_orgs=11, n_cities=7, seed=4))
    assert other.texts != corpus.texts


def test_spans_are_exact_sorted_and_disjoint(corpus):
    for r in corpus.records:
        assert r.spans, r
        for s in r.spans:
            assert r.text[s.start:s.end] == s.value and s.label in LABELS
        assert all(a.end <= b.start for a, b in zip(r.spans, r.spans[1:]))
        names = {s.value for s in r.spans if s.label == "PERSON"}
        assert names == {corpus.people[p].name for p in r.people} and len(set(r.people)) == 2


def test_repetition_is_the_zipf_allocation(corpus):
    """Tolerance: each count is within 1 of its Zipf quota (largest remainders), and the records realise it
    exactly."""
    total = 2 * SMALL.n_records
    counts = zipf_counts(total, SMALL.n_people, SMALL.zipf_exponent)
    w = np.arange(1, SMALL.n_people + 1) ** -SMALL.zipf_exponent
    assert counts.sum() == total and np.all(np.abs(counts - total * w / w.sum()) < 1)
    assert np.all(np.diff(counts) <= 0)
    np.testing.assert_array_equal(corpus.person_counts, counts)
    realised = pii_record_counts(corpus.records, ["PERSON"])
    assert [realised[("PERSON", p.name)] for p in corpus.people] == counts.tolist()
    orgs = pii_record_counts(corpus.records, ["ORG"])
    assert [orgs[("ORG", o)] for o in corpus.orgs] == corpus.org_counts.tolist()
    assert counts.max() >= 50 and (counts == 1).sum() >= 5  # heavy head and a tail of singletons
    # Naive oracle of Hamilton's method: floors, then one extra seat at a time to the largest remainder left.
    for total, n, s in [(37, 4, 1.0), (1000, 13, 1.3), (5, 7, 0.5)]:
        quota = total * np.arange(1, n + 1) ** -s / np.sum(np.arange(1, n + 1) ** -s)
        seats = np.floor(quota).astype(int)
        remainder = list(quota - seats)
        for _ in range(total - seats.sum()):
            i = max(range(n), key=lambda j: (remainder[j], -j))
            seats[i] += 1
            remainder[i] = -1.0
        assert zipf_counts(total, n, s).tolist() == seats.tolist()
    assert zipf_counts(10, 4, 0.0).tolist() == [3, 3, 2, 2]


def test_canaries_are_unique_independent_and_inserted_as_configured():
    """Inserted count ~ Binomial(1999, 1/2); the check fails with probability < ALPHA if it is."""
    cfg = CanaryConfig(n_canaries=1999, repetitions=(1, 3), seed=5)
    cs = make_canaries(cfg)
    assert cs == make_canaries(cfg)
    secrets = [c.secret for c in cs.canaries]
    assert len(set(secrets)) == len(secrets)
    for c in cs.canaries:
        assert c.text == c.prefix + c.continuation == f"my pin is {c.secret}"
        assert re.fullmatch(r"\d{4} \d{4}", c.secret) and c.repetitions == (1, 3)[c.index % 2]
    k = int(cs.inserted.sum())
    assert stats.binom.cdf(k, 1999, 0.5) > ALPHA / 2 and stats.binom.sf(k - 1, 1999, 0.5) > ALPHA / 2
    out = insert_canaries(["a", "b"], cs)
    assert out[:2] == ["a", "b"]
    for c in cs.canaries:
        assert out.count(c.text) == (c.repetitions if c.inserted else 0)


@pytest.mark.parametrize("call, match", [
    (lambda: CorpusConfig(n_records=0).validate(), r"n_records must be an integer >= 1, got 0"),
    (lambda: CorpusConfig(zipf_exponent=-1.0).validate(), r"zipf_exponent must be a finite number >= 0, got -1.0"),
    (lambda: CorpusConfig(n_records=10, n_people=5, zipf_exponent=3.0).validate(),
     r"zipf_exponent=3.0 puts the most frequent person in \d+ records, more than n_records=10"),
    (lambda: CorpusConfig(email_fraction=1.5).validate(), r"email_fraction must be in \[0, 1\], got 1.5"),
    (lambda: CanaryConfig(template="no secret here").validate(), r"template must contain '\{secret\}' exactly once"),
    (lambda: CanaryConfig(insert_probability=1.0).validate(), r"insert_probability must be in \(0, 1\), got 1.0"),
    (lambda: PublicFiller(0).value("NAME"), r"label must be one of PERSON, .*got 'NAME'"),
])
def test_bad_input_names_field_rule_and_value(call, match):
    with pytest.raises(ValueError, match=match):
        call()
