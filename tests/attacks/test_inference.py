"""PII inference over a candidate set (:mod:`attacks.inference`): candidate sets holding the truth once, and
every game's accuracies recomputed from :func:`attacks.reconstruction.rank_candidates` of the target and the
baseline model.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("faker")

from attacks import (  # noqa: E402
    InferenceConfig,
    candidate_sets,
    inference_attack,
    make_queries,
    rank_candidates,
)
from tests.helpers.attack_lm import (  # noqa: E402
    BATCH,
    SHORT,
    gpt2,
    record,
    small_lm,
)


@pytest.fixture(scope="module")
def lm():
    """``(model, tokenizer)``: random GPT-2 (width 32, 2 layers, 64 positions) and a BPE trained on the small
    corpus."""
    return small_lm()


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
    records = SHORT + [record(3 + i, ["Hi ", ("PERSON", n), "."]) for i, n in
                       enumerate(["Eve Adams", "Fay Hill", "Gus Lee", "Hal Ito", "Ida Kay"])]
    pool = sorted({s.value for r in records for s in r.spans if s.label == "PERSON"})
    baseline = gpt2(tok, 11)  # another random model: its predictions differ from model's
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


def test_a_baseline_cache_scores_the_baselines_sets_once_and_changes_nothing(lm, monkeypatch):
    """Variants of one experiment play the same sets: with a shared cache the baseline ranks them once; the
    results equal the uncached call's, and other queries miss the cache (it is keyed by content)."""
    import attacks.inference as inference

    model, tok = lm
    records = SHORT + [record(3 + i, ["Hi ", ("PERSON", n), "."]) for i, n in
                       enumerate(["Eve Adams", "Fay Hill", "Gus Lee", "Hal Ito"])]
    baseline = gpt2(tok, 11)
    cfg = InferenceConfig(n_candidates=(3, 4), fill="mask", batch_size=BATCH)
    plain = inference_attack(model, tok, records, cfg, jax.random.key(6), baseline_model=baseline)
    calls = []
    rank = inference.rank_candidates
    monkeypatch.setattr(inference, "rank_candidates", lambda m, *a, **k: calls.append(m) or rank(m, *a, **k))
    cache: dict = {}
    first = inference_attack(model, tok, records, cfg, jax.random.key(6), baseline_model=baseline,
                             baseline_cache=cache)
    second = inference_attack(model, tok, records, cfg, jax.random.key(6), baseline_model=baseline,
                              baseline_cache=cache)
    assert first == second == plain
    assert [m is baseline for m in calls] == [False, True, False, True, False, False]  # 2 sizes; then cached
    assert len(cache) == 2
    inference_attack(model, tok, records, cfg, jax.random.key(7), baseline_model=baseline, baseline_cache=cache)
    assert len(cache) == 4 and sum(m is baseline for m in calls) == 4  # other queries and sets: scored again


@pytest.mark.parametrize("call, match", [
    (lambda: InferenceConfig(n_candidates=1).validate(), r"n_candidates must be an integer >= 2, got 1"),
])
def test_bad_input_names_field_rule_and_value(call, match):
    with pytest.raises(ValueError, match=match):
        call()
