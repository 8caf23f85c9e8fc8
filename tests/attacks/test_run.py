"""The PII leakage experiment runner (``snapaudit pii``) on a tiny configuration.

What is under test is the orchestration (:mod:`attacks.run`, with :mod:`attacks.report`'s table): the four
variants' training setup (DP or not, scrubbed or not), the result keys and their null rules, the
claimed-vs-audited epsilon relation, resume, and refusal of a folder of another run. Configuration and data
errors are in test_config.py and test_data.py; the attacks and DP-SGD themselves are tested against their
oracles in the other modules of tests/attacks/ and in tests/snapaudit_jax/dpsgd/test_dpsgd.py.
"""

from __future__ import annotations

import json
import os

import pytest

from attacks.config import RESULT_KEYS, load_pii_config
from attacks.run import run_pii
from snapaudit_jax.utils.config import ConfigFileError
from snapaudit_jax.report.html import write_report
from tests.helpers.pii import tiny_pii_toml, write_toml
from tests.helpers.report import check_report

TINY = tiny_pii_toml("{variants}")


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pii")
    cfg = load_pii_config(write_toml(tmp, TINY.format(variants="")))
    out = str(tmp / "out")
    return cfg, out, run_pii(cfg, out, progress=False)


@pytest.mark.slow
def test_results_json_has_every_variant_and_key(tiny_run):
    cfg, out, result = tiny_run
    assert {"results.json", "results_full.json", "table.md", "leakage.png", "config.json"} <= set(os.listdir(out))
    # the page of the run (what `snapaudit pii` writes): results cell for cell, the leakage figure's SVG copy
    check_report(write_report(out, os.path.join(os.path.dirname(out), "pii_report.html")),
                 os.path.join(out, "results.json"), figures=1)
    results = json.load(open(os.path.join(out, "results.json")))
    assert list(results) == ["undefended", "dp", "scrubbed", "dp_scrubbed"]
    for name, row in results.items():
        assert set(row) == set(RESULT_KEYS)
        assert row["perplexity"] > 1.0
        for key in ("reconstruction_accuracy", "inference_accuracy", "mia_auc"):
            assert 0.0 <= row[key] <= 1.0
        dp = name.startswith("dp")
        assert (row["epsilon_claimed"] is None) == (not dp)
        if dp:  # calibrated to the target by the configured accountant, within its tolerance
            assert row["epsilon_claimed"] == pytest.approx(cfg.training.epsilon, rel=0.02)
            assert row["epsilon_audited"] is not None and 0.0 <= row["epsilon_audited"] <= row["epsilon_claimed"]
    full = json.load(open(os.path.join(out, "results_full.json")))
    rep = full["variants"]["dp"]["report"]
    assert rep["sampling"] == "poisson" and rep["steps"] == cfg.training.steps
    assert rep["clip_norm"] == cfg.training.clip_norm and rep["noise_multiplier"] > 0
    assert full["variants"]["undefended"]["report"]["dp"] is False
    lazy = full["variants"]["undefended"]["lazy_extraction"]
    assert 0.0 <= lazy["expected_recall"] <= 1.0 and lazy["n_targets"] == len(lazy["items"]) > 0
    # the scrubbed variants trained on text without the tagged PII: the tagger's recall is recorded
    assert full["tagger"]["all"]["recall"] > 0.9
    table = open(os.path.join(out, "table.md")).read()
    for name in results:
        assert f"| {name} |" in table
    # DP against undefended, printed with its goals; exposure of every variant, by the finetune card's function
    from attacks.report import compare_variants

    assert full["goals"] == json.loads(json.dumps(compare_variants(results)))
    ratio = full["goals"]["dp_over_undefended_perplexity"]["ratio"]
    assert ratio == pytest.approx(results["dp"]["perplexity"] / results["undefended"]["perplexity"])
    assert "DP against undefended" in table
    for name, row in results.items():
        exposure = full["variants"][name]["exposure"]
        assert row["canary_exposure"] == exposure["median_inserted"]
        assert 0.0 <= exposure["median_held_out"] <= exposure["max_possible"] and exposure["method"] == "extrapolated"


