"""The CPA run (``conformal.run``: ``build_suites``, ``run_cpa``), end to end on small synthetic suites and the
dataset fixtures.

Oracles: the exact split-conformal identities (coverage = conditional coverage x inclusion with one split)
for the report rows. The LLM attackers run on a tiny random Llama folder (tests/helpers/tiny_llm.py): their
mechanics (calls, caching, determinism, validity of the sets) are under test, not their accuracy.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest

from conformal.config import load_cpa_config
from conformal.data import synthetic_ladder
from conformal.run import build_suites, run_cpa
from snapaudit_jax.report.html import write_report
from snapaudit_jax.utils.config import ConfigFileError
from tests.helpers.cpa import BLOG, LLM_CONFIG, SMALL, TAB, TEXTWASH, WIKIBIO, write_config
from tests.helpers.docs import documented_keys
from tests.helpers.report import check_report


REQUIRED_KEYS = {"suite", "knowledge_level", "alpha", "n_cal", "n_test", "coverage", "coverage_conditional",
                 "candidate_miss_rate", "median_set_size", "mean_set_size", "leakage_proxy", "qhat", "top1"}


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cpa")
    cfg = load_cpa_config(write_config(tmp, SMALL))
    out = str(tmp / "out")
    result = run_cpa(cfg, out, progress=False)
    return cfg, out, result


def rows_of(rows, kind=None, alpha=None, suite=None):
    return [r for r in rows if (kind is None or r["kind"] == kind) and (alpha is None or r["alpha"] == alpha)
            and (suite is None or r["suite"] == suite)]


# --------------------------------------------------------------------------- run folder


@pytest.mark.slow
def test_run_folder_files_and_summary_keys(small_run):
    cfg, out, _ = small_run
    names = set(os.listdir(out))
    assert {"summary.json", "report.md", "config.json", "validity_checks.json", "documents"} <= names
    assert any(n.startswith("alpha_dial") and n.endswith(".png") for n in names)
    assert any(n.startswith("set_sizes") and n.endswith(".png") for n in names)
    # the page of the run (what `snapaudit cpa` writes), beside the folder: every figure's SVG copy inline
    svgs = [n for n in names if n.endswith(".svg")]
    assert len(svgs) == sum(n.endswith(".png") for n in names) > 0
    check_report(write_report(out, os.path.join(os.path.dirname(out), "cpa_report.html")),
                 os.path.join(out, "summary.json"), figures=len(svgs))
    rows = json.load(open(os.path.join(out, "summary.json")))
    assert rows and all(REQUIRED_KEYS <= set(r) for r in rows)
    # every key a row holds is one the guide lists, and the guide lists no key no row holds
    assert set().union(*map(set, rows)) == documented_keys("conformal.md", "a list of rows with keys", "`qhat` is")
    std = rows_of(rows, "standard")
    assert len(std) == 6 * len(cfg.alphas)  # 3 levels x 2 releases x alphas
    for r in std:
        assert r["n_cal"] == 60 and r["n_test"] == 60
        assert r["candidate_miss_rate"] == 0.0 and r["coverage"] == r["coverage_conditional"]
        assert r["qhat"] is None or 0.0 <= r["qhat"] <= 1.0
        assert r["leakage_proxy"] <= 1.0 and r["median_set_size"] >= 1.0
        # one split: a finite qhat certifies at least ceil((n+1)(1-alpha))/(n+1) on the calibration side
        if r["qhat"] is None:
            assert r["coverage"] == 1.0
    # the per-document JSONL: both splits, every document once, sets at report_alpha contain the truth iff covered
    docs = os.path.join(out, "documents", "retrieval")
    files = sorted(os.listdir(docs))
    assert files, "no per-document JSONL written"
    lines = [json.loads(x) for x in open(os.path.join(docs, files[0]))]
    assert {ln["split"] for ln in lines} == {"cal", "test"}
    assert sum(ln["split"] == "test" for ln in lines) == 60 and sum(ln["split"] == "cal" for ln in lines) == 60
    assert len({ln["doc_id"] for ln in lines}) == 120
    for ln in lines:
        assert {"doc_id", "query", "top_candidates", "score", "set", "covered", "set_size"} <= set(ln)
        assert len(ln["top_candidates"]) >= 1 and all({"candidate", "weight"} <= set(c) for c in ln["top_candidates"])
        assert (ln["identity"] in ln["set"]) == ln["covered"][str(cfg.report_alpha)]
        assert len(ln["set"]) == ln["set_size"][str(cfg.report_alpha)]


@pytest.mark.slow
def test_qualitative_findings_on_the_synthetic_ladder(small_run):
    """K1 -> K3 shrinks sets; quasi-ID redaction enlarges them; alpha trades coverage for size; drift under-covers."""
    _, _, result = small_run
    rows = result["rows"]

    def size(suite, alpha=0.1):
        return rows_of(rows, "standard", alpha, suite)[0]["median_set_size"]

    assert size("synthetic/K1/direct") > size("synthetic/K2/direct") > size("synthetic/K3/direct")
    assert size("synthetic/K2/quasi_id_redaction") > size("synthetic/K2/direct")
    for suite in ("synthetic/K2/direct", "synthetic/K3/direct"):
        by_alpha = sorted(rows_of(rows, "standard", suite=suite), key=lambda r: r["alpha"])
        assert [r["mean_set_size"] for r in by_alpha] == sorted((r["mean_set_size"] for r in by_alpha), reverse=True)
        assert [r["coverage"] for r in by_alpha] == sorted((r["coverage"] for r in by_alpha), reverse=True)
    drift = rows_of(rows, "drift", 0.1)[0]
    assert drift["suite"] == "synthetic/K2/direct->synthetic/K2/quasi_id_redaction"
    assert drift["shared_documents"] == 0  # calibration and test documents are disjoint
    standard = rows_of(rows, "standard", 0.1, "synthetic/K2/quasi_id_redaction")[0]
    assert drift["coverage"] < standard["coverage"] - 0.05


@pytest.mark.slow
def test_truncation_rows_follow_corollary_5_3(small_run):
    """With one split: coverage = conditional coverage x (1 - miss rate), exactly; misses fall as K grows."""
    _, _, result = small_run
    trunc = sorted(rows_of(result["rows"], "truncation", 0.1), key=lambda r: r["top_k"])
    assert [r["top_k"] for r in trunc] == [2, 10]
    for r in trunc:
        assert r["coverage"] == pytest.approx(r["coverage_conditional"] * (1 - r["candidate_miss_rate"]), abs=1e-12)
        assert r["max_set_size"] <= r["top_k"]
    assert trunc[0]["candidate_miss_rate"] > trunc[1]["candidate_miss_rate"] > 0


@pytest.mark.slow
def test_mondrian_rows(small_run):
    _, _, result = small_run
    pooled = rows_of(result["rows"], "pooled", 0.1)
    mondrian = rows_of(result["rows"], "mondrian", 0.1)
    assert len(pooled) == 2 and len(mondrian) == 2
    assert len({r["qhat"] for r in pooled}) == 1  # one threshold for both strata
    assert len({r["qhat"] for r in mondrian}) == 2  # one per stratum


@pytest.mark.slow
def test_run_is_deterministic(small_run, tmp_path):
    cfg, out, _ = small_run
    run_cpa(cfg, str(tmp_path / "again"), progress=False)
    assert json.load(open(tmp_path / "again" / "summary.json")) == json.load(open(os.path.join(out, "summary.json")))


@pytest.mark.slow
def test_a_finished_folder_resumes_its_configuration_and_refuses_another(small_run, tmp_path, capsys):
    """The same configuration into the finished folder reruns to the same summary; another one exits 2 before
    any work, naming the differing key, and leaves every byte of the folder as it was."""
    from pathlib import Path

    from snapaudit_jax.cli import main
    from tests.helpers.bad_input.common import _tree

    cfg, out, first = small_run
    stamp = json.load(open(os.path.join(out, "run.json")))
    assert stamp["command"] == "cpa" and stamp["config"]["run"]["n_cal"] == 60 and stamp["config"]["drift"]
    again = run_cpa(cfg, out, progress=False)
    assert again["rows"] == first["rows"] and not os.path.exists(os.path.join(out, "run.lock"))
    before = _tree(Path(out))
    other = write_config(tmp_path, SMALL.replace("n_cal = 60", "n_cal = 50"))
    assert main(["cpa", other, "--out", out, "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "holds a run of another configuration: run.n_cal is 60 there, 50 here" in err and "Traceback" not in err
    assert _tree(Path(out)) == before


# --------------------------------------------------------------------------- coverage of the runner's rows


def test_runner_coverage_over_splits_is_valid(tmp_path):
    """Mean coverage over 40 independent splits of one suite >= 1 - alpha - 4.3 sd (false failure ~1e-5)."""
    text = SMALL.split("[[drift]]")[0].replace("splits = 1", "splits = 40").replace(
        'levels = ["K1", "K2", "K3"]', 'levels = ["K2"]').replace(
        'releases = ["direct", "quasi_id_redaction"]', 'releases = ["direct"]')
    result = run_cpa(load_cpa_config(write_config(tmp_path, text)), str(tmp_path / "out"), progress=False)
    for r in rows_of(result["rows"], "standard"):
        n = r["n_cal"]
        floor = np.ceil((n + 1) * (1 - r["alpha"])) / (n + 1)
        # per split, coverage of 60 test points has sd <= sqrt(a(1-a)(1/60 + 1/61)) (calibration + test noise)
        sd = np.sqrt(r["alpha"] * (1 - r["alpha"]) * (1 / r["n_test"] + 1 / (n + 1)) / r["splits"])
        assert r["coverage"] >= floor - 4.3 * sd, r
        assert r["coverage"] <= floor + 1 / (n + 1) + 4.3 * sd, r


# --------------------------------------------------------------------------- configuration errors


@pytest.mark.parametrize("edit, match", [
    (("n_cal = 60", "n_cal = 100"), "exceeds"),  # 100 + 60 > 120 documents
    (('calibrate = "synthetic/K2/direct"', 'calibrate = "synthetic/K9/direct"'), "unknown suite"),
    (('suite = "synthetic/K2/direct"', 'suite = "blog/W3"'), "truncation.suite"),
])
def test_reference_errors_write_nothing(tmp_path, edit, match):
    old, new = edit
    cfg = load_cpa_config(write_config(tmp_path, SMALL.replace(old, new, 1)))
    out = tmp_path / "out"
    with pytest.raises(ConfigFileError, match=match):
        run_cpa(cfg, str(out), progress=False)
    assert not out.exists()


# --------------------------------------------------------------------------- LLM attackers (tiny random model)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    sys.path.insert(0, os.path.dirname(__file__))
    from tests.helpers.tiny_llm import make_tiny_llm_folder

    ladder = synthetic_ladder(60, 40, seed=1, releases=("direct",), levels=("K2",))
    texts = [t for s in ladder.values() for t in list(s.documents) + list(s.profiles)]
    return make_tiny_llm_folder(str(tmp_path_factory.mktemp("tiny") / "llm"), texts)


@pytest.fixture(scope="module")
def llm_run(tiny_model, tmp_path_factory):
    """The LLM attackers' run in process: ``(config, run folder, result)`` (shared by the cache and server tests)."""
    tmp = tmp_path_factory.mktemp("llm_run")
    cfg = load_cpa_config(write_config(tmp, LLM_CONFIG.format(model=tiny_model)))
    out = str(tmp / "out")
    return cfg, out, run_cpa(cfg, out, progress=False)


