"""One-run audits of DP-ICL pipelines (snapaudit_jax.dpicl.one_run and the [one_run] config section)."""

from __future__ import annotations

import itertools
import json
import math
import os
import re

import jax
import numpy as np
import pytest

from tests.helpers.paths import EXAMPLES
from scipy import stats

from snapaudit_jax.dpicl import one_run as O
from snapaudit_jax.dpicl.data import get_spec, load_examples
from snapaudit_jax.dpicl.config import ConfigFileError, load_config
from snapaudit_jax.mechanisms import PrivateVoting, ProductOfExperts
from snapaudit_jax.estimation.one_run import one_run_audit

SQRT2 = math.sqrt(2.0)


class _EchoLM:
    """A stand-in language model: the chat prompt is the user text (no model)."""

    name = "echo"

    def chat_prompt(self, user, system=None):
        return user if system is None else f"{system}\n{user}"


class _CopyOracle:
    """A fully leaking answerer: greedy decoding reproduces a code iff the code is in the prompt.

    Records every prompt, so the tests see what each partition/expert was asked.
    """

    def __init__(self):
        self.lm = _EchoLM()
        self.prompts: list[str] = []
        self.progress = None

    def continues_with(self, prompts, continuations):
        self.prompts += list(prompts)
        return np.array([c.strip() + "." in p for p, c in zip(prompts, continuations)])

    def label_logprobs(self, prompts, labels):
        self.prompts += list(prompts)
        return np.array([[0.0 if lab.strip() + "." in p else -9.0 for lab in labels] for p in prompts])


@pytest.fixture(scope="module")
def examples():
    return load_examples("agnews")


# --- (a) slots and partitions ---------------------------------------------------------------------------


def test_slots_are_distinct_and_coins_come_from_the_seed(examples):
    s = O.make_slots(examples, canaries=13, base_exemplars=3, insert_probability=0.5, seed=5)
    assert s.size == 13 and len(s.base) == 3
    assert len(set(s.secrets + s.decoy_codes)) == 26  # every code distinct
    contents = {e.text.split(" Reference code:")[0] for e in s.canaries} | {e.text for e in s.base}
    assert len(contents) == 16 and len(set(s.prefixes)) == 13
    for j in range(13):
        assert s.canaries[j].text == f"{s.prefixes[j]} {s.secrets[j]}."
        assert s.decoys[j].text == f"{s.prefixes[j]} {s.decoy_codes[j]}."
    expected = np.random.default_rng([5, 2]).random(13) < 0.5
    assert s.coins == tuple(bool(c) for c in expected)
    again = O.make_slots(examples, canaries=13, base_exemplars=3, insert_probability=0.5, seed=5)
    assert again == s
    with pytest.raises(ValueError, match=r"canaries \+ base_exemplars = 300 distinct examples"):
        O.make_slots(examples, canaries=290, base_exemplars=10, insert_probability=0.5, seed=0)


@pytest.mark.parametrize("pipeline,partitions", [("pv", 3), ("pv", 5), ("poe", 1)])
def test_flipping_one_coin_changes_exactly_one_partition_prompt(examples, pipeline, partitions):
    s = O.make_slots(examples, canaries=11, base_exemplars=2, insert_probability=0.5, seed=1)
    settings = O.OneRunConfig(canaries=11, partitions=partitions, base_exemplars=2)
    spec = get_spec("agnews")

    def prompts(coins):
        oracle = _CopyOracle()
        flipped = O.CanarySlots(s.canaries, s.decoys, s.secrets, s.decoy_codes, s.prefixes, s.base, tuple(coins))
        O.clean_answers(pipeline, flipped, settings, oracle, spec, defense="none")
        groups = len(O.partition_groups(flipped, pipeline, partitions))
        return np.array(oracle.prompts).reshape(11, groups)  # (query, partition)

    base = prompts(s.coins)
    for i in range(11):
        coins = list(s.coins)
        coins[i] = not coins[i]
        diff = prompts(coins) != base
        where = i % partitions if pipeline == "pv" else i
        assert diff[:, where].all(), i  # every query sees the changed group...
        assert diff.sum() == 11, i  # ...and nothing else changes


