"""`snapaudit audit CONFIG.toml`, `generate` and `embed`: configuration, outputs, resume, bad input."""

from __future__ import annotations

import json
import os
import re

import pytest

pytest.importorskip("flax")
pytest.importorskip("torch")

from _tiny_llm import make_tiny_llm_folder  # noqa: E402

from snapaudit_jax.cli import main  # noqa: E402
from snapaudit_jax.data import load_examples  # noqa: E402
from snapaudit_jax.experiment import ConfigFileError, load_config, run_audit  # noqa: E402

ROW_KEYS = {"pipeline", "mode", "threat", "epsilon_theory", "epsilon_emp", "llm_calls", "seconds"}


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    return make_tiny_llm_folder(str(tmp_path_factory.mktemp("tiny")), [e.text for e in load_examples("agnews")])


def _config(tmp_path, tiny_folder, body: str = "") -> str:
    path = tmp_path / "audit.toml"
    path.write_text(
        f'[model]\nllm = "{tiny_folder}"\n\n[audit]\nepsilons = [2, 8]\nsnapshots = 6\ntrials = 20000\n'
        'passive_runs = 6\nverify = 2\n\n[pipelines.pv]\nnum_exemplars = 6\npartitions = 3\n\n'
        "[pipelines.poe]\nnum_exemplars = 4\n" + body
    )
    return str(path)


def test_quickstart_config_is_valid():
    cfg = load_config(os.path.join(os.path.dirname(__file__), "..", "examples", "quickstart.toml"))
    assert {p.name for p in cfg.pipelines} == {"pv", "poe", "esa", "ksa"}
    assert cfg.query == "copy" and cfg.clean == "fixed" and cfg.mia is not None


BAD = [
    ("[audit]\nepsilons = [1, -2]\n[pipelines.pv]\n", "epsilon"),
    ("[audit]\nquery = \"shouting\"\n[pipelines.pv]\n", "audit.query"),
    ("[audit]\nsnapshots = 1\n[pipelines.pv]\n", "audit.snapshots"),
    ("[audit]\ndelta = 2\n[pipelines.pv]\n", "audit.delta"),
    ("[audit]\ncolour = 1\n[pipelines.pv]\n", "audit: unknown key(s) colour"),
    ("[audit]\nthreats = \"black\"\n[pipelines.pv]\n", "audit.threats"),
    ("[audit]\non_mismatch = \"ignore\"\n[pipelines.pv]\n", "audit.on_mismatch"),
    ("[pipelines.lasso]\n", "pipelines.lasso"),
    ("[pipelines.pv]\nnum_exemplars = 4\npartitions = 6\n", "pipelines.pv.partitions"),
    ("[pipelines.esa]\nsignals = [\"only one\"]\n", "pipelines.esa.signals"),
    ("[pipelines.pv]\ndataset = \"imdb\"\n", "pipelines.pv.dataset"),
    ("[audit]\n", "no [pipelines"),
    ("[mia]\nqueries = [\"direct\", \"yelling\"]\n[pipelines.pv]\n", "mia.queries"),
    ("[extras]\n[pipelines.pv]\n", "unknown key(s) extras"),
    ("this is = not toml [", "invalid TOML"),
    ("[pipelines.ksa]\nneighbouring = \"swap\"\n", "pipelines.ksa.neighbouring"),
    ("[pipelines.pv]\nneighbouring = \"add_remove\"\n", "pipelines.pv.neighbouring: only KSA takes 'add_remove'"),
    ("[pipelines.ksa]\nnum_exemplars = 8\npartitions = 4\nneighbouring = \"add_remove\"\n",
     "pipelines.ksa.neighbouring: 'add_remove' needs one exemplar per partition (partitions = num_exemplars = 8), "
     "got partitions=4"),
]


@pytest.mark.parametrize("text,needle", BAD)
def test_bad_configs_name_the_key(tmp_path, capsys, text, needle):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigFileError, match=re.escape(needle)):
        load_config(path)
    out_dir = tmp_path / "out"
    assert main(["audit", str(path), "--out", str(out_dir), "--quiet"]) == 2
    assert needle in capsys.readouterr().err
    assert not out_dir.exists()


