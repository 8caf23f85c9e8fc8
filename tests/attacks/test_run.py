"""The PII leakage experiment runner (``snapaudit pii``) on a tiny configuration.

What is under test is the orchestration: the four variants' training setup (DP or not, scrubbed or
not), the result keys and their null rules, the claimed-vs-audited epsilon relation, resume, refusal of
a folder of another run, and configuration errors raised before anything is written. The attacks and
DP-SGD themselves are tested against their oracles in test_attacks.py and test_dpsgd.py.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys

import pytest

from attacks.run import RESULT_KEYS, load_pii_config, run_pii
from snapaudit_jax.utils.config import ConfigFileError

TINY = """
[run]
seed = 1
n_test = 16
public_records = 60
{variants}

[corpus]
n_records = 80
n_people = 20

[canaries]
n_canaries = 16

[model]
n_layer = 1
n_embd = 32
n_head = 2
max_length = 192
vocab_size = 400

[training]
steps = 6
batch_size = 8
learning_rate = 1e-2

[extraction]
n_samples = 8
max_new_tokens = 16

[reconstruction]
n_samples = 4
max_queries = 4

[inference]
n_candidates = 5
max_queries = 4
"""


def write(tmp_path, text, name="pii.toml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pii")
    cfg = load_pii_config(write(tmp, TINY.format(variants="")))
    out = str(tmp / "out")
    return cfg, out, run_pii(cfg, out, progress=False)


def test_results_json_has_every_variant_and_key(tiny_run):
    cfg, out, result = tiny_run
    assert {"results.json", "results_full.json", "table.md", "leakage.png", "config.json"} <= set(os.listdir(out))
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


def test_rerun_resumes_without_retraining(tiny_run, capfd):
    cfg, out, first = tiny_run
    again = run_pii(cfg, out, progress=True)
    err = capfd.readouterr().err
    assert err.count("attacks already done") == 4 and "training undefended" not in err
    assert again["results"] == first["results"]


def test_other_configuration_refuses_the_folder(tiny_run, tmp_path):
    _, out, _ = tiny_run
    other = load_pii_config(write(tmp_path, TINY.format(variants="").replace("seed = 1", "seed = 2")))
    with pytest.raises(ConfigFileError, match="another configuration"):
        run_pii(other, out, progress=False)


@pytest.mark.parametrize("old, new, match", [
    ("n_layer = 1", "n_layer = 0", "model: n_layer"),
    ("steps = 6", "steps = 6\nbogus = 1", "training: unknown key"),
    ("n_test = 16", "n_test = 80", "run.n_test"),
    ("{variants}", 'variants = ["dp", "nope"]', "variants"),
    ("n_canaries = 16", "n_canaries = 1", "canaries: n_canaries"),
    ("n_candidates = 5", "n_candidates = 1", "inference: n_candidates"),
    ("learning_rate = 1e-2", "learning_rate = -1.0", "training: learning_rate"),
])
def test_config_errors_name_the_field(tmp_path, old, new, match):
    text = TINY.replace(old, new) if old != "{variants}" else TINY.format(variants=new)
    with pytest.raises(ConfigFileError, match=match):
        load_pii_config(write(tmp_path, text.replace("{variants}", "")))


def test_too_short_max_length_fails_before_writing(tmp_path):
    cfg = load_pii_config(write(tmp_path, TINY.format(variants="").replace("max_length = 192", "max_length = 24")))
    out = tmp_path / "out"
    with pytest.raises(ConfigFileError, match="model.max_length: must be >= "):
        run_pii(cfg, str(out), progress=False)
    assert not out.exists()


def test_cli_exit_code_on_bad_config(tmp_path):
    path = write(tmp_path, TINY.format(variants="").replace("n_embd = 32", "n_embd = 33"))
    proc = subprocess.run([sys.executable, "-m", "snapaudit_jax", "pii", path, "--out", str(tmp_path / "o")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "n_embd" in proc.stderr and "33" in proc.stderr
    assert not (tmp_path / "o").exists()


def test_one_run_audit_refuses_unfair_canary_insertion_before_writing(tmp_path):
    """epsilon_audited is our one-run bound of an (eps, delta) claim, and jax_privacy's one-run value its
    cross-reference: both need canaries inserted with probability 1/2 (Steinke et al. 2023), so any other
    insert_probability is a config error at load time (and in run_pii for a config built in code), before
    anything is written; with audit.one_run and audit.jax_privacy off it is allowed."""
    unfair = TINY.format(variants="").replace("n_canaries = 16", "n_canaries = 16\ninsert_probability = 0.8")
    ours = ("canaries.insert_probability: must be 1/2 for our one-run bound of an (eps, delta) claim with delta = ")
    with pytest.raises(ConfigFileError, match=re.escape(ours) + r".*got 0.8; set it to 0.5 or set audit.one_run"):
        load_pii_config(write(tmp_path, unfair))
    message = ("canaries.insert_probability: the one-run bound (Steinke et al. 2023) requires each canary inserted "
               "independently with probability 1/2, got 0.8; set it to 0.5 or set audit.jax_privacy = false")
    with pytest.raises(ConfigFileError, match=re.escape(message)):
        load_pii_config(write(tmp_path, unfair + "\n[audit]\none_run = false\n", "jp.toml"))
    allowed = load_pii_config(write(tmp_path, unfair + "\n[audit]\njax_privacy = false\none_run = false\n",
                                    "off.toml"))
    assert allowed.canaries.insert_probability == 0.8 and not allowed.audit.jax_privacy
    built = dataclasses.replace(allowed, audit=dataclasses.replace(allowed.audit, jax_privacy=True))
    with pytest.raises(ConfigFileError, match=re.escape(message)):
        run_pii(built, str(tmp_path / "out"), progress=False)
    assert not (tmp_path / "out").exists()
    proc = subprocess.run([sys.executable, "-m", "snapaudit_jax", "pii", write(tmp_path, unfair), "--out",
                           str(tmp_path / "o")], capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "canaries.insert_probability" in proc.stderr and "got 0.8" in proc.stderr
    assert not (tmp_path / "o").exists()


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


def test_scrubbed_variants_are_evaluated_on_scrubbed_text(tiny_run):
    """Perplexity and membership members/non-members of a scrubbed variant use the text as it trained on."""
    import numpy as np

    from attacks.blackbox import score_texts
    from attacks.corpus import insert_canaries
    from attacks.run import _perplexity, _prepare, _train
    from attacks.ner import MASK
    from snapaudit_jax.utils.progress import RunLog

    cfg, out, result = tiny_run
    quiet = RunLog(False)
    data = _prepare(cfg, quiet)
    assert any(MASK in t for t in data.scrubbed_test) and data.scrubbed_test != [r.text for r in data.test]
    model, _ = _train("scrubbed", insert_canaries(data.scrubbed, data.canaries), False, cfg, data, out, quiet)
    bs = cfg.eval_batch_size
    scrubbed_ppl = _perplexity(model, data, data.scrubbed_test, bs)
    raw_ppl = _perplexity(model, data, [r.text for r in data.test], bs)
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


def test_inference_pool_too_small_fails_before_writing(tmp_path):
    cfg = load_pii_config(write(tmp_path, TINY.format(variants="").replace("n_candidates = 5",
                                                                           "n_candidates = [5, 500]")))
    assert cfg.inference.sizes == (5, 500)
    out = tmp_path / "out"
    with pytest.raises(ConfigFileError, match=r"inference.n_candidates: \|C\| = 500 needs at least that many"):
        run_pii(cfg, str(out), progress=False)
    assert not out.exists()
