"""``snapaudit finetune`` end to end on a tiny Llama folder: the plan, the run, the report card, resume, refusals."""

from __future__ import annotations

import hashlib
import json
import math
import re
import os
import signal
import stat
import subprocess
import sys

import jax
import numpy as np
import pytest

from snapaudit_jax.cli import main
from snapaudit_jax.dpsgd.accounting import compute_epsilon
from snapaudit_jax.dpsgd.keys import KEY_FILE, key_digest
from snapaudit_jax.finetune.config import load_finetune_config
from snapaudit_jax.finetune.run import _TRAIN_STREAM, plan_dict, prepare
from snapaudit_jax.utils.config import ConfigFileError
from tests.helpers.paths import ROOT
from tests.helpers.report import check_report
from tests.helpers.tiny_llm import make_tiny_llm_folder

WORDS = "alpha beta gamma delta kappa omega sigma tau rho zeta".split()


def _notes(n_users=30, seed=0):
    rng = np.random.default_rng(seed)
    rows = []
    for u in range(n_users):
        for _ in range(int(rng.integers(1, 4))):
            words = " ".join(rng.choice(WORDS, size=int(rng.integers(4, 9))))
            rows.append({"user": f"u{u}", "text": f"note of u{u}: {words}."})
    return rows


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("finetune")
    rows = _notes()
    model = make_tiny_llm_folder(str(root / "model"), [r["text"] for r in rows] + ["my secret code is 0123 4567"],
                                 vocab_size=300)
    data = root / "notes.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root, model, str(data), rows


def _toml(root, model, data_path, extra="", **sections):
    body = {
        "run": "seed = 1\neval_batch_size = 8\n",
        "data": f'path = "{data_path}"\nuser_field = "user"\nmax_length = 24\nheld_out_fraction = 0.2\n',
        "model": f'base = "{model}"\n',
        "finetune": "method = \"lora\"\nrank = 2\nsteps = 3\nbatch_size = 4\nlearning_rate = 0.01\n"
                    "checkpoint_every = 2\n",
        "privacy": "target_epsilon = 4.0\nclip_norm = 1.0\n",
        "canaries": "n_canaries = 4\ndigits = 4\nexact_limit = 10000\nsamples = 64\ntop_k = 5\n",
    }
    body.update(sections)
    text = "".join(f"[{name}]\n{value}\n" for name, value in body.items()) + extra
    path = root / f"cfg{abs(hash(text)) % 10**8}.toml"
    path.write_text(text)
    return str(path)


def _coin(seed, choice, ident):
    """The split's keyed hash, written out independently of snapaudit_jax.finetune.data."""
    digest = hashlib.sha256(b"snapaudit-jax finetune split\0" + choice.encode() + b"\0" + seed.to_bytes(8, "little")
                            + ident).digest()
    return int.from_bytes(digest[:8], "little") / 2**64


@pytest.mark.slow
def test_adding_one_user_moves_no_other_unit(tiny, tmp_path):
    """A user added to the file lands on one side; every other user keeps their side (training, held-out,
    validation) and their capped records. The old permutation split fails this (its power check: at least one
    other user moved)."""
    root, model, _, _ = tiny
    rows = _notes(n_users=40, seed=3)
    extra = [{"user": "new", "text": f"note of new: {w} {w} kappa."} for w in WORDS[:5]]
    sides = []
    for name, data_rows in (("before", rows), ("after", rows + extra)):
        path = tmp_path / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in data_rows))
        cfg = _toml(root, model, str(path), canaries="n_canaries = 0\n",
                    privacy="unit = \"user\"\ntarget_epsilon = 4.0\nmax_records_per_user = 2\n",
                    sweep="learning_rate = [0.01, 0.02]\nvalidation_fraction = 0.25\n")
        data = prepare(load_finetune_config(cfg)).data
        sides.append({"train": {r for u in data.train_units for r in u}, "held": set(data.held_out),
                      "validation": set(data.validation)})
    before, after = sides
    new = {k: after[k] - before[k] for k in after}
    assert all(before[k] <= after[k] for k in before), "a unit moved or lost a record"
    assert sum(len(v) > 0 for v in new.values()) == 1 and 2 <= sum(len(v) for v in new.values()) <= 5
    assert all(len(before[k]) > 0 for k in before)
    # power: the permutation split these coins replaced moves other users when one is added
    perm = [np.random.default_rng([1, 0xF17E]).permutation(n)[:round(0.2 * n)] for n in (40, 41)]
    assert set(perm[0]) != set(perm[1])


def _checkpoint_arrays(out, name):
    from safetensors.numpy import load_file

    folder = out / "checkpoints" / name
    last = sorted(n for n in os.listdir(folder) if n.startswith("step_"))[-1]
    return {k: v for k, v in load_file(str(folder / last / "state.safetensors")).items() if k.startswith("params")}


def _assert_key_not_released(out):
    """Neither the key's two words (decimal, hex or raw bytes) nor its file are in a released file."""
    words = json.loads((out / "checkpoints" / KEY_FILE).read_text())["key_data"]
    raw = np.asarray(words, "<u4").tobytes()
    needles = [raw, raw.hex().encode()] + [str(w).encode() for w in words]
    released = [out / "report.json", out / "report.md", out / "run.json"]
    released += [p for p in (out / "export").rglob("*") if p.is_file()]
    assert len(released) > 5
    for path in released:
        body = path.read_bytes()
        for needle in needles:
            assert needle not in body, (path, needle)


