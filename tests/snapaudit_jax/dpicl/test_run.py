"""`snapaudit audit CONFIG.toml`, `generate` and `embed`: configuration, outputs, resume, bad input."""

from __future__ import annotations

import json
import os
import re

import pytest

pytest.importorskip("flax")
pytest.importorskip("torch")

from snapaudit_jax.report.html import write_report  # noqa: E402
from tests.helpers.docs import documented_keys  # noqa: E402
from tests.helpers.paths import EXAMPLES  # noqa: E402
from tests.helpers.report import check_report  # noqa: E402
from tests.helpers.tiny_llm import make_tiny_llm_folder  # noqa: E402

from snapaudit_jax.cli import main  # noqa: E402
from snapaudit_jax.dpicl.data import load_examples  # noqa: E402
from snapaudit_jax.dpicl.config import ConfigFileError, load_config  # noqa: E402
from snapaudit_jax.dpicl.run import run_audit  # noqa: E402

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
    cfg = load_config(str(EXAMPLES / "quickstart.toml"))
    assert {p.name for p in cfg.pipelines} == {"pv", "poe", "esa", "ksa"}
    assert cfg.query == "copy" and cfg.clean == "fixed" and cfg.mia is not None


def test_bare_pipeline_sections_load_with_consistent_defaults(tmp_path):
    """Every pipeline's defaults satisfy its own rules (KSA: 8 partitions need 8 exemplars)."""
    for name in ("pv", "poe", "esa", "ksa"):
        path = tmp_path / f"{name}.toml"
        path.write_text(f"[pipelines.{name}]\n")
        (p,) = load_config(path).pipelines
        assert p.partitions is None or p.partitions <= p.num_exemplars
    assert (p.num_exemplars, p.partitions) == (8, 8)


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
    ("[pipelines.esa]\ncandidate_calls = 0\n",
     "pipelines.esa.candidate_calls: candidate_calls must be an integer >= 1, got 0"),
    ("[pipelines.esa]\ncandidate_calls = 2.5\n",
     "pipelines.esa.candidate_calls: candidate_calls must be an integer >= 1, got 2.5"),
    ("[pipelines.esa]\ncandidate_calls = true\n",
     "pipelines.esa.candidate_calls: candidate_calls must be an integer >= 1, got True"),
    ("[pipelines.esa]\ncandidates = \"random\"\n",
     "pipelines.esa.candidates: must be one of 'sampled', 'fixed', got 'random'"),
    ("[pipelines.pv]\ncandidates = \"fixed\"\n", "pipelines.pv.candidates: only ESA has a candidate stage"),
    ("[pipelines.ksa]\ncandidate_calls = 4\n", "pipelines.ksa.candidate_calls: only ESA has a candidate stage"),
    ("[audit]\nmethod = \"paper\"\n[pipelines.pv]\n", "audit.method: must be one of 'simulate', 'exact'"),
    ("[audit]\nmethod = \"exact\"\n[pipelines.ksa]\nnum_exemplars = 8\n",
     "audit.method: 'exact' has no closed form for KSA"),
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
    from snapaudit_jax.dpicl.config import AuditConfig
    from snapaudit_jax.dpicl.run import _clean_model

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


@pytest.mark.slow
def test_run_audit_writes_results_and_resumes(tmp_path, tiny_folder):
    cfg = load_config(_config(tmp_path, tiny_folder))
    out = str(tmp_path / "run")
    result = run_audit(cfg, out, progress=False)
    rows = json.load(open(os.path.join(out, "results.json")))
    assert rows == json.loads(json.dumps(result["rows"]))
    assert all(set(r) == ROW_KEYS for r in rows)
    assert ROW_KEYS == documented_keys("audit.md", "`results.json` is a list of rows", "\n\n")  # what the guide says
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
    # the page of the run: results cell for cell, one figure per pipeline (its SVG copy), loaded in Chromium
    # where it is installed
    assert os.path.exists(os.path.join(out, "pv.svg")) and os.path.exists(os.path.join(out, "poe.svg"))
    check_report(write_report(out), os.path.join(out, "results.json"), figures=2)
    os.remove(os.path.join(out, "report.html"))  # the resume below compares the folder as run_audit left it
    again = run_audit(cfg, out, progress=False)
    assert again["summary"]["pipelines"]["pv"]["manifest"]["resumed"] is True
    assert again["summary"]["llm_calls"]["computed"] == 0  # every answer came from the cache
    _resumed_same_and_another_refused(tmp_path, tiny_folder, out, result, again)