def test_dp_against_undefended_is_two_ratios_beside_their_goals():
    from attacks.report import GOALS, compare_variants

    rows = {"undefended": {"perplexity": 10.0, "extraction_recall": 0.4},
            "dp": {"perplexity": 14.0, "extraction_recall": 0.3}}
    out = compare_variants(rows)
    assert set(out) == {"note", *GOALS}
    assert out["dp_over_undefended_perplexity"] == {"ratio": pytest.approx(1.4), "goal": 1.5, "met": True}
    assert out["dp_over_undefended_extraction_recall"] == {"ratio": pytest.approx(0.75), "goal": 0.5, "met": False}
    rows["undefended"]["extraction_recall"] = 0.0  # nothing extracted: no ratio, never a division by zero
    recall = compare_variants(rows)["dp_over_undefended_extraction_recall"]
    assert recall["ratio"] is None and recall["met"] is None and "no ratio" in recall["reason"]
    assert compare_variants({"dp": rows["dp"]}) is None


@pytest.mark.slow
def test_rerun_resumes_without_retraining(tiny_run, capfd):
    cfg, out, first = tiny_run
    again = run_pii(cfg, out, progress=True)
    err = capfd.readouterr().err
    assert err.count("attacks already done") == 4 and "training undefended" not in err
    assert again["results"] == first["results"]


@pytest.mark.slow
def test_a_write_failure_is_a_clean_error_and_the_rerun_finishes(tiny_run, tmp_path, capsys):
    """A full disk while a copy of the finished run rewrites its results (the injector of
    tests/test_write_failures.py): exit 2 naming the file and the cause, nothing partial; the rerun finishes."""
    import errno
    import shutil

    from snapaudit_jax.cli import main
    from tests.test_write_failures import _clean_error, _leftovers, failing_fsync

    _, out, first = tiny_run
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    os.remove(copy / "results.json")
    argv = ["pii", write_toml(tmp_path, TINY.format(variants="")), "--out", str(copy), "--quiet"]
    with failing_fsync(copy, 1, errno.ENOSPC) as fault:
        assert main(argv) == 2
    assert fault["fired"]
    failed = _clean_error(capsys, "pii", errno.ENOSPC, copy).rsplit("'", 2)[-2]
    assert not os.path.exists(failed) and _leftovers(copy) == [] and not (copy / "results.json").exists()
    assert main(argv) == 0
    assert json.load(open(copy / "results.json")) == first["results"] and _leftovers(copy) == []


@pytest.mark.slow
def test_other_configuration_refuses_the_folder(tiny_run, tmp_path):
    _, out, _ = tiny_run
    other = load_pii_config(write_toml(tmp_path, TINY.format(variants="").replace("seed = 1", "seed = 2")))
    with pytest.raises(ConfigFileError, match="another configuration"):
        run_pii(other, out, progress=False)


@pytest.mark.slow
def test_headline_columns_follow_the_paper(tiny_run):
    """Row = Table III's PERSON extraction against tagged training PII, accuracies excluding what the public
    model already gets right (raw beside them), and both membership attacks."""
    import numpy as np

    from attacks.corpus import make_corpus
    from attacks.extraction import normalize_pii
    from attacks.ner import default_tagger

    cfg, out, result = tiny_run
    full = json.load(open(os.path.join(out, "results_full.json")))["variants"]
    corpus = make_corpus(cfg.corpus)  # the runner's split, recomputed
    held = set(int(i) for i in np.random.default_rng([cfg.seed, 11]).permutation(len(corpus.records))[:cfg.n_test])
    train = [r.text for r in corpus.records if r.index not in held]
    tagged_person = {normalize_pii(s.value) for spans in default_tagger(cfg.corpus.locale).tag(train)
                     for s in spans if s.label == "PERSON"}
    for name, row in result["results"].items():
        f = full[name]
        person = f["extraction"]["tagged"]["per_label"]["PERSON"]
        assert person["n_training"] == len(tagged_person)
        assert row["extraction_precision"] == (person["precision"] if person["n_extracted"] else None)
        assert row["extraction_recall"] == person["recall"]
        rec, inf = f["reconstruction"], f["inference"]
        assert row["reconstruction_accuracy_raw"] == rec["accuracy"]
        assert row["reconstruction_accuracy"] == (rec["accuracy_excluding_baseline"]
                                                  if rec["n_excluding_baseline"] else None)
        assert row["inference_accuracy_raw"] == inf["accuracy"] and inf["n_candidates"] == 5
        assert row["mia_auc"] == f["mia"]["auc"] and row["mia_auc_reference"] == f["mia_reference"]["auc"]
        assert f["mia_reference"]["score"] == "-(loss - reference loss)"
        assert f["evaluation_text"] == ("scrubbed" if "scrubbed" in name else "raw")
    table = open(os.path.join(out, "table.md")).read()
    assert "MIA AUC (reference)" in table and "inference |C| = 5" in table