def test_fully_leaking_answerer_gives_the_coins_as_clean_votes(examples):
    s = O.make_slots(examples, canaries=12, base_exemplars=0, insert_probability=0.5, seed=2)
    settings = O.OneRunConfig(canaries=12, partitions=4)
    clean, _ = O.clean_answers("pv", s, settings, _CopyOracle(), get_spec("agnews"), defense="none")
    coins = np.array(s.coins)
    np.testing.assert_array_equal(clean, np.stack([coins, 4 - coins], 1).astype(float))
    clean, _ = O.clean_answers("poe", s, settings, _CopyOracle(), get_spec("agnews"), defense="none")
    # expert j alone knows code j (log-prob 0, the rest -9 clipped to -5): margin +5 with the secret, -5 without
    np.testing.assert_allclose(clean[:, 0] - clean[:, 1], np.where(coins, 5.0, -5.0))


# --- (b) composition --------------------------------------------------------------------------------------


def _gdp_delta(eps, mu):  # Dong, Roth, Su 2022, Cor. 2.13 (independent of calibration.py)
    return stats.norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2)


@pytest.mark.slow
@pytest.mark.parametrize("sigma,m,delta", [(5.3, 32, 1e-6), (0.9, 7, 1e-5), (2.0, 64, 1e-3)])
def test_gaussian_composition_matches_gdp_and_pld(sigma, m, delta):
    import dp_accounting
    from dp_accounting.pld import PLDAccountant

    c = O.gaussian_composition(sigma, SQRT2, m, delta)
    assert c["mu"] == pytest.approx(math.sqrt(2 * m) / sigma, rel=1e-12)
    assert _gdp_delta(c["epsilon_gdp"], c["mu"]) == pytest.approx(delta, rel=1e-6)
    assert c["epsilon_gdp"] <= c["epsilon_pld"] <= c["epsilon_gdp"] * (1 + 2e-3) + 1e-3  # pessimistic PLD
    # one Gaussian of sensitivity sqrt(2 m): the m-fold composition is exactly that mechanism
    one = PLDAccountant(dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)
    one.compose(dp_accounting.GaussianDpEvent(sigma / math.sqrt(2 * m)))
    assert one.get_epsilon(delta) == pytest.approx(c["epsilon_pld"], rel=2e-3, abs=1e-3)
    assert O.gaussian_composition(sigma, SQRT2, m, 0.0)["epsilon_gdp"] == math.inf


def _rr_composition_delta(eps, eps0, m):
    """Hockey-stick divergence of m binary RR_eps0 by enumerating all 2^m outputs (naive oracle)."""
    q = math.exp(eps0) / (1 + math.exp(eps0))
    total = 0.0
    for out in itertools.product((0, 1), repeat=m):
        k = sum(out)
        p1 = q ** k * (1 - q) ** (m - k)
        p0 = (1 - q) ** k * q ** (m - k)
        total += max(p1 - math.exp(eps) * p0, 0.0)
    return total


@pytest.mark.parametrize("eps0,m,delta", [(1.0, 7, 1e-3), (0.3, 11, 1e-2), (2.0, 5, 1e-6)])
def test_pure_composition_is_optimal_rr_composition(eps0, m, delta):
    c = O.pure_composition(eps0, m, delta)
    assert _rr_composition_delta(c["epsilon_kov"], eps0, m) == pytest.approx(delta, rel=1e-6)
    assert c["epsilon_kov"] <= m * eps0
    assert c["epsilon_pld"] == pytest.approx(c["epsilon_kov"], rel=1e-4, abs=1e-4)
    assert O.pure_composition(eps0, m, 0.0)["epsilon_kov"] == m * eps0
    assert O.pure_composition(eps0, 1, 1e-9)["epsilon_kov"] == pytest.approx(eps0, rel=1e-6)


def test_composed_claim_uses_the_release_sigma_and_never_the_per_query_eps():
    mech = PrivateVoting.calibrated(1.0, 1e-5, SQRT2)
    claim = O.composed_claim("pv", mech, epsilon=1.0, delta0=1e-5, sensitivity=SQRT2, queries=32, delta=1e-6)
    assert claim["sigma"] == float(mech.sigma)
    assert claim["mu"] == pytest.approx(math.sqrt(64) / float(mech.sigma))
    assert claim["epsilon"] > 1.0 and (claim["basic_epsilon"], claim["basic_delta"]) == (32.0, 32 * 1e-5)
    poe = O.composed_claim("poe", ProductOfExperts.calibrated(2.0, 5.0), epsilon=2.0, delta0=1e-5,
                           sensitivity=5.0, queries=12, delta=1e-6)
    assert 2.0 < poe["epsilon"] <= 24.0 and poe["basic_delta"] == 0.0