@pytest.mark.slow
def test_noise_is_secret_by_default_and_replayable_only_by_request(tiny, tmp_path):
    """Two default runs of one configuration draw different batches and noise; a run with [run] noise_seed
    trains with the key derived from that seed (its checkpoints' key digest), keeps no key file, and the report
    says the guarantee then rests on the seed."""
    root, model, data, _ = tiny
    lean = {"canaries": "n_canaries = 0\n", "export": "hf = false\n"}
    default = _toml(root, model, data, run="seed = 1\nbaseline = false\neval_batch_size = 8\n", **lean)
    seeded = _toml(root, model, data, run="seed = 1\nnoise_seed = 5\nbaseline = false\neval_batch_size = 8\n",
                   **lean)
    runs = {}
    for name, cfg in (("a", default), ("b", default), ("c", seeded)):
        assert main(["finetune", cfg, "--out", str(tmp_path / name), "--quiet"]) == 0
        runs[name] = _checkpoint_arrays(tmp_path / name, "private")
    lora = [k for k in runs["a"] if "lora" in k]
    assert any(not np.array_equal(runs["a"][k], runs["b"][k]) for k in lora)
    folder = tmp_path / "c" / "checkpoints" / "private"
    meta = json.loads((folder / sorted(os.listdir(folder))[-1] / "meta.json").read_text())
    assert meta["run"]["key_sha256"] == key_digest(jax.random.fold_in(jax.random.key(5), _TRAIN_STREAM))
    assert not (tmp_path / "c" / "checkpoints" / KEY_FILE).exists()
    card = json.loads((tmp_path / "c" / "report.json").read_text())
    assert "noise_seed = 5" in card["claim"]["warning"] and "only while" in card["claim"]["randomness"]
    assert "**Warning:** the batches and the noise were drawn from [run] noise_seed = 5" in (
        tmp_path / "c" / "report.md").read_text()
    plain = json.loads((tmp_path / "a" / "report.json").read_text())["claim"]
    assert "warning" not in plain and "secret key" in plain["randomness"]


def _worker(cfg, out, *mode):
    """``snapaudit finetune`` in a subprocess (tests/helpers/finetune_kill_worker.py ``mode``), the workers of one
    test sharing a persistent compilation cache beside ``out`` (a resumed run does not compile the step again)."""
    cache = os.path.join(os.path.dirname(os.path.abspath(str(out))), "xla-cache")
    env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=cache,
               JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0.1", JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
    return subprocess.run([sys.executable, str(ROOT / "tests" / "helpers" / "finetune_kill_worker.py"), cfg, str(out),
                           *map(str, mode)], cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)


def _kill_after(cfg, out, model, step):
    """``snapaudit finetune`` in a subprocess, SIGKILLed right after ``checkpoints/<model>``'s checkpoint ``step``."""
    proc = _worker(cfg, out, "checkpoint", model, step)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]


@pytest.mark.slow
def test_a_sweep_and_its_twin_killed_mid_way_resume_to_the_uninterrupted_card(tiny, tmp_path):
    """kill -9 in the middle of the sweep's second run (its first run trained and scored), then in the middle of
    the twin's training; each rerun resumes from the folder. The final card, sweep record, evaluations and the
    exported weights equal, byte for byte, an uninterrupted run's (one noise seed for both, so both draw the same
    batches and noise; the secret key's own resume is tested in test_noise_is_secret...)."""
    root, model, data, _ = tiny
    cfg = _toml(root, model, data, run="seed = 1\nnoise_seed = 3\neval_batch_size = 8\n",
                finetune="method = \"lora\"\nrank = 2\nsteps = 3\nbatch_size = 4\ncheckpoint_every = 1\n",
                sweep="learning_rate = [0.01, 0.03]\nvalidation_fraction = 0.25\n")
    reference, killed = tmp_path / "reference", tmp_path / "killed"
    assert main(["finetune", cfg, "--out", str(reference), "--quiet"]) == 0
    _kill_after(cfg, killed, "sweep_1", 1)
    assert os.path.isfile(killed / "evaluations" / "sweep_0.json") and not (killed / "sweep.json").exists()
    _kill_after(cfg, killed, "baseline", 2)
    assert (killed / "sweep.json").exists() and not (killed / "report.json").exists()
    assert main(["finetune", cfg, "--out", str(killed), "--quiet"]) == 0
    cards = [json.loads((out / "report.json").read_text().replace(str(out), "OUT")) for out in (reference, killed)]
    for card in cards:
        card.pop("seconds")
    assert cards[0] == cards[1]
    for name in ["sweep.json", "evaluations/sweep_0.json", "evaluations/sweep_1.json", "evaluations/private.json",
                 "evaluations/baseline.json"]:
        assert (reference / name).read_bytes() == (killed / name).read_bytes(), name
    weights = sorted(p.relative_to(reference) for p in (reference / "export").rglob("*.safetensors"))
    assert weights
    for name in weights:
        assert (reference / name).read_bytes() == (killed / name).read_bytes(), name
    assert not [p for p in killed.rglob("*") if ".tmp" in p.name]


def _leftovers(out):
    return [p for p in out.rglob("*") if p.name.startswith((".tmp-", ".probe-")) or ".tmp-" in p.name
            or ".old-" in p.name]


def _lean(root, model, data):
    return _toml(root, model, data, run="seed = 1\nnoise_seed = 3\nbaseline = false\neval_batch_size = 8\n",
                 finetune="method = \"lora\"\nrank = 2\nsteps = 3\nbatch_size = 4\ncheckpoint_every = 1\n",
                 canaries="n_canaries = 0\n")


@pytest.mark.slow
def test_a_kill_during_export_leaves_no_private_copy_once_the_run_resumes(tiny, tmp_path):
    """kill -9 once the merged private weights are written into export/'s temporary folder: that folder (a copy
    of the private weights) and a half-written JSON file are left; the rerun removes both before it works and
    finishes the export."""
    root, model, data, _ = tiny
    cfg, out = _lean(root, model, data), tmp_path / "run"
    proc = _worker(cfg, out, "export", "model.safetensors")
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    partial = [p for p in (out / "export").iterdir() if p.name.startswith(".private.tmp-")]
    assert partial and (partial[0] / "model.safetensors").is_file() and not (out / "export" / "private").exists()
    (out / "evaluations" / ".tmp-half.json").write_text('{"token_lo')  # as a kill inside atomic_write leaves
    assert main(["finetune", cfg, "--out", str(out), "--quiet"]) == 0
    assert _leftovers(out) == []
    assert (out / "export" / "private" / "model.safetensors").is_file()
    assert (out / "export" / "private_adapter" / "adapter_model.safetensors").is_file()


