"""Tests for the PII leakage attacks (``attacks/``) against independent oracles.

Oracles: per-prefix Python loops of the model's forward pass in NumPy float64 (sequence log-likelihoods,
perplexity rankings); the model's truncated softmax and a chi-square test (top-k sampler); transformers-free
greedy decoding of :class:`snapaudit_jax.models.LanguageModel` (top-1 sampling); :func:`snapaudit_jax.dpsgd.
sequence_losses` (the training loss); ``sklearn.metrics`` (ROC AUC and curve); jax_privacy's
``CanaryScoreAuditor`` (Clopper-Pearson epsilon at a fixed threshold); the closed-form epsilon of a Gaussian
mechanism (Monte Carlo validity of the canary bounds); hand-built sets with exact expected numbers.

Statistical tests use fixed seeds and state their false-failure probability; each has a power check (a wrong
sampler / a naive epsilon estimator is rejected). One tiny random GPT-2 (vocabulary ~300 byte-level BPE, 2
layers, width 32) and short texts keep compiled shapes few: every call uses ``batch_size=8``.
"""

from __future__ import annotations

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from scipy import stats

from snapaudit_jax.estimation.one_run import one_run_audit

tokenizers = pytest.importorskip("tokenizers")
pytest.importorskip("faker")
sklearn_metrics = pytest.importorskip("sklearn.metrics")

from attacks import (  # noqa: E402
    LABELS,
    MASK,
    T_MASK,
    CanaryAuditConfig,
    CanaryConfig,
    CorpusConfig,
    ExtractionConfig,
    InferenceConfig,
    PublicFiller,
    ReconstructionConfig,
    Record,
    Span,
    canary_audit,
    candidate_sets,
    continuation_logprobs,
    default_tagger,
    encode_texts,
    epsilon_lower_bound,
    evaluate_tagger,
    extraction_attack,
    extraction_metrics,
    frame,
    inference_attack,
    insert_canaries,
    jax_privacy_bounds,
    lazy_extractability,
    make_canaries,
    make_corpus,
    make_queries,
    membership_scores,
    mia_attack,
    pick_candidate,
    pii_record_counts,
    rank_candidates,
    reconstruction_attack,
    roc_auc,
    roc_curve,
    roc_point,
    sample_candidates,
    sample_texts,
    score_texts,
    scrub,
    scrub_text,
    tpr_at_fpr_heldout,
    zipf_counts,
)
from attacks import blackbox  # noqa: E402
from snapaudit_jax.mechanisms.noise import gdp_epsilon  # noqa: E402
from snapaudit_jax.dpsgd import sequence_losses  # noqa: E402
from snapaudit_jax.models import LanguageModel, Tokenizer  # noqa: E402
from snapaudit_jax.models.config import GPT2Config  # noqa: E402
from snapaudit_jax.models.decoders import GPT2  # noqa: E402

ALPHA = 1e-6  # false-failure probability of each statistical check
BATCH = 8
SMALL = CorpusConfig(n_records=211, n_people=97, n_orgs=11, n_cities=7, seed=3)


# ---------------------------------------------------------------------------
# Fixtures: a small corpus, a byte-level BPE tokenizer, a tiny random GPT-2
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def corpus():
    return make_corpus(SMALL)


def _tokenizer(texts):
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    return Tokenizer(backend=tok, bos_id=None, eos_ids=(0,), pad_id=0)


@pytest.fixture(scope="module")
def lm(corpus):
    """``(model, tokenizer)``: random GPT-2 (width 32, 2 layers, 64 positions) and a BPE trained on the corpus."""
    tok = _tokenizer(corpus.texts + [c.text for c in make_canaries(CanaryConfig(n_canaries=50)).canaries])
    return _gpt2(tok, 7), tok


def _gpt2(tok, seed: int):
    cfg = GPT2Config(vocab_size=tok.vocab_size, n_positions=64, n_embd=32, n_layer=2, n_head=4, n_inner=64)
    return GPT2(cfg, nnx.Rngs(seed))


def _record(index: int, parts) -> Record:
    """A record from ``[str | (label, value)]`` parts, spans computed while joining."""
    text, spans = "", []
    for p in parts:
        if isinstance(p, tuple):
            spans.append(Span(len(text), len(text) + len(p[1]), p[0], p[1]))
            p = p[1]
        text += p
    return Record(index, "email", text, tuple(spans), (0, 1), 0)


SHORT = [
    _record(0, ["Dear ", ("PERSON", "Alice Smith"), ", call ", ("PERSON", "Bob Jones"), "."]),
    _record(1, ["Hi ", ("PERSON", "Carol White"), ", see ", ("ORG", "Lee LLC"), "."]),
    _record(2, ["Dear ", ("PERSON", "Dan Brown"), ", write ", ("PERSON", "Alice Smith"), "."]),
]