# --- (c) validity and power of the one-run bound on DP-ICL releases ---------------------------------------

REPS = 120
ALPHA = 0.05
# Under a valid auditor each repetition reports eps > 0 with probability <= alpha; the test fails if at least
# _MAX_ALARMS of REPS do: P[Binomial(120, 0.05) >= 17] = 6.4e-4 per (pipeline, threat), < 3e-3 over the four.
_MAX_ALARMS = 17


def test_alarm_threshold_is_what_the_docstring_says():
    assert stats.binom.sf(_MAX_ALARMS - 1, REPS, ALPHA) < 1e-3


def _alarms(mechanism, clean_of, m, key, delta):
    alarms = {"black": 0, "white": 0}
    rng = np.random.default_rng(11)
    eps = []
    for r in range(REPS):
        coins = rng.random(m) < 0.5
        hits, margins = O.release_scores(mechanism, clean_of(coins, rng), jax.random.fold_in(key, r))
        for threat, scores in (("black", hits.astype(float)), ("white", margins)):
            res = one_run_audit(scores, coins, insert_probability=0.5, delta=delta, alpha=ALPHA)
            alarms[threat] += res.epsilon > 0
            eps.append(res.epsilon)
    return alarms, eps


@pytest.mark.parametrize("pipeline", ["pv", "poe"])
def test_no_leakage_answerer_rarely_reports_privacy_loss(pipeline):
    m, T = 64, 4
    if pipeline == "pv":
        mech = PrivateVoting.calibrated(16.0, 1e-5, SQRT2)  # little noise: the votes alone decide

        def clean_of(coins, rng):  # votes independent of the coins (an answerer that never looks)
            yes = rng.binomial(T, 0.5, size=m)
            return np.stack([yes, T - yes], 1).astype(float)
    else:
        mech = ProductOfExperts.calibrated(16.0, 5.0)

        def clean_of(coins, rng):
            return -rng.uniform(0, 5 * m, size=(m, 2))
    alarms, _ = _alarms(mech, clean_of, m, jax.random.key(3), 1e-6)
    assert alarms["black"] < _MAX_ALARMS and alarms["white"] < _MAX_ALARMS, alarms


@pytest.mark.slow
def test_fully_leaking_answerer_gives_a_positive_bound_below_the_composed_claim():
    """Power: votes = coins; deterministic (fixed seeds), each bound must be > 0 and <= the composed claim.

    Per-query eps 4 (PV) / 2 (PoE) with m = 200: composed claims of ~100 / ~190, one-run bounds ~0.03-0.7.
    """
    m, T, eps0 = 200, 4, 4.0
    rng = np.random.default_rng(0)
    coins = rng.random(m) < 0.5
    clean = np.stack([coins, T - coins], 1).astype(float)
    mech = PrivateVoting.calibrated(eps0, 1e-5, SQRT2)
    claim = O.composed_claim("pv", mech, epsilon=eps0, delta0=1e-5, sensitivity=SQRT2, queries=m, delta=1e-6)
    hits, margins = O.release_scores(mech, clean, jax.random.key(0))
    for scores in (hits.astype(float), margins):
        res = one_run_audit(scores, coins, insert_probability=0.5, delta=1e-6, alpha=ALPHA)
        assert 0.0 < res.epsilon <= claim["epsilon"]
    eps0 = 2.0
    poe = ProductOfExperts.calibrated(eps0, 5.0)
    hits, margins = O.release_scores(poe, np.stack([np.where(coins, 0.0, -5.0), np.where(coins, -5.0, 0.0)], 1),
                                     jax.random.key(1))
    res = one_run_audit(margins, coins, insert_probability=0.5, delta=1e-6, alpha=ALPHA)
    assert 0.0 < res.epsilon <= O.pure_composition(eps0, m, 1e-6)["epsilon_kov"]
    # and the bound reacts to the leak: the same scores with independent coins give nothing
    res0 = one_run_audit(margins, rng.random(m) < 0.5, insert_probability=0.5, delta=1e-6, alpha=ALPHA)
    assert res0.epsilon < res.epsilon


