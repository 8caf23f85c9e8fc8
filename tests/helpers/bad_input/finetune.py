"""Bad-input cases of ``snapaudit finetune`` (see :mod:`tests.helpers.bad_input`).

Every case writes a complete, valid run under ``tmp_path`` -- a tiny Llama folder (numpy weights, a real BPE,
:func:`~tests.helpers.bad_input.common._hf_folder`), a records file of 20 notes by 5 users, and a configuration
of a 2-step LoRA fine-tune -- and breaks one thing: a data file (no text column, a record without its user,
not UTF-8, missing, of another format, an empty or missing held-out file, a held-out fraction that holds out
none), a key (unknown, of the wrong type, out of range), a setting only the data or the model can refute (a
``delta`` at or above ``1 / N``, a LoRA rank above a projection's width, a target epsilon no sigma reaches, a
batch above ``N``, a canary longer than ``max_length``, a model too large for memory), the base model (missing,
broken, without a tokenizer, a BERT embedder), ``--plan`` with a bad configuration, or the output folder
(another configuration's or other data's finished run, a locked one, paths that cannot be written). Each must
exit 2 naming ``section.key`` (or ``--out``) before any weights are loaded or anything is trained, and leave the
whole tree as it was.

``tests/snapaudit_jax/finetune/test_finetune.py`` checks some of these rules through :func:`prepare` and the
command line; the cases here use other values and add the suite's checks (no traceback, no stdout, every byte
of ``tmp_path`` unchanged). The unreachable target uses the RDP accountant: a PLD search that ends in
"unreachable" costs seconds per bracket step, RDP about one second in all.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

from tests.helpers.bad_input.common import _BERT, _LLAMA, Case, _hf_folder, _out_cases, _tokenizer, _write
from tests.helpers.bad_input.private_data import _release_if_read

_HOLDER = f"pid {os.getpid()} on "  # the cases run in this process, which holds their locks

# Sections of a valid run; {root} is the case's folder (the model at {root}/lm, the records at {root}/notes.jsonl).
_OK = {
    "run": "seed = 1\nbaseline = false\neval_batch_size = 8\n",
    "data": 'path = "{root}/notes.jsonl"\nuser_field = "user"\nmax_length = 24\nheld_out_fraction = 0.2\n',
    "model": 'base = "{root}/lm"\n',
    "finetune": 'method = "lora"\nrank = 2\nsteps = 2\nbatch_size = 4\ncheckpoint_every = 1\n',
    "privacy": "target_epsilon = 0.0\nnoise_multiplier = 1.0\n",
    "canaries": "n_canaries = 0\n",
}
# 35e12 parameters (512 layers of width 65536): only its config.json is read, and the memory check refuses it.
_HUGE = {**_LLAMA, "hidden_size": 65536, "intermediate_size": 262144, "num_hidden_layers": 512,
         "num_attention_heads": 512, "num_key_value_heads": 512}
# Never read by the output-folder cases: --out is checked before the data and the model.
FINETUNE_NO_FILES = "".join(f"[{k}]\n{v}\n" for k, v in _OK.items()).replace("{root}", "/no/such/folder")


def _toml(root: Path, **sections: str) -> str:
    body = {**_OK, **sections}
    return "".join(f"[{name}]\n{text}\n" for name, text in body.items()).replace("{root}", str(root))


def _jsonl(rows: list[dict]) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


def _inputs(root: Path) -> None:
    """The tiny Llama folder and the records file (20 notes by 5 users) under ``root``."""
    _hf_folder(root / "lm", _LLAMA)
    _write(root / "notes.jsonl", _jsonl([{"text": f"note {i} of a user", "user": f"u{i % 5}"} for i in range(20)]))


def _ft(*extra: str, files: Callable[[Path], None] | None = None, **sections: str):
    """``snapaudit finetune c.toml --quiet --out tmp/out [extra]``: valid inputs, then ``files(tmp)``, with the
    ``sections`` replaced."""
    def build(tmp: Path) -> list[str]:
        _inputs(tmp)
        if files is not None:
            files(tmp)
        return ["finetune", _write(tmp / "c.toml", _toml(tmp, **sections)), "--quiet", "--out", str(tmp / "out"),
                *extra]

    return build


def _ft_odd(make: Callable[[Path], str], key: str = "path", model: bool = False):
    """``snapaudit finetune`` whose ``data.<key>`` (or, with ``model``, ``model.base``) is ``make(folder)``, made in
    a folder outside ``tmp_path`` (the suite's tree check opens every file under ``tmp_path``: a FIFO or an
    endless device there would block the check itself), removed when the case ends."""
    def build(tmp: Path, stack: contextlib.ExitStack) -> list[str]:
        _inputs(tmp)
        odd = make(Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="snapaudit-odd-"))))
        if model:
            sections = {"model": f'base = "{odd}"\n'}
        elif key == "path":
            sections = {"data": f'path = "{odd}"\nmax_length = 24\nheld_out_fraction = 0.2\n'}
        else:
            sections = {"data": _data_section("notes.jsonl", f'{key} = "{odd}"\n')}
        return ["finetune", _write(tmp / "c.toml", _toml(tmp, **sections)), "--quiet", "--out", str(tmp / "out")]

    return build


def _fifo(folder: Path, name: str = "notes.jsonl") -> str:
    os.mkfifo(folder / name)
    threading.Thread(target=_release_if_read, args=(str(folder / name),), daemon=True).start()
    return str(folder / name)


def _link(folder: Path, target: str, name: str = "notes.jsonl") -> str:
    os.symlink(target, folder / name)
    return str(folder / name)


def _model_with_fifo(folder: Path, name: str) -> str:
    """The tiny Llama folder with its file ``name`` replaced by a FIFO."""
    model = Path(_hf_folder(folder / "lm", _LLAMA))
    os.unlink(model / name)
    _fifo(model, name)
    return str(model)


def _bert(tmp: Path) -> None:
    _tokenizer(Path(_hf_folder(tmp / "bert", _BERT)))


def _data(name: str, content: str | bytes):
    return lambda tmp: _write(tmp / name, content)


def _data_section(path: str, extra: str = "") -> str:
    return f'path = "{{root}}/{path}"\nmax_length = 24\n{extra}'


def _folder(tmp: Path, toml: str, out: Path):
    from snapaudit_jax.finetune.config import load_finetune_config
    from snapaudit_jax.finetune.run import run_folder

    path = _write(tmp / "stamp.toml", toml)
    config = load_finetune_config(path)
    os.unlink(path)
    return run_folder(config, out)


def _finished(tmp: Path, toml: str) -> Path:
    """A finished run folder of ``toml`` at ``tmp/run``: its stamp, report card, evaluations, checkpoint and
    exports (placeholder bytes)."""
    out = tmp / "run"
    with _folder(tmp, toml, out).claim():
        pass
    for name, content in {"report.json": "{}\n", "report.md": "# DP fine-tuning report\n",
                          "evaluations/base.json": "{}\n", "evaluations/private.json": "{}\n",
                          "checkpoints/private/step_00000002/meta.json": "{}\n",
                          "export/private/config.json": "{}\n",
                          "export/private_adapter/adapter_config.json": "{}\n"}.items():
        _write(out / name, content)
    return out


def _into(out: Callable[..., Path], with_stack: bool = False, **sections: str):
    """``snapaudit finetune c.toml --out <out(tmp, toml)>``: the folder is made from the valid configuration, the
    run is of ``sections``'."""
    def build(tmp: Path, stack: contextlib.ExitStack | None = None) -> list[str]:
        _inputs(tmp)
        folder = out(tmp, _toml(tmp), stack) if with_stack else out(tmp, _toml(tmp))
        return ["finetune", _write(tmp / "c.toml", _toml(tmp, **sections)), "--quiet", "--out", str(folder)]

    return build