@pytest.mark.slow
@pytest.mark.parametrize("limit, where", [(50_000, "model.safetensors")])
def test_a_full_disk_is_a_clean_error_and_the_rerun_resumes(tiny, tmp_path, limit, where):
    """Writes fail past a real file size limit (EFBIG, as ENOSPC on a full disk) at the export (50 kB: the 115 kB
    merged weights): exit 2 with the errno's text and the file's path, no traceback, no partial file left
    visible or hidden; the rerun without the limit finishes. (Every other errno class, at a checkpoint, is
    tests/test_write_failures.py's.)"""
    root, model, data, _ = tiny
    cfg, out = _lean(root, model, data), tmp_path / "run"
    proc = _worker(cfg, out, "fsize", limit)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("snapaudit finetune: error: [Errno 27] File too large: ") and where in last, last
    assert str(out) in last
    assert _leftovers(out) == []
    assert not (out / "report.json").exists()
    assert main(["finetune", cfg, "--out", str(out), "--quiet"]) == 0
    assert (out / "export" / "private" / "model.safetensors").is_file() and _leftovers(out) == []


@pytest.mark.slow
def test_plan_matches_dp_accounting_and_trains_nothing(tiny, tmp_path, capsys):
    root, model, data, rows = tiny
    config = load_finetune_config(_toml(root, model, data))
    prep = prepare(config)
    info = plan_dict(prep, timing=False)
    n = info["units"]
    # each record is held out when its keyed hash (hashlib, here) is below 0.2; 4 canaries, each inserted with
    # probability 1/2, are units of their own
    trained = sum(_coin(1, "held_out", b"record\0" + r["text"].encode()) >= 0.2 for r in rows)
    assert 0 < trained < len(rows)
    assert n == info["data"]["train_records"] == trained + info["data"]["canaries_inserted"]
    assert info["sampling_rate"] == pytest.approx(4 / n) and info["delta"] == pytest.approx(1 / (10 * n))
    cal = info["calibration"]
    assert cal["accountant"] == "pld" and 0.0 <= cal["margin"] <= 0.01
    # the printed epsilons are dp_accounting's at the calibrated sigma
    for name in ("pld", "rdp"):
        assert info[f"epsilon_{name}"] == pytest.approx(compute_epsilon(
            noise_multiplier=info["noise_multiplier"], sampling_rate=4 / n, steps=3, delta=1 / (10 * n),
            accountant=name))
    assert info["epsilon_pld"] <= 4.0
    out = tmp_path / "never"
    capsys.readouterr()
    assert main(["finetune", _toml(root, model, data), "--plan", "--out", str(out)]) == 0
    assert not out.exists()
    # the noise sampler's term: (1 + e^eps) 2^-71 for each trainable coordinate of each of the 3 steps, at the target
    printed = capsys.readouterr().out
    trainable = int(re.search(r"lora fine-tuning: ([0-9,]+) of", printed).group(1).replace(",", ""))
    added = float(re.search(r"its sampler adds ([0-9.e+-]+) to delta", printed).group(1))
    eps = config.privacy.target_epsilon  # the calibrated epsilon is at most the target: the term's upper bound
    assert added == pytest.approx((1 + math.exp(eps)) * 3 * trainable / 2.0**71, rel=0.05)  # printed to 2 digits
    assert f"to delta over {trainable:,} trainable parameters" in printed  # the measured step's count, the same