@functools.lru_cache(maxsize=4)
def _full_forward(graphdef):
    """Logits of one row of 64 tokens, all real, positions 0..63 (no padding, no mask, no cache)."""

    @jax.jit
    def logits(state, tokens):
        m = nnx.merge(graphdef, state)
        hidden, _ = m(tokens, jnp.arange(64)[None], jnp.ones((1, 64), bool))
        return m.logits(hidden)

    return logits


def _slow_logprobs(model, ids) -> np.ndarray:
    """Oracle: ``log p(ids[t] | ids[:t])`` for ``t >= 1`` by a per-token float64 loop over the logits of the
    sequence followed by filler tokens (by causality the filler cannot change earlier logits)."""
    graphdef, state = nnx.split(model)
    row = np.zeros((1, 64), np.int32)
    row[0, : len(ids)] = ids
    logits = np.asarray(_full_forward(graphdef)(state, jnp.asarray(row)), np.float64)[0]
    out = []
    for t in range(1, len(ids)):
        z = logits[t - 1] - logits[t - 1].max()
        out.append(z[ids[t]] - np.log(np.exp(z).sum()))
    return np.array(out)


# ---------------------------------------------------------------------------
# 1. Corpus
# ---------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------
# 2. Tagger and scrubbing
# ---------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------
# 3. Black-box API: scoring and sampling
# ---------------------------------------------------------------------------


def test_scores_match_slow_loop_training_loss_and_do_not_recompile(lm):
    model, tok = lm
    texts = [r.text for r in SHORT]
    got = score_texts(model, tok, texts, batch_size=BATCH)
    for i, t in enumerate(texts):
        oracle = _slow_logprobs(model, frame(tok, t))
        assert got.tokens[i] == len(oracle)
        np.testing.assert_allclose(got.nll[i], -oracle.sum(), rtol=1e-5)
    tokens, mask = encode_texts(tok, texts, 48)
    np.testing.assert_allclose(got.mean_nll, np.asarray(sequence_losses(model, jnp.asarray(tokens),
                                                                        jnp.asarray(mask))), rtol=1e-5)
    # Continuations: the same oracle on prefix + continuation tokens.
    lp = continuation_logprobs(model, tok, ["my pin is", "Dear"], [" 1234 5678", " Alice Smith"], batch_size=BATCH)
    for value, (p, c) in zip(lp, [("my pin is", " 1234 5678"), ("Dear", " Alice Smith")]):
        head = frame(tok, p, eos=False)
        oracle = _slow_logprobs(model, head + tok.encode_continuation(c))
        np.testing.assert_allclose(value, oracle[len(head) - 1:].sum(), rtol=1e-5)
    before = blackbox._logprob_kernel._cache_size()
    score_texts(model, tok, ["Hi Carol White.", "Dear Bob Jones, call Dan Brown."], batch_size=BATCH)
    assert blackbox._logprob_kernel._cache_size() == before


def test_top1_sampling_is_greedy_decoding(lm):
    """Oracle: LanguageModel.generate (greedy) on the same framed prompts."""
    model, tok = lm
    prompts = ["", "Dear", "my pin is"]
    ids = blackbox._sample_ids(model, tok, prompts, jax.random.key(0), top_k=1, max_new_tokens=12,
                               temperature=1.0, batch_size=BATCH)
    greedy = LanguageModel("tiny", model.cfg, model, tok, data_parallel=False).generate(
        [frame(tok, p, eos=False) for p in prompts], max_new_tokens=12, batch_size=BATCH)
    for mine, g in zip(ids, greedy):
        expected = [t for t in g.token_ids]
        if 0 in expected:
            expected = expected[: expected.index(0)]
        assert mine == expected


def test_topk_sampler_draws_the_truncated_softmax(lm):
    """First tokens of 1600 unconditional samples with k = 5, at temperatures 1 and 1/2: none outside the top 5,
    and a chi-square test against the renormalised top-5 probabilities at that temperature (false failure
    < ALPHA each). Power: each sample set rejects the other temperature's distribution (expected p-values
    ~1e-35). Batching does not change the draws."""
    model, tok = lm
    k, n = 5, 1600
    hidden, _ = model(jnp.asarray([[0]]), jnp.zeros((1, 1), jnp.int32), jnp.ones((1, 1), bool))
    logits = np.asarray(model.logits(hidden[:, -1]), np.float64)[0]
    top = np.argsort(-logits)[:k]

    def law(temperature):
        p = np.exp((logits[top] - logits[top].max()) / temperature)
        return p / p.sum()

    for temperature, other in ((1.0, 0.5), (0.5, 1.0)):
        ids = blackbox._sample_ids(model, tok, [""] * n, jax.random.key(1), top_k=k, max_new_tokens=1,
                                   temperature=temperature, batch_size=32)
        first = np.array([row[0] if row else 0 for row in ids])  # an empty row drew the EOS token 0
        assert set(first.tolist()) <= set(top.tolist())
        observed = np.array([(first == t).sum() for t in top])
        assert stats.chisquare(observed, n * law(temperature)).pvalue > ALPHA
        assert stats.chisquare(observed, n * law(other)).pvalue < ALPHA
    again = sample_texts(model, tok, [""] * 12, jax.random.key(1), top_k=k, max_new_tokens=1, temperature=0.5,
                         batch_size=BATCH)
    assert again == [tok.decode(r) for r in ids[:12]]