@pytest.mark.slow
def test_llm_attackers_run_cache_and_resume(llm_run):
    cfg, out, first = llm_run
    rows = {r["attacker"]: r for r in first["rows"] if r["kind"] == "standard"}
    assert set(rows) == {"clues", "profile", "profile_gender"}
    n_docs = 36
    assert rows["clues"]["llm_calls"] == n_docs  # one greedy clue list per document
    assert rows["profile"]["llm_calls"] == 4 * n_docs  # one forced-choice scoring per document and attribute
    assert rows["profile_gender"]["llm_calls"] == n_docs
    for r in rows.values():
        assert REQUIRED_KEYS <= set(r) and 0.0 <= r["coverage"] <= 1.0
    # the cache in the run folder makes a rerun free of new model computations and identical
    second = run_cpa(cfg, out, progress=False)
    assert [r["coverage"] for r in second["rows"]] == [r["coverage"] for r in first["rows"]]
    assert [r["median_set_size"] for r in second["rows"]] == [r["median_set_size"] for r in first["rows"]]
    assert os.path.getsize(os.path.join(out, "llm_cache.jsonl")) > 0


def test_profile_attributes_option_is_checked(tmp_path):
    text = LLM_CONFIG.format(model="smollm2")
    with pytest.raises(ConfigFileError, match="attackers.clues.attributes: only for kind 'profile'"):
        load_cpa_config(write_config(tmp_path, text.replace("max_new_tokens = 4",
                                                            'max_new_tokens = 4\nattributes = ["a"]')))
    cfg = load_cpa_config(write_config(tmp_path, text.replace("samples = 5",
                                                              'samples = 5\nattributes = ["shoe_size"]', 1)))
    assert cfg.attackers[1].attributes == ("shoe_size",)
    with pytest.raises(ConfigFileError, match=r"attackers.profile.attributes: \['shoe_size'\] not attributes"):
        run_cpa(cfg, str(tmp_path / "out"), progress=False)
    assert not (tmp_path / "out").exists()