def _resumed_same_and_another_refused(tmp_path, tiny_folder, out, first, again):
    """A finished folder: the same configuration resumed to the same rows and the same logical model calls (the
    resumed Phase A counted, not asked again); another one refused before any work, every byte unchanged."""
    from tests.helpers.bad_input.common import _tree

    def timeless(rows):
        return [{k: v for k, v in r.items() if k != "seconds"} for r in rows]

    assert timeless(again["rows"]) == timeless(first["rows"])
    fresh, resumed = first["summary"]["llm_calls"], again["summary"]["llm_calls"]
    assert fresh["resumed"] == 0 and fresh["calls"] == fresh["computed"] + fresh["cached"] > 0
    phase_a = sum(p["manifest"]["oracle_calls"]["calls"] for p in first["summary"]["pipelines"].values())
    assert resumed["resumed"] == phase_a > 0 and resumed["cached"] == fresh["calls"] - phase_a
    assert resumed["calls"] == fresh["calls"] and resumed["embed_calls"] == fresh["embed_calls"]
    stamp = json.load(open(os.path.join(out, "run.json")))
    assert stamp["command"] == "audit" and stamp["config"]["audit"]["trials"] == 20000
    assert "batch_size" not in stamp["config"]["audit"] and not os.path.exists(os.path.join(out, "run.lock"))
    before = _tree(tmp_path / "run")
    (tmp_path / "other").mkdir()
    other = open(_config(tmp_path / "other", tiny_folder)).read().replace("trials = 20000", "trials = 30000")
    (tmp_path / "other" / "audit.toml").write_text(other)
    with pytest.raises(ConfigFileError, match=r"--out .*run holds a run of another configuration: audit.trials "
                                              r"is 20000 there, 30000 here; choose another --out folder"):
        run_audit(load_config(tmp_path / "other" / "audit.toml"), out, progress=False)
    assert _tree(tmp_path / "run") == before


@pytest.mark.slow
def test_cli_audit_prints_the_table(tmp_path, tiny_folder, capsys):
    path = _config(tmp_path, tiny_folder)
    assert main(["audit", path, "--out", str(tmp_path / "cli"), "--quiet"]) == 0
    assert "| eps_theory |" in capsys.readouterr().out
    assert (tmp_path / "cli" / "report.html").read_text().startswith("<!DOCTYPE html>")  # the command writes it


@pytest.mark.slow
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


# --- ESA's candidate stage through `snapaudit audit` (scripted model, hashing embedder) -----------------------
Y1, Y2 = "the cat sleeps on the warm mat", "quarterly revenue exceeded all forecasts"
OFF = "Here is one of the two sentences"


def _esa_answers(n, i):
    """Candidate answers: the first three computed [y1, off-signal, y2], then y1/y2 by the pseudo-seed's parity."""
    return [f"1. {Y1}", f"{OFF}.", f"{Y2}.\n2. {Y1}"][i] if i < 3 else (Y1 if n % 2 == 0 else Y2)


@pytest.fixture
def scripted(monkeypatch):
    """Patches the model loaders: a ScriptedLM (candidate answers from ``holder["candidate"]``) and a hashing
    embedder; ``holder["lm"]`` is the model of the last run."""
    import snapaudit_jax.models as models
    from tests.helpers.fake_esa import HashEmbedder, ScriptedLM

    holder = {"candidate": _esa_answers}

    def load_lm(name, allow_pickle=False):
        holder["lm"] = ScriptedLM((Y1, Y2), lambda n, i: holder["candidate"](n, i))
        return holder["lm"]

    monkeypatch.setattr(models, "load_language_model", load_lm)
    monkeypatch.setattr(models, "load_embedder", lambda name, allow_pickle=False: HashEmbedder())
    return holder


def _esa_config(tmp_path, body: str = "", audit: str = "") -> str:
    path = tmp_path / "esa.toml"
    path.write_text(
        '[model]\nllm = "scripted"\n\n[audit]\nepsilons = [4]\nsnapshots = 20\ntrials = 4000\nverify = 0\n'
        f'{audit}\n[pipelines.esa]\nnum_exemplars = 3\npartitions = 1\nsignals = ["{Y1}", "{Y2}"]\n{body}'
    )
    return str(path)