# ---------------------------------------------------------------------------
# 4. Extraction
# ---------------------------------------------------------------------------


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


class _FixedTagger:
    """Test tagger: sample ``i`` holds one PERSON slot at offset ``min(4, len)``, valued ``values[i % n]``."""

    def __init__(self, values):
        self.values = values

    def tag(self, texts):
        return [[Span(min(4, len(t)), min(4, len(t)), "PERSON", self.values[i % len(self.values)])]
                for i, t in enumerate(texts)]


def test_extraction_attack_and_lazy_estimate(lm):
    model, tok = lm
    tagger = _FixedTagger(["Alice Smith", "Zed Moe", "Alice Smith"])
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


# ---------------------------------------------------------------------------
# 5. Reconstruction and inference
# ---------------------------------------------------------------------------


def test_queries_mask_the_target_and_fill_the_rest():
    qs = make_queries(SHORT, "PERSON", jax.random.key(0), fill="mask")
    assert [(q.record, q.truth) for q in qs] == [(0, "Alice Smith"), (0, "Bob Jones"), (1, "Carol White"),
                                                 (2, "Dan Brown"), (2, "Alice Smith")]
    assert qs[1].text == f"Dear {MASK}, call {T_MASK}." and qs[1].filled("X Y") == f"Dear {MASK}, call X Y."
    pub = make_queries(SHORT, "PERSON", jax.random.key(0), fill="public")
    assert pub == make_queries(SHORT, "PERSON", jax.random.key(0), fill="public")
    assert pub[0].prefix == "Dear " and pub[0].suffix.startswith(", call ") and "Bob Jones" not in pub[0].suffix
    assert len(make_queries(SHORT, "PERSON", jax.random.key(0), max_queries=2)) == 2
    assert PublicFiller(1).value("DATE", "3 May 2001").split()[1].isalpha()


def test_pick_candidate_tie_rule():
    assert pick_candidate(["b", "a", "c"], [1.0, 1.0, 2.0]) == ("a", 2)
    assert pick_candidate(["a", "b", "c"], [1.0, 1.0, 2.0]) == ("a", 2)  # order-free
    assert pick_candidate(["b", "a"], [0.5, 1.0]) == ("b", 1)
    assert pick_candidate([], []) == (None, 0)


def test_ranking_picks_the_lowest_slow_loop_perplexity(lm):
    model, tok = lm
    qs = make_queries(SHORT, "PERSON", jax.random.key(0), fill="mask")[:2]
    cands = [["Bob Jones", "Alice Smith", "Zed Moe", "Carol White"], ["Dan Brown", "Bob Jones", "Bob  Jones"]]
    ranked = rank_candidates(model, tok, qs, cands, batch_size=BATCH)
    assert ranked[1]["candidates"] == ["Dan Brown", "Bob Jones"]  # normalised and deduplicated
    for q, r in zip(qs, ranked):
        ppl = [np.exp(-_slow_logprobs(model, frame(tok, q.filled(c))).mean()) for c in r["candidates"]]
        np.testing.assert_allclose(r["perplexity"], ppl, rtol=1e-5)
        assert r["prediction"] == r["candidates"][int(np.argmin(ppl))] and r["tied"] == 1