# --------------------------------------------------------------------------- the dataset sources


def test_runner_builds_dataset_suites(tmp_path):
    toml = tmp_path / "cpa.toml"
    toml.write_text(f"""
[run]
seed = 1
n_cal = 2
n_test = 2

[data.tab]
path = {json.dumps(str(TAB))}
releases = ["direct", "quasi_id_redaction"]

[data.textwash]
path = {json.dumps(str(TEXTWASH / "textwash.csv"))}

[data.wikibio]
path = {json.dumps(str(WIKIBIO / "mini.jsonl"))}
levels = ["K2"]

[data.blog_corpus]
path = {json.dumps(str(BLOG))}
W = [1, 10]
max_authors = 3

[attackers.retrieval]
kind = "retrieval"
""")
    suites = build_suites(load_cpa_config(toml))
    assert sorted(suites) == sorted(
        [f"tab/{lv}/{r}" for lv in ("K1", "K2", "K3") for r in ("direct", "quasi_id_redaction")]
        + ["textwash/famous", "textwash/fiction", "wikibio/K2/name_removed", "blog_corpus/W1", "blog_corpus/W10"])
    assert suites["blog_corpus/W10"].n_candidates == 3
    assert all(s.miss_rate() == 0.0 for s in suites.values())


def _served_llm_config(tmp_path, tiny_model, base_url: str, attackers=("clues", "profile", "profile_gender")) -> str:
    text = LLM_CONFIG.format(model="openai")
    for name in {"clues", "profile", "profile_gender"} - set(attackers):
        start = text.index(f"[attackers.{name}]")
        end = text.find("[attackers.", start + 1)
        text = text[:start] + (text[end:] if end > 0 else "")
    text += (f'\n[server]\nbase_url = "{base_url}"\nmodel = "tiny"\ntokenizer = "{tiny_model}"\n'
             "max_concurrency = 2\n")
    return write_config(tmp_path, text, "served.toml")