def test_esa_sampled_candidate_stage_counts_in_both_budgets(tmp_path, scripted):
    """Active: Phase A (2 x 20 x T = 40) + T_cand = 3 calls; passive: fresh pools per run within that budget,
    floor(43 / (2 + 2 x 3)) = 5 runs per context = 40 calls; the model saw exactly the two budgets' calls."""
    cfg = load_config(_esa_config(tmp_path, "candidate_calls = 3\n"))
    assert cfg.pipelines[0].candidates == "sampled"
    out = str(tmp_path / "run")
    result = run_audit(cfg, out, progress=False)
    rows = result["rows"]
    assert {r["llm_calls"] for r in rows if r["mode"] == "active"} == {43}
    assert {r["llm_calls"] for r in rows if r["mode"] == "passive"} == {40}
    info = result["summary"]["pipelines"]["esa"]
    assert info["passive_runs"] == 5 and info["active_llm_calls"] == 43 and info["passive_llm_calls"] == 40
    assert result["summary"]["llm_calls"]["calls"] == 43 + 40  # every logical model call is in a budget
    pool = info["candidate_pool"]
    assert pool["texts"] == [Y1, Y2, OFF] and pool["draws"] == [Y1, OFF, Y2] and pool["calls"] == 3
    assert (pool["y1"], pool["y2"], pool["other"], pool["target"]) == (1, 1, 1, 0)
    lm = scripted["lm"]
    assert len(lm.candidate_prompts) == 3 + 5 * 3  # the active pool, then one pool per passive run (both contexts)
    assert info["passive_candidate_pools"]["runs"] == 5 and info["passive_candidate_pools"]["calls_per_run"] == 3
    table = open(os.path.join(out, "table.md")).read()
    assert "ESA candidate pool: sampled once before Phase A by 3 constrained 0-shot calls" in table and OFF in table
    assert "| 4 |" in table and "| 43/40 |" in table
    full = json.load(open(os.path.join(out, "results_full.json")))["results"]
    assert all("drawn once, before Phase A" in r["assumptions"] for r in full if r["mode"] == "active")


def _resume_files(run, new):
    """A new run folder holding only ``run``'s resume files (answer cache, snapshots): no stamp, so any
    configuration may adopt it, and its Phase A reuses only the snapshots of its own fingerprint."""
    import shutil

    new.mkdir()
    shutil.copy(run / "llm_cache.jsonl", new / "llm_cache.jsonl")
    shutil.copytree(run / "snapshots", new / "snapshots")
    return str(new)


@pytest.mark.slow
def test_esa_fixed_pool_keeps_the_previous_budget_and_a_changed_setting_recomputes(tmp_path, scripted):
    """"fixed": the pool (y1, y2), active = passive = 2 x 20 calls as before (the candidate-stage diagnostic is
    not counted); switching the setting is refused in the stamped run folder, and with that folder's resume
    files in a new one recomputes Phase A (its snapshot fingerprint differs); the same setting resumes."""
    out = str(tmp_path / "run")
    sampled = run_audit(load_config(_esa_config(tmp_path, "candidate_calls = 3\n")), out, progress=False)
    assert sampled["summary"]["pipelines"]["esa"]["manifest"]["candidate_pool"]["source"] == "sampled"
    fixed_cfg = load_config(_esa_config(tmp_path, 'candidates = "fixed"\ncandidate_calls = 3\n'))
    with pytest.raises(ConfigFileError, match='pipelines.esa.candidates is "sampled" there, "fixed" here'):
        run_audit(fixed_cfg, out, progress=False)
    out = _resume_files(tmp_path / "run", tmp_path / "fixed")
    fixed = run_audit(fixed_cfg, out, progress=False)
    info = fixed["summary"]["pipelines"]["esa"]
    assert "resumed" not in info["manifest"] and info["manifest"]["candidate_pool"]["source"] == "fixed"
    assert {r["llm_calls"] for r in fixed["rows"]} == {40} and info["passive_runs"] == 20
    assert info["candidate_pool"]["texts"] == [Y1, Y2] and info["candidate_coverage"]["calls"] == 3
    assert "passive_candidate_pools" not in info
    again = run_audit(fixed_cfg, out, progress=False)
    assert again["summary"]["pipelines"]["esa"]["manifest"]["resumed"] is True
    out = _resume_files(tmp_path / "fixed", tmp_path / "back")
    back = run_audit(load_config(_esa_config(tmp_path, "candidate_calls = 3\n")), out, progress=False)
    assert "resumed" not in back["summary"]["pipelines"]["esa"]["manifest"]


