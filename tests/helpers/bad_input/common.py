"""The harness of the bad-input suite (``tests/test_bad_input.py``): the :class:`Case` record, builders of bad
files, folders and configurations, and the whole-tree snapshot every case is checked with.

Each case builds its inputs under ``tmp_path`` and returns the ``argv`` of :func:`snapaudit_jax.cli.main`; the
suite runs it in-process and checks exit status 2, the named field in stderr, no traceback, and the whole
``tmp_path`` tree unchanged. The case tables live in this package, one module per area
(:mod:`.server`, :mod:`.run_folder`, :mod:`.values`, :mod:`.private_data`), and in ``tests/test_bad_input.py``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.pii import tiny_pii_toml

NO_LLM = '[model]\nllm = "/no/such/model"\n'  # never loaded: every case fails before the model
AUDIT_OK = NO_LLM + "[pipelines.pv]\n"
CPA_OK = ('[run]\nn_cal = 10\nn_test = 10\n\n[data.synthetic]\nn_people = 50\nn_documents = 30\n\n'
          '[attackers.r]\nkind = "retrieval"\n')
PII_OK = tiny_pii_toml()  # the tiny experiment of the PII tests (every variant)
HASH = "0" * 64  # a well-formed answer-cache key


# --- builders of bad files ------------------------------------------------------------------------------------
def _write(path: Path, content: str | bytes) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return str(path)


def _pii(old: str, new: str) -> str:
    assert old in PII_OK, old
    return PII_OK.replace(old, new, 1)


def _cpa(old: str, new: str) -> str:
    assert old in CPA_OK, old
    return CPA_OK.replace(old, new, 1)


def _npz(path: Path, **arrays) -> str:
    np.savez(path, **arrays)
    return str(path)


def _bad_gguf(path: Path, kind: str) -> str:
    if kind == "magic":
        return _write(path, b"GGUX" + bytes(60))
    # A GGUF v3 header that promises 3 tensors and 9 metadata entries, then ends.
    return _write(path, b"GGUF" + (3).to_bytes(4, "little") + (3).to_bytes(8, "little") + (9).to_bytes(8, "little"))


_LLAMA = {"model_type": "llama", "vocab_size": 0, "hidden_size": 16, "intermediate_size": 32,
          "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
          "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": True}
_BERT = {"model_type": "bert", "vocab_size": 30, "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
         "intermediate_size": 16, "max_position_embeddings": 32, "type_vocab_size": 2}


def _tokenizer(folder: Path) -> int:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["a tiny corpus for a tiny tokenizer", "hello there"], trainer)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>",
                                                              "pad_token": "<|endoftext|>"}))
    return tok.get_vocab_size()


def _hf_folder(path: Path, config: dict, *, drop: tuple[str, ...] = (), weights: str = "ok") -> str:
    """A Hugging Face folder: a complete tiny Llama (numpy weights, a real BPE tokenizer) or a broken one.

    ``weights``: ``"ok"``, ``"truncated"`` (half the file), ``"header"`` (a header length past the end and no
    JSON), ``"pickle"`` (a ``pytorch_model.bin`` only) or ``"none"``.
    """
    from safetensors.numpy import save_file

    path.mkdir(parents=True)
    config = dict(config)
    if config["model_type"] == "llama":
        config["vocab_size"] = _tokenizer(path)
    for key in drop:
        config.pop(key)
    (path / "config.json").write_text(json.dumps(config))
    rng = np.random.default_rng(0)

    def t(*shape):
        return rng.normal(0, 0.2, shape).astype(np.float32)

    if config["model_type"] == "llama":
        v, h, i = config.get("vocab_size", 8), 16, 32
        tensors = {"model.embed_tokens.weight": t(v, h), "model.norm.weight": np.ones(h, np.float32)}
        p = "model.layers.0."
        tensors.update({p + "input_layernorm.weight": np.ones(h, np.float32),
                        p + "post_attention_layernorm.weight": np.ones(h, np.float32),
                        p + "self_attn.q_proj.weight": t(16, h), p + "self_attn.k_proj.weight": t(8, h),
                        p + "self_attn.v_proj.weight": t(8, h), p + "self_attn.o_proj.weight": t(h, 16),
                        p + "mlp.gate_proj.weight": t(i, h), p + "mlp.up_proj.weight": t(i, h),
                        p + "mlp.down_proj.weight": t(h, i)})
    else:
        tensors = {"embeddings.word_embeddings.weight": t(30, 8)}
    st = path / "model.safetensors"
    if weights in ("ok", "truncated"):
        save_file(tensors, str(st))
        if weights == "truncated":
            data = st.read_bytes()
            st.write_bytes(data[: len(data) // 2])
    elif weights == "header":
        st.write_bytes((10**9).to_bytes(8, "little") + b"{not json")
    elif weights == "pickle":
        (path / "pytorch_model.bin").write_bytes(b"\x80\x04not really a pickle")
    return str(path)


def _read_only(path: Path) -> str:
    if os.geteuid() == 0:
        pytest.skip("root writes through chmod 0555; /proc and file-parent cases cover 'cannot write' there")
    path.mkdir()
    path.chmod(0o555)
    return str(path)


def _run_folder(tmp: Path, files: dict[str, str | bytes]) -> str:
    out = tmp / "run"
    for name, content in files.items():
        _write(out / name, content)
    return str(out)


def _snapshot_pair(out: Path, npz: bytes | None = None, manifest: str | None = None) -> None:
    """A Phase A pair in ``out/snapshots``: a good .npz and manifest unless replaced."""
    snaps = out / "snapshots"
    snaps.mkdir(parents=True)
    if npz is None:
        np.savez(snaps / "pv.npz", **{"with": np.ones((3, 2)), "without": np.zeros((3, 2))})
    else:
        (snaps / "pv.npz").write_bytes(npz)
    (snaps / "pv.manifest.json").write_text(manifest if manifest is not None else json.dumps({"fingerprint": "f"}))


def _pii_stamp(tmp: Path, toml: str) -> str:
    """The ``run.json`` a run of ``toml`` writes (its version and config fingerprint)."""
    from attacks.config import load_pii_config
    from attacks.run import RESUME_VERSION, fingerprint

    cfg = load_pii_config(_write(tmp / "stamp.toml", toml))
    (tmp / "stamp.toml").unlink()
    return json.dumps({"version": RESUME_VERSION, "config": fingerprint(cfg)})


# --- the table --------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Case:
    id: str
    build: Callable[..., list[str]]  # tmp_path -> argv (writes its inputs under tmp_path)
    needles: tuple[str, ...]  # every one must be in stderr: the flag / section.key / file, the rule, the value
    absent: tuple[str, ...] = ()  # none may be (a flag of another command)
    env: tuple[tuple[str, str], ...] = ()  # environment variables set for the case (monkeypatch)
    with_stack: bool = False  # build(tmp_path, stack): servers and other resources go on an ExitStack

    def argv(self, tmp: Path, stack: contextlib.ExitStack) -> list[str]:
        """The case's command line, its inputs written under ``tmp`` (resources it starts pushed on ``stack``)."""
        return self.build(tmp, stack) if self.with_stack else self.build(tmp)