@pytest.mark.slow
def test_llm_attackers_through_a_model_server_match_the_in_process_model(tiny_model, llm_run, tmp_path):
    """``model = "openai"``: the clue attacker's greedy clues and the profile attackers' forced-choice
    log-probabilities come from a loopback server in vLLM's format serving the same tiny model; the run's
    rows equal the in-process run's (clues exactly; profiles to one document's set per row, the sampled
    choices reading log-probabilities that agree to 2e-4), with the same counted calls and the server in
    config.json and report.md."""
    from snapaudit_jax.models import load_language_model

    from tests.helpers.fake_openai import FakeOpenAI

    local = llm_run[2]
    with FakeOpenAI(load_language_model(tiny_model, data_parallel=False)) as srv:
        out = tmp_path / "served"
        cfg = load_cpa_config(_served_llm_config(tmp_path, tiny_model, srv.base_url))
        assert cfg.server.model == "tiny" and cfg.server_tokenizer == tiny_model
        served = run_cpa(cfg, str(out), progress=False)
        assert srv.completions_made() > 0
    assert served["servers"] == [{"backend": "openai", "base_url": srv.base_url, "model": "tiny"}]
    assert len(served["rows"]) == len(local["rows"])
    for a, b in zip(local["rows"], served["rows"]):
        assert (a["kind"], a["attacker"], a["suite"], a["alpha"]) == (b["kind"], b["attacker"], b["suite"], b["alpha"])
        assert a["llm_calls"] == b["llm_calls"]
        if a["attacker"] == "clues":
            assert a == b
        else:
            for key in ("coverage", "top1"):
                assert abs(a[key] - b[key]) <= 1 / a["n_test"] + 1e-12, (key, a, b)
    written = json.loads((out / "config.json").read_text())
    assert written["server"]["base_url"] == srv.base_url and written["server"]["tokenizer"] == tiny_model
    report = (out / "report.md").read_text()
    assert f"model `tiny` of the OpenAI-compatible server at {srv.base_url}" in report
    with open(out / "llm_cache.jsonl") as fh:
        assert sum(1 for _ in fh) > 0