def test_esa_pool_without_y1_runs_and_says_so(tmp_path, scripted):
    scripted["candidate"] = lambda n, i: [Y2, OFF][i % 2]
    out = str(tmp_path / "run")
    result = run_audit(load_config(_esa_config(tmp_path, "candidate_calls = 4\n")), out, progress=False)
    info = result["summary"]["pipelines"]["esa"]
    assert info["candidate_pool"]["texts"] == [Y2, OFF] and info["target"] is None
    assert info["candidate_pool"]["y1"] == 0 and info["passive_candidate_pools"]["with_y1"] == 0
    table = open(os.path.join(out, "table.md")).read()
    assert "WARNING (ESA black-box): the candidate pool lacks y1" in table
    full = json.load(open(os.path.join(out, "results_full.json")))["results"]
    black = [r for r in full if r["mode"] == "active" and r["threat"] == "black"]
    white = [r for r in full if r["mode"] == "active" and r["threat"] == "white"]
    assert black and all(any("lacks y1" in w for w in r["warnings"]) for r in black)
    assert white and not any("lacks y1" in w for r in white for w in r["warnings"])
    passive_black = [r for r in result["rows"] if r["mode"] == "passive" and r["threat"] == "black"]
    assert all(r["epsilon_emp"] == 0.0 for r in passive_black)  # no passive run can release y1


def test_exact_method_refuses_a_sampled_pool_of_other_than_two(tmp_path, scripted, capsys):
    path = _esa_config(tmp_path, "candidate_calls = 3\n", audit='method = "exact"\n')
    with pytest.raises(ValueError, match=r'pipelines.esa.candidates: audit.method = "exact" needs exactly 2 ESA '
                                         r'candidates .* has 3: .*pipelines.esa.candidates = "fixed" .*'
                                         r'audit.method = "simulate"'):
        run_audit(load_config(path), str(tmp_path / "run"), progress=False)
    assert scripted["lm"].computed == scripted["lm"].candidate_prompts  # refused before any snapshot
    assert main(["audit", path, "--out", str(tmp_path / "cli"), "--quiet"]) == 2
    assert "pipelines.esa.candidates" in capsys.readouterr().err
    fixed = _esa_config(tmp_path, 'candidates = "fixed"\n', audit='method = "exact"\n')
    result = run_audit(load_config(fixed), str(tmp_path / "exact"), progress=False)
    full = json.load(open(os.path.join(tmp_path / "exact", "results_full.json")))["results"]
    assert {r["method"] for r in full if r["mode"] == "active"} == {"exact"} and len(result["rows"]) == 4


# --------------------------------------------------------------------------- Phase A through a model server


@pytest.fixture(scope="module")
def tiny_lm(tiny_folder):
    from snapaudit_jax.models import load_language_model

    return load_language_model(tiny_folder, data_parallel=False)


def _served_config(tmp_path, tiny_folder, base_url: str, audit: str = "", body: str = "") -> str:
    """The ``_config`` audit (PV and PoE) with its model behind ``base_url``, tokenised with the tiny tokenizer;
    ``audit`` lines replace its ``verify = 2``."""
    text = open(_config(tmp_path, tiny_folder, body)).read()
    server = (f'[model]\nllm = "openai"\n[model.server]\nbase_url = "{base_url}"\nmodel = "tiny"\n'
              f'tokenizer = "{tiny_folder}"\nmax_concurrency = 1\n')
    text = text.replace(f'[model]\nllm = "{tiny_folder}"\n', server).replace("verify = 2\n", audit or "verify = 2\n")
    path = tmp_path / "served.toml"
    path.write_text(text)
    return str(path)