def test_fixed_clean_outputs_and_the_determinism_check():
    """clean = fixed states the mixture assumption; a mismatch falls back to sampled (warned) or stops."""
    from snapaudit_jax.experiment import AuditConfig, _clean_model

    def quiet(message):
        return None

    clean, notes, warns = _clean_model(AuditConfig(), {"checked": 4, "mismatches": 0}, quiet)
    assert clean == "fixed" and "mixture" in notes[0] and "evidence" in notes[0] and warns == ()
    clean, notes, warns = _clean_model(AuditConfig(), {"checked": 4, "mismatches": 1}, quiet)
    assert clean == "sampled" and "1 of 4" in warns[0] and "audited as clean = sampled" in notes[0]
    with pytest.raises(ValueError, match=r"audit.clean: determinism check: 1 of 4"):
        _clean_model(AuditConfig(on_mismatch="fail"), {"checked": 4, "mismatches": 1}, quiet)
    assert _clean_model(AuditConfig(clean="sampled"), {"checked": 4, "mismatches": 1}, quiet)[0] == "sampled"


def test_missing_config_file(capsys, tmp_path):
    assert main(["audit", str(tmp_path / "nope.toml"), "--quiet"]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_run_audit_writes_results_and_resumes(tmp_path, tiny_folder):
    cfg = load_config(_config(tmp_path, tiny_folder))
    out = str(tmp_path / "run")
    result = run_audit(cfg, out, progress=False)
    rows = json.load(open(os.path.join(out, "results.json")))
    assert rows == json.loads(json.dumps(result["rows"]))
    assert all(set(r) == ROW_KEYS for r in rows)
    # 2 pipelines x 2 epsilons x 2 threats x (active, passive).
    assert len(rows) == 16 and {r["mode"] for r in rows} == {"active", "passive"}
    for pipe, calls in (("pv", 2 * 6 * 3), ("poe", 2 * 6 * 4)):
        assert {r["llm_calls"] for r in rows if r["pipeline"] == pipe} == {calls}  # same budget both ways
    assert all(r["epsilon_emp"] >= 0 for r in rows)
    for name in ("table.md", "results_full.json", "pv.png", "poe.png", "llm_cache.jsonl",
                 "snapshots/pv.npz", "snapshots/pv.manifest.json"):
        assert os.path.exists(os.path.join(out, name)), name
    table = open(os.path.join(out, "table.md")).read()
    assert "## pv" in table and "determinism check" in table
    again = run_audit(cfg, out, progress=False)
    assert again["summary"]["pipelines"]["pv"]["manifest"]["resumed"] is True
    assert again["summary"]["llm_calls"]["computed"] == 0  # every answer came from the cache


def test_cli_audit_prints_the_table(tmp_path, tiny_folder, capsys):
    path = _config(tmp_path, tiny_folder)
    assert main(["audit", path, "--out", str(tmp_path / "cli"), "--quiet"]) == 0
    assert "| eps_theory |" in capsys.readouterr().out


def test_cli_generate_and_embed_json(tiny_folder, capsys):
    assert main(["generate", "--model", tiny_folder, "--prompt", "Hello there", "--chat", "--max-new-tokens", "5",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"model", "text", "token_ids", "seconds"} and 1 <= len(out["token_ids"]) <= 5
    sampled = [None, None]
    for i in range(2):
        assert main(["generate", "--model", tiny_folder, "--prompt", "Hello", "--max-new-tokens", "6",
                     "--temperature", "1.5", "--seed", "7", "--json"]) == 0
        sampled[i] = json.loads(capsys.readouterr().out)["token_ids"]
    assert sampled[0] == sampled[1]  # explicit key: reproducible sampling
    assert main(["embed", "--text", "a cat", "--text", "a dog sleeps", "--json"]) == 0
    emb = json.loads(capsys.readouterr().out)
    assert set(emb) == {"model", "embeddings"} and len(emb["embeddings"]) == 2
    assert all(abs(sum(x * x for x in v) - 1.0) < 1e-4 for v in emb["embeddings"])


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["generate", "--prompt", "hi", "--temperature", "0.5"], "--seed"),
        (["generate", "--prompt", "hi", "--max-new-tokens", "0"], "--max-new-tokens"),
        (["generate", "--prompt", "  "], "--prompt"),
        (["generate", "--model", "/no/such/model", "--prompt", "hi"], "/no/such/model"),
        (["embed", "--model", "/no/such/folder", "--text", "x"], "/no/such/folder"),
    ],
)
def test_cli_model_commands_bad_input(argv, needle, capsys):
    assert main(argv) == 2
    assert needle in capsys.readouterr().err