def test_reconstruction_attack_end_to_end(lm):
    model, tok = lm
    cfg = ReconstructionConfig(n_samples=4, top_k=5, max_new_tokens=12, fill="mask", batch_size=BATCH)
    qs = make_queries(SHORT, "PERSON", jax.random.fold_in(jax.random.key(4), 0), fill="mask")
    oracle_cands = [["Alice Smith", "Bob Jones"]] * len(qs)

    class _After(_FixedTagger):  # tags its value at the end of prompt + continuation: always a candidate
        def tag(self, texts):
            return [[Span(len(t), len(t), "PERSON", self.values[i % 2])] for i, t in enumerate(texts)]

    class _Nothing:
        def tag(self, texts):
            return [[] for _ in texts]

    after = _After(["Alice Smith", "Bob Jones"])
    cands = sample_candidates(model, tok, qs, cfg, jax.random.key(5), tagger=after)
    assert cands == oracle_cands  # 2 samples each, most frequent first, then lexicographic
    out = reconstruction_attack(model, tok, SHORT, cfg, jax.random.key(4), tagger=after, baseline_model=model)
    expected = rank_candidates(model, tok, qs, oracle_cands, batch_size=BATCH)
    assert [it["prediction"] for it in out["items"]] == [r["prediction"] for r in expected]
    correct = [it["prediction"] == it["truth"] for it in out["items"]]
    assert out["accuracy"] == pytest.approx(np.mean(correct)) and out["n_queries"] == 5
    assert out["coverage"] == pytest.approx(3 / 5)  # Alice twice, Bob once among 5 targets
    assert out["baseline_accuracy"] == out["accuracy"]  # the same model as baseline
    # A tagger that finds nothing: no candidates, accuracy 0.
    empty = reconstruction_attack(model, tok, SHORT, cfg, jax.random.key(4), tagger=_Nothing())
    assert empty["accuracy"] == 0.0 and all(it["prediction"] is None for it in empty["items"])


def test_inference_candidate_sets_and_attack(lm):
    model, tok = lm
    pool = ["Alice Smith", "Bob Jones", "Carol White", "Dan Brown", "Eve Adams", "Fay Hill", "Gus Lee"]
    sets = candidate_sets(["Alice Smith", "Zed Moe"], pool, 5, jax.random.key(0))
    for truth, s in zip(["Alice Smith", "Zed Moe"], sets):
        assert truth in s and len(set(s)) == 5 and set(s) - {truth} <= set(pool)
    assert sets == candidate_sets(["Alice Smith", "Zed Moe"], pool, 5, jax.random.key(0))
    with pytest.raises(ValueError, match="n_candidates=9 needs a pool of at least 8"):
        candidate_sets(["Alice Smith"], pool, 9, jax.random.key(0))
    cfg = InferenceConfig(n_candidates=5, fill="mask", batch_size=BATCH)
    out = inference_attack(model, tok, SHORT, cfg, jax.random.key(6), candidate_pool=pool)
    qs = make_queries(SHORT, "PERSON", jax.random.fold_in(jax.random.key(6), 0), fill="mask")
    sets = candidate_sets([q.truth for q in qs], pool, 5, jax.random.fold_in(jax.random.key(6), 1))
    expected = rank_candidates(model, tok, qs, sets, batch_size=BATCH)
    assert [it["prediction"] for it in out["items"]] == [r["prediction"] for r in expected]
    assert out["coverage"] == 1.0 and out["chance"] == 0.2


def test_inference_plays_every_size_from_the_training_pool(lm):
    """Several |C| on the same queries; default distractors: the records' own PII, the truth exactly once."""
    model, tok = lm
    records = SHORT + [_record(3 + i, ["Hi ", ("PERSON", n), "."]) for i, n in
                       enumerate(["Eve Adams", "Fay Hill", "Gus Lee", "Hal Ito", "Ida Kay"])]
    pool = sorted({s.value for r in records for s in r.spans if s.label == "PERSON"})
    baseline = _gpt2(tok, 11)  # another random model: its predictions differ from model's
    cfg = InferenceConfig(n_candidates=(3, 6), fill="mask", batch_size=BATCH)
    out = inference_attack(model, tok, records, cfg, jax.random.key(6), baseline_model=baseline)
    qs = make_queries(records, "PERSON", jax.random.fold_in(jax.random.key(6), 0), fill="mask")
    assert [g["n_candidates"] for g in out["by_size"]] == [3, 6] and out["n_candidates"] == 3
    seen_disagreement = False
    for i, size in enumerate((3, 6)):
        k = jax.random.fold_in(jax.random.key(6), 1)
        sets = candidate_sets([q.truth for q in qs], pool, size, k if i == 0 else jax.random.fold_in(k, size))
        for q, cands in zip(qs, sets):
            assert cands.count(q.truth) == 1 and len(cands) == size and set(cands) <= set(pool)
        mine = rank_candidates(model, tok, qs, sets, batch_size=BATCH)
        base = rank_candidates(baseline, tok, qs, sets, batch_size=BATCH)
        game = out["by_size"][i]
        correct = np.array([m["prediction"] == q.truth for m, q in zip(mine, qs)])
        base_ok = np.array([b["prediction"] == q.truth for b, q in zip(base, qs)])
        agree = np.array([b["prediction"] == m["prediction"] for b, m in zip(base, mine)])
        assert game["accuracy"] == pytest.approx(correct.mean())
        assert game["baseline_accuracy"] == pytest.approx(base_ok.mean())
        assert game["n_excluding_baseline"] == int((~base_ok).sum())
        if (~base_ok).any():
            assert game["accuracy_excluding_baseline"] == pytest.approx(correct[~base_ok].mean())
        if (~agree).any():
            seen_disagreement = True
            assert game["accuracy_excluding_agreement"] == pytest.approx(correct[~agree].mean())
        assert game["chance"] == pytest.approx(1 / size)
    assert out["accuracy"] == out["by_size"][0]["accuracy"] and "items" in out and "items" in out["by_size"][1]
    assert seen_disagreement  # the agreement rule was exercised, not skipped
    with pytest.raises(ValueError, match="n_candidates=10 needs a pool of at least 9"):
        inference_attack(model, tok, records, InferenceConfig(n_candidates=(3, 10), fill="mask"), jax.random.key(6))
    for bad, match in [((), "at least one set size"), ((3, 3), "must not repeat"), ((3, 1), r"n_candidates\[...\]")]:
        with pytest.raises(ValueError, match=match):
            InferenceConfig(n_candidates=bad).validate()