@pytest.mark.slow
def test_pv_and_poe_audits_through_a_vllm_format_server_match_the_flax_backend(tmp_path, tiny_folder, tiny_lm):
    """The same audit, in process and through a loopback server in vLLM's format: the same snapshots (PoE's
    label probabilities to 1e-3, the server's float32 full-vocabulary log-softmax against our packed kernels),
    the same counted calls, the server in the manifest, and the determinism check on the server's answers."""
    import numpy as np

    from tests.helpers.fake_openai import FakeOpenAI

    clip = "clip = 200\n"  # PoE's label log-probs of the random model lie far below the default clip of 5
    local = run_audit(load_config(_config(tmp_path, tiny_folder, clip)), str(tmp_path / "local"), progress=False)
    with FakeOpenAI(tiny_lm) as srv:
        out = tmp_path / "served"
        served = run_audit(load_config(_served_config(tmp_path, tiny_folder, srv.base_url, body=clip)), str(out),
                           progress=False)
        assert srv.completions_made() > 0
    for name in ("pv", "poe"):
        a = np.load(tmp_path / "local" / "snapshots" / f"{name}.npz")
        b = np.load(out / "snapshots" / f"{name}.npz")
        assert sorted(a.files) == sorted(b.files)
        for key in a.files:
            if name == "pv":
                np.testing.assert_array_equal(a[key], b[key], err_msg=key)
            else:
                np.testing.assert_allclose(a[key], b[key], atol=1e-3, err_msg=key)
                assert key == "target" or (np.ptp(a[key]) > 1.0 and a[key].min() > -200 * 4), key  # not clipped
    by_key = {(r["pipeline"], r["mode"], r["threat"], r["epsilon_theory"]): r for r in local["rows"]}
    for r in served["rows"]:
        twin = by_key[(r["pipeline"], r["mode"], r["threat"], r["epsilon_theory"])]
        assert r["llm_calls"] == twin["llm_calls"]
        if r["pipeline"] == "pv":  # identical snapshots, seeds and trials: identical bounds
            assert r["epsilon_emp"] == twin["epsilon_emp"], r
    for name in ("pv", "poe"):
        manifest = served["summary"]["pipelines"][name]["manifest"]
        assert manifest["server"] == {"backend": "openai", "base_url": srv.base_url, "model": "tiny"}
        assert manifest["determinism_check"]["mismatches"] == 0
        assert served["summary"]["pipelines"][name]["clean"] == "fixed"
    table = (out / "table.md").read_text()
    assert table.count("determinism check: 2 prompts recomputed one at a time against their batched answers; "
                       "0 ") == 2 and "(mismatch rate 0.0%)" in table and "clean = `fixed`" in table
    assert served["summary"]["llm_calls"]["calls"] == local["summary"]["llm_calls"]["calls"]


@pytest.mark.slow
def test_a_non_deterministic_server_is_measured_and_audited_as_sampled_or_stopped(tmp_path, tiny_folder, tiny_lm):
    """Noise on the server's logits: the determinism check measures the mismatches on the server's own answers
    (PV's Yes/No votes of the direct query), the report prints the rate, and clean = fixed falls back to
    sampled or stops, as configured."""
    from snapaudit_jax.utils.errors import InputError

    from tests.helpers.fake_openai import FakeOpenAI

    with FakeOpenAI(tiny_lm, noise=3.0, noise_seed=1) as srv:
        out = tmp_path / "noisy"
        path = _served_config(tmp_path, tiny_folder, srv.base_url, 'verify = 8\nquery = "direct"\n')
        result = run_audit(load_config(path), str(out), progress=False)
        checks = {n: p["manifest"]["determinism_check"] for n, p in result["summary"]["pipelines"].items()}
        assert checks["pv"]["checked"] == 8 and checks["pv"]["mismatches"] >= 1, checks
        bad = checks["pv"]["mismatches"]
        assert result["summary"]["pipelines"]["pv"]["clean"] == "sampled"
        table = (out / "table.md").read_text()
        assert f"{bad} answers changed (mismatch rate {bad / 8:.1%})" in table
        assert "Active audits used clean = `sampled`." in table
        full = json.loads((out / "results_full.json").read_text())["results"]
        pv_active = [r for r in full if r["pipeline"] == "pv" and r["mode"] == "active"]
        assert pv_active and all(any("audited as clean = sampled" in w for w in r["warnings"]) for r in pv_active)
        stop = tmp_path / "stop"
        path = _served_config(tmp_path, tiny_folder, srv.base_url, 'verify = 8\nquery = "direct"\n'
                              'on_mismatch = "fail"\n')
        with pytest.raises(InputError, match=r"audit.clean: determinism check: \d+ of 8 answers changed"):
            run_audit(load_config(path), str(stop), progress=False)
        assert not (stop / "results.json").exists() and not (stop / "table.md").exists()