def test_ceiling_is_the_all_correct_bound():
    assert O.ceiling(4, delta=1e-6, alpha=0.05, insert_probability=0.5) == 0.0  # too few canaries to show anything
    assert 0.0 < O.ceiling(12, delta=1e-6, alpha=0.05, insert_probability=0.5) < 1.0
    top = O.ceiling(200, delta=1e-6, alpha=0.05, insert_probability=0.5)
    coins = np.arange(200) % 2 == 0
    res = one_run_audit(coins.astype(float), coins, insert_probability=0.5, delta=1e-6, alpha=0.05)
    assert top == res.epsilon > 0  # perfect scores reach it
    # one declared pair (guess every canary) is tested at alpha, not alpha / 12: it reaches further
    one = O.ceiling(48, delta=1e-6, alpha=0.05, insert_probability=0.5, pairs=((24, 24),))
    q_low = 0.05 ** (1 / 48)  # 48 of 48 right: Clopper-Pearson, the delta term (2 m 1e-6 / 48) aside
    assert one > O.ceiling(48, delta=1e-6, alpha=0.05, insert_probability=0.5)
    assert one == pytest.approx(np.log(q_low / (1 - q_low)), abs=0.02) and one < np.log(q_low / (1 - q_low))


def test_release_scores_reject_bad_clean_shapes():
    with pytest.raises(ValueError, match=r"clean must have shape \(m, 2\).*got \(4, 3\)"):
        O.release_scores(PrivateVoting.calibrated(1.0, 1e-5), np.zeros((4, 3)), jax.random.key(0))


# --- (d) configuration ------------------------------------------------------------------------------------

_BASE = "[pipelines.pv]\n[one_run]\n"
BAD = [
    ("colour = 1\n", r"one_run: unknown key(s) colour"),
    ("insert_probability = 1.5\n", r"one_run.insert_probability: insert_probability must be in (0, 1), got 1.5"),
    ("insert_probability = 0.3\n", r"one_run.insert_probability: insert_probability must be 1/2 for an (eps, delta) "
                                   r"claim with delta > 0"),
    ("insert_probability = 0.3\ndelta = 1e-6\n", "got insert_probability=0.3 with delta=1e-06"),
    ("canaries = 1\n", r"one_run.canaries: canaries must be an integer >= 2, got 1"),
    ("pipelines = [\"pv\", \"esa\"]\n", r"one_run.pipelines: must be one of 'pv', 'poe', got 'esa'"),
    ("pipelines = \"pv\"\n", r"one_run.pipelines: must be a non-empty list"),
    ("delta = 1.0\n", r"one_run.delta: delta must be in [0, 1), got 1.0"),
    ("alpha = 0\n", r"one_run.alpha: alpha must be in (0, 1), got 0"),
    ("epsilons = []\n", r"one_run.epsilons: must list at least one epsilon, got []"),
    ("epsilons = [1, -2]\n", r"one_run.epsilons: epsilon must be a finite number > 0, got -2"),
    ("canaries = 4\npartitions = 5\n", r"one_run.partitions: must be <= canaries + base_exemplars = 4"),
    ("base_exemplars = -1\n", r"one_run.base_exemplars: base_exemplars must be an integer >= 0, got -1"),
    ("threats = [\"grey\"]\n", r"one_run.threats: must be one of 'black', 'white', got 'grey'"),
    ("canaries = 8\npairs = [[5, 4]]\n", r"one_run.pairs[0]: k_plus + k_minus must be <= the number of canaries "
                                         r"(8), got 5 + 4"),
    ("pairs = [[0, 0]]\n", r"pairs[0] must make at least one guess"),
    ("pairs = [[1, -1]]\n", r"pairs[0][1] (k_minus) must be an integer >= 0, got -1"),
    ("pairs = [3]\n", r"pairs[0] must be a pair [k_plus, k_minus], got 3"),
    ("pairs = []\n", 'pairs must be "all" or a non-empty list of [k_plus, k_minus] pairs, got []'),
]