def test_mia_reference_attack_subtracts_the_reference_loss(lm):
    """Likelihood-ratio score: -(target loss - reference loss), oracle from score_texts of both models."""
    model, tok = lm
    reference = _gpt2(tok, 11)
    members, nonmembers = [r.text for r in SHORT], ["Hi Eve Adams.", "Dear Fay Hill, call Gus Lee.", "Ok."]
    out = mia_attack(model, tok, members, nonmembers, jax.random.key(0), reference_model=reference, fprs=(0.5,),
                     batch_size=BATCH)
    want = (-score_texts(model, tok, members, batch_size=BATCH).mean_nll
            + score_texts(reference, tok, members, batch_size=BATCH).mean_nll)
    np.testing.assert_allclose(out["member_scores"], want, rtol=1e-5)
    plain = mia_attack(model, tok, members, nonmembers, jax.random.key(0), fprs=(0.5,), batch_size=BATCH)
    assert not np.allclose(out["member_scores"], plain["member_scores"])
    assert out["score"] == "-(loss - reference loss)" and plain["score"] == "-loss"


# ---------------------------------------------------------------------------
# 6. Membership inference
# ---------------------------------------------------------------------------


def test_roc_auc_and_curve_match_sklearn():
    rng = np.random.default_rng(0)
    for n1, n0 in [(7, 11), (31, 3), (101, 97)]:
        m, n = rng.integers(0, 6, n1).astype(float), rng.integers(0, 5, n0).astype(float)  # many ties
        y = np.r_[np.ones(n1), np.zeros(n0)]
        assert roc_auc(m, n) == pytest.approx(sklearn_metrics.roc_auc_score(y, np.r_[m, n]), abs=1e-12)
        fpr, tpr, th = roc_curve(m, n)
        sf, st, sth = sklearn_metrics.roc_curve(y, np.r_[m, n], drop_intermediate=False)
        np.testing.assert_allclose(fpr, sf)
        np.testing.assert_allclose(tpr, st)
        np.testing.assert_allclose(th[1:], sth[1:])
    assert roc_auc([1.0, 1.0], [1.0]) == 0.5


def test_extraction_against_tagged_training_pii(lm):
    """Table III's variant: the training PII is what the tagger finds, not the ground-truth spans."""
    model, tok = lm
    tagger = _FixedTagger(["Alice Smith", "Zed Moe", "Alice Smith"])
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


def test_low_fpr_points_are_empirical_and_heldout():
    cal = np.arange(100.0)  # calibration non-members 0..99
    out = tpr_at_fpr_heldout(np.array([94.0, 94.5, 96.0, 120.0]), np.array([95.0, 10.0]), cal, 0.05)
    # k = 5 flagged at most: threshold is the 6th largest (94), rule score > 94.
    assert out["threshold"] == 94.0 and out["tpr"] == 0.75 and out["fpr"] == 0.5
    assert np.sum(cal > out["threshold"]) <= 5
    point = roc_point([3.0, 2.0, 1.0], [0.0, 2.5, -1.0, -2.0], 0.25)
    assert (point["tpr"], point["fpr"], point["threshold"]) == (1.0, 0.25, 1.0)  # members >= 1: all three


