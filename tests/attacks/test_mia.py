"""Membership inference (:mod:`attacks.mia`): ROC AUC and curve against ``sklearn.metrics``, the empirical
low-FPR points on hand-built scores, and the loss and reference-model scores against
:func:`attacks.blackbox.score_texts`.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("faker")
sklearn_metrics = pytest.importorskip("sklearn.metrics")

from attacks import (  # noqa: E402
    membership_scores,
    mia_attack,
    roc_auc,
    roc_curve,
    roc_point,
    score_texts,
    tpr_at_fpr_heldout,
)
from tests.helpers.attack_lm import (  # noqa: E402
    BATCH,
    SHORT,
    gpt2,
    small_lm,
)


@pytest.fixture(scope="module")
def lm():
    """``(model, tokenizer)``: random GPT-2 (width 32, 2 layers, 64 positions) and a BPE trained on the small
    corpus."""
    return small_lm()


def test_mia_reference_attack_subtracts_the_reference_loss(lm):
    """Likelihood-ratio score: -(target loss - reference loss), oracle from score_texts of both models."""
    model, tok = lm
    reference = gpt2(tok, 11)
    members, nonmembers = [r.text for r in SHORT], ["Hi Eve Adams.", "Dear Fay Hill, call Gus Lee.", "Ok."]
    out = mia_attack(model, tok, members, nonmembers, jax.random.key(0), reference_model=reference, fprs=(0.5,),
                     batch_size=BATCH)
    want = (-score_texts(model, tok, members, batch_size=BATCH).mean_nll
            + score_texts(reference, tok, members, batch_size=BATCH).mean_nll)
    np.testing.assert_allclose(out["member_scores"], want, rtol=1e-5)
    plain = mia_attack(model, tok, members, nonmembers, jax.random.key(0), fprs=(0.5,), batch_size=BATCH)
    assert not np.allclose(out["member_scores"], plain["member_scores"])
    assert out["score"] == "-(loss - reference loss)" and plain["score"] == "-loss"


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


def test_cached_losses_give_the_same_scores_and_are_scored_once(lm, monkeypatch):
    """The loss and reference attacks of one variant share the target's losses, and variants share the
    reference's: the scores equal the uncached ones, and each (model, texts) pair is scored once; other texts
    miss the cache (power: a cache keyed by model only would answer them with the wrong losses)."""
    import attacks.mia as mia

    model, tok = lm
    reference = gpt2(tok, 11)
    members, nonmembers = [r.text for r in SHORT], ["Hi Eve Adams.", "Dear Fay Hill, call Gus Lee.", "Ok."]
    plain = mia_attack(model, tok, members, nonmembers, jax.random.key(0), reference_model=reference, fprs=(0.5,),
                       batch_size=BATCH)
    calls = []
    real = mia.score_texts
    monkeypatch.setattr(mia, "score_texts", lambda m, t, texts, **kw: calls.append(
        ("target" if m is model else "reference", tuple(texts))) or real(m, t, texts, **kw))
    own, ref = {}, {}
    for _ in range(2):
        loss = mia_attack(model, tok, members, nonmembers, jax.random.key(0), fprs=(0.5,), batch_size=BATCH,
                          cache=own)
        both = mia_attack(model, tok, members, nonmembers, jax.random.key(0), reference_model=reference,
                          fprs=(0.5,), batch_size=BATCH, cache=own, reference_cache=ref)
    assert both["member_scores"] == plain["member_scores"]
    assert both["nonmember_scores"] == plain["nonmember_scores"]
    np.testing.assert_allclose(loss["member_scores"], -score_texts(model, tok, members, batch_size=BATCH).mean_nll)
    assert sorted(calls) == sorted((m, tuple(t)) for m in ("target", "reference") for t in (members, nonmembers))
    other = nonmembers[::-1]
    got = membership_scores(model, tok, other, reference_model=reference, batch_size=BATCH, cache=own,
                            reference_cache=ref)
    assert len(calls) == 6
    np.testing.assert_allclose(got, membership_scores(model, tok, other, reference_model=reference,
                                                      batch_size=BATCH), rtol=1e-6)


@pytest.mark.parametrize("call, match", [
    (lambda: roc_auc([1.0, np.nan], [0.0]), r"member_scores must be finite"),
    (lambda: tpr_at_fpr_heldout([1.0], [0.0], [0.0, 1.0], 1.5), r"fpr must be in \(0, 1\), got 1.5"),
])
def test_bad_input_names_field_rule_and_value(call, match):
    with pytest.raises(ValueError, match=match):
        call()