@pytest.mark.slow
def test_scrubbed_variants_are_evaluated_on_scrubbed_text(tiny_run):
    """Perplexity and membership members/non-members of a scrubbed variant use the text as it trained on."""
    import numpy as np

    from attacks.blackbox import score_texts
    from attacks.corpus import insert_canaries
    from attacks.data import prepare_data
    from attacks.run import perplexity, train_variant
    from attacks.ner import MASK
    from snapaudit_jax.utils.progress import RunLog

    cfg, out, result = tiny_run
    quiet = RunLog(False)
    data = prepare_data(cfg, quiet)
    assert any(MASK in t for t in data.scrubbed_test) and data.scrubbed_test != [r.text for r in data.test]
    model, _ = train_variant("scrubbed", insert_canaries(data.scrubbed, data.canaries), False, cfg, data, out, quiet)
    bs = cfg.eval_batch_size
    scrubbed_ppl = perplexity(model, data.tokenizer, data.scrubbed_test, bs)
    raw_ppl = perplexity(model, data.tokenizer, [r.text for r in data.test], bs)
    assert result["results"]["scrubbed"]["perplexity"] == pytest.approx(scrubbed_ppl, rel=1e-5)
    assert abs(scrubbed_ppl - raw_ppl) > 1e-3 * raw_ppl  # the two texts give different figures
    idx = np.random.default_rng([cfg.seed, 13]).choice(len(data.train), len(data.test), replace=False)
    members = [data.scrubbed[int(i)] for i in idx]
    full = json.load(open(os.path.join(out, "results_full.json")))["variants"]["scrubbed"]
    np.testing.assert_allclose(full["mia"]["member_scores"],
                               -score_texts(model, data.tokenizer, members, batch_size=bs).mean_nll, rtol=1e-5)
    np.testing.assert_allclose(full["mia"]["nonmember_scores"],
                               -score_texts(model, data.tokenizer, data.scrubbed_test, batch_size=bs).mean_nll,
                               rtol=1e-5)




def test_training_arrays_end_at_the_longest_record_rounded_to_eight():
    """Steps cost their padded width: the arrays are as wide as the longest framed record needs (a multiple of 8,
    at most max_length), the same tokens and mask as the full-width encoding's first columns, the rest padding."""
    import numpy as np

    from attacks.blackbox import encode_texts, frame
    from attacks.run import training_arrays
    from tests.helpers.attack_lm import small_lm

    _, tok = small_lm()
    texts = ["Ana Lopez wrote to Ben.", "a much longer record than the first one, naming Carla Diaz of Madrid twice"]
    longest = max(len(frame(tok, t)) for t in texts)
    tokens, mask = training_arrays(tok, texts, 192)
    assert tokens.shape[1] % 8 == 0 and longest <= tokens.shape[1] < longest + 8
    wide_tokens, wide_mask = encode_texts(tok, texts, 192)
    width = tokens.shape[1]
    assert np.array_equal(tokens, wide_tokens[:, :width]) and np.array_equal(mask, wide_mask[:, :width])
    assert not wide_mask[:, width:].any()
    assert training_arrays(tok, texts, longest)[0].shape[1] == longest  # never wider than max_length