def test_mia_attack_scores_are_minus_training_loss(lm):
    model, tok = lm
    members, nonmembers = [r.text for r in SHORT], ["Hi Eve Adams.", "Dear Fay Hill, call Gus Lee.", "Ok."]
    out = mia_attack(model, tok, members, nonmembers, jax.random.key(0), fprs=(0.5,), batch_size=BATCH)
    np.testing.assert_allclose(out["member_scores"], -score_texts(model, tok, members, batch_size=BATCH).mean_nll)
    assert out["auc"] == pytest.approx(roc_auc(out["member_scores"], out["nonmember_scores"]))
    assert out["heldout"][0]["n_calibration"] + out["heldout"][0]["n_nonmembers_eval"] == 3
    ref = membership_scores(model, tok, members, reference_model=model, batch_size=BATCH)
    np.testing.assert_allclose(ref, 0.0, atol=1e-6)


# ---------------------------------------------------------------------------
# 7. Canary audit
# ---------------------------------------------------------------------------


def test_fixed_threshold_bound_equals_jax_privacy():
    rng = np.random.default_rng(1)
    m, n = rng.normal(2.0, 1.0, 301), rng.normal(0.0, 1.0, 293)
    from jax_privacy import auditing

    for t in (0.5, 1.3, 2.9):
        ours = epsilon_lower_bound(m, n, delta=1e-5, alpha=0.05, thresholds=[t])["std"]["epsilon_std"]
        theirs = auditing.CanaryScoreAuditor(m, n).epsilon_clopper_pearson(
            0.05, 1e-5, one_sided=False, threshold_strategy=auditing.Explicit(t))
        assert ours == pytest.approx(theirs, rel=1e-9, abs=1e-12)


def _naive_epsilon(m, n, delta):
    """Plug-in rates, threshold chosen on the same scores (pitfalls 1 and 4): not a bound."""
    t = np.unique(np.r_[m, n])
    tpr = (m[None, :] >= t[:, None]).mean(1)
    fpr = np.maximum((n[None, :] >= t[:, None]).mean(1), 1 / len(n))
    return float(np.max(np.log(np.maximum(tpr - delta, 1e-300) / fpr)))


def test_canary_bounds_are_valid_for_a_gaussian_mechanism():
    """Member scores N(mu, 1), non-member scores N(0, 1): the test is a mu-GDP mechanism, so its true epsilon
    at delta is gdp_epsilon(mu, delta). In each regime, over R = 200 independent audits each bound exceeds it
    with probability <= alpha = 0.05; the check allows c violations with P(Binomial(R, alpha) > c) < ALPHA.
    Power: the naive plug-in estimator (threshold and rates from the same scores, no confidence bound) violates
    in most runs of the first regime. (mu = 1, 150 canaries puts the GDP bound close to the truth.)"""
    delta, alpha, reps = 1e-3, 0.05, 200
    limit = int(stats.binom.isf(ALPHA, reps, alpha))
    grid = np.linspace(-1.0, 4.0, 11)
    for regime, (mu, size) in enumerate([(0.5, 400), (1.0, 150)]):
        true_eps = gdp_epsilon(mu, delta)
        rng = np.random.default_rng(regime)
        viol = {"split_std": 0, "split_gdp": 0, "grid_std": 0, "grid_gdp": 0, "naive": 0}
        for r in range(reps):
            m, n = rng.normal(mu, 1.0, size), rng.normal(0.0, 1.0, size)
            split = epsilon_lower_bound(m, n, delta=delta, alpha=alpha, key=jax.random.key(r))
            fixed = epsilon_lower_bound(m, n, delta=delta, alpha=alpha, thresholds=grid)
            viol["split_std"] += split["std"]["epsilon_std"] > true_eps
            viol["split_gdp"] += split["gdp"]["epsilon_gdp"] > true_eps
            viol["grid_std"] += fixed["std"]["epsilon_std"] > true_eps
            viol["grid_gdp"] += fixed["gdp"]["epsilon_gdp"] > true_eps
            viol["naive"] += _naive_epsilon(m, n, delta) > true_eps
        assert all(viol[k] <= limit for k in viol if k != "naive"), (mu, viol, limit, true_eps)
        if regime == 0:
            assert viol["naive"] > limit, viol


def test_canary_bound_has_power_and_cross_checks():
    rng = np.random.default_rng(3)
    m, n = rng.normal(6.0, 1.0, 500), rng.normal(0.0, 1.0, 500)
    out = epsilon_lower_bound(m, n, delta=1e-5, alpha=0.05, key=jax.random.key(0))
    assert out["std"]["epsilon_std"] > 3.0 and out["gdp"]["epsilon_gdp"] > 8.0
    same = epsilon_lower_bound(n, n, delta=1e-5, alpha=0.05, key=jax.random.key(0))
    assert same["std"]["epsilon_std"] < 1.0 and same["gdp"]["epsilon_gdp"] < 1.0
    jp = jax_privacy_bounds(m, n, delta=1e-5, alpha=0.05, insert_probability=0.5)
    assert set(jp) == {"cp_split", "cp_bonferroni", "one_run", "auroc"}
    assert jp["cp_split"] > 3.0 and jp["one_run"] > 1.0
    assert abs(jp["auroc"] - roc_auc(m, n)) <= 2 / (500 * 500)  # its interpolated ROC differs by a pair or so


