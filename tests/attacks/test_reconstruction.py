"""PII reconstruction (:mod:`attacks.reconstruction`, Algorithm 6): query masking, the tie rule, the ranking
against per-token float64 perplexities, and the attack end to end against its own steps.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("faker")

from attacks import (  # noqa: E402
    MASK,
    T_MASK,
    PublicFiller,
    ReconstructionConfig,
    Span,
    frame,
    make_queries,
    pick_candidate,
    rank_candidates,
    reconstruction_attack,
    sample_candidates,
)
from tests.helpers.attack_lm import (  # noqa: E402
    BATCH,
    SHORT,
    FixedTagger,
    slow_logprobs,
    small_lm,
)


@pytest.fixture(scope="module")
def lm():
    """``(model, tokenizer)``: random GPT-2 (width 32, 2 layers, 64 positions) and a BPE trained on the small
    corpus."""
    return small_lm()


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
        ppl = [np.exp(-slow_logprobs(model, frame(tok, q.filled(c))).mean()) for c in r["candidates"]]
        np.testing.assert_allclose(r["perplexity"], ppl, rtol=1e-5)
        assert r["prediction"] == r["candidates"][int(np.argmin(ppl))] and r["tied"] == 1


def test_reconstruction_attack_end_to_end(lm):
    model, tok = lm
    cfg = ReconstructionConfig(n_samples=4, top_k=5, max_new_tokens=12, fill="mask", batch_size=BATCH)
    qs = make_queries(SHORT, "PERSON", jax.random.fold_in(jax.random.key(4), 0), fill="mask")
    oracle_cands = [["Alice Smith", "Bob Jones"]] * len(qs)

    class _After(FixedTagger):  # tags its value at the end of prompt + continuation: always a candidate
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


@pytest.mark.parametrize("call, match", [
    (lambda: ReconstructionConfig(fill="zeros").validate(), r"fill must be one of 'public', 'mask', got 'zeros'"),
])
def test_bad_input_names_field_rule_and_value(call, match):
    with pytest.raises(ValueError, match=match):
        call()