def _data_changed(tmp: Path, toml: str) -> Path:
    """A finished run folder of ``toml`` whose records file was edited since (its digest is in the stamp)."""
    folder = _finished(tmp, toml)
    _write(tmp / "notes.jsonl", _jsonl([{"text": "an edited note", "user": "u0"}]))
    return folder


def _locked(tmp: Path, toml: str, stack: contextlib.ExitStack) -> Path:
    folder = _finished(tmp, toml)
    stack.enter_context(_folder(tmp, toml, folder).claim())
    return folder


CASES: list[Case] = [
    # The data files.
    Case("finetune-data-without-the-text-field",
         _ft(files=_data("d.jsonl", _jsonl([{"note": f"row {i}"} for i in range(10)])),
             data=_data_section("d.jsonl")),
         ("data.text_field", "the column 'text' is not in", "d.jsonl", "its columns: note")),
    Case("finetune-data-text-field-of-numbers",
         _ft(files=_data("d.jsonl", _jsonl([{"text": "a note"}, {"text": 12}])), data=_data_section("d.jsonl")),
         ("data.text_field", "row 1", "must hold a non-empty text", "got int")),
    Case("finetune-held-out-file-empty",
         _ft(files=_data("held.jsonl", ""), data=_data_section("notes.jsonl", 'held_out_path = "{root}/held.jsonl"\n')),
         ("data.held_out_path", "held.jsonl", "is empty")),
    Case("finetune-held-out-fraction-holds-out-none",
         _ft(data=_data_section("notes.jsonl", "held_out_fraction = 0.0005\n")),
         ("data.held_out_fraction", "0.0005 of 20 units held out none", "data.held_out_path")),
    Case("finetune-user-missing-in-some-rows",
         _ft(files=_data("d.jsonl", _jsonl([{"text": f"note {i}", **({"user": f"u{i}"} if i != 3 else {})}
                                            for i in range(10)])),
             data=_data_section("d.jsonl", 'user_field = "user"\n'),
             privacy='unit = "user"\ntarget_epsilon = 0.0\nnoise_multiplier = 1.0\n'),
         ("data.user_field", "row 3", "has no user (missing)", "every record needs one")),
    Case("finetune-user-unit-without-user-field",
         _ft(data=_data_section("notes.jsonl"),
             privacy='unit = "user"\ntarget_epsilon = 0.0\nnoise_multiplier = 1.0\n'),
         ("data.user_field", "privacy.unit = 'user' needs the column", "got ''")),
    Case("finetune-data-file-missing", _ft(data=_data_section("nowhere.jsonl")),
         ("data.path", "nowhere.jsonl", "does not exist")),
    Case("finetune-data-file-not-utf8",
         _ft(files=_data("latin1.jsonl", b'{"text": "caf\xe9 au lait"}\n' * 10), data=_data_section("latin1.jsonl")),
         ("data.path", "latin1.jsonl", "must be UTF-8 text", "b'\\xe9'")),
    Case("finetune-data-file-of-another-format",
         _ft(files=_data("notes.txt", "a note\n"), data=_data_section("notes.txt")),
         ("data.path", "must be one of .jsonl, .json, .csv, .parquet", "'.txt'")),
    Case("finetune-train-on-unknown",
         _ft(data=_data_section("notes.jsonl", 'train_on = "answers"\n')),
         ("data.train_on", "must be one of", "'answers'")),
    Case("finetune-messages-not-a-list",
         _ft(files=_data("m.jsonl", _jsonl([{"messages": "hello"}] * 5)),
             data=_data_section("m.jsonl", 'messages_field = "messages"\n')),
         ("data.messages_field", "row 0", "must hold a non-empty list of messages", "got str")),
    Case("finetune-held-out-file-missing",
         _ft(data=_data_section("notes.jsonl", 'held_out_path = "{root}/held.jsonl"\n')),
         ("data.held_out_path", "held.jsonl", "does not exist")),
    Case("finetune-canary-longer-than-max-length",
         _ft(data=_data_section("notes.jsonl").replace("24", "4"), canaries="n_canaries = 2\ndigits = 4\n"),
         ("canaries.template", "more than data.max_length = 4")),
    Case("finetune-canaries-unfair-coins",
         _ft(canaries="n_canaries = 4\ndigits = 4\ninsert_probability = 0.3\n"),
         ("canaries.insert_probability", "must be 1/2", "fair coins", "got 0.3")),
    Case("finetune-data-file-is-a-folder",
         _ft(files=lambda t: (t / "folder.jsonl").mkdir(), data=_data_section("folder.jsonl")),
         ("data.path", "folder.jsonl")),
    # Paths that are not regular files: refused from their type, never opened (a FIFO would block, a device
    # never end); a FIFO's helper thread writes to it if a reader ever waits, so a regression fails, not hangs.
    Case("finetune-data-path-is-a-fifo", _ft_odd(_fifo),
         ("data.path", "notes.jsonl", "must be a regular file", "got a FIFO (named pipe)", "not opened"),
         with_stack=True),
    Case("finetune-data-path-links-to-an-endless-device", _ft_odd(lambda f: _link(f, "/dev/zero")),
         ("data.path", "notes.jsonl", "must be a regular file", "got a character device"), with_stack=True),
    Case("finetune-held-out-path-is-a-fifo", _ft_odd(lambda f: _fifo(f, "held.jsonl"), key="held_out_path"),
         ("data.held_out_path", "held.jsonl", "got a FIFO"), with_stack=True),
    Case("finetune-data-path-is-a-dangling-symlink", _ft_odd(lambda f: _link(f, str(f / "gone.jsonl"))),
         ("data.path", "notes.jsonl", "symbolic link to", "gone.jsonl", "does not exist"), with_stack=True),
    Case("finetune-base-config-is-a-fifo", _ft_odd(lambda f: _model_with_fifo(f, "config.json"), model=True),
         ("config.json", "must be a regular file", "got a FIFO"), with_stack=True),
    Case("finetune-base-tokenizer-is-a-fifo", _ft_odd(lambda f: _model_with_fifo(f, "tokenizer.json"), model=True),
         ("tokenizer.json", "must be a regular file", "got a FIFO"), with_stack=True),
    Case("finetune-base-weights-are-a-fifo",
         _ft_odd(lambda f: _model_with_fifo(f, "model.safetensors"), model=True),
         ("model.safetensors", "must be a regular file", "got a FIFO"), with_stack=True),
    # Settings only the data or the model can refute (checked before the weights are loaded).
    Case("finetune-target-epsilon-unreachable",
         _ft(privacy='target_epsilon = 1e-4\ndelta = 1e-6\naccountant = "rdp"\n'),
         ("privacy.target_epsilon", "unreachable with the rdp accountant", "even at noise_multiplier=10000")),
    Case("finetune-lora-rank-above-the-width",
         _ft(finetune='method = "lora"\nrank = 9\nsteps = 2\nbatch_size = 4\n'),  # k_proj and v_proj are 8 wide
         ("finetune.rank", "rank must be <= the width 8", "got 9")),
    Case("finetune-lora-target-of-gpt2",
         _ft(finetune='method = "lora"\nrank = 2\ntargets = ["q_proj", "mlp.c_proj"]\n'),
         ("finetune.targets", "'mlp.c_proj'")),
    Case("finetune-delta-at-least-one-over-n",
         # N = 18: the keyed hashes of 2 of the 20 notes fall below the default held_out_fraction 0.1
         _ft(privacy="target_epsilon = 0.0\nnoise_multiplier = 1.0\ndelta = 0.06\n"),
         ("privacy.delta", "must be below 1 / N = 0.0556 for N = 18 records", "got 0.06",
          "privacy.allow_large_delta = true")),
    Case("finetune-more-devices-than-this-process-has",
         _ft(finetune='method = "lora"\nrank = 2\nsteps = 2\nbatch_size = 4\ndevices = 4000\n'),
         ("finetune.devices", "local devices", "got 4000")),
    Case("finetune-sweep-validation-leaves-no-training-unit",
         _ft(sweep='learning_rate = [0.01, 0.02]\nvalidation_fraction = 0.99\n'),
         ("sweep.validation_fraction", "at least one unit on each side")),
    Case("finetune-sweep-of-repeated-values",
         _ft(sweep='steps = [2, 2]\n'), ("sweep.steps", "must not repeat a value", "[2, 2]")),
    Case("finetune-batch-above-the-units",
         _ft(finetune='method = "lora"\nrank = 2\nsteps = 2\nbatch_size = 19\n'),
         ("finetune.batch_size", "must be <= N = 18 units", "got 19")),
    # Keys: unknown, of the wrong type, out of range.
    Case("finetune-unknown-key", _ft(privacy="target_epsilon = 0.0\nnoise_multiplier = 1.0\nsigma = 2\n"),
         ("privacy: unknown key(s) sigma", "allowed:", "noise_multiplier")),
    Case("finetune-unknown-section", _ft(lora="rank = 4\n"), ("unknown key(s) lora",)),
    Case("finetune-clipping-unknown", _ft(finetune='method = "lora"\nrank = 2\nclipping = "fast"\n'),
         ("finetune.clipping", "must be one of 'auto', 'per_record', 'book_keeping', 'ghost'", "'fast'")),
    Case("finetune-steps-not-an-integer", _ft(finetune='method = "lora"\nrank = 2\nsteps = "ten"\n'),
         ("finetune.steps", "must be an integer >= 1", "'ten'")),
    Case("finetune-base-not-a-string", _ft(model="base = 3\n"), ("model.base", "must be a string", "got 3")),
    Case("finetune-baseline-not-a-boolean", _ft(run="baseline = 1\n"),
         ("run.baseline", "must be true or false", "got 1")),
    Case("finetune-targets-not-a-list", _ft(finetune='method = "lora"\nrank = 2\ntargets = "q_proj"\n'),
         ("finetune.targets", "must be a list", "'q_proj'")),
    Case("finetune-export-flag-not-a-boolean", _ft(export='peft = "yes"\n'),
         ("export.peft", "must be true or false", "'yes'")),
    Case("finetune-both-epsilon-and-sigma", _ft(privacy="target_epsilon = 2.0\nnoise_multiplier = 1.5\n"),
         ("privacy.target_epsilon", "exactly one", "noise_multiplier=1.5")),
    Case("finetune-max-length-too-small", _ft(data=_data_section("notes.jsonl").replace("24", "1")),
         ("data.max_length", "must be an integer >= 2", "got 1")),
    # The base model.
    Case("finetune-base-path-missing", _ft(model='base = "{root}/no-model"\n'),
         ("model.base", "no-model", "not a .gguf file or a checkpoint folder")),
    Case("finetune-base-config-missing-field",
         _ft(files=lambda t: _hf_folder(t / "broken", _LLAMA, drop=("num_hidden_layers",)),
             model='base = "{root}/broken"\n'),
         ("model.base", "config.json", "missing required field 'num_hidden_layers'")),
    Case("finetune-base-folder-without-a-tokenizer",
         _ft(files=lambda t: os.unlink(os.path.join(_hf_folder(t / "bare", _LLAMA), "tokenizer.json")),
             model='base = "{root}/bare"\n'),
         ("model.base", "bare", "no tokenizer.json")),
    # A BERT folder with a tokenizer: an embedder, not a decoder (refused naming model.base for either method).
    *[Case(f"finetune-base-is-a-bert-folder-{method}",
           _ft(files=_bert, model='base = "{root}/bert"\n',
               finetune=f'method = "{method}"\nsteps = 2\nbatch_size = 4\n'),
           ("model.base", "bert", "BertConfig")) for method in ("full", "lora")],
    Case("finetune-base-too-large-for-memory",
         _ft(files=lambda t: _hf_folder(t / "huge", _HUGE, weights="none"), model='base = "{root}/huge"\n',
             finetune='method = "full"\nsteps = 2\nbatch_size = 4\n'),
         ("finetune.method", "full fine-tuning of 35,184,457,940,992 parameters", "TiB of memory")),
    # --plan: the same checks, nothing printed.
    Case("finetune-plan-with-a-bad-rank", _ft("--plan", finetune='method = "lora"\nrank = 9\n'),
         ("finetune.rank", "rank must be <= the width 8", "got 9")),
    Case("finetune-plan-with-a-missing-data-file", _ft("--plan", data=_data_section("nowhere.jsonl")),
         ("data.path", "nowhere.jsonl", "does not exist")),
    # Run folders: another configuration's finished run, a run held by another live process.
    Case("finetune-finished-folder-of-another-configuration",
         _into(_finished, finetune='method = "lora"\nrank = 2\nsteps = 3\nbatch_size = 4\ncheckpoint_every = 1\n'),
         ("--out", "holds a run of another configuration", "finetune.steps is 2 there, 3 here",
          "choose another --out folder")),
    Case("finetune-finished-folder-of-other-data",
         _into(_data_changed),
         ("--out", "holds a run of another configuration", "data.sha256")),
    Case("finetune-folder-locked", _into(_locked, with_stack=True),
         ("--out", "is in use by another run", _HOLDER, "snapaudit finetune", "run.lock"), with_stack=True),
    *_out_cases("finetune", FINETUNE_NO_FILES),
]