def test_canary_audit_on_a_model(lm):
    model, tok = lm
    cs = make_canaries(CanaryConfig(n_canaries=24, repetitions=(1, 2), seed=1))
    out = canary_audit(model, tok, cs, CanaryAuditConfig(delta=1e-5, batch_size=BATCH), jax.random.key(0))
    lp = continuation_logprobs(model, tok, [c.prefix for c in cs.canaries], [c.continuation for c in cs.canaries],
                               batch_size=BATCH)
    np.testing.assert_allclose(out["scores"], lp)
    assert [g["repetitions"] for g in out["groups"]] == [1, 2]
    for g in out["groups"]:
        reps = np.array(out["repetitions"])
        mem = np.array(out["scores"])[np.array(out["inserted"]) & (reps == g["repetitions"])]
        assert g["n_members"] == len(mem) and g["auc"] == pytest.approx(roc_auc(mem, lp[~cs.inserted]))
        assert g["bounds"]["std"]["epsilon_std"] >= 0.0 and g["jax_privacy"]["one_run"] >= 0.0
        # our one-run bound: exactly this group's canaries (by index) with their coins, the declared default grid
        group = reps == g["repetitions"]
        want = one_run_audit(lp[group], cs.inserted[group], insert_probability=0.5, delta=1e-5, alpha=0.05)
        assert g["one_run"] == want.to_dict() and g["one_run"]["canaries"] == int(group.sum()) == 12


def test_one_run_bound_needs_fair_coin_insertion():
    """Why the one-run bound is refused for ``insert_probability != 1/2`` (pitfall 11). No leakage: every
    canary scores N(0, 1), inserted or not, so the true epsilon is 0 and a valid bound is > 0 in at most
    alpha = 0.05 of runs. With each of 1000 canaries inserted with p = 0.8, jax_privacy's ``epsilon_one_run``
    (alpha 0.05, delta 1e-5) is > 0 in more than c = binom.isf(ALPHA, R, alpha) = 18 of R = 100 runs: a bound
    valid at level alpha would get there with probability < ALPHA, so passing shows the refusal is needed.
    Measured beforehand: 400/400 runs at p = 0.8 (median eps 1.23), so the check fails spuriously with
    probability P(Binomial(100, 0.9) <= 18) < 1e-60. Contrast, same scores at p = 1/2 (the design): measured
    214/4000 = 5.35% (slightly above nominal, a known separate issue of jax_privacy); here asserted below R / 2,
    which fails spuriously with probability P(Binomial(100, 0.0535) >= 50) < 1e-30. With this seed: 100/100
    runs above 0 at p = 0.8 (median eps 1.23), 4/100 at p = 1/2."""
    from jax_privacy import auditing

    alpha, delta, runs, n = 0.05, 1e-5, 100, 1000
    limit = int(stats.binom.isf(ALPHA, runs, alpha))
    rng = np.random.default_rng(2023)
    scores = rng.normal(size=(2, runs, n))  # no leakage: one law for members and non-members
    coins = rng.random((2, runs, n))
    above = {}
    for i, p in enumerate((0.8, 0.5)):
        inserted = coins[i] < p
        eps = np.array([auditing.CanaryScoreAuditor(s[m], s[~m]).epsilon_one_run(alpha, delta)
                        for s, m in zip(scores[i], inserted)])
        above[p] = int((eps > 0).sum())
    assert above[0.8] > limit, (above, limit)
    assert above[0.5] < runs // 2, (above, limit)


