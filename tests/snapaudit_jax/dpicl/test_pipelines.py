"""DP-ICL pipelines: audit cases, partition coupling, cached counted calls, Phase A manifests and resume."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("flax")
pytest.importorskip("torch")

from tests.helpers.tiny_llm import make_tiny_llm_folder  # noqa: E402

from snapaudit_jax.dpicl.data import get_spec, load_examples  # noqa: E402
from snapaudit_jax.models import load_embedder, load_language_model  # noqa: E402
from snapaudit_jax.dpicl.pipelines import (  # noqa: E402
    EmbeddingPipeline,
    KeywordPipeline,
    LLMOracle,
    PrivateVotingPipeline,
    ProductOfExpertsPipeline,
    keywords_of,
    make_case,
)
from snapaudit_jax.dpicl.pipelines import prompts as P  # noqa: E402
from snapaudit_jax.dpicl.pipelines.phase_a import generate_snapshots  # noqa: E402

AGNEWS = load_examples("agnews")
SPEC = get_spec("agnews")


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory):
    folder = make_tiny_llm_folder(str(tmp_path_factory.mktemp("tiny")), [e.text for e in AGNEWS])
    return load_language_model(folder)


def test_copy_case_is_a_neighbouring_pair_with_a_shared_prefix():
    case = make_case(AGNEWS, SPEC, mode="copy", num_exemplars=6, seed=3)
    w, wo = case.exemplars(1), case.exemplars(0)
    diff = [i for i, (a, b) in enumerate(zip(w, wo)) if a != b]
    assert len(w) == len(wo) == 6 and diff == [case.context.position]
    canary, replacement = w[diff[0]], wo[diff[0]]
    assert canary.text == f"{case.query_text} {case.secret}." and replacement.text == f"{case.query_text} {case.decoy}."
    assert case.query_text.endswith(P.SECRET_LEAD)
    assert not set(case.secret.split()) & set(case.decoy.split())
    assert make_case(AGNEWS, SPEC, mode="copy", num_exemplars=6, seed=3) == case
    assert make_case(AGNEWS, SPEC, mode="copy", num_exemplars=6, seed=4).secret != case.secret
    with pytest.raises(ValueError, match="query mode"):
        make_case(AGNEWS, SPEC, mode="sideways", num_exemplars=6, seed=3)


def test_direct_case_asks_about_the_canary():
    case = make_case(AGNEWS, SPEC, mode="direct", num_exemplars=5, seed=1)
    assert case.query_text == case.context.canary.text and case.secret == ""


def test_pv_calls_are_coupled_and_neighbouring(tiny_lm):
    oracle = LLMOracle(tiny_lm)
    case = make_case(AGNEWS, SPEC, mode="copy", num_exemplars=6, seed=0)
    pv = PrivateVotingPipeline(oracle, case, partitions=3)
    w, wo = pv.clean_outputs(1, 12, seed=5), pv.clean_outputs(0, 12, seed=5)
    assert w.shape == wo.shape == (12, 2)
    assert np.all(w.sum(1) == 3) and np.all(wo.sum(1) == 3)
    # Call i splits both contexts the same way: the vote vectors differ by at most one moved vote.
    assert np.all(np.abs(w - wo).sum(1) <= 2)
    for i in range(12):
        a = pv.assign(case.exemplars(1), np.random.default_rng([5, i]))
        b = pv.assign(case.exemplars(0), np.random.default_rng([5, i]))
        moved = [j for j, (ga, gb) in enumerate(zip(a, b)) if ga != gb]
        assert len(moved) == 1 and case.context.canary in a[moved[0]] and case.context.replacement in b[moved[0]]
    # 2 x 12 calls x 3 partitions, but prompts repeat: each distinct prompt is computed once.
    assert oracle.stats.calls == 72 and oracle.stats.computed < 72
    assert oracle.stats.computed + oracle.stats.cached == 72


def test_contextleak_adds_one_filter_call_per_partition(tiny_lm):
    case = make_case(AGNEWS, SPEC, mode="direct", num_exemplars=6, seed=0)
    oracle = LLMOracle(tiny_lm)
    pv = PrivateVotingPipeline(oracle, case, partitions=3, defense="contextleak")
    pv.clean_outputs(1, 2, seed=0)
    assert pv.calls_per_clean == 6 and oracle.stats.calls == 12
    with pytest.raises(ValueError, match="defense"):
        PrivateVotingPipeline(oracle, case, partitions=3, defense="firewall")
    with pytest.raises(ValueError, match="partitions"):
        PrivateVotingPipeline(oracle, case, partitions=7)


def test_poe_utilities_are_clipped_sums(tiny_lm):
    oracle = LLMOracle(tiny_lm)
    case = make_case(AGNEWS, SPEC, mode="copy", num_exemplars=4, seed=2)
    poe = ProductOfExpertsPipeline(oracle, case, clip=3.0)
    u = poe.clean_outputs(1, 3, seed=0)
    assert u.shape == (3, 2) and np.all(u <= 0) and np.all(u >= -3.0 * 4)
    assert np.all(u == u[0])  # per-example experts: no partition randomness
    lp = np.clip(oracle.label_logprobs([poe._copy((e,)) for e in case.exemplars(1)], poe.labels), -3.0, 0.0)
    np.testing.assert_allclose(u[0], lp.sum(0))


def test_oracle_cache_resumes_from_disk(tiny_lm, tmp_path):
    path = str(tmp_path / "cache.jsonl")
    prompts = [tiny_lm.chat_prompt(f"question {i}") for i in range(5)]
    first = LLMOracle(tiny_lm, cache_path=path)
    a = first.label_logprobs(prompts, ["Yes", "No"])
    assert first.stats.computed == 5
    with open(path, "a") as fh:
        fh.write('{"k": "torn')  # an interrupted write
    second = LLMOracle(tiny_lm, cache_path=path)
    b = second.label_logprobs(prompts, ["Yes", "No"])
    assert second.stats.computed == 0 and second.stats.cached == 5
    np.testing.assert_array_equal(a, b)


def test_phase_a_writes_manifest_and_resumes(tiny_lm, tmp_path):
    case = make_case(AGNEWS, SPEC, mode="copy", num_exemplars=6, seed=0)
    oracle = LLMOracle(tiny_lm, cache_path=str(tmp_path / "cache.jsonl"))
    run = generate_snapshots(PrivateVotingPipeline(oracle, case, partitions=3), snapshots=10, seed=1,
                             run_dir=str(tmp_path), verify=2)
    m = run.manifest
    assert m["llm_calls"] == 60 and m["unique_computations"] + m["reused_answers"] == 60
    assert m["determinism_check"] == {"checked": 2, "mismatches": 0}
    assert m["unique_computations"] <= len(m["prompt_hashes"]) and all(len(h) == 64 for h in m["prompt_hashes"])
    assert run.snapshots.with_canary.shape == (10, 2) and run.snapshots.target == 0
    saved = json.load(open(tmp_path / "pv.manifest.json"))
    assert saved["fingerprint"] == m["fingerprint"]
    again = generate_snapshots(PrivateVotingPipeline(LLMOracle(tiny_lm), case, partitions=3), snapshots=10, seed=1,
                               run_dir=str(tmp_path))
    assert again.manifest["resumed"] is True
    np.testing.assert_array_equal(again.snapshots.with_canary, run.snapshots.with_canary)
    other = generate_snapshots(PrivateVotingPipeline(oracle, case, partitions=3), snapshots=12, seed=1,
                               run_dir=str(tmp_path), verify=0)
    assert "resumed" not in other.manifest and other.snapshots.with_canary.shape == (12, 2)

    class Served:  # the same model and name behind another identity (a server's: URL, model id, fingerprint)
        def __init__(self, lm, identity):
            self._lm, self.identity = lm, identity

        def __getattr__(self, name):
            return getattr(self._lm, name)

    def served(identity):
        return generate_snapshots(PrivateVotingPipeline(LLMOracle(Served(tiny_lm, identity)), case, partitions=3),
                                  snapshots=12, seed=1, run_dir=str(tmp_path), verify=0)

    # the identity of a model loaded from files is its name and its files' digest (models.local_identity)
    assert tiny_lm.identity.startswith(f"{tiny_lm.name} files:")
    assert served(tiny_lm.identity).manifest["resumed"] is True
    elsewhere = served("openai:tiny@0123456789abcdef").manifest
    assert "resumed" not in elsewhere and elsewhere["model_identity"] == "openai:tiny@0123456789abcdef"
    assert elsewhere["model"] == tiny_lm.name and elsewhere["fingerprint"] != other.manifest["fingerprint"]


def test_keywords_and_ksa_histograms(tiny_lm):
    assert keywords_of("The Amber falcon, 4821 and the amber!") == {"amber", "falcon", "4821"}
    case = make_case(load_examples("samsum"), get_spec("samsum"), mode="copy", num_exemplars=4, seed=0)
    ksa = KeywordPipeline(LLMOracle(tiny_lm), case, partitions=4, top_k=2)
    with pytest.raises(ValueError, match="vocabulary"):
        _ = ksa.target
    h1, h0 = ksa.histograms(ksa.clean_calls(1, 3, 0), ksa.clean_calls(0, 3, 0))
    assert h1.shape == h0.shape == (3, len(ksa.vocabulary))
    assert ksa.vocabulary[ksa.target] == case.secret.split()[0]
    assert np.all(h1 <= 4) and np.all(np.abs(h1 - h0) <= 1)  # one partition changes: counts move by <= 1
    assert ksa.count([({"not-a-known-word"},)]).sum() == 0


@pytest.mark.slow
def test_esa_pipeline_means_and_candidates(tiny_lm):
    embedder = load_embedder("minilm")
    oracle = LLMOracle(tiny_lm, embedder)
    signals = ("the cat sleeps on the warm mat", "quarterly revenue exceeded all forecasts")
    case = make_case(load_examples("samsum"), get_spec("samsum"), mode="copy", num_exemplars=3, seed=0,
                     signals=signals)
    esa = EmbeddingPipeline(oracle, case, signals=signals, partitions=1)
    means = esa.clean_outputs(1, 2, 0)
    assert means.shape == (2, 384)
    np.testing.assert_allclose(np.linalg.norm(means, axis=1), 1.0, atol=1e-5)  # T = 1: one unit embedding
    np.testing.assert_allclose(esa.candidates, embedder.embed(list(signals)), atol=1e-6)
    assert esa.sensitivity == 2.0
    assert oracle.stats.embed_calls > 0 and oracle.stats.calls == 2


@pytest.mark.slow
def test_smollm2_copy_query_reveals_the_canary():
    """On the embedded SmolLM2 the copy query separates: votes [1, 2] with the canary, [0, 3] without, and the
    one-pass greedy check agrees with step-by-step greedy decoding."""
    from tests.helpers.embedded import smollm2

    lm = smollm2()
    oracle = LLMOracle(lm)
    case = make_case(AGNEWS, SPEC, mode="copy", num_exemplars=6, seed=0)
    pv = PrivateVotingPipeline(oracle, case, partitions=3)
    assert np.all(pv.clean_outputs(1, 4, 0) == [1, 2]) and np.all(pv.clean_outputs(0, 4, 0) == [0, 3])
    groups = pv.assign(case.exemplars(1), np.random.default_rng([0, 0]))
    prompts = [pv._copy(g) for g in groups]
    fast = lm.greedy_continues_with(prompts, [" " + case.secret] * len(prompts))
    slow = [g.text.startswith(" " + case.secret) for g in lm.generate(prompts, max_new_tokens=12)]
    assert list(fast) == slow and sum(slow) == 1


class _LeakingOracle:
    """A perfectly leaking model: "Yes" (direct/semantic) or the secret (copy) iff the canary is in the context."""

    def __init__(self, case_of):
        self.case_of, self.lm = case_of, self

    def chat_prompt(self, user, system=None):
        return user

    def generate(self, prompts, max_new_tokens):
        case = self.case_of()
        if case is None:  # make_case's paraphrase of a semantic canary
            return ["A text that means the same." for _ in prompts]
        out = []
        for p in prompts:
            context = p.split("\n\nQuestion:")[0].split("\n\n" + P.COPY_INSTRUCTION)[0]
            if case.mode == "copy":
                out.append(f" {case.secret if case.secret in context else case.decoy}.")
            else:
                out.append("Yes, it does." if case.context.canary.text in context else "No.")
        return out


@pytest.mark.parametrize("mode", ["direct", "semantic", "copy"])
def test_ksa_counts_the_target_answer_in_every_query_mode(mode):
    """The target keyword ("yes" under direct/semantic, a stopword) is counted: with a leaking model the
    with-canary histograms hold it once per call (the canary's partition), the without-canary ones never."""
    holder = {"case": None}
    oracle = _LeakingOracle(lambda: holder["case"])
    case = make_case(load_examples("samsum"), get_spec("samsum"), mode=mode, num_exemplars=4, seed=0, oracle=oracle)
    holder["case"] = case
    ksa = KeywordPipeline(oracle, case, partitions=2, top_k=2)
    h1, h0 = ksa.histograms(ksa.clean_calls(1, 5, 0), ksa.clean_calls(0, 5, 0))
    t = ksa.target
    np.testing.assert_array_equal(h1[:, t], np.ones(5))
    np.testing.assert_array_equal(h0[:, t], np.zeros(5))
    if mode != "copy":
        assert keywords_of("Yes") == set()  # a stopword for ordinary answers ...
        assert keywords_of("Yes, it does.", ksa.answer_keywords) == {"yes"}  # ... but counted as KSA's answer
        assert "no" in ksa.vocabulary  # the other answer is counted too


def test_ksa_add_remove_drops_the_canary_and_halves_the_sensitivity():
    """add_remove: the context without the canary has k - 1 exemplars, one partition each; with a leaking model
    the histograms differ by a 0/1 vector (the canary's keyword set), Delta_u = 1; replace-one keeps 2."""
    holder = {"case": None}
    oracle = _LeakingOracle(lambda: holder["case"])
    case = make_case(load_examples("samsum"), get_spec("samsum"), mode="direct", num_exemplars=4, seed=0)
    holder["case"] = case
    ksa = KeywordPipeline(oracle, case, partitions=4, top_k=2, neighbouring="add_remove")
    assert len(ksa.exemplars(1)) == 4 and len(ksa.exemplars(0)) == 3
    assert case.context.canary in ksa.exemplars(1) and case.context.replacement not in ksa.exemplars(0)
    assert ksa.calls_per_clean_of(1) == 4 and ksa.calls_per_clean_of(0) == 3
    h1, h0 = ksa.histograms(ksa.clean_calls(1, 3, 0), ksa.clean_calls(0, 3, 0))
    assert set(np.unique(h1 - h0)) <= {0.0, 1.0} and np.all(h1[:, ksa.target] - h0[:, ksa.target] == 1)
    assert ksa.sensitivity == 1.0 and KeywordPipeline(oracle, case, partitions=4).sensitivity == 2.0
    assert ksa.mechanism(4.0, 1e-5).scale == pytest.approx(4.0 / 2.0)  # eps / (2 Delta_u)
    with pytest.raises(ValueError, match=r"neighbouring='add_remove' needs one exemplar per partition .*"
                                         r"got partitions=2"):
        KeywordPipeline(oracle, case, partitions=2, neighbouring="add_remove")
    with pytest.raises(ValueError, match=r"neighbouring must be one of replace_one, add_remove, got 'swap'"):
        KeywordPipeline(oracle, case, partitions=4, neighbouring="swap")


# --- ESA's candidate stage ---------------------------------------------------------------------------------------
Y1, Y2 = "The cat sleeps on the warm mat.", "quarterly revenue exceeded all forecasts"
OFF = "Here is one of the two sentences"


def _esa_with(candidate, *, partitions=1, num_exemplars=3):
    from tests.helpers.fake_esa import HashEmbedder, ScriptedLM

    lm = ScriptedLM((Y1, Y2), candidate)
    oracle = LLMOracle(lm, HashEmbedder())
    case = make_case(load_examples("samsum"), get_spec("samsum"), mode="copy", num_exemplars=num_exemplars, seed=0,
                     signals=(Y1, Y2))
    return EmbeddingPipeline(oracle, case, signals=(Y1, Y2), partitions=partitions), lm, oracle


def test_candidate_text_reads_answers_like_the_generator_and_drops_option_numbers():
    from snapaudit_jax.dpicl.pipelines import candidate_text

    assert candidate_text("1. The cat sleeps on the warm mat.\n2. quarterly revenue", (Y1, Y2)) == Y1  # as given
    assert candidate_text("  quarterly revenue exceeded all forecasts.\n\nmore text", (Y1, Y2)) == Y2
    assert candidate_text("2) quarterly revenue exceeded all forecasts", (Y1, Y2)) == Y2
    assert candidate_text(f"{OFF}.\n1. {Y1}", (Y1, Y2)) == OFF  # the first line decides
    assert candidate_text("1. The Cat sleeps on the warm mat", (Y1, Y2)) == "The Cat sleeps on the warm mat"
    assert candidate_text("   ", (Y1, Y2)) == ""


def test_esa_sampled_candidate_stage_is_t_cand_calls_without_the_private_examples():
    """The pool is what the model answered, off-signal answers included, signals first; exactly T_cand calls,
    none of whose prompts holds an exemplar; the same seed redraws the same pool from the cache."""
    script = [f"1. {Y1}\n2. {Y2}", f"{Y2}.", f" {OFF}.\nsecond line", "1. The cat sleeps on the warm mat", Y2,
              f"{OFF}", "2. quarterly revenue exceeded all forecasts."]
    esa, lm, oracle = _esa_with(lambda n, i: script[i])
    pool = esa.draw_pool(7, seed=3)
    assert oracle.stats.calls == 7 and oracle.stats.computed == 7 and len(lm.computed) == 7
    assert lm.computed == esa.candidate_prompts(7, 3) and len(set(lm.computed)) == 7
    private = {e.text for b in (1, 0) for e in esa.exemplars(b)}
    assert not any(x in p for p in lm.computed for x in private)  # the stage never sees the private examples
    assert pool.draws == (Y1, Y2, OFF, Y1, Y2, OFF, Y2)
    assert pool.texts == (Y1, Y2, OFF) and pool.source == "sampled" and pool.calls == 7 and pool.seed == (3,)
    assert pool.counts() == {"y1": 2, "y2": 3, "other": 2} and pool.target == 0 and pool.problems() == []
    esa.pool = pool
    np.testing.assert_allclose(esa.candidates, oracle.embedder.embed([Y1, Y2, OFF]), atol=1e-6)
    assert esa.mechanism(4.0, 1e-5).candidates.shape == (3, 16) and esa.target == 0
    again = esa.draw_pool(7, seed=3)
    assert again == pool and oracle.stats.calls == 14 and oracle.stats.computed == 7  # cached, deterministic
    assert esa.candidate_prompts(7, 4) != esa.candidate_prompts(7, 3)
    assert esa.candidate_coverage(7, 3) == {"calls": 7, "y1": 2, "y2": 3, "other": 2}
    with pytest.raises(ValueError, match=r"calls must be an integer >= 1, got 0"):
        esa.draw_pool(0, seed=3)


def test_esa_pool_order_puts_the_signals_first_and_a_signal_only_pool_is_the_fixed_pool():
    from snapaudit_jax.dpicl.pipelines import CandidatePool

    esa, _, _ = _esa_with(lambda n, i: [Y2, OFF, Y2, Y1][i % 4])
    assert esa.pool == CandidatePool.fixed((Y1, Y2)) and esa.pool.calls == 0 and esa.target == 0
    assert esa.draw_pool(4, 0).texts == (Y1, Y2, OFF)
    only = CandidatePool.from_draws((Y1, Y2), (Y2, Y2, Y1), 0)
    assert only.texts == CandidatePool.fixed((Y1, Y2)).texts and only.counts() == {"y1": 1, "y2": 2, "other": 0}


def test_esa_pool_without_y1_is_audited_with_the_default_target_and_says_so():
    """No y1 in the pool: target None, the audit's default rule picks the candidate the canary's mean moves
    towards; a single-candidate pool releases one text whatever the context: black-box epsilon 0."""
    from snapaudit_jax.audits.active import audit

    esa, _, _ = _esa_with(lambda n, i: [Y2, OFF][i % 2])
    esa.pool = esa.draw_pool(6, 0)
    assert esa.pool.texts == (Y2, OFF) and esa.target is None
    assert any("lacks y1" in p for p in esa.pool.problems())
    w, wo = esa.clean_outputs(1, 3, 0), esa.clean_outputs(0, 3, 0)
    res = audit(esa.mechanism(8.0, 1e-5), w, wo, epsilon_theory=8.0, threat="black", trials=4000, target=None)
    assert res.target == int(np.argmax(esa.candidates @ (w[0] - wo[0])))
    single, _, _ = _esa_with(lambda n, i: Y2)
    single.pool = single.draw_pool(5, 0)
    assert single.pool.texts == (Y2,) and any("single candidate" in p for p in single.pool.problems())
    w, wo = single.clean_outputs(1, 3, 0), single.clean_outputs(0, 3, 0)
    res = audit(single.mechanism(8.0, 1e-5), w, wo, epsilon_theory=8.0, threat="black", trials=4000)
    assert res.epsilon_emp == 0.0


def test_esa_snapshots_resume_only_with_the_same_pool(tmp_path):
    """The pool is part of the snapshot fingerprint: another pool (or the same texts drawn otherwise) recomputes
    Phase A (from the answer cache), the same pool resumes; the manifest records the pool."""
    esa, _, oracle = _esa_with(lambda n, i: [Y1, OFF, Y2][i % 3])
    fixed = generate_snapshots(esa, snapshots=4, seed=0, run_dir=str(tmp_path), verify=0)
    assert fixed.manifest["candidate_pool"]["source"] == "fixed" and fixed.snapshots.candidates.shape == (2, 16)
    assert generate_snapshots(esa, snapshots=4, seed=0, run_dir=str(tmp_path), verify=0).manifest["resumed"]
    esa.pool = esa.draw_pool(3, 0)
    sampled = generate_snapshots(esa, snapshots=4, seed=0, run_dir=str(tmp_path), verify=0)
    assert "resumed" not in sampled.manifest and sampled.snapshots.candidates.shape == (3, 16)
    assert sampled.manifest["candidate_pool"]["texts"] == [Y1, Y2, OFF]
    assert sampled.manifest["candidate_pool"]["calls"] == 3 and sampled.snapshots.target == 0
    again = generate_snapshots(esa, snapshots=4, seed=0, run_dir=str(tmp_path), verify=0)
    assert again.manifest["resumed"] is True
    np.testing.assert_array_equal(again.snapshots.candidates, sampled.snapshots.candidates)
    from snapaudit_jax.dpicl.pipelines import CandidatePool

    esa.pool = CandidatePool.from_draws((Y1, Y2), (Y1, Y2), 0)  # the fixed pool's texts, drawn
    assert "resumed" not in generate_snapshots(esa, snapshots=4, seed=0, run_dir=str(tmp_path), verify=0).manifest
