"""Private data stays in the run folder: ``snapaudit audit``, ``cpa``, ``pii`` and ``finetune`` write no copy of the
records they read anywhere else, and ``--quiet`` prints nothing from the libraries.

Each command runs in a subprocess whose home and every cache a library could use (``HOME``, ``HF_HOME``,
``HF_DATASETS_CACHE``, ``XDG_CACHE_HOME``, ``XDG_CONFIG_HOME``, ``XDG_DATA_HOME``, ``XDG_STATE_HOME``,
``TMPDIR``) and its working directory are fresh folders under ``watched/``: after the run they must hold no file.
The records carry a marker string, and no file under the test's folder may hold it except the input files and
the run folder. The six subprocesses (about 35 s of CPU time together) run concurrently: the commands, a
failing audit, and the power check.

Matplotlib's font list is the one file a library writes outside the run folder (the reports draw plots; it is
written once per ``MPLCONFIGDIR``): it lists the system's fonts and holds no user data. The test points
``MPLCONFIGDIR`` at its own folder, outside ``watched/``, and checks that the folder holds the font list only
and no byte of the records.

``snapaudit pii`` reads no user file (its private corpus is generated), and a complete tiny run trains two models
(about a minute on 2 cores), so its subprocess stops at the end of the data stage (corpus, tokenizer, tagger)
with a bad ``model.max_length``: the check covers what the run does with its private records before training.
``snapaudit finetune`` runs to the end (a tiny LoRA fine-tune of 2 steps, about 10 s of CPU time): its records
go through tokenisation, training, checkpoints, evaluations, both exports and the report card.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.bad_input.common import _LLAMA, _hf_folder
from tests.helpers.paths import FIXTURES, ROOT
from tests.helpers.pii import tiny_pii_toml
from tests.helpers.tiny_llm import CHATML

from snapaudit_jax.dpicl.data import load_examples

pytestmark = pytest.mark.skipif(
    not all(importlib.util.find_spec(m) for m in ("flax", "datasets", "sklearn", "faker")),
    reason="needs the models, data, cpa and dpsgd extras (datasets: the power check runs its reading path)")

TAB, TEXTWASH = FIXTURES / "conformal" / "tab", FIXTURES / "conformal" / "textwash"
MARKER = "Qz7PrivateMarker4b1e"  # in every record; nowhere in the code, the models or the libraries
WATCHED = ("home", "hf-home", "hf-datasets", "xdg-cache", "xdg-config", "xdg-data", "xdg-state", "tmp", "cwd")
_DROPPED = ("HOME", "TMPDIR", "TMP", "TEMP", "PYTHONPYCACHEPREFIX", "JAX_COMPILATION_CACHE_DIR", "TORCH_HOME")


def _env(root: Path) -> dict[str, str]:
    """The environment of a subprocess whose home and caches are the fresh folders ``root / "watched" / *``."""
    env = {k: v for k, v in os.environ.items()
           if k not in _DROPPED and not k.startswith(("HF_", "HUGGINGFACE_", "XDG_", "TRANSFORMERS_", "MPL", "TQDM_"))}
    for name in WATCHED:
        (root / "watched" / name).mkdir(parents=True)
    (root / "mpl").mkdir()
    w = {name: str(root / "watched" / name) for name in WATCHED}
    env.update(HOME=w["home"], HF_HOME=w["hf-home"], HF_DATASETS_CACHE=w["hf-datasets"],
               XDG_CACHE_HOME=w["xdg-cache"], XDG_CONFIG_HOME=w["xdg-config"], XDG_DATA_HOME=w["xdg-data"],
               XDG_STATE_HOME=w["xdg-state"], TMPDIR=w["tmp"], MPLCONFIGDIR=str(root / "mpl"), PYTHONPATH=str(ROOT))
    return env


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file())


def _holding(folder: Path, needle: str) -> list[Path]:
    return [p for p in _files(folder) if needle.encode() in p.read_bytes()]


def _write_inputs(data: Path) -> dict[str, Path]:
    """The records with the marker: AG News rows as JSONL, Parquet and CSV; a TAB folder; a TextWash CSV."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    data.mkdir()
    rows = [{"text": f"{e.text} {MARKER}{i}", "label": e.label} for i, e in enumerate(load_examples("agnews")[:16])]
    paths = {"jsonl": data / "ag.jsonl", "parquet": data / "ag.parquet", "csv": data / "ag.csv", "tab": data / "tab",
             "textwash": data / "textwash.csv"}
    paths["jsonl"].write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    pq.write_table(pa.table({"text": [r["text"] for r in rows], "label": [r["label"] for r in rows]}),
                   paths["parquet"])
    with open(paths["csv"], "w", newline="", encoding="utf-8") as fh:
        csv.writer(fh).writerows([["text", "label"]] + [[r["text"], r["label"]] for r in rows])
    paths["tab"].mkdir()
    for src in sorted(TAB.glob("*.json")):
        docs = json.loads(src.read_text(encoding="utf-8"))
        for doc in docs:
            doc["text"] += f" {MARKER}"  # after every annotated span: the offsets still hold
        (paths["tab"] / src.name).write_text(json.dumps(docs), encoding="utf-8")
    with open(TEXTWASH / "textwash.csv", newline="", encoding="utf-8") as fh:
        table = list(csv.DictReader(fh))
    with open(paths["textwash"], "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(table[0]))
        writer.writeheader()
        writer.writerows({**r, "Original": f"{r['Original']} {MARKER}"} for r in table)
    return paths


def _tiny_llama(folder: Path) -> str:
    """A one-layer Llama with numpy weights, a byte-level BPE and a ChatML template (built in a second)."""
    path = Path(_hf_folder(folder, {**_LLAMA, "max_position_embeddings": 4096}))
    config = json.loads((path / "tokenizer_config.json").read_text())
    (path / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": CHATML}))
    return str(path)


_AUDIT = """[model]
llm = "{llm}"

[audit]
epsilons = [2]
snapshots = 2
trials = 2000
passive_runs = 2
verify = 0
method = "exact"
threats = ["black"]
{pipelines}"""

_CPA = """[run]
seed = 1
n_cal = 1
n_test = 1
alphas = [0.2]

[data.tab]
path = "{tab}"
levels = ["K2"]

[data.textwash]
path = "{textwash}"
categories = ["famous"]

[attackers.retrieval]
kind = "retrieval"
"""

# A complete tiny fine-tune: LoRA, 2 DP-SGD steps at a given sigma, no baseline, no canaries, both exports.
_FINETUNE = """[run]
seed = 1
baseline = false
eval_batch_size = 8

[data]
path = "{data}"
max_length = 32
held_out_fraction = 0.2

[model]
base = "{llm}"

[finetune]
method = "lora"
rank = 2
steps = 2
batch_size = 4

[privacy]
target_epsilon = 0.0
noise_multiplier = 1.0

[canaries]
n_canaries = 0
"""

# The old reading path of a local data_path (datasets' default cache), run under the same watch.
_OLD_READER = "import datasets, sys; datasets.load_dataset('json', data_files={'train': sys.argv[1]}, split='train')"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """``(folder, input paths, {name: (root, completed process)})``: the commands and the power check's old
    reading path, run concurrently, each under its own watch in ``root``."""
    tmp = tmp_path_factory.mktemp("private")
    data = _write_inputs(tmp / "data")
    llm = _tiny_llama(tmp / "llama")
    configs = {
        "audit": _AUDIT.format(llm=llm, pipelines=f'\n[pipelines.pv]\nnum_exemplars = 2\npartitions = 2\n'
                                                  f'data_path = "{data["jsonl"]}"\n'),
        # Both data files are read, then the model is missing: the run fails after the data loaded.
        "audit_failed": _AUDIT.format(llm=tmp / "no-such-model", pipelines=(
            f'\n[pipelines.pv]\ndata_path = "{data["parquet"]}"\n\n[pipelines.poe]\ndata_path = "{data["csv"]}"\n')),
        "cpa": _CPA.format(tab=data["tab"], textwash=data["textwash"]),
        # Stops at the end of the data stage: every record is longer than 8 tokens.
        "pii": tiny_pii_toml('variants = ["undefended"]').replace("max_length = 192", "max_length = 8"),
        "finetune": _FINETUNE.format(data=data["jsonl"], llm=llm),
    }
    argv = {name: [sys.executable, "-m", "snapaudit_jax", name.split("_")[0], str(tmp / f"{name}.toml"),
                   "--out", str(tmp / name / "out"), "--quiet"] for name in configs}
    argv["old_reader"] = [sys.executable, "-c", _OLD_READER, str(data["jsonl"])]
    procs = {}
    for name, cmd in argv.items():
        if name in configs:
            (tmp / f"{name}.toml").write_text(configs[name])
        env = _env(tmp / name)
        procs[name] = subprocess.Popen(cmd, cwd=tmp / name / "watched" / "cwd", env=env, text=True,
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    done = {}
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=600)
        done[name] = (tmp / name, subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    return tmp, data, done


def _assert_nothing_left_outside(root: Path, data: dict[str, Path]):
    """No file in the watched folders; the font list only, without the marker, in MPLCONFIGDIR; the marker in no
    file of ``root`` but the run folder's."""
    assert _files(root / "watched") == []
    fonts = _files(root / "mpl")
    assert all(p.name.startswith("fontlist-") and p.suffix == ".json" for p in fonts), fonts
    assert _holding(root / "mpl", MARKER) == []
    assert all(p.is_relative_to(root / "out") for p in _holding(root, MARKER)), _holding(root, MARKER)
    assert all(p.exists() for p in data.values())


@pytest.mark.slow
def test_audit_reads_its_data_in_memory_and_prints_nothing_under_quiet(runs):
    _, data, done = runs
    root, proc = done["audit"]
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""  # datasets printed "Generating train split" here, even under --quiet
    assert proc.stdout.startswith("# DP-ICL audit") and "| eps_theory |" in proc.stdout
    assert json.loads((root / "out" / "results.json").read_text())
    assert json.dumps(str(data["jsonl"])) in (root / "out" / "results_full.json").read_text()  # the file it read
    _assert_nothing_left_outside(root, data)


@pytest.mark.slow
def test_a_run_that_fails_after_loading_its_data_leaves_no_copy(runs):
    _, data, done = runs
    root, proc = done["audit_failed"]
    assert proc.returncode == 2 and proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("snapaudit audit: error: model.llm:"), proc.stderr
    assert MARKER not in proc.stderr
    _assert_nothing_left_outside(root, data)


@pytest.mark.slow
def test_cpa_reads_its_data_files_without_a_copy_and_prints_nothing_under_quiet(runs):
    _, data, done = runs
    root, proc = done["cpa"]
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert "tab/K2/direct" in proc.stdout and "textwash/famous" in proc.stdout
    _assert_nothing_left_outside(root, data)


@pytest.mark.slow
def test_pii_data_stage_writes_nothing_outside_and_prints_only_the_error(runs):
    _, data, done = runs
    root, proc = done["pii"]
    assert proc.returncode == 2 and proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("snapaudit pii: error: model.max_length: must be >="), lines
    _assert_nothing_left_outside(root, data)


@pytest.mark.slow
def test_finetune_trains_and_exports_without_a_copy_and_prints_only_its_report_under_quiet(runs):
    """A complete fine-tune (tokenised records, DP-SGD checkpoints, evaluations, the Hugging Face and PEFT
    exports, the report card) keeps every byte of its records in the run folder, and ``--quiet`` leaves stderr
    empty (no JAX, transformers or progress-bar output)."""
    _, data, done = runs
    root, proc = done["finetune"]
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert proc.stdout.startswith("# DP fine-tuning report") and MARKER not in proc.stdout
    out = root / "out"
    for name in ("report.json", "report.md", "export/private/model.safetensors",
                 "export/private_adapter/adapter_model.safetensors", "checkpoints/private"):
        assert (out / name).exists(), name
    _assert_nothing_left_outside(root, data)


@pytest.mark.slow
def test_the_watch_sees_the_copy_that_datasets_load_dataset_makes(runs):
    """Power check: the old reading path, plain ``datasets.load_dataset`` under the same environment, writes
    an Arrow copy of the records and lock files into the watched cache and prints its progress bar."""
    _, _, done = runs
    root, proc = done["old_reader"]
    assert proc.returncode == 0, proc.stderr
    written = _files(root / "watched")
    assert any(p.suffix == ".arrow" for p in written) and any(p.suffix == ".lock" for p in written), written
    assert any(p.is_relative_to(root / "watched" / "hf-datasets") for p in _holding(root / "watched", MARKER))
    assert "Generating train split" in proc.stderr


def test_the_failed_audit_reads_both_data_files_before_it_looks_for_the_model(tmp_path, monkeypatch, capsys):
    """What makes the failed run above a check of the data path: the run reads every data file, then fails."""
    from snapaudit_jax.cli import main
    from snapaudit_jax.dpicl.data import datasets as module

    data = _write_inputs(tmp_path / "data")
    read = []
    real = module.read_records
    monkeypatch.setattr(module, "read_records", lambda path: read.append(Path(path)) or real(path))
    config = tmp_path / "audit.toml"
    config.write_text(_AUDIT.format(llm=tmp_path / "no-such-model", pipelines=(
        f'\n[pipelines.pv]\ndata_path = "{data["parquet"]}"\n\n[pipelines.poe]\ndata_path = "{data["csv"]}"\n')))
    assert main(["audit", str(config), "--out", str(tmp_path / "out"), "--quiet"]) == 2
    assert "model.llm" in capsys.readouterr().err
    assert read == [data["parquet"], data["csv"]]


def test_quiet_libraries_silences_prints_warnings_logging_and_progress_bars(capsys):
    import logging
    import warnings

    from tqdm import tqdm

    from snapaudit_jax.utils.quiet import quiet_libraries

    def noisy():
        print("a library prints")
        print("a library writes to stderr", file=sys.stderr)
        warnings.warn("a library warns", UserWarning, stacklevel=1)
        logging.getLogger("some.library").warning("a library logs")
        for _ in tqdm(range(3), desc="a progress bar"):
            pass

    logger = logging.getLogger("some.library")
    bound = logging.StreamHandler(sys.stderr)  # a handler bound to the real stderr before the block
    logger.addHandler(bound)
    try:
        with quiet_libraries(True):
            noisy()
        quiet = capsys.readouterr()
        with pytest.raises(RuntimeError, match="raised through"), quiet_libraries(True):
            raise RuntimeError("raised through")
        with pytest.warns(UserWarning, match="a library warns"), quiet_libraries(False):  # power: all of it shows
            noisy()
        loud = capsys.readouterr()
    finally:
        logger.removeHandler(bound)
    assert (quiet.out, quiet.err) == ("", "")
    assert "a library prints" in loud.out
    for needle in ("a library writes to stderr", "a library logs", "a progress bar"):
        assert needle in loud.err, needle
    assert logging.root.manager.disable == logging.NOTSET  # restored


def test_the_in_process_watch_of_the_bad_input_cases_sees_what_datasets_writes(tmp_path):
    """Power check of :func:`tests.helpers.bad_input.private_data.watch_datasets_cache`: under it, the old reading
    path leaves its Arrow copy inside the case's folder, where the bad-input suite's tree check sees it."""
    import contextlib

    import datasets

    from tests.helpers.bad_input.private_data import watch_datasets_cache

    path = tmp_path / "ag.jsonl"
    path.write_text(json.dumps({"text": MARKER, "label": 1}) + "\n")
    with contextlib.ExitStack() as stack:
        cache = watch_datasets_cache(tmp_path, stack)
        datasets.load_dataset("json", data_files={"train": str(path)}, split="train")
    assert any(p.suffix == ".arrow" for p in _holding(cache, MARKER))