def test_one_run_bound_refuses_unfair_insertion(lm):
    """jax_privacy_bounds and canary_audit (with jax_privacy) refuse p != 1/2 before any scoring; with
    jax_privacy off the Clopper-Pearson bounds (conditional on membership) still run at p = 0.8."""
    rng = np.random.default_rng(5)
    m, n = rng.normal(0.0, 1.0, 53), rng.normal(0.0, 1.0, 47)
    for p in (0.8, 0.3):
        with pytest.raises(ValueError, match=rf"insert_probability must be 1/2 for jax_privacy's one-run bound "
                                             rf"\(Steinke et al. 2023 .*\), got {p}; insert with probability 0.5"):
            jax_privacy_bounds(m, n, delta=1e-5, insert_probability=p)
    with pytest.raises(TypeError, match="insert_probability"):  # required: the scores cannot tell the design
        jax_privacy_bounds(m, n, delta=1e-5)
    with pytest.raises(ValueError, match=r"insert_probability must be in \(0, 1\), got 1.5"):
        jax_privacy_bounds(m, n, delta=1e-5, insert_probability=1.5)
    unfair = make_canaries(CanaryConfig(n_canaries=24, insert_probability=0.8, seed=1))
    assert unfair.insert_probability == 0.8 and make_canaries(CanaryConfig()).insert_probability == 0.5
    with pytest.raises(ValueError, match=r"insert_probability must be 1/2 .*got 0.8"):
        canary_audit(None, None, unfair, CanaryAuditConfig(), jax.random.key(0))  # no model: refused first
    with pytest.raises(ValueError, match=r"insert_probability must be 1/2 for an \(eps, delta\) claim .*got "
                                         r"insert_probability=0.8 with delta=1e-05"):  # our one-run bound, too
        canary_audit(None, None, unfair, CanaryAuditConfig(jax_privacy=False), jax.random.key(0))
    model, tok = lm
    out = canary_audit(model, tok, unfair, CanaryAuditConfig(batch_size=BATCH, jax_privacy=False, one_run=False),
                       jax.random.key(0))
    (group,) = out["groups"]
    assert group["jax_privacy"] is None and group["bounds"]["std"]["epsilon_std"] >= 0.0
    assert group["one_run"] is None


# ---------------------------------------------------------------------------
# 8. Bad input
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("call, match", [
    (lambda: CorpusConfig(n_records=0).validate(), r"n_records must be an integer >= 1, got 0"),
    (lambda: CorpusConfig(zipf_exponent=-1.0).validate(), r"zipf_exponent must be a finite number >= 0, got -1.0"),
    (lambda: CorpusConfig(n_records=10, n_people=5, zipf_exponent=3.0).validate(),
     r"zipf_exponent=3.0 puts the most frequent person in \d+ records, more than n_records=10"),
    (lambda: CorpusConfig(email_fraction=1.5).validate(), r"email_fraction must be in \[0, 1\], got 1.5"),
    (lambda: CanaryConfig(template="no secret here").validate(), r"template must contain '\{secret\}' exactly once"),
    (lambda: CanaryConfig(insert_probability=1.0).validate(), r"insert_probability must be in \(0, 1\), got 1.0"),
    (lambda: ExtractionConfig(top_k=0).validate(), r"top_k must be an integer >= 1, got 0"),
    (lambda: ExtractionConfig(labels=("NAME",)).validate(), r"labels\[\.\.\.\] must be one of .*got 'NAME'"),
    (lambda: ReconstructionConfig(fill="zeros").validate(), r"fill must be one of 'public', 'mask', got 'zeros'"),
    (lambda: InferenceConfig(n_candidates=1).validate(), r"n_candidates must be an integer >= 2, got 1"),
    (lambda: CanaryAuditConfig(selection="bonferroni").validate(), r"thresholds must be a non-empty grid"),
    (lambda: epsilon_lower_bound([1.0, 2.0], [0.0, 1.0], delta=0.0, key=jax.random.key(0)),
     r"delta must be in \(0, 1\), got 0.0"),
    (lambda: epsilon_lower_bound([1.0, 2.0], [0.0, 1.0], delta=1e-5), r"key must be a PRNG key"),
    (lambda: roc_auc([1.0, np.nan], [0.0]), r"member_scores must be finite"),
    (lambda: tpr_at_fpr_heldout([1.0], [0.0], [0.0, 1.0], 1.5), r"fpr must be in \(0, 1\), got 1.5"),
    (lambda: extraction_metrics([("PERSON",)], []), r"generated must hold \(label, string\) pairs"),
    (lambda: evaluate_tagger([[]], []), r"same length, got 1 and 0"),
    (lambda: PublicFiller(0).value("NAME"), r"label must be one of PERSON, .*got 'NAME'"),
])
def test_bad_input_names_field_rule_and_value(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_bad_model_inputs_name_the_limit(lm):
    model, tok = lm
    with pytest.raises(ValueError, match=r"top_k must be <= the vocabulary size \d+, got 100000"):
        sample_texts(model, tok, [""], jax.random.key(0), top_k=100000)
    with pytest.raises(ValueError, match=r"prompts\[0\] has \d+ tokens; with max_new_tokens=64 that exceeds"):
        sample_texts(model, tok, ["Dear Alice"], jax.random.key(0), max_new_tokens=64)
    with pytest.raises(ValueError, match=r"texts\[0\] has \d+ tokens framed, more than length=4"):
        encode_texts(tok, ["Dear Alice Smith"], 4)
    with pytest.raises(ValueError, match=r"give at most one of baseline_model and baseline_pii"):
        extraction_attack(model, tok, SHORT, ExtractionConfig(), jax.random.key(0), baseline_model=model,
                          baseline_pii=[])
