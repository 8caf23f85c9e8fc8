"""The canary audit (:mod:`attacks.canary`): jax_privacy's ``CanaryScoreAuditor`` (Clopper-Pearson epsilon at a
fixed threshold), the closed-form epsilon of a Gaussian mechanism (Monte Carlo validity of the bounds, with the
naive plug-in estimator as the power check), our one-run auditor on the model's canary scores, and why the
one-run bound needs canaries inserted with probability 1/2.

Statistical tests use fixed seeds and state their false-failure probability (ALPHA).
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from scipy import stats

from snapaudit_jax.estimation.one_run import one_run_audit

pytest.importorskip("tokenizers")
pytest.importorskip("faker")

from attacks import (  # noqa: E402
    CanaryAuditConfig,
    CanaryConfig,
    canary_audit,
    continuation_logprobs,
    epsilon_lower_bound,
    jax_privacy_bounds,
    make_canaries,
    roc_auc,
)
from snapaudit_jax.mechanisms.noise import gdp_epsilon  # noqa: E402
from tests.helpers.attack_lm import (  # noqa: E402
    BATCH,
    small_lm,
)

ALPHA = 1e-6  # false-failure probability of each statistical check


@pytest.fixture(scope="module")
def lm():
    """``(model, tokenizer)``: random GPT-2 (width 32, 2 layers, 64 positions) and a BPE trained on the small
    corpus."""
    return small_lm()


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


@pytest.mark.parametrize("call, match", [
    (lambda: CanaryAuditConfig(selection="bonferroni").validate(), r"thresholds must be a non-empty grid"),
    (lambda: epsilon_lower_bound([1.0, 2.0], [0.0, 1.0], delta=0.0, key=jax.random.key(0)),
     r"delta must be in \(0, 1\), got 0.0"),
    (lambda: epsilon_lower_bound([1.0, 2.0], [0.0, 1.0], delta=1e-5), r"key must be a PRNG key"),
])
def test_bad_input_names_field_rule_and_value(call, match):
    with pytest.raises(ValueError, match=match):
        call()