@pytest.mark.slow
def test_a_profile_attacker_needs_log_probs_and_stops_before_any_output(tiny_model, tmp_path):
    """A server without log-probabilities (as ``transformers serve``) runs the clue attacker, but a profile
    attacker stops with the capability error before the run folder exists."""
    from snapaudit_jax.models import load_language_model
    from snapaudit_jax.utils.errors import ServerError

    from tests.helpers.fake_openai import FakeOpenAI

    lm = load_language_model(tiny_model, data_parallel=False)
    with FakeOpenAI(lm, logprobs=False) as srv:
        out = tmp_path / "profile"
        cfg = load_cpa_config(_served_llm_config(tmp_path, tiny_model, srv.base_url, ("clues", "profile")))
        with pytest.raises(ServerError, match=r"the profile attacker 'profile' \(forced-choice label "
                                              r"log-probabilities\) needs logprobs from the model server"):
            run_cpa(cfg, str(out), progress=False)
        assert not out.exists()
        cfg = load_cpa_config(_served_llm_config(tmp_path, tiny_model, srv.base_url, ("clues",)))
        rows = run_cpa(cfg, str(tmp_path / "clues"), progress=False)["rows"]
        assert {r["attacker"] for r in rows} == {"clues"} and all(r["llm_calls"] == 36 for r in rows)


@pytest.mark.parametrize("edit,match", [
    (lambda t: t.replace("[server]", "[serverx]"), "serverx"),
    (lambda t: t[:t.index("[server]")], r'server: attackers.clues.model = "openai" needs a \[server\] table'),
    (lambda t: t.replace('model = "tiny"\n', ""), "server.model: required"),
    (lambda t: t.replace("max_concurrency = 2", "max_concurrency = 0"),
     "server.max_concurrency must be an integer >= 1, got 0"),
    (lambda t: t.replace("http://", "http://u:pw@"), "server.base_url must not embed credentials"),
    (lambda t: t.replace('model = "openai"', 'model = "smollm2"'), 'server: only read when an LLM attacker'),
])
def test_bad_server_sections_name_the_key(tmp_path, edit, match):
    text = open(_served_llm_config(tmp_path, "smollm2", "http://127.0.0.1:9")).read()
    with pytest.raises(ConfigFileError, match=match) as err:
        load_cpa_config(write_config(tmp_path, edit(text), "bad.toml"))
    assert "pw" not in str(err.value)