@pytest.mark.parametrize("body,needle", BAD)
def test_bad_one_run_configs_name_field_rule_and_value(tmp_path, body, needle):
    path = tmp_path / "bad.toml"
    path.write_text(_BASE + body)
    with pytest.raises(ConfigFileError, match=re.escape(needle)):
        load_config(path)


def test_one_run_config_defaults_and_pure_claims(tmp_path):
    path = tmp_path / "ok.toml"
    path.write_text("[audit]\nepsilons = [2, 8]\nthreats = [\"white\"]\nseed = 3\n[pipelines.poe]\nclip = 3.0\n"
                    "[one_run]\ninsert_probability = 0.25\ndelta = 0\n")
    s = load_config(path).one_run
    assert (s.epsilons, s.threats, s.clip, s.seed) == ((2.0, 8.0), ("white",), 3.0, 3)
    assert s.insert_probability == 0.25 and s.delta == 0.0  # a pure claim allows any p
    assert s.slots_for("poe") == s.slots_for("pv") == 32 and s.pairs is None
    path.write_text("[pipelines.pv]\n[one_run]\ncanaries = 10\npairs = [[5, 5], [3, 0]]\n")
    assert load_config(path).one_run.pairs == ((5, 5), (3, 0))
    path.write_text("[pipelines.pv]\n[one_run]\ncanaries = 11\npoe_canaries = 6\npairs = \"all\"\n")
    s = load_config(path).one_run
    assert s.pairs_for("pv") == ((5, 6),) and s.pairs_for("poe") == ((3, 3),)
    assert load_config(str(EXAMPLES / "one_run.toml")).one_run.canaries == 32


# --- (e) end to end with the tiny model -------------------------------------------------------------------


@pytest.mark.slow
def test_run_audit_writes_the_one_run_table_and_json(tmp_path):
    pytest.importorskip("flax")
    pytest.importorskip("torch")
    from tests.helpers.tiny_llm import make_tiny_llm_folder

    from snapaudit_jax.dpicl.run import run_audit

    tiny = make_tiny_llm_folder(str(tmp_path / "tiny"), [e.text for e in load_examples("agnews")])
    path = tmp_path / "audit.toml"
    path.write_text(f'[model]\nllm = "{tiny}"\n\n[audit]\nepsilons = [8]\nsnapshots = 4\ntrials = 20000\n'
                    'passive_runs = 4\nverify = 1\n\n[pipelines.pv]\nnum_exemplars = 4\npartitions = 2\n\n'
                    '[one_run]\ncanaries = 6\npoe_canaries = 3\npartitions = 2\n')
    cfg = load_config(path)
    out = str(tmp_path / "run")
    result = run_audit(cfg, out, progress=False)
    data = json.load(open(os.path.join(out, "one_run.json")))
    assert data == json.loads(json.dumps(result["one_run"]))
    assert json.load(open(os.path.join(out, "results_full.json")))["one_run"] == data
    rows = {r["pipeline"]: r for r in data["rows"]}
    assert rows["pv"]["llm_calls"] == 6 * 2 and rows["poe"]["llm_calls"] == 3 * 3
    for r in data["rows"]:
        assert set(r["threats"]) == {"black", "white"} and r["canaries"] == len(r["coins"])
        assert r["claim"]["epsilon"] > r["epsilon_per_query"]  # the composition, not the per-query eps
        for t in r["threats"].values():
            assert t["epsilon"] >= 0 and t["canaries"] == r["canaries"] and t["violation"] is False
    assert all(set(r) == {"pipeline", "mode", "threat", "epsilon_theory", "epsilon_emp", "llm_calls", "seconds"}
               for r in json.load(open(os.path.join(out, "results.json"))))  # existing rows unchanged
    table = open(os.path.join(out, "table.md")).read()
    assert "## One-run audit" in table and "| pv | 8 | GDP (PLD) |" in table and "| poe | 8 | KOV (PLD) |" in table
    again = run_audit(cfg, out, progress=False)
    assert again["summary"]["llm_calls"]["computed"] == 0  # the one-run answers came from the cache
    def timeless(rows):
        return [{k: v for k, v in r.items() if k != "seconds"} for r in rows]

    assert timeless(again["one_run"]["rows"]) == timeless(result["one_run"]["rows"])  # same coins, noise, bounds