def _sim(*argv):
    return ["simulate", "--trials", "100", "--snapshots", "3", *map(str, argv)]


def _config_cmd(command: str, toml: str, *, out: Callable[[Path], str] | None = None, name: str = "c.toml"):
    def build(tmp: Path) -> list[str]:
        path = _write(tmp / name, toml)
        argv = [command, path, "--quiet"]
        return argv + ["--out", out(tmp) if out else str(tmp / "out")]

    return build


def _out_cases(command: str, toml: str) -> list[Case]:
    """The output-folder cases of a config command (its config is valid: only ``--out`` is wrong)."""
    return [
        Case(f"{command}-out-is-a-file", _config_cmd(command, toml, out=lambda t: _write(t / "taken", "x")),
             ("--out", "must be a folder", "is a file", "taken")),
        Case(f"{command}-out-parent-is-a-file",
             _config_cmd(command, toml, out=lambda t: os.path.join(_write(t / "plain", "x"), "run")),
             ("--out", "must be in a folder", "is not a folder", "plain")),
        Case(f"{command}-out-under-proc", _config_cmd(command, toml, out=lambda t: "/proc/snapaudit-run"),
             ("--out", "must be writable", "'/proc' refuses new files")),
        Case(f"{command}-out-read-only", _config_cmd(command, toml, out=lambda t: _read_only(t / "ro") + "/run"),
             ("--out", "must be writable", "refuses new files")),
        Case(f"{command}-out-is-a-dangling-symlink",
             _config_cmd(command, toml, out=lambda t: _link(t / "out", t / "gone")),
             ("--out", "is a symbolic link to", "gone", "which does not exist")),
        Case(f"{command}-out-under-a-dangling-symlink",
             _config_cmd(command, toml, out=lambda t: _link(t / "runs", t / "gone") + "/run"),
             ("--out", "lies under", "runs", "a symbolic link to", "gone")),
    ]


def _link(path: Path, target: Path) -> str:
    os.symlink(target, path)
    return str(path)


def _gen(model, *extra):
    return ["generate", "--model", str(model), "--prompt", "hello", *map(str, extra)]


def _emb(model, *extra):
    return ["embed", "--model", str(model), "--text", "a sentence", *map(str, extra)]


def _tree(root: Path) -> dict[str, str]:
    """Every folder and file under ``root``: ``{relative path: "dir" or the file's SHA-256}``."""
    out = {}
    for folder, dirs, files in os.walk(root):
        for d in dirs:
            out[os.path.relpath(os.path.join(folder, d), root)] = "dir"
        for f in files:
            path = os.path.join(folder, f)
            if os.path.islink(path):  # recorded, not followed (a dangling link, a link to a device)
                out[os.path.relpath(path, root)] = "link -> " + os.readlink(path)
                continue
            with open(path, "rb") as fh:
                out[os.path.relpath(path, root)] = hashlib.sha256(fh.read()).hexdigest()
    return out