def test_a_run_whose_noise_sampler_would_add_over_a_tenth_of_delta_is_refused_before_writing(tiny, tmp_path,
                                                                                              monkeypatch, capsys):
    """With the sampler's tail probability set so that its term passes a tenth of delta, the run is refused in
    ``prepare``, naming privacy.delta and the trainable parameters, and writes nothing; the plan of the same run
    with the real probability states the term."""
    from snapaudit_jax.dpsgd import noise

    root, model, data, _ = tiny
    cfg, out = _toml(root, model, data), tmp_path / "never"
    prep = prepare(load_finetune_config(cfg))
    assert 0 < prep.sampler_delta < 1e-12 * prep.delta
    monkeypatch.setattr(noise, "TAIL_PROBABILITY", 0.1 * prep.delta / prep.sampler_delta * 2.0**-71 * 1.01)
    capsys.readouterr()
    assert main(["finetune", cfg, "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "privacy.delta: the noise sampler's tails would add" in err
    assert f"{prep.trainable_parameters} trainable parameters" in err and not out.exists()


@pytest.mark.parametrize("sections, key", [
    ({"privacy": "target_epsilon = 4.0\ndelta = 0.5\n"}, "privacy.delta"),
    ({"privacy": "target_epsilon = 1e-6\ndelta = 1e-9\n"}, "privacy.target_epsilon"),
    ({"finetune": "method = \"lora\"\nrank = 64\n"}, "finetune.rank"),
    ({"finetune": "method = \"lora\"\ntargets = [\"c_attn\"]\n"}, "finetune.targets"),
    ({"finetune": "batch_size = 1000\n"}, "finetune.batch_size"),
    ({"privacy": "target_epsilon = 4.0\nnoise_multiplier = 1.0\n"}, "privacy.target_epsilon"),
    ({"privacy": "unit = \"user\"\n", "data": "path = \"{data}\"\n"}, "data.user_field"),
    ({"data": "path = \"{data}\"\ngenerate = \"clinical_notes\"\ngenerate_units = 10\n"},
     "path must be empty with generate (the records are made at run time), got"),
    ({"data": "generate = \"court_cases\"\ngenerate_units = 10\n"}, "data.generate"),
    ({"data": "generate = \"clinical_notes\"\n"}, "data.generate_units"),
    ({"data": "generate = \"clinical_notes\"\ngenerate_units = 1000001\n"}, "generate_units must be <= 1000000"),
    ({"data": "path = \"{data}\"\ngenerate_units = 10\n"}, "generate_units must be 0 without generate"),
    ({"finetune": "vocab_chunk = -1\n"}, "vocab_chunk must be an integer >= 0, got -1"),
    ({"finetune": "clipped_sum_dtype = \"float16\"\n"},
     "clipped_sum_dtype must be one of 'float32', 'bfloat16', got 'float16'"),
    ({"finetune": "clipped_sum_dtype = \"bfloat16\"\nclipping = \"per_record\"\n"},
     "clipped_sum_dtype = 'bfloat16' needs the book-keeping path, got clipping = 'per_record'"),
])
def test_bad_settings_are_refused_before_training_naming_the_key(tiny, tmp_path, sections, key, capsys):
    root, model, data, _ = tiny
    sections = {k: v.replace("{data}", data) for k, v in sections.items()}
    out = tmp_path / "out"
    assert main(["finetune", _toml(root, model, data, **sections), "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert key in err and "Traceback" not in err, err
    assert not out.exists()


@pytest.mark.parametrize("rows, key", [
    ([{"body": "x"}], "data.text_field"),
    ([{"text": "a note", "user": "u1"}, {"text": "another"}] * 5, "data.user_field"),
    ([{"text": ""}], "data.text_field"),
])
def test_bad_data_files_are_refused(tiny, tmp_path, rows, key, capsys):
    root, model, _, _ = tiny
    path = tmp_path / "bad.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = _toml(root, model, str(path), privacy="unit = \"user\"\ntarget_epsilon = 4.0\n")
    with pytest.raises(ConfigFileError, match=key.replace(".", r"\.")):
        prepare(load_finetune_config(cfg))


def test_held_out_part_must_not_be_empty(tiny, tmp_path):
    root, model, data, _ = tiny
    empty = tmp_path / "held.jsonl"
    empty.write_text("")
    cfg = _toml(root, model, data, data=f'path = "{data}"\nheld_out_path = "{empty}"\n')
    with pytest.raises(ConfigFileError, match=r"data\.held_out_path"):
        prepare(load_finetune_config(cfg))


# One person, every spelling the canonical form accepts for them (module docstring of finetune.data).
SPELLINGS = {
    "seven": [7, "7", "07", "+7", " 7 ", "\uff17"],  # an integer, its decimal strings, a full-width digit
    "ann": ["Ann Lee", " ann  lee ", "ANN\u00a0LEE", "\uff21\uff4e\uff4e Lee"],  # case, spaces, NBSP, full width
    "jose": ["Jos\u00e9", "Jose\u0301", "JOS\u00c9"],  # composed and decomposed accents
}


def _spelled_rows(seed=0):
    """Records of 3 people under their several spellings and of 12 others, shuffled."""
    rng = np.random.default_rng(seed)
    rows = [{"user": spelling, "text": f"note {j} of {person}: {' '.join(rng.choice(WORDS, 4))}."}
            for person, spellings in SPELLINGS.items() for j, spelling in enumerate(spellings)]
    rows += [{"user": f"other{u}", "text": f"note of other{u}: {' '.join(rng.choice(WORDS, 4))}."} for u in range(12)]
    return [rows[i] for i in rng.permutation(len(rows))]


def _units_of(cfg_path):
    """The prepared data and the token tuple -> unit index map (train units, or -1 for held out)."""
    from snapaudit_jax.finetune.data import prepare_data
    from snapaudit_jax.models import load_tokenizer

    config = load_finetune_config(cfg_path)
    data = prepare_data(config, load_tokenizer(config.model.base))
    where = {r: g for g, unit in enumerate(data.train_units) for r in unit}
    where.update({r: -1 for r in data.held_out})
    return data, where


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_one_person_is_one_unit_under_every_accepted_spelling(tiny, tmp_path, seed):
    """Whatever spellings a person's records use, they land in one unit (or all held out), the report counts
    people, not spellings, and names how many people had several spellings."""
    from snapaudit_jax.finetune.data import canonical_user
    from snapaudit_jax.models import load_tokenizer

    root, model, _, _ = tiny
    rows = _spelled_rows(seed)
    path = tmp_path / "notes.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = _toml(root, model, str(path), privacy="unit = \"user\"\ntarget_epsilon = 4.0\nmax_records_per_user = 8\n",
                data=f'path = "{path}"\nuser_field = "user"\nmax_length = 24\nheld_out_fraction = 0.3\n',
                canaries="n_canaries = 0\n")
    data, where = _units_of(cfg)
    tok = load_tokenizer(model)
    from snapaudit_jax.models.inference import frame

    for person, spellings in SPELLINGS.items():
        assert len({canonical_user(s) for s in spellings}) == 1, person
        units = {where[tuple(frame(tok, r["text"]))] for r in rows if r["user"] in spellings}
        assert len(units) == 1, (person, units)
    assert data.stats["users"] == 3 + 12 and data.stats["users_with_several_spellings"] == 3
    # power: distinct people stay distinct, and the spellings as read (json values) would be 13 + 12 "users"
    assert len({canonical_user(r["user"]) for r in rows}) == 15
    assert len({json.dumps(r["user"]) for r in rows}) == 13 + 12


@pytest.mark.parametrize("user, shown", [(True, "bool"), (3.0, "float"), ("  ", "missing"), ([1], "list")])
def test_user_ids_that_are_not_strings_or_integers_are_refused_naming_the_row(tiny, tmp_path, user, shown):
    root, model, _, _ = tiny
    path = tmp_path / "notes.jsonl"
    rows = [{"user": f"u{i}", "text": f"note {i}."} for i in range(6)] + [{"user": user, "text": "odd note."}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = _toml(root, model, str(path), data=f'path = "{path}"\nuser_field = "user"\nmax_length = 24\n',
                privacy="unit = \"user\"\ntarget_epsilon = 4.0\n")
    with pytest.raises(ConfigFileError, match=rf"data\.user_field: row 6 of .* has no user \({shown}"):
        _units_of(cfg)


def _held_out_case(tiny, tmp_path, held_rows, unit="record", extra=""):
    root, model, data, rows = tiny
    held = tmp_path / "held.jsonl"
    held.write_text("".join(json.dumps(r) + "\n" for r in held_rows))
    privacy = f"unit = \"{unit}\"\ntarget_epsilon = 4.0\nmax_records_per_user = 8\n"
    return _toml(root, model, data, privacy=privacy, canaries="n_canaries = 0\n",
                 data=f'path = "{data}"\nuser_field = "user"\nmax_length = 24\nheld_out_path = "{held}"\n{extra}')


def test_held_out_data_must_be_disjoint_from_the_training_data(tiny, tmp_path):
    """The training file itself (by path, by link or as a copy), a held-out record whose text is trained on, and
    at user level a held-out user with training records are refused, each naming what is shared; with
    data.allow_held_out_overlap the shared records are left out of the held-out part and counted."""
    root, model, data, rows = tiny
    fresh = [{"user": f"new{i}", "text": f"a note of new{i} never trained on."} for i in range(4)]
    link = tmp_path / "link.jsonl"
    link.symlink_to(data)
    copy = tmp_path / "copy.jsonl"
    copy.write_bytes(open(data, "rb").read())
    for same, how in ((data, "the same file"), (link, "the same file"), (copy, "the same bytes")):
        cfg = _toml(root, model, data, canaries="n_canaries = 0\n",
                    data=f'path = "{data}"\nuser_field = "user"\nmax_length = 24\nheld_out_path = "{same}"\n')
        with pytest.raises(ConfigFileError, match=rf"data\.held_out_path: .* is the training file data\.path itself "
                                                  rf"\({how}\)"):
            _units_of(cfg)
    shared_text = fresh + [dict(rows[0]), dict(rows[5])]
    with pytest.raises(ConfigFileError, match=r"not disjoint from the training data: 2 record\(s\) whose text is "
                                              r"also in data\.path of its 6; .*allow_held_out_overlap"):
        _units_of(_held_out_case(tiny, tmp_path, shared_text))
    shared_user = fresh + [{"user": rows[0]["user"].upper(), "text": "an unseen note of a trained user."}]
    with pytest.raises(ConfigFileError, match=r"1 record\(s\) of users who also have records in data\.path"):
        _units_of(_held_out_case(tiny, tmp_path, shared_user, unit="user"))
    # record level: a trained user's unseen note is held out (the unit is the record)
    data_r, _ = _units_of(_held_out_case(tiny, tmp_path, shared_user))
    assert data_r.stats["held_out_records"] == 5 and data_r.stats["held_out_records_left_out_as_overlapping"] == 0
    allowed, _ = _units_of(_held_out_case(tiny, tmp_path, shared_text + shared_user[-1:], unit="user",
                                          extra="allow_held_out_overlap = true\n"))
    assert allowed.stats["held_out_records"] == 4
    assert allowed.stats["held_out_records_left_out_as_overlapping"] == 3


def test_vocab_chunk_reaches_the_private_model_and_its_twin(tiny):
    """``[finetune] vocab_chunk`` (memory only) reaches both trainings' DPSGDConfig; ``0`` means whole logits."""
    root, model, data, _ = tiny
    for line, want in (("", None), ("vocab_chunk = 16\n", 16)):
        prep = prepare(load_finetune_config(_toml(root, model, data, finetune=line, canaries="n_canaries = 0\n")))
        assert prep.dpsgd_config(True).vocab_chunk == want == prep.dpsgd_config(False).vocab_chunk


def test_clipped_sum_dtype_reaches_the_private_model_and_the_card_names_it(tiny):
    """``[finetune] clipped_sum_dtype`` reaches the private training's DPSGDConfig (the twin trains without
    clipping: its step ignores it); the card's clipping row names bfloat16 operands and their margin, and says
    "the same clipped sum" only for float32."""
    from snapaudit_jax.finetune.report import _clipping_row

    root, model, data, _ = tiny
    for line, want in (("", "float32"), ("clipped_sum_dtype = \"bfloat16\"\n", "bfloat16")):
        prep = prepare(load_finetune_config(_toml(root, model, data, finetune=line, canaries="n_canaries = 0\n")))
        assert prep.dpsgd_config(True).clipped_sum_dtype == want
    row = dict(clipping="book_keeping", microbatch_size=4, clipping_reason="auto")
    assert "the same clipped sum either way" in _clipping_row(row)
    low = _clipping_row({**row, "clipped_sum_dtype": "bfloat16"})
    assert "bfloat16 operands, the norms of the rounded factors" in low and "the same clipped sum" not in low


@pytest.mark.slow
def test_user_level_units_group_and_cap_records(tiny):
    root, model, data, rows = tiny
    cfg = _toml(root, model, data, privacy="unit = \"user\"\ntarget_epsilon = 4.0\nmax_records_per_user = 2\n",
                canaries="n_canaries = 0\n")
    prep = prepare(load_finetune_config(cfg))
    tokens, mask = prep.dataset
    users = {r["user"] for r in rows}
    held = sum(_coin(1, "held_out", b"user\0" + u.encode()) < 0.2 for u in users)  # "u7": canonical already
    assert 0 < held < len(users)
    assert tokens.shape[0] == len(users) - held and tokens.shape[1] == 2  # units are users, k = the cap
    counts = {}
    for r in rows:
        counts[r["user"]] = counts.get(r["user"], 0) + 1
    s = prep.data.stats
    assert s["users"] == len(users) and s["records_per_user_max"] == max(counts.values())
    assert s["train_records"] == int(mask.any(axis=2).sum())
    over = sum(max(0, c - 2) for c in counts.values())
    assert 0 < s["records_dropped_by_cap"] <= over and 0 < s["users_capped"] <= s["users"]
    assert s["train_records"] + s["records_dropped_by_cap"] + s["held_out_records"] == len(rows)


@pytest.mark.slow
def test_run_report_card_resume_and_export(tiny, tmp_path, capsys):
    root, model, data, _ = tiny
    cfg = _toml(root, model, data)
    out = tmp_path / "run"
    assert main(["finetune", cfg, "--out", str(out), "--quiet"]) == 0
    card = json.loads((out / "report.json").read_text())
    claim, dp = card["claim"], card["dpsgd"]
    assert claim["dp"] and claim["unit"] == "record" and claim["epsilon_pld"] <= 4.0
    # sigma is the plan's (an independent prepare of the same configuration), and the private model is not its twin
    assert dp["noise_multiplier"] == plan_dict(prepare(load_finetune_config(cfg)), timing=False)["noise_multiplier"]
    private, twin = _checkpoint_arrays(out, "private"), _checkpoint_arrays(out, "baseline")
    lora = [k for k in private if "lora" in k]
    assert lora and all(not np.array_equal(private[k], twin[k]) for k in lora)
    # delta includes the noise sampler's tails: (1 + e^eps) 2^-71 for every adapter coordinate of every step
    coordinates = sum(private[k].size for k in lora)
    assert claim["sampler_delta"] == pytest.approx((1 + math.exp(claim["epsilon"])) * 3 * coordinates / 2.0**71)
    assert claim["delta"] == claim["accountant_delta"] + claim["sampler_delta"] and claim["sampler_delta"] > 0
    # the noise's key is secret: private state in the run folder only, named in the card, in no released file
    assert "secret key" in claim["randomness"] and "warning" not in claim
    assert stat.S_IMODE(os.stat(out / "checkpoints" / KEY_FILE).st_mode) == 0o600
    _assert_key_not_released(out)
    assert dp["sampling"].startswith("poisson") and dp["steps"] == 3 and dp["clip_norm"] == 1.0
    # DP-LoRA's path: book-keeping on every backend (the fast paths cover the adapters)
    assert dp["clipping"] == "book_keeping" and dp["clipping_reason"].startswith("auto: ")
    for item in ("records_truncated", "train_records", "held_out_records", "canaries_inserted"):
        assert item in card["data"]
    statuses = " ".join(r["status"] for r in card["releases"])
    assert "NOT private" in statuses and "NOT covered" in statuses
    assert set(card["models"]) == {"base", "private", "baseline"}
    assert card["models"]["baseline"]["release"] == "NOT private"
    # DP against the twin and the base: the ratios of the printed perplexities, with their goals
    ppl = {name: row["held_out_perplexity"] for name, row in card["models"].items()}
    comparison = card["comparison"]
    assert comparison["private_over_baseline_perplexity"]["ratio"] == pytest.approx(ppl["private"] / ppl["baseline"])
    assert comparison["private_over_base_perplexity"]["ratio"] == pytest.approx(ppl["private"] / ppl["base"])
    md = (out / "report.md").read_text()
    assert md.startswith("# DP fine-tuning report")
    assert f"{claim['sampler_delta']:.2g} for the noise sampler's finite tails |" in md
    # the command's page: the card cell for cell, its releases' statuses among the notes
    checked = check_report(str(out / "report.html"), str(out / "report.json"))
    page = (out / "report.html").read_text()
    assert "NOT covered" in page and checked["parsed"].tables
    # the training curves of the private model and its twin, drawn from the card's histories
    assert "training curves: histories.private" in page and "training curves: histories.baseline" in page
    m, t = dp["microbatch_size"], dp["tail_microbatch_size"]  # the backend's sizes (t < m from 8 units up)
    assert t == (m if m < 8 or dp["expected_batch"] >= 8 * m else -(-m // 4))
    size = f"{m} units a microbatch" + (f" (a batch's remainder {t} at a time)" if t < m else "")
    assert f"| {dp['clipping'].replace('_', '-')}, {size} (auto: " in md
    # the one-run column states its confidence, and the card the most these canaries could show
    one = card["models"]["private"]["canaries"]["one_run"]
    assert one["confidence"] == 0.95 and f"{one['epsilon']:.3f} (95%)" in md and one["ceiling"] >= one["epsilon"]
    assert f"the largest bound any attack could show at 95% confidence is {one['ceiling']:.3f}" in md
    assert os.path.isfile(out / "export" / "private" / "config.json")
    assert os.path.isfile(out / "export" / "private_adapter" / "adapter_config.json")
    # a rerun resumes from the checkpoints and evaluations: the same card (wall time aside)
    assert main(["finetune", cfg, "--out", str(out), "--quiet"]) == 0
    again = json.loads((out / "report.json").read_text())
    card.pop("seconds"), again.pop("seconds")
    assert again == card
    # another configuration into the same folder is refused, naming the first differing key
    other = _toml(root, model, data, finetune="method = \"lora\"\nrank = 2\nsteps = 4\nbatch_size = 4\n")
    assert main(["finetune", other, "--out", str(out), "--quiet"]) == 2
    assert "finetune.steps" in capsys.readouterr().err


def test_the_comparison_holds_the_ratios_goals_and_exposures():
    """compare_models: each perplexity ratio against its goal (met when at most the goal, the boundary included),
    the median exposures of both trained models, and nothing without a twin or a base."""
    from snapaudit_jax.finetune.report import GOALS, compare_models

    def model(ppl, exposure=None):
        row = {"held_out_perplexity": ppl}
        if exposure is not None:
            row["canaries"] = {"exposure": {"median_inserted": exposure[0], "median_held_out": exposure[1]}}
        return row

    models = {"base": model(20.0), "private": model(10.0, (1.0, 0.9)), "baseline": model(8.0, (12.5, 1.1))}
    out = compare_models(models)
    assert out["private_over_baseline_perplexity"] == {"ratio": 1.25, "goal": GOALS[
        "private_over_baseline_perplexity"], "met": True}
    assert out["private_over_base_perplexity"] == {"ratio": 0.5, "goal": 0.5, "met": True}
    assert out["exposure_median_inserted"] == {"private": 1.0, "baseline": 12.5}
    assert out["exposure_median_held_out"] == {"private": 0.9, "baseline": 1.1}
    models["private"] = model(12.5)
    out = compare_models(models)
    assert not out["private_over_baseline_perplexity"]["met"] and not out["private_over_base_perplexity"]["met"]
    assert "exposure_median_inserted" not in out
    assert compare_models({"base": model(1.0), "private": model(1.0)}) is None


@pytest.mark.slow
def test_a_generated_corpus_is_made_at_run_time_and_stamps_the_run_folder(tiny, tmp_path):
    """``[data] generate``: the run trains on the generator's patients (user-level units, split by the keyed
    hash), nothing is read from or written to a data file, and the run folder's stamp holds the corpus's digest
    (another seed: another digest)."""
    from snapaudit_jax.finetune.run import run_folder
    from snapaudit_jax.finetune.synthetic import clinical_notes, digest

    root, model, _, _ = tiny
    data = ('generate = "clinical_notes"\ngenerate_units = 60\ngenerate_seed = 3\nuser_field = "patient"\n'
            'max_length = 24\nheld_out_fraction = 0.2\n')
    cfg = _toml(root, model, "", data=data, privacy="unit = \"user\"\ntarget_epsilon = 4.0\n"
                                                   "max_records_per_user = 2\n", canaries="n_canaries = 0\n")
    config = load_finetune_config(cfg)
    assert config.data.path == "" and config.data.generate_units == 60
    prep = prepare(config)
    notes = clinical_notes(60, 3)
    patients = {r["patient"] for r in notes}
    held = sum(_coin(1, "held_out", b"user\0" + p.casefold().encode()) < 0.2 for p in patients)  # canonical ids
    assert 0 < held < 60 and prep.data.stats["users"] == 60
    assert prep.dataset[0].shape[0] == 60 - held and prep.dataset[0].shape[1] == 2
    table = run_folder(config, str(tmp_path / "run")).config
    assert table["data"]["sha256"] == digest(notes) != digest(clinical_notes(60, 4))
    assert table["data"]["generate"] == "clinical_notes"


@pytest.mark.slow
def test_a_deep_model_trains_under_the_scan_and_releases_every_blocks_adapters(tmp_path):
    """A model of SCAN_MIN_LAYERS blocks trains with its blocks under one scan (``[finetune] layers = "scan"``;
    the card says so), resumes to the same card, and its released adapter moved in every block (B starts at
    zero: an adapter the stacked step never updated would still be zero there)."""
    from safetensors.numpy import load_file

    from snapaudit_jax.dpsgd import SCAN_MIN_LAYERS

    rows = _notes()
    model = make_tiny_llm_folder(str(tmp_path / "model"), [r["text"] for r in rows], vocab_size=300,
                                 layers=SCAN_MIN_LAYERS)
    data = tmp_path / "notes.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = _toml(tmp_path, model, str(data), canaries="n_canaries = 0\n",
                finetune="method = \"lora\"\nrank = 2\nsteps = 3\nbatch_size = 4\nlearning_rate = 0.01\n"
                         "checkpoint_every = 2\nlayers = \"scan\"\n")
    out = tmp_path / "run"
    assert main(["finetune", cfg, "--out", str(out), "--quiet"]) == 0
    card = json.loads((out / "report.json").read_text())
    dp = card["dpsgd"]
    assert dp["layers"] == "scan" and dp["layers_reason"] == 'requested (layers = "scan")'
    assert '| layers (the same function either way, to float32 rounding) | scan (requested (layers = "scan")) |' in (
        out / "report.md").read_text()
    folder = out / "export" / "private_adapter"
    adapter = load_file(str(next(folder / n for n in os.listdir(folder) if n.endswith(".safetensors"))))
    for i in range(SCAN_MIN_LAYERS):
        moved = [k for k, v in adapter.items() if f"layers.{i}." in k and "lora_B" in k and np.abs(v).max() > 0]
        assert moved, f"block {i}: no adapter moved"
    assert main(["finetune", cfg, "--out", str(out), "--quiet"]) == 0
    again = json.loads((out / "report.json").read_text())
    card.pop("seconds"), again.pop("seconds")
    assert again == card


@pytest.mark.slow
@pytest.mark.parametrize("digits", [4, 6])
def test_the_plan_counts_the_canary_scoring_the_run_does(tiny, monkeypatch, digits):
    """The plan's count of canary continuations and forward passes per model equals what the memorization
    measurement scores (counted by wrapping LanguageModel.continuation_logprobs and the token tree's passes): the
    whole space when it is exact, else the sample, the canaries and the beam search's labels."""
    from snapaudit_jax.finetune import run as run_mod
    from snapaudit_jax.models.lm import LanguageModel, _Trie

    root, model, data, _ = tiny
    cfg = _toml(root, model, data, canaries=f"n_canaries = 4\ndigits = {digits}\nexact_limit = 10000\n"
                                            "samples = 64\ntop_k = 5\n",
                data=f'path = "{data}"\nuser_field = "user"\nmax_length = 40\nheld_out_fraction = 0.2\n')
    prep = prepare(load_finetune_config(cfg))
    count, passes, _ = run_mod._canary_work(prep)
    scored, chunks = [], []
    original, original_chunks = LanguageModel.continuation_logprobs, _Trie.chunks

    def counting(self, prompt, continuations, **kw):
        scored.append(len(continuations))
        return original(self, prompt, continuations, **kw)

    def counting_chunks(self, capacity):
        out = original_chunks(self, capacity)
        chunks.append(len(out))
        return out

    monkeypatch.setattr(LanguageModel, "continuation_logprobs", counting)
    monkeypatch.setattr(_Trie, "chunks", counting_chunks)
    run_mod._memorization(prep.lm.module, prep)
    assert sum(scored) == count and sum(chunks) == passes
    assert count == (10**4 if digits == 4 else 64 + 4 + 10**4 + 5 * 10**2 + 5)


@pytest.mark.slow
def test_the_plan_lists_the_phases_that_run_and_the_records_the_cap_drops(tiny):
    root, model, data, rows = tiny
    user = "unit = \"user\"\ntarget_epsilon = 4.0\nmax_records_per_user = 1\n"
    for baseline in (True, False):
        cfg = _toml(root, model, data, run=f"seed = 1\nbaseline = {str(baseline).lower()}\neval_batch_size = 8\n",
                    privacy=user)
        info = plan_dict(prepare(load_finetune_config(cfg)))
        phases = info["timing"]["phases"]
        assert ("baseline_training" in phases) is baseline and "canary_memorization" in phases
        assert info["timing"]["seconds_total"] == pytest.approx(sum(phases.values()))
        # an HF folder model with LoRA and a PEFT adapter: one full folder exported (the merged private model)
        assert phases["export"] == info["timing"]["seconds_per_export_folder"] > 0
        t = info["timing"]  # DP-LoRA: book-keeping on every backend; the run's microbatch
        cpu = jax.default_backend() == "cpu"
        assert t["clipping"] == "book_keeping"
        e = info["expected_batch"]  # book-keeping on CPU: the largest power of two <= min(4, e / 4), 1 below 8
        assert t["microbatch_size"] == ((1 if e < 8 else min(4, 2 ** int(math.log2(e / 4)))) if cpu
                                        else min(32, math.ceil(e)))
        m = t["microbatch_size"]  # the remainder's: a quarter of m from 8 units up below 8 m expected (any backend)
        assert t["tail_microbatch_size"] == (m if m < 8 or e >= 8 * m else -(-m // 4))
        assert (t["tail_microbatches_per_step"] > 0) is (t["tail_microbatch_size"] < m)
        assert phases["private_training"] == pytest.approx(
            (t["seconds_per_microbatch"] * t["microbatches_per_step"]
             + t["seconds_per_tail_microbatch"] * t["tail_microbatches_per_step"]) * info["steps"])
        # the matrix products, counted from the step's jaxpr: a step's expected calls, the twin's steps too
        per_step = (t["matmul_flops_per_microbatch"] * t["microbatches_per_step"]
                    + t["matmul_flops_per_tail_microbatch"] * t["tail_microbatches_per_step"])
        assert t["matmul_flops_per_microbatch"] > 0 and t["matmul_tflop_per_step"] == pytest.approx(per_step / 1e12)
        assert t["matmul_flops_per_tail_microbatch"] == 0 or (
            t["matmul_flops_per_tail_microbatch"] < t["matmul_flops_per_microbatch"])
        assert t["matmul_pflop_training"] == pytest.approx(per_step * info["steps"] * (1 + baseline) / 1e15)
        text = run_mod_format(info)
        assert ("baseline training" in text) is baseline and "(baseline included)" not in text
        assert f"matrix products: {t['matmul_tflop_per_step']:.3g} TFLOP a step" in text
        assert 0 < t["matmul_share_full_float32_precision"] < 1  # book-keeping's norms and sums of the adapters
        assert "export" in text
    # the microbatch's compiled memory (XLA's analysis) and its whole logits (2 float32 arrays: logits, cotangent)
    prep = prepare(load_finetune_config(cfg))
    rows_per_unit = prep.dataset[0].shape[1] if prep.dataset[0].ndim == 3 else 1
    assert t["logits_bytes"] == (8 * t["microbatch_size"] * rows_per_unit * prep.dataset[0].shape[-1]
                                 * prep.lm.module.cfg.vocab_size)
    assert info["memory"]["microbatch_compiled_bytes"] > 0
    assert "memory of one microbatch's clipped gradient sum (XLA's analysis" in text
    assert "finetune.vocab_chunk slices them" in text
    lean = _toml(root, model, data, export="hf = false\n", finetune="vocab_chunk = 16\nmicrobatch_size = 8\n")
    sliced = plan_dict(prepare(load_finetune_config(lean)))
    assert "export" not in sliced["timing"]["phases"] and sliced["timing"]["vocab_chunk"] == 16
    assert "the LM head in slices of 16 vocabulary rows" in run_mod_format(sliced)
    t = sliced["timing"]  # microbatches of 8: the remainder 2 at a time, measured apart
    assert (t["microbatch_size"], t["tail_microbatch_size"]) == (8, 2) and t["tail_microbatches_per_step"] > 0
    assert t["seconds_per_tail_microbatch"] > 0
    assert sliced["timing"]["phases"]["private_training"] == pytest.approx(
        (t["seconds_per_microbatch"] * t["microbatches_per_step"]
         + t["seconds_per_tail_microbatch"] * t["tail_microbatches_per_step"]) * sliced["steps"])
    assert f"of 2 units (the remainder; {t['seconds_per_tail_microbatch']:.3g} s each)" in run_mod_format(sliced)
    s = info["data"]
    assert s["records_dropped_by_cap"] > 0
    assert (f"{s['users_capped']} capped at 1 records, which drops {s['records_dropped_by_cap']} of the "
            f"{len(rows)} records read") in text


def run_mod_format(info):
    from snapaudit_jax.finetune.run import format_plan

    return format_plan(info)


def test_the_plan_expects_the_microbatches_a_poisson_step_runs():
    """``(E[ceil(K / m)], 0)`` for ``K ~ Binomial(N, q)`` with one size; with a remainder's size ``t < m``,
    ``E[floor(K / m)]`` calls of ``m`` (one more where ``K mod m > m - t``) and ``E[ceil((K mod m) / t)]`` of ``t``
    (none then), against the exact sums in rationals; ``m = 1`` is ``E[K] = N q``."""
    from fractions import Fraction

    from snapaudit_jax.finetune.run import _expected_microbatches

    def exact(n, q, calls):
        qf = Fraction(q)
        return float(sum(math.comb(n, k) * qf**k * (1 - qf) ** (n - k) * calls(k) for k in range(n + 1)))

    for n, q, m in [(40, 0.1, 3), (17, 0.5, 4), (9, 0.25, 1), (30, 0.9, 32)]:
        for tail in (None, m):
            full, rest = _expected_microbatches(n, q, m, tail)
            assert full == pytest.approx(exact(n, q, lambda k: -(-k // m)), rel=1e-12) and rest == 0.0
    for n, q, m, t in [(40, 0.5, 8, 2), (70, 0.5, 32, 8), (31, 0.9, 8, 3)]:
        full, rest = _expected_microbatches(n, q, m, t)
        assert full == pytest.approx(exact(n, q, lambda k: k // m + (k % m > m - t)), rel=1e-12)
        assert rest == pytest.approx(exact(n, q, lambda k: 0 if k % m > m - t else -(-(k % m) // t)), rel=1e-12)
    assert _expected_microbatches(9, 0.25, 1)[0] == pytest.approx(9 * 0.25, rel=1e-12)
